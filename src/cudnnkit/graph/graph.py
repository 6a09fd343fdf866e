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

Heuristics, engine filters, plan build, the plan cache and execution live in
``plan.py``. By-value constants made by :meth:`Graph.scalar` (epsilon, attention
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
import ctypes
import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import lib
from .. import runtime as _runtime
from ..lib.backend import BackendDescriptor
from ..runtime import as_view, canonical, cudnn_dtype, current_settings
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import itemsize as _itemsize
from ..runtime.shapes import expand

__all__ = [
    "Graph",
    "Tensor",
    "GraphError",
    "POINTWISE_ARITY",
    "NormForward",
    "NormBackward",
    "SdpaForward",
    "SdpaBackward",
]


class GraphError(ValueError):
    """A graph that cannot be lowered: dangling tensors, shape or dtype mismatches, missing outputs."""


# ----------------------------------------------------------------- argument checks

_INT64_MAX = 2**63 - 1
#: the largest stride, padding, dilation or window a graph takes: larger ones give output dims or strides beyond
#: what cuDNN's tensors hold
_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def _is_bool(v: Any) -> bool:
    t = type(v)
    return isinstance(v, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def _int(value: Any, name: str, *, minimum: int | None = None, maximum: int = _INT64_MAX) -> int:
    """``value`` as an int: a Python or NumPy integer. A bool, a float (even an integral one: torch refuses
    floats for sizes too), a string... is a ``TypeError`` naming ``name``; outside ``[minimum, maximum]`` a
    :class:`GraphError`."""
    if not _is_bool(value):
        try:
            v = operator.index(value)
        except TypeError:
            pass
        else:
            if minimum is not None and v < minimum:
                raise GraphError(f"{name} must be >= {minimum}, got {v}")
            if v > maximum:
                raise GraphError(f"{name} must be <= {maximum}, got {v}")
            return v
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")


def _ints(value: Any, name: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints (each as :func:`_int` takes it, within int64); ``TypeError`` naming
    ``name`` for a lone number, a string or anything not a sequence of integers."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__} {value!r}")
    items = tuple(value)
    out = []
    for i, v in enumerate(items):
        if _is_bool(v):
            ok = False
        else:
            try:
                v = operator.index(v)
                ok = True
            except TypeError:
                ok = False
        if not ok:
            raise TypeError(f"{name} must be a sequence of ints, got {items!r} ({name}[{i}] is {type(v).__name__})")
        if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise GraphError(f"{name} must hold int64 values, got {items!r}")
        out.append(v)
    return tuple(out)


def _real(value: Any, name: str, *, finite: bool = True, dtype: str = "float64") -> float:
    """``value`` as a float, by :func:`cudnnkit.runtime.check_scalar`: a real number (bools, strings, None...
    are a ``TypeError`` naming ``name``), finite unless ``finite=False``, within the range of ``dtype`` (the
    type of the attribute cuDNN stores it in: ``"float32"`` for the pointwise alphas, double for the rest)."""
    return _runtime.check_scalar(value, name, finite=finite, dtype=dtype)


_FLOAT_MAX = {"float32": _FLOAT32_MAX, "bfloat16": 3.3895313892515355e38, "float16": 65504.0}
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "bool": (0, 1),
}


def _constant(value: Any, dtype: str, name: str) -> float | int:
    """A by-value constant's value for ``dtype``: an integer within the type's range for the integer types (and
    0/1 or a bool for ``"bool"``), else a real number, infinities allowed, NaN refused."""
    bounds = _INT_RANGES.get(dtype)
    if bounds is None:
        v = _real(value, name, finite=False, dtype=dtype)
        if v != v:
            raise ValueError(f"{name} must not be NaN")
        top = _FLOAT_MAX.get(dtype)
        if top is not None and abs(v) != math.inf and abs(v) > top:
            raise ValueError(f"{name}={v!r} is outside {dtype}'s range (largest finite value {top!r})")
        return v
    v = int(value) if dtype == "bool" and _is_bool(value) else _int(value, name)
    if not bounds[0] <= v <= bounds[1]:
        raise ValueError(f"{name}={v} does not fit {dtype} ({bounds[0]} to {bounds[1]})")
    return v


def _choice(value: Any, table: Any, name: str, what: str | None = None) -> str:
    """``value`` if it is one of ``table``'s string keys, else a :class:`GraphError` listing them."""
    if not isinstance(value, str) or value not in table:
        raise GraphError(f"{what or name} must be one of {sorted(table)}, got {value!r}")
    return value


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
    elif _n in (
        "ADD",
        "ADD_SQUARE",
        "DIV",
        "MAX",
        "MIN",
        "MOD",
        "MUL",
        "POW",
        "SUB",
        "ATAN2",
        "LOGICAL_AND",
        "LOGICAL_OR",
    ) or _n.startswith("CMP_"):
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

_RS = lib.cudnnResampleMode_t
_RESAMPLE_MODES = {
    "max": _RS.CUDNN_RESAMPLE_MAXPOOL,
    "avg_include_padding": _RS.CUDNN_RESAMPLE_AVGPOOL_INCLUDE_PADDING,
    "avg_exclude_padding": _RS.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING,
}
_PADDING_MODES = {
    "zero": lib.cudnnPaddingMode_t.CUDNN_ZERO_PAD,
    "neg_inf": lib.cudnnPaddingMode_t.CUDNN_NEG_INF_PAD,
    "edge": lib.cudnnPaddingMode_t.CUDNN_EDGE_VAL_PAD,
}
_NM = lib.cudnnBackendNormMode_t
_NORM_MODES = {
    "batch": _NM.CUDNN_BATCH_NORM,
    "layer": _NM.CUDNN_LAYER_NORM,
    "instance": _NM.CUDNN_INSTANCE_NORM,
    "rms": _NM.CUDNN_RMS_NORM,
}
_RNG = {m.name.removeprefix("CUDNN_RNG_DISTRIBUTION_").lower(): m for m in lib.cudnnRngDistribution_t}

# tensor roles -> attribute suffixes of the ops whose roles do not spell their attribute names
_NORM_FWD_ATTR = {
    "x": "XDESC",
    "scale": "SCALE_DESC",
    "bias": "BIAS_DESC",
    "epsilon": "EPSILON_DESC",
    "momentum": "EXP_AVG_FACTOR_DESC",
    "mean": "MEAN_DESC",
    "inv_variance": "INV_VARIANCE_DESC",
    "running_mean": "INPUT_RUNNING_MEAN_DESC",
    "running_var": "INPUT_RUNNING_VAR_DESC",
    "y": "YDESC",
    "next_running_mean": "OUTPUT_RUNNING_MEAN_DESC",
    "next_running_var": "OUTPUT_RUNNING_VAR_DESC",
}
_NORM_BWD_ATTR = {
    "x": "XDESC",
    "dy": "DYDESC",
    "scale": "SCALE_DESC",
    "mean": "MEAN_DESC",
    "inv_variance": "INV_VARIANCE_DESC",
    "epsilon": "EPSILON_DESC",
    "dx": "DXDESC",
    "dscale": "DSCALE_DESC",
    "dbias": "DBIAS_DESC",
}
_RESAMPLE_ATTR = {"x": "XDESC", "y": "YDESC", "index": "IDXDESC", "dy": "DYDESC", "dx": "DXDESC"}
_SDPA_ATTR = {
    "q": "QDESC",
    "k": "KDESC",
    "v": "VDESC",
    "o": "ODESC",
    "stats": "STATSDESC",
    "scale": "SCALEDESC",
    "do": "DODDESC",
    "dq": "DQDESC",
    "dk": "DKDESC",
    "dv": "DVDESC",
}


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


#: Engines measured to compute a node wrong, denied at every build of a graph holding such a node:
#: (node kind, input dtype, mode) -> engine names. Measured on an H200 with cuDNN 9.19 (issue 10's fuzzer, then a
#: probe over window 2/3, stride 1/2, padding 0/1 and four shapes): bfloat16 max pooling from engine eng3 is wrong
#: nearly everywhere (max error 4.8 on unit normals), from eng2 exact; float16 and float32 are exact from both.
KNOWN_BAD_ENGINES: dict[tuple[str, str, str], tuple[str, ...]] = {("resample_fwd", "bfloat16", "max"): ("eng3",)}


def _check_resample_dtype(mode: str, dtype: str, role: str) -> None:
    """bfloat16 average pooling is refused: measured on an H200 with cuDNN 9.19, both engines that take it (eng2,
    eng3) write wrong values or NaN (issue 10's fuzzer, then a probe); float16 and float32 are exact."""
    if dtype == "bfloat16" and str(mode).startswith("avg"):
        raise GraphError(
            f"{role} is bfloat16: cuDNN 9.19 computes bfloat16 average pooling wrong on Hopper with every engine "
            f"(measured on an H200); use float16 or float32 for mode={mode!r}"
        )


@dataclass(frozen=True)
class _Node:
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


def _set_descriptor(op: BackendDescriptor, name: str, value: BackendDescriptor) -> None:
    """Set an attribute that also takes a descriptor where the table lists another type (RNG seed tensor)."""
    arr = (ctypes.c_void_p * 1)(value.ptr)
    lib.cudnnBackendSetAttribute(
        op.ptr,
        lib.cudnnBackendAttributeName_t[name],
        lib.cudnnBackendAttributeType_t.CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1,
        ctypes.cast(arr, ctypes.c_void_p),
    )
    op._keep.append(value)


_graph_ids = itertools.count(1)


class Graph:
    """A cuDNN operation graph under construction.

    ``compute_dtype`` is the math precision of the operations, and
    ``intermediate_dtype`` the data type of virtual tensors (both float32 by
    default); ``alignment`` is the byte alignment promised for every
    non-virtual tensor's pointer (16 by default: the caching allocators of
    CuPy and torch give at least 256).
    """

    def __init__(
        self,
        *,
        compute_dtype: str = "float32",
        intermediate_dtype: str = "float32",
        alignment: int = 16,
        name: str = "",
    ):
        alignment = _int(alignment, "alignment")
        if alignment < 1 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
        self.compute_dtype = canonical(compute_dtype, "compute_dtype")
        self.intermediate_dtype = canonical(intermediate_dtype, "intermediate_dtype")
        self.alignment = alignment
        self.name = name
        self._id = next(_graph_ids)
        self._tensors: dict[int, Tensor] = {}
        self._nodes: list[_Node] = []
        self._uids = itertools.count(1)
        self._constants: dict[int, float | int] = {}  # by-value constants: uid -> value
        # non-virtual tensors the graph needs as scratch memory: uid -> init policy ("zero": cleared before
        # every execution; None: contents irrelevant)
        self._scratch: dict[int, str | None] = {}
        self._described: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # uid -> lowered dims, strides
        self._view_nodes: set[int] = set()  # nodes that read a tensor through its _described view

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
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
        label = f"tensor {name or '?'}"
        dims = _ints(dims, "dims")
        if not 1 <= len(dims) <= lib.CUDNN_DIM_MAX:
            raise GraphError(f"{label}: 1 to {lib.CUDNN_DIM_MAX} dims, got {dims}")
        if any(d < 1 for d in dims):
            raise GraphError(f"{label}: dims must be positive, got {dims}")
        strides = contiguous_strides(dims) if strides is None else _ints(strides, "strides")
        if len(strides) != len(dims) or any(s < 1 for s in strides):
            raise GraphError(f"{label}: strides {strides} must be {len(dims)} positive ints")
        dtype = canonical(dtype, "dtype")
        if (1 + sum((d - 1) * s for d, s in zip(dims, strides))) * _itemsize(dtype) > _INT64_MAX:
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

    def mark_output(self, t: Tensor, dtype: str | None = None) -> Tensor:
        """Make an operation's output a real (non-virtual) tensor, optionally of another dtype."""
        t = self._own(t, "t")
        new = Tensor(t.uid, t.dims, t.strides, canonical(dtype) if dtype else t.dtype, False, False, t.name, self._id)
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
        return self.tensor(
            dims,
            _dense_like(dims, like.strides if like is not None else None),
            dtype or self.intermediate_dtype,
            virtual=True,
            name=name,
        )

    def _add(self, kind: str, attrs: dict[str, Any], inputs: dict[str, Tensor], outputs: dict[str, Tensor]) -> None:
        self._nodes.append(
            _Node(
                kind,
                tuple(sorted(attrs.items())),
                tuple((r, t.uid) for r, t in inputs.items()),
                tuple((r, t.uid) for r, t in outputs.items()),
            )
        )

    # ------------------------------------------------------------- operations

    def pointwise(
        self,
        mode: str,
        x: Tensor,
        b: Tensor | None = None,
        t: Tensor | None = None,
        *,
        dy: Tensor | None = None,
        compute_dtype: str | None = None,
        dtype: str | None = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        name: str = "",
        **params: float,
    ) -> Tensor:
        """One ``cudnnPointwiseMode_t`` (by name, e.g. ``"ADD"``, ``"RELU_FWD"``, ``"GELU_BWD"``).

        Unary modes take ``x``; binary ones ``x`` and ``b``; ``BINARY_SELECT``
        ``x``, ``b`` and the condition ``t``; the ``*_BWD`` modes ``x`` and
        ``dy`` and return ``dx``. Inputs broadcast (same rank, dims equal or 1).
        Mode parameters as keywords: ``relu_lower_clip``, ``relu_upper_clip``,
        ``relu_lower_clip_slope``, ``elu_alpha``, ``softplus_beta``,
        ``swish_beta``, ``axis`` (``GEN_INDEX``). ``alpha1``/``alpha2`` (float32 in cuDNN) and the float
        parameters must be finite real numbers, ``axis`` an int naming one of ``x``'s dims (negative: from
        the end).
        """
        key = mode.upper().removeprefix("CUDNN_POINTWISE_") if isinstance(mode, str) else None
        if key not in POINTWISE_ARITY:
            raise GraphError(f"unknown pointwise mode {mode!r}; one of {sorted(POINTWISE_ARITY)}")
        lib.require(f"CUDNN_POINTWISE_{key}", f"pointwise mode {key!r}")  # newer than the loaded cuDNN: refused here
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
        values = {}
        for p, v in params.items():
            if p == "axis":
                nd = ins["x"].ndim
                a = _int(v, "axis")
                if not -nd <= a < nd:
                    raise GraphError(f"axis {a} is out of range for x of rank {nd}")
                values[p] = a % nd
            else:
                values[p] = _real(v, p)
        order = ["dy", "x"] if arity == "dy,x" else needed
        dims = _broadcast([ins[r].dims for r in order], order)
        attrs = {
            "mode": key,
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
            "alpha1": _real(alpha1, "alpha1", dtype="float32"),
            "alpha2": _real(alpha2, "alpha2", dtype="float32"),
            **values,
        }
        out = self._out(dims, ins["x"], dtype, name or key.lower())
        self._add("pointwise", attrs, ins, {"dx" if arity == "dy,x" else "y": out})
        return out

    def matmul(
        self, a: Tensor, b: Tensor, *, compute_dtype: str | None = None, dtype: str | None = None, name: str = ""
    ) -> Tensor:
        """``c = a @ b`` over the last two dims, batch dims broadcast: ``(..., M, K) @ (..., K, N)``."""
        a, b = self._own(a, "a"), self._own(b, "b")
        if a.ndim < 2 or a.ndim != b.ndim:
            raise GraphError(f"matmul needs a and b of one rank >= 2, got {a.dims} and {b.dims}")
        if a.dims[-1] != b.dims[-2]:
            raise GraphError(
                f"matmul: a is (..., {a.dims[-2]}, {a.dims[-1]}) but b is (..., {b.dims[-2]}, "
                f"{b.dims[-1]}); K must agree"
            )
        batch = _broadcast([a.dims[:-2], b.dims[:-2]], ["a", "b"]) if a.ndim > 2 else ()
        attrs = {"compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype")}
        out = self._out((*batch, a.dims[-2], b.dims[-1]), None, dtype, name or "matmul")
        self._add("matmul", attrs, {"a": a, "b": b}, {"c": out})
        return out

    def _conv_attrs(
        self, nsp: int, stride, pre_padding, post_padding, dilation, mode: str, compute_dtype: str | None
    ) -> dict[str, Any]:
        if not isinstance(mode, str) or mode not in ("cross_correlation", "convolution"):
            raise GraphError(f"mode must be 'cross_correlation' or 'convolution', got {mode!r}")
        post = pre_padding if post_padding is None else post_padding
        return {
            "stride": expand(stride, nsp, "stride", 1, _INT32_MAX),
            "pre_padding": expand(pre_padding, nsp, "pre_padding", 0, _INT32_MAX),
            "post_padding": expand(
                post, nsp, "post_padding" if post_padding is not None else "pre_padding", 0, _INT32_MAX
            ),
            "dilation": expand(dilation, nsp, "dilation", 1, _INT32_MAX),
            "mode": mode,
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
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
                raise GraphError(
                    f"spatial dim {i}: x's size {xi} plus pre_padding {attrs['pre_padding'][i]} and post_padding "
                    f"{attrs['post_padding'][i]} is smaller than w's kernel {ki} at dilation {attrs['dilation'][i]} "
                    f"({eff})"
                )
            out.append(o)
        return tuple(out)

    def conv_fprop(
        self,
        x: Tensor,
        w: Tensor,
        *,
        stride=1,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
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

    def conv_dgrad(
        self,
        dy: Tensor,
        w: Tensor,
        x_dims: Sequence[int],
        *,
        stride=1,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Convolution backward data: ``dx`` of dims ``x_dims`` from ``dy`` and ``w``."""
        dy, w = self._own(dy, "dy"), self._own(w, "w")
        x_dims = _ints(x_dims, "x_dims")
        if len(x_dims) < 3 or not len(x_dims) == w.ndim == dy.ndim:
            raise GraphError(f"conv_dgrad needs x_dims, w and dy of one rank >= 3, got {x_dims}, {w.dims}, {dy.dims}")
        attrs = self._conv_attrs(len(x_dims) - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype)
        if self._conv_out(x_dims, w.dims, attrs) != dy.dims:
            raise GraphError(
                f"dy {dy.dims} is not the forward output of x {x_dims} and w {w.dims} "
                f"({self._conv_out(x_dims, w.dims, attrs)})"
            )
        dx = self._out(x_dims, dy, dtype, name or "conv_dgrad")
        self._add("conv_dgrad", attrs, {"dy": dy, "w": w}, {"dx": dx})
        return dx

    def conv_wgrad(
        self,
        x: Tensor,
        dy: Tensor,
        w_dims: Sequence[int],
        *,
        stride=1,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Convolution backward filter: ``dw`` of dims ``w_dims`` from ``x`` and ``dy``."""
        x, dy = self._own(x, "x"), self._own(dy, "dy")
        w_dims = _ints(w_dims, "w_dims")
        if len(w_dims) < 3 or not len(w_dims) == x.ndim == dy.ndim:
            raise GraphError(f"conv_wgrad needs x, dy and w_dims of one rank >= 3, got {x.dims}, {dy.dims}, {w_dims}")
        attrs = self._conv_attrs(x.ndim - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype)
        if self._conv_out(x.dims, w_dims, attrs) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the forward output of x {x.dims} and w {w_dims}")
        dw = self._out(w_dims, x, dtype, name or "conv_wgrad")
        self._add("conv_wgrad", attrs, {"x": x, "dy": dy}, {"dw": dw})
        return dw

    def reduction(
        self,
        x: Tensor,
        out_dims: Sequence[int],
        *,
        mode: str = "add",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Reduce ``x`` to ``out_dims`` (same rank; each dim equal to x's or 1) with ``mode``:
        add, mul, min, max, amax, avg, norm1, norm2, mul_no_zeros."""
        x = self._own(x, "x")
        _choice(mode, _REDUCTIONS, "mode", "reduction mode")
        out_dims = _ints(out_dims, "out_dims")
        if len(out_dims) != x.ndim or any(o not in (1, d) for o, d in zip(out_dims, x.dims)):
            raise GraphError(f"out_dims={out_dims} for a reduction of x {x.dims}: each output dim is x's or 1")
        attrs = {"mode": mode, "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype")}
        y = self._out(out_dims, x, dtype, name or f"reduce_{mode}")
        self._add("reduction", attrs, {"x": x}, {"y": y})
        return y

    # ------------------------------------------------------------- constants and scratch

    def scalar(self, value: float, dtype: str = "float32", ndim: int = 4, name: str = "") -> Tensor:
        """A by-value constant: a host scalar whose value the graph fixes (part of :meth:`key`).

        The executor passes it by value; :meth:`constants` lists each one's
        uid, value and dtype. Operations that take scalars (epsilon, momentum,
        attention scale, mask fill) make theirs through here when given numbers.

        ``value``: a real number (infinities allowed: masks fill with ``-inf``; NaN refused); an integral one
        that fits ``dtype`` for the integer types, 0/1 (or a bool) for ``"bool"``.
        """
        ndim = _int(ndim, "ndim", minimum=1, maximum=lib.CUDNN_DIM_MAX)
        dtype = canonical(dtype)
        v = _constant(value, dtype, name or "value")
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
        if _is_bool(v) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise TypeError(f"{role} must be a number or a Tensor, got {type(v).__name__}")
        return self.scalar(_real(v, role), dtype, ndim, name=role)

    def _describe_as(self, t: Tensor, dims: tuple[int, ...], strides: tuple[int, ...], role: str) -> None:
        """Lower ``t`` with other dims/strides (a transposed view of the same memory) in this graph."""
        old = self._described.get(t.uid)
        if old is not None and old != (dims, strides):
            raise GraphError(f"{role} (uid {t.uid}) is already described as {old} in this graph")
        self._described[t.uid] = (dims, strides)

    # ------------------------------------------------------------- resample (pooling)

    def _resample_attrs(
        self,
        nsp: int,
        mode: str,
        window,
        stride,
        pre_padding,
        post_padding,
        padding_mode,
        nan_propagation: bool,
        compute_dtype: str | None,
    ) -> dict[str, Any]:
        _choice(mode, _RESAMPLE_MODES, "mode")
        if window is None:
            raise GraphError("window is required (one size per spatial dim, or one int for all)")
        window = expand(window, nsp, "window", 1, _INT32_MAX)
        attrs = {
            "mode": mode,
            "window": window,
            "stride": expand(window if stride is None else stride, nsp, "stride", 1, _INT32_MAX),
            "pre_padding": expand(pre_padding, nsp, "pre_padding", 0, _INT32_MAX),
            "post_padding": expand(
                pre_padding if post_padding is None else post_padding,
                nsp,
                "pre_padding" if post_padding is None else "post_padding",
                0,
                _INT32_MAX,
            ),
            "padding_mode": padding_mode or ("neg_inf" if mode == "max" else "zero"),
            "nan_propagation": bool(nan_propagation),
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
        }
        _choice(attrs["padding_mode"], _PADDING_MODES, "padding_mode")
        for i, (p, q, w) in enumerate(zip(attrs["pre_padding"], attrs["post_padding"], window)):
            if p >= w or q >= w:
                raise GraphError(f"spatial dim {i}: padding ({p}, {q}) must be smaller than the window {w}")
        return attrs

    @staticmethod
    def _resample_out(x_dims: tuple[int, ...], a: dict[str, Any]) -> tuple[int, ...]:
        out = list(x_dims[:2])
        for i, xi in enumerate(x_dims[2:]):
            o = (xi + a["pre_padding"][i] + a["post_padding"][i] - a["window"][i]) // a["stride"][i] + 1
            if o < 1:
                raise GraphError(
                    f"spatial dim {i}: x's size {xi} plus pre_padding {a['pre_padding'][i]} and post_padding "
                    f"{a['post_padding'][i]} is smaller than the window {a['window'][i]}"
                )
            out.append(o)
        return tuple(out)

    def resample_forward(
        self,
        x: Tensor,
        *,
        mode: str = "max",
        window=None,
        stride=None,
        pre_padding=0,
        post_padding=None,
        padding_mode: str | None = None,
        nan_propagation: bool = False,
        index: bool = False,
        index_dtype: str = "int8",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Pooling: ``x`` ``(N, C, *spatial)`` -> ``y`` ``(N, C, *out)``, ``out = (in + pre + post - window) // stride + 1``.

        ``mode``: ``"max"``, ``"avg_include_padding"``, ``"avg_exclude_padding"``.
        ``window``, ``stride`` (default: the window), ``pre_padding`` and
        ``post_padding`` (default: ``pre_padding``) take one int or one per
        spatial dim; cuDNN's resample has no dilation. ``padding_mode``
        (``"neg_inf"`` for max, ``"zero"`` for average by default; also
        ``"edge"``). ``nan_propagation`` sets ``CUDNN_PROPAGATE_NAN``.
        ``index=True`` (max pooling for training) also returns the argmax
        index tensor (``index_dtype``, int8 by default) that
        :meth:`resample_backward` can take instead of ``x`` and ``y``.

        Makes ``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR``.
        """
        x = self._own(x, "x")
        if x.ndim < 3:
            raise GraphError(f"resample_forward needs x of rank >= 3 (N, C, *spatial), got {x.dims}")
        a = self._resample_attrs(
            x.ndim - 2, mode, window, stride, pre_padding, post_padding, padding_mode, nan_propagation, compute_dtype
        )
        _check_resample_dtype(a["mode"], x.dtype, "x")
        if index and mode != "max":
            raise GraphError(f"index=True applies to max pooling, not {mode!r}")
        dims = self._resample_out(x.dims, a)
        y = self._out(dims, x, dtype or x.dtype, name or f"pool_{mode}")
        outs = {"y": y}
        if index:
            outs["index"] = self._out(dims, x, index_dtype, (name or "pool") + "_index")
        self._add("resample_fwd", a, {"x": x}, outs)
        return (y, outs["index"]) if index else y

    def resample_backward(
        self,
        dy: Tensor,
        *,
        x_dims: Sequence[int],
        index: Tensor | None = None,
        mode: str = "max",
        window=None,
        stride=None,
        pre_padding=0,
        post_padding=None,
        padding_mode: str | None = None,
        nan_propagation: bool = False,
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Pooling backward: ``dx`` of dims ``x_dims`` from ``dy`` and the forward's options.

        Max pooling needs ``index``, the argmax tensor of
        ``resample_forward(index=True)``; average pooling needs only ``dy``.
        (The operation's X/Y inputs are not offered: with them in place of
        the index, libcudnn 9.19 crashes while answering the engine
        heuristics.) Makes ``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR``.
        """
        dy = self._own(dy, "dy")
        _check_resample_dtype(str(mode), dy.dtype, "dy")
        ins = {"dy": dy}
        x_dims = _ints(x_dims, "x_dims")
        if len(x_dims) != dy.ndim or len(x_dims) < 3:
            raise GraphError(f"x_dims {x_dims} and dy {dy.dims} must have one rank >= 3")
        a = self._resample_attrs(
            len(x_dims) - 2,
            mode,
            window,
            stride,
            pre_padding,
            post_padding,
            padding_mode,
            nan_propagation,
            compute_dtype,
        )
        if self._resample_out(x_dims, a) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the pooled shape {self._resample_out(x_dims, a)} of x {x_dims}")
        if mode == "max":
            if index is None:
                raise GraphError("max-pooling backward needs index= (resample_forward(..., index=True))")
            ins["index"] = self._own(index, "index")
            if ins["index"].dims != dy.dims:
                raise GraphError(f"index {ins['index'].dims} must have dy's dims {dy.dims}")
        elif index is not None:
            raise GraphError(f"index= applies to max pooling, not {mode!r}")
        dx = self._out(x_dims, dy, dtype or dy.dtype, name or f"pool_{mode}_bwd")
        self._add("resample_bwd", a, ins, {"dx": dx})
        return dx

    # ------------------------------------------------------------- normalization

    def _norm_param_dims(self, mode: str, x: Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(scale/bias dims, saved-statistics dims) of a norm mode for x."""
        n, c, rest = x.dims[0], x.dims[1], x.ndim - 2
        if mode == "batch":
            return (1, c, *(1,) * rest), (1, c, *(1,) * rest)
        if mode == "instance":
            return (1, c, *(1,) * rest), (n, c, *(1,) * rest)
        # layer, rms: per-element affine over every dim but the batch, statistics per sample
        return (1, *x.dims[1:]), (n, *(1,) * (x.ndim - 1))

    def _check_dims(self, t: Tensor | None, dims: tuple[int, ...], role: str, mode: str) -> Tensor | None:
        if t is None:
            return None
        t = self._own(t, role)
        if t.dims != dims:
            raise GraphError(f"{mode} norm: {role} must have dims {dims}, got {t.dims}")
        return t

    def norm_forward(
        self,
        mode: str,
        x: Tensor,
        scale: Tensor,
        bias: Tensor | None = None,
        *,
        phase: str = "training",
        epsilon: Tensor | float = 1e-5,
        momentum: Tensor | float | None = None,
        mean: Tensor | None = None,
        inv_variance: Tensor | None = None,
        running_mean: Tensor | None = None,
        running_var: Tensor | None = None,
        peer_stats: Sequence[Tensor] = (),
        stats_dtype: str = "float32",
        dtype: str | None = None,
        name: str = "",
    ) -> NormForward:
        """Normalization forward: ``mode`` ``"batch"``, ``"layer"``, ``"instance"`` or ``"rms"``.

        Tensors per mode (``x`` ``(N, C, *spatial)``; statistics float32):

        - batch: ``scale``/``bias`` ``(1, C, 1...)``. Training returns the
          saved ``mean`` and ``inv_variance`` ``(1, C, 1...)``; with
          ``running_mean``/``running_var`` (and ``momentum``, the weight of the
          new batch) it also returns the updated running statistics. Inference
          takes ``mean`` and ``inv_variance`` as inputs. ``peer_stats``: the
          other GPUs' statistics buffers for multi-GPU batch norm.
        - instance: ``scale``/``bias`` ``(1, C, 1...)``; training returns
          ``mean``/``inv_variance`` ``(N, C, 1...)``.
        - layer: ``scale``/``bias`` ``(1, *x.dims[1:])``; training returns
          ``mean``/``inv_variance`` ``(N, 1...)``.
        - rms: like layer, ``bias`` optional, training returns ``inv_variance`` only.

        ``epsilon`` and ``momentum`` are by-value scalars (numbers become
        :meth:`scalar` constants); batch-norm inference uses no epsilon (its
        ``inv_variance`` already holds it). cuDNN's GROUP_NORM and
        ADA_LAYER_NORM modes are not offered. Outputs are virtual until marked. Makes
        ``CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR``.
        """
        _choice(mode, _NORM_MODES, "mode")
        if not isinstance(phase, str) or phase not in ("training", "inference"):
            raise GraphError(f"phase must be 'training' or 'inference', got {phase!r}")
        x = self._own(x, "x")
        if x.ndim < 2:
            raise GraphError(f"norm_forward needs x of rank >= 2 (N, C, ...), got {x.dims}")
        pdims, sdims = self._norm_param_dims(mode, x)
        ins: dict[str, Tensor] = {"x": x, "scale": self._check_dims(scale, pdims, "scale", mode)}
        if scale is None:
            raise GraphError(f"{mode} norm needs scale")
        if bias is None and mode != "rms":
            raise GraphError(f"{mode} norm needs bias")
        if bias is not None:
            ins["bias"] = self._check_dims(bias, pdims, "bias", mode)
        training = phase == "training"
        if training or mode != "batch":  # batch-norm inference takes the inverse variance, not epsilon
            ins["epsilon"] = self._scalar_or(epsilon, "epsilon", x.ndim, required=True)
        if mode == "batch" and not training:
            if mean is None or inv_variance is None:
                raise GraphError("batch norm inference needs mean= and inv_variance= (the running statistics)")
            ins["mean"] = self._check_dims(mean, sdims, "mean", mode)
            ins["inv_variance"] = self._check_dims(inv_variance, sdims, "inv_variance", mode)
        elif mean is not None or inv_variance is not None:
            raise GraphError("mean=/inv_variance= are inputs only for batch norm inference; training outputs them")
        running = running_mean is not None or running_var is not None
        if running:
            if mode != "batch" or not training:
                raise GraphError("running_mean/running_var apply to batch norm training")
            if running_mean is None or running_var is None or momentum is None:
                raise GraphError("running statistics need running_mean=, running_var= and momentum=")
            ins["running_mean"] = self._check_dims(running_mean, sdims, "running_mean", mode)
            ins["running_var"] = self._check_dims(running_var, sdims, "running_var", mode)
            ins["momentum"] = self._scalar_or(momentum, "momentum", x.ndim)
        elif momentum is not None:
            raise GraphError("momentum= needs running_mean= and running_var=")
        peers = tuple(self._own(p, f"peer_stats[{i}]") for i, p in enumerate(peer_stats))
        if peers and mode != "batch":
            raise GraphError("peer_stats apply to batch norm")
        for i, p in enumerate(peers):
            ins[f"peer{i}"] = p
        base = name or f"{mode}_norm"
        outs = {"y": self._out(x.dims, x, dtype or x.dtype, base)}
        if training:
            if mode != "rms":
                outs["mean"] = self._out(sdims, None, stats_dtype, base + "_mean")
            outs["inv_variance"] = self._out(sdims, None, stats_dtype, base + "_inv_variance")
            if running:
                outs["next_running_mean"] = self._out(sdims, None, ins["running_mean"].dtype, base + "_running_mean")
                outs["next_running_var"] = self._out(sdims, None, ins["running_var"].dtype, base + "_running_var")
        self._add("norm_fwd", {"mode": mode, "phase": phase, "peers": len(peers)}, ins, outs)
        return NormForward(
            outs["y"],
            outs.get("mean"),
            outs.get("inv_variance"),
            outs.get("next_running_mean"),
            outs.get("next_running_var"),
        )

    def norm_backward(
        self,
        mode: str,
        x: Tensor,
        dy: Tensor,
        scale: Tensor,
        *,
        mean: Tensor | None = None,
        inv_variance: Tensor,
        epsilon: Tensor | float | None = None,
        dbias: bool | None = None,
        peer_stats: Sequence[Tensor] = (),
        dtype: str | None = None,
        name: str = "",
    ) -> NormBackward:
        """Normalization backward from the saved statistics: returns ``dx``, ``dscale`` and ``dbias``.

        ``mean`` and ``inv_variance`` are the training forward's saved outputs
        (RMS norm has no mean). ``dbias`` (default: on, off for rms) asks for
        the bias gradient. ``epsilon`` is optional and checked but not given to cuDNN: the backward works from
        ``inv_variance``, and a norm-backward plan of cuDNN 9.19 does not take an epsilon tensor (measured on an
        H200 by issue 10's fuzzer: binding one fails execution with ``varPackUidCount > expected_uid_count``).
        Makes ``CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR``.
        """
        _choice(mode, _NORM_MODES, "mode")
        x, dy = self._own(x, "x"), self._own(dy, "dy")
        if dy.dims != x.dims:
            raise GraphError(f"dy {dy.dims} must have x's dims {x.dims}")
        pdims, sdims = self._norm_param_dims(mode, x)
        ins = {"x": x, "dy": dy, "scale": self._check_dims(scale, pdims, "scale", mode)}
        if scale is None:
            raise GraphError(f"{mode} norm backward needs scale")
        if mode == "rms":
            if mean is not None:
                raise GraphError("rms norm has no mean; pass inv_variance only")
        else:
            if mean is None:
                raise GraphError(f"{mode} norm backward needs mean=")
            ins["mean"] = self._check_dims(mean, sdims, "mean", mode)
        if inv_variance is None:
            raise GraphError(f"{mode} norm backward needs inv_variance=")
        ins["inv_variance"] = self._check_dims(inv_variance, sdims, "inv_variance", mode)
        if epsilon is not None and not isinstance(epsilon, Tensor):
            _real(epsilon, "epsilon")  # checked, not passed: see the docstring
        elif epsilon is not None:
            self._own(epsilon, "epsilon")
        peers = tuple(self._own(p, f"peer_stats[{i}]") for i, p in enumerate(peer_stats))
        if peers and mode != "batch":
            raise GraphError("peer_stats apply to batch norm")
        for i, p in enumerate(peers):
            ins[f"peer{i}"] = p
        want_dbias = (mode != "rms") if dbias is None else bool(dbias)
        base = name or f"{mode}_norm_bwd"
        outs = {
            "dx": self._out(x.dims, x, dtype or x.dtype, base + "_dx"),
            "dscale": self._out(pdims, None, ins["scale"].dtype, base + "_dscale"),
        }
        if want_dbias:
            outs["dbias"] = self._out(pdims, None, ins["scale"].dtype, base + "_dbias")
        self._add("norm_bwd", {"mode": mode, "peers": len(peers)}, ins, outs)
        return NormBackward(outs["dx"], outs["dscale"], outs.get("dbias"))

    def genstats(
        self, x: Tensor, *, compute_dtype: str | None = None, dtype: str = "float32", name: str = ""
    ) -> tuple[Tensor, Tensor]:
        """Per-channel ``sum`` and ``sum of squares`` of ``x`` ``(N, C, *)``, each ``(1, C, 1...)``.

        cuDNN 9.19 runs it fused after a convolution (``conv_fprop`` -> ``genstats``);
        alone it has no engine on Hopper. Makes
        ``CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR`` (``CUDNN_GENSTATS_SUM_SQSUM``).
        """
        x = self._own(x, "x")
        if x.ndim < 2:
            raise GraphError(f"genstats needs x of rank >= 2 (N, C, ...), got {x.dims}")
        dims = (1, x.dims[1], *(1,) * (x.ndim - 2))
        s = self._out(dims, None, dtype, name or "sum")
        sq = self._out(dims, None, dtype, (name + "_" if name else "") + "sq_sum")
        self._add(
            "genstats",
            {"compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype")},
            {"x": x},
            {"sum": s, "sq_sum": sq},
        )
        return s, sq

    # ------------------------------------------------------------- rng, reshape, concat

    def rng(
        self,
        dims: Sequence[int],
        *,
        seed: Tensor | int,
        offset: Tensor | None = None,
        distribution: str = "bernoulli",
        probability: float = 0.5,
        mean: float = 0.0,
        std: float = 1.0,
        minimum: float = 0.0,
        maximum: float = 1.0,
        strides: Sequence[int] | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Random numbers of ``dims``: ``"bernoulli"`` (1 with ``probability``, else 0), ``"uniform"``
        (``minimum``..``maximum``) or ``"normal"`` (``mean``, ``std``).

        ``seed`` is an int (fixed in the graph) or a one-element int64 device
        tensor; ``offset`` (one-element int64 device tensor) goes with a seed
        tensor. The same seed and offset give the same numbers. cuDNN 9.19
        runs RNG inside the attention pattern (``sdpa_forward(dropout=...)``),
        not alone. Makes ``CUDNN_BACKEND_RNG_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR``.
        """
        _choice(distribution, _RNG, "distribution")
        attrs: dict[str, Any] = {"distribution": distribution}
        if distribution == "bernoulli":
            probability = _real(probability, "probability")
            if not 0.0 <= probability <= 1.0:
                raise GraphError(f"probability must be within [0, 1], got {probability}")
            attrs["probability"] = probability
        elif distribution == "uniform":
            minimum, maximum = _real(minimum, "minimum"), _real(maximum, "maximum")
            if not minimum < maximum:
                raise GraphError(f"uniform needs minimum < maximum, got {minimum}, {maximum}")
            attrs.update(minimum=minimum, maximum=maximum)
        else:
            mean, std = _real(mean, "mean"), _real(std, "std")
            if not std > 0:
                raise GraphError(f"normal needs std > 0, got {std}")
            attrs.update(mean=mean, std=std)
        ins: dict[str, Tensor] = {}
        if isinstance(seed, Tensor):
            ins["seed"] = self._own(seed, "seed")
        elif isinstance(seed, int) and not isinstance(seed, bool):
            attrs["seed"] = _int(seed, "seed", minimum=-_INT64_MAX - 1)
        else:
            raise TypeError(f"seed must be an int or a Tensor, got {type(seed).__name__}")
        if offset is not None:
            if "seed" not in ins:
                raise GraphError("offset= goes with a seed tensor (cuDNN takes both from device memory)")
            ins["offset"] = self._own(offset, "offset")
        elif "seed" in ins:
            raise GraphError("a seed tensor needs an offset= tensor")
        for role, t in ins.items():
            if math.prod(t.dims) != 1 or t.dtype != "int64":
                raise GraphError(f"{role} must be a one-element int64 tensor, got {t.dims} {t.dtype}")
        y = self.tensor(dims, strides, dtype or self.intermediate_dtype, virtual=True, name=name or "rng")
        self._add("rng", attrs, ins, {"y": y})
        return y

    def reshape(
        self,
        x: Tensor,
        dims: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        *,
        perm: Sequence[int] | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """``y``: ``x``'s elements under new ``dims`` (and ``strides``; default C order).

        ``perm`` gives a transpose instead: ``y.dims[i] = x.dims[perm[i]]`` and
        ``y.strides[i] = x.strides[perm[i]]``, the same memory read in another
        order (how attention's backward turns ``P`` into ``P^T``). cuDNN 9.19
        on Hopper runs reshapes inside the attention backward pattern; a lone
        reshape needs cuDNN 9.22 on Blackwell. Makes
        ``CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR``.
        """
        x = self._own(x, "x")
        if perm is not None:
            if dims is not None or strides is not None:
                raise GraphError("reshape takes dims/strides or perm, not both")
            perm = _ints(perm, "perm")
            if sorted(perm) != list(range(x.ndim)):
                raise GraphError(f"perm {perm} is not a permutation of {x.ndim} axes")
            dims = tuple(x.dims[p] for p in perm)
            strides = tuple(x.strides[p] for p in perm)
        elif dims is None:
            raise GraphError("reshape needs dims= or perm=")
        dims = _ints(dims, "dims")
        if math.prod(dims) != math.prod(x.dims):
            raise GraphError(
                f"reshape of {x.dims} ({math.prod(x.dims)} elements) to {dims} ({math.prod(dims)} elements)"
            )
        y = self.tensor(dims, strides, dtype or x.dtype, virtual=True, name=name or "reshape")
        self._add("reshape", {"perm": perm}, {"x": x}, {"y": y})
        return y

    def concat(
        self,
        inputs: Sequence[Tensor],
        axis: int,
        *,
        inplace_index: int | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Join ``inputs`` (one rank, dims equal but along ``axis``) along ``axis``.

        ``inplace_index``: the input that already lies inside the output's
        memory (cuDNN then skips copying it). cuDNN 9.19 fuses it after a
        convolution (``conv_fprop`` -> ``concat``); a lone concat needs cuDNN
        9.22 on Blackwell. Makes ``CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR``.
        """
        if isinstance(inputs, (Tensor, str, bytes)) or not hasattr(inputs, "__iter__"):
            raise TypeError(f"inputs must be a sequence of Tensors, got {type(inputs).__name__}")
        ts = [self._own(t, f"inputs[{i}]") for i, t in enumerate(inputs)]
        if not ts:
            raise GraphError("concat needs at least one input")
        nd = ts[0].ndim
        axis = _int(axis, "axis")
        if not -nd <= axis < nd:
            raise GraphError(f"axis {axis} is out of range for rank {nd}")
        axis %= nd
        for i, t in enumerate(ts[1:], 1):
            if t.ndim != nd or any(a != b for j, (a, b) in enumerate(zip(t.dims, ts[0].dims)) if j != axis):
                raise GraphError(f"inputs[{i}] {t.dims} does not match inputs[0] {ts[0].dims} outside axis {axis}")
        if inplace_index is not None:
            inplace_index = _int(inplace_index, "inplace_index")
        if inplace_index is not None and not 0 <= inplace_index < len(ts):
            raise GraphError(f"inplace_index {inplace_index} is out of range for {len(ts)} inputs")
        dims = list(ts[0].dims)
        dims[axis] = sum(t.dims[axis] for t in ts)
        y = self._out(tuple(dims), ts[0], dtype or ts[0].dtype, name or "concat")
        self._add(
            "concat", {"axis": axis, "inplace_index": inplace_index}, {f"x{i}": t for i, t in enumerate(ts)}, {"y": y}
        )
        return y

    # ------------------------------------------------------------- scaled dot-product attention

    def _sdpa_check(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
        for role, t in (("q", q), ("k", k), ("v", v)):
            if t.ndim != 4:
                raise GraphError(f"{role} must be 4-d (B, H, S, D), got {t.dims}")
            if t.strides[3] != 1:
                raise GraphError(f"{role}'s last dim (the head dim) must have stride 1, got strides {t.strides}")
            if t.dtype not in ("float16", "bfloat16"):
                raise GraphError(f"{role} must be float16 or bfloat16, got {t.dtype}")
        b, h, sq, d = q.dims
        bk, hk, skv, dk = k.dims
        bv, hv, skv2, dv = v.dims
        if bk != b or bv != b:
            raise GraphError(f"q, k, v must share the batch size; got {b}, {bk}, {bv}")
        if dk != d:
            raise GraphError(f"k's head dim {dk} must equal q's {d}")
        if skv2 != skv:
            raise GraphError(f"k and v must share the key length; got {skv} and {skv2}")
        if h % hk or h % hv:
            raise GraphError(f"q's {h} heads must be a multiple of k's {hk} and v's {hv} (grouped-query attention)")
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise GraphError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
        return b, h, sq, d, hk, hv, skv, dv

    def _vt(self, dims, dtype, name) -> Tensor:
        return self.tensor(dims, None, dtype, virtual=True, name=name)

    def _pw(
        self,
        mode: str,
        x: Tensor,
        b: Tensor | None = None,
        t: Tensor | None = None,
        *,
        dtype=None,
        compute=None,
        out: Tensor | None = None,
        name: str = "",
        **params,
    ) -> Tensor:
        """A pointwise node on internal tensors (no public-argument checks; dims follow x)."""
        if out is None:
            out = self._vt(x.dims, dtype or self.intermediate_dtype, name or mode.lower())
        ins = {"x": x}
        if b is not None:
            ins["b"] = b
        if t is not None:
            ins["t"] = t
        attrs = {
            "mode": mode,
            "compute_dtype": canonical(compute or self.compute_dtype, "compute_dtype"),
            "alpha1": 1.0,
            "alpha2": 1.0,
            **params,
        }
        self._add("pointwise", attrs, ins, {"y": out})
        return out

    def _mm(self, a: Tensor, b: Tensor, dims, *, dtype=None, out: Tensor | None = None, name: str = "") -> Tensor:
        if out is None:
            out = self._vt(dims, dtype or self.intermediate_dtype, name)
        self._add("matmul", {"compute_dtype": "float32"}, {"a": a, "b": b}, {"c": out})
        return out

    def _red(
        self, x: Tensor, dims, *, mode: str = "add", dtype=None, out: Tensor | None = None, name: str = ""
    ) -> Tensor:
        if out is None:
            out = self._vt(dims, dtype or self.intermediate_dtype, name)
        self._add("reduction", {"mode": mode, "compute_dtype": "float32"}, {"x": x}, {"y": out})
        return out

    def _mask(self, s: Tensor, left_bound: int | None, right_bound: int | None) -> Tensor:
        """Diagonal band mask on scores ``(B, H, Sq, Skv)`` (top-left aligned): keep
        ``row - left_bound < col <= row + right_bound``; the rest becomes -inf."""
        if left_bound is None and right_bound is None:
            return s
        row = self._pw("GEN_INDEX", s, dtype="int32", name="row_index", axis=2)
        col = self._pw("GEN_INDEX", s, dtype="int32", name="col_index", axis=3)
        ninf = self.scalar(-math.inf, "float32", 4, name="neg_inf")
        if right_bound is not None:
            r = row
            if right_bound:
                r = self._pw(
                    "ADD",
                    row,
                    self.scalar(right_bound, "int32", 4, name="right_bound"),
                    dtype="int32",
                    compute="int32",
                    name="row_plus_right_bound",
                )
            keep = self._pw("CMP_GE", r, col, dtype="bool", compute="bool", name="causal_keep")
            s = self._pw("BINARY_SELECT", s, ninf, keep, name="causal_masked")
        if left_bound is not None:
            c = self._pw(
                "ADD",
                col,
                self.scalar(float(left_bound), "float32", 4, name="left_bound"),
                dtype="float32",
                name="col_plus_left_bound",
            )
            keep = self._pw("CMP_GT", c, row, dtype="bool", compute="bool", name="window_keep")
            s = self._pw("BINARY_SELECT", s, ninf, keep, name="window_masked")
        return s

    def _sdpa_common(self, q, k, v, scale, causal, left_bound, right_bound, implementation, dropout):
        q, k, v = self._own(q, "q"), self._own(k, "k"), self._own(v, "v")
        shape = self._sdpa_check(q, k, v)
        if not isinstance(implementation, str) or implementation not in ("composite", "unified"):
            raise GraphError(f"implementation must be 'composite' or 'unified', got {implementation!r}")
        if causal:
            if right_bound not in (None, 0):
                raise GraphError("causal=True is right_bound=0; do not pass another right_bound")
            right_bound = 0
        for role, bnd in (("left_bound", left_bound), ("right_bound", right_bound)):
            if bnd is not None and (
                not isinstance(bnd, int) or isinstance(bnd, bool) or bnd < 0 or (role == "left_bound" and bnd < 1)
            ):
                raise GraphError(f"{role} must be a non-negative int (left_bound >= 1), got {bnd!r}")
        p = _real(dropout, "dropout")
        if not 0.0 <= p < 1.0:
            raise GraphError(f"dropout must be within [0, 1), got {dropout}")
        if implementation == "unified" and (left_bound is not None or right_bound is not None or p):
            raise GraphError(
                "the unified SDPA operation of cuDNN 9.19 takes no mask or dropout "
                "(cuDNN 9.21 adds them); use implementation='composite'"
            )
        sc = self._scalar_or(1.0 / math.sqrt(shape[3]) if scale is None else scale, "scale", 4)
        return q, k, v, shape, sc, left_bound, right_bound, p

    def _dropout_mask(self, dims, p: float, seed: Tensor | None, offset: Tensor | None) -> Tensor:
        if seed is None or offset is None:
            raise GraphError("dropout needs seed= and offset= (one-element int64 device tensors)")
        return self.rng(dims, seed=seed, offset=offset, probability=1.0 - p, name="dropout_mask")

    def sdpa_forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        stats: bool = True,
        o_strides: Sequence[int] | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaForward:
        """Scaled dot-product attention forward: ``o = softmax(scale * q @ k^T + mask) @ v``.

        ``q`` ``(B, H, Sq, D)``, ``k`` ``(B, Hk, Skv, D)``, ``v`` ``(B, Hv, Skv, Dv)``
        (any strides with the head dim contiguous: BHSD or BSHD; ``H`` a
        multiple of ``Hk`` and ``Hv`` for grouped-query attention), float16 or
        bfloat16. ``scale`` defaults to ``1/sqrt(D)``. ``causal`` keeps
        ``col <= row``; ``right_bound``/``left_bound`` give a diagonal band
        ``row - left_bound < col <= row + right_bound`` (top-left aligned).
        ``dropout`` (probability of dropping) needs ``seed``/``offset``
        tensors. Returns ``o`` ``(B, H, Sq, Dv)`` (q's dtype, ``o_strides`` or
        q's layout) and, with ``stats``, the float32 softmax log-sum-exp
        ``(B, H, Sq, 1)`` that :meth:`sdpa_backward` needs; both virtual until
        marked. Without ``stats`` the statistics are still written, to a
        :meth:`scratch` tensor: cuDNN 9.19 on an H200 has no engine for the
        pattern without them.

        ``implementation="composite"`` (default) builds cuDNN's fused-attention
        pattern from primitive nodes: ``OPERATION_MATMUL`` (q @ k^T, with k
        described as its transpose), ``OPERATION_POINTWISE`` (scale, mask via
        GEN_INDEX/CMP/BINARY_SELECT, softmax SUB/EXP/DIV/LOG/ADD, dropout MUL),
        ``OPERATION_REDUCTION`` (row max, row sum), ``OPERATION_RNG`` (dropout)
        and ``OPERATION_MATMUL`` (P @ v). ``"unified"`` makes one
        ``CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR`` (cuDNN 9.19: no mask, no dropout).
        """
        if o_strides is not None:
            o_strides = _ints(o_strides, "o_strides")
        q, k, v, shape, sc, lb, rb, p = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout
        )
        b, h, sq, d, hk, hv, skv, dv = shape
        odims = (b, h, sq, dv)
        o = self.tensor(
            odims,
            _dense_like(odims, q.strides) if o_strides is None else o_strides,
            q.dtype,
            virtual=True,
            name=name or "o",
        )
        st = self._vt((b, h, sq, 1), "float32", (name + "_" if name else "") + "stats")
        if not stats:
            # cuDNN 9.19 on an H200 offers no engine for the pattern without statistics (measured): they go to
            # a scratch tensor the executor allocates
            st = Tensor(st.uid, st.dims, st.strides, st.dtype, False, False, st.name, self._id)
            self._tensors[st.uid] = st
            self._add_scratch(st, None)  # written by the pattern before anything reads it
        if implementation == "unified":
            self._add("sdpa_fwd", {}, {"q": q, "k": k, "v": v, "scale": sc}, {"o": o, "stats": st})
            return SdpaForward(o, st if stats else None)
        self._describe_as(k, (b, hk, d, skv), (k.strides[0], k.strides[1], k.strides[3], k.strides[2]), "k")
        s = self._mm(q, k, (b, h, sq, skv), name="qk")
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, sc, name="scaled")
        s = self._mask(s, lb, rb)
        mx = self._red(s, (b, h, sq, 1), mode="max", name="row_max")
        e = self._pw("EXP", self._pw("SUB", s, mx, name="minus_max"), name="exp")
        sm = self._red(e, (b, h, sq, 1), name="row_sum")
        self._pw("ADD", mx, self._pw("LOG", sm, name="log_sum"), out=st)
        pr = self._pw("DIV", e, sm, name="probs")
        if p:
            pr = self._pw("MUL", pr, self._dropout_mask((b, h, sq, skv), p, seed, offset), name="dropped")
            pr = self._pw(
                "MUL",
                pr,
                self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale"),
                dtype=q.dtype,
                name="probs_scaled",
            )
        else:
            pr = self._retype(pr, q.dtype)
        self._mm(pr, v, odims, out=o)
        return SdpaForward(o, st if stats else None)

    def _retype(self, t: Tensor, dtype: str) -> Tensor:
        """The last internal virtual tensor ``t`` with another dtype (the matmul after it reads that type)."""
        new = Tensor(t.uid, t.dims, t.strides, dtype, True, False, t.name, self._id)
        self._tensors[t.uid] = new
        return new

    def sdpa_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        do: Tensor,
        stats: Tensor,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        dq_strides: Sequence[int] | None = None,
        dk_strides: Sequence[int] | None = None,
        dv_strides: Sequence[int] | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaBackward:
        """Attention backward: ``dq``, ``dk``, ``dv`` from the forward's inputs, ``o``, ``do`` and ``stats``.

        Options as in :meth:`sdpa_forward` (they must match the forward's).
        ``o`` and ``do`` ``(B, H, Sq, Dv)``, ``stats`` the forward's float32
        log-sum-exp ``(B, H, Sq, 1)``. Gradients take their input's dtype and
        layout unless ``*_strides`` say otherwise; virtual until marked.

        The composite (default) follows cuDNN's fused attention backward
        pattern: ``rowsum(do * o)`` into a float32 scratch tensor, the scores
        recomputed (matmul, scale, mask, ``exp(s - stats)``), ``dv = P^T @ do``
        and ``dk = dS^T @ q`` through ``OPERATION_RESHAPE`` transposes,
        ``dq = dS @ k`` into a float32 scratch accumulator then
        ``IDENTITY`` into ``dq`` (see :meth:`scratch`); grouped-query heads are
        summed by ``OPERATION_REDUCTION``. ``"unified"`` makes one
        ``CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR`` (no mask, no dropout).
        """
        strides_of = {"dq": dq_strides, "dk": dk_strides, "dv": dv_strides}
        for role, st in strides_of.items():
            if st is not None:
                strides_of[role] = _ints(st, f"{role}_strides")
        dq_strides, dk_strides, dv_strides = strides_of.values()
        q, k, v, shape, sc, lb, rb, p = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout
        )
        b, h, sq, d, hk, hv, skv, dv = shape
        o, do, stats = self._own(o, "o"), self._own(do, "do"), self._own(stats, "stats")
        for role, t in (("o", o), ("do", do)):
            if t.dims != (b, h, sq, dv):
                raise GraphError(f"{role} must have dims {(b, h, sq, dv)}, got {t.dims}")
        if stats.dims != (b, h, sq, 1) or stats.dtype != "float32":
            raise GraphError(f"stats must be float32 {(b, h, sq, 1)}, got {stats.dtype} {stats.dims}")
        base = name or "sdpa_bwd"

        def grad(t: Tensor, strides, role: str) -> Tensor:
            return self.tensor(
                t.dims, t.strides if strides is None else strides, t.dtype, virtual=True, name=f"{base}_{role}"
            )

        dq, dk, dvt = grad(q, dq_strides, "dq"), grad(k, dk_strides, "dk"), grad(v, dv_strides, "dv")
        if implementation == "unified":
            self._add(
                "sdpa_bwd",
                {},
                {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats, "scale": sc},
                {"dq": dq, "dk": dk, "dv": dvt},
            )
            return SdpaBackward(dq, dk, dvt)
        k_strides, v_strides = k.strides, v.strides
        self._describe_as(k, (b, hk, d, skv), (k_strides[0], k_strides[1], k_strides[3], k_strides[2]), "k")
        self._describe_as(v, (b, hv, dv, skv), (v_strides[0], v_strides[1], v_strides[3], v_strides[2]), "v")
        # rowsum(do * o), kept in a float32 scratch tensor
        dsum = self._red(self._pw("MUL", do, o, name="do_o"), (b, h, sq, 1), name="rowsum_do_o")
        rsum = self.tensor((b, h, sq, 1), None, "float32", name="softmax_sum")
        self._add_scratch(rsum, None)  # written (rowsum) before it is read
        keep = self.scalar(1.0 - p, "float32", 4, name="dropout_keep" if p else "one")
        self._pw("MUL", dsum, keep, out=rsum)
        # the probabilities again: exp(scale * q @ k^T + mask - stats)
        s = self._mm(q, k, (b, h, sq, skv), name="qk")
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, sc, name="scaled")
        s = self._pw("SUB", s, stats, name="minus_stats")
        s = self._mask(s, lb, rb)
        e = self._pw("EXP", s, name="probs")
        pr = e
        if p:
            mask = self._dropout_mask((b, h, sq, skv), p, seed, offset)
            dscale = self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale")
            pr = self._pw("MUL", self._pw("MUL", e, mask, name="dropped"), dscale, name="probs_scaled")
        tr = (h * sq * skv, sq * skv, 1, skv)
        pt = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="probs_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": pr}, {"y": pt})
        self._grouped(self._mm, pt, do, (b, h, skv, dv), dvt, hv, "dv")
        # dS = P * (do @ v^T - rowsum) * scale
        dp = self._mm(do, v, (b, h, sq, skv), name="do_v")
        self._view_nodes.add(len(self._nodes) - 1)
        if p:
            dp = self._pw("MUL", dp, mask, name="dp_dropped")
        ds = self._pw("MUL", self._pw("SUB", dp, rsum, name="dp_minus_sum"), e, name="ds_raw")
        if p:
            ds = self._pw("MUL", ds, dscale, name="ds_dropout")
        ds = self._pw("MUL", ds, sc, name="ds")
        dst = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="ds_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": ds}, {"y": dst})
        self._grouped(self._mm, dst, q, (b, h, skv, d), dk, hk, "dk")
        # dq = dS @ k through a float32 accumulator
        kv = self.tensor((b, hk, skv, d), k_strides, k.dtype, virtual=True, name="k_view")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": k}, {"y": kv})
        self._view_nodes.add(len(self._nodes) - 1)
        acc = self.tensor((b, h, sq, d), None, "float32", name="dq_accum")
        self._add_scratch(acc, "zero")  # the matmul accumulates into it: zeroed before every run
        self._mm(ds, kv, (b, h, sq, d), out=acc)
        self._pw("IDENTITY", acc, out=dq)
        return SdpaBackward(dq, dk, dvt)

    def _grouped(self, mm, a: Tensor, b: Tensor, full_dims, out: Tensor, heads: int, role: str) -> None:
        """``out = a @ b``, summing groups of query heads down to ``heads`` for grouped-query attention."""
        if full_dims[1] == heads:
            mm(a, b, full_dims, out=out)
            return
        full = self._vt(full_dims, out.dtype, f"{role}_full_heads")
        mm(a, b, full_dims, out=full)
        self._red(full, out.dims, out=out)

    # ------------------------------------------------------------- checks, key, lowering

    def known_bad_engines(self) -> tuple[str, ...]:
        """Engine names the plan build denies for this graph (:data:`KNOWN_BAD_ENGINES`: measured wrong results)."""
        bad: list[str] = []
        for n in self._nodes:
            first = self._tensors[n.inputs[0][1]].dtype if n.inputs else ""
            mode = str(dict(n.attrs).get("mode", ""))
            bad += [e for e in KNOWN_BAD_ENGINES.get((n.kind, first, mode), ()) if e not in bad]
        return tuple(bad)

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
        )

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
        tds = {}
        for uid, t in self._tensors.items():
            with self._lowering(self._tensor_what, uid):
                tds[uid] = self._lower_tensor(t)
        ops = []
        for i, n in enumerate(self._nodes):
            with self._lowering(self._node_label, i, n):
                ops.append(self._lower_node(n, tds))
        g = BackendDescriptor("CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR")
        with self._lowering("the operation graph of {} operation(s)".format, len(ops)):
            g.set("CUDNN_ATTR_OPERATIONGRAPH_OPS", [op for op, _ in ops])
            if handle is not None:
                g.set("CUDNN_ATTR_OPERATIONGRAPH_HANDLE", handle)
            g.finalize()
        return Lowered(tds, [op for op, _ in ops], g, [d for _, d in ops])

    def _label(self) -> str:
        """``graph <name or #id> (<n> ops: <kinds>)``: how errors name this graph."""
        ops = ", ".join(n.kind if n.kind != "pointwise" else n.attr("mode") for n in self._nodes)
        return f"graph {self.name or '#' + str(self._id)} ({len(self._nodes)} ops: {ops})"

    def _tensor_label(self, uid: int) -> str:
        return f"tensor {self._tensors[uid].name or '?'} (uid {uid})"

    def _tensor_what(self, uid: int) -> str:
        t = self._tensors[uid]
        lowered = self._described.get(uid, (t.dims, t.strides))
        return f"{self._tensor_label(uid)} dims {lowered[0]} strides {lowered[1]} {t.dtype}"

    def _node_label(self, i: int, n: _Node) -> str:
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
            from .plan import Attempt, UnsupportedGraphError, _status_reason

            raise UnsupportedGraphError(
                self._label(), [Attempt(what(*args), "lower", _status_reason(e), e.status_name)]
            ) from e

    def _lower_tensor(self, t: Tensor) -> BackendDescriptor:
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
            op.set("CUDNN_ATTR_OPERATION_MATMUL_ADESC", T(ins["a"])).set(
                "CUDNN_ATTR_OPERATION_MATMUL_BDESC", T(ins["b"])
            )
            op.set("CUDNN_ATTR_OPERATION_MATMUL_CDESC", T(outs["c"])).set("CUDNN_ATTR_OPERATION_MATMUL_DESC", mm)
            return op.finalize(), mm
        if n.kind.startswith("conv_"):
            cv = BackendDescriptor("CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR")
            cv.set("CUDNN_ATTR_CONVOLUTION_COMP_TYPE", cudnn_dtype(a["compute_dtype"]))
            cv.set(
                "CUDNN_ATTR_CONVOLUTION_CONV_MODE",
                lib.CUDNN_CROSS_CORRELATION if a["mode"] == "cross_correlation" else lib.CUDNN_CONVOLUTION,
            )
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
        if n.kind in ("resample_fwd", "resample_bwd"):
            rs = BackendDescriptor("CUDNN_BACKEND_RESAMPLE_DESCRIPTOR")
            rs.set("CUDNN_ATTR_RESAMPLE_MODE", _RESAMPLE_MODES[a["mode"]])
            rs.set("CUDNN_ATTR_RESAMPLE_COMP_TYPE", cudnn_dtype(a["compute_dtype"]))
            rs.set(
                "CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION",
                lib.CUDNN_PROPAGATE_NAN if a["nan_propagation"] else lib.CUDNN_NOT_PROPAGATE_NAN,
            )
            rs.set("CUDNN_ATTR_RESAMPLE_PADDING_MODE", _PADDING_MODES[a["padding_mode"]])
            rs.set("CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS", len(a["window"]))
            rs.set("CUDNN_ATTR_RESAMPLE_WINDOW_DIMS", list(a["window"]))
            rs.set("CUDNN_ATTR_RESAMPLE_STRIDES", list(a["stride"]))
            rs.set("CUDNN_ATTR_RESAMPLE_PRE_PADDINGS", list(a["pre_padding"]))
            rs.set("CUDNN_ATTR_RESAMPLE_POST_PADDINGS", list(a["post_padding"]))
            rs.finalize()
            p = "FWD" if n.kind == "resample_fwd" else "BWD"
            op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_RESAMPLE_{p}_DESCRIPTOR")
            op.set(f"CUDNN_ATTR_OPERATION_RESAMPLE_{p}_DESC", rs)
            for role, uid in (*n.inputs, *n.outputs):
                op.set(f"CUDNN_ATTR_OPERATION_RESAMPLE_{p}_{_RESAMPLE_ATTR[role]}", T(uid))
            return op.finalize(), rs
        if n.kind in ("norm_fwd", "norm_bwd"):
            fwd = n.kind == "norm_fwd"
            p, table = ("FWD", _NORM_FWD_ATTR) if fwd else ("BWD", _NORM_BWD_ATTR)
            op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_NORM_{'FORWARD' if fwd else 'BACKWARD'}_DESCRIPTOR")
            op.set(f"CUDNN_ATTR_OPERATION_NORM_{p}_MODE", _NORM_MODES[a["mode"]])
            if fwd:
                op.set(
                    "CUDNN_ATTR_OPERATION_NORM_FWD_PHASE",
                    lib.cudnnBackendNormFwdPhase_t.CUDNN_NORM_FWD_TRAINING
                    if a["phase"] == "training"
                    else lib.cudnnBackendNormFwdPhase_t.CUDNN_NORM_FWD_INFERENCE,
                )
            peers = []
            for role, uid in (*n.inputs, *n.outputs):
                if role.startswith("peer"):
                    peers.append(T(uid))
                else:
                    op.set(f"CUDNN_ATTR_OPERATION_NORM_{p}_{table[role]}", T(uid))
            if peers:
                op.set(f"CUDNN_ATTR_OPERATION_NORM_{p}_PEER_STAT_DESCS", peers)
            return op.finalize(), None
        if n.kind == "genstats":
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_GENSTATS_MODE", lib.cudnnGenStatsMode_t.CUDNN_GENSTATS_SUM_SQSUM)
            op.set("CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC", cudnn_dtype(a["compute_dtype"]))
            op.set("CUDNN_ATTR_OPERATION_GENSTATS_XDESC", T(ins["x"]))
            op.set("CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC", T(outs["sum"]))
            op.set("CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC", T(outs["sq_sum"]))
            return op.finalize(), None
        if n.kind == "rng":
            rg = BackendDescriptor("CUDNN_BACKEND_RNG_DESCRIPTOR")
            rg.set("CUDNN_ATTR_RNG_DISTRIBUTION", _RNG[a["distribution"]])
            for key, attr in (
                ("probability", "BERNOULLI_DIST_PROBABILITY"),
                ("minimum", "UNIFORM_DIST_MINIMUM"),
                ("maximum", "UNIFORM_DIST_MAXIMUM"),
                ("mean", "NORMAL_DIST_MEAN"),
                ("std", "NORMAL_DIST_STANDARD_DEVIATION"),
            ):
                if key in a:
                    rg.set(f"CUDNN_ATTR_RNG_{attr}", a[key])
            rg.finalize()
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_RNG_DESC", rg).set("CUDNN_ATTR_OPERATION_RNG_YDESC", T(outs["y"]))
            if "seed" in ins:
                _set_descriptor(op, "CUDNN_ATTR_OPERATION_RNG_SEED", T(ins["seed"]))
                op.set("CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC", T(ins["offset"]))
            else:
                op.set("CUDNN_ATTR_OPERATION_RNG_SEED", a["seed"])
            return op.finalize(), rg
        if n.kind == "reshape":
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_RESHAPE_XDESC", T(ins["x"])).set(
                "CUDNN_ATTR_OPERATION_RESHAPE_YDESC", T(outs["y"])
            )
            return op.finalize(), None
        if n.kind == "concat":
            op = BackendDescriptor("CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR")
            op.set("CUDNN_ATTR_OPERATION_CONCAT_AXIS", a["axis"])
            op.set("CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS", [T(uid) for _, uid in n.inputs])
            if a["inplace_index"] is not None:
                op.set("CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX", a["inplace_index"])
            op.set("CUDNN_ATTR_OPERATION_CONCAT_OUTPUT_DESC", T(outs["y"]))
            return op.finalize(), None
        if n.kind in ("sdpa_fwd", "sdpa_bwd"):
            p = "FWD" if n.kind == "sdpa_fwd" else "BWD"
            op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_SDPA_{p}_DESCRIPTOR")
            for role, uid in (*n.inputs, *n.outputs):
                op.set(f"CUDNN_ATTR_OPERATION_SDPA_{p}_{_SDPA_ATTR[role]}", T(uid))
            return op.finalize(), None
        raise AssertionError(n.kind)  # pragma: no cover

    # ------------------------------------------------------------- plans (cudnnkit.graph.plan)

    def build(self, device: int | None = None, **options: Any) -> Any:
        """The cached :class:`~cudnnkit.graph.plan.ExecutionPlan` for this graph on ``device``
        (heuristics, engine filters, ``cudnnBackendFinalize`` of an execution plan): see
        :func:`cudnnkit.graph.plan.build` for ``options``."""
        from .plan import build

        return build(self, device, **options)

    def execute(
        self, bindings: Any, *, stream: Any = None, workspace: Any = None, unchecked: bool = False, **options: Any
    ) -> Any:
        """Build (cached) and run on ``bindings`` (Tensor or uid -> array/pointer); returns the plan.
        For loops, keep ``plan.bind(bindings)`` instead: see :func:`cudnnkit.graph.plan.execute`
        (``unchecked=True`` trusts raw pointers and raw int streams)."""
        from .plan import execute

        return execute(self, bindings, stream=stream, workspace=workspace, unchecked=unchecked, **options)

    def autotune(self, bindings: Any, *, max_candidates: int = 8, **kwargs: Any) -> Any:
        """Time up to ``max_candidates`` plans on ``bindings`` and cache the fastest: see
        :func:`cudnnkit.graph.plan.autotune`."""
        from .plan import autotune

        return autotune(self, bindings, max_candidates=max_candidates, **kwargs)

    def __repr__(self) -> str:
        return f"<Graph {self.name or self._id}: {len(self._tensors)} tensors, {len(self._nodes)} ops>"


@dataclass
class Lowered:
    """The finalized backend descriptors of a graph (kept alive together)."""

    tensors: dict[int, BackendDescriptor]
    ops: list[BackendDescriptor]
    op_graph: BackendDescriptor
    op_params: list[BackendDescriptor | None]  # the op's parameter descriptor (pointwise, matmul, ...), if any
