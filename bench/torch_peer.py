#!/usr/bin/env python3
"""torch_peer: PyTorch's own fused all-gather + matmul (or, with --op rs,
matmul + reduce-scatter), timed as ovl-bench times ovl, for ovl-bench's
table (its --torch-peer option runs this script).

W rank processes (spawned; rank r on GPU r; one rank per GPU, since NCCL and
PyTorch's symmetric memory cannot put two ranks on one GPU) form a
torch.distributed group on NCCL and time, for each shape M x K x N (M the
gathered rows, each rank holding M/W of them) on random data:

  fused    torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0,
           group_name, return_A=False): PyTorch's pipelined all-gather +
           matmul on symmetric memory (what ovl's Python package replaces);
  unfused  dist.all_gather_into_tensor + torch.mm, PyTorch's plain way.

With --op rs each shape is M x K x N with K the whole inner dimension (each
rank holding A M x K/W and B K/W x N, and keeping M/W rows of the sum, as
ovl-bench --op rs):

  fused    torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0,
           group_name): PyTorch's produce-and-push pipeline on symmetric
           memory;
  unfused  torch.mm into the M x N partials + dist.reduce_scatter_tensor.

With an fp8 --dtype (fp8e4m3 or fp8e5m2: A's; B's is --b-dtype, fp8e4m3
unless given; C's --out-dtype, bf16 unless given; --scale tensor, row,
1x128 or 128x128, row unless given, for both sides, or --a-scale and
--b-scale for one, as ovl-bench's; --fast-accum) the ops are PyTorch's
scaled ones, on the layouts torch._scaled_mm takes: A row-major, B a
transposed N x k weight (k x N, column-major), fp32 scales; by tensor two
0-dim tensors (A's the same on every rank: the fused op scales every
gathered row by the rank's own), by row A_scale (rows, 1) and B_scale
(1, N); by block (DeepSeek-V3's; block with block, A never 128x128, as
ovl's rule) A_scale 1x128 (rows, ceil(k/128)) with strides (1, rows)
(outer-dim-major: its transpose is dense), B_scale 1x128 (ceil(k/128),
N) dense (so that B_scale.t(), the weight's, is (N, ceil(k/128)) with
strides (1, N)) and 128x128 (ceil(k/128), ceil(N/128)) with strides (1,
ceil(k/128)) (B_scale.t() dense, row-major over the weight's tiles):

  fused    torch.ops.symm_mem.fused_all_gather_scaled_matmul(A_shard, [B],
           A_scale, [B_scale], 0, group_name, [None], [None], [out_dtype],
           [use_fast_accum]) (by row A_scale is (M/W, 1): "row-wise
           sharded", gathered with the rows); --op rs:
           fused_scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, "sum",
           0, 0, group_name, [M, N], None, None, out_dtype, use_fast_accum);
  unfused  dist.all_gather_into_tensor of A's bytes (and by row of A_scale)
           + torch._scaled_mm; --op rs: torch._scaled_mm into the M x N
           partials in out_dtype + dist.reduce_scatter_tensor in out_dtype.

With block scales the unfused op gathers A_scale too (its dense transpose,
then laid out as torch._scaled_mm takes it). PyTorch's fused scaled ops
(2.15) take A's scales by tensor or row only: fused_all_gather_scaled_matmul
classifies A_scale by its leading dims (a (rows, ceil(K/128)) shard is
neither a tensor's, a row-wise shard's nor a replicated one's) and
fused_scaled_matmul_reduce_scatter cuts a dense row-major copy of it, which
torch._scaled_mm's 1x128 recipe (strides (1, rows)) refuses. So with block
scales the fused op runs only where this PyTorch takes them (probed on GPU
0, below: the ag op's own classification, the rs op's cut scales through
torch._scaled_mm); elsewhere its figure is nan, said on the shape's line
("fused not run: ..."), and only the unfused op is timed and checked.

Both are then checked against an fp32 product of the dequantized inputs
(torch.mm of A * A_scale and B * B_scale in fp32, each element times its
own block's scales with block scales; --op rs: each rank's,
reduce-scattered in fp32), with ovl-bench's tolerance of the output dtype
(bf16 1e-2, fp16 2e-3, fp32 5e-4, twice that with --fast-accum); rel_err is
the worse of the two. Before any rank starts, one small torch._scaled_mm on
GPU 0 with the run's dtypes, scales and output tells whether this PyTorch
takes the combination at all (its row-wise kernels did not take every output
dtype in every release): if not, the script skips (exit 77) naming
PyTorch's refusal. --dry-run needs no GPU: it parses the arguments, builds
every shape's tensors as the ranks would, on fake CUDA tensors (shapes,
strides, dtypes; no data), passes them through torch._scaled_mm's and the
fused ops' own shape checks, and checks the fp32 reference against
torch._scaled_mm on a small CPU example (tensor-wise: the CPU's only
kind), and with block scales the dequantization against a loop over the
blocks on a small CPU example.

Each figure is ovl-bench's: `iters` ops back to back on the rank's current
stream after `warmup` untimed ones, a CUDA event after each op, the median of
the per-op times, the maximum over ranks; measured in --rounds rounds (fused
and unfused alternating) of which the fastest counts, because PyTorch's
fused op varies from run to run (2 x H200, 4096x4096x4096: 0.21 to 0.66 ms
in five processes): ovl is compared with PyTorch at its best. The fused
op's C is checked against the unfused one (relative Frobenius error,
ovl-bench's tolerance); fp8: both against an fp32 reference (above).

Output (stdout, rank 0), one line per shape, for ovl-bench to read:

  torch-peer: shape MxKxN fused MS unfused MS rel_err E rounds F1/F2/...
  (fused nan, rounds of the unfused op and "(fused not run: WHY)" where
  PyTorch's fused op does not take the run's block scales)
  torch-peer: shape MxKxN error TEXT            (that shape failed)

after a first line `torch-peer: torch VERSION, world W, GPU NAME`. Exit
status: 0 when every shape ran and passed its check, 1 otherwise, 2 for bad
arguments, 77 where it cannot run (no torch, no CUDA, fewer GPUs than ranks,
world 1), with the reason on stdout as `torch-peer: skip: REASON`.

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set here unless
the environment sets them: NVLink multicast can take shared GPUs out of
service.
"""
import argparse
import math
import os
import sys
import tempfile
import traceback
import warnings

TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}  # ovl-bench's
# ovl-bench's for a scaled (fp8) op, by output dtype; twice that with fast
# accumulation (client/demo_scaled.h, ovl_demo_scaled_tolerance)
FP8_TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 5e-4}
FP8_DTYPES = ("fp8e4m3", "fp8e5m2")
SCALE_MODES = ("tensor", "row", "1x128", "128x128")
BLOCK = 128  # the side of a scale block
SEED = 0x746F726368


def parse_shape(text):
    parts = text.lower().split("x")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 3 or min(vals) <= 0:
        raise argparse.ArgumentTypeError("%r: MxKxN with positive integers" % text)
    return vals


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="torch_peer.py",
        description="PyTorch's fused_all_gather_matmul and its unfused all-gather + mm (--op "
                    "rs: fused_matmul_reduce_scatter and mm + reduce-scatter), timed as "
                    "ovl-bench times ovl (one rank per GPU).")
    ap.add_argument("--world", type=int, required=True, help="ranks, one per GPU (2 or more)")
    ap.add_argument("--shapes", required=True,
                    type=lambda s: [parse_shape(t) for t in s.split(",") if t],
                    help="MxKxN,... with M the gathered rows, divisible by the world (--op "
                    "rs: K too, the whole inner dimension)")
    ap.add_argument("--dtype", choices=sorted(TOLERANCE) + list(FP8_DTYPES), default="bf16",
                    help="A's (and B's and C's unless fp8); fp8e4m3 or fp8e5m2: PyTorch's "
                    "scaled ops (default bf16)")
    ap.add_argument("--b-dtype", choices=FP8_DTYPES, default=None,
                    help="fp8 only: B's (default fp8e4m3; not e5m2 with e5m2)")
    ap.add_argument("--out-dtype", choices=sorted(FP8_TOLERANCE), default=None,
                    help="fp8 only: C's (default bf16)")
    ap.add_argument("--scale", choices=SCALE_MODES, default=None,
                    help="fp8 only: both sides' scales: tensor, row, 1x128 or 128x128 (B "
                    "only) (default row)")
    ap.add_argument("--a-scale", choices=SCALE_MODES, default=None,
                    help="fp8 only: A's scales alone (over --scale): tensor, row or 1x128")
    ap.add_argument("--b-scale", choices=SCALE_MODES, default=None,
                    help="fp8 only: B's scales alone (over --scale); block scales go with "
                    "block scales (--a-scale 1x128 --b-scale 128x128: DeepSeek-V3's)")
    ap.add_argument("--fast-accum", action="store_true",
                    help="fp8 only: use_fast_accum (its tolerance is twice the dtype's)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: parse, build every shape's tensors as fake CUDA tensors "
                    "through PyTorch's shape checks, check the reference on a small CPU "
                    "example, print what would run")
    ap.add_argument("--op", choices=("ag", "rs"), default="ag",
                    help="ag: fused_all_gather_matmul (default); rs: "
                    "fused_matmul_reduce_scatter, K the whole inner dimension")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--settle-ms", type=int, default=300,
                    help="and at least about this many ms of untimed ops per measurement, "
                    "estimated from the shape's flop as ovl-bench does")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of both measurements; the fastest counts (default 3)")
    args = ap.parse_args(argv)
    if args.world < 1 or args.world > 64:
        ap.error("--world: 1 to 64")
    if args.iters < 1 or args.warmup < 0 or not 1 <= args.rounds <= 20 or \
            not 0 <= args.settle_ms <= 60000:
        ap.error("--iters >= 1, --warmup >= 0, --rounds 1 to 20, --settle-ms 0 to 60000")
    if not args.shapes:
        ap.error("--shapes: no shape")
    args.fp8 = args.dtype in FP8_DTYPES
    if not args.fp8:
        if args.b_dtype or args.out_dtype or args.scale or args.a_scale or args.b_scale or \
                args.fast_accum:
            ap.error("--b-dtype, --out-dtype, --scale, --a-scale, --b-scale and --fast-accum "
                     "are for an fp8 --dtype")
    else:
        args.b_dtype = args.b_dtype or "fp8e4m3"
        args.out_dtype = args.out_dtype or "bf16"
        both = args.scale or "row"
        args.a_scale = args.a_scale or both
        args.b_scale = args.b_scale or both
        if args.dtype == "fp8e5m2" and args.b_dtype == "fp8e5m2":
            ap.error("--dtype fp8e5m2 with --b-dtype fp8e5m2: no fp8 GEMM takes e5m2 twice")
        # ovl's rule of the modes (common/scaling.c), which ovl-bench applies
        if args.a_scale == "128x128":
            ap.error("A's scales by 128x128 tile: not taken (ovl cuts A by rows); A takes "
                     "1x128 (--a-scale 1x128 --b-scale 128x128)")
        if is_block(args.a_scale) != is_block(args.b_scale):
            ap.error("scales %s/%s: block scales (1x128, 128x128) go with block scales on the "
                     "other operand" % (args.a_scale, args.b_scale))
        for M, K, N in args.shapes:
            k = K // args.world if args.op == "rs" else K
            if k % 16 or N % 16:
                ap.error("fp8, shape %dx%dx%d: torch._scaled_mm needs %s and N multiples of 16"
                         % (M, K, N, "K/W" if args.op == "rs" else "K"))
    for M, K, _ in args.shapes:
        if M % args.world:
            ap.error("shape with M=%d: not divisible by the world (%d)" % (M, args.world))
        if args.op == "rs" and K % args.world:
            ap.error("--op rs, shape with K=%d: not divisible by the world (%d)"
                     % (K, args.world))
    return args


