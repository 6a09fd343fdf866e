"""Spatial transformer on the CPU: bad input refused before any cuDNN call, the cached descriptor,
cuDNN's own dtype list, and the float64 references of the GPU tests checked against torch."""

from __future__ import annotations

import ctypes
import secrets

import numpy as np
import pytest

from cudnnkit import lib
from cudnnkit.ops import spatial_transformer as st
from cudnnkit.ops.spatial_transformer import (
    affine_grid_backward,
    affine_grid_forward,
    grid_sample_backward,
    grid_sample_forward,
)
from cudnnkit.runtime import cache_info, cudnn_dtype
from cudnnkit.runtime.dtypes import DTYPES

from .conftest import FakeBF16, FakeCAI


def a(shape, typestr="<f4", device=0, strides=None):
    return FakeCAI(shape, typestr, strides=strides, device=device)


X = (2, 3, 4, 5)  # x (N, C, H, W)
G = (2, 6, 7, 2)  # grid (N, H_out, W_out, 2)
Y = (2, 3, 6, 7)  # y (N, C, H_out, W_out)
T = (2, 2, 3)  # theta
SIZE = (2, 3, 6, 7)

CASES = [
    # host arrays, wrong devices
    (lambda: affine_grid_forward(np.zeros(T, np.float32), size=SIZE), TypeError, "^theta is a host array"),
    (lambda: affine_grid_backward(np.zeros(G, np.float32), size=SIZE), TypeError, "^dgrid is a host array"),
    (lambda: grid_sample_forward(np.zeros(X, np.float32), a(G)), TypeError, "^x is a host array"),
    (lambda: grid_sample_forward(a(X), np.zeros(G, np.float32)), TypeError, "^grid is a host array"),
    (lambda: grid_sample_backward(a(X), a(G), np.zeros(Y, np.float32)), TypeError, "^dy is a host array"),
    (lambda: grid_sample_forward(a(X), a(G, device=1)), ValueError, "grid is on cuda:1 but x is on cuda:0"),
    (lambda: grid_sample_backward(a(X), a(G), a(Y, device=1)), ValueError, "dy is on cuda:1 but x is on cuda:0"),
    (lambda: grid_sample_forward(a(X), a(G), out=a(Y, device=1)), ValueError, "out is on cuda:1"),
    (lambda: affine_grid_forward(a(T), size=SIZE, out=a(G, device=1)), ValueError, "out is on cuda:1"),
    # dtypes
    (lambda: affine_grid_forward(a(T, "<i4"), size=SIZE), TypeError, "theta has dtype int32; cuDNN's spatial"),
    (lambda: affine_grid_forward(FakeBF16(T), size=SIZE), TypeError, "theta has dtype bfloat16; .*bfloat16 included"),
    (lambda: affine_grid_backward(FakeBF16(G), size=SIZE), TypeError, "dgrid has dtype bfloat16"),
    (lambda: grid_sample_forward(FakeBF16(X), FakeBF16(G)), TypeError, "x has dtype bfloat16"),
    (lambda: grid_sample_forward(a(X, "|u1"), a(G, "|u1")), TypeError, "x has dtype uint8"),
    (lambda: grid_sample_forward(a(X), a(G, "<f8")), TypeError, "grid has dtype float64 but x has dtype float32"),
    (
        lambda: grid_sample_backward(a(X, "<f2"), a(G, "<f2"), a(Y)),
        TypeError,
        "dy has dtype float32 but x has dtype float16",
    ),
    (lambda: grid_sample_forward(a(X), a(G), out=a(Y, "<f8")), ValueError, "out must have shape .* and dtype float32"),
    (lambda: affine_grid_forward(a(T), size=SIZE, out=a(G, "<f2")), ValueError, "dtype float32"),
    # size
    (lambda: affine_grid_forward(a(T), size=(2, 6, 7)), ValueError, r"size must be \(N, C, H, W\), 4 ints"),
    (lambda: affine_grid_forward(a(T), size=(2, 3, 6, 7, 1)), ValueError, "cuDNN's spatial transformer is 2-d"),
    (lambda: affine_grid_forward(a(T), size=7), TypeError, "size must be a sequence"),
    (lambda: affine_grid_forward(a(T), size=(2, 3, 6.0, 7)), TypeError, "size must hold ints, got 6.0"),
    (lambda: affine_grid_forward(a(T), size=(2, True, 6, 7)), TypeError, "size must hold ints, got True"),
    (lambda: affine_grid_forward(a(T), size=(2, 3, 0, 7)), ValueError, "positive C, H and W"),
    (lambda: affine_grid_forward(a(T), size=(2, 0, 6, 7)), ValueError, "positive C, H and W"),
    (lambda: affine_grid_forward(a((0, 2, 3)), size=(-1, 3, 6, 7)), ValueError, "N >= 0"),
    (lambda: affine_grid_forward(a(T), size=(2, 3, 2**31, 1)), ValueError, "fit cuDNN's int"),
    (lambda: affine_grid_forward(a(T), size=(2, 3, 2**16, 2**15)), ValueError, "grid has .* 32-bit ints"),
    # theta / dgrid shapes
    (lambda: affine_grid_forward(a((2, 3, 3)), size=SIZE), ValueError, r"theta must have shape \(N, 2, 3\), got"),
    (lambda: affine_grid_forward(a((6,)), size=SIZE), ValueError, r"theta must have shape \(N, 2, 3\)"),
    (lambda: affine_grid_forward(a((3, 2, 3)), size=SIZE), ValueError, "theta has N = 3 but size has N = 2"),
    (lambda: affine_grid_backward(a((2, 6, 7, 3)), size=SIZE), ValueError, r"dgrid must have shape \(N, H, W, 2\)"),
    (
        lambda: affine_grid_backward(a((2, 7, 6, 2)), size=SIZE),
        ValueError,
        r"dgrid has shape \(2, 7, 6, 2\) but size .* needs \(2, 6, 7, 2\)",
    ),
    (lambda: affine_grid_backward(a(G), size=SIZE, out=a((2, 3, 2))), ValueError, r"out must have shape \(2, 2, 3\)"),
    # x / grid / dy shapes
    (lambda: grid_sample_forward(a((2, 3, 4)), a(G)), ValueError, r"x must be 4-d \(N, C, H, W\)"),
    (lambda: grid_sample_forward(a((2, 3, 4, 5, 1)), a(G)), ValueError, "x must be 4-d"),
    (lambda: grid_sample_forward(a((2, 0, 4, 5)), a(G)), ValueError, "x must have positive C, H and W"),
    (lambda: grid_sample_forward(a((2, 3, 4, 0)), a(G)), ValueError, "only N may be 0"),
    (lambda: grid_sample_forward(a(X), a((2, 6, 7, 3))), ValueError, r"grid must have shape \(N, H, W, 2\)"),
    (lambda: grid_sample_forward(a(X), a((2, 6, 7))), ValueError, r"grid must have shape \(N, H, W, 2\)"),
    (lambda: grid_sample_forward(a(X), a((3, 6, 7, 2))), ValueError, "grid has N = 3 but x has N = 2"),
    (lambda: grid_sample_forward(a(X), a((2, 0, 7, 2))), ValueError, "grid must have positive H and W"),
    (lambda: grid_sample_forward(a(X), a(G), out=a((2, 3, 7, 6))), ValueError, r"out must have shape \(2, 3, 6, 7\)"),
    (
        lambda: grid_sample_backward(a(X), a(G), a((2, 3, 7, 6))),
        ValueError,
        r"dy must have shape \(N, C, H_out, W_out\) = \(2, 3, 6, 7\)",
    ),
    (lambda: grid_sample_backward(a(X), a((3, 6, 7, 2)), a(Y)), ValueError, "grid has N = 3 but x has N = 2"),
    (lambda: grid_sample_backward(a(X), a(G), a(Y), dx_out=a((2, 3, 5, 4))), ValueError, "dx_out must have shape"),
    (
        lambda: grid_sample_backward(a(X), a(G), a(Y), dx_out=a(X), dgrid_out=a((2, 7, 6, 2))),
        ValueError,
        "dgrid_out must have shape",
    ),
    # blending needs an existing output
    (
        lambda: grid_sample_forward(a(X), a(G), beta=1.0),
        ValueError,
        "beta != 0 blends into an existing output: pass out=",
    ),
    (lambda: grid_sample_backward(a(X), a(G), a(Y), beta=0.5), ValueError, "pass dx_out="),
    (
        lambda: grid_sample_backward(a(X), a(G), a(Y), beta_dgrid=1.0, dx_out=a(X)),
        ValueError,
        "beta_dgrid != 0 blends into an existing output: pass dgrid_out=",
    ),
    # layouts cuDNN cannot take, with no adapter to copy (FakeCAI has none)
    (
        lambda: affine_grid_forward(a(T, strides=(24, 4, 8)), size=SIZE, out=a(G)),
        ValueError,
        "theta must be C-contiguous .* no cudnnkit adapter to copy it",
    ),
    (
        lambda: affine_grid_backward(a(G, strides=(336, 28, 4, 168)), size=SIZE, out=a(T)),
        ValueError,
        "dgrid must be C-contiguous",
    ),
    (
        lambda: grid_sample_forward(a(X), a(G, strides=(336, 28, 4, 168)), out=a(Y)),
        ValueError,
        "grid must be C-contiguous",
    ),
    (
        lambda: grid_sample_forward(a(X, strides=(0, 80, 20, 4)), a(G), out=a(Y)),
        ValueError,
        r"x is expanded \(stride 0 on a dim of size > 1\) \(shape \(2, 3, 4, 5\), strides \(0, 20, 5, 1\)\)"
        r".*no cudnnkit adapter",
    ),
    (
        lambda: grid_sample_backward(a(X), a(G), a(Y, strides=(504, -168, 28, 4)), dx_out=a(X), dgrid_out=a(G)),
        ValueError,
        "dy has negative strides",
    ),
    (
        lambda: grid_sample_forward(a(X), a(G), out=a(Y, strides=(0, 168, 28, 4))),
        ValueError,
        r"out is expanded \(stride 0 on a dim of size > 1\) \(shape \(2, 3, 6, 7\), strides \(0, 42, 7, 1\)\)",
    ),
    (
        lambda: affine_grid_forward(a(T), size=SIZE, out=a(G, strides=(336, 28, 4, 168))),
        ValueError,
        "out must be C-contiguous",
    ),
    (
        lambda: affine_grid_backward(a(G), size=SIZE, out=a(T, strides=(24, 4, 8))),
        ValueError,
        "out must be C-contiguous",
    ),
    (
        lambda: grid_sample_backward(a(X), a(G), a(Y), dx_out=a(X), dgrid_out=a(G, strides=(336, 28, 4, 168))),
        ValueError,
        "dgrid_out must be C-contiguous",
    ),
    (
        lambda: grid_sample_backward(a(X), a(G), a(Y), dx_out=a(X, strides=(240, 80, 0, 4)), dgrid_out=a(G)),
        ValueError,
        "dx_out is expanded",
    ),
    # every check passed: allocation needs the inputs' library (FakeCAI has no adapter)
    (lambda: affine_grid_forward(a(T), size=SIZE), TypeError, "without a cudnnkit adapter.*or pass out= yourself"),
    (lambda: grid_sample_forward(a(X), a(G)), TypeError, "without a cudnnkit adapter.*or pass out= yourself"),
    (lambda: grid_sample_backward(a(X), a(G), a(Y)), TypeError, "cannot allocate dx_out: .* pass dx_out="),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_torch_cpu_tensors_are_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="^x is a torch tensor on cpu"):
        grid_sample_forward(torch.zeros(X), torch.zeros(G))
    with pytest.raises(TypeError, match="^theta is a torch tensor on cpu"):
        affine_grid_forward(torch.zeros(T, dtype=torch.float64), size=SIZE)


