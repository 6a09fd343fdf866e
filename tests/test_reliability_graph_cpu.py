"""Issue 10 regressions for cudnnkit.graph on the CPU: what is refused, by name, before any GPU work.

C1: an arbitrary ``stream=`` is checked before ``cudnnSetStream`` (plan.execute, bind, BoundPlan calls, the
CAI producer stream, autotune). C2: raw pointers in bindings are checked through the driver (device and the
size of the allocation), ``unchecked=True`` trusts them, a bound plan is checked once at bind time. U6: a
descriptor cuDNN refuses while lowering is an ``UnsupportedGraphError`` naming it (a missing driver stays a
``DriverNotFoundError``). U8: dims, strides, alignment and float parameters of the wrong type or value.
U12: ``device=-1`` at every entry point. Bindings: each wrong binding is a ``BindingError`` naming the tensor.

The driver is faked where a check needs its answers (``cudnnkit.runtime.driver.pointer_info`` and
``stream_device``), and a plan is executed up to ``cudnnBackendExecute`` with the handle and the execute call
replaced, so nothing here needs a GPU.
"""

from __future__ import annotations

import json
import math
import struct
import threading

import numpy as np
import pytest

import cudnnkit
from cudnnkit import lib, runtime
from cudnnkit.graph import BindingError, Graph, GraphError, PlanSpec, UnsupportedGraphError, plan_cache
from cudnnkit.graph.plan import autotuner as autotune_mod
from cudnnkit.graph.plan import builder as build_mod
from cudnnkit.graph.plan import engines as engines_mod
from cudnnkit.graph.plan import plans as plans_mod
from cudnnkit.graph.plan import search as search_mod
from cudnnkit.graph.plan import spec as spec_mod
from cudnnkit.runtime import driver

from .conftest import FakeCAI

BASE = 0x7F0000000000  # a fake device address (16-byte aligned)


# ----------------------------------------------------------------- a plan that runs without a GPU


class _Desc:
    """An execution-plan descriptor as ExecutionPlan reads it: its pointer and workspace size."""

    def __init__(self, workspace=0):
        self.ptr, self.workspace = 0x1000, workspace

    def get(self, name):
        assert name == "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE"
        return self.workspace


class _Handle:
    ptr, stream = 0x2000, None

    def __init__(self, log=None):
        self.thread = threading.get_ident()
        self.log = log  # where the streams set on it are recorded

    def set_stream(self, s):
        self.stream = s
        if self.log is not None:
            self.log.append(s)


class Fake:
    """Records what reached the (fake) GPU side: handles asked for, executes, pointer and stream checks."""

    def __init__(self, monkeypatch, *, memory=((BASE, 1 << 20, 0),), streams=()):
        self.handles, self.executes, self.pointers, self.streams, self.packs = [], [], [], [], []
        self.set_streams = []  # cudnnSetStream on a handle already made (a BoundPlan's later calls)
        self.memory = list(memory)  # (base, size, device) of the fake device allocations
        self.live = dict(streams)  # stream handle -> device

        def get_handle(device, stream, adapter=None):
            self.handles.append(stream)
            return _Handle(self.set_streams)

        def execute(h, plan, vp):
            self.executes.append((h, plan, vp))
            return 0

        def pointer_info(ptr, device=None):
            self.pointers.append(ptr)
            for base, size, dev in self.memory:
                if base <= ptr < base + size:
                    return driver.PointerInfo("device", dev, base, size)
            return driver.PointerInfo("unknown", -1, 0, 0)

        def stream_device(h):
            self.streams.append(h)
            return self.live.get(h)

        def variant_pack(uids, ptrs, ws, keep):
            self.packs.append((tuple(uids), tuple(ptrs), ws))
            return type("VariantPack", (), {"ptr": 0x3000 + len(self.packs), "_keep": list(keep)})()

        monkeypatch.setattr(plans_mod, "get_handle", get_handle)
        monkeypatch.setattr(plans_mod, "_raw_execute", lambda: execute)
        monkeypatch.setattr(plans_mod, "_RAW_EXECUTE", [execute])  # what BoundPlan calls
        monkeypatch.setattr(plans_mod, "_new_variant_pack", variant_pack)  # no cudnnBackendFinalize either
        monkeypatch.setattr(driver, "pointer_info", pointer_info)
        monkeypatch.setattr(driver, "stream_device", stream_device)
        runtime.clear_stream_cache()


@pytest.fixture(autouse=True)
def _forget_fake_streams():
    """The streams a Fake driver made known must not stay in the stream cache for later tests."""
    yield
    runtime.clear_stream_cache()


def add_graph(dims=(4, 64), strides=None, dtype="float32", scalar=False):
    """y = x + b (by-value scalar b when ``scalar``), and its plan (no GPU: a fake descriptor)."""
    g = Graph(name="add")
    x = g.tensor(dims, strides, dtype, name="x")
    b = (
        g.tensor((1,) * len(dims), None, dtype, by_value=True, name="b")
        if scalar
        else g.tensor(dims, strides, dtype, name="b")
    )
    y = g.mark_output(g.pointwise("ADD", x, b, name="y"))
    plan = plans_mod.ExecutionPlan(_Desc(), PlanSpec.of(g, 0), key=None, engine=None)
    return g, x, b, y, plan


def cai(t, ptr=BASE, **kw):
    isz = {"float32": 4, "float16": 2}[t.dtype]
    typestr = {"float32": "<f4", "float16": "<f2"}[t.dtype]
    return FakeCAI(t.dims, typestr, strides=tuple(s * isz for s in t.strides), ptr=ptr, **kw)


