"""Loading libovl and declaring the C functions of include/ovl/ovl.h.

libovl is found as nccl4py finds libnccl: $OVL_LIBRARY if set (a path to
the library), else a libovl.so.1 or libovl.so next to this package, else
the system's (the dynamic loader's search for the soname libovl.so.1, then
ctypes.util.find_library("ovl")).
"""
import ctypes
import ctypes.util
import os
import threading

SONAME = "libovl.so.1"

# ovl_status_t (include/ovl/ovl.h)
OK = 0

# ovl_dtype_t
DTYPE_BF16, DTYPE_FP16, DTYPE_FP32 = 0, 1, 2
DTYPE_FP8_E4M3, DTYPE_FP8_E5M2 = 3, 4  # a scaled op's inputs (Scaling)
# ovl_scale_mode_t: block scales (1x128, 128x128) are dense row-major fp32
# matrices (ovl_scale_shape), one per SCALE_BLOCK of k
SCALE_MODES = {"tensor": 0, "row": 1, "1x128": 2, "128x128": 3}
SCALE_BLOCK = 128
# ovl_algo_t
ALGOS = {"auto": 0, "naive": 1, "collective": 2, "ring": 3, "push": 4}
# Each kind's algorithms (ovl_op_kind_takes_algo): push is GEMM +
# reduce-scatter's only.
AG_ALGOS = ("auto", "naive", "collective", "ring")
RS_ALGOS = ("auto", "naive", "collective", "ring", "push")
# How GEMM + reduce-scatter combines the ranks' products (ovl_reduce_op_t).
REDUCE_OPS = {"sum": 0, "avg": 1}


class DaemonInfo(ctypes.Structure):
    """ovl_daemon_info_t."""
    _fields_ = [
        ("protocol_version", ctypes.c_uint32),
        ("version", ctypes.c_char * 32),
        ("backend", ctypes.c_char * 16),
        ("pid", ctypes.c_int32),
        ("ndevices", ctypes.c_uint32),
    ]


