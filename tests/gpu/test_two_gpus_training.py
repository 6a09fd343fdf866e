"""Data-parallel training over two GPUs (issue 16): the small CNN and the 2-layer LSTM of cudnnkit modules under
``torch.nn.parallel.DistributedDataParallel`` (NCCL, one process per GPU, torchrun), and the CNN of ``cudnnkit.jax``
ops under ``jax.shard_map``, each against a single-GPU run of the same global batches.

* **torch** (tests/gpu/two_gpus/ddp_train.py, whose docstring has the models, the data and the batch-norm argument):
  the single-process reference on cuda:0, then ``python -m torch.distributed.run --standalone --nproc_per_node=2``
  (rank r on cuda:r, NCCL), 20 SGD steps each. Every step's all-reduced loss lies within a relative
  :data:`LOSS_RTOL` of the reference's; the loss falls (the mean of the last three steps under :data:`FALLS` times
  the first three's); the ranks ran on two distinct devices; convert swapped the same modules in both. The CNN's
  reference runs each global batch as two slices, each normalized by its own batch-norm statistics as a rank's is
  (no SyncBatchNorm: each rank normalizes its half); the LSTM's (no batch-coupled layer) runs it whole.
* **JAX** (tests/gpu/two_gpus/jax_shard_train.py): the training step sharded over a mesh of two GPUs against the
  same step on one GPU (the batch as two slices with their own batch-norm statistics), 20 steps: every loss within
  :data:`JAX_LOSS_RTOL`, the parameters and batch-norm state after the last step within :data:`JAX_PARAM_RTOL`, and
  the loss falls.

**Tolerances.** float32, TF32 off, deterministic cuDNN engines on both sides. The CNN's DDP run and its emulating
reference do the same arithmetic on the same slice shapes (a CPU run of the script with one thread per process gives
the same bits), so they should agree to the bit; where a kernel sums in another order the difference starts at
float32 rounding (about 1e-7) and grows over the steps as the loss falls: the CPU run with another thread count in
the reference (so other summation orders) drifted to 1.4e-5 by step 20. Hence 1e-4, still far below what a wrong
data-parallel step gives (the whole-batch batch norm in the reference instead of per-slice: 0.24; in the JAX twin,
the gradients summed over two devices instead of averaged: 0.1 at the second step). The LSTM's whole-batch reference
sums over 32 sequences where each rank sums over 16: not the same bits, but its training barely amplifies rounding
(in CPU runs, a relative 1e-6 perturbation of its initial weights moved no loss by more than 2.2e-7 in 20 steps, and
DDP agreed with the whole batch to 1.2e-7): 1e-5. The JAX programs are compiled separately (XLA may fuse the
single-device program's two slices and sum in another order; on two CPU devices, in pure JAX, they agree to the bit):
each loss within 1e-4, as the CNN above, and the parameters within 1e-3 (``||a - b|| / ||b||`` per leaf;
tests/gpu/test_jax_training_gpu.py's bound).

The subprocesses (each with a time limit; on expiry its whole process group is killed, torchrun's ranks included)
get the source tree's ``src`` and the repository root on ``PYTHONPATH`` and otherwise this process's environment,
NCCL's included: nothing here sets ``NCCL_NVLS_ENABLE``, which the two-GPU machine sets to 0 to keep NVLink multicast
off (the DDP run's JSON reports the value its ranks started with, checked equal to this process's). Their stderr is
shown on failure.

With fewer than two CUDA devices (``torch.cuda.device_count()``; ``len(jax.devices("gpu"))`` for the JAX test) each
test skips, saying so. ``CUDNNKIT_TWO_GPU_DRYRUN=1`` on a one-GPU machine runs them there instead: the torch tests
with both ranks on cuda:0 over gloo (``--same-device --backend gloo``), the JAX test over a mesh of its one device,
with every check above but the distinct devices; a test whose checks pass is then reported as *skipped* (never as
passed), with the reason: such a run checks this module's and the scripts' own logic and proves nothing about two
devices.

Run: ``scripts/gpu-tests tests/gpu/test_two_gpus_training.py`` on the two-GPU machine;
``CUDNNKIT_TWO_GPU_DRYRUN=1 scripts/gpu-tests tests/gpu/test_two_gpus_training.py`` for the dry run on one GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
DDP_SCRIPT = ROOT / "tests" / "gpu" / "two_gpus" / "ddp_train.py"
JAX_MODULE = "tests.gpu.two_gpus.jax_shard_train"
DRYRUN = os.environ.get("CUDNNKIT_TWO_GPU_DRYRUN") == "1"
RANKS = 2
STEPS = 20
#: per model, the largest relative deviation of a step's DDP loss from the reference's (see the module docstring)
LOSS_RTOL = {"cnn": 1e-4, "lstm": 1e-5}
JAX_LOSS_RTOL, JAX_PARAM_RTOL = 1e-4, 1e-3
#: the mean loss of the last three steps must be under this fraction of the first three's
FALLS = 0.75
#: modules cudnnkit.torch.convert swaps in each model
SWAPPED = {"cnn": 7, "lstm": 1}
TIMEOUT_S = 600
#: torchrun's variables: the reference must not see them (it would take itself for a rank)
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # fmt: skip


def _dry_run_note(what: str) -> str:
    return (f"CUDNNKIT_TWO_GPU_DRYRUN=1: ran {what} and its checks passed, but a dry run on one GPU checks this "
            "test's logic only and proves nothing about two devices")  # fmt: skip


def _env() -> dict[str, str]:
    """This process's environment (NCCL's untouched), without torchrun's variables, ``src`` and the root first on
    ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _text(s: str | bytes | None) -> str:
    return s.decode(errors="replace") if isinstance(s, bytes) else (s or "")


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> str:
    """Run ``cmd`` from the repository root in a session of its own; its stdout. A non-zero exit or the time limit
    (the whole session killed: torchrun's ranks too) fails the test with the command's output."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or _env(), cwd=ROOT,
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{what} ran past {TIMEOUT_S} s: {' '.join(cmd)}\n--- stdout\n{_text(out)[-4000:]}\n"
                    f"--- stderr\n{_text(err)[-12000:]}")  # fmt: skip
    if p.returncode != 0:
        pytest.fail(f"{what} exited with {p.returncode}: {' '.join(cmd)}\n--- stdout\n{out[-4000:]}\n"
                    f"--- stderr\n{err[-12000:]}")  # fmt: skip
    return out


def _deviation(got: list[float], want: list[float]) -> np.ndarray:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert g.shape == w.shape == (STEPS,), (g.shape, w.shape)
    return np.abs(g - w) / np.abs(w)


def _assert_falls(losses: list[float]) -> None:
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    assert last < FALLS * first, f"the loss does not fall: {first:.4f} -> {last:.4f} ({losses})"


# ----------------------------------------------------------------- torch: DistributedDataParallel


@pytest.fixture
def placement() -> list[str]:
    """The ranks' placement flags: none on two GPUs (rank r on cuda:r, NCCL); both on cuda:0 over gloo in a dry run."""
    torch = pytest.importorskip("torch")
    n = torch.cuda.device_count()
    if n >= RANKS:
        return []
    if DRYRUN and n >= 1:
        return ["--same-device", "--backend", "gloo"]
    pytest.skip(f"needs {RANKS} CUDA devices, torch sees {n} (CUDNNKIT_TWO_GPU_DRYRUN=1 dry-runs this test on one)")


