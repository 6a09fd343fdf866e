"""Graph plans on the CPU: what needs no cuDNN handle. Engine filters (a pure function of each engine's
notes), the unsupported-graph message, binding checks before any GPU work, by-value scalars, the plan
cache's LRU, counters, thread safety and serialization format, and key sensitivity."""

from __future__ import annotations

import ctypes
import json
import struct
import threading

import pytest

import cudnnkit
from cudnnkit import lib
from cudnnkit.graph import (
    Attempt,
    BindingError,
    EngineFilter,
    EngineInfo,
    Graph,
    PlanCache,
    PlanSpec,
    UnsupportedGraphError,
    plan_cache,
)
from cudnnkit.graph.plan import autotuner as autotune_mod
from cudnnkit.graph.plan import cache as cache_mod
from cudnnkit.graph.plan import engines as engines_mod
from cudnnkit.graph.plan import plans as plans_mod
from cudnnkit.graph.plan import search as search_mod
from cudnnkit.graph.plan import spec as spec_mod
from cudnnkit.runtime.cache import LRU

from .conftest import FakeCAI

BASE = 0x7F0000000000


def eng(num=(), beh=(), ws=0, index=7, knobs=((3, 1),)):
    return EngineInfo(index, knobs, frozenset(num), frozenset(beh), ws)


# ----------------------------------------------------------------- engine filters


def test_engine_name_is_index_and_knobs():
    assert eng(index=12, knobs=((1, 0), (17, 4))).name == "eng12_k1=0_k17=4"
    assert eng(index=0, knobs=()).name == "eng0"


def test_deterministic_filter_rejects_only_nondeterministic_engines():
    with cudnnkit.settings(deterministic=True):
        f = EngineFilter.make()
    assert "NONDETERMINISTIC" in f.reject(eng(num={"NONDETERMINISTIC", "TENSOR_CORE"}))
    assert f.reject(eng(num={"TENSOR_CORE"})) is None
    assert EngineFilter.make().reject(eng(num={"NONDETERMINISTIC"})) is None  # default settings allow it


def test_tf32_filter_applies_to_float32_math_only():
    with cudnnkit.settings(allow_tf32=False):
        f32, f16 = EngineFilter.make(fp32_math=True), EngineFilter.make(fp32_math=False)
    assert "TENSOR_CORE" in f32.reject(eng(num={"TENSOR_CORE"}))
    assert "DOWN_CONVERT_INPUTS" in f32.reject(eng(num={"DOWN_CONVERT_INPUTS"}))
    assert f32.reject(eng(num={"WINOGRAD"})) is None
    assert f16.reject(eng(num={"TENSOR_CORE"})) is None
    assert EngineFilter.make(fp32_math=True).reject(eng(num={"TENSOR_CORE"})) is None  # allow_tf32 default


def test_fp32_math_detection_looks_at_conv_and_matmul_inputs():
    g = Graph()
    a, b = g.tensor((4, 8)), g.tensor((8, 2))
    g.mark_output(g.matmul(a, b))
    assert engines_mod.fp32_math(g)
    g = Graph()
    a, b = g.tensor((4, 8), dtype="bfloat16"), g.tensor((8, 2), dtype="bfloat16")
    g.mark_output(g.pointwise("RELU_FWD", g.matmul(a, b)))  # float32 intermediates, bf16 operands
    assert not engines_mod.fp32_math(g)
    g = Graph()  # a matmul reading a float32 *virtual* tensor (attention backward's dS @ K) is no float32 data
    a, b, c = (g.tensor(s, dtype="bfloat16") for s in ((4, 8), (8, 8), (8, 2)))
    g.mark_output(g.matmul(g.pointwise("RELU_FWD", g.matmul(a, b)), c))
    assert not engines_mod.fp32_math(g)
    g = Graph()
    a, b = g.tensor((4, 8)), g.tensor((8, 2), dtype="bfloat16")  # one float32 operand the user binds: counts
    g.mark_output(g.matmul(a, b))
    assert engines_mod.fp32_math(g)


def test_workspace_limit_uses_config_then_plan_size():
    with cudnnkit.settings(workspace_limit=1024):
        f = EngineFilter.make()
    assert f.reject(eng(ws=1024)) is None
    assert "workspace 2048 bytes > workspace_limit 1024" in f.reject(eng(ws=2048))
    assert "workspace 4096" in f.reject(eng(ws=0), workspace=4096)
    assert f.reject(eng(ws=None)) is None  # unknown before the plan is built


def test_user_note_and_engine_filters():
    f = EngineFilter.make(
        deny_numerical=["winograd"],
        deny_behavior=["CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION"],
        require_behavior=[lib.CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API],
        deny_engines=["eng7"],
    )
    cg = {"SUPPORTS_CUDA_GRAPH_NATIVE_API"}
    assert "WINOGRAD numerical note (deny_numerical)" in f.reject(eng(num={"WINOGRAD"}, beh=cg, index=1))
    assert "RUNTIME_COMPILATION behavior note" in f.reject(eng(beh=cg | {"RUNTIME_COMPILATION"}, index=1))
    assert "lacks behavior note SUPPORTS_CUDA_GRAPH_NATIVE_API" in f.reject(eng(index=1))
    assert "engine eng7 denied" in f.reject(eng(beh=cg, index=7))
    assert f.reject(eng(beh=cg, index=70)) is None  # a prefix means a whole name, not eng70
    assert f.reject(eng(beh=cg, index=1)) is None
    with pytest.raises(ValueError, match="unknown behavior note 'FAST'"):
        EngineFilter.make(deny_behavior=["FAST"])
    key = f.options_key()
    assert key != EngineFilter.make().options_key() and hash(key) is not None


