"""Helpers for the N-d ops on channels-first/channels-last arrays (convolution, pooling): which of the two dense
layouts an array has, the copy to C order for any other, the check of a given output, the 1-d-as-2-d descriptor
and the empty-batch shapes."""

from __future__ import annotations

from typing import Any

from ..runtime import tensor_descriptor
from ..runtime.shapes import INT32_MAX, expand
from ._layout import channels_last_strides
from ._primitive import Call

__all__ = [
    "param_form",
    "layout_of",
    "dense",
    "out_view",
    "as_2d",
    "nd_tensor",
    "batch1",
    "with_batch",
    "check_dims",
    "same_dtype",
]


def layout_of(v: Any) -> str | None:
    """ "nchw" (dense C order), "nhwc" (dense channels-last) or None (another layout: copied), size-1 dims aside."""
    if v.is_contiguous():
        return "nchw"
    shape = v.shape
    want = channels_last_strides(shape)
    if all(d == 1 or s == w for d, s, w in zip(shape, v.strides, want)):
        return "nhwc"
    return None


def batch1(shape: tuple) -> tuple:
    """``shape`` with a batch of at least 1: an empty batch has the shapes of a batch of one, with N = 0."""
    return (max(shape[0], 1), *shape[1:])


def with_batch(shape: tuple, n: int) -> tuple:
    return (n, *shape[1:])


def check_dims(v: Any, name: str, rank: int | None = None) -> None:
    if not 3 <= v.ndim <= 5:
        raise ValueError(f"{name} must have 3 to 5 dims (N, C, 1 to 3 spatial), got shape {v.shape}")
    if rank is not None and v.ndim != rank:
        raise ValueError(f"{name} must have {rank} dims like x, got shape {v.shape}")


def same_dtype(v: Any, name: str, dtype: str, ref: str) -> None:
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but {ref} has dtype {dtype}")


def as_2d(shape: tuple, strides: tuple) -> tuple[tuple, tuple]:
    """A 1-d array's (shape, strides) ``(N, C, L)`` with a trailing size-1 spatial dim, whose stride keeps the
    array's layout: 1 in C order, ``C`` for channels-last (cuDNN reads the layout from every stride, size-1 dims
    included, as torch's ``fixSizeOneDimStride`` knows)."""
    channels_last = (
        len(shape) == 3 and strides[1] == 1 and shape[1] > 1 and strides != (shape[1] * shape[2], shape[2], 1)
    )
    return (*shape, 1), (*strides, shape[1] if channels_last else 1)


def dense(c: Call, name: str) -> tuple[Any, str]:
    """``c.views[name]`` in a layout cuDNN takes (dense channels-first or channels-last), copied to C order
    otherwise (logged); and that layout."""
    v = c.views[name]
    lay = layout_of(v)
    if lay is None:
        _, v = c.launch.contiguous(
            c.arrays[name], v, name, "cuDNN takes these arrays dense channels-first (NCHW) or channels-last (NHWC)"
        )
        lay = "nchw"
    return v, lay


def out_view(c: Call, name: str) -> Any:
    v = c.views[name]
    if layout_of(v) is None:
        raise ValueError(
            f"{name} must be dense channels-first (C order) or channels-last, got shape {v.shape} strides {v.strides}"
        )
    return v


def nd_tensor(v: Any, nsp: int, strides: tuple[int, ...] | None = None) -> Any:
    """The tensor descriptor of view ``v`` (its own strides, or ``strides``: the same layout written as another
    array's, whose size-1 dims' strides differ), a 1-d array (``nsp == 1``) as 2-d with a trailing size-1 dim
    (cuDNN's Nd convolution and pooling descriptors take 2 or 3 spatial dims)."""
    shape, strides = v.shape, v.strides if strides is None else strides
    if nsp == 1:
        shape, strides = as_2d(shape, strides)
    return tensor_descriptor(v.dtype, shape, strides)


def param_form(value: Any, name: str, minimum: int) -> Any:
    """A parameter checked for any rank (1 to 3 spatial dims): an int, or a tuple of 1 to 3 ints (for ``padding``
    also ``(before, after)`` pairs, ``"valid"`` or ``"same"``); lists become tuples. Errors name ``name``."""
    if name == "padding" and isinstance(value, str):
        if value not in ("valid", "same"):
            raise ValueError(f"padding must be an int, ints, (before, after) pairs, 'valid' or 'same', got {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        if not 1 <= len(value) <= 3:
            raise ValueError(f"{name} must have 1 to 3 values (one per spatial dim), got {value!r}")
        if name == "padding" and all(isinstance(v, (list, tuple)) for v in value):
            return tuple(tuple(expand(v, 2, "padding", 0, INT32_MAX)) for v in value)
        return expand(tuple(value), len(value), name, minimum, INT32_MAX)
    return expand(value, 1, name, minimum, INT32_MAX)[0]
