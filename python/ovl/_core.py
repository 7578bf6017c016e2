"""Client and Comm: ovld's client API over libovl (include/ovl/ovl.h)."""
import ctypes
import operator
import os
import sys
import threading
import uuid
import weakref

from . import _lib
from .errors import Closed, InvalidArgument, Unsupported, error_for

try:
    import numpy as np
except ImportError:  # the CUDA path needs no numpy
    np = None

try:
    import ml_dtypes as _ml_dtypes
except ImportError:
    _ml_dtypes = None

_DTYPE_SIZES = {_lib.DTYPE_BF16: 2, _lib.DTYPE_FP16: 2, _lib.DTYPE_FP32: 4}
_DTYPE_NAMES = {_lib.DTYPE_BF16: "bf16", _lib.DTYPE_FP16: "fp16", _lib.DTYPE_FP32: "fp32",
                _lib.DTYPE_FP8_E4M3: "fp8e4m3", _lib.DTYPE_FP8_E5M2: "fp8e5m2"}
_DTYPE_ALIASES = {
    "fp32": _lib.DTYPE_FP32, "float32": _lib.DTYPE_FP32, "float": _lib.DTYPE_FP32,
    "fp16": _lib.DTYPE_FP16, "float16": _lib.DTYPE_FP16, "half": _lib.DTYPE_FP16,
    "bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16,
}
_TORCH_DTYPES = {"torch.float32": _lib.DTYPE_FP32, "torch.float16": _lib.DTYPE_FP16,
                 "torch.bfloat16": _lib.DTYPE_BF16}
# The 8-bit floats: a scaled op's inputs only (ovl_scaling_t), never an
# output; kept out of the tables above, which the unscaled ops read.
_FP8_E4M3, _FP8_E5M2 = _lib.DTYPE_FP8_E4M3, _lib.DTYPE_FP8_E5M2
_FP8_NAMES = {_FP8_E4M3: "fp8e4m3", _FP8_E5M2: "fp8e5m2"}
_FP8_ALIASES = {"fp8e4m3": _FP8_E4M3, "float8_e4m3fn": _FP8_E4M3, "e4m3": _FP8_E4M3,
                "fp8e5m2": _FP8_E5M2, "float8_e5m2": _FP8_E5M2, "e5m2": _FP8_E5M2}
_TORCH_FP8 = {"torch.float8_e4m3fn": _FP8_E4M3, "torch.float8_e5m2": _FP8_E5M2}
_TORCH_OF_CODE = {_lib.DTYPE_FP32: "float32", _lib.DTYPE_FP16: "float16",
                  _lib.DTYPE_BF16: "bfloat16", _FP8_E4M3: "float8_e4m3fn",
                  _FP8_E5M2: "float8_e5m2"}
_TORCH_DTYPE_OBJS = {}  # torch.dtype -> code, filled from _TORCH_DTYPES as met
_CAI_TYPESTRS = {"<f4": _lib.DTYPE_FP32, "<f2": _lib.DTYPE_FP16}

# What the C types at the ctypes boundary hold. ctypes keeps the low bits of
# a Python int that does not fit (world 2**32 + 1 would reach libovl as 1),
# so every int is checked against these before it crosses.
_U32_MAX = 2 ** 32 - 1
_INT_MAX = 2 ** 31 - 1          # int (a device ordinal, a timeout)
_U64_MAX = 2 ** 64 - 1          # uint64_t, size_t, a pointer
_SIZE_MAX = sys.maxsize         # the most elements or bytes a numpy array holds

# Job names (docs/protocol.md, CommInit.job_id; daemon/server/request.c's
# check_job_id): 1 to 63 bytes of UTF-8, no NUL, no control character.
_JOB_NAME_MAX = 63
# the bidirectional controls, which ovld refuses as controls (common/text.c,
# ovl_text_is_control): they reorder a line on a terminal
_BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                            *range(0x2066, 0x206A)])


def _as_int(name, v):
    """v as a Python int (an int or anything with __index__, not a bool)."""
    if isinstance(v, bool):
        raise InvalidArgument("%s: an int, got %r" % (name, v))
    try:
        return operator.index(v)
    except TypeError:
        raise InvalidArgument("%s: an int, got %r" % (name, v)) from None


def _int_arg(name, v, lo, hi):
    """v as an int in lo..hi, checked before ctypes narrows it;
    InvalidArgument otherwise."""
    v = _as_int(name, v)
    if not lo <= v <= hi:
        raise InvalidArgument("%s %d out of range %d..%d" % (name, v, lo, hi))
    return v


def _job_name(job):
    """The bytes libovl sends for a job name, refused here as ovld would
    refuse them, and before libovl's C string would cut them at a NUL
    ("a\x00b" would join job "a")."""
    try:
        raw = job.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument("job %r: not encodable as UTF-8 (%s)" % (job, e.reason)) from None
    if "\x00" in job:
        raise InvalidArgument("job %r: holds a NUL at %d (job ids are text; libovl's C string "
                              "would end there)" % (job, job.index("\x00")))
    for i, ch in enumerate(job):
        cp = ord(ch)
        if cp < 0x20 or 0x7f <= cp <= 0x9f or cp in _BIDI_CONTROLS:
            raise InvalidArgument("job %r: control character U+%04X at %d (job ids are text "
                                  "shown to operators)" % (job, cp, i))
    if not 1 <= len(raw) <= _JOB_NAME_MAX:
        raise InvalidArgument("job %r: %d bytes of UTF-8; a job id is 1 to %d bytes" % (
            job, len(raw), _JOB_NAME_MAX))
    return raw


def _numpy():
    if np is None:
        raise Unsupported("the host backend needs numpy (Debian: apt-get install python3-numpy)",
                          -16)
    return np


def _bf16_numpy_dtype():
    """bf16 on the host: ml_dtypes.bfloat16 if importable, else uint16 (the
    raw bits: ovl.bf16_to_float32 / float32_to_bf16 convert)."""
    return np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else np.dtype(np.uint16)


def _parse_dtype(dtype, fp8=False):
    """An ovl_dtype_t from a name, a numpy dtype or a torch dtype; fp8: the
    8-bit floats too (Client.empty's arrays of a scaled op's inputs)."""
    if fp8:
        code = _fp8_code(dtype)
        if code is not None:
            return code
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[dtype.lower()]
    if str(dtype) in _TORCH_DTYPES:
        return _TORCH_DTYPES[str(dtype)]
    if np is not None:
        try:
            d = np.dtype(dtype)
        except TypeError:
            d = None
        if d is not None:
            code = _numpy_dtype_code(d)
            if code is not None:
                return code
    raise InvalidArgument("dtype %r: ovl takes fp32, fp16 or bf16%s" % (
        dtype, " (and fp8e4m3 or fp8e5m2 for a scaled op's inputs)" if fp8 else ""))


def _fp8_code(v):
    """The fp8 ovl_dtype_t that v names (a name such as "fp8e4m3", a torch
    dtype, an ml_dtypes dtype), or None."""
    if isinstance(v, str):
        return _FP8_ALIASES.get(v.lower())
    code = _TORCH_FP8.get(str(v))
    if code is not None or np is None:
        return code
    try:
        return _FP8_ALIASES.get(np.dtype(v).name)
    except (TypeError, ValueError):
        return None


def _fp8_numpy_dtype(code):
    """fp8 on the host: ml_dtypes' float8_e4m3fn / float8_e5m2 if importable,
    else uint8 (the codes: ovl.fp8_to_float32 / float32_to_fp8 convert)."""
    if _ml_dtypes is None:
        return np.dtype(np.uint8)
    return np.dtype(_ml_dtypes.float8_e4m3fn if code == _FP8_E4M3 else _ml_dtypes.float8_e5m2)


_FP8_TABLES = {}


def _fp8_table(code):
    """The float32 value of each of the 256 codes of an fp8 format (OCP:
    e4m3 without infinities, NaN at S.1111.111; e5m2 IEEE-like)."""
    t = _FP8_TABLES.get(code)
    if t is not None:
        return t
    c = np.arange(256, dtype=np.int64)
    if code == _FP8_E4M3:
        e, m, mbits, bias = (c >> 3) & 0xF, c & 7, 3, 7
    else:
        e, m, mbits, bias = (c >> 2) & 0x1F, c & 3, 2, 15
    frac = m.astype(np.float64) / (1 << mbits)
    v = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias))
    v = np.where(c & 0x80, -v, v)
    if code == _FP8_E4M3:
        v[(e == 15) & (m == 7)] = np.nan
    else:
        v[(e == 31) & (m == 0)] = np.where(c[(e == 31) & (m == 0)] & 0x80, -np.inf, np.inf)
        v[(e == 31) & (m != 0)] = np.nan
    t = v.astype(np.float32)
    t.flags.writeable = False
    _FP8_TABLES[code] = t
    return t


def _fp8_arg(fn, x, dtype):
    """(codes as uint8, fp8 code) of fp8 data x: an ml_dtypes fp8 array, or
    uint8 codes with dtype naming their format."""
    x = np.asarray(x)
    code = _FP8_ALIASES.get(x.dtype.name) if x.dtype.name.startswith("float8") else None
    want = None if dtype is None else _fp8_code(dtype)
    if dtype is not None and want is None:
        raise InvalidArgument("%s: dtype %r: fp8e4m3 or fp8e5m2" % (fn, dtype))
    if code is None:
        if x.dtype != np.uint8:
            raise InvalidArgument("%s: an array of %s; fp8 data is ml_dtypes' float8_e4m3fn or "
                                  "float8_e5m2, or uint8 codes with dtype=" % (fn, x.dtype))
        if want is None:
            raise InvalidArgument("%s: uint8 codes: name their format, dtype='fp8e4m3' or "
                                  "'fp8e5m2'" % fn)
        code = want
    elif want is not None and want != code:
        raise InvalidArgument("%s: an array of %s, but dtype names %s" % (
            fn, x.dtype.name, _FP8_NAMES[want]))
    return x.view(np.uint8), code


def fp8_to_float32(x, dtype=None):
    """float32 values of fp8 data: an ml_dtypes float8_e4m3fn / float8_e5m2
    array, or uint8 codes with dtype "fp8e4m3" or "fp8e5m2" (what
    Client.empty gives without ml_dtypes). Exact."""
    _numpy()
    u, code = _fp8_arg("fp8_to_float32", x, dtype)
    return _fp8_table(code)[u]


