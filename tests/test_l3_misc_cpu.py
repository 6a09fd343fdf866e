"""The L3 declarations of dropout, LRN, divisive normalization, grid sample, affine grid and CTC on the CPU: the
registry, meta on the GPU samples (shapes against torch's CPU ops, layouts as the L2 ops allocate), the torch
references against the GPU tests' NumPy ones, the checks that come before any GPU work, and the fakes the torch
layer makes from meta."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.ops import dropout as dropout_mod
from cudnnkit.ops._diff import DIFFERENTIABLE, Spec
from cudnnkit.runtime import tensor_descriptor
from cudnnkit.runtime.arrays import contiguous_strides

from .conftest import FakeCAI
from .l3.misc import ONLY_DTYPE, SAMPLES, TORCH_REFERENCE

torch = pytest.importorskip("torch")

DECLARED = {  # name: (primitive, inputs, outputs, arrays, residual keys)
    "dropout": ("dropout_forward", ("x",), ("out",), ("seed",), ("reserve",)),
    "lrn": ("lrn_forward", ("x",), ("out",), (), ("x", "out")),
    "divisive_normalization": ("divisive_normalization_forward", ("x", "means"), ("out",), (), ("x", "means")),
    "grid_sample": ("grid_sample_forward", ("x", "grid"), ("out",), (), ("x", "grid")),
    "affine_grid": ("affine_grid_forward", ("theta",), ("out",), (), ("theta",)),
    "ctc_loss": ("ctc_loss", ("x",), ("costs",), ("labels", "label_lengths", "input_lengths"), ("grads",)),
}


def spec(a: np.ndarray) -> Spec:
    return Spec(a.shape, tuple(s // a.itemsize for s in a.strides), str(a.dtype))


def s(shape, strides=None, dtype="float64") -> Spec:
    return Spec(tuple(shape), tuple(strides) if strides is not None else contiguous_strides(tuple(shape)), dtype)


def meta(name, inputs, kw):
    d = DIFFERENTIABLE[name]
    args = [None if a is None else spec(a) for a in inputs]
    kws = {k: spec(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    return d.meta(*args, **kws)


def cases():
    for name in SAMPLES:
        for dtype in ("float64", "float32"):
            for i, case in enumerate(SAMPLES[name](np.random.default_rng(0), dtype)):
                yield pytest.param(name, dtype, case, id=f"{name}-{dtype}-{i}")


# ----------------------------------------------------------------- the registry


@pytest.mark.parametrize("name", list(DECLARED))
def test_each_op_is_registered_as_declared(name):
    d = DIFFERENTIABLE[name]
    prim, inputs, outputs, arrays, _ = DECLARED[name]
    assert (d.primitive, d.inputs, d.outputs, d.arrays, d.mutated) == (prim, inputs, outputs, arrays, ())
    assert d.differentiable_outputs is None and d.doc
    assert set(SAMPLES) == set(TORCH_REFERENCE) == set(DECLARED)


# ----------------------------------------------------------------- meta on the samples


@pytest.mark.parametrize("name, dtype, case", list(cases()))
def test_meta_on_the_samples_gives_torchs_shapes(name, dtype, case):
    inputs, kw = case
    want_dtype = ONLY_DTYPE.get(name, dtype)
    assert all(a is None or a.dtype == want_dtype for a in inputs)
    outs, res = meta(name, inputs, kw)
    assert len(outs) == len(DECLARED[name][2]) and tuple(res) == DECLARED[name][4]
    ref = TORCH_REFERENCE[name](inputs, kw)
    assert len(ref) == len(outs)
    for o, r in zip(outs, ref):
        assert o.dtype == want_dtype and o.strides == contiguous_strides(o.shape)  # C-order samples: C-order outputs
        if r is not None:
            assert o.shape == tuple(r.shape)
        else:  # dropout (p > 0), divisive normalization with means: y is x-shaped
            assert o.shape == inputs[0].shape
    for k, r in res.items():  # a residual named like an input or an output is that array
        by_name = dict(zip(DECLARED[name][1], [None if a is None else spec(a) for a in inputs]))
        by_name.update(zip(DECLARED[name][2], outs))
        if k in by_name:
            assert r == by_name[k]


def test_dropout_reserve_is_cudnns_size_for_xs_descriptor():
    for shape in ((2, 3, 4, 5), (64,), (3, 4), (1000, 7)):
        x = s(shape, dtype="float32")
        (y,), res = DIFFERENTIABLE["dropout"].meta(x, p=0.5)
        want = dropout_mod._reserve_size(tensor_descriptor("float32", shape, contiguous_strides(shape)))
        assert y == x and res == {"reserve": Spec((want,), (1,), "uint8")} and want > 0
    (y,), res = DIFFERENTIABLE["dropout"].meta(s((0, 3), dtype="float32"), p=0.5)  # empty: an empty reserve
    assert res["reserve"].shape == (0,)


def test_meta_layouts_are_the_l2_ops_allocations():
    dm, lm, dn = (DIFFERENTIABLE[n].meta for n in ("dropout", "lrn", "divisive_normalization"))
    nhwc = (60, 1, 15, 3)
    # a dense x: its layout; a gapped or expanded one: C order (copied first)
    assert dm(s((2, 3, 4, 5), nhwc), p=0.1)[0][0].strides == nhwc
    assert dm(s((2, 3, 4, 5), (120, 40, 10, 2)), p=0.1)[0][0].strides == (60, 20, 5, 1)
    assert lm(s((2, 3, 4, 5), nhwc), size=3)[0][0].strides == nhwc
    assert lm(s((2, 3, 4, 5), (0, 0, 0, 0)), size=3)[0][0].strides == (60, 20, 5, 1)
    # a dense 5-d x whose spatial dims do not merge into one or two: LRN copies it to C order
    assert lm(s((2, 3, 4, 5, 6), (360, 1, 18, 72, 3)), size=3)[0][0].strides == contiguous_strides((2, 3, 4, 5, 6))
    assert lm(s((2, 3, 4, 5, 6), (360, 1, 90, 18, 3)), size=3)[0][0].strides == (360, 1, 90, 18, 3)  # NDHWC merges
    # divisive normalization: NCHW or NHWC only; x and means in different layouts: x's (one copy either way)
    assert dn(s((2, 3, 4, 5), nhwc), s((2, 3, 4, 5)), size=3)[0][0].strides == nhwc
    assert dn(s((2, 3, 4, 5)), s((2, 3, 4, 5), nhwc), size=3)[0][0].strides == (60, 20, 5, 1)
    # a layout divisive normalization does not take (NWHC-like): C order
    assert dn(s((2, 3, 4, 5), (60, 1, 3, 12)), None, size=3)[0][0].strides == (60, 20, 5, 1)
    # an expanded x (copied to C order by prepare) with an NHWC means: C order, the copy's layout, wins the tie
    assert dn(s((2, 3, 4, 5), (0, 0, 0, 0)), s((2, 3, 4, 5), nhwc), size=3)[0][0].strides == (60, 20, 5, 1)
    # the spatial transformer allocates C order whatever x's layout
    (y,), _ = DIFFERENTIABLE["grid_sample"].meta(s((2, 3, 4, 5), nhwc), s((2, 6, 7, 2)))
    assert y == s((2, 3, 6, 7))


def test_ctc_meta_shapes_and_checks():
    m = DIFFERENTIABLE["ctc_loss"].meta
    i32 = lambda n: s((n,), dtype="int32")  # noqa: E731
    (costs,), res = m(s((6, 2, 5), (1, 30, 6), "float32"), labels=i32(3), label_lengths=i32(2), input_lengths=i32(2))
    assert costs == s((2,), dtype="float32") and res == {"grads": s((6, 2, 5), dtype="float32")}
    want = torch.nn.functional.ctc_loss(torch.randn(6, 2, 5).log_softmax(-1), torch.tensor([1, 2, 3]),
                                        torch.tensor([6, 4]), torch.tensor([2, 1]), reduction="none")  # fmt: skip
    assert costs.shape == tuple(want.shape)
    with pytest.raises(ValueError, match="label_lengths has 3 values but x has a batch of N=2"):
        m(s((6, 2, 5), dtype="float32"), labels=i32(3), label_lengths=i32(3), input_lengths=i32(2))
    with pytest.raises(ValueError, match="input_lengths must be a 1-d integer array"):
        m(s((6, 2, 5), dtype="float32"), labels=i32(3), label_lengths=i32(2), input_lengths=s((2,)))
    with pytest.raises(TypeError, match="ctc_loss needs labels="):
        m(s((6, 2, 5), dtype="float32"), label_lengths=i32(2), input_lengths=i32(2))


# ----------------------------------------------------------------- the torch references


def test_lrn_reference_is_cudnns_formula_for_every_size():
    from .gpu.test_norm_dropout_gpu import ref_lrn

    a = np.random.default_rng(0).standard_normal((2, 7, 3, 4))
    for size in (1, 2, 3, 4, 5, 6):
        got = TORCH_REFERENCE["lrn"]((a,), dict(size=size, lrn_alpha=0.7, lrn_beta=0.6, k=1.3))[0].numpy()
        assert np.allclose(got, ref_lrn(a, size, 0.7, 0.6, 1.3)[0], rtol=1e-13, atol=0)


def test_divnorm_reference_is_the_gpu_tests_formula():
    from .gpu.test_norm_dropout_gpu import ref_divnorm

    rng = np.random.default_rng(0)
    for shape in ((2, 3, 7, 6), (2, 3, 4, 5, 6), (2, 3, 7)):
        a = rng.standard_normal(shape)
        for size in (1, 3, 5):
            got = TORCH_REFERENCE["divisive_normalization"]((a, None), dict(size=size, lrn_alpha=0.7, lrn_beta=0.6,
                                                                            k=1.3))[0].numpy()  # fmt: skip
            assert np.allclose(got, ref_divnorm(a, size, 0.7, 0.6, 1.3)[0], rtol=1e-13, atol=0)
    assert TORCH_REFERENCE["divisive_normalization"]((a, a), {"size": 3}) == (None,)


def test_dropout_reference_only_for_p_0():
    x = np.ones((3, 4))
    assert torch.equal(TORCH_REFERENCE["dropout"]((x,), {"p": 0.0})[0], torch.ones(3, 4, dtype=torch.float64))
    assert TORCH_REFERENCE["dropout"]((x,), {"p": 0.5}) == (None,)


def test_ctc_reference_takes_logits():
    (inputs, kw), _ = SAMPLES["ctc_loss"](np.random.default_rng(0), "float64")
    (c,) = TORCH_REFERENCE["ctc_loss"](inputs, kw)
    (c2,) = TORCH_REFERENCE["ctc_loss"]((inputs[0] + 3.0,), kw)  # a shift per row does not change the softmax
    assert c.dtype == torch.float64 and torch.isfinite(c).all() and torch.allclose(c, c2)


# ----------------------------------------------------------------- checks before any GPU work


def dev(shape, typestr="<f8"):
    return FakeCAI(shape, typestr)


X4 = (2, 3, 4, 5)
BAD = [
    # (name, inputs, kw, error, match): meta refuses them, and so does the forward on device arrays, before the GPU
    ("dropout", (X4,), {"p": 1.0}, ValueError, r"p must be in \[0, 1\), got 1.0"),
    ("dropout", (X4,), {"p": -0.1}, ValueError, r"p must be in \[0, 1\)"),
    ("dropout", (X4,), {"p": True}, TypeError, "p must be a float"),
    ("lrn", (X4,), {"size": 0}, ValueError, r"size must be in \[1, 16\]"),
    ("lrn", (X4,), {"size": 3, "k": 0.0}, ValueError, "k must be >= 1e-05"),
    ("lrn", (X4,), {"lrn_beta": 0.0}, ValueError, "lrn_beta must be >= 0.01"),
    ("lrn", ((2, 3),), {}, ValueError, "x must have 3 to 8 dims"),
    ("divisive_normalization", (X4, None), {"size": 4}, ValueError, "size=4: the differentiable divisive normal"),
    ("divisive_normalization", (X4, (2, 3, 4, 4)), {"size": 3}, ValueError, "means has shape"),
    ("divisive_normalization", ((1, 2, 3, 4, 5, 6), None), {"size": 3}, ValueError, "x must have 3 to 5 dims"),
    ("grid_sample", (X4, (2, 6, 7, 3)), {}, ValueError, r"grid must have shape \(N, H, W, 2\)"),
    ("grid_sample", (X4, (3, 6, 7, 2)), {}, ValueError, "grid has N = 3 but x has N = 2"),
    ("affine_grid", ((2, 2, 3),), {"size": (2, 3, 1, 5)}, ValueError, "size needs H >= 2 and W >= 2"),
    ("affine_grid", ((2, 2, 3),), {"size": (2, 3, 5)}, ValueError, r"size must be \(N, C, H, W\)"),
    ("affine_grid", ((2, 3, 3),), {"size": (2, 3, 4, 5)}, ValueError, r"theta must have shape \(N, 2, 3\)"),
]
CTC_KW = dict(labels=np.array([1, 2, 3], np.int32), label_lengths=np.array([2, 1], np.int32),
              input_lengths=np.array([6, 4], np.int32))  # fmt: skip
BAD_CTC = [
    ({"normalization": "none"}, ValueError, "normalization='none': cuDNN's grads in this mode are not the gradient"),
    ({"blank": 1}, ValueError, "blank=1: cuDNN's CTC loss always uses label 0"),
    ({"algo": "fast"}, ValueError, "algo must be one of"),
    ({"typestr": "<f8"}, TypeError, "x has dtype float64; cuDNN's CTC loss supports float32 only"),
]


@pytest.mark.parametrize("name, shapes, kw, err, match", BAD)
def test_bad_options_are_refused_by_meta_and_forward(name, shapes, kw, err, match):
    d = DIFFERENTIABLE[name]
    with pytest.raises(err, match=match):
        d.meta(*(None if sh is None else s(sh) for sh in shapes), **kw)
    with pytest.raises(err, match=match):
        d.forward(*(None if sh is None else dev(sh) for sh in shapes), **kw)


@pytest.mark.parametrize("kw, err, match", BAD_CTC)
def test_bad_ctc_options_are_refused_by_meta_and_forward(kw, err, match):
    d, kw = DIFFERENTIABLE["ctc_loss"], dict(kw)
    typestr = kw.pop("typestr", "<f4")
    with pytest.raises(err, match=match):
        d.meta(s((6, 2, 5), dtype="float32" if typestr == "<f4" else "float64"),
               **{k: spec(v) for k, v in CTC_KW.items()}, **kw)  # fmt: skip
    with pytest.raises(err, match=match):
        d.forward(dev((6, 2, 5), typestr), **CTC_KW, **kw)


def test_ctc_forward_checks_label_values_before_the_gpu():
    with pytest.raises(ValueError, match=r"labels\[0\] is 0, the blank"):
        DIFFERENTIABLE["ctc_loss"].forward(dev((6, 2, 5), "<f4"), **dict(CTC_KW, labels=np.array([0, 2, 3])))


def test_a_missing_cotangent_gives_no_gradient():
    for name, kw in (("dropout", {"p": 0.5}), ("lrn", {}), ("divisive_normalization", {}), ("grid_sample", {}),
                     ("affine_grid", {"size": (2, 3, 4, 5)}), ("ctc_loss", {})):  # fmt: skip
        d = DIFFERENTIABLE[name]
        n = len(d.inputs)
        assert d.backward({}, (None,), (True,) * n, **kw) == (None,) * n
        assert d.backward({}, (object(),), (False,) * n, **kw) == (None,) * n


# ----------------------------------------------------------------- the torch layer's fakes


def test_the_torch_fakes_come_from_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cudnnkit.torch import _library as L

    ops = {n: L.define(DIFFERENTIABLE[n], namespace="cudnnkit_l3misc_test") for n in DECLARED}
    f64 = torch.float64
    with FakeTensorMode():
        x = torch.empty(2, 3, 4, 5, dtype=f64)
        y, reserve = ops["dropout"].forward_op(*ops["dropout"].args(x, p=0.5))
        assert y.shape == x.shape and reserve.dtype == torch.uint8 and reserve.dim() == 1
        (y,) = ops["lrn"].forward_op(*ops["lrn"].args(x.to(memory_format=torch.channels_last), size=3))
        assert y.shape == x.shape and y.is_contiguous(memory_format=torch.channels_last)
        (y,) = ops["divisive_normalization"].forward_op(*ops["divisive_normalization"].args(x, None, size=3))
        assert y.shape == x.shape
        (y,) = ops["grid_sample"].forward_op(*ops["grid_sample"].args(x, torch.empty(2, 6, 7, 2, dtype=f64)))
        assert y.shape == (2, 3, 6, 7)
        (g,) = ops["affine_grid"].forward_op(
            *ops["affine_grid"].args(torch.empty(2, 2, 3, dtype=f64), size=(2, 3, 4, 5))
        )
        assert g.shape == (2, 4, 5, 2)
        lab = [torch.empty(3, dtype=torch.int32), torch.empty(2, dtype=torch.int64), torch.empty(2, dtype=torch.int64)]
        costs, grads = ops["ctc_loss"].forward_op(
            *ops["ctc_loss"].args(torch.empty(6, 2, 5), **dict(zip(("labels", "label_lengths", "input_lengths"), lab)))
        )
        assert costs.shape == (2,) and grads.shape == (6, 2, 5) and grads.dtype == torch.float32


def test_torch_meta_is_asked_on_the_tensors_device_and_cached_per_device(monkeypatch):
    """A meta may ask cuDNN a size on the current device (batch norm's fused reserve, the RNN's reserve): the
    dispatcher path asks it with the tensors' device current (a cuda:1 tensor while cuda:0 is current), and caches
    it per device. The CUDA calls are stand-ins that record the current device."""
    import contextlib
    import types

    from cudnnkit.ops._diff import Differentiable, new_like
    from cudnnkit.torch import _library as L

    current = [0]

    @contextlib.contextmanager
    def device(d):
        before, current[0] = current[0], d
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", device)
    seen = []

    def meta(x, **kw):
        seen.append(current[0])
        return (new_like(x),), {}

    d = Differentiable("meta_device_probe", "softmax_forward", ("x",), ("out",), lambda x, **kw: ((x,), {}),
                       lambda res, douts, needs, **kw: (douts[0],), meta)  # fmt: skip

    def tensor(index):
        return types.SimpleNamespace(device=torch.device("cuda", index), dtype=torch.float32, shape=(2, 3),
                                     stride=lambda: (3, 1))  # fmt: skip

    for index in (1, 1, 0, 1):
        out_specs, _ = L._layout(d, [tensor(index)], {}, {}, "kw")
        assert out_specs[0].shape == (2, 3) and current[0] == 0
    assert seen == [1, 0], seen  # asked once per device, each time with that device current
