"""ops/_primitive.py on the CPU: the registry, the router and the op-level plan cache, with a toy primitive whose
"cuDNN calls" are recorded (fake CAI arrays: nothing reaches the device)."""

from __future__ import annotations

import logging

import pytest

import cudnnkit
from cudnnkit.graph import UnsupportedGraphError
from cudnnkit.ops import _primitive as P
from cudnnkit.runtime import FLOATS

from .conftest import FakeCAI


def fake(shape=(2, 3, 4), typestr="<f4"):
    return FakeCAI(shape, typestr)


def test_registry_lists_the_migrated_ops_once():
    import cudnnkit.ops.softmax  # noqa: F401
    import cudnnkit.ops.tensor  # noqa: F401

    for name in ("softmax_forward", "softmax_backward", "set_tensor", "scale_tensor", "add_tensor"):
        p = P.REGISTRY[name]
        assert p.name == name and p.forms == ("legacy",)
    assert P.REGISTRY["softmax_forward"].backward == "softmax_backward"
    with pytest.raises(ValueError, match="already registered"):
        P.register(P.REGISTRY["set_tensor"])


def _toy(graph_fails: bool = False, name: str = "toy"):
    calls: list[str] = []
    described: list[tuple] = []

    def describe(resolved):
        def d(shape, strides):
            described.append((shape, strides))
            return (shape, strides)

        return d

    def graph(call):
        calls.append("graph")
        if graph_fails:
            raise UnsupportedGraphError("toy graph", [])

    p = P.Primitive(
        name,
        inputs=(P.Operand("x", FLOATS),),
        outputs=(P.Output("out", like="x"),),
        resolve=lambda views, kw: (kw.get("k", 0),),
        describe=describe,
        legacy=lambda call: calls.append("legacy"),
        graph=graph,
        layout_what="toy",
        blend=True,
    )
    return p, calls, described


def test_router_reads_prefer_and_float64():
    p, calls, _ = _toy()
    p({"x": fake()}, out=fake())
    assert calls == ["graph"] and P.last_path() == ("toy", "graph")
    with cudnnkit.settings(prefer="legacy"):
        p({"x": fake()}, out=fake())
    assert calls[-1] == "legacy" and P.last_path() == ("toy", "legacy")
    p({"x": fake(typestr="<f8")}, out=fake(typestr="<f8"))  # float64: the graph API has none
    assert calls[-1] == "legacy"


def test_router_falls_back_once_and_remembers_the_refusal(caplog):
    p, calls, _ = _toy(graph_fails=True, name="toy_refused")
    with caplog.at_level(logging.DEBUG, logger="cudnnkit"):
        p({"x": fake()}, out=fake(), k=1)
    assert calls == ["graph", "legacy"] and P.last_path() == ("toy_refused", "legacy")
    assert "graph refused" in caplog.text
    p({"x": fake()}, out=fake(), k=1)  # the refused key goes straight to legacy
    assert calls == ["graph", "legacy", "legacy"]
    with cudnnkit.settings(prefer="graph"), pytest.raises(UnsupportedGraphError):
        p({"x": fake()}, out=fake(), k=2)


def test_a_refused_graph_the_legacy_call_cannot_take_is_one_clear_error():
    """cuDNN refusing the graph of a call whose legacy form cannot take it (a graph-only activation, say) raises
    one ValueError saying both, naming the argument, with the graph's refusal as its cause."""
    p, calls, _ = _toy(graph_fails=True, name="toy_neither")
    q = P.Primitive(p.name + "_2", inputs=p.inputs, outputs=p.outputs, resolve=p.resolve, describe=p.describe,
                    legacy=p.legacy, graph=p.graph, layout_what="toy", blend=True,
                    legacy_refuses=lambda r: "mode 'gelu' (the legacy API has no such mode)" if r[0] else None)  # fmt: skip
    with pytest.raises(
        ValueError, match="no engine for this call's graph.*legacy call cannot take it: mode 'gelu'"
    ) as e:
        q({"x": fake()}, out=fake(), k=1)
    assert isinstance(e.value.__cause__, UnsupportedGraphError) and calls == ["graph"]


