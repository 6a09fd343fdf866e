"""The values of a graph: :class:`Tensor`, the recorded operation :class:`Node`, the named results of the
composite builders (norm, SDPA), :class:`Lowered` (a graph's finalized backend descriptors) and
:class:`PlanGraph`, what plans read of a graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..lib.backend import BackendDescriptor

__all__ = ["Tensor", "Node", "NormForward", "NormBackward", "SdpaForward", "SdpaBackward", "Lowered", "PlanGraph"]


@dataclass(frozen=True)
class Tensor:
    """A tensor of a :class:`Graph` (read-only; made by ``Graph.tensor`` or an operation)."""

    uid: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    virtual: bool
    by_value: bool
    name: str
    graph_id: int = field(repr=False, compare=False)

    @property
    def ndim(self) -> int:
        return len(self.dims)


@dataclass(frozen=True)
class Node:
    """One recorded operation: its kind, attributes (sorted name/value pairs) and tensors by role (uids)."""

    kind: str  # "pointwise", "matmul", "conv_fprop", "conv_dgrad", "conv_wgrad", "reduction", "resample_fwd",
    # "resample_bwd", "norm_fwd", "norm_bwd", "genstats", "rng", "reshape", "concat", "sdpa_fwd", "sdpa_bwd"
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[str, int], ...]  # (role, uid)
    outputs: tuple[tuple[str, int], ...]

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]


class NormForward(NamedTuple):
    """Outputs of :meth:`Graph.norm_forward` (``None`` where the mode or phase has none)."""

    y: Tensor
    mean: Tensor | None
    inv_variance: Tensor | None
    running_mean: Tensor | None
    running_var: Tensor | None


class NormBackward(NamedTuple):
    """Outputs of :meth:`Graph.norm_backward`."""

    dx: Tensor
    dscale: Tensor
    dbias: Tensor | None


class SdpaForward(NamedTuple):
    """Outputs of :meth:`Graph.sdpa_forward`: ``o`` and the softmax log-sum-exp ``stats`` (or ``None``)."""

    o: Tensor
    stats: Tensor | None


class SdpaBackward(NamedTuple):
    """Outputs of :meth:`Graph.sdpa_backward`."""

    dq: Tensor
    dk: Tensor
    dv: Tensor


@dataclass
class Lowered:
    """The finalized backend descriptors of a graph (kept alive together)."""

    tensors: dict[int, BackendDescriptor]
    ops: list[BackendDescriptor]
    op_graph: BackendDescriptor
    op_params: list[BackendDescriptor | None]  # the op's parameter descriptor (pointwise, matmul, ...), if any


@runtime_checkable
class PlanGraph(Protocol):
    """What the plan layer (:mod:`cudnnkit.graph.plan`) reads of a graph: the public accessors of
    :class:`~cudnnkit.graph.Graph`, and nothing else."""

    alignment: int
    dynamic_shape: bool

    @property
    def label(self) -> str: ...

    def key(self) -> tuple: ...

    def topology_key(self) -> tuple: ...

    def validate(self) -> None: ...

    def lower(self, handle: Any = None) -> Lowered: ...

    def tensors(self) -> list[Tensor]: ...

    def nodes(self) -> tuple[Node, ...]: ...

    def constants(self) -> dict[int, tuple[float | int, str]]: ...

    def scratch_init(self) -> dict[int, str | None]: ...

    def known_bad_engines(self) -> tuple[str, ...]: ...
