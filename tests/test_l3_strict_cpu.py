"""The L3 declarations on the arrays of cudnnkit.jax's GPU handlers, on the CPU: cudnnkit's own ``DeviceArray``
(runtime/adapters/_raw.py), which has no arithmetic, comparison or indexing, only what the adapter protocol and
``_diff``'s module docstring promise (shape, strides, dtype, ``reshape`` of a C-contiguous array).

Its "device" here is host memory: the raw adapter's allocation and copies are NumPy over that memory, and the
cuDNN call of every primitive (``_primitive._launch_form``, after the real L2 checks, routing, allocation and
layout planning) is a NumPy kernel over the call's views for the primitives the tensor declarations use
(op_tensor, reduce_tensor, transform_tensor, add_tensor, set_tensor, scale_tensor, activation_backward's ReLU) and
nothing for the others (their outputs stay zeros). So:

* every declaration's forward and backward run on DeviceArrays: a framework operator (``dc * mask``, ``a > 0``,
  ``dy[...]``) in a declaration is a TypeError here, as it was inside the XLA handlers on the GPU (op_tensor,
  reduce_tensor, transform_tensor);
* the tensor declarations' gradients, computed by those kernels through the real L2 plumbing (and the host
  round trip of the gradients cuDNN cannot divide), equal torch autograd's.
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import pytest

from cudnnkit import autograd
from cudnnkit.ops import _express, _primitive
from cudnnkit.ops._diff import DIFFERENTIABLE, from_host, host_values, window
from cudnnkit.runtime.adapters import _raw
from cudnnkit.runtime.arrays import as_view, contiguous_strides

from . import l3

torch = pytest.importorskip("torch")

SAMPLES, REFS = l3.tables()


# ----------------------------------------------------------------- host memory as the device


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _extent(shape, strides, dtype) -> int:
    if 0 in shape:
        return 0
    return (1 + sum((d - 1) * s for d, s in zip(shape, strides))) * _np_dtype(dtype).itemsize


def values(a) -> np.ndarray:
    """A NumPy view of a DeviceArray's (or an ArrayView's) memory, with its shape and strides (writable)."""
    v = as_view(a, "a")
    dt = _np_dtype(v.dtype)
    n = _extent(v.shape, v.strides, v.dtype)
    if n == 0:
        return np.zeros(v.shape, dt)
    flat = np.frombuffer((ctypes.c_char * n).from_address(v.ptr), dtype=np.uint8).view(dt)
    return np.lib.stride_tricks.as_strided(flat, v.shape, tuple(s * dt.itemsize for s in v.strides))


def empty(shape, dtype, strides=None) -> _raw.DeviceArray:
    """A zeroed DeviceArray over new host memory (kept alive as its ``base``)."""
    shape = tuple(int(d) for d in shape)
    strides = tuple(strides) if strides is not None else contiguous_strides(shape)
    buf = np.zeros(max(_extent(shape, strides, dtype), 16), np.uint8)
    return _raw.DeviceArray(shape, strides, dtype, 0, buf.ctypes.data, buf)


def device(a, strides=None) -> _raw.DeviceArray:
    a = np.asarray(a)
    d = empty(a.shape, a.dtype.name, strides)
    values(d)[...] = a
    return d


def _ref(r) -> float:
    """The value of a scaling reference (``scaling_ref``: ctypes ``byref`` of a float or a double)."""
    return float(r._obj.value)


def _blend(c, name="out"):
    alpha, beta = c.blends.get(name, (c.alpha, c.beta))
    return _ref(alpha), _ref(beta)


def _write(v, result, beta):
    dst = values(v)
    dst[...] = (result if beta == 0 else result + beta * dst.astype(np.float64)).astype(dst.dtype)


def _f64(v):
    return values(v).astype(np.float64)


def _op_tensor(c):
    r, a = c.resolved, _f64(c.views["a"])
    alpha, beta = _blend(c)
    x = alpha * a
    if r.op == "sqrt":
        got = np.sqrt(x)
    elif r.op == "not":
        got = 1 - x
    else:
        y = r.alpha2 * _f64(c.views["b"])
        got = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[r.op](x, y)
    _write(c.views["out"], got, beta)


def _reduce_tensor(c):
    r, a = c.resolved, _f64(c.views["a"])
    assert not r.indices, "the L3 declarations ask for no indices"
    axes = tuple(i for i, (n, m) in enumerate(zip(a.shape, r.shape)) if m == 1 and n != 1)
    nz = np.where(a == 0, 1.0, a)
    got = {
        "add": lambda: a.sum(axes, keepdims=True),
        "avg": lambda: a.mean(axes, keepdims=True),
        "mul": lambda: a.prod(axes, keepdims=True),
        "mul_no_zeros": lambda: nz.prod(axes, keepdims=True),
        "min": lambda: a.min(axes, keepdims=True),
        "max": lambda: a.max(axes, keepdims=True),
        "amax": lambda: np.abs(a).max(axes, keepdims=True),
        "norm1": lambda: np.abs(a).sum(axes, keepdims=True),
        "norm2": lambda: np.sqrt((a * a).sum(axes, keepdims=True)),
    }[r.op]()
    alpha, beta = _blend(c)
    _write(c.views["out"], alpha * got.reshape(r.shape), beta)


def _transform_tensor(c):
    r, x, out = c.resolved, _f64(c.views["x"]), c.views["out"]
    alpha, beta = _blend(c)
    full = beta * _f64(out)
    full[tuple(slice(b, b + n) for b, n in zip(r.before, x.shape))] += alpha * x
    _write(out, full, 0.0)


def _add_tensor(c):
    alpha, beta = _ref(c.alpha), _ref(c.beta)
    _write(c.views["c"], alpha * np.broadcast_to(_f64(c.views["a"]), c.views["c"].shape), beta)


def _set_tensor(c):
    y = values(c.views["y"])
    y[...] = _ref(c.resolved)


def _scale_tensor(c):
    y = values(c.views["y"])
    y[...] = (y.astype(np.float64) * _ref(c.resolved)).astype(y.dtype)


def _activation_backward(c):
    if c.resolved.mode != "relu":  # the tensor declarations use the ReLU mode only: the others compute nothing here
        return
    v = c.views
    alpha, beta = _ref(c.alpha), _ref(c.beta)
    _write(v["out"], alpha * _f64(v["dy"]) * (_f64(v["x"]) > 0), beta)


KERNELS = {
    "op_tensor": _op_tensor,
    "reduce_tensor": _reduce_tensor,
    "transform_tensor": _transform_tensor,
    "add_tensor": _add_tensor,
    "set_tensor": _set_tensor,
    "scale_tensor": _scale_tensor,
    "activation_backward": _activation_backward,
}


@pytest.fixture
def host_device(monkeypatch):
    """The raw adapter over host memory, the cuDNN calls as :data:`KERNELS` (others: nothing); ``calls`` lists the
    primitives launched."""
    A = _raw.ADAPTER

    def copy(dst, src, stream=None):
        assert tuple(dst.shape) == tuple(src.shape) and dst.dtype == src.dtype
        values(dst)[...] = values(src)

    def contiguous(arr, stream=None):
        if arr.strides == contiguous_strides(arr.shape):
            return arr
        new = empty(arr.shape, arr.dtype)
        copy(new, arr)
        return new

    def to_numpy(arr):
        got = np.array(values(arr))
        return got.astype(np.float32) if arr.dtype == "bfloat16" else got

    monkeypatch.setattr(
        A, "empty", lambda shape, dtype, device, strides=None, stream=None: empty(shape, dtype, strides)
    )
    monkeypatch.setattr(A, "to_numpy", to_numpy)
    monkeypatch.setattr(A, "from_numpy", lambda a, dev, stream=None: device(a))
    monkeypatch.setattr(A, "copy", copy)
    monkeypatch.setattr(A, "contiguous", contiguous)
    monkeypatch.setattr(A, "current_stream", lambda device: 0)
    monkeypatch.setattr(A, "current_device", lambda: 0)
    monkeypatch.setattr(A, "device_guard", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(A, "pointer_device", lambda ptr: 0)
    calls: list[str] = []

    def launch(p, call, path, graph_key):
        calls.append(p.name)
        k = KERNELS.get(p.name)
        if k is not None:
            k(call)

    monkeypatch.setattr(_primitive, "_launch_form", launch)
    # the express path (DeviceArrays are keyed: a repeated call in an XLA handler takes it) calls the legacy
    # function itself, past _launch_form: off here, where the cuDNN calls are these kernels
    monkeypatch.setattr(_express, "_on", [False])
    return calls


# ----------------------------------------------------------------- every declaration, on arrays without operators

#: declarations whose L2 calls need what a no-op cuDNN call cannot give: the statistics, index or states that
#: the call itself returns, or cuDNN's answers about a device
NEEDS_THE_CALL = {
    "batch_norm": "its saved statistics come from the cuDNN call",
    "layer_norm": "its saved statistics come from the cuDNN call",
    "instance_norm": "its saved statistics come from the cuDNN call",
    "rms_norm": "its saved statistics come from the cuDNN call",
    "dropout": "its RNG states are made on a device",
    "rnn": "its sizes are cuDNN's answers on a device",
}
#: pooling samples that run on the graph, whose max-pooling backward reads the index the forward's call returns
POOL_INDEXED = {9, 10, 14}


def _cases():
    for name in sorted(autograd.functions()):
        for i, _ in enumerate(SAMPLES[name](np.random.default_rng(0), "float32")):
            yield pytest.param(name, i, id=f"{name}-{i}")


def _run(name, i, dtype="float32", seed=0):
    d = DIFFERENTIABLE[name]
    inputs, kw = SAMPLES[name](np.random.default_rng(seed), dtype)[i]
    ins = [None if a is None else device(a) for a in inputs]
    kw = {k: device(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    outs, res = d.forward(*ins, **kw)
    assert all(isinstance(o, _raw.DeviceArray) for o in outs), [type(o) for o in outs]
    rng = np.random.default_rng(seed + 1)
    douts = tuple(device(rng.standard_normal(o.shape).astype(_np_dtype(o.dtype))) if d.carries_gradient(j) else None
                  for j, o in enumerate(outs))  # fmt: skip
    opts = {k: v for k, v in kw.items() if k not in d.arrays}
    grads = d.backward(res, douts, tuple(a is not None for a in ins), **opts)
    return inputs, kw, outs, douts, grads


@pytest.mark.parametrize("name, i", list(_cases()))
def test_every_declaration_runs_on_arrays_without_operators(host_device, name, i):
    if name in NEEDS_THE_CALL:
        pytest.skip(NEEDS_THE_CALL[name])
    if name == "pooling" and i in POOL_INDEXED:
        pytest.skip("its max-pooling backward reads the index the forward's cuDNN call returns")
    _, _, outs, _, grads = _run(name, i)
    d = DIFFERENTIABLE[name]
    assert len(grads) == len(d.inputs)
    assert all(g is None or isinstance(g, _raw.DeviceArray) for g in grads), [type(g) for g in grads]
    assert host_device  # the primitives ran (through the real L2 sequence)


def test_a_device_array_has_no_operators():
    """What makes the test above fail for a declaration that uses them (the GPU log's TypeErrors)."""
    a = device(np.ones((2, 3)))
    for bad in (lambda: a + True, lambda: a > a, lambda: a < 0, lambda: a[0], lambda: a * 2, lambda: abs(a),
                lambda: a / a, lambda: -a):  # fmt: skip
        with pytest.raises(TypeError):
            bad()


# ----------------------------------------------------------------- the tensor declarations' values

TENSOR_OPS = ("op_tensor", "reduce_tensor", "transform_tensor")


def _tensor_cases():
    for name in TENSOR_OPS:
        for dtype in ("float64", "float32"):
            for i, _ in enumerate(SAMPLES[name](np.random.default_rng(0), dtype)):
                yield pytest.param(name, dtype, i, id=f"{name}-{dtype}-{i}")


def _check(name, inputs, kw, outs, douts, grads, dtype):
    tol = 1e-12 if dtype == "float64" else 2e-5
    leaves = [None if a is None else torch.from_numpy(np.array(a, np.float64)).requires_grad_() for a in inputs]
    (want,) = REFS[name](leaves, kw)
    np.testing.assert_allclose(values(outs[0]).astype(np.float64), want.detach().numpy(), rtol=tol, atol=tol)
    present = [t for t in leaves if t is not None]
    refs = torch.autograd.grad(want, present, torch.from_numpy(values(douts[0]).astype(np.float64)))
    got = [g for g, a in zip(grads, inputs) if a is not None]
    for j, (g, r, a) in enumerate(zip(got, refs, [a for a in inputs if a is not None])):
        assert isinstance(g, _raw.DeviceArray) and tuple(g.shape) == a.shape and g.dtype == dtype
        np.testing.assert_allclose(values(g).astype(np.float64), r.numpy(), rtol=tol, atol=tol,
                                   err_msg=f"{name} {kw} d input {j}")  # fmt: skip
        assert g.ptr != douts[0].ptr  # never the cotangent itself


@pytest.mark.parametrize("name, dtype, i", list(_tensor_cases()))
def test_the_tensor_declarations_gradients_on_device_arrays(host_device, name, dtype, i):
    inputs, kw, outs, douts, grads = _run(name, i, dtype)
    _check(name, inputs, kw, outs, douts, grads, dtype)


def test_ties_zeros_and_signs_follow_torchs_rules_on_device_arrays(host_device):
    f = np.float64
    cases = []
    a, b = np.array([[1.0, 2.0, 3.0], [2.0, -1.0, 0.5]], f), np.array([[2.0, 2.0, 2.0]], f)
    for op in ("max", "min"):  # half of dc to each side where the scaled values are equal
        cases += [("op_tensor", (a, b), dict(op=op)), ("op_tensor", (a, b / 2), dict(op=op, alpha2=2.0))]
    t = np.array([[3.0, 1.0, 3.0, 3.0], [-2.0, 2.0, 0.0, 1.0]], f)
    for op in ("max", "min", "amax", "norm1"):  # shared evenly among ties; amax of |a| with the sign; |0|' = 0
        cases += [("reduce_tensor", (t,), dict(op=op, axes=1)), ("reduce_tensor", (t,), dict(op=op))]
    z = np.array([[0.0, 2.0, 3.0], [1.5, -2.0, 0.5], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0]], f)
    for op in ("mul", "norm2", "mul_no_zeros"):  # torch.prod with zeros; norm2 of an all-zero slice is 0
        cases.append(("reduce_tensor", (z,), dict(op=op, axes=1)))
    for name, inputs, kw in cases:
        d = DIFFERENTIABLE[name]
        ins = [device(x) for x in inputs]
        outs, res = d.forward(*ins, **kw)
        dc = device(np.random.default_rng(3).standard_normal(outs[0].shape))
        grads = d.backward(res, (dc,), (True,) * len(ins), **kw)
        _check(name, inputs, kw, outs, (dc,), grads, "float64")
        assert all(np.isfinite(values(g)).all() for g in grads)


