"""ovl.torch on the CUDA backend: a real ovld, WORLD rank processes
(--world, default 1) with torch.distributed, ranks round-robin over the GPUs.
torch.distributed runs NCCL when every rank has a GPU of its own, else gloo
(NCCL refuses two ranks on one GPU): then the reference all-gather and
ColumnParallelLinear's reduce-scatter go through float32 CPU copies.

Each rank checks (PyTorch's test/distributed/test_symmetric_memory.py
checks of fused_all_gather_matmul, ported):

- torch.ops.ovl.fused_all_gather_matmul against the unfused fallback
  (all-gather into a tensor, then matmul; PyTorch's
  _fused_all_gather_matmul_fallback): 3-D A_shard (8 x 64/world x 32),
  gather_dim 0, 1 and 2 (2: K gathered, Bs world*K x N), three Bs, Bs
  row-major, column-major (B.t() contiguous: transb) and mixed, float32 and
  bf16, return_A True and False: A equal exactly, every output within
  tolerance, and the strides of A and of every output equal the fallback's;
- bf16, M=4096 rows gathered, K=N=1024, 2-D, gather_dim 0, row- and
  column-major Bs;
- the fake impl: under FakeTensorMode the op gives the shapes, strides and
  dtypes the CUDA impl gave, for every gather_dim;
- torch.compile (inductor, fullgraph) of a function calling the op and using
  its outputs: equal to the eager result;
- ColumnParallelLinear (bias, 3-D input, gather_dim 1 as in sequence
  parallelism) against torch.nn.Linear holding the full weight, float32 and
  bf16: the output slice, the input's gradient (reduce-scatter), the weight's
  and bias's gradients, then 3 SGD steps with the same losses;
- a sequence-parallel MLP, ColumnParallelLinear -> GELU -> RowParallelLinear
  (biases, gather_dim 1), against nn.Linear -> GELU -> nn.Linear holding the
  full weights (load_full), run on the full data on every rank, float32 and
  bf16, 5 SGD steps: each step the loss (the ranks' losses all-reduced), this
  rank's output rows, the gradients of the four parameters against the
  reference's slices (RowParallelLinear's bias whole), the input's gradient
  (step 0); after the steps the parameters, and RowParallelLinear's bias
  equal on every rank (its gradient all-reduced);
- torch.ops.ovl.fused_matmul_reduce_scatter against matmul + reduce_scatter_tensor
  (PyTorch's _fused_matmul_reduce_scatter_fallback), where torch.distributed
  runs NCCL: 3-D A, scatter_dim 0, 1 and 2 (the last, by the transpose), B
  row- and column-major, sum and avg, float32 and bf16, the result
  contiguous (as PyTorch's op returns it) and the fake impl's shapes and
  strides those of the result; B's columns not split over the
  ranks refused with words for the last dimension. The MLP's
  RowParallelLinear forward and ColumnParallelLinear's input gradient run it
  there too;
- ovl.torch.install() (where torch.distributed runs NCCL, PyTorch 2.8 and
  later): PyTorch's AsyncTPTest checks through torch.ops.symm_mem with ovl
  installed, fused_all_gather_matmul over gather_dim 0, 1 and 2 (2, A's
  last, handed back to PyTorch's kernel) and fused_matmul_reduce_scatter
  over scatter_dim 0, 1 and 2, against PyTorch's _fused_*_fallback: values
  close, strides equal; ovld's stats count exactly the calls ovl took;
  after uninstall() the ops are PyTorch's again (ovld counts no more, the
  results still equal the fallback's);
- the stream contract through the op: on a non-default current stream, 100
  iterations of a producer kernel writing A_shard (distinct data per
  iteration and rank), the op (two Bs, return_A), consumer kernels copying A
  and the outputs into history tensors, with no synchronization until the
  end; then every iteration's A (exactly) and outputs against the reference.

Skips (exit 77, ctest's skip code) without torch, without a GPU, or when
ovld cannot start the CUDA backend. OVL_LIBRARY names the libovl the
package loads (ctest sets it to the built one)."""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from ovltest import share  # noqa: E402


def moved_strides(torch, t, gather_dim):
    """The strides of a tensor of t's shape, contiguous with gather_dim
    first (the last dimension gathered: plain contiguous)."""
    if gather_dim == t.dim() - 1:
        return torch.empty(t.shape, device="meta").stride()
    return torch.empty(t.movedim(gather_dim, 0).shape, device="meta").movedim(0, gather_dim).stride()


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


