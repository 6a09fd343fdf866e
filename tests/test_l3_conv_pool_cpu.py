"""The L3 declarations of convolution, the transposed convolution and pooling, on the CPU: the registry, meta
against torch's own shapes for every sample (tests/l3/conv_pool.py) and the torch fakes on meta tensors, the
backward's calls (the L2 functions replaced by recorders), and the refusals made before any GPU work."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import autograd
from cudnnkit.ops import Convolution, Pooling
from cudnnkit.ops import convolution as cv
from cudnnkit.ops import pooling as pl
from cudnnkit.ops._diff import Spec, spec_view
from cudnnkit.ops._layout import channels_last_strides
from cudnnkit.ops._primitive import REGISTRY
from cudnnkit.runtime.arrays import contiguous_strides

from .l3.conv_pool import SAMPLES, TORCH_REFERENCE

torch = pytest.importorskip("torch")


def _spec(shape, dtype="float32", channels_last=False):
    shape = tuple(shape)
    return Spec(shape, channels_last_strides(shape) if channels_last else contiguous_strides(shape), dtype)


def _sample_specs(inputs, dtype):
    return [None if a is None else _spec(a.shape, dtype) for a in inputs]


def test_the_ops_are_registered():
    want = {
        "convolution": ("convolution_forward", ("x", "w", "bias"), ("out",)),
        "convolution_transpose": ("convolution_backward_data", ("dy", "w"), ("out",)),
        "pooling": ("pooling_forward", ("x",), ("out",)),
    }
    for name, (prim, inputs, outputs) in want.items():
        d = autograd.get(name)
        assert (d.primitive, d.inputs, d.outputs, d.arrays, d.mutated) == (prim, inputs, outputs, (), ())
        assert set(d.inputs) <= set(REGISTRY[prim].differentiable)
        assert d.carries_gradient(0)
    assert REGISTRY["convolution_forward"].differentiable == ("x", "w", "bias")


CASES = [(n, i) for n in SAMPLES for i in range(len(SAMPLES[n](np.random.default_rng(0), "float32")))]


@pytest.mark.parametrize("name, i", CASES)
def test_meta_gives_torchs_shapes(name, i):
    """Every sample (the float32 list holds the float64 one): meta's output is torch's float64 reference's shape,
    in the sample's dtype, C order; the residuals are the inputs (and pooling's y, and its index where kept)."""
    d = autograd.get(name)
    inputs, kw = SAMPLES[name](np.random.default_rng(1), "float32")[i]
    (y,), res = d.meta(*_sample_specs(inputs, "float32"), **kw)
    (want,) = TORCH_REFERENCE[name](inputs, kw)
    assert y.shape == tuple(want.shape) and y.dtype == "float32" and y.strides == contiguous_strides(y.shape)
    if name == "pooling":
        r = pl._fwd_resolve({"x": spec_view(_spec(inputs[0].shape))}, kw)
        keeps = r.mode.startswith("max") and r.pad != r.post
        assert list(res) == (["x", "out", "index"] if keeps else ["x", "out"]) and res["out"] == y
        if keeps:
            assert res["index"] == Spec(y.shape, channels_last_strides(y.shape), "int8")
    else:
        names = [n for n, a in zip(d.inputs, inputs) if a is not None] + (["out"] if kw.get("activation") else [])
        assert list(res) == names and all(res[n].shape == a.shape for n, a in zip(d.inputs, inputs) if a is not None)


def test_the_float64_samples_pad_both_sides_alike():
    """float64 runs legacy only: its samples never need the graph (padding after == padding before)."""
    for name in SAMPLES:
        for inputs, kw in SAMPLES[name](np.random.default_rng(0), "float64"):
            assert all(a is None or a.dtype == np.float64 for a in inputs)
            v = {n: None if a is None else spec_view(_spec(a.shape, "float64"))
                 for n, a in zip(autograd.get(name).inputs, inputs)}  # fmt: skip
            r = {"convolution": cv._fwd_resolve, "convolution_transpose": cv._bwd_data_resolve,
                 "pooling": pl._fwd_resolve}[name](v, kw)  # fmt: skip
            assert r.pad == r.post, (name, kw)


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_meta_follows_a_channels_last_x(nsp):
    """A channels-last x gives a channels-last y (as the L2 ops allocate), for convolution and pooling; the
    transposed convolution follows dy."""
    sp = (6, 5, 4)[:nsp]
    x = _spec((2, 4, *sp), channels_last=True)
    (y,), _ = autograd.get("convolution").meta(x, _spec((8, 4, *(3,) * nsp)), None, padding=1)
    assert y.shape == (2, 8, *sp) and y.strides == channels_last_strides(y.shape)
    (y,), res = autograd.get("pooling").meta(x, window=2, stride=1)
    assert y.strides == channels_last_strides(y.shape) and res["x"] is x
    (y,), _ = autograd.get("convolution_transpose").meta(x, _spec((4, 3, *(2,) * nsp)), stride=2)
    assert y.shape == (2, 3, *(2 * s for s in sp)) and y.strides == channels_last_strides(y.shape)


def test_meta_padding_forms_and_index_dtype():
    conv = autograd.get("convolution")
    x, w = _spec((1, 2, 7, 8)), _spec((3, 2, 4, 3))
    for padding in ("same", "valid", ((1, 2), (0, 0)), (1, 2)):
        (y,), _ = conv.meta(x, w, None, padding=padding)
        ref = torch.nn.functional.conv2d(torch.zeros(x.shape), torch.zeros(w.shape),
                                         padding=padding if not isinstance(padding[0], tuple) else 0)  # fmt: skip
        if isinstance(padding[0], tuple):
            ref = torch.nn.functional.conv2d(torch.zeros(1, 2, 10, 8), torch.zeros(w.shape))
        assert y.shape == tuple(ref.shape), padding
    # an empty batch: the shapes of a batch of one, N = 0; pooling keeps no index (the forward returns none)
    (y,), _ = conv.meta(_spec((0, 2, 7, 8)), w, None)
    assert y.shape == (0, 3, 4, 6)
    (y,), res = autograd.get("pooling").meta(_spec((0, 2, 8, 8)), window=3, stride=2, ceil_mode=True)
    assert y.shape == (0, 2, 4, 4) and list(res) == ["x", "out"]
    # windows over 127 cells: an int32 index
    (y,), res = autograd.get("pooling").meta(_spec((1, 1, 13, 13)), window=12, stride=12, ceil_mode=True)
    assert res["index"].dtype == "int32" and y.shape == (1, 1, 2, 2)
    (y,), res = autograd.get("pooling").meta(_spec((1, 1, 13, 13), "float16"), mode="avg_exclude_padding",
                                             window=12, stride=12, ceil_mode=True)  # fmt: skip
    assert list(res) == ["x", "out"] and y.dtype == "float16"


def test_the_torch_fakes_on_meta_tensors_match_torch():
    """The custom ops' fakes (from meta) on meta tensors: torch's own functions' shapes and strides."""
    import torch.nn.functional as F

    import cudnnkit.torch as ct

    x, w, b = (torch.empty(s, device="meta") for s in ((2, 4, 7, 6), (6, 2, 3, 3), (6,)))
    y = ct.op("convolution")(x, w, b, stride=2, padding=1, groups=2)
    want = F.conv2d(x, w, b, stride=2, padding=1, groups=2)
    assert y.shape == want.shape and y.stride() == want.stride() and y.device.type == "meta"
    xl = x.to(memory_format=torch.channels_last)
    y = ct.op("convolution")(xl, w, None, padding=1, groups=2)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.shape == (2, 6, 7, 6)
    y = ct.op("convolution_transpose")(torch.empty(2, 4, 3, 3, device="meta"), torch.empty(4, 3, 3, 3, device="meta"),
                                       stride=2, padding=1, output_padding=1)  # fmt: skip
    assert y.shape == (2, 3, 6, 6)
    y = ct.op("pooling")(torch.empty(2, 3, 8, 8, device="meta"), window=3, stride=2, ceil_mode=True)
    assert y.shape == F.max_pool2d(torch.empty(2, 3, 8, 8, device="meta"), 3, 2, ceil_mode=True).shape


