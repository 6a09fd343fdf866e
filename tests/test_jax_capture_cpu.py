"""XLA's command-buffer (CUDA-graph) trait of the JAX targets, on JAX's CPU platform: a declaration's
``capture_safe`` and its runner's together decide the trait each FFI target answers XLA's metadata query with; the
CUDA runner allocates outside XLA during every call, so no cudnnkit target declares it today; the declarations'
own flags are pinned (which ones synchronize or keep host-side state is a decision, not an accident). The CUDA
runner declares it only on request (``enable_command_buffers``): a captured call then allocates from an arena kept
for the graph's replays, keyed by its attributes and buffers, with the capture mode relaxed (a fake driver here)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit import autograd  # noqa: E402
from cudnnkit.jax import _ffi, _ops  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402

from .test_jax_ops_cpu import NumpyRunner, on_the_cpu  # noqa: E402,F401  (the autouse fixture: arrays on JAX's CPU)


def _traits(h: _ffi.Handler) -> int:
    """What ``h`` answers XLA's metadata query with (a call frame carrying the metadata extension)."""
    md = _ffi._Metadata(ctypes.sizeof(_ffi._Metadata))
    ext = _ffi._MetadataExtension(_ffi._ExtensionBase(ctypes.sizeof(_ffi._MetadataExtension), 1, None),
                                  ctypes.pointer(md))  # fmt: skip
    frame = _ffi._CallFrame(ctypes.sizeof(_ffi._CallFrame),
                            ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(_ffi._ExtensionBase)))  # fmt: skip
    assert h._entry(ctypes.pointer(frame)) is None
    return int(md.traits)


class CapturableRunner(NumpyRunner):
    capture_safe = True


def _double(name: str, capture_safe: bool) -> Differentiable:
    return Differentiable(name, "softmax_forward", ("x",), ("out",), lambda x: ((x * 2,), {}),
                          lambda res, douts, needs: (douts[0] * 2,), lambda x: ((new_like(x),), {}),
                          capture_safe=capture_safe)  # fmt: skip


@pytest.mark.parametrize(
    "name, declared, runner, expected",
    [
        ("capture_both", True, CapturableRunner, True),
        ("capture_op_only", True, NumpyRunner, False),  # a runner without the attribute: not capture-safe
        ("capture_runner_only", False, CapturableRunner, False),
    ],
)
def test_the_trait_reaches_the_registration_metadata(name, declared, runner, expected):
    """The forward and backward targets of a stand-in are registered with ``command_buffer`` = the declaration's
    flag and the runner's; XLA asks each handler for its metadata when it first compiles a call, and the answer
    carries the trait (XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE = 1) exactly then."""
    op = _ops.JaxOp(_double(name, declared), runner(), namespace="cudnnkit_capturetest")
    assert op.command_buffer is expected
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    g = jax.jit(jax.grad(lambda a: op(a).sum()))(x)  # both targets compiled: XLA queries both
    np.testing.assert_allclose(np.asarray(g), 2.0)
    for target in (op.forward_name, op.backward_name):
        h = _ffi.registered()[(target, "cpu")]
        assert h.command_buffer is expected
        assert h.metadata_queries >= 1, f"XLA never asked {target} for its traits"
        assert _traits(h) == (1 if expected else 0)


#: the declarations whose warm calls queue device work only (each carries its one-line reason where it is declared)
CAPTURE_SAFE = {
    "activation", "affine_grid", "attention", "batch_norm", "convolution", "convolution_transpose", "divisive_normalization",
    "grid_sample", "instance_norm", "layer_norm", "lrn", "pooling", "rms_norm", "sdpa", "softmax", "transform_tensor",
}  # fmt: skip
#: and those that are not: host divisions (op_tensor, reduce_tensor), host reads and uploads (ctc_loss), host
#: uploads and host-side state (rnn), RNG state (dropout)
NOT_CAPTURE_SAFE = {"op_tensor", "reduce_tensor", "ctc_loss", "rnn", "dropout"}


def test_the_declarations_flags_are_the_decided_ones():
    flags = {n: autograd.get(n).capture_safe for n in autograd.functions()}
    assert all(isinstance(v, bool) for v in flags.values())
    assert {n for n, v in flags.items() if v} == CAPTURE_SAFE & set(flags)
    assert NOT_CAPTURE_SAFE & set(flags) <= {n for n, v in flags.items() if not v}


