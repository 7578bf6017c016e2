"""AG-GEMM end to end on the host backend: real client processes (ovl-demo)
through a real ovld, every algorithm, worlds 1, 2, 3, 4 and 8, shapes with
m not divisible by the chunks, k and n not multiples of 8, transb, a_out
wanted or not, each dtype; results checked against a double-precision
reference by the clients; default_chunks, default_streams and auto as
ovld resolves them; the daemon's allgather settings; ops of several Bs
(--more-n), each C checked, and too many Bs refused.

Two jobs at once on one daemon, sharing devices, are test_load.c's
test_two_jobs_interleaved (results checked exactly) and, as ovl-demo
processes of every dtype, test_soak.py's; ranks of one job sharing a
device, every algorithm with exact results, test_join.c's
test_join_same_device_shared; a join refused by max_ranks_per_uid with
its exact counters, test_stats.py's test_stats_under_load. An ovl-demo killed (SIGKILL, its
process alone) takes its ranks with it, in --idle and running ops
(test_demo_idle, test_demo_parent_killed)."""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

from ovltest import (DEMO, OVLCTL, Daemon, log_excerpt, log_messages, long_demo, run_tests,
                     status_json, wait_job_going, wait_no_job)

WORLDS = [1, 2, 3, 4, 8]
# (m, n, k, extra args): every world runs every variant, in every dtype
VARIANTS = [
    (10, 13, 17, ["--chunks", "4"]),                          # m not divisible by the chunks
    (9, 11, 6, ["--transb", "--a-out", "--chunks", "4"]),     # B as N x K, gathered A wanted
    (33, 31, 29, ["--chunks", "3", "--streams", "3"]),        # k, n not multiples of 8
    (16, 8, 24, ["--a-out"]),
]
DTYPES = ["bf16", "fp16", "fp32"]


def demo(d, world, m, n, k, dtype, extra, job, iters=2):
    cmd = [DEMO, "-w", str(world), "-m", str(m), "-n", str(n), "-k", str(k), "-d", dtype,
           "-i", str(iters), "--seed", str(world * 1000 + m), "--job", job, *extra]
    return d.run(cmd)


def test_matrix():
    d = Daemon()
    try:
        for world in WORLDS:
            for vi, (m, n, k, extra) in enumerate(VARIANTS):
                for dt in DTYPES:
                    p = demo(d, world, m, n, k, dt, extra, "m-%d-%d-%s" % (world, vi, dt))
                    out = p.stdout
                    for algo in ("naive", "collective", "ring"):
                        row = [l for l in out.splitlines() if l.startswith(algo + " ")]
                        assert len(row) == 1 and row[0].rstrip().endswith("OK"), out
                    assert "all checks passed" in out, out
        assert d.stop() == 0
    finally:
        d.cleanup()


SHAPE = ["--world", "2", "--rank", "0", "-m", "96", "-n", "32", "-k", "48"]


