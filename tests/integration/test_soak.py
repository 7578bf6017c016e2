"""A bounded soak of a real ovld (host backend): for SOAK_SECONDS (default
60) client processes keep coming and going, a seeded random subset of them
killed with SIGKILL at random moments (before or while joining, while
registering, with ops in flight); afterwards ovld must be back where it was
before the soak.

Clients are ovl-demo runs (client/ovl_demo.c): a parent that forks W rank
processes, each its own connection, which join one job, register 3 buffers
(4 with --a-out), and run (iters + 1) ops per algorithm (3 algorithms with
-a all). Worlds 1..4, every algorithm (auto and all too), every dtype,
small shapes, sometimes --a-out, --transb, --chunks, --streams. At most
MAX_PROCS demo processes (parents and ranks) live at once. A doomed run is
killed either whole (SIGKILL to its process group) or one rank only
(SIGKILL to that rank; ovl-demo then stops the other ranks with SIGTERM).
Between runs the test also opens raw connections that close at once or in
the middle of a frame, and asks `ovlctl status` whether ovld still answers.

Before the soak, after a warm-up that runs every algorithm and dtype on
devices 0..3 (so that ovld's lazily made threads, pipes and ASan's
quarantine exist already), the baseline: ovld's open fds (/proc/PID/fd),
how many are memfds, its VmRSS, `ovlctl stats --json` and `ovlctl status
--json`. After the soak, once ovld is idle again (polled, at most
IDLE_WAIT_S), it must hold:

- ovld alive, answering; no job, no client but the asking ovlctl (with no
  buffers), status's connections 1, every device's held_bytes as before;
- its fd count and memfd count exactly as before: at idle ovld's fds are a
  fixed set (log, listening socket, epoll, eventfd, pipes, pidfd), so any
  difference is a leak (or a fd closed twice), not noise;
- the heap: `ovlctl stats`' heap_bytes (what ovld's allocator holds for
  live allocations: ASan's count under ASan, glibc's mallinfo2 without,
  with glibc's per-thread caches turned off here by GLIBC_TUNABLES, since
  it counts what they keep as in use and new executor threads come with
  new caches) at most HEAP_SLACK (256 KiB) above the baseline. Unlike RSS
  it does not keep the allocator's high-water mark, which moves with how
  many jobs ran at once and made an RSS bound flaky (a bound of 24 MiB on
  RSS growth after the soak's first half failed once on an unchanged
  tree). The 60 s soak runs some 13000 to 50000 ops and 430 to 920
  connections: a leak of 32 bytes per op, or of 1 KiB per connection,
  exceeds it;
- what is not malloc'd: ovld's memfd mappings (/proc/PID/maps: client
  buffers and doorbell pages, its only mmaps) exactly as before, like the
  fds; its threads (/proc/PID/status) at most MAX_PROCS more than before:
  the executor's pool (daemon/issue/exec.c) keeps the threads it made, one per
  rank issued at once, and no more ranks than MAX_PROCS live at once,
  while a rank's stream threads that outlived it would add up over the
  soak's hundreds of ranks;
- VmRSS at most RSS_GROWTH_MAX (128 MiB) above the baseline. Under ASan
  freed memory waits in a quarantine (256 MiB by default) before reuse,
  which alone grows RSS by some 400 MiB over a few thousand ops; this test
  caps the quarantine at 16 MiB (ASAN_OPTIONS, for ovld and the clients),
  and the warm-up fills it. What remains is the high-water mark of the
  allocator's size-class regions, which ASan never gives back, with up to
  8 processes' jobs at once (seen on a 2-core machine: 27 to 72 MiB over
  60 s; the summary prints the peak by quarter of the soak);
- the counters consistent (stats' since-start block, deltas over the soak):
  sum(ops by algo/dtype) = ops_done = latency_count; ops done + ops failed
  = ops issued (issue_count) + ops failed before they were issued (ovld's
  "op N failed:" log lines), and issue_count lies between ops_done and
  ops_done + ops_failed; ops_done and registrations between what the runs
  that finished did and that plus what the killed runs could have done;
  connections accepted = the "connected" lines of ovld's log = its
  "closed" lines (every connection seen was closed), and lies between the
  connections the test knows of (its ovlctl runs, its raw connections, the
  ranks of runs that finished) and that plus the ranks of killed runs; no
  connection refused; every rank that joined left, every job ended;
- every run not killed passed its checks; no ASan/UBSan report, no stall
  report in ovld's log; ovld stops on SIGTERM with status 0 (under ASan
  its leak check at exit runs then).

It prints one summary line with the figures. SOAK_SECONDS and SOAK_SEED
override the length and the seed; the choices (shapes, algorithms, which
runs die, how and when) come from random.Random(SOAK_SEED), the moments
they land on from the machine's timing."""
import json
import os
import random
import re
import signal
import socket
import subprocess
import time

