"""ovl._route: which calls of PyTorch's symm_mem fused ops ovl takes, and
what it says when it does not. Pure Python, no torch: ovl.torch describes
each call with plain values (dtype names, device types, shapes) and asks
here; CI tests this module where torch is not installed.

The rules (python/README.md, "One line for torch.compile, TorchTitan and
vLLM"): ovl takes a call when

- the group is one ovl serves (a comm made by ovl.torch.init, or made on
  first use where install() was asked to), and ovld is reachable from every
  rank of it;
- every tensor is on a CUDA device, in bfloat16, float16 or float32, and all
  of one dtype;
- no tensor is empty, and gather_dim and scatter_dim are 0 to A's
  dimensions - 1 (PyTorch's own kernels take no negative ones);
- all-gather + GEMM: A has 2 dimensions or more, gather_dim is not A's last
  (ovl gathers that one by multiplying world times the FLOPs: PyTorch's own
  kernel is faster there), 1 to 8 Bs, each 2-D with as many rows as A has
  columns;
- GEMM + reduce-scatter: A has 2 dimensions or more, B is 2-D with as many
  rows as A has columns, reduce_op is "sum" or "avg", and the dimension
  scattered divides by the world (B's columns for the last dimension).

The scaled (fp8) ops, fused_all_gather_scaled_matmul and
fused_scaled_matmul_reduce_scatter (why_not_scaled_ag, why_not_scaled_rs),
as above (CUDA, a group ovl serves, gather_dim / scatter dims, shapes that
fit) and:

- A and every B float8_e4m3fn or float8_e5m2, not both float8_e5m2
  (cuBLASLt has no such GEMM);
- each B column-major (the transpose of a row-major N x K weight: W.t()),
  the one layout of cuBLASLt's fp8 GEMM and of PyTorch's _scaled_mm; K and
  each N multiples of 16 (what both want);
- an output dtype given, bfloat16, float16 or float32 (None means an fp8
  output, which ovl never writes), no result_scale;
- float32 scales, tensor-wise (1 element) or row-wise (A: one per row,
  PyTorch's (..., 1) shapes; B: (1, N)), or block-wise as torch._scaled_mm
  reads them: A 1x128 (A's leading dimensions, then ceil(K/128); all-gather:
  the gathered A's, PyTorch's "replicated" reading, as its kernels refuse
  this rank's rows' alone) with B 1x128 ((ceil(K/128), N): scale_b.t() one
  per column of B and 128 of K) or 128x128 ((ceil(K/128), ceil(N/128))),
  A's rows of each GEMM (all-gather: this rank's; reduce-scatter: each
  rank's block of the output) in fours; never A by 128x128 (ovl cuts A by
  rows) nor block-wise scales with tensor- or row-wise ones; a bias of N
  elements in the output's dtype;
- all-gather: as many B_scales, biases, result_scales, out_dtypes and
  use_fast_accum as Bs (each B is an ovl op of its own, so they may differ);
- reduce-scatter: output_shape given and holding A's rows, orig_scatter_dim
  not its last (ovl scatters rows, not N).

Anything else runs PyTorch's own kernel. Each reason is logged once per
process (a warning on the "ovl.torch" logger), with a count of the calls it
sent back kept for stats().
"""
import logging
import threading

DTYPES = ("bfloat16", "float16", "float32")
FP8 = ("float8_e4m3fn", "float8_e5m2")
MAX_BS = 8
FP8_ALIGN = 16  # K and N of an fp8 GEMM (cuBLASLt; PyTorch's _scaled_mm checks it too)
BLOCK = 128  # the side of a scale block (OVL_SCALE_BLOCK)
BLOCK_MODES = ("1x128", "128x128")
_MODE_WORDS = {"tensor": "tensor-wise", "row": "row-wise", "1x128": "block-wise 1x128",
               "128x128": "block-wise 128x128"}

LOG = logging.getLogger("ovl.torch")


