"""Normalization on the CPU: the float64 references against torch, bad input refused before any cuDNN call, the
batch-norm parameter descriptor read back from cuDNN, the declarations."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnkit import lib, ops
from cudnnkit.ops import _primitive as P
from cudnnkit.ops import layer_norm as lnm
from cudnnkit.ops import normalization as nm

from . import norm_reference as ref
from .conftest import FakeCAI

# ----------------------------------------------------------------- the references agree with torch


def _t(torch, a, grad=True):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 6), (3, 4, 5, 6), (2, 3, 4, 3, 2)])
def test_batch_norm_reference_agrees_with_torch(shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    c = shape[1]
    x, dy = rng.standard_normal(shape) * 2 + 0.5, rng.standard_normal(shape)
    s, b = rng.standard_normal(c), rng.standard_normal(c)
    rm, rv = rng.standard_normal(c), rng.uniform(0.5, 2, c)
    xt, st, bt = _t(torch, x), _t(torch, s), _t(torch, b)
    rmt, rvt = torch.tensor(rm), torch.tensor(rv)
    yt = F.batch_norm(xt, rmt, rvt, st, bt, training=True, momentum=0.2, eps=1e-4)
    y, mean, inv, nrm, nrv = ref.bn_forward(x, s, b, 1e-4, running_mean=rm, running_var=rv, momentum=0.2)
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    assert np.allclose(nrm, rmt.numpy(), rtol=1e-12) and np.allclose(nrv, rvt.numpy(), rtol=1e-12)
    ax = ref.bn_axes(len(shape))
    assert np.allclose(mean, x.mean(axis=ax)) and np.allclose(inv, 1 / np.sqrt(x.var(axis=ax) + 1e-4))
    yt.backward(torch.tensor(dy))
    dx, ds, db = ref.bn_backward(dy, x, s, mean, inv)
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-10)
    assert np.allclose(ds, st.grad.numpy(), rtol=1e-10) and np.allclose(db, bt.grad.numpy(), rtol=1e-10)
    yi = F.batch_norm(torch.tensor(x), torch.tensor(rm), torch.tensor(rv), torch.tensor(s), torch.tensor(b),
                      training=False, eps=1e-4)  # fmt: skip
    assert np.allclose(ref.bn_inference(x, s, b, rm, rv, 1e-4), yi.numpy(), rtol=1e-12, atol=1e-12)


def test_per_activation_batch_norm_reference_agrees_with_torch():
    """per_activation: statistics over N alone, i.e. torch's BatchNorm1d over (N, C*H*W)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((6, 3, 2, 4)), rng.standard_normal((6, 3, 2, 4))
    s, b = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4))
    xt, st, bt = _t(torch, x.reshape(6, -1)), _t(torch, s.ravel()), _t(torch, b.ravel())
    yt = F.batch_norm(xt, None, None, st, bt, training=True, eps=1e-5)
    y, mean, inv, _, _ = ref.bn_forward(x, s, b, mode="per_activation")
    assert np.allclose(y.reshape(6, -1), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    yt.backward(torch.tensor(dy.reshape(6, -1)))
    dx, ds, db = ref.bn_backward(dy, x, s, mean, inv, mode="per_activation")
    assert np.allclose(dx.reshape(6, -1), xt.grad.numpy(), rtol=1e-9, atol=1e-10)
    assert np.allclose(ds.ravel(), st.grad.numpy()) and np.allclose(db.ravel(), bt.grad.numpy())


@pytest.mark.parametrize("shape, k", [((6, 16), 1), ((2, 3, 8), 1), ((2, 3, 4, 5), 2), ((3, 4, 5), 2)])
def test_layer_and_rms_norm_references_agree_with_torch(shape, k):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal(shape) * 1.5 + 0.3, rng.standard_normal(shape)
    s, b = rng.standard_normal(shape[-k:]), rng.standard_normal(shape[-k:])
    xt, st, bt = _t(torch, x), _t(torch, s), _t(torch, b)
    yt = F.layer_norm(xt, shape[-k:], st, bt, eps=1e-5)
    y, mean, inv = ref.ln_forward(x, s, b)
    assert mean.shape == shape[:-k] + (1,) * k
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    _, mt, it = torch.ops.aten.native_layer_norm(torch.tensor(x), shape[-k:], torch.tensor(s), torch.tensor(b), 1e-5)
    assert np.allclose(mean, mt.numpy()) and np.allclose(inv, it.numpy())
    yt.backward(torch.tensor(dy))
    dx, ds, db = ref.ln_backward(dy, x, s, mean, inv)
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-10)
    assert np.allclose(ds, st.grad.numpy()) and np.allclose(db, bt.grad.numpy())
    # RMS norm: torch's F.rms_norm
    xt, st = _t(torch, x), _t(torch, s)
    yt = F.rms_norm(xt, shape[-k:], st, eps=1e-5)
    y, inv = ref.rms_forward(x, s)
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    yt.backward(torch.tensor(dy))
    dx, ds = ref.rms_backward(dy, x, s, inv)
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-10) and np.allclose(ds, st.grad.numpy())