class _Arr:
    """A stand-in array: shape and dtype (what the L3 functions read), and a name for the records."""

    def __init__(self, name, shape, dtype="float32"):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    def __repr__(self):
        return self.name


def _record(monkeypatch, module, names):
    calls = []
    for n in names:

        def fn(*args, _n=n, **kw):
            calls.append((_n, args, kw))
            return _Arr(f"{_n}()", ())

        monkeypatch.setattr(module, n, fn)
    return calls


def test_the_convolution_backward_calls(monkeypatch):
    calls = _record(monkeypatch, cv, ["convolution_forward", "convolution_backward_data",
                                      "convolution_backward_filter", "convolution_backward_bias"])  # fmt: skip
    d = autograd.get("convolution")
    h = "float16"  # a half type: the bias is fused (float64 splits it off: test_a_float64_bias_is_added_after...)
    x, w, b, dy = (
        _Arr("x", (2, 4, 7, 6), h),
        _Arr("w", (6, 2, 3, 3), h),
        _Arr("b", (6,), h),
        _Arr("dy", (2, 6, 4, 3), h),
    )
    kw = dict(stride=2, padding=1, groups=2)
    (y,), res = d.forward(x, w, b, **kw)
    assert res == {"x": x, "w": w, "bias": b} and calls[0][0] == "convolution_forward"
    calls.clear()
    dx, dw, db = d.backward(res, (dy,), (True, True, True), **kw)
    p = dict(stride=2, padding=1, dilation=1, groups=2, mode="cross_correlation", conv=None)
    assert calls == [("convolution_backward_data", (dy, w), dict(x_shape=x.shape, **p)),
                     ("convolution_backward_filter", (x, dy), dict(w_shape=w.shape, **p)),
                     ("convolution_backward_bias", (dy,), {})]  # fmt: skip
    calls.clear()
    assert d.backward(res, (dy,), (False, True, False), **kw)[0::2] == (None, None)
    assert [c[0] for c in calls] == ["convolution_backward_filter"]
    calls.clear()
    _, res = d.forward(x, w, None, **kw)
    assert list(res) == ["x", "w"]
    assert d.backward(res, (dy,), (True, True, True), **kw)[2] is None  # no bias: no db (autograd.vjp asks all)
    assert [c[0] for c in calls] == ["convolution_forward", "convolution_backward_data", "convolution_backward_filter"]
    calls.clear()
    assert d.backward(res, (None,), (True, True, True), **kw) == (None, None, None) and not calls


