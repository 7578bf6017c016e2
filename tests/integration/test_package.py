"""The node install and its Debian packages, as README.md's "Deploying on a
node" and "Debian packages" give them, from a build of its own (Release,
no sanitizers, no CUDA, -DCMAKE_INSTALL_PREFIX=/usr, in a temporary
directory):

- `DESTDIR=STAGE cmake --install`: every path in its place, ovld.conf in
  /etc/ovl (not /usr/etc), the units in systemd's unit directory naming
  /usr/sbin/ovld and /etc/ovl/ovld.conf, and the staged ovld starts with the
  staged ovld.conf at the path the units give it;
- ovl.pc under the multiarch libdir: `pkg-config --cflags --libs ovl` with
  PKG_CONFIG_SYSROOT_DIR=STAGE gives the staged directories, and the
  README's C example, built with those flags, runs against the staged ovld;
- `systemd-analyze verify` on the staged units (with --root: a copy of the
  staged tree with systemd's own units);
- `cpack -G DEB`: packages ovl, libovl1 and libovl-dev with every file of
  the install between them, the right ones in each, /etc/ovl/ovld.conf a
  conffile, maintainer scripts that make the user ovl (run for real on a
  scratch root) and reload systemd but start nothing; `lintian --fail-on
  error` passes on them.

A tool that is missing (Debian: scripts/install-deps installs them all) or
cannot run here skips the test that needs it, with the reason.
Environment: OVL_SOURCE_DIR (the repository root)."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

from ovltest import Skip, run_tests

SOURCE = os.environ.get("OVL_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD_TIMEOUT = 600
TOOL_TIMEOUT = 120

# Set up by main(): the build, the staged tree, the packages.
W = {}


def sh(cmd, timeout=TOOL_TIMEOUT, env=None, cwd=None, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    if check:
        assert p.returncode == 0, "%s: exit %d\n%s%s" % (" ".join(cmd), p.returncode,
                                                          p.stdout[-4000:], p.stderr[-4000:])
    return p


def readme_example():
    with open(os.path.join(SOURCE, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- example: readme_example\.c -->\s*```c\n(.*?)```", text, re.S)
    assert m, "README.md has no example block"
    return m.group(1)


def cache_value(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    raise AssertionError("%s not in the cache" % name)


def files_under(root):
    """Every non-directory below root, as paths relative to it."""
    out = set()
    for d, dirs, files in os.walk(root):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            out.add(os.path.relpath(os.path.join(d, name), root))
    return out


def unit_dir():
    """systemd's system unit directory for prefix /usr, as CMake finds it."""
    p = sh(["pkg-config", "--variable=systemdsystemunitdir", "systemd"], check=False)
    return (p.stdout.strip() if p.returncode == 0 and p.stdout.strip()
            else "/usr/lib/systemd/system").lstrip("/")


def user_unit_dir():
    p = sh(["pkg-config", "--variable=systemduserunitdir", "systemd"], check=False)
    return (p.stdout.strip() if p.returncode == 0 and p.stdout.strip()
            else "/usr/lib/systemd/user").lstrip("/")


def setup():
    top = tempfile.mkdtemp(prefix="ovl-package-")
    W["top"] = top
    build = os.path.join(top, "build")
    sh(["cmake", "-S", SOURCE, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_INSTALL_PREFIX=/usr", "-DOVL_CUDA=OFF", "-DOVL_SANITIZE=OFF",
        "-DBUILD_TESTING=OFF"], timeout=BUILD_TIMEOUT)
    sh(["cmake", "--build", build, "-j", str(os.cpu_count() or 2)], timeout=BUILD_TIMEOUT)
    stage = os.path.join(top, "stage")
    sh(["cmake", "--install", build], env=dict(os.environ, DESTDIR=stage))
    W.update(build=build, stage=stage, libdir=cache_value(build, "CMAKE_INSTALL_LIBDIR"))


