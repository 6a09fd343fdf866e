"""Tensor arithmetic on cuDNN's legacy API: ``cudnnOpTensor`` (elementwise, with broadcasting) and
``cudnnReduceTensor`` (reductions over chosen dims, with indices for min/max/amax).

``op_tensor(a, b, op=...)``: ``c = op(alpha1 * a, alpha2 * b) + beta * out``, for ``op`` in ``"add"``,
``"mul"``, ``"min"``, ``"max"`` (binary: ``b`` has ``a``'s number of dims, each of its dims ``a``'s or 1, and
is broadcast), ``"sqrt"`` and ``"not"`` (unary: ``c = op(alpha1 * a) + beta * out``; ``not`` is ``1 - x``,
cuDNN's). ``c`` has ``a``'s shape.

``reduce_tensor(a, op=..., axes=...)``: ``c = alpha * reduce(a) + beta * out`` over ``axes`` (default: all),
``c`` keeping ``a``'s rank with size 1 on the reduced dims, for ``op`` in ``"add"``, ``"mul"``, ``"min"``,
``"max"``, ``"amax"`` (max of absolute values), ``"avg"``, ``"norm1"``, ``"norm2"`` and ``"mul_no_zeros"`` (the
product of the non-zero values). ``indices=True`` (min and max only, as cuDNN documents) also returns the flat
index, within each reduced slice, of the element chosen (``CUDNN_REDUCE_TENSOR_FLATTENED_INDICES``; cuDNN's
32-bit unsigned indices, returned as int32, the same bits for any tensor of fewer than 2**31 elements).

``op_tensor`` takes 1 to 5 dims, ``reduce_tensor`` 1 to 8 (cuDNN pads fewer than 4 with size-1 dims); both take
float16, bfloat16, float32 and float64 (computing in float32, or float64 for float64 data), and read and write
packed arrays: inputs with other strides are copied to C order first, and a given ``out`` must be C-contiguous.
``propagate_nan``: min/max-type ops return NaN where one is read (``CUDNN_PROPAGATE_NAN``). Two reductions cuDNN
9.19 refuses run around it (:func:`reduce_views`, measured on an H200): bfloat16 (every op NOT_SUPPORTED) as
float32 copies, and a reduction over size-1 dims only (BAD_PARAM) as one of a stacked copy.

L3 (the end of this module): both are differentiable ops of the same names (``cudnnkit.autograd``, the torch custom
ops ``cudnnkit::op_tensor``/``cudnnkit::reduce_tensor``), their backwards composed of these calls, tensor.py's and
cudnnActivationBackward's ReLU (the comparisons), never of an array library's operators; the gradients that divide
(cuDNN has no division) are computed on the host.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import lib
from ..runtime import DescriptorKind, check_choice, cudnn_dtype, current_settings, get_cached, tensor_descriptor
from ..runtime.arrays import contiguous_strides, is_dense
from ..runtime.cache import LRU, MISSING
from ..runtime.dtypes import FLOATS, check_dtype, check_scalar, itemsize, nan_propagation, scaling_ref
from ._diff import Differentiable, Spec, differentiable, from_host, host_values, spec_view
from ._primitive import Call, Operand, Output, Primitive, register, run
from .activation import activation_backward
from .tensor import add_tensor, set_tensor, transform_tensor

__all__ = ["op_tensor", "reduce_tensor"]

_log = logging.getLogger("cudnnkit")

_DTYPES = FLOATS  # runtime.dtypes: every float type cuDNN has
_OPS = {
    "add": lib.CUDNN_OP_TENSOR_ADD,
    "mul": lib.CUDNN_OP_TENSOR_MUL,
    "min": lib.CUDNN_OP_TENSOR_MIN,
    "max": lib.CUDNN_OP_TENSOR_MAX,
    "sqrt": lib.CUDNN_OP_TENSOR_SQRT,
    "not": lib.CUDNN_OP_TENSOR_NOT,
}
_UNARY = ("sqrt", "not")
_REDUCE = {
    "add": lib.CUDNN_REDUCE_TENSOR_ADD,
    "mul": lib.CUDNN_REDUCE_TENSOR_MUL,
    "min": lib.CUDNN_REDUCE_TENSOR_MIN,
    "max": lib.CUDNN_REDUCE_TENSOR_MAX,
    "amax": lib.CUDNN_REDUCE_TENSOR_AMAX,
    "avg": lib.CUDNN_REDUCE_TENSOR_AVG,
    "norm1": lib.CUDNN_REDUCE_TENSOR_NORM1,
    "norm2": lib.CUDNN_REDUCE_TENSOR_NORM2,
    "mul_no_zeros": lib.CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS,
}
#: cuDNN computes indices for min and max only ("requesting indices for the other reduction ops results in an
#: error", cudnnReduceTensor's documentation)
_WITH_INDICES = ("min", "max")


def _compute(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _set_op(ptr: int, op: str, compute: str, nan: int) -> None:
    lib.cudnnSetOpTensorDescriptor(ptr, _OPS[op], cudnn_dtype(compute), nan)


def _set_reduce(ptr: int, op: str, compute: str, nan: int, indices: bool) -> None:
    lib.cudnnSetReduceTensorDescriptor(
        ptr,
        _REDUCE[op],
        cudnn_dtype(compute),
        nan,
        lib.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES if indices else lib.CUDNN_REDUCE_TENSOR_NO_INDICES,
        lib.CUDNN_32BIT_INDICES,
    )


OP_TENSOR = DescriptorKind("op_tensor", "cudnnCreateOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor", _set_op)
REDUCE_TENSOR = DescriptorKind("reduce_tensor", "cudnnCreateReduceTensorDescriptor",
                               "cudnnDestroyReduceTensorDescriptor", _set_reduce)  # fmt: skip


def _check_rank(v: Any, name: str, most: int = 8) -> None:
    if not 1 <= v.ndim <= most:
        raise ValueError(f"{name} must have 1 to {most} dims (cuDNN's limit for this call), got shape {v.shape}")


# ----------------------------------------------------------------- op_tensor


class _Op(NamedTuple):
    op: str
    nan: int
    shape: tuple[int, ...]
    desc: Any  #: the op descriptor
    alpha2: float  #: b's scale (checked)


def _op_resolve(views: Any, kw: Any) -> _Op:
    va, vb = views["a"], views["b"]
    op = check_choice(kw.get("op", "add"), _OPS, "op")
    _check_rank(va, "a", 5)  # cuDNN's op-tensor and add-tensor calls take at most 5 dims
    if op in _UNARY:
        if vb is not None:
            raise ValueError(f"op={op!r} is unary: it reads only a (pass b=None)")
    else:
        if vb is None:
            raise TypeError(f"op={op!r} is binary: b is required")
        if vb.ndim != va.ndim:
            raise ValueError(f"b has {vb.ndim} dims but a has {va.ndim} (cuDNN broadcasts size-1 dims only)")
        for i, (db, da) in enumerate(zip(vb.shape, va.shape)):
            if db not in (1, da):
                raise ValueError(f"b's dim {i} is {db}; it must equal a's ({da}) or be 1 (it is broadcast)")
        if vb.dtype != va.dtype:
            raise TypeError(f"b has dtype {vb.dtype} but a has dtype {va.dtype}")
    nan = nan_propagation(kw.get("propagate_nan", False))
    alpha2 = check_scalar(kw.get("alpha2", 1.0), "alpha2", dtype=va.dtype)
    return _Op(op, nan, va.shape, get_cached(OP_TENSOR, (op, _compute(va.dtype), nan)), alpha2)


def _desc(v: Any) -> Any:
    return tensor_descriptor(v.dtype, v.shape, v.strides)


def _op_call(c: Call) -> None:
    r = c.resolved
    va, vb, vc = c.views["a"], c.views["b"], c.views["out"]
    vb = va if vb is None else vb  # unary ops read only a; cuDNN still takes a b descriptor
    lib.cudnnOpTensor(
        c.launch.handle,
        r.desc,
        c.alpha,
        _desc(va),
        va.ptr,
        scaling_ref(va.dtype, r.alpha2, "alpha2"),
        _desc(vb),
        vb.ptr,
        c.beta,
        _desc(vc),
        vc.ptr,
    )


OP_TENSOR_OP = register(
    Primitive(
        "op_tensor",
        inputs=(Operand("a", _DTYPES, packed=True), Operand("b", _DTYPES, optional=True, packed=True)),
        outputs=(Output("out", shape=lambda r: r.shape, packed=True, blend=("alpha1", "beta")),),
        resolve=_op_resolve,
        legacy=_op_call,
        empty=lambda r: 0 in r.shape,
        family="op_tensor",
        differentiable=("a", "b"),  # L3 "op_tensor": the backward is composed of op_tensor/reduce_tensor calls
        residuals=("a", "b", "out"),
    )
)


def op_tensor(
    a: Any,
    b: Any = None,
    *,
    op: str = "add",
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    beta: float = 0.0,
    propagate_nan: bool = False,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """``c = op(alpha1 * a, alpha2 * b) + beta * out`` (see the module docstring); ``cudnnOpTensor`` (primitive
    ``op_tensor``). ``alpha1``/``alpha2`` are cuDNN's names for the two inputs' scales.

    Args:
        a: the first operand, 1 to 5 dims; float16, bfloat16, float32 or float64.
        b: the second operand of a binary ``op``: ``a``'s number of dims, each dim ``a``'s or 1 (broadcast), ``a``'s
            dtype; None for the unary ops.
        op: ``"add"``, ``"mul"``, ``"min"``, ``"max"`` (binary), ``"sqrt"`` or ``"not"`` (unary; ``not`` is
            ``1 - x``).
        alpha1: scale of ``a``.
        alpha2: scale of ``b``.
        beta: blend factor of ``out``'s previous contents (``beta != 0`` needs ``out``).
        propagate_nan: min/max return NaN where one is read (``CUDNN_PROPAGATE_NAN``).
        out: a C-contiguous array of ``a``'s shape and dtype; None allocates ``c``.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``c``, ``a``'s shape and dtype.

    Example:
        >>> c = ops.op_tensor(a, b, op="max")                    # elementwise max(a, b)
        >>> d = ops.op_tensor(a, b, op="add", alpha2=-1.0)       # a - b
    """
    kw = dict(op=op, alpha1=alpha1, alpha2=alpha2, beta=beta, propagate_nan=propagate_nan, out=out)
    return run(OP_TENSOR_OP, {"a": a, "b": b}, stream=stream, **kw)


# ----------------------------------------------------------------- reduce_tensor


class _Reduce(NamedTuple):
    op: str
    nan: int
    indices: bool
    shape: tuple[int, ...]  #: c's shape (a's, 1 on the reduced dims)


def _axes(axes: Any, nd: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(nd))
    items = [axes] if isinstance(axes, int) and not isinstance(axes, bool) else axes
    try:
        items = list(items)
    except TypeError:
        raise TypeError(f"axes must be an int, a sequence of ints or None, got {axes!r}") from None
    out = set()
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"axes must hold ints, got {a!r}")
        if not -nd <= a < nd:
            raise ValueError(f"axis {a} is out of range for {nd} dims")
        if a % nd in out:
            raise ValueError(f"axis {a} is given twice in axes={axes!r}")
        out.add(a % nd)
    return tuple(sorted(out))


def _reduce_resolve(views: Any, kw: Any) -> _Reduce:
    va = views["a"]
    _check_rank(va, "a")
    op = check_choice(kw.get("op", "add"), _REDUCE, "op")
    if va.size == 0:
        raise ValueError(f"a has shape {va.shape}: cuDNN reduces non-empty tensors only")
    indices = kw.get("indices", False)
    if not isinstance(indices, bool):
        raise TypeError(f"indices must be a bool, got {indices!r}")
    if indices and op not in _WITH_INDICES:
        raise ValueError(f"indices=True is for op in {_WITH_INDICES} (cuDNN gives none for {op!r})")
    axes = _axes(kw.get("axes"), va.ndim)
    shape = tuple(1 if i in axes else d for i, d in enumerate(va.shape))
    nan = nan_propagation(kw.get("propagate_nan", False))
    return _Reduce(op, nan, indices, shape)


class Raw(NamedTuple):
    """A device array as a descriptor needs it (what :func:`reduce_views` reads of a view)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    ptr: int


