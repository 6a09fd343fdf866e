"""Normalization, forward and backward: batch norm on cuDNN's graph API for channels-last 4-d training (see
"batch norm (graph)" below) and on its legacy calls for everything else; layer, RMS and
instance norm on the graph API (``OPERATION_NORM_FORWARD`` / ``OPERATION_NORM_BACKWARD``).

Shapes (logical order whatever the memory layout; ``P`` is the parameters' dtype, below)

================================  ====================  ===========================  =================================
function                          ``x``, ``y``, ``dy``  ``scale``, ``bias`` (``P``)  saved statistics (``P``)
================================  ====================  ===========================  =================================
batch norm, ``"spatial"``         ``(N, C, *sp)``       ``(C,)``                     ``(C,)``: ``mean``, ``inv_std``
batch norm, ``"per_activation"``  ``(N, C, *sp)``       ``(C, *sp)``                 ``(C, *sp)``
layer norm                        ``(*lead, *norm)``    ``norm``                     ``(*lead, 1...)``: ``mean``,
                                                                                     ``inv_std``
RMS norm                          ``(*lead, *norm)``    ``norm`` (no bias)           ``(*lead, 1...)``: ``inv_std``
instance norm                     ``(N, C, *sp)``       ``(C,)``                     ``(N, C)``: ``mean``, ``inv_std``
================================  ====================  ===========================  =================================

``sp`` is 0 to 3 spatial dims for batch norm (``(N, C)`` and ``(N, C, L)`` run as 4-d with trailing size-1 dims,
as torch's ``BatchNorm1d``), 1 to 3 for instance norm. Layer and RMS norm normalize over the trailing dims that
``scale`` has (``norm = x.shape[-k:]``, ``k = scale.ndim`` or ``normalized_shape_ndim``); cuDNN's graph layer norm
normalizes every dim but the batch, so ``x`` runs as ``(prod(lead), prod(norm), 1, 1)``.
``inv_std = 1 / sqrt(var + epsilon)`` (the biased variance); RMS norm's is ``1 / sqrt(mean(x**2) + epsilon)``.

Dtypes: ``x``, ``y``, ``dy``, ``dx`` share one of float16, bfloat16, float32 and (batch norm only) float64; the
parameters, statistics and their gradients (``P``) are float32, or float64 for float64 ``x``: the rule of
``cudnnDeriveBNTensorDescriptor`` (float for the half types, the data type otherwise), which the graph norms
share (their statistics are float32). Anything else is refused (``TypeError`` naming the argument). The graph
API has no float64: layer, RMS and instance norm refuse float64 ``x`` (``ValueError``).

Layouts: batch and instance norm take ``x`` dense channels-first (C order) or channels-last (NHWC), and give a new
``y``/``dx`` ``x``'s layout; a given ``out`` must be dense in one of the two, and the inputs are copied into its
layout where they differ; any other input layout is copied to C order (logged). Layer and RMS norm take C-order
arrays (others are copied; a given ``y``/``dx`` must be C-contiguous). Parameters and statistics are packed
(C-contiguous): inputs are copied when they are not, and the running statistics and given ``out=`` statistics,
which cuDNN writes, must be.

cuDNN calls: batch norm: ``cudnnBatchNormalizationForwardTraining``, ``cudnnBatchNormalizationForwardInference``,
``cudnnBatchNormalizationBackward``, with the parameter descriptor from ``cudnnDeriveBNTensorDescriptor``
(``CUDNN_BATCHNORM_SPATIAL``, ``_PER_ACTIVATION``, ``_SPATIAL_PERSISTENT``); channels-last 4-d float16, bfloat16
and float32 training runs one graph instead (``settings(prefer="legacy")`` keeps the Ex calls) (``NORM_FORWARD`` batch mode with the running
statistics updated in place, then ``ADD`` and ``RELU_FWD`` when fused; ``NORM_BACKWARD``, after the ReLU's gradient
from ``y`` when fused), which keeps no reserve. A lone batch-norm inference graph has no engine on cuDNN 9.19, so
inference is legacy only. Layer, RMS and instance norm: one graph per call
signature (:mod:`cudnnkit.ops._graphform`: ``NORM_FORWARD`` with phase training or inference, ``NORM_BACKWARD``),
planned once with the settings' heuristics and cached; cuDNN having no engine for a graph raises
:class:`~cudnnkit.graph.UnsupportedGraphError` (there is no legacy form to fall back to).

The saved statistics and parameter gradients are not the primitives' outputs (those take the first operand's
dtype): a given ``out=`` statistic is an optional operand written in place, a missing one is allocated by the
call, and both come back after the main output (the primitive's ``extras``).

L3 (:mod:`cudnnkit.autograd`, :mod:`cudnnkit.torch`): ``batch_norm``, ``layer_norm``, ``rms_norm`` and
``instance_norm`` are declared at the end (:class:`~cudnnkit.ops._diff.Differentiable`), each with one output ``y``
and the saved statistics as residuals; batch norm in inference is differentiated too (from L2 calls: cuDNN has no
inference backward), and layer/RMS/instance norm in inference compute their statistics again in the backward.
"""

from __future__ import annotations

import ctypes
import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import lib
from ..graph.checks import as_bool
from ..runtime import (
    WRITTEN,
    DescriptorKind,
    check_choice,
    check_scalar,
    current_settings,
    get_cached,
    tensor_descriptor,
)
from ..runtime.arrays import contiguous_strides
from ..runtime.cache import LRU, MISSING
from ..runtime.dtypes import FLOATS, scaling_ref
from ..runtime.shapes import INT32_MAX
from ..runtime.view import ArrayView
from ._diff import Differentiable, Spec, differentiable, spec_view
from ._graphform import Binder, channels_last_output, graph_form
from ._layout import channels_last_strides, copy_in
from ._nd import layout_of
from ._primitive import Call, Operand, Output, Primitive, register, run, split_out
from .activation import activation_backward
from .tensor import set_tensor, transform_tensor

__all__ = [
    "batch_norm_forward",
    "batch_norm_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm_forward",
    "rms_norm_backward",
    "instance_norm_forward",
    "instance_norm_backward",
    "param_dtype",
    "bn_param_descriptor",
]

_log = logging.getLogger("cudnnkit")

_DTYPES = FLOATS
_PARAMS = ("float32", "float64")
_GRAPH_DTYPES = ("float16", "bfloat16", "float32")
_BN_MODES = {
    "spatial": lib.CUDNN_BATCHNORM_SPATIAL,
    "per_activation": lib.CUDNN_BATCHNORM_PER_ACTIVATION,
    "spatial_persistent": lib.CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
}


