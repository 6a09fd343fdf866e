"""The fuzzer's CPU tier (issue 10): every op's validation, fuzzed with fake device arrays, and the worker machinery.

Each op of ``tests/fuzz/specs.py`` gets Hypothesis-drawn cases (a valid call with one aspect mutated, some valid,
some with two or three mutations) run on the CPU fakes (:class:`tests.fuzz.materialize.FakeBackend`): a mutated
call must be refused with a clear exception naming the argument before any device work, and a valid one must get
as far as the device (where the fakes' gate stops it). ``CUDNNKIT_FUZZ_EXAMPLES`` sets the examples per op (default
100, about 20 s for every op); ``CUDNNKIT_FUZZ_SEED`` draws other cases (the default run is derandomized).
A failure lists each class of unclear outcome once, with a repro.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import cudnnkit.ops
from tests.fuzz import outcome
from tests.fuzz.emulate import EMULATORS, HostBackend, Skip
from tests.fuzz.materialize import FakeBackend
from tests.fuzz.model import Case
from tests.fuzz.runner import DIAGNOSTICS, Ctx, Summary, execute, run_cases
from tests.fuzz.specs import GRAPH_ENTRY_POINTS, SPECS
from tests.fuzz.strategies import (
    HypothesisDraw,
    RandomDraw,
    bad_pointers,
    bad_streams,
    dtypes,
    generate,
    layouts,
    make_case,
    non_arrays,
    shapes,
)

EXAMPLES = int(os.environ.get("CUDNNKIT_FUZZ_EXAMPLES", "100"))
SEED = os.environ.get("CUDNNKIT_FUZZ_SEED")


# ----------------------------------------------------------------- the table covers the public API


def test_every_public_op_has_a_description():
    """A new op in cudnnkit.ops fails here until tests/fuzz/specs.py describes it (so the fuzzer covers it)."""
    machinery = {"Primitive", "REGISTRY", "last_path"}  # the declaration machinery, not ops
    missing = sorted(set(cudnnkit.ops.__all__) - set(SPECS) - machinery)
    assert not missing, f"cudnnkit.ops names without a fuzz description in tests/fuzz/specs.py: {missing}"
    missing = sorted(set(GRAPH_ENTRY_POINTS) - set(SPECS))
    assert not missing, f"graph entry points without a fuzz description: {missing}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_descriptions_draw_calls_of_their_op(name):
    """Every description draws cases (valid and mutated), deterministically for a seed."""
    a = generate(30, 7, ("fakeA",), False, [name])
    b = generate(30, 7, ("fakeA",), False, [name])
    assert [c.repro() for c in a] == [c.repro() for c in b]
    assert any(c.valid for c in a) and any(not c.valid for c in a)
    for c in a:
        for m in c.mutations:
            assert m.expect in ("refuse", "any", "refuse_gpu"), m


# ----------------------------------------------------------------- the strategies


@settings(max_examples=50, deadline=None, database=None)
@given(shapes(), dtypes(), non_arrays(), bad_streams(), bad_pointers())
def test_strategies_draw(shape, dtype, nonarray, stream, pointer):
    assert isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)


@settings(max_examples=50, deadline=None, database=None)
@given(st.data())
def test_layouts_address_every_element_inside_their_allocation(data):
    from tests.fuzz.model import layout_strides

    shape = data.draw(shapes(1, 5, 1, 5))
    lay = data.draw(layouts(shape, neg=True))
    strides, n, off = layout_strides(shape, lay)
    lo = off + sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    hi = off + sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    assert 0 <= lo <= hi < n


@settings(max_examples=60, deadline=None, database=None)
@given(st.data())
def test_gpu_arrays_are_made_with_the_logical_values(data):
    """The GPU backend's arrays (a 1-d allocation holding the values at the layout's positions, viewed with the
    layout's strides) hold the logical values: checked with torch CPU tensors, which view memory the same way."""
    torch = pytest.importorskip("torch")
    import numpy as np

    from tests.fuzz.materialize import buffer_of, logical
    from tests.fuzz.model import A

    shape = data.draw(shapes(1, 4, 1, 5))
    lay = data.draw(layouts(shape))
    dtype = data.draw(st.sampled_from(["float32", "float64", "float16", "int32"]))
    a = A(shape, dtype, fill="int:-50:50" if dtype == "int32" else "normal", layout=lay, seed=data.draw(st.integers()))
    v = logical(a, np.random.default_rng(a.seed % 2**32))
    buf, strides, off = buffer_of(a, v)
    view = torch.from_numpy(buf).as_strided(shape, strides, off)
    np.testing.assert_array_equal(view.numpy().astype(np.float64), v)


