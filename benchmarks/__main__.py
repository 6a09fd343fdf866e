"""``python -m benchmarks``: time cudnnkit against PyTorch (see ``benchmarks/harness.py``)."""

from __future__ import annotations

from .harness import main

if __name__ == "__main__":
    raise SystemExit(main())
