"""Layout-preserving JAX calls (``cudnnkit.jax._ops.Permuted``), on JAX's CPU platform through the FFI with a NumPy
stand-in: a channels-last ``(N, H, W, C)`` array passed as ``Permuted(x, (0, 3, 1, 2))`` reaches the declaration as
an ``(N, C, H, W)`` view with channels-last strides (no transpose in XLA), the output is written in that layout
(its buffer is its dims in memory order) and comes back as the logical array; the cotangent reaches the backward
in the output's layout, the gradient is written into the physical input's layout; ``jax.vmap`` folds a channels-last
operand (its sample axis is outermost) and refuses one whose sample axis is not."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit.jax import _ops  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402

from .test_jax_ops_cpu import NumpyRunner, on_the_cpu  # noqa: E402,F401  (the autouse fixture: arrays on JAX's CPU)

SEEN: list[tuple] = []  # (where, shape, element strides) of the arrays the stand-in got


def _strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def _fwd(x, w):
    SEEN.append(("x", x.shape, _strides(x)))
    y = x * w[None, :, None, None]
    return (y,), {"x": x, "w": w, "out": y}


def _bwd(res, douts, needs):
    (dy,) = douts
    SEEN.append(("dy", dy.shape, _strides(dy)))
    x, w = res["x"], res["w"]
    SEEN.append(("res x", x.shape, _strides(x)))
    return (dy * w[None, :, None, None] if needs[0] else None,
            (dy * x).sum(axis=(0, 2, 3)) if needs[1] else None)  # fmt: skip


def _meta(x: Spec, w: Spec):
    y = new_like(x)  # in x's layout, as the cuDNN declarations' outputs are
    return (y,), {"x": x, "w": w, "out": y}


OP = Differentiable("chan_scale", "softmax_forward", ("x", "w"), ("out",), _fwd, _bwd, _meta, batch=("x", "out"))
J = _ops.JaxOp(OP, NumpyRunner(), namespace="cudnnkit_layouttest")
NHWC = (0, 3, 1, 2)


def _cl(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal((2, 3, 5, 4))), jnp.asarray(rng.standard_normal(4))


def test_a_permuted_operand_is_seen_in_its_layout_and_the_result_comes_back_logical():
    x, w = _args()  # (N, H, W, C) physical
    SEEN.clear()
    y = jax.jit(lambda a, b: J(_ops.Permuted(a, NHWC), b))(x, w)
    assert SEEN == [("x", (2, 4, 3, 5), _cl((2, 4, 3, 5)))]  # (N, C, H, W) with channels-last strides
    assert y.shape == (2, 4, 3, 5)
    np.testing.assert_allclose(np.asarray(y), np.transpose(np.asarray(x), NHWC) * np.asarray(w)[None, :, None, None])


def test_the_gradient_flows_in_the_physical_layouts():
    x, w = _args(1)
    t = jnp.asarray(np.random.default_rng(9).standard_normal((2, 3, 5, 4)))

    def loss(a, b):
        y = J(_ops.Permuted(a, NHWC), b)
        return (jnp.transpose(y, (0, 2, 3, 1)) * t).sum()  # back to NHWC: XLA cancels the two transposes

    def ref(a, b):
        return (a * b * t).sum()

    SEEN.clear()
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    assert ("dy", (2, 4, 3, 5), _cl((2, 4, 3, 5))) in SEEN  # the cotangent in the output's layout
    assert ("res x", (2, 4, 3, 5), _cl((2, 4, 3, 5))) in SEEN  # the input residual read as its buffer is
    want = jax.grad(ref, argnums=(0, 1))(x, w)
    assert gx.shape == x.shape
    np.testing.assert_allclose(np.asarray(gx), np.asarray(want[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), np.asarray(want[1]), rtol=1e-12)


def test_vmap_folds_a_channels_last_operand():
    rng = np.random.default_rng(2)
    xs = jnp.asarray(rng.standard_normal((3, 2, 3, 5, 4)))  # (B, N, H, W, C)
    w = jnp.asarray(rng.standard_normal(4))
    SEEN.clear()
    ys = jax.jit(jax.vmap(lambda a: J(_ops.Permuted(a, NHWC), w)))(xs)
    assert SEEN == [("x", (6, 4, 3, 5), _cl((6, 4, 3, 5)))]  # one call, the batch folded into N, layout kept
    want = np.transpose(np.asarray(xs), (0, 1, 4, 2, 3)) * np.asarray(w)[None, None, :, None, None]
    np.testing.assert_allclose(np.asarray(ys), want)


def test_vmap_refuses_a_layout_whose_sample_axis_is_not_outermost():
    xs = jnp.ones((3, 4, 2, 3, 5))  # each sample (C, N, H, W) in memory: N is not outermost
    w = jnp.ones(4)
    with pytest.raises(NotImplementedError, match="leading \\(sample\\) axis is not outermost"):
        jax.jit(jax.vmap(lambda a: J(_ops.Permuted(a, (1, 0, 2, 3)), w)))(xs)


def test_a_bad_permutation_is_refused():
    with pytest.raises(ValueError, match="not a permutation"):
        _ops.Permuted(jnp.ones((2, 3)), (0, 0))


@pytest.mark.parametrize("shape", [(2, 3, 5, 1), (2, 1, 1, 4), (1, 3, 5, 4), (2, 3, 1, 4), (1, 1, 1, 1)])
def test_size_one_dims_keep_the_buffers_layout(shape):
    """Size-1 dims share a stride with the dim inside them: a channels-last C = 1 array (a grayscale image, one
    attention head) is still its own buffer's layout, forward and gradient."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal(shape))  # (N, H, W, C)
    w = jnp.asarray(np.arange(1.0, shape[3] + 1))
    SEEN.clear()
    y = jax.jit(lambda a, b: J(_ops.Permuted(a, NHWC), b))(x, w)
    logical = (shape[0], shape[3], shape[1], shape[2])
    assert SEEN[0][1] == logical
    np.testing.assert_allclose(np.asarray(y), np.transpose(np.asarray(x), NHWC) * np.asarray(w)[None, :, None, None])
    gx, gw = jax.jit(jax.grad(lambda a, b: (J(_ops.Permuted(a, NHWC), b) ** 2).sum(), argnums=(0, 1)))(x, w)
    wx = np.asarray(x) * np.asarray(w)
    np.testing.assert_allclose(np.asarray(gx), 2 * wx * np.asarray(w), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gw), (2 * wx * np.asarray(x)).sum(axis=(0, 1, 2)), rtol=1e-12)


