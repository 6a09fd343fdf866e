"""cudnnkit.torch.nn (the torch.nn twins) and cudnnkit.torch.convert on the CPU: the same state as torch's modules,
the refusals, convert() on a ResNet-style and an LSTM model, the RNN flat-weight packing and its gradient, and the
forwards' plumbing with torch CPU functions standing in for the cuDNN ops (the real forwards: tests/gpu)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn as tnn  # noqa: E402

import cudnnkit.torch as ckt  # noqa: E402
from cudnnkit.ops import rnn as _rnn  # noqa: E402
from cudnnkit.torch import convert as C  # noqa: E402
from cudnnkit.torch import nn  # noqa: E402

convert = C.convert

# (name, args, kwargs): each built as torch.nn.<name> and cudnnkit.torch.nn.<name>
CASES = [
    ("Conv1d", (3, 4, 3), {}),
    ("Conv2d", (4, 8, 3), dict(stride=2, padding=1, bias=False)),
    ("Conv2d", (4, 8, (3, 2)), dict(padding="same", dilation=2, groups=2)),
    ("Conv3d", (2, 4, 3), dict(padding="valid")),
    ("ConvTranspose1d", (3, 4, 3), dict(stride=2)),
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2)),
    ("ConvTranspose3d", (2, 2, 2), {}),
    ("MaxPool1d", (3,), {}),
    ("MaxPool2d", (3, 2, 1), dict(ceil_mode=True)),
    ("MaxPool3d", (2,), {}),
    ("AvgPool1d", (3,), dict(count_include_pad=False)),
    ("AvgPool2d", (3, 2, 1), dict(ceil_mode=True)),
    ("AvgPool3d", (2,), {}),
    ("BatchNorm1d", (5,), {}),
    ("BatchNorm2d", (5,), dict(momentum=None, affine=False)),
    ("BatchNorm2d", (5,), dict(bias=False)),
    ("BatchNorm3d", (5,), dict(track_running_stats=False)),
    ("LayerNorm", ((4, 5),), {}),
    ("LayerNorm", (6,), dict(elementwise_affine=False)),
    ("LayerNorm", (6,), dict(bias=False, eps=1e-6)),
    ("RMSNorm", ((4, 5),), {}),
    ("RMSNorm", (6,), dict(eps=1e-6, elementwise_affine=False)),
    ("InstanceNorm1d", (3,), {}),
    ("InstanceNorm2d", (3,), dict(affine=True, track_running_stats=True)),
    ("InstanceNorm3d", (3,), dict(affine=True)),
    ("Dropout", (), {}),
    ("Dropout", (0.2, True), {}),
    ("LocalResponseNorm", (5,), {}),
    ("LocalResponseNorm", (3, 1e-3, 0.5, 2.0), {}),
    ("CTCLoss", (), dict(reduction="sum", zero_infinity=True)),
    ("ReLU", (), dict(inplace=True)),
    ("Sigmoid", (), {}),
    ("Tanh", (), {}),
    ("ELU", (0.5,), {}),
    ("SiLU", (), {}),
    ("Hardtanh", (0.0, 3.0), {}),
    ("ReLU6", (), {}),
    ("Softmax", (1,), {}),
    ("LogSoftmax", (-1,), {}),
    ("LSTM", (6, 8), dict(num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)),
    ("LSTM", (6, 8), dict(proj_size=3, bias=False)),
    ("GRU", (6, 8), dict(num_layers=2)),
    ("RNN", (6, 8), dict(nonlinearity="relu", bidirectional=True)),
]


def _pair(name, args, kw):
    torch.manual_seed(0)
    ref = getattr(tnn, name)(*args, **kw)
    torch.manual_seed(0)
    twin = getattr(nn, name)(*args, **kw)
    return ref, twin


@pytest.mark.parametrize("name, args, kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_same_state_dict_init_and_repr_as_torch(name, args, kw):
    ref, twin = _pair(name, args, kw)
    assert isinstance(twin, getattr(tnn, name)) and nn.TWINS[getattr(tnn, name)] is type(twin)
    a, b = ref.state_dict(), twin.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert repr(ref) == repr(twin) and ref.extra_repr() == twin.extra_repr()
    ref.load_state_dict(twin.state_dict())
    twin.load_state_dict(ref.state_dict())


def test_every_twin_is_listed_and_exported():
    assert set(nn.TWINS.values()) == {getattr(nn, n) for n in nn.__all__ if n not in ("TWINS", "available")}
    assert {t.__name__ for t in nn.TWINS} == {c[0] for c in CASES}


def test_constructor_signatures_are_torchs():
    import inspect

    assert inspect.signature(nn.Conv2d) == inspect.signature(tnn.Conv2d)
    assert inspect.signature(nn.BatchNorm2d) == inspect.signature(tnn.BatchNorm2d)
    assert "seed" in inspect.signature(nn.Dropout).parameters
    assert "cell_clip" in inspect.signature(nn.LSTM).parameters


REFUSED = [
    (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
    (lambda: nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular"), "padding_mode='circular'"),
    (lambda: nn.MaxPool2d(3, return_indices=True), "return_indices=True"),
    (lambda: nn.MaxPool2d(3, dilation=2), "dilation=2"),
    (lambda: nn.MaxPool3d(3, dilation=(1, 1, 2)), "dilation=(1, 1, 2)"),
    (lambda: nn.LocalResponseNorm(4), "size=4 (even)"),
    (lambda: nn.LocalResponseNorm(17), "size=17"),
    (lambda: nn.LocalResponseNorm(3, k=0.0), "k=0.0"),
    (lambda: nn.CTCLoss(blank=3), "blank=3"),
    (lambda: nn.Hardtanh(), "min_val=-1.0"),
    (lambda: nn.Hardtanh(-0.5, 1.0), "min_val=-0.5"),
    (lambda: nn.LSTM(4, 4, cell_clip=-1.0), "cell_clip"),
    (lambda: nn.GRU(4, 4, dropout=1.0, num_layers=2), "dropout=1.0"),
    (lambda: nn.BatchNorm2d(3, eps=0.0), "eps=0.0"),
    (lambda: nn.BatchNorm1d(3, momentum=1.5), "momentum=1.5"),
    (lambda: nn.InstanceNorm2d(3, eps=0.0), "eps=0.0"),
    (lambda: nn.InstanceNorm2d(3, momentum=-0.1, track_running_stats=True), "momentum=-0.1"),
    (lambda: nn.LayerNorm(3, eps=0.0), "eps=0.0"),
    (lambda: nn.RMSNorm(3, eps=0.0), "eps=0.0"),
]


def test_convert_leaves_a_normalization_cudnn_cannot_take():
    """eps=0 or a running-average factor outside [0, 1]: left by convert with the reason (torch runs them)."""
    m = torch.nn.Sequential(torch.nn.BatchNorm2d(3, eps=0.0), torch.nn.LayerNorm(3), torch.nn.RMSNorm(3, eps=0.0),
                            torch.nn.InstanceNorm1d(3, momentum=2.0, track_running_stats=True))  # fmt: skip
    report = C.convert(m)
    assert [type(x) for x in m] == [torch.nn.BatchNorm2d, nn.LayerNorm, torch.nn.RMSNorm, torch.nn.InstanceNorm1d]
    reasons = {name: why for name, _, why in report.left}
    assert "eps=0.0" in reasons["0"] and "eps=0.0" in reasons["2"] and "momentum=2.0" in reasons["3"]


@pytest.mark.parametrize("make, what", REFUSED, ids=[w for _, w in REFUSED])
def test_unsupported_arguments_raise_not_implemented_naming_them(make, what):
    with pytest.raises(NotImplementedError, match=re.escape(what)):
        make()


def test_conv_transpose_without_its_op_says_so(monkeypatch):
    monkeypatch.setattr(nn, "available", lambda name: name != "convolution_transpose")
    m = nn.ConvTranspose2d(2, 2, 3)
    with pytest.raises(NotImplementedError, match="convolution_transpose"):
        m(torch.zeros(1, 2, 4, 4))


def test_a_missing_op_is_not_implemented_naming_it(monkeypatch):
    from cudnnkit import autograd

    monkeypatch.setattr(autograd, "get", lambda name: (_ for _ in ()).throw(KeyError(name)))
    monkeypatch.setattr(nn, "_op", nn._op)
    import cudnnkit.torch as ct

    monkeypatch.setattr(ct, "_defined", {})
    with pytest.raises(NotImplementedError, match="'pooling'"):
        nn._op("pooling")


def test_lstm_cell_clip_keyword():
    m = nn.LSTM(4, 6, cell_clip=2.5)
    assert m.cell_clip == 2.5 and "cell_clip=2.5" in repr(m)
    assert nn.LSTM._config_of(m, "float32").cell_clip == (-2.5, 2.5)
    assert list(m.state_dict()) == list(tnn.LSTM(4, 6).state_dict())


# ----------------------------------------------------------------- convert()


class BasicBlock(tnn.Module):
    """torchvision's ResNet BasicBlock, written with torch.nn."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = tnn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(planes)
        self.relu = tnn.ReLU(inplace=True)
        self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = tnn.Sequential(tnn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                             tnn.BatchNorm2d(planes))  # fmt: skip

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class TinyResNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = tnn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = tnn.BatchNorm2d(8)
        self.relu = tnn.ReLU(inplace=True)
        self.maxpool = tnn.MaxPool2d(3, 2, 1)
        self.layer1 = tnn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, stride=2))
        self.dilated = tnn.MaxPool2d(2, dilation=2)
        self.reflect = tnn.Conv2d(16, 16, 3, padding=1, padding_mode="reflect")
        self.avgpool = tnn.AdaptiveAvgPool2d(1)
        self.fc = tnn.Linear(16, 10)


