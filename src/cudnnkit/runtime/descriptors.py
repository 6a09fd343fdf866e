"""Legacy cuDNN descriptors, cached by value.

A descriptor is created once per distinct value (dtype, shape, strides,
parameters) and reused. The cache is bounded (a :class:`~cudnnkit.runtime.cache.LRU`), thread-safe and keyed by
value, never by object identity. Descriptors that carry device state (dropout,
RNN) are not value-cached: they belong to one object (a ``DropoutState``) and
are made with :func:`owned_descriptor`. Eviction only drops the cache's reference: a
descriptor still held by a caller stays valid until that caller lets go, and
is destroyed when the last reference goes.

Descriptor kinds are declared once each with :class:`DescriptorKind`; ops add
their own kinds (pooling, LRN, dropout, RNN, ...) the same way.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Hashable
from typing import Any

from .. import lib
from .cache import LRU, MISSING, clear_all
from .dtypes import canonical, cudnn_dtype

__all__ = [
    "Descriptor",
    "DescriptorKind",
    "DescriptorCache",
    "tensor_descriptor",
    "tensor_descriptor_of",
    "owned_descriptor",
    "register_cache",
    "INT_MAX",
    "IntRangeError",
    "fits_int",
    "int_array",
    "get_cached",
    "TENSOR",
    "cache_info",
    "clear_caches",
]

INT_MAX = 2**31 - 1  #: the largest value cuDNN's int parameters take


class IntRangeError(ValueError):
    """A value given to one of cuDNN's int parameters (a descriptor's dim or stride) is outside ``0..INT_MAX``.
    The ops layer catches it around a legacy call and names the array it belongs to."""


class Descriptor:
    """An owned cuDNN descriptor. ``int(d)`` / ctypes conversion give the raw pointer."""

    __slots__ = ("ptr", "key", "_destroy", "__weakref__")

    def __init__(self, ptr: int, key: Hashable, destroy: Callable[[int], Any]):
        self.ptr = ptr
        self.key = key
        self._destroy = destroy

    @property
    def _as_parameter_(self) -> int:
        return self.ptr

    def __int__(self) -> int:
        return self.ptr

    def __del__(self) -> None:
        if self.ptr:
            try:
                self._destroy(self.ptr)
            except Exception:
                pass
            self.ptr = 0

    def __repr__(self) -> str:
        return f"<Descriptor {self.key!r} at {self.ptr:#x}>"


class DescriptorKind:
    """How to create, set and destroy one kind of legacy descriptor.

    ``setter(ptr, *key)`` configures a fresh descriptor from its key.
    """

    def __init__(self, name: str, create: str, destroy: str, setter: Callable[..., None]):
        self.name = name
        self._create = create
        self._destroy = destroy
        self.setter = setter

    def make(self, key: tuple) -> Descriptor:
        p = ctypes.c_void_p()
        lib.function(self._create)(ctypes.byref(p))
        d = Descriptor(p.value, (self.name, *key), lib.function(self._destroy))
        self.setter(d.ptr, *key)  # if it raises, d is collected and destroyed
        return d


class DescriptorCache:
    """Descriptors keyed by (kind, value): an :class:`~cudnnkit.runtime.cache.LRU` (bounded, thread-safe) whose
    entries are built by their kind's :meth:`DescriptorKind.make`. Eviction only drops the cache's reference."""

    __slots__ = ("lru",)

    def __init__(self, maxsize: int = 1024, name: str = "descriptors"):
        self.lru: LRU[tuple, Descriptor] = LRU(name, maxsize)

    def lookup(self, kind: DescriptorKind, key: tuple) -> Descriptor | None:
        """The cached descriptor for ``key``, or None (no creation)."""
        d = self.lru.lookup((kind.name, *key))
        return None if d is MISSING else d

    def get(self, kind: DescriptorKind, key: tuple) -> Descriptor:
        """The cached descriptor for ``key``, made (outside the lock: cuDNN calls may be slow) on a miss."""
        full = (kind.name, *key)
        d = self.lru.lookup(full)
        if d is not MISSING:
            return d
        return self.lru.put(full, kind.make(key), count_miss=True)  # another thread's, if it stored one first

    @property
    def maxsize(self) -> int | None:
        return self.lru.maxsize

    @property
    def hits(self) -> int:
        return self.lru.hits

    @property
    def misses(self) -> int:
        return self.lru.misses

    def __len__(self) -> int:
        return len(self.lru)

    def clear(self) -> None:
        self.lru.clear()


_cache = DescriptorCache()
_lookup = _cache.lru.lookup  # the hot path's bound method (see tensor_descriptor)
#: tensor keys shorter than their min_dims (as callers pass them) -> their padded descriptor
_short: LRU = LRU("descriptors.short_keys", 4096)


_other_caches: list[Callable[[], None]] = []


def register_cache(clear: Callable[[], None]) -> None:
    """Register the ``clear`` of a cache that is not an :class:`~cudnnkit.runtime.cache.LRU` (those are emptied
    by :func:`clear_caches` already), so that :func:`clear_caches` empties it too."""
    _other_caches.append(clear)


def cache_info() -> dict[str, int]:
    """The descriptor cache's ``{"size", "maxsize", "hits", "misses"}`` (every cache's: ``cache.stats()``)."""
    return _cache.lru.info()


def clear_caches() -> None:
    """Drop every cached descriptor and empty every other cache: each live
    :class:`~cudnnkit.runtime.cache.LRU` (:func:`cudnnkit.runtime.cache.clear_all`), then those registered with
    :func:`register_cache`."""
    clear_all()
    for clear in _other_caches:
        clear()


def int_array(values, what: str = "value") -> ctypes.Array:
    """A C ``int[]`` of ``values``, each checked to fit cuDNN's int (:class:`IntRangeError`, a ``ValueError``
    naming ``what``)."""
    for v in values:
        if not 0 <= v <= INT_MAX:
            raise IntRangeError(f"{what} value {v} does not fit cuDNN's int (0..{INT_MAX})")
    return (ctypes.c_int * len(values))(*values)


def fits_int(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Every dim and stride within cuDNN's int (a size-1 dim's stride aside: it addresses nothing), and the
    elements spanned (``1 + sum((d - 1) * |s|)``) too: ``cudnnSetTensorNdDescriptor`` refuses a larger span with
    NOT_SUPPORTED (measured with cuDNN 9.19 and 9.28: ``(2, 2**30)`` at strides ``(2**30 - 1, 1)`` is taken, at
    ``(2**30, 1)`` it is not), as its documentation's "2 Giga-elements including the padding between dimensions"
    says."""
    if 0 in dims:
        return max(dims, default=0) <= INT_MAX
    if max([*dims, *(abs(s) for d, s in zip(dims, strides) if d != 1)], default=0) > INT_MAX:
        return False
    return 1 + sum((d - 1) * abs(s) for d, s in zip(dims, strides)) <= INT_MAX