def test_the_fused_relu_forward_and_backward_calls(monkeypatch):
    """activation="relu": one fused forward (half types) keeping its output; the backward first takes the ReLU's
    gradient from that output (cudnnActivationBackward with y as x and y), then the convolution's, from it. float64
    (no graph) and channels-first float32 (whose fused graph would copy x, w and y channels-last) split the
    forward: the convolution, the bias added, the ReLU in place; channels-last float32 keeps the fused call."""
    calls = _record(monkeypatch, cv, ["convolution_forward", "convolution_backward_data",
                                      "convolution_backward_filter", "convolution_backward_bias",
                                      "activation_backward", "activation_forward", "add_tensor"])  # fmt: skip
    d = autograd.get("convolution")
    for dt, nhwc in (("float16", False), ("float32", True), ("float32", False), ("float64", True)):
        monkeypatch.setattr(cv, "_channels_last", lambda a, _v=nhwc: _v)
        calls.clear()
        x, w, b, dy = _Arr("x", (2, 4, 7, 6), dt), _Arr("w", (6, 4, 3, 3), dt), _Arr("b", (6,), dt), _Arr("dy", ())
        b.reshape = lambda shape: "b4d"
        (y,), res = d.forward(x, w, b, padding=1, activation="relu")
        assert res == {"x": x, "w": w, "bias": b, "out": y}
        if dt == "float16" or (dt == "float32" and nhwc):
            assert [c[0] for c in calls] == ["convolution_forward"] and calls[0][2]["activation"] == "relu"
        else:
            assert [c[0] for c in calls] == ["convolution_forward", "add_tensor", "activation_forward"]
            assert calls[0][2]["activation"] is None and calls[2][1] == (y, "relu") and calls[2][2] == {"out": y}
        calls.clear()
        d.backward(res, (dy,), (True, True, True), padding=1)
        (name, args, _), *rest = calls
        assert (name, args) == ("activation_backward", (dy, y, y, "relu"))
        g = _Arr("activation_backward()", ())
        assert [c[0] for c in rest] == ["convolution_backward_data", "convolution_backward_filter",
                                        "convolution_backward_bias"]  # fmt: skip
        assert all(repr(c[1][0 if c[0] != "convolution_backward_filter" else 1]) == repr(g) for c in rest)
    (ys,), rs = d.meta(_spec((2, 4, 7, 6)), _spec((6, 4, 3, 3)), None, padding=1, activation="relu")
    assert list(rs) == ["x", "w", "out"] and rs["out"] == ys


