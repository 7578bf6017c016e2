"""Tests of the ovl Python package's scaled (fp8) ops against a real ovld
with the host backend: comm.all_gather_matmul and matmul_reduce_scatter with
a_scale / b_scale / out_dtype / bias / fast_accum, at worlds 1 and 2 (ranks
as processes), against numpy in float64 of the dequantized inputs

    C[i][j] = sa(i) sb(j) sum_l A[i][l] B[l][j] + bias[j]

(GEMM + reduce-scatter: each rank's such product summed over the ranks, this
rank's rows kept; avg: divided by the world), to a relative Frobenius error
of 1e-2 (bf16 out), 2e-3 (fp16) or 1e-5 (fp32); and every refusal of the
package, in words, before anything is sent (the comm usable after, ovld
counting no op).

fp8 arrays are ml_dtypes' float8_e4m3fn / float8_e5m2 where ml_dtypes is
importable, and always also uint8 codes named with dtype= (what
Client.empty gives without ml_dtypes): the parts that need ml_dtypes are
skipped without it, the codes path always runs.

Run by ctest (tests/CMakeLists.txt: test_python_scaled) in scripts/test's
venv, with OVL_LIBRARY and OVLD_BIN set as for test_python_host; by hand:
    OVLD_BIN=build/daemon/ovld OVL_LIBRARY=build/client/libovl.so.1 \\
        PYTHONPATH=python python3 python/tests/test_scaled.py
"""
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))

import numpy as np  # noqa: E402

import ovl  # noqa: E402
from ovltest import Daemon, run_tests  # noqa: E402

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

TOL = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}
SPAWN = mp.get_context("spawn")  # libovl's client is not used across fork()
E4, E5 = "fp8e4m3", "fp8e5m2"


# -- inputs and the reference ----------------------------------------------

BLOCK = 128  # the side of a scale block (OVL_SCALE_BLOCK)