def raw_bindings(x, b, y):
    return {x: BASE, b: BASE + 4096, y: BASE + 8192}


# ----------------------------------------------------------------- C1: streams
#
# Stream objects (and a CAI producer's stream) are asked of the (fake) driver; a raw int from the user is
# accepted only as 0/1/2, the library's current stream or a handle already found live through its object.


class Stream:
    """A ``__cuda_stream__`` stream object over ``handle`` (a fake library's stream)."""

    def __init__(self, handle):
        self.handle_ = handle

    def __cuda_stream__(self):
        return (0, self.handle_)


RAW = "is a raw stream handle, which cannot be checked"


@pytest.mark.parametrize(
    "stream, exc, msg, asked",
    [
        (0xBAD000, ValueError, rf"stream=0xbad000 {RAW}", False),
        (2**63, ValueError, rf"stream=0x8000000000000000 {RAW}", False),
        (Stream(0xBAD000), ValueError, r"stream=0xbad000 is not a live CUDA stream", True),
        (Stream(2**63), ValueError, r"stream=0x8000000000000000 is not a live CUDA stream", True),
        (2**64, ValueError, r"stream=18446744073709551616 is not a CUDA stream handle", False),
        (-5, ValueError, r"stream=-5 is not a CUDA stream handle", False),
        (Stream(-5), ValueError, r"stream=-5 is not a CUDA stream handle", False),
        ("default", TypeError, r"stream must be None or a CUDA stream object", False),
        (1.5, TypeError, r"stream must be None", False),
        (True, TypeError, r"stream must be None", False),
    ],
)
def test_C1_arbitrary_stream_is_refused_before_cudnn_set_stream(monkeypatch, stream, exc, msg, asked):
    fake = Fake(monkeypatch)  # the fake driver knows no stream but 0, 1, 2
    g, x, b, y, plan = add_graph()
    arrays = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    with pytest.raises(exc, match=msg):
        plan.execute(arrays, stream=stream)
    with pytest.raises(exc, match=msg):
        plan.bind(arrays, stream=stream)
    with pytest.raises(exc, match=msg):
        plan.execute(raw_bindings(x, b, y), stream=stream)
    assert fake.handles == [] and fake.executes == []  # cuDNN never saw it
    # only a stream object is asked of the driver (each time: refused handles are not cached); a raw int never
    assert fake.streams == ([stream.handle_] * 3 if asked else [])


def test_C1_a_live_stream_runs_and_a_stream_of_another_device_is_refused(monkeypatch):
    fake = Fake(monkeypatch, streams={0x5000: 0, 0x6000: 1})
    g, x, b, y, plan = add_graph()
    arrays = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    plan.execute(arrays, stream=Stream(0x5000))
    assert fake.handles == [0x5000] and len(fake.executes) == 1
    with pytest.raises(ValueError, match=r"stream=0x6000 is a stream of cuda:1 but the arrays are on cuda:0"):
        plan.execute(arrays, stream=Stream(0x6000))
    for special in (0, 1, 2):  # the default, legacy and per-thread streams need no driver answer
        plan.execute(arrays, stream=special)
    assert fake.streams == [0x5000, 0x6000]
    plan.execute(arrays, stream=0x5000)  # the raw int of a stream found live through its object: cached
    with pytest.raises(ValueError, match=rf"stream=0x6000 {RAW}"):
        plan.execute(arrays, stream=0x6000)  # refused as raw (its object was of another device), not asked
    assert fake.streams == [0x5000, 0x6000]
    assert fake.handles == [0x5000, 0, 1, 2, 0x5000] and len(fake.executes) == 5


def test_C1_a_live_raw_stream_int_is_refused_before_its_object_was_seen(monkeypatch):
    fake = Fake(monkeypatch, streams={0x5000: 0})
    g, x, b, y, plan = add_graph()
    arrays = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    with pytest.raises(ValueError, match=rf"stream=0x5000 {RAW} .*pass the stream object instead"):
        plan.execute(arrays, stream=0x5000)
    with pytest.raises(ValueError, match=rf"stream=0x5000 {RAW}"):
        plan.bind(arrays, stream=0x5000)
    assert fake.streams == [] and fake.handles == []
    plan.bind(arrays, stream=0x5000, unchecked=True)  # unchecked=True trusts a raw int as given
    plan.execute(arrays, stream=0x5000, unchecked=True)
    assert fake.streams == [] and fake.handles == [0x5000]


def test_C1_the_cai_producer_stream_is_checked_too(monkeypatch):
    fake = Fake(monkeypatch, streams={0x5000: 0})
    g, x, b, y, plan = add_graph()
    xs = cai(x)
    xs.__cuda_array_interface__["stream"] = 0xBAD000  # a library without an adapter names its stream
    with pytest.raises(ValueError, match=r"the bindings' __cuda_array_interface__ stream=0xbad000 is not a live"):
        plan.execute({x: xs, b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)})
    assert fake.streams == [0xBAD000]  # a producer's int is asked of the driver, not refused as raw
    xs.__cuda_array_interface__["stream"] = 1  # CAI's legacy default stream: 0 to cuDNN
    plan.execute({x: xs, b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)})
    assert fake.handles == [0]
    xs.__cuda_array_interface__["stream"] = 0x5000  # a live stream of cuda:0, named by the producer
    plan.execute({x: xs, b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)})
    assert fake.handles == [0, 0x5000] and fake.streams == [0xBAD000, 0x5000]


