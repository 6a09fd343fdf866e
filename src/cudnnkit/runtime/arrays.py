"""A small, framework-free view of a CUDA array.

:func:`as_view` reads shape, element strides, dtype, device and data pointer from

* a library that has an adapter (CuPy, torch): through the adapter, so dtypes
  like bfloat16 are named exactly and outputs can be allocated like the input;
* any object with ``__cuda_array_interface__`` (v2/v3), e.g. JAX or Numba arrays;
* any object with ``__dlpack__``/``__dlpack_device__`` on a CUDA device.

Host arrays (NumPy, torch CPU tensors), non-CUDA devices and mixed devices are
rejected with a ``TypeError``/``ValueError`` that names the argument, before
any GPU work.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any

from . import adapters
from .dtypes import canonical, itemsize

__all__ = ["ArrayView", "as_view", "same_device", "is_contiguous", "is_dense", "like_strides", "contiguous_strides"]


@dataclass(slots=True)
class ArrayView:
    """Shape, element strides, dtype name, device ordinal and data pointer of a CUDA array.

    Read-only by convention (not frozen: it is built on every call, and a
    frozen dataclass costs several times more to construct).

    ``owner`` keeps the underlying array (or DLPack capsule) alive; ``adapter``
    is the array library's adapter, or ``None`` for a library without one
    (such arrays can be inputs, but outputs need ``out=``).
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str
    device: int
    ptr: int
    owner: Any
    adapter: Any = None
    readonly: bool = False
    #: the producer's stream from ``__cuda_array_interface__`` v3 (None when not given or not CAI)
    stream: int | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def library(self) -> str:
        return self.adapter.name if self.adapter is not None else "unknown"

    def is_contiguous(self) -> bool:
        return is_contiguous(self.shape, self.strides)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (C-contiguous) element strides for ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return all(s == c for d, s, c in zip(shape, strides, contiguous_strides(shape)) if d != 1)


def is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True if the array covers its memory exactly once in some axis order (C order, NHWC, ...)."""
    order = sorted(range(len(shape)), key=lambda i: -strides[i])
    perm = tuple(shape[i] for i in order)
    return all(strides[i] == c for i, c, d in zip(order, contiguous_strides(perm), perm) if d != 1)


def like_strides(v: ArrayView) -> tuple[int, ...] | None:
    """Strides for an output laid out like ``v``: ``v``'s own if it is dense, else None (C order)."""
    return v.strides if is_dense(v.shape, v.strides) else None


# ------------------------------------------------------------------ CAI

_TYPESTR = {
    "<f4": "float32",
    "<f8": "float64",
    "<f2": "float16",
    "|i1": "int8",
    "|u1": "uint8",
    "<i4": "int32",
    "<i8": "int64",
    "|b1": "bool",
}


def _from_cai(obj: Any, name: str) -> ArrayView:
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr)
    if dtype is None:
        descr = getattr(getattr(obj, "dtype", None), "name", None)
        try:
            dtype = canonical(descr) if descr else None
        except TypeError:
            dtype = None
    if dtype is None:
        raise TypeError(f"{name}: __cuda_array_interface__ typestr {typestr!r} is not a type cuDNN supports")
    shape = tuple(int(d) for d in cai["shape"])
    isz = itemsize(dtype)
    if cai.get("strides") is None:
        strides = contiguous_strides(shape)
    else:
        strides = _element_strides(cai["strides"], isz, name)
    ptr, readonly = cai["data"]
    ptr = int(ptr or 0)
    device = _pointer_device(ptr, obj, name)
    stream = cai.get("stream")
    return ArrayView(
        shape, strides, dtype, device, ptr, obj, None, bool(readonly), None if stream is None else int(stream)
    )


def _element_strides(byte_strides, isz: int, name: str) -> tuple[int, ...]:
    out = []
    for s in byte_strides:
        if int(s) % isz:
            raise ValueError(f"{name}: byte stride {s} is not a multiple of the item size {isz}")
        out.append(int(s) // isz)
    return tuple(out)


def _pointer_device(ptr: int, obj: Any, name: str) -> int:
    """Device ordinal of a CAI object: its ``device`` attribute if it has one, else ask an adapter."""
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):
        v = getattr(dev, attr, None)
        if isinstance(v, int):
            return v
    if isinstance(dev, int):
        return dev
    if ptr == 0:
        return 0
    for ad in adapters.available():
        d = ad.pointer_device(ptr)
        if d is not None:
            return d
    raise TypeError(
        f"{name}: cannot tell which CUDA device holds this {type(obj).__name__}; "
        "install CuPy or torch so cudnnkit can query the pointer"
    )


# ------------------------------------------------------------------ DLPack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CPU, _DL_CUDA, _DL_CUDA_MANAGED = 1, 2, 13
_DL_CODES = {
    (0, 8): "int8",
    (0, 32): "int32",
    (0, 64): "int64",
    (1, 8): "uint8",
    (2, 16): "float16",
    (2, 32): "float32",
    (2, 64): "float64",
    (4, 16): "bfloat16",
    (6, 8): "bool",
}
_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any, name: str) -> ArrayView:
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) == _DL_CPU:
        raise _host_error(obj, name)
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise TypeError(f"{name}: DLPack device type {int(dev_type)} is not CUDA; cudnnkit needs a CUDA array")
    capsule = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise TypeError(f"{name}: DLPack dtype (code={t.dtype.code}, bits={t.dtype.bits}) is not supported")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    ptr = (t.data or 0) + t.byte_offset
    # the capsule stays un-consumed and is kept alive with the view: its destructor frees it
    return ArrayView(shape, strides, dtype, int(dev_id), ptr, (obj, capsule), None, False)


# ------------------------------------------------------------------ entry


def _host_error(obj: Any, name: str) -> TypeError:
    return TypeError(
        f"{name} is a host array ({type(obj).__module__}.{type(obj).__name__}); cudnnkit needs a CUDA array "
        "(a CuPy array, a torch tensor on a CUDA device, or any object with __cuda_array_interface__ "
        "or a CUDA __dlpack__)"
    )


def as_view(obj: Any, name: str = "array") -> ArrayView:
    """Read a CUDA array; ``name`` is the argument name used in error messages."""
    if isinstance(obj, ArrayView):
        return obj
    ad = adapters.for_object(obj)
    if ad is not None:
        return ad.view(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, name)
    if hasattr(obj, "__array_interface__"):
        raise _host_error(obj, name)
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, name)
    if hasattr(obj, "__array__"):
        raise _host_error(obj, name)
    raise TypeError(
        f"{name} must be a CUDA array (CuPy, torch, or an object with __cuda_array_interface__ or __dlpack__), "
        f"got {type(obj).__module__}.{type(obj).__name__}"
    )


def same_device(*views: tuple[str, ArrayView | None]) -> int:
    """Check that every named view is on one device; return that device.

    ``same_device(("x", vx), ("w", vw))`` raises ``ValueError`` naming both arguments otherwise.
    """
    first: tuple[str, ArrayView] | None = None
    for name, v in views:
        if v is None:
            continue
        if first is None:
            first = (name, v)
        elif v.device != first[1].device:
            raise ValueError(
                f"{name} is on cuda:{v.device} but {first[0]} is on cuda:{first[1].device}; "
                "all arrays of one call must be on the same device"
            )
    if first is None:
        raise ValueError("no arrays given")
    return first[1].device