class MyReLU(tnn.ReLU):
    pass


def _all_ops(monkeypatch):
    monkeypatch.setattr(nn, "available", lambda name: True)


def test_convert_a_resnet_basic_block_model(monkeypatch):
    _all_ops(monkeypatch)
    model = TinyResNet().train(False)
    model.layer1[0].relu = MyReLU()
    keys = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    report = convert(model)
    assert report.model is model
    got = {n: (t, c) for n, t, c in report.replaced}
    expect = {"conv1": tnn.Conv2d, "bn1": tnn.BatchNorm2d, "relu": tnn.ReLU, "maxpool": tnn.MaxPool2d}
    for b in ("layer1.0", "layer1.1"):
        expect |= {f"{b}.conv1": tnn.Conv2d, f"{b}.bn1": tnn.BatchNorm2d, f"{b}.conv2": tnn.Conv2d,
                   f"{b}.bn2": tnn.BatchNorm2d}  # fmt: skip
    expect |= {"layer1.1.relu": tnn.ReLU, "layer1.1.downsample.0": tnn.Conv2d, "layer1.1.downsample.1": tnn.BatchNorm2d}
    assert {n: t for n, (t, _) in got.items()} == expect
    assert all(c is nn.TWINS[t] for t, c in got.values())
    left = {n: (t, why) for n, t, why in report.left}
    assert set(left) == {"layer1.0.relu", "dilated", "reflect", "avgpool", "fc"}
    assert "dilation=2" in left["dilated"][1] and "padding_mode='reflect'" in left["reflect"][1]
    assert "subclass of torch.nn.ReLU" in left["layer1.0.relu"][1]
    assert left["fc"][1] == left["avgpool"][1] == "no cudnnkit twin"
    # the modules are swapped in place, with the same Parameter and buffer objects, mode and repr
    assert type(model.layer1[1].downsample[0]) is nn.Conv2d and type(model.dilated) is tnn.MaxPool2d
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(keys) and all(after[k] is keys[k] for k in keys)
    assert not model.bn1.training and model.relu.inplace
    assert "replaced layer1.1.downsample.0: Conv2d -> cudnnkit.torch.nn.Conv2d" in str(report)
    assert "left     dilated: MaxPool2d (" in str(report)
    # converting again changes nothing
    again = convert(model)
    assert again.replaced == [] and {n for n, _, _ in again.left} == set(left)


