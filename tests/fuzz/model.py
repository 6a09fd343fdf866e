"""A fuzz case as pure data: library-neutral, picklable (it crosses into the worker process), printable as a repro.

An argument of a call is either a plain Python value (numbers, strings, ``None``, tuples, lists and dicts of
values, also deliberately wrong ones: NaN, ``1e300``, complex, ...) or one of the described objects below, which
:mod:`.materialize` turns into a real object of the backend:

* :class:`A`: an array: shape, dtype, how its values are drawn (``fill``), its memory layout (C order,
  transposed, gapped, expanded, overlapping, reversed, offset), whether it is an output (poisoned with NaN before
  the call), read-only, which library it comes from (the case's, the other one, a bare
  ``__cuda_array_interface__`` object, a host NumPy array, a list, a torch CPU tensor) and lies its CAI tells;
* :class:`State`: a ``DropoutState``; :class:`Rnn`: an ``RNN`` config, built inside the call (its errors are the
  call's); :class:`Weights`: an RNN's flat weight buffer; :class:`Setup`: a value made by the op's setup (the
  reserve of a forward for its backward); :class:`Opaque`: a raw pointer, a stream object, a plain ``object()``.

A :class:`Case` is one call: the op's name, its arguments by name (the ones passed positionally first), the
library, and the :class:`Mutation` (s) that turned a valid call into this one (none for a valid call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["A", "State", "Rnn", "Weights", "Setup", "Opaque", "Mutation", "Case", "describe", "layout_strides"]

#: layouts: ("c",) C order; ("perm", order) memory order of the axes, outermost first (NHWC is (0, 2, 3, 1));
#: ("gap", axis, step) every step-th element along axis; ("expand", axis) stride 0 (values repeat along axis);
#: ("overlap", axis) axis's stride halved (elements share memory); ("neg", axis) reversed along axis;
#: ("offset", k) the array starts k elements into a larger allocation (a misaligned pointer)
C = ("c",)


@dataclass(frozen=True)
class A:
    """A described array argument (see the module docstring)."""

    shape: tuple[int, ...]
    dtype: str
    fill: str = "normal"
    layout: tuple = C
    out: bool = False
    readonly: bool = False
    lib: str = "main"  # main | other | cai | host | list | torch_cpu
    cai: tuple = ()  # CAI dict overrides, (key, value) pairs; value DROP removes the key
    device: int = 0
    seed: int = 0
    values: tuple | None = None  # explicit values (index arrays), else drawn from fill

    def with_(self, **kw: Any) -> A:
        return replace(self, **kw)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


DROP = "<drop>"


@dataclass(frozen=True)
class State:
    """A ``DropoutState(like, seed)`` made on a (valid) array ``like`` of the case's library."""

    like: A
    seed: int = 0


@dataclass(frozen=True)
class Rnn:
    """An ``ops.RNN(**fields)``; built inside the call, so a field it refuses is the call's outcome."""

    fields: tuple[tuple[str, Any], ...]

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.fields).get(key, default)

    def with_(self, **kw: Any) -> Rnn:
        d = dict(self.fields)
        d.update(kw)
        return Rnn(tuple(d.items()))


@dataclass(frozen=True)
class Weights:
    """The flat weight buffer of the case's RNN (``rnn.weight_count(x)`` elements, ``delta`` more), random values;
    ``dtype``/``layout``/``ndim2`` (a 2-d ``(n, 1)`` buffer) make a wrong one."""

    seed: int = 0
    delta: int = 0
    dtype: str | None = None
    layout: tuple = C
    ndim2: bool = False
    out: bool = False


@dataclass(frozen=True)
class Setup:
    """A value the op's setup made (for example ``"reserve"``: what the forward returned for its backward)."""

    key: str


@dataclass(frozen=True)
class Opaque:
    """Something made in the worker: ``kind`` is "object" (a plain ``object()``), "host_ptr" (the address of a host
    buffer), "small_ptr" (a device allocation of ``arg`` bytes), "ptr_of" (the raw device pointer of a new array
    ``arg`` (an :class:`A`), plus an optional byte offset ``arg2``), "stream_other" (a stream object of the other library),
    "stream_new" (a new stream object of the case's library), "cpu_dlpack" (a host DLPack object)."""

    kind: str
    arg: Any = None
    arg2: int = 0