def test_size_accepts_integer_likes():
    torch = pytest.importorskip("torch")
    assert st._size(torch.Size([2, 3, 6, 7])) == (2, 3, 6, 7)
    assert st._size(np.array([2, 3, 6, 7])) == (2, 3, 6, 7)
    assert st._size([0, 1, 2, 2]) == (0, 1, 2, 2)


def test_empty_batch_never_calls_cudnn():
    """N = 0: the outputs (given here, since FakeCAI has no allocator) come back untouched; no handle is made
    (which would fail on a machine without a GPU)."""
    out = a((0, 6, 7, 2))
    assert affine_grid_forward(a((0, 2, 3)), size=(0, 3, 6, 7), out=out) is out
    dth = a((0, 2, 3))
    assert affine_grid_backward(a((0, 6, 7, 2)), size=(0, 3, 6, 7), out=dth) is dth
    y = a((0, 3, 6, 7))
    assert grid_sample_forward(a((0, 3, 4, 5)), a((0, 6, 7, 2)), out=y) is y
    dx, dg = a((0, 3, 4, 5)), a((0, 6, 7, 2))
    got = grid_sample_backward(a((0, 3, 4, 5)), a((0, 6, 7, 2)), a((0, 3, 6, 7)), dx_out=dx, dgrid_out=dg)
    assert got[0] is dx and got[1] is dg


