"""cuDNN handles: one per (device, thread), created lazily; the stream is set only when it changes.

A cuDNN handle is bound to the device that was current when ``cudnnCreate``
ran and must not be used by two threads at once, so each thread keeps its own
handle per device. Handles are destroyed when their thread ends (and never
during interpreter shutdown, when CUDA may already be gone).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import numbers
import threading
from typing import Any

from .. import lib
from . import adapters, driver
from .cache import LRU, MISSING

__all__ = ["Handle", "get_handle", "resolve_stream", "validate_stream", "check_device", "clear_stream_cache"]

_shutting_down = False
_log = logging.getLogger("cudnnkit")


@atexit.register
def _mark_shutdown() -> None:
    global _shutting_down
    _shutting_down = True


class Handle:
    """A ``cudnnHandle_t`` for one device, owned by one thread. ``int(handle)`` is the raw pointer."""

    __slots__ = ("ptr", "device", "stream", "thread", "__weakref__")

    def __init__(self, device: int, guard: Any):
        h = ctypes.c_void_p()
        with guard:
            lib.cudnnCreate(ctypes.byref(h))
        driver.retain(device)  # for __del__'s push, which may take no lock
        self.ptr = h.value
        self.device = device
        self.stream: int | None = None
        self.thread = threading.get_ident()

    def set_stream(self, stream: int) -> None:
        """``cudnnSetStream``, only when ``stream`` differs from the last one set."""
        if stream != self.stream:
            lib.cudnnSetStream(self.ptr, stream)
            self.stream = stream

    def __int__(self) -> int:
        return self.ptr

    @property
    def _as_parameter_(self) -> int:  # lets ctypes pass a Handle directly
        return self.ptr

    def __del__(self) -> None:
        if self.ptr and not _shutting_down:
            # with its device current: the thread that drops a handle (its own, at its end: XLA's threads of
            # device 1, say) may have another device current, and cudnnDestroy synchronizes the current device.
            # No lock is taken here (the collector may run this on a thread holding the driver's lock): the context
            # was retained when the handle was made
            guard: Any = driver.pushed_if_ready(self.device)
            if guard is not None:
                try:
                    guard.__enter__()
                except Exception:  # the push failed: destroyed as it is
                    guard = None
            try:
                lib.cudnnDestroy(self.ptr)
            except Exception:
                pass
            finally:
                if guard is not None:
                    guard.__exit__(None, None, None)
            self.ptr = None

    def __repr__(self) -> str:
        return (
            f"<cudnn Handle device={self.device} stream={self.stream:#x} ptr={self.ptr:#x}>"
            if self.ptr
            else "<cudnn Handle (destroyed)>"
        )


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.handles: dict[int, Handle] = {}


_local = _PerThread()


def _guard(device: int, adapter: Any):
    if adapter is None:
        adapter = adapters.first_available()
        if adapter is None:
            raise RuntimeError("creating a cuDNN handle needs CuPy or torch to select the CUDA device")
    return adapter.device_guard(device)


def get_handle(device: int, stream: int, adapter: Any = None) -> Handle:
    """This thread's handle for ``device``, with ``stream`` (a ``cudaStream_t`` as int) set on it."""
    h = _local.handles.get(device)
    if h is None:
        h = _local.handles[device] = Handle(device, _guard(device, adapter))
        _log.debug("created cuDNN handle %#x on cuda:%d for thread %d", h.ptr, device, h.thread)
    h.set_stream(stream)
    return h


def _stream_int(stream: Any, name: str) -> int:
    """The ``cudaStream_t`` int of a stream object or int (no liveness check); ``TypeError`` naming ``name``."""
    if type(stream) is int:
        return stream
    if isinstance(stream, numbers.Integral) and not isinstance(stream, bool):  # IntEnum, numpy integers
        return int(stream)
    if isinstance(stream, (bool, numbers.Number, str, bytes)):
        raise TypeError(
            f"{name} must be None or a CUDA stream object (torch, CuPy or __cuda_stream__); got "
            f"{type(stream).__name__} {stream!r}"
        )
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        try:
            v = proto()[1]
        except Exception as e:
            raise TypeError(f"{name}: {type(stream).__name__}.__cuda_stream__() failed: {e}") from None
        if isinstance(v, int) and not isinstance(v, bool):
            return int(v)
        raise TypeError(f"{name}: __cuda_stream__() must give (version, handle int), got handle {v!r}")
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    raise TypeError(
        f"{name} must be None, a CuPy/torch/cuda.core stream (or any object with __cuda_stream__), or the int "
        f"handle of a live CUDA stream; got {type(stream).__module__}.{type(stream).__name__} {stream!r}"
    )


def resolve_stream(stream: Any, adapter: Any, device: int) -> int:
    """A ``cudaStream_t`` (int) from ``stream=``: None (the array library's current stream),
    an int, a CuPy stream (``.ptr``), a torch stream (``.cuda_stream``) or a ``__cuda_stream__`` object.

    Converts only; :func:`validate_stream` also checks that the handle is a live stream of ``device``."""
    if stream is None:
        if adapter is None:
            return 0  # legacy default stream for arrays of a library without an adapter
        return adapter.current_stream(device)
    return _stream_int(stream, "stream")


