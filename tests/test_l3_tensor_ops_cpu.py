"""The L3 declarations of op_tensor, reduce_tensor and transform_tensor on the CPU: the registry, meta on the GPU
samples (shapes against torch's CPU ops, layouts as the L2 ops allocate), the checks that come before any GPU
work, and the gradients themselves: with the L2 calls the backward makes (op_tensor, reduce_tensor,
transform_tensor, add_tensor, set_tensor, activation_backward) and _diff's array helpers (window, host_values,
from_host) replaced by torch CPU stand-ins that run the real ops' resolve checks first, every sample's forward and
backward are compared with torch autograd of the references, and the torch custom ops made from the declarations
pass gradcheck and opcheck. tests/test_l3_strict_cpu.py runs the same declarations on cudnnkit's own device arrays
(no operators) through the real L2 sequence."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.ops import arith as ar
from cudnnkit.ops import tensor as tn
from cudnnkit.ops._diff import DIFFERENTIABLE, Spec
from cudnnkit.ops._primitive import REGISTRY
from cudnnkit.runtime.arrays import contiguous_strides
from cudnnkit.runtime.view import ArrayView

from .conftest import FakeCAI
from .l3.tensor_ops import SAMPLES, TORCH_REFERENCE

torch = pytest.importorskip("torch")

DECLARED = {  # name: (primitive, inputs, outputs, arrays)
    "op_tensor": ("op_tensor", ("a", "b"), ("out",), ()),
    "reduce_tensor": ("reduce_tensor", ("a",), ("out",), ()),
    "transform_tensor": ("transform_tensor", ("x",), ("out",), ()),
}
OP_RES = {"add": ("b",), "mul": ("a", "b"), "min": ("a", "b"), "max": ("a", "b"), "sqrt": ("out",), "not": ("a",)}
REDUCE_RES = {op: ("a",) if op in ("add", "avg", "norm1") else ("a", "out") for op in ar._REDUCE}


def spec(a: np.ndarray) -> Spec:
    return Spec(a.shape, tuple(s // a.itemsize for s in a.strides), str(a.dtype))


def s(shape, strides=None, dtype="float64") -> Spec:
    return Spec(tuple(shape), tuple(strides) if strides is not None else contiguous_strides(tuple(shape)), dtype)


def meta(name, inputs, kw):
    return DIFFERENTIABLE[name].meta(*(None if a is None else spec(a) for a in inputs), **kw)


def residual_keys(name, kw):
    if name == "op_tensor":
        return OP_RES[kw.get("op", "add")]
    return REDUCE_RES[kw.get("op", "add")] if name == "reduce_tensor" else ("x",)


def cases(dtypes=("float64", "float32")):
    for name in SAMPLES:
        for dtype in dtypes:
            for i, case in enumerate(SAMPLES[name](np.random.default_rng(0), dtype)):
                yield pytest.param(name, dtype, case, id=f"{name}-{dtype}-{i}")


# ----------------------------------------------------------------- the registry


@pytest.mark.parametrize("name", list(DECLARED))
def test_each_op_is_registered_as_declared(name):
    d = DIFFERENTIABLE[name]
    prim, inputs, outputs, arrays = DECLARED[name]
    assert (d.primitive, d.inputs, d.outputs, d.arrays, d.mutated) == (prim, inputs, outputs, arrays, ())
    assert d.differentiable_outputs is None and d.doc
    assert set(d.inputs) <= set(REGISTRY[prim].differentiable)
    assert set(SAMPLES) == set(TORCH_REFERENCE) == set(DECLARED)


def test_every_primitive_with_outputs_has_an_l3_form():
    """Every primitive with outputs that is not a backward (set, scale and add_tensor work in place: no outputs)
    is some declaration's forward, and every primitive declaring differentiable operands is one."""
    forwards = {d.primitive for d in DIFFERENTIABLE.values()}
    missing = [p for p, prim in REGISTRY.items() if prim.outputs and "_backward" not in p and p not in forwards]
    assert not missing, missing
    assert all(p in forwards for p, prim in REGISTRY.items() if prim.differentiable)


# ----------------------------------------------------------------- meta on the samples


@pytest.mark.parametrize("name, dtype, case", list(cases()))
def test_meta_on_the_samples_gives_torchs_shapes(name, dtype, case):
    inputs, kw = case
    assert all(a is None or a.dtype == dtype for a in inputs)
    outs, res = meta(name, inputs, kw)
    assert tuple(res) == residual_keys(name, kw)
    (ref,) = TORCH_REFERENCE[name](inputs, kw)
    (o,) = outs
    assert o.shape == tuple(ref.shape) and o.dtype == dtype
    if name != "transform_tensor" or not kw.get("layout") == "nhwc":
        assert o.strides == contiguous_strides(o.shape)
    by_name = dict(zip(DECLARED[name][1], [None if a is None else spec(a) for a in inputs]), out=o)
    assert all(r == by_name[k] for k, r in res.items())  # a residual named like an input or the output is it