def test_descriptor_is_cached_by_value():
    d1 = st._st_descriptor("float32", (2, 3, 6, 7))
    before = cache_info()["hits"]
    assert st._st_descriptor("float32", (2, 3, 6, 7)) is d1
    assert cache_info()["hits"] == before + 1
    assert st._st_descriptor("float64", (2, 3, 6, 7)) is not d1
    assert st._st_descriptor("float32", (2, 3, 6, 8)) is not d1
    assert d1.key == ("spatial_transformer", "float32", (2, 3, 6, 7))


def test_dtype_list_is_what_cudnn_accepts():
    """cudnnSetSpatialTransformerNdDescriptor itself accepts exactly float16, float32 and float64 (bfloat16 gets
    BAD_PARAM), so the list the ops check is cuDNN's, not a guess."""
    p = ctypes.c_void_p()
    lib.cudnnCreateSpatialTransformerDescriptor(ctypes.byref(p))
    try:
        dims = (ctypes.c_int * 4)(2, 3, 6, 7)
        accepted = set()
        for name in DTYPES:
            try:
                lib.cudnnSetSpatialTransformerNdDescriptor(p, lib.CUDNN_SAMPLER_BILINEAR, cudnn_dtype(name), 4, dims)
                accepted.add(name)
            except lib.CudnnError:
                pass
        with pytest.raises(lib.BadParamError, match="CUDNN_DATA_HALF"):
            lib.cudnnSetSpatialTransformerNdDescriptor(p, lib.CUDNN_SAMPLER_BILINEAR, lib.CUDNN_DATA_BFLOAT16, 4, dims)
    finally:
        lib.cudnnDestroySpatialTransformerDescriptor(p)
    assert accepted == set(st._FLOATS)


