"""An install into a temporary prefix: every file in its place (binaries,
libraries, the header, ovl.pc, the sample configuration, the systemd units
(node-wide, per user, user manager) with their paths filled in, the
sysusers.d and tmpfiles.d snippets, the Slurm prolog and epilog), and the
README's C example, cut out of README.md, built against the installed
ovl.pc and run against a real ovld (host backend).

The build was configured for another prefix (scripts/test: /usr/local): the
units and ovl.pc must follow the prefix given to `cmake --install --prefix`
(systemd-analyze verify finds the ExecStart), and an install with
`--prefix /usr` into a DESTDIR puts ovld.conf in /etc/ovl, where the units
look for it. test_package.py checks a build configured for /usr and its
Debian packages."""
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


def verify_units(prefix):
    """systemd-analyze verify on the node-wide units as installed: their
    ExecStart is the installed ovld. Skipped (with a note) where verify
    cannot run at all here."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print("  note: systemd-analyze is not installed; units not verified")
        return
    env = dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0")
    control = os.path.join(prefix, "ovl-verify-control.service")
    with open(control, "w") as f:
        f.write("[Unit]\nDescription=control\n\n[Service]\nType=oneshot\nExecStart=/bin/true\n")
    p = subprocess.run([tool, "verify", "--man=no", control], capture_output=True, text=True,
                       timeout=60, env=env)
    os.unlink(control)
    if p.returncode != 0:
        print("  note: systemd-analyze verify fails on a trivial unit here; units not verified: " +
              (p.stdout + p.stderr).strip()[-300:])
        return
    units = [os.path.join(prefix, "lib/systemd/system", u) for u in ("ovld.service", "ovld.socket")]
    p = subprocess.run([tool, "verify", "--man=no"] + units, capture_output=True, text=True,
                       timeout=60, env=env)
    out = (p.stdout + p.stderr).strip()
    ours = [l for l in out.splitlines() if "ovld" in l]
    assert p.returncode == 0 and not ours, "systemd-analyze verify (rc %d):\n%s" % (p.returncode, out)


def test_install_prefix_usr_destdir():
    """`cmake --install --prefix /usr` with DESTDIR: ovld.conf in /etc (not
    /usr/etc), and the units say /usr/sbin/ovld and /etc/ovl/ovld.conf."""
    stage = tempfile.mkdtemp(prefix="ovl-destdir-")
    try:
        p = subprocess.run(["cmake", "--install", BUILD, "--prefix", "/usr"], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, DESTDIR=stage))
        assert p.returncode == 0, p.stdout + p.stderr
        assert os.path.isfile(os.path.join(stage, "etc/ovl/ovld.conf")), p.stdout
        assert not os.path.exists(os.path.join(stage, "usr/etc")), p.stdout
        units = []
        for d, _, names in os.walk(stage):
            units += [os.path.join(d, n) for n in names if re.fullmatch(r"ovld.*\.service", n)]
        assert len(units) == 3, units
        for u in units:
            with open(u) as f:
                starts = re.findall(r"^ExecStart=(\S+) .*--config (\S+)", f.read(), re.M)
            assert starts == [("/usr/sbin/ovld", "/etc/ovl/ovld.conf")], (u, starts)
        assert os.path.isfile(os.path.join(stage, "usr/sbin/ovld"))
        pcs = [os.path.join(d, n) for d, _, names in os.walk(stage) for n in names if n == "ovl.pc"]
        assert len(pcs) == 1, pcs
        with open(pcs[0]) as f:
            assert re.search(r"^prefix=/usr$", f.read(), re.M), pcs[0]
    finally:
        shutil.rmtree(stage, ignore_errors=True)


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
            if u.endswith(".service"):
                # the install's prefix, not the configured one
                exe, conf = re.match(r"ExecStart=(\S+) .*--config (\S+)", starts[0]).groups()
                assert exe == os.path.join(prefix, "sbin/ovld"), (u, starts, prefix)
                assert conf == os.path.join(prefix, "etc/ovl/ovld.conf"), (u, starts, prefix)
        with open(os.path.join(prefix, "lib/pkgconfig/ovl.pc")) as f:
            pc = f.read()
        assert re.search(r"^prefix=%s$" % re.escape(prefix), pc, re.M), pc
        verify_units(prefix)
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
    run_tests([test_install_and_readme_example, test_install_prefix_usr_destdir])