def test_a_padded_transforms_gradient_from_an_expanded_cotangent(host_device):
    """dy's interior is a window (a view of dy's memory, no indexing); an expanded dy (stride 0, as torch's sum()
    gives) is made dense first, since a view alone is never copied by the L2 sequence."""
    d = DIFFERENTIABLE["transform_tensor"]
    x = np.random.default_rng(4).standard_normal((2, 3, 4))
    kw = dict(pad_before=(0, 1, 1), pad_after=(1, 0, 2))
    (y,), res = d.forward(device(x), **kw)
    one = device(np.array([2.5]))
    dy = _raw.DeviceArray(y.shape, (0, 0, 0), "float64", 0, one.ptr, one)  # every element is 2.5
    (dx,) = d.backward(res, (dy,), (True,), **kw)
    np.testing.assert_array_equal(values(dx), np.full(x.shape, 2.5))
    host_device.clear()
    dense = device(np.arange(np.prod(y.shape), dtype=float).reshape(y.shape))
    (dx,) = d.backward(res, (dense,), (True,), **kw)
    np.testing.assert_array_equal(values(dx), values(dense)[:2, 1:4, 1:5])
    assert host_device == ["transform_tensor"]  # one copy of the window: no slicing, no extra copy


def test_the_backwards_that_divide_go_through_the_host_and_the_others_do_not(host_device, monkeypatch):
    """cuDNN has no elementwise division: sqrt's and the dividing reductions' gradients are host arithmetic (the
    adapter's to_numpy/from_numpy); the comparisons of max/min and norm1 are cuDNN calls (the ReLU's backward)."""
    from cudnnkit.ops import arith

    seen = []
    monkeypatch.setattr(arith, "host_values", lambda a, name="array": seen.append(name) or host_values(a, name))
    a, b = np.random.default_rng(5).uniform(0.5, 2, (3, 4)), np.random.default_rng(6).standard_normal((1, 4))
    for name, inputs, kw, host in [("op_tensor", (a, b), dict(op="max"), False),
                                   ("op_tensor", (a, None), dict(op="sqrt"), True),
                                   ("reduce_tensor", (a,), dict(op="norm1", axes=1), False),
                                   ("reduce_tensor", (a,), dict(op="max", axes=1), True),
                                   ("reduce_tensor", (a,), dict(op="avg"), False)]:  # fmt: skip
        d = DIFFERENTIABLE[name]
        seen.clear()
        host_device.clear()
        ins = [None if x is None else device(x) for x in inputs]
        outs, res = d.forward(*ins, **kw)
        d.backward(res, (device(np.ones(outs[0].shape)),), tuple(x is not None for x in ins), **kw)
        assert bool(seen) == host, (name, kw, seen)
        if kw["op"] in ("max", "norm1") and not host:
            assert "activation_backward" in host_device, host_device


