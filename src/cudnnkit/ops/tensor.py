"""Tensor helpers: set, scale, add and transform (``cudnnSetTensor``, ``cudnnScaleTensor``,
``cudnnAddTensor``, ``cudnnTransformTensor``).

All work in place on strided arrays or write a new array, on the input's
library stream. ``scale_tensor``, ``add_tensor`` and ``transform_tensor`` use
calls cuDNN 9 deprecates (still exported by 9.x); ``set_tensor`` is kept.

Dtypes: float16, bfloat16, float32, float64 (cuDNN 9.19's ``cudnnSetTensor``
returns NOT_SUPPORTED for int32, measured on an H200, so integer arrays are
refused up front). Tensors have 0 to 8 dims (fewer than 4 are padded with
trailing size-1 dims for cuDNN).

Layouts. ``set_tensor`` and ``scale_tensor`` treat each element alone, so the
array's dims are merged wherever its memory allows (a dense array in any axis
order is one dim to cuDNN; cuDNN 9.19 refuses 6-d strided tensors outright),
and what is left of a view with gaps in many dims is covered by several calls.
Arrays written in place (``set_tensor``/``scale_tensor``'s ``y``,
``add_tensor``'s ``c``) are never copied: one that overlaps itself or is
reversed is refused by name (an expanded view is fine for ``set_tensor`` and
``scale_tensor``: each memory location is written once). ``transform_tensor``'s ``out`` may have any
layout, with or without padding (padding is a blend of the whole output, then a transform into its interior).
``transform_tensor`` is also the L3 op of that name (the end of this module): linear, its backward is itself.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import lib
from ..runtime import (
    ELEMENTWISE,
    FLOATS,
    WRITTEN,
    tensor_descriptor,
    tensor_descriptor_of,
)
from ..runtime.arrays import ArrayView, as_view, contiguous_strides, layout_problem, like_strides
from ..runtime.cache import lru
from ..runtime.descriptors import INT_MAX
from ..runtime.dtypes import check_choice, check_dtype, scaling_ref
from ..runtime.shapes import expand
from ._diff import Differentiable, Spec, differentiable, window
from ._layout import check_fits, fits
from ._nd import layout_of
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["set_tensor", "scale_tensor", "add_tensor", "transform_tensor"]

_log = logging.getLogger("cudnnkit")

#: the most strided dims one cudnnSetTensor/cudnnScaleTensor call is given (cuDNN 9.19 refuses 6-d strided
#: tensors with BAD_PARAM or NOT_SUPPORTED; 4-d, what its kernels are written for, is what every call gets)
_CALL_DIMS = 4


@lru("tensor.elementwise_plan", 1024)
def _elementwise_plan(shape: tuple[int, ...], strides: tuple[int, ...]):
    """How an op that treats each element alone (set, scale) covers an array: ``(loop, call_shape, call_strides)``.

    Element order does not matter to such an op, so the array's dims are sorted by stride and every pair that is
    contiguous in memory is merged (a dense array in any axis order becomes one dim; a slice with gaps, a few):
    what cuDNN is given has at most :data:`_CALL_DIMS` dims, whatever the array's. Where more dims than that
    remain (gaps in many dims), the smallest of them are looped over in Python, one call per index (``loop``
    holds their (size, stride)). Merged sizes stay within cuDNN's int."""
    dims = sorted(((d, s) for d, s in zip(shape, strides) if d != 1), key=lambda t: -t[1])
    merged: list[tuple[int, int]] = []
    for d, s in dims:
        if merged and merged[-1][1] == s * d and merged[-1][0] * d <= INT_MAX:
            merged[-1] = (merged[-1][0] * d, s)
        else:
            merged.append((d, s))
    loop: tuple[tuple[int, int], ...] = ()
    if len(merged) > _CALL_DIMS:
        order = sorted(range(len(merged)), key=lambda i: merged[i][0])[: len(merged) - _CALL_DIMS]
        loop = tuple(merged[i] for i in sorted(order))
        merged = [m for i, m in enumerate(merged) if i not in order]
    if not merged:
        merged = [(1, 1)]
    return loop, tuple(d for d, _ in merged), tuple(s for _, s in merged)


