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
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from .. import lib
from ..runtime import DescriptorKind, check_choice, cudnn_dtype, get_cached, tensor_descriptor
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import FLOATS, check_scalar, itemsize, nan_propagation, scaling_ref
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["op_tensor", "reduce_tensor"]

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
    ``op_tensor``). ``alpha1``/``alpha2`` are cuDNN's names for the two inputs' scales."""
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
    if va.dtype == "bfloat16":
        s32 = contiguous_strides(va.shape)
        t32, a32 = launch.empty(va.shape, "float32", s32, name="a")
        lib.cudnnTransformTensor(h, one, _desc(va), va.ptr, zero, tensor_descriptor("float32", va.shape, s32), a32.ptr)
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
    ``indices=True``. ``cudnnReduceTensor`` (primitive ``reduce_tensor``)."""
    kw = dict(op=op, axes=axes, indices=indices, propagate_nan=propagate_nan, out=out, alpha=alpha, beta=beta)
    c, idx = run(REDUCE_TENSOR_OP, {"a": a}, stream=stream, **kw)
    return (c, idx) if indices else c