def test_meta_layouts_are_the_l2_ops_allocations():
    om, rm, tm = (DIFFERENTIABLE[n].meta for n in DECLARED)
    nhwc = (60, 1, 15, 3)
    # op_tensor and reduce_tensor write packed C-order outputs whatever the inputs' layout
    assert om(s((2, 3, 4, 5), nhwc), s((1, 3, 1, 1)), op="mul")[0][0] == s((2, 3, 4, 5))
    assert rm(s((2, 3, 4, 5), nhwc), op="max", axes=(0, 2))[0][0] == s((1, 3, 1, 5))
    assert rm(s((2, 3, 4, 5)), axes=None)[0][0] == s((1, 1, 1, 1))
    # transform_tensor: like x where dense and unpadded, else C order; a layout gives its strides
    assert tm(s((2, 3, 4, 5), nhwc))[0][0].strides == nhwc
    assert tm(s((2, 3, 4, 5)), layout="nhwc")[0][0].strides == nhwc
    assert tm(s((2, 3, 4, 5), nhwc), layout="nchw")[0][0].strides == (60, 20, 5, 1)
    assert tm(s((2, 3, 4, 5), (120, 40, 10, 2)))[0][0].strides == (60, 20, 5, 1)  # gapped: C order
    assert tm(s((2, 3, 4, 5), nhwc), pad_after=1)[0][0] == s((3, 4, 5, 6))
    (y,), res = tm(s((2, 3), dtype="float16"), pad_before=(1, 0))
    assert y == s((3, 3), dtype="float16") and res == {"x": s((2, 3), dtype="float16")}


# ----------------------------------------------------------------- checks before any GPU work


def dev(shape, typestr="<f8"):
    return FakeCAI(shape, typestr)


X4 = (2, 3, 4, 5)
BAD = [
    # (name, inputs, kw, error, match): meta refuses them, and so does the forward on device arrays, before the GPU
    ("op_tensor", (X4, X4), {"op": "sub"}, ValueError, "op must be one of"),
    ("op_tensor", (X4, None), {"op": "mul"}, TypeError, "op='mul' is binary: b is required"),
    ("op_tensor", (X4, X4), {"op": "sqrt"}, ValueError, "op='sqrt' is unary"),
    ("op_tensor", (X4, (2, 3, 4)), {}, ValueError, "b has 3 dims but a has 4"),
    ("op_tensor", (X4, (1, 2, 1, 1)), {}, ValueError, r"b's dim 1 is 2; it must equal a's \(3\) or be 1"),
    ("op_tensor", ((1, 2, 3, 4, 5, 6), (1, 1, 1, 1, 1, 1)), {}, ValueError, "a must have 1 to 5 dims"),
    ("op_tensor", (X4, X4), {"alpha2": "x"}, TypeError, "alpha2 must be a real number"),
    ("op_tensor", (X4, X4), {"alpha1": float("nan")}, ValueError, "alpha1"),
    ("op_tensor", (X4, X4), {"propagate_nan": 1}, TypeError, "propagate_nan must be a bool"),
    ("reduce_tensor", (X4,), {"op": "sum"}, ValueError, "op must be one of"),
    ("reduce_tensor", (X4,), {"axes": 4}, ValueError, "axis 4 is out of range for 4 dims"),
    ("reduce_tensor", (X4,), {"axes": (1, -3)}, ValueError, "axis -3 is given twice"),
    ("reduce_tensor", ((0, 3),), {}, ValueError, "cuDNN reduces non-empty tensors only"),
    ("reduce_tensor", ((1,) * 9,), {}, ValueError, "a must have 1 to 8 dims"),
    ("transform_tensor", ((2, 3),), {"layout": "nhwc"}, ValueError, "needs at least 3 dims"),
    ("transform_tensor", (X4,), {"layout": "ncdhw"}, ValueError, "layout must be one of"),
    ("transform_tensor", (X4,), {"pad_before": -1}, ValueError, "pad_before"),
    ("transform_tensor", (X4,), {"pad_after": (1, 2)}, ValueError, "pad_after"),
]


