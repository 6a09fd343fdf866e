"""Ragged (packed, THD) attention batches on the CPU (issue 17): :meth:`Graph.set_ragged_offset` and the SDPA
composites lowered with ``CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC`` on the packed tensors (q, k, v, o; do and the
gradients in the backward; the backward's view of k), the plan spec's bindings of packed arrays, and the
refusals (no padding mask, bad offsets), raised before any GPU work.

cuDNN 9.19 crashes reading ``RAGGED_OFFSET_DESC`` back from a finalized tensor descriptor (measured here), so the
lowering is checked by recording every ``BackendDescriptor.set``."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.graph import Graph, GraphError
from cudnnkit.graph.plan.spec import PlanSpec
from cudnnkit.lib.backend import BackendDescriptor

B, H, HK, S, D, DV = 3, 4, 2, 64, 64, 32
RAGGED = "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC"


def packed(g, h, d, name, s=S):
    """A packed (T, h, d) array described (B, h, S_max, d): token stride h * d, head stride d."""
    return g.tensor((B, h, s, d), (s * h * d, d, h * d, 1), "bfloat16", name=name)


def offsets(g, name, dtype="int64"):
    return g.tensor((B + 1, 1, 1, 1), (1, 1, 1, 1), dtype, name=name)


def lengths(g):
    return (g.tensor((B, 1, 1, 1), None, "int32", name="seq_len_q"),
            g.tensor((B, 1, 1, 1), None, "int32", name="seq_len_kv"))  # fmt: skip


#: id(descriptor) -> {attribute name: value} of every BackendDescriptor.set while ``recorded`` is on
_SET: dict[int, dict] = {}


@pytest.fixture
def recorded(monkeypatch):
    """Every attribute set on a backend descriptor, by the descriptor's id (the Lowered keeps them alive)."""
    real = BackendDescriptor.set

    def rec(self, name, value):
        _SET.setdefault(id(self), {})[name] = value
        return real(self, name, value)

    _SET.clear()
    monkeypatch.setattr(BackendDescriptor, "set", rec)
    yield
    _SET.clear()


def ragged_of(low, uid):
    return _SET.get(id(low.tensors[uid]), {}).get(RAGGED)


def forward_graph(o_ragged=True, hk=HK):
    g = Graph()
    q, k, v = packed(g, H, D, "q"), packed(g, hk, D, "k"), packed(g, hk, DV, "v")
    rq, rk, rv = (offsets(g, n) for n in ("rq", "rk", "rv"))
    ro = offsets(g, "ro") if o_ragged else None  # (an offsets tensor nothing uses is dangling)
    for t, r in ((q, rq), (k, rk), (v, rv)):
        assert g.set_ragged_offset(t, r) is t
    sq, skv = lengths(g)
    o, st = g.sdpa_forward(q, k, v, seq_len_q=sq, seq_len_kv=skv, causal=True,
                           o_strides=(S * H * DV, DV, H * DV, 1), o_ragged_offset=ro)  # fmt: skip
    o = g.mark_output(o)
    st = g.mark_output(st)
    return g, dict(q=q, k=k, v=v, o=o, stats=st, rq=rq, rk=rk, rv=rv, ro=ro)


def test_forward_lowers_ragged_offsets_on_q_k_v_o(recorded):
    g, t = forward_graph()
    low = g.lower()  # the operation graph finalized by cuDNN 9.19 with the ragged tensors
    for role, off in (("q", "rq"), ("k", "rk"), ("v", "rv"), ("o", "ro")):
        assert ragged_of(low, t[role].uid) is low.tensors[t[off].uid], role
    assert ragged_of(low, t["stats"].uid) is None  # the statistics stay padded (B, H, S_max, 1)
    off = low.tensors[t["rq"].uid]
    assert off.get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [B + 1, 1, 1, 1]
    assert g.ragged_offsets() == {t[r].uid: t[o].uid for r, o in (("q", "rq"), ("k", "rk"), ("v", "rv"), ("o", "ro"))}
    # k is described transposed (B, H_kv, D, S) for q @ k^T and keeps its offsets
    assert low.tensors[t["k"].uid].get("CUDNN_ATTR_TENSOR_DIMENSIONS") == [B, HK, D, S]


def test_forward_padded_output_from_ragged_inputs(recorded):
    g, t = forward_graph(o_ragged=False)
    low = g.lower()
    assert ragged_of(low, t["o"].uid) is None and ragged_of(low, t["q"].uid) is low.tensors[t["rq"].uid]


