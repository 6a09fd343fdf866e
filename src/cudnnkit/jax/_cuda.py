"""The CUDA :class:`~cudnnkit.jax._ops.Runner`: XLA's buffers as device views whose adapter is cudnnkit's own
(:mod:`cudnnkit.runtime.adapters._raw`), so the declarations' L2 calls allocate their outputs, temporaries and
workspaces from the device's CUDA memory pool, stream-ordered on XLA's stream, and run there; each output is then
copied into its XLA result buffer (``cuMemcpyDtoDAsync``, or ``cudnnTransformTensor`` from another layout),
unless it was made there: while the declaration runs, a new array of an output's (or a gradient's, a residual's)
shape, layout and dtype is allocated in that output's result buffer (:meth:`CudaRunner.into`).

The L2 calls' memory comes from the CUDA driver's default pool, outside XLA's preallocated arena (by default
75% of the GPU): a large workspace can fail with ``MemoryError`` there; lower ``XLA_PYTHON_CLIENT_MEM_FRACTION``
(or set ``XLA_PYTHON_CLIENT_PREALLOCATE=false``) to leave room.

The device is the one the buffers' memory belongs to (``cuPointerGetAttributes`` of the first buffer; XLA's
stream's, ``cuStreamGetDevice``, for a call whose buffers are all empty), made current around the call with XLA's
stream (:func:`~cudnnkit.runtime.adapters._raw.on_stream`).

**XLA's command buffers (opt-in).** With :func:`enable_command_buffers` (or ``CUDNNKIT_JAX_COMMAND_BUFFERS=1`` in
the environment at import), the runner is capture-safe: the targets of capture-safe declarations then declare the
FFI's command-buffer trait, and XLA may capture a call into a CUDA graph (its traced custom-call command, when
``--xla_gpu_enable_command_buffer`` names ``CUSTOM_CALL``) and replay it on later executions without calling the
handler: no Python runs for that op then. While XLA's stream captures, a call runs with this thread's capture mode
relaxed (a handle, a plan or a kernel module made on first use is allowed) and allocates from an
:class:`~cudnnkit.runtime.adapters._raw.Arena` instead of the stream-ordered pool, so the graph holds no memory
nodes. The arena is keyed by the call's attributes and its buffers (addresses and shapes), and kept for the
process (:func:`captured_memory` says how much; :func:`release_captured_memory` frees it, safe only once no
executable that captured a cudnnkit call can run again, e.g. after ``jax.clear_caches()`` and dropping the jitted
functions). Two captures share an arena only when XLA gave them the same buffers, so their work is ordered (XLA
reuses a buffer only after its last reader). The trait is answered when a target is registered (an op's first
call): set it before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..runtime import driver
from ..runtime.adapters import _raw
from ..runtime.arrays import as_view, contiguous_strides
from ..runtime.dtypes import itemsize
from ..runtime.view import same_layout
from . import _ffi

__all__ = ["CudaRunner", "RUNNER", "enable_command_buffers", "captured_memory", "release_captured_memory"]

_capture = [os.environ.get("CUDNNKIT_JAX_COMMAND_BUFFERS", "0") == "1"]
#: (the call's kw attribute, device, its buffers' (address, shape)s) -> the arena its captures allocate from
_arenas: dict[tuple, _raw.Arena] = {}
_arenas_lock = threading.Lock()


def enable_command_buffers(on: bool = True) -> bool:
    """Whether the targets of capture-safe ops registered from now on declare XLA's command-buffer trait (see the
    module docstring); returns the setting. Ops already called keep what they declared: a refusal names them."""
    from ._ops import REGISTERED

    fixed = sorted(o.d.name for o in REGISTERED if o.traits != (bool(on) and bool(o.d.capture_safe)))
    if fixed:
        raise RuntimeError(f"enable_command_buffers({on}): the FFI targets of {fixed} are registered already and "
                           f"keep their trait; call it before the first call of an op")  # fmt: skip
    _capture[0] = bool(on)
    return _capture[0]


def captured_memory() -> dict[str, int]:
    """The arenas captured calls keep: how many, and their bytes."""
    with _arenas_lock:
        held = list(_arenas.values())
    return {"arenas": len(held), "bytes": sum(a.nbytes for a in held)}


def release_captured_memory() -> None:
    """Free every arena (``cuMemFree``). Only when no executable that captured a cudnnkit call will run again."""
    with _arenas_lock:
        held = list(_arenas.values())
        _arenas.clear()
    for a in held:
        a.free()


def _device(call: _ffi.Call) -> int:
    """The device of the call's buffers (``cuPointerGetAttributes`` of the first one with an address); for a call
    whose buffers have none (every one empty), the device of XLA's stream (``cuStreamGetDevice``), never a guess:
    under ``shard_map`` the same target runs on every device of the mesh."""
    for b in (*call.args, *call.rets):
        if b.ptr:
            info = driver.pointer_info(b.ptr)
            if info.kind in ("device", "managed") and info.device >= 0:
                return info.device
    if call.stream not in (0, 1, 2):  # the default-stream handles belong to every device
        dev = driver.stream_device(call.stream)
        if dev is not None:
            return dev
    return 0


class CudaRunner:
    """See the module docstring."""

    platform = "CUDA"

    @property
    def capture_safe(self) -> bool:
        """Whether calls may be captured into XLA's command buffers: opt-in (:func:`enable_command_buffers`)."""
        return _capture[0]

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
        self.write_all(call, [(dst, value, name, shape, strides)], [])

    @contextlib.contextmanager
    def into(self, call: _ffi.Call, targets: list[tuple[_ffi.Buffer, tuple | None, tuple | None]]
             ) -> Iterator[list[_raw.DeviceArray]]:  # fmt: skip
        """Within the block, an L2 call's new array of a target's shape, layout and dtype is made in that target
        (an XLA result buffer, seen as :meth:`array` sees it with ``shape``/``strides``), so :meth:`write_all`
        has nothing to copy for it (:func:`~cudnnkit.runtime.adapters._raw.into`). Yields the targets handed out."""
        with _raw.into([self.array(call, b, *(v or ())) for b, v in targets]) as claimed:
            yield claimed

    def write_all(self, call: _ffi.Call, items: list[tuple], claimed: list[_raw.DeviceArray]) -> None:
        """Each ``(dst, value, name, shape, strides)`` of ``items``: ``value`` (an array the declaration returned)
        into ``dst`` seen with ``shape``/``strides``; nothing for a value already there. A value that lies in a
        target :meth:`into` handed out (and is not already in its own buffer) is first copied out, so that no
        write overwrites a value still to be written (two outputs of one shape made in each other's buffers)."""
        spans = [(t.ptr, t.ptr + _raw._extent(t.shape, t.strides, t.dtype)) for t in claimed]
        moves = []
        for dst, value, name, shape, strides in items:
            d = self.array(call, dst, shape, strides)
            src = as_view(value, name)
            if tuple(src.shape) != d.shape or src.dtype != d.dtype:
                raise RuntimeError(f"{name}: the declaration returned a {src.dtype} {tuple(src.shape)} array where "
                                   f"its meta said {d.dtype} {d.shape} (a cudnnkit bug: meta and forward disagree)")  # fmt: skip
            if src.ptr == d.ptr and same_layout(d.shape, tuple(src.strides), d.strides):
                continue  # already written in place (strides that differ on size-1 dims address the same elements)
            s = _raw.DeviceArray(src.shape, src.strides, src.dtype, d.device, src.ptr, src)
            end = src.ptr + _raw._extent(s.shape, s.strides, s.dtype)
            if any(lo < end and src.ptr < hi for lo, hi in spans):
                held = _raw.ADAPTER.empty(s.shape, s.dtype, d.device, None, call.stream)
                _raw.ADAPTER.copy(held, s, call.stream)
                s = held
            moves.append((d, s))
        for d, s in moves:
            _raw.ADAPTER.copy(d, s, call.stream)

    def zero(self, call: _ffi.Call, dst: _ffi.Buffer) -> None:
        n = itemsize(dst.dtype)
        for d in dst.shape:
            n *= d
        if n:
            driver.memset_async(dst.ptr, n, call.stream)

    def scope(self, call: _ffi.Call) -> Any:
        call.device = _device(call)
        if _capture[0] and driver.stream_capturing(call.stream, call.device):
            return _captured(call)
        return _raw.on_stream(call.device, call.stream)


@contextlib.contextmanager
def _captured(call: _ffi.Call) -> Iterator[None]:
    """The scope of a call XLA captures: its stream current, the capture mode relaxed, its arena in force."""
    key = (call.attrs.get("kw"), call.device, tuple((b.ptr, b.shape) for b in (*call.args, *call.rets)))
    with _arenas_lock:
        arena = _arenas.get(key)
        if arena is None:
            arena = _arenas[key] = _raw.Arena(call.device)
    with _raw.on_stream(call.device, call.stream), driver.relaxed_capture(), _raw.from_arena(arena):
        yield


RUNNER = CudaRunner()
