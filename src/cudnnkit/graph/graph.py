"""Defining cuDNN backend graphs in Python: tensors, operations, shape inference, keys, lowering.

A :class:`Graph` records tensors (dims, strides, dtype, virtual or not) and
operations on them; each operation method returns its output tensor, virtual
(an intermediate) unless :meth:`Graph.mark_output` says otherwise. Shapes and
dtypes of outputs are inferred. :meth:`Graph.key` is a hashable signature of
everything that decides a plan: every tensor and operation attribute, the
graph's data types, the thread's :func:`cudnnkit.settings` and the loaded
cuDNN version. :meth:`Graph.lower` turns the graph into finalized backend
descriptors (tensors, operation nodes, the operation graph) through the
reviewed attribute table; that needs no GPU.

Not here yet (issue 5, next): heuristics and engine filters, plan build and
the plan cache, execution with variant packs, CUDA-graph population,
autotuning, and the remaining node kinds (resample, norm, genstats, rng,
reshape, concat, SDPA).

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
==============================  ===================================================================
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import lib
from ..lib.backend import BackendDescriptor
from ..runtime import as_view, canonical, cudnn_dtype, current_settings
from ..runtime.arrays import contiguous_strides
from ..runtime.shapes import expand

__all__ = ["Graph", "Tensor", "GraphError", "POINTWISE_ARITY"]


class GraphError(ValueError):
    """A graph that cannot be lowered: dangling tensors, shape or dtype mismatches, missing outputs."""


# ----------------------------------------------------------------- pointwise modes

_PW = lib.cudnnPointwiseMode_t
#: the inputs each pointwise mode takes: "x", "x,b", "x,b,t" (select) or "dy,x" (activation backward)
POINTWISE_ARITY: dict[str, str] = {}
for _m in _PW:
    _n = _m.name.removeprefix("CUDNN_POINTWISE_")
    if _n.endswith("_BWD"):
        POINTWISE_ARITY[_n] = "dy,x"
    elif _n == "BINARY_SELECT":
        POINTWISE_ARITY[_n] = "x,b,t"
    elif _n in ("ADD", "ADD_SQUARE", "DIV", "MAX", "MIN", "MOD", "MUL", "POW", "SUB", "ATAN2",
                "LOGICAL_AND", "LOGICAL_OR") or _n.startswith("CMP_"):
        POINTWISE_ARITY[_n] = "x,b"
    else:
        POINTWISE_ARITY[_n] = "x"
del _m, _n

# keyword -> (attribute, modes it applies to)
_PW_PARAMS = {
    "relu_lower_clip": ("CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP", ("RELU_FWD", "RELU_BWD")),
    "relu_upper_clip": ("CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP", ("RELU_FWD", "RELU_BWD")),
    "relu_lower_clip_slope": ("CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE", ("RELU_FWD", "RELU_BWD")),
    "elu_alpha": ("CUDNN_ATTR_POINTWISE_ELU_ALPHA", ("ELU_FWD", "ELU_BWD")),
    "softplus_beta": ("CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA", ("SOFTPLUS_FWD", "SOFTPLUS_BWD")),
    "swish_beta": ("CUDNN_ATTR_POINTWISE_SWISH_BETA", ("SWISH_FWD", "SWISH_BWD")),
    "axis": ("CUDNN_ATTR_POINTWISE_AXIS", ("GEN_INDEX",)),
}

_REDUCTIONS = {m.name.removeprefix("CUDNN_REDUCE_TENSOR_").lower(): m for m in lib.cudnnReduceTensorOp_t}


# ----------------------------------------------------------------- tensors and nodes


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
class _Node:
    kind: str  # "pointwise", "matmul", "conv_fprop", "conv_dgrad", "conv_wgrad", "reduction"
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[tuple[str, int], ...]  # (role, uid)
    outputs: tuple[tuple[str, int], ...]

    def attr(self, name: str) -> Any:
        return dict(self.attrs)[name]


def _dense_like(dims: tuple[int, ...], like: tuple[int, ...] | None) -> tuple[int, ...]:
    """Packed strides for ``dims`` in the axis order of ``like``'s strides (C order without one)."""
    if like is None or len(like) != len(dims):
        return contiguous_strides(dims)
    order = sorted(range(len(dims)), key=lambda i: (-like[i], i))
    strides = [0] * len(dims)
    acc = 1
    for i in reversed(order):
        strides[i] = acc
        acc *= max(dims[i], 1)
    return tuple(strides)