def test_the_fused_relus_nan_rule_reaches_the_call_that_applies_it(monkeypatch):
    """propagate_nan=True (torch's ReLU: NaN in, NaN out) goes to the fused forward, or, split, to the ReLU in
    place; without an activation it is refused by name, before any call."""
    calls = _record(monkeypatch, cv, ["convolution_forward", "activation_forward", "add_tensor"])
    d = autograd.get("convolution")
    for dt, nhwc in (("float16", True), ("float64", True)):
        monkeypatch.setattr(cv, "_channels_last", lambda a, _v=nhwc: _v)
        calls.clear()
        x, w, b = _Arr("x", (2, 4, 7, 6), dt), _Arr("w", (6, 4, 3, 3), dt), _Arr("b", (6,), dt)
        b.reshape = lambda shape: "b4d"
        (y,), _ = d.forward(x, w, b, padding=1, activation="relu", propagate_nan=True)
        if dt == "float16":
            assert calls[0][2]["propagate_nan"] is True
        else:
            assert "propagate_nan" not in calls[0][2] and calls[2][2] == {"out": y, "propagate_nan": True}
    calls.clear()
    for call in (lambda: d.forward(x, w, b, padding=1, propagate_nan=True),
                 lambda: d.meta(_spec((2, 4, 7, 6)), _spec((6, 4, 3, 3)), None, propagate_nan=True)):  # fmt: skip
        with pytest.raises(TypeError, match="propagate_nan is the fused activation's NaN rule: pass activation="):
            call()
    with pytest.raises(TypeError, match="propagate_nan must be a bool, got 1"):
        d.meta(_spec((2, 4, 7, 6)), _spec((6, 4, 3, 3)), None, activation="relu", propagate_nan=1)
    assert not calls


def test_the_transposed_convolution_backward_calls(monkeypatch):
    calls = _record(monkeypatch, cv, ["convolution_forward", "convolution_backward_data",
                                      "convolution_backward_filter"])  # fmt: skip
    d = autograd.get("convolution_transpose")
    x, w, g = _Arr("x", (2, 4, 3, 3)), _Arr("w", (4, 3, 3, 3)), _Arr("g", (2, 3, 6, 6))
    kw = dict(stride=2, padding=1, output_padding=1)
    (y,), res = d.forward(x, w, **kw)
    assert res == {"dy": x, "w": w}
    assert calls[0] == ("convolution_backward_data", (x, w), dict(x_shape=None, output_padding=1, stride=2, padding=1,
                        dilation=1, groups=1, mode="cross_correlation", conv=None))  # fmt: skip
    calls.clear()
    d.backward(res, (g,), (True, True), **kw)
    p = dict(stride=2, padding=1, dilation=1, groups=1, mode="cross_correlation", conv=None)
    assert calls == [("convolution_forward", (g, w), p),
                     ("convolution_backward_filter", (g, x), dict(w_shape=w.shape, **p))]  # fmt: skip


