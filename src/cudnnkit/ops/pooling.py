"""N-d pooling on cuDNN's legacy API: ``cudnnPoolingForward`` and ``cudnnPoolingBackward``.

Modes: ``"max"``, ``"max_deterministic"`` (a deterministic backward), ``"avg_include_padding"`` (padded cells
count in the divisor, torch's ``count_include_pad=True``) and ``"avg_exclude_padding"`` (they do not,
``count_include_pad=False``). ``window``, ``stride`` (default: the window) and ``padding`` are an int or one per
spatial dim (1 to 3: a 1-d pooling runs as 2-d with a trailing size-1 window); ``padding`` may also be
``"valid"``/``"same"`` (stride 1) or ``(before, after)`` pairs, and each side must be smaller than the window.
``propagate_nan``: max pooling returns NaN for a window holding one (cuDNN's ``CUDNN_PROPAGATE_NAN``), else
ignores it. ``ceil_mode``: the output size rounds up, as torch defines it
(:func:`cudnnkit.runtime.shapes.pool_padding`). The output shape is
:func:`cudnnkit.runtime.shapes.pool_output_shape`.

This path pads both sides alike: asymmetric padding, and a ``ceil_mode`` that changes the output size (it adds
padding after), are refused by name until the graph path (resample), which takes per-side padding, lands (issue
12). Arrays: ``x`` (N, C, *spatial) dense channels-first or channels-last (another layout is copied); a new ``y``
takes ``x``'s layout; a given ``out`` must be dense. Dtypes: float16, bfloat16, float32, float64. The backward
is cuDNN's legacy one, which needs the forward's ``y`` and ``x`` (for max pooling it finds the maximum again).
Both calls blend: ``out = alpha * result + beta * out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import lib
from ..runtime import DescriptorKind, check_choice, get_cached
from ..runtime.descriptors import int_array
from ..runtime.dtypes import FLOATS, nan_propagation
from ..runtime.shapes import INT32_MAX, expand, pool_output_shape, pool_padding
from ._layout import channels_last_strides
from ._nd import batch1, check_dims, dense, layout_of, nd_tensor, out_view, param_form, same_dtype, with_batch
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["Pooling", "pooling_forward", "pooling_backward"]

_DTYPES = FLOATS  # runtime.dtypes: every float type cuDNN has
_MODES = {
    "max": lib.CUDNN_POOLING_MAX,
    "max_deterministic": lib.CUDNN_POOLING_MAX_DETERMINISTIC,
    "avg_include_padding": lib.CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
    "avg_exclude_padding": lib.CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
}


@dataclass(frozen=True)
class Pooling:
    """A pooling's parameters, for reuse (hashable); see the module docstring. ``stride=None`` is the window."""

    mode: str = "max"
    window: int | tuple[int, ...] = 2
    stride: int | tuple[int, ...] | None = None
    padding: int | tuple[int, ...] | str = 0
    ceil_mode: bool = False
    propagate_nan: bool = False

    def __post_init__(self) -> None:
        check_choice(self.mode, _MODES, "mode")
        if not isinstance(self.ceil_mode, bool):
            raise TypeError(f"ceil_mode must be a bool, got {self.ceil_mode!r}")
        nan_propagation(self.propagate_nan)  # a bool (TypeError naming it)
        object.__setattr__(self, "window", param_form(self.window, "window", 1))
        if self.stride is not None:
            object.__setattr__(self, "stride", param_form(self.stride, "stride", 1))
        object.__setattr__(self, "padding", param_form(self.padding, "padding", 0))


class _Pool(NamedTuple):
    """A call's resolved pooling (hashable)."""

    nsp: int
    mode: str
    nan: bool
    window: tuple[int, ...]  #: cuDNN's spatial dims from here on (2 or 3)
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    y_shape: tuple[int, ...]
    y_strides: tuple[int, ...] | None


def _params(pool: Any, kw: Any) -> Pooling:
    names = ("mode", "window", "stride", "padding", "ceil_mode", "propagate_nan")
    defaults = ("max", 2, None, 0, False, False)
    given = tuple(kw.get(n, d) for n, d in zip(names, defaults))
    if pool is None:
        return Pooling(*given)
    if not isinstance(pool, Pooling):
        raise TypeError(f"pool must be a cudnnkit.ops.Pooling, got {type(pool).__name__}")
    if given != defaults:
        raise TypeError("pass pool= or mode=/window=/stride=/padding=/ceil_mode=/propagate_nan=, not both")
    return pool


def _resolve_for(v: Any, name: str, kw: Any) -> _Pool:
    check_dims(v, name)
    p = _params(kw.get("pool"), kw)
    nsp = v.ndim - 2
    w = expand(p.window, nsp, "window", 1, INT32_MAX)
    s = expand(w if p.stride is None else p.stride, nsp, "stride", 1, INT32_MAX)
    xs = batch1(v.shape)
    y = pool_output_shape(xs, w, stride=s, padding=p.padding, ceil_mode=p.ceil_mode)
    pre, post = pool_padding(xs[2:], w, stride=s, padding=p.padding, ceil_mode=p.ceil_mode)
    if pre != post:
        why = "ceil_mode adds padding after" if p.ceil_mode else "the padding differs between sides"
        raise ValueError(
            f"padding {p.padding!r} (ceil_mode={p.ceil_mode}) pads {pre} before and {post} after ({why}): cuDNN's "
            "legacy pooling pads both sides alike; this needs the graph path (not yet routed here)"
        )
    if nsp == 1:
        w, pre, s = w + (1,), pre + (0,), s + (1,)
    y = with_batch(y, v.shape[0])
    strides = channels_last_strides(y) if layout_of(v) == "nhwc" else None
    return _Pool(nsp, p.mode, p.propagate_nan, w, pre, s, y, strides)


