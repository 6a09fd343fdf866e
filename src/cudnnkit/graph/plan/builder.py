"""Building and running a graph: :func:`build` (the cached plan, built on a miss) and :func:`execute`
(build, or autotune under ``settings(autotune="exhaustive")``, then run)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ...runtime.settings import current_settings
from ..errors import Attempt, UnsupportedGraphError
from ..tensor import PlanGraph
from .autotuner import autotune
from .cache import PlanCache, plan_cache
from .plans import ExecutionPlan
from .search import bindings_device, build_context, device_env, iter_plans, load_pending, plan_key
from .spec import PlanSpec

__all__ = ["build", "execute"]

_log = logging.getLogger("cudnnkit")


def build(graph: PlanGraph, device: int | None = None, **options: Any) -> ExecutionPlan:
    """The plan for ``graph`` on ``device`` (default: the current device), from the cache when it holds one.

    On a miss: loaded serialized plan if one matches, else lowering,
    heuristics (``settings.heuristic_mode``, then FALLBACK), filters and the
    first candidate that finalizes. ``options``: ``deny_numerical``,
    ``deny_behavior``, ``require_behavior`` (note names such as
    ``"RUNTIME_COMPILATION"``), ``deny_engines`` (names such as ``"eng0"``).
    Raises :class:`UnsupportedGraphError` when no engine works.
    """
    key = plan_key(graph, device, options)
    cache = plan_cache(key[1])
    plan = cache.get(key)
    if plan is not None:
        return plan
    return _build_miss(graph, key, cache, options)


def _build_miss(graph: PlanGraph, key: tuple, cache: PlanCache, options: dict[str, Any]) -> ExecutionPlan:
    """:func:`build` after a plan-cache miss for ``key``."""
    ctx = build_context(graph, key[1], options)
    with device_env(ctx):
        plan = load_pending(ctx, cache)
        if plan is None:
            attempts: list[Attempt] = []
            plan = next(iter_plans(ctx, attempts), None)
            if plan is None:
                raise UnsupportedGraphError(ctx.label, attempts)
    _log.debug("built plan %s for %s (workspace %d)", plan.name, ctx.label, plan.workspace_size)
    return cache.put(ctx.key, plan)


def execute(
    graph: PlanGraph,
    bindings: Mapping[Any, Any],
    *,
    stream: Any = None,
    workspace: Any = None,
    unchecked: bool = False,
    **options: Any,
) -> ExecutionPlan:
    """Build (cached) and run ``graph`` on ``bindings``; returns the plan used.

    On a plan-cache miss the bindings are checked against the graph (as
    :meth:`ExecutionPlan.execute` checks them) before anything is built.
    Under ``settings(autotune="exhaustive")`` a miss autotunes on these
    bindings first (outputs are overwritten several times, so inputs must not
    alias outputs). ``unchecked``: see :meth:`ExecutionPlan.execute`. For a
    loop, keep the plan, or better ``plan.bind(...)``: this path recomputes
    the graph key every call.
    """
    device = bindings_device(bindings)
    key = plan_key(graph, device, options)
    cache = plan_cache(key[1])
    plan = cache.get(key)
    if plan is None:
        graph.validate()
        PlanSpec.of(graph, key[1]).resolve(bindings, unchecked=unchecked)  # bad bindings before any build
        if current_settings().autotune == "exhaustive":
            plan = autotune(
                graph, bindings, device=key[1], stream=stream, workspace=workspace, unchecked=unchecked, **options
            )
        else:
            plan = _build_miss(graph, key, cache, options)
    plan.execute(bindings, stream=stream, workspace=workspace, unchecked=unchecked)
    return plan