def test_C1_a_bound_plan_checks_each_new_stream_once(monkeypatch):
    calls = []

    def validate(stream, adapter, device, name="stream", *, producer=False):
        h = runtime.resolve_stream(stream, adapter, device)
        calls.append(h)
        if h == 0xBAD000:
            raise ValueError(f"{name}={h:#x} is not a live CUDA stream")
        return h

    fake = Fake(monkeypatch)
    monkeypatch.setattr(spec_mod.runtime, "validate_stream", validate)
    g, x, b, y, plan = add_graph()
    bound = plan.bind({x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}, stream=Stream(0x5000))
    assert calls == [0x5000]  # at bind time
    for _ in range(3):
        bound()  # the bind-time stream: no check per call
        bound(stream=Stream(0x5000))
        bound(stream=0x5000)  # its raw int: the stream last checked
    assert calls == [0x5000] and len(fake.executes) == 9
    bound(stream=Stream(0x7000))
    bound(stream=Stream(0x7000))
    assert calls == [0x5000, 0x7000]  # a new stream: checked once
    with pytest.raises(ValueError, match="stream=0xbad000 is not a live CUDA stream"):
        bound(stream=Stream(0xBAD000))
    assert len(fake.executes) == 11  # the bad stream never reached execution
    assert fake.set_streams[-1] == 0x7000  # ran on the new stream
    trusting = plan.bind({x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}, stream=0x5000, unchecked=True)
    trusting(stream=0x9000)
    assert calls == [0x5000, 0x7000, 0xBAD000]  # unchecked=True: raw int streams are trusted


def test_C1_a_bound_plan_refuses_an_unseen_raw_stream_without_asking(monkeypatch):
    """The real validate_stream behind a BoundPlan call: a raw int is accepted only once its object was seen."""
    fake = Fake(monkeypatch, streams={0x5000: 0, 0x7000: 0})
    g, x, b, y, plan = add_graph()
    bound = plan.bind({x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}, stream=Stream(0x5000))
    bound(stream=0x5000)
    with pytest.raises(ValueError, match=rf"stream=0x7000 {RAW}"):
        bound(stream=0x7000)
    assert fake.streams == [0x5000] and len(fake.executes) == 1
    bound(stream=Stream(0x7000))  # the object: asked once
    bound(stream=0x5000)
    bound(stream=0x7000)  # now known
    assert fake.streams == [0x5000, 0x7000] and len(fake.executes) == 4
    assert fake.handles == [0x5000] and fake.set_streams == [0x7000, 0x5000, 0x7000]  # each ran on its stream


def test_C1_autotune_refuses_a_bad_stream_before_lowering(monkeypatch):
    import contextlib

    Fake(monkeypatch)
    g, x, b, y, plan = add_graph()
    ctx = search_mod.BuildContext(
        g, 0, engines_mod.EngineFilter(), ("k", 0, ()), cudnnkit.Settings(), g.label, plan.spec
    )

    def env(c):
        c.adapter, c.handle = None, _Handle()
        return contextlib.nullcontext()

    def no_plans(c, attempts):
        raise AssertionError("the graph was lowered")

    monkeypatch.setattr(autotune_mod, "build_context", lambda *a: ctx)
    monkeypatch.setattr(autotune_mod, "device_env", env)
    monkeypatch.setattr(autotune_mod, "iter_plans", no_plans)
    arrays = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    with pytest.raises(ValueError, match=rf"stream=0xbad000 {RAW}"):
        autotune_mod.autotune(g, arrays, stream=0xBAD000, device=0)
    with pytest.raises(ValueError, match="stream=0xbad000 is not a live CUDA stream"):
        autotune_mod.autotune(g, arrays, stream=Stream(0xBAD000), device=0)
    with pytest.raises(BindingError, match=r"unbound: tensor b \(uid 2\)"):  # bindings first, too
        autotune_mod.autotune(g, {x: cai(x), y: cai(y)}, device=0)


# ----------------------------------------------------------------- C2: raw pointers


