"""Convolution on the CPU: the float64 references against torch, bad input refused before any cuDNN call, and the
legacy descriptors read back from cuDNN (host-side calls)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnkit import lib, ops, settings
from cudnnkit.ops import _conv_algos as ca
from cudnnkit.ops import convolution as cv
from cudnnkit.runtime import cudnn_dtype

from . import conv_reference as ref
from .conftest import FakeCAI


def _legacy(fn):
    with settings(prefer="legacy"):
        return fn()


def x(shape=(2, 4, 8, 8), typestr="<f4", device=0, strides=None):
    return FakeCAI(shape, typestr, device=device, strides=strides)


# ----------------------------------------------------------------- the references, held to torch


@pytest.mark.parametrize(
    "nsp, groups, stride, pad, dilation, mode",
    [
        (1, 1, (2,), (1,), (1,), "cross_correlation"),
        (2, 1, (1, 2), (1, 0), (2, 1), "cross_correlation"),
        (2, 2, (2, 1), (0, 2), (1, 2), "convolution"),
        (2, 4, (1, 1), (1, 1), (1, 1), "cross_correlation"),  # depthwise: groups = C
        (3, 2, (1, 2, 1), (1, 0, 1), (1, 1, 2), "cross_correlation"),
    ],
)
def test_references_agree_with_torch(nsp, groups, stride, pad, dilation, mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(nsp * 10 + groups)
    c, k = 4, 4 * (2 if groups > 1 else 1)
    xs = (2, c, *([7, 6, 5][:nsp]))
    ws = (k, c // groups, *([3, 2, 3][:nsp]))
    xa, wa = rng.standard_normal(xs), rng.standard_normal(ws)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    xt = torch.tensor(xa, requires_grad=True)
    wt = torch.tensor(wa if mode == "cross_correlation" else np.flip(wa, tuple(range(2, 2 + nsp))).copy(),
                      requires_grad=True)  # fmt: skip
    yt = conv(xt, wt, stride=stride, padding=pad, dilation=dilation, groups=groups)
    kw = dict(stride=stride, pad=pad, dilation=dilation, groups=groups, mode=mode)
    y = ref.conv_forward(xa, wa, **kw)
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    yt.backward(torch.tensor(dy))
    dx = ref.conv_backward_data(dy, wa, xs, **kw)
    dw = ref.conv_backward_filter(xa, dy, ws, **kw)
    wgrad = wt.grad.numpy() if mode == "cross_correlation" else np.flip(wt.grad.numpy(), tuple(range(2, 2 + nsp)))
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert np.allclose(dw, wgrad, rtol=1e-12, atol=1e-12)
    assert np.allclose(ref.conv_backward_bias(dy), dy.sum(axis=(0, *range(2, dy.ndim))))


# ----------------------------------------------------------------- refused before any cuDNN call

CASES = [
    (lambda: ops.convolution_forward(x(), x((4, 3, 3, 3))), ValueError, "x has 4 channels but w expects 3 per group"),
    (lambda: ops.convolution_forward(x(), x((6, 2, 3, 3)), groups=4), ValueError, "x has 4 channels but w expects 2"),
    (lambda: ops.convolution_forward(x(), x((6, 1, 3, 3)), groups=4), ValueError, r"output channels \(6\) must be"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), groups=0), ValueError, "groups must be a positive int"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3))), ValueError, "w must have 4 dims like x"),
    (lambda: ops.convolution_forward(x((2, 4)), x((4, 4))), ValueError, "x must have 3 to 5 dims"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3), "<f2")), TypeError, "w has dtype float16 but x has"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3), device=1)), ValueError, "w is on cuda:1 but x is on"),
    (lambda: ops.convolution_forward(x(typestr="<i4"), x((4, 4, 3, 3))), TypeError, "x has dtype int32"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 9, 9))), ValueError, "smaller than the dilated kernel 9"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), dilation=4), ValueError, "smaller than the dilated kernel"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), dilation=0), ValueError, "dilation must be >= 1"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), dilation=2**31), ValueError, "dilation must be at most"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), stride=(1, 1, 1)), ValueError, "stride must have 2"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), mode="conv"), ValueError, "mode must be one of"),
    (
        lambda: ops.convolution_forward(x(typestr="<f8"), x((4, 4, 2, 2), "<f8"), padding="same"),
        ValueError,
        r"neither cuDNN path.*float64.*padding \(0, 0\) before and \(1, 1\) after: cuDNN's legacy convolution pads",
    ),
    (
        lambda: _legacy(lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), padding=((0, 1), (1, 1)))),
        ValueError,
        r"prefer='legacy'.*before and \(1, 1\) after",
    ),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), x((3,))), ValueError, r"bias must have shape \(4,\)"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), x((4,), "<f2")), TypeError, "bias has dtype float16"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), z=x((2, 4, 5, 5))), ValueError, "z must have y's shape"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), z_alpha=2.0), TypeError, "z_alpha scales z"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), activation="gelux"), ValueError, "activation must be"),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), activation_coef=1.0), TypeError, "activation_coef is for"),
    (
        lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), x((4,)), beta=1.0, out=x((2, 4, 6, 6))),
        ValueError,
        "beta blends into out, which the fused forward",
    ),
    (
        lambda: ops.convolution_forward(x(typestr="<f8"), x((4, 4, 3, 3), "<f8"), activation="gelu"),
        ValueError,
        "neither cuDNN path.*activation 'gelu'",
    ),
    (
        lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), conv=ops.Convolution(padding=1), stride=2),
        TypeError,
        "pass conv= or stride=/padding=/dilation=/groups=/mode=, not both",
    ),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), conv=(1, 1)), TypeError, "conv must be a cudnnkit"),
    (
        lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), out=x((2, 4, 7, 7))),
        ValueError,
        r"out must have shape \(2, 4, 6, 6\)",
    ),
    (lambda: ops.convolution_forward(x(), x((4, 4, 3, 3)), beta=1.0), ValueError, "beta != 0 blends"),
    (
        lambda: ops.convolution_backward_data(x((2, 4, 6, 6)), x((4, 4, 3, 3)), x_shape=(2, 4, 9, 9)),
        ValueError,
        r"dy has shape \(2, 4, 6, 6\) but a convolution of x \(2, 4, 9, 9\)",
    ),
    (
        lambda: ops.convolution_backward_data(x((2, 4, 6, 6)), x((4, 4, 3, 3)), output_padding=1),
        ValueError,
        "output_padding 1 must be smaller than stride or dilation",
    ),
    (
        lambda: ops.convolution_backward_data(
            x((2, 4, 6, 6)), x((4, 4, 3, 3)), x_shape=(2, 4, 8, 8), output_padding=1
        ),  # fmt: skip
        TypeError,
        "pass x_shape= or output_padding=, not both",
    ),
    (
        lambda: ops.convolution_backward_data(x((2, 4, 6, 6)), x((4, 4, 3, 3)), padding="same"),
        ValueError,
        "padding='same' needs x_shape=",
    ),
    (  # the fuzzer's find (seed 1581): x's size derived from a w with a zero dim named w, not x
        lambda: ops.convolution_backward_data(x((1, 6, 2)), x((6, 0, 2)), groups=3),
        ValueError,
        r"w dims must be positive, got \(6, 0, 2\)",
    ),
    (
        lambda: ops.convolution_backward_filter(x(), x((2, 4, 6, 6)), w_shape=(4, 4, 2, 2)),
        ValueError,
        r"dy has shape \(2, 4, 6, 6\) but a convolution of x \(2, 4, 8, 8\) with w \(4, 4, 2, 2\) gives",
    ),
    (lambda: ops.convolution_backward_filter(x(), x((2, 4, 6, 6)), w_shape=None), TypeError, "w_shape is required"),
    (lambda: ops.convolution_backward_bias(x((2, 4))), ValueError, "dy must have 3 to 5 dims"),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_the_ops_are_declared():
    for name in ("convolution_forward", "convolution_backward_data", "convolution_backward_filter",
                 "convolution_backward_bias"):  # fmt: skip
        p = ops.REGISTRY[name]
        assert p.forms == ("graph", "legacy") and p.family == "convolution"
    assert ops.REGISTRY["convolution_forward"].differentiable == ("x", "w", "bias")


def _call(resolved, **arrays):
    from cudnnkit.ops._primitive import Call
    from cudnnkit.runtime import as_view

    return Call(None, {n: as_view(a, n) for n, a in arrays.items()}, resolved, extra={"graph_alignment": 16})


@pytest.mark.parametrize("nhwc", [False, True])
def test_the_fused_forward_graph(nhwc):
    """conv (asymmetric padding) -> + bias -> + z_alpha * z -> gelu, one graph, the output in out's layout; the
    graph lowers to backend descriptors host-side (finalizing it needs a GPU)."""
    from cudnnkit.ops._layout import channels_last_strides
    from cudnnkit.ops.activation import resolve_activation

    xs, ys = (2, 4, 8, 8), (2, 6, 7, 8)

    def st(shape):  # bytes, as __cuda_array_interface__ gives them
        return tuple(2 * v for v in channels_last_strides(shape)) if nhwc else None

    p = ops.Convolution(padding=((0, 1), (1, 1)))
    r = cv._resolve(p, "float16", xs, (6, 4, 3, 3), nhwc, ys)._replace(
        bias=True, z=True, z_alpha=0.5, act=resolve_activation("gelu")
    )
    assert "no such mode" in cv._legacy_refuses(r) and "before" in cv._legacy_refuses(r._replace(act=None))
    c = _call(r, x=x(xs, "<f2", strides=st(xs)), w=x((6, 4, 3, 3), "<f2", strides=st((6, 4, 3, 3))),
              bias=x((6,), "<f2"), z=x(ys, "<f2", strides=st(ys)), out=x(ys, "<f2", strides=st(ys)))  # fmt: skip
    g, names = cv.graph_builder("forward")(c)
    kinds = [(n.kind, dict(n.attrs).get("mode")) for n in g.nodes()]
    assert kinds == [
        ("conv_fprop", "cross_correlation"),
        ("pointwise", "ADD"),
        ("pointwise", "MUL"),  # z_alpha * z: cuDNN 9.19 fuses no ADD with alpha2 != 1 (measured)
        ("pointwise", "ADD"),
        ("pointwise", "GELU_FWD"),
    ]
    conv = dict(g.nodes()[0].attrs)
    assert conv["pre_padding"] == (0, 1) and conv["post_padding"] == (1, 1)
    assert [v for v, _ in g.constants().values()] == [0.5]
    assert sorted(names.values()) == ["bias", "out", "w", "x", "z"]
    out = next(t for t, n in names.items() if n == "out")
    assert out.strides == c.views["out"].strides and out.dtype == "float16"
    # eng8 computes the MUL of z wrong (measured on an H100, cuDNN 9.19): the graph denies it, z_alpha 1's does not
    assert g.known_bad_engines() == ("eng8",)
    arrays = dict(x=x(xs, "<f2", strides=st(xs)), w=x((6, 4, 3, 3), "<f2", strides=st((6, 4, 3, 3))),
                  bias=x((6,), "<f2"), z=x(ys, "<f2", strides=st(ys)), out=x(ys, "<f2", strides=st(ys)))  # fmt: skip
    g1, _ = cv.graph_builder("forward")(_call(r._replace(z_alpha=1.0), **arrays))
    assert g1.known_bad_engines() == () and "MUL" not in [dict(n.attrs).get("mode") for n in g1.nodes()]
    g.lower()  # every descriptor made and finalized up to the operation graph (no handle needed here)


def test_the_fused_3d_forward_graph_scales_z_with_a_5d_constant():
    """A 3-d convolution's fused forward (found by the fuzzer): ``z_alpha * z`` multiplies z by a constant of
    z's rank, 5-d (a 4-d one made the graph layer refuse the valid call: "b has 4 dims but x has 5"); the graph
    lowers host-side."""
    from cudnnkit.ops._layout import channels_last_strides
    from cudnnkit.ops.activation import resolve_activation

    xs, ws, ys = (2, 4, 3, 6, 5), (6, 4, 2, 3, 3), (2, 6, 2, 4, 3)

    def st(shape):
        return tuple(2 * v for v in channels_last_strides(shape))

    r = cv._resolve(ops.Convolution(), "float16", xs, ws, True, ys)._replace(
        z=True, z_alpha=-1.0, act=resolve_activation("leaky_relu")
    )
    c = _call(r, x=x(xs, "<f2", strides=st(xs)), w=x(ws, "<f2", strides=st(ws)), z=x(ys, "<f2", strides=st(ys)),
              out=x(ys, "<f2", strides=st(ys)))  # fmt: skip
    g, _ = cv.graph_builder("forward")(c)
    kinds = [(n.kind, dict(n.attrs).get("mode")) for n in g.nodes()]
    assert kinds[:3] == [("conv_fprop", "cross_correlation"), ("pointwise", "MUL"), ("pointwise", "ADD")]
    assert [v for v, _ in g.constants().values()][0] == -1.0
    assert {len(t.dims) for t in g.tensors()} == {5}
    g.lower()


@pytest.mark.parametrize("dtype, groups, z_alpha", [("float32", 2, 0.5), ("float32", 1, 0.5), ("float16", 2, 2.0),
                                                    ("bfloat16", 2, -1.0)])  # fmt: skip
def test_a_split_fused_forward_takes_asymmetric_padding(dtype, groups, z_alpha):
    """A fused forward whose fused graph cuDNN 9.19 gets wrong (``z_alpha != 1``, grouped or float32) runs the
    legacy steps; with asymmetric padding, which those cannot take, the graph's ``conv_fprop`` alone (its epilogue
    then runs as legacy calls). A graph-only activation there has no form at all: refused by name."""
    from cudnnkit.ops._primitive import refusals
    from cudnnkit.ops.activation import resolve_activation

    p = ops.REGISTRY["convolution_forward"]
    xs, ws, ys = (2, 4, 8, 8), (6, 4 // groups, 3, 4), (2, 6, 8, 8)
    views = {"x": x(xs, "<f4"), "w": x(ws, "<f4")}
    base = cv._resolve(ops.Convolution(padding="same", groups=groups), dtype, xs, ws, False, ys)
    r = base._replace(bias=True, z=True, z_alpha=z_alpha, act=resolve_activation("relu"), split=True)
    assert r.pad != r.post and "before" in cv._legacy_refuses(r)
    assert refusals(p, dtype, r, {}, "auto")[0] is None  # the graph takes it (split)
    sym = r._replace(post=r.pad)
    assert "measured" in refusals(p, dtype, sym, {}, "auto")[0]  # the legacy steps run the symmetric call
    assert refusals(p, dtype, r, {"alpha": 2.0}, "auto")[0] is None  # the convolution's graph blends alpha
    gelu = r._replace(act=resolve_activation("gelu"))
    with pytest.raises(ValueError, match="neither cuDNN path.*measured.*no such mode"):
        refusals(p, dtype, gelu, {}, "auto")
    unsplit = sym._replace(dtype="float16", z_alpha=1.0, split=False)
    assert refusals(p, "float16", unsplit, {"alpha": 2.0}, "auto")[0].startswith("alpha with a fused forward")
    c = _call(r, out=x(ys, "<f2"), **views, bias=x((6,), "<f2"), z=x(ys, "<f2"))
    g, names = cv.graph_builder("forward")(c)
    assert [n.kind for n in g.nodes()] == ["conv_fprop"] and sorted(names.values()) == ["out", "w", "x"]
    # the resolve marks it: fused with z_alpha != 1, grouped or float32 (float32 with z_alpha 1: one fused graph)
    kw = {"padding": "same", "groups": groups, "z_alpha": z_alpha}
    fv = {"x": x(xs, "<f4"), "w": x(ws, "<f4"), "bias": x((6,), "<f4"), "z": x(ys, "<f4")}
    from cudnnkit.runtime import as_view

    got = cv._fwd_resolve({n: as_view(a, n) for n, a in fv.items()}, kw)
    assert got.split and got.pad != got.post
    got = cv._fwd_resolve({n: as_view(a, n) for n, a in fv.items() if n != "z"}, {**kw, "z_alpha": 1.0})
    assert not got.split  # float32 with a bias: the fused graph
    assert refusals(p, "float32", got, {}, "auto")[0] is None
    assert not cv._fwd_resolve({n: as_view(a, n) for n, a in fv.items()}, {**kw, "z_alpha": 1.0}).split  # z, 1
    shapes = {"x": xs, "w": ws, "bias": (6,), "z": ys}
    views16 = {n: as_view(x(shapes[n], "<f2"), n) for n in fv}
    assert not cv._fwd_resolve({n: v for n, v in views16.items() if n != "z"}, {**kw, "z_alpha": 1.0}).split
    assert cv._fwd_resolve(views16, kw).split == (groups > 1 and z_alpha != 1.0)


def test_the_l3_forward_splits_a_channels_first_float32_bias():
    """The L3 convolution's layout test (``_channels_last``): arrays the graph takes channels-last as they are (a
    channels-first x keeps the float32 bias apart from the convolution: the fused graph would copy x, w and y)."""
    from cudnnkit.ops._layout import channels_last_strides

    for shape in ((2, 4, 8, 8), (2, 4, 5), (2, 4, 3, 5, 6)):
        cl = tuple(4 * s for s in channels_last_strides(shape))
        assert not cv._channels_last(x(shape)) and cv._channels_last(x(shape, strides=cl))
    assert not cv._channels_last(x((2, 4, 8, 8), strides=(4, 512, 64, 8)))  # another layout
    # both layouts (C = 1, or 1x1 spatial), as the graph form reads them: taken channels-last with no copy
    assert cv._channels_last(x((2, 1, 8, 8))) and cv._channels_last(x((2, 4, 1, 1)))


@pytest.mark.parametrize("dtype", ["<f4", "<f2"])
def test_the_bias_gradient_graph(dtype):
    """db = dy summed over all but the channels: one reduction node from dy as given (channels-last) into the
    packed (K,) output, described (1, K, 1, 1), in the output's dtype; it lowers host-side. An empty dy (a sum
    over nothing) and a blend are the legacy call's."""
    from cudnnkit.ops._layout import channels_last_strides

    ys = (4, 6, 5, 7)
    size = 4 if dtype == "<f4" else 2
    dy = x(ys, dtype, strides=tuple(size * s for s in channels_last_strides(ys)))
    r = cv._bias_resolve({"dy": dy_view(dy)}, {})
    assert r.db_shape == (6,) and r.nhwc and (cv._bias_graph_refuses(r, {}) is None) == (size == 4)
    assert "empty" in cv._bias_graph_refuses(r._replace(empty=True), {})
    assert "channels-last" in cv._bias_graph_refuses(r._replace(nhwc=False, dtype="float32"), {})
    if size == 4:
        assert "blend" in cv._bias_graph_refuses(r, {"alpha": 2.0}) and "blend" in cv._bias_graph_refuses(
            r, {"beta": 1}
        )
    else:
        assert "float16 db" in cv._bias_graph_refuses(r, {})
    g, names = cv._bias_graph_build(_call(r, dy=dy, out=x((6,), dtype)))
    (node,) = g.nodes()
    assert node.kind == "reduction" and dict(node.attrs) == {"mode": "add", "compute_dtype": "float32"}
    out = next(t for t, n in names.items() if n == "out")
    src = next(t for t, n in names.items() if n == "dy")
    assert out.dims == (1, 6, 1, 1) and out.strides == (6, 1, 1, 1)
    assert out.dtype == ("float32" if size == 4 else "float16")
    assert src.dims == ys and src.strides == channels_last_strides(ys)
    g.lower()


