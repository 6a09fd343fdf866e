"""Attention variants on the CPU (issue 17): the op graphs :meth:`Graph.sdpa_forward`/``sdpa_backward`` build for
each mask, score modifier, padding, dropout and head layout, checked node for node against the patterns
cudnn-frontend's ``CompositeSDPANode``/``CompositeSDPABackwardNode`` build (modes, data types, compute types,
by-value constants, order), each graph lowered (every backend descriptor and the operation graph finalized by
cuDNN 9.19 here, without a device); and the refusals, raised before any GPU work and naming the argument.

The expected patterns are written out by hand below from the frontend's header (not computed by the code under
test): ``expr`` turns the graph's nodes back into nested tuples ``(mode, out dtype, compute dtype, *inputs)``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudnnkit import lib
from cudnnkit.graph import Graph, GraphError
from cudnnkit.graph.nodes.sdpa import SdpaBackwardBias

B, H, SQ, SKV, D = 2, 4, 64, 128, 64
NEG_INF = ("const", -math.inf, "float32")


def i32(v):
    return ("const", v, "int32")


def f32(v):
    return ("const", float(v), "float32")


def producers(g):
    return {uid: n for n in g.nodes() for _, uid in n.outputs}


def expr(g, uid, stop):
    """The expression that makes tensor ``uid``: ``"S"`` for a tensor in ``stop``, ``("const", value, dtype)``
    for a by-value constant, ``("in", name)`` for a graph input, else ``(mode or kind, out dtype, compute dtype,
    *input expressions)`` (pointwise GEN_INDEX adds ``("axis", n)``)."""
    if uid in stop:
        return "S"
    consts = g.constants()
    if uid in consts:
        return ("const", *consts[uid])
    n = producers(g).get(uid)
    t = g._tensors[uid]
    if n is None:
        return ("in", t.name)
    a = dict(n.attrs)
    head = (a.get("mode", n.kind), t.dtype, a.get("compute_dtype"))
    if a.get("mode") == "GEN_INDEX":
        head += (("axis", a["axis"]),)
    return head + tuple(expr(g, u, stop) for _, u in n.inputs)


def index(axis, compute="float32"):
    return ("GEN_INDEX", "int32", compute, ("axis", axis), "S")


def right_mask(row):
    """cudnn-frontend's right-bound diagonal band mask: ``row' >= col`` keeps."""
    return ("BINARY_SELECT", "float32", "float32", "S", NEG_INF, ("CMP_GE", "bool", "bool", row, index(3)))


def left_mask(col):
    """cudnn-frontend's left-bound diagonal band mask: ``col' > row`` keeps."""
    return ("BINARY_SELECT", "float32", "float32", "S", NEG_INF, ("CMP_GT", "bool", "bool", col, index(2)))


def iop(mode, a, b):
    return (mode, "int32", "int32", a, b)


def qkv(g, sq=SQ, skv=SKV, h=H, hk=H, d=D, dv=D, dtype="bfloat16"):
    q = g.tensor((B, h, sq, d), dtype=dtype, name="q")
    k = g.tensor((B, hk, skv, d), dtype=dtype, name="k")
    v = g.tensor((B, hk, skv, dv), dtype=dtype, name="v")
    return q, k, v


def seq_lens(g):
    return g.tensor((B, 1, 1, 1), dtype="int32", name="seq_len_q"), g.tensor((B, 1, 1, 1), dtype="int32",
                                                                               name="seq_len_kv")  # fmt: skip


def fwd(sq=SQ, skv=SKV, padded=False, **kw):
    g = Graph()
    q, k, v = qkv(g, sq, skv)
    if padded:
        kw["seq_len_q"], kw["seq_len_kv"] = seq_lens(g)
    r = g.sdpa_forward(q, k, v, **kw)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    return g, r


def pw_nodes(g, mode):
    return [n for n in g.nodes() if n.kind == "pointwise" and n.attr("mode") == mode]


def softmax_input(g):
    """The tensor the row max reduces: the scores after every modifier and mask (forward)."""
    return next(dict(n.inputs)["x"] for n in g.nodes() if n.kind == "reduction" and n.attr("mode") == "max")


def scaled(g):
    """The scaled scores: the output of ``MUL`` by the attention scale (the first pointwise node)."""
    (uid,) = [t.uid for t in g.tensors() if t.name == "scaled"]
    return uid


def masks_of(g, start=None):
    """The chain of BINARY_SELECT expressions from the scaled scores up to the softmax input (each with the
    previous stage as ``S``)."""
    prod = producers(g)
    chain = []
    uid = softmax_input(g) if start is None else start
    stop_at = scaled(g)
    while uid != stop_at:
        n = prod[uid]
        x = dict(n.inputs)["x"]
        chain.append(expr(g, uid, {x}))
        uid = x
    return chain[::-1]


# ----------------------------------------------------------------- masks: node for node


def test_causal_top_left_is_one_right_bound_mask():
    g, _ = fwd(causal=True)
    assert masks_of(g) == [right_mask(index(2))]
    g.lower()


def test_sliding_window_top_left_two_masks_each_with_its_own_indices():
    """The issue-17 failure: causal + left_bound built one pair of GEN_INDEX nodes for both masks (no cuDNN 9.19
    engine matched it). cudnn-frontend builds two diagonal band masks, each with its own row/col indices and
    -inf; the left bound is a float32 scalar added to the int32 column index in float32."""
    g, _ = fwd(causal=True, left_bound=64)
    assert masks_of(g) == [
        right_mask(index(2)),
        left_mask(("ADD", "float32", "float32", index(3), f32(64))),
    ]
    gens = pw_nodes(g, "GEN_INDEX")
    assert len(gens) == 4
    consumers = [u for n in g.nodes() for _, u in n.inputs]
    assert all(consumers.count(dict(n.outputs)["y"]) == 1 for n in gens)  # each index read once
    selects = pw_nodes(g, "BINARY_SELECT")
    assert len({dict(n.inputs)["b"] for n in selects}) == 2  # a -inf scalar each
    g.lower()


def test_right_bound_shift_is_an_int32_add():
    g, _ = fwd(right_bound=5, left_bound=3)
    assert masks_of(g) == [
        right_mask(iop("ADD", index(2), i32(5))),
        left_mask(("ADD", "float32", "float32", index(3), f32(3))),
    ]
    g.lower()


def test_causal_bottom_right_shifts_row_by_skv_minus_sq():
    g, _ = fwd(causal=True, diagonal_alignment="bottom_right")
    assert masks_of(g) == [right_mask(iop("SUB", iop("ADD", index(2), i32(SKV)), i32(SQ)))]
    g.lower()


def test_window_bottom_right_folds_the_shift_into_a_float_left_bound():
    g, _ = fwd(causal=True, left_bound=16, diagonal_alignment="bottom_right")
    assert masks_of(g) == [
        right_mask(iop("SUB", iop("ADD", index(2), i32(SKV)), i32(SQ))),
        left_mask(("ADD", "float32", "float32", index(3), f32(16 - SKV + SQ))),
    ]
    g.lower()


def test_padding_mask_and_bottom_right_window_with_lengths():
    g, _ = fwd(padded=True, causal=True, left_bound=16, diagonal_alignment="bottom_right")
    sl_q, sl_kv = ("in", "seq_len_q"), ("in", "seq_len_kv")
    pad = ("BINARY_SELECT", "float32", "float32", "S", NEG_INF,
           ("LOGICAL_AND", "bool", "bool",
            ("CMP_LT", "bool", "bool", index(2, "int32"), sl_q),
            ("CMP_LT", "bool", "bool", index(3, "int32"), sl_kv)))  # fmt: skip
    assert masks_of(g) == [
        pad,
        right_mask(iop("SUB", iop("ADD", index(2), sl_kv), sl_q)),
        left_mask(iop("ADD", iop("SUB", iop("ADD", index(3), i32(16)), sl_kv), sl_q)),
    ]
    # the matmuls' GEMM sizes overridden per sample: bmm1 M=seq_len_q N=seq_len_kv, bmm2 M=seq_len_q K=seq_len_kv
    names = {t.uid: t.name for t in g.tensors()}
    mms = [{r: names[u] for r, u in n.inputs if r.endswith("override")} for n in g.nodes() if n.kind == "matmul"]
    assert mms == [{"m_override": "seq_len_q", "n_override": "seq_len_kv"},
                   {"m_override": "seq_len_q", "k_override": "seq_len_kv"}]  # fmt: skip
    low = g.lower()
    mm = low.ops[[n.kind for n in g.nodes()].index("matmul")]
    (m,) = mm.get_descriptors("CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC", "CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    assert m.get("CUDNN_ATTR_TENSOR_DATA_TYPE") == lib.CUDNN_DATA_INT32
    assert m.get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [B, 1, 1, 1]


def test_padding_top_left_causal_uses_no_lengths_in_the_band():
    g, _ = fwd(padded=True, causal=True)
    assert masks_of(g)[1] == right_mask(index(2))
    g.lower()


def test_no_mask_no_index_nodes_and_square_bottom_right():
    g, _ = fwd()
    assert masks_of(g) == [] and not pw_nodes(g, "GEN_INDEX")
    g, _ = fwd(sq=SKV, causal=True, diagonal_alignment="bottom_right")  # S_q == S_kv: the shift is 0, still built
    assert masks_of(g) == [right_mask(iop("SUB", iop("ADD", index(2), i32(SKV)), i32(SKV)))]


# ----------------------------------------------------------------- score modifiers


def test_bias_alibi_then_causal_in_frontend_order():
    g = Graph()
    q, k, v = qkv(g)
    bias = g.tensor((1, H, SQ, SKV), dtype="bfloat16", name="bias")
    slopes = g.tensor((1, H, 1, 1), dtype="float32", name="slopes")
    r = g.sdpa_forward(q, k, v, bias=bias, alibi_slopes=slopes, causal=True)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    alibi = ("MUL", "float32", "float32", iop("SUB", index(3, "int32"), index(2, "int32")), ("in", "slopes"))
    assert masks_of(g) == [
        ("ADD", "float32", "float32", "S", ("in", "bias")),
        ("ADD", "float32", "float32", "S", alibi),
        right_mask(index(2)),
    ]
    g.lower()


def test_softcap_forward_div_tanh_mul():
    g, _ = fwd(softcap=30.0)
    cap = f32(30.0)
    e = expr(g, softmax_input(g), {scaled(g)})
    assert e == ("MUL", "float32", "float32", ("TANH_FWD", "float32", "float32",
                                               ("DIV", "float32", "float32", "S", cap)), cap)  # fmt: skip
    (div,) = pw_nodes(g, "DIV")[:1]
    (mul,) = [n for n in pw_nodes(g, "MUL") if dict(n.inputs).get("b") == dict(div.inputs)["b"]]
    assert mul  # one softcap scalar for the DIV and the MUL
    g.lower()


# ----------------------------------------------------------------- head layouts


@pytest.mark.parametrize("hk", [1, 2, 4])
def test_mla_head_dims_and_grouped_heads_forward(hk):
    g = Graph()
    q, k, v = qkv(g, hk=hk, d=192, dv=128)
    r = g.sdpa_forward(q, k, v, causal=True)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    assert r.o.dims == (B, H, SQ, 128)
    (sc,) = [c for c, t in g.constants().values() if t == "float32" and c not in (-math.inf,)]
    assert sc == pytest.approx(1 / math.sqrt(192))  # the scale follows d_qk
    g.lower()


@pytest.mark.parametrize("d, dv", [(256, 256), (64, 256), (256, 64)])
def test_head_dims_up_to_256(d, dv):
    g = Graph()
    r = g.sdpa_forward(*qkv(g, d=d, dv=dv))
    g.mark_output(r.o)
    g.mark_output(r.stats)
    assert r.o.dims == (B, H, SQ, dv) and r.stats.dims == (B, H, SQ, 1)
    (sc,) = [c for c, t in g.constants().values() if t == "float32" and c not in (-math.inf,)]
    assert sc == pytest.approx(1 / math.sqrt(d))  # the scale follows d_qk
    assert g.lower().op_graph.finalized


@pytest.mark.parametrize("d, dv, msg", [(264, 64, "q's head dim"), (64, 12, "v's head dim"), (60, 64, "q's head")])
def test_head_dims_refused(d, dv, msg):
    g = Graph()
    with pytest.raises(GraphError, match=f"{msg}.*multiple of 8 up to 256"):
        g.sdpa_forward(*qkv(g, d=d, dv=dv))


# ----------------------------------------------------------------- backward


def bwd(hk=H, d=D, dv=D, padded=False, bias_dims=None, **kw):
    g = Graph()
    q, k, v = qkv(g, hk=hk, d=d, dv=dv)
    o = g.tensor((B, H, SQ, dv), dtype="bfloat16", name="o")
    do = g.tensor((B, H, SQ, dv), dtype="bfloat16", name="do")
    st = g.tensor((B, H, SQ, 1), name="stats")
    if padded:
        kw["seq_len_q"], kw["seq_len_kv"] = seq_lens(g)
    if bias_dims is not None:
        kw["bias"] = g.tensor(bias_dims, dtype="bfloat16", name="bias")
    r = g.sdpa_backward(q, k, v, o, do, st, **kw)
    for t in r:
        if t is not None:
            g.mark_output(t)
    return g, r


def exp_input(g):
    (e,) = [n for n in pw_nodes(g, "EXP")]
    return dict(e.inputs)["x"]


def test_backward_window_masks_after_the_statistics():
    g, r = bwd(causal=True, left_bound=32, diagonal_alignment="bottom_right")
    chain = masks_of(g, exp_input(g))
    assert chain[0] == ("SUB", "float32", "float32", "S", ("in", "stats"))  # frontend: the band after - stats
    assert chain[1:] == [
        right_mask(iop("SUB", iop("ADD", index(2), i32(SKV)), i32(SQ))),
        left_mask(("ADD", "float32", "float32", index(3), f32(32 - SKV + SQ))),
    ]
    g.lower()


def test_backward_padding_before_statistics_and_overrides():
    g, r = bwd(padded=True, causal=True)
    chain = masks_of(g, exp_input(g))
    assert [c[0] for c in chain] == ["BINARY_SELECT", "SUB", "BINARY_SELECT"]  # padding, - stats, causal
    names = {t.uid: t.name for t in g.tensors()}
    got = [{r: names[u] for r, u in n.inputs if r.endswith("override")} for n in g.nodes() if n.kind == "matmul"]
    sq, skv = "seq_len_q", "seq_len_kv"
    # frontend: Q@K^T (M=sq, N=skv), P^T@dO (M=skv, K=sq), dO@V^T (M=sq, N=skv), dS^T@Q (M=skv, K=sq),
    # dS@K (M=sq, K=skv)
    assert got == [{"m_override": sq, "n_override": skv}, {"m_override": skv, "k_override": sq},
                   {"m_override": sq, "n_override": skv}, {"m_override": skv, "k_override": sq},
                   {"m_override": sq, "k_override": skv}]  # fmt: skip
    g.lower()


@pytest.mark.parametrize("hk", [1, 2])
def test_backward_grouped_heads_reduce_dk_dv(hk):
    g, r = bwd(hk=hk, d=128, dv=64)
    assert r.dk.dims == (B, hk, SKV, 128) and r.dv.dims == (B, hk, SKV, 64) and r.dq.dims == (B, H, SQ, 128)
    reds = [n for n in g.nodes() if n.kind == "reduction"]
    full = {g._tensors[dict(n.inputs)["x"]].dims: g._tensors[dict(n.outputs)["y"]].dims for n in reds}
    assert full[(B, H, SKV, 128)] == (B, hk, SKV, 128) and full[(B, H, SKV, 64)] == (B, hk, SKV, 64)
    g.lower()


def test_deterministic_backward_writes_dq_without_the_accumulator():
    g, r = bwd(deterministic=True)
    assert [t.dims for t in g.scratch()] == [(B, H, SQ, 1)]  # the row sums only
    assert not pw_nodes(g, "IDENTITY")
    last = [n for n in g.nodes() if n.kind == "matmul"][-1]
    assert dict(last.outputs)["c"] == r.dq.uid
    g.lower()
    g, r = bwd()
    assert sorted(t.dims for t in g.scratch()) == [(B, H, SQ, 1), (B, H, SQ, D)] and pw_nodes(g, "IDENTITY")


@pytest.mark.parametrize("dims", [(1, H, SQ, SKV), (B, H, SQ, SKV), (1, 1, SQ, SKV)])
def test_backward_dbias_sums_ds_to_the_bias_dims(dims):
    g, r = bwd(bias_dims=dims, dbias=True)
    assert isinstance(r, SdpaBackwardBias) and r.dbias.dims == dims and r.dbias.dtype == "bfloat16"
    (red,) = [n for n in g.nodes() if n.kind == "reduction" and dict(n.outputs)["y"] == r.dbias.uid]
    # dS before the attention scale: the scale MUL reads what the reduction reads
    (scale_mul,) = [n for n in pw_nodes(g, "MUL") if n.attrs and g._tensors[dict(n.outputs)["y"]].name == "ds"]
    assert dict(scale_mul.inputs)["x"] == dict(red.inputs)["x"]
    assert not pw_nodes(g, "IDENTITY")  # frontend: dbias uses the dP-workspace form (dq written directly)
    g.lower()


def test_backward_softcap_gradient():
    g, r = bwd(softcap=20.0)
    (tb,) = [n for n in g.nodes() if n.kind == "pointwise" and n.attr("mode") == "TANH_BWD"]
    ins = dict(tb.inputs)
    (div,) = [n for n in pw_nodes(g, "DIV") if g._tensors[dict(n.outputs)["y"]].name == "div_by_softcap"]
    assert ins["x"] == dict(div.outputs)["y"]  # tanh' at s / c, recomputed in the backward graph
    assert expr(g, ins["dy"], set())[:3] == ("MUL", "float32", "float32")
    g.lower()


def test_backward_dropout_replays_the_mask():
    g = Graph()
    q, k, v = qkv(g)
    o, do = (g.tensor((B, H, SQ, D), dtype="bfloat16") for _ in range(2))
    seed, off = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_backward(q, k, v, o, do, g.tensor((B, H, SQ, 1)), dropout=0.2, seed=seed, offset=off)
    for t in r:
        g.mark_output(t)
    (rng,) = [n for n in g.nodes() if n.kind == "rng"]
    assert g.nodes()[0] is rng  # cudnn-frontend's backward makes the RNG node first
    mask = dict(rng.outputs)["y"]
    readers = [n.attr("mode") for n in g.nodes() if n.kind == "pointwise" and mask in dict(n.inputs).values()]
    assert readers == ["MUL", "MUL"]  # P and dP, one mask
    vals = sorted(round(c, 6) for c, t in g.constants().values() if t == "float32")
    assert round(1 / 0.8, 6) in vals and round(0.8, 6) in vals
    g.lower()


# ----------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"diagonal_alignment": "center"}, "diagonal_alignment must be one of"),
        ({"causal": True, "diagonal_alignment": "bottom_right", "sq": 256}, "S_q <= S_kv"),
        ({"left_bound": 8, "sq": 256}, "left_bound .sliding window. needs S_q <= S_kv"),
        ({"causal": True, "diagonal_alignment": "bottom_right", "bias": True}, "takes no bias"),
        ({"causal": True, "diagonal_alignment": "bottom_right", "dropout": 0.1}, "takes no bias, alibi_slopes or drop"),
        ({"alibi": True}, "alibi_slopes needs causal=True"),
        ({"softcap": 10.0, "causal": True}, "softcap takes no causal mask"),
        ({"softcap": -1.0}, "softcap must be a positive number"),
        ({"seq_len_q": True}, "needs both seq_len_q= and seq_len_kv="),
        ({"bad_seq_len": True}, r"seq_len_q must be an int32 \(B, 1, 1, 1\)"),
        ({"bias_dims": (1, 3, 64, 128)}, r"bias must be \(1 or B, 1 or H, S_q, S_kv\)"),
        ({"right_bound": -1}, "right_bound must be an int >= 0"),
        ({"left_bound": 2.5}, "left_bound must be an int >= 1"),
        ({"causal": 1}, "causal must be a bool"),
        ({"implementation": "unified", "bias": True}, "unified SDPA operation"),
    ],
)
def test_refusals_name_the_argument(kw, msg):
    g = Graph()
    q, k, v = qkv(g, sq=kw.pop("sq", SQ))
    if kw.pop("bias", False):
        kw["bias"] = g.tensor((1, H, q.dims[2], SKV), dtype="bfloat16")
    if "bias_dims" in kw:
        kw["bias"] = g.tensor(kw.pop("bias_dims"), dtype="bfloat16")
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = g.tensor((1, H, 1, 1))
    if kw.pop("seq_len_q", False):
        kw["seq_len_q"] = seq_lens(g)[0]
    if kw.pop("bad_seq_len", False):
        kw["seq_len_q"], kw["seq_len_kv"] = g.tensor((B, 1, 1, 1), dtype="int64"), seq_lens(g)[1]
    if kw.get("dropout"):
        kw["seed"], kw["offset"] = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    n = len(g.nodes())
    with pytest.raises(GraphError, match=msg):
        g.sdpa_forward(q, k, v, **kw)
    assert len(g.nodes()) == n  # refused before any node was added


def test_backward_refusals():
    g = Graph()
    q, k, v = qkv(g)
    o, do = (g.tensor((B, H, SQ, D), dtype="bfloat16") for _ in range(2))
    st = g.tensor((B, H, SQ, 1))
    with pytest.raises(GraphError, match="dbias=True needs bias="):
        g.sdpa_backward(q, k, v, o, do, st, dbias=True)
    with pytest.raises(GraphError, match="dropout needs seed= and offset="):
        g.sdpa_backward(q, k, v, o, do, st, dropout=0.1)
    assert not g.nodes()


# ----------------------------------------------------------------- the patterns' values, interpreted on the CPU
# A float64 NumPy interpreter of the node kinds the attention patterns use (cuDNN's documented semantics:
# GEN_INDEX the index along ``axis``, BINARY_SELECT ``t ? x : b``, a tensor described as its transpose read
# transposed, matmul batch dims broadcast with grouped heads ``i // (H / H_kv)``, reductions summing groups of
# consecutive heads) runs each built graph and must give the torch-CPU float64 reference the GPU tier uses: the
# mask arithmetic (alignment shifts, bounds, padding) and those references checked against each other here.

_CMP = {"CMP_GE": np.greater_equal, "CMP_GT": np.greater, "CMP_LT": np.less}
_BIN = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": np.divide,
    "MAX": np.maximum,
    "LOGICAL_AND": np.logical_and,
}
_UN = {"EXP": np.exp, "LOG": np.log, "TANH_FWD": np.tanh, "IDENTITY": lambda x: x}


def _heads(x, h):
    return x if x.shape[1] in (1, h) else np.repeat(x, h // x.shape[1], axis=1)


def _reduce(x, dims):
    for ax, (n, m) in enumerate(zip(x.shape, dims)):
        if m == 1 and n != 1:
            x = x.sum(axis=ax, keepdims=True)
        elif m != n:
            x = x.reshape(x.shape[:ax] + (m, n // m) + x.shape[ax + 1 :]).sum(axis=ax + 1)
    return x


def interpret(g, values, rng_mask=None):
    """Every tensor's value after running ``g``'s nodes in order on ``values`` ({uid: array}) in float64."""
    val = dict(values)
    for uid, (c, _) in g.constants().items():
        val[uid] = np.float64(c)

    def read(uid):
        v = val[uid]
        return np.swapaxes(v, 2, 3) if uid in g._described else v

    for n in g.nodes():
        ins = {r: read(u) for r, u in n.inputs if n.kind != "rng"}  # seed/offset: the mask is given
        (out_role, out_uid), *_ = n.outputs
        dims = g._tensors[out_uid].dims
        a = dict(n.attrs)
        if n.kind == "matmul":
            x, y = ins["a"], ins["b"]
            h = max(x.shape[1], y.shape[1])
            r = _heads(x, h) @ _heads(y, h)
        elif n.kind == "reduction":
            x = ins["x"]
            if a["mode"] == "add":
                r = _reduce(x, dims)
            elif a["mode"] == "max":
                r = x.max(axis=-1, keepdims=True)
            else:  # fp8's amax: the largest magnitude of the whole tensor
                assert a["mode"] == "amax" and dims == (1, 1, 1, 1), (a["mode"], dims)
                r = np.abs(x).max().reshape(dims)
        elif n.kind == "reshape":
            r = np.transpose(ins["x"], a["perm"])
        elif n.kind == "rng":
            r = rng_mask
        elif n.kind == "paged_cache_load":  # y[b, h, s] = container[table[b, s // block], h, s % block]
            c, table = ins["container"], ins["page_table"].astype(int)
            bs = c.shape[2]
            logical = (dims[0], dims[1], dims[3], dims[2]) if dims[2] == c.shape[3] and dims[3] != c.shape[3] else dims
            s_kv = logical[2]
            r = np.stack([np.stack([c[table[i, 0, s // bs, 0], :, s % bs] for s in range(s_kv)], axis=1)
                          for i in range(dims[0])])  # fmt: skip
            if logical != dims:
                r = np.swapaxes(r, 2, 3)
        else:
            m, x = a["mode"], ins.get("x")
            if m == "GEN_INDEX":
                shape = [1] * x.ndim
                shape[a["axis"]] = x.shape[a["axis"]]
                r = np.broadcast_to(np.arange(x.shape[a["axis"]]).reshape(shape), x.shape)
            elif m == "BINARY_SELECT":
                r = np.where(ins["t"], x, ins["b"])
            elif m == "TANH_BWD":
                r = ins["dy"] * (1 - np.tanh(x) ** 2)
            elif m in _CMP:
                r = _CMP[m](x, ins["b"])
            elif m in _BIN:
                r = _BIN[m](x, ins["b"])
            else:
                r = _UN[m](x)
        val[out_uid] = np.broadcast_to(r, dims) if np.ndim(r) else np.full(dims, r)
    return val


def _valid(a, lens):
    return np.concatenate([a[b, :, : lens[b]].ravel() for b in range(a.shape[0])])


@pytest.mark.parametrize(
    "case",
    [
        dict(causal=True),
        dict(causal=True, diagonal_alignment="bottom_right"),
        dict(causal=True, left_bound=24),
        dict(causal=True, left_bound=24, diagonal_alignment="bottom_right"),
        dict(left_bound=20, right_bound=9, diagonal_alignment="bottom_right"),
        dict(left_bound=20),
        dict(padded=True),
        dict(padded=True, causal=True, left_bound=12, diagonal_alignment="bottom_right"),
        dict(padded=True, causal=True, left_bound=12),
        dict(bias=(1, 4, 32, 48), causal=True),
        dict(bias=(2, 1, 32, 48)),
        dict(alibi=True, causal=True),
        dict(softcap=2.5),
        dict(hk=2, causal=True),
        dict(hk=1, dv=24, left_bound=10),
        dict(dropout=True, causal=True),
    ],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()),
)
def test_patterns_compute_the_reference(case):
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    case = dict(case)
    b, h, sq, skv, d = 2, 4, 32, 48, 16
    hk, dv = case.pop("hk", h), case.pop("dv", d)
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((b, h, sq, d)), rng.standard_normal((b, hk, skv, d)), rng.standard_normal(
        (b, hk, skv, dv))  # fmt: skip
    do = rng.standard_normal((b, h, sq, dv))
    lq, lkv = ([5, 32], [20, 48]) if case.pop("padded", False) else ([sq] * b, [skv] * b)
    for i in range(b):
        do[i, :, lq[i] :] = 0
    bias_dims = case.pop("bias", None)
    bias = None if bias_dims is None else rng.standard_normal(bias_dims)
    slopes = gpu.alibi_slopes(h) if case.pop("alibi", False) else None
    p = 0.3 if case.pop("dropout", False) else 0.0
    drop = (rng.random((b, h, sq, skv)) >= p).astype(np.float64) if p else None
    keep = gpu.keep_matrix(sq, skv, b=b, causal=case.get("causal", False), left=case.get("left_bound"),
                           right=case.get("right_bound"), align=case.get("diagonal_alignment", "top_left"),
                           lens_q=lq, lens_kv=lkv)  # fmt: skip
    o_ref, lse_ref, grads = gpu.reference(q, k, v, do, scale=1 / math.sqrt(d), keep=keep, bias=bias, slopes=slopes,
                                          softcap=case.get("softcap"), drop=drop, p=p)  # fmt: skip
    for direction in ("forward", "backward"):
        g = Graph()
        qt, kt, vt = (g.tensor(a.shape, dtype="float16") for a in (q, k, v))
        vals = {qt.uid: q, kt.uid: k, vt.uid: v}
        kw = dict(case)
        if lq != [sq] * b:
            kw["seq_len_q"], kw["seq_len_kv"] = (g.tensor((b, 1, 1, 1), dtype="int32") for _ in range(2))
            vals[kw["seq_len_q"].uid] = np.array(lq).reshape(b, 1, 1, 1)
            vals[kw["seq_len_kv"].uid] = np.array(lkv).reshape(b, 1, 1, 1)
        if bias is not None:
            kw["bias"] = g.tensor(bias.shape, dtype="float16")
            vals[kw["bias"].uid] = bias
        if slopes is not None:
            kw["alibi_slopes"] = g.tensor((1, h, 1, 1))
            vals[kw["alibi_slopes"].uid] = slopes.reshape(1, h, 1, 1)
        if p:
            kw["dropout"], kw["seed"], kw["offset"] = p, g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor(
                (1, 1, 1, 1), dtype="int64")  # fmt: skip
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if direction == "forward":
                r = g.sdpa_forward(qt, kt, vt, **kw)
                val = interpret(g, vals, drop)
                assert np.allclose(_valid(val[r.o.uid], lq), _valid(o_ref, lq), rtol=1e-9, atol=1e-9)
                assert np.allclose(_valid(val[r.stats.uid], lq), _valid(lse_ref, lq), rtol=1e-9, atol=1e-9)
            else:
                ot, dot, st = g.tensor(o_ref.shape, dtype="float16"), g.tensor(do.shape, dtype="float16"), g.tensor(
                    lse_ref.shape)  # fmt: skip
                o_in, lse_in = o_ref.copy(), lse_ref.copy()
                for i in range(b):
                    o_in[i, :, lq[i] :], lse_in[i, :, lq[i] :] = 0, 0
                vals.update({ot.uid: o_in, dot.uid: do, st.uid: lse_in})
                r = g.sdpa_backward(qt, kt, vt, ot, dot, st, dbias=bias is not None, **kw)
                val = interpret(g, vals, drop)
                assert np.allclose(_valid(val[r.dq.uid], lq), _valid(grads[0], lq), rtol=1e-9, atol=1e-9)
                assert np.allclose(_valid(val[r.dk.uid], lkv), _valid(grads[1], lkv), rtol=1e-9, atol=1e-9)
                assert np.allclose(_valid(val[r.dv.uid], lkv), _valid(grads[2], lkv), rtol=1e-9, atol=1e-9)
                if bias is not None:
                    assert np.allclose(val[r.dbias.uid], grads[3], rtol=1e-9, atol=1e-9)


def test_interpreter_sees_a_wrong_mask():
    """The check above can fail: the causal pattern against a reference without the mask."""
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 4, 16, 8)) for _ in range(3))
    g = Graph()
    qt, kt, vt = (g.tensor(a.shape, dtype="float16") for a in (q, k, v))
    r = g.sdpa_forward(qt, kt, vt, causal=True, diagonal_alignment="bottom_right")
    with np.errstate(invalid="ignore"):
        val = interpret(g, {qt.uid: q, kt.uid: k, vt.uid: v})
    o_ref = gpu.reference(q, k, v, np.zeros_like(q), scale=1 / math.sqrt(8))[0]
    assert not np.allclose(val[r.o.uid], o_ref, rtol=1e-3)


# ----------------------------------------------------------------- the L2 op: ops.attention_forward/_backward
# (fake arrays and recording plans, as tests/test_l3_attention_cpu.py: the graphs the calls build and bind)

from cudnnkit import ops, settings  # noqa: E402

from . import test_l3_attention_cpu as L3  # noqa: E402
from .test_l3_attention_cpu import _arr, _kinds  # noqa: E402


@pytest.fixture
def fake_fixture():
    """tests/fuzz's fake arrays installed (as test_l3_attention_cpu's ``fake``)."""
    from .fuzz.materialize import FakeBackend

    b = FakeBackend()
    with b.installed():
        yield b


@pytest.fixture
def plans_fixture(monkeypatch, fake_fixture):
    """(graphs built, pointer-only runs, checked executions): test_l3_attention_cpu's ``plans``, its caches
    cleared around the test."""
    from cudnnkit.graph import Graph
    from cudnnkit.ops import _express

    from .graph_fakes import RecordingPlan, recording_plans

    runs = recording_plans(monkeypatch)
    built, executed = [], []
    fake_build = Graph.build
    monkeypatch.setattr(Graph, "build", lambda self, device=None, **kw: built.append(self) or fake_build(self, device))
    monkeypatch.setattr(RecordingPlan, "execute", lambda self, b, **kw: executed.append((self.graph, b, kw)),
                        raising=False)  # fmt: skip
    _express.entries.clear()
    L3.A._bwd_forms.clear()
    yield built, runs, executed
    _express.entries.clear()
    L3.A._bwd_forms.clear()


QS, KS = (2, 4, 32, 64), (2, 4, 48, 64)


def _named(g):
    return {t.name: t for t in g.tensors() if not t.virtual and not t.by_value}


def test_l2_forward_binds_every_variant_array(fake_fixture, plans_fixture):
    built, runs, _ = plans_fixture
    fake = fake_fixture
    q, k, v = _arr(fake, QS), _arr(fake, KS), _arr(fake, KS)
    mask = _arr(fake, (1, 4, 32, 48))
    lq, lkv = _arr(fake, (2,), "int32"), _arr(fake, (2,), "int32")
    o, st = ops.attention_forward(q, k, v, attn_mask=mask, seq_len_q=lq, seq_len_kv=lkv, is_causal=True,
                                  left_bound=8, scale=0.3)  # fmt: skip
    assert ops.last_path() == ("sdpa_forward", "graph")
    assert o.shape == (2, 4, 32, 64) and st.shape == (2, 4, 32, 1) and st.dtype == "float32"
    (g,) = built
    t = _named(g)
    assert t["attn_mask"].dims == (1, 4, 32, 48) and t["attn_mask"].dtype == "bfloat16"
    assert t["seq_len_q"].dims == t["seq_len_kv"].dims == (2, 1, 1, 1) and t["seq_len_q"].dtype == "int32"
    kinds = _kinds(g)
    assert kinds.count("GEN_INDEX") == 6 and kinds.count("BINARY_SELECT") == 3  # padding, right, left bound
    assert (0.3, "float32") in g.constants().values() and (8.0, "float32") in g.constants().values()
    seen = runs[-1]
    for name, arr in (("q", q), ("k", k), ("v", v), ("attn_mask", mask), ("seq_len_q", lq), ("seq_len_kv", lkv)):
        assert seen[name][1] == arr.ptr
    # the shape class: other length values, the same plan; another window, another graph
    ops.attention_forward(q, k, v, attn_mask=mask, seq_len_q=_arr(fake, (2,), "int32"),
                          seq_len_kv=_arr(fake, (2,), "int32"), is_causal=True, left_bound=8, scale=0.3)  # fmt: skip
    assert len(built) == 1
    ops.attention_forward(q, k, v, attn_mask=mask, seq_len_q=lq, seq_len_kv=lkv, is_causal=True, left_bound=9,
                          scale=0.3)  # fmt: skip
    assert len(built) == 2


def test_l2_two_d_mask_alibi_dropout_and_bottom_right(fake_fixture, plans_fixture):
    built, runs, _ = plans_fixture
    fake = fake_fixture
    q, k, v = _arr(fake, QS), _arr(fake, KS), _arr(fake, KS)
    o, st = ops.attention_forward(q, k, v, attn_mask=_arr(fake, (32, 48), "float32"))
    assert _named(built[-1])["attn_mask"].dims == (1, 1, 32, 48)
    slopes = _arr(fake, (4,), "float32")
    ops.attention_forward(q, k, v, alibi_slopes=slopes, is_causal=True)
    t = _named(built[-1])["alibi_slopes"]
    assert (t.dims, t.strides, t.dtype) == ((1, 4, 1, 1), (4, 1, 1, 1), "float32")
    seed, off = _arr(fake, (1,), "int64"), _arr(fake, (1,), "int64")
    ops.attention_forward(q, k, v, dropout_p=0.1, seed=seed, offset=off)
    g = built[-1]
    assert "rng" in _kinds(g) and _named(g)["seed"].dims == (1, 1, 1, 1)
    assert runs[-1]["seed"][1] == seed.ptr and runs[-1]["offset"][1] == off.ptr
    ops.attention_forward(q, k, v, is_causal=True, diagonal_alignment="bottom_right")
    assert (48, "int32") in built[-1].constants().values() and (32, "int32") in built[-1].constants().values()


def test_l2_backward_dbias_gqa_and_deterministic(fake_fixture, plans_fixture):
    built, _, executed = plans_fixture
    fake = fake_fixture
    q, o, do = _arr(fake, QS), _arr(fake, QS), _arr(fake, QS)
    k, v = _arr(fake, (2, 2, 48, 64)), _arr(fake, (2, 2, 48, 64))
    st = _arr(fake, (2, 4, 32, 1), "float32")
    mask = _arr(fake, (4, 32, 48))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        ops.attention_backward(q, k, v, o, do, st)
    got = ops.attention_backward(q, k, v, o, do, st, attn_mask=mask, enable_gqa=True, dbias=True)
    assert ops.last_path() == ("sdpa_backward", "graph")
    dq, dk, dv, dmask = got
    assert dk.shape == dv.shape == (2, 2, 48, 64) and dq.shape == QS
    assert (dmask.shape, dmask.dtype) == ((4, 32, 48), "bfloat16")
    g, bindings, _ = executed[-1]
    red = [n for n in g.nodes() if n.kind == "reduction"]
    assert len(red) == 4  # rowsum(do * o), dbias, the head sums of dk and dv
    (db,) = [dict(n.outputs)["y"] for n in red if g._tensors[dict(n.outputs)["y"]].dims == (1, 4, 32, 48)]
    assert bindings[db] == dmask.ptr and g._tensors[db].dtype == "bfloat16"  # described (1, H, S_q, S_kv)
    assert "IDENTITY" not in _kinds(g)  # dbias: dq written directly
    assert len(ops.attention_backward(q, k, v, o, do, st, attn_mask=mask, enable_gqa=True)) == 3
    assert "IDENTITY" in _kinds(built[-1])  # without dbias: the dq accumulator
    n = len(built)
    with settings(deterministic=True):
        ops.attention_backward(q, k, v, o, do, st, attn_mask=mask, enable_gqa=True)
    g = built[-1]
    assert len(built) == n + 1 and "IDENTITY" not in _kinds(g) and [t.name for t in g.scratch()] == ["softmax_sum"]


def test_l2_backward_with_a_sink_and_without_its_gradient(fake_fixture, plans_fixture):
    """``attention_backward(sink=...)`` without ``dsink``: dq, dk, dv only, the sink left out of the graph (no node
    of the backward reads it: the stats hold it; it was a dangling-tensor GraphError); with ``dsink=True`` it is
    bound. The graph refuses a sink without dsink by name."""
    built, _, executed = plans_fixture
    fake = fake_fixture
    q, k, v, o, do = (_arr(fake, QS) for _ in range(5))
    st, sink = _arr(fake, (2, 4, 32, 1), "float32"), _arr(fake, (4,), "float32")
    got = ops.attention_backward(q, k, v, o, do, st, sink=sink)
    assert len(got) == 3 and "sink" not in _named(built[-1])
    got = ops.attention_backward(q, k, v, o, do, st, sink=sink, dsink=True)
    g, bindings, _ = executed[-1]
    assert len(got) == 4 and got[3].shape == (4,) and bindings[_named(g)["sink"].uid] == sink.ptr
    from cudnnkit.graph import Graph, GraphError

    g = Graph()
    t = {n: g.tensor((2, 4, 32, 64), dtype="bfloat16", name=n) for n in ("q", "k", "v", "o", "do")}
    with pytest.raises(GraphError, match="sink= without dsink=True"):
        g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["do"], g.tensor((2, 4, 32, 1), dtype="float32"),
                        sink=g.tensor((1, 4, 1, 1), dtype="float32"))  # fmt: skip


def _l2_call(b, **kw):
    q, k, v = _arr(b, kw.pop("qs", QS)), _arr(b, KS), _arr(b, KS)
    for name, (shape, dtype) in kw.pop("arrays", {}).items():
        kw[name] = _arr(b, shape, dtype)
    return ops.attention_forward(q, k, v, **kw)


L2_REFUSED = [
    ({"arrays": {"attn_mask": ((32, 48), "bool")}}, TypeError, "attn_mask: a boolean mask is not taken"),
    ({"arrays": {"attn_mask": ((32, 48), "float16")}}, TypeError, "attn_mask must have q's dtype bfloat16"),
    ({"arrays": {"attn_mask": ((32, 40), "bfloat16")}}, ValueError, r"attn_mask must end in \(S_q, S_kv\)"),
    ({"arrays": {"attn_mask": ((3, 4, 32, 48), "bfloat16")}}, ValueError, "attn_mask's leading dims"),
    ({"arrays": {"seq_len_q": ((2,), "int32")}}, ValueError, "needs both seq_len_q= and seq_len_kv="),
    ({"arrays": {"seq_len_q": ((2,), "int32"), "seq_len_kv": ((3,), "int32")}}, ValueError,
     r"seq_len_kv must be an int32 device array of shape \(2,\)"),
    ({"arrays": {"alibi_slopes": ((4,), "float32")}}, ValueError, "alibi_slopes needs is_causal=True"),
    ({"arrays": {"alibi_slopes": ((3,), "float32")}, "is_causal": True}, ValueError, "alibi_slopes must be a float32"),
    ({"dropout_p": 0.2}, ValueError, "dropout_p > 0 needs seed= and offset="),
    ({"dropout_p": 1.0}, ValueError, r"dropout_p must be within \[0, 1\)"),
    ({"dropout_p": 0.2, "arrays": {"seed": ((1,), "int32"), "offset": ((1,), "int64")}}, TypeError,
     "seed has dtype int32"),
    ({"softcap": 10.0, "is_causal": True}, ValueError, "softcap takes no causal mask"),
    ({"is_causal": True, "diagonal_alignment": "bottom_right", "qs": (2, 4, 64, 64)}, ValueError, "S_q <= S_kv"),
    ({"left_bound": 4, "qs": (2, 4, 64, 64)}, ValueError, "left_bound .sliding window. needs S_q <= S_kv"),
    ({"is_causal": True, "diagonal_alignment": "bottom_right", "arrays": {"attn_mask": ((32, 48), "bfloat16")}},
     ValueError, "bottom-right causal masking takes no attn_mask"),
    ({"diagonal_alignment": "BOTTOM"}, ValueError, "diagonal_alignment must be one of"),
    ({"left_bound": 0}, ValueError, "left_bound must be an int >= 1"),
    ({"is_causal": "yes"}, TypeError, "is_causal must be a bool"),
    ({"enable_gqa": 1}, TypeError, "enable_gqa must be a bool"),
]  # fmt: skip


@pytest.mark.parametrize("kw, exc, msg", L2_REFUSED)
def test_l2_refusals_before_any_gpu_work(fake_fixture, plans_fixture, kw, exc, msg):
    built, runs, _ = plans_fixture
    fake = fake_fixture
    with pytest.raises(exc, match=msg):
        _l2_call(fake, **kw)
    assert not built and not runs


def test_l2_backward_refusals(fake_fixture, plans_fixture):
    built, _, executed = plans_fixture
    fake = fake_fixture
    q, k, v, o, do = (_arr(fake, s) for s in (QS, KS, KS, QS, QS))
    st = _arr(fake, (2, 4, 32, 1), "float32")
    with pytest.raises(ValueError, match="dbias=True needs attn_mask="):
        ops.attention_backward(q, k, v, o, do, st, dbias=True)
    with pytest.raises(TypeError, match="dbias must be a bool"):
        ops.attention_backward(q, k, v, o, do, st, attn_mask=_arr(fake, (32, 48)), dbias=1)
    assert not built and not executed


# ----------------------------------------------------------------- the GPU tier's checks, run on an emulated device
# tests/gpu/test_attention_gpu.py's graph-level checks end to end with NumPy arrays for device arrays and
# Graph.execute replaced by the interpreter above (its RNG a NumPy Bernoulli draw keyed by the bound seed and
# offset): the tests' plumbing (bindings, poisoned outputs, the compared regions, the references) is exercised
# here, so that a GPU failure means cuDNN, not the test.


class _HostArrays:
    """The adapter calls the GPU tests make (empty, copy, from_numpy, to_numpy), on NumPy arrays."""

    @staticmethod
    def empty(dims, dtype, device=0, strides=None):
        from .numerics import np_dtype

        return np.empty(dims, np_dtype(dtype))

    @staticmethod
    def copy(dst, src):
        dst[...] = src

    @staticmethod
    def from_numpy(a, device=0):
        return a

    @staticmethod
    def to_numpy(a):
        return np.asarray(a)


@pytest.fixture
def emulated(monkeypatch):
    def execute(self, bindings, **kw):
        vals = {t.uid: np.asarray(a, dtype=np.float64) for t, a in bindings.items()}
        drop = None
        rng_nodes = [n for n in self.nodes() if n.kind == "rng"]
        if rng_nodes:
            ins = dict(rng_nodes[0].inputs)
            key = (int(vals[ins["seed"]].ravel()[0]), int(vals[ins["offset"]].ravel()[0]))
            dims = self._tensors[dict(rng_nodes[0].outputs)["y"]].dims
            p = 1.0 - dict(rng_nodes[0].attrs)["probability"]  # the node's Bernoulli keeps with 1 - p
            drop = (np.random.default_rng(key).random(dims) >= p).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            val = interpret(self, vals, drop)
        produced = {u for n in self.nodes() for _, u in n.outputs}
        for t, a in bindings.items():
            if t.uid in produced:
                a[...] = val[t.uid]
        return None

    monkeypatch.setattr(Graph, "execute", execute)
    return _HostArrays()


@pytest.mark.parametrize(
    "case",
    [
        dict(
            sq=64, skv=96, causal=True, diagonal_alignment="bottom_right", keep=dict(causal=True, align="bottom_right")
        ),
        dict(sq=64, skv=96, left_bound=16, right_bound=8, keep=dict(left=16, right=8)),
        dict(
            lens=([9, 64], [40, 64]),
            causal=True,
            left_bound=12,
            diagonal_alignment="bottom_right",
            keep=dict(causal=True, left=12, align="bottom_right"),
        ),
        dict(bias_dims=(1, 4, 64, 64), dbias=True, causal=True, keep=dict(causal=True)),
        dict(slopes=True, causal=True, keep=dict(causal=True)),
        dict(softcap=4.0),
        dict(hk=2, d=32, dv=16, causal=True, deterministic=True, keep=dict(causal=True)),
    ],
    ids=["bottom_right", "band", "lengths-window", "bias", "alibi", "softcap", "gqa-mla-det"],
)
def test_gpu_checks_pass_on_the_emulated_device(emulated, case):
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    case = dict(case)
    sq, skv = case.pop("sq", 64), case.pop("skv", 64)
    lens = case.get("lens")
    keep_kw = case.pop("keep", None)
    keep = None
    if keep_kw is not None:
        keep = gpu.keep_matrix(sq, skv, lens_q=None if lens is None else lens[0],
                               lens_kv=None if lens is None else lens[1], **keep_kw)  # fmt: skip
    case.setdefault("d", 32)
    case.setdefault("dv", case["d"])
    gpu.check(emulated, "float16", sq=sq, skv=skv, keep=keep, **case)


def test_gpu_check_fails_on_a_wrong_result(emulated):
    """The check can fail: the bottom-right pattern compared with the top-left reference."""
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    with pytest.raises(AssertionError, match="relative error"):
        gpu.check(emulated, "float16", sq=32, skv=64, d=32, dv=32, causal=True, diagonal_alignment="bottom_right",
                  keep=gpu.keep_matrix(32, 64, causal=True))  # fmt: skip


def test_gpu_dropout_check_on_the_emulated_device(emulated):
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    gpu.test_dropout_forward_and_backward_replay_the_mask(emulated, True)


# ----------------------------------------------------------------- attention sinks


def test_sink_softmax_pattern_in_frontend_order():
    g = Graph()
    q, k, v = qkv(g)
    sink = g.tensor((1, H, 1, 1), name="sink")
    r = g.sdpa_forward(q, k, v, sink=sink, causal=True)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    steps = [n.kind if n.kind != "pointwise" else n.attr("mode") for n in g.nodes()]
    i = steps.index("reduction")  # the row max
    assert steps[i:] == ["reduction", "MAX", "SUB", "EXP", "SUB", "EXP", "reduction", "ADD", "LOG", "ADD", "DIV",
                         "matmul"]  # fmt: skip
    sub_sink = [n for n in pw_nodes(g, "SUB") if dict(n.inputs)["x"] == sink.uid]
    (n,) = sub_sink
    assert g._tensors[dict(n.outputs)["y"]].dims == (B, H, SQ, 1)  # broadcast to the rows, not the sink's dims
    g.lower()


def test_sink_backward_gradient_pattern():
    g = Graph()
    q, k, v = qkv(g)
    o, do = (g.tensor((B, H, SQ, D), dtype="bfloat16") for _ in range(2))
    st, sink = g.tensor((B, H, SQ, 1), name="stats"), g.tensor((1, H, 1, 1), name="sink")
    r = g.sdpa_backward(q, k, v, o, do, st, sink=sink, dsink=True)
    assert isinstance(r, SdpaBackwardBias) and r.dbias is None and r.dsink.dims == (1, H, 1, 1)
    for t in r:
        if t is not None:
            g.mark_output(t)
    (red,) = [n for n in g.nodes() if n.kind == "reduction" and dict(n.outputs)["y"] == r.dsink.uid]
    e = expr(g, dict(red.inputs)["x"], set())
    rowsum = ("add", "float32", "float32", ("MUL", "float32", "float32", ("in", ""), ("in", "")))
    assert e == ("MUL", "float32", "float32",
                 ("EXP", "float32", "float32", ("SUB", "float32", "float32", ("in", "sink"), ("in", "stats"))),
                 rowsum)  # fmt: skip
    g.lower()
    with pytest.raises(GraphError, match="dsink=True needs sink="):
        g.sdpa_backward(q, k, v, o, do, st, dsink=True)
    with pytest.raises(GraphError, match="sink must be a float32"):
        g.sdpa_forward(q, k, v, sink=g.tensor((1, H, 1, 1), dtype="float16"))


def test_sink_pattern_computes_the_reference():
    """Forward and dq/dk/dv with a sink: the reference. dsink: the pattern as cudnn-frontend builds it reads
    ``+sum exp(sink - lse) rowsum(do * o)``, the negative of the sink's gradient (autograd's); cuDNN's engine
    matches the pattern to the gradient (the frontend's own test compares the engine's dsink with autograd),
    which the GPU tier checks."""
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    b, h, sq, skv, d = 2, 4, 16, 24, 8
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.standard_normal(s) for s in [(b, h, sq, d), (b, h, skv, d), (b, h, skv, d), (b, h, sq, d)])
    sk = rng.standard_normal((1, h, 1, 1))
    o_ref, lse_ref, grads = gpu.reference(q, k, v, do, scale=0.3, sink=sk)
    g = Graph()
    qt, kt, vt = (g.tensor(a.shape, dtype="float16") for a in (q, k, v))
    st = g.tensor((1, h, 1, 1))
    r = g.sdpa_forward(qt, kt, vt, scale=0.3, sink=st)
    val = interpret(g, {qt.uid: q, kt.uid: k, vt.uid: v, st.uid: sk})
    assert np.allclose(val[r.o.uid], o_ref, rtol=1e-9) and np.allclose(val[r.stats.uid], lse_ref, rtol=1e-9)
    g = Graph()
    qt, kt, vt, ot, dot = (g.tensor(a.shape, dtype="float16") for a in (q, k, v, o_ref, do))
    stt, st = g.tensor(lse_ref.shape), g.tensor((1, h, 1, 1))
    r = g.sdpa_backward(qt, kt, vt, ot, dot, stt, scale=0.3, sink=st, dsink=True)
    val = interpret(g, {qt.uid: q, kt.uid: k, vt.uid: v, ot.uid: o_ref, dot.uid: do, stt.uid: lse_ref, st.uid: sk})
    for t, ref in zip(r[:3], grads[:3]):
        assert np.allclose(val[t.uid], ref, rtol=1e-9, atol=1e-12)
    assert np.allclose(val[r.dsink.uid], -grads[4], rtol=1e-9)


def test_l2_sink_and_its_gradient(fake_fixture, plans_fixture):
    built, runs, executed = plans_fixture
    fake = fake_fixture
    q, k, v, o, do = (_arr(fake, s) for s in (QS, KS, KS, QS, QS))
    st, sink = _arr(fake, (2, 4, 32, 1), "float32"), _arr(fake, (4,), "float32")
    ops.attention_forward(q, k, v, sink=sink, is_causal=True)
    t = _named(built[-1])["sink"]
    assert (t.dims, t.strides) == ((1, 4, 1, 1), (4, 1, 1, 1)) and runs[-1]["sink"][1] == sink.ptr
    dq, dk, dv, dsink = ops.attention_backward(q, k, v, o, do, st, sink=sink, dsink=True, is_causal=True)
    assert (dsink.shape, dsink.dtype) == ((4,), "float32")
    g, bindings, _ = executed[-1]
    (red,) = [n for n in g.nodes() if n.kind == "reduction" and g._tensors[dict(n.outputs)["y"]].dims == (1, 4, 1, 1)]
    assert bindings[dict(red.outputs)["y"]] == dsink.ptr
    mask = _arr(fake, (32, 48))
    got = ops.attention_backward(q, k, v, o, do, st, sink=sink, attn_mask=mask, dbias=True, dsink=True)
    assert [x.shape for x in got[3:]] == [(32, 48), (4,)]
    with pytest.raises(ValueError, match="dsink=True needs sink="):
        ops.attention_backward(q, k, v, o, do, st, dsink=True)
    with pytest.raises(ValueError, match="sink must be a float32 device array of shape"):
        ops.attention_forward(q, k, v, sink=_arr(fake, (3,), "float32"))


# ----------------------------------------------------------------- paged key/value caches


def paged_graph(b=2, hk=2, h=4, sq=4, bs=16, blocks=3, nb=8, d=32, **kw):
    g = Graph()
    q = g.tensor((b, h, sq, d), dtype="float16", name="q")
    kc = g.tensor((nb, hk, bs, d), dtype="float16", name="k_container")
    vc = g.tensor((nb, hk, bs, d), dtype="float16", name="v_container")
    ptk = g.tensor((b, 1, blocks, 1), dtype="int32", name="page_table_k")
    ptv = g.tensor((b, 1, blocks, 1), dtype="int32", name="page_table_v")
    lq, lkv = (g.tensor((b, 1, 1, 1), dtype="int32", name=n) for n in ("seq_len_q", "seq_len_kv"))
    r = g.sdpa_forward(q, kc, vc, page_table_k=ptk, page_table_v=ptv, seq_len_q=lq, seq_len_kv=lkv, **kw)
    g.mark_output(r.o)
    g.mark_output(r.stats)
    return g, r, (q, kc, vc, ptk, ptv, lq, lkv)


def test_paged_caches_load_k_transposed_and_v():
    g, r, (q, kc, vc, ptk, ptv, lq, lkv) = paged_graph(causal=True, diagonal_alignment="bottom_right")
    loads = [n for n in g.nodes() if n.kind == "paged_cache_load"]
    assert len(loads) == 2
    kt, vv = (g._tensors[dict(n.outputs)["y"]] for n in loads)
    # frontend: K^T (b, hk, d, s_kv) over BHSD memory, V (b, hv, s_kv, dv); S_kv = 3 blocks of 16
    assert (kt.dims, kt.strides) == ((2, 2, 32, 48), (32 * 48 * 2, 32 * 48, 1, 32)) and kt.virtual
    assert (vv.dims, vv.strides) == ((2, 2, 48, 32), (32 * 48 * 2, 32 * 48, 32, 1)) and vv.virtual
    assert [dict(n.inputs) for n in loads] == [{"container": kc.uid, "page_table": ptk.uid, "seq_len": lkv.uid},
                                               {"container": vc.uid, "page_table": ptv.uid, "seq_len": lkv.uid}]  # fmt: skip
    mms = [n for n in g.nodes() if n.kind == "matmul"]
    assert dict(mms[0].inputs)["b"] == kt.uid and dict(mms[1].inputs)["b"] == vv.uid
    assert kc.uid not in g._described  # the container is read as it is
    low = g.lower()
    op = low.ops[[n.kind for n in g.nodes()].index("paged_cache_load")]
    (y,) = op.get_descriptors("CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC", "CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    assert y.get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [2, 2, 32, 48]
    g, r, _ = paged_graph(max_seq_len_kv=40)
    assert [g._tensors[dict(n.outputs)["y"]].dims[3] for n in g.nodes() if n.kind == "paged_cache_load"][0] == 40


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"max_seq_len_kv": 20}, r"page_table_k has 3 blocks for S_kv = 20 with blocks of 16"),
        ({"max_seq_len_kv": 0}, "max_seq_len_kv must be a positive int"),
        ({"drop": "page_table_v"}, "needs both page_table_k= and page_table_v="),
        ({"drop": "seq_len_q"}, "paged caches need seq_len_q= and seq_len_kv="),
        ({"implementation": "unified"}, "unified SDPA operation"),
    ],
)
def test_paged_refusals(kw, msg):
    g = Graph()
    q = g.tensor((2, 4, 4, 32), dtype="float16")
    kc, vc = (g.tensor((8, 2, 16, 32), dtype="float16") for _ in range(2))
    args = {"page_table_k": g.tensor((2, 1, 3, 1), dtype="int32"), "page_table_v": g.tensor((2, 1, 3, 1), dtype="int32"),
            "seq_len_q": g.tensor((2, 1, 1, 1), dtype="int32"), "seq_len_kv": g.tensor((2, 1, 1, 1), dtype="int32")}  # fmt: skip
    drop = kw.pop("drop", None)
    if drop:
        args.pop(drop)
    with pytest.raises(GraphError, match=msg):
        g.sdpa_forward(q, kc, vc, **args, **kw)
    with pytest.raises(GraphError, match="max_seq_len_kv is for paged caches"):
        g.sdpa_forward(q, *(g.tensor((2, 4, 16, 32), dtype="float16") for _ in range(2)), max_seq_len_kv=16)


def test_paged_pattern_computes_the_reference():
    """Pages out of order: the gathered caches' attention equals the dense reference on the gathered k, v."""
    gpu = pytest.importorskip("tests.gpu.test_attention_gpu")
    b, h, hk, sq, bs, blocks, nb, d = 2, 4, 2, 4, 16, 3, 8, 32
    g, r, (q, kc, vc, ptk, ptv, lq, lkv) = paged_graph(b, hk, h, sq, bs, blocks, nb, d, causal=True,
                                                       diagonal_alignment="bottom_right")  # fmt: skip
    rng = np.random.default_rng(7)
    qa, ka, va = rng.standard_normal((b, h, sq, d)), rng.standard_normal((nb, hk, bs, d)), rng.standard_normal(
        (nb, hk, bs, d))  # fmt: skip
    table = np.array([[5, 0, 7], [2, 6, 1]]).reshape(b, 1, blocks, 1)
    lens_q, lens_kv = [4, 3], [40, 48]
    vals = {q.uid: qa, kc.uid: ka, vc.uid: va, ptk.uid: table, ptv.uid: table,
            lq.uid: np.array(lens_q).reshape(b, 1, 1, 1), lkv.uid: np.array(lens_kv).reshape(b, 1, 1, 1)}  # fmt: skip
    with np.errstate(invalid="ignore"):
        val = interpret(g, vals)
    kd = np.stack([np.concatenate([ka[table[i, 0, j, 0]] for j in range(blocks)], axis=1) for i in range(b)])
    vd = np.stack([np.concatenate([va[table[i, 0, j, 0]] for j in range(blocks)], axis=1) for i in range(b)])
    keep = gpu.keep_matrix(sq, bs * blocks, b=b, causal=True, align="bottom_right", lens_q=lens_q, lens_kv=lens_kv)
    o_ref, lse_ref, _ = gpu.reference(qa, kd, vd, np.zeros((b, h, sq, d)), scale=1 / math.sqrt(d), keep=keep)
    assert np.allclose(_valid(val[r.o.uid], lens_q), _valid(o_ref, lens_q), rtol=1e-9)
    assert np.allclose(_valid(val[r.stats.uid], lens_q), _valid(lse_ref, lens_q), rtol=1e-9)


