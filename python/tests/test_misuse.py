"""Tests of the ovl Python package against misuse (issue 32, section 2):
ints that ctypes would narrow, job names that libovl's C string would cut
or ovld would refuse, closing a comm or a client while another thread runs
ops, arrays read after close(), two threads driving two ranks of one job
through one Client, shapes too large for an array, and the package's own
edges (a bad $OVL_LIBRARY, ovl.torch without torch, pip install's
leftovers). Every refusal is checked to send nothing; every scenario that
used to crash the interpreter runs in a subprocess of its own, bounded in
time, so that a crash fails its test instead of the runner.

Run by ctest's test_python_host (test_ovl_host.py runs TESTS after its
own); by hand:
    OVLD_BIN=build/ovld OVL_LIBRARY=build/client/libovl.so.1 python3 python/tests/test_misuse.py
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import ovl  # noqa: E402
from test_ovl_host import FakeCuda, expect, new_daemon  # noqa: E402
from ovltest import run_tests  # noqa: E402

IA = ovl.InvalidArgument
D = None


def daemon():
    global D
    if D is None or D.proc.poll() is not None:
        D = new_daemon()
    return D


def run_py(code, *args, timeout=120, env=None):
    """code in a fresh interpreter (this one's environment: the ASan runtime
    preloaded for an ASan-built libovl); its stdout. A crash (a signal, a
    sanitizer's report) or a hang past timeout fails the test here."""
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + list(args),
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("still running after %d s:\n%s\n%s" % (timeout, e.stdout, e.stderr))
    assert p.returncode == 0 and "Sanitizer" not in p.stderr, (
        "exit status %d%s\nstdout:\n%s\nstderr:\n%s" % (
            p.returncode, " (signal %d)" % -p.returncode if p.returncode < 0 else "",
            p.stdout, p.stderr[-6000:]))
    return p.stdout


def my_jobs(c):
    return sorted(j["id"] for j in c.status()["jobs"])


def test_ints_checked_before_ctypes():
    """World, rank, device, the timeout, chunks, streams, stream handles
    and the pointers, shapes and strides of a __cuda_array_interface__
    object are checked as Python ints: ctypes would keep their low bits
    (world 2**32 + 1 joined a job of world 1)."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        job = c.new_job_id()
        e = expect(IA, c.comm, job, 2 ** 32 + 1, 0, 0, words="rank 0 of world 4294967297")
        assert e.status == -1, e
        expect(IA, c.comm, job, 2 ** 32 + 2, 2 ** 32, 0, words="rank 4294967296 of world")
        expect(IA, c.comm, job, 2, 2 ** 32 + 1, 0, words="rank 4294967297 of world 2")
        expect(IA, c.comm, job, 1, 0, 2 ** 32, words="device 4294967296 out of range 0..")
        expect(IA, c.comm, job, 1, 0, 2 ** 31, words="device 2147483648")
        expect(IA, c.comm, job, 1, 0, -1, words="device -1")
        expect(IA, c.comm, job, 1.0, 0, 0, words="world: an int")
        assert my_jobs(c) == [], my_jobs(c)  # nothing was sent
        # numpy's ints are ints; then the comm works
        with c.comm(job, np.uint32(1), np.int64(0), np.int8(0)) as comm:
            assert (comm.world, comm.rank, comm.device) == (1, 0, 0)
            a, b = c.zeros((2, 3)), c.zeros((3, 4))
            f = comm.all_gather_matmul
            expect(IA, f, a, b, chunks=2 ** 32 + 1, words="chunks")
            expect(IA, f, a, b, streams=2 ** 64, words="streams")
            assert np.array_equal(f(a, b, chunks=1), np.zeros((2, 4), np.float32))
    expect(IA, ovl.connect, d.socket, timeout_ms=2 ** 32 + 5, words="timeout_ms 4294967301")
    expect(IA, ovl.connect, d.socket, timeout_ms=True, words="timeout_ms: an int")
    expect(IA, ovl.connect, d.socket + "\0x", words="holds a NUL")
    # the CUDA path's ints, without a GPU (_cuda_stream, _describe)
    cs = ovl._core._cuda_stream

    class Stream:
        def __init__(self, v):
            self.cuda_stream = v

    expect(IA, cs, 2 ** 64, [], words="stream 18446744073709551616 out of range")
    expect(IA, cs, -1, [], words="stream -1 out of range")
    expect(IA, cs, Stream(2 ** 64 + 7), [], words="stream.cuda_stream")
    assert cs(2 ** 64 - 1, []) == 2 ** 64 - 1 and cs(Stream(5), []) == 5
    big = FakeCuda((3, 4))
    big.__cuda_array_interface__["data"] = (2 ** 64 + 16, False)
    expect(IA, ovl._core._describe, "a", big, words="a: data pointer")
    neg = FakeCuda((-3, 4))
    expect(IA, ovl._core._describe, "a", neg, words="a: dimension -3")
    huge = FakeCuda((2 ** 64 + 3, 4))
    expect(IA, ovl._core._describe, "a", huge, words="a: dimension")
    bad_stride = FakeCuda((3, 4))
    bad_stride.__cuda_array_interface__["strides"] = (2 ** 70, 4)
    expect(IA, ovl._core._describe, "a", bad_stride, words="a: stride")


def test_job_names_checked():
    """A job name is refused where libovl's C string would cut it (a NUL:
    "dup\\0A" and "dup\\0B" were one job "dup") and where ovld would refuse
    it (docs/protocol.md: 1 to 63 bytes of UTF-8, no control character),
    before anything is sent."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        for bad, words in (("nul\x00tail", "holds a NUL at 3"),
                           ("dup\x00A", "holds a NUL"),
                           ("\x00", "holds a NUL at 0"),
                           ("tab\there", "control character U+0009 at 3"),
                           ("del\x7f", "control character U+007F"),
                           ("c1\x85", "control character U+0085"),
                           ("esc\x1b[31m", "control character U+001B"),
                           ("rlo\u202eevil", "control character U+202E at 3"),
                           ("lri\u2066x", "control character U+2066"),
                           ("alm\u061c", "control character U+061C"),
                           ("half\ud800", "not encodable as UTF-8"),
                           ("j" * 64, "64 bytes of UTF-8; a job id is 1 to 63 bytes"),
                           ("\u00e9" * 32, "64 bytes of UTF-8")):
            e = expect(IA, c.comm, bad, 2, 0, 0, words=words)
            assert e.status == -1, e
        assert my_jobs(c) == [], my_jobs(c)  # nothing was sent
        # what ovld takes, through the same checks: 63 bytes, non-ASCII text
        for good in ("\u00e9" * 31 + "x", "job \u4e2d\u6587 \U0001f680"):
            with c.comm(good, 1, 0, 0) as comm:
                assert my_jobs(c) == [good], (my_jobs(c), good)
                a, b = c.zeros((1, 1)), c.zeros((1, 1))
                comm.all_gather_matmul(a, b)


