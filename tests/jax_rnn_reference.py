"""An independent ``jax.lax.scan`` RNN over the cudnnkit.jax params pytree (``params[layer][direction]`` dicts of
``w_ih``, ``w_hh``, ``b_ih``, ``b_hh``, ``w_hr``; torch's gate order), written from the cell equations of the cuDNN
API reference (``cudnnRNNMode_t``), with no cuDNN inside:

* RELU/TANH: ``h' = f(W x + b_ih + R h + b_hh)``
* LSTM: ``i, f, o = sigmoid(.)``, ``g = tanh(.)`` of ``W_* x + b_ih_* + R_* h + b_hh_*``; ``c' = f * c + i * g``,
  ``h' = o * tanh(c')``, then ``h' = w_hr h'`` with a projection
* GRU: ``r, z = sigmoid(.)``, ``n = tanh(W_n x + b_in + r * (R_n h + b_hn))``, ``h' = (1 - z) * n + z * h``

A sample's steps at and after its length leave its state alone and output zeros; the reverse direction runs each
sample from its last valid step back to step 0. Layer ``l > 0`` reads the concatenated outputs of layer ``l - 1``'s
directions. Matrix products at ``Precision.HIGHEST`` (float32 without TF32). The CPU tests run it as the stand-in
for cuDNN's RNN, the GPU tests compare cuDNN's with it (tests/gpu/test_jax_nn_gpu.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

HI = jax.lax.Precision.HIGHEST


def _mm(v, m):
    return jnp.matmul(v, m.T, precision=HI)


def _lin(p, v, side):
    out = _mm(v, p[f"w_{side}"])
    b = p.get(f"b_{side}")
    return out if b is None else out + b


def step(cell, p, x, h, c):
    """One step of one direction: ``(h', c')`` (``c'`` None for cells without one)."""
    gi, gh = _lin(p, x, "ih"), _lin(p, h, "hh")
    if cell in ("tanh", "relu"):
        a = gi + gh
        return (jnp.tanh(a) if cell == "tanh" else jax.nn.relu(a)), None
    if cell == "gru":
        r_i, z_i, n_i = jnp.split(gi, 3, axis=-1)
        r_h, z_h, n_h = jnp.split(gh, 3, axis=-1)
        r, z = jax.nn.sigmoid(r_i + r_h), jax.nn.sigmoid(z_i + z_h)
        n = jnp.tanh(n_i + r * n_h)
        return (1 - z) * n + z * h, None
    i, f, g, o = jnp.split(gi + gh, 4, axis=-1)
    c2 = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h2 = jax.nn.sigmoid(o) * jnp.tanh(c2)
    if "w_hr" in p:
        h2 = _mm(h2, p["w_hr"])
    return h2, c2


def _reverse_valid(a, lengths):
    """``a`` (T, N, ...) with each sample's first ``lengths[n]`` steps reversed (the rest kept): an involution."""
    T = a.shape[0]
    t = jnp.arange(T)[:, None]
    idx = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)  # (T, N)
    return jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)), axis=0)


def run(cell, params, x, h0=None, c0=None, *, time_major=False, seq_lengths=None):
    """``(y, h_n, c_n)`` in cudnnkit.jax's layouts (``c_n`` None for cells without a cell state)."""
    xs = x if time_major else jnp.swapaxes(x, 0, 1)  # (T, N, I)
    T, N = xs.shape[:2]
    L, D = len(params), len(params[0])
    P = params[0][0]["w_hh"].shape[1]
    H = params[0][0]["w_hh"].shape[0] // {"lstm": 4, "gru": 3}.get(cell, 1)
    lengths = jnp.full((N,), T) if seq_lengths is None else jnp.asarray(np.asarray(seq_lengths))
    valid = (jnp.arange(T)[:, None] < lengths[None, :])[:, :, None]  # (T, N, 1)
    h0 = jnp.zeros((L * D, N, P), x.dtype) if h0 is None else h0
    c0 = jnp.zeros((L * D, N, H), x.dtype) if c0 is None else c0
    inp, hs, cs = xs, [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            p, k = params[layer][d], layer * D + d
            seq = inp if d == 0 else _reverse_valid(inp, lengths)

            def body(carry, tv, p=p):
                h, c = carry
                xt, v = tv
                hn, cn = step(cell, p, xt, h, c)
                h = jnp.where(v, hn, h)
                c = c if cn is None else jnp.where(v, cn, c)
                return (h, c), jnp.where(v, hn, jnp.zeros_like(hn))

            (h, c), ys = jax.lax.scan(body, (h0[k], c0[k]), (seq, valid))
            outs.append(ys if d == 0 else _reverse_valid(ys, lengths))
            hs.append(h)
            cs.append(c)
        inp = jnp.concatenate(outs, axis=-1)
    y = inp if time_major else jnp.swapaxes(inp, 0, 1)
    return y, jnp.stack(hs), (jnp.stack(cs) if cell == "lstm" else None)


def flax_optimized_lstm(cell_params, x):
    """flax's ``nn.RNN(nn.OptimizedLSTMCell(H))`` written out from its source's equations (``x`` ``(N, T, I)``, zero
    carry): ``i = sigmoid(x @ ii.kernel + h @ hi.kernel + hi.bias)`` and so on for ``f, g (tanh), o``; ``c' = f * c
    + i * g``, ``h' = o * tanh(c')``. -> (outputs (N, T, H), (c, h))."""
    p = cell_params
    H = p["hi"]["kernel"].shape[0]
    N = x.shape[0]

    def body(carry, xt):
        c, h = carry
        pre = {g: jnp.matmul(xt, p[f"i{g}"]["kernel"], precision=HI) + jnp.matmul(h, p[f"h{g}"]["kernel"], precision=HI)
               + p[f"h{g}"]["bias"] for g in "ifgo"}  # fmt: skip
        c = jax.nn.sigmoid(pre["f"]) * c + jax.nn.sigmoid(pre["i"]) * jnp.tanh(pre["g"])
        h = jax.nn.sigmoid(pre["o"]) * jnp.tanh(c)
        return (c, h), h

    zeros = jnp.zeros((N, H), x.dtype)
    (c, h), ys = jax.lax.scan(body, (zeros, zeros), jnp.swapaxes(x, 0, 1))
    return jnp.swapaxes(ys, 0, 1), (c, h)
