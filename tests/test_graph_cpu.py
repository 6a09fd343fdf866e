"""Graph layer on the CPU: definition, shape inference, errors, keys, and lowering to finalized backend
descriptors (cuDNN finalizes tensors, operation nodes and the operation graph without a GPU)."""

from __future__ import annotations

import pytest

import cudnnkit
from cudnnkit import lib
from cudnnkit.graph import POINTWISE_ARITY, Graph, GraphError
from cudnnkit.runtime import shapes

from .conftest import FakeCAI


def conv_bias_relu(dims=(8, 64, 16, 16), k=32, pad=1, stride=1, dtype="float16", **kw):
    g = Graph(**kw)
    n, c, h, w = dims
    x = g.tensor(dims, (c * h * w, 1, w * c, c), dtype, name="x")  # NHWC
    wt = g.tensor((k, c, 3, 3), (c * 9, 1, 3 * c, c), dtype, name="w")
    b = g.tensor((1, k, 1, 1), dtype=dtype, name="bias")
    y = g.conv_fprop(x, wt, pre_padding=pad, stride=stride)
    out = g.mark_output(g.pointwise("RELU_FWD", g.pointwise("ADD", y, b)), dtype)
    return g, x, wt, b, y, out


def test_tensors_get_unique_ids_and_default_strides():
    g = Graph()
    a, b = g.tensor((2, 3, 4)), g.tensor((5,), dtype="bfloat16")
    assert (a.uid, b.uid) == (1, 2)
    assert a.strides == (12, 4, 1) and b.dtype == "bfloat16" and not a.virtual
    t = g.tensor_like(FakeCAI((4, 6), "<f2", strides=(2, 8)), name="v")
    assert (t.dims, t.strides, t.dtype, t.name) == ((4, 6), (1, 4), "float16", "v")


