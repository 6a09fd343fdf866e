"""Kernel caches of dynamic-shape graphs (``Graph(dynamic_shape=True)``): one
``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`` per (graph topology, device), shared by the plans of every graph of
that topology, so that a runtime-compiled engine compiles its kernel for the first shape and binds it to the
plans of later ones.

The cache is made from the first graph of its topology (``CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH``, then
``cudnnBackendFinalize``) and set as ``CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE`` on each execution plan before
the plan is finalized (:func:`~cudnnkit.graph.plan.search.iter_plans`). Which kernels bind is cuDNN's
decision; the topology key (:meth:`~cudnnkit.graph.Graph.topology_key`: the graph's key with dims and strides
reduced to rank and stride order) only decides which plans may offer theirs to each other. The caches are an
LRU of :data:`CAPACITY`, emptied by ``cudnnkit.runtime.clear_caches()``; a plan keeps the cache it was
finalized with alive.
"""

from __future__ import annotations

import threading

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime.cache import LRU, MISSING
from ..tensor import PlanGraph

__all__ = ["CAPACITY", "kernel_cache", "entry_count"]

#: the most kernel caches kept (one per graph topology and device)
CAPACITY = 256
_CACHES: LRU[tuple, BackendDescriptor] = LRU("graph.kernel_caches", CAPACITY)
_LOCK = threading.Lock()


def kernel_cache(graph: PlanGraph, device: int, op_graph: BackendDescriptor) -> BackendDescriptor | None:
    """The finalized kernel cache for ``graph``'s topology on ``device`` (made from ``op_graph``, the graph's
    lowered ``CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR``, on first use); None unless the graph is dynamic-shape."""
    if not graph.dynamic_shape:
        return None
    key = (graph.topology_key(), device)
    with _LOCK:
        got = _CACHES.lookup(key)
        if got is MISSING:
            kc = BackendDescriptor("CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR")
            kc.set("CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH", op_graph)  # kept alive by the cache (set)
            got = _CACHES.put(key, kc.finalize())
    return got


def entry_count(cache: BackendDescriptor) -> int | None:
    """``CUDNN_ATTR_KERNEL_CACHE_ENTRY_COUNT`` of a finalized kernel cache (cuDNN 9.27 and newer; None before)."""
    need = lib.since("CUDNN_ATTR_KERNEL_CACHE_ENTRY_COUNT")
    if need is not None and lib.version_tuple() < need:
        return None
    return int(cache.get("CUDNN_ATTR_KERNEL_CACHE_ENTRY_COUNT"))