class Ref:
    """The unfused path: all_gather_into_tensor + matmul (PyTorch's
    _fused_all_gather_matmul_fallback), through NCCL or, on gloo, through
    float32 CPU copies (exact: bf16 and fp16 are float32 subsets)."""

    def __init__(self, torch, dist, world, nccl):
        self.torch, self.dist, self.world, self.nccl = torch, dist, world, nccl

    def all_gather_into_tensor(self, t):
        torch, dist = self.torch, self.dist
        t = t.contiguous()
        if self.world == 1:
            return t.clone()
        if self.nccl:
            out = t.new_empty((self.world * t.shape[0],) + tuple(t.shape[1:]))
            dist.all_gather_into_tensor(out, t)
            return out
        c = t.float().cpu()
        parts = [torch.empty_like(c) for _ in range(self.world)]
        dist.all_gather(parts, c)
        return torch.cat(parts).to(device=t.device, dtype=t.dtype)

    def fused_all_gather_matmul(self, A_shard, Bs, gather_dim, return_A=True):
        torch = self.torch
        ws = self.world
        A = self.all_gather_into_tensor(A_shard)
        if gather_dim == A.ndim - 1 or gather_dim == -1:
            A_mm = torch.cat(A.chunk(ws), dim=-1)
            res = [torch.matmul(A_mm, B) for B in Bs]
            return (A_mm if return_A else None), res
        A = A.view(ws, *A_shard.shape).movedim(gather_dim + 1, 1).flatten(0, 1)
        res = [torch.matmul(A, B).movedim(0, gather_dim) for B in Bs]
        return (A.movedim(0, gather_dim) if return_A else None), res