def test_auto_and_defaults():
    """default_chunks and default_streams from the file, and auto by the rule
    (tune_samples = 0): the plan
    ovld resolves (ovlctl plan --daemon) is the offline plan with those
    chunks and streams, every op of the demo's job is issued with that
    plan's algorithm, and every result passes its checks."""
    # measuring off: auto chooses by the rule alone (test_autotune.py measures)
    d = Daemon(config="default_chunks = 3\ndefault_streams = 2\ntune_samples = 0\n")
    try:
        ran = {}
        for algo in ("auto", "ring", "collective"):
            plan = d.run([OVLCTL, "plan", "--daemon", "--algo", algo, *SHAPE]).stdout
            offline = subprocess.run([OVLCTL, "plan", "--algo", algo, "--chunks", "3",
                                      "--streams", "2", *SHAPE], capture_output=True, text=True,
                                     timeout=60)
            assert offline.returncode == 0 and plan == offline.stdout, (plan, offline)
            resolved = re.match(r"plan format=5 kind=ag_gemm algo=(\w+) ",
                                plan).group(1)
            assert resolved != "auto", plan
            job = "defaults-" + algo
            p = d.run([DEMO, "-w", "2", "-m", "96", "-n", "32", "-k", "48", "-a", algo, "-i", "3",
                       "--job", job])
            rows = [ln for ln in p.stdout.splitlines() if ln.startswith(algo + " ")]
            assert len(rows) == 1 and rows[0].endswith("  OK"), p.stdout
            assert "all checks passed" in p.stdout, p.stdout
            ops = [m for m in log_messages(d) if re.match(r"job '%s': op \d+ " % job, m)]
            want = "job '%s': op %d issued (ag_gemm %s, m=96 n=32 k=48)"
            assert ops == [want % (job, i, resolved) for i in range(1, 5)], ops
            ran[resolved] = ran.get(resolved, 0) + 4
        st = json.loads(d.run([OVLCTL, "stats", "--json"]).stdout)["total"]
        assert {(o["kind"], o["algo"], o["dtype"]): o["count"] for o in st["ops"]} == {
            ("ag_gemm", a, "bf16"): n for a, n in ran.items()}, st["ops"]
        assert st["ops_failed"] == 0 and st["errors"] == [], st
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_allgather_settings():
    """The daemon's allgather setting: copy gathers by pulls ordered by events
    (naive and collective plans without ALLGATHER), nccl gathers by the host
    collective even for one rank; results as with auto."""
    for setting in ("copy", "nccl"):
        d = Daemon(config="allgather = %s\n" % setting)
        try:
            for world in (1, 3):
                for m, n, k, extra in (VARIANTS[0], VARIANTS[1]):
                    p = demo(d, world, m, n, k, "fp32", extra, "ag-%s-%d-%d" % (setting, world, m))
                    assert "all checks passed" in p.stdout, p.stdout
            assert d.stop() == 0
        finally:
            d.cleanup()


