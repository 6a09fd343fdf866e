"""Described values (:mod:`.model`) made real, for one backend.

* :class:`FakeBackend` (the CPU tier): arrays are :class:`FakeArray` objects that describe a fake device
  allocation through ``__cuda_array_interface__`` (nothing is ever dereferenced), of two fake libraries with an
  adapter each ("fakeA" is the case's library, "fakeB" the other one), so outputs, copies and mixed-library calls
  take the same paths as with CuPy and torch. :meth:`FakeBackend.install` also fakes the CUDA driver's two queries
  (:mod:`cudnnkit.runtime.driver`: fake allocations and fake streams are known to it, garbage is not) and puts a
  gate at the device: every cuDNN function that takes a handle, and every handle lookup, raises
  :class:`ReachedDevice`. A valid call on the CPU therefore ends in ``ReachedDevice``, which tells it apart from a
  refusal, while everything up to the device (array views, checks, descriptors) runs for real.
* :class:`GpuBackend` (the GPU tier): CuPy or torch arrays, each made as a strided view over a 1-d allocation
  holding the logical values (so every layout, overlapping and expanded ones included, is one code path), outputs
  poisoned with NaN, read-only or bare-CAI arrays as ``__cuda_array_interface__`` wrappers over them.

``fill_values`` draws an array's logical float64 values; ``seen`` rounds them to what the dtype holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import math
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np

from .model import DROP, A, Opaque, layout_strides

__all__ = ["ReachedDevice", "FakeArray", "FakeAdapter", "FakeBackend", "GpuBackend", "fill_values", "seen"]


class ReachedDevice(Exception):
    """Raised by the CPU tier's gate when a call gets as far as the device (a handle or a handle-taking cuDNN
    function): everything before the device accepted the call."""


# ----------------------------------------------------------------- values

_INT_DTYPES = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64, "bool": np.bool_}


def fill_values(fill: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Logical float64 values for an array of ``shape``: ``fill`` is "normal", "normal:<scale>",
    "uniform:<lo>:<hi>", "positive", "zeros", "ones", "int:<lo>:<hi>", "probs" (softmax over the last axis)."""
    shape = tuple(max(d, 0) for d in shape)
    kind, _, rest = fill.partition(":")
    if kind == "normal":
        return rng.standard_normal(shape) * (float(rest) if rest else 1.0)
    if kind == "uniform":
        lo, hi = (float(v) for v in rest.split(":"))
        return rng.uniform(lo, hi, shape)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "nan":
        return np.full(shape, np.nan)
    if kind == "ones":
        return np.ones(shape)
    if kind == "int":
        lo, hi = (int(v) for v in rest.split(":"))
        return rng.integers(lo, hi + 1, shape).astype(np.float64)
    if kind == "probs":
        z = rng.standard_normal(shape)
        if z.size == 0:
            return z
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    raise ValueError(f"unknown fill {fill!r}")


def _bf16_round(a: np.ndarray) -> np.ndarray:
    f = np.asarray(a, np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(f), np.nan, out)