def test_C2_raw_pointers_are_checked_for_device_and_allocation_size(monkeypatch):
    fake = Fake(monkeypatch, memory=[(BASE, 4096 + 1024, 0), (BASE + 8192, 1024, 0), (BASE + 16384, 1024, 1)])
    g, x, b, y, plan = add_graph()  # float32 (4, 64): 1024 bytes each
    plan.execute({x: BASE, b: BASE + 4096, y: BASE + 8192})
    assert fake.pointers == [BASE, BASE + 4096, BASE + 8192] and len(fake.executes) == 1
    cases = [
        ({y: BASE + 8192 + 512}, r"tensor y \(uid 3\)=0x7f0000002200: its allocation holds 512 bytes .* 1024 bytes"),
        ({x: BASE + 4096 + 512}, r"tensor x \(uid 1\)=.*holds 512 bytes from there on, but 1024 bytes are needed"),
        ({b: BASE + 16384}, r"tensor b \(uid 2\)=0x7f0000004000 is memory of cuda:1 but the call runs on cuda:0"),
        ({y: 0xDEAD0000}, r"tensor y \(uid 3\)=0xdead0000 is not CUDA device memory"),
        ({x: np.zeros(256, np.float32).ctypes.data // 16 * 16}, r"tensor x \(uid 1\)=0x[0-9a-f]+ is not CUDA device"),
    ]
    for change, msg in cases:
        bindings = {x: BASE, b: BASE + 4096, y: BASE + 8192, **change}
        with pytest.raises(BindingError, match=msg):
            plan.execute(bindings)
        with pytest.raises(BindingError, match=msg):
            plan.bind(bindings)
    assert len(fake.executes) == 1 and fake.handles == [0]  # none of the bad ones ran


def test_C2_the_bytes_checked_are_what_the_dims_and_strides_address(monkeypatch):
    fake = Fake(monkeypatch)
    seen = []
    real = runtime.check_device_pointer
    monkeypatch.setattr(
        runtime, "check_device_pointer", lambda p, n, d, name: seen.append((p, n, d, name)) or real(p, n, d, name)
    )
    g, x, b, y, plan = add_graph(dims=(2, 3), strides=(8, 2))  # a gapped layout: last element at 1*8 + 2*2
    plan.execute({x: BASE, b: BASE + 4096, y: BASE + 8192})
    gapped, dense = (1 * 8 + 2 * 2 + 1) * 4, 2 * 3 * 4  # y, the op's output, is packed
    assert y.strides == (3, 1)
    assert seen == [
        (BASE, gapped, 0, "tensor x (uid 1)"),
        (BASE + 4096, gapped, 0, "tensor b (uid 2)"),
        (BASE + 8192, dense, 0, "tensor y (uid 3)"),
    ]
    assert len(fake.executes) == 1


def test_C2_unchecked_trusts_raw_pointers_and_bind_checks_once(monkeypatch):
    fake = Fake(monkeypatch, memory=[])  # every pointer is unknown to the driver
    g, x, b, y, plan = add_graph()
    with pytest.raises(BindingError, match="is not CUDA device memory"):
        plan.execute(raw_bindings(x, b, y))
    plan.execute(raw_bindings(x, b, y), unchecked=True)
    run = plan.bind(raw_bindings(x, b, y), unchecked=True)
    run()
    assert len(fake.executes) == 2 and fake.pointers == [BASE]  # only the first, refused execute asked
    with pytest.raises(BindingError, match=r"raw pointer 0 is not a device pointer"):
        plan.execute({**raw_bindings(x, b, y), y: 0}, unchecked=True)  # NULL and alignment: checked anyway
    with pytest.raises(BindingError, match="not aligned to 16 bytes"):
        plan.execute({**raw_bindings(x, b, y), y: BASE + 8}, unchecked=True)
    with pytest.raises(BindingError, match=r"raw pointer 18446744073709551616 is not a device pointer"):
        plan.execute({**raw_bindings(x, b, y), y: 2**64}, unchecked=True)
    fake.memory = [(BASE, 1 << 20, 0)]
    run = plan.bind(raw_bindings(x, b, y))
    asked = len(fake.pointers)
    for _ in range(5):
        run()
    assert len(fake.pointers) == asked == 4  # checked at bind time, not per call


def test_C2_a_raw_workspace_pointer_is_checked_for_the_plan_s_workspace_size(monkeypatch):
    fake = Fake(monkeypatch, memory=[(BASE, 1 << 16, 0), (BASE + (1 << 20), 256, 0)])
    g, x, b, y, _ = add_graph()
    plan = plans_mod.ExecutionPlan(_Desc(workspace=4096), PlanSpec.of(g, 0), key=None, engine=None)
    arrays = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    with pytest.raises(BindingError, match=r"workspace=0x7f0000100000: its allocation holds 256 bytes.* 4096 bytes"):
        plan.execute(arrays, workspace=BASE + (1 << 20))
    with pytest.raises(BindingError, match=r"workspace: raw pointer 0 is not a device pointer"):
        plan.execute(arrays, workspace=0)
    with pytest.raises(BindingError, match="workspace has 16 bytes, the plan needs 4096"):
        plan.execute(arrays, workspace=FakeCAI((16,), "|u1", ptr=BASE))
    plan.execute(arrays, workspace=BASE + 32768)
    plan.execute(arrays, workspace=BASE + (1 << 20), unchecked=True)
    assert len(fake.executes) == 2


@pytest.mark.skipif(driver.available(), reason="checks the message given when there is no driver to ask")
def test_C2_without_a_driver_raw_pointers_are_refused_with_the_way_out():
    g, x, b, y, plan = add_graph()
    with pytest.raises(
        BindingError, match=r"tensor x \(uid 1\)=0x7f0000000000: a raw pointer cannot be checked.*unchecked=True"
    ):
        plan.execute(raw_bindings(x, b, y))


def test_C2_an_array_must_cover_the_tensor_s_footprint():
    g, x, b, y, plan = add_graph(dims=(2, 3), strides=(8, 2))
    good = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    plan.spec.resolve(good)
    with pytest.raises(BindingError, match=r"tensor x \(uid 1\): strides \(3, 1\), the plan expects \(8, 2\)"):
        plan.spec.resolve({**good, x: FakeCAI((2, 3), "<f4", ptr=BASE)})  # 24 bytes for a 52-byte footprint
    with pytest.raises(BindingError, match=r"tensor x \(uid 1\): shape \(2, 2\), the plan expects \(2, 3\)"):
        plan.spec.resolve({**good, x: FakeCAI((2, 2), "<f4", strides=(32, 8), ptr=BASE)})


# ----------------------------------------------------------------- U6: cuDNN refusals while lowering


def _avg_graph():
    g = Graph(name="mean")
    x = g.tensor((2, 8, 4, 4), name="x")
    g.mark_output(g.reduction(x, (2, 8, 1, 1), mode="avg", name="m"))
    return g


def test_U6_a_lone_avg_reduction_is_unsupported_graph_error_naming_the_op():
    g = _avg_graph()
    try:
        g.lower()
    except UnsupportedGraphError as e:
        msg = str(e)
        assert "refused graph mean (1 ops: reduction) while lowering it" in msg
        assert "operation #0 reduction(mode='avg'): x=tensor x (uid 1) -> y=tensor m (uid 2)" in msg
        assert e.attempts[0].stage == "lower" and e.attempts[0].status.startswith("CUDNN_STATUS_NOT_SUPPORTED")
        assert isinstance(e.__cause__, lib.CudnnError) and not isinstance(e, lib.CudnnError)
        assert "does not offer this operation, mode" in msg
    else:
        assert lib.version() >= 92000, "cuDNN 9.19 refuses the avg reduction descriptor"


def test_U6_build_raises_unsupported_graph_error_not_a_bare_cudnn_error(monkeypatch):
    import contextlib

    def env(c):
        c.adapter, c.handle = None, type("H", (), {"ptr": None})()
        return contextlib.nullcontext()

    monkeypatch.setattr(build_mod, "device_env", env)
    g = _avg_graph()
    if lib.version() >= 92000:
        pytest.skip("only cuDNN 9.19 is known to refuse the avg reduction")
    with pytest.raises(UnsupportedGraphError, match=r"reduction\(mode='avg'\)") as e:
        g.build(0)
    assert isinstance(e.value.__cause__, lib.NotSupportedError)


def test_U6_heuristics_and_plan_failures_are_attempts_a_missing_driver_is_not(monkeypatch):
    import contextlib

    g = Graph(name="relu")
    g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3))))

    class Low:
        op_graph = None

    monkeypatch.setattr(Graph, "lower", lambda self, handle=None: Low())

    def env(c):
        c.adapter, c.handle = None, type("H", (), {"ptr": None})()
        return contextlib.nullcontext()

    monkeypatch.setattr(build_mod, "device_env", env)
    refused = lib.NotSupportedError(lib.CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize", "no engine here")
    monkeypatch.setattr(engines_mod, "_heuristics", lambda op_graph, mode: (_ for _ in ()).throw(refused))
    with pytest.raises(
        UnsupportedGraphError, match=r"heuristics mode a \[heuristics\]: CUDNN_STATUS_NOT_SUPPORTED: no engine here"
    ):
        g.build(0)
    no_driver = lib.DriverNotFoundError(lib.CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, "cudnnBackendFinalize")
    monkeypatch.setattr(engines_mod, "_heuristics", lambda op_graph, mode: (_ for _ in ()).throw(no_driver))
    with pytest.raises(lib.DriverNotFoundError) as e:
        g.build(0)
    assert e.value is no_driver  # unchanged: tests and the doctor rely on it


@pytest.mark.parametrize(
    "error",
    [
        lib.DriverNotFoundError(lib.CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, "cudnnBackendFinalize"),
        lib.FeatureVersionError("CUDNN_ATTR_X is newer than the loaded cuDNN"),
    ],
    ids=["no-driver", "feature-version"],
)
def test_U6_driver_and_feature_version_errors_pass_through_lowering_unchanged(monkeypatch, error):
    def fail(self, t):
        raise error

    monkeypatch.setattr(Graph, "_lower_tensor", fail)
    with pytest.raises(type(error)) as e:
        _avg_graph().lower()
    assert e.value is error


def test_U6_a_refused_tensor_names_the_tensor(monkeypatch):
    def fail(self, t):
        raise lib.BadParamError(lib.CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize", "dims too large")

    monkeypatch.setattr(Graph, "_lower_tensor", fail)
    with pytest.raises(UnsupportedGraphError) as e:
        _avg_graph().lower()
    msg = str(e.value)
    assert "tensor x (uid 1) dims (2, 8, 4, 4) strides (128, 16, 4, 1) float32 [lower]: CUDNN_STATUS_BAD_PARAM" in msg
    assert "dims too large" in msg and "rejected a value of the definition" in msg
    assert isinstance(e.value, GraphError) and isinstance(e.value.__cause__, lib.BadParamError)


# ----------------------------------------------------------------- U8: argument types and values


@pytest.mark.parametrize(
    "make, exc, msg",
    [
        (lambda g: g.tensor(("a",)), TypeError, r"dims must be a sequence of ints, got \('a',\) \(dims\[0\] is str\)"),
        (lambda g: g.tensor(5), TypeError, r"dims must be a sequence of ints, got int 5"),
        (lambda g: g.tensor("23"), TypeError, r"dims must be a sequence of ints, got str '23'"),
        (lambda g: g.tensor((2.5, 3)), TypeError, r"dims\[0\] is float"),
        (lambda g: g.tensor((3.0, 3)), TypeError, r"dims\[0\] is float"),  # integral floats too, as in torch
        (lambda g: g.tensor((True, 3)), TypeError, r"dims\[0\] is bool"),
        (lambda g: g.tensor((2, None)), TypeError, r"dims\[1\] is NoneType"),
        (lambda g: g.tensor((2, 3), (3.0, 1)), TypeError, r"strides must be a sequence of ints.*strides\[0\] is float"),
        (lambda g: g.tensor((2, 3), 1), TypeError, r"strides must be a sequence of ints, got int 1"),
        (lambda g: g.tensor((2, -3)), GraphError, r"dims must be positive, got \(2, -3\)"),
        (lambda g: g.tensor((2, 3), (0, 1)), GraphError, r"strides \(0, 1\) must be 2 positive ints"),
        (lambda g: g.tensor((2**62, 4)), GraphError, r"address more than 2\*\*63 bytes"),
        (lambda g: g.tensor((2**64,)), GraphError, r"dims must hold int64 values"),
        (lambda g: g.tensor((2, 3), name=7), TypeError, r"name must be a str, got int 7"),
        (lambda g: Graph(alignment="16"), TypeError, r"alignment must be an int, got str '16'"),
        (lambda g: Graph(alignment=16.0), TypeError, r"alignment must be an int, got float 16.0"),
        (lambda g: Graph(alignment=24), ValueError, r"alignment must be a power of two, got 24"),
        (lambda g: Graph(compute_dtype="float128"), TypeError, r"compute_dtype 'float128' is not a type"),
    ],
)
def test_U8_dims_strides_and_alignment(make, exc, msg):
    with pytest.raises(exc, match=msg):
        make(Graph())


def test_U8_numpy_integers_are_ints():
    g = Graph(alignment=np.int64(32))
    t = g.tensor((np.int64(2), np.int32(3)), np.array([3, 1]))
    assert t.dims == (2, 3) and t.strides == (3, 1) and g.alignment == 32
    assert all(type(v) is int for v in (*t.dims, *t.strides, g.alignment))  # plain ints in the key


def _x(g):
    return g.tensor((2, 8), name="x")


@pytest.mark.parametrize(
    "make, exc, msg",
    [
        (lambda g: g.pointwise("ADD", _x(g), _x(g), alpha1="2"), TypeError, r"alpha1 must be a real number"),
        (lambda g: g.pointwise("ADD", _x(g), _x(g), alpha2=None), TypeError, r"alpha2 must be a real number"),
        (lambda g: g.pointwise("EXP", _x(g), alpha1=True), TypeError, r"alpha1 must be a real number, got the bool"),
        (lambda g: g.pointwise("EXP", _x(g), alpha1=math.nan), ValueError, r"alpha1 must be finite, got nan"),
        (lambda g: g.pointwise("EXP", _x(g), alpha1=math.inf), ValueError, r"alpha1 must be finite"),
        (lambda g: g.pointwise("EXP", _x(g), alpha1=1e300), ValueError, r"alpha1=1e\+300 overflows float32"),
        (lambda g: g.pointwise("RELU_FWD", _x(g), relu_lower_clip="0"), TypeError, r"relu_lower_clip must be a real"),
        (lambda g: g.pointwise("SWISH_FWD", _x(g), swish_beta=math.inf), ValueError, r"swish_beta must be finite"),
        (lambda g: g.pointwise("ELU_FWD", _x(g), elu_alpha=[1.0]), TypeError, r"elu_alpha must be a real number"),
        (lambda g: g.pointwise("GEN_INDEX", _x(g), axis=1.0), TypeError, r"axis must be an int, got float 1.0"),
        (lambda g: g.pointwise("GEN_INDEX", _x(g), axis=2), GraphError, r"axis 2 is out of range for x of rank 2"),
        (lambda g: g.pointwise(5, _x(g)), GraphError, r"unknown pointwise mode 5"),
        (lambda g: g.reduction(_x(g), (2, 1), mode=["add"]), GraphError, r"reduction mode must be one of"),
        (lambda g: g.reduction(_x(g), (2, 1.0)), TypeError, r"out_dims must be a sequence of ints"),
        (lambda g: g.rng((4,), seed=1, probability="0.5"), TypeError, r"probability must be a real number"),
        (lambda g: g.rng((4,), seed=1, probability=math.nan), ValueError, r"probability must be finite"),
        (lambda g: g.rng((4,), seed=1, distribution="normal", mean=math.nan), ValueError, r"mean must be finite"),
        (lambda g: g.rng((4,), seed=1, distribution="normal", std="1"), TypeError, r"std must be a real number"),
        (
            lambda g: g.rng((4,), seed=1, distribution="uniform", maximum=math.inf),
            ValueError,
            r"maximum must be finite",
        ),
        (lambda g: g.rng((4,), seed=1, distribution=["normal"]), GraphError, r"distribution must be one of"),
        (lambda g: g.rng((4.0,), seed=1), TypeError, r"dims must be a sequence of ints"),
        (lambda g: g.scalar("abc"), TypeError, r"value must be a real number"),
        (lambda g: g.scalar(math.nan), ValueError, r"value must not be NaN"),
        (lambda g: g.scalar(2.5, "int32"), TypeError, r"value must be an int, got float 2.5"),
        (lambda g: g.scalar(2**40, "int32"), ValueError, r"value=1099511627776 does not fit int32"),
        (lambda g: g.scalar(1e6, "float16"), ValueError, r"value=1000000.0 is outside float16's range"),
        (lambda g: g.scalar(1e300), ValueError, r"value=1e\+300 overflows float32"),
        (lambda g: g.scalar(1.0, ndim=2.0), TypeError, r"ndim must be an int"),
        (lambda g: g.reshape(_x(g), perm=(1.0, 0.0)), TypeError, r"perm must be a sequence of ints"),
        (lambda g: g.reshape(_x(g), (16.0,)), TypeError, r"dims must be a sequence of ints"),
        (lambda g: g.concat([_x(g), _x(g)], "0"), TypeError, r"axis must be an int, got str '0'"),
        (lambda g: g.concat(_x(g), 0), TypeError, r"inputs must be a sequence of Tensors, got Tensor"),
        (lambda g: g.concat([_x(g)], 0, inplace_index=0.0), TypeError, r"inplace_index must be an int"),
        (
            lambda g: g.conv_dgrad(g.tensor((1, 4, 6, 6)), g.tensor((4, 4, 3, 3)), (1.0, 4, 8, 8)),
            TypeError,
            r"x_dims must be a sequence of ints",
        ),
        (
            lambda g: g.conv_wgrad(g.tensor((1, 4, 8, 8)), g.tensor((1, 4, 6, 6)), (4, 4, 3)),
            GraphError,
            r"conv_wgrad needs x, dy and w_dims of one rank >= 3",
        ),
        (
            lambda g: g.norm_forward("layer", g.tensor((2, 4)), g.tensor((1, 4)), g.tensor((1, 4)), epsilon=math.nan),
            ValueError,
            r"epsilon must be finite",
        ),
        (
            lambda g: g.norm_forward("layer", g.tensor((2, 4)), g.tensor((1, 4)), g.tensor((1, 4)), epsilon="1e-5"),
            TypeError,
            r"epsilon must be a number or a Tensor, got str",
        ),
        (lambda g: g.norm_forward(["batch"], g.tensor((2, 4)), g.tensor((1, 4))), GraphError, r"mode must be one of"),
    ],
)
def test_U8_non_numeric_and_non_finite_parameters(make, exc, msg):
    g = Graph()
    with pytest.raises(exc, match=msg):
        make(g)


@pytest.mark.parametrize(
    "kw, exc, msg",
    [
        ({"dropout": "0.1"}, TypeError, r"dropout must be a real number"),
        ({"dropout": math.nan}, ValueError, r"dropout must be finite"),
        ({"scale": "x"}, TypeError, r"scale must be a number or a Tensor, got str"),
        ({"scale": math.inf}, ValueError, r"scale must be finite"),
        ({"o_strides": (1.0, 2, 3, 4)}, TypeError, r"o_strides must be a sequence of ints"),
        ({"implementation": ["composite"]}, GraphError, r"implementation must be 'composite' or 'unified'"),
    ],
)
def test_U8_sdpa_parameters(kw, exc, msg):
    g = Graph()
    q, k, v = (g.tensor((1, 2, 16, 8), dtype="bfloat16", name=n) for n in "qkv")
    with pytest.raises(exc, match=msg):
        g.sdpa_forward(q, k, v, **kw)


def test_U8_a_refused_definition_leaves_the_graph_as_it_was():
    g = Graph()
    x = _x(g)
    q, k, v = (g.tensor((1, 2, 16, 8), dtype="bfloat16", name=n) for n in "qkv")
    before = g.tensors()
    with pytest.raises(TypeError):
        g.pointwise("EXP", x, alpha1="2")
    with pytest.raises(ValueError):
        g.pointwise("GEN_INDEX", x, axis=5)
    with pytest.raises(TypeError):
        g.reduction(x, (2, 1), compute_dtype="float128")
    with pytest.raises(TypeError):
        g.sdpa_forward(q, k, v, o_strides="x")
    assert g.tensors() == before and g._nodes == []  # no stray output tensor from a refused call


def test_U8_constants_keep_what_masks_need():
    g = Graph()
    assert g.constants() == {}
    ninf = g.scalar(-math.inf, name="fill")
    i = g.scalar(np.int64(7), "int32", name="n")
    t = g.scalar(True, "bool", name="flag")
    f = g.scalar(np.float32(0.5), name="half")
    c = g.constants()
    assert c[ninf.uid] == (-math.inf, "float32") and c[i.uid] == (7, "int32") and c[t.uid] == (1, "bool")
    assert c[f.uid] == (0.5, "float32") and type(c[i.uid][0]) is int


# ----------------------------------------------------------------- U12: device=-1 everywhere


@pytest.mark.parametrize(
    "call",
    [
        lambda g: g.build(-1),
        lambda g: build_mod.build(g, device=-1),
        lambda g: plan_cache(-1),
        lambda g: cudnnkit.graph.load_plan(
            json.dumps({"format": "cudnnkit.plan/1", "cudnn_version": lib.version(), "plan": "{}", "spec": {}}), -1
        ),
        lambda g: g.autotune({}, device=-1),
        lambda g: autotune_mod.autotune(g, {}, device=-1),
    ],
    ids=["Graph.build", "build", "plan_cache", "load_plan", "Graph.autotune", "autotune"],
)
def test_U12_a_negative_device_is_refused_by_name_at_every_entry_point(call):
    g = Graph()
    g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3))))
    with pytest.raises(ValueError, match=r"device must be a CUDA device ordinal \(an int >= 0\) or None, got -1"):
        call(g)


