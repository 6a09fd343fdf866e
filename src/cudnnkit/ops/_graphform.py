"""The graph form of an array-level op: one :class:`~cudnnkit.graph.Graph` per call signature, built and planned
once, then run with pointers.

A primitive's ``graph=`` is ``graph_form(build)``. ``build(call)`` returns a graph whose non-virtual tensors are
the call's arrays exactly as :class:`~cudnnkit.ops._primitive.Call` holds them (dims, strides, dtype), and a map
from each of those tensors to its name in ``call.views``. The first call of a signature (the router's graph key:
the primitive, its resolved keywords, every array's dtype, shape and strides, the device and the settings)
builds the graph, plans it (:meth:`Graph.build`: the settings' heuristics, engine filters and the per-device
plan cache) and keeps ``(plan, names)`` in the op-level graph cache; every call then does a dict lookup, takes a
workspace from the arrays' allocator and runs :meth:`ExecutionPlan.execute_raw` (``cudnnBackendExecute`` with a
variant pack cached per pointer tuple). cuDNN refusing the graph raises
:class:`~cudnnkit.graph.UnsupportedGraphError`, which the router remembers and answers with the legacy call.
A workspace that cannot be allocated sends that one call to the legacy form (:class:`GraphFallback`), logged.
A blending call (``alpha``/``beta`` other than 1/0) runs the graph into a temporary and blends it into the output
with ``cudnnAddTensor``. A ``prepare`` may register steps that run after the graph on that call (:func:`after`: a
legacy epilogue, a dtype conversion into the output); such a call, like one written through a temporary, keeps no
pointer-only express form.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .. import lib
from ..runtime.arrays import is_dense
from ..runtime.cache import LRU, MISSING
from ..runtime.descriptors import tensor_descriptor_of
from ._layout import channels_last_strides, channels_last_view, copy_in

__all__ = [
    "Binder",
    "GraphFallback",
    "channels_last_input",
    "channels_last_output",
    "graph_cache_info",
    "graph_form",
    "after",
    "new_graph",
    "write_through",
]

_log = logging.getLogger("cudnnkit")

#: graph key -> (ExecutionPlan, the call.views name of each of its bindable uids, in order)
_forms: LRU[Any, tuple[Any, tuple[str, ...]]] = LRU("ops.graph_forms", 1024)


class GraphFallback(Exception):
    """Raised by a graph form that cannot run this one call (its workspace could not be allocated): the call goes
    to the primitive's legacy form, and the graph is not remembered as refused."""


def graph_cache_info() -> dict[str, int]:
    """Size, bound, hits and misses of the op-level graph cache."""
    return _forms.info()


def _blends(c: Any) -> list[tuple[str, Any, Any]]:
    """``(output name, alpha ref, beta ref)`` of each output this call blends (``out = alpha * result + beta *
    out``, alpha not 1 or beta not 0): the graph has no blend, so its result goes to a temporary and
    ``cudnnAddTensor`` blends it in."""
    got = []
    for name, (a, b) in c.blends.items():
        if a is not None and (a._obj.value != 1.0 or b._obj.value != 0.0):
            got.append((name, a, b))
    return got


def write_through(c: Any, name: str, strides: Any = None) -> None:
    """Output (or written operand) ``name`` goes through a new temporary of these strides (None: its own), which
    the graph writes and which is copied into the caller's array after it: a ``prepare`` that needs an output in
    another layout calls it, and so does the graph form for a misaligned output."""
    v = c.views[name]
    tmp, c.views[name] = c.launch.empty(v.shape, v.dtype, v.strides if strides is None else strides, name=name)
    c.extra.setdefault("_graph_back", []).append((v, tmp, name))


def after(c: Any, step: Callable[[], None]) -> None:
    """A ``prepare`` registers ``step`` to run after the graph, its blend and its write-through copies, on this call
    (the split convolution's legacy epilogue, bfloat16 pooling's float32 result transformed into the output). A
    call with such a step keeps no pointer-only express form, so every call runs its steps."""
    c.extra.setdefault("_graph_after", []).append(step)


def channels_last_input(c: Any, name: str, why: str) -> Any:
    """Operand ``name`` as the graph gets it channels-last: its own view (described channels-last when it is so up
    to size-1 dims: a C = 1 or 1x1 array), or a channels-last copy (``why``, logged). Sets and returns the view."""
    v = c.views[name]
    cl = channels_last_view(v)
    if cl is None:
        _, cl = copy_in(c.launch, c.arrays[name], v, channels_last_strides(v.shape), name, why)
    c.views[name] = cl
    return cl


def channels_last_output(c: Any, name: str) -> None:
    """Output ``name`` as the graph writes it channels-last: the caller's array (described channels-last when it
    is so up to size-1 dims), or a channels-last temporary copied back into it (:func:`write_through`)."""
    v = c.views[name]
    cl = channels_last_view(v)
    if cl is None:
        write_through(c, name, channels_last_strides(v.shape))
    else:
        c.views[name] = cl


def _execute(c: Any, form: tuple[Any, tuple[str, ...]], ptrs: list[int]) -> None:
    """Run ``form``'s plan with these pointers, a workspace from the arrays' allocator (its out-of-memory sends
    the call to the legacy form: :class:`GraphFallback`)."""
    plan = form[0]
    ws = None
    ws_ptr = 0
    if plan.workspace_size:
        try:
            ws, ws_ptr = c.launch.workspace(plan.workspace_size)
        except MemoryError as e:
            _log.info("graph plan %s: its workspace (%d bytes) could not be allocated (%s); legacy call",
                      plan.name, plan.workspace_size, e)  # fmt: skip
            raise GraphFallback(str(e)) from None
    plan.execute_raw(c.launch.handle.ptr, ptrs, ws_ptr)
    del ws  # the allocator's stream-ordered free follows the queued work