@pytest.mark.parametrize("name, shapes, kw, err, match", BAD)
def test_bad_options_are_refused_by_meta_and_forward(name, shapes, kw, err, match):
    d = DIFFERENTIABLE[name]
    with pytest.raises(err, match=match):
        d.meta(*(None if sh is None else s(sh) for sh in shapes), **kw)
    with pytest.raises(err, match=match):
        d.forward(*(None if sh is None else dev(sh) for sh in shapes), **kw)


def test_dtypes_and_dropped_keywords_are_refused():
    om, rm, tm = (DIFFERENTIABLE[n].meta for n in DECLARED)
    with pytest.raises(TypeError, match="a has dtype int32; op_tensor needs one of"):
        om(s(X4, dtype="int32"), s(X4, dtype="int32"))
    with pytest.raises(TypeError, match="b has dtype float32 but a has dtype float64"):
        om(s(X4), s(X4, dtype="float32"))
    with pytest.raises(TypeError, match="x has dtype int8; transform_tensor needs one of"):
        tm(s(X4, dtype="int8"))
    for f, bad in ((om, "beta"), (om, "out"), (rm, "indices"), (rm, "alpha"), (tm, "alpha"), (tm, "out")):
        with pytest.raises(TypeError, match=bad):
            f(s(X4), **{bad: 1.0})


def test_a_missing_cotangent_gives_no_gradient():
    for name, kw, n in (("op_tensor", {"op": "mul"}, 2), ("reduce_tensor", {"op": "max"}, 1),
                        ("transform_tensor", {"pad_before": 1}, 1)):  # fmt: skip
        d = DIFFERENTIABLE[name]
        assert d.backward({}, (None,), (True,) * n, **kw) == (None,) * n
        assert d.backward({}, (object(),), (False,) * n, **kw) == (None,) * n


# ----------------------------------------------------------------- the gradients, with torch CPU stand-ins for L2


def _tv(t):
    """An ArrayView of a CPU tensor, for the resolve checks the stand-ins run."""
    return ArrayView(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."), 0, 0, None)


def _float(name, t):
    assert t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), f"{name} is {t.dtype}"
    return _tv(t)


class StandIns:
    """op_tensor, reduce_tensor, transform_tensor, add_tensor, set_tensor as torch CPU ops, after the real ops'
    resolve checks on the same arguments (so a call the real op would refuse fails here too); ``calls`` records
    their names."""

    def __init__(self):
        self.calls = []

    def op_tensor(self, a, b=None, *, op="add", alpha1=1.0, alpha2=1.0, propagate_nan=False):
        self.calls.append("op_tensor")
        views = {"a": _float("a", a), "b": None if b is None else _float("b", b)}
        ar._op_resolve(views, dict(op=op, alpha2=alpha2, propagate_nan=propagate_nan))
        x = a * alpha1
        if op in ("sqrt", "not"):
            return (torch.sqrt(x) if op == "sqrt" else 1 - x).contiguous()
        y = b * alpha2
        f = {"add": torch.add, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]
        return f(x, y).contiguous()

    def reduce_tensor(self, a, op="add", *, axes=None, propagate_nan=False, alpha=1.0):
        self.calls.append("reduce_tensor")
        r = ar._reduce_resolve({"a": _float("a", a)}, dict(op=op, axes=axes, propagate_nan=propagate_nan))
        (got,) = TORCH_REFERENCE["reduce_tensor"]((a,), dict(op=op, axes=axes))
        assert tuple(got.shape) == r.shape
        return (got.to(a.dtype) * alpha).contiguous()

    def transform_tensor(self, x, *, layout=None, pad_before=0, pad_after=0, alpha=1.0):
        self.calls.append("transform_tensor")
        r = tn._transform_resolve({"x": _float("x", x)}, dict(layout=layout, pad_before=pad_before,
                                                               pad_after=pad_after, out=None))  # fmt: skip
        y = torch.empty_strided(r.shape, r.strides or contiguous_strides(r.shape), dtype=x.dtype).zero_()
        y[tuple(slice(b, b + n) for b, n in zip(r.before, x.shape))] = x * alpha
        return y

    def add_tensor(self, a, c, *, alpha=1.0, beta=1.0):
        self.calls.append("add_tensor")
        tn._add_resolve({"a": _float("a", a), "c": _float("c", c)}, {})
        c.copy_(a * alpha if beta == 0 else a * alpha + c * beta)
        return c

    def set_tensor(self, y, value):
        self.calls.append("set_tensor")
        _float("y", y)
        return y.fill_(value)

    def activation_backward(self, dy, y, x, mode="relu", *, out=None, alpha=1.0, beta=0.0):
        """cudnnActivationBackward's ReLU (the mode the declarations use): ``alpha * dy * (x > 0) + beta * out``."""
        self.calls.append("activation_backward")
        assert mode == "relu" and y.shape == x.shape == dy.shape
        got = dy * (x > 0) * alpha
        if out is None:
            return got.contiguous()
        out.copy_(got + beta * out)
        return out

    def window(self, a, start, shape, name="array"):
        self.calls.append("window")
        return a[tuple(slice(b, b + n) for b, n in zip(start, shape))]

    def host_values(self, a, name="array"):
        self.calls.append("host_values")
        return a.detach().to(torch.float64).numpy().copy()

    def from_host(self, values, like, name="array"):
        self.calls.append("from_host")
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(like.dtype)


