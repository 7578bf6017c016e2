"""ovl.torch: ovld's all-gather + GEMM for PyTorch.

    import torch, torch.distributed as dist, ovl.torch
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    ovl.torch.init()                        # the ovl comm of the default group
    A, (C0, C1) = torch.ops.ovl.fused_all_gather_matmul(
        A_shard, [B0, B1], 0, dist.group.WORLD.group_name)

- init(group=None, client=None, socket=None): the ovl comm of a
  torch.distributed process group (job id made by the group's rank 0 and
  broadcast; world and rank of the group; device torch.cuda.current_device()).
- torch.ops.ovl.fused_all_gather_matmul: the schema of PyTorch's
  torch.ops.symm_mem.fused_all_gather_matmul, every B in ONE ovl op (A
  gathered once); a fake impl for torch.compile.
- ColumnParallelLinear: nn.Module, forward through the op, backward through
  autograd (reduce-scatter of the input's gradient).
- RowParallelLinear: nn.Module, the second layer of a sequence-parallel MLP
  (ColumnParallelLinear -> activation -> RowParallelLinear): local matmul,
  reduce-scatter of the rows; backward through the op (grad_out gathered
  once: the input's and the weight's gradients), the replicated bias's
  gradient all-reduced.
- torch.ops.ovl.fused_all_gather_scaled_matmul and
  fused_scaled_matmul_reduce_scatter: PyTorch's scaled (fp8) symm_mem ops'
  schemas and fake kernels, through ovld's scaled ops where ovl takes the
  call (ovl._route), PyTorch's unfused fallback where not (op_stats()).
- install(group=None, lazy=True) / uninstall() / installed() / stats():
  torch.ops.symm_mem.fused_all_gather_matmul and fused_matmul_reduce_scatter
  (what torch.compile's micro-pipeline TP pass emits), and their scaled
  (fp8) twins, through ovld, PyTorch's own kernel for every call ovl does
  not take (ovl._route), each reason logged once; OVL_TORCH_INSTALL=1
  installs at import.

torch is imported here, never by `import ovl`. See python/README.md.
"""
import functools
import os
import threading

try:
    import torch
    import torch.distributed as dist
except ImportError as _e:
    raise ImportError(
        "ovl.torch needs PyTorch 2.4 or later, which is not importable here (%s): install "
        "torch (pip install 'ovl[torch]'); `import ovl` alone works without it" % _e,
        name=__name__) from _e

from . import _core, _route

__all__ = ["init", "get_comm", "shutdown", "fused_all_gather_matmul",
           "fused_matmul_reduce_scatter", "fused_all_gather_scaled_matmul",
           "fused_scaled_matmul_reduce_scatter", "ColumnParallelLinear", "RowParallelLinear",
           "install", "uninstall", "installed", "stats", "op_stats"]

_MU = threading.Lock()
_COMMS = {}      # group name -> ovl Comm
_CLIENTS = []    # clients made by init (closed by shutdown)


def _group_names(group):
    """The names the op may be called with for `group`: its group_name
    (PyTorch's, "0" for the default group in recent versions), and
    "default" for the default group."""
    names = []
    gn = getattr(group, "group_name", None)
    if gn:
        names.append(gn)
    if group is None or group == dist.GroupMember.WORLD:
        names.append("default")
    return names


def init(group=None, client=None, socket=None):
    """The ovl comm of torch.distributed group `group` (the default group if
    None): rank 0 of the group makes the job id (Client.new_job_id()), every
    rank gets it through torch.distributed.broadcast_object_list; world and
    rank are the group's, the device torch.cuda.current_device(). client: an
    ovl.Client to use (else one is connected: `socket`, or libovl's default
    rule). Collective over the group. Returns the comm, remembered under the
    group's name for torch.ops.ovl.fused_all_gather_matmul."""
    if not dist.is_initialized():
        raise RuntimeError("ovl.torch.init: torch.distributed is not initialized "
                           "(dist.init_process_group first)")
    g = group if group is not None else dist.GroupMember.WORLD
    world = dist.get_world_size(g)
    rank = dist.get_rank(g)
    obj = [_core.Client.new_job_id("torch") if rank == 0 else None]
    dist.broadcast_object_list(obj, src=dist.get_global_rank(g, 0), group=g)
    job = obj[0]
    if client is None:
        client = _core.connect(socket)
        with _MU:
            _CLIENTS.append(client)
    comm = client.comm(job, world, rank, torch.cuda.current_device())
    with _MU:
        for n in _group_names(g):
            _COMMS[n] = comm
    return comm


def get_comm(group_name="default"):
    """The comm init() made for the group of that name."""
    with _MU:
        c = _COMMS.get(group_name)
    if c is None:
        raise RuntimeError("ovl.torch: no ovl comm for group %r (call ovl.torch.init(group) on "
                           "every rank first; known: %s)" % (group_name, sorted(_COMMS)))
    return c


def shutdown():
    """Closes the comms init() made, and the clients it connected."""
    with _MU:
        comms = list({id(c): c for c in _COMMS.values()}.values())
        _COMMS.clear()
        clients = list(_CLIENTS)
        _CLIENTS.clear()
    err = None
    for c in comms:
        try:
            c.close()
        except Exception as e:  # the first error, after everything is closed
            err = err or e
    for c in clients:
        c.close()
    if err is not None:
        raise err


def _world_of(group_name):
    with _MU:
        c = _COMMS.get(group_name)
    if c is not None:
        return c.world
    if group_name == "default":
        return dist.get_world_size()
    from torch.distributed import distributed_c10d as c10d
    return c10d._get_group_size_by_name(group_name)


# -- the op -----------------------------------------------------------------

SCHEMA = ("fused_all_gather_matmul(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, "
          "*, bool return_A=True) -> (Tensor?, Tensor[])")

_LIB = torch.library.Library("ovl", "DEF")  # noqa: TOR901
_LIB.define(SCHEMA)


def _norm_dim(A_shard, gather_dim):
    nd = A_shard.dim()
    if nd < 2:
        raise ValueError("fused_all_gather_matmul: A_shard needs 2 dimensions or more, got %d"
                         % nd)
    if not -nd <= gather_dim < nd:
        raise ValueError("gather_dim %d out of range for %d dimensions" % (gather_dim, nd))
    return gather_dim % nd


def _check_bs(Bs, kk):
    for i, B in enumerate(Bs):
        if B.dim() != 2:
            raise ValueError("Bs[%d]: a 2-D matrix is needed, got %d dimensions" % (i, B.dim()))
        if B.shape[0] != kk:
            raise ValueError("Bs[%d]: %d x %d does not fit the gathered A's %d columns"
                             % (i, B.shape[0], B.shape[1], kk))


def _fake(A_shard, Bs, gather_dim, group_name, return_A=True):
    """Shapes and strides of what the CUDA impl returns (those of PyTorch's
    op): gather_dim < last: the tensor gathered along gather_dim, contiguous
    with gather_dim moved to the front, moved back; gather_dim = last: A
    contiguous with its last dimension world x K, outputs contiguous."""
    gd = _norm_dim(A_shard, gather_dim)
    ws = _world_of(group_name)
    if len(Bs) == 0 or len(Bs) > 8:
        raise ValueError("fused_all_gather_matmul: 1 to 8 Bs, got %d" % len(Bs))
    nd = A_shard.dim()
    if gd == nd - 1:
        shape = list(A_shard.shape)
        _check_bs(Bs, ws * shape[-1])
        A = A_shard.new_empty(shape[:-1] + [ws * shape[-1]]) if return_A else None
        return A, [A_shard.new_empty(shape[:-1] + [B.shape[1]]) for B in Bs]
    x = A_shard.movedim(gd, 0)
    lead = [ws * x.shape[0]] + list(x.shape[1:-1])
    _check_bs(Bs, x.shape[-1])
    A = A_shard.new_empty(lead + [x.shape[-1]]).movedim(0, gd) if return_A else None
    return A, [A_shard.new_empty(lead + [B.shape[1]]).movedim(0, gd) for B in Bs]


def _rows(t):
    """t as a matrix ovl takes (rows contiguous), copying only if needed."""
    if t.stride(-1) != 1 or (t.shape[0] > 1 and t.stride(0) < t.shape[1]):
        t = t.contiguous()
    return t


