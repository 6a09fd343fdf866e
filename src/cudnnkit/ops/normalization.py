"""Batch norm, forward and backward: cuDNN's graph API for channels-last 4-d training (see "batch norm (graph)"
below) and its legacy calls for everything else. Layer, RMS and instance norm are :mod:`cudnnkit.ops.layer_norm`;
what the two share is :mod:`cudnnkit.ops._norm_common`.

Shapes (logical order whatever the memory layout; ``P`` is the parameters' dtype, below)

================================  ====================  ===========================  =================================
function                          ``x``, ``y``, ``dy``  ``scale``, ``bias`` (``P``)  saved statistics (``P``)
================================  ====================  ===========================  =================================
batch norm, ``"spatial"``         ``(N, C, *sp)``       ``(C,)``                     ``(C,)``: ``mean``, ``inv_std``
batch norm, ``"per_activation"``  ``(N, C, *sp)``       ``(C, *sp)``                 ``(C, *sp)``
================================  ====================  ===========================  =================================

``sp`` is 0 to 3 spatial dims (``(N, C)`` and ``(N, C, L)`` run as 4-d with trailing size-1 dims, as torch's
``BatchNorm1d``). ``inv_std = 1 / sqrt(var + epsilon)`` (the biased variance).

Dtypes: ``x``, ``y``, ``dy``, ``dx`` share one of float16, bfloat16, float32 and float64; the parameters,
statistics and their gradients (``P``) are float32, or float64 for float64 ``x``: the rule of
``cudnnDeriveBNTensorDescriptor`` (float for the half types, the data type otherwise: :func:`param_dtype`).
Anything else is refused (``TypeError`` naming the argument).

Layouts: ``x`` dense channels-first (C order) or channels-last (NHWC), and a new ``y``/``dx`` in ``x``'s layout; a
given ``out`` must be dense in one of the two, and the inputs are copied into its layout where they differ; any
other input layout is copied to C order (logged). Parameters and statistics are packed (C-contiguous): inputs are
copied when they are not, and the running statistics and given ``out=`` statistics, which cuDNN writes, must be.

cuDNN calls: ``cudnnBatchNormalizationForwardTraining``, ``cudnnBatchNormalizationForwardInference``,
``cudnnBatchNormalizationBackward``, with the parameter descriptor from ``cudnnDeriveBNTensorDescriptor``
(``CUDNN_BATCHNORM_SPATIAL``, ``_PER_ACTIVATION``, ``_SPATIAL_PERSISTENT``); channels-last 4-d float16, bfloat16
and float32 training runs one graph instead (``settings(prefer="legacy")`` keeps the Ex calls) (``NORM_FORWARD``
batch mode with the running statistics updated in place, then ``ADD`` and ``RELU_FWD`` when fused, and the ReLU's
bit-packed mask when asked for; ``NORM_BACKWARD``, after the ReLU's gradient from ``y`` or inside the graph from
the mask when fused), which keeps no reserve. A lone batch-norm inference graph has no engine on cuDNN 9.19, so
inference is legacy only.

The saved statistics and parameter gradients are not the primitives' outputs (those take the first operand's
dtype): a given ``out=`` statistic is an optional operand written in place, a missing one is allocated by the
call, and both come back after the main output (the primitive's ``extras``).

L3 (:mod:`cudnnkit.autograd`, :mod:`cudnnkit.torch`): ``batch_norm`` is declared at the end
(:class:`~cudnnkit.ops._diff.Differentiable`), with one output ``y`` and the saved statistics as residuals; in
inference it is differentiated too (from L2 calls: cuDNN has no inference backward).
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import lib
from ..graph.checks import as_bool
from ..graph.errors import UnsupportedGraphError
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
from ..runtime.dtypes import scaling_ref
from ._diff import Differentiable, Spec, differentiable, spec_view
from ._graphform import Binder, channels_last_output, graph_form
from ._layout import channels_last_strides
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
    param_dtype,
)
from ._primitive import Call, GraphOnlyError, Operand, Output, Primitive, register, run
from .activation import activation_backward
from .tensor import set_tensor, transform_tensor

__all__ = [
    "batch_norm_forward",
    "batch_norm_backward",
    "param_dtype",
    "bn_param_descriptor",
]

_log = logging.getLogger("cudnnkit")

_BN_MODES = {
    "spatial": lib.CUDNN_BATCHNORM_SPATIAL,
    "per_activation": lib.CUDNN_BATCHNORM_PER_ACTIVATION,
    "spatial_persistent": lib.CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
}


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
    nan: bool = False  #: the fused ReLU returns NaN for a NaN (CUDNN_PROPAGATE_NAN)


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
    nan = as_bool(kw.get("propagate_nan", False), "propagate_nan")
    if nan and not act:
        raise TypeError("propagate_nan is the fused ReLU's NaN rule: pass activation='relu'")
    mask = as_bool(kw.get("return_mask", False), "return_mask")
    if mask:
        _mask_shape(vx.shape, "return_mask=True")
        if not act or not training:
            raise ValueError("return_mask=True is the fused ReLU's mask in training: pass activation='relu' and "
                             "training=True")  # fmt: skip
    # momentum weighs only the running statistics' update: 0 where there is none (one graph and plan-cache key)
    momentum = float(momentum) if training and rm is not None else 0.0
    return _BN(vx.dtype, pdt, mode, training, rm is not None, momentum, eps, vx.shape, p_shape, lay,
               vx.size == 0, act, z, mask=mask, nan=nan)  # fmt: skip


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
        if act is None:
            raise ValueError("relu_mask= (the graph forward's return_mask=True) is for the fused ReLU's backward: "
                             "pass activation='relu' and y=")  # fmt: skip
        if vr is not None:
            raise ValueError("relu_mask= takes the place of the fused forward's reserve, and is not taken with "
                             "reserve=")  # fmt: skip
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
        lib.cudnnActivationForward(h, _relu(r.nan), one, yd, vy.ptr, zero, yd, vy.ptr)


def _relu_act(propagate_nan: bool = False) -> Any:
    """The fused ReLU (:class:`~cudnnkit.ops.activation.Act`): its legacy descriptor and its graph node."""
    from .activation import resolve_activation

    return resolve_activation("relu", None, propagate_nan)


def _relu(propagate_nan: bool = False) -> Any:
    """The fused ReLU's cached activation descriptor (``CUDNN_PROPAGATE_NAN`` when asked for)."""
    return _relu_act(propagate_nan).descriptor


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
    key = (device, m, ops_, xd.key, zd.key if zd is not None else None, yd.key, pd.key,
           act.key if act is not None else None)  # fmt: skip
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
    act = _relu(r.nan) if r.act else None
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
        y = _relu_act(r.nan).pointwise(b.g, y)
    b.output(y, "y", r.dtype, v["y"].strides)
    if r.mask:  # cudnn-frontend's BN_RELU: CMP_GT(relu_out, 0), a bit-packed channels-last BOOLEAN output
        m = b.g.pointwise("CMP_GT", y, b.g.scalar(0.0, ndim=y.ndim), dtype="bool", name="relu_mask")
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
    elif r.mask and r.z:  # DRELU_DADD_DBN: the graph writes the ReLU's gradient, the residual's, as dz
        if c.views.get("dz") is None:
            c.extra["dz"], c.views["dz"] = c.launch.empty(r.x_shape, r.dtype, channels_last_strides(r.x_shape),
                                                          name="dz")  # fmt: skip
        else:
            channels_last_output(c, "dz")
            c.extra["dz"] = c.arrays["dz"]


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
        # engine (cuDNN 9.19, H100). With the residual (DRELU_DADD_DBN) the product is also dz, an output
        mask = b.tensor("relu_mask", r.x_shape, channels_last_strides(r.x_shape), "bool")
        dy = b.g.pointwise("MUL", dy, mask, dtype=r.dtype)
        if r.z:
            dy = b.output(dy, "dz", r.dtype, v["dz"].strides)
    res = b.g.norm_backward("batch", x, dy, s, mean=m, inv_variance=iv)
    stat = (c_, 1, 1, 1)
    b.output(res.dx, "dx", r.dtype, v["dx"].strides)
    b.output(res.dscale, "dscale", "float32", stat)
    b.output(res.dbias, "dbias", "float32", stat)
    return b.done()


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
    propagate_nan: bool = False,
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
        propagate_nan: the fused ReLU's NaN rule (needs ``activation``): True asks for NaN out for a NaN in, as
            torch's ReLU: the legacy activation descriptor's ``CUDNN_PROPAGATE_NAN``, and on the graph path
            ``RELU_FWD``'s ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION`` (deprecated in cuDNN 9's header; the graph's
            ``RELU_FWD`` kept NaN with or without it on an H100, cuDNN 9.19). False (the default, cuDNN's): the
            legacy call returns 0 for it. The backward's
            ReLU gradient is 0 where ``y`` is NaN either way (``y > 0`` is false), as torch's.
        return_mask: also return the ReLU's mask, bit-packed (cudnn-frontend's BN_RELU pattern: the graph's
            ``CMP_GT`` of the ReLU's output as a channels-last BOOLEAN output): a new uint8 array ``(N, H, W, C //
            8)``, channel ``c`` of pixel ``(n, h, w)`` in bit ``c % 8`` of byte ``c // 8``, which
            :func:`batch_norm_backward` takes as ``relu_mask=``. Training, ``activation="relu"`` (with or without
            ``z``: the mask of ``relu(bn(x) + z)``, cudnn-frontend's BN_ADD_RELU), a 4-d ``x`` with C a multiple
            of 8, on the graph path (channels-last; the legacy calls refuse it by name).
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
            one value per channel in training; an ``activation`` other than ``"relu"``, or ``z`` without it;
            ``return_mask=True`` without ``activation="relu"`` in training, or for an ``x`` not 4-d with C a
            multiple of 8, or under ``settings(prefer="legacy")``, or where cuDNN has no engine for the masked
            graph (:class:`~cudnnkit.ops._primitive.GraphOnlyError`, a ``ValueError``); ``return_mask`` not a bool
            is a ``TypeError``.

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
    return_mask = as_bool(return_mask, "return_mask")
    if training:
        y, sm, si = _outs("batch_norm_forward", out, ("y", "saved_mean", "saved_inv_std"))
    else:
        y, sm, si = out, None, None
    arrays = {"x": x, "scale": scale, "bias": bias, "running_mean": running_mean, "running_var": running_var,
              "saved_mean": sm, "saved_inv_std": si, "z": z}  # fmt: skip
    kw = {"return_mask": True} if return_mask else {}  # the keywords only when asked for: express keys
    if propagate_nan is not False:
        kw["propagate_nan"] = propagate_nan
    res = run(BATCH_NORM_FORWARD, arrays, stream=stream, y=y, training=training, momentum=momentum,
              epsilon=epsilon, mode=mode, activation=activation, **kw)  # fmt: skip
    if not training:
        return res[0]
    if return_mask:
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
            (cudnn-frontend's DRELU_DBN) in one graph, and with ``z_grad`` also writes that product as ``dz``
            (DRELU_DADD_DBN); the legacy calls take the ReLU's gradient from ``y``.
        out: ``(dx, dscale, dbias)`` (and ``dz`` with ``z_grad``), each an array to write or None.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dscale, dbias)``, or ``(dx, dscale, dbias, dz)`` with ``z_grad=True``.

    Raises:
        TypeError: a host array, another dtype, or a ``reserve`` that is not uint8.
        ValueError: an empty ``x``, shapes that do not match, an ``activation`` other than ``"relu"``, ``y`` or
            ``reserve`` without it, ``activation`` without ``y``, ``reserve`` without ``bias``, ``z_grad``
            without ``activation``, or a ``relu_mask`` without ``activation``, with ``reserve``, or not the
            uint8 ``(N, H, W, C // 8)`` of a 4-d ``x`` with C a multiple of 8.

    Example:
        >>> y, mean, inv_std = ops.batch_norm_forward(x, g, b)
        >>> dx, dg, db = ops.batch_norm_backward(dy, x, g, mean, inv_std)
    """
    z_grad = as_bool(z_grad, "z_grad")  # first: a NumPy True asks for dz too, and out= is read by it
    names = ("dx", "dscale", "dbias", "dz") if z_grad is True else ("dx", "dscale", "dbias")
    got = _outs("batch_norm_backward", out, names)
    dx, ds, db = got[:3]
    arrays = {"dy": dy, "x": x, "scale": scale, "saved_mean": saved_mean, "saved_inv_std": saved_inv_std,
              "dscale": ds, "dbias": db, "y": y, "bias": bias, "reserve": reserve,
              "dz": got[3] if len(got) == 4 else None, "relu_mask": relu_mask}  # fmt: skip
    res = run(BATCH_NORM_BACKWARD, arrays, stream=stream, dx=dx, epsilon=epsilon, mode=mode, activation=activation,
              z_grad=z_grad)  # fmt: skip
    return res if z_grad is True else res[:3]


# ----------------------------------------------------------------- the L3 declarations


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
    sizes = _ex_sizes(h, dev, _ex_mode(r, lay), _bn_ops(r), xd, xd if r.z else None, xd, pd, _relu(r.nan))
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
#: (dtype, x's shape, mode, with the residual z) for which cuDNN had no engine for the masked forward graph in this process: the L3 batch
#: norm asked again without the mask, and neither it nor meta asks for the mask there again
_MASK_REFUSED: set[tuple[str, tuple[int, ...], str, bool, bool]] = set()


def _mask_fusable(dtype: str, lay: str | None, x_shape: tuple[int, ...], mode: str, z: bool = False,
                  nan: bool = False) -> bool:  # fmt: skip
    """Where the L3 batch norm with its ReLU fused (training, with or without the residual z) keeps the graph's
    bit-packed ReLU mask (``return_mask=True``) for a one-graph backward (DRELU_DBN; DRELU_DADD_DBN with z): where
    the graph form runs the forward (4-d channels-last float16/bfloat16/float32, not per-activation, not under
    ``settings(prefer="legacy")``), C is a multiple of 8 (a byte holds 8 channels) and x has at least
    ``_MASK_MIN_ELEMENTS`` elements (below that the masked forward costs more device time than the backward
    saves), unless cuDNN had no engine for the masked forward at this dtype, shape, mode and residual earlier in the
    process (``_MASK_REFUSED``: the forward then asks again without the mask). Meta predicts it with the same test,
    so a trace made before such a refusal expects a mask the forward cannot give (an error naming both); one made
    after it does not."""
    # the size first: most calls below the floor stop there (this runs on every fused batch-norm call)
    return (math.prod(x_shape) >= _MASK_MIN_ELEMENTS and x_shape[1] % 8 == 0
            and _bn_graph_shape_refuses(dtype, x_shape, lay, mode) is None and current_settings().prefer != "legacy"
            and (dtype, x_shape, mode, z, nan) not in _MASK_REFUSED)  # fmt: skip


def _bn_l3_resolve(specs: dict[str, Spec | None], kw: dict) -> tuple[_BN, Spec]:
    """The forward's resolution from specs, and the spec of its ``y`` (``x``'s layout: ``_new_strides``)."""
    _meta_x(specs["x"], specs["scale"], "batch_norm")
    if specs["bias"] is None:
        raise ValueError("batch_norm: bias is required (cuDNN's batch norm adds one; pass zeros for none)")
    r = _bn_fwd_resolve({k: spec_view(s) for k, s in specs.items()}, kw)
    return r, Spec(r.x_shape, _new_strides(r.x_shape, r.lay) or contiguous_strides(r.x_shape), r.dtype)


def _bn_l3_forward(x: Any, scale: Any, bias: Any, z: Any = None, *, running_mean: Any = None,
                   running_var: Any = None, training: bool = True, momentum: float = 0.1, epsilon: float = 1e-5,
                   mode: str = "spatial", activation: str | None = None,
                   propagate_nan: bool = False) -> tuple[tuple, dict]:  # fmt: skip
    training = as_bool(training, "training")
    want_mask = False
    if activation is not None and training:  # the graph's ReLU mask, for a one-graph backward
        from ..runtime.arrays import as_view

        vx = as_view(x, "x")
        want_mask = _mask_fusable(vx.dtype, layout_of(vx), tuple(vx.shape), mode, z is not None, bool(propagate_nan))
    kw = dict(running_mean=running_mean, running_var=running_var, training=training, momentum=momentum,
              epsilon=epsilon, mode=mode, z=z, activation=activation)  # fmt: skip
    if propagate_nan is not False:
        kw["propagate_nan"] = propagate_nan
    if want_mask:
        try:
            got = batch_norm_forward(x, scale, bias, return_mask=True, **kw)
        except (GraphOnlyError, UnsupportedGraphError) as e:  # no engine for the masked graph (prefer="graph": the
            # raw refusal): the forward without it (nothing ran)
            _log.info("batch_norm: no engine for the forward with the ReLU mask (%s); without it from now on for "
                      "%s %s", str(e).splitlines()[0], vx.dtype, tuple(vx.shape))  # fmt: skip
            _MASK_REFUSED.add((vx.dtype, tuple(vx.shape), mode, z is not None, bool(propagate_nan)))
            want_mask = False
    if not want_mask:
        got = batch_norm_forward(x, scale, bias, **kw)
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
            kw = dict(training=True, momentum=momentum, epsilon=epsilon, mode=mode, activation=activation,
                      propagate_nan=propagate_nan)  # fmt: skip
            if _bn_reserve(_bn_fwd_resolve(views, kw), layout_of(vy) or "nchw") is not None:
                raise RuntimeError("batch_norm: cuDNN's size query accepted the fused ReLU forward but the call "
                                   "refused it, so there is no reserve where meta said there is one; pass "
                                   "activation=None and apply the ReLU separately")  # fmt: skip
    vals = {"x": x, "scale": scale, "saved_mean": sm, "saved_inv_std": si, "y": y, "bias": bias, "reserve": reserve,
            "z": z, "relu_mask": mask}  # fmt: skip
    return (y,), {k: vals[k] for k in _bn_res_names(True, act, reserve is not None, z is not None, want_mask)}


def _bn_l3_meta(x: Spec, scale: Spec, bias: Spec, z: Spec | None = None, *, running_mean: Spec | None = None,
                running_var: Spec | None = None, training: bool = True, momentum: float = 0.1,
                epsilon: float = 1e-5, mode: str = "spatial", activation: str | None = None,
                propagate_nan: bool = False) -> tuple[tuple, dict]:  # fmt: skip
    specs = {"x": x, "scale": scale, "bias": bias, "z": z, "running_mean": running_mean, "running_var": running_var}
    kw = dict(training=training, momentum=momentum, epsilon=epsilon, mode=mode, activation=activation,
              propagate_nan=propagate_nan)  # fmt: skip
    r, y = _bn_l3_resolve(specs, kw)
    stat = _packed_spec(r.p_shape, r.pdtype)
    lay = layout_of(spec_view(y)) or "nchw"
    reserve = _bn_reserve(r, lay)
    mask = r.act and r.training and _mask_fusable(r.dtype, layout_of(spec_view(x)), r.x_shape, r.mode, r.z, r.nan)
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
            # (DRELU_DADD_DBN with the residual: the ReLU's gradient is also dz)
            got = batch_norm_backward(dy, res["x"], res["scale"], res["saved_mean"], res["saved_inv_std"],
                                      epsilon=epsilon, mode=mode, activation=activation, y=res["y"],
                                      relu_mask=res["relu_mask"], z_grad=z)  # fmt: skip
            return _needed((*got[:3], got[3] if z else None), needs)
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
        fused forward keeps one: _fusable), relu_mask (the graph's bit-packed ReLU mask, uint8 (N, H, W, C // 8),
        where _mask_fusable says), z (the input, when given); one batch_norm_backward (dscale, dbias; dz) with the
        reserve, one DRELU_DBN graph (batch_norm_backward(relu_mask=)) with the mask, else activation_backward
        from y then a plain batch_norm_backward (dz is the former).
        Inference (training=False): residuals x, scale, and copies of the running statistics (mean, var); the
        backward from L2 calls (_bn_inference_backward), as torch's eval-mode batch norm is differentiated.""",
    )
)  # fmt: skip
