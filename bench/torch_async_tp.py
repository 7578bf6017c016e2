"""A compiled tensor-parallel block under torch.compile's micro-pipeline TP
pass, three ways in one run: without the pass (all_gather, matmuls,
reduce_scatter by NCCL), with the pass and PyTorch's own symm_mem kernels,
and with the pass and ovl installed (ovl.torch.install(): the same
symm_mem ops through ovld). Used by tests/gpu/test_gpu_torch_tp.py (small
shapes: outputs and gradients checked, ovld's op counts) and as a
benchmark (--bench: the time per training step, forward and backward, of
Llama-3 8B and 70B MLP layers).

The block is a Llama MLP in TorchTitan's sequence-parallel style, on a
torch.distributed group of W ranks (one GPU each, NCCL): x is this rank's
S/W rows of the sequence (dimension 1 of B x S x D); it is all-gathered,
multiplied by this rank's column shards of w1 and w3 (F/W rows each),
SwiGLU'd, multiplied by this rank's row shard of w2 (D x F/W), and the
partial sums reduce-scattered back along the sequence. The collectives are
functional collectives with autograd, so the backward holds the mirrored
all-gather + matmul and matmul + reduce-scatter, which the pass fuses too.

    torchrun --nproc-per-node 2 bench/torch_async_tp.py --bench   # under ovld
"""
import argparse
import math
import os
import re
import statistics
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

# (name, D, F, B, S): Llama-3 8B and 70B MLPs
SHAPES = [("llama3-8b mlp", 4096, 14336, 1, 8192), ("llama3-70b mlp", 8192, 28672, 1, 4096)]
WAYS = ("nopass", "torch", "ovl")


def make_block(torch, funcol, gname):
    import torch.nn.functional as F

    def block(x_shard, w1, w3, w2):
        x = funcol.all_gather_tensor_autograd(x_shard, gather_dim=1, group=gname)
        h = F.silu(torch.matmul(x, w1.t())) * torch.matmul(x, w3.t())
        y = torch.matmul(h, w2.t())
        return funcol.reduce_scatter_tensor_autograd(y, "sum", scatter_dim=1, group=gname)
    return block


