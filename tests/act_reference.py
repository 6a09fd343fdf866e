"""Float64 NumPy references for every activation, forward and backward (from their definitions)."""

from __future__ import annotations

import math

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
    if mode == "gelu":
        return x * _phi(x)
    if mode == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(_K * (x + 0.044715 * x**3)))
    if mode == "softplus":
        b = 1.0 if coef is None else coef
        return np.logaddexp(0.0, b * x) / b
    if mode == "leaky_relu":
        s = 0.01 if coef is None else coef
        return np.where(x > 0, x, s * x)
    if mode == "identity":
        return x.copy()
    raise ValueError(mode)


_K = math.sqrt(2 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _phi(x):
    return 0.5 * (1 + _erf(x / math.sqrt(2)))


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
    if mode == "gelu":
        return dy * (_phi(x) + x * np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi))
    if mode == "gelu_tanh":
        u = _K * (x + 0.044715 * x**3)
        t = np.tanh(u)
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t**2) * _K * (1 + 3 * 0.044715 * x**2))
    if mode == "softplus":
        b = 1.0 if coef is None else coef
        return dy * _sig(b * x)
    if mode == "leaky_relu":
        s = 0.01 if coef is None else coef
        return dy * np.where(x > 0, 1.0, s)
    if mode == "identity":
        return dy.copy()
    raise ValueError(mode)