def test_unsupported_message_lists_attempts_and_names_the_cause():
    attempts = [
        Attempt(
            "heuristics mode b", "heuristics", "CUDNN_STATUS_NOT_SUPPORTED: no B model", "CUDNN_STATUS_NOT_SUPPORTED"
        ),
        Attempt("eng3_k1=0", "filter", "filtered: NONDETERMINISTIC numerical note (settings deterministic=True)"),
        Attempt(
            "eng9", "build", "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: stride mismatch", "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"
        ),
        Attempt(
            "eng11", "build", "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH", "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"
        ),
    ]
    e = UnsupportedGraphError("graph g (1 ops: conv_fprop)", attempts)
    msg = str(e)
    assert msg.startswith("no cuDNN engine supports graph g (1 ops: conv_fprop): 3 engine config(s) tried")
    assert "  heuristics mode b [heuristics]: CUDNN_STATUS_NOT_SUPPORTED: no B model" in msg
    assert "  eng9 [build]: CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: stride mismatch" in msg
    assert "  eng3_k1=0 [filter]: filtered: NONDETERMINISTIC" in msg
    cause = msg.splitlines()[-1]
    assert cause.startswith("likely cause: layout") and "arch" in cause
    assert e.attempts == attempts and isinstance(e, cudnnkit.graph.GraphError)
    only_filtered = str(UnsupportedGraphError("g", attempts[1:2]))
    assert "every engine was rejected by a filter" in only_filtered
    for none in ([], attempts[:1]):
        assert "likely cause: heuristics offered no engine for this graph" in str(UnsupportedGraphError("g", none))


# ----------------------------------------------------------------- bindings


def conv_spec(alignment=16):
    g = Graph(alignment=alignment)
    x = g.tensor((2, 8, 6, 6), (288, 1, 48, 8), "float16", name="x")
    w = g.tensor((4, 8, 3, 3), (72, 1, 24, 8), "float16", name="w")
    s = g.tensor((1, 1, 1, 1), dtype="float32", by_value=True, name="s")
    y = g.mark_output(g.pointwise("MUL", g.conv_fprop(x, w, pre_padding=1), s), "float16")
    return g, x, w, s, y, PlanSpec.of(g, 0)


def arr(t, ptr=BASE, device=0, typestr="<f2"):
    return FakeCAI(t.dims, typestr, strides=tuple(s * 2 for s in t.strides), ptr=ptr, device=device)


def test_plan_spec_lists_what_a_plan_binds():
    g, x, w, s, y, spec = conv_spec()
    assert spec.uids == (x.uid, w.uid, s.uid, y.uid)  # the virtual conv output is not bound
    assert spec.outputs == {y.uid} and spec.device == 0 and spec.alignment == 16
    d = json.loads(json.dumps(spec.to_dict()))
    back = PlanSpec.from_dict(d, 1)
    assert back.device == 1 and back.uids == spec.uids and back.tensors[x.uid].strides == x.strides
    assert back.tensors[s.uid].by_value and back.outputs == spec.outputs


def test_good_bindings_resolve_in_uid_order_with_scalars_by_value():
    g, x, w, s, y, spec = conv_spec()
    r = spec.resolve({x: arr(x), w.uid: arr(w, BASE + 4096), s: 0.5, y: arr(y, BASE + 8192)})
    assert r.ptrs[0] == BASE and r.ptrs[1] == BASE + 4096 and r.ptrs[3] == BASE + 8192
    assert r.scalars == struct.pack("<f", 0.5)
    assert ctypes.string_at(r.ptrs[2], 4) == struct.pack("<f", 0.5)  # s's pointer: a host buffer holding the value
    assert len(r.views) == 3 and not r.scratch