def test_ragged_offsets_are_part_of_the_key_and_not_dangling():
    g1, _ = forward_graph(o_ragged=True)
    g2, _ = forward_graph(o_ragged=False)
    g1.validate()
    assert g1.key() != g2.key()
    g3, _ = forward_graph(o_ragged=True)
    assert g1.key() == g3.key()


@pytest.mark.parametrize("hk", [H, HK])
def test_backward_lowers_ragged_offsets_on_every_packed_tensor(recorded, hk):
    g = Graph()
    q, k, v = packed(g, H, D, "q"), packed(g, hk, D, "k"), packed(g, hk, DV, "v")
    o, do = packed(g, H, DV, "o"), packed(g, H, DV, "do")
    st = g.tensor((B, H, S, 1), None, "float32", name="stats")
    rq, rk, rv, ro = (offsets(g, n) for n in ("rq", "rk", "rv", "ro"))
    for x, r in ((q, rq), (k, rk), (v, rv), (o, ro), (do, ro)):
        g.set_ragged_offset(x, r)
    sq, skv = lengths(g)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, do, st, seq_len_q=sq, seq_len_kv=skv, causal=True, left_bound=16,
                                 dq_ragged_offset=rq, dk_ragged_offset=rk, dv_ragged_offset=rv)  # fmt: skip
    dq, dk, dv = (g.mark_output(x) for x in (dq, dk, dv))
    low = g.lower()
    for x, r in ((q, rq), (k, rk), (v, rv), (o, ro), (do, ro), (dq, rq), (dk, rk), (dv, rv)):
        assert ragged_of(low, x.uid) is low.tensors[r.uid], x.name
    # the reshape of k that dq = dS @ k reads is packed like k (cudnn-frontend's reshape_k)
    (view,) = [n for n in g.nodes() if n.kind == "reshape" and dict(n.inputs)["x"] == k.uid]
    kv = dict(view.outputs)["y"]
    assert g.ragged_offsets()[kv] == rk.uid and ragged_of(low, kv) is low.tensors[rk.uid]
    # the scratch tensors (row sums, dq accumulator) stay padded
    for t in g.scratch():
        assert ragged_of(low, t.uid) is None and t.dims[:3] == (B, H, S)


def test_int32_offsets_lower_too(recorded):
    g = Graph()
    q, k, v = packed(g, H, D, "q"), packed(g, H, D, "k"), packed(g, H, D, "v")
    r = offsets(g, "r", "int32")
    for x in (q, k, v):
        g.set_ragged_offset(x, r)
    sq, skv = lengths(g)
    o, st = g.sdpa_forward(q, k, v, seq_len_q=sq, seq_len_kv=skv, o_ragged_offset=r)
    g.mark_output(o), g.mark_output(st)
    low = g.lower()
    assert ragged_of(low, q.uid) is low.tensors[r.uid]


def test_refusals():
    g = Graph()
    q, k, v = packed(g, H, D, "q"), packed(g, H, D, "k"), packed(g, H, D, "v")
    r = offsets(g, "r")
    with pytest.raises(GraphError, match=r"dims \(4, 1, 1, 1\)"):
        g.set_ragged_offset(q, g.tensor((B, 1, 1, 1), None, "int64"))
    with pytest.raises(GraphError, match="int32 or int64"):
        g.set_ragged_offset(q, g.tensor((B + 1, 1, 1, 1), None, "float32"))
    with pytest.raises(GraphError, match="non-virtual"):
        g.set_ragged_offset(q, g.tensor((B + 1, 1, 1, 1), None, "int64", virtual=True))
    with pytest.raises(GraphError, match="by-value"):
        g.set_ragged_offset(g.scalar(1.0), g.tensor((2, 1, 1, 1), None, "int64"))
    g.set_ragged_offset(q, r)
    g.set_ragged_offset(q, r)  # the same again: fine
    with pytest.raises(GraphError, match="already has ragged offsets"):
        g.set_ragged_offset(q, offsets(g, "r2"))
    with pytest.raises(GraphError, match="ragged .packed. q need seq_len_q= and seq_len_kv="):
        g.sdpa_forward(q, k, v)
    g2 = Graph()
    q2, k2, v2 = packed(g2, H, D, "q"), packed(g2, H, D, "k"), packed(g2, H, D, "v")
    with pytest.raises(GraphError, match="o_ragged_offset .a packed o. needs seq_len_q="):
        g2.sdpa_forward(q2, k2, v2, o_ragged_offset=offsets(g2, "r"))
    with pytest.raises(GraphError, match="dq_ragged_offset .a packed dq. needs seq_len_q="):
        o2, do2 = packed(g2, H, D, "o"), packed(g2, H, D, "do")
        st2 = g2.tensor((B, H, S, 1), None, "float32")
        g2.sdpa_backward(q2, k2, v2, o2, do2, st2, dq_ragged_offset=offsets(g2, "r3"))
    g3 = Graph()
    q3, k3, v3, o3, do3 = (packed(g3, H, D, n) for n in ("q", "k", "v", "o", "do"))
    g3.set_ragged_offset(do3, offsets(g3, "r"))
    with pytest.raises(GraphError, match="ragged .packed. do need seq_len_q="):
        g3.sdpa_backward(q3, k3, v3, o3, do3, g3.tensor((B, H, S, 1), None, "float32"))


