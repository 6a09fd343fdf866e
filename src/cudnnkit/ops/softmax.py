"""Softmax and log-softmax, forward and backward (``cudnnSoftmaxForward``/``cudnnSoftmaxBackward``).

Any ``axis`` (negative included) or a tuple of adjacent axes is reduced over.
The array is described to cuDNN as a 4-d tensor ``(N, C, H, 1)`` where ``N``
merges the axes before the reduced ones, ``C`` the reduced axes and ``H`` the
axes after them, keeping the array's own strides (NCHW, NHWC and any other
layout whose groups of axes can be merged are passed without a copy):

* reduced axes trailing (``H == 1``): ``CUDNN_SOFTMAX_MODE_INSTANCE`` over ``(N, C, 1, 1)``;
* otherwise: ``CUDNN_SOFTMAX_MODE_CHANNEL`` over ``(N, C, H, 1)``.

Both modes are one cuDNN call. The choice was measured on an H200 (cuDNN
9.19, ``cudnnSoftmaxForward`` alone, same tensor described both ways): for a
trailing axis INSTANCE over ``(N, C, 1, 1)`` is far faster than CHANNEL on the
same shape for float32 4096x32000 (0.34 against 0.74 ms), within 3% of it for
524288x2048 and 65536x128, and equal in bfloat16; so trailing axes use
INSTANCE. A non-trailing axis has only the CHANNEL form without a copy.

Where a group of axes cannot be merged (for
example a slice with gaps inside the reduced axes) the input is copied to a
contiguous array first, and the copy is logged on the ``cudnnkit`` logger at
debug level. Which mapping was chosen is logged too.

``algo`` is ``"accurate"`` (max-subtracted, ``CUDNN_SOFTMAX_ACCURATE``) or
``"fast"`` (``CUDNN_SOFTMAX_FAST``, no max subtraction: can overflow);
``log=True`` selects ``CUDNN_SOFTMAX_LOG``. The backward pass takes the
forward output ``y`` and ``dy``, never ``x``: for softmax
``dx = y * (dy - sum(dy * y))``, for log-softmax ``dx = dy - exp(y) * sum(dy)``.

Dtypes: float16, bfloat16, float32, float64 (half types compute in float32).
``alpha``/``beta`` blend into ``out``: ``out = alpha * result + beta * out``;
``beta != 0`` needs ``out``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from .. import lib
from ..runtime import FLOATS, check_dtype, prepare, register_cache, scaling_ref, tensor_descriptor
from ..runtime.arrays import ArrayView, like_strides

__all__ = ["softmax_forward", "softmax_backward"]

_log = logging.getLogger("cudnnkit")
_ALGOS = {"accurate": lib.CUDNN_SOFTMAX_ACCURATE, "fast": lib.CUDNN_SOFTMAX_FAST}


def _axes(axis: int | Sequence[int], ndim: int) -> tuple[int, int]:
    """First and last reduced axis (normalised), checking types, range and adjacency."""
    if isinstance(axis, int) and not isinstance(axis, bool):
        items = [axis]
    else:
        try:
            items = list(axis)  # type: ignore[arg-type]
        except TypeError:
            items = [axis]
    if any(isinstance(a, bool) or not isinstance(a, int) for a in items):
        raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}")
    if not items:
        raise ValueError("axis must name at least one axis")
    norm = []
    for a in items:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for an array with {ndim} dims")
        norm.append(a % ndim)
    norm.sort()
    if len(set(norm)) != len(norm) or norm[-1] - norm[0] != len(norm) - 1:
        raise ValueError(f"axis {axis!r} must name distinct adjacent axes")
    return norm[0], norm[-1]


def _merge(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """(size, stride) of a group of axes seen as one, or None if their strides do not allow it."""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    if not dims:
        return 1, 1
    size, stride = dims[-1]
    for d, s in reversed(dims[:-1]):
        if s != stride * size:
            return None
        size *= d
    return size, stride


def _as_4d(
    shape: tuple[int, ...], strides: tuple[int, ...], first: int, last: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ``(N, C, H, 1)`` shape and strides of an array reduced over axes ``first..last``, or None."""
    groups = (slice(0, first), slice(first, last + 1), slice(last + 1, len(shape)))
    merged = [_merge(shape[g], strides[g]) for g in groups]
    if any(m is None for m in merged):
        return None
    (n, sn), (c, sc), (h, sh) = merged  # type: ignore[misc]
    # size-1 groups get a stride consistent with a dense layout (cuDNN checks them)
    if n == 1:
        sn = max(c * sc, h * sh, 1)
    return (n, c, h, 1), (sn, sc, sh, 1)


def _mode(h: int) -> int:
    return lib.CUDNN_SOFTMAX_MODE_INSTANCE if h == 1 else lib.CUDNN_SOFTMAX_MODE_CHANNEL


def _algo(algo: str, log: bool) -> int:
    if algo not in _ALGOS:
        raise ValueError(f"algo must be one of {sorted(_ALGOS)}, got {algo!r}")
    if log:
        if algo == "fast":
            raise ValueError("log=True uses CUDNN_SOFTMAX_LOG; it cannot be combined with algo='fast'")
        return lib.CUDNN_SOFTMAX_LOG
    return _ALGOS[algo]


