"""ops/_replay.py on the CPU: a declaration's call recorded from its L2 express hits, then replayed with each
call's own arrays, over toy primitives whose "cuDNN calls" are recorded (fake arrays: nothing reaches a device)."""

from __future__ import annotations

import numpy as np
import pytest

import cudnnkit
from cudnnkit.ops import _express, _replay
from cudnnkit.ops import _primitive as P
from cudnnkit.runtime import FLOATS, adapters

from .fuzz.materialize import FakeArray, FakeBackend
from .fuzz.model import A
from .graph_fakes import recording_copies
from .test_primitive_cpu import _fake_graph_primitive


@pytest.fixture
def backend(monkeypatch):
    monkeypatch.setattr(P, "get_handle", lambda *a: type("H", (), {"ptr": 0xABC})())
    b = FakeBackend()
    with b.installed():
        adapters.KEYED[FakeArray] = lambda a: b.adapters[a.lib].key(a)
        _express.entries.clear()
        _replay.traces.clear()
        try:
            yield b
        finally:
            adapters.KEYED.pop(FakeArray, None)
            _express.entries.clear()
            _replay.traces.clear()


def _arr(b, shape=(2, 3, 4)):
    return b.array(A(shape, "float32"), np.zeros(shape), "fakeA", None)


def _legacy_primitive(name, seen, inner=None):
    """A legacy-only ``x -> out`` primitive: each call records (x's pointer, out's pointer, the keyword ``k``);
    ``inner`` (a primitive) is called from inside the legacy form, as a split form's epilogue calls add_tensor."""

    def legacy(call):
        seen.append((call.views["x"].ptr, call.views["out"].ptr, call.resolved))
        if inner is not None:
            inner({"x": call.views["out"].owner})

    return P.Primitive(name, inputs=(P.Operand("x", FLOATS),), outputs=(P.Output("out", like="x"),),
                       resolve=lambda views, kw: (kw.get("k"),), describe=lambda r: (lambda s, st: (s, st)),
                       legacy=legacy, layout_what="toy")  # fmt: skip


def _decl(g, leg, make_view=False):
    """A toy forward: ``y = g(x)`` (a graph form), ``z = leg(y, k)`` (a legacy form); residual y. With
    ``make_view`` the legacy call takes an array made outside any L2 call (as a ``reshape`` view would be)."""
    made = []

    def fwd(flat, k=1):
        (x,) = flat
        y = g({"x": x})
        src = y
        if make_view:
            src = made[0] if made else None
            made.clear()
        z = leg({"x": src if src is not None else y}, k=k)
        return [z, y], ("z", "y")

    return fwd, made


def test_a_warm_call_is_recorded_then_replayed_with_this_calls_pointers(backend):
    seen: list = []
    g, plan = _fake_graph_primitive("toy_replay_graph")
    leg = _legacy_primitive("toy_replay_legacy", seen)
    fwd, _ = _decl(g, leg)
    xs = [_arr(backend) for _ in range(8)]
    got = []
    for x in xs:
        key = _replay.key_of("toy", "f", arrays=[x], kw={"k": 3})
        got.append(_replay.call(key, lambda flat: fwd(flat, k=3), [x]))
    info = _replay.info()
    assert info["traced"] == 1 and info["replays"] >= 3, info  # calls 1-2 warm the entries, 3 records
    assert plan.builds == 1 and len(plan.calls) == 8 and len(seen) == 8
    for x, ((z, y), form), (_, gptrs, _), (lx, lz, lres) in zip(xs, got, plan.calls, seen):
        assert form == ("z", "y")
        assert gptrs == (y.ptr, x.ptr)  # this call's x, a new y
        assert (lx, lz, lres) == (y.ptr, z.ptr, (3,))  # the legacy step read this call's y and wrote a new z
    assert len({z.ptr for (z, _), _ in got}) == 8 and len({y.ptr for (_, y), _ in got}) == 8