def test_several_bs():
    """Every op with 3 Bs of different n (--more-n): every algorithm (and
    auto), worlds 1 to 3, with and without transb and a_out, each dtype;
    the table has a row per C under each algorithm's, each checked against
    its own double-precision reference. Too many Bs, or an n of 0, are
    refused before any rank starts (exit 2, one line saying the limit)."""
    d = Daemon()
    try:
        for world in (1, 2, 3):
            for vi, (m, n, k, extra) in enumerate(VARIANTS[:3]):
                for dt in DTYPES:
                    more = [5, 40] if vi % 2 == 0 else [n + 7, 1]
                    p = demo(d, world, m, n, k, dt, ["--more-n", ",".join(map(str, more)), *extra],
                             "bs-%d-%d-%s" % (world, vi, dt))
                    out = p.stdout
                    ns = [n] + more
                    assert ", 3 Bs (n=%s), " % ",".join(map(str, ns)) in out.splitlines()[0], out
                    lines = out.splitlines()
                    for algo in ("naive", "collective", "ring"):
                        at = [i for i, l in enumerate(lines) if l.startswith(algo + " ")]
                        assert len(at) == 1 and lines[at[0]].rstrip().endswith("OK"), out
                        cs = lines[at[0] + 1:at[0] + 4]
                        assert [c.split()[:2] for c in cs] == [
                            ["C%d" % i, "n=%d" % ns[i]] for i in range(3)], out
                        assert all(c.endswith("  OK") for c in cs), out
                    assert "all checks passed" in out and "of every C" in out, out
        p = d.run([DEMO, "-w", "2", "-m", "96", "-n", "32", "-k", "48", "-a", "auto",
                   "--more-n", "16,64", "-i", "2", "--job", "bs-auto"])
        assert "all checks passed" in p.stdout, p.stdout
        for more, err in (("1,2,3,4,5,6,7,8",
                           "ovl-demo: --more-n: at most 7 Bs after the first (an op takes 8)\n"),
                          ("8,0", "ovl-demo: --more-n: '0' is not a positive number\n"),
                          ("8,x", "ovl-demo: --more-n: 'x' is not a positive number\n")):
            p = d.run([DEMO, "-w", "2", "--more-n", more, "--job", "bs-refused"], check=False)
            assert (p.returncode, p.stdout, p.stderr) == (2, "", err), (more, p)
        # nothing ran for the refused ones: no job was ever made of them
        assert not [m for m in log_messages(d) if "bs-refused" in m], log_messages(d)
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_demo_idle():
    """ovl-demo --idle (what scripts/issue-cost --gated runs beside the
    measured job): its ranks join and stay, with no op, while another job
    runs and checks its results on the same devices; --idle's time ends it,
    and so does SIGTERM to the parent (passed on to the ranks), with status
    0 and every rank gone from ovld, and so does the parent's SIGKILL (the
    ranks see it gone and leave); a number of seconds out of 1..86400 is
    refused before any rank starts (exit 2, one line naming the range)."""
    d = Daemon(config="host_devices = 2\n")
    idle = None
    try:
        idle = subprocess.Popen([DEMO, "-w", "2", "--idle", "60", "--job", "idle-job"],
                                env=d.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            jobs = {j["id"]: j for j in status_json(d)["jobs"]}
            if "idle-job" in jobs and jobs["idle-job"]["local_ranks"] == 2:
                break
            assert idle.poll() is None, idle.communicate()
            assert time.monotonic() < deadline, "the idle job never had its 2 ranks: %r" % jobs
            time.sleep(0.05)
        assert jobs["idle-job"]["ops_done"] == 0, jobs
        p = demo(d, 2, 16, 8, 24, "fp32", [], "beside-idle")
        assert "all checks passed" in p.stdout, p.stdout
        jobs = {j["id"]: j for j in status_json(d)["jobs"]}
        assert jobs["idle-job"]["ops_done"] == 0 and jobs["idle-job"]["local_ranks"] == 2, jobs
        t0 = time.monotonic()
        idle.send_signal(signal.SIGTERM)
        out, err = idle.communicate(timeout=10)
        assert idle.returncode == 0, (idle.returncode, out, err)
        assert time.monotonic() - t0 < 5, time.monotonic() - t0
        assert out.splitlines()[0] == "ovl-demo: job 'idle-job', world 2, idle: no ops", out
        assert "ovl-demo: job 'idle-job' joined, idle for 60 s" in out, out
        assert out.rstrip().endswith("ovl-demo: job left"), out
        idle = None
        wait_no_job(d)
        # its own time ends it as well
        p = d.run([DEMO, "-w", "1", "--idle", "1", "--job", "idle-short"], timeout=30)
        assert p.stdout.rstrip().endswith("ovl-demo: job left"), p.stdout
        # and so does the end of its parent, killed: the ranks leave
        idle = subprocess.Popen([DEMO, "-w", "2", "--idle", "60", "--job", "idle-orphan"],
                                env=d.env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not any(j["id"] == "idle-orphan" and j["local_ranks"] == 2
                      for j in status_json(d)["jobs"]):
            assert idle.poll() is None and time.monotonic() < deadline, "idle-orphan never joined"
            time.sleep(0.05)
        idle.kill()
        idle.wait()
        idle = None
        wait_no_job(d, timeout=10)
        for bad in ("0", "86401", "x"):
            p = d.run([DEMO, "-w", "1", "--idle", bad, "--job", "idle-refused"], check=False)
            assert (p.returncode, p.stdout, p.stderr) == (
                2, "", "ovl-demo: --idle: '%s' is not a number of seconds in 1..86400\n" % bad), p
        assert not [m for m in log_messages(d) if "idle-refused" in m], log_messages(d)
        assert d.stop() == 0
    finally:
        if idle is not None:  # the whole group: the ranks hold its pipes
            kill_group(idle)
        d.cleanup()


def kill_group(proc):
    """SIGKILLs proc's whole process group (an ovl-demo and its ranks, which
    hold its pipes) and reaps proc."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def proc_stat(pid):
    """(state, ppid) of process pid from /proc, or None once it is gone; a
    zombie counts as gone (its new parent, maybe a PID 1 that never reaps,
    holds only its exit status)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
    except FileNotFoundError:
        return None
    return None if fields[0] in ("Z", "X") else (fields[0], int(fields[1]))


def test_demo_parent_killed():
    """ovl-demo running ops, its own process SIGKILLed (not its process
    group, which would kill the ranks directly: SIGKILL passes nothing on):
    its ranks end with it (client/ovl_demo.c's start_rank) within 5 s,
    ovld ends their job once and frees what it held, its loop kept turning
    and it serves a fresh job."""
    d = Daemon()
    demo = None
    try:
        demo = long_demo(d, ["-m", "16", "-n", "8", "-k", "24"], "orphan-run")
        s = wait_job_going(d, "orphan-run", 5)
        ranks = [c["pid"] for c in s["clients"] if c["job"] == "orphan-run"]
        assert len(ranks) == 2, s
        for pid in ranks:  # the demo's own ranks, running
            st = proc_stat(pid)
            assert st is not None and st[1] == demo.pid, (pid, st, demo.pid)
        demo.kill()
        demo.wait()
        deadline = time.monotonic() + 5
        while [pid for pid in ranks if proc_stat(pid) is not None]:
            assert time.monotonic() < deadline, "the ranks outlived their parent: %r\n%s" % (
                {pid: proc_stat(pid) for pid in ranks}, log_excerpt(d))
            time.sleep(0.02)
        demo.communicate(timeout=5)  # the ranks held its pipes: closed with them
        demo = None
        wait_no_job(d, timeout=10)
        msgs = [m for m in log_messages(d) if m.startswith("job 'orphan-run': ")]
        ended = [m for m in msgs if m.startswith("job 'orphan-run': ended after ")]
        assert len(ended) == 1, [m for m in msgs if " op " not in m]
        assert "event loop has not turned" not in d.log_text(), log_excerpt(d)
        p = d.run([DEMO, "-w", "2", "-m", "16", "-n", "8", "-k", "24", "-i", "2", "--job",
                   "after-orphan"], timeout=120)
        assert "all checks passed" in p.stdout, p.stdout
        assert d.stop() == 0
    finally:
        if demo is not None:  # the whole group: ranks left running end too
            kill_group(demo)
        d.cleanup()


def test_demo_no_daemon():
    """ovl-demo with no ovld (no socket, or a stale one nobody listens on):
    its first and only line says why (the socket and 'is ovld running?'),
    exit 1, no table of ranks that sent no result."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-") as tmp:
        missing = os.path.join(tmp, "none.sock")
        stale = os.path.join(tmp, "stale.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(stale)
        s.close()
        for path, why in ((missing, "No such file or directory"), (stale, "Connection refused")):
            for extra in ([], ["--idle", "5"]):
                env = dict(os.environ, OVL_SOCKET=path)
                p = subprocess.run([DEMO, "-w", "4", *extra], env=env, capture_output=True,
                                   text=True, timeout=60)
                out = p.stderr + p.stdout
                assert p.returncode == 1, (p.returncode, out)
                assert out == "ovl-demo: cannot connect to %s (from $OVL_SOCKET): %s (is ovld " \
                    "running?)\n" % (path, why) or out == "ovl-demo: cannot connect to %s: %s " \
                    "(is ovld running?)\n" % (path, why), out


if __name__ == "__main__":
    run_tests([test_demo_no_daemon, test_matrix, test_auto_and_defaults, test_allgather_settings, test_several_bs,
               test_demo_idle, test_demo_parent_killed])
