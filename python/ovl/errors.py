"""ovl's exceptions: one class per ovl_status_t family (include/ovl/ovl.h).

Every exception raised by ovl for a failure of libovl or ovld is an
ovl.Error: .status is the ovl_status_t value (a negative int), .message
libovl's words (ovl_last_error, or ovl_connect_error for a connect).
Arguments that the binding refuses before anything reaches libovl raise
ovl.InvalidArgument (status -1) too.
"""


class Error(Exception):
    """A failure of libovl or ovld. .status: the ovl_status_t value."""
    status = None

    def __init__(self, message, status=None):
        if status is not None:
            self.status = status
        self.message = message
        super().__init__(message)

    def __str__(self):
        if self.status is None:
            return self.message
        name = STATUS_NAMES.get(self.status, str(self.status))
        return "%s (%s)" % (self.message, name) if self.message else name


class InvalidArgument(Error, ValueError):
    status = -1


class NoMemory(Error, MemoryError):
    status = -2


class SystemFailure(Error, OSError):
    status = -3


class ProtocolError(Error):
    status = -4


class VersionMismatch(Error):
    status = -5


class Timeout(Error, TimeoutError):
    status = -6


class ConnectFailed(Error, ConnectionError):
    status = -7


class Closed(Error, ConnectionError):
    """The connection to ovld closed (ovld died or closed it)."""
    status = -8


class PermissionDenied(Error, PermissionError):
    status = -9


class NotFound(Error):
    status = -10


class Exists(Error):
    status = -11


class Limit(Error):
    status = -12


class Mismatch(Error):
    """The ranks of a job disagree."""
    status = -13


class OutOfRange(Error):
    status = -14


class BackendError(Error):
    status = -15


class Unsupported(Error):
    status = -16


class Aborted(Error):
    """The job was aborted (a rank left or failed)."""
    status = -17


class ConfigError(Error):
    status = -18


class Shutdown(Closed):
    """ovld is shutting down."""
    status = -19


class Again(Error):
    status = -20


class InternalError(Error):
    status = -21


class LibraryNotFound(Error, ImportError):
    """libovl could not be loaded (not an ovl_status_t: status is None)."""
    status = None


_BY_STATUS = {c.status: c for c in (
    InvalidArgument, NoMemory, SystemFailure, ProtocolError, VersionMismatch, Timeout,
    ConnectFailed, Closed, PermissionDenied, NotFound, Exists, Limit, Mismatch, OutOfRange,
    BackendError, Unsupported, Aborted, ConfigError, Shutdown, Again, InternalError)}

STATUS_NAMES = {
    0: "OVL_OK", -1: "OVL_ERR_INVALID", -2: "OVL_ERR_NOMEM", -3: "OVL_ERR_SYSTEM",
    -4: "OVL_ERR_PROTOCOL", -5: "OVL_ERR_VERSION", -6: "OVL_ERR_TIMEOUT", -7: "OVL_ERR_CONNECT",
    -8: "OVL_ERR_CLOSED", -9: "OVL_ERR_PERMISSION", -10: "OVL_ERR_NOT_FOUND",
    -11: "OVL_ERR_EXISTS", -12: "OVL_ERR_LIMIT", -13: "OVL_ERR_MISMATCH", -14: "OVL_ERR_RANGE",
    -15: "OVL_ERR_BACKEND", -16: "OVL_ERR_UNSUPPORTED", -17: "OVL_ERR_ABORTED",
    -18: "OVL_ERR_CONFIG", -19: "OVL_ERR_SHUTDOWN", -20: "OVL_ERR_AGAIN",
    -21: "OVL_ERR_INTERNAL",
}


def error_for(status, message):
    """The exception for an ovl_status_t and its message."""
    cls = _BY_STATUS.get(status, Error)
    return cls(message, status)