def param_dtype(dtype: str) -> str:
    """The dtype of the parameters and statistics for data of ``dtype`` (``cudnnDeriveBNTensorDescriptor``'s
    rule): float32 for float16, bfloat16 and float32, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


# ----------------------------------------------------------------- shared checks and layouts


def _epsilon(v: Any, legacy: bool, dtype: str = "float32") -> float:
    """``epsilon``: a positive finite number (batch norm's at least ``CUDNN_BN_MIN_EPSILON``, a double that cuDNN
    computes with in float32 unless the data is float64; the graph norms' a float32 scalar)."""
    eps = check_scalar(v, "epsilon", dtype=dtype if legacy else None)
    if not eps > 0 or (legacy and eps < lib.CUDNN_BN_MIN_EPSILON):
        low = f" and >= CUDNN_BN_MIN_EPSILON ({lib.CUDNN_BN_MIN_EPSILON})" if legacy else ""
        raise ValueError(f"epsilon must be > 0{low}, got {eps}")
    return float(eps)


def _fits(v: Any, name: str) -> None:
    """cuDNN's dims, strides and (legacy) element offsets are ints."""
    if any(d > INT32_MAX for d in v.shape) or v.size > INT32_MAX:
        raise ValueError(f"{name} has shape {v.shape}: cuDNN takes at most 2**31 - 1 elements (its dims are ints)")


def _param(v: Any, name: str, shape: tuple[int, ...], dtype: str, ref: str, written: bool = False,
           graph: bool = False) -> None:  # fmt: skip
    """A parameter or statistic: ``shape``, ``dtype`` (the parameters' dtype of ``ref``'s data), packed when
    cuDNN writes it."""
    if v is None:
        return
    if v.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {v.shape}")
    if v.dtype != dtype and graph:
        raise TypeError(f"{name} has dtype {v.dtype} but must be float32 (the graph norms' parameters and "
                        "statistics)")  # fmt: skip
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but must be {dtype} for {ref} of that dtype (cuDNN's rule: "
                        "float32 parameters and statistics for float16, bfloat16 and float32 data, float64 for "
                        "float64)")  # fmt: skip
    if written and not v.is_contiguous():
        raise ValueError(f"{name} must be C-contiguous (cuDNN writes it as a packed array), got strides {v.strides}")


def _canon(shape: tuple[int, ...], lay: str, rank: int = 4) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` padded with trailing size-1 dims to ``rank`` (at least), and the strides of a dense array of that
    shape in layout ``lay`` (every stride set, size-1 dims included: cuDNN reads the layout from all of them)."""
    shape = tuple(shape) + (1,) * (rank - len(shape))
    return shape, channels_last_strides(shape) if lay == "nhwc" else contiguous_strides(shape)


def _new_strides(shape: tuple[int, ...], lay: str) -> tuple[int, ...] | None:
    return channels_last_strides(shape) if lay == "nhwc" and len(shape) >= 3 else None


def _in_layout(c: Call, name: str, lay: str) -> Any:
    """``c.views[name]`` in layout ``lay`` (the output's), copied where it is not (logged)."""
    v = c.views[name]
    if layout_of(v) == lay:
        return v
    want = channels_last_strides(v.shape) if lay == "nhwc" else None
    _, v = copy_in(c.launch, c.arrays[name], v, want, name, f"in the output's layout ({lay})")
    return v


def _out_layout(c: Call, name: str) -> str:
    lay = layout_of(c.views[name])
    if lay is None:
        v = c.views[name]
        raise ValueError(
            f"{name} must be dense channels-first (C order) or channels-last, got shape {v.shape} strides {v.strides}"
        )
    return lay


def _stat(c: Call, name: str, shape: tuple[int, ...], dtype: str) -> Any:
    """The view of statistic ``name``: the given ``out=`` array (an operand), or a new packed one; the array is
    kept in ``c.extra[name]`` (what the call returns)."""
    v = c.views.get(name)
    if v is None:
        arr, v = c.launch.empty(shape, dtype, name=name)
    else:
        arr = c.arrays[name]
    c.extra[name] = arr
    c.views[name] = v
    return v


def _outs(fn: str, out: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """``out=``: None, or a tuple of one array or None per output, in ``names``' order (the shared rule,
    :func:`~cudnnkit.ops._primitive.split_out`)."""
    return split_out(fn, out, dict.fromkeys(names))


# ----------------------------------------------------------------- batch norm (legacy)


class _BN(NamedTuple):
    """A batch-norm call, resolved (hashable)."""

    dtype: str
    pdtype: str
    mode: str
    training: bool
    running: bool
    momentum: float
    epsilon: float
    x_shape: tuple[int, ...]
    p_shape: tuple[int, ...]
    lay: str  #: the layout of a new y/dx: x's ("nchw" when x is copied)
    empty: bool = False
    act: bool = False  #: fused ReLU (CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
    z: bool = False  #: fused residual add before it (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
    reserve: bool = False  #: the backward has the fused forward's reserve (the Ex call), else the unfused steps
    mask: bool = False  #: the forward returns the ReLU's bit-packed mask / the backward reads it (the graph)


def _set_bn_param(ptr: int, dtype: str, shape: tuple[int, ...], mode: str) -> None:
    x = tensor_descriptor(dtype, shape, contiguous_strides(shape))
    lib.cudnnDeriveBNTensorDescriptor(ptr, x, _BN_MODES[mode])


BN_PARAM = DescriptorKind("bn_param", "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor", _set_bn_param)


def bn_param_descriptor(dtype: str, shape: Sequence[int], mode: str = "spatial") -> Any:
    """The cached scale/bias/mean/variance descriptor of batch norm on data of ``dtype`` and 4-d or 5-d ``shape``
    (``cudnnDeriveBNTensorDescriptor``: ``(1, C, 1...)`` or ``(1, C, *sp)``, packed, in :func:`param_dtype`).
    Host-side only."""
    check_choice(mode, _BN_MODES, "mode")
    return get_cached(BN_PARAM, (dtype, tuple(int(d) for d in shape), mode))


def _bn_rank(shape: tuple[int, ...]) -> tuple[int, ...]:
    return _canon(shape, "nchw")[0]


def _bn_common(vx: Any, kw: Any, name: str = "x") -> tuple[str, str, tuple[int, ...], float]:
    if not 2 <= vx.ndim <= 5:
        raise ValueError(f"{name} must have 2 to 5 dims (N, C, 0 to 3 spatial), got shape {vx.shape}")
    _fits(vx, name)
    mode = check_choice(kw.get("mode", "spatial"), _BN_MODES, "mode")
    p_shape = (vx.shape[1],) if mode != "per_activation" else tuple(vx.shape[1:])
    return mode, param_dtype(vx.dtype), p_shape, _epsilon(kw.get("epsilon", 1e-5), legacy=True, dtype=vx.dtype)


def _bn_fwd_resolve(views: Any, kw: Any) -> _BN:
    vx = views["x"]
    mode, pdt, p_shape, eps = _bn_common(vx, kw)
    training = as_bool(kw.get("training", True), "training")
    momentum = check_scalar(kw.get("momentum", 0.1), "momentum", dtype="float64")
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be in [0, 1] (the weight of the batch's statistics), got {momentum}")
    for n in ("scale", "bias"):
        _param(views[n], n, p_shape, pdt, "x")
    rm, rv = views.get("running_mean"), views.get("running_var")
    for n in ("running_mean", "running_var"):
        _param(views.get(n), n, p_shape, pdt, "x", written=True)
    if (rm is None) != (rv is None):
        raise ValueError("pass both running_mean and running_var, or neither")
    if not training and rm is None:
        raise ValueError("training=False normalizes with the running statistics: pass running_mean and running_var")
    for n in ("saved_mean", "saved_inv_std"):
        if views.get(n) is not None and not training:
            raise ValueError(f"{n}: inference (training=False) saves no statistics")
        _param(views.get(n), n, p_shape, pdt, "x", written=True)
    per_channel = vx.size // max(math.prod(p_shape), 1) if vx.size else 0
    if training and per_channel < 2:
        raise ValueError(f"x has shape {vx.shape}: batch norm training needs more than one value per channel "
                         f"({'per element of (C, *spatial)' if mode == 'per_activation' else 'over N and spatial'})")  # fmt: skip
    lay = layout_of(vx) or "nchw"
    act, z = _fused(views, kw, vx)
    mask = as_bool(kw.get("return_mask", False), "return_mask")
    if mask:
        _mask_shape(vx.shape, "return_mask=True")
        if not act or z or not training:
            raise ValueError("return_mask=True is the fused ReLU's mask in training: pass activation='relu', "
                             "training=True and no z")  # fmt: skip
    return _BN(vx.dtype, pdt, mode, training, rm is not None, float(momentum), eps, vx.shape, p_shape, lay,
               vx.size == 0, act, z, mask=mask)  # fmt: skip


def _mask_shape(x_shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    """The uint8 array ``(N, H, W, C // 8)`` holding the ReLU's bit-packed mask of a 4-d ``x`` (a channels-last
    BOOLEAN tensor: channel c of a pixel in bit c % 8 of byte c // 8), checked: C a multiple of 8."""
    if len(x_shape) != 4 or x_shape[1] % 8:
        raise ValueError(f"{what}: the ReLU's bit-packed mask is for a 4-d x whose C is a multiple of 8 (a byte "
                         f"holds 8 channels of a pixel), got x of shape {x_shape}")  # fmt: skip
    n, c, h, w = x_shape
    return (n, h, w, c // 8)


def _fused(views: Any, kw: Any, vx: Any) -> tuple[bool, bool]:
    """(ReLU fused, residual z fused), checked: cuDNN's fused batch norm has ReLU only, and adds z before it."""
    act = kw.get("activation")
    if act not in (None, "relu"):
        raise ValueError(f"activation must be None or 'relu' (cuDNN's fused batch norm has ReLU only), got {act!r}")
    vz = views.get("z")
    if vz is not None:
        if act is None:
            raise ValueError("z (the residual) is added before the activation: pass activation='relu' "
                             "(CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)")  # fmt: skip
        if vz.shape != vx.shape:
            raise ValueError(f"z must have x's shape {vx.shape}, got {vz.shape}")
        if vz.dtype != vx.dtype:
            raise TypeError(f"z has dtype {vz.dtype} but x has dtype {vx.dtype}")
    return act is not None, vz is not None


def _bn_bwd_resolve(views: Any, kw: Any) -> _BN:
    vx = views["x"]
    mode, pdt, p_shape, eps = _bn_common(vx, kw)
    if vx.size == 0:
        raise ValueError(f"x has shape {vx.shape}: batch norm backward needs the statistics of a non-empty batch")
    for n in ("scale", "saved_mean", "saved_inv_std"):
        _param(views[n], n, p_shape, pdt, "x")
    for n in ("dscale", "dbias"):
        _param(views.get(n), n, p_shape, pdt, "x", written=True)
    act = kw.get("activation")
    if act not in (None, "relu"):
        raise ValueError(f"activation must be None or 'relu' (the forward's), got {act!r}")
    z_grad = as_bool(kw.get("z_grad", False), "z_grad")
    if z_grad and act is None:
        raise ValueError("z_grad=True is the fused residual's gradient: pass activation='relu' (the forward's)")
    vy, vr, vb = views.get("y"), views.get("reserve"), views.get("bias")
    if act is not None:
        if vy is None:
            raise ValueError("activation='relu' needs y= (the forward's output, where the ReLU was active)")
        if vy.shape != vx.shape or vy.dtype != vx.dtype:
            raise ValueError(f"y must be the forward's output: shape {vx.shape} and dtype {vx.dtype}, got "
                             f"{vy.shape} {vy.dtype}")  # fmt: skip
        if vr is not None:
            if vr.dtype != "uint8" or vr.ndim != 1:
                raise TypeError(f"reserve must be the fused forward's 1-d uint8 reserve, got {vr.dtype} {vr.shape}")
            if vb is None:
                raise ValueError("reserve= (the fused backward) needs bias= too: cuDNN reads it")
            _param(vb, "bias", p_shape, pdt, "x")
    elif vr is not None or vy is not None:
        raise ValueError("y= and reserve= are for the fused backward: pass activation='relu'")
    vdz = views.get("dz")
    if vdz is not None:
        if not z_grad:
            raise ValueError("out= has a dz: pass z_grad=True (the fused residual's gradient)")
        if vdz.shape != vx.shape or vdz.dtype != vx.dtype:
            raise ValueError(f"dz must have x's shape {vx.shape} and dtype {vx.dtype}, got {vdz.shape} {vdz.dtype}")
        if layout_of(vdz) is None:
            raise ValueError(f"dz must be dense channels-first or channels-last, got strides {vdz.strides}")
    vm = views.get("relu_mask")
    if vm is not None:
        want = _mask_shape(vx.shape, "relu_mask")
        if act is None or vr is not None or z_grad:
            raise ValueError("relu_mask= (the graph forward's return_mask=True) is for the fused ReLU's backward "
                             "without a reserve or z_grad: pass activation='relu' and y=")  # fmt: skip
        if vm.dtype != "uint8" or vm.shape != want:
            raise ValueError(f"relu_mask must be the forward's uint8 mask of shape {want}, got {vm.dtype} "
                             f"{vm.shape}")  # fmt: skip
    return _BN(vx.dtype, pdt, mode, True, False, 0.0, eps, vx.shape, p_shape, layout_of(vx) or "nchw", False,
               act is not None, z_grad, vr is not None, mask=vm is not None)  # fmt: skip


def _bn_desc(v: Any, lay: str) -> Any:
    shape, strides = _canon(v.shape, lay)
    return tensor_descriptor(v.dtype, shape, strides)


def _bn_fwd_call(c: Call) -> None:
    r = c.resolved
    lay = _out_layout(c, "y")
    if r.training:
        vm = _stat(c, "saved_mean", r.p_shape, r.pdtype)
        vi = _stat(c, "saved_inv_std", r.p_shape, r.pdtype)
    if r.empty:  # inference on an empty batch: nothing to compute
        return
    vx, vy = _in_layout(c, "x", lay), c.views["y"]
    xd, yd = _bn_desc(vx, lay), _bn_desc(vy, lay)
    pd = bn_param_descriptor(r.dtype, _bn_rank(r.x_shape), r.mode)
    one, zero = scaling_ref(r.dtype, 1.0), scaling_ref(r.dtype, 0.0)
    v = c.views
    h, m = c.launch.handle, _BN_MODES[r.mode]
    if r.training:
        rm, rv = (v["running_mean"].ptr, v["running_var"].ptr) if r.running else (None, None)
        if (r.act or _persistent(r, lay)) and _fused_forward(c, lay, xd, yd, pd, vx, vy, vm, vi, rm, rv):
            return
        lib.cudnnBatchNormalizationForwardTraining(h, m, one, zero, xd, vx.ptr, yd, vy.ptr, pd, v["scale"].ptr,
                                                   v["bias"].ptr, r.momentum, rm, rv, r.epsilon, vm.ptr,
                                                   vi.ptr)  # fmt: skip
    else:
        lib.cudnnBatchNormalizationForwardInference(h, m, one, zero, xd, vx.ptr, yd, vy.ptr, pd, v["scale"].ptr,
                                                    v["bias"].ptr, v["running_mean"].ptr, v["running_var"].ptr,
                                                    r.epsilon)  # fmt: skip
    if r.act:  # the unfused steps: y += z (cudnnAddTensor), then ReLU in place (cudnnActivationForward)
        if r.z:
            vz = _in_layout(c, "z", lay)
            lib.cudnnAddTensor(h, one, _bn_desc(vz, lay), vz.ptr, one, yd, vy.ptr)
        lib.cudnnActivationForward(h, _relu(), one, yd, vy.ptr, zero, yd, vy.ptr)


def _relu() -> Any:
    from .activation import activation_descriptor

    return activation_descriptor("relu")


def _bn_ops(r: _BN) -> int:
    if not r.act:
        return lib.CUDNN_BATCHNORM_OPS_BN
    return lib.CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION if r.z else lib.CUDNN_BATCHNORM_OPS_BN_ACTIVATION


def _persistent(r: _BN, lay: str) -> bool:
    """Channels-last spatial batch norm runs ``..._SPATIAL_PERSISTENT`` through the Ex calls, as torch does for
    channels-last training: measured on the H200 (cuDNN 9.19, fp16 64x256x56x56), the plain spatial call takes
    5.8 ms there (persistent 4.1 ms), the Ex call 0.22 ms with the add and ReLU fused."""
    return lay == "nhwc" and r.mode in ("spatial", "spatial_persistent")


def _ex_mode(r: _BN, lay: str) -> int:
    return lib.CUDNN_BATCHNORM_SPATIAL_PERSISTENT if _persistent(r, lay) else _BN_MODES[r.mode]


#: (device, mode, ops, the descriptors' keys) -> (workspace, reserve) sizes of the Ex forward, or None where cuDNN refuses it
_EX_SIZES: LRU[tuple, Any] = LRU("ops.batch_norm_ex_sizes", 1024)


def _ex_sizes(h: Any, device: int, m: int, ops_: int, xd: Any, zd: Any, yd: Any, pd: Any, act: Any) -> Any:
    """``cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize`` and ``...TrainingExReserveSpaceSize`` (as
    ``c_size_t``), asked once per device, mode, ops and descriptors (a per-call cost otherwise); None when cuDNN
    refuses the fused call (logged)."""
    key = (device, m, ops_, xd.key, zd.key if zd is not None else None, yd.key, pd.key, act is not None)
    got = _EX_SIZES.lookup(key)
    if got is not MISSING:
        return got
    ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        lib.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, m, ops_, xd, zd, yd, pd, act,
                                                                     ctypes.byref(ws))  # fmt: skip
        lib.cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, m, ops_, act, xd, ctypes.byref(rs))
        got = (ws, rs)
    except lib.errors.NotSupportedError as e:
        _log.debug("batch_norm_forward: cuDNN fuses no ReLU here (%s); unfused steps", str(e).splitlines()[0])
        got = None
    return _EX_SIZES.put(key, got, count_miss=True)


def _fused_forward(c: Call, lay: str, xd: Any, yd: Any, pd: Any, vx: Any, vy: Any, vm: Any, vi: Any, rm: Any,
                   rv: Any) -> bool:  # fmt: skip
    """``cudnnBatchNormalizationForwardTrainingEx`` with the fused ReLU (and residual): True when cuDNN ran it,
    leaving its reserve in ``c.extra["reserve"]``; False when it refuses these arrays (NOT_SUPPORTED: it fuses
    channels-last half types with C a multiple of 4), logged, for the unfused steps to run instead."""
    r, v, h = c.resolved, c.views, c.launch.handle
    m, ops_ = _ex_mode(r, lay), _bn_ops(r)
    vz = _in_layout(c, "z", lay) if r.z else None
    zd = _bn_desc(vz, lay) if vz is not None else None
    act = _relu() if r.act else None
    sizes = _ex_sizes(h, c.launch.device, m, ops_, xd, zd, yd, pd, act)
    if sizes is None:
        return False
    ws, rs = sizes
    work, work_ptr = c.launch.workspace(ws.value)
    reserve, vr = c.launch.empty((max(rs.value, 1),), "uint8", name="reserve")
    one, zero = scaling_ref(r.dtype, 1.0), scaling_ref(r.dtype, 0.0)
    try:
        lib.cudnnBatchNormalizationForwardTrainingEx(
            h, m, ops_, one, zero, xd, vx.ptr, zd, vz.ptr if vz is not None else None, yd, vy.ptr, pd, v["scale"].ptr,
            v["bias"].ptr, r.momentum, rm, rv, r.epsilon, vm.ptr, vi.ptr, act, work_ptr or None, ws.value, vr.ptr,
            rs.value,
        )  # fmt: skip
    except lib.errors.NotSupportedError as e:
        _log.debug("batch_norm_forward: cuDNN fuses no ReLU here (%s); unfused steps", str(e).splitlines()[0])
        return False
    del work
    if r.act:
        c.extra["reserve"] = reserve
    return True


def _bn_bwd_call(c: Call) -> None:
    r = c.resolved
    lay = _out_layout(c, "dx")
    vds = _stat(c, "dscale", r.p_shape, r.pdtype)
    vdb = _stat(c, "dbias", r.p_shape, r.pdtype)
    vx, vdy, vdx = _in_layout(c, "x", lay), _in_layout(c, "dy", lay), c.views["dx"]
    pd = bn_param_descriptor(r.dtype, _bn_rank(r.x_shape), r.mode)
    one, zero = scaling_ref(r.dtype, 1.0), scaling_ref(r.dtype, 0.0)
    v = c.views
    if r.act:
        vdy = _fused_backward(c, lay, vx, vdy, vdx, pd, vds, vdb)
        if vdy is None:
            return
    elif _persistent(r, lay) and _backward_ex(c, lay, vx, vdy, vdx, pd, vds, vdb):
        return
    lib.cudnnBatchNormalizationBackward(c.launch.handle, _BN_MODES[r.mode], one, zero, one, zero, _bn_desc(vx, lay),
                                        vx.ptr, _bn_desc(vdy, lay), vdy.ptr, _bn_desc(vdx, lay), vdx.ptr, pd,
                                        v["scale"].ptr, vds.ptr, vdb.ptr, r.epsilon, v["saved_mean"].ptr,
                                        v["saved_inv_std"].ptr)  # fmt: skip


def _fused_backward(c: Call, lay: str, vx: Any, vdy: Any, vdx: Any, pd: Any, vds: Any, vdb: Any) -> Any:
    """The fused ReLU's (and residual's) backward. With the forward's reserve: one
    ``cudnnBatchNormalizationBackwardEx`` (returns None: done). Without it (the forward ran unfused): the ReLU's
    gradient by ``cudnnActivationBackward`` from ``y``, into ``dz`` (the residual's gradient, when asked for) or a
    temporary, which is returned as the ``dy`` of the plain backward."""
    r, v, h = c.resolved, c.views, c.launch.handle
    one, zero = scaling_ref(r.dtype, 1.0), scaling_ref(r.dtype, 0.0)
    vy = _in_layout(c, "y", lay)
    yd, dyd = _bn_desc(vy, lay), _bn_desc(vdy, lay)
    if r.z:
        vdz = v.get("dz")
        if vdz is None or layout_of(vdz) != lay:
            arr, vdz = c.launch.empty(r.x_shape, r.dtype, _new_strides(r.x_shape, lay), name="dz")
            if v.get("dz") is not None:
                c.extra["_dz_back"] = (v["dz"], arr)
        c.extra["dz"] = c.arrays["dz"] if "_dz_back" not in c.extra and v.get("dz") is not None else vdz.owner
    if r.reserve:
        vr = v["reserve"]
        ws = ctypes.c_size_t()
        m, ops_, act = _ex_mode(r, lay), _bn_ops(r), _relu()
        dzd = _bn_desc(vdz, lay) if r.z else None
        lib.cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, m, ops_, _bn_desc(vx, lay), yd, dyd, dzd,
                                                              _bn_desc(vdx, lay), pd, act, ctypes.byref(ws))  # fmt: skip
        work, work_ptr = c.launch.workspace(ws.value)
        lib.cudnnBatchNormalizationBackwardEx(
            h, m, ops_, one, zero, one, zero, _bn_desc(vx, lay), vx.ptr, yd, vy.ptr, dyd, vdy.ptr, dzd,
            vdz.ptr if r.z else None, _bn_desc(vdx, lay), vdx.ptr, pd, v["scale"].ptr, v["bias"].ptr, vds.ptr, vdb.ptr,
            r.epsilon, v["saved_mean"].ptr, v["saved_inv_std"].ptr, act, work_ptr or None, ws.value, vr.ptr,
            vr.nbytes,
        )  # fmt: skip
        del work
        _dz_back(c)
        return None
    if r.z:
        vg = vdz
    else:
        tmp, vg = c.launch.empty(r.x_shape, r.dtype, _new_strides(r.x_shape, lay), name="dy")
        c.extra["_tmp"] = tmp
    lib.cudnnActivationBackward(h, _relu(), one, yd, vy.ptr, dyd, vdy.ptr, yd, vy.ptr, zero, _bn_desc(vg, lay),
                                vg.ptr)  # fmt: skip
    _dz_back(c)
    return vg


def _backward_ex(c: Call, lay: str, vx: Any, vdy: Any, vdx: Any, pd: Any, vds: Any, vdb: Any) -> bool:
    """The plain channels-last backward as ``cudnnBatchNormalizationBackwardEx`` (``CUDNN_BATCHNORM_OPS_BN``,
    ``..._SPATIAL_PERSISTENT``: see :func:`_persistent`); False (logged) where cuDNN refuses it."""
    r, v, h = c.resolved, c.views, c.launch.handle
    one, zero = scaling_ref(r.dtype, 1.0), scaling_ref(r.dtype, 0.0)
    m, ops_ = _ex_mode(r, lay), lib.CUDNN_BATCHNORM_OPS_BN
    xd, dyd, dxd = _bn_desc(vx, lay), _bn_desc(vdy, lay), _bn_desc(vdx, lay)
    ws = ctypes.c_size_t()
    try:
        lib.cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, m, ops_, xd, None, dyd, None, dxd, pd, None,
                                                              ctypes.byref(ws))  # fmt: skip
        work, work_ptr = c.launch.workspace(ws.value)
        lib.cudnnBatchNormalizationBackwardEx(
            h, m, ops_, one, zero, one, zero, xd, vx.ptr, None, None, dyd, vdy.ptr, None, None, dxd, vdx.ptr, pd,
            v["scale"].ptr, None, vds.ptr, vdb.ptr, r.epsilon, v["saved_mean"].ptr, v["saved_inv_std"].ptr, None,
            work_ptr or None, ws.value, None, 0,
        )  # fmt: skip
    except lib.errors.CudnnError as e:
        _log.debug("batch_norm_backward: no Ex backward here (%s); the plain call", str(e).splitlines()[0])
        return False
    del work
    return True


def _dz_back(c: Call) -> None:
    got = c.extra.pop("_dz_back", None)
    if got is not None:  # a given dz in another layout: written through a temporary
        c.launch.copy(got[0].owner, got[1], "dz")
        c.extra["dz"] = c.arrays["dz"]


# ----------------------------------------------------------------- batch norm (graph)
#
# Channels-last 4-d training batch norm in float16/bfloat16/float32 runs as one graph by default (NORM_FORWARD,
# batch mode, with the running statistics, then ADD and RELU_FWD when fused; NORM_BACKWARD).
# A probe on the H200 with cuDNN 9.19 (a bound plan, fp16 64x256x56x56, each call synchronized, so host time is
# counted too) gave forward 0.086 ms against 0.198 for the legacy Ex call and 0.129 for torch, with the add and ReLU
# 0.137 against 0.275 and 0.259, backward 0.143 against 0.217 and 0.209, and 8-11 us of host time per execute
# against the legacy calls' 86-103 us. The L2 call first read no faster (0.120 ms against 0.112): its express hits
# ran the whole form again, because the call makes new saved statistics; they now take the pointer-only path and
# allocate those like outputs (``_graphform._fresh_extras``): the L2 call then read 0.138 ms against the Ex call's
# 0.211 and torch's 0.113, with 122 us of host time against 203 (benchmarks norm/, H200, 2026-12-03; the GPU tier's
# tests/gpu/test_normalization_gpu.py, graph against legacy with express repeats, passed there). float32 measured on the H200 (9.19): error 1.4e-7
# against float64, 0.097 ms against the Ex call's 0.188 for 64x32x32x32 (the small CNN's). The running
# statistics are read and written in place (the graph's input and output running-statistics tensors bound to one
# array: measured exact). The graph form refuses, by name, every other call (inference, per-activation,
# channels-first, float64, other ranks, a backward with the fused forward's reserve), which the Ex calls take.

_BN_GRAPH_DTYPES = ("float16", "bfloat16", "float32")


def _bn_graph_refuses(r: _BN, kw: Any) -> str | None:
    """Why the batch-norm graph form does not take a resolved call (None: it does)."""
    if not r.training:
        return "inference (cuDNN 9.19 has no engine for a lone batch-norm inference graph)"
    if r.empty:
        return "an empty batch"
    if r.reserve:
        return "the fused forward's reserve (the Ex backward reads it)"
    return _bn_graph_shape_refuses(r.dtype, r.x_shape, r.lay, r.mode)


def _bn_graph_shape_refuses(dtype: str, x_shape: tuple[int, ...], lay: str | None, mode: str) -> str | None:
    """The part of :func:`_bn_graph_refuses` that x's dtype, shape and layout and the mode decide."""
    if dtype not in _BN_GRAPH_DTYPES:
        return f"{dtype} (the graph form is for float16, bfloat16 and float32)"
    if mode == "per_activation":
        return "mode='per_activation'"
    if len(x_shape) != 4 or lay != "nhwc":
        return "not a 4-d channels-last x (the graph form is measured for NHWC)"
    return None


def _bn_fwd_legacy_refuses(r: _BN) -> str | None:
    """Why the legacy forward does not take a resolved call: the ReLU's bit-packed mask, which only the graph
    writes. (The legacy backward takes a call given one: it runs the ReLU's gradient from y, the mask unread.)"""
    return "return_mask=True (the ReLU's bit-packed mask: the graph writes it)" if r.mask else None


def _bn_auto(r: _BN, kw: Any) -> tuple[str, str]:
    """The path under ``prefer="auto"`` when both forms take a call: the graph (see the section comment)."""
    return "graph", "the batch-norm graph: measured faster than the Ex calls (host and GPU)"


def _bn_param_tensor(b: Binder, name: str, c_: int) -> Any:
    return b.tensor(name, (1, c_, 1, 1), (c_, 1, 1, 1), "float32")


def _bn_graph_fwd_prepare(c: Call) -> None:
    r = c.resolved
    channels_last_output(c, "y")  # a given y in another layout: written through a channels-last temporary
    if r.z:
        c.views["z"] = _in_layout(c, "z", "nhwc")
    _stat(c, "saved_mean", r.p_shape, r.pdtype)
    _stat(c, "saved_inv_std", r.p_shape, r.pdtype)
    c.extra["reserve"] = None  # no reserve: the backward of a fused forward takes the ReLU's gradient from y
    if r.mask:  # a new array each call, returned (an express hit allocates it anew: _graphform._fresh_extras)
        c.extra["relu_mask"], c.views["relu_mask"] = c.launch.empty(_mask_shape(r.x_shape, "x"), "uint8",
                                                                    name="relu_mask")  # fmt: skip


def _bn_graph_fwd_build(c: Call) -> tuple[Any, dict]:
    r, v = c.resolved, c.views
    b = Binder(c)
    vx = v["x"]
    x = b.tensor("x", vx.shape, vx.strides, r.dtype)
    c_ = r.x_shape[1]
    s, bias = _bn_param_tensor(b, "scale", c_), _bn_param_tensor(b, "bias", c_)
    rm = _bn_param_tensor(b, "running_mean", c_) if r.running else None
    rv = _bn_param_tensor(b, "running_var", c_) if r.running else None
    res = b.g.norm_forward("batch", x, s, bias, epsilon=r.epsilon, momentum=r.momentum if r.running else None,
                           running_mean=rm, running_var=rv)  # fmt: skip
    y = res.y
    if r.z:
        y = b.g.pointwise("ADD", y, b.tensor("z", v["z"].shape, v["z"].strides, r.dtype))
    if r.act:
        y = b.g.pointwise("RELU_FWD", y)
    b.output(y, "y", r.dtype, v["y"].strides)
    if r.mask:  # cudnn-frontend's BN_RELU: CMP_GT(relu_out, 0), a bit-packed channels-last BOOLEAN output
        m = b.g.pointwise("CMP_GT", y, b.g.scalar(0.0), dtype="bool", name="relu_mask")
        b.output(m, "relu_mask", "bool", channels_last_strides(r.x_shape))
    stat = (c_, 1, 1, 1)
    b.output(res.mean, "saved_mean", "float32", stat)
    b.output(res.inv_variance, "saved_inv_std", "float32", stat)
    if r.running:  # written in place: the same arrays as the inputs
        b.output(res.running_mean, "running_mean", "float32", stat)
        b.output(res.running_var, "running_var", "float32", stat)
    return b.done()


def _bn_graph_bwd_prepare(c: Call) -> None:
    r = c.resolved
    vds = _stat(c, "dscale", r.p_shape, r.pdtype)
    vdb = _stat(c, "dbias", r.p_shape, r.pdtype)
    channels_last_output(c, "dx")
    c.views["x"], c.views["dy"] = _in_layout(c, "x", "nhwc"), _in_layout(c, "dy", "nhwc")
    if r.act and not r.mask:  # the ReLU's (and residual's) gradient from y first: the graph's dy
        pd = bn_param_descriptor(r.dtype, _bn_rank(r.x_shape), r.mode)
        c.views["dy"] = _fused_backward(c, "nhwc", c.views["x"], c.views["dy"], c.views["dx"], pd, vds, vdb)


def _bn_graph_bwd_build(c: Call) -> tuple[Any, dict]:
    r, v = c.resolved, c.views
    b = Binder(c)
    x = b.tensor("x", v["x"].shape, v["x"].strides, r.dtype)
    dy = b.tensor("dy", v["dy"].shape, v["dy"].strides, r.dtype)
    c_ = r.x_shape[1]
    s = _bn_param_tensor(b, "scale", c_)
    m, iv = _bn_param_tensor(b, "saved_mean", c_), _bn_param_tensor(b, "saved_inv_std", c_)
    if r.mask:  # cudnn-frontend's DRELU_DBN: MUL(dy, mask) feeds NORM_BACKWARD (RELU_BWD from y has no engine);
        # the product in x's dtype, as cudnn-frontend's pattern has it: a float32 product has no float16/bfloat16
        # engine (cuDNN 9.19, H100)
        mask = b.tensor("relu_mask", r.x_shape, channels_last_strides(r.x_shape), "bool")
        dy = b.g.pointwise("MUL", dy, mask, dtype=r.dtype)
    res = b.g.norm_backward("batch", x, dy, s, mean=m, inv_variance=iv)
    stat = (c_, 1, 1, 1)
    b.output(res.dx, "dx", r.dtype, v["dx"].strides)
    b.output(res.dscale, "dscale", "float32", stat)
    b.output(res.dbias, "dbias", "float32", stat)
    return b.done()


def _p(name: str, dtypes: tuple[str, ...] = _PARAMS, **kw: Any) -> Operand:
    return Operand(name, dtypes, packed=True, **kw)


def _w(name: str) -> Operand:
    """A statistic cuDNN writes: the running statistics (updated in place), a given ``out=`` statistic."""
    return Operand(name, _PARAMS, optional=True, flags=WRITTEN)


BATCH_NORM_FORWARD = register(
    Primitive(
        "batch_norm_forward",
        inputs=(
            Operand("x", _DTYPES),
            _p("scale"),
            _p("bias"),
            _w("running_mean"),
            _w("running_var"),
            _w("saved_mean"),
            _w("saved_inv_std"),
            Operand("z", _DTYPES, optional=True),
        ),  # fmt: skip
        outputs=(Output("y", shape=lambda r: r.x_shape, strides=lambda r: _new_strides(r.x_shape, r.lay)),),
        resolve=_bn_fwd_resolve,
        legacy=_bn_fwd_call,
        graph=graph_form(_bn_graph_fwd_build, _bn_graph_fwd_prepare),
        graph_refuses=_bn_graph_refuses,
        legacy_refuses=_bn_fwd_legacy_refuses,
        auto=_bn_auto,
        extras=("saved_mean", "saved_inv_std", "reserve", "relu_mask"),
        empty=lambda r: False,
        family="batch_norm",
        differentiable=("x", "scale", "bias", "z"),
        # the fused ReLU's backward also reads y, bias and the reserve (or the graph's bit-packed ReLU mask)
        residuals=("x", "scale", "saved_mean", "saved_inv_std", "reserve", "bias", "y", "relu_mask"),
        backward="batch_norm_backward",
    )
)
BATCH_NORM_BACKWARD = register(
    Primitive(
        "batch_norm_backward",
        inputs=(
            Operand("dy", _DTYPES),
            Operand("x", like="dy"),
            _p("scale"),
            _p("saved_mean"),
            _p("saved_inv_std"),
            _w("dscale"),
            _w("dbias"),
            Operand("y", _DTYPES, optional=True),
            _p("bias", optional=True),
            Operand("reserve", ("uint8",), optional=True),
            Operand("dz", _DTYPES, optional=True, flags=WRITTEN),
            Operand("relu_mask", ("uint8",), optional=True, packed=True),
        ),  # fmt: skip
        outputs=(Output("dx", shape=lambda r: r.x_shape, strides=lambda r: _new_strides(r.x_shape, r.lay)),),
        resolve=_bn_bwd_resolve,
        legacy=_bn_bwd_call,
        graph=graph_form(_bn_graph_bwd_build, _bn_graph_bwd_prepare),
        graph_refuses=_bn_graph_refuses,
        auto=_bn_auto,
        extras=("dscale", "dbias", "dz"),
        empty=lambda r: False,
        family="batch_norm",
    )
)


def batch_norm_forward(
    x: Any,
    scale: Any,
    bias: Any,
    *,
    running_mean: Any = None,
    running_var: Any = None,
    training: bool = True,
    momentum: float = 0.1,
    epsilon: float = 1e-5,
    mode: str = "spatial",
    z: Any = None,
    activation: str | None = None,
    return_mask: bool = False,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Batch normalization of ``x`` ``(N, C, *sp)`` (0 to 3 spatial dims) with ``scale``/``bias`` ``(C,)``
    (``mode="spatial"`` or ``"spatial_persistent"``: statistics over N and the spatial dims) or ``(C, *sp)``
    (``"per_activation"``: over N).

    Training (the default): ``y = (x - mean) * inv_std * scale + bias`` with the batch's statistics; returns
    ``(y, saved_mean, saved_inv_std)`` (``inv_std = 1 / sqrt(var + epsilon)``, the biased variance), and updates
    ``running_mean``/``running_var`` in place when given, as torch does: ``new = (1 - momentum) * old + momentum *
    batch``, with the unbiased variance for ``running_var`` (cuDNN's ``exponentialAverageFactor`` is ``momentum``).
    For a channels-last 4-d float16, bfloat16 or float32 ``x``: one graph (``NORM_FORWARD``, batch mode; see the
    module docstring); otherwise, or under ``settings(prefer="legacy")``, ``cudnnBatchNormalizationForwardTraining``.

    Inference (``training=False``): ``y = (x - running_mean) / sqrt(running_var + epsilon) * scale + bias``;
    returns ``y``. ``cudnnBatchNormalizationForwardInference``.

    **Fused** (``activation="relu"``, with an optional residual ``z`` of ``x``'s shape and dtype):
    ``y = relu(bn(x) + z)``. Training returns ``(y, saved_mean, saved_inv_std, reserve)``: one
    ``cudnnBatchNormalizationForwardTrainingEx`` (``CUDNN_BATCHNORM_OPS_BN_ACTIVATION`` / ``_ADD_ACTIVATION``)
    where cuDNN fuses these arrays (channels-last half types, C a multiple of 4; under ``settings(prefer="legacy")``
    where the graph would take them), whose ``reserve`` (uint8) the backward takes; elsewhere the unfused steps
    (the plain call, ``cudnnAddTensor``, ``cudnnActivationForward``) and ``reserve`` is None. The graph path (the
    default where it applies) fuses them as ``ADD`` and ``RELU_FWD`` nodes after the norm and keeps no reserve
    (None): its backward takes the ReLU's gradient from ``y``. Inference runs the unfused steps.

    The parameter descriptor comes from ``cudnnDeriveBNTensorDescriptor`` (primitive :data:`BATCH_NORM_FORWARD`).

    Args:
        x: ``(N, C, *sp)``, 2 to 5 dims, a CUDA array; float16, bfloat16, float32 or float64; dense channels-first
            or channels-last (others are copied to C order). Training needs more than one value per channel.
        scale: ``(C,)`` (``(C, *sp)`` per activation) in :func:`param_dtype` of ``x``'s dtype (float32, float64
            for float64 ``x``).
        bias: as ``scale``.
        running_mean: as ``scale``, C-contiguous, updated in place when training; required for inference. Pass
            both running statistics or neither.
        running_var: as ``running_mean`` (the unbiased variance).
        training: normalize with the batch's statistics (True) or the running ones (False).
        momentum: the weight of the batch's statistics in the running ones, in [0, 1].
        epsilon: added to the variance, > 0 (and >= ``CUDNN_BN_MIN_EPSILON``, 0 in cuDNN 9).
        mode: ``"spatial"``, ``"spatial_persistent"`` (``CUDNN_BATCHNORM_SPATIAL_PERSISTENT``, faster for some
            inputs) or ``"per_activation"``.
        z: a residual of ``x``'s shape and dtype added before the ReLU (needs ``activation="relu"``).
        activation: None or ``"relu"`` (fused after the norm).
        return_mask: also return the ReLU's mask, bit-packed (cudnn-frontend's BN_RELU pattern: the graph's
            ``CMP_GT`` of the ReLU's output as a channels-last BOOLEAN output): a new uint8 array ``(N, H, W, C //
            8)``, channel ``c`` of pixel ``(n, h, w)`` in bit ``c % 8`` of byte ``c // 8``, which
            :func:`batch_norm_backward` takes as ``relu_mask=``. Training, ``activation="relu"``, no ``z``, a 4-d
            ``x`` with C a multiple of 8, on the graph path (channels-last; the legacy calls refuse it by name).
        out: training: ``(y, saved_mean, saved_inv_std)``, each an array to write or None; inference: ``y`` or
            None. A ``y`` dense channels-first or channels-last; statistics C-contiguous.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        Training: ``(y, saved_mean, saved_inv_std)``, with ``activation`` ``(y, saved_mean, saved_inv_std,
        reserve)`` (``reserve`` a uint8 array or None), and ``relu_mask`` after them with ``return_mask=True``;
        inference: ``y``. ``y`` has ``x``'s shape, dtype and layout,
        the statistics ``scale``'s shape and dtype.

    Raises:
        TypeError: a host array, a dtype outside the list, parameters or statistics of a dtype other than
            :func:`param_dtype`'s, or ``training`` not a bool.
        ValueError: a rank outside 2 to 5; parameters of the wrong shape or not packed where cuDNN writes them;
            ``epsilon``/``momentum`` out of range; one running statistic; inference without them; a batch with
            one value per channel in training; an ``activation`` other than ``"relu"``, or ``z`` without it.

    Example:
        >>> import cupy as cp
        >>> from cudnnkit import ops
        >>> x = cp.random.standard_normal((8, 16, 32, 32), dtype=cp.float32)
        >>> g, b = cp.ones(16, cp.float32), cp.zeros(16, cp.float32)
        >>> rm, rv = cp.zeros(16, cp.float32), cp.ones(16, cp.float32)
        >>> y, mean, inv_std = ops.batch_norm_forward(x, g, b, running_mean=rm, running_var=rv)
        >>> y_eval = ops.batch_norm_forward(x, g, b, running_mean=rm, running_var=rv, training=False)
    """
    training = as_bool(training, "training")
    if training:
        y, sm, si = _outs("batch_norm_forward", out, ("y", "saved_mean", "saved_inv_std"))
    else:
        y, sm, si = out, None, None
    arrays = {"x": x, "scale": scale, "bias": bias, "running_mean": running_mean, "running_var": running_var,
              "saved_mean": sm, "saved_inv_std": si, "z": z}  # fmt: skip
    kw = dict(return_mask=True) if return_mask is not False else {}  # the keyword only when given: express keys
    res = run(BATCH_NORM_FORWARD, arrays, stream=stream, y=y, training=training, momentum=momentum,
              epsilon=epsilon, mode=mode, activation=activation, **kw)  # fmt: skip
    if not training:
        return res[0]
    if kw:
        return res
    return res[:4] if activation is not None else res[:3]


def batch_norm_backward(
    dy: Any,
    x: Any,
    scale: Any,
    saved_mean: Any,
    saved_inv_std: Any,
    *,
    epsilon: float = 1e-5,
    mode: str = "spatial",
    activation: str | None = None,
    y: Any = None,
    bias: Any = None,
    reserve: Any = None,
    z_grad: bool = False,
    relu_mask: Any = None,
    out: Any = None,
    stream: Any = None,
) -> tuple[Any, ...]:
    """``(dx, dscale, dbias)`` of :func:`batch_norm_forward` (training) from ``dy``, its input ``x``, ``scale``
    and its saved statistics (``epsilon`` and ``mode`` the forward's).

    ``dx`` has ``x``'s shape and dtype (and layout when new), ``dscale``/``dbias`` ``scale``'s.
    ``cudnnBatchNormalizationBackward`` (primitive :data:`BATCH_NORM_BACKWARD`); for a channels-last 4-d float16,
    bfloat16 or float32 ``x`` without a ``reserve`` (unless ``settings(prefer="legacy")``), one graph
    (``NORM_BACKWARD``).

    The fused forward's backward: ``activation="relu"`` with the forward's output ``y``; ``z_grad=True`` when it
    added a residual, which returns ``(dx, dscale, dbias, dz)``. With the fused forward's ``reserve`` (and
    ``bias``): one ``cudnnBatchNormalizationBackwardEx``; without (it ran unfused): ``cudnnActivationBackward``
    from ``y``, then the plain backward.

    Args:
        dy: ``y``'s gradient, ``x``'s shape and dtype.
        x: the forward's input ``(N, C, *sp)``, 2 to 5 dims, non-empty; float16, bfloat16, float32 or float64.
        scale: the forward's ``scale``, in :func:`param_dtype` of ``x``'s dtype.
        saved_mean: the forward's ``saved_mean``.
        saved_inv_std: the forward's ``saved_inv_std``.
        epsilon: the forward's.
        mode: the forward's.
        activation: None, or ``"relu"`` for a fused forward's backward (needs ``y``).
        y: the fused forward's output (where the ReLU was active); only with ``activation``.
        bias: the forward's ``bias``, needed with ``reserve`` (cuDNN reads it).
        reserve: the fused forward's ``reserve`` (1-d uint8) when it returned one; None otherwise.
        z_grad: also return the residual's gradient ``dz`` (a fused forward with ``z``).
        relu_mask: the forward's bit-packed ReLU mask (``return_mask=True``), with ``activation="relu"`` and
            ``y``: the graph then computes the ReLU's gradient as ``MUL(dy, mask)`` feeding ``NORM_BACKWARD``
            (cudnn-frontend's DRELU_DBN) in one graph; the legacy calls take the ReLU's gradient from ``y``.
        out: ``(dx, dscale, dbias)`` (and ``dz`` with ``z_grad``), each an array to write or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dscale, dbias)``, or ``(dx, dscale, dbias, dz)`` with ``z_grad=True``.

    Raises:
        TypeError: a host array, another dtype, or a ``reserve`` that is not uint8.
        ValueError: an empty ``x``, shapes that do not match, an ``activation`` other than ``"relu"``, ``y`` or
            ``reserve`` without it, ``activation`` without ``y``, ``reserve`` without ``bias``, or ``z_grad``
            without ``activation``.

    Example:
        >>> y, mean, inv_std = ops.batch_norm_forward(x, g, b)
        >>> dx, dg, db = ops.batch_norm_backward(dy, x, g, mean, inv_std)
    """
    names = ("dx", "dscale", "dbias", "dz") if z_grad is True else ("dx", "dscale", "dbias")
    got = _outs("batch_norm_backward", out, names)
    dx, ds, db = got[:3]
    arrays = {"dy": dy, "x": x, "scale": scale, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std,
              "dscale": ds, "dbias": db, "y": y, "bias": bias, "reserve": reserve,
              "dz": got[3] if len(got) == 4 else None, "relu_mask": relu_mask}  # fmt: skip
    res = run(BATCH_NORM_BACKWARD, arrays, stream=stream, dx=dx, epsilon=epsilon, mode=mode, activation=activation,
              z_grad=z_grad)  # fmt: skip
    return res if z_grad is True else res[:3]


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


def _packed_spec(shape: tuple[int, ...], dtype: str) -> Spec:
    return Spec(tuple(shape), contiguous_strides(tuple(shape)), dtype)


def _meta_x(x: Spec | None, scale: Spec | None, fn: str) -> None:
    if x is None or scale is None:
        raise ValueError(f"{fn}: x and scale are required")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{fn}: x has dtype {x.dtype}, not one of {', '.join(_DTYPES)}")


def _needed(grads: tuple, needs: tuple) -> tuple:
    return tuple(g if n else None for g, n in zip(grads, needs))


def _fusable(dtype: str, lay: str, x_shape: tuple[int, ...], mode: str) -> bool:
    """Where the L3 batch norm keeps the fused forward's reserve: 4-d channels-last float16 with C a multiple of
    4, spatial (what cuDNN fuses, as measured on the H200: tests/gpu/test_normalization_gpu.py), and there only
    when cuDNN's size query accepts the call, and only under ``settings(prefer="legacy")`` (the graph form, which
    runs such calls otherwise, keeps no reserve). Elsewhere a reserve the forward made is dropped: the backward then runs the unfused steps (from
    ``y``), the same gradients."""
    return (dtype == "float16" and lay == "nhwc" and len(x_shape) == 4 and x_shape[1] % 4 == 0
            and mode in ("spatial", "spatial_persistent") and current_settings().prefer == "legacy")  # fmt: skip


def _current_handle() -> tuple[Any, int]:
    """This thread's cuDNN handle on the current device of the first array library (meta has no arrays)."""
    from ..runtime import adapters, get_handle

    ad = adapters.first_available()
    if ad is None:
        raise RuntimeError("batch_norm meta: the fused reserve's size is a cuDNN query, which needs a cuDNN handle: "
                           "CuPy or torch with a CUDA device")  # fmt: skip
    dev = int(ad.current_device())
    return get_handle(dev, ad.current_stream(dev), ad), dev


def _bn_reserve(r: _BN, lay: str) -> Spec | None:
    """The spec of the reserve a fused training forward (``activation="relu"``) of ``r`` keeps (see
    :func:`_fusable`), or None: ``cudnnGetBatchNormalizationTrainingExReserveSpaceSize`` through :func:`_ex_sizes`
    (the forward's own query and cache) with the current device's handle: host-side, but it needs a GPU."""
    if not (r.training and r.act and _fusable(r.dtype, lay, r.x_shape, r.mode)):
        return None
    xd = tensor_descriptor(r.dtype, *_canon(r.x_shape, lay))
    pd = bn_param_descriptor(r.dtype, _bn_rank(r.x_shape), r.mode)
    h, dev = _current_handle()
    sizes = _ex_sizes(h, dev, _ex_mode(r, lay), _bn_ops(r), xd, xd if r.z else None, xd, pd, _relu())
    return None if sizes is None else Spec((max(sizes[1].value, 1),), (1,), "uint8")


def _bn_res_names(training: bool, act: bool, reserve: bool, z: bool, mask: bool = False) -> tuple[str, ...]:
    """The L3 batch norm's residuals, in order (``"z"``, the input itself, says that a residual was added)."""
    stats = ("saved_mean", "saved_inv_std") if training else ("mean", "var")
    names = ("x", "scale", *stats) + (("y",) if act else ()) + (("bias", "reserve") if reserve else ())
    return names + (("relu_mask",) if mask else ()) + (("z",) if z else ())


#: the fewest elements of x for which the L3 batch norm keeps the ReLU mask. Measured on the H100 (cuDNN 9.19,
#: device time of forward + backward, mask / without): 2M elements (64x32x32x32) 42.5/34.1 us float32, 42.8/33.2
#: bfloat16, 32.4/29.9 float16 (the masked forward's engine is slower there); 1M about even; from 4M on the mask
#: wins at every shape tried (4M 54.1/62.7 float32, 33.6/37.6 bfloat16; 24.5M 268/370 and 146/199).
_MASK_MIN_ELEMENTS = 1 << 22


def _mask_fusable(dtype: str, lay: str | None, x_shape: tuple[int, ...], mode: str) -> bool:
    """Where the L3 batch norm with its ReLU fused (training, no residual z) keeps the graph's bit-packed ReLU mask
    (``return_mask=True``) for a one-graph backward (DRELU_DBN): where the graph form runs the forward (4-d
    channels-last float16/bfloat16/float32, not per-activation, not under ``settings(prefer="legacy")``), C is
    a multiple of 8 (a byte holds 8 channels) and x has at least ``_MASK_MIN_ELEMENTS`` elements (below that the
    masked forward costs more device time than the backward saves). Meta predicts it with the same test."""
    return (current_settings().prefer != "legacy" and _bn_graph_shape_refuses(dtype, x_shape, lay, mode) is None
            and x_shape[1] % 8 == 0 and math.prod(x_shape) >= _MASK_MIN_ELEMENTS)  # fmt: skip


def _bn_l3_resolve(specs: dict[str, Spec | None], kw: dict) -> tuple[_BN, Spec]:
    """The forward's resolution from specs, and the spec of its ``y`` (``x``'s layout: ``_new_strides``)."""
    _meta_x(specs["x"], specs["scale"], "batch_norm")
    if specs["bias"] is None:
        raise ValueError("batch_norm: bias is required (cuDNN's batch norm adds one; pass zeros for none)")
    r = _bn_fwd_resolve({k: spec_view(s) for k, s in specs.items()}, kw)
    return r, Spec(r.x_shape, _new_strides(r.x_shape, r.lay) or contiguous_strides(r.x_shape), r.dtype)


def _bn_l3_forward(x: Any, scale: Any, bias: Any, z: Any = None, *, running_mean: Any = None,
                   running_var: Any = None, training: bool = True, momentum: float = 0.1, epsilon: float = 1e-5,
                   mode: str = "spatial", activation: str | None = None) -> tuple[tuple, dict]:  # fmt: skip
    training = as_bool(training, "training")
    want_mask = False
    if activation is not None and training and z is None:  # the graph's ReLU mask, for a one-graph backward
        from ..runtime.arrays import as_view

        vx = as_view(x, "x")
        want_mask = _mask_fusable(vx.dtype, layout_of(vx), tuple(vx.shape), mode)
    got = batch_norm_forward(x, scale, bias, running_mean=running_mean, running_var=running_var, training=training,
                             momentum=momentum, epsilon=epsilon, mode=mode, z=z, activation=activation,
                             **({"return_mask": True} if want_mask else {}))  # fmt: skip
    act = activation is not None
    if not training:  # copies: the running statistics are the caller's, and may change before the backward
        vals = {"x": x, "scale": scale, "mean": transform_tensor(running_mean), "var": transform_tensor(running_var),
                "y": got, "z": z}  # fmt: skip
        return (got,), {k: vals[k] for k in _bn_res_names(False, act, False, z is not None)}
    y, sm, si, *rest = got
    reserve = rest[0] if rest else None
    mask = rest[1] if want_mask else None
    if act:
        from ..runtime.arrays import as_view

        vy = as_view(y, "y")
        if not _fusable(vy.dtype, layout_of(vy) or "nchw", tuple(vy.shape), mode):
            reserve = None  # not one meta predicts: the backward's unfused steps
        elif reserve is None:
            views = {"x": as_view(x, "x"), "scale": as_view(scale, "scale"), "bias": as_view(bias, "bias"),
                     "z": None if z is None else as_view(z, "z")}  # fmt: skip
            kw = dict(training=True, momentum=momentum, epsilon=epsilon, mode=mode, activation=activation)
            if _bn_reserve(_bn_fwd_resolve(views, kw), layout_of(vy) or "nchw") is not None:
                raise RuntimeError("batch_norm: cuDNN's size query accepted the fused ReLU forward but the call "
                                   "refused it, so there is no reserve where meta said there is one; pass "
                                   "activation=None and apply the ReLU separately")  # fmt: skip
    vals = {"x": x, "scale": scale, "saved_mean": sm, "saved_inv_std": si, "y": y, "bias": bias, "reserve": reserve,
            "z": z, "relu_mask": mask}  # fmt: skip
    return (y,), {k: vals[k] for k in _bn_res_names(True, act, reserve is not None, z is not None, want_mask)}


def _bn_l3_meta(x: Spec, scale: Spec, bias: Spec, z: Spec | None = None, *, running_mean: Spec | None = None,
                running_var: Spec | None = None, training: bool = True, momentum: float = 0.1,
                epsilon: float = 1e-5, mode: str = "spatial",
                activation: str | None = None) -> tuple[tuple, dict]:  # fmt: skip
    specs = {"x": x, "scale": scale, "bias": bias, "z": z, "running_mean": running_mean, "running_var": running_var}
    kw = dict(training=training, momentum=momentum, epsilon=epsilon, mode=mode, activation=activation)
    r, y = _bn_l3_resolve(specs, kw)
    stat = _packed_spec(r.p_shape, r.pdtype)
    lay = layout_of(spec_view(y)) or "nchw"
    reserve = _bn_reserve(r, lay)
    mask = r.act and r.training and not r.z and _mask_fusable(r.dtype, layout_of(spec_view(x)), r.x_shape, r.mode)
    mspec = _packed_spec(_mask_shape(r.x_shape, "x"), "uint8") if mask else None
    vals = {"x": x, "scale": scale, "saved_mean": stat, "saved_inv_std": stat, "mean": stat, "var": stat, "y": y,
            "bias": bias, "reserve": reserve, "z": z, "relu_mask": mspec}  # fmt: skip
    return (y,), {k: vals[k] for k in _bn_res_names(r.training, r.act, reserve is not None, r.z, mask)}


def _bn_l3_backward(res: dict, douts: tuple, needs: tuple, *, training: bool = True, epsilon: float = 1e-5,
                    mode: str = "spatial", activation: str | None = None, **_: Any) -> tuple:  # fmt: skip
    (dy,) = douts
    if dy is None or not any(needs):
        return (None,) * 4
    z = "z" in res
    if as_bool(training, "training"):
        if res.get("relu_mask") is not None:  # the graph forward's bit-packed ReLU mask: one DRELU_DBN graph
            got = batch_norm_backward(dy, res["x"], res["scale"], res["saved_mean"], res["saved_inv_std"],
                                      epsilon=epsilon, mode=mode, activation=activation, y=res["y"],
                                      relu_mask=res["relu_mask"])  # fmt: skip
            return _needed((*got[:3], None), needs)
        if activation is not None and res.get("reserve") is None:
            # the forward kept no reserve (its graph fused the ReLU): the ReLU's gradient from y, then the plain
            # backward, as two L2 calls (cudnnActivationBackward, then the graph's or the legacy backward: on the
            # legacy path the plain call's choice, the persistent Ex call where _persistent says, as the unfused
            # modules get, where batch_norm_backward(activation=) would call cudnnBatchNormalizationBackward).
            # Each repeats on the express path; the fused L2 call runs its whole form every time (its dy is a
            # temporary): 196-229 against 150-180 us of host time per call on the H100
            g = activation_backward(dy, res["y"], res["y"], "relu")
            got = batch_norm_backward(g, res["x"], res["scale"], res["saved_mean"], res["saved_inv_std"],
                                      epsilon=epsilon, mode=mode)  # fmt: skip
            return _needed((*got[:3], g if z else None), needs)
        got = batch_norm_backward(dy, res["x"], res["scale"], res["saved_mean"], res["saved_inv_std"],
                                  epsilon=epsilon, mode=mode, activation=activation, y=res.get("y"),
                                  bias=res.get("bias"), reserve=res.get("reserve"), z_grad=z)  # fmt: skip
        return _needed((*got[:3], got[3] if z else None), needs)
    return _needed(_bn_inference_backward(res, dy, needs, epsilon, mode, activation), needs)


def _bn_inference_backward(res: dict, dy: Any, needs: tuple, epsilon: float, mode: str, activation: Any) -> tuple:
    """The gradients of ``y = relu?(scale * (x - mean) * inv_std + bias (+ z))`` with fixed running statistics
    (cuDNN has no inference backward), from L2 calls: ``g`` = ``dy`` (through ``cudnnActivationBackward`` from
    ``y`` with the ReLU; ``dz = g``); ``dx = g * scale * inv_std`` as an inference batch norm of ``g`` with zero
    mean and bias; ``inv_std`` as one of ones ``(1, *P)``; ``dscale = sum(g * (x - mean) * inv_std)`` and ``dbias
    = sum(g)`` from ``cudnnBatchNormalizationBackward`` given the running statistics as the saved ones (its ``dx``,
    the training one, is discarded)."""
    g = dy if activation is None else activation_backward(dy, res["y"], res["y"], "relu")
    var = res["var"]
    zeros = set_tensor(transform_tensor(var), 0.0)
    dx = ds = db = None
    if needs[0]:
        dx = batch_norm_forward(g, res["scale"], zeros, running_mean=zeros, running_var=var, training=False,
                                epsilon=epsilon, mode=mode)  # fmt: skip
    if needs[1] or needs[2]:
        p = tuple(var.shape)
        ones = set_tensor(transform_tensor(var), 1.0)
        aux = "per_activation" if mode == "per_activation" else "spatial"
        inv = batch_norm_forward(ones.reshape((1, *p)), ones, zeros, running_mean=zeros, running_var=var,
                                 training=False, epsilon=epsilon, mode=aux).reshape(p)  # fmt: skip
        _, ds, db = batch_norm_backward(g, res["x"], res["scale"], res["mean"], inv, epsilon=epsilon, mode=mode)
    return dx, ds, db, g if "z" in res else None


BATCH_NORM = differentiable(
    Differentiable(
        "batch_norm", "batch_norm_forward", ("x", "scale", "bias", "z"), ("y",), _bn_l3_forward, _bn_l3_backward,
        _bn_l3_meta, arrays=("running_mean", "running_var"), mutated=("running_mean", "running_var"),
        capture_safe=True,  # cudnnBatchNormalization*Ex (or the graph): device work, the statistics updated on the device
        doc="""y = relu?(batch_norm(x) (+ z)) (batch_norm_forward's keywords; z, the fused residual, with
        activation='relu'). Training: the running statistics updated in place; residuals x, scale, saved_mean,
        saved_inv_std (scale's shape, the parameters' dtype), y (with the ReLU), bias and reserve (uint8, where the
        fused forward keeps one: _fusable), z (the input, when given); one batch_norm_backward (dscale, dbias; dz)
        with the reserve, else activation_backward from y then a plain batch_norm_backward (dz is the former).
        Inference (training=False): residuals x, scale, and copies of the running statistics (mean, var); the
        backward from L2 calls (_bn_inference_backward), as torch's eval-mode batch norm is differentiated.""",
    )
)  # fmt: skip


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
