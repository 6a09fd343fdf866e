"""Small float64 NumPy references shared by the examples (host-side, independent of cuDNN)."""

from __future__ import annotations

import numpy as np


def conv2d(x: np.ndarray, w: np.ndarray, padding: int = 0) -> np.ndarray:
    """Cross-correlation of ``x`` (N, C, H, W) with ``w`` (K, C, R, S), stride 1, zero padding, in float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    r, s = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(2, 3))  # (N, C, H', W', R, S)
    return np.einsum("nchwrs,kcrs->nkhw", win, w.astype(np.float64))


def max_pool2d(x: np.ndarray, k: int) -> np.ndarray:
    """Non-overlapping ``k`` x ``k`` max pooling of (N, C, H, W) (H and W divisible by ``k``)."""
    n, c, h, w = x.shape
    return x.reshape(n, c, h // k, k, w // k, k).max(axis=(3, 5))


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    """||a - ref|| / ||ref||, in float64."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-300))