@pytest.mark.parametrize(
    "change,msg",
    [
        (lambda b, t: b.pop(t["w"]), r"unbound: tensor w \(uid 2\)"),
        (
            lambda b, t: b.__setitem__(t["x"], FakeCAI((2, 8, 6, 6), "<f4", ptr=BASE)),
            r"tensor x \(uid 1\): dtype float32, the plan expects float16",
        ),
        (
            lambda b, t: b.__setitem__(t["x"], FakeCAI((2, 8, 6, 5), "<f2", ptr=BASE)),
            r"tensor x \(uid 1\): shape \(2, 8, 6, 5\), the plan expects \(2, 8, 6, 6\)",
        ),
        (
            lambda b, t: b.__setitem__(t["x"], FakeCAI((2, 8, 6, 6), "<f2", ptr=BASE)),
            r"tensor x \(uid 1\): strides \(288, 36, 6, 1\), the plan expects \(288, 1, 48, 8\)",
        ),
        (
            lambda b, t: b.__setitem__(t["x"], arr(t["x"], device=1)),
            r"tensor x \(uid 1\): on cuda:1, but the plan was built for device=0",
        ),
        (lambda b, t: b.__setitem__(t["y"], arr(t["y"], ptr=BASE + 2)), r"pointer 0x7f0000000002 is not aligned to 16"),
        (lambda b, t: b.__setitem__(t["y"], BASE + 8), r"is not aligned to 16 bytes"),
        (lambda b, t: b.__setitem__(t["y"], 0), r"tensor mul \(uid 5\): raw pointer 0 is not a device pointer"),
        (lambda b, t: b.__setitem__(t["s"], "big"), r"tensor s \(uid 3\) is a by-value scalar: bind a Python number"),
        (lambda b, t: b.__setitem__(4, arr(t["y"])), r"uid 4 is not a non-virtual tensor of this plan"),
    ],
)
def test_bad_bindings_are_refused_with_the_tensor_named(change, msg):
    g, x, w, s, y, spec = conv_spec()
    t = {"x": x, "w": w, "s": s, "y": y}
    b = {x: arr(x), w: arr(w, BASE + 4096), s: 2.0, y: arr(y, BASE + 8192)}
    spec.resolve(dict(b))  # the unchanged bindings are fine
    change(b, t)
    with pytest.raises(BindingError, match=msg):
        spec.resolve(b)


def test_binding_type_errors():
    g, x, w, s, y, spec = conv_spec()
    with pytest.raises(TypeError, match="bindings must be a mapping"):
        spec.resolve([x])
    with pytest.raises(TypeError, match="binding keys must be Tensors or int uids, got str"):
        spec.resolve({"x": arr(x)})
    import numpy as np

    with pytest.raises(TypeError, match=r"tensor x \(uid 1\) is a host array"):
        spec.resolve({x: np.zeros((2, 8, 6, 6), np.float16), w: arr(w), s: 1.0, y: arr(y)})


def test_a_tensor_of_another_graph_with_other_dims_is_refused():
    g, x, w, s, y, spec = conv_spec()
    other = Graph().tensor((3, 3))  # uid 1 too, but not the plan's x
    with pytest.raises(BindingError, match="a tensor of another graph"):
        spec.resolve({other: arr(x), w: arr(w), s: 1.0, y: arr(y)})
    same = conv_spec()[1]  # the x of an identical graph is accepted
    spec.resolve({same: arr(x), w: arr(w), s: 1.0, y: arr(y)})


def test_scalar_bytes_per_dtype():
    assert spec_mod._scalar_bytes(1.5, "float32", "s") == struct.pack("<f", 1.5)
    assert spec_mod._scalar_bytes(1.5, "float64", "s") == struct.pack("<d", 1.5)
    assert spec_mod._scalar_bytes(1.5, "float16", "s") == struct.pack("<e", 1.5)
    assert spec_mod._scalar_bytes(1.5, "bfloat16", "s") == struct.pack("<f", 1.5)[2:]
    assert spec_mod._scalar_bytes(7, "int32", "s") == struct.pack("<i", 7)
    assert spec_mod._scalar_bytes(-7, "int64", "s") == struct.pack("<q", -7)


def bf16_bits(value):
    return struct.unpack("<H", spec_mod._scalar_bytes(value, "bfloat16", "s"))[0]


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_bfloat16_scalars_round_to_nearest_even():
    assert bf16_bits(1 / 3) == 0x3EAB  # float32 0x3EAAAAAB: truncation would give 0x3EAA
    assert bf16_bits(-1 / 3) == 0xBEAB
    assert bf16_bits(0.1) == 0x3DCD  # float32 0x3DCCCCCD
    assert bf16_bits(f32(0x3F808000)) == 0x3F80  # a tie: to the even neighbour, down
    assert bf16_bits(f32(0x3F818000)) == 0x3F82  # a tie: to the even neighbour, up
    assert bf16_bits(f32(0x3F807FFF)) == 0x3F80 and bf16_bits(f32(0x3F808001)) == 0x3F81
    assert bf16_bits(1.0) == 0x3F80 and bf16_bits(-2.0) == 0xC000 and bf16_bits(0.0) == 0
    assert bf16_bits(f32(0x7F7FFFFF)) == 0x7F80  # the largest float32 rounds to infinity
    assert bf16_bits(float("inf")) == 0x7F80 and bf16_bits(float("-inf")) == 0xFF80
    nan = bf16_bits(float("nan"))
    assert nan & 0x7F80 == 0x7F80 and nan & 0x007F  # still a NaN, not infinity
    assert bf16_bits(f32(0x7F800001)) & 0x7F == 0x40  # a signalling NaN whose payload truncation would drop


def test_constants_and_scratch_of_a_spec():
    g, x, w, s, y, _ = conv_spec()
    spec = PlanSpec(
        PlanSpec.of(g, 0).tensors,
        device=0,
        alignment=16,
        outputs=[y.uid],
        constants={s.uid: (0.25, "float32")},
        scratch=[y.uid],
    )
    r = spec.resolve({x: arr(x), w: arr(w, BASE + 4096)})  # s is a constant, y scratch: neither bound
    assert r.scalars == struct.pack("<f", 0.25) and r.scratch == [(3, y.uid)] and r.ptrs[3] == 0
    with pytest.raises(BindingError, match=r"tensor s \(uid 3\) is a constant of the graph \(value 0.25\)"):
        spec.resolve({x: arr(x), w: arr(w), s: 1.0})