def test_numpy_references_match_torch_cpu():
    """The GPU tests' NumPy references (affine grid, sampler, their backwards) coincide with torch on the CPU
    in float64 on the kind of inputs those tests draw: border band and fully outside points included."""
    pytest.importorskip("torch")
    from .gpu import test_spatial_transformer_gpu as g

    seed = secrets.randbits(32)
    rng = np.random.default_rng(seed)
    for size in ((2, 3, 5, 7), (3, 1, 8, 4), (1, 2, 2, 2)):
        n, _, h, w = size
        theta = g.random_theta(rng, n)
        dg = rng.standard_normal((n, h, w, 2))
        g_t, dth_t = g.torch_affine_grid(theta, size, dg)
        assert g.rel(g.ref_affine_grid(theta, size), g_t) < 1e-14, seed
        assert g.rel(g.ref_affine_grid_backward(dg, size), dth_t) < 1e-14, seed
    for (n, c, h, w), (ho, wo) in (((2, 3, 6, 5), (4, 7)), ((1, 4, 9, 11), (9, 11)), ((3, 2, 4, 4), (8, 2))):
        x = rng.standard_normal((n, c, h, w))
        grid = g.sample_grid(rng, n, ho, wo, h, w)
        dy = rng.standard_normal((n, c, ho, wo))
        y_t, dx_t, dgrid_t = g.torch_grid_sample(x, grid, dy)
        dx, dgrid = g.ref_grid_sample_backward(x, grid, dy)
        assert g.rel(g.ref_grid_sample(x, grid), y_t) < 1e-13, seed
        assert g.rel(dx, dx_t) < 1e-13, seed
        assert g.rel(dgrid, dgrid_t) < 1e-13, seed
    # a theta-generated grid (as in the end-to-end and finite-difference tests) and the size-1 convention
    theta = g.theta_away_from_integers(rng, (2, 3, 9, 11), 12, 10, 1e-3)
    grid = g.ref_affine_grid(theta, (2, 3, 9, 11))
    x = rng.standard_normal((2, 3, 12, 10))
    assert g.rel(g.ref_grid_sample(x, grid), g.torch_grid_sample(x, grid)[0]) < 1e-13, seed
    for size in ((2, 1, 1, 5), (2, 1, 4, 1)):
        theta = g.random_theta(rng, 2)
        assert g.rel(g.ref_affine_grid(theta, size), g.torch_affine_grid(theta, size)[0]) < 1e-14, seed