def test_paged_caches_cannot_be_ragged():
    g = Graph()
    q = g.tensor((B, H, 1, D), None, "bfloat16", name="q")
    kc = g.tensor((16, H, 8, D), None, "bfloat16", name="k")
    vc = g.tensor((16, H, 8, D), None, "bfloat16", name="v")
    g.set_ragged_offset(kc, g.tensor((17, 1, 1, 1), None, "int64"))
    pt = [g.tensor((B, 1, 4, 1), None, "int32", name=n) for n in ("ptk", "ptv")]
    sq, skv = lengths(g)
    with pytest.raises(GraphError, match="k is a paged cache .page_table_k=.: it cannot also be ragged"):
        g.sdpa_forward(q, kc, vc, seq_len_q=sq, seq_len_kv=skv, page_table_k=pt[0], page_table_v=pt[1])


def test_plan_spec_binds_packed_arrays_by_dtype_and_device():
    from .fuzz.materialize import FakeBackend
    from .fuzz.model import A

    g, t = forward_graph()
    spec = PlanSpec.of(g, 0)
    assert {t[n].uid for n in ("q", "k", "v", "o")} <= spec.ragged
    assert spec.nbytes[t["q"].uid] == 2  # a raw pointer is checked for one element: the extent is on the device
    assert spec.nbytes[t["stats"].uid] == B * H * S * 4
    back = FakeBackend()
    with back.installed():
        T = 100

        def arr(shape, dtype="bfloat16"):
            return back.array(A(tuple(shape), dtype), None, "fakeA", None)

        b = {t["q"]: arr((T, H, D)), t["k"]: arr((T, HK, D)), t["v"]: arr((T, HK, DV)), t["o"]: arr((T, H, DV)),
             t["stats"]: arr((B, H, S, 1), "float32")}  # fmt: skip
        for n in ("rq", "rk", "rv", "ro"):
            b[t[n]] = arr((B + 1, 1, 1, 1), "int64")
        for n in ("seq_len_q", "seq_len_kv"):
            (x,) = [x for x in g.tensors() if x.name == n]
            b[x] = arr((B, 1, 1, 1), "int32")
        r = spec.resolve(b)
        assert len(r.ptrs) == len(spec.uids)
        b[t["q"]] = arr((T, H, D), "float16")
        with pytest.raises(Exception, match="dtype float16, the plan expects bfloat16"):
            spec.resolve(b)
        b[t["q"]] = arr((T, H, D))
        b[t["stats"]] = arr((B, H, S + 1, 1), "float32")  # a padded tensor keeps its shape check
        with pytest.raises(Exception, match="shape"):
            spec.resolve(b)
    again = PlanSpec.from_dict(spec.to_dict(), 0)
    assert again.ragged == spec.ragged and again.nbytes == spec.nbytes


# ----------------------------------------------------------------- the L2 op: cu_seqlens_q/cu_seqlens_kv

from cudnnkit import ops  # noqa: E402
from cudnnkit.ops import attention as A  # noqa: E402

from . import test_attention_variants_cpu as V  # noqa: E402
from .fuzz.materialize import FakeAdapter, FakeArray  # noqa: E402
from .fuzz.model import A as Arg  # noqa: E402
from .test_l3_attention_cpu import _arr, _kinds  # noqa: E402

_named = V._named
fake_fixture = V.fake_fixture  # the L2 tests' fake arrays and recorded plans (test_attention_variants_cpu's)
plans_fixture = V.plans_fixture

