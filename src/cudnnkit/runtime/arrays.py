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
import numbers
from collections.abc import Mapping
from typing import Any

from . import adapters, driver
from .cache import LRU, MISSING
from .dtypes import canonical, itemsize
from .view import ArrayView, contiguous_strides, is_contiguous

__all__ = [
    "ArrayView",
    "as_view",
    "same_device",
    "is_contiguous",
    "is_dense",
    "like_strides",
    "contiguous_strides",
    "layout_problem",
    "check_device_pointer",
]


def is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True if the array covers its memory exactly once in some axis order (C order, NHWC, ...)."""
    order = sorted(range(len(shape)), key=lambda i: -strides[i])
    perm = tuple(shape[i] for i in order)
    return all(strides[i] == c for i, c, d in zip(order, contiguous_strides(perm), perm) if d != 1)


def like_strides(v: ArrayView) -> tuple[int, ...] | None:
    """Strides for an output laid out like ``v``: ``v``'s own if it is dense, else None (C order)."""
    return v.strides if is_dense(v.shape, v.strides) else None


#: layout_problem's answers by (shape, strides): None for a layout cuDNN takes, else the problem
_layout_cache: LRU[tuple[tuple[int, ...], tuple[int, ...]], str | None] = LRU("arrays.layout_problem", 4096)