def _b_args(Bs):
    """(the matrices to hand ovl, transb): all Bs column-major (B.t()
    contiguous along rows): their transposes with transb (ovl's transb takes
    B n x k row-major); else each B row-major (copied if not)."""
    def rowmajor(B):
        return B.stride(1) == 1 and (B.shape[0] <= 1 or B.stride(0) >= B.shape[1])

    def colmajor(B):
        return B.stride(0) == 1 and B.shape[1] > 1 and B.stride(1) >= B.shape[0]
    if all(colmajor(B) and not rowmajor(B) for B in Bs):
        return [B.t() for B in Bs], True
    return [_rows(B) for B in Bs], False


def _run(comm, x2, bs, ns, return_A):
    rows, k = x2.shape
    ws = comm.world
    outs = [torch.empty((ws * rows, n), dtype=x2.dtype, device=x2.device) for n in ns]
    a_out = torch.empty((ws * rows, k), dtype=x2.dtype, device=x2.device) if return_A else None
    bmats, transb = _b_args(bs)
    comm.all_gather_matmul(x2, bmats, out=outs, a_out=a_out, transb=transb,
                           stream=torch.cuda.current_stream(x2.device))
    return outs, a_out


def _cuda(A_shard, Bs, gather_dim, group_name, return_A=True):
    """ONE ovl op for every B: A_shard with gather_dim moved to the front,
    flattened to rows x K; ovld gathers the rows of every rank (in rank
    order) and multiplies them by each B; the results are reshaped and moved
    back. gather_dim = last (K gathered): each B (world*K x N) is laid out
    K x (world*N) (its world row blocks side by side), one op gives every
    rank's rows times every block, and the blocks of the diagonal are summed
    (world times the FLOPs: correct, not fast)."""
    comm = get_comm(group_name)
    gd = _norm_dim(A_shard, gather_dim)
    if not 1 <= len(Bs) <= 8:
        raise ValueError("fused_all_gather_matmul: 1 to 8 Bs, got %d" % len(Bs))
    for i, B in enumerate(Bs):
        if B.dtype != A_shard.dtype:
            raise ValueError("Bs[%d]: dtype %s, A_shard's is %s" % (i, B.dtype, A_shard.dtype))
    ws = comm.world
    nd = A_shard.dim()
    if gd == nd - 1:
        shape = list(A_shard.shape)
        k = shape[-1]
        _check_bs(Bs, ws * k)
        x2 = _rows(A_shard.reshape(-1, k))
        rows = x2.shape[0]
        wide = [B.reshape(ws, k, B.shape[1]).permute(1, 0, 2).reshape(k, ws * B.shape[1])
                for B in Bs]
        outs, a_out = _run(comm, x2, wide, [w.shape[1] for w in wide], return_A)
        res = []
        for B, c in zip(Bs, outs):
            n = B.shape[1]
            d = c.view(ws, rows, ws, n).diagonal(dim1=0, dim2=2)  # rows x n x ws
            res.append(d.float().sum(-1).to(A_shard.dtype).reshape(shape[:-1] + [n]))
        A = None
        if return_A:
            A = a_out.view(ws, rows, k).permute(1, 0, 2).reshape(shape[:-1] + [ws * k])
        return A, res
    x = A_shard.movedim(gd, 0)
    lead = [ws * x.shape[0]] + list(x.shape[1:-1])
    k = x.shape[-1]
    _check_bs(Bs, k)
    x2 = _rows(x.reshape(-1, k))
    outs, a_out = _run(comm, x2, list(Bs), [B.shape[1] for B in Bs], return_A)
    A = a_out.view(lead + [k]).movedim(0, gd) if return_A else None
    return A, [c.view(lead + [c.shape[1]]).movedim(0, gd) for c in outs]


_LIB.impl("fused_all_gather_matmul", _cuda, "CUDA")
torch.library.register_fake("ovl::fused_all_gather_matmul", _fake, lib=_LIB)


def fused_all_gather_matmul(A_shard, Bs, gather_dim=0, group_name="default", *, return_A=True):
    """torch.ops.ovl.fused_all_gather_matmul (PyTorch's symm_mem op's
    arguments): (A or None, [A @ B for B in Bs]), A the all-gather of A_shard
    along gather_dim over the group of `group_name`."""
    return torch.ops.ovl.fused_all_gather_matmul(A_shard, list(Bs), gather_dim, group_name,
                                                 return_A=return_A)


# -- the reduce-scatter op --------------------------------------------------

SCHEMA_RS = ("fused_matmul_reduce_scatter(Tensor A, Tensor B, str reduce_op, int scatter_dim, "
             "str group_name) -> Tensor")
_LIB.define(SCHEMA_RS)


def _rs_dims(A, B, reduce_op, scatter_dim, ws):
    """The checks of fused_matmul_reduce_scatter's arguments; the scatter
    dimension, normalized."""
    nd = A.dim()
    if nd < 2:
        raise ValueError("fused_matmul_reduce_scatter: A needs 2 dimensions or more, got %d" % nd)
    if B.dim() != 2 or B.shape[0] != A.shape[-1]:
        raise ValueError("fused_matmul_reduce_scatter: B %s does not fit A's %d columns"
                         % (tuple(B.shape), A.shape[-1]))
    if reduce_op not in ("sum", "avg"):
        raise ValueError("fused_matmul_reduce_scatter: reduce_op %r: sum or avg" % (reduce_op,))
    if not -nd <= scatter_dim < nd:
        raise ValueError("scatter_dim %d out of range for %d dimensions" % (scatter_dim, nd))
    sd = scatter_dim % nd
    if sd == nd - 1:  # the product's columns: B's
        if B.shape[1] % ws:
            raise ValueError("fused_matmul_reduce_scatter: B's %d columns (scatter_dim %d, the "
                             "last) are not a multiple of the world %d" % (B.shape[1], sd, ws))
        return sd
    if A.shape[sd] % ws:
        raise ValueError("fused_matmul_reduce_scatter: dimension %d of A (%d) is not a multiple "
                         "of the world %d" % (sd, A.shape[sd], ws))
    return sd


def _rs_shape(A, B, sd, ws):
    """fused_matmul_reduce_scatter's output shape: A @ B's, dimension sd
    divided by the world."""
    shape = list(A.shape[:-1]) + [B.shape[1]]
    shape[sd] //= ws
    return shape


def _rs_fake(A, B, reduce_op, scatter_dim, group_name):
    """The output of the CUDA impl: A @ B with dimension scatter_dim divided
    by the world, contiguous, as PyTorch's own op's (its fake kernel's
    strides are what Inductor holds a replacement to)."""
    ws = _world_of(group_name)
    sd = _rs_dims(A, B, reduce_op, scatter_dim, ws)
    if B.dtype != A.dtype:  # as the CUDA impl refuses it
        raise ValueError("B: dtype %s, A's is %s" % (B.dtype, A.dtype))
    return A.new_empty(_rs_shape(A, B, sd, ws))


