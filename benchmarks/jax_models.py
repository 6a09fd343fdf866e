"""Two small JAX models, each written twice -- with ``cudnnkit.jax`` and in pure JAX -- for the ``jax`` benchmark rows
(:mod:`benchmarks.rows_jax`) and the GPU training tests (tests/gpu/test_jax_training_gpu.py), which check that the two
versions train to the same loss from the same seed (so the benchmark compares the same model).

* CNN (NHWC, flax's layouts): conv3x3 3->32, batch norm, ReLU, max pool 2x2, conv3x3 32->64, batch norm, ReLU,
  global average pool, dense 10; cross-entropy. ``cnn_apply_cudnnkit``: ``cudnnkit.jax.nn.conv``,
  ``nn.batch_norm`` (explicit state) with the ReLU fused in its cuDNN call (``activation="relu"``:
  ``CUDNN_BATCHNORM_OPS_BN_ACTIVATION``, as XLA fuses its own ReLU into the normalization), ``nn.max_pool``,
  ``nn.avg_pool`` and ``nn.log_softmax``; ``cnn_apply_jax``: ``lax.conv_general_dilated``, the batch statistics in float32,
  ``jax.nn.relu``, ``lax.reduce_window``, ``jnp.mean`` and ``jax.nn.log_softmax``. The dense layer is ``jnp.dot`` in
  both. Batch-norm parameters and statistics are float32 for bfloat16 data (cuDNN's rule); the running variance is
  updated with the unbiased batch variance in both (cuDNN's convention).
* LSTM (one layer, seq-major ``(T, N, I)``): ``lstm_apply_cudnnkit`` is ``cudnnkit.jax.ops.rnn`` on cuDNN's flat
  weight buffer ``w``; ``lstm_apply_jax`` a ``lax.scan`` over the steps with the input projection of every step in
  one matrix product first (what a JAX LSTM does), on a params pytree ``{"wx": (I, 4H), "wh": (H, 4H), "b": (4H,)}``
  (gates i, f, g, o). :func:`lstm_params` maps ``w`` onto that pytree (differentiably: slices of ``w``, the two
  cuDNN biases summed), from the weight layout cuDNN reports (:func:`lstm_offsets`).

Importing this module imports jax and numpy; cudnnkit is imported where a ``cudnnkit`` function runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "cnn_init",
    "cnn_apply_cudnnkit",
    "cnn_apply_jax",
    "cnn_train_step",
    "lstm_config",
    "lstm_offsets",
    "lstm_params",
    "lstm_apply_cudnnkit",
    "lstm_apply_jax",
    "lstm_loss_cudnnkit",
    "lstm_loss_jax",
    "sgd_step",
]

BN_MOMENTUM = 0.9  # flax's convention: the weight of the old running value
BN_EPSILON = 1e-5
CLASSES = 10


# ----------------------------------------------------------------- CNN


def cnn_init(key: Any, dtype: Any = jnp.float32, in_channels: int = 3) -> tuple[dict, dict]:
    """``(params, state)``: He-normal convolution kernels (HWIO) in ``dtype``, batch-norm scale 1 / bias 0 and
    running mean 0 / variance 1 in float32, a dense layer 64 -> 10 in float32."""
    k1, k2, k3 = jax.random.split(key, 3)

    def he(k: Any, shape: tuple) -> Any:
        fan_in = int(np.prod(shape[:-1]))
        return (jax.random.normal(k, shape, jnp.float32) * np.sqrt(2.0 / fan_in)).astype(dtype)

    params = {
        "conv1": he(k1, (3, 3, in_channels, 32)),
        "bn1": {"scale": jnp.ones(32, jnp.float32), "bias": jnp.zeros(32, jnp.float32)},
        "conv2": he(k2, (3, 3, 32, 64)),
        "bn2": {"scale": jnp.ones(64, jnp.float32), "bias": jnp.zeros(64, jnp.float32)},
        "dense": {"w": jax.random.normal(k3, (64, CLASSES), jnp.float32) / 8.0, "b": jnp.zeros(CLASSES, jnp.float32)},
    }
    state = {n: {"mean": jnp.zeros(c, jnp.float32), "var": jnp.ones(c, jnp.float32)} for n, c in (("bn1", 32),
                                                                                                  ("bn2", 64))}  # fmt: skip
    return params, state


def cnn_apply_cudnnkit(params: dict, state: dict, x: Any) -> tuple[Any, Any, dict]:
    """``(log-probabilities, logits, new state)`` of a training step's forward, by cuDNN (see the module docstring)."""
    from cudnnkit.jax import nn

    new_state = {}
    h = x
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
        h = nn.conv(h, params[conv])  # SAME, stride 1, no bias (the batch norm's bias follows)
        h, m, v = nn.batch_norm(h, params[bn]["scale"], params[bn]["bias"], state[bn]["mean"], state[bn]["var"],
                                training=True, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, activation="relu")  # fmt: skip
        new_state[bn] = {"mean": m, "var": v}
        if conv == "conv1":
            h = nn.max_pool(h, (2, 2), (2, 2))
    h = nn.avg_pool(h, h.shape[1:3]).reshape(h.shape[0], -1)  # global average pool
    logits = jnp.dot(h.astype(jnp.float32), params["dense"]["w"]) + params["dense"]["b"]
    return nn.log_softmax(logits, axis=-1), logits, new_state


