"""Attention on the CPU: the L2 primitives ``sdpa_forward``/``sdpa_backward`` and the L3 declaration ``sdpa``.

Registration (the primitives, the declaration, the torch custom op); meta on the samples of tests/l3/attention.py
against torch's shapes; the checks before any GPU work (L2 on fake arrays, and meta); the graphs the L2 calls
build and what they bind (tests/graph_fakes.py's recording plans on tests/fuzz/materialize's fake arrays); the
L3 forward/backward wiring with NumPy stand-ins for the L2 calls, against torch's autograd; the torch op's fake
under FakeTensor tracing (what torch.compile sees); cudnnkit.nn's function and cudnnkit.torch.nn's module."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cudnnkit.ops.attention as A
from cudnnkit import autograd, ops
from cudnnkit.ops._diff import DIFFERENTIABLE, Spec
from cudnnkit.ops._primitive import REGISTRY
from cudnnkit.runtime.arrays import contiguous_strides

from .l3 import attention as samples

torch = pytest.importorskip("torch")
F = torch.nn.functional

BHSD = (1, 2, 16, 64)


def S(shape, dtype="bfloat16", strides=None):
    shape = tuple(shape)
    return Spec(shape, tuple(strides) if strides is not None else contiguous_strides(shape), dtype)


def _spec(a, dtype="bfloat16"):
    return Spec(a.shape, tuple(s // a.itemsize for s in a.strides), dtype)


def _bshd_strides(b, h, s, d):
    return (s * h * d, d, h * d, 1)


# ----------------------------------------------------------------- registration


def test_the_primitives_and_the_declaration_are_registered():
    fwd, bwd = REGISTRY["sdpa_forward"], REGISTRY["sdpa_backward"]
    assert fwd.forms == ("graph",) and bwd.forms == ("graph",)  # graph-only: no legacy attention in cuDNN
    variants = [
        "attn_mask",
        "seq_len_q",
        "seq_len_kv",
        "alibi_slopes",
        "seed",
        "offset",
        "sink",
        "page_table_k",
        "page_table_v",
        *(f"ragged_{n}" for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv")),  # packed batches' offsets
    ]  # optional (issue 17)
    assert [op.name for op in fwd.inputs] == ["q", "k", "v", *variants]
    assert [o.name for o in fwd.outputs] == ["out", "stats"]
    assert [op.name for op in bwd.inputs] == ["q", "k", "v", "o", "do", "stats", *variants]
    assert all(op.optional for op in (*fwd.inputs[3:], *bwd.inputs[6:]))
    assert [o.name for o in bwd.outputs] == ["dq", "dk", "dv", "dattn_mask", "dsink"]  # empty unless asked
    # attn_mask and sink carry gradients through the L3 op "attention"
    assert fwd.differentiable == ("q", "k", "v", "attn_mask", "sink") and fwd.backward == "sdpa_backward"
    assert fwd.residuals == ("q", "k", "v", "out", "stats")
    d = autograd.get("sdpa")
    assert d is DIFFERENTIABLE["sdpa"] is A.SDPA
    assert (d.primitive, d.inputs, d.outputs, d.arrays, d.mutated) == ("sdpa_forward", ("q", "k", "v"), ("out",), (),
                                                                       ())  # fmt: skip
    assert d.differentiable_outputs is None and d.doc
    assert set(samples.SAMPLES) == set(samples.TORCH_REFERENCE) == set(samples.ONLY_DTYPE) == {"sdpa", "attention"}
    a = autograd.get("attention")
    assert a is DIFFERENTIABLE["attention"] is A.ATTENTION and a.capture_safe and a.doc
    assert (a.primitive, a.inputs, a.outputs, a.arrays, a.mutated) == (
        "sdpa_forward", ("q", "k", "v", "attn_mask", "sink"), ("out",),
        ("seq_len_q", "seq_len_kv", "alibi_slopes", "seed", "offset"), ())  # fmt: skip
    assert ops.sdpa_forward is A.sdpa_forward and ops.sdpa_backward is A.sdpa_backward
    assert {"sdpa_forward", "sdpa_backward"} <= set(ops.__all__)


def test_the_torch_custom_op_is_defined():
    import cudnnkit.torch as ct

    t = ct.op("sdpa")
    assert t.qualname == "cudnnkit::sdpa" and t.d is A.SDPA
    assert hasattr(torch.ops.cudnnkit, "sdpa") and hasattr(torch.ops.cudnnkit, "sdpa_backward")
    assert ct.ops.sdpa is t


# ----------------------------------------------------------------- meta


def _cases():
    for i, (inputs, kw) in enumerate(samples.SAMPLES["sdpa"](np.random.default_rng(0), "float64")):
        yield pytest.param(inputs, kw, id=f"sample{i}")


@pytest.mark.parametrize("inputs, kw", list(_cases()))
def test_meta_on_the_samples_gives_torchs_shapes(inputs, kw):
    want_np = np.float32 if samples.AS_FLOAT32 else samples.ml_dtypes.bfloat16
    assert all(a.dtype == want_np for a in inputs)
    assert all(np.array_equal(samples.bf16_values(a), np.asarray(a, np.float32)) for a in inputs)  # exact in bf16
    specs = [_spec(a) for a in inputs]
    (o,), res = A.SDPA.meta(*specs, **kw)
    (want,) = samples.TORCH_REFERENCE["sdpa"](inputs, kw)
    b, h, sq, _ = inputs[0].shape
    assert o.shape == tuple(want.shape) and o.dtype == "bfloat16"
    assert o.strides == specs[0].strides  # a new o in q's layout (BHSD or BSHD)
    assert list(res) == ["q", "k", "v", "out", "stats"]
    assert res["q"] is specs[0] and res["k"] is specs[1] and res["v"] is specs[2] and res["out"] is o
    assert res["stats"] == S((b, h, sq, 1), "float32")


def test_meta_shapes_and_layouts():
    # D_v != D, float16
    (o,), res = A.SDPA.meta(S((2, 4, 8, 64), "float16"), S((2, 4, 24, 64), "float16"), S((2, 4, 24, 32), "float16"))
    want = F.scaled_dot_product_attention(
        torch.zeros(2, 4, 8, 64), torch.zeros(2, 4, 24, 64), torch.zeros(2, 4, 24, 32)
    )
    assert o == S(tuple(want.shape), "float16") and res["stats"] == S((2, 4, 8, 1), "float32")
    # a gapped q (a slice of a packed qkv projection: BSHD with a stride of 3 * H * D) gets a C-order o
    qkv = (16 * 3 * 2 * 64, 64, 3 * 2 * 64, 1)
    (o,), _ = A.SDPA.meta(S((1, 2, 16, 64), strides=qkv), S((1, 2, 16, 64), strides=qkv), S((1, 2, 16, 64)))
    assert o == S((1, 2, 16, 64))
    # BSHD q with D_v != D: o in q's dim order
    (o,), _ = A.SDPA.meta(S((1, 2, 16, 64), strides=_bshd_strides(1, 2, 16, 64)), S((1, 2, 8, 64)), S((1, 2, 8, 32)))
    assert o == S((1, 2, 16, 32), strides=_bshd_strides(1, 2, 16, 32))


# ----------------------------------------------------------------- checks before any GPU work


META_REFUSED = [
    (lambda: A.SDPA.meta(S(BHSD, "float32"), S(BHSD, "float32"), S(BHSD, "float32")), TypeError,
     "q has dtype float32; sdpa needs one of"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD, "float16"), S(BHSD)), TypeError, "k and v must have q's dtype"),
    (lambda: A.SDPA.meta(S((2, 16, 64)), S((2, 16, 64)), S((2, 16, 64))), ValueError, "q must be 4-d"),
    (lambda: A.SDPA.meta(S(BHSD), S((2, 2, 16, 64)), S((2, 2, 16, 64))), ValueError, "batch size"),
    (lambda: A.SDPA.meta(S((1, 4, 16, 64)), S((1, 2, 16, 64)), S((1, 2, 16, 64))), NotImplementedError,
     "one shared key/value head"),
    (lambda: A.SDPA.meta(S((1, 3, 16, 64)), S((1, 2, 16, 64)), S((1, 2, 16, 64))), ValueError, "multiple of k's"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S((1, 1, 16, 64))), ValueError, "v must have k's 2 heads"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S((1, 2, 8, 64))), ValueError, "v must have k's length"),
    (lambda: A.SDPA.meta(S(BHSD), S((1, 2, 16, 32)), S(BHSD)), ValueError, "k's head dim 32 must equal q's 64"),
    (lambda: A.SDPA.meta(S((1, 2, 16, 60)), S((1, 2, 16, 60)), S(BHSD)), ValueError, "q's head dim must be a multiple"),
    (lambda: A.SDPA.meta(S((1, 2, 16, 264)), S((1, 2, 16, 264)), S(BHSD)), ValueError, "from 8 to 256"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S((1, 2, 16, 4))), ValueError, "v's head dim"),
    (lambda: A.SDPA.meta(S((1, 2, 0, 64)), S(BHSD), S(BHSD)), ValueError, "at least one position"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S(BHSD), causal=1), TypeError, "causal must be a bool"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S(BHSD), scale="0.1"), TypeError, "scale"),
    (lambda: A.SDPA.meta(S(BHSD), S(BHSD), S(BHSD), scale=math.inf), ValueError, "scale must be finite"),
]  # fmt: skip


@pytest.mark.parametrize("call, exc, msg", META_REFUSED)
def test_meta_refuses_what_the_call_would(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.fixture
def fake():
    """tests/fuzz/materialize's fake device arrays (no GPU: any cuDNN call with a handle fails the test)."""
    from .fuzz.materialize import FakeBackend

    b = FakeBackend()
    with b.installed():
        yield b


