"""XLA's FFI from Python: a handler written in Python, called by XLA through ``ctypes``, registered with
``jax.ffi.register_ffi_target`` and invoked with ``jax.ffi.ffi_call``. No compiler, no C++ extension.

XLA calls a typed FFI handler ``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)`` (``xla/ffi/api/c_api.h``). The
call frame holds the API table, the execution context (the stream lives there), the stage, and three lists:
the argument buffers, the result buffers (allocated by XLA) and the attributes (the keyword arguments of the
``ffi_call``, encoded by JAX as scalars, strings and arrays). This module declares that ABI as ``ctypes``
structures (the fields cudnnkit reads, at the header's offsets; later fields are never touched) and wraps a
Python function as such a handler:

* :class:`Handler` -- ``Handler(fn, traits=...)``: ``fn(call)`` gets a :class:`Call` (``stream``, ``args`` and
  ``rets`` as :class:`Buffer` s, ``attrs`` as a dict). The first call XLA makes carries the metadata extension
  (the API version this handler speaks and its traits: ``command_buffer=True`` declares it safe to capture
  into a CUDA graph); the handler answers it without calling ``fn``. Only the EXECUTE stage calls ``fn``.
  A Python exception becomes an ``XLA_FFI_Error`` (``XLA_FFI_Error_Create``), which JAX raises as an
  ``XlaRuntimeError`` carrying the exception's type and message and where it was raised (the innermost frame in
  cudnnkit's source, ``file:line in function``): nothing crashes. The Python traceback cannot cross XLA; the whole
  of it is logged on the ``cudnnkit`` logger at DEBUG level, naming the FFI target.
* :func:`register` -- ``register(name, handler, platform)``: ``jax.ffi.register_ffi_target(name,
  jax.ffi.pycapsule(pointer), platform=...)`` once per (name, platform); the handler is kept alive for the
  process (XLA holds only its address).

The struct layouts are checked against what XLA hands in: each structure's ``struct_size`` must be at least
ours (XLA only ever appends fields), else the call is refused with an error naming the structure, before any
field past it is read.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax

__all__ = ["Buffer", "Call", "Handler", "register", "registered", "where", "DTYPES", "FfiAbiError"]

_log = logging.getLogger("cudnnkit")
#: cudnnkit's package folder: a traceback frame in a file under it is cudnnkit's own
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIB = os.path.join(_PACKAGE, "lib")

# ----------------------------------------------------------------- the C API (xla/ffi/api/c_api.h)

_VP = ctypes.c_void_p
_I64P = ctypes.POINTER(ctypes.c_int64)

#: XLA_FFI_DataType -> cudnnkit's dtype name (the ones cuDNN has a name for)
DTYPES = {
    1: "bool",
    2: "int8",
    4: "int32",
    5: "int64",
    6: "uint8",
    10: "float16",
    11: "float32",
    12: "float64",
    16: "bfloat16",
    19: "float8_e5m2",
    20: "float8_e4m3fn",
}
#: the scalar attribute types JAX encodes keyword arguments as: XLA_FFI_DataType -> ctypes type
_SCALARS = {
    1: ctypes.c_bool,
    2: ctypes.c_int8,
    3: ctypes.c_int16,
    4: ctypes.c_int32,
    5: ctypes.c_int64,
    6: ctypes.c_uint8,
    7: ctypes.c_uint16,
    8: ctypes.c_uint32,
    9: ctypes.c_uint64,
    11: ctypes.c_float,
    12: ctypes.c_double,
}
_METADATA_EXTENSION = 1  # XLA_FFI_Extension_Type
_EXECUTE = 3  # XLA_FFI_ExecutionStage
_ARRAY, _DICTIONARY, _SCALAR, _STRING = 1, 2, 3, 4  # XLA_FFI_AttrType
_BUFFER = 1  # XLA_FFI_ArgType / XLA_FFI_RetType
_INVALID_ARGUMENT, _UNIMPLEMENTED, _INTERNAL = 3, 12, 13  # XLA_FFI_Error_Code
_COMMAND_BUFFER_COMPATIBLE = 1  # XLA_FFI_Handler_TraitsBits
_API_MAJOR, _API_MINOR = 0, 1  # the FFI API version these declarations follow


class _ExtensionBase(ctypes.Structure):
    pass


_ExtensionBase._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                           ("next", ctypes.POINTER(_ExtensionBase))]  # fmt: skip
_EXT = ctypes.POINTER(_ExtensionBase)


class _ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.c_void_p)]


class _Array(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("size", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("dtype", ctypes.c_int),
                ("data", ctypes.c_void_p), ("rank", ctypes.c_int64), ("dims", _I64P)]  # fmt: skip


class _List(ctypes.Structure):
    """XLA_FFI_Args and XLA_FFI_Rets: the same layout (size, types, pointers)."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)), ("items", ctypes.POINTER(ctypes.c_void_p))]  # fmt: skip