def test_finite_difference_helper_is_exact_on_bilinear_cells():
    """The float64 finite differences the GPU test uses agree with the NumPy backward (here on the NumPy
    forward), so a GPU failure there is cuDNN's, not the check's."""
    from .gpu import test_spatial_transformer_gpu as g

    rng = np.random.default_rng(secrets.randbits(32))
    x = rng.standard_normal((2, 2, 4, 5))
    grid = g.sample_grid(rng, 2, 3, 2, 4, 5)
    wt = rng.standard_normal((2, 2, 3, 2))
    dx, dgrid = g.ref_grid_sample_backward(x, grid, wt)
    assert g.rel(dx, g.finite_difference(lambda a: float((g.ref_grid_sample(a, grid) * wt).sum()), x)) < 1e-8
    assert g.rel(dgrid, g.finite_difference(lambda gg: float((g.ref_grid_sample(x, gg) * wt).sum()), grid)) < 1e-8


class _Recorder:
    """Stands in for one cuDNN function: records its arguments, touches nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


@pytest.fixture
def recorded(monkeypatch):
    """The four spatial transformer calls replaced by recorders and the handle by a sentinel, so the ops run
    to their cuDNN call on FakeCAI arrays without touching cuDNN's device state."""
    from cudnnkit.runtime.launch import Launch

    recs = {}
    for name in (
        "cudnnSpatialTfGridGeneratorForward",
        "cudnnSpatialTfGridGeneratorBackward",
        "cudnnSpatialTfSamplerForward",
        "cudnnSpatialTfSamplerBackward",
    ):
        recs[name] = _Recorder()
        monkeypatch.setattr(lib, name, recs[name], raising=False)
    monkeypatch.setattr(Launch, "handle", property(lambda self: "HANDLE"))
    return recs


def _key(d):
    return d.key


def _value(ref):
    return ref._obj.value