def blocks(x):
    return -(-x // BLOCK)


def scale_shape(mode, rows, k):
    """ovl_scale_shape's: the scales of an operand of rows rows (A: m; B as
    n x k: n) under mode."""
    return {"tensor": (1,), "row": (rows,), "1x128": (rows, blocks(k)),
            "128x128": (blocks(rows), blocks(k))}[mode]


def b_values(case, rank, i):
    """B i's values on rank `rank` (B 0: rank_values'): w (n_i x k), b_scale,
    bias (n_i), as float64."""
    if i == 0:
        _, w, _, sb, bias = rank_values(case, rank)
        return w, sb, bias
    n = case["ns"][i]
    rng = np.random.default_rng(1000 * case["id"] + rank + 100000 * i)
    w = rng.uniform(-3, 3, size=(n, case["k"]))
    sb = rng.uniform(0.25, 2, size=scale_shape(case["b_mode"], n, case["k"]))
    return w, sb, rng.uniform(-4, 4, size=n)


def rank_values(case, rank):
    """The float values rank `rank` quantizes for case (the same on every
    process: from seeds): a (rows x k), w (n x k, B's transpose), a_scale
    and b_scale (of scale_shape's shapes), bias (n) as float64."""
    kind, m, n, k = case["kind"], case["m"], case["n"], case["k"]
    rows = m * case["world"] if kind == "rs" else m
    rng = np.random.default_rng(1000 * case["id"] + rank)
    a = rng.uniform(-3, 3, size=(rows, k))
    w = rng.uniform(-3, 3, size=(n, k))
    sa = rng.uniform(0.25, 2, size=scale_shape(case["a_mode"], rows, k))
    sb = rng.uniform(0.25, 2, size=scale_shape(case["b_mode"], n, k))
    bias = rng.uniform(-4, 4, size=n)
    return a, w, sa, sb, bias


def dequant(vals, fmt):
    """vals as fp8 of fmt stores them, in float64."""
    return ovl.fp8_to_float32(ovl.float32_to_fp8(vals, fmt), fmt).astype(np.float64)


def rounded(vals, dtype):
    """vals as an array of the output dtype stores them (a bias's values)."""
    if dtype == "bf16":
        return ovl.bf16_to_float32(ovl.float32_to_bf16(vals.astype(np.float32)))
    return vals.astype(np.float16 if dtype == "fp16" else np.float32).astype(np.float64)


def per_block(s, mode, rows, k):
    """Scales s of mode (float32 values, in float64) as a rows x ceil(k/128)
    matrix: each row's (A's) or column's (B's) scale for each 128 of k."""
    kq = blocks(k)
    s = s.astype(np.float32).astype(np.float64)
    if mode == "tensor":
        return np.full((rows, kq), s.reshape(-1)[0])
    if mode == "row":
        return np.repeat(s.reshape(rows, 1), kq, axis=1)
    if mode == "1x128":
        return s.reshape(rows, kq)
    return np.repeat(s.reshape(-1, kq), BLOCK, axis=0)[:rows]  # 128x128: row j's tile j / 128


def scaled_mm(a, w, sa, sb, a_mode, b_mode):
    """The scaled product by definition, float64 (a: rows x k, w: n x k,
    dequantized): C[i][j] = sum over blocks q of 128 of k of sa(i, q) sb(j, q)
    sum_{l in q} a[i][l] w[j][l]; tensor and row scales are one block's."""
    rows, k = a.shape
    sa, sb = per_block(sa, a_mode, rows, k), per_block(sb, b_mode, w.shape[0], k)
    out = np.zeros((rows, w.shape[0]))
    for q in range(blocks(k)):
        cols = slice(q * BLOCK, (q + 1) * BLOCK)
        out += sa[:, q:q + 1] * sb[None, :, q] * (a[:, cols] @ w[:, cols].T)
    return out


def product(case, q, i=0):
    """Rank q's scaled product with its B i, float64: as scaled_mm, + bias."""
    a, _, sa, _, _ = rank_values(case, q)
    w, sb, bias = b_values(case, q, i)
    p = scaled_mm(dequant(a, case["a_fmt"]), dequant(w, case["b_fmt"]), sa, sb, case["a_mode"],
                  case["b_mode"])
    if case["bias"]:
        p = p + rounded(bias, case["out"])[None, :]
    return p


def reference(case, rank, i=0):
    world = case["world"]
    if case["kind"] == "ag":
        # every rank's rows; with one a_scale, every row scaled by this rank's;
        # by row or 1x128, each rank's rows by that rank's (gathered with them)
        a_all = np.concatenate([dequant(rank_values(case, q)[0], case["a_fmt"])
                                for q in range(world)])
        w, sb, bias = b_values(case, rank, i)
        sa = rank_values(case, rank)[2]
        if case["a_mode"] != "tensor":
            sa = np.concatenate([rank_values(case, q)[2] for q in range(world)])
        ref = scaled_mm(a_all, dequant(w, case["b_fmt"]), sa, sb, case["a_mode"],
                        case["b_mode"])
        if case["bias"]:
            ref = ref + rounded(bias, case["out"])[None, :]
        return ref
    m = case["m"]
    ref = sum(product(case, q) for q in range(world))[rank * m:(rank + 1) * m]
    return ref / world if case["reduce_op"] == "avg" else ref


def as_f64(x, dtype):
    return ovl.bf16_to_float32(x).astype(np.float64) if dtype == "bf16" else x.astype(np.float64)


def fp8_array(client, vals, fmt, ml):
    """vals quantized into an array of client.empty: ml_dtypes' fp8 (ml) or
    uint8 codes."""
    x = client.empty(vals.shape, fmt)
    if not ml and x.dtype != np.uint8:
        x = x.view(np.uint8)
    ovl.float32_to_fp8(vals, fmt if x.dtype == np.uint8 else None, out=x)
    return x


def scale_array(client, vals, shape, layout="rows"):
    """Scales of vals in client's memory, of shape: row-major ("rows"); for
    a block scale's matrix also column-major ("cols": PyTorch's layout of
    A's 1x128 scales, strides (1, rows)) or with padded rows ("padded", as
    PyTorch's 128x128 scales may be), which ovl copies into its layout."""
    v = vals.astype(np.float32).reshape(shape)
    if layout == "cols":
        s = client.empty(shape[::-1], "fp32")
        s[...] = v.T
        return s.T
    if layout == "padded":
        s = client.empty((shape[0], shape[1] + 3), "fp32")
        s[...] = -1.0  # never read
        s[:, :shape[1]] = v
        return s[:, :shape[1]]
    s = client.empty(shape, "fp32")
    s[...] = v
    return s


def bias_array(client, vals, dtype):
    bias = client.empty((len(vals),), dtype)
    if dtype == "bf16":
        ovl.float32_to_bf16(vals, out=bias)
    else:
        bias[...] = vals
    return bias


def run_case(client, comm, case):
    """One scaled op as case says, on this rank; (relative error, a_out
    exact, out's shape)."""
    rank, ml = comm.rank, case["path"] == "ml"
    a_v, w_v, sa_v, sb_v, bias_v = rank_values(case, rank)
    a = fp8_array(client, a_v, case["a_fmt"], ml)
    w = fp8_array(client, w_v, case["b_fmt"], ml)
    # scales in the shapes users pass: (m,) / (m, 1); (n,) / (1, n); one: (1,), (1, 1), ();
    # block scales (rows, blocks of k), laid out as case["scales"] says
    alt = case["id"] % 2
    rows = a.shape[0]
    am, bm, layout = case["a_mode"], case["b_mode"], case.get("scales", "rows")
    sa_shape = ((rows, 1) if alt else (rows,)) if am == "row" else \
        sa_v.shape if am == "1x128" else [(1,), (1, 1)][alt]
    sb_shape = ((1, case["n"]) if alt else (case["n"],)) if bm == "row" else \
        sb_v.shape if bm in ("1x128", "128x128") else [(), (1,)][alt]
    sa = scale_array(client, sa_v, sa_shape, layout if am == "1x128" else "rows")
    sb = scale_array(client, sb_v, sb_shape, layout if len(sb_shape) == 2 else "rows")
    kw = dict(a_scale=sa, algo=case["algo"], fast_accum=bool(alt), chunks=case.get("chunks", 0))
    if case["out"] != "bf16" or alt:  # bf16: the default, named half the time
        kw["out_dtype"] = case["out"]
    nbs = len(case.get("ns", [case["n"]]))
    ws, sbs, biases = [w], [sb], [bias_array(client, bias_v, case["out"])]
    for i in range(1, nbs):  # further Bs (all-gather), each with its scales and bias
        wi, sbi, biasi = b_values(case, rank, i)
        ws.append(fp8_array(client, wi, case["b_fmt"], ml))
        sbs.append(scale_array(client, sbi, sbi.shape, layout if sbi.ndim == 2 else "rows"))
        biases.append(bias_array(client, biasi, case["out"]))
    if case["bias"]:
        kw["bias"] = biases[0] if nbs == 1 else biases
    kw["b_scale"] = sbs[0] if nbs == 1 else sbs
    if not ml:
        kw["dtype"] = case["a_fmt"] if case["a_fmt"] == case["b_fmt"] else (case["a_fmt"],
                                                                          case["b_fmt"])
    # B as PyTorch's _scaled_mm takes it (k x n column-major: w.T), or w with transb
    bs, transb = (ws, True) if case["layout"] == "transb" else ([x.T for x in ws], False)
    b = bs[0] if nbs == 1 else bs
    a_out_ok = True
    if case["kind"] == "ag":
        want_a = bool(case["id"] % 3 == 0)
        res = comm.all_gather_matmul(a, b, transb=transb, return_a=want_a, **kw)
        out, a_out = res if want_a else (res, None)
        if a_out is not None:
            codes = np.concatenate([ovl.float32_to_fp8(rank_values(case, q)[0], case["a_fmt"])
                                    for q in range(comm.world)])
            a_out_ok = a_out.dtype == a.dtype and np.array_equal(a_out.view(np.uint8), codes)
    else:
        out = comm.matmul_reduce_scatter(a, b, transb=transb, reduce_op=case["reduce_op"], **kw)
    outs = out if nbs > 1 else [out]
    want_dtype = {"fp32": "float32", "fp16": "float16"}.get(case["out"])
    err = 0.0
    for i, o in enumerate(outs):
        assert want_dtype is None or o.dtype == want_dtype, (case, o.dtype)
        ref = reference(case, rank, i)
        assert o.shape == ref.shape, (case, i, o.shape, ref.shape)
        err = max(err, np.linalg.norm(as_f64(o, case["out"]) - ref) /
                  max(np.linalg.norm(ref), 1e-30))
    return float(err), a_out_ok, outs[0].shape


def cases_for(kind, world):
    """A spread of the scaled op's choices: formats (not e5m2 twice), scale
    modes, output dtypes, bias, B's layout, algorithms, ml_dtypes or codes."""
    fmts = [(E4, E4), (E4, E5), (E5, E4)]
    modes = [("tensor", "tensor"), ("row", "row"), ("tensor", "row"), ("row", "tensor")]
    outs = ["bf16", "fp16", "fp32"]
    algos = ["auto", "naive", "collective", "ring"] + (["push"] if kind == "rs" else [])
    paths = ["codes", "ml"] if ml_dtypes is not None else ["codes"]
    out = []
    for i in range(14):
        out.append({
            "id": 100 * world + i + (50 if kind == "rs" else 0), "kind": kind, "world": world,
            "m": 3 + (i % 4), "n": 5 + (i % 5), "k": 16 + 8 * (i % 3),
            "a_fmt": fmts[i % 3][0], "b_fmt": fmts[i % 3][1],
            "a_mode": modes[i % 4][0], "b_mode": modes[i % 4][1], "out": outs[i % 3],
            "bias": i % 2 == 0, "layout": "wT" if i % 5 < 3 else "transb",
            "algo": algos[i % len(algos)], "path": paths[(i // 2) % len(paths)],
            "reduce_op": "avg" if i % 3 == 1 else "sum"})
    return out


def block_cases(kind, world):
    """Block scales (A 1x128 with B 1x128 or 128x128): k of one to five
    blocks (the last one partial or whole), n under and over 128 (and not
    in fours with 128x128), scales row-major, column-major or padded (copied
    into ovl's layout), chunks of 4 rows, several Bs (all-gather), formats,
    output dtypes, bias, B's layout, algorithms, ml_dtypes or codes."""
    fmts = [(E4, E4), (E4, E5), (E5, E4)]
    outs = ["fp32", "bf16", "fp16"]
    algos = ["auto", "naive", "collective", "ring"] + (["push"] if kind == "rs" else [])
    paths = ["codes", "ml"] if ml_dtypes is not None else ["codes"]
    specs = [  # m, n, k, B's mode, scales' layout, chunks, several Bs' ns
        (4, 8, 256, "1x128", "rows", 0, None),
        (8, 136, 300, "128x128", "cols", 2, None),
        (4, 260, 200, "128x128", "padded", 0, None),
        (8, 12, 128, "1x128", "cols", 0, None),  # one block: read as row scales
        (12, 20, 520, "1x128", "rows", 3, None),
        (4, 130, 384, "128x128", "rows", 0, None),
        (8, 16, 264, "1x128", "cols", 0, [16, 132, 40]),
        (4, 8, 136, "128x128", "padded", 0, [8, 200, 130]),
    ]
    out = []
    for i, (m, n, k, bmode, layout, chunks, ns) in enumerate(specs):
        if ns is not None and kind == "rs":
            continue  # one B a GEMM + reduce-scatter
        algo, red = algos[i % len(algos)], "avg" if i % 2 else "sum"
        case = {
            "id": 1000 + 100 * world + i + (50 if kind == "rs" else 0), "kind": kind,
            "world": world, "m": m, "n": n, "k": k, "a_fmt": fmts[i % 3][0],
            "b_fmt": fmts[i % 3][1], "a_mode": "1x128", "b_mode": bmode, "out": outs[i % 3],
            # (ring takes no bias with avg: refused, test_refusals)
            "bias": i % 3 != 1 and not (algo == "ring" and red == "avg" and kind == "rs"),
            "layout": "wT" if i % 4 < 2 else "transb", "algo": algo,
            "path": paths[(i // 2) % len(paths)], "reduce_op": red, "scales": layout,
            "chunks": chunks}
        if ns is not None:
            case["ns"] = ns
        out.append(case)
    return out


def rank_main(sock, job, world, rank, cases, q):
    """One rank: each case on a comm of its own job (job-i); puts (rank,
    results, error)."""
    os.environ["OVL_SOCKET"] = sock
    res = []
    try:
        with ovl.connect() as client:
            for case in cases:
                with client.comm("%s-%d" % (job, case["id"]), world, rank, 0) as comm:
                    res.append((case["id"],) + run_case(client, comm, case))
        q.put((rank, res, None))
    except Exception as e:  # the parent reports it
        import traceback
        q.put((rank, res, "%r\n%s" % (e, traceback.format_exc())))


def run_world(d, world, cases, timeout=240):
    q = SPAWN.Queue()
    job = ovl.Client.new_job_id("pyscaled-w%d" % world)
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
    by_id = {c["id"]: c for c in cases}
    worst = {}
    for r, res in got.items():
        assert len(res) == len(cases), (r, len(res))
        for cid, err, a_ok, shape in res:
            c = by_id[cid]
            rows = world * c["m"] if c["kind"] == "ag" else c["m"]
            assert shape == (rows, c["n"]), (c, shape)
            assert a_ok, "world %d rank %d %r: a_out is not the gathered codes" % (world, r, c)
            assert err <= TOL[c["out"]], "world %d rank %d %r: error %.3g > %.3g" % (
                world, r, c, err, TOL[c["out"]])
            worst[c["out"]] = max(worst.get(c["out"], 0.0), err)
    print("  %s world %d: %d ranks x %d cases; worst relative errors %s" % (
        cases[0]["kind"], world, world, len(cases),
        ", ".join("%s %.2g" % kv for kv in sorted(worst.items()))))


def new_daemon():
    """A Daemon, with ovld's own sanitizer options where ctest gave them (as
    test_ovl_host.py's)."""
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


def ops_counted(d, kind, want):
    """ovld's count of ops of kind once it reaches want (or after 10 s):
    ovld counts an op when its completion is handled, a moment after the
    doorbell that ends the client's wait."""
    deadline = time.monotonic() + 10
    while ops_by_kind(d).get(kind, 0) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    return ops_by_kind(d).get(kind, 0)


def ops_by_kind(d):
    with ovl.connect(d.socket) as c:
        ops = c.stats()["total"]["ops"]
    out = {}
    for o in ops:
        out[o["kind"]] = out.get(o["kind"], 0) + o["count"]
    return out


# -- the tests ---------------------------------------------------------------

def test_fp8_codes():
    """float32_to_fp8 / fp8_to_float32: every code decodes and encodes back
    to itself, the formats' landmarks, rounding to nearest even, overflow;
    against ml_dtypes' casts where it is importable."""
    for fmt, top, big, inf_code in ((E4, 448.0, 0x7E, None), (E5, 57344.0, 0x7B, 0x7C)):
        codes = np.arange(256, dtype=np.uint8)
        vals = ovl.fp8_to_float32(codes, fmt)
        finite = np.isfinite(vals)
        back = ovl.float32_to_fp8(vals[finite], fmt)
        assert np.array_equal(back, codes[finite]), fmt
        assert vals[big] == top and ovl.float32_to_fp8(np.float32(top), fmt) == big
        assert ovl.float32_to_fp8(np.float32(1.0), fmt) == (0x38 if fmt == E4 else 0x3C)
        assert ovl.float32_to_fp8(np.float32(-2.0), fmt) == (0xC0 if fmt == E4 else 0xC0)
        assert np.isnan(ovl.fp8_to_float32(ovl.float32_to_fp8(np.float32(np.nan), fmt), fmt))
        over = ovl.fp8_to_float32(ovl.float32_to_fp8(np.float32(top * 2), fmt), fmt)
        assert np.isnan(over) if inf_code is None else over == np.inf, (fmt, over)
        # halfway between 1 and the next value up: to the even code (1)
        nxt = vals[ovl.float32_to_fp8(np.float32(1.0), fmt) + 1]
        assert ovl.float32_to_fp8(np.float32((1.0 + nxt) / 2), fmt) == \
            ovl.float32_to_fp8(np.float32(1.0), fmt)
    expect(ovl.InvalidArgument, ovl.fp8_to_float32, np.zeros(3, np.uint8),
           words="uint8 codes: name their format")
    expect(ovl.InvalidArgument, ovl.float32_to_fp8, [1.0], "fp8e3m4", words="fp8e4m3 or fp8e5m2")
    expect(ovl.InvalidArgument, ovl.fp8_to_float32, np.zeros(3, np.float32), "fp8e4m3",
           words="float32")
    if ml_dtypes is None:
        print("  (ml_dtypes not importable: its casts not compared)")
        return
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(20000) * s for s in (1e-3, 1, 30, 3e4)])
    x = x.astype(np.float32)
    for fmt, mt in ((E4, ml_dtypes.float8_e4m3fn), (E5, ml_dtypes.float8_e5m2)):
        assert np.array_equal(ovl.float32_to_fp8(x, fmt), x.astype(mt).view(np.uint8)), fmt
        assert np.array_equal(ovl.fp8_to_float32(np.arange(256, dtype=np.uint8), fmt),
                              np.arange(256, dtype=np.uint8).view(mt).astype(np.float32),
                              equal_nan=True), fmt
        y = np.zeros(5, mt)
        ovl.float32_to_fp8(x[:5], out=y)  # out names the format
        assert np.array_equal(y.view(np.uint8), x[:5].astype(mt).view(np.uint8))


def test_empty_fp8():
    d = daemon()
    with ovl.connect(d.socket) as c:
        for fmt, name in ((E4, "float8_e4m3fn"), (E5, "float8_e5m2")):
            for spelling in (fmt, name):
                x = c.empty((3, 4), spelling)
                assert x.shape == (3, 4) and x.itemsize == 1
                assert x.dtype.name == (name if ml_dtypes is not None else "uint8"), x.dtype
            z = c.zeros((2, 2), fmt)
            assert not z.view(np.uint8).any()
        expect(ovl.InvalidArgument, c.empty, (2, 2), "fp8e3m4", words="fp8e4m3 or fp8e5m2")


def test_ag_world_1():
    run_world(daemon(), 1, cases_for("ag", 1))


def test_ag_world_2():
    d = daemon()
    before = ops_by_kind(d)
    cases = cases_for("ag", 2)
    run_world(d, 2, cases)
    want = before.get("ag_gemm", 0) + len(cases)
    assert ops_counted(d, "ag_gemm", want) == want, (before, ops_by_kind(d))


def test_rs_world_1():
    run_world(daemon(), 1, cases_for("rs", 1))


def test_rs_world_2():
    d = daemon()
    before = ops_by_kind(d)
    cases = cases_for("rs", 2)
    run_world(d, 2, cases)
    want = before.get("gemm_rs", 0) + len(cases)
    assert ops_counted(d, "gemm_rs", want) == want, (before, ops_by_kind(d))


def test_block_ag():
    """All-gather + GEMM with block scales at worlds 1 to 3 (block_cases),
    each case one ovl op."""
    d = daemon()
    for world in (1, 2, 3):
        before = ops_by_kind(d)
        cases = block_cases("ag", world)
        run_world(d, world, cases)
        want = before.get("ag_gemm", 0) + len(cases)
        assert ops_counted(d, "ag_gemm", want) == want, (world, before, ops_by_kind(d))


def test_block_rs():
    """GEMM + reduce-scatter with block scales at worlds 1 to 3: each rank's
    M rows' 1x128 scales with its A (its share of k), the rows of each
    rank's block of the output in fours."""
    d = daemon()
    for world in (1, 2, 3):
        before = ops_by_kind(d)
        cases = block_cases("rs", world)
        run_world(d, world, cases)
        want = before.get("gemm_rs", 0) + len(cases)
        assert ops_counted(d, "gemm_rs", want) == want, (world, before, ops_by_kind(d))


def test_one_comm_varied_scaling():
    """Scaled ops of one shape that differ only in their scaling (bias or
    not, out_dtype, scale modes), one after the other on one comm: each
    gives its own result (ovld plans each for its own scaling)."""
    d = daemon()
    with ovl.connect(d.socket) as c, c.comm(c.new_job_id("pyscaled-one"), 1, 0, 0) as comm:
        base = {"id": 7, "world": 1, "m": 4, "n": 6, "k": 16, "a_fmt": E4, "b_fmt": E4,
                "layout": "wT", "algo": "auto", "path": "codes", "reduce_op": "sum"}
        for kind in ("ag", "rs"):
            for out, bias, modes in (("fp32", True, ("row", "row")),
                                     ("fp32", False, ("row", "row")),
                                     ("bf16", False, ("row", "row")),
                                     ("fp16", True, ("tensor", "row")),
                                     ("fp32", True, ("tensor", "tensor"))):
                case = dict(base, kind=kind, out=out, bias=bias, a_mode=modes[0],
                            b_mode=modes[1])
                err, _, _ = run_case(c, comm, case)
                assert err <= TOL[out], (case, err)
        comm.check()


def test_ag_several_bs():
    """One scaled all-gather + GEMM of three Bs at world 1, each B with its
    own scales (row and tensor) and bias: each out is its B's scaled product
    with them (float64 reference of the dequantized inputs), in one op."""
    d = daemon()
    rng = np.random.default_rng(5)
    m, k, ns = 4, 32, (8, 16, 24)
    with ovl.connect(d.socket) as c, c.comm(c.new_job_id("pyscaled-bs"), 1, 0, 0) as comm:
        before = ops_by_kind(d).get("ag_gemm", 0)
        a = fp8_array(c, rng.uniform(-2, 2, (m, k)), E4, False)
        sa = scale_array(c, rng.uniform(0.5, 1, m), (m, 1))
        ws = [fp8_array(c, rng.uniform(-2, 2, (n, k)), E5, False) for n in ns]
        sbs = [scale_array(c, rng.uniform(0.5, 1, n), (1, n)) for n in ns]
        biases = [bias_array(c, rng.uniform(-1, 1, n), "fp32") for n in ns]
        outs = comm.all_gather_matmul(a, [w.T for w in ws], a_scale=sa, b_scale=sbs,
                                      bias=biases, out_dtype="fp32", dtype=(E4, E5))
        assert isinstance(outs, list) and len(outs) == 3
        av = ovl.fp8_to_float32(a, E4).astype(np.float64) * sa.astype(np.float64)
        for w, sb, b, out in zip(ws, sbs, biases, outs):
            wv = ovl.fp8_to_float32(w, E5).astype(np.float64)
            ref = av @ wv.T * sb.astype(np.float64) + b.astype(np.float64)[None, :]
            err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
            assert out.shape == ref.shape and err <= TOL["fp32"], (out.shape, err)
        comm.check()
        assert ops_counted(d, "ag_gemm", before + 1) == before + 1  # one op for the three Bs


def expect(exc, fn, *args, **kw):
    want = kw.pop("words", None)
    try:
        fn(*args, **kw)
    except exc as e:
        if want:
            assert want in str(e), (want, str(e))
        return e
    raise AssertionError("no %s from %s%r" % (exc.__name__, getattr(fn, "__name__", fn), args))


class FakeCuda:
    """A __cuda_array_interface__ object (never dereferenced)."""

    def __init__(self, shape, typestr="|u1", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "version": 3,
                                         "data": (0x7f0000000000, False), "strides": strides}


def test_refusals():
    """Every refusal of a scaled op, in words, before anything is sent:
    ovld counts no op, and the comm works after."""
    d = daemon()
    with ovl.connect(d.socket) as c, ovl.connect(d.socket) as other:
        job = c.new_job_id("pyscaled-bad")
        comm = c.comm(job, 1, 0, 0)
        before = ops_by_kind(d)
        m, n, k = 4, 6, 16
        rng = np.random.default_rng(3)
        a = fp8_array(c, rng.uniform(-2, 2, (m, k)), E4, False)
        w = fp8_array(c, rng.uniform(-2, 2, (n, k)), E4, False)
        w5 = fp8_array(c, rng.uniform(-2, 2, (n, k)), E5, False)
        a5 = fp8_array(c, rng.uniform(-2, 2, (m, k)), E5, False)
        sa = scale_array(c, np.ones(m), (m, 1))
        sb = scale_array(c, np.ones(n), (1, n))
        IA = ovl.InvalidArgument
        ag, rs = comm.all_gather_matmul, comm.matmul_reduce_scatter
        ok = dict(a_scale=sa, b_scale=sb, dtype=E4)
        rule = "cuBLASLt's fp8 GEMM"
        for f in (ag, rs):
            # fp8 formats and dtype=
            expect(IA, f, a5, w5.T, a_scale=sa, b_scale=sb, dtype=E5, words="both fp8e5m2")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=sb, words="uint8 codes: name their fp8")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=sb, dtype="int8", words="dtype 'int8'")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=sb, dtype=(E4,), words="or a pair")
            expect(IA, f, c.zeros((m, k)), w.T, **ok, words="a scaled op's A and B are fp8")
            # B's layout: k x n column-major (w.T), or w with transb
            kn = c.zeros((k, n), E4).view(np.uint8)
            expect(IA, f, a, kn, **ok, words="is not column-major")
            expect(IA, f, a, kn, **ok, words=rule)
            expect(IA, f, a, w.T, transb=True, **ok, words="with transb but not row-major")
            expect(IA, f, a, c.zeros((n, k + 16), E4).view(np.uint8).T, **ok,
                   words="does not fit a's 16 columns")
            # out dtype
            expect(IA, f, a, w.T, out_dtype=E4, **ok, words="never fp8")
            expect(IA, f, a, w.T, out_dtype="float8_e5m2", **ok, words="never fp8")
            expect(IA, f, a, w.T, out_dtype="int8", **ok, words="writes bf16, fp16 or fp32")
            # scales
            expect(IA, f, a, w.T, b_scale=sb, dtype=E4, words="a_scale missing")
            expect(IA, f, a, w.T, a_scale=sa, dtype=E4, words="b_scale missing")
            expect(IA, f, a, w.T, dtype=E4, words="a_scale and b_scale missing")
            expect(IA, f, a, w.T, a_scale=scale_array(c, np.ones(2), (2,)), b_scale=sb,
                   dtype=E4, words="a_scale: 2 elements fit neither scale mode")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=scale_array(c, np.ones(n + 1), (n + 1,)),
                   dtype=E4, words="b_scale: 7 elements fit neither scale mode")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=scale_array(c, np.ones(m), (m,)),
                   dtype=E4, words="(row-wise: one per n, a column of b")
            expect(IA, f, a, w.T, a_scale=c.zeros((m,), "fp16"), b_scale=sb, dtype=E4,
                   words="scales are float32")
            expect(IA, f, a, w.T, a_scale=np.ones(m, np.float32), b_scale=sb, dtype=E4,
                   words="not in memory from this client")
            expect(IA, f, a, w.T, a_scale=other.zeros((m,)), b_scale=sb, dtype=E4,
                   words="not in memory from this client")
            expect(IA, f, a, w.T, a_scale=c.zeros((m, 2))[:, 0], b_scale=sb, dtype=E4,
                   words="not one after the other")
            expect(IA, f, a, w.T, a_scale=c.zeros((m, 1, 1)), b_scale=sb, dtype=E4,
                   words="3 dimensions")
            expect(IA, f, a, w.T, a_scale=c.zeros((0,)), b_scale=sb, dtype=E4, words="empty")
            expect(IA, f, a, w.T, a_scale=[1.0], b_scale=sb, dtype=E4, words="a list")
            # bias
            expect(IA, f, a, w.T, bias=c.zeros((n,), "fp32"), **ok,
                   words="bias: dtype fp32, the output's is bf16")
            expect(IA, f, a, w.T, bias=c.zeros((n + 1,), "bf16"), **ok,
                   words="bias: 7 elements, b has 6 columns")
            expect(IA, f, a, w.T, bias=c.zeros((n,), "fp16"), out_dtype="fp32", **ok,
                   words="the output's is fp32")
            # the rest
            expect(IA, f, a, w.T, fast_accum=1, **ok, words="fast_accum: True or False")
            expect(IA, f, a, w.T, out=c.zeros((m, n), "fp32"), out_dtype="bf16", **ok,
                   words="out: dtype fp32, out_dtype bf16")
            expect(IA, f, a, w.T, out=c.zeros((m + 1, n), "bf16"), **ok, words="expected 4 x 6")
            ro = c.zeros((m, n), "bf16")
            ro.flags.writeable = False
            expect(IA, f, a, w.T, out=ro, **ok, words="read-only")
            expect(IA, f, a, w.T, stream=1, **ok, words="no stream")
            expect(IA, f, a, w.T, algo="bogus", **ok, words="algo 'bogus'")
            expect(IA, f, a, w.T, chunks=2 ** 32, **ok, words="chunks")
            expect(IA, f, np.zeros((m, k), np.uint8), w.T, **ok,
                   words="not in memory from this client")
            # a CUDA array on the host backend, and hostile interface values
            expect(IA, f, FakeCuda((m, k)), w.T, **ok,
                   words="a CUDA array, but ovld runs the host backend")
            expect(IA, f, FakeCuda((2 ** 70, k)), w.T, **ok, words="out of range")
            expect(IA, f, FakeCuda((m, k), strides=(2 ** 64, 1)), w.T, **ok,
                   words="out of range")
            expect(IA, f, FakeCuda((m, k), "<f4"), w.T, **ok, words="a scaled op's A and B")
            shared = c.zeros((m + m, max(n, k)), "bf16")
            expect(IA, f, a, w.T, out=shared[:m, :n], bias=shared[m - 1, :n], **ok,
                   words="overlaps")
        # several Bs: a list of b_scale (and bias, and out) of one per B
        expect(IA, ag, a, [w.T, w.T], **ok, words="b_scale: a list of 2, one per B")
        expect(IA, ag, a, [w.T, w.T], a_scale=sa, b_scale=[sb, sb], bias=[None, sb],
               words="given for some Bs only")
        expect(IA, ag, a, w.T, out=[c.zeros((m, n), "bf16")], **ok,
               words="a list for a single b")
        expect(IA, ag, a, w.T, a_out=c.zeros((m, k), "fp32"), **ok, words="a_out")
        expect(IA, ag, a, w.T, a_out=c.zeros((m + 1, k), E4).view(np.uint8), **ok,
               words="a_out: 5 x 16, expected 4 x 16")
        expect(IA, rs, a, w.T, reduce_op="max", **ok, words="reduce_op")
        expect(IA, rs, a, w.T, algo="push2", **ok, words="auto, naive, collective, ring, push")
        if ml_dtypes is not None:
            am = fp8_array(c, rng.uniform(-2, 2, (m, k)), E4, True)
            wm = fp8_array(c, rng.uniform(-2, 2, (n, k)), E4, True)
            expect(IA, ag, am, wm.T, a_scale=sa, b_scale=sb, dtype=E5,
                   words="a: holds fp8e4m3, but dtype names fp8e5m2")
            expect(IA, ag, am, wm.T, a_scale=sa, b_scale=sb, dtype=(E4, E5),
                   words="b: holds fp8e4m3, but dtype names fp8e5m2")
            expect(IA, ag, am, wm.T, a_scale=sa, b_scale=sb, a_out=c.zeros((m, k), E5),
                   words="a_out: holds fp8e5m2, but dtype names fp8e4m3")
            # an fp8 array without scales is a scaled op that lacks them
            expect(IA, ag, am, wm.T, words="a_scale and b_scale missing")
        # m not a multiple of the world: ranks 0 and 1 of one job on this
        # client (joined, nothing sent)
        two = [c.comm(job + "-w2", 2, r, 0) for r in (0, 1)]
        a3 = fp8_array(c, rng.uniform(-2, 2, (3, k)), E4, False)
        expect(IA, two[0].matmul_reduce_scatter, a3, w.T, a_scale=scale_array(c, np.ones(1),
                                                                                (1,)),
               b_scale=sb, dtype=E4, words="not a multiple of the world 2")
        bias = c.zeros((n,), "bf16")
        expect(IA, two[0].matmul_reduce_scatter, a, w.T, reduce_op="avg", algo="ring", bias=bias,
               **ok, words="algo ring with a bias and avg")
        for t in two:
            t.close()
        comm.check()
        assert ops_by_kind(d) == before, (before, ops_by_kind(d))
        # the comm works after all of it
        out = ag(a, w.T, **ok)
        want = reference_of(a, w, sa, sb)
        assert np.linalg.norm(as_f64(out, "bf16") - want) <= 1e-2 * np.linalg.norm(want)
        out = rs(a, w, transb=True, out_dtype="fp32", **ok)
        assert np.linalg.norm(as_f64(out, "fp32") - want) <= 1e-5 * np.linalg.norm(want)
        if ml_dtypes is not None:
            # ml_dtypes arrays and codes mixed: the codes named by dtype=;
            # a_out allocated as a is given (ml_dtypes here)
            am = fp8_array(c, rng.uniform(-2, 2, (m, k)), E4, True)
            out, a_all = ag(am, w.T, a_scale=sa, b_scale=sb, dtype=E4, out_dtype="fp32",
                            return_a=True)
            assert a_all.dtype == am.dtype and np.array_equal(a_all.view(np.uint8),
                                                              am.view(np.uint8))
            want = reference_of(am, w, sa, sb)
            assert np.linalg.norm(out - want) <= 1e-5 * np.linalg.norm(want)
        comm.close()


