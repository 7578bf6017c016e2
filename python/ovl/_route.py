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

Anything else runs PyTorch's own kernel. Each reason is logged once per
process (a warning on the "ovl.torch" logger), with a count of the calls it
sent back kept for stats().
"""
import logging
import threading

DTYPES = ("bfloat16", "float16", "float32")
MAX_BS = 8

LOG = logging.getLogger("ovl.torch")


class Router:
    """The fall-back bookkeeping of one process: the reasons seen (each
    logged once), how many calls each sent to PyTorch's kernel, and how many
    calls ovl took, per op."""

    def __init__(self, log=LOG):
        self._mu = threading.Lock()
        self._log = log
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
            self._log.warning("ovl.torch: symm_mem.%s runs PyTorch's own kernel: %s (said once; "
                              "ovl.torch.stats() counts the calls)", op, reason)

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
