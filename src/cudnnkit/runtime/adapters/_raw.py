"""cudnnkit's own device arrays: memory no array library owns, for calls made where no library may allocate.

Inside an XLA FFI handler (:mod:`cudnnkit.jax`) the arguments and results are XLA's buffers and nothing may
call back into JAX to allocate. The declarations' L2 calls still need outputs, temporaries and workspaces: this
adapter gives them :class:`DeviceArray` s, :class:`~cudnnkit.runtime.driver.DeviceMemory` from the device's
default CUDA memory pool (``cuMemAllocAsync``), allocated and freed stream-ordered on the stream set by
:func:`on_stream` (XLA's), so that nothing waits on the host. Copies are ``cuMemcpyDtoDAsync`` (dense arrays of
one layout) or ``cudnnTransformTensor`` (a layout change).

While a handler's stream captures a CUDA graph (XLA's command buffers), stream-ordered allocations would become
graph memory nodes that XLA cannot nest: the runner then puts an :class:`Arena` in force (:func:`from_arena`), and
the same call's allocations come from memory the arena keeps for the graph's replays.

An allocation may also land straight in memory the caller already has for it (:func:`into`): the handler offers
XLA's result buffers, and an output the L2 call allocates with a result's shape, layout and dtype is made in that
buffer, so nothing is copied afterwards.

It imports no array library. It is found for its own arrays through their type (``__cudnnkit_adapter__``), never
by a module name, so it is never picked to build plans or select devices (:func:`~cudnnkit.runtime.adapters
.first_available`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

from .. import driver
from ..arrays import contiguous_strides, is_dense
from ..dtypes import itemsize
from ..view import ArrayView, same_layout
from . import KEYED, POINTER, is_lasting
from ._protocol import ArrayAdapter

__all__ = ["ADAPTER", "Arena", "DeviceArray", "RawAdapter", "on_stream", "from_arena", "into"]


class _Current(threading.local):
    def __init__(self) -> None:
        self.device, self.stream = 0, 0
        self.arena: Arena | None = None
        #: the arrays :func:`into` offers, not yet handed out (None outside its block)
        self.targets: list[DeviceArray] | None = None
        self.claimed: list[DeviceArray] = []


class Arena:
    """The memory one captured call keeps: the ``k``-th allocation a call makes while the arena is in force
    (:func:`from_arena`) is the ``k``-th block, made on first need (:class:`~cudnnkit.runtime.driver.HeldMemory`,
    allowed during a capture) and the same block at every later call, so a CUDA graph captured from the call
    addresses memory that stays valid for each replay. A block found too small is replaced and the old one kept
    (a graph captured earlier may still address it). Blocks are never freed while the arena lives; the owner keeps
    the arena as long as a graph captured with it may run.

    Sharing an arena between two calls is safe only when their device work is ordered (one after the other on a
    stream, or one graph's nodes after another's): the owner keys arenas so that it is (see
    :class:`cudnnkit.jax._cuda.CudaRunner`)."""

    __slots__ = ("device", "blocks", "retired", "taken")

    def __init__(self, device: int):
        self.device = int(device)
        self.blocks: list[driver.HeldMemory] = []
        self.retired: list[driver.HeldMemory] = []
        self.taken = 0

    def take(self, nbytes: int) -> int:
        """The next block's address (at least ``nbytes``)."""
        k, self.taken = self.taken, self.taken + 1
        if k < len(self.blocks):
            if self.blocks[k].nbytes >= nbytes:
                return self.blocks[k].ptr
            self.retired.append(self.blocks[k])
            self.blocks[k] = driver.HeldMemory(nbytes, self.device)
        else:
            self.blocks.append(driver.HeldMemory(nbytes, self.device))
        return self.blocks[k].ptr

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks) + sum(b.nbytes for b in self.retired)

    def free(self) -> None:
        """Return every block (``cuMemFree``): only once no graph captured with this arena can run again."""
        for b in (*self.blocks, *self.retired):
            b.free()
        self.blocks, self.retired = [], []


@contextlib.contextmanager
def from_arena(arena: Arena) -> Iterator[None]:
    """Within the block, :meth:`RawAdapter.empty` on ``arena``'s device takes its memory from ``arena`` (from its
    first block on) instead of the stream-ordered pool."""
    old, _current.arena = _current.arena, arena
    arena.taken = 0
    try:
        yield
    finally:
        _current.arena = old


_current = _Current()