def test_op_level_cache_hit_describes_nothing():
    p, calls, described = _toy(name="toy_cache")
    before = P.plan_cache_info()["hits"]
    p({"x": fake()}, out=fake(), k=7)
    n = len(described)
    assert n > 0
    for _ in range(3):
        p({"x": fake()}, out=fake(), k=7)
    assert len(described) == n  # three hits: no layout planning
    assert P.plan_cache_info()["hits"] == before + 3
    assert calls == ["graph"] * 4


def test_a_primitive_needs_a_form_and_earlier_like():
    with pytest.raises(ValueError, match="neither a legacy call nor a graph"):
        P.Primitive("nothing", inputs=(P.Operand("x"),))
    with pytest.raises(ValueError, match="is not an earlier operand"):
        P.Primitive("bad", inputs=(P.Operand("x", like="y"), P.Operand("y")), legacy=lambda c: None)


def test_every_primitive_is_fuzzed_with_its_own_operands():
    # the fuzzer (tests/fuzz) must cover every registered primitive, with roles that match its declaration: a
    # primitive added without a fuzz spec, or whose operands drift from the spec's, fails here
    import cudnnkit.ops  # noqa: F401  (registers every primitive)

    from .fuzz.specs import SPECS

    for name, p in P.REGISTRY.items():
        assert name in SPECS, f"primitive {name} has no fuzz spec in tests/fuzz/specs.py"
        roles = SPECS[name].roles
        for op in p.inputs:
            if op.name in SPECS[name].from_setup:
                continue  # made by the spec's setup (the forward), as the op's own forward would
            assert op.name in roles, (name, op.name)
            assert roles[op.name].required == (not op.optional), (name, op.name)
            if op.dtypes is not None:
                assert set(roles[op.name].dtypes) <= set(op.dtypes), (name, op.name, roles[op.name].dtypes)
            if op.flags & P.WRITTEN:
                assert roles[op.name].kind == "inout", (name, op.name)
        for o in p.outputs:
            assert roles.get(o.name) is not None and roles[o.name].kind == "out", (name, o.name)
        if p.blend:
            assert set(p.blend_names) <= set(SPECS[name].params), (name, p.blend_names)


def test_express_path_skips_the_checks_and_passes_this_calls_pointers():
    """A legacy-only primitive called again with arrays of the same metadata (fresh pointers) and the same
    keywords takes the express path: resolve and describe are not run again, the legacy call sees this call's
    pointers and a newly allocated output; a changed keyword, a ``stream=`` or ``enabled(False)`` take the full
    sequence."""
    import numpy as np

    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A

    resolved, described, seen = [], [], []

    def describe(r):
        def d(shape, strides):
            described.append(shape)
            return (shape, strides)

        return d

    def resolve(views, kw):
        resolved.append(kw.get("k"))
        return (kw.get("k"),)

    def legacy(call):
        seen.append((call.views["x"].ptr, call.views["out"].ptr, call.resolved, call.alpha is not None))

    p = P.Primitive(
        "toy_express",
        inputs=(P.Operand("x", FLOATS),),
        outputs=(P.Output("out", like="x"),),
        resolve=resolve,
        describe=describe,
        legacy=legacy,
        layout_what="toy",
        blend=True,
    )
    b = FakeBackend()
    with b.installed():
        adapters.KEYED[FakeArray] = lambda a: b.adapters[a.lib].key(a)
        try:
            _express.entries.clear()

            def arr():
                return b.array(A((2, 3, 4), "float32"), np.zeros((2, 3, 4)), "fakeA", None)

            xs = [arr() for _ in range(5)]
            outs = [p({"x": x}, k=1) for x in xs[:4]]
            # call 1 misses the op-level cache, call 2 hits it and records the express entry, 3 and 4 are express
            assert resolved == [1, 1] and len(described) == 1
            assert [s[0] for s in seen] == [x.ptr for x in xs[:4]]
            assert [s[1] for s in seen] == [o.ptr for o in outs] and len({o.ptr for o in outs}) == 4
            assert all(s[2] == (1,) and s[3] for s in seen)
            assert _express.info()["hits"] == 2
            p({"x": xs[4]}, k=2)  # another keyword value: the full sequence
            assert resolved[-1] == 2
            p({"x": xs[4]}, k=1, stream=0)  # stream=: never express
            assert resolved[-1] == 1 and len(resolved) == 4
            _express.enabled(False)
            p({"x": xs[4]}, k=1)
            assert len(resolved) == 5 and _express.info()["size"] == 0
        finally:
            _express.enabled(True)
            adapters.KEYED.pop(FakeArray, None)
            _express.entries.clear()


