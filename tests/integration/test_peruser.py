"""One ovld per user (issue 12: CUDA MPS serves one uid at a time):

- the units: deploy/ovld@.service and ovld@.socket (as templates and as the
  instance of this test's uid) and deploy/ovld-user.service (a user unit)
  pass `systemd-analyze verify`; their socket paths are the ones libovl
  computes; ovld@.service is hardened as ovld.service is, RemoveIPC= aside
  (`systemd-analyze security --offline`); its ExecStartPre takes the
  instance only as the uid it runs as;
- an instance emulated by hand (as root: what systemd would do, without
  systemd): ovld run as another uid in its 0700 directory serves that uid,
  found without -s or $OVL_SOCKET, and refuses everyone else;
- the Slurm prolog and epilog (deploy/slurm/): `bash -n`, shellcheck when
  installed, and real runs against a fake systemctl and logger on PATH, with
  the exact calls asserted for a user's first job, second job, the epilog
  with another job still running and the epilog of the last job; failures
  and timeouts that must not drain the node;
- the default socket with real ovlds: $OVL_SOCKET, then /run/ovl/UID/ovld.sock,
  then $XDG_RUNTIME_DIR/ovl/ovld.sock, then /run/ovl/ovld.sock, with a
  temporary directory standing in for /run/ovl ($OVL_RUNTIME_DIR, meant for
  tests only); ovlctl status and ovl-demo reach the per-user ovld with no
  -s and no $OVL_SOCKET.

- opt-in (OVL_TEST_SYSTEMD_NS=1, root): systemd booted as PID 1 of new
  pid/mount/cgroup namespaces starts ovld@65534.service and ovld@65534.socket
  for real, and the Slurm scripts drive the real systemctl.

systemd is not PID 1 on the machine these tests were written on (a VM whose
init is not systemd); without the opt-in the units are checked and their
runtime emulated, not started by systemd. A test whose tool is missing, or
cannot run here, is skipped with its reason. Environment: OVLD_BIN, OVLCTL_BIN, OVL_DEMO_BIN,
OVL_SOURCE_DIR. Prints one line per test and 'N passed, N failed, N
skipped'; exits 1 if any test failed."""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import traceback

from ovltest import Skip, can_connect, run_tests

OVLD = os.path.abspath(shutil.which(os.environ.get("OVLD_BIN", "ovld")) or os.environ.get("OVLD_BIN", "ovld"))
OVLCTL = os.path.abspath(shutil.which(os.environ.get("OVLCTL_BIN", "ovlctl")) or os.environ.get("OVLCTL_BIN", "ovlctl"))
DEMO = os.path.abspath(shutil.which(os.environ.get("OVL_DEMO_BIN", "ovl-demo")) or os.environ.get("OVL_DEMO_BIN", "ovl-demo"))
SOURCE_DIR = os.environ.get(
    "OVL_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
PROLOG = os.path.join(DEPLOY, "slurm", "ovl-prolog.sh")
EPILOG = os.path.join(DEPLOY, "slurm", "ovl-epilog.sh")
UID = os.geteuid()

START_TIMEOUT = 15.0
TOOL_TIMEOUT = 60
NOBODY = 65534  # the uid an emulated instance runs as (root only)
OTHER = 65533   # a uid that is not the instance's




def clean_env(**extra):
    """The test's environment without what would steer the rule or systemd."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OVL_SOCKET", "OVL_RUNTIME_DIR", "XDG_RUNTIME_DIR", "NOTIFY_SOCKET",
                        "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "WATCHDOG_PID",
                        "WATCHDOG_USEC")}
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


class Scratch:
    """A temporary directory (mode 0755, so that other uids may pass) and
    the processes of one test; all killed and removed on exit."""

    def __init__(self, parent=None):
        self.dir = tempfile.mkdtemp(prefix="ovl-peruser-", dir=parent)
        os.chmod(self.dir, 0o755)
        self.procs = []

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


class Ovld:
    """ovld --foreground on `sock` (host backend), its log in the scratch
    directory; `cmd` replaces the whole command line (an emulated unit)."""

    def __init__(self, scratch, sock, name, cmd=None, preexec=None):
        self.sock = sock
        self.log_path = scratch.path(name + ".log")
        cfg = scratch.path(name + ".conf")
        with open(cfg, "w") as f:
            f.write("host_devices = 2\n")
        os.chmod(cfg, 0o644)
        if cmd is None:
            cmd = [OVLD, "--foreground", "--backend", "host", "--log-level", "debug",
                   "--config", cfg, "--socket", sock]
        self.cmd = cmd
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=clean_env(),
                                     preexec_fn=preexec)
        scratch.procs.append(self)
        deadline = time.monotonic() + START_TIMEOUT
        while not can_connect(sock):
            if self.proc.poll() is not None:
                raise AssertionError("ovld exited %d:\n%s" % (self.proc.returncode, self.log_text()))
            if time.monotonic() > deadline:
                raise AssertionError("ovld did not listen on %s:\n%s" % (sock, self.log_text()))
            time.sleep(0.02)

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        """SIGTERM; ovld removes its socket and exits 0."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        assert rc == 0, "ovld exited %d:\n%s" % (rc, self.log_text())
        assert not os.path.exists(self.sock), "ovld left %s behind" % self.sock

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if not self.log.closed:
            self.log.close()


def ctl(env, *args, preexec=None):
    return subprocess.run([OVLCTL] + list(args), env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=preexec)


def status(env, preexec=None):
    """`ovlctl status --json` with no -s: the daemon the default rule finds."""
    p = ctl(env, "status", "--json", preexec=preexec)
    assert p.returncode == 0, "ovlctl status: rc %d\n%s%s" % (p.returncode, p.stdout, p.stderr)
    return json.loads(p.stdout)


def run_tool(cmd, env=None, cwd=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, cwd=cwd,
                              env=env or clean_env(SYSTEMD_PAGER="", SYSTEMD_COLORS="0", LANG="C"))
    except subprocess.TimeoutExpired:
        raise Skip("%s did not finish within %d s" % (cmd[0], TOOL_TIMEOUT))


# ------------------------------------------------------------------ units

PLACEHOLDER = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")
VALUES = {"SBINDIR": os.path.dirname(OVLD), "SYSCONFDIR": "/etc"}


def fill_template(name):
    """What configure_file(@ONLY) makes of deploy/NAME, with ExecStart= naming
    the ovld under test. Fails on a placeholder CMake would not set."""
    with open(os.path.join(DEPLOY, name)) as f:
        text = f.read()
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(VALUES))
    assert not unknown, "%s: placeholders not set by CMake: %s" % (name, unknown)
    text = PLACEHOLDER.sub(lambda m: VALUES[m.group(1)], text)
    return text.replace(VALUES["SBINDIR"] + "/ovld ", OVLD + " ")