# ----------------------------------------------------------------- the helpers themselves


def test_window_is_a_view_of_the_same_memory(host_device):
    a = device(np.arange(60.0).reshape(3, 4, 5))
    w = window(a, (1, 0, 2), (2, 3, 2))
    np.testing.assert_array_equal(values(w), np.arange(60.0).reshape(3, 4, 5)[1:3, 0:3, 2:4])
    assert w.owner is a and w.adapter is _raw.ADAPTER and w.strides == a.strides
    with pytest.raises(ValueError, match=r"the window \(3, 3, 2\) at \(1, 0, 2\) is not inside its shape"):
        window(a, (1, 0, 2), (3, 3, 2))


class _NoAdapter:
    """A CUDA array of a library without a cudnnkit adapter (a bare __cuda_array_interface__)."""

    __cuda_array_interface__ = {"shape": (2,), "typestr": "<f8", "data": (0x1000, False), "version": 3,
                                "strides": None}  # fmt: skip
    device = 0


def test_host_values_and_from_host_keep_the_library_dtype_and_device(host_device):
    pytest.importorskip("ml_dtypes")
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        like = empty((2, 3), dtype)
        got = from_host(np.full((2, 3), 1.5), like)
        assert isinstance(got, _raw.DeviceArray) and got.dtype == dtype and got.shape == (2, 3)
        np.testing.assert_array_equal(host_values(got), 1.5)
    for f in (lambda: host_values(_NoAdapter(), "x"), lambda: from_host(np.ones(2), _NoAdapter(), "x")):
        with pytest.raises(TypeError, match="x: .* has none"):
            f()


