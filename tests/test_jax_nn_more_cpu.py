"""cudnnkit.jax.nn's dropout, recurrent networks and CTC loss on the CPU: tracing and shapes (``jax.eval_shape``,
``jax.make_jaxpr``), the refusals and their messages, the params pytree (packing into cuDNN's flat buffer and back,
the flax converters), and the plumbing run end to end through stand-ins:

* dropout through the real op machinery (:class:`cudnnkit.jax._ops.JaxOp`, XLA's FFI on JAX's CPU platform) with a
  NumPy declaration standing in for cuDNN's: the key's bits reach the handler as a device buffer under ``jit``,
  the same key gives the same mask, the gradient uses the forward's mask;
* ``lstm``/``gru``/``rnn`` with the ``rnn`` op replaced by the ``lax.scan`` reference (tests/jax_rnn_reference.py)
  over the unpacked weight buffer: the packing, the layouts and the gradients' way back to the pytree.

cuDNN itself runs them in tests/gpu/test_jax_nn_gpu.py."""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)

import cudnnkit.jax as cj  # noqa: E402
from cudnnkit import autograd  # noqa: E402
from cudnnkit.jax import _ops, nn  # noqa: E402
from cudnnkit.jax import rnn as R  # noqa: E402
from cudnnkit.ops import ctc as ctc_mod  # noqa: E402
from cudnnkit.ops import dropout as dropout_mod  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402
from cudnnkit.runtime.arrays import contiguous_strides  # noqa: E402

from . import jax_rnn_reference as ref  # noqa: E402


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _s(shape, dtype="float32"):
    return Spec(tuple(shape), contiguous_strides(tuple(shape)), dtype)


def _r(shape, seed=0, dtype=jnp.float64):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# ----------------------------------------------------------------- dropout

_NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "uint8": np.uint8}


class NumpyRunner:
    """CPU buffers as NumPy arrays over XLA's memory (tests/test_jax_ops_cpu.py's runner)."""

    platform = "cpu"

    def array(self, call, b, shape=None, strides=None):
        n = int(np.prod(b.shape, dtype=np.int64))
        dt = np.dtype(_NP[b.dtype])
        flat = np.frombuffer((ctypes.c_char * max(n * dt.itemsize, 1)).from_address(b.ptr), dtype=dt, count=n)
        if shape is None:
            return flat.reshape(b.shape)
        return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * dt.itemsize for s in strides))

    def write(self, call, dst, value, name, shape=None, strides=None):
        np.copyto(self.array(call, dst, shape, strides), value)

    def zero(self, call, dst):
        self.array(call, dst)[...] = 0

    def scope(self, call):
        return contextlib.nullcontext()


SEEDS: list[int] = []


def _drop_fwd(x, *, p, state=None, seed=None):
    """cuDNN's dropout with NumPy's generator for its RNG: the mask is the seed's, the seed read from the words the
    handler got (``seed_from_words``, as the real declaration reads them)."""
    assert state is None and seed is not None
    s = dropout_mod.seed_from_words(np.asarray(seed))
    SEEDS.append(s)
    mask = np.random.default_rng(s).random(x.shape) >= p
    return (x * mask / (1 - p),), {"reserve": mask.astype(np.uint8).reshape(-1)}


def _drop_bwd(res, douts, needs, *, p, state=None):
    (dy,) = douts
    return (dy * res["reserve"].reshape(dy.shape) / (1 - p),)


def _drop_meta(x, *, p, state=None, seed=None):
    autograd.get("dropout").meta(x, p=p, state=state, seed=seed)  # the real declaration's checks
    return (new_like(x),), {"reserve": _s((int(np.prod(x.shape)),), "uint8")}


DROP = _ops.JaxOp(Differentiable("dropout", "dropout_forward", ("x",), ("out",), _drop_fwd, _drop_bwd, _drop_meta,
                                  arrays=("seed",)), NumpyRunner(), namespace="cudnnkit_jaxnnmore")  # fmt: skip