CLOSE_WHILE_OPS = """
    import sys, threading, time, ovl
    sock, what = sys.argv[1], sys.argv[2]
    done = errors = 0
    for trial in range(12):
        c = ovl.connect(sock)
        comm = c.comm("close-%s-%d" % (what, trial), 1, 0, 0)
        a, b = c.zeros((16, 16)), c.zeros((16, 16))
        started = threading.Event()
        seen = []

        def run():
            n = 0
            try:
                while True:
                    comm.all_gather_matmul(a, b, async_op=n % 2 == 1)
                    n += 1
                    started.set()
            except ovl.Error as e:   # the comm or client closed under it
                seen.append((n, type(e).__name__))
            except BaseException as e:
                seen.append((n, "not an ovl.Error: %r" % e))
            started.set()

        t = threading.Thread(target=run)
        t.start()
        started.wait(30)
        time.sleep(0.001 * (trial % 4))
        try:
            (comm.close if what == "comm" else c.close)()
        except ovl.Error:
            pass
        t.join(60)
        assert not t.is_alive(), "the op thread still runs"
        n, err = seen[0]
        assert err in ("Closed", "Shutdown"), err
        done += n
        c.close()
    print("ok", what, done)
"""


def test_close_while_ops_run():
    """A thread runs ops while another closes the comm, or the client: each
    op completes or raises ovl.Error (Closed), never touches the freed
    comm (a SIGSEGV, or ASan's report, before the handle was read under
    the client's lock)."""
    d = daemon()
    for what in ("comm", "client"):
        out = run_py(CLOSE_WHILE_OPS, d.socket, what)
        assert out.startswith("ok %s " % what) and int(out.split()[2]) > 0, out