def settings(text):
    """{(section, key): [values]} of a unit file (comments and blanks skipped)."""
    out, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def one(s, section, key):
    v = s.get((section, key), [])
    assert len(v) == 1, "%s %s=: %r" % (section, key, v)
    return v[0]


def socket_arg(execstart):
    args = execstart.split()
    assert "--socket" in args, execstart
    return args[args.index("--socket") + 1]


def verify_control(tool, scratch, user=False):
    """verify on a unit that is right by construction: skip if it fails."""
    control = scratch.path("ovl-verify-control.service")
    with open(control, "w") as f:
        f.write("[Unit]\nDescription=control\n\n[Service]\nType=oneshot\nExecStart=/bin/true\n")
    env = clean_env(SYSTEMD_PAGER="", SYSTEMD_COLORS="0", LANG="C",
                    XDG_RUNTIME_DIR=scratch.path("xdg") if user else None)
    p = run_tool([tool] + (["--user"] if user else []) + ["verify", "--man=no", control], env=env)
    if p.returncode != 0:
        raise Skip("systemd-analyze%s verify fails on a trivial unit here (rc %d): %s" % (
            " --user" if user else "", p.returncode, (p.stdout + p.stderr).strip()[-600:]))
    return env


def test_units_verify():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise Skip("systemd-analyze is not installed (Debian: package systemd)")
    assert os.access(OVLD, os.X_OK), "OVLD_BIN %s is not executable" % OVLD
    with Scratch() as s:
        os.mkdir(s.path("xdg"), 0o700)
        env = verify_control(tool, s)
        for name in ("ovld@.service", "ovld@.socket", "ovld-user.service"):
            with open(s.path(name), "w") as f:
                f.write(fill_template(name))
        # the templates, and the instance of this test's uid (verify finds
        # ovld@.service beside the instance's name)
        system_units = [s.path(n) for n in ("ovld@.service", "ovld@.socket",
                                            "ovld@%d.service" % UID, "ovld@%d.socket" % UID)]
        p = run_tool([tool, "verify", "--man=no"] + system_units, env=env)
        out = (p.stdout + p.stderr).strip()
        ours = [line for line in out.splitlines() if "ovld@" in line]
        assert p.returncode == 0 and not ours, "systemd-analyze verify (rc %d):\n%s" % (
            p.returncode, out)
        # the user unit, by the user manager's rules (%t is $XDG_RUNTIME_DIR)
        env = verify_control(tool, s, user=True)
        p = run_tool([tool, "--user", "verify", "--man=no", s.path("ovld-user.service")], env=env)
        out = (p.stdout + p.stderr).strip()
        ours = [line for line in out.splitlines() if "ovld-user" in line]
        assert p.returncode == 0 and not ours, "systemd-analyze --user verify (rc %d):\n%s" % (
            p.returncode, out)


