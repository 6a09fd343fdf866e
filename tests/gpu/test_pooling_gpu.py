"""Pooling (``cudnnPoolingForward``/``Backward``, legacy; the graph's resample for per-side padding, ceil_mode and
the argmax index) against the float64 references of ``tests/pool_reference.py`` (held to torch on the CPU): every
mode, 1-d to 3-d, NCHW and channels-last, dtypes, exclude-padding with padding > 0 (where it differs from
include-padding), NaN propagation, blends, both paths agreeing."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops, settings

from .. import pool_reference as ref
from ..numerics import dev, finite_difference, host, poisoned, rel

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}
MODES = ["max", "max_deterministic", "avg_include_padding", "avg_exclude_padding"]


def _distinct(rng, shape):
    """Distinct values exact in every float type (no ties for max pooling's gradient)."""
    return rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float64) % 256 / 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nsp, window, stride, pad", [(1, (3,), (2,), (1,)), (2, (3, 3), (2, 2), (1, 1)),
                                                      (2, (2, 3), (1, 2), (0, 1)), (3, (3, 2, 2), (2, 1, 2), (1, 0, 1))])  # fmt: skip
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_forward_and_backward_match_the_reference(xp, mode, nsp, window, stride, pad, dtype, layout):
    rng = np.random.default_rng(nsp)
    shape = (2, 3, *([9, 8, 7][:nsp]))
    x = _distinct(rng, shape)
    xd = dev(xp, x, dtype, layout)
    kw = dict(mode=mode, window=window, stride=stride, padding=pad)
    y = ops.pooling_forward(xd, **kw)
    want = ref.pool_forward(x, mode, window, stride, pad)
    assert y.shape == want.shape and rel(host(xp, y), want) < TOL[dtype]
    dy = np.round(rng.standard_normal(want.shape) * 8) / 8
    dx = ops.pooling_backward(dev(xp, dy, dtype, layout), y, xd, **kw)
    assert (
        dx.shape == x.shape and rel(host(xp, dx), ref.pool_backward(x, dy, mode, window, stride, pad)) < TOL[dtype] * 4
    )


def test_exclude_padding_differs_from_include_padding(xp):
    x = np.ones((1, 1, 4, 4))
    inc = host(xp, ops.pooling_forward(dev(xp, x), mode="avg_include_padding", window=3, stride=1, padding=1))
    exc = host(xp, ops.pooling_forward(dev(xp, x), mode="avg_exclude_padding", window=3, stride=1, padding=1))
    assert exc[0, 0, 0, 0] == 1.0 and inc[0, 0, 0, 0] == pytest.approx(4 / 9)  # a corner: 4 cells inside of 9


def test_nan_propagation(xp):
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = np.nan
    kept = host(xp, ops.pooling_forward(dev(xp, x), window=2, propagate_nan=True))
    dropped = host(xp, ops.pooling_forward(dev(xp, x), window=2, propagate_nan=False))
    assert np.isnan(kept[0, 0, 0, 0]) and dropped[0, 0, 0, 0] == 5.0


