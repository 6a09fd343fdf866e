"""tests/fuzz/callrecord.py: the recorded cuDNN calls are deterministic and say what the op calls."""

from __future__ import annotations

from .fuzz.callrecord import record


def test_recorded_calls_are_deterministic_and_name_the_call():
    a = record(["softmax_forward", "set_tensor"], 120, 3)
    b = record(["softmax_forward", "set_tensor"], 120, 3)
    assert a == b
    names = {c[0] for case in a for c in case["calls"]}
    assert names <= {"cudnnSoftmaxForward", "cudnnSetTensor"} and "cudnnSoftmaxForward" in names
    # each correct case ran twice (the second time through the op-level cache's hit path), one call each time
    ran = [case for case in a if case["outcomes"] == ["correct", "correct"] and case["calls"]]
    assert ran and all(len(case["calls"]) % 2 == 0 for case in ran if case["op"] == "softmax_forward")


def test_express_path_makes_the_same_calls_as_the_full_sequence():
    """Every primitive, each case run three times with fake arrays the express path knows (fresh pointers each
    run): with the path on, the third run is an express hit where the call went straight to cuDNN, and the
    recorded calls (pointers by first use), outcomes and errors are those of the full sequence."""
    from cudnnkit.ops import REGISTRY, _express

    ops = sorted(REGISTRY)
    _express.entries.clear()
    full = record(ops, 400, 11, express=False)
    assert _express.info()["size"] == 0
    fast = record(ops, 400, 11, express=True)
    hits = _express.info()["hits"]
    assert fast == full
    _express.entries.clear()
    assert hits > 50, hits  # the comparison above covered express hits, not only misses