def test_cudnn_calls_get_the_right_arguments(recorded):
    """Argument order, descriptor values (output dims, dtype, strides) and pointers of each cuDNN call."""
    p = {k: 0x7F0000000000 + i * 0x100000 for i, k in enumerate("x g y t dy dx dg".split())}
    # x channels-last (NHWC memory), grid/theta contiguous, y contiguous
    x = FakeCAI(X, "<f8", strides=(480, 8, 120, 24), ptr=p["x"])
    grid = FakeCAI(G, "<f8", ptr=p["g"])
    y = FakeCAI(Y, "<f8", ptr=p["y"])
    assert grid_sample_forward(x, grid, out=y, alpha=2.0, beta=0.5) is y
    (args,) = recorded["cudnnSpatialTfSamplerForward"].calls
    assert args[0] == "HANDLE"
    assert _key(args[1]) == ("spatial_transformer", "float64", Y)  # the descriptor holds the OUTPUT dims
    assert _value(args[2]) == 2.0 and isinstance(args[2]._obj, ctypes.c_double)
    assert _key(args[3]) == ("tensor", "float64", X, (60, 1, 15, 3)) and args[4] == p["x"]
    assert args[5] == p["g"]
    assert _value(args[6]) == 0.5
    assert _key(args[7]) == ("tensor", "float64", Y, (126, 42, 7, 1)) and args[8] == p["y"]

    dy = FakeCAI(Y, "<f8", ptr=p["dy"])
    dx = FakeCAI(X, "<f8", ptr=p["dx"])
    dg = FakeCAI(G, "<f8", ptr=p["dg"])
    got = grid_sample_backward(
        x, grid, dy, alpha=3.0, beta=0.25, alpha_dgrid=-1.0, beta_dgrid=0.75, dx_out=dx, dgrid_out=dg
    )
    assert got[0] is dx and got[1] is dg
    (args,) = recorded["cudnnSpatialTfSamplerBackward"].calls
    assert args[0] == "HANDLE" and _key(args[1]) == ("spatial_transformer", "float64", Y)
    assert _value(args[2]) == 3.0  # alpha, then x
    assert _key(args[3]) == ("tensor", "float64", X, (60, 1, 15, 3)) and args[4] == p["x"]
    assert _value(args[5]) == 0.25  # beta, then dx
    assert _key(args[6]) == ("tensor", "float64", X, (60, 20, 5, 1)) and args[7] == p["dx"]
    assert _value(args[8]) == -1.0  # alphaDgrid, then dy, grid
    assert _key(args[9]) == ("tensor", "float64", Y, (126, 42, 7, 1)) and args[10] == p["dy"]
    assert args[11] == p["g"]
    assert _value(args[12]) == 0.75 and args[13] == p["dg"]  # betaDgrid, dgrid

    theta = FakeCAI(T, "<f2", ptr=p["t"])
    out = FakeCAI(G, "<f2", ptr=p["g"])
    assert affine_grid_forward(theta, size=SIZE, out=out) is out
    (args,) = recorded["cudnnSpatialTfGridGeneratorForward"].calls
    # C does not enter the grid: described as 1
    assert args[0] == "HANDLE" and _key(args[1]) == ("spatial_transformer", "float16", (2, 1, 6, 7))
    assert args[2:] == (p["t"], p["g"])
    dth = FakeCAI(T, "<f2", ptr=p["t"])
    assert affine_grid_backward(out, size=SIZE, out=dth) is dth
    (args,) = recorded["cudnnSpatialTfGridGeneratorBackward"].calls
    assert _key(args[1]) == ("spatial_transformer", "float16", (2, 1, 6, 7)) and args[2:] == (p["g"], p["t"])


def test_size_one_dims_get_positive_canonical_strides(recorded):
    """A size-1 dim may carry any stride (torch, slices); cuDNN is given a positive, canonical one."""
    x = FakeCAI((1, 1, 4, 5), "<f4", strides=(0, 0, 20, 4))  # C-contiguous apart from its size-1 dims
    grid = FakeCAI((1, 6, 7, 2), "<f4")
    y = FakeCAI((1, 1, 6, 7), "<f4", strides=(4, 0, 28, 4))
    grid_sample_forward(x, grid, out=y)
    (args,) = recorded["cudnnSpatialTfSamplerForward"].calls
    assert _key(args[3])[3] == (20, 20, 5, 1) and _key(args[7])[3] == (42, 42, 7, 1)
    x2 = FakeCAI((2, 1, 4, 5), "<f4", strides=(160, 0, 4, 20))  # not contiguous (W-major), size-1 C at stride 0
    grid2 = FakeCAI((2, 6, 7, 2), "<f4")
    grid_sample_forward(x2, grid2, out=FakeCAI((2, 1, 6, 7), "<f4"))
    assert _key(recorded["cudnnSpatialTfSamplerForward"].calls[1][3])[3] == (40, 1, 1, 5)


class _FakeArr(FakeCAI):
    """A device array of a fake library that has an adapter (below), so copies and allocations can be seen."""


class _FakeAdapter:
    """Copies and allocations recorded, with fresh fake pointers; never touches memory."""

    name = "fake"

    def __init__(self):
        self.copies, self.allocs, self._next = [], [], 0x7E0000000000

    def _new(self, shape, typestr):
        self._next += 0x100000
        return _FakeArr(tuple(shape), typestr, ptr=self._next)

    def view(self, obj, name):
        from cudnnkit.runtime.arrays import _from_cai

        v = _from_cai(obj, name)
        v.adapter = self
        return v

    def current_device(self):
        return 0

    def contiguous(self, arr, stream=None):
        if self.view(arr, "arr").is_contiguous():
            return arr
        new = self._new(arr.__cuda_array_interface__["shape"], arr.__cuda_array_interface__["typestr"])
        self.copies.append((arr, new))
        return new

    def empty(self, shape, dtype, device, strides=None, stream=None):
        assert strides is None  # outputs are allocated C-contiguous
        new = self._new(shape, {"float16": "<f2", "float32": "<f4", "float64": "<f8"}[dtype])
        self.allocs.append(new)
        return new

    def current_stream(self, device):
        return 0