def test_convert_not_inplace_and_a_missing_op(monkeypatch):
    monkeypatch.setattr(nn, "available", lambda name: name != "pooling")
    model = TinyResNet()
    report = convert(model, inplace=False)
    assert report.model is not model and type(model.conv1) is tnn.Conv2d and type(report.model.conv1) is nn.Conv2d
    assert report.model.conv1.weight is not model.conv1.weight
    assert torch.equal(report.model.conv1.weight, model.conv1.weight)
    why = dict((n, w) for n, _, w in report.left)
    assert "'pooling'" in why["maxpool"] and "dilation=2" in why["dilated"]


def test_convert_a_module_itself_and_a_shared_one(monkeypatch):
    _all_ops(monkeypatch)
    conv = tnn.Conv2d(2, 2, 3)
    report = convert(conv)
    assert type(report.model) is nn.Conv2d and report.model.weight is conv.weight
    assert report.replaced == [("", tnn.Conv2d, nn.Conv2d)]
    act = tnn.Tanh()
    seq = tnn.Sequential(act, tnn.Linear(2, 2), act)
    convert(seq)
    assert type(seq[0]) is nn.Tanh and seq[0] is seq[2]


class Tagger(tnn.Module):
    def __init__(self):
        super().__init__()
        self.embed = tnn.Embedding(20, 6)
        self.lstm = tnn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.gru = tnn.GRU(16, 4)
        self.drop = tnn.Dropout(0.3)
        self.norm = tnn.LayerNorm(4, dtype=torch.float64)
        self.head = tnn.Linear(4, 5)
        self.out = tnn.LogSoftmax(-1)


def test_convert_an_lstm_model(monkeypatch):
    _all_ops(monkeypatch)
    model = Tagger()
    params = dict(model.named_parameters())
    report = convert(model)
    assert [(n, t) for n, t, _ in report.replaced] == [("lstm", tnn.LSTM), ("gru", tnn.GRU), ("drop", tnn.Dropout),
                                                      ("out", tnn.LogSoftmax)]  # fmt: skip
    why = {n: w for n, _, w in report.left}
    assert set(why) == {"embed", "norm", "head"} and "float64" in why["norm"]
    assert all(p is params[n] for n, p in model.named_parameters())
    assert type(model.lstm) is nn.LSTM and model.lstm.cell_clip is None and model.lstm._flat_weights_names
    assert model.lstm._flat_weights[0] is model.lstm.weight_ih_l0
    assert repr(model.lstm) == repr(tnn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1))
    # deep copies and pickles of a converted model keep working (the twins' caches are dropped)
    import copy
    import pickle

    twin = copy.deepcopy(model)
    assert type(twin.lstm) is nn.LSTM and type(twin.drop) is nn.Dropout and twin.drop._ck_states == {}
    back = pickle.loads(pickle.dumps(model))
    assert list(back.state_dict()) == list(model.state_dict())


def test_convert_rejects_a_non_module():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        convert(object())
    assert callable(C)


# ----------------------------------------------------------------- RNN flat weights


