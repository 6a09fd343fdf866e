"""Tensor helpers: set, scale, add and transform (``cudnnSetTensor``, ``cudnnScaleTensor``,
``cudnnAddTensor``, ``cudnnTransformTensor``/``cudnnTransformTensorEx``).

All work in place on strided arrays or write a new array, on the input's
library stream. ``scale_tensor``, ``add_tensor`` and ``transform_tensor`` use
calls cuDNN 9 deprecates (still exported by 9.x); ``set_tensor`` is kept.

Dtypes: float16, bfloat16, float32, float64 (cuDNN 9.19's ``cudnnSetTensor``
returns NOT_SUPPORTED for int32, measured on an H200, so integer arrays are
refused up front). Tensors have 1 to 8 dims (fewer than 4 are padded with
trailing size-1 dims for cuDNN).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from typing import Any

from .. import lib
from ..runtime import FLOATS, DescriptorKind, check_dtype, get_cached, prepare, scaling_ref, tensor_descriptor_of
from ..runtime.arrays import ArrayView, contiguous_strides, like_strides
from ..runtime.shapes import expand

__all__ = ["set_tensor", "scale_tensor", "add_tensor", "transform_tensor"]

_log = logging.getLogger("cudnnkit")


def set_tensor(y: Any, value: float, *, stream: Any = None) -> Any:
    """Write ``value`` into every element of ``y`` (any strides, in place); returns ``y``.

    ``cudnnSetTensor``. Elements outside ``y``'s view (gaps of a strided slice) are not touched.
    """
    launch, (v,) = prepare(("y", y), stream=stream)
    check_dtype(v, "y", FLOATS, "set_tensor")
    if v.size:
        with launch.on_device():
            lib.cudnnSetTensor(launch.handle, tensor_descriptor_of(v), v.ptr, scaling_ref(v.dtype, value))
    return y


def scale_tensor(y: Any, alpha: float, *, stream: Any = None) -> Any:
    """``y *= alpha`` in place (any strides); returns ``y``. ``cudnnScaleTensor`` (deprecated in cuDNN 9)."""
    launch, (v,) = prepare(("y", y), stream=stream)
    check_dtype(v, "y", FLOATS, "scale_tensor")
    if v.size:
        with launch.on_device():
            lib.cudnnScaleTensor(launch.handle, tensor_descriptor_of(v), v.ptr, scaling_ref(v.dtype, alpha))
    return y


def add_tensor(a: Any, c: Any, *, alpha: float = 1.0, beta: float = 1.0, stream: Any = None) -> Any:
    """``c = alpha * a + beta * c`` in place, broadcasting ``a``; returns ``c``.

    ``a`` and ``c`` have the same number of dims (at most 5) and dtype; each dim
    of ``a`` equals ``c``'s or is 1 (a bias of shape ``(1, C, 1, 1)`` over an
    ``(N, C, H, W)`` ``c``, for example). ``cudnnAddTensor`` (deprecated in cuDNN 9).
    """
    launch, (va, vc) = prepare(("a", a), ("c", c), stream=stream)
    check_dtype(vc, "c", FLOATS, "add_tensor")
    if va.dtype != vc.dtype:
        raise TypeError(f"a has dtype {va.dtype} but c has dtype {vc.dtype}")
    if va.ndim != vc.ndim:
        raise ValueError(f"a has {va.ndim} dims but c has {vc.ndim}; give a size-1 dims to broadcast")
    if vc.ndim > 5:
        raise ValueError(f"add_tensor supports at most 5 dims, got {vc.ndim}")
    for i, (da, dc) in enumerate(zip(va.shape, vc.shape)):
        if da not in (dc, 1):
            raise ValueError(f"a's dim {i} is {da}; it must equal c's ({dc}) or be 1 to broadcast")
    if vc.size:
        with launch.on_device():
            lib.cudnnAddTensor(
                launch.handle,
                scaling_ref(vc.dtype, alpha),
                tensor_descriptor_of(va),
                va.ptr,
                scaling_ref(vc.dtype, beta),
                tensor_descriptor_of(vc),
                vc.ptr,
            )
    return c


def _set_transform(ptr: int, nbdims: int, fmt: int, before: tuple[int, ...], after: tuple[int, ...]) -> None:
    n = len(before)
    lib.cudnnSetTensorTransformDescriptor(
        ptr,
        nbdims,
        fmt,
        (ctypes.c_int32 * n)(*before),
        (ctypes.c_int32 * n)(*after),
        None,
        lib.CUDNN_TRANSFORM_FOLD,
    )


_TRANSFORM = DescriptorKind(
    "tensor_transform", "cudnnCreateTensorTransformDescriptor", "cudnnDestroyTensorTransformDescriptor", _set_transform
)

_LAYOUTS = {"nchw": lib.CUDNN_TENSOR_NCHW, "nhwc": lib.CUDNN_TENSOR_NHWC}


def _layout_strides(shape: tuple[int, ...], layout: str | None, like: ArrayView) -> tuple[int, ...] | None:
    if layout is None:
        return like_strides(like) if like.shape == shape else None
    if layout == "nchw":
        return contiguous_strides(shape)
    # channels last: N, spatial..., C in memory
    n, c, *sp = shape
    perm = (n, *sp, c)
    cs = contiguous_strides(tuple(perm))
    return (cs[0], cs[-1], *cs[1:-1])


def transform_tensor(
    x: Any,
    *,
    layout: str | None = None,
    pad_before: int | Sequence[int] = 0,
    pad_after: int | Sequence[int] = 0,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Copy ``x`` into another layout, optionally zero-padding each dim: ``y = alpha * x + beta * y``.

    ``layout``: ``"nchw"`` (C order) or ``"nhwc"`` (channels last) for the new
    array; default: like ``x``. ``pad_before``/``pad_after``: an int or one per
    dim (the output is ``x.shape + pad_before + pad_after``; padding is zero).
    Without padding this is ``cudnnTransformTensor``; with padding,
    ``cudnnTransformTensorEx`` with a ``cudnnTensorTransformDescriptor``. Both
    are deprecated in cuDNN 9. ``out`` may be any strided array of the output shape.
    """
    launch, (vx,) = prepare(("x", x), stream=stream)
    check_dtype(vx, "x", FLOATS, "transform_tensor")
    if layout is not None and layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)} or None, got {layout!r}")
    if layout is not None and vx.ndim < 3:
        raise ValueError(f"layout={layout!r} needs at least 3 dims (N, C, spatial...), x has {vx.ndim}")
    nd = vx.ndim
    before = _pads(pad_before, nd, "pad_before")
    after = _pads(pad_after, nd, "pad_after")
    shape = tuple(d + b + a for d, b, a in zip(vx.shape, before, after))
    padded = any(before) or any(after)
    if padded and nd not in (4, 5):
        raise ValueError(f"padding through cudnnTransformTensorEx needs a 4-d or 5-d x, got {nd} dims")
    y, vy = launch.output(out, shape, vx.dtype, strides=_layout_strides(shape, layout, vx), beta=beta)
    if vx.size == 0 or vy.size == 0:
        return y
    if not padded:
        with launch.on_device():
            lib.cudnnTransformTensor(
                launch.handle,
                scaling_ref(vx.dtype, alpha),
                tensor_descriptor_of(vx),
                vx.ptr,
                scaling_ref(vx.dtype, beta),
                tensor_descriptor_of(vy),
                vy.ptr,
            )
        return y
    fmt = lib.CUDNN_TENSOR_NHWC if (layout == "nhwc" or (layout is None and _is_nhwc(vy))) else lib.CUDNN_TENSOR_NCHW
    tdesc = get_cached(_TRANSFORM, (nd, int(fmt), before, after))
    _log.debug("transform_tensor: %s -> %s with pads %s/%s", vx.shape, shape, before, after)
    with launch.on_device():
        lib.cudnnTransformTensorEx(
            launch.handle,
            tdesc,
            scaling_ref(vx.dtype, alpha),
            tensor_descriptor_of(vx),
            vx.ptr,
            scaling_ref(vx.dtype, beta),
            tensor_descriptor_of(vy),
            vy.ptr,
        )
    return y


def _is_nhwc(v: ArrayView) -> bool:
    return v.ndim >= 3 and v.strides[1] == 1 and v.shape[1] > 1


def _pads(p: int | Sequence[int], nd: int, name: str) -> tuple[int, ...]:
    return expand(p, nd, name, 0)
