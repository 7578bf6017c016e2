"""Helpers for ovl's Python integration tests: a real ovld on a temporary
socket, bounded waits, and a tiny test runner that prints one line per test
and a closing 'N passed, N failed, N skipped' line."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

OVLD = os.environ.get("OVLD_BIN", "ovld")
OVLCTL = os.environ.get("OVLCTL_BIN", "ovlctl")
DEMO = os.environ.get("OVL_DEMO_BIN", "ovl-demo")


class Daemon:
    """An ovld in the foreground on a socket in its own temporary directory."""

    def __init__(self, *args, config=None, backend="host"):
        self.dir = tempfile.mkdtemp(prefix="ovl-test-")
        self.socket = os.path.join(self.dir, "ovld.sock")
        self.log_path = os.path.join(self.dir, "ovld.log")
        cmd = [OVLD, "--foreground", "--backend", backend, "--socket", self.socket,
               "--log-level", "debug"]
        if config is not None:
            cfg = os.path.join(self.dir, "ovld.conf")
            with open(cfg, "w") as f:
                f.write(config)
            cmd += ["--config", cfg]
        cmd += list(args)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("ovld exited early with %d:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(self.socket)
                s.close()
                return
            except OSError:
                time.sleep(0.02)
        raise AssertionError("ovld did not listen within %.0f s:\n%s" % (timeout, self.log_text()))

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Stops ovld; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("ovld did not stop within %.0f s:\n%s" % (timeout, self.log_text()))
        self.log.close()
        return self.proc.returncode

    def env(self):
        e = dict(os.environ)
        e["OVL_SOCKET"] = self.socket
        return e

    def run(self, cmd, timeout=300, check=True):
        """Runs a client command against this daemon; returns CompletedProcess."""
        p = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError("%s exited %d\nstdout:\n%s\nstderr:\n%s\novld log:\n%s" % (
                " ".join(cmd), p.returncode, p.stdout, p.stderr, self.log_text()[-4000:]))
        return p

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for name in os.listdir(self.dir):
            try:
                os.unlink(os.path.join(self.dir, name))
            except OSError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def log_excerpt(d, lines=80):
    """ovld's log without the per-connection debug lines that bury the rest."""
    keep = [ln for ln in d.log_text().splitlines() if " debug: " not in ln]
    return "\n".join(keep[-lines:])


def status_json(d):
    """`ovlctl status --json`; a daemon that does not answer fails the test."""
    try:
        return json.loads(d.run([OVLCTL, "status", "--json"], timeout=30).stdout)
    except subprocess.TimeoutExpired:
        raise AssertionError("ovld does not answer (its loop is blocked); its log ends:\n" +
                             log_excerpt(d))


def long_demo(d, shape, job):
    """ovl-demo, in a session of its own: a 2-rank ring job of `shape`
    (ovl-demo's -m/-n/-k arguments) that runs until something stops it."""
    return subprocess.Popen([DEMO, "-w", "2"] + shape + ["-a", "ring", "-i", "100000",
                                                        "--job", job], env=d.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_job_going(d, job, ops):
    """Waits (up to 60 s) until the job has done more than `ops` ops and both
    ranks are in it; returns the status then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = status_json(d)
        jobs = [j for j in s["jobs"] if j["id"] == job]
        ranks = [c for c in s["clients"] if c["job"] == job]
        if jobs and jobs[0]["ops_done"] > ops and len(ranks) == 2:
            return s
        time.sleep(0.05)
    raise AssertionError("the job never got going:\n" + log_excerpt(d))


def client_killed_mid_job(d, shape, fresh_shape, ops_before_kill=50):
    """ovl-demo runs a long 2-rank ring job of `shape`; once it has done
    ops_before_kill ops, rank 1's process is killed (SIGKILL) with ops in
    flight. ovld must let those ops run out or fail, end the job, free what
    it held (no job, no held bytes within 30 s), keep its loop turning,
    serve a fresh job of fresh_shape correctly, and stop at once on
    SIGTERM."""
    demo = long_demo(d, shape, "doomed")
    try:
        s = wait_job_going(d, "doomed", ops_before_kill)
        victim = [c["pid"] for c in s["clients"] if c["job"] == "doomed" and c["rank"] == 1][0]
        os.kill(victim, signal.SIGKILL)
        try:
            demo.communicate(timeout=60)  # the demo stops its other rank itself
        except subprocess.TimeoutExpired:
            raise AssertionError("ovl-demo did not end after a rank died:\n" + log_excerpt(d))
        assert demo.returncode != 0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()
    # ovld lets the in-flight ops run out and forgets the job
    deadline = time.monotonic() + 30
    while True:
        s = status_json(d)
        held = sum(dev["held_bytes"] for dev in s["devices"])
        if not s["jobs"] and held == 0:
            break
        assert time.monotonic() < deadline, "job or memory left behind: %r\n%s" % (
            s, log_excerpt(d))
        time.sleep(0.1)
    # and serves a fresh job correctly
    p = d.run([DEMO, "-w", "2"] + fresh_shape + ["-i", "3", "--job", "after"], timeout=120)
    assert "all checks passed" in p.stdout, p.stdout
    # ovld's loop never stopped turning (daemon/stall.c reports it)
    assert "event loop has not turned" not in d.log_text(), log_excerpt(d)
    t0 = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - t0 < 10, "SIGTERM took %.1f s" % (time.monotonic() - t0)


def daemon_killed_mid_job(d, shape, ops_before_kill=50):
    """ovl-demo runs a long 2-rank ring job of `shape`; once it has done
    ops_before_kill ops, ovld is killed (SIGKILL) with ops in flight. No op
    will ever be done: libovl must release its own waits (on a GPU, the
    ones its streams hold) and fail, so that ovl-demo ends, within 30 s and
    with an error naming ovld, rather than wait for ever."""
    demo = long_demo(d, shape, "orphaned")
    try:
        wait_job_going(d, "orphaned", ops_before_kill)
        d.proc.kill()
        d.proc.wait()
        t0 = time.monotonic()
        try:
            out, err = demo.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("ovl-demo still runs 30 s after ovld died")
        assert demo.returncode != 0, out + err
        assert "ovld" in out + err and "closed" in out + err, out + err
        return time.monotonic() - t0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()


def frame(body: bytes) -> bytes:
    return b"OVL1" + len(body).to_bytes(4, "little") + body


class Skip(Exception):
    """Raised by a test that cannot run here (its reason is printed): it
    is counted as skipped, never as passed."""


def run_tests(tests):
    """Runs test functions in order; prints one line each and a summary
    line; exits 1 on failure."""
    passed = failed = skipped = 0
    for t in tests:
        start = time.monotonic()
        try:
            t()
            passed += 1
            print("PASS %-40s %.2f s" % (t.__name__, time.monotonic() - start), flush=True)
        except Skip as e:
            skipped += 1
            print("SKIP %-40s %s" % (t.__name__, e), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s" % t.__name__, flush=True)
            traceback.print_exc()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    sys.exit(1 if failed else 0)
