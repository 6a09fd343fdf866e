"""cudnnkit.jax.nn's translations (dimension numbers, JAX padding, channel-last layouts, flax's momentum) on the
CPU: each function calls one cudnnkit op; here that op is a stand-in computing cuDNN's channels-first semantics
with ``jax.lax``, so the results must equal JAX's/flax's own on the original layout. The real ops run the same
translations on the GPU (tests/gpu/test_jax_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cudnnkit.jax as cj  # noqa: E402
from cudnnkit.jax import nn  # noqa: E402
from cudnnkit.jax._ops import Permuted  # noqa: E402

CALLED: list[tuple[str, dict]] = []
#: per call: the op and, per positional operand, the perm it was passed with (None: a plain array)
PERMUTED: list[tuple[str, tuple]] = []


def _conv_nchw(x, w, bias, *, stride, padding, dilation, groups):
    assert all(isinstance(p, tuple) and len(p) == 2 for p in padding)  # explicit per-side pairs reach cuDNN
    y = jax.lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation, feature_group_count=groups,
                                     precision=jax.lax.Precision.HIGHEST)  # channels-first, as cuDNN's  # fmt: skip
    return y if bias is None else y + bias.reshape((1, -1) + (1,) * (x.ndim - 2))


def _pool_nchw(x, *, mode, window, stride, padding):
    full_w, full_s = (1, 1, *window), (1, 1, *stride)
    pads = ((0, 0), (0, 0), *padding)
    if mode == "max":
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, full_w, full_s, pads)
    s = jax.lax.reduce_window(x, 0.0, jax.lax.add, full_w, full_s, pads)
    if mode == "avg_include_padding":
        return s / np.prod(window)
    return s / jax.lax.reduce_window(jnp.ones_like(x), 0.0, jax.lax.add, full_w, full_s, pads)


def _norm(x, scale, bias=None, *, normalized_shape_ndim, epsilon, rms=False):
    ax = tuple(range(x.ndim - normalized_shape_ndim, x.ndim))
    if rms:
        return x / jnp.sqrt((x**2).mean(ax, keepdims=True) + epsilon) * scale
    m, v = x.mean(ax, keepdims=True), x.var(ax, keepdims=True)
    return (x - m) / jnp.sqrt(v + epsilon) * scale + bias


def _bn_nc(
    x, scale, bias, z, *, running_mean, running_var, training, momentum, epsilon, activation=None, propagate_nan=False
):
    ax = (0, *range(2, x.ndim))
    sh = (1, -1) + (1,) * (x.ndim - 2)
    if training:
        m, v = x.mean(ax), x.var(ax)
        n = x.size // x.shape[1]
        nm = (1 - momentum) * running_mean + momentum * m
        nv = (1 - momentum) * running_var + momentum * v * n / (n - 1)
    else:
        m, v, nm, nv = running_mean, running_var, running_mean, running_var
    y = (x - m.reshape(sh)) / jnp.sqrt(v.reshape(sh) + epsilon) * scale.reshape(sh) + bias.reshape(sh)
    if activation == "relu":  # jnp.maximum returns NaN for a NaN: the rule propagate_nan asks cuDNN for
        assert propagate_nan is True
        y = jnp.maximum(y if z is None else y + z, 0)
    return y, nm, nv


STANDINS = {
    "convolution": _conv_nchw,
    "pooling": _pool_nchw,
    "softmax": lambda x, *, axis, log: (jax.nn.log_softmax if log else jax.nn.softmax)(x, axis=axis),
    "layer_norm": lambda x, s, b, **kw: _norm(x, s, b, **kw),
    "rms_norm": lambda x, s, **kw: _norm(x, s, rms=True, **kw),
    "batch_norm": _bn_nc,
    "sdpa": lambda q, k, v, *, scale, causal: _sdpa_bhsd(q, k, v, scale, causal),
    "attention": lambda q, k, v, mask, sink, **kw: _attention_bhsd(q, k, v, mask, sink, **kw),
}


def _attention_bhsd(q, k, v, mask, sink, *, scale, is_causal, enable_gqa, left_bound=None, right_bound=None,
                    seq_len_q=None, seq_len_kv=None, skip_rows=None):  # fmt: skip
    """cuDNN's attention variants in (B, H, S, D): grouped key/value heads (query head i reads head i // (H / K)),
    the additive mask, the band ``row - left_bound < col <= row + right_bound`` (causal: right 0), padding lengths
    ((B, 1, 1, 1) int32: keys past ``seq_len_kv`` masked; what cuDNN leaves undefined made garbage: rows past
    ``seq_len_q`` 12345, and the gradients of q's, k's and v's padded rows nonzero), float32. A row within the
    lengths with no key gives NaN (undefined in cuDNN: the caller must not ask for one)."""
    if seq_len_q is not None:
        rows_q = jnp.arange(q.shape[2])[None, None, :, None] < seq_len_q
        o = _attention_bhsd(q, k, v, mask, sink, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa,
                            left_bound=left_bound, right_bound=right_bound, seq_len_kv=seq_len_kv,
                            skip_rows=~rows_q)  # fmt: skip
        rows_kv = jnp.arange(k.shape[2])[None, None, :, None] < seq_len_kv
        pad = sum(
            jnp.where(ok, 0.0, x.astype(jnp.float32)).sum() for x, ok in ((q, rows_q), (k, rows_kv), (v, rows_kv))
        )
        leak = pad - jax.lax.stop_gradient(pad)  # 0, with a gradient of 1 on every padded row's element
        return (jnp.where(rows_q, o.astype(jnp.float32), 12345.0) + leak).astype(q.dtype)
    if seq_len_kv is not None:
        cols = jnp.arange(k.shape[2])[None, None, None, :] < seq_len_kv
        pad_mask = jnp.where(cols, 0.0, -jnp.inf)
        mask = pad_mask if mask is None else mask.astype(jnp.float32) + pad_mask
    assert sink is None  # the functional API passes none
    h, kh = q.shape[1], k.shape[1]
    assert enable_gqa == (kh != h)
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    k32, v32 = jnp.repeat(k32, h // kh, axis=1), jnp.repeat(v32, h // kh, axis=1)
    s = jnp.einsum("bhtd,bhsd->bhts", q32, k32) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if mask is not None:
        s = s + mask.astype(jnp.float32)
    t, n = s.shape[-2:]
    row, col = np.arange(t)[:, None], np.arange(n)[None, :]
    keep = np.ones((t, n), bool)
    right = 0 if is_causal else right_bound
    if right is not None:
        keep &= col <= row + right
    if left_bound is not None:
        keep &= col > row - left_bound
    s = jnp.where(keep, s, -jnp.inf)
    if skip_rows is not None:  # rows past seq_len_q: not computed (finite scores, so no NaN reaches a gradient)
        s = jnp.where(skip_rows, 0.0, s)
    return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s, axis=-1), v32).astype(q.dtype)


def _sdpa_bhsd(q, k, v, scale, causal):
    """cuDNN's attention in its (B, H, S, D) layout, one kv head broadcast, float32 math."""
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bhtd,bhsd->bhts", q32, jnp.broadcast_to(k32, (*q.shape[:2], *k.shape[2:])))
    s = s * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        t, n = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((t, n), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhts,bhsd->bhtd", p, jnp.broadcast_to(v32, (*q.shape[:2], *v.shape[2:]))).astype(q.dtype)


@pytest.fixture(autouse=True)
def standins(monkeypatch):
    def op(name):
        def call(*a, **kw):
            CALLED.append((name, kw))
            PERMUTED.append((name, tuple(x.perm if isinstance(x, Permuted) else None for x in a)))
            # a Permuted operand is the op's view transpose(value, perm): the stand-ins take it materialized
            a = tuple(jnp.transpose(x.value, x.perm) if isinstance(x, Permuted) else x for x in a)
            return STANDINS[name](*a, **kw)

        return call

    monkeypatch.setattr(cj, "op", op)
    CALLED.clear()
    PERMUTED.clear()
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _r(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


@pytest.mark.parametrize(
    "dn, xs, ws",
    [
        (("NCHW", "OIHW", "NCHW"), (2, 4, 9, 8), (6, 4, 3, 3)),
        (("NHWC", "HWIO", "NHWC"), (2, 9, 8, 4), (3, 3, 4, 6)),
        (("NHWC", "OIHW", "NCHW"), (2, 9, 8, 4), (6, 4, 3, 3)),
        (("CHWN", "IOHW", "HWCN"), (4, 9, 8, 2), (4, 6, 3, 3)),
    ],
)
@pytest.mark.parametrize("padding", ["SAME", "VALID", ((2, 0), (1, 1))])
def test_conv_general_dilated_matches_lax(dn, xs, ws, padding):
    x, w = _r(xs), _r(ws, 1)
    kw = dict(window_strides=(2, 1), padding=padding, rhs_dilation=(1, 2), dimension_numbers=dn)
    got = nn.conv_general_dilated(x, w, **kw)
    want = jax.lax.conv_general_dilated(x, w, **kw, precision=jax.lax.Precision.HIGHEST)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert CALLED[-1][0] == "convolution"


def test_conv_flax_layout_with_groups_and_bias():
    x, w, b = _r((2, 7, 6, 4)), _r((3, 3, 2, 6), 1), _r((6,), 2)
    got = nn.conv(x, w, b, strides=2, groups=2)
    want = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=2, precision=jax.lax.Precision.HIGHEST) + b  # fmt: skip
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_conv_refusals_name_the_argument():
    x, w = _r((1, 3, 5, 5)), _r((2, 3, 3, 3))
    with pytest.raises(NotImplementedError, match="lhs_dilation"):
        nn.conv_general_dilated(x, w, (1, 1), "SAME", lhs_dilation=(2, 2))
    with pytest.raises(NotImplementedError, match="batch_group_count=2"):
        nn.conv_general_dilated(x, w, (1, 1), "SAME", batch_group_count=2)
    with pytest.raises(ValueError, match="window_strides must have 2 entries"):
        nn.conv_general_dilated(x, w, (1, 1, 1), "SAME")


def _flax_pool(x, init, op, window, strides, padding):
    nsp = len(window)
    strides = strides or (1,) * nsp  # flax: stride 1 by default
    pads = jax.lax.padtype_to_pads(x.shape[1:-1], window, strides, padding) if isinstance(padding, str) else padding
    return jax.lax.reduce_window(x, init, op, (1, *window, 1), (1, *strides, 1), ((0, 0), *pads, (0, 0))), nsp


@pytest.mark.parametrize("padding", ["VALID", "SAME", ((1, 0), (0, 1))])
def test_pools_match_flax(padding):
    x = _r((2, 7, 6, 3))
    window, strides = (3, 2), (2, 2)
    want_max, _ = _flax_pool(x, -jnp.inf, jax.lax.max, window, strides, padding)
    np.testing.assert_allclose(np.asarray(nn.max_pool(x, window, strides, padding)), np.asarray(want_max))
    s, _ = _flax_pool(x, 0.0, jax.lax.add, window, strides, padding)
    np.testing.assert_allclose(np.asarray(nn.avg_pool(x, window, strides, padding)), np.asarray(s / 6), rtol=1e-6)
    cnt, _ = _flax_pool(jnp.ones_like(x), 0.0, jax.lax.add, window, strides, padding)
    got = nn.avg_pool(x, window, strides, padding, count_include_pad=False)
    np.testing.assert_allclose(np.asarray(got), np.asarray(s / cnt), rtol=1e-6)
    assert nn.max_pool(x[0], window, strides, padding).shape == want_max.shape[1:]  # unbatched
    dflt, _ = _flax_pool(x, -jnp.inf, jax.lax.max, window, None, padding)  # no strides: flax's stride 1
    np.testing.assert_allclose(np.asarray(nn.max_pool(x, window, padding=padding)), np.asarray(dflt))


def test_softmax_and_norms():
    x = _r((3, 5, 7))
    np.testing.assert_allclose(np.asarray(nn.softmax(x, axis=1)), np.asarray(jax.nn.softmax(x, axis=1)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(nn.log_softmax(x)), np.asarray(jax.nn.log_softmax(x)), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="where="):
        nn.softmax(x, where=x > 0)
    ln = nn.layer_norm(x, axes=(-2, -1))
    ax = (1, 2)
    want = (x - x.mean(ax, keepdims=True)) / jnp.sqrt(x.var(ax, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(ln), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert CALLED[-1] == ("layer_norm", {"normalized_shape_ndim": 2, "epsilon": 1e-6})
    rms = nn.rms_norm(x, jnp.full((7,), 2.0))
    np.testing.assert_allclose(np.asarray(rms), np.asarray(2 * x / jnp.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)),
                               rtol=1e-5)  # fmt: skip
    with pytest.raises(NotImplementedError, match="axes=0 are not the trailing ones"):
        nn.layer_norm(x, axes=0)


def test_batch_norm_explicit_state_with_flax_momentum():
    x = _r((4, 5, 5, 3))
    s, b, m, v = jnp.ones(3), jnp.zeros(3), jnp.zeros(3), jnp.ones(3)
    y, nm, nv = nn.batch_norm(x, s, b, m, v, training=True, momentum=0.9)
    mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
    np.testing.assert_allclose(np.asarray(y), np.asarray((x - mean) / jnp.sqrt(var + 1e-5)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nm), np.asarray(0.1 * mean), rtol=1e-5, atol=1e-7)
    assert CALLED[-1][1]["momentum"] == pytest.approx(0.1)
    y2, nm2, nv2 = nn.batch_norm(x, s, b, nm, nv, training=False)
    np.testing.assert_array_equal(np.asarray(nm2), np.asarray(nm))  # inference leaves the state as it was
    np.testing.assert_array_equal(np.asarray(nv2), np.asarray(nv))
    with pytest.raises(NotImplementedError, match="axis=0"):
        nn.batch_norm(x, s, b, m, v, training=True, axis=0)


def test_batch_norm_fused_relu_and_residual():
    """activation='relu' (and z, added before it) reach the op, z as a channels-last view like x; a z of another
    shape is refused by name, in the caller's layout, before any op runs."""
    x, z = _r((4, 5, 5, 3)), _r((4, 5, 5, 3), 1)
    s, b, m, v = jnp.full(3, 1.5), jnp.full(3, 0.2), jnp.zeros(3), jnp.ones(3)
    bn = (x - x.mean((0, 1, 2))) / jnp.sqrt(x.var((0, 1, 2)) + 1e-5) * 1.5 + 0.2
    PERMUTED.clear()
    y, _, _ = nn.batch_norm(x, s, b, m, v, training=True, activation="relu")
    np.testing.assert_allclose(np.asarray(y), np.asarray(jnp.maximum(bn, 0)), rtol=1e-4, atol=1e-5)
    assert CALLED[-1][1]["activation"] == "relu"
    y, _, _ = nn.batch_norm(x, s, b, m, v, training=True, activation="relu", z=z)
    np.testing.assert_allclose(np.asarray(y), np.asarray(jnp.maximum(bn + z, 0)), rtol=1e-4, atol=1e-5)
    assert PERMUTED[-1] == ("batch_norm", ((0, 3, 1, 2), None, None, (0, 3, 1, 2)))
    y, _, _ = nn.batch_norm(x, s, b, m, v, training=True)
    assert "activation" not in CALLED[-1][1] and float(y.min()) < 0
    n = len(CALLED)
    with pytest.raises(ValueError, match=r"z must have x's shape \(4, 5, 5, 3\), got \(4, 5, 5, 1\)"):
        nn.batch_norm(x, s, b, m, v, training=True, activation="relu", z=z[..., :1])
    assert len(CALLED) == n  # activation, z without it and z's dtype: the op's meta (tests/test_l3_norm_cpu.py)


@pytest.mark.parametrize("kv_heads, causal, s_len", [(4, False, 6), (2, True, 6), (1, False, 6), (4, True, 9),
                                                     (2, True, 4), (1, True, 3)])  # fmt: skip
def test_dot_product_attention_matches_jax(kv_heads, causal, s_len):
    """Also the causal triangle with T != S: JAX's is top-left aligned (row t keeps keys 0..t), as is cuDNN's
    default (the stand-ins')."""
    q = _r((2, 6, 4, 8)).astype(jnp.bfloat16)
    k, v = (_r((2, s_len, kv_heads, 8), i).astype(jnp.bfloat16) for i in (1, 2))
    got = nn.dot_product_attention(q, k, v, is_causal=causal, scale=0.3)
    want = jax.nn.dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                                        is_causal=causal, scale=0.3)  # fmt: skip
    assert got.shape == want.shape and got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    assert nn.dot_product_attention(q[0], k[0], v[0]).shape == (6, 4, 8)


@pytest.mark.parametrize("kw", [dict(local_window_size=(2, 0), is_causal=True), dict(local_window_size=(1, 1)),
                                dict(local_window_size=2, is_causal=True)])  # fmt: skip
def test_a_window_with_more_queries_than_keys_runs_under_cudnns_padding_mask(kw):
    """cuDNN takes left_bound with S_q > S_kv only with its padding mask: full lengths are passed (the result is
    jax.nn's, with T=6 queries over S=4 keys)."""
    q = _r((2, 6, 4, 8)).astype(jnp.bfloat16)
    k, v = (_r((2, 4, 4, 8), i).astype(jnp.bfloat16) for i in (1, 2))
    got = nn.dot_product_attention(q, k, v, scale=0.3, **kw)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.nn.dot_product_attention(*f32, scale=0.3, **kw)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    name, called = CALLED[-1]
    assert name == "attention" and "seq_len_q" in called and "seq_len_kv" in called


def test_a_fully_masked_row_is_the_mean_of_v_as_in_jax():
    q = _r((1, 6, 2, 8)).astype(jnp.bfloat16)
    mask = jnp.ones((1, 1, 6, 6), bool).at[:, :, 2, :].set(False)  # query row 2 sees no key
    got = nn.dot_product_attention(q, q, q, mask=mask)
    f32 = q.astype(jnp.float32)
    want = jax.nn.dot_product_attention(f32, f32, f32, mask=mask)
    assert np.isfinite(np.asarray(got, np.float32)).all()
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)


def test_dot_product_attention_takes_2d_and_3d_bias_and_mask_as_jax():
    """A (T, S) bias and an (N, T, S) mask get leading dims of 1, as jax.nn.dot_product_attention's; unbatched
    inputs too."""
    q = _r((2, 6, 4, 8)).astype(jnp.bfloat16)
    bias, mask = _r((6, 6), 5), jnp.asarray(np.random.default_rng(6).random((4, 6, 6)) > 0.3).at[..., 0].set(True)
    f32 = q.astype(jnp.float32)
    for args in ((bias, None), (None, mask), (bias, mask)):
        got = nn.dot_product_attention(q, q, q, *args)
        want = jax.nn.dot_product_attention(f32, f32, f32, *args)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
        got = nn.dot_product_attention(q[0], q[0], q[0], *args)
        want = jax.nn.dot_product_attention(f32[0], f32[0], f32[0], *args)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", ["bias", "mask", "bias+mask", "window", "causal-window", "gqa"])
def test_dot_product_attention_variants_match_jax(case):
    """bias (4-d, broadcast), a boolean mask, local_window_size (symmetric and with is_causal) and grouped heads
    reach the op "attention" as cuDNN takes them, and give jax.nn.dot_product_attention's result."""
    q = _r((2, 6, 4, 8)).astype(jnp.bfloat16)
    kvh = 2 if case == "gqa" else 4
    k, v = _r((2, 6, kvh, 8), 1).astype(jnp.bfloat16), _r((2, 6, kvh, 8), 2).astype(jnp.bfloat16)
    bias = _r((1, 4, 6, 6), 3) if "bias" in case else None
    mask = (
        jnp.asarray(np.random.default_rng(4).random((2, 1, 1, 6)) > 0.3).at[..., 0].set(True)
        if "mask" in case
        else None
    )
    kw = {"window": dict(local_window_size=(2, 1)), "causal-window": dict(local_window_size=2, is_causal=True)}.get(
        case, {}
    )
    got = nn.dot_product_attention(q, k, v, bias, mask, scale=0.3, **kw)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.nn.dot_product_attention(*f32, bias, mask, scale=0.3, **kw)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    name, called = CALLED[-1]
    assert name == "attention" and called["enable_gqa"] == (case == "gqa")
    want_bounds = {"window": {"left_bound": 3, "right_bound": 1}, "causal-window": {"left_bound": 3}}.get(case, {})
    assert {k_: called[k_] for k_ in ("left_bound", "right_bound") if k_ in called} == want_bounds
    # plain or causal calls with one head group stay on "sdpa"
    nn.dot_product_attention(q, q, q, is_causal=True)
    assert CALLED[-1][0] == "sdpa"


LENGTH_CASES = ["both", "query", "kv", "causal+bias", "gqa", "window", "window-no-lengths", "mask", "clipped"]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", LENGTH_CASES)
def test_dot_product_attention_sequence_lengths_as_jax(case, jit):
    """query_seq_lengths/key_value_seq_lengths reach the op "attention" as cuDNN's (B, 1, 1, 1) padding lengths
    (a zero length as 1; the query length cut where a window passes the last key), and the result and the
    gradients of q, k, v equal jax.nn.dot_product_attention's where cuDNN leaves them undefined (the stand-in makes
    those rows garbage, and a row with no key NaN): padded query rows 0 with no gradient, padded keys no gradient,
    a row with no key (a zero key/value length, a window past the keys, a mask over every valid key) the mean of
    v; lengths outside [0, T|S] clipped as JAX reads them; under jit the lengths are traced arguments."""
    b, t, s_, n = 4, 6, 5, 4
    kvh = 2 if case == "gqa" else 4
    q = _r((b, t, n, 8)).astype(jnp.bfloat16)
    k, v = _r((b, s_, kvh, 8), 1).astype(jnp.bfloat16), _r((b, s_, kvh, 8), 2).astype(jnp.bfloat16)
    ql = None if case in ("kv", "window-no-lengths") else jnp.array([6, 1, 3, 0], jnp.int32)
    kvl = None if case in ("query", "window-no-lengths") else jnp.array([5, 2, 0, 4], jnp.int32)
    kw = dict(scale=0.3)
    if case == "causal+bias":
        k, v, kw["bias"], kw["is_causal"] = q, _r((b, t, n, 8), 2).astype(jnp.bfloat16), _r((1, n, t, t), 3), True
        kvl = jnp.array([6, 2, 0, 4], jnp.int32)
    if case in ("window", "window-no-lengths"):
        kw["local_window_size"] = (0, 1)  # rows past length + 0 see no key
    if case == "mask":  # sample 0, row 2: its valid keys all masked; other rows keep some
        kw["mask"] = jnp.ones((b, 1, t, s_), bool).at[0, :, 2, :].set(False).at[1, :, :, 1:].set(False)
    if case == "clipped":
        ql, kvl = jnp.array([9, -2, 3, 6], jnp.int32), jnp.array([7, 2, -1, 5], jnp.int32)
    c = _r(q.shape, 7)

    def ours(q, k, v, ql, kvl):
        return nn.dot_product_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kvl, **kw)

    def loss(fn, q, k, v, ql, kvl):
        return (fn(q, k, v, ql, kvl).astype(jnp.float32) * c).sum()

    def theirs(q, k, v, ql, kvl):
        return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=ql, key_value_seq_lengths=kvl, **kw)

    run = jax.jit if jit else (lambda f: f)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    got, want = run(ours)(q, k, v, ql, kvl), theirs(*f32, ql, kvl)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
    name, called = CALLED[-1]
    assert name == "attention" and called["seq_len_q"].shape == (b, 1, 1, 1)
    if not jit:
        s_kv = k.shape[1]
        kv_full = np.clip(np.full(b, s_kv) if kvl is None else np.asarray(kvl), 0, s_kv)
        q_full = np.clip(np.full(b, t) if ql is None else np.asarray(ql), 0, t)
        left = kw.get("local_window_size", (None,))[0]
        reach = np.where(kv_full > 0, t if left is None else kv_full + left, 0)
        for key, want_len in (("seq_len_q", np.clip(np.minimum(q_full, reach), 1, t)),
                              ("seq_len_kv", np.maximum(kv_full, 1))):  # fmt: skip
            assert called[key].dtype == jnp.int32
            np.testing.assert_array_equal(np.asarray(called[key]).ravel(), want_len)
    g_got = run(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2)))(q, k, v, ql, kvl)
    g_want = jax.grad(lambda *a: loss(theirs, *a), argnums=(0, 1, 2))(*f32, ql, kvl)
    for name, x, y in zip("qkv", g_got, g_want):
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y), rtol=3e-2, atol=3e-2, err_msg=name)