def test_conv_bias_relu_shapes_layout_and_lowering():
    g, x, w, b, y, out = conv_bias_relu()
    assert y.virtual and y.dtype == "float32"  # intermediates in the graph's intermediate type
    assert y.dims == shapes.conv_output_shape(x.dims, w.dims, padding=1) == (8, 32, 16, 16)
    assert y.strides == (8192, 1, 512, 32)  # keeps x's NHWC order
    assert not out.virtual and out.dtype == "float16"
    low = g.lower()
    assert len(low.ops) == 3 and low.op_graph.finalized
    assert low.tensors[out.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [8, 32, 16, 16]
    assert low.tensors[y.uid].get("CUDNN_ATTR_TENSOR_IS_VIRTUAL") is True
    assert low.tensors[out.uid].get("CUDNN_ATTR_TENSOR_DATA_TYPE") == lib.CUDNN_DATA_HALF


@pytest.mark.parametrize("mode", sorted(POINTWISE_ARITY))
def test_every_pointwise_mode_lowers_and_finalizes(mode):
    g = Graph()
    if not lib.available(f"CUDNN_POINTWISE_{mode}"):  # newer than the loaded library: refused at definition
        with pytest.raises(lib.FeatureVersionError, match=f"pointwise mode '{mode}' needs cuDNN 9"):
            g.pointwise(mode, g.tensor((2, 3, 4), name="x"), g.tensor((2, 3, 4), name="b"))
        return
    roles = POINTWISE_ARITY[mode].split(",")
    ins = {r: g.tensor((2, 3, 4) if r != "b" else (1, 3, 1), name=r) for r in roles}
    kw = {"axis": 1} if mode == "GEN_INDEX" else {}
    if "dy" in ins:
        out = g.pointwise(mode, ins["x"], dy=ins["dy"])
    else:
        out = g.pointwise(mode, *ins.values(), **kw)
    assert out.dims == (2, 3, 4)
    g.mark_output(out)
    assert g.lower().op_graph.finalized


def test_pointwise_parameters_reach_cudnn():
    g = Graph()
    x = g.tensor((4, 8))
    g.mark_output(g.pointwise("RELU_FWD", x, relu_lower_clip=0.0, relu_upper_clip=6.0, relu_lower_clip_slope=0.1))
    g.lower()
    g2 = Graph()
    x2 = g2.tensor((4, 8))
    g2.mark_output(g2.pointwise("GEN_INDEX", x2, axis=-1))  # counted from the end, as in NumPy
    assert dict(g2._nodes[0].attrs)["axis"] == 1
    g2.lower()
    with pytest.raises(GraphError, match="axis 2 is out of range for x of rank 2"):
        g2.pointwise("GEN_INDEX", x2, axis=2)  # refused when defined, before cuDNN sees it


@pytest.mark.parametrize("nan", [None, True, False])
def test_pointwise_nan_propagation_reaches_cudnn(nan):
    g = Graph()
    x = g.tensor((4, 8))
    kw = {} if nan is None else {"nan_propagation": nan}
    g.mark_output(g.pointwise("RELU_FWD", x, **kw))
    attrs = dict(g._nodes[0].attrs)
    assert attrs.get("nan_propagation") is nan  # None: the attribute is left unset (cuDNN's default)
    assert g.lower().op_graph.finalized
    with pytest.raises(TypeError, match="nan_propagation must be a bool, got 1"):
        g.pointwise("RELU_FWD", x, nan_propagation=1)


def test_matmul_reduction_and_conv_backward_lower():
    g = Graph()
    a, b = g.tensor((4, 1, 16, 32)), g.tensor((1, 3, 32, 8))
    c = g.matmul(a, b)
    assert c.dims == (4, 3, 16, 8)
    s = g.reduction(c, (4, 3, 16, 1), mode="max")
    g.mark_output(s)
    g.lower()
    g = Graph()
    x, dy = g.tensor((2, 8, 10, 10)), g.tensor((2, 16, 5, 5))
    w = g.tensor((16, 8, 3, 3))
    dw = g.mark_output(g.conv_wgrad(x, dy, (16, 8, 3, 3), stride=2, pre_padding=1, post_padding=0))
    dx = g.mark_output(g.conv_dgrad(dy, w, (2, 8, 10, 10), stride=2, pre_padding=1, post_padding=0))
    assert dw.dims == (16, 8, 3, 3) and dx.dims == (2, 8, 10, 10)
    assert len(g.lower().ops) == 2


@pytest.mark.parametrize(
    "build, msg",
    [
        (lambda g: g.pointwise("NOPE", g.tensor((2,))), "unknown pointwise mode"),
        (lambda g: g.pointwise("ADD", g.tensor((2, 3))), "needs x, b; b is missing"),
        (lambda g: g.pointwise("EXP", g.tensor((2,)), g.tensor((2,))), "takes x, not b"),
        (lambda g: g.pointwise("ADD", g.tensor((2, 3)), g.tensor((2, 4))), "dim 1 cannot broadcast"),
        (lambda g: g.pointwise("ADD", g.tensor((2, 3)), g.tensor((3,))), "pointwise inputs have one rank"),
        (lambda g: g.pointwise("GEN_INDEX", g.tensor((2,))), "GEN_INDEX needs axis="),
        (lambda g: g.pointwise("EXP", g.tensor((2,)), elu_alpha=1.0), "elu_alpha applies to"),
        (lambda g: g.matmul(g.tensor((2, 3)), g.tensor((4, 5))), "K must agree"),
        (
            lambda g: g.conv_fprop(g.tensor((1, 6, 8, 8)), g.tensor((4, 4, 3, 3))),
            r"x has 6 channels but w expects 4 per group x groups=1 = 4: w is \(K, C / groups, \*kernel\)",
        ),
        # a channel mistake that divides evenly is no longer taken as groups (cuDNN would infer groups=2)
        (
            lambda g: g.conv_fprop(g.tensor((1, 8, 8, 8)), g.tensor((4, 4, 3, 3))),
            r"x has 8 channels but w expects 4 per group x groups=1 = 4 \(groups=2\?\)",
        ),
        (lambda g: g.conv_fprop(g.tensor((1, 8, 8, 8)), g.tensor((6, 2, 3, 3)), groups=4), "not divisible by groups=4"),
        (lambda g: g.conv_fprop(g.tensor((1, 8, 8, 8)), g.tensor((8, 2, 3, 3)), groups=0), "groups must be a positive"),
        (
            lambda g: g.conv_fprop(g.tensor((1, 8, 8, 8)), g.tensor((8, 8, 3, 3)), padding=1, pre_padding=1),
            "pass padding= or pre_padding=/post_padding=, not both",
        ),
        (
            lambda g: g.conv_fprop(g.tensor((1, 4, 2, 2)), g.tensor((4, 4, 5, 5))),
            "plus pre_padding 0 and post_padding 0 is smaller than w.s kernel 5 at dilation 1",
        ),
        (lambda g: g.conv_fprop(g.tensor((1, 4, 8, 8)), g.tensor((4, 4, 3, 3)), mode="corr"), "mode must be"),
        (lambda g: g.reduction(g.tensor((4, 5)), (2, 1)), "each output dim is x's or 1"),
        (lambda g: g.reduction(g.tensor((4, 5)), (4, 1), mode="sum"), "reduction mode must be one of"),
        (lambda g: g.tensor((2, 0)), "dims must be positive"),
        (lambda g: g.pointwise("EXP", Graph().tensor((2,))), "belongs to another graph"),
    ],
)
def test_definition_errors(build, msg):
    with pytest.raises(GraphError, match=msg):
        build(Graph())


def test_validation_errors():
    g = Graph()
    with pytest.raises(GraphError, match="no operations"):
        g.validate()
    x = g.tensor((2, 3))
    g.pointwise("EXP", x)
    with pytest.raises(GraphError, match="virtual result nobody reads"):
        g.lower()
    g = Graph()
    x = g.tensor((2, 3))
    g.tensor((4,), name="spare")
    g.mark_output(g.pointwise("EXP", x))
    with pytest.raises(GraphError, match="tensor spare .* is dangling"):
        g.lower()


def test_key_is_stable_and_sensitive_to_every_attribute():
    base = conv_bias_relu()[0].key()
    assert base == conv_bias_relu()[0].key() and hash(base) == hash(conv_bias_relu()[0].key())
    variants = [
        conv_bias_relu(dims=(4, 64, 16, 16)),
        conv_bias_relu(k=16),
        conv_bias_relu(pad=0),
        conv_bias_relu(stride=2),
        conv_bias_relu(dtype="bfloat16"),
        conv_bias_relu(compute_dtype="float16"),
        conv_bias_relu(intermediate_dtype="float16"),
        conv_bias_relu(alignment=8),
    ]
    keys = {base} | {v[0].key() for v in variants}
    assert len(keys) == len(variants) + 1
    # strides and a pointwise parameter
    g1, g2 = Graph(), Graph()
    for g, strides, clip in ((g1, (3, 1), 6.0), (g2, (1, 2), 6.0)):
        g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3), strides), relu_upper_clip=clip))
    g3 = Graph()
    g3.mark_output(g3.pointwise("RELU_FWD", g3.tensor((2, 3), (3, 1)), relu_upper_clip=5.0))
    assert len({g1.key(), g2.key(), g3.key()}) == 3
    # settings are part of the key
    with cudnnkit.settings(deterministic=True):
        assert conv_bias_relu()[0].key() != base