#: what the second slice of a reduction that reduces nothing holds (see :func:`reduce_views`): the op's identity,
#: or a copy of the values for the ops that a duplicate leaves unchanged
_IDENTITY = {"add": 0.0, "norm1": 0.0, "norm2": 0.0, "mul_no_zeros": 0.0, "mul": 1.0}


def reduce_views(launch: Any, op: str, nan: int, indices: bool, va: Any, vc: Any, alpha: Any, beta: Any) -> Any:
    """``vc = alpha * reduce_op(va) + beta * vc`` by ``cudnnReduceTensor`` (``vc``: packed, ``va``'s shape with size
    1 on the reduced dims); with ``indices`` returns the int32 index array (flat, at least one per output),
    else None. Shared by ``reduce_tensor`` and the convolution's bias gradient. Two cases cuDNN 9.19 refuses,
    measured on the H200, are run around it:

    - bfloat16 (NOT_SUPPORTED for every op and shape): ``va`` is reduced as a float32 copy into a float32
      temporary, blended into ``vc`` by ``cudnnTransformTensor``;
    - a reduction that reduces nothing, only size-1 dims (BAD_PARAM ``!dims_differ``): ``va`` is reduced along a
      new (or size-1) dim of size 2 whose second slice is the op's identity (0 for add, the norms and
      mul_no_zeros; 1 for mul) or a copy of ``va`` (min, max, amax, avg); the indices are then all 0."""
    h = launch.handle
    one, zero = scaling_ref("float32", 1.0), scaling_ref("float32", 0.0)
    keep = []
    if op == "add" and not indices and _graph_sum(launch, va, vc, alpha, beta):
        return None
    if va.dtype == "bfloat16":
        s32 = contiguous_strides(va.shape)
        d32 = tensor_descriptor("float32", va.shape, s32)  # before allocating: one cuDNN cannot take is refused
        t32, a32 = launch.empty(va.shape, "float32", s32, name="a")
        lib.cudnnTransformTensor(h, one, _desc(va), va.ptr, zero, d32, a32.ptr)
        o32, c32 = launch.empty(vc.shape, "float32", contiguous_strides(vc.shape), name="out")
        idx = reduce_views(launch, op, nan, indices, a32, c32, alpha, zero)
        lib.cudnnTransformTensor(h, one, _desc(c32), c32.ptr, beta, _desc(vc), vc.ptr)
        del t32, o32
        return idx
    if tuple(vc.shape) == tuple(va.shape):  # nothing to reduce
        return _reduce_nothing(launch, op, nan, indices, va, vc, alpha, beta)
    desc = get_cached(REDUCE_TENSOR, (op, _compute(va.dtype), nan, indices))
    ad, cd = _desc(va), _desc(vc)
    ws, isz = ctypes.c_size_t(), ctypes.c_size_t()
    lib.cudnnGetReductionWorkspaceSize(h, desc, ad, cd, ctypes.byref(ws))
    lib.cudnnGetReductionIndicesSize(h, desc, ad, cd, ctypes.byref(isz))
    work, work_ptr = launch.workspace(ws.value)
    buf = None
    if indices:
        n = max(-(-isz.value // 4), math.prod(vc.shape))  # what cuDNN asks for, and at least one index per output
        buf, vi = launch.empty((n,), "int32", name="indices")
        idx_ptr, idx_bytes = vi.ptr, n * 4
    else:
        scratch, idx_ptr = launch.workspace(isz.value)
        keep.append(scratch)
        idx_bytes = isz.value
    lib.cudnnReduceTensor(h, desc, idx_ptr or None, idx_bytes, work_ptr or None, ws.value, alpha, ad, va.ptr, beta,
                          cd, vc.ptr)  # fmt: skip
    del work, keep
    return buf


#: (device, a's dtype, shape and strides, the output shape, settings) -> (plan, a's uid, the sum's uid), or None: no engine
_graph_sums: LRU[tuple, Any] = LRU("ops.reduce_graph_sums", 256)


def _per_channel_nhwc(va: Any, vc: Any) -> bool:
    """Whether this is a sum over every dim but dim 1 of a channels-last array (a convolution's bias gradient)."""
    return (
        len(va.shape) > 2
        and va.strides[1] == 1
        and tuple(vc.shape) == (1, va.shape[1]) + (1,) * (len(va.shape) - 2)
        and is_dense(tuple(va.shape), tuple(va.strides))
    )


def _graph_sum(launch: Any, va: Any, vc: Any, alpha: Any, beta: Any) -> bool:
    """:func:`reduce_views`'s sum as a one-node graph (``reduction`` ADD, float32 compute), run through the plan's
    pointer-only :meth:`~cudnnkit.graph.ExecutionPlan.execute_raw`: straight into ``vc`` when it is a packed
    float32 array and the call is a plain sum (alpha 1, beta 0), else into a float32 temporary that
    ``cudnnTransformTensor`` blends into ``vc``. False (nothing run) where no engine takes it (remembered per
    shape), a pointer is not 16-byte aligned (the graph engines' requirement), or the call is neither bfloat16
    (which ``cudnnReduceTensor`` refuses) nor a float16/float32 per-channel sum of a channels-last array.

    Measured on the H200 (cuDNN 9.19): bfloat16 dy ``(64, 64, 56, 56)`` channels-last: 36 us against 306 us for
    the float32-copy route, and torch's ``sum`` 53 us; a float32 dy ``(64, 32, 32, 32)`` channels-last (the small
    CNN's bias gradient): ``cudnnReduceTensor`` ran three kernels (38 us) and two size queries and two workspace
    allocations on the host. cuDNN 9.19 takes the channels-last sum over N and space and refuses the C-order one
    (0 engine configs, every shape probed)."""
    if va.ptr % 16 or tuple(vc.shape) == tuple(va.shape):
        return False
    if va.dtype != "bfloat16" and not (va.dtype in ("float16", "float32") and _per_channel_nhwc(va, vc)):
        return False
    from ..graph import Graph
    from ..graph.errors import GraphError

    # the settings filter the engines a build takes (deterministic=True refuses nondeterministic ones)
    key = (launch.device, va.dtype, tuple(va.shape), tuple(va.strides), tuple(vc.shape), current_settings())
    got = _graph_sums.lookup(key)
    if got is MISSING:
        try:  # (a dim whose strides pass int64 is refused here too: the legacy call then names the array)
            g = Graph(name=f"reduce_add_{va.dtype}")
            a = g.tensor(va.shape, va.strides, va.dtype, name="a")
            y = g.reduction(a, vc.shape, mode="add", compute_dtype="float32", dtype="float32")
            g.mark_output(y, strides=contiguous_strides(tuple(vc.shape)))  # packed, as the temporary is described
            plan = g.build(device=launch.device)
            got = (plan, tuple(u == a.uid for u in plan.bindable_uids))
        except (GraphError, lib.CudnnError) as e:  # no engine here: cudnnReduceTensor, from now on
            _log.debug("reduce_tensor: no graph engine sums %s %s -> %s (%s)", va.dtype, va.shape, vc.shape,
                       str(e).splitlines()[0])  # fmt: skip
            got = None
        got = _graph_sums.put(key, got, count_miss=True)
    if got is None:
        return False
    plan, order = got
    s32 = contiguous_strides(tuple(vc.shape))
    direct = (
        vc.dtype == "float32"
        and tuple(vc.strides) == s32
        and vc.ptr % 16 == 0
        and alpha is scaling_ref("float32", 1.0)
        and beta is scaling_ref("float32", 0.0)
    )
    tmp = None
    if direct:
        out_ptr = vc.ptr
    else:
        tmp, v32 = launch.empty(tuple(vc.shape), "float32", s32, name="out")
        out_ptr = v32.ptr
    ws, ws_ptr = launch.workspace(plan.workspace_size)
    with launch.on_device():
        plan.execute_raw(launch.handle.ptr, [va.ptr if is_a else out_ptr for is_a in order], ws_ptr)
    if not direct:
        lib.cudnnTransformTensor(launch.handle, alpha, tensor_descriptor("float32", tuple(vc.shape), s32), out_ptr,
                                 beta, _desc(vc), vc.ptr)  # fmt: skip
    del tmp, ws
    return True


def _reduce_nothing(launch: Any, op: str, nan: int, indices: bool, va: Any, vc: Any, alpha: Any, beta: Any) -> Any:
    """:func:`reduce_views` of a reduction over size-1 dims only (see there): ``a`` stacked on a new leading dim
    of size 2 with its second slice (contiguous, so ``cudnnSetTensor`` takes it as a flat 4-d tensor: it refuses
    8-d descriptors, measured), reduced over that dim."""
    from ..runtime import driver

    h = launch.handle
    shape, a_strides, c_strides = tuple(va.shape), tuple(va.strides), tuple(vc.strides)
    if len(shape) == 8:  # cuDNN's 8-dim limit: drop a size-1 dim (a and c have the same ones), then stack
        k = next((i for i, d in enumerate(shape) if d == 1), None)
        if k is None:
            raise ValueError(f"reduce_tensor: axes=() on a {len(shape)}-dim array reduces nothing; cuDNN refuses that")
        shape = shape[:k] + shape[k + 1 :]
        a_strides, c_strides = a_strides[:k] + a_strides[k + 1 :], c_strides[:k] + c_strides[k + 1 :]
    n = math.prod(shape)
    two = (2, *shape)
    strides = contiguous_strides(two)
    size = itemsize(va.dtype)
    a_desc = tensor_descriptor(va.dtype, shape, a_strides)
    slice_desc = tensor_descriptor(va.dtype, shape, strides[1:])
    flat = tensor_descriptor(va.dtype, (1, n, 1, 1), (n, 1, 1, 1))
    buf, vb = launch.empty(two, va.dtype, strides, name="a")
    one, zero = scaling_ref(va.dtype, 1.0), scaling_ref(va.dtype, 0.0)
    second = vb.ptr + n * size
    lib.cudnnTransformTensor(h, one, a_desc, va.ptr, zero, slice_desc, vb.ptr)
    if op in _IDENTITY:
        lib.cudnnSetTensor(h, flat, second, scaling_ref(va.dtype, _IDENTITY[op]))
    else:
        lib.cudnnTransformTensor(h, one, a_desc, va.ptr, zero, slice_desc, second)
    reduce_views(launch, op, nan, False, Raw(va.dtype, two, strides, vb.ptr),
                 Raw(vc.dtype, (1, *shape), (n, *c_strides), vc.ptr), alpha, beta)  # fmt: skip
    del buf
    if not indices:
        return None
    m = math.prod(vc.shape)
    idx, vi = launch.empty((m,), "int32", name="indices")
    with launch.on_device():
        driver.memset_async(vi.ptr, m * 4, launch.stream)  # the only element of each slice: index 0
    return idx


def _reduce_call(c: Call) -> None:
    r = c.resolved
    got = reduce_views(c.launch, r.op, r.nan, r.indices, c.views["a"], c.views["out"], c.alpha, c.beta)
    if r.indices:
        c.extra["indices"] = got[: math.prod(r.shape)].reshape(r.shape)


REDUCE_TENSOR_OP = register(
    Primitive(
        "reduce_tensor",
        inputs=(Operand("a", _DTYPES, packed=True),),
        outputs=(Output("out", shape=lambda r: r.shape, packed=True, blend=("alpha", "beta")),),
        resolve=_reduce_resolve,
        legacy=_reduce_call,
        extras=("indices",),
        empty=lambda r: False,
        family="reduce_tensor",
        differentiable=("a",),  # L3 "reduce_tensor": the backward is composed of L2 calls (and host arithmetic)
        residuals=("a", "out"),
    )
)


def reduce_tensor(
    a: Any,
    op: str = "add",
    *,
    axes: int | Sequence[int] | None = None,
    indices: bool = False,
    propagate_nan: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """``c = alpha * reduce(a) + beta * out`` over ``axes`` (see the module docstring); ``(c, indices)`` with
    ``indices=True``. ``cudnnReduceTensor`` (primitive ``reduce_tensor``); bfloat16 runs as float32 copies
    (cuDNN 9.19 reduces no bfloat16, measured on an H200).

    Args:
        a: the array to reduce, 1 to 8 dims; float16, bfloat16, float32 or float64.
        op: ``"add"``, ``"mul"``, ``"min"``, ``"max"``, ``"amax"``, ``"avg"``, ``"norm1"``, ``"norm2"`` or
            ``"mul_no_zeros"``.
        axes: the dims to reduce, an int or a sequence; None: all.
        indices: also return the flat index within each reduced slice of the element chosen (min and max only).
        propagate_nan: min/max-type ops return NaN where one is read.
        out: a C-contiguous array of the reduced shape and ``a``'s dtype; None allocates ``c``.
        alpha: scale of the reduction.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``c``, ``a``'s rank with size 1 on the reduced dims, ``a``'s dtype; with ``indices=True``
        ``(c, indices)``, ``indices`` int32 of ``c``'s shape.

    Example:
        >>> s = ops.reduce_tensor(a, "add", axes=(2, 3))                   # (N, C, 1, 1)
        >>> m, idx = ops.reduce_tensor(a, "max", axes=1, indices=True)
    """
    kw = dict(op=op, axes=axes, indices=indices, propagate_nan=propagate_nan, out=out, alpha=alpha, beta=beta)
    c, idx = run(REDUCE_TENSOR_OP, {"a": a}, stream=stream, **kw)
    return (c, idx) if indices else c


# ----------------------------------------------------------------- the L3 declarations
#
# cuDNN has no backward for either call: the gradients are composed of L2 calls -- the ones above, tensor.py's
# (transform_tensor to scale and pad, add_tensor to broadcast, set_tensor for zeros) and activation_backward, whose
# ReLU mode is the one comparison cuDNN has (:func:`_step`: ``dy`` where ``d > 0``, else 0). Never the arrays' own
# operators: the arrays are whatever the L2 ops take, cudnnkit's own DeviceArray (inside an XLA handler) included,
# which has none. cuDNN has no elementwise division at all: the gradients that divide (sqrt's ``dc / c``;
# reduce_tensor's min, max and amax, shared among ties, norm2, mul and mul_no_zeros) are computed on the host in
# float64 (_diff.host_values / from_host: the adapter protocol's to_numpy and from_numpy, which synchronize).


def _scaled(x: Any, s: float, fresh: bool = False) -> Any:
    """``s * x`` as a new array (``transform_tensor`` with ``alpha=s``; ``x`` itself when ``s == 1`` and ``x`` is
    ``fresh``, a temporary of the backward: a gradient must never be the caller's cotangent)."""
    return x if fresh and s == 1 else transform_tensor(x, alpha=s)


def _sum_to(g: Any, b: Any, s: float, fresh: bool = False) -> Any:
    """``s * g`` summed over the dims ``b`` broadcasts (size 1 in ``b``, not in ``g``): ``b``'s shape, by one
    ``reduce_tensor(op="add", alpha=s)`` (``transform_tensor`` where nothing is broadcast; zeros for an empty
    ``g``)."""
    if 0 in tuple(g.shape):
        return set_tensor(transform_tensor(b), 0.0)
    axes = tuple(i for i, (n, m) in enumerate(zip(g.shape, b.shape)) if n != m)
    return reduce_tensor(g, "add", axes=axes, alpha=s) if axes else _scaled(g, s, fresh)


def _step(dy: Any, d: Any, *, out: Any = None, alpha: float = 1.0, beta: float = 0.0) -> Any:
    """``alpha * (dy where d > 0, else 0) + beta * out`` (``dy`` and ``d`` of one shape): cudnnActivationBackward's
    ReLU with ``d`` as both its x and its y (relu(d) > 0 exactly where d > 0; 0 at d == 0 and for a NaN)."""
    return activation_backward(dy, d, d, "relu", out=out, alpha=alpha, beta=beta)


def _signed(dy: Any, d: Any) -> Any:
    """``sign(d) * dy`` (0 where d is 0): :func:`_step` of ``d`` minus :func:`_step` of ``-d``, blended into one
    new array."""
    s = _step(dy, d)
    nd = transform_tensor(d, alpha=-1.0)
    return _step(dy, nd, out=s, alpha=-1.0, beta=1.0)


def _op_residuals(op: str, a: Any, b: Any, c: Any) -> dict[str, Any]:
    """What each op's backward reads: add b (its shape), mul/min/max a and b, sqrt c; not (linear) keeps a only
    as an array on the device (a reference, no copy)."""
    if op == "add":
        return {"b": b}
    if op in ("mul", "min", "max"):
        return {"a": a, "b": b}
    return {"out": c} if op == "sqrt" else {"a": a}


def _op_l3_forward(a: Any, b: Any = None, *, op: str = "add", alpha1: float = 1.0, alpha2: float = 1.0,
                   propagate_nan: bool = False) -> Any:  # fmt: skip
    """``c = op(alpha1 * a, alpha2 * b)`` (sqrt/not: of ``alpha1 * a``; b None): one :func:`op_tensor`
    (``cudnnOpTensor``); c has a's shape and dtype, C-contiguous."""
    c = op_tensor(a, b, op=op, alpha1=alpha1, alpha2=alpha2, propagate_nan=propagate_nan)
    return (c,), _op_residuals(op, a, b, c)


def _op_l3_backward(res: Any, douts: Any, needs: Any, *, op: str = "add", alpha1: float = 1.0, alpha2: float = 1.0,
                    propagate_nan: bool = False) -> tuple:  # fmt: skip
    """da (a's shape) and db (b's: summed over its broadcast dims by :func:`_sum_to`), with x = alpha1 * a and
    y = alpha2 * b:

    * add: ``da = alpha1 dc`` (transform_tensor), ``db = alpha2 sum(dc)``;
    * mul: ``da = alpha1 alpha2 dc b`` (op_tensor mul, b broadcast), ``db = alpha1 alpha2 sum(dc a)``;
    * max (min): dc goes to the larger (smaller) of x and y, half to each where they are equal (torch.maximum's
      and torch.minimum's rule): with ``s = sign(x - y) dc`` (op_tensor for x - y, b broadcast, then
      :func:`_signed`), ``da = alpha1 (dc +- s) / 2`` and ``db = alpha2 sum((dc -+ s) / 2)`` (op_tensor adds);
    * sqrt: ``da = alpha1 dc / (2 c)``, on the host (cuDNN has no division: :func:`~cudnnkit.ops._diff.host_values`);
    * not (``c = 1 - x``): ``da = -alpha1 dc``."""
    (dc,) = douts
    b = res.get("b")
    need_a, need_b = bool(needs[0]), bool(needs[1]) and b is not None
    if dc is None or not (need_a or need_b):
        return (None, None)
    da = db = None
    if op == "add":
        da = _scaled(dc, alpha1) if need_a else None
        db = _sum_to(dc, b, alpha2) if need_b else None
    elif op == "mul":
        s = alpha1 * alpha2
        da = op_tensor(dc, b, op="mul", alpha1=s) if need_a else None
        db = _sum_to(op_tensor(dc, res["a"], op="mul"), b, s, fresh=True) if need_b else None
    elif op in ("min", "max"):
        # s = sign(x - y) dc: dc where x wins a max (loses a min), -dc where y does, 0 at a tie
        s = _signed(dc, op_tensor(res["a"], b, op="add", alpha1=alpha1, alpha2=-alpha2))
        sgn = 1.0 if op == "max" else -1.0
        if need_a:
            da = op_tensor(dc, s, op="add", alpha1=0.5 * alpha1, alpha2=sgn * 0.5 * alpha1)
        if need_b:
            db = _sum_to(op_tensor(dc, s, op="add", alpha1=0.5, alpha2=-sgn * 0.5), b, alpha2, fresh=True)
    elif op == "sqrt":
        import numpy as np

        g, c = host_values(dc, "dc"), host_values(res["out"], "out")
        with np.errstate(divide="ignore", invalid="ignore"):  # c == 0: inf or NaN, as torch.sqrt's gradient
            da = from_host(0.5 * alpha1 * g / c, dc, "dc")
    else:  # not
        da = _scaled(dc, -alpha1)
    return (da if need_a else None, db)


def _op_l3_meta(a: Spec, b: Spec | None = None, *, op: str = "add", alpha1: float = 1.0, alpha2: float = 1.0,
                propagate_nan: bool = False) -> Any:  # fmt: skip
    """c as :func:`op_tensor` allocates it (a's shape and dtype, C order), after op_tensor's own checks."""
    for name, s in (("a", a), ("b", b)):
        if s is not None:
            check_dtype(s, name, _DTYPES, "op_tensor")
    check_scalar(alpha1, "alpha1", dtype=a.dtype)
    r = _op_resolve({"a": spec_view(a), "b": spec_view(b)}, dict(op=op, alpha2=alpha2, propagate_nan=propagate_nan))
    c = Spec(r.shape, contiguous_strides(r.shape), a.dtype)
    return (c,), _op_residuals(r.op, a, b, c)


OP_TENSOR_L3 = differentiable(
    Differentiable("op_tensor", "op_tensor", ("a", "b"), ("out",), _op_l3_forward, _op_l3_backward, _op_l3_meta,
                   doc="""c = op(alpha1 * a, alpha2 * b) (add, mul, min, max; b broadcast: each of its dims a's or
1) or op(alpha1 * a) (sqrt, not = 1 - x; b None); a and b of one float dtype, 1 to 5 dims; c a's shape and dtype,
C-contiguous. Forward: one cudnnOpTensor (op_tensor). Backward: cudnnOpTensor, cudnnReduceTensor (the sums over b's
broadcast dims) and cudnnTransformTensor (scalings) calls; min/max route dc by the sign of x - y
(cudnnActivationBackward's ReLU: half to each at ties, as torch.maximum/minimum); sqrt divides by c on the host
(cuDNN has no division; synchronizes). Residuals: add b; mul, min, max a and b; sqrt out; not a (for its device
only).""")
)  # fmt: skip


#: the reductions whose backward reads the output too
_READS_OUT = ("mul", "mul_no_zeros", "min", "max", "amax", "norm2")


def _reduce_residuals(op: str, a: Any, c: Any) -> dict[str, Any]:
    return {"a": a, "out": c} if op in _READS_OUT else {"a": a}


def _broadcast(dc: Any, a: Any, s: float) -> Any:
    """``s * dc`` (``a``'s shape with 1 on the reduced dims) broadcast to ``a``'s shape: a new C-order array,
    ``transform_tensor`` padding dc out to a's shape (the allocation) then ``add_tensor`` (``cudnnAddTensor``,
    beta 0: the padded values are not read) writing ``s * dc`` over all of it; more than 5 dims (add_tensor's
    limit) run merged (the size-1 dims dropped, neighbouring reduced or kept dims as one)."""
    shape, small = tuple(a.shape), tuple(dc.shape)
    if shape == small:
        return _scaled(dc, s)
    out = transform_tensor(dc, pad_after=tuple(n - m for n, m in zip(shape, small)))
    if len(shape) <= 5:
        return add_tensor(dc, out, alpha=s, beta=0.0)  # out
    groups: list[list[int]] = []  # [size in a, size in dc] of each merged dim
    for n, m in zip(shape, small):
        if n != 1:
            if groups and (groups[-1][1] == 1) == (m == 1):
                groups[-1][0] *= n
                groups[-1][1] *= m
            else:
                groups.append([n, m])
    if len(groups) > 5:
        raise NotImplementedError(
            f"reduce_tensor's backward broadcasts dc {small} to a {shape} with cudnnAddTensor (5 dims at most): the "
            f"reduced axes leave {len(groups)} alternating groups of dims; reduce fewer, or neighbouring, axes"
        )
    add_tensor(dc.reshape(tuple(m for _, m in groups)), out.reshape(tuple(n for n, _ in groups)), alpha=s, beta=0.0)
    return out


def _reduce_l3_forward(a: Any, *, op: str = "add", axes: int | Sequence[int] | None = None,
                       propagate_nan: bool = False) -> Any:  # fmt: skip
    """``c = reduce(a)`` over ``axes`` (c keeps a's rank, 1 on the reduced dims; a's dtype, C-contiguous): one
    :func:`reduce_tensor` (``cudnnReduceTensor``, no indices)."""
    c = reduce_tensor(a, op, axes=axes, propagate_nan=propagate_nan)
    return (c,), _reduce_residuals(op, a, c)


def _reduce_l3_backward(res: Any, douts: Any, needs: Any, *, op: str = "add",
                        axes: int | Sequence[int] | None = None, propagate_nan: bool = False) -> tuple:  # fmt: skip
    """da (a's shape):

    * add: dc broadcast (:func:`_broadcast`: transform_tensor and add_tensor); avg: dc / n broadcast (n the
      reduced count); norm1: ``sign(a) dc`` broadcast (:func:`_signed`, cudnnActivationBackward);
    * on the host (float64; cuDNN has no division), with c and dc broadcast over the reduced dims: norm2
      ``a dc / c`` (0 where c is 0, as torch's norm); max, min: dc shared evenly among the elements equal to c
      (torch.amax's and amin's rule); amax (the largest ``|a|``): the same times ``sign(a)``; mul: torch.prod's
      gradient, zeros included: ``dc c / a`` in a slice without zeros; with one zero, the product of the others at
      the zero and 0 elsewhere; with more, 0; mul_no_zeros (the product of the non-zero values): ``dc c / a`` at
      the non-zero values, 0 at the zeros."""
    (dc,) = douts
    if dc is None or not needs[0]:
        return (None,)
    a, c = res["a"], res.get("out")
    if op in ("add", "avg"):
        n = math.prod(a.shape) // math.prod(dc.shape)
        return (_broadcast(dc, a, 1.0 if op == "add" else 1.0 / n),)
    if op == "norm1":
        return (_signed(_broadcast(dc, a, 1.0), a),)
    return (from_host(_reduce_gradient(op, host_values(a, "a"), host_values(c, "out"), host_values(dc, "dc")), a,
                      "a"),)  # fmt: skip


def _reduce_gradient(op: str, a: Any, c: Any, dc: Any) -> Any:
    """:func:`_reduce_l3_backward`'s host formulas, on float64 NumPy arrays (``c`` and ``dc``: a's rank, 1 on the
    reduced dims, broadcast by NumPy)."""
    import numpy as np

    axes = tuple(i for i, m in enumerate(dc.shape) if m == 1)  # the reduced dims (and a's size-1 ones: no matter)
    with np.errstate(divide="ignore", invalid="ignore"):
        if op == "norm2":
            return a * (dc / np.where(c == 0, 1.0, c))
        if op in ("min", "max", "amax"):
            m = (np.abs(a) if op == "amax" else a) == c
            q = dc / m.sum(axis=axes, keepdims=True)  # dc / the count of ties
            return q * m * (np.sign(a) if op == "amax" else 1.0)
        z = a == 0
        a1 = np.where(z, 1.0, a)  # the zeros as 1
        if op == "mul_no_zeros":
            return dc * (c / a1) * ~z
        zeros = z.sum(axis=axes, keepdims=True)  # the count per slice
        others = np.prod(a1, axis=axes, keepdims=True)  # the product of the non-zero values
        return dc * (c / a1 + others * (z & (zeros == 1)))


def _reduce_l3_meta(a: Spec, *, op: str = "add", axes: int | Sequence[int] | None = None,
                    propagate_nan: bool = False) -> Any:  # fmt: skip
    """c as :func:`reduce_tensor` allocates it (a's rank with 1 on the reduced dims, a's dtype, C order), after
    reduce_tensor's own checks."""
    check_dtype(a, "a", _DTYPES, "reduce_tensor")
    r = _reduce_resolve({"a": spec_view(a)}, dict(op=op, axes=axes, propagate_nan=propagate_nan))
    c = Spec(r.shape, contiguous_strides(r.shape), a.dtype)
    return (c,), _reduce_residuals(r.op, a, c)


REDUCE_TENSOR_L3 = differentiable(
    Differentiable("reduce_tensor", "reduce_tensor", ("a",), ("out",), _reduce_l3_forward, _reduce_l3_backward,
                   _reduce_l3_meta,
                   doc="""c = reduce(a) over axes (default: all), keeping a's rank with 1 on the reduced dims (a's
float dtype, 1 to 8 dims, C-contiguous), for op in add, mul, min, max, amax, avg, norm1, norm2, mul_no_zeros: one
cudnnReduceTensor (reduce_tensor; no indices output). The backward broadcasts dc with cudnnAddTensor (add, avg;
norm1 then signs it with cudnnActivationBackward); the gradients that divide are computed on the host in float64
(cuDNN has no division; synchronizes): max, min, amax (shared evenly among ties, as torch.amax), norm2, and mul
(torch.prod's gradient, zeros included) and mul_no_zeros (see _reduce_l3_backward). Residuals: a, and out for mul,
mul_no_zeros, min, max, amax and norm2.""")
)  # fmt: skip