def _fake_cudnn_layout(monkeypatch, align=4):
    """cuDNN's weight_params, faked: for each pseudo-layer and linear id a matrix then its bias, each aligned to
    ``align`` elements (gaps), the linear ids in reverse order (a layout unlike torch's)."""

    def count_and_views(cfg, w):
        D, H, P = cfg.num_directions, cfg.hidden_size, cfg.output_size
        pos, out = 0, []
        for pl in range(cfg.num_layers * D):
            layer, row = pl // D, []
            inp = cfg.input_size if layer == 0 else D * P
            for lin_id in reversed(range(len(cfg.gates))):
                gate = cfg.gates[lin_id]
                shape = (P, H) if gate == "P" else (H, inp if gate.startswith("W") else P)
                pos = -(-pos // align) * align
                m = None if w is None else w[pos : pos + shape[0] * shape[1]].view(shape)
                pos += shape[0] * shape[1]
                b = None
                if gate != "P" and cfg.bias_mode == "double":
                    pos = -(-pos // align) * align + 1
                    b = None if w is None else w[pos : pos + H]
                    pos += H
                row.append(_rnn.LinearParams(layer, pl % D, lin_id, gate, m, b))
            out.append(sorted(row, key=lambda p: p.lin_id))
        return pos + 3, out

    monkeypatch.setattr(_rnn.RNN, "new_weights",
                        lambda self, like, stream=None: like.new_empty(count_and_views(self, None)[0]))  # fmt: skip
    monkeypatch.setattr(_rnn.RNN, "weight_params", lambda self, w, stream=None: count_and_views(self, w)[1])


@pytest.mark.parametrize(
    "kind, kw",
    [
        ("LSTM", dict(num_layers=2, bidirectional=True)),
        ("LSTM", dict(proj_size=3)),
        ("GRU", dict(bias=False)),
        ("RNN", dict(num_layers=2, nonlinearity="relu")),
    ],
)
def test_flat_weights_pack_torch_params_and_the_gradient_flows_back(monkeypatch, kind, kw):  # fmt: skip
    _fake_cudnn_layout(monkeypatch)
    m = getattr(nn, kind)(5, 7, dtype=torch.float64, **kw)
    cfg = nn._RNNBase._config_of(m, "float64")
    nn._LAYOUTS.clear()
    count, pieces = nn._weight_layout(cfg, torch.zeros(1, dtype=torch.float64))
    params = {n: getattr(m, n) for n in m._flat_weights_names}
    w = nn._flat_weights(params, count, pieces)
    assert w.shape == (count,) and w.dtype == torch.float64
    covered = torch.zeros(count, dtype=torch.bool)
    for off, name, first, rows, n in pieces:
        assert torch.equal(w[off : off + n], params[name][first : first + rows].reshape(-1))
        covered[off : off + n] = True
    assert torch.all(w[~covered] == 0) and (~covered).any()
    # every parameter element is in the buffer once
    assert covered.sum() == sum(p.numel() for p in params.values())
    g = torch.arange(count, dtype=torch.float64)
    w.backward(g)
    for off, name, first, rows, n in pieces:
        assert torch.equal(params[name].grad[first : first + rows].reshape(-1), g[off : off + n])
    nn._LAYOUTS.clear()


# ----------------------------------------------------------------- forwards, with torch standing in for cuDNN


class FakeOp:
    """An op like cudnnkit.torch.op(name): ``d.inputs``/``d.arrays``, called with the inputs positionally."""

    def __init__(self, inputs, arrays, fn):
        self.d = SimpleNamespace(inputs=inputs, arrays=arrays)
        self.fn, self.calls = fn, []

    def __call__(self, *ins, **kw):
        self.calls.append((ins, kw))
        return self.fn(*ins, **kw)


def _bn(x, scale, bias, z, *, running_mean=None, running_var=None, training=True, momentum=0.1, epsilon=1e-5):
    assert z is None
    y = F.batch_norm(x, running_mean, running_var, scale, bias, training, momentum, epsilon)
    return (y, None, None) if training else y


def _pool(x, *, mode, window, stride, padding, ceil_mode=False, propagate_nan=False):
    nsp = x.dim() - 2
    if mode.startswith("max"):
        return getattr(F, f"max_pool{nsp}d")(x, window, stride, padding, ceil_mode=ceil_mode)
    if mode == "avg_exclude_padding":
        return getattr(F, f"avg_pool{nsp}d")(x, window, stride, padding, ceil_mode, False)
    # cuDNN's include-padding divisor: the full window, the ceil-mode cells past the padding included
    x2 = x.unsqueeze(-1) if nsp == 1 else x
    ext = (1,) if nsp == 1 else ()
    y = getattr(F, f"avg_pool{max(nsp, 2)}d")(x2, tuple(window) + ext, tuple(stride) + ext, tuple(padding) + (0,) * len(ext),
                                               ceil_mode, True, math.prod(window))  # fmt: skip
    return y.squeeze(-1) if nsp == 1 else y


def _act(x, *, mode, coef=None, propagate_nan=False):
    return {"relu": lambda: F.relu(x), "sigmoid": lambda: torch.sigmoid(x), "tanh": lambda: torch.tanh(x),
            "elu": lambda: F.elu(x, coef), "swish": lambda: x * torch.sigmoid(coef * x),
            "clipped_relu": lambda: x.clamp(0, coef)}[mode]()  # fmt: skip


def _ctc(x, *, labels, label_lengths, input_lengths, blank=0, normalization="softmax"):
    assert labels.dim() == 1 and labels.dtype == torch.int32 and labels.device.type == "cpu" and blank == 0
    assert (label_lengths > 0).all() and (label_lengths <= input_lengths).all()  # what cuDNN takes
    args = (x.log_softmax(-1) if normalization == "softmax" else x, labels.long(), input_lengths.long(),
            label_lengths.long())  # fmt: skip
    costs = F.ctc_loss(*args, reduction="none", zero_infinity=True)  # cuDNN zeroes the gradient where no alignment
    with torch.no_grad():
        inf = torch.where(torch.isinf(F.ctc_loss(*args, reduction="none")), math.inf, 0.0)
    return costs + inf


FAKES = {
    "convolution": lambda: FakeOp(("x", "w", "bias"), (), lambda x, w, b, *, stride, padding, dilation, groups:
                                  getattr(F, f"conv{x.dim() - 2}d")(x, w, b, stride, padding, dilation, groups)),
    "convolution_transpose": lambda: FakeOp(("dy", "w"), (), lambda x, w, *, stride, padding, output_padding,
                                            dilation, groups: getattr(F, f"conv_transpose{x.dim() - 2}d")(
                                                x, w, None, stride, padding, output_padding, groups, dilation)),
    "batch_norm": lambda: FakeOp(("x", "scale", "bias", "z"), ("running_mean", "running_var"), _bn),
    "instance_norm": lambda: FakeOp(("x", "scale", "bias"), (), lambda x, s, b, *, epsilon:
                                    (F.instance_norm(x, None, None, s, b, True, 0.0, epsilon), None, None)),
    "layer_norm": lambda: FakeOp(("x", "scale", "bias"), (), lambda x, s, b, *, normalized_shape_ndim, epsilon:
                                 F.layer_norm(x, x.shape[-normalized_shape_ndim:], s, b, epsilon)),
    "rms_norm": lambda: FakeOp(("x", "scale"), (), lambda x, s, *, normalized_shape_ndim, epsilon:
                               F.rms_norm(x, x.shape[-normalized_shape_ndim:], s, epsilon)),
    "pooling": lambda: FakeOp(("x",), (), _pool),
    "activation": lambda: FakeOp(("x",), (), _act),
    "softmax": lambda: FakeOp(("x",), (), lambda x, *, axis, log: (F.log_softmax if log else F.softmax)(x, axis)),
    "lrn": lambda: FakeOp(("x",), (), lambda x, *, size, lrn_alpha, lrn_beta, k:
                          F.local_response_norm(x, size, lrn_alpha, lrn_beta, k)),
    "ctc_loss": lambda: FakeOp(("x",), ("labels", "label_lengths", "input_lengths"), _ctc),
    "dropout": lambda: FakeOp(("x",), ("seed",), lambda x, *, p, state: (x * 2, None)),
}  # fmt: skip


@pytest.fixture
def fake_ops(monkeypatch):
    ops = {name: make() for name, make in FAKES.items()}
    monkeypatch.setattr(nn, "_op", lambda name: ops[name])
    monkeypatch.setattr(nn, "available", lambda name: name in ops)
    monkeypatch.setattr(ckt, "op", lambda name: ops[name])  # the twins that call cudnnkit.nn's functional forms
    return ops


def _same(name, args, kw, *inputs, train=True, steps=1):
    ref, twin = _pair(name, args, kw)
    ref.train(train), twin.train(train)
    for _ in range(steps):
        a = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        b = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        ya, yb = ref(*a), twin(*b)
        assert torch.allclose(ya, yb, atol=1e-12), name
        (ya * torch.linspace(-1, 1, ya.numel(), dtype=ya.dtype).view_as(ya)).sum().backward()
        (yb * torch.linspace(-1, 1, yb.numel(), dtype=yb.dtype).view_as(yb)).sum().backward()
        for u, v in zip(a, b):
            if u.grad is not None:
                assert torch.allclose(u.grad, v.grad, atol=1e-12)
    for (n, p), (_, q) in zip(ref.named_parameters(), twin.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12), n
    for (n, p), (_, q) in zip(ref.named_buffers(), twin.named_buffers()):
        assert torch.allclose(p.double(), q.double(), atol=1e-12), n
    return ref, twin


def _x(*shape):
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


D = dict(dtype=torch.float64)


@pytest.mark.parametrize("name, args, kw, shape", [
    ("Conv1d", (3, 4, 3), dict(padding="same", **D), (2, 3, 9)),
    ("Conv2d", (4, 6, (3, 2)), dict(stride=2, padding=1, groups=2, **D), (2, 4, 7, 6)),
    ("Conv2d", (4, 6, 3), dict(bias=False, dilation=2, **D), (4, 9, 9)),  # unbatched
    ("Conv3d", (2, 2, 2), D, (1, 2, 4, 4, 4)),
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2, **D), (2, 4, 5, 5)),
    ("ConvTranspose1d", (2, 3, 3), dict(stride=3, **D), (2, 4)),  # unbatched
    ("MaxPool2d", (3, 2, 1), dict(ceil_mode=True), (2, 3, 8, 7)),
    ("MaxPool1d", (2,), {}, (3, 9)),  # unbatched
    ("MaxPool3d", (2, 1), {}, (1, 2, 3, 4, 5)),
    ("AvgPool2d", (3, 2, 1), dict(ceil_mode=True), (2, 3, 8, 7)),  # torch's divisor at the ceil-mode edge
    ("AvgPool1d", (4, 3, 1), dict(ceil_mode=True), (2, 3, 10)),
    ("AvgPool3d", (3, 2, 1), dict(ceil_mode=True, count_include_pad=False), (1, 2, 6, 5, 8)),
    ("AvgPool2d", (2,), {}, (2, 3, 6, 6)),
    ("AvgPool2d", (3, 2, 1), dict(ceil_mode=True, divisor_override=5), (2, 3, 8, 7)),  # sum / 5, ceil windows too
    ("AvgPool3d", (2,), dict(count_include_pad=False, divisor_override=-3), (1, 2, 4, 4, 5)),
    ("LayerNorm", ((4, 5),), D, (3, 4, 5)),
    ("LayerNorm", (5,), dict(elementwise_affine=False, **D), (3, 5)),
    ("LayerNorm", (5,), dict(bias=False, **D), (3, 2, 5)),
    ("RMSNorm", ((4, 5),), D, (3, 4, 5)),
    ("RMSNorm", (5,), dict(eps=None, elementwise_affine=False, **D), (3, 5)),
    ("LayerNorm", ((3, 5),), D, (3, 5)),  # every dim normalized
    ("RMSNorm", (5,), D, (5,)),
    ("InstanceNorm2d", (3,), dict(affine=True, **D), (2, 3, 4, 5)),
    ("InstanceNorm1d", (3,), {}, (3, 6)),  # unbatched
    ("LocalResponseNorm", (3, 1e-2, 0.6, 1.5), {}, (2, 6, 4, 4)),
    ("ReLU", (), {}, (4, 5)),
    ("Sigmoid", (), {}, (4, 5)),
    ("Tanh", (), {}, (4, 5)),
    ("ELU", (0.7,), {}, (4, 5)),
    ("SiLU", (), {}, (4, 5)),
    ("Hardtanh", (0.0, 0.5), {}, (4, 5)),
    ("ReLU6", (), {}, (4, 5)),
    ("Softmax", (1,), {}, (3, 4, 5)),
    ("ReLU", (), {}, ()),  # a 0-d input: cuDNN's (1,), the result 0-d again
    ("Tanh", (), {}, ()),
    ("Softmax", (0,), {}, ()),
    ("LogSoftmax", (-1,), {}, ()),
    ("LogSoftmax", (-1,), {}, (3, 4, 5)),
])  # fmt: skip
def test_forward_and_backward_match_torch_through_the_ops(fake_ops, name, args, kw, shape):
    x = _x(*shape) * (4 if "ReLU6" in name else 1)
    _same(name, args, kw, x)