class Router:
    """The fall-back bookkeeping of one process: the reasons seen (each
    logged once), how many calls each sent to PyTorch's kernel, and how many
    calls ovl took, per op."""

    def __init__(self, log=LOG, namespace="symm_mem", kernel="PyTorch's own kernel",
                 counter="stats"):
        """namespace: the ops' (symm_mem for install()'s, ovl for
        torch.ops.ovl's scaled ops); kernel: what runs a call handed back;
        counter: the ovl.torch function that gives stats()."""
        self._mu = threading.Lock()
        self._log = log
        self._words = (namespace, kernel, counter)
        self._fallbacks = {}  # reason -> calls
        self._taken = {}      # op -> calls

    def fell_back(self, op, reason):
        """Counts a call of op that PyTorch's kernel runs for `reason`;
        the first time a reason is seen it is logged."""
        key = "%s: %s" % (op, reason)
        with self._mu:
            first = key not in self._fallbacks
            self._fallbacks[key] = self._fallbacks.get(key, 0) + 1
        if first:
            ns, kernel, counter = self._words
            self._log.warning("ovl.torch: %s.%s runs %s: %s (said once; ovl.torch.%s() counts "
                              "the calls)", ns, op, kernel, reason, counter)

    def took(self, op):
        with self._mu:
            self._taken[op] = self._taken.get(op, 0) + 1

    def stats(self):
        """{"taken": {op: calls}, "fell_back": {"op: reason": calls}}."""
        with self._mu:
            return {"taken": dict(self._taken), "fell_back": dict(self._fallbacks)}

    def reset(self):
        with self._mu:
            self._fallbacks.clear()
            self._taken.clear()


def _empty(shapes):
    return any(0 in tuple(s) for s in shapes)


def _common(devices, dtypes):
    for d in devices:
        if d != "cuda":
            return "a tensor on a %s device (ovl takes CUDA tensors)" % d
    for t in dtypes:
        if t not in DTYPES:
            return "dtype %s (ovl takes %s)" % (t, ", ".join(DTYPES))
    if len(set(dtypes)) > 1:
        return "mixed dtypes %s" % "/".join(sorted(set(dtypes)))
    return None


def why_not_ag(devices, dtypes, a_shape, b_shapes, gather_dim):
    """None where ovl takes fused_all_gather_matmul of these, else why not.
    devices: every tensor's device type; dtypes: every tensor's dtype name
    (A's first); a_shape: A_shard's shape; b_shapes: each B's."""
    why = _common(devices, dtypes)
    if why:
        return why
    nd = len(a_shape)
    if nd < 2:
        return "A_shard of %d dimension%s" % (nd, "" if nd == 1 else "s")
    if not 0 <= gather_dim < nd:
        return "gather_dim %d out of range (PyTorch's kernel takes 0 to %d)" % (gather_dim,
                                                                                nd - 1)
    if _empty([a_shape] + list(b_shapes)):
        return "an empty tensor"
    if gather_dim == nd - 1:
        return ("gather_dim is A's last: ovl gathers it at world times the FLOPs, PyTorch's "
                "kernel is faster there")
    if not 1 <= len(b_shapes) <= MAX_BS:
        return "%d Bs (ovl takes 1 to %d in one op)" % (len(b_shapes), MAX_BS)
    for i, b in enumerate(b_shapes):
        if len(b) != 2 or b[0] != a_shape[-1]:
            return "Bs[%d] of shape %s does not fit A's %d columns" % (i, tuple(b), a_shape[-1])
    return None


def why_not_rs(devices, dtypes, a_shape, b_shape, reduce_op, scatter_dim, world):
    """None where ovl takes fused_matmul_reduce_scatter of these, else why
    not (the arguments as why_not_ag's; world: the group's size)."""
    why = _common(devices, dtypes)
    if why:
        return why
    nd = len(a_shape)
    if nd < 2:
        return "A of %d dimension%s" % (nd, "" if nd == 1 else "s")
    if len(b_shape) != 2 or b_shape[0] != a_shape[-1]:
        return "B of shape %s does not fit A's %d columns" % (tuple(b_shape), a_shape[-1])
    if reduce_op not in ("sum", "avg"):
        return "reduce_op %r (ovl takes sum and avg)" % (reduce_op,)
    if not 0 <= scatter_dim < nd:
        return "scatter_dim %d out of range (PyTorch's kernel takes 0 to %d)" % (scatter_dim,
                                                                                 nd - 1)
    if _empty([a_shape, b_shape]):
        return "an empty tensor"
    sd = scatter_dim
    size = b_shape[1] if sd == nd - 1 else a_shape[sd]
    if world < 1 or size % world:
        return "the scattered dimension (%d) is not a multiple of the world %d" % (size, world)
    return None


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _fp8_dtypes(a_dtype, b_dtypes):
    if a_dtype not in FP8:
        return "A of dtype %s (ovl's scaled ops take %s)" % (a_dtype, " and ".join(FP8))
    for i, t in enumerate(b_dtypes):
        if t not in FP8:
            return "B%s of dtype %s (ovl's scaled ops take %s)" % (
                "" if len(b_dtypes) == 1 and i == 0 else "s[%d]" % i, t, " and ".join(FP8))
        if a_dtype == t == "float8_e5m2":
            return "float8_e5m2 times float8_e5m2 (cuBLASLt has no such GEMM)"
    return None