@pytest.mark.parametrize("shape", [(2, 3, 7), (3, 4, 5, 6), (2, 3, 2, 3, 4)])
def test_instance_norm_reference_agrees_with_torch(shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal(shape) * 2 - 0.5, rng.standard_normal(shape)
    s, b = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    xt, st, bt = _t(torch, x), _t(torch, s), _t(torch, b)
    yt = F.instance_norm(xt, weight=st, bias=bt, eps=1e-5)
    y, mean, inv = ref.in_forward(x, s, b)
    assert mean.shape == shape[:2]
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    yt.backward(torch.tensor(dy))
    dx, ds, db = ref.in_backward(dy, x, s, mean, inv)
    assert np.allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-10)
    assert np.allclose(ds, st.grad.numpy()) and np.allclose(db, bt.grad.numpy())


# ----------------------------------------------------------------- bad input refused before cuDNN


def a(shape=(4, 3, 5, 5), typestr="<f4", device=0, **kw):
    return FakeCAI(shape, typestr, device=device, **kw)


def c3(typestr="<f4", device=0):
    return a((3,), typestr, device=device)


_RO = FakeCAI((3,), "<f4")
_RO.__cuda_array_interface__["data"] = (0x7F0000000000, True)

CASES = [
    # batch norm
    (lambda: ops.batch_norm_forward(a(), c3(), a((4,))), ValueError, r"bias must have shape \(3,\)"),
    (lambda: ops.batch_norm_forward(a(), c3("<f8"), c3()), TypeError, "scale has dtype float64 but must be float32"),
    (lambda: ops.batch_norm_forward(a((4, 3, 5, 5), "<f2"), c3("<f2"), c3()), TypeError, "scale has dtype float16"),
    (
        lambda: ops.batch_norm_forward(a(typestr="<f8"), c3(), c3()),
        TypeError,
        "scale has dtype float32 but must be float64",
    ),  # fmt: skip
    (lambda: ops.batch_norm_forward(a(typestr="<i4"), c3(), c3()), TypeError, "x has dtype int32"),
    (lambda: ops.batch_norm_forward(a((4,)), a((1,)), a((1,))), ValueError, "x must have 2 to 5 dims"),
    (lambda: ops.batch_norm_forward(a((4, 3, 2, 2, 2, 2)), c3(), c3()), ValueError, "x must have 2 to 5 dims"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), mode="spatiall"), ValueError, "mode must be one of"),
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), mode="per_activation"),
        ValueError,
        r"scale must have shape \(3, 5, 5\)",
    ),  # fmt: skip
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), epsilon=0.0), ValueError, "epsilon must be > 0"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), epsilon=-1e-3), ValueError, "epsilon must be > 0"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), epsilon=float("nan")), ValueError, "epsilon must be finite"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), epsilon="1"), TypeError, "epsilon must be a real number"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), momentum=1.5), ValueError, r"momentum must be in \[0, 1\]"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), momentum=-0.1), ValueError, r"momentum must be in \[0, 1\]"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), training="yes"), TypeError, "training must be a bool"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), training=False), ValueError, "pass running_mean and running_var"),
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=c3()),
        ValueError,
        "pass both running_mean and running_var",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=c3(), running_var=a((4,))),
        ValueError,
        r"running_var must have shape \(3,\)",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=a((3,), strides=(8,)), running_var=c3()),
        ValueError,
        "running_mean must be C-contiguous",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=_RO, running_var=c3()),
        ValueError,
        "running_mean is read-only",
    ),  # fmt: skip
    (lambda: ops.batch_norm_forward(a((1, 3, 1, 1)), c3(), c3()), ValueError, "more than one value per channel"),
    (lambda: ops.batch_norm_forward(a((0, 3, 4, 4)), c3(), c3()), ValueError, "more than one value per channel"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), out=a()), TypeError, r"out must be a tuple of 3"),
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), out=(a(), a((4,)), None)),
        ValueError,
        r"saved_mean must have shape \(3,\)",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), out=(a((4, 3, 5, 4)), c3(), c3())),
        ValueError,
        "y must have shape",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), out=(a(strides=(600, 200, 40, 4)), None, None)),
        ValueError,
        "y must be dense channels-first",
    ),  # fmt: skip
    (
        lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=c3(), running_var=c3(device=1)),
        ValueError,
        "cuda:1",
    ),  # fmt: skip
    (lambda: ops.batch_norm_forward(np.ones((4, 3), np.float32), c3(), c3()), TypeError, "^x is a host array"),
    (lambda: ops.batch_norm_forward(a(), c3(), c3(), eps=1e-3), TypeError, "unexpected keyword argument 'eps'"),
    (lambda: ops.batch_norm_forward(a((2**31, 3)), c3(), c3()), ValueError, "at most 2..31 - 1 elements"),
    (
        lambda: ops.batch_norm_backward(a(), a((4, 3, 5, 4)), c3(), c3(), c3()),
        ValueError,
        "x has shape .* but dy has shape",
    ),  # fmt: skip
    (lambda: ops.batch_norm_backward(a(), a(typestr="<f2"), c3(), c3(), c3()), TypeError, "x has dtype float16 but dy"),
    (lambda: ops.batch_norm_backward(a(), a(), c3(), a((4,)), c3()), ValueError, r"saved_mean must have shape \(3,\)"),
    (lambda: ops.batch_norm_backward(a(), a(), c3(), c3(), c3(), out=(None, None)), TypeError, "out must be a tuple"),
    (
        lambda: ops.batch_norm_backward(a(), a(), c3(), c3(), c3(), out=(None, c3("<f8"), None)),
        TypeError,
        "dscale has dtype float64",
    ),  # fmt: skip
    (lambda: ops.batch_norm_backward(a(), a(), c3(), c3(), c3(), epsilon=0), ValueError, "epsilon must be > 0"),
    (
        lambda: ops.batch_norm_backward(a((0, 3, 2, 2)), a((0, 3, 2, 2)), c3(), c3(), c3()),
        ValueError,
        "non-empty batch",
    ),  # fmt: skip
    # layer / RMS norm
    (lambda: ops.layer_norm_forward(a((4, 8), "<f8"), a((8,), "<f8")), ValueError, "x has dtype float64.*graph API"),
    (lambda: ops.layer_norm_forward(a((4, 8)), a((7,))), ValueError, r"scale must have shape \(8,\)"),
    (lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), a((8,), "<f2")), TypeError, "bias has dtype float16"),
    (lambda: ops.layer_norm_forward(a((4, 8), "<f2"), a((8,), "<f2")), TypeError, "scale has dtype float16"),
    (lambda: ops.layer_norm_forward(a((4, 8)), a((4, 8))), ValueError, "normalized_shape_ndim must be in"),
    (
        lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), normalized_shape_ndim=2),
        ValueError,
        "normalized_shape_ndim must be in",
    ),  # fmt: skip
    (
        lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), normalized_shape_ndim=1.0),
        TypeError,
        "normalized_shape_ndim must be an int",
    ),  # fmt: skip
    (
        lambda: ops.layer_norm_forward(a((2, 4, 8)), a((8,)), normalized_shape_ndim=2),
        ValueError,
        r"scale must have shape \(4, 8\)",
    ),  # fmt: skip
    (lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), epsilon=0.0), ValueError, "epsilon must be > 0"),
    (lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), epsilon=1e300), ValueError, "overflows float32"),
    (lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), training=None), TypeError, "training must be a bool"),
    (lambda: ops.layer_norm_forward(a((0, 8)), a((8,))), ValueError, "non-empty"),
    (
        lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), out=(None, a((4,)), None)),
        ValueError,
        r"mean must have shape \(4, 1\)",
    ),  # fmt: skip
    (
        lambda: ops.layer_norm_forward(a((4, 8)), a((8,)), out=(a((4, 8), strides=(4, 16)), None, None)),
        ValueError,
        "y must be C-contiguous",
    ),  # fmt: skip
    (
        lambda: ops.layer_norm_backward(a((4, 8)), a((4, 8)), a((8,)), a((4, 1)), a((4,))),
        ValueError,
        r"inv_std must have shape \(4, 1\)",
    ),  # fmt: skip
    (
        lambda: ops.layer_norm_backward(a((4, 8)), a((4, 9)), a((8,)), a((4, 1)), a((4, 1))),
        ValueError,
        "x has shape .* but dy has shape",
    ),  # fmt: skip
    (lambda: ops.rms_norm_forward(a((4, 8)), a((8,)), out=(None, None, None)), TypeError, "out must be a tuple of 2"),
    (lambda: ops.rms_norm_forward(a((4, 8), "<f8"), a((8,), "<f8")), ValueError, "float64"),
    (
        lambda: ops.rms_norm_backward(a((4, 8)), a((4, 8)), a((8,)), a((4, 1), "<f2")),
        TypeError,
        "inv_std has dtype float16",
    ),  # fmt: skip
    # instance norm
    (lambda: ops.instance_norm_forward(a((4, 3)), c3(), c3()), ValueError, "x must have 3 to 5 dims"),
    (lambda: ops.instance_norm_forward(a(), a((4,)), c3()), ValueError, r"scale must have shape \(3,\)"),
    (lambda: ops.instance_norm_forward(a(typestr="<f8"), c3("<f8"), c3("<f8")), ValueError, "float64"),
    (
        lambda: ops.instance_norm_forward(a(), c3(), c3(), out=(None, a((4,)), None)),
        ValueError,
        r"mean must have shape \(4, 3\)",
    ),  # fmt: skip
    (
        lambda: ops.instance_norm_backward(a(), a(), c3(), a((4, 3)), a((3, 4))),
        ValueError,
        r"inv_std must have shape \(4, 3\)",
    ),  # fmt: skip
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_valid_calls_get_as_far_as_allocating():
    """Calls whose arrays and keywords are valid pass every check: bare CAI arrays then stop at the first
    allocation (cudnnkit allocates with the inputs' library), naming the output."""
    rm, rv = c3(), c3()
    for call, name in [
        (lambda: ops.batch_norm_forward(a(), c3(), c3(), running_mean=rm, running_var=rv), "y"),
        (lambda: ops.batch_norm_forward(a((4, 3)), c3(), c3(), mode="spatial_persistent"), "y"),
        (lambda: ops.batch_norm_forward(a((4, 3, 5)), a((3, 5)), a((3, 5)), mode="per_activation"), "y"),
        (
            lambda: ops.batch_norm_forward(
                a((4, 3, 2, 2), "<f2"), c3(), c3(), training=False, running_mean=rm, running_var=rv
            ),
            "y",
        ),  # fmt: skip
        (lambda: ops.batch_norm_backward(a(), a(), c3(), c3(), c3()), "dx"),
        (lambda: ops.layer_norm_forward(a((2, 4, 8), "<f2"), a((4, 8)), None), "y"),
        (lambda: ops.layer_norm_backward(a((4, 8)), a((4, 8)), a((8,)), a((4, 1)), a((4, 1))), "dx"),
        (lambda: ops.rms_norm_forward(a((4, 8)), a((8,)), training=False), "y"),
        (lambda: ops.rms_norm_backward(a((4, 8)), a((4, 8)), a((8,)), a((4, 1))), "dx"),
        (lambda: ops.instance_norm_forward(a((4, 3, 7), "<f2"), c3()), "y"),
        (lambda: ops.instance_norm_backward(a(), a(), c3(), a((4, 3)), a((4, 3))), "dx"),
    ]:
        with pytest.raises(TypeError, match=f"cannot allocate {name}:"):
            call()


