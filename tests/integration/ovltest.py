"""Helpers for ovl's Python integration tests: a real ovld on a temporary
socket, bounded waits, and a tiny test runner that prints one line per test
and a closing 'N passed, N failed, N skipped' line."""
import json
import os
import random
import re
import shutil
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

    def __init__(self, *args, config=None, backend="host", env=None):
        """config: the configuration file's text (none if None); env: variables
        added to ovld's environment (UCX_TLS for the tests of peers)."""
        self.dir = tempfile.mkdtemp(prefix="ovl-test-")
        try:
            self._start(args, config, backend, env)
        except BaseException:
            # an ovld that does not start (a GPU test that then skips)
            # leaves no directory behind
            self.cleanup()
            raise

    def _start(self, args, config, backend, env):
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
        penv = None
        if env:
            penv = dict(os.environ)
            penv.update(env)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=penv)
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
        """Kills ovld if it runs and removes its directory; safe to call
        again, and on a Daemon whose start failed."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        log = getattr(self, "log", None)
        if log is not None and not log.closed:
            log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (Linux's default when
    /proc does not say)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(count=1):
    """The first of count consecutive ports free on 127.0.0.1 for a test's
    listener. Never one of bind(port 0)'s: those come from the ephemeral
    range, where any outgoing connection of a test running beside this one
    (UCX over TCP makes many) can take the port between this check and the
    listener's bind, which CI saw as "address already in use". So the ports
    are drawn at random below that range and each is checked with bind."""
    high = min(_ephemeral_low(), 65536) - count
    low = 20000 if high > 21000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(low, high)
        ok = True
        for p in range(base, base + count):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return base
    raise AssertionError("no %d free consecutive ports in %d..%d on 127.0.0.1" % (count, low, high))


def log_excerpt(d, lines=80):
    """ovld's log without the per-connection debug lines that bury the rest."""
    keep = [ln for ln in d.log_text().splitlines() if " debug: " not in ln]
    return "\n".join(keep[-lines:])


# One line of ovld's log as it writes it to stderr (daemon/util/log.c), not
# under systemd: "<UTC time> ovld[<pid>] <level>: <message>".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ovld\[(\d+)\] "
                      r"(error|warn|info|debug): (.*)$")


def log_records(text, pid):
    """(level, message) of each line of ovld's log text; a line that is not
    one of ovld's (pid's) fails the test, so that nothing else (a sanitizer
    report, a stray print) hides in it."""
    out = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        assert m and int(m.group(1)) == pid, "not a log line of ovld (pid %d): %r\n%s" % (
            pid, line, text[-4000:])
        out.append((m.group(2), m.group(3)))
    return out


def log_messages(d, level=None):
    """The messages of d's log (of one level, or all)."""
    return [m for lv, m in log_records(d.log_text(), d.proc.pid) if level in (None, lv)]


def status_json(d):
    """`ovlctl status --json`; a daemon that does not answer fails the test."""
    try:
        return json.loads(d.run([OVLCTL, "status", "--json"], timeout=30).stdout)
    except subprocess.TimeoutExpired:
        raise AssertionError("ovld does not answer (its loop is blocked); its log ends:\n" +
                             log_excerpt(d))


def share(world, ngpu):
    """How many ranks each GPU holds when `world` ranks go round-robin over
    `ngpu` GPUs (ovl-demo: rank r on GPU r mod ngpu), in ovl-bench's words:
    "1 rank per GPU", "2 ranks per GPU, shared", "1 to 2 ranks per GPU,
    shared"."""
    used = min(world, ngpu)
    lo, hi = world // used, -(-world // used)
    if lo == hi:
        return "%d rank%s per GPU%s" % (lo, "" if lo == 1 else "s", ", shared" if lo > 1 else "")
    return "%d to %d ranks per GPU, shared" % (lo, hi)