def _rs_cuda(A, B, reduce_op, scatter_dim, group_name):
    """ONE ovl op: A with scatter_dim moved to the front, flattened to rows
    x K (rank r keeps rows block r, which is its share of scatter_dim), times
    B, summed (or averaged) over the group's ranks by ovld; the rows are
    reshaped and moved back, contiguous as PyTorch's op returns them (a
    copy where scatter_dim is not the first)."""
    comm = get_comm(group_name)
    ws = comm.world
    sd = _rs_dims(A, B, reduce_op, scatter_dim, ws)
    if B.dtype != A.dtype:
        raise ValueError("B: dtype %s, A's is %s" % (B.dtype, A.dtype))
    stream = torch.cuda.current_stream(A.device)
    if sd == A.dim() - 1:
        # The product's columns scattered are its transpose's rows:
        # (A2 @ B)^T = B^T @ A2^T, one ovl op with B^T (N x K) as its A and
        # A2 (rows x K) as its B, transposed; this rank gets N/world rows of
        # the transpose, viewed back as its columns of A @ B.
        a2 = _rows(A.reshape(-1, A.shape[-1]))
        outt = torch.empty((B.shape[1] // ws, a2.shape[0]), dtype=A.dtype, device=A.device)
        comm.matmul_reduce_scatter(_rows(B.t()), a2, reduce_op=reduce_op, out=outt, transb=True,
                                   stream=stream)
        res = outt.view([B.shape[1] // ws] + list(A.shape[:-1])).movedim(0, -1)
        return res.contiguous()
    x = A.movedim(sd, 0)
    k = x.shape[-1]
    x2 = _rows(x.reshape(-1, k))
    (b,), transb = _b_args([B])
    out = torch.empty((x2.shape[0] // ws, B.shape[1]), dtype=A.dtype, device=A.device)
    comm.matmul_reduce_scatter(x2, b, reduce_op=reduce_op, out=out, transb=transb, stream=stream)
    res = out.view([x.shape[0] // ws] + list(x.shape[1:-1]) + [B.shape[1]]).movedim(0, sd)
    return res.contiguous()


_LIB.impl("fused_matmul_reduce_scatter", _rs_cuda, "CUDA")
torch.library.register_fake("ovl::fused_matmul_reduce_scatter", _rs_fake, lib=_LIB)


def fused_matmul_reduce_scatter(A, B, reduce_op="sum", scatter_dim=0, group_name="default"):
    """torch.ops.ovl.fused_matmul_reduce_scatter (PyTorch's symm_mem op's
    arguments): A @ B reduce-scattered along scatter_dim over the group of
    `group_name` (reduce_op "sum" or "avg"): this rank's share of that
    dimension of the sum of every rank's product."""
    return torch.ops.ovl.fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)


# -- the scaled (fp8) ops ---------------------------------------------------
#
# PyTorch's symm_mem scaled ops, with exactly their schemas (torch 2.10's
# torch/distributed/_symmetric_memory/__init__.py): A and B fp8, scaled as
# torch._scaled_mm scales them, in one of ovl's scaled ops (ovl_scaling_t)
# per B where ovl takes the call (ovl._route: why_not_scaled_ag / _rs), and
# PyTorch's own unfused fallback (_fused_*_fallback: a functional
# collective and torch._scaled_mm) where it does not, each reason said
# once (op_stats() counts). No autograd: PyTorch's scaled ops have none.

SCHEMA_SCALED_AG = (
    "fused_all_gather_scaled_matmul(Tensor A, Tensor[] Bs, Tensor A_scale, Tensor[] B_scales, "
    "int gather_dim, str group_name, Tensor?[] biases, Tensor?[] result_scales, "
    "ScalarType?[] out_dtypes, bool[] use_fast_accum) -> (Tensor, Tensor[])")
SCHEMA_SCALED_RS = (
    "fused_scaled_matmul_reduce_scatter(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, "
    "str reduce_op, int orig_scatter_dim, int scatter_dim_after_maybe_reshape, str group_name, "
    "SymInt[]? output_shape, Tensor? bias=None, Tensor? result_scale=None, "
    "ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor")
# what Inductor keeps for PyTorch's ops: their outputs' strides as the fake
# kernels say (PyTorch's carry the same tag)
_FIXED = getattr(getattr(torch._C, "Tag", None), "needs_fixed_stride_order", None)
_LIB.define(SCHEMA_SCALED_AG, tags=[_FIXED] if _FIXED is not None else [])
_LIB.define(SCHEMA_SCALED_RS, tags=[_FIXED] if _FIXED is not None else [])
_SAG, _SRS = "fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter"

# torch.ops.ovl's scaled calls that ovl ran, and those it handed to
# PyTorch's fallback, by reason (op_stats())
_OPS_ROUTER = _route.Router(namespace="ovl", kernel="PyTorch's unfused fallback",
                            counter="op_stats")


def _as_dtype(d):
    """A torch.dtype (or None) from what the dispatcher passes for a
    ScalarType: a dtype, or an int of c10's ScalarType for ScalarType?[]."""
    if d is None or isinstance(d, torch.dtype):
        return d
    return _symm_mem()._maybe_convert_scalar_types_to_dtypes([d])[0]


def _c10d_name(group_name):
    """The c10d name of a group ovl knows as group_name ("default": the
    default group's), for PyTorch's fallbacks."""
    if group_name == "default":
        return dist.group.WORLD.group_name
    return group_name


def _stream_of(t):
    return torch.cuda.current_stream(t.device) if t.is_cuda else None


def _tdesc(t):
    return None if t is None else (list(t.shape), _dtype_name(t))


def _sag_facts(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales, out_dtypes,
               use_fast_accum, world):
    """The arguments of _route.why_not_scaled_ag for these tensors
    (out_dtypes: torch dtypes), as a list."""
    ts = ([A_shard, A_scale] + list(Bs) + list(B_scales) + [b for b in biases if b is not None]
          + [r for r in result_scales if r is not None])
    return [
        [t.device.type for t in ts], _dtype_name(A_shard), [_dtype_name(B) for B in Bs],
        list(A_shard.shape), [list(B.shape) for B in Bs], [list(B.stride()) for B in Bs],
        _tdesc(A_scale), [_tdesc(t) for t in B_scales], gather_dim, [_tdesc(b) for b in biases],
        [r is not None for r in result_scales],
        [None if d is None else str(d).replace("torch.", "") for d in out_dtypes],
        list(use_fast_accum), world]


def _sag_why(*args):
    return _route.why_not_scaled_ag(*_sag_facts(*args))


def _srs_facts(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
               scatter_dim_after_maybe_reshape, output_shape, bias, result_scale, out_dtype,
               world):
    """The arguments of _route.why_not_scaled_rs for these tensors."""
    ts = [A, B, A_scale, B_scale] + [t for t in (bias, result_scale) if t is not None]
    return [
        [t.device.type for t in ts], _dtype_name(A), _dtype_name(B), list(A.shape),
        list(B.shape), list(B.stride()), _tdesc(A_scale), _tdesc(B_scale), reduce_op,
        orig_scatter_dim, scatter_dim_after_maybe_reshape,
        None if output_shape is None else [int(x) for x in output_shape], _tdesc(bias),
        result_scale is not None, None if out_dtype is None else _dtype_name_of(out_dtype),
        world]


def _srs_why(*args):
    return _route.why_not_scaled_rs(*_srs_facts(*args))


def _dtype_name_of(d):
    return str(d).replace("torch.", "")


def _sag_layout(t, gather_dim, world, ns, out_dtypes):
    """(A, [outputs]) of fused_all_gather_scaled_matmul as PyTorch's Meta
    kernel makes them, new tensors of t's kind (t: A_shard, or a meta
    tensor of its shape): A gathered contiguous into (world, *shard) and
    moved to gather_dim as PyTorch views it (a copy but at world 1), each
    output contiguous with gather_dim first, moved back."""
    shape = list(t.shape)
    A = t.new_empty([world * shape[0]] + shape[1:]).view([world] + shape)
    A = A.movedim(gather_dim + 1, 1).flatten(0, 1)
    lead = list(A.shape[:-1])
    outs = [t.new_empty(lead + [n], dtype=od if od is not None else t.dtype).movedim(0, gather_dim)
            for n, od in zip(ns, out_dtypes)]
    return A.movedim(0, gather_dim), outs


@functools.lru_cache(maxsize=256)
def _sag_strides(shape, dtype, gather_dim, world, ns, out_dtypes):
    """The strides of _sag_layout's tensors (for the results ovl computed)."""
    A, outs = _sag_layout(torch.empty(shape, dtype=dtype, device="meta"), gather_dim, world,
                          ns, out_dtypes)
    return A.stride(), [o.stride() for o in outs]


def _sag_checks(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales, out_dtypes,
                use_fast_accum, world):
    """What PyTorch's kernels raise ValueError for, said the same way."""
    nd = A_shard.dim()
    if nd < 2:
        raise ValueError("A_shard must be a matrix")
    for B in Bs:
        if B.dim() != 2:
            raise ValueError("B must be a matrix")
    for what, xs in (("B_scales", B_scales), ("biases", biases),
                     ("result_scales", result_scales), ("out_dtypes", out_dtypes),
                     ("use_fast_accum", use_fast_accum)):
        if len(xs) != len(Bs):
            raise ValueError("len(%s) must be the same as len(Bs)" % what)
    if not 0 <= gather_dim < nd:
        raise ValueError("Invalid gather_dim")
    why = _route.ag_scale_refusal(list(A_shard.shape), list(A_scale.shape), gather_dim, world,
                                  (A_shard.shape, A_scale.shape))
    if why is not None:  # PyTorch's words (and ovl's where they say more)
        raise ValueError(why)


def _sag_fake(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
              out_dtypes, use_fast_accum):
    """PyTorch's Meta kernel's shapes, dtypes and strides (_sag_layout)."""
    out_dtypes = [_as_dtype(d) for d in out_dtypes]
    ws = _world_of(group_name)
    _sag_checks(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales, out_dtypes,
                use_fast_accum, ws)
    return _sag_layout(A_shard, gather_dim, ws, [B.shape[1] for B in Bs], out_dtypes)


def _b_scale_mode(B, t):
    """What B's scale t (PyTorch's scale_b for B K x N) is: tensor, row,
    1x128, 128x128 (_route.b_scale_mode)."""
    return _route.b_scale_mode(list(t.shape), B.shape[1], B.shape[0])


def _ovl_b_scale(B, t):
    """B's scale in ovl's layout: block-wise ones as ovl_scale_shape's dense
    row-major matrices of B's N x K, scale_b.t() (PyTorch's scale_b of B K x
    N is (ceil(K/128), N) or (ceil(K/128), ceil(N/128))) made contiguous (a
    copy where it is not, on torch's current stream: the op's); others as
    they are."""
    return t.t().contiguous() if _b_scale_mode(B, t) in _route.BLOCK_MODES else t


def _one_scaled_op(Bs, B_scales, biases, out_dtypes, use_fast_accum):
    """Whether the Bs fit one ovl scaled op: one B, or Bs of one dtype, one
    output dtype, one fast_accum, their scales of one kind (one, one per
    column, 1x128 or 128x128 blocks) and a bias on every B or on none
    (ovl_scaling_t)."""
    return (len({B.dtype for B in Bs}) == 1 and len(set(out_dtypes)) == 1
            and len({bool(f) for f in use_fast_accum}) == 1
            and len({_b_scale_mode(B, t) for B, t in zip(Bs, B_scales)}) == 1
            and len({b is None for b in biases}) == 1)


def _sag_run(comm, A_shard, Bs, A_scale, B_scales, gd, biases, out_dtypes, use_fast_accum):
    """ovl's scaled all-gather + GEMM: one ovl op for every B where they fit
    one (_one_scaled_op), else one per B (A gathered by each, a_out kept
    from the first): A_shard
    with gather_dim moved to the front, flattened to rows x K, its scales
    (one; this rank's rows; or this rank's share of the replicated ones,
    row-wise or 1x128, made row-major) alike; B as _scaled_mm takes it (K x
    N column-major) goes to ovld as the N x K it is the transpose of, with
    transb, its block scales likewise (_ovl_b_scale)."""
    ws = comm.world
    one_op = _one_scaled_op(Bs, B_scales, biases, out_dtypes, use_fast_accum)
    x = A_shard.movedim(gd, 0)
    lead = [ws * x.shape[0]] + list(x.shape[1:-1])
    k = x.shape[-1]
    x2 = _rows(x.reshape(-1, k))
    rows = x2.shape[0]
    mode = _route.ag_scale_mode(list(A_shard.shape), list(A_scale.shape), gd, ws)
    if mode == "tensor":
        sa = A_scale.reshape(1)
    elif mode == "row-sharded":
        sa = A_scale.movedim(gd, 0).reshape(-1).contiguous()
    elif mode == "row-replicated":  # every rank's rows' scales; this rank's block of them
        sa = A_scale.movedim(gd, 0).chunk(ws)[comm.rank].reshape(-1).contiguous()
    else:  # block-replicated: every rank's rows' 1x128 scales; this rank's rows x ceil(K/128)
        sa = A_scale.movedim(gd, 0).chunk(ws)[comm.rank].reshape(-1, A_scale.shape[-1])
        sa = sa.contiguous()  # ovl's layout: row-major (PyTorch's is (1, rows) strides)
    B_scales = [_ovl_b_scale(B, t) for B, t in zip(Bs, B_scales)]
    stream = _stream_of(x2)
    a_out = torch.empty((ws * rows, k), dtype=A_shard.dtype, device=A_shard.device)
    outs = [torch.empty((ws * rows, B.shape[1]), dtype=out_dtypes[i], device=A_shard.device)
            for i, B in enumerate(Bs)]
    if one_op:
        # the Bs share what one scaled op shares: A is gathered once for all
        comm.all_gather_matmul(x2, list(Bs), out=outs, a_out=a_out, a_scale=sa,
                               b_scale=list(B_scales), out_dtype=out_dtypes[0],
                               bias=None if biases[0] is None else list(biases),
                               fast_accum=bool(use_fast_accum[0]), stream=stream)
    else:
        for i, B in enumerate(Bs):
            comm.all_gather_matmul(x2, B, out=outs[i], a_out=a_out if i == 0 else None,
                                   a_scale=sa, b_scale=B_scales[i], out_dtype=out_dtypes[i],
                                   bias=biases[i], fast_accum=bool(use_fast_accum[i]),
                                   stream=stream)
    A = a_out.view(lead + [k]).movedim(0, gd)
    outs = [o.view(lead + [o.shape[1]]).movedim(0, gd) for o in outs]
    a_st, o_st = _sag_strides(tuple(A_shard.shape), A_shard.dtype, gd, ws,
                              tuple(B.shape[1] for B in Bs), tuple(out_dtypes))
    return _restride(A, a_st), [_restride(o, st) for o, st in zip(outs, o_st)]


def _sag_cuda(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
              out_dtypes, use_fast_accum):
    """torch.ops.ovl.fused_all_gather_scaled_matmul: ovl where
    _route.why_not_scaled_ag takes the call (the group's comm from init),
    PyTorch's _fused_all_gather_scaled_matmul_fallback where not."""
    out_dtypes = [_as_dtype(d) for d in out_dtypes]
    ws = _world_of(group_name)
    _sag_checks(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales, out_dtypes,
                use_fast_accum, ws)
    why = _sag_why(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales,
                   out_dtypes, use_fast_accum, ws)
    if why is not None:
        _OPS_ROUTER.fell_back(_SAG, why)
        return _symm_mem()._fused_all_gather_scaled_matmul_fallback(
            A_shard, list(Bs), A_scale, list(B_scales), gather_dim, _c10d_name(group_name),
            list(biases), list(result_scales), out_dtypes, list(use_fast_accum))
    comm = get_comm(group_name)
    _OPS_ROUTER.took(_SAG)
    return _sag_run(comm, A_shard, list(Bs), A_scale, list(B_scales), gather_dim, list(biases),
                    out_dtypes, list(use_fast_accum))


def _srs_shape(A, B, orig_scatter_dim, output_shape, world):
    """The output's shape: output_shape (None: A's leading dimensions) with
    B's N last, orig_scatter_dim divided by the world."""
    osh = list(output_shape) if output_shape is not None else list(A.shape[:-1]) + [B.shape[1]]
    shape = osh[:-1] + [B.shape[1]]
    if not 0 <= orig_scatter_dim < len(shape):
        raise ValueError("Invalid scatter dim for 3D+ output tensor")
    if shape[orig_scatter_dim] % world:
        raise ValueError("fused_scaled_matmul_reduce_scatter: dimension %d of the output (%d) is "
                         "not a multiple of the world %d" % (orig_scatter_dim,
                                                             shape[orig_scatter_dim], world))
    shape[orig_scatter_dim] //= world
    return shape


def _srs_checks(A, B, A_scale):
    if A.dim() < 2:
        raise ValueError("A_shard must be a matrix")
    if B.dim() != 2:
        raise ValueError("B must be a matrix")
    why = _route.rs_scale_refusal(list(A.shape), list(A_scale.shape), (A.shape, A_scale.shape))
    if why is not None:
        raise ValueError(why)


def _srs_fake(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
              scatter_dim_after_maybe_reshape, group_name, output_shape, bias=None,
              result_scale=None, out_dtype=None, use_fast_accum=False):
    """PyTorch's Meta kernel's output: A @ B viewed as output_shape (None:
    A's leading dimensions) with N last, orig_scatter_dim divided by the
    world, contiguous, in out_dtype (None: A's)."""
    _srs_checks(A, B, A_scale)
    shape = _srs_shape(A, B, orig_scatter_dim, output_shape, _world_of(group_name))
    out_dtype = _as_dtype(out_dtype)
    return A.new_empty(shape, dtype=out_dtype if out_dtype is not None else A.dtype)


def _srs_run(comm, A, B, A_scale, B_scale, reduce_op, sd, output_shape, bias, out_dtype,
             use_fast_accum):
    """ovl's scaled GEMM + reduce-scatter, ONE ovl op: A viewed as
    output_shape's leading dimensions x K, orig_scatter_dim moved to the
    front, flattened to rows x K (rank r keeps rows block r: its share of
    that dimension), its row or 1x128 scales alike (ovl's layout: rows x 1
    or rows x ceil(K/128), row-major); B as _scaled_mm takes it, to ovld
    transposed, its block scales too (_ovl_b_scale); the rows reshaped and
    moved back, contiguous."""
    ws = comm.world
    k, n = A.shape[-1], B.shape[1]
    osh = list(output_shape) if output_shape is not None else list(A.shape[:-1]) + [n]
    lead = osh[:-1]
    x = A.reshape(lead + [k]).movedim(sd, 0)
    x2 = _rows(x.reshape(-1, k))
    if A_scale.numel() == 1:
        sa = A_scale.reshape(1)
    elif A_scale.shape[-1] == 1:
        sa = A_scale.reshape(lead + [1]).movedim(sd, 0).reshape(-1).contiguous()
    else:  # 1x128: A's leading dimensions, then ceil(K/128); ovl's layout, row-major
        q = A_scale.shape[-1]
        sa = A_scale.reshape(lead + [q]).movedim(sd, 0).reshape(-1, q).contiguous()
    out = torch.empty((x2.shape[0] // ws, n), dtype=out_dtype, device=A.device)
    comm.matmul_reduce_scatter(x2, B, reduce_op=reduce_op, out=out, a_scale=sa,
                               b_scale=_ovl_b_scale(B, B_scale),
                               out_dtype=out_dtype, bias=bias, fast_accum=bool(use_fast_accum),
                               stream=_stream_of(x2))
    res = out.view([x.shape[0] // ws] + list(x.shape[1:-1]) + [n]).movedim(0, sd)
    return res.contiguous()


def _srs_cuda(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
              scatter_dim_after_maybe_reshape, group_name, output_shape, bias=None,
              result_scale=None, out_dtype=None, use_fast_accum=False):
    """torch.ops.ovl.fused_scaled_matmul_reduce_scatter: ovl where
    _route.why_not_scaled_rs takes the call, PyTorch's
    _fused_scaled_matmul_reduce_scatter_fallback where not. output_shape
    None is A's leading dimensions and N (PyTorch's kernels need it)."""
    out_dtype = _as_dtype(out_dtype)
    _srs_checks(A, B, A_scale)
    if output_shape is None:
        output_shape = list(A.shape[:-1]) + [B.shape[1]]
    ws = _world_of(group_name)
    why = _srs_why(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                   scatter_dim_after_maybe_reshape, output_shape, bias, result_scale, out_dtype,
                   ws)
    if why is not None:
        _OPS_ROUTER.fell_back(_SRS, why)
        return _symm_mem()._fused_scaled_matmul_reduce_scatter_fallback(
            A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
            _c10d_name(group_name), list(output_shape), bias, result_scale, out_dtype,
            use_fast_accum)
    comm = get_comm(group_name)
    _OPS_ROUTER.took(_SRS)
    return _srs_run(comm, A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, output_shape,
                    bias, out_dtype, use_fast_accum)


_LIB.impl(_SAG, _sag_cuda, "CUDA")
torch.library.register_fake("ovl::" + _SAG, _sag_fake, lib=_LIB)
_LIB.impl(_SRS, _srs_cuda, "CUDA")
torch.library.register_fake("ovl::" + _SRS, _srs_fake, lib=_LIB)


def fused_all_gather_scaled_matmul(A_shard, Bs, A_scale, B_scales, gather_dim=0,
                                   group_name="default", biases=None, result_scales=None,
                                   out_dtypes=None, use_fast_accum=None):
    """torch.ops.ovl.fused_all_gather_scaled_matmul (PyTorch's symm_mem
    op's arguments; the lists default to None / False per B, out_dtypes to
    bfloat16): (A, [_scaled_mm(A, B, A_scale, B_scale, ...) for each B])."""
    nb = len(Bs)
    return torch.ops.ovl.fused_all_gather_scaled_matmul(
        A_shard, list(Bs), A_scale, list(B_scales), gather_dim, group_name,
        list(biases) if biases is not None else [None] * nb,
        list(result_scales) if result_scales is not None else [None] * nb,
        list(out_dtypes) if out_dtypes is not None else [torch.bfloat16] * nb,
        list(use_fast_accum) if use_fast_accum is not None else [False] * nb)


def fused_scaled_matmul_reduce_scatter(A, B, A_scale, B_scale, reduce_op="sum", scatter_dim=0,
                                       group_name="default", output_shape=None, bias=None,
                                       out_dtype=torch.bfloat16, use_fast_accum=False):
    """torch.ops.ovl.fused_scaled_matmul_reduce_scatter with scatter_dim as
    both of PyTorch's scatter dimensions and output_shape None (A's
    leading dimensions and N): _scaled_mm(A, B, A_scale, B_scale) + bias,
    reduce-scattered along scatter_dim."""
    return torch.ops.ovl.fused_scaled_matmul_reduce_scatter(
        A, B, A_scale, B_scale, reduce_op, scatter_dim, scatter_dim, group_name, output_shape,
        bias, None, out_dtype, use_fast_accum)


def op_stats():
    """torch.ops.ovl's scaled calls that ovl ran and those it handed to
    PyTorch's unfused fallback, by reason: {"taken": {op: calls},
    "fell_back": {"op: reason": calls}}."""
    return _OPS_ROUTER.stats()


# -- ColumnParallelLinear ---------------------------------------------------

def _group_name_of(group):
    names = _group_names(group if group is not None else dist.GroupMember.WORLD)
    for n in names:
        if n in _COMMS:
            return n
    raise RuntimeError("ovl.torch: no ovl comm for this group (ovl.torch.init(group) first)")


def _ovl_reduces(group):
    """Whether ovl's GEMM + reduce-scatter serves the group: its ranks have
    GPUs of their own (NCCL), which ovld's reduce-scatter needs; ranks that
    share a GPU (gloo) keep the unfused path."""
    return dist.get_world_size(group) == 1 or dist.get_backend(group) == "nccl"


def _reduce_scatter_dim0(t, group):
    """Sum over the group's ranks of t (world*r x ...), this rank's r rows.
    NCCL: reduce_scatter_tensor; another backend (gloo: ranks sharing a GPU):
    an all_reduce of a float32 CPU copy."""
    ws = dist.get_world_size(group)
    if ws == 1:
        return t
    if dist.get_backend(group) == "nccl":
        out = t.new_empty((t.shape[0] // ws,) + tuple(t.shape[1:]))
        dist.reduce_scatter_tensor(out, t.contiguous(), group=group)
        return out
    c = t.float().cpu()
    dist.all_reduce(c, group=group)
    return c.chunk(ws)[dist.get_rank(group)].to(device=t.device, dtype=t.dtype)


class _ColumnParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, gather_dim, group_name, group):
        A, (y,) = torch.ops.ovl.fused_all_gather_matmul(x, [weight.t()], gather_dim, group_name,
                                                        return_A=True)
        ctx.save_for_backward(A, weight)
        ctx.gather_dim, ctx.group_name, ctx.group = gather_dim, group_name, group
        return y

    @staticmethod
    def backward(ctx, gy):
        A, weight = ctx.saved_tensors
        gd = ctx.gather_dim % A.dim()
        gx = gw = None
        if ctx.needs_input_grad[0] and _ovl_reduces(ctx.group):
            # ONE op: this rank's part of the gathered A's gradient, summed
            # over the ranks and scattered back along gather_dim
            gx = torch.ops.ovl.fused_matmul_reduce_scatter(gy, weight, "sum", gd, ctx.group_name)
        elif ctx.needs_input_grad[0]:
            ga = (gy @ weight).movedim(gd, 0)            # the gathered A's, this rank's part
            shape = ga.shape
            gx = _reduce_scatter_dim0(ga.reshape(shape[0], -1), ctx.group)
            gx = gx.view((gx.shape[0],) + tuple(shape[1:])).movedim(0, gd)
        if ctx.needs_input_grad[1]:
            gw = gy.reshape(-1, gy.shape[-1]).t() @ A.reshape(-1, A.shape[-1])
        return gx, gw, None, None, None


class ColumnParallelLinear(torch.nn.Module):
    """y = allgather(x) @ W^T (+ b): a linear layer whose weight is split by
    output columns over the ranks of `group` (Megatron's column-parallel
    linear with sequence parallelism): each rank holds out_features/world
    rows of W (out_local x in, as nn.Linear stores them) and returns its
    column slice of the output, for the rows of every rank (the input's
    shards gathered along gather_dim, in rank order), in ONE ovl op. Backward:
    grad of the input = reduce-scatter of grad_out @ W along gather_dim,
    grad of W = grad_out^T @ (the gathered input, kept from forward).
    ovl.torch.init(group) must have run."""

    def __init__(self, in_features, out_features_total, bias=False, group=None, gather_dim=0,
                 device=None, dtype=None):
        super().__init__()
        self.group = group if group is not None else dist.GroupMember.WORLD
        ws = dist.get_world_size(self.group)
        if out_features_total % ws:
            raise ValueError("out_features_total %d is not a multiple of the world %d"
                             % (out_features_total, ws))
        self.in_features, self.out_features_total = in_features, out_features_total
        self.out_features = out_features_total // ws
        self.gather_dim = gather_dim
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty((self.out_features, in_features), **kw))
        self.bias = torch.nn.Parameter(torch.empty(self.out_features, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        import math
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def load_full(self, weight, bias=None):
        """Takes this rank's rows of a full out_features_total x in weight."""
        r = dist.get_rank(self.group)
        sl = slice(r * self.out_features, (r + 1) * self.out_features)
        with torch.no_grad():
            self.weight.copy_(weight[sl])
            if bias is not None and self.bias is not None:
                self.bias.copy_(bias[sl])

    def forward(self, x):
        if self.gather_dim % x.dim() == x.dim() - 1:
            raise ValueError("ColumnParallelLinear gathers rows: gather_dim must not be the "
                             "feature (last) dimension")
        y = _ColumnParallel.apply(x, self.weight, self.gather_dim,
                                  _group_name_of(self.group), self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return "in_features=%d, out_features=%d of %d, bias=%s, gather_dim=%d" % (
            self.in_features, self.out_features, self.out_features_total,
            self.bias is not None, self.gather_dim)


# -- RowParallelLinear ------------------------------------------------------

def _all_reduce_sum(t, group):
    """Sum over the group's ranks of t, added in float32, in t's dtype and
    on t's device. NCCL: all_reduce on the GPU; another backend (gloo: ranks
    sharing a GPU): of a float32 CPU copy, as _reduce_scatter_dim0."""
    if dist.get_world_size(group) == 1:
        return t
    if dist.get_backend(group) == "nccl":
        c = t.to(torch.float32, copy=True)
    else:
        c = t.to(device="cpu", dtype=torch.float32, copy=True)
    dist.all_reduce(c, group=group)
    return c.to(device=t.device, dtype=t.dtype)


class _RowParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, gather_dim, group_name, group):
        gd = gather_dim % x.dim()
        if _ovl_reduces(group):
            # ONE op: this rank's part of every row's sum, summed over the
            # ranks, this rank's rows back
            y = torch.ops.ovl.fused_matmul_reduce_scatter(x, weight.t(), "sum", gd, group_name)
        else:
            p = torch.matmul(x, weight.t()).movedim(gd, 0)  # this rank's part of every row's sum
            shape = p.shape
            y = _reduce_scatter_dim0(p.reshape(shape[0], -1), group)
            y = y.view((y.shape[0],) + tuple(shape[1:])).movedim(0, gd)
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x, weight)
        ctx.gather_dim, ctx.group_name, ctx.group = gd, group_name, group
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            # ONE op: grad_out of every rank's rows gathered (G, kept for the
            # weight's gradient) and multiplied by W: the input's gradient
            G, (ga,) = torch.ops.ovl.fused_all_gather_matmul(gy, [weight], ctx.gather_dim,
                                                             ctx.group_name, return_A=True)
            if ctx.needs_input_grad[0]:
                gx = ga
            if ctx.needs_input_grad[1]:
                gw = G.reshape(-1, G.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # the bias is replicated: its gradient sums every rank's rows
            gb = gy.sum(dim=tuple(range(gy.dim() - 1)), dtype=torch.float32)
            gb = _all_reduce_sum(gb, ctx.group).to(gy.dtype)
        return gx, gw, gb, None, None, None


class RowParallelLinear(torch.nn.Module):
    """y = reduce-scatter(x @ W^T) (+ b): a linear layer whose weight is
    split by input columns over the ranks of `group` (Megatron's
    row-parallel linear with sequence parallelism), the layer after a
    ColumnParallelLinear: each rank holds in_features_total/world columns of
    W (out x in_local, as nn.Linear stores them) and takes x = the rows of
    every rank (in rank order along gather_dim), this rank's in_local
    features (ColumnParallelLinear's output); the products of every rank are
    summed and this rank gets its own rows back (reduce-scatter along
    gather_dim: ONE ovl fused_matmul_reduce_scatter on NCCL groups, the
    local product and a float32 CPU all_reduce on gloo), then the bias,
    which every rank holds whole. Backward: ONE ovl op
    gathers grad_out of every rank's rows and multiplies it by W (the
    input's gradient); the gathered grad_out gives the weight's gradient
    (G^T @ x); the bias's (the sum of this rank's rows of grad_out) is
    all-reduced over the group, so that the ranks' biases stay equal.
    The weight starts as nn.Linear's of the full layer would (uniform within
    1/sqrt(in_features_total)), the bias at zero (equal on every rank).
    ovl.torch.init(group) must have run."""

    def __init__(self, in_features_total, out_features, bias=False, group=None, gather_dim=0,
                 device=None, dtype=None):
        super().__init__()
        self.group = group if group is not None else dist.GroupMember.WORLD
        ws = dist.get_world_size(self.group)
        if in_features_total % ws:
            raise ValueError("in_features_total %d is not a multiple of the world %d"
                             % (in_features_total, ws))
        self.in_features_total, self.out_features = in_features_total, out_features
        self.in_features = in_features_total // ws
        self.gather_dim = gather_dim
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty((out_features, self.in_features), **kw))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        import math
        bound = 1 / math.sqrt(self.in_features_total)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def load_full(self, weight, bias=None):
        """Takes this rank's columns of a full out x in_features_total
        weight, and the whole bias (out)."""
        if tuple(weight.shape) != (self.out_features, self.in_features_total):
            raise ValueError("load_full: the weight is %s, the full layer's is %d x %d" % (
                " x ".join(map(str, weight.shape)), self.out_features, self.in_features_total))
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError("load_full: the bias is %s, the layer's is %d" % (
                " x ".join(map(str, bias.shape)), self.out_features))
        r = dist.get_rank(self.group)
        sl = slice(r * self.in_features, (r + 1) * self.in_features)
        with torch.no_grad():
            self.weight.copy_(weight[:, sl])
            if bias is not None and self.bias is not None:
                self.bias.copy_(bias)

    def forward(self, x):
        nd = x.dim()
        if nd < 2:
            raise ValueError("RowParallelLinear: the input needs 2 dimensions or more, got %d"
                             % nd)
        if not -nd <= self.gather_dim < nd:
            raise ValueError("RowParallelLinear: gather_dim %d out of range for %d dimensions"
                             % (self.gather_dim, nd))
        gd = self.gather_dim % nd
        if gd == nd - 1:
            raise ValueError("RowParallelLinear scatters rows: gather_dim must not be the "
                             "feature (last) dimension")
        ws = dist.get_world_size(self.group)
        if x.shape[-1] != self.in_features:
            raise ValueError("RowParallelLinear: the input has %d features, this rank's slice "
                             "is %d (in_features_total %d / world %d)" % (
                                 x.shape[-1], self.in_features, self.in_features_total, ws))
        if x.shape[gd] % ws:
            raise ValueError("RowParallelLinear: the input's dimension %d (gather_dim) has %d "
                             "rows, not a multiple of the world %d (it takes the rows of every "
                             "rank)" % (gd, x.shape[gd], ws))
        if x.dtype != self.weight.dtype:
            raise ValueError("RowParallelLinear: input dtype %s, the weight's is %s"
                             % (x.dtype, self.weight.dtype))
        return _RowParallel.apply(x, self.weight, self.bias, self.gather_dim,
                                  _group_name_of(self.group), self.group)

    def extra_repr(self):
        return "in_features=%d of %d, out_features=%d, bias=%s, gather_dim=%d" % (
            self.in_features, self.in_features_total, self.out_features,
            self.bias is not None, self.gather_dim)


# -- install: PyTorch's own symm_mem ops through ovld -----------------------
#
# torch.compile's micro-pipeline TP pass (TorchTitan's async TP, vLLM's
# AsyncTPPass) rewrites all_gather + mm and mm + reduce_scatter into
# torch.ops.symm_mem.fused_all_gather_matmul and fused_matmul_reduce_scatter
# by name. install() replaces those ops' CUDA kernels (PyTorch registers them
# from Python, torch/distributed/_symmetric_memory/__init__.py) with ovl's,
# which hand a call to PyTorch's own kernel wherever ovl does not take it
# (ovl._route says where). Their Meta kernels stay PyTorch's: what Inductor
# traces, and the strides it asserts, are PyTorch's, and ovl's results have
# the same (the ported AsyncTPTest checks compare them).

_ROUTER = _route.Router()
_INSTALLER = _route.Installer()
_LAZY = [False]      # install(lazy=...): make a group's comm on its first call
_NOT_SERVED = {}     # group name -> why its lazy comm failed (never retried)
_LAZY_MU = {}        # group name -> the lock held while its comm is made on first use
_AG, _RS = "fused_all_gather_matmul", "fused_matmul_reduce_scatter"
_SCALED_FALLBACKS = {"fused_all_gather_scaled_matmul": "_fused_all_gather_scaled_matmul",
                     "fused_scaled_matmul_reduce_scatter": "_fused_scaled_matmul_reduce_scatter"}


def _symm_mem():
    """PyTorch's module that defines the symm_mem ops and their kernels."""
    import torch.distributed._symmetric_memory as sm
    return sm


def _override_supported():
    import inspect
    return "allow_override" in inspect.signature(torch.library.Library.impl).parameters


def _schema_text(op_packet):
    """An op's schema as text without its namespace."""
    s = str(op_packet.default._schema)
    return s.split("::", 1)[1] if "::" in s else s


def _scaled_routable():
    """The symm_mem scaled ops install() routes: those this PyTorch defines
    with exactly ovl's schema (torch 2.10's) and whose CUDA kernel it has
    to fall back to; {op: why not} for the others, said once at install."""
    sm = _symm_mem()
    take, why = [], {}
    for op, fn in _SCALED_FALLBACKS.items():
        theirs = getattr(torch.ops.symm_mem, op, None)
        if theirs is None:
            why[op] = "this PyTorch (%s) has no symm_mem.%s" % (torch.__version__, op)
        elif _schema_text(theirs) != _schema_text(getattr(torch.ops.ovl, op)):
            why[op] = ("this PyTorch's schema (%s) is not the one ovl implements (%s)"
                       % (_schema_text(theirs), _schema_text(getattr(torch.ops.ovl, op))))
        elif not callable(getattr(sm, fn, None)):
            why[op] = "this PyTorch has no %s.%s to fall back to" % (sm.__name__, fn)
        else:
            take.append(op)
    return take, why


class _Registration:
    """ovl's kernels over PyTorch's, for the CUDA dispatch key; destroy()
    restores PyTorch's (the dispatcher keeps the one it overrode). The
    scaled ops where _scaled_routable says (else PyTorch's, said once)."""

    def __init__(self):
        import warnings
        self.lib = torch.library.Library("symm_mem", "IMPL")  # noqa: TOR901
        try:
            take, why = _scaled_routable()
            with warnings.catch_warnings():  # the dispatcher's note that it overrides: meant
                warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered")
                self.lib.impl(_AG, _symm_ag, "CUDA", allow_override=True)
                self.lib.impl(_RS, _symm_rs, "CUDA", allow_override=True)
                kernels = {_SAG: _symm_sag, _SRS: _symm_srs}
                for op in take:
                    self.lib.impl(op, kernels[op], "CUDA", allow_override=True)
            for op, w in why.items():
                _route.LOG.warning("ovl.torch: install() leaves symm_mem.%s to PyTorch: %s",
                                   op, w)
            self.scaled = take
        except BaseException:
            self.lib._destroy()
            raise

    def destroy(self):
        self.lib._destroy()


def install(group=None, lazy=True):
    """Routes torch.ops.symm_mem.fused_all_gather_matmul and
    fused_matmul_reduce_scatter through ovld for the process groups ovl
    serves; any other call runs PyTorch's own kernel, each reason logged
    once (logger "ovl.torch"; python/README.md). group: a group to serve
    now (ovl.torch.init(group) if it has no comm yet: collective over it).
    lazy: a group without a comm gets one on its first call (collective
    over the group, as the op itself is; where ovld is not reachable from
    every rank of it, the group keeps PyTorch's kernel). Harmless twice.
    Returns True if it installed now. PyTorch 2.8 or later (older versions
    cannot replace a kernel registered from Python: RuntimeError)."""
    if not _override_supported():
        raise RuntimeError("ovl.torch.install: PyTorch %s cannot replace the symm_mem kernels "
                           "(torch.library.Library.impl(..., allow_override=True) came in 2.8); "
                           "call torch.ops.ovl.fused_all_gather_matmul and "
                           "fused_matmul_reduce_scatter instead" % torch.__version__)
    sm = _symm_mem()
    for fn in ("_fused_all_gather_matmul", "_fused_matmul_reduce_scatter"):
        if not callable(getattr(sm, fn, None)):
            raise RuntimeError("ovl.torch.install: this PyTorch (%s) has no %s.%s to fall back "
                               "to" % (torch.__version__, sm.__name__, fn))
    if group is not None and not any(n in _COMMS for n in _group_names(group)):
        init(group)
    if _INSTALLER.installed:
        return False
    done = _INSTALLER.install(_Registration)
    _LAZY[0] = bool(lazy)
    return done


def uninstall():
    """Restores PyTorch's own symm_mem kernels; the comms stay (shutdown()
    closes them). Returns True if it uninstalled now."""
    _LAZY[0] = False
    return _INSTALLER.uninstall()


def installed():
    """Whether install() is in effect."""
    return _INSTALLER.installed


def stats():
    """The symm_mem calls ovl took and those it handed to PyTorch's kernel,
    by reason: {"taken": {op: calls}, "fell_back": {"op: reason": calls}}."""
    return _ROUTER.stats()


def _node_key():
    """This process's node as ovld sees it: the host and the socket libovl
    connects to (one ovld), hashed to 62 bits."""
    import hashlib
    import socket as _socket
    sock = os.environ.get("OVL_SOCKET", "")
    h = hashlib.sha256(("%s\0%s" % (_socket.gethostname(), sock)).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 2


def _lazy_comm(group_name, device):
    """The comm of the group named group_name on `device`, made now
    (collective over the group): (comm, None), or (None, why not). Every
    rank makes its comm, then the group agrees with one MIN all-reduce that
    every rank did and that every rank is on this node's ovld (a job ovl
    makes here is one ovld's: a group across nodes would wait for ranks
    that never come); otherwise every rank closes its own and the group
    keeps PyTorch's kernel."""
    from torch.distributed import distributed_c10d as c10d
    try:
        g = c10d._resolve_process_group(group_name)
    except Exception as e:  # not a group of this process: nothing collective was done
        return None, "group %r is not a process group here (%s)" % (group_name, e)
    comm, err = None, None
    try:
        with torch.cuda.device(device):
            comm = init(g)
    except Exception as e:
        err = e
    key = _node_key()
    dev = device if "nccl" in str(dist.get_backend(g)) else torch.device("cpu")
    # [ok, node, -node] under MIN: all ok, and min(node) == max(node)
    t = torch.tensor([0 if comm is None else 1, key, -key], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g)
    ok, lo, neg_hi = (int(v) for v in t.tolist())
    if ok == 1 and lo == -neg_hi:
        return comm, None
    if comm is not None:
        with _MU:
            for n in [n for n, c in _COMMS.items() if c is comm]:
                del _COMMS[n]
        try:
            comm.close()
        except Exception:  # the peers fall back whatever happens here
            pass
    if ok == 1:
        why = ("group %r spans more than one node's ovld (a comm made on first use is a job of "
               "one ovld; a job across nodes takes ovl.torch.init with a job id: "
               "python/README.md)" % group_name)
    else:
        why = "ovld is not usable from every rank of group %r (%s)" % (
            group_name, "here: %s" % err if err is not None else "another rank's")
    with _MU:
        _NOT_SERVED[group_name] = why
    return None, why


def _capturing():
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _group_size(group_name):
    from torch.distributed import distributed_c10d as c10d
    try:
        return c10d._get_group_size_by_name(group_name)
    except Exception:
        return None


def _comm_for(group_name, device):
    """(comm, None) where ovl serves the group, else (None, why not)."""
    with _MU:
        c, why = _COMMS.get(group_name), _NOT_SERVED.get(group_name)
    if c is not None:
        ws = _group_size(group_name) if group_name != "default" else None
        if ws is not None and ws != c.world:
            return None, ("group %r has %d ranks, its ovl comm %d (a group of that name made "
                          "again: ovl.torch.shutdown(), then init)" % (group_name, ws, c.world))
        return c, None
    if why is not None:
        return None, why
    if not _LAZY[0]:
        return None, ("group %r has no ovl comm (ovl.torch.init(group), or install(lazy=True))"
                      % group_name)
    with _MU:  # one maker per group in this process (backward runs on autograd's threads)
        mu = _LAZY_MU.setdefault(group_name, threading.Lock())
    with mu:
        with _MU:
            c, why = _COMMS.get(group_name), _NOT_SERVED.get(group_name)
        if c is not None or why is not None:
            return c, why
        return _lazy_comm(group_name, device)


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


@functools.lru_cache(maxsize=256)
def _ag_strides(a, bs, gather_dim, group_name, return_A, world):
    """The strides PyTorch's Meta kernel of fused_all_gather_matmul gives
    (what Inductor asserts): (A's or None, [each output's]). a, bs: (shape,
    stride, dtype) of A_shard and of each B; world: the group's size (part
    of the key: a name may be reused by a group of another size)."""
    sm = _symm_mem()
    A, outs = sm._fused_all_gather_matmul_fallback(
        torch.empty_strided(a[0], a[1], dtype=a[2], device="meta"),
        [torch.empty_strided(b[0], b[1], dtype=b[2], device="meta") for b in bs],
        gather_dim, group_name, return_A=return_A)
    return (A.stride() if A is not None else None), [o.stride() for o in outs]


@functools.lru_cache(maxsize=256)
def _rs_strides(a, b, reduce_op, scatter_dim, group_name, world):
    """The strides of PyTorch's Meta kernel of fused_matmul_reduce_scatter."""
    sm = _symm_mem()
    out = sm._fused_matmul_reduce_scatter_fallback(
        torch.empty_strided(a[0], a[1], dtype=a[2], device="meta"),
        torch.empty_strided(b[0], b[1], dtype=b[2], device="meta"), reduce_op, scatter_dim,
        group_name)
    return out.stride()


def _restride(t, stride):
    """t with exactly these strides: t itself where it has them, else a copy
    (ovl's layouts equal PyTorch's but where PyTorch's view keeps a size-1
    dimension's stride, as its gather at world 1)."""
    if t is None or stride is None or tuple(t.stride()) == tuple(stride):
        return t
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _desc(t):
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def _takes(op, why, group_name, device):
    """Whether ovl takes this call of op, whose tensors _route judged (why:
    None, or why not): not inside CUDA graph capture, and the group served
    (its comm made on first use where install() was asked to). Counts the
    call either way, and says each reason for handing one back once."""
    if why is None and _capturing():
        why = "inside CUDA graph capture (ovl's ops are not captured into graphs)"
    if why is None:
        _, why = _comm_for(group_name, device)
    if why is not None:
        _ROUTER.fell_back(op, why)
        return False
    _ROUTER.took(op)
    return True


def _symm_ag(A_shard, Bs, gather_dim, group_name, *, return_A=True):
    """symm_mem.fused_all_gather_matmul's CUDA kernel while installed: ovl's
    (_cuda) where _route takes the call, else PyTorch's."""
    sm = _symm_mem()
    if getattr(sm, "_is_test_mode", False):  # PyTorch's tests force its fallback
        return sm._fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name,
                                           return_A=return_A)
    ts = [A_shard] + list(Bs)
    why = _route.why_not_ag([t.device.type for t in ts], [_dtype_name(t) for t in ts],
                            list(A_shard.shape), [list(B.shape) for B in Bs], gather_dim)
    if not _takes(_AG, why, group_name, A_shard.device):
        return sm._fused_all_gather_matmul(A_shard, Bs, gather_dim, group_name,
                                           return_A=return_A)
    A, outs = _cuda(A_shard, list(Bs), gather_dim, group_name, return_A)
    a_st, o_st = _ag_strides(_desc(A_shard), tuple(_desc(B) for B in Bs), gather_dim,
                             group_name, return_A, _world_of(group_name))
    return _restride(A, a_st), [_restride(o, st) for o, st in zip(outs, o_st)]


def _symm_rs(A, B, reduce_op, scatter_dim, group_name):
    """symm_mem.fused_matmul_reduce_scatter's CUDA kernel while installed."""
    sm = _symm_mem()
    if getattr(sm, "_is_test_mode", False):
        return sm._fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    why = _route.why_not_rs([A.device.type, B.device.type], [_dtype_name(A), _dtype_name(B)],
                            list(A.shape), list(B.shape), reduce_op, scatter_dim,
                            _world_of(group_name))
    if not _takes(_RS, why, group_name, A.device):
        return sm._fused_matmul_reduce_scatter(A, B, reduce_op, scatter_dim, group_name)
    out = _rs_cuda(A, B, reduce_op, scatter_dim, group_name)
    return _restride(out, _rs_strides(_desc(A), _desc(B), reduce_op, scatter_dim, group_name,
                                      _world_of(group_name)))


def _symm_sag(A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
              out_dtypes, use_fast_accum):
    """symm_mem.fused_all_gather_scaled_matmul's CUDA kernel while
    installed: ovl's (one scaled op per B) where _route takes the call,
    else PyTorch's."""
    sm = _symm_mem()
    args = (A_shard, Bs, A_scale, B_scales, gather_dim, group_name, biases, result_scales,
            out_dtypes, use_fast_accum)
    if getattr(sm, "_is_test_mode", False):  # PyTorch's tests force its fallback
        return sm._fused_all_gather_scaled_matmul(*args)
    ods = [_as_dtype(d) for d in out_dtypes]
    why = _sag_why(A_shard, Bs, A_scale, B_scales, gather_dim, biases, result_scales, ods,
                   use_fast_accum, _world_of(group_name))
    if not _takes(_SAG, why, group_name, A_shard.device):
        return sm._fused_all_gather_scaled_matmul(*args)
    return _sag_run(get_comm(group_name), A_shard, list(Bs), A_scale, list(B_scales),
                    gather_dim, list(biases), ods, list(use_fast_accum))


def _symm_srs(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
              scatter_dim_after_maybe_reshape, group_name, output_shape, bias=None,
              result_scale=None, out_dtype=None, use_fast_accum=False):
    """symm_mem.fused_scaled_matmul_reduce_scatter's CUDA kernel while
    installed."""
    sm = _symm_mem()
    args = (A, B, A_scale, B_scale, reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape,
            group_name, output_shape, bias, result_scale, out_dtype, use_fast_accum)
    if getattr(sm, "_is_test_mode", False):
        return sm._fused_scaled_matmul_reduce_scatter(*args)
    od = _as_dtype(out_dtype)
    why = _srs_why(A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                   scatter_dim_after_maybe_reshape, output_shape, bias, result_scale, od,
                   _world_of(group_name))
    if not _takes(_SRS, why, group_name, A.device):
        return sm._fused_scaled_matmul_reduce_scatter(*args)
    return _srs_run(get_comm(group_name), A, B, A_scale, B_scale, reduce_op, orig_scatter_dim,
                    output_shape, bias, od, use_fast_accum)


def _env_install():
    """OVL_TORCH_INSTALL=1 (any value but empty and 0): install() when
    ovl.torch is imported (python/README.md: with ovl's sitecustomize for
    programs one cannot edit)."""
    v = os.environ.get("OVL_TORCH_INSTALL", "")
    if v in ("", "0"):
        return
    try:
        install()
    except Exception as e:  # torch.ops.ovl stays usable; PyTorch's kernels stay
        _route.LOG.warning("ovl.torch: OVL_TORCH_INSTALL is set, but install() failed: %s", e)


_env_install()
