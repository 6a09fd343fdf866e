"""Results made in XLA's buffers: while a declaration runs, the CUDA runner offers the call's result buffers
(outputs, fresh residuals, gradients; never a mutated array's) to the raw adapter, whose ``empty`` hands each out
once to the first allocation of its shape, layout and dtype, so that nothing is copied afterwards; a value left in
another result's buffer (two outputs of one shape made in each other's buffers) is moved out before any write.

On JAX's CPU platform: the handler's wiring through a NumPy runner that records what it is offered, and the CUDA
runner's placement and writes over a fake device memory (no GPU)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit.jax import _ffi, _ops  # noqa: E402
from cudnnkit.runtime.adapters import _raw  # noqa: E402

from .test_jax_ops_cpu import OP, NumpyRunner, on_the_cpu  # noqa: E402,F401  (the autouse fixture: arrays on JAX's CPU)


class Recording(NumpyRunner):
    """A NumPy runner with the optional ``into``/``write_all``: it records the targets and writes."""

    def __init__(self):
        self.offered: list[list[tuple]] = []
        self.written: list[list[str]] = []

    @contextlib.contextmanager
    def into(self, call, targets):
        self.offered.append([(tuple(b.shape), v) for b, v in targets])
        yield "token"

    def write_all(self, call, items, placed):
        assert placed == "token"
        self.written.append([name for _, _, name, _, _ in items])
        for dst, value, name, shape, strides in items:
            self.write(call, dst, value, name, shape, strides)


def test_the_handlers_offer_outputs_fresh_residuals_and_gradients_but_not_mutated_arrays():
    r = Recording()
    op = _ops.JaxOp(OP, r, namespace="cudnnkit_jaxtest_place")
    rng = np.random.default_rng(0)
    x, w = jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal((3, 4)))
    stat = jnp.zeros(())

    def loss(a, c):
        y, s, new = op(a, c, None, scale=0.5, stat=stat)
        return (y**2).sum() + s.sum(), new

    (val, new), (gx, gw) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
    # the forward: out (3, 4), sum (3,), then the fresh residual prod (3, 4) in its layout; the mutated stat's
    # buffer is not offered (it holds the state the forward updated in place before)
    assert r.offered[0] == [((3, 4), None), ((3,), None), ((3, 4), ((3, 4), (4, 1)))]
    assert r.written[0] == ["out", "sum", "prod"]
    # the backward: one gradient per needed input (x and w)
    assert r.offered[1] == [((3, 4), None), ((3, 4), None)] and r.written[1] == ["gradient", "gradient"]

    def ref(a, c):
        y = a * c * 0.5
        return (y**2).sum() + (a * c).sum()

    want = jax.value_and_grad(ref, argnums=(0, 1))(x, w)
    np.testing.assert_allclose(float(val), float(want[0]), rtol=1e-12)
    np.testing.assert_allclose(float(new), float((x * w * 0.5).sum()), rtol=1e-12)
    for got, exp in zip((gx, gw), want[1]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-12)


class Memory:
    """A fake device: ``DeviceMemory`` hands out addresses, ``copy`` moves the label held at an address."""

    def __init__(self):
        self.at: dict[int, str] = {}
        self.next = 0x100000
        self.copies: list[tuple[int, int]] = []
        outer = self

        class DeviceMemory:
            def __init__(self, nbytes, device, stream):
                self.ptr, outer.next = outer.next, outer.next + 0x10000

        self.DeviceMemory = DeviceMemory

    def copy(self, dst, src, stream=None):
        self.copies.append((dst.ptr, src.ptr))
        self.at[dst.ptr] = self.at.get(src.ptr, "?")


@pytest.fixture
def mem(monkeypatch):
    from cudnnkit.runtime import driver

    m = Memory()
    monkeypatch.setattr(driver, "DeviceMemory", m.DeviceMemory)
    monkeypatch.setattr(_raw.ADAPTER, "copy", m.copy)
    return m


def _target(ptr, shape, dtype="float32", strides=None):
    strides = strides or tuple(int(np.prod(shape[i + 1 :])) for i in range(len(shape)))
    return _raw.DeviceArray(shape, strides, dtype, 0, ptr, None)


def test_empty_hands_out_each_matching_target_once(mem):
    a = _target(0x1000, (2, 3, 1, 4))
    b = _target(0x2000, (5,), "float16")
    empty = _raw.ADAPTER.empty
    with _raw.into([a, b]) as claimed:
        other_dtype = empty((5,), "float32", 0)  # not b: another dtype
        other_device = empty((5,), "float16", 1)  # not b: another device
        # a with another stride on its size-1 dim is a's memory: handed out, with the strides asked for
        got_a = empty((2, 3, 1, 4), "float32", 0, (12, 4, 99, 1))
        again = empty((2, 3, 1, 4), "float32", 0)  # a is taken: the pool
        channels_last = empty((5,), "float16", 0, (1,))
    assert got_a.ptr == a.ptr and got_a.strides == (12, 4, 99, 1) and got_a.base is a
    assert channels_last.ptr == b.ptr and claimed == [a, b]
    assert {other_dtype.ptr, other_device.ptr, again.ptr}.isdisjoint({a.ptr, b.ptr})
    assert _raw._current.targets is None  # the block is over: nothing is offered
    with _raw.into([_target(0x3000, (2, 3))]):
        assert empty((3, 2), "float32", 0).ptr != 0x3000  # another shape
        assert empty((2, 3), "float32", 0, (1, 2)).ptr != 0x3000  # another layout


def _call(*rets):
    return _ffi.Call(0, [], [_ffi.Buffer(dt, shape, ptr, 0) for ptr, shape, dt in rets], {}, device=0)


def test_write_all_skips_values_made_in_place_and_moves_swapped_ones_out_first(mem):
    from cudnnkit.jax._cuda import RUNNER

    call = _call((0x1000, (4,), "float32"), (0x2000, (4,), "float32"), (0x3000, (4,), "float32"))
    ra, rb, rc = (RUNNER.array(call, b) for b in call.rets)
    with RUNNER.into(call, [(b, None) for b in call.rets]) as claimed:
        # the declaration made its first result in b's buffer and its second in a's; its third is a new array
        first, second = _raw.ADAPTER.empty((4,), "float32", 0), _raw.ADAPTER.empty((4,), "float32", 0)
    assert (first.ptr, second.ptr) == (ra.ptr, rb.ptr) and len(claimed) == 2
    third = _raw.ADAPTER.empty((4,), "float32", 0)
    mem.at.update({rb.ptr: "A", ra.ptr: "B", third.ptr: "C"})
    items = [(call.rets[0], _raw.DeviceArray((4,), (1,), "float32", 0, rb.ptr, None), "a", None, None),
             (call.rets[1], _raw.DeviceArray((4,), (1,), "float32", 0, ra.ptr, None), "b", None, None),
             (call.rets[2], third, "c", None, None)]  # fmt: skip
    RUNNER.write_all(call, items, claimed)
    assert (mem.at[ra.ptr], mem.at[rb.ptr], mem.at[rc.ptr]) == ("A", "B", "C")
    # both swapped values went out to new memory before either buffer was written; the third was copied once
    assert len(mem.copies) == 5 and mem.copies[-1] == (rc.ptr, third.ptr)

    mem.copies.clear()
    with RUNNER.into(call, [(b, None) for b in call.rets]) as claimed:
        made = [_raw.ADAPTER.empty((4,), "float32", 0) for _ in range(3)]
    RUNNER.write_all(call, [(b, v, "r", None, None) for b, v in zip(call.rets, made)], claimed)
    assert mem.copies == []  # every result made where it belongs: nothing copied


def test_a_value_in_place_up_to_size_1_strides_is_not_copied(mem):
    """A result made in its buffer with other strides on a size-1 dim (a C = 1 channels-last array) addresses the
    same elements: nothing is copied, nothing moved out."""
    from cudnnkit.jax._cuda import RUNNER

    call = _call((0x1000, (2, 1, 3), "float32"))
    with RUNNER.into(call, [(call.rets[0], None)]) as claimed:
        v = _raw.ADAPTER.empty((2, 1, 3), "float32", 0, (3, 1, 1))  # channels-last strides, C = 1
    assert v.ptr == 0x1000 and claimed
    RUNNER.write_all(call, [(call.rets[0], v, "y", None, None)], claimed)
    assert mem.copies == []


def test_write_refuses_a_value_its_meta_did_not_announce(mem):
    from cudnnkit.jax._cuda import RUNNER

    call = _call((0x1000, (4,), "float32"))
    with pytest.raises(RuntimeError, match=r"y: the declaration returned a float32 \(5,\) array where its meta said"):
        RUNNER.write(call, call.rets[0], _target(0x9000, (5,)), "y")


def test_lasting_allocations_never_take_a_result_buffer(mem):
    """Memory kept past the call (a cached DropoutState's RNG states, made inside a handler on its first call) is
    never placed in an XLA result buffer, which XLA reuses once the call is over."""
    from cudnnkit.runtime import adapters

    t = _target(0x1000, (64,), "uint8")
    with _raw.into([t]) as claimed:
        with adapters.lasting():
            kept = _raw.ADAPTER.empty((64,), "uint8", 0)
        assert kept.ptr != t.ptr and not claimed and not adapters.is_lasting()
        assert _raw.ADAPTER.empty((64,), "uint8", 0).ptr == t.ptr  # an ordinary allocation still takes it


def test_a_dropout_states_allocation_is_lasting(monkeypatch):
    """DropoutState allocates its RNG states (and snapshots) under adapters.lasting() (its cuDNN calls faked)."""
    from types import SimpleNamespace

    from cudnnkit.ops import dropout as D
    from cudnnkit.runtime import adapters

    seen = []

    class Launch:
        device, adapter, handle, stream = 0, object(), 1, 0

        def empty(self, shape, dtype, name=""):
            seen.append((name, adapters.is_lasting()))
            return object(), SimpleNamespace(ptr=0x4000)

        def on_device(self):
            return contextlib.nullcontext()

    monkeypatch.setattr(D, "prepare", lambda *a, **k: (Launch(), None))
    monkeypatch.setattr(D, "owned_descriptor", lambda *a: object())
    monkeypatch.setattr(D.lib, "cudnnDropoutGetStatesSize", lambda h, ref: None)
    monkeypatch.setattr(D.lib, "cudnnSetDropoutDescriptor", lambda *a: None)
    monkeypatch.setattr(D.lib, "cudnnRestoreDropoutDescriptor", lambda *a: None, raising=False)
    st = D.DropoutState(object(), 3)
    assert seen == [("states", True)]
    try:
        st.snapshot()
    except Exception:  # the copy after the allocation needs a device; the allocation is what is checked
        pass
    assert seen[1:2] == [("snapshot", True)]


def test_a_dropout_reserve_is_lasting(monkeypatch):
    """The dropout forward's reserve, whose address keys the layout ledger past the call, is allocated under
    adapters.lasting() (its cuDNN call faked)."""
    from types import SimpleNamespace

    from cudnnkit.ops import dropout as D
    from cudnnkit.runtime import adapters

    seen = []

    class Launch:
        device, handle = 0, 1

        def empty(self, shape, dtype, name=""):
            seen.append((name, adapters.is_lasting()))
            return object(), SimpleNamespace(ptr=0x5000)

    state = SimpleNamespace(desc=2, _use=lambda p, h: None)
    c = SimpleNamespace(resolved=(0.5, None), extra={"state": state, "nres": 64}, desc=3, launch=Launch(),
                        views={"x": SimpleNamespace(ptr=1), "out": SimpleNamespace(ptr=2)}, description=((4,), (1,)))  # fmt: skip
    monkeypatch.setattr(D.lib, "cudnnDropoutForward", lambda *a: None)
    monkeypatch.setattr(D, "_reserve_layouts", SimpleNamespace(add=lambda *a: None))
    D._forward_call(c)
    assert seen == [("reserve", True)]


def test_a_zero_gradient_is_written_after_the_gradient_made_in_its_buffer(mem, monkeypatch):
    """A backward returning (None, db) with both needed: db, the first new array of that shape, is made in the
    first gradient's buffer; the handler writes db to its own buffer before zeroing the first."""
    from cudnnkit.autograd._kw import encode
    from cudnnkit.jax import _cuda
    from cudnnkit.ops._diff import Differentiable, new_like

    def bwd(res, douts, needs):
        db = _raw.ADAPTER.empty((4,), "float32", 0)
        mem.at[db.ptr] = "DB"
        return (None, db)

    d = Differentiable("zero_then_db", "softmax_forward", ("a", "b"), ("out",), lambda a, b: ((a,), {}), bwd,
                       lambda a, b: ((new_like(a),), {}))  # fmt: skip
    op = _ops.JaxOp(d, _cuda.RUNNER, namespace="cudnnkit_jaxtest_zero")
    zeroed = []
    monkeypatch.setattr(_cuda.CudaRunner, "zero", lambda self, call, dst: zeroed.append(dst.ptr) or
                        mem.at.__setitem__(dst.ptr, "0"))  # fmt: skip
    monkeypatch.setattr(_cuda.CudaRunner, "scope", lambda self, call: contextlib.nullcontext())
    dout = _ffi.Buffer("float32", (4,), 0x9000, 0)
    call = _ffi.Call(0, [dout], [_ffi.Buffer("float32", (4,), 0x1000, 0), _ffi.Buffer("float32", (4,), 0x2000, 0)],
                     {"kw": encode(dict(__res__=(), __absent__=(), __douts__=(True,), __needs__=(True, True),
                                        __in__=(0, 1), __arr__=(), __views__=()))}, device=0)  # fmt: skip
    op._backward(call)
    assert zeroed == [0x1000]
    assert (mem.at.get(0x1000), mem.at.get(0x2000)) == ("0", "DB")