from ovltest import DEMO, OVLCTL, Daemon, log_excerpt, run_tests

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "60"))
SEED = int(os.environ.get("SOAK_SEED", "20261124"))
MAX_PROCS = 8            # demo processes (parents and ranks) alive at once
MAX_LAUNCHES = 5000      # a bound on runs, whatever the machine's speed
DOOM_P = 0.4             # the share of runs that are killed
DEMO_TIMEOUT_S = 30      # a run still alive this long after its start is a hang
DRAIN_S = 30             # after the soak, for the runs still going to end
IDLE_WAIT_S = 20         # for ovld to be idle again
RSS_GROWTH_MAX = 128 << 20
HEAP_SLACK = 256 << 10
HOST_DEVICES = 4
ALGOS = ("naive", "collective", "ring", "auto", "all")
DTYPES = ("fp32", "bf16", "fp16")
SHAPES = (8, 16, 24, 32, 40, 64)

# ASan's quarantine capped (see the docstring); a no-op without ASan.
os.environ["ASAN_OPTIONS"] = ":".join(
    x for x in (os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=16",
                "thread_local_quarantine_size_kb=256") if x)
# glibc's per-thread caches off, for heap_bytes (see the docstring); a
# no-op under ASan, whose allocator replaces glibc's.
os.environ["GLIBC_TUNABLES"] = ":".join(
    x for x in (os.environ.get("GLIBC_TUNABLES", ""), "glibc.malloc.tcache_count=0") if x)


# ------------------------------------------------------------------ /proc

def fd_counts(pid):
    """(open fds, memfds among them) of process pid."""
    fds = memfds = 0
    base = "/proc/%d/fd" % pid
    for name in os.listdir(base):
        try:
            target = os.readlink(os.path.join(base, name))
        except FileNotFoundError:  # closed meanwhile
            continue
        fds += 1
        memfds += target.startswith("/memfd:")
    return fds, memfds


def proc_status(pid, key):
    """A number of /proc/PID/status (kB figures in bytes)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                v = line.split()
                return int(v[1]) * (1024 if v[2:] == ["kB"] else 1)
    raise AssertionError("no %s for pid %d" % (key, pid))


def rss_bytes(pid):
    return proc_status(pid, "VmRSS")


def memfd_maps(pid):
    """How many of process pid's mappings are of memfds."""
    with open("/proc/%d/maps" % pid) as f:
        return sum(" /memfd:" in line for line in f)


def has_asan(pid):
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