# ----------------------------------------------------------------- descriptors and declarations


@pytest.mark.parametrize("dtype, want", [("float16", "FLOAT"), ("bfloat16", "FLOAT"), ("float32", "FLOAT"),
                                         ("float64", "DOUBLE")])  # fmt: skip
@pytest.mark.parametrize("mode", ["spatial", "per_activation", "spatial_persistent"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 4, 5, 6)])
def test_bn_param_descriptor_reads_back(dtype, want, mode, shape):
    d = nm.bn_param_descriptor(dtype, shape, mode)
    dt, n = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    lib.cudnnGetTensorNdDescriptor(d, 8, ctypes.byref(dt), ctypes.byref(n), dims, strides)
    assert lib.cudnnDataType_t(dt.value).name == f"CUDNN_DATA_{want}"
    assert nm.param_dtype(dtype) == {"FLOAT": "float32", "DOUBLE": "float64"}[want]
    c, sp = shape[1], shape[2:]
    got = tuple(dims[: n.value])
    assert got == ((1, c, *sp) if mode == "per_activation" else (1, c) + (1,) * len(sp))
    st = tuple(strides[: n.value])
    assert st == tuple(int(np.prod(got[i + 1 :])) for i in range(len(got)))  # packed, C order
    assert nm.bn_param_descriptor(dtype, shape, mode) is d  # cached by value


