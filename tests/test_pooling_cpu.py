"""Pooling on the CPU: the float64 references against torch, bad input refused before any cuDNN call, and the
legacy descriptor read back from cuDNN."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cudnnkit import lib, ops
from cudnnkit.ops import pooling as pl

from . import pool_reference as ref
from .conftest import FakeBF16, FakeCAI


def x(shape=(2, 3, 8, 8), typestr="<f4", device=0):
    return FakeCAI(shape, typestr, device=device)


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("mode", ["max", "avg_include_padding", "avg_exclude_padding"])
def test_references_agree_with_torch(nsp, mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(nsp)
    shape = (2, 3, *([9, 8, 7][:nsp]))
    window, stride, pad = (3, 2, 3)[:nsp], (2, 1, 2)[:nsp], (1, 1, 0)[:nsp]
    xa = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float64) / 7.0  # distinct values: no ties
    xt = torch.tensor(xa, requires_grad=True)
    if mode == "max":
        yt = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp](xt, window, stride, pad)
    else:
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
        yt = pool(xt, window, stride, pad, count_include_pad=mode == "avg_include_padding")
    y = ref.pool_forward(xa, mode, window, stride, pad)
    assert np.allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    yt.backward(torch.tensor(dy))
    assert np.allclose(ref.pool_backward(xa, dy, mode, window, stride, pad), xt.grad.numpy(), atol=1e-12)


def _legacy(fn):
    from cudnnkit import settings

    with settings(prefer="legacy"):
        return fn()


CASES = [
    (
        lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 4)), x(), window=3, stride=2, ceil_mode=True),
        ValueError,
        r"runs on the graph, whose max-pooling backward reads the forward's argmax: pass index=",
    ),
    (lambda: ops.pooling_forward(x(), mode="min"), ValueError, "mode must be one of"),
    (lambda: ops.pooling_forward(x(), window=9), ValueError, "input 8 with padding 0 is smaller than the window 9"),
    (lambda: ops.pooling_forward(x(), window=3, padding=3), ValueError, "padding 3 must be smaller than the window"),
    (lambda: ops.pooling_forward(x(), window=0), ValueError, "window must be >= 1"),
    (lambda: ops.pooling_forward(x(), window=(2, 2, 2)), ValueError, "window must have 2 values"),
    (lambda: ops.pooling_forward(x(), ceil_mode=1), TypeError, "ceil_mode must be a bool"),
    (lambda: ops.pooling_forward(x(), propagate_nan="yes"), TypeError, "propagate_nan must be a bool"),
    (
        lambda: _legacy(lambda: ops.pooling_forward(x(), window=3, stride=2, ceil_mode=True)),
        ValueError,
        r"prefer='legacy'.*ceil_mode adding padding after\): cuDNN's legacy pooling pads both sides alike",
    ),
    (
        lambda: ops.pooling_forward(x(typestr="<f8"), window=3, padding=((0, 1), (1, 1))),
        ValueError,
        "neither cuDNN path.*float64.*before and",
    ),
    (lambda: ops.pooling_forward(x(), mode="avg_include_padding", return_index=True), ValueError, "is for max pool"),
    (lambda: ops.pooling_forward(x(), return_index=1), TypeError, "return_index must be a bool"),
    (
        lambda: ops.pooling_backward(
            x((2, 3, 4, 4)), x((2, 3, 4, 4)), x(), index=x((2, 3, 4, 4), "|i1"), mode="avg_exclude_padding"
        ),  # fmt: skip
        ValueError,
        "index is max pooling's argmax",
    ),
    (
        lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 4)), x(), index=x((2, 3, 4, 4), "<i4")),
        ValueError,
        "index must be the forward's.*int8",
    ),
    (
        lambda: _legacy(
            lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 4)), x(), index=x((2, 3, 4, 4), "|i1"))
        ),  # fmt: skip
        ValueError,
        "legacy call cannot take this: the argmax index",
    ),
    (
        lambda: _legacy(
            lambda: ops.pooling_forward(
                FakeBF16((2, 3, 8, 8)), mode="avg_exclude_padding", window=3, stride=2, ceil_mode=True
            )
        ),  # fmt: skip
        ValueError,
        r"settings\(prefer='legacy'\), but the legacy call cannot take this: padding",
    ),
    (lambda: ops.pooling_forward(x((2, 3))), ValueError, "x must have 3 to 5 dims"),
    (lambda: ops.pooling_forward(x(typestr="<i4")), TypeError, "x has dtype int32"),
    (lambda: ops.pooling_forward(x(), pool=ops.Pooling(), window=3), TypeError, "pass pool= or mode="),
    (lambda: ops.pooling_forward(x(), out=x((2, 3, 5, 4))), ValueError, r"out must have shape \(2, 3, 4, 4\)"),
    (
        lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 5)), x()),
        ValueError,
        r"y must have the forward output's shape \(2, 3, 4, 4\)",
    ),
    (lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 4), "<f2"), x()), TypeError, "y has dtype float16"),
    (lambda: ops.pooling_backward(x((2, 3, 4, 4)), x((2, 3, 4, 4)), x(device=1)), ValueError, "is on cuda:1"),
]


@pytest.mark.parametrize("call, exc, msg", CASES)
def test_bad_input_is_refused_before_cudnn(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()


def test_ceil_mode_that_changes_nothing_is_taken():
    """ceil_mode where the windows tile the input exactly adds no padding: the legacy path takes it."""
    r = pl._resolve_for(type("V", (), {"ndim": 4, "shape": (2, 3, 9, 9), "strides": (243, 81, 9, 1),
                                       "dtype": "float32", "is_contiguous": lambda self: True})(), "x",
                        {"window": 3, "stride": 3, "ceil_mode": True})  # fmt: skip
    assert r.y_shape == (2, 3, 3, 3) and r.pad == (0, 0)


@pytest.mark.parametrize("nsp", [1, 2, 3])
@pytest.mark.parametrize("mode", sorted(pl._MODES))
def test_descriptor_reads_back_and_cudnn_agrees_on_the_output(nsp, mode):
    from cudnnkit.runtime.descriptors import int_array, tensor_descriptor
    from cudnnkit.runtime.view import contiguous_strides

    shape = (2, 3, *([9, 8, 7][:nsp]))
    window, stride, pad = (3, 2, 3)[:nsp], (2, 1, 2)[:nsp], (1, 1, 0)[:nsp]

    class V:
        ndim, strides, dtype = len(shape), contiguous_strides(shape), "float32"

        def __init__(self):
            self.shape = shape

        def is_contiguous(self):
            return True

    r = pl._resolve_for(V(), "x", {"mode": mode, "window": window, "stride": stride, "padding": pad,
                                   "propagate_nan": True})  # fmt: skip
    d = pl.pooling_descriptor(r)
    m, nan, n = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    w, p, s = (ctypes.c_int * 8)(), (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    k = max(nsp, 2)
    lib.cudnnGetPoolingNdDescriptor(d, k, ctypes.byref(m), ctypes.byref(nan), ctypes.byref(n), w, p, s)
    assert m.value == pl._MODES[mode] and nan.value == lib.CUDNN_PROPAGATE_NAN and n.value == k
    assert tuple(w[:k]) == r.window and tuple(p[:k]) == r.pad and tuple(s[:k]) == r.stride
    xs = shape + (1,) if nsp == 1 else shape
    out = int_array([0] * len(xs))
    lib.cudnnGetPoolingNdForwardOutputDim(d, tensor_descriptor("float32", xs, contiguous_strides(xs)), len(xs), out)
    assert tuple(out)[: len(r.y_shape)] == r.y_shape


def test_router_keeps_legacy_where_both_run_and_graph_otherwise():
    from cudnnkit.ops._primitive import route

    v = type(
        "V",
        (),
        {
            "ndim": 4,
            "shape": (2, 3, 8, 8),
            "strides": (192, 64, 8, 1),
            "dtype": "float16",
            "is_contiguous": lambda self: True,
        },
    )()
    sym = pl._resolve_for(v, "x", {"window": 3, "stride": 2, "padding": 1})
    ceil = pl._resolve_for(v, "x", {"window": 3, "stride": 2, "ceil_mode": True})
    assert ceil.pad == (0, 0) and ceil.post == (1, 1) and ceil.y_shape == (2, 3, 4, 4)
    assert route(pl.POOLING_FORWARD, "float16", None, sym, {}) == "legacy"
    assert route(pl.POOLING_FORWARD, "float16", None, ceil, {}) == "graph"
    assert route(pl.POOLING_FORWARD, "float16", None, sym._replace(index=True), {}) == "graph"
    assert pl._index_dtype((3, 3)) == "int8" and pl._index_dtype((8, 8, 2)) == "int32"
    # bfloat16 averaging: the graph refuses it (cuDNN computes it wrong), so it stays legacy, and forcing the graph
    # is refused by name
    bf = sym._replace(dtype="bfloat16", mode="avg_exclude_padding")
    assert route(pl.POOLING_FORWARD, "bfloat16", None, bf, {}) == "legacy"
    from cudnnkit import settings

    with settings(prefer="graph"), pytest.raises(ValueError, match="graph API cannot take this: bfloat16 average"):
        route(pl.POOLING_FORWARD, "bfloat16", None, bf, {})
    # where only the graph can take it (ceil_mode's padding after), the graph runs it on float32 copies
    vb = type(v)()
    vb.dtype = "bfloat16"
    bceil = pl._resolve_for(vb, "x", {"mode": "avg_exclude_padding", "window": 3, "stride": 2, "ceil_mode": True})
    assert bceil.f32 and not bf.f32 and not ceil.f32
    assert route(pl.POOLING_FORWARD, "bfloat16", None, bceil, {}) == "graph"


def test_views_that_differ_only_in_size_one_strides_describe_alike():
    """cuDNN's pooling backward compares x's and dx's strides literally (BAD_PARAM ``isTensorSameStrides``, found by
    the GPU fuzzer with a channels-last C=1 x and a C-order dx): views of one layout are described alike."""
    from types import SimpleNamespace

    from cudnnkit.ops._nd import nd_tensor

    a = SimpleNamespace(shape=(1, 1, 3), strides=(3, 1, 1), dtype="float32")  # channels-last, C = 1
    b = SimpleNamespace(shape=(1, 1, 3), strides=(3, 3, 1), dtype="float32")  # C order
    assert pl._same_strides(a, b) and nd_tensor(a, 1, b.strides) is nd_tensor(b, 1)
    assert nd_tensor(a, 1) is not nd_tensor(b, 1)  # a view's own strides otherwise (as_2d keeps 1-d layouts)
    assert not pl._same_strides(a, SimpleNamespace(shape=(1, 3, 3), strides=(9, 1, 3), dtype="float32"))


def test_the_graph_path_runs_channels_last_copies_of_channels_first_arrays(monkeypatch):
    """The resample engines of cuDNN 9.19 are wrong or missing for channels-first arrays (measured on the H200):
    an NCHW x reaches the plan as a channels-last copy, and y is written through a channels-last temporary that is
    copied into the caller's array; a channels-last x is bound as given."""
    import numpy as np

    from cudnnkit.ops import _express

    from .fuzz.materialize import FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_copies, recording_plans

    runs, copies = recording_plans(monkeypatch), recording_copies(monkeypatch)
    b = FakeBackend()
    with b.installed():
        _express.entries.clear()
        for layout in (("c",), ("perm", (0, 2, 3, 1))):
            copies.clear()
            x = b.array(A((2, 3, 8, 8), "float16", layout=layout), np.zeros((2, 3, 8, 8)), "fakeA", None)
            y = ops.pooling_forward(x, window=3, stride=2, ceil_mode=True)
            seen = runs[-1]
            assert seen["x"][0] == (192, 1, 24, 3) and seen["out"][0] == (48, 1, 12, 3)  # channels-last both
            if layout == ("c",):
                assert seen["x"][1] != x.ptr and seen["out"][1] != y.ptr and copies == ["x", "out"]
            else:
                assert seen["x"][1] == x.ptr and seen["out"][1] == y.ptr and copies == []
        _express.entries.clear()