# ----------------------------------------------------------------- the CPU tier: validation of every op


@pytest.fixture(scope="module")
def fakes():
    b = FakeBackend()
    with b.installed():
        yield b


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fuzz_validation(name, fakes):
    """Mutated calls of ``name`` are refused clearly, naming the argument, before any device work; valid ones
    reach the device (the fakes' gate); nothing raises a bare cuDNN status or an internal exception."""
    records = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=SEED is None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def run(data):
        case = make_case(HypothesisDraw(data.draw), SPECS[name], "fakeA", False, "fakeB")
        case.index = len(records)
        records.append(execute(case, fakes))

    run()
    summary = Summary("fake", records, 0.0)
    if summary.failures:
        pytest.fail(summary.report(), pytrace=False)


# ----------------------------------------------------------------- the references the GPU tier checks against


def _perturbed(res):
    """``res`` (an array, a tuple or dict of them) with its first non-empty array shifted by a tenth of its largest value."""
    import numpy as np

    if isinstance(res, dict):
        for k, v in res.items():
            p = _perturbed(v)
            if p is not None:
                return {**res, k: p}
        return None
    if isinstance(res, tuple):
        for i, v in enumerate(res):
            p = _perturbed(v)
            if p is not None:
                return res[:i] + (p,) + res[i + 1 :]
        return None
    a = np.asarray(res, np.float64)
    if a.size == 0 or not np.isfinite(a).any() or not np.abs(a).max():
        return None
    return a + 0.1 * np.abs(a).max()


@pytest.mark.parametrize("name", sorted(EMULATORS))
def test_references_agree_with_an_independent_cpu_implementation(name):
    """Each reference the GPU tier compares cuDNN with (``check`` of tests/fuzz/specs.py) accepts the result of
    an independent CPU implementation (torch in float64) on valid cases, and rejects it perturbed."""
    pytest.importorskip("torch")
    spec = SPECS[name]
    checked = 0
    for i in range(20):
        case = make_case(RandomDraw(1000 + i), spec, "host", True, None, valid=1.0)
        ctx = Ctx(case, spec, HostBackend())
        try:
            ctx.prepare()
            res = EMULATORS[name](ctx)
        except Skip:
            continue
        problems = spec.check(ctx, res)
        assert not problems, f"{case.repro()}: {problems}"
        bad = _perturbed(res)
        if bad is not None:
            if spec.name in ("set_tensor", "scale_tensor", "add_tensor"):
                target = ctx.arg("c" if spec.name == "add_tensor" else "y")
                target[...] = bad
                bad = target
            assert spec.check(ctx, bad), f"the check accepted a perturbed result: {case.repro()}"
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("name", sorted(n for n, s in SPECS.items() if s.derive is not None))
def test_derived_arrays_are_derived_from_the_arrays_they_name(name):
    """A ``derived:`` array is made from the others (the backward's ``y`` from ``x``): after ``prepare`` it holds
    what ``derive`` gives from the finished arguments, not the random values it falls back to when the array it
    reads was not made yet (which made max pooling's backward compare cuDNN with a y that is not x's maximum)."""
    import numpy as np

    from tests.fuzz.model import A

    spec = SPECS[name]
    seen = derived = 0
    for i in range(20):
        case = make_case(RandomDraw(2000 + i), spec, "host", True, None, valid=1.0)
        ctx = Ctx(case, spec, HostBackend())
        ctx.prepare()
        for k, a in case.kwargs.items():
            if not (isinstance(a, A) and a.fill.startswith("derived:")):
                continue
            derived += 1
            with np.errstate(all="ignore"):
                try:
                    want = spec.derive(ctx, a.fill.partition(":")[2], a)
                except Exception:  # the runner falls back to random values too (an empty array, say)
                    continue
            if want is None or k not in ctx.hostv or not np.size(want):
                continue
            got, want = np.asarray(ctx.hostv[k], np.float64), np.asarray(want, np.float64)
            ok = np.isfinite(want)
            scale = max(np.abs(want[ok]).max(initial=0.0), 1e-30)  # the array was rounded to its dtype
            assert np.abs(got[ok] - want[ok]).max(initial=0.0) <= 2e-2 * scale, f"{case.repro()}: {k} is not derived"
            seen += 1
    if not derived:  # e.g. lrn_forward: its spec names a derive, but its draws make no derived: array
        pytest.skip(f"{name}: 20 draws made no derived: array, so nothing is checked")
    assert seen, "no derived array could be checked"


