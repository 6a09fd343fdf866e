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
import threading
from typing import Any

from .. import lib
from . import adapters

__all__ = ["Handle", "get_handle", "resolve_stream"]

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
            try:
                lib.cudnnDestroy(self.ptr)
            except Exception:
                pass
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
        avail = adapters.available()
        if not avail:
            raise RuntimeError("creating a cuDNN handle needs CuPy or torch to select the CUDA device")
        adapter = avail[0]
    return adapter.device_guard(device)


def get_handle(device: int, stream: int, adapter: Any = None) -> Handle:
    """This thread's handle for ``device``, with ``stream`` (a ``cudaStream_t`` as int) set on it."""
    h = _local.handles.get(device)
    if h is None:
        h = _local.handles[device] = Handle(device, _guard(device, adapter))
        _log.debug("created cuDNN handle %#x on cuda:%d for thread %d", h.ptr, device, h.thread)
    h.set_stream(stream)
    return h


def resolve_stream(stream: Any, adapter: Any, device: int) -> int:
    """A ``cudaStream_t`` (int) from ``stream=``: None (the array library's current stream),
    an int, a CuPy stream (``.ptr``), a torch stream (``.cuda_stream``) or a ``__cuda_stream__`` object."""
    if stream is None:
        if adapter is None:
            return 0  # legacy default stream for arrays of a library without an adapter
        return adapter.current_stream(device)
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise TypeError(f"stream must be None, an int cudaStream_t, or a CuPy/torch/cuda.core stream; got {stream!r}")