class _Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("size", ctypes.c_int64),
                ("types", ctypes.POINTER(ctypes.c_int)), ("names", ctypes.POINTER(ctypes.POINTER(_ByteSpan))),
                ("attrs", ctypes.POINTER(ctypes.c_void_p))]  # fmt: skip


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("major_version", ctypes.c_int),
                ("minor_version", ctypes.c_int)]  # fmt: skip


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion), ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _ExtensionBase), ("metadata", ctypes.POINTER(_Metadata))]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("message", ctypes.c_char_p),
                ("errc", ctypes.c_int)]  # fmt: skip


class _ErrorDestroyArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("error", _VP)]


class _StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("ctx", _VP), ("stream", _VP)]


_ErrorCreate = ctypes.CFUNCTYPE(_VP, ctypes.POINTER(_ErrorCreateArgs))
_StreamGet = ctypes.CFUNCTYPE(_VP, ctypes.POINTER(_StreamGetArgs))


class _Api(ctypes.Structure):
    """The first fields of XLA_FFI_Api: the two functions cudnnkit calls are the 1st and the 5th entries."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("api_version", _ApiVersion),
                ("internal_api", _VP), ("Error_Create", _ErrorCreate), ("Error_GetMessage", _VP),
                ("Error_Destroy", _VP), ("Handler_Register", _VP), ("Stream_Get", _StreamGet)]  # fmt: skip


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", _EXT), ("api", ctypes.POINTER(_Api)),
                ("ctx", _VP), ("stage", ctypes.c_int), ("args", _List), ("rets", _List), ("attrs", _Attrs),
                ("future", _VP)]  # fmt: skip


_HANDLER = ctypes.CFUNCTYPE(_VP, ctypes.POINTER(_CallFrame))


# ----------------------------------------------------------------- what a handler sees


class FfiAbiError(RuntimeError):
    """XLA handed in a structure smaller than this module's declaration of it (an FFI ABI this module does not
    know), or a buffer of a dtype cuDNN has no name for."""


@dataclass(frozen=True)
class Buffer:
    """One argument or result buffer: cudnnkit ``dtype``, ``shape`` and the data pointer ``ptr`` (dense, C order,
    as XLA lays out custom-call operands). ``device`` is ``None`` on the CPU platform; on CUDA the runner finds the
    buffers' device from their memory (:mod:`cudnnkit.jax._cuda`) and sets ``Call.device``."""

    dtype: str
    shape: tuple[int, ...]
    ptr: int
    device: int | None = None


@dataclass
class Call:
    """One execution of a handler: the ``stream`` (a ``CUstream`` as int; 0 on the CPU platform), the ``args``
    and ``rets`` buffers in order, and the ``attrs`` (``ffi_call``'s keywords: ints, floats, bools, strings,
    tuples of numbers, nested dicts)."""

    stream: int
    args: list[Buffer]
    rets: list[Buffer]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: the CUDA device the buffers live on, once a runner has found it (``None`` until then, and on the CPU)
    device: int | None = None


def _end(cls: type, last: str) -> int:
    """The bytes of ``cls`` through its field ``last``: what XLA's ``struct_size`` counts (``XLA_FFI_STRUCT_SIZE``
    names the last field, so trailing padding and optional fields are not in it)."""
    f = getattr(cls, last)
    return int(f.offset + f.size)


#: per structure read: the field it must reach (those past it are never read)
_LAST = {}


def _sized(ptr: Any, cls: type, what: str) -> Any:
    """``ptr`` (a ctypes pointer to a structure that starts with its ``struct_size``) as ``cls``, checked to reach
    the last field cudnnkit reads (:data:`_LAST`)."""
    got = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_size_t)).contents.value
    need = _LAST[cls]
    if got < need:
        raise FfiAbiError(f"XLA's {what} has struct_size {got} < {need} (the fields cudnnkit reads): an FFI ABI "
                          f"this version of cudnnkit does not know (jax {jax.__version__})")  # fmt: skip
    return ctypes.cast(ptr, ctypes.POINTER(cls)).contents


_LAST.update({_CallFrame: _end(_CallFrame, "attrs"), _Buffer: _end(_Buffer, "dims"),
              _Metadata: _end(_Metadata, "traits")})  # fmt: skip