@pytest.mark.parametrize("model", ["cnn", "lstm"])
def test_ddp_over_two_gpus_matches_the_single_gpu_run(model, placement, tmp_path):
    """DDP over two ranks trains the cudnnkit model to the reference's losses, step by step (see the module
    docstring: the CNN's reference emulates the ranks' per-slice batch norm, the LSTM's runs the whole batch)."""
    common = ["--model", model, "--steps", str(STEPS)]
    ref_out, ddp_out = tmp_path / "reference.json", tmp_path / "ddp.json"
    slices = ["--slices", str(RANKS)] if model == "cnn" else []
    _run([sys.executable, str(DDP_SCRIPT), *common, *slices, "--out", str(ref_out)], f"the {model} reference")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}", str(DDP_SCRIPT),
          *common, *placement, "--out", str(ddp_out)], f"torchrun of the {model}")  # fmt: skip
    ref, ddp = json.loads(ref_out.read_text()), json.loads(ddp_out.read_text())
    assert (ref["mode"], ref["world_size"], ref["slices"]) == ("reference", 1, RANKS if model == "cnn" else 1)
    assert (ddp["mode"], ddp["world_size"], ddp["slices"]) == ("ddp", RANKS, RANKS)
    assert len(ref["replaced"]) == SWAPPED[model] and ddp["replaced"] == ref["replaced"], (ref["replaced"],
                                                                                          ddp["replaced"])  # fmt: skip
    assert ddp["nccl_nvls_enable"] == os.environ.get("NCCL_NVLS_ENABLE")  # reached the ranks as the machine sets it
    dev = _deviation(ddp["losses"], ref["losses"])
    print(f"{model}: loss {ref['losses'][0]:.4f} -> {ref['losses'][-1]:.4f}; largest relative deviation of the DDP "
          f"run's losses {dev.max():.2e} over {STEPS} steps on {[d['device'] for d in ddp['devices']]}")  # fmt: skip
    assert dev.max() <= LOSS_RTOL[model], (f"relative deviation per step {dev.tolist()}\nreference {ref['losses']}\n"
                                           f"ddp {ddp['losses']}")  # fmt: skip
    _assert_falls(ref["losses"])
    devices = ddp["devices"]
    if placement:
        assert [d["device"] for d in devices] == ["cuda:0"] * RANKS and ddp["backend"] == "gloo"
        pytest.skip(_dry_run_note(f"DDP of the {model} with {RANKS} ranks on cuda:0 over gloo"))
    assert ddp["backend"] == "nccl"
    assert [d["device"] for d in devices] == [f"cuda:{r}" for r in range(RANKS)], devices
    uuids = [d.get("uuid") for d in devices]
    if all(uuids):
        assert len(set(uuids)) == RANKS, devices