def test_U12_execute_takes_its_device_from_the_bindings():
    g = Graph()
    g.mark_output(g.pointwise("RELU_FWD", g.tensor((2, 3))))
    with pytest.raises(TypeError, match=r"unknown build option\(s\) \['device'\]"):
        g.execute({}, device=-1)


def test_U12_load_plan_refuses_an_incomplete_document_before_the_device():
    doc = {"format": "cudnnkit.plan/1", "cudnn_version": lib.version()}
    with pytest.raises(ValueError, match="not a complete serialized cudnnkit plan: no plan, spec"):
        cudnnkit.graph.load_plan(json.dumps(doc), 0)


# ----------------------------------------------------------------- bindings, each named


def test_bindings_unknown_virtual_twice_and_missing_are_named():
    g, x, b, y, plan = add_graph()
    good = {x: cai(x), b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)}
    spec = plan.spec
    spec.resolve(good)
    with pytest.raises(BindingError, match=r"uid 9 is not a non-virtual tensor of this plan \(bindable: \['tensor x"):
        spec.resolve({**good, 9: cai(x)})
    g2 = Graph()
    t = g2.tensor((4, 64), name="t")
    e = g2.pointwise("EXP", t, name="e")  # virtual, uid 2
    g2.mark_output(g2.pointwise("SQRT", e, name="r"))
    with pytest.raises(BindingError, match=r"tensor e \(uid 2\) is virtual .* mark_output\(\) it to bind it"):
        PlanSpec.of(g2, 0).resolve({t: cai(t), e: cai(t)})
    other = Graph().tensor((2,), name="o")  # uid 1 of another graph, with other dims than x
    with pytest.raises(BindingError, match=r"binding key uid 1 is \(2,\)/float32 .* a tensor of another graph"):
        spec.resolve({**good, other: cai(x)})
    with pytest.raises(BindingError, match=r"tensor x \(uid 1\) is bound twice"):
        spec.resolve({**good, 1: cai(x)})
    with pytest.raises(BindingError, match=r"unbound: tensor b \(uid 2\), tensor y \(uid 3\)"):
        spec.resolve({x: cai(x)})


