"""N-d pooling: cuDNN's legacy ``cudnnPoolingForward``/``cudnnPoolingBackward`` and the graph's resample.

Modes: ``"max"``, ``"max_deterministic"`` (a deterministic backward), ``"avg_include_padding"`` (padded cells
count in the divisor, torch's ``count_include_pad=True``) and ``"avg_exclude_padding"`` (they do not,
``count_include_pad=False``). ``window``, ``stride`` (default: the window) and ``padding`` are an int or one per
spatial dim (1 to 3: a 1-d pooling runs as 2-d with a trailing size-1 window); ``padding`` may also be
``"valid"``/``"same"`` (stride 1) or ``(before, after)`` pairs, and each side must be smaller than the window.
``propagate_nan``: max pooling returns NaN for a window holding one (cuDNN's ``CUDNN_PROPAGATE_NAN``), else
ignores it. ``ceil_mode``: the output size rounds up, as torch defines it
(:func:`cudnnkit.runtime.shapes.pool_padding`), the extra cells as padding after; ``"avg_include_padding"``
divides a window hanging past the declared padding by its whole size, where torch divides by the window clipped
to input plus declared padding (``cudnnkit.nn``'s ``avg_pool`` rescales those cells). The output shape is
:func:`cudnnkit.runtime.shapes.pool_output_shape`.

**Paths.** Where both run, the legacy calls (``cudnnPoolingForward``/``Backward``) are taken: measured faster
(max pool 3x3/2 fp16 NHWC 64x256x56x56: 0.077 ms legacy, 0.204 ms graph resample, H200, cuDNN 9.19). The legacy
descriptor pads both sides alike, so asymmetric padding, and a ``ceil_mode`` that adds padding after, run on the
graph (``OPERATION_RESAMPLE_FWD``/``_BWD``, per-side padding), which also returns max pooling's argmax index
(``return_index=True``) and takes it in the backward (``index=``); the graph path blends through a temporary and
``cudnnAddTensor``. The graph runs channels-last: for channels-first arrays cuDNN 9.19's resample engines have no
max-pooling backward, an average backward that fails at execution and an include-padding forward that leaves the
post-padding out (measured on an H200), so such arrays are copied channels-last and y written through a
channels-last temporary (the forward's index stays channels-last; the backward takes it in any layout).
bfloat16 average pooling is refused on the graph (every engine computes it wrong there, measured), so it runs
where the legacy call takes it; where only the graph can (asymmetric padding, ceil_mode's padding after), the graph
runs on float32 copies (``cudnnTransformTensor`` in, and out into the bfloat16 result with the call's blend).
``settings(prefer=...)`` forces either; :func:`cudnnkit.ops.last_path` says which ran. Arrays: ``x`` (N, C,
*spatial) dense channels-first or channels-last (another layout is copied); a new ``y`` takes ``x``'s layout; a
given ``out`` must be dense. Dtypes: float16, bfloat16, float32, float64. The legacy backward needs the forward's
``y`` and ``x`` (for max pooling it finds the maximum again); the graph's max backward the index. Both calls
blend: ``out = alpha * result + beta * out``. Global average pooling (a window covering each whole unpadded
extent, one output per extent) has a backward of its own on the legacy path: ``dy / cells`` broadcast over each
extent by ``cudnnAddTensor`` (``cudnnPoolingBackward`` took 74 us for the small CNN's 64x64x16x16 float32 global
pool on the H200, cuDNN 9.19).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import lib
from ..graph.checks import as_bool
from ..runtime import DescriptorKind, check_choice, get_cached
from ..runtime.arrays import contiguous_strides
from ..runtime.cache import LRU, MISSING
from ..runtime.descriptors import int_array
from ..runtime.dtypes import FLOATS, nan_propagation, scaling_ref
from ..runtime.shapes import INT32_MAX, expand, pool_output_shape, pool_padding
from ..runtime.view import ArrayView
from ._diff import Differentiable, Spec, differentiable
from ._graphform import Binder, after, channels_last_input, channels_last_output, graph_form
from ._layout import canonical_strides, channels_last_strides, copy_in
from ._nd import (
    as_2d,
    batch1,
    check_dims,
    dense,
    layout_of,
    nd_tensor,
    out_view,
    param_form,
    same_dtype,
    with_batch,  # fmt: skip
)
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
    """A pooling's parameters, for reuse (hashable); see the module docstring. ``stride=None`` is the window.

    Passed as ``pool=`` to :func:`pooling_forward` and :func:`pooling_backward` in place of their keywords; the
    cuDNN pooling descriptor (``cudnnSetPoolingNdDescriptor``) it leads to is cached by value.

    Args:
        mode: ``"max"``, ``"max_deterministic"``, ``"avg_include_padding"`` or ``"avg_exclude_padding"``.
        window: the window, an int or one per spatial dim.
        stride: an int or one per spatial dim; None: the window.
        padding: an int or one per spatial dim, ``(before, after)`` pairs, ``"valid"`` or ``"same"``.
        ceil_mode: round the output size up, as torch does.
        propagate_nan: max pooling returns NaN for a window holding one.

    Example:
        >>> pool = ops.Pooling(mode="max", window=3, stride=2, padding=1)
        >>> y = ops.pooling_forward(x, pool=pool)
        >>> dx = ops.pooling_backward(dy, y, x, pool=pool)
    """

    mode: str = "max"
    window: int | tuple[int, ...] = 2
    stride: int | tuple[int, ...] | None = None
    padding: int | tuple[int, ...] | str = 0
    ceil_mode: bool = False
    propagate_nan: bool = False

    def __post_init__(self) -> None:
        check_choice(self.mode, _MODES, "mode")
        object.__setattr__(self, "ceil_mode", as_bool(self.ceil_mode, "ceil_mode"))  # a NumPy bool too
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
    post: tuple[int, ...] = ()  #: the padding after each spatial dim (``pad``: before); legacy needs them alike
    index: bool = False  #: the forward returns max pooling's argmax index (graph), or the backward takes it
    x_shape: tuple[int, ...] = ()  #: the forward's input shape (the caller's rank)
    index_dtype: str = "int8"
    dtype: str = "float32"  #: x's dtype (the graph refuses bfloat16 averaging)
    #: bfloat16 averaging with padding the legacy call cannot take (asymmetric, ceil_mode's): the graph runs it on
    #: float32 copies (:func:`_in_float32`)
    f32: bool = False


def _index_dtype(window: tuple[int, ...]) -> str:
    """The index dtype that holds a position within the window (int8 up to 127 cells, else int32)."""
    n = 1
    for w in window:
        n *= w
    return "int8" if n <= 127 else "int32"


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
    if nsp == 1:
        w, pre, post, s = w + (1,), pre + (0,), post + (0,), s + (1,)
    y = with_batch(y, v.shape[0])
    strides = channels_last_strides(y) if layout_of(v) == "nhwc" else None
    f32 = v.dtype == "bfloat16" and p.mode.startswith("avg") and pre != post
    return _Pool(nsp, p.mode, p.propagate_nan, w, pre, s, y, strides, post, False, v.shape, _index_dtype(w), v.dtype,
                 f32)  # fmt: skip


def _fwd_resolve(views: Any, kw: Any) -> _Pool:
    r = _resolve_for(views["x"], "x", kw)
    index = kw.get("return_index", False)
    if not isinstance(index, bool):
        raise TypeError(f"return_index must be a bool, got {index!r}")
    if index and not r.mode.startswith("max"):
        raise ValueError(f"return_index=True is for max pooling (its argmax), not mode={r.mode!r}")
    return r._replace(index=index)


def _bwd_resolve(views: Any, kw: Any) -> _Pool:
    vdy, vy, vx, vi = views["dy"], views["y"], views["x"], views.get("index")
    r = _resolve_for(vx, "x", kw)
    for v, name in ((vdy, "dy"), (vy, "y")):
        same_dtype(v, name, vx.dtype, "x")
        if v.shape != r.y_shape:
            raise ValueError(f"{name} must have the forward output's shape {r.y_shape}, got {v.shape}")
    if vi is not None:
        if not r.mode.startswith("max"):
            raise ValueError(f"index is max pooling's argmax: mode={r.mode!r} takes none")
        if vi.shape != r.y_shape or vi.dtype != r.index_dtype:
            raise ValueError(f"index must be the forward's (return_index=True): shape {r.y_shape} and dtype "
                             f"{r.index_dtype}, got {vi.shape} {vi.dtype}")  # fmt: skip
    if vi is None and r.mode.startswith("max") and r.pad != r.post:
        raise ValueError(
            f"padding {r.pad[: r.nsp]} before and {r.post[: r.nsp]} after runs on the graph, whose max-pooling "
            "backward reads the forward's argmax: pass index= (from pooling_forward(..., return_index=True))"
        )
    # dx has x's shape and layout
    return r._replace(y_shape=vx.shape, y_strides=channels_last_strides(vx.shape) if layout_of(vx) == "nhwc" else None,
                      index=vi is not None)  # fmt: skip


def _legacy_refuses(r: _Pool) -> str | None:
    if r.pad != r.post:
        return (f"padding {r.pad[: r.nsp]} before and {r.post[: r.nsp]} after (asymmetric, or ceil_mode adding "
                "padding after): cuDNN's legacy pooling pads both sides alike")  # fmt: skip
    if r.index:
        return "the argmax index, return_index=True or index= (only the graph's resample returns and takes it)"
    return None


def _graph_refuses(r: _Pool, kw: Any) -> str | None:
    if r.dtype == "bfloat16" and r.mode.startswith("avg") and not r.f32:
        # measured on the H200 (cuDNN 9.19): both resample engines that take bfloat16 averaging write wrong values
        # or NaN (the graph layer's resample nodes refuse it too: graph/nodes/resample.py); the legacy call takes
        # it, and what only the graph can take (r.f32) runs on float32 copies
        return "bfloat16 average pooling (cuDNN 9.19 computes it wrong on Hopper with every engine, measured)"
    return None


def _auto(r: _Pool, kw: Any) -> tuple[str, str]:
    # measured on the H200 (cuDNN 9.19): the legacy max pool 3x3/2 fp16 NHWC 64x256x56x56 runs in 0.077 ms, the
    # graph's resample in 0.204 ms
    return "legacy", "the legacy kernel is faster where both run (benchmarks/NOTES.md)"


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


def _same_strides(a: Any, b: Any) -> bool:
    """Whether two views of one shape have one layout (their size-1 dims' strides aside, which address nothing
    and which libraries set to anything): then they are described with the same strides, as cuDNN's
    ``isTensorSameStrides`` check compares them literally (BAD_PARAM, found by the GPU fuzzer)."""
    return canonical_strides(a.shape, a.strides) == canonical_strides(b.shape, b.strides)


def _whole_extent_cells(r: _Pool, vx: Any, vdy: Any) -> int:
    """The window's cell count when an average pools each whole, unpadded spatial extent of ``vx`` to one value
    (global average pooling: ``vdy``'s spatial dims are all 1), else 0. (The backward's resolved ``y_shape`` is
    dx's shape: the forward's output shape is ``dy``'s.)"""
    if not r.mode.startswith("avg") or any(r.pad) or any(r.post) or any(d != 1 for d in vdy.shape[2:]):
        return 0
    spatial = tuple(vx.shape[2:]) + (1,) * (len(r.window) - (len(vx.shape) - 2))
    return math.prod(r.window) if spatial == tuple(r.window) else 0


def _bwd_call(c: Call) -> None:
    r = c.resolved
    cells = _whole_extent_cells(r, c.views["x"], c.views["dy"])
    if cells:  # global average pooling: dx = alpha * dy / cells over each extent, beta * dx blended
        # measured on the H200 (cuDNN 9.19): cudnnPoolingBackward took 74 us for 64x64x16x16 float32 -> 1x1
        vdy, vdx = c.views["dy"], out_view(c, "out")
        scale = scaling_ref(vdx.dtype, c.alpha._obj.value / cells, "alpha")
        lib.cudnnAddTensor(c.launch.handle, scale, nd_tensor(vdy, r.nsp), vdy.ptr, c.beta, nd_tensor(vdx, r.nsp),
                           vdx.ptr)  # fmt: skip
        return
    vy, _ = dense(c, "y")
    vdy = c.views["dy"]
    if not _same_strides(vdy, vy):  # cuDNN needs dy in y's strides (BAD_PARAM "isTensorSameStrides" otherwise)
        _, vdy = copy_in(c.launch, c.arrays["dy"], vdy, vy.strides if not vy.is_contiguous() else None, "dy",
                         "in y's layout")  # fmt: skip
    vx, _ = dense(c, "x")
    vdx = out_view(c, "out")
    if not _same_strides(vx, vdx):  # cuDNN needs dx in x's strides (BAD_PARAM "isTensorSameStrides" otherwise)
        _, vx = copy_in(c.launch, c.arrays["x"], vx, None if vdx.is_contiguous() else vdx.strides, "x",
                        "in out's layout")  # fmt: skip
    lib.cudnnPoolingBackward(
        c.launch.handle,
        pooling_descriptor(r),
        c.alpha,
        nd_tensor(vy, r.nsp),
        vy.ptr,
        nd_tensor(vdy, r.nsp, vy.strides),  # one layout now: described alike (see _same_strides)
        vdy.ptr,
        nd_tensor(vx, r.nsp, vdx.strides),
        vx.ptr,
        c.beta,
        nd_tensor(vdx, r.nsp),
        vdx.ptr,
    )


def _strides(r: _Pool) -> tuple[int, ...] | None:
    return r.y_strides


def _graph_mode(r: _Pool) -> str:
    return "max" if r.mode.startswith("max") else r.mode


def _as_4d(v: Any, r: _Pool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return as_2d(v.shape, v.strides) if r.nsp == 1 else (v.shape, v.strides)


def _prepare(names: tuple[str, ...]) -> Any:
    """The graph runs channels-last: measured on the H200 (cuDNN 9.19), the resample engines for channels-first
    arrays have no max-pooling backward, an average backward that fails at execution (``pooling_bwd_exec_params.
    srcData == nullptr``) and an include-padding forward that excludes post-padding; channels-last is exact. So
    other layouts are copied in channels-last, and the output is written through a channels-last temporary (the
    forward's index stays channels-last: the backward takes it in any layout)."""

    def prepare(c: Call) -> None:
        r = c.resolved
        if r.f32:
            _in_float32(c, r, names[0])
        for n in names:
            if c.views.get(n) is not None:
                channels_last_input(c, n, "for the graph (its resample engines run channels-last)")
        out_view(c, "out")
        channels_last_output(c, "out")
        if r.index and "dy" not in c.views:  # the forward's index output, in y's layout
            vo = c.views["out"]
            c.extra["index"], c.views["index"] = c.launch.empty(vo.shape, r.index_dtype, vo.strides, name="index")

    return prepare


def _in_float32(c: Call, r: _Pool, name: str) -> None:
    """bfloat16 averaging that only the graph takes (``_Pool.f32``: per-side padding, ceil_mode's padding after;
    cuDNN 9.19's bfloat16 resample engines average wrong, measured) runs the graph on float32: input ``name`` (x,
    or dy) copied to float32 channels-last (``cudnnTransformTensor``), the result written to a float32 channels-last
    temporary and, after the graph, transformed into ``out`` with the call's blend (``out = alpha * result + beta *
    out``; the graph itself then blends nothing). Descriptors are made before any work."""
    h = c.launch.handle
    v, vo = c.views[name], out_view(c, "out")
    d, od = nd_tensor(v, r.nsp), nd_tensor(vo, r.nsp)
    arr, v32 = c.launch.empty(v.shape, "float32", channels_last_strides(v.shape), name=name)
    lib.cudnnTransformTensor(h, scaling_ref("float32", 1.0), d, v.ptr, scaling_ref("float32", 0.0),
                             nd_tensor(v32, r.nsp), v32.ptr)  # fmt: skip
    t32, o32 = c.launch.empty(vo.shape, "float32", channels_last_strides(vo.shape), name="out")
    c.views[name], c.views["out"] = v32, o32
    alpha, beta, c.blends = c.alpha, c.beta, {}  # the blend is the last transform's
    c.extra["_f32_temps"] = (arr, t32)  # kept until the call ends (the allocator's free follows the queued work)
    after(c, lambda: lib.cudnnTransformTensor(h, alpha, nd_tensor(o32, r.nsp), o32.ptr, beta, od, vo.ptr))


def _fwd_graph(c: Call) -> tuple[Any, dict]:
    """``resample_forward`` (``CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR``): per-side padding, the index."""
    r = c.resolved
    b = Binder(c)
    x = b.tensor("x", *_as_4d(c.views["x"], r), c.views["x"].dtype)
    got = b.g.resample_forward(x, mode=_graph_mode(r), window=r.window, stride=r.stride, pre_padding=r.pad,
                               post_padding=r.post, nan_propagation=r.nan, index=r.index,
                               index_dtype=r.index_dtype)  # fmt: skip
    y, idx = got if r.index else (got, None)
    vo = c.views["out"]
    strides = _as_4d(vo, r)[1]
    b.output(y, "out", vo.dtype, strides)
    if idx is not None:
        b.output(idx, "index", r.index_dtype, strides)
    return b.done()


def _bwd_graph(c: Call) -> tuple[Any, dict]:
    """``resample_backward`` from dy (and, for max pooling, the forward's index)."""
    r = c.resolved
    if r.mode.startswith("max") and not r.index:
        raise ValueError("max pooling backward on the graph reads the forward's argmax: pass index= (from "
                         "pooling_forward(..., return_index=True))")  # fmt: skip
    b = Binder(c)

    def t(name: str) -> Any:
        return b.tensor(name, *_as_4d(c.views[name], r), c.views[name].dtype)

    vo = c.views["out"]
    out_shape, out_strides = _as_4d(vo, r)
    dx = b.g.resample_backward(t("dy"), x_dims=out_shape, index=t("index") if r.index else None,
                               mode=_graph_mode(r), window=r.window, stride=r.stride, pre_padding=r.pad,
                               post_padding=r.post, nan_propagation=r.nan)  # fmt: skip
    b.output(dx, "out", vo.dtype, out_strides)
    return b.done()


POOLING_FORWARD = register(
    Primitive(
        "pooling_forward",
        inputs=(Operand("x", _DTYPES),),
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_strides, blend=("alpha", "beta")),),
        resolve=_fwd_resolve,
        legacy=_fwd_call,
        graph=graph_form(_fwd_graph, _prepare(("x",))),
        graph_refuses=_graph_refuses,
        legacy_refuses=_legacy_refuses,
        auto=_auto,
        extras=("index",),
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
        inputs=(
            Operand("dy", _DTYPES),
            Operand("y", _DTYPES),
            Operand("x", _DTYPES),
            Operand("index", ("int8", "int32"), optional=True),
        ),  # fmt: skip
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_strides, blend=("alpha", "beta")),),
        resolve=_bwd_resolve,
        legacy=_bwd_call,
        graph=graph_form(_bwd_graph, _prepare(("dy", "index"))),
        graph_refuses=_graph_refuses,
        legacy_refuses=_legacy_refuses,
        auto=_auto,
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
    return_index: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Pool ``x`` ``(N, C, *in)`` -> ``y`` ``(N, C, *out)`` (see the module docstring); ``pool=`` a
    :class:`Pooling` in place of the keywords. ``return_index=True`` (max modes) returns ``(y, index)``: the
    argmax within each window (int8, int32 for windows over 127 cells, ``y``'s shape and layout), which
    :func:`pooling_backward` takes as ``index=`` on the graph path. ``cudnnPoolingForward`` or the graph's
    resample (primitive :data:`POOLING_FORWARD`); :func:`cudnnkit.ops.last_path` says which ran.

    Args:
        x: ``(N, C, *spatial)`` with 1 to 3 spatial dims, dense channels-first or channels-last (another layout is
            copied); float16, bfloat16, float32 or float64.
        mode: ``"max"``, ``"max_deterministic"``, ``"avg_include_padding"`` or ``"avg_exclude_padding"``.
        window: the window, an int or one per spatial dim (1 to 3 spatial dims).
        stride: an int or one per spatial dim; None: the window.
        padding: an int or one per spatial dim, ``(before, after)`` pairs, ``"valid"`` or ``"same"``; each side
            smaller than the window.
        ceil_mode: round the output size up, as torch does.
        propagate_nan: max pooling returns NaN for a window holding one.
        pool: a :class:`Pooling` in place of the keywords above.
        return_index: also return the argmax index (max modes; runs the graph path).
        out: a dense array of ``y``'s shape and ``x``'s dtype; None allocates ``y`` in ``x``'s layout.
        alpha: scale of the result.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` ``(N, C, *out)`` (:func:`cudnnkit.runtime.shapes.pool_output_shape`), ``x``'s dtype; with
        ``return_index=True`` ``(y, index)``.

    Example:
        >>> y = ops.pooling_forward(x, mode="max", window=3, stride=2, padding=1)
        >>> y, idx = ops.pooling_forward(x, window=3, stride=2, ceil_mode=True, return_index=True)
    """
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, ceil_mode=ceil_mode,
              propagate_nan=propagate_nan, pool=pool, return_index=return_index)  # fmt: skip
    y, index = run(POOLING_FORWARD, {"x": x}, out=out, alpha=alpha, beta=beta, stream=stream, **kw)
    return (y, index) if return_index else y


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
    index: Any = None,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``dx`` (``x``'s shape) of :func:`pooling_forward` from ``dy``, the forward's ``y`` and its input ``x`` (the
    parameters must be the forward's). The legacy call reads ``y`` and ``x`` (for max pooling it finds the maximum
    again); the graph's resample backward reads ``dy`` and, for max pooling, ``index=`` (the forward's
    ``return_index=True``), which asymmetric padding and ``ceil_mode`` padding after need. ``cudnnPoolingBackward``
    or the graph (primitive :data:`POOLING_BACKWARD`).

    Args:
        dy: the gradient of ``y``, ``y``'s shape and dtype.
        y: the forward's output.
        x: the forward's input.
        mode: ``"max"``, ``"max_deterministic"``, ``"avg_include_padding"`` or ``"avg_exclude_padding"``.
        window: the window, an int or one per spatial dim (1 to 3 spatial dims).
        stride: an int or one per spatial dim; None: the window.
        padding: an int or one per spatial dim, ``(before, after)`` pairs, ``"valid"`` or ``"same"``; each side
            smaller than the window.
        ceil_mode: round the output size up, as torch does.
        propagate_nan: max pooling returns NaN for a window holding one.
        pool: a :class:`Pooling` in place of the keywords above.
        index: the forward's index (``return_index=True``), for max pooling on the graph path.
        out: a dense array of ``x``'s shape and dtype to write ``dx``; None allocates it.
        alpha: scale of the gradient.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dx``, ``x``'s shape and dtype.

    Example:
        >>> y = ops.pooling_forward(x, mode="avg_exclude_padding", window=3, stride=1, padding=1)
        >>> dx = ops.pooling_backward(dy, y, x, mode="avg_exclude_padding", window=3, stride=1, padding=1)
    """
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, ceil_mode=ceil_mode,
              propagate_nan=propagate_nan, pool=pool)  # fmt: skip
    return run(POOLING_BACKWARD, {"dy": dy, "y": y, "x": x, "index": index}, out=out, alpha=alpha, beta=beta,
               stream=stream, **kw)  # fmt: skip


# ----------------------------------------------------------------- the L3 declaration


def _keeps_index(r: _Pool) -> bool:
    """Whether the differentiable forward keeps max pooling's argmax: where the backward can only run on the graph
    (padding after that differs from the padding before: asymmetric, or ceil_mode's), which reads it. Elsewhere
    the legacy backward finds the maximum again from x and y, and the forward keeps its faster legacy call (float64
    has no graph at all). An empty y has no index (the forward returns none); its backward computes nothing."""
    return r.mode.startswith("max") and r.pad != r.post and 0 not in r.y_shape


#: (x's shape, the keywords' values) -> :func:`_keeps_index` of the call: the differentiable forward asks on every
#: call, and resolving the window and padding is the slow part of its host time
_KEEPS: LRU[tuple, bool] = LRU("ops.pooling_keeps_index", 1024)


def _index_kept(shape: tuple, kw: dict) -> bool:
    """:func:`_keeps_index` of a forward call on an ``x`` of ``shape`` with these keywords, cached by the shape and
    the keywords' values. Values that hash alike (``2`` and ``2.0``) resolve alike where they are valid at all, and
    :func:`pooling_forward`, which the forward calls next, checks every keyword itself: a cache hit decides only
    whether to ask for the index."""
    try:
        key = (shape, tuple(kw.values()))
        got = _KEEPS.lookup(key)
    except TypeError:  # an unhashable value (a list): resolved each time
        key, got = None, MISSING
    if got is MISSING:
        got = _keeps_index(_resolve_for(ArrayView(shape, contiguous_strides(shape), "float32", 0, 0, None), "x", kw))
        if key is not None:
            _KEEPS.put(key, got)
    return got


def _pool_l3_forward(x: Any, *, mode: str = "max", window: int | Sequence[int] = 2,
                     stride: int | Sequence[int] | None = None, padding: int | Sequence[int] | str = 0,
                     ceil_mode: bool = False, propagate_nan: bool = False, pool: Pooling | None = None) -> Any:  # fmt: skip
    """``y = pool(x)``: ``x`` ``(N, C, *in)`` (1 to 3 spatial dims, a float dtype) -> ``y`` ``(N, C, *out)`` in x's
    layout and dtype, by one :func:`pooling_forward` (``cudnnPoolingForward``, or the graph's resample where the
    padding after differs). Residuals ``x``, ``out`` and, where :func:`_keeps_index` says, ``index``
    (``return_index=True``: the graph's argmax)."""
    kw = dict(mode=mode, window=window, stride=stride, padding=padding, ceil_mode=ceil_mode,
              propagate_nan=propagate_nan, pool=pool)  # fmt: skip
    if _index_kept(tuple(x.shape), kw):
        y, index = pooling_forward(x, return_index=True, **kw)
        return (y,), {"x": x, "out": y, "index": index}
    y = pooling_forward(x, **kw)
    return (y,), {"x": x, "out": y}


def _pool_l3_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    """dx (x's shape) by one :func:`pooling_backward` (``cudnnPoolingBackward``, or the graph's resample backward
    where the padding after differs) from dy, y, x (and the index where kept); an empty x's dx is
    :func:`~cudnnkit.ops.transform_tensor` of it (nothing launched), as an empty max pooling with padding after
    has no index to pass."""
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    x = res["x"]
    if 0 in tuple(x.shape):
        from .tensor import transform_tensor

        return (transform_tensor(x),)
    return (pooling_backward(dy, res["out"], x, index=res.get("index"), **kw),)


def _pool_l3_meta(x: Spec, **kw: Any) -> Any:
    """y as :func:`pooling_forward` allocates it (``pool_output_shape``, x's layout and dtype); the index (int8, or
    int32 past 127 window cells) in y's shape, channels-last as the graph writes it."""
    r = _fwd_resolve({"x": ArrayView(tuple(x.shape), tuple(x.strides), x.dtype, 0, 0, None)}, kw)
    y = Spec(r.y_shape, r.y_strides or contiguous_strides(r.y_shape), x.dtype)
    if _keeps_index(r):
        return (y,), {"x": x, "out": y, "index": Spec(r.y_shape, channels_last_strides(r.y_shape), r.index_dtype)}
    return (y,), {"x": x, "out": y}


DIFF_POOLING = differentiable(
    Differentiable("pooling", "pooling_forward", ("x",), ("out",), _pool_l3_forward, _pool_l3_backward,
                   _pool_l3_meta, batch=("x", "out", "index"),
                   capture_safe=True,  # cudnnPooling* (or the graph's resample) each way: device work only
                   doc="y = pool(x); the backward (pooling_backward) reads x and y, and max pooling's argmax index "
                       "where padding after differs from before (asymmetric or ceil_mode: the graph path)")
)  # fmt: skip