def float32_to_fp8(x, dtype=None, out=None):
    """The fp8 codes (uint8) of values, rounded to nearest, ties to even, as
    a cast to PyTorch's and ml_dtypes' fp8 types rounds: past the largest
    finite value by half a step or more, e4m3 (no infinities) gives NaN and
    e5m2 infinity; NaN stays NaN. dtype: "fp8e4m3" or "fp8e5m2". Into out
    (uint8 codes, or an ml_dtypes fp8 array such as Client.empty gives,
    which names the format itself) if given, and returns out."""
    _numpy()
    if out is not None:
        o, code = _fp8_arg("float32_to_fp8: out", out, dtype)
    else:
        code = _fp8_code(dtype) if dtype is not None else None
        if code is None:
            raise InvalidArgument("float32_to_fp8: dtype %r: fp8e4m3 or fp8e5m2" % (dtype,))
    f = np.asarray(x, dtype=np.float64)
    table = _fp8_table(code).astype(np.float64)
    # the finite non-negative values, increasing with the code, then the
    # first code past them: e4m3's NaN (0x7F), e5m2's infinity (0x7C), at
    # the value one step past the largest (where rounding would go)
    top = 0x7E if code == _FP8_E4M3 else 0x7B
    vals = np.append(table[:top + 1], 480.0 if code == _FP8_E4M3 else 65536.0)
    codes = np.append(np.arange(top + 1), 0x7F if code == _FP8_E4M3 else 0x7C)
    mag = np.abs(f)
    hi = np.clip(np.searchsorted(vals, mag, side="left"), 1, len(vals) - 1)
    lo = hi - 1
    dlo, dhi = mag - vals[lo], vals[hi] - mag
    up = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    r = np.where(up, codes[hi], codes[lo])
    r = np.where(mag > vals[-1], codes[-1], r)
    r = np.where(np.signbit(f), r | 0x80, r)
    r = np.where(np.isnan(f), 0x7F, r).astype(np.uint8)
    if out is None:
        return r
    o[...] = r
    return out


def _numpy_dtype_code(d):
    if d == np.float32:
        return _lib.DTYPE_FP32
    if d == np.float16:
        return _lib.DTYPE_FP16
    if d == np.uint16 or d.name == "bfloat16":
        return _lib.DTYPE_BF16
    return None