@pytest.mark.parametrize("kw", [dict(), dict(momentum=None), dict(affine=False), dict(bias=False),
                                dict(track_running_stats=False)])  # fmt: skip
@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_running_statistics_as_torch(fake_ops, kw, train):
    ref, twin = _same("BatchNorm2d", (3,), dict(dtype=torch.float64, **kw), _x(4, 3, 2, 5), train=train, steps=3)
    call = fake_ops["batch_norm"].calls[-1][1]
    bn_training = train or not twin.track_running_stats
    assert call["training"] is bn_training and call["epsilon"] == 1e-5
    if train and kw.get("momentum", 0.1) is None:
        # the cumulative average: cuDNN writes the batch's statistics (momentum 1), blended with the old ones
        # on the device (the same keywords every step: no new plan or replay key per call)
        assert call["momentum"] == 1.0 and all(c[1]["momentum"] == 1.0 for c in fake_ops["batch_norm"].calls)
    if train and twin.track_running_stats:
        assert int(twin.num_batches_tracked) == 3
    if not bn_training:
        assert call["running_mean"] is twin.running_mean
    if train and not twin.track_running_stats:
        assert call["running_mean"] is None


@pytest.mark.parametrize("dtype, eps", [(torch.float16, 2.0**-23), (torch.bfloat16, 2.0**-23),
                                        (torch.float64, 2.0**-52)])  # fmt: skip
def test_rms_norms_default_eps_is_torchs(fake_ops, dtype, eps):
    """RMSNorm(eps=None): torch's kernels use the epsilon of their math type, float32's for the half types
    (not finfo(x.dtype).eps, which is 2**-10 for float16: a different result for small inputs)."""
    nn.RMSNorm(8, dtype=dtype)(torch.zeros(2, 8, dtype=dtype))
    assert fake_ops["rms_norm"].calls[-1][1]["epsilon"] == eps