def test_conv_padding_forms_and_explicit_groups():
    """``padding=`` (symmetric as in cudnn-frontend; pairs, "same" and "valid" too) sets the same pre/post paddings
    as ``pre_padding``/``post_padding``; ``groups=`` is recorded and checked (depthwise: groups = C)."""
    g = Graph()
    x = g.tensor((2, 8, 9, 8))
    a = g.conv_fprop(x, g.tensor((8, 8, 3, 3)), padding=1)
    b = g.conv_fprop(x, g.tensor((8, 8, 3, 3)), pre_padding=1)
    c = g.conv_fprop(x, g.tensor((8, 8, 4, 3)), padding="same")  # even kernel: one more after, as torch
    d = g.conv_fprop(x, g.tensor((8, 8, 3, 3)), padding=((0, 2), (1, 0)), stride=2)
    dw = g.conv_fprop(x, g.tensor((16, 1, 3, 3)), padding="same", groups=8)
    assert a.dims == b.dims == c.dims[:2] + (9, 8) == (2, 8, 9, 8)
    assert d.dims == shapes.conv_output_shape((2, 8, 9, 8), (8, 8, 3, 3), padding=((0, 2), (1, 0)), stride=2)
    assert dw.dims == (2, 16, 9, 8)
    convs = [dict(n.attrs) for n in g._nodes]
    assert convs[0]["pre_padding"] == convs[1]["pre_padding"] == (1, 1) and convs[0]["post_padding"] == (1, 1)
    assert (convs[2]["pre_padding"], convs[2]["post_padding"]) == ((1, 1), (2, 1))
    assert (convs[3]["pre_padding"], convs[3]["post_padding"]) == ((0, 1), (2, 0))
    assert convs[4]["groups"] == 8 and convs[0]["groups"] == 1
    dx = g.conv_dgrad(g.tensor((2, 16, 9, 8)), g.tensor((16, 1, 3, 3)), (2, 8, 9, 8), padding=1, groups=8)
    dwt = g.conv_wgrad(x, g.tensor((2, 16, 9, 8)), (16, 1, 3, 3), padding=1, groups=8)
    assert dx.dims == (2, 8, 9, 8) and dwt.dims == (16, 1, 3, 3)