ARRAY_AFTER_CLOSE = """
    import gc, os, sys, time, numpy as np, ovl
    sock = sys.argv[1]
    watch = ovl.connect(sock)
    def clients():  # this process's
        return sorted((x["buffers"], x["job"]) for x in watch.status()["clients"]
                      if x["pid"] == os.getpid())
    c = ovl.connect(sock)
    comm = c.comm("after-close", 1, 0, 0)
    a = c.zeros((64, 32)); b = c.zeros((32, 16))
    a[...] = 1; b[...] = 2
    out = comm.all_gather_matmul(a, b)
    view = out[3:, 1:]
    del out
    c.close()
    try:
        c.empty((1,))
        print("empty after close worked")
    except ovl.Closed:
        pass
    print("values", float(a.sum()), float(view[0, 0]))   # unmapped by close() before
    a[...] = 3
    view[...] = 4
    print("written", float(a.sum()), float(view.sum()))
    print("lingering", clients())                        # the comm left; 3 buffers held
    del a, b, view
    gc.collect()
    t0 = time.monotonic()                                # the last array closed it:
    while len(clients()) > 1 and time.monotonic() - t0 < 10:
        time.sleep(0.01)                                 # ovld sees the hangup soon
    print("after", clients())
    watch.close()
"""


def test_arrays_after_close():
    """Arrays from empty() stay readable and writable after client.close():
    the connection that holds their memory is closed once the last of them
    is gone (ovl_disconnect unmapped it under them: a SIGSEGV)."""
    d = daemon()
    out = run_py(ARRAY_AFTER_CLOSE, d.socket)
    lines = out.splitlines()
    assert lines[0] == "values 2048.0 64.0", out
    assert lines[1] == "written 6144.0 %r" % (4.0 * 61 * 15), out
    assert lines[2] == "lingering [(0, ''), (3, '')]", out
    assert lines[3] == "after [(0, '')]", out


TWO_THREADS = """
    import sys, threading, time, numpy as np, ovl
    sock = sys.argv[1]
    c = ovl.connect(sock, timeout_ms=3000)
    res = {}

    # 1. each thread joins its rank: the second join is refused at once
    go, done = threading.Event(), threading.Event()
    def rank0():
        with c.comm("two-threads-a", 2, 0, 0):
            go.set()
            done.wait(30)
    def rank1():
        go.wait(30)
        t0 = time.monotonic()
        try:
            c.comm("two-threads-a", 2, 1, 0).close()
            res["join"] = "joined"
        except ovl.InvalidArgument as e:
            res["join"] = "refused %.3f %s" % (time.monotonic() - t0, e.message)
        done.set()
    ts = [threading.Thread(target=f) for f in (rank0, rank1)]
    [t.start() for t in ts]; [t.join(60) for t in ts]
    print("join:", res["join"])

    # 2. one thread joins both, two threads drive them: the second is
    # refused at once (the first waits for its peer's op until the timeout,
    # and its client is not used again)
    c = ovl.connect(sock, timeout_ms=1000)
    c0 = c.comm("two-threads-b", 2, 0, 0); c1 = c.comm("two-threads-b", 2, 1, 0)
    a0, a1, b0, b1 = c.zeros((2, 3)), c.zeros((2, 3)), c.zeros((3, 4)), c.zeros((3, 4))
    def drive0():
        try:
            c0.all_gather_matmul(a0, b0)
            res["op0"] = "done"
        except ovl.Error as e:
            res["op0"] = type(e).__name__
    t = threading.Thread(target=drive0)
    t.start()
    deadline = time.monotonic() + 30
    while not getattr(c0, "_busy", True) and time.monotonic() < deadline:
        time.sleep(0.001)   # until drive0 is in its call
    time.sleep(0.05)
    t0 = time.monotonic()
    try:
        c1.all_gather_matmul(a1, b1)
        print("op1: done")
    except ovl.InvalidArgument as e:
        print("op1: refused %.3f %s" % (time.monotonic() - t0, e.message))
    t.join(60)
    print("op0:", res.get("op0"))
    for x in (c0, c1):
        try:
            x.close()
        except ovl.Error:
            pass

    # 3. one thread, two ranks, async ops: works, as ever; so does another
    # thread taking both over
    c = ovl.connect(sock, timeout_ms=10000)
    def one_thread(tag):
        c0 = c.comm("two-threads-" + tag, 2, 0, 0); c1 = c.comm("two-threads-" + tag, 2, 1, 0)
        a0, a1, b = c.zeros((2, 3)), c.zeros((2, 3)), c.zeros((3, 4))
        a0[...] = 1; a1[...] = 2; b[...] = 1
        o0 = c0.all_gather_matmul(a0, b, async_op=True)
        o1 = c1.all_gather_matmul(a1, b, async_op=True)
        c0.synchronize(); c1.synchronize()
        c0.close(); c1.close()
        res[tag] = (o0[:, 0].tolist(), np.array_equal(o0, o1))
    one_thread("c")
    t = threading.Thread(target=one_thread, args=("d",)); t.start(); t.join(60)
    print("one thread:", res["c"], res["d"])
    c.close()
"""


