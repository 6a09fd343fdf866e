"""What a case's outcome is: a clear refusal, an unclear error, a call that reached the device (CPU tier), a
correct or wrong result, a crash.

A refusal is **clear** when all of these hold:

* its type is one a user can act on: ``TypeError``, ``ValueError`` (``GraphError``, ``BindingError``,
  ``UnsupportedGraphError`` are ``ValueError`` s), ``FeatureVersionError``, ``MemoryError``;
* it is not a :class:`cudnnkit.lib.CudnnError` (a bare cuDNN status escaping; ``BadParamError`` is also a
  ``ValueError`` but still a bare status);
* it was raised by cudnnkit's own code (the innermost frame of its traceback is in ``src/cudnnkit``), or by
  Python itself at the call (an unknown keyword, a missing argument), not inside NumPy, torch, CuPy or ctypes;
* its message names the argument the mutation changed (or, for a mutation that may pass, some argument of the
  call).

Anything else raised is **unclear**: a bare cuDNN status, ``KeyError``/``AttributeError``/``AssertionError``/
``IndexError``/..., an exception from a library's frames, a message that names no argument; and so is an invalid
call that is accepted, or a valid call that is refused (except a graph cuDNN has no engine for, which
``UnsupportedGraphError`` says clearly).
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any

import cudnnkit
from cudnnkit import lib

from .materialize import ReachedDevice
from .model import Case

__all__ = ["Outcome", "classify", "CLEAR", "UNCLEAR", "CRASH", "WRONG", "CORRECT", "REACHED", "unclear_class"]

CLEAR, UNCLEAR, CRASH, WRONG, CORRECT, REACHED = "clear", "unclear", "crash", "wrong", "correct", "reached"

_SRC = os.path.dirname(os.path.abspath(cudnnkit.__file__)) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CALL_ERRORS = re.compile(
    r"unexpected keyword argument|missing \d+ required|takes \d+ positional|takes from|got multiple values|"
    r"required keyword-only|positional argument"
)


@dataclass
class Outcome:
    kind: str  # clear | unclear | crash | wrong | correct | reached
    reason: str = ""  # for unclear/wrong/crash: the class of the problem (short, stable: used to group)
    detail: str = ""  # the exception text, the mismatch, the exit status
    exc_type: str = ""
    where: str = ""  # innermost frame: file:line function
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.kind in (UNCLEAR, CRASH, WRONG)


def _innermost(exc: BaseException) -> traceback.FrameSummary | None:
    tb = traceback.extract_tb(exc.__traceback__)
    return tb[-1] if tb else None


def _names(text: str, names: tuple[str, ...]) -> bool:
    for n in names:
        if not n:
            continue
        if re.search(r"(?<![A-Za-z0-9_])" + re.escape(n) + r"(?![A-Za-z0-9_])", text):
            return True
    return False


def _is_cudnn_status(exc: BaseException) -> bool:
    return isinstance(exc, lib.CudnnError) and not isinstance(exc, lib.DriverNotFoundError)


def _driver_missing(exc: BaseException) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, lib.DriverNotFoundError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


#: NotImplementedError: what cuDNN cannot do, refused by name (the design's rule for an argument combination the
#: library does not run, e.g. sdpa_forward's grouped heads other than 1 or H)
CLEAR_TYPES = (TypeError, ValueError, NotImplementedError, lib.FeatureVersionError, MemoryError)


#: mutations that break a relation between arrays (a shape or dtype that no longer matches another array's)
RELATIONAL = ("shape", "dtype", "device")


def classify(
    case: Case,
    exc: BaseException | None,
    *,
    gpu: bool,
    call_names: tuple[str, ...],
    arrays: tuple[str, ...] = (),
    aliases: dict[str, tuple[str, ...]] | None = None,
) -> Outcome:
    """The outcome of running ``case``: ``exc`` is what the call raised (None if it returned; then the caller
    checks the result and may turn ``CORRECT`` into ``WRONG``). ``call_names``: every argument of the call;
    ``arrays``: its array arguments (a shape or dtype mismatch may be told naming either side); ``aliases``: other
    names an argument goes by (a graph binding is named by its tensor's label)."""
    expect = case.expect(gpu)
    muts = case.mutations
    if exc is None:
        if expect == "refuse":
            return Outcome(UNCLEAR, "accepted an invalid call", _mutations(case))
        return Outcome(CORRECT)
    name = type(exc).__name__
    frame = _innermost(exc)
    where = f"{os.path.relpath(frame.filename, os.path.dirname(_SRC))}:{frame.lineno} {frame.name}" if frame else ""
    text = str(exc)
    base = dict(detail=f"{name}: {text}"[:600], exc_type=name, where=where)
    if isinstance(exc, ReachedDevice) or (not gpu and _driver_missing(exc)):
        if gpu:
            return Outcome(UNCLEAR, "harness: the CPU gate ran on the GPU", **base)
        if expect == "refuse":
            return Outcome(UNCLEAR, "accepted an invalid call (reached the device)", _mutations(case), name, where)
        return Outcome(REACHED, **base)
    if _is_cudnn_status(exc):
        return Outcome(UNCLEAR, f"bare cuDNN status ({name})", **base)
    if not isinstance(exc, CLEAR_TYPES):
        return Outcome(UNCLEAR, f"{name} (not a clear error type)", **base)
    from cudnnkit.graph import UnsupportedGraphError

    # cuDNN has no engine for the graph: clear whatever was mutated (also as the router's ValueError that says the
    # legacy call cannot take it either, whose cause it is)
    if isinstance(exc, UnsupportedGraphError) or isinstance(exc.__cause__, UnsupportedGraphError):
        return Outcome(CLEAR, "no engine", **base)
    inside = frame is not None and os.path.abspath(frame.filename).startswith(_SRC)
    at_call = frame is not None and os.path.abspath(frame.filename).startswith(_HERE)
    if not inside and not (at_call and isinstance(exc, TypeError) and _CALL_ERRORS.search(text)):
        module = _module_of(frame.filename) if frame else "?"
        return Outcome(UNCLEAR, f"{name} raised inside {module}", **base)
    if expect == "valid":
        return Outcome(UNCLEAR, "refused a valid call", **base)
    if expect == "refuse":
        wanted = tuple(n for m in muts for n in m.accepted_names)
        if any(m.kind in RELATIONAL for m in muts) or (len(muts) > 1 and any(m.expect == "any" for m in muts)):
            # a mismatch between arguments may be told from either side; of several changes, one that may pass can
            # make another argument the first one refused
            wanted += arrays + call_names
    else:
        wanted = call_names + tuple(n for m in muts for n in m.accepted_names)
    wanted += tuple(a for n in wanted for a in (aliases or {}).get(n, ()))
    if not _names(text, wanted):
        return Outcome(UNCLEAR, "message does not name the argument", base["detail"], name, where, {"wanted": wanted})
    return Outcome(CLEAR, **base)


def _mutations(case: Case) -> str:
    return "; ".join(m.detail for m in case.mutations)


def _module_of(path: str) -> str:
    p = os.path.abspath(path)
    for part in ("numpy", "torch", "cupy", "ctypes", "hypothesis"):
        if f"{os.sep}{part}{os.sep}" in p:
            return part
    return os.path.basename(p)


def unclear_class(op: str, o: Outcome) -> str:
    """A short key grouping outcomes of one class (op-independent where the reason is)."""
    if o.kind == CRASH:
        return f"crash: {o.reason}"
    if o.kind == WRONG:
        return f"wrong result: {op}: {o.reason}"
    return f"{o.reason}: {o.exc_type} at {o.where}"
