"""Tests of the ovl Python package against a real ovld with the host
backend (tests/integration/ovltest.py's Daemon): results of worlds 1 to 4
against numpy in double precision, every bad input refused before anything
is sent (and the comm usable after), errors of ovld surfacing as the right
ovl.Error, and ovld killed mid-job failing the next call in bounded time.
Then test_misuse.py's tests (issue 32: misuse of the package), with their
own ovld.

Run by ctest (tests/CMakeLists.txt: test_python_host) with the package
installed in scripts/test's venv, OVL_LIBRARY set to the built libovl.so
and OVLD_BIN to the built ovld; by hand:
    OVLD_BIN=build/ovld OVL_LIBRARY=build/client/libovl.so.1 python3 python/tests/test_ovl_host.py
"""
import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

import numpy as np  # noqa: E402

import ovl  # noqa: E402
from ovltest import OVLCTL, Daemon, Skip, run_tests  # noqa: E402

# max |C - ref| / max |ref|, ref in double from the inputs as stored: C is
# accumulated in fp32 and rounded once to its dtype (fp16: 2^-11, bf16: 2^-8)
TOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 1e-2}
SPAWN = mp.get_context("spawn")  # libovl's client is not used across fork()


def fill(client, shape, dtype, seed, strided=False):
    """An array of client.empty with reproducible values, and their float64
    values as stored. strided: a row-strided view (leading dimension > cols)."""
    rng = np.random.default_rng(seed)
    vals = rng.uniform(-1, 1, size=shape).astype(np.float32)
    full = client.empty((shape[0], shape[1] + 3) if strided else shape, dtype)
    x = full[:, :shape[1]] if strided else full
    if dtype == "bf16":
        ovl.float32_to_bf16(vals, out=x)
        return x, ovl.bf16_to_float32(x).astype(np.float64)
    x[...] = vals
    return x, x.astype(np.float64)


def as_f64(x, dtype):
    return ovl.bf16_to_float32(x).astype(np.float64) if dtype == "bf16" else x.astype(np.float64)


def shard_seed(r, case):
    return 1000 * case + r


def rank_main(sock, job, world, rank, cases, q):
    """One rank: every case, each checked against numpy; puts (rank, results)."""
    os.environ["OVL_SOCKET"] = sock
    out = []
    try:
        with ovl.connect() as client, client.comm(job, world, rank, 0) as comm:
            for i, (m, n, k, dtype, transb, want_a, strided, algo) in enumerate(cases):
                a, _ = fill(client, (m, k), dtype, shard_seed(rank, i), strided)
                # n: one B's columns, or a tuple of them: several Bs in one op
                ns = n if isinstance(n, tuple) else (n,)
                bs = []
                for j, nj in enumerate(ns):
                    bshape = (nj, k) if transb else (k, nj)
                    bs.append(fill(client, bshape, dtype, 99 + 7 * rank + i + 31 * j, strided))
                # every rank's shard, as the others made it (same seeds)
                shards = []
                for r in range(world):
                    rng = np.random.default_rng(shard_seed(r, i))
                    v = rng.uniform(-1, 1, size=(m, k)).astype(np.float32)
                    if dtype == "bf16":
                        v = ovl.bf16_to_float32(ovl.float32_to_bf16(v))
                    elif dtype == "fp16":
                        v = v.astype(np.float16)
                    shards.append(v.astype(np.float64))
                ga = np.concatenate(shards)
                refs = [ga @ (b64.T if transb else b64) for _, b64 in bs]
                b_arg = [b for b, _ in bs] if isinstance(n, tuple) else bs[0][0]
                res = comm.all_gather_matmul(a, b_arg, transb=transb, return_a=want_a, algo=algo)
                cs, a_out = res if want_a else (res, None)
                cs = cs if isinstance(n, tuple) else [cs]
                err = max(np.max(np.abs(as_f64(c, dtype) - ref)) / max(np.max(np.abs(ref)), 1e-30)
                          for c, ref in zip(cs, refs))
                aerr = 0.0 if a_out is None else float(np.max(np.abs(as_f64(a_out, dtype) - ga)))
                out.append((cases[i], float(err), aerr, [c.shape for c in cs]))
            comm.check()
        q.put((rank, out, None))
    except Exception as e:  # the parent reports it
        import traceback
        q.put((rank, out, "%r\n%s" % (e, traceback.format_exc())))