@contextlib.contextmanager
def into(targets: list[DeviceArray]) -> Iterator[list[DeviceArray]]:
    """Within the block, :meth:`RawAdapter.empty` hands out each of ``targets`` (dense arrays over memory the
    caller owns: XLA's result buffers) once, to the first allocation of its shape, dtype, device and layout
    (strides equal but on size-1 dims); other allocations are made as usual. Yields the list of the targets handed
    out so far, which the caller reads afterwards: a value in one of them that is not where it belongs must be
    moved out of it before another value is written there (:meth:`cudnnkit.jax._cuda.CudaRunner.write_all`).

    Handing out a target is safe for what the call returns and for its temporaries (their work is queued before the
    writes that follow the call), not for memory kept past the call (a cached DropoutState's RNG states: XLA
    reuses its buffers): allocations made under :func:`~cudnnkit.runtime.adapters.lasting` are never handed one."""
    old = (_current.targets, _current.claimed)
    claimed: list[DeviceArray] = []
    _current.targets, _current.claimed = [t for t in targets if 0 not in t.shape], claimed
    try:
        yield claimed
    finally:
        _current.targets, _current.claimed = old


def _claim(shape: tuple, strides: tuple, dtype: str, device: int) -> DeviceArray | None:
    targets = _current.targets
    for i, t in enumerate(targets or ()):
        if t.shape == shape and t.dtype == dtype and t.device == device and same_layout(shape, t.strides, strides):
            del targets[i]  # type: ignore[union-attr]
            _current.claimed.append(t)
            return DeviceArray(shape, strides, dtype, device, t.ptr, t)
    return None


@contextlib.contextmanager
def on_stream(device: int, stream: int) -> Iterator[None]:
    """Make ``stream`` of ``device`` this thread's current one for :data:`ADAPTER` (and its primary context the
    current CUDA context) within the block: the L2 calls of an XLA handler then allocate and run on XLA's
    stream."""
    old = (_current.device, _current.stream)
    _current.device, _current.stream = int(device), int(stream)
    try:
        with driver.pushed(device):
            yield
    finally:
        _current.device, _current.stream = old


def _extent(shape: tuple, strides: tuple, dtype: str) -> int:
    if any(d == 0 for d in shape):
        return 0
    return (1 + sum((d - 1) * s for d, s in zip(shape, strides))) * itemsize(dtype)


