"""cudnnkit.jax.nn's dropout, recurrent networks and CTC loss on the GPU, under jit, forward and grad: dropout's
key semantics (same key same mask, rate statistics, the gradient through the forward's mask); ``lstm``/``gru``/
``rnn`` against the ``lax.scan`` reference (tests/jax_rnn_reference.py) in float64 and float32 (TF32 off on both
sides), cuDNN's weight layout against the model the CPU tier packs with, flax's ``OptimizedLSTMCell`` through
``nn.RNN`` against ``lstm`` on converted params; ``ctc_loss`` against ``optax.ctc_loss`` and the float64 NumPy CTC
reference of tests/gpu/test_ctc_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover
    pytest.skip("no JAX GPU device", allow_module_level=True)

import cudnnkit  # noqa: E402
from cudnnkit.jax import nn  # noqa: E402
from cudnnkit.jax import rnn as R  # noqa: E402

from .. import jax_rnn_reference as ref  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def x64():
    jax.config.update("jax_enable_x64", True)
    yield


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _r(rng, shape, dtype=jnp.float32, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


# ----------------------------------------------------------------- dropout


def test_dropout_same_key_same_mask_under_jit():
    rng = np.random.default_rng(0)
    x = jnp.asarray(1.0 + np.abs(rng.standard_normal((256, 300))), jnp.float32)  # never 0: y == 0 means dropped
    f = jax.jit(lambda k, a: nn.dropout(k, 0.3, a))
    k1, k2 = jax.random.key(11), jax.random.key(12)
    y1, y1b, y2 = f(k1, x), f(k1, x), f(k2, x)
    assert np.array_equal(np.asarray(y1), np.asarray(y1b))
    assert not np.array_equal(np.asarray(y1) != 0, np.asarray(y2) != 0)
    assert np.array_equal(np.asarray(nn.dropout(k1, 0.3, x)), np.asarray(y1))  # outside jit: the same mask
    old = jax.random.PRNGKey(11)  # a raw uint32[2] key: its own bits, its own mask, repeatable
    y_old = np.asarray(f(old, x))
    assert np.array_equal(y_old, np.asarray(f(old, x)))
    assert not np.array_equal(y_old != 0, np.asarray(f(jax.random.PRNGKey(12), x)) != 0)  # another raw key's mask
    kept = np.asarray(y1) != 0
    np.testing.assert_allclose(np.asarray(y1)[kept], np.asarray(x)[kept] / 0.7, rtol=1e-6)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_dropout_rate_statistics(rate):
    x = jnp.ones((1000, 1000), jnp.float32)
    keep = [float((np.asarray(nn.dropout(jax.random.key(s), rate, x)) != 0).mean()) for s in range(3)]
    for k in keep:  # 1e6 Bernoulli draws: the standard deviation of the kept fraction is below 5e-4
        assert abs(k - (1 - rate)) < 5e-3, keep
    assert len(set(keep)) == 3


def test_dropout_grad_uses_the_forward_mask():
    rng = np.random.default_rng(1)
    x = jnp.asarray(1.0 + np.abs(rng.standard_normal((64, 129))), jnp.float64)
    ct = _r(rng, (64, 129), jnp.float64)
    key = jax.random.key(5)

    def loss(a, k):
        return (nn.dropout(k, 0.25, a) * ct).sum()

    val, g = jax.jit(jax.value_and_grad(loss))(x, key)
    y = np.asarray(jax.jit(lambda a, k: nn.dropout(k, 0.25, a))(x, key))
    kept = y != 0
    assert 0.7 < kept.mean() < 0.8
    # cuDNN's scale 1 / (1 - p) is a float32 value even for float64 data (the descriptor keeps p as a C float)
    np.testing.assert_allclose(np.asarray(g), np.where(kept, np.asarray(ct) / 0.75, 0.0), rtol=1e-7)
    np.testing.assert_allclose(float(val), float((y * np.asarray(ct)).sum()), rtol=1e-10)


def test_dropout_keys_inside_scan_and_other_dtypes():
    x = jnp.ones((32, 40), jnp.float16)

    def body(c, k):
        return c, nn.dropout(k, 0.5, x)

    _, ys = jax.jit(lambda ks: jax.lax.scan(body, 0, ks))(jax.random.split(jax.random.key(0), 3))
    masks = np.asarray(ys) != 0
    assert ys.dtype == jnp.float16 and not np.array_equal(masks[0], masks[1])
    assert set(np.unique(np.asarray(ys, np.float32)).tolist()) <= {0.0, 2.0}
    yb = jax.jit(lambda k, a: nn.dropout(k, 0.5, a))(jax.random.key(1), x.astype(jnp.bfloat16))
    assert yb.dtype == jnp.bfloat16 and set(np.unique(np.asarray(yb, np.float32)).tolist()) <= {0.0, 2.0}


# ----------------------------------------------------------------- lstm / gru / rnn

ARCHS = [
    ("lstm", dict(num_layers=2, bidirectional=True), dict(states=True)),
    ("lstm", dict(), dict(time_major=True, seq_lengths=(7, 4, 7, 1))),
    ("lstm", dict(proj_size=3), dict(states=True)),
    ("gru", dict(num_layers=2), dict(states=True, seq_lengths=(7, 6, 5, 2))),
    ("gru", dict(bidirectional=True), dict(time_major=True)),
    ("tanh", dict(bias=False), dict(states=True)),
    ("relu", dict(num_layers=2, bidirectional=True), dict()),
]


def _call(cell, params, x, h0, c0, kw):
    if cell == "lstm":
        y, (h, c) = nn.lstm(params, x, h0, c0, **kw)
        return y, h, c
    if cell == "gru":
        y, h = nn.gru(params, x, h0, **kw)
    else:
        y, h = nn.rnn(params, x, h0, nonlinearity=cell, **kw)
    return y, h, None


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cell, arch, kw", ARCHS)
def test_rnns_match_the_scan_reference_under_jit(cell, arch, kw, dtype):
    kw = dict(kw)
    states = kw.pop("states", False)
    dt = jnp.dtype(dtype)
    rng = np.random.default_rng(3)
    p = nn.init_params(jax.random.key(4), cell, 5, 8, dtype=dt, **arch)
    cfg = R.config(p, cell)
    N, T = 4, 7
    x = _r(rng, (T, N, 5) if kw.get("time_major") else (N, T, 5), dt)
    h0 = _r(rng, cfg.hidden_shape(N), dt, 0.5) if states else None
    c0 = _r(rng, cfg.cell_shape(N), dt, 0.5) if states and cell == "lstm" else None
    tm, lengths = kw.get("time_major", False), kw.get("seq_lengths")

    def loss(f):
        cts = None

        def go(q, a, h, c):
            nonlocal cts
            outs = [o for o in f(q, a, h, c) if o is not None]
            if cts is None:
                g = np.random.default_rng(9)
                cts = [jnp.asarray(g.standard_normal(o.shape), o.dtype) for o in outs]
            return sum((o * ct).sum() for o, ct in zip(outs, cts))

        return go

    with cudnnkit.settings(allow_tf32=False):
        got = jax.jit(lambda q, a, h, c: _call(cell, q, a, h, c, kw))(p, x, h0, c0)
        argnums = (0, 1, 2, 3) if states and cell == "lstm" else (0, 1, 2) if states else (0, 1)
        g = jax.jit(jax.grad(loss(lambda q, a, h, c: _call(cell, q, a, h, c, kw)), argnums=argnums))(p, x, h0, c0)
    with jax.default_matmul_precision("highest"):
        want = jax.jit(lambda q, a, h, c: ref.run(cell, q, a, h, c, time_major=tm, seq_lengths=lengths))(p, x, h0, c0)
        gw = jax.jit(jax.grad(loss(lambda q, a, h, c: ref.run(cell, q, a, h, c, time_major=tm, seq_lengths=lengths)),
                              argnums=argnums))(p, x, h0, c0)  # fmt: skip
    tol, gtol = (1e-10, 1e-9) if dtype == "float64" else (2e-5, 1e-4)
    for j, (a, b) in enumerate(zip(got, want)):
        if b is not None:
            assert a.shape == b.shape and a.dtype == dt
            assert _rel(a, b) < tol, f"output {j}"
    for path, a in jax.tree_util.tree_leaves_with_path(g):
        b = dict(jax.tree_util.tree_leaves_with_path(gw))[path]
        assert _rel(a, b) < gtol, f"gradient {jax.tree_util.keystr(path)}"


@pytest.mark.parametrize("cell, arch", [("lstm", dict()), ("lstm", dict(num_layers=3, bidirectional=True)),
                                        ("lstm", dict(proj_size=4, num_layers=2)), ("gru", dict(bidirectional=True)),
                                        ("tanh", dict(bias=False, num_layers=2)), ("relu", dict())])  # fmt: skip
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_cudnns_weight_layout_is_the_model(cell, arch, dtype):
    """The layout the CPU tier packs with (no device to ask) is the one cuDNN gives, including the single-bias
    modes flax's parameters need."""
    p = nn.init_params(jax.random.key(0), cell, 6, 10, dtype=jnp.dtype(dtype), **arch)
    cfg = R.config(p, cell)
    assert R.weight_layout(cfg, source="cudnn") == R.weight_layout(cfg, source="model")
    if cell == "lstm" and not arch.get("proj_size"):
        one = [[{k: v for k, v in d.items() if k != "b_ih"} for d in layer] for layer in p]
        c1 = R.config(one, "lstm")
        assert c1.bias_mode == "single_recurrent"
        assert R.weight_layout(c1, source="cudnn") == R.weight_layout(c1, source="model")