def _arr(b, shape, dtype="bfloat16", layout=None):
    from .fuzz.model import A as Arg

    arg = Arg(tuple(shape), dtype) if layout is None else Arg(tuple(shape), dtype, layout=layout)
    return b.array(arg, None, "fakeA", None)


L2_REFUSED = [
    (lambda b: ops.sdpa_forward(*(_arr(b, BHSD, "float32"),) * 3), TypeError, "q has dtype float32"),
    (lambda b: ops.sdpa_forward(_arr(b, BHSD), _arr(b, (1, 2, 16, 32)), _arr(b, BHSD)), ValueError, "k's head dim"),
    (lambda b: ops.sdpa_forward(*(_arr(b, BHSD),) * 3, causal="yes"), TypeError, "causal"),
    (lambda b: ops.sdpa_forward(*(_arr(b, BHSD),) * 3, training=1), TypeError, "training must be a bool"),
    (lambda b: ops.sdpa_forward(*(_arr(b, BHSD),) * 3, out=_arr(b, BHSD)), TypeError, "out must be a tuple of 2"),
    (lambda b: ops.sdpa_forward(*(_arr(b, BHSD),) * 3, out=(_arr(b, (1, 2, 16, 32)), None)), ValueError,
     "out must have shape"),
    (lambda b: ops.sdpa_backward(*(_arr(b, BHSD),) * 5, _arr(b, (1, 2, 16, 1), "float16")), TypeError,
     "stats has dtype float16"),
    (lambda b: ops.sdpa_backward(*(_arr(b, BHSD),) * 5, _arr(b, (1, 2, 8, 1), "float32")), ValueError,
     r"stats must have shape \(1, 2, 16, 1\)"),
    (lambda b: ops.sdpa_backward(*(_arr(b, BHSD),) * 3, _arr(b, (1, 2, 16, 32)), _arr(b, BHSD),
                                 _arr(b, (1, 2, 16, 1), "float32")), ValueError, "o must have shape"),
    (lambda b: ops.sdpa_backward(*(_arr(b, BHSD),) * 4, _arr(b, BHSD, "float16"), _arr(b, (1, 2, 16, 1), "float32")),
     TypeError, "do must have q's dtype"),
]  # fmt: skip


