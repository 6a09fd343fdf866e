"""Everything an op needs before its cuDNN call, in one place.

``launch, (vx, vw) = prepare(("x", x), ("w", w), stream=stream)`` reads each
array (rejecting host arrays and bad types with the argument's name), checks
they share one device, takes the first array's library as the one that
allocates outputs and workspace, resolves the stream (the library's current
stream unless ``stream=`` is given) and gives, on first use of ``launch.handle``, this thread's handle for the
device with that stream set.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from .arrays import ArrayView, as_view, contiguous_strides, same_device
from .handle import Handle, get_handle, resolve_stream

__all__ = ["Launch", "prepare"]

_log = logging.getLogger("cudnnkit")


@dataclass
class Launch:
    device: int
    adapter: Any  # allocates outputs; None for arrays of a library without an adapter
    stream: int

    @property
    def handle(self) -> Handle:
        """This thread's handle for the device, with this launch's stream set on it.

        Created on first use (so an op validates everything before it touches
        cuDNN's device state), and the stream is re-checked on every access:
        another launch on this thread may have switched the shared handle."""
        return get_handle(self.device, self.stream, self.adapter)

    def on_device(self) -> Any:
        """A context making the launch's device current for the cuDNN calls (a no-op when it already is)."""
        if self.adapter is None or self.adapter.current_device() == self.device:
            return contextlib.nullcontext()
        return self.adapter.device_guard(self.device)

    def empty(self, shape, dtype: str, strides=None, name: str = "out") -> tuple[Any, ArrayView]:
        """Allocate an output with the inputs' library on the launch's device and stream."""
        if self.adapter is None:
            raise TypeError(
                f"cannot allocate {name}: the inputs come from a library without a cudnnkit adapter; pass {name}="
            )
        arr = self.adapter.empty(tuple(shape), dtype, self.device, strides, self.stream)
        return arr, self.adapter.view(arr, name)

    def output(
        self, out: Any, shape, dtype: str, *, strides=None, name: str = "out", beta: float = 0.0
    ) -> tuple[Any, ArrayView]:
        """The array an op writes: ``out`` checked (shape, dtype, device), or a new one.

        ``beta != 0`` blends into existing contents, so it needs ``out``. A new
        array gets ``strides`` (elements) if given, else C-contiguous.
        """
        shape = tuple(shape)
        if out is None:
            if beta != 0:
                raise ValueError(f"beta != 0 blends into an existing output: pass {name}=")
            return self.empty(shape, dtype, strides, name=name)
        v = as_view(out, name)
        if v.readonly:
            raise ValueError(f"{name} is read-only")
        if v.shape != shape or v.dtype != dtype:
            raise ValueError(f"{name} must have shape {shape} and dtype {dtype}, got {v.shape} {v.dtype}")
        if v.device != self.device:
            raise ValueError(f"{name} is on cuda:{v.device} but the inputs are on cuda:{self.device}")
        return out, v

    def contiguous(self, arr: Any, v: ArrayView, name: str, why: str = "is not C-contiguous") -> tuple[Any, ArrayView]:
        """A C-contiguous copy of ``arr`` made on the launch stream, for a call that cannot take its strides.

        ``why`` says what cuDNN needs (it goes into the debug log, logger ``cudnnkit``, and the error). Arrays of a
        library without an adapter cannot be copied: ``ValueError`` naming the argument."""
        if self.adapter is None:
            raise ValueError(
                f"{name} {why} (shape {v.shape}, strides {v.strides}) and its library has no cudnnkit "
                "adapter to copy it; pass a C-contiguous array"
            )
        _log.debug("%s %s (shape %s, strides %s): copying", name, why, v.shape, v.strides)
        arr = self.adapter.contiguous(arr, self.stream)
        return arr, self.adapter.view(arr, name)

    def upload(self, values: Any, name: str = "values") -> tuple[Any, int]:
        """Host values (a NumPy array) copied to a new device array of the inputs' library, queued on the
        launch stream (so work on that stream sees them, and the allocator orders their reuse after it).
        Returns (array, pointer); keep the array alive until the call that reads it is queued."""
        if self.adapter is None:
            raise TypeError(
                f"cannot copy {name} to the device: the inputs come from a library without a cudnnkit "
                f"adapter; pass {name} as a device array of that library instead"
            )
        arr = self.adapter.from_numpy(values, self.device, self.stream)
        return arr, self.adapter.view(arr, name).ptr

    def workspace(self, nbytes: int) -> tuple[Any, int]:
        """A device buffer of ``nbytes`` from the inputs' allocator; (owner, pointer). (None, 0) for 0 bytes."""
        if nbytes <= 0:
            return None, 0
        arr, v = self.empty((int(nbytes),), "uint8", contiguous_strides((int(nbytes),)), name="workspace")
        return arr, v.ptr


def prepare(*named: tuple[str, Any], stream: Any = None) -> tuple[Launch, list[ArrayView | None]]:
    """Views of the named arrays (None stays None) plus the :class:`Launch` they run with."""
    views: list[ArrayView | None] = [None if a is None else as_view(a, n) for n, a in named]
    device = same_device(*((n, v) for (n, _), v in zip(named, views)))
    adapter = next((v.adapter for v in views if v is not None and v.adapter is not None), None)
    if stream is None and adapter is None:
        # arrays of a library without an adapter: work on the stream their producer named
        # (``__cuda_array_interface__`` v3 ``stream``; 1 means the legacy default stream, which is 0 to cuDNN)
        stream = next((v.stream for v in views if v is not None and v.stream is not None), None)
        if stream == 1:
            stream = 0
    s = resolve_stream(stream, adapter, device)
    return Launch(device, adapter, s), views
