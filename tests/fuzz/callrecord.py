"""Record the cuDNN calls that fuzz cases make, on the CPU fakes: ``python -m tests.fuzz.callrecord OPS N SEED``.

The fake backend's device gate is replaced by a recorder: every cuDNN function that takes a handle records its
name and arguments and returns success, so a case runs to its end; every graph-API attribute set
(``cudnnkit.lib.backend.set_attribute``: the descriptor's type, the attribute, its value) is recorded in order and
then set for real. Arguments are normalised so that two source
trees can be compared: a descriptor by its key (its cached value), a scaling factor by its value, a device
pointer by the order in which the case first passed it, other ints as they are. Each case runs twice (the second
run takes the op-level caches' hit paths). Prints one JSON list: per case its op, its outcomes, its error
message (hex addresses masked) and its calls. ``scripts/callcheck`` compares two trees' lists: the structure
work of issue 11 must leave every call unchanged.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any


def _value(v: Any) -> Any:
    """A scalar, with NaN as the string "nan" (NaN never equals itself)."""
    return "nan" if isinstance(v, float) and v != v else v


def _backend_value(v: Any) -> Any:
    """A backend attribute's value, comparable across runs: descriptors by type, big ints (pointers) masked."""
    if isinstance(v, (list, tuple)):
        return [_backend_value(x) for x in v]
    if hasattr(v, "type") and hasattr(v, "ptr"):
        return ["descriptor", int(v.type)]
    if isinstance(v, int) and not isinstance(v, bool) and v > 2**32:
        return "ptr"
    if isinstance(v, (int, float, str, bool)) or v is None:
        return _value(float(v)) if isinstance(v, float) else (int(v) if isinstance(v, int) else v)
    return type(v).__name__


def _norm(a: Any, ptrs: dict[int, int]) -> Any:
    from cudnnkit.runtime.descriptors import Descriptor

    if isinstance(a, Descriptor):
        return ["desc", repr(a.key)]
    if isinstance(a, int) and not isinstance(a, bool):
        return ["ptr", ptrs.setdefault(a, len(ptrs))] if a > 2**32 else a
    obj = getattr(a, "_obj", None)
    if obj is not None and hasattr(obj, "value"):
        return ["ref", _value(obj.value)]
    if hasattr(a, "value"):
        return ["val", _value(a.value)]
    return None if a is None else type(a).__name__


def record(ops: list[str] | None, n: int, seed: int) -> list[dict[str, Any]]:
    from cudnnkit import lib

    from .materialize import FakeBackend
    from .runner import execute
    from .strategies import generate

    calls: list[tuple[str, tuple]] = []

    def recorder(fname: str):
        def rec(*args: Any) -> int:
            calls.append((fname, args))
            return 0

        return rec

    from cudnnkit.lib import backend as bk

    real_set = bk.set_attribute

    def set_attribute(desc: Any, name: str, value: Any) -> None:  # the graph API's attributes, in order
        calls.append(("set " + name, (getattr(desc, "type", None), _backend_value(value))))
        return real_set(desc, name, value)

    backend = FakeBackend()
    with backend.installed():
        backend._patch(bk, "set_attribute", set_attribute)
        for fname, proto in lib.FUNCTIONS.items():
            if "cudnnHandle_t" in proto.c_decl.partition("(")[2]:
                backend._patch(lib, fname, recorder(fname))
        out = []
        for c in generate(n, seed, ("fakeA",), False, ops):
            c.other = "fakeB"
            calls.clear()
            first, again = execute(c, backend), execute(c, backend)
            ptrs: dict[int, int] = {}
            out.append(
                {
                    "case": c.index,
                    "op": c.op,
                    "outcomes": [first.kind, again.kind],
                    "error": re.sub(r"0x[0-9a-f]+", "0x?", first.detail[:300]) if first.kind != "correct" else "",
                    "calls": [
                        [f, [int(args[0]) if args[0] is not None else None, args[1]]]
                        if f.startswith("set ")
                        else [f, [_norm(a, ptrs) for a in args]]
                        for f, args in calls
                    ],
                }
            )
    return out


if __name__ == "__main__":
    ops_arg, n_arg, seed_arg = sys.argv[1:4]
    json.dump(record(None if ops_arg == "all" else ops_arg.split(","), int(n_arg), int(seed_arg)), sys.stdout)