@lru("tensor.elementwise", 1024)
def _elementwise_descriptor(dtype: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple, Any]:
    """``(loop, descriptor)`` of :func:`_elementwise_plan` for one array's metadata (checked to fit cuDNN's
    ints), cached: the per-call work is the cuDNN call."""
    loop, shape, strides = _elementwise_plan(shape, strides)
    check_fits("y", shape, strides)
    return loop, tensor_descriptor(dtype, shape, strides)


def _elementwise(launch: Any, v: ArrayView, call: Any, scalar: Any, what: str) -> None:
    """Run ``call(handle, desc, ptr, scalar)`` (``cudnnSetTensor`` or ``cudnnScaleTensor``) over every element of
    ``v`` once, as :func:`_elementwise_plan` says."""
    loop, desc = _elementwise_descriptor(v.dtype, v.shape, v.strides)
    if loop:
        n = math.prod(d for d, _ in loop)
        _log.debug(
            "%s: y (shape %s, strides %s) does not merge into %d dims: %d calls",
            what,
            v.shape,
            v.strides,
            _CALL_DIMS,
            n,
        )
    with launch.on_device():
        handle = launch.handle
        if not loop:
            call(handle, desc, v.ptr, scalar)
            return
        for idx in itertools.product(*(range(d) for d, _ in loop)):
            offset = sum(i * s for i, (_, s) in zip(idx, loop))
            call(handle, desc, v.ptr + offset * v.itemsize, scalar)


def _set_resolve(views: Any, kw: Any) -> Any:
    return scaling_ref(views["y"].dtype, kw["value"], "value", finite=False)


def _scale_resolve(views: Any, kw: Any) -> Any:
    return scaling_ref(views["y"].dtype, kw["alpha"], "alpha")


def _add_resolve(views: Any, kw: Any) -> None:
    va, vc = views["a"], views["c"]
    if va.dtype != vc.dtype:
        raise TypeError(f"a has dtype {va.dtype} but c has dtype {vc.dtype}")
    if va.ndim != vc.ndim:
        raise ValueError(f"a has {va.ndim} dims but c has {vc.ndim}; give a size-1 dims to broadcast")
    if vc.ndim > 5:
        raise ValueError(f"add_tensor supports at most 5 dims, got {vc.ndim}")
    for i, (da, dc) in enumerate(zip(va.shape, vc.shape)):
        if da not in (dc, 1):
            raise ValueError(f"a's dim {i} is {da}; it must equal c's ({dc}) or be 1 to broadcast")


def _add_call(c: Call) -> None:
    va, vc = c.views["a"], c.views["c"]
    check_fits("a", va.shape, va.strides)
    check_fits("c", vc.shape, vc.strides)
    lib.cudnnAddTensor(
        c.launch.handle, c.alpha, tensor_descriptor_of(va), va.ptr, c.beta, tensor_descriptor_of(vc), vc.ptr
    )


def _in_place(name: str, resolve: Any, function: str) -> Primitive:
    """An op that writes every element of ``y`` in place with one scalar (``function``: "cudnnSetTensor" or
    "cudnnScaleTensor", looked up on each call), over :func:`_elementwise`."""
    return register(
        Primitive(
            name,
            inputs=(Operand("y", FLOATS, flags=WRITTEN | ELEMENTWISE),),
            resolve=resolve,
            legacy=lambda c: _elementwise(c.launch, c.views["y"], getattr(lib, function), c.resolved, name),
        )
    )


SET_TENSOR = _in_place("set_tensor", _set_resolve, "cudnnSetTensor")
SCALE_TENSOR = _in_place("scale_tensor", _scale_resolve, "cudnnScaleTensor")
ADD_TENSOR = register(
    Primitive(
        "add_tensor",
        inputs=(Operand("a"), Operand("c", FLOATS, flags=WRITTEN)),
        resolve=_add_resolve,
        legacy=_add_call,
        blend=True,
        returns="c",
        layout_order=("c",),  # the blend factors take c's dtype
    )
)