def test_scratch_init_policy_reaches_the_spec_and_survives_serialization():
    g = Graph()
    q, k, v, o, do = (g.tensor((1, 2, 64, 64), None, "bfloat16", name=n) for n in ("q", "k", "v", "o", "do"))
    st = g.tensor((1, 2, 64, 1), name="stats")
    for t in g.sdpa_backward(q, k, v, o, do, st):
        g.mark_output(t)
    init = g.scratch_init()
    acc = next(t for t in g.scratch() if t.name == "dq_accum")
    rsum = next(t for t in g.scratch() if t.name == "softmax_sum")
    assert init == {rsum.uid: None, acc.uid: "zero"}  # only the dq accumulator needs clearing
    spec = PlanSpec.of(g, 0)
    assert spec.scratch == {rsum.uid, acc.uid} and spec.zero_scratch == {acc.uid}
    back = PlanSpec.from_dict(json.loads(json.dumps(spec.to_dict())), 0)
    assert back.scratch == spec.scratch and back.zero_scratch == spec.zero_scratch
    old = dict(spec.to_dict())
    del old["zero_scratch"]  # a plan serialized before the policy existed: nothing cleared
    assert PlanSpec.from_dict(old, 0).zero_scratch == frozenset()
    with pytest.raises(ValueError, match="scratch init policies"):
        PlanSpec(spec.tensors, device=0, alignment=16, scratch={acc.uid: "ones"})


def test_zero_scratch_positions_are_resolved_bound_or_not():
    g, x, w, s, y, _ = conv_spec()
    spec = PlanSpec(PlanSpec.of(g, 0).tensors, device=0, alignment=16, outputs=[y.uid], scratch={y.uid: "zero"})
    r = spec.resolve({x: arr(x), w: arr(w, BASE + 4096), s: 1.0})
    assert r.scratch == [(3, y.uid)] and r.zero == [(3, y.uid)]  # allocated by the plan, cleared
    r = spec.resolve({x: arr(x), w: arr(w, BASE + 4096), s: 1.0, y: arr(y, BASE + 8192)})
    assert r.scratch == [] and r.zero == [(3, y.uid)] and r.ptrs[3] == BASE + 8192  # bound: cleared too


def test_variant_pack_key_ignores_the_scalar_host_buffers():
    g, x, w, s, y, spec = conv_spec()
    b = {x: arr(x), w: arr(w, BASE + 4096), s: 0.5, y: arr(y, BASE + 8192)}
    rs = [spec.resolve(b) for _ in range(5)]
    keys = {plans_mod._pack_key(r.ptrs, r.by_value, 0, r.scalars) for r in rs}
    assert len(keys) == 1
    other = spec.resolve({**b, s: 0.25})
    assert plans_mod._pack_key(other.ptrs, other.by_value, 0, other.scalars) not in keys  # another value
    moved = spec.resolve({**b, y: arr(y, BASE + 16384)})
    assert plans_mod._pack_key(moved.ptrs, moved.by_value, 0, moved.scalars) not in keys  # another pointer
    assert plans_mod._pack_key(rs[0].ptrs, rs[0].by_value, BASE, rs[0].scalars) not in keys  # another workspace


def test_variant_pack_cache_hits_for_graphs_with_by_value_scalars():
    g, x, w, s, y, spec = conv_spec()
    p = plans_mod.ExecutionPlan.__new__(plans_mod.ExecutionPlan)  # no GPU: only the pack cache is exercised
    p.spec, p._packs, p._lock = spec, LRU("t_packs", 64), threading.Lock()
    b = {x: arr(x), w: arr(w, BASE + 4096), s: 0.5, y: arr(y, BASE + 8192)}
    packs = [p._variant_pack(spec.resolve(b), 0) for _ in range(5)]
    assert len(p._packs) == 1 and all(vp is packs[0] for vp in packs)
    held = [k for k in packs[0]._keep if isinstance(k, ctypes.Array)]
    assert held and ctypes.string_at(ctypes.addressof(held[0]), 4) == struct.pack("<f", 0.5)  # kept alive with it
    assert p._variant_pack(spec.resolve({**b, s: 2.0}), 0) is not packs[0] and len(p._packs) == 2


class _FakePlan:
    ptr, device = 0x1000, 0


class _FakePack:
    ptr = 0x2000


class _FakeAdapter:
    name = "fake"

    def __init__(self, current):
        self.current = current

    def current_stream(self, device):
        return self.current