# ----------------------------------------------------------------- the raw adapter's copy between layouts


def test_the_raw_adapters_copy_between_layouts_is_one_transform(monkeypatch):
    """A copy between two layouts is a cudnnTransformTensor (its imports ran only on that path: a wrong one was an
    ImportError inside the XLA handler, for transform_tensor and the functional API's pooling)."""
    from cudnnkit import lib
    from cudnnkit.runtime import handle

    calls = []
    _current_device(monkeypatch)
    monkeypatch.setattr(handle, "get_handle", lambda device, stream, adapter=None: ("handle", device, stream))
    monkeypatch.setattr(lib, "cudnnTransformTensor", lambda *a: calls.append(a))
    src = _raw.DeviceArray((2, 3, 4, 5), (60, 1, 15, 3), "float32", 0, 0x1000, None)  # channels last
    dst = _raw.DeviceArray((2, 3, 4, 5), (60, 20, 5, 1), "float32", 0, 0x9000, None)
    _raw.ADAPTER.copy(dst, src, 7)
    (call,) = calls
    assert call[0] == ("handle", 0, 7) and call[3] == 0x1000 and call[6] == 0x9000


def _current_device(monkeypatch) -> list:
    """``driver.pushed`` faked: a stack of the devices made current (``[None]``: nothing pushed)."""
    from cudnnkit.runtime import driver

    stack: list = [None]

    @contextlib.contextmanager
    def pushed(device):
        stack.append(device)
        try:
            yield
        finally:
            stack.pop()

    monkeypatch.setattr(driver, "pushed", pushed)
    return stack