def test_norm_twins_of_an_empty_batch_are_torchs(fake_ops):
    for ref in (torch.nn.BatchNorm1d(3), torch.nn.LayerNorm(4), torch.nn.RMSNorm(4)):
        twin = C.convert(torch.nn.Sequential(ref)).model[0]
        x = torch.zeros(0, 3, 4)
        assert twin(x).shape == ref(x).shape == (0, 3, 4)
    assert int(twin.weight.numel()) == 4 and not any(f.calls for f in fake_ops.values())


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 3, 0, 4)])
@pytest.mark.parametrize("train", [True, False])
def test_instance_norm_of_an_empty_input_keeps_its_running_statistics(fake_ops, shape, train):
    """An empty input (a zero batch or a zero spatial dim) with running statistics: an empty result and the
    statistics untouched, as torch leaves them for a zero spatial dim (they were a mean of nothing: NaN). For a
    zero batch torch 2.13 raises an IndexError of its own; the twin, as cudnnkit.nn.instance_norm, returns empty."""
    m = nn.InstanceNorm2d(3, affine=True, track_running_stats=True).train(train)
    assert m(torch.zeros(shape)).shape == shape
    assert torch.equal(m.running_mean, torch.zeros(3)) and torch.equal(m.running_var, torch.ones(3))
    assert not any(f.calls for f in fake_ops.values())


def test_batch_norm_1d_and_one_value_per_channel(fake_ops):
    _same("BatchNorm1d", (3,), D, _x(4, 3))
    _same("BatchNorm1d", (3,), D, _x(4, 3, 5))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(torch.zeros(1, 3))


def test_batch_norm_casts_parameters_for_half_inputs(fake_ops):
    m = nn.BatchNorm2d(3).half()
    fake_ops["batch_norm"].fn = lambda x, s, b, z, **kw: (x, None, None)
    m(torch.zeros(2, 3, 2, 2, dtype=torch.float16))
    ins, kw = fake_ops["batch_norm"].calls[-1]
    assert ins[1].dtype == ins[2].dtype == kw["running_mean"].dtype == torch.float32
    assert m.running_mean.dtype == torch.float16


@pytest.mark.parametrize("train", [True, False])
def test_instance_norm_with_running_statistics_as_torch(fake_ops, train):
    kw = dict(affine=True, track_running_stats=True, **D)
    _same("InstanceNorm2d", (3,), kw, _x(2, 3, 4, 5), train=train, steps=2)
    _same("InstanceNorm1d", (3,), dict(momentum=0.3, **D), _x(2, 3, 7), train=train)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("padded", [True, False])
def test_ctc_loss_targets_lengths_and_reductions_as_torch(fake_ops, reduction, zero_infinity, padded):
    T, N, A = 6, 3, 5
    x = F.log_softmax(_x(T, N, A).float(), -1)
    tl = torch.tensor([2, 3, 4])
    targets = torch.tensor([[1, 2, 0, 0], [3, 3, 1, 0], [1, 1, 1, 1]])  # the last: no alignment (inf)
    if not padded:
        targets = torch.cat([targets[i, : tl[i]] for i in range(N)])
    il = torch.tensor([6, 6, 6])
    ref = tnn.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)
    twin = nn.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(a, targets, il, tl), twin(b, targets, il, tl)
    assert torch.allclose(ya, yb, equal_nan=True)
    assert torch.allclose(twin(b, targets, (6, 6, 6), tuple(tl.tolist())), yb, equal_nan=True)  # lengths as tuples
    if zero_infinity:
        ya.sum().backward(), yb.sum().backward()
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_ctc_loss_unbatched(fake_ops):
    x = F.log_softmax(_x(5, 4).float(), -1)
    ya = tnn.CTCLoss(reduction="none")(x, torch.tensor([1, 2]), torch.tensor(5), torch.tensor(2))
    yb = nn.CTCLoss(reduction="none")(x, torch.tensor([1, 2]), torch.tensor(5), torch.tensor(2))
    assert ya.shape == yb.shape == () and torch.allclose(ya, yb)


def test_dropout_training_eval_and_p(fake_ops, monkeypatch):
    monkeypatch.setattr(nn, "default_state", lambda x, name="x": "the default state")
    x = torch.ones(3, 4)
    m = nn.Dropout(0.25)
    assert torch.equal(m(x), 2 * x)
    assert fake_ops["dropout"].calls[-1][1] == {"p": 0.25, "state": "the default state"}
    m.eval()
    assert m(x) is x
    m.train()
    assert torch.equal(nn.Dropout(1.0)(x), torch.zeros_like(x)) and nn.Dropout(0.0)(x) is x
    made = []
    monkeypatch.setattr(nn, "DropoutState", lambda like, seed, _name: made.append(seed) or f"state {seed}")
    own = nn.Dropout(0.5, seed=7)
    own(x), own(x)
    assert made == [7] and fake_ops["dropout"].calls[-1][1]["state"] == "state 7" and "seed=7" in repr(own)