def test_canonical_layouts_of_low_rank_inputs():
    """(N, C) and (N, C, L) run as 4-d with trailing size-1 dims, whose strides keep the layout."""
    assert nm._canon((5, 3), "nchw") == ((5, 3, 1, 1), (3, 1, 1, 1))
    assert nm._canon((5, 3, 7), "nchw") == ((5, 3, 7, 1), (21, 7, 1, 1))
    assert nm._canon((5, 3, 7), "nhwc") == ((5, 3, 7, 1), (21, 1, 3, 3))
    assert nm._canon((2, 3, 4, 5, 6), "nhwc")[1] == (360, 1, 90, 18, 3)


def test_declarations():
    import cudnnkit

    fwd = {"batch_norm": ("graph", "legacy"), "layer_norm": ("graph",), "rms_norm": ("graph",),
           "instance_norm": ("graph",)}  # fmt: skip
    for fam, forms in fwd.items():
        p, b = P.REGISTRY[f"{fam}_forward"], P.REGISTRY[f"{fam}_backward"]
        assert p.forms == forms and b.forms == forms
        assert p.backward == f"{fam}_backward" and "x" in p.differentiable and "scale" in p.differentiable
        assert "x" in p.residuals and set(p.extras) <= set(p.residuals)
    assert P.REGISTRY["rms_norm_forward"].extras == ("inv_std",)
    assert P.REGISTRY["rms_norm_backward"].extras == ("dscale",)
    assert nm.param_dtype("bfloat16") == "float32" and nm.param_dtype("float64") == "float64"
    for name in ("batch_norm_forward", "layer_norm_backward", "instance_norm_forward", "rms_norm_forward"):
        assert name in cudnnkit.ops.__all__


