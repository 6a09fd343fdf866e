"""CuPy adapter: views of cupy.ndarray, allocation from the CuPy memory pool, current stream.

bfloat16 arrays come from ``ml_dtypes`` (CuPy 14 reads it); float8 likewise.
"""

from __future__ import annotations

from typing import Any

import cupy

from ..arrays import ArrayView, _element_strides
from ..dtypes import canonical, itemsize
from ._protocol import ArrayAdapter, has_interface, missing_members


def _numpy_dtype(dtype: str):
    import numpy

    name = canonical(dtype)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return numpy.dtype(getattr(ml_dtypes, name))
    return numpy.dtype(name)


class _StreamPointer:
    """A raw ``cudaStream_t`` offered through the CUDA stream protocol."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def _external(ptr: int):
    """A CuPy stream object for a raw ``cudaStream_t`` (``Stream.from_external`` in CuPy 14, else ``ExternalStream``)."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_StreamPointer(ptr))
    return cupy.cuda.ExternalStream(ptr)


class CupyAdapter(ArrayAdapter):
    """The :class:`~cudnnkit.runtime.adapters.ArrayAdapter` of CuPy (``cupy.ndarray``, the CuPy memory pool,
    CuPy's current stream)."""

    name = "cupy"
    module = cupy
    types = (cupy.ndarray,)

    def key(self, obj: Any) -> tuple | None:
        """The express path's key of an array (see :mod:`cudnnkit.runtime.adapters`): its dtype, shape, byte
        strides and device, what :meth:`view` reads."""
        return (self, obj.dtype, obj.shape, obj.strides, obj.device.id), obj.data.ptr, self

    @staticmethod
    def pointer(obj: Any) -> int:
        """The data pointer of an array whose :meth:`key` is known (the replay path)."""
        return obj.data.ptr

    def view(self, obj: Any, name: str) -> ArrayView:
        if not isinstance(obj, cupy.ndarray):
            raise TypeError(f"{name} must be a cupy.ndarray, got {type(obj).__name__}")
        try:
            dtype = canonical(obj.dtype)
        except TypeError:
            raise TypeError(f"{name} has dtype {obj.dtype}, which cuDNN does not support") from None
        strides = _element_strides(obj.strides, itemsize(dtype), name)
        return ArrayView(tuple(obj.shape), strides, dtype, obj.device.id, obj.data.ptr, obj, self, False)

    def empty(self, shape, dtype: str, device: int, strides=None, stream: int | None = None) -> cupy.ndarray:
        nd = _numpy_dtype(dtype)
        try:
            with cupy.cuda.Device(device):
                if stream is not None and stream != self.current_stream(device):
                    with _external(stream):
                        return self._empty(shape, nd, strides)
                return self._empty(shape, nd, strides)
        except cupy.cuda.memory.OutOfMemoryError as e:
            raise MemoryError(str(e)) from e

    def wrap(self, obj: Any, device: int) -> cupy.ndarray:
        if isinstance(obj, cupy.ndarray):
            return obj
        with cupy.cuda.Device(device):
            if has_interface(obj):
                try:
                    got = cupy.asarray(obj)
                except (TypeError, ValueError, RuntimeError):
                    if not hasattr(obj, "__dlpack__"):
                        raise
                else:
                    # a dtype the interface cannot name may come as raw bytes ("|V2" for a bfloat16 tensor,
                    # GPU fuzz seed 27: CuPy's copy into a bfloat16 array then refused the cast); DLPack names it
                    if got.dtype.kind != "V":
                        return got
                    if not hasattr(obj, "__dlpack__"):
                        raise TypeError(
                            f"its __cuda_array_interface__ gives raw bytes (dtype {got.dtype.str}) and it has no "
                            "__dlpack__ to name its dtype"
                        )
            return cupy.from_dlpack(obj)  # e.g. bfloat16, which __cuda_array_interface__ cannot name

    @staticmethod
    def _empty(shape, nd, strides):
        if strides is None:
            return cupy.empty(tuple(shape), dtype=nd)
        extent = 1 + sum((d - 1) * s for d, s in zip(shape, strides) if d > 0) if all(shape) else 0
        mem = cupy.cuda.alloc(max(extent, 1) * nd.itemsize)
        return cupy.ndarray(tuple(shape), dtype=nd, memptr=mem, strides=tuple(s * nd.itemsize for s in strides))

    def from_numpy(self, a, device: int, stream: int | None = None) -> cupy.ndarray:
        with cupy.cuda.Device(device):
            if stream is not None and stream != self.current_stream(device):
                with _external(stream):
                    return cupy.asarray(a)
            return cupy.asarray(a)

    def to_numpy(self, a: cupy.ndarray):
        return cupy.asnumpy(a)

    def contiguous(self, arr: cupy.ndarray, stream: int | None = None) -> cupy.ndarray:
        with arr.device:
            if stream is not None and stream != self.current_stream(arr.device.id):
                with _external(stream):
                    return cupy.ascontiguousarray(arr)
            return cupy.ascontiguousarray(arr)

    def copy(self, dst: cupy.ndarray, src: cupy.ndarray, stream: int | None = None) -> None:
        with dst.device:
            if stream is not None and stream != self.current_stream(dst.device.id):
                with _external(stream):
                    cupy.copyto(dst, src)
                return
            cupy.copyto(dst, src)

    def current_stream(self, device: int) -> int:
        try:
            return cupy.cuda.get_current_stream(device).ptr
        except TypeError:  # CuPy without the device_id argument
            with cupy.cuda.Device(device):
                return cupy.cuda.get_current_stream().ptr

    def current_device(self) -> int:
        return cupy.cuda.runtime.getDevice()

    def is_device_array(self, obj: Any) -> bool | None:
        """True for a ``cupy.ndarray`` (always on a device); None for CuPy's other objects."""
        return True if isinstance(obj, cupy.ndarray) else None

    @staticmethod
    def refuse_special_stream(stream: int, name: str = "stream") -> None:
        """CuPy takes all three special handles (``ExternalStream`` over 0, 1 or 2): nothing is refused."""
        return None

    def device_guard(self, device: int):
        return cupy.cuda.Device(device)

    def pointer_device(self, ptr: int) -> int | None:
        try:
            return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device)
        except Exception:
            return None

    def version(self) -> str:
        return cupy.__version__

    def device_count(self) -> int:
        try:
            return cupy.cuda.runtime.getDeviceCount()
        except Exception:
            return 0

    def device_info(self, i: int) -> tuple[str, tuple[int, int]]:
        p = cupy.cuda.runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        return name, (int(p["major"]), int(p["minor"]))

    def synchronize(self, device: int) -> None:
        with cupy.cuda.Device(device):
            cupy.cuda.get_current_stream().synchronize()
            cupy.cuda.runtime.deviceSynchronize()


ADAPTER = CupyAdapter()
assert not missing_members(CupyAdapter), missing_members(CupyAdapter)