def run_world(d, world, cases, timeout=240):
    q = SPAWN.Queue()
    job = ovl.Client.new_job_id("pytest-w%d" % world)
    ps = [SPAWN.Process(target=rank_main, args=(d.socket, job, world, r, cases, q))
          for r in range(world)]
    for p in ps:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            assert left > 0, "ranks did not answer in %d s: %r" % (timeout, sorted(got))
            r, res, err = q.get(timeout=left)
            assert err is None, "rank %d failed: %s\novld:\n%s" % (r, err, d.log_text()[-3000:])
            got[r] = res
    finally:
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.kill()
    return got


def check_results(world, got):
    worst = {}
    for res in got.values():
        for case, err, _, _ in res:
            worst[case[3]] = max(worst.get(case[3], 0.0), err)
    print("  world %d: %d ranks x %d cases checked; worst relative errors %s" % (
        world, len(got), len(got[0]), ", ".join("%s %.2g" % kv for kv in sorted(worst.items()))))
    for r, res in got.items():
        for case, err, aerr, shape in res:
            m, n, k, dtype, transb, want_a, strided, algo = case
            ns = n if isinstance(n, tuple) else (n,)
            assert shape == [(world * m, nj) for nj in ns], (case, shape)
            assert err <= TOL[dtype], "world %d rank %d %r: error %.3g > %.3g" % (
                world, r, case, err, TOL[dtype])
            assert aerr == 0.0, "world %d rank %d %r: a_out differs by %g" % (world, r, case, aerr)


def cases_for(world):
    out = []
    algos = ["auto", "naive", "collective", "ring"]
    i = 0
    for dtype in ("fp32", "fp16", "bf16"):
        for transb in (False, True):
            for want_a in (False, True):
                strided = (i % 3 == 1)
                out.append((5 + world, 7, 12 + i % 5, dtype, transb, want_a, strided,
                            algos[i % 4]))
                i += 1
    out.append((33, 40, 64, "fp32", False, True, False, "ring"))  # larger, several chunks
    # several Bs, each its own n, one op (A gathered once)
    out.append((4 + world, (7, 3, 9), 12, "fp32", False, True, False, "auto"))
    out.append((4 + world, (5, 11), 10, "bf16", True, False, False, "collective"))
    out.append((3 + world, (6, 2, 4), 8, "fp16", False, False, True, "ring"))
    out.append((3 + world, (6, 2, 4, 1, 3, 5, 7, 8), 8, "fp32", False, True, False, "naive"))
    return out


def new_daemon():
    """A Daemon, started with ovld's own sanitizer options where ctest gave
    them (OVL_DAEMON_ASAN_OPTIONS): this Python process runs with leak checks
    off and the ASan runtime preloaded, for the ASan-built libovl only."""
    saved = {k: os.environ.get(k) for k in ("ASAN_OPTIONS", "LD_PRELOAD")}
    if "OVL_DAEMON_ASAN_OPTIONS" in os.environ:
        os.environ["ASAN_OPTIONS"] = os.environ["OVL_DAEMON_ASAN_OPTIONS"]
        os.environ.pop("LD_PRELOAD", None)
    try:
        return Daemon()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


D = None


def daemon():
    global D
    if D is None or D.proc.poll() is not None:
        D = new_daemon()
    return D


def test_daemon_stops_clean():
    """The shared ovld, after all of the above, stops with status 0 and
    nothing from a sanitizer in its log."""
    d = daemon()
    rc = d.stop()
    text = d.log_text()
    assert rc == 0 and "Sanitizer" not in text and "runtime error" not in text, (rc, text[-3000:])


