"""Bad input to the tensor, LRN, divisive-normalization and dropout ops, refused on the CPU before any cuDNN call."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops

from .conftest import FakeCAI


def x(shape=(2, 3, 4, 5), typestr="<f4", device=0):
    return FakeCAI(shape, typestr, device=device)


CASES = [
    # tensor helpers
    (lambda: ops.set_tensor(np.zeros(3), 1.0), TypeError, "^y is a host array"),
    (lambda: ops.set_tensor(x(typestr="<i4"), 1), TypeError, "y has dtype int32; set_tensor needs"),
    (lambda: ops.transform_tensor(x(typestr="|i1")), TypeError, "x has dtype int8; transform_tensor needs"),
    (lambda: ops.scale_tensor(x(typestr="<i4"), 2.0), TypeError, "y has dtype int32; scale_tensor needs"),
    (lambda: ops.add_tensor(x((1, 3, 1, 1), "<f8"), x()), TypeError, "a has dtype float64 but c has dtype float32"),
    (lambda: ops.add_tensor(x((3, 1, 1)), x()), ValueError, "a has 3 dims but c has 4"),
    (lambda: ops.add_tensor(x((1, 2, 1, 1)), x()), ValueError, "a's dim 1 is 2; it must equal c's \\(3\\) or be 1"),
    (lambda: ops.add_tensor(x((1,) * 6), x((2,) * 6)), ValueError, "at most 5 dims"),
    (lambda: ops.add_tensor(x(device=1), x()), ValueError, "c is on cuda:0 but a is on cuda:1"),
    (lambda: ops.transform_tensor(x(), layout="chwn"), ValueError, "layout must be one of"),
    (lambda: ops.transform_tensor(x((4, 5)), layout="nhwc"), ValueError, "needs at least 3 dims"),
    (lambda: ops.transform_tensor(x(), pad_before=-1), ValueError, "pad_before must be >= 0"),
    (lambda: ops.transform_tensor(x(), pad_after=(1, 1)), ValueError, "pad_after must have 4 values"),
    (lambda: ops.transform_tensor(x(), out=x((2, 3, 4, 6))), ValueError, "out must have shape \\(2, 3, 4, 5\\)"),
    (lambda: ops.transform_tensor(x(), beta=1.0), ValueError, "beta != 0 blends into an existing output"),
    # LRN / divisive normalization
    (lambda: ops.lrn_forward(x(), size=0), ValueError, "size must be in \\[1, 16\\]"),
    (lambda: ops.lrn_forward(x(), size=17), ValueError, "size must be in \\[1, 16\\]"),
    (lambda: ops.lrn_forward(x(), size=5.0), TypeError, "size must be an int"),
    (lambda: ops.lrn_forward(x(), k=0.0), ValueError, "k must be >= 1e-05"),
    (lambda: ops.lrn_forward(x(), beta=0.001), ValueError, "beta must be >= 0.01"),
    (lambda: ops.lrn_forward(x((2, 3))), ValueError, "x must have 3 to 8 dims"),
    (lambda: ops.lrn_forward(x(typestr="<i4")), TypeError, "x has dtype int32; normalization needs"),
    (lambda: ops.lrn_forward(np.ones((2, 3, 4), np.float32)), TypeError, "^x is a host array"),
    (lambda: ops.lrn_backward(x(), x((2, 3, 4, 6)), x()), ValueError, "y has shape \\(2, 3, 4, 6\\) but dy has"),
    (lambda: ops.lrn_backward(x(), x(), x(typestr="<f2")), TypeError, "x has dtype float16 but dy has dtype float32"),
    (lambda: ops.lrn_backward(x(), x(), x(device=1)), ValueError, "x is on cuda:1 but dy is on cuda:0"),
    (lambda: ops.divisive_normalization_forward(x(), x((2, 3, 4, 4))), ValueError, "means has shape"),
    (
        lambda: ops.divisive_normalization_forward(x(), FakeCAI((2, 3, 4, 5), strides=(4, 160, 40, 8)), out=x()),
        ValueError,
        "means must be laid out as \\(60, 20, 5, 1\\) for cuDNN .* no cudnnkit adapter",
    ),
    (
        lambda: ops.divisive_normalization_forward(x(), out=FakeCAI((2, 3, 4, 5), strides=(4, 160, 40, 8))),
        ValueError,
        "out must be laid out like the inputs as cuDNN sees them",
    ),
    (
        lambda: ops.divisive_normalization_backward(
            x(), x(), x(), dx_out=x(), dmeans_out=FakeCAI((2, 3, 4, 5), strides=(4, 160, 40, 8))
        ),
        ValueError,
        "dmeans_out must be laid out like the inputs",
    ),
    (lambda: ops.divisive_normalization_backward(x(), x(), dmeans_out=x()), ValueError, "dmeans_out needs means"),
    (lambda: ops.divisive_normalization_backward(x(), x(), x(), size=20), ValueError, "size must be in"),
    # dropout
    (lambda: ops.dropout_forward(x(), 1.0), ValueError, "p must be in \\[0, 1\\), got 1.0"),
    (lambda: ops.dropout_forward(x(), -0.1), ValueError, "p must be in \\[0, 1\\)"),
    (lambda: ops.dropout_forward(x(), "0.5"), TypeError, "p must be a float"),
    (lambda: ops.dropout_forward(x(typestr="<i4"), 0.5), TypeError, "x has dtype int32; dropout needs"),
    (lambda: ops.dropout_forward(np.ones(3, np.float32), 0.5), TypeError, "^x is a host array"),
    (lambda: ops.dropout_backward(x(), x((10,), "<f4"), 0.5), TypeError, "reserve must be the 1-d uint8 array"),
    (lambda: ops.dropout_backward(x(), x((10,), "|u1"), 1.5), ValueError, "p must be in"),
    (lambda: ops.dropout_backward(x(), x((10,), "|u1", device=1), 0.5), ValueError, "reserve is on cuda:1"),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
