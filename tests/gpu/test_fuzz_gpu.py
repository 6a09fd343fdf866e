"""The fuzzer's GPU tier (issue 10): generated cases run on the device, in a worker subprocess.

The cases come from the same descriptions and strategies as the CPU tier (``tests/fuzz``), drawn by a seeded
generator (``CUDNNKIT_FUZZ_GPU_SEED``, default 10), CuPy and torch alternating. Each runs in a long-lived worker
process that synchronizes the device after it and runs a tiny softmax checked against NumPy; a worker that dies
(a segfault, an illegal memory access that poisons the context) or hangs makes the case a CRASH and a fresh worker
takes the next one. The test fails on any crash, any unclear exception, and any result that disagrees with the
op's float64 reference; the failure lists each class once with a repro. ``CUDNNKIT_FUZZ_GPU_CASES`` sets the
number of cases (default 2000); ``scripts/fuzz --cases 10000 --json out.json`` runs the big one standalone.
"""

from __future__ import annotations

import json
import os

import pytest

from ..fuzz.runner import gpu_libs, run_cases
from ..fuzz.strategies import generate

pytestmark = pytest.mark.gpu

CASES = int(os.environ.get("CUDNNKIT_FUZZ_GPU_CASES", "2000"))
SEED = int(os.environ.get("CUDNNKIT_FUZZ_GPU_SEED", "10"))


def test_fuzz_gpu(tmp_path):
    libs = gpu_libs()
    if not libs:
        pytest.skip("no array library sees a CUDA device")
    cases = generate(CASES, SEED, libs, True)
    summary = run_cases(cases, {"backend": "gpu", "libs": list(libs)}, timeout=180)
    out = os.environ.get("CUDNNKIT_FUZZ_GPU_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(summary.to_json(), f, indent=1)
    print(summary.line())
    if summary.failures:
        pytest.fail(summary.report(), pytrace=False)
