"""XLA's command-buffer (CUDA-graph) trait of the JAX targets, on JAX's CPU platform: a declaration's
``capture_safe`` and its runner's together decide the trait each FFI target answers XLA's metadata query with; the
CUDA runner allocates outside XLA during every call, so no cudnnkit target declares it today; the declarations'
own flags are pinned (which ones synchronize or keep host-side state is a decision, not an accident)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit import autograd  # noqa: E402
from cudnnkit.jax import _ffi, _ops  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402

from .test_jax_ops_cpu import NumpyRunner  # noqa: E402


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


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
    "activation", "affine_grid", "batch_norm", "convolution", "convolution_transpose", "divisive_normalization",
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


def test_no_cuda_target_declares_the_trait_while_the_runner_allocates_outside_xla():
    """The CUDA runner gives the L2 calls memory of its own (``cuMemAllocAsync``) during each call: not capturable,
    so even a capture-safe declaration's targets are registered without the trait (cudnnkit.jax._ops' docstring)."""
    import cudnnkit.jax as cj
    from cudnnkit.jax._cuda import RUNNER

    assert RUNNER.capture_safe is False
    for name in autograd.functions():
        assert cj.op(name).command_buffer is False, name
    assert "no target declares the trait today" in " ".join(_ops.__doc__.split())


def test_the_flag_defaults_to_false():
    d = Differentiable("capture_default", "softmax_forward", ("x",), ("out",), None, None,
                       lambda x: ((Spec(x.shape, x.strides, x.dtype),), {}))  # fmt: skip
    assert d.capture_safe is False
