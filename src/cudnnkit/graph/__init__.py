"""L1 graph layer over cuDNN's backend API (issue 5).

:class:`Graph` defines tensors and operations (shape and dtype inference,
dangling-tensor checks, a plan key, lowering to finalized backend
descriptors; one module per operation kind in :mod:`cudnnkit.graph.nodes`). :mod:`cudnnkit.graph.plan` turns a graph into an
:class:`ExecutionPlan`: heuristics, engine filters from
:func:`cudnnkit.settings`, plan build, a per-device :func:`plan_cache` with
serialization, execution with cached variant packs, a pre-bound fast path
(:meth:`ExecutionPlan.bind`), CUDA-graph population and autotuning::

    g = Graph()
    x, w = g.tensor_like(x_arr, "x"), g.tensor_like(w_arr, "w")
    y = g.mark_output(g.conv_fprop(x, w, pre_padding=1), "bfloat16")
    plan = g.build()                               # cached per device
    plan.execute({x: x_arr, w: w_arr, y: y_arr})   # or: run = plan.bind({...}); run()
"""

from __future__ import annotations

from .constants import POINTWISE_ARITY
from .errors import Attempt, BindingError, GraphError, UnsupportedGraphError
from .graph import Graph
from .plan import BoundPlan, EngineFilter, EngineInfo, ExecutionPlan, PlanCache, PlanSpec, load_plan, plan_cache
from .tensor import Lowered, NormBackward, NormForward, SdpaBackward, SdpaForward, Tensor

__all__ = [
    "Graph",
    "GraphError",
    "Lowered",
    "Tensor",
    "NormForward",
    "NormBackward",
    "SdpaForward",
    "SdpaBackward",
    "POINTWISE_ARITY",
    "Attempt",
    "BindingError",
    "BoundPlan",
    "EngineFilter",
    "EngineInfo",
    "ExecutionPlan",
    "PlanCache",
    "PlanSpec",
    "UnsupportedGraphError",
    "load_plan",
    "plan_cache",
]