def bf16_to_float32(x):
    """float32 values of bf16 bits held as uint16 (or an ml_dtypes array)."""
    x = np.asarray(x)
    if x.dtype.name == "bfloat16":
        return x.astype(np.float32)
    return (x.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(x, out=None):
    """bf16 bits (uint16) of float32 values, rounded to nearest even; into out
    (a uint16 or bfloat16 array, e.g. from Client.empty) if given."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # quiet NaNs stay NaNs
    if out is None:
        return r
    out.view(np.uint16)[...] = r
    return out


class _Mat:
    """One matrix argument as libovl sees it: pointer, rows, columns,
    leading dimension (elements), dtype, and where it lives."""
    __slots__ = ("name", "ptr", "rows", "cols", "ld", "dtype", "kind", "device", "obj",
                 "writeable", "nbytes_span")

    def __init__(self, name, obj, ptr, rows, cols, row_stride_bytes, itemsize, dtype, kind,
                 device=None, writeable=True):
        self.name, self.obj, self.ptr = name, obj, ptr
        self.rows, self.cols, self.dtype, self.kind, self.device = rows, cols, dtype, kind, device
        self.writeable = writeable
        if rows <= 1:
            self.ld = cols
        else:
            if row_stride_bytes % itemsize or row_stride_bytes // itemsize < cols:
                raise InvalidArgument("%s: rows overlap or are not a whole number of elements "
                                      "apart (row stride %d bytes, %d columns of %d bytes)" % (
                                          name, row_stride_bytes, cols, itemsize))
            self.ld = row_stride_bytes // itemsize
        self.nbytes_span = ((rows - 1) * self.ld + cols) * itemsize if rows and cols else 0

    def shape(self):
        return (self.rows, self.cols)


def _check_2d_strides(name, shape, strides, itemsize):
    if len(shape) != 2:
        raise InvalidArgument("%s: a 2-D matrix is needed, got %d dimensions" % (name, len(shape)))
    if shape[0] == 0 or shape[1] == 0:
        raise InvalidArgument("%s: an empty matrix (%d x %d)" % (name, shape[0], shape[1]))
    if shape[1] > 1 and strides[1] != itemsize:
        raise InvalidArgument("%s: not contiguous along its rows (column stride %d bytes, "
                              "element %d bytes): pass a C-contiguous array, or one whose "
                              "rows are contiguous" % (name, strides[1], itemsize))
    if shape[0] > 1 and strides[0] <= 0:
        raise InvalidArgument("%s: rows go backwards or repeat (row stride %d bytes)" % (
            name, strides[0]))


def _describe(name, x):
    """A _Mat for a numpy array, a torch tensor or a __cuda_array_interface__
    object; InvalidArgument for anything else."""
    if np is not None and isinstance(x, np.ndarray):
        code = _numpy_dtype_code(x.dtype)
        if code is None:
            raise InvalidArgument("%s: dtype %s; ovl takes float32, float16 and bf16 (uint16 "
                                  "bits or ml_dtypes.bfloat16)" % (name, x.dtype))
        _check_2d_strides(name, x.shape, x.strides, x.itemsize)
        return _Mat(name, x, x.__array_interface__["data"][0], x.shape[0], x.shape[1],
                    x.strides[0], x.itemsize, code, "host", writeable=x.flags.writeable)
    if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr"):
        dt = x.dtype
        code = _TORCH_DTYPE_OBJS.get(dt)
        if code is None:  # torch.dtype objects are keys from the first use on
            code = _TORCH_DTYPES.get(str(dt))
            if code is not None:
                _TORCH_DTYPE_OBJS[dt] = code
        if code is None:
            raise InvalidArgument("%s: dtype %s; ovl takes torch.float32, float16 and bfloat16"
                                  % (name, x.dtype))
        if not x.is_cuda:
            raise InvalidArgument("%s: a CPU tensor; with the host backend pass arrays from "
                                  "Client.empty, with the CUDA backend CUDA tensors" % name)
        item = x.element_size()
        strides = tuple(s * item for s in x.stride())
        _check_2d_strides(name, tuple(x.shape), strides, item)
        return _Mat(name, x, x.data_ptr(), x.shape[0], x.shape[1], strides[0], item, code,
                    "cuda", device=x.get_device())
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        code = _CAI_TYPESTRS.get(cai["typestr"])
        if code is None:
            raise InvalidArgument("%s: typestr %r; ovl takes <f4 and <f2 through "
                                  "__cuda_array_interface__ (bf16: a torch tensor)" % (
                                      name, cai["typestr"]))
        # what the object says crosses into the desc's uint64_t and size_t
        shape = tuple(_int_arg("%s: dimension" % name, s, 0, _SIZE_MAX) for s in cai["shape"])
        item = _DTYPE_SIZES[code]
        strides = cai.get("strides")
        if strides is None and len(shape) == 2:
            strides = (shape[1] * item, item)
        strides = tuple(_int_arg("%s: stride" % name, s, -_SIZE_MAX, _SIZE_MAX)
                        for s in (strides or ()))
        _check_2d_strides(name, shape, strides, item)
        ptr, readonly = cai["data"]
        ptr = _int_arg("%s: data pointer" % name, ptr, 0, _U64_MAX)
        return _Mat(name, x, ptr, shape[0], shape[1], strides[0], item, code, "cuda",
                    writeable=not readonly)
    raise InvalidArgument("%s: a %s; ovl takes numpy arrays from Client.empty (host backend), "
                          "torch CUDA tensors or __cuda_array_interface__ objects (CUDA backend)"
                          % (name, type(x).__name__))


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _cai_geometry(name, x, cai):
    """shape and strides (bytes) that a __cuda_array_interface__ states,
    checked as the ints they cross into."""
    shape = tuple(_int_arg("%s: dimension" % name, s, 0, _SIZE_MAX) for s in cai["shape"])
    typestr = cai["typestr"]
    try:
        item = int(typestr[2:])
    except (TypeError, ValueError):
        raise InvalidArgument("%s: typestr %r" % (name, typestr)) from None
    strides = cai.get("strides")
    if strides is None:  # C order
        strides, step = [], item
        for d in reversed(shape):
            strides.insert(0, step)
            step *= d or 1
    strides = tuple(_int_arg("%s: stride" % name, s, -_SIZE_MAX, _SIZE_MAX) for s in strides)
    if len(strides) != len(shape):
        raise InvalidArgument("%s: %d strides for %d dimensions" % (name, len(strides),
                                                                     len(shape)))
    return shape, strides, item


def _geometry(name, x):
    """(shape, strides in bytes, itemsize) of a numpy array, a torch tensor or
    a __cuda_array_interface__ object; InvalidArgument for anything else."""
    if np is not None and isinstance(x, np.ndarray):
        return tuple(x.shape), tuple(x.strides), x.itemsize
    if _is_torch(x):
        item = x.element_size()
        return tuple(x.shape), tuple(st * item for st in x.stride()), item
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _cai_geometry(name, x, cai)
    raise InvalidArgument("%s: a %s; ovl takes numpy arrays from Client.empty (host backend), "
                          "torch CUDA tensors or __cuda_array_interface__ objects (CUDA backend)"
                          % (name, type(x).__name__))


class _CaiT:
    """The transpose of a 2-D __cuda_array_interface__ object (a view)."""

    def __init__(self, base, cai, shape, strides):
        self.base = base
        self.__cuda_array_interface__ = {
            "shape": (shape[1], shape[0]), "strides": (strides[1], strides[0]),
            "typestr": cai["typestr"], "data": cai["data"], "version": cai.get("version", 2)}


def _transposed(name, x):
    """x.T as an object of x's kind (a view)."""
    if np is not None and isinstance(x, np.ndarray):
        return x.T
    if _is_torch(x):
        return x.t()
    cai = getattr(x, "__cuda_array_interface__", None)
    shape, strides, _ = _geometry(name, x)
    return _CaiT(x, cai, shape, strides)


def _fp8_of_object(name, x, hint):
    """The fp8 code of a scaled op's matrix x: its own dtype (ml_dtypes' or
    torch's float8_e4m3fn / float8_e5m2), or for uint8 codes the format
    that dtype= named (hint); InvalidArgument otherwise."""
    if np is not None and isinstance(x, np.ndarray):
        dn = x.dtype.name
        own = _FP8_ALIASES.get(dn) if dn.startswith("float8") else None
        raw = x.dtype == np.uint8
    elif _is_torch(x):
        dn = str(x.dtype)
        own = _TORCH_FP8.get(dn)
        raw = dn == "torch.uint8"
    else:
        dn = getattr(x, "__cuda_array_interface__", {}).get("typestr")
        own, raw = None, dn in ("|u1", "<u1")
    if own is not None:
        if hint is not None and hint != own:
            raise InvalidArgument("%s: holds %s, but dtype names %s" % (
                name, _FP8_NAMES[own], _FP8_NAMES[hint]))
        return own
    if raw:
        if hint is None:
            raise InvalidArgument("%s: uint8 codes: name their fp8 format with dtype='fp8e4m3' "
                                  "or 'fp8e5m2' (or pass ml_dtypes' or torch's float8 types)"
                                  % name)
        return hint
    raise InvalidArgument("%s: dtype %s; a scaled op's A and B are fp8: ml_dtypes' or torch's "
                          "float8_e4m3fn / float8_e5m2, or uint8 codes with dtype='fp8e4m3' or "
                          "'fp8e5m2'" % (name, dn))


def _describe_fp8(name, x, hint):
    """A _Mat for a scaled op's fp8 matrix (a, b as n x k, a_out)."""
    shape, strides, item = _geometry(name, x)
    code = _fp8_of_object(name, x, hint)
    if item != 1:
        raise InvalidArgument("%s: elements of %d bytes; fp8 elements are 1 byte" % (name, item))
    _check_2d_strides(name, shape, strides, 1)
    if np is not None and isinstance(x, np.ndarray):
        return _Mat(name, x, x.__array_interface__["data"][0], shape[0], shape[1], strides[0], 1,
                    code, "host", writeable=x.flags.writeable)
    if _is_torch(x):
        if not x.is_cuda:
            raise InvalidArgument("%s: a CPU tensor; with the host backend pass arrays from "
                                  "Client.empty, with the CUDA backend CUDA tensors" % name)
        return _Mat(name, x, x.data_ptr(), shape[0], shape[1], strides[0], 1, code, "cuda",
                    device=x.get_device())
    ptr, readonly = x.__cuda_array_interface__["data"]
    ptr = _int_arg("%s: data pointer" % name, ptr, 0, _U64_MAX)
    return _Mat(name, x, ptr, shape[0], shape[1], strides[0], 1, code, "cuda",
                writeable=not readonly)


def _scaled_b(b, transb, hint):
    """A scaled op's B as ovl takes it, n x k row-major (transb): B given as
    PyTorch's _scaled_mm takes it, k x n column-major (w.T of a row-major n
    x k weight w), or w itself with transb=True; any other layout is
    refused, naming the rule."""
    shape, strides, item = _geometry("b", b)
    if len(shape) != 2:
        raise InvalidArgument("b: a 2-D matrix is needed, got %d dimensions" % len(shape))
    rule = ("a scaled op takes B as cuBLASLt's fp8 GEMM (and PyTorch's _scaled_mm) does: "
            "k x n column-major, the transpose of a row-major n x k weight w (pass w.T, or w "
            "itself with transb=True)")
    r, c = shape
    if transb:  # w: n x k, its rows contiguous
        if not ((c <= 1 or strides[1] == item) and (r <= 1 or strides[0] >= c * item)):
            raise InvalidArgument("b: %d x %d with transb but not row-major (strides %s bytes): %s"
                                  % (r, c, strides, rule))
        return _describe_fp8("b", b, hint)
    if not ((r <= 1 or strides[0] == item) and (c <= 1 or strides[1] >= r * item)):
        raise InvalidArgument("b: k x n = %d x %d is not column-major (strides %s bytes): %s"
                              % (r, c, strides, rule))
    return _describe_fp8("b", _transposed("b", b), hint)


def _scale_facts(name, x):
    """What a scaled op's scale or bias is, checked: (shape, strides in
    bytes, itemsize, dtype code, kind, device, data pointer, writeable), of a
    numpy array, a torch tensor or a __cuda_array_interface__ object of 0 to
    2 dimensions, not empty."""
    shape, strides, item = _geometry(name, x)
    if np is not None and isinstance(x, np.ndarray):
        code, kind, dev = _numpy_dtype_code(x.dtype), "host", None
        ptr, writeable, dn = x.__array_interface__["data"][0], x.flags.writeable, x.dtype
    elif _is_torch(x):
        code = _TORCH_DTYPES.get(str(x.dtype))
        if not x.is_cuda:
            raise InvalidArgument("%s: a CPU tensor; with the host backend pass arrays from "
                                  "Client.empty, with the CUDA backend CUDA tensors" % name)
        kind, dev, ptr, writeable, dn = "cuda", x.get_device(), x.data_ptr(), True, x.dtype
    else:
        cai = x.__cuda_array_interface__
        code, kind, dev, dn = _CAI_TYPESTRS.get(cai["typestr"]), "cuda", None, cai["typestr"]
        ptr, readonly = cai["data"]
        ptr, writeable = _int_arg("%s: data pointer" % name, ptr, 0, _U64_MAX), not readonly
    if code is None:
        raise InvalidArgument("%s: dtype %s; scales are float32, a bias float32, float16 or "
                              "bf16 (the output's)" % (name, dn))
    if len(shape) > 2:
        raise InvalidArgument("%s: %d dimensions; a scale or a bias is a vector: (n,), (n, 1) "
                              "or (1, n) (block scales: a matrix, (rows, blocks of k))"
                              % (name, len(shape)))
    if 0 in shape:
        raise InvalidArgument("%s: empty (shape %s)" % (name, shape))
    return shape, strides, item, code, kind, dev, ptr, writeable


def _describe_vec(name, x, facts=None):
    """A _Mat (one row) for a scaled op's scale or bias: a numpy array, a
    torch tensor or a __cuda_array_interface__ object of 0 to 2 dimensions
    whose elements lie one after the other ((n,), (n, 1), (1, n), ...)."""
    shape, strides, item, code, kind, dev, ptr, writeable = facts or _scale_facts(name, x)
    count, step = 1, item
    for d, st in zip(reversed(shape), reversed(strides)):
        if d > 1 and st != step:
            raise InvalidArgument("%s: shape %s, strides %s bytes: its elements are not one "
                                  "after the other" % (name, shape, strides))
        step *= d
        count *= d
    return _Mat(name, x, ptr, 1, count, 0, item, code, kind, device=dev, writeable=writeable)


def _blocks(x):
    """ceil(x / 128): blocks of a scale block's side (OVL_SCALE_BLOCK)."""
    return -(-x // _lib.SCALE_BLOCK)


def _b_list(b):
    """(whether b is one B, the Bs as a list): 1 to MAX_BS of them."""
    single = not isinstance(b, (list, tuple))
    bs = [b] if single else list(b)
    if not bs:
        raise InvalidArgument("b: an empty list")
    if len(bs) > _lib.MAX_BS:
        raise InvalidArgument("%d Bs given: an op takes at most %d" % (len(bs), _lib.MAX_BS))
    return single, bs


def _scale_fits(shape, rows, kq):
    """The scale modes a scale of this shape fits, for an operand of `rows`
    rows (A: m; B as n x k: n) and kq blocks of 128 of k: tensor (1
    element), row (rows elements), 1x128 (rows x kq; for kq 1, rows
    elements), 128x128 (ceil(rows / 128) x kq)."""
    count = _count(shape)
    fits = set()
    if count == 1:
        fits.add("tensor")
    if count == rows:
        fits.add("row")
    if tuple(shape) == (rows, kq) or (kq == 1 and count == rows):
        fits.add("1x128")
    tile = (_blocks(rows), kq)
    if tuple(shape) == tile or (count == 1 and tile == (1, 1)):
        fits.add("128x128")
    return fits


# The pairs of modes (A's, B's) that a scaled op takes, in the order a shape
# that fits several is read (block scales only where no other pair fits:
# where both do, k is one block and their values mean the same)
_SCALE_PAIRS = (("tensor", "tensor"), ("tensor", "row"), ("row", "tensor"), ("row", "row"),
                ("1x128", "1x128"), ("1x128", "128x128"))
_MODE_NAMES = {v: k for k, v in _lib.SCALE_MODES.items()}
_SCALE_WORDS = {"tensor": "tensor-wise", "row": "row-wise", "1x128": "1x128 block scales",
                "128x128": "128x128 block scales"}


def _scale_modes(sa_shape, sb_shape, m, n, k):
    """(A's mode, B's mode) by name that scales of these shapes are, for A
    m x k and B n x k (ovl_scaling_t's rules, common/scaling.c: block scales
    with block scales, never A by 128x128); InvalidArgument naming the rule
    otherwise."""
    kq = _blocks(k)
    fa, fb = _scale_fits(sa_shape, m, kq), _scale_fits(sb_shape, n, kq)
    for pa, pb in _SCALE_PAIRS:
        if pa in fa and pb in fb:
            return pa, pb
    if fa == {"128x128"}:
        raise InvalidArgument(
            "a_scale: shape %s, A's scales by 128x128 tile (%d x %d for a's m x k = %d x %d): "
            "not taken (ovl cuts A by rows, across ranks and chunks); A takes 1x128, one scale "
            "per row and 128 of k: (%d, %d)" % (tuple(sa_shape), _blocks(m), kq, m, k, m, kq))
    if not fa:
        raise InvalidArgument(
            "a_scale: %d elements fit neither scale mode: 1 (tensor-wise) or %d (row-wise: one "
            "per m, a row, (%d,) or PyTorch's (%d, 1)); nor is its shape %s 1x128 block "
            "scales' (%d, %d): one per row of a and 128 of k" % (
                _count(sa_shape), m, m, m, tuple(sa_shape), m, kq))
    if not fb:
        raise InvalidArgument(
            "b_scale: %d elements fit neither scale mode: 1 (tensor-wise) or %d (row-wise: one "
            "per n, a column of b, (%d,) or PyTorch's (1, %d)); nor is its shape %s block "
            "scales': 1x128 (%d, %d), one per column of b and 128 of k, or 128x128 (%d, %d), "
            "one per 128 x 128 tile of b's n x k" % (
                _count(sb_shape), n, n, n, tuple(sb_shape), n, kq, _blocks(n), kq))
    wa = next(x for x in ("tensor", "row", "1x128", "128x128") if x in fa)
    wb = next(x for x in ("tensor", "row", "1x128", "128x128") if x in fb)
    raise InvalidArgument(
        "a_scale of shape %s (%s) and b_scale of shape %s (%s): block scales (1x128, 128x128) "
        "go with block scales on the other operand: cuBLASLt has no GEMM that mixes them with "
        "tensor or row scales" % (tuple(sa_shape), _SCALE_WORDS[wa], tuple(sb_shape),
                                  _SCALE_WORDS[wb]))


def _count(shape):
    count = 1
    for d in shape:
        count *= d
    return count


def _dense_rows(shape, strides, item):
    """Whether a 2-D geometry is dense row-major (strides of dimensions of
    size 1 aside)."""
    r, c = shape
    return (c <= 1 or strides[1] == item) and (r <= 1 or strides[0] == c * item)


def _on_stream(x, stream, make):
    """make() (a torch op on x) run on the op's stream: torch's current one
    where stream is None, as the op's (_cuda_stream)."""
    torch = sys.modules["torch"]
    if stream is None:
        return make()
    if not isinstance(stream, torch.cuda.Stream):
        ptr = _cuda_stream(stream, ())
        stream = torch.cuda.ExternalStream(ptr, device=x.device) if ptr else \
            torch.cuda.default_stream(x.device)
    with torch.cuda.stream(stream):
        return make()


def _wants_scaled(a, b, a_scale, b_scale, out_dtype, bias, fast_accum, dtype):
    """Whether a call is a scaled op's: an argument only those take, or an
    fp8 A or B (which the unscaled path would refuse)."""
    if any(v is not None for v in (a_scale, b_scale, out_dtype, bias, dtype)):
        return True
    if not (fast_accum is False or fast_accum is None):
        return True
    for x in [a] + (list(b) if isinstance(b, (list, tuple)) else [b]):
        if np is not None and isinstance(x, np.ndarray):
            if x.dtype.name in ("float8_e4m3fn", "float8_e5m2"):
                return True
        elif _is_torch(x) and str(getattr(x, "dtype", "")) in _TORCH_FP8:
            return True
    return False


def _scaled_dtypes(dtype):
    """(A's, B's) fp8 codes that dtype= names (None: from the arrays): one
    name for both, or a pair."""
    if dtype is None:
        return None, None
    pair = list(dtype) if isinstance(dtype, (tuple, list)) else [dtype, dtype]
    codes = [_fp8_code(d) for d in pair] if len(pair) == 2 else [None]
    if None in codes:
        raise InvalidArgument("dtype %r: a scaled op's A and B are fp8e4m3 or fp8e5m2 (one "
                              "name for both, or a pair: (a's, b's))" % (dtype,))
    return codes[0], codes[1]


def _overlaps(p, q):
    return p.ptr < q.ptr + q.nbytes_span and q.ptr < p.ptr + p.nbytes_span


class Client:
    """A connection to ovld (ovl_connect). Use as a context manager or call
    close(). One thread at a time uses libovl's client: calls are
    serialized by a lock here, so that any thread may close a comm or the
    client while others run ops. The ranks of one job on one Client are
    driven from one thread (see Comm._two_threads)."""

    def __init__(self, socket=None, timeout_ms=None):
        self._h = self._conn = None
        self._lib = _lib.lib()
        self._mu = threading.RLock()
        self._allocs = {}  # address -> (bytes, weakref.finalize)
        self._comms = weakref.WeakSet()
        # job -> its open comms of this client, a tuple replaced (under _mu)
        # on every join and close, so that Comm._enter reads it without a
        # lock, while another thread holds _mu
        self._ranks = {}
        if timeout_ms is not None:  # ovl_set_timeout's int
            timeout_ms = _int_arg("timeout_ms", timeout_ms, -_INT_MAX - 1, _INT_MAX)
        path = None
        if socket is not None:
            try:
                path = os.fsencode(socket)
            except TypeError:
                raise InvalidArgument("socket: a path, got %r" % (socket,)) from None
            if b"\0" in path:  # libovl's C string would end there: another socket
                raise InvalidArgument("socket %r: holds a NUL" % (socket,))
        h = ctypes.c_void_p()
        st = self._lib.ovl_connect(path, ctypes.byref(h))
        if st != _lib.OK:
            raise error_for(st, _lib.text(self._lib.ovl_connect_error()))
        # _h: the client's calls, None once closed. _conn: the connection,
        # which holds the memory of empty()'s arrays: it outlives close()
        # while any of them is alive (_host_free disconnects at the last).
        self._h = self._conn = h
        if timeout_ms is not None:
            self._lib.ovl_set_timeout(h, timeout_ms)
        self.socket = socket if socket else default_socket()[0]
        try:
            self._info = self._read_info()
        except BaseException:
            self.close()
            raise
        self._backend = _lib.text(self._info.backend)  # read on every op: decoded once

    # -- plumbing
    def _handle(self):
        if self._h is None:
            raise Closed("the client was closed", -8)
        return self._h

    def _error(self, st):
        return error_for(st, _lib.text(self._lib.ovl_last_error(self._h)) if self._h else "")

    def _read_info(self):
        i = _lib.DaemonInfo()
        st = self._lib.ovl_daemon_info(self._h, ctypes.byref(i))
        if st != _lib.OK:
            raise self._error(st)
        return i

    @property
    def backend(self):
        return self._backend

    # -- the API
    def info(self):
        """What ovld said at the handshake, and this binding's versions."""
        from . import __version__
        i = self._info
        return {
            "version": _lib.text(i.version),
            "protocol_version": i.protocol_version,
            "backend": self.backend,
            "pid": i.pid,
            "ndevices": i.ndevices,
            "socket": self.socket,
            "library": _lib.path(),
            "python_version": __version__,
        }

    def status(self):
        """ovld's status, as `ovlctl status --json` gives it (docs/ovlctl.md):
        version, backend, the kinds of op it runs ("op_kinds"), devices,
        jobs (with each rank's device) and clients; a user other than root
        and ovld's own sees only theirs."""
        return self._json(lambda h, out: self._lib.ovl_status_json(h, out))

    def stats(self, reset=False):
        """ovld's counters, as `ovlctl stats --json` gives them
        (docs/ovlctl.md): "total" since start and "since_reset", each with
        its ops done by kind, algorithm and dtype ("ops"); reset=True also
        zeroes the latter (root or ovld's own user only)."""
        return self._json(lambda h, out: self._lib.ovl_stats_json(h, 1 if reset else 0, out))

    def _json(self, call):
        import json
        out = ctypes.c_void_p()
        with self._mu:
            st = call(self._handle(), ctypes.byref(out))
            if st != _lib.OK:
                raise self._error(st)
        try:
            return json.loads(ctypes.string_at(out.value).decode("utf-8"))
        finally:
            self._lib.ovl_free(out)

    @staticmethod
    def new_job_id(prefix="py"):
        """A fresh job id (give it to every rank of the job)."""
        return "%s-%s" % (prefix, uuid.uuid4().hex)

    def job_id_create(self):
        """The id of a new job across nodes (ovl_job_id_create): 128 bytes
        that this client's ovld made and will coordinate the job with. One
        rank asks, hands the bytes to the others out of band
        (torch.distributed, MPI, a file), and every rank, this one included,
        joins with them: Client.comm(id, world, rank, device). Needs ovld's
        peer_listen (docs/multinode.md): without it, Unsupported."""
        f = _lib.optional(self._lib, "ovl_job_id_create")
        jid = _lib.JobId()
        with self._mu:
            st = f(self._handle(), ctypes.byref(jid))
            if st != _lib.OK:
                raise self._error(st)
        return bytes(jid.bytes)

    def empty(self, shape, dtype="fp32"):
        """An uninitialized numpy array in memory shared with ovld
        (ovl_host_alloc): what the host backend's ops take. bf16 arrays are
        ml_dtypes.bfloat16 if that is importable, else uint16 bits; fp8
        ("fp8e4m3", "fp8e5m2": a scaled op's inputs) ml_dtypes'
        float8_e4m3fn / float8_e5m2, else uint8 codes. The memory
        is freed when the array (and every view of it) is gone; it stays
        readable and writable after close(), which keeps the connection
        (that holds it) open until then."""
        _numpy()
        code = _parse_dtype(dtype, fp8=True)
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shape = (shape,)
        try:
            shape = tuple(_as_int("empty: dimension", s) for s in shape)
        except TypeError:
            raise InvalidArgument("empty: shape %r: an int or a sequence of ints" % (shape,)) \
                from None
        if any(s < 0 for s in shape):
            raise InvalidArgument("empty: negative dimension in %r" % (shape,))
        if self.backend != "host":
            raise Unsupported("empty: ovld runs the %s backend; Client.empty gives host-backend "
                              "memory (on CUDA, allocate with torch.empty(..., device='cuda'))"
                              % self.backend, -16)
        if code in _FP8_NAMES:
            dt = _fp8_numpy_dtype(code)
        else:
            dt = _bf16_numpy_dtype() if code == _lib.DTYPE_BF16 else np.dtype(
                np.float32 if code == _lib.DTYPE_FP32 else np.float16)
        # numpy's own limit (the bytes of the dimensions that are not 0),
        # checked before ovl_host_alloc: its size_t would keep the low bits
        # of a larger size (2**65 + 8 bytes: 8) and allocate that.
        span = dt.itemsize
        for s in shape:
            span *= s or 1
        if span > _SIZE_MAX:
            raise InvalidArgument("empty: %r of %s is %d bytes, more than an array holds (%d)" % (
                shape, _DTYPE_NAMES[code], span, _SIZE_MAX))
        count = 1
        for s in shape:
            count *= s
        size = max(count * dt.itemsize, 1)
        with self._mu:
            h = self._handle()
            ptr = self._lib.ovl_host_alloc(h, size)
            if not ptr:
                msg = _lib.text(self._lib.ovl_last_error(h))
                raise error_for(_status_of_alloc_failure(msg), msg)
            try:
                buf = (ctypes.c_char * size).from_address(ptr)
                self._allocs[ptr] = (size, weakref.finalize(buf, _host_free, self, ptr))
            except BaseException:
                if self._allocs.pop(ptr, None) is None:
                    self._lib.ovl_host_free(h, ptr)
                raise
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def zeros(self, shape, dtype="fp32"):
        a = self.empty(shape, dtype)
        a.view(np.uint8)[...] = 0
        return a

    def _owns(self, m):
        """Whether _Mat m lies inside one allocation of this client."""
        with self._mu:
            for p, (size, _) in self._allocs.items():
                if p <= m.ptr and m.ptr + m.nbytes_span <= p + size:
                    return True
        return False

    def comm(self, job, world, rank, device=0):
        """Joins job `job` as rank `rank` of `world` on device `device`: a
        Comm. job: a name (str, ovl_comm_init: a job of this node's ovld),
        or the 128 bytes of job_id_create (ovl_comm_init_id: a job across
        nodes, joined through this client's ovld)."""
        return Comm(self, job, world, rank, device)

    def close(self):
        """Destroys this client's comms (leaving their jobs) and closes the
        client: later calls raise Closed. The connection to ovld, which
        holds the memory of empty()'s arrays, is closed (ovl_disconnect) now
        or, while any of those arrays is alive, once the last is gone: an
        array is never unmapped under its reader. Safe from another thread
        while ops run: they complete first, or raise Closed."""
        with self._mu:
            if self._h is None:
                return
            for c in list(self._comms):
                try:
                    c.close()
                except Exception:
                    pass
            self._h = None
            if not self._allocs:
                self._disconnect()

    def _disconnect(self):
        h, self._conn = self._conn, None
        if h is not None:
            self._lib.ovl_disconnect(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_h", None) is not None:
                self.close()
        except Exception:
            pass


def _status_of_alloc_failure(msg):
    # ovl_host_alloc returns NULL, not a status: libovl's message (client/
    # libovl.c) tells the family; a refusal from ovld names its limit
    if "needs the host backend" in msg:
        return -16
    if "0 bytes" in msg or "overflows" in msg:
        return -1
    if "limit" in msg or "max_" in msg:
        return -12
    if "mmap" in msg or "sizing" in msg:
        return -2
    return -3


def _host_free(client, ptr):
    """The finalizer of an array's memory: frees it, and after close() the
    last of them closes the connection."""
    with client._mu:
        if client._allocs.pop(ptr, None) is None or client._conn is None:
            return
        client._lib.ovl_host_free(client._conn, ptr)
        if client._h is None and not client._allocs:
            client._disconnect()


class Comm:
    """One rank of a job (ovl_comm_init; ovl_comm_init_id for a job id of
    bytes). Errors of an op surface at the next call that sees them
    (all_gather_matmul, check, synchronize, close), as ovl_comm_check
    reports them; once an op failed, the comm stays failed."""

    def __init__(self, client, job, world, rank, device=0):
        if isinstance(job, (bytes, bytearray)):
            if len(job) != _lib.JOB_ID_BYTES:
                raise InvalidArgument("job: a job id of bytes is the %d bytes of "
                                      "Client.job_id_create, got %d bytes" % (
                                          _lib.JOB_ID_BYTES, len(job)))
            job = bytes(job)
            name = None
        elif not isinstance(job, str) or not job:
            raise InvalidArgument("job: a non-empty string, or the %d bytes of "
                                  "Client.job_id_create" % _lib.JOB_ID_BYTES)
        else:
            name = _job_name(job)
        world, rank = _as_int("world", world), _as_int("rank", rank)
        device = _as_int("device", device)
        # ovl_comm_init takes uint32_t world and rank and an int device:
        # checked here, as ctypes would keep their low bits (2**32 + 1: 1)
        if not 1 <= world <= _U32_MAX or not 0 <= rank < world:
            raise InvalidArgument("rank %d of world %d: world is 1 to 2^32-1, rank 0 to "
                                  "world-1" % (rank, world))
        if not 0 <= device <= _INT_MAX:
            raise InvalidArgument("device %d out of range 0..%d" % (device, _INT_MAX))
        self.client, self.job, self.world, self.rank, self.device = (
            client, job, world, rank, device)
        self._lib = client._lib
        self._h = None
        self._thread = threading.current_thread()  # the thread that joined
        self._busy = []     # threads in a call of this comm (see _enter)
        self._shared = False  # whether the client has another rank of this job
        me = self._thread
        for o in client._ranks.get(job, ()):
            if o._thread is not me and o._thread.is_alive():
                raise self._two_threads(o, "joined by thread %r" % o._thread.name)
        h = ctypes.c_void_p()
        if name is None:  # a job across nodes
            init = _lib.optional(self._lib, "ovl_comm_init_id")
            arg = ctypes.byref(_lib.JobId.from_buffer_copy(job))
        else:
            init, arg = self._lib.ovl_comm_init, name
        with client._mu:
            st = init(client._handle(), arg, world, rank, device, ctypes.byref(h))
            if st != _lib.OK:
                raise client._error(st)
            self._h = h
            self._pending = []  # arrays of async_op ops, kept alive until synchronize()
            # The last CUDA op's arguments (_fast_key) and its checked desc:
            # an op on the same tensors reuses the desc (see _submit_fast).
            self._fast = None
            peers = client._ranks.get(job, ())
            for o in peers:
                o._shared = self._shared = True
            client._ranks[job] = peers + (self,)
            client._comms.add(self)

    def _handle(self):
        if self._h is None:
            raise Closed("the comm was closed", -8)
        return self._h

    # Ranks of one job on one Client (two comms of one client with the same
    # job) are driven from one thread. libovl takes a client's calls one at
    # a time, and an op holds the client until it is done, which needs every
    # rank's part of it: a rank in another thread, waiting for the client,
    # would never send its part, and both would wait until the client's
    # timeout. So a second thread is refused at once: at the join, while the
    # thread that joined another rank of the job runs; at a call, while
    # another thread is in a call of another rank of the job.

    def _two_threads(self, other, what):
        return InvalidArgument(
            "job %r: rank %d of this Client is %s; the ranks of one job on one Client are "
            "driven from one thread (an op holds the Client until every rank sent its part, so "
            "ranks in two threads would wait for each other until the timeout): connect a "
            "Client per thread" % (self.job, other.rank, what))

    def _enter(self):
        """Before a call that may wait on the job's other ranks: marks this
        thread in it, or refuses it (above). True if _leave is owed. Marked
        first, then checked, without a lock: of two threads that enter at
        once, one at least sees the other."""
        if not self._shared:
            return False
        me = threading.current_thread()
        self._busy.append(me)
        for o in self.client._ranks.get(self.job, ()):
            if o is not self and any(t is not me for t in tuple(o._busy)):
                self._busy.remove(me)
                raise self._two_threads(o, "in a call from another thread")
        return True

    def _leave(self):
        self._busy.remove(threading.current_thread())

    def _call(self, fn, *args):
        with self.client._mu:
            st = fn(self._handle(), *args)
            if st != _lib.OK:
                raise self.client._error(st)

    def check(self):
        """Raises the error of the first failed op (ovl_comm_check)."""
        owed = self._enter()
        try:
            self._call(self._lib.ovl_comm_check)
        finally:
            if owed:
                self._leave()

    def synchronize(self):
        """Waits until every op submitted is done, then check()s."""
        owed = self._enter()
        try:
            self._call(self._lib.ovl_comm_synchronize)
            self._pending.clear()
        finally:
            if owed:
                self._leave()

    def close(self):
        """Waits for the ops, leaves the job (ovl_comm_destroy); raises an op's
        error after the comm is gone. Safe from another thread while ops run:
        those complete first, or raise Closed."""
        with self.client._mu:
            if self._h is None:
                return
            h, self._h = self._h, None
            self.client._comms.discard(self)
            peers = tuple(o for o in self.client._ranks.get(self.job, ()) if o is not self)
            if peers:
                self.client._ranks[self.job] = peers
            else:
                self.client._ranks.pop(self.job, None)
            st = self._lib.ovl_comm_destroy(h)  # waits for the ops
            self._pending.clear()
            if st != _lib.OK:
                raise self.client._error(st)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            try:
                self.close()
            except Exception:
                pass  # the exception in flight says more

    def all_gather_matmul(self, a, b, *, out=None, a_out=None, return_a=False, transb=False,
                          algo="auto", chunks=0, streams=0, stream=None, async_op=False,
                          a_scale=None, b_scale=None, out_dtype=None, bias=None,
                          fast_accum=False, dtype=None):
        """C = allgather(a) @ op(b) over the job's ranks (ovl_allgather_gemm).

        a: this rank's m x k shard. b: a k x n matrix (n x k with transb), or
        a list of up to 8 of them, each with its own n, multiplied by the one
        gathered A in one op (then out is a list too). out: (world*m) x n, allocated if None (host: with
        Client.empty; CUDA: torch.empty like a). a_out: the gathered
        (world*m) x k A, allocated if None and return_a. All arguments share
        one dtype (fp32, fp16, bf16). Host backend: returns once C is done
        unless async_op (then comm.synchronize() waits); CUDA: ordered on
        `stream` (None: torch's current stream for torch tensors, else the
        legacy default stream), returns at once.

        Scaled (fp8), as PyTorch's _scaled_mm: a and b fp8 (ml_dtypes' or
        torch's float8_e4m3fn / float8_e5m2, or uint8 codes with dtype=
        "fp8e4m3" / "fp8e5m2", or a pair (a's, b's); not e5m2 twice), b
        k x n column-major (w.T of a row-major n x k w, or w with
        transb=True), a_scale and b_scale float32 (1 element: tensor-wise;
        m, one per row of a, or n, one per column: row-wise; or block scales
        of both, ovl_scale_shape's: a_scale (m, ceil(k/128)), 1x128, with
        b_scale (n, ceil(k/128)), 1x128, or (ceil(n/128), ceil(k/128)),
        128x128; read from the shapes, laid out row-major, copied so where
        they are not), bias None or n
        elements of out_dtype (bf16, fp16 or fp32; default: out's, else
        bf16), fast_accum: cuBLASLt's fast fp8 accumulation. Several Bs (b a
        list): b_scale a list of one per B, bias None or one per B, out None
        or one per B; the Bs share their dtype, the output's and their
        scales' mode.
        out = sa(i) sb(j) sum_l gather(a)[i][l] b[l][j] + bias[j] (block
        scales: summed by 128 of k, each block's sum scaled by its scales);
        with one a_scale, every rank's rows are scaled by this rank's (as
        PyTorch's fused op), row and 1x128 scales are gathered with the
        rows; a_out is fp8 as a (python/README.md, "Scaled ops").

        Returns out, or (out, a_out) if return_a."""
        owed = self._enter()
        try:
            if _wants_scaled(a, b, a_scale, b_scale, out_dtype, bias, fast_accum, dtype):
                return self._scaled_all_gather_matmul(
                    a, b, out, a_out, return_a, transb, algo, chunks, streams, stream, async_op,
                    a_scale, b_scale, out_dtype, bias, fast_accum, dtype)
            return self._all_gather_matmul(a, b, out, a_out, return_a, transb, algo, chunks,
                                           streams, stream, async_op)
        finally:
            if owed:
                self._leave()

    def _all_gather_matmul(self, a, b, out, a_out, return_a, transb, algo, chunks, streams,
                           stream, async_op):
        key = None  # what the fast path compares (torch tensors, out given)
        if out is not None:
            key = _fast_key(a, b, out, a_out, return_a, transb, algo, chunks, streams)
            if key is not None and self._fast is not None and key == self._fast[0]:
                return self._submit_fast(a, b, out, a_out, return_a, stream)
        single, bs = _b_list(b)
        if out is None:
            outs = [None] * len(bs)
        elif single:
            if isinstance(out, (list, tuple)):
                raise InvalidArgument("out: a list for a single b")
            outs = [out]
        else:
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            if len(outs) != len(bs):
                raise InvalidArgument("out: %d outputs for %d Bs" % (len(outs), len(bs)))
        if isinstance(algo, str):
            if algo not in _lib.AG_ALGOS:
                raise InvalidArgument("algo %r: one of %s" % (algo, ", ".join(_lib.AG_ALGOS)))
            algo_code = _lib.ALGOS[algo]
        else:
            raise InvalidArgument("algo: a name (%s), got %r" % (", ".join(_lib.AG_ALGOS), algo))
        for n, v in (("chunks", chunks), ("streams", streams)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32_MAX:
                raise InvalidArgument("%s: an int from 0 (the daemon chooses) to 2^32-1, got %r"
                                      % (n, v))
        self._handle()  # a closed comm says so before the arguments are looked at
        cuda = self.client.backend != "host"

        A = _describe("a", a)
        m, k = A.shape()
        Bs = []
        for i, bi in enumerate(bs):
            B = _describe("b" if single else "b[%d]" % i, bi)
            kb = B.cols if transb else B.rows
            n = B.rows if transb else B.cols
            if kb != k:
                raise InvalidArgument("%s: %d x %d does not fit a's %d columns%s" % (
                    B.name, B.rows, B.cols, k, " (transb: B is n x k)" if transb else ""))
            Bs.append((B, n))
        self._check_in(A, A)  # where the inputs live, before allocating outputs like them
        for B, _ in Bs:
            self._check_in(B, A)
        for i, (B, n) in enumerate(Bs):
            if outs[i] is None:
                outs[i] = self._alloc_like(A, (self.world * m, n))
        Cs = []
        for i, o in enumerate(outs):
            Cs.append(self._check_out(_describe("out" if single else "out[%d]" % i, o),
                                      (self.world * m, Bs[i][1]), A))
        if a_out is None and return_a:
            a_out = self._alloc_like(A, (self.world * m, k))
        AO = None
        if a_out is not None:
            AO = self._check_out(_describe("a_out", a_out), (self.world * m, k), A)
        written = Cs + ([AO] if AO else [])
        for i, w in enumerate(written):
            for r in [A] + [B for B, _ in Bs] + written[i + 1:]:
                if _overlaps(w, r):
                    raise InvalidArgument("%s overlaps %s" % (w.name, r.name))
        if cuda:
            stream_ptr = _cuda_stream(stream, [A] + [B for B, _ in Bs] + written)
        else:
            if stream is not None:
                raise InvalidArgument("stream: the host backend takes no stream (pass None)")
            stream_ptr = None
        with self.client._mu:
            # The handle is read under the client's lock, which close() and
            # Client.close() take: read before it, it could be freed by then.
            h = self._handle()
            st = self._lib.ovl_comm_check(h)  # an earlier op's error first
            if st != _lib.OK:
                raise self.client._error(st)
            # ONE op for every B: A is gathered once (libovl's nb/more_bs),
            # never an op per B.
            (B, n), C = Bs[0], Cs[0]
            more = None
            if len(Bs) > 1:
                more = (_lib.MoreB * (len(Bs) - 1))()
                for i in range(1, len(Bs)):
                    (Bi, ni), Ci = Bs[i], Cs[i]
                    more[i - 1] = _lib.MoreB(b=Bi.ptr, ldb=Bi.ld, c=Ci.ptr, ldc=Ci.ld, n=ni)
            d = _lib.AgGemmDesc(
                a=A.ptr, lda=A.ld, b=B.ptr, ldb=B.ld, transb=1 if transb else 0,
                c=C.ptr, ldc=C.ld, a_out=AO.ptr if AO else None, lda_out=AO.ld if AO else 0,
                m=m, n=n, k=k, dtype=A.dtype, algo=algo_code, chunks=chunks, streams=streams,
                nb=len(Bs), more_bs=more)
            st = self._lib.ovl_allgather_gemm(h, ctypes.byref(d), stream_ptr)
            if st != _lib.OK:
                raise self.client._error(st)
            if not cuda and not async_op:
                st = self._lib.ovl_comm_synchronize(h)
                if st != _lib.OK:
                    raise self.client._error(st)
                self._pending.clear()
            elif not cuda:
                # the host memory must outlive the op, even if the caller
                # drops its arrays (CUDA: the stream orders their reuse)
                self._pending.append((a, bs, outs, a_out))
            self._fast = None
            if cuda and key is not None:
                # Checked and sent: the next op on the same tensors (same
                # pointers, shapes, strides and dtypes, which are all the
                # desc and every check above depend on) reuses this desc.
                self._fast = (key, d, more)
        res = outs[0] if single else outs
        return (res, a_out) if return_a else res

    def matmul_reduce_scatter(self, a, b, *, reduce_op="sum", out=None, transb=False,
                              algo="auto", chunks=0, streams=0, stream=None, async_op=False,
                              a_scale=None, b_scale=None, out_dtype=None, bias=None,
                              fast_accum=False, dtype=None):
        """GEMM + reduce-scatter over the job's ranks (ovl_gemm_reduce_scatter):
        out = rows [rank*M/world, (rank+1)*M/world) of the sum over the ranks
        of a @ op(b) (reduce_op "avg": of that sum divided by the world).

        a: this rank's M x k (its share k of the inner dimension; M a
        multiple of the world). b: k x n (n x k with transb). out: (M/world)
        x n, allocated if None as all_gather_matmul's. algo: "auto",
        "naive", "collective", "ring" or "push" (docs/plans.md; where ranks
        share a GPU, ring or push). Sums are taken in fp32; naive, collective
        and push round every rank's partial product to the dtype once, ring
        rounds the partial at each of its world - 1 hops (docs/plans.md,
        "Numbers"). Stream and async_op as all_gather_matmul's.

        Scaled (fp8): a_scale, b_scale, out_dtype, bias, fast_accum and
        dtype as all_gather_matmul's, a_scale of 1 or M elements (this
        rank's A's rows) or (M, ceil(k/128)) block scales (M / world in
        fours); each rank's product is scaled and gets its bias
        before the sum (avg: divided by the world), as PyTorch's fused
        scaled op; the sum is in out_dtype's fp32, never fp8.

        Returns out."""
        owed = self._enter()
        try:
            if _wants_scaled(a, b, a_scale, b_scale, out_dtype, bias, fast_accum, dtype):
                return self._scaled_matmul_reduce_scatter(
                    a, b, reduce_op, out, transb, algo, chunks, streams, stream, async_op,
                    a_scale, b_scale, out_dtype, bias, fast_accum, dtype)
            return self._matmul_reduce_scatter(a, b, reduce_op, out, transb, algo, chunks,
                                               streams, stream, async_op)
        finally:
            if owed:
                self._leave()

    def _matmul_reduce_scatter(self, a, b, reduce_op, out, transb, algo, chunks, streams, stream,
                               async_op):
        if not isinstance(reduce_op, str) or reduce_op not in _lib.REDUCE_OPS:
            raise InvalidArgument("reduce_op %r: one of %s" % (reduce_op,
                                                                ", ".join(_lib.REDUCE_OPS)))
        if not isinstance(algo, str) or algo not in _lib.RS_ALGOS:
            raise InvalidArgument("algo %r: one of %s (GEMM + reduce-scatter's)"
                                  % (algo, ", ".join(_lib.RS_ALGOS)))
        for n, v in (("chunks", chunks), ("streams", streams)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32_MAX:
                raise InvalidArgument("%s: an int from 0 (the daemon chooses) to 2^32-1, got %r"
                                      % (n, v))
        self._handle()  # a closed comm says so before the arguments are looked at
        cuda = self.client.backend != "host"
        A = _describe("a", a)
        m, k = A.shape()
        if m % self.world:
            raise InvalidArgument("a: %d rows are not a multiple of the world %d: each rank "
                                  "keeps rows / world rows of the sum" % (m, self.world))
        B = _describe("b", b)
        kb = B.cols if transb else B.rows
        n = B.rows if transb else B.cols
        if kb != k:
            raise InvalidArgument("b: %d x %d does not fit a's %d columns%s" % (
                B.rows, B.cols, k, " (transb: B is n x k)" if transb else ""))
        self._check_in(A, A)
        self._check_in(B, A)
        if out is None:
            out = self._alloc_like(A, (m // self.world, n))
        C = self._check_out(_describe("out", out), (m // self.world, n), A)
        for r in (A, B):
            if _overlaps(C, r):
                raise InvalidArgument("%s overlaps %s" % (C.name, r.name))
        if cuda:
            stream_ptr = _cuda_stream(stream, [A, B, C])
        else:
            if stream is not None:
                raise InvalidArgument("stream: the host backend takes no stream (pass None)")
            stream_ptr = None
        with self.client._mu:
            h = self._handle()
            st = self._lib.ovl_comm_check(h)  # an earlier op's error first
            if st != _lib.OK:
                raise self.client._error(st)
            d = _lib.GemmRsDesc(
                a=A.ptr, lda=A.ld, b=B.ptr, ldb=B.ld, transb=1 if transb else 0, c=C.ptr,
                ldc=C.ld, m=m, n=n, k=k, dtype=A.dtype, reduce_op=_lib.REDUCE_OPS[reduce_op],
                algo=_lib.ALGOS[algo], chunks=chunks, streams=streams)
            st = self._lib.ovl_gemm_reduce_scatter(h, ctypes.byref(d), stream_ptr)
            if st != _lib.OK:
                raise self.client._error(st)
            if not cuda and not async_op:
                st = self._lib.ovl_comm_synchronize(h)
                if st != _lib.OK:
                    raise self.client._error(st)
                self._pending.clear()
            elif not cuda:
                self._pending.append((a, b, out))
            self._fast = None  # the all-gather fast path's desc is not this op's
        return out

    # -- scaled (fp8) ops: every argument checked before anything is sent

    def _scaled_inputs(self, a, b, transb, dtype, a_scale, b_scale, out_dtype, bias,
                       fast_accum, out, gemm_rows, stream, memo=None):
        """A scaled op's inputs, checked: (A, B as n x k, out dtype code,
        (a_scale, its mode), (b_scale, its mode), bias or None, fast).
        gemm_rows(m): (the rows of each GEMM of A's m, in words), which A's
        1x128 scales need in fours, or None where the op refuses m anyway;
        stream: the op's (a copy of a torch block scale runs on it); memo: a
        dict that keeps A's scales' _Mat by mode for the next B's call."""
        if not isinstance(fast_accum, bool):
            raise InvalidArgument("fast_accum: True or False, got %r" % (fast_accum,))
        ha, hb = _scaled_dtypes(dtype)
        A = _describe_fp8("a", a, ha)
        m, k = A.shape()
        B = _scaled_b(b, transb, hb)
        n, kb = B.shape()
        if kb != k:
            raise InvalidArgument("b: k x n = %d x %d does not fit a's %d columns" % (kb, n, k))
        if A.dtype == _FP8_E5M2 and B.dtype == _FP8_E5M2:
            raise InvalidArgument("a and b both fp8e5m2: cuBLASLt has no such fp8 GEMM (one of "
                                  "them must be fp8e4m3)")
        if out_dtype is None:
            code_out = _lib.DTYPE_BF16
            if out is not None:  # out's own dtype, where it is one a scaled op writes
                try:
                    code_out = _describe("out", out).dtype
                except InvalidArgument:
                    pass
        else:
            if _fp8_code(out_dtype) is not None:
                raise InvalidArgument("out_dtype %s: a scaled op writes bf16, fp16 or fp32, "
                                      "never fp8 (an fp8 output and its result_scale are "
                                      "PyTorch's)" % (out_dtype,))
            try:
                code_out = _parse_dtype(out_dtype)
            except InvalidArgument:
                raise InvalidArgument("out_dtype %r: a scaled op writes bf16, fp16 or fp32"
                                      % (out_dtype,)) from None
        missing = [nm for nm, v in (("a_scale", a_scale), ("b_scale", b_scale)) if v is None]
        if missing:
            raise InvalidArgument("%s missing: a scaled op takes a_scale and b_scale, float32, "
                                  "1 element (tensor-wise), one per row of a / column of b "
                                  "(row-wise) or block scales of both (1x128; B's also 128x128)"
                                  % " and ".join(missing))
        FA = _scale_facts("a_scale", a_scale)
        FB = _scale_facts("b_scale", b_scale)
        for nm, F in (("a_scale", FA), ("b_scale", FB)):
            if F[3] != _lib.DTYPE_FP32:
                raise InvalidArgument("%s: dtype %s; scales are float32" % (
                    nm, _DTYPE_NAMES[F[3]]))
        am, bm = _scale_modes(FA[0], FB[0], m, n, k)
        rows = gemm_rows(m) if am == "1x128" else None
        if rows is not None and rows[0] % 4:
            raise InvalidArgument("a_scale: 1x128 (%d, %d): A's 1x128 scales need its rows in "
                                  "multiples of 4 (cuBLASLt lays each 128 of k's scales out by "
                                  "rows, 16-byte aligned): %s" % (m, _blocks(k), rows[1]))
        if bm == "1x128" and n % 4:
            raise InvalidArgument("b_scale: 1x128 (%d, %d): B's 1x128 scales need n in "
                                  "multiples of 4 (cuBLASLt lays each 128 of k's scales out by "
                                  "columns of op(B), 16-byte aligned): n = %d" % (
                                      n, _blocks(k), n))
        SA = memo.get(am) if memo is not None else None
        if SA is None:
            SA = self._scale_mat("a_scale", a_scale, FA, am, m, k, stream)
            if memo is not None:
                memo[am] = SA
        SB = self._scale_mat("b_scale", b_scale, FB, bm, n, k, stream)
        BI = None
        if bias is not None:
            BI = _describe_vec("bias", bias)
            if BI.dtype != code_out:
                raise InvalidArgument("bias: dtype %s, the output's is %s (a bias is of the "
                                      "output's dtype, out_dtype)" % (
                                          _DTYPE_NAMES[BI.dtype], _DTYPE_NAMES[code_out]))
            if BI.cols != n:
                raise InvalidArgument("bias: %d elements, b has %d columns (one per column)"
                                      % (BI.cols, n))
        for x in (A, B, SA, SB) + ((BI,) if BI else ()):
            self._check_place(x)
        return (A, B, code_out, (SA, _lib.SCALE_MODES[am]), (SB, _lib.SCALE_MODES[bm]), BI,
                fast_accum)

    def _scale_mat(self, name, x, facts, mode, rows, k, stream):
        """A scale of a mode (by name) as libovl takes it: tensor and row
        scales their elements one after the other (_describe_vec); block
        scales ovl_scale_shape's dense row-major matrix (rows of the operand:
        A's m, B's n), x itself where it is laid out so, else a copy: a
        numpy array of this client's memory into another of it, a torch
        tensor .contiguous() on the op's stream (a __cuda_array_interface__
        object is not copied: refused)."""
        shape, strides, item, code, kind, dev, ptr, writeable = facts
        if mode in ("tensor", "row"):
            return _describe_vec(name, x, facts)
        r, c = (rows, _blocks(k)) if mode == "1x128" else (_blocks(rows), _blocks(k))
        if len(shape) != 2 or tuple(shape) != (r, c):  # a vector where k is one block
            return _describe_vec(name, x, facts)
        if _dense_rows(shape, strides, item):
            return _Mat(name, x, ptr, r, c, strides[0] if r > 1 else c * item, item, code, kind,
                        device=dev, writeable=writeable)
        # torch._scaled_mm's scale_b of 128x128 is (ceil(K/128), ceil(N/128))
        # column-major: where the two are equal its shape is ovl's, and read
        # as ovl's it would be transposed; refused rather than guessed
        if (name.startswith("b_scale") and mode == "128x128" and r == c and r > 1
                and strides[0] == item and strides[1] == r * item):
            raise InvalidArgument("%s: a square (%d, %d) 128x128 scale laid out column-major, as "
                                  "torch._scaled_mm's scale_b is (rows over k): ovl reads B's "
                                  "block scales as a dense row-major (ceil(n/128), ceil(k/128)) "
                                  "matrix, rows over n: pass scale_b.t().contiguous()"
                                  % (name, r, c))
        # where the elements lie, lowest to highest byte: the place x must be
        lo = sum(min(0, (d - 1) * st) for d, st in zip(shape, strides))
        hi = sum(max(0, (d - 1) * st) for d, st in zip(shape, strides)) + item
        self._check_place(_Mat(name, x, ptr + lo, 1, hi - lo, 0, 1, code, kind, device=dev))
        if kind == "host":
            y = self.client.empty((r, c), "fp32")
            y[...] = x
        elif _is_torch(x):
            y = _on_stream(x, stream, x.contiguous)
        else:
            raise InvalidArgument("%s: shape %s, strides %s bytes: not dense row-major; block "
                                  "scales are a dense row-major (%d, %d) matrix (numpy arrays "
                                  "and torch tensors are copied so, __cuda_array_interface__ "
                                  "objects are not)" % (name, tuple(shape), strides, r, c))
        return _describe_vec(name, y)

    def _alloc_code(self, A, shape, code):
        """A new output of dtype code, where A lives (as _alloc_like)."""
        if A.kind == "host":
            return self.client.empty(shape, _FP8_NAMES.get(code) or _DTYPE_NAMES[code])
        if _is_torch(A.obj):
            torch = sys.modules["torch"]
            return torch.empty(shape, dtype=getattr(torch, _TORCH_OF_CODE[code]),
                               device=A.obj.device)
        raise InvalidArgument("out: needed for __cuda_array_interface__ inputs (only torch "
                              "tensors get theirs allocated)")

    def _scaled_out(self, name, x, shape, code):
        """out (or a_out) of a scaled op, checked: shape, writable, dtype, place."""
        C = _describe_fp8(name, x, code) if code in _FP8_NAMES else _describe(name, x)
        if C.shape() != shape:
            raise InvalidArgument("%s: %d x %d, expected %d x %d" % (
                name, C.rows, C.cols, shape[0], shape[1]))
        if not C.writeable:
            raise InvalidArgument("%s: read-only" % name)
        if C.dtype != code:
            raise InvalidArgument("%s: dtype %s, out_dtype %s" % (
                name, _DTYPE_NAMES[C.dtype], _DTYPE_NAMES[code]))
        self._check_place(C)
        return C

    @staticmethod
    def _scaling(B, code_out, sa, sb, BI, fast):
        return _lib.Scaling(b_dtype=B.dtype, out_dtype=code_out, a_mode=sa[1], b_mode=sb[1],
                            a_scale=sa[0].ptr, b_scale=sb[0].ptr,
                            bias=BI.ptr if BI is not None else None,
                            fast_accum=1 if fast else 0)

    @staticmethod
    def _no_overlap(written, read):
        for i, w in enumerate(written):
            for r in list(read) + written[i + 1:]:
                if _overlaps(w, r):
                    raise InvalidArgument("%s overlaps %s" % (w.name, r.name))

    def _submit(self, call, d, stream_ptr, cuda, async_op, keep):
        """Sends a checked op (call: ovl_allgather_gemm or
        ovl_gemm_reduce_scatter); host: waits unless async_op."""
        with self.client._mu:
            h = self._handle()
            st = self._lib.ovl_comm_check(h)  # an earlier op's error first
            if st != _lib.OK:
                raise self.client._error(st)
            st = call(h, ctypes.byref(d), stream_ptr)
            if st != _lib.OK:
                raise self.client._error(st)
            if not cuda and not async_op:
                st = self._lib.ovl_comm_synchronize(h)
                if st != _lib.OK:
                    raise self.client._error(st)
                self._pending.clear()
            elif not cuda:
                self._pending.append(keep)
            self._fast = None  # the all-gather fast path's desc is not this op's

    @staticmethod
    def _check_opts(algo, algos, chunks, streams):
        if not isinstance(algo, str) or algo not in algos:
            raise InvalidArgument("algo %r: one of %s" % (algo, ", ".join(algos)))
        for n, v in (("chunks", chunks), ("streams", streams)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _U32_MAX:
                raise InvalidArgument("%s: an int from 0 (the daemon chooses) to 2^32-1, got %r"
                                      % (n, v))

    def _stream_for(self, stream, mats, cuda):
        if cuda:
            return _cuda_stream(stream, mats)
        if stream is not None:
            raise InvalidArgument("stream: the host backend takes no stream (pass None)")
        return None

    def _scaled_all_gather_matmul(self, a, b, out, a_out, return_a, transb, algo, chunks,
                                  streams, stream, async_op, a_scale, b_scale, out_dtype, bias,
                                  fast_accum, dtype):
        single, bs = _b_list(b)
        # several Bs: b_scale, bias and out are lists of one per B (bias: all
        # None, or one for every B: ovld takes a bias on every B or on none)
        def per_b(name, v, may_be_none):
            if single:
                if isinstance(v, (list, tuple)):
                    raise InvalidArgument("%s: a list for a single b" % name)
                return [v]
            if v is None and may_be_none:
                return [None] * len(bs)
            if not isinstance(v, (list, tuple)) or len(v) != len(bs):
                raise InvalidArgument("%s: a list of %d, one per B" % (name, len(bs)))
            return list(v)
        sbs = per_b("b_scale", b_scale, False)
        biases = per_b("bias", bias, True)
        outs = per_b("out", out, True)
        if not single and any(x is None for x in biases) and any(x is not None for x in biases):
            raise InvalidArgument("bias: given for some Bs only; a scaled op's Bs have a bias "
                                  "each, or none")
        self._check_opts(algo, _lib.AG_ALGOS, chunks, streams)
        self._handle()  # a closed comm says so before the arguments are looked at
        cuda = self.client.backend != "host"

        def gemm_rows(m):  # each GEMM's rows: a rank's A (the gathered A by blocks of m)
            return m, "this rank's m = %d rows" % m
        memo = {}  # A's scales, read (and copied where they need it) once for every B
        per = [self._scaled_inputs(a, bi, transb, dtype, a_scale, sbi, out_dtype, biasi,
                                   fast_accum, oi, gemm_rows, stream, memo)
               for bi, sbi, biasi, oi in zip(bs, sbs, biases, outs)]
        A, B0, code_out, sa, sb0, _, fast = per[0]
        for i, (_, Bi, code_i, sai, sbi, _, _) in enumerate(per[1:], 1):
            # what the Bs of one op share (ovl_scaling_t): B's dtype, the output's, the modes
            if Bi.dtype != B0.dtype or code_i != code_out or sbi[1] != sb0[1]:
                raise InvalidArgument("b[%d]: its dtype, the output's dtype and its scales' mode "
                                      "must be b[0]'s (one scaled op shares them)" % i)
            if sai[1] != sa[1]:
                raise InvalidArgument("b[%d]: a_scale reads as %s with its b_scale, as %s with "
                                      "b[0]'s (one scaled op has one mode for A)" % (
                                          i, _MODE_NAMES[sai[1]], _MODE_NAMES[sa[1]]))
        m, k = A.shape()
        rows = self.world * m
        Cs, written, read = [], [], [A, sa[0]]
        for i, (_, Bi, _, _, sbi, BIi, _) in enumerate(per):
            n = Bi.rows
            if outs[i] is None:
                outs[i] = self._alloc_code(A, (rows, n), code_out)
            Cs.append(self._scaled_out("out" if single else "out[%d]" % i, outs[i], (rows, n),
                                       code_out))
            read += [Bi, sbi[0]] + ([BIi] if BIi else [])
        written += Cs
        if a_out is None and return_a:
            a_out = self._alloc_code(A, (rows, k), A.dtype)
            if np is not None and isinstance(a, np.ndarray) and a.dtype == np.uint8:
                a_out = a_out.view(np.uint8)  # codes, as a is given
        AO = self._scaled_out("a_out", a_out, (rows, k), A.dtype) if a_out is not None else None
        written += [AO] if AO else []
        self._no_overlap(written, read)
        stream_ptr = self._stream_for(stream, read + written, cuda)
        sc = self._scaling(B0, code_out, sa, sb0, per[0][5], fast)
        more = (_lib.MoreB * max(1, len(bs) - 1))()
        for i in range(1, len(bs)):
            Bi, sbi, BIi = per[i][1], per[i][4], per[i][5]
            more[i - 1] = _lib.MoreB(b=Bi.ptr, ldb=Bi.ld, c=Cs[i].ptr, ldc=Cs[i].ld, n=Bi.rows,
                                     b_scale=sbi[0].ptr, bias=BIi.ptr if BIi else None)
        d = _lib.AgGemmDesc(
            a=A.ptr, lda=A.ld, b=B0.ptr, ldb=B0.ld, transb=1, c=Cs[0].ptr, ldc=Cs[0].ld,
            a_out=AO.ptr if AO else None, lda_out=AO.ld if AO else 0, m=m, n=B0.rows, k=k,
            dtype=A.dtype, algo=_lib.ALGOS[algo], chunks=chunks, streams=streams, nb=len(bs),
            more_bs=ctypes.cast(more, ctypes.POINTER(_lib.MoreB)) if len(bs) > 1 else None,
            scaling=ctypes.addressof(sc))
        # (the scales' objects: copies of block scales among them)
        self._submit(self._lib.ovl_allgather_gemm, d, stream_ptr, cuda, async_op,
                     (a, b, outs, a_out, a_scale, b_scale, bias, more,
                      [x[0].obj for p in per for x in (p[3], p[4])]))
        res = outs[0] if single else outs
        return (res, a_out) if return_a else res

    def _scaled_matmul_reduce_scatter(self, a, b, reduce_op, out, transb, algo, chunks, streams,
                                      stream, async_op, a_scale, b_scale, out_dtype, bias,
                                      fast_accum, dtype):
        if not isinstance(reduce_op, str) or reduce_op not in _lib.REDUCE_OPS:
            raise InvalidArgument("reduce_op %r: one of %s" % (reduce_op,
                                                                ", ".join(_lib.REDUCE_OPS)))
        self._check_opts(algo, _lib.RS_ALGOS, chunks, streams)
        self._handle()
        cuda = self.client.backend != "host"
        world = self.world

        def gemm_rows(m):  # each GEMM's rows: a block of the output's (None: refused below)
            if m % world:
                return None
            return m // world, "each rank's block of the output, M / world = %d / %d = %d " \
                "rows" % (m, world, m // world)
        A, B, code_out, sa, sb, BI, fast = self._scaled_inputs(
            a, b, transb, dtype, a_scale, b_scale, out_dtype, bias, fast_accum, out, gemm_rows,
            stream)
        m, k = A.shape()
        n = B.rows
        if m % self.world:
            raise InvalidArgument("a: %d rows are not a multiple of the world %d: each rank "
                                  "keeps rows / world rows of the sum" % (m, self.world))
        if BI is not None and reduce_op == "avg" and algo == "ring" and self.world > 1:
            # ovld's planner refuses it, which would fail the comm
            raise InvalidArgument("algo ring with a bias and avg: ring adds each rank's bias at "
                                  "its GEMM, which avg does not divide (auto, naive, collective "
                                  "or push take it)")
        if out is None:
            out = self._alloc_code(A, (m // self.world, n), code_out)
        C = self._scaled_out("out", out, (m // self.world, n), code_out)
        read = [A, B, sa[0], sb[0]] + ([BI] if BI else [])
        self._no_overlap([C], read)
        stream_ptr = self._stream_for(stream, read + [C], cuda)
        sc = self._scaling(B, code_out, sa, sb, BI, fast)
        d = _lib.GemmRsDesc(
            a=A.ptr, lda=A.ld, b=B.ptr, ldb=B.ld, transb=1, c=C.ptr, ldc=C.ld, m=m, n=n, k=k,
            dtype=A.dtype, reduce_op=_lib.REDUCE_OPS[reduce_op], algo=_lib.ALGOS[algo],
            chunks=chunks, streams=streams, scaling=ctypes.addressof(sc))
        self._submit(self._lib.ovl_gemm_reduce_scatter, d, stream_ptr, cuda, async_op,
                     (a, b, out, a_scale, b_scale, bias, sa[0].obj, sb[0].obj))
        return out

    def _submit_fast(self, a, b, out, a_out, return_a, stream):
        """all_gather_matmul on the tensors of the last op: its desc again.
        What varies between such calls is the stream only."""
        d = self._fast[1]
        if stream is None:
            torch = sys.modules["torch"]
            sp = torch.cuda.current_stream(a.device).cuda_stream or None
        else:
            sp = _cuda_stream(stream, ())
        with self.client._mu:
            h = self._handle()
            st = self._lib.ovl_comm_check(h)  # an earlier op's error first
            if st != _lib.OK:
                raise self.client._error(st)
            st = self._lib.ovl_allgather_gemm(h, ctypes.byref(d), sp)
            if st != _lib.OK:
                raise self.client._error(st)
        res = list(out) if isinstance(b, (list, tuple)) else out
        return (res, a_out) if return_a else res

    def _check_in(self, x, a):
        if x.dtype != a.dtype:
            raise InvalidArgument("%s: dtype %s, a's is %s" % (
                x.name, _DTYPE_NAMES[x.dtype], _DTYPE_NAMES[a.dtype]))
        self._check_place(x)

    def _check_out(self, x, shape, a):
        if x.shape() != shape:
            raise InvalidArgument("%s: %d x %d, expected %d x %d (world %d x m, ...)" % (
                x.name, x.rows, x.cols, shape[0], shape[1], self.world))
        if not x.writeable:
            raise InvalidArgument("%s: read-only" % x.name)
        self._check_in(x, a)
        return x

    def _check_place(self, x):
        if self.client.backend == "host":
            if x.kind != "host":
                raise InvalidArgument("%s: a CUDA array, but ovld runs the host backend" % x.name)
            if not self.client._owns(x):
                raise InvalidArgument("%s: not in memory from this client's Client.empty (the "
                                      "host backend reads and writes only memory shared with "
                                      "ovld)" % x.name)
        else:
            if x.kind != "cuda":
                raise InvalidArgument("%s: host memory, but ovld runs the %s backend: pass CUDA "
                                      "tensors" % (x.name, self.client.backend))
            if x.device is not None and x.device != self.device:
                raise InvalidArgument("%s: on CUDA device %d, the comm's is %d" % (
                    x.name, x.device, self.device))

    def _alloc_like(self, A, shape):
        if A.kind == "host":
            dt = {_lib.DTYPE_FP32: "fp32", _lib.DTYPE_FP16: "fp16", _lib.DTYPE_BF16: "bf16"}
            return self.client.empty(shape, dt[A.dtype])
        if type(A.obj).__module__.split(".")[0] == "torch":
            torch = sys.modules["torch"]
            return torch.empty(shape, dtype=A.obj.dtype, device=A.obj.device)
        raise InvalidArgument("out: needed for __cuda_array_interface__ inputs (only torch "
                              "tensors get theirs allocated)")


def _fast_key(a, b, out, a_out, return_a, transb, algo, chunks, streams):
    """What an op on torch tensors depends on, as a comparable tuple: each
    tensor's data pointer, shape, strides and dtype, and the op's options;
    None where an argument is not a torch tensor (or a_out is to be
    allocated), which never takes the fast path."""
    try:
        if isinstance(b, (list, tuple)):
            if not isinstance(out, (list, tuple)) or len(out) != len(b):
                return None
            bk = tuple((x.data_ptr(), x.shape, x.stride(), x.dtype) for x in b)
            ok = tuple((x.data_ptr(), x.shape, x.stride(), x.dtype) for x in out)
        else:
            bk = (b.data_ptr(), b.shape, b.stride(), b.dtype)
            ok = (out.data_ptr(), out.shape, out.stride(), out.dtype)
        if a_out is None:
            if return_a:
                return None
            ak = None
        else:
            ak = (a_out.data_ptr(), a_out.shape, a_out.stride(), a_out.dtype)
        return ((a.data_ptr(), a.shape, a.stride(), a.dtype), bk, ok, ak, bool(transb), algo,
                chunks, streams)
    except (AttributeError, TypeError):
        return None


def _cuda_stream(stream, mats):
    """The cudaStream_t (an int, or None for the legacy default stream)."""
    if stream is None:
        torch_mats = [x for x in mats if type(x.obj).__module__.split(".")[0] == "torch"]
        if torch_mats:
            torch = sys.modules["torch"]
            return torch.cuda.current_stream(torch_mats[0].obj.device).cuda_stream or None
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return _int_arg("stream", stream, 0, _U64_MAX) or None
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy, cuda-python
        v = getattr(stream, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return _int_arg("stream.%s" % attr, v, 0, _U64_MAX) or None
    raise InvalidArgument("stream: an int (cudaStream_t), a torch.cuda.Stream or an object "
                          "with .ptr, got %r" % (stream,))


def default_socket():
    """(path, rule name) that ovl.connect(None) would use (ovl_default_socket)."""
    lib = _lib.lib()
    buf = ctypes.create_string_buffer(4096)
    rule = ctypes.c_int()
    st = lib.ovl_default_socket(buf, len(buf), ctypes.byref(rule))
    if st != _lib.OK:
        raise error_for(st, "ovl_default_socket failed")
    return _lib.text(buf.value), _lib.text(lib.ovl_socket_rule_name(rule.value))


def connect(socket=None, timeout_ms=None):
    """Connects to ovld: socket None means libovl's default rule
    (ovl_default_socket: $OVL_SOCKET, the per-user sockets, /run/ovl/ovld.sock)."""
    return Client(socket, timeout_ms)
