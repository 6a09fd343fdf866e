"""Float64 NumPy references for the legacy activations, forward and backward (from their definitions)."""

from __future__ import annotations

import numpy as np

__all__ = ["act_forward", "act_backward"]


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def act_forward(x, mode, coef=None):
    x = np.asarray(x, np.float64)
    if mode == "sigmoid":
        return _sig(x)
    if mode == "relu":
        return np.maximum(x, 0.0)
    if mode == "tanh":
        return np.tanh(x)
    if mode == "clipped_relu":
        return np.minimum(np.maximum(x, 0.0), coef)
    if mode == "elu":
        a = 1.0 if coef is None else coef
        return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0.0)))
    if mode == "swish":
        b = 1.0 if coef is None else coef
        return x * _sig(b * x)
    if mode == "identity":
        return x.copy()
    raise ValueError(mode)


def act_backward(x, dy, mode, coef=None):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    if mode == "sigmoid":
        s = _sig(x)
        return dy * s * (1 - s)
    if mode == "relu":
        return dy * (x > 0)
    if mode == "tanh":
        return dy * (1 - np.tanh(x) ** 2)
    if mode == "clipped_relu":
        return dy * ((x > 0) & (x < coef))
    if mode == "elu":
        a = 1.0 if coef is None else coef
        return dy * np.where(x > 0, 1.0, a * np.exp(np.minimum(x, 0.0)))
    if mode == "swish":
        b = 1.0 if coef is None else coef
        s = _sig(b * x)
        return dy * (s + b * x * s * (1 - s))
    if mode == "identity":
        return dy.copy()
    raise ValueError(mode)