@pytest.mark.parametrize(
    "array, msg",
    [
        (FakeCAI((4, 64), "<f2"), r"tensor x \(uid 1\): dtype float16, the plan expects float32"),
        (FakeCAI((4, 32), "<f4"), r"tensor x \(uid 1\): shape \(4, 32\), the plan expects \(4, 64\)"),
        (FakeCAI((4, 64), "<f4", strides=(4, 16)), r"tensor x \(uid 1\): strides \(1, 4\), the plan expects \(64, 1\)"),
        (FakeCAI((4, 64), "<f4", device=1), r"tensor x \(uid 1\): on cuda:1, but the plan was built for device=0"),
    ],
)
def test_bindings_wrong_dtype_shape_strides_device(array, msg):
    g, x, b, y, plan = add_graph()
    with pytest.raises(BindingError, match=msg):
        plan.spec.resolve({x: array, b: cai(b, BASE + 4096), y: cai(y, BASE + 8192)})


@pytest.mark.parametrize(
    "value, dtype, msg",
    [
        (FakeCAI((1, 1), "<f4"), "float32", r"tensor b \(uid 2\) is a by-value scalar: bind a Python number, got"),
        (np.ones((1, 1), np.float32), "float32", r"by-value scalar: bind a Python number, got numpy.ndarray"),
        ("2.0", "float32", r"by-value scalar: bind a Python number, got builtins.str"),
        (None, "float32", r"by-value scalar: bind a Python number, got builtins.NoneType"),
        (1 + 2j, "float32", r"by-value scalar: bind a Python number, got builtins.complex"),
        (True, "float32", r"float32 by-value scalar: bind a number, not the bool True"),
        (1e300, "float32", r"1e\+300 is outside the range of the float32 by-value scalar"),
        (1e6, "float16", r"1000000.0 is outside the range of the float16 by-value scalar"),
    ],
)
def test_bindings_by_value_scalars_take_numbers_only(value, dtype, msg):
    g, x, b, y, plan = add_graph(dtype=dtype, scalar=True)
    with pytest.raises(BindingError, match=msg):
        plan.spec.resolve({x: cai(x), b: value, y: cai(y, BASE + 8192)})