def test_library_and_info():
    lib = os.environ.get("OVL_LIBRARY")
    assert ovl.library_path() == lib or lib is None, (ovl.library_path(), lib)
    d = daemon()
    with ovl.connect(d.socket) as c:
        i = c.info()
        assert i["backend"] == "host" and i["pid"] == d.proc.pid, i
        assert i["protocol_version"] == 5 and i["version"] == ovl.__version__, i
        assert i["ndevices"] >= 1 and i["socket"] == d.socket, i
        st = c.status()  # the schema of `ovlctl status --json` (docs/ovlctl.md)
        assert st["pid"] == d.proc.pid and st["backend"] == "host", st
        assert st["socket"] == d.socket and st["restricted"] is False, st
        assert len(st["devices"]) == i["ndevices"], st
        assert len(st["clients"]) == 1 and st["clients"][0]["pid"] == os.getpid(), st
        assert st["op_kinds"] == ["ag_gemm", "gemm_rs"], st
        ctl = json.loads(subprocess.run([OVLCTL, "--socket", d.socket, "status", "--json"],
                                        capture_output=True, text=True, check=True).stdout)
        assert set(ctl) == set(st) and ctl["devices"] == st["devices"], (ctl, st)
        sts = c.stats()
        assert set(sts) == {"uptime_s", "reset_done", "heap_bytes", "total", "since_reset"}, sts
        assert sts["reset_done"] is False and sts["total"]["ops_done"] == 0, sts
        assert c.stats(reset=True)["reset_done"] is True
        ids = {c.new_job_id() for _ in range(100)}
        assert len(ids) == 100 and all(0 < len(j) <= 63 for j in ids), ids
    # $OVL_SOCKET is the default rule's first
    old = os.environ.get("OVL_SOCKET")
    os.environ["OVL_SOCKET"] = d.socket
    try:
        assert ovl.default_socket() == (d.socket, "$OVL_SOCKET"), ovl.default_socket()
        with ovl.connect() as c:
            assert c.info()["pid"] == d.proc.pid
    finally:
        if old is None:
            del os.environ["OVL_SOCKET"]
        else:
            os.environ["OVL_SOCKET"] = old


def test_status_mapping():
    # each ovl_status_t has its class, and libovl names the same codes
    lib = ovl._lib.lib()
    for st in range(-1, -22, -1):
        e = ovl.errors.error_for(st, "x")
        assert type(e) is not ovl.Error and e.status == st, (st, e)
        assert lib.ovl_strerror(st) != lib.ovl_strerror(-99), st  # a code libovl knows
    assert isinstance(ovl.errors.error_for(-19, ""), ovl.Closed)
    assert isinstance(ovl.errors.error_for(-1, ""), ValueError)