def long_demo(d, shape, job, world=2, algo="ring", extra=()):
    """ovl-demo, in a session of its own: a job of `world` ranks, `algo`
    and `shape` (ovl-demo's -m/-n/-k arguments; extra: more of its options,
    as --op rs) that runs until something stops it."""
    return subprocess.Popen([DEMO, "-w", str(world)] + shape + list(extra) +
                            ["-a", algo, "-i", "100000", "--job", job], env=d.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_job_going(d, job, ops, world=2):
    """Waits (up to 60 s) until the job has done more than `ops` ops and all
    its `world` ranks are in it; returns the status then."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = status_json(d)
        jobs = [j for j in s["jobs"] if j["id"] == job]
        ranks = [c for c in s["clients"] if c["job"] == job]
        if jobs and jobs[0]["ops_done"] > ops and len(ranks) == world:
            return s
        time.sleep(0.05)
    raise AssertionError("the job never got going:\n" + log_excerpt(d))


def demo_failed_row(out, algo):
    """ovl-demo's result row of algo, which must say FAIL (client/ovl_demo.c:
    "<algo> <ms/op> <GFLOP/s> inf  FAIL: <why>"), and be the only one for
    it, followed by the CHECKS FAILED line; returns <why>."""
    rows = [ln for ln in out.splitlines() if ln.startswith(algo + " ")]
    assert len(rows) == 1, "ovl-demo printed %d %s rows:\n%s" % (len(rows), algo, out)
    m = re.fullmatch(r"%s +\d+\.\d{3} +\d+\.\d{2} +inf  FAIL: (.+)" % re.escape(algo), rows[0])
    assert m, "ovl-demo's %s row is not a failure: %r\n%s" % (algo, rows[0], out)
    assert re.search(r"^CHECKS FAILED \(tolerance ", out, re.M), out
    assert "all checks passed" not in out, out
    return m.group(1)


def wait_no_job(d, timeout=30):
    """Waits until ovld has no job and its devices hold nothing; returns
    the status then."""
    deadline = time.monotonic() + timeout
    while True:
        s = status_json(d)
        held = sum(dev["held_bytes"] for dev in s["devices"])
        if not s["jobs"] and held == 0:
            return s
        assert time.monotonic() < deadline, "job or memory left behind: %r\n%s" % (
            s, log_excerpt(d))
        time.sleep(0.1)


def client_killed_mid_job(d, shape, fresh_shape, ops_before_kill=50, world=2, algo="ring",
                          extra=()):
    """ovl-demo runs a long ring job of `world` ranks and `shape`; once it
    has done ops_before_kill ops, the last rank's process (rank world - 1:
    rank 1 at world 2) is killed (SIGKILL) with ops in flight. ovl-demo must
    report it (exit 1, "rank V sent no result", and stop the other ranks
    itself). ovld must let those ops run out or fail (every failure an
    OVL_ERR_ABORTED, every op counted once), say in its log that rank V left
    (with ops pending: the job aborted; without: it takes no more ops), then
    each other rank, once, and end the job once, after the last of them
    left, after as many ops as its counters say were done; free what it
    held (no job, no held bytes within 30 s), keep its loop turning, serve a
    fresh job of fresh_shape (`world` ranks too) correctly, and stop at once
    on SIGTERM."""
    v = world - 1  # the victim's rank
    demo = long_demo(d, shape, "doomed", world, algo, extra)
    try:
        s = wait_job_going(d, "doomed", ops_before_kill, world)
        victim = [c["pid"] for c in s["clients"] if c["job"] == "doomed" and c["rank"] == v][0]
        os.kill(victim, signal.SIGKILL)
        try:
            out, err = demo.communicate(timeout=60)  # the demo stops its other ranks itself
        except subprocess.TimeoutExpired:
            raise AssertionError("ovl-demo did not end after a rank died:\n" + log_excerpt(d))
        assert demo.returncode == 1, (demo.returncode, out, err)
        # rank v wrote no result; the others', if they wrote one, come first
        # (the row names the last failing rank, and v is the last rank)
        assert demo_failed_row(out, algo) == "rank %d sent no result" % v, out
        assert "ovl-demo: rank %d failed; stopping the others" % v in err.splitlines(), err
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()
    # ovld lets the in-flight ops run out and forgets the job
    wait_no_job(d)
    why = "its client closed the connection"
    msgs = [m for m in log_messages(d) if m.startswith("job 'doomed': ")]
    brief = [m for m in msgs if not re.match(r"job 'doomed': op \d+ ", m)]  # for messages
    leftv = [m for m in msgs if re.match(r"job 'doomed': (aborted: )?rank %d left " % v, m)]
    assert leftv in (["job 'doomed': aborted: rank %d left (%s) with ops pending" % (v, why)],
                     ["job 'doomed': rank %d left (%s); the job takes no more ops" % (v, why)]), \
        brief
    last = msgs.index(leftv[0])
    for q in range(world - 1):  # every other rank, after the victim
        leftq = [m for m in msgs if re.match(r"job 'doomed': (aborted: )?rank %d left " % q, m)]
        assert len(leftq) == 1 and re.fullmatch(
            r"job 'doomed': rank %d left \((its client closed the connection|comm destroyed)\)"
            % q, leftq[0]), brief
        assert msgs.index(leftv[0]) < msgs.index(leftq[0]), brief
        last = max(last, msgs.index(leftq[0]))
    ended = [m for m in msgs if m.startswith("job 'doomed': ended after ")]
    # once the last rank left (ops failed on the side may be logged after)
    assert len(ended) == 1 and msgs.index(ended[0]) > last, brief
    # the counters and the log agree: every op issued was logged so (the
    # executor's failures too), every op done or failed counted once; the
    # job ended (its last rank gone) with the ops done by then, and the ops
    # it had in flight finished on the side
    st = json.loads(d.run([OVLCTL, "stats", "--json"], timeout=30).stdout)["total"]
    issued = len([m for m in msgs if re.match(r"job 'doomed': op \d+ issued \(", m)])
    exec_failed = len([m for m in msgs if re.match(r"job 'doomed': op \d+: ", m)])
    failed_unissued = len([m for m in msgs if re.match(r"job 'doomed': op \d+ failed: ", m)])
    assert st["issue_count"] == issued + exec_failed, (st, issued, exec_failed)
    assert st["ops_done"] + st["ops_failed"] == st["issue_count"] + failed_unissued, (
        st, failed_unissued)
    m = re.fullmatch(r"job 'doomed': ended after (\d+) ops", ended[0])
    assert m and int(m.group(1)) <= st["ops_done"], (ended, st["ops_done"])
    # every failure is the abort: an op that failed, or one refused after it
    errors = {e["status"]: e["count"] for e in st["errors"]}
    assert set(errors) <= {-17}, st["errors"]
    assert st["ops_failed"] <= errors.get(-17, 0), st
    # and serves a fresh job correctly
    p = d.run([DEMO, "-w", str(world)] + fresh_shape + list(extra) + ["-i", "3", "--job", "after"],
              timeout=120)
    assert "all checks passed" in p.stdout, p.stdout
    # ovld's loop never stopped turning (daemon/util/stall.c reports it)
    assert "event loop has not turned" not in d.log_text(), log_excerpt(d)
    t0 = time.monotonic()
    assert d.stop() == 0
    assert time.monotonic() - t0 < 10, "SIGTERM took %.1f s" % (time.monotonic() - t0)


def daemon_killed_mid_job(d, shape, ops_before_kill=50, world=2):
    """ovl-demo runs a long ring job of `world` ranks and `shape`; once it
    has done ops_before_kill ops, ovld is killed (SIGKILL) with ops in
    flight. No op will ever be done: libovl must release its own waits (on
    a GPU, the ones its streams hold) and fail, so that ovl-demo ends,
    within 30 s and exit status 1, its ring row failed with one of libovl's
    words for a connection to ovld that closed, rather than wait for ever."""
    demo = long_demo(d, shape, "orphaned", world)
    try:
        wait_job_going(d, "orphaned", ops_before_kill, world)
        pid = d.proc.pid
        d.proc.kill()
        d.proc.wait()
        t0 = time.monotonic()
        try:
            out, err = demo.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("ovl-demo still runs 30 s after ovld died")
        assert demo.returncode == 1, (demo.returncode, out, err)
        why = demo_failed_row(out, "ring")
        # client/libovl.c: broken() on a closed connection, or lose_daemon's
        # message (through ovl_comm_check) once the watcher gave ovld up
        gone = (r"ovld closed the connection \((sending to ovld|receiving from ovld|"
                r"waiting for ops)\)|op \d+: ovld \(pid %d\) went away: its connection closed"
                r"( and it exited| \(whether it exited cannot be seen from here\)); ops not "
                r"done by then were not computed, and the waits on them were released" % pid)
        assert re.fullmatch(gone, why), (why, out, err)
        return time.monotonic() - t0
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.communicate()


def frame(body: bytes) -> bytes:
    return b"OVL1" + len(body).to_bytes(4, "little") + body


# Protobuf by hand (proto/ovl.proto's fields by number), for requests no
# well-behaved client sends: the tests of hostile input and the fuzz seeds.

def varint(n):
    """A varint; a negative value as protobuf writes an int32/int64 (10 bytes)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3 | 0) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def can_connect(path):
    """Whether something accepts connections on the Unix socket path."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


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