def test_express_signature_keys_keyword_types_and_tuples_and_keeps_pointer_order():
    """The signature's keyword part tells ``1``, ``1.0`` and ``True`` apart (equal and alike-hashing values of
    other types resolve differently), keeps a tuple's element types, takes an object by identity, and lists the
    operands' pointers before the ``out=`` arrays' (what ``_fire`` indexes by)."""
    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    class Arr:
        def __init__(self, ptr):
            self.ptr = ptr

    adapters.KEYED[Arr] = lambda a: (("arr", (2, 3)), a.ptr, None)
    try:
        p = P.Primitive("toy_sig", inputs=(P.Operand("x", FLOATS),), outputs=(P.Output("out", like="x"),),
                        legacy=lambda c: None, resolve=lambda v, k: (), describe=lambda r: None)  # fmt: skip

        def sig(**kw):
            return _express.signature(p, {"x": Arr(0x1000)}, kw)

        keys = {sig(k=v)[0] for v in (1, 1.0, True)}
        assert len(keys) == 3
        assert sig(k=(1, 2))[0] != sig(k=(1.0, 2))[0] and sig(k=(1, 2))[0] == sig(k=(1, 2))[0]
        state = object()
        key, ptrs, objs = sig(k=1, out=Arr(0x2000), state=state)
        assert ptrs == [0x1000, 0x2000] and objs == [state]
        assert key == sig(k=1, out=Arr(0x3000), state=state)[0]  # another out pointer, the same signature
        assert key != sig(k=1, out=Arr(0x2000), state=object())[0]
        assert sig(k=1)[0] != sig(j=1)[0]  # the keyword's name is part of it
    finally:
        adapters.KEYED.pop(Arr, None)


def test_rnn_is_declared_and_runs_through_the_registry():
    """The RNN keeps its own sequence (``Primitive.runner``) but is declared like every op: operands, the ``out=``
    output, what it returns after it, residuals and backward; calling the primitive calls the function."""
    from cudnnkit import ops

    fwd, bwd = P.REGISTRY["rnn_forward"], P.REGISTRY["rnn_backward"]
    assert fwd.runner is ops.rnn_forward and bwd.runner is ops.rnn_backward and fwd.forms == ("legacy",)
    assert [op.name for op in fwd.inputs] == ["x", "w", "hx", "cx"] and fwd.extras == ("hy", "cy", "reserve")
    assert fwd.backward == "rnn_backward" and set(fwd.residuals) >= {"x", "w", "out", "reserve"}
    rnn = ops.RNN("gru", 4, 5)
    for call in (lambda: fwd({"x": fake((3, 2, 5)), "w": fake((100,))}, rnn=rnn),
                 lambda: ops.rnn_forward(fake((3, 2, 5)), fake((100,)), rnn=rnn)):  # fmt: skip
        with pytest.raises(ValueError, match="x has feature size 5 but the RNN's input_size is 4"):
            call()


class _FakePlan:
    """An ExecutionPlan stand-in for the graph-form tests: bindable uids (out, x), a workspace size, and the
    pointers each ``execute_raw`` got."""

    name = "fake"
    bindable_uids = (2, 1)

    def __init__(self, workspace: int):
        self.workspace_size = workspace
        self.calls: list[tuple] = []
        self.builds = 0

    def execute_raw(self, handle, ptrs, ws):
        self.calls.append((handle, tuple(ptrs), ws))


def _fake_graph_primitive(name: str, workspace: int = 0, blend: bool = False, prepare=None, extras: tuple = ()):
    """A graph-only primitive ``x -> out`` (2, 3, 4) whose graph "builds" to a :class:`_FakePlan`; each of
    ``extras`` (made by ``prepare``) is bound after them, with uids 3, 4, ..."""
    from cudnnkit.ops import _graphform

    plan = _FakePlan(workspace)
    plan.bindable_uids = (2, 1, *range(3, 3 + len(extras)))

    class T:
        def __init__(self, uid):
            self.uid = uid

    class G:
        def build(self, device=None):
            plan.builds += 1
            return plan

    out = P.Output("out", shape=lambda r: (2, 3, 4), blend=("alpha", "beta") if blend else None)
    bind = lambda c: (G(), {T(1): "x", T(2): "out"} | {T(3 + i): n for i, n in enumerate(extras)})  # noqa: E731
    p = P.Primitive(name, inputs=(P.Operand("x", FLOATS),), outputs=(out,), empty=lambda r: False, extras=extras,
                    graph=_graphform.graph_form(bind, prepare))  # fmt: skip
    return p, plan


