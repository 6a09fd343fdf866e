"""cuDNN status checking: one checker, one exception class per status category.

cuDNN 9 statuses are ``category + specific`` (``CUDNN_STATUS_CATEGORY(code) =
code // 1000 * 1000``). Each category maps to one subclass of
:class:`CudnnError`; the message carries the function that failed, the status
name and number, and the text of ``cudnnGetLastErrorString`` read immediately
after the failing call (cuDNN keeps it per thread and overwrites it on the next
failure).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from ._cudnn import cudnnStatus_t

__all__ = [
    "CudnnError",
    "NotInitializedError",
    "VersionMismatchError",
    "SublibraryLoadingError",
    "DriverNotFoundError",
    "FeatureVersionError",
    "driver_available",
    "UncategorizedError",
    "BadParamError",
    "NotSupportedError",
    "InternalError",
    "ExecutionFailedError",
    "LibraryNotFoundError",
    "UnsupportedVersionError",
    "SymbolNotFoundError",
    "check",
    "error_for",
    "status_name",
]


class CudnnError(RuntimeError):
    """A cuDNN call returned a status other than ``CUDNN_STATUS_SUCCESS``.

    Attributes: ``status`` (int), ``status_name`` (``CUDNN_STATUS_*``),
    ``function`` (the C function), ``last_error`` (``cudnnGetLastErrorString``).
    """

    def __init__(self, status: int, function: str, last_error: str = ""):
        self.status = int(status)
        self.status_name = status_name(status)
        self.function = function
        self.last_error = last_error
        msg = f"{function} failed with {self.status_name} ({self.status})"
        if last_error:
            msg += f": {last_error}"
        super().__init__(msg)

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.status, self.function, self.last_error))


class UncategorizedError(CudnnError):
    """Category 1000: statuses without a category of their own."""


class NotInitializedError(UncategorizedError):
    """``CUDNN_STATUS_NOT_INITIALIZED``: typically no usable CUDA device or driver."""


class VersionMismatchError(UncategorizedError):
    """Sub-library or serialization version mismatch (1002, 1003)."""


class SublibraryLoadingError(UncategorizedError):
    """``CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED``: a libcudnn_*.so could not be loaded."""


class DriverNotFoundError(SublibraryLoadingError):
    """A cuDNN sub-library could not be loaded because the CUDA driver (``libcuda.so.1``) is missing.

    A normal state on a machine without a GPU: since cuDNN 9.28 the runtime-compiled
    engines link ``libcuda.so.1``, so backend finalization needs the driver too.
    """

    HINT = "the CUDA driver is not installed (libcuda.so.1 not found): execution and backend finalization need it"

    def __init__(self, status: int, function: str, last_error: str = ""):
        super().__init__(status, function, last_error)
        self.args = (f"{self.args[0]}; {self.HINT}",)


class BadParamError(CudnnError, ValueError):
    """Category 2000: an argument cuDNN rejected (also a ``ValueError``)."""


class NotSupportedError(CudnnError):
    """Category 3000: valid, but no cuDNN engine supports it here."""


class InternalError(CudnnError):
    """Category 4000: cuDNN internal failure (allocation, compilation, ...)."""


class ExecutionFailedError(CudnnError):
    """Category 5000: the GPU work failed (driver, cuBLAS, cudart, cuRAND)."""


class LibraryNotFoundError(ImportError):
    """No libcudnn could be loaded."""


class UnsupportedVersionError(ImportError):
    """The loaded libcudnn is older than cuDNN 9.0."""


class SymbolNotFoundError(AttributeError):
    """A declared cuDNN function is not exported by the loaded library."""


class FeatureVersionError(ValueError):
    """An enum member or backend attribute is newer than the loaded libcudnn (the bindings come from newer headers)."""


_CATEGORY = {
    2000: BadParamError,
    3000: NotSupportedError,
    4000: InternalError,
    5000: ExecutionFailedError,
}
_SPECIFIC = {
    1001: NotInitializedError,
    1002: VersionMismatchError,
    1003: VersionMismatchError,
    1008: SublibraryLoadingError,
    2001: BadParamError,  # deprecated CUDNN_STATUS_INVALID_VALUE
}


def status_name(status: int) -> str:
    """``CUDNN_STATUS_*`` name of a status code (``CUDNN_STATUS_<code>`` if unknown)."""
    try:
        return cudnnStatus_t(int(status)).name
    except ValueError:
        return f"CUDNN_STATUS_{int(status)}"


def error_class(status: int) -> type[CudnnError]:
    status = int(status)
    cls = _SPECIFIC.get(status)
    if cls is None:
        cls = _CATEGORY.get(status // 1000 * 1000, UncategorizedError)
    if cls is SublibraryLoadingError and not driver_available():
        cls = DriverNotFoundError
    return cls


_driver: bool | None = None


def driver_available() -> bool:
    """Whether the CUDA driver library ``libcuda.so.1`` can be loaded in this process (checked once)."""
    global _driver
    if _driver is None:
        try:
            ctypes.CDLL("libcuda.so.1")
            _driver = True
        except OSError:
            _driver = False
    return _driver


# Set by the loader once libcudnn is loaded: returns the current thread's last error text.
_last_error_reader: Callable[[], str] | None = None


def error_for(status: int, function: str) -> CudnnError:
    """Build (do not raise) the exception for ``status`` from ``function``."""
    text = ""
    if _last_error_reader is not None:
        try:
            text = _last_error_reader()
        except Exception:  # pragma: no cover - never mask the original failure
            text = ""
    return error_class(status)(status, function, text)


def check(status: int, function: str = "cuDNN call") -> None:
    """Raise the :class:`CudnnError` subclass for ``status`` unless it is SUCCESS."""
    if status:
        raise error_for(status, function)


def errcheck(result, func, args):
    """ctypes ``errcheck`` hook installed on every function returning ``cudnnStatus_t``."""
    if result:
        raise error_for(result, func.__name__)
    return result
