"""Float64 NumPy references for N-d pooling (max, average including or excluding padding), forward and backward.

From the definition (each window over the padded input), independent of cuDNN; ``tests/test_pooling_cpu.py``
holds them to torch on the CPU. Max pooling's gradient goes to the window's first maximum in scan order (the
tests use inputs without ties)."""

from __future__ import annotations

import itertools

import numpy as np

__all__ = ["pool_forward", "pool_backward"]


def _split(pad):
    """``pad``: one int per dim (both sides) or ``(before, after)`` pairs -> (pre, post)."""
    pre = tuple(p[0] if isinstance(p, (tuple, list)) else p for p in pad)
    post = tuple(p[1] if isinstance(p, (tuple, list)) else p for p in pad)
    return pre, post


def _out(in_sizes, window, stride, pad):
    pre, post = _split(pad)
    return tuple((i + a + b - w) // s + 1 for i, w, s, a, b in zip(in_sizes, window, stride, pre, post))


def _windows(in_sizes, window, stride, pad):
    out = _out(in_sizes, window, stride, pad)
    pre, _ = _split(pad)
    for o in itertools.product(*(range(n) for n in out)):
        lo = [oi * s - p for oi, s, p in zip(o, stride, pre)]
        hi = [min(a + w, i) for a, w, i in zip(lo, window, in_sizes)]
        yield o, tuple(slice(max(a, 0), b) for a, b in zip(lo, hi))


def pool_forward(x, mode, window, stride, pad) -> np.ndarray:
    """``mode``: "max" (also "max_deterministic"), "avg_include_padding" (divide by the window size, padded
    cells counting as zeros) or "avg_exclude_padding" (divide by the cells inside the input). ``pad``: one int
    per spatial dim, or ``(before, after)`` pairs (the windows over the input padded so)."""
    x = np.asarray(x, np.float64)
    out = _out(x.shape[2:], window, stride, pad)
    y = np.zeros((*x.shape[:2], *out))
    for o, sl in _windows(x.shape[2:], window, stride, pad):
        cell = x[(slice(None), slice(None), *sl)]
        cell = cell.reshape(*x.shape[:2], int(np.prod(cell.shape[2:])))
        if mode.startswith("max"):
            y[(slice(None), slice(None), *o)] = cell.max(-1)
        else:
            div = np.prod(window) if mode == "avg_include_padding" else cell.shape[-1]
            y[(slice(None), slice(None), *o)] = cell.sum(-1) / div
    return y


def pool_backward(x, dy, mode, window, stride, pad) -> np.ndarray:
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    dx = np.zeros_like(x)
    n, c = x.shape[:2]
    for o, sl in _windows(x.shape[2:], window, stride, pad):
        g = dy[(slice(None), slice(None), *o)]
        region = (slice(None), slice(None), *sl)
        cell = x[region]
        if mode.startswith("max"):
            flat = cell.reshape(n, c, int(np.prod(cell.shape[2:])))
            idx = flat.argmax(-1)
            hit = np.zeros_like(flat)
            np.put_along_axis(hit, idx[..., None], 1.0, -1)
            dx[region] += hit.reshape(cell.shape) * g[(..., *([None] * len(sl)))]
        else:
            div = np.prod(window) if mode == "avg_include_padding" else int(np.prod(cell.shape[2:]))
            dx[region] += g[(..., *([None] * len(sl)))] / div
    return dx