def test_graph_tensors_of_a_call():
    """Layer norm runs as cuDNN's (samples, features, 1, 1); instance norm keeps (N, C, *sp) with (1, C, 1, 1)
    parameters and (N, C, 1, 1) statistics."""
    r = lnm._GN("layer", "float16", True, 1e-5, (2, 3, 8), (8,), (2, 3, 1), 6, 8, "nchw")
    assert lnm._gdims(r, "x") == ((6, 8, 1, 1), (8, 1, 8, 8))
    assert lnm._gdims(r, "param") == ((1, 8, 1, 1), (8, 1, 8, 8))
    assert lnm._gdims(r, "stat") == ((6, 1, 1, 1), (1, 1, 1, 1))
    r = lnm._GN("instance", "float32", True, 1e-5, (4, 3, 5, 6), (3,), (4, 3), 4, 3, "nhwc")
    assert lnm._gdims(r, "x", "nhwc") == ((4, 3, 5, 6), (90, 1, 18, 3))
    assert lnm._gdims(r, "x", "nchw") == ((4, 3, 5, 6), (90, 30, 6, 1))
    assert lnm._gdims(r, "param") == ((1, 3, 1, 1), (3, 1, 3, 3))
    assert lnm._gdims(r, "stat") == ((4, 3, 1, 1), (3, 1, 3, 3))


@pytest.mark.parametrize("mode", ["layer", "rms", "instance"])
def test_graph_builders_bind_every_tensor(mode):
    """The norm graphs a call builds: the node, and each non-virtual tensor bound to a view name the call has; the
    graph lowers host-side (finalizing needs a GPU)."""
    from cudnnkit.ops._primitive import Call
    from cudnnkit.runtime import as_view

    from .conftest import FakeCAI

    xs = (2, 3, 4, 5)
    fwd, bwd = {"layer": (lnm.LAYER_NORM_FORWARD, lnm.LAYER_NORM_BACKWARD),
                "rms": (lnm.RMS_NORM_FORWARD, lnm.RMS_NORM_BACKWARD),
                "instance": (lnm.INSTANCE_NORM_FORWARD, lnm.INSTANCE_NORM_BACKWARD)}[mode]  # fmt: skip
    ps = (3,) if mode == "instance" else (5,)
    arr = {"x": FakeCAI(xs, "<f2"), "scale": FakeCAI(ps)}
    if mode != "rms":
        arr["bias"] = FakeCAI(ps)
    views = {n: as_view(a, n) for n, a in arr.items()}
    r = fwd.resolve(views, {"training": True})
    stat = (2, 3) if mode == "instance" else (2, 3, 4, 1)
    outs = {"y": FakeCAI(xs, "<f2"), "inv_std": FakeCAI(stat)}
    if mode != "rms":
        outs["mean"] = FakeCAI(stat)
    c = Call(None, {**views, **{n: as_view(a, n) for n, a in outs.items()}}, r, extra={"graph_alignment": 16})
    g, names = lnm._gn_fwd_build(c)
    assert [n.kind for n in g.nodes()] == ["norm_fwd"]
    assert set(names.values()) == set(c.views) and all(t.dims for t in names)
    g.lower()


def _bn_views(xs=(2, 8, 4, 4), typestr="<f2", layout="nhwc", **arrays):
    """Views of a batch-norm call's arrays: x (and z/dy/y when named) in ``layout``, float32 (C,) parameters."""
    from cudnnkit.runtime import as_view

    from .conftest import FakeCAI

    n, c, h, w = xs
    isz = 2 if typestr == "<f2" else 4
    st = tuple(e * isz for e in ((c * h * w, 1, w * c, c) if layout == "nhwc" else (c * h * w, h * w, w, 1)))
    arr = {"x": FakeCAI(xs, typestr, strides=st)}
    for name, kind in arrays.items():
        arr[name] = FakeCAI(xs, typestr, strides=st) if kind == "data" else FakeCAI((c,))
    return {k: as_view(a, k) for k, a in arr.items()}