CU_Q, CU_KV = [0, 1, 9, 12], [0, 5, 6, 16]  # lengths 1, 8, 3 and 5, 1, 10: 1 and the maximum on each side
TQ, TKV = 12, 16


def _packed_call(fake, hq=4, hk=2, d=64, dv=32):
    return (_arr(fake, (TQ, hq, d)), _arr(fake, (TKV, hk, d)), _arr(fake, (TKV, hk, dv)))


def test_l2_forward_packed_graph(fake_fixture, plans_fixture):
    built, runs, _ = plans_fixture
    q, k, v = _packed_call(fake_fixture)
    o, st = ops.attention_forward(q, k, v, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV, is_causal=True,
                                  diagonal_alignment="bottom_right", enable_gqa=True)  # fmt: skip
    assert ops.last_path() == ("sdpa_forward", "graph")
    assert o.shape == (TQ, 4, 32) and o.dtype == "bfloat16" and st.shape == (3, 4, 8, 1) and st.dtype == "float32"
    (g,) = built
    t = _named(g)
    # the packed arrays described (B, H, S_max, D) with the token stride on S, each with its offsets
    assert (t["q"].dims, t["q"].strides) == ((3, 4, 8, 64), (8 * 256, 64, 256, 1))
    assert (t["k"].dims, t["k"].strides) == ((3, 2, 10, 64), (10 * 128, 64, 128, 1))
    assert (t["v"].dims, t["v"].strides) == ((3, 2, 10, 32), (10 * 64, 32, 64, 1))
    assert (t["o"].dims, t["o"].strides) == ((3, 4, 8, 32), (8 * 128, 32, 128, 1))
    assert t["stats"].dims == (3, 4, 8, 1) and not g.is_ragged(t["stats"])
    rag = g.ragged_offsets()
    for n in ("q", "k", "v", "o"):
        off = g._tensors[rag[t[n].uid]]
        assert off.name == f"ragged_{n}" and (off.dims, off.dtype) == ((4, 1, 1, 1), "int64")
    assert t["seq_len_q"].dims == (3, 1, 1, 1)  # the padding mask cuDNN needs with ragged offsets
    assert _kinds(g).count("CMP_LT") == 2
    seen = runs[-1]
    assert seen["q"][1] == q.ptr and seen["out"][1] == o.ptr
    g.lower()  # cuDNN 9.19 finalizes the operation graph with the ragged tensors
    # other lengths with the same maxima and token counts: the same plan; another maximum: another graph
    ops.attention_forward(q, k, v, cu_seqlens_q=[0, 8, 9, 12], cu_seqlens_kv=[0, 10, 11, 16], is_causal=True,
                          diagonal_alignment="bottom_right", enable_gqa=True)  # fmt: skip
    assert len(built) == 1
    ops.attention_forward(q, k, v, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV, max_seqlen_q=16, max_seqlen_kv=16,
                          is_causal=True, diagonal_alignment="bottom_right", enable_gqa=True)  # fmt: skip
    assert len(built) == 2 and _named(built[-1])["q"].dims == (3, 4, 16, 64)


def test_l2_backward_packed_graph(fake_fixture, plans_fixture):
    built, _, executed = plans_fixture
    fake = fake_fixture
    q, k, v = _packed_call(fake, hk=4, dv=64)
    o, do = _arr(fake, (TQ, 4, 64)), _arr(fake, (TQ, 4, 64))
    st = _arr(fake, (3, 4, 8, 1), "float32")
    dq, dk, dv = ops.attention_backward(q, k, v, o, do, st, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV, is_causal=True)
    assert ops.last_path() == ("sdpa_backward", "graph")
    assert dq.shape == (TQ, 4, 64) and dk.shape == dv.shape == (TKV, 4, 64)
    g, bindings, _ = executed[-1]
    t = _named(g)
    for n, x in (("dq", dq), ("dk", dk), ("dv", dv)):  # the gradients, bound to the arrays returned
        (t[n],) = [g._tensors[u] for u, p in bindings.items() if p == x.ptr]
    rag = g.ragged_offsets()
    for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv"):
        assert g._tensors[rag[t[n].uid]].name == f"ragged_{n}", n
    assert (t["dq"].dims, t["dq"].strides) == ((3, 4, 8, 64), (8 * 256, 64, 256, 1))
    assert (t["dk"].dims, t["dk"].strides) == ((3, 4, 10, 64), (10 * 256, 64, 256, 1))
    for s in g.scratch():  # row sums and the dq accumulator stay padded (B, H, S_max, .)
        assert s.dims[:3] == (3, 4, 8)
    g.lower()
    with pytest.raises(ValueError, match="stats must have shape"):
        ops.attention_backward(q, k, v, o, do, _arr(fake, (3, 4, 9, 1), "float32"), cu_seqlens_q=CU_Q,
                               cu_seqlens_kv=CU_KV)  # fmt: skip


