"""JAX rows (issue 14): ``cudnnkit.jax`` against JAX's own implementation of the same work (the ``torch`` column of the
table holds the pure-JAX side here), in one process, jitted, each call waited for with ``jax.block_until_ready``
(the rows' ``sync`` hook: timed by the host clock, see ``harness.time_gpu``).

* CNN train step: the small CNN of :mod:`benchmarks.jax_models` (conv3x3 3->32, BN, ReLU, max pool, conv3x3 32->64,
  BN, ReLU, global average pool, dense 10) on a batch of 64 3x32x32 NHWC images, forward, cross-entropy, backward
  and an SGD step under one ``jax.jit``: ours with ``cudnnkit.jax.nn`` (conv, batch_norm with its ReLU fused,
  max_pool, avg_pool, log_softmax), against ``lax.conv_general_dilated``, ``lax.reduce_window`` and XLA's
  reductions; float32 and bfloat16. Goal: no slower than XLA's (ratio <= 1).
* LSTM train step: one LSTM layer, T100 N64 I512 H512, float32, forward, MSE, backward and SGD: ours one
  ``cudnnkit.jax.ops.rnn`` on cuDNN's flat weights, against a ``lax.scan`` LSTM (the input projection of all steps
  in one product, one ``h @ wh`` per step). Goal: at least 2x faster (ratio <= 0.5).
* FFI handler host cost (8x64 float32, tiny: host-bound), "ours host µs" against a jitted ``jax.nn.softmax``: a jitted
  ``cudnnkit.jax.ops.softmax`` (the whole Python FFI handler: attributes decoded, settings, the declaration's L2
  call, the copy into XLA's buffer), the eager L2 ``cudnnkit.ops.softmax_forward`` on the same JAX array (no handler:
  the JAX adapter), and a jitted FFI call of an empty Python handler (the ctypes round trip alone). The handler's
  added µs per call is the first row's ours host µs minus its reference's (XLA launching its own kernel); the
  empty handler's row is the floor of any Python handler. Goal: <= 10 µs added.

With ``CUDNNKIT_JAX_COMMAND_BUFFERS=1`` in the environment (and ``XLA_FLAGS`` naming ``CUSTOM_CALL`` in
``--xla_gpu_enable_command_buffer``), the capture-safe targets declare XLA's command-buffer trait and XLA replays
their captured graphs without calling the Python handler (:mod:`cudnnkit.jax._cuda`); every row's name then ends in
``[command buffers]``, and both sides run under the same XLA flags.

TF32 as each library's default (cuDNN's float32 convolutions and RNN may use it; so may XLA's float32 dots and
convolutions). JAX is imported inside the factories, with ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` set first when
JAX is not imported yet (so that XLA does not take 75% of the GPU from the torch rows of the same run).
"""

from __future__ import annotations

import os
import sys

from .harness import Row, register

FAMILY = "jax"
#: the rows' name suffix: which handler mode they measure
MODE = " [command buffers]" if os.environ.get("CUDNNKIT_JAX_COMMAND_BUFFERS", "0") == "1" else ""


def _jax():
    if "jax" not in sys.modules:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax


@register
def cnn_train_rows() -> list[Row]:
    jax = _jax()
    import jax.numpy as jnp

    from . import jax_models as m

    rows: list[Row] = []
    for dtype in (jnp.float32, jnp.bfloat16):
        key = jax.random.PRNGKey(0)
        params, state = m.cnn_init(key, dtype)
        x = jax.random.normal(jax.random.PRNGKey(1), (64, 32, 32, 3), jnp.float32).astype(dtype)
        labels = jax.random.randint(jax.random.PRNGKey(2), (64,), 0, m.CLASSES)
        ours = m.cnn_train_step(m.cnn_apply_cudnnkit)
        ref = m.cnn_train_step(m.cnn_apply_jax)
        rows.append(Row(FAMILY, "CNN train step (jit)" + MODE, "64x32x32x3 NHWC", jnp.dtype(dtype).name,
                        ours=lambda s=ours, a=(params, state, x, labels): s(*a),
                        torch=lambda s=ref, a=(params, state, x, labels): s(*a), sync=jax.block_until_ready,
                        notes="fwd + cross-entropy + bwd + SGD under one jax.jit; torch column = the same model in "
                              "pure JAX (lax.conv_general_dilated, reduce_window, XLA reductions)"))  # fmt: skip
    return rows