# ----------------------------------------------------------------- the outcome rules


def test_outcome_rules():
    from cudnnkit import lib
    from tests.fuzz.model import Mutation

    bad = Case("softmax_forward", {}, (), mutations=(Mutation("value", "alpha", "alpha='x'", "refuse"),))
    valid = Case("softmax_forward", {}, ())

    def raise_from_here(exc):
        try:
            raise exc
        except Exception as e:
            return e

    def kind(case, exc):
        return outcome.classify(case, exc, gpu=True, call_names=("x", "alpha")).kind

    status = lib.BadParamError(2000, "cudnnSetTensorNdDescriptor")
    assert kind(bad, status) == outcome.UNCLEAR  # a bare cuDNN status, though also a ValueError
    assert kind(bad, KeyError("typestr")) == outcome.UNCLEAR
    assert kind(bad, None) == outcome.UNCLEAR  # accepted although invalid
    assert kind(valid, None) == outcome.CORRECT
    assert kind(bad, raise_from_here(TypeError("alpha must be real"))) == outcome.UNCLEAR  # raised in the tests
    with pytest.raises(TypeError) as ei:  # no refusal at all must fail here, not skip the checks below
        cudnnkit.ops.softmax_forward(object())
    e = ei.value
    assert outcome.classify(bad, e, gpu=True, call_names=()).reason == "message does not name the argument"
    named = Case("softmax_forward", {}, (), mutations=(Mutation("nonarray", "x", "x is an object", "refuse"),))
    assert kind(named, e) == outcome.CLEAR
    assert kind(valid, e) == outcome.UNCLEAR  # a valid call refused
    # no cuDNN engine for a valid call's graph, and no legacy form that takes it: the router's ValueError, whose
    # cause is the UnsupportedGraphError, is clear (cuDNN lacks it), as the UnsupportedGraphError itself is
    from cudnnkit.graph import UnsupportedGraphError

    try:
        try:
            raise UnsupportedGraphError("toy", [])
        except UnsupportedGraphError as cause:
            raise ValueError(
                "convolution_forward: cuDNN has no engine ... and the legacy call cannot take it"
            ) from cause
    except ValueError as e:
        assert kind(valid, e) == outcome.CLEAR and kind(valid, ValueError("plain")) == outcome.UNCLEAR


def test_combined_changes_that_may_agree_again_may_pass():
    """Seed 916's case 3503 (ctc_loss): one label too many, with label_lengths [4, 3] given an expanded layout,
    which reads [4, 4]: the labels fit again, so the combined case is a call that may pass (every mutation
    "any"), not one that must be refused (the label mutation alone expects a refusal)."""
    from tests.fuzz.strategies import _changes_values, regenerate

    case = regenerate("ctc_loss", 5841389628353912304, "fakeA", False, "fakeB")
    got = [(m.kind, m.target) for m in case.mutations]
    assert got == [("layout", "input_lengths"), ("ctc", "labels"), ("layout", "label_lengths")]
    assert [_changes_values(case, m) for m in case.mutations] == [False, False, True]  # input_lengths: a gap
    assert all(m.expect == "any" for m in case.mutations)