def test_bindings_by_value_scalars_accept_numpy_scalars_and_infinities():
    g, x, b, y, plan = add_graph(scalar=True)
    for value, want in ((np.float32(0.5), 0.5), (3, 3.0), (-math.inf, -math.inf), (np.int64(2), 2.0)):
        r = plan.spec.resolve({x: cai(x), b: value, y: cai(y, BASE + 8192)})
        assert r.scalars == struct.pack("<f", want)


def test_bindings_integer_and_bool_by_value_scalars():
    assert spec_mod._scalar_bytes(np.int32(-3), "int32", "s") == struct.pack("<i", -3)
    assert spec_mod._scalar_bytes(True, "bool", "s") == b"\x01" and spec_mod._scalar_bytes(0, "bool", "s") == b"\x00"
    with pytest.raises(BindingError, match=r"s is a int32 by-value scalar: bind an int, got 2.5"):
        spec_mod._scalar_bytes(2.5, "int32", "s")
    with pytest.raises(BindingError, match=r"s: 4294967296 does not fit the int32 by-value scalar"):
        spec_mod._scalar_bytes(2**32, "int32", "s")
    with pytest.raises(BindingError, match=r"s is a bool by-value scalar: bind True/False \(or 0/1\), got 2"):
        spec_mod._scalar_bytes(2, "bool", "s")