def dy_view(a):
    from cudnnkit.runtime import as_view

    return as_view(a, "dy")


def test_backward_graphs_take_asymmetric_padding():
    p = ops.Convolution(stride=2, padding=((1, 2),))
    xs, ws = (2, 4, 9), (6, 2, 4)
    r = cv._resolve(p, "bfloat16", xs, ws, False, (2, 6, 5))._replace(groups=2)
    dy = x((2, 6, 5), "<f4")
    for which, arrays, out in (("data", dict(dy=dy, w=x(ws)), x(xs)), ("filter", dict(x=x(xs), dy=dy), x(ws))):
        g, names = cv.graph_builder(which)(_call(r, out=out, **arrays))
        node = g.nodes()[0]
        a = dict(node.attrs)
        assert node.kind == f"conv_{'dgrad' if which == 'data' else 'wgrad'}"
        assert a["pre_padding"] == (1, 0) and a["post_padding"] == (2, 0) and a["stride"] == (2, 1)


# ----------------------------------------------------------------- descriptors, read back from cuDNN


def _read_conv(d, nsp):
    n = ctypes.c_int()
    pad, stride, dil = (ctypes.c_int * 8)(), (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    mode, comp = ctypes.c_int(), ctypes.c_int()
    lib.cudnnGetConvolutionNdDescriptor(
        d, nsp, ctypes.byref(n), pad, stride, dil, ctypes.byref(mode), ctypes.byref(comp)
    )
    g, m = ctypes.c_int(), ctypes.c_int()
    lib.cudnnGetConvolutionGroupCount(d, ctypes.byref(g))
    lib.cudnnGetConvolutionMathType(d, ctypes.byref(m))
    k = n.value
    return tuple(pad[:k]), tuple(stride[:k]), tuple(dil[:k]), mode.value, comp.value, g.value, m.value


@pytest.mark.parametrize(
    "dtype, tf32, nsp, want_math",
    [
        ("float16", True, 2, lib.CUDNN_TENSOR_OP_MATH),
        ("bfloat16", True, 3, lib.CUDNN_TENSOR_OP_MATH),
        ("float32", True, 2, lib.CUDNN_DEFAULT_MATH),
        ("float32", False, 1, lib.CUDNN_FMA_MATH),
        ("float64", True, 2, lib.CUDNN_DEFAULT_MATH),
    ],
)
def test_conv_descriptor_reads_back(dtype, tf32, nsp, want_math):
    p = ops.Convolution(stride=2, padding=1, dilation=(3,) * nsp, groups=2, mode="convolution")
    xs, ws = (2, 4, *([9] * nsp)), (6, 2, *([2] * nsp))
    with settings(allow_tf32=tf32):
        y = cv.conv_output_shape(xs, ws, stride=2, padding=1, dilation=3, groups=2)
        r = cv._resolve(p, dtype, xs, ws, False, y)
    n = max(nsp, 2)  # 1-d runs as 2-d
    pad, stride, dil, mode, comp, g, math = _read_conv(cv.conv_descriptor(r), n)
    assert (pad, stride, dil) == ((1,) * nsp + (0,) * (n - nsp), (2,) * nsp + (1,) * (n - nsp),
                                  (3,) * nsp + (1,) * (n - nsp))  # fmt: skip
    assert mode == lib.CUDNN_CONVOLUTION and g == 2 and math == want_math
    assert comp == cudnn_dtype("float64" if dtype == "float64" else "float32")


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_output_dims_agree_with_cudnn(nsp):
    """cuDNN's own output-dim query on the descriptors a call makes gives the output shape the op allocates."""
    from cudnnkit.runtime.descriptors import int_array, tensor_descriptor
    from cudnnkit.runtime.view import contiguous_strides

    xs, ws = (3, 6, *([11, 9, 7][:nsp])), (4, 3, *([3, 2, 3][:nsp]))
    p = ops.Convolution(stride=(2, 1, 3)[:nsp], padding=(1, 0, 2)[:nsp], dilation=(1, 2, 1)[:nsp], groups=2)
    y = cv.conv_output_shape(xs, ws, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=2)
    r = cv._resolve(p, "float32", xs, ws, False, y)
    xs4 = xs + (1,) if nsp == 1 else xs
    ws4 = ws + (1,) if nsp == 1 else ws
    xd = tensor_descriptor("float32", xs4, contiguous_strides(xs4))
    wd = ca.get_cached(ca.FILTER, ("float32", lib.CUDNN_TENSOR_NCHW, ws4))
    out = int_array([0] * len(xs4))
    lib.cudnnGetConvolutionNdForwardOutputDim(cv.conv_descriptor(r), xd, wd, len(xs4), out)
    assert tuple(out)[: len(y)] == y


def test_layouts_and_new_output_strides():
    """A channels-last x gives a channels-last y; other layouts are copied (C order)."""
    shape = (2, 4, 5, 3)
    cl = cv.channels_last_strides(shape)
    assert cl == (60, 1, 12, 4)

    class V:
        def __init__(self, shape, strides):
            self.shape, self.strides = shape, strides

        def is_contiguous(self):
            from cudnnkit.runtime.view import contiguous_strides

            return self.strides == contiguous_strides(self.shape)

    assert cv.layout_of(V(shape, (60, 15, 3, 1))) == "nchw"
    assert cv.layout_of(V(shape, cl)) == "nhwc"
    assert cv.layout_of(V(shape, (120, 30, 6, 2))) is None  # gaps: copied
    assert cv.layout_of(V((2, 1, 5, 3), (15, 99, 3, 1))) is not None  # one channel: a size-1 dim's stride is moot


# ----------------------------------------------------------------- the call sequence, on the CPU fakes


class _Emulated:
    """cuDNN's convolution algorithm queries and calls emulated on the CPU fakes: three forward candidates (the
    fastest non-deterministic with 1 GiB of workspace, a deterministic one with 4 KiB, one without workspace)."""

    PERF = [(1, 1 << 30, 0), (2, 4096, 1), (0, 0, 1)]

    def __init__(self, backend):
        self.calls: list[tuple] = []
        for name in ("cudnnGetConvolutionForwardAlgorithmMaxCount", "cudnnGetConvolutionForwardAlgorithm_v7",
                     "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward",
                     "cudnnReduceTensor", "cudnnGetReductionWorkspaceSize",
                     "cudnnGetReductionIndicesSize"):  # fmt: skip
            backend._patch(lib, name, getattr(self, name[5:]))

    def GetReductionWorkspaceSize(self, h, rd, ad, cd, size):
        size._obj.value = 0
        return 0

    GetReductionIndicesSize = GetReductionWorkspaceSize

    def GetConvolutionForwardWorkspaceSize(self, h, xd, wd, cd, yd, algo, size):
        size._obj.value = {a: m for a, m, _ in self.PERF}[algo]
        return 0

    def GetConvolutionForwardAlgorithmMaxCount(self, h, count):
        count._obj.value = len(self.PERF)
        return 0

    def GetConvolutionForwardAlgorithm_v7(self, h, xd, wd, cd, yd, n, returned, perf):
        self.calls.append(("get", xd.key, wd.key, yd.key))
        for i, (algo, mem, det) in enumerate(self.PERF[:n]):
            perf[i].algo, perf[i].status, perf[i].memory, perf[i].determinism = algo, 0, mem, det
        returned._obj.value = min(n, len(self.PERF))
        return 0

    def ConvolutionForward(self, h, alpha, xd, x, wd, w, cd, algo, ws, n, beta, yd, y):
        self.calls.append(("forward", algo, n, xd.key, wd.key, yd.key))
        return 0

    def ReduceTensor(self, h, rd, idx, isz, ws, wsz, alpha, dyd, dy, beta, dbd, db):
        self.calls.append(("bias", dyd.key, dbd.key))
        return 0


@pytest.fixture
def emulated():
    from .fuzz.materialize import FakeBackend

    b = FakeBackend()
    with b.installed(), settings(prefer="legacy"):  # the legacy calls' algorithm choice
        ca._algos.clear()
        yield b, _Emulated(b)
    ca._algos.clear()


def _fake(backend, shape, dtype="float32", layout=("c",)):
    from .fuzz.model import A

    return backend.array(A(tuple(shape), dtype, layout=layout), None, "fakeA", None)


def test_algorithm_choice_follows_the_settings(emulated, caplog):
    from cudnnkit.runtime.launch import Launch

    b, emu = emulated
    x, w = _fake(b, (2, 4, 8, 8)), _fake(b, (4, 4, 3, 3))

    def algos():
        return [c[1:3] for c in emu.calls if c[0] == "forward"]

    ops.convolution_forward(x, w, padding=1)
    ops.convolution_forward(x, w, padding=1)  # cached: no second query
    with settings(deterministic=True):
        ops.convolution_forward(x, w, padding=1)
    with settings(workspace_limit=100):
        ops.convolution_forward(x, w, padding=1)
    assert algos() == [(1, 1 << 30), (1, 1 << 30), (2, 4096), (0, 0)]
    assert [c[0] for c in emu.calls].count("get") == 3  # one per settings, not per call
    real = Launch.workspace

    def small(self, nbytes, zeroed=False):  # memory for 1 MiB of workspace at most
        if nbytes > 1 << 20:
            raise MemoryError(f"{nbytes} bytes")
        return real(self, nbytes, zeroed)

    b._patch(Launch, "workspace", small)
    emu.calls.clear()
    with caplog.at_level("INFO", logger="cudnnkit"):
        ops.convolution_forward(x, w, padding=1)
    assert algos() == [(2, 4096)]  # the next one with a smaller workspace, never an out-of-memory error
    assert "could not be allocated" in caplog.text


def test_descriptors_of_a_1d_and_a_channels_last_call(emulated):
    b, emu = emulated
    x1, w1 = _fake(b, (2, 3, 10)), _fake(b, (6, 3, 3))
    y = ops.convolution_forward(x1, w1, stride=2)
    assert tuple(y.shape) == (2, 6, 4)
    fwd = [c for c in emu.calls if c[0] == "forward"][-1]
    assert fwd[3][2] == (2, 3, 10, 1)  # x as 2-d with a trailing size-1 dim
    assert fwd[4][-1] == (6, 3, 3, 1) and fwd[4][-2] == lib.CUDNN_TENSOR_NCHW  # the filter too
    nhwc = ("perm", (0, 2, 3, 1))
    x, w = _fake(b, (2, 4, 8, 8), layout=nhwc), _fake(b, (8, 4, 3, 3), layout=nhwc)
    y = ops.convolution_forward(x, w, padding=1)
    assert tuple(y.strides) == cv.channels_last_strides((2, 8, 8, 8))  # y stays channels-last (fake strides: elements)
    fwd = [c for c in emu.calls if c[0] == "forward"][-1]
    assert fwd[4][-2] == lib.CUDNN_TENSOR_NHWC  # a channels-last filter is described as NHWC (KRSC)
    db = ops.convolution_backward_bias(_fake(b, (2, 8, 5)))
    assert tuple(db.shape) == (8,)
    bias = [c for c in emu.calls if c[0] == "bias"][-1]
    assert bias[1][2] == (2, 8, 5, 1) and bias[2][2] == (1, 8, 1, 1)


def test_math_types_a_call_may_take():
    """float32 without TF32 runs FMA candidates only; no call takes a down-converting math type."""
    p = ops.Convolution()
    for dtype, tf32, want in (("float32", False, {lib.CUDNN_FMA_MATH}),
                              ("float32", True, {lib.CUDNN_DEFAULT_MATH, lib.CUDNN_TENSOR_OP_MATH, lib.CUDNN_FMA_MATH}),
                              ("float16", True, {lib.CUDNN_DEFAULT_MATH, lib.CUDNN_TENSOR_OP_MATH, lib.CUDNN_FMA_MATH})):  # fmt: skip
        with settings(allow_tf32=tf32):
            r = cv._resolve(p, dtype, (1, 2, 4, 4), (2, 2, 3, 3), False, (1, 2, 2, 2))
        assert ca._allowed_math(r) == want
        assert lib.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION not in ca._allowed_math(r)


def test_a_1d_channels_last_array_keeps_its_layout_as_2d():
    from cudnnkit.ops._nd import as_2d

    assert as_2d((2, 4, 5), (20, 1, 4)) == ((2, 4, 5, 1), (20, 1, 4, 4))  # channels-last: W's stride is C
    assert as_2d((2, 4, 5), (20, 5, 1)) == ((2, 4, 5, 1), (20, 5, 1, 1))  # C order


def test_a_filter_in_another_layout_than_x_is_copied_to_xs(emulated):
    """x channels-last and w in C order: w is copied to KRSC, so cuDNN sees one format (torch does the same)."""
    b, emu = emulated
    nhwc = ("perm", (0, 2, 3, 1))
    x, w = _fake(b, (2, 4, 8, 8), layout=nhwc), _fake(b, (8, 4, 3, 3))
    ops.convolution_forward(x, w, padding=1)
    fwd = [c for c in emu.calls if c[0] == "forward"][-1]
    assert fwd[4][-2] == lib.CUDNN_TENSOR_NHWC


def test_express_hits_bind_the_filter_copy_the_plan_was_built_for(monkeypatch):
    """Regression found in review: channels-last x with a C-order w runs on a channels-last copy of w (prepare);
    the express hits must bind that copy again, not the caller's C-order w under the plan's KRSC strides."""
    import numpy as np

    from cudnnkit import ops
    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_plans

    bound = recording_plans(monkeypatch)
    b = FakeBackend()
    with b.installed():
        monkeypatch.setitem(adapters.KEYED, FakeArray, lambda a: b.adapters[a.lib].key(a))
        _express.entries.clear()
        x = b.array(A((2, 8, 8, 8), "float16", layout=("perm", (0, 2, 3, 1))), np.zeros((2, 8, 8, 8)), "fakeA", None)
        w = b.array(A((16, 8, 3, 3), "float16", layout=("c",)), np.zeros((16, 8, 3, 3)), "fakeA", None)
        for _ in range(4):
            ops.convolution_forward(x, w, padding=1)
            assert bound[-1]["w"][1] != w.ptr and bound[-1]["x"][1] == x.ptr
        _express.entries.clear()


@pytest.mark.parametrize("alpha", [1.0, 0.5])
@pytest.mark.parametrize("layout", [("c",), ("perm", (0, 2, 3, 1))], ids=["nchw", "nhwc"])
def test_split_fused_forward_runs_its_epilogue_on_every_call(monkeypatch, alpha, layout):
    """A split fused forward (grouped with ``z_alpha != 1``, asymmetric padding): every call, express hits included, runs the
    convolution's graph (x, w and out bound, no bias or z), then on the caller's out ``cudnnAddTensor`` of the
    bias, of ``z_alpha * z`` (z as given) and ``cudnnActivationForward``, after the graph's alpha blend (a
    pointer-only express form would skip the epilogue: found in review to be untested)."""
    import numpy as np

    from cudnnkit import ops
    from cudnnkit.ops import _express, _graphform
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_plans

    runs = recording_plans(monkeypatch)
    calls = []

    def add(h, a, ad, ap, bb, cd, cp):
        calls.append(("add", ap, cp))

    def act(h, d, a, xd, xp, bb, yd, yp):
        calls.append(("act", xp, yp))

    b = FakeBackend()
    with b.installed():  # the fake backend gates every cuDNN call: the two legacy calls recorded instead
        monkeypatch.setattr(lib, "cudnnAddTensor", add)
        monkeypatch.setattr(lib, "cudnnActivationForward", act)
        monkeypatch.setitem(adapters.KEYED, FakeArray, lambda a: b.adapters[a.lib].key(a))
        _express.entries.clear()
        _graphform._forms.clear()  # plans of earlier tests record into their own lists

        def arr(shape):
            return b.array(A(shape, "float32", layout=layout if len(shape) == 4 else ("c",)), np.zeros(shape),
                           "fakeA", None)  # fmt: skip

        xx, w, bias, z = arr((2, 4, 9, 8)), arr((6, 2, 3, 4)), arr((6,)), arr((2, 6, 9, 8))
        try:
            for _ in range(3):
                out = arr((2, 6, 9, 8))
                calls.clear()
                n = len(runs)
                got = ops.convolution_forward(xx, w, bias, z=z, z_alpha=-0.5, activation="relu", padding="same",
                                              groups=2, alpha=alpha, out=out)  # fmt: skip
                assert got is out and ops.last_path() == ("convolution_forward", "graph")
                assert len(runs) == n + 1 and sorted(runs[-1]) == ["out", "w", "x"]
                blend = [("add", runs[-1]["out"][1], out.ptr)] if alpha != 1.0 else []  # temporary -> out
                assert calls == blend + [("add", bias.ptr, out.ptr), ("add", z.ptr, out.ptr), ("act", out.ptr, out.ptr)]
        finally:
            _express.entries.clear()
            _graphform._forms.clear()


def test_split_fused_forward_names_a_z_past_cudnns_int():
    """The split forward's epilogue describes z for ``cudnnAddTensor`` (cuDNN's int dims and strides) before any
    work: a z whose stride passes 2**31 - 1 is refused naming z, not with the descriptor's bare range error."""
    import numpy as np

    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A

    b = FakeBackend()
    with b.installed():
        adapters.KEYED[FakeArray] = lambda a: b.adapters[a.lib].key(a)
        try:
            xx, w, bias = (b.array(A(s, "float32"), np.zeros(s), "fakeA", None) for s in ((2, 4, 9, 8), (6, 2, 3, 4),
                                                                                          (6,)))  # fmt: skip
            z = FakeArray((2, 6, 9, 8), "float32", (2**31, 72, 8, 1), b.alloc(4 * (2**31 + 432)), "fakeA")
            with pytest.raises(ValueError, match=r"^z \(shape \(2, 6, 9, 8\)\) is too large for cuDNN's tensor"):
                ops.convolution_forward(xx, w, bias, z=z, z_alpha=-0.5, activation="relu", padding="same", groups=2)
        finally:
            adapters.KEYED.pop(FakeArray, None)
            _express.entries.clear()


QUANT_CASES = [
    (dict(out_dtype="int32"), "int8", ValueError, r"out_dtype must be one of \('float32', .*'int8'\) for int8 x"),
    (dict(out_dtype="int8"), "float8_e5m2", ValueError, "out_dtype must be one of .* for float8_e5m2 x"),
    (dict(activation="relu"), "int8", ValueError, "bias=, z= and activation= are for float x"),
    (dict(alpha=2.0), "float8_e4m3fn", ValueError, "alpha/beta with float8_e4m3fn x"),
    (dict(scale="x"), "int8", TypeError, "scale must be a real number"),
    (dict(out_dtype="int8"), "float32", ValueError, "out_dtype is for int8/fp8 x"),
    (dict(scale=0.5), "float16", ValueError, "scale= is the quantized forward's"),
]


@pytest.mark.parametrize("kw, dtype, exc, msg", QUANT_CASES)
def test_quantized_forward_arguments_are_checked_before_cudnn(kw, dtype, exc, msg):
    from types import SimpleNamespace

    from cudnnkit.ops import convolution as cvm

    def v(shape, strides, size):
        return SimpleNamespace(ndim=4, shape=shape, strides=strides, dtype=dtype, size=size, is_contiguous=lambda: True)

    views = {"x": v((2, 16, 8, 8), (1024, 64, 8, 1), 2048), "w": v((32, 16, 3, 3), (144, 9, 3, 1), 4608),
             "bias": None, "z": None}  # fmt: skip
    with pytest.raises(exc, match=msg):
        cvm._fwd_resolve(views, {"padding": 1, **kw})


def test_quantized_forward_is_one_graph_conv_mul_in_its_out_dtype(monkeypatch):
    """int8/fp8 x: conv_fprop (int32 compute for int8, float32 for fp8) -> MUL by the scale -> y in out_dtype, on
    the graph only (the legacy call refuses it by name); the output is allocated in out_dtype."""
    import numpy as np

    from cudnnkit import ops, settings
    from cudnnkit.graph import Graph
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_plans

    built = []
    recording_plans(monkeypatch)
    real = Graph.build
    monkeypatch.setattr(Graph, "build", lambda self, device=None, **kw: built.append(self) or real(self, device, **kw))
    b = FakeBackend()
    with b.installed():
        _express.entries.clear()
        for dtype, out_dtype, compute in (("int8", None, "int32"), ("float8_e4m3fn", "bfloat16", "float32")):
            x = b.array(A((2, 16, 8, 8), dtype, layout=("perm", (0, 2, 3, 1))), np.zeros((2, 16, 8, 8)), "fakeA",
                        None)  # fmt: skip
            w = b.array(A((32, 16, 3, 3), dtype, layout=("perm", (0, 2, 3, 1))), np.zeros((32, 16, 3, 3)), "fakeA",
                        None)  # fmt: skip
            y = ops.convolution_forward(x, w, padding=1, out_dtype=out_dtype, scale=0.25)
            assert ops.last_path() == ("convolution_forward", "graph")
            assert b.dtype_of(y) == (out_dtype or "float32")
            conv, mul = built[-1].nodes()  # the graph the last call built
            assert conv.kind == "conv_fprop" and conv.attr("compute_dtype") == compute
            assert mul.kind == "pointwise" and mul.attr("mode") == "MUL"
            with settings(prefer="legacy"), pytest.raises(ValueError, match=f"{dtype} x .*graph API"):
                ops.convolution_forward(x, w, padding=1)
        _express.entries.clear()


def test_a_channels_last_half_depthwise_forward_runs_channels_first(monkeypatch):
    """cuDNN 9.19's channels-last depthwise engines are 13x slower than its NCHW ones (H200): a channels-last
    bf16/f16 2-d depthwise forward reaches the plan as C-order copies of x and w, and y is written through a
    C-order temporary copied into the caller's channels-last array (x's copy is ``Launch.contiguous``'s), on every call (express hits too); a grouped
    (not depthwise) conv and a float32 depthwise one stay channels-last."""
    import numpy as np

    from cudnnkit import ops
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_copies, recording_plans

    runs, copies = recording_plans(monkeypatch), recording_copies(monkeypatch)
    b = FakeBackend()
    nhwc = ("perm", (0, 2, 3, 1))
    with b.installed():
        _express.entries.clear()
        for dtype, groups, first in (("bfloat16", 8, True), ("float16", 8, True), ("bfloat16", 2, False),
                                     ("float32", 8, False)):  # fmt: skip
            x = b.array(A((2, 8, 6, 6), dtype, layout=nhwc), np.zeros((2, 8, 6, 6)), "fakeA", None)
            w = b.array(A((8, 8 // groups, 3, 3), dtype, layout=nhwc), np.zeros((8, 8 // groups, 3, 3)), "fakeA",
                        None)  # fmt: skip
            for _ in range(3):
                copies.clear()
                y = ops.convolution_forward(x, w, padding=1, groups=groups)
                seen = runs[-1]
                assert y.strides == (288, 1, 48, 8)  # the caller gets channels-last (element strides)
                if first:
                    assert seen["x"][0] == (288, 36, 6, 1) and seen["out"][0] == (288, 36, 6, 1)
                    assert seen["w"][0] == (9, 9, 3, 1)  # w (C/g = 1: the same memory) described C order
                    assert seen["x"][1] != x.ptr and seen["out"][1] != y.ptr and copies == ["out"]  # y copied back
                else:
                    assert seen["x"][0] == (288, 1, 48, 8) and seen["x"][1] == x.ptr and copies == []
        _express.entries.clear()