def test_block_refusals():
    """Block scales refused in words, before anything is sent (ovld counts
    no op, the comm works after): A by 128x128 tile, block scales with
    tensor or row scales, A's 1x128 rows (this rank's m; GEMM + reduce-
    scatter: M / world) and B's 1x128 n not in fours, shapes that fit no
    mode, Bs of differing modes in one op, a block scale that needs a copy
    but is not this client's memory."""
    d = daemon()
    with ovl.connect(d.socket) as c:
        job = c.new_job_id("pyscaled-block-bad")
        comm = c.comm(job, 1, 0, 0)
        before = ops_by_kind(d)
        m, n, k = 8, 12, 256  # two blocks of k
        rng = np.random.default_rng(11)
        a = fp8_array(c, rng.uniform(-2, 2, (m, k)), E4, False)
        w = fp8_array(c, rng.uniform(-2, 2, (n, k)), E4, False)
        sa = scale_array(c, rng.uniform(0.5, 1, (m, 2)), (m, 2))
        sb = scale_array(c, rng.uniform(0.5, 1, (n, 2)), (n, 2))
        sb_tile = scale_array(c, rng.uniform(0.5, 1, (1, 2)), (1, 2))
        IA = ovl.InvalidArgument
        ag, rs = comm.all_gather_matmul, comm.matmul_reduce_scatter
        mixing = "block scales (1x128, 128x128) go with block scales on the other operand"
        for f in (ag, rs):
            # A by 128x128 tile (ceil(8/128) x 2): ovl cuts A by rows
            expect(IA, f, a, w.T, a_scale=sb_tile, b_scale=sb, dtype=E4,
                   words="A's scales by 128x128 tile (1 x 2 for a's m x k = 8 x 256): not taken "
                         "(ovl cuts A by rows")
            # block with tensor or row scales
            expect(IA, f, a, w.T, a_scale=scale_array(c, np.ones(1), (1,)), b_scale=sb,
                   dtype=E4, words="a_scale of shape (1,) (tensor-wise) and b_scale of shape "
                                   "(12, 2) (1x128 block scales): " + mixing)
            expect(IA, f, a, w.T, a_scale=sa, b_scale=scale_array(c, np.ones(n), (1, n)),
                   dtype=E4, words="(row-wise): " + mixing)
            expect(IA, f, a, w.T, a_scale=scale_array(c, np.ones(m), (m, 1)), b_scale=sb_tile,
                   dtype=E4, words="(128x128 block scales): " + mixing)
            # shapes that fit no mode
            expect(IA, f, a, w.T, a_scale=scale_array(c, np.ones((m, 3)), (m, 3)), b_scale=sb,
                   dtype=E4, words="a_scale: 24 elements fit neither scale mode")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=scale_array(c, np.ones((n, 3)), (n, 3)),
                   dtype=E4, words="nor is its shape (12, 3) block scales': 1x128 (12, 2)")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=scale_array(c, np.ones((2, n)), (2, n)),
                   dtype=E4, words="128x128 (1, 2), one per 128 x 128 tile")
            # B's 1x128 n in fours (with 128x128 n is free: below)
            w6 = fp8_array(c, rng.uniform(-2, 2, (6, k)), E4, False)
            expect(IA, f, a, w6.T, a_scale=sa, b_scale=scale_array(c, np.ones((6, 2)), (6, 2)),
                   dtype=E4, words="B's 1x128 scales need n in multiples of 4 (cuBLASLt lays "
                                   "each 128 of k's scales out by columns of op(B), 16-byte "
                                   "aligned): n = 6")
            # a block scale laid out so that it needs a copy, not of this client's memory
            expect(IA, f, a, w.T, a_scale=np.ones((2, m), np.float32).T, b_scale=sb, dtype=E4,
                   words="a_scale: not in memory from this client")
            expect(IA, f, a, w.T, a_scale=sa, b_scale=sb, dtype=E4, out_dtype="fp32",
                   bias=c.zeros((n,), "bf16"), words="bias: dtype bf16")
        # torch._scaled_mm's square 128x128 scale_b (column-major): would
        # read transposed, so refused with the fix in words
        w256 = fp8_array(c, rng.uniform(-2, 2, (256, k)), E4, False)
        sb_cols = scale_array(c, rng.uniform(0.5, 1, (2, 2)), (2, 2), layout="cols")
        for f in (ag, rs):
            expect(IA, f, a, w256.T, a_scale=sa, b_scale=sb_cols, dtype=E4,
                   words="b_scale: a square (2, 2) 128x128 scale laid out column-major")
        # A's 1x128 rows in fours: this rank's m (all-gather)
        a6 = fp8_array(c, rng.uniform(-2, 2, (6, k)), E4, False)
        expect(IA, ag, a6, w.T, a_scale=scale_array(c, np.ones((6, 2)), (6, 2)), b_scale=sb,
               dtype=E4, words="a_scale: 1x128 (6, 2): A's 1x128 scales need its rows in "
                               "multiples of 4 (cuBLASLt lays each 128 of k's scales out by "
                               "rows, 16-byte aligned): this rank's m = 6 rows")
        expect(IA, rs, a6, w.T, a_scale=scale_array(c, np.ones((6, 2)), (6, 2)), b_scale=sb,
               dtype=E4, words="M / world = 6 / 1 = 6 rows")
        # several Bs share their scales' mode
        expect(IA, ag, a, [w.T, w.T], a_scale=sa, b_scale=[sb, sb_tile], dtype=E4,
               words="b[1]: its dtype, the output's dtype and its scales' mode must be b[0]'s")
        # GEMM + reduce-scatter: each rank's block of the output in fours, M / world
        two = [c.comm(job + "-w2", 2, r, 0) for r in (0, 1)]
        a12 = fp8_array(c, rng.uniform(-2, 2, (12, k)), E4, False)
        expect(IA, two[0].matmul_reduce_scatter, a12, w.T,
               a_scale=scale_array(c, np.ones((12, 2)), (12, 2)), b_scale=sb, dtype=E4,
               words="each rank's block of the output, M / world = 12 / 2 = 6 rows")
        for t in two:
            t.close()
        comm.check()
        assert ops_by_kind(d) == before, (before, ops_by_kind(d))
        # the comm works after, with B's 128x128 scales at n = 6 (not in fours)
        sb6 = scale_array(c, np.array([0.5, 2.0]), (1, 2))
        sa_v = sa.astype(np.float64)
        want = scaled_mm(ovl.fp8_to_float32(a, E4).astype(np.float64),
                         ovl.fp8_to_float32(w6, E4).astype(np.float64), sa_v,
                         np.array([0.5, 2.0]), "1x128", "128x128")
        for f in (ag, rs):
            out = f(a, w6.T, a_scale=sa, b_scale=sb6, dtype=E4, out_dtype="fp32")
            assert np.linalg.norm(out - want) <= 1e-5 * np.linalg.norm(want), f
        comm.close()