@pytest.fixture
def l2(monkeypatch):
    fake = StandIns()
    for mod in (ar, tn):
        for n in (
            "op_tensor",
            "reduce_tensor",
            "transform_tensor",
            "add_tensor",
            "set_tensor",
            "activation_backward",
            "host_values",
            "from_host",
            "window",
        ):
            if hasattr(mod, n):
                monkeypatch.setattr(mod, n, getattr(fake, n))
    monkeypatch.setattr(tn, "as_view", lambda t, name="array": _tv(t))
    return fake


def _check_case(name, inputs, kw, seed=0, dc_layout=None):
    """Forward and backward of the declaration (with the stand-ins) against torch autograd of the reference."""
    d = DIFFERENTIABLE[name]
    ins = [None if a is None else torch.from_numpy(a.copy()) for a in inputs]
    (out,), res = d.forward(*ins, **kw)
    m_outs, m_res = d.meta(*(None if t is None else _spec(t) for t in ins), **kw)
    assert list(m_res) == list(res) and _spec(out) == m_outs[0]
    leaves = [None if t is None else t.clone().requires_grad_() for t in ins]
    (want,) = TORCH_REFERENCE[name](leaves, kw)
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)
    dc = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(out.shape)))
    if dc_layout == "expanded":  # a cotangent as torch's sum() gives it
        dc = dc.reshape(-1)[:1].reshape((1,) * dc.dim()).expand(dc.shape)
    grads = d.backward(res, (dc,), tuple(t is not None for t in ins), **kw)
    present = [t for t in leaves if t is not None]
    refs = torch.autograd.grad(want, present, dc)
    assert all(g is None for g, t in zip(grads, ins) if t is None)
    for g, r, t in zip([g for g, t in zip(grads, ins) if t is not None], refs, present):
        assert tuple(g.shape) == tuple(t.shape) and g.dtype == t.dtype
        assert torch.allclose(g, r, rtol=1e-10, atol=1e-12), (name, kw, (g - r).abs().max())
        assert g.untyped_storage().data_ptr() != dc.untyped_storage().data_ptr()  # never the cotangent itself
    return grads


def _spec(t):
    return Spec(tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))


@pytest.mark.parametrize("name, dtype, case", list(cases(("float64",))))
def test_each_samples_gradient_is_torchs(l2, name, dtype, case):
    inputs, kw = case
    _check_case(name, inputs, kw)
    _check_case(name, inputs, kw, seed=1, dc_layout="expanded")


def test_ties_and_zeros_follow_torchs_rules(l2):
    f = np.float64
    # torch.maximum/minimum: half of dc to each side where the scaled values are equal
    a, b = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5]], f), np.array([[2.0, 2.0, 2.0]], f)
    for op in ("max", "min"):
        _check_case("op_tensor", (a, b), dict(op=op))
        _check_case("op_tensor", (a, b / 2), dict(op=op, alpha2=2.0))
    # torch.amax/amin: shared evenly among the tied elements; amax of |a|: with the sign
    t = np.array([[3.0, 1.0, 3.0, 3.0], [-2.0, 2.0, 0.0, 1.0]], f)
    for op in ("max", "min", "amax"):
        _check_case("reduce_tensor", (t,), dict(op=op, axes=1))
        _check_case("reduce_tensor", (t,), dict(op=op))
    # torch.prod with zeros (none, one, two in a slice), norm2 of an all-zero slice (0, not NaN), norm1 at 0
    z = np.array([[0.0, 2.0, 3.0], [1.5, -2.0, 0.5], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0]], f)
    for op in ("mul", "norm2", "norm1", "mul_no_zeros"):
        g = _check_case("reduce_tensor", (z,), dict(op=op, axes=1))
        assert torch.isfinite(g[0]).all()
    _check_case("reduce_tensor", (z[None],), dict(op="mul", axes=(0, 1)))