def check_op(torch, ref, gname, rank, world, dev, worst):
    op = torch.ops.ovl.fused_all_gather_matmul
    tol = {torch.float32: dict(rtol=5e-3, atol=5e-3),  # lets ovld's GEMM use TF32
           torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}
    BATCH, M, N, K = 8, 64, 16, 32
    n_cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        for gather_dim in (0, 1, 2):
            for layout in ("row", "col", "mixed"):
                for return_A in (True, False):
                    torch.manual_seed(42 + rank)
                    A_shard = torch.rand(BATCH, M // world, K, device=dev).to(dtype)
                    torch.manual_seed(7)  # the same Bs on every rank
                    kk = K * world if gather_dim == 2 else K
                    Bs = []
                    for i in range(3):
                        if layout == "col" or (layout == "mixed" and i == 1):
                            Bs.append(torch.rand(N + 8 * i, kk, device=dev).to(dtype).t())
                        else:
                            Bs.append(torch.rand(kk, N + 8 * i, device=dev).to(dtype))
                    what = "%s gather_dim %d %s-major Bs return_A %s" % (
                        str(dtype)[6:], gather_dim, layout, return_A)
                    A0, outs0 = ref.fused_all_gather_matmul(A_shard, Bs, gather_dim, return_A)
                    A1, outs1 = op(A_shard, Bs, gather_dim, gname, return_A=return_A)
                    torch.cuda.synchronize()
                    if return_A:
                        assert A1 is not None, what
                        assert torch.equal(A0, A1), "%s: A differs" % what
                        # world 1: the fallback's A is a view of A_shard's
                        # layout (a dimension of size 1 flattened), where
                        # PyTorch's CUDA impl (and ovl's) give the gathered
                        # layout: contiguous with gather_dim moved first
                        exp = A0.stride() if world > 1 else moved_strides(torch, A1, gather_dim)
                        assert A1.stride() == exp, "%s: A strides %s, fallback %s" % (
                            what, A1.stride(), exp)
                    else:
                        assert A1 is None, "%s: A returned" % what
                    assert len(outs1) == len(Bs), what
                    for j, (o0, o1) in enumerate(zip(outs0, outs1)):
                        assert o0.shape == o1.shape, "%s: out %d %s, fallback %s" % (
                            what, j, tuple(o1.shape), tuple(o0.shape))
                        assert o0.stride() == o1.stride(), "%s: out %d strides %s, fallback %s" % (
                            what, j, o1.stride(), o0.stride())
                        assert o1.dtype == dtype, what
                        torch.testing.assert_close(o1, o0, **tol[dtype], msg=lambda m: "%s: out %d: %s"
                                                   % (what, j, m))
                        key = "op " + str(dtype)[6:]
                        worst[key] = max(worst.get(key, 0.0), rel_err(o1, o0))
                    n_cases += 1
    # The large case: bf16, 4096 rows gathered, K = N = 1024.
    Mt, K2, N2 = 4096, 1024, 1024
    for layout in ("row", "col"):
        torch.manual_seed(1234 + rank)
        A_shard = torch.rand(Mt // world, K2, device=dev).to(torch.bfloat16)
        torch.manual_seed(99)
        if layout == "row":
            Bs = [torch.rand(K2, N2, device=dev).to(torch.bfloat16) for _ in range(2)]
        else:
            Bs = [torch.rand(N2, K2, device=dev).to(torch.bfloat16).t() for _ in range(2)]
        A0, outs0 = ref.fused_all_gather_matmul(A_shard, Bs, 0)
        A1, outs1 = op(A_shard, Bs, 0, gname)
        torch.cuda.synchronize()
        assert A1.shape == (Mt, K2) and torch.equal(A0, A1), "large %s: A differs" % layout
        assert A0.stride() == A1.stride()
        for o0, o1 in zip(outs0, outs1):
            assert o0.shape == o1.shape == (Mt, N2) and o0.stride() == o1.stride()
            torch.testing.assert_close(o1, o0, rtol=1.6e-2, atol=1e-2)
            worst["op large bf16"] = max(worst.get("op large bf16", 0.0), rel_err(o1, o0))
        n_cases += 1
    return n_cases


def check_rs_op(torch, dist, gname, rank, world, dev, worst):
    """torch.ops.ovl.fused_matmul_reduce_scatter against the unfused path
    (matmul, then reduce_scatter_tensor along scatter_dim; PyTorch's
    _fused_matmul_reduce_scatter_fallback): 3-D A (8 x 64 x 32/world: this
    rank's share of K), scatter_dim 0, 1 and 2 (the product's columns: by
    the transpose), B row- and column-major, sum and avg, float32 and bf16:
    outputs within tolerance, shapes and strides as the fake impl says. NCCL
    only (ovld's naive reduce-scatter needs it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    op = torch.ops.ovl.fused_matmul_reduce_scatter
    tol = {torch.float32: dict(rtol=5e-3, atol=5e-3),
           torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
    BATCH, M, N, K = 8, 64, 16, 32
    n_cases = 0
    for dtype in (torch.float32, torch.bfloat16):
        for sd in (0, 1, 2):
            for layout in ("row", "col"):
                for red in ("sum", "avg"):
                    torch.manual_seed(11 + rank)
                    A = torch.rand(BATCH, M, K // world, device=dev).to(dtype)
                    if layout == "row":
                        B = torch.rand(K // world, N, device=dev).to(dtype)
                    else:
                        B = torch.rand(N, K // world, device=dev).to(dtype).t()
                    what = "rs %s scatter_dim %d %s-major %s" % (str(dtype)[6:], sd, layout, red)
                    p = torch.matmul(A, B).float().movedim(sd, 0).contiguous()
                    want = p.new_empty((p.shape[0] // world,) + tuple(p.shape[1:]))
                    if world > 1:
                        dist.reduce_scatter_tensor(want, p)
                    else:
                        want.copy_(p)
                    if red == "avg":
                        want /= world
                    want = want.movedim(0, sd).to(dtype)
                    got = op(A, B, red, sd, gname)
                    torch.cuda.synchronize()
                    assert got.shape == want.shape, "%s: shape %s, not %s" % (
                        what, tuple(got.shape), tuple(want.shape))
                    with FakeTensorMode() as mode:
                        fake = op(mode.from_tensor(A), mode.from_tensor(B), red, sd, gname)
                    assert fake.shape == got.shape and fake.stride() == got.stride(), (
                        "%s: fake %s %s, real %s %s" % (what, tuple(fake.shape), fake.stride(),
                                                        tuple(got.shape), got.stride()))
                    # contiguous, as PyTorch's own op returns it (its fake
                    # kernel's strides, which Inductor holds kernels to)
                    assert got.is_contiguous(), "%s: strides %s" % (what, got.stride())
                    torch.testing.assert_close(got, want, **tol[dtype],
                                               msg=lambda m: "%s: %s" % (what, m))
                    key = "rs op " + str(dtype)[6:]
                    worst[key] = max(worst.get(key, 0.0), rel_err(got, want))
                    n_cases += 1
    # refusals, in words: B's columns that do not split over the ranks
    # (world > 1) for the last dimension
    if world > 1:
        A = torch.rand(4, 2 * world, 8, device=dev)
        B = torch.rand(8, 2 * world + 1, device=dev)
        try:
            op(A, B, "sum", 2, gname)
            raise AssertionError("scatter_dim 2 with B's columns not split over the ranks")
        except (ValueError, RuntimeError) as e:
            assert "not a multiple of the world" in str(e), e
    return n_cases



def ovld_ops(client, kind):
    """ovld's count of done ops of `kind` (all algorithms and dtypes)."""
    st = client.stats()["total"]
    return sum(o["count"] for o in st["ops"] if o["kind"] == kind)


def check_install(torch, dist, otorch, client, gname, rank, world, dev):
    """ovl.torch.install(): PyTorch's AsyncTPTest checks (its
    test/distributed/test_symmetric_memory.py), run through
    torch.ops.symm_mem with ovl installed. fused_all_gather_matmul: A_shard
    8 x 64 x 32 split along gather_dim 0, 1 and 2, three Bs 32 x 16, float32;
    against PyTorch's _fused_all_gather_matmul_fallback, A and outputs close
    and their strides equal (gather_dim 2, A's last, is PyTorch's kernel's:
    ovl hands it back, said once). fused_matmul_reduce_scatter: A 8 x 64 x
    1024, B 1024 x 16, avg, scatter_dim 0, 1 and 2, against
    _fused_matmul_reduce_scatter_fallback, close with equal strides. ovld
    counts exactly the calls ovl took; after uninstall() the op is
    PyTorch's own again (ovld counts nothing more, results still equal the
    fallback's). NCCL groups only (PyTorch's kernel needs its symmetric
    memory between the ranks' GPUs)."""
    import torch.distributed._symmetric_memory as sm
    tol = dict(rtol=1e-4, atol=1e-5)
    otorch._ROUTER.reset()
    assert otorch.install() is True and otorch.install() is False

    def ag_cases():
        BATCH, M, N, K = 8, 64, 16, 32
        for gd in (0, 1, 2):
            torch.manual_seed(42 + rank)
            shape = [BATCH, M, K]
            shape[gd] //= world
            A_shard = torch.rand(shape, device=dev)
            torch.manual_seed(7)
            Bs = [torch.rand(K, N, device=dev) for _ in range(3)]
            yield gd, A_shard, Bs

    def rs_cases():
        BATCH, M, N, K = 8, 64, 16, 1024
        for sd in (0, 1, 2):
            torch.manual_seed(11 + rank)
            A = torch.rand(BATCH, M, K, device=dev)
            torch.manual_seed(5 + rank)
            B = torch.rand(K, N, device=dev)
            yield sd, A, B

    def run_all(expect_ovl):
        ag0, rs0 = ovld_ops(client, "ag_gemm"), ovld_ops(client, "gemm_rs")
        taken = 0
        for gd, A_shard, Bs in ag_cases():
            what = "symm_mem.fused_all_gather_matmul gather_dim %d (%s)" % (
                gd, "installed" if expect_ovl else "uninstalled")
            A_ref, outs_ref = sm._fused_all_gather_matmul_fallback(A_shard, Bs, gd, gname)
            A, outs = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gd, gname)
            torch.cuda.synchronize()
            # strides: ovl's contract while installed (those of PyTorch's
            # Meta kernel, which Inductor asserts); PyTorch's own CUDA
            # kernel differs from its Meta kernel at world 1 (2.11, gather_dim
            # 1: A (32, 256, 1) against (2048, 32, 1)), so not checked there
            assert not expect_ovl or A.stride() == A_ref.stride(), (
                "%s: A strides %s, not %s" % (what, A.stride(), A_ref.stride()))
            torch.testing.assert_close(A, A_ref, rtol=0, atol=0, msg=lambda m: what + ": " + m)
            for o, r in zip(outs, outs_ref):
                assert not expect_ovl or o.stride() == r.stride(), (
                    "%s: strides %s, not %s" % (what, o.stride(), r.stride()))
                torch.testing.assert_close(o, r, **tol, msg=lambda m: what + ": " + m)
            taken += expect_ovl and gd != 2
        ag_taken = taken
        for sd, A, B in rs_cases():
            what = "symm_mem.fused_matmul_reduce_scatter scatter_dim %d (%s)" % (
                sd, "installed" if expect_ovl else "uninstalled")
            ref = sm._fused_matmul_reduce_scatter_fallback(A, B, "avg", sd, gname)
            got = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "avg", sd, gname)
            torch.cuda.synchronize()
            assert got.shape == ref.shape and (not expect_ovl or got.stride() == ref.stride()), (
                "%s: %s %s, not %s %s" % (what, tuple(got.shape), got.stride(),
                                          tuple(ref.shape), ref.stride()))
            torch.testing.assert_close(got, ref, **tol, msg=lambda m: what + ": " + m)
        rs_taken = 3 if expect_ovl else 0
        dist.barrier()
        # ovld counts a job's op once, when its completion is delivered
        # (its poller thread: a moment after the GPU is done): the ops this
        # job ran, whatever rank reads them
        deadline = time.monotonic() + 5
        while True:
            got = (ovld_ops(client, "ag_gemm") - ag0, ovld_ops(client, "gemm_rs") - rs0)
            if got == (ag_taken, rs_taken) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert got == (ag_taken, rs_taken), ("ovld counted (ag_gemm, gemm_rs) %s, ovl took %s"
                                             % (got, (ag_taken, rs_taken)))
        dist.barrier()
        return ag_taken, rs_taken

    ag_taken, rs_taken = run_all(True)
    st = otorch.stats()
    assert st["taken"] == {"fused_all_gather_matmul": ag_taken,
                           "fused_matmul_reduce_scatter": rs_taken}, st
    assert list(st["fell_back"].values()) == [1] and "gather_dim is A's last" in \
        list(st["fell_back"])[0], st
    assert otorch.uninstall() is True and not otorch.installed()
    run_all(False)
    assert otorch.stats()["taken"] == st["taken"], otorch.stats()
    return ag_taken + rs_taken