def seen(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` as an array of ``dtype`` holds them, back in float64."""
    v = np.asarray(values, np.float64)
    if dtype == "bfloat16":
        return _bf16_round(v)
    if dtype in _INT_DTYPES:
        with np.errstate(invalid="ignore"):
            return np.nan_to_num(v).round().astype(_INT_DTYPES[dtype]).astype(np.float64)
    if dtype.startswith("float8"):
        return v
    with np.errstate(over="ignore"):
        return v.astype(dtype).astype(np.float64)


def host_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype holding ``dtype`` (bfloat16 through ml_dtypes; float32 without it)."""
    if dtype == "bfloat16":
        if importlib.util.find_spec("ml_dtypes") is not None:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(np.float32)
    if dtype.startswith("float8"):
        return np.dtype(np.uint8)
    return np.dtype(dtype)


_ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_TYPESTR = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "bfloat16": "<V2",
    "int8": "|i1",
    "uint8": "|u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "|b1",
    "float8_e4m3fn": "|V1",
    "float8_e5m2": "|V1",
}


def itemsize(dtype: str) -> int:
    return _ITEMSIZE[dtype]


def logical(a: A, rng: np.random.Generator, values: np.ndarray | None = None) -> np.ndarray:
    """The logical values of array ``a`` as its dtype holds them (expanded layouts repeat along the axis,
    overlapping ones are what the shared memory holds)."""
    if a.values is not None:
        v = np.asarray(a.values, np.float64).reshape(a.shape) if a.size else np.zeros(a.shape)
    elif values is not None:
        v = np.asarray(values, np.float64)
    else:
        v = fill_values(a.fill, a.shape, rng)
    if a.layout[0] == "expand" and a.size:
        ax = a.layout[1]
        v = np.broadcast_to(np.take(v, [0], axis=ax), v.shape).copy()
    elif a.layout[0] == "overlap" and a.size:
        strides, n, off = layout_strides(a.shape, a.layout)
        buf = np.zeros(n)
        np.lib.stride_tricks.as_strided(buf[off:], a.shape, [s * 8 for s in strides])[...] = v
        v = np.lib.stride_tricks.as_strided(buf[off:], a.shape, [s * 8 for s in strides]).copy()
    return seen(v, a.dtype)


def buffer_of(a: A, v: np.ndarray) -> tuple[np.ndarray, tuple[int, ...], int]:
    """The 1-d host buffer (in ``a.dtype``'s host type) holding ``v`` at ``a``'s layout: (buffer, strides, offset).
    Elements outside the view are NaN (floats) or -1 (integers)."""
    strides, n, off = layout_strides(a.shape, a.layout)
    hd = host_dtype(a.dtype)
    poison = -1 if a.dtype in _INT_DTYPES else np.nan
    buf64 = np.full(n, poison, np.float64)
    if a.size:
        view = np.lib.stride_tricks.as_strided(buf64[off:], a.shape, [s * 8 for s in strides])
        view[...] = v
    if a.dtype == "bool":
        return (buf64 > 0.5).astype(np.bool_), strides, off
    if a.dtype in _INT_DTYPES:
        return np.nan_to_num(buf64, nan=-1).astype(hd), strides, off
    return buf64.astype(hd), strides, off


class _DeviceAllocation:
    """A device allocation of exactly ``nbytes`` of its own (``cuMemAlloc``), freed when collected.

    A small buffer from an array library's caching allocator is a slice of a larger segment, and the driver
    (``cuMemGetAddressRange``) answers with the segment: cudnnkit's size check sees the segment, so only a
    buffer that is its own allocation tests that a too-small raw pointer is refused."""

    def __init__(self, nbytes: int):
        cuda = ctypes.CDLL("libcuda.so.1")
        ctx = ctypes.c_void_p()
        cuda.cuCtxGetCurrent(ctypes.byref(ctx))
        if not ctx.value:  # the array libraries made device 0's primary context current on this thread
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
            cuda.cuCtxSetCurrent(ctx)
        ptr = ctypes.c_uint64()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        if rc != 0:
            raise RuntimeError(f"cuMemAlloc({nbytes}) failed with CUresult {rc}")
        self._cuda, self.ptr = cuda, ptr.value

    def __del__(self):
        self._cuda.cuMemFree_v2(ctypes.c_uint64(self.ptr))


# ----------------------------------------------------------------- CAI objects


class CaiObject:
    """A bare ``__cuda_array_interface__`` object (no adapter) over a device allocation it keeps alive."""

    def __init__(self, cai: dict, owner: Any, device: int | None = 0, dtype_name: str | None = None):
        self.__cuda_array_interface__ = cai
        self._owner = owner
        if device is not None:
            self.device = device
        if dtype_name is not None:
            self.dtype = SimpleNamespace(name=dtype_name)

    def __repr__(self) -> str:
        c = self.__cuda_array_interface__
        return f"<CaiObject {c.get('typestr')} {c.get('shape')}>"


def make_cai(a: A, shape, strides_el, ptr: int, owner: Any, device: int = 0) -> CaiObject:
    isz = itemsize(a.dtype)
    cai = {
        "shape": tuple(shape),
        "typestr": _TYPESTR[a.dtype],
        "strides": tuple(s * isz for s in strides_el),
        "data": (ptr, bool(a.readonly)),
        "version": 3,
    }
    for k, v in a.cai:
        if v == DROP:
            cai.pop(k, None)
        else:
            cai[k] = v
    lied = any(k == "typestr" for k, _ in a.cai)  # a lying typestr goes without the dtype attribute bfloat16 needs
    return CaiObject(cai, owner, device, "bfloat16" if a.dtype == "bfloat16" and not lied else None)


# ----------------------------------------------------------------- the fake backend


class FakeArray:
    """A fake device array of fake library ``lib`` ("fakeA" or "fakeB"): metadata only, plus the host values of
    index arrays (so ``to_numpy`` can answer)."""

    __slots__ = ("shape", "dtype", "strides", "ptr", "lib", "readonly", "device", "host", "__weakref__")

    def __init__(self, shape, dtype, strides, ptr, lib, readonly=False, device=0, host=None):
        self.shape, self.dtype, self.strides = tuple(shape), dtype, tuple(strides)
        self.ptr, self.lib, self.readonly, self.device, self.host = ptr, lib, readonly, device, host

    @property
    def __cuda_array_interface__(self) -> dict:
        isz = itemsize(self.dtype)
        return {
            "shape": self.shape,
            "typestr": _TYPESTR[self.dtype],
            "strides": tuple(s * isz for s in self.strides),
            "data": (self.ptr, self.readonly),
            "version": 3,
        }

    def __repr__(self) -> str:
        return f"<FakeArray {self.lib} {self.dtype}{list(self.shape)} strides={self.strides} ptr={self.ptr:#x}>"


class FakeStream:
    """A stream object of a fake library (``.ptr``, like CuPy's), known to the fake driver."""

    def __init__(self, ptr: int, device: int = 0):
        self.ptr = ptr
        self.device = device


def _contig(shape) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(tuple(shape)):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


class FakeAdapter:
    """The adapter of one fake library: every method of the adapter interface
    (:mod:`cudnnkit.runtime.adapters`), none touching a device. Given another library's array it fails the way a
    real library does (an ``AttributeError``), so a library mixing adapters shows."""

    def __init__(self, name: str, backend: FakeBackend):
        self.name = name
        self.module = None
        self._b = backend

    def _own(self, obj: Any, what: str = "get_device") -> FakeArray:
        if not isinstance(obj, FakeArray) or obj.lib != self.name:
            raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{what}'")
        return obj

    def view(self, obj: Any, name: str):
        from cudnnkit.runtime import ArrayView

        a = self._own(obj)
        return ArrayView(a.shape, a.strides, a.dtype, a.device, a.ptr, a, self, a.readonly)

    def key(self, obj: Any) -> tuple:
        """The express path's key (the optional adapter member): what ``view`` reads, and the pointer."""
        a = self._own(obj)
        return (self, a.dtype, a.shape, a.strides, a.device, a.readonly), a.ptr, self

    def empty(self, shape, dtype, device, strides=None, stream=None):
        shape = tuple(int(d) for d in shape)
        strides = _contig(shape) if strides is None else tuple(strides)
        n = 1 + sum((d - 1) * abs(s) for d, s in zip(shape, strides)) if 0 not in shape else 0
        if n * itemsize(dtype) > 2**40:
            raise MemoryError(f"fake allocation of {n * itemsize(dtype)} bytes")
        return FakeArray(shape, dtype, strides, self._b.alloc(n * itemsize(dtype), device), self.name, device=device)

    def wrap(self, obj: Any, device: int):
        if isinstance(obj, FakeArray):
            if obj.lib == self.name:
                return obj
            return FakeArray(obj.shape, obj.dtype, obj.strides, obj.ptr, self.name, obj.readonly, obj.device, obj.host)
        from cudnnkit.runtime import as_view

        v = as_view(obj, "array")
        return FakeArray(v.shape, v.dtype, v.strides, v.ptr, self.name, v.readonly, v.device)

    def contiguous(self, arr, stream=None):
        a = self._own(arr, "contiguous")
        if a.strides == _contig(a.shape):
            return a
        new = self.empty(a.shape, a.dtype, a.device)
        new.host = a.host
        return new

    def copy(self, dst, src, stream=None):
        self._own(dst, "copy_")
        if isinstance(src, FakeArray) and src.lib == self.name:
            return
        raise TypeError(f"copy_(): argument 'src' must be a {self.name} array, not {type(src).__name__}")

    def current_stream(self, device):
        return 0

    def current_device(self):
        return 0

    def device_guard(self, device):
        return contextlib.nullcontext()

    def pointer_device(self, ptr):
        return None

    def from_numpy(self, a, device, stream=None):
        a = np.asarray(a)
        dt = a.dtype.name if a.dtype.name in _ITEMSIZE else "float32"
        out = self.empty(a.shape, dt, device)
        out.host = a.astype(np.float64)
        return out

    def to_numpy(self, arr):
        a = self._own(arr, "cpu")
        if a.host is not None:
            return np.asarray(a.host).reshape(a.shape)
        return np.zeros(a.shape)

    def version(self):
        return "0"

    def device_count(self):
        return 2  # the fakes' arrays live on cuda:0 or, under a device mutation, cuda:1

    def device_info(self, i):
        return ("fake", (9, 0))

    def synchronize(self, device):
        return None


class _FakeHandle:
    """What ``Launch.handle`` gives under the gate: never reaches cuDNN (every handle-taking function is gated)."""

    ptr = 0
    device = 0
    stream = 0

    def __int__(self) -> int:
        return 0

    @property
    def _as_parameter_(self) -> int:
        raise ReachedDevice("a cuDNN handle was passed to a cuDNN function")


def _gate(what: str):
    def gated(*args: Any, **kwargs: Any) -> Any:
        raise ReachedDevice(what)

    gated.__name__ = what
    return gated


_FAKE_BASE, _FAKE_STEP = 0x7F0000000000, 0x1000000


class FakeBackend:
    """The CPU tier's backend (see the module docstring). ``install()`` before use, ``uninstall()`` after."""

    name = "fake"
    gpu = False
    libs = ("fakeA", "fakeB")

    def __init__(self) -> None:
        self.adapters = {n: FakeAdapter(n, self) for n in self.libs}
        self._next = itertools.count(1)
        self.allocations: dict[int, tuple[int, int]] = {}  # base -> (nbytes, device)
        self.streams: dict[int, int] = {}  # handle -> device
        self._saved: list[tuple[Any, str, Any]] = []
        self._keep: list[Any] = []

    # ------------------------------------------------------------- fake device memory and streams

    def alloc(self, nbytes: int, device: int = 0) -> int:
        base = _FAKE_BASE + next(self._next) * _FAKE_STEP  # 16 MiB apart: a pointer's allocation is found directly
        self.allocations[base] = (max(int(nbytes), 1), device)
        if len(self.allocations) > 100000:
            self.allocations.clear()
        return base

    def stream(self, device: int = 0) -> FakeStream:
        h = 0x600000000000 + next(self._next) * 0x100
        self.streams[h] = device
        return FakeStream(h, device)

    def _pointer_info(self, ptr: int, device: int | None = None):
        from cudnnkit.runtime import driver

        base = ptr - (ptr - _FAKE_BASE) % _FAKE_STEP if ptr >= _FAKE_BASE else -1
        hit = self.allocations.get(base)
        if hit is None:
            return driver.PointerInfo("unknown", -1, 0, 0)
        n, dev = hit
        return driver.PointerInfo("device", dev, base, n)

    def _stream_device(self, handle: int) -> int | None:
        return self.streams.get(handle)

    # ------------------------------------------------------------- the gate

    def _patch(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    def install(self) -> None:
        from cudnnkit import lib
        from cudnnkit.runtime import adapters, driver, handle
        from cudnnkit.runtime.launch import Launch

        real_for_object, real_available = adapters.for_object, adapters.available
        fakes = self.adapters

        def for_object(obj: Any) -> Any:
            if isinstance(obj, FakeArray):
                return fakes[obj.lib]
            return real_for_object(obj)

        self._patch(adapters, "for_object", for_object)
        self._patch(adapters, "available", lambda: [fakes["fakeA"], *real_available()])
        self._patch(adapters, "in_use", lambda: [fakes["fakeA"], *real_available()])
        self._patch(driver, "pointer_info", self._pointer_info)
        self._patch(driver, "stream_device", self._stream_device)
        self._patch(Launch, "handle", property(lambda self: _FakeHandle()))
        original = handle.get_handle
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("cudnnkit") and getattr(mod, "get_handle", None) is original:
                self._patch(mod, "get_handle", _gate("get_handle"))
        for fname, proto in lib.FUNCTIONS.items():
            if "cudnnHandle_t" in proto.c_decl.partition("(")[2]:
                self._patch(lib, fname, _gate(fname))

    def uninstall(self) -> None:
        while self._saved:
            obj, name, old = self._saved.pop()
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

    @contextlib.contextmanager
    def installed(self):
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    # ------------------------------------------------------------- values

    def array(self, a: A, v: np.ndarray, lib: str, other: str | None) -> Any:
        """A fake (or host) object for ``a`` whose logical values are ``v``."""
        if a.lib in ("host", "list", "torch_cpu"):
            return host_object(a, v)
        strides, n, off = layout_strides(a.shape, a.layout)
        isz = itemsize(a.dtype)
        base = self.alloc(n * isz, a.device)
        ptr = base + off * isz
        host = v if a.dtype in _INT_DTYPES and v is not None else None
        if a.lib == "cai" or a.readonly or a.cai:
            return make_cai(a, a.shape, strides, ptr, None, a.device)
        name = "fakeB" if a.lib == "other" else "fakeA"
        return FakeArray(a.shape, a.dtype, strides, ptr, name, a.readonly, a.device, host)

    def opaque(self, o: Opaque, ctx: Any, name: str = "extra") -> Any:
        if o.kind == "object":
            return object()
        if o.kind == "host_ptr":
            buf = ctypes.create_string_buffer(4096)
            self._keep.append(buf)
            return ctypes.addressof(buf)
        if o.kind == "small_ptr":
            return self.alloc(int(o.arg))
        if o.kind == "ptr_of":
            arr = ctx.make(o.arg, name)  # its values are the reference's for that argument
            self._keep.append(arr)
            return pointer_of(arr) + int(o.arg2)
        if o.kind in ("stream_other", "stream_new"):
            return self.stream()
        if o.kind == "cpu_dlpack":
            return _CpuDLPack()
        raise ValueError(o.kind)

    def to_host(self, obj: Any) -> np.ndarray | None:
        """Values of an output: the fake backend has none (shape checks only)."""
        return None

    def shape_of(self, obj: Any) -> tuple[int, ...] | None:
        if isinstance(obj, FakeArray):
            return obj.shape
        cai = getattr(obj, "__cuda_array_interface__", None)
        return tuple(cai["shape"]) if isinstance(cai, dict) and "shape" in cai else None

    def dtype_of(self, obj: Any) -> str | None:
        return obj.dtype if isinstance(obj, FakeArray) else None

    def sync(self) -> None:
        return None

    def lib_object(self, lib: str) -> Any:
        return self.adapters["fakeA"]


_MISSING = object()


class _CpuDLPack:
    """A host array seen only through DLPack (device type kDLCPU)."""

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("a host DLPack object must not be consumed")


def host_object(a: A, v: np.ndarray) -> Any:
    """A NumPy array, a nested list or a torch CPU tensor holding ``v`` (host data where a device array belongs)."""
    arr = v.astype(host_dtype(a.dtype)) if a.dtype not in ("bfloat16",) else v.astype(np.float32)
    if a.lib == "list":
        return arr.tolist()
    if a.lib == "torch_cpu" and importlib.util.find_spec("torch") is not None:
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr))
    return arr


def pointer_of(obj: Any) -> int:
    """The data pointer of a device array (any library, CAI or fake)."""
    if isinstance(obj, FakeArray):
        return obj.ptr
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if hasattr(obj, "data_ptr"):
        return int(obj.data_ptr())
    raise TypeError(f"no pointer for {type(obj).__name__}")


# ----------------------------------------------------------------- the GPU backend


class GpuBackend:
    """CuPy and torch arrays on device 0 (see the module docstring); ``lib`` is chosen per case."""

    name = "gpu"
    gpu = True

    def __init__(self, libs: tuple[str, ...]):
        from cudnnkit.runtime import adapters

        self.libs = libs
        self.adapters = {n: adapters.get(n) for n in libs}
        self._keep: list[Any] = []

    def install(self) -> None:
        return None

    def uninstall(self) -> None:
        return None

    @contextlib.contextmanager
    def installed(self):
        yield self

    def _lib(self, a: A, lib: str, other: str | None) -> str:
        if a.lib == "other" and other in self.adapters:
            return other
        return lib

    def array(self, a: A, v: np.ndarray, lib: str, other: str | None) -> Any:
        if a.lib in ("host", "list", "torch_cpu"):
            return host_object(a, v)
        name = self._lib(a, lib, other)
        ad = self.adapters[name]
        buf, strides, off = buffer_of(a, v)
        base = ad.from_numpy(buf, 0)
        if ad.view(base, "base").dtype != a.dtype:  # bfloat16 without ml_dtypes: uploaded as float32
            base = base.to(ad.torch_dtype(a.dtype)) if name == "torch" else base.astype(host_dtype(a.dtype))
        isz = itemsize(a.dtype)
        if a.lib == "cai" or a.readonly or a.cai:
            ptr = ad.view(base, "base").ptr + off * isz
            return make_cai(a, a.shape, strides, ptr, base, 0)
        return strided(name, base, a.shape, strides, off)

    def opaque(self, o: Opaque, ctx: Any, name: str = "extra") -> Any:
        if o.kind == "object":
            return object()
        if o.kind == "host_ptr":
            buf = ctypes.create_string_buffer(4096)
            ctx.keep.append(buf)
            return ctypes.addressof(buf)
        if o.kind == "small_ptr":
            buf = _DeviceAllocation(max(int(o.arg), 1))
            ctx.keep.append(buf)
            return buf.ptr
        if o.kind == "ptr_of":
            arr = ctx.make(o.arg, name)  # its values are the reference's for that argument
            ctx.keep.append(arr)
            return pointer_of(arr) + int(o.arg2)
        if o.kind == "stream_new":
            return new_stream(ctx.case.lib)
        if o.kind == "stream_other":
            other = ctx.case.other if ctx.case.other in self.adapters else ctx.case.lib
            return new_stream(other)
        if o.kind == "cpu_dlpack":
            return _CpuDLPack()
        raise ValueError(o.kind)

    def to_host(self, obj: Any) -> np.ndarray | None:
        if isinstance(obj, CaiObject):
            owner = obj._owner
            cai = obj.__cuda_array_interface__
            name = next(n for n, ad in self.adapters.items() if _is_lib(owner, n))
            ad = self.adapters[name]
            base_ptr = ad.view(owner, "owner").ptr
            isz = int(np.dtype(cai["typestr"]).itemsize) if cai["typestr"] != "<V2" else 2
            off = (int(cai["data"][0]) - base_ptr) // isz
            strides = tuple(s // isz for s in cai["strides"])
            return self.to_host(strided(name, owner, cai["shape"], strides, off))
        for name, ad in self.adapters.items():
            if _is_lib(obj, name):
                return np.asarray(ad.to_numpy(obj), dtype=np.float64)
        return None

    def shape_of(self, obj: Any) -> tuple[int, ...] | None:
        shape = getattr(obj, "shape", None)
        if shape is not None:
            return tuple(int(d) for d in shape)
        cai = getattr(obj, "__cuda_array_interface__", None)
        return tuple(cai["shape"]) if cai else None

    def dtype_of(self, obj: Any) -> str | None:
        for name, ad in self.adapters.items():
            if _is_lib(obj, name):
                return ad.view(obj, "out").dtype
        return None

    def sync(self) -> None:
        for ad in self.adapters.values():
            ad.synchronize(0)

    def lib_object(self, lib: str) -> Any:
        return self.adapters[lib]


def _is_lib(obj: Any, name: str) -> bool:
    return type(obj).__module__.partition(".")[0] == name


def strided(lib: str, base: Any, shape, strides, offset: int) -> Any:
    """A view of the 1-d device array ``base`` with element ``strides`` starting at element ``offset``."""
    shape, strides = tuple(int(d) for d in shape), tuple(int(s) for s in strides)
    if lib == "torch":
        if any(s < 0 for s in strides):
            raise ValueError("torch has no negative strides")
        return base.as_strided(shape, strides, offset)
    import cupy

    isz = base.dtype.itemsize
    return cupy.ndarray(shape, base.dtype, base.data + offset * isz, tuple(s * isz for s in strides))


def new_stream(lib: str) -> Any:
    if lib == "torch":
        import torch

        return torch.cuda.Stream(0)
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


def dims_ok(shape: Any) -> bool:
    """Whether ``shape`` is a tuple of non-negative ints small enough to allocate (a shape a backend can make)."""
    try:
        return all(isinstance(d, int) and 0 <= d for d in shape) and math.prod(shape) < 2**28
    except TypeError:
        return False
