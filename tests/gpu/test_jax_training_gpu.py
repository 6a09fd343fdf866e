"""cudnnkit.jax in whole training steps on the GPU (issue 14): a jitted SGD step of a small CNN and of an LSTM,
written with cudnnkit.jax, trains to the same losses as the same model in pure JAX from the same seed; a cudnnkit op
inside ``lax.scan`` and inside ``jax.checkpoint``, under ``jit`` and ``grad``, equals the eager calls; and
``vmap(grad)`` with respect to a convolution's ``x`` with its ``w`` closed over folds.

float32 with TF32 off on both sides: ``cudnnkit.settings(allow_tf32=False)`` (cuDNN's convolutions and the RNN's FMA
math) and ``jax.default_matmul_precision("highest")`` (XLA's dots and convolutions), both in force while the steps
are traced. The models are benchmarks/jax_models.py's, the ones the ``jax`` benchmark rows time.

Tolerances: every step's loss within a relative 1e-4 of the pure-JAX step's, 15 steps (the two differ only by float32
rounding: summation orders in the convolutions, the batch statistics, the LSTM's gate products; SGD carries the
differences forward without amplifying them much over so few steps), and the parameters after the last step within
a relative 1e-3 (norm of the difference over the norm). The scan/checkpoint calls run the same cuDNN calls on the same
shapes as the eager ones: a relative 1e-6.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover
    pytest.skip("no JAX GPU device", allow_module_level=True)

import cudnnkit  # noqa: E402
import cudnnkit.jax as cj  # noqa: E402
from benchmarks import jax_models as m  # noqa: E402

STEPS = 15
LOSS_RTOL = 1e-4
PARAM_RTOL = 1e-3
EAGER_RTOL = 1e-6


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@contextlib.contextmanager
def _fp32_exact():
    """TF32 off on both sides while the steps are traced (jit traces on the first call, inside this block)."""
    with cudnnkit.settings(allow_tf32=False), jax.default_matmul_precision("highest"):
        yield


def _tree_rel(a, b):
    return max(_rel(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_cnn_trains_to_the_same_losses_as_pure_jax():
    """The small CNN (conv, batch norm, ReLU, max pool, conv, batch norm, ReLU, global average pool, dense; NHWC),
    15 jitted SGD steps from one initialisation: the cudnnkit.jax version's losses follow the pure-JAX version's
    step for step, and so do the parameters and the running statistics."""
    params, state = m.cnn_init(jax.random.PRNGKey(0), jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 16, 16, 3), jnp.float32)
    labels = jax.random.randint(jax.random.PRNGKey(2), (16,), 0, m.CLASSES)
    runs = {}
    with _fp32_exact():
        for name, apply in (("cudnnkit", m.cnn_apply_cudnnkit), ("jax", m.cnn_apply_jax)):
            step = m.cnn_train_step(apply, lr=0.1)
            p, s, losses = params, state, []
            for _ in range(STEPS):
                p, s, loss = step(p, s, x, labels)
                losses.append(float(loss))
            runs[name] = (p, s, np.asarray(losses))
    (p_ck, s_ck, l_ck), (p_jx, s_jx, l_jx) = runs["cudnnkit"], runs["jax"]
    dev = np.abs(l_ck - l_jx) / np.abs(l_jx)
    assert dev.max() < LOSS_RTOL, f"loss deviation per step {dev}"
    assert l_jx[-1] < 0.85 * l_jx[0], f"the model does not train: {l_jx}"
    assert _tree_rel(p_ck, p_jx) < PARAM_RTOL
    assert _tree_rel(s_ck, s_jx) < PARAM_RTOL


def _sgd(loss_fn, lr):
    @jax.jit
    def step(w):
        loss, g = jax.value_and_grad(loss_fn)(w)
        return w - lr * g, loss

    return step


def test_an_lstm_trains_to_the_same_losses_as_a_scan_lstm():
    """One LSTM layer (T12 N8 I16 H32): ``cudnnkit.jax.ops.rnn`` on cuDNN's flat weights against a ``lax.scan`` LSTM
    reading the same flat weights (benchmarks.jax_models.lstm_params: slices of w, so SGD on w is the same update on
    both sides), 15 jitted SGD steps on an MSE loss."""
    T, N, IN, H = 12, 8, 16, 32
    rnn = m.lstm_config(IN, H)
    offsets = m.lstm_offsets(rnn)
    n = rnn.weight_count(jnp.zeros((1,), jnp.float32))
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    w0 = jax.random.uniform(k[0], (n,), jnp.float32, -0.3, 0.3)
    x = jax.random.normal(k[1], (T, N, IN), jnp.float32)
    target = jax.random.normal(k[2], (T, N, H), jnp.float32) * 0.3
    losses = {
        "cudnnkit": lambda w: m.lstm_loss_cudnnkit(w, x, target, rnn),
        "jax": lambda w: m.lstm_loss_jax(m.lstm_params(w, offsets), x, target),
    }
    runs = {}
    with _fp32_exact():
        assert _rel(m.lstm_apply_cudnnkit(w0, x, rnn), m.lstm_apply_jax(m.lstm_params(w0, offsets), x)) < 1e-5
        for name, loss_fn in losses.items():
            step = _sgd(loss_fn, 5.0)
            w, got = w0, []
            for _ in range(STEPS):
                w, loss = step(w)
                got.append(float(loss))
            runs[name] = (w, np.asarray(got))
    (w_ck, l_ck), (w_jx, l_jx) = runs["cudnnkit"], runs["jax"]
    dev = np.abs(l_ck - l_jx) / np.abs(l_jx)
    assert dev.max() < LOSS_RTOL, f"loss deviation per step {dev}"
    assert l_jx[-1] < 0.9 * l_jx[0], f"the LSTM does not train: {l_jx}"
    assert _rel(w_ck, w_jx) < PARAM_RTOL


# ----------------------------------------------------------------- lax.scan, jax.checkpoint


def _layer(h, w):
    """One cudnnkit layer: a 3x3 convolution (padding 1, no bias) and a ReLU, both cudnnkit.jax ops."""
    return cj.ops.activation(cj.ops.convolution(h, w, None, padding=1), mode="relu")


def _scan_data():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 4, 9, 8)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal((3, 4, 4, 3, 3)) * 0.3, jnp.float32)  # three layers' weights, stacked
    return x, ws


def _loss_loop(x, ws):
    h = x
    for i in range(ws.shape[0]):
        h = _layer(h, ws[i])
    return jnp.sum(h**2)


def _loss_scan(x, ws, body=None):
    body = body or (lambda h, w: (_layer(h, w), None))
    h, _ = jax.lax.scan(body, x, ws)
    return jnp.sum(h**2)


def test_a_cudnnkit_op_inside_lax_scan_under_jit_and_grad_equals_the_eager_calls():
    """Three conv+ReLU layers as a ``lax.scan`` over their stacked weights, under ``jit`` and ``jit(grad)``: the
    value equals the eager L2 calls' (cudnnkit.ops on the JAX arrays, no FFI) and the unjitted op-by-op calls', the
    gradients (x and every layer's w) the unjitted op-by-op ``grad``."""
    from cudnnkit import ops

    x, ws = _scan_data()
    with cudnnkit.settings(allow_tf32=False):
        h = x
        for i in range(ws.shape[0]):
            h = ops.activation_forward(ops.convolution_forward(h, ws[i], padding=1), "relu")
        eager_l2 = float(jnp.sum(h**2))
        eager = float(_loss_loop(x, ws))
        scanned = float(jax.jit(_loss_scan)(x, ws))
        g_eager = jax.grad(_loss_loop, argnums=(0, 1))(x, ws)
        g_scan = jax.jit(jax.grad(_loss_scan, argnums=(0, 1)))(x, ws)
    assert abs(scanned - eager) / abs(eager) < EAGER_RTOL and abs(eager_l2 - eager) / abs(eager) < EAGER_RTOL
    for got, want in zip(g_scan, g_eager):
        assert _rel(got, want) < EAGER_RTOL


def test_a_cudnnkit_op_inside_jax_checkpoint_under_jit_and_grad_equals_the_eager_calls():
    """``jax.checkpoint`` around each layer inside the scan (rematerialized in the backward: the forward target runs
    again there) and around the whole function: the gradients equal the unjitted op-by-op ``grad`` without it."""
    x, ws = _scan_data()
    with cudnnkit.settings(allow_tf32=False):
        g_eager = jax.grad(_loss_loop, argnums=(0, 1))(x, ws)
        remat_body = jax.checkpoint(lambda h, w: (_layer(h, w), None))
        g_body = jax.jit(jax.grad(lambda a, b: _loss_scan(a, b, remat_body), argnums=(0, 1)))(x, ws)
        g_whole = jax.jit(jax.grad(jax.checkpoint(_loss_loop), argnums=(0, 1)))(x, ws)
        v = jax.jit(jax.checkpoint(_loss_loop))(x, ws)
    assert abs(float(v) - float(_loss_loop(x, ws))) / float(v) < EAGER_RTOL
    for g in (g_body, g_whole):
        for got, want in zip(g, g_eager):
            assert _rel(got, want) < EAGER_RTOL


# ----------------------------------------------------------------- vmap(grad) with a shared w


def test_vmap_of_grad_wrt_x_of_a_convolution_with_a_closed_over_w():
    """Per-example input gradients of a convolution whose weights are closed over: only dx is asked of the backward
    (w is not perturbed), so the batch folds into N; each example's gradient equals its own ``grad`` and the lax
    reference's."""
    rng = np.random.default_rng(5)
    xs = jnp.asarray(rng.standard_normal((3, 2, 4, 9, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((6, 4, 3, 3)) * 0.2, jnp.float32)

    def loss(a):
        return jnp.sum(cj.ops.convolution(a, w, None, padding=1) ** 2)

    def ref(a):
        y = jax.lax.conv_general_dilated(a, w, (1, 1), ((1, 1), (1, 1)), precision=jax.lax.Precision.HIGHEST)
        return jnp.sum(y**2)

    with cudnnkit.settings(allow_tf32=False):
        many = jax.jit(jax.vmap(jax.grad(loss)))(xs)
        ones = [jax.jit(jax.grad(loss))(xs[b]) for b in range(3)]
    for b in range(3):
        assert _rel(many[b], ones[b]) < 1e-5
        assert _rel(many[b], jax.grad(ref)(xs[b])) < 1e-5