@pytest.fixture
def standin_dropout(monkeypatch):
    real = cj.op
    monkeypatch.setattr(cj, "op", lambda name: DROP if name == "dropout" else real(name))
    SEEDS.clear()


def test_the_dropout_declaration_takes_a_seed_array():
    d = autograd.get("dropout")
    assert d.arrays == ("seed",) and d.inputs == ("x",)
    (y,), res = d.meta(_s((3, 4)), p=0.5, seed=_s((2,), "int32"))
    assert y == _s((3, 4)) and set(res) == {"reserve"}
    with pytest.raises(TypeError, match=r"seed must be an int32 array of shape \(1,\) or \(2,\)"):
        d.meta(_s((3, 4)), p=0.5, seed=_s((2,), "int64"))
    with pytest.raises(TypeError, match="seed must be an int32 array"):
        d.meta(_s((3, 4)), p=0.5, seed=_s((3,), "int32"))
    with pytest.raises(ValueError, match="pass state= .* or seed= .* not both"):
        d.meta(_s((3, 4)), p=0.5, seed=_s((2,), "int32"), state=object())
    assert dropout_mod.seed_from_words(np.array([-1, 1], np.int32)) == 0x1_FFFFFFFF
    assert dropout_mod.seed_from_words(np.array([7], np.int32)) == 7
    with pytest.raises(ValueError, match="one or two 32-bit words"):
        dropout_mod.seed_from_words(np.zeros(3, np.int32))


def test_dropout_traces_with_the_key_as_a_device_operand():
    key = jax.random.key(0)
    x = jax.ShapeDtypeStruct((4, 6), jnp.float32)
    out = jax.eval_shape(lambda k, a: nn.dropout(k, 0.3, a), key, x)
    assert (out.shape, out.dtype) == ((4, 6), jnp.float32)
    text = str(jax.make_jaxpr(jax.jit(lambda k, a: nn.dropout(k, 0.3, a)))(key, jnp.ones((4, 6), jnp.float32)))
    assert "random_bits" in text and "bitcast_convert_type" in text and "cudnnkit_dropout" in text
    # the seed is an operand of the FFI call (an int32[2] buffer), never an attribute fixed at trace time
    assert "i32[2]" in text and "'seed'" in text
    old = jax.random.PRNGKey(3)  # a raw uint32[2] key works too
    assert jax.eval_shape(lambda k, a: nn.dropout(k, 0.5, a), old, x).shape == (4, 6)


def test_dropout_same_key_same_mask_and_the_grad_uses_it(standin_dropout):
    x = _r((64, 50), 1)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    f = jax.jit(lambda k, a: nn.dropout(k, 0.4, a))
    y1, y1b, y2 = f(k1, x), f(k1, x), f(k2, x)
    assert np.array_equal(np.asarray(y1), np.asarray(y1b)) and not np.array_equal(np.asarray(y1), np.asarray(y2))
    assert len(set(SEEDS)) == 2  # two keys, two seeds, read in the handler from the traced key's bits
    kept = np.asarray(y1) != 0
    np.testing.assert_allclose(np.asarray(y1)[kept], np.asarray(x)[kept] / 0.6, rtol=1e-12)
    assert abs(kept.mean() - 0.6) < 0.05
    ct = _r((64, 50), 2)
    g = jax.jit(jax.grad(lambda a, k: (nn.dropout(k, 0.4, a) * ct).sum()))(x, k1)
    np.testing.assert_allclose(np.asarray(g), np.where(kept, np.asarray(ct) / 0.6, 0.0), rtol=1e-12)


def test_dropout_shortcuts_and_refusals(standin_dropout):
    key, x = jax.random.key(0), _r((3, 4))
    assert nn.dropout(key, 0.5, x, deterministic=True) is x
    assert nn.dropout(key, 0.0, x) is x
    assert np.array_equal(np.asarray(nn.dropout(key, 1.0, x)), np.zeros((3, 4)))
    assert not SEEDS  # none of them calls cuDNN
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\], got 1.5"):
        nn.dropout(key, 1.5, x)
    with pytest.raises(TypeError, match="rate is a traced value"):
        jax.jit(lambda r: nn.dropout(key, r, x))(0.5)
    with pytest.raises(NotImplementedError, match="dropout: jax.vmap has no batching rule"):
        jax.vmap(lambda k: nn.dropout(k, 0.5, x))(jax.random.split(key, 2))


