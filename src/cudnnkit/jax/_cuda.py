"""The CUDA :class:`~cudnnkit.jax._ops.Runner`: XLA's buffers as device views whose adapter is cudnnkit's own
(:mod:`cudnnkit.runtime.adapters._raw`), so the declarations' L2 calls allocate their outputs, temporaries and
workspaces from the device's CUDA memory pool, stream-ordered on XLA's stream, and run there; each output is then
copied into its XLA result buffer (``cuMemcpyDtoDAsync``, or ``cudnnTransformTensor`` from another layout).

The L2 calls' memory comes from the CUDA driver's default pool, outside XLA's preallocated arena (by default
75% of the GPU): a large workspace can fail with ``MemoryError`` there; lower ``XLA_PYTHON_CLIENT_MEM_FRACTION``
(or set ``XLA_PYTHON_CLIENT_PREALLOCATE=false``) to leave room.

The device is the one the buffers' memory belongs to (``cuPointerGetAttributes`` of the first buffer), made
current around the call with XLA's stream (:func:`~cudnnkit.runtime.adapters._raw.on_stream`).
"""

from __future__ import annotations

from typing import Any

from ..runtime import driver
from ..runtime.adapters import _raw
from ..runtime.arrays import as_view, contiguous_strides
from ..runtime.dtypes import itemsize
from . import _ffi

__all__ = ["CudaRunner", "RUNNER"]


def _device(call: _ffi.Call) -> int:
    for b in (*call.args, *call.rets):
        if b.ptr:
            info = driver.pointer_info(b.ptr)
            if info.kind in ("device", "managed") and info.device >= 0:
                return info.device
    return 0


class CudaRunner:
    """See the module docstring."""

    platform = "CUDA"
    #: not capturable into XLA's command buffers: every call allocates its outputs, temporaries and workspaces with
    #: ``cuMemAllocAsync`` outside XLA (see :mod:`cudnnkit.jax._ops`' docstring)
    capture_safe = False

    def array(self, call: _ffi.Call, b: _ffi.Buffer, shape: tuple | None = None,
              strides: tuple | None = None) -> _raw.DeviceArray:  # fmt: skip
        """A :class:`~cudnnkit.runtime.adapters._raw.DeviceArray` over the buffer (no copy): the declarations call
        array methods on their operands (a bias's ``reshape``). C order, or ``shape``/``strides`` (a residual in
        its own layout)."""
        if shape is None:
            shape, strides = b.shape, contiguous_strides(b.shape)
        return _raw.DeviceArray(tuple(shape), tuple(strides), b.dtype, call.device or 0, b.ptr, b)

    def write(self, call: _ffi.Call, dst: _ffi.Buffer, value: Any, name: str, shape: tuple | None = None,
              strides: tuple | None = None) -> None:  # fmt: skip
        d = self.array(call, dst, shape, strides)
        src = as_view(value, name)
        if tuple(src.shape) != d.shape or src.dtype != d.dtype:
            raise RuntimeError(f"{name}: the declaration returned a {src.dtype} {tuple(src.shape)} array where its "
                               f"meta said {d.dtype} {d.shape} (a cudnnkit bug: meta and forward disagree)")  # fmt: skip
        if src.ptr == d.ptr and tuple(src.strides) == d.strides:
            return  # already written in place
        s = _raw.DeviceArray(src.shape, src.strides, src.dtype, d.device, src.ptr, src)
        _raw.ADAPTER.copy(d, s, call.stream)

    def zero(self, call: _ffi.Call, dst: _ffi.Buffer) -> None:
        n = itemsize(dst.dtype)
        for d in dst.shape:
            n *= d
        if n:
            driver.memset_async(dst.ptr, n, call.stream)

    def scope(self, call: _ffi.Call) -> Any:
        call.device = _device(call)
        return _raw.on_stream(call.device, call.stream)


RUNNER = CudaRunner()