@functools.lru_cache(maxsize=1024)
def _plan(dtype: str, shape: tuple[int, ...], strides: tuple[int, ...], first: int, last: int):
    """(descriptor, 4-d shape) for a layout and reduced axes, or None if the strides do not merge.

    Cached: a training loop calls softmax on the same layouts over and over.
    """
    got = _as_4d(shape, strides, first, last)
    if got is None:
        return None
    return tensor_descriptor(dtype, *got), got[0]


register_cache(_plan.cache_clear)


def _described(launch, arr: Any, v: ArrayView, first: int, last: int, name: str):
    """``arr`` (copied to C order if its strides do not merge around the axes), its view, descriptor and 4-d shape."""
    planned = _plan(v.dtype, v.shape, v.strides, first, last)
    if planned is None:
        arr, v = launch.contiguous(arr, v, name, f"has strides that do not merge around axes {first}..{last}")
        planned = _plan(v.dtype, v.shape, v.strides, first, last)
    return arr, v, planned[0], planned[1]


def _out_descriptor(v: ArrayView, first: int, last: int) -> Any:
    planned = _plan(v.dtype, v.shape, v.strides, first, last)
    if planned is None:
        raise ValueError(
            f"out's strides {v.strides} cannot be described to cuDNN around axes {first}..{last}; "
            "pass an out laid out like the input, or a contiguous one"
        )
    return planned[0]


def softmax_forward(
    x: Any,
    *,
    axis: int | Sequence[int] = -1,
    algo: str = "accurate",
    log: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Softmax (or log-softmax) of ``x`` over ``axis``; returns ``y`` (``out`` if given).

    ``x``: any shape, float16/bfloat16/float32/float64, any strides. ``y`` has
    ``x``'s shape and dtype (and its strides when ``x`` is dense). Calls
    ``cudnnSoftmaxForward`` once.
    """
    launch, (vx,) = prepare(("x", x), stream=stream)
    check_dtype(vx, "x", FLOATS, "softmax")
    a = _algo(algo, log)
    if vx.ndim == 0:
        raise ValueError("x must have at least one dim")
    first, last = _axes(axis, vx.ndim)
    if vx.size == 0:
        return launch.output(out, vx.shape, vx.dtype, beta=beta)[0]
    if beta != 0 and out is None:
        raise ValueError("beta != 0 blends into an existing output: pass out=")
    if out is not None:  # checked before any copy of x
        y, vy = launch.output(out, vx.shape, vx.dtype, beta=beta)
        y_desc = _out_descriptor(vy, first, last)
    x, vx, x_desc, shape = _described(launch, x, vx, first, last, "x")
    if out is None:
        # like x after any copy (dense layouts keep their strides), so y describes the same way
        y, vy = launch.output(None, vx.shape, vx.dtype, strides=like_strides(vx))
        y_desc = _out_descriptor(vy, first, last)
    _log.debug(
        "softmax_forward: axes %d..%d as %s, mode %s", first, last, shape, "INSTANCE" if shape[2] == 1 else "CHANNEL"
    )
    with launch.on_device():
        lib.cudnnSoftmaxForward(
            launch.handle,
            a,
            _mode(shape[2]),
            scaling_ref(vx.dtype, alpha),
            x_desc,
            vx.ptr,
            scaling_ref(vx.dtype, beta),
            y_desc,
            vy.ptr,
        )
    return y


def softmax_backward(
    dy: Any,
    y: Any,
    *,
    axis: int | Sequence[int] = -1,
    algo: str = "accurate",
    log: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Gradient of softmax (or log-softmax) from its output ``y`` and ``dy``; returns ``dx``.

    ``dy`` and ``y`` have the same shape and dtype; ``algo``/``log``/``axis``
    must be the forward's. Calls ``cudnnSoftmaxBackward`` once; ``x`` is never needed.
    """
    launch, (vdy, vy) = prepare(("dy", dy), ("y", y), stream=stream)
    check_dtype(vdy, "dy", FLOATS, "softmax")
    if vy.shape != vdy.shape:
        raise ValueError(f"y has shape {vy.shape} but dy has shape {vdy.shape}")
    if vy.dtype != vdy.dtype:
        raise TypeError(f"y has dtype {vy.dtype} but dy has dtype {vdy.dtype}")
    a = _algo(algo, log)
    if vdy.ndim == 0:
        raise ValueError("dy must have at least one dim")
    first, last = _axes(axis, vdy.ndim)
    if vdy.size == 0:
        return launch.output(out, vdy.shape, vdy.dtype, beta=beta)[0]
    if beta != 0 and out is None:
        raise ValueError("beta != 0 blends into an existing output: pass out=")
    if out is not None:  # checked before any copy of y or dy
        dx, vdx = launch.output(out, vdy.shape, vdy.dtype, beta=beta)
        dx_desc = _out_descriptor(vdx, first, last)
    y, vy, y_desc, shape = _described(launch, y, vy, first, last, "y")
    dy, vdy, dy_desc, _ = _described(launch, dy, vdy, first, last, "dy")
    if out is None:
        dx, vdx = launch.output(None, vdy.shape, vdy.dtype, strides=like_strides(vdy))
        dx_desc = _out_descriptor(vdx, first, last)
    with launch.on_device():
        lib.cudnnSoftmaxBackward(
            launch.handle,
            a,
            _mode(shape[2]),
            scaling_ref(vy.dtype, alpha),
            y_desc,
            vy.ptr,
            dy_desc,
            vdy.ptr,
            scaling_ref(vy.dtype, beta),
            dx_desc,
            vdx.ptr,
        )
    return dx
