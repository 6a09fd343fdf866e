"""N-d convolution on cuDNN's legacy API: forward, backward data (the transposed convolution), backward filter and
backward bias, with groups (depthwise included), dilation, both modes, and the algorithm chosen as
``cudnnkit.settings`` says.

Shapes (logical NCHW order whatever the memory layout; ``S`` = 1, 2 or 3 spatial dims)

=============  ===========================  =============================================================
array          shape                        notes
=============  ===========================  =============================================================
``x``          ``(N, C, *in)``              dense channels-first (C order) or channels-last; else copied
``w``          ``(K, C // groups, *k)``     dense ``(K, C/g, *k)`` (filter format NCHW) or channels-last
                                            (``KRSC``, format NHWC); else copied to C order
``y``, ``dy``  ``(N, K, *out)``             ``out = (in + 2 * pad - dilation * (k - 1) - 1) // stride + 1``
``db``         ``(K,)``                     :func:`convolution_backward_bias`
=============  ===========================  =============================================================

A new ``y``/``dx`` takes ``x``'s layout (channels-last stays channels-last); a given ``out`` must be dense
channels-first or channels-last. The fused forward also takes ``bias`` ``(K,)`` and a residual ``z`` of ``y``'s
shape (:func:`convolution_forward`). Dtypes: ``x``, ``w`` and the result share one of float16, bfloat16, float32
(TF32 tensor cores as ``cudnnkit.settings(allow_tf32=...)`` says) and float64; half types compute in float32.
A 1-d convolution runs as 2-d with a trailing size-1 dim (cuDNN's Nd descriptors take 2 or 3 spatial dims).

Parameters: ``stride``, ``padding`` and ``dilation`` are an int or one per spatial dim; ``padding`` may also be
``"valid"`` or ``"same"`` (torch's; stride 1), or ``(before, after)`` pairs per dim; cuDNN's legacy descriptor pads
both sides alike, so asymmetric padding (and ``"same"`` with an even dilated kernel) runs on the graph path only.
``groups`` divides ``C`` and ``K``; ``mode`` is "cross_correlation" (the default, torch's) or "convolution" (the
kernel flipped). All of it is checked before any GPU work (:func:`cudnnkit.runtime.shapes.conv_output_shape`).
A :class:`Convolution` holds the parameters for reuse.

Algorithm choice, per (descriptors, settings), cached: ``autotune="heuristics"`` (the default) or ``"off"`` take
cuDNN's heuristic order (``cudnnGetConvolution*Algorithm_v7``); ``"exhaustive"`` times the candidates once
(``cudnnFindConvolution*AlgorithmEx``, on scratch outputs, with the workspace capped at ``workspace_limit`` or
256 MiB). Candidates that need more workspace than ``workspace_limit``, or, with ``deterministic=True``, that
are not deterministic, are dropped. When a candidate's workspace cannot be allocated, the next one with a smaller
workspace runs (logged on the ``cudnnkit`` logger); a workspace never raises out-of-memory while an algorithm
with a smaller one remains.

**Paths** (:mod:`cudnnkit.ops._primitive`'s router; :func:`cudnnkit.ops.last_path` says which ran). Forward,
backward data and backward filter run as a graph (``conv_fprop``/``conv_dgrad``/``conv_wgrad``, float32 compute,
planned once per signature with the settings' heuristics and engine filters, cached op-level) unless: the dtype
is float64 (the graph API has none), the call blends (``alpha``/``beta`` other than 1/0: the legacy call blends in
its kernel; a graph-only call blends through a temporary and ``cudnnAddTensor``), the batch is empty, the fused
forward has ``alpha != 1``, or has ``z_alpha != 1`` and is grouped or float32 (NaN in the output of a grouped
float16 graph and of a float32 one scaling z by a ``MUL``, measured on an H100), or cuDNN refused that graph before
(remembered; the legacy call runs). Such a ``z_alpha`` fused forward with asymmetric padding, which the legacy
convolution cannot take, runs the graph's ``conv_fprop`` alone and the legacy epilogue (``cudnnAddTensor``,
``cudnnActivationForward``) after it. Any other fused float32 forward is one graph like the half types' (the
fifth session's non-finite float32 outputs came from ``z_alpha != 1``; with ``z_alpha`` 1 no engine gave any on
cuDNN 9.19, on an H100: benchmarks/NOTES.md, twenty-second and twenty-third sessions). The graph that scales z
denies eng8, which computes that ``MUL`` wrong (:meth:`cudnnkit.graph.Graph.deny_engines`).
``settings(prefer="legacy")`` forces the legacy calls, ``prefer="graph"`` the graph (raising what cuDNN refuses).
The backward bias's graph is one reduction node, for a dense channels-last float32 ``dy`` with no blend (cuDNN 9.19
has no engine for the rest).

Legacy calls: ``cudnnConvolutionForward``, ``cudnnConvolutionBackwardData``, ``cudnnConvolutionBackwardFilter``,
and, for the bias, ``cudnnReduceTensor`` or the reduction graph into a float32 temporary for a channels-last
``dy`` (``cudnnConvolutionBackwardBias`` refuses bfloat16 and channels-last ``dy`` on cuDNN 9.19), each with
``alpha``/``beta`` blending (``out = alpha * result + beta * out``). Where cuDNN
has no legacy algorithm for channels-last arrays (float64, grouped; measured on 9.19), the call runs on
channels-first copies. Their algorithm choice follows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import lib
from ..runtime import as_view, check_choice, current_settings, get_cached, tensor_descriptor
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import FLOATS, canonical, check_scalar, nan_propagation, scaling_ref
from ..runtime.shapes import INT32_MAX, conv_output_shape, conv_transpose_output_shape, expand, resolve_padding
from ._conv_algos import (  # noqa: F401  (public here, as before)
    _BWD_DATA,
    _BWD_FILTER,
    _FWD,
    FILTER,
    MODES,
    _candidates,
    _Family,
    _run_algos,
    algorithm_cache_info,
    conv_descriptor,
)
from ._diff import Differentiable, Spec, differentiable, spec_view
from ._graphform import Binder, after, channels_last_input, channels_last_output, graph_form, write_through
from ._layout import c_order_view, channels_last_strides, copy_in, is_channels_last
from ._nd import as_2d, batch1, check_dims, dense, layout_of, nd_tensor, out_view, param_form, same_dtype, with_batch
from ._primitive import Call, Operand, Output, Primitive, register, run
from .activation import activation_backward, activation_forward
from .tensor import add_tensor

__all__ = [
    "Convolution",
    "convolution_forward",
    "convolution_backward_data",
    "convolution_backward_filter",
    "convolution_backward_bias",
]

_log = logging.getLogger("cudnnkit")

_DTYPES = FLOATS  # runtime.dtypes: every float type cuDNN has
#: the quantized forward's input dtypes, and what each may write (``out_dtype=``; the first is the default). Each
#: pair ran on the H200 (cuDNN 9.19, probe of 2026-12-01); left out: int32 y (an engine of 9.19 wrote garbage for
#: an int8 -> int32 graph without the MUL) and int8 y from fp8 x
_QUANT_OUT = {
    "int8": ("float32", "float16", "bfloat16", "int8"),
    "float8_e4m3fn": ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"),
    "float8_e5m2": ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"),
}
_MODES = MODES
_FAMILY = "convolution"


@dataclass(frozen=True)
class Convolution:
    """A convolution's parameters, for reuse (hashable): passed as ``conv=`` to :func:`convolution_forward`,
    :func:`convolution_backward_data` and :func:`convolution_backward_filter` in place of their keywords.

    The values are checked here (types and ranges) and against the arrays at each call (the rank decides what an
    int expands to). The cuDNN convolution descriptor each call leads to (``cudnnSetConvolutionNdDescriptor``,
    ``cudnnSetConvolutionGroupCount``, ``cudnnSetConvolutionMathType``) is cached by value.

    Args:
        stride: an int or one per spatial dim, each >= 1.
        padding: an int or one per spatial dim (both sides), ``(before, after)`` pairs per dim (graph path only
            when they differ), ``"valid"`` (none) or ``"same"`` (torch's; stride 1).
        dilation: an int or one per spatial dim, each >= 1.
        groups: divides ``C`` and ``K`` (``groups == C`` is depthwise); a positive int.
        mode: ``"cross_correlation"`` (torch's, the default) or ``"convolution"`` (the kernel flipped).

    Raises:
        ValueError: a mode other than the two, a non-positive ``groups``, or a stride, dilation or padding of the
            wrong form or range.

    Example:
        >>> conv = ops.Convolution(stride=2, padding=1)
        >>> y = ops.convolution_forward(x, w, conv=conv)
        >>> dx = ops.convolution_backward_data(dy, w, x_shape=x.shape, conv=conv)
    """

    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] | str = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = 1
    mode: str = "cross_correlation"

    def __post_init__(self) -> None:
        check_choice(self.mode, _MODES, "mode")
        if isinstance(self.groups, bool) or not isinstance(self.groups, int) or not 1 <= self.groups <= INT32_MAX:
            raise ValueError(f"groups must be a positive int, got {self.groups!r}")
        for name, minimum in (("stride", 1), ("dilation", 1), ("padding", 0)):
            object.__setattr__(self, name, param_form(getattr(self, name), name, minimum))


class _Conv(NamedTuple):
    """A call's resolved convolution (hashable: the op-level caches key on it)."""

    dtype: str
    nsp: int  #: the caller's spatial dims (1-d runs as 2-d)
    pad: tuple[int, ...]  #: cuDNN's spatial dims from here on (2 or 3)
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    mode: str
    compute: str
    math: int
    channels_last: bool  #: the layout of new outputs (x's, or dy's for backward data)
    y_shape: tuple[int, ...]  #: the output's logical shape, the caller's rank
    y_strides: tuple[int, ...] | None  #: a new output's strides (None: C order)
    #: a reduction over an empty batch (backward filter): the result is 0 (beta * out when ``keep``)
    empty_sum: bool = False
    keep: bool = False
    #: the padding after each of cuDNN's spatial dims (``pad`` is the padding before): the legacy call needs both
    #: alike, the graph takes any
    post: tuple[int, ...] = ()
    #: the fused forward: a bias, a residual ``z`` (scaled by ``z_alpha``), an activation (an ``Act`` or None)
    bias: bool = False
    z: bool = False
    z_alpha: float = 1.0
    act: Any = None
    #: the quantized forward (int8/fp8 x and w): the output's dtype and the scale it is multiplied by (the
    #: product of x's and w's dequantization scales, times y's quantization scale)
    out_dtype: str = ""
    scale: float = 1.0
    #: a fused forward whose fused graph cuDNN 9.19 gets wrong (``z_alpha != 1``, grouped or float32): it runs
    #: the legacy steps, or, where those cannot pad (asymmetric), the graph's ``conv_fprop`` alone and the legacy
    #: epilogue after it (:func:`_split_epilogue`)
    split: bool = False


def _params(conv: Any, stride: Any, padding: Any, dilation: Any, groups: Any, mode: Any) -> Convolution:
    """The call's :class:`Convolution`: ``conv=`` or the keywords (not both)."""
    if conv is None:
        return Convolution(stride, padding, dilation, groups, mode)
    if not isinstance(conv, Convolution):
        raise TypeError(f"conv must be a cudnnkit.ops.Convolution, got {type(conv).__name__}")
    if (stride, padding, dilation, groups, mode) != (1, 0, 1, 1, "cross_correlation"):
        raise TypeError("pass conv= or stride=/padding=/dilation=/groups=/mode=, not both")
    return conv


def _math_type(dtype: str) -> int:
    if dtype in ("float16", "bfloat16"):
        return lib.CUDNN_TENSOR_OP_MATH
    if dtype == "float32":
        return lib.CUDNN_DEFAULT_MATH if current_settings().allow_tf32 else lib.CUDNN_FMA_MATH
    return lib.CUDNN_DEFAULT_MATH


def _padding(p: Convolution, nsp: int, kernel: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The padding (before, after) per spatial dim (``ValueError`` naming ``padding``)."""
    d = expand(p.dilation, nsp, "dilation", 1, INT32_MAX)
    s = expand(p.stride, nsp, "stride", 1, INT32_MAX)
    return resolve_padding(p.padding, nsp, s, tuple(di * (ki - 1) + 1 for di, ki in zip(d, kernel)))


def _resolve(p: Convolution, dtype: str, x_shape: tuple, w_shape: tuple, channels_last: bool, out_shape: tuple
             ) -> _Conv:  # fmt: skip
    nsp = len(x_shape) - 2
    pad, post = _padding(p, nsp, w_shape[2:])
    s = expand(p.stride, nsp, "stride", 1, INT32_MAX)
    d = expand(p.dilation, nsp, "dilation", 1, INT32_MAX)
    if nsp == 1:  # cuDNN's Nd descriptors take 2 or 3 spatial dims: a trailing size-1 dim
        pad, post, s, d = pad + (0,), post + (0,), s + (1,), d + (1,)
    compute = "float64" if dtype == "float64" else "float32"
    strides = channels_last_strides(out_shape) if channels_last else None
    return _Conv(dtype, nsp, pad, s, d, p.groups, p.mode, compute, _math_type(dtype), channels_last, out_shape,
                 strides, post=post)  # fmt: skip


def _legacy_refuses(r: _Conv) -> str | None:
    if r.out_dtype:
        return f"{r.dtype} x (the quantized forward runs on the graph API)"
    if r.act is not None and r.act.descriptor is None:
        return f"activation {r.act.mode!r} (the legacy API has no such mode)"
    if r.pad != r.post and not r.empty_sum:  # an empty batch's zeros need no convolution
        return (f"padding {r.pad[: r.nsp]} before and {r.post[: r.nsp]} after: cuDNN's legacy convolution pads "
                "both sides alike")  # fmt: skip
    return None


def _auto(r: _Conv, kw: Any) -> tuple[str, str]:
    if kw.get("alpha", 1.0) != 1.0 or kw.get("beta", 0.0) != 0.0:
        return "legacy", "alpha/beta blending (the legacy call blends in its kernel; the graph needs a second one)"
    return "graph", "measured faster (benchmarks/NOTES.md, fifth session)"


def _graph_refuses(r: _Conv, kw: Any) -> str | None:
    if r.split and (_legacy_refuses(r) is None or (r.act is not None and r.act.descriptor is None)):
        # the legacy steps take it (or nothing does: an activation the legacy API lacks); otherwise (asymmetric
        # padding) the graph runs the convolution alone and the legacy epilogue after it
        # measured on an H100 (cuDNN 9.19): a conv_fprop -> MUL(z, z_alpha) -> ADD graph wrote NaN into some
        # outputs when grouped (float16, a fuzzer case) or float32 (groups 1, the GPU tier's fused test); z_alpha 1
        # was right in both
        return "a grouped or float32 fused forward with z_alpha != 1 (cuDNN 9.19's engines wrote NaN, measured)"
    if r.empty_sum:
        return "an empty batch"
    if (r.bias or r.z or r.act is not None) and not r.split and kw.get("alpha", 1.0) != 1.0:
        # the graph blends after its last node: alpha would scale act(...), where the fused forward scales the conv
        # (a split forward's graph is the convolution alone: its blend is the fused forward's alpha)
        return "alpha with a fused forward (alpha scales the convolution inside the activation)"
    return None


def _fused(r: _Conv, views: Any, kw: Any) -> _Conv:
    """The forward's bias, z and activation, checked against the call's y."""
    k = r.y_shape[1]
    vb, vz = views.get("bias"), views.get("z")
    if vb is not None:
        if vb.shape != (k,):
            raise ValueError(f"bias must have shape ({k},) (one per output channel), got {vb.shape}")
        same_dtype(vb, "bias", r.dtype, "x")
    if vz is not None:
        if vz.shape != r.y_shape:
            raise ValueError(f"z must have y's shape {r.y_shape}, got {vz.shape}")
        same_dtype(vz, "z", r.dtype, "x")
    elif kw.get("z_alpha", 1.0) != 1.0:
        raise TypeError("z_alpha scales z: pass z=")
    act, nan = kw.get("activation"), kw.get("propagate_nan", False)
    if act is not None:
        from .activation import resolve_activation

        act = resolve_activation(act, kw.get("activation_coef"), nan, name="activation", coef_name="activation_coef")
    elif kw.get("activation_coef") is not None:
        raise TypeError("activation_coef is for activation=: pass one")
    else:
        _nan_rule(nan, act)
    z_alpha = check_scalar(kw.get("z_alpha", 1.0), "z_alpha")
    fused = vb is not None or vz is not None or act is not None
    if fused and kw.get("beta", 0.0) != 0.0:
        raise ValueError("beta blends into out, which the fused forward (bias=, z=, activation=) does not; add a "
                         "residual with z= and z_alpha=")  # fmt: skip
    split = fused and vz is not None and z_alpha != 1.0 and (r.groups > 1 or r.dtype == "float32")
    return r._replace(bias=vb is not None, z=vz is not None, z_alpha=float(z_alpha), act=act, split=split)


def _fwd_resolve(views: Any, kw: Any) -> _Conv:
    vx, vw = views["x"], views["w"]
    check_dims(vx, "x")
    check_dims(vw, "w", vx.ndim)
    same_dtype(vw, "w", vx.dtype, "x")
    p = _params(kw.get("conv"), kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1),
                kw.get("groups", 1), kw.get("mode", "cross_correlation"))  # fmt: skip
    y = conv_output_shape(batch1(vx.shape), vw.shape, stride=p.stride, padding=p.padding, dilation=p.dilation,
                          groups=p.groups)  # fmt: skip
    r = _resolve(p, vx.dtype, vx.shape, vw.shape, layout_of(vx) == "nhwc", with_batch(y, vx.shape[0]))
    r = _fused(r, views, kw)._replace(keep=kw.get("beta", 0.0) != 0)
    return _quantized(r, kw)


def _quantized(r: _Conv, kw: Any) -> _Conv:
    """``out_dtype``/``scale`` checked: for int8/fp8 x, the quantized forward ``y = scale * conv(x, w)`` (nothing
    fused, no blend); for float x they must be left alone."""
    out_dtype, scale = kw.get("out_dtype"), kw.get("scale", 1.0)
    if r.dtype not in _QUANT_OUT:
        if out_dtype is not None and canonical(out_dtype, "out_dtype") != r.dtype:
            raise ValueError(f"out_dtype is for int8/fp8 x; a {r.dtype} convolution writes {r.dtype}")
        if scale != 1.0:
            raise ValueError("scale= is the quantized forward's (int8/fp8 x); for float x pass alpha=")
        return r
    allowed = _QUANT_OUT[r.dtype]
    od = allowed[0] if out_dtype is None else canonical(out_dtype, "out_dtype")
    if od not in allowed:
        raise ValueError(f"out_dtype must be one of {allowed} for {r.dtype} x, got {od!r}")
    if r.bias or r.z or r.act is not None:
        raise ValueError(f"bias=, z= and activation= are for float x: the {r.dtype} forward is scale * conv(x, w) "
                         "(build a longer graph with cudnnkit.graph to fuse more)")  # fmt: skip
    if kw.get("alpha", 1.0) != 1.0 or kw.get("beta", 0.0) != 0.0:
        raise ValueError(f"alpha/beta with {r.dtype} x: the quantized forward writes out; scale it with scale=")
    return r._replace(out_dtype=od, scale=float(check_scalar(scale, "scale")))


def _bwd_data_resolve(views: Any, kw: Any) -> _Conv:
    vdy, vw = views["dy"], views["w"]
    check_dims(vdy, "dy")
    check_dims(vw, "w", vdy.ndim)
    same_dtype(vw, "w", vdy.dtype, "dy")
    p = _params(kw.get("conv"), kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1),
                kw.get("groups", 1), kw.get("mode", "cross_correlation"))  # fmt: skip
    nsp = vdy.ndim - 2
    x_shape = kw.get("x_shape")
    if x_shape is None:
        if isinstance(p.padding, str):
            raise ValueError(f"padding={p.padding!r} needs x_shape= in the backward (it depends on x's size)")
        x_shape = conv_transpose_output_shape(batch1(vdy.shape), vw.shape, stride=p.stride, padding=p.padding,
                                              dilation=p.dilation, output_padding=kw.get("output_padding", 0),
                                              groups=p.groups)  # fmt: skip
        x_shape = with_batch(x_shape, vdy.shape[0])
    else:
        if kw.get("output_padding", 0) != 0:
            raise TypeError("pass x_shape= or output_padding=, not both (x_shape fixes the output size)")
        x_shape = tuple(expand(x_shape, nsp + 2, "x_shape", 0, INT32_MAX))
        if x_shape[0] != vdy.shape[0]:
            raise ValueError(f"x_shape {x_shape} has a batch of {x_shape[0]} but dy has {vdy.shape[0]}")
    want = conv_output_shape(batch1(x_shape), vw.shape, stride=p.stride, padding=p.padding, dilation=p.dilation,
                             groups=p.groups)  # fmt: skip
    if with_batch(want, x_shape[0]) != vdy.shape:
        raise ValueError(f"dy has shape {vdy.shape} but a convolution of x {x_shape} with w {vw.shape} gives {want}")
    return _resolve(p, vdy.dtype, x_shape, vw.shape, layout_of(vdy) == "nhwc", x_shape)._replace(
        keep=kw.get("beta", 0.0) != 0
    )


def _bwd_filter_resolve(views: Any, kw: Any) -> _Conv:
    vx, vdy = views["x"], views["dy"]
    check_dims(vx, "x")
    check_dims(vdy, "dy", vx.ndim)
    same_dtype(vdy, "dy", vx.dtype, "x")
    p = _params(kw.get("conv"), kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1),
                kw.get("groups", 1), kw.get("mode", "cross_correlation"))  # fmt: skip
    w_shape = kw.get("w_shape")
    if w_shape is None:
        raise TypeError("w_shape is required: the filter's shape (K, C // groups, *kernel)")
    w_shape = tuple(expand(w_shape, vx.ndim, "w_shape", 1, INT32_MAX))
    want = conv_output_shape(batch1(vx.shape), w_shape, stride=p.stride, padding=p.padding, dilation=p.dilation,
                             groups=p.groups)  # fmt: skip
    want = with_batch(want, vx.shape[0])
    if want != vdy.shape:
        raise ValueError(f"dy has shape {vdy.shape} but a convolution of x {vx.shape} with w {w_shape} gives {want}")
    # a channels-last x gets a channels-last (KRSC) dw; an empty batch sums nothing: zeros (or beta * out)
    return _resolve(p, vx.dtype, vx.shape, w_shape, layout_of(vx) == "nhwc", w_shape)._replace(
        empty_sum=vx.shape[0] == 0, keep=kw.get("beta", 0.0) != 0
    )


def _tensor(v: Any, r: _Conv) -> Any:
    return nd_tensor(v, r.nsp)


def _filter(v: Any, r: _Conv, layout: str) -> Any:
    shape = v.shape + (1,) if r.nsp == 1 else v.shape
    fmt = lib.CUDNN_TENSOR_NHWC if layout == "nhwc" else lib.CUDNN_TENSOR_NCHW
    return get_cached(FILTER, (v.dtype, fmt, shape))


# ----------------------------------------------------------------- the legacy calls


class _Kind(NamedTuple):
    """One of the three convolution calls: its algorithm family, its two inputs (the one cuDNN takes as a filter,
    if any) and output (its filter-ness), the order of the Get/Find descriptors, and the call."""

    family: _Family
    a: str
    b: str
    filter_in: str | None
    filter_out: bool
    call: str


_KINDS = {
    "forward": _Kind(_FWD, "x", "w", "w", False, "cudnnConvolutionForward"),
    "data": _Kind(_BWD_DATA, "w", "dy", "w", False, "cudnnConvolutionBackwardData"),
    "filter": _Kind(_BWD_FILTER, "x", "dy", None, True, "cudnnConvolutionBackwardFilter"),
}


def _legacy(which: str) -> Any:
    """The legacy call of convolution ``which``: its two inputs and output in layouts cuDNN takes, their
    descriptors, the algorithms (:func:`_candidates`) and the first one whose workspace can be allocated
    (:func:`_run_algos`). cuDNN takes ``(handle, alpha, descA, a, descB, b, conv, algo, ws, ws_bytes, beta,
    descOut, out)`` in all three, with the inputs in the order of ``_KINDS``."""
    k = _KINDS[which]

    def call(c: Call) -> None:
        r = c.resolved
        if r.empty_sum:
            vo = out_view(c, "out")
            _empty_sum(c, vo, _tensor(vo, r), r.keep)
            return
        try:
            once(c, False)
        except lib.errors.NotSupportedError as e:
            if not getattr(e, "_no_algorithm", False) or all(layout_of(c.views[n]) != "nhwc" for n in (k.a, k.b)):
                raise
            # measured on cuDNN 9.19: no legacy algorithm for float64 or grouped channels-last arrays; the
            # channels-first ones run (torch copies likewise)
            _log.debug("convolution %s: no legacy algorithm for channels-last arrays (%s); running channels-first "
                       "copies", k.family.name, str(e).splitlines()[0])  # fmt: skip
            once(c, True)

    def once(c: Call, nchw: bool) -> None:
        r = c.resolved
        ins = {}
        act = k.b if k.a == k.filter_in else k.a  # the activation-side input (x or dy)
        v_act, act_lay = _dense(c, act, nchw)
        ins[act] = (v_act, _tensor(v_act, r))
        other = k.b if act == k.a else k.a
        v, lay = _dense(c, other, nchw)
        if other == k.filter_in and lay != act_lay:
            # the legacy algorithms mostly need the filter in the activations' format (torch copies it too)
            want = channels_last_strides(v.shape) if act_lay == "nhwc" else None
            _, v = copy_in(c.launch, c.arrays[other], v, want, other, f"in {act}'s layout ({act_lay})")
            lay = act_lay
        ins[other] = (v, _filter(v, r, lay) if other == k.filter_in else _tensor(v, r))
        vo = given = out_view(c, "out")
        temp = None
        if nchw and not vo.is_contiguous():
            temp, vo = c.launch.empty(vo.shape, vo.dtype, None, name="out")
            if r.keep:
                c.launch.copy(temp, given.owner, "out")
        od = _filter(vo, r, layout_of(vo) or "nchw") if k.filter_out else _tensor(vo, r)
        (va, da), (vb, db) = ins[k.a], ins[k.b]
        cd = conv_descriptor(r)
        # z described before any work: one cuDNN cannot take is refused (by name) before the convolution runs
        zd = _tensor(c.views["z"], r) if which == "forward" and r.z else None

        def find_args(ws_ptr: int, ws_bytes: int) -> tuple:
            scratch, vs = c.launch.empty(vo.shape, vo.dtype, vo.strides, name="out")  # Find writes its output
            c.extra["_scratch"] = scratch  # kept until the call ends
            return (da, va.ptr, db, vb.ptr, cd, od, vs.ptr, ws_ptr, ws_bytes)

        algos = _candidates(k.family, c, (da, db, cd, od), find_args)
        h, fn = c.launch.handle, getattr(lib, k.call)
        _run_algos(
            k.family,
            c,
            algos,
            lambda algo, ws, n, math: fn(
                h,
                c.alpha,
                da,
                va.ptr,
                db,
                vb.ptr,
                conv_descriptor(r._replace(math=math)),
                algo,
                ws,
                n,
                c.beta,
                od,
                vo.ptr,
            ),  # fmt: skip
        )
        c.extra.pop("_scratch", None)
        if which == "forward" and (r.bias or r.z or r.act is not None):
            _epilogue(c, r, vo, od, c.views["z"], zd)
        if temp is not None:
            c.launch.copy(given.owner, temp, "out")

    return call


def _dense(c: Call, name: str, nchw: bool) -> tuple[Any, str]:
    """``dense``, or with ``nchw`` a C-order copy of a channels-last array."""
    v, lay = dense(c, name)
    if nchw and lay == "nhwc" and not v.is_contiguous():
        _, v = c.launch.contiguous(c.arrays[name], v, name, "has no legacy algorithm channels-last")
        lay = "nchw"
    return v, lay


def _epilogue(c: Call, r: _Conv, vo: Any, od: Any, vz: Any, zd: Any) -> None:
    """The fused forward's bias, residual and activation in place on y (``vo``, descriptor ``od``), by legacy calls:
    ``cudnnAddTensor`` (bias as ``(1, K, 1, ...)``, then ``z_alpha * z``: view ``vz``, descriptor ``zd``) and
    ``cudnnActivationForward``."""
    h = c.launch.handle
    one = scaling_ref(r.dtype, 1.0)
    nd = len(vo.shape) + (1 if r.nsp == 1 else 0)
    if r.bias:
        vb = c.views["bias"]
        shape = (1, vb.shape[0]) + (1,) * (nd - 2)
        lib.cudnnAddTensor(h, one, tensor_descriptor(vb.dtype, shape, contiguous_strides(shape)), vb.ptr, one, od,
                           vo.ptr)  # fmt: skip
    if r.z:
        lib.cudnnAddTensor(h, scaling_ref(r.dtype, r.z_alpha, "z_alpha"), zd, vz.ptr, one, od, vo.ptr)
    if r.act is not None:
        lib.cudnnActivationForward(h, r.act.descriptor, one, od, vo.ptr, scaling_ref(r.dtype, 0.0), od, vo.ptr)


# ----------------------------------------------------------------- the graph forms


def _as_4d(v: Any, r: _Conv) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return as_2d(v.shape, v.strides) if r.nsp == 1 else (v.shape, v.strides)


def _graph_prepare(which: str) -> Any:
    """Dense copies (C order) of inputs in other layouts, the filter in the activations' format, and the check of
    a given output's layout: the layouts the graph is built for."""
    k = _KINDS[which]

    def prepare(c: Call) -> None:
        r = c.resolved
        if which == "forward" and r.split:
            _split_epilogue(c, r)
        act = k.b if k.a == k.filter_in else k.a
        v_act, act_lay = dense(c, act)
        # the fused and the quantized forwards run channels-last (their engines take nothing else)
        fused = which == "forward" and not r.split and (r.bias or r.z or r.act is not None or bool(r.out_dtype))
        if fused and act_lay != "nhwc":
            # cuDNN 9.19's fused (runtime fusion) engines take channels-last only (measured on the H200: a 3-d
            # NCDHW conv + bias + GELU has no engine): x (then w and z, below) copied channels-last (or, C = 1 or
            # 1x1, described so), and y written through a channels-last temporary
            c.views[act] = v_act
            v_act, act_lay = channels_last_input(c, act, "for the fused graph (channels-last only)"), "nhwc"
        first = not fused and act_lay == "nhwc" and _depthwise_runs_first(which, r, v_act)
        if first:
            _, v_act = copy_in(c.launch, c.arrays[act], v_act, None, act, "channels-first: cuDNN's channels-last "
                               "depthwise engines are the slow ones")  # fmt: skip
            act_lay = "nchw"
        c.views[act] = v_act
        other = k.b if act == k.a else k.a
        v, lay = dense(c, other)
        if other == k.filter_in and lay != act_lay:
            want = channels_last_strides(v.shape) if act_lay == "nhwc" else None
            _, v = copy_in(c.launch, c.arrays[other], v, want, other, f"in {act}'s layout ({act_lay})")
        if first and other == k.filter_in:  # described C order (a C/g = 1 filter of channels-last strides is so)
            v = c_order_view(v) or copy_in(c.launch, c.arrays[other], v, None, other, "in x's layout (C order)")[1]
        c.views[other] = v
        if c.views.get("z") is not None and not r.split:  # a split forward's epilogue reads z as given
            c.views["z"], _ = dense(c, "z")
            if fused and act_lay == "nhwc":
                channels_last_input(c, "z", "in x's layout (channels-last) for the fused graph")
        v = out_view(c, "out")
        if fused and act_lay == "nhwc":
            channels_last_output(c, "out")
        elif first and layout_of(v) != "nchw":
            write_through(c, "out", contiguous_strides(v.shape))

    return prepare


def _split_epilogue(c: Call, r: _Conv) -> None:
    """A split fused forward (``_Conv.split``: ``z_alpha != 1``, grouped or float32, with asymmetric padding,
    which the legacy convolution cannot take; the graph is ``conv_fprop`` alone and blends ``alpha`` as any graph
    does): :func:`_epilogue`'s legacy calls on the caller's ``out`` after the graph, z read as given (as the legacy
    path reads it), its descriptor made now, before any work (one cuDNN cannot take is refused by name first)."""
    vo, vz = out_view(c, "out"), c.views.get("z")
    od, zd = _tensor(vo, r), _tensor(vz, r) if r.z else None
    after(c, lambda: _epilogue(c, r, vo, od, vz, zd))


def _depthwise_runs_first(which: str, r: _Conv, vx: Any) -> bool:
    """A 2-d half-precision depthwise forward (groups = C > 1) runs channels-first even for channels-last arrays:
    cuDNN 9.19's channels-last depthwise engines are 13x slower than its NCHW ones (H200, 64x64x56x56 bf16 3x3:
    0.59 ms by every graph engine and legacy algorithm, 0.045 ms NCHW), far more than the two copies cost."""
    return (which == "forward" and r.nsp == 2 and r.groups > 1 and r.groups == vx.shape[1]
            and r.dtype in ("float16", "bfloat16"))  # fmt: skip


def _graph(which: str) -> Any:
    return graph_form(graph_builder(which), _graph_prepare(which))


def graph_builder(which: str) -> Any:
    """``build(call) -> (graph, {tensor: view name})`` of convolution ``which`` ("forward", "data", "filter"):
    ``conv_fprop`` (then the fused bias ``ADD``, ``ADD`` of ``z``, times ``z_alpha`` by a ``MUL`` when it is not 1,
    the activation's ``*_FWD``), ``conv_dgrad`` or ``conv_wgrad``, float32 compute, the output in the out array's layout."""

    def build(c: Call) -> tuple[Any, dict]:
        r = c.resolved
        bd = Binder(c)
        g = bd.g

        def t(name: str) -> Any:
            return bd.tensor(name, *_as_4d(c.views[name], r), c.views[name].dtype)

        conv = dict(stride=r.stride, pre_padding=r.pad, post_padding=r.post, dilation=r.dilation, groups=r.groups,
                    mode=r.mode, compute_dtype="float32")  # fmt: skip
        vo = c.views["out"]
        out_shape, out_strides = _as_4d(vo, r)
        if which == "forward" and r.out_dtype:  # quantized: conv_fprop -> MUL by the scale -> out_dtype
            conv["compute_dtype"] = "int32" if r.dtype == "int8" else "float32"
            y = g.conv_fprop(t("x"), t("w"), **conv)
            y = g.pointwise("MUL", y, g.scalar(r.scale, "float32", ndim=len(out_shape)))
            bd.output(y, "out", r.out_dtype, out_strides)
            return bd.done()
        if which == "forward":
            y = g.conv_fprop(t("x"), t("w"), **conv)
            fuse = not r.split  # a split forward's convolution is alone: _split_epilogue runs after it
            if r.bias and fuse:
                vb = c.views["bias"]
                shape = (1, vb.shape[0]) + (1,) * (len(out_shape) - 2)
                y = g.pointwise("ADD", y, bd.tensor("bias", shape, contiguous_strides(shape), vb.dtype))
            if r.z and fuse:  # cuDNN 9.19 fuses no ADD with alpha2 != 1 (measured): z_alpha * z as a MUL
                zt = t("z")
                if r.z_alpha != 1.0:  # a constant of z's rank (a 3-d convolution's are 5-d)
                    zt = g.pointwise("MUL", zt, g.scalar(r.z_alpha, "float32", ndim=len(out_shape)))
                    # measured on an H100 (cuDNN 9.19; benchmarks/NOTES.md, twenty-third session): eng8 computes
                    # this MUL wrong (NaN in float32, where it is the only engine, hence _Conv.split; wrong values
                    # in float16, where the heuristics rank it last), eng7/eng4/eng2 right
                    g.deny_engines("eng8")
                y = g.pointwise("ADD", y, zt)
            if r.act is not None and fuse:
                y = r.act.pointwise(g, y)
        elif which == "data":
            y = g.conv_dgrad(t("dy"), t("w"), out_shape, **conv)
        else:
            y = g.conv_wgrad(t("x"), t("dy"), out_shape, **conv)
        bd.output(y, "out", vo.dtype, out_strides)
        return bd.done()

    return build


class _Bias(NamedTuple):
    """A bias-gradient call, resolved (hashable)."""

    db_shape: tuple[int, ...]  #: (K,)
    empty: bool  #: dy is empty (a sum over nothing)
    keep: bool  #: beta keeps out's contents
    dtype: str  #: dy's
    nhwc: bool  #: dy is dense channels-last


def _bias_resolve(views: Any, kw: Any) -> _Bias:
    vdy = views["dy"]
    check_dims(vdy, "dy")
    return _Bias((vdy.shape[1],), vdy.size == 0, kw.get("beta", 0.0) != 0, vdy.dtype, layout_of(vdy) == "nhwc")


def _empty_sum(c: Call, v: Any, desc: Any, keep: bool) -> None:
    """A sum over nothing: ``out = beta * out`` (``cudnnScaleTensor``), or zeros (``cudnnSetTensor``, so a NaN
    in a poisoned ``out`` does not survive ``0 * NaN``) when beta is 0."""
    if keep:
        lib.cudnnScaleTensor(c.launch.handle, desc, v.ptr, c.beta)
    else:
        lib.cudnnSetTensor(c.launch.handle, desc, v.ptr, scaling_ref(v.dtype, 0.0))


def _bias_call(c: Call) -> None:
    """``db = alpha * sum(dy over N and space) + beta * db`` by :func:`~cudnnkit.ops.arith.reduce_views`:
    ``cudnnReduceTensor`` (ADD, float32 or float64 compute), or for a float16/float32 channels-last ``dy`` the
    reduction graph into float32 (see there): ``cudnnConvolutionBackwardBias`` refuses bfloat16 and channels-last
    ``dy`` on cuDNN 9.19/H200 (measured: CUDNN_STATUS_NOT_SUPPORTED). ``cudnnReduceTensor`` takes every layout and
    dtype but bfloat16, which goes through float32 copies (``cudnnTransformTensor``)."""
    from .arith import Raw, reduce_views

    vdb = c.views["out"]
    if c.resolved.empty:
        k = vdb.shape[0]
        _empty_sum(c, vdb, tensor_descriptor(vdb.dtype, (1, k, 1, 1), (k, 1, 1, 1)), c.resolved.keep)
        return
    vdy, _ = dense(c, "dy")
    k = vdy.shape[1]
    db_shape = (1, k) + (1,) * (vdy.ndim - 2)
    db = Raw(vdb.dtype, db_shape, contiguous_strides(db_shape), vdb.ptr)
    reduce_views(c.launch, "add", lib.CUDNN_NOT_PROPAGATE_NAN, False, vdy, db, c.alpha, c.beta)


def _bias_graph_refuses(r: _Bias, kw: Any) -> str | None:
    """What the reduction graph does not take (probed on the H100, cuDNN 9.19: no engine for a float16/bfloat16
    output, for a reduction then an IDENTITY cast, or for a C-order dy), which then goes to the legacy call."""
    if r.empty:
        return "an empty dy (a sum over nothing: cudnnSetTensor or cudnnScaleTensor)"
    if r.dtype != "float32":
        return f"a {r.dtype} db (cuDNN 9.19 has no reduction engine that writes it; the legacy call sums in float32)"
    if not r.nhwc:
        return "a dy that is not dense channels-last (cuDNN 9.19 has no reduction engine for it)"
    if kw.get("alpha", 1.0) != 1.0 or kw.get("beta", 0.0) != 0.0:
        return "alpha/beta blending (the legacy call blends)"
    return None


def _bias_graph_build(c: Call) -> tuple[Any, dict]:
    """``db`` as a one-node graph: ``reduction`` ADD of a dense channels-last float32 ``dy`` (as given) to
    ``(1, K, 1, ...)``, float32 compute, written straight into the packed ``(K,)`` output (what else cuDNN 9.19
    has no engine for, :func:`_bias_graph_refuses` sends to the legacy call)."""
    vdy, vdb = c.views["dy"], c.views["out"]
    b = Binder(c)
    dy = b.tensor("dy", vdy.shape, vdy.strides, vdy.dtype)
    shape = (1, vdy.shape[1]) + (1,) * (vdy.ndim - 2)
    db = b.g.reduction(dy, shape, mode="add", compute_dtype="float32", dtype=vdb.dtype)
    b.output(db, "out", vdb.dtype, contiguous_strides(shape))
    return b.done()


def _out_strides(r: _Conv) -> tuple[int, ...] | None:
    return r.y_strides


CONVOLUTION_FORWARD = register(
    Primitive(
        "convolution_forward",
        inputs=(
            Operand("x", _DTYPES + tuple(_QUANT_OUT)),
            Operand("w", _DTYPES + tuple(_QUANT_OUT)),
            Operand("bias", _DTYPES, optional=True),
            Operand("z", _DTYPES, optional=True),
        ),  # fmt: skip
        outputs=(
            Output(
                "out",
                shape=lambda r: r.y_shape,
                strides=_out_strides,
                blend=("alpha", "beta"),
                dtype=lambda r: r.out_dtype or r.dtype,
            ),
        ),  # fmt: skip
        resolve=_fwd_resolve,
        legacy=_legacy("forward"),
        graph=_graph("forward"),
        graph_refuses=_graph_refuses,
        legacy_refuses=_legacy_refuses,
        auto=_auto,
        empty=lambda r: 0 in r.y_shape,
        family=_FAMILY,
        differentiable=("x", "w", "bias"),
        residuals=("x", "w"),
        backward="convolution_backward_data",
    )
)
CONVOLUTION_BACKWARD_DATA = register(
    Primitive(
        "convolution_backward_data",
        inputs=(Operand("dy", _DTYPES), Operand("w", _DTYPES)),
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_out_strides, blend=("alpha", "beta")),),
        resolve=_bwd_data_resolve,
        legacy=_legacy("data"),
        graph=_graph("data"),
        graph_refuses=_graph_refuses,
        legacy_refuses=_legacy_refuses,
        auto=_auto,
        empty=lambda r: 0 in r.y_shape,
        family=_FAMILY,
        differentiable=("dy", "w"),  # as the transposed convolution (L3 "convolution_transpose")
        residuals=("dy", "w"),
        backward="convolution_forward",
    )
)
CONVOLUTION_BACKWARD_FILTER = register(
    Primitive(
        "convolution_backward_filter",
        inputs=(Operand("x", _DTYPES), Operand("dy", _DTYPES)),
        outputs=(Output("out", shape=lambda r: r.y_shape, strides=_out_strides, blend=("alpha", "beta")),),
        resolve=_bwd_filter_resolve,
        legacy=_legacy("filter"),
        graph=_graph("filter"),
        graph_refuses=_graph_refuses,
        legacy_refuses=_legacy_refuses,
        auto=_auto,
        empty=lambda r: False,
        family=_FAMILY,
    )
)


CONVOLUTION_BACKWARD_BIAS = register(
    Primitive(
        "convolution_backward_bias",
        inputs=(Operand("dy", _DTYPES),),
        outputs=(Output("out", shape=lambda r: r.db_shape, packed=True, blend=("alpha", "beta")),),
        resolve=_bias_resolve,
        legacy=_bias_call,
        graph=graph_form(_bias_graph_build),
        graph_refuses=_bias_graph_refuses,
        empty=lambda r: r.db_shape[0] == 0,  # no channels: nothing to write (an empty batch writes zeros)
        family=_FAMILY,
    )
)


# ----------------------------------------------------------------- the public functions


def convolution_forward(
    x: Any,
    w: Any,
    bias: Any = None,
    *,
    z: Any = None,
    z_alpha: float = 1.0,
    activation: str | None = None,
    activation_coef: float | None = None,
    propagate_nan: bool = False,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    conv: Convolution | None = None,
    out_dtype: str | None = None,
    scale: float = 1.0,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``y = alpha * conv(x, w) + beta * out``: ``x`` ``(N, C, *in)``, ``w`` ``(K, C // groups, *k)`` -> ``y``
    ``(N, K, *out)``, with 1 to 3 spatial dims; ``conv=`` a :class:`Convolution` in place of the keywords.

    ``out = (in + pad_before + pad_after - dilation * (k - 1) - 1) // stride + 1`` per spatial dim
    (:func:`cudnnkit.runtime.shapes.conv_output_shape`). ``x``, ``w`` (and ``bias``, ``z``, ``out``) share one of
    float16, bfloat16, float32 (TF32 as ``cudnnkit.settings(allow_tf32=...)`` says) and float64; the half types
    compute in float32. ``x`` and ``w`` dense channels-first or channels-last (others are copied); a new ``y``
    takes ``x``'s layout. See the module docstring for the layouts, the algorithm choice and the paths.

    **Fused:** ``y = act(alpha * conv(x, w) + bias + z_alpha * z)`` with ``bias`` ``(K,)``, a residual ``z`` of
    ``y``'s shape and ``activation`` one of :mod:`cudnnkit.ops.activation`'s modes (``activation_coef`` its
    ``coef``), each optional, all in ``x``'s dtype. The graph path runs it as one graph (``conv_fprop`` -> ``ADD``
    -> ``ADD`` -> ``<MODE>_FWD``); the legacy path (float64, a grouped or float32 convolution with
    ``z_alpha != 1``, whose graphs wrote NaN on cuDNN 9.19, or a graph cuDNN refuses) as
    ``cudnnConvolutionForward``, ``cudnnAddTensor`` and ``cudnnActivationForward`` in place (the graph-only
    activations and asymmetric padding have no legacy form: refused by name there). Those ``z_alpha != 1`` calls
    with asymmetric padding run the graph's convolution alone, then the same
    ``cudnnAddTensor``/``cudnnActivationForward`` epilogue (a graph-only activation there is refused by name).
    ``beta`` must be 0 when fusing.

    **Quantized:** int8 or fp8 (``float8_e4m3fn``, ``float8_e5m2``) ``x`` and ``w`` (the same dtype) give
    ``y = scale * conv(x, w)`` in ``out_dtype``, ``scale`` being the product of the dequantization scales of x and
    w (and y's quantization scale for an 8-bit y). One graph: ``conv_fprop`` (int32 compute for int8, float32 for
    fp8) -> ``MUL`` -> ``y``; nothing fused, no blend, no backward.

    Calls: the graph (``conv_fprop``, the ``CONVOLUTION_FORWARD`` operation) or ``cudnnConvolutionForward`` with
    the algorithm ``cudnnGetConvolutionForwardAlgorithm_v7`` or ``cudnnFindConvolutionForwardAlgorithmEx`` picks
    (primitive :data:`CONVOLUTION_FORWARD`); :func:`cudnnkit.ops.last_path` says which ran.

    Args:
        x: the input ``(N, C, *in)``, 1 to 3 spatial dims, a CUDA array; float16, bfloat16, float32, float64,
            or int8/fp8 (quantized).
        w: the filter ``(K, C // groups, *k)``, ``x``'s dtype and rank.
        bias: ``(K,)`` in ``x``'s dtype, added after the convolution (fused); None: no bias.
        z: a residual of ``y``'s shape and ``x``'s dtype, added after the bias (fused); None: none.
        z_alpha: the residual's scale (needs ``z``).
        activation: an activation applied last (fused), one of :func:`activation_forward`'s modes; None: none.
        activation_coef: the activation's ``coef`` (clip, ELU alpha, ...; needs ``activation``).
        propagate_nan: the fused activation's NaN rule (needs ``activation``; a bool): True asks for NaN out for
            a NaN in, as torch's ReLU: the legacy descriptor's ``CUDNN_PROPAGATE_NAN``, and on the graph path the
            ReLU node's ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION`` (deprecated in cuDNN 9's header; the fused graph
            ``RELU_FWD`` kept NaN with or without it on an H100, cuDNN 9.19). False (the default, cuDNN's): the
            legacy call's ReLUs return 0 for a NaN.
        stride: an int or one per spatial dim, each >= 1.
        padding: an int or one per spatial dim, ``(before, after)`` pairs per dim (unequal pairs run on the graph
            path only), ``"valid"`` or ``"same"`` (stride 1).
        dilation: an int or one per spatial dim, each >= 1.
        groups: the number of groups; divides ``C`` and ``K``.
        mode: ``"cross_correlation"`` (the default, torch's) or ``"convolution"`` (the kernel flipped).
        conv: a :class:`Convolution` in place of ``stride``, ``padding``, ``dilation``, ``groups`` and ``mode``
            (not both).
        out_dtype: the quantized forward's output dtype: for int8 ``x`` float32 (the default), float16, bfloat16
            or int8 (rounded to nearest, saturated); for fp8 float32 (the default), float16, bfloat16 or either
            fp8. For float ``x`` None (or ``x``'s dtype).
        scale: the quantized forward's output scale; 1.0 for float ``x`` (use ``alpha``).
        out: an array of ``y``'s shape, dense channels-first or channels-last, to write; None allocates ``y``.
        alpha: scale of the convolution.
        beta: blend factor of ``out``'s previous contents (needs ``out``; 0 when fused or quantized).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` ``(N, K, *out)`` in ``x``'s dtype (``out_dtype`` when quantized) and library (``out`` when given).

    Raises:
        TypeError: a host array, a dtype outside the list, operands of different dtypes, ``conv=`` with the
            keywords, ``z_alpha`` without ``z`` or ``activation_coef`` without ``activation``.
        ValueError: a rank other than 3 to 5, ``w``/``bias``/``z`` of the wrong shape, ``C`` not ``groups`` times
            ``w``'s second dim, a bad stride/padding/dilation, ``beta`` with a fused or quantized call, an
            ``out_dtype``/``scale`` that does not fit ``x``'s dtype, or a call neither cuDNN path takes.
        cudnnkit.lib.errors.NotSupportedError: cuDNN has no algorithm for the call.

    Example:
        >>> import cupy as cp
        >>> from cudnnkit import ops
        >>> x = cp.random.standard_normal((8, 3, 32, 32), dtype=cp.float32)
        >>> w = cp.random.standard_normal((16, 3, 3, 3), dtype=cp.float32)
        >>> y = ops.convolution_forward(x, w, padding=1)                 # (8, 16, 32, 32)
        >>> b = cp.zeros(16, dtype=cp.float32)
        >>> y = ops.convolution_forward(x, w, b, padding=1, activation="relu")   # relu(conv(x, w) + b)
    """
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv, z_alpha=z_alpha,
              activation=activation, activation_coef=activation_coef, out_dtype=out_dtype, scale=scale)  # fmt: skip
    if propagate_nan is not False:  # the keyword only when given: express keys
        kw["propagate_nan"] = propagate_nan
    return run(CONVOLUTION_FORWARD, {"x": x, "w": w, "bias": bias, "z": z}, out=out, alpha=alpha, beta=beta,
               stream=stream, **kw)  # fmt: skip


def convolution_backward_data(
    dy: Any,
    w: Any,
    *,
    x_shape: Sequence[int] | None = None,
    output_padding: int | Sequence[int] = 0,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    conv: Convolution | None = None,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``dx`` of a convolution from ``dy`` ``(N, K, *out)`` and ``w`` ``(K, C // groups, *k)``, which is also
    the transposed convolution of ``dy`` (torch's ``conv_transpose``, whose weight is ``w``).

    ``dx`` ``(N, C, *in)`` has ``x_shape`` if given, else ``in = (out - 1) * stride - 2 * pad + dilation * (k - 1)
    + 1 + output_padding`` per spatial dim (:func:`cudnnkit.runtime.shapes.conv_transpose_output_shape`).
    ``dy``, ``w`` and ``dx`` share one of float16, bfloat16, float32 and float64; a new ``dx`` takes ``dy``'s
    layout (channels-first or channels-last). Calls: the graph (``conv_dgrad``) or
    ``cudnnConvolutionBackwardData`` with the algorithm ``cudnnGetConvolutionBackwardDataAlgorithm_v7`` or
    ``cudnnFindConvolutionBackwardDataAlgorithmEx`` picks (primitive :data:`CONVOLUTION_BACKWARD_DATA`).

    Args:
        dy: the output's gradient ``(N, K, *out)``, 1 to 3 spatial dims, a CUDA array; float16, bfloat16,
            float32 or float64.
        w: the filter ``(K, C // groups, *k)``, ``dy``'s dtype and rank.
        x_shape: the forward input's shape ``(N, C, *in)`` (it fixes sizes that several inputs convolve to, and is
            needed with ``padding="same"``/``"valid"``); None: computed from ``output_padding``.
        output_padding: added to each computed spatial size, ``0 <= output_padding < max(stride, dilation)``
            (not with ``x_shape``).
        stride: an int or one per spatial dim, each >= 1.
        padding: an int or one per spatial dim, ``(before, after)`` pairs per dim (unequal pairs run on the graph
            path only), ``"valid"`` or ``"same"`` (stride 1).
        dilation: an int or one per spatial dim, each >= 1.
        groups: the number of groups; divides ``C`` and ``K``.
        mode: ``"cross_correlation"`` (the default, torch's) or ``"convolution"`` (the kernel flipped).
        conv: a :class:`Convolution` in place of ``stride``, ``padding``, ``dilation``, ``groups`` and ``mode``
            (not both).
        out: an array of ``dx``'s shape, dense channels-first or channels-last, to write; None allocates ``dx``.
        alpha: scale of the result.
        beta: blend factor of ``out``'s previous contents (needs ``out``).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dx`` ``(N, C, *in)`` in ``dy``'s dtype and library (``out`` when given).

    Raises:
        TypeError: a host array, another dtype, ``w`` of another dtype, ``conv=`` with the keywords, or both
            ``x_shape`` and ``output_padding``.
        ValueError: a rank other than 3 to 5, ``x_shape`` whose convolution with ``w`` does not give ``dy``'s
            shape, a string ``padding`` without ``x_shape``, or a bad stride/padding/dilation/output padding.
        cudnnkit.lib.errors.NotSupportedError: cuDNN has no algorithm for the call.

    Example:
        >>> dx = ops.convolution_backward_data(dy, w, x_shape=x.shape, padding=1)
        >>> up = ops.convolution_backward_data(y, w2, stride=2, padding=1, output_padding=1)  # conv_transpose2d
    """
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv,
              x_shape=x_shape, output_padding=output_padding)  # fmt: skip
    return run(CONVOLUTION_BACKWARD_DATA, {"dy": dy, "w": w}, out=out, alpha=alpha, beta=beta, stream=stream, **kw)


def convolution_backward_filter(
    x: Any,
    dy: Any,
    *,
    w_shape: Sequence[int],
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    mode: str = "cross_correlation",
    conv: Convolution | None = None,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``dw`` ``w_shape`` ``(K, C // groups, *k)`` of a convolution from its input ``x`` ``(N, C, *in)`` and
    ``dy`` ``(N, K, *out)``.

    ``x``, ``dy`` and ``dw`` share one of float16, bfloat16, float32 and float64. A new ``dw`` is C-contiguous, or
    channels-last (``KRSC``) when ``x`` is channels-last; ``beta=1`` accumulates into ``out``. An empty batch gives
    zeros (or ``beta * out``). Calls: the graph (``conv_wgrad``) or ``cudnnConvolutionBackwardFilter`` with the
    algorithm ``cudnnGetConvolutionBackwardFilterAlgorithm_v7`` or ``cudnnFindConvolutionBackwardFilterAlgorithmEx``
    picks (primitive :data:`CONVOLUTION_BACKWARD_FILTER`).

    Args:
        x: the forward's input ``(N, C, *in)``, 1 to 3 spatial dims, a CUDA array; float16, bfloat16, float32 or
            float64.
        dy: the output's gradient ``(N, K, *out)``, ``x``'s dtype and rank.
        w_shape: the filter's shape ``(K, C // groups, *k)`` (required).
        stride: an int or one per spatial dim, each >= 1.
        padding: an int or one per spatial dim, ``(before, after)`` pairs per dim (unequal pairs run on the graph
            path only), ``"valid"`` or ``"same"`` (stride 1).
        dilation: an int or one per spatial dim, each >= 1.
        groups: the number of groups; divides ``C`` and ``K``.
        mode: ``"cross_correlation"`` (the default, torch's) or ``"convolution"`` (the kernel flipped).
        conv: a :class:`Convolution` in place of ``stride``, ``padding``, ``dilation``, ``groups`` and ``mode``
            (not both).
        out: an array of ``w_shape``, dense C order or channels-last, to write; None allocates ``dw``.
        alpha: scale of the result.
        beta: blend factor of ``out``'s previous contents (``beta=1`` accumulates; needs ``out``).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dw`` of ``w_shape`` in ``x``'s dtype and library (``out`` when given).

    Raises:
        TypeError: a host array, another dtype, ``dy`` of another dtype, no ``w_shape``, or ``conv=`` with the
            keywords.
        ValueError: a rank other than 3 to 5, a ``dy`` shape that the convolution of ``x`` by a ``w_shape`` filter
            does not give, or a bad stride/padding/dilation.
        cudnnkit.lib.errors.NotSupportedError: cuDNN has no algorithm for the call.

    Example:
        >>> dw = ops.convolution_backward_filter(x, dy, w_shape=w.shape, padding=1)
        >>> ops.convolution_backward_filter(x, dy, w_shape=w.shape, padding=1, out=dw, beta=1.0)  # accumulate
    """
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv,
              w_shape=w_shape)  # fmt: skip
    return run(CONVOLUTION_BACKWARD_FILTER, {"x": x, "dy": dy}, out=out, alpha=alpha, beta=beta, stream=stream, **kw)


def convolution_backward_bias(dy: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0,
                              stream: Any = None) -> Any:  # fmt: skip
    """``db`` ``(K,)``: ``dy`` ``(N, K, *out)`` summed over every dim but the channels.

    ``db`` has ``dy``'s dtype (float32 accumulation, float64 for float64). Any layout of ``dy``. An empty batch
    gives zeros (or ``beta * out``). The graph form (the default where cuDNN 9.19 has an engine: a dense
    channels-last float32 ``dy`` with no blend) is one ``reduction`` ADD node run with ``cudnnBackendExecute``;
    every other call (and ``settings(prefer="legacy")``) takes the legacy call: a float16/float32 channels-last
    ``dy``'s sum as that reduction graph into a float32 temporary (or straight into a float32 ``db``), blended or
    cast by ``cudnnTransformTensor``; a C-order one by ``cudnnReduceTensor`` with ``CUDNN_REDUCE_TENSOR_ADD``;
    bfloat16 through float32 copies (``cudnnConvolutionBackwardBias`` refuses bfloat16 and channels-last ``dy``
    on cuDNN 9.19). ``settings(prefer="graph")`` raises ``ValueError`` for a call the graph form refuses.
    Primitive :data:`CONVOLUTION_BACKWARD_BIAS`.

    Args:
        dy: the output's gradient ``(N, K, *out)``, 1 to 3 spatial dims, a CUDA array; float16, bfloat16,
            float32 or float64.
        out: a packed ``(K,)`` array of ``dy``'s dtype to write; None allocates ``db``.
        alpha: scale of the sum.
        beta: blend factor of ``out``'s previous contents (needs ``out``).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``db`` ``(K,)`` in ``dy``'s dtype and library (``out`` when given).

    Raises:
        TypeError: a host array or another dtype.
        ValueError: a rank other than 3 to 5, or ``beta != 0`` without ``out``.

    Example:
        >>> db = ops.convolution_backward_bias(dy)          # dy.sum(axis=(0, 2, 3))
    """
    return run(CONVOLUTION_BACKWARD_BIAS, {"dy": dy}, out=out, alpha=alpha, beta=beta, stream=stream)


# ----------------------------------------------------------------- the L3 declarations


def _new(shape: tuple[int, ...], strides: tuple[int, ...] | None, dtype: str) -> Spec:
    return Spec(tuple(shape), tuple(strides) if strides is not None else contiguous_strides(tuple(shape)), dtype)


def _nan_rule(propagate_nan: Any, activation: Any) -> None:
    """``propagate_nan`` checked: a bool (``TypeError`` naming it), True only with the activation it is the rule
    of."""
    if nan_propagation(propagate_nan) == lib.CUDNN_PROPAGATE_NAN and activation is None:
        raise TypeError("propagate_nan is the fused activation's NaN rule: pass activation=")


def _l3_refuse(dtype: str, z: Any, activation: Any, coef: Any = None, propagate_nan: Any = False) -> None:
    """What the differentiable convolution does not take (``NotImplementedError`` naming it; ``propagate_nan``
    without the activation it is the rule of: ``TypeError``)."""
    _nan_rule(propagate_nan, activation)
    if dtype in _QUANT_OUT:
        raise NotImplementedError(f"the differentiable convolution takes float x and w, not {dtype}: the quantized "
                                  "forward (scale * conv) has no backward; call convolution_forward")  # fmt: skip
    if z is not None:
        raise NotImplementedError("z= (the fused residual) is not differentiable here (the declaration's inputs are "
                                  "x, w and bias): add the residual after the convolution")  # fmt: skip
    if activation not in (None, "relu") or (activation is not None and coef is not None):
        raise NotImplementedError(f"activation={activation!r} (activation_coef={coef!r}): the differentiable "
                                  "convolution fuses activation='relu' only, whose gradient its output gives "
                                  "(dy where y > 0); apply other activations as their own op")  # fmt: skip


def _conv_l3_forward(x: Any, w: Any, bias: Any = None, *, z: Any = None, z_alpha: float = 1.0,
                     activation: str | None = None, activation_coef: float | None = None, propagate_nan: bool = False,
                     stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
                     dilation: int | Sequence[int] = 1, groups: int = 1, mode: str = "cross_correlation",
                     conv: Convolution | None = None, out_dtype: str | None = None, scale: float = 1.0) -> Any:  # fmt: skip
    """``y = relu?(conv(x, w) + bias)``: ``x`` ``(N, C, *in)``, ``w`` ``(K, C // groups, *k)``, ``bias`` ``(K,)``
    or None, one float dtype -> ``y`` ``(N, K, *out)`` in x's layout, by one :func:`convolution_forward` (the
    graph's ``conv_fprop`` (+ ``ADD``) (+ ``RELU_FWD``), or ``cudnnConvolutionForward`` + ``cudnnAddTensor`` (+
    ``cudnnActivationForward``, in place)). Residuals ``x``, ``w``, ``bias`` when given (the backward makes db
    only then), and ``out`` (``y``) with ``activation="relu"``: the ReLU's gradient is ``dy`` where ``y > 0``.
    ``propagate_nan=True``: the ReLU returns NaN for a NaN (torch's rule)."""
    dtype = canonical(x.dtype, "x")
    _l3_refuse(dtype, z, activation, activation_coef, propagate_nan)
    # float64 has no graph, so the fused L2 call runs the legacy convolution, cudnnAddTensor and
    # cudnnActivationForward: the same calls made here, each an express hit. A float32 channels-first x keeps them
    # apart too: the fused graph (channels-last engines only) would copy x, w and y (the half types' calls are as
    # before: one fused call)
    split = dtype == "float64" or (
        dtype == "float32" and (bias is not None or activation is not None) and not _channels_last(x)
    )
    nan = {"propagate_nan": propagate_nan} if propagate_nan is not False else {}  # given only: express keys
    y = convolution_forward(x, w, None if split else bias, z_alpha=z_alpha, activation=None if split else activation,
                            stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv,
                            out_dtype=out_dtype, scale=scale, **({} if split else nan))  # fmt: skip
    if split and bias is not None:
        add_tensor(bias.reshape((1, -1) + (1,) * (len(y.shape) - 2)), y)
    if split and activation is not None:
        activation_forward(y, activation, out=y, **nan)
    return (y,), _conv_l3_res(x, w, bias, y if activation is not None else None)


def _channels_last(a: Any) -> bool:
    """Whether the graph takes array ``a`` channels-last as it is (:func:`~cudnnkit.ops._layout.is_channels_last`,
    the rule of the graph form's :func:`~cudnnkit.ops._graphform.channels_last_input`: a C = 1 or 1x1 array is
    both layouts), so the fused graph copies nothing."""
    v = as_view(a, "x")
    return is_channels_last(v.shape, v.strides)


def _conv_l3_res(x: Any, w: Any, bias: Any, y: Any) -> dict:
    res = {"x": x, "w": w}
    if bias is not None:
        res["bias"] = bias
    if y is not None:
        res["out"] = y
    return res


def _conv_l3_backward(res: Any, douts: Any, needs: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                      groups: int = 1, mode: str = "cross_correlation", conv: Any = None, **_: Any) -> tuple:  # fmt: skip
    """From dy ``(N, K, *out)`` (with the fused ReLU first ``g = dy where y > 0``: ``cudnnActivationBackward`` from
    the saved ``y``; else ``g = dy``): dx (:func:`convolution_backward_data` with ``x_shape``: ``conv_dgrad`` or
    ``cudnnConvolutionBackwardData``), dw (:func:`convolution_backward_filter` with ``w_shape``: ``conv_wgrad`` or
    ``cudnnConvolutionBackwardFilter``), db ``(K,)`` (:func:`convolution_backward_bias`: a reduction graph or
    ``cudnnReduceTensor``), each only where needed (db only with a bias); all None for a zero cotangent."""
    (dy,) = douts
    if dy is None:
        return (None, None, None)
    x, w = res["x"], res["w"]
    if "out" in res:
        dy = activation_backward(dy, res["out"], res["out"], "relu")
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv)
    dx = convolution_backward_data(dy, w, x_shape=tuple(x.shape), **p) if needs[0] else None
    dw = convolution_backward_filter(x, dy, w_shape=tuple(w.shape), **p) if needs[1] else None
    db = convolution_backward_bias(dy) if needs[2] and "bias" in res else None
    return dx, dw, db


def _conv_l3_meta(x: Spec, w: Spec, bias: Spec | None = None, *, z: Any = None, activation: Any = None,
                  activation_coef: Any = None, propagate_nan: Any = False, **kw: Any) -> Any:  # fmt: skip
    """y as :func:`convolution_forward` allocates it: the shape ``_fwd_resolve`` gives (``conv_output_shape``),
    channels-last when x is, x's dtype."""
    _l3_refuse(x.dtype, z, activation, activation_coef, propagate_nan)
    views = {"x": spec_view(x), "w": spec_view(w), "bias": None if bias is None else spec_view(bias)}
    r = _fwd_resolve(views, kw)
    y = _new(r.y_shape, r.y_strides, r.out_dtype or r.dtype)
    return (y,), _conv_l3_res(x, w, bias, y if activation is not None else None)


CONVOLUTION = differentiable(
    Differentiable("convolution", "convolution_forward", ("x", "w", "bias"), ("out",), _conv_l3_forward,
                   _conv_l3_backward, _conv_l3_meta, batch=("x", "out"),
                   capture_safe=True,  # conv_fprop/dgrad/wgrad (graph or legacy): device work once the algorithm is chosen
                   doc="y = relu?(conv(x, w) + bias) (bias and the fused ReLU optional); the backward reads x, w "
                       "(and y with the ReLU): activation_backward, then convolution_backward_data, _filter, "
                       "_bias (each only where needed)")
)  # fmt: skip


def _convt_l3_forward(dy: Any, w: Any, *, x_shape: Sequence[int] | None = None, output_padding: Any = 0,
                      stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
                      mode: str = "cross_correlation", conv: Convolution | None = None) -> Any:  # fmt: skip
    """The transposed convolution of ``dy`` ``(N, K, *in)`` by ``w`` ``(K, C // groups, *k)`` (torch's
    ``conv_transpose`` weight), one float dtype: ``y`` ``(N, C, *out)`` in dy's layout, ``out`` as
    :func:`convolution_backward_data` gives it (``x_shape``, or ``output_padding``): ``conv_dgrad`` or
    ``cudnnConvolutionBackwardData``. No bias (add it after). Residuals ``dy`` and ``w``."""
    y = convolution_backward_data(dy, w, x_shape=x_shape, output_padding=output_padding, stride=stride,
                                  padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv)  # fmt: skip
    return (y,), {"dy": dy, "w": w}


def _convt_l3_backward(res: Any, douts: Any, needs: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                       groups: int = 1, mode: str = "cross_correlation", conv: Any = None, **_: Any) -> tuple:  # fmt: skip
    """The adjoint of backward data, from g (y's cotangent, ``(N, C, *out)``, as a convolution's input): d(dy) =
    :func:`convolution_forward` ``(g, w)`` (``conv_fprop`` or ``cudnnConvolutionForward``), dw =
    :func:`convolution_backward_filter` ``(g, dy)`` (``conv_wgrad`` or ``cudnnConvolutionBackwardFilter``), each
    only where needed."""
    (g,) = douts
    if g is None:
        return (None, None)
    dy, w = res["dy"], res["w"]
    p = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode, conv=conv)
    ddy = convolution_forward(g, w, **p) if needs[0] else None
    dw = convolution_backward_filter(g, dy, w_shape=tuple(w.shape), **p) if needs[1] else None
    return ddy, dw


def _convt_l3_meta(dy: Spec, w: Spec, **kw: Any) -> Any:
    """y as :func:`convolution_backward_data` allocates it (``_bwd_data_resolve``: channels-last when dy is)."""
    r = _bwd_data_resolve({"dy": spec_view(dy), "w": spec_view(w)}, kw)
    return (_new(r.y_shape, r.y_strides, r.dtype),), {"dy": dy, "w": w}


def _convt_batch_refuses(kw: Any, specs: Any) -> str | None:
    """A batch folds into the samples unless ``x_shape=`` names the output's batch size."""
    return "x_shape= names the output's batch size" if kw.get("x_shape") is not None else None


CONVOLUTION_TRANSPOSE = differentiable(
    Differentiable("convolution_transpose", "convolution_backward_data", ("dy", "w"), ("out",), _convt_l3_forward,
                   _convt_l3_backward, _convt_l3_meta, batch=("dy", "out"), batch_refuses=_convt_batch_refuses,
                   capture_safe=True,  # dgrad, then fprop and wgrad: device work once the algorithms are chosen
                   doc="the transposed convolution (convolution_backward_data of dy by w, x_shape= or "
                       "output_padding=); the backward: convolution_forward and convolution_backward_filter")
)  # fmt: skip