@pytest.fixture
def fake_library(monkeypatch, recorded):
    from cudnnkit.runtime import adapters

    ad = _FakeAdapter()
    real = adapters.for_object
    monkeypatch.setattr(adapters, "for_object", lambda obj: ad if isinstance(obj, _FakeArr) else real(obj))
    return ad, recorded


def test_inputs_cudnn_cannot_take_are_copied_and_logged(fake_library, caplog):
    ad, rec = fake_library
    caplog.set_level("DEBUG", logger="cudnnkit")
    x = _FakeArr(X, "<f4", strides=(0, 80, 20, 4))  # broadcast over N
    grid = _FakeArr(G, "<f4", strides=(336, 28, 4, 168))  # (N, 2, H, W) memory seen as (N, H, W, 2)
    y = grid_sample_forward(x, grid)
    assert [src for src, _ in ad.copies] == [x, grid]
    (args,) = rec["cudnnSpatialTfSamplerForward"].calls
    x_copy, g_copy = (new for _, new in ad.copies)
    assert args[4] == x_copy.__cuda_array_interface__["data"][0]
    assert args[5] == g_copy.__cuda_array_interface__["data"][0]
    assert _key(args[3])[3] == (60, 20, 5, 1)
    assert y is ad.allocs[0] and args[8] == y.__cuda_array_interface__["data"][0]
    assert (
        "x is expanded (stride 0 on a dim of size > 1) (shape (2, 3, 4, 5), strides (0, 20, 5, 1)): copying"
        in caplog.text
    )
    assert (
        "grid must be C-contiguous (cuDNN reads it as a packed array) (shape (2, 6, 7, 2), strides (84, 7, 1, 42)): copying"
        in caplog.text
    )

    ad.copies.clear()
    nhwc = _FakeArr(X, "<f4", strides=(240, 4, 60, 12))  # channels-last: described as it is, no copy
    dx, dgrid = grid_sample_backward(nhwc, _FakeArr(G, "<f4"), _FakeArr(Y, "<f4"))
    assert ad.copies == []
    (args,) = rec["cudnnSpatialTfSamplerBackward"].calls
    assert _key(args[3])[3] == (60, 1, 15, 3) and _key(args[6])[3] == (60, 20, 5, 1)  # x as given, dx NCHW
    assert args[7] == dx.__cuda_array_interface__["data"][0] and args[13] == dgrid.__cuda_array_interface__["data"][0]

    theta = _FakeArr(T, "<f8", strides=(48, 8, 16))
    affine_grid_forward(theta, size=SIZE)
    assert ad.copies[-1][0] is theta
    assert rec["cudnnSpatialTfGridGeneratorForward"].calls[0][2] == ad.copies[-1][1].__cuda_array_interface__["data"][0]


def test_unit_size_grid_and_too_many_backward_channels_are_refused():
    from cudnnkit.ops.spatial_transformer import affine_grid_backward, affine_grid_forward, grid_sample_backward

    th = FakeCAI((2, 2, 3))
    for size in ((2, 1, 1, 5), (2, 1, 4, 1)):
        with pytest.raises(ValueError, match="size needs H >= 2 and W >= 2"):
            affine_grid_forward(th, size=size)
        with pytest.raises(ValueError, match="size needs H >= 2 and W >= 2"):
            affine_grid_backward(FakeCAI((2, size[2], size[3], 2)), size=size)
    with pytest.raises(ValueError, match="x has 1025 channels; cuDNN's sampler backward supports at most 1024"):
        grid_sample_backward(FakeCAI((1, 1025, 3, 4)), FakeCAI((1, 2, 3, 2)), FakeCAI((1, 1025, 2, 3)))