def test_library_not_found():
    """A bad $OVL_LIBRARY is named in the error (in a fresh interpreter);
    test_misuse.py's test_library_env_named has the other cases."""
    env = dict(os.environ, OVL_LIBRARY="/nonexistent/libovl.so.1")
    p = subprocess.run([sys.executable, "-c", "import ovl\ntry:\n ovl.connect('/x')\n"
                        "except ovl.LibraryNotFound as e:\n print(e)"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.stdout.startswith("libovl: $OVL_LIBRARY is set to '/nonexistent/libovl.so.1', "
                               "which does not exist"), (p.stdout, p.stderr)


def test_connect_refused():
    path = "/nonexistent-ovl-dir/ovld.sock"
    try:
        ovl.connect(path)
        raise AssertionError("connected")
    except ovl.ConnectFailed as e:
        assert e.status == -7 and path in e.message, e


def test_world_1():
    check_results(1, run_world(daemon(), 1, cases_for(1)))


def ops_by_kind(d):
    """ovld's ops done since start by kind (Client.stats: docs/ovlctl.md)."""
    with ovl.connect(d.socket) as c:
        ops = c.stats()["total"]["ops"]
    out = {}
    for o in ops:
        out[o["kind"]] = out.get(o["kind"], 0) + o["count"]
    return out


def test_world_2():
    d = daemon()
    cases = cases_for(2)
    before = ops_by_kind(d)
    check_results(2, run_world(d, 2, cases))
    after = ops_by_kind(d)
    # every op counted once, as the all-gather + GEMM it is
    assert set(after) == {"ag_gemm"}, after
    assert after["ag_gemm"] - before.get("ag_gemm", 0) == len(cases), (before, after, len(cases))


def test_world_3():
    check_results(3, run_world(daemon(), 3, cases_for(3)))


def test_world_4():
    check_results(4, run_world(daemon(), 4, cases_for(4)))


def expect(exc, fn, *args, **kw):
    want = kw.pop("words", None)
    try:
        fn(*args, **kw)
    except exc as e:
        if want:
            assert want in str(e), (want, str(e))
        return e
    raise AssertionError("no %s from %s%r" % (exc.__name__, getattr(fn, "__name__", fn), args))


def test_bad_inputs_leave_comm_usable():
    d = daemon()
    with ovl.connect(d.socket) as c, ovl.connect(d.socket) as other, \
            c.comm(c.new_job_id(), 1, 0, 0) as comm:
        m, n, k = 4, 3, 5
        a, a64 = fill(c, (m, k), "fp32", 1)
        b, b64 = fill(c, (k, n), "fp32", 2)
        f = comm.all_gather_matmul
        IA = ovl.InvalidArgument
        expect(IA, f, np.zeros((m, k), np.float32), b, words="not in memory from this client")
        expect(IA, f, other.zeros((m, k)), b, words="not in memory from this client")
        big = c.zeros((m, 2 * k))
        expect(IA, f, big[:, ::2], b, words="not contiguous along its rows")
        expect(IA, f, c.zeros((k, m)).T, b, words="not contiguous")
        expect(IA, f, c.zeros((m, k), "fp16"), b, words="dtype fp32, a's is fp16")
        expect(IA, f, a.astype(np.float64), b, words="dtype float64")
        expect(IA, f, a, c.zeros((k + 1, n)), words="does not fit a's 5 columns")
        expect(IA, f, a, b, transb=True, words="does not fit")
        expect(IA, f, a, b, out=c.zeros((m + 1, n)), words="out: 5 x 3, expected 4 x 3")
        expect(IA, f, a, b, a_out=c.zeros((m, k + 1)), words="a_out")
        ro = c.zeros((m, n))
        ro.flags.writeable = False
        expect(IA, f, a, b, out=ro, words="read-only")
        shared = c.zeros((m + m, max(n, k)))
        expect(IA, f, shared[:m, :k], b, out=shared[:m, :n], words="overlaps")
        expect(IA, f, c.zeros((m * k,)), b, words="2-D")
        expect(IA, f, c.zeros((1, m, k)), b, words="2-D")
        expect(IA, f, c.zeros((0, k)), b, words="empty matrix")
        expect(IA, f, a, [b] * 9, words="9 Bs given: an op takes at most 8")
        expect(IA, f, a, [], words="empty list")
        expect(IA, f, a, b, out=[c.zeros((m, n))], words="a list for a single b")
        expect(IA, f, a, b, algo="bogus", words="algo")
        expect(IA, f, a, b, algo=3, words="algo")
        expect(IA, f, a, b, algo="push", words="auto, naive, collective, ring")
        expect(IA, f, a, b, chunks=-1, words="chunks")
        expect(IA, f, a, b, streams=2 ** 32, words="streams")
        expect(IA, f, a, b, stream=1, words="no stream")
        expect(IA, f, [[1.0]], b, words="a list")
        expect(IA, c.empty, (2, 2), "int8", words="dtype")
        expect(IA, c.comm, "j", 2, 2, 0, words="rank 2 of world 2")
        expect(IA, c.comm, "", 1, 0, 0, words="job")
        expect(IA, c.comm, "j" * 64, 1, 0, 0, words="1 to 63 bytes")  # as ovld refuses it
        expect(ovl.Exists, other.comm, comm.job, 1, 0, 0, words="already joined")
        # the CUDA path's argument handling, without a GPU: a device array is
        # refused by the host backend, before anything is sent
        expect(IA, f, FakeCuda((m, k)), b, words="a CUDA array, but ovld runs the host backend")
        expect(IA, f, FakeCuda((m, k), "<f8"), b, words="typestr")
        comm.check()
        # the comm works after all of it: one B as a list gives a list
        (c1,), a_out = comm.all_gather_matmul(a, [b], return_a=True)
        assert np.allclose(c1, a64 @ b64, rtol=1e-5, atol=1e-5) and np.array_equal(a_out, a)
        c2 = comm.all_gather_matmul(a, b, out=c.zeros((m, n)))
        assert np.array_equal(c1, c2)
        comm.synchronize()


def forged_job_id(port=1):
    """An id of the form ovld makes (daemon/util/jobid.h: "OVLJ", version 1,
    IPv4 127.0.0.1 and port, a nonce, an instance) that no ovld issued: an
    application's ids are opaque, but a test of refusals needs one that
    fails no check of its form."""
    return (b"OVLJ" + bytes([1, 4]) + port.to_bytes(2, "big") + bytes([127, 0, 0, 1]) +
            bytes(12) + bytes(range(1, 17)) + bytes(range(17, 33)) + bytes(72))


def test_job_id_daemon():
    """Jobs across nodes on an ovld without peer_listen (docs/protocol.md):
    job_id_create and a join by a job id are refused with Unsupported and
    words, and the client goes on. The argument checks are
    test_job_id.py's."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        try:
            c.job_id_create()
            raise AssertionError("job_id_create worked without peer_listen")
        except ovl.Unsupported as e:
            assert "peer_listen" in e.message, e
    with ovl.connect(d.socket) as c:
        try:
            c.comm(forged_job_id(), 2, 0, 0)
            raise AssertionError("joined by a job id without peer_listen")
        except ovl.Unsupported as e:
            assert "peer_listen" in e.message, e
        # the connection goes on, and a named job works as ever
        with c.comm(c.new_job_id(), 1, 0, 0) as comm:
            a, a64 = fill(c, (2, 3), "fp32", 5)
            b, b64 = fill(c, (3, 4), "fp32", 6)
            assert np.allclose(comm.all_gather_matmul(a, b), a64 @ b64, rtol=1e-5, atol=1e-5)


class FakeCuda:
    """A __cuda_array_interface__ object (never dereferenced)."""

    def __init__(self, shape, typestr="<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "version": 3,
                                         "data": (0x7f0000000000, False), "strides": None}


def test_cuda_stream_arguments():
    """How a stream argument becomes a cudaStream_t (no GPU needed)."""
    cs = ovl._core._cuda_stream

    class TorchLike:
        cuda_stream = 7

    class CupyLike:
        ptr = 9

    assert cs(None, []) is None and cs(0, []) is None and cs(5, []) == 5
    assert cs(TorchLike(), []) == 7 and cs(CupyLike(), []) == 9
    expect(ovl.InvalidArgument, cs, "s", [], words="stream")
    m = ovl._core._describe("x", FakeCuda((3, 4), "<f2"))
    assert (m.kind, m.rows, m.cols, m.ld, m.dtype) == ("cuda", 3, 4, 4, 1), m


def test_async_op_and_lifetime():
    d = daemon()
    with ovl.connect(d.socket) as c, c.comm(c.new_job_id(), 1, 0, 0) as comm:
        a, a64 = fill(c, (8, 16), "fp16", 3)
        b, b64 = fill(c, (16, 8), "fp16", 4)
        outs = [comm.all_gather_matmul(a, b, async_op=True) for _ in range(20)]
        comm.synchronize()
        for o in outs:
            assert np.max(np.abs(o - a64 @ b64)) < 1e-2
        n0 = len(c._allocs)
        del outs, o
        comm.synchronize()  # async ops' arrays are kept until then
        import gc
        gc.collect()
        assert len(c._allocs) == n0 - 20, (n0, len(c._allocs))  # freed with their arrays
        bf = c.empty((3, 3), "bf16")
        v = np.array([[1, -2.5, 0.15625]] * 3, np.float32)
        ovl.float32_to_bf16(v, out=bf)
        assert np.array_equal(ovl.bf16_to_float32(bf), v)
    expect(ovl.Closed, comm.check)
    expect(ovl.Closed, c.empty, (1, 1))


def test_ranks_disagree():
    d = daemon()
    q = SPAWN.Queue()
    job = ovl.Client.new_job_id()
    ps = [SPAWN.Process(target=disagree_rank, args=(d.socket, job, r, q)) for r in range(2)]
    for p in ps:
        p.start()
    res = dict(q.get(timeout=120) for _ in ps)
    for p in ps:
        p.join(30)
    for r in range(2):
        assert res[r].startswith("Mismatch -13 op 1: ranks disagree on m"), res
        assert "| check Mismatch | close Mismatch" in res[r], res


def disagree_rank(sock, job, r, q):
    words = []
    with ovl.connect(sock) as c:
        cm = c.comm(job, 2, r, 0)
        m = 4 + r
        try:
            cm.all_gather_matmul(c.zeros((m, 3)), c.zeros((3, 2)))
            words.append("ok")
        except ovl.Error as e:
            words.append("%s %d %s" % (type(e).__name__, e.status, e.message))
        for call in (cm.check, cm.close):
            try:
                call()
                words.append("%s ok" % call.__name__)
            except ovl.Error as e:
                words.append("%s %s" % (call.__name__, type(e).__name__))
    q.put((r, " | ".join(words)))


KILLED = textwrap.dedent("""
    import sys, time, ovl
    c = ovl.connect(sys.argv[1])
    comm = c.comm("killed", 1, 0, 0)
    a = c.zeros((256, 256)); b = c.zeros((256, 256))
    for i in range(8):
        comm.all_gather_matmul(a, b, async_op=True)
    print("going", flush=True)
    sys.stdin.readline()          # ovld is killed now
    t0 = time.monotonic()
    try:
        for i in range(1000):
            comm.all_gather_matmul(a, b, async_op=True)
        comm.synchronize()
        print("no error")
    except ovl.Error as e:
        print("raised", type(e).__name__, e.status, "%.1f" % (time.monotonic() - t0))
        print("msg", e.message)
    for call in (comm.check, comm.synchronize):
        try:
            call(); print("later ok")
        except ovl.Error as e:
            print("later", type(e).__name__)
    t1 = time.monotonic()
    try:
        comm.close()
    except ovl.Error as e:
        print("close", type(e).__name__)
    c.close()
    print("closed in %.1f" % (time.monotonic() - t1))
""")


def test_daemon_killed_mid_job():
    d = new_daemon()
    try:
        p = subprocess.Popen([sys.executable, "-c", KILLED, d.socket], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "going", p.stderr.read()
            d.proc.kill()
            d.proc.wait()
            p.stdin.write("\n")
            p.stdin.flush()
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("the client still runs 60 s after ovld was killed")
        lines = out.splitlines()
        assert p.returncode == 0, (out, err)
        raised = [ln for ln in lines if ln.startswith("raised ")]
        # an ovl.Error: the send to the dead ovld fails with OVL_ERR_SYSTEM
        # or OVL_ERR_CLOSED (libovl: "ovld closed the connection (sending to
        # ovld)"), a wait with OVL_ERR_CLOSED; later calls say CLOSED
        assert raised and raised[0].split()[1:3] in (["Closed", "-8"], ["SystemFailure", "-3"]), (
            out, err)
        assert float(raised[0].split()[3]) < 20, out
        assert any("ovld" in ln for ln in lines if ln.startswith("msg ")), out
        assert lines.count("later Closed") == 2, out
        assert float(lines[-1].split()[-1]) < 20, out
    finally:
        d.cleanup()


RS_CASES = [  # (rows per rank, n, k per rank, dtype, transb, reduce_op, strided, algo)
    (4, 7, 12, "fp32", False, "sum", False, "auto"),
    (5, 6, 9, "fp16", True, "avg", True, "collective"),
    (3, 9, 10, "bf16", False, "sum", True, "naive"),
    (6, 5, 7, "fp32", True, "avg", False, "collective"),
    (4, 5, 8, "bf16", True, "avg", True, "push"),
    (2, 3, 5, "fp32", False, "sum", False, "push"),
    (4, 5, 8, "bf16", True, "avg", True, "ring"),
    (3, 4, 6, "fp16", False, "sum", False, "ring"),
]


def rs_rank_main(sock, job, world, rank, q):
    """One rank of GEMM + reduce-scatter cases: each rank's A ((world*rows)
    x k) and B from its seed; its out against the sum (or average) of every
    rank's product of its rows, in double precision."""
    os.environ["OVL_SOCKET"] = sock
    out = []
    try:
        with ovl.connect() as client, client.comm(job, world, rank, 0) as comm:
            for i, (mb, n, k, dtype, transb, red, strided, algo) in enumerate(RS_CASES):
                m = world * mb
                a, _ = fill(client, (m, k), dtype, shard_seed(rank, 50 + i), strided)
                b, _ = fill(client, (n, k) if transb else (k, n), dtype, 7 + rank + 31 * i)
                c = comm.matmul_reduce_scatter(a, b, reduce_op=red, transb=transb, algo=algo)
                ref = np.zeros((mb, n))
                for r in range(world):  # every rank's inputs, as it made them
                    rng = np.random.default_rng(shard_seed(r, 50 + i))
                    ar = rng.uniform(-1, 1, size=(m, k)).astype(np.float32)
                    rng = np.random.default_rng(7 + r + 31 * i)
                    br = rng.uniform(-1, 1, size=(n, k) if transb else (k, n)).astype(np.float32)
                    if dtype == "bf16":
                        ar = ovl.bf16_to_float32(ovl.float32_to_bf16(ar))
                        br = ovl.bf16_to_float32(ovl.float32_to_bf16(br))
                    elif dtype == "fp16":
                        ar, br = ar.astype(np.float16), br.astype(np.float16)
                    ar, br = ar.astype(np.float64), br.astype(np.float64)
                    ref += ar[rank * mb:(rank + 1) * mb] @ (br.T if transb else br)
                if red == "avg":
                    ref /= world
                err = np.max(np.abs(as_f64(c, dtype) - ref)) / max(np.max(np.abs(ref)), 1e-30)
                out.append((i, float(err), c.shape))
            comm.check()
        q.put((rank, out, None))
    except Exception as e:  # the parent reports it
        import traceback
        q.put((rank, out, "%r\n%s" % (e, traceback.format_exc())))


def test_matmul_reduce_scatter():
    """comm.matmul_reduce_scatter at worlds 1 to 4: every rank's out, its
    rows of the sum (or average) of the ranks' products, against numpy in
    double precision (a partial rounded to the dtype once per rank, so the
    tolerance is the dtype's, as for all_gather_matmul)."""
    d = daemon()
    for world in (1, 2, 3, 4):
        qu = SPAWN.Queue()
        job = ovl.Client.new_job_id("pytest-rs-w%d" % world)
        ps = [SPAWN.Process(target=rs_rank_main, args=(d.socket, job, world, r, qu))
              for r in range(world)]
        for p in ps:
            p.start()
        got = {}
        try:
            while len(got) < world:
                r, res, err = qu.get(timeout=240)
                assert err is None, "rank %d failed: %s\novld:\n%s" % (r, err,
                                                                      d.log_text()[-3000:])
                got[r] = res
        finally:
            for p in ps:
                p.join(30)
                if p.is_alive():
                    p.kill()
        for r, res in got.items():
            for i, err, shape in res:
                mb, n, _, dtype = RS_CASES[i][:4]
                assert shape == (mb, n), (world, r, i, shape)
                assert err <= 2 * TOL[dtype], "world %d rank %d case %d: error %.3g" % (
                    world, r, i, err)


def test_matmul_reduce_scatter_refused():
    """What the package refuses of a GEMM + reduce-scatter before anything
    is sent, each in words, the comm usable after."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        job = ovl.Client.new_job_id("pytest-rs-bad")
        with c.comm(job, 1, 0, 0) as comm:
            a, _ = fill(c, (4, 3), "fp32", 1)
            b, _ = fill(c, (3, 2), "fp32", 2)
            IA = ovl.InvalidArgument
            expect(IA, comm.matmul_reduce_scatter, a, b, reduce_op="max", words="reduce_op")
            expect(IA, comm.matmul_reduce_scatter, a, b, algo="rail",
                   words="auto, naive, collective, ring, push")
            expect(IA, comm.matmul_reduce_scatter, a, b, transb=True, words="does not fit")
            wrong, _ = fill(c, (3, 2), "fp32", 3)
            expect(IA, comm.matmul_reduce_scatter, a, b, out=wrong, words="out")
            out = comm.matmul_reduce_scatter(a, b)
            want = as_f64(a, "fp32") @ as_f64(b, "fp32")
            assert np.max(np.abs(as_f64(out, "fp32") - want)) < 1e-5, (out, want)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    import test_misuse  # the package against misuse (issue 32): its own ovld
    try:
        run_tests([test_library_and_info, test_status_mapping, test_library_not_found,
                   test_connect_refused,
                   test_world_1, test_world_2, test_world_3, test_world_4,
                   test_bad_inputs_leave_comm_usable, test_job_id_daemon,
                   test_cuda_stream_arguments,
                   test_async_op_and_lifetime, test_ranks_disagree,
                   test_matmul_reduce_scatter, test_matmul_reduce_scatter_refused,
                   test_daemon_killed_mid_job,
                   test_daemon_stops_clean] + test_misuse.TESTS)
    finally:
        for d in (D, test_misuse.D):
            if d is not None:
                d.cleanup()