def test_by_default_no_cuda_target_declares_the_trait(monkeypatch):
    """Command buffers are opt-in: by default the CUDA runner is not capture-safe, so even a capture-safe
    declaration's targets are registered without the trait; turned on, exactly the capture-safe ones declare it."""
    import cudnnkit.jax as cj
    from cudnnkit.jax import _cuda
    from cudnnkit.jax._cuda import RUNNER

    monkeypatch.setattr(_cuda, "_capture", [False])
    assert RUNNER.capture_safe is False
    for name in autograd.functions():
        assert cj.op(name).command_buffer is False, name
    monkeypatch.setattr(_cuda, "_capture", [True])
    for name in autograd.functions():
        assert cj.op(name).command_buffer is (name in CAPTURE_SAFE), name


def test_enable_command_buffers_refuses_once_a_target_is_registered_with_the_other_trait(monkeypatch):
    from cudnnkit.jax import _cuda

    monkeypatch.setattr(_cuda, "_capture", [False])
    monkeypatch.setattr(_ops, "REGISTERED", [])
    op = _ops.JaxOp(_double("capture_fixed", True), _cuda.RUNNER, namespace="cudnnkit_capturetest")
    monkeypatch.setattr(op.runner.__class__, "platform", "cpu")  # registrable on JAX's CPU platform
    op._register()
    assert op.traits is False and _ops.REGISTERED == [op]
    with pytest.raises(RuntimeError, match=r"enable_command_buffers\(True\).*capture_fixed.*before the first call"):
        _cuda.enable_command_buffers(True)
    assert _cuda.RUNNER.capture_safe is False
    assert _cuda.enable_command_buffers(False) is False  # the same trait: nothing to refuse


class _Held:
    """driver.HeldMemory stand-in: addresses from a counter, frees recorded."""

    made: list = []
    freed: list = []

    def __init__(self, nbytes, device):
        self.nbytes, self.device = nbytes, device
        self.ptr = 0x10000 * (len(_Held.made) + 1)
        _Held.made.append(self)

    def free(self):
        _Held.freed.append(self.ptr)


@pytest.fixture
def held(monkeypatch):
    from cudnnkit.runtime import driver

    monkeypatch.setattr(driver, "HeldMemory", _Held)
    monkeypatch.setattr(_Held, "made", [])
    monkeypatch.setattr(_Held, "freed", [])
    return _Held


def test_an_arena_hands_the_same_blocks_to_every_call_and_keeps_a_replaced_one(held):
    from cudnnkit.runtime.adapters import _raw

    arena = _raw.Arena(0)
    with _raw.from_arena(arena):
        first = [_raw.ADAPTER.empty((4, 8), "float32", 0).ptr, _raw.ADAPTER.empty((100,), "uint8", 0).ptr]
        other_device = _raw.ADAPTER.empty  # device 1 is not the arena's: the pool, not the arena (not called here)
    assert len(held.made) == 2 and len(set(first)) == 2
    with _raw.from_arena(arena):  # a later call: the same sizes get the same addresses, nothing new made
        again = [_raw.ADAPTER.empty((4, 8), "float32", 0).ptr, _raw.ADAPTER.empty((100,), "uint8", 0).ptr]
        a = _raw.ADAPTER.empty((2,), "float32", 0)
    assert again == first and len(held.made) == 3 and a.base is arena
    with _raw.from_arena(arena):  # the first block too small now: a new one, the old kept (a graph may address it)
        grown = _raw.ADAPTER.empty((64, 8), "float32", 0).ptr
    assert grown not in first and arena.retired and arena.retired[0].ptr == first[0] and not held.freed
    assert arena.nbytes == 64 * 8 * 4 + 100 + 8 + 4 * 8 * 4
    assert _raw._current.arena is None and other_device


class _Capture:
    def __init__(self):
        self.entered = 0

    def __call__(self):
        outer = self

        class _Ctx:
            def __enter__(self):
                outer.entered += 1

            def __exit__(self, *exc):
                return False

        return _Ctx()