def layout_problem(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """Why cuDNN cannot take these element strides as they are, or None when it can.

    * ``"is expanded (stride 0 on a dim of size > 1)"``: a broadcast view (``expand``, ``broadcast_to``);
    * ``"has negative strides"``: a reversed view (CuPy ``x[::-1]``);
    * ``"overlaps itself (two elements share memory)"``: strides that map two indices to one element
      (``as_strided``). Decided by a sufficient test (each stride, in increasing order, reaches past what the
      smaller ones span), so a few exotic interleaved layouts that do not overlap are reported too.

    Size-1 dims and empty arrays never have a problem. Cached per (shape, strides) (an LRU of 4096).
    """
    key = (shape, strides)
    try:
        r = _layout_cache.lookup(key)
    except TypeError:  # unhashable: not a tuple of ints
        return _layout_problem(tuple(shape), tuple(strides))
    if r is MISSING:
        r = _layout_cache.put(key, _layout_problem(shape, strides), count_miss=True)
    return r


def _layout_problem(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    if 0 in shape:
        return None
    dims = [(s, d) for d, s in zip(shape, strides) if d != 1]
    if any(s == 0 for s, _ in dims):
        return "is expanded (stride 0 on a dim of size > 1)"
    if any(s < 0 for s, _ in dims):
        return "has negative strides"
    span = 0  # the largest element offset reachable with the dims seen so far
    for s, d in sorted(dims):
        if s <= span:
            return "overlaps itself (two elements share memory)"
        span += (d - 1) * s
    return None


def check_device_pointer(ptr: Any, nbytes: int, device: int, name: str) -> None:
    """Check that ``ptr`` (a raw address given by the user) points to ``nbytes`` of device memory on ``device``.

    Asks the CUDA driver (``cuPointerGetAttributes``, which never dereferences the pointer): ``ValueError``
    naming ``name`` when ``ptr`` is NULL (and ``nbytes`` > 0), is not CUDA memory (pageable host memory,
    garbage), is page-locked host memory, is on another device, or when its allocation holds fewer than
    ``nbytes`` from ``ptr`` on; ``TypeError`` for a non-int. Managed memory is accepted on any device. Without a
    CUDA driver the pointer cannot be checked: ``ValueError`` (callers offer ``unchecked=True`` to skip this).
    Costs one driver call (about a microsecond); nothing is cached, as allocations come and go.
    """
    if not _is_int(ptr):
        raise TypeError(f"{name} must be a device pointer (an int) or a CUDA array, got {type(ptr).__name__}")
    ptr = int(ptr)
    if ptr == 0:
        if nbytes > 0:
            raise ValueError(f"{name} is a NULL pointer but {nbytes} bytes are needed")
        return
    if not 0 < ptr < 2**64:
        raise ValueError(f"{name}={ptr:#x} is not a device pointer (pointers are unsigned 64-bit)")
    try:
        info = driver.pointer_info(ptr, device)
    except driver.DriverUnavailable as e:
        raise ValueError(f"{name}={ptr:#x}: a raw pointer cannot be checked ({e})") from None
    if info.kind == "unknown":
        raise ValueError(f"{name}={ptr:#x} is not CUDA device memory (a host pointer, freed memory or garbage)")
    if info.kind == "host":
        raise ValueError(f"{name}={ptr:#x} is page-locked host memory; cuDNN needs device memory")
    if info.kind == "device" and info.device != device:
        raise ValueError(f"{name}={ptr:#x} is memory of cuda:{info.device} but the call runs on cuda:{device}")
    if info.size and ptr + nbytes > info.base + info.size:
        have = info.base + info.size - ptr
        raise ValueError(
            f"{name}={ptr:#x}: its allocation holds {have} bytes from there on, but {nbytes} bytes are needed"
        )


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


_CAI_KEYS = ("shape", "typestr", "data", "version")
_INT = frozenset((int,))


def _is_int(v: Any) -> bool:
    """An int (also a NumPy integer), not a bool."""
    t = type(v)
    return t is int or (t is not bool and isinstance(v, numbers.Integral))


def _int_tuple(raw: Any, nonneg: bool) -> tuple[int, ...] | None:
    """``raw`` (a tuple or list) as a tuple of ints (NumPy integers accepted; bools not), or None."""
    if not isinstance(raw, (tuple, list)):
        return None
    if {*map(type, raw)} <= _INT:  # the common case: Python ints only (no per-item Python-level calls)
        out = tuple(raw)
    elif all(_is_int(d) for d in raw):
        out = tuple(int(d) for d in raw)
    else:
        return None
    if nonneg and out and min(out) < 0:
        return None
    return out


def _from_cai(obj: Any, name: str) -> ArrayView:
    cai = obj.__cuda_array_interface__
    if type(cai) is not dict and not isinstance(cai, Mapping):
        raise TypeError(f"{name}: __cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    for key in _CAI_KEYS:
        if key not in cai:
            raise TypeError(f"{name}: __cuda_array_interface__ lacks the required key {key!r}")
    if not _is_int(cai["version"]):
        raise TypeError(f"{name}: __cuda_array_interface__ 'version' must be an int, got {cai['version']!r}")
    if cai.get("mask") is not None:
        raise TypeError(f"{name}: masked arrays (__cuda_array_interface__ 'mask') are not supported")
    typestr = cai["typestr"]
    dtype = _TYPESTR.get(typestr) if type(typestr) is str else None
    if dtype is None:
        if not isinstance(typestr, str):
            raise TypeError(f"{name}: __cuda_array_interface__ 'typestr' must be a str, got {typestr!r}")
        descr = getattr(getattr(obj, "dtype", None), "name", None)
        try:
            dtype = canonical(descr) if descr else None
        except TypeError:
            dtype = None
    if dtype is None:
        raise TypeError(f"{name}: __cuda_array_interface__ typestr {typestr!r} is not a type cuDNN supports")
    shape = _int_tuple(cai["shape"], True)
    if shape is None:
        raise TypeError(
            f"{name}: __cuda_array_interface__ 'shape' must be a tuple of non-negative ints, got {cai['shape']!r}"
        )
    raw = cai.get("strides")
    if raw is None:
        strides = contiguous_strides(shape)
    else:
        byte_strides = _int_tuple(raw, False)
        if byte_strides is None:
            raise TypeError(f"{name}: __cuda_array_interface__ 'strides' must be None or a tuple of ints, got {raw!r}")
        if len(byte_strides) != len(shape):
            raise TypeError(
                f"{name}: __cuda_array_interface__ 'strides' {byte_strides} has {len(byte_strides)} entries for "
                f"{len(shape)} dims (shape {shape})"
            )
        strides = _element_strides(byte_strides, itemsize(dtype), name)
    data = cai["data"]
    if type(data) not in (tuple, list) or len(data) != 2:
        raise TypeError(f"{name}: __cuda_array_interface__ 'data' must be a (pointer, read_only) tuple, got {data!r}")
    ptr, readonly = data
    if type(ptr) is not int:
        if ptr is None:
            ptr = 0
        elif not _is_int(ptr):
            raise TypeError(f"{name}: __cuda_array_interface__ data pointer must be an int, got {ptr!r}")
        ptr = int(ptr)
    if not 0 < ptr < 2**64:
        if ptr != 0:
            raise ValueError(f"{name}: __cuda_array_interface__ data pointer {ptr} is not an unsigned 64-bit address")
        if 0 not in shape:
            raise ValueError(
                f"{name}: __cuda_array_interface__ data pointer is NULL but the array has {math.prod(shape)} "
                f"elements (shape {shape})"
            )
    stream = cai.get("stream")
    if stream is not None and not _is_int(stream):
        raise TypeError(f"{name}: __cuda_array_interface__ 'stream' must be None or an int, got {stream!r}")
    device = _pointer_device(ptr, obj, name)
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
    """Device ordinal of a CAI object: its ``device`` attribute if it has one, else ask an adapter, then the
    CUDA driver."""
    dev = getattr(obj, "device", None)
    for attr in ("id", "index"):
        v = getattr(dev, attr, None)
        if type(v) is int and v >= 0:
            return v
    if type(dev) is int and dev >= 0:
        return dev
    if ptr == 0:
        return 0
    for ad in adapters.in_use():
        d = ad.pointer_device(ptr)
        if d is not None:
            return d
    try:
        info = driver.pointer_info(ptr)
    except driver.DriverUnavailable:
        info = None
    if info is not None and info.device >= 0:
        return info.device
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
# a private prototype (``ctypes.pythonapi``'s function objects are shared by every module in the process)
_capsule_get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _from_dlpack(obj: Any, name: str) -> ArrayView:
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) == _DL_CPU:
        raise _host_error(obj, name)
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        raise TypeError(f"{name}: DLPack device type {int(dev_type)} is not CUDA; cudnnkit needs a CUDA array")
    capsule = obj.__dlpack__()
    return view_of_capsule(capsule, name, (obj, capsule))


def view_of_capsule(capsule: Any, name: str, owner: Any, adapter: Any = None, readonly: bool = False) -> ArrayView:
    """The :class:`ArrayView` of an unconsumed ``"dltensor"`` capsule (a CUDA one: its device is the tensor's),
    ``owner`` kept with it (the capsule among it: its destructor releases the tensor)."""
    t = _DLTensor.from_address(_capsule_get(capsule, b"dltensor"))
    dtype = _DL_CODES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise TypeError(f"{name}: DLPack dtype (code={t.dtype.code}, bits={t.dtype.bits}) is not supported")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    ptr = (t.data or 0) + t.byte_offset
    if not t.data and 0 not in shape:
        raise ValueError(f"{name}: DLPack data pointer is NULL but the array has shape {shape}")
    # the capsule stays un-consumed and is kept alive with the view: its destructor frees it
    return ArrayView(shape, strides, dtype, int(t.device.device_id), ptr, owner, adapter, readonly)


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