@pytest.mark.parametrize("blend", [(1.0, 0.0), (0.5, 0.25)])
def test_bfloat16_averaging_only_the_graph_takes_runs_on_float32_copies(monkeypatch, blend):
    """bfloat16 average pooling with ceil_mode's padding after (cuDNN 9.19's bfloat16 resample engines average
    wrong; the legacy call cannot pad after only): forward and backward, every call (express hits included), x (dy)
    transformed to a float32 channels-last copy, the graph built on float32 and bound to the copies, its float32
    result transformed into the caller's bfloat16 out with the call's alpha and beta."""
    import numpy as np

    from cudnnkit.graph import Graph
    from cudnnkit.ops import _express, _graphform
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_plans

    runs = recording_plans(monkeypatch)
    built = []
    fake_build = Graph.build
    monkeypatch.setattr(Graph, "build", lambda self, device=None, **kw: built.append(self) or fake_build(self, device))
    calls = []

    def transform(h, a, ad, ap, b, cd, cp):
        calls.append((ap, cp, a._obj.value, b._obj.value))

    alpha, beta = blend
    b = FakeBackend()
    with b.installed():
        monkeypatch.setattr(lib, "cudnnTransformTensor", transform)
        monkeypatch.setitem(adapters.KEYED, FakeArray, lambda a: b.adapters[a.lib].key(a))
        _express.entries.clear()
        _graphform._forms.clear()  # plans of earlier tests record into their own lists
        try:
            x = b.array(A((2, 3, 8, 8), "bfloat16", layout=("c",)), np.zeros((2, 3, 8, 8)), "fakeA", None)
            kw = dict(mode="avg_exclude_padding", window=3, stride=2, ceil_mode=True, alpha=alpha, beta=beta)
            for _ in range(3):
                calls.clear()
                out = b.array(A((2, 3, 4, 4), "bfloat16"), np.zeros((2, 3, 4, 4)), "fakeA", None)
                y = ops.pooling_forward(x, out=out, **kw)
                assert y is out and ops.last_path() == ("pooling_forward", "graph")
                seen = runs[-1]
                assert seen["x"][0] == (192, 1, 24, 3) and seen["out"][0] == (48, 1, 12, 3)  # channels-last
                assert calls == [(x.ptr, seen["x"][1], 1.0, 0.0), (seen["out"][1], out.ptr, alpha, beta)]
                calls.clear()
                dx = b.array(A((2, 3, 8, 8), "bfloat16"), np.zeros((2, 3, 8, 8)), "fakeA", None)
                got = ops.pooling_backward(y, y, x, out=dx, **kw)
                assert got is dx and ops.last_path() == ("pooling_backward", "graph")
                seen = runs[-1]
                assert calls == [(y.ptr, seen["dy"][1], 1.0, 0.0), (seen["out"][1], dx.ptr, alpha, beta)]
            assert len(built) == 2 and all(t.dtype == "float32" for g in built for t in g.tensors())
        finally:
            _express.entries.clear()
            _graphform._forms.clear()