def test_softmax_implicit_dim_as_torch(fake_ops):
    x = _x(2, 3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        y = nn.Softmax()(x)
    assert fake_ops["softmax"].calls[-1][1]["axis"] == 0 and torch.allclose(y, F.softmax(x, 0))


def test_activation_keywords(fake_ops):
    x = torch.tensor([-1.0, 0.5, 3.0], requires_grad=True)
    assert torch.equal(nn.ReLU(inplace=True)(x), F.relu(x)) and x.min() < 0  # a new tensor: x is kept
    fake_ops["activation"].calls.clear()
    nn.ReLU()(x), nn.Hardtanh(0, 2.0)(x), nn.ELU(0.3)(x), nn.SiLU()(x), nn.Sigmoid()(x)
    calls = [kw for _, kw in fake_ops["activation"].calls]
    assert calls == [dict(mode="relu", coef=None, propagate_nan=True), dict(mode="clipped_relu", coef=2.0,
                     propagate_nan=True), dict(mode="elu", coef=0.3), dict(mode="swish", coef=1.0),
                     dict(mode="sigmoid", coef=None)]  # fmt: skip


def test_pooling_keywords(fake_ops):
    nn.MaxPool2d(3, 2, 1)(_x(1, 1, 6, 6))
    assert fake_ops["pooling"].calls[-1][1] == dict(mode="max", window=(3, 3), stride=(2, 2), padding=(1, 1),
                                                    ceil_mode=False, propagate_nan=True)  # fmt: skip
    nn.AvgPool1d(3, count_include_pad=False)(_x(1, 1, 6))
    assert fake_ops["pooling"].calls[-1][1] == dict(mode="avg_exclude_padding", window=(3,), stride=(3,),
                                                    padding=(0,), ceil_mode=False)  # fmt: skip


def test_include_pad_factors():
    # a 7-long input, window 3, stride 2, padding 1, ceil: 4 outputs; the last window [5, 8) clips to [5, 8) of
    # the 7 + 1 padded cells: 3 of 3 (no fix); for 8 long it starts at 7 and clips to [7, 9): 2 cells
    from cudnnkit.nn.pooling import include_pad_factor

    assert include_pad_factor((7,), (3,), (2,), (1,), (4,)) is None
    assert include_pad_factor((8,), (3,), (2,), (1,), (5,)) == ((1.0, 1.0, 1.0, 1.0, 1.5),)


def _fake_rnn(fake_ops, monkeypatch):
    """The rnn op faked: y of the right shape (zeros), hy = hx (so the hidden-state permutations show), cy = cx."""
    _fake_cudnn_layout(monkeypatch)
    nn._LAYOUTS.clear()

    def run(x, w, hx, cx, *, rnn, training, layout, seq_lengths):
        D, P = rnn.num_directions, rnn.output_size
        N = len(seq_lengths) if layout == "packed" else x.shape[0 if layout == "batch_major" else 1]
        y = x.new_zeros(*x.shape[:-1], D * P) + w.sum() * 0
        hy = hx if hx is not None else x.new_zeros(rnn.hidden_shape(N))
        cy = cx if cx is not None else (x.new_zeros(rnn.cell_shape(N)) if rnn.cell == "lstm" else None)
        return y, hy, cy

    fake_ops["rnn"] = FakeOp(("x", "w", "hx", "cx"), (), run)
    return fake_ops["rnn"]


def test_rnn_forward_layouts_hidden_states_and_packed_sequences(fake_ops, monkeypatch):
    op = _fake_rnn(fake_ops, monkeypatch)
    m = nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True, dtype=torch.float64)
    y, (h, c) = m(_x(2, 5, 3))
    kw = op.calls[-1][1]
    assert kw["layout"] == "batch_major" and kw["seq_lengths"] is None and kw["training"] is True
    assert kw["rnn"] == _rnn.RNN("lstm", 3, 4, num_layers=2, bidirectional=True, dtype="float64",
                                 dropout_seed=torch.initial_seed() % 2**64)  # fmt: skip
    assert y.shape == (2, 5, 8) and h.shape == (4, 2, 4) and c.shape == (4, 2, 4)
    # unbatched, with a given state
    h0, c0 = _x(4, 4), _x(4, 4) + 1
    y, (h, c) = m.eval()(_x(5, 3), (h0, c0))
    assert y.shape == (5, 8) and torch.equal(h, h0) and torch.equal(c, c0) and op.calls[-1][1]["training"] is False
    # a PackedSequence: cuDNN's packed layout with the lengths; hx is permuted into sorted order and back
    seqs = [_x(2, 3), _x(5, 3), _x(3, 3)]
    packed = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
    g = nn.GRU(3, 4, dtype=torch.float64)
    h0 = _x(1, 3, 4)
    y, h = g(packed, h0)
    ins, kw = op.calls[-1]
    assert kw["layout"] == "packed" and kw["seq_lengths"] == (5, 3, 2) and ins[3] is None
    assert torch.equal(ins[2], h0[:, [1, 2, 0]]) and torch.equal(h, h0)
    assert isinstance(y, torch.nn.utils.rnn.PackedSequence) and y.data.shape == (10, 4)
    assert torch.equal(y.batch_sizes, packed.batch_sizes)
    with pytest.raises(RuntimeError, match="hx should also be 3-D"):
        m(_x(2, 5, 3), (_x(4, 4), _x(4, 4)))
    nn._LAYOUTS.clear()


def test_rnn_gradient_reaches_torch_parameters(fake_ops, monkeypatch):
    op = _fake_rnn(fake_ops, monkeypatch)
    op.fn = lambda x, w, hx, cx, **kw: ((x.sum() * w.sum()).expand(*x.shape[:-1], 4), hx, cx)
    m = nn.RNN(3, 4, dtype=torch.float64)
    y, _ = m(_x(5, 2, 3), _x(1, 2, 4))
    y.sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in m.parameters())
    nn._LAYOUTS.clear()


def test_conv_transpose_output_size_and_bias_as_torch(fake_ops):
    ref, twin = _pair("ConvTranspose2d", (3, 2, 3), dict(stride=2, padding=1, dtype=torch.float64))
    x = _x(1, 3, 4, 5)
    assert torch.allclose(ref(x, output_size=[8, 10]), twin(x, output_size=[8, 10]))
    assert fake_ops["convolution_transpose"].calls[-1][1]["output_padding"] == (1, 1)


def test_the_modules_call_the_registered_declarations_by_their_names(fake_ops, monkeypatch):
    """The fakes have the real declarations' inputs and arrays, and every keyword a module passes is one of the
    real forward's (where the op is registered)."""
    import inspect

    from cudnnkit import autograd

    real = autograd.functions()
    for name, fake in fake_ops.items():
        if name in real:
            assert (fake.d.inputs, fake.d.arrays) == (real[name].inputs, real[name].arrays), name
    _fake_rnn(fake_ops, monkeypatch)
    monkeypatch.setattr(nn, "default_state", lambda x, name="x": None)
    x2, x3 = _x(2, 3, 6, 6), _x(2, 3, 6)
    for m, x in [(nn.Conv2d(3, 4, 3, dtype=torch.float64), x2), (nn.ConvTranspose2d(3, 2, 3, dtype=torch.float64), x2),
                 (nn.MaxPool2d(2), x2), (nn.AvgPool1d(2), x3), (nn.BatchNorm2d(3, dtype=torch.float64), x2),
                 (nn.InstanceNorm2d(3, track_running_stats=True), x2), (nn.InstanceNorm1d(3), x3),
                 (nn.LayerNorm(6, dtype=torch.float64), x2), (nn.RMSNorm(6, dtype=torch.float64), x2),
                 (nn.LocalResponseNorm(3), x2), (nn.Dropout(), x2), (nn.ELU(), x2), (nn.LogSoftmax(1), x2),
                 (nn.LSTM(6, 4, dtype=torch.float64), x3)]:  # fmt: skip
        m(x)
    nn.CTCLoss()(F.log_softmax(_x(6, 2, 5).float(), -1), torch.tensor([[1, 2], [3, 4]]), (6, 6), (2, 2))
    for name, fake in fake_ops.items():
        if name in real and fake.calls:
            params = inspect.signature(real[name].forward).parameters
            for ins, kw in fake.calls:
                assert len(ins) == len(real[name].inputs) and set(kw) <= set(params), (name, set(kw) - set(params))
    nn._LAYOUTS.clear()