def check_fake(torch, gname, world, dev):
    from torch._subclasses.fake_tensor import FakeTensorMode
    op = torch.ops.ovl.fused_all_gather_matmul
    for gather_dim in (0, 1, 2):
        A_shard = torch.rand(4, 6, 8, device=dev)
        kk = 8 * world if gather_dim == 2 else 8
        Bs = [torch.rand(kk, 5, device=dev), torch.rand(7, kk, device=dev).t()]
        A1, outs1 = op(A_shard, Bs, gather_dim, gname)
        with FakeTensorMode() as mode:
            fa = mode.from_tensor(A_shard)
            fbs = [mode.from_tensor(b) for b in Bs]
            A2, outs2 = op(fa, fbs, gather_dim, gname)
            An, _ = op(fa, fbs, gather_dim, gname, return_A=False)
        assert An is None
        for r, f in zip([A1] + list(outs1), [A2] + list(outs2)):
            assert (tuple(r.shape), r.stride(), r.dtype) == (tuple(f.shape), f.stride(), f.dtype), (
                "fake impl, gather_dim %d: %s %s %s, CUDA impl %s %s %s" % (
                    gather_dim, tuple(f.shape), f.stride(), f.dtype, tuple(r.shape), r.stride(),
                    r.dtype))
            assert f.device == r.device


