"""L0: the raw cuDNN 9 API, generated from cuDNN's own headers.

Every C function declared in ``cudnn_graph.h``, ``cudnn_ops.h``, ``cudnn_cnn.h``
and ``cudnn_adv.h`` is an attribute of this module with the C name, resolved
lazily against the loaded libcudnn the first time it is used::

    from cudnnkit import lib
    import ctypes
    desc = ctypes.c_void_p()
    lib.cudnnCreateTensorDescriptor(ctypes.byref(desc))

Functions returning ``cudnnStatus_t`` are checked: a failure raises the
:class:`~cudnnkit.lib.errors.CudnnError` subclass for its category, with the
function name, status name and ``cudnnGetLastErrorString``. Every enum is an
``IntEnum`` (``lib.cudnnDataType_t``) and every enum member is also a module
constant (``lib.CUDNN_DATA_FLOAT``). ``lib.FUNCTIONS`` holds the prototypes,
``lib.DEPRECATED`` the names the headers mark deprecated.

Nothing here allocates GPU memory or knows an array library.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from . import _cudnn, _loader, _since, errors
from ._cudnn import (
    CUDNN_DIM_MAX,
    DEPRECATED,
    ENUMS,
    FUNCTIONS,
    HEADER_VERSION,
    HEADER_VERSION_STRING,
    Prototype,
    cudnnCallback_t,
    cudnnDebug_t,
    cudnnFraction_t,
)
from .errors import (
    BadParamError,
    CudnnError,
    DriverNotFoundError,
    ExecutionFailedError,
    FeatureVersionError,
    InternalError,
    LibraryNotFoundError,
    NotInitializedError,
    NotSupportedError,
    SymbolNotFoundError,
    UnsupportedVersionError,
    check,
    driver_available,
)

__all__ = [
    "FUNCTIONS",
    "DEPRECATED",
    "ENUMS",
    "HEADER_VERSION",
    "HEADER_VERSION_STRING",
    "CUDNN_DIM_MAX",
    "Prototype",
    "cudnnCallback_t",
    "cudnnDebug_t",
    "cudnnFraction_t",
    "CudnnError",
    "BadParamError",
    "NotSupportedError",
    "InternalError",
    "ExecutionFailedError",
    "NotInitializedError",
    "LibraryNotFoundError",
    "UnsupportedVersionError",
    "SymbolNotFoundError",
    "DriverNotFoundError",
    "FeatureVersionError",
    "driver_available",
    "check",
    "errors",
    "load",
    "version",
    "version_tuple",
    "path",
    "source",
    "loaded_sublibraries",
    "last_error_string",
    "function",
    "since",
    "available",
    "require",
    "SUPPORTED",
]

#: The cuDNN releases cudnnkit supports: from the oldest whose headers ``tools/gen_since.py`` read, to the newest
#: (whose headers the bindings were generated from). Names newer than the loaded release are refused by
#: :func:`require` (backend attributes, descriptor types and enum values) or on use (functions).
SUPPORTED = (_since.OLDEST, _since.NEWEST)

# Every enum type and every enum member as a module attribute.
for _enum in ENUMS:
    globals()[_enum.__name__] = _enum
    for _name, _member in _enum.__members__.items():  # includes deprecated aliases
        globals().setdefault(_name, _member)
del _enum, _name, _member

#: re-entrant: a first binding may run the garbage collector, whose finalizers (a backend descriptor's
#: ``cudnnBackendDestroyDescriptor``) bind another function on the same thread (a plain Lock deadlocked: fuzzer)
_bind_lock = threading.RLock()
_log = logging.getLogger("cudnnkit")


def load() -> _loader.Loaded:
    """Load libcudnn now (normally done on first use) and install the error-text reader."""
    loaded = _loader.load()
    if errors._last_error_reader is None:
        _log.debug("loaded cuDNN %s from %s (%s)", loaded.version, loaded.path, loaded.source)
        raw = loaded.cdll.cudnnGetLastErrorString
        raw.restype = None
        raw.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

        def _read() -> str:
            buf = ctypes.create_string_buffer(1024)
            raw(buf, len(buf))
            return buf.value.decode(errors="replace").strip()

        errors._last_error_reader = _read
    return loaded


def version() -> int:
    """``cudnnGetVersion()`` of the loaded library, e.g. 91900 for 9.19.0."""
    return load().version


def version_tuple() -> tuple[int, int, int]:
    """(major, minor, patch) of the loaded library."""
    return _loader.decode_version(load().version)


def path() -> str:
    """Resolved file path of the loaded ``libcudnn.so``."""
    return load().path


def source() -> str:
    """Where the library came from: CUDNNKIT_LIBRARY, process, wheel:<dist> or system."""
    return load().source


def loaded_sublibraries() -> dict[str, str | None]:
    """Sub-library name (graph, ops, cnn, adv, ...) -> mapped path, or None if not loaded yet."""
    return _loader.loaded_sublibraries()


def last_error_string() -> str:
    """``cudnnGetLastErrorString`` for the calling thread."""
    load()
    assert errors._last_error_reader is not None
    return errors._last_error_reader()


def since(name: str) -> tuple[int, int, int] | None:
    """The cuDNN release that first declares ``name`` (a function or enum member), or None if all supported do."""
    return _since.FUNCTIONS.get(name) or _since.ENUM_MEMBERS.get(name)


_too_new: frozenset[str] | None = None


def available(name: str) -> bool:
    """Whether the loaded libcudnn knows ``name`` (a function or enum member of the bindings' headers)."""
    global _too_new
    if _too_new is None:
        v = version_tuple()
        _too_new = frozenset(n for n, s in (*_since.FUNCTIONS.items(), *_since.ENUM_MEMBERS.items()) if s > v)
    return name not in _too_new


def require(name: str, what: str | None = None) -> None:
    """Raise :class:`FeatureVersionError` if the loaded libcudnn is older than the release declaring ``name``.

    ``what`` names the user's argument in the message (default: ``name`` itself).
    """
    if not available(name):
        major, minor, patch = since(name)  # type: ignore[misc]
        lm, ln, lp = version_tuple()
        raise FeatureVersionError(
            f"{what or name} needs cuDNN {major}.{minor}.{patch} or newer ({name} first appears there), "
            f"but the loaded library is cuDNN {lm}.{ln}.{lp} at {path()}; install a newer nvidia-cudnn-cu13"
        )


def function(name: str) -> Any:
    """The bound ctypes function for the C function ``name`` (checked if it returns a status)."""
    fn = globals().get(name)
    if fn is not None and name in FUNCTIONS:
        return fn
    return _bind(name)


def _bind(name: str) -> Any:
    proto = FUNCTIONS.get(name)
    if proto is None:
        raise AttributeError(f"{name!r} is not a function declared in the cuDNN {HEADER_VERSION_STRING} headers")
    loaded = load()
    with _bind_lock:
        fn = globals().get(name)
        if fn is not None:
            return fn
        try:
            # a private function object, so prototypes set here never leak to other users of the CDLL
            fn = loaded.cdll._FuncPtr((name, loaded.cdll))
        except AttributeError:
            major, minor, patch = _loader.decode_version(loaded.version)
            first = since(name)
            first_text = f" (it first appears in cuDNN {'.'.join(map(str, first))})" if first else ""
            raise SymbolNotFoundError(
                f"{name} is declared by the cuDNN {HEADER_VERSION_STRING} headers but is not exported "
                f"by the loaded cuDNN {major}.{minor}.{patch} at {loaded.path}{first_text}"
            ) from None
        fn.restype = proto.restype
        fn.argtypes = [t for _, t in proto.args]
        if proto.returns_status:
            fn.errcheck = errors.errcheck
        fn.__name__ = name
        fn.__doc__ = proto.c_decl + (" [deprecated]" if proto.deprecated else "")
        globals()[name] = fn
        return fn


def __getattr__(name: str) -> Any:
    if name in FUNCTIONS:
        return _bind(name)
    if hasattr(_cudnn, name):
        return getattr(_cudnn, name)
    raise AttributeError(f"module 'cudnnkit.lib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(FUNCTIONS))
