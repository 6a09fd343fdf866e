"""Run by tests/gpu/test_jax_command_buffers_gpu.py in its own process (XLA's flags and cudnnkit's trait are fixed
when JAX's backend starts and when a target registers): the small CNN of benchmarks/jax_models.py trained with
``cudnnkit.jax`` ops whose targets declare XLA's command-buffer trait, against the same model in pure JAX, and
a jitted softmax against the eager call. Prints one JSON line: the losses of both, the handler calls each target
got after each step, the arenas' memory, the softmax's deviation and the step times with and without the trait
on this process's flags (ms, median of 20 synced steps).

Usage: ``CUDNNKIT_JAX_COMMAND_BUFFERS=1 XLA_FLAGS=... python -m tests.gpu.jax_command_buffer_probe``
"""

from __future__ import annotations

import json
import time

import numpy as np


def main() -> None:
    import jax
    import jax.numpy as jnp

    import cudnnkit
    import cudnnkit.jax as cj
    from benchmarks import jax_models as m
    from cudnnkit import ops
    from cudnnkit.jax import _ffi

    out: dict = {"enabled": cj.enable_command_buffers(True)}
    params, state = m.cnn_init(jax.random.PRNGKey(0), jnp.float32)
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 16, 16, 3), jnp.float32)
    labels = jax.random.randint(jax.random.PRNGKey(2), (16,), 0, m.CLASSES)
    with cudnnkit.settings(allow_tf32=False), jax.default_matmul_precision("highest"):
        for name, apply in (("cudnnkit", m.cnn_apply_cudnnkit), ("jax", m.cnn_apply_jax)):
            step = m.cnn_train_step(apply, lr=0.1)
            p, s, losses, calls = params, state, [], []
            for _ in range(15):
                p, s, loss = step(p, s, x, labels)
                losses.append(float(loss))
                calls.append({t: h.calls for (t, plat), h in _ffi.registered().items() if plat == "cuda"})
            out[name] = {"losses": losses, "calls": calls}
            times = []
            for _ in range(25):  # the same inputs each time
                t = time.perf_counter()
                jax.block_until_ready(step(p, s, x, labels))
                times.append(time.perf_counter() - t)
            out[name]["step_ms"] = float(np.median(times[5:]) * 1e3)
            out[name]["calls_after_timing"] = {t: h.calls for (t, plat), h in _ffi.registered().items()
                                               if plat == "cuda"}  # fmt: skip
    out["traits"] = {t: h.command_buffer for (t, plat), h in _ffi.registered().items() if plat == "cuda"}
    out["captured"] = cj.captured_memory()
    xs = jax.random.normal(jax.random.PRNGKey(3), (8, 64), jnp.float32)
    sm = jax.jit(lambda a: cj.ops.softmax(a, axis=-1))
    got = [np.asarray(sm(xs)) for _ in range(5)]
    ref = np.asarray(ops.softmax_forward(xs, axis=-1))
    out["softmax_dev"] = max(float(np.abs(g - ref).max()) for g in got)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
