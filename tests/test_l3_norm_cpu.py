"""The normalizations' L3 declarations on the CPU: registration, meta against torch's shapes (and the samples of
tests/l3/norm.py against their torch references), the checks meta makes before any GPU work, and the forward and
backward wiring with NumPy stand-ins for the L2 calls (tests/norm_reference.py), against torch's autograd.

The fused ReLU's reserve (float16 channels-last) needs a cuDNN handle, so a GPU: not here."""

from __future__ import annotations

import numpy as np
import pytest

import cudnnkit.ops.layer_norm as LN
import cudnnkit.ops.normalization as N
from cudnnkit import autograd
from cudnnkit.ops._diff import DIFFERENTIABLE, Spec
from cudnnkit.runtime.arrays import contiguous_strides
from cudnnkit.runtime.view import ArrayView

from . import norm_reference as ref
from .l3 import norm as samples

torch = pytest.importorskip("torch")
F = torch.nn.functional


def S(shape, dtype="float32", strides=None):
    shape = tuple(shape)
    return Spec(shape, tuple(strides) if strides is not None else contiguous_strides(shape), dtype)


def _spec(a):
    return None if a is None else Spec(a.shape, tuple(s // a.itemsize for s in a.strides), str(a.dtype))


def _t(a, grad=False):
    return None if a is None else torch.from_numpy(np.copy(a, order="K")).requires_grad_(grad)


def _cl(shape):
    t = torch.empty(shape).contiguous(memory_format=torch.channels_last)
    return tuple(t.stride())


# ----------------------------------------------------------------- registration


@pytest.mark.parametrize(
    "name, primitive, inputs, arrays",
    [
        ("batch_norm", "batch_norm_forward", ("x", "scale", "bias", "z"), ("running_mean", "running_var")),
        ("layer_norm", "layer_norm_forward", ("x", "scale", "bias"), ()),
        ("rms_norm", "rms_norm_forward", ("x", "scale"), ()),
        ("instance_norm", "instance_norm_forward", ("x", "scale", "bias"), ()),
    ],
)
def test_registered(name, primitive, inputs, arrays):
    d = autograd.get(name)
    assert d is DIFFERENTIABLE[name]
    assert (d.primitive, d.inputs, d.outputs, d.arrays) == (primitive, inputs, ("y",), arrays)
    assert d.mutated == arrays and d.doc
    assert name in samples.SAMPLES and name in samples.TORCH_REFERENCE


# ----------------------------------------------------------------- meta against torch


def test_batch_norm_meta_matches_torch_nchw_and_channels_last():
    for shape, strides in (((2, 3, 4, 5), None), ((2, 3, 4, 5), _cl((2, 3, 4, 5)))):
        x = S(shape, "float64", strides)
        (y,), res = N._bn_l3_meta(x, S((3,), "float64"), S((3,), "float64"), running_mean=S((3,), "float64"),
                                  running_var=S((3,), "float64"), momentum=0.3)  # fmt: skip
        xt = torch.empty_strided(shape, x.strides, dtype=torch.float64).normal_()
        one, zero = torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
        yt, sm, si = torch.native_batch_norm(xt, one, zero, None, None, True, 0.1, 1e-5)
        assert y == Spec(tuple(yt.shape), tuple(yt.stride()), "float64")
        assert list(res) == ["x", "scale", "saved_mean", "saved_inv_std"] and res["x"] is x
        assert res["saved_mean"].shape == tuple(sm.shape) and res["saved_inv_std"].shape == tuple(si.shape)
        assert res["saved_mean"].dtype == "float64"


def test_batch_norm_meta_low_rank_per_activation_half_and_inference():
    (y,), res = N._bn_l3_meta(S((5, 3)), S((3,)), S((3,)))
    assert y == S((5, 3)) and res["saved_mean"] == S((3,))
    (y,), res = N._bn_l3_meta(S((4, 3, 2, 2)), S((3, 2, 2)), S((3, 2, 2)), mode="per_activation")
    assert y == S((4, 3, 2, 2)) and res["saved_inv_std"] == S((3, 2, 2))
    (y,), res = N._bn_l3_meta(S((4, 8, 2, 2), "float16"), S((8,)), S((8,)))  # NCHW half: no fused reserve asked
    assert y.dtype == "float16" and res["saved_mean"] == S((8,), "float32")
    kw = dict(running_mean=S((3,)), running_var=S((3,)), training=False)
    (y,), res = N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), **kw)
    assert y == S((2, 3, 4)) and list(res) == ["x", "scale", "mean", "var"] and res["var"] == S((3,))
    z = S((2, 3, 4))
    (y,), res = N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), z, activation="relu", **kw)
    assert list(res) == ["x", "scale", "mean", "var", "y", "z"] and res["y"] == y and res["z"] is z


