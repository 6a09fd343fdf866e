"""The sanitizer's case program (tests/gpu/sanitize_cases.py, run by scripts/sanitize on a GPU machine) stays in
step with the API: its dry run checks every call it makes against the real signatures, with fake arrays."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sanitize_cases_dry_run():
    r = subprocess.run(
        [sys.executable, str(ROOT / "tests/gpu/sanitize_cases.py"), "--dry-run"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cases ok (dry)" in r.stdout.splitlines()[-1]


def test_error_summary_reads_racecheck_hazard_mode():
    # with --racecheck-report hazard, racecheck prints its own summary and no ERROR SUMMARY (measured with
    # compute-sanitizer 2025.3.1 on the H200): the errors are read from it, with the kernel of each report
    from importlib.util import module_from_spec, spec_from_file_location
    from pathlib import Path

    spec = spec_from_file_location("sc", Path(__file__).parent / "gpu" / "sanitize_cases.py")
    m = module_from_spec(spec)
    spec.loader.exec_module(m)
    log = "\n".join(
        [
            "========= Error: Potential RAW hazard detected at __shared__ 0x470 in block (0,0,0) :",
            "=========     Write Thread (0,0,0) at some_kernel_name+0x3f80",
            "=========     Read Thread (352,0,0) at some_kernel_name+0x2f0",
            "========= RACECHECK SUMMARY: 1 hazard displayed (8 errors, 2 warnings)",
        ]
    )
    got = m.error_summary(log)
    assert got["errors"] == 8 and got["race_warnings"] == 2
    assert got["first"] == [
        "Error: Potential RAW hazard detected at __shared__ 0x470 in block (0,0,0) : at some_kernel_name"
    ]
