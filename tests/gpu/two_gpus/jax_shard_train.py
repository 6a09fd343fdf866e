"""Data-parallel training under ``jax.shard_map`` with the ``cudnnkit.jax`` ops (issue 16), against the same model on
one device. tests/gpu/test_two_gpus_training.py runs it in a subprocess; by hand, from the repository root::

    PYTHONPATH=src python -m tests.gpu.two_gpus.jax_shard_train --devices 2 --out jax.json
    # the sharding logic alone, in pure JAX on two CPU devices (no GPU, no cudnnkit op):
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu \\
        PYTHONPATH=src python -m tests.gpu.two_gpus.jax_shard_train --devices 2 --pure-jax

The model is benchmarks/jax_models.py's CNN written with ``cudnnkit.jax`` (NHWC: ``nn.conv`` 3x3 3->32,
``nn.batch_norm`` with the ReLU fused, ``nn.max_pool``, conv 32->64, batch norm + ReLU, ``nn.avg_pool`` over the
whole image, a dense layer to 10 classes, ``nn.log_softmax``), trained with cross-entropy and plain SGD (learning
rate 0.1) for 20 steps. Each step's global batch of 64 32x32 RGB images (unit noise plus a fixed colour per class, so
the loss falls) is drawn with numpy from a seed of its own; the model from ``jax.random.PRNGKey(0)``.

* **sharded**: a 1-d mesh ``("data",)`` over the first ``--devices`` devices; the global batch placed with
  ``NamedSharding(mesh, P("data"))`` (each device holds 64 / D images; 64 must divide by D), the parameters and the
  batch-norm state replicated (``P()``); one jitted step: a ``shard_map`` of the forward and backward on the local
  shard, then ``lax.pmean`` over "data" of the gradients, the loss and the new batch-norm state, then SGD.
  ``jax.shard_map`` where this JAX has it, else ``jax.experimental.shard_map.shard_map``, with the replication
  check off (``check_vma=False``, formerly ``check_rep``): the FFI calls' rule wants every operand varying over the
  same mesh axes (replicated weights beside sharded activations fail it), and with the check on JAX would sum the
  replicated parameters' gradients over the mesh by itself, so the explicit ``pmean`` would be wrong. With it off
  the body is per-device SPMD: local gradients, averaged by the ``pmean``.
* **single**: the same step on the first device with the whole global batch.

**Batch norm.** Each device normalizes its shard by the shard's statistics; one device running the whole batch at
once would train a different model. So the single-device step emulates the shards: it runs the global batch as D
slices through the model (each normalized by its own statistics), averages their losses (the gradient of that mean
is the mean of the slices' gradients, what the ``pmean`` makes of the devices') and their new batch-norm state (what
the ``pmean`` of the state makes). With one device (the test's dry run on one GPU) both runs are the plain
whole-batch step.

Numerics: float32 with TF32 off (``cudnnkit.settings(allow_tf32=False)`` and
``jax.default_matmul_precision("highest")``, in force while the steps are traced) and deterministic cuDNN engines.
The two programs do the same arithmetic on the same slice shapes, but XLA compiles each on its own (its fusions of
the single-device program's D slices may sum in another order): the test holds every step's loss to a relative 1e-4
of the single-device run's and the parameters after the last step to 1e-3 (see its docstring).

``train()`` returns (and ``__main__`` prints as its last line, and writes to ``--out``) a JSON-able dict: the devices,
the shard shape, both loss curves, and the largest relative difference of the final parameters and batch-norm state.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
AXIS = "data"
BATCH, SIZE, CLASSES = 64, 32, 10
LR = 0.1
MODEL_SEED, DATA_SEED = 0, 1000


def shard_map(f: Callable, mesh: Any, in_specs: Any, out_specs: Any) -> Callable:
    """``jax.shard_map`` (``jax.experimental.shard_map.shard_map`` on a JAX without it) with the replication check
    off (see the module docstring)."""
    import jax

    sm = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm
    check = "check_rep" if "check_rep" in inspect.signature(sm).parameters else "check_vma"
    return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **{check: False})


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each step's global batch ``(images (BATCH, SIZE, SIZE, 3) float32, labels (BATCH,) int32)``."""
    colours = np.random.default_rng(DATA_SEED - 1).standard_normal((CLASSES, 3)).astype(np.float32)
    out = []
    for step in range(steps):
        rng = np.random.default_rng(DATA_SEED + step)
        y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        x = rng.standard_normal((BATCH, SIZE, SIZE, 3)).astype(np.float32) + colours[y][:, None, None, :]
        out.append((x, y))
    return out