def test_l2_paged_forward_and_refusals(fake_fixture, plans_fixture):
    built, runs, _ = plans_fixture
    fake = fake_fixture
    q = _arr(fake, (2, 4, 1, 64))
    kc, vc = _arr(fake, (16, 2, 64, 64)), _arr(fake, (16, 2, 64, 64))
    ptk, ptv = _arr(fake, (2, 4), "int32"), _arr(fake, (2, 4), "int32")
    lq, lkv = _arr(fake, (2,), "int32"), _arr(fake, (2,), "int32")
    kw = dict(page_table_k=ptk, page_table_v=ptv, seq_len_q=lq, seq_len_kv=lkv, enable_gqa=True)
    o, st = ops.attention_forward(q, kc, vc, **kw)
    assert o.shape == (2, 4, 1, 64) and st.shape == (2, 4, 1, 1)
    g = built[-1]
    t = _named(g)
    assert t["page_table_k"].dims == (2, 1, 4, 1) and t["k"].dims == (16, 2, 64, 64)
    loads = [n for n in g.nodes() if n.kind == "paged_cache_load"]
    assert [g._tensors[dict(n.outputs)["y"]].dims for n in loads] == [(2, 2, 64, 256), (2, 2, 256, 64)]
    assert runs[-1]["page_table_k"][1] == ptk.ptr and runs[-1]["k"][1] == kc.ptr
    ops.attention_forward(q, kc, vc, max_seq_len_kv=200, **kw)
    assert [g_.dims for g_ in built[-1].tensors() if g_.name == "k_cache"] == [(2, 2, 64, 200)]
    n = len(built)
    with pytest.raises(ValueError, match="paged caches need seq_len_q= and seq_len_kv="):
        ops.attention_forward(q, kc, vc, page_table_k=ptk, page_table_v=ptv, enable_gqa=True)
    with pytest.raises(ValueError, match="page_table_k has 4 blocks for S_kv = 100"):
        ops.attention_forward(q, kc, vc, max_seq_len_kv=100, **kw)
    with pytest.raises(TypeError, match="page_table_v has dtype int64"):
        ops.attention_forward(q, kc, vc, **{**kw, "page_table_v": _arr(fake, (2, 4), "int64")})
    with pytest.raises(ValueError, match=r"page_table_v must be an int32 device array of shape \(B, blocks\)"):
        ops.attention_forward(q, kc, vc, **{**kw, "page_table_v": _arr(fake, (3, 4), "int32")})
    with pytest.raises(ValueError, match="max_seq_len_kv is for paged caches"):
        ops.attention_forward(q, _arr(fake, (2, 4, 64, 64)), _arr(fake, (2, 4, 64, 64)), max_seq_len_kv=64)
    with pytest.raises(TypeError, match="unexpected keyword argument 'page_table_k'"):  # no paged backward
        ops.attention_backward(q, kc, vc, o, _arr(fake, (2, 4, 1, 64)), st, **kw)
    with pytest.raises(ValueError, match="are for attention_forward"):  # the primitive itself refuses them too
        from cudnnkit.ops._primitive import run

        run(L3.A.SDPA_BACKWARD, {"q": q, "k": kc, "v": vc, "o": o, "do": _arr(fake, (2, 4, 1, 64)), "stats": st,
                                 "page_table_k": ptk, "page_table_v": ptv})  # fmt: skip
    assert len(built) == n


def test_forward_dropout_in_frontend_order():
    g = Graph()
    q, k, v = qkv(g)
    seed, off = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_forward(q, k, v, dropout=0.1, seed=seed, offset=off)
    steps = [n.kind if n.kind != "pointwise" else n.attr("mode") for n in g.nodes()]
    assert steps[-5:] == ["DIV", "rng", "MUL", "MUL", "matmul"]  # softmax, the mask, its scale, P @ v
    assert r.o.dtype == "bfloat16"