# ------------------------------------------------------------------ paths

def expected_files():
    lib = "usr/" + W["libdir"]
    return {
        "usr/sbin/ovld", "usr/bin/ovlctl", "usr/bin/ovl-demo",
        "usr/include/ovl/ovl.h",
        lib + "/libovl.so", lib + "/libovl.so.1", lib + "/libovl.a",
        lib + "/pkgconfig/ovl.pc",
        "etc/ovl/ovld.conf",
        unit_dir() + "/ovld.service", unit_dir() + "/ovld.socket",
        unit_dir() + "/ovld@.service", unit_dir() + "/ovld@.socket",
        user_unit_dir() + "/ovld-user.service",
        "usr/lib/sysusers.d/ovl.conf", "usr/lib/tmpfiles.d/ovl.conf",
        "usr/share/doc/ovl/examples/slurm/ovl-prolog.sh",
        "usr/share/doc/ovl/examples/slurm/ovl-epilog.sh",
    }


def test_staged_paths():
    stage = W["stage"]
    assert re.fullmatch(r"lib(/[a-z0-9_]+-linux-[a-z0-9_]+)?", W["libdir"]), W["libdir"]
    got = files_under(stage)
    versioned = {f for f in got if re.fullmatch(r"usr/%s/libovl\.so\.\d+\.\d+\.\d+" % re.escape(
        W["libdir"]), f)}
    assert len(versioned) == 1, sorted(got)
    want = expected_files()
    assert got - versioned == want, "missing %s, unexpected %s" % (
        sorted(want - got), sorted(got - versioned - want))
    assert not os.path.exists(os.path.join(stage, "usr/etc")), "a config under /usr/etc"
    # every unit names the staged ovld and ovld.conf by their installed paths
    for u in (unit_dir() + "/ovld.service", unit_dir() + "/ovld@.service",
              user_unit_dir() + "/ovld-user.service"):
        with open(os.path.join(stage, u)) as f:
            text = f.read()
        starts = re.findall(r"^ExecStart=(\S+) .*--config (\S+)", text, re.M)
        assert len(starts) == 1, (u, starts)
        exe, conf = starts[0]
        assert exe == "/usr/sbin/ovld" and conf == "/etc/ovl/ovld.conf", (u, starts)
        for path in (exe, conf):
            assert os.path.isfile(os.path.join(stage, path.lstrip("/"))), (u, path)
    for script in ("ovl-prolog.sh", "ovl-epilog.sh"):
        assert os.access(os.path.join(stage, "usr/share/doc/ovl/examples/slurm", script), os.X_OK)
    with open(os.path.join(stage, "usr", W["libdir"], "pkgconfig/ovl.pc")) as f:
        pc = f.read()
    assert re.search(r"^prefix=/usr$", pc, re.M), pc
    assert re.search(r"^libdir=\$\{prefix\}/%s$" % re.escape(W["libdir"]), pc, re.M), pc
    assert re.search(r"^includedir=\$\{prefix\}/include$", pc, re.M), pc


def start_ovld(ovld, conf, env, tmp):
    """The staged ovld with `conf`, on a socket in tmp; returns (proc, socket, log)."""
    sock = os.path.join(tmp, "ovld.sock")
    log = os.path.join(tmp, "ovld.log")
    with open(log, "w") as lf:
        proc = subprocess.Popen([ovld, "--foreground", "--backend", "host", "--socket", sock,
                                 "--config", conf], stdout=lf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log) as f:
                raise AssertionError("the staged ovld exited %d with %s:\n%s" % (
                    proc.returncode, conf, f.read()))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
            return proc, sock, log
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()
    proc.kill()
    proc.wait()
    raise AssertionError("the staged ovld did not listen within 15 s")