def test_dot_product_attention_refusals_name_the_argument():
    q = _r((1, 4, 2, 8)).astype(jnp.bfloat16)
    with pytest.raises(ValueError, match=r"query_seq_lengths must be int32 of shape \(1,\)"):
        nn.dot_product_attention(q, q, q, query_seq_lengths=jnp.ones((1,), jnp.float32))
    with pytest.raises(ValueError, match=r"key_value_seq_lengths must be int32 of shape \(1,\), got int32 \(2,\)"):
        nn.dot_product_attention(q, q, q, key_value_seq_lengths=jnp.full((2,), 4, jnp.int32))
    with pytest.raises(TypeError, match="mask must be boolean"):
        nn.dot_product_attention(q, q, q, mask=jnp.ones((1, 2, 4, 4), jnp.float32))
    with pytest.raises(ValueError, match="bias must have 2 to 4 dims"):
        nn.dot_product_attention(q, q, q, bias=jnp.ones((4,)))
    with pytest.raises(ValueError, match=r"bias of shape \(1, 3, 4, 4\) does not broadcast"):
        nn.dot_product_attention(q, q, q, bias=jnp.ones((1, 3, 4, 4)))
    with pytest.raises(ValueError, match="local_window_size must be an int or"):
        nn.dot_product_attention(q, q, q, local_window_size=(1, -1))
    with pytest.raises(NotImplementedError, match="query has dtype float32"):
        nn.dot_product_attention(q.astype(jnp.float32), q, q)


