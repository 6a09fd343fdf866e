"""Activations, forward and backward: cuDNN's legacy ``cudnnActivationForward`` / ``cudnnActivationBackward``, and
the table of every activation mode that the fused convolution also takes.

Modes (``y = f(x)``, elementwise, any shape of 1 to 8 dims, any strides):

==================  ================================================  ==================================  ========
mode                f(x)                                              ``coef``                            legacy
==================  ================================================  ==================================  ========
``"sigmoid"``       ``1 / (1 + exp(-x))``                             --                                  yes
``"relu"``          ``max(x, 0)``                                     --                                  yes
``"tanh"``          ``tanh(x)``                                       --                                  yes
``"clipped_relu"``  ``min(max(x, 0), coef)``                          the ceiling (> 0)                   yes
``"elu"``           ``x`` if ``x > 0`` else ``coef * (exp(x) - 1)``   alpha (default 1.0)                 yes
``"swish"``         ``x * sigmoid(coef * x)``                         beta (default 1.0; SiLU)            yes
``"gelu"``          ``x * Phi(x)`` (the normal CDF, erf form)         --                                  no
``"gelu_tanh"``     GELU's tanh approximation                         --                                  no
``"softplus"``      ``log(1 + exp(coef * x)) / coef``                 beta (default 1.0)                  no
``"leaky_relu"``    ``x`` if ``x > 0`` else ``coef * x``              the slope (default 0.01, torch's)   no
==================  ================================================  ==================================  ========

**Where each runs.** This op runs the legacy calls (``cudnnActivation*``), for the modes marked "yes". gelu,
gelu_tanh, softplus and leaky_relu exist only as graph pointwise operations (``CUDNN_POINTWISE_<MODE>_FWD``),
and cuDNN 9.19 has no engine for a graph of one pointwise node (measured on the H200: heuristics hand out no
engine config, for every mode and dtype), so they are refused here by name and run fused after a convolution
(:func:`cudnnkit.ops.convolution_forward` ``activation=``), where the table's definitions hold. The legacy
API's ``CUDNN_ACTIVATION_IDENTITY`` is documented for ``cudnnConvolutionBiasActivationForward`` only, so it is
not offered.

``propagate_nan``: relu and clipped relu return NaN for a NaN input (``CUDNN_PROPAGATE_NAN``), else 0. Dtypes:
float16, bfloat16, float32, float64 (legacy modes). Both calls blend (``out = alpha * result + beta * out``);
the backward takes ``y`` and ``x`` (the legacy call reads whichever its mode needs; the graph's ``_BWD`` modes
read ``x``) and ``dy``. Arrays run in one layout (:mod:`cudnnkit.ops._layout`): ``y`` gets ``x``'s; inputs in
another layout are copied.
"""

from __future__ import annotations

from typing import Any

from .. import lib
from ..runtime import DescriptorKind, check_choice, get_cached
from ..runtime.dtypes import FLOATS, check_scalar, nan_propagation
from ._diff import Differentiable, Spec, differentiable, new_like, spec_view
from ._layout import canonical_strides, describable
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["activation_forward", "activation_backward", "resolve_activation", "Act", "GRAPH_MODES"]

_DTYPES = FLOATS  # runtime.dtypes: every float type cuDNN has
_MODES = {
    "sigmoid": lib.CUDNN_ACTIVATION_SIGMOID,
    "relu": lib.CUDNN_ACTIVATION_RELU,
    "tanh": lib.CUDNN_ACTIVATION_TANH,
    "clipped_relu": lib.CUDNN_ACTIVATION_CLIPPED_RELU,
    "elu": lib.CUDNN_ACTIVATION_ELU,
    "swish": lib.CUDNN_ACTIVATION_SWISH,
}
#: mode -> (graph pointwise mode stem, the pointwise parameter coef sets, or None)
GRAPH_MODES = {
    "sigmoid": ("SIGMOID", None),
    "relu": ("RELU", None),
    "tanh": ("TANH", None),
    "clipped_relu": ("RELU", "relu_upper_clip"),
    "elu": ("ELU", "elu_alpha"),
    "swish": ("SWISH", "swish_beta"),
    "gelu": ("GELU", None),
    "gelu_tanh": ("GELU_APPROX_TANH", None),
    "softplus": ("SOFTPLUS", "softplus_beta"),
    "leaky_relu": ("RELU", "relu_lower_clip_slope"),
}
_COEF_DEFAULT = {"elu": 1.0, "swish": 1.0, "softplus": 1.0, "leaky_relu": 0.01}
_COEF_MODES = ("clipped_relu", "elu", "swish", "softplus", "leaky_relu")