@register
def lstm_train_rows() -> list[Row]:
    jax = _jax()
    import jax.numpy as jnp

    from . import jax_models as m

    T, N, IN, H = 100, 64, 512, 512
    rnn = m.lstm_config(IN, H)
    offsets = m.lstm_offsets(rnn)
    n = rnn.weight_count(jnp.zeros((1,), jnp.float32))
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    w = jax.random.uniform(k[0], (n,), jnp.float32, -1.0, 1.0) / H**0.5
    params = m.lstm_params(w, offsets)
    x = jax.random.normal(k[1], (T, N, IN), jnp.float32)
    target = jax.random.normal(k[2], (T, N, H), jnp.float32) * 0.1
    lr = 0.1

    @jax.jit
    def ours(w, x, target):
        loss, g = jax.value_and_grad(m.lstm_loss_cudnnkit)(w, x, target, rnn)
        return w - lr * g, loss

    @jax.jit
    def ref(params, x, target):
        loss, g = jax.value_and_grad(m.lstm_loss_jax)(params, x, target)
        return m.sgd_step(params, g, lr), loss

    flops = 3 * 2 * T * N * 4 * H * (IN + H)  # forward's two products per step, backward twice that
    return [
        Row(FAMILY, "LSTM train step (jit)" + MODE, f"T{T} N{N} I{IN} H{H}", "float32",
            ours=lambda: ours(w, x, target), torch=lambda: ref(params, x, target), flops=flops, sync=jax.block_until_ready,
            notes="fwd + MSE + bwd + SGD under one jax.jit: ours one cudnnkit.jax.ops.rnn (cuDNN's flat weights, "
                  "algo auto); torch column = a lax.scan LSTM (input projection of all steps in one product)"),
    ]  # fmt: skip


def _noop(call) -> None:
    """An FFI handler that does nothing (its result buffer is left as XLA allocated it)."""


@register
def handler_rows() -> list[Row]:
    jax = _jax()
    import jax.numpy as jnp

    import cudnnkit.jax as cj
    from cudnnkit import ops
    from cudnnkit.jax import _ffi

    x = jax.random.normal(jax.random.PRNGKey(0), (8, 64), jnp.float32)
    ours_sm = jax.jit(lambda a: cj.ops.softmax(a, axis=-1))
    ref_sm = jax.jit(lambda a: jax.nn.softmax(a, axis=-1))
    _ffi.register("cudnnkit_bench_noop", _ffi.Handler(_noop, platform="CUDA"))
    noop = jax.jit(lambda a: jax.ffi.ffi_call("cudnnkit_bench_noop", jax.ShapeDtypeStruct(a.shape, a.dtype))(a))
    sync = jax.block_until_ready
    ref = "torch column = a jitted jax.nn.softmax (XLA's own kernel)"
    return [
        Row(FAMILY, "jit softmax via the FFI handler (host)" + MODE, "8x64", "float32", ours=lambda: ours_sm(x),
            torch=lambda: ref_sm(x), sync=sync,
            notes="a jitted cudnnkit.jax.ops.softmax: the handler's added host µs = ours host µs - torch host µs; "
                  + ref),
        Row(FAMILY, "eager L2 softmax_forward on a JAX array (host)", "8x64", "float32",
            ours=lambda: ops.softmax_forward(x, axis=-1), torch=lambda: ref_sm(x), sync=sync,
            notes="no handler: the L2 call through the JAX adapter; " + ref),
        Row(FAMILY, "jit empty Python FFI handler (host)", "8x64", "float32", ours=lambda: noop(x),
            torch=lambda: ref_sm(x), sync=sync,
            notes="a handler that does nothing: the ctypes round trip through XLA's FFI, the floor of any Python "
                  "handler; " + ref),
    ]  # fmt: skip