def test_channels_last_operands_reach_the_ops_as_permuted_views():
    """The NHWC (and BTNH) arrays of the functional API are passed as Permuted views, not transposed in XLA:
    convolution's x, pooling's x, batch norm's x and attention's q/k/v (the weights are transposed)."""
    x = _r((2, 6, 6, 3))
    nn.conv(x, _r((3, 3, 3, 4), 1), padding="SAME")
    nn.max_pool(x, (2, 2), (2, 2))
    nn.batch_norm(x, jnp.ones(3), jnp.zeros(3), jnp.zeros(3), jnp.ones(3), training=True)
    q = _r((1, 8, 2, 16)).astype(jnp.bfloat16)
    nn.dot_product_attention(q, q, q)
    assert PERMUTED == [("convolution", ((0, 3, 1, 2), None, None)), ("pooling", ((0, 3, 1, 2),)),
                        ("batch_norm", ((0, 3, 1, 2), None, None, None)),
                        ("sdpa", ((0, 2, 1, 3), (0, 2, 1, 3), (0, 2, 1, 3)))]  # fmt: skip


@pytest.mark.parametrize("dtype, kw", [
    (jnp.float16, {}),
    (jnp.bfloat16, dict(is_causal=True)),
    (jnp.bfloat16, dict(local_window_size=(1, 1))),
    (jnp.bfloat16, dict(local_window_size=1, is_causal=True)),
])  # fmt: skip
def test_dot_product_attention_a_row_masked_whole_averages_v_as_jax(dtype, kw):
    """A boolean mask that leaves a query row no key gives JAX's uniform weights over all S keys, with no lengths
    given: cuDNN's additive mask does not (a float16 mask value does not swamp the scores; the band's keys are
    -inf), so the row is replaced. Before the fix: the softmax of the row's scores (float16) or the mean over the
    band's keys."""
    q, k, v = (_r((1, 6, 2, 8), i).astype(dtype) for i in range(3))
    mask = jnp.ones((1, 1, 6, 6), bool).at[0, 0, 2, :].set(False)
    got = nn.dot_product_attention(q, k, v, None, mask, **kw)
    want = jax.nn.dot_product_attention(*(x.astype(jnp.float32) for x in (q, k, v)), None, mask, **kw)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)