def test_unit_paths_match_libovl():
    """Each unit's socket is where libovl looks: ovld@UID's ExecStart
    --socket, its RuntimeDirectory= and ovld@UID.socket's ListenStream= are
    /run/ovl/UID/ovld.sock, in a directory of that user, mode 0700, that only
    the user may reach; ovld-user's is %t/ovl/ovld.sock. Then ovld is started
    at each of those paths, with a temporary directory standing in for /run
    and for $XDG_RUNTIME_DIR, and ovlctl finds each by itself."""
    svc = settings(fill_template("ovld@.service"))
    sock = settings(fill_template("ovld@.socket"))
    user = settings(fill_template("ovld-user.service"))
    inst = lambda v: v.replace("%i", str(UID))
    want = "/run/ovl/%d/ovld.sock" % UID
    assert inst(socket_arg(one(svc, "Service", "ExecStart"))) == want
    assert inst(one(sock, "Socket", "ListenStream")) == want
    assert "/run/" + inst(one(svc, "Service", "RuntimeDirectory")) == os.path.dirname(want)
    assert one(svc, "Service", "RuntimeDirectoryMode") == "0700"
    assert one(svc, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert one(svc, "Service", "User") == "%i"
    assert ("Service", "Group") not in svc, "Group= set: the user's primary group is meant"
    assert one(sock, "Socket", "SocketUser") == "%i"
    assert one(sock, "Socket", "SocketMode") == "0600"
    assert one(user, "Service", "RuntimeDirectory") == "ovl"
    assert one(user, "Service", "RuntimeDirectoryMode") == "0700"
    user_sock = socket_arg(one(user, "Service", "ExecStart"))
    assert user_sock == "%t/ovl/ovld.sock", user_sock

    with Scratch() as s:
        run, xdg = s.path("run"), s.path("xdg")
        os.makedirs(os.path.join(run, "ovl"))
        os.mkdir(xdg, 0o700)
        env = clean_env(OVL_RUNTIME_DIR=os.path.join(run, "ovl"), XDG_RUNTIME_DIR=xdg)
        # ovld-user first (ovld@ would come first in the rule)
        path = user_sock.replace("%t", xdg)
        os.mkdir(os.path.dirname(path), 0o700)
        u = Ovld(s, path, "user")
        st = status(env)
        assert st["pid"] == u.pid and st["socket"] == path, st
        # ovld@UID, where its RuntimeDirectory= would be
        path = run + want[len("/run"):]
        os.mkdir(os.path.dirname(path), 0o700)
        d = Ovld(s, path, "instance")
        st = status(env)
        assert st["pid"] == d.pid and st["socket"] == path, st
        d.stop()
        u.stop()


def test_hardening_matches_node_wide():
    """`systemd-analyze security --offline`: ovld@UID.service fails no check
    that ovld.service passes, but RemoveIPC= (left out on purpose: it would
    remove a real user's IPC objects), and passes every one it passes."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise Skip("systemd-analyze is not installed")
    with Scratch() as s:
        failed = {}
        # an instance of a uid other than root's (root's fails User= as such)
        for name, unit in (("ovld.service", "ovld.service"), ("ovld@.service", "ovld@1000.service")):
            with open(s.path(name), "w") as f:
                f.write(fill_template(name))
            p = run_tool([tool, "security", "--offline=yes", "--no-pager", s.path(unit)])
            if p.returncode != 0 or "Overall exposure level" not in p.stdout:
                raise Skip("systemd-analyze security --offline cannot run here (rc %d): %s" % (
                    p.returncode, (p.stdout + p.stderr).strip()[-400:]))
            marks = [line.split(None, 2)[:2] for line in p.stdout.splitlines()
                     if line[:1] in ("-", "+", "\u2717", "\u2713")]
            failed[name] = {m[1] for m in marks if m[0] in ("-", "\u2717")}
            assert len(marks) > 40, p.stdout
        worse = failed["ovld@.service"] - failed["ovld.service"]
        better = failed["ovld.service"] - failed["ovld@.service"]
        assert worse == {"RemoveIPC="}, "ovld@.service fails more checks: %s" % sorted(worse)
        assert not better, "ovld@.service passes checks ovld.service fails: %s" % sorted(better)


def exec_start_pre_script():
    """ovld@.service's ExecStartPre: /bin/sh -c 'SCRIPT' sh %i, with
    systemd's $$ turned into $."""
    svc = settings(fill_template("ovld@.service"))
    pre = [v for v in svc[("Service", "ExecStartPre")] if v.startswith("/bin/sh -c '")]
    assert len(pre) == 1, svc[("Service", "ExecStartPre")]
    m = re.fullmatch(r"/bin/sh -c '(.*)' sh %i", pre[0])
    assert m, pre[0]
    return m.group(1).replace("$$", "$")


def test_instance_must_be_the_uid():
    """The ExecStartPre check, run as the unit would (as User=%i, which is
    the uid running this test): the uid passes; a user name, a leading zero
    or anything else is refused, naming the right instance."""
    script = exec_start_pre_script()
    name = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    for instance, ok in ((str(UID), True), (name, False), ("0" + str(UID), False),
                         (str(UID + 1), False), ("", False), ("1x", False)):
        p = subprocess.run(["/bin/sh", "-c", script, "sh", instance], capture_output=True,
                           text=True, timeout=30)
        assert (p.returncode == 0) == ok, (instance, p.returncode, p.stderr)
        if not ok:
            assert "ovld@%d.service" % UID in p.stderr, p.stderr


def as_user(uid):
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return drop


def test_emulated_instance_serves_only_its_user():
    """What systemd would do for ovld@NOBODY, without systemd: the runtime
    directory made as RuntimeDirectory= makes it (owned by the uid, 0700),
    the ExecStartPre check and ExecStart (with /run/ovl under a temporary
    directory) run as that uid. That uid's ovlctl and ovl-demo find it with
    neither -s nor $OVL_SOCKET; another uid finds nothing and is refused on
    the path itself."""
    if UID != 0:
        raise Skip("needs root, to run ovld as another uid")
    svc = settings(fill_template("ovld@.service"))
    with Scratch() as s:
        run = s.path("run", "ovl")
        os.makedirs(run)
        os.chmod(s.path("run"), 0o755)
        os.chmod(run, 0o755)
        inst = str(NOBODY)
        rdir = os.path.join(s.path("run"), svc[("Service", "RuntimeDirectory")][0].replace("%i", inst))
        os.mkdir(rdir)
        os.chown(rdir, NOBODY, NOBODY)
        os.chmod(rdir, int(one(svc, "Service", "RuntimeDirectoryMode"), 8))
        p = subprocess.run(["/bin/sh", "-c", exec_start_pre_script(), "sh", inst],
                           preexec_fn=as_user(NOBODY), capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        cfg = s.path("ovld.conf")
        with open(cfg, "w") as f:
            f.write("backend = host\nhost_devices = 2\n")
        os.chmod(cfg, 0o644)
        cmd = one(svc, "Service", "ExecStart").replace("%i", inst).split()
        cmd = [a.replace("/run/ovl", run).replace("/etc/ovl/ovld.conf", cfg) for a in cmd]
        sock = socket_arg(" ".join(cmd))
        assert sock == os.path.join(rdir, "ovld.sock"), (sock, rdir)
        d = Ovld(s, sock, "nobody", cmd=cmd, preexec=as_user(NOBODY))
        assert os.stat(sock).st_uid == NOBODY
        env = clean_env(OVL_RUNTIME_DIR=run, HOME="/")
        st = status(env, preexec=as_user(NOBODY))
        assert st["pid"] == d.pid and st["socket"] == sock, st
        demo = subprocess.run([DEMO, "-w", "2", "-m", "16", "-n", "16", "-k", "16", "-d", "fp32",
                               "-a", "ring", "-i", "2"], env=env, capture_output=True, text=True,
                              timeout=120, preexec_fn=as_user(NOBODY))
        assert demo.returncode == 0, demo.stdout + demo.stderr + d.log_text()[-3000:]
        assert ("ovl-demo: socket %s (per-user" % sock) in demo.stdout, demo.stdout
        # another uid: its own per-user socket is absent, the node-wide one
        # too; and the instance's path is closed to it
        p = ctl(env, "status", preexec=as_user(OTHER))
        assert p.returncode == 1, p.stdout + p.stderr
        assert os.path.join(run, "ovld.sock") in p.stderr and "node-wide" in p.stderr, p.stderr
        p = ctl(env, "--socket", sock, "status", preexec=as_user(OTHER))
        assert p.returncode == 1 and "Permission denied" in p.stderr, p.stdout + p.stderr
        d.stop()


# ------------------------------------------- the units under a real systemd

NS_INIT = """#!/bin/sh
# PID 1 of the new namespaces: the host's enabled units hidden, ours in place.
# The file system is the host's: sysinit.target, basic.target and the boot
# services that write to it (systemd-tmpfiles-setup empties /tmp at boot,
# systemd-sysctl sets kernel settings) are masked, so that a unit with the
# default dependencies fails to start instead of pulling them in; /tmp,
# /var/tmp and /run are private all the same.
set -e
mount --make-rprivate /
mount -t tmpfs tmpfs /etc/systemd/system
cp -r %(units)s/. /etc/systemd/system/
for u in sysinit.target basic.target sockets.target timers.target paths.target \\
         systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \\
         systemd-tmpfiles-clean.service systemd-tmpfiles-clean.timer \\
         systemd-sysctl.service systemd-sysusers.service systemd-binfmt.service \\
         systemd-modules-load.service systemd-udevd.service systemd-random-seed.service \\
         systemd-update-utmp.service ldconfig.service systemd-journald.service; do
    ln -sf /dev/null /etc/systemd/system/$u
done
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /var/tmp
export container=ovl-test
exec %(systemd)s --system --unit=ovl-test.target --log-target=console
"""

NS_BOOT = """#!/bin/sh
# Moves this shell into a cgroup of its own in every hierarchy, then starts
# init in new pid, mount, cgroup, uts and ipc namespaces rooted there.
set -e
while IFS=: read -r n ctrl path; do
    case $ctrl in
    "") dir=/sys/fs/cgroup/unified; [ -d $dir ] || dir=/sys/fs/cgroup ;;
    name=systemd) dir=/sys/fs/cgroup/systemd ;;
    *) dir=/sys/fs/cgroup/$ctrl ;;
    esac
    [ -d "$dir" ] || continue
    mkdir -p "$dir$path/%(cg)s"
    echo "$dir$path/%(cg)s" >> %(cglist)s
    if [ "$ctrl" = cpuset ]; then
        cat "$dir$path/cpuset.cpus" > "$dir$path/%(cg)s/cpuset.cpus"
        cat "$dir$path/cpuset.mems" > "$dir$path/%(cg)s/cpuset.mems"
    fi
    echo $$ > "$dir$path/%(cg)s/cgroup.procs"
done < /proc/self/cgroup
exec unshare --pid --fork --mount --cgroup --uts --ipc --mount-proc %(init)s
"""

HARNESS = """# the test's harness, not the unit under test: no sysinit.target or
# basic.target in this namespace, and ovld's output in a file
[Unit]
DefaultDependencies=no
[Service]
StandardOutput=append:%(log)s
StandardError=inherit
Environment=ASAN_OPTIONS=%(asan)s
"""


def test_units_under_systemd_in_a_namespace():
    """Opt-in (OVL_TEST_SYSTEMD_NS=1, root): systemd is not PID 1 on this
    machine, so it is booted as PID 1 of new pid/mount/cgroup namespaces,
    with the installed-like units (paths filled in) and a drop-in that only
    drops the default dependencies (no sysinit.target there) and sends ovld's
    output to a file. Then, for real: ovld@65534.service starts as uid 65534
    behind ExecStartPre, in /run/ovl/65534 (owner 65534, mode 0700), serves
    that uid's ovlctl and ovl-demo without -s, refuses another uid, reloads,
    stops (socket gone, directory kept); ovld@nobody is refused; the socket
    unit listens as 0600 of the uid and starts the service on the first
    connection; the Slurm prolog and epilog drive the real systemctl."""
    if os.environ.get("OVL_TEST_SYSTEMD_NS") != "1":
        raise Skip("opt-in: OVL_TEST_SYSTEMD_NS=1 boots systemd as PID 1 of new namespaces "
                   "(needs root; makes cgroups on this host while it runs)")
    if UID != 0:
        raise Skip("needs root")
    if os.path.isdir("/run/systemd/system"):
        raise Skip("systemd is PID 1 here: start the units with it instead")
    systemd = "/lib/systemd/systemd"
    for tool in ("unshare", "nsenter", "setpriv", "setsid"):
        if shutil.which(tool) is None:
            raise Skip(tool + " is not installed")
    if not os.access(systemd, os.X_OK):
        raise Skip(systemd + " is not installed")
    build = os.environ.get("OVL_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
    asan = os.environ.get("ASAN_OPTIONS", "")
    # outside /tmp, which is private in the namespace (and in the service)
    with Scratch(parent=build) as s:
        etc = s.path("etc")
        os.makedirs(os.path.join(etc, "ovl"), 0o755)
        with open(os.path.join(etc, "ovl", "ovld.conf"), "w") as f:
            f.write("backend = host\nhost_devices = 2\n")
        os.chmod(os.path.join(etc, "ovl", "ovld.conf"), 0o644)
        units = s.path("units")
        os.makedirs(os.path.join(units, "ovld@.service.d"))
        os.makedirs(os.path.join(units, "ovld@.socket.d"))
        VALUES["SYSCONFDIR"] = etc
        try:
            for name in ("ovld@.service", "ovld@.socket"):
                with open(os.path.join(units, name), "w") as f:
                    f.write(fill_template(name))
        finally:
            VALUES["SYSCONFDIR"] = "/etc"
        log = s.path("ovld-%i.log")
        with open(os.path.join(units, "ovld@.service.d", "harness.conf"), "w") as f:
            f.write(HARNESS % {"log": log, "asan": asan})
        with open(os.path.join(units, "ovld@.socket.d", "harness.conf"), "w") as f:
            f.write("[Unit]\nDefaultDependencies=no\n")
        with open(os.path.join(units, "ovl-test.target"), "w") as f:
            f.write("[Unit]\nDescription=ovl test\nDefaultDependencies=no\n")
        with open(os.path.join(units, "ovl-probe.service"), "w") as f:  # default dependencies
            f.write("[Service]\nType=oneshot\nExecStart=/bin/true\n")
        cg = "ovl-peruser-%d" % os.getpid()
        cglist = s.path("cgroups")
        for name, text in (("init.sh", NS_INIT % {"units": units, "systemd": systemd}),
                           ("boot.sh", NS_BOOT % {"cg": cg, "cglist": cglist,
                                                  "init": s.path("init.sh")})):
            with open(s.path(name), "w") as f:
                f.write(text)
            os.chmod(s.path(name), 0o755)
        boot = subprocess.Popen([s.path("boot.sh")], stdout=open(s.path("boot.log"), "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        pid1 = None
        try:
            deadline = time.monotonic() + 30
            while pid1 is None:
                assert boot.poll() is None, "boot failed:\n" + open(s.path("boot.log")).read()
                assert time.monotonic() < deadline, "no systemd in the namespace"
                try:
                    with open("/proc/%d/task/%d/children" % (boot.pid, boot.pid)) as f:
                        kids = f.read().split()
                    if kids and open("/proc/%s/comm" % kids[0]).read().strip() == "systemd":
                        pid1 = int(kids[0])
                except OSError:
                    pass
                time.sleep(0.05)

            def ns(*cmd, uid=None, env=(), check=True, timeout=120):
                full = ["nsenter", "-t", str(pid1), "-a"]
                if uid is not None:
                    full += ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"]
                full += ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/",
                         "ASAN_OPTIONS=" + asan] + list(env) + list(cmd)
                p = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
                if check:
                    assert p.returncode == 0, "%s: rc %d\n%s%s" % (
                        " ".join(cmd), p.returncode, p.stdout, p.stderr)
                return p

            deadline = time.monotonic() + 60
            while ns("systemctl", "is-system-running", check=False).stdout.strip() not in (
                    "running", "degraded"):
                assert time.monotonic() < deadline, "systemd did not finish booting"
                time.sleep(0.2)
            # the guard: a unit with the default dependencies cannot start
            # (it would pull in the boot services that write to the host)
            p = ns("systemctl", "start", "ovl-probe.service", check=False)
            assert p.returncode != 0 and "masked" in p.stdout + p.stderr, p.stdout + p.stderr
            sock = "/run/ovl/%d/ovld.sock" % NOBODY
            unit = "ovld@%d.service" % NOBODY
            # started by hand, as the Slurm prolog does
            ns("systemctl", "start", unit)
            st = ns("stat", "-c", "%u %a", os.path.dirname(sock)).stdout.split()
            assert st == [str(NOBODY), "700"], st
            out = ns(OVLCTL, "status", "--json", uid=NOBODY).stdout
            assert json.loads(out)["socket"] == sock, out
            demo = ns(DEMO, "-w", "2", "-m", "16", "-n", "16", "-k", "16", "-d", "fp32", "-a",
                      "ring", "-i", "2", uid=NOBODY)
            assert ("socket %s (per-user" % sock) in demo.stdout, demo.stdout
            p = ns(OVLCTL, "--socket", sock, "status", uid=OTHER, check=False)
            assert p.returncode == 1 and "Permission denied" in p.stderr, p.stderr
            ns("systemctl", "reload", unit)
            ns("systemctl", "stop", unit)
            assert ns("test", "-e", sock, check=False).returncode != 0, "socket left after stop"
            assert ns("test", "-d", os.path.dirname(sock), check=False).returncode == 0
            # a user name as the instance: refused by ExecStartPre
            p = ns("systemctl", "start", "ovld@nobody.service", check=False)
            assert p.returncode != 0, p.stdout + p.stderr
            ns("systemctl", "stop", "ovld@nobody.service")
            text = open(s.path("ovld-nobody.log")).read()
            assert "must be the numeric uid" in text and "ovld@%d.service" % NOBODY in text, text
            # socket activation
            ns("systemctl", "start", "ovld@%d.socket" % NOBODY)
            st = ns("stat", "-c", "%u %a", sock).stdout.split()
            assert st == [str(NOBODY), "600"], st
            assert ns("systemctl", "is-active", unit, check=False).stdout.strip() == "inactive"
            ns(OVLCTL, "status", uid=NOBODY)
            assert ns("systemctl", "is-active", unit, check=False).stdout.strip() == "active"
            ns("systemctl", "stop", "ovld@%d.socket" % NOBODY, unit)
            assert "passed by systemd" in open(s.path("ovld-%d.log" % NOBODY)).read()
            # the Slurm prolog and epilog, with the real systemctl
            slurm = ["OVL_SLURM_STATE=/run/ovl-slurm", "SLURM_JOB_UID=%d" % NOBODY,
                     "SLURM_JOB_USER=nobody"]
            ns(PROLOG, env=slurm + ["SLURM_JOB_ID=1"])
            ns(PROLOG, env=slurm + ["SLURM_JOB_ID=2"])
            ns(OVLCTL, "status", uid=NOBODY)
            ns(EPILOG, env=slurm + ["SLURM_JOB_ID=1"])
            assert ns("systemctl", "is-active", unit, check=False).stdout.strip() == "active"
            ns(EPILOG, env=slurm + ["SLURM_JOB_ID=2"])
            assert ns("systemctl", "is-active", unit, check=False).stdout.strip() == "inactive"
        finally:
            if pid1 is not None:
                try:
                    os.kill(pid1, signal.SIGKILL)  # PID 1 of the namespace: all of it
                except ProcessLookupError:
                    pass
            if boot.poll() is None:
                try:
                    boot.wait(10)
                except subprocess.TimeoutExpired:
                    boot.kill()
                    boot.wait(10)
            if os.path.exists(cglist):
                for top in open(cglist).read().split():
                    for dp, _, _ in os.walk(top, topdown=False):
                        for _ in range(50):  # the killed processes leave them soon
                            try:
                                os.rmdir(dp)
                                break
                            except FileNotFoundError:
                                break
                            except OSError:
                                time.sleep(0.1)


# ------------------------------------------------------------ Slurm scripts

FAKE = r'''#!%(python)s
import json, os, sys, time
name = os.path.basename(sys.argv[0])
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps([name] + sys.argv[1:]) + "\n")
if name == "systemctl":
    verb = sys.argv[1]
    time.sleep(float(os.environ.get("FAKE_%%s_SLEEP" %% verb.upper().replace("-", "_"), "0")))
    sys.exit(int(os.environ.get("FAKE_%%s_RC" %% verb.upper().replace("-", "_"), "0")))
'''


class Slurm:
    """A fake systemctl and logger first on PATH, recording their calls, and a
    state directory for the scripts' job records."""

    def __init__(self, scratch):
        self.bin = scratch.path("bin")
        self.log = scratch.path("calls.jsonl")
        self.state = scratch.path("state")
        os.mkdir(self.bin)
        for name in ("systemctl", "logger"):
            p = os.path.join(self.bin, name)
            with open(p, "w") as f:
                f.write(FAKE % {"python": sys.executable})
            os.chmod(p, 0o755)
        open(self.log, "w").close()

    def env(self, job, uid=None, user=None, **extra):
        env = {"PATH": self.bin + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
               "FAKE_LOG": self.log, "OVL_SLURM_STATE": self.state, "SLURM_JOB_ID": str(job)}
        if uid is not None:
            env["SLURM_JOB_UID"] = str(uid)
        if user is not None:
            env["SLURM_JOB_USER"] = user
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def calls(self):
        """Every call since the last one, then forgets them."""
        with open(self.log) as f:
            calls = [json.loads(line) for line in f]
        open(self.log, "w").close()
        return calls

    def run(self, script, job, uid=None, user=None, rc=0, **extra):
        """Runs the script; returns (systemctl calls, logger calls, stderr)."""
        p = subprocess.run([script], env=self.env(job, uid, user, **extra), capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == rc, "%s: rc %d, want %d\n%s" % (
            os.path.basename(script), p.returncode, rc, p.stderr)
        calls = self.calls()
        return ([c[1:] for c in calls if c[0] == "systemctl"],
                [c[1:] for c in calls if c[0] == "logger"], p.stderr)

    def jobs(self, uid):
        d = os.path.join(self.state, str(uid))
        return sorted(os.listdir(d)) if os.path.isdir(d) else None


def test_slurm_scripts_static():
    """bash -n, and shellcheck where installed (scripts/install-deps
    installs it)."""
    for script in (PROLOG, EPILOG):
        assert os.access(script, os.X_OK), script + " is not executable"
        with open(script) as f:
            first = f.readline()
            text = f.read()
        assert first == "#!/bin/bash\n", first
        assert "\nset -Eeu\n" in text, script + ": no set -Eeu"
        p = subprocess.run(["bash", "-n", script], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
    sc = shutil.which("shellcheck")
    if sc is None:
        raise Skip("bash -n passed; shellcheck is not installed (Debian: package shellcheck)")
    p = subprocess.run([sc, "--shell=bash", PROLOG, EPILOG], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_slurm_prolog_epilog_calls():
    """The exact systemctl calls of a user's first job, second job, the
    epilog while the other job runs, and the epilog of the last job; the
    instance is always the uid, also for a user name that systemd would
    escape ("first.last-x": systemd-escape makes it first.last\\x2dx)."""
    with Scratch() as s:
        sl = Slurm(s)
        user, uid = "first.last-x", 1234
        # first job: started (systemctl start waits for READY=1)
        sysc, logs, _ = sl.run(PROLOG, 1001, uid, user)
        assert sysc == [["start", "ovld@1234.service"]], sysc
        assert sl.jobs(uid) == ["1001"]
        assert logs and logs[-1][:4] == ["-t", "ovl-prolog", "-p", "daemon.info"], logs
        assert "job 1001 of first.last-x" in logs[-1][-1], logs
        # second job of the same user: start again, a no-op for a running unit
        sysc, _, _ = sl.run(PROLOG, 1002, uid, user)
        assert sysc == [["start", "ovld@1234.service"]], sysc
        assert sl.jobs(uid) == ["1001", "1002"]
        # a job of another user changes nothing for this one
        sysc, _, _ = sl.run(PROLOG, 2001, 5678, "other")
        assert sysc == [["start", "ovld@5678.service"]], sysc
        # the first job ends, the second runs on: ovld stays
        sysc, logs, _ = sl.run(EPILOG, 1001, uid, user)
        assert sysc == [], sysc
        assert sl.jobs(uid) == ["1002"]
        assert "stays for job(s) 1002" in logs[-1][-1], logs
        # the last job ends: ovld (and its socket unit) stopped
        sysc, logs, _ = sl.run(EPILOG, 1002, uid, user)
        assert sysc == [["stop", "ovld@1234.socket", "ovld@1234.service"]], sysc
        assert sl.jobs(uid) is None, "the uid's record directory is left"
        assert logs[-1][3] == "daemon.info", logs
        # the other user's last job
        sysc, _, _ = sl.run(EPILOG, 2001, 5678, "other")
        assert sysc == [["stop", "ovld@5678.socket", "ovld@5678.service"]], sysc
        # an epilog for a job the prolog never saw (installed mid-job): the
        # user has no recorded job left, so ovld is stopped
        sysc, _, _ = sl.run(EPILOG, 3001, uid, user)
        assert sysc == [["stop", "ovld@1234.socket", "ovld@1234.service"]], sysc
        # no SLURM_JOB_UID: the uid of SLURM_JOB_USER
        name = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        sysc, _, _ = sl.run(PROLOG, 4001, None, name)
        assert sysc == [["start", "ovld@%d.service" % UID]], sysc
        sysc, _, _ = sl.run(EPILOG, 4001, None, name)
        assert sysc == [["stop", "ovld@%d.socket" % UID, "ovld@%d.service" % UID]], sysc
        if shutil.which("systemd-escape"):
            esc = subprocess.run(["systemd-escape", user], capture_output=True, text=True).stdout
            assert esc.strip() != user, esc  # the reason the instance is the uid
        st = os.stat(sl.state)
        assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


def test_slurm_failures_never_drain():
    """A daemon already running never fails the prolog; failures to start
    are logged as errors and exit 0 unless OVL_SLURM_STRICT=1; a hanging
    systemctl is cut by the timeout; bad job data and an unusable state
    directory do nothing and exit 0; an epilog always exits 0."""
    with Scratch() as s:
        sl = Slurm(s)
        # start fails, but the unit is active (another prolog raced us)
        sysc, logs, _ = sl.run(PROLOG, 1, 1234, "u", FAKE_START_RC=1)
        assert sysc == [["start", "ovld@1234.service"],
                        ["is-active", "--quiet", "ovld@1234.service"]], sysc
        assert logs[-1][3] == "daemon.warning", logs
        # start fails and the unit is not active: logged, exit 0 ...
        sysc, logs, err = sl.run(PROLOG, 2, 1234, "u", FAKE_START_RC=1, FAKE_IS_ACTIVE_RC=3)
        assert len(sysc) == 2 and logs[-1][3] == "daemon.err", logs
        assert "cannot start ovld@1234.service (rc 1)" in err, err
        # ... or exit 1 when strict
        sl.run(PROLOG, 3, 1234, "u", rc=1, FAKE_START_RC=1, FAKE_IS_ACTIVE_RC=3,
               OVL_SLURM_STRICT=1)
        # a systemctl that hangs is cut short
        t0 = time.monotonic()
        sysc, logs, err = sl.run(PROLOG, 4, 1234, "u", FAKE_START_SLEEP=30, FAKE_IS_ACTIVE_RC=3,
                                 OVL_SLURM_START_TIMEOUT=1)
        assert time.monotonic() - t0 < 20, "the start timeout did not cut systemctl"
        assert "(rc 124)" in err, err
        # bad job data: nothing called
        for job, uid in (("", 1234), ("12x", 1234), (5, "01234"), (5, "-1"), (5, "")):
            env = {"SLURM_JOB_UID": str(uid)} if uid != "" else {}
            for script in (PROLOG, EPILOG):
                p = subprocess.run([script], env=dict(sl.env(job), **env), capture_output=True,
                                   text=True, timeout=60)
                assert p.returncode == 0, (script, job, uid, p.stderr)
                assert [c for c in sl.calls() if c[0] == "systemctl"] == [], (script, job, uid)
                assert p.stderr, (script, job, uid)
        sl.run(PROLOG, 6, None, "no-such-user-ovl-test", rc=1, OVL_SLURM_STRICT=1)
        # a state directory that cannot be made: the unexpected-failure trap
        for script in (PROLOG, EPILOG):
            sysc, logs, err = sl.run(script, 7, 1234, "u",
                                     OVL_SLURM_STATE="/proc/ovl-no-such-dir/state")
            assert sysc == [] and "unexpected failure" in err, err
        # jobs 1 to 4 of uid 1234 are still recorded: their prologs ran
        assert sl.jobs(1234) == ["1", "2", "3", "4"], sl.jobs(1234)
        # the epilog: stop fails (a uid with no other job), still exit 0
        sysc, logs, err = sl.run(EPILOG, 8, 4321, "u", FAKE_STOP_RC=1)
        assert sysc == [["stop", "ovld@4321.socket", "ovld@4321.service"]], sysc
        assert logs[-1][3] == "daemon.err" and "cannot stop" in err, err


def test_slurm_concurrent_epilogs():
    """The last two jobs of a user end at once: the lock per uid makes
    exactly one epilog stop ovld (without it, each could see the other's
    record and neither stop it)."""
    with Scratch() as s:
        sl = Slurm(s)
        for round in range(5):
            for job in (1, 2):
                sl.run(PROLOG, job, 1234, "u")
            procs = [subprocess.Popen([EPILOG], env=sl.env(job, 1234, "u", FAKE_STOP_SLEEP=0.2),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for job in (1, 2)]
            for p in procs:
                p.communicate(timeout=60)
                assert p.returncode == 0
            stops = [c for c in sl.calls() if c[:2] == ["systemctl", "stop"]]
            assert len(stops) == 1, (round, stops)
            assert sl.jobs(1234) is None


# ------------------------------------------------- the default socket, live

def test_default_socket_order():
    """Four real ovlds, at $OVL_SOCKET, /run/ovl/UID/ovld.sock,
    $XDG_RUNTIME_DIR/ovl/ovld.sock and /run/ovl/ovld.sock (/run/ovl being a
    temporary directory, $OVL_RUNTIME_DIR): ovlctl status, with no -s,
    reaches each in that order as the ones before it go; the failure when
    none is left names the path tried and the rule; $OVL_SOCKET is taken even
    when it leads nowhere; a stale per-user socket is taken, not skipped."""
    with Scratch() as s:
        run, xdg = s.path("run"), s.path("xdg")
        os.makedirs(os.path.join(run, str(UID)))
        os.makedirs(os.path.join(xdg, "ovl"))
        env_path = s.path("env.sock")
        per_user = os.path.join(run, str(UID), "ovld.sock")
        user_mgr = os.path.join(xdg, "ovl", "ovld.sock")
        node = os.path.join(run, "ovld.sock")
        d_env = Ovld(s, env_path, "env")
        d_user = Ovld(s, per_user, "per-user")
        d_mgr = Ovld(s, user_mgr, "user-manager")
        d_node = Ovld(s, node, "node")
        base = dict(OVL_RUNTIME_DIR=run, XDG_RUNTIME_DIR=xdg)
        assert status(clean_env(OVL_SOCKET=env_path, **base))["pid"] == d_env.pid
        assert status(clean_env(**base))["pid"] == d_user.pid
        p = ctl(clean_env(**base), "--help")
        assert "here and now: %s, per-user (ovld@UID.service)" % per_user in p.stdout, p.stdout
        # $OVL_SOCKET wins even when nothing listens there: no fallback
        p = ctl(clean_env(OVL_SOCKET=s.path("missing.sock"), **base), "status")
        assert p.returncode == 1, p.stdout + p.stderr
        assert ("cannot connect to %s (from $OVL_SOCKET)" % s.path("missing.sock")) in p.stderr
        d_user.stop()
        assert status(clean_env(**base))["pid"] == d_mgr.pid
        assert status(clean_env(OVL_RUNTIME_DIR=run))["pid"] == d_node.pid  # no XDG_RUNTIME_DIR
        d_mgr.stop()
        assert status(clean_env(**base))["pid"] == d_node.pid
        d_node.stop()
        p = ctl(clean_env(**base), "status")
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        for part in ("cannot connect to %s (the node-wide default;" % node,
                     "%s absent" % per_user, "%s absent" % user_mgr,
                     "No such file or directory"):
            assert part in lines[0], (part, lines[0])
        # a per-user socket whose ovld died without removing it is still the
        # choice (a restart of ovld@ replaces it): the message says so
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(per_user)
        stale.close()
        p = ctl(clean_env(**base), "status")
        assert p.returncode == 1, p.stdout + p.stderr
        want = "cannot connect to %s (the per-user socket of ovld@%d.service): Connection refused" % (
            per_user, UID)
        assert want in p.stderr, p.stderr
        os.unlink(per_user)
        d_env.stop()


def test_ovl_demo_reaches_per_user_daemon():
    """ovl-demo with no -s and no $OVL_SOCKET runs its job on the per-user
    ovld, not on the node-wide one beside it, and says which it chose."""
    with Scratch() as s:
        run = s.path("run")
        per_user = os.path.join(run, str(UID), "ovld.sock")
        os.makedirs(os.path.dirname(per_user))
        d_node = Ovld(s, os.path.join(run, "ovld.sock"), "node")
        d_user = Ovld(s, per_user, "per-user")
        env = clean_env(OVL_RUNTIME_DIR=run)
        p = subprocess.run([DEMO, "-w", "2", "-m", "32", "-n", "32", "-k", "32", "-d", "fp32",
                            "-a", "ring", "-i", "3"], env=env, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr + d_user.log_text()[-3000:]
        assert ("ovl-demo: socket %s (per-user (ovld@UID.service))" % per_user) in p.stdout, p.stdout
        ops = {}
        for name, d in (("user", d_user), ("node", d_node)):
            q = ctl(env, "--socket", d.sock, "stats", "--json")
            assert q.returncode == 0, q.stderr
            ops[name] = json.loads(q.stdout)["total"]["ops_done"]
        assert ops["user"] >= 3 and ops["node"] == 0, ops
        d_user.stop()
        d_node.stop()


if __name__ == "__main__":
    run_tests([
        test_units_verify,
        test_unit_paths_match_libovl,
        test_hardening_matches_node_wide,
        test_instance_must_be_the_uid,
        test_emulated_instance_serves_only_its_user,
        test_units_under_systemd_in_a_namespace,
        test_slurm_scripts_static,
        test_slurm_prolog_epilog_calls,
        test_slurm_failures_never_drain,
        test_slurm_concurrent_epilogs,
        test_default_socket_order,
        test_ovl_demo_reaches_per_user_daemon,
    ])