def _fwd_resolve(views: Any, kw: Any) -> _Pool:
    return _resolve_for(views["x"], "x", kw)


def _bwd_resolve(views: Any, kw: Any) -> _Pool:
    vdy, vy, vx = views["dy"], views["y"], views["x"]
    r = _resolve_for(vx, "x", kw)
    for v, name in ((vdy, "dy"), (vy, "y")):
        same_dtype(v, name, vx.dtype, "x")
        if v.shape != r.y_shape:
            raise ValueError(f"{name} must have the forward output's shape {r.y_shape}, got {v.shape}")
    # dx has x's shape and layout
    return r._replace(y_shape=vx.shape, y_strides=channels_last_strides(vx.shape) if layout_of(vx) == "nhwc" else None)


def _set_pool(ptr: int, mode: str, nan: bool, window: tuple, pad: tuple, stride: tuple) -> None:
    lib.cudnnSetPoolingNdDescriptor(
        ptr,
        _MODES[mode],
        nan_propagation(nan),
        len(window),
        int_array(window),
        int_array(pad),
        int_array(stride),
    )


POOLING = DescriptorKind("pooling", "cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor", _set_pool)


def pooling_descriptor(r: _Pool) -> Any:
    """The cached ``cudnnPoolingDescriptor_t`` of a resolved call (``cudnnSetPoolingNdDescriptor``). Host-side."""
    return get_cached(POOLING, (r.mode, r.nan, r.window, r.pad, r.stride))


def _fwd_call(c: Call) -> None:
    r = c.resolved
    vx, _ = dense(c, "x")
    vy = out_view(c, "out")
    lib.cudnnPoolingForward(c.launch.handle, pooling_descriptor(r), c.alpha, nd_tensor(vx, r.nsp), vx.ptr, c.beta,
                            nd_tensor(vy, r.nsp), vy.ptr)  # fmt: skip


def _bwd_call(c: Call) -> None:
    r = c.resolved
    vy, _ = dense(c, "y")
    vdy, _ = dense(c, "dy")
    vx, _ = dense(c, "x")
    vdx = out_view(c, "out")
    lib.cudnnPoolingBackward(
        c.launch.handle,
        pooling_descriptor(r),
        c.alpha,
        nd_tensor(vy, r.nsp),
        vy.ptr,
        nd_tensor(vdy, r.nsp),
        vdy.ptr,
        nd_tensor(vx, r.nsp),
        vx.ptr,
        c.beta,
        nd_tensor(vdx, r.nsp),
        vdx.ptr,
    )


def _strides(r: _Pool) -> tuple[int, ...] | None:
    return r.y_strides


POOLING_FORWARD = register(
    Primitive(
        "pooling_forward",
        inputs=(Operand("x", _DTYPES),),
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_strides, blend=("alpha", "beta")),),
        resolve=_fwd_resolve,
        legacy=_fwd_call,
        empty=lambda r: 0 in r.y_shape,
        family="pooling",
        differentiable=("x",),
        residuals=("x", "out"),
        backward="pooling_backward",
    )
)
POOLING_BACKWARD = register(
    Primitive(
        "pooling_backward",
        inputs=(Operand("dy", _DTYPES), Operand("y", _DTYPES), Operand("x", _DTYPES)),
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_strides, blend=("alpha", "beta")),),
        resolve=_bwd_resolve,
        legacy=_bwd_call,
        empty=lambda r: 0 in r.y_shape,
        family="pooling",
    )
)


def pooling_forward(
    x: Any,
    *,
    mode: str = "max",
    window: int | Sequence[int] = 2,
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | str = 0,
    ceil_mode: bool = False,
    propagate_nan: bool = False,
    pool: Pooling | None = None,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Pool ``x`` ``(N, C, *in)`` -> ``y`` ``(N, C, *out)`` (see the module docstring); ``pool=`` a
    :class:`Pooling` in place of the keywords. ``cudnnPoolingForward`` (primitive :data:`POOLING_FORWARD`)."""
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, ceil_mode=ceil_mode,
              propagate_nan=propagate_nan, pool=pool)  # fmt: skip
    return run(POOLING_FORWARD, {"x": x}, out=out, alpha=alpha, beta=beta, stream=stream, **kw)


def pooling_backward(
    dy: Any,
    y: Any,
    x: Any,
    *,
    mode: str = "max",
    window: int | Sequence[int] = 2,
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | str = 0,
    ceil_mode: bool = False,
    propagate_nan: bool = False,
    pool: Pooling | None = None,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``dx`` (``x``'s shape) of :func:`pooling_forward` from ``dy``, the forward's ``y`` and its input ``x`` (the
    parameters must be the forward's). ``cudnnPoolingBackward`` (primitive :data:`POOLING_BACKWARD`)."""
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, ceil_mode=ceil_mode,
              propagate_nan=propagate_nan, pool=pool)  # fmt: skip
    return run(POOLING_BACKWARD, {"dy": dy, "y": y, "x": x}, out=out, alpha=alpha, beta=beta, stream=stream, **kw)
