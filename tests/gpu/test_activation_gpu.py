"""Activations (``cudnnActivationForward``/``Backward``, legacy) against the float64 references of
``tests/act_reference.py`` (held to torch on the CPU): every legacy mode, dtypes, layouts, blends, NaN. The
graph-only modes run fused after a convolution (tests/gpu/test_convolution_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops

from .. import act_reference as ref
from ..numerics import dev, host, permute, poisoned, rel, seen

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}
MODES = [("sigmoid", None), ("relu", None), ("tanh", None), ("clipped_relu", 1.5), ("elu", 0.7), ("elu", None),
         ("swish", 1.3), ("swish", None)]  # fmt: skip


@pytest.mark.parametrize("mode, coef", MODES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_forward_and_backward_match_the_reference(xp, mode, coef, dtype):
    _check_mode(xp, mode, coef, dtype)
    assert ops.last_path() == ("activation_backward", "legacy")


def _check_mode(xp, mode, coef, dtype):
    rng = np.random.default_rng(0)
    x = seen(rng.standard_normal((4, 3, 5, 6)) * 2, dtype)
    x[np.abs(x) < 1e-2] = 0.25
    if coef is not None:
        x[np.abs(x - coef) < 1e-2] = coef + 0.25
    xd = dev(xp, x, dtype)
    y = ops.activation_forward(xd, mode, coef=coef)
    assert rel(host(xp, y), ref.act_forward(x, mode, coef)) < TOL[dtype] * (4 if dtype != "float64" else 1)
    dy = seen(rng.standard_normal(x.shape), dtype)
    dx = ops.activation_backward(dev(xp, dy, dtype), y, xd, mode, coef=coef)
    assert rel(host(xp, dx), ref.act_backward(x, dy, mode, coef)) < TOL[dtype] * 8


def test_layouts_blend_and_poison(xp):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5))
    xd = permute(xp, dev(xp, np.ascontiguousarray(x.transpose(0, 2, 3, 1))), (0, 3, 1, 2))  # channels-last
    out = poisoned(xp, x.shape, "float64")
    assert ops.activation_forward(xd, "tanh", out=out) is out
    assert rel(host(xp, out), np.tanh(x)) < 1e-12
    prev = rng.standard_normal(x.shape)
    out2 = dev(xp, prev)
    ops.activation_forward(xd, "relu", out=out2, alpha=2.0, beta=-0.5)
    assert rel(host(xp, out2), 2 * np.maximum(x, 0) - 0.5 * prev) < 1e-12


def test_nan_propagation(xp):
    x = np.array([[np.nan, -1.0, 2.0]])
    kept = host(xp, ops.activation_forward(dev(xp, x), "relu", propagate_nan=True))
    assert np.isnan(kept[0, 0]) and kept[0, 2] == 2.0
