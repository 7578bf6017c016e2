"""ovl.torch.install() against the real PyTorch, without a GPU: the
overriding registration of symm_mem's CUDA kernels and its undoing,
install twice, the refusal on a PyTorch without allow_override, the
routing of a call ovl does not take to PyTorch's own kernel (each reason
logged once, every call counted), a group's comm made on first use that
fails on a rank (no ovld) and falls back for good, and OVL_TORCH_INSTALL,
by import and through ovl's sitecustomize. What ovld computes through the
installed ops is tests/gpu/test_gpu_torch.py's (check_install).

Skips (exit 77) where torch is not importable or older than 2.8. Run by
ctest (test_python_torch_install, with $OVL_TORCH_PYTHON or python3); by
hand:
    OVL_LIBRARY=build/client/libovl.so PYTHONPATH=python python3 python/tests/test_torch_install.py
"""
import logging
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("OVL_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
sys.path.insert(0, os.path.join(SRC, "python"))

try:
    import torch
    import torch.distributed as dist
except ImportError as _e:
    print("SKIP: no torch (%s)" % _e)
    sys.exit(77)

import ovl.torch as ot  # noqa: E402
from ovl import _core  # noqa: E402
from ovltest import run_tests  # noqa: E402

if not ot._override_supported():
    print("SKIP: PyTorch %s has no Library.impl(allow_override=...) (2.8 or later)"
          % torch.__version__)
    sys.exit(77)

sm = ot._symm_mem()
AG, RS = "symm_mem::fused_all_gather_matmul", "symm_mem::fused_matmul_reduce_scatter"
SAG, SRS = ("symm_mem::fused_all_gather_scaled_matmul",
            "symm_mem::fused_scaled_matmul_reduce_scatter")
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def active_cuda_kernel(op):
    """The line of the dispatcher's dump for op's active CUDA kernel."""
    for line in torch._C._dispatch_dump(op).splitlines():
        if line.startswith("CUDA:"):
            return line
    raise AssertionError("no CUDA kernel for %s:\n%s" % (op, torch._C._dispatch_dump(op)))


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.msgs = []

    def emit(self, record):
        self.msgs.append(record.getMessage())


def test_install_uninstall():
    ops = (AG, RS, SAG, SRS)  # the scaled ones too: torch 2.10's schemas are ovl's
    before = {op: active_cuda_kernel(op) for op in ops}
    assert all("_symmetric_memory" in k for k in before.values()), before
    assert not ot.installed()
    assert ot.install() is True and ot.installed()
    for op in ops:
        k = active_cuda_kernel(op)
        assert "ovl" in k and "torch.py" in k, k
    assert ot.install() is False  # twice: harmless, one registration
    assert ot.uninstall() is True and not ot.installed()
    after = {op: active_cuda_kernel(op) for op in ops}
    assert after == before, (before, after)
    assert ot.uninstall() is False
    # and again: install after uninstall works (PyTorch forgets the
    # original's record on _destroy; allow_override does not need it)
    assert ot.install() is True and ot.uninstall() is True
    assert {op: active_cuda_kernel(op) for op in ops} == before


def test_scaled_not_routed_on_another_schema():
    """A PyTorch whose scaled op's schema is not ovl's: install() routes the
    unscaled ops and leaves that one to PyTorch, saying so once."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    real = ot._schema_text

    def other(op):
        t = real(op)
        return t + " (another)" if "symm_mem" in str(op.default._schema) and "scaled" in t else t
    ot._schema_text = other
    try:
        before = active_cuda_kernel(SAG), active_cuda_kernel(SRS)
        assert ot.install() is True
        assert "ovl" in active_cuda_kernel(AG)
        assert (active_cuda_kernel(SAG), active_cuda_kernel(SRS)) == before
        assert ot.uninstall() is True
    finally:
        ot._schema_text = real
        logging.getLogger("ovl.torch").removeHandler(h)
    said = [m for m in h.msgs if "leaves symm_mem.fused_" in m]
    assert len(said) == 2 and all("is not the one ovl implements" in m for m in said), h.msgs


def test_old_pytorch_refused():
    real = ot._override_supported
    ot._override_supported = lambda: False
    try:
        ot.install()
        raise AssertionError("installed without allow_override")
    except RuntimeError as e:
        assert "came in 2.8" in str(e) and "torch.ops.ovl" in str(e), e
    finally:
        ot._override_supported = real
    assert not ot.installed()


def test_falls_back_once_per_reason():
    """A call ovl does not take (CPU tensors here) runs PyTorch's kernel
    (a recorder standing in for it), the reason logged once, every call
    counted."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    calls = []
    real_ag, real_rs = sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter

    def fake_ag(A, Bs, gd, gn, *, return_A=True):
        calls.append(("ag", tuple(A.shape), gd, gn, return_A))
        return None, []

    def fake_rs(A, B, red, sd, gn):
        calls.append(("rs", tuple(A.shape), red, sd, gn))
        return A

    sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter = fake_ag, fake_rs
    ot._ROUTER.reset()
    try:
        A, B = torch.randn(4, 8), torch.randn(8, 3)
        for _ in range(3):
            ot._symm_ag(A, [B], 0, "0", return_A=False)
        ot._symm_rs(A, B, "avg", 0, "0")
        ot._symm_ag(A.double(), [B.double()], 0, "0")
    finally:
        sm._fused_all_gather_matmul, sm._fused_matmul_reduce_scatter = real_ag, real_rs
        logging.getLogger("ovl.torch").removeHandler(h)
    assert calls == [("ag", (4, 8), 0, "0", False)] * 3 + [("rs", (4, 8), "avg", 0, "0"),
                                                            ("ag", (4, 8), 0, "0", True)], calls
    said = [m for m in h.msgs if "runs PyTorch's own kernel" in m]
    assert len(said) == 2, h.msgs  # one reason per op: CPU tensors
    assert all("a tensor on a cpu device" in m for m in said), said
    st = ot.stats()
    assert st["taken"] == {} and st["fell_back"] == {
        "fused_all_gather_matmul: a tensor on a cpu device (ovl takes CUDA tensors)": 4,
        "fused_matmul_reduce_scatter: a tensor on a cpu device (ovl takes CUDA tensors)": 1}, st


def value_error(fn, *args):
    """The words of the ValueError fn(*args) raises (AssertionError if none)."""
    try:
        fn(*args)
    except ValueError as e:
        return str(e)
    raise AssertionError("no ValueError from %s" % fn)


def meta(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def col_major(k, n, dtype=E4, device="meta"):
    """k x n column-major (the transpose of a row-major n x k weight)."""
    return torch.empty((n, k), dtype=dtype, device=device).t()


def desc(t):
    return tuple(t.shape), tuple(t.stride()), t.dtype


def test_scaled_schemas():
    """torch.ops.ovl's scaled ops have exactly PyTorch's schemas (and its
    tag: Inductor keeps their outputs' strides)."""
    for op in ("fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter"):
        ours, theirs = getattr(torch.ops.ovl, op).default, getattr(torch.ops.symm_mem, op).default
        assert ot._schema_text(getattr(torch.ops.ovl, op)) == \
            ot._schema_text(getattr(torch.ops.symm_mem, op)), (ours._schema, theirs._schema)
        assert str(ours._schema).replace("ovl::", "symm_mem::") == str(theirs._schema)
        assert ours._schema.arguments == theirs._schema.arguments or \
            [a.name for a in ours._schema.arguments] == [a.name for a in theirs._schema.arguments]
        assert torch._C.Tag.needs_fixed_stride_order in ours.tags, ours.tags


def test_scaled_ag_fake():
    """The fake kernel of torch.ops.ovl.fused_all_gather_scaled_matmul gives
    PyTorch's Meta kernel's shapes, strides and dtypes (world 2, the fake
    process group; every gather_dim but the last, the three scale modes,
    several Bs of several out dtypes; FakeTensorMode too), and raises
    ValueError where PyTorch's does."""
    gn = dist.group.WORLD.group_name
    n = 0
    for shard, gd in [((32, 64), 0), ((4, 8, 64), 0), ((4, 8, 64), 1), ((2, 3, 16, 32), 2),
                      ((1, 16, 32), 1), ((2, 3, 16, 32), 0)]:
        full = list(shard)
        full[gd] *= 2
        for scale in (meta(()), meta(tuple(shard[:-1]) + (1,)), meta(tuple(full[:-1]) + (1,))):
            rowwise = scale.dim() > 0
            for ods in ([torch.bfloat16], [torch.float32, torch.float16, None]):
                Bs = [col_major(shard[-1], 16 * (i + 1)) for i in range(len(ods))]
                bsc = [meta((1, B.shape[1])) if rowwise else meta(()) for B in Bs]
                args = (meta(shard, E4), Bs, scale, bsc, gd, gn, [None] * len(Bs),
                        [None] * len(Bs), ods, [False] * len(Bs))
                A1, o1 = torch.ops.symm_mem.fused_all_gather_scaled_matmul(*args)
                A2, o2 = torch.ops.ovl.fused_all_gather_scaled_matmul(*args)
                assert [desc(A1)] + [desc(o) for o in o1] == [desc(A2)] + [desc(o) for o in o2], (
                    shard, gd, scale.shape, ods, [desc(A1)] + [desc(o) for o in o1],
                    [desc(A2)] + [desc(o) for o in o2])
                n += 1
    assert n == 36, n
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        args = (torch.empty((4, 8, 64), dtype=E4), [torch.empty((32, 64), dtype=E4).t()],
                torch.empty(()), [torch.empty(())], 1, gn, [None], [None], [torch.float32],
                [False])
        A, (o,) = torch.ops.ovl.fused_all_gather_scaled_matmul(*args)
        assert (desc(A), desc(o)) == (((4, 16, 64), (64, 256, 1), E4),
                                      ((4, 16, 32), (32, 128, 1), torch.float32)), (desc(A),
                                                                                   desc(o))
    # the kernels' own functions, not through the dispatcher: an exception
    # that crosses it is a C++ throw, which a process with ASan preloaded
    # (ctest's, for an ASan-built libovl) cannot take
    bad = (meta((4, 8, 64), E4), [col_major(64, 16)], meta((4, 3, 1)), [meta(())], 1, gn, [None],
           [None], [torch.bfloat16], [False])
    for fn in (sm._fused_all_gather_scaled_matmul_fallback, ot._sag_fake):
        e = value_error(fn, *bad)
        assert "Invalid scale shape for fp8 all-gather" in e, e


def test_scaled_rs_fake():
    """The fake kernel of torch.ops.ovl.fused_scaled_matmul_reduce_scatter:
    PyTorch's Meta kernel's shape, strides and dtype (A 2-D or 3-D, the
    output 2-D or 3-D, every scatter dimension, tensor- and row-wise
    scales, out dtypes)."""
    gn = dist.group.WORLD.group_name
    n = 0
    for a_shape, osh, osd, sda in [((64, 32), [64, 32], 0, 0), ((4, 16, 32), [4, 16, 32], 1, 1),
                                   ((64, 32), [4, 16, 32], 1, 0), ((64, 32), [4, 16, 32], 0, 0),
                                   ((4, 16, 32), [4, 16, 32], 2, 2),
                                   ((4, 16, 32), [4, 16, 32], 0, 0)]:
        for od in (torch.bfloat16, torch.float32, None):
            for rowwise in (False, True):
                sa = meta(tuple(a_shape[:-1]) + (1,)) if rowwise else meta(())
                sb = meta((1, 32)) if rowwise else meta(())
                args = (meta(a_shape, E4), col_major(a_shape[-1], 32), sa, sb, "avg", osd, sda, gn,
                        osh, None, None, od, False)
                r1 = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*args)
                r2 = torch.ops.ovl.fused_scaled_matmul_reduce_scatter(*args)
                assert desc(r1) == desc(r2), (a_shape, osh, osd, od, desc(r1), desc(r2))
                n += 1
    assert n == 36, n
    # output_shape None: A's leading dimensions and N (PyTorch's kernels need it)
    r = torch.ops.ovl.fused_scaled_matmul_reduce_scatter(
        meta((4, 16, 32), E4), col_major(32, 48), meta(()), meta(()), "sum", 1, 1, gn, None)
    assert desc(r) == ((4, 8, 48), (384, 48, 1), E4), desc(r)


BLOCK = 128


def per_block(s, mode, rows, k):
    """Scales s of an ovl mode (ovl's layouts) as a rows x ceil(k/128)
    float64 matrix: each row's (A's) or column's (B's) scale for each 128 of
    k."""
    kq = -(-k // BLOCK)
    s = s.double()
    if mode == "tensor":
        return s.reshape(1, 1).expand(rows, kq)
    if mode == "row":
        return s.reshape(rows, 1).expand(rows, kq)
    if mode == "1x128":
        return s.reshape(rows, kq)
    return s.reshape(-1, kq).repeat_interleave(BLOCK, dim=0)[:rows]


def block_mm(a, b, sa, sb):
    """sum over blocks q of 128 of K of sa[:, q] sb[:, q] (a[:, q] @ b[q, :]),
    float64: a rows x K, b K x N, sa rows x ceil(K/128), sb N x ceil(K/128)."""
    out = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float64)
    for q in range(sa.shape[1]):
        ks = slice(q * BLOCK, (q + 1) * BLOCK)
        out += sa[:, q:q + 1] * sb[:, q].reshape(1, -1) * (a[:, ks].double() @ b[ks, :].double())
    return out


def scaled_mm_ref(a, b, scale_a, scale_b):
    """torch._scaled_mm(a, b, scale_a, scale_b) by its definition, float64,
    the scales read as PyTorch reads them (not through ovl): scale_a 1
    element, (M, 1) or 1x128 (M, ceil(K/128)); scale_b 1 element, (1, N),
    1x128 (ceil(K/128), N) or 128x128 (ceil(K/128), ceil(N/128))."""
    (m, k), n = a.shape, b.shape[1]
    kq = -(-k // BLOCK)
    sa = scale_a.double().reshape(-1)
    sa = sa.expand(m * kq).reshape(m, kq) if sa.numel() == 1 else \
        scale_a.double().reshape(m, -1).expand(m, kq)
    sb = scale_b.double()
    if sb.numel() == 1:
        sb = sb.reshape(1, 1).expand(n, kq)
    elif tuple(sb.shape) == (1, n):
        sb = sb.reshape(n, 1).expand(n, kq)
    elif tuple(sb.shape) == (kq, n):
        sb = sb.t()
    else:
        assert tuple(sb.shape) == (kq, -(-n // BLOCK)), sb.shape
        sb = sb.t().repeat_interleave(BLOCK, dim=0)[:n]
    return block_mm(a, b, sa, sb)


class FakeComm:
    """Stands in for an ovl Comm of rank `rank` of `world` whose every rank
    holds the same inputs as this one: computes ovl's scaled ops from the
    arguments ovl.torch hands it (checking their layout: A rows x K
    row-major, B K x N column-major, scales of modes ovl reads from their
    shapes, block scales in ovl's dense row-major layout), in float64;
    records each call's a_scale and b_scales."""

    def __init__(self, world, rank):
        self.world, self.rank, self.calls, self.b_scales = world, rank, [], []

    def _product(self, a, b, a_scale, b_scale, bias):
        assert a.dim() == 2 and a.stride(1) == 1, (a.shape, a.stride())
        assert b.dim() == 2 and b.stride(0) == 1 and b.shape[0] == a.shape[1], (b.shape,
                                                                                 b.stride())
        (rows, k), n = a.shape, b.shape[1]
        am, bm = _core._scale_modes(tuple(a_scale.shape), tuple(b_scale.shape), rows, n, k)
        for t, mode in ((a_scale, am), (b_scale, bm)):
            assert mode not in ("1x128", "128x128") or t.is_contiguous(), (mode, t.stride())
        p = block_mm(a, b, per_block(a_scale, am, rows, k), per_block(b_scale, bm, n, k))
        return p + bias.double() if bias is not None else p

    def all_gather_matmul(self, a, b, *, out, a_out=None, a_scale, b_scale, out_dtype, bias=None,
                          fast_accum=False, stream=None):
        ws = self.world
        self.calls.append(a_scale.clone())
        self.b_scales.append(b_scale)
        if a_scale.dim() == 2 and a_scale.shape[1] > 1:  # 1x128: every rank's rows
            sa = a_scale.repeat(ws, 1)
        else:
            sa = a_scale.reshape(-1).repeat(ws) if a_scale.numel() > 1 else a_scale
        # several Bs (one op): lists of b, b_scale, out, and bias (or None)
        bs = b if isinstance(b, list) else [b]
        sbs = b_scale if isinstance(b, list) else [b_scale]
        outs = out if isinstance(b, list) else [out]
        biases = (bias if bias is not None else [None] * len(bs)) if isinstance(b, list) \
            else [bias]
        assert len(sbs) == len(outs) == len(biases) == len(bs)
        for bi, sbi, oi, biasi in zip(bs, sbs, outs, biases):
            assert oi.dtype == out_dtype and oi.shape == (ws * a.shape[0], bi.shape[1])
            oi.copy_(self._product(a.repeat(ws, 1), bi, sa, sbi, biasi).to(oi.dtype))
        if a_out is not None:
            a_out.copy_(a.repeat(ws, 1))

    def matmul_reduce_scatter(self, a, b, *, reduce_op, out, a_scale, b_scale, out_dtype,
                              bias=None, fast_accum=False, stream=None):
        rows = a.shape[0] // self.world
        self.calls.append(a_scale.clone())
        self.b_scales.append(b_scale)
        p = self._product(a, b, a_scale, b_scale, bias)
        p = p * self.world if reduce_op == "sum" else p
        out.copy_(p[self.rank * rows:(self.rank + 1) * rows].to(out.dtype))


def fp8(shape, gen, dtype=E4):
    return (torch.rand(shape, generator=gen) * 4 - 2).to(dtype)


def test_scaled_ag_one_op_for_bs():
    """Bs that share what one ovl scaled op shares (dtype, out dtype, fast
    accumulation, scale kind, a bias each) go to ovl as ONE op (A gathered
    once), with the values of PyTorch's definition; Bs that differ in one
    of those go as an op each."""
    gen = torch.Generator().manual_seed(3)
    A_shard = fp8((6, 32), gen)
    sa = torch.rand((6, 1), generator=gen) + 0.5
    Bs = [col_major(32, 16, E4, "cpu").copy_(fp8((32, 16), gen, torch.float32))
          for _ in range(3)]
    bsc = [torch.rand((1, 16), generator=gen) + 0.5 for _ in range(3)]
    biases = [torch.rand(16, generator=gen).to(torch.bfloat16) for _ in range(3)]
    ods = [torch.bfloat16] * 3
    comm = FakeComm(2, 1)
    A, outs = ot._sag_run(comm, A_shard, Bs, sa, bsc, 0, biases, ods, [False] * 3)
    assert len(comm.calls) == 1, len(comm.calls)
    a64 = torch.cat([A_shard] * 2).double() * torch.cat([sa] * 2).double()
    for B, s_, b, o in zip(Bs, bsc, biases, outs):
        want = (a64 @ B.double()) * s_.double().reshape(-1) + b.double()
        torch.testing.assert_close(o.double(), want.to(torch.bfloat16).double(), rtol=1e-2,
                                   atol=1e-2)
    for differ in ("fast", "bias", "kind"):
        comm = FakeComm(2, 1)
        fast = [False, True, False] if differ == "fast" else [False] * 3
        bs_ = [None, biases[1], biases[2]] if differ == "bias" else biases
        sc_ = [bsc[0], torch.rand((), generator=gen), bsc[2]] if differ == "kind" else bsc
        ot._sag_run(comm, A_shard, Bs, sa, sc_, 0, bs_, ods, fast)
        assert len(comm.calls) == 3, (differ, len(comm.calls))


def test_scaled_ag_through_ovl():
    """What ovl.torch hands ovl for fused_all_gather_scaled_matmul, and what
    it makes of the results (a FakeComm standing in for ovld, every rank
    holding the same shard): the values of PyTorch's definition (the shard
    gathered along gather_dim, _scaled_mm of it with each B, + bias) and
    the strides of its Meta kernel, for worlds 1 and 2, ranks 0 and 1,
    gather_dim 0 and 1, the three scale modes, several Bs (an ovl op each)
    of several out dtypes."""
    gen = torch.Generator().manual_seed(0)
    for world, rank in ((1, 0), (2, 1)):
        for shard, gd in (((6, 32), 0), ((3, 4, 32), 1), ((2, 3, 4, 32), 0)):
            full = list(shard)
            full[gd] *= world
            A_shard = fp8(shard, gen)
            lead = list(shard[:-1])
            for mode in ("tensor", "row-sharded", "row-replicated"):
                if mode == "tensor":
                    sa = torch.rand((), generator=gen) + 0.5
                    sa_full = sa
                elif mode == "row-sharded":
                    sa = torch.rand(lead + [1], generator=gen) + 0.5
                    sa_full = torch.cat([sa] * world, dim=gd)
                else:
                    one = torch.rand(lead + [1], generator=gen) + 0.5
                    sa = sa_full = torch.cat([one] * world, dim=gd)
                    if world == 1:
                        continue  # the same shape as row-sharded
                Bs = [col_major(32, 16, E4 if i != 1 else E5, "cpu").copy_(
                    fp8((32, 16), gen, torch.float32)) for i in range(3)]
                ods = [torch.bfloat16, torch.float32, torch.float16]
                bsc = [torch.rand((1, 16), generator=gen) + 0.5, torch.rand((), generator=gen),
                       torch.rand((1, 16), generator=gen) + 0.5]
                biases = [None, torch.rand(16, generator=gen), torch.rand(16).half()]
                comm = FakeComm(world, rank)
                A, outs = ot._sag_run(comm, A_shard, Bs, sa, bsc, gd, biases, ods,
                                      [False, True, False])
                A_full = torch.cat([A_shard] * world, dim=gd)
                assert torch.equal(A.view(torch.uint8), A_full.view(torch.uint8))
                a64 = A_full.double() * (sa_full.double() if mode != "tensor" else sa.double())
                for i, (B, o) in enumerate(zip(Bs, outs)):
                    want = (a64 @ B.double()) * bsc[i].double().reshape(-1)
                    if biases[i] is not None:
                        want = want + biases[i].double()
                    torch.testing.assert_close(o.double(), want.to(ods[i]).double(),
                                               rtol=1e-2, atol=1e-2)
                    assert o.dtype == ods[i]
                fa, fo = ot._sag_layout(torch.empty(shard, dtype=E4, device="meta"), gd, world,
                                        [16] * 3, ods)
                assert [desc(A)] + [desc(o) for o in outs] == \
                    [desc(fa)] + [desc(o) for o in fo], (world, shard, gd, mode)
                # the a_scale ovl got: one; this rank's rows; this rank's block
                for got in comm.calls:
                    if mode == "tensor":
                        want_sa = sa.reshape(1)
                    elif mode == "row-sharded":
                        want_sa = sa.movedim(gd, 0)
                    else:
                        want_sa = sa.movedim(gd, 0).chunk(world)[rank]
                    assert torch.equal(got.reshape(-1), want_sa.reshape(-1)), mode
                assert len(comm.calls) == 3  # one ovl op per B


def test_scaled_rs_through_ovl():
    """The same for fused_scaled_matmul_reduce_scatter: PyTorch's definition
    (_scaled_mm of A and B + bias, viewed as output_shape, reduce-scattered
    along orig_scatter_dim) for worlds 1 and 2, ranks 0 and 1, A 2-D under
    a 3-D output (as Inductor's reshape leaves it) and A 3-D, scatter along
    0 and 1, tensor- and row-wise scales, sum and avg, contiguous results."""
    gen = torch.Generator().manual_seed(1)
    for world, rank in ((1, 0), (2, 1), (2, 0)):
        for a_shape, osh, osd in (((8, 32), [8, 16], 0), ((4, 6, 32), [4, 6, 16], 1),
                                  ((24, 32), [4, 6, 16], 1), ((24, 32), [4, 6, 16], 0),
                                  ((4, 6, 32), [4, 6, 16], 0)):
            for rowwise in (False, True):
                for red, od, with_bias in (("sum", torch.bfloat16, True),
                                           ("avg", torch.float32, False)):
                    A = fp8(a_shape, gen)
                    B = col_major(32, 16, E5, "cpu").copy_(fp8((32, 16), gen, torch.float32))
                    sa = torch.rand(list(a_shape[:-1]) + [1], generator=gen) + 0.5 if rowwise \
                        else torch.rand((), generator=gen) + 0.5
                    sb = torch.rand((1, 16), generator=gen) + 0.5 if rowwise else \
                        torch.rand((1,), generator=gen) + 0.5
                    bias = torch.rand(16, generator=gen).to(od) if with_bias else None
                    comm = FakeComm(world, rank)
                    out = ot._srs_run(comm, A, B, sa, sb, red, osd, osh, bias, od, False)
                    p = (A.double().reshape(-1, 32) * sa.double().reshape(-1, 1)) @ B.double()
                    p = p * sb.double().reshape(1, -1)
                    if bias is not None:
                        p = p + bias.double()
                    p = p.view(osh[:-1] + [16]) * (world if red == "sum" else 1)
                    want = p.chunk(world, dim=osd)[rank]
                    assert out.dtype == od and out.is_contiguous(), (out.dtype, out.stride())
                    assert tuple(out.shape) == tuple(want.shape), (out.shape, want.shape)
                    torch.testing.assert_close(out.double(), want.to(od).double(), rtol=1e-2,
                                               atol=1e-2)


def test_scaled_ovl_ops_fall_back():
    """torch.ops.ovl's scaled ops hand what ovl does not take to PyTorch's
    unfused fallback (a recorder here), each reason said once, the calls
    counted by op_stats(): CPU tensors here; and the reasons of calls on
    CUDA tensors, from these tensors' facts (devices set to cuda)."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    calls = []
    real = (sm._fused_all_gather_scaled_matmul_fallback,
            sm._fused_scaled_matmul_reduce_scatter_fallback)

    def fake_ag(*args):
        calls.append(("ag", args[4], args[5], args[8]))
        return args[0], []

    def fake_rs(*args):
        calls.append(("rs", args[5], args[7], list(args[8]), args[11]))
        return args[0]

    sm._fused_all_gather_scaled_matmul_fallback = fake_ag
    sm._fused_scaled_matmul_reduce_scatter_fallback = fake_rs
    ot._OPS_ROUTER.reset()
    try:
        A = torch.zeros((4, 8, 32), dtype=E4)
        B = col_major(32, 16, E4, "cpu")
        one = torch.ones(())
        for _ in range(2):
            ot._sag_cuda(A, [B], one, [one], 0, "default", [None], [None], [torch.bfloat16],
                         [False])
        ot._srs_cuda(A, B, one, one, "sum", 0, 0, "default", None, None, None, torch.float32)
    finally:
        (sm._fused_all_gather_scaled_matmul_fallback,
         sm._fused_scaled_matmul_reduce_scatter_fallback) = real
        logging.getLogger("ovl.torch").removeHandler(h)
    gn = dist.group.WORLD.group_name  # "default" named to PyTorch as c10d's name
    assert calls == [("ag", 0, gn, [torch.bfloat16])] * 2 + [
        ("rs", 0, gn, [4, 8, 16], torch.float32)], calls
    said = [m for m in h.msgs if "runs PyTorch's unfused fallback" in m]
    assert len(said) == 2 and all("ovl.fused_" in m and "a tensor on a cpu device" in m
                                  for m in said), h.msgs
    st = ot.op_stats()
    assert st["taken"] == {} and sum(st["fell_back"].values()) == 3, st

    def ag_why(A, Bs, A_scale, B_scales, gd, biases, rscales, ods, fast, world=2):
        f = ot._sag_facts(A, Bs, A_scale, B_scales, gd, biases, rscales, ods, fast, world)
        f[0] = ["cuda"] * len(f[0])
        return _route.why_not_scaled_ag(*f)

    def rs_why(A, B, A_scale, B_scale, red, osd, sda, osh, bias, rscale, od, world=2):
        f = ot._srs_facts(A, B, A_scale, B_scale, red, osd, sda, osh, bias, rscale, od, world)
        f[0] = ["cuda"] * len(f[0])
        return _route.why_not_scaled_rs(*f)

    from ovl import _route
    A = torch.zeros((4, 8, 32), dtype=E4)
    Bc = col_major(32, 16, E4, "cpu")
    Br = torch.zeros((32, 16), dtype=E4)  # row-major: not _scaled_mm's layout
    row = torch.ones((4, 8, 1))
    b_row = torch.ones((1, 16))
    bf = torch.bfloat16
    # several Bs of differing out dtypes and fast_accum: ovl takes them (an op each)
    assert ag_why(A, [Bc, Bc], row, [b_row, one], 0, [None, torch.zeros(16)], [None, None],
                  [bf, torch.float32], [False, True]) is None
    cases = [
        (ag_why(A, [Bc], row, [b_row], 0, [None], [None], [None], [False]),
         "out_dtypes[0] is None"),
        (ag_why(A, [Bc], row, [b_row], 0, [None], [one], [bf], [False]), "a result_scale"),
        (ag_why(A, [Br], row, [b_row], 0, [None], [None], [bf], [False]),
         "Bs[0] is not column-major"),
        (ag_why(A, [Bc], torch.ones((4, 8, 2)), [b_row], 0, [None], [None], [bf], [False]),
         "block-wise"),
        (ag_why(A, [Bc], row, [torch.ones((2, 16))], 0, [None], [None], [bf], [False]),
         "B_scales[0] of shape (2, 16)"),
        (ag_why(A.view(E5), [Bc.view(E5)], row, [b_row], 0, [None], [None], [bf], [False]),
         "float8_e5m2 times float8_e5m2"),
        (ag_why(A, [Bc], row, [b_row], 0, [torch.zeros(16)], [None], [bf], [False]),
         "biases[0] of dtype float32, the output's is bfloat16"),
        (ag_why(A, [Bc], row, [b_row], 2, [None], [None], [bf], [False]),
         "gather_dim is A's last"),
        (rs_why(A, Bc, row, b_row, "sum", 1, 1, [4, 8, 16], None, None, None),
         "out_dtype is None"),
        (rs_why(A, Bc, row, b_row, "sum", 1, 1, [4, 8, 16], None, one, bf), "a result_scale"),
        (rs_why(A, Br, row, b_row, "sum", 1, 1, [4, 8, 16], None, None, bf),
         "B is not column-major"),
        (rs_why(A, Bc, row, b_row, "sum", 2, 2, [4, 8, 16], None, None, bf),
         "orig_scatter_dim is the output's last"),
        (rs_why(A, Bc, torch.ones(4, 8, 4), b_row, "sum", 1, 1, [4, 8, 16], None, None, bf),
         "block-wise"),
    ]
    for why, words in cases:
        assert why is not None and words in why, (words, why)
    assert rs_why(A, Bc, row, b_row, "avg", 1, 1, [4, 8, 16], torch.zeros(16, dtype=bf), None,
                  bf) is None


def test_scaled_install_falls_back_once_per_reason():
    """Installed, symm_mem's scaled ops hand a call ovl does not take (CPU
    tensors here) to PyTorch's own kernel (a recorder), the reason said
    once, every call counted by stats()."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    calls = []
    real = sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter

    def fake_ag(*args):
        calls.append("ag")
        return args[0], []

    def fake_rs(*args):
        calls.append("rs")
        return args[0]

    sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter = fake_ag, fake_rs
    ot._ROUTER.reset()
    try:
        A = torch.zeros((4, 8, 32), dtype=E4)
        B = col_major(32, 16, E4, "cpu")
        one = torch.ones(())
        for _ in range(3):
            ot._symm_sag(A, [B], one, [one], 0, "0", [None], [None], [torch.bfloat16], [False])
        ot._symm_srs(A, B, one, one, "sum", 0, 0, "0", [4, 8, 16], None, None, torch.bfloat16)
    finally:
        sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter = real
        logging.getLogger("ovl.torch").removeHandler(h)
    assert calls == ["ag"] * 3 + ["rs"], calls
    said = [m for m in h.msgs if "runs PyTorch's own kernel" in m]
    assert len(said) == 2 and all("symm_mem.fused_" in m and "cpu device" in m for m in said), \
        h.msgs
    st = ot.stats()["fell_back"]
    assert st == {
        "fused_all_gather_scaled_matmul: a tensor on a cpu device (ovl takes CUDA tensors)": 3,
        "fused_scaled_matmul_reduce_scatter: a tensor on a cpu device (ovl takes CUDA "
        "tensors)": 1}, st


KB = 320  # K of the block-scale tests: three blocks of 128, the last one partial
KQ = 3


def a_scale_1x128(lead, gd, gen):
    """A's 1x128 scales of A's leading dimensions lead (every rank's rows),
    laid out as PyTorch's fused ops hand them to _scaled_mm: their view
    movedim(gd, 0).flatten(0, -2) (rows x ceil(K/128)) of strides (1, rows),
    what _scaled_mm's BlockWise1x128 takes."""
    moved = [lead[gd]] + lead[:gd] + lead[gd + 1:]
    rows = 1
    for d in moved:
        rows *= d
    flat = (torch.rand((KQ, rows), generator=gen) + 0.5).t()  # strides (1, rows)
    t = flat.view(moved + [KQ]).movedim(0, gd)
    assert t.movedim(gd, 0).flatten(0, -2).stride() == (1, rows)
    return t


def b_scale_of(mode, n, gen):
    """PyTorch's scale_b for B (K x N) by mode, in its layouts: 1x128
    (ceil(K/128), N), scale_b.t() of strides (1, N); 128x128 (ceil(K/128),
    ceil(N/128)), scale_b.t() of strides (4, 1) (rows padded to 4); row (1,
    N); tensor ()."""
    if mode == "1x128":
        return torch.rand((KQ, n), generator=gen) + 0.5
    if mode == "128x128":
        return (torch.rand((-(-n // BLOCK), 4), generator=gen) + 0.5)[:, :KQ].t()
    if mode == "row":
        return torch.rand((1, n), generator=gen) + 0.5
    return torch.rand((), generator=gen) + 0.5


def test_scaled_block_layouts():
    """ovl.torch's conversion of PyTorch's block-wise scale layouts to ovl's
    (dense row-major N x K's and rows x K's): B's scale_b.t() made
    contiguous, 1x128 and 128x128 (padded rows copied out); other modes as
    they are; the kinds of one ovl op."""
    gen = torch.Generator().manual_seed(7)
    B = col_major(KB, 144, E4, "cpu")
    s1 = b_scale_of("1x128", 144, gen)
    s2 = b_scale_of("128x128", 144, gen)
    assert s2.stride() == (1, 4) and s2.shape == (KQ, 2)
    for t, mode in ((s1, "1x128"), (s2, "128x128")):
        assert ot._b_scale_mode(B, t) == mode
        o = ot._ovl_b_scale(B, t)
        assert o.is_contiguous() and torch.equal(o, t.t()), (mode, o.stride())
    for mode in ("row", "tensor"):
        t = b_scale_of(mode, 144, gen)
        assert ot._b_scale_mode(B, t) == mode and ot._ovl_b_scale(B, t) is t
    assert _core._scale_modes((8, KQ), tuple(ot._ovl_b_scale(B, s1).shape), 8, 144, KB) == \
        ("1x128", "1x128")
    assert _core._scale_modes((8, KQ), tuple(ot._ovl_b_scale(B, s2).shape), 8, 144, KB) == \
        ("1x128", "128x128")
    assert not ot._one_scaled_op([B, B], [s1, s2], [None, None], [torch.bfloat16] * 2,
                                 [False] * 2)
    assert ot._one_scaled_op([B, B], [s1, s1.clone()], [None, None], [torch.bfloat16] * 2,
                             [False] * 2)


def test_scaled_block_fake():
    """The fake kernels take block-wise scales as PyTorch's Meta kernels do
    (the same shapes, strides and dtypes: A 1x128 of every rank's rows with
    Bs 1x128 and 128x128; A 1x128 of A's rows for the reduce-scatter), and
    raise ValueError where PyTorch's raise: block-wise scales of this rank's
    rows alone, A by 128x128 tile (naming ovl's rule)."""
    gn = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(8)
    n = 0
    for shard, gd in [((32, KB), 0), ((4, 8, KB), 1), ((4, 8, KB), 0), ((2, 3, 16, KB), 2)]:
        full = list(shard)
        full[gd] *= 2
        for modes in (["1x128"], ["128x128"], ["1x128", "128x128"]):
            Bs = [col_major(KB, 16 * (i + 1) + 128 * i) for i in range(len(modes))]
            bsc = [b_scale_of(md, B.shape[1], gen).to("meta") for md, B in zip(modes, Bs)]
            ods = [torch.bfloat16, torch.float32][:len(Bs)]
            args = (meta(shard, E4), Bs, meta(tuple(full[:-1]) + (KQ,)), bsc, gd, gn,
                    [None] * len(Bs), [None] * len(Bs), ods, [False] * len(Bs))
            A1, o1 = torch.ops.symm_mem.fused_all_gather_scaled_matmul(*args)
            A2, o2 = torch.ops.ovl.fused_all_gather_scaled_matmul(*args)
            assert [desc(A1)] + [desc(o) for o in o1] == [desc(A2)] + [desc(o) for o in o2], (
                shard, gd, modes)
            n += 1
    assert n == 12, n
    for a_shape, osh, osd in [((64, KB), [64, 16], 0), ((4, 16, KB), [4, 16, 16], 1),
                              ((64, KB), [4, 16, 16], 1)]:
        for mode in ("1x128", "128x128"):
            args = (meta(a_shape, E4), col_major(KB, 16), meta(tuple(a_shape[:-1]) + (KQ,)),
                    b_scale_of(mode, 16, gen).to("meta"), "sum", osd, 0 if len(a_shape) == 2
                    else osd, gn, osh, None, None, torch.float32, False)
            r1 = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(*args)
            r2 = torch.ops.ovl.fused_scaled_matmul_reduce_scatter(*args)
            assert desc(r1) == desc(r2), (a_shape, osh, mode, desc(r1), desc(r2))
    # refused as PyTorch's refuse them (the kernels' functions, not through
    # the dispatcher: see test_scaled_ag_fake)
    sharded = (meta((4, 8, KB), E4), [col_major(KB, 16)], meta((4, 8, KQ)),
               [meta((KQ, 16))], 1, gn, [None], [None], [torch.bfloat16], [False])
    tile_a = (meta((256, KB), E4), [col_major(KB, 16)], meta((4, KQ)), [meta((KQ, 16))], 0, gn,
              [None], [None], [torch.bfloat16], [False])
    for args, words in ((sharded, "block-wise scales of A_shard's rows alone are not taken"),
                        (tile_a, "128x128 blocks of A (PyTorch's BlockWise128x128), which ovl "
                                 "does not take: it cuts A by rows")):
        for fn in (sm._fused_all_gather_scaled_matmul_fallback, ot._sag_fake):
            e = value_error(fn, *args)
            assert "Invalid scale shape for fp8 all-gather" in e, e
            assert fn is not ot._sag_fake or words in e, e
    tile_rs = (meta((256, KB), E4), col_major(KB, 16), meta((2, KQ)), meta((KQ, 16)), "sum", 0,
               0, gn, [256, 16], None, None, torch.bfloat16, False)
    for fn in (sm._fused_scaled_matmul_reduce_scatter_fallback, ot._srs_fake):
        e = value_error(fn, *tile_rs)
        assert "the leading dims of A_scale must match the leading dims of A" in e, e
        assert fn is not ot._srs_fake or "128x128 blocks of A" in e, e


def test_scaled_block_ag_through_ovl():
    """fused_all_gather_scaled_matmul with block-wise scales through ovl (a
    FakeComm for ovld): A_scale 1x128 of every rank's rows in PyTorch's
    layout, B_scales 1x128 and 128x128 in theirs; the values of PyTorch's
    definition (its fallback: the gathered A, A_scale.movedim(gather_dim,
    0).flatten(0, -2) as _scaled_mm's scale_a), Meta's strides; ovl given
    this rank's rows' scales and each B's, dense row-major in its layout;
    Bs of one block kind in one op, of two kinds in an op each. Worlds 1 to
    3, gather_dim 0 and 1, 2-D to 4-D A."""
    gen = torch.Generator().manual_seed(9)
    for world, rank in ((1, 0), (2, 1), (3, 2)):
        for shard, gd in (((8, KB), 0), ((3, 4, KB), 1), ((2, 2, 4, KB), 0)):
            full = list(shard)
            full[gd] *= world
            A_shard = fp8(shard, gen)
            A_full = torch.cat([A_shard] * world, dim=gd)
            # every rank's rows' scales: this rank's block the same on each (FakeComm's world)
            one = a_scale_1x128(list(shard[:-1]), gd, gen)
            vals = torch.cat([one] * world, dim=gd)
            sa = a_scale_1x128(list(full[:-1]), gd, gen)
            sa.copy_(vals)
            for modes in (["1x128", "1x128"], ["128x128", "128x128", "128x128"],
                          ["1x128", "128x128"]):
                ns = [16 + 128 * (i % 2) for i in range(len(modes))]
                Bs = [col_major(KB, nn, E4, "cpu").copy_(fp8((KB, nn), gen, torch.float32))
                      for nn in ns]
                bsc = [b_scale_of(md, nn, gen) for md, nn in zip(modes, ns)]
                biases = [torch.rand(nn, generator=gen).to(torch.bfloat16) for nn in ns]
                ods = [torch.bfloat16] * len(Bs)
                comm = FakeComm(world, rank)
                A, outs = ot._sag_run(comm, A_shard, Bs, sa, bsc, gd, biases, ods,
                                      [False] * len(Bs))
                assert torch.equal(A.view(torch.uint8), A_full.view(torch.uint8))
                a2 = A_full.movedim(gd, 0).flatten(0, -2)
                sa2 = sa.movedim(gd, 0).flatten(0, -2)  # what PyTorch's fallback hands _scaled_mm
                lead = [full[gd]] + full[:gd] + full[gd + 1:-1]
                for B, t, b, o in zip(Bs, bsc, biases, outs):
                    want = scaled_mm_ref(a2, B, sa2, t) + b.double()
                    want = want.view(lead + [B.shape[1]]).movedim(0, gd)
                    torch.testing.assert_close(o.double(), want.to(torch.bfloat16).double(),
                                               rtol=1e-2, atol=1e-2)
                fa, fo = ot._sag_layout(torch.empty(shard, dtype=E4, device="meta"), gd, world,
                                        ns, ods)
                assert [desc(A)] + [desc(o) for o in outs] == \
                    [desc(fa)] + [desc(o) for o in fo], (world, shard, gd, modes)
                ops = 1 if len(set(modes)) == 1 else len(modes)
                assert len(comm.calls) == ops, (modes, len(comm.calls))
                want_sa = sa.movedim(gd, 0).chunk(world)[rank].reshape(-1, KQ)
                for got in comm.calls:  # this rank's rows x ceil(K/128), row-major
                    assert got.shape == (want_sa.shape[0], KQ) and torch.equal(got, want_sa)
                got_b = [x for c in comm.b_scales for x in (c if isinstance(c, list) else [c])]
                assert len(got_b) == len(Bs)
                for g, t in zip(got_b, bsc):  # N x ceil(K/128) or its tiles', row-major
                    assert g.is_contiguous() and torch.equal(g, t.t()), (g.shape, g.stride())
            # ranks' rows' scales that differ: ovl gets this rank's block of them
            sa = a_scale_1x128(list(full[:-1]), gd, gen)
            comm = FakeComm(world, rank)
            ot._sag_run(comm, A_shard, [Bs[0]], sa, [bsc[0]], gd, [None], [torch.float32],
                        [False])
            blocks_ = sa.movedim(gd, 0).chunk(world)
            assert torch.equal(comm.calls[0], blocks_[rank].reshape(-1, KQ))
            assert world == 1 or not torch.equal(comm.calls[0], blocks_[rank - 1].reshape(-1, KQ))


def test_scaled_block_rs_through_ovl():
    """fused_scaled_matmul_reduce_scatter with block-wise scales through
    ovl: A_scale 1x128 of A's rows (A's leading dimensions, then
    ceil(K/128); any strides, PyTorch's (1, rows) among them), B_scale
    1x128 or 128x128 in PyTorch's layout; PyTorch's definition
    (_scaled_mm(A, B, A_scale, B_scale) + bias, viewed as output_shape,
    reduce-scattered along orig_scatter_dim); ovl given A's rows' scales
    with the scatter dimension first, row-major."""
    gen = torch.Generator().manual_seed(10)
    for world, rank in ((1, 0), (2, 1), (2, 0)):
        for a_shape, osh, osd in (((8, KB), [8, 16], 0), ((4, 6, KB), [4, 6, 16], 1),
                                  ((24, KB), [4, 6, 16], 1), ((4, 6, KB), [4, 6, 16], 0)):
            for mode, red, with_bias in (("1x128", "sum", True), ("128x128", "avg", False)):
                n = 16
                A = fp8(a_shape, gen)
                lead = list(a_shape[:-1])
                sa = a_scale_1x128(lead, 0, gen) if len(lead) == 1 else \
                    (torch.rand([KQ] + lead, generator=gen) + 0.5).movedim(0, -1)
                B = col_major(KB, n, E5, "cpu").copy_(fp8((KB, n), gen, torch.float32))
                sb = b_scale_of(mode, n, gen)
                bias = torch.rand(n, generator=gen).to(torch.float32) if with_bias else None
                comm = FakeComm(world, rank)
                out = ot._srs_run(comm, A, B, sa, sb, red, osd, osh, bias, torch.float32, False)
                p = scaled_mm_ref(A.reshape(-1, KB), B, sa.reshape(-1, KQ), sb)
                if bias is not None:
                    p = p + bias.double()
                p = p.view(osh[:-1] + [n]) * (world if red == "sum" else 1)
                want = p.chunk(world, dim=osd)[rank]
                assert out.is_contiguous() and tuple(out.shape) == tuple(want.shape)
                torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
                got = comm.calls[0]
                want_sa = sa.reshape(osh[:-1] + [KQ]).movedim(osd, 0).reshape(-1, KQ)
                assert got.is_contiguous() and torch.equal(got, want_sa)
                assert comm.b_scales[0].is_contiguous() and torch.equal(comm.b_scales[0], sb.t())


def test_scaled_block_falls_back():
    """A by 128x128 tile (PyTorch's (BlockWise128x128, BlockWise1x128)):
    installed, symm_mem's scaled ops hand it to PyTorch's own kernel (a
    recorder here), the reason said once; torch.ops.ovl's raise ValueError
    naming ovl's rule. Block-wise scales with tensor- or row-wise ones, and
    A's rows not in fours, go to PyTorch's kernel likewise."""
    h = Records()
    logging.getLogger("ovl.torch").addHandler(h)
    calls = []
    real = (sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter,
            ot._sag_facts, ot._srs_facts)

    def cuda_facts(f):  # these CPU tensors' facts, as CUDA tensors' would be
        def g(*args):
            r = f(*args)
            r[0] = ["cuda"] * len(r[0])
            return r
        return g

    def fake_ag(*args):
        calls.append("ag")
        return args[0], []

    def fake_rs(*args):
        calls.append("rs")
        return args[0]

    sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter = fake_ag, fake_rs
    ot._sag_facts, ot._srs_facts = cuda_facts(real[2]), cuda_facts(real[3])
    ot._ROUTER.reset()
    bf = torch.bfloat16
    try:
        A = torch.zeros((256, KB), dtype=E4)
        B = col_major(KB, 16, E4, "cpu")
        tile = torch.ones((2, KQ))    # A's 128x128: ceil(256/128) x ceil(K/128)
        tile_full = torch.ones((4, KQ))  # of the gathered A (world 2)
        b1 = torch.ones((KQ, 16))
        for _ in range(2):
            ot._symm_sag(A, [B], tile_full, [b1], 0, "0", [None], [None], [bf], [False])
        ot._symm_srs(A, B, tile, b1, "sum", 0, 0, "0", [256, 16], None, None, bf)
        ot._symm_sag(A, [B], torch.ones(()), [b1], 0, "0", [None], [None], [bf], [False])
        ot._symm_srs(A[:12], B, torch.ones((12, KQ)), b1, "sum", 0, 0, "0", [12, 16], None,
                     None, bf)
    finally:
        (sm._fused_all_gather_scaled_matmul, sm._fused_scaled_matmul_reduce_scatter,
         ot._sag_facts, ot._srs_facts) = real
        logging.getLogger("ovl.torch").removeHandler(h)
    assert calls == ["ag", "ag", "rs", "ag", "rs"], calls
    st = ot.stats()["fell_back"]
    tile_words = ("128x128 blocks of A (PyTorch's BlockWise128x128), which ovl does not take: it "
                  "cuts A by rows, across ranks and chunks")
    assert st["fused_all_gather_scaled_matmul: A_scale of shape (4, 3): " + tile_words +
              " (A's block-wise scales are 1x128: A's leading dimensions, then ceil(K/128))"] \
        == 2, st
    assert st["fused_scaled_matmul_reduce_scatter: A_scale of shape (2, 3): " + tile_words +
              " (A's block-wise scales are 1x128: A's leading dimensions, then ceil(K/128))"] \
        == 1, st
    assert any("A_scale tensor-wise and B_scales[0] block-wise 1x128: block-wise scales on one "
               "operand only" in k for k in st), st
    assert any("A_scale 1x128 with each rank's block of the output of 6 rows, not a multiple "
               "of 4" in k for k in st), st
    said = [m for m in h.msgs if "runs PyTorch's own kernel" in m and tile_words in m]
    assert len(said) == 2, h.msgs  # once per op
    # torch.ops.ovl's kernels raise (called as functions, not through the dispatcher)
    for fn, args in ((ot._sag_cuda, (A, [B], tile_full, [b1], 0, "default", [None], [None],
                                     [bf], [False])),
                     (ot._srs_cuda, (A, B, tile, b1, "sum", 0, 0, "default", [256, 16], None,
                                     None, bf))):
        e = value_error(fn, *args)
        assert tile_words in e, e


def test_group_comm_on_first_use():
    """A group without a comm: without lazy, PyTorch's kernel (why: no
    comm); with lazy, the comm is made on first use, and where ovld is not
    reachable the group keeps PyTorch's kernel, decided once (the group's
    ranks agree: here the fake process group of one process)."""
    tmp = tempfile.mkdtemp()
    old = os.environ.get("OVL_SOCKET")
    os.environ["OVL_SOCKET"] = os.path.join(tmp, "nobody-here.sock")
    cpu = torch.device("cpu")
    try:
        ot._LAZY[0] = False
        c, why = ot._comm_for("0", cpu)
        assert c is None and "has no ovl comm" in why, why
        ot._LAZY[0] = True
        c, why = ot._comm_for("0", cpu)
        assert c is None and "ovld is not usable from every rank of group '0'" in why, why
        assert "here:" in why, why
        assert ot._NOT_SERVED["0"] == why
        c2, why2 = ot._comm_for("0", cpu)  # decided: not tried again
        assert c2 is None and why2 == why
        assert ot._comm_for("no-such-group", cpu)[1].startswith(
            "group 'no-such-group' is not a process")
    finally:
        ot._NOT_SERVED.clear()
        ot._LAZY[0] = False
        if old is None:
            os.environ.pop("OVL_SOCKET", None)
        else:
            os.environ["OVL_SOCKET"] = old
        shutil.rmtree(tmp, ignore_errors=True)


def test_env_install_failure_keeps_import():
    """OVL_TORCH_INSTALL where install() fails (here: a PyTorch without
    symm_mem): import ovl.torch still works, torch.ops.ovl is there, the
    failure is a warning."""
    pp = os.path.join(SRC, "python")
    code = ("import sys, torch\n"
            "sys.modules['torch.distributed._symmetric_memory'] = None  # no symm_mem here\n"
            "import ovl.torch as t\n"
            "print(t.installed(), hasattr(torch.ops.ovl, 'fused_all_gather_matmul'))\n")
    r = run_py(code, {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "False True", (r.stdout, r.stderr)
    assert "OVL_TORCH_INSTALL is set, but install() failed" in r.stderr, r.stderr


def run_py(code, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_env_install():
    pp = os.path.join(SRC, "python")
    r = run_py("import ovl.torch as t; print(t.installed())",
               {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)
    r = run_py("import ovl.torch as t; print(t.installed())",
               {"OVL_TORCH_INSTALL": "0", "PYTHONPATH": pp})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)
    # a program that never imports ovl: ovl's sitecustomize on PYTHONPATH
    auto = os.path.join(pp, "ovl", "_autoinstall")
    code = ("import sys, torch; m = sys.modules.get('ovl.torch'); "
            "print(m is not None and m.installed())")
    r = run_py(code, {"OVL_TORCH_INSTALL": "1", "PYTHONPATH": auto + os.pathsep + pp})
    assert r.returncode == 0 and r.stdout.strip() == "True", (r.stdout, r.stderr)
    r = run_py(code, {"OVL_TORCH_INSTALL": "", "PYTHONPATH": auto + os.pathsep + pp})
    assert r.returncode == 0 and r.stdout.strip() == "False", (r.stdout, r.stderr)


if __name__ == "__main__":
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    ot.uninstall()  # OVL_TORCH_INSTALL in the environment installed it at import
    try:
        run_tests([test_install_uninstall, test_scaled_not_routed_on_another_schema,
                   test_old_pytorch_refused, test_falls_back_once_per_reason,
                   test_scaled_schemas, test_scaled_ag_fake, test_scaled_rs_fake,
                   test_scaled_ag_through_ovl, test_scaled_ag_one_op_for_bs,
                   test_scaled_rs_through_ovl,
                   test_scaled_ovl_ops_fall_back, test_scaled_install_falls_back_once_per_reason,
                   test_scaled_block_layouts, test_scaled_block_fake,
                   test_scaled_block_ag_through_ovl, test_scaled_block_rs_through_ovl,
                   test_scaled_block_falls_back,
                   test_group_comm_on_first_use, test_env_install,
                   test_env_install_failure_keeps_import])
    finally:
        ot.uninstall()
