"""Float64 NumPy references for N-d convolution: forward, backward data, backward filter, backward bias.

Written from the definition (a sum over kernel offsets of strided, dilated slices of the padded input, per
group), independent of cuDNN; ``tests/test_convolution_cpu.py`` holds them to torch on the CPU, and the GPU
tests and the fuzzer hold cuDNN to them.
"""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["conv_forward", "conv_backward_data", "conv_backward_filter", "conv_backward_bias", "out_sizes"]


def out_sizes(in_sizes, kernel, stride, pad, dilation) -> tuple[int, ...]:
    return tuple(
        (i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(in_sizes, kernel, stride, pad, dilation)
    )


def _windows(kernel, stride, dilation, out):
    """Per kernel offset: the slices of the padded input it reads for every output position."""
    for idx in itertools.product(*(range(k) for k in kernel)):
        yield idx, tuple(slice(i * d, i * d + s * (o - 1) + 1, s) for i, d, s, o in zip(idx, dilation, stride, out))


def _oriented(w: np.ndarray, mode: str) -> np.ndarray:
    """The kernel as cross-correlation reads it: flipped in every spatial dim for ``mode="convolution"``."""
    if mode == "convolution":
        return w[(slice(None), slice(None), *(slice(None, None, -1) for _ in range(w.ndim - 2)))]
    return w


def conv_forward(x, w, *, stride, pad, dilation, groups=1, mode="cross_correlation") -> np.ndarray:
    """``y[n, k, o] = sum_{c in k's group, r} x_padded[n, c, o * stride + r * dilation] * w[k, c, r]``."""
    x, w = np.asarray(x, np.float64), _oriented(np.asarray(w, np.float64), mode)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    kg = k // groups
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    out = out_sizes(x.shape[2:], w.shape[2:], stride, pad, dilation)
    y = np.zeros((n, k, *out))
    for idx, sl in _windows(w.shape[2:], stride, dilation, out):
        xs = xp[(slice(None), slice(None), *sl)]
        for g in range(groups):
            y[:, g * kg : (g + 1) * kg] += np.einsum(
                "nc...,kc->nk...", xs[:, g * cg : (g + 1) * cg], w[(slice(g * kg, (g + 1) * kg), slice(None), *idx)]
            )
    return y


def conv_backward_data(dy, w, x_shape, *, stride, pad, dilation, groups=1, mode="cross_correlation") -> np.ndarray:
    """The adjoint of :func:`conv_forward` in ``x``: each output position's gradient scattered back."""
    dy, w = np.asarray(dy, np.float64), _oriented(np.asarray(w, np.float64), mode)
    k, cg = w.shape[:2]
    kg = k // groups
    dxp = np.zeros((x_shape[0], x_shape[1], *(i + 2 * p for i, p in zip(x_shape[2:], pad))))
    for idx, sl in _windows(w.shape[2:], stride, dilation, dy.shape[2:]):
        for g in range(groups):
            dxp[(slice(None), slice(g * cg, (g + 1) * cg), *sl)] += np.einsum(
                "nk...,kc->nc...", dy[:, g * kg : (g + 1) * kg], w[(slice(g * kg, (g + 1) * kg), slice(None), *idx)]
            )
    return dxp[(slice(None), slice(None), *(slice(p, p + i) for p, i in zip(pad, x_shape[2:])))]


def conv_backward_filter(x, dy, w_shape, *, stride, pad, dilation, groups=1, mode="cross_correlation") -> np.ndarray:
    """The adjoint of :func:`conv_forward` in ``w``."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    k, cg = w_shape[:2]
    kg = k // groups
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])
    dw = np.zeros(w_shape)
    for idx, sl in _windows(w_shape[2:], stride, dilation, dy.shape[2:]):
        xs = xp[(slice(None), slice(None), *sl)]
        n = x.shape[0]
        for g in range(groups):
            dw[(slice(g * kg, (g + 1) * kg), slice(None), *idx)] = np.einsum(
                "nkp,ncp->kc",
                dy[:, g * kg : (g + 1) * kg].reshape(n, kg, -1),
                xs[:, g * cg : (g + 1) * cg].reshape(n, cg, -1),
            )
    return _oriented(dw, mode)


def conv_backward_bias(dy) -> np.ndarray:
    dy = np.asarray(dy, np.float64)
    return dy.sum(axis=(0, *range(2, dy.ndim)))