#: the handles every device has: 0 (the default stream), 1 (``cudaStreamLegacy``), 2 (``cudaStreamPerThread``)
_SPECIAL_STREAMS = (0, 1, 2)
_CHECKED_MAX = 256
_checked: LRU[tuple[int, int], bool] = LRU("handle.live_streams", _CHECKED_MAX)  # (device, handle) found live there


def clear_stream_cache() -> None:
    """Forget the stream handles :func:`validate_stream` found live (also done by ``runtime.clear_caches()``)."""
    _checked.clear()


def validate_stream(stream: Any, adapter: Any, device: int, name: str = "stream", *, producer: bool = False) -> int:
    """The ``cudaStream_t`` (int) that work for ``device`` runs on, checked before it reaches cuDNN or a library.

    * ``None``: ``adapter``'s current stream on ``device`` (taken as is), or 0 without an adapter;
    * 0, 1, 2: the default stream, ``cudaStreamLegacy``, ``cudaStreamPerThread`` (valid on every device);
    * a stream object (CuPy ``.ptr``, torch ``.cuda_stream``, anything with ``__cuda_stream__``), or with
      ``producer=True`` the int a ``__cuda_array_interface__`` producer named: it must be in ``0 .. 2**64-1``
      (``ValueError`` otherwise) and a live stream of ``device``, asked of the CUDA driver
      (:func:`cudnnkit.runtime.driver.stream_device`: ``cuStreamGetFlags``, after checking the handle addresses
      readable memory, so garbage such as ``0xBAD000`` or ``2**63`` is refused instead of crashing).
      ``ValueError`` naming ``name`` if it is not a stream or is one of another device.
    * a raw int from the user other than those: ``ValueError`` (pass the stream object): a handle that points at
      readable memory which is not a stream crashes the driver's query, so raw ints are never asked about.
    * anything else (a float, a str, a bool): ``TypeError`` naming ``name``.

    The handle of ``adapter``'s current stream on ``device`` needs no query. Without a CUDA driver to ask,
    stream objects are taken as they are and other raw ints are refused (pass the library's stream object).

    Handles found live are cached per (device, handle), up to 256 (an LRU), so repeated use costs a lookup. The
    trade-off: a stream destroyed after its first use, and its handle then passed again, is not re-checked (a
    dangling handle, like a dangling pointer, is the caller's bug); ``clear_stream_cache()`` forgets them.
    """
    if stream is None:
        if adapter is None:
            return 0
        return adapter.current_stream(device)
    h = _stream_int(stream, name)
    if h in _SPECIAL_STREAMS:
        refuse = getattr(adapter, "refuse_special_stream", None)  # a library that cannot allocate on it says so
        if refuse is not None:
            refuse(h, name)
        return h
    if _checked.lookup((device, h)) is not MISSING:
        return h
    if not 0 <= h < 2**64:
        raise ValueError(f"{name}={h} is not a CUDA stream handle (handles are unsigned 64-bit pointers)")
    if adapter is not None and h == adapter.current_stream(device):
        return h  # the library's own current stream on this device
    if not producer and isinstance(stream, numbers.Integral):
        # A raw int cannot be checked safely: the driver dereferences a stream handle, and a handle that points at
        # readable memory which is not a stream segfaults inside cuStreamGetFlags (measured on the H200, driver
        # 580). Only stream objects (whose library vouches for them), handles already seen as such, the special
        # streams and the library's current stream get through.
        raise ValueError(
            f"{name}={h:#x} is a raw stream handle, which cannot be checked without risking a crash in the CUDA "
            "driver; pass the stream object instead (torch.cuda.Stream, torch.cuda.ExternalStream(handle), "
            "cupy.cuda.Stream, cupy.cuda.ExternalStream(handle), or any object with __cuda_stream__)"
        )
    try:
        dev = driver.stream_device(h)
    except driver.DriverUnavailable as e:
        if type(stream) is not int:
            return h  # a library's stream object; nothing to check it with
        raise ValueError(
            f"{name}={h:#x}: a raw stream handle cannot be checked ({e}); pass the library's stream object "
            "(torch.cuda.Stream, cupy.cuda.Stream, or any object with __cuda_stream__) instead"
        ) from None
    if dev is None:
        raise ValueError(f"{name}={h:#x} is not a live CUDA stream")
    if dev != device:
        raise ValueError(f"{name}={h:#x} is a stream of cuda:{dev} but the arrays are on cuda:{device}")
    _checked.put((device, h), True)
    return h


def check_device(device: Any, name: str = "device") -> int:
    """``device`` as an int ordinal of an existing CUDA device: ``TypeError`` for a non-int (or a bool),
    ``ValueError`` naming ``name`` for a negative one or one past the devices the installed array libraries
    (or the driver) see."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"{name} must be a CUDA device ordinal (an int), got {device!r}")
    if device < 0:
        raise ValueError(f"{name} must be >= 0, got {device}")
    counts = []
    for ad in adapters.in_use():
        try:
            counts.append(ad.device_count())
        except Exception:
            pass
    count = max(counts, default=None)
    if count is not None and device >= count:
        raise ValueError(f"{name}={device} but there {'is' if count == 1 else 'are'} {count} CUDA device(s)")
    return device
