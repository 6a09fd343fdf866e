"""Replayed L3 calls: a differentiable op's forward or backward, called again with arrays of the same metadata and
the same keywords, runs the express entries its earlier call fired, with this call's arrays, and nothing else.

The eager torch training step is host-bound (``benchmarks/NOTES.md``): each cuDNN call costs a declaration's
Python, an L2 function's keyword handling, :func:`~cudnnkit.ops._primitive.run` and the express
:func:`~cudnnkit.ops._express.signature` on top of the hit itself (:func:`~cudnnkit.ops._primitive._fire`: the
outputs allocated, the plan executed or the legacy call made). An L2 hit is already a function of its arrays'
metadata, its keywords and the settings; a declaration of an op that is ``capture_safe`` (its warm calls queue
device work and nothing else: no host read of device data, no host-side state) computes only with L2 calls
(:mod:`cudnnkit.ops._diff`), so its whole forward or backward, once warm, is a function of the same things. So:

* :func:`call` keys a call by the op, the direction, the thread's settings object, the express key of each array
  (adapter, dtype, shape, strides, device: :data:`~cudnnkit.runtime.adapters.KEYED`) and the keywords (plain
  values and tuples of them, typed as the express signature types them: ``1``, ``1.0`` and ``True`` differ);
* a warm call of a key with no trace yet is *recorded*: while it runs, :func:`~cudnnkit.ops._primitive.run`
  reports each L2 call to this thread's :class:`_Recorder`. The trace is kept only when every L2 call was an
  express hit (:meth:`_Recorder.hit`) whose every array is one of the call's own arrays or a result of an earlier step, and
  every array the call returns is one too; anything else (a full sequence, an array made outside an L2 call such as
  a ``reshape`` view, an L2 call with a ``stream=``, a library whose results are finished later) abandons it, and
  after :data:`ATTEMPTS` calls without a trace the key is marked to run as before, unrecorded;
* a call of a traced key replays it (:meth:`Trace.replay`): for each step, this call's arrays and the earlier
  steps' results in the recorded places, their pointers in the express order, then ``_fire`` with the step's
  entry, exactly as the L2 call's own hit would.

What a replay skips is what every hit of the same calls would have recomputed to the same values; what it runs is
what those hits run. Off with :func:`enabled` ``(False)`` (``CUDNNKIT_REPLAY=0``), and with the express path
(:func:`~cudnnkit.ops._express.enabled`): a replay needs its entries. ``cudnnkit.runtime.clear_caches()`` drops the
traces with every other cache; :func:`info` counts them. The torch layer's eager path (:mod:`cudnnkit.torch._library`)
keys a forward by its op, its tensors and keywords, and the backward by the forward's key, the residuals' names,
``needs`` and every residual's and cotangent's metadata (a saved-tensor hook may hand a residual back in another
layout); its custom ops key by their encoded keyword string and every array's metadata.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ..runtime import adapters, current_settings
from ..runtime.cache import LRU, MISSING
from . import _express

__all__ = ["call", "key_of", "info", "enabled", "traces", "ATTEMPTS"]

#: how many calls of a key may be recorded without giving a trace before its calls run unrecorded: the first call
#: of an op builds its entries (an L2 call's first call misses the op-level cache, its second records the express
#: entry), so a declaration of a few L2 calls is all hits from its third call on
ATTEMPTS = 6

#: key -> :class:`Trace`, or the calls recorded without one (:class:`_Tries`; ``ATTEMPTS`` of them: never again)
traces: LRU[tuple, Any] = LRU("ops.replay", 4096)


_on = [os.environ.get("CUDNNKIT_REPLAY", "1") != "0"]


def enabled(on: bool | None = None) -> bool:
    """Whether calls are recorded and replayed (default; the express path must be on too); ``enabled(False)``
    turns it off for every thread and drops the traces, ``enabled(True)`` back on. Returns the setting. The
    environment variable ``CUDNNKIT_REPLAY=0`` turns it off at import."""
    if on is not None:
        _on[0] = bool(on)
        if not on:
            traces.clear()
    return _on[0]


class _Local(threading.local):
    rec: Any = None


_tls = _Local()


_NONE: dict = {}  # no keywords (read only)


class Trace:
    """The L2 calls of one recorded call: ``steps`` of ``(fire, graph, primitive, entry, arrays, kwargs, pointer
    slots, results)`` (``graph``: see :meth:`_Recorder.hit`) where each array is a slot (the call's own arrays first, in order, then each step's results), and
    ``outs``, the slot (or None) of each array the call returned."""

    __slots__ = ("steps", "outs", "form", "n_in", "replays")

    def __init__(self, steps: list, outs: tuple, form: Any, n_in: int):
        self.steps = tuple(steps)
        self.outs = outs
        self.form = form
        self.n_in = n_in  #: how many arrays the recorded call had (a call with another count runs in full)
        self.replays = 0

    def replay(self, flat: list) -> tuple[list, Any]:
        """The call's results for these arrays (``flat``: the call's own, as recorded), by the recorded hits, and
        the recorded call's ``form``."""
        pointer = adapters.pointer
        vals = list(flat)
        for fire, graph, p, e, arr_slots, kw_items, ptr_slots, n_res in self.steps:
            ptrs = [pointer(vals[s]) for s in ptr_slots]
            got = MISSING
            if graph is not None:  # the pointer-only graph path: no arrays or keywords but a given output's
                got = graph(p, e, ptrs, {k: vals[s] for k, _, s in kw_items if s is not None} if e.given else _NONE)
            if got is MISSING:
                arrays = {n: (None if s is None else vals[s]) for n, s in arr_slots}
                kwargs = {k: (vals[s] if s is not None else v) for k, v, s in kw_items}
                got = fire(p, e, ptrs, arrays, kwargs, graph is None)  # not the pointer-only path again
            if n_res is None:
                vals.append(got)
            else:
                vals.extend(got)
        self.replays += 1
        return [None if s is None else vals[s] for s in self.outs], self.form


