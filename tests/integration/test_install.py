"""An install into a temporary prefix: every file in its place (binaries,
libraries, the header, ovl.pc, the sample configuration, the systemd units
(node-wide, per user, user manager) with their paths filled in, the
sysusers.d and tmpfiles.d snippets, the Slurm prolog and epilog), and the
README's C example, cut out of README.md, built against the installed
ovl.pc and run against a real ovld (host backend)."""
import os
import re
import shutil
import subprocess
import tempfile

from ovltest import Daemon, run_tests

BUILD = os.environ["OVL_BUILD_DIR"]
SOURCE = os.environ["OVL_SOURCE_DIR"]
CFLAGS = os.environ.get("OVL_EXAMPLE_CFLAGS", "").split()


def readme_example():
    with open(os.path.join(SOURCE, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- example: readme_example\.c -->\s*```c\n(.*?)```", text, re.S)
    assert m, "README.md has no example block"
    return m.group(1)


def test_install_and_readme_example():
    prefix = tempfile.mkdtemp(prefix="ovl-install-")
    try:
        p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        want = ["sbin/ovld", "bin/ovlctl", "bin/ovl-demo", "include/ovl/ovl.h",
                "lib/libovl.a", "lib/pkgconfig/ovl.pc", "etc/ovl/ovld.conf",
                "lib/systemd/system/ovld.service", "lib/systemd/system/ovld.socket",
                "lib/systemd/system/ovld@.service", "lib/systemd/system/ovld@.socket",
                "lib/systemd/user/ovld-user.service",
                "lib/sysusers.d/ovl.conf", "lib/tmpfiles.d/ovl.conf",
                "share/doc/ovl/examples/slurm/ovl-prolog.sh",
                "share/doc/ovl/examples/slurm/ovl-epilog.sh"]
        for w in want:
            assert os.path.exists(os.path.join(prefix, w)), "missing after install: " + w
        libs = os.listdir(os.path.join(prefix, "lib"))
        assert any(l.startswith("libovl.so") for l in libs), libs
        # configure_file filled in every placeholder, with absolute paths
        # (fixed when CMake configured: CMAKE_INSTALL_PREFIX)
        for u in ("system/ovld.service", "system/ovld.socket", "system/ovld@.service",
                  "system/ovld@.socket", "user/ovld-user.service"):
            with open(os.path.join(prefix, "lib/systemd", u)) as f:
                unit = f.read()
            assert not re.search(r"@[A-Z_]+@", unit), (u, re.findall(r"@[A-Z_]+@", unit))
            if u.endswith(".service"):
                starts = re.findall(r"^ExecStart=.*$", unit, re.M)
                assert len(starts) == 1 and re.match(r"ExecStart=/\S*/ovld ", starts[0]), (u, starts)
            if u == "system/ovld.service":
                assert re.fullmatch(
                    r"ExecStart=/\S*/ovld --foreground --config /\S*/ovl/ovld\.conf", starts[0]), (
                    starts)
        for script in ("ovl-prolog.sh", "ovl-epilog.sh"):
            path = os.path.join(prefix, "share/doc/ovl/examples/slurm", script)
            assert os.access(path, os.X_OK), path + " is not executable"

        src = os.path.join(prefix, "readme_example.c")
        with open(src, "w") as f:
            f.write(readme_example())
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(prefix, "lib/pkgconfig"))
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "ovl"], env=env,
                               capture_output=True, text=True, timeout=30)
        assert flags.returncode == 0, flags.stderr
        exe = os.path.join(prefix, "readme_example")
        cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", *CFLAGS, src, "-o", exe,
                             *flags.stdout.split()], capture_output=True, text=True, timeout=120)
        assert cc.returncode == 0, cc.stdout + cc.stderr
        d = Daemon()
        try:
            run_env = dict(d.env(), LD_LIBRARY_PATH=os.path.join(prefix, "lib"))
            r = subprocess.run([exe], env=run_env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr + d.log_text()
            assert "c[3][0] = 13 (expected 13)" in r.stdout, r.stdout
            assert d.stop() == 0
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


if __name__ == "__main__":
    run_tests([test_install_and_readme_example])