@pytest.mark.parametrize(
    "kw, layout, typestr, why",
    [
        ({}, "nhwc", "<f2", None),
        ({"activation": "relu"}, "nhwc", "<f2", None),
        ({"training": False}, "nhwc", "<f2", "inference"),
        ({}, "nchw", "<f2", "channels-last"),
        ({}, "nhwc", "<f4", None),
        ({"mode": "per_activation"}, "nhwc", "<f2", "per_activation"),
    ],
)
def test_batch_norm_graph_form_takes_channels_last_training_only(kw, layout, typestr, why):
    """Batch norm's graph form takes channels-last 4-d float16/bfloat16/float32 training only, and is the default
    path there; ``settings(prefer="legacy")`` keeps the Ex calls; forcing the graph for a call it refuses says
    why."""
    extra = {"running_mean": "p", "running_var": "p"}
    views = _bn_views(typestr=typestr, layout=layout, scale="p", bias="p", **extra)
    if kw.get("mode") == "per_activation":
        views = {k: v for k, v in views.items() if k == "x"}
        from cudnnkit.runtime import as_view

        from .conftest import FakeCAI

        views.update({k: as_view(FakeCAI((8, 4, 4)), k) for k in ("scale", "bias")})
    r = nm.BATCH_NORM_FORWARD.resolve(views, kw)
    got = nm._bn_graph_refuses(r, kw)
    assert (got is None) if why is None else (why in got)
    import cudnnkit

    assert P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw) == ("graph" if why is None else "legacy")
    with cudnnkit.settings(prefer="legacy"):
        assert P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw) == "legacy"
    with cudnnkit.settings(prefer="graph"):
        if why is None:
            assert P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw) == "graph"
        else:
            with pytest.raises(ValueError, match="prefer='graph'"):
                P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw)


@pytest.mark.parametrize("running, fused", [(True, False), (False, False), (True, True), (True, "z"), (True, "nan")])
def test_batch_norm_graph_builders_bind_every_tensor(running, fused):
    """The batch-norm graphs: NORM_FORWARD (batch) with the running statistics bound in place (input and output
    tensors on one array), then ADD (z) and RELU_FWD when fused; NORM_BACKWARD. Each non-virtual tensor is bound
    to a view the call has; the graphs lower host-side (finalizing needs a GPU)."""
    from cudnnkit.ops._primitive import Call

    arrays = {"scale": "p", "bias": "p", "y": "data", "saved_mean": "p", "saved_inv_std": "p"}
    if running:
        arrays.update(running_mean="p", running_var="p")
    if fused == "z":
        arrays["z"] = "data"
    views = _bn_views(**arrays)
    kw = {"activation": "relu"} if fused else {}
    if fused == "nan":  # torch's ReLU: the node asks cuDNN to propagate NaN (unset otherwise: cuDNN's default)
        kw["propagate_nan"] = True
    r = nm.BATCH_NORM_FORWARD.resolve({k: v for k, v in views.items() if k != "y"}, kw)
    assert nm._bn_graph_refuses(r, kw) is None
    c = Call(None, views, r, extra={"graph_alignment": 16})
    g, names = nm._bn_graph_fwd_build(c)
    kinds = [n.kind for n in g.nodes()]
    assert kinds[0] == "norm_fwd" and len(kinds) == 1 + (fused == "z") + bool(fused)
    if fused:
        assert dict(g.nodes()[-1].attrs).get("nan_propagation") is (True if fused == "nan" else None)
    bound = list(names.values())
    assert set(bound) <= set(c.views) and {"x", "scale", "bias", "y", "saved_mean", "saved_inv_std"} <= set(bound)
    if running:  # read and written: two tensors each, one array
        assert bound.count("running_mean") == 2 and bound.count("running_var") == 2
    g.lower()

    bviews = _bn_views(dy="data", dx="data", scale="p", saved_mean="p", saved_inv_std="p", dscale="p", dbias="p")
    rb = nm.BATCH_NORM_BACKWARD.resolve({k: v for k, v in bviews.items() if k != "dx"}, {})
    assert nm._bn_graph_refuses(rb, {}) is None
    g, names = nm._bn_graph_bwd_build(Call(None, bviews, rb, extra={"graph_alignment": 16}))
    assert [n.kind for n in g.nodes()] == ["norm_bwd"]
    assert set(names.values()) == {"x", "dy", "scale", "saved_mean", "saved_inv_std", "dx", "dscale", "dbias"}
    g.lower()


