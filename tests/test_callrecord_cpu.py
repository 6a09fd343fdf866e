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