def _bn_jax(h: Any, scale: Any, bias: Any, mean: Any, var: Any) -> tuple[Any, Any, Any]:
    hf = h.astype(jnp.float32)
    mu = hf.mean(axis=(0, 1, 2))
    var_b = jnp.mean(jnp.square(hf - mu), axis=(0, 1, 2))
    y = (hf - mu) * jax.lax.rsqrt(var_b + BN_EPSILON) * scale + bias
    n = h.size // h.shape[-1]
    new_mean = BN_MOMENTUM * mean + (1 - BN_MOMENTUM) * mu
    new_var = BN_MOMENTUM * var + (1 - BN_MOMENTUM) * var_b * (n / (n - 1))
    return y.astype(h.dtype), new_mean, new_var


def cnn_apply_jax(params: dict, state: dict, x: Any) -> tuple[Any, Any, dict]:
    """The same forward in pure JAX (XLA's convolution, reductions and elementwise fusions)."""
    new_state = {}
    h = x
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
        h = jax.lax.conv_general_dilated(h, params[conv], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        h, m, v = _bn_jax(h, params[bn]["scale"], params[bn]["bias"], state[bn]["mean"], state[bn]["var"])
        new_state[bn] = {"mean": m, "var": v}
        h = jax.nn.relu(h)
        if conv == "conv1":
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jnp.mean(h.astype(jnp.float32), axis=(1, 2))
    logits = jnp.dot(h, params["dense"]["w"]) + params["dense"]["b"]
    return jax.nn.log_softmax(logits, axis=-1), logits, new_state


def sgd_step(params: Any, grads: Any, lr: float) -> Any:
    """Plain SGD: ``p - lr * g`` in each parameter's dtype."""
    return jax.tree.map(lambda p, g: (p.astype(jnp.float32) - lr * g.astype(jnp.float32)).astype(p.dtype), params,
                        grads)  # fmt: skip


def cnn_train_step(apply: Callable, lr: float = 0.05) -> Callable:
    """``step(params, state, x, labels) -> (params, state, loss)``, jitted: forward, cross-entropy, backward, SGD."""

    def loss_fn(params: dict, state: dict, x: Any, labels: Any) -> tuple[Any, dict]:
        logp, _, new_state = apply(params, state, x)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1)), new_state

    @jax.jit
    def step(params: dict, state: dict, x: Any, labels: Any) -> tuple[dict, dict, Any]:
        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, labels)
        return sgd_step(params, grads, lr), new_state, loss

    return step


