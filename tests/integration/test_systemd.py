"""ovld under systemd, without systemd as PID 1:

- sd_notify(3): a datagram socket given as $NOTIFY_SOCKET sees READY=1 (with
  a STATUS= line) only once ovld's socket accepts, RELOADING=1 then READY=1
  on SIGHUP (also when the new file is refused), STOPPING=1 on SIGTERM; a
  NOTIFY_SOCKET in the abstract namespace ("@name") works too.
- socket activation (sd_listen_fds(3)) under systemd-socket-activate (Debian's
  systemd package): the first connection starts ovld, which serves on the
  passed socket and binds none of its own; two passed sockets are refused;
  LISTEN_FDS meant for another pid is ignored.
- `systemd-analyze verify` on deploy/ovld.service (its @SBINDIR@ and
  @SYSCONFDIR@ filled in as CMake would, with ExecStart pointing at the built
  ovld) and deploy/ovld.socket.
- systemd-sysusers and systemd-tmpfiles apply deploy/ovl.sysusers and
  deploy/ovl.tmpfiles to a scratch root.

A test whose tool is missing, or cannot run here, is skipped with its reason.
Environment: OVLD_BIN, OVLCTL_BIN, OVL_SOURCE_DIR (the repository root).
Prints one line per test and 'N passed, N failed, N skipped'; exits 1 if any
test failed."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

from ovltest import Skip, can_connect, run_tests

OVLD = os.path.abspath(shutil.which(os.environ.get("OVLD_BIN", "ovld")) or os.environ.get("OVLD_BIN", "ovld"))
OVLCTL = os.environ.get("OVLCTL_BIN", "ovlctl")
SOURCE_DIR = os.environ.get(
    "OVL_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")

START_TIMEOUT = 10.0   # ovld (host backend) up and listening
NOTIFY_TIMEOUT = 5.0   # one expected notification
STOP_TIMEOUT = 10.0    # SIGTERM to exit
TOOL_TIMEOUT = 30      # systemd-analyze and friends




def clean_env(**extra):
    """The test's environment without systemd's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES",
                        "WATCHDOG_PID", "WATCHDOG_USEC", "OVL_SOCKET")}
    env.update(extra)
    return env


class Proc:
    """A child process (ovld, or an activator that becomes ovld) with its
    output in a log file in `dir`; killed by cleanup() if still running."""

    def __init__(self, cmd, dir, env, name="ovld"):
        self.cmd = cmd
        self.log_path = os.path.join(dir, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def running(self):
        return self.proc.poll() is None

    def signal(self, sig):
        if self.running():
            self.proc.send_signal(sig)

    def wait(self, timeout):
        """Exit status within `timeout` seconds, or AssertionError."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s did not exit within %.0f s:\n%s" % (
                self.cmd[0], timeout, self.log_text()[-4000:]))

    def cleanup(self):
        if self.running():
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if not self.log.closed:
            self.log.close()


class Scratch:
    """A temporary directory and the processes and sockets of one test;
    everything is killed, closed and removed on exit, pass or fail."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ovl-systemd-")
        self.procs = []
        self.socks = []

    def path(self, name):
        return os.path.join(self.dir, name)

    def spawn(self, cmd, env, name="ovld"):
        p = Proc(cmd, self.dir, env, name)
        self.procs.append(p)
        return p

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.cleanup()
        for s in self.socks:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


