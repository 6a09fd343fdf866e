"""Activations on cuDNN's legacy API: ``cudnnActivationForward`` and ``cudnnActivationBackward``.

Modes (``y = f(x)``, elementwise, any shape of 1 to 8 dims, any strides):

=================  ==========================================  =========================================
mode               f(x)                                        ``coef``
=================  ==========================================  =========================================
``"sigmoid"``      ``1 / (1 + exp(-x))``                       --
``"relu"``         ``max(x, 0)``                               --
``"tanh"``         ``tanh(x)``                                 --
``"clipped_relu"`` ``min(max(x, 0), coef)``                    the ceiling (> 0)
``"elu"``          ``x`` if ``x > 0`` else ``coef * (exp(x) - 1)`` alpha (default 1.0)
``"swish"``        ``x * sigmoid(coef * x)``                   beta (default 1.0; SiLU)
=================  ==========================================  =========================================

These are the modes the legacy API has for these calls (its ``CUDNN_ACTIVATION_IDENTITY`` is documented for
``cudnnConvolutionBiasActivationForward`` only, so it is not offered here). GELU, softplus and leaky ReLU exist only as graph pointwise operations;
they come with the graph path of this issue (12). ``propagate_nan``: relu and clipped relu return NaN for a NaN
input (``CUDNN_PROPAGATE_NAN``), else 0. Dtypes: float16, bfloat16, float32, float64. Both calls blend
(``out = alpha * result + beta * out``); the backward takes ``y`` and ``x`` (cuDNN reads whichever its mode
needs) and ``dy``. Arrays run in one layout (:mod:`cudnnkit.ops._layout`): ``y`` gets ``x``'s; inputs in
another layout are copied.
"""

from __future__ import annotations

from typing import Any

from .. import lib
from ..runtime import DescriptorKind, check_choice, get_cached
from ..runtime.dtypes import FLOATS, check_scalar, nan_propagation
from ._layout import canonical_strides, describable
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["activation_forward", "activation_backward"]

_DTYPES = FLOATS  # runtime.dtypes: every float type cuDNN has
_MODES = {
    "sigmoid": lib.CUDNN_ACTIVATION_SIGMOID,
    "relu": lib.CUDNN_ACTIVATION_RELU,
    "tanh": lib.CUDNN_ACTIVATION_TANH,
    "clipped_relu": lib.CUDNN_ACTIVATION_CLIPPED_RELU,
    "elu": lib.CUDNN_ACTIVATION_ELU,
    "swish": lib.CUDNN_ACTIVATION_SWISH,
}
_COEF_DEFAULT = {"elu": 1.0, "swish": 1.0}


def _set_act(ptr: int, mode: str, nan: int, coef: float) -> None:
    lib.cudnnSetActivationDescriptor(ptr, _MODES[mode], nan, coef)
    if mode == "swish":
        lib.cudnnSetActivationDescriptorSwishBeta(ptr, coef)


ACTIVATION = DescriptorKind("activation", "cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor",
                            _set_act)  # fmt: skip


def activation_descriptor(mode: str, propagate_nan: bool = False, coef: float | None = None) -> Any:
    """The cached ``cudnnActivationDescriptor_t`` (``cudnnSetActivationDescriptor``, and
    ``cudnnSetActivationDescriptorSwishBeta`` for swish), the arguments checked. Host-side only."""
    check_choice(mode, _MODES, "mode")
    nan = nan_propagation(propagate_nan)
    if coef is None:
        if mode == "clipped_relu":
            raise ValueError("mode='clipped_relu' needs coef= (the ceiling, > 0)")
        coef = _COEF_DEFAULT.get(mode, 0.0)
    elif mode not in ("clipped_relu", "elu", "swish"):
        raise ValueError(f"coef is for clipped_relu (ceiling), elu (alpha) and swish (beta), not mode={mode!r}")
    coef = check_scalar(coef, "coef")  # a finite real number
    if mode == "clipped_relu" and not coef > 0:
        raise ValueError(f"coef (clipped_relu's ceiling) must be > 0, got {coef}")
    return get_cached(ACTIVATION, (mode, nan, float(coef)))