def reference_of(a, w, sa, sb):
    A = ovl.fp8_to_float32(a, E4).astype(np.float64)
    W = ovl.fp8_to_float32(w, E4).astype(np.float64)
    return sa.astype(np.float64).reshape(-1, 1) * sb.astype(np.float64).reshape(1, -1) * (A @ W.T)


def test_unscaled_unchanged():
    """The unscaled ops as before: uint8 arrays and fp8 without scales are
    refused as they were, fp32 runs."""
    d = daemon()
    with ovl.connect(d.socket) as c, c.comm(c.new_job_id("pyscaled-plain"), 1, 0, 0) as comm:
        x = c.zeros((3, 4), "fp32")
        y = c.zeros((4, 2), "fp32")
        expect(ovl.InvalidArgument, comm.all_gather_matmul, c.zeros((3, 4), E4).view(np.uint8),
               y, words="dtype uint8; ovl takes float32")
        assert comm.all_gather_matmul(x, y).shape == (3, 2)
        assert comm.matmul_reduce_scatter(x, y).shape == (3, 2)


def test_daemon_stops_clean():
    d = daemon()
    rc = d.stop()
    text = d.log_text()
    assert rc == 0 and "Sanitizer" not in text and "runtime error" not in text, (rc, text[-3000:])


if __name__ == "__main__":
    try:
        run_tests([test_fp8_codes, test_empty_fp8, test_ag_world_1, test_ag_world_2,
                   test_rs_world_1, test_rs_world_2, test_block_ag, test_block_rs,
                   test_refusals, test_block_refusals, test_unscaled_unchanged,
                   test_one_comm_varied_scaling, test_ag_several_bs, test_daemon_stops_clean])
    finally:
        if D is not None:
            D.cleanup()
