"""The view of one CUDA array that every layer works with: :class:`ArrayView`, and the C-order stride helpers it
uses. It knows no array library (the adapters build views; :mod:`cudnnkit.runtime.arrays` reads foreign arrays into
them), so any module may import it without an import circle."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .dtypes import itemsize

__all__ = ["ArrayView", "contiguous_strides", "is_contiguous", "same_layout"]


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


def shape_memo(fn: Callable[[tuple[int, ...]], tuple[int, ...]]) -> Callable[[Any], tuple[int, ...]]:
    """Memoize a pure function of a shape tuple in a bounded dict, lock-free (a per-call hot path: every layout
    check and new output asks for strides; :func:`cudnnkit.runtime.cache.lru` takes a lock per lookup). A list
    is computed, not remembered (so is a tuple of a tracer's symbolic sizes); past 8192 shapes the memo starts over."""
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}

    @functools.wraps(fn)
    def get(shape: Any) -> tuple[int, ...]:
        try:
            return memo[shape]
        except (KeyError, TypeError):  # a new shape, or a list
            pass
        got = fn(shape)
        if type(shape) is tuple:
            if len(memo) >= 8192:
                memo.clear()
            try:
                memo[shape] = got
            except TypeError:  # symbolic sizes (a tracer's): computed each time
                pass
        return got

    return get


@shape_memo
def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major (C-contiguous) element strides for ``shape`` (remembered per shape tuple)."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def same_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether element strides ``a`` and ``b`` of ``shape`` address the same elements: equal but on size-1 dims
    (whose stride addresses nothing, and which libraries set to anything)."""
    return all(x == y for d, x, y in zip(shape, a, b) if d != 1)


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return same_layout(shape, strides, contiguous_strides(shape))
