"""Activations on the CPU: the float64 references against torch, bad input refused before any cuDNN call, the
descriptor read back from cuDNN."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnkit import lib, ops
from cudnnkit.ops import activation as act

from . import act_reference as ref
from .conftest import FakeCAI


@pytest.mark.parametrize("mode, coef", [("sigmoid", None), ("relu", None), ("tanh", None), ("clipped_relu", 1.5),
                                        ("elu", 0.7), ("swish", 1.3), ("gelu", None), ("gelu_tanh", None),
                                        ("softplus", 1.7), ("leaky_relu", 0.2)])  # fmt: skip
def test_references_agree_with_torch(mode, coef):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # away from relu's kink
    xt = torch.tensor(x, requires_grad=True)
    fn = {
        "sigmoid": torch.sigmoid,
        "relu": F.relu,
        "tanh": torch.tanh,
        "clipped_relu": lambda t: torch.clamp(t, 0.0, coef),
        "elu": lambda t: F.elu(t, coef),
        "swish": lambda t: t * torch.sigmoid(coef * t),
        "gelu": F.gelu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "softplus": lambda t: F.softplus(t, coef, threshold=1e9),
        "leaky_relu": lambda t: F.leaky_relu(t, coef),
    }[mode]
    yt = fn(xt)
    assert np.allclose(ref.act_forward(x, mode, coef), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(x.shape)
    yt.backward(torch.tensor(dy))
    assert np.allclose(ref.act_backward(x, dy, mode, coef), xt.grad.numpy(), rtol=1e-12, atol=1e-12)


def x(shape=(2, 3, 4), typestr="<f4", device=0):
    return FakeCAI(shape, typestr, device=device)


CASES = [
    (lambda: ops.activation_forward(x(), "gelux"), ValueError, "mode must be one of"),
    (lambda: ops.activation_forward(x(), "softplus", coef=0.0), ValueError, "softplus's beta.* must be > 0"),
    (lambda: ops.activation_forward(x(typestr="<f8"), "gelu"), ValueError, "lone pointwise graph"),
    (lambda: ops.activation_forward(x(), "clipped_relu"), ValueError, "needs coef="),
    (lambda: ops.activation_forward(x(), "clipped_relu", coef=-1.0), ValueError, "must be > 0"),
    (lambda: ops.activation_forward(x(), "relu", coef=2.0), ValueError, "coef is for clipped_relu"),
    (lambda: ops.activation_forward(x(), "elu", coef="a"), TypeError, "coef must be a real number"),
    (lambda: ops.activation_forward(x(), "elu", coef=float("inf")), ValueError, "coef must be finite"),
    (lambda: ops.activation_forward(x(), propagate_nan=1), TypeError, "propagate_nan must be a bool"),
    (lambda: ops.activation_forward(x(typestr="<i4")), TypeError, "x has dtype int32"),
    (lambda: ops.activation_forward(x(), out=x((2, 3, 5))), ValueError, "out must have shape"),
    (lambda: ops.activation_backward(x(), x((2, 3, 5)), x()), ValueError, "y has shape .* but dy has shape"),
    (lambda: ops.activation_backward(x(), x(), x(typestr="<f2")), TypeError, "x has dtype float16 but dy"),
    (lambda: ops.activation_forward(np.ones(3, np.float32)), TypeError, "^x is a host array"),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


@pytest.mark.parametrize("mode, coef, nan", [("relu", None, True), ("clipped_relu", 6.0, False), ("elu", 0.5, False),
                                             ("swish", 1.7, False), ("sigmoid", None, False)])  # fmt: skip
def test_descriptor_reads_back(mode, coef, nan):
    d = act.activation_descriptor(mode, nan, coef)
    m, n, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_double()
    lib.cudnnGetActivationDescriptor(d, ctypes.byref(m), ctypes.byref(n), ctypes.byref(c))
    assert m.value == act._MODES[mode]
    assert n.value == (lib.CUDNN_PROPAGATE_NAN if nan else lib.CUDNN_NOT_PROPAGATE_NAN)
    if mode in ("clipped_relu", "elu"):
        assert c.value == coef
    if mode == "swish":
        b = ctypes.c_double()
        lib.cudnnGetActivationDescriptorSwishBeta(d, ctypes.byref(b))
        assert b.value == coef


def test_graph_only_modes_are_refused_with_where_they_run():
    """gelu, softplus, leaky_relu have no lone-pointwise engine on cuDNN 9.19: refused by name, pointing at the
    fused convolution; their resolved form (used there) is still checked."""
    with pytest.raises(ValueError, match="no engine for a lone pointwise graph.*activation='gelu'"):
        ops.activation_forward(x(), "gelu", out=x())
    assert act.resolve_activation("leaky_relu").coef == 0.01 and act.resolve_activation("relu").descriptor
    assert act.resolve_activation("gelu").descriptor is None
    assert act.ACTIVATION_FORWARD.forms == ("legacy",)