def check_compile(torch, gname, rank, dev):
    op = torch.ops.ovl.fused_all_gather_matmul

    def f(a, b0, b1):
        A, (c0, c1) = op(a, [b0, b1], 1, gname)
        return A.sum(dim=-1), torch.relu(c0) * 2, c1 + 1

    torch.manual_seed(5 + rank)
    a = torch.rand(4, 32, 64, device=dev, dtype=torch.bfloat16)
    torch.manual_seed(6)
    b0 = torch.rand(64, 48, device=dev, dtype=torch.bfloat16)
    b1 = torch.rand(80, 64, device=dev, dtype=torch.bfloat16).t()
    eager = f(a, b0, b1)
    compiled = torch.compile(f, fullgraph=True)(a, b0, b1)
    torch.cuda.synchronize()
    for e, c in zip(eager, compiled):
        assert e.shape == c.shape, (e.shape, c.shape)
        torch.testing.assert_close(c, e, rtol=1.6e-2, atol=1e-2)


def check_linear(torch, dist, otorch, rank, world, dev, nccl, worst):
    BATCH, S, IN, OUT = 4, 64, 128, 256
    for dtype, tol in ((torch.float32, 5e-3), (torch.bfloat16, 4e-2)):
        torch.manual_seed(11)  # the same full model and data on every rank
        ref = torch.nn.Linear(IN, OUT, bias=True, device=dev)
        with torch.no_grad():
            ref.weight.copy_(ref.weight.to(dtype).float())  # values dtype can hold
            ref.bias.copy_(ref.bias.to(dtype).float())
        layer = otorch.ColumnParallelLinear(IN, OUT, bias=True, gather_dim=1, dtype=dtype)
        layer.load_full(ref.weight.detach().to(dtype), ref.bias.detach().to(dtype))
        xs = [torch.randn(BATCH, S, IN, device=dev).to(dtype) for _ in range(3)]
        ol = OUT // world
        sl = slice(rank * ol, (rank + 1) * ol)
        rows = slice(rank * (S // world), (rank + 1) * (S // world))
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
        opt = torch.optim.SGD(layer.parameters(), lr=0.05)
        name = "linear " + str(dtype)[6:]
        for step, x_full in enumerate(xs):
            xr = x_full.detach().float().clone().requires_grad_(True)
            y_ref = ref(xr)
            loss_ref = (y_ref ** 2).mean()
            opt_ref.zero_grad()
            loss_ref.backward()
            x = x_full[:, rows].detach().clone().requires_grad_(True)
            y = layer(x)
            assert y.shape == (BATCH, S, ol) and y.dtype == dtype, (y.shape, y.dtype)
            # the full model's loss: the mean over every column of every rank
            loss = (y.float() ** 2).sum() / y_ref.numel()
            opt.zero_grad()
            loss.backward()
            t = loss.detach().float().reshape(1)
            if world > 1:
                t = t if nccl else t.cpu()
                dist.all_reduce(t)
            total = t.cpu()[0]
            errs = {
                "out": rel_err(y, y_ref[..., sl]),
                "loss": abs(total.item() - loss_ref.item()) / abs(loss_ref.item()),
                "grad_w": rel_err(layer.weight.grad, ref.weight.grad[sl]),
                "grad_b": rel_err(layer.bias.grad, ref.bias.grad[sl]),
            }
            if step == 0:
                errs["grad_x"] = rel_err(x.grad, xr.grad[:, rows])
            for what, e in errs.items():
                assert e < tol, "%s step %d: %s relative error %.3g (tolerance %g)" % (
                    name, step, what, e, tol)
                worst[name] = max(worst.get(name, 0.0), e)
            opt_ref.step()
            opt.step()
        w_err = rel_err(layer.weight, ref.weight[sl])
        assert w_err < tol, "%s: weights after 3 steps differ by %.3g" % (name, w_err)


def all_reduced(torch, dist, t, world, nccl):
    """The sum over the ranks of the scalar tensor t, as a float (NCCL: on
    the GPU; gloo: of a CPU copy)."""
    t = t.detach().float().reshape(1)
    if world > 1:
        t = t if nccl else t.cpu()
        dist.all_reduce(t)
    return t.cpu()[0].item()


def check_mlp(torch, dist, otorch, ref_ops, rank, world, dev, nccl, worst):
    BATCH, S, IN, HID, OUT, STEPS = 4, 64, 128, 256, 96, 5
    hl = HID // world
    hid = slice(rank * hl, (rank + 1) * hl)  # this rank's hidden features
    rows = slice(rank * (S // world), (rank + 1) * (S // world))
    for dtype, tol in ((torch.float32, 5e-3), (torch.bfloat16, 4e-2)):
        torch.manual_seed(13)  # the same full model and data on every rank
        fc1 = torch.nn.Linear(IN, HID, device=dev)
        fc2 = torch.nn.Linear(HID, OUT, device=dev)
        ref = torch.nn.Sequential(fc1, torch.nn.GELU(), fc2)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.to(dtype).float())  # values dtype can hold
        col = otorch.ColumnParallelLinear(IN, HID, bias=True, gather_dim=1, device=dev,
                                          dtype=dtype)
        row = otorch.RowParallelLinear(HID, OUT, bias=True, gather_dim=1, device=dev,
                                       dtype=dtype)
        col.load_full(fc1.weight.detach().to(dtype), fc1.bias.detach().to(dtype))
        row.load_full(fc2.weight.detach().to(dtype), fc2.bias.detach().to(dtype))
        model = torch.nn.Sequential(col, torch.nn.GELU(), row)
        # (name, the sharded model's parameter, the reference's, the part of it the rank holds)
        params = (("col.weight", col.weight, fc1.weight, lambda t: t[hid]),
                  ("col.bias", col.bias, fc1.bias, lambda t: t[hid]),
                  ("row.weight", row.weight, fc2.weight, lambda t: t[:, hid]),
                  ("row.bias", row.bias, fc2.bias, lambda t: t))
        data = [(torch.randn(BATCH, S, IN, device=dev).to(dtype),
                 torch.randn(BATCH, S, OUT, device=dev)) for _ in range(STEPS)]
        # lr 0.5: over the steps the parameters move by about 2 to 15 % of their largest values
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        name = "mlp " + str(dtype)[6:]
        for step, (x_full, target) in enumerate(data):
            xr = x_full.detach().float().clone().requires_grad_(True)
            y_ref = ref(xr)
            loss_ref = ((y_ref - target) ** 2).mean()
            opt_ref.zero_grad()
            loss_ref.backward()
            x = x_full[:, rows].detach().clone().requires_grad_(True)
            y = model(x)
            assert y.shape == (BATCH, S // world, OUT) and y.dtype == dtype, (y.shape, y.dtype)
            # this rank's rows' part of the full model's loss (the mean over every row)
            loss = ((y.float() - target[:, rows]) ** 2).sum() / y_ref.numel()
            opt.zero_grad()
            loss.backward()
            total = all_reduced(torch, dist, loss, world, nccl)
            errs = {
                "out": rel_err(y, y_ref[:, rows]),
                "loss": abs(total - loss_ref.item()) / abs(loss_ref.item()),
            }
            for pname, p, p_ref, part in params:
                errs["grad " + pname] = rel_err(p.grad, part(p_ref.grad))
            if step == 0:
                errs["grad_x"] = rel_err(x.grad, xr.grad[:, rows])
            for what, e in errs.items():
                assert e < tol, "%s step %d: %s relative error %.3g (tolerance %g)" % (
                    name, step, what, e, tol)
                worst[name] = max(worst.get(name, 0.0), e)
            opt_ref.step()
            opt.step()
        for pname, p, p_ref, part in params:
            e = rel_err(p.detach(), part(p_ref.detach()))
            assert e < tol, "%s: %s after %d steps differs by %.3g (tolerance %g)" % (
                name, pname, STEPS, e, tol)
        # the replicated bias: the same on every rank (its gradient all-reduced)
        biases = ref_ops.all_gather_into_tensor(row.bias.detach().reshape(1, OUT))
        for r in range(world):
            assert torch.equal(biases[r], biases[0]), (
                "%s: RowParallelLinear's bias differs between ranks 0 and %d after %d steps"
                % (name, r, STEPS))


def check_stream(torch, ref, gname, rank, world, dev, worst):
    ITERS, M, K, NS = 100, 128, 256, (192, 64)
    op = torch.ops.ovl.fused_all_gather_matmul
    bf16 = torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(300 + rank)  # distinct on every rank
    srcs = torch.rand((ITERS, M, K), generator=g, device=dev).to(bf16)
    g = torch.Generator(device=dev).manual_seed(4242)  # the same Bs on every rank
    Bs = [torch.rand((K, n), generator=g, device=dev).to(bf16) for n in NS]
    a = torch.empty((M, K), dtype=bf16, device=dev)
    hist_a = torch.empty((ITERS, world * M, K), dtype=bf16, device=dev)
    hist_c = [torch.empty((ITERS, world * M, n), dtype=bf16, device=dev) for n in NS]
    s = torch.cuda.Stream(device=dev)
    s.wait_stream(torch.cuda.current_stream(dev))  # the tensors above
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream(dev) != torch.cuda.default_stream(dev)
        for j in range(ITERS):
            torch.mul(srcs[j], 2, out=a)                         # producer (exact in bf16)
            A, cs = op(a, Bs, 0, gname, return_A=True)
            hist_a[j].copy_(A)                                   # consumers
            for h, c in zip(hist_c, cs):
                h[j].copy_(c)
    torch.cuda.synchronize(dev)
    # every rank's shards of every iteration: world x ITERS x M x K
    every = ref.all_gather_into_tensor(srcs).view(world, ITERS, M, K) * 2
    for j in range(ITERS):
        A_ref = every[:, j].reshape(world * M, K)
        assert torch.equal(hist_a[j], A_ref), "stream contract, iteration %d: A differs" % j
        for i, (h, B) in enumerate(zip(hist_c, Bs)):
            want = A_ref.float() @ B.float()
            torch.testing.assert_close(h[j].float(), want, rtol=1.6e-2, atol=1e-2,
                                       msg=lambda m: "stream contract, iteration %d, out %d: %s"
                                       % (j, i, m))
            worst["stream"] = max(worst.get("stream", 0.0), rel_err(h[j], want))
    return ITERS


def rank_main(sock, store, world, rank, q):
    try:
        import torch
        import torch.distributed as dist
        import ovl
        ngpu = torch.cuda.device_count()
        dev = torch.device("cuda", rank % ngpu)
        torch.cuda.set_device(dev)
        nccl = ngpu >= world
        dist.init_process_group("nccl" if nccl else "gloo", init_method="file://" + store,
                                world_size=world, rank=rank)
        import ovl.torch as otorch
        worst = {}
        n_inst = None  # the symm_mem calls ovl took with install() (NCCL, PyTorch 2.8+)
        with ovl.connect(sock) as client:
            comm = otorch.init(client=client)
            assert (comm.world, comm.rank, comm.device) == (world, rank, dev.index)
            gname = dist.group.WORLD.group_name
            assert otorch.get_comm(gname) is comm and otorch.get_comm("default") is comm
            ref = Ref(torch, dist, world, nccl)
            n = check_op(torch, ref, gname, rank, world, dev, worst)
            if nccl:  # ovld's reduce-scatter needs NCCL between the ranks
                n += check_rs_op(torch, dist, gname, rank, world, dev, worst)
                if otorch._override_supported():
                    n_inst = check_install(torch, dist, otorch, client, gname, rank, world, dev)
            check_fake(torch, gname, world, dev)
            check_compile(torch, gname, rank, dev)
            check_linear(torch, dist, otorch, rank, world, dev, nccl, worst)
            check_mlp(torch, dist, otorch, ref, rank, world, dev, nccl, worst)
            iters = check_stream(torch, ref, gname, rank, world, dev, worst)
            comm.check()
            otorch.shutdown()
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, (n, iters, worst, "nccl" if nccl else "gloo", n_inst), None))
    except BaseException as e:  # the parent reports it
        import traceback
        q.put((rank, None, "%r\n%s" % (e, traceback.format_exc())))
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1)
    world = ap.parse_args().world
    from test_gpu_python import run_ranks, start_daemon, torch_or_skip
    torch, mp = torch_or_skip()
    ngpu = torch.cuda.device_count()
    d = start_daemon()
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="ovl-torch-")
    # Inductor's caches of this run only: its FX graph cache keys on the
    # graph and the inputs, not on the group's world size, which the op's
    # output shapes depend on (a graph compiled at world 2 would be reused
    # at world 1)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    try:
        print("world %d on %d GPU%s: %s; torch %s, torch.distributed on %s" % (
            world, ngpu, "" if ngpu == 1 else "s", share(world, ngpu), torch.__version__,
            "nccl" if ngpu >= world else "gloo (ranks share a GPU: NCCL refuses that)"),
            flush=True)
        got = run_ranks(mp, d, rank_main, os.path.join(tmp, "store"), world, 500)
        for r in sorted(got):
            n, iters, worst, backend, n_inst = got[r]
            print("rank %d (%s): %d op cases, fake impl, torch.compile, ColumnParallelLinear, "
                  "MLP (Column -> GELU -> RowParallelLinear, 5 steps), stream contract "
                  "(%d iterations), %s; worst relative errors %s" % (
                      r, backend, n, iters,
                      "install(): %d symm_mem calls through ovld, then uninstall()" % n_inst
                      if n_inst is not None else "install() not checked (gloo or PyTorch < 2.8)",
                      ", ".join("%s %.2g" % kv for kv in sorted(worst.items()))),
                  flush=True)
        assert d.stop() == 0, d.log_text()[-3000:]
        print("PASS test_gpu_torch world %d %.1f s" % (world, time.monotonic() - t0))
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