def test_padded_ctc_labels_of_an_empty_batch_are_a_valid_call():
    """Seed 1088's case 2116: labels reshaped (0,) -> (0, 2) for a batch of 0 are padded (N, S) labels with no rows,
    a valid call (the fuzzer expected a refusal); with rows, S must cover every label length."""
    from tests.fuzz.model import A
    from tests.fuzz.specs import _ctc_shape_rule

    empty = Case("ctc_loss", {"x": A((4, 0, 3), "float32"), "label_lengths": A((0,), "int32", values=())}, ())
    assert _ctc_shape_rule(empty, "labels", (0,), (0, 2)) == "any"
    two = Case("ctc_loss", {"x": A((4, 2, 3), "float32"), "label_lengths": A((2,), "int32", values=(2, 3))}, ())
    assert _ctc_shape_rule(two, "labels", (5,), (2, 3)) == "any"
    assert _ctc_shape_rule(two, "labels", (5,), (2, 2)) == "refuse"  # row 1 holds 3 labels


def test_an_array_left_out_and_a_dtype_change_may_agree_again():
    """Seed 1170's case 1950 (pooling_forward): x bfloat16 -> float32 disagrees with the bfloat16 ``out`` only,
    and the second mutation leaves ``out`` out (None): a valid call, so both mutations expect "any" (the dtype
    change alone expects a refusal)."""
    from tests.fuzz.strategies import _removes_array, regenerate

    case = regenerate("pooling_forward", 3828861680321925785, "fakeA", False, "fakeB")
    assert [(m.kind, m.target) for m in case.mutations] == [("dtype", "x"), ("nonarray", "out")]
    assert [_removes_array(case, m) for m in case.mutations] == [False, True]
    assert all(m.expect == "any" for m in case.mutations)


def test_convolution_backward_data_check_without_x_shape():
    """Seed 1170's case 4605: ``x_shape=None`` (dx's size from the transposed convolution) with an empty batch is
    a valid call; the check derives x's shape itself (it failed with a TypeError) and finds the result correct."""
    from tests.fuzz.strategies import regenerate

    case = regenerate("convolution_backward_data", 8972343312309432061, "fakeA", False, "fakeB")
    assert case.kwargs["x_shape"] is None and case.kwargs["dy"].shape[0] == 0
    s = run_cases([case], {"backend": "fake"}, timeout=60)
    assert [r.kind for r in s.records] == [outcome.CORRECT], s.report()


def test_pooling_y_is_not_derived_for_a_padding_that_changes_its_shape():
    """GPU seed 24's case 154 (pooling_backward, padding mutated to 2**40): the fuzzer derived y from x through the
    float64 reference before comparing shapes, whose output (2**41 windows) filled the GPU host's memory until the
    worker was killed (SIGKILL). y is now derived only where the forward's shape is y's."""
    import types

    import numpy as np

    from tests.fuzz.model import A
    from tests.fuzz.specs import _pooling_derive

    x = np.arange(20.0).reshape(1, 4, 5)
    params = {"window": (3,), "stride": (1,), "padding": (2**40,), "mode": "max_deterministic"}
    ctx = types.SimpleNamespace(x=lambda n: x if n == "x" else None, param=lambda n, d=None: params.get(n, d))
    assert _pooling_derive(ctx, "y", A((1, 4, 5), "bfloat16")) is None
    params["padding"] = (1,)
    y = _pooling_derive(ctx, "y", A((1, 4, 5), "bfloat16"))
    assert y.tolist() == [[[max(x[0, c, max(i - 1, 0) : i + 2]) for i in range(5)] for c in range(4)]]


def test_batch_norm_backward_reads_z_grad_before_out(fakes):
    """Seed 1603 (batch_norm_backward's fused options): ``z_grad`` is checked as a bool before ``out=`` is split
    by it. A NumPy True (which the op's checks take as True, computing dz) asked for a 3-tuple ``out`` and dropped
    dz from the result; ``z_grad=2`` with a 4-tuple ``out`` was refused as "out must be a tuple of 3", naming no
    z_grad."""
    import numpy as np

    from tests.fuzz.materialize import FakeArray, ReachedDevice

    def arr(shape):
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
        return FakeArray(shape, "float32", strides, fakes.alloc(4 * int(np.prod(shape))), "fakeA")

    def call(z_grad):
        x, p = (lambda: arr((4, 3, 2, 2))), (lambda: arr((3,)))
        return cudnnkit.ops.batch_norm_backward(x(), x(), p(), p(), p(), activation="relu", y=x(), z_grad=z_grad,
                                                out=(None,) * 4)  # fmt: skip

    with pytest.raises(ReachedDevice):
        call(np.True_)
    with pytest.raises(TypeError, match="z_grad must be a bool"):
        call(2)