def _span(s: Any) -> str:
    return ctypes.string_at(s.ptr, s.len).decode("utf-8")


def _attrs(a: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(a.size):
        name, kind, ptr = _span(a.names[i].contents), a.types[i], a.attrs[i]
        if kind == _STRING:
            out[name] = _span(ctypes.cast(ptr, ctypes.POINTER(_ByteSpan)).contents)
        elif kind == _SCALAR:
            s = ctypes.cast(ptr, ctypes.POINTER(_Scalar)).contents
            out[name] = _scalar(s.dtype, s.value, name)
        elif kind == _ARRAY:
            arr = ctypes.cast(ptr, ctypes.POINTER(_Array)).contents
            ct = _SCALARS.get(arr.dtype)
            if ct is None:
                raise FfiAbiError(f"attribute {name!r}: an array of XLA dtype {arr.dtype}, which cudnnkit never sends")
            vals = ctypes.cast(arr.data, ctypes.POINTER(ct))
            out[name] = tuple(_plain(vals[j]) for j in range(arr.size))
        elif kind == _DICTIONARY:
            out[name] = _attrs(ctypes.cast(ptr, ctypes.POINTER(_Attrs)).contents)
        else:
            raise FfiAbiError(f"attribute {name!r} has XLA attribute type {kind}, which this module does not know")
    return out


def _plain(v: Any) -> Any:
    return bool(v) if isinstance(v, bool) else v


def _scalar(dtype: int, ptr: int, name: str) -> Any:
    ct = _SCALARS.get(dtype)
    if ct is None:
        raise FfiAbiError(f"attribute {name!r}: a scalar of XLA dtype {dtype}, which cudnnkit never sends")
    v = ctypes.cast(ptr, ctypes.POINTER(ct)).contents.value
    return bool(v) if ct is ctypes.c_bool else v


def _buffers(lst: Any, what: str, device: int | None) -> list[Buffer]:
    out = []
    for i in range(lst.size):
        if lst.types[i] != _BUFFER:
            raise FfiAbiError(f"{what} {i} is not a buffer (XLA type {lst.types[i]}): cudnnkit passes buffers only")
        b = _sized(lst.items[i], _Buffer, f"{what} {i}")
        dt = DTYPES.get(b.dtype)
        if dt is None:
            raise FfiAbiError(f"{what} {i} has XLA dtype {b.dtype}, which cuDNN has no name for")
        out.append(Buffer(dt, tuple(b.dims[d] for d in range(b.rank)), b.data or 0, device))
    return out


def _stream(frame: Any) -> int:
    args = _StreamGetArgs(ctypes.sizeof(_StreamGetArgs), None, frame.ctx, None)
    err = frame.api.contents.Stream_Get(ctypes.byref(args))
    if err:  # XLA's error object is ours to destroy (XLA_FFI_Error_Destroy takes its args struct); report our own
        destroy = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ErrorDestroyArgs))(frame.api.contents.Error_Destroy)
        destroy(ctypes.byref(_ErrorDestroyArgs(ctypes.sizeof(_ErrorDestroyArgs), None, err)))
        raise RuntimeError("XLA_FFI_Stream_Get failed: this handler is registered for a platform without streams")
    return args.stream or 0


