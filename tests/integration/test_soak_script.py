"""scripts/soak, the churn soak of a running ovld that the GPU machine runs
(issue 38), here against a host ovld on a temporary socket: a 15 s soak
with --small must pass and print its table; a negative margin must fail it
(exit 1, the FAIL line naming the metric); the verdict and the log check as
functions (the script imported as a module); bad arguments exit 2, a
missing ovl-demo 77, an ovld that cannot be reached 1. The script must kill
every process it started and remove its temporary folder."""
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys

from ovltest import Daemon, run_tests

SOURCE = os.environ.get("OVL_SOURCE_DIR",
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("OVL_BUILD_DIR", os.path.join(SOURCE, "build"))
SOAK = os.path.join(SOURCE, "scripts", "soak")
MIB = 1 << 20

# ASan's quarantine capped, as in test_soak.py: uncapped it alone grows
# ovld's RSS by hundreds of MiB over a few thousand ops. A no-op without ASan.
os.environ["ASAN_OPTIONS"] = ":".join(
    x for x in (os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=16",
                "thread_local_quarantine_size_kb=256") if x)


def load_soak():
    """scripts/soak as a module (its name has no .py)."""
    loader = importlib.machinery.SourceFileLoader("soak_script", SOAK)
    spec = importlib.util.spec_from_loader("soak_script", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def soak(args, env=None, timeout=240):
    return subprocess.run([sys.executable, SOAK] + args, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)


def processes_on(socket_path):
    """The processes whose environment points at socket_path (the soak's
    ovl-demo runs and their ranks: it gives them OVL_SOCKET)."""
    want = ("OVL_SOCKET=" + socket_path).encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(name))
        except OSError:
            continue
    return out


def with_daemon(fn):
    """Runs fn(d, tmp) with a host ovld whose log goes to a file and a
    TMPDIR of its own for the script, both under the daemon's temporary
    folder, which is removed afterwards, whatever happens."""
    d = Daemon()
    tmp = os.path.join(d.dir, "tmp")
    os.mkdir(tmp)
    env = d.env()
    env["TMPDIR"] = tmp
    try:
        fn(d, env, tmp)
    finally:
        d.cleanup()
        shutil.rmtree(d.dir, ignore_errors=True)


def test_soak_passes():
    def body(d, env, tmp):
        out = os.path.join(d.dir, "soak.md")
        p = soak(["--seconds", "15", "--small", "--bin", BUILD, "--socket", d.socket,
                  "--ovld-log", d.log_path, "--out", out], env=env)
        text = p.stdout + p.stderr
        print(p.stdout, end="", flush=True)  # its table, in ctest's log
        assert p.returncode == 0, "soak exited %d:\n%s\novld log:\n%s" % (
            p.returncode, text, d.log_text()[-3000:])
        lines = p.stdout.splitlines()
        assert lines[-1] == "soak: PASS", text
        assert re.search(r"^metric +before +peak during +after +bound +verdict$", p.stdout,
                         re.M), text
        for metric in ("heap \\(heap_bytes\\)", "RSS \\(VmRSS\\)", "fds", "threads",
                       "held \\(devices\\)"):
            assert re.search(r"^%s +.* ok$" % metric, p.stdout, re.M), (metric, text)
        assert "GPU memory: not sampled" in p.stdout, text
        # the runs: both looping jobs passed runs, none failed; job K was
        # killed at least once on schedule (3 to 6 s with --small)
        m = re.search(r"^job A \(.*\): (\d+) runs passed, 0 failed$", p.stdout, re.M)
        assert m and int(m.group(1)) > 0, text
        m = re.search(r"^job B \(.*\): (\d+) runs passed, 0 failed$", p.stdout, re.M)
        assert m and int(m.group(1)) > 0, text
        m = re.search(r"^job K \(.*\): (\d+) started, (\d+) killed on schedule, ", p.stdout, re.M)
        assert m and int(m.group(2)) >= 1, text
        assert re.search(r"^ovld's log during the soak: \d+ warnings .* 0 with a duration over",
                         p.stdout, re.M), text
        with open(out) as f:
            md = f.read()
        assert "| metric | before | peak during | after | bound | verdict |" in md, md
        assert md.rstrip().endswith("`soak: PASS`"), md
        # everything it started is gone, its temporary folder too
        assert processes_on(d.socket) == [], processes_on(d.socket)
        assert os.listdir(tmp) == [], os.listdir(tmp)
        # ovld is fine: stops at once with status 0
        assert d.stop() == 0, d.log_text()[-3000:]
        for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert bad not in d.log_text(), d.log_text()[-3000:]

    with_daemon(body)


def test_soak_fails():
    """A negative heap margin: after can never be within it. Short: 1 s of
    churn, no settle wait."""
    def body(d, env, tmp):
        p = soak(["--seconds", "1", "--small", "--bin", BUILD, "--socket", d.socket,
                  "--margin-mb", "heap=-1", "--settle", "0", "--settle-max", "0"], env=env)
        text = p.stdout + p.stderr
        assert p.returncode == 1, "soak exited %d:\n%s" % (p.returncode, text)
        last = p.stdout.splitlines()[-1]
        assert re.fullmatch(r"soak: FAIL \(heap after [0-9.]+ MiB > [0-9.]+ MiB \(before "
                            r"[0-9.]+ MiB -1 MiB\)\)", last), text
        assert re.search(r"^heap \(heap_bytes\) +.* FAIL$", p.stdout, re.M), text
        assert processes_on(d.socket) == [] and os.listdir(tmp) == [], text
        # a --devices the host backend cannot honour is a usage error
        p = soak(["--seconds", "1", "--bin", BUILD, "--socket", d.socket, "--devices", "3"],
                 env=env)
        assert p.returncode == 2 and "--devices 3" in p.stderr, (p.returncode, p.stderr)

    with_daemon(body)


def test_verdict():
    s = load_soak()
    margins = {"heap": 64, "rss": 256, "gpu": 512}
    before = {"heap": 5 * MIB, "rss": 100 * MIB, "fds": 14, "threads": 11, "held": 0,
              "gpu0": 1000 * MIB, "gpu1": 900 * MIB}
    peak = {k: v * 2 for k, v in before.items()}
    rows, reasons = s.judge(before, peak, dict(before), margins, 4)
    assert reasons == [] and [r[0] for r in rows] == [
        "heap (heap_bytes)", "RSS (VmRSS)", "fds", "threads", "held (devices)", "GPU 0 used",
        "GPU 1 used"], rows
    assert all(r[5] == "ok" for r in rows), rows
    # at the bounds: still ok
    after = dict(before, heap=69 * MIB, rss=356 * MIB, threads=15, gpu1=1412 * MIB)
    assert s.judge(before, peak, after, margins, 4)[1] == []
    # one past each: each fails, and says so
    after = dict(before, heap=69 * MIB + 1, rss=356 * MIB + 1, fds=15, threads=16, held=4096,
                 gpu1=1413 * MIB)
    rows, reasons = s.judge(before, peak, after, margins, 4)
    assert [r[5] for r in rows] == ["FAIL", "FAIL", "FAIL", "FAIL", "FAIL", "ok", "FAIL"], rows
    assert len(reasons) == 6, reasons
    assert reasons[0].startswith("heap after 69.0 MiB > 69.0 MiB"), reasons
    assert reasons[2] == "fds after 15 != 14 before", reasons
    assert reasons[3] == "threads after 16 > 15 (before 11 + 4)", reasons
    assert reasons[5].startswith("GPU 1 used after 1413.0 MiB > 1412.0 MiB"), reasons
    # no slack: threads exact; a metric that could not be read fails
    after = dict(before, threads=12)
    del after["gpu0"]
    rows, reasons = s.judge(before, peak, after, margins, 0)
    assert reasons == ["threads after 12 != 11 before", "gpu0 not read after the soak"], reasons
    # the log: warnings, job K's among them, and 'not done after' lines
    # whose duration is longer than the soak (a wrapped one)
    log = "\n".join([
        "2026-01-01T00:00:00.000Z ovld[7] warn: job 'soak-k-3': aborted: rank 0 left",
        "2026-01-01T00:00:00.000Z ovld[7] warn: device 0: op 12 not done after 10 s (x)",
        "<4>device 1: op 13 not done after 18446744073 s (its event: ...)",
        "2026-01-01T00:00:00.000Z ovld[7] error: the event loop has not turned for 3 s",
        "2026-01-01T00:00:00.000Z ovld[7] info: job 'soak-a-1': ended after 6 ops",
    ])
    f = s.log_facts(log, 60)
    assert (f["warn"], f["warn_k"], f["error"], f["stall"], f["not_done"]) == (3, 1, 1, 1, 2), f
    assert len(f["wrapped"]) == 1 and "18446744073" in f["wrapped"][0], f


def test_usage():
    for args in ([], ["--seconds", "0"], ["--seconds", "5", "--shape-a", "1,2"],
                 ["--seconds", "5", "--margin-mb", "disk=3"],
                 ["--seconds", "5", "--kill-every", "9,3"]):
        p = soak(args, timeout=30)
        assert p.returncode == 2 and "usage: soak" in p.stderr, (args, p.returncode, p.stderr)
    p = soak(["--help"], timeout=30)
    assert p.returncode == 0 and "--margin-mb" in p.stdout, p.stdout
    p = soak(["--seconds", "5", "--bin", "/nonexistent"], timeout=30)
    assert p.returncode == 77 and "no ovl-demo" in p.stderr, (p.returncode, p.stderr)
    # no ovld there: FAIL, exit 1
    p = soak(["--seconds", "5", "--bin", BUILD, "--socket", "/nonexistent/ovld.sock"], timeout=60)
    last = p.stdout.splitlines()[-1] if p.stdout else ""
    assert p.returncode == 1 and last.startswith("soak: FAIL (ovlctl status:"), (
        p.returncode, p.stdout, p.stderr)


if __name__ == "__main__":
    run_tests([test_usage, test_verdict, test_soak_fails, test_soak_passes])
