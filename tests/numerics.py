"""Shared numeric helpers for the tests: dtypes, host/device copies, relative error, finite differences.

No GPU is touched at import; functions that take ``xp`` (an array-library
adapter from the ``xp`` fixture) copy through it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype for a cudnnkit dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def seen(a, dtype: str) -> np.ndarray:
    """The values the GPU holds for ``a`` stored as ``dtype``, back in float64."""
    return np.asarray(a).astype(np_dtype(dtype)).astype(np.float64)


def host(xp, arr) -> np.ndarray:
    """A device array copied to the host as float64."""
    return xp.to_numpy(arr).astype(np.float64)


def permute(xp, arr, axes):
    return arr.permute(*axes) if xp.name == "torch" else arr.transpose(axes)


def dev(xp, a, dtype: str = "float64", layout: str = "nchw"):
    """``a`` on device 0 as ``dtype``; ``layout="nhwc"`` gives the same logical shape with channels-last memory."""
    a = np.asarray(a)
    if layout == "nhwc":
        arr = xp.from_numpy(np.ascontiguousarray(np.moveaxis(a, 1, -1)).astype(np_dtype(dtype)), 0)
        return permute(xp, arr, (0, a.ndim - 1, *range(1, a.ndim - 1)))
    return xp.from_numpy(np.ascontiguousarray(a).astype(np_dtype(dtype)), 0)


def poisoned(xp, shape, dtype: str):
    """A device array of NaN, so an element the op fails to write shows."""
    return xp.from_numpy(np.full(shape, np.nan, dtype=np_dtype(dtype)), 0)


def rel(got, ref) -> float:
    """‖got − ref‖ / ‖ref‖; fails on any non-finite value in ``got`` (NaN never passes)."""
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), "non-finite output"
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def finite_difference(f: Callable[[np.ndarray], float], a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``f`` at ``a``, element by element."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        p, m = a.copy(), a.copy()
        p[i] += eps
        m[i] -= eps
        g[i] = (f(p) - f(m)) / (2 * eps)
    return g