@pytest.mark.parametrize("call, exc, msg", L2_REFUSED)
def test_the_l2_calls_refuse_before_any_gpu_work(fake, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(fake)


# ----------------------------------------------------------------- the graphs the L2 calls build


@pytest.fixture
def plans(monkeypatch, fake):
    """(the graphs built, the pointer-only runs, the checked executions): recording plans for both forms."""
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
    A._bwd_forms.clear()
    yield built, runs, executed
    _express.entries.clear()
    A._bwd_forms.clear()


def _kinds(g):
    return [n.kind if n.kind != "pointwise" else n.attr("mode") for n in g.nodes()]


@pytest.mark.parametrize("causal, scale", [(False, None), (True, 0.2)])
def test_the_forward_is_one_sdpa_graph_binding_the_callers_arrays(fake, plans, causal, scale):
    built, runs, _ = plans
    q, k, v = _arr(fake, (2, 2, 32, 64)), _arr(fake, (2, 2, 48, 64)), _arr(fake, (2, 2, 48, 64))
    o, stats = ops.sdpa_forward(q, k, v, causal=causal, scale=scale)
    assert ops.last_path() == ("sdpa_forward", "graph")
    assert (o.shape, o.dtype, o.strides) == ((2, 2, 32, 64), "bfloat16", contiguous_strides((2, 2, 32, 64)))
    assert (stats.shape, stats.dtype) == ((2, 2, 32, 1), "float32")
    (g,) = built
    kinds = _kinds(g)
    assert kinds.count("matmul") == 2 and kinds.count("reduction") == 2  # q @ k^T, P @ v; row max, row sum
    assert kinds[:2] == ["matmul", "MUL"] and {"EXP", "LOG", "DIV"} <= set(kinds)
    assert ("BINARY_SELECT" in kinds) == causal and ("CMP_GE" in kinds) == causal
    assert (0.2 if scale else 1 / 8, "float32") in g.constants().values()  # the scale, by value (1/sqrt(64))
    real = {t.name: t for t in g.tensors() if not t.virtual and not t.by_value}
    assert real["stats"].dims == (2, 2, 32, 1) and real["stats"].dtype == "float32" and not g.scratch()
    seen = runs[-1]
    assert seen["q"][1] == q.ptr and seen["k"][1] == k.ptr and seen["v"][1] == v.ptr
    assert seen["out"] == (o.strides, o.ptr) and seen["out1"][1] == stats.ptr
    # inference: o alone (the statistics still written, to an array dropped after the call)
    o2 = ops.sdpa_forward(q, k, v, causal=causal, scale=scale, training=False)
    assert o2.shape == (2, 2, 32, 64) and runs[-1]["q"][1] == q.ptr and len(built) == 1  # the same plan


def test_the_forward_keeps_a_bshd_layout_and_copies_a_strided_head_dim(fake, plans):
    built, runs, _ = plans
    bshd = ("perm", (0, 2, 1, 3))
    q, k, v = (_arr(fake, (2, 2, 16, 64), layout=bshd) for _ in range(3))
    o, _ = ops.sdpa_forward(q, k, v)
    assert o.strides == q.strides == _bshd_strides(2, 2, 16, 64) and runs[-1]["q"] == (q.strides, q.ptr)
    t = _arr(fake, (2, 2, 16, 64), layout=("perm", (0, 1, 3, 2)))  # D not innermost
    o, _ = ops.sdpa_forward(t, k, v)
    assert runs[-1]["q"][1] != t.ptr and runs[-1]["q"][0] == contiguous_strides((2, 2, 16, 64))
    assert o.strides == contiguous_strides((2, 2, 16, 64))


@pytest.mark.parametrize("hk", [2, 1])
def test_the_backward_is_one_graph_with_its_scratch_bound(fake, plans, hk):
    built, _, executed = plans
    q, k, v = _arr(fake, (2, 2, 32, 64)), _arr(fake, (2, hk, 32, 64)), _arr(fake, (2, hk, 32, 64))
    o, do, st = _arr(fake, (2, 2, 32, 64)), _arr(fake, (2, 2, 32, 64)), _arr(fake, (2, 2, 32, 1), "float32")
    dq, dk, dv = ops.sdpa_backward(q, k, v, o, do, st, causal=True)
    assert ops.last_path() == ("sdpa_backward", "graph")
    assert [(x.shape, x.dtype) for x in (dq, dk, dv)] == [((2, 2, 32, 64), "bfloat16"), ((2, hk, 32, 64), "bfloat16"),
                                                          ((2, hk, 32, 64), "bfloat16")]  # fmt: skip
    (g, bindings, kw) = executed[-1]
    assert g is built[-1] and kw["unchecked"] and kw["workspace"] is None
    kinds = _kinds(g)
    assert kinds.count("reshape") == 3 and kinds.count("matmul") == 5 and "IDENTITY" in kinds
    assert kinds.count("reduction") == 1 + (2 if hk == 1 else 0)  # rowsum(do * o); the head sums of dk, dv
    assert "BINARY_SELECT" in kinds and (1 / 8, "float32") in g.constants().values()
    by_name = {g._tensors[u].name: p for u, p in bindings.items()}
    for name, arr in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do), ("stats", st)):
        assert by_name[name] == arr.ptr
    assert {t.name for t in g.scratch()} == {"softmax_sum", "dq_accum"}
    assert all(by_name[t.name] not in (None, 0) for t in g.scratch())  # allocated per call and bound
    assert sorted(g.scratch_init().values(), key=str) == [None, "zero"]  # the dq accumulator zeroed by execute
    ops.sdpa_backward(q, k, v, o, do, st, causal=True)  # the plan is cached: nothing built again
    assert len(built) == 1 and len(executed) == 2