def test_dot_product_attention_a_bias_beyond_float16_is_clipped_and_the_mask_still_acts():
    """bias=-1e9 in float16 would be -inf (a row of it NaN): it is clipped, and the mask still removes its keys
    from such a row (a clip of bias + mask to the same value lost it). A row's constant bias does not change its
    softmax, so the row equals the one with that bias removed."""
    q, k, v = (_r((1, 4, 1, 8), i).astype(jnp.float16) for i in range(3))
    bias = jnp.zeros((1, 1, 4, 4)).at[0, 0, 1, :].set(-1e9)
    mask = jnp.ones((4, 4), bool).at[1, 0].set(False)
    seen = {}
    real = STANDINS["attention"]
    try:
        STANDINS["attention"] = lambda *a, **kw: seen.setdefault("mask", a[3]) is not None and real(*a, **kw)
        got = nn.dot_product_attention(q, k, v, bias, mask)
    finally:
        STANDINS["attention"] = real
    assert seen["mask"].dtype == jnp.float16 and bool(jnp.isfinite(seen["mask"]).all())
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    want = jax.nn.dot_product_attention(*f32, jnp.zeros((1, 1, 4, 4)), mask)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_layer_and_rms_norm_take_float32_parameters_for_half_data(dtype):
    """cuDNN's layer/RMS norm takes float32 scale and bias for half-precision data: the defaults are float32 and a
    half-precision scale is cast (flax's param_dtype=bfloat16). Before the fix, the real op refused them."""
    seen = []
    real_ln, real_rms = STANDINS["layer_norm"], STANDINS["rms_norm"]
    try:
        STANDINS["layer_norm"] = lambda x, s, b, **kw: seen.append((s.dtype, b.dtype)) or real_ln(x, s, b, **kw)
        STANDINS["rms_norm"] = lambda x, s, **kw: seen.append((s.dtype,)) or real_rms(x, s, **kw)
        x = _r((2, 5)).astype(dtype)
        nn.layer_norm(x)
        nn.layer_norm(x, jnp.ones(5, dtype))
        nn.rms_norm(x)
        nn.rms_norm(x, jnp.ones(5, dtype))
    finally:
        STANDINS["layer_norm"], STANDINS["rms_norm"] = real_ln, real_rms
    assert all(d == jnp.float32 for ds in seen for d in ds) and len(seen) == 4