class Act(tuple):
    """A resolved activation (hashable): ``(mode, propagate_nan, coef)``; ``descriptor`` is the legacy
    ``cudnnActivationDescriptor_t`` (None for the graph-only modes)."""

    __slots__ = ()

    def __new__(cls, mode: str, nan: bool, coef: float) -> Act:
        return tuple.__new__(cls, (mode, nan, coef))

    mode = property(lambda self: self[0])
    propagate_nan = property(lambda self: self[1])
    coef = property(lambda self: self[2])

    @property
    def descriptor(self) -> Any:
        if self[0] not in _MODES:
            return None
        return get_cached(ACTIVATION, (self[0], nan_propagation(self[1]), self[2]))

    def pointwise(self, g: Any, x: Any, dy: Any = None, **kw: Any) -> Any:
        """This activation's forward (``dy`` None) or backward node in graph ``g``; a NaN-propagating ReLU
        forward (``relu``, ``clipped_relu``, ``leaky_relu``: the modes whose max/min would drop a NaN) sets the
        pointwise descriptor's ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION`` (left unset otherwise: cuDNN's default)."""
        stem, param = GRAPH_MODES[self[0]]
        params = {param: self[2]} if param is not None else {}
        if dy is None:
            if self[1] and stem == "RELU":
                params["nan_propagation"] = True
            return g.pointwise(f"{stem}_FWD", x, **params, **kw)
        return g.pointwise(f"{stem}_BWD", x, dy=dy, **params, **kw)


def resolve_activation(mode: Any, coef: Any = None, propagate_nan: Any = False, name: str = "mode",
                       coef_name: str = "coef") -> Act:  # fmt: skip
    """An :class:`Act` from the public arguments, checked (``ValueError``/``TypeError`` naming them: ``name`` and
    ``coef_name`` are the caller's names for mode and coef)."""
    check_choice(mode, GRAPH_MODES, name)
    nan = nan_propagation(propagate_nan) == lib.CUDNN_PROPAGATE_NAN
    if coef is None:
        if mode == "clipped_relu":
            raise ValueError(f"{name}='clipped_relu' needs {coef_name}= (the ceiling, > 0)")
        coef = _COEF_DEFAULT.get(mode, 0.0)
    elif mode not in _COEF_MODES:
        raise ValueError(
            f"{coef_name} is for clipped_relu (ceiling), elu (alpha), swish and softplus (beta) and leaky_relu (slope), "
            f"not {name}={mode!r}"
        )
    coef = float(check_scalar(coef, coef_name))  # a finite real number
    if mode in ("clipped_relu", "softplus") and not coef > 0:
        raise ValueError(
            f"{coef_name} ({mode}'s {'ceiling' if mode == 'clipped_relu' else 'beta'}) must be > 0, got {coef}"
        )
    return Act(mode, nan, coef)


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
    return resolve_activation(mode, coef, propagate_nan).descriptor


def _describe(shape: tuple[int, ...], strides: tuple[int, ...]):
    """Elementwise: an array cuDNN can address is described as it is (size-1 dims' strides canonical), up to
    cuDNN's 8 dims; else None (copied to C order, which is then described as it is)."""
    if len(shape) > 8 or not describable(shape, strides):
        return None
    return shape, canonical_strides(shape, strides)


def _resolve(views: Any, kw: Any) -> Act:
    v = next(iter(views.values()))
    if not 1 <= v.ndim <= 8:
        raise ValueError(f"{next(iter(views))} must have 1 to 8 dims (cuDNN's tensors), got shape {v.shape}")
    r = resolve_activation(kw.get("mode", "relu"), kw.get("coef"), kw.get("propagate_nan", False))
    if r.mode not in _MODES:
        raise ValueError(
            f"mode {r.mode!r} is a graph pointwise mode, and cuDNN 9.19 has no engine for a lone pointwise graph "
            f"(measured on the H200); it runs fused: convolution_forward(..., activation={r.mode!r}). This op's "
            f"modes: {', '.join(_MODES)}"
        )
    return r