def test_an_empty_batch_builds_nothing(fake, plans):
    built, _, _ = plans
    o, st = ops.sdpa_forward(*(_arr(fake, (0, 2, 16, 64)),) * 3)
    assert o.shape == (0, 2, 16, 64) and st.shape == (0, 2, 16, 1) and not built


# ----------------------------------------------------------------- L3 wiring (NumPy stand-ins for the L2 calls)


def _np_heads(q, k):
    return k if k.shape[1] == q.shape[1] else np.repeat(k, q.shape[1] // k.shape[1], axis=1)


def _np_probs(q, k, scale, causal, stats=None):
    s = np.einsum("bhqd,bhkd->bhqk", q, _np_heads(q, k)) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if stats is None:
        mx = s.max(axis=-1, keepdims=True)
        stats = mx + np.log(np.exp(s - mx).sum(axis=-1, keepdims=True))
    return np.exp(s - stats), stats


@pytest.fixture
def stand_ins(monkeypatch):
    """cuDNN's documented semantics in NumPy float64, in place of the two L2 calls (the calls made are recorded)."""
    calls = []

    def fwd(q, k, v, *, scale=None, causal=False, training=True):
        calls.append(("fwd", scale, causal, training))
        p, stats = _np_probs(q, k, 1 / math.sqrt(q.shape[3]) if scale is None else scale, causal)
        return p @ _np_heads(q, v), stats

    def bwd(q, k, v, o, do, stats, *, scale=None, causal=False):
        calls.append(("bwd", scale, causal))
        sc = 1 / math.sqrt(q.shape[3]) if scale is None else scale
        p, _ = _np_probs(q, k, sc, causal, stats)
        ds = p * (do @ _np_heads(q, v).transpose(0, 1, 3, 2) - (do * o).sum(-1, keepdims=True)) * sc
        dq = ds @ _np_heads(q, k)
        dk, dv = ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ do
        if k.shape[1] != q.shape[1]:
            dk, dv = dk.sum(axis=1, keepdims=True), dv.sum(axis=1, keepdims=True)
        return dq, dk, dv

    monkeypatch.setattr(A, "sdpa_forward", fwd)
    monkeypatch.setattr(A, "sdpa_backward", bwd)
    return calls


@pytest.mark.parametrize("inputs, kw", list(_cases()))
def test_forward_and_backward_wiring_match_torch(stand_ins, inputs, kw):
    ins = [np.asarray(a, dtype=np.float64) for a in inputs]
    (o,), res = A.SDPA.forward(*ins, **kw)
    assert list(res) == ["q", "k", "v", "out", "stats"] and res["out"] is o and res["q"] is ins[0]
    leaves = [torch.from_numpy(a.copy()).requires_grad_() for a in ins]
    k, v = leaves[1:]
    if k.shape[1] != leaves[0].shape[1]:
        k, v = (t.repeat_interleave(leaves[0].shape[1], dim=1) for t in (k, v))
    want = F.scaled_dot_product_attention(leaves[0], k, v, is_causal=kw.get("causal", False), scale=kw.get("scale"))
    np.testing.assert_allclose(o, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    do = np.random.default_rng(3).standard_normal(o.shape)
    grads = A.SDPA.backward(res, (do,), (True, True, True), **kw)
    for g, r in zip(grads, torch.autograd.grad(want, leaves, torch.from_numpy(do))):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-9, atol=1e-11)
    assert stand_ins == [("fwd", kw.get("scale"), kw.get("causal", False), True),
                         ("bwd", kw.get("scale"), kw.get("causal", False))]  # fmt: skip
    assert A.SDPA.backward(res, (do,), (False, True, False), **kw)[::2] == (None, None)
    assert A.SDPA.backward(res, (None,), (True, True, True), **kw) == (None, None, None)
    assert len(stand_ins) == 3  # one backward call each time gradients are needed


# ----------------------------------------------------------------- the L3 op "attention" (every variant)


def _att_cases():
    for i, (inputs, kw) in enumerate(samples.SAMPLES["attention"](np.random.default_rng(0), "float64")):
        yield pytest.param(inputs, kw, id=f"sample{i}")


@pytest.mark.parametrize("inputs, kw", list(_att_cases()))
def test_attention_meta_on_the_samples_gives_the_references_shapes(inputs, kw):
    q, k, v, mask, sink = inputs
    specs = [_spec(q), _spec(k), _spec(v), None if mask is None else _spec(mask),
             None if sink is None else _spec(sink, "float32")]  # fmt: skip
    mkw = {n: (_spec(a, "float32") if n == "alibi_slopes" else a) for n, a in kw.items()}
    (o,), res = A.ATTENTION.meta(*specs, **mkw)
    (want,) = samples.TORCH_REFERENCE["attention"](inputs, kw)
    assert o.shape == tuple(want.shape) and o.dtype == "bfloat16" and o.strides[-1] == 1
    assert list(res) == ["q", "k", "v", "attn_mask", "sink", "seq_len_q", "seq_len_kv", "alibi_slopes", "seed",
                         "offset", "out", "stats"]  # fmt: skip
    assert res["q"] is specs[0] and res["attn_mask"] is specs[3] and res["sink"] is specs[4] and res["out"] is o
    assert res["stats"] == S(q.shape[:3] + (1,), "float32")
    assert res["alibi_slopes"] is mkw.get("alibi_slopes")


def test_attention_folds_a_vmap_unless_an_array_is_per_sample():
    refuses = A.ATTENTION.batch_refuses
    assert A.ATTENTION.batch == ("q", "k", "v", "out", "stats")
    assert refuses({}, {"q": S(BHSD), "attn_mask": S((1, 2, 16, 16))}) is None  # shared by the batch: folds
    assert refuses({}, {"q": S(BHSD), "attn_mask": S((2, 16, 16))}) is None
    assert refuses({}, {"q": S(BHSD), "sink": S((2,), "float32")}) is None
    assert "attn_mask has a batch dim of 3" in refuses({}, {"attn_mask": S((3, 2, 16, 16))})
    assert "per sample" in refuses({}, {"seq_len_q": S((1,), "int32"), "seq_len_kv": S((1,), "int32")})


ATT_REFUSED = [
    (dict(cu_seqlens_q=[0, 16], cu_seqlens_kv=[0, 16]), NotImplementedError, "cu_seqlens_q: a packed .* batch is"),
    (dict(page_table_k=None), NotImplementedError, "page_table_k: cuDNN's paged attention has no backward"),
    (dict(dropout=0.1), TypeError, "unexpected keyword 'dropout'"),
    (dict(is_causal=True, diagonal_alignment="middle"), ValueError, "diagonal_alignment"),
    (dict(softcap=2.0, is_causal=True), ValueError, "softcap"),
    (dict(dropout_p=0.2), ValueError, "seed"),
]


@pytest.mark.parametrize("kw, exc, msg", ATT_REFUSED)
def test_attention_meta_refuses_by_name(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        A.ATTENTION.meta(S(BHSD), S(BHSD), S(BHSD), **kw)


@pytest.fixture
def att_calls(monkeypatch):
    """attention_forward/attention_backward replaced by recorders returning marked arrays."""
    calls = []

    def fwd(q, k, v, **kw):
        calls.append(("fwd", kw))
        return np.full(q.shape[:3] + v.shape[3:], 2.0), np.full(q.shape[:3] + (1,), 3.0)

    def bwd(q, k, v, o, do, stats, *, dbias=False, dsink=False, **kw):
        calls.append(("bwd", dict(kw, dbias=dbias, dsink=dsink, o=float(o.flat[0]), stats=float(stats.flat[0]))))
        got = (np.full(q.shape, 4.0), np.full(k.shape, 5.0), np.full(v.shape, 6.0))
        if dbias:
            got += (np.full(kw["attn_mask"].shape, 7.0),)
        if dsink:
            got += (np.full(kw["sink"].shape, 8.0),)
        return got

    monkeypatch.setattr(A, "attention_forward", fwd)
    monkeypatch.setattr(A, "attention_backward", bwd)
    return calls


def test_attention_wiring_passes_every_option_and_asks_only_the_needed_gradients(att_calls):
    q, kv = np.zeros((1, 4, 8, 16)), np.zeros((1, 2, 8, 16))
    mask, sink, lens, seed = np.zeros((4, 8, 8)), np.zeros(4, np.float32), np.ones(1, np.int32), np.ones(1, np.int64)
    kw = dict(is_causal=True, left_bound=4, enable_gqa=True, scale=0.5, dropout_p=0.1)
    (o,), res = A.ATTENTION.forward(q, kv, kv, mask, sink, seq_len_q=lens, seq_len_kv=lens, seed=seed, offset=seed,
                                    **kw)  # fmt: skip
    name, got = att_calls[-1]
    assert name == "fwd" and got["attn_mask"] is mask and got["sink"] is sink and got["seq_len_q"] is lens
    assert got["seed"] is seed and got["alibi_slopes"] is None and got["softcap"] is None
    assert {k: got[k] for k in kw} == kw and got["diagonal_alignment"] == "top_left" and got["right_bound"] is None
    assert (
        res["attn_mask"] is mask
        and res["seq_len_kv"] is lens
        and res["out"] is o
        and float(res["stats"][0, 0, 0, 0]) == 3
    )
    do = np.ones(o.shape)
    g = A.ATTENTION.backward(res, (do,), (True, False, True, True, False), **kw)
    name, got = att_calls[-1]
    assert name == "bwd" and got["dbias"] and not got["dsink"] and got["o"] == 2.0 and got["stats"] == 3.0
    assert got["seq_len_q"] is lens and got["offset"] is seed and got["left_bound"] == 4
    assert [None if x is None else float(x.flat[0]) for x in g] == [4.0, None, 6.0, 7.0, None]
    g = A.ATTENTION.backward(res, (do,), (False, False, False, False, True), **kw)
    assert (
        att_calls[-1][1]["dsink"] and not att_calls[-1][1]["dbias"] and float(g[4][0]) == 8.0 and g[:4] == (None,) * 4
    )
    n = len(att_calls)
    assert A.ATTENTION.backward(res, (None,), (True,) * 5, **kw) == (None,) * 5 and len(att_calls) == n
    # no mask, no sink: their gradients are not asked for even when needed
    (o,), res = A.ATTENTION.forward(q, kv, kv, enable_gqa=True)
    A.ATTENTION.backward(res, (do,), (True,) * 5, enable_gqa=True)
    assert not att_calls[-1][1]["dbias"] and not att_calls[-1][1]["dsink"]


# ----------------------------------------------------------------- the torch op under tracing


def test_the_torch_op_traces_with_fake_tensors_forward_and_backward():
    """What torch.compile sees: the forward and backward custom ops, run on fake tensors from meta (no cuDNN)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    import cudnnkit.torch as ct

    def f(q, k, v):
        o = ct.op("sdpa")(q, k, v, causal=True)
        return (o, *torch.autograd.grad(o.float().sum(), (q, k, v)))

    q = torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.zeros(2, 1, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    gm = make_fx(f, tracing_mode="fake")(q, kv, kv.detach().clone().requires_grad_())
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"cudnnkit.sdpa.default", "cudnnkit.sdpa_backward.default"} <= called
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    metas = [tuple(a.meta["val"].shape) for a in outs]
    assert metas == [(2, 4, 16, 64), (2, 4, 16, 64), (2, 1, 32, 64), (2, 1, 32, 64)]


# ----------------------------------------------------------------- cudnnkit.nn and cudnnkit.torch.nn


@pytest.fixture
def recorded(monkeypatch):
    """cudnnkit.torch.op replaced by a recorder returning zeros of torch's output shape."""
    import cudnnkit.torch as ct

    calls = []

    def op(name):
        def call(*inputs, **kw):
            calls.append((name, [None if t is None else tuple(t.shape) for t in inputs], kw))
            q, _, v = inputs[:3]
            return torch.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype)

        return call

    monkeypatch.setattr(ct, "op", op)
    return calls


def test_nn_scaled_dot_product_attention_calls_the_l3_op(recorded):
    from cudnnkit import nn

    z = torch.zeros
    h16 = z(2, 4, 8, 16, dtype=torch.float16)
    o = nn.scaled_dot_product_attention(h16, h16, h16, is_causal=True, scale=0.5)
    assert o.shape == (2, 4, 8, 16)
    assert recorded[-1] == ("sdpa", [(2, 4, 8, 16)] * 3, {"scale": 0.5, "causal": True})
    o = nn.scaled_dot_product_attention(*(z(2, 8, 16, dtype=torch.bfloat16),) * 3)  # (B, S, D): one head
    assert o.shape == (2, 8, 16) and recorded[-1] == ("sdpa", [(2, 1, 8, 16)] * 3, {"scale": None, "causal": False})
    kv = z(1, 1, 8, 16, dtype=torch.bfloat16)
    nn.scaled_dot_product_attention(z(1, 4, 8, 16, dtype=torch.bfloat16), kv, kv, enable_gqa=True)
    assert recorded[-1][:2] == ("sdpa", [(1, 4, 8, 16), (1, 1, 8, 16), (1, 1, 8, 16)])
    # any grouping, and an additive mask: the L3 op "attention"
    kv2 = z(1, 2, 8, 16, dtype=torch.bfloat16)
    nn.scaled_dot_product_attention(z(1, 4, 8, 16, dtype=torch.bfloat16), kv2, kv2, enable_gqa=True, scale=0.1)
    assert recorded[-1] == ("attention", [(1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), None, None],
                            {"scale": 0.1, "is_causal": False, "enable_gqa": True})  # fmt: skip
    mask = z(8, 8, dtype=torch.bfloat16)
    nn.scaled_dot_product_attention(h16, h16, h16, attn_mask=mask.half())
    assert recorded[-1] == ("attention", [(2, 4, 8, 16)] * 3 + [(8, 8), None],
                            {"scale": None, "is_causal": False, "enable_gqa": False})  # fmt: skip
    o = nn.scaled_dot_product_attention(*(z(2, 8, 16, dtype=torch.bfloat16),) * 3, attn_mask=z(2, 8, 8))
    assert o.shape == (2, 8, 16) and recorded[-1][1][3] == (2, 1, 8, 8)  # (B, S, S) of a one-head call
    nn.scaled_dot_product_attention(h16, h16, h16, attn_mask=z(2, 1, 1, 8, dtype=torch.float16))  # key padding
    assert recorded[-1][1][3] == (2, 1, 8, 8)  # expanded to (.., S_q, S_kv): cuDNN broadcasts batch and heads only
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 1, 3, 8\) does not broadcast"):
        nn.scaled_dot_product_attention(h16, h16, h16, attn_mask=z(2, 1, 3, 8, dtype=torch.float16))
    with pytest.raises(NotImplementedError, match="a boolean attn_mask"):
        nn.scaled_dot_product_attention(h16, h16, h16, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask and is_causal=True together"):
        nn.scaled_dot_product_attention(h16, h16, h16, attn_mask=mask.half(), is_causal=True)
    with pytest.raises(ValueError, match="one head count dividing the query's 4"):
        nn.scaled_dot_product_attention(z(1, 4, 8, 16, dtype=torch.bfloat16), *(z(1, 3, 8, 16, dtype=torch.bfloat16),) * 2,
                                        enable_gqa=True)  # fmt: skip


def test_the_attention_module(recorded):
    from cudnnkit.torch import nn as tnn

    m = tnn.ScaledDotProductAttention(is_causal=True, scale=0.25)
    assert not list(m.parameters()) and not list(m.buffers())
    assert "is_causal=True, scale=0.25, enable_gqa=False, dropout_p=0.0" in repr(m)
    assert type(m) not in tnn.TWINS.values()  # not a twin: torch has no such module
    x = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    assert m(x, x, x).shape == (1, 2, 8, 16)
    assert recorded[-1] == ("sdpa", [(1, 2, 8, 16)] * 3, {"scale": 0.25, "causal": True})
    with pytest.raises(NotImplementedError, match="dtype float32"):
        m(*(torch.zeros(1, 2, 8, 16),) * 3)
    g = tnn.ScaledDotProductAttention(enable_gqa=True)
    kv = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    assert g(torch.zeros(1, 4, 8, 16, dtype=torch.float16), kv, kv, attn_mask=torch.zeros(8, 8)).shape == (1, 4, 8, 16)
    assert recorded[-1] == ("attention", [(1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16), (8, 8), None],
                            {"scale": None, "is_causal": False, "enable_gqa": True})  # fmt: skip
    with pytest.raises(NotImplementedError, match="a boolean attn_mask"):
        g(x, x, x, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="attn_mask and is_causal=True"):
        m(x, x, x, attn_mask=torch.zeros(8, 8))
    with pytest.raises(TypeError, match="scale"):
        tnn.ScaledDotProductAttention(scale="big")
    with pytest.raises(TypeError, match="dropout_p must be a real number, got None"):
        tnn.ScaledDotProductAttention(dropout_p=None)
    with pytest.raises(NotImplementedError, match=r"dropout_p=1.0"):
        tnn.ScaledDotProductAttention(dropout_p=1.0)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\], got 2"):
        tnn.ScaledDotProductAttention(dropout_p=2)
    # dropout: in training mode only (the op 'attention' with a drawn seed), as torch.nn.Dropout
    d = tnn.ScaledDotProductAttention(dropout_p=0.25)
    d(x, x, x)
    name, shapes, kw = recorded[-1]
    assert name == "attention" and kw["dropout_p"] == 0.25 and kw["seed"].shape == (1, 1, 1, 1)
    d.eval()
    d(x, x, x)
    assert recorded[-1] == ("sdpa", [(1, 2, 8, 16)] * 3, {"scale": None, "causal": False})