def test_the_backward_calls(l2):
    a, b = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(1, 3, 1, dtype=torch.float64)
    d = DIFFERENTIABLE["op_tensor"]
    (c,), res = d.forward(a, b, op="add")
    assert res == {"b": b} and l2.calls == ["op_tensor"]
    dc = torch.randn(2, 3, 4, dtype=torch.float64)
    l2.calls.clear()
    da, db = d.backward(res, (dc,), (True, True), op="add")
    assert l2.calls == ["transform_tensor", "reduce_tensor"]  # alpha1 dc; the sum over b's broadcast dims
    l2.calls.clear()
    assert d.backward(res, (dc,), (False, True), op="add")[0] is None and l2.calls == ["reduce_tensor"]
    # reduce add: a padded transform (the allocation) and one add_tensor broadcast; 6 dims merged for it
    r = DIFFERENTIABLE["reduce_tensor"]
    (c,), res = r.forward(a, op="add", axes=(0, 2))
    l2.calls.clear()
    r.backward(res, (torch.randn(1, 3, 1, dtype=torch.float64),), (True,), op="add", axes=(0, 2))
    assert l2.calls == ["transform_tensor", "add_tensor"]
    many = torch.randn(2, 2, 2, 2, 2, 2, dtype=torch.float64)
    (c,), res = r.forward(many, op="add", axes=(0, 2, 4))
    with pytest.raises(NotImplementedError, match="5 dims at most"):
        r.backward(res, (torch.ones_like(c),), (True,), op="add", axes=(0, 2, 4))
    # transform: dy's interior, back in x's layout (channels last here)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64).to(memory_format=torch.channels_last)
    t = DIFFERENTIABLE["transform_tensor"]
    (y,), res = t.forward(x, layout="nchw", pad_before=(0, 0, 1, 1))
    assert y.is_contiguous() and y.shape == (2, 3, 5, 6)
    (dx,) = t.backward(res, (torch.randn(2, 3, 5, 6, dtype=torch.float64),), (True,), layout="nchw",
                       pad_before=(0, 0, 1, 1))  # fmt: skip
    assert dx.shape == x.shape and dx.is_contiguous(memory_format=torch.channels_last)


# ----------------------------------------------------------------- the torch custom ops, on the stand-ins


@pytest.fixture(scope="module")
def torch_ops():
    from cudnnkit.torch import _library as L

    return {n: L.define(DIFFERENTIABLE[n], namespace="cudnnkit_l3tensor_test") for n in DECLARED}


def _smooth(name, inputs, kw):
    """gradcheck's finite differences need a function smooth at the sample: not at mul_no_zeros' zeros."""
    return not (kw.get("op") == "mul_no_zeros" or (kw.get("op") == "mul" and any((a == 0).any() for a in inputs)))


@pytest.mark.parametrize("name, dtype, case", list(cases(("float64",))))
def test_the_torch_ops_pass_gradcheck_and_opcheck(l2, torch_ops, name, dtype, case):
    inputs, kw = case
    op = torch_ops[name]
    ins = [None if a is None else torch.from_numpy(a.copy()).requires_grad_() for a in inputs]
    got = op(*ins, **kw)
    (want,) = TORCH_REFERENCE[name](ins, kw)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    if _smooth(name, inputs, kw):
        present = [t for t in ins if t is not None]

        def f(*xs):
            it = iter(xs)
            return op(*[None if t is None else next(it) for t in ins], **kw)

        assert torch.autograd.gradcheck(f, tuple(present), fast_mode=True)
    torch.library.opcheck(op.forward_op, op.args(*ins, **kw),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))  # fmt: skip


def test_the_torch_fakes_come_from_meta(torch_ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(2, 3, 4, 5, dtype=torch.float64)
        (c,) = torch_ops["op_tensor"].forward_op(*torch_ops["op_tensor"].args(a, torch.empty(1, 3, 1, 1,
                                                                             dtype=torch.float64), op="max"))  # fmt: skip
        assert c.shape == a.shape and c.is_contiguous()
        (c,) = torch_ops["reduce_tensor"].forward_op(*torch_ops["reduce_tensor"].args(a, op="norm2", axes=(1, 3)))
        assert c.shape == (2, 1, 4, 1)
        (y,) = torch_ops["transform_tensor"].forward_op(*torch_ops["transform_tensor"].args(a, layout="nhwc"))
        assert y.shape == a.shape and y.is_contiguous(memory_format=torch.channels_last)
        (y,) = torch_ops["transform_tensor"].forward_op(*torch_ops["transform_tensor"].args(a, pad_after=(0, 1, 0, 2)))
        assert y.shape == (2, 4, 4, 7) and y.is_contiguous()