def test_the_raw_adapters_transform_runs_with_the_arrays_device_current(monkeypatch):
    """Two devices: a copy between layouts of arrays on cuda:1, made where no device is current for them
    (``JaxAdapter.finish`` of an output in another layout, ``to_numpy``: outside any handler's ``on_stream``),
    runs ``cudnnTransformTensor`` with cuda:1 current, the device of the handle it passes."""
    from cudnnkit import lib
    from cudnnkit.runtime import handle

    stack, calls = _current_device(monkeypatch), []
    monkeypatch.setattr(handle, "get_handle", lambda device, stream, adapter=None: ("handle", device, stream))
    monkeypatch.setattr(lib, "cudnnTransformTensor", lambda h, *a: calls.append((h, stack[-1])))
    src = _raw.DeviceArray((2, 3, 4, 5), (60, 1, 15, 3), "float32", 1, 0x1000, None)  # channels last, cuda:1
    dst = _raw.DeviceArray((2, 3, 4, 5), (60, 20, 5, 1), "float32", 1, 0x9000, None)
    _raw.ADAPTER.copy(dst, src, 7)
    assert calls == [(("handle", 1, 7), 1)] and stack == [None]


def test_device_arrays_are_keyed_for_the_express_path():
    """A repeated L2 call on DeviceArrays (inside an XLA handler) is recognised by the express path: the raw
    adapter's ``key`` holds what ``view`` reads but the pointer, and the signature of two calls on arrays of one
    metadata at other addresses is the same."""
    from cudnnkit.ops import softmax as sm
    from cudnnkit.runtime import adapters

    a, b = empty((2, 3), "float32"), empty((2, 3), "float32")
    assert adapters.KEYED[_raw.DeviceArray] == _raw.ADAPTER.key
    k, ptr, ad = _raw.ADAPTER.key(a)
    assert k == (_raw.ADAPTER, "float32", (2, 3), (3, 1), 0) and ptr == a.ptr and ad is _raw.ADAPTER
    assert _raw.ADAPTER.key(values(a)) is None  # not a DeviceArray
    sa = _express.signature(sm.SOFTMAX_FORWARD, {"x": a}, {"axis": -1})
    sb = _express.signature(sm.SOFTMAX_FORWARD, {"x": b}, {"axis": -1})
    assert sa is not None and sa[0] == sb[0] and sa[1] == [a.ptr] and sb[1] == [b.ptr]
    c = empty((3, 2), "float32", (1, 3))  # another layout: another signature
    assert _express.signature(sm.SOFTMAX_FORWARD, {"x": c}, {"axis": -1})[0] != sa[0]
