"""Every script in examples/ runs to completion on the GPU, in a fresh process, within its time limit.

Each example checks its own result against an independent float64 reference or a training criterion and prints a
final line; a non-zero exit, a traceback or a timeout fails the test. The source tree's ``src`` goes first on
``PYTHONPATH`` (as scripts/gpu-tests runs the suite, with no install step).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: example script -> (the array libraries it needs, its time limit in seconds)
REQUIRES = {
    "cupy_cnn_inference.py": (("cupy",), 180),
    "torch_training_convert.py": (("torch",), 300),
    "rnn_variable_lengths.py": (("cupy",), 180),
    "ctc_training.py": (("cupy",), 180),
    "fused_conv_graph.py": (("cupy",), 180),
    "sdpa.py": (("torch",), 180),
    "autograd_tape.py": (("cupy",), 180),
}


def scripts() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("name", scripts())
def test_example_runs(name):
    from ..conftest import gpu_libraries

    needs, limit = REQUIRES[name]
    missing = [lib for lib in needs if lib not in gpu_libraries()]
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)} with a CUDA device")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=limit, env=env, cwd=ROOT
    )
    assert p.returncode == 0, f"{name} exited with {p.returncode}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    assert lines, f"{name} printed nothing"
    print(f"{name}: {lines[-1]}")