def test_two_threads_one_job_refused():
    """Two ranks of one job on one Client, driven by two threads, would wait
    for each other until the timeout (an op holds the client until every
    rank sent its part): refused at once with words, at the join or at the
    second thread's call; one thread driving both still works."""
    d = daemon()
    out = run_py(TWO_THREADS, d.socket, timeout=120)
    lines = out.splitlines()
    # "at once": well under the client's timeout (3 s, 1 s), even on a
    # loaded machine
    m = re.match(r"join: refused ([0-9.]+) (.*)", lines[0])
    assert m and float(m.group(1)) < 0.5, out
    assert m.group(2).startswith("job 'two-threads-a': rank 0 of this Client is joined by "
                                 "thread"), out
    assert "connect a Client per thread" in lines[0], out
    m = re.match(r"op1: refused ([0-9.]+) (.*)", lines[1])
    assert m and float(m.group(1)) < 0.5, out
    assert m.group(2).startswith("job 'two-threads-b': rank 0 of this Client is in a call from "
                                 "another thread"), out
    assert lines[2] in ("op0: Timeout", "op0: Aborted"), out
    assert lines[3] == ("one thread: ([3.0, 3.0, 6.0, 6.0], True) "
                        "([3.0, 3.0, 6.0, 6.0], True)"), out


def test_huge_shape():
    """A shape whose bytes overflow (size_t kept their low bits: 8 bytes
    were allocated, then OverflowError, and the 8 bytes leaked) raises
    InvalidArgument and allocates nothing."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        for shape, dtype in (((2 ** 62 + 1, 2), "fp32"), ((2 ** 64, 1), "fp16"),
                             ((2 ** 63, 0), "bf16"), ((2 ** 31,) * 3, "fp32"),
                             (2 ** 63 - 1, "fp16")):
            e = expect(IA, c.empty, shape, dtype, words="more than an array holds")
            assert e.status == -1, e
        expect(IA, c.empty, (2.0, 2), words="empty: dimension: an int")
        expect(IA, c.empty, (True, 2), words="empty: dimension: an int")
        expect(IA, c.empty, (-1, 2), words="negative dimension")
        def buffers():  # this process's (other tests' clients may linger)
            return sum(x["buffers"] for x in c.status()["clients"] if x["pid"] == os.getpid())

        before = buffers()
        for shape, dtype in (((2 ** 62 + 1, 2), "fp32"), ((2 ** 61 + 1, 4), "fp16")):
            expect(IA, c.empty, shape, dtype, words="more than an array holds")
        assert buffers() == before and c._allocs == {}, (before, buffers(), c._allocs)
        # a shape numpy takes with a 0 is an array of nothing
        assert c.empty((0, 2 ** 40), "fp32").shape == (0, 2 ** 40)
        assert c.empty(np.int64(3)).shape == (3,)


LOAD = """
    import ovl
    try:
        ovl.library_path()
        print("loaded")
    except ovl.LibraryNotFound as e:
        print(e)