def test_bound_plan_refuses_another_stream_than_its_buffers(monkeypatch):
    monkeypatch.setattr(
        spec_mod.runtime, "validate_stream", lambda s, ad, dev, name="stream", **kw: s
    )  # no driver here
    bound = plans_mod.BoundPlan(_FakePlan(), _FakePack(), [], None, 0x10, False, home=0x10)
    with pytest.raises(ValueError, match=r"bound for stream 0x10 .* cannot run on stream 0x20"):
        bound(stream=0x20)
    with pytest.raises(ValueError, match="cannot run on stream 0x30"):
        bound(stream=type("S", (), {"ptr": 0x30})())
    assert bound._stream_for(None) == 0x10 and bound._stream_for(0x10) == 0x10
    # bound without stream=: the library's current stream at call time must still be the bind-time one
    ad = _FakeAdapter(0x10)
    bound = plans_mod.BoundPlan(_FakePlan(), _FakePack(), [], ad, None, False, home=0x10)
    assert bound._stream_for(None) == 0x10
    ad.current = 0x40
    with pytest.raises(ValueError, match="cannot run on stream 0x40"):
        bound()
    # no plan-owned buffers (workspace= given, scratch bound): any stream
    free = plans_mod.BoundPlan(_FakePlan(), _FakePack(), [], ad, None, False)
    assert free._stream_for(0x20) == 0x20 and free._stream_for(None) == 0x40


def test_autotune_skips_candidates_needing_more_than_the_given_workspace(monkeypatch):
    import contextlib

    synced, runs = [], []

    class Adapter:
        name = "fake"

        def synchronize(self, device):
            synced.append(device)

    class Cand:
        def __init__(self, name, ws):
            self.name, self.workspace_size, self.timings = name, ws, []

        def bind(self, bindings, *, workspace=None, stream=None, unchecked=False):
            assert self.workspace_size <= 256, "a candidate needing more than workspace= was bound"
            return lambda: runs.append(self.name)  # a raw-pointer binding: no adapter of its own

    g, x, w, s, y, spec = conv_spec()
    ctx = search_mod.BuildContext(g, 0, EngineFilter(), ("k", 0, ()), cudnnkit.Settings(), "graph conv", spec)

    def env(c):
        c.adapter = Adapter()
        return contextlib.nullcontext()

    monkeypatch.setattr(autotune_mod, "build_context", lambda *a: ctx)
    monkeypatch.setattr(autotune_mod, "device_env", env)
    monkeypatch.setattr(autotune_mod, "iter_plans", lambda c, att: iter([Cand("eng1", 1024), Cand("eng2", 128)]))
    ws = FakeCAI((256,), "|u1", ptr=BASE)
    raw = {x: BASE, w: BASE + 4096, s: 1.0, y: BASE + 8192}  # checked before any candidate: all bound
    try:
        plan = autotune_mod.autotune(g, raw, workspace=ws, warmup=1, repeat=2, device=0, unchecked=True)
        assert plan.name == "eng2" and runs == ["eng2"] * 3
        assert plan.timings[0] == ("eng1", "needs 1024 bytes of workspace, workspace= has 256")
        assert plan.timings[1][0] == "eng2" and isinstance(plan.timings[1][1], float)
        assert synced == [0, 0]  # through the context's adapter, though the binding has none
        with pytest.raises(UnsupportedGraphError, match="needs 1024 bytes of workspace, workspace= has 16"):
            autotune_mod.autotune(
                g, raw, workspace=FakeCAI((16,), "|u1", ptr=BASE), device=0, max_candidates=1, unchecked=True
            )
    finally:
        plan_cache(0).clear()


# ----------------------------------------------------------------- the plan cache


def test_cache_lru_counts_hits_misses_and_evictions():
    c = PlanCache(0, maxsize=2)
    assert c.get("a") is None and c.stats["misses"] == 1
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # a is now the most recent
    c.put("c", 3)  # evicts b, the least recently used
    assert "b" not in c and "a" in c and "c" in c and len(c) == 2
    assert c.stats == {"size": 2, "maxsize": 2, "hits": 1, "misses": 1, "evictions": 1, "loaded": 0, "pending": 0}
    c.resize(1)
    assert len(c) == 1 and "c" in c and c.stats["evictions"] == 2
    c.clear()
    assert len(c) == 0 and c.stats["hits"] == 0


def test_cache_is_thread_safe():
    c = PlanCache(0, maxsize=64)
    errors = []

    def work(t):
        try:
            for i in range(2000):
                k = (t * 7 + i) % 100
                if c.get(k) is None:
                    c.put(k, k)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = c.stats
    assert not errors and s["size"] <= 64 and s["hits"] + s["misses"] == 8 * 2000
    assert all(c._plans.lookup(k) == k for k in c._plans)


def test_plan_cache_is_one_per_device_and_clear_caches_empties_it():
    assert plan_cache(3) is plan_cache(3) and plan_cache(3) is not plan_cache(4)
    plan_cache(3).put("k", object())
    cudnnkit.runtime.clear_caches()
    assert len(plan_cache(3)) == 0


def test_cache_deserialize_keeps_plans_of_this_cudnn_pending_by_key():
    g = Graph()
    g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3))))
    key = (g.key(), 0, EngineFilter.make().options_key())
    entry = {
        "format": "cudnnkit.plan/1",
        "cudnn_version": lib.version(),
        "key_digest": plans_mod.key_digest(key),
        "plan": "{}",
        "spec": PlanSpec.of(g, 0).to_dict(),
    }
    old = dict(entry, cudnn_version=90000, key_digest="x")
    doc = json.dumps({"format": "cudnnkit.plan/1-cache", "plans": [entry, old]})
    c = PlanCache(5)
    assert c.deserialize(doc) == 1 and c.stats["pending"] == 1 and c.stats["loaded"] == 1
    # the same graph on another device finds it (the device is not in the digest); another key does not
    assert c.pop_pending((key[0], 5, key[2])) == entry
    assert c.pop_pending(key) is None
    with pytest.raises(ValueError, match="not a cudnnkit plan cache"):
        c.deserialize(b'{"format": "other"}')
    assert json.loads(c.serialize())["plans"] == []