def test_l2_ragged_offsets_are_element_offsets_per_token_stride(fake_fixture):
    """The offsets cuDNN reads are ``cu_seqlens`` times each array's token stride (elements), the lengths their
    differences; arrays of one side and one token stride share one upload."""
    fake = fake_fixture
    qkv = _arr(fake, (TQ, 3, 4, 64))  # a packed qkv: q, k, v views of token stride 3 * 4 * 64
    from cudnnkit.runtime import as_view

    base = as_view(qkv, "qkv")

    def part(i):
        return FakeArray((TQ, 4, 64), "bfloat16", (768, 64, 1), base.ptr + 2 * 256 * i, "fakeA")

    arrays = {"q": part(0), "k": part(1), "v": part(2)}
    got = A._ragged_arrays(arrays, CU_Q, CU_Q, None, None, None, {"o": (256, 64, 1)})
    assert got == (3, 8, 8)
    host = {n: np.asarray(arrays[f"ragged_{n}"].host).tolist() for n in ("q", "k", "v", "o")}
    assert host["q"] == host["k"] == host["v"] == [c * 768 for c in CU_Q]
    assert host["o"] == [c * 256 for c in CU_Q]
    assert arrays["ragged_k"] is arrays["ragged_v"]  # one side, one token stride: one upload
    assert arrays["seq_len_q"].dtype == "int32" and np.asarray(arrays["seq_len_q"].host).tolist() == [1, 8, 3]
    arrays = {"q": part(0), "k": _arr(fake, (TKV, 2, 64)), "v": _arr(fake, (TKV, 2, 64))}
    A._ragged_arrays(arrays, np.array(CU_Q), np.array(CU_KV, np.int32), 8, 12, None, {})
    assert np.asarray(arrays["ragged_k"].host).tolist() == [c * 128 for c in CU_KV]
    assert np.asarray(arrays["seq_len_kv"].host).tolist() == [5, 1, 10]
    # a device cu_seqlens is read back through its library
    dev = fake.array(Arg((4,), "int32"), np.array(CU_KV), "fakeA", None)
    arrays = {"q": part(0), "k": _arr(fake, (TKV, 2, 64)), "v": _arr(fake, (TKV, 2, 64))}
    A._ragged_arrays(arrays, CU_Q, dev, None, None, None, {})
    assert np.asarray(arrays["ragged_v"].host).tolist() == [c * 128 for c in CU_KV]


def _ragged_l2(fake, fwd=True, qs=(TQ, 4, 64), **kw):
    q, k, v = _arr(fake, qs), _arr(fake, (TKV, 4, 64)), _arr(fake, (TKV, 4, 64))
    kw.setdefault("cu_seqlens_q", CU_Q)
    kw.setdefault("cu_seqlens_kv", CU_KV)
    for name, (shape, dtype) in kw.pop("arrays", {}).items():
        kw[name] = _arr(fake, shape, dtype)
    if fwd:
        return ops.attention_forward(q, k, v, **kw)
    o, do = _arr(fake, (TQ, 4, 64)), _arr(fake, (TQ, 4, 64))
    return ops.attention_backward(q, k, v, o, do, _arr(fake, (3, 4, 8, 1), "float32"), **kw)