@pytest.mark.parametrize(
    "graph, exc, msg",
    [
        (None, TypeError, r"graph must be a cudaGraph_t"),
        ("g", TypeError, r"graph must be a cudaGraph_t \(an int or a cuda.bindings graph\), got str"),
        (0, ValueError, r"graph must be a cudaGraph_t handle, got 0"),
        (-1, ValueError, r"graph must be a cudaGraph_t handle, got -1"),
    ],
)
def test_cuda_graph_handle_is_checked(graph, exc, msg):
    with pytest.raises(exc, match=msg):
        plans_mod._graph_ptr(graph)


# ----------------------------------------------------------------- the fast paths stay fast


def test_C2_driver_queries_only_in_the_checked_paths(monkeypatch):
    """``plan.execute(dict)`` with raw pointers asks the driver once per pointer per call; ``unchecked=True`` and
    a bound plan's calls ask nothing. Counted, not timed: host time is the benchmark harness's job."""
    fake = Fake(monkeypatch)
    g, x, b, y, plan = add_graph()
    raw = raw_bindings(x, b, y)
    before = len(fake.pointers)
    plan.execute(raw)
    per_call = len(fake.pointers) - before
    assert per_call == 3
    plan.execute(raw)
    assert len(fake.pointers) - before == 2 * per_call  # no cache: a freed pointer is caught on the next call
    asked = len(fake.pointers)
    plan.execute(raw, unchecked=True)
    assert len(fake.pointers) == asked
    bound = plan.bind(raw)
    asked = len(fake.pointers)
    for _ in range(5):
        bound()
    assert len(fake.pointers) == asked
