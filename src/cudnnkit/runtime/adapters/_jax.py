"""The JAX adapter: eager L2 calls on JAX GPU arrays, outside ``jit`` (under transforms, use ``cudnnkit.jax``).

* **Stream.** cudnnkit's work for JAX arrays runs on the device's stream for external ready events
  (``Device.get_stream_for_external_ready_events()``, what ``jax.dlpack.from_dlpack`` hands a producer).
* **In.** A JAX array is read through ``__dlpack__(stream=that stream)``: JAX makes it ready for that stream first;
  the capsule is kept with the view (it keeps JAX's buffer alive). JAX arrays are immutable: their views are
  read-only, so an in-place write or ``out=`` into one is refused.
* **Out.** A new output is :class:`Pending` memory (``cuMemAllocAsync`` on that stream) while the call runs;
  when :func:`cudnnkit.ops._primitive.run` returns it, it becomes a JAX array through
  ``jax.dlpack.from_dlpack`` of a :class:`~cudnnkit.runtime.dlpack.Exported` (no copy), so its ready event
  follows the work that wrote it. The memory is freed (``cuMemFree``) when JAX releases the array.
* A traced value (inside ``jit``, ``grad``, ``vmap``), a CPU/TPU array or a sharded one is refused naming the
  argument.

Not yet run on a GPU (issue 14): the GPU tier's tests/gpu/test_jax_gpu.py checks it.
"""

from __future__ import annotations

import threading
from typing import Any

import jax

from .. import driver
from ..arrays import contiguous_strides, view_of_capsule
from ..view import ArrayView
from . import _raw
from ._protocol import ArrayAdapter

__all__ = ["ADAPTER", "JaxAdapter", "Pending"]

_TRACER: Any = getattr(getattr(jax, "core", None), "Tracer", ())


class Pending(_raw.DeviceArray):
    """An output of a call on JAX arrays, before it is handed to JAX (see the module docstring)."""

    __slots__ = ()

    @property
    def __cudnnkit_adapter__(self) -> JaxAdapter:
        return ADAPTER