# ----------------------------------------------------------------- the params pytree and cuDNN's flat buffer

CONFIGS = [
    ("lstm", dict()),
    ("lstm", dict(num_layers=2, bidirectional=True)),
    ("lstm", dict(proj_size=3, num_layers=2, bidirectional=True)),
    ("gru", dict(num_layers=2)),
    ("tanh", dict(bias=False, bidirectional=True)),
    ("relu", dict()),
]


@pytest.mark.parametrize("cell, kw", CONFIGS)
def test_pack_and_unpack_round_trip(cell, kw):
    p = nn.init_params(jax.random.key(0), cell, 5, 6, dtype=jnp.float64, **kw)
    cfg = R.config(p, cell)
    assert (cfg.cell, cfg.input_size, cfg.hidden_size, cfg.num_layers, cfg.bidirectional, cfg.proj_size) == (
        cell, 5, 6, kw.get("num_layers", 1), kw.get("bidirectional", False), kw.get("proj_size", 0))  # fmt: skip
    assert cfg.bias_mode == ("double" if kw.get("bias", True) else "none") and cfg.dtype == "float64"
    w = nn.pack_params(p, cell)
    count, pieces = R.weight_layout(cfg, source="model")
    assert w.shape == (count,) and w.dtype == jnp.float64
    assert sum(pc.size for pc in pieces) == count  # the model has no gaps
    back = nn.unpack_params(w, cfg)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(p)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(p)):
        assert a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b))
    w2 = jnp.arange(count, dtype=jnp.float64)  # and the other way round: every element lands somewhere
    assert np.array_equal(np.asarray(nn.pack_params(nn.unpack_params(w2, cfg), cell)), np.asarray(w2))


def test_packing_is_differentiable_and_traces():
    p = nn.init_params(jax.random.key(1), "gru", 3, 4, num_layers=2, dtype=jnp.float64)
    n = R.weight_layout(R.config(p, "gru"))[0]
    c = _r((n,), 3)
    g = jax.grad(lambda q: (nn.pack_params(q, "gru") * c).sum())(p)
    back = nn.unpack_params(c, R.config(p, "gru"))
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(back)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), p)
    assert jax.eval_shape(lambda q: nn.pack_params(q, "gru"), shapes).shape == (n,)


def test_the_model_layout_is_cudnns_order():
    """Every pseudo-layer's matrices (linear ids in order), then every pseudo-layer's biases: the order cuDNN 9.19
    gave on the GPU (its offsets are compared with the model there)."""
    p = nn.init_params(jax.random.key(0), "lstm", 2, 3, num_layers=1, bidirectional=True)
    _, pieces = R.weight_layout(R.config(p, "lstm"), source="model")
    got = [(pc.direction, pc.key, pc.row) for pc in pieces]
    mats = [(k, r) for k in ("w_ih", "w_hh") for r in (0, 3, 6, 9)]
    biases = [(k, r) for k in ("b_ih", "b_hh") for r in (0, 3, 6, 9)]
    assert got == [(d, *k) for d in (0, 1) for k in mats] + [(d, *k) for d in (0, 1) for k in biases]
    assert [pc.offset for pc in pieces][:3] == [0, 6, 12] and pieces[16].offset == 2 * (12 * 2 + 12 * 3)