def test_the_pooling_forward_and_backward_calls(monkeypatch):
    calls = []

    def fwd(x, **kw):
        calls.append(("pooling_forward", kw))
        y = _Arr("y", ())
        return (y, _Arr("index", ())) if kw.get("return_index") else y

    def bwd(dy, y, x, **kw):
        calls.append(("pooling_backward", (dy, y, x), kw))
        return _Arr("dx", x.shape)

    monkeypatch.setattr(pl, "pooling_forward", fwd)
    monkeypatch.setattr(pl, "pooling_backward", bwd)
    d = autograd.get("pooling")
    x, dy = _Arr("x", (2, 3, 8, 8)), _Arr("dy", ())
    base = dict(mode="max", window=2, stride=None, padding=0, ceil_mode=False, propagate_nan=False, pool=None)
    for kw, keeps in ((dict(window=3, stride=2), False), (dict(window=3, stride=2, ceil_mode=True), True),
                      (dict(window=3, padding=((1, 0), (0, 1))), True),
                      (dict(mode="avg_include_padding", window=3, padding=((1, 0), (0, 1))), False),
                      (dict(pool=Pooling("max", window=3, stride=2, ceil_mode=True)), True)):  # fmt: skip
        calls.clear()
        (y,), res = d.forward(x, **kw)
        assert list(res) == (["x", "out", "index"] if keeps else ["x", "out"]) and res["out"] is y
        assert calls[0][1] == dict(base, **kw, **({"return_index": True} if keeps else {}))
        d.backward(res, (dy,), (True,), **kw)
        assert calls[1] == ("pooling_backward", (dy, y, x), dict(kw, index=res.get("index")))
    calls.clear()
    assert d.backward(res, (None,), (True,), **kw) == (None,) and not calls


def test_an_empty_pooling_backward_takes_no_index(monkeypatch):
    """An empty batch with padding after: no index was kept (the forward returns none), and dx is an empty array
    like x (transform_tensor, nothing launched), not pooling_backward (which would ask for the index)."""
    from cudnnkit.ops import tensor

    got = []
    monkeypatch.setattr(tensor, "transform_tensor", lambda x: got.append(x) or "dx")
    monkeypatch.setattr(pl, "pooling_backward", lambda *a, **k: pytest.fail("pooling_backward called"))
    x = _Arr("x", (0, 3, 8, 8))
    assert autograd.get("pooling").backward({"x": x, "out": _Arr("y", (0, 3, 4, 4))}, (_Arr("dy", ()),), (True,),
                                            window=3, stride=2, ceil_mode=True) == ("dx",)  # fmt: skip
    assert got == [x]


REFUSED = [
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), None, activation="tanh"),
        NotImplementedError,
        "activation='tanh' .*fuses activation='relu' only",
    ),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), None, activation="relu", activation_coef=6.0),
        NotImplementedError,
        "activation_coef=6.0",
    ),
    (
        lambda d: d.forward(_Arr("x", (1, 2, 5, 5)), _Arr("w", (3, 2, 3, 3)), None, activation="gelu"),
        NotImplementedError,
        "activation='gelu'",
    ),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), None, z=_spec((1, 3, 3, 3))),
        NotImplementedError,
        "z= .*not differentiable",
    ),
    (
        lambda d: d.forward(_Arr("x", (1, 2, 5, 5)), _Arr("w", (3, 2, 3, 3)), None, z=_Arr("z", (1, 3, 3, 3))),
        NotImplementedError,
        "z=",
    ),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5), "int8"), _spec((3, 2, 3, 3), "int8"), None),
        NotImplementedError,
        "not int8: the quantized forward",
    ),
    (
        lambda d: d.forward(_Arr("x", (1, 2, 5, 5), "float8_e4m3fn"), _Arr("w", (3, 2, 3, 3), "float8_e4m3fn"), None),
        NotImplementedError,
        "float8_e4m3fn",
    ),
    (lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 4, 3, 3)), None), ValueError, "x has 2 channels"),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), _spec((4,))),
        ValueError,
        r"bias must have shape \(3,\)",
    ),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), None, stride=2, padding="same"),
        ValueError,
        "padding='same' needs stride 1",
    ),
    (
        lambda d: d.meta(_spec((1, 2, 5, 5)), _spec((3, 2, 3, 3)), None, conv=Convolution(), stride=2),
        TypeError,
        "not both",
    ),
]