class _Recorder:
    """What one recorded call's L2 hits did (see the module docstring)."""

    __slots__ = ("slots", "keep", "steps", "ok", "n")

    def __init__(self, flat: list):
        self.slots: dict[int, int] = {}
        self.keep: list = []  # every array seen, alive until the call ends: an id is never reused meanwhile
        self.steps: list = []
        self.ok = True
        self.n = 0
        for a in flat:  # distinct (:func:`call` records no call with one array in two places)
            self._add(a)

    def _add(self, a: Any) -> None:
        if a is not None:
            self.slots.setdefault(id(a), self.n)
            self.keep.append(a)
        self.n += 1

    def _slot(self, a: Any) -> int | None:
        s = self.slots.get(id(a))
        if s is None:
            self.ok = False
        return s

    def hit(self, fire: Callable, p: Any, e: Any, arrays: Any, kwargs: Any, got: Any, graph: Any = None) -> None:
        """An express hit of primitive ``p`` (entry ``e``) on ``arrays``/``kwargs``, made by ``fire(p, e, pointers,
        arrays, kwargs)`` (:func:`~cudnnkit.ops._primitive._fire`), which returned ``got``; ``graph(p, e,
        pointers, given outputs)`` the pointer-only graph path a replay tries first (``_fire_graph``: it returns
        MISSING where ``fire`` must take the call), None where the entry has none."""
        if not self.ok:
            return
        arr_slots = tuple((n, None if a is None else self._slot(a)) for n, a in arrays.items())
        outs = p._outnames
        kw_items = []
        by_name = dict(arr_slots)
        ptr_slots = [s for n in p._names if (s := by_name.get(n)) is not None]
        for k, v in kwargs.items():
            if type(v) not in _express._SIMPLE and k in outs:  # an out= array: the signature's pointers end with them
                s = self._slot(v)
                kw_items.append((k, None, s))
                ptr_slots.append(s)
            else:
                kw_items.append((k, v, None))
        if not self.ok:
            return
        if type(got) is tuple:
            n_res: int | None = len(got)
            for g in got:
                self._add(g)
        else:
            n_res = None
            self._add(got)
        self.steps.append((fire, graph, p, e, arr_slots, tuple(kw_items), tuple(ptr_slots), n_res))

    def abandon(self) -> None:
        """An L2 call that was not an express hit (or whose result the library finishes later): no trace."""
        self.ok = False

    def trace(self, outs: list, form: Any, n_in: int) -> Trace | None:
        if not self.ok or not self.steps:
            return None
        slots = []
        for a in outs:
            if a is None:
                slots.append(None)
                continue
            s = self.slots.get(id(a))
            if s is None:  # an array the call made outside its L2 calls (a view): not replayable
                return None
            slots.append(s)
        return Trace(self.steps, tuple(slots), form, n_in)


