"""Ragged (packed, THD) attention batches on the CPU (issue 17): :meth:`Graph.set_ragged_offset` and the SDPA
composites lowered with ``CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC`` on the packed tensors (q, k, v, o; do and the
gradients in the backward; the backward's view of k), the plan spec's bindings of packed arrays, and the
refusals (no padding mask, bad offsets), raised before any GPU work.

cuDNN 9.19 crashes reading ``RAGGED_OFFSET_DESC`` back from a finalized tensor descriptor (measured here), so the
lowering is checked by recording every ``BackendDescriptor.set``."""

from __future__ import annotations

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