class Binder:
    """What a ``build`` fills in: the graph (:func:`new_graph`) and the view name of each non-virtual tensor it
    makes (``names``, the map ``build`` returns)."""

    def __init__(self, c: Any):
        self.g = new_graph(c)
        self.names: dict[Any, str] = {}

    def tensor(self, name: str, dims: Any, strides: Any, dtype: str) -> Any:
        """A non-virtual input tensor bound to ``call.views[name]``."""
        t = self.g.tensor(dims, strides, dtype, name=name)
        self.names[t] = name
        return t

    def output(self, t: Any, name: str, dtype: str, strides: Any) -> Any:
        """Operation output ``t`` made real, bound to ``call.views[name]``."""
        o = self.g.mark_output(t, dtype, strides=strides)
        self.names[o] = name
        return o

    def done(self) -> tuple[Any, dict[Any, str]]:
        return self.g, self.names


def new_graph(c: Any) -> Any:
    """The :class:`~cudnnkit.graph.Graph` a ``build`` starts from: float32 compute and intermediates, the call's
    pointer alignment."""
    from ..graph import Graph

    return Graph(compute_dtype="float32", intermediate_dtype="float32", alignment=c.extra.get("graph_alignment", 16))


def _fresh_extras(c: Any, given: Mapping[str, Any], names: tuple[str, ...]) -> tuple | None:
    """``(name, shape, dtype, strides)`` of each bound array that is an extra the call made new and returns
    (``c.extra[name]`` is its array: batch norm's saved statistics), when every other bound array is the caller's
    own; None when any is a copy or a temporary (no pointer-only express form then)."""
    fresh = []
    extras = c.extra.get("_extras", ())
    for n in names:
        v = c.views[n]
        if v is given.get(n):
            continue
        if n in extras and given.get(n) is None and v.owner is c.extra.get(n) and is_dense(v.shape, v.strides):
            fresh.append((n, v.shape, v.dtype, v.strides))
            continue
        return None
    return tuple(fresh)


def graph_form(build: Callable[[Any], tuple[Any, Mapping[Any, str]]], prepare: Callable[[Any], None] | None = None
               ) -> Callable[[Any], None]:  # fmt: skip
    """A primitive's graph form from ``build(call) -> (graph, {Tensor: view name})`` (see the module docstring).
    ``prepare(call)``, run first on every call, may replace views in ``call.views`` by copies in a layout the graph
    takes (the convolutions' dense copies), the same for every call of a signature."""

    def run(c: Any) -> None:
        form = c.extra.get("graph_form")  # an express hit: the entry's plan, its arrays as given and aligned
        if form is not None:
            views = c.views
            ptrs = [views[n].ptr for n in form[1]]
            if not any(p % 16 for p in ptrs):
                _execute(c, form, ptrs)
                return
        given = dict(c.views)  # what the call was handed: an express entry may bind only these
        if prepare is not None:
            prepare(c)
        # the graph engines need 16-byte aligned pointers (measured: CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER at
        # execution for a plan built with a smaller CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT): a misaligned input is
        # copied, a misaligned output (or written operand: a given statistic) written through an aligned temporary
        written = c.extra.get("_written", ())
        for name, v in list(c.views.items()):
            if v is None or v.ptr % 16 == 0:
                continue
            if name not in written and c.arrays.get(name) is not None:
                _log.debug("%s is not 16-byte aligned (%#x): copying", name, v.ptr)
                new, c.views[name] = c.launch.empty(v.shape, v.dtype, v.strides, name=name)
                c.launch.copy(new, v.owner if v.adapter is not None else c.arrays[name], name)
                c.extra[f"_aligned_{name}"] = new  # kept until the call ends
            else:
                write_through(c, name)
        back = c.extra.pop("_graph_back", [])
        steps = c.extra.pop("_graph_after", ())
        c.extra["graph_alignment"] = 16
        key = c.extra.get("graph_key")  # prepare's copies and the aligned ones follow from it: no more to key on
        form = _forms.lookup(key) if key is not None else MISSING
        if form is MISSING:
            g, names = build(c)
            plan = g.build(device=c.launch.device)
            by_uid = {t.uid: n for t, n in names.items()}
            form = (plan, tuple(by_uid[u] for u in plan.bindable_uids))
            if key is not None:
                _forms.put(key, form, count_miss=True)
            _log.debug("graph form: plan %s (workspace %d bytes)", plan.name, plan.workspace_size)
        blends = _blends(c)
        fresh = None if back or blends or steps else _fresh_extras(c, given, form[1])
        if fresh is not None:
            # what an express entry keeps: a plan every pointer of which is the caller's own array or an extra
            # the call returns new, in any dense layout (batch norm's saved statistics and its channels-last dz,
            # pooling's index: a hit allocates those anew with the same strides), not prepare's copies or its
            # zero bias
            c.extra["graph_form"] = form
            c.extra["graph_fresh"] = fresh
        for name, _, _ in blends:  # the graph writes a temporary, blended into the output after it
            v = c.views[name]
            tmp, c.views[name] = c.launch.empty(v.shape, v.dtype, v.strides, name=name)
            back.append((v, tmp, name))
        views = c.views
        _execute(c, form, [views[n].ptr for n in form[1]])
        for name, alpha, beta in blends:
            out, tmp = next((v, c.views[name]) for v, _, n in back if n == name)
            lib.cudnnAddTensor(
                c.launch.handle, alpha, tensor_descriptor_of(tmp), tmp.ptr, beta, tensor_descriptor_of(out), out.ptr
            )
        for v, tmp, name in back:
            if name not in {b[0] for b in blends}:
                c.launch.copy(v.owner, tmp, name)
        for step in steps:
            step()

    return run