def test_sdpa_dropout_draws_its_seed_from_torchs_generator(recorded):
    """dropout_p > 0 runs the op 'attention' with dropout_p and a (seed, offset) pair of (1, 1, 1, 1) int64 arrays on
    the inputs' device: the seed from torch's generator (torch.manual_seed reproduces it, the next call draws
    another), the offset 0; every route (plain, causal, grouped heads, a mask, 3-d) takes it."""
    from cudnnkit import nn

    h = torch.zeros(2, 4, 8, 16, dtype=torch.bfloat16)
    torch.manual_seed(11)
    nn.scaled_dot_product_attention(h, h, h, dropout_p=0.1, is_causal=True)
    name, shapes, kw = recorded[-1]
    assert name == "attention" and shapes == [(2, 4, 8, 16)] * 3 + [None, None]
    assert {k: kw[k] for k in ("dropout_p", "is_causal", "enable_gqa", "scale")} == dict(
        dropout_p=0.1, is_causal=True, enable_gqa=False, scale=None)  # fmt: skip
    seed, offset = kw["seed"], kw["offset"]
    for a in (seed, offset):
        assert a.shape == (1, 1, 1, 1) and a.dtype == torch.int64 and a.device == h.device
    assert offset.item() == 0 and 0 <= seed.item() < 2**62
    torch.manual_seed(11)
    assert torch.randint(0, 2**62, (1, 1, 1, 1), dtype=torch.int64).item() == seed.item()  # torch's draw
    nn.scaled_dot_product_attention(h, h, h, dropout_p=0.1)
    assert recorded[-1][2]["seed"].item() != seed.item()  # the next call, a new mask
    kv = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    nn.scaled_dot_product_attention(h, kv, kv, attn_mask=torch.zeros(8, 8), dropout_p=0.5, enable_gqa=True)
    assert recorded[-1][1][3] == (8, 8) and recorded[-1][2]["dropout_p"] == 0.5 and recorded[-1][2]["enable_gqa"]
    o = nn.scaled_dot_product_attention(*(torch.zeros(2, 8, 16, dtype=torch.float16),) * 3, dropout_p=0.2)
    assert o.shape == (2, 8, 16) and recorded[-1][1][:3] == [(2, 1, 8, 16)] * 3 and "seed" in recorded[-1][2]
    nn.scaled_dot_product_attention(h, h, h, dropout_p=0.0)  # 0: no dropout, the plain op
    assert recorded[-1][0] == "sdpa"
    n = len(recorded)
    for p, err, msg in ((1.0, NotImplementedError, "dropout_p=1.0"), (1.5, ValueError, r"dropout_p must be in \[0, 1\]"),
                        (-0.1, ValueError, "got -0.1"), (float("nan"), ValueError, "got nan"),
                        ("0.1", TypeError, "dropout_p must be a real number")):  # fmt: skip
        with pytest.raises(err, match=msg):
            nn.scaled_dot_product_attention(h, h, h, dropout_p=p)
    assert len(recorded) == n  # refused before the op