def _fake_array(b, layout=("c",)):
    import numpy as np

    from .fuzz.model import A

    return b.array(A((2, 3, 4), "float32", layout=layout), np.zeros((2, 3, 4)), "fakeA", None)


def test_express_graph_hits_bind_only_pointers(monkeypatch):
    """A graph-form call, repeated, is planned once; its express hits run the cached plan with this call's
    pointers in the plan's order, a new output and a workspace (``_fire_graph``)."""
    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend

    fast = []
    real = P._fire_graph
    monkeypatch.setattr(P, "_fire_graph", lambda *a: fast.append(real(*a)) or fast[-1])
    monkeypatch.setattr(P, "get_handle", lambda *a: type("H", (), {"ptr": 0xABC})())
    p, plan = _fake_graph_primitive("toy_graph_express", workspace=64)
    b = FakeBackend()
    with b.installed():
        adapters.KEYED[FakeArray] = lambda a: b.adapters[a.lib].key(a)
        try:
            _express.entries.clear()
            xs = [_fake_array(b) for _ in range(4)]
            outs = [p({"x": x}) for x in xs]
            assert plan.builds == 1 and len(plan.calls) == 4
            for x, out, (handle, ptrs, ws) in zip(xs, outs, plan.calls):
                assert isinstance(handle, int) and ptrs == (out.ptr, x.ptr) and ws != 0
            assert len(fast) == 3 and all(f is not P.MISSING for f in fast)  # calls 2 to 4: pointers only
            assert P.last_path() == ("toy_graph_express", "graph")
        finally:
            adapters.KEYED.pop(FakeArray, None)
            _express.entries.clear()


def test_express_graph_hits_make_the_forms_new_extras_too(monkeypatch):
    """A graph form whose ``prepare`` makes an extra the call returns (batch norm's saved statistics) keeps its
    pointer-only express form: each hit allocates that extra anew beside the output, binds it where the plan
    wants it, and returns it; the plan is built once."""
    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend

    fast = []
    real = P._fire_graph
    monkeypatch.setattr(P, "_fire_graph", lambda *a: fast.append(real(*a)) or fast[-1])
    monkeypatch.setattr(P, "get_handle", lambda *a: type("H", (), {"ptr": 0xABC})())

    def prepare(c):
        arr, c.views["stat"] = c.launch.empty((3,), "float32", name="stat")
        c.extra["stat"] = arr

    p, plan = _fake_graph_primitive("toy_graph_extras", prepare=prepare, extras=("stat",))
    b = FakeBackend()
    with b.installed():
        adapters.KEYED[FakeArray] = lambda a: b.adapters[a.lib].key(a)
        try:
            _express.entries.clear()
            xs = [_fake_array(b) for _ in range(4)]
            got = [p({"x": x}) for x in xs]
            assert plan.builds == 1 and len(plan.calls) == 4
            for x, (o, stat), (_, ptrs, _) in zip(xs, got, plan.calls):
                assert stat is not None and stat.shape == (3,) and ptrs == (o.ptr, x.ptr, stat.ptr)
            assert len({stat.ptr for _, stat in got}) == 4  # a new extra per call, not the first call's
            assert len(fast) == 3 and all(f is not P.MISSING for f in fast)
        finally:
            adapters.KEYED.pop(FakeArray, None)
            _express.entries.clear()


def test_graph_path_blends_through_a_temporary(monkeypatch):
    """alpha/beta on the graph path: the plan writes a temporary, cudnnAddTensor(alpha, tmp, beta, out) blends it
    into the given output; such a call keeps no pointer-only express form."""
    from cudnnkit import lib
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend

    adds = []
    p, plan = _fake_graph_primitive("toy_graph_blend", blend=True)
    b = FakeBackend()
    with b.installed():
        monkeypatch.setattr(lib, "cudnnAddTensor", lambda h, a, ad, ap, bb, cd, cp: adds.append(
            (a._obj.value, ap, bb._obj.value, cp)))  # fmt: skip
        _express.entries.clear()
        x, out = _fake_array(b), _fake_array(b)
        assert p({"x": x}, out=out, alpha=2.0, beta=0.5) is out
        ((_, (tmp, xp), _),) = plan.calls
        assert xp == x.ptr and tmp != out.ptr and adds == [(2.0, tmp, 0.5, out.ptr)]
        p({"x": x}, out=out)  # no blend: straight into out
        assert plan.calls[-1][1] == (out.ptr, x.ptr) and len(adds) == 1
        _express.entries.clear()