def key_of(*parts: Any, arrays: Any = (), kw: Any = None) -> tuple | None:
    """The replay key of a call: ``parts`` (the op, the direction, anything else that decides it), the thread's
    settings, each of ``arrays``' express key (None stays None) and ``kw``'s names, values and types; None when an
    array has no express key or a keyword is not a plain value or a tuple of them (such a call is never
    recorded)."""
    if not (_on[0] and _express._on[0]):
        return None
    keyed = adapters.KEYED
    out: list[Any] = [*parts, current_settings()]
    for a in arrays:
        if a is None:
            out.append(None)
            continue
        k = keyed.get(type(a))
        if k is None:
            return None
        got = k(a)
        if got is None:
            return None
        out.append(got[0])
    if kw:
        kk = _express.keyword_key(kw)
        if kk is None:
            return None
        out += kk
    return tuple(out)


def call(key: tuple | None, fn: Callable[[list], tuple[list, Any]], flat: list) -> tuple[list, Any]:
    """``fn(flat)``: a declaration's forward or backward over its arrays ``flat``, returning its arrays as a list
    and ``form``, what the caller needs to rebuild its results from them (a value of the key's, kept with the
    trace): replayed from its trace when key ``key`` has one, recorded when it has none yet (see the module
    docstring). ``key`` None (from :func:`key_of`): ``fn(flat)`` as it is."""
    # inside a recorded call (``_tls.rec`` set), the recorder sees this call's L2 calls as its own
    if key is None or not (_on[0] and _express._on[0]) or _tls.rec is not None:
        return fn(flat)
    try:
        t = traces.peek(key, MISSING)
    except TypeError:  # an unhashable value inside a keyword's tuple
        return fn(flat)
    if t is MISSING:
        t = traces.put(key, _Tries())  # another thread's trace when one was stored meanwhile
    if type(t) is Trace:
        if t.n_in != len(flat):  # a caller whose key does not fix its count of arrays: run in full
            return fn(flat)
        if not t.replays & 255:  # renewed now and then: a hot trace is not the least recently used
            traces.lookup(key)
        return t.replay(flat)
    if t.n >= ATTEMPTS:
        return fn(flat)
    ids = [id(a) for a in flat if a is not None]
    if len(set(ids)) < len(ids):
        # one array in two places (self-attention's q, k, v): a trace would bind it twice for a later call of
        # distinct arrays of the same metadata, so this call is not recorded, nor counted as an attempt
        return fn(flat)
    t.n += 1  # without a lock: a few calls more or fewer recorded, never a wrong trace
    rec = _tls.rec = _Recorder(flat)
    try:
        out, form = fn(flat)
    finally:
        _tls.rec = None
    got = rec.trace(out, form, len(flat))
    if got is not None:
        traces.pop(key)
        traces.put(key, got)
    return out, form


class _Tries:
    """A key's calls recorded without a trace so far."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


def info() -> dict[str, int]:
    """Keys held, how many have a trace, and the calls those traces replayed."""
    held = [v for v in traces._d.values() if type(v) is Trace]
    return {"size": len(traces._d), "traced": len(held), "replays": sum(t.replays for t in held)}