def test_express_hits_bind_what_the_first_call_bound_and_keep_the_output_layout(monkeypatch):
    """Regressions found in review: an express hit must not bind the caller's channels-first x to a plan built for
    prepare's channels-last copy (a given channels-last out=, so nothing is written through), and a new y must
    keep the first call's layout (not the channels-last temporary the graph wrote through)."""
    import numpy as np

    from cudnnkit.ops import _express
    from cudnnkit.runtime import adapters

    from .fuzz.materialize import FakeArray, FakeBackend
    from .fuzz.model import A
    from .graph_fakes import recording_plans

    bound = recording_plans(monkeypatch)
    b = FakeBackend()
    with b.installed():
        monkeypatch.setitem(adapters.KEYED, FakeArray, lambda a: b.adapters[a.lib].key(a))
        _express.entries.clear()
        x = b.array(A((2, 3, 8, 8), "float16", layout=("c",)), np.zeros((2, 3, 8, 8)), "fakeA", None)
        out = b.array(A((2, 3, 4, 4), "float16", layout=("perm", (0, 2, 3, 1))), np.zeros((2, 3, 4, 4)), "fakeA",
                      None)  # fmt: skip
        for _ in range(4):
            ops.pooling_forward(x, window=3, stride=2, ceil_mode=True, out=out)
            assert bound[-1]["x"][1] != x.ptr  # always the channels-last copy
        strides = []
        for _ in range(3):
            y = ops.pooling_forward(x, window=3, stride=2, ceil_mode=True)
            strides.append(y.__cuda_array_interface__.get("strides"))
        assert strides[0] == strides[1] == strides[2]
        _express.entries.clear()