class JaxAdapter(ArrayAdapter):
    """See the module docstring."""

    name = "jax"
    module = jax
    #: JAX has no per-thread current device: :meth:`current_device` is its default device, while the thread's CUDA
    #: context may be another's (torch's ``set_device`` on the same thread), so each call pushes its device's
    current_is_thread_device = False

    def __init__(self) -> None:
        self._streams: dict[int, int] = {}
        self._lock = threading.Lock()

    def _device(self, device: int) -> Any:
        for d in jax.local_devices():
            if d.platform == "gpu" and d.local_hardware_id == device:
                return d
        raise ValueError(f"JAX sees no GPU with CUDA ordinal {device}")

    def view(self, obj: Any, name: str) -> ArrayView:
        if isinstance(obj, Pending):
            return ArrayView(obj.shape, obj.strides, obj.dtype, obj.device, obj.ptr, obj, self)
        if isinstance(obj, _TRACER):
            raise TypeError(f"{name} is a traced JAX value (inside jit, grad or vmap): the array-level ops take "
                            f"concrete arrays; under transforms use cudnnkit.jax.ops (XLA FFI)")  # fmt: skip
        if not isinstance(obj, jax.Array):
            raise TypeError(f"{name}: a {type(obj).__name__} is not a JAX array")
        devs = list(obj.devices())
        if len(devs) != 1:
            raise TypeError(f"{name} is sharded over {len(devs)} devices; cudnnkit takes single-device arrays")
        d = devs[0]
        if d.platform != "gpu":
            raise TypeError(f"{name} is a JAX array on {d.platform}; cudnnkit needs a CUDA array "
                            "(jax.device_put(x, jax.devices('gpu')[0]))")  # fmt: skip
        cap = obj.__dlpack__(stream=self.current_stream(d.local_hardware_id))
        return view_of_capsule(cap, name, (obj, cap), self, readonly=True)

    def empty(self, shape: tuple, dtype: str, device: int, strides: tuple | None = None,
              stream: int | None = None) -> Pending:  # fmt: skip
        shape = tuple(int(x) for x in shape)
        strides = tuple(strides) if strides is not None else contiguous_strides(shape)
        s = self.current_stream(device) if stream is None else int(stream)
        mem = driver.DeviceMemory(_raw._extent(shape, strides, dtype), device, s, ordered=False)
        return Pending(shape, strides, dtype, device, mem.ptr, mem)

    def finish(self, arr: Pending) -> Any:
        """``arr`` handed to JAX (C order first: a JAX array is row-major), once the work writing it is queued."""
        from .. import dlpack

        if arr.strides != contiguous_strides(arr.shape):
            dense = self.empty(arr.shape, arr.dtype, arr.device)
            _raw.ADAPTER.copy(_raw.DeviceArray(dense.shape, dense.strides, dense.dtype, dense.device, dense.ptr, dense),
                              _raw.DeviceArray(arr.shape, arr.strides, arr.dtype, arr.device, arr.ptr, arr),
                              self.current_stream(arr.device))  # fmt: skip
            arr = dense
        exp = dlpack.Exported(arr.ptr, arr.shape, arr.strides, arr.dtype, arr.device, arr.base)
        return jax.dlpack.from_dlpack(exp)

    def wrap(self, obj: Any, device: int) -> Any:
        if isinstance(obj, (Pending, jax.Array)):
            return obj
        from ..arrays import as_view

        v = as_view(obj, "array")
        return Pending(v.shape, v.strides, v.dtype, v.device, v.ptr, obj)

    def contiguous(self, arr: Any, stream: int | None = None) -> Any:
        if isinstance(arr, jax.Array) or arr.strides == contiguous_strides(arr.shape):
            return arr  # JAX arrays are row-major
        new = self.empty(arr.shape, arr.dtype, arr.device, None, stream)
        self.copy(new, arr, stream)
        return new

    def copy(self, dst: Any, src: Any, stream: int | None = None) -> None:
        if not isinstance(dst, Pending):
            raise TypeError("a JAX array cannot be written: JAX arrays are immutable (let cudnnkit allocate it)")
        s = self.current_stream(dst.device) if stream is None else int(stream)
        v = self.view(src, "src") if not isinstance(src, _raw.DeviceArray) else src
        sv = _raw.DeviceArray(v.shape, v.strides, v.dtype, dst.device, v.ptr, v)
        _raw.ADAPTER.copy(_raw.DeviceArray(dst.shape, dst.strides, dst.dtype, dst.device, dst.ptr, dst), sv, s)

    def from_numpy(self, a: Any, device: int, stream: int | None = None) -> Any:
        return jax.device_put(a, self._device(device))

    def to_numpy(self, arr: Any) -> Any:
        import numpy as np

        if isinstance(arr, Pending):
            arr = self.finish(arr)
        out = np.asarray(arr)
        return out.astype(np.float32) if out.dtype.name == "bfloat16" else out

    def key(self, obj: Any) -> None:
        return None  # no express path: each call goes through the full checks

    def current_stream(self, device: int) -> int:
        s = self._streams.get(device)
        if s is None:
            with self._lock:
                s = self._streams.setdefault(device, int(self._device(device).get_stream_for_external_ready_events()))
        return s

    def current_device(self) -> int:
        d = jax.config.jax_default_device
        if d is not None and getattr(d, "platform", None) == "gpu":
            return int(d.local_hardware_id)
        gpus = [x for x in jax.local_devices() if x.platform == "gpu"]
        return int(gpus[0].local_hardware_id) if gpus else 0

    def device_guard(self, device: int) -> Any:
        return driver.pushed(device)

    def pointer_device(self, ptr: int) -> int | None:
        return _raw.ADAPTER.pointer_device(ptr)

    def is_device_array(self, obj: Any) -> bool | None:
        if isinstance(obj, Pending) or isinstance(obj, _TRACER):
            return True  # a tracer: as_view then says why it cannot be read
        if isinstance(obj, jax.Array):
            try:
                return all(d.platform == "gpu" for d in obj.devices())
            except Exception:
                return None
        return None

    def refuse_special_stream(self, stream: int, name: str = "stream") -> None:
        return None

    def version(self) -> str:
        return jax.__version__

    def device_count(self) -> int:
        try:
            return len([d for d in jax.local_devices() if d.platform == "gpu"])
        except Exception:
            return 0

    def device_info(self, i: int) -> tuple[str, tuple[int, int]]:
        d = self._device(i)
        cc = str(getattr(d, "compute_capability", "0.0")).split(".")
        return d.device_kind, (int(cc[0]), int(cc[1]) if len(cc) > 1 else 0)

    def synchronize(self, device: int) -> None:
        driver.synchronize(device)


ADAPTER = JaxAdapter()
FINISH = {Pending: ADAPTER.finish}