def test_config_refusals_name_the_parameter():
    p = nn.init_params(jax.random.key(0), "lstm", 5, 6, num_layers=2)
    bad = [[dict(d) for d in layer] for layer in p]
    bad[1][0]["w_hh"] = jnp.zeros((24, 5), jnp.float32)
    with pytest.raises(ValueError, match=r"params\[1\]\[0\]\['w_hh'\] has shape \(24, 5\)"):
        R.config(bad, "lstm")
    bad = [[dict(d) for d in layer] for layer in p]
    del bad[1][0]["b_ih"]
    with pytest.raises(ValueError, match="same biases and projection"):
        R.config(bad, "lstm")
    bad = [[dict(d) for d in layer] for layer in p]
    bad[0][0]["b_hh"] = bad[0][0]["b_hh"].astype(jnp.float64)
    with pytest.raises(TypeError, match=r"params\[0\]\[0\]\['b_hh'\] has dtype float64"):
        R.config(bad, "lstm")
    with pytest.raises(ValueError, match="params\\[0\\]\\[0\\] has keys \\['w_xx'\\]"):
        R.config([[dict(p[0][0], w_xx=1)]], "lstm")
    with pytest.raises(ValueError, match="cell must be one of"):
        R.config(p, "lstmx")
    with pytest.raises(TypeError, match="params must be a non-empty list of layers"):
        R.config(p[0][0], "lstm")
    with pytest.raises(ValueError, match=r"w_hh'\] has shape \(25, 6\); a gru needs \(3 \* H, P\)"):
        R.config([[{"w_ih": jnp.zeros((25, 5)), "w_hh": jnp.zeros((25, 6))}]], "gru")


# ----------------------------------------------------------------- lstm / gru / rnn through the scan stand-in


def _standin_rnn(x, w, hx, cx, *, rnn, training, layout, seq_lengths):
    """The ``rnn`` op as the lax.scan reference over the unpacked buffer (the model layout on this machine)."""
    assert training is False and layout in ("seq_major", "batch_major")
    params = nn.unpack_params(w, rnn)
    y, hy, cy = ref.run(rnn.cell, params, x, hx, cx, time_major=layout == "seq_major", seq_lengths=seq_lengths)
    return y, hy, (cy if cy is not None else jnp.zeros((0,), x.dtype))


@pytest.fixture
def standin_rnn(monkeypatch):
    real = cj.op
    monkeypatch.setattr(cj, "op", lambda name: _standin_rnn if name == "rnn" else real(name))


CALLS = [
    ("lstm", dict(), dict()),
    ("lstm", dict(num_layers=2, bidirectional=True), dict(time_major=True, seq_lengths=(5, 3, 1))),
    ("lstm", dict(proj_size=2, num_layers=2), dict(states=True)),
    ("gru", dict(bidirectional=True), dict(seq_lengths=(5, 5, 2), states=True)),
    ("tanh", dict(num_layers=2), dict(time_major=True)),
    ("relu", dict(bias=False), dict(states=True)),
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


@pytest.mark.parametrize("cell, arch, kw", CALLS)
def test_the_functions_equal_the_scan_reference_values_and_grads(standin_rnn, cell, arch, kw):
    kw = dict(kw)
    states = kw.pop("states", False)
    p = nn.init_params(jax.random.key(2), cell, 4, 5, dtype=jnp.float64, **arch)
    cfg = R.config(p, cell)
    N, T = 3, 5
    x = _r((T, N, 4) if kw.get("time_major") else (N, T, 4), 4)
    h0 = _r(cfg.hidden_shape(N), 5) if states else None
    c0 = _r(cfg.cell_shape(N), 6) if states and cell == "lstm" else None
    got = jax.jit(lambda q, a, h, c: _call(cell, q, a, h, c, kw))(p, x, h0, c0)
    want = jax.jit(lambda q, a, h, c: ref.run(cell, q, a, h, c, time_major=kw.get("time_major", False),
                                              seq_lengths=kw.get("seq_lengths")))(p, x, h0, c0)  # fmt: skip
    D = 2 if arch.get("bidirectional") else 1
    assert got[0].shape == ((T, N) if kw.get("time_major") else (N, T)) + (D * cfg.output_size,)
    for a, b in zip(got, want):
        if b is not None:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)

    def loss(f):
        return lambda q, a: sum((o**2).sum() for o in f(q, a) if o is not None)

    g = jax.jit(jax.grad(loss(lambda q, a: _call(cell, q, a, h0, c0, kw)), argnums=(0, 1)))(p, x)
    gr = jax.jit(jax.grad(loss(lambda q, a: ref.run(cell, q, a, h0, c0, time_major=kw.get("time_major", False),
                                                    seq_lengths=kw.get("seq_lengths"))), argnums=(0, 1)))(p, x)  # fmt: skip
    for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(gr)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_lstm_shapes_under_eval_shape(standin_rnn):
    p = nn.init_params(jax.random.key(0), "lstm", 8, 16, num_layers=3, bidirectional=True, proj_size=4)
    sds = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), p)
    x = jax.ShapeDtypeStruct((7, 20, 8), jnp.float32)
    y, (h, c) = jax.eval_shape(lambda q, a: nn.lstm(q, a), sds, x)
    assert (y.shape, h.shape, c.shape) == ((7, 20, 8), (6, 7, 4), (6, 7, 16))
    y, h = jax.eval_shape(lambda q, a: nn.gru(q, a, time_major=True),
                          jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                                 nn.init_params(jax.random.key(0), "gru", 8, 6)), x)  # fmt: skip
    assert (y.shape, h.shape) == ((7, 20, 6), (1, 20, 6))


