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

Each figure is ovl-bench's: `iters` ops back to back on the rank's current
stream after `warmup` untimed ones, a CUDA event after each op, the median of
the per-op times, the maximum over ranks; measured in --rounds rounds (fused
and unfused alternating) of which the fastest counts, because PyTorch's
fused op varies from run to run (2 x H200, 4096x4096x4096: 0.21 to 0.66 ms
in five processes): ovl is compared with PyTorch at its best. The fused
op's C is checked against the unfused one (relative Frobenius error,
ovl-bench's tolerance).

Output (stdout, rank 0), one line per shape, for ovl-bench to read:

  torch-peer: shape MxKxN fused MS unfused MS rel_err E rounds F1/F2/...
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
    ap.add_argument("--dtype", choices=sorted(TOLERANCE), default="bf16")
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
    for M, K, _ in args.shapes:
        if M % args.world:
            ap.error("shape with M=%d: not divisible by the world (%d)" % (M, args.world))
        if args.op == "rs" and K % args.world:
            ap.error("--op rs, shape with K=%d: not divisible by the world (%d)"
                     % (K, args.world))
    return args


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
    n = min(math.ceil(args.settle_ms / op_ms), 5000) if op_ms > 0 else 0
    return max(n, args.warmup)


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
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    rs = args.op == "rs"
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
            rounds = []
            for _ in range(args.rounds):
                warm = settle_ops(args, M, K, N)
                t = [per_op_ms(torch, fused, warm, args.iters),
                     per_op_ms(torch, unfused, warm, args.iters)]
                v = torch.tensor(t, device="cuda", dtype=torch.float64)
                dist.all_reduce(v, op=dist.ReduceOp.MAX)  # the slowest rank, per round
                rounds.append(v.tolist())
            # a NaN may vanish in a max reduction: every non-finite error is inf
            v = torch.tensor([err if math.isfinite(err) else math.inf], device="cuda",
                             dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
            err = v.item()
            t_fused = min(r[0] for r in rounds)
            t_unf = min(r[1] for r in rounds)
            ok = math.isfinite(err) and err < TOLERANCE[args.dtype]  # ovl-bench's test
            failed |= not ok
            line = "shape %s fused %.4f unfused %.4f rel_err %.3e rounds %s%s" % (
                name, t_fused, t_unf, err, "/".join("%.4f" % r[0] for r in rounds),
                "" if ok else " FAIL")
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


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
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
    want = "fused_matmul_reduce_scatter" if args.op == "rs" else "fused_all_gather_matmul"
    if not hasattr(torch.ops, "symm_mem") or not hasattr(torch.ops.symm_mem, want):
        skip("torch %s has no torch.ops.symm_mem.%s" % (torch.__version__, want))
    ngpu = torch.cuda.device_count()
    if ngpu < args.world:
        skip("world %d needs %d GPUs, one rank each; %d here" % (args.world, args.world, ngpu))
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
