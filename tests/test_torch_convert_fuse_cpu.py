"""``cudnnkit.torch.convert(model, fuse=True)`` on the CPU: which Conv/BatchNorm -> ReLU pairs it fuses (in an
``nn.Sequential``, used once, without hooks), what it leaves, and that the fused twin's forward asks its op for
``activation="relu"`` (the op itself runs on the GPU: tests/gpu/test_torch_fuse_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn as tnn  # noqa: E402

from cudnnkit.torch import convert, nn  # noqa: E402


def _cnn():
    return tnn.Sequential(
        tnn.Conv2d(3, 8, 3, padding=1), tnn.BatchNorm2d(8), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(8, 8, 3, padding=1), tnn.ReLU(inplace=True),
        tnn.Sequential(tnn.BatchNorm2d(8), tnn.ReLU()), tnn.ConvTranspose2d(8, 4, 2), tnn.ReLU(),
        tnn.Flatten(),
    )  # fmt: skip


@pytest.fixture
def all_ops(monkeypatch):
    monkeypatch.setattr(nn, "available", lambda name: True)


def test_fuse_marks_the_op_and_replaces_the_relu_by_identity(all_ops):
    model = _cnn()
    keys = list(model.state_dict())
    report = convert(model, fuse=True)
    assert report.fused == [("1", "2"), ("4", "5"), ("6.0", "6.1")]
    assert [type(model[i]) for i in (2, 5)] == [tnn.Identity, tnn.Identity] and type(model[6][1]) is tnn.Identity
    assert model[1].fused_activation == model[4].fused_activation == model[6][0].fused_activation == "relu"
    assert model[0].fused_activation is None  # a conv followed by a batch norm: nothing to fuse
    assert type(model[8]) is nn.ReLU and model[7].fused_activation is None  # a transposed conv is never fused
    assert list(model.state_dict()) == keys  # Identity has no state: the keys are torch's
    assert "activation='relu'" in repr(model[1]) and "activation" not in repr(model[0])
    assert "3 ReLU(s) fused" in str(report) and "fused    1 + 2 (ReLU -> Identity)" in str(report)
    assert convert(model, fuse=True).fused == []  # converting again fuses nothing more


def test_fuse_is_off_by_default_and_leaves_shared_or_hooked_modules(all_ops):
    model = _cnn()
    assert convert(model).fused == [] and type(model[2]) is nn.ReLU
    shared = tnn.ReLU()
    m2 = tnn.Sequential(tnn.BatchNorm2d(4), shared, tnn.Conv2d(4, 4, 1), shared)  # the ReLU is used twice
    assert convert(m2, fuse=True).fused == []
    m3 = tnn.Sequential(tnn.BatchNorm2d(4), tnn.ReLU(), tnn.Conv2d(4, 4, 1), tnn.ReLU())
    m3[3].register_forward_hook(lambda *a: None)
    assert convert(m3, fuse=True).fused == [("0", "1")] and type(m3[3]) is nn.ReLU


def test_a_hook_handle_taken_before_convert_removes_the_hook_from_the_twin(all_ops):
    """The twin keeps the torch module's hook dicts themselves: a handle from before the conversion still removes
    its hook (a copy would leave it firing on the twin); parameters are the module's, their dict the twin's own."""
    m = tnn.Sequential(tnn.Conv2d(4, 4, 1), tnn.ReLU())
    conv = m[0]
    handles = [conv.register_forward_hook(lambda *a: None), conv.register_forward_pre_hook(lambda *a: None),
               conv.register_full_backward_hook(lambda *a: None)]  # fmt: skip
    convert(m)
    twin = m[0]
    assert type(twin) is nn.Conv2d and twin.weight is conv.weight and twin._parameters is not conv._parameters
    assert len(twin._forward_hooks) == len(twin._forward_pre_hooks) == len(twin._backward_hooks) == 1
    for h in handles:
        h.remove()
    assert len(twin._forward_hooks) == len(twin._forward_pre_hooks) == len(twin._backward_hooks) == 0


class _NotSequential(tnn.Module):
    def __init__(self):
        super().__init__()
        self.bn, self.relu = tnn.BatchNorm2d(4), tnn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(x)) + self.bn(x)  # the batch norm's output is used elsewhere too


def test_fuse_leaves_pairs_outside_a_sequential(all_ops):
    m = _NotSequential()
    assert convert(m, fuse=True).fused == [] and type(m.relu) is nn.ReLU


def test_the_fused_twins_ask_their_op_for_the_relu(all_ops, monkeypatch):
    calls = []

    def fake_call(name, arrays, **kw):
        calls.append((name, kw.get("activation")))
        return arrays["x"]

    monkeypatch.setattr(nn, "_call", fake_call)
    model = tnn.Sequential(tnn.Conv2d(3, 4, 1), tnn.ReLU(), tnn.BatchNorm2d(4), tnn.ReLU(), tnn.Conv2d(4, 4, 1))
    convert(model, fuse=True)
    model(torch.randn(2, 3, 4, 4))
    assert calls == [("convolution", "relu"), ("batch_norm", "relu"), ("convolution", None)]