def test_rnn_refusals_name_the_argument(standin_rnn):
    p = nn.init_params(jax.random.key(0), "lstm", 4, 5)
    x = _r((3, 6, 4), 0, jnp.float32)
    with pytest.raises(TypeError, match="seq_lengths is a traced array"):
        jax.jit(lambda a, n: nn.lstm(p, a, seq_lengths=n))(x, jnp.array([6, 5, 4]))
    with pytest.raises(ValueError, match="seq_lengths has 2 values but x has a batch of 3"):
        nn.lstm(p, x, seq_lengths=(6, 5))
    with pytest.raises(ValueError, match=r"h0 has shape \(1, 2, 5\); this network needs \(1, 3, 5\)"):
        nn.lstm(p, x, jnp.zeros((1, 2, 5), jnp.float32))
    with pytest.raises(ValueError, match="c0 without h0"):
        nn.lstm(p, x, None, jnp.zeros((1, 3, 5), jnp.float32))
    with pytest.raises(TypeError, match="x has dtype bfloat16; cuDNN's RNN takes float16, float32 or float64"):
        nn.lstm(p, x.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match=r"params\[0\]\[0\]\['b_hh'\] has dtype float32 but the RNN's is float64"):
        nn.lstm(p, x.astype(jnp.float64))
    with pytest.raises(ValueError, match="x has 3 features but params"):
        nn.lstm(p, x[..., :3])
    with pytest.raises(ValueError, match="x must be 3-d"):
        nn.lstm(p, x[0])
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
        nn.rnn(nn.init_params(jax.random.key(0), "tanh", 4, 5), x, nonlinearity="gelu")
    with pytest.raises(ValueError, match="cell_clip clips the LSTM cell state"):
        R.config(nn.init_params(jax.random.key(0), "gru", 4, 5), "gru", cell_clip=1.0)


# ----------------------------------------------------------------- flax's OptimizedLSTMCell


def _flax_params(n_in, H, seed=0):
    rng = np.random.default_rng(seed)
    p = {f"i{g}": {"kernel": jnp.asarray(rng.standard_normal((n_in, H)))} for g in "ifgo"}
    p |= {f"h{g}": {"kernel": jnp.asarray(rng.standard_normal((H, H))), "bias": jnp.asarray(rng.standard_normal(H))}
          for g in "ifgo"}  # fmt: skip
    return p