def test_attention_bottom_right_refusal_names_its_argument(fakes):
    """Seeds 1612's attention variants: q grown past S_kv under a bottom-right causal mask (``is_causal`` or
    ``right_bound`` with ``diagonal_alignment="bottom_right"``) is refused before any device work by a message that
    names the argument to change (it said "bottom-right causal masking needs S_q <= S_kv", naming none)."""
    from tests.fuzz.model import A, Mutation
    from tests.fuzz.runner import execute

    for extra in ({"is_causal": True}, {"right_bound": 1}):
        kw = {"q": A((1, 1, 4, 8), "float16", seed=1), "k": A((1, 1, 2, 8), "float16", seed=2),
              "v": A((1, 1, 2, 8), "float16", seed=3), "diagonal_alignment": "bottom_right", **extra}  # fmt: skip
        m = Mutation("shape", "q", "q shape (1, 1, 2, 8) -> (1, 1, 4, 8)", "refuse")
        rec = execute(Case("attention_forward", kw, ("q", "k", "v"), "fakeA", "fakeB", (m,), {"dtype": "float16"}),
                      fakes)  # fmt: skip
        assert rec.kind == "clear", rec.detail
        assert "diagonal_alignment" in rec.detail and "S_q <= S_kv" in rec.detail


# ----------------------------------------------------------------- the worker machinery


def _diag(op: str, i: int) -> Case:
    assert op in DIAGNOSTICS
    return Case(op, {}, (), lib="fakeA", index=i)


def test_worker_survives_crashes_and_runs_the_next_case():
    """A case that segfaults the worker (``ctypes.string_at(0)``), one after which the sanity op fails (a poisoned
    context) and one that hangs are each recorded as a crash; a fresh worker runs the next case."""
    ops = ["__pid__", "__segfault__", "__pid__", "__poison__", "__ok__", "__hang__", "__ok__"]
    s = run_cases([_diag(op, i) for i, op in enumerate(ops)], {"backend": "fake"}, timeout=3)
    C, X = outcome.CORRECT, outcome.CRASH
    assert [r.kind for r in s.records] == [C, X, C, X, C, X, C], s.report()
    assert "SIGSEGV" in s.records[1].reason, s.records[1].reason
    assert s.records[0].detail != s.records[2].detail  # the pid: another process ran the case after the crash
    assert "poisoned" in s.records[3].reason and s.records[5].reason.startswith("hang")
    assert s.restarts == 3
    assert s.line().startswith("fuzz: 7 cases, 3 crashes, 0 wrong results, 0 unclear errors (0 clear refusals, 4 ")


def test_scripts_fuzz_on_the_cpu_fakes_matches_running_in_process(tmp_path):
    """``scripts/fuzz --backend fake`` (the worker loop on the CPU fakes) gives the outcomes of running the same
    cases in this process, and its JSON file holds the summary and every failing case with a repro."""
    import json

    from tests.fuzz.runner import main

    path = tmp_path / "fuzz.json"
    rc = main(["--backend", "fake", "--cases", "80", "--seed", "3", "--json", str(path), "--quiet"])
    doc = json.loads(path.read_text())
    cases = generate(80, 3, ("fakeA",), False)
    for c in cases:
        c.other = "fakeB"
    inproc = run_cases(cases, {"backend": "fake"}, in_process=True)
    assert doc["summary"]["line"].startswith("fuzz: 80 cases")
    assert doc["summary"]["clear_refusals"] == inproc.count(outcome.CLEAR)
    assert [(f["index"], f["reason"]) for f in doc["failures"]] == [(r.index, r.reason) for r in inproc.failures]
    assert rc == (1 if doc["failures"] else 0)
    assert all(f["repro"].startswith(f"#{f['index']} {f['op']}(") for f in doc["failures"])


