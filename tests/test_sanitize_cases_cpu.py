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