def test_graph_form_copies_misaligned_inputs_and_writes_misaligned_outputs_through_a_temporary(monkeypatch):
    """cuDNN's graph engines refuse pointers off 16 bytes at execution (measured): a misaligned input reaches the
    plan as an aligned copy, a misaligned output as an aligned temporary copied back into it."""
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend
    from .graph_fakes import recording_copies

    copies = recording_copies(monkeypatch)
    p, plan = _fake_graph_primitive("toy_graph_align")
    b = FakeBackend()
    with b.installed():
        _express.entries.clear()
        x, out = _fake_array(b, ("offset", 1)), _fake_array(b, ("offset", 2))
        assert x.ptr % 16 and out.ptr % 16
        assert p({"x": x}, out=out) is out
        ((_, (o, xp), _),) = plan.calls
        assert o % 16 == 0 and xp % 16 == 0 and o != out.ptr and xp != x.ptr
        assert copies[-1] == "out"  # the temporary written back into the caller's out
        _express.entries.clear()


def _failing_graph(monkeypatch, name, failure, legacy, **kw):
    """A primitive ``x -> out`` (2, 3, 4) whose graph form fails: cuDNN refuses its graph (``"unsupported"``) or
    its workspace cannot be allocated (``"workspace"``, set on ``Launch`` here); ``legacy`` its legacy form, ``kw``
    more of the declaration (``legacy_refuses``)."""
    from cudnnkit.ops import _graphform

    class G:
        def build(self, device=None):
            if failure == "unsupported":
                raise UnsupportedGraphError("toy", [])
            return _FakePlan(1 << 20)

    class T:
        def __init__(self, uid):
            self.uid = uid

    if failure == "workspace":
        from cudnnkit.runtime.launch import Launch

        def no_memory(self, n, zeroed=False):
            raise MemoryError("no room")

        monkeypatch.setattr(Launch, "workspace", no_memory)
    out = P.Output("out", shape=lambda r: (2, 3, 4))
    return P.Primitive(name, inputs=(P.Operand("x", FLOATS),), outputs=(out,), empty=lambda r: False, legacy=legacy,
                       graph=_graphform.graph_form(lambda c: (G(), {T(1): "x", T(2): "out"})), **kw)  # fmt: skip


@pytest.mark.parametrize("failure", ["unsupported", "workspace"])
def test_a_graph_form_that_fails_hands_the_legacy_form_the_callers_arrays(monkeypatch, failure):
    """The graph form swaps in temporaries (here: a misaligned output's aligned one) before it builds; when cuDNN
    refuses the graph, or its workspace cannot be allocated, the legacy form writes the caller's own ``out``, not
    a temporary no one copies back."""
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend

    seen = []
    p = _failing_graph(monkeypatch, f"toy_graph_fails_{failure}", failure, lambda c: seen.append(c.views["out"].ptr))
    b = FakeBackend()
    with b.installed():
        _express.entries.clear()
        x, given = _fake_array(b), _fake_array(b, ("offset", 2))
        assert given.ptr % 16
        assert p({"x": x}, out=given) is given
        assert seen == [given.ptr] and P.last_path() == (p.name, "legacy")
        _express.entries.clear()


@pytest.mark.parametrize("failure", ["unsupported", "workspace"])
def test_a_graph_form_that_fails_where_the_legacy_form_refuses_runs_nothing(monkeypatch, failure):
    """A call only the graph can do (batch norm's ReLU mask: the legacy call would not write it): when cuDNN
    refuses the graph, or its workspace cannot be allocated, the call raises (``GraphOnlyError``, a ValueError;
    MemoryError) naming the legacy form's refusal, and the legacy form never runs (it would return an output
    nobody wrote)."""
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend

    ran = []
    p = _failing_graph(monkeypatch, f"toy_graph_only_{failure}", failure, ran.append,
                       legacy_refuses=lambda r: "the toy's mask")  # fmt: skip
    b = FakeBackend()
    with b.installed():
        _express.entries.clear()
        err = MemoryError if failure == "workspace" else P.GraphOnlyError
        with pytest.raises(err, match="legacy call cannot take (it|this call): the toy's mask"):
            p({"x": _fake_array(b)})
        assert ran == []
        _express.entries.clear()