def _rel(a: Any, b: Any) -> float:
    """The largest ``||a - b|| / ||b||`` over the leaves of two pytrees."""
    import jax

    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)))
    return worst


def train(steps: int = 20, n_devices: int | None = None, pure_jax: bool = False) -> dict[str, Any]:
    """Train the CNN sharded over the first ``n_devices`` devices (all when None) and on the first device alone (see
    the module docstring); ``pure_jax``: benchmarks/jax_models.py's pure-JAX twin of the model instead of the
    cudnnkit.jax one (a check of the sharding logic on any backend)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import cudnnkit
    from benchmarks import jax_models as m

    apply = m.cnn_apply_jax if pure_jax else m.cnn_apply_cudnnkit
    devices = jax.devices()[:n_devices] if n_devices else jax.devices()
    if n_devices and len(devices) < n_devices:
        raise SystemExit(f"--devices {n_devices}: JAX sees {len(jax.devices())} device(s): {jax.devices()}")
    k = len(devices)
    if BATCH % k:
        raise ValueError(f"the global batch of {BATCH} does not divide over {k} devices")
    params, state = m.cnn_init(jax.random.PRNGKey(MODEL_SEED))
    data = batches(steps)

    def loss_fn(params: Any, state: Any, x: Any, labels: Any) -> tuple[Any, Any]:
        logp, _, new_state = apply(params, state, x)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1)), new_state

    def local_step(params: Any, state: Any, x: Any, labels: Any) -> tuple[Any, Any, Any]:
        """One device's part: its shard's gradients, then their mean over the mesh (and the loss's, the state's)."""
        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, labels)
        grads, loss, new_state = jax.lax.pmean((grads, loss, new_state), AXIS)
        return m.sgd_step(params, grads, LR), new_state, loss

    def sliced_step(params: Any, state: Any, x: Any, labels: Any) -> tuple[Any, Any, Any]:
        """The whole batch on one device as ``k`` slices, each with its own batch statistics (as the devices')."""

        def mean_loss(params: Any) -> tuple[Any, Any]:
            outs = [loss_fn(params, state, xs, ls) for xs, ls in zip(jnp.split(x, k), jnp.split(labels, k))]
            loss = jnp.mean(jnp.stack([o[0] for o in outs]))
            new_state = jax.tree.map(lambda *s: jnp.mean(jnp.stack(s), axis=0), *[o[1] for o in outs])
            return loss, new_state

        (loss, new_state), grads = jax.value_and_grad(mean_loss, has_aux=True)(params)
        return m.sgd_step(params, grads, LR), new_state, loss

    mesh = Mesh(np.array(devices), (AXIS,))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))
    runs = {
        "sharded": (jax.jit(shard_map(local_step, mesh, (P(), P(), P(AXIS), P(AXIS)), (P(), P(), P()))),
                    replicated, sharded),
        "single": (jax.jit(sliced_step), devices[0], devices[0]),
    }  # fmt: skip
    got: dict[str, Any] = {}
    shard_shape = None
    # TF32 off while the steps are traced (the first call of each jitted step, inside this block)
    with cudnnkit.settings(allow_tf32=False, deterministic=True), jax.default_matmul_precision("highest"):
        for name, (step, put_params, put_data) in runs.items():
            p, s = jax.device_put((params, state), put_params)
            losses = []
            for x, y in data:
                xd, yd = jax.device_put(x, put_data), jax.device_put(y, put_data)
                if name == "sharded":
                    shard_shape = [int(d) for d in xd.addressable_shards[0].data.shape]
                p, s, loss = step(p, s, xd, yd)
                losses.append(float(loss))
            got[name] = (jax.device_get(p), jax.device_get(s), losses)
    return {
        "model": "pure-jax" if pure_jax else "cudnnkit.jax",
        "devices": [str(d) for d in devices],
        "device_kinds": [d.device_kind for d in devices],
        "shard_shape": shard_shape,
        "global_batch": BATCH,
        "steps": steps,
        "lr": LR,
        "losses": {name: got[name][2] for name in runs},
        "params_rel": _rel(got["sharded"][0], got["single"][0]),
        "state_rel": _rel(got["sharded"][1], got["single"][1]),
        "jax": jax.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--devices", type=int, default=None, help="the mesh's size: the first N devices (default: all)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--pure-jax", action="store_true", help="the pure-JAX model (the sharding logic on any backend)")
    args = p.parse_args(argv)
    text = json.dumps(train(args.steps, args.devices, args.pure_jax))
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # benchmarks/ (the model) when run as a file without PYTHONPATH
    sys.exit(main())