def test_ctc_label_and_length_mutations_never_meet_a_shape_change_of_x():
    """A label >= A (an input length > T) mutated together with x's shape could fit again and make a valid call
    whose verdict still said "refuse" (seed 1611, #16592): the pairs are coupled, so no case draws both."""
    from tests.fuzz.strategies import RandomDraw

    met = 0
    for i in range(3000):
        case = make_case(RandomDraw(5000 + i), SPECS["ctc_loss"], "fakeA", False, "fakeB", valid=0.0)
        targets = {m.target for m in case.mutations}
        met += len(case.mutations) > 1
        assert not ({"labels", "x"} <= targets or {"input_lengths", "x"} <= targets), case.repro()
    assert met  # several mutations were drawn at all


def _attn_ctx(op, seed, lib):
    from tests.fuzz.strategies import regenerate

    case = regenerate(op, seed, lib, True)
    ctx = Ctx(case, SPECS[op], HostBackend())
    ctx.prepare()
    return ctx


def test_attention_checks_read_the_defined_rows_and_the_given_o_stats():
    """Seeds 1612's GPU-like replay (false wrong results): o/stats rows past S_q_b left NaN (cuDNN does not write
    them) pass; the backward's reference is the gradient of tests/gpu's ``reference`` given the forward's o and
    stats, and reads an o, stats or do as handed (an expand layout); a gradient zero by the math (v expanded along
    S) passes at zero; a wrong result still fails."""
    pytest.importorskip("torch")
    import numpy as np

    from tests.fuzz.specs import _attn_grads, _attn_ref, _sdpa_scale
    from tests.gpu.test_attention_gpu import reference

    ctx = _attn_ctx("attention_forward", 7841501199138655869, "torch")  # lengths
    spec = SPECS["attention_forward"]
    o, st = EMULATORS["attention_forward"](ctx)
    o, st = o.copy(), st.copy()
    for b, n in enumerate(ctx.x("seq_len_q").reshape(-1).astype(int)):
        o[b, :, n:] = st[b, :, n:] = np.nan
    assert spec.check(ctx, (o, st)) == []
    o[0, :, 0] += 0.5
    assert spec.check(ctx, (o, st))

    spec = SPECS["attention_backward"]
    ctx = _attn_ctx("attention_backward", 5198385944751678460, "cupy")  # v expand/2: dq = dk = 0
    dq, dk, dv = EMULATORS["attention_backward"](ctx)
    assert spec.check(ctx, (0 * dq, 0 * dk, dv)) == []
    assert spec.check(ctx, (0 * dq, 0 * dk, 1.1 * dv))

    ctx = _attn_ctx("attention_backward", 8000827595426643260, "cupy")  # stats expand/2: the device reads it
    ref = _attn_ref(ctx)
    grads = _attn_grads(ctx, ref)
    assert np.abs(ctx.x("stats") - ref["stats"]).max() > 1  # not the forward's: the reference reads it
    assert spec.check(ctx, tuple(grads[:3])) == []
    assert spec.check(ctx, (grads[0], grads[1], 1.1 * grads[2]))

    # given the forward's exact o and stats, _attn_grads is tests/gpu's autograd reference
    compared = 0
    for seed in range(3000, 3040):
        case = make_case(RandomDraw(seed), spec, "host", True, None, valid=1.0)
        ctx = Ctx(case, spec, HostBackend())
        ctx.prepare()
        ref = _attn_ref(ctx)
        if ref is None or ref["lq"] is not None or ctx.x("sink") is not None and ctx.param("dsink") is not True:
            continue
        ctx.hostv["o"], ctx.hostv["stats"] = ref["o"], ref["stats"]
        q, k, v, h = ctx.x("q"), ctx.x("k"), ctx.x("v"), ctx.x("q").shape[1]
        cap, sink = ctx.param("softcap"), ctx.x("sink")
        _, _, want = reference(q, k, v, ctx.x("do"), scale=_sdpa_scale(ctx, q.shape[-1]), keep=ref["keep"],
                               bias=ctx.x("attn_mask"), slopes=ctx.x("alibi_slopes"),
                               softcap=None if cap is None else float(cap),
                               sink=None if sink is None else sink.reshape(1, h, 1, 1))  # fmt: skip
        for g, w in zip(_attn_grads(ctx, ref), want):
            if w is not None:
                np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-9, atol=1e-9)
        compared += 1
    assert compared >= 10
