"""Execution plans for :class:`~cudnnkit.graph.Graph`: heuristics, engine filters, plan build, execution.

Modules: :mod:`.engines` (engine info, filters, heuristics), :mod:`.spec` (what a plan binds, binding checks),
:mod:`.plans` (:class:`ExecutionPlan`, :class:`BoundPlan`), :mod:`.cache` (the plan cache, serialization,
:func:`load_plan`), :mod:`.search` (the candidates for one graph), :mod:`.builder` (:func:`build`, :func:`execute`)
and :mod:`.autotuner`. A graph is read only through its public accessors (:class:`~cudnnkit.graph.tensor.PlanGraph`).

What :meth:`Graph.build` does, and the cuDNN backend calls it makes:

1. **Lowering** (:meth:`Graph.lower`): finalized tensor, operation and
   ``OPERATIONGRAPH`` descriptors.
2. **Heuristics**: a ``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR`` with the
   operation graph and ``CUDNN_ATTR_ENGINEHEUR_MODE`` from
   ``cudnnkit.settings(heuristic_mode=...)`` (``instant``/``a`` ->
   ``CUDNN_HEUR_MODE_A``, ``b``, ``fallback``); its
   ``CUDNN_ATTR_ENGINEHEUR_RESULTS`` are ``ENGINECFG`` descriptors, best first.
   When no engine of that mode builds, ``CUDNN_HEUR_MODE_FALLBACK`` is asked too.
3. **Engine filters** (:class:`EngineFilter`, a pure function of each engine's
   ``CUDNN_ATTR_ENGINE_NUMERICAL_NOTE``/``BEHAVIOR_NOTE`` and the config's
   ``CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE``):

   * ``settings(deterministic=True)`` rejects ``CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC``;
   * ``settings(allow_tf32=False)`` rejects, for graphs whose convolutions or
     matmuls read float32, ``CUDNN_NUMERICAL_NOTE_TENSOR_CORE`` and
     ``CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS`` (the filter PyTorch applies);
   * ``settings(workspace_limit=n)`` rejects configs (and then plans,
     ``CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE``) needing more than ``n`` bytes;
   * ``deny_numerical=``/``deny_behavior=`` reject any other note (e.g.
     ``deny_behavior={"RUNTIME_COMPILATION"}``), ``require_behavior=`` keeps
     only engines with a note (``{"SUPPORTS_CUDA_GRAPH_NATIVE_API"}``), and
     ``deny_engines=`` rejects engines by name (``"eng0"``) or name prefix.
4. **Support check and plan build**: a ``CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR``
   with ``CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG`` (and the handle), finalized;
   candidates are tried in heuristic order and the first that finalizes wins.
   When none does, :class:`UnsupportedGraphError` lists every engine tried with
   its reason (the filter that rejected it, or cuDNN's status and last error
   text) and names the likely cause (layout, arch, dtype, ...) where the status tells.

Plans are cached per device (:func:`plan_cache`), keyed by :meth:`Graph.key`
(every tensor and operation attribute, alignment, settings, cuDNN version), the
device and the filter options: a new :class:`Graph` with the same definition
hits. :meth:`PlanCache.serialize`/:meth:`PlanCache.deserialize` save and load
plans through ``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``.

Execution (:meth:`ExecutionPlan.execute`) checks the bindings (every
non-virtual tensor bound; shape, strides, dtype, device and pointer alignment;
a raw pointer's device and allocation size through the CUDA driver) and
``stream=`` (a live CUDA stream of the plan's device) before any GPU work
(``unchecked=True`` trusts raw pointers and raw int streams), builds a ``CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`` (``UNIQUE_IDS``,
``DATA_POINTERS``, ``WORKSPACE``) cached by its device pointers, workspace and
by-value scalar bytes (a finalized variant pack cannot take new pointers; a hit
reuses the pack and the host buffers of its scalars), clears the scratch
tensors whose :meth:`Graph.scratch_init` is ``"zero"`` (``cudnnSetTensor`` on
the launch stream) and calls ``cudnnBackendExecute``.
:meth:`ExecutionPlan.bind` returns a :class:`BoundPlan` whose call is only the
handle lookup (the scratch clearing, for graphs that need it) and
``cudnnBackendExecute``: its bindings were checked once, at bind time.

A descriptor cuDNN refuses while a graph is lowered, and a graph no engine
config builds, are :class:`UnsupportedGraphError` (a :class:`GraphError`)
naming the tensor, operation or engines, with cuDNN's status and last-error
text; only a missing CUDA driver (:class:`~cudnnkit.lib.DriverNotFoundError`)
and a feature newer than the loaded cuDNN
(:class:`~cudnnkit.lib.FeatureVersionError`) come out as they are.
"""

from __future__ import annotations

from ..errors import Attempt, BindingError, UnsupportedGraphError, unsupported_message
from .autotuner import autotune
from .builder import build, execute
from .cache import PlanCache, load_plan, plan_cache
from .engines import KNOWN_BAD_ENGINES, EngineFilter, EngineInfo
from .plans import BoundPlan, ExecutionPlan
from .spec import PlanSpec

__all__ = [
    "Attempt",
    "BindingError",
    "BoundPlan",
    "EngineFilter",
    "EngineInfo",
    "ExecutionPlan",
    "KNOWN_BAD_ENGINES",
    "PlanCache",
    "PlanSpec",
    "UnsupportedGraphError",
    "autotune",
    "build",
    "execute",
    "load_plan",
    "plan_cache",
    "unsupported_message",
]