# ----------------------------------------------------------------- RNN module edges (a review's findings)


def test_rnn_bfloat16_is_refused_by_name_and_left_by_convert():
    """cuDNN 9's RNNs have no bfloat16: the twin refuses bfloat16 parameters at construction and forward
    (NotImplementedError naming it), and convert() leaves a bfloat16 torch LSTM as it is."""
    with pytest.raises(NotImplementedError, match="bfloat16"):
        nn.LSTM(3, 5, dtype=torch.bfloat16)
    m = nn.GRU(3, 5)
    m.bfloat16()
    with pytest.raises(NotImplementedError, match="bfloat16"):
        m(torch.zeros(2, 1, 3, dtype=torch.bfloat16))
    model = tnn.Sequential(tnn.LSTM(3, 4).bfloat16())
    report = C.convert(model)
    assert type(model[0]) is tnn.LSTM and not report.replaced and "bfloat16" in str(report)


def test_rnn_one_layer_takes_dropout_one_and_list_cell_clip():
    """torch takes dropout=1 with one layer (it acts between layers: none), and cell_clip as a list."""
    m = nn.LSTM(3, 5, dropout=1.0, cell_clip=[-1.0, 1.0])
    cfg = nn._RNNBase._config_of(m, "float32")
    assert cfg.dropout == 0.0 and cfg.cell_clip == (-1.0, 1.0)
    with pytest.raises(NotImplementedError, match="dropout"):
        nn.LSTM(3, 5, num_layers=2, dropout=1.0)


@pytest.mark.parametrize("hx", [False, True])
def test_rnn_input_checks_are_torchs_with_or_without_hx(hx):
    m, ref = nn.GRU(3, 5), tnn.GRU(3, 5)
    x = torch.randn(4, 2, 7)
    h = torch.zeros(1, 2, 5) if hx else None
    with pytest.raises(RuntimeError) as want:
        ref(x, h)
    with pytest.raises(RuntimeError) as got:
        m(x, h)  # before any op call (no GPU here)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("kind, kw", [("LSTM", dict(proj_size=2, bidirectional=True)), ("GRU", dict(num_layers=2)),
                                      ("RNN", dict(batch_first=True))])  # fmt: skip
def test_rnn_empty_batch_gives_torchs_empty_outputs(kind, kw):
    """A batch of 0 sequences: torch's empty outputs and zero parameter gradients (cuDNN takes no empty batch)."""
    m, ref = getattr(nn, kind)(3, 5, **kw), getattr(tnn, kind)(3, 5, **kw)
    x = torch.randn(0, 4, 3) if kw.get("batch_first") else torch.randn(4, 0, 3)
    x.requires_grad_(True)
    (y, h), (yr, hr) = m(x), ref(x)
    assert y.shape == yr.shape
    for a, b in zip(h if kind == "LSTM" else (h,), hr if kind == "LSTM" else (hr,)):
        assert a.shape == b.shape
    y.sum().backward()
    assert x.grad.shape == x.shape and all(torch.equal(p.grad, torch.zeros_like(p)) for p in m.parameters())


def test_rnn_under_autocast_runs_in_the_autocast_dtype(monkeypatch):
    """torch's autocast runs its RNNs in float16 (input, state and weights cast): a float16 input from an autocast
    layer with float32 weights is not refused; autocast to bfloat16 is refused by name."""
    seen = []

    def fn(x, w, hx, cx, **kw):
        seen.append((x.dtype, w.dtype, None if hx is None else hx.dtype))
        cfg = kw["rnn"]
        return (x.new_zeros(*x.shape[:-1], cfg.hidden_size), x.new_zeros(1, x.shape[1], cfg.hidden_size),
                x.new_zeros(0))  # fmt: skip

    monkeypatch.setattr(nn, "_op", lambda name: FakeOp(("x", "w", "hx", "cx"), (), fn))
    monkeypatch.setattr(nn, "_weight_layout", lambda cfg, like: (cfg.hidden_size, ()))
    m = nn.GRU(3, 5)
    with torch.autocast("cpu", dtype=torch.float16):
        m(torch.randn(4, 2, 3).half(), torch.zeros(1, 2, 5))
        m(torch.randn(4, 2, 3))
    assert seen == [(torch.float16, torch.float16, torch.float16), (torch.float16, torch.float16, None)]
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(NotImplementedError, match="bfloat16"):
        m(torch.randn(4, 2, 3))


def test_rnn_empty_batch_follows_autocast_and_gives_hx_its_gradient():
    m = nn.LSTM(4, 5, num_layers=2, bidirectional=True, proj_size=3)
    h0, c0 = torch.zeros(4, 0, 3, requires_grad=True), torch.zeros(4, 0, 5, requires_grad=True)
    y, (h, c) = m(torch.randn(3, 0, 4), (h0, c0))
    (y.sum() + h.sum() + c.sum()).backward()
    assert h0.grad is not None and h0.grad.shape == h0.shape and c0.grad.shape == c0.shape
    with torch.autocast("cpu", dtype=torch.float16):
        y, (h, c) = m(torch.randn(3, 0, 4))
    assert y.dtype == h.dtype == c.dtype == torch.float16 and y.shape == (3, 0, 6)


def test_batch_norm_cumulative_average_in_float32_for_half_buffers(fake_ops):
    """bfloat16 running statistics are averaged in float32, as torch's kernels accumulate, and rounded once: at
    count 300 the weight 1/300 rounded to bfloat16 first would be off."""
    m = nn.BatchNorm1d(3, momentum=None)
    m.num_batches_tracked.fill_(299)
    m.running_mean.data = torch.ones(3, dtype=torch.bfloat16)
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(3)) * 40 + 60
    m(x)
    want = (torch.ones(3) + (x.mean(0) - 1) / 300).bfloat16()
    assert torch.equal(m.running_mean, want)
