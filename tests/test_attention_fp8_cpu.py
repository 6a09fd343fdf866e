"""fp8 attention on the CPU (issue 17): the graphs :meth:`Graph.sdpa_fp8_forward`/``sdpa_fp8_backward`` build,
checked against the node order of cudnn-frontend's fp8 patterns (written out by hand below from its headers),
lowered (every backend descriptor and the operation graph finalized by cuDNN 9.19 here, without a device),
interpreted in float64 against a reference computed from the definition (the quantization itself, fp8 rounding,
is left to the GPU tier: the interpreter keeps every value exact), and the refusals; the L2 functions with fake
arrays (the graph bound, the caller's arrays bound, refusals before any GPU work)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudnnkit.graph import Graph, GraphError
from cudnnkit.graph.nodes.sdpa_fp8 import BACKWARD_FACTORS, FORWARD_FACTORS
from cudnnkit.ops import attention_fp8 as F

from .test_attention_variants_cpu import _heads, fake_fixture, interpret, plans_fixture  # noqa: F401  (fixtures)
from .test_attention_variants_cpu import _reduce as _sum_to
from .test_l3_attention_cpu import _arr

E4, E5 = "float8_e4m3fn", "float8_e5m2"
B, H, SQ, SKV, D = 2, 4, 32, 48, 128


def kinds(g):
    return [n.kind if n.kind != "pointwise" else n.attr("mode") for n in g.nodes()]


def fwd_graph(b=B, h=H, hk=H, sq=SQ, skv=SKV, d=D, dv=D, dtype=E4, padded=False, numbers=False, mark=True, **kw):
    g = Graph()
    q = g.tensor((b, h, sq, d), dtype=dtype, name="q")
    k = g.tensor((b, hk, skv, d), dtype=dtype, name="k")
    v = g.tensor((b, hk, skv, dv), dtype=dtype, name="v")
    if numbers:
        f = [0.5, 0.25, 0.125, 1 / 448, 448.0, 2.0]
    else:
        f = [g.tensor((1, 1, 1, 1), dtype="float32", name=n) for n in FORWARD_FACTORS]
    if padded:
        kw["seq_len_q"] = g.tensor((b, 1, 1, 1), dtype="int32", name="seq_len_q")
        kw["seq_len_kv"] = g.tensor((b, 1, 1, 1), dtype="int32", name="seq_len_kv")
    r = g.sdpa_fp8_forward(q, k, v, *f, **kw)
    if mark:
        for t in r:
            if t is not None:
                g.mark_output(t)
    return g, r


def bwd_graph(b=B, h=H, hk=H, sq=SQ, skv=SKV, dtype=E4, do_dtype=E5, padded=False, **kw):
    g = Graph()
    q = g.tensor((b, h, sq, D), dtype=dtype, name="q")
    k = g.tensor((b, hk, skv, D), dtype=dtype, name="k")
    v = g.tensor((b, hk, skv, D), dtype=dtype, name="v")
    o = g.tensor((b, h, sq, D), dtype=dtype, name="o")
    do = g.tensor((b, h, sq, D), dtype=do_dtype, name="do")
    st = g.tensor((b, h, sq, 1), dtype="float32", name="stats")
    f = [g.tensor((1, 1, 1, 1), dtype="float32", name=n) for n in BACKWARD_FACTORS]
    if padded:
        kw["seq_len_q"] = g.tensor((b, 1, 1, 1), dtype="int32", name="seq_len_q")
        kw["seq_len_kv"] = g.tensor((b, 1, 1, 1), dtype="int32", name="seq_len_kv")
    r = g.sdpa_fp8_backward(q, k, v, o, do, st, *f, **kw)
    for t in r:
        g.mark_output(t)
    return g, r


# ----------------------------------------------------------------- the patterns, node for node

#: cudnn-frontend's fp8 forward without masks: bmm1, attn scale, descale_q, descale_k, softmax with stats (max,
#: sub, exp, sum, log, add, div), amax_s, scale_s, then matmul_fp8 (matmul, descale_s, descale_v, scale_o, amax_o)
FWD = ["matmul", "MUL", "MUL", "MUL", "reduction", "SUB", "EXP", "reduction", "LOG", "ADD", "DIV", "reduction", "MUL",
       "matmul", "MUL", "MUL", "MUL", "reduction"]  # fmt: skip
CAUSAL = ["GEN_INDEX", "GEN_INDEX", "CMP_GE", "BINARY_SELECT"]
#: cudnn-frontend's SDPAFP8BackwardNode without masks or dropout
BWD = (["MUL", "reduction", "MUL", "MUL"]  # rowsum(do * o) * descale_do * descale_o
       + ["matmul", "MUL", "MUL", "MUL", "SUB", "EXP", "MUL", "reshape"]  # S, - stats, exp, * scale_s, P^T
       + ["matmul", "MUL", "MUL", "MUL", "reduction"]  # dv: matmul_fp8(P^T, dO)
       + ["matmul", "MUL", "MUL", "SUB", "MUL", "MUL", "reduction", "MUL"]  # dP, * scale, amax_dp, * scale_dp
       + ["reshape", "matmul", "MUL", "MUL", "MUL", "reduction"]  # dq: matmul_fp8(dP, K)
       + ["reshape", "matmul", "MUL", "MUL", "MUL", "reduction"])  # dk: matmul_fp8(dP^T, Q)  # fmt: skip


def test_forward_pattern_in_frontend_order():
    g, r = fwd_graph()
    assert kinds(g) == FWD
    g, r = fwd_graph(causal=True)
    assert kinds(g) == FWD[:4] + CAUSAL + FWD[4:]
    red = [n for n in g.nodes() if n.kind == "reduction"]
    assert [n.attr("mode") for n in red] == ["max", "add", "amax", "amax"]
    assert {dict(n.outputs)["y"] for n in red[2:]} == {r.amax_s.uid, r.amax_o.uid}
    assert g._tensors[r.amax_s.uid].dims == (1, 1, 1, 1) and g._tensors[r.amax_s.uid].dtype == "float32"
    mm = [n for n in g.nodes() if n.kind == "matmul"]
    a2 = g._tensors[dict(mm[1].inputs)["a"]]
    assert a2.dtype == E4 and a2.virtual  # the probabilities quantized into q's dtype for P @ v
    assert g._tensors[r.o.uid].dtype == E4
    # amax_o reads the dequantized product, before scale_o
    scale_o = g.nodes()[-2]
    amax_o = g.nodes()[-1]
    assert dict(amax_o.inputs)["x"] == dict(scale_o.inputs)["x"]
    assert dict(scale_o.outputs)["y"] == r.o.uid
    g.lower()


def test_forward_masks_padding_window_dropout_and_gqa_lower():
    g, _ = fwd_graph(causal=True, left_bound=16)
    assert kinds(g).count("BINARY_SELECT") == 2
    g.lower()
    g, _ = fwd_graph(padded=True, causal=True)
    k = kinds(g)
    assert k.count("LOGICAL_AND") == 1 and k.count("BINARY_SELECT") == 2
    mm = [n for n in g.nodes() if n.kind == "matmul"]
    assert {r for r, _ in mm[0].inputs} == {"a", "b", "m_override", "n_override"}
    assert {r for r, _ in mm[1].inputs} == {"a", "b", "m_override", "k_override"}
    g.lower()
    g, _ = fwd_graph(hk=1, dv=64)
    g.lower()
    g2 = Graph()
    q, k, v = (g2.tensor((B, H, SQ if n == "q" else SKV, D), dtype=E5, name=n) for n in "qkv")
    seed, off = (g2.tensor((1, 1, 1, 1), dtype="int64", name=n) for n in ("seed", "offset"))
    f = [g2.tensor((1, 1, 1, 1), dtype="float32", name=n) for n in FORWARD_FACTORS]
    r = g2.sdpa_fp8_forward(q, k, v, *f, dropout=0.1, seed=seed, offset=off, o_dtype=E4)
    for t in r:
        g2.mark_output(t)
    kk = kinds(g2)
    i = kk.index("DIV")
    assert kk[i + 1 : i + 5] == ["rng", "MUL", "MUL", "reduction"]  # dropout before amax_s
    assert g2._tensors[r.o.uid].dtype == E4
    g2.lower()


def test_forward_numbers_are_by_value_constants_and_stats_false_is_scratch():
    g, r = fwd_graph(numbers=True, stats=False)
    assert r.stats is None
    consts = sorted(v for v, _ in g.constants().values())
    assert consts == sorted([1 / math.sqrt(D), 0.5, 0.25, 0.125, 1 / 448, 448.0, 2.0])
    assert [t.name for t in g.scratch()] == ["stats"]
    g.lower()


def test_backward_pattern_in_frontend_order():
    g, r = bwd_graph()
    assert kinds(g) == BWD
    assert [g._tensors[t.uid].dtype for t in r[:3]] == [E5] * 3  # do's dtype
    assert all(g._tensors[t.uid].dims == (1, 1, 1, 1) for t in r[3:])
    assert not g.scratch()  # unlike the half-precision backward: no scratch tensors
    dp8 = [t for t in g.tensors() if t.name == "dp_fp8"][0]
    assert dp8.dtype == E5  # dP quantized into do's dtype
    g.lower()


def test_backward_masks_before_the_statistics_and_gqa():
    g, r = bwd_graph(causal=True, left_bound=8, hk=2)
    k = kinds(g)
    assert k.index("BINARY_SELECT") < k.index("SUB")  # the frontend's fp8 backward: masks, then - stats
    red = [n for n in g.nodes() if n.kind == "reduction"]
    heads = [n for n in red if g._tensors[dict(n.outputs)["y"]].dims[1] == 2 and n.attr("mode") == "add"]
    assert len(heads) == 2  # dv and dk summed over the query heads of each key/value head
    g.lower()
    g, _ = bwd_graph(padded=True, causal=True, grad_dtype=E4)
    assert kinds(g).count("LOGICAL_AND") == 1
    g.lower()


def test_backward_dropout_rng_first():
    g = Graph()
    t = {n: g.tensor((B, H, SQ, D), dtype=E4, name=n) for n in ("q", "k", "v", "o", "do")}
    st = g.tensor((B, H, SQ, 1), dtype="float32", name="stats")
    seed, off = (g.tensor((1, 1, 1, 1), dtype="int64", name=n) for n in ("seed", "offset"))
    f = [g.tensor((1, 1, 1, 1), dtype="float32", name=n) for n in BACKWARD_FACTORS]
    r = g.sdpa_fp8_backward(*t.values(), st, *f, dropout=0.2, seed=seed, offset=off)
    for x in r:
        g.mark_output(x)
    k = kinds(g)
    assert k[0] == "rng" and k.count("rng") == 1
    assert (0.8, "float32") in g.constants().values() and (1.25, "float32") in g.constants().values()
    g.lower()


# ----------------------------------------------------------------- refusals

REFUSED = [
    (dict(dtype="bfloat16"), "q must be fp8"),
    (dict(d=136, dv=136), "multiple of 16"),
    (dict(d=272, dv=272), "up to 256"),
    (dict(hk=3), "multiple of k's 3"),
    (dict(causal=True, diagonal_alignment="bottom_right"), "bottom_right.*Blackwell"),
    (dict(left_bound=4, sq=64, skv=32), "S_q <= S_kv"),
    (dict(o_dtype="bfloat16"), "o_dtype must be one of"),
    (dict(dropout=0.1), "seed= and offset="),
]


@pytest.mark.parametrize("kw, msg", REFUSED)
def test_forward_refusals(kw, msg):
    with pytest.raises(GraphError, match=msg):
        fwd_graph(**kw)


def test_other_refusals():
    g = Graph()
    q = g.tensor((B, H, SQ, D), dtype=E4)
    k = g.tensor((B, H, SKV, D), dtype=E5)
    f = [g.tensor((1, 1, 1, 1), dtype="float32") for _ in FORWARD_FACTORS]
    with pytest.raises(GraphError, match="share one fp8 dtype"):
        g.sdpa_fp8_forward(q, k, k, *f)
    k = g.tensor((B, H, SKV, D), dtype=E4)
    bad = [g.tensor((1, 1, 1, 1), dtype="float16")] + f[1:]
    with pytest.raises(GraphError, match="descale_q must be a float32"):
        g.sdpa_fp8_forward(q, k, k, *bad)
    with pytest.raises(GraphError, match="scale_o must be a one-element"):
        g.sdpa_fp8_forward(q, k, k, *f[:5], g.tensor((1, 1, 1, 2), dtype="float32"))
    with pytest.raises(TypeError, match="scale_s must be"):
        g.sdpa_fp8_forward(q, k, k, *f[:4], None, f[5])
    with pytest.raises(GraphError, match="head dim must be 128 for the fp8 backward"):
        bwd = Graph()
        t = {n: bwd.tensor((B, H, SQ, 64), dtype=E4, name=n) for n in ("q", "k", "v", "o", "do")}
        st = bwd.tensor((B, H, SQ, 1), dtype="float32")
        bwd.sdpa_fp8_backward(*t.values(), st, *[bwd.tensor((1, 1, 1, 1)) for _ in BACKWARD_FACTORS])
    with pytest.raises(GraphError, match="stats must be float32"):
        bwd = Graph()
        t = {n: bwd.tensor((B, H, SQ, D), dtype=E4, name=n) for n in ("q", "k", "v", "o", "do")}
        st = bwd.tensor((B, H, SQ, 1), dtype="float16")
        bwd.sdpa_fp8_backward(*t.values(), st, *[bwd.tensor((1, 1, 1, 1)) for _ in BACKWARD_FACTORS])


# ----------------------------------------------------------------- the patterns compute the definition


def reference(q, k, v, scale, causal=False, left=None, lens=None):
    """Attention in float64 from its definition: ``(o, stats, P, keep)`` (grouped heads broadcast)."""
    h = q.shape[1]
    k, v = _heads(k, h), _heads(v, h)
    s = scale * q @ np.swapaxes(k, 2, 3)
    row = np.arange(s.shape[2])[:, None]
    col = np.arange(s.shape[3])[None, :]
    keep = np.ones(s.shape, bool)
    if causal:
        keep &= col <= row
    if left is not None:
        keep &= col > row - left
    if lens is not None:
        for bi, (lq, lkv) in enumerate(zip(*lens)):
            keep[bi, :, lq:, :] = False
            keep[bi, :, :, lkv:] = False
    s = np.where(keep, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    p = e / e.sum(-1, keepdims=True)
    return p @ v, mx + np.log(e.sum(-1, keepdims=True)), p, keep


def _named(g):
    return {t.name: t.uid for t in g.tensors() if not t.virtual and not t.by_value}


FACTORS = {"descale_q": 0.5, "descale_k": 0.25, "descale_v": 2.0, "descale_s": 1 / 448, "scale_s": 448.0,
           "scale_o": 8.0, "descale_o": 0.125, "descale_do": 0.75, "descale_dp": 1 / 64, "scale_dp": 64.0,
           "scale_dq": 4.0, "scale_dk": 16.0, "scale_dv": 2.0}  # fmt: skip


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # fully masked rows (padding): NaN, not compared
@pytest.mark.parametrize(
    "case",
    [dict(), dict(causal=True), dict(causal=True, left_bound=10), dict(hk=2, causal=True), dict(hk=1),
     dict(padded=True, causal=True)],
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "plain",
)  # fmt: skip
def test_patterns_compute_the_dequantized_reference(case):
    """Forward then backward of the patterns, interpreted, against the float64 definition on the real values
    (``x_real = descale_x * x``): ``o = scale_o * o_real``, the amax values the reference's largest magnitudes,
    the gradients ``scale_dq * dq_real`` etc."""
    rng = np.random.default_rng(7)
    hk = case.get("hk", H)
    padded = case.get("padded", False)
    sq = skv = 24
    lens = (np.array([24, 13]), np.array([20, 24])) if padded else None
    opts = {k: v for k, v in case.items() if k in ("causal", "left_bound")}
    q8, k8, v8 = (rng.standard_normal(s) for s in ((B, H, sq, D), (B, hk, skv, D), (B, hk, skv, D)))
    scale = 0.09
    fg, fr = fwd_graph(hk=hk, sq=sq, skv=skv, padded=padded, scale=scale, **opts)
    ids = _named(fg)
    vals = {ids["q"]: q8, ids["k"]: k8, ids["v"]: v8, **{ids[n]: np.full((1, 1, 1, 1), FACTORS[n])
                                                         for n in FORWARD_FACTORS}}  # fmt: skip
    if padded:
        vals[ids["seq_len_q"]] = lens[0].reshape(B, 1, 1, 1)
        vals[ids["seq_len_kv"]] = lens[1].reshape(B, 1, 1, 1)
    got = interpret(fg, vals)
    qr, kr, vr = q8 * FACTORS["descale_q"], k8 * FACTORS["descale_k"], v8 * FACTORS["descale_v"]
    o, st, p, keep = reference(qr, kr, vr, scale, opts.get("causal", False), opts.get("left_bound"), lens)
    rows = np.ones(o.shape[:3], bool) if not padded else keep.any(-1)
    np.testing.assert_allclose(got[fr.o.uid][rows], FACTORS["scale_o"] * o[rows], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[fr.stats.uid][rows], st[rows], rtol=1e-10)
    if padded:
        return  # fully masked rows make NaN amax values (in the reference too); the forward rows are checked
    np.testing.assert_allclose(got[fr.amax_s.uid].item(), p.max(), rtol=1e-12)
    np.testing.assert_allclose(got[fr.amax_o.uid].item(), np.abs(o).max(), rtol=1e-10)
    # the backward on the forward's (quantized-domain) o and stats
    do8 = rng.standard_normal(o.shape)
    bg, br = bwd_graph(hk=hk, sq=sq, skv=skv, scale=scale, **opts)
    ids = _named(bg)
    o8 = o / FACTORS["descale_o"]
    vals = {ids["q"]: q8, ids["k"]: k8, ids["v"]: v8, ids["o"]: o8, ids["do"]: do8, ids["stats"]: st,
            **{ids[n]: np.full((1, 1, 1, 1), FACTORS[n]) for n in BACKWARD_FACTORS}}  # fmt: skip
    got = interpret(bg, vals)
    dor = do8 * FACTORS["descale_do"]
    kh, vh = _heads(kr, H), _heads(vr, H)
    dv = p.swapaxes(2, 3) @ dor
    dp = dor @ vh.swapaxes(2, 3)
    ds = p * (dp - (dor * o).sum(-1, keepdims=True)) * scale
    dq, dk = ds @ kh, ds.swapaxes(2, 3) @ qr
    dk, dv = _sum_to(dk, (B, hk, skv, D)), _sum_to(dv, (B, hk, skv, D))
    for t, want, f in ((br.dq, dq, "scale_dq"), (br.dk, dk, "scale_dk"), (br.dv, dv, "scale_dv")):
        np.testing.assert_allclose(got[t.uid], FACTORS[f] * want, rtol=1e-9, atol=1e-10)
    for t, want in ((br.amax_dq, dq), (br.amax_dk, dk), (br.amax_dv, dv), (br.amax_dp, ds)):
        np.testing.assert_allclose(got[t.uid].item(), np.abs(want).max(), rtol=1e-9)


# ----------------------------------------------------------------- the L2 functions

QS = (2, 4, 64, 128)


def _f(b, names):
    return {n: _arr(b, (1,), "float32") for n in names}


def test_l2_forward_and_backward_bind_the_callers_arrays(fake_fixture, plans_fixture):  # noqa: F811
    built, runs, _ = plans_fixture
    b = fake_fixture
    q, k, v = _arr(b, QS, E4), _arr(b, (2, 2, 96, 128), E4), _arr(b, (2, 2, 96, 128), E4)
    fs = _f(b, FORWARD_FACTORS)
    o, st, a_s, a_o = F.attention_fp8_forward(q, k, v, is_causal=True, enable_gqa=True, **fs)
    assert (o.shape, o.dtype, st.shape, st.dtype) == (QS, E4, (2, 4, 64, 1), "float32")
    assert (a_s.shape, a_s.dtype, a_o.shape) == ((1,), "float32", (1,))
    (g,) = built
    assert "BINARY_SELECT" in kinds(g) and kinds(g).count("matmul") == 2
    seen = runs[-1]
    for n, arr in (("q", q), ("k", k), ("v", v), *fs.items()):
        assert seen[n][1] == arr.ptr
    # new factor arrays (other values): the same plan
    F.attention_fp8_forward(q, k, v, is_causal=True, enable_gqa=True, **_f(b, FORWARD_FACTORS))
    assert len(built) == 1
    o2, *_ = F.attention_fp8_forward(q, k, v, is_causal=True, enable_gqa=True, o_dtype=E5, **fs)
    assert o2.dtype == E5 and len(built) == 2
    do = _arr(b, QS, E5)
    got = F.attention_fp8_backward(q, k, v, o, do, st, is_causal=True, enable_gqa=True, **_f(b, BACKWARD_FACTORS))
    dq, dk, dv, *amax = got
    assert (dq.shape, dk.shape, dv.shape) == (QS, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == E5 and all(a.shape == (1,) for a in amax)
    assert not built[-1].scratch()
    dq, *_ = F.attention_fp8_backward(q, k, v, o, do, st, is_causal=True, enable_gqa=True, grad_dtype=E4,
                                      **_f(b, BACKWARD_FACTORS))  # fmt: skip
    assert dq.dtype == E4


def test_l2_padding_and_dropout_arrays_bound(fake_fixture, plans_fixture):  # noqa: F811
    built, runs, _ = plans_fixture
    b = fake_fixture
    q = _arr(b, QS, E4)
    lq, lkv = _arr(b, (2,), "int32"), _arr(b, (2,), "int32")
    seed, off = _arr(b, (1,), "int64"), _arr(b, (1,), "int64")
    F.attention_fp8_forward(q, q, q, seq_len_q=lq, seq_len_kv=lkv, dropout_p=0.1, seed=seed, offset=off, left_bound=8,
                            **_f(b, FORWARD_FACTORS))  # fmt: skip
    g = built[-1]
    assert "rng" in kinds(g) and "LOGICAL_AND" in kinds(g)
    for n, arr in (("seq_len_q", lq), ("seq_len_kv", lkv), ("seed", seed), ("offset", off)):
        assert runs[-1][n][1] == arr.ptr


def _l2(b, **kw):
    shapes = kw.pop("shapes", (QS, QS, QS))
    dt = kw.pop("dtypes", (E4, E4, E4))
    q, k, v = (_arr(b, s, d) for s, d in zip(shapes, dt))
    fs = _f(b, FORWARD_FACTORS)
    for n, (shape, dtype) in kw.pop("arrays", {}).items():
        fs[n] = _arr(b, shape, dtype)
    return F.attention_fp8_forward(q, k, v, **fs, **kw)


L2_REFUSED = [
    (dict(dtypes=("bfloat16",) * 3), TypeError, "q has dtype bfloat16"),
    (dict(dtypes=(E4, E5, E4)), TypeError, "k must have q's dtype"),
    (dict(shapes=(QS, (2, 2, 64, 128), (2, 2, 64, 128))), ValueError, "enable_gqa=True"),
    (dict(shapes=((2, 4, 64, 72),) * 3), ValueError, "multiple of 16"),
    (dict(arrays={"scale_o": ((2,), "float32")}), ValueError, "scale_o must be a one-element float32"),
    (dict(arrays={"descale_q": ((1,), "float16")}), TypeError, "descale_q has dtype float16"),
    (dict(is_causal=True, diagonal_alignment="bottom_right"), TypeError, "diagonal_alignment"),
    (dict(dropout_p=0.1), ValueError, "dropout_p > 0 needs seed= and offset="),
    (dict(dropout_p=1.0), ValueError, r"dropout_p must be within \[0, 1\)"),
    (dict(is_causal="yes"), TypeError, "is_causal must be a bool"),
    (dict(o_dtype="bfloat16"), ValueError, "o_dtype must be one of"),
    (dict(arrays={"seq_len_q": ((2,), "int32")}), ValueError, "needs both seq_len_q= and seq_len_kv="),
]


@pytest.mark.parametrize("kw, exc, msg", L2_REFUSED)
def test_l2_refusals_before_any_gpu_work(fake_fixture, plans_fixture, kw, exc, msg):  # noqa: F811
    built, runs, _ = plans_fixture
    with pytest.raises(exc, match=msg):
        _l2(fake_fixture, **kw)
    assert not built and not runs


def test_l2_missing_factor_and_backward_refusals(fake_fixture, plans_fixture):  # noqa: F811
    built, runs, executed = plans_fixture
    b = fake_fixture
    q = _arr(b, QS, E4)
    fs = _f(b, FORWARD_FACTORS)
    del fs["scale_s"]
    with pytest.raises(TypeError, match="scale_s"):
        F.attention_fp8_forward(q, q, q, **fs)
    small = _arr(b, (2, 4, 64, 64), E4)
    st = _arr(b, (2, 4, 64, 1), "float32")
    with pytest.raises(ValueError, match="must be 128 for the fp8 backward"):
        F.attention_fp8_backward(small, small, small, small, small, st, **_f(b, BACKWARD_FACTORS))
    with pytest.raises(ValueError, match=r"stats must have shape \(2, 4, 64, 1\)"):
        F.attention_fp8_backward(q, q, q, q, q, _arr(b, (2, 4, 64), "float32"), **_f(b, BACKWARD_FACTORS))
    with pytest.raises(ValueError, match="grad_dtype must be one of"):
        F.attention_fp8_backward(q, q, q, q, q, st, grad_dtype="float16", **_f(b, BACKWARD_FACTORS))
    assert not built and not runs and not executed