class Handler:
    """A Python function as an XLA FFI handler (see the module docstring).

    ``fn(call: Call) -> None`` writes the results into ``call.rets``. ``platform`` is ``"CUDA"`` (the stream is
    read from the execution context, buffers get ``device``) or ``"cpu"`` (tests: no stream). ``command_buffer``
    declares the handler capturable into a CUDA graph (XLA's command buffers): only for calls that always queue
    the same device work for the same attributes and never synchronize or allocate with the host's help.
    ``device`` gives the buffers' device on CUDA (XLA runs a handler on the device of its buffers; the caller
    knows it from the lowering)."""

    def __init__(self, fn: Callable[[Call], None], *, platform: str = "CUDA", command_buffer: bool = False,
                 device: Callable[[], int] | None = None):  # fmt: skip
        self.fn, self.platform, self.command_buffer = fn, platform, bool(command_buffer)
        self._device = device
        #: the FFI target's name, once :func:`register` ed (for the log)
        self.name: str | None = None
        self.calls = 0  # executions (not the metadata query), counted without a lock: about right in threads
        self.metadata_queries = 0  # the metadata queries XLA made (the version and traits asked; once per process)
        self._c = _HANDLER(self._entry)  # kept alive with the handler: XLA holds only its address

    @property
    def pointer(self) -> int:
        return ctypes.cast(self._c, ctypes.c_void_p).value  # type: ignore[return-value]

    def _entry(self, frame_ptr: Any) -> int | None:
        api = None
        try:
            raw = ctypes.cast(frame_ptr, ctypes.POINTER(ctypes.c_size_t))
            if raw[0] >= _end(_CallFrame, "api"):  # the API table first: an error can then be reported
                api = ctypes.cast(frame_ptr, ctypes.POINTER(_CallFrame)).contents.api
            frame = _sized(frame_ptr, _CallFrame, "XLA_FFI_CallFrame")
            ext = frame.extension_start
            if ext and ext.contents.type == _METADATA_EXTENSION:  # registration: the version and traits asked
                md = _sized(ctypes.cast(ext, ctypes.POINTER(_MetadataExtension)).contents.metadata, _Metadata,
                            "XLA_FFI_Metadata")  # fmt: skip
                md.api_version.major_version, md.api_version.minor_version = _API_MAJOR, _API_MINOR
                md.traits = _COMMAND_BUFFER_COMPATIBLE if self.command_buffer else 0
                self.metadata_queries += 1
                return None
            if frame.stage != _EXECUTE:
                return None
            cuda = self.platform.lower() in ("cuda", "gpu")
            stream = _stream(frame) if cuda else 0
            dev = (self._device() if self._device is not None else 0) if cuda else None
            call = Call(stream, _buffers(frame.args, "argument", dev), _buffers(frame.rets, "result", dev),
                        _attrs(frame.attrs))  # fmt: skip
            self.calls += 1
            self.fn(call)
            return None
        except BaseException as e:  # noqa: BLE001  (every exception goes back to XLA as an error, none escapes)
            try:
                return _error(api, e, self.name or getattr(self.fn, "__qualname__", "handler"))
            except BaseException:  # reporting failed too: a plain error, never NULL (which XLA reads as success)
                return _error(api, RuntimeError("an error the handler could not describe"), "handler")


def where(e: BaseException) -> str | None:
    """``cudnnkit/<file>:<line> in <function>``: the innermost frame of ``e``'s traceback in cudnnkit's own source
    (where a cudnnkit check raised, or the cudnnkit line that called into the library that raised), frames of the
    bindings (``cudnnkit/lib``: the status checker) skipped when another is cudnnkit's; ``None`` when no frame is
    cudnnkit's."""
    ours = [(path, line, frame.f_code.co_name) for frame, line in traceback.walk_tb(e.__traceback__)
            if (path := os.path.abspath(frame.f_code.co_filename)).startswith(_PACKAGE + os.sep)]  # fmt: skip
    if not ours:
        return None
    # a cuDNN status is raised by L0's one checker (cudnnkit/lib): the frame that made the call says more
    above = [f for f in ours if not f[0].startswith(_LIB + os.sep)]
    path, line, fn = (above or ours)[-1]
    rel = os.path.relpath(path, os.path.dirname(_PACKAGE)).replace(os.sep, "/")
    return f"{rel}:{line} in {fn}"


def _error(api: Any, e: BaseException, target: str) -> int | None:
    code = _INVALID_ARGUMENT if isinstance(e, (TypeError, ValueError)) else _INTERNAL
    if isinstance(e, NotImplementedError):
        code = _UNIMPLEMENTED
    at = where(e)
    # the traceback cannot cross XLA: the whole of it goes to the log (debug level), the innermost cudnnkit frame
    # into the message
    _log.debug("XLA FFI target %s raised %s: %s", target, type(e).__name__, e, exc_info=e)
    msg = f"cudnnkit: {type(e).__name__}: {e}{f' (at {at})' if at else ''}".encode("utf-8", "replace")
    if not api:  # a frame too small to hold even the API table (no XLA makes one): nothing to report through
        logging.getLogger("cudnnkit").critical("an XLA FFI call frame without an API table: %s", msg.decode())
        return None
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, msg, code)
    return api.contents.Error_Create(ctypes.byref(args))


_registered: dict[tuple[str, str], Handler] = {}
_lock = threading.Lock()


def register(name: str, handler: Handler) -> Handler:
    """Register ``handler`` as FFI target ``name`` for its platform (once; a second call with the same name and
    platform returns the first handler, whose address XLA already holds)."""
    key = (name, handler.platform.lower())
    with _lock:
        got = _registered.get(key)
        if got is not None:
            return got
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler.pointer), platform=handler.platform)
        handler.name = name
        _registered[key] = handler
        return handler


def registered() -> dict[tuple[str, str], Handler]:
    """The FFI targets this process registered: (name, platform) -> handler."""
    with _lock:
        return dict(_registered)
