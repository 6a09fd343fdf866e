"""L3: the JAX integration (issue 14, under way).

* :data:`ops` / :func:`op`: every differentiable op (:mod:`cudnnkit.autograd`) as a JAX function that works under
  ``jax.jit``, ``jax.grad`` and ``jax.value_and_grad``: two XLA FFI targets per op (``cudnnkit_<name>`` and
  ``cudnnkit_<name>_backward``) reached through ``jax.ffi.ffi_call``, shapes from the declaration's ``meta``,
  the gradient by ``jax.custom_vjp`` (:mod:`cudnnkit.jax._ops`). ``cudnnkit.jax.ops.softmax(x, axis=-1)``.
* :mod:`cudnnkit.jax.nn`: JAX's, flax's and optax's names over them (``conv_general_dilated``, ``conv``,
  ``max_pool``, ``avg_pool``, ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm``, ``batch_norm`` with
  explicit state, ``dot_product_attention``, ``dropout`` with an explicit key, ``ctc_loss`` with optax's
  arguments), and the recurrent networks of :mod:`cudnnkit.jax.rnn` (``lstm``, ``gru``, ``rnn`` over a params
  pytree; ``pack_params``/``unpack_params`` for cuDNN's flat weight buffer; ``from_flax_lstm``/``to_flax_lstm``).
* :mod:`cudnnkit.jax._ffi`: XLA's FFI from Python through ``ctypes`` (handlers, registration, the call frame's
  buffers, attributes and stream); :mod:`cudnnkit.jax._cuda`: the handlers' CUDA side (XLA's stream, memory no
  library owns for the L2 calls' outputs and workspaces) and XLA's command buffers, opt-in:
  :func:`enable_command_buffers` (a captured call replays with no Python; :func:`captured_memory`,
  :func:`release_captured_memory`).

Importing this module imports jax; nothing below it does.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .. import autograd as _autograd
from ._cuda import captured_memory, enable_command_buffers, release_captured_memory
from ._ffi import Buffer, Call, FfiAbiError, Handler, register, registered
from ._ops import JaxOp

__all__ = ["ops", "op", "JaxOp", "Buffer", "Call", "FfiAbiError", "Handler", "register", "registered",
           "enable_command_buffers", "captured_memory", "release_captured_memory"]  # fmt: skip

_defined: dict[str, JaxOp] = {}


def op(name: str) -> JaxOp:
    """The :class:`JaxOp` of differentiable op ``name`` (its FFI targets registered on first call)."""
    got = _defined.get(name)
    if got is None:
        from ._cuda import RUNNER

        got = _defined[name] = JaxOp(_autograd.get(name), RUNNER)
    return got


def __getattr__(name: str) -> Any:
    if name == "ops":  # every op by name, made on first use
        return SimpleNamespace(**{n: op(n) for n in _autograd.functions()})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