def children_of(ppid):
    """The pids whose parent is ppid (ovl-demo's rank processes)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                st = f.read()
        except OSError:
            continue
        fields = st.rpartition(")")[2].split()  # state ppid ...; comm may hold spaces
        if len(fields) > 1 and int(fields[1]) == ppid and fields[0] not in "ZX":
            out.append(int(name))
    return out


# ------------------------------------------------------------------ ovlctl

class Ctl:
    """ovlctl against the daemon, counting its runs (each is a connection)."""

    def __init__(self, d):
        self.d = d
        self.calls = 0

    def json(self, *args):
        self.calls += 1
        try:
            p = subprocess.run([OVLCTL, *args, "--json"], env=self.d.env(), capture_output=True,
                               text=True, timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("ovlctl %s: ovld does not answer within 30 s; its log ends:\n%s"
                                 % (" ".join(args), log_excerpt(self.d)))
        if p.returncode != 0:
            raise AssertionError("ovlctl %s exited %d: %s\novld log:\n%s" % (
                " ".join(args), p.returncode, p.stderr, log_excerpt(self.d)))
        return json.loads(p.stdout)


# ------------------------------------------------------------------ ovld's log

RE_CONNECTED = re.compile(r" debug: client \d+: connected \(pid ")
RE_CLOSED = re.compile(r" debug: client \d+ \(pid -?\d+\): closed: ")
RE_JOINED = re.compile(r"job '([^']*)': rank \d+/\d+ joined on device")
RE_LEFT = re.compile(r"job '([^']*)': (?:aborted: )?rank \d+ left \(")
RE_ENDED = re.compile(r"job '([^']*)': ended after \d+ ops")
RE_ISSUED = re.compile(r"job '([^']*)': op \d+ issued \(")
RE_FAILED_UNISSUED = re.compile(r"job '([^']*)': op \d+ failed: ")
SANITIZER = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
             "event loop has not turned")


def log_facts(d):
    text = d.log_text()
    per_job = {}

    def job(j):
        return per_job.setdefault(j, dict(joined=0, left=0, ended=0, issued=0, failed=0))

    for rx, key in ((RE_JOINED, "joined"), (RE_LEFT, "left"), (RE_ENDED, "ended"),
                    (RE_ISSUED, "issued"), (RE_FAILED_UNISSUED, "failed")):
        for mt in rx.finditer(text):
            job(mt.group(1))[key] += 1
    return dict(connected=len(RE_CONNECTED.findall(text)), closed=len(RE_CLOSED.findall(text)),
                jobs=per_job, text=text)


class LogTail:
    """ovld's log as it grows: the joins and first ops of the soak's jobs,
    which some kills wait for, and the pids that connected."""
    RX = re.compile(r"job 'soak-(\d+)': (?:rank \d+/\d+ (joined) on device|op \d+ (issued) \()")
    RX_PID = re.compile(r" debug: client \d+: connected \(pid (\d+),")

    def __init__(self, d):
        self.f = open(d.log_path, "rb")
        self.f.seek(0, os.SEEK_END)
        self.rest = b""
        self.pids = set()

    def events(self):
        data = self.rest + self.f.read()
        lines = data.split(b"\n")
        self.rest = lines.pop()
        out = []
        for ln in lines:
            ln = ln.decode(errors="replace")
            mt = self.RX.search(ln)
            if mt:
                out.append((int(mt.group(1)), mt.group(2) or mt.group(3)))
            mt = self.RX_PID.search(ln)
            if mt:
                self.pids.add(int(mt.group(1)))
        return out

    def close(self):
        self.f.close()


def quiet_fds(d, timeout=5.0):
    """ovld's (fds, memfds) once every connection it logged as made is
    logged as closed (so that no ovlctl's socket is counted)."""
    deadline = time.monotonic() + timeout
    while True:
        f = log_facts(d)
        fds = fd_counts(d.proc.pid)
        if f["connected"] == f["closed"] == log_facts(d)["connected"]:
            return fds, f
        assert time.monotonic() < deadline, "connections logged %d, closed %d" % (
            f["connected"], f["closed"])
        time.sleep(0.05)


# ------------------------------------------------------------------ clients

class Run:
    """One ovl-demo run, in a process group of its own."""

    def __init__(self, seq, rng):
        self.seq = seq
        self.job = "soak-%d" % seq
        self.world = rng.randint(1, 4)
        self.algo = rng.choice(ALGOS)
        self.dtype = rng.choice(DTYPES)
        self.m, self.n, self.k = (rng.choice(SHAPES) for _ in range(3))
        self.a_out = rng.random() < 0.2
        self.transb = rng.random() < 0.2
        self.chunks = rng.choice((0, 0, 1, 2, 3, 4, 8))
        self.streams = rng.choice((0, 0, 1, 2, 4))
        self.doomed = rng.random() < DOOM_P
        self.iters = rng.randint(1, 40)
        if self.doomed:
            self.kill_how = rng.choice(("group", "rank"))
            self.kill_rank = rng.randrange(self.world)
            # when: a moment after its start (connecting, joining); once n
            # of its ranks joined (n < world: mid-join; n = world: while
            # registering, before its first op); or a moment after its
            # first op was issued (ops in flight), with ops enough to last
            self.kill_when = rng.choice(("start", "join", "join", "ops", "ops", "ops"))
            self.kill_delay = {"start": lambda: rng.uniform(0.0, 0.3),
                               "join": lambda: rng.uniform(0.0, 0.01),
                               "ops": lambda: rng.uniform(0.0, 1.0)}[self.kill_when]()
            self.kill_joined = rng.randint(1, self.world)
            if self.kill_when == "ops":
                self.iters = rng.randint(2000, 4000)
            else:
                self.iters = rng.randint(20, 300)
        self.kill_at = None  # the moment to kill it, once known
        self.joined = 0      # its ranks ovld's log says joined
        self.issued = False  # whether ovld's log says an op of it was issued
        self.seed = rng.randrange(1 << 30)
        self.proc = None
        self.t0 = None
        self.killed_as = None  # how it was killed, once it was
        self.rc = None
        self.out = ""

    def nprocs(self):
        return self.world + 1

    def nops(self):
        return (3 if self.algo == "all" else 1) * (self.iters + 1)

    def nregs(self):
        return self.world * (4 if self.a_out else 3)

    def argv(self):
        a = [DEMO, "-w", str(self.world), "-a", self.algo, "-d", self.dtype, "-i", str(self.iters),
             "-m", str(self.m), "-n", str(self.n), "-k", str(self.k), "--seed", str(self.seed),
             "--job", self.job]
        if self.a_out:
            a.append("--a-out")
        if self.transb:
            a.append("--transb")
        if self.chunks:
            a += ["--chunks", str(self.chunks)]
        if self.streams:
            a += ["--streams", str(self.streams)]
        return a

    def start(self, d):
        self.out_path = os.path.join(d.dir, "%s.out" % self.job)
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(self.argv(), env=d.env(), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.t0 = time.monotonic()
        if self.doomed and self.kill_when == "start":
            self.kill_at = self.t0 + self.kill_delay

    def on_log(self, event, now):
        """ovld's log says a rank of it joined, or an op of it was issued."""
        if event == "joined":
            self.joined += 1
            if (self.doomed and self.kill_when == "join" and self.kill_at is None and
                    self.joined >= self.kill_joined):
                self.kill_at = now + self.kill_delay
        elif not self.issued:
            self.issued = True
            if self.doomed and self.kill_when == "ops" and self.kill_at is None:
                self.kill_at = now + self.kill_delay

    def kill(self, connected):
        """SIGKILL, as chosen: the whole run, or one rank (the whole run if
        none of its ranks has connected yet). A rank is a child of ovl-demo
        that ovld saw connect (the pids in `connected`): not every child is
        one, LeakSanitizer's exit check clones a tracer, and a tracer
        killed leaves its process spinning for ever."""
        how = self.kill_how
        if how == "rank":
            kids = sorted(set(children_of(self.proc.pid)) & connected)
            if kids:
                os.kill(kids[self.kill_rank % len(kids)], signal.SIGKILL)
            else:
                how = "group"
        if how == "group":
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.killed_as = how
        # where it was, as far as ovld's log (read just before) tells
        self.phase = ("before-join" if not self.joined else
                      "mid-join" if self.joined < self.world else
                      "before-ops" if not self.issued else "mid-op")

    def reap(self):
        # its ranks are gone too: ovl-demo waits for them before it exits,
        # and a group killed dies whole
        self.rc = self.proc.wait()
        with open(self.out_path) as f:
            self.out = f.read()
        os.unlink(self.out_path)

    def died_of_kill(self):
        """Whether the kill changed its outcome (it may have come too late)."""
        return self.killed_as is not None and self.rc != 0

    def describe(self):
        return "%s (%s)" % (" ".join(self.argv()), "killed: %s at %s" % (
            self.killed_as, self.kill_when) if self.killed_as else "not killed")


def raw_connection(d, rng):
    """A connection that never says hello: closed at once, or in the middle
    of a frame's header, or of a frame's body."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(d.socket)
        how = rng.choice(("close", "half-header", "half-body"))
        if how == "half-header":
            s.sendall(b"OVL1\x10")
        elif how == "half-body":
            s.sendall(b"OVL1" + (64).to_bytes(4, "little") + b"\x08\x01\x12")
    finally:
        s.close()


# ------------------------------------------------------------------ the test

def warm_up(d):
    """Every algorithm and dtype, devices 0..3, some 1100 ops (which fill
    ASan's capped quarantine)."""
    for argv in (["-w", "4", "-a", "all", "-d", "bf16", "-i", "300"],
                 ["-w", "4", "-a", "all", "-d", "fp16", "-i", "30", "--a-out"],
                 ["-w", "3", "-a", "all", "-d", "fp32", "-i", "30", "--transb"],
                 ["-w", "1", "-a", "auto", "-d", "fp32", "-i", "5"]):
        p = d.run([DEMO, "-m", "32", "-n", "32", "-k", "32", "--seed", "1", "--job",
                   "warm-up"] + argv, timeout=120)
        assert "all checks passed" in p.stdout, p.stdout


def wait_idle(d, ctl, base_status, base_fds, deadline_s):
    """Polls until ovld has no job, no client but the asking ovlctl, its
    devices hold what they held, and its fds are back to base_fds (or the
    deadline); returns (status, (fds, memfds), seconds, what it waited for)."""
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    base_held = [x["held_bytes"] for x in base_status["devices"]]
    waited = set()
    while True:
        s = ctl.json("status")
        fds, _ = quiet_fds(d)
        if s["jobs"]:
            waited.add("jobs")
        if len(s["clients"]) != 1:
            waited.add("clients")
        if [x["held_bytes"] for x in s["devices"]] != base_held:
            waited.add("held_bytes")
        if fds != base_fds:
            waited.add("fds")
        idle = (not s["jobs"] and len(s["clients"]) == 1 and fds == base_fds and
                [x["held_bytes"] for x in s["devices"]] == base_held)
        if idle or time.monotonic() > deadline:
            return s, fds, time.monotonic() - t0, sorted(waited)
        time.sleep(0.1)


def test_soak():
    t_start = time.monotonic()
    d = Daemon(config="host_devices = %d\n" % HOST_DEVICES)
    runs, live = [], []
    poke = None
    try:
        pid = d.proc.pid
        ctl = Ctl(d)
        warm_up(d)
        base_status = ctl.json("status")
        (base_fd, base_memfd), _ = quiet_fds(d)
        base_rss = rss_bytes(pid)
        base_threads, base_maps = proc_status(pid, "Threads"), memfd_maps(pid)
        base_stats = ctl.json("stats")
        ctl.calls = 0  # from here on: the connections the soak adds
        assert not base_status["jobs"] and len(base_status["clients"]) == 1, base_status
        asan = has_asan(pid)

        rng = random.Random(SEED)
        nxt = Run(0, rng)
        raws = 0
        peak_fd, peak_memfd, peak_rss = base_fd, base_memfd, base_rss
        tail = LogTail(d)
        rss_seen = []  # (seconds into the soak, VmRSS)
        poke = None  # an `ovlctl status` under way: ovld must keep answering
        t_soak = time.monotonic()
        soak_end = t_soak + SOAK_SECONDS
        next_sample = next_poke = t_soak
        while True:
            now = time.monotonic()
            for seq, event in tail.events():
                if seq < len(runs):
                    runs[seq].on_log(event, now)
            for r in list(live):
                if r.proc.poll() is not None:
                    r.reap()
                    live.remove(r)
                    if not r.died_of_kill() and r.rc != 0:
                        raise AssertionError("a run that was not killed failed (%d): %s\n%s\n"
                                             "ovld log:\n%s" % (r.rc, r.describe(), r.out,
                                                                log_excerpt(d)))
                elif r.killed_as is None and r.kill_at is not None and now >= r.kill_at:
                    r.kill(tail.pids)
                elif now > r.t0 + DEMO_TIMEOUT_S:
                    raise AssertionError("a run has not ended after %d s: %s\novld log:\n%s" % (
                        DEMO_TIMEOUT_S, r.describe(), log_excerpt(d)))
            soaking = now < soak_end and len(runs) < MAX_LAUNCHES
            while soaking and sum(r.nprocs() for r in live) + nxt.nprocs() <= MAX_PROCS:
                nxt.start(d)
                runs.append(nxt)
                live.append(nxt)
                nxt = Run(len(runs), rng)
            if poke is not None and poke.poll() is not None:
                out, err = poke.communicate()
                assert poke.returncode == 0, "ovlctl status during the soak: %s\n%s" % (
                    err, log_excerpt(d))
                json.loads(out)
                poke = None
            elif poke is not None and now > poke_t0 + 30:
                poke.kill()
                poke.communicate()
                raise AssertionError("ovld did not answer ovlctl status within 30 s:\n" +
                                     log_excerpt(d))
            if not soaking and not live and poke is None:
                break
            assert now < soak_end + DRAIN_S, "runs still alive %d s after the soak: %s" % (
                DRAIN_S, [r.describe() for r in live])
            if d.proc.poll() is not None:
                raise AssertionError("ovld died (%d) during the soak:\n%s" % (
                    d.proc.returncode, log_excerpt(d)))
            if now >= next_sample:  # peaks, to show that there was something to leak
                next_sample = now + 0.25
                fd, memfd = fd_counts(pid)
                peak_fd, peak_memfd = max(peak_fd, fd), max(peak_memfd, memfd)
                rss_now = rss_bytes(pid)
                peak_rss = max(peak_rss, rss_now)
                rss_seen.append((now - t_soak, rss_now))
            if soaking and now >= next_poke:  # half-made connections; does ovld answer?
                next_poke = now + 1.0
                for _ in range(rng.randint(1, 3)):
                    raw_connection(d, rng)
                    raws += 1
                if poke is None:
                    ctl.calls += 1
                    poke_t0 = now
                    poke = subprocess.Popen([OVLCTL, "status", "--json"], env=d.env(),
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True)
            time.sleep(0.005)
        tail.close()
        soak_s = time.monotonic() - t_soak

        st, (fd, memfd), idle_s, waited = wait_idle(d, ctl, base_status, (base_fd, base_memfd),
                                                    IDLE_WAIT_S)
        rss = rss_bytes(pid)
        threads, maps = proc_status(pid, "Threads"), memfd_maps(pid)
        stats = ctl.json("stats")
        facts = log_facts(d)  # the stats call's connection, now closed too

        # ---- figures
        done_runs = [r for r in runs if not r.died_of_kill()]
        killed = [r for r in runs if r.died_of_kill()]
        late = [r for r in runs if r.killed_as and not r.died_of_kill()]
        phases = {"before-join": 0, "mid-join": 0, "before-ops": 0, "mid-op": 0}
        for r in killed:
            phases[r.phase] += 1
        t, b = stats["total"], base_stats["total"]
        quarters = [max([x for ts, x in rss_seen if ts <= q * soak_s / 4] or [base_rss])
                    for q in (1, 2, 3, 4)]

        def delta(key):
            return t[key] - b[key]

        errs = {e["status"]: e["count"] for e in t["errors"]}
        berrs = {e["status"]: e["count"] for e in b["errors"]}
        derrs = {s: c - berrs.get(s, 0) for s, c in errs.items() if c != berrs.get(s, 0)}
        soak_jobs = {j: x for j, x in facts["jobs"].items() if j.startswith("soak-")}
        failed_unissued = sum(x["failed"] for x in facts["jobs"].values())
        print("soak: %.1f s (seed %d, %s): clients started %d (%d ranks), killed %d "
              "(group %d, one rank %d; %s), kill too late %d, finished %d; raw connections %d, "
              "ovlctl %d; ops done %d failed %d issued %d (errors %s); connections %d; "
              "fds %d -> %d (peak %d), memfds %d -> %d (peak %d), memfd maps %d -> %d, "
              "threads %d -> %d, heap %.1f -> %.1f KiB (%+.1f), RSS %.1f -> %.1f MiB "
              "(%+.1f, peak %.1f; peak by quarter of the soak %s); idle after %.1f s (waited "
              "for %s); total %.1f s" % (
                  soak_s, SEED, "ASan" if asan else "no ASan", len(runs),
                  sum(r.world for r in runs), len(killed),
                  sum(r.killed_as == "group" for r in killed),
                  sum(r.killed_as == "rank" for r in killed),
                  ", ".join("%s %d" % kv for kv in phases.items()), len(late), len(done_runs),
                  raws, ctl.calls, delta("ops_done"), delta("ops_failed"), delta("issue_count"),
                  derrs, delta("connections_accepted"), base_fd, fd, peak_fd, base_memfd, memfd,
                  peak_memfd, base_maps, maps, base_threads, threads,
                  base_stats["heap_bytes"] / 2**10, stats["heap_bytes"] / 2**10,
                  (stats["heap_bytes"] - base_stats["heap_bytes"]) / 2**10, base_rss / 2**20, rss / 2**20, (rss - base_rss) / 2**20,
                  peak_rss / 2**20, "/".join("%.1f" % (x / 2**20) for x in quarters), idle_s,
                  ", ".join(waited) or "nothing",
                  time.monotonic() - t_start), flush=True)

        # ---- ovld alive and idle
        assert d.proc.poll() is None, "ovld died:\n" + log_excerpt(d)
        assert not st["jobs"], "jobs left after %.0f s: %r\n%s" % (idle_s, st["jobs"],
                                                                   log_excerpt(d))
        assert len(st["clients"]) == 1, "clients left: %r" % st["clients"]
        c = st["clients"][0]
        assert (c["name"], c["job"], c["buffers"], c["mapped_bytes"]) == ("ovlctl", "", 0, 0), c
        assert st["connections"] == 1 == base_status["connections"], st["connections"]
        assert ([x["held_bytes"] for x in st["devices"]] ==
                [x["held_bytes"] for x in base_status["devices"]]), st["devices"]
        # ---- nothing leaked
        assert fd == base_fd, "ovld holds %d fds, %d before the soak" % (fd, base_fd)
        assert memfd == base_memfd, "ovld holds %d memfds, %d before" % (memfd, base_memfd)
        assert maps == base_maps, "ovld maps %d memfds, %d before" % (maps, base_maps)
        assert threads <= base_threads + MAX_PROCS, "ovld has %d threads, %d before" % (
            threads, base_threads)
        assert stats["heap_bytes"] - base_stats["heap_bytes"] <= HEAP_SLACK, (
            "ovld's heap grew by %.1f KiB over the soak (%d -> %d bytes), and it is idle" % (
                (stats["heap_bytes"] - base_stats["heap_bytes"]) / 2**10,
                base_stats["heap_bytes"], stats["heap_bytes"]))
        assert rss - base_rss <= RSS_GROWTH_MAX, "RSS grew by %.1f MiB" % (
            (rss - base_rss) / 2**20)
        # ---- the runs
        assert killed, "no run was killed"
        if SOAK_SECONDS >= 30:
            assert phases["mid-op"] > 0, "no run was killed with ops in flight: %r" % phases
        # ---- counters
        for blk in (t, stats["since_reset"]):
            assert (sum(o["count"] for o in blk["ops"]) == blk["ops_done"] ==
                    blk["latency_count"]), blk
        assert t["registry_hits"] + t["registry_misses"] == t["registrations"], t
        ops_min = sum(r.nops() for r in done_runs)
        ops_max = ops_min + sum(r.nops() for r in killed)
        assert ops_min <= delta("ops_done") <= ops_max, (delta("ops_done"), ops_min, ops_max)
        assert (delta("ops_done") <= delta("issue_count") <=
                delta("ops_done") + delta("ops_failed")), (
            delta("ops_done"), delta("issue_count"), delta("ops_failed"))
        assert delta("ops_failed") <= sum(derrs.values()), (delta("ops_failed"), derrs)
        regs_min = sum(r.nregs() for r in done_runs)
        regs_max = regs_min + sum(r.nregs() for r in killed)
        assert regs_min <= delta("registrations") <= regs_max, (delta("registrations"), regs_min,
                                                               regs_max)
        known = ctl.calls + raws + sum(r.world for r in done_runs)
        assert known <= delta("connections_accepted") <= known + sum(r.world for r in killed), (
            delta("connections_accepted"), known, sum(r.world for r in killed))
        assert delta("connections_refused") == 0, t
        # ---- what ovld's log saw: every connection closed, every rank left,
        # every job ended, every op counted once
        assert facts["connected"] == t["connections_accepted"] == facts["closed"], (
            facts["connected"], t["connections_accepted"], facts["closed"])
        for j, x in soak_jobs.items():
            # a job id may serve twice: a rank that joins after the job
            # ended (its peers gone) starts a new job of the same id
            assert x["joined"] == x["left"] and (
                1 <= x["ended"] <= x["joined"] if x["joined"] else x["ended"] == 0), (
                "job %s: %r; its log lines:\n%s" % (j, x, "\n".join(
                    ln for ln in facts["text"].splitlines() if "'%s'" % j in ln)))
        assert t["ops_done"] + t["ops_failed"] == t["issue_count"] + failed_unissued, (
            "ops done %d + failed %d != issued %d + failed before issue %d" % (
                t["ops_done"], t["ops_failed"], t["issue_count"], failed_unissued))
        for bad in SANITIZER:
            assert bad not in facts["text"], log_excerpt(d)
        assert d.stop() == 0, "ovld's exit status at SIGTERM:\n" + log_excerpt(d)
        assert not any(bad in d.log_text() for bad in SANITIZER), log_excerpt(d)
    finally:
        if poke is not None and poke.poll() is None:
            poke.kill()
            poke.wait()
        for r in live:  # whatever a failure left running
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.proc.wait()
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_soak])