def wait_for(pred, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and not proc.running():
            raise AssertionError("%s exited with %s while waiting for %s:\n%s" % (
                proc.cmd[0], proc.proc.returncode, what, proc.log_text()[-4000:]))
        time.sleep(0.02)
    raise AssertionError("timed out after %.0f s waiting for %s%s" % (
        timeout, what, (":\n" + proc.log_text()[-4000:]) if proc else ""))


# ------------------------------------------------------------ sd_notify(3)

class NotifyListener:
    """A datagram socket standing in for systemd's notification socket."""

    def __init__(self, scratch, abstract=False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        scratch.socks.append(self.sock)
        if abstract:
            name = "ovl-test-notify-%d-%s" % (os.getpid(), os.path.basename(scratch.dir))
            self.sock.bind("\0" + name)
            self.env_value = "@" + name
        else:
            path = scratch.path("notify.sock")
            self.sock.bind(path)
            self.env_value = path
        self.received = []  # every message so far, as lists of lines

    def next(self, timeout, proc=None):
        """The next message as a list of "KEY=VALUE" lines, or None on timeout.
        Polls in short steps so that a dead ovld is noticed at once."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(min(left, 0.2))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                if proc is not None and not proc.running():
                    # a last message may still be queued
                    self.sock.settimeout(0.05)
                    try:
                        data = self.sock.recv(4096)
                    except socket.timeout:
                        return None
                else:
                    continue
            msg = data.decode("utf-8", "replace").split("\n")
            msg = [line for line in msg if line]
            self.received.append(msg)
            return msg

    def expect(self, key_value, timeout, proc, then=None):
        """Reads messages until one has the line `key_value`; returns it.
        `then(msg)` runs at once when that message arrives (before anything
        else is read), for checks that must see the daemon's state right then."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.next(max(0.0, deadline - time.monotonic()), proc)
            if msg is None:
                raise AssertionError("no %s within %.0f s; received %r\novld log:\n%s" % (
                    key_value, timeout, self.received, proc.log_text()[-4000:]))
            if key_value in msg:
                if then is not None:
                    then(msg)
                return msg


def field(msg, key):
    for line in msg:
        if line.startswith(key + "="):
            return line[len(key) + 1:]
    return None


def start_notified_ovld(scratch, listener, config_text):
    cfg = scratch.path("ovld.conf")
    with open(cfg, "w") as f:
        f.write(config_text)
    sock = scratch.path("ovld.sock")
    cmd = [OVLD, "--foreground", "--backend", "host", "--socket", sock, "--config", cfg]
    proc = scratch.spawn(cmd, clean_env(NOTIFY_SOCKET=listener.env_value))
    return proc, sock, cfg


def check_ready(proc, sock):
    """Runs the moment READY=1 arrives: the socket must accept already."""
    def check(msg):
        assert can_connect(sock), "READY=1 arrived before %s accepted connections" % sock
        status = field(msg, "STATUS")
        assert status, "READY=1 without a STATUS= line: %r" % msg
        assert "host backend" in status, status
        assert field(msg, "MAINPID") == str(proc.pid), (msg, proc.pid)
    return check


def test_sd_notify_ready_reload_stopping():
    with Scratch() as s:
        listener = NotifyListener(s)
        proc, sock, cfg = start_notified_ovld(s, listener, "log_level = info\nhost_devices = 2\n")
        msg = listener.expect("READY=1", START_TIMEOUT, proc, then=check_ready(proc, sock))
        assert field(msg, "STATUS") == "Serving: host backend, 2 devices", msg
        assert "RELOADING=1" not in msg and "STOPPING=1" not in msg, msg

        # SIGHUP with a good file: RELOADING=1, then READY=1
        with open(cfg, "w") as f:
            f.write("log_level = debug\nhost_devices = 2\n")
        proc.signal(signal.SIGHUP)
        listener.expect("RELOADING=1", NOTIFY_TIMEOUT, proc)
        msg = listener.expect("READY=1", NOTIFY_TIMEOUT, proc)
        assert "RELOADING=1" not in msg, msg
        wait_for(lambda: "configuration re-read" in proc.log_text(), NOTIFY_TIMEOUT,
                 "the reload's log line", proc)

        # SIGHUP with a bad file: refused, but systemd must still see READY=1
        # or `systemctl reload` would hang in "reloading"
        with open(cfg, "w") as f:
            f.write("no_such_key = 1\n")
        proc.signal(signal.SIGHUP)
        listener.expect("RELOADING=1", NOTIFY_TIMEOUT, proc)
        listener.expect("READY=1", NOTIFY_TIMEOUT, proc)
        assert proc.running() and can_connect(sock), proc.log_text()

        # SIGTERM: STOPPING=1, exit 0
        proc.signal(signal.SIGTERM)
        listener.expect("STOPPING=1", NOTIFY_TIMEOUT, proc)
        rc = proc.wait(STOP_TIMEOUT)
        assert rc == 0, "ovld exited %d:\n%s" % (rc, proc.log_text())
        ready = [m for m in listener.received if "READY=1" in m]
        assert len(ready) == 3, listener.received  # start and two reloads
        stopping = [i for i, m in enumerate(listener.received) if "STOPPING=1" in m]
        assert stopping == [len(listener.received) - 1], listener.received


def test_sd_notify_abstract_socket():
    with Scratch() as s:
        listener = NotifyListener(s, abstract=True)
        proc, sock, _ = start_notified_ovld(s, listener, "")
        msg = listener.expect("READY=1", START_TIMEOUT, proc, then=check_ready(proc, sock))
        assert field(msg, "STATUS") == "Serving: host backend, 8 devices", msg
        proc.signal(signal.SIGTERM)
        listener.expect("STOPPING=1", NOTIFY_TIMEOUT, proc)
        assert proc.wait(STOP_TIMEOUT) == 0, proc.log_text()


def test_sd_notify_watchdog():
    """With $WATCHDOG_USEC set (as systemd does for WatchdogSec=), ovld's
    loop sends WATCHDOG=1 at about half the interval; with it unset, never."""
    with Scratch() as s:
        listener = NotifyListener(s)
        sock = s.path("ovld.sock")
        cmd = [OVLD, "--foreground", "--backend", "host", "--socket", sock]
        proc = s.spawn(cmd, clean_env(NOTIFY_SOCKET=listener.env_value,
                                      WATCHDOG_USEC="200000"))
        listener.expect("READY=1", START_TIMEOUT, proc)
        t0 = time.monotonic()
        for _ in range(3):
            listener.expect("WATCHDOG=1", 1.0, proc)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.0, "three pings took %.2f s (interval 0.1 s)" % elapsed
        assert "systemd watchdog: WATCHDOG=1 every 100 ms" in proc.log_text(), proc.log_text()
        proc.signal(signal.SIGTERM)
        listener.expect("STOPPING=1", NOTIFY_TIMEOUT, proc)
        assert proc.wait(STOP_TIMEOUT) == 0, proc.log_text()
    # meant for another pid: ignored, no ping at all
    with Scratch() as s:
        listener = NotifyListener(s)
        sock = s.path("ovld.sock")
        cmd = [OVLD, "--foreground", "--backend", "host", "--socket", sock]
        proc = s.spawn(cmd, clean_env(NOTIFY_SOCKET=listener.env_value,
                                      WATCHDOG_USEC="200000", WATCHDOG_PID="1"))
        listener.expect("READY=1", START_TIMEOUT, proc)
        msg = listener.next(0.5, proc)
        assert msg is None, "a message after READY=1 with WATCHDOG_PID=1: %r" % msg
        assert "systemd watchdog" not in proc.log_text(), proc.log_text()
        proc.signal(signal.SIGTERM)
        msg = listener.expect("STOPPING=1", NOTIFY_TIMEOUT, proc)
        assert "WATCHDOG=1" not in msg, msg
        assert proc.wait(STOP_TIMEOUT) == 0, proc.log_text()


# ---------------------------------------------------------- sd_listen_fds(3)

def socket_activate_tool():
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        for p in ("/usr/bin/systemd-socket-activate", "/lib/systemd/systemd-activate"):
            if os.access(p, os.X_OK):
                return p
        raise Skip("systemd-socket-activate is not installed (Debian: package systemd)")
    return tool


def ovlctl_status(sock, timeout=10):
    p = subprocess.run([OVLCTL, "--socket", sock, "status", "--json"], env=clean_env(),
                       capture_output=True, text=True, timeout=timeout)
    return p


def test_socket_activation():
    tool = socket_activate_tool()
    with Scratch() as s:
        act = s.path("act.sock")
        own = s.path("own.sock")  # where ovld would bind if it ignored LISTEN_FDS
        proc = s.spawn([tool, "-l", act, OVLD, "--foreground", "--backend", "host",
                        "--socket", own, "--log-level", "debug"], clean_env(), name="activate")
        wait_for(lambda: os.path.exists(act), START_TIMEOUT, "the activator's socket", proc)
        assert "passed by systemd" not in proc.log_text()
        # the first connection starts ovld (the activator execs it: same pid)
        p = ovlctl_status(act)
        assert p.returncode == 0, "ovlctl status: %d\n%s%s\nlog:\n%s" % (
            p.returncode, p.stdout, p.stderr, proc.log_text())
        st = json.loads(p.stdout)
        assert st["pid"] == proc.pid, (st["pid"], proc.pid)
        assert st["backend"] == "host", st
        # status names the socket systemd passed, not the configured one
        assert st["socket"] == act, (st["socket"], act)
        wait_for(lambda: ("listening on %s, passed by systemd" % act) in proc.log_text(),
                 NOTIFY_TIMEOUT, "ovld's log line about the passed socket", proc)
        assert not os.path.exists(own), "ovld bound %s besides the passed socket" % own
        # a second client is served by the same process
        p = ovlctl_status(act)
        assert p.returncode == 0 and json.loads(p.stdout)["pid"] == proc.pid, p.stdout + p.stderr
        proc.signal(signal.SIGTERM)
        rc = proc.wait(STOP_TIMEOUT)
        assert rc == 0, "ovld exited %d:\n%s" % (rc, proc.log_text())
        # the socket belongs to whoever passed it: ovld must not unlink it
        assert os.path.exists(act), "ovld removed the socket it was given"


def test_socket_activation_two_sockets_refused():
    tool = socket_activate_tool()
    with Scratch() as s:
        a, b = s.path("a.sock"), s.path("b.sock")
        proc = s.spawn([tool, "-l", a, "-l", b, OVLD, "--foreground", "--backend", "host",
                        "--socket", s.path("own.sock")], clean_env(), name="activate")
        wait_for(lambda: os.path.exists(a) and os.path.exists(b), START_TIMEOUT,
                 "the activator's sockets", proc)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.socks.append(c)
        c.settimeout(2)
        c.connect(a)  # wakes the activator, which execs ovld
        rc = proc.wait(START_TIMEOUT)
        assert rc == 1, "ovld (exit %d) and two passed sockets:\n%s" % (rc, proc.log_text())
        # the activator's own lines, then ovld's: one error, nothing started
        ours = [ln for ln in proc.log_text().splitlines() if " ovld[%d] " % proc.pid in ln]
        assert len(ours) == 1 and ours[0].endswith(
            " error: systemd passed 2 sockets; ovld takes exactly one"), proc.log_text()
        assert not os.path.exists(s.path("own.sock"))


def test_listen_fds_for_another_pid_ignored():
    with Scratch() as s:
        sock = s.path("ovld.sock")
        # LISTEN_PID names another process (our own pid): not for ovld
        env = clean_env(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
        proc = s.spawn([OVLD, "--foreground", "--backend", "host", "--socket", sock], env)
        wait_for(lambda: can_connect(sock), START_TIMEOUT, "ovld's own socket", proc)
        assert "passed by systemd" not in proc.log_text(), proc.log_text()
        assert (" info: listening on %s\n" % sock) in proc.log_text(), proc.log_text()
        proc.signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT) == 0, proc.log_text()
        assert not os.path.exists(sock), "ovld left its own socket behind"


# ------------------------------------------------------- unit file checks

PLACEHOLDER = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")


def fill_template(path, values):
    """What configure_file(@ONLY) makes of `path`. Fails on a placeholder
    that CMake would not know (configure_file would make it empty)."""
    with open(path) as f:
        text = f.read()
    unknown = sorted(set(PLACEHOLDER.findall(text)) - set(values))
    assert not unknown, "%s: placeholders not set by CMake: %s" % (path, unknown)
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def run_tool(cmd, cwd=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                              cwd=cwd, env=clean_env(SYSTEMD_PAGER="", SYSTEMD_COLORS="0"))
    except subprocess.TimeoutExpired:
        raise Skip("%s did not finish within %d s" % (cmd[0], TOOL_TIMEOUT))


def test_systemd_analyze_verify():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise Skip("systemd-analyze is not installed (Debian: package systemd)")
    assert os.access(OVLD, os.X_OK), "OVLD_BIN %s is not executable" % OVLD
    with Scratch() as s:
        # A unit that is right by construction: if verify fails on it, the
        # tool cannot run here (no usable /run, cgroups, ...); skip.
        control = s.path("ovl-verify-control.service")
        with open(control, "w") as f:
            f.write("[Unit]\nDescription=control\n\n[Service]\nType=oneshot\n"
                    "ExecStart=/bin/true\n")
        p = run_tool([tool, "verify", "--man=no", control])
        if p.returncode != 0:
            raise Skip("systemd-analyze verify fails on a trivial unit here (rc %d): %s" % (
                p.returncode, (p.stdout + p.stderr).strip()[-600:]))

        values = {"SBINDIR": os.path.dirname(OVLD), "SYSCONFDIR": "/etc"}
        units = []
        for name in ("ovld.service", "ovld.socket"):
            text = fill_template(os.path.join(DEPLOY, name), values)
            if name == "ovld.service":
                # ExecStart must name the binary under test, whatever its file name
                text = text.replace(values["SBINDIR"] + "/ovld ", OVLD + " ")
                assert ("ExecStart=%s --foreground" % OVLD) in text, "ExecStart not as expected"
            dst = s.path(name)
            with open(dst, "w") as f:
                f.write(text)
            units.append(dst)
        p = run_tool([tool, "verify", "--man=no"] + units)
        out = (p.stdout + p.stderr).strip()
        # verify exits 0 on many problems it only warns about ("Unknown key
        # ..., ignoring"): any line about our files is a failure too
        ours = [line for line in out.splitlines()
                if "ovld.service" in line or "ovld.socket" in line]
        assert p.returncode == 0 and not ours, \
            "systemd-analyze verify (rc %d):\n%s" % (p.returncode, out)
        if out:
            print("  note: systemd-analyze verify said (not about our units):\n    " +
                  out.replace("\n", "\n    "))


def test_sysusers_and_tmpfiles():
    sysusers = shutil.which("systemd-sysusers")
    tmpfiles = shutil.which("systemd-tmpfiles")
    if sysusers is None or tmpfiles is None:
        raise Skip("systemd-sysusers or systemd-tmpfiles is not installed")
    su_conf = os.path.join(DEPLOY, "ovl.sysusers")
    tf_conf = os.path.join(DEPLOY, "ovl.tmpfiles")
    with Scratch() as s:
        root = s.path("root")
        os.makedirs(os.path.join(root, "etc"))
        p = run_tool([sysusers, "--root=" + root, su_conf])
        out = (p.stdout + p.stderr).strip()
        assert "ovl.sysusers" not in out, out  # a complaint about a line of ours
        if p.returncode != 0:
            raise Skip("systemd-sysusers cannot run here (rc %d): %s" % (p.returncode, out))
        with open(os.path.join(root, "etc", "passwd")) as f:
            users = [l.split(":") for l in f.read().splitlines()]
        with open(os.path.join(root, "etc", "group")) as f:
            groups = [l.split(":") for l in f.read().splitlines()]
        user = [u for u in users if u[0] == "ovl"]
        group = [g for g in groups if g[0] == "ovl"]
        assert len(user) == 1 and len(group) == 1, (users, groups)
        assert user[0][3] == group[0][2], "ovl's primary group is not ovl: %r %r" % (user, group)
        assert user[0][6].endswith("nologin"), user

        p = run_tool([tmpfiles, "--root=" + root, "--create", tf_conf])
        out = (p.stdout + p.stderr).strip()
        assert "ovl.tmpfiles" not in out, out
        # Not root: the directory is made, but giving it to ovl is refused;
        # the file was still parsed and applied as far as it can be here.
        chown_only = os.geteuid() != 0 and out and all(
            "chown" in line and "Operation not permitted" in line for line in out.splitlines())
        if p.returncode != 0 and not chown_only:
            raise Skip("systemd-tmpfiles cannot run here (rc %d): %s" % (p.returncode, out))
        st = os.stat(os.path.join(root, "run", "ovl"))
        assert oct(st.st_mode & 0o7777) == "0o755", oct(st.st_mode)
        if os.geteuid() == 0:
            assert st.st_uid == int(user[0][2]) and st.st_gid == int(group[0][2]), \
                (st.st_uid, st.st_gid, user, group)


if __name__ == "__main__":
    run_tests([
        test_sd_notify_watchdog,
        test_sd_notify_ready_reload_stopping,
        test_sd_notify_abstract_socket,
        test_socket_activation,
        test_socket_activation_two_sockets_refused,
        test_listen_fds_for_another_pid_ignored,
        test_systemd_analyze_verify,
        test_sysusers_and_tmpfiles,
    ])
