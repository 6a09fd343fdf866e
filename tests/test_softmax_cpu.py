"""Softmax input validation on the CPU: every bad input is refused before any cuDNN call."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.ops import softmax_backward, softmax_forward

from .conftest import FakeCAI


def x(shape=(2, 3, 4), typestr="<f4", device=0):
    return FakeCAI(shape, typestr, device=device)


@pytest.mark.parametrize(
    "call, exc, msg",
    [
        (lambda: softmax_forward(np.zeros((2, 3), np.float32)), TypeError, "^x is a host array"),
        (lambda: softmax_forward(x(typestr="<i4")), TypeError, "x has dtype int32; softmax needs one of"),
        (lambda: softmax_forward(x(), axis=3), ValueError, "axis 3 is out of range for an array with 3 dims"),
        (lambda: softmax_forward(x(), axis=-4), ValueError, "axis -4 is out of range"),
        (lambda: softmax_forward(x(), axis=(0, 2)), ValueError, "must name distinct adjacent axes"),
        (lambda: softmax_forward(x(), axis=1.0), TypeError, "axis must be an int or a tuple of ints"),
        (lambda: softmax_forward(x(), algo="log"), ValueError, "algo must be one of"),
        (lambda: softmax_forward(x(), algo="fast", log=True), ValueError, "cannot be combined with algo='fast'"),
        (lambda: softmax_forward(x(), beta=1.0), ValueError, "beta != 0 blends into an existing output: pass out="),
        (lambda: softmax_forward(x(), out=x((2, 3, 5))), ValueError, r"out must have shape \(2, 3, 4\)"),
        (lambda: softmax_forward(x(), out=x(typestr="<f2")), ValueError, "dtype float32"),
        (lambda: softmax_forward(x(), out=x(device=1)), ValueError, "out is on cuda:1"),
        (lambda: softmax_forward(x()), TypeError, "without a cudnnkit adapter.*or pass out= yourself"),
        (lambda: softmax_backward(x(), x((2, 3, 5))), ValueError, r"y has shape \(2, 3, 5\) but dy has shape"),
        (lambda: softmax_backward(x(), x(typestr="<f8")), TypeError, "y has dtype float64 but dy has dtype float32"),
        (lambda: softmax_backward(x(), x(device=1)), ValueError, "y is on cuda:1 but dy is on cuda:0"),
        (lambda: softmax_backward(x(), np.zeros((2, 3, 4), np.float32)), TypeError, "^y is a host array"),
        (lambda: softmax_backward(x(), x(), axis=5), ValueError, "axis 5 is out of range"),
        (lambda: softmax_forward(x(())), ValueError, "x must have at least one dim"),
    ],
)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()
