"""Defining cuDNN backend graphs in Python: tensors, operations, shape inference, keys, lowering.

A :class:`Graph` records tensors (dims, strides, dtype, virtual or not) and
operations on them; each operation method returns its output tensor, virtual
(an intermediate) unless :meth:`Graph.mark_output` says otherwise. Shapes and
dtypes of outputs are inferred. :meth:`Graph.key` is a hashable signature of
everything that decides a plan: every tensor and operation attribute, the
graph's data types, the engines it denies (:meth:`Graph.deny_engines`), the
thread's :func:`cudnnkit.settings` and the loaded cuDNN version.
:meth:`Graph.lower` turns the graph into finalized backend descriptors
(tensors, operation nodes, the operation graph) through the reviewed
attribute table; that needs no GPU.

Each operation kind lives in its own module of :mod:`cudnnkit.graph.nodes` (its builder
methods, mixed into :class:`Graph`, and its ``lower()``); heuristics, engine
filters, plan build, the plan cache and execution live in :mod:`cudnnkit.graph.plan`,
which reads a graph only through its public accessors (:meth:`Graph.key`,
:meth:`Graph.validate`, :meth:`Graph.lower`, :meth:`Graph.tensors`,
:meth:`Graph.nodes`, :attr:`Graph.label`, ...). By-value constants made by :meth:`Graph.scalar` (epsilon, attention
scale, mask fill values) are listed by :meth:`Graph.constants` and bound by the
executor; :meth:`Graph.scratch` lists the device scratch tensors a graph needs
(SDPA) and :meth:`Graph.scratch_init` which of them the executor must zero
before every run (SDPA backward's ``dq`` accumulator).

Operations and the backend descriptors they lower to:

==============================  ===================================================================
``pointwise(mode, ...)``        ``CUDNN_BACKEND_POINTWISE_DESCRIPTOR`` + ``OPERATION_POINTWISE``,
                                every ``cudnnPointwiseMode_t``: unary ``y = f(x)``, binary
                                ``y = f(x, b)``, ``BINARY_SELECT`` ``y = t ? x : b``, and the
                                activation backward modes ``dx = f'(x) * dy``
``matmul(a, b)``                ``MATMUL_DESCRIPTOR`` + ``OPERATION_MATMUL``: ``(..., M, K) @ (..., K, N)``
``conv_fprop(x, w)``            ``CONVOLUTION_DESCRIPTOR`` + ``OPERATION_CONVOLUTION_FORWARD``
``conv_dgrad(dy, w, x_dims)``   ... + ``OPERATION_CONVOLUTION_BACKWARD_DATA``
``conv_wgrad(x, dy, w_dims)``   ... + ``OPERATION_CONVOLUTION_BACKWARD_FILTER``
``reduction(x, dims, mode)``    ``REDUCTION_DESCRIPTOR`` + ``OPERATION_REDUCTION``
``resample_forward(x)``         ``RESAMPLE_DESCRIPTOR`` + ``OPERATION_RESAMPLE_FWD``: max pooling (with
                                the index tensor for training), average including/excluding padding
``resample_backward(dy)``       ``RESAMPLE_DESCRIPTOR`` + ``OPERATION_RESAMPLE_BWD`` (max: from the index)
``norm_forward(mode, x, ...)``  ``OPERATION_NORM_FORWARD``: batch, layer, instance, RMS; training
                                (saved mean/inv-variance, running statistics) and inference
``norm_backward(mode, ...)``    ``OPERATION_NORM_BACKWARD``: dx, dscale, dbias
``genstats(x)``                 ``OPERATION_GEN_STATS``: per-channel sum and sum of squares
``rng(dims, seed=...)``         ``RNG_DESCRIPTOR`` + ``OPERATION_RNG``: Bernoulli, uniform, normal
``reshape(x, dims | perm)``     ``OPERATION_RESHAPE``: new dims, or a transpose through strides
``concat(inputs, axis)``        ``OPERATION_CONCATENATE`` (``CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR``)
``sdpa_forward(q, k, v)``       attention forward: the fused-attention composite of matmul, pointwise,
                                reduction (and rng) nodes that cuDNN's engines match, or one
                                ``OPERATION_SDPA_FWD`` (``implementation="unified"``, no mask)
``sdpa_backward(..., stats)``   attention backward: the composite (with reshape transposes and two
                                float32 scratch tensors), or ``OPERATION_SDPA_BWD`` (``"unified"``;
                                cuDNN 9.19's operation graph refuses it)
==============================  ===================================================================
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

from .. import lib
from ..lib.backend import BackendDescriptor
from ..runtime import as_view, canonical, cudnn_dtype, current_settings
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import itemsize as _itemsize
from .checks import INT64_MAX, as_bool, as_int, as_ints, as_real, constant_value, dense_like, is_bool
from .constants import POINTWISE_ARITY
from .errors import Attempt, GraphError, UnsupportedGraphError, status_reason
from .nodes import (
    LOWER,
    ConvNodes,
    MatmulNodes,
    NormNodes,
    PointwiseNodes,
    ReductionNodes,
    ResampleNodes,
    ReshapeNodes,
    RngNodes,
    SdpaFp8Nodes,
    SdpaNodes,
)
from .plan.autotuner import autotune as _autotune
from .plan.builder import build as _build
from .plan.builder import execute as _execute
from .plan.engines import KNOWN_BAD_ENGINES
from .tensor import Lowered, Node, NormBackward, NormForward, SdpaBackward, SdpaForward, Tensor

__all__ = [
    "Graph",
    "Tensor",
    "GraphError",
    "Lowered",
    "POINTWISE_ARITY",
    "NormForward",
    "NormBackward",
    "SdpaForward",
    "SdpaBackward",
]

_graph_ids = itertools.count(1)


def _layout_class(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[bool, ...], tuple[int, ...]]:
    """A tensor's layout without its sizes: which dims are 1 (their strides say nothing), and the non-unit dims
    from the largest stride to the smallest (ties in dim order)."""
    unit = tuple(d == 1 for d in dims)
    return unit, tuple(sorted((i for i in range(len(dims)) if not unit[i]), key=lambda i: -strides[i]))


class Graph(
    PointwiseNodes,
    MatmulNodes,
    ConvNodes,
    ReductionNodes,
    ResampleNodes,
    NormNodes,
    RngNodes,
    ReshapeNodes,
    SdpaNodes,
    SdpaFp8Nodes,
):
    """A cuDNN operation graph under construction.

    ``compute_dtype`` is the math precision of the operations, and
    ``intermediate_dtype`` the data type of virtual tensors (both float32 by
    default); ``alignment`` is the byte alignment promised for every
    non-virtual tensor's pointer (16 by default: the caching allocators of
    CuPy and torch give at least 256).

    ``dynamic_shape=True`` sets ``CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED`` and gives each plan built
    for the graph (not one loaded from serialized JSON) the kernel cache (``CUDNN_BACKEND_KERNEL_CACHE_DESCRIPTOR``, set as
    ``CUDNN_ATTR_EXECUTION_PLAN_KERNEL_CACHE`` before the plan is finalized) shared by every dynamic-shape graph
    of the same topology on the device (:meth:`topology_key`; :mod:`cudnnkit.graph.plan.kernel_cache`), so that
    cuDNN may bind a runtime-compiled engine's kernel (behavior note ``RUNTIME_COMPILATION``) compiled for one
    shape to the plan of another. It is part of the plan-cache key; cuDNN decides which kernels bind, and may
    refuse the flag for a graph (``CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE``: an
    :class:`UnsupportedGraphError` at build). Measure before using it: for cuDNN 9.19's batch-norm graphs on an
    H100 it neither shortened a new shape's build nor kept the steady device time (benchmarks/NOTES.md).
    """

    def __init__(
        self,
        *,
        compute_dtype: str = "float32",
        intermediate_dtype: str = "float32",
        alignment: int = 16,
        name: str = "",
        dynamic_shape: bool = False,
    ):
        alignment = as_int(alignment, "alignment")
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
        self.compute_dtype = canonical(compute_dtype, "compute_dtype")
        self.intermediate_dtype = canonical(intermediate_dtype, "intermediate_dtype")
        self.alignment = alignment
        self.name = name
        self.dynamic_shape = as_bool(dynamic_shape, "dynamic_shape")
        self._id = next(_graph_ids)
        self._tensors: dict[int, Tensor] = {}
        self._nodes: list[Node] = []
        self._uids = itertools.count(1)
        self._constants: dict[int, float | int] = {}  # by-value constants: uid -> value
        # non-virtual tensors the graph needs as scratch memory: uid -> init policy ("zero": cleared before
        # every execution; None: contents irrelevant)
        self._scratch: dict[int, str | None] = {}
        self._described: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # uid -> lowered dims, strides
        self._view_nodes: set[int] = set()  # nodes that read a tensor through its _described view
        self._ragged: dict[int, int] = {}  # uid -> the uid of its ragged offset tensor (packed THD layouts)
        self._denied: tuple[str, ...] = ()  # engines measured wrong for this graph as a whole (deny_engines)

    # ------------------------------------------------------------- tensors

    def tensor(
        self,
        dims: Sequence[int],
        strides: Sequence[int] | None = None,
        dtype: str = "float32",
        *,
        virtual: bool = False,
        by_value: bool = False,
        name: str = "",
    ) -> Tensor:
        """A new tensor; ``strides`` (elements) default to C order. ``by_value`` tensors are host scalars.

        ``dims`` and ``strides`` are sequences of ints (Python or NumPy integers; floats, even integral ones,
        bools and strings are a ``TypeError`` naming the argument), 1 to ``CUDNN_DIM_MAX`` dims, each >= 1,
        and the elements they address must fit in int64 bytes (:class:`GraphError` otherwise).
        A non-virtual ``"bool"`` tensor is bit-packed, as cuDNN reads and writes it: element offset ``o`` (in
        elements, from ``strides``) at bit ``o % 8`` of byte ``o // 8``; it binds a dense uint8 array of at least
        ``ceil(extent / 8)`` bytes (:meth:`~cudnnkit.graph.plan.PlanSpec.resolve`), e.g. ``(N, H, W, C // 8)``
        for a channels-last mask.
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
        label = f"tensor {name or '?'}"
        try:
            dims = as_ints(dims, "dims")
            strides = None if strides is None else as_ints(strides, "strides")
        except GraphError as e:  # a value past int64: say which tensor
            raise GraphError(f"{label}: {e}") from None
        if not 1 <= len(dims) <= lib.CUDNN_DIM_MAX:
            raise GraphError(f"{label}: 1 to {lib.CUDNN_DIM_MAX} dims, got {dims}")
        if any(d < 1 for d in dims):
            raise GraphError(f"{label}: dims must be positive, got {dims}")
        strides = contiguous_strides(dims) if strides is None else strides
        if len(strides) != len(dims) or any(s < 1 for s in strides):
            raise GraphError(f"{label}: strides {strides} must be {len(dims)} positive ints")
        dtype = canonical(dtype, "dtype")
        if (1 + sum((d - 1) * s for d, s in zip(dims, strides))) * _itemsize(dtype) > INT64_MAX:
            raise GraphError(f"{label}: dims {dims} with strides {strides} address more than 2**63 bytes")
        if by_value and (virtual or math.prod(dims) != 1):
            raise GraphError(
                f"{label}: by_value=True needs one non-virtual element, got dims {dims} with virtual={bool(virtual)}"
            )
        t = Tensor(next(self._uids), dims, strides, dtype, bool(virtual), bool(by_value), name, self._id)
        self._tensors[t.uid] = t
        return t

    def tensor_like(self, array: Any, name: str = "") -> Tensor:
        """A non-virtual tensor with an array's dims, strides and dtype (CuPy, torch, CAI or DLPack)."""
        v = as_view(array, name or "array")
        return self.tensor(v.shape, v.strides, v.dtype, name=name)

    def mark_output(self, t: Tensor, dtype: str | None = None, *, strides: Sequence[int] | None = None) -> Tensor:
        """Make an operation's output a real (non-virtual) tensor, optionally of another dtype and with other
        ``strides`` (elements; default: the layout the operation gave it, its first input's)."""
        t = self._own(t, "t")
        if strides is None:
            strides = t.strides
        else:
            strides = as_ints(strides, "strides")
            if len(strides) != len(t.dims) or any(s < 1 for s in strides):
                raise GraphError(f"tensor {t.name or '?'}: strides {strides} must be {len(t.dims)} positive ints")
        new = Tensor(t.uid, t.dims, strides, canonical(dtype) if dtype else t.dtype, False, False, t.name, self._id)
        self._tensors[t.uid] = new
        return new

    def tensors(self) -> list[Tensor]:
        return list(self._tensors.values())

    def set_ragged_offset(self, t: Tensor, offsets: Tensor) -> Tensor:
        """Make ``t`` ragged (packed: cuDNN's THD layout for attention): ``offsets`` is a non-virtual int32 or
        int64 tensor of dims ``(B + 1, 1, ..., 1)`` (``B = t.dims[0]``, ``t``'s rank) holding where each batch
        entry starts, in *elements* of ``t`` from its pointer (not bytes, not tokens: a packed ``(T, H, D)``
        array described ``(B, H, S_max, D)`` with strides ``(S_max * H * D, D, H * D, 1)`` has offsets
        ``cu_seqlens * H * D``), the last one the end (``CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC``; cuDNN 9.19 has
        no multiplier for the composite attention). ``t``'s batch stride is then not used by cuDNN. Returns
        ``t``. A ragged tensor's binding is checked for dtype and device only (its extent is in the offsets, on
        the device). :class:`GraphError` for another offset already set, or a bad ``offsets``."""
        t, offsets = self._own(t, "t"), self._own(offsets, "offsets")
        want = (t.dims[0] + 1,) + (1,) * (t.ndim - 1)
        if offsets.virtual or offsets.by_value or offsets.dtype not in ("int32", "int64") or offsets.dims != want:
            raise GraphError(
                f"the ragged offsets of tensor {t.name or t.uid} must be a non-virtual int32 or int64 tensor of dims "
                f"{want} (B + 1 element offsets), got {offsets.dtype} {offsets.dims}"
                f"{' virtual' if offsets.virtual else ''}"
            )
        if t.by_value:
            raise GraphError(f"tensor {t.name or t.uid} is a by-value constant: it cannot be ragged")
        old = self._ragged.get(t.uid)
        if old is not None and old != offsets.uid:
            raise GraphError(f"tensor {t.name or t.uid} already has ragged offsets (uid {old})")
        self._ragged[t.uid] = offsets.uid
        return t

    def ragged_offsets(self) -> dict[int, int]:
        """``{uid: offsets uid}`` of the ragged tensors (:meth:`set_ragged_offset`)."""
        return dict(self._ragged)

    def is_ragged(self, t: Tensor) -> bool:
        return self._own(t, "t").uid in self._ragged

    def _own(self, t: Any, role: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise TypeError(f"{role} must be a Tensor of this graph, got {type(t).__name__}")
        if t.graph_id != self._id:
            raise GraphError(f"{role} (uid {t.uid}) belongs to another graph")
        return self._tensors[t.uid]

    def _out(self, dims: tuple[int, ...], like: Tensor | None, dtype: str | None, name: str) -> Tensor:
        return self.tensor(
            dims,
            dense_like(dims, like.strides if like is not None else None),
            dtype or self.intermediate_dtype,
            virtual=True,
            name=name,
        )

    def _add(self, kind: str, attrs: dict[str, Any], inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> None:
        self._nodes.append(
            Node(
                kind,
                tuple(sorted(attrs.items())),
                tuple((r, t.uid) for r, t in inputs.items()),
                tuple((r, t.uid) for r, t in outputs.items()),
            )
        )

    # ------------------------------------------------------------- accessors (what plans read)

    def nodes(self) -> tuple[Node, ...]:
        """The operations in the order they were added (read-only :class:`~cudnnkit.graph.tensor.Node` records:
        kind, attributes, input and output uids by role)."""
        return tuple(self._nodes)

    @property
    def label(self) -> str:
        """``graph <name or #id> (<n> ops: <kinds>)``: how errors name this graph."""
        ops = ", ".join(n.kind if n.kind != "pointwise" else n.attr("mode") for n in self._nodes)
        return f"graph {self.name or '#' + str(self._id)} ({len(self._nodes)} ops: {ops})"

    # ------------------------------------------------------------- constants and scratch

    def scalar(self, value: float, dtype: str = "float32", ndim: int = 4, name: str = "") -> Tensor:
        """A by-value constant: a host scalar whose value the graph fixes (part of :meth:`key`).

        The executor passes it by value; :meth:`constants` lists each one's
        uid, value and dtype. Operations that take scalars (epsilon, momentum,
        attention scale, mask fill) make theirs through here when given numbers.

        ``value``: a real number (infinities allowed: masks fill with ``-inf``; NaN refused); an integral one
        that fits ``dtype`` for the integer types, 0/1 (or a bool) for ``"bool"``.
        """
        ndim = as_int(ndim, "ndim", minimum=1, maximum=lib.CUDNN_DIM_MAX)
        dtype = canonical(dtype)
        v = constant_value(value, dtype, name or "value")
        t = self.tensor((1,) * ndim, (1,) * ndim, dtype, by_value=True, name=name or "scalar")
        self._constants[t.uid] = v
        return t

    def constants(self) -> dict[int, tuple[float | int, str]]:
        """``{uid: (value, dtype)}`` of the by-value constants made by :meth:`scalar`."""
        return {uid: (v, self._tensors[uid].dtype) for uid, v in self._constants.items()}

    def scratch(self) -> list[Tensor]:
        """Non-virtual tensors the graph itself needs as device memory; :meth:`scratch_init` says how
        each must be initialized.

        ``sdpa_backward`` has two (the float32 row sums of ``dO * O``, written
        before they are read, and the float32 ``dQ`` accumulator, which the
        matmul accumulates into and so must hold zeros before every run, as
        cudnn-frontend memsets its ``dQ_accum``), as cuDNN's fused attention
        backward requires; ``sdpa_forward(stats=False)`` has one (the
        statistics, written only). The executor allocates them (or the caller
        binds them) and clears the ``"zero"`` ones on the launch stream
        (``cudnnSetTensor``) right before every ``cudnnBackendExecute``.
        """
        return [self._tensors[uid] for uid in sorted(self._scratch)]

    def scratch_init(self) -> dict[int, str | None]:
        """``{uid: policy}`` of the :meth:`scratch` tensors: ``"zero"`` (the executor sets every element
        to 0 before each execution, bound or allocated) or ``None`` (contents in and out irrelevant)."""
        return dict(sorted(self._scratch.items()))

    def _add_scratch(self, t: Tensor, init: str | None) -> None:
        if init not in (None, "zero"):
            raise GraphError(f"scratch init must be None or 'zero', got {init!r}")
        self._scratch[t.uid] = init

    def _scalar_or(
        self, v: Tensor | float | None, role: str, ndim: int, dtype: str = "float32", *, required: bool = False
    ) -> Tensor | None:
        if v is None or isinstance(v, Tensor):
            if v is None:
                if required:
                    raise TypeError(f"{role} must be a number or a Tensor, got None")
                return None
            t = self._own(v, role)
            if math.prod(t.dims) != 1 or t.ndim != ndim:
                raise GraphError(f"{role} must be a one-element tensor of rank {ndim}, got dims {t.dims}")
            return t
        if is_bool(v) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise TypeError(f"{role} must be a number or a Tensor, got {type(v).__name__}")
        return self.scalar(as_real(v, role), dtype, ndim, name=role)

    def _describe_as(self, t: Tensor, dims: tuple[int, ...], strides: tuple[int, ...], role: str) -> None:
        """Lower ``t`` with other dims/strides (a transposed view of the same memory) in this graph."""
        old = self._described.get(t.uid)
        if old is not None and old != (dims, strides):
            raise GraphError(f"{role} (uid {t.uid}) is already described as {old} in this graph")
        self._described[t.uid] = (dims, strides)

    # ------------------------------------------------------------- checks, key, lowering

    def deny_engines(self, *names: str) -> None:
        """Never plan this graph on engines ``names`` (``"eng8"``, with each of its knob settings, as the build's
        ``deny_engines=`` option reads it): for a graph an engine is measured to compute wrong where the node
        alone, which :data:`KNOWN_BAD_ENGINES` keys on, is right (a convolution's fused ``MUL`` of z). Part of
        :meth:`key` and of :meth:`known_bad_engines`; a graph no other engine takes raises
        :class:`~cudnnkit.graph.UnsupportedGraphError` at the build, naming the denial."""
        for n in names:
            if not isinstance(n, str) or not n.startswith("eng"):
                raise ValueError(f"deny_engines takes engine names such as 'eng8', got {n!r}")
        self._denied = tuple(dict.fromkeys((*self._denied, *names)))

    def known_bad_engines(self) -> tuple[str, ...]:
        """Engine names the plan build denies for this graph (:data:`KNOWN_BAD_ENGINES`: measured wrong results;
        then those of :meth:`deny_engines`)."""
        bad: list[str] = []
        for n in self._nodes:
            first = self._tensors[n.inputs[0][1]].dtype if n.inputs else ""
            mode = str(dict(n.attrs).get("mode", ""))
            bad += [e for e in KNOWN_BAD_ENGINES.get((n.kind, first, mode), ()) if e not in bad]
        return (*bad, *(e for e in self._denied if e not in bad))

    def validate(self) -> None:
        """Raise :class:`GraphError` for an empty graph, a graph without outputs, or a dangling tensor."""
        if not self._nodes:
            raise GraphError("the graph has no operations")
        produced = {uid for n in self._nodes for _, uid in n.outputs}
        consumed = {uid for n in self._nodes for _, uid in n.inputs} | set(self._ragged.values())
        for uid, t in self._tensors.items():
            label = f"tensor {t.name or uid} (uid {uid})"
            if uid not in produced and uid not in consumed:
                raise GraphError(f"{label} is dangling: no operation reads or writes it")
            if t.virtual and uid in produced and uid not in consumed:
                raise GraphError(f"{label} is a virtual result nobody reads: mark_output() it or drop the op")
            if t.virtual and uid not in produced:
                raise GraphError(f"{label} is virtual but no operation produces it")
        if not any(not self._tensors[uid].virtual for uid in produced):
            raise GraphError("the graph has no output: mark_output() at least one result")
        for i, n in enumerate(self._nodes):
            for role, uid in n.inputs:
                if uid in self._described and i not in self._view_nodes:
                    t = self._tensors[uid]
                    raise GraphError(
                        f"tensor {t.name or uid} (uid {uid}) is read by {n.kind} ({role}) but an SDPA "
                        f"composite describes it transposed in this graph; use separate graphs"
                    )

    def key(self) -> tuple:
        """Hashable signature of everything that decides a plan (see the module docstring)."""
        tensors = tuple((t.uid, t.dims, t.strides, t.dtype, t.virtual, t.by_value) for t in self._tensors.values())
        nodes = tuple((n.kind, n.attrs, n.inputs, n.outputs) for n in self._nodes)
        extra = (
            tuple(sorted(self._constants.items())),
            tuple(sorted(self._described.items())),
            tuple(sorted(self._scratch.items(), key=lambda kv: kv[0])),
            tuple(sorted(self._ragged.items())),
            self._denied,
        )
        return (
            "cudnnkit.graph/1",
            lib.version(),
            self.compute_dtype,
            self.intermediate_dtype,
            self.alignment,
            tensors,
            nodes,
            extra,
            current_settings().key(),
            self.dynamic_shape,
        )

    def topology_key(self) -> tuple:
        """:meth:`key` with every tensor's dims and strides reduced to its layout: which dims are 1, and the order
        of the others' strides. The same for two graphs that differ only in their (non-unit) sizes: what a
        dynamic-shape graph's kernel cache is shared by (:mod:`cudnnkit.graph.plan.kernel_cache`; cuDNN itself
        decides whether a compiled kernel binds)."""
        k = self.key()
        tensors = tuple((u, _layout_class(d, s), *rest) for u, d, s, *rest in k[5])
        described = tuple((u, _layout_class(d, s)) for u, (d, s) in k[7][1])
        return (*k[:5], tensors, k[6], (k[7][0], described, *k[7][2:]), *k[8:])

    def lower(self, handle: Any = None) -> Lowered:
        """Finalized backend descriptors for every tensor and node, and the operation graph.

        ``handle`` (optional) is set as ``CUDNN_ATTR_OPERATIONGRAPH_HANDLE``;
        cuDNN 9.19 finalizes an operation graph without one, so this works
        without a GPU.

        A descriptor cuDNN refuses (a mode, parameter, dtype or layout the
        loaded cuDNN does not take, e.g. ``reduction(mode="avg")`` in cuDNN
        9.19) raises :class:`~cudnnkit.graph.UnsupportedGraphError` naming
        the tensor or operation, with cuDNN's status and last-error text in
        its ``attempts`` and the :class:`~cudnnkit.lib.CudnnError` as its
        ``__cause__``. :class:`~cudnnkit.lib.DriverNotFoundError` (no CUDA
        driver) propagates unchanged.
        """
        self.validate()
        tds: dict[int, BackendDescriptor] = {}
        offsets = set(self._ragged.values())  # lowered first: a ragged tensor's descriptor points at its offsets'
        for uid, t in sorted(self._tensors.items(), key=lambda kv: kv[0] not in offsets):
            with self._lowering(self._tensor_what, uid):
                tds[uid] = self._lower_tensor(t) if uid not in self._ragged else self._lower_ragged(t, tds)
        ops = []
        for i, n in enumerate(self._nodes):
            with self._lowering(self._node_label, i, n):
                ops.append(LOWER[n.kind](n, tds))
        g = BackendDescriptor("CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR")
        with self._lowering("the operation graph of {} operation(s)".format, len(ops)):
            g.set("CUDNN_ATTR_OPERATIONGRAPH_OPS", [op for op, _ in ops])
            if self.dynamic_shape:
                g.set("CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED", True)
            if handle is not None:
                g.set("CUDNN_ATTR_OPERATIONGRAPH_HANDLE", handle)
            g.finalize()
        return Lowered(tds, [op for op, _ in ops], g, [d for _, d in ops])

    def _tensor_label(self, uid: int) -> str:
        return f"tensor {self._tensors[uid].name or '?'} (uid {uid})"

    def _tensor_what(self, uid: int) -> str:
        t = self._tensors[uid]
        lowered = self._described.get(uid, (t.dims, t.strides))
        return f"{self._tensor_label(uid)} dims {lowered[0]} strides {lowered[1]} {t.dtype}"

    def _node_label(self, i: int, n: Node) -> str:
        a = dict(n.attrs)
        mode = f"(mode={a['mode']!r})" if isinstance(a.get("mode"), str) else ""
        ins = ", ".join(f"{r}={self._tensor_label(u)}" for r, u in n.inputs)
        outs = ", ".join(f"{r}={self._tensor_label(u)}" for r, u in n.outputs)
        return f"operation #{i} {n.kind}{mode}: {ins} -> {outs}"

    @contextlib.contextmanager
    def _lowering(self, what: Any, *args: Any):
        """Turn a cuDNN refusal while lowering into :class:`UnsupportedGraphError` naming ``what(*args)``
        (the tensor or operation); a missing driver (:class:`~cudnnkit.lib.DriverNotFoundError`) stays as is."""
        try:
            yield
        except lib.DriverNotFoundError:
            raise
        except lib.CudnnError as e:
            raise UnsupportedGraphError(
                self.label, [Attempt(what(*args), "lower", status_reason(e), e.status_name)]
            ) from e

    def _lower_ragged(self, t: Tensor, tds: dict[int, BackendDescriptor]) -> BackendDescriptor:
        """A ragged tensor's descriptor: :meth:`_lower_tensor`'s, pointing at its (already lowered) offsets."""
        return self._lower_tensor(t, tds[self._ragged[t.uid]])

    def _lower_tensor(self, t: Tensor, ragged_offsets: BackendDescriptor | None = None) -> BackendDescriptor:
        d = BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
        d.set("CUDNN_ATTR_TENSOR_DATA_TYPE", cudnn_dtype(t.dtype))
        dims, strides = self._described.get(t.uid, (t.dims, t.strides))
        d.set("CUDNN_ATTR_TENSOR_DIMENSIONS", list(dims))
        d.set("CUDNN_ATTR_TENSOR_STRIDES", list(strides))
        d.set("CUDNN_ATTR_TENSOR_UNIQUE_ID", t.uid)
        d.set("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", self.alignment)
        d.set("CUDNN_ATTR_TENSOR_IS_VIRTUAL", t.virtual)
        if t.by_value:
            d.set("CUDNN_ATTR_TENSOR_IS_BY_VALUE", True)
        if ragged_offsets is not None:
            d.set("CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC", ragged_offsets)
        return d.finalize()

    # ------------------------------------------------------------- plans (cudnnkit.graph.plan)

    def build(self, device: int | None = None, **options: Any) -> Any:
        """The cached :class:`~cudnnkit.graph.plan.ExecutionPlan` for this graph on ``device``
        (heuristics, engine filters, ``cudnnBackendFinalize`` of an execution plan): see
        :func:`cudnnkit.graph.plan.build` for ``options``."""
        return _build(self, device, **options)

    def execute(
        self, bindings: Any, *, stream: Any = None, workspace: Any = None, unchecked: bool = False, **options: Any
    ) -> Any:
        """Build (cached) and run on ``bindings`` (Tensor or uid -> array/pointer); returns the plan.
        For loops, keep ``plan.bind(bindings)`` instead: see :func:`cudnnkit.graph.plan.execute`
        (``unchecked=True`` trusts raw pointers and raw int streams)."""
        return _execute(self, bindings, stream=stream, workspace=workspace, unchecked=unchecked, **options)

    def autotune(self, bindings: Any, *, max_candidates: int = 8, **kwargs: Any) -> Any:
        """Time up to ``max_candidates`` plans on ``bindings`` and cache the fastest: see
        :func:`cudnnkit.graph.plan.autotune`."""
        return _autotune(self, bindings, max_candidates=max_candidates, **kwargs)

    def __repr__(self) -> str:
        return f"<Graph {self.name or self._id}: {len(self._tensors)} tensors, {len(self._nodes)} ops>"
