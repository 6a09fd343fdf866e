"""Autotuning: time the candidate plans of a graph on real bindings and cache the fastest."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ... import lib
from ...runtime.arrays import as_view
from ..errors import Attempt, BindingError, UnsupportedGraphError, status_reason
from ..tensor import PlanGraph
from .cache import plan_cache
from .plans import ExecutionPlan
from .search import bindings_device, build_context, device_env, iter_plans
from .spec import checked_stream

__all__ = ["autotune"]

_log = logging.getLogger("cudnnkit")


def _sync(adapter: Any, device: int) -> None:
    if adapter is not None:
        adapter.synchronize(device)


def _workspace_bytes(workspace: Any) -> int | None:
    """The size of a ``workspace=`` array (None for no workspace or a raw pointer, whose size is unknown)."""
    if workspace is None or (isinstance(workspace, int) and not isinstance(workspace, bool)):
        return None
    return as_view(workspace, "workspace").nbytes


def autotune(
    graph: PlanGraph,
    bindings: Mapping[Any, Any],
    *,
    max_candidates: int = 8,
    warmup: int = 2,
    repeat: int = 10,
    device: int | None = None,
    stream: Any = None,
    workspace: Any = None,
    unchecked: bool = False,
    **options: Any,
) -> ExecutionPlan:
    """Time up to ``max_candidates`` plans (heuristic order, filtered) on ``bindings``; cache the fastest.

    Each candidate runs ``warmup`` times, then ``repeat`` times between two
    device synchronizations (``adapter.synchronize``); its time is the mean
    wall time per run, which is its GPU time whenever the GPU work outlasts
    the ~6 µs host cost of an execute. The returned plan's ``timings`` lists
    ``(name, ms)`` for each candidate, or ``(name, error)`` for one that failed
    to run, or ``(name, reason)`` for one whose workspace need exceeds a
    given ``workspace=`` array (skipped, not run; when no candidate runs,
    :class:`UnsupportedGraphError` lists these reasons). Outputs are
    overwritten many times: inputs must not alias outputs.

    The bindings (raw pointers through the driver unless ``unchecked``),
    ``stream=`` and ``workspace=`` are checked before the graph is lowered.
    """
    for name, v in (("max_candidates", max_candidates), ("warmup", warmup), ("repeat", repeat)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be at least 1, got {max_candidates}")
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup must be >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    if device is None:
        device = bindings_device(bindings)
    ctx = build_context(graph, device, options)
    r = ctx.spec.resolve(bindings, unchecked=unchecked)  # bad bindings before any GPU work
    attempts: list[Attempt] = []
    timings: list[tuple[str, float | str]] = []
    best: tuple[float, ExecutionPlan] | None = None
    given = _workspace_bytes(workspace)
    with device_env(ctx):
        if stream is not None and not (unchecked and type(stream) is int):
            adapter = next((v.adapter for v in r.views if v.adapter is not None), ctx.adapter)
            stream = checked_stream(stream, adapter, ctx.device)  # a bad stream= before anything is built
        tried = 0
        for plan in iter_plans(ctx, attempts):
            tried += 1
            if given is not None and plan.workspace_size > given:
                why = f"needs {plan.workspace_size} bytes of workspace, workspace= has {given}"
                timings.append((plan.name, why))
                attempts.append(Attempt(plan.name, "filter", why))
                if tried >= max_candidates:
                    break
                continue
            try:
                bound = plan.bind(bindings, workspace=workspace, stream=stream, unchecked=unchecked)
                # device-wide synchronization through the context's adapter (the bindings may be raw pointers,
                # with no adapter): the timing must cover the GPU work, not only the host enqueue
                for _ in range(warmup):
                    bound()
                _sync(ctx.adapter, ctx.device)
                t0 = time.perf_counter()
                for _ in range(repeat):
                    bound()
                _sync(ctx.adapter, ctx.device)
                ms = (time.perf_counter() - t0) * 1e3 / repeat
            except (lib.CudnnError, BindingError) as e:
                if isinstance(e, BindingError):
                    raise
                timings.append((plan.name, f"{e.status_name}"))
                attempts.append(Attempt(plan.name, "execute", status_reason(e), e.status_name))
            else:
                timings.append((plan.name, ms))
                if best is None or ms < best[0]:
                    best = (ms, plan)
            if tried >= max_candidates:
                break
    if best is None:
        raise UnsupportedGraphError(ctx.label, attempts)
    plan = best[1]
    plan.timings = timings
    _log.debug("autotuned %s: %s", ctx.label, timings)
    return plan_cache(ctx.device).put(ctx.key, plan)