@pytest.mark.parametrize(
    "mode, x_shape, window, padding, cells",
    [
        ("avg_include_padding", (2, 3, 6, 5), (6, 5), 0, 30),  # global: one output per whole extent
        ("avg_exclude_padding", (2, 3, 7), (7,), 0, 7),  # 1-d (cuDNN's trailing size-1 window)
        ("avg_include_padding", (2, 3, 4, 4, 4), (4, 4, 4), 0, 64),
        ("max", (2, 3, 6, 5), (6, 5), 0, 0),  # max pooling finds the maximum: not a broadcast
        ("avg_include_padding", (2, 3, 6, 6), (3, 3), 0, 0),  # not the whole extent
        ("avg_include_padding", (2, 3, 4, 4), (5, 5), 1, 0),  # padded: cells outside the extent count
    ],
)
def test_global_average_pooling_is_recognised_for_its_broadcast_backward(mode, x_shape, window, padding, cells):
    """The legacy backward of an average over each whole unpadded extent is ``cudnnAddTensor`` of dy / cells
    (tests/gpu/test_pooling_gpu.py checks the values); anything else keeps ``cudnnPoolingBackward``."""
    from cudnnkit.runtime.arrays import contiguous_strides
    from cudnnkit.runtime.view import ArrayView

    def view(shape):
        return ArrayView(shape, contiguous_strides(shape), "float32", 0, 0, None)

    kw = dict(mode=mode, window=window, stride=1, padding=padding)
    vx = view(x_shape)
    vy = view(pl._fwd_resolve({"x": vx}, kw).y_shape)
    r = pl._bwd_resolve({"dy": vy, "y": vy, "x": vx, "index": None}, kw)  # what the backward's call resolves
    assert pl._whole_extent_cells(r, vx, vy) == cells


