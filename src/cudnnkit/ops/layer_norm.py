"""Layer, RMS and instance norm, forward and backward, on cuDNN's graph API (``OPERATION_NORM_FORWARD`` /
``OPERATION_NORM_BACKWARD``). Batch norm is :mod:`cudnnkit.ops.normalization`; what the two share is
:mod:`cudnnkit.ops._norm_common`.

Shapes (logical order whatever the memory layout; the parameters and statistics are float32)

================================  ====================  ===========================  =================================
function                          ``x``, ``y``, ``dy``  ``scale``, ``bias``          saved statistics
================================  ====================  ===========================  =================================
layer norm                        ``(*lead, *norm)``    ``norm``                     ``(*lead, 1...)``: ``mean``,
                                                                                     ``inv_std``
RMS norm                          ``(*lead, *norm)``    ``norm`` (no bias)           ``(*lead, 1...)``: ``inv_std``
instance norm                     ``(N, C, *sp)``       ``(C,)``                     ``(N, C)``: ``mean``, ``inv_std``
================================  ====================  ===========================  =================================

``sp`` is 1 to 3 spatial dims. Layer and RMS norm normalize over the trailing dims that ``scale`` has (``norm =
x.shape[-k:]``, ``k = scale.ndim`` or ``normalized_shape_ndim``); cuDNN's graph layer norm normalizes every dim but
the batch, so ``x`` runs as ``(prod(lead), prod(norm), 1, 1)``. ``inv_std = 1 / sqrt(var + epsilon)`` (the
biased variance); RMS norm's is ``1 / sqrt(mean(x**2) + epsilon)``.

Dtypes: ``x``, ``y``, ``dy``, ``dx`` share one of float16, bfloat16 and float32; the parameters and their
gradients are float32, as batch norm's rule has them, and so are the statistics. Anything else is refused
(``TypeError`` naming the argument); the graph API has no float64 (``ValueError``).

Layouts: instance norm takes ``x`` dense channels-first (C order) or channels-last (NHWC) and gives a new
``y``/``dx`` in ``x``'s layout; layer and RMS norm take C-order arrays (others are copied; a given ``y``/``dx``
must be C-contiguous). Parameters and statistics are packed (C-contiguous): inputs are copied when they are not,
and given ``out=`` statistics, which cuDNN writes, must be.

cuDNN calls: one graph per call signature (:mod:`cudnnkit.ops._graphform`: ``NORM_FORWARD`` with phase training or
inference, ``NORM_BACKWARD``), planned once with the settings' heuristics and cached; cuDNN having no engine for a
graph raises :class:`~cudnnkit.graph.UnsupportedGraphError` (there is no legacy form to fall back to).

The saved statistics and parameter gradients come back after the main output (the primitive's ``extras``), as
batch norm's do.

L3 (:mod:`cudnnkit.autograd`, :mod:`cudnnkit.torch`): ``layer_norm``, ``rms_norm`` and ``instance_norm`` are
declared at the end (:class:`~cudnnkit.ops._diff.Differentiable`), each with one output ``y`` and the saved
statistics as residuals; in inference they compute their statistics again in the backward.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from .. import lib
from ..graph.checks import as_bool
from ..runtime import WRITTEN, tensor_descriptor
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import scaling_ref
from ..runtime.view import ArrayView
from ._diff import Differentiable, Spec, differentiable, spec_view
from ._graphform import Binder, graph_form
from ._nd import layout_of
from ._norm_common import (
    _DTYPES,
    _PARAMS,
    _canon,
    _epsilon,
    _fits,
    _in_layout,
    _meta_x,
    _needed,
    _new_strides,
    _out_layout,
    _outs,
    _p,
    _packed_spec,
    _param,
    _stat,
)
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = [
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm_forward",
    "rms_norm_backward",
    "instance_norm_forward",
    "instance_norm_backward",
]


# ----------------------------------------------------------------- layer, RMS and instance norm (graph)


class _GN(NamedTuple):
    """A graph-norm call, resolved (hashable)."""

    mode: str  #: "layer", "rms", "instance"
    dtype: str
    training: bool
    epsilon: float
    x_shape: tuple[int, ...]
    p_shape: tuple[int, ...]
    s_shape: tuple[int, ...]  #: the statistics' shape, as returned
    rows: int  #: layer/rms: the samples (prod of the leading dims); instance: N
    cols: int  #: layer/rms: the normalized elements; instance: C
    lay: str  #: instance: the layout of a new y/dx
    bias: bool = True


def _graph_x(v: Any, name: str, fn: str) -> None:
    if v.dtype == "float64":
        raise ValueError(f"{fn}: {name} has dtype float64, which cuDNN's graph API (the only form of this norm) "
                         "does not have; use float32, float16 or bfloat16")  # fmt: skip
    _fits(v, name)


def _norm_ndim(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"normalized_shape_ndim must be an int (or None: scale's ndim), got {v!r}")
    return int(v)


def _ln_shapes(vx: Any, vs: Any, kw: Any) -> tuple[int, tuple[int, ...]]:
    k = kw.get("normalized_shape_ndim")
    k = vs.ndim if k is None else _norm_ndim(k)
    if not 1 <= k < vx.ndim:
        raise ValueError(f"normalized_shape_ndim must be in [1, x.ndim - 1] = [1, {vx.ndim - 1}] (x {vx.shape}: "
                         f"the leading dims are the samples), got {k}")  # fmt: skip
    return k, tuple(vx.shape[-k:])


def _gn_common(mode: str, fn: str, views: Any, kw: Any, x: str, backward: bool) -> _GN:
    vx, vs = views[x], views["scale"]
    _graph_x(vx, x, fn)
    if mode == "instance":
        if not 3 <= vx.ndim <= 5:
            raise ValueError(f"{x} must have 3 to 5 dims (N, C, 1 to 3 spatial), got shape {vx.shape}")
        p_shape, s_shape = (vx.shape[1],), tuple(vx.shape[:2])
        rows, cols = vx.shape[0], vx.shape[1]
        lay = layout_of(vx) or "nchw"
    else:
        k, p_shape = _ln_shapes(vx, vs, kw)
        s_shape = tuple(vx.shape[:-k]) + (1,) * k
        rows, cols = math.prod(vx.shape[:-k]), math.prod(p_shape)
        lay = "nchw"
    if vx.size == 0:
        raise ValueError(f"{x} has shape {vx.shape}: {fn} takes a non-empty array")
    _param(vs, "scale", p_shape, "float32", x, graph=True)
    if views.get("bias") is not None:
        _param(views["bias"], "bias", p_shape, "float32", x, graph=True)
    training = True if backward else as_bool(kw.get("training", True), "training")
    eps = 1e-5 if backward else _epsilon(kw.get("epsilon", 1e-5), legacy=False)
    stats = ("mean", "inv_std") if not backward else ("dscale", "dbias")
    for n in stats:
        if views.get(n) is None:
            continue
        if not training:
            raise ValueError(f"{n}: inference (training=False) saves no statistics")
        _param(views[n], n, s_shape if not backward else p_shape, "float32", x, written=True, graph=True)
    if backward:
        for n in ("mean", "inv_std"):
            if n in views:
                _param(views[n], n, s_shape, "float32", x, graph=True)
    return _GN(mode, vx.dtype, training, eps, tuple(vx.shape), p_shape, s_shape, rows, cols, lay,
               views.get("bias") is not None or backward)  # fmt: skip


def _gn_resolve(mode: str, fn: str, backward: bool = False) -> Any:
    def resolve(views: Any, kw: Any) -> _GN:
        return _gn_common(mode, fn, views, kw, "x", backward)

    return resolve


def _gdims(r: _GN, what: str, lay: str = "nchw") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The graph tensor of ``what`` ("x", "param", "stat"): layer/rms as cuDNN's ``(samples, features, 1, 1)``
    with its frontend's strides ``(F, 1, F, F)``; instance as ``(N, C, *sp)`` in ``lay``, parameters ``(1, C, 1...)``
    and statistics ``(N, C, 1...)``, each channels-last (as cudnn-frontend's samples describe them)."""
    if r.mode == "instance":
        rank = max(len(r.x_shape), 4)
        if what == "x":
            return _canon(r.x_shape, lay)
        shape = ((1, r.cols) if what == "param" else (r.rows, r.cols)) + (1,) * (rank - 2)
        return _canon(shape, "nhwc", rank)
    n, f = r.rows, r.cols
    if what == "x":
        return (n, f, 1, 1), (f, 1, f, f)
    if what == "param":
        return (1, f, 1, 1), (f, 1, f, f)
    return (n, 1, 1, 1), (1, 1, 1, 1)