def is_block(mode):
    """Whether a scale mode is a block one (1x128, 128x128)."""
    return mode in ("1x128", "128x128")


def blocks(n):
    """ceil(n / 128): the blocks of 128 over n."""
    return -(-n // BLOCK)


def skip(reason):
    print("torch-peer: skip: %s" % reason, flush=True)
    sys.exit(77)


def settle_ops(args, M, K, N):
    """ovl-bench's settle_ops: --warmup, raised to about --settle-ms of work
    at 800 TFLOP/s, at most 5000 ops, so that every measurement starts on a
    GPU at its sustained clock (--op rs: a rank's GEMM is K/W deep)."""
    op_ms = 2.0 * M * N * K / 800e12 * 1e3
    if args.op == "rs":
        op_ms /= args.world
    if args.dtype in FP8_DTYPES:  # ovl-bench's rate for fp8: twice bf16's
        op_ms /= 2
    n = min(math.ceil(args.settle_ms / op_ms), 5000) if op_ms > 0 else 0
    return max(n, args.warmup)


def fp8_tolerance(args):
    """ovl-bench's tolerance of a scaled op: its output dtype's, twice that
    with fast accumulation."""
    tol = FP8_TOLERANCE[args.out_dtype]
    return 2 * tol if args.fast_accum else tol


def torch_dtypes(torch, args):
    """A's, B's and C's torch dtypes of an fp8 run."""
    f8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
    out = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    return f8[args.dtype], f8[args.b_dtype], out[args.out_dtype]


def scaled_inputs(torch, args, M, K, N, rand, rand_common, device):
    """One rank's inputs of an fp8 shape, in the layouts torch._scaled_mm
    takes: A row-major (ag: the shard, M/W x K; rs: M x K/W); W the weight,
    N x k (k: K, or K/W with --op rs), whose transpose B (k x N,
    column-major) is the GEMM's B; A_scale and B_scale fp32, by tensor 0-dim
    tensors (A's from rand_common, the same on every rank), by row (rows of
    A, 1) and (1, N), by block the module docstring's layouts: A 1x128
    (rows, ceil(k/128)) with strides (1, rows), B 1x128 (ceil(k/128), N)
    dense, B 128x128 (ceil(k/128), ceil(N/128)) with strides (1,
    ceil(k/128)). rand(*shape): uniform [0, 1) fp32 on device. Data in
    [-1, 1) rounded to fp8, never zeros; scales in [0.5, 1), as ovl-bench's
    (client/demo_scaled.h)."""
    a_dt, b_dt, _ = torch_dtypes(torch, args)
    rs = args.op == "rs"
    rows, k = (M, K // args.world) if rs else (M // args.world, K)
    kq = blocks(k)
    A = (rand(rows, k) * 2 - 1).to(a_dt)
    W = (rand(N, k) * 2 - 1).to(b_dt)
    if args.a_scale == "row":
        A_scale = rand(rows, 1) * 0.5 + 0.5
    elif args.a_scale == "1x128":  # outer-dim-major: its transpose is dense
        A_scale = (rand(kq, rows) * 0.5 + 0.5).t()
    else:
        A_scale = (rand_common() * 0.5 + 0.5).to(device)
    if args.b_scale == "row":
        B_scale = rand(1, N) * 0.5 + 0.5
    elif args.b_scale == "1x128":  # B_scale.t(): (N, kq), strides (1, N)
        B_scale = rand(kq, N) * 0.5 + 0.5
    elif args.b_scale == "128x128":  # B_scale.t(): (ceil(N/128), kq), dense
        B_scale = (rand(blocks(N), kq) * 0.5 + 0.5).t()
    else:
        B_scale = rand(()) * 0.5 + 0.5
    return A, W, W.t(), A_scale, B_scale


def dequant(X, S, mode, weight):
    """X (fp8, rows x k: A, or the N x k weight) in fp32 times its scales S
    as torch._scaled_mm reads them for mode: A's S (rows, 1) or (rows,
    ceil(k/128)); the weight's (weight true) its B_scale (1, N), (ceil(k/128),
    N) or (ceil(k/128), ceil(N/128)), transposed here; 0-dim by tensor. With
    block scales each element takes its own block's."""
    x = X.float()
    if mode == "tensor":
        return x * S
    s = S.t() if weight else S  # (rows, 1), (rows, kq) or (ceil(rows/128), kq)
    if mode == "128x128":
        s = s.repeat_interleave(BLOCK, dim=0)[:x.shape[0]]
    if is_block(mode):
        s = s.repeat_interleave(BLOCK, dim=1)[:, :x.shape[1]]
    return x * s


def scaled_reference(torch, args, Ag, Ag_scale, W, B_scale):
    """The fp32 product of the dequantized inputs: dequant(Ag) @ dequant(W)^T,
    W being B's N x k weight (torch.mm in fp32, no TF32): with block scales
    the sum over the blocks of 128 of k of each block's product times its
    scales."""
    a = dequant(Ag, Ag_scale, args.a_scale, False)
    w = dequant(W, B_scale, args.b_scale, True)
    return torch.mm(a, w.t())


def per_op_ms(torch, fn, warmup, iters):
    """ovl-bench's measure: the median of back-to-back per-op times, from a
    CUDA event after each op on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    t = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))
    n = len(t)
    return t[n // 2] if n % 2 else (t[n // 2 - 1] + t[n // 2]) / 2


def time_shape(torch, dist, args, name, shape, fused, unfused, err, tol, fused_why=None):
    """One shape's timing and verdict, every rank: args.rounds rounds of
    fused and unfused (each the slowest rank's), the fastest round counting,
    and err the worst rank's (a non-finite one as inf, which a max
    reduction cannot lose). fused None (PyTorch's fused op does not take
    the run's scales, fused_why says why): unfused alone, the fused figure
    nan and the rounds the unfused op's. Returns (the line, whether err <
    tol)."""
    M, K, N = shape
    rounds = []
    for _ in range(args.rounds):
        warm = settle_ops(args, M, K, N)
        t = [per_op_ms(torch, fused, warm, args.iters) if fused else -1.0,
             per_op_ms(torch, unfused, warm, args.iters)]
        v = torch.tensor(t, device="cuda", dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)  # the slowest rank, per round
        rounds.append(v.tolist())
    v = torch.tensor([err if math.isfinite(err) else math.inf], device="cuda",
                     dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    err = v.item()
    t_unf = min(r[1] for r in rounds)
    ok = math.isfinite(err) and err < tol  # ovl-bench's test
    if fused:
        line = "shape %s fused %.4f unfused %.4f rel_err %.3e rounds %s%s" % (
            name, min(r[0] for r in rounds), t_unf, err, "/".join("%.4f" % r[0] for r in rounds),
            "" if ok else " FAIL")
    else:  # ovl-bench reads nan as no figure; its FAIL test must not see the words
        line = "shape %s fused nan unfused %.4f rel_err %.3e rounds %s%s (fused not run: %s)" % (
            name, t_unf, err, "/".join("%.4f" % r[1] for r in rounds), "" if ok else " FAIL",
            (fused_why or "?").replace("FAIL", "fail"))
    return line, ok


def rank_main(rank, args, init_file):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank,
                            world_size=args.world, device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    gname = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # needed before 2.9, deprecated (and not needed) since
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            try:
                enable(gname)
            except Exception:  # noqa: BLE001 - newer releases need no enabling
                pass
    rs = args.op == "rs"
    if args.fp8:
        return rank_main_scaled(torch, dist, rank, args, group, gname)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    op = torch.ops.symm_mem.fused_matmul_reduce_scatter if rs else \
        torch.ops.symm_mem.fused_all_gather_matmul
    gen = torch.Generator(device="cuda")
    if rank == 0:
        print("torch-peer: torch %s, world %d, GPU %s" % (
            torch.__version__, args.world, torch.cuda.get_device_name()), flush=True)
    failed = False
    for M, K, N in args.shapes:
        name = "%dx%dx%d" % (M, K, N)
        line = None
        try:
            gen.manual_seed(SEED + rank)
            # never zeros (ovl-bench's data are not either): uniform in [-1, 1)
            if rs:  # A M x K/W, B K/W x N; the partials M x N, C M/W x N
                kw = K // args.world
                A = (torch.rand(M, kw, device="cuda", generator=gen) * 2 - 1).to(dtype)
                B = (torch.rand(kw, N, device="cuda", generator=gen) * 2 - 1).to(dtype)
                Ag = torch.empty(M, N, device="cuda", dtype=dtype)
                C = torch.empty(M // args.world, N, device="cuda", dtype=dtype)

                def unfused():
                    torch.mm(A, B, out=Ag)
                    dist.reduce_scatter_tensor(C, Ag, group=group)

                def fused():
                    return op(A, B, "sum", 0, gname)
            else:
                A = (torch.rand(M // args.world, K, device="cuda", generator=gen) * 2 - 1).to(dtype)
                B = (torch.rand(K, N, device="cuda", generator=gen) * 2 - 1).to(dtype)
                Ag = torch.empty(M, K, device="cuda", dtype=dtype)
                C = torch.empty(M, N, device="cuda", dtype=dtype)

                def unfused():
                    dist.all_gather_into_tensor(Ag, A, group=group)
                    torch.mm(Ag, B, out=C)

                def fused():
                    return op(A, [B], 0, gname, return_A=False)

            unfused()
            ref = C.float()
            got = (fused() if rs else fused()[1][0]).float()
            err = ((got - ref).norm() / ref.norm()).item()
            line, ok = time_shape(torch, dist, args, name, (M, K, N), fused, unfused, err,
                                  TOLERANCE[args.dtype])
            failed |= not ok
            del A, B, Ag, C, ref, got
        except Exception as ex:  # noqa: BLE001 - one shape's failure is reported, then the next
            failed = True
            line = "shape %s error %s" % (name, " ".join(repr(ex).split())[:300])
            # the ranks may now disagree on the collectives they issued: stop here
            print("torch-peer: " + line, flush=True)
            raise
        if rank == 0:
            print("torch-peer: " + line, flush=True)
        torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        sys.exit(1)


def describe(args):
    """The run's dtypes in ovl-bench's words: "fp8e4m3 x fp8e4m3 -> bf16,
    scales row/row" (", fast_accum")."""
    return "%s x %s -> %s, scales %s/%s%s" % (args.dtype, args.b_dtype, args.out_dtype,
                                              args.a_scale, args.b_scale,
                                              ", fast_accum" if args.fast_accum else "")


def scaled_ops(torch, dist, args, group, gname, M, K, N, A, W, B, A_scale, B_scale,
               device="cuda"):
    """One fp8 shape's fused and unfused ops over one rank's inputs (on
    device), and the tensors they write: (fused, unfused, C, extra),
    fused() returning its C (None where PyTorch's fused op does not take
    the run's scales: args.fused_why), unfused() writing C; extra: --op
    ag's gathered A and its scales (by tensor A_scale itself; by 1x128 the
    gathered (M, ceil(K/128)) with strides (1, M)), which unfused()
    writes."""
    _, _, out_dt = torch_dtypes(torch, args)
    fast = args.fast_accum
    take_fused = getattr(args, "fused_why", None) is None
    if args.op == "rs":  # A M x K/W, B K/W x N; the partials M x N, C M/W x N
        P = torch.empty(M, N, device=device, dtype=out_dt)
        C = torch.empty(M // args.world, N, device=device, dtype=out_dt)

        def unfused():
            torch._scaled_mm(A, B, A_scale, B_scale, out_dtype=out_dt, use_fast_accum=fast,
                             out=P)
            dist.reduce_scatter_tensor(C, P, group=group)

        def fused():
            return torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                A, B, A_scale, B_scale, "sum", 0, 0, gname, [M, N], None, None, out_dt, fast)
        return fused if take_fused else None, unfused, C, None
    # the shard m x K; the gathered A M x K, and its scales: by row M x 1, by
    # 1x128 the shards' dense transposes gathered (W ceil(K/128) x m), then
    # laid out as one (ceil(K/128), M) whose transpose torch._scaled_mm takes
    row, blk = args.a_scale == "row", args.a_scale == "1x128"
    kq, m = blocks(K), M // args.world
    Ag = torch.empty(M, K, device=device, dtype=A.dtype)
    if blk:
        G = torch.empty(args.world * kq, m, device=device, dtype=torch.float32)
        St = torch.empty(kq, M, device=device, dtype=torch.float32)
        Sg = St.t()
    else:
        Sg = torch.empty(M, 1, device=device, dtype=torch.float32) if row else A_scale
    C = torch.empty(M, N, device=device, dtype=out_dt)

    def unfused():  # fp8 gathered as bytes; the scales (by row) as the fallback does
        dist.all_gather_into_tensor(Ag.view(torch.uint8), A.view(torch.uint8), group=group)
        if row:
            dist.all_gather_into_tensor(Sg, A_scale, group=group)
        elif blk:  # A_scale.t() is dense (kq, m): rank r's lands in G's rows [r kq, (r+1) kq)
            dist.all_gather_into_tensor(G, A_scale.t(), group=group)
            St.view(kq, args.world, m).copy_(G.view(args.world, kq, m).transpose(0, 1))
        torch._scaled_mm(Ag, B, Sg, B_scale, out_dtype=out_dt, use_fast_accum=fast, out=C)

    def fused():
        return torch.ops.symm_mem.fused_all_gather_scaled_matmul(
            A, [B], A_scale, [B_scale], 0, gname, [None], [None], [out_dt], [fast])[1][0]
    return fused if take_fused else None, unfused, C, (Ag, Sg)


def rank_main_scaled(torch, dist, rank, args, group, gname):
    """rank_main for an fp8 --dtype: PyTorch's scaled fused op and its
    unfused equivalent, each checked against an fp32 product of the
    dequantized inputs, timed as rank_main times the unscaled ones; the
    same output lines."""
    rs = args.op == "rs"
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is plain fp32
    gen = torch.Generator(device="cuda")
    common = torch.Generator()  # A's tensor scale: the same on every rank
    if rank == 0:
        print("torch-peer: torch %s, world %d, GPU %s, %s" % (
            torch.__version__, args.world, torch.cuda.get_device_name(), describe(args)),
            flush=True)
    failed = False
    tol = fp8_tolerance(args)
    for M, K, N in args.shapes:
        name = "%dx%dx%d" % (M, K, N)
        line = None
        try:
            gen.manual_seed(SEED + rank)
            common.manual_seed(SEED)
            A, W, B, A_scale, B_scale = scaled_inputs(
                torch, args, M, K, N,
                lambda *shape: torch.rand(*shape, device="cuda", generator=gen),
                lambda: torch.rand((), generator=common), "cuda")
            fused, unfused, C, extra = scaled_ops(torch, dist, args, group, gname, M, K, N, A, W,
                                                  B, A_scale, B_scale)
            unfused()
            got_unf = C.float()
            got = fused().float() if fused else None
            # the reference: fp32 of the dequantized inputs
            if rs:  # every rank's product, summed by a reduce-scatter in fp32
                part = scaled_reference(torch, args, A, A_scale, W, B_scale)
                ref = torch.empty(M // args.world, N, device="cuda", dtype=torch.float32)
                dist.reduce_scatter_tensor(ref, part, group=group)
                del part
            else:  # the gathered A (and scales) the unfused op gathered
                Ag, Sg = extra
                ref = scaled_reference(torch, args, Ag, Sg, W, B_scale)
            rn = ref.norm()
            err = ((got_unf - ref).norm() / rn).item()
            if got is not None:
                err = max(err, ((got - ref).norm() / rn).item())
            del got_unf, ref
            line, ok = time_shape(torch, dist, args, name, (M, K, N), fused, unfused, err, tol,
                                  getattr(args, "fused_why", None))
            failed |= not ok
            del A, W, B, A_scale, B_scale, C, extra, got
        except Exception as ex:  # noqa: BLE001 - reported, then the ranks stop
            failed = True
            line = "shape %s error %s" % (name, " ".join(repr(ex).split())[:300])
            # the ranks may now disagree on the collectives they issued: stop here
            print("torch-peer: " + line, flush=True)
            raise
        if rank == 0:
            print("torch-peer: " + line, flush=True)
        torch.cuda.empty_cache()
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        sys.exit(1)


def probe_args(args):
    """A small shape's arguments for the probes: world 2, the run's dtypes
    and modes; (args, (M, K, N)) with k = 512 and m = 256 rows a rank (so
    that every block count is a multiple of 4: PyTorch's 128x128 layout has
    been padded to fours in some releases, and then agrees)."""
    small = argparse.Namespace(**dict(vars(args), world=2))
    return small, ((256, 1024, 256) if args.op == "rs" else (512, 512, 256))


def probe_scaled(torch, args):
    """Whether this PyTorch takes the run's scaled op, asked on GPU 0 with a
    small shape (probe_args): (why, fused_why). why None if
    torch._scaled_mm takes the run's dtypes, scales (in the layouts the
    ranks give it), output and accumulation, else its refusal in one line.
    fused_why None if PyTorch's fused op takes the run's A scales (by
    tensor and row: always; by 1x128: fused_all_gather_scaled_matmul's own
    classification of the shard's scales, fused_scaled_matmul_reduce_scatter's
    dense cut of them through torch._scaled_mm), else why not."""
    _, _, out_dt = torch_dtypes(torch, args)
    dev = torch.device("cuda", 0)
    small, (M, K, N) = probe_args(args)
    gen = torch.Generator(device=dev).manual_seed(SEED)
    A, _, B, A_scale, B_scale = scaled_inputs(
        torch, small, M, K, N, lambda *shape: torch.rand(*shape, device=dev, generator=gen),
        lambda: torch.rand(()), dev)
    try:
        torch._scaled_mm(A, B, A_scale, B_scale, out_dtype=out_dt, use_fast_accum=args.fast_accum)
        torch.cuda.synchronize(dev)
    except Exception as ex:  # noqa: BLE001 - the refusal is the answer
        return " ".join(str(ex).split())[:300], None
    if not is_block(args.a_scale):
        return None, None
    try:
        if args.op == "rs":  # what fused_scaled_matmul_reduce_scatter hands each chunk's GEMM
            torch._scaled_mm(A.chunk(2)[0], B, A_scale.contiguous().chunk(2)[0], B_scale,
                             out_dtype=out_dt, use_fast_accum=args.fast_accum)
            torch.cuda.synchronize(dev)
        else:
            from torch.distributed._symmetric_memory import (
                _check_and_verify_fp8_all_gather_scale_mode as scale_mode)
            scale_mode(A, A_scale, 0, small.world)
    except Exception as ex:  # noqa: BLE001 - the refusal is the answer
        return None, "torch %s's %s does not take A's %s scales (%s)" % (
            torch.__version__, "fused_scaled_matmul_reduce_scatter" if args.op == "rs" else
            "fused_all_gather_scaled_matmul", args.a_scale, " ".join(str(ex).split())[:200])
    return None, None


def check_scale_layouts(args, A, W, A_scale, B_scale):
    """The strides torch._scaled_mm's CUDA recipes check (its meta checks
    only the shapes), for A (rows x k) and the N x k weight W: by 1x128 A's
    scales (rows, ceil(k/128)) with strides (1, rows), B's scales' transpose
    (N, ceil(k/128)) with strides (1, N); by 128x128 B_scale.t()
    (ceil(N/128), ceil(k/128)) with strides (ceil(k/128), 1). Raises
    ValueError."""
    rows, k = A.shape
    N, kq = W.shape[0], blocks(k)
    want = []
    if args.a_scale == "1x128":
        want.append(("A_scale", A_scale, (rows, kq), (1, rows)))
    if args.b_scale == "1x128":
        want.append(("B_scale.t()", B_scale.t(), (N, kq), (1, N)))
    elif args.b_scale == "128x128":
        want.append(("B_scale.t()", B_scale.t(), (blocks(N), kq), (kq, 1)))
    for what, t, shape, stride in want:
        # a dimension of one has no stride to speak of
        got = tuple(st for st, sz in zip(t.stride(), t.shape) if sz > 1)
        need = tuple(st for st, sz in zip(stride, shape) if sz > 1)
        if tuple(t.shape) != shape or got != need:
            raise ValueError("%s is %s stride %s, not %s stride %s (torch._scaled_mm's %s)"
                             % (what, tuple(t.shape), tuple(t.stride()), shape, stride,
                                args.a_scale + "/" + args.b_scale))


def check_dequant(torch, args, gen):
    """The reference's dequantization (dequant) by the run's modes against
    the definition, block by block in float64, on a CPU example of 8 x 300
    by a 136 x 300 weight (k not a multiple of 128, N past one tile): sum
    over q of sa(i, q) sb(j, q) sum_{l in q} A[i][l] W[j][l]. 0 if they agree
    to 1e-6, else 1; said."""
    small = argparse.Namespace(**dict(vars(args), op="ag", world=1))
    rand = lambda *shape: torch.rand(*shape, generator=gen)  # noqa: E731
    A, W, _, A_scale, B_scale = scaled_inputs(torch, small, 8, 300, 136, rand, lambda: rand(()),
                                              "cpu")
    got = scaled_reference(torch, small, A, A_scale, W, B_scale).double()
    a, w = A.double(), W.double()
    ref = torch.zeros(8, 136, dtype=torch.float64)
    for q in range(blocks(300)):
        ks = slice(q * BLOCK, min((q + 1) * BLOCK, 300))
        sa = {"tensor": lambda: A_scale.double().expand(8, 1),
              "row": lambda: A_scale.double(),
              "1x128": lambda: A_scale.double()[:, q:q + 1]}[args.a_scale]()
        sb = {"tensor": lambda: B_scale.double().expand(1, 136),
              "row": lambda: B_scale.double(),
              "1x128": lambda: B_scale.double()[q:q + 1, :],
              "128x128": lambda: B_scale.double()[q, torch.arange(136) // BLOCK][None, :],
              }[args.b_scale]()
        ref += sa * sb * (a[:, ks] @ w[:, ks].t())
    err = ((got - ref).norm() / ref.norm()).item()
    ok = err < 1e-6
    print("torch-peer: dry-run: the reference's dequantization by %s/%s against the blocks' "
          "sum (8x300x136, on the CPU): rel_err %.3e %s"
          % (args.a_scale, args.b_scale, err, "ok" if ok else "FAIL"), flush=True)
    return 0 if ok else 1


def dry_run(args):
    """--dry-run: what the ranks would build and call, through PyTorch's own
    shape checks on fake CUDA tensors (no GPU, no data), and the fp32
    reference against torch._scaled_mm on a small CPU example. 0, or 1
    with the failure said."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    print("torch-peer: dry-run: torch %s, world %d, --op %s, %s" % (
        torch.__version__, args.world, args.op,
        describe(args) if args.fp8 else args.dtype), flush=True)
    if not args.fp8:
        for M, K, N in args.shapes:
            print("torch-peer: dry-run: shape %dx%dx%d ok" % (M, K, N))
        return 0
    try:  # the fused ops' classification of A's scale (ag)
        from torch.distributed._symmetric_memory import (
            _check_and_verify_fp8_all_gather_scale_mode as scale_mode)
    except ImportError:
        scale_mode = None
    rc = 0
    for M, K, N in args.shapes:
        name = "%dx%dx%d" % (M, K, N)
        try:
            with FakeTensorMode():
                A, W, B, A_scale, B_scale = scaled_inputs(
                    torch, args, M, K, N,
                    lambda *shape: torch.empty(*shape, device="cuda"),
                    lambda: torch.empty(()), "cuda")
                _, _, out_dt = torch_dtypes(torch, args)
                check_scale_layouts(args, A, W, A_scale, B_scale)
                if args.op == "rs":  # the rank's partials, as the fused op's fallback
                    C = torch._scaled_mm(A, B, A_scale, B_scale, out_dtype=out_dt,
                                         use_fast_accum=args.fast_accum)
                    want = (M, N)
                    if args.a_scale != "tensor" and A_scale.shape[:-1] != A.shape[:-1]:
                        raise ValueError("A_scale %s is not row-wise for A %s"
                                         % (tuple(A_scale.shape), tuple(A.shape)))
                    mode = "tensor-wise" if A_scale.numel() == 1 else \
                        "row-wise" if args.a_scale == "row" else "block-wise"
                else:  # the gathered A and scales, as the unfused op's
                    Ag = torch.empty(M, K, device="cuda", dtype=A.dtype)
                    Sg = torch.empty(M, 1, device="cuda") if args.a_scale == "row" else \
                        torch.empty(blocks(K), M, device="cuda").t() if args.a_scale == "1x128" \
                        else A_scale
                    check_scale_layouts(args, Ag, W, Sg, B_scale)
                    C = torch._scaled_mm(Ag, B, Sg, B_scale, out_dtype=out_dt,
                                         use_fast_accum=args.fast_accum)
                    want = (M, N)
                    if is_block(args.a_scale):  # the fused op's word on it (probe_scaled)
                        try:
                            mode = scale_mode(A, A_scale, 0, args.world).value \
                                if scale_mode else "?"
                        except ValueError:
                            mode = "block-wise: not PyTorch's fused op's"
                    else:
                        mode = scale_mode(A, A_scale, 0, args.world).value if scale_mode else "?"
                        expect = "row-wise-sharded" if args.a_scale == "row" else "tensor-wise"
                        if scale_mode and mode != expect:
                            raise ValueError("PyTorch reads A_scale %s as %s, not %s"
                                             % (tuple(A_scale.shape), mode, expect))
                if tuple(C.shape) != want or C.dtype != out_dt:
                    raise ValueError("C is %s %s, not %s %s" % (tuple(C.shape), C.dtype, want,
                                                                 out_dt))
                print("torch-peer: dry-run: shape %s A %s %s, B %s stride %s %s, A_scale %s "
                      "stride %s, B_scale %s stride %s (%s), torch._scaled_mm -> %s %s: ok" % (
                          name, tuple(A.shape), A.dtype, tuple(B.shape), tuple(B.stride()),
                          B.dtype, tuple(A_scale.shape), tuple(A_scale.stride()),
                          tuple(B_scale.shape), tuple(B_scale.stride()), mode, tuple(C.shape),
                          C.dtype), flush=True)
        except Exception as ex:  # noqa: BLE001 - said, then the next shape
            rc = 1
            print("torch-peer: dry-run: shape %s error %s"
                  % (name, " ".join(str(ex).split())[:300]), flush=True)
    # the reference's formula against torch._scaled_mm on the CPU, whose fp8
    # GEMM takes scales by tensor only: a 64 x 32 x 48 example
    gen = torch.Generator().manual_seed(SEED)
    rand = lambda *shape: torch.rand(*shape, generator=gen)  # noqa: E731
    small = argparse.Namespace(**dict(vars(args), a_scale="tensor", b_scale="tensor", op="ag",
                                      world=1))
    A, W, B, A_scale, B_scale = scaled_inputs(torch, small, 64, 32, 48, rand, lambda: rand(()),
                                              "cpu")
    _, _, out_dt = torch_dtypes(torch, args)
    if args.a_scale != "tensor" or args.b_scale != "tensor":
        rc |= check_dequant(torch, args, gen)
    try:
        got = torch._scaled_mm(A, B, A_scale, B_scale, out_dtype=out_dt).float()
        ref = scaled_reference(torch, small, A, A_scale, W, B_scale)
        err = ((got - ref).norm() / ref.norm()).item()
        ok = err < fp8_tolerance(args)
        rc |= 0 if ok else 1
        print("torch-peer: dry-run: reference vs torch._scaled_mm on the CPU (64x32x48, by "
              "tensor): rel_err %.3e %s" % (err, "ok" if ok else "FAIL"), flush=True)
    except RuntimeError as ex:  # a CPU build without fp8 GEMMs: nothing to compare
        print("torch-peer: dry-run: no CPU torch._scaled_mm to check the reference against (%s)"
              % " ".join(str(ex).split())[:200], flush=True)
    return rc


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.dry_run:
        return dry_run(args)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if args.world < 2:
        skip("world 1: there is nothing to %s" % ("reduce" if args.op == "rs" else "gather"))
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as ex:
        skip("no torch (%s)" % ex)
    if not torch.cuda.is_available():
        skip("torch sees no GPU")
    try:  # registers the torch.ops.symm_mem ops
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as ex:
        skip("torch %s has no symmetric memory (%s)" % (torch.__version__, ex))
    if args.fp8:
        want = "fused_scaled_matmul_reduce_scatter" if args.op == "rs" else \
            "fused_all_gather_scaled_matmul"
    else:
        want = "fused_matmul_reduce_scatter" if args.op == "rs" else "fused_all_gather_matmul"
    if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, want):
        skip("torch %s has no torch.ops.symm_mem.%s" % (torch.__version__, want))
    ngpu = torch.cuda.device_count()
    if ngpu < args.world:
        skip("world %d needs %d GPUs, one rank each; %d here" % (args.world, args.world, ngpu))
    if args.fp8:
        why, args.fused_why = probe_scaled(torch, args)
        if why:
            skip("torch %s's _scaled_mm does not take %s: %s" % (
                torch.__version__, describe(args), why))
        if args.fused_why:
            print("torch-peer: note: fused not run: %s" % args.fused_why, flush=True)
    with tempfile.TemporaryDirectory(prefix="torch-peer.") as d:
        try:
            mp.spawn(rank_main, args=(args, os.path.join(d, "init")), nprocs=args.world,
                     join=True)
        except mp.ProcessExitedException as ex:
            print("torch-peer: FAILED: rank %s exited with %s" % (ex.error_index, ex.exit_code),
                  flush=True)
            return 1
        except mp.ProcessRaisedException as ex:
            last = [ln for ln in str(ex).strip().splitlines() if ln.strip()]
            print("torch-peer: FAILED: %s" % (last[-1] if last else "a rank raised"), flush=True)
            return 1
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
