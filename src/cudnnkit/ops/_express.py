"""The express path: a repeated op call, recognised from its arrays' metadata and its keywords, runs with nothing
checked, resolved, planned or described again.

Every check :func:`~cudnnkit.ops._primitive.run` makes before the cuDNN call is a function of what
:func:`signature` reads: per array, its adapter's ``key`` (type, dtype, shape, strides, device: see
:mod:`cudnnkit.runtime.adapters`), and per keyword its type and value (a list of plain values and a NumPy number
by their values; an object that is not a plain value, such as a ``DropoutState`` or a frozen config, by identity:
the entry keeps it alive, so the identity cannot be reused; a container that may change in place, an n-d NumPy
array or a dict, makes the call take the full sequence). A call whose signature was seen before, on a call that went
straight to cuDNN (the arrays as given, no copy, no temporary, either path), is an :class:`Entry` hit: it reads the
current stream, allocates the new outputs with the strides the first call chose, builds the views from the entry's
templates and this call's pointers, runs the op's ``check_plan`` (which may read pointers, and hands the legacy call
its extras) and the path the first call took (the legacy call, or the graph form with its cached plan). The
signature holds the current ``cudnnkit.settings`` object, which decides the path and what a call resolves to. A call
that made extras (batch norm's saved statistics and reserve, pooling's index) is remembered too: its hits run the
whole form again, which makes them anew (measured on the H200: a small batch-norm training forward 182 -> 124 us of
host time per call, a small layer norm 113 -> 63 us).

Not express (always the full sequence): a ``stream=`` argument, arrays of a library without a ``key`` (bare
``__cuda_array_interface__``/DLPack objects), primitives declared ``express=False`` (their checks read a
pointer or the settings), ``host_ok`` operands, and calls that needed a copy of an output (an ``out=`` written
through a temporary), a packed copy, a copy by another library than the launch's, or a producer stream. The input
copies a hit repeats (:attr:`Entry.copies`) are :func:`~cudnnkit.runtime.prepare`'s, of an input cuDNN cannot take
as it is (an expanded gradient, as a mean's backward hands on), and those into an op's one layout (a C-order
gradient for a channels-last activation). :func:`enabled` turns the path off (tests compare both); so does the
environment variable ``CUDNNKIT_EXPRESS=0`` at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import adapters, current_settings
from ..runtime.cache import LRU

__all__ = ["Entry", "signature", "keyword_key", "entries", "enabled", "info"]

_SIMPLE = frozenset({int, float, bool, str, type(None)})
#: keyword types whose contents may change in place, so that neither their identity nor a key of their values taken
#: once says what a later call holds (a list of plain values is keyed by its values instead; an n-d NumPy array,
#: a dict ... take the full sequence)
_MUTABLE = frozenset({list, dict, set, bytearray, np.ndarray})

#: signature -> Entry
entries: LRU[tuple, Entry] = LRU("ops.express", 4096)
_on = [os.environ.get("CUDNNKIT_EXPRESS", "1") != "0"]


def enabled(on: bool | None = None) -> bool:
    """Whether the express path is on (default); ``enabled(False)`` turns it off for every thread (and drops
    the entries), ``enabled(True)`` back on. Returns the setting."""
    if on is not None:
        _on[0] = bool(on)
        if not on:
            entries.clear()
    return _on[0]


def info() -> dict[str, int]:
    """Entries held, their bound, and the express calls they served."""
    held = list(entries._d.values())
    return {"size": len(held), "maxsize": entries.maxsize, "hits": sum(e.hits for e in held)}


def signature(p: Any, arrays: Any, kwargs: Any) -> tuple[tuple, list[int], list[Any]] | None:
    """``(key, pointers, objects)`` of one call of primitive ``p``, or None when it cannot be express.

    ``key`` is hashable for plain keyword values (an unhashable one surfaces as ``TypeError`` at the lookup,
    where :func:`~cudnnkit.ops._primitive.run` takes the full sequence); ``pointers`` are the data pointers of the
    present operands (``p``'s order) then of the ``out=`` arrays (keyword order); ``objects`` the keyword values
    taken by identity.

    The per-call host cost is the point of this function (it runs on every call): the keywords go in as three
    tuples built in C (names, values, their types: ``1``, ``1.0`` and ``True`` are equal and hash alike), and
    only a call with a non-plain value (an array, a tuple, a state object) walks them in Python."""
    if not _on[0]:
        return None
    keyed = adapters.KEYED
    ptrs: list[int] = []
    parts: list[Any] = [p.name, current_settings()]  # the settings decide the path and what a call resolves to
    for name in p._names:
        a = arrays.get(name)
        if a is None:
            parts.append(None)
            continue
        key = keyed.get(type(a))
        if key is None:
            return None
        got = key(a)
        if got is None:
            return None
        parts.append(got[0])
        ptrs.append(got[1])
    objs: list[Any] = []
    kk = keyword_key(kwargs)
    if kk is None:  # an out= array or an object among the keywords: walked one by one
        vals = tuple(kwargs.values())
        types = tuple(map(type, vals))
        outs = p._outnames
        fixed = list(vals)
        for i, (k, v) in enumerate(kwargs.items()):
            t = types[i]
            if t in _SIMPLE:
                continue
            if k in outs:
                key = keyed.get(t)
                got = key(v) if key is not None else None
                if got is None:
                    return None
                fixed[i] = got[0]
                ptrs.append(got[1])
            elif t is tuple and _SIMPLE.issuperset(map(type, v)):
                fixed[i] = _typed(v)
            elif t is list and _SIMPLE.issuperset(map(type, v)):  # by its values now: it may change in place
                fixed[i] = (list, _typed(tuple(v)))
            elif isinstance(v, np.generic) or (t is np.ndarray and v.ndim == 0):  # a NumPy number, by value
                fixed[i] = (t, str(v.dtype), v.item())
            elif t in _MUTABLE:  # a container whose contents may change in place between calls: never express
                return None
            else:  # an object whose identity is what it is (a frozen config, a DropoutState): kept alive
                fixed[i] = id(v)
                objs.append(v)
        kk = (tuple(kwargs), tuple(fixed), types)
    parts += kk
    return tuple(parts), ptrs, objs


def _typed(v: tuple) -> tuple:
    """A tuple of plain values with their types (``(1, 1)``, ``(1.0, 1.0)`` and ``(True, True)`` differ)."""
    return (v, tuple(map(type, v)))


def keyword_key(kwargs: Any) -> tuple | None:
    """``(names, values, types)`` of keywords that are plain values or tuples of them (each tuple with its elements'
    types): what the express signature and the replay key (:func:`~cudnnkit.ops._replay.key_of`) hold of them;
    None when a value is anything else (an array, an object)."""
    vals = tuple(kwargs.values())
    types = tuple(map(type, vals))
    if not _SIMPLE.issuperset(types):
        fixed = list(vals)
        for i, v in enumerate(vals):
            t = types[i]
            if t in _SIMPLE:
                continue
            if t is not tuple or not _SIMPLE.issuperset(map(type, v)):
                return None
            fixed[i] = _typed(v)
        vals = tuple(fixed)
    return tuple(kwargs), vals, types


@dataclass
class Entry:
    """What a hit needs (see the module docstring): the device and allocating adapter, the names the launch
    reports, the operand templates ``(name, shape, strides, dtype, adapter)`` in pointer order (given outputs
    last), the outputs to allocate ``(name, shape, dtype, strides, adapter)``, and the call's resolved
    keywords, descriptor, description and scaling references."""

    device: int
    adapter: Any
    inputs: tuple[str, ...]
    views: tuple[tuple[str, tuple, tuple, str, Any], ...]
    given: int  #: how many of ``views`` (the last ones) are given outputs
    new: tuple[tuple[str, tuple, str, Any, Any], ...]
    resolved: Any
    desc: Any
    description: Any
    alpha: Any
    beta: Any
    blends: dict
    shaped: bool
    keep: tuple = ()
    #: the optional operands the call did not have (their views are None, as in the full sequence)
    absent: tuple[str, ...] = ()
    #: calls that took this entry (counted without a lock: exact in one thread, about right in several)
    hits: int = 0
    #: the path the call took ("legacy" or "graph") and, for the graph, its router key (the op-level graph cache)
    path: str = "legacy"
    graph_key: Any = None
    #: the graph path's (plan, bindable names): a hit runs it with its pointers and nothing else
    graph_form: Any = None
    #: name -> position in the signature's pointers (operands, then given outputs)
    index: dict = None  # type: ignore[assignment]
    #: a hit may take the pointer-only graph path (``_primitive._fire_graph``): a shaped call on the graph path
    fast: bool = False
    #: ``(name, shape, dtype, strides, adapter)`` of the inputs the first call copied (an expanded or overlapping
    #: array cuDNN cannot take as it is: :func:`~cudnnkit.runtime.prepare`): a hit copies them again, the same way
    copies: tuple = ()
    #: what ``last_path()`` reads after a legacy hit: ``(primitive name, "legacy")``
    last: tuple = ()
    #: ``(name, shape, dtype, strides)`` of the extras the graph path writes new on each call (batch norm's saved
    #: statistics): a pointer-only hit allocates them like its new outputs
    fresh: tuple = ()

    #: the pointer-only graph path's plan order (``fast`` entries): for each of the plan's bindable names, its
    #: position in the signature's pointers, else ``-1 - k`` for the k-th array a hit allocates (``new`` then
    #: ``fresh``, in order)
    order: tuple = ()
    #: the pointer-only path's results: ``(k, name)`` per output then extra, ``k`` its place among the arrays a hit
    #: allocates, else None (a given output by ``name``; an extra not made); set by its first such hit
    returns: Any = None

    def __post_init__(self) -> None:
        self.index = {v[0]: i for i, v in enumerate(self.views)}
        self.fast = self.path == "graph" and self.graph_form is not None and self.shaped
        if self.fast:
            at = {n[0]: -1 - k for k, n in enumerate((*self.new, *self.fresh))} | self.index
            if all(n in at for n in self.graph_form[1]):
                self.order = tuple(at[n] for n in self.graph_form[1])
            else:  # a bindable name the hit has no array for: never the pointer-only path
                self.fast = False


def entry_from(launch: Any, views: dict[str, Any], given: list[str], new: list[tuple[str, Any]], call: Any,
               shaped: bool, objs: list[Any], outs: Any = None, copies: tuple = ()) -> Entry:  # fmt: skip
    """The :class:`Entry` of a call that went straight to cuDNN: ``views`` its operands' (present ones, in the
    primitive's order), ``given`` the names of the outputs passed as ``out=`` (keyword order; their views are in
    ``outs``, default ``call.views``), ``new`` ``(name, view)`` of the outputs it allocated."""
    cv = outs if outs is not None else call.views
    tmpl = [(n, v.shape, v.strides, v.dtype, v.adapter) for n, v in views.items() if v is not None]
    tmpl += [(n, cv[n].shape, cv[n].strides, cv[n].dtype, cv[n].adapter) for n in given]
    return Entry(
        launch.device,
        launch.adapter,
        launch.inputs,
        tuple(tmpl),
        len(given),
        tuple((n, v.shape, v.dtype, v.strides, v.adapter) for n, v in new),
        call.resolved,
        call.desc,
        call.description,
        call.alpha,
        call.beta,
        dict(call.blends),
        shaped,
        tuple(objs),
        tuple(n for n, v in views.items() if v is None),
        0,
        call.extra.get("_path", "legacy"),
        call.extra.get("graph_key"),
        call.extra.get("graph_form"),
        fresh=tuple(call.extra.get("graph_fresh", ())) if call.extra.get("graph_form") is not None else (),
        copies=copies,
    )