def _scaled_b(name, a_shape, b_shape, b_stride):
    """Why B (K x N, PyTorch's) is not one ovl's scaled GEMM takes, or None."""
    k = a_shape[-1]
    if len(b_shape) != 2 or b_shape[0] != k:
        return "%s of shape %s does not fit A's %d columns" % (name, tuple(b_shape), k)
    n = b_shape[1]
    if not ((k <= 1 or b_stride[0] == 1) and (n <= 1 or b_stride[1] >= k)):
        return ("%s is not column-major (strides %s): ovl's scaled GEMM, as cuBLASLt's fp8 GEMM "
                "and PyTorch's _scaled_mm, takes B as the transpose of a row-major N x K weight "
                "(W.t())" % (name, tuple(b_stride)))
    if k % FP8_ALIGN or n % FP8_ALIGN:
        return ("K %d or N %d of %s not a multiple of %d (cuBLASLt's fp8 GEMM, and PyTorch's "
                "_scaled_mm, want both so)" % (k, n, name, FP8_ALIGN))
    return None


def _scaled_out(name, out_dtype, result_scale):
    if out_dtype is None:
        return ("%s is None: the output in A's fp8 dtype, which ovl's scaled ops never write "
                "(they write %s)" % (name, ", ".join(DTYPES)))
    if out_dtype not in DTYPES:
        return "%s %s (ovl's scaled ops write %s)" % (name, out_dtype, ", ".join(DTYPES))
    if result_scale:
        return ("a result_scale (an fp8 output's scale; ovl's scaled ops write %s and scale no "
                "result)" % ", ".join(DTYPES))
    return None


def _scale_dtype(name, scale):
    if scale[1] != "float32":
        return ("%s of dtype %s (ovl takes float32 scales; MX's e8m0 block scales are "
                "PyTorch's)" % (name, scale[1]))
    return None


