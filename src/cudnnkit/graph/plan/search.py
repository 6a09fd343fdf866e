"""The plan search for one graph: its cache key, the build context (filter, settings, device, handle), and the
candidate plans in heuristic order (lower, heuristics, filters, ``cudnnBackendFinalize`` of each execution plan).

:func:`~cudnnkit.graph.plan.builder.build` takes the first candidate, :func:`~cudnnkit.graph.plan.autotuner.autotune`
times several. A graph is read only through its public accessors (:class:`~cudnnkit.graph.tensor.PlanGraph`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime import adapters
from ...runtime.arrays import as_view
from ...runtime.handle import get_handle
from ...runtime.settings import Settings, current_settings
from ..errors import Attempt, refusal, status_reason
from ..tensor import PlanGraph, Tensor
from .cache import PlanCache, check_device, check_device_count, default_device, plan_engine, plan_from_json
from .engines import EngineFilter, EngineInfo, candidates, fp32_math
from .kernel_cache import KernelCache, kernel_cache
from .plans import ExecutionPlan
from .spec import PlanSpec

__all__ = ["BuildContext", "plan_key", "build_context", "device_env", "iter_plans", "load_pending", "bindings_device"]

_log = logging.getLogger("cudnnkit")
_PLANNABLE: set[type] = set()  # graph types found to offer every PlanGraph accessor


def _check_graph(graph: Any) -> None:
    """``TypeError`` unless ``graph`` offers what plans read (:class:`PlanGraph`; checked once per type)."""
    t = type(graph)
    if t not in _PLANNABLE:
        if not isinstance(graph, PlanGraph):
            raise TypeError(f"expected a Graph, got {t.__name__}")
        _PLANNABLE.add(t)


@dataclass
class BuildContext:
    graph: PlanGraph
    device: int
    flt: EngineFilter
    key: tuple
    settings: Settings
    label: str
    spec: PlanSpec
    adapter: Any = None
    handle: Any = None


_OPTIONS = ("deny_numerical", "deny_behavior", "require_behavior", "deny_engines")
_NO_OPTIONS_KEY = EngineFilter().options_key()


def plan_key(graph: PlanGraph, device: int | None, options: dict[str, Any]) -> tuple:
    """The plan-cache key: (graph key, device, filter options), without validating the graph (a hit skips that)."""
    _check_graph(graph)
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"unknown build option(s) {sorted(unknown)}; known: {', '.join(_OPTIONS)}")
    opts = EngineFilter.make(Settings(), **options).options_key() if options else _NO_OPTIONS_KEY
    d = check_device(device)
    gkey = graph.key()
    if d is None:
        try:
            d = default_device()
        except RuntimeError:
            graph.validate()  # a graph's own errors come before the machine's (no plan of it can be cached)
            raise
    return (gkey, d, opts)


def build_context(graph: PlanGraph, device: int | None, options: dict[str, Any]) -> BuildContext:
    key = plan_key(graph, device, options)
    bad = graph.known_bad_engines()  # engines measured to compute this graph wrong (part of the graph's key)
    if bad:
        options = {**options, "deny_engines": (*options.get("deny_engines", ()), *bad)}
    graph.validate()
    s = current_settings()
    flt = EngineFilter.make(s, fp32_math=fp32_math(graph), **options)
    d = key[1]
    return BuildContext(graph, d, flt, key, s, graph.label, PlanSpec.of(graph, d))


def device_env(ctx: BuildContext):
    ctx.adapter = adapters.first_available()
    if ctx.adapter is None:
        raise RuntimeError("building a plan needs a cuDNN handle, which needs CuPy or torch to select the device")
    check_device_count(ctx.adapter, ctx.device)
    ctx.handle = get_handle(ctx.device, ctx.adapter.current_stream(ctx.device), ctx.adapter)
    return ctx.adapter.device_guard(ctx.device)


def _finalize_plan(cfg: BackendDescriptor, handle: Any, kc: KernelCache | None = None) -> BackendDescriptor:
    p = BackendDescriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
    p.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", handle.ptr)
    p.set("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", cfg)
    if kc is None:
        return p.finalize()
    # a dynamic-shape graph's kernel cache: a kernel compiled for another shape may bind (one finalize at a time)
    p.set("CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE", kc.desc)
    with kc.lock:
        return p.finalize()


def _plan_from(
    ctx: BuildContext, desc: BackendDescriptor, info: EngineInfo | None, keep: Any, attempts: list[Attempt]
) -> ExecutionPlan:
    # the plan keeps the handle it was finalized with (the building thread's): a thread's handles are destroyed
    # when it ends, and a cached plan may outlive that thread
    return ExecutionPlan(desc, ctx.spec, key=ctx.key, engine=info, keep=(keep, ctx.handle), attempts=attempts)


def iter_plans(ctx: BuildContext, attempts: list[Attempt]):
    """Lower the graph and yield each candidate that finalizes into a plan (filtered in order).

    A descriptor cuDNN refuses while lowering raises :class:`UnsupportedGraphError` (:meth:`Graph.lower`);
    an engine config it refuses is an :class:`Attempt`."""
    low = ctx.graph.lower(ctx.handle.ptr)
    try:
        kc = kernel_cache(ctx.graph, ctx.device, low.op_graph, ctx.handle)
    except lib.CudnnError as e:
        refusal(e)
        attempts.append(Attempt("kernel cache", "build", status_reason(e), e.status_name))
        return
    for cfg, info in candidates(low, ctx.flt, ctx.settings.heuristic_mode, attempts):
        try:
            desc = _finalize_plan(cfg, ctx.handle, kc)
            plan = _plan_from(ctx, desc, info, (low, cfg, kc), attempts)
        except lib.CudnnError as e:
            refusal(e)
            attempts.append(Attempt(info.name, "build", status_reason(e), e.status_name))
            continue
        why = ctx.flt.reject(info, plan.workspace_size)
        if why:
            attempts.append(Attempt(info.name, "filter", why))
            continue
        yield plan


def load_pending(ctx: BuildContext, cache: PlanCache) -> ExecutionPlan | None:
    entry = cache.pop_pending(ctx.key)
    if entry is None:
        return None
    try:
        desc = plan_from_json(entry["plan"], ctx.handle)
    except lib.CudnnError as e:
        _log.debug("serialized plan for %s refused (%s); building from heuristics", ctx.label, e)
        return None
    return _plan_from(ctx, desc, plan_engine(desc), None, [])


def bindings_device(bindings: Mapping[Any, Any]) -> int | None:
    if not isinstance(bindings, Mapping):
        return None  # PlanSpec.resolve says what bindings must be
    for k, v in bindings.items():
        if isinstance(v, (int, float, bool)):
            continue
        t = k if isinstance(k, Tensor) else None
        if t is not None and t.by_value:
            continue
        try:
            return as_view(v, "binding").device
        except (TypeError, ValueError):
            return None
    return None