def test_flax_converters_round_trip_exactly():
    fp = _flax_params(3, 4)
    ours = nn.from_flax_lstm(fp)
    assert set(ours[0][0]) == {"w_ih", "w_hh", "b_hh"} and R.config(ours, "lstm").bias_mode == "single_recurrent"
    assert ours[0][0]["w_ih"].shape == (16, 3) and np.array_equal(np.asarray(ours[0][0]["w_ih"][4:8]),
                                                                  np.asarray(fp["if"]["kernel"]).T)  # fmt: skip
    for wrapped in (fp, {"cell": fp}, {"params": {"cell": fp}}):
        back = nn.to_flax_lstm(nn.from_flax_lstm(wrapped))
        assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(fp)
        for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(fp)):
            assert np.array_equal(np.asarray(a), np.asarray(b))
    two = nn.from_flax_lstm([fp, _flax_params(4, 4, 1)])  # a stack of cells: layers
    assert R.config(two, "lstm").num_layers == 2


def test_flax_converted_params_compute_flaxs_lstm():
    """The converted pytree through the scan reference equals flax's OptimizedLSTMCell equations (its source,
    written out), and to_flax_lstm of a torch-style pytree (two biases) folds them into one, the same function."""
    fp = _flax_params(3, 4, 2)
    x = _r((2, 6, 3), 7)
    y, (c, h) = ref.flax_optimized_lstm(fp, x)
    got, hy, cy = ref.run("lstm", nn.from_flax_lstm(fp), x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(y), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(hy[0]), np.asarray(h), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.asarray(cy[0]), np.asarray(c), rtol=1e-12, atol=1e-13)
    torch_style = nn.init_params(jax.random.key(3), "lstm", 3, 4, dtype=jnp.float64)
    y2, _ = ref.flax_optimized_lstm(nn.to_flax_lstm(torch_style), x)
    np.testing.assert_allclose(np.asarray(y2), np.asarray(ref.run("lstm", torch_style, x)[0]), rtol=1e-12,
                               atol=1e-13)  # fmt: skip


def test_flax_converter_refusals():
    with pytest.raises(ValueError, match="not an OptimizedLSTMCell's params"):
        nn.from_flax_lstm({"ii": {"kernel": jnp.zeros((3, 4))}})
    bad = _flax_params(3, 4)
    bad["ii"] = dict(bad["ii"], bias=jnp.zeros(4))
    with pytest.raises(ValueError, match="ii has a bias"):
        nn.from_flax_lstm(bad)
    with pytest.raises(ValueError, match="to_flax_lstm: an OptimizedLSTMCell is one layer, one direction"):
        nn.to_flax_lstm(nn.init_params(jax.random.key(0), "lstm", 3, 4, num_layers=2))
    with pytest.raises(ValueError, match="proj_size=2"):
        nn.to_flax_lstm(nn.init_params(jax.random.key(0), "lstm", 3, 4, proj_size=2))


# ----------------------------------------------------------------- ctc_loss


def _ctc_sds(B=2, T=10, K=6, N=4):
    return (jax.ShapeDtypeStruct((B, T, K), jnp.float32), jax.ShapeDtypeStruct((B, T), jnp.float32),
            jax.ShapeDtypeStruct((B, N), jnp.int32), jax.ShapeDtypeStruct((B, N), jnp.float32))  # fmt: skip


def test_ctc_loss_traces_with_lengths_and_labels_as_device_operands():
    out = jax.eval_shape(nn.ctc_loss, *_ctc_sds())
    assert (out.shape, out.dtype) == ((2,), jnp.float32)
    args = [jnp.zeros(s.shape, s.dtype) for s in _ctc_sds()]
    text = str(jax.make_jaxpr(jax.jit(jax.grad(lambda lg, *a: nn.ctc_loss(lg, *a).sum())))(*args))
    # labels (B, N) padded and the two length vectors are operands of the forward target, not attributes
    assert "cudnnkit_ctc_loss" in text and "cudnnkit_ctc_loss_backward" in text
    assert "'labels', 'label_lengths', 'input_lengths'" in text or "('__arr__', ('labels'" in text
    assert jax.eval_shape(nn.ctc_loss, *(jax.ShapeDtypeStruct(s.shape, jnp.float64 if i == 0 else s.dtype)
                                         for i, s in enumerate(_ctc_sds()))).dtype == jnp.float64  # fmt: skip