def test_the_l3_batch_norm_predicts_no_fused_reserve_where_the_graph_runs():
    """The L3 declaration's meta predicts the fused forward's reserve only where the legacy Ex call runs (under
    ``settings(prefer="legacy")``): not by default or under ``prefer="graph"``, whose graph keeps none (its
    backward reads y)."""
    import cudnnkit

    args = ("float16", "nhwc", (2, 8, 4, 4), "spatial")
    assert not nm._fusable(*args)
    with cudnnkit.settings(prefer="graph"):
        assert not nm._fusable(*args)
        r = nm._BN("float16", "float32", "spatial", True, False, 0.1, 1e-5, (2, 8, 4, 4), (8,), "nhwc", act=True)
        assert nm._bn_reserve(r, "nhwc") is None  # no cuDNN size query (no handle needed)
    with cudnnkit.settings(prefer="legacy"):
        assert nm._fusable(*args)


@pytest.mark.parametrize("typestr", ["<f2", "<f4"])
def test_batch_norm_relu_mask_graphs(typestr):
    """``return_mask=True``: the forward graph adds cudnn-frontend's BN_RELU mask (CMP_GT of the ReLU's output, a
    channels-last BOOLEAN output bound to the call's uint8 ``(N, H, W, C // 8)`` array); a backward given
    ``relu_mask=`` builds DRELU_DBN (MUL(dy, mask) feeding NORM_BACKWARD) and makes no ReLU gradient of its own
    first. The legacy forward refuses the mask by name (only the graph writes it); the graphs lower host-side."""
    import cudnnkit
    from cudnnkit.ops._primitive import Call
    from cudnnkit.runtime import as_view

    from .conftest import FakeCAI

    xs = (2, 16, 4, 4)
    views = _bn_views(xs, typestr, scale="p", bias="p", y="data", saved_mean="p", saved_inv_std="p")
    kw = {"activation": "relu", "return_mask": True}
    r = nm.BATCH_NORM_FORWARD.resolve({k: v for k, v in views.items() if k != "y"}, kw)
    assert r.mask and nm._bn_graph_refuses(r, kw) is None
    assert "return_mask=True" in nm._bn_fwd_legacy_refuses(r)
    assert P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw) == "graph"
    with cudnnkit.settings(prefer="legacy"), pytest.raises(ValueError, match="legacy call cannot take this"):
        P.route(nm.BATCH_NORM_FORWARD, r.dtype, None, r, kw)
    mask = as_view(FakeCAI((2, 4, 4, 2), "|u1"), "relu_mask")
    c = Call(None, {**views, "relu_mask": mask}, r, extra={"graph_alignment": 16})
    g, names = nm._bn_graph_fwd_build(c)
    assert [n.kind for n in g.nodes()] == ["norm_fwd", "pointwise", "pointwise"]
    (m,) = [t for t, n in names.items() if n == "relu_mask"]
    assert m.dtype == "bool" and m.dims == xs and m.strides == (256, 1, 64, 16)
    g.lower()

    bviews = _bn_views(xs, typestr, dy="data", dx="data", y="data", scale="p", saved_mean="p", saved_inv_std="p",
                       dscale="p", dbias="p")  # fmt: skip
    bviews["relu_mask"] = mask
    bkw = {"activation": "relu"}
    rb = nm.BATCH_NORM_BACKWARD.resolve({k: v for k, v in bviews.items() if k != "dx"}, bkw)
    assert rb.mask and nm._bn_graph_refuses(rb, bkw) is None
    cb = Call(None, bviews, rb, extra={"graph_alignment": 16})
    g, names = nm._bn_graph_bwd_build(cb)
    assert [n.kind for n in g.nodes()] == ["pointwise", "norm_bwd"]
    (m,) = [t for t, n in names.items() if n == "relu_mask"]
    assert m.dtype == "bool" and m.dims == xs
    assert "y" not in names.values()
    g.lower()