def _fwd_call(c: Call) -> None:
    vx, vy, d = c.views["x"], c.views["out"], c.desc
    lib.cudnnActivationForward(c.launch.handle, c.resolved.descriptor, c.alpha, d, vx.ptr, c.beta, d, vy.ptr)


def _bwd_call(c: Call) -> None:
    v, d = c.views, c.desc
    lib.cudnnActivationBackward(c.launch.handle, c.resolved.descriptor, c.alpha, d, v["y"].ptr, d, v["dy"].ptr, d,
                                v["x"].ptr, c.beta, d, v["out"].ptr)  # fmt: skip


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
    ``x``'s shape and dtype. ``cudnnActivationForward`` (primitive :data:`ACTIVATION_FORWARD`).

    Args:
        x: the input, 1 to 8 dims, any strides; float16, bfloat16, float32 or float64.
        mode: ``"sigmoid"``, ``"relu"``, ``"tanh"``, ``"clipped_relu"``, ``"elu"`` or ``"swish"`` (the graph-only
            modes ``"gelu"``, ``"gelu_tanh"``, ``"softplus"``, ``"leaky_relu"`` are refused here: they run fused
            after a convolution).
        coef: the mode's coefficient (clipped ReLU's ceiling, required; ELU's alpha and swish's beta, default 1.0).
        propagate_nan: relu and clipped relu return NaN for a NaN input (``CUDNN_PROPAGATE_NAN``).
        out: an array of ``x``'s shape and dtype to write; None allocates ``y`` in ``x``'s layout.
        alpha: scale of ``f(x)``.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y``, ``x``'s shape and dtype.

    Raises:
        ValueError: an unknown mode, a graph-only mode (naming where it runs), or a ``coef`` the mode refuses.

    Example:
        >>> y = ops.activation_forward(x, "swish", coef=1.0)      # SiLU
        >>> dx = ops.activation_backward(dy, y, x, "swish", coef=1.0)
    """
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
    ``coef`` must be the forward's). ``cudnnActivationBackward`` (primitive :data:`ACTIVATION_BACKWARD`).

    Args:
        dy: the gradient of ``y``, ``x``'s shape and dtype.
        y: the forward's output.
        x: the forward's input.
        mode: the forward's ``mode``.
        coef: the forward's ``coef``.
        propagate_nan: as in the forward.
        out: an array of ``x``'s shape and dtype to write ``dx``; None allocates it.
        alpha: scale of the gradient.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dx``, ``x``'s shape and dtype.

    Example:
        >>> y = ops.activation_forward(x, "relu")
        >>> dx = ops.activation_backward(dy, y, x, "relu")
    """
    kw = dict(mode=mode, coef=coef, propagate_nan=propagate_nan, out=out, alpha=alpha, beta=beta)
    return run(ACTIVATION_BACKWARD, {"dy": dy, "y": y, "x": x}, stream=stream, **kw)


# ----------------------------------------------------------------- the L3 declaration


def _l3_forward(x: Any, mode: str = "relu", *, coef: float | None = None, propagate_nan: bool = False) -> Any:
    y = activation_forward(x, mode, coef=coef, propagate_nan=propagate_nan)
    return (y,), {"x": x, "out": y}


def _l3_backward(res: Any, douts: Any, needs: Any, mode: str = "relu", **kw: Any) -> tuple:
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    return (activation_backward(dy, res["out"], res["x"], mode, **kw),)


def _l3_meta(x: Spec, mode: str = "relu", *, coef: float | None = None, propagate_nan: bool = False) -> Any:
    # the forward's own checks (dims, mode, coef), before any device work: a traced call refuses what it would
    _resolve({"x": spec_view(x)}, {"mode": mode, "coef": coef, "propagate_nan": propagate_nan})
    y = new_like(x)
    return (y,), {"x": x, "out": y}


ACTIVATION_L3 = differentiable(
    Differentiable("activation", "activation_forward", ("x",), ("out",), _l3_forward, _l3_backward, _l3_meta,
                   batch=("x", "out"),
                   capture_safe=True,  # one cudnnActivationForward / Backward each way: device work only
                   doc="y = f(x) for a legacy activation mode; the backward reads x and y (activation_backward)")
)  # fmt: skip