def _blocks(x):
    """ceil(x / 128): the blocks of a block scale's side."""
    return -(-x // BLOCK)


def b_scale_mode(shape, n, k):
    """What PyTorch's scale_b of B (K x N) is, as ovl reads it: "tensor" (1
    element), "row" ((1, N)), "1x128" ((ceil(K/128), N): scale_b.t() one
    per column of B and 128 of K), "128x128" ((ceil(K/128), ceil(N/128))),
    or None. Its strides do not matter: ovl.torch lays every one out as ovl
    takes it (scale_b.t(), contiguous)."""
    s = list(shape)
    if _numel(s) == 1:
        return "tensor"
    kq = _blocks(k)
    if s == [1, n]:  # with K of one block, B's 1x128 scales too (the same values)
        return "row"
    if s == [kq, n]:
        return "1x128"
    if s == [kq, _blocks(n)]:
        return "128x128"
    return None


def _b_scale(name, scale, n, k):
    """(why not, or None; the mode) of B's scale."""
    why = _scale_dtype(name, scale)
    if why:
        return why, None
    mode = b_scale_mode(scale[0], n, k)
    if mode is not None:
        return None, mode
    kq = _blocks(k)
    return ("%s of shape %s: neither tensor-wise (1 element), row-wise ((1, %d)) nor block-wise "
            "(1x128: (%d, %d); 128x128: (%d, %d))" % (name, tuple(scale[0]), n, kq, n, kq,
                                                     _blocks(n))), None


def _a_tile(a_shape, shape, rows):
    """Whether A's scale of this shape is PyTorch's BlockWise128x128 of a
    2-D A (ceil(rows/128) x ceil(K/128), rows one of the row counts
    given)."""
    s = list(shape)
    return (len(a_shape) == 2 and len(s) == 2 and s[1] == _blocks(a_shape[-1])
            and any(s[0] == _blocks(r) and s[0] != r for r in rows))


def _a_tile_words(shape):
    return ("A_scale of shape %s: 128x128 blocks of A (PyTorch's BlockWise128x128), which ovl "
            "does not take: it cuts A by rows, across ranks and chunks (A's block-wise scales "
            "are 1x128: A's leading dimensions, then ceil(K/128))" % (tuple(shape),))


def _pair(a_mode, b_modes, names, k, rows, ns):
    """Why ovl does not take A's scales of a_mode ("tensor", "row", "1x128")
    with each B's (b_modes; names: what each is called), or None; rows: A's
    rows of each GEMM (count, words), ns: each B's N. With K of one block,
    A's row-wise scales are its 1x128 ones."""
    for i, bm in enumerate(b_modes):
        am = "1x128" if a_mode == "row" and _blocks(k) == 1 and bm in BLOCK_MODES else a_mode
        name = names[i]
        if (am in BLOCK_MODES) != (bm in BLOCK_MODES):
            return ("A_scale %s and %s %s: block-wise scales on one operand only (ovl's scaled "
                    "GEMM, as cuBLASLt's, takes block-wise scales with block-wise ones)" % (
                        _MODE_WORDS[am], name, _MODE_WORDS[bm]))
        if am == "1x128" and rows[0] % 4:
            return ("A_scale 1x128 with %s of %d rows, not a multiple of 4 (cuBLASLt lays "
                    "each 128 of K's scales out by rows, 16-byte aligned)" % (rows[1], rows[0]))
        if bm == "1x128" and ns[i] % 4:
            return ("%s 1x128 with N %d not a multiple of 4 (cuBLASLt lays each 128 of K's "
                    "scales out by columns of op(B), 16-byte aligned)" % (name, ns[i]))
    return None


def _bias(name, bias, n, out_dtype):
    if bias is None:
        return None
    shape, dtype = bias
    if list(shape) != [n]:
        return "%s of shape %s (ovl takes %d elements, one per column)" % (name, tuple(shape), n)
    if dtype != out_dtype:
        return "%s of dtype %s, the output's is %s (ovl takes a bias of the output's dtype)" % (
            name, dtype, out_dtype)
    return None


def ag_scale_mode(a_shape, scale_shape, gather_dim, world):
    """PyTorch's reading of fused_all_gather_scaled_matmul's A_scale
    (_check_and_verify_fp8_all_gather_scale_mode), in its order:
    "row-sharded" (this rank's rows: A_shard's leading dimensions, then 1),
    "tensor" (1 element), the gathered A's leading dimensions then 1
    ("row-replicated") or another last dimension ("block-replicated",
    which its kernels hand _scaled_mm as they are: 1x128 where that is
    ceil(K/128)), or None (PyTorch's kernels raise). "block-sharded": A_shard's
    leading dimensions and a last one other than 1 at a world over 1 (at
    world 1 those are replicated), which PyTorch's kernels raise for too."""
    full = list(a_shape)
    full[gather_dim] *= world
    s = list(scale_shape)
    if len(s) >= 1 and s[:-1] == list(a_shape[:-1]) and s[-1] == 1:
        return "row-sharded"
    if _numel(s) == 1:
        return "tensor"
    if len(s) >= 1 and s[:-1] == full[:-1]:
        return "row-replicated" if s[-1] == 1 else "block-replicated"
    if len(s) >= 1 and s[:-1] == list(a_shape[:-1]):
        return "block-sharded"
    return None


def ag_scale_refusal(a_shape, scale_shape, gather_dim, world, texts=None):
    """Why PyTorch's kernels (and ovl's) refuse A_scale of this shape for
    fused_all_gather_scaled_matmul (ValueError), or None: PyTorch's words,
    and ovl's where they say more. texts: how to write the two shapes
    (torch.Size's words), tuples' by default."""
    mode = ag_scale_mode(a_shape, scale_shape, gather_dim, world)
    if mode not in (None, "block-sharded"):
        return None
    words = ("Invalid scale shape for fp8 all-gather (shard shape: %s, scale shape: %s)"
             % (texts or (tuple(a_shape), tuple(scale_shape))))
    if mode == "block-sharded":
        return words + ("; block-wise scales of A_shard's rows alone are not taken: give "
                        "those of every rank's rows (the gathered A's leading dimensions, "
                        "then ceil(K/128)), as PyTorch reads them")
    rows = _numel(a_shape[:-1])
    if _a_tile(a_shape, scale_shape, (rows, rows * world)):
        return words + "; " + _a_tile_words(scale_shape)
    return words


def rs_scale_refusal(a_shape, scale_shape, texts=None):
    """Why PyTorch's kernels (and ovl's) refuse A_scale of this shape for
    fused_scaled_matmul_reduce_scatter (ValueError: more than one element,
    and leading dimensions other than A's), or None; as
    ag_scale_refusal's."""
    s = list(scale_shape)
    if _numel(s) <= 1 or s[:-1] == list(a_shape[:-1]):
        return None
    words = ("For row-wise scaling, the leading dims of A_scale must match the leading dims of "
             "A (A shape: %s, A_scale shape: %s)" % (texts or (tuple(a_shape), tuple(s))))
    if _a_tile(a_shape, s, (_numel(a_shape[:-1]),)):
        return words + "; " + _a_tile_words(s)
    return words


def why_not_scaled_ag(devices, a_dtype, b_dtypes, a_shape, b_shapes, b_strides, a_scale,
                      b_scales, gather_dim, biases, result_scales, out_dtypes, use_fast_accum,
                      world):
    """None where ovl takes fused_all_gather_scaled_matmul of these, else
    why not. devices: every tensor's device type; a_dtype, b_dtypes: dtype
    names; a_shape: A_shard's; b_shapes, b_strides: each B's (strides in
    elements); a_scale: (shape, dtype name); b_scales: one such per B;
    biases: per B None or (shape, dtype name); result_scales: per B whether
    one is given; out_dtypes: per B a dtype name or None; use_fast_accum:
    per B (any values: each B is an ovl op of its own); world: the group's
    size."""
    nb = len(b_shapes)
    if nb == 0:
        return "0 Bs"
    for what, xs in (("B_scales", b_scales), ("biases", biases),
                     ("result_scales", result_scales), ("out_dtypes", out_dtypes),
                     ("use_fast_accum", use_fast_accum)):
        if len(xs) != nb:
            return "%d %s for %d Bs (PyTorch's kernel raises)" % (len(xs), what, nb)
    why = _common(devices, ["float32"]) or _fp8_dtypes(a_dtype, b_dtypes)
    if why:
        return why
    nd = len(a_shape)
    if nd < 2:
        return "A_shard of %d dimension%s" % (nd, "" if nd == 1 else "s")
    if not 0 <= gather_dim < nd:
        return "gather_dim %d out of range (PyTorch's kernel takes 0 to %d)" % (gather_dim,
                                                                                nd - 1)
    if _empty([a_shape] + list(b_shapes)):
        return "an empty tensor"
    if gather_dim == nd - 1:
        return ("gather_dim is A's last: ovl gathers rows, and PyTorch's own kernel takes the "
                "last dimension")
    k = a_shape[-1]
    b_modes = []
    for i in range(nb):
        name = "Bs[%d]" % i
        why = (_scaled_b(name, a_shape, b_shapes[i], b_strides[i]) or
               _scaled_out("out_dtypes[%d]" % i, out_dtypes[i], result_scales[i]))
        if not why:
            why, mode = _b_scale("B_scales[%d]" % i, b_scales[i], b_shapes[i][1], k)
            b_modes.append(mode)
        why = why or _bias("biases[%d]" % i, biases[i], b_shapes[i][1], out_dtypes[i])
        if why:
            return why
    why = _scale_dtype("A_scale", a_scale)
    if why:
        return why
    s = list(a_scale[0])
    mode = ag_scale_mode(a_shape, s, gather_dim, world)
    rows = _numel(a_shape[:-1])
    if mode == "block-sharded":
        return ("A_scale of shape %s: block-wise scales of this rank's rows only (A_shard's "
                "leading dimensions), which PyTorch's fused op does not take (its kernel "
                "raises: it reads this rank's rows' scales as (..., 1) only); give every "
                "rank's rows' (the gathered A's leading dimensions, then ceil(K/128))"
                % (tuple(s),))
    if mode is None:
        if _a_tile(a_shape, s, (rows, rows * world)):
            return _a_tile_words(s)
        return ("A_scale of shape %s fits neither a tensor-wise nor a row-wise scale of "
                "A_shard %s (PyTorch's kernel raises)" % (tuple(s), tuple(a_shape)))
    if mode == "block-replicated" and s[-1] != _blocks(k):
        return ("A_scale of shape %s: its last dimension (%d) is neither 1 (row-wise) nor "
                "ceil(K/128) = %d (block-wise 1x128, one per row and 128 of K)" % (
                    tuple(s), s[-1], _blocks(k)))
    a_mode = {"tensor": "tensor", "block-replicated": "1x128"}.get(mode, "row")
    return _pair(a_mode, b_modes, ["B_scales[%d]" % i for i in range(nb)], k,
                 (rows, "this rank's A_shard"), [b[1] for b in b_shapes])


def why_not_scaled_rs(devices, a_dtype, b_dtype, a_shape, b_shape, b_stride, a_scale, b_scale,
                      reduce_op, orig_scatter_dim, scatter_dim_after_maybe_reshape, output_shape,
                      bias, result_scale, out_dtype, world):
    """None where ovl takes fused_scaled_matmul_reduce_scatter of these,
    else why not (the arguments as why_not_scaled_ag's, for one B;
    output_shape: a list, or None)."""
    why = _common(devices, ["float32"]) or _fp8_dtypes(a_dtype, [b_dtype])
    if why:
        return why
    nd = len(a_shape)
    if nd < 2:
        return "A of %d dimension%s" % (nd, "" if nd == 1 else "s")
    why = _scaled_b("B", a_shape, b_shape, b_stride)
    if why:
        return why
    if reduce_op not in ("sum", "avg"):
        return "reduce_op %r (ovl takes sum and avg)" % (reduce_op,)
    if output_shape is None:
        return "output_shape None (PyTorch's kernel needs it)"
    osh = list(output_shape)
    if len(osh) < 2 or _numel(osh[:-1]) != _numel(a_shape[:-1]):
        return "output_shape %s does not hold A's %d rows" % (tuple(osh),
                                                              _numel(a_shape[:-1]))
    if not 0 <= orig_scatter_dim < len(osh):
        return "orig_scatter_dim %d out of range (PyTorch's kernel takes 0 to %d)" % (
            orig_scatter_dim, len(osh) - 1)
    if not 0 <= scatter_dim_after_maybe_reshape < nd:
        return "scatter_dim_after_maybe_reshape %d out of range (PyTorch's kernel takes 0 to " \
               "%d)" % (scatter_dim_after_maybe_reshape, nd - 1)
    if _empty([a_shape, b_shape]):
        return "an empty tensor"
    if orig_scatter_dim == len(osh) - 1:
        return ("orig_scatter_dim is the output's last (its N columns): ovl's scaled GEMM + "
                "reduce-scatter scatters rows")
    size = osh[orig_scatter_dim]
    if world < 1 or size % world:
        return "the scattered dimension (%d) is not a multiple of the world %d" % (size, world)
    k, n = a_shape[-1], b_shape[1]
    why = _scaled_out("out_dtype", out_dtype, result_scale)
    if why:
        return why
    why, b_mode = _b_scale("B_scale", b_scale, n, k)
    why = why or _bias("bias", bias, n, out_dtype) or _scale_dtype("A_scale", a_scale)
    if why:
        return why
    s = list(a_scale[0])
    rows = _numel(a_shape[:-1])
    if _numel(s) == 1:
        a_mode = "tensor"
    elif s[:-1] != list(a_shape[:-1]):
        if _a_tile(a_shape, s, (rows,)):
            return _a_tile_words(s)
        return ("A_scale of shape %s fits neither a tensor-wise nor a row-wise scale of A %s "
                "(PyTorch's kernel raises)" % (tuple(s), tuple(a_shape)))
    elif s[-1] == 1:
        a_mode = "row"
    elif s[-1] == _blocks(k):
        a_mode = "1x128"
    else:
        return ("A_scale of shape %s: its last dimension (%d) is neither 1 (row-wise) nor "
                "ceil(K/128) = %d (block-wise 1x128, one per row and 128 of K)" % (
                    tuple(s), s[-1], _blocks(k)))
    return _pair(a_mode, [b_mode], ["B_scale"], k, (rows // world, "each rank's block of the "
                                                    "output"), [n])


class Installer:
    """install()/uninstall()'s state: the overriding registration (an
    object with a destroy() method, made by `register`) while installed.
    install is harmless twice; uninstall without install does nothing."""

    def __init__(self):
        self._mu = threading.Lock()
        self._reg = None

    @property
    def installed(self):
        with self._mu:
            return self._reg is not None

    def install(self, register):
        """register(): makes the registration (raising where it cannot).
        Returns True if it installed now, False if it already was."""
        with self._mu:
            if self._reg is not None:
                return False
            self._reg = register()
            return True

    def uninstall(self):
        """Returns True if it uninstalled now."""
        with self._mu:
            reg, self._reg = self._reg, None
        if reg is None:
            return False
        reg.destroy()
        return True