def test_an_output_declares_its_own_dtype():
    """``Output(dtype=...)``: the output is allocated (and a given ``out=`` checked) in the dtype the resolved call
    names, not the first operand's (what a convolution of int8 data writing float32 needs)."""
    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend

    seen = []
    out = P.Output("out", shape=lambda r: (2, 3, 4), dtype=lambda r: "float32")
    p = P.Primitive("toy_out_dtype", inputs=(P.Operand("x", ("float16",)),), outputs=(out,), empty=lambda r: False,
                    legacy=lambda c: seen.append(c.views["out"].dtype))  # fmt: skip
    b = FakeBackend()
    with b.installed():
        import numpy as np

        from .fuzz.model import A

        _express.entries.clear()
        x = b.array(A((2, 3, 4), "float16"), np.zeros((2, 3, 4)), "fakeA", None)
        y = p({"x": x})
        assert seen == ["float32"] and b.shape_of(y) == (2, 3, 4)
        wrong = b.array(A((2, 3, 4), "float16"), np.zeros((2, 3, 4)), "fakeA", None)
        with pytest.raises(ValueError, match="out must have shape .* and dtype float32"):
            p({"x": x}, out=wrong)
        _express.entries.clear()


def test_a_keyword_changed_in_place_is_never_an_express_hit_on_its_old_value(monkeypatch):
    """The express signature keyed a keyword object by identity: a list (pooling's window) or a 0-d NumPy array
    (alpha, beta) changed in place between calls reused the first call's resolved values (a wrong window, a wrong
    blend: silently). A list of plain values and a NumPy number are keyed by their values now; a dict or an n-d
    array makes the call take the full sequence. (A review found it; the first two cases fail without the fix.)"""
    import dataclasses

    import numpy as np

    from cudnnkit.ops import _express, pooling, softmax
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A

    seen: list = []
    monkeypatch.setattr(pooling, "POOLING_FORWARD", dataclasses.replace(
        pooling.POOLING_FORWARD, legacy=lambda c: seen.append(c.resolved.window), graph=None))  # fmt: skip
    monkeypatch.setattr(softmax, "SOFTMAX_FORWARD", dataclasses.replace(
        softmax.SOFTMAX_FORWARD, legacy=lambda c: seen.append((c.alpha._obj.value, c.beta._obj.value)),
        graph=None))  # fmt: skip
    b = FakeBackend()
    with b.installed():
        monkeypatch.setitem(adapters.KEYED, FakeArray, lambda a: b.adapters[a.lib].key(a))
        _express.entries.clear()
        try:

            def arr(shape):
                return b.array(A(shape, "float32"), np.zeros(shape), "fakeA", None)

            win = [2, 2]
            for _ in range(3):
                assert pooling.pooling_forward(arr((1, 1, 8, 8)), mode="max", window=win).shape == (1, 1, 4, 4)
            win[:] = [4, 4]
            assert pooling.pooling_forward(arr((1, 1, 8, 8)), mode="max", window=win).shape == (1, 1, 2, 2)
            assert seen[-1] == (4, 4)

            seen.clear()
            y = arr((2, 3, 4))
            alpha, beta = np.array(1.0), np.array(0.0)
            for _ in range(3):
                softmax.softmax_forward(arr((2, 3, 4)), out=y, alpha=alpha, beta=beta)
            alpha[...], beta[...] = 3.0, 0.5
            softmax.softmax_forward(arr((2, 3, 4)), out=y, alpha=alpha, beta=beta)
            assert seen == [(1.0, 0.0)] * 3 + [(3.0, 0.5)]

            x = arr((2, 3, 4))
            assert _express.signature(softmax.SOFTMAX_FORWARD, {"x": x}, {"alpha": np.float32(2)}) is not None
            assert _express.signature(softmax.SOFTMAX_FORWARD, {"x": x}, {"alpha": np.ones(2)}) is None
            assert _express.signature(softmax.SOFTMAX_FORWARD, {"x": x}, {"alpha": {}}) is None
        finally:
            _express.entries.clear()