def test_batch_norm_meta_relu_without_a_reserve_needs_no_gpu():
    """float32/float64, or C-order float16: never a kept reserve (see normalization._fusable), so no size query."""
    (y,), res = N._bn_l3_meta(S((2, 4, 3, 3)), S((4,)), S((4,)), S((2, 4, 3, 3)), activation="relu")
    assert list(res) == ["x", "scale", "saved_mean", "saved_inv_std", "y", "z"]
    cl = _cl((2, 4, 3, 3))
    (y,), res = N._bn_l3_meta(S((2, 4, 3, 3), "float32", cl), S((4,)), S((4,)), activation="relu")
    assert y.strides == cl and list(res) == ["x", "scale", "saved_mean", "saved_inv_std", "y"]
    import cudnnkit

    assert not N._fusable("float16", "nhwc", (2, 8, 3, 3), "spatial")  # the default: the graph, no reserve
    with cudnnkit.settings(prefer="legacy"):
        assert not N._fusable("float16", "nhwc", (2, 6, 3, 3), "spatial")  # C % 4
        assert N._fusable("float16", "nhwc", (2, 8, 3, 3), "spatial")


@pytest.mark.parametrize("shape, k", [((3, 5), 1), ((2, 3, 4), 2), ((2, 3, 4), 1)])
def test_layer_and_rms_norm_meta_match_torch(shape, k):
    norm = shape[-k:]
    xt = torch.randn(shape)
    _, mean, rstd = torch.native_layer_norm(xt, norm, torch.ones(norm), torch.zeros(norm), 1e-5)
    (y,), res = LN._ln_l3_meta(S(shape), S(norm), S(norm))
    assert y == S(shape) and list(res) == ["x", "scale", "mean", "inv_std"]
    assert res["mean"] == S(tuple(mean.shape)) and res["inv_std"] == S(tuple(rstd.shape))
    (y,), res = LN._rms_l3_meta(S(shape), S(norm), epsilon=1e-3)
    assert y == S(shape) and list(res) == ["x", "scale", "inv_std"] and res["inv_std"] == S(tuple(rstd.shape))
    (y,), res = LN._ln_l3_meta(S(shape), S(norm), None, training=False)
    assert list(res) == ["x", "scale"]


def test_instance_norm_meta_keeps_the_layout():
    for strides in (None, _cl((2, 4, 3, 3))):
        (y,), res = LN._in_l3_meta(S((2, 4, 3, 3), "float32", strides), S((4,)), None)
        assert y.strides == (strides or contiguous_strides((2, 4, 3, 3)))
        assert res["mean"] == S((2, 4)) and res["inv_std"] == S((2, 4))
    (y,), res = LN._in_l3_meta(S((2, 3, 5), "float16"), S((3,)), S((3,)), training=False)
    assert y == S((2, 3, 5), "float16") and list(res) == ["x", "scale"]