def test_blend_into_poisoned_and_given_outputs(xp):
    rng = np.random.default_rng(7)
    x = _distinct(rng, (2, 3, 8, 8))
    want = ref.pool_forward(x, "max", (2, 2), (2, 2), (0, 0))
    out = poisoned(xp, want.shape, "float32")
    assert ops.pooling_forward(dev(xp, x, "float32"), window=2, out=out) is out
    assert rel(host(xp, out), want) < 1e-6
    prev = rng.standard_normal(want.shape)
    out2 = dev(xp, prev, "float32")
    ops.pooling_forward(dev(xp, x, "float32"), window=2, out=out2, alpha=2.0, beta=-1.0)
    assert rel(host(xp, out2), 2 * want - prev) < 1e-6


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_graph_path_per_side_padding_ceil_mode_and_index(xp, mode, dtype, layout):
    """Asymmetric padding and ceil_mode run on the graph (resample); max pooling returns its index, which the
    backward takes; the result is the reference on the input padded so."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(11)
    x = _distinct(rng, (2, 3, 9, 8))
    xd = dev(xp, x, dtype, layout)
    from cudnnkit.runtime.shapes import pool_padding

    pre, post = pool_padding((9, 8), (3, 3), stride=(2, 2), padding=0, ceil_mode=True)
    assert post != pre  # ceil_mode pads after here
    for kw, pad in ((dict(window=3, stride=2, padding=((0, 2), (1, 1))), ((0, 2), (1, 1))),
                    (dict(window=3, stride=2, ceil_mode=True), tuple(zip(pre, post)))):  # fmt: skip
        if mode == "avg_include_padding" and "ceil_mode" in kw:
            continue  # cuDNN counts the padding ceil_mode adds; torch clips it (documented difference)
        ismax = mode.startswith("max")  # bfloat16 averaging runs on float32 copies (cuDNN's bf16 engines are wrong)
        got = ops.pooling_forward(xd, mode=mode, return_index=ismax, **kw)
        assert ops.last_path() == ("pooling_forward", "graph")
        y, index = got if ismax else (got, None)
        want = ref.pool_forward(x, mode, (3, 3), (2, 2), pad)
        assert y.shape == want.shape and rel(host(xp, y), want) < TOL[dtype]
        dy = np.round(rng.standard_normal(want.shape) * 8) / 8
        dx = ops.pooling_backward(dev(xp, dy, dtype, layout), y, xd, mode=mode, index=index, **kw)
        assert ops.last_path() == ("pooling_backward", "graph")
        want_dx = ref.pool_backward(x, dy, mode, (3, 3), (2, 2), pad)
        assert rel(host(xp, dx), want_dx) < TOL[dtype] * 4


@pytest.mark.parametrize("mode", ["avg_include_padding", "avg_exclude_padding"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_bfloat16_averaging_on_the_graph_blends_into_out(xp, mode, layout):
    """bfloat16 averaging that only the graph takes (asymmetric padding) runs on float32 copies; the call's blend
    ``out = alpha * result + beta * out`` lands in the caller's bfloat16 out, forward and backward, twice (the
    second call an express hit)."""
    if xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(13)
    x = _distinct(rng, (2, 3, 9, 8))
    pad = ((0, 2), (1, 1))
    kw = dict(mode=mode, window=3, stride=2, padding=pad)
    want = ref.pool_forward(x, mode, (3, 3), (2, 2), pad)
    prior = np.round(rng.standard_normal(want.shape) * 4) / 4
    dy = np.round(rng.standard_normal(want.shape) * 8) / 8
    want_dx = ref.pool_backward(x, dy, mode, (3, 3), (2, 2), pad)
    prior_dx = np.round(rng.standard_normal(want_dx.shape) * 4) / 4
    xd = dev(xp, x, "bfloat16", layout)
    for _ in range(2):
        out = dev(xp, prior, "bfloat16", layout)
        y = ops.pooling_forward(xd, out=out, alpha=0.5, beta=0.25, **kw)
        assert y is out and ops.last_path() == ("pooling_forward", "graph")
        assert rel(host(xp, out), 0.5 * want + 0.25 * prior) < TOL["bfloat16"]
        dx = dev(xp, prior_dx, "bfloat16", layout)
        # (average pooling's backward reads no y: the blended out stands in for it)
        got = ops.pooling_backward(dev(xp, dy, "bfloat16", layout), y, xd, out=dx, alpha=0.5, beta=0.25, **kw)
        assert got is dx and ops.last_path() == ("pooling_backward", "graph")
        assert rel(host(xp, dx), 0.5 * want_dx + 0.25 * prior_dx) < TOL["bfloat16"] * 4


@pytest.mark.parametrize("mode", MODES)
def test_both_paths_agree(xp, mode):
    rng = np.random.default_rng(12)
    x = _distinct(rng, (2, 4, 10, 9))
    xd = dev(xp, x, "float32", "nhwc")
    kw = dict(mode=mode, window=3, stride=2, padding=1)
    a = host(xp, ops.pooling_forward(xd, **kw))
    assert ops.last_path() == ("pooling_forward", "legacy")  # measured faster where both run
    with settings(prefer="graph"):
        b = host(xp, ops.pooling_forward(xd, **kw))
        assert ops.last_path() == ("pooling_forward", "graph")
    assert rel(a, b) < 1e-6


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_gradients_by_finite_differences_float64(xp, mode, nsp):
    """float64 (legacy): pooling_backward's dx against central differences of pooling_forward (loss = sum(w * y)),
    x of distinct values spaced far wider than the step, so each max window keeps its winner."""
    rng = np.random.default_rng(20 + nsp)
    shape = (1, 2, *([5, 4, 3][:nsp]))
    x = rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float64) * 0.1
    kw = dict(mode=mode, window=(3, 2, 2)[:nsp], stride=(2, 1, 1)[:nsp], padding=(1, 1, 0)[:nsp])
    w = rng.standard_normal(ref.pool_forward(x, mode, kw["window"], kw["stride"], kw["padding"]).shape)

    def loss(a):
        return float((host(xp, ops.pooling_forward(dev(xp, a), **kw)) * w).sum())

    y = ops.pooling_forward(dev(xp, x), **kw)
    dx = ops.pooling_backward(dev(xp, w), y, dev(xp, x), **kw)
    assert ops.last_path() == ("pooling_backward", "legacy")
    assert rel(host(xp, dx), finite_difference(loss, x)) < 1e-6


@pytest.mark.parametrize("mode", ["max", "avg_exclude_padding"])
def test_backward_with_dy_in_another_layout_than_y(xp, mode):
    """dy channels-first while x and y are channels-last (what autograd may hand the backward): dy is copied into
    y's layout and described with y's strides (the module tests' exclude-padding case: 2x4x9x9, 3x3/2, padding 1)."""
    rng = np.random.default_rng(3)
    x = _distinct(rng, (2, 4, 9, 9))
    kw = dict(mode=mode, window=3, stride=2, padding=1)
    xd = dev(xp, x, "float32", "nhwc")
    y = ops.pooling_forward(xd, **kw)
    dy = np.round(rng.standard_normal(y.shape) * 8) / 8
    dx = ops.pooling_backward(dev(xp, dy, "float32", "nchw"), y, xd, **kw)
    assert rel(host(xp, dx), ref.pool_backward(x, dy, mode, (3, 3), (2, 2), (1, 1))) < 1e-5


@pytest.mark.parametrize("mode", ["avg_include_padding", "avg_exclude_padding"])
@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_global_average_pooling_backward_broadcasts(xp, mode, nsp, dtype, layout, monkeypatch):
    """A window covering each whole unpadded extent (global average pooling): the backward is a broadcast of
    alpha * dy / cells (cudnnAddTensor), never cudnnPoolingBackward, blended into a poisoned or given out, against
    the float64 reference."""
    from cudnnkit.ops import pooling as pl

    def not_this(*a):
        raise AssertionError("cudnnPoolingBackward ran for a global average pool")

    monkeypatch.setattr(pl.lib, "cudnnPoolingBackward", not_this)
    rng = np.random.default_rng(7 + nsp)
    spatial = (6, 5, 4)[:nsp]
    x = rng.standard_normal((3, 4, *spatial))
    xd = dev(xp, x, dtype, layout)
    kw = dict(mode=mode, window=spatial, stride=1, padding=0)
    y = ops.pooling_forward(xd, **kw)
    assert rel(host(xp, y), ref.pool_forward(x, mode, spatial, (1,) * nsp, (0,) * nsp)) < TOL[dtype]
    dy = np.round(rng.standard_normal(y.shape) * 8) / 8
    want = ref.pool_backward(x, dy, mode, spatial, (1,) * nsp, (0,) * nsp)
    dx = ops.pooling_backward(dev(xp, dy, dtype, layout), y, xd, out=dev(xp, np.full(x.shape, np.nan), dtype, layout),
                              **kw)  # fmt: skip
    assert rel(host(xp, dx), want) < TOL[dtype] * 4
    base = rng.standard_normal(x.shape)
    out = dev(xp, base, dtype, layout)
    got = ops.pooling_backward(dev(xp, dy, dtype, layout), y, xd, out=out, alpha=2.0, beta=0.5, **kw)
    assert got is out and rel(host(xp, out), 2.0 * want + 0.5 * base) < TOL[dtype] * 4