class DeviceArray:
    """A strided device array over :class:`~cudnnkit.runtime.driver.DeviceMemory` (or over memory another
    object owns: ``base``), with a ``__cuda_array_interface__`` for the dtypes it can name."""

    __slots__ = ("shape", "strides", "dtype", "device", "ptr", "base")

    def __init__(self, shape: tuple, strides: tuple, dtype: str, device: int, ptr: int, base: Any):
        self.shape, self.strides, self.dtype = tuple(shape), tuple(strides), dtype
        self.device, self.ptr, self.base = int(device), int(ptr), base

    @property
    def __cudnnkit_adapter__(self) -> RawAdapter:
        return ADAPTER

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)

    def reshape(self, shape: tuple) -> DeviceArray:
        """A C-contiguous array's view with a new shape (what the declarations ask of a bias: ``(1, C, 1, 1)``);
        any other layout is refused (its elements are not in C order)."""
        shape = tuple(shape)
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(math.prod(self.shape) // known if d == -1 else d for d in shape)
        if math.prod(shape) != math.prod(self.shape) or self.strides != contiguous_strides(self.shape):
            raise ValueError(f"cannot view a {self.shape} array with strides {self.strides} as {shape}")
        return DeviceArray(shape, contiguous_strides(shape), self.dtype, self.device, self.ptr, self)

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype}, cuda:{self.device}, {self.ptr:#x})"


class RawAdapter(ArrayAdapter):
    """The adapter of :class:`DeviceArray` (see the module docstring)."""

    name = "cudnnkit"
    module = None
    types = (DeviceArray,)

    def view(self, obj: Any, name: str) -> ArrayView:
        if not isinstance(obj, DeviceArray):
            raise TypeError(f"{name}: a {type(obj).__name__} is not a cudnnkit DeviceArray")
        return ArrayView(obj.shape, obj.strides, obj.dtype, obj.device, obj.ptr, obj, self)

    def empty(self, shape: tuple, dtype: str, device: int, strides: tuple | None = None,
              stream: int | None = None) -> DeviceArray:  # fmt: skip
        shape = tuple(int(d) for d in shape)
        strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        if _current.targets and not is_lasting():  # memory kept past the call never lands in a result buffer
            got = _claim(shape, strides, dtype, int(device))
            if got is not None:
                return got
        arena = _current.arena
        if arena is not None and arena.device == device:
            return DeviceArray(shape, strides, dtype, device, arena.take(_extent(shape, strides, dtype)), arena)
        s = self.current_stream(device) if stream is None else int(stream)
        mem = driver.DeviceMemory(_extent(shape, strides, dtype), device, s)
        return DeviceArray(shape, strides, dtype, device, mem.ptr, mem)

    def wrap(self, obj: Any, device: int) -> DeviceArray:
        if isinstance(obj, DeviceArray):
            return obj
        from ..arrays import as_view

        v = as_view(obj, "array")
        return DeviceArray(v.shape, v.strides, v.dtype, v.device, v.ptr, obj)

    def contiguous(self, arr: DeviceArray, stream: int | None = None) -> DeviceArray:
        if arr.strides == contiguous_strides(arr.shape):
            return arr
        new = self.empty(arr.shape, arr.dtype, arr.device, None, stream)
        self.copy(new, arr, stream)
        return new

    def copy(self, dst: DeviceArray, src: DeviceArray, stream: int | None = None) -> None:
        """``src`` into ``dst`` on ``stream``: ``cuMemcpyDtoDAsync`` for one dense layout, else
        ``cudnnTransformTensor`` with ``dst``'s device made current around it (its primary context pushed: the
        calling thread's current device may be another, e.g. outside an XLA handler's :func:`on_stream`)."""
        s = self.current_stream(dst.device) if stream is None else int(stream)
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"copy of a {src.dtype} {src.shape} array into a {dst.dtype} {dst.shape} one")
        if math.prod(src.shape) == 0:
            return
        if dst.strides == src.strides and is_dense(src.shape, src.strides):
            driver.copy_async(dst.ptr, src.ptr, _extent(src.shape, src.strides, src.dtype), s, dst.device)
            return
        from ... import lib
        from ..descriptors import tensor_descriptor
        from ..dtypes import scaling_ref
        from ..handle import get_handle

        one, zero = scaling_ref(src.dtype, 1.0), scaling_ref(src.dtype, 0.0)
        with driver.pushed(dst.device):  # a cuDNN handle is used with its own device current
            h = get_handle(dst.device, s, self)
            lib.cudnnTransformTensor(h, one, tensor_descriptor(src.dtype, src.shape, src.strides), src.ptr, zero,
                                     tensor_descriptor(dst.dtype, dst.shape, dst.strides), dst.ptr)  # fmt: skip

    def from_numpy(self, a: Any, device: int, stream: int | None = None) -> DeviceArray:
        import numpy as np

        host = np.ascontiguousarray(a)
        from ..dtypes import canonical

        arr = self.empty(host.shape, canonical(host.dtype.name, "array"), device, None, stream)
        s = self.current_stream(device) if stream is None else int(stream)
        driver.upload_async(arr.ptr, host.ctypes.data, host.nbytes, s, device)  # staged before it returns
        return arr

    def to_numpy(self, arr: DeviceArray) -> Any:
        import numpy as np

        src = self.contiguous(arr)
        out = np.empty(arr.shape, np.float32 if arr.dtype == "bfloat16" else arr.dtype)
        if arr.dtype == "bfloat16":
            raw = np.empty(arr.shape, np.uint16)
            driver.download(raw.ctypes.data, src.ptr, raw.nbytes, self.current_stream(arr.device), arr.device)
            out[...] = (raw.astype(np.uint32) << 16).view(np.float32)
            return out
        driver.download(out.ctypes.data, src.ptr, out.nbytes, self.current_stream(arr.device), arr.device)
        return out

    def key(self, obj: Any) -> tuple | None:
        """The express path's key of a :class:`DeviceArray` (see :mod:`cudnnkit.runtime.adapters`): everything
        ``view`` reads but the pointer. A repeated call inside an XLA handler (a jitted function's every call
        hands it buffers of the same shapes) then skips the checks, routing and planning the full sequence
        repeats (measured on the H200 before this: a jitted 8x64 softmax's handler spent ~440 us of its ~850 under
        cProfile in the full sequence)."""
        if type(obj) is not DeviceArray:
            return None
        return (self, obj.dtype, obj.shape, obj.strides, obj.device), obj.ptr, self

    def current_stream(self, device: int) -> int:
        return _current.stream if device == _current.device else 0

    def current_device(self) -> int:
        return _current.device

    def device_guard(self, device: int) -> Any:
        return driver.pushed(device)

    def pointer_device(self, ptr: int) -> int | None:
        try:
            info = driver.pointer_info(ptr)
        except Exception:
            return None
        return info.device if info.kind in ("device", "managed") and info.device >= 0 else None

    def is_device_array(self, obj: Any) -> bool | None:
        return True if isinstance(obj, DeviceArray) else None

    def refuse_special_stream(self, stream: int, name: str = "stream") -> None:
        return None

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("cudnnkit")
        except PackageNotFoundError:  # run from a source tree
            return "source"

    def device_count(self) -> int:
        return driver.device_count()

    def device_info(self, i: int) -> tuple[str, tuple[int, int]]:
        return driver.device_info(i)

    def synchronize(self, device: int) -> None:
        driver.synchronize(device)


ADAPTER = RawAdapter()
POINTER[DeviceArray] = lambda obj: obj.ptr
KEYED[DeviceArray] = ADAPTER.key  # not a library the package imports by name: registered here, as it loads