# ----------------------------------------------------------------- keys


def test_build_key_is_stable_and_sensitive():
    def make(dtype="float16", alignment=16, pad=1):
        g = Graph(alignment=alignment)
        x = g.tensor((2, 8, 6, 6), (288, 1, 48, 8), dtype)
        w = g.tensor((4, 8, 3, 3), (72, 1, 24, 8), dtype)
        g.mark_output(g.conv_fprop(x, w, pre_padding=pad), dtype)
        return g

    base = make().key()
    assert make().key() == base and hash(base) == hash(make().key())
    assert make(alignment=32).key() != base
    assert make(dtype="bfloat16").key() != base
    assert make(pad=0).key() != base
    for kw in (
        {"deterministic": True},
        {"allow_tf32": False},
        {"workspace_limit": 0},
        {"heuristic_mode": "b"},
        {"autotune": "exhaustive"},
    ):
        with cudnnkit.settings(**kw):
            assert make().key() != base, kw


def test_build_refuses_bad_graphs_and_options_before_any_gpu_work():
    g = Graph()
    g.tensor((2, 3))
    with pytest.raises(cudnnkit.graph.GraphError, match="no operations"):
        g.build(0)
    g = Graph()
    g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3))))
    with pytest.raises(TypeError, match=r"unknown build option\(s\) \['fast'\]"):
        g.build(0, fast=True)
    with pytest.raises(ValueError, match="unknown numerical note"):
        g.build(0, deny_numerical=["SLOW"])
    with pytest.raises(ValueError, match="max_candidates must be at least 1"):
        g.autotune({}, max_candidates=0)


class _NoCudaAdapter:
    """An array library without CUDA, as a CPU build of torch is: it cannot name a current device, and any
    handle or stream lookup would be GPU work that must not happen."""

    name = "torch"

    def __init__(self, count=0):
        self.count = count

    def current_device(self):
        raise AssertionError("Torch not compiled with CUDA enabled")

    def device_count(self):
        return self.count

    def current_stream(self, device):
        raise AssertionError("no stream may be asked for")

    def device_guard(self, device):
        raise AssertionError("no device may be selected")


def _relu_graph(mark=True):
    g = Graph()
    y = g.pointwise("RELU_FWD", g.tensor((2, 3)))
    if mark:
        g.mark_output(y)
    return g


def test_build_checks_the_graph_before_looking_up_the_device(monkeypatch):
    monkeypatch.setattr(cache_mod.adapters, "available", lambda: [_NoCudaAdapter()])
    monkeypatch.setattr(cache_mod.adapters, "in_use", lambda: [_NoCudaAdapter()])
    for device in (None, 0):
        with pytest.raises(cudnnkit.graph.GraphError, match="the graph has no operations"):
            Graph().build(device)
        with pytest.raises(cudnnkit.graph.GraphError, match="virtual result nobody reads: mark_output"):
            _relu_graph(mark=False).build(device)
    # a good graph: the machine's error, in words, not the library's assertion
    with pytest.raises(RuntimeError, match=r"no current CUDA device: torch could not name one"):
        _relu_graph().build()
    with pytest.raises(RuntimeError, match=r"torch sees no CUDA device .*device=0"):
        _relu_graph().build(0)
    monkeypatch.setattr(cache_mod.adapters, "available", lambda: [_NoCudaAdapter(count=2)])
    monkeypatch.setattr(cache_mod.adapters, "in_use", lambda: [_NoCudaAdapter(count=2)])
    with pytest.raises(ValueError, match=r"device=2, but torch sees 2 CUDA device\(s\): 0 to 1"):
        _relu_graph().build(2)


@pytest.mark.parametrize(
    "device, exc, msg",
    [
        (-1, ValueError, r"device must be a CUDA device ordinal \(an int >= 0\) or None, got -1"),
        ("cuda:0", TypeError, r"device must be a CUDA device ordinal .* got str 'cuda:0'"),
        (1.0, TypeError, r"device must be a CUDA device ordinal .* got float 1.0"),
        (True, TypeError, r"device must be a CUDA device ordinal .* got True"),
    ],
)
def test_build_refuses_a_bad_device_naming_it(monkeypatch, device, exc, msg):
    monkeypatch.setattr(cache_mod.adapters, "available", lambda: [_NoCudaAdapter(count=1)])
    monkeypatch.setattr(cache_mod.adapters, "in_use", lambda: [_NoCudaAdapter(count=1)])
    with pytest.raises(exc, match=msg):
        _relu_graph().build(device)
    with pytest.raises(exc, match=msg):
        plan_cache(device)
    with pytest.raises(exc, match=msg):
        cudnnkit.graph.load_plan(json.dumps({"format": "cudnnkit.plan/1", "cudnn_version": lib.version()}), device)


