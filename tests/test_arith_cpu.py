"""op_tensor and reduce_tensor on the CPU: bad input refused before any cuDNN call, descriptors read back."""

from __future__ import annotations

import ctypes

import pytest

from cudnnkit import lib, ops
from cudnnkit.ops import arith

from .conftest import FakeCAI


def x(shape=(2, 3, 4, 5), typestr="<f4", device=0):
    return FakeCAI(shape, typestr, device=device)


CASES = [
    (lambda: ops.op_tensor(x(), x(), op="sub"), ValueError, "op must be one of"),
    (lambda: ops.op_tensor(x()), TypeError, "op='add' is binary: b is required"),
    (lambda: ops.op_tensor(x(), x(), op="sqrt"), ValueError, "op='sqrt' is unary"),
    (lambda: ops.op_tensor(x(), x((2, 3, 4))), ValueError, "b has 3 dims but a has 4"),
    (lambda: ops.op_tensor(x(), x((2, 2, 1, 1))), ValueError, r"b's dim 1 is 2; it must equal a's \(3\) or be 1"),
    (lambda: ops.op_tensor(x(), x((1, 3, 1, 1), "<f8")), TypeError, "b has dtype float64 but a has"),
    (lambda: ops.op_tensor(x(), x(), alpha2="a"), TypeError, "alpha2 must be a real number"),
    (lambda: ops.op_tensor(x(), x(), propagate_nan=1), TypeError, "propagate_nan must be a bool"),
    (lambda: ops.op_tensor(x(), x(), out=x((2, 3, 4, 6))), ValueError, "out must have shape"),
    (lambda: ops.op_tensor(x(), x(), beta=1.0), ValueError, "beta != 0 blends"),
    (lambda: ops.op_tensor(x(typestr="<i4"), x()), TypeError, "a has dtype int32"),
    (lambda: ops.reduce_tensor(x(), "sum"), ValueError, "op must be one of"),
    (lambda: ops.reduce_tensor(x(), axes=4), ValueError, "axis 4 is out of range for 4 dims"),
    (lambda: ops.reduce_tensor(x(), axes=(1, -3)), ValueError, "axis -3 is given twice"),
    (lambda: ops.reduce_tensor(x(), axes="1"), TypeError, "axes must hold ints"),
    (lambda: ops.reduce_tensor(x(), "add", indices=True), ValueError, "indices=True is for op in"),
    (lambda: ops.reduce_tensor(x(), indices=1), TypeError, "indices must be a bool"),
    (lambda: ops.reduce_tensor(x((0, 3))), ValueError, "cuDNN reduces non-empty tensors only"),
    (lambda: ops.reduce_tensor(x(), axes=1, out=x()), ValueError, r"out must have shape \(2, 1, 4, 5\)"),
    (lambda: ops.reduce_tensor(x((1,) * 9)), ValueError, "a must have 1 to 8 dims"),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.mark.parametrize("op", sorted(arith._OPS))
def test_op_descriptor_reads_back(op):
    desc = arith.get_cached(arith.OP_TENSOR, (op, "float32", lib.CUDNN_PROPAGATE_NAN))
    o, t, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    lib.cudnnGetOpTensorDescriptor(desc, ctypes.byref(o), ctypes.byref(t), ctypes.byref(n))
    assert (o.value, t.value, n.value) == (arith._OPS[op], lib.CUDNN_DATA_FLOAT, lib.CUDNN_PROPAGATE_NAN)


@pytest.mark.parametrize("op", sorted(arith._REDUCE))
def test_reduce_descriptor_reads_back(op):
    indices = op in arith._WITH_INDICES
    desc = arith.get_cached(arith.REDUCE_TENSOR, (op, "float64", lib.CUDNN_NOT_PROPAGATE_NAN, indices))
    o, t, n, i, it = (ctypes.c_int() for _ in range(5))
    lib.cudnnGetReduceTensorDescriptor(desc, *(ctypes.byref(v) for v in (o, t, n, i, it)))
    assert o.value == arith._REDUCE[op] and t.value == lib.CUDNN_DATA_DOUBLE
    assert i.value == (lib.CUDNN_REDUCE_TENSOR_FLATTENED_INDICES if indices else lib.CUDNN_REDUCE_TENSOR_NO_INDICES)
    assert it.value == lib.CUDNN_32BIT_INDICES
