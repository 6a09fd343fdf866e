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


def record(ops: list[str] | None, n: int, seed: int, *, express: bool | None = None) -> list[dict[str, Any]]:
    """The calls of ``n`` generated cases of ``ops``. ``express``: None runs each case twice, as the trees before
    the express path did; True and False run each three times (the third can take the express path) with fake
    arrays known to the express path (``adapters.KEYED``), and the path on or off (``_express.enabled``)."""
    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .materialize import FakeArray, FakeBackend

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

    def fake_key(a: Any) -> tuple:
        return backend.adapters[a.lib].key(a)

    from cudnnkit.ops import dropout
    from cudnnkit.runtime import clear_caches

    clear_caches()  # each record starts from empty caches and no default dropout state (an earlier one's)
    with dropout._defaults_lock:
        dropout._defaults.clear()
    was = _express.enabled()
    if express is not None:
        adapters.KEYED[FakeArray] = fake_key
        _express.enabled(express)
    try:
        return _record(backend, calls, recorder, set_attribute, ops, n, seed, 2 if express is None else 3)
    finally:
        adapters.KEYED.pop(FakeArray, None)
        with dropout._defaults_lock:  # states made under the recorder (size 0): never seen by a later test
            dropout._defaults.clear()
        _express.enabled(was)  # the entries stay (a test reads their hits); enabled(False) would drop them


def _record(backend, calls, recorder, set_attribute, ops, n, seed, runs) -> list[dict[str, Any]]:
    from cudnnkit import lib
    from cudnnkit.lib import backend as bk

    from .runner import execute
    from .strategies import generate

    with backend.installed():
        backend._patch(bk, "set_attribute", set_attribute)
        for fname, proto in lib.FUNCTIONS.items():
            if "cudnnHandle_t" in proto.c_decl.partition("(")[2]:
                backend._patch(lib, fname, recorder(fname))
        out = []
        for c in generate(n, seed, ("fakeA",), False, ops):
            c.other = "fakeB"
            calls.clear()
            got = [execute(c, backend) for _ in range(runs)]
            first = got[0]
            ptrs: dict[int, int] = {}
            out.append(
                {
                    "case": c.index,
                    "op": c.op,
                    "outcomes": [g.kind for g in got],
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
