"""cudnnkit.jax on the GPU: registry ops through XLA's FFI under jit and grad, against JAX's own (float32, TF32
off on both sides) and NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover
    pytest.skip("no JAX GPU device", allow_module_level=True)

import cudnnkit  # noqa: E402
import cudnnkit.jax as cj  # noqa: E402


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_softmax_forward_and_grad_under_jit():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 33)), jnp.float32)
    ct = jnp.asarray(rng.standard_normal((8, 33)), jnp.float32)
    y = jax.jit(lambda a: cj.ops.softmax(a, axis=-1))(x)
    assert _rel(y, jax.nn.softmax(x, axis=-1)) < 1e-6
    g = jax.jit(jax.grad(lambda a: (cj.ops.softmax(a, axis=-1) * ct).sum()))(x)
    want = jax.grad(lambda a: (jax.nn.softmax(a, axis=-1) * ct).sum())(x)
    assert _rel(g, want) < 1e-5


def test_convolution_forward_and_grads_under_jit():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 4, 9, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((6, 4, 3, 3)) * 0.2, jnp.float32)
    b = jnp.asarray(rng.standard_normal((6,)), jnp.float32)

    def ref(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                         precision=jax.lax.Precision.HIGHEST)  # fmt: skip
        return y + b[None, :, None, None]

    with cudnnkit.settings(allow_tf32=False):
        y = jax.jit(lambda *a: cj.ops.convolution(*a, padding=1))(x, w, b)
        assert _rel(y, ref(x, w, b)) < 1e-5
        loss = lambda f: lambda *a: (f(*a) ** 2).sum()  # noqa: E731
        gs = jax.jit(jax.grad(loss(lambda *a: cj.ops.convolution(*a, padding=1)), argnums=(0, 1, 2)))(x, w, b)
    want = jax.grad(loss(ref), argnums=(0, 1, 2))(x, w, b)
    for got, exp in zip(gs, want):
        assert _rel(got, exp) < 1e-4


def test_batch_norm_returns_its_running_statistics_as_new_state():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 3, 5, 5)), jnp.float32)
    s, b = jnp.ones((3,), jnp.float32), jnp.zeros((3,), jnp.float32)
    rm, rv = jnp.zeros((3,), jnp.float32), jnp.ones((3,), jnp.float32)
    y, new_m, new_v = jax.jit(lambda *a: cj.ops.batch_norm(a[0], a[1], a[2], None, running_mean=a[3],
                                                            running_var=a[4], training=True, momentum=0.1))(
        x, s, b, rm, rv
    )  # fmt: skip
    xn = np.asarray(x, np.float64)
    mean, var = xn.mean(axis=(0, 2, 3)), xn.var(axis=(0, 2, 3))
    assert _rel(new_m, 0.1 * mean) < 1e-5 and float(rm.sum()) == 0.0
    unbiased = var * xn[:, 0].size / (xn[:, 0].size - 1)
    assert _rel(new_v, 0.9 + 0.1 * unbiased) < 1e-5
    want = (xn - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    assert _rel(y, want) < 1e-5
