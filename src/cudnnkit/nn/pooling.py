"""Pooling with torch.nn.functional's names and semantics: ``max_pool1d/2d/3d`` and ``avg_pool1d/2d/3d``."""

from __future__ import annotations

import math
from typing import Any

from ..runtime.dtypes import FLOATS
from ._common import as_int, batched, call1, cast, check_dtype, dtype_of, from_values, ntuple

__all__ = ["max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d"]


def pool_args(n: int, kernel_size: Any, stride: Any, padding: Any) -> tuple[tuple[int, ...], ...]:
    """``(window, stride, padding)`` as ``n``-tuples; torch's ``stride=None`` (or ``[]``) is the kernel size."""
    window = ntuple(kernel_size, n, "kernel_size")
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        s = window
    else:
        s = ntuple(stride, n, "stride")
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int or {n} ints (torch's pooling takes no string), got {padding!r}")
    p = ntuple(padding, n, "padding")
    check_half_window(window, p)
    return window, s, p


def check_half_window(window: tuple[int, ...], padding: tuple[int, ...]) -> None:
    """torch's rule for its pooling: each dim's padding at most half its window (cuDNN would take more, padding
    windows that hold no input at all); raises torch's ``RuntimeError`` otherwise."""
    for k, p in zip(window, padding):
        if 2 * p > k:
            raise RuntimeError(
                f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} and dilation=1"
            )


def divisor_factor(window: tuple[int, ...], divisor_override: Any) -> float:
    """torch's ``divisor_override``: each window's sum divided by it (whatever ``count_include_pad``). cuDNN's
    include-padding average is the sum over the whole window divided by its size (padding and cells past it count
    as zeros), so the factor ``prod(window) / divisor_override`` turns it into torch's."""
    d = as_int(divisor_override, "divisor_override")
    if d == 0:
        raise RuntimeError("divisor must be not zero")
    return math.prod(window) / d


def include_pad_factor(sizes: tuple, window: tuple, stride: tuple, padding: tuple,
                       out: tuple) -> tuple[tuple[float, ...], ...] | None:  # fmt: skip
    """The factor that turns cuDNN's ceil-mode include-padding average (each window divided by its full size) into
    torch's (divided by the window clipped to the input plus its padding: ``min(start + k, size + pad) - start``
    cells): per spatial dim, ``window / clipped`` at each output position (``out``: the output's spatial dims); the
    factor is their outer product. None where every factor is 1: only the last window of a dim can reach past the
    padding (checked first, without building the vectors)."""
    if all(k <= n + p - ((o - 1) * s - p) for n, k, s, p, o in zip(sizes, window, stride, padding, out)):
        return None
    return tuple(tuple(k / (min(i * s - p + k, n + p) - (i * s - p)) for i in range(o))
                 for n, k, s, p, o in zip(sizes, window, stride, padding, out))  # fmt: skip


def apply_include_pad_factor(y: Any, sizes: Any, window: Any, stride: Any, padding: Any) -> Any:
    """``y`` (N, C, *out) of a ceil-mode include-padding average, as torch's: times :func:`include_pad_factor`,
    in float32 for the half types (float64 for float64) and rounded once to ``y``'s dtype (differentiable for
    torch tensors: the gradient is torch's too)."""
    out = tuple(y.shape[2:])
    per_dim = include_pad_factor(tuple(sizes), tuple(window), tuple(stride), tuple(padding), out)
    if per_dim is None:
        return y
    dt = dtype_of(y)
    acc = "float64" if dt == "float64" else "float32"
    f = None
    for d, v in enumerate(per_dim):  # the outer product of the per-dim vectors, shaped (*out)
        shape = [1] * len(out)
        shape[d] = len(v)
        fd = from_values(y, v, acc).reshape(tuple(shape))
        f = fd if f is None else f * fd
    return cast(cast(y, acc) * f, dt)


def _max_pool(n: int, input: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
              return_indices: Any) -> Any:  # fmt: skip
    fn = f"max_pool{n}d"
    if return_indices:
        raise NotImplementedError(
            f"{fn}: return_indices=True: cuDNN's max-pooling index is the argmax within each window (int8), not "
            "torch's flat index into the input"
        )
    if ntuple(dilation, n, "dilation") != (1,) * n:
        raise NotImplementedError(f"{fn}: dilation={dilation!r}: cuDNN's pooling has no dilation")
    window, s, p = pool_args(n, kernel_size, stride, padding)
    b = batched(input, n, fn)
    check_dtype(input, FLOATS, "input", "cuDNN's pooling")  # torch's max pooling takes integers too
    x = input if b else input[None]
    # torch's max pooling propagates NaN
    y = call1("pooling", x, mode="max", window=window, stride=s, padding=p, ceil_mode=bool(ceil_mode),
              propagate_nan=True)  # fmt: skip
    return y if b else y[0]


def max_pool1d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:  # fmt: skip
    """torch's ``max_pool1d`` (run as 2-d): L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:  # fmt: skip
    """torch's ``max_pool2d``: L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:  # fmt: skip
    """torch's ``max_pool3d``: L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool_nd(n: int, input: Any, kernel_size: Any, stride: Any, padding: Any, ceil_mode: Any,
                count_include_pad: Any, divisor_override: Any) -> Any:  # fmt: skip
    """torch's ``avg_pool{n}d`` (the functional forms' and the ``AvgPool`` twins' one path): L3 ``pooling``, with
    ``divisor_override`` and a ceil-mode window past the padding as factors on the include-padding average."""
    fn = f"avg_pool{n}d"
    window, s, p = pool_args(n, kernel_size, stride, padding)
    b = batched(input, n, fn)
    check_dtype(input, FLOATS, "input", "cuDNN's pooling")
    x = input if b else input[None]
    if divisor_override is not None:
        y = call1("pooling", x, mode="avg_include_padding", window=window, stride=s, padding=p,
                  ceil_mode=bool(ceil_mode)) * divisor_factor(window, divisor_override)  # fmt: skip
        return y if b else y[0]
    mode = "avg_include_padding" if count_include_pad else "avg_exclude_padding"
    y = call1("pooling", x, mode=mode, window=window, stride=s, padding=p, ceil_mode=bool(ceil_mode))
    if count_include_pad and ceil_mode:
        y = apply_include_pad_factor(y, tuple(x.shape[2:]), window, s, p)
    return y if b else y[0]


def avg_pool1d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Any:  # fmt: skip
    """torch's ``avg_pool1d`` (run as 2-d): L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return avg_pool_nd(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Any:  # fmt: skip
    """torch's ``avg_pool2d``: L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return avg_pool_nd(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def avg_pool3d(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Any:  # fmt: skip
    """torch's ``avg_pool3d``: L3 ``pooling``, ``cudnnPoolingForward`` (or the graph's resample)."""
    return avg_pool_nd(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