@pytest.mark.parametrize("typestr", ["<f2", "<f4"])
def test_batch_norm_add_relu_mask_graphs(typestr):
    """With the residual z: the forward graph is cudnn-frontend's BN_ADD_RELU with the mask of ``relu(bn(x) + z)``
    (NORM_FORWARD, ADD, RELU_FWD, CMP_GT); the backward with ``z_grad`` and ``relu_mask=`` is DRELU_DADD_DBN: the
    product ``MUL(dy, mask)`` in x's dtype is written as ``dz`` (channels-last, the caller's array) and feeds
    NORM_BACKWARD, in one graph. Both lower host-side."""
    from cudnnkit.ops._primitive import Call
    from cudnnkit.runtime import as_view

    from .conftest import FakeCAI

    xs = (2, 16, 4, 4)
    dt = {"<f2": "float16", "<f4": "float32"}[typestr]
    views = _bn_views(xs, typestr, scale="p", bias="p", z="data", y="data", saved_mean="p", saved_inv_std="p")
    kw = {"activation": "relu", "return_mask": True}
    r = nm.BATCH_NORM_FORWARD.resolve({k: v for k, v in views.items() if k != "y"}, kw)
    assert r.mask and r.z and nm._bn_graph_refuses(r, kw) is None
    mask = as_view(FakeCAI((2, 4, 4, 2), "|u1"), "relu_mask")
    g, names = nm._bn_graph_fwd_build(Call(None, {**views, "relu_mask": mask}, r, extra={"graph_alignment": 16}))
    assert [n.kind for n in g.nodes()] == ["norm_fwd", "pointwise", "pointwise", "pointwise"]
    assert [dict(n.attrs).get("mode") for n in g.nodes()][1:] == ["ADD", "RELU_FWD", "CMP_GT"]
    g.lower()

    bviews = _bn_views(xs, typestr, dy="data", dx="data", y="data", dz="data", scale="p", saved_mean="p",
                       saved_inv_std="p", dscale="p", dbias="p")  # fmt: skip
    bviews["relu_mask"] = mask
    bkw = {"activation": "relu", "z_grad": True}
    rb = nm.BATCH_NORM_BACKWARD.resolve({k: v for k, v in bviews.items() if k != "dx"}, bkw)
    assert rb.mask and rb.z and nm._bn_graph_refuses(rb, bkw) is None
    g, names = nm._bn_graph_bwd_build(Call(None, bviews, rb, extra={"graph_alignment": 16}))
    assert [n.kind for n in g.nodes()] == ["pointwise", "norm_bwd"]
    (dz,) = [t for t, n in names.items() if n == "dz"]
    assert not dz.virtual and dz.dtype == dt and dz.dims == xs and dz.strides == (256, 1, 64, 16)
    assert dict(g.nodes()[1].inputs)["dy"] == dz.uid  # the written product is what the norm's backward reads
    g.lower()


@pytest.mark.parametrize(
    "fwd_kw, xs, msg",
    [
        ({"activation": "relu", "return_mask": True}, (2, 12, 4, 4), "C is a multiple of 8"),
        ({"return_mask": True}, (2, 16, 4, 4), "pass activation='relu'"),
        ({"activation": "relu", "return_mask": "yes"}, (2, 16, 4, 4), "return_mask must be a bool"),
        ({"propagate_nan": True}, (2, 16, 4, 4), "propagate_nan is the fused ReLU's NaN rule: pass activation='relu'"),
        ({"activation": "relu", "propagate_nan": "yes"}, (2, 16, 4, 4), "propagate_nan must be a bool"),
    ],
)
def test_batch_norm_relu_mask_refusals(fwd_kw, xs, msg):
    views = _bn_views(xs, "<f2", scale="p", bias="p")
    with pytest.raises((ValueError, TypeError), match=msg):
        nm.BATCH_NORM_FORWARD.resolve(views, fwd_kw)


@pytest.mark.parametrize("bad", [0, 1, None, "yes", 1.0])
def test_batch_norm_forward_return_mask_must_be_a_bool(bad):
    """The public function checks ``return_mask`` itself (a truthy or falsy non-bool is not taken for one)."""
    with pytest.raises(TypeError, match="return_mask must be a bool"):
        nm.batch_norm_forward(None, None, None, activation="relu", return_mask=bad)


def test_batch_norm_backward_relu_mask_refusals():
    from cudnnkit.runtime import as_view

    from .conftest import FakeCAI

    xs = (2, 16, 4, 4)
    base = _bn_views(xs, "<f2", dy="data", y="data", scale="p", saved_mean="p", saved_inv_std="p")
    good = as_view(FakeCAI((2, 4, 4, 2), "|u1"), "relu_mask")
    no_y = {k: v for k, v in base.items() if k != "y"}
    with pytest.raises(ValueError, match="relu_mask= .* pass activation='relu'"):
        nm.BATCH_NORM_BACKWARD.resolve({**no_y, "relu_mask": good}, {})
    reserve, bias = as_view(FakeCAI((64,), "|u1"), "reserve"), as_view(FakeCAI((16,)), "bias")
    with pytest.raises(ValueError, match="relu_mask= takes the place of the fused forward's reserve, and is not "
                                         "taken with reserve="):  # fmt: skip
        nm.BATCH_NORM_BACKWARD.resolve({**base, "relu_mask": good, "reserve": reserve, "bias": bias},
                                       {"activation": "relu"})  # fmt: skip
    r = nm.BATCH_NORM_BACKWARD.resolve({**base, "relu_mask": good}, {"activation": "relu", "z_grad": True})
    assert r.mask and r.z  # with the residual: DRELU_DADD_DBN
    wrong = as_view(FakeCAI((2, 16, 4, 4), "|u1"), "relu_mask")
    with pytest.raises(ValueError, match=r"relu_mask must be the forward's uint8 mask of shape \(2, 4, 4, 2\)"):
        nm.BATCH_NORM_BACKWARD.resolve({**base, "relu_mask": wrong}, {"activation": "relu"})
