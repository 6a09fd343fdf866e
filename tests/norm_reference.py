"""Float64 NumPy references for the normalizations, forward and backward (from their definitions): batch norm
(training with the running-statistics update, unbiased variance; inference), layer norm, RMS norm, instance norm.

Statistics follow cuDNN's conventions: ``inv_std = 1 / sqrt(var + eps)`` with the biased variance; the running
variance is updated with the unbiased one (``m / (m - 1)``), as cuDNN documents and torch does.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "bn_axes",
    "bn_forward",
    "bn_inference",
    "bn_backward",
    "ln_forward",
    "ln_backward",
    "rms_forward",
    "rms_backward",
    "in_forward",
    "in_backward",
]


def _f(a):
    return np.asarray(a, dtype=np.float64)


def bn_axes(ndim: int, mode: str = "spatial") -> tuple[int, ...]:
    """The axes batch norm reduces over: N and the spatial dims (spatial modes), or N alone (per_activation)."""
    return (0,) if mode == "per_activation" else (0, *range(2, ndim))


def _bshape(p, x, mode):
    """A parameter of shape ``(C,)`` or ``(C, *sp)`` broadcast against ``x``."""
    p = _f(p)
    return p.reshape((1, *p.shape)) if mode == "per_activation" else p.reshape((1, -1) + (1,) * (x.ndim - 2))


def bn_forward(x, scale, bias, eps=1e-5, mode="spatial", running_mean=None, running_var=None, momentum=0.1):
    """Training: ``(y, saved_mean, saved_inv_std, new_running_mean, new_running_var)``; statistics shaped like
    ``scale``; the new running statistics are None when none were given."""
    x = _f(x)
    ax = bn_axes(x.ndim, mode)
    mean = x.mean(axis=ax, keepdims=True)
    var = x.var(axis=ax, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    y = (x - mean) * inv * _bshape(scale, x, mode) + _bshape(bias, x, mode)
    pshape = np.shape(scale)
    m = x.size // mean.size
    nrm = nrv = None
    if running_mean is not None:
        nrm = (1 - momentum) * _f(running_mean) + momentum * mean.reshape(pshape)
        nrv = (1 - momentum) * _f(running_var) + momentum * (var * m / (m - 1)).reshape(pshape)
    return y, mean.reshape(pshape), inv.reshape(pshape), nrm, nrv


def bn_inference(x, scale, bias, mean, var, eps=1e-5, mode="spatial"):
    x = _f(x)
    return (x - _bshape(mean, x, mode)) / np.sqrt(_bshape(var, x, mode) + eps) * _bshape(scale, x, mode) + _bshape(
        bias, x, mode
    )


def bn_backward(dy, x, scale, mean, inv, mode="spatial"):
    """``(dx, dscale, dbias)`` from the saved statistics (shaped like ``scale``)."""
    x, dy = _f(x), _f(dy)
    ax = bn_axes(x.ndim, mode)
    m = x.size // np.size(scale)
    mu, iv, s = _bshape(mean, x, mode), _bshape(inv, x, mode), _bshape(scale, x, mode)
    xh = (x - mu) * iv
    db = dy.sum(axis=ax, keepdims=True)
    ds = (dy * xh).sum(axis=ax, keepdims=True)
    dx = s * iv * (dy - db / m - xh * ds / m)
    return dx, ds.reshape(np.shape(scale)), db.reshape(np.shape(scale))


def _tail(x, k):
    return tuple(range(x.ndim - k, x.ndim))


def ln_forward(x, scale, bias=None, eps=1e-5, k=None):
    """Layer norm over the trailing ``k`` dims (default ``scale.ndim``): ``(y, mean, inv_std)``, the statistics
    shaped ``x.shape[:-k] + (1,) * k``."""
    x, scale = _f(x), _f(scale)
    k = scale.ndim if k is None else k
    ax = _tail(x, k)
    mean = x.mean(axis=ax, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(axis=ax, keepdims=True) + eps)
    y = (x - mean) * inv * scale + (0.0 if bias is None else _f(bias))
    return y, mean, inv


def ln_backward(dy, x, scale, mean, inv, k=None):
    """``(dx, dscale, dbias)`` of layer norm from its saved statistics."""
    x, dy, scale = _f(x), _f(dy), _f(scale)
    k = scale.ndim if k is None else k
    ax = _tail(x, k)
    lead = tuple(range(x.ndim - k))
    xh = (x - mean) * inv
    g = dy * scale
    dx = inv * (g - g.mean(axis=ax, keepdims=True) - xh * (g * xh).mean(axis=ax, keepdims=True))
    return dx, (dy * xh).sum(axis=lead), dy.sum(axis=lead)


def rms_forward(x, scale, eps=1e-5, k=None):
    """RMS norm: ``(y, inv_std)``, ``inv_std = 1 / sqrt(mean(x**2) + eps)`` over the trailing ``k`` dims."""
    x, scale = _f(x), _f(scale)
    k = scale.ndim if k is None else k
    inv = 1.0 / np.sqrt((x * x).mean(axis=_tail(x, k), keepdims=True) + eps)
    return x * inv * scale, inv


def rms_backward(dy, x, scale, inv, k=None):
    """``(dx, dscale)`` of RMS norm from its saved ``inv_std``."""
    x, dy, scale = _f(x), _f(dy), _f(scale)
    k = scale.ndim if k is None else k
    ax = _tail(x, k)
    xh = x * inv
    g = dy * scale
    dx = inv * (g - xh * (g * xh).mean(axis=ax, keepdims=True))
    return dx, (dy * xh).sum(axis=tuple(range(x.ndim - k)))


def in_forward(x, scale, bias=None, eps=1e-5):
    """Instance norm of ``(N, C, *sp)``: ``(y, mean, inv_std)``, the statistics ``(N, C)``."""
    x = _f(x)
    ax = tuple(range(2, x.ndim))
    mean = x.mean(axis=ax, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(axis=ax, keepdims=True) + eps)
    b = 0.0 if bias is None else _bshape(bias, x, "spatial")
    y = (x - mean) * inv * _bshape(scale, x, "spatial") + b
    return y, mean.reshape(x.shape[:2]), inv.reshape(x.shape[:2])


def in_backward(dy, x, scale, mean, inv):
    """``(dx, dscale, dbias)`` of instance norm from its saved ``(N, C)`` statistics."""
    x, dy = _f(x), _f(dy)
    ax = tuple(range(2, x.ndim))
    sp = (1,) * (x.ndim - 2)
    mu, iv = _f(mean).reshape(x.shape[:2] + sp), _f(inv).reshape(x.shape[:2] + sp)
    s = _bshape(scale, x, "spatial")
    xh = (x - mu) * iv
    g = dy * s
    dx = iv * (g - g.mean(axis=ax, keepdims=True) - xh * (g * xh).mean(axis=ax, keepdims=True))
    return dx, (dy * xh).sum(axis=(0, *ax)), dy.sum(axis=(0, *ax))