def _zero_bias(c: Call) -> None:
    """A zero bias for a layer/instance norm called without one (cuDNN's graph needs a bias): a buffer from the
    arrays' allocator set to 0 by ``cudnnSetTensor`` on the launch stream."""
    r = c.resolved
    ws, ptr = c.launch.workspace(4 * r.cols)
    shape = (1, r.cols, 1, 1)
    lib.cudnnSetTensor(c.launch.handle, tensor_descriptor("float32", shape, contiguous_strides(shape)), ptr,
                       scaling_ref("float32", 0.0))  # fmt: skip
    c.extra["_zero_bias"] = ws
    c.views["bias"] = ArrayView((r.cols,), (1,), "float32", c.launch.device, ptr, ws, c.launch.adapter)


def _gn_fwd_prepare(c: Call) -> None:
    r = c.resolved
    if r.mode == "instance":
        c.views["x"] = _in_layout(c, "x", _out_layout(c, "y"))
    if r.mode != "rms" and c.views.get("bias") is None:
        _zero_bias(c)
    if r.training:
        if r.mode != "rms":
            _stat(c, "mean", r.s_shape, "float32")
        _stat(c, "inv_std", r.s_shape, "float32")


def _gn_tensor(b: Binder, r: _GN, lay: str, name: str, what: str, dtype: str) -> Any:
    return b.tensor(name, *_gdims(r, what, lay), dtype)