@pytest.mark.parametrize("name", ["batch_norm", "layer_norm", "rms_norm", "instance_norm"])
def test_samples_meta_matches_their_torch_references(name):
    d = autograd.get(name)
    for dtype in ("float64", "float32"):
        for inputs, kw in samples.SAMPLES[name](np.random.default_rng(0), dtype):
            specs = [_spec(a) for a in inputs]
            kspecs = {k: _spec(v) if k in d.arrays else v for k, v in kw.items()}
            (y,), res = d.meta(*specs, **kspecs)
            tkw = {k: _t(v) if k in d.arrays else v for k, v in kw.items()}
            (want,) = samples.TORCH_REFERENCE[name]([_t(a) for a in inputs], tkw)
            assert y.shape == tuple(want.shape) and y.dtype == str(inputs[0].dtype)
            assert y.strides == specs[0].strides or name in ("layer_norm", "rms_norm")  # a new y in x's layout
            want_dtype = dtype if name == "batch_norm" else "float32"
            assert inputs[0].dtype == want_dtype and all(s.dtype in (want_dtype, "uint8") for s in res.values())


# ----------------------------------------------------------------- checks before any GPU work


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), training=False), ValueError, "running_mean"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), activation="tanh"), ValueError, "activation"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), S((2, 3, 4))), ValueError, "z"),
        (
            lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), S((2, 3, 4), "float16"), activation="relu"),
            TypeError,
            "z has dtype float16 but x has dtype float32",
        ),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), mode="bogus"), ValueError, "mode"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), None), ValueError, "bias"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((4,)), S((4,))), ValueError, "scale"),
        (lambda: N._bn_l3_meta(S((2, 3, 4), "int32"), S((3,)), S((3,))), TypeError, "dtype"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), momentum=2.0), ValueError, "momentum"),
        (lambda: N._bn_l3_meta(S((1, 3)), S((3,)), S((3,))), ValueError, "more than one value"),
        (lambda: N._bn_l3_meta(S((2, 3, 4)), S((3,)), S((3,)), training="yes"), TypeError, "training"),
        (lambda: LN._ln_l3_meta(S((2, 3), "float64"), S((3,)), None), ValueError, "float64"),
        (lambda: LN._ln_l3_meta(S((2, 3)), S((3,)), None, normalized_shape_ndim=2), ValueError, "normalized_shape"),
        (lambda: LN._rms_l3_meta(S((2, 3)), S((4,))), ValueError, "scale"),
        (lambda: LN._in_l3_meta(S((2, 3)), S((3,)), None), ValueError, "3 to 5 dims"),
        (lambda: LN._in_l3_meta(S((2, 3, 4)), S((3,), "float64"), None), TypeError, "float32"),
        (lambda: LN._in_l3_meta(S((2, 3, 4)), S((3,)), None, epsilon=0.0), ValueError, "epsilon"),
    ],
)
def test_meta_refuses_what_the_call_would(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


# ----------------------------------------------------------------- forward and backward wiring (NumPy stand-ins)


def _np_view(a, name="array"):
    return ArrayView(a.shape, tuple(s // a.itemsize for s in a.strides), str(a.dtype), -1, 0, a)


@pytest.fixture
def fakes(monkeypatch):
    """The L2 calls the declarations make, as NumPy references (cuDNN's documented semantics)."""

    def bn_forward(x, scale, bias, *, running_mean=None, running_var=None, training=True, momentum=0.1,
                   epsilon=1e-5, mode="spatial", z=None, activation=None):  # fmt: skip
        if training:
            y, sm, si, nrm, nrv = ref.bn_forward(x, scale, bias, epsilon, mode, running_mean, running_var, momentum)
            if running_mean is not None:
                running_mean[...], running_var[...] = nrm, nrv
        else:
            y = ref.bn_inference(x, scale, bias, running_mean, running_var, epsilon, mode)
        y = y + (0 if z is None else z)
        y = np.maximum(y, 0) if activation else y
        if not training:
            return y
        return (y, sm, si, None) if activation else (y, sm, si)

    def bn_backward(dy, x, scale, saved_mean, saved_inv_std, *, epsilon=1e-5, mode="spatial", activation=None,
                    y=None, bias=None, reserve=None, z_grad=False):  # fmt: skip
        assert reserve is None and (y is not None) == (activation is not None)
        g = dy * (y > 0) if activation else dy
        dx, ds, db = ref.bn_backward(g, x, scale, saved_mean, saved_inv_std, mode)
        return (dx, ds, db, g) if z_grad else (dx, ds, db)

    def ln_forward(x, scale, bias=None, *, normalized_shape_ndim=None, epsilon=1e-5, training=True):
        got = ref.ln_forward(x, scale, bias, epsilon, normalized_shape_ndim)
        return got if training else got[0]

    def rms_forward(x, scale, *, normalized_shape_ndim=None, epsilon=1e-5, training=True):
        got = ref.rms_forward(x, scale, epsilon, normalized_shape_ndim)
        return got if training else got[0]

    def in_forward(x, scale, bias=None, *, epsilon=1e-5, training=True):
        got = ref.in_forward(x, scale, bias, epsilon)
        return got if training else got[0]

    def set_tensor(y, value):
        y[...] = value
        return y

    for name, fn in dict(
        batch_norm_forward=bn_forward,
        batch_norm_backward=bn_backward,
        set_tensor=set_tensor,
        transform_tensor=lambda x: np.copy(x),
        activation_backward=lambda dy, y, x, mode: dy * (x > 0),
        layer_norm_forward=ln_forward,
        layer_norm_backward=lambda dy, x, s, m, i, *, normalized_shape_ndim=None: ref.ln_backward(dy, x, s, m, i,
                                                                                              normalized_shape_ndim),
        rms_norm_forward=rms_forward,
        rms_norm_backward=lambda dy, x, s, i, *, normalized_shape_ndim=None: ref.rms_backward(dy, x, s, i,
                                                                                          normalized_shape_ndim),
        instance_norm_forward=in_forward,
        instance_norm_backward=lambda dy, x, s, m, i: ref.in_backward(dy, x, s, m, i),
    ).items():  # fmt: skip
        monkeypatch.setattr(LN if name.split("_")[0] in ("layer", "rms", "instance") else N, name, fn)
    monkeypatch.setattr("cudnnkit.runtime.arrays.as_view", _np_view)


def _case_grads(name, inputs, kw):
    """The declaration's forward and backward (with the stand-ins) against torch's autograd of the reference."""
    d = autograd.get(name)
    rng = np.random.default_rng(3)
    ins = [None if a is None else np.asarray(a, dtype=np.float64) for a in inputs]
    kwn = {k: np.asarray(v, dtype=np.float64).copy() if k in d.arrays else v for k, v in kw.items()}
    (y,), res = d.forward(*ins, **kwn)
    m_out, m_res = d.meta(*map(_spec, inputs), **{k: _spec(v) if k in d.arrays else v for k, v in kw.items()})
    assert list(res) == list(m_res) and y.shape == m_out[0].shape
    leaves = [_t(a, grad=True) for a in ins]
    tkw = {k: _t(np.asarray(v, dtype=np.float64)) if k in d.arrays else v for k, v in kw.items()}
    (want,) = samples.TORCH_REFERENCE[name](leaves, tkw)
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k in d.mutated:
        if kw.get(k) is not None:
            np.testing.assert_allclose(kwn[k], tkw[k].numpy(), rtol=1e-10, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    needs = tuple(a is not None for a in ins)
    options = {k: v for k, v in kw.items() if k not in d.arrays}
    grads = d.backward(res, (dy,), needs, **options)
    live = [t for t in leaves if t is not None]
    g_ref = torch.autograd.grad(want, live, torch.from_numpy(dy))
    got = [g for g, a in zip(grads, ins) if a is not None]
    assert [g is None for g, a in zip(grads, ins) if a is None] == [True] * (len(ins) - len(live))
    for g, r in zip(got, g_ref):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-9, atol=1e-11)
    assert d.backward(res, (None,), needs, **options) == (None,) * len(ins)


@pytest.mark.parametrize("name", ["batch_norm", "layer_norm", "rms_norm", "instance_norm"])
def test_forward_and_backward_wiring_match_torch(fakes, name):
    for inputs, kw in samples.SAMPLES[name](np.random.default_rng(1), "float64"):
        _case_grads(name, inputs, kw)


def test_inference_batch_norm_gradients_only_what_is_needed(fakes):
    rng = np.random.default_rng(4)
    x, s, b = rng.standard_normal((3, 2, 2)), rng.standard_normal(2), rng.standard_normal(2)
    kw = dict(running_mean=rng.standard_normal(2), running_var=rng.uniform(0.5, 2, 2), training=False)
    (y,), res = N._bn_l3_forward(x, s, b, **kw)
    assert res["mean"] is not kw["running_mean"] and np.array_equal(res["mean"], kw["running_mean"])
    dx, ds, db, dz = N._bn_l3_backward(res, (np.ones_like(y),), (True, False, False, False), training=False)
    assert ds is None and db is None and dz is None
    np.testing.assert_allclose(dx, np.ones_like(x) * (s / np.sqrt(kw["running_var"] + 1e-5))[None, :, None])


def test_a_predicted_reserve_that_did_not_come_back_is_an_error(fakes, monkeypatch):
    """Where meta predicts the fused forward's reserve and the call ran unfused, the forward says so (the torch
    layer's fake would otherwise disagree with the real op); an unpredicted reserve is dropped."""
    x = np.ascontiguousarray(np.random.default_rng(0).standard_normal((2, 3, 3, 8)).astype(np.float16))
    x = x.transpose(0, 3, 1, 2)  # channels-last (2, 8, 3, 3) float16: where cuDNN fuses
    s, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    monkeypatch.setattr(N, "_bn_reserve", lambda r, lay: Spec((64,), (1,), "uint8"))
    monkeypatch.setattr(N, "batch_norm_forward", lambda *a, **k: (x, s, s, None))  # ran unfused
    import cudnnkit

    with cudnnkit.settings(prefer="legacy"), pytest.raises(RuntimeError, match="reserve"):  # the Ex call's reserve
        N._bn_l3_forward(x, s, b, activation="relu")
    monkeypatch.setattr(N, "_MASK_MIN_ELEMENTS", 1)  # the mask at any size (it asks for 4M elements)
    y32 = x.astype(np.float32)  # float32: no reserve kept, whatever the call made
    mask = np.zeros((2, 3, 3, 1), np.uint8)  # channels-last float32 with C = 8: the graph's ReLU mask is kept
    monkeypatch.setattr(N, "batch_norm_forward", lambda *a, **k: (y32, s, s, np.zeros(64, np.uint8))
                        + ((mask,) if k.get("return_mask") else ()))  # fmt: skip
    _, res = N._bn_l3_forward(y32, s, b, activation="relu")
    assert list(res) == ["x", "scale", "saved_mean", "saved_inv_std", "y", "relu_mask"] and res["relu_mask"] is mask
    with cudnnkit.settings(prefer="legacy"):  # the legacy forward: no mask asked for
        _, res = N._bn_l3_forward(y32, s, b, activation="relu")
    assert list(res) == ["x", "scale", "saved_mean", "saved_inv_std", "y"]


@pytest.mark.parametrize("refusal", ["graph only", "prefer graph"])
def test_no_engine_for_the_masked_forward_asks_again_without_it(fakes, monkeypatch, refusal):
    """Where cuDNN has no engine for the masked forward graph (the legacy call cannot write a mask:
    ``GraphOnlyError``; under ``settings(prefer="graph")`` the raw ``UnsupportedGraphError``), the L3 batch norm asks again without the mask (nothing ran), keeps y for the backward,
    and neither it nor meta asks for the mask at that dtype, shape and mode again in the process."""
    from cudnnkit.graph import UnsupportedGraphError
    from cudnnkit.ops._primitive import GraphOnlyError

    x = np.ascontiguousarray(np.random.default_rng(1).standard_normal((2, 3, 3, 8)).astype(np.float32))
    x = x.transpose(0, 3, 1, 2)  # channels-last (2, 8, 3, 3) float32: where the mask is asked for
    s, b = np.ones(8, np.float32), np.zeros(8, np.float32)
    monkeypatch.setattr(N, "_MASK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(N, "_MASK_REFUSED", set())
    asked = []

    def forward(*a, **k):
        asked.append(k.get("return_mask", False))
        if k.get("return_mask"):
            if refusal == "graph only":
                raise GraphOnlyError("batch_norm_forward: cuDNN has no engine for this call's graph (toy)")
            raise UnsupportedGraphError("toy", [])
        return x, s, s, None

    monkeypatch.setattr(N, "batch_norm_forward", forward)
    spec = Spec(x.shape, tuple(st // 4 for st in x.strides), "float32")
    p = Spec((8,), (1,), "float32")
    assert "relu_mask" in N._bn_l3_meta(spec, p, p, activation="relu")[1]
    _, res = N._bn_l3_forward(x, s, b, activation="relu")
    assert asked == [True, False] and list(res) == ["x", "scale", "saved_mean", "saved_inv_std", "y"]
    assert N._MASK_REFUSED == {("float32", (2, 8, 3, 3), "spatial", False, False)}  # no residual z, no NaN rule
    assert "relu_mask" not in N._bn_l3_meta(spec, p, p, activation="relu")[1]
    asked.clear()
    N._bn_l3_forward(x, s, b, activation="relu")
    assert asked == [False]


def test_meta_keeps_the_relu_mask_from_its_size_on():
    """The mask costs device time below about 4M elements (measured): meta (and so the forward) keeps it from
    ``_MASK_MIN_ELEMENTS`` elements on, not one element fewer."""
    assert N._MASK_MIN_ELEMENTS == 1 << 22
    p = Spec((64,), (1,), "float32")
    for hw, want in [((32, 32), True), ((31, 32), False), ((16, 16), False)]:  # 64 * 64 * 32 * 32 == 1 << 22
        h, w = hw
        x = Spec((64, 64, h, w), (64 * h * w, 1, w * 64, 64), "bfloat16")
        _, res = N._bn_l3_meta(x, p, p, activation="relu")
        assert ("relu_mask" in res) == want, hw


def test_meta_predicts_the_graph_relu_mask(monkeypatch):
    """With its ReLU fused, the training batch norm keeps the graph's bit-packed ReLU mask (uint8 ``(N, H, W, C //
    8)``) for a one-graph backward exactly where the graph form runs the forward and C is a multiple of 8: meta's
    residuals say so (with the residual z too), and not for channels-first arrays, another C, inference or
    ``settings(prefer="legacy")`` (the size floor lowered to 1 here: the previous test checks it)."""
    import cudnnkit

    monkeypatch.setattr(N, "_MASK_MIN_ELEMENTS", 1)

    def nhwc(shape, dtype="float16"):
        n, c, h, w = shape
        return Spec(shape, (c * h * w, 1, w * c, c), dtype)

    p = Spec((16,), (1,), "float32")
    _, res = N._bn_l3_meta(nhwc((2, 16, 3, 5)), p, p, activation="relu")
    assert list(res)[-1] == "relu_mask" and res["relu_mask"] == Spec((2, 3, 5, 2), (30, 10, 2, 1), "uint8")
    _, res = N._bn_l3_meta(nhwc((2, 16, 3, 5), "float32"), p, p, activation="relu")
    assert "relu_mask" in res
    _, res = N._bn_l3_meta(nhwc((2, 16, 3, 5)), p, p, nhwc((2, 16, 3, 5)), activation="relu")  # DRELU_DADD_DBN
    assert list(res)[-2:] == ["relu_mask", "z"]
    for args, kw in [
        ((S((2, 16, 3, 5), "float16"),), {}),  # channels-first
        ((nhwc((2, 12, 3, 5)),), {}),  # C % 8 != 0
        ((nhwc((2, 16, 3, 5)),), {"activation": None}),
    ]:
        c = args[0].shape[1]
        pc = Spec((c,), (1,), "float32")
        _, res = N._bn_l3_meta(*args, pc, pc, **({"activation": "relu"} | kw))
        assert "relu_mask" not in res, (args, kw)
    with cudnnkit.settings(prefer="legacy"):  # float32: no fused reserve either (float16 would ask cuDNN its size)
        _, res = N._bn_l3_meta(nhwc((2, 16, 3, 5), "float32"), p, p, activation="relu")
    assert "relu_mask" not in res