def test_the_differentiable_forward_caches_whether_it_keeps_the_index(monkeypatch):
    """``_index_kept`` resolves a shape and keywords once (the L3 forward asks on every call); a list (unhashable)
    is resolved each time; a ``Pooling`` object is a key by value; the answer is ``_keeps_index``'s (ceil_mode that
    changes the padding after, for max pooling only); a bad keyword on a miss raises, and the L3 forward raises it on
    a hit too (``pooling_forward`` checks every keyword)."""
    calls = []
    real = pl._resolve_for
    monkeypatch.setattr(pl, "_resolve_for", lambda *a: calls.append(1) or real(*a))
    pl._KEEPS.clear()
    shape = (2, 3, 7, 7)
    kw = dict(mode="max", window=2, stride=None, padding=0, ceil_mode=True, propagate_nan=False, pool=None)
    assert pl._index_kept(shape, kw) is True and pl._index_kept(shape, dict(kw)) is True and len(calls) == 1
    assert pl._index_kept(shape, dict(kw, ceil_mode=False)) is False and len(calls) == 2
    assert pl._index_kept(shape, dict(kw, mode="avg_exclude_padding")) is False and len(calls) == 3
    with pytest.raises(TypeError):
        pl._index_kept(shape, dict(kw, window=2.5))  # a miss: resolved, and refused
    assert pl._index_kept(shape, dict(kw, window=2.0)) is True  # a hit (2.0 hashes as 2) decides nothing else:
    with pytest.raises(TypeError, match="window"):  # the forward's next call, pooling_forward, refuses it
        ops.pooling_forward(FakeCAI(shape, "<f4"), **dict(kw, window=2.0))
    assert len(calls) == 5  # the miss, and pooling_forward's own resolve
    pl._index_kept(shape, dict(kw, window=(2, 2)))
    pl._index_kept(shape, dict(kw, window=(2, 2)))
    assert len(calls) == 6
    pl._index_kept(shape, dict(kw, window=[2, 2]))
    pl._index_kept(shape, dict(kw, window=[2, 2]))
    assert len(calls) == 8  # a list is not a key
    plain = dict(kw, ceil_mode=False)  # pool= with every other keyword at its default
    assert pl._index_kept(shape, dict(plain, pool=ops.Pooling(window=2, ceil_mode=True))) is True
    assert pl._index_kept(shape, dict(plain, pool=ops.Pooling(window=2, ceil_mode=True))) is True
    assert len(calls) == 9


def test_ceil_mode_takes_a_numpy_bool_as_batch_norms_options_do():
    """``ceil_mode=np.True_`` is a bool (graph.checks.as_bool, as the other ops' bool options); an int is not."""
    import numpy as np

    from cudnnkit.ops.pooling import Pooling

    assert Pooling(ceil_mode=np.True_).ceil_mode is True
    with pytest.raises(TypeError, match="ceil_mode must be a bool, got 1"):
        Pooling(ceil_mode=1)
