"""ovl: Python client of ovld, over libovl (ctypes; no compiler, no torch).

    import ovl
    with ovl.connect() as client, client.comm(job, world, rank, device) as comm:
        a = client.empty((m, k), "fp32"); b = client.empty((k, n), "fp32")
        c = comm.all_gather_matmul(a, b)      # (world*m) x n

See python/README.md.
"""
__version__ = "0.3.0"

from .errors import (  # noqa: F401
    Error, InvalidArgument, NoMemory, SystemFailure, ProtocolError, VersionMismatch, Timeout,
    ConnectFailed, Closed, PermissionDenied, NotFound, Exists, Limit, Mismatch, OutOfRange,
    BackendError, Unsupported, Aborted, ConfigError, Shutdown, Again, InternalError,
    LibraryNotFound, STATUS_NAMES)
from ._core import (  # noqa: F401
    Client, Comm, connect, default_socket, bf16_to_float32, float32_to_bf16, fp8_to_float32,
    float32_to_fp8)
from . import _lib

__all__ = [
    "Error", "InvalidArgument", "NoMemory", "SystemFailure", "ProtocolError", "VersionMismatch",
    "Timeout", "ConnectFailed", "Closed", "PermissionDenied", "NotFound", "Exists", "Limit",
    "Mismatch", "OutOfRange", "BackendError", "Unsupported", "Aborted", "ConfigError", "Shutdown",
    "Again", "InternalError", "LibraryNotFound", "STATUS_NAMES", "Client", "Comm", "connect",
    "default_socket", "bf16_to_float32", "float32_to_bf16", "fp8_to_float32", "float32_to_fp8",
    "library_path", "__version__",
]


def library_path():
    """The libovl that was loaded (loading it if needed)."""
    _lib.lib()
    return _lib.path()