def test_out_of_range_axes_raise_naming_them():
    x = _r((2, 3, 4))
    with pytest.raises(ValueError, match="layer_norm: axes must be <= 2, got 3"):
        nn.layer_norm(x, axes=3)
    with pytest.raises(ValueError, match="batch_norm: axis must be <= 2, got 5"):
        nn.batch_norm(x, jnp.ones(3), jnp.zeros(3), jnp.zeros(3), jnp.ones(3), training=True, axis=5)


@pytest.mark.parametrize("padding, pairs", [
    (1, ((1, 1), (1, 1))),
    ((1, 2), ((1, 1), (2, 2))),
    (((0, 1), 2), ((0, 1), (2, 2))),
])  # fmt: skip
def test_conv_takes_flaxs_int_padding_forms(padding, pairs):
    """flax's Conv takes an int (every side) and one int per dim (both sides) besides pairs and strings."""
    x, w = _r((2, 7, 6, 3)), _r((3, 3, 3, 4), 1)
    got = nn.conv(x, w, padding=padding)
    want = jax.lax.conv_general_dilated(x, w, (1, 1), pairs, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_conv_causal_padding_and_refused_padding_modes():
    x, w = _r((2, 9, 3)), _r((3, 3, 4), 1)
    got = nn.conv(x, w, padding="CAUSAL", dilation=2)
    want = jax.lax.conv_general_dilated(x, w, (1,), ((4, 0),), rhs_dilation=(2,),
                                        dimension_numbers=("NWC", "WIO", "NWC"))  # fmt: skip
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="CIRCULAR"):
        nn.conv(x, w, padding="CIRCULAR")
    with pytest.raises(ValueError, match="CAUSAL"):
        nn.conv(_r((1, 5, 5, 3)), _r((3, 3, 3, 4)), padding="CAUSAL")
    with pytest.raises(ValueError, match="padding"):
        nn.conv_general_dilated(x, w, (1,), "FULL", dimension_numbers=("NWC", "WIO", "NWC"))


@pytest.mark.parametrize("precision, tf32", [
    (None, True), (jax.lax.Precision.DEFAULT, True), (jax.lax.Precision.HIGHEST, False), ("highest", False),
    ("float32", False), ((jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST), False), ("bfloat16", True),
])  # fmt: skip
def test_conv_general_dilated_precision_highest_runs_without_tf32(monkeypatch, precision, tf32):
    """precision=HIGHEST (JAX's full float32) turns TF32 off for the call; otherwise cudnnkit.settings decide."""
    from cudnnkit.runtime import current_settings

    seen = []
    real = STANDINS["convolution"]
    monkeypatch.setitem(STANDINS, "convolution",
                        lambda *a, **kw: seen.append(current_settings().allow_tf32) or real(*a, **kw))  # fmt: skip
    x, w = _r((1, 3, 5, 5)), _r((4, 3, 3, 3), 1)
    nn.conv_general_dilated(x, w, (1, 1), "SAME", precision=precision)
    assert seen == [tf32]
    if precision is None:  # JAX's default precision, set by its context manager
        with jax.default_matmul_precision("highest"):
            nn.conv_general_dilated(x, w, (1, 1), "SAME")
        assert seen == [True, False]
