"""Graph node kinds beyond pointwise/matmul/conv/reduction, on the CPU: resample, norm, genstats, rng,
reshape, concat and SDPA. Shape/dtype inference, read-back from the finalized backend descriptors
(where cuDNN 9.19 answers cudnnBackendGetAttribute), key sensitivity, op-graph finalization, errors."""

from __future__ import annotations

import math

import pytest

from cudnnkit import lib
from cudnnkit.graph import Graph, GraphError, UnsupportedGraphError
from cudnnkit.lib.backend import BackendDescriptor

NHWC = (648, 1, 72, 8)  # (2, 8, 9, 9) channels-last


def tensor_of(op: BackendDescriptor, attr: str) -> BackendDescriptor:
    """The tensor descriptor an operation holds in ``attr`` (read back from cuDNN)."""
    (d,) = op.get_descriptors(attr, "CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    return d


def uid_of(op: BackendDescriptor, attr: str) -> int:
    return tensor_of(op, attr).get("CUDNN_ATTR_TENSOR_UNIQUE_ID")


# ----------------------------------------------------------------- resample


def pool(mode="max", window=3, stride=2, pad=1, post=None, index=False, dtype="float16", nan=False, **kw):
    g = Graph(**kw)
    x = g.tensor((2, 8, 9, 9), NHWC, dtype, name="x")
    out = g.resample_forward(
        x, mode=mode, window=window, stride=stride, pre_padding=pad, post_padding=post, index=index, nan_propagation=nan
    )
    y, idx = out if index else (out, None)
    g.mark_output(y)
    if idx is not None:
        g.mark_output(idx)
    return g, x, y, idx


def test_resample_forward_shapes_and_read_back():
    g, x, y, idx = pool(index=True)
    assert y.dims == (2, 8, 5, 5) and y.dtype == "float16" and y.strides == (200, 1, 40, 8)  # keeps NHWC
    assert idx.dims == y.dims and idx.dtype == "int8"
    low = g.lower()
    rs, op = low.op_params[0], low.ops[0]
    assert rs.get("CUDNN_ATTR_RESAMPLE_MODE") == lib.cudnnResampleMode_t.CUDNN_RESAMPLE_MAXPOOL
    assert rs.get("CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS") == 2
    assert rs.get("CUDNN_ATTR_RESAMPLE_WINDOW_DIMS") == [3, 3]
    assert rs.get("CUDNN_ATTR_RESAMPLE_STRIDES") == [2, 2]
    assert rs.get("CUDNN_ATTR_RESAMPLE_PRE_PADDINGS") == [1, 1]
    assert rs.get("CUDNN_ATTR_RESAMPLE_POST_PADDINGS") == [1, 1]
    assert rs.get("CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION") == lib.CUDNN_NOT_PROPAGATE_NAN
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC") == x.uid
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC") == y.uid
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC") == idx.uid
    assert low.op_graph.finalized


def test_resample_forward_options_reach_cudnn():
    g, x, y, _ = pool(mode="avg_exclude_padding", window=(3, 2), stride=(1, 2), pad=(1, 0), post=(0, 1), nan=True)
    assert y.dims == (2, 8, 8, 5)  # (9+1+0-3)//1+1, (9+0+1-2)//2+1
    rs = g.lower().op_params[0]
    assert rs.get("CUDNN_ATTR_RESAMPLE_MODE") == lib.cudnnResampleMode_t.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING
    assert rs.get("CUDNN_ATTR_RESAMPLE_WINDOW_DIMS") == [3, 2]
    assert rs.get("CUDNN_ATTR_RESAMPLE_STRIDES") == [1, 2]
    assert rs.get("CUDNN_ATTR_RESAMPLE_PRE_PADDINGS") == [1, 0]
    assert rs.get("CUDNN_ATTR_RESAMPLE_POST_PADDINGS") == [0, 1]
    assert rs.get("CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION") == lib.CUDNN_PROPAGATE_NAN
    g, *_ = pool(mode="avg_include_padding", stride=None, pad=0)  # stride defaults to the window
    assert g.lower().op_params[0].get("CUDNN_ATTR_RESAMPLE_STRIDES") == [3, 3]


@pytest.mark.parametrize("given", ["index", "avg"])
def test_resample_backward_lowers(given):
    g = Graph()
    dy = g.tensor((2, 8, 5, 5), (200, 1, 40, 8), "float16", name="dy")
    kw = {"window": 3, "stride": 2, "pre_padding": 1}
    if given == "index":
        idx = g.tensor((2, 8, 5, 5), (200, 1, 40, 8), "int8")
        dx = g.resample_backward(dy, x_dims=(2, 8, 9, 9), index=idx, **kw)
    else:
        dx = g.resample_backward(dy, x_dims=(2, 8, 9, 9), mode="avg_exclude_padding", **kw)
    g.mark_output(dx)
    assert dx.dims == (2, 8, 9, 9) and dx.dtype == "float16" and dx.strides == NHWC
    low = g.lower()
    op = low.ops[0]
    assert low.op_params[0].get("CUDNN_ATTR_RESAMPLE_MODE") == (
        lib.cudnnResampleMode_t.CUDNN_RESAMPLE_MAXPOOL
        if given == "index"
        else lib.cudnnResampleMode_t.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING
    )
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DYDESC") == dy.uid
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_BWD_DXDESC") == dx.uid
    if given == "index":
        assert uid_of(op, "CUDNN_ATTR_OPERATION_RESAMPLE_BWD_IDXDESC") == idx.uid


# ----------------------------------------------------------------- normalization


def norm_graph(mode, phase="training", running=False, dims=(4, 16, 8, 8), eps=1e-5, momentum=0.1, bias=True):
    g = Graph()
    x = g.tensor(dims, dtype="float16", name="x")
    pdims, sdims = g._norm_param_dims(mode, x)
    scale = g.tensor(pdims, name="scale")
    b = g.tensor(pdims, name="bias") if bias else None
    kw = {}
    if mode == "batch" and phase == "inference":
        kw.update(mean=g.tensor(sdims, name="mean"), inv_variance=g.tensor(sdims, name="inv_var"))
    if running:
        kw.update(running_mean=g.tensor(sdims), running_var=g.tensor(sdims), momentum=momentum)
    r = g.norm_forward(mode, x, scale, b, phase=phase, epsilon=eps, **kw)
    for t in r:
        if t is not None:
            g.mark_output(t)
    return g, r


@pytest.mark.parametrize(
    "mode, stats_dims",
    [("batch", (1, 16, 1, 1)), ("instance", (4, 16, 1, 1)), ("layer", (4, 1, 1, 1)), ("rms", (4, 1, 1, 1))],
)
def test_norm_forward_training_shapes_and_lowering(mode, stats_dims):
    g, r = norm_graph(mode, bias=mode != "rms")
    assert r.y.dims == (4, 16, 8, 8) and r.y.dtype == "float16"
    assert r.inv_variance.dims == stats_dims and r.inv_variance.dtype == "float32"
    assert (r.mean is None) == (mode == "rms")
    if r.mean is not None:
        assert r.mean.dims == stats_dims
    low = g.lower()
    assert len(low.ops) == 1 and low.op_graph.finalized
    ((eps_uid, (eps, eps_dtype)),) = g.constants().items()
    assert eps == pytest.approx(1e-5) and eps_dtype == "float32"
    assert low.tensors[eps_uid].get("CUDNN_ATTR_TENSOR_IS_BY_VALUE") is True
    assert low.tensors[r.inv_variance.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == list(stats_dims)


def test_layer_norm_scale_covers_every_dim_but_the_batch():
    g = Graph()
    x = g.tensor((8, 3, 5, 7))
    assert g._norm_param_dims("layer", x) == ((1, 3, 5, 7), (8, 1, 1, 1))
    with pytest.raises(GraphError, match=r"layer norm: scale must have dims \(1, 3, 5, 7\)"):
        g.norm_forward("layer", x, g.tensor((1, 3, 1, 1)), g.tensor((1, 3, 5, 7)))


def test_batch_norm_running_statistics_and_inference():
    g, r = norm_graph("batch", running=True)
    assert r.running_mean.dims == r.running_var.dims == (1, 16, 1, 1)
    assert sorted(v for v, _ in g.constants().values()) == [pytest.approx(1e-5), pytest.approx(0.1)]
    g.lower()
    g, r = norm_graph("batch", phase="inference")
    assert r.mean is None and r.inv_variance is None and r.running_mean is None
    assert g.constants() == {}  # batch-norm inference takes no epsilon (cuDNN matches no engine with one)
    g.lower()
    g, r = norm_graph("layer", phase="inference")
    assert r.mean is None and r.inv_variance is None
    g.lower()


def test_norm_with_epsilon_tensor_and_peer_stats():
    g = Graph()
    x = g.tensor((4, 16, 8, 8), dtype="float16")
    s, b = g.tensor((1, 16, 1, 1)), g.tensor((1, 16, 1, 1))
    eps = g.tensor((1, 1, 1, 1), by_value=True, name="eps")
    peers = [g.tensor((2, 4, 16, 1, 1)), g.tensor((2, 4, 16, 1, 1))]
    r = g.norm_forward("batch", x, s, b, epsilon=eps, peer_stats=peers)
    assert g.constants() == {}  # a given epsilon tensor is bound by the caller
    node = g._nodes[-1]
    assert node.attr("peers") == 2 and ("peer1", peers[1].uid) in node.inputs
    for t in r[:3]:
        g.mark_output(t)
    assert len(g.lower().ops) == 1


@pytest.mark.parametrize("mode", ["batch", "instance", "layer", "rms"])
def test_norm_backward_shapes_and_lowering(mode):
    g = Graph()
    x, dy = g.tensor((4, 16, 8, 8), dtype="bfloat16"), g.tensor((4, 16, 8, 8), dtype="bfloat16")
    pdims, sdims = g._norm_param_dims(mode, x)
    scale = g.tensor(pdims)
    mean = None if mode == "rms" else g.tensor(sdims)
    r = g.norm_backward(mode, x, dy, scale, mean=mean, inv_variance=g.tensor(sdims))
    assert r.dx.dims == x.dims and r.dx.dtype == "bfloat16" and r.dscale.dims == pdims
    assert (r.dbias is None) == (mode == "rms")
    for t in r:
        if t is not None:
            g.mark_output(t)
    assert g.lower().op_graph.finalized
    g2 = Graph()
    x2, dy2 = g2.tensor((4, 16, 8, 8)), g2.tensor((4, 16, 8, 8))
    r2 = g2.norm_backward("rms", x2, dy2, g2.tensor((1, 16, 8, 8)), inv_variance=g2.tensor((4, 1, 1, 1)), dbias=True)
    assert r2.dbias is not None and r2.dbias.dims == (1, 16, 8, 8)


# ----------------------------------------------------------------- genstats, rng, reshape, concat


def test_genstats_shapes_and_lowering():
    g = Graph()
    x = g.tensor((2, 8, 9, 9), NHWC, "float16")
    s, sq = g.genstats(x)
    assert s.dims == sq.dims == (1, 8, 1, 1) and s.dtype == sq.dtype == "float32"
    g.mark_output(s)
    g.mark_output(sq)
    low = g.lower()
    assert low.tensors[sq.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [1, 8, 1, 1]
    assert len(low.ops) == 1


def test_rng_read_back():
    g = Graph()
    seed, offset = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    y = g.mark_output(g.rng((4, 8, 16, 16), seed=seed, offset=offset, probability=0.3))
    assert y.dims == (4, 8, 16, 16) and y.dtype == "float32"
    low = g.lower()
    rd, op = low.op_params[0], low.ops[0]
    assert rd.get("CUDNN_ATTR_RNG_DISTRIBUTION") == lib.cudnnRngDistribution_t.CUDNN_RNG_DISTRIBUTION_BERNOULLI
    assert rd.get("CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY") == pytest.approx(0.3)
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RNG_YDESC") == y.uid
    assert uid_of(op, "CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC") == offset.uid
    g = Graph()
    g.mark_output(g.rng((16,), seed=1234, distribution="uniform", minimum=-2.0, maximum=3.0, dtype="float16"))
    low = g.lower()
    assert low.ops[0].get("CUDNN_ATTR_OPERATION_RNG_SEED") == 1234
    assert low.op_params[0].get("CUDNN_ATTR_RNG_UNIFORM_DIST_MAXIMUM") == 3.0
    assert low.op_params[0].get("CUDNN_ATTR_RNG_UNIFORM_DIST_MINIMUM") == -2.0
    g = Graph()
    g.mark_output(g.rng((16,), seed=5, distribution="normal", mean=1.0, std=2.0))
    rd = g.lower().op_params[0]
    assert (
        rd.get("CUDNN_ATTR_RNG_NORMAL_DIST_STANDARD_DEVIATION") == 2.0
        and rd.get("CUDNN_ATTR_RNG_NORMAL_DIST_MEAN") == 1.0
    )


def test_reshape_and_transpose_by_strides():
    g = Graph()
    x = g.tensor((2, 3, 4, 5), name="x")
    y = g.mark_output(g.reshape(x, (6, 20)))
    t = g.mark_output(g.reshape(x, perm=(0, 1, 3, 2)))
    assert y.dims == (6, 20) and y.strides == (20, 1)
    assert t.dims == (2, 3, 5, 4) and t.strides == (60, 20, 1, 5)  # the same memory read transposed
    low = g.lower()
    assert tensor_of(low.ops[1], "CUDNN_ATTR_OPERATION_RESHAPE_YDESC").get("CUDNN_ATTR_TENSOR_STRIDES") == [
        60,
        20,
        1,
        5,
    ]
    assert uid_of(low.ops[0], "CUDNN_ATTR_OPERATION_RESHAPE_XDESC") == x.uid


def test_concat_shapes_and_read_back():
    g = Graph()
    a, b, c = g.tensor((2, 3, 4)), g.tensor((2, 5, 4)), g.tensor((2, 1, 4))
    y = g.mark_output(g.concat([a, b, c], -2, inplace_index=1))
    assert y.dims == (2, 9, 4)
    op = g.lower().ops[0]
    assert op.get("CUDNN_ATTR_OPERATION_CONCAT_AXIS") == 1
    assert op.get("CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX") == 1
    # (reading CONCAT_INPUT_DESCS back crashes libcudnn 9.19; the node records the inputs in order)
    assert [uid for _, uid in g._nodes[0].inputs] == [a.uid, b.uid, c.uid]
    assert uid_of(op, "CUDNN_ATTR_OPERATION_CONCAT_OUTPUT_DESC") == y.uid


# ----------------------------------------------------------------- SDPA

BHSD = (4 * 128 * 64, 128 * 64, 64, 1)
BSHD = (128 * 4 * 64, 64, 4 * 64, 1)  # (B, H, S, D) dims over (B, S, H, D) memory


def sdpa_fwd(causal=False, impl="composite", hk=4, layout=BHSD, scale=None, stats=True, **kw):
    g = Graph()
    q = g.tensor((2, 4, 128, 64), layout, "bfloat16", name="q")
    kl = layout if hk == 4 else None
    k = g.tensor((2, hk, 128, 64), kl, "bfloat16", name="k")
    v = g.tensor((2, hk, 128, 64), kl, "bfloat16", name="v")
    r = g.sdpa_forward(q, k, v, causal=causal, implementation=impl, scale=scale, stats=stats, **kw)
    g.mark_output(r.o)
    if r.stats is not None:
        g.mark_output(r.stats)
    return g, q, k, v, r


def kinds(g):
    return [n.kind for n in g._nodes]


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_forward_composite_structure(causal):
    g, q, k, v, r = sdpa_fwd(causal=causal)
    assert r.o.dims == (2, 4, 128, 64) and r.o.dtype == "bfloat16" and r.o.strides == BHSD
    assert r.stats.dims == (2, 4, 128, 1) and r.stats.dtype == "float32"
    ks = kinds(g)
    assert ks.count("matmul") == 2 and ks.count("reduction") == 2
    modes = [n.attr("mode") for n in g._nodes if n.kind == "pointwise"]
    assert ("GEN_INDEX" in modes) == causal and ("BINARY_SELECT" in modes) == causal
    assert {"MUL", "SUB", "EXP", "DIV", "LOG", "ADD"} <= set(modes)
    assert [n.attr("mode") for n in g._nodes if n.kind == "reduction"] == ["max", "add"]  # row max, row sum
    low = g.lower()
    # k is described to cuDNN as K^T: (B, H, D, S) over the same memory
    assert low.tensors[k.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 4, 64, 128]
    assert low.tensors[k.uid].get("CUDNN_ATTR_TENSOR_STRIDES") == [BHSD[0], BHSD[1], 1, 64]
    assert low.tensors[v.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 4, 128, 64]
    (scale, _), *rest = sorted(g.constants().values(), key=lambda c: c[0] != 0.125)
    assert scale == pytest.approx(1 / math.sqrt(64))
    if causal:
        assert any(v == -math.inf for v, _ in g.constants().values())
    # the probabilities reach the second matmul in q's dtype
    mm2 = [n for n in g._nodes if n.kind == "matmul"][1]
    assert g._tensors[dict(mm2.inputs)["a"]].dtype == "bfloat16"


def test_sdpa_forward_layouts_gqa_and_options():
    g, q, k, v, r = sdpa_fwd(layout=BSHD)
    assert r.o.strides == BSHD  # o follows q's layout
    g.lower()
    g, q, k, v, r = sdpa_fwd(hk=1, causal=True, left_bound=16, scale=0.5, stats=False)
    assert r.stats is None
    (scratch,) = g.scratch()  # the statistics still written (cuDNN 9.19 has no engine without them)
    assert scratch.dims == (2, 4, 128, 1) and scratch.dtype == "float32" and not scratch.virtual
    assert g.scratch_init() == {scratch.uid: None}  # written by the pattern: no clearing needed
    assert 0.5 in [c for c, _ in g.constants().values()]
    g.lower()
    g = Graph()
    q, k, v = (g.tensor((2, 4, 128, 64), dtype="float16") for _ in range(3))
    seed, off = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_forward(q, k, v, dropout=0.25, seed=seed, offset=off)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    assert "rng" in kinds(g) and 1 / 0.75 in [c for c, _ in g.constants().values()]
    g.lower()


def test_sdpa_forward_unified_read_back():
    g, q, k, v, r = sdpa_fwd(impl="unified")
    if not lib.available("CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR"):  # the unified op is new in 9.13
        with pytest.raises(lib.FeatureVersionError, match="SDPA_FWD_DESCRIPTOR needs cuDNN 9.13"):
            g.lower()
        return
    low = g.lower()
    assert kinds(g) == ["sdpa_fwd"]
    op = low.ops[0]
    for attr, t in (("QDESC", q), ("KDESC", k), ("VDESC", v), ("ODESC", r.o), ("STATSDESC", r.stats)):
        assert uid_of(op, f"CUDNN_ATTR_OPERATION_SDPA_FWD_{attr}") == t.uid
    scale = tensor_of(op, "CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC")
    assert scale.get("CUDNN_ATTR_TENSOR_IS_BY_VALUE") is True
    assert low.tensors[k.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 4, 128, 64]  # unified takes k as is


def sdpa_bwd(causal=False, hk=4, impl="composite", **kw):
    g = Graph()
    q, o, do = (g.tensor((2, 4, 128, 64), dtype="bfloat16", name=n) for n in ("q", "o", "do"))
    k, v = (g.tensor((2, hk, 128, 64), dtype="bfloat16", name=n) for n in ("k", "v"))
    st = g.tensor((2, 4, 128, 1), name="stats")
    r = g.sdpa_backward(q, k, v, o, do, st, causal=causal, implementation=impl, **kw)
    for t in r:
        g.mark_output(t)
    return g, (q, k, v, o, do, st), r


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward_composite_structure(causal):
    g, (q, k, v, o, do, st), r = sdpa_bwd(causal=causal)
    assert [t.dims for t in r] == [(2, 4, 128, 64)] * 3 and all(t.dtype == "bfloat16" for t in r)
    ks = kinds(g)
    assert ks.count("matmul") == 5 and ks.count("reshape") == 3
    scratch = g.scratch()
    assert sorted(t.dims for t in scratch) == [(2, 4, 128, 1), (2, 4, 128, 64)]
    assert all(t.dtype == "float32" and not t.virtual for t in scratch)
    # the dq accumulator is accumulated into: zeroed before every run; the row sums are written first
    assert g.scratch_init() == {t.uid: ("zero" if t.dims[-1] == 64 else None) for t in scratch}
    low = g.lower()
    assert low.tensors[k.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 4, 64, 128]
    assert low.tensors[v.uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 4, 64, 128]
    # P^T and dS^T: transposes through strides, in q's dtype
    pt = [g._tensors[dict(n.outputs)["y"]] for n in g._nodes if n.kind == "reshape"][:2]
    assert all(t.dims == (2, 4, 128, 128) and t.strides == (4 * 128 * 128, 128 * 128, 1, 128) for t in pt)
    assert all(t.dtype == "bfloat16" for t in pt)
    modes = [n.attr("mode") for n in g._nodes if n.kind == "pointwise"]
    assert ("BINARY_SELECT" in modes) == causal and "IDENTITY" in modes


def test_sdpa_backward_gqa_sums_heads_and_dropout():
    g, (q, k, v, *_), r = sdpa_bwd(hk=2)
    assert r.dk.dims == r.dv.dims == (2, 2, 128, 64)
    assert kinds(g).count("reduction") == 3  # rowsum(do*o) and the two head sums
    g.lower()
    g = Graph()
    q, k, v, o, do = (g.tensor((2, 4, 64, 32), dtype="float16") for _ in range(5))
    seed, off = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_backward(q, k, v, o, do, g.tensor((2, 4, 64, 1)), dropout=0.1, seed=seed, offset=off)
    for t in r:
        g.mark_output(t)
    assert kinds(g).count("rng") == 1
    g.lower()


def test_sdpa_backward_unified_is_refused_by_cudnn_9_19_op_graph():
    g, _, r = sdpa_bwd(impl="unified")
    assert kinds(g) == ["sdpa_bwd"]
    if not lib.available("CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR"):  # new in 9.17
        with pytest.raises(lib.FeatureVersionError, match="SDPA_BWD_DESCRIPTOR needs cuDNN 9.17"):
            g.lower()
    elif lib.version() < 92100:
        with pytest.raises(UnsupportedGraphError, match="operation graph.*BAD_PARAM.*buildDAG") as e:
            g.lower()
        assert isinstance(e.value.__cause__, lib.BadParamError)  # cuDNN's own error kept as the cause
    else:  # pragma: no cover - newer cuDNN
        g.lower()


def test_transposed_operand_cannot_feed_other_ops():
    g = Graph()
    q, k, v = (g.tensor((1, 2, 16, 8), dtype="float16") for _ in range(3))
    r = g.sdpa_forward(q, k, v)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    g.mark_output(g.pointwise("EXP", k))
    with pytest.raises(GraphError, match="describes it transposed"):
        g.lower()


# ----------------------------------------------------------------- keys


def variants():
    """Graphs that differ in exactly one attribute of a new node kind."""
    yield "pool base", lambda: pool()[0]
    yield "pool mode", lambda: pool(mode="avg_include_padding")[0]
    yield "pool window", lambda: pool(window=2)[0]
    yield "pool stride", lambda: pool(stride=1)[0]
    yield "pool pad", lambda: pool(pad=0)[0]
    yield "pool post", lambda: pool(post=0)[0]
    yield "pool nan", lambda: pool(nan=True)[0]
    yield "pool index", lambda: pool(index=True)[0]
    yield "norm base", lambda: norm_graph("batch")[0]
    yield "norm mode", lambda: norm_graph("instance")[0]
    yield "norm phase", lambda: norm_graph("layer", phase="inference")[0]
    yield "norm layer", lambda: norm_graph("layer")[0]
    yield "norm eps", lambda: norm_graph("batch", eps=1e-3)[0]
    yield "norm running", lambda: norm_graph("batch", running=True)[0]
    yield "norm momentum", lambda: norm_graph("batch", running=True, momentum=0.2)[0]
    yield "sdpa base", lambda: sdpa_fwd()[0]
    yield "sdpa causal", lambda: sdpa_fwd(causal=True)[0]
    yield "sdpa window", lambda: sdpa_fwd(causal=True, left_bound=8)[0]
    yield "sdpa scale", lambda: sdpa_fwd(scale=0.3)[0]
    yield "sdpa unified", lambda: sdpa_fwd(impl="unified")[0]
    yield "sdpa layout", lambda: sdpa_fwd(layout=BSHD)[0]
    yield "sdpa gqa", lambda: sdpa_fwd(hk=2)[0]
    yield "sdpa no stats", lambda: sdpa_fwd(stats=False)[0]

    def rng(**kw):
        g = Graph()
        args = {"seed": 1, "probability": 0.5, **kw}
        g.mark_output(g.rng((8, 8), **args))
        return g

    yield "rng base", rng
    yield "rng seed", lambda: rng(seed=2)
    yield "rng p", lambda: rng(probability=0.25)
    yield "rng dist", lambda: rng(distribution="uniform")

    def cat(axis=0, inplace=None, n=2):
        g = Graph()
        g.mark_output(g.concat([g.tensor((4, 4)) for _ in range(n)], axis, inplace_index=inplace))
        return g

    yield "concat base", cat
    yield "concat axis", lambda: cat(axis=1)
    yield "concat inplace", lambda: cat(inplace=0)
    yield "concat inputs", lambda: cat(n=3)

    def resh(dims=None, perm=None):
        g = Graph()
        x = g.tensor((4, 6))
        g.mark_output(g.reshape(x, dims, perm=perm) if perm else g.reshape(x, dims))
        return g

    yield "reshape base", lambda: resh((24,))
    yield "reshape dims", lambda: resh((6, 4))
    yield "reshape perm", lambda: resh(perm=(1, 0))


def test_every_new_attribute_changes_the_key():
    built = {name: make() for name, make in variants()}
    keys = {name: g.key() for name, g in built.items()}
    assert len(set(keys.values())) == len(keys), [n for n in keys if list(keys.values()).count(keys[n]) > 1]
    for name, make in variants():  # and a rebuild of each has the same key
        assert make().key() == keys[name], name


# ----------------------------------------------------------------- errors


def _x(g, dims=(2, 8, 9, 9), dtype="float16"):
    return g.tensor(dims, dtype=dtype)


@pytest.mark.parametrize(
    "build, msg",
    [
        (lambda g: g.resample_forward(_x(g), mode="median", window=2), "mode must be one of"),
        (lambda g: g.resample_forward(_x(g)), "window is required"),
        (lambda g: g.resample_forward(_x(g), window=2, pre_padding=2), "padding .* must be smaller than the window"),
        (lambda g: g.resample_forward(_x(g), window=20), "smaller than the window"),
        (lambda g: g.resample_forward(_x(g, (4, 4)), window=2), "rank >= 3"),
        (lambda g: g.resample_forward(_x(g), mode="avg_include_padding", window=2, index=True), "index=True applies"),
        (lambda g: g.resample_forward(_x(g), window=2, padding_mode="reflect"), "padding_mode must be one of"),
        (lambda g: g.resample_backward(_x(g, (2, 8, 4, 4)), x_dims=(2, 8, 9, 9), window=2), "needs index="),
        (
            lambda g: g.resample_backward(
                _x(g, (2, 8, 4, 4)),
                x_dims=(2, 8, 9, 9),
                window=2,
                mode="avg_include_padding",
                index=_x(g, (2, 8, 4, 4)),
            ),
            "index= applies to max pooling",
        ),
        (
            lambda g: g.resample_backward(
                _x(g, (2, 8, 4, 4)), x_dims=(2, 8, 9, 9), window=2, index=_x(g, (2, 8, 3, 4))
            ),
            "must have dy's dims",
        ),
        (
            lambda g: g.resample_backward(
                _x(g, (2, 8, 5, 5)), x_dims=(2, 8, 9, 9), window=2, mode="avg_include_padding"
            ),
            "is not the pooled shape",
        ),
        (lambda g: g.resample_backward(_x(g, (2, 8, 4, 4)), x_dims=(8, 9, 9), window=2), "must have one rank"),
        (lambda g: g.norm_forward("group", _x(g), None), "mode must be one of"),
        (
            lambda g: g.norm_forward("batch", _x(g), g.tensor((1, 8, 1, 1)), g.tensor((1, 8, 1, 1)), phase="eval"),
            "phase must be",
        ),
        (
            lambda g: g.norm_forward("batch", _x(g), g.tensor((1, 9, 1, 1)), g.tensor((1, 8, 1, 1))),
            r"scale must have dims \(1, 8, 1, 1\)",
        ),
        (lambda g: g.norm_forward("batch", _x(g), g.tensor((1, 8, 1, 1))), "batch norm needs bias"),
        (
            lambda g: g.norm_forward("batch", _x(g), g.tensor((1, 8, 1, 1)), g.tensor((1, 8, 1, 1)), phase="inference"),
            "needs mean= and inv_variance=",
        ),
        (
            lambda g: g.norm_forward(
                "batch",
                _x(g),
                g.tensor((1, 8, 1, 1)),
                g.tensor((1, 8, 1, 1)),
                running_mean=g.tensor((1, 8, 1, 1)),
                running_var=g.tensor((1, 8, 1, 1)),
            ),
            "need running_mean=, running_var= and momentum=",
        ),
        (
            lambda g: g.norm_forward("layer", _x(g), g.tensor((1, 8, 9, 9)), g.tensor((1, 8, 9, 9)), momentum=0.1),
            "momentum= needs",
        ),
        (
            lambda g: g.norm_forward("layer", _x(g), g.tensor((1, 8, 9, 9)), g.tensor((1, 8, 9, 9)), epsilon="1e-5"),
            None,
        ),
        (
            lambda g: g.norm_forward(
                "layer", _x(g), g.tensor((1, 8, 9, 9)), g.tensor((1, 8, 9, 9)), epsilon=g.tensor((1, 2, 1, 1))
            ),
            "epsilon must be a one-element tensor",
        ),
        (
            lambda g: g.norm_forward(
                "layer", _x(g), g.tensor((1, 8, 9, 9)), g.tensor((1, 8, 9, 9)), peer_stats=[g.tensor((2, 1))]
            ),
            "peer_stats apply to batch norm",
        ),
        (
            lambda g: g.norm_backward(
                "rms",
                _x(g),
                _x(g),
                g.tensor((1, 8, 9, 9)),
                mean=g.tensor((2, 1, 1, 1)),
                inv_variance=g.tensor((2, 1, 1, 1)),
            ),
            "rms norm has no mean",
        ),
        (
            lambda g: g.norm_backward(
                "layer", _x(g), _x(g), g.tensor((1, 8, 9, 9)), inv_variance=g.tensor((2, 1, 1, 1))
            ),
            "needs mean=",
        ),
        (
            lambda g: g.norm_backward(
                "layer", _x(g), _x(g, (2, 8, 9, 8)), g.tensor((1, 8, 9, 9)), inv_variance=g.tensor((2, 1, 1, 1))
            ),
            "dy .* must have x's dims",
        ),
        (lambda g: g.genstats(_x(g, (5,))), "rank >= 2"),
        (lambda g: g.rng((4,), seed=1, distribution="poisson"), "distribution must be one of"),
        (lambda g: g.rng((4,), seed=1, probability=1.5), r"probability must be within \[0, 1\]"),
        (lambda g: g.rng((4,), seed=g.tensor((1,), dtype="int64")), "needs an offset= tensor"),
        (lambda g: g.rng((4,), seed=1, offset=g.tensor((1,), dtype="int64")), "offset= goes with a seed tensor"),
        (
            lambda g: g.rng((4,), seed=g.tensor((1,)), offset=g.tensor((1,), dtype="int64")),
            "seed must be a one-element int64",
        ),
        (lambda g: g.rng((4,), seed=1.5), None),
        (lambda g: g.rng((4,), seed=1, distribution="uniform", minimum=1, maximum=1), "minimum < maximum"),
        (lambda g: g.reshape(g.tensor((4, 6)), (5, 5)), r"\(24 elements\) to \(5, 5\)"),
        (lambda g: g.reshape(g.tensor((4, 6)), perm=(0, 0)), "not a permutation"),
        (lambda g: g.reshape(g.tensor((4, 6))), "needs dims= or perm="),
        (lambda g: g.reshape(g.tensor((4, 6)), (24,), perm=(1, 0)), "not both"),
        (lambda g: g.concat([], 0), "at least one input"),
        (lambda g: g.concat([g.tensor((2, 3)), g.tensor((3, 3))], 1), r"inputs\[1\] .* outside axis 1"),
        (lambda g: g.concat([g.tensor((2, 3))], 2), "axis 2 is out of range"),
        (lambda g: g.concat([g.tensor((2, 3))], 0, inplace_index=1), "inplace_index 1 is out of range"),
    ],
)
def test_new_node_errors(build, msg):
    if msg is None:
        with pytest.raises(TypeError):
            build(Graph())
    else:
        with pytest.raises(GraphError, match=msg):
            build(Graph())


def test_resample_window_arity_error_names_the_argument():
    g = Graph()
    with pytest.raises(ValueError, match="window must have 2 values"):
        g.resample_forward(_x(g), window=(2, 2, 2))
    with pytest.raises(ValueError, match="stride must have 2 values"):
        g.resample_forward(_x(g), window=2, stride=(1, 1, 1))


def _qkv(g, q=(2, 4, 16, 8), k=(2, 4, 16, 8), v=(2, 4, 16, 8), dtype="bfloat16", kdtype=None):
    return g.tensor(q, dtype=dtype), g.tensor(k, dtype=kdtype or dtype), g.tensor(v, dtype=kdtype or dtype)


@pytest.mark.parametrize(
    "kw, shapes, msg",
    [
        ({}, {"q": (2, 4, 16)}, "q must be 4-d"),
        ({}, {"dtype": "float32"}, "q must be float16 or bfloat16"),
        ({}, {"kdtype": "float16"}, "share one dtype"),
        ({}, {"k": (2, 4, 16, 4), "v": (2, 4, 16, 4)}, "k's head dim 4 must equal q's 8"),
        ({}, {"k": (2, 3, 16, 8), "v": (2, 3, 16, 8)}, "multiple of k's 3"),
        ({}, {"k": (1, 4, 16, 8)}, "share the batch size"),
        ({}, {"v": (2, 4, 12, 8)}, "share the key length"),
        ({"implementation": "flash"}, {}, "implementation must be"),
        ({"causal": True, "right_bound": 3}, {}, "causal=True is right_bound=0"),
        ({"left_bound": 0}, {}, "left_bound must be"),
        ({"dropout": 1.0}, {}, r"dropout must be within \[0, 1\)"),
        ({"dropout": 0.1}, {}, "dropout needs seed= and offset="),
        ({"implementation": "unified", "causal": True}, {}, "takes no mask or dropout"),
    ],
)
def test_sdpa_errors(kw, shapes, msg):
    g = Graph()
    with pytest.raises(GraphError, match=msg):
        g.sdpa_forward(*_qkv(g, **shapes), **kw)


def test_sdpa_stride_and_backward_argument_errors():
    g = Graph()
    q = g.tensor((2, 4, 16, 8), (512, 128, 1, 16), "bfloat16")
    with pytest.raises(GraphError, match="head dim.* must have stride 1"):
        g.sdpa_forward(q, *_qkv(g)[1:])
    g = Graph()
    q, k, v = _qkv(g)
    with pytest.raises(GraphError, match=r"stats must be float32 \(2, 4, 16, 1\)"):
        g.sdpa_backward(
            q, k, v, g.tensor((2, 4, 16, 8)), g.tensor((2, 4, 16, 8)), g.tensor((2, 4, 16, 1), dtype="float16")
        )
    with pytest.raises(GraphError, match=r"do must have dims \(2, 4, 16, 8\)"):
        g.sdpa_backward(q, k, v, g.tensor((2, 4, 16, 8)), g.tensor((2, 4, 8, 8)), g.tensor((2, 4, 16, 1)))


@pytest.mark.parametrize("mode", ["avg_include_padding", "avg_exclude_padding"])
def test_W_bfloat16_average_pooling_is_refused(mode):
    """Issue 10: cuDNN 9.19 computes bfloat16 average pooling wrong on Hopper with both engines (measured)."""
    g = Graph()
    x = g.tensor((1, 16, 8, 8), (1024, 1, 128, 16), "bfloat16", name="x")
    with pytest.raises(GraphError, match="x is bfloat16: cuDNN 9.19 computes bfloat16 average pooling wrong"):
        g.resample_forward(x, mode=mode, window=2)
    dy = g.tensor((1, 16, 4, 4), (256, 1, 64, 16), "bfloat16", name="dy")
    with pytest.raises(GraphError, match="dy is bfloat16"):
        g.resample_backward(dy, x_dims=(1, 16, 8, 8), mode=mode, window=2)
    h = g.tensor((1, 16, 8, 8), (1024, 1, 128, 16), "float16", name="h")
    g.mark_output(g.resample_forward(h, mode=mode, window=2))  # float16 is exact: taken
    assert g.known_bad_engines() == ()


def test_W_bfloat16_max_pooling_denies_eng3_at_build():
    g = Graph()
    x = g.tensor((1, 16, 8, 8), (1024, 1, 128, 16), "bfloat16", name="x")
    g.mark_output(g.resample_forward(x, mode="max", window=2))
    assert g.known_bad_engines() == ("eng3",)


def test_a_graph_denies_engines_measured_wrong_for_it():
    """``Graph.deny_engines``: a graph's own denials follow the node table's, once each, and are part of its key
    (a plan built without them is never a cache hit for it); a name that is not an engine's is refused."""
    g = Graph()
    x = g.tensor((1, 16, 8, 8), (1024, 1, 128, 16), "bfloat16", name="x")
    g.mark_output(g.resample_forward(x, mode="max", window=2))
    before = g.key()
    g.deny_engines("eng8", "eng3")
    g.deny_engines("eng8")
    assert g.known_bad_engines() == ("eng3", "eng8") and g.key() != before
    for bad in ("8", 8, "", "cudnn"):
        with pytest.raises(ValueError, match="engine names such as 'eng8'"):
            g.deny_engines(bad)


def test_U_norm_backward_checks_epsilon_but_does_not_bind_it():
    """cuDNN 9.19's norm-backward plan takes no epsilon tensor (binding one failed execution with
    varPackUidCount > expected_uid_count, issue 10's fuzzer): epsilon is checked, then left out."""
    g = Graph()
    x = g.tensor((16, 64, 1, 1), (64, 1, 64, 64), "float16", name="x")
    dy = g.tensor((16, 64, 1, 1), (64, 1, 64, 64), "float16", name="dy")
    scale = g.tensor((1, 64, 1, 1), (64, 1, 64, 64), "float32", name="scale")
    inv = g.tensor((16, 1, 1, 1), (1, 1, 1, 1), "float32", name="inv")
    n = len(g.tensors())
    r = g.norm_backward("rms", x, dy, scale=scale, inv_variance=inv, epsilon=1e-5)
    assert r.dx is not None and not any(t.name == "epsilon" for t in g.tensors()[n:])
    with pytest.raises(TypeError, match="epsilon"):
        g.norm_backward("rms", x, dy, scale=scale, inv_variance=inv, epsilon="1e-5")
    with pytest.raises(ValueError, match="epsilon"):
        g.norm_backward("rms", x, dy, scale=scale, inv_variance=inv, epsilon=float("nan"))