"""


def test_library_env_named():
    """LibraryNotFound names $OVL_LIBRARY and its value, says whether that
    exists, and gives the loader's reason."""
    tmp = tempfile.mkdtemp(prefix="ovl-lib-")
    try:
        junk = os.path.join(tmp, "libovl.so.1")
        with open(junk, "w") as f:
            f.write("not a library\n")
        out = run_py(LOAD, env=dict(os.environ, OVL_LIBRARY=junk))
        assert out.startswith("libovl: $OVL_LIBRARY is set to %r, which exists but could not be "
                              "loaded: " % junk), out
        assert "invalid ELF header" in out or "too short" in out, out
        missing = os.path.join(tmp, "nonexistent.so")
        out = run_py(LOAD, env=dict(os.environ, OVL_LIBRARY=missing))
        want = "libovl: $OVL_LIBRARY is set to %r, which does not exist" % missing
        assert out.startswith(want), out
        # a library that is not libovl
        libm = None
        for cand in glob.glob("/lib/*/libm.so.6") + glob.glob("/usr/lib/*/libm.so.6"):
            libm = cand
            break
        if libm:
            out = run_py(LOAD, env=dict(os.environ, OVL_LIBRARY=libm))
            assert "exists but could not be loaded: loaded, but it is not libovl.so.1" in out, out
    finally:
        shutil.rmtree(tmp)


def test_torch_import_error():
    """import ovl.torch without torch: an ImportError that says torch is
    needed (and that `import ovl` is not affected)."""
    out = run_py("""
        import sys
        sys.modules["torch"] = None          # as if torch were not installed
        import ovl
        try:
            import ovl.torch
            print("imported")
        except ImportError as e:
            print(type(e).__name__, e)
    """)
    assert out.startswith("ImportError ovl.torch needs PyTorch 2.4 or later"), out
    assert "install torch" in out and "`import ovl` alone works" in out, out


def test_pip_install_leaves_no_build_files():
    """pip install of the package's directory leaves no build/ and no
    ovl.egg-info/ in it (setuptools' are in a copy: _backend/)."""
    tmp = tempfile.mkdtemp(prefix="ovl-pip-")
    try:
        src = os.path.join(tmp, "python")
        shutil.copytree(os.path.join(HERE, ".."), src, ignore=shutil.ignore_patterns(
            "build", "*.egg-info", "__pycache__"))
        before = sorted(os.listdir(src))
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-index", "--no-build-isolation", "--disable-pip-version-check",
                            "--target", os.path.join(tmp, "site"), src],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (p.stdout, p.stderr)
        assert os.path.exists(os.path.join(tmp, "site", "ovl", "_core.py")), os.listdir(tmp)
        left = [os.path.relpath(x, src) for x in glob.glob(os.path.join(src, "**"),
                                                            recursive=True)
                if os.path.basename(x) == "build" or x.endswith(".egg-info")]
        assert left == [] and sorted(os.listdir(src)) == before, (left, os.listdir(src))
    finally:
        shutil.rmtree(tmp)


def test_misuse_daemon_stops_clean():
    """This file's ovld, after all of the above, stops with status 0 and
    nothing from a sanitizer in its log."""
    d = daemon()
    rc = d.stop()
    text = d.log_text()
    assert rc == 0 and "Sanitizer" not in text and "runtime error" not in text, (rc, text[-3000:])


TESTS = [test_ints_checked_before_ctypes, test_job_names_checked, test_close_while_ops_run,
         test_arrays_after_close, test_two_threads_one_job_refused, test_huge_shape,
         test_library_env_named, test_torch_import_error, test_pip_install_leaves_no_build_files,
         test_misuse_daemon_stops_clean]

if __name__ == "__main__":
    try:
        run_tests(TESTS)
    finally:
        if D is not None:
            D.cleanup()