def test_another_keyword_shape_or_settings_is_another_key(backend):
    x = _arr(backend)
    k1 = _replay.key_of("toy", "f", arrays=[x], kw={"k": 1})
    assert k1 == _replay.key_of("toy", "f", arrays=[_arr(backend)], kw={"k": 1})  # pointers are not in it
    assert k1 != _replay.key_of("toy", "f", arrays=[x], kw={"k": 2})
    assert k1 != _replay.key_of("toy", "f", arrays=[x], kw={"k": 1.0})  # typed as the express signature types
    assert k1 != _replay.key_of("toy", "f", arrays=[x], kw={"k": True})
    assert k1 != _replay.key_of("toy", "f", arrays=[_arr(backend, (2, 3, 5))], kw={"k": 1})
    assert _replay.key_of("toy", "f", arrays=[x], kw={"k": (1, 2)}) != _replay.key_of(
        "toy", "f", arrays=[x], kw={"k": (1, True)})  # fmt: skip
    with cudnnkit.settings(prefer="legacy"):
        assert k1 != _replay.key_of("toy", "f", arrays=[x], kw={"k": 1})
    assert _replay.key_of("toy", "f", arrays=[x], kw={"k": object()}) is None  # not a plain value: never recorded
    assert _replay.key_of("toy", "f", arrays=[np.zeros(3)], kw={}) is None  # no express key
    _express.enabled(False)
    try:
        assert _replay.key_of("toy", "f", arrays=[x], kw={}) is None
    finally:
        _express.enabled(True)


def test_an_array_made_outside_the_l2_calls_is_never_replayed(backend):
    """A forward whose L2 call takes an array no L2 call made (a view, say) keeps no trace: every call runs it
    again, and after ATTEMPTS recorded calls the key is not recorded any more."""
    seen: list = []
    g, plan = _fake_graph_primitive("toy_replay_view_graph")
    leg = _legacy_primitive("toy_replay_view_legacy", seen)
    fwd, made = _decl(g, leg, make_view=True)
    n = _replay.ATTEMPTS + 4
    for _ in range(n):
        x = _arr(backend)
        made.append(_arr(backend))
        key = _replay.key_of("toyv", "f", arrays=[x], kw={})
        (z, y), _ = _replay.call(key, fwd, [x])
        assert seen[-1][0] != y.ptr  # it read the outside array, each call
    assert _replay.info()["traced"] == 0 and len(plan.calls) == n and len(seen) == n
    t = _replay.traces.peek(key)
    assert t.n == _replay.ATTEMPTS


def test_a_result_made_outside_the_l2_calls_is_never_replayed(backend):
    seen: list = []
    g, _ = _fake_graph_primitive("toy_replay_out_graph")
    leg = _legacy_primitive("toy_replay_out_legacy", seen)
    for _ in range(_replay.ATTEMPTS + 2):
        x = _arr(backend)

        def fwd(flat):
            y = g({"x": flat[0]})
            leg({"x": y})
            return [_arr(backend)], None  # an array of its own: a replay could not give it

        key = _replay.key_of("toyo", "f", arrays=[x], kw={})
        _replay.call(key, fwd, [x])
    assert _replay.info()["traced"] == 0


def test_the_l2_calls_a_hit_makes_itself_are_not_steps(backend):
    """A legacy form that calls another primitive (a split form's epilogue) runs it once per replay: the inner
    call belongs to the outer hit, not to the trace."""
    inner_seen: list = []
    outer_seen: list = []
    inner = _legacy_primitive("toy_replay_inner", inner_seen)
    outer = _legacy_primitive("toy_replay_outer", outer_seen, inner=inner)

    def fwd(flat):
        return [outer({"x": flat[0]})], None

    for i in range(8):
        x = _arr(backend)
        key = _replay.key_of("toyn", "f", arrays=[x], kw={})
        _replay.call(key, fwd, [x])
        assert len(inner_seen) == len(outer_seen) == i + 1
    t = _replay.traces.peek(key)
    assert type(t) is _replay.Trace and len(t.steps) == 1 and t.replays >= 3


def test_a_full_sequence_call_abandons_the_recording(backend):
    """An L2 call that is not an express hit (a stream= call is never one) leaves no trace."""
    seen: list = []
    leg = _legacy_primitive("toy_replay_stream", seen)
    for _ in range(_replay.ATTEMPTS + 2):
        x = _arr(backend)
        key = _replay.key_of("toys", "f", arrays=[x], kw={})
        _replay.call(key, lambda flat: ([leg({"x": flat[0]}, stream=0)], None), [x])
    assert _replay.info()["traced"] == 0 and len(seen) == _replay.ATTEMPTS + 2


def test_express_off_runs_every_call_in_full(backend):
    seen: list = []
    leg = _legacy_primitive("toy_replay_off", seen)
    keys = []
    for _ in range(6):
        x = _arr(backend)
        keys.append(_replay.key_of("toyf", "f", arrays=[x], kw={}))
        _replay.call(keys[-1], lambda flat: ([leg({"x": flat[0]})], None), [x])
    assert _replay.info()["replays"] >= 1
    _express.enabled(False)
    try:
        before = _replay.info()["replays"]
        x = _arr(backend)
        _replay.call(keys[-1], lambda flat: ([leg({"x": flat[0]})], None), [x])  # a stale key: still run in full
        assert _replay.info()["replays"] == before and seen[-1][0] == x.ptr
    finally:
        _express.enabled(True)