def set_tensor(y: Any, value: float, *, stream: Any = None) -> Any:
    """Write ``value`` into every element of ``y`` (0 to 8 dims, any strides, in place); returns ``y``.

    ``cudnnSetTensor``, with ``y``'s dims merged where its memory allows (see :func:`_elementwise_plan`); the
    expanded dims of a broadcast view are written once. ``value`` may be NaN or inf. Elements outside ``y``'s
    view (gaps of a strided slice) are not touched. An overlapping or reversed ``y`` is refused by name
    (primitive :data:`SET_TENSOR`).

    Args:
        y: the CUDA array to fill, float16, bfloat16, float32 or float64 (integer arrays are refused: cuDNN 9.19's
            ``cudnnSetTensor`` returns NOT_SUPPORTED for int32).
        value: the value, a real number (converted to ``y``'s dtype).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` itself.

    Example:
        >>> y = cp.empty((8, 16, 32, 32), cp.float32)
        >>> ops.set_tensor(y, 0.0)
    """
    return run(SET_TENSOR, {"y": y}, value=value, stream=stream)


def scale_tensor(y: Any, alpha: float, *, stream: Any = None) -> Any:
    """``y *= alpha`` in place (0 to 8 dims, any strides, dims merged as for :func:`set_tensor`); returns ``y``.

    ``cudnnScaleTensor`` (deprecated in cuDNN 9). ``alpha`` must be finite (primitive :data:`SCALE_TENSOR`).

    Args:
        y: the CUDA array to scale, float16, bfloat16, float32 or float64.
        alpha: the factor, a finite real number.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` itself.

    Example:
        >>> ops.scale_tensor(y, 2.0)
    """
    return run(SCALE_TENSOR, {"y": y}, alpha=alpha, stream=stream)