def _gn_fwd_build(c: Call) -> tuple[Any, dict]:
    r = c.resolved
    b = Binder(c)
    lay = layout_of(c.views["y"]) or "nchw"
    x = _gn_tensor(b, r, lay, "x", "x", r.dtype)
    s = _gn_tensor(b, r, lay, "scale", "param", "float32")
    bias = _gn_tensor(b, r, lay, "bias", "param", "float32") if r.mode != "rms" else None
    res = b.g.norm_forward(r.mode, x, s, bias, phase="training" if r.training else "inference", epsilon=r.epsilon)
    b.output(res.y, "y", r.dtype, _gdims(r, "x", lay)[1])
    if r.training:
        st = _gdims(r, "stat")[1]
        if res.mean is not None:
            b.output(res.mean, "mean", "float32", st)
        b.output(res.inv_variance, "inv_std", "float32", st)
    return b.done()


def _gn_bwd_prepare(c: Call) -> None:
    r = c.resolved
    if r.mode == "instance":
        lay = _out_layout(c, "dx")
        c.views["x"], c.views["dy"] = _in_layout(c, "x", lay), _in_layout(c, "dy", lay)
    _stat(c, "dscale", r.p_shape, "float32")
    if r.mode != "rms":
        _stat(c, "dbias", r.p_shape, "float32")


def _gn_bwd_build(c: Call) -> tuple[Any, dict]:
    r = c.resolved
    b = Binder(c)
    lay = layout_of(c.views["dx"]) or "nchw"
    x, dy = _gn_tensor(b, r, lay, "x", "x", r.dtype), _gn_tensor(b, r, lay, "dy", "x", r.dtype)
    s = _gn_tensor(b, r, lay, "scale", "param", "float32")
    mean = _gn_tensor(b, r, lay, "mean", "stat", "float32") if r.mode != "rms" else None
    inv = _gn_tensor(b, r, lay, "inv_std", "stat", "float32")
    res = b.g.norm_backward(r.mode, x, dy, s, mean=mean, inv_variance=inv)
    ps = _gdims(r, "param")[1]
    b.output(res.dx, "dx", r.dtype, _gdims(r, "x", lay)[1])
    b.output(res.dscale, "dscale", "float32", ps)
    if res.dbias is not None:
        b.output(res.dbias, "dbias", "float32", ps)
    return b.done()


def _gn_out_strides(r: _GN) -> tuple[int, ...] | None:
    return _new_strides(r.x_shape, r.lay) if r.mode == "instance" else None


_C_ORDER = "{name} must be C-contiguous (the graph takes the normalized dims packed), got strides {strides}"


def _gn_primitives(mode: str, fn: str) -> tuple[Primitive, Primitive]:
    packed = mode != "instance"  # layer/rms run as (samples, features): C order
    stats = ("inv_std",) if mode == "rms" else ("mean", "inv_std")
    grads = ("dscale",) if mode == "rms" else ("dscale", "dbias")
    x_op = Operand("x", _DTYPES, packed=packed)
    f32 = _PARAMS  # float64 passes the dtype check so that resolve refuses a float64 x by name first
    params = (_p("scale", f32),) + (() if mode == "rms" else (_p("bias", f32, optional=True),))
    fwd = Primitive(
        f"{fn}_forward",
        inputs=(x_op, *params, *(Operand(n, _PARAMS, optional=True, flags=WRITTEN) for n in stats)),
        outputs=(
            Output("y", shape=lambda r: r.x_shape, strides=_gn_out_strides, packed=_C_ORDER if packed else False),
        ),
        resolve=_gn_resolve(mode, f"{fn}_forward"),
        graph=graph_form(_gn_fwd_build, _gn_fwd_prepare),
        extras=stats,
        empty=lambda r: False,
        family=fn,
        differentiable=("x", *(p.name for p in params)),
        residuals=("x", "scale", *stats),
        backward=f"{fn}_backward",
    )
    bwd = Primitive(
        f"{fn}_backward",
        inputs=(
            Operand("dy", _DTYPES, packed=packed),
            Operand("x", like="dy", packed=packed),
            _p("scale", f32),
            *(_p(n, f32) for n in stats),
            *(Operand(n, _PARAMS, optional=True, flags=WRITTEN) for n in grads),
        ),  # fmt: skip
        outputs=(
            Output("dx", shape=lambda r: r.x_shape, strides=_gn_out_strides, packed=_C_ORDER if packed else False),
        ),
        resolve=_gn_resolve(mode, f"{fn}_backward", backward=True),
        graph=graph_form(_gn_bwd_build, _gn_bwd_prepare),
        extras=grads,
        empty=lambda r: False,
        family=fn,
    )
    return register(fwd), register(bwd)


