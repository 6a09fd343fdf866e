"""Command line: ``python -m cudnnkit doctor``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cudnnkit", description="cudnnkit command line")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("doctor", help="report the cuDNN install and run a real call per op family")
    d.add_argument("-v", action="store_true", help="print tracebacks of failed checks")
    ns = ap.parse_args(argv)
    if ns.command == "doctor":
        from .doctor import doctor

        return doctor()
    return 2


if __name__ == "__main__":
    sys.exit(main())