# ----------------------------------------------------------------- LSTM


def lstm_config(input_size: int, hidden: int, dtype: str = "float32") -> Any:
    """The one-layer LSTM's :class:`cudnnkit.ops.RNN` config (algorithm "auto")."""
    from cudnnkit.ops import RNN

    return RNN("lstm", input_size, hidden, dtype=dtype)


def lstm_offsets(rnn: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Where each matrix and bias of a one-layer LSTM lies in cuDNN's flat weight buffer: gate name (``W_i``, ...,
    ``R_o``; the biases ``b_W_i``, ...) -> (offset, shape). Read from ``RNN.weight_params`` of a buffer holding its
    own indices (float32 holds them exactly below 2**24 elements), on the default JAX device (a GPU: cuDNN's query)."""
    n = rnn.weight_count(jnp.zeros((1,), jnp.float32))
    if n >= 2**24:
        raise ValueError(f"{n} weights: too many to index through float32")
    idx = jnp.arange(n, dtype=jnp.float32)
    out: dict[str, tuple[int, tuple[int, ...]]] = {}
    for row in rnn.weight_params(idx):
        for p in row:
            for key, arr in ((p.gate, p.matrix), (f"b_{p.gate}", p.bias)):
                if arr is not None:
                    flat = np.asarray(arr).reshape(-1).astype(np.int64)
                    assert np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)), key  # one contiguous run
                    out[key] = (int(flat[0]), tuple(int(d) for d in arr.shape))
    return out


def lstm_params(w: Any, offsets: dict) -> dict:
    """The ``lax.scan`` LSTM's params pytree from cuDNN's flat ``w`` (static slices: differentiable), gates i, f, g, o
    (cuDNN's W_i, W_f, W_c, W_o and R_*), the input and recurrent biases summed."""

    def get(key: str) -> Any:
        off, shape = offsets[key]
        return w[off : off + int(np.prod(shape))].reshape(shape)

    gates = ("i", "f", "c", "o")
    return {
        "wx": jnp.concatenate([get(f"W_{g}").T for g in gates], axis=1),
        "wh": jnp.concatenate([get(f"R_{g}").T for g in gates], axis=1),
        "b": jnp.concatenate([get(f"b_W_{g}") + get(f"b_R_{g}") for g in gates]),
    }


def lstm_apply_cudnnkit(w: Any, x: Any, rnn: Any) -> Any:
    """The outputs ``(T, N, H)`` of the LSTM over ``x`` ``(T, N, I)`` from zero states: one ``cudnnkit.jax.ops.rnn``."""
    from cudnnkit.jax import op

    out, _, _ = op("rnn")(x, w, None, None, rnn=rnn)
    return out


def lstm_apply_jax(params: dict, x: Any) -> Any:
    """The same LSTM as a ``lax.scan``: the input projection of every step in one product, then per step
    ``z = xp_t + h @ wh``, ``c = f * c + i * g``, ``h = o * tanh(c)``."""
    T, N, _ = x.shape
    H = params["wh"].shape[0]
    xp = (x.reshape(T * N, -1) @ params["wx"] + params["b"]).reshape(T, N, 4 * H)

    def cell(carry: tuple, xt: Any) -> tuple:
        h, c = carry
        z = xt + h @ params["wh"]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((N, H), x.dtype)
    _, ys = jax.lax.scan(cell, (zeros, zeros), xp)
    return ys


def lstm_loss_cudnnkit(w: Any, x: Any, target: Any, rnn: Any) -> Any:
    return jnp.mean(jnp.square(lstm_apply_cudnnkit(w, x, rnn) - target))


def lstm_loss_jax(params: dict, x: Any, target: Any) -> Any:
    return jnp.mean(jnp.square(lstm_apply_jax(params, x) - target))
