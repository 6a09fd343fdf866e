"""``cudnnkit.torch.convert(model, fuse=True)`` on the GPU: a CNN whose Conv/BatchNorm -> ReLU pairs run as one
fused cuDNN call each gives torch's outputs, input and parameter gradients and running statistics (float32 without
TF32, channels-first and channels-last, train and eval mode), and trains like it for a few SGD steps."""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import cudnnkit  # noqa: E402
import cudnnkit.torch  # noqa: E402

from .test_torch_modules_gpu import _same_in_train_and_eval  # noqa: E402


def _cnn():
    """torchvision's convention: a convolution followed by batch norm has no bias (in training mode its gradient is
    zero in exact arithmetic, float32 rounding noise on both sides, so no relative comparison can hold); the fused
    convolution + ReLU (4, 5) has one."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8),
        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )  # fmt: skip


@pytest.fixture
def fp32(monkeypatch):
    """float32 without TF32 on both sides, cudnnkit's settings process-wide (as test_torch_modules_gpu's fixture:
    the backward runs on autograd's device thread)."""
    import sys
    import types

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    mod = sys.modules["cudnnkit.runtime.settings"]
    monkeypatch.setattr(mod, "_stack", types.SimpleNamespace(current=mod.current_settings()))


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_fused_cnn_matches_torch_forward_backward_and_statistics(fp32, channels_last):
    torch.manual_seed(0)
    ref = _cnn().cuda()
    report = cudnnkit.torch.convert(copy.deepcopy(ref), fuse=True)
    ours = report.model
    assert report.fused == [("1", "2"), ("4", "5"), ("7", "8")], str(report)
    x = torch.randn(8, 3, 12, 12, device="cuda")
    if channels_last:
        ref, ours = ref.to(memory_format=torch.channels_last), ours.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    _same_in_train_and_eval(ref, ours, x)  # outputs, input and parameter gradients, buffers; train and eval


def test_a_fused_cnn_trains_like_torch(fp32):
    torch.manual_seed(1)
    ref = _cnn().cuda().to(memory_format=torch.channels_last)
    ours = cudnnkit.torch.convert(copy.deepcopy(ref), fuse=True).model
    x = torch.randn(32, 3, 12, 12, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 5, (32,), device="cuda")
    losses = {}
    for name, m in (("ours", ours), ("torch", ref)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        got = []
        for _ in range(20):  # torch on the CPU, seeds 0-7: the last loss is 0.45-0.68 of the first
            opt.zero_grad()
            with cudnnkit.settings(allow_tf32=False):
                loss = torch.nn.functional.cross_entropy(m(x), y)
                loss.backward()
            opt.step()
            got.append(loss.item())
        losses[name] = got
    for a, b in zip(losses["ours"], losses["torch"]):
        assert abs(a - b) <= 1e-3 * abs(b), losses
    assert losses["ours"][-1] < 0.8 * losses["ours"][0], losses


@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True)])
@pytest.mark.parametrize("train", [False, True])
def test_the_fused_relu_propagates_nan_as_torch(fp32, train, dtype, channels_last):
    """torch's ReLU returns NaN for NaN; the fused convolution + ReLU and batch norm + ReLU must too (cuDNN's ReLU
    returns 0 for NaN unless asked to propagate it: the twins pass ``propagate_nan=True``): the NaN pattern of the
    output is torch's. float32 channels-first runs the legacy calls (the activation descriptor's
    ``CUDNN_PROPAGATE_NAN``), bfloat16 channels-last the fused graphs (``RELU_FWD`` with
    ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION``)."""
    torch.manual_seed(2)
    nn = torch.nn
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    ref = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8),
                        nn.ReLU()).cuda().to(dtype, memory_format=fmt).train(train)  # fmt: skip
    report = cudnnkit.torch.convert(copy.deepcopy(ref), fuse=True)
    assert report.fused == [("0", "1"), ("3", "4")], str(report)
    x = torch.randn(2, 8, 8, 8, device="cuda").to(dtype, memory_format=fmt)
    x[0, 1, 4, 4] = float("nan")
    with torch.no_grad():
        want, got = ref(x), report.model(x)
    assert want.isnan().any() and (train or not want[1].isnan().any())  # eval: sample 1 stays finite
    assert torch.equal(got.isnan(), want.isnan())
    finite = ~want.isnan()
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert torch.allclose(got[finite].float(), want[finite].float(), **tol)