@dataclass(frozen=True)
class Mutation:
    """One change that made a valid call into this case.

    ``expect``: "refuse" (the call is invalid: it must raise a clear exception naming ``names``), "any" (it may
    work or be refused clearly: a layout cuDNN cannot take may be copied), "refuse_gpu" (refused where the CUDA
    driver can tell, on the GPU tier; on the CPU either is fine)."""

    kind: str
    target: str
    detail: str
    expect: str = "refuse"
    names: tuple[str, ...] = ()

    @property
    def accepted_names(self) -> tuple[str, ...]:
        return self.names or (self.target,)


@dataclass
class Case:
    op: str
    kwargs: dict[str, Any]
    positional: tuple[str, ...] = ()
    lib: str = "fake"
    other: str | None = None
    mutations: tuple[Mutation, ...] = ()
    setup: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    seed: int = 0

    @property
    def valid(self) -> bool:
        return not self.mutations

    def expect(self, gpu: bool) -> str:
        """ "refuse" if some mutation makes the call invalid here, "any" if all may pass, "valid" for no mutation."""
        if not self.mutations:
            return "valid"
        for m in self.mutations:
            if m.expect == "refuse" or (m.expect == "refuse_gpu" and gpu):
                return "refuse"
        return "any"

    def repro(self) -> str:
        """One line naming the op, every argument as described, the library and the mutation(s)."""
        args = [describe(self.kwargs[k]) for k in self.positional if k in self.kwargs]
        args += [f"{k}={describe(v)}" for k, v in self.kwargs.items() if k not in self.positional]
        muts = "; ".join(f"{m.kind} {m.detail} [{m.expect}]" for m in self.mutations) or "none (valid call)"
        return f"#{self.index} {self.op}({', '.join(args)}) lib={self.lib} seed={self.seed} mutation: {muts}"


def describe(v: Any) -> str:
    """A short, readable description of a described value."""
    if isinstance(v, A):
        parts = [f"{v.dtype}{list(v.shape)}"]
        if v.layout != C:
            parts.append("/".join(str(p) for p in v.layout))
        if v.out:
            parts.append("out")
        if v.readonly:
            parts.append("readonly")
        if v.lib != "main":
            parts.append(f"lib={v.lib}")
        if v.cai:
            parts.append("cai=" + ",".join(f"{k}:{x!r}" for k, x in v.cai))
        if v.device:
            parts.append(f"device={v.device}")
        if v.values is not None:
            parts.append(f"values={list(v.values)[:12]}")
        elif v.fill != "normal":
            parts.append(f"fill={v.fill}")
        return "A(" + " ".join(parts) + ")"
    if isinstance(v, Rnn):
        return "RNN(" + ", ".join(f"{k}={x!r}" for k, x in v.fields) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k!r}: {describe(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(describe(x) for x in v) + "]"
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return "(" + ", ".join(describe(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    r = repr(v)
    return r if len(r) < 80 else r[:77] + "..."


def layout_strides(shape: tuple[int, ...], layout: tuple) -> tuple[tuple[int, ...], int, int]:
    """(element strides, elements of the allocation, element offset of index 0) of ``layout`` for ``shape``.

    The allocation is a 1-d buffer; the array is the strided view ``buffer[offset + sum(i * stride)]``."""
    nd = len(shape)
    kind = layout[0]
    sizes = [max(d, 1) for d in shape]
    offset = 0
    if kind == "perm":
        order = tuple(layout[1])
        strides = [0] * nd
        acc = 1
        for ax in reversed(order):
            strides[ax] = acc
            acc *= sizes[ax]
    elif kind == "gap":
        axis, step = layout[1], layout[2]
        base = list(sizes)
        base[axis] = sizes[axis] * step
        strides = _c(base)
        strides[axis] *= step
    else:
        strides = _c(sizes)
        if kind == "expand":
            strides[layout[1]] = 0
        elif kind == "overlap":
            ax = layout[1]
            strides[ax] = max(1, strides[ax] // 2)
        elif kind == "neg":
            ax = layout[1]
            offset = (shape[ax] - 1) * strides[ax] if shape[ax] > 0 else 0
            strides[ax] = -strides[ax]
        elif kind == "offset":
            offset = int(layout[1])
    if 0 in shape:
        return tuple(strides), max(offset, 1), offset
    hi = offset + sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    lo = offset + sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    assert lo >= 0, (shape, layout)
    return tuple(strides), hi + 1, offset


def _c(sizes: list[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(sizes):
        out.append(acc)
        acc *= d
    return list(reversed(out))
