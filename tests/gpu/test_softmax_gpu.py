"""Softmax / log-softmax forward and backward against an independent float64 NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.ops import softmax_backward, softmax_forward

from ..numerics import dev, finite_difference, host, np_dtype, rel

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 3e-3, "bfloat16": 1.5e-2}


def ref_softmax(x, axes, log):
    m = x.max(axis=axes, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=axes, keepdims=True)
    return (x - m - np.log(s)) if log else e / s


def ref_backward(y, dy, axes, log):
    if log:
        return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
    return y * (dy - (dy * y).sum(axis=axes, keepdims=True))


def axes_tuple(axis, ndim):
    a = (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(i % ndim for i in a))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("axis", [1, -1, (2, 3), (1, 2, 3)])
@pytest.mark.parametrize("log", [False, True])
def test_forward_and_backward_match_float64_reference(xp, dtype, layout, axis, log):
    rng = np.random.default_rng()
    shape = (3, 5, 6, 7)
    a = rng.standard_normal(shape) * 2
    g = rng.standard_normal(shape)
    axes = axes_tuple(axis, 4)
    x = dev(xp, a, dtype, layout)
    xa = a.astype(np_dtype(dtype)).astype(np.float64)  # the values the GPU actually sees
    y = softmax_forward(x, axis=axis, log=log)
    y_ref = ref_softmax(xa, axes, log)
    assert rel(host(xp, y), y_ref) < TOL[dtype]
    # backward from the reference y (so it is tested independently of the forward)
    yin = dev(xp, y_ref, dtype, layout)
    dy = dev(xp, g, dtype, layout)
    dx = softmax_backward(dy, yin, axis=axis, log=log)
    ya = y_ref.astype(np_dtype(dtype)).astype(np.float64)
    ga = g.astype(np_dtype(dtype)).astype(np.float64)
    assert rel(host(xp, dx), ref_backward(ya, ga, axes, log)) < TOL[dtype] * (
        4 if dtype in ("float16", "bfloat16") else 10
    )


@pytest.mark.parametrize("log", [False, True])
def test_out_is_fully_written_and_alpha_beta_blend(xp, log):
    rng = np.random.default_rng()
    a = rng.standard_normal((4, 9, 3, 2))
    x = xp.from_numpy(a, 0)
    out = xp.from_numpy(np.full(a.shape, np.nan), 0)
    got = softmax_forward(x, axis=1, log=log, out=out)
    assert got is out
    ref = ref_softmax(a, (1,), log)
    assert rel(host(xp, out), ref) < 1e-12
    old = rng.standard_normal(a.shape)
    out2 = xp.from_numpy(old, 0)
    softmax_forward(x, axis=1, log=log, out=out2, alpha=2.0, beta=0.5)
    assert rel(host(xp, out2), 2 * ref + 0.5 * old) < 1e-12


def test_accurate_and_fast_agree_on_moderate_inputs(xp):
    a = np.random.default_rng().standard_normal((8, 100))
    x = xp.from_numpy(a, 0)
    ref = ref_softmax(a, (1,), False)
    for algo in ("accurate", "fast"):
        assert rel(host(xp, softmax_forward(x, algo=algo)), ref) < 1e-12
    big = xp.from_numpy(a * 300, 0)  # exp overflows without max subtraction
    assert rel(host(xp, softmax_forward(big, algo="accurate")), ref_softmax(a * 300, (1,), False)) < 1e-12


def test_strides_that_cannot_merge_are_copied(xp):
    rng = np.random.default_rng()
    base = rng.standard_normal((2, 3, 8, 5))
    full = xp.from_numpy(base, 0)
    x = full[:, :, ::2, :]  # reduce over (H, W): H has a gap, so it cannot be merged with W
    y = softmax_forward(x, axis=(2, 3))
    assert rel(host(xp, y), ref_softmax(base[:, :, ::2, :], (2, 3), False)) < 1e-12


def test_1d_2d_and_5d_arrays(xp):
    rng = np.random.default_rng()
    for shape, axis in (((37,), 0), ((6, 11), 0), ((2, 3, 4, 5, 6), 2), ((2, 3, 4, 5, 6), (1, 2))):
        a = rng.standard_normal(shape)
        y = softmax_forward(xp.from_numpy(a, 0), axis=axis)
        assert rel(host(xp, y), ref_softmax(a, axes_tuple(axis, len(shape)), False)) < 1e-12


def test_empty_array_returns_empty(xp):
    x = xp.from_numpy(np.zeros((0, 5), np.float32), 0)
    y = softmax_forward(x)
    assert tuple(y.shape) == (0, 5)


@pytest.mark.parametrize("log", [False, True])
def test_gradient_by_finite_differences_float64(xp, log):
    rng = np.random.default_rng()
    a = rng.standard_normal((2, 4, 3))
    w = rng.standard_normal(a.shape)
    x = xp.from_numpy(a, 0)

    def loss(arr):
        return float((host(xp, softmax_forward(xp.from_numpy(arr, 0), axis=1, log=log)) * w).sum())

    y = softmax_forward(x, axis=1, log=log)
    dx = host(xp, softmax_backward(xp.from_numpy(w, 0), y, axis=1, log=log))
    assert rel(dx, finite_difference(loss, a)) < 1e-7
