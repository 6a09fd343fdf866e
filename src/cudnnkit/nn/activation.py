"""Softmax, activations and dropout with torch.nn.functional's names and semantics."""

from __future__ import annotations

import warnings
from typing import Any

from ..runtime.dtypes import FLOATS, canonical
from ._common import as_int, call1, cast, check_dtype, copy_into, inplace_source, real

__all__ = [
    "softmax",
    "log_softmax",
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "elu",
    "silu",
    "hardtanh",
    "gelu",
    "leaky_relu",
    "softplus",
    "dropout",
]


def softmax_dim(ndim: int, dim: Any, fn: str) -> int:
    """torch's softmax dim: ``dim``, or for None its deprecated implicit choice (0 for 0-, 1- and 3-d, else 1)."""
    if dim is None:
        warnings.warn(
            f"Implicit dimension choice for {fn} has been deprecated. Change the call to include dim=X as an argument.",
            stacklevel=4,
        )  # fmt: skip (the caller of softmax/log_softmax)
        return 0 if ndim in (0, 1, 3) else 1
    return as_int(dim, "dim")


def _softmax(input: Any, dim: Any, dtype: Any, log: bool, fn: str) -> Any:
    if dtype is not None:
        input = cast(input, canonical(dtype, "dtype"))
    axis = softmax_dim(input.ndim, dim, fn)
    if input.ndim == 0:  # cuDNN's tensors have 1 to 8 dims: a scalar as (1,) (torch takes dim 0 or -1 there)
        return call1("softmax", input.reshape(1), axis=axis, algo="accurate", log=log).reshape(())
    return call1("softmax", input, axis=axis, algo="accurate", log=log)


def softmax(input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    """torch's ``softmax``: L3 ``softmax``, ``cudnnSoftmaxForward`` (``CUDNN_SOFTMAX_ACCURATE``)."""
    return _softmax(input, dim, dtype, False, "softmax")


def log_softmax(input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Any:
    """torch's ``log_softmax``: L3 ``softmax`` (log=True), ``cudnnSoftmaxForward`` (``CUDNN_SOFTMAX_LOG``)."""
    return _softmax(input, dim, dtype, True, "log_softmax")


def _act(input: Any, mode: str, inplace: bool, coef: float | None = None, nan: bool = False) -> Any:
    check_dtype(input, FLOATS, "input", "cuDNN's activation")  # torch's take integers too
    src = inplace_source(input, inplace)
    x = src.reshape(1) if src.ndim == 0 else src  # cuDNN's tensors have 1 to 8 dims: a scalar as (1,)
    y = call1("activation", x, mode=mode, coef=coef, propagate_nan=nan)
    y = y.reshape(()) if input.ndim == 0 else y
    return copy_into(input, y) if inplace else y


def relu(input: Any, inplace: bool = False) -> Any:
    """torch's ``relu`` (NaN propagated): L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_RELU``)."""
    return _act(input, "relu", inplace, nan=True)


def sigmoid(input: Any) -> Any:
    """torch's ``sigmoid``: L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_SIGMOID``)."""
    return _act(input, "sigmoid", False)


def tanh(input: Any) -> Any:
    """torch's ``tanh``: L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_TANH``)."""
    return _act(input, "tanh", False)


def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Any:
    """torch's ``elu``: L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_ELU``, coef = alpha)."""
    return _act(input, "elu", inplace, coef=real(alpha, "alpha"))


def silu(input: Any, inplace: bool = False) -> Any:
    """torch's ``silu``: L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_SWISH``, coef 1)."""
    return _act(input, "swish", inplace, coef=1.0)


def hardtanh(input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Any:
    """torch's ``hardtanh`` with ``min_val=0``: L3 ``activation``, ``cudnnActivationForward`` (CLIPPED_RELU)."""
    lo, hi = real(min_val, "min_val"), real(max_val, "max_val")
    if lo != 0.0:
        raise NotImplementedError(f"hardtanh: min_val={min_val}: cuDNN's clipped ReLU clips below at 0 only")
    if not hi > 0:
        raise NotImplementedError(f"hardtanh: max_val={max_val}: cuDNN's clipped ReLU needs a ceiling > 0")
    return _act(input, "clipped_relu", inplace, coef=hi, nan=True)


def relu6(input: Any, inplace: bool = False) -> Any:
    """torch's ``relu6``: L3 ``activation``, ``cudnnActivationForward`` (``CUDNN_ACTIVATION_CLIPPED_RELU``, 6)."""
    return hardtanh(input, 0.0, 6.0, inplace)


def _graph_only(fn: str, mode: str) -> NotImplementedError:
    return NotImplementedError(
        f"{fn}: cuDNN's {mode} is a graph pointwise operation only, and cuDNN 9.19 has no engine for a graph of one "
        f"pointwise node; it runs fused after a convolution (cudnnkit.ops.convolution_forward(activation={mode!r}))"
    )


def gelu(input: Any, approximate: str = "none") -> Any:
    """torch's ``gelu``: not offered (graph-only ``CUDNN_POINTWISE_GELU_FWD`` has no standalone engine)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    raise _graph_only("gelu", "gelu" if approximate == "none" else "gelu_tanh")


def leaky_relu(input: Any, negative_slope: float = 0.01, inplace: bool = False) -> Any:
    """torch's ``leaky_relu``: not offered (graph-only ``CUDNN_POINTWISE_RELU_FWD`` with a slope)."""
    raise _graph_only("leaky_relu", "leaky_relu")


def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    """torch's ``softplus``: not offered (graph-only ``CUDNN_POINTWISE_SOFTPLUS_FWD``)."""
    raise _graph_only("softplus", "softplus")


def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """torch's ``dropout``: L3 ``dropout``, ``cudnnDropoutForward`` (cuDNN's RNG: other masks than torch's)."""
    p = real(p, "p")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:  # torch returns the input itself (any dtype)
        return input
    check_dtype(input, ("float16", "float32", "float64"), "input", "cuDNN's dropout")
    src = inplace_source(input, inplace)
    if p == 1.0:  # cuDNN takes p < 1: every element dropped
        y = src * 0
    else:
        y = call1("dropout", src, p=p, state=None)
    return copy_into(input, y) if inplace else y