def _broadcast(dims: list[tuple[int, ...]], names: list[str]) -> tuple[int, ...]:
    nd = len(dims[0])
    for d, n in zip(dims[1:], names[1:]):
        if len(d) != nd:
            raise GraphError(f"{n} has {len(d)} dims but {names[0]} has {nd}; pointwise inputs have one rank")
    out = []
    for i in range(nd):
        sizes = {d[i] for d in dims} - {1}
        if len(sizes) > 1:
            raise GraphError(f"dim {i} cannot broadcast: {dict(zip(names, (d[i] for d in dims)))}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


_graph_ids = itertools.count(1)


class Graph:
    """A cuDNN operation graph under construction.

    ``compute_dtype`` is the math precision of the operations, and
    ``intermediate_dtype`` the data type of virtual tensors (both float32 by
    default); ``alignment`` is the byte alignment promised for every
    non-virtual tensor's pointer (16 by default: the caching allocators of
    CuPy and torch give at least 256).
    """

    def __init__(self, *, compute_dtype: str = "float32", intermediate_dtype: str = "float32", alignment: int = 16,
                 name: str = ""):
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.compute_dtype = canonical(compute_dtype)
        self.intermediate_dtype = canonical(intermediate_dtype)
        self.alignment = int(alignment)
        self.name = name
        self._id = next(_graph_ids)
        self._tensors: dict[int, Tensor] = {}
        self._nodes: list[_Node] = []
        self._uids = itertools.count(1)

    # ------------------------------------------------------------- tensors

    def tensor(self, dims: Sequence[int], strides: Sequence[int] | None = None, dtype: str = "float32", *,
               virtual: bool = False, by_value: bool = False, name: str = "") -> Tensor:
        """A new tensor; ``strides`` (elements) default to C order. ``by_value`` tensors are host scalars."""
        dims = tuple(int(d) for d in dims)
        if not 1 <= len(dims) <= lib.CUDNN_DIM_MAX:
            raise GraphError(f"tensor {name or '?'}: 1 to {lib.CUDNN_DIM_MAX} dims, got {dims}")
        if any(d < 1 for d in dims):
            raise GraphError(f"tensor {name or '?'}: dims must be positive, got {dims}")
        strides = contiguous_strides(dims) if strides is None else tuple(int(s) for s in strides)
        if len(strides) != len(dims) or any(s < 1 for s in strides):
            raise GraphError(f"tensor {name or '?'}: strides {strides} must be {len(dims)} positive ints")
        if by_value and (virtual or math.prod(dims) != 1):
            raise GraphError(f"tensor {name or '?'}: a by-value tensor is one non-virtual element")
        t = Tensor(next(self._uids), dims, strides, canonical(dtype), bool(virtual), bool(by_value), name, self._id)
        self._tensors[t.uid] = t
        return t

    def tensor_like(self, array: Any, name: str = "") -> Tensor:
        """A non-virtual tensor with an array's dims, strides and dtype (CuPy, torch, CAI or DLPack)."""
        v = as_view(array, name or "array")
        return self.tensor(v.shape, v.strides, v.dtype, name=name)

    def mark_output(self, t: Tensor, dtype: str | None = None) -> Tensor:
        """Make an operation's output a real (non-virtual) tensor, optionally of another dtype."""
        t = self._own(t, "t")
        new = Tensor(t.uid, t.dims, t.strides, canonical(dtype) if dtype else t.dtype, False, False, t.name,
                     self._id)
        self._tensors[t.uid] = new
        return new

    def tensors(self) -> list[Tensor]:
        return list(self._tensors.values())

    def _own(self, t: Any, role: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise TypeError(f"{role} must be a Tensor of this graph, got {type(t).__name__}")
        if t.graph_id != self._id:
            raise GraphError(f"{role} (uid {t.uid}) belongs to another graph")
        return self._tensors[t.uid]

    def _out(self, dims: tuple[int, ...], like: Tensor | None, dtype: str | None, name: str) -> Tensor:
        return self.tensor(dims, _dense_like(dims, like.strides if like is not None else None),
                           dtype or self.intermediate_dtype, virtual=True, name=name)

    def _add(self, kind: str, attrs: dict[str, Any], inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> None:
        self._nodes.append(_Node(kind, tuple(sorted(attrs.items())), tuple((r, t.uid) for r, t in inputs.items()),
                                 tuple((r, t.uid) for r, t in outputs.items())))

    # ------------------------------------------------------------- operations

    def pointwise(self, mode: str, x: Tensor, b: Tensor | None = None, t: Tensor | None = None, *,
                  dy: Tensor | None = None, compute_dtype: str | None = None, dtype: str | None = None,
                  alpha1: float = 1.0, alpha2: float = 1.0, name: str = "", **params: float) -> Tensor:
        """One ``cudnnPointwiseMode_t`` (by name, e.g. ``"ADD"``, ``"RELU_FWD"``, ``"GELU_BWD"``).

        Unary modes take ``x``; binary ones ``x`` and ``b``; ``BINARY_SELECT``
        ``x``, ``b`` and the condition ``t``; the ``*_BWD`` modes ``x`` and
        ``dy`` and return ``dx``. Inputs broadcast (same rank, dims equal or 1).
        Mode parameters as keywords: ``relu_lower_clip``, ``relu_upper_clip``,
        ``relu_lower_clip_slope``, ``elu_alpha``, ``softplus_beta``,
        ``swish_beta``, ``axis`` (``GEN_INDEX``).
        """
        key = str(mode).upper().removeprefix("CUDNN_POINTWISE_")
        if key not in POINTWISE_ARITY:
            raise GraphError(f"unknown pointwise mode {mode!r}; one of {sorted(POINTWISE_ARITY)}")
        arity = POINTWISE_ARITY[key]
        given = {"x": x, "b": b, "t": t, "dy": dy}
        needed = arity.split(",")
        for role, tensor in given.items():
            if role in needed and tensor is None:
                raise GraphError(f"pointwise {key} needs {', '.join(needed)}; {role} is missing")
            if role not in needed and tensor is not None:
                raise GraphError(f"pointwise {key} takes {', '.join(needed)}, not {role}")
        ins = {r: self._own(given[r], r) for r in needed}
        for p in params:
            if p not in _PW_PARAMS:
                raise TypeError(f"unknown pointwise parameter {p!r}; one of {sorted(_PW_PARAMS)}")
            if key not in _PW_PARAMS[p][1]:
                raise GraphError(f"{p} applies to {_PW_PARAMS[p][1]}, not {key}")
        if key == "GEN_INDEX" and "axis" not in params:
            raise GraphError("pointwise GEN_INDEX needs axis= (the dim whose index it generates)")
        order = ["dy", "x"] if arity == "dy,x" else needed
        dims = _broadcast([ins[r].dims for r in order], order)
        out = self._out(dims, ins["x"], dtype, name or key.lower())
        attrs = {"mode": key, "compute_dtype": canonical(compute_dtype or self.compute_dtype),
                 "alpha1": float(alpha1), "alpha2": float(alpha2),
                 **{p: (int(v) if p == "axis" else float(v)) for p, v in params.items()}}
        self._add("pointwise", attrs, ins, {"dx" if arity == "dy,x" else "y": out})
        return out

    def matmul(self, a: Tensor, b: Tensor, *, compute_dtype: str | None = None, dtype: str | None = None,
               name: str = "") -> Tensor:
        """``c = a @ b`` over the last two dims, batch dims broadcast: ``(..., M, K) @ (..., K, N)``."""
        a, b = self._own(a, "a"), self._own(b, "b")
        if a.ndim < 2 or a.ndim != b.ndim:
            raise GraphError(f"matmul needs a and b of one rank >= 2, got {a.dims} and {b.dims}")
        if a.dims[-1] != b.dims[-2]:
            raise GraphError(f"matmul: a is (..., {a.dims[-2]}, {a.dims[-1]}) but b is (..., {b.dims[-2]}, "
                             f"{b.dims[-1]}); K must agree")
        batch = _broadcast([a.dims[:-2], b.dims[:-2]], ["a", "b"]) if a.ndim > 2 else ()
        out = self._out((*batch, a.dims[-2], b.dims[-1]), None, dtype, name or "matmul")
        self._add("matmul", {"compute_dtype": canonical(compute_dtype or self.compute_dtype)},
                  {"a": a, "b": b}, {"c": out})
        return out

    def _conv_attrs(self, nsp: int, stride, pre_padding, post_padding, dilation, mode: str,
                    compute_dtype: str | None) -> dict[str, Any]:
        if mode not in ("cross_correlation", "convolution"):
            raise GraphError(f"mode must be 'cross_correlation' or 'convolution', got {mode!r}")
        post = pre_padding if post_padding is None else post_padding
        return {
            "stride": expand(stride, nsp, "stride", 1),
            "pre_padding": expand(pre_padding, nsp, "pre_padding", 0),
            "post_padding": expand(post, nsp, "post_padding", 0),
            "dilation": expand(dilation, nsp, "dilation", 1),
            "mode": mode,
            "compute_dtype": canonical(compute_dtype or self.compute_dtype),
        }

    @staticmethod
    def _conv_out(x_dims, w_dims, attrs) -> tuple[int, ...]:
        n, c = x_dims[:2]
        k, cg = w_dims[:2]
        if c % cg:
            raise GraphError(f"x has {c} channels, not a multiple of w's {cg} per group")
        if k % (c // cg):
            raise GraphError(f"w's {k} output channels do not divide into {c // cg} groups")
        out = [n, k]
        for i, (xi, ki) in enumerate(zip(x_dims[2:], w_dims[2:])):
            eff = attrs["dilation"][i] * (ki - 1) + 1
            o = (xi + attrs["pre_padding"][i] + attrs["post_padding"][i] - eff) // attrs["stride"][i] + 1
            if o < 1:
                raise GraphError(f"spatial dim {i}: input {xi} with its padding is smaller than the kernel {eff}")
            out.append(o)
        return tuple(out)

    def conv_fprop(self, x: Tensor, w: Tensor, *, stride=1, pre_padding=0, post_padding=None, dilation=1,
                   mode: str = "cross_correlation", compute_dtype: str | None = None, dtype: str | None = None,
                   name: str = "") -> Tensor:
        """Convolution forward: ``x`` ``(N, C, *spatial)``, ``w`` ``(K, C/groups, *kernel)`` -> ``y`` ``(N, K, *)``.

        Padding is per spatial dim before and after (``post_padding`` defaults to ``pre_padding``).
        """
        x, w = self._own(x, "x"), self._own(w, "w")
        if x.ndim < 3 or w.ndim != x.ndim:
            raise GraphError(f"conv_fprop needs x and w of one rank >= 3, got {x.dims} and {w.dims}")
        attrs = self._conv_attrs(x.ndim - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype)
        y = self._out(self._conv_out(x.dims, w.dims, attrs), x, dtype, name or "conv_fprop")
        self._add("conv_fprop", attrs, {"x": x, "w": w}, {"y": y})
        return y

    def conv_dgrad(self, dy: Tensor, w: Tensor, x_dims: Sequence[int], *, stride=1, pre_padding=0,
                   post_padding=None, dilation=1, mode: str = "cross_correlation", compute_dtype: str | None = None,
                   dtype: str | None = None, name: str = "") -> Tensor:
        """Convolution backward data: ``dx`` of dims ``x_dims`` from ``dy`` and ``w``."""
        dy, w = self._own(dy, "dy"), self._own(w, "w")
        x_dims = tuple(int(d) for d in x_dims)
        attrs = self._conv_attrs(len(x_dims) - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype)
        if self._conv_out(x_dims, w.dims, attrs) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the forward output of x {x_dims} and w {w.dims} "
                             f"({self._conv_out(x_dims, w.dims, attrs)})")
        dx = self._out(x_dims, dy, dtype, name or "conv_dgrad")
        self._add("conv_dgrad", attrs, {"dy": dy, "w": w}, {"dx": dx})
        return dx

    def conv_wgrad(self, x: Tensor, dy: Tensor, w_dims: Sequence[int], *, stride=1, pre_padding=0,
                   post_padding=None, dilation=1, mode: str = "cross_correlation", compute_dtype: str | None = None,
                   dtype: str | None = None, name: str = "") -> Tensor:
        """Convolution backward filter: ``dw`` of dims ``w_dims`` from ``x`` and ``dy``."""
        x, dy = self._own(x, "x"), self._own(dy, "dy")
        w_dims = tuple(int(d) for d in w_dims)
        attrs = self._conv_attrs(x.ndim - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype)
        if self._conv_out(x.dims, w_dims, attrs) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the forward output of x {x.dims} and w {w_dims}")
        dw = self._out(w_dims, x, dtype, name or "conv_wgrad")
        self._add("conv_wgrad", attrs, {"x": x, "dy": dy}, {"dw": dw})
        return dw

    def reduction(self, x: Tensor, out_dims: Sequence[int], *, mode: str = "add", compute_dtype: str | None = None,
                  dtype: str | None = None, name: str = "") -> Tensor:
        """Reduce ``x`` to ``out_dims`` (same rank; each dim equal to x's or 1) with ``mode``:
        add, mul, min, max, amax, avg, norm1, norm2, mul_no_zeros."""
        x = self._own(x, "x")
        if mode not in _REDUCTIONS:
            raise GraphError(f"reduction mode must be one of {sorted(_REDUCTIONS)}, got {mode!r}")
        out_dims = tuple(int(d) for d in out_dims)
        if len(out_dims) != x.ndim or any(o not in (1, d) for o, d in zip(out_dims, x.dims)):
            raise GraphError(f"reduction of {x.dims} to {out_dims}: each output dim is x's or 1")
        y = self._out(out_dims, x, dtype, name or f"reduce_{mode}")
        self._add("reduction", {"mode": mode, "compute_dtype": canonical(compute_dtype or self.compute_dtype)},
                  {"x": x}, {"y": y})
        return y

    # ------------------------------------------------------------- checks, key, lowering

    def validate(self) -> None:
        """Raise :class:`GraphError` for an empty graph, a graph without outputs, or a dangling tensor."""
        if not self._nodes:
            raise GraphError("the graph has no operations")
        produced = {uid for n in self._nodes for _, uid in n.outputs}
        consumed = {uid for n in self._nodes for _, uid in n.inputs}
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

    def key(self) -> tuple:
        """Hashable signature of everything that decides a plan (see the module docstring)."""
        tensors = tuple((t.uid, t.dims, t.strides, t.dtype, t.virtual, t.by_value) for t in self._tensors.values())
        nodes = tuple((n.kind, n.attrs, n.inputs, n.outputs) for n in self._nodes)
        return ("cudnnkit.graph/1", lib.version(), self.compute_dtype, self.intermediate_dtype, self.alignment,
                tensors, nodes, current_settings().key())

    def lower(self, handle: Any = None) -> Lowered:
        """Finalized backend descriptors for every tensor and node, and the operation graph.

        ``handle`` (optional) is set as ``CUDNN_ATTR_OPERATIONGRAPH_HANDLE``;
        cuDNN 9.19 finalizes an operation graph without one, so this works
        without a GPU.
        """
        self.validate()
        tds = {uid: self._lower_tensor(t) for uid, t in self._tensors.items()}
        ops = [self._lower_node(n, tds) for n in self._nodes]
        g = BackendDescriptor("CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR")
        g.set("CUDNN_ATTR_OPERATIONGRAPH_OPS", [op for op, _ in ops])
        if handle is not None:
            g.set("CUDNN_ATTR_OPERATIONGRAPH_HANDLE", handle)
        g.finalize()
        return Lowered(tds, [op for op, _ in ops], g, [d for _, d in ops])

    def _lower_tensor(self, t: Tensor) -> BackendDescriptor:
        d = BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
        d.set("CUDNN_ATTR_TENSOR_DATA_TYPE", cudnn_dtype(t.dtype))
        d.set("CUDNN_ATTR_TENSOR_DIMENSIONS", list(t.dims))
        d.set("CUDNN_ATTR_TENSOR_STRIDES", list(t.strides))
        d.set("CUDNN_ATTR_TENSOR_UNIQUE_ID", t.uid)
        d.set("CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT", self.alignment)
        d.set("CUDNN_ATTR_TENSOR_IS_VIRTUAL", t.virtual)
        if t.by_value:
            d.set("CUDNN_ATTR_TENSOR_IS_BY_VALUE", True)
        return d.finalize()

    def _lower_node(self, n: _Node, tds: dict[int, BackendDescriptor]):
        ins, outs, a = dict(n.inputs), dict(n.outputs), dict(n.attrs)
        T = lambda uid: tds[uid]  # noqa: E731
        if n.kind == "pointwise":
            pw = BackendDescriptor("CUDNN_BACKEND_POINTWISE_DESCRIPTOR")
            pw.set("CUDNN_ATTR_POINTWISE_MODE", _PW["CUDNN_POINTWISE_" + a["mode"]])
            pw.set("CUDNN_ATTR_POINTWISE_MATH_PREC", cudnn_dtype(a["compute_dtype"]))
            for p, (attr, _) in _PW_PARAMS.items():
                if p in a:
                    pw.set(attr, a[p])
            pw.finalize()
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", pw)
            op.set("CUDNN_ATTR_OPERATION_POINTWISE_XDESC", T(ins["x"]))
            if "b" in ins:
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_BDESC", T(ins["b"]))
            if "t" in ins:
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_TDESC", T(ins["t"]))
            if "dy" in ins:
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_DYDESC", T(ins["dy"]))
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_DXDESC", T(outs["dx"]))
            else:
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_YDESC", T(outs["y"]))
            op.set("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1", a["alpha1"])
            if "b" in ins:
                op.set("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2", a["alpha2"])
            return op.finalize(), pw
        if n.kind == "matmul":
            mm = BackendDescriptor("CUDNN_BACKEND_MATMUL_DESCRIPTOR")
            mm.set("CUDNN_ATTR_MATMUL_COMP_TYPE", cudnn_dtype(a["compute_dtype"])).finalize()
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_MATMUL_ADESC", T(ins["a"])).set("CUDNN_ATTR_OPERATION_MATMUL_BDESC",
                                                                         T(ins["b"]))
            op.set("CUDNN_ATTR_OPERATION_MATMUL_CDESC", T(outs["c"])).set("CUDNN_ATTR_OPERATION_MATMUL_DESC", mm)
            return op.finalize(), mm
        if n.kind.startswith("conv_"):
            cv = BackendDescriptor("CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR")
            cv.set("CUDNN_ATTR_CONVOLUTION_COMP_TYPE", cudnn_dtype(a["compute_dtype"]))
            cv.set("CUDNN_ATTR_CONVOLUTION_CONV_MODE",
                   lib.CUDNN_CROSS_CORRELATION if a["mode"] == "cross_correlation" else lib.CUDNN_CONVOLUTION)
            cv.set("CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS", len(a["stride"]))
            cv.set("CUDNN_ATTR_CONVOLUTION_DILATIONS", list(a["dilation"]))
            cv.set("CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES", list(a["stride"]))
            cv.set("CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS", list(a["pre_padding"]))
            cv.set("CUDNN_ATTR_CONVOLUTION_POST_PADDINGS", list(a["post_padding"]))
            cv.finalize()
            kind, p = {
                "conv_fprop": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR", "FORWARD"),
                "conv_dgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR", "BWD_DATA"),
                "conv_wgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR", "BWD_FILTER"),
            }[n.kind]
            op = BackendDescriptor(kind)
            op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_CONV_DESC", cv)
            for role, uid in (*n.inputs, *n.outputs):
                op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_{role.upper()}", T(uid))
            op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_ALPHA", 1.0)
            op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_BETA", 0.0)
            return op.finalize(), cv
        if n.kind == "reduction":
            rd = BackendDescriptor("CUDNN_BACKEND_REDUCTION_DESCRIPTOR")
            rd.set("CUDNN_ATTR_REDUCTION_OPERATOR", _REDUCTIONS[a["mode"]])
            rd.set("CUDNN_ATTR_REDUCTION_COMP_TYPE", cudnn_dtype(a["compute_dtype"])).finalize()
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_REDUCTION_XDESC", T(ins["x"]))
            op.set("CUDNN_ATTR_OPERATION_REDUCTION_YDESC", T(outs["y"])).set("CUDNN_ATTR_OPERATION_REDUCTION_DESC", rd)
            return op.finalize(), rd
        raise AssertionError(n.kind)  # pragma: no cover

    def __repr__(self) -> str:
        return f"<Graph {self.name or self._id}: {len(self._tensors)} tensors, {len(self._nodes)} ops>"


@dataclass
class Lowered:
    """The finalized backend descriptors of a graph (kept alive together)."""

    tensors: dict[int, BackendDescriptor]
    ops: list[BackendDescriptor]
    op_graph: BackendDescriptor
    op_params: list[BackendDescriptor]