class MoreB(ctypes.Structure):
    """ovl_ag_gemm_b_t: B i (i >= 1) of an op and its output (and a scaled
    op's B i's scales and bias)."""
    _fields_ = [
        ("b", ctypes.c_void_p),
        ("ldb", ctypes.c_size_t),
        ("c", ctypes.c_void_p),
        ("ldc", ctypes.c_size_t),
        ("n", ctypes.c_uint64),
        ("b_scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
    ]


class AgGemmDesc(ctypes.Structure):
    """ovl_ag_gemm_desc_t: one op; B 0 in b/ldb/c/ldc/n, Bs 1.. in more_bs
    (nb of them in all, 0 or 1 meaning one)."""
    _fields_ = [
        ("a", ctypes.c_void_p),
        ("lda", ctypes.c_size_t),
        ("b", ctypes.c_void_p),
        ("ldb", ctypes.c_size_t),
        ("transb", ctypes.c_int),
        ("c", ctypes.c_void_p),
        ("ldc", ctypes.c_size_t),
        ("a_out", ctypes.c_void_p),
        ("lda_out", ctypes.c_size_t),
        ("m", ctypes.c_uint64),
        ("n", ctypes.c_uint64),
        ("k", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("algo", ctypes.c_int),
        ("chunks", ctypes.c_uint32),
        ("streams", ctypes.c_uint32),
        ("nb", ctypes.c_uint32),
        ("more_bs", ctypes.POINTER(MoreB)),
        ("scaling", ctypes.c_void_p),  # a Scaling*, NULL: not scaled
    ]


class GemmRsDesc(ctypes.Structure):
    """ovl_gemm_rs_desc_t: one GEMM + reduce-scatter."""
    _fields_ = [
        ("a", ctypes.c_void_p),
        ("lda", ctypes.c_size_t),
        ("b", ctypes.c_void_p),
        ("ldb", ctypes.c_size_t),
        ("transb", ctypes.c_int),
        ("c", ctypes.c_void_p),
        ("ldc", ctypes.c_size_t),
        ("m", ctypes.c_uint64),
        ("n", ctypes.c_uint64),
        ("k", ctypes.c_uint64),
        ("dtype", ctypes.c_int),
        ("reduce_op", ctypes.c_int),
        ("algo", ctypes.c_int),
        ("chunks", ctypes.c_uint32),
        ("streams", ctypes.c_uint32),
        ("scaling", ctypes.c_void_p),  # a Scaling*, NULL: not scaled
    ]


class Scaling(ctypes.Structure):
    """ovl_scaling_t: what makes an op scaled (fp8)."""
    _fields_ = [
        ("b_dtype", ctypes.c_int),
        ("out_dtype", ctypes.c_int),
        ("a_mode", ctypes.c_int),
        ("b_mode", ctypes.c_int),
        ("a_scale", ctypes.c_void_p),
        ("b_scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("fast_accum", ctypes.c_int),
    ]


# How many Bs one op takes (OVL_MAX_BS): A is gathered once for all of them.
MAX_BS = 8

# The id of a job across nodes (OVL_JOB_ID_BYTES, ovl_job_id_t): opaque bytes
# that one rank gets from its ovld and hands to the others.
JOB_ID_BYTES = 128


class JobId(ctypes.Structure):
    """ovl_job_id_t."""
    _fields_ = [("bytes", ctypes.c_ubyte * JOB_ID_BYTES)]


_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("OVL_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, n) for n in (SONAME, "libovl.so")
           if os.path.exists(os.path.join(here, n))]
    out.append(SONAME)
    found = ctypes.util.find_library("ovl")
    if found:
        out.append(found)
    return out, False


def _declare(lib):
    c = ctypes
    P = c.c_void_p
    sigs = {
        "ovl_strerror": (c.c_char_p, [c.c_int]),
        "ovl_default_socket": (c.c_int, [c.c_char_p, c.c_size_t, c.POINTER(c.c_int)]),
        "ovl_socket_rule_name": (c.c_char_p, [c.c_int]),
        "ovl_connect": (c.c_int, [c.c_char_p, c.POINTER(P)]),
        "ovl_connect_error": (c.c_char_p, []),
        "ovl_disconnect": (None, [P]),
        "ovl_set_timeout": (None, [P, c.c_int]),
        "ovl_last_error": (c.c_char_p, [P]),
        "ovl_daemon_info": (c.c_int, [P, c.POINTER(DaemonInfo)]),
        "ovl_host_alloc": (P, [P, c.c_size_t]),
        "ovl_host_free": (c.c_int, [P, P]),
        "ovl_comm_init": (c.c_int, [P, c.c_char_p, c.c_uint32, c.c_uint32, c.c_int, c.POINTER(P)]),
        "ovl_comm_destroy": (c.c_int, [P]),
        "ovl_comm_check": (c.c_int, [P]),
        "ovl_comm_synchronize": (c.c_int, [P]),
        "ovl_allgather_gemm": (c.c_int, [P, c.POINTER(AgGemmDesc), P]),
        "ovl_gemm_reduce_scatter": (c.c_int, [P, c.POINTER(GemmRsDesc), P]),
        "ovl_status_json": (c.c_int, [P, c.POINTER(c.c_void_p)]),
        "ovl_stats_json": (c.c_int, [P, c.c_int, c.POINTER(c.c_void_p)]),
        "ovl_free": (None, [P]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    # Newer than the soname: a libovl.so.1 from before jobs across nodes
    # still loads, and only these calls are refused (optional()).
    later = {
        "ovl_job_id_create": (c.c_int, [P, c.POINTER(JobId)]),
        "ovl_comm_init_id": (c.c_int, [P, c.POINTER(JobId), c.c_uint32, c.c_uint32, c.c_int,
                                       c.POINTER(P)]),
    }
    for name, (res, args) in later.items():
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = res
            f.argtypes = args


def optional(lib, name):
    """A function of libovl that an older libovl.so.1 lacks, or Unsupported
    naming the library loaded."""
    f = getattr(lib, name, None)
    if f is None:
        from .errors import Unsupported
        raise Unsupported("%s: the libovl loaded (%s) is older than this package and lacks it"
                          % (name, _path), -16)
    return f


def lib():
    """The loaded libovl (loaded on first use)."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        names, from_env = _candidates()
        errors = []
        for name in names:
            try:
                handle = ctypes.CDLL(name)
            except OSError as e:
                errors.append((name, str(e)))
                continue
            try:
                _declare(handle)
            except AttributeError as e:
                errors.append((name, "loaded, but it is not libovl.so.1 (%s)" % e))
                continue
            _lib, _path = handle, name
            return _lib
        from .errors import LibraryNotFound
        if from_env:
            raise LibraryNotFound(_env_failure(*errors[0]))
        raise LibraryNotFound("libovl not found next to the ovl package or on the system "
                              "(tried: %s); set $OVL_LIBRARY to its path"
                              % "; ".join("%s: %s" % e for e in errors))


def _env_failure(name, error):
    """Why $OVL_LIBRARY's library did not load, naming the variable, its
    value, whether that exists, and the loader's words."""
    if not os.path.exists(name):
        return ("libovl: $OVL_LIBRARY is set to %r, which does not exist (unset it to look "
                "next to the package and on the system) [%s]" % (name, error))
    hint = ""
    if "asan" in error.lower() or "static TLS" in error:
        hint = ("; a libovl built with -DOVL_SANITIZE=ON loads only with the ASan runtime "
                "preloaded (LD_PRELOAD=$(gcc -print-file-name=libasan.so))")
    return ("libovl: $OVL_LIBRARY is set to %r, which exists but could not be loaded: %s%s"
            % (name, error, hint))


def path():
    """The name libovl was loaded by (None before it is loaded)."""
    return _path


def text(p):
    return p.decode("utf-8", "replace") if p else ""