def _describe(shape: tuple[int, ...], strides: tuple[int, ...]):
    """Elementwise: an array cuDNN can address is described as it is (size-1 dims' strides canonical), up to
    cuDNN's 8 dims; else None (copied to C order, which is then described as it is)."""
    if len(shape) > 8 or not describable(shape, strides):
        return None
    return shape, canonical_strides(shape, strides)


def _resolve(views: Any, kw: Any) -> Any:
    v = next(iter(views.values()))
    if not 1 <= v.ndim <= 8:
        raise ValueError(f"{next(iter(views))} must have 1 to 8 dims (cuDNN's tensors), got shape {v.shape}")
    return activation_descriptor(kw.get("mode", "relu"), kw.get("propagate_nan", False), kw.get("coef"))


def _fwd_call(c: Call) -> None:
    vx, vy, d = c.views["x"], c.views["out"], c.desc
    lib.cudnnActivationForward(c.launch.handle, c.resolved, c.alpha, d, vx.ptr, c.beta, d, vy.ptr)


def _bwd_call(c: Call) -> None:
    v, d = c.views, c.desc
    lib.cudnnActivationBackward(
        c.launch.handle, c.resolved, c.alpha, d, v["y"].ptr, d, v["dy"].ptr, d, v["x"].ptr, c.beta, d, v["out"].ptr
    )


ACTIVATION_FORWARD = register(
    Primitive(
        "activation_forward",
        inputs=(Operand("x", _DTYPES),),
        outputs=(Output("out", like="x"),),
        resolve=_resolve,
        describe=lambda resolved: _describe,
        legacy=_fwd_call,
        layout_what="cuDNN's activation takes x and y in one layout",
        blend=True,
        family="activation",
        differentiable=("x",),
        residuals=("x", "out"),
        backward="activation_backward",
    )
)
ACTIVATION_BACKWARD = register(
    Primitive(
        "activation_backward",
        inputs=(Operand("dy", _DTYPES), Operand("y", like="dy"), Operand("x", like="dy")),
        outputs=(Output("out", like="x"),),
        resolve=_resolve,
        describe=lambda resolved: _describe,
        legacy=_bwd_call,
        layout_what="cuDNN's activation backward takes y, dy, x and dx in one layout",
        layout_order=("x", "y", "dy"),
        blend=True,
        family="activation",
    )
)


def activation_forward(
    x: Any,
    mode: str = "relu",
    *,
    coef: float | None = None,
    propagate_nan: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``y = alpha * f(x) + beta * out`` for activation ``mode`` (the module docstring's table); ``y`` has
    ``x``'s shape and dtype. ``cudnnActivationForward`` (primitive :data:`ACTIVATION_FORWARD`)."""
    kw = dict(mode=mode, coef=coef, propagate_nan=propagate_nan, out=out, alpha=alpha, beta=beta)
    return run(ACTIVATION_FORWARD, {"x": x}, stream=stream, **kw)


def activation_backward(
    dy: Any,
    y: Any,
    x: Any,
    mode: str = "relu",
    *,
    coef: float | None = None,
    propagate_nan: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``dx = alpha * f'(x) * dy + beta * out`` from ``dy``, the forward's ``y`` and its input ``x`` (the mode and
    ``coef`` must be the forward's). ``cudnnActivationBackward`` (primitive :data:`ACTIVATION_BACKWARD`)."""
    kw = dict(mode=mode, coef=coef, propagate_nan=propagate_nan, out=out, alpha=alpha, beta=beta)
    return run(ACTIVATION_BACKWARD, {"dy": dy, "y": y, "x": x}, stream=stream, **kw)