def test_ctc_loss_skips_padded_frames_wherever_they_are_as_optax(monkeypatch):
    """optax skips a padded frame anywhere in the sequence; cuDNN reads each sample's first input_length frames:
    the valid frames reach the op at the front, in their order, and the padded frames get no gradient. A stand-in
    op weighs frame j's class-0 logit by j + 1, so the order shows in the cost."""
    T = 7

    def standin(x, *, labels, label_lengths, input_lengths):
        t = jnp.arange(T)[:, None]
        return (jnp.where(t < input_lengths[None, :], x[:, :, 0], 0.0) * (t + 1)).sum(0)

    monkeypatch.setattr(cj, "op", lambda name: standin)
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.standard_normal((3, T, 4)), jnp.float32)
    pads = jnp.asarray([[0, 1, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0]], jnp.float32)
    labels, lpad = jnp.ones((3, 2), jnp.int32), jnp.zeros((3, 2), jnp.float32)
    got = nn.ctc_loss(logits, pads, labels, lpad)
    want = []
    for b in range(3):
        valid = [t for t in range(T) if pads[b, t] == 0]
        want.append(sum((j + 1) * float(logits[b, t, 0]) for j, t in enumerate(valid)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    g = jax.grad(lambda lg: nn.ctc_loss(lg, pads, labels, lpad).sum())(logits)
    assert (np.asarray(g)[np.asarray(pads) == 1] == 0).all()  # padded frames: no gradient
    assert (np.asarray(g)[..., 0][np.asarray(pads) == 0] > 0).all()


def test_ctc_loss_refusals():
    lg, lp, lab, lbp = _ctc_sds()
    with pytest.raises(NotImplementedError, match="blank_id=5; cuDNN's CTC loss always uses class 0"):
        jax.eval_shape(lambda *a: nn.ctc_loss(*a, blank_id=5), lg, lp, lab, lbp)
    with pytest.raises(ValueError, match=r"logit_paddings has shape \(2, 9\); it must be \(2, 10\)"):
        jax.eval_shape(nn.ctc_loss, lg, jax.ShapeDtypeStruct((2, 9), jnp.float32), lab, lbp)
    with pytest.raises(ValueError, match="labels must be \\(B, N\\) with B=2"):
        jax.eval_shape(nn.ctc_loss, lg, lp, jax.ShapeDtypeStruct((3, 4), jnp.int32), lbp)
    with pytest.raises(TypeError, match="labels must be integers"):
        jax.eval_shape(nn.ctc_loss, lg, lp, jax.ShapeDtypeStruct((2, 4), jnp.float32), lbp)


def test_the_ctc_declaration_takes_padded_labels():
    m = autograd.get("ctc_loss").meta
    i32 = lambda *sh: _s(sh, "int32")  # noqa: E731
    (costs,), _ = m(_s((6, 2, 5)), labels=i32(2, 3), label_lengths=i32(2), input_lengths=i32(2))
    assert costs.shape == (2,)
    with pytest.raises(ValueError, match="labels has 3 rows but x has a batch of N=2"):
        m(_s((6, 2, 5)), labels=i32(3, 3), label_lengths=i32(2), input_lengths=i32(2))
    with pytest.raises(ValueError, match=r"labels must be a 1-d \(packed\) or 2-d \(N, S\) \(padded\) integer"):
        m(_s((6, 2, 5)), labels=i32(2, 3, 1), label_lengths=i32(2), input_lengths=i32(2))
    lab = np.array([[1, 2, 9], [3, 0, 0]])
    assert ctc_mod._unpad(lab, np.array([2, 1]), 2).tolist() == [1, 2, 3]
    assert ctc_mod._unpad(lab, np.array([3, 0]), 2).tolist() == [1, 2, 9]
    with pytest.raises(ValueError, match=r"label_lengths\[1\] is 4 but labels \(2-d, padded\) has rows of S=3"):
        ctc_mod._unpad(lab, np.array([1, 4]), 2)
    with pytest.raises(ValueError, match="must be 1-d or 2-d"):
        ctc_mod._host_ints(np.zeros((2, 2, 2), np.int32), "labels", (1, 2))
