"""Kernel caches of dynamic-shape graphs (``Graph(dynamic_shape=True)``): one
``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`` per (graph topology, device), shared by the plans of every graph of
that topology, so that cuDNN may bind a runtime-compiled engine's kernel compiled for one shape to the plan of
another.

The cache is made from the first graph of its topology (``CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH``, then
``cudnnBackendFinalize``) and set as ``CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE`` on each execution plan before
the plan is finalized (:func:`~cudnnkit.graph.plan.search.iter_plans`); finalizes that share a cache take its
lock, one at a time (cudnn-frontend guards its kernel cache the same way). Which kernels bind is cuDNN's
decision; the topology key (:meth:`~cudnnkit.graph.Graph.topology_key`) only decides which plans may offer
theirs to each other. The caches are an LRU of :data:`CAPACITY`, emptied by ``cudnnkit.runtime.clear_caches()``;
a plan keeps the cache it was finalized with alive, and a cache keeps its operation graph and the handle that
graph was lowered with alive (a thread's handles are destroyed when it ends). Plans loaded from serialized JSON
(:func:`~cudnnkit.graph.load_plan`, ``PlanCache.deserialize``) are finalized without one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ...lib.backend import BackendDescriptor
from ...runtime.cache import LRU, MISSING
from ..tensor import PlanGraph

__all__ = ["CAPACITY", "KernelCache", "kernel_cache"]

#: the most kernel caches kept (one per graph topology and device)
CAPACITY = 256


@dataclass(eq=False)
class KernelCache:
    """A finalized ``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR`` (``desc``), the lock its plans' finalizes take, and
    what it must outlive (the operation graph it was made from is kept by ``desc``; ``handle``, the handle that
    graph was lowered with)."""

    desc: BackendDescriptor
    handle: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_CACHES: LRU[tuple, KernelCache] = LRU("graph.kernel_caches", CAPACITY)


def kernel_cache(graph: PlanGraph, device: int, op_graph: BackendDescriptor, handle: Any = None) -> KernelCache | None:
    """The kernel cache for ``graph``'s topology on ``device``, made on first use from ``op_graph`` (the graph's
    lowered ``CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR``, lowered with ``handle``, which the cache keeps alive);
    None unless the graph is a dynamic-shape graph. Two threads making the first one at once both finalize one,
    and both get the one stored first."""
    if not graph.dynamic_shape:
        return None
    key = (graph.topology_key(), device)
    got = _CACHES.lookup(key)
    if got is MISSING:
        desc = BackendDescriptor("CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR")
        desc.set("CUDNN_ATTR_KERNEL_CACHE_OPERATION_GRAPH", op_graph)  # kept alive by the cache (set)
        got = _CACHES.put(key, KernelCache(desc.finalize(), handle))
    return got