LAYER_NORM_FORWARD, LAYER_NORM_BACKWARD = _gn_primitives("layer", "layer_norm")
RMS_NORM_FORWARD, RMS_NORM_BACKWARD = _gn_primitives("rms", "rms_norm")
INSTANCE_NORM_FORWARD, INSTANCE_NORM_BACKWARD = _gn_primitives("instance", "instance_norm")


def _gn_forward(p: Primitive, fn: str, stats: tuple[str, ...], arrays: dict[str, Any], training: Any, out: Any,
                stream: Any, **kw: Any) -> Any:  # fmt: skip
    training = as_bool(training, "training")
    if training:
        y, *given = _outs(fn, out, ("y", *stats))
    else:
        y, given = out, [None] * len(stats)
    arrays.update(zip(stats, given))
    res = run(p, arrays, stream=stream, y=y, training=training, **kw)
    return res if training else res[0]


def layer_norm_forward(
    x: Any,
    scale: Any,
    bias: Any = None,
    *,
    normalized_shape_ndim: int | None = None,
    epsilon: float = 1e-5,
    training: bool = True,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Layer normalization over the trailing ``k`` dims of ``x`` (``k = normalized_shape_ndim``, default
    ``scale.ndim``; torch's ``normalized_shape = x.shape[-k:]``): ``y = (x - mean) * inv_std * scale + bias`` with
    per-sample statistics (``inv_std = 1 / sqrt(var + epsilon)``, the biased variance).

    cuDNN normalizes every dim but the batch, so ``x`` runs as ``(prod(x.shape[:-k]), prod(x.shape[-k:]), 1, 1)``:
    one graph ``NORM_FORWARD`` (``CUDNN_LAYER_NORM``, phase training or inference; primitive
    :data:`LAYER_NORM_FORWARD`), planned once per signature and cached, run by ``cudnnBackendExecute``. float64 is refused (the graph API has
    none).

    Args:
        x: ``(*lead, *norm)``, at least 2 dims, non-empty, C-contiguous (others are copied), a CUDA array;
            float16, bfloat16 or float32.
        scale: float32 ``x.shape[-k:]``.
        bias: float32 ``x.shape[-k:]``; None: zero.
        normalized_shape_ndim: ``k``, the number of trailing dims normalized, in ``[1, x.ndim - 1]``; None:
            ``scale.ndim``.
        epsilon: added to the variance (mean square for RMS norm), > 0.
        training: return the statistics the backward reads (True), or ``y`` alone (False).
        out: training: ``(y, mean, inv_std)``, each an array to write or None (``y`` C-contiguous, the statistics
            packed); inference: ``y`` or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        Training: ``(y, mean, inv_std)``, ``y`` ``x``'s shape and dtype, the statistics float32
        ``x.shape[:-k] + (1,) * k`` (torch's ``native_layer_norm``); inference: ``y``.

    Raises:
        TypeError: a host array, another dtype, ``scale``/``bias``/statistics not float32, or a
            ``normalized_shape_ndim`` that is not an int.
        ValueError: float64 ``x``, an empty ``x``, ``k`` out of range, parameters of the wrong shape, or
            ``epsilon`` <= 0.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> import cupy as cp
        >>> from cudnnkit import ops
        >>> x = cp.random.standard_normal((4, 128, 768), dtype=cp.float16)
        >>> g, b = cp.ones(768, cp.float32), cp.zeros(768, cp.float32)
        >>> y, mean, inv_std = ops.layer_norm_forward(x, g, b)       # mean, inv_std: (4, 128, 1)
        >>> y = ops.layer_norm_forward(x, g, b, training=False)
    """
    arrays = {"x": x, "scale": scale, "bias": bias}
    return _gn_forward(LAYER_NORM_FORWARD, "layer_norm_forward", ("mean", "inv_std"), arrays, training, out, stream,
                       normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon)  # fmt: skip


def layer_norm_backward(
    dy: Any,
    x: Any,
    scale: Any,
    mean: Any,
    inv_std: Any,
    *,
    normalized_shape_ndim: int | None = None,
    out: Any = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """``(dx, dscale, dbias)`` of :func:`layer_norm_forward` from ``dy``, its input ``x``, ``scale`` and its
    saved ``mean``/``inv_std``.

    One graph ``NORM_BACKWARD`` (``CUDNN_LAYER_NORM``; primitive :data:`LAYER_NORM_BACKWARD`) run by
    ``cudnnBackendExecute``, ``x`` as
    ``(prod(x.shape[:-k]), prod(x.shape[-k:]), 1, 1)`` as in the forward.

    Args:
        dy: ``y``'s gradient, ``x``'s shape and dtype.
        x: ``(*lead, *norm)``, at least 2 dims, non-empty, C-contiguous (others are copied), a CUDA array;
            float16, bfloat16 or float32.
        scale: the forward's ``scale``, float32 ``x.shape[-k:]``.
        mean: the forward's ``mean``, float32 ``x.shape[:-k] + (1,) * k``.
        inv_std: the forward's ``inv_std``, as ``mean``.
        normalized_shape_ndim: ``k``, the number of trailing dims normalized, in ``[1, x.ndim - 1]``; None:
            ``scale.ndim``.
        out: ``(dx, dscale, dbias)``, each an array to write or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dscale, dbias)``: ``dx`` ``x``'s shape and dtype, ``dscale``/``dbias`` float32 ``x.shape[-k:]``
        (``dbias`` also when the forward had no bias).

    Raises:
        TypeError: a host array, another dtype, or float32 operands of another dtype.
        ValueError: float64 ``x``, an empty ``x``, ``k`` out of range, or operands of the wrong shape.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> y, mean, inv_std = ops.layer_norm_forward(x, g, b)
        >>> dx, dg, db = ops.layer_norm_backward(dy, x, g, mean, inv_std)
    """
    dx, ds, db = _outs("layer_norm_backward", out, ("dx", "dscale", "dbias"))
    arrays = {"dy": dy, "x": x, "scale": scale, "mean": mean, "inv_std": inv_std, "dscale": ds, "dbias": db}
    return run(LAYER_NORM_BACKWARD, arrays, stream=stream, dx=dx, normalized_shape_ndim=normalized_shape_ndim)


def rms_norm_forward(
    x: Any,
    scale: Any,
    *,
    normalized_shape_ndim: int | None = None,
    epsilon: float = 1e-5,
    training: bool = True,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """RMS normalization over the trailing ``k`` dims of ``x`` (as :func:`layer_norm_forward`): ``y = x *
    inv_std * scale``, ``inv_std = 1 / sqrt(mean(x**2) + epsilon)`` per sample, no bias.

    One graph ``NORM_FORWARD`` (``CUDNN_RMS_NORM``, phase training or inference; primitive
    :data:`RMS_NORM_FORWARD`) run by ``cudnnBackendExecute``, ``x`` as ``(prod(x.shape[:-k]),
    prod(x.shape[-k:]), 1, 1)``; no float64.

    Args:
        x: ``(*lead, *norm)``, at least 2 dims, non-empty, C-contiguous (others are copied), a CUDA array;
            float16, bfloat16 or float32.
        scale: float32 ``x.shape[-k:]``.
        normalized_shape_ndim: ``k``, the number of trailing dims normalized, in ``[1, x.ndim - 1]``; None:
            ``scale.ndim``.
        epsilon: added to the variance (mean square for RMS norm), > 0.
        training: return the statistics the backward reads (True), or ``y`` alone (False).
        out: training: ``(y, inv_std)``, each an array to write or None; inference: ``y`` or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        Training: ``(y, inv_std)``, ``inv_std`` float32 ``x.shape[:-k] + (1,) * k``; inference: ``y``.

    Raises:
        TypeError: a host array, another dtype, ``scale``/``inv_std`` not float32, or a ``normalized_shape_ndim``
            that is not an int.
        ValueError: float64 ``x``, an empty ``x``, ``k`` out of range, ``scale`` of the wrong shape, or
            ``epsilon`` <= 0.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> x = cp.random.standard_normal((4, 128, 4096), dtype=cp.bfloat16)
        >>> y, inv_std = ops.rms_norm_forward(x, cp.ones(4096, cp.float32), epsilon=1e-6)
    """
    return _gn_forward(RMS_NORM_FORWARD, "rms_norm_forward", ("inv_std",), {"x": x, "scale": scale}, training, out,
                       stream, normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon)  # fmt: skip


def rms_norm_backward(
    dy: Any,
    x: Any,
    scale: Any,
    inv_std: Any,
    *,
    normalized_shape_ndim: int | None = None,
    out: Any = None,
    stream: Any = None,
) -> tuple[Any, Any]:
    """``(dx, dscale)`` of :func:`rms_norm_forward` from ``dy``, its input ``x``, ``scale`` and its saved
    ``inv_std``.

    One graph ``NORM_BACKWARD`` (``CUDNN_RMS_NORM``; primitive :data:`RMS_NORM_BACKWARD`) run by
    ``cudnnBackendExecute``.

    Args:
        dy: ``y``'s gradient, ``x``'s shape and dtype.
        x: ``(*lead, *norm)``, at least 2 dims, non-empty, C-contiguous (others are copied), a CUDA array;
            float16, bfloat16 or float32.
        scale: the forward's ``scale``, float32 ``x.shape[-k:]``.
        inv_std: the forward's ``inv_std``, float32 ``x.shape[:-k] + (1,) * k``.
        normalized_shape_ndim: ``k``, the number of trailing dims normalized, in ``[1, x.ndim - 1]``; None:
            ``scale.ndim``.
        out: ``(dx, dscale)``, each an array to write or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dscale)``: ``dx`` ``x``'s shape and dtype, ``dscale`` float32 ``x.shape[-k:]``.

    Raises:
        TypeError: a host array, another dtype, or float32 operands of another dtype.
        ValueError: float64 ``x``, an empty ``x``, ``k`` out of range, or operands of the wrong shape.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> y, inv_std = ops.rms_norm_forward(x, g)
        >>> dx, dg = ops.rms_norm_backward(dy, x, g, inv_std)
    """
    dx, ds = _outs("rms_norm_backward", out, ("dx", "dscale"))
    arrays = {"dy": dy, "x": x, "scale": scale, "inv_std": inv_std, "dscale": ds}
    return run(RMS_NORM_BACKWARD, arrays, stream=stream, dx=dx, normalized_shape_ndim=normalized_shape_ndim)


def instance_norm_forward(
    x: Any,
    scale: Any,
    bias: Any = None,
    *,
    epsilon: float = 1e-5,
    training: bool = True,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Instance normalization of ``x`` ``(N, C, *sp)`` (1 to 3 spatial dims): statistics per ``(n, c)`` over the
    spatial dims, ``y = (x - mean) * inv_std * scale[c] + bias[c]``.

    ``y`` takes ``x``'s layout (NCHW or NHWC). One graph ``NORM_FORWARD`` (``CUDNN_INSTANCE_NORM``, phase
    training or inference; primitive :data:`INSTANCE_NORM_FORWARD`) run by ``cudnnBackendExecute``; no float64.

    Args:
        x: ``(N, C, *sp)``, 1 to 3 spatial dims, non-empty, a CUDA array; float16, bfloat16 or float32; dense
            channels-first or channels-last (others are copied to C order).
        scale: float32 ``(C,)``.
        bias: float32 ``(C,)``; None: zero.
        epsilon: added to the variance (mean square for RMS norm), > 0.
        training: return the statistics the backward reads (True), or ``y`` alone (False).
        out: training: ``(y, mean, inv_std)``, each an array to write or None; inference: ``y`` or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        Training: ``(y, mean, inv_std)``, the statistics float32 ``(N, C)``; inference: ``y``.

    Raises:
        TypeError: a host array, another dtype, or ``scale``/``bias``/statistics not float32.
        ValueError: float64 ``x``, a rank outside 3 to 5, an empty ``x``, parameters of the wrong shape, or
            ``epsilon`` <= 0.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> x = cp.random.standard_normal((2, 64, 32, 32), dtype=cp.float32)
        >>> y, mean, inv_std = ops.instance_norm_forward(x, cp.ones(64, cp.float32), cp.zeros(64, cp.float32))
    """
    arrays = {"x": x, "scale": scale, "bias": bias}
    return _gn_forward(INSTANCE_NORM_FORWARD, "instance_norm_forward", ("mean", "inv_std"), arrays, training, out,
                       stream, epsilon=epsilon)  # fmt: skip


def instance_norm_backward(
    dy: Any,
    x: Any,
    scale: Any,
    mean: Any,
    inv_std: Any,
    *,
    out: Any = None,
    stream: Any = None,
) -> tuple[Any, Any, Any]:
    """``(dx, dscale, dbias)`` of :func:`instance_norm_forward` from ``dy``, its input ``x``, ``scale`` and its
    saved ``mean``/``inv_std`` ``(N, C)``.

    One graph ``NORM_BACKWARD`` (``CUDNN_INSTANCE_NORM``; primitive :data:`INSTANCE_NORM_BACKWARD`) run by
    ``cudnnBackendExecute``.

    Args:
        dy: ``y``'s gradient, ``x``'s shape and dtype.
        x: ``(N, C, *sp)``, 1 to 3 spatial dims, non-empty, a CUDA array; float16, bfloat16 or float32; dense
            channels-first or channels-last (others are copied to C order).
        scale: the forward's ``scale``, float32 ``(C,)``.
        mean: the forward's ``mean``, float32 ``(N, C)``.
        inv_std: the forward's ``inv_std``, float32 ``(N, C)``.
        out: ``(dx, dscale, dbias)``, each an array to write or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dscale, dbias)``: ``dx`` ``x``'s shape and dtype, ``dscale``/``dbias`` float32 ``(C,)``.

    Raises:
        TypeError: a host array, another dtype, or float32 operands of another dtype.
        ValueError: float64 ``x``, a rank outside 3 to 5, an empty ``x``, or operands of the wrong shape.
        cudnnkit.graph.UnsupportedGraphError: cuDNN has no engine for the graph.

    Example:
        >>> y, mean, inv_std = ops.instance_norm_forward(x, g, b)
        >>> dx, dg, db = ops.instance_norm_backward(dy, x, g, mean, inv_std)
    """
    dx, ds, db = _outs("instance_norm_backward", out, ("dx", "dscale", "dbias"))
    arrays = {"dy": dy, "x": x, "scale": scale, "mean": mean, "inv_std": inv_std, "dscale": ds, "dbias": db}
    return run(INSTANCE_NORM_BACKWARD, arrays, stream=stream, dx=dx)


# ----------------------------------------------------------------- the L3 declarations


def _gn_l3_meta(mode: str, fn: str, x: Spec, scale: Spec, bias: Spec | None, kw: dict) -> tuple[tuple, dict]:
    _meta_x(x, scale, fn)
    r = _gn_common(mode, f"{fn}_forward", {"x": spec_view(x), "scale": spec_view(scale), "bias": spec_view(bias)},
                   kw, "x", False)  # fmt: skip
    y = Spec(r.x_shape, _gn_out_strides(r) or contiguous_strides(r.x_shape), r.dtype)
    res = {"x": x, "scale": scale}
    if r.training:
        stats = ("inv_std",) if mode == "rms" else ("mean", "inv_std")
        res.update((n, _packed_spec(r.s_shape, "float32")) for n in stats)
    return (y,), res


def _gn_l3_result(got: Any, x: Any, scale: Any, training: Any, stats: tuple[str, ...]) -> tuple[tuple, dict]:
    if not as_bool(training, "training"):  # no statistics: the backward computes them again
        return (got,), {"x": x, "scale": scale}
    return (got[0],), {"x": x, "scale": scale, **dict(zip(stats, got[1:]))}


def _ln_l3_forward(x: Any, scale: Any, bias: Any = None, *, normalized_shape_ndim: int | None = None,
                   epsilon: float = 1e-5, training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    got = layer_norm_forward(x, scale, bias, normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon,
                             training=training)  # fmt: skip
    return _gn_l3_result(got, x, scale, training, ("mean", "inv_std"))


def _ln_l3_meta(x: Spec, scale: Spec, bias: Spec | None = None, *, normalized_shape_ndim: int | None = None,
                epsilon: float = 1e-5, training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    kw = dict(normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon, training=training)
    return _gn_l3_meta("layer", "layer_norm", x, scale, bias, kw)


def _ln_l3_backward(res: dict, douts: tuple, needs: tuple, *, normalized_shape_ndim: int | None = None,
                    epsilon: float = 1e-5, **_: Any) -> tuple:  # fmt: skip
    (dy,) = douts
    if dy is None or not any(needs):
        return (None,) * 3
    k, x, s = normalized_shape_ndim, res["x"], res["scale"]
    if "mean" in res:
        mean, inv = res["mean"], res["inv_std"]
    else:
        _, mean, inv = layer_norm_forward(x, s, None, normalized_shape_ndim=k, epsilon=epsilon, training=True)
    return _needed(layer_norm_backward(dy, x, s, mean, inv, normalized_shape_ndim=k), needs)


def _rms_l3_forward(x: Any, scale: Any, *, normalized_shape_ndim: int | None = None, epsilon: float = 1e-5,
                    training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    got = rms_norm_forward(x, scale, normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon, training=training)
    return _gn_l3_result(got, x, scale, training, ("inv_std",))


def _rms_l3_meta(x: Spec, scale: Spec, *, normalized_shape_ndim: int | None = None, epsilon: float = 1e-5,
                 training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    kw = dict(normalized_shape_ndim=normalized_shape_ndim, epsilon=epsilon, training=training)
    return _gn_l3_meta("rms", "rms_norm", x, scale, None, kw)


def _rms_l3_backward(res: dict, douts: tuple, needs: tuple, *, normalized_shape_ndim: int | None = None,
                     epsilon: float = 1e-5, **_: Any) -> tuple:  # fmt: skip
    (dy,) = douts
    if dy is None or not any(needs):
        return (None,) * 2
    k, x, s = normalized_shape_ndim, res["x"], res["scale"]
    inv = res["inv_std"] if "inv_std" in res else rms_norm_forward(x, s, normalized_shape_ndim=k, epsilon=epsilon)[1]
    return _needed(rms_norm_backward(dy, x, s, inv, normalized_shape_ndim=k), needs)


def _in_l3_forward(x: Any, scale: Any, bias: Any = None, *, epsilon: float = 1e-5,
                   training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    got = instance_norm_forward(x, scale, bias, epsilon=epsilon, training=training)
    return _gn_l3_result(got, x, scale, training, ("mean", "inv_std"))


def _in_l3_meta(x: Spec, scale: Spec, bias: Spec | None = None, *, epsilon: float = 1e-5,
                training: bool = True) -> tuple[tuple, dict]:  # fmt: skip
    return _gn_l3_meta("instance", "instance_norm", x, scale, bias, dict(epsilon=epsilon, training=training))


def _in_l3_backward(res: dict, douts: tuple, needs: tuple, *, epsilon: float = 1e-5, **_: Any) -> tuple:
    (dy,) = douts
    if dy is None or not any(needs):
        return (None,) * 3
    x, s = res["x"], res["scale"]
    if "mean" in res:
        mean, inv = res["mean"], res["inv_std"]
    else:
        _, mean, inv = instance_norm_forward(x, s, None, epsilon=epsilon, training=True)
    return _needed(instance_norm_backward(dy, x, s, mean, inv), needs)


def _gn_batch_refuses(kw: Any, specs: Any) -> str | None:
    """A batch folds into axis 0 unless the norm's normalized dims include it (x has no leading sample dim)."""
    if len(specs["x"].shape) <= len(specs["scale"].shape):
        return "the norm normalizes over every dim of x (no leading sample axis)"
    return None


_GN_DOC = """y = {what} ({fn}_forward's keywords). Training: residuals x, scale and the saved statistics ({stats},
float32 {shape}); one {fn}_backward (dx, {grads}). Inference (training=False) saves none: the backward computes
them with one {fn}_forward (training) first. No float64 (cuDNN's graph API has none: ValueError)."""

LAYER_NORM = differentiable(
    Differentiable("layer_norm", "layer_norm_forward", ("x", "scale", "bias"), ("y",), _ln_l3_forward,
                   _ln_l3_backward, _ln_l3_meta, batch=("x", "y", "mean", "inv_std"), batch_refuses=_gn_batch_refuses,
                   capture_safe=True,  # one norm graph execute each way (plan built on the first call)
                   doc=_GN_DOC.format(what="layer_norm(x) * scale + bias over the trailing dims", fn="layer_norm",
                                      stats="mean, inv_std", shape="x.shape[:-k] + (1,) * k",
                                      grads="dscale, dbias")),
)  # fmt: skip
RMS_NORM = differentiable(
    Differentiable("rms_norm", "rms_norm_forward", ("x", "scale"), ("y",), _rms_l3_forward, _rms_l3_backward,
                   _rms_l3_meta, batch=("x", "y", "inv_std"), batch_refuses=_gn_batch_refuses,
                   capture_safe=True,  # one norm graph execute each way (plan built on the first call)
                   doc=_GN_DOC.format(what="x * inv_std * scale over the trailing dims", fn="rms_norm",
                                      stats="inv_std", shape="x.shape[:-k] + (1,) * k", grads="dscale")),
)  # fmt: skip
INSTANCE_NORM = differentiable(
    Differentiable("instance_norm", "instance_norm_forward", ("x", "scale", "bias"), ("y",), _in_l3_forward,
                   _in_l3_backward, _in_l3_meta, batch=("x", "y", "mean", "inv_std"),
                   capture_safe=True,  # one norm graph execute each way (plan built on the first call)
                   doc=_GN_DOC.format(what="instance_norm(x) * scale[c] + bias[c] per (n, c)", fn="instance_norm",
                                      stats="mean, inv_std", shape="(N, C)", grads="dscale, dbias")),
)  # fmt: skip