@pytest.mark.parametrize("call, exc, msg", REFUSED)
def test_the_convolution_refusals(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(autograd.get("convolution"))


def test_the_transpose_and_pooling_refusals():
    t, p = autograd.get("convolution_transpose"), autograd.get("pooling")
    with pytest.raises(ValueError, match="needs x_shape="):
        t.meta(_spec((1, 4, 5, 5)), _spec((4, 2, 3, 3)), padding="same")
    with pytest.raises(ValueError, match="output_padding 2 must be smaller"):
        t.meta(_spec((1, 4, 5, 5)), _spec((4, 2, 3, 3)), stride=2, output_padding=2)
    with pytest.raises(TypeError, match="return_index"):
        p.forward(_Arr("x", (1, 2, 4, 4)), return_index=True)
    with pytest.raises(ValueError, match="must be smaller than the window"):
        p.meta(_spec((1, 2, 4, 4)), window=2, padding=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        p.forward(_Arr("x", (1, 2, 4, 4)), mode="median")


# ----------------------------------------------------------------- the L3 math, with NumPy references for the L2 ops


def _views(**arrays):
    return {n: None if a is None else spec_view(_spec(a.shape, "float64")) for n, a in arrays.items()}


def _conv_args(r):
    n = r.nsp
    return dict(stride=r.stride[:n], pad=r.pad[:n], dilation=r.dilation[:n], groups=r.groups, mode=r.mode)


def _numpy_convolution(monkeypatch):
    """convolution's L2 functions as tests/conv_reference.py computes them (symmetric padding), for NumPy arrays."""
    from . import conv_reference as ref

    def fwd(x, w, bias=None, **kw):
        y = ref.conv_forward(x, w, **_conv_args(cv._fwd_resolve(_views(x=x, w=w, bias=bias), kw)))
        return y if bias is None else y + bias.reshape(1, -1, *(1,) * (y.ndim - 2))

    def data(dy, w, **kw):
        r = cv._bwd_data_resolve(_views(dy=dy, w=w), kw)
        return ref.conv_backward_data(dy, w, r.y_shape, **_conv_args(r))

    def filt(x, dy, **kw):
        r = cv._bwd_filter_resolve(_views(x=x, dy=dy), kw)
        return ref.conv_backward_filter(x, dy, r.y_shape, **_conv_args(r))

    def relu(x, mode, out=None):
        assert mode == "relu"
        return np.maximum(x, 0, out=out)

    monkeypatch.setattr(cv, "add_tensor", lambda a, c: c.__iadd__(a))
    monkeypatch.setattr(cv, "activation_forward", relu)
    monkeypatch.setattr(cv, "activation_backward", lambda dy, y, x, mode: np.where(y > 0, dy, 0.0))
    for name, fn in (
        ("convolution_forward", fwd),
        ("convolution_backward_data", data),
        ("convolution_backward_filter", filt),
        ("convolution_backward_bias", ref.conv_backward_bias),
    ):
        monkeypatch.setattr(cv, name, fn)  # fmt: skip


def _numpy_pooling(monkeypatch):
    from . import pool_reference as ref

    def args(x, kw):
        r = pl._resolve_for(spec_view(_spec(x.shape, "float64")), "x", kw)
        n = r.nsp
        return dict(mode=r.mode, window=r.window[:n], stride=r.stride[:n], pad=tuple(zip(r.pad[:n], r.post[:n])))

    monkeypatch.setattr(pl, "pooling_forward", lambda x, **kw: ref.pool_forward(x, **args(x, kw)))
    monkeypatch.setattr(
        pl, "pooling_backward", lambda dy, y, x, index=None, **kw: ref.pool_backward(x, dy, **args(x, kw))
    )


@pytest.mark.parametrize("name", list(SAMPLES))
def test_forward_and_backward_match_torch_with_numpy_l2_ops(name, monkeypatch):
    """Each float64 sample through the declaration's forward and backward, the L2 functions computed by the NumPy
    references: the outputs and every input's gradient match torch's float64 reference and its autograd (the
    backward's calls, their arguments and the transposed convolution's adjoint formulas are right)."""
    _numpy_convolution(monkeypatch)
    _numpy_pooling(monkeypatch)
    d = autograd.get(name)
    for inputs, kw in SAMPLES[name](np.random.default_rng(3), "float64"):
        (y,), res = d.forward(*inputs, **kw)
        leaves = [None if a is None else torch.from_numpy(a.copy()).requires_grad_() for a in inputs]
        (want,) = TORCH_REFERENCE[name](leaves, kw)
        np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{name} {kw}")
        g = np.random.default_rng(4).standard_normal(y.shape)
        grads = d.backward(res, (g,), tuple(a is not None for a in inputs), **kw)
        used = [t for t in leaves if t is not None]
        refs = iter(torch.autograd.grad(want, used, torch.from_numpy(g)))
        for a, got in zip(inputs, grads):
            if a is None:
                assert got is None
                continue
            np.testing.assert_allclose(got, next(refs).numpy(), rtol=1e-9, atol=1e-11, err_msg=f"{name} {kw}")


@pytest.mark.parametrize("name", ["convolution", "pooling"])
def test_the_torch_references_of_per_side_padding_match_numpy(name):
    """The samples only the graph runs (per-side padding, ceil_mode's padding after): the torch references
    (F.pad, then torch's ops) agree with the NumPy definitions padded the same way."""
    from . import conv_reference as cref
    from . import pool_reference as pref

    only_graph = SAMPLES[name](np.random.default_rng(5), "float32")[
        len(SAMPLES[name](np.random.default_rng(5), "float64")) :
    ]
    assert only_graph
    for inputs, kw in only_graph:
        inputs = tuple(None if a is None else a.astype(np.float64) for a in inputs)
        (want,) = TORCH_REFERENCE[name](inputs, kw)
        if name == "convolution":
            x, w, b = inputs
            r = cv._fwd_resolve(_views(x=x, w=w, bias=b), kw)
            n = r.nsp
            xp = np.pad(x, [(0, 0), (0, 0), *zip(r.pad[:n], r.post[:n])])
            got = cref.conv_forward(xp, w, **dict(_conv_args(r), pad=(0,) * n))
            got = got if b is None else got + b.reshape(1, -1, *(1,) * n)
        else:
            r = pl._resolve_for(spec_view(_spec(inputs[0].shape, "float64")), "x", kw)
            n = r.nsp
            got = pref.pool_forward(inputs[0], r.mode, r.window[:n], r.stride[:n], tuple(zip(r.pad[:n], r.post[:n])))
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{name} {kw}")


def test_a_float64_or_channels_first_float32_bias_is_added_after_the_convolution(monkeypatch):
    """float64 has no graph, so a bias there is cudnnAddTensor after an unfused convolution (the calls the fused
    legacy forward makes); so is a channels-first float32 one (the fused graph would copy x, w and y channels-last);
    channels-last float32 and the half types keep the fused call (one graph)."""
    calls = []
    monkeypatch.setattr(cv, "convolution_forward", lambda x, w, b=None, **kw: calls.append(("conv", b)) or _Arr(
        "y", (2, 6, 7, 6), x.dtype))  # fmt: skip
    monkeypatch.setattr(cv, "add_tensor", lambda a, c: calls.append(("add", a.shape, c.name)) or c)
    d = autograd.get("convolution")

    class B(_Arr):
        def reshape(self, shape):
            return _Arr("b4", tuple(6 if s == -1 else s for s in shape), self.dtype)

    split = [("conv", None), ("add", (1, 6, 1, 1), "y")]
    for dtype, nhwc, want in (("float64", True, split), ("float32", False, split), ("float32", True, None),
                              ("bfloat16", False, None)):  # fmt: skip
        monkeypatch.setattr(cv, "_channels_last", lambda a, _v=nhwc: _v)
        calls.clear()
        b = B("b", (6,), dtype)
        d.forward(_Arr("x", (2, 4, 7, 6), dtype), _Arr("w", (6, 4, 3, 3), dtype), b, padding=1)
        assert calls == (want or [("conv", b)])