def test_pack_unpack_round_trip_with_cudnns_layout():
    p = nn.init_params(jax.random.key(1), "lstm", 5, 7, num_layers=2, bidirectional=True, proj_size=3)
    cfg = R.config(p, "lstm")
    w = jax.jit(lambda q: nn.pack_params(q, "lstm"))(p)
    assert w.shape == (R.weight_layout(cfg, source="cudnn")[0],)
    for a, b in zip(jax.tree_util.tree_leaves(nn.unpack_params(w, cfg)), jax.tree_util.tree_leaves(p)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_an_lstm_training_step_under_jit():
    """A whole step, loss and gradient of the params pytree, jitted: one cuDNN forward and backward inside."""
    rng = np.random.default_rng(5)
    p = nn.init_params(jax.random.key(2), "lstm", 8, 16, num_layers=2)
    x, target = _r(rng, (4, 10, 8)), _r(rng, (4, 10, 16))

    @jax.jit
    def step(q):
        loss, g = jax.value_and_grad(lambda q: ((nn.lstm(q, x)[0] - target) ** 2).mean())(q)
        return loss, jax.tree_util.tree_map(lambda a, b: a - 0.5 * b, q, g)

    losses = []
    with cudnnkit.settings(allow_tf32=False):
        for _ in range(5):
            loss, p = step(p)
            losses.append(float(loss))
    assert losses[-1] < losses[0], losses


# ----------------------------------------------------------------- flax


def test_flax_optimized_lstm_cell_through_nn_rnn_equals_lstm_on_converted_params():
    flax_nn = pytest.importorskip("flax.linen")
    rng = np.random.default_rng(6)
    N, T, In, H = 3, 9, 5, 12
    x = _r(rng, (N, T, In))
    model = flax_nn.RNN(flax_nn.OptimizedLSTMCell(H))
    variables = model.init(jax.random.key(0), x)
    variables = jax.tree_util.tree_map(lambda a: a + 0.1 * jnp.asarray(rng.standard_normal(a.shape), a.dtype),
                                       variables)  # nonzero biases  # fmt: skip
    params = nn.from_flax_lstm(variables["params"])
    assert R.config(params, "lstm").bias_mode == "single_recurrent"
    with jax.default_matmul_precision("highest"):
        want = jax.jit(model.apply)(variables, x)
        gwant = jax.jit(jax.grad(lambda v, a: (model.apply(v, a) ** 2).sum(), argnums=(0, 1)))(variables, x)
    with cudnnkit.settings(allow_tf32=False):
        got = jax.jit(lambda q, a: nn.lstm(q, a)[0])(params, x)
        ggot = jax.jit(jax.grad(lambda v, a: (nn.lstm(nn.from_flax_lstm(v["params"]), a)[0] ** 2).sum(),
                                argnums=(0, 1)))(variables, x)  # fmt: skip
    assert got.shape == want.shape == (N, T, H)
    assert _rel(got, want) < 2e-5
    assert _rel(ggot[1], gwant[1]) < 1e-4
    for path, a in jax.tree_util.tree_leaves_with_path(ggot[0]):
        assert _rel(a, dict(jax.tree_util.tree_leaves_with_path(gwant[0]))[path]) < 1e-4, jax.tree_util.keystr(path)
    back = nn.to_flax_lstm(params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(R._flax_cell(variables))):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------- ctc_loss


def _ctc_batch(rng, B=4, T=30, K=8, N=6):
    """optax-style padded arrays: right-padded frames and labels, every sample feasible (repeats included)."""
    logits = rng.standard_normal((B, T, K)) * 2
    labels = np.zeros((B, N), np.int32)
    label_pad = np.ones((B, N), np.float32)
    logit_pad = np.ones((B, T), np.float32)
    for b in range(B):
        L = N if b == 0 else int(rng.integers(1, N + 1))
        lab = rng.integers(1, K, size=L)
        if L >= 2 and b % 2 == 0:
            lab[1] = lab[0]  # a repeat: needs a blank between
        labels[b, :L] = lab
        label_pad[b, :L] = 0
        need = L + int(np.count_nonzero(lab[1:] == lab[:-1]))
        Tn = T if b < 2 else int(rng.integers(need, T + 1))
        logit_pad[b, :Tn] = 0
    return logits, logit_pad, labels, label_pad


@pytest.mark.parametrize("frames", ["right-padded", "padded anywhere"])
def test_ctc_loss_matches_optax_forward_and_grad_under_jit(frames):
    """Against optax.ctc_loss, forward and gradient under jit; optax skips a padded frame wherever it is (the
    second case scatters each sample's valid frames over T)."""
    optax = pytest.importorskip("optax")
    rng = np.random.default_rng(7)
    lg, lp, lab, lbp = _ctc_batch(rng)
    if frames == "padded anywhere":
        for b in range(lp.shape[0]):
            n_valid = int((lp[b] == 0).sum())
            lp[b] = 1
            lp[b, np.sort(rng.choice(lp.shape[1], n_valid, replace=False))] = 0
    args = (jnp.asarray(lg, jnp.float32), jnp.asarray(lp), jnp.asarray(lab), jnp.asarray(lbp))
    got = jax.jit(nn.ctc_loss)(*args)
    want = jax.jit(optax.ctc_loss)(*args)
    assert got.shape == want.shape == (4,) and got.dtype == jnp.float32
    assert _rel(got, want) < 1e-5
    w = jnp.asarray(rng.standard_normal(4), jnp.float32)
    g = jax.jit(jax.grad(lambda x, *a: (nn.ctc_loss(x, *a) * w).sum()))(*args)
    gw = jax.jit(jax.grad(lambda x, *a: (optax.ctc_loss(x, *a) * w).sum()))(*args)
    assert _rel(g, gw) < 1e-4


def test_ctc_loss_matches_the_float64_reference():
    from .test_ctc_gpu import ctc_ref

    rng = np.random.default_rng(8)
    lg, lp, lab, lbp = _ctc_batch(rng, B=5, T=25, K=6, N=5)
    lg = lg.astype(np.float32).astype(np.float64)  # the values cuDNN sees (float32)
    il = (lp.shape[1] - lp.sum(1)).astype(int)
    ll = (lab.shape[1] - lbp.sum(1)).astype(int)
    packed = np.concatenate([lab[b, : ll[b]] for b in range(len(ll))])
    costs, grads = ctc_ref(np.transpose(lg, (1, 0, 2)), packed, ll, il)  # time-major (T, B, K)
    x = jnp.asarray(lg, jnp.float64)  # float64 logits: computed in float32, the loss back in float64
    got, g = jax.jit(jax.value_and_grad(lambda a: nn.ctc_loss(a, jnp.asarray(lp), jnp.asarray(lab),
                                                              jnp.asarray(lbp)).sum()))(x)  # fmt: skip
    per = jax.jit(nn.ctc_loss)(x, jnp.asarray(lp), jnp.asarray(lab), jnp.asarray(lbp))
    assert per.dtype == jnp.float64 and _rel(per, costs) < 1e-5
    assert _rel(g, np.transpose(grads, (1, 0, 2))) < 1e-4


def test_ctc_loss_refuses_an_empty_label_when_it_runs():
    rng = np.random.default_rng(9)
    lg, lp, lab, lbp = _ctc_batch(rng, B=2)
    lbp[1] = 1.0  # sample 1 has no label: cuDNN returns a cost of 0 there, so cudnnkit refuses it
    with pytest.raises(Exception, match=r"label_lengths\[1\] is 0"):
        jax.block_until_ready(jax.jit(nn.ctc_loss)(jnp.asarray(lg, jnp.float32), jnp.asarray(lp), jnp.asarray(lab),
                                                   jnp.asarray(lbp)))  # fmt: skip
