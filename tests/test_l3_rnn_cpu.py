"""The L3 RNN ("rnn", cudnnkit.ops.rnn) on the CPU: its registration, meta's shapes against torch.nn.LSTM/GRU/RNN
on the CPU, the checks it makes before any GPU work, the backward's shortcuts, the torch layer's fake, and the
torch reference of tests/l3/rnn.py (its packing, against the module run sample by sample). The reserve size and
the weight count are cuDNN queries with a handle (a GPU): they are stubbed here, and the GPU test
(tests/gpu/test_l3_gpu.py) compares meta with the real forward."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudnnkit import autograd
from cudnnkit.ops import rnn as R
from cudnnkit.ops._diff import Spec
from cudnnkit.ops._primitive import REGISTRY

from .l3 import rnn as S

torch = pytest.importorskip("torch")

RESERVE = 4096


@pytest.fixture
def sizes(monkeypatch):
    """Stub the device queries: (torch's parameter count, RESERVE bytes); records the configs asked about."""
    asked = []

    def fake(cfg, layout, seq, fill):
        asked.append(cfg)
        return sum(math.prod(s) for s in S.torch_param_shapes(cfg).values()), RESERVE

    monkeypatch.setattr(R, "_l3_device_sizes", fake)
    return asked


@pytest.fixture
def no_device(monkeypatch):
    def fail(*a):
        raise AssertionError("the check should have refused before the device query")

    monkeypatch.setattr(R, "_l3_device_sizes", fail)


def _spec(a):
    return None if a is None else Spec(a.shape, tuple(s // a.itemsize for s in a.strides), str(a.dtype))


def _samples():
    return S.SAMPLES["rnn"](np.random.default_rng(0), "float64")


def test_rnn_is_registered_with_its_inputs_and_outputs():
    d = autograd.get("rnn")
    assert (d.primitive, d.inputs, d.outputs, d.arrays, d.mutated) == (
        "rnn_forward", ("x", "w", "hx", "cx"), ("out", "hy", "cy"), (), ())  # fmt: skip
    assert set(d.inputs) <= set(REGISTRY["rnn_forward"].differentiable)
    assert d.forward is R._l3_forward and d.meta is R._l3_meta and d.backward is R._l3_backward


@pytest.mark.parametrize("i", range(len(_samples())))
def test_meta_gives_torchs_shapes_and_the_residuals(sizes, i):
    (x, w, hx, cx), kw = _samples()[i]
    rnn = kw["rnn"]
    outs, res = R._l3_meta(*map(_spec, (x, w, hx, cx)), **kw)
    mod = S.torch_module(rnn, kw["layout"])
    params = dict(mod.named_parameters())
    t = [None if a is None else torch.from_numpy(a) for a in (x, hx, cx)]
    want = S.run_torch(rnn, params, *t, layout=kw["layout"], seq_lengths=kw.get("seq_lengths"),
                       fill=kw.get("padding_fill", 0.0))  # fmt: skip
    for o, ref in zip(outs, want):
        assert o.dtype == "float64" and o.strides == R.contiguous_strides(o.shape)
        assert o.shape == ((0,) if ref is None else tuple(ref.shape))
    assert (rnn.cell == "lstm") == (outs[2].shape != (0,))
    names = ["x", "w"] + ["hx"] * (hx is not None) + ["cx"] * (cx is not None) + ["out", "reserve"]
    assert list(res) == names
    assert res["x"] == _spec(x) and res["w"] == _spec(w) and res["out"] == outs[0]
    assert res["reserve"] == Spec((RESERVE,), (1,), "uint8")
    # the config queried: the sample's, its dropout off without training
    assert sizes[-1] == (rnn if kw.get("training") or rnn.dropout == 0 else R.replace(rnn, dropout=0.0))


def test_training_false_runs_the_config_without_dropout():
    lstm = R.RNN("lstm", 4, 5, 2, dropout=0.3, dtype="float64")
    assert R._l3_config(lstm, True) is lstm
    off = R._l3_config(lstm, False)
    assert off.dropout == 0 and R.replace(off, dropout=0.3) == lstm
    plain = R.RNN("gru", 4, 5)
    assert R._l3_config(plain, False) is plain


def _base():
    (x, w, hx, cx), kw = _samples()[0]  # an LSTM, 1 layer, bidirectional, with hx and cx
    return [_spec(a) for a in (x, w, hx, cx)], kw


@pytest.mark.parametrize(
    "change, err, match",
    [
        (lambda a, k: k.update(rnn="lstm"), TypeError, "rnn must be a cudnnkit.ops.RNN"),
        (lambda a, k: k.update(training="yes"), TypeError, "training must be a bool"),
        (lambda a, k: k.update(layout="time_major"), ValueError, "layout"),
        (lambda a, k: k.update(padding_fill=None), TypeError, "padding_fill"),
        (lambda a, k: k.update(padding_fill=1e300, rnn=R.replace(k["rnn"], dtype="float32")), ValueError, "overflows"),
        (lambda a, k: a.__setitem__(0, a[0]._replace(dtype="float32")), TypeError, "x has dtype float32"),
        (lambda a, k: a.__setitem__(0, Spec((3, 2, 6), (12, 6, 1), "float64")), ValueError, "input_size is 4"),
        (lambda a, k: a.__setitem__(0, Spec((3, 8), (8, 1), "float64")), ValueError, "x must be"),
        (lambda a, k: a.__setitem__(2, Spec((2, 3, 5), (15, 5, 1), "float64")), ValueError, "hx must have shape"),
        (lambda a, k: a.__setitem__(3, a[3]._replace(dtype="float32")), TypeError, "cx has dtype"),
        (lambda a, k: a.__setitem__(1, Spec((4, 110), (110, 1), "float64")), ValueError, "contiguous 1-d"),
        (lambda a, k: a.__setitem__(1, Spec((440,), (2,), "float64")), ValueError, "contiguous 1-d"),
        (lambda a, k: a.__setitem__(1, a[1]._replace(dtype="float32")), TypeError, "w has dtype"),
        (lambda a, k: k.update(layout="packed"), ValueError, "x must be"),
        (lambda a, k: k.update(seq_lengths=(3, 4)), ValueError, r"seq_lengths\[1\] is 4"),
        (lambda a, k: k.update(seq_lengths=(3,)), ValueError, "seq_lengths has 1 values"),
        (
            lambda a, k: k.update(seq_lengths=(3, 1), rnn=R.replace(k["rnn"], algo="persist_static")),
            ValueError,
            "does not support sequences of different lengths",
        ),
        (lambda a, k: k.update(rnn=R.replace(k["rnn"], padded_io=False)), ValueError, "padded I/O"),
    ],
)
def test_meta_refuses_bad_arguments_before_any_device_query(no_device, change, err, match):
    args, kw = _base()
    change(args, kw)
    with pytest.raises(err, match=match):
        R._l3_meta(*args, **kw)


def test_meta_refuses_a_cx_for_a_gru_and_packed_x_needs_lengths(no_device):
    gru = R.RNN("gru", 4, 5, dtype="float64")
    x, w = Spec((3, 2, 4), (8, 4, 1), "float64"), Spec((195,), (1,), "float64")
    with pytest.raises(ValueError, match="a gru RNN has none"):
        R._l3_meta(x, w, None, Spec((1, 2, 5), (10, 5, 1), "float64"), rnn=gru)
    with pytest.raises(ValueError, match="needs seq_lengths"):
        R._l3_meta(Spec((5, 4), (4, 1), "float64"), w, rnn=gru, layout="packed")
    with pytest.raises(ValueError, match="decreasing order"):
        R._l3_meta(Spec((5, 4), (4, 1), "float64"), w, rnn=gru, layout="packed", seq_lengths=(2, 3))


def test_meta_refuses_a_short_weight_buffer(sizes):
    args, kw = _base()
    args[1] = Spec((439,), (1,), "float64")  # the bidirectional LSTM has 440 torch parameters
    with pytest.raises(ValueError, match="w has 439 elements but this RNN's weight space needs 440"):
        R._l3_meta(*args, **kw)


def test_forward_checks_its_own_keywords_before_any_gpu_work():
    (x, w, hx, cx), kw = _samples()[0]
    with pytest.raises(TypeError, match="training must be a bool"):
        R._l3_forward(x, w, hx, cx, **dict(kw, training=1))
    with pytest.raises(TypeError, match="rnn must be a cudnnkit.ops.RNN"):
        R._l3_forward(x, w, hx, cx, **dict(kw, rnn=None))
    with pytest.raises(TypeError, match="rnn must be a cudnnkit.ops.RNN"):
        R._l3_backward({}, (None, None, None), (True,) * 4, **dict(kw, rnn=None))


def test_backward_without_cotangents_or_needs_makes_no_call(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("rnn_backward should not be called")

    monkeypatch.setattr(R, "rnn_backward", fail)
    lstm, gru = R.RNN("lstm", 4, 5, dtype="float64"), R.RNN("gru", 4, 5, dtype="float64")
    assert R._l3_backward({}, (None, None, None), (True,) * 4, rnn=lstm) == (None,) * 4
    assert R._l3_backward({}, (1, 1, 1), (False,) * 4, rnn=lstm) == (None,) * 4
    # a GRU's cy is the empty stand-in: its cotangent carries nothing
    assert R._l3_backward({}, (None, None, np.zeros(0)), (True, True, False, False), rnn=gru) == (None,) * 4


def test_backward_passes_the_cotangents_and_keeps_the_reserve(monkeypatch):
    got = {}

    def fake(x, y, dy, w, reserve, hx, cx, dhy, dcy, **kw):
        got.update(args=(x, y, dy, w, reserve, hx, cx, dhy, dcy), kw=kw)
        return "dx", "dhx", None, "dw"

    monkeypatch.setattr(R, "rnn_backward", fake)
    gru = R.RNN("gru", 4, 5, 1, True, dropout=0.5, dtype="float64")
    res = {"x": "x", "w": "w", "hx": "hx", "out": "y", "reserve": "r"}
    grads = R._l3_backward(res, ("dy", "dhy", "dcy"), (True, False, True, False), rnn=gru, layout="batch_major",
                           seq_lengths=(3, 2), padding_fill=1.0)  # fmt: skip
    assert grads == ("dx", None, "dhx", None)
    assert got["args"] == ("x", "y", "dy", "w", "r", "hx", None, "dhy", None)
    assert got["kw"] == {"rnn": R.replace(gru, dropout=0.0), "layout": "batch_major", "seq_lengths": (3, 2),
                         "keep_reserve": True, "trusted_reserve": False}  # fmt: skip
    # an integration that copied the residuals (JAX) says so: the copy is passed as a trusted reserve
    R._l3_backward(res, ("dy", None, None), (True,) * 4, rnn=gru, residuals_copied=True)
    assert got["kw"]["keep_reserve"] is True and got["kw"]["trusted_reserve"] is True
    with pytest.raises(TypeError, match="residuals_copied must be a bool"):
        R._l3_backward(res, ("dy", None, None), (True,) * 4, rnn=gru, residuals_copied=1)


def test_the_reserve_is_declared_tracked():
    """The RNN's reserve is recognised by its address (the ledger): the declaration says so, so that an integration
    that copies residuals (JAX) tells the backward (residuals_copied)."""
    from cudnnkit.ops._diff import DIFFERENTIABLE

    assert DIFFERENTIABLE["rnn"].tracked_residuals == ("reserve",)
    assert all(d.tracked_residuals == () for n, d in DIFFERENTIABLE.items() if n != "rnn")


def _reserve_view(n, ptr=0x7000, dtype="uint8"):
    from cudnnkit.runtime.view import ArrayView

    return ArrayView((n,), (1,), dtype, 0, ptr, None)


def test_the_ledger_protects_eager_reserves_and_a_trusted_one_skips_it():
    """rnn_backward's reserve checks (its helpers, which need no device): a reserve the ledger does not know (used
    already, or a copy) is refused unless trusted; a trusted one still needs the right size and dtype; a trusted
    reserve is not looked up (a freed tracked reserve's record at its address says nothing of it), and its use
    still takes a record at its address, which the backward overwrites."""
    from cudnnkit.ops._rnn_desc import _reserves

    lstm = R.RNN("lstm", 4, 5, dtype="float64")
    v = _reserve_view(96, ptr=0x7A000)
    _reserves.add(0, v.ptr, 96, "standard", lstm)
    try:
        entry = R._reserve_entry(0, v, lstm, False)
        assert entry == (96, "standard")
        R._check_reserve(v, 96, entry, False)  # a training forward's, unused
        assert R._reserve_entry(0, v, lstm, True) is None
        _reserves.take(0, v.ptr)  # a backward used it
        gone = R._reserve_entry(0, v, lstm, False)
        with pytest.raises(ValueError, match="has been used by an rnn_backward already .* trusted_reserve=True"):
            R._check_reserve(v, 96, gone, False)
        copy = _reserve_view(96, ptr=0x7B000)  # XLA's buffer: an address no forward returned
        with pytest.raises(ValueError, match="has been used by an rnn_backward already"):
            R._check_reserve(copy, 96, R._reserve_entry(0, copy, lstm, False), False)
        R._check_reserve(copy, 96, R._reserve_entry(0, copy, lstm, True), True)  # trusted: taken as the forward's
        for bad in (_reserve_view(95, ptr=0x7B000), _reserve_view(96, ptr=0x7B000, dtype="int8")):
            with pytest.raises(ValueError, match="reserve must be the uint8 array of 96 bytes"):
                R._check_reserve(bad, 96, None, True)
    finally:
        _reserves.take(0, v.ptr)


def test_the_torch_fake_forward_has_metas_outputs_and_reserve(sizes):
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cudnnkit.torch as ct

    op = ct.op("rnn")
    for i in (0, 6, 9):  # an LSTM with hx, cx; a batch-major GRU; a tanh RNN
        (x, w, hx, cx), kw = _samples()[i]
        outs, _ = R._l3_meta(*map(_spec, (x, w, hx, cx)), **kw)
        with FakeTensorMode() as mode:
            ins = [None if a is None else mode.from_tensor(torch.from_numpy(a)) for a in (x, w, hx, cx)]
            got = op.forward_op(*op.args(*ins, **kw))
        assert [tuple(t.shape) for t in got] == [o.shape for o in outs] + [(RESERVE,)]
        assert got[-1].dtype == torch.uint8


def _torch_order_maps(rnn, n):
    """A stand-in for cuDNN's layout (asked on the GPU): torch's parameters one after the other in ``w``."""
    maps, off = {}, 0
    for name, shape in S.torch_param_shapes(rnn).items():
        k = math.prod(shape)
        maps[name] = torch.arange(off, off + k).reshape(shape)
        off += k
    assert off <= n
    return maps


@pytest.mark.parametrize("i", range(len(_samples())))
def test_the_torch_reference_runs_the_module_on_ws_parameters(monkeypatch, i):
    monkeypatch.setattr(S, "_index_maps", _torch_order_maps)
    inputs, kw = _samples()[i]
    rnn, layout, lengths = kw["rnn"], kw["layout"], kw.get("seq_lengths")
    x, w, hx, cx = (None if a is None else torch.from_numpy(a).requires_grad_() for a in inputs)
    out, hy, cy = S.TORCH_REFERENCE["rnn"]([x, w, hx, cx], kw)
    assert (cy is None) == (rnn.cell != "lstm")
    (out.sum() + hy.square().sum() + (0 if cy is None else cy.sum())).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    # each sample alone, over its own length, through the module with the same parameters
    params = {k: w.detach()[v] for k, v in _torch_order_maps(rnn, w.shape[0]).items()}
    bx = x.detach()
    if layout == "batch_major":
        bx = bx.transpose(0, 1)
    n = len(lengths) if layout == "packed" else bx.shape[1]
    lens = lengths or (bx.shape[0],) * n
    fill = kw.get("padding_fill", 0.0)
    for b, steps in enumerate(lens):
        if layout == "packed":
            xb = torch.stack([x.detach()[sum(min(m, t) for m in lens) + b] for t in range(steps)])[:, None]
        else:
            xb = bx[:steps, b : b + 1]
        h0 = None if hx is None else hx.detach()[:, b : b + 1]
        c0 = None if cx is None else cx.detach()[:, b : b + 1]
        want = S.run_torch(rnn, params, xb, h0, c0)
        if layout == "packed":
            rows = [sum(min(m, t) for m in lens) + b for t in range(steps)]
            got_out = out.detach()[rows]
        else:
            o = out.detach().transpose(0, 1) if layout == "batch_major" else out.detach()
            got_out = o[:, b]
            assert torch.all(got_out[steps:] == fill)
            got_out = got_out[:steps]
        torch.testing.assert_close(got_out, want[0][:, 0])
        torch.testing.assert_close(hy.detach()[:, b], want[1][:, 0])
        if cy is not None:
            torch.testing.assert_close(cy.detach()[:, b], want[2][:, 0])


def test_samples_have_the_shapes_the_config_says():
    for (x, w, hx, cx), kw in _samples():
        rnn = kw["rnn"]
        n = len(kw["seq_lengths"]) if kw["layout"] == "packed" else x.shape[1 if kw["layout"] == "seq_major" else 0]
        assert x.dtype == w.dtype == np.float64 and w.shape == (S.weight_count(rnn),)
        assert hx is None or hx.shape == rnn.hidden_shape(n)
        assert cx is None or (rnn.cell == "lstm" and cx.shape == rnn.cell_shape(n))
        assert not any(isinstance(v, np.ndarray) for v in kw.values())  # "rnn" has no arrays: lengths are a tuple
