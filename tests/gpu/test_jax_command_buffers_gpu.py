"""cudnnkit.jax with XLA's command buffers (issue 14): capture-safe targets declare the FFI's command-buffer trait
on request (``CUDNNKIT_JAX_COMMAND_BUFFERS=1``), XLA captures them into CUDA graphs and replays them, and the
results stay right. Run in a subprocess (tests/gpu/jax_command_buffer_probe.py): XLA's flags and the trait are
fixed when JAX's backend starts and when a target registers.

Checked, with ``XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1``:

* the small CNN's 15 jitted SGD steps with cudnnkit ops follow the pure-JAX steps within a relative 1e-4 (TF32 off on
  both sides), as in tests/gpu/test_jax_training_gpu.py without command buffers;
* the capture-safe targets declare the trait, the others do not;
* the convolution's handler is no longer called on repeated steps (XLA replays its graph: no Python runs for it),
  and the captured calls' arenas hold memory;
* a jitted softmax, called five times, equals the eager call exactly (the same cuDNN call on the same data).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover
    pytest.skip("no JAX GPU device", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
FLAGS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"


@pytest.fixture(scope="module")
def probe():
    env = dict(os.environ, CUDNNKIT_JAX_COMMAND_BUFFERS="1", XLA_FLAGS=FLAGS)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-m", "tests.gpu.jax_command_buffer_probe"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_captured_cnn_steps_follow_pure_jax(probe):
    ours, ref = np.asarray(probe["cudnnkit"]["losses"]), np.asarray(probe["jax"]["losses"])
    dev = np.abs(ours - ref) / np.abs(ref)
    assert dev.max() < 1e-4, f"loss deviation per step {dev}"
    assert ref[-1] < 0.85 * ref[0]


def test_the_capture_safe_targets_declare_the_trait(probe):
    traits = probe["traits"]
    assert traits["cudnnkit_convolution"] and traits["cudnnkit_convolution_backward"]
    assert traits["cudnnkit_batch_norm"] and traits["cudnnkit_pooling"]


def test_xla_replays_the_captured_calls_without_the_handler(probe):
    """25 more steps on the same inputs after the 15 training steps: the convolution's handler runs at most a few
    times (a trace per new set of buffer addresses), not twice per step."""
    calls = [c["cudnnkit_convolution"] for c in probe["cudnnkit"]["calls"]]
    after = probe["cudnnkit"]["calls_after_timing"]["cudnnkit_convolution"]
    assert calls[0] >= 2, calls  # it ran (captured) at first
    assert after - calls[-1] <= 6, f"the convolution's handler ran on every step: {calls} then {after}"
    assert probe["captured"]["arenas"] > 0 and probe["captured"]["bytes"] > 0


def test_a_captured_softmax_equals_the_eager_call(probe):
    assert probe["softmax_dev"] == 0.0