def make_params(torch, D, F, rank, world, dtype, dev, seed=1234):
    """This rank's shards of full weights drawn from one seed (equal on every
    rank), as leaf tensors that take gradients."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(F, D, generator=g) / math.sqrt(D)
    w3 = torch.randn(F, D, generator=g) / math.sqrt(D)
    w2 = torch.randn(D, F, generator=g) / math.sqrt(F)
    f = F // world
    rows = slice(rank * f, (rank + 1) * f)
    return [t.to(device=dev, dtype=dtype).requires_grad_(True)
            for t in (w1[rows].contiguous(), w3[rows].contiguous(), w2[:, rows].contiguous())]


def make_input(torch, B, S, D, rank, world, dtype, dev, seed=99):
    g = torch.Generator().manual_seed(seed + rank)
    return torch.randn(B, S // world, D, generator=g).to(device=dev, dtype=dtype) \
        .requires_grad_(True)


def compile_way(torch, way, block):
    """block compiled for `way` (the pass on or off; ovl installed or not)."""
    import torch._dynamo
    import ovl.torch as otorch
    torch._dynamo.reset()
    torch._inductor.config._micro_pipeline_tp = way != "nopass"
    if way == "ovl":
        otorch.install()
    else:
        otorch.uninstall()
    return torch.compile(block, fullgraph=True)


def train_step(f, x, params):
    for p in [x] + params:
        p.grad = None
    out = f(x, *params)
    loss = out.float().pow(2).mean()
    loss.backward()
    return out, [x.grad] + [p.grad for p in params]


def fused_ops_in(torch, f, x, params):
    """The first step of f with its generated code: (result, grads, the
    symm_mem ops each generated module calls: forward's, then backward's)."""
    from torch._inductor.utils import run_and_get_code
    (out, grads), codes = run_and_get_code(lambda: train_step(f, x, params))
    return out, grads, [sorted(set(re.findall(r"symm_mem\.(\w+)", c))) for c in codes]


def enable_symm_mem(gname):
    """The pass fuses only for groups symmetric memory is on for (2.11
    deprecates the call, which it still reads)."""
    import torch.distributed._symmetric_memory as sm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        sm.enable_symm_mem_for_group(gname)


def time_steps(torch, dist, f, x, params, warmup, iters):
    """Median ms per step (forward and backward) over iters after warmup,
    the slowest rank's."""
    for _ in range(warmup):
        train_step(f, x, params)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        train_step(f, x, params)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    med = torch.tensor([statistics.median(ts)], device=x.device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return med.item()


def ovld_caveats():
    """Lines that say why the ovl column may not be ovl's own cost: calls
    handed back to PyTorch (no ovld, no libovl), or an ovld on GPUs without
    MPS (each op waits for a time slice: docs/performance.md)."""
    import ovl
    try:
        with ovl.connect() as c:
            st = c.status()
    except Exception as e:  # the ovl column then fell back: stats() says so too
        return ["ovld: not reachable from here (%s): the ovl column is not ovl's" % e]
    devs = st.get("devices", [])
    if st.get("backend") == "cuda" and any(not d.get("mps") for d in devs):
        return ["ovld: MPS is not running on every GPU: each op waits for a time slice "
                "(about 2 ms), so the ovl column is not ovl's own cost"]
    return []


def bench(shapes, warmup, iters, out):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import ovl.torch as otorch
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    gname = dist.group.WORLD.group_name
    enable_symm_mem(gname)
    block = make_block(torch, funcol, gname)
    rows = []
    for name, D, F, B, S in shapes:
        params = make_params(torch, D, F, rank, world, torch.bfloat16, dev)
        x = make_input(torch, B, S, D, rank, world, torch.bfloat16, dev)
        ms = {}
        for way in WAYS:
            f = compile_way(torch, way, block)
            _, _, per = fused_ops_in(torch, f, x, params)
            ops = sorted(set(o for p in per for o in p))
            ms[way] = time_steps(torch, dist, f, x, params, warmup, iters)
            if rank == 0:
                print("%-16s %-7s %8.3f ms/step  fused ops: %s" % (name, way, ms[way],
                                                                  ", ".join(ops) or "none"),
                      flush=True)
        rows.append((name, D, F, B, S, ms))
    otorch.uninstall()
    st = otorch.stats()
    caveats = ovld_caveats() if rank == 0 else []
    if rank == 0:
        lines = ["| block | D | F | B x S | no pass | pass, PyTorch's kernels | pass, ovl | "
                 "ovl / PyTorch's | ovl / no pass |", "|---|---|---|---|---|---|---|---|---|"]
        for name, D, F, B, S, ms in rows:
            lines.append("| %s | %d | %d | %d x %d | %.3f | %.3f | %.3f | %.2f | %.2f |" % (
                name, D, F, B, S, ms["nopass"], ms["torch"], ms["ovl"],
                ms["ovl"] / ms["torch"], ms["ovl"] / ms["nopass"]))
        text = "\n".join(lines + ["", "ovl.torch.stats(): %s" % st] + caveats)
        print(text)
        if out:
            with open(out, "a") as fh:
                fh.write("\nworld %d, bf16, torch %s, ms per training step (forward and "
                         "backward), median of %d after %d:\n\n%s\n" % (
                             world, torch.__version__, iters, warmup, text))
    otorch.shutdown()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="store_true", help="time the Llama-3 shapes (torchrun)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--results", default="", help="append the table to this file")
    a = ap.parse_args()
    if not a.bench:
        ap.error("--bench (tests/gpu/test_gpu_torch_tp.py runs the checks)")
    bench(SHAPES, a.warmup, a.iters, a.results)


if __name__ == "__main__":
    main()
