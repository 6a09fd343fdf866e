"""The graph layer's errors, which definition, lowering and plans share.

:class:`GraphError` (a ``ValueError``) is a definition that cannot be lowered; :class:`BindingError` bindings that
do not match a plan; :class:`UnsupportedGraphError` a descriptor cuDNN refuses while lowering, or a graph no engine
config builds, with every :class:`Attempt` (engine tried, stage, cuDNN status and last-error text).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .. import lib

__all__ = ["GraphError", "BindingError", "Attempt", "UnsupportedGraphError", "unsupported_message"]


class GraphError(ValueError):
    """A graph that cannot be lowered: dangling tensors, shape or dtype mismatches, missing outputs."""


class BindingError(GraphError):
    """Bindings that do not match the plan: a tensor left unbound, a wrong shape/dtype/device/alignment."""


@dataclass(frozen=True)
class Attempt:
    """One engine config tried for a graph: its name and why it was not used (or ``""`` if it was)."""

    name: str
    stage: str  # "lower", "heuristics", "filter", "build", "execute"
    reason: str
    status: str | None = None  # the CUDNN_STATUS_* name when cuDNN refused


_CAUSES = {
    "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH": "arch: no engine for this graph runs on this GPU's architecture",
    "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT": "layout: the tensors' strides (e.g. NCHW vs NHWC) are not supported "
    "for this graph; try channels-last (NHWC) for convolutions",
    "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE": "dtype: a tensor, intermediate or compute data type is not supported "
    "here (float64 has no graph engines; use the legacy ops)",
    "CUDNN_STATUS_NOT_SUPPORTED_SHAPE": "shape: a dimension or alignment is outside what the engines take",
    "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN": "graph pattern: no engine fuses these operations in this order",
    "CUDNN_STATUS_NOT_SUPPORTED_PADDING": "padding: the convolution/resample padding is not supported",
    "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT": "shared memory: the kernels need more than this GPU has",
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER": "driver: the CUDA driver is too old for this cuDNN",
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART": "CUDA runtime: incompatible libcudart",
    "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING": "runtime prerequisite missing (NVRTC for runtime-"
    "compiled engines?)",
    "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE": "a cuDNN sub-library (libcudnn_engines_*) is missing",
}


def unsupported_message(label: str, attempts: Iterable[Attempt]) -> str:
    """The text of :class:`UnsupportedGraphError`: every engine tried (or the descriptor cuDNN refused while
    lowering the graph), then the likely cause."""
    attempts = list(attempts)
    lowered = bool(attempts) and all(a.stage == "lower" for a in attempts)
    if lowered:
        release = ".".join(map(str, lib.version_tuple()))
        lines = [f"cuDNN {release} refused {label} while lowering it (before any engine was asked)"]
    else:
        tried = sum(a.stage not in ("heuristics", "lower") for a in attempts)
        lines = [f"no cuDNN engine supports {label}: {tried} engine config(s) tried"]
    for a in attempts:
        lines.append(f"  {a.name} [{a.stage}]: {a.reason}")
    statuses = [a.status for a in attempts if a.status]
    causes = []
    for s in dict.fromkeys(statuses):
        if s in _CAUSES:
            causes.append(_CAUSES[s])
    if lowered:
        if any(s and s.startswith("CUDNN_STATUS_BAD_PARAM") for s in statuses):
            causes.append("cuDNN rejected a value of the definition (a dim, stride, dtype or parameter)")
        if any(s and s.startswith("CUDNN_STATUS_NOT_SUPPORTED") for s in statuses):
            causes.append(
                "the loaded cuDNN does not offer this operation, mode, parameter or data type in its graph API"
            )
    elif not attempts or all(a.stage == "heuristics" for a in attempts):
        causes.append(
            "heuristics offered no engine for this graph: the pattern, layout (try channels-last "
            "strides) or dtypes are outside what this cuDNN supports on this GPU"
        )
    elif all(a.stage == "filter" for a in attempts):
        causes.append(
            "every engine was rejected by a filter: relax cudnnkit.settings(deterministic=, allow_tf32=, "
            "workspace_limit=) or the build's deny_*/require_* options"
        )
    if causes:
        lines.append("likely cause: " + "; ".join(causes))
    return "\n".join(lines)


class UnsupportedGraphError(GraphError):
    """No engine config passed the filters and built a plan; ``attempts`` lists each one and why."""

    def __init__(self, label: str, attempts: list[Attempt]):
        self.attempts = list(attempts)
        super().__init__(unsupported_message(label, self.attempts))


def status_reason(e: lib.CudnnError) -> str:
    return f"{e.status_name}" + (f": {e.last_error}" if e.last_error else "")


def refusal(e: lib.CudnnError) -> lib.CudnnError:
    """``e`` when it is cuDNN refusing this graph (recorded as an :class:`Attempt`); a missing CUDA driver
    (:class:`~cudnnkit.lib.DriverNotFoundError`) is the machine's state, not the graph's: it is raised as is."""
    if isinstance(e, lib.DriverNotFoundError):
        raise e
    return e