def _set_tensor(ptr: int, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    dims, strs = int_array(shape, "shape"), int_array(strides, "stride")
    if not fits_int(shape, strides):  # each value fits, their span does not: cuDNN would answer NOT_SUPPORTED
        raise IntRangeError(f"shape {shape} with strides {strides} spans more than 2**31 - 1 elements")
    lib.cudnnSetTensorNdDescriptor(ptr, cudnn_dtype(dtype), len(shape), dims, strs)


def _size1_stride(s: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """What a size-1 dim's stride ``s`` that cuDNN cannot take is described as: 1 for 0 or less (a broadcast
    view), else the span of the other dims, as C order would give it (capped at cuDNN's int)."""
    if s <= 0:
        return 1
    return min(max([d * abs(t) for d, t in zip(shape, strides) if d != 1], default=1), INT_MAX)


TENSOR = DescriptorKind("tensor", "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor", _set_tensor)


def tensor_descriptor(dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], *, min_dims: int = 4) -> Descriptor:
    """A cached ``cudnnTensorDescriptor_t`` (``cudnnSetTensorNdDescriptor``).

    ``shape`` and ``strides`` (in elements) have 0 to 8 dims (0: a scalar, one element); fewer than
    ``min_dims`` (4, what most cuDNN ops expect; at least 3, what the Nd
    descriptor takes) are padded with trailing size-1 dims (stride 1). Sizes
    must be positive and fit an int.
    """
    if not 3 <= min_dims <= lib.CUDNN_DIM_MAX:
        raise ValueError(f"min_dims must be in [3, {lib.CUDNN_DIM_MAX}], got {min_dims}")
    if type(shape) is tuple and type(strides) is tuple:
        # fast paths: a normalised key (what ArrayView gives, 4 dims or more) is the cache's own key; a shorter
        # one (a 1-d set_tensor, a 3-d CTC) maps to its padded descriptor through _short. No validation on a hit
        try:
            if len(shape) >= min_dims:
                d = _lookup(("tensor", dtype, shape, strides))
            else:
                d = _short.peek((dtype, shape, strides, min_dims), MISSING)
        except TypeError:  # unhashable element
            d = MISSING
        if d is not MISSING:
            return d
    raw = (dtype, shape, strides, min_dims)
    dtype = canonical(dtype)
    shape, strides = tuple(int(d) for d in shape), tuple(int(s) for s in strides)
    # a size-1 dim's stride never addresses memory, but cuDNN refuses 0 (a broadcast view) there, and a value past
    # its int (a one-row slice of a large array)
    strides = tuple(s if d != 1 or 0 < s <= INT_MAX else _size1_stride(s, shape, strides)
                    for d, s in zip(shape, strides))  # fmt: skip
    if len(shape) != len(strides):
        raise ValueError(f"shape {shape} and strides {strides} differ in length")
    if len(shape) > lib.CUDNN_DIM_MAX:
        raise ValueError(f"cuDNN tensors have at most {lib.CUDNN_DIM_MAX} dims, got {len(shape)}")
    if any(d <= 0 for d in shape):
        raise ValueError(f"cuDNN tensor dims must be positive, got shape {shape}")
    padded = len(shape) < min_dims
    while len(shape) < min_dims:
        shape, strides = shape + (1,), strides + (1,)
    d = _cache.get(TENSOR, (dtype, shape, strides))
    if padded and type(raw[1]) is tuple and type(raw[2]) is tuple:
        try:
            _short.put(raw, d)
        except TypeError:  # unhashable element
            pass
    return d


def owned_descriptor(create: str, destroy: str) -> Descriptor:
    """A fresh, uncached descriptor (``create``/``destroy`` are the cuDNN function names),
    for descriptors that belong to one object (a dropout state, an RNN) rather than to a value."""
    p = ctypes.c_void_p()
    lib.function(create)(ctypes.byref(p))
    return Descriptor(p.value, create, lib.function(destroy))


def tensor_descriptor_of(v: Any) -> Descriptor:
    """The cached tensor descriptor of an :class:`~cudnnkit.runtime.ArrayView` (its dtype, shape, strides)."""
    return tensor_descriptor(v.dtype, v.shape, v.strides)


def get_cached(kind: DescriptorKind, key: tuple) -> Descriptor:
    """A cached descriptor of any kind (for ops that declare their own kinds)."""
    return _cache.get(kind, key)