def test_a_captured_call_runs_with_its_arena_and_the_capture_mode_relaxed(monkeypatch, held):
    """The runner's scope: not capturing (or not enabled) -> the pool; capturing -> the arena of (kw, device,
    buffers), the same one for the same buffers, another for other buffers; released on request."""
    from cudnnkit.jax import _cuda
    from cudnnkit.runtime import driver
    from cudnnkit.runtime.adapters import _raw

    relaxed = _Capture()
    capturing = [False]
    monkeypatch.setattr(driver, "relaxed_capture", relaxed)
    monkeypatch.setattr(driver, "stream_capturing", lambda stream, device: capturing[0])
    monkeypatch.setattr(_cuda, "_device", lambda call: 0)
    monkeypatch.setattr(driver, "pushed", lambda device: _Capture()())
    monkeypatch.setattr(_cuda, "_arenas", {})

    def call(ptr):
        b = _ffi.Buffer("float32", (4,), ptr, 0)
        return _ffi.Call(0x5000, [b], [_ffi.Buffer("float32", (4,), ptr + 64, 0)], {"kw": "{'axis': -1}"})

    def arena_in(c):
        with _cuda.RUNNER.scope(c):
            return _raw._current.arena

    for enabled, capture in ((False, True), (True, False)):
        monkeypatch.setattr(_cuda, "_capture", [enabled])
        capturing[0] = capture
        assert arena_in(call(0x9000)) is None
    assert relaxed.entered == 0
    monkeypatch.setattr(_cuda, "_capture", [True])
    capturing[0] = True
    a1, a2, b = arena_in(call(0x9000)), arena_in(call(0x9000)), arena_in(call(0xA000))
    assert a1 is a2 and b is not a1 and relaxed.entered == 3
    with _cuda.RUNNER.scope(call(0x9000)):
        _raw.ADAPTER.empty((4,), "float32", 0)
    assert _cuda.captured_memory() == {"arenas": 2, "bytes": 16}
    _cuda.release_captured_memory()
    assert _cuda.captured_memory() == {"arenas": 0, "bytes": 0} and held.freed == [held.made[0].ptr]


def test_a_call_runs_on_its_buffers_device_and_without_addresses_on_its_streams(monkeypatch):
    """Two devices (``shard_map`` runs one target on each): the runner's scope makes current the device of the
    call's memory (``cuPointerGetAttributes``), and for a call whose buffers are all empty (no address to ask
    about) the device of XLA's stream, never device 0 by default."""
    from cudnnkit.jax import _cuda
    from cudnnkit.runtime import driver
    from cudnnkit.runtime.adapters import _raw

    pushed = []

    class Pushed:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            pushed.append(self.device)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(driver, "pushed", Pushed)
    monkeypatch.setattr(_cuda, "_capture", [False])
    monkeypatch.setattr(driver, "pointer_info", lambda ptr, device=None: driver.PointerInfo("device", 1, ptr, 64))
    monkeypatch.setattr(driver, "stream_device", {0x5000: 1}.get)

    def call(ptr, shape):
        return _ffi.Call(0x5000, [_ffi.Buffer("float32", shape, ptr, 0)], [_ffi.Buffer("float32", shape, ptr, 0)], {})

    for c in (call(0x9000, (4,)), call(0, (0, 4))):  # memory on cuda:1; no memory at all, XLA's stream on cuda:1
        with _cuda.RUNNER.scope(c):
            assert (c.device, _raw._current.device, _raw._current.stream) == (1, 1, 0x5000)
    assert pushed == [1, 1]


def test_held_memory_and_the_relaxed_capture_mode_on_a_fake_driver(monkeypatch):
    """HeldMemory: cuMemAlloc (no stream, no pool) with the thread's capture mode exchanged for relaxed (2) and
    restored; freed once with cuMemFree."""
    from cudnnkit.runtime import driver

    calls = []

    class Cuda:
        def cuDevicePrimaryCtxRetain(self, pctx, device):
            pctx._obj.value = 0xC000
            return 0

        def cuCtxPushCurrent_v2(self, ctx):
            return 0

        def cuCtxPopCurrent_v2(self, pctx):
            return 0

        def cuThreadExchangeStreamCaptureMode(self, pmode):
            calls.append(("mode", pmode._obj.value))
            pmode._obj.value = {2: 1, 1: 2}[pmode._obj.value]  # the thread was in thread-local mode (1)
            return 0

        def cuMemAlloc_v2(self, pptr, nbytes):
            calls.append(("alloc", nbytes))
            pptr._obj.value = 0xD000
            return 0

        def cuMemFree_v2(self, ptr):
            calls.append(("free", ptr))
            return 0

    monkeypatch.setattr(driver, "_load", lambda: Cuda())
    monkeypatch.setattr(driver, "_contexts", {})
    m = driver.HeldMemory(256, 0)
    assert m.ptr == 0xD000 and calls == [("mode", 2), ("alloc", 256), ("mode", 1)]
    m.free()
    m.free()
    assert calls[3:] == [("free", 0xD000)]


def test_the_flag_defaults_to_false():
    d = Differentiable("capture_default", "softmax_forward", ("x",), ("out",), None, None,
                       lambda x: ((Spec(x.shape, x.strides, x.dtype),), {}))  # fmt: skip
    assert d.capture_safe is False
