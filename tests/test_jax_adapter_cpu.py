"""The JAX adapter (cudnnkit.runtime.adapters._jax) on the CPU: it conforms to the adapter protocol, JAX arrays
find it, and what it cannot take is refused naming the argument before any GPU work: a CPU array, a traced
value, a write into an immutable JAX array. Its GPU path (DLPack in on JAX's stream, outputs handed to JAX once
the call is queued) runs in the GPU tier."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit import ops  # noqa: E402
from cudnnkit.runtime import adapters  # noqa: E402
from cudnnkit.runtime.adapters import _jax, missing_members  # noqa: E402


def test_the_jax_adapter_conforms_and_jax_arrays_find_it():
    assert missing_members(_jax.JaxAdapter) == []
    x = jnp.ones(3)
    assert adapters.for_object(x) is _jax.ADAPTER and adapters.FINISH[_jax.Pending] == _jax.ADAPTER.finish
    assert adapters.is_device_array(x) is False  # a CPU array is host data to cudnnkit
    p = _jax.Pending((2,), (1,), "float32", 0, 0x1000, None)
    assert adapters.for_object(p) is _jax.ADAPTER and adapters.is_device_array(p)


def test_a_jax_launch_always_makes_its_device_current(monkeypatch):
    """JAX's current device is its default device, not the thread's CUDA context (torch's ``set_device`` on the
    same thread may have made another current): a launch for JAX arrays pushes its device even when the two agree,
    where a library whose current device is the thread's (torch, CuPy) skips the push."""
    import contextlib

    from cudnnkit.runtime.launch import Launch

    pushed = []

    @contextlib.contextmanager
    def guard(device):
        pushed.append(device)
        yield

    monkeypatch.setattr(_jax.ADAPTER, "current_device", lambda: 0)
    monkeypatch.setattr(_jax.ADAPTER, "device_guard", guard)
    with Launch(0, _jax.ADAPTER, 0, ("x",)).on_device():
        pass
    assert pushed == [0]

    class ThreadDevice:  # an adapter whose current device is the thread's
        current_is_thread_device = True

        def current_device(self):
            return 0

        def device_guard(self, device):
            return guard(device)

    with Launch(0, ThreadDevice(), 0, ("x",)).on_device():
        pass
    with Launch(1, ThreadDevice(), 0, ("x",)).on_device():
        pass
    assert pushed == [0, 1]


def test_a_cpu_jax_array_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"x is a JAX array on cpu; cudnnkit needs a CUDA array"):
        _jax.ADAPTER.view(jnp.ones((2, 3)), "x")


def test_a_traced_value_is_refused_naming_it():
    seen = []

    def f(a):
        try:
            _jax.ADAPTER.view(a, "x")
        except TypeError as e:
            seen.append(str(e))
        return a

    jax.jit(f)(jnp.ones(2))
    assert seen and "x is a traced JAX value (inside jit, grad or vmap)" in seen[0]


def test_an_l2_op_on_a_cpu_jax_array_is_refused_before_gpu_work():
    with pytest.raises(TypeError, match=r"host array|CUDA array"):
        ops.softmax_forward(jnp.ones((2, 3)))


def test_writing_into_a_jax_array_is_refused():
    with pytest.raises(TypeError, match="JAX arrays are immutable"):
        _jax.ADAPTER.copy(jnp.ones(2), jnp.ones(2))


def test_to_numpy_of_a_jax_array():
    np.testing.assert_array_equal(_jax.ADAPTER.to_numpy(jnp.arange(3.0)), [0.0, 1.0, 2.0])