def add_tensor(a: Any, c: Any, *, alpha: float = 1.0, beta: float = 1.0, stream: Any = None) -> Any:
    """``c = alpha * a + beta * c`` in place, broadcasting ``a``; returns ``c``.

    ``a`` and ``c`` have the same number of dims (at most 5) and dtype, any strides
    (an expanded, overlapping or reversed ``c`` is refused: it is written in place);
    each dim of ``a`` equals ``c``'s or is 1 (a bias of shape ``(1, C, 1, 1)`` over an
    ``(N, C, H, W)`` ``c``, for example). ``cudnnAddTensor`` (deprecated in cuDNN 9; primitive
    :data:`ADD_TENSOR`).

    Args:
        a: the array added, broadcast over ``c``'s shape.
        c: the array written in place; float16, bfloat16, float32 or float64, ``a``'s dtype.
        alpha: scale of ``a``.
        beta: scale of ``c``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``c`` itself.

    Example:
        >>> bias = cp.ones((1, 16, 1, 1), cp.float32)
        >>> ops.add_tensor(bias, y)               # y += bias, per channel
    """
    return run(ADD_TENSOR, {"a": a, "c": c}, alpha=alpha, beta=beta, stream=stream)


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
    array; default: like ``x``. ``pad_before``/``pad_after``: a non-negative int or
    one per dim (the output is ``x.shape + pad_before + pad_after``; padding is
    zero); the padded shape must fit cuDNN's 32-bit descriptors (every dim, and every
    stride of the new array, at most ``2**31 - 1``: ``ValueError`` naming the pads).
    ``out`` may be any strided array of the output shape. Without padding this is one
    ``cudnnTransformTensor``. With padding it is two calls, for any layout and dtype:
    ``cudnnScaleTensor`` of all of ``out`` by ``beta`` (``cudnnSetTensor`` to 0 when
    ``beta == 0``), which leaves the border at ``beta * y``, then ``cudnnTransformTensor`` of
    ``x`` into the interior view of ``out`` with blend 1 (``alpha * x + beta * y`` there).
    ``cudnnTransformTensorEx``, the padding call, is not used: measured on an H200 (cuDNN 9.19) it refuses
    float64 into packed NCHW with ``NOT_SUPPORTED_LAYOUT`` (issue 10's fuzzer). An empty ``x`` with padding
    gives an output of padding alone. Both calls are deprecated in cuDNN 9.

    Args:
        x: the CUDA array to copy; float16, bfloat16, float32 or float64.
        layout: ``"nchw"``, ``"nhwc"``, or None (``x``'s own layout).
        pad_before: zero padding before each dim, an int or one per dim.
        pad_after: zero padding after each dim, an int or one per dim.
        out: an array of the output shape and ``x``'s dtype, any strides; None allocates it in ``layout``.
        alpha: scale of ``x``.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` of shape ``x.shape + pad_before + pad_after``, ``x``'s dtype (``out`` itself when given).

    Example:
        >>> y = ops.transform_tensor(x, layout="nhwc", pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 1))
    """
    kw = dict(layout=layout, pad_before=pad_before, pad_after=pad_after, out=out, alpha=alpha, beta=beta)
    return run(TRANSFORM_TENSOR, {"x": x}, stream=stream, **kw)


class _Transform(NamedTuple):
    before: tuple[int, ...]
    after: tuple[int, ...]
    shape: tuple[int, ...]  # the output's
    padded: bool
    strides: tuple[int, ...] | None  # a new output's (None: C order)
    pads: tuple[Any, Any]  # pad_before and pad_after as given (for messages)


def _transform_resolve(views: Any, kw: Any) -> _Transform:
    vx = views["x"]
    layout = kw.get("layout")
    if layout is not None:
        check_choice(layout, _LAYOUTS, "layout")
    if layout is not None and vx.ndim < 3:
        raise ValueError(f"layout={layout!r} needs at least 3 dims (N, C, spatial...), x has {vx.ndim}")
    nd = vx.ndim
    before = _pads(kw["pad_before"], nd, "pad_before")
    after = _pads(kw["pad_after"], nd, "pad_after")
    shape = tuple(d + b + a for d, b, a in zip(vx.shape, before, after))
    padded = any(before) or any(after)
    strides = None
    pads = (kw["pad_before"], kw["pad_after"])
    if kw.get("out") is None:
        strides = _layout_strides(shape, layout, vx)
        _check_size(shape, strides if strides is not None else contiguous_strides(shape), *pads)
    return _Transform(before, after, shape, padded, strides, pads)


def _transform_call(c: Call) -> None:
    r: _Transform = c.resolved
    vx, vy = c.views["x"], c.views["out"]
    launch = c.launch
    if r.strides is None:  # a given out: its own strides must fit too
        _check_size(r.shape, vy.strides, *r.pads)
    check_fits("x", vx.shape, vx.strides)
    check_fits("out", vy.shape, vy.strides)
    dst_desc, dst_ptr, blend = tensor_descriptor_of(vy), vy.ptr, c.beta
    if r.padded:
        # the border is beta * y: blend all of out first, then write alpha * x + (beta * y) into its interior
        if c.beta._obj.value == 0:
            _elementwise(launch, vy, lib.cudnnSetTensor, scaling_ref(vx.dtype, 0.0), "transform_tensor")
        else:
            _elementwise(launch, vy, lib.cudnnScaleTensor, c.beta, "transform_tensor")
        if vx.size == 0:
            return
        offset = sum(b * st for b, st in zip(r.before, vy.strides)) * vy.itemsize
        # the interior: x's shape with out's strides, starting pad_before into out
        dst_desc, dst_ptr = tensor_descriptor(vy.dtype, vx.shape, vy.strides), vy.ptr + offset
        blend = scaling_ref(vx.dtype, 1.0)
        _log.debug("transform_tensor: %s -> %s with pads %s/%s", vx.shape, r.shape, r.before, r.after)
    lib.cudnnTransformTensor(launch.handle, c.alpha, tensor_descriptor_of(vx), vx.ptr, blend, dst_desc, dst_ptr)


TRANSFORM_TENSOR = register(
    Primitive(
        "transform_tensor",
        inputs=(Operand("x", FLOATS),),
        outputs=(Output("out", shape=lambda r: r.shape, strides=lambda r: r.strides, blend=("alpha", "beta")),),
        resolve=_transform_resolve,
        legacy=_transform_call,
        empty=lambda r: 0 in r.shape,
        differentiable=("x",),  # L3 "transform_tensor": linear, its backward is transform_tensor again
        residuals=("x",),
        backward="transform_tensor",
    )
)


def _check_size(shape: tuple[int, ...], strides: tuple[int, ...], pad_before: Any, pad_after: Any) -> None:
    """The output of ``shape`` (laid out with ``strides``) must fit cuDNN's int dims and strides."""
    if not fits(shape, strides):
        raise ValueError(
            f"pad_before={pad_before!r} and pad_after={pad_after!r} give an output of shape {shape}, too large for "
            f"cuDNN's tensor descriptors: every dim and stride, and the number of elements spanned, must be at most "
            f"{INT_MAX} (2**31 - 1)"
        )


def _packed_as(shape: tuple[int, ...], strides: tuple[int, ...], fmt: str) -> bool:
    """True if ``strides`` are packed ``fmt`` ("nchw": C order, "nhwc": channels last) for ``shape``."""
    want = _layout_strides(shape, fmt, None)  # type: ignore[arg-type]
    return all(s == w for d, s, w in zip(shape, strides, want) if d != 1)


def _is_nhwc(v: ArrayView) -> bool:
    return v.ndim >= 3 and v.strides[1] == 1 and v.shape[1] > 1


def _pads(p: int | Sequence[int], nd: int, name: str) -> tuple[int, ...]:
    return expand(p, nd, name, 0)


# ----------------------------------------------------------------- the L3 declaration


def _transform_l3_forward(x: Any, *, layout: str | None = None, pad_before: int | Sequence[int] = 0,
                          pad_after: int | Sequence[int] = 0) -> Any:  # fmt: skip
    """``y`` = ``x`` in ``layout``, zero-padded by ``pad_before``/``pad_after``: one :func:`transform_tensor`
    (``cudnnTransformTensor``; ``cudnnSetTensor`` of the border first where padded). Residual ``x`` (a
    reference: the backward reads its shape and layout)."""
    return (transform_tensor(x, layout=layout, pad_before=pad_before, pad_after=pad_after),), {"x": x}


def _transform_l3_backward(res: Any, douts: Any, needs: Any, *, layout: str | None = None,
                           pad_before: int | Sequence[int] = 0, pad_after: int | Sequence[int] = 0) -> tuple:  # fmt: skip
    """``dx`` = dy's interior (where padded: a :func:`~cudnnkit.ops._diff.window` of dy, no copy) in x's layout
    (dense NCHW or NHWC with 3 or more dims; else like dy's): one :func:`transform_tensor`
    (``cudnnTransformTensor``)."""
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    vx = as_view(res["x"], "x")
    before = _pads(pad_before, vx.ndim, "pad_before")
    if any(before) or any(_pads(pad_after, vx.ndim, "pad_after")):
        vdy = as_view(dy, "dy")
        if layout_problem(vdy.shape, vdy.strides) is not None:
            # an expanded cotangent (torch's sum() gives one): a dense copy first, so that the window is one of a
            # layout cuDNN takes as it is (a view is never copied by itself: only its whole array could be)
            dy = transform_tensor(dy)
        dy = window(dy, before, vx.shape, "dy")
    back = layout_of(vx) if vx.ndim >= 3 else None
    return (transform_tensor(dy, layout=back),)


def _transform_l3_meta(x: Spec, *, layout: str | None = None, pad_before: int | Sequence[int] = 0,
                       pad_after: int | Sequence[int] = 0) -> Any:  # fmt: skip
    """y as :func:`transform_tensor` allocates it: the padded shape, in ``layout`` (default: x's strides where x
    is dense and unpadded, else C order), x's dtype."""
    check_dtype(x, "x", FLOATS, "transform_tensor")
    vx = ArrayView(tuple(x.shape), tuple(x.strides), x.dtype, 0, 0, None)
    r = _transform_resolve({"x": vx}, dict(layout=layout, pad_before=pad_before, pad_after=pad_after, out=None))
    return (Spec(r.shape, r.strides or contiguous_strides(r.shape), x.dtype),), {"x": x}


TRANSFORM_TENSOR_L3 = differentiable(
    Differentiable("transform_tensor", "transform_tensor", ("x",), ("out",), _transform_l3_forward,
                   _transform_l3_backward, _transform_l3_meta,
                   capture_safe=True,  # cudnnSetTensor / cudnnTransformTensor calls: device work only
                   doc="""y = x copied into layout ("nchw", "nhwc"; default: x's where dense) and zero-padded by
pad_before/pad_after (an int or one per dim), x's float dtype, 0 to 8 dims: one cudnnTransformTensor
(transform_tensor; a cudnnSetTensor of the border first where padded). Linear: dx is dy's interior (a window of dy,
no copy) in x's layout, one cudnnTransformTensor. Residual x (a reference, for its shape and layout).""")
)  # fmt: skip