# ----------------------------------------------------------------- JAX: shard_map


def _jax_gpus() -> int:
    jax = pytest.importorskip("jax")
    try:
        return len(jax.devices("gpu"))
    except RuntimeError:  # no GPU backend
        return 0


def test_shard_map_over_two_gpus_matches_the_single_gpu_run(tmp_path):
    """The cudnnkit.jax CNN's step sharded over two GPUs (``shard_map``, gradients ``pmean``'d) trains to the
    single-GPU step's losses and parameters (see the module docstring)."""
    n = _jax_gpus()
    if n >= RANKS:
        devices = RANKS
    elif DRYRUN and n >= 1:
        devices = 1
    else:
        pytest.skip(f"needs {RANKS} JAX GPU devices, JAX sees {n} (CUDNNKIT_TWO_GPU_DRYRUN=1 dry-runs it on one)")
    out = tmp_path / "jax.json"
    env = _env()
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # this process's JAX may hold its GPUs' arena already
    _run([sys.executable, "-m", JAX_MODULE, "--devices", str(devices), "--steps", str(STEPS), "--out", str(out)],
         "the JAX run", env)  # fmt: skip
    r = json.loads(out.read_text())
    assert r["model"] == "cudnnkit.jax" and len(set(r["devices"])) == len(r["devices"]) == devices, r["devices"]
    assert r["shard_shape"][0] == r["global_batch"] // devices, r["shard_shape"]
    sharded, single = r["losses"]["sharded"], r["losses"]["single"]
    dev = _deviation(sharded, single)
    print(f"jax: loss {single[0]:.4f} -> {single[-1]:.4f}; largest relative deviation of the sharded run's losses "
          f"{dev.max():.2e}, parameters {r['params_rel']:.2e}, state {r['state_rel']:.2e}; {r['devices']}")  # fmt: skip
    assert dev.max() <= JAX_LOSS_RTOL, f"relative deviation per step {dev.tolist()}\nsingle {single}\nsharded {sharded}"
    assert r["params_rel"] <= JAX_PARAM_RTOL and r["state_rel"] <= JAX_PARAM_RTOL, (r["params_rel"], r["state_rel"])
    _assert_falls(single)
    if devices < RANKS:
        pytest.skip(_dry_run_note(f"the shard_map step over a mesh of {r['devices']}"))