def test_a_numpy_integer_device_is_a_device():
    import numpy as np

    assert plan_cache(np.int64(3)) is plan_cache(3)


def test_build_with_a_cpu_build_of_torch_says_so_after_checking_the_graph():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch has CUDA here")
    for device in (None, 0):
        with pytest.raises(cudnnkit.graph.GraphError, match="the graph has no operations"):
            Graph().build(device)
        with pytest.raises(cudnnkit.graph.GraphError, match="mark_output"):
            _relu_graph(mark=False).build(device)
    with pytest.raises(RuntimeError, match="no current CUDA device: torch could not name one"):
        _relu_graph().build()
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        _relu_graph().build(0)


def test_a_boolean_tensor_binds_its_bits(monkeypatch):
    """A non-virtual boolean tensor is bit-packed (cuDNN reads element offset o at bit o % 8 of byte o // 8,
    measured on the H100 with cuDNN 9.19): the batch-norm forward's ReLU mask of cudnn-frontend's BN_RELU pattern,
    marked channels-last, addresses N*C*H*W / 8 bytes; it binds a dense uint8 array of at least that many bytes
    (any shape), and a one-byte-per-element bool array (read as bits, it would be wrong), a short one or a
    strided one is refused naming the tensor, before any GPU work; a raw pointer is checked for the packed bytes."""
    from cudnnkit.graph import Graph
    from cudnnkit.graph.plan.spec import PlanSpec

    from .fuzz.materialize import FakeBackend
    from .fuzz.model import A

    n, c, h, w = 4, 16, 3, 5
    cl = (c * h * w, 1, w * c, c)
    g = Graph(compute_dtype="float32", intermediate_dtype="float32")
    x = g.tensor((n, c, h, w), cl, "float32", name="x")
    s, b = (g.tensor((1, c, 1, 1), None, "float32", name=k) for k in ("scale", "bias"))
    bn = g.norm_forward("batch", x, s, b, phase="training", epsilon=1e-5)
    r = g.pointwise("RELU_FWD", bn.y)
    y = g.mark_output(r)
    m = g.mark_output(g.pointwise("CMP_GT", r, g.scalar(0.0), dtype="bool", name="mask"), "bool", strides=cl)
    mean, inv = g.mark_output(bn.mean), g.mark_output(bn.inv_variance)
    spec = PlanSpec.of(g, 0)
    assert spec.tensors[m.uid].dtype == "bool"
    assert spec.nbytes[m.uid] == n * c * h * w // 8 == 120
    assert spec.nbytes[y.uid] == n * c * h * w * 4
    back = FakeBackend()
    with back.installed():

        def arr(shape, dtype="float32", layout=("c",)):
            return back.array(A(tuple(shape), dtype, layout=layout), None, "fakeA", None)

        bind = {x: arr((n, c, h, w), layout=("perm", (0, 2, 3, 1))), s: arr((1, c, 1, 1)), b: arr((1, c, 1, 1)),
                y: arr((n, c, h, w), layout=("perm", (0, 2, 3, 1))), mean: arr((1, c, 1, 1)),
                inv: arr((1, c, 1, 1))}  # fmt: skip
        for ok in ((n, h, w, c // 8), (120,), (200,)):  # any dense shape of enough bytes
            spec.resolve({**bind, m: arr(ok, "uint8")})
        for bad, msg in [
            (arr((n, c, h, w), "bool"), r"tensor mask \(uid \d+\) is a bit-packed boolean tensor .* bind a uint8 "
                                        r"array of at least 120 byte\(s\), got bool \(4, 16, 3, 5\)"),
            (arr((119,), "uint8"), r"tensor mask .*: 119 byte\(s\), the bit-packed boolean tensor needs 120"),
            (arr((n, h, w, c // 4), "uint8", ("gap", 3, 2)), r"tensor mask .*must be dense in C order"),
        ]:  # fmt: skip
            with pytest.raises(BindingError, match=msg):
                spec.resolve({**bind, m: bad})
    checked = []
    import cudnnkit.graph.plan.spec as S

    monkeypatch.setattr(S, "check_pointer", lambda p, nb, dev, label: checked.append((label, nb)))
    with back.installed():
        spec.resolve({**bind, m: 1 << 20})
    assert [nb for label, nb in checked if "mask" in label] == [120]


# ----------------------------------------------------------------- dynamic shapes and the kernel cache


def _clip_graph(dims, strides, clip=6.0, dynamic=True):
    g = Graph(dynamic_shape=dynamic)
    g.mark_output(g.pointwise("RELU_FWD", g.tensor(dims, strides), relu_upper_clip=clip))
    return g


def _sdpa_graph(s):
    g = Graph(dynamic_shape=True)
    q, k, v = (g.tensor((2, 4, s, 64), (4 * s * 64, s * 64, 64, 1), "bfloat16", name=n) for n in "qkv")
    g.sdpa_forward(q, k, v, causal=True)
    return g


def test_topology_key_keeps_everything_but_the_sizes():
    """``topology_key()``: equal for graphs that differ only in non-unit sizes (SDPA's transposed K view too);
    different for another dtype, operation attribute, layout, size-1 pattern or the static flag."""
    from .test_graph_cpu import conv_bias_relu

    a = conv_bias_relu(dims=(8, 64, 16, 16), dynamic_shape=True)[0]
    b = conv_bias_relu(dims=(2, 64, 40, 24), dynamic_shape=True)[0]
    assert a.dynamic_shape and a.topology_key() == b.topology_key() and a.key() != b.key()
    static = conv_bias_relu(dims=(8, 64, 16, 16))[0]
    assert not static.dynamic_shape and a.key() != static.key() and a.topology_key() != static.topology_key()
    assert (
        conv_bias_relu(dims=(8, 64, 16, 16), dtype="bfloat16", dynamic_shape=True)[0].topology_key() != a.topology_key()
    )
    assert _sdpa_graph(128).topology_key() == _sdpa_graph(512).topology_key()
    nchw, nhwc = _clip_graph((2, 4, 6, 8), (192, 48, 8, 1)), _clip_graph((2, 4, 6, 8), (192, 1, 32, 4))
    assert (
        len({nchw.topology_key(), nhwc.topology_key(), _clip_graph((2, 4, 6, 8), (192, 48, 8, 1), 5.0).topology_key()})
        == 3
    )
    # size-1 dims: their strides say nothing (channels-last and C order of one channel are the same memory)...
    assert (
        _clip_graph((2, 1, 6, 8), (48, 1, 8, 1)).topology_key()
        == _clip_graph((4, 1, 3, 5), (15, 15, 5, 1)).topology_key()
    )
    # ...but which dims are 1 is kept (a per-channel and a scalar broadcast are not one topology)
    assert (
        _clip_graph((1, 4, 1, 1), (4, 1, 1, 1)).topology_key() != _clip_graph((1, 1, 1, 1), (1, 1, 1, 1)).topology_key()
    )
    assert a.lower().op_graph.get("CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED") is True
    assert static.lower().op_graph.get("CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED") is False
    with pytest.raises(TypeError, match="dynamic_shape"):
        Graph(dynamic_shape="yes")


def test_dynamic_shape_plans_are_finalized_with_one_kernel_cache_per_topology_and_device(monkeypatch):
    """Each candidate plan of a dynamic-shape graph is finalized with the finalized KERNEL_CACHE descriptor of its
    (topology, device), set as CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE under the cache's lock; the cache keeps the
    lowering handle; a static graph's plans get none; ``clear_caches()`` drops them."""
    from cudnnkit.graph.plan import kernel_cache as kc_mod

    from .test_graph_cpu import conv_bias_relu

    a = conv_bias_relu(dims=(8, 64, 16, 16), dynamic_shape=True)[0]
    b = conv_bias_relu(dims=(2, 64, 40, 24), dynamic_shape=True)[0]
    static = conv_bias_relu(dims=(8, 64, 16, 16))[0]
    finalized = []  # (the plan's attributes, whether its cache's lock was held) per plan finalize

    class Plan:
        def __init__(self, kind):
            assert kind == "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR"
            self.attrs = {}

        def set(self, name, value):
            self.attrs[name] = value

        def finalize(self):
            kc = next((k for k in caches if k.desc is self.attrs.get("CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE")), None)
            finalized.append((self.attrs, kc is not None and kc.lock.locked()))
            return self

    class Handle:
        ptr = None

    handle = Handle()
    caches = []
    real = kc_mod.kernel_cache

    def recording(*args):
        got = real(*args)
        if got is not None and got not in caches:
            caches.append(got)
        return got

    monkeypatch.setattr(search_mod, "BackendDescriptor", Plan)
    monkeypatch.setattr(search_mod, "kernel_cache", recording)
    monkeypatch.setattr(search_mod, "candidates", lambda low, flt, mode, att: iter([("cfg1", eng()), ("cfg2", eng())]))
    monkeypatch.setattr(
        search_mod, "_plan_from", lambda ctx, desc, info, keep, att: type("P", (), {"workspace_size": 0})()
    )
    kc_mod._CACHES.clear()
    try:
        for g, device in ((a, 0), (b, 0), (static, 0), (a, 1)):
            ctx = search_mod.BuildContext(g, device, EngineFilter(), ("k", device, ()), cudnnkit.Settings(), "g", None,
                                          None, handle)  # fmt: skip
            assert len(list(search_mod.iter_plans(ctx, []))) == 2
        assert len(caches) == 2 and len(kc_mod._CACHES) == 2  # (topology, 0) and (topology, 1)
        for kc in caches:
            assert kc.desc.finalized and kc.desc.type.name == "CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR"
            assert kc.handle is handle
        given = [attrs.get("CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE") for attrs, _ in finalized]
        assert given[:4] == [caches[0].desc] * 4 and given[4:6] == [None, None] and given[6:] == [caches[1].desc] * 2
        assert [locked for _, locked in finalized] == [True] * 4 + [False] * 2 + [True] * 2
        assert all(attrs["CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG"] in ("cfg1", "cfg2") for attrs, _ in finalized)
        cudnnkit.runtime.clear_caches()
        assert len(kc_mod._CACHES) == 0
    finally:
        kc_mod._CACHES.clear()