RAGGED_REFUSED = [
    ({"cu_seqlens_kv": None}, ValueError, "needs both cu_seqlens_q= and cu_seqlens_kv="),
    ({"cu_seqlens_q": [0, 1, 1, 12]}, ValueError, "cu_seqlens_q must start at 0 and grow by at least 1"),
    ({"cu_seqlens_q": [1, 2, 9, 12]}, ValueError, "cu_seqlens_q must start at 0"),
    ({"cu_seqlens_kv": [0, 5, 6, 17]}, ValueError, "cu_seqlens_kv ends at 17 tokens but k has T = 16"),
    ({"cu_seqlens_q": [0, 12]}, ValueError, "cu_seqlens_q and cu_seqlens_kv must have the same B . 1 values"),
    ({"cu_seqlens_q": [0]}, ValueError, "cu_seqlens_q must have B . 1 >= 2 values"),
    ({"cu_seqlens_q": [[0, 1]]}, ValueError, "cu_seqlens_q must be a 1-d integer sequence"),
    ({"cu_seqlens_q": [0.0, 1.0, 9.0, 12.0]}, ValueError, "cu_seqlens_q must be a 1-d integer sequence"),
    ({"arrays": {"cu_seqlens_kv": ((4,), "float32")}}, ValueError, "cu_seqlens_kv must be a 1-d int32 or int64"),
    ({"max_seqlen_q": 7}, ValueError, r"max_seqlen_q must be an int >= the longest sequence of cu_seqlens_q \(8\)"),
    ({"max_seqlen_kv": 9.5}, ValueError, "max_seqlen_kv must be an int"),
    ({"qs": (3, 4, 4, 64)}, ValueError, r"q must be 3-d \(T, H, D\) \(packed\)"),
    ({"arrays": {"seq_len_q": ((3,), "int32"), "seq_len_kv": ((3,), "int32")}}, ValueError,
     "seq_len_q: cu_seqlens_q/cu_seqlens_kv give the lengths"),
    ({"cu_seqlens_q": None, "cu_seqlens_kv": None, "max_seqlen_q": 8}, ValueError,
     "max_seqlen_q/max_seqlen_kv are for packed batches"),
    ({"is_causal": True, "left_bound": 0}, ValueError, "left_bound must be an int >= 1"),
]  # fmt: skip


@pytest.mark.parametrize("fwd", [True, False], ids=["forward", "backward"])
@pytest.mark.parametrize("kw, exc, msg", RAGGED_REFUSED)
def test_l2_ragged_refusals_before_any_gpu_work(fake_fixture, plans_fixture, fwd, kw, exc, msg, monkeypatch):
    built, runs, executed = plans_fixture
    uploads = []
    real = FakeAdapter.from_numpy
    monkeypatch.setattr(FakeAdapter, "from_numpy", lambda *a, **k: uploads.append(a) or real(*a, **k))
    with pytest.raises(exc, match=msg):
        _ragged_l2(fake_fixture, fwd, **dict(kw))
    assert not built and not runs and not executed
    if "left_bound" not in kw:  # (refused by the primitive's checks after the upload of the offsets)
        assert not uploads


def test_l2_ragged_refuses_a_strided_head_dim_and_page_tables(fake_fixture, plans_fixture):
    built, runs, _ = plans_fixture
    fake = fake_fixture
    from cudnnkit.runtime import as_view

    q, k, v = _packed_call(fake, hk=4, dv=64)
    base = as_view(q, "q")
    q_t = FakeArray((TQ, 4, 64), "bfloat16", (256, 1, 4), base.ptr, "fakeA")
    with pytest.raises(ValueError, match="q .packed. must have a contiguous head dim"):
        ops.attention_forward(q_t, k, v, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV)
    pt = _arr(fake, (3, 2), "int32")
    with pytest.raises(ValueError, match="do not take page tables"):
        ops.attention_forward(q, k, v, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV, page_table_k=pt, page_table_v=pt)
    dense = {n: _arr(fake, (3, 4, 8, 64)) for n in ("q", "k", "v")}
    with pytest.raises(ValueError, match="ragged_q is for ragged .packed. calls"):
        A.run(A.SDPA_FORWARD, {**dense, "ragged_q": _arr(fake, (4,), "int64")})
    assert not built and not runs


def test_l2_packed_array_whose_rows_cuDNN_cannot_read_is_refused(fake_fixture):
    """A packed array is read in place (its ragged offsets come from its own token stride): one whose token stride
    is not a multiple of 16 bytes is refused naming it, not copied (a copy's stride would not match the offsets)."""
    from .fuzz.materialize import FakeArray

    h, d = 4, 64
    base = _arr(fake_fixture, (TQ, h * d + 4))  # rows of H * D + 4 elements: an 8-byte-misaligned token stride
    q = FakeArray((TQ, h, d), base.dtype, (h * d + 4, d, 1), base.ptr, base.lib, device=0)
    k, v = _arr(fake_fixture, (TKV, 2, d)), _arr(fake_fixture, (TKV, 2, 32))
    with pytest.raises(ValueError, match=r"q \(packed\) must have a contiguous head dim"):
        ops.attention_forward(q, k, v, cu_seqlens_q=CU_Q, cu_seqlens_kv=CU_KV, enable_gqa=True)