def test_the_trace_cache_is_cleared_with_every_cache(backend):
    seen: list = []
    leg = _legacy_primitive("toy_replay_clear", seen)
    for _ in range(4):
        x = _arr(backend)
        _replay.call(_replay.key_of("toyc", "f", arrays=[x], kw={}), lambda flat: ([leg({"x": flat[0]})], None), [x])
    assert _replay.info()["size"] == 1
    cudnnkit.runtime.clear_caches()
    assert _replay.info()["size"] == 0


def _two_input(name, seen):
    def legacy(call):
        seen.append((call.views["a"].ptr, call.views["b"].ptr, call.views["out"].ptr))

    return P.Primitive(name, inputs=(P.Operand("a", FLOATS), P.Operand("b", FLOATS, like="a")),
                       outputs=(P.Output("out", like="a"),), resolve=lambda v, kw: (),
                       describe=lambda r: (lambda s, st: (s, st)), legacy=legacy, layout_what="toy")  # fmt: skip


def test_one_array_in_two_places_is_not_recorded(backend):
    """The key holds each array's metadata, not its identity: a trace recorded from ``f(x, x)`` would bind ``x``
    twice for a later ``f(a, b)`` of the same metadata (attention(x, x, x), then attention(q, k, v)). Such a call
    is not recorded; a later call of distinct arrays is, and replays with each in its place."""
    seen: list = []
    p = _two_input("toy_replay_alias", seen)

    def fwd(flat):
        return [p({"a": flat[0], "b": flat[1]})], None

    for _ in range(_replay.ATTEMPTS + 2):  # not counted as attempts: the key stays open to distinct arrays
        x = _arr(backend)
        _replay.call(_replay.key_of("toya", arrays=[x, x], kw={}), fwd, [x, x])
        assert seen[-1][:2] == (x.ptr, x.ptr)
    assert _replay.info()["traced"] == 0
    for _ in range(4):
        a, b = _arr(backend), _arr(backend)
        _replay.call(_replay.key_of("toya", arrays=[a, b], kw={}), fwd, [a, b])
        assert seen[-1][:2] == (a.ptr, b.ptr)
    assert _replay.info()["traced"] == 1 and _replay.info()["replays"] >= 2


def test_a_call_with_another_count_of_arrays_runs_in_full(backend):
    """A trace replays only a call of as many arrays as it recorded (a caller whose key did not fix the count)."""
    seen: list = []
    leg = _legacy_primitive("toy_replay_count", seen)
    for _ in range(5):
        x = _arr(backend)
        _replay.call(("toyk",), lambda flat: ([leg({"x": flat[0]})], None), [x])
    assert _replay.info()["replays"] >= 1
    before = _replay.info()["replays"]
    x, extra = _arr(backend), _arr(backend)
    (out,), _ = _replay.call(("toyk",), lambda flat: ([leg({"x": flat[0]})], len(flat)), [x, extra])
    assert _replay.info()["replays"] == before and seen[-1][0] == x.ptr


def test_a_graph_step_replays_on_the_pointer_only_path_into_a_given_output(backend, monkeypatch):
    """A replayed graph hit takes ``_fire_graph`` (the plan with this call's pointers, nothing else), an ``out=``
    array given by the call included: each replay writes this call's ``out``, read from the call's own arrays."""
    fast = []
    real = P._fire_graph
    monkeypatch.setattr(P, "_fire_graph", lambda *a: fast.append(a[1]) or real(*a))
    g, plan = _fake_graph_primitive("toy_replay_graph_out")
    pairs = [(_arr(backend), _arr(backend)) for _ in range(8)]
    got = []
    for x, o in pairs:
        key = _replay.key_of("toy_out", "f", arrays=[x, o], kw={})
        got.append(_replay.call(key, lambda flat: ([g({"x": flat[0]}, out=flat[1])], None), [x, o]))
    (t,) = [v for v in _replay.traces._d.values() if type(v) is _replay.Trace]
    assert t.steps[0][1] is not None  # the step has the pointer-only path
    assert _replay.info()["traced"] == 1 and _replay.info()["replays"] >= 3
    assert len(fast) >= 5  # the entry's hits, recorded and replayed, all on the pointer-only path
    for (x, o), ([res], _), (_, gptrs, _) in zip(pairs, got, plan.calls):
        assert res is o and gptrs == (o.ptr, x.ptr)  # this call's out and x, in the plan's order


