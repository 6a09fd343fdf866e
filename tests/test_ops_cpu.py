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
    (lambda: ops.lrn_forward(x(), lrn_beta=0.001), ValueError, "lrn_beta must be >= 0.01"),
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
            x(), x(), x(), out=(x(), FakeCAI((2, 3, 4, 5), strides=(4, 160, 40, 8)))
        ),
        ValueError,
        "dmeans_out must be laid out like the inputs",
    ),
    (lambda: ops.divisive_normalization_backward(x(), x(), out=(None, x())), ValueError, "dmeans_out needs means"),
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


# ----------------------------------------------------------------- the uniform names (out=, lrn_alpha/lrn_beta)


def test_multi_output_ops_take_out_as_a_tuple():
    """``out=(a, b)`` is the keyword every multi-output op takes; the per-output keywords still work, with a
    ``DeprecationWarning``; both at once, or a tuple of the wrong length, are a ``TypeError`` naming ``out``."""
    bad = FakeCAI((2, 3, 4, 5), strides=(4, 160, 40, 8))
    with pytest.raises(ValueError, match="dmeans_out must be laid out like the inputs"):
        ops.divisive_normalization_backward(x(), x(), x(), out=(x(), bad))
    with pytest.warns(DeprecationWarning, match=r"dmeans_out= is deprecated; pass out=\(dx_out, dmeans_out\)"):
        with pytest.raises(ValueError, match="dmeans_out must be laid out like the inputs"):
            ops.divisive_normalization_backward(x(), x(), x(), dmeans_out=bad)
    with pytest.raises(TypeError, match="pass out= or dx_out=, not both"):
        ops.divisive_normalization_backward(x(), x(), x(), out=(x(), None), dx_out=x())
    with pytest.raises(TypeError, match=r"out must be a tuple of 2 \(\(dx_out, dgrid_out\), .*got a tuple of 1"):
        ops.grid_sample_backward(x(), x((2, 4, 5, 2)), x(), out=(x(),))
    with pytest.raises(TypeError, match="ctc_loss: out must be a tuple of 2 .*got FakeCAI"):
        ops.ctc_loss(x((6, 2, 5)), [1, 2], [1, 1], [6, 6], out=x((2,)))
    with pytest.warns(DeprecationWarning, match="rnn_forward: y_out= is deprecated; pass out="):
        with pytest.raises(TypeError):
            ops.rnn_forward(x((3, 2, 4)), x((100,)), rnn=ops.RNN("gru", 4, 5), y_out=x((3, 2, 5)))
    with pytest.raises(TypeError, match="pass out= or its deprecated name y_out=, not both"):
        ops.rnn_forward(x((3, 2, 4)), x((100,)), rnn=ops.RNN("gru", 4, 5), out=x(), y_out=x())


@pytest.mark.parametrize(
    "call",
    [
        lambda **kw: ops.lrn_forward(x(), **kw),
        lambda **kw: ops.lrn_backward(x(), x(), x(), **kw),
        lambda **kw: ops.divisive_normalization_forward(x(), **kw),
        lambda **kw: ops.divisive_normalization_backward(x(), x(), **kw),
    ],
)
def test_lrn_formula_names(call):
    """The formula's parameters are ``lrn_alpha``/``lrn_beta``, named in their errors; ``alpha=``/``beta=`` are
    still the formula's in 0.2, with a ``FutureWarning`` (they become the output blend in 0.3), and named as
    written; ``lrn_beta`` and ``beta`` together are a ``TypeError``."""
    with pytest.raises(ValueError, match="^lrn_beta must be >= 0.01"):
        call(lrn_beta=0.001)
    with pytest.raises(TypeError, match="^lrn_alpha must be a real number"):
        call(lrn_alpha="1e-4")
    with pytest.warns(FutureWarning, match="alpha=/beta= name the LRN formula's parameters here"):
        with pytest.raises(ValueError, match="^beta must be >= 0.01"):
            call(beta=0.001)
    with pytest.raises(TypeError, match="pass lrn_beta= or its deprecated name beta=, not both"):
        call(lrn_beta=0.5, beta=0.5)