def stop_ovld(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def test_pkgconfig_sysroot_readme_example():
    if shutil.which("pkg-config") is None:
        raise Skip("pkg-config is not installed (Debian: package pkgconf)")
    stage = W["stage"]
    libdir = os.path.join(stage, "usr", W["libdir"])
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=stage,
               PKG_CONFIG_LIBDIR=os.path.join(libdir, "pkgconfig"))
    env.pop("PKG_CONFIG_PATH", None)
    flags = sh(["pkg-config", "--cflags", "--libs", "ovl"], env=env).stdout.split()
    assert flags == ["-I" + os.path.join(stage, "usr/include"), "-L" + libdir, "-lovl"], flags
    tmp = tempfile.mkdtemp(prefix="ex-", dir=W["top"])
    src = os.path.join(tmp, "readme_example.c")
    with open(src, "w") as f:
        f.write(readme_example())
    exe = os.path.join(tmp, "readme_example")
    sh(["cc", "-std=c11", "-Wall", "-Werror", src, "-o", exe] + flags)
    # the staged ovld, with the ovld.conf at the path the units give it
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("ASAN_", "UBSAN_", "LD_"))}
    proc, sock, log = start_ovld(os.path.join(stage, "usr/sbin/ovld"),
                                 os.path.join(stage, "etc/ovl/ovld.conf"), run_env, tmp)
    try:
        r = sh([exe], env=dict(run_env, OVL_SOCKET=sock, LD_LIBRARY_PATH=libdir), timeout=60,
               check=False)
        with open(log) as f:
            assert r.returncode == 0, r.stdout + r.stderr + f.read()
        assert "c[3][0] = 13 (expected 13)" in r.stdout, r.stdout
        # it ran against the staged library, not one installed on this machine
        ldd = sh(["ldd", exe], env=dict(run_env, LD_LIBRARY_PATH=libdir)).stdout
        assert os.path.join(libdir, "libovl.so.1") in ldd, ldd
    finally:
        assert stop_ovld(proc) == 0


# ---------------------------------------------------------- systemd-analyze

def verify_root():
    """A root for `systemd-analyze --root`: the staged tree, systemd's own
    units (sysinit.target and the rest that ovld's units pull in), and the
    programs the units run besides ovld (/bin/kill, /bin/sh), copied."""
    root = os.path.join(W["top"], "verify-root")
    shutil.copytree(W["stage"], root, symlinks=True)
    os.makedirs(os.path.join(root, "usr/bin"), exist_ok=True)
    if not os.path.lexists(os.path.join(root, "bin")):
        os.symlink("usr/bin", os.path.join(root, "bin"))
    for prog in ("/bin/kill", "/bin/sh"):
        shutil.copy(os.path.realpath(prog), os.path.join(root, "usr/bin", os.path.basename(prog)))
    seen = set()
    for d in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if not os.path.isdir(d) or os.path.realpath(d) in seen:
            continue
        seen.add(os.path.realpath(d))
        dst = os.path.join(root, "usr/lib/systemd/system")
        os.makedirs(dst, exist_ok=True)
        for name in os.listdir(d):
            src = os.path.join(d, name)
            # not an ovld unit this machine may have installed itself
            if (not name.startswith("ovld") and os.path.isfile(src)
                    and not os.path.exists(os.path.join(dst, name))):
                shutil.copy(src, os.path.join(dst, name))
    return root