def test_a_replay_the_pointer_only_path_refuses_falls_back_once(backend, monkeypatch):
    """A replayed graph step whose ``out=`` is not 16-byte aligned: the pointer-only path refuses it (MISSING) and
    the full hit takes the call (through an aligned temporary written back to ``out``) without trying the
    pointer-only path a second time."""
    recording_copies(monkeypatch)
    tries = []
    real = P._fire_graph
    monkeypatch.setattr(P, "_fire_graph", lambda *a: tries.append(r := real(*a)) or r)
    g, plan = _fake_graph_primitive("toy_replay_misaligned")
    fn = lambda flat: ([g({"x": flat[0]}, out=flat[1])], None)  # noqa: E731
    key = lambda x, o: _replay.key_of("toy_mis", "f", arrays=[x, o], kw={})  # noqa: E731
    for _ in range(6):
        x, o = _arr(backend), _arr(backend)
        _replay.call(key(x, o), fn, [x, o])
    x = _arr(backend)
    o = backend.array(A((2, 3, 4), "float32", layout=("offset", 2)), np.zeros((2, 3, 4)), "fakeA", None)
    assert o.ptr % 16 and key(x, o) == key(_arr(backend), _arr(backend))  # the same trace replays it
    before, n = _replay.info()["replays"], len(tries)
    (res,), _ = _replay.call(key(x, o), fn, [x, o])
    assert _replay.info()["replays"] == before + 1 and res is o
    assert tries[n:] == [P.MISSING]  # one pointer-only attempt, then the full hit
    _, ptrs, _ = plan.calls[-1]
    assert ptrs[0] % 16 == 0 and ptrs[1] == x.ptr


def test_a_replayed_graph_step_makes_its_fresh_extras_anew(backend, monkeypatch):
    """A graph step with an extra the graph writes (saved statistics) and a given ``out=``: each replay returns
    this call's ``out``, a new extra, and binds them with this call's ``x`` in the plan's order."""

    def prepare(c):
        arr, c.views["stat"] = c.launch.empty((3,), "float32", name="stat")
        c.extra["stat"] = arr

    g, plan = _fake_graph_primitive("toy_replay_fresh", prepare=prepare, extras=("stat",))
    fn = lambda flat: (list(g({"x": flat[0]}, out=flat[1])), None)  # noqa: E731
    got = []
    for _ in range(8):
        x, o = _arr(backend), _arr(backend)
        got.append((x, o, _replay.call(_replay.key_of("toy_fresh", "f", arrays=[x, o], kw={}), fn, [x, o])[0]))
    assert _replay.info()["replays"] >= 3
    for (x, o, (ro, st)), (_, ptrs, _) in zip(got, plan.calls):
        assert ro is o and st is not None and ptrs == (o.ptr, x.ptr, st.ptr)
    assert len({st.ptr for _, _, (_, st) in got}) == 8


@pytest.mark.parametrize("where", ["eager", "custom op"])
def test_two_declarations_of_one_name_each_replay_their_own_calls(backend, where):
    """A declaration is its object, not its name: two of one name (a redefinition, one name in two namespaces)
    each record and replay their own L2 calls. Keyed by the name, the second replayed the first's trace (a
    review found it: a fixed op redefined under its name went on running the old one's calls)."""
    pytest.importorskip("torch")
    from cudnnkit.ops._diff import Differentiable, new_like
    from cudnnkit.torch import _library

    seen: list = []
    prims = {n: _legacy_primitive(n, seen) for n in ("toy_name_double", "toy_name_triple")}

    def decl(prim):
        return Differentiable("toy_one_name", "softmax_forward", ("x",), ("out",),
                              lambda x, **kw: ((prim({"x": x}),), {}), lambda res, douts, needs, **kw: (None,),
                              lambda x, **kw: ((new_like(x),), {}), capture_safe=True)  # fmt: skip

    d1, d2 = decl(prims["toy_name_double"]), decl(prims["toy_name_triple"])
    assert d1 != d2 and len({d1, d2}) == 2

    def run(d):
        x = _arr(backend)
        if where == "eager":
            return _library._forward(d, [x], {}, {})
        return _library._dispatched_forward(d, [x], {}, {}, "kw")

    for _ in range(8):
        run(d1)
    assert _replay.info()["replays"] >= 3
    for _ in range(8):
        seen.clear()
        run(d2)
        assert [r for _, _, r in seen] == [(None,)] and len(seen) == 1
        assert P.last_path()[0] == "toy_name_triple", P.last_path()