def test_convert_leaves_multihead_attention():
    import cudnnkit.torch as ct

    mha = torch.nn.MultiheadAttention(16, 2)
    model = torch.nn.Sequential(mha)
    report = ct.convert(model)
    assert model[0] is mha and not any(t is torch.nn.MultiheadAttention for _, t, _ in report.replaced)


def test_attention_copies_rows_it_cannot_read():
    """cuDNN's attention reads rows of D with 16-byte strides: a view into wider rows (row stride D + 3, found wrong
    on an H100 by the replay fuzz), a non-contiguous head dim, are copied; BHSD, BSHD and size-1 dims are not."""
    from cudnnkit.ops._diff import Spec, spec_view
    from cudnnkit.ops.attention import _rows_off

    def off(shape, strides, dtype="bfloat16"):
        return _rows_off(spec_view(Spec(shape, strides, dtype)))

    assert not off((2, 4, 16, 64), (4096, 1024, 64, 1))  # BHSD
    assert not off((2, 4, 16, 64), (4096, 64, 256, 1))  # BSHD
    assert not off((1, 4, 1, 64), (7, 64, 5, 1))  # strides of size-1 dims are not read
    assert off((2, 4, 16, 64), (4288, 1072, 67, 1))  # rows 3 elements wider than D
    assert off((2, 4, 16, 64), (4096, 1024, 1, 16))  # head dim not contiguous
    assert not off((2, 4, 16, 8), (512, 128, 8, 1), "float16")  # D = 8: 16 bytes
    assert off((2, 4, 16, 8), (4 * 16 * 12, 16 * 12, 12, 1), "float16")  # 24-byte rows