def _meta_c_outer(x: Spec, w: Spec):
    """An output laid out with C outermost whatever x's layout: its sample axis is not outermost."""
    n, c, h, wd = x.shape
    y = Spec(x.shape, (h * wd, n * h * wd, wd, 1), x.dtype)
    return (y,), {"x": x, "w": w, "out": y}


OP_C = Differentiable("chan_scale_c_outer", "softmax_forward", ("x", "w"), ("out",), _fwd, _bwd, _meta_c_outer,
                      batch=("x", "out"))  # fmt: skip
J_C = _ops.JaxOp(OP_C, NumpyRunner(), namespace="cudnnkit_layouttest")


@pytest.mark.parametrize("b", [2, 3])
def test_vmap_grad_with_an_output_whose_sample_axis_is_not_outermost(b):
    """The folded call's output and cotangent are laid out from the folded specs (not folded in a per-sample
    layout): vmap(grad) equals the per-sample gradients, for a batch that does and one that does not divide C."""
    rng = np.random.default_rng(6)
    xs = jnp.asarray(rng.standard_normal((b, 2, 4, 3, 5)))  # per sample (N, C, H, W), C order
    w = jnp.asarray(rng.standard_normal(4))
    t = jnp.asarray(rng.standard_normal((2, 4, 3, 5)))

    def loss(a):
        return (J_C(a, w) * t).sum()

    got = jax.jit(jax.vmap(jax.grad(loss)))(xs)
    want = np.broadcast_to(np.asarray(t) * np.asarray(w)[None, :, None, None], xs.shape)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    ys = jax.jit(jax.vmap(lambda a: J_C(a, w)))(xs)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(xs) * np.asarray(w)[None, None, :, None, None])