def analyze(args, env=None):
    try:
        p = subprocess.run(["systemd-analyze"] + args, capture_output=True, text=True,
                           timeout=TOOL_TIMEOUT, cwd=W["top"],
                           env=dict(env or os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0"))
    except subprocess.TimeoutExpired:
        raise Skip("systemd-analyze did not finish within %d s" % TOOL_TIMEOUT)
    return p.returncode, (p.stdout + p.stderr).strip()


def test_systemd_analyze_verify_staged():
    if shutil.which("systemd-analyze") is None:
        raise Skip("systemd-analyze is not installed (Debian: package systemd)")
    root = verify_root()
    control = os.path.join(root, "etc/systemd/system/ovl-verify-control.service")
    os.makedirs(os.path.dirname(control), exist_ok=True)
    with open(control, "w") as f:
        f.write("[Unit]\nDescription=control\n\n[Service]\nType=oneshot\nExecStart=/bin/kill -0 1\n")
    rc, out = analyze(["--root=" + root, "verify", "--man=no", "ovl-verify-control.service"])
    if rc != 0 or out:
        raise Skip("systemd-analyze --root verify fails on a trivial unit here (rc %d): %s" % (
            rc, out[-600:]))
    os.unlink(control)
    units = ["ovld.service", "ovld.socket", "ovld@1000.service", "ovld@1000.socket"]
    rc, out = analyze(["--root=" + root, "verify", "--man=no"] + units)
    # verify exits 0 on problems it only warns about ("Unknown key"): any
    # output at all is a failure
    assert rc == 0 and not out, "systemd-analyze verify (rc %d):\n%s" % (rc, out)
    # the check bites: without the staged ovld, verify must complain
    os.rename(os.path.join(root, "usr/sbin/ovld"), os.path.join(root, "usr/sbin/ovld.moved"))
    rc, out = analyze(["--root=" + root, "verify", "--man=no", "ovld.service"])
    assert rc != 0 and "/usr/sbin/ovld" in out, (rc, out)

    # The user unit: a user manager cannot take --root; verified as a file,
    # where the only complaint allowed is a missing /usr/sbin/ovld on this
    # machine (the staged one exists: test_staged_paths).
    xdg = tempfile.mkdtemp(prefix="xdg-", dir=W["top"])
    user_unit = os.path.join(W["stage"], user_unit_dir(), "ovld-user.service")
    rc, out = analyze(["--user", "verify", "--man=no", user_unit],
                      env=dict(os.environ, XDG_RUNTIME_DIR=xdg))
    lines = [l for l in out.splitlines()
             if l != "ovld-user.service: Command /usr/sbin/ovld is not executable: "
                     "No such file or directory"]
    if rc != 0 and lines and not any("ovld" in l for l in lines):
        print("  note: systemd-analyze --user verify cannot run here: " + out[-300:])
        return
    assert not lines, "systemd-analyze --user verify (rc %d):\n%s" % (rc, out)


# ----------------------------------------------------------------- packages

def build_packages():
    if "debs" in W:
        return W["debs"]
    for tool in ("cpack", "dpkg-deb", "dpkg-shlibdeps"):
        if shutil.which(tool) is None:
            raise Skip("%s is not installed (Debian: packages cmake, dpkg-dev)" % tool)
    out = os.path.join(W["top"], "debs")
    sh(["cpack", "--config", os.path.join(W["build"], "CPackConfig.cmake"), "-G", "DEB", "-B", out],
       timeout=BUILD_TIMEOUT)
    debs = {}
    for name in os.listdir(out):
        if name.endswith(".deb"):
            debs[name.split("_")[0]] = os.path.join(out, name)
    assert sorted(debs) == ["libovl-dev", "libovl1", "ovl"], sorted(os.listdir(out))
    W["debs"] = debs
    return debs


def deb_files(deb):
    """The package's files (not directories), relative, symlinks as 'a -> b'."""
    out = {}
    for line in sh(["dpkg-deb", "-c", deb]).stdout.splitlines():
        parts = line.split(None, 5)
        if parts[0].startswith("d"):
            continue
        path = parts[5]
        target = None
        if " -> " in path:
            path, target = path.split(" -> ", 1)
        out[path[2:] if path.startswith("./") else path] = (parts[0], target)
    return out


def test_deb_contents():
    debs = build_packages()
    files = {p: deb_files(d) for p, d in debs.items()}
    lib = "usr/" + W["libdir"]
    doc = {p: {"usr/share/doc/%s/copyright" % p, "usr/share/doc/%s/changelog.gz" % p}
           for p in debs}
    # every file of a plain install is in exactly one package
    staged = files_under(W["stage"])
    packaged = [f for p in files for f in files[p]]
    assert len(packaged) == len(set(packaged)), "a file in two packages"
    assert staged <= set(packaged), "not packaged: %s" % sorted(staged - set(packaged))
    assert set(packaged) - staged == set().union(*doc.values()), sorted(set(packaged) - staged)
    # what goes where
    so = [f for f in files["libovl1"] if re.fullmatch(re.escape(lib) + r"/libovl\.so\.[\d.]+", f)]
    assert set(files["libovl1"]) == set(so) | doc["libovl1"], sorted(files["libovl1"])
    assert files["libovl1"][lib + "/libovl.so.1"][1] is not None, "libovl.so.1 is no symlink"
    assert set(files["libovl-dev"]) == {
        "usr/include/ovl/ovl.h", lib + "/libovl.so", lib + "/libovl.a",
        lib + "/pkgconfig/ovl.pc"} | doc["libovl-dev"], sorted(files["libovl-dev"])
    assert files["libovl-dev"][lib + "/libovl.so"][1] == "libovl.so.1", files["libovl-dev"]
    want_ovl = expected_files() - set(files["libovl-dev"]) - set(files["libovl1"])
    assert set(files["ovl"]) == want_ovl | doc["ovl"], sorted(set(files["ovl"]) ^ want_ovl)
    for f in ("usr/sbin/ovld", "usr/bin/ovlctl", "usr/bin/ovl-demo",
              "usr/share/doc/ovl/examples/slurm/ovl-prolog.sh"):
        assert files["ovl"][f][0] == "-rwxr-xr-x", (f, files["ovl"][f])
    # the soname, and the package named after it, with its shlibs
    x = os.path.join(W["top"], "x-libovl1")
    sh(["dpkg-deb", "-x", debs["libovl1"], x])
    dyn = sh(["readelf", "-d", os.path.join(x, lib, "libovl.so.1")]).stdout
    assert "Library soname: [libovl.so.1]" in dyn, dyn
    ctl = os.path.join(W["top"], "ctl-libovl1")
    sh(["dpkg-deb", "-e", debs["libovl1"], ctl])
    with open(os.path.join(ctl, "shlibs")) as f:
        assert f.read().startswith("libovl 1 libovl1 "), "shlibs"
    dev_depends = sh(["dpkg-deb", "-f", debs["libovl-dev"], "Depends"]).stdout
    assert re.search(r"\blibovl1 \(= ", dev_depends), dev_depends
    # the units in the package name the installed paths
    x = os.path.join(W["top"], "x-ovl")
    sh(["dpkg-deb", "-x", debs["ovl"], x])
    with open(os.path.join(x, unit_dir(), "ovld.service")) as f:
        assert re.search(r"^ExecStart=/usr/sbin/ovld --foreground --config /etc/ovl/ovld\.conf$",
                         f.read(), re.M)
    depends = sh(["dpkg-deb", "-f", debs["ovl"], "Depends"]).stdout
    for d in ("libuv1", "libprotobuf-c1", "libc6"):
        assert d in depends, depends
    assert "cuda" not in depends.lower() and "nccl" not in depends.lower(), depends


def test_deb_maintainer_scripts():
    debs = build_packages()
    ctl = os.path.join(W["top"], "ctl-ovl")
    sh(["dpkg-deb", "-e", debs["ovl"], ctl])
    with open(os.path.join(ctl, "conffiles")) as f:
        assert f.read().split() == ["/etc/ovl/ovld.conf"]
    for script in ("postinst", "prerm", "postrm"):
        path = os.path.join(ctl, script)
        assert os.access(path, os.X_OK), script
        sh(["sh", "-n", path])
        if shutil.which("shellcheck"):
            sh(["shellcheck", "-s", "sh", path])
        with open(path) as f:
            text = f.read()
        assert not re.search(r"\b(start|restart|enable|try-restart|reload-or-restart)\b",
                             re.sub(r"#.*", "", text).replace("deb-systemd-invoke", "")), \
            "%s may start or enable a unit" % script

    # With stand-ins for systemd's tools on PATH: the calls they get.
    bindir = os.path.join(W["top"], "fake-bin")
    calls = os.path.join(W["top"], "calls")
    os.makedirs(bindir)
    for tool in ("systemd-sysusers", "systemd-tmpfiles", "systemctl"):
        with open(os.path.join(bindir, tool), "w") as f:
            f.write("#!/bin/sh\necho \"%s $*\" >> %s\n" % (tool, calls))
        os.chmod(os.path.join(bindir, tool), 0o755)
    env = {k: v for k, v in os.environ.items() if k != "DPKG_ROOT"}
    env["PATH"] = bindir + ":" + env.get("PATH", "/usr/bin:/bin")
    sh([os.path.join(ctl, "postinst"), "configure", ""], env=env)
    sh([os.path.join(ctl, "prerm"), "upgrade", "0.3.0"], env=env)
    sh([os.path.join(ctl, "postrm"), "upgrade", "0.3.0"], env=env)
    with open(calls) as f:
        got = f.read().splitlines()
    want = ["systemd-sysusers ovl.conf", "systemd-tmpfiles --create ovl.conf"]
    if os.path.isdir("/run/systemd/system"):
        want.append("systemctl --system daemon-reload")
    assert got == want, got

    # For real, on a scratch root: postinst makes the user and group ovl.
    if shutil.which("systemd-sysusers") is None:
        raise Skip("systemd-sysusers is not installed (Debian: package systemd)")
    root = os.path.join(W["top"], "dpkg-root")
    sh(["dpkg-deb", "-x", debs["ovl"], root])
    os.makedirs(os.path.join(root, "etc"), exist_ok=True)
    env = dict(os.environ, DPKG_ROOT=root)
    p = sh([os.path.join(ctl, "postinst"), "configure", ""], env=env, check=os.geteuid() == 0)
    if p.returncode != 0:
        raise Skip("systemd-sysusers --root cannot run here as a user other than root: " +
                   (p.stdout + p.stderr).strip()[-300:])
    with open(os.path.join(root, "etc/passwd")) as f:
        users = [l.split(":") for l in f.read().splitlines()]
    with open(os.path.join(root, "etc/group")) as f:
        groups = [l.split(":") for l in f.read().splitlines()]
    ovl = [u for u in users if u[0] == "ovl"]
    assert len(ovl) == 1 and [g for g in groups if g[0] == "ovl"], (users, groups)
    assert ovl[0][6].endswith("nologin"), ovl


def test_lintian():
    debs = build_packages()
    if shutil.which("lintian") is None:
        raise Skip("lintian is not installed (Debian: package lintian)")
    p = sh(["lintian", "--fail-on", "error", "--tag-display-limit", "0"] + sorted(debs.values()),
           timeout=300, check=False)
    out = (p.stdout + p.stderr).strip()
    errors = [l for l in out.splitlines() if l.startswith("E: ")]
    assert p.returncode == 0 and not errors, "lintian (rc %d):\n%s" % (p.returncode, out)
    if out:
        print("  note: lintian's warnings:\n    " + out.replace("\n", "\n    "))


def main():
    tests = [test_staged_paths, test_pkgconfig_sysroot_readme_example,
             test_systemd_analyze_verify_staged, test_deb_contents, test_deb_maintainer_scripts,
             test_lintian]
    for tool in ("cmake", "ninja", "cc"):
        if shutil.which(tool) is None:
            print("SKIP all: %s is not installed (scripts/install-deps)" % tool)
            return run_tests([])
    try:
        setup()
        run_tests(tests)
    finally:
        if "top" in W:
            shutil.rmtree(W["top"], ignore_errors=True)


if __name__ == "__main__":
    main()
