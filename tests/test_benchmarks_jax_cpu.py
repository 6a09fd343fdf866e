"""The JAX benchmark rows (benchmarks/rows_jax.py, benchmarks/jax_models.py) on the CPU: the family registers its
factories, the harness's ``sync`` hook times and waits by the host clock without torch, the pure-JAX models train,
the cudnnkit CNN traces to the same shapes as the pure-JAX one (cuDNN's shape functions: no GPU), and the
``lax.scan`` LSTM is the LSTM it says it is. The rows themselves run on a GPU (``python -m benchmarks --filter
jax``)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def test_the_jax_family_registers_its_factories():
    from benchmarks import harness, rows_jax

    factories = harness.discover()
    mine = [f for f in factories if f.__module__ == rows_jax.__name__]
    assert [f.__name__ for f in mine] == ["cnn_train_rows", "lstm_train_rows", "handler_rows"]
    assert rows_jax.FAMILY == "jax"


def test_the_sync_hook_times_by_the_host_clock_and_waits_for_each_result():
    """With ``sync``, time_gpu and host_overhead_us need no torch: every timed call's result is waited for
    (time_gpu), and the host loop waits once per loop for its last result."""
    from benchmarks.harness import Row, host_overhead_us, time_gpu

    calls, synced = [], []

    def fn():
        calls.append(1)
        return len(calls)

    t = time_gpu(fn, warmup=2, iters=5, sync=synced.append)
    assert synced == [1, 2, 3, 4, 5, 6, 7] and set(t) == {"median_ms", "p10_ms", "p90_ms"}
    assert 0 <= t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
    synced.clear()
    us = host_overhead_us(fn, iters=4, warmup=1, repeats=3, sync=synced.append)
    assert us > 0 and synced == [8, 12, 16, 20]  # after the warm-up, then after each loop of 4
    assert Row("jax", "n", "s", "float32", fn, None).sync is None


def _cnn_data(dtype=jnp.float32, n=8):
    from benchmarks import jax_models as m

    params, state = m.cnn_init(jax.random.PRNGKey(0), dtype)
    x = jax.random.normal(jax.random.PRNGKey(1), (n, 16, 16, 3), jnp.float32).astype(dtype)
    labels = jax.random.randint(jax.random.PRNGKey(2), (n,), 0, m.CLASSES)
    return params, state, x, labels


def test_the_pure_jax_cnn_trains_and_the_cudnnkit_one_traces_to_its_shapes():
    from benchmarks import jax_models as m

    params, state, x, labels = _cnn_data()
    step = m.cnn_train_step(m.cnn_apply_jax, lr=0.1)
    losses = []
    p, s = params, state
    for _ in range(5):
        p, s, loss = step(p, s, x, labels)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert float(s["bn1"]["mean"].std()) > 0 and float(s["bn1"]["var"].mean()) != 1.0  # the running stats moved
    for dtype in (jnp.float32, jnp.bfloat16):
        args = _cnn_data(dtype)
        want = jax.eval_shape(m.cnn_train_step(m.cnn_apply_jax), *args)
        got = jax.eval_shape(m.cnn_train_step(m.cnn_apply_cudnnkit), *args)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert [(a.shape, a.dtype) for a in jax.tree.leaves(got)] == [(a.shape, a.dtype) for a in jax.tree.leaves(want)]


def test_the_batch_norm_of_the_reference_updates_with_the_unbiased_variance():
    from benchmarks import jax_models as m

    h = jax.random.normal(jax.random.PRNGKey(3), (4, 3, 3, 5))
    y, mean, var = m._bn_jax(h, jnp.ones(5), jnp.zeros(5), jnp.zeros(5), jnp.ones(5))
    hn = np.asarray(h, np.float64).reshape(-1, 5)
    np.testing.assert_allclose(np.asarray(mean), 0.1 * hn.mean(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(var), 0.9 + 0.1 * hn.var(0, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, 5), (hn - hn.mean(0)) / np.sqrt(hn.var(0) + 1e-5),
                               atol=1e-5)  # fmt: skip


def test_the_scan_lstm_and_the_flat_weight_mapping():
    """``lstm_apply_jax`` against a NumPy loop of the LSTM equations (gates i, f, g, o), and ``lstm_params``
    slicing cuDNN's flat buffer by a layout (here a made-up one: cuDNN's comes from the GPU) and summing the two
    biases."""
    from benchmarks import jax_models as m

    T, N, IN, H = 4, 3, 5, 6
    rng = np.random.default_rng(0)
    offsets, off = {}, 0
    for g in ("i", "f", "c", "o"):
        offsets[f"W_{g}"] = (off, (H, IN))
        off += H * IN
    for g in ("i", "f", "c", "o"):
        offsets[f"R_{g}"] = (off, (H, H))
        off += H * H
    for g in ("i", "f", "c", "o"):
        for side in ("W", "R"):
            offsets[f"b_{side}_{g}"] = (off, (H,))
            off += H
    w = rng.uniform(-0.5, 0.5, off)
    x = rng.standard_normal((T, N, IN))
    p = m.lstm_params(jnp.asarray(w), offsets)
    ys = np.asarray(m.lstm_apply_jax(p, jnp.asarray(x)))

    def mat(k):
        o, shape = offsets[k]
        return w[o : o + int(np.prod(shape))].reshape(shape)

    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h, c = np.zeros((N, H)), np.zeros((N, H))
    for t in range(T):
        z = {g: x[t] @ mat(f"W_{g}").T + h @ mat(f"R_{g}").T + mat(f"b_W_{g}") + mat(f"b_R_{g}")
             for g in ("i", "f", "c", "o")}  # fmt: skip
        c = sig(z["f"]) * c + sig(z["i"]) * np.tanh(z["c"])
        h = sig(z["o"]) * np.tanh(c)
        np.testing.assert_allclose(ys[t], h, rtol=1e-5, atol=1e-6)
    g = jax.grad(lambda v: m.lstm_loss_jax(m.lstm_params(v, offsets), jnp.asarray(x), jnp.zeros((T, N, H))))(
        jnp.asarray(w)
    )
    assert g.shape == w.shape and float(jnp.abs(g).min()) > 0  # every weight reaches the loss
