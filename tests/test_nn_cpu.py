"""cudnnkit.nn on the CPU: the module imports without torch, every name exists, the argument mapping to the L3 ops
(keywords checked against each declaration's forward signature, through a stand-in for ``cudnnkit.torch.op``),
the helpers (LRN parameters against torch's formula, CTC reductions against torch's own ctc_loss, pooling defaults,
RNN parameter packing), and every unsupported combination raising ``NotImplementedError`` naming the argument
before any GPU work."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys

import numpy as np
import pytest

import cudnnkit.nn as nn
from cudnnkit import autograd

torch = pytest.importorskip("torch")
F = torch.nn.functional
cknn = pytest.importorskip("cudnnkit.torch.nn")

NAMES = """conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d max_pool1d max_pool2d max_pool3d
avg_pool1d avg_pool2d avg_pool3d softmax log_softmax batch_norm layer_norm rms_norm instance_norm local_response_norm
dropout grid_sample affine_grid ctc_loss scaled_dot_product_attention relu sigmoid tanh elu silu hardtanh gelu lstm gru
rnn_tanh rnn_relu""".split()


def test_imports_without_torch_or_cupy():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in ('torch', 'cupy'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import cudnnkit.nn as nn\n"
        "assert callable(nn.conv2d) and 'torch' not in sys.modules and 'cupy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", NAMES)
def test_every_name_exists_with_a_one_line_docstring(name):
    fn = getattr(nn, name)
    assert callable(fn) and name in nn.__all__
    doc = inspect.getdoc(fn)
    assert doc and ("L3" in doc or "not offered" in doc or "graph" in doc), name


def test_signatures_follow_torch():
    for name in ("batch_norm", "layer_norm", "rms_norm", "instance_norm", "local_response_norm", "dropout",
                 "grid_sample", "affine_grid", "ctc_loss", "hardtanh", "elu", "softmax", "log_softmax"):  # fmt: skip
        assert list(inspect.signature(getattr(nn, name)).parameters) == list(
            inspect.signature(getattr(F, name)).parameters), name  # fmt: skip
    assert list(inspect.signature(nn.scaled_dot_product_attention).parameters)[:7] == [
        "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]  # fmt: skip
    assert list(inspect.signature(nn.max_pool2d).parameters) == [
        "input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]  # fmt: skip
    assert list(inspect.signature(nn.conv_transpose2d).parameters) == [
        "input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"]  # fmt: skip


# ----------------------------------------------------------------- the L3 calls, through a stand-in torch op


class Recorder:
    """Stands in for ``cudnnkit.torch.op``: records each call, checks its arguments bind to the declaration's
    forward, zeroes the mutated arrays and returns zeros (one per output)."""

    def __init__(self):
        self.calls = []

    def __call__(self, name):
        d = autograd.get(name)

        def op(*inputs, **kw):
            assert len(inputs) == len(d.inputs), (name, len(inputs))
            inspect.signature(d.forward).bind(*inputs, **kw)  # every keyword is one the L3 forward takes
            self.calls.append((name, inputs, kw))
            for m in d.mutated:  # as TorchOp writes the new statistics into the caller's arrays
                if kw.get(m) is not None:
                    kw[m].zero_()
            outs = tuple(torch.zeros_like(inputs[0]) for _ in d.outputs)
            return outs[0] if len(outs) == 1 else outs

        return op


@pytest.fixture
def rec(monkeypatch):
    import cudnnkit.torch as ckt

    r = Recorder()
    monkeypatch.setattr(ckt, "op", r)
    return r


@pytest.fixture
def no_device(monkeypatch):
    """Any L3 call fails the test: the NotImplementedError must come first."""
    import cudnnkit.torch as ckt

    def op(name):
        raise AssertionError(f"reached the L3 op {name!r}")

    monkeypatch.setattr(ckt, "op", op)


def t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


def test_conv_mapping(rec):
    nn.conv2d(t(2, 4, 8, 8), t(6, 2, 3, 3), t(6), stride=2, padding=1, dilation=(1, 2), groups=2)
    name, (x, w, b), kw = rec.calls[-1]
    assert name == "convolution" and b is not None
    assert kw == dict(stride=(2, 2), padding=(1, 1), dilation=(1, 2), groups=2)
    nn.conv1d(t(4, 8), t(6, 4, 3), padding="same")  # unbatched: a batch of 1 is added
    assert rec.calls[-1][1][0].shape == (1, 4, 8) and rec.calls[-1][2]["padding"] == "same"
    nn.conv_transpose3d(t(1, 4, 3, 3, 3), t(4, 2, 2, 2, 2), stride=2, output_padding=1)
    name, (x, w), kw = rec.calls[-1]
    assert name == "convolution_transpose" and kw["output_padding"] == (1, 1, 1) and kw["stride"] == (2, 2, 2)


def test_pooling_mapping_and_stride_default(rec):
    nn.max_pool2d(t(1, 2, 7, 7), 3)
    assert rec.calls[-1][2] == dict(mode="max", window=(3, 3), stride=(3, 3), padding=(0, 0), ceil_mode=False,
                                    propagate_nan=True)  # fmt: skip
    nn.avg_pool1d(t(2, 9), 2, stride=[], count_include_pad=False, ceil_mode=True)
    assert rec.calls[-1][2] == dict(mode="avg_exclude_padding", window=(2,), stride=(2,), padding=(0,),
                                    ceil_mode=True)  # fmt: skip
    assert rec.calls[-1][1][0].shape == (1, 2, 9)
    nn.avg_pool3d(t(1, 1, 4, 4, 4), (2, 2, 2), stride=1, padding=1)
    assert rec.calls[-1][2]["mode"] == "avg_include_padding" and rec.calls[-1][2]["stride"] == (1, 1, 1)
    assert nn.pooling.pool_args(2, 3, None, 0) == ((3, 3), (3, 3), (0, 0))


def test_normalization_mapping(rec):
    rm, rv = t(3), torch.ones(3)
    nn.batch_norm(t(4, 3, 5), rm, rv, training=True, momentum=0.2, eps=1e-3)
    name, (x, scale, bias, z), kw = rec.calls[-1]
    assert name == "batch_norm" and z is None and torch.equal(scale, torch.ones(3)) and torch.equal(bias, t(3))
    assert kw["running_mean"] is rm and kw["training"] is True and kw["momentum"] == 0.2 and kw["epsilon"] == 1e-3
    # half-precision statistics go through float32 copies, written back
    rmh = torch.full((3,), 0.5, dtype=torch.float16)
    nn.batch_norm(t(4, 3, dtype=torch.float16), rmh, torch.ones(3, dtype=torch.float16), training=True)
    kw = rec.calls[-1][2]
    assert kw["running_mean"].dtype == torch.float32 and kw["running_mean"] is not rmh
    assert torch.equal(rmh, torch.full((3,), 0.0, dtype=torch.float16))  # the (zero) result was written back
    nn.layer_norm(t(2, 3, 4, dtype=torch.bfloat16), (3, 4), weight=t(3, 4, dtype=torch.bfloat16))
    name, (x, scale, bias), kw = rec.calls[-1]
    assert scale.dtype == torch.float32 and bias is None and kw == dict(normalized_shape_ndim=2, epsilon=1e-5)
    nn.rms_norm(t(2, 4, dtype=torch.float16), [4])
    assert rec.calls[-1][2] == dict(normalized_shape_ndim=1, epsilon=torch.finfo(torch.float32).eps)
    # torch's own default for half data: float32's epsilon (its math type's), not finfo(float16).eps
    xs = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 0.02).half()
    own = torch.nn.functional.rms_norm(xs, [64]).float()
    f32 = torch.nn.functional.rms_norm(xs.float(), [64], eps=torch.finfo(torch.float32).eps)
    f16 = torch.nn.functional.rms_norm(xs.float(), [64], eps=torch.finfo(torch.float16).eps)
    assert (own - f32).abs().max() < 1e-2 < (own - f16).abs().max()
    nn.instance_norm(t(2, 3, 4, 4), weight=torch.ones(3), bias=t(3), eps=1e-4)
    assert rec.calls[-1][0] == "instance_norm" and rec.calls[-1][2] == dict(epsilon=1e-4)
    nn.instance_norm(t(2, 3, 4), rm, rv, use_input_stats=False)
    assert rec.calls[-1][0] == "batch_norm" and rec.calls[-1][2]["training"] is False
    nn.local_response_norm(t(1, 6, 3), 3, alpha=2e-4, beta=0.5, k=2.0)
    assert rec.calls[-1][2] == dict(size=3, lrn_alpha=2e-4, lrn_beta=0.5, k=2.0)


def test_activation_softmax_dropout_mapping(rec):
    nn.relu(t(3))
    assert rec.calls[-1][2] == dict(mode="relu", coef=None, propagate_nan=True)
    nn.hardtanh(t(3), 0.0, 2.5)
    assert rec.calls[-1][2] == dict(mode="clipped_relu", coef=2.5, propagate_nan=True)
    nn.silu(t(3))
    assert rec.calls[-1][2]["mode"] == "swish" and rec.calls[-1][2]["coef"] == 1.0
    nn.elu(t(3), alpha=0.5)
    assert rec.calls[-1][2]["coef"] == 0.5
    x = t(2, 3)
    assert nn.relu(x, inplace=True) is x
    nn.log_softmax(t(2, 3), 1, dtype=torch.float64)
    name, (x,), kw = rec.calls[-1]
    assert x.dtype == torch.float64 and kw == dict(axis=1, algo="accurate", log=True)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        nn.softmax(t(2, 3, 4))
    assert rec.calls[-1][2]["axis"] == 0  # torch's implicit choice for 3-d
    n = len(rec.calls)
    x = t(4)
    assert nn.dropout(x, 0.3, training=False) is x and len(rec.calls) == n
    assert torch.equal(nn.dropout(x + 1, 1.0), t(4)) and len(rec.calls) == n
    nn.dropout(t(4), 0.25)
    assert rec.calls[-1][2] == dict(p=0.25, state=None)


def test_vision_and_ctc_mapping(rec):
    nn.affine_grid(t(2, 2, 3), torch.Size([2, 3, 4, 5]), align_corners=True)
    assert rec.calls[-1][2] == dict(size=(2, 3, 4, 5)) and type(rec.calls[-1][2]["size"][0]) is int
    nn.grid_sample(t(2, 3, 4, 5), t(2, 6, 7, 2), align_corners=True)
    assert rec.calls[-1][0] == "grid_sample"
    targets = torch.tensor([[1, 2, 0], [3, 3, 1]])
    nn.ctc_loss(t(6, 2, 5), targets, torch.tensor([6, 5]), (2, 3), reduction="none")
    name, (x,), kw = rec.calls[-1]
    assert kw["labels"].tolist() == [1, 2, 3, 3, 1] and kw["labels"].dtype == torch.int32
    assert kw["label_lengths"].tolist() == [2, 3] and kw["input_lengths"].tolist() == [6, 5]
    assert kw["blank"] == 0 and kw["normalization"] == "softmax" and not kw["labels"].is_cuda


def test_rnn_mapping(rec, monkeypatch):
    m = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)
    cfg = nn.rnn.rnn_config("lstm", m._flat_weights, True, 2, 0.1, True, "float32")
    assert (cfg.input_size, cfg.hidden_size, cfg.proj_size, cfg.num_layers, cfg.bidirectional) == (3, 5, 2, 2, True)
    assert cfg.bias_mode == "double" and cfg.dropout == 0.1
    from cudnnkit.ops import torch_param_names

    assert torch_param_names(cfg) == list(m._flat_weights_names)
    g = torch.nn.GRU(4, 3, bias=False)
    cfg = nn.rnn.rnn_config("gru", g._flat_weights, False, 1, 0.0, False, "float32")
    assert (cfg.cell, cfg.input_size, cfg.hidden_size, cfg.bias_mode) == ("gru", 4, 3, "none")
    # the flat layout is cuDNN's (a device query): a stand-in, then the call's keywords
    r = torch.nn.RNN(2, 3)
    cfg = nn.rnn.rnn_config("tanh", r._flat_weights, True, 1, 0.0, False, "float32")
    fake = [(0, 6, "weight_ih_l0", 0, 3), (8, 9, "weight_hh_l0", 0, 3), (17, 3, "bias_ih_l0", 0, 3),
            (20, 3, "bias_hh_l0", 0, 3)]  # fmt: skip
    monkeypatch.setattr(nn.rnn, "flat_layout", lambda cfg, like: (fake, 24))
    out, h = nn.rnn_tanh(t(4, 1, 2), None, r._flat_weights, True, 1, 0.0, True, False, True)
    name, (x, w, hx, cx), kw = rec.calls[-1]
    assert name == "rnn" and w.shape == (24,) and kw == dict(rnn=cfg, training=True, layout="batch_major")
    assert kw["rnn"] is nn.rnn.rnn_config("tanh", r._flat_weights, True, 1, 0.0, False, "float32")  # one object


def test_pack_params_places_each_piece_and_is_differentiable():
    a = torch.arange(6.0).reshape(2, 3).requires_grad_()
    b = torch.arange(10.0, 14.0).requires_grad_()
    pieces = [(2, 3, "a", 1, 1), (5, 3, "a", 0, 1), (9, 2, "b", 1, 2)]  # rows of a, a slice of b, with gaps
    w = nn.rnn.pack_params(pieces, 12, {"a": a, "b": b}, torch.zeros(1))
    assert w.tolist() == [0, 0, 3, 4, 5, 0, 1, 2, 0, 11, 12, 0]
    (w * torch.arange(12.0)).sum().backward()
    assert a.grad.tolist() == [[5, 6, 7], [2, 3, 4]] and b.grad.tolist() == [0, 9, 10, 0]
    with pytest.raises(ValueError, match="overlap"):
        nn.rnn.pack_params([(0, 3, "a", 0, 1), (2, 3, "a", 1, 1)], 6, {"a": a}, torch.zeros(1))


# ----------------------------------------------------------------- helpers against torch's definitions


def _cudnn_lrn(x, size, alpha, beta, k):
    """cuDNN's documented LRN: window c - (size - 1) // 2 .. c + size // 2, alpha / size."""
    c = x.shape[1]
    sq = x**2
    out = np.empty_like(x)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c, i + size // 2 + 1)
        out[:, i] = x[:, i] / (k + alpha / size * sq[:, lo:hi].sum(axis=1)) ** beta
    return out


@pytest.mark.parametrize("size", [1, 3, 5, 7])
@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 9, 3, 4), (1, 4, 2, 2, 3)])
def test_lrn_parameters_give_torchs_formula_for_odd_sizes(size, shape):
    x = np.random.default_rng(size).standard_normal(shape)
    kw = nn.normalization.lrn_params(size, 3e-2, 0.6, 1.5)
    ours = _cudnn_lrn(x, kw["size"], kw["lrn_alpha"], kw["lrn_beta"], kw["k"])
    ref = F.local_response_norm(torch.from_numpy(x), size, 3e-2, 0.6, 1.5).numpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_lrn_even_size_differs_so_it_is_refused():
    x = np.random.default_rng(0).standard_normal((1, 5, 3))
    ref = F.local_response_norm(torch.from_numpy(x), 2, 0.5, 0.75, 1.0).numpy()
    assert not np.allclose(_cudnn_lrn(x, 2, 0.5, 0.75, 1.0), ref)
    with pytest.raises(NotImplementedError, match="size=2"):
        nn.normalization.lrn_params(2, 1e-4, 0.75, 1.0)


def _torch_ctc_case():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(6, 3, 5, generator=g, dtype=torch.float64).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 4, 4]])
    il, tl = torch.tensor([6, 4, 4]), torch.tensor([3, 2, 3])  # sample 2: 3 repeats need 5 steps, has 4: inf
    return lp, targets, il, tl


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_reduction_matches_torch(reduction, zero_infinity):
    lp, targets, il, tl = _torch_ctc_case()
    costs = F.ctc_loss(lp, targets, il, tl, reduction="none")
    assert torch.isinf(costs[2])
    ours = nn.loss.ctc_reduce(costs, tl.tolist(), reduction, zero_infinity)
    ref = F.ctc_loss(lp, targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)
    assert torch.allclose(ours, ref)  # equal infinities (same sign) compare equal; NaN or a sign flip fails


@pytest.fixture
def torch_ctc(monkeypatch):
    """cudnnkit.torch.op("ctc_loss") stood in for by torch's own CTC on the CPU (what cuDNN's softmax mode computes:
    the log-softmax of its input first); records the calls. Refuses what cuDNN refuses (an empty target, a target
    longer than its input), so the functional form must not send those."""
    import cudnnkit.torch as ckt

    calls = []

    def op(name):
        assert name == "ctc_loss"

        def f(x, *, labels, label_lengths, input_lengths, blank, normalization):
            assert (label_lengths > 0).all() and (label_lengths <= input_lengths).all()
            calls.append((x.shape, label_lengths.tolist(), input_lengths.tolist()))
            return F.ctc_loss(torch.log_softmax(x, -1), labels.long(), input_lengths.long(), label_lengths.long(),
                              reduction="none")  # fmt: skip

        return f

    monkeypatch.setattr(ckt, "op", op)
    return calls


@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_ctc_loss_gives_torchs_values_where_cudnn_refuses_the_sample(torch_ctc, reduction, zero_infinity):
    """An empty target (-log p(all blanks), with its gradient), a target longer than its input (inf, or 0 with
    zero_infinity), an empty input with an empty target (0), beside samples cuDNN runs (gathered): torch's values."""
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(6, 5, 4, generator=g).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0], [1, 2, 3, 1, 2, 3, 1],
                            [2, 2, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])  # fmt: skip
    il, tl = torch.tensor([6, 4, 5, 6, 0]), torch.tensor([2, 0, 7, 3, 0])
    got = nn.ctc_loss(lp, targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)
    assert torch_ctc == [((6, 2, 4), [2, 3], [6, 6])]  # samples 0 and 3 only
    want = F.ctc_loss(lp, targets, il, tl, reduction=reduction, zero_infinity=zero_infinity)
    torch.testing.assert_close(got, want)
    if reduction != "none" and zero_infinity:  # torch's gradient of an infinite cost is NaN without zero_infinity
        (g1,) = torch.autograd.grad(got, lp)
        (g2,) = torch.autograd.grad(want, lp)
        torch.testing.assert_close(g1, g2)


def test_ctc_loss_input_lengths_past_t_are_refused_by_name(torch_ctc):
    with pytest.raises(ValueError, match=r"input_lengths must be in \[0, T=4\]"):
        nn.ctc_loss(t(4, 2, 3), torch.tensor([[1], [1]]), (5, 4), (1, 0))
    assert not torch_ctc


def test_ctc_loss_module_is_the_functional_form(torch_ctc):
    from cudnnkit.torch import nn as tw

    m = tw.CTCLoss(reduction="sum", zero_infinity=True)
    lp = torch.randn(5, 3, 4).log_softmax(-1)
    targets, il, tl = torch.tensor([[1, 2], [3, 0], [1, 1]]), torch.tensor([5, 5, 1]), torch.tensor([2, 0, 2])
    torch.testing.assert_close(m(lp, targets, il, tl), F.ctc_loss(lp, targets, il, tl, reduction="sum",
                                                                 zero_infinity=True))  # fmt: skip
    assert [c[1] for c in torch_ctc] == [[2]]


def test_ctc_reduction_of_a_fake_loss_vector():
    costs = torch.tensor([2.0, float("inf"), 6.0], requires_grad=True)
    mean = nn.loss.ctc_reduce(costs, [2, 4, 0], "mean", True)
    assert mean.item() == pytest.approx((1.0 + 0.0 + 6.0) / 3)  # each / max(length, 1), then the average
    mean.backward()
    assert costs.grad.tolist() == pytest.approx([1 / 6, 0.0, 1 / 3])  # zero_infinity: no gradient through inf
    assert nn.loss.ctc_reduce(costs, [2, 4, 0], "sum", True).item() == 8.0
    assert torch.isinf(nn.loss.ctc_reduce(costs, [2, 4, 0], "sum", False))
    with pytest.raises(ValueError, match="reduction"):
        nn.loss.ctc_reduce(costs, [1, 1, 1], "avg", False)


def test_pack_targets():
    assert nn.loss.pack_targets(torch.tensor([[1, 2, 9], [3, 9, 9]]), [2, 1]).tolist() == [1, 2, 3]
    assert nn.loss.pack_targets(np.array([1, 2, 3, 7]), [2, 1]).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="target_lengths"):
        nn.loss.pack_targets(torch.tensor([[1, 2]]), [3])


def test_ceil_mode_windows_past_the_padding():
    f = nn.pooling.include_pad_factor
    assert f((5,), (2,), (2,), (0,), (3,)) == ((1.0, 1.0, 2.0),)  # the last window starts at 4: cell 5 is past
    assert f((4,), (2,), (2,), (0,), (2,)) is None
    assert f((7, 7), (3, 3), (3, 3), (1, 1), (3, 3)) is None  # ceil adds no window here
    assert f((6, 6), (3, 3), (3, 3), (1, 1), (3, 3)) == ((1.0, 1.0, 1.5),) * 2  # the last covers input, padding, past
    # torch's divisor for such a window is its part within input + padding: not cuDNN's whole window
    x = torch.ones(1, 1, 5)
    assert F.avg_pool1d(x, 2, ceil_mode=True, count_include_pad=True)[0, 0, -1].item() == 1.0


@pytest.mark.parametrize("n, shape, kw", [
    (1, (2, 3, 5), dict(kernel_size=2, ceil_mode=True)),
    (1, (2, 3, 3), dict(kernel_size=4, stride=2, ceil_mode=True)),  # an input shorter than the window: one output
    (2, (2, 3, 8, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (3, (1, 2, 5, 6, 7), dict(kernel_size=(2, 3, 3), stride=(2, 2, 3), padding=(0, 1, 1), ceil_mode=True)),
    (2, (2, 3, 8, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=False))])  # fmt: skip
def test_avg_pool_ceil_mode_with_count_include_pad_as_torchs(monkeypatch, n, shape, kw):
    """A ceil-mode window reaching past the padding: cuDNN's include-padding average divides by the whole window (a
    torch stand-in: divisor_override=prod(window)); times the per-position factor window / clipped it is torch's,
    forward and backward (it was refused)."""
    import cudnnkit.torch as ckt

    def op(name):
        def f(x, *, mode, window, stride, padding, ceil_mode):
            assert mode == "avg_include_padding"
            if x.dim() == 3:  # no divisor_override in avg_pool1d: as 2-d
                y = f(x[..., None], mode=mode, window=(*window, 1), stride=(*stride, 1), padding=(*padding, 0),
                      ceil_mode=ceil_mode)  # fmt: skip
                return y[..., 0]
            pool = getattr(F, f"avg_pool{x.dim() - 2}d")
            return pool(x, window, stride, padding, ceil_mode, True, divisor_override=math.prod(window))

        return f

    monkeypatch.setattr(ckt, "op", op)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    got = getattr(nn, f"avg_pool{n}d")(x, **kw)
    want = getattr(F, f"avg_pool{n}d")(x, **kw)
    torch.testing.assert_close(got, want)
    dy = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, x, dy)[0], torch.autograd.grad(want, x, dy)[0])


def test_softmax_implicit_dim():
    with pytest.warns(UserWarning):
        assert [nn.activation.softmax_dim(n, None, "softmax") for n in (0, 1, 2, 3, 4)] == [0, 0, 1, 0, 1]
    assert nn.activation.softmax_dim(3, -1, "softmax") == -1


def test_a_0d_input_reaches_cudnn_as_1d_and_comes_back_0d(rec):
    """torch's activations and softmax take a scalar tensor; cuDNN's tensors have 1 to 8 dims."""
    for call in (lambda x: nn.relu(x), lambda x: nn.softmax(x, 0), lambda x: nn.log_softmax(x, -1),
                 lambda x: nn.elu(x, 0.5)):  # fmt: skip
        y = call(torch.tensor(2.0))
        assert y.shape == () and rec.calls[-1][1][0].shape == (1,)


@pytest.fixture
def torch_act(monkeypatch):
    """cudnnkit.torch.op("activation") stood in for by torch's relu on the CPU (differentiable)."""
    import cudnnkit.torch as ckt

    def op(name):
        assert name == "activation"
        return lambda x, *, mode, coef, propagate_nan: torch.relu(x)

    monkeypatch.setattr(ckt, "op", op)


def test_inplace_activations_write_into_the_input_as_torchs(torch_act):
    """inplace=True as torch's in-place functions: a non-leaf is written (the gradient flows back through the op), a
    leaf under no_grad too, a leaf that requires grad with grad mode on is refused with torch's error."""
    a = torch.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
    h = a * 1
    y = nn.relu(h, inplace=True)
    assert y is h and torch.equal(h.detach(), torch.tensor([0.0, 2.0, 0.0, 4.0]))
    (h * torch.arange(4.0)).sum().backward()
    assert torch.equal(a.grad, torch.tensor([0.0, 1.0, 0.0, 3.0]))
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        nn.relu(a, inplace=True)
    with torch.no_grad():
        assert nn.relu(a, inplace=True) is a
    assert torch.equal(a.detach(), torch.tensor([0.0, 2.0, 0.0, 4.0]))
    b = torch.tensor([-1.0, 1.0])
    assert nn.relu(b, inplace=True) is b and torch.equal(b, torch.tensor([0.0, 1.0]))


def test_dropout_p0_returns_the_input_itself_whatever_its_dtype(no_device):
    x = torch.zeros(3, dtype=torch.bfloat16)
    assert nn.dropout(x, 0.0) is x and nn.dropout(x, 0.5, training=False) is x


def test_library_detection():
    from cudnnkit.nn._common import library

    assert library(None, torch.zeros(1)) == "torch"
    with pytest.raises(TypeError, match="torch tensors or CuPy arrays"):
        library(np.zeros(1))


# ----------------------------------------------------------------- refused before any GPU work


def _sdpa(dtype=torch.float16, hk=4, **kw):
    q = t(1, 4, 8, 16, dtype=dtype)
    kv = t(1, hk, 8, 16, dtype=dtype)
    return nn.scaled_dot_product_attention(q, kv, kv, **kw)


REFUSED = [
    ("return_indices", lambda: nn.max_pool2d(t(1, 1, 4, 4), 2, return_indices=True)),
    ("dilation", lambda: nn.max_pool1d(t(1, 1, 8), 2, dilation=2)),
    ("0 to 3 spatial dims", lambda: nn.batch_norm(t(2, 3, 1, 1, 1, 2), None, None, training=True)),
    ("input has dtype int64: cuDNN's activation", lambda: nn.relu(t(3, dtype=torch.int64))),
    ("input has dtype int64: cuDNN's pooling", lambda: nn.max_pool2d(t(1, 1, 4, 4, dtype=torch.int64), 2)),
    (
        "padding='same'",
        lambda: nn.conv2d(t(1, 1, 5, 5, dtype=torch.float64), t(1, 1, 2, 2, dtype=torch.float64), padding="same"),
    ),  # fmt: skip
    ("size=4", lambda: nn.local_response_norm(t(1, 4, 3), 4)),
    ("size=17", lambda: nn.local_response_norm(t(1, 4, 3), 17)),
    ("k=", lambda: nn.local_response_norm(t(1, 4, 3), 3, k=0.0)),
    ("beta=", lambda: nn.local_response_norm(t(1, 4, 3), 3, beta=0.001)),
    ("input has dtype bfloat16", lambda: nn.local_response_norm(t(1, 4, 3, dtype=torch.bfloat16), 3)),
    ("mode='nearest'", lambda: nn.grid_sample(t(1, 1, 3, 3), t(1, 2, 2, 2), mode="nearest", align_corners=True)),
    (
        "padding_mode='border'",
        lambda: nn.grid_sample(t(1, 1, 3, 3), t(1, 2, 2, 2), padding_mode="border", align_corners=True),
    ),  # fmt: skip
    ("align_corners=None", lambda: nn.grid_sample(t(1, 1, 3, 3), t(1, 2, 2, 2))),
    ("align_corners=False", lambda: nn.affine_grid(t(1, 2, 3), (1, 1, 3, 3), align_corners=False)),
    ("input of shape", lambda: nn.grid_sample(t(1, 1, 3, 3, 3), t(1, 2, 2, 2, 3), align_corners=True)),
    ("size=", lambda: nn.affine_grid(t(1, 3, 4), (1, 1, 2, 3, 3), align_corners=True)),
    ("H >= 2", lambda: nn.affine_grid(t(1, 2, 3), (1, 1, 1, 3), align_corners=True)),
    (
        "theta has dtype bfloat16",
        lambda: nn.affine_grid(t(1, 2, 3, dtype=torch.bfloat16), (1, 1, 3, 3), align_corners=True),
    ),  # fmt: skip
    ("blank=2", lambda: nn.ctc_loss(t(4, 1, 3), torch.tensor([[1]]), (4,), (1,), blank=2)),
    (
        "log_probs has dtype float64",
        lambda: nn.ctc_loss(t(4, 1, 3, dtype=torch.float64), torch.tensor([[1]]), (4,), (1,)),
    ),  # fmt: skip
    (
        "target_lengths above 255",
        lambda: nn.ctc_loss(t(300, 1, 3), torch.ones(1, 256, dtype=torch.long), (300,), (256,)),
    ),  # fmt: skip
    ("attn_mask", lambda: _sdpa(attn_mask=t(8, 8, dtype=torch.bool))),
    ("dropout_p=1.0", lambda: _sdpa(dropout_p=1.0)),
    ("query has dtype float32", lambda: _sdpa(dtype=torch.float32)),
    ("shape", lambda: nn.scaled_dot_product_attention(*(t(2, 2, 2, 4, 8, dtype=torch.float16),) * 3)),
    ("min_val=-1", lambda: nn.hardtanh(t(3))),
    ("max_val=0", lambda: nn.hardtanh(t(3), 0.0, 0.0)),
    ("gelu", lambda: nn.gelu(t(3))),
    ("gelu_tanh", lambda: nn.gelu(t(3), approximate="tanh")),
    ("leaky_relu", lambda: nn.leaky_relu(t(3))),
    ("softplus", lambda: nn.softplus(t(3))),
    ("input has dtype float64", lambda: nn.layer_norm(t(2, 4, dtype=torch.float64), (4,))),
    ("input has dtype float64", lambda: nn.rms_norm(t(2, 4, dtype=torch.float64), (4,))),
    ("input has dtype float64", lambda: nn.instance_norm(t(2, 3, 4, dtype=torch.float64))),
    ("running_mean", lambda: nn.instance_norm(t(2, 3, 4), t(3), torch.ones(3))),
    ("eps=0", lambda: nn.layer_norm(t(2, 4), (4,), eps=0.0)),
    ("momentum=None", lambda: nn.batch_norm(t(2, 3), t(3), torch.ones(3), training=True, momentum=None)),
    ("eps=0", lambda: nn.batch_norm(t(2, 3), t(3), torch.ones(3), eps=0.0)),
    ("input has dtype bfloat16", lambda: nn.dropout(t(3, dtype=torch.bfloat16), 0.5)),
    (
        "input has dtype bfloat16",
        lambda: nn.grid_sample(
            t(1, 1, 3, 3, dtype=torch.bfloat16), t(1, 2, 2, 2, dtype=torch.bfloat16), align_corners=True
        ),
    ),  # fmt: skip
    (
        "PackedSequence",
        lambda: nn.lstm(torch.nn.utils.rnn.pack_sequence([t(3, 2)]), None, [], True, 1, 0.0, False, False, False),
    ),  # fmt: skip
    (
        "input has dtype bfloat16",
        lambda: nn.gru(t(3, 1, 2, dtype=torch.bfloat16), None, [], True, 1, 0.0, False, False, False),
    ),  # fmt: skip
    (  # torch's packed overload: (data, batch_sizes, hx, params, ...), as many positional arguments
        "packed form",
        lambda: nn.lstm(t(3, 2), torch.tensor([2, 1]), (t(1, 2, 4), t(1, 2, 4)), [], True, 1, 0.0, False, False),
    ),  # fmt: skip
    ("packed form", lambda: nn.gru(t(3, 2), torch.tensor([2, 1]), t(1, 2, 4), [], True, 1, 0.0, False, False)),
]


@pytest.mark.parametrize("what, fn", REFUSED, ids=[f"{i}-{w}" for i, (w, _) in enumerate(REFUSED)])
def test_refused_with_not_implemented_naming_the_argument(no_device, what, fn):
    with pytest.raises(NotImplementedError) as e:
        fn()
    assert what in str(e.value)


@pytest.mark.parametrize("kw", [dict(divisor_override=3), dict(divisor_override=-2, count_include_pad=False),
                                dict(divisor_override=7, ceil_mode=True, padding=1, stride=2)])  # fmt: skip
def test_avg_pool_divisor_override_as_torchs(monkeypatch, kw):
    """divisor_override: cuDNN's include-padding average (the whole window's sum over its size, padding and ceil
    cells as zeros: a torch stand-in) times prod(window) / divisor, whatever count_include_pad: torch's."""
    import cudnnkit.torch as ckt

    def op(name):
        def f(x, *, mode, window, stride, padding, ceil_mode):
            assert mode == "avg_include_padding"
            return F.avg_pool2d(x, window, stride, padding, ceil_mode, True, divisor_override=math.prod(window))

        return f

    monkeypatch.setattr(ckt, "op", op)
    x = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(nn.avg_pool2d(x, 3, **kw), F.avg_pool2d(x, 3, **kw))
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        nn.avg_pool2d(x, 3, divisor_override=0)


def test_the_implicit_softmax_dim_warning_points_at_the_caller(rec):
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax") as got:
        nn.softmax(t(2, 3))
    assert got[0].filename == __file__


def test_the_norms_of_an_empty_batch_are_torchs(no_device):
    """A zero batch: an empty result on the autograd chain (zero parameter gradients), the running statistics
    untouched, no op called (cuDNN's norms take no empty array)."""
    x = torch.zeros(0, 3, 4, requires_grad=True)
    w, b = torch.ones(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    rm, rv = torch.zeros(3), torch.ones(3)
    y = nn.batch_norm(x, rm, rv, w, b, training=True)
    assert y.shape == (0, 3, 4) and torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(3)) and x.grad.shape == x.shape
    assert nn.layer_norm(x, (4,)).shape == (0, 3, 4) and nn.rms_norm(x, [3, 4]).shape == (0, 3, 4)
    assert nn.instance_norm(x, weight=w, bias=b).shape == (0, 3, 4)


def test_a_norm_over_every_dim_gets_a_leading_one(rec):
    y = nn.layer_norm(t(3, 4), (3, 4))
    assert y.shape == (3, 4) and rec.calls[-1][1][0].shape == (1, 3, 4)
    assert nn.rms_norm(t(4), 4).shape == (4,) and rec.calls[-1][1][0].shape == (1, 4)


def test_sdpa_one_key_value_head_broadcasts_without_enable_gqa(rec):
    """torch broadcasts a key/value head count of 1 over the query's heads without enable_gqa: the plain sdpa op
    (which takes one shared head) runs it."""
    _sdpa(hk=1)
    assert rec.calls[-1][0] == "sdpa" and rec.calls[-1][1][1].shape[1] == 1


def test_conv_transpose_bias_is_checked_as_torchs(no_device):
    """The bias is added after the op by a broadcast: a wrong size (which would broadcast) or dtype (which would
    promote the output) is refused before any op, as torch refuses it."""
    with pytest.raises(RuntimeError, match=r"bias must have shape \(6,\) \(out_channels\), got \(1,\)"):
        nn.conv_transpose2d(t(1, 4, 3, 3), t(4, 3, 2, 2), t(1), groups=2)
    with pytest.raises(TypeError, match="bias has dtype torch.float32 but input has dtype torch.float16"):
        nn.conv_transpose2d(t(1, 4, 3, 3, dtype=torch.float16), t(4, 3, 2, 2, dtype=torch.float16), t(6), groups=2)


def test_conv_transpose_without_its_l3_op(no_device, monkeypatch):
    monkeypatch.setattr(nn.conv, "has_l3", lambda name: False)
    with pytest.raises(NotImplementedError, match="convolution_transpose"):
        nn.conv_transpose2d(t(1, 2, 3, 3), t(2, 1, 2, 2))


@pytest.mark.parametrize(
    "msg, fn",
    [
        (r"padding='same' is not supported for strided convolutions",
         lambda: nn.conv2d(t(1, 1, 4, 4), t(1, 1, 3, 3), padding="same", stride=2)),
        (r"conv2d: input must be 3-d \(unbatched\) or 4-d", lambda: nn.conv2d(t(1, 1, 4, 4, 4, 4), t(1, 1, 3, 3))),
        (r"conv_transpose2d: padding must be an int or 2 ints",
         lambda: nn.conv_transpose2d(t(1, 1, 4, 4), t(1, 1, 3, 3), padding="same")),
        (r"batch_norm: training=False needs running_mean and running_var",
         lambda: nn.batch_norm(t(2, 3), None, None, training=False)),
        (r"batch_norm: expected more than 1 value per channel when training, got input size \(1, 3, 1\)",
         lambda: nn.batch_norm(t(1, 3, 1), None, None, training=True)),
        (r"layer_norm: normalized_shape \(3,\) must be the trailing dims", lambda: nn.layer_norm(t(2, 4), (3,))),
        (r"dropout probability has to be between 0 and 1, but got 1.5", lambda: nn.dropout(t(3), 1.5)),
        (r"ctc_loss: reduction must be .*got 'avg'",
         lambda: nn.ctc_loss(t(4, 1, 3), torch.tensor([[1]]), (4,), (1,), reduction="avg")),
        (r"scaled_dot_product_attention: query has 4 heads, key 2.*enable_gqa=True",
         lambda: nn.scaled_dot_product_attention(
             t(1, 4, 8, 16, dtype=torch.float16), *(t(1, 2, 8, 16, dtype=torch.float16),) * 2
         )),
        (r"params: 3 tensors do not make 1 layer\(s\) x 1 direction\(s\) of lstm parameters",
         lambda: nn.lstm(t(3, 1, 2), None, [t(4, 2)] * 3, True, 1, 0.0, False, False, False)),
    ],
)  # fmt: skip
def test_bad_arguments_raise_value_errors_first(no_device, msg, fn):
    with pytest.raises(ValueError, match=msg):  # the argument's own message, not any ValueError (a cuDNN status is one)
        fn()


def test_a_one_dimensional_attention_mask_is_a_row_of_keys():
    """torch broadcasts a mask of shape (S_kv,) over the query rows: it is expanded, not refused, when S_q != S_kv
    (it compared S_kv with S_q and raised)."""
    from cudnnkit.nn.attention import _expand_rows

    got = _expand_rows(torch.zeros(5), (3, 5))
    assert tuple(got.shape) == (3, 5)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4,\) does not broadcast"):
        _expand_rows(torch.zeros(4), (3, 5))


@pytest.mark.parametrize("call", [
    lambda x: nn.max_pool2d(x, 3, 1, 2),
    lambda x: nn.avg_pool2d(x, (3, 4), 1, (1, 3)),
    lambda x: nn.max_pool1d(x[0], 2, 1, 2),
    lambda x: nn.avg_pool3d(x[None], 3, 1, (0, 0, 2)),
    lambda x: cknn.MaxPool2d(3, 1, 2)(x),
    lambda x: cknn.AvgPool1d(4, padding=3)(x[0]),
])  # fmt: skip
def test_pooling_padding_above_half_the_window_raises_torchs_error(no_device, call):
    """torch refuses padding above half the window (cuDNN takes it: windows of padding only); the same error,
    before any GPU work"""
    x = torch.zeros(1, 2, 8, 8)
    with pytest.raises(RuntimeError, match="pad should be at most half of effective kernel size"):
        call(x)


def test_pooling_padding_of_half_the_window_is_accepted_by_the_check():
    from cudnnkit.nn.pooling import check_half_window

    check_half_window((3, 2, 5), (1, 1, 2))  # torch takes these
    with pytest.raises(RuntimeError, match="pad=2, kernel_size=3"):
        check_half_window((3, 3), (1, 2))


def test_functional_rnn_dropout_is_seeded_from_torch():
    """torch's _VF RNNs draw their dropout from torch's RNG; the functional forms seed cuDNN's with
    torch.initial_seed() (as the modules do), so torch.manual_seed reproduces a run and changes the masks."""
    from cudnnkit.nn import _common
    from cudnnkit.nn import rnn as R

    x = torch.zeros(2, 1, 3)
    torch.manual_seed(123)
    assert _common.process_seed(x) == 123
    torch.manual_seed(7)
    params = [torch.zeros(20, 3), torch.zeros(20, 5)] * 2
    cfg = R.rnn_config("lstm", params, False, 2, 0.5, False, "float32", _common.process_seed(x))
    assert cfg.dropout_seed == 7


_COLD_COMPILE = """
import math, sys, warnings, torch
import torch.nn.functional as F
def pool(x, *, mode, window, stride, padding, ceil_mode=False):  # cuDNN's include-padding: the whole window
    assert mode == "avg_include_padding"
    return F.avg_pool2d(x, window, stride, padding, ceil_mode, True, math.prod(window))

kw = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
x = torch.randn(2, 3, 8, 6)
import cudnnkit.torch as ckt

ckt.op = lambda name: pool  # the twin calls the functional form, which calls cudnnkit.torch.op
if sys.argv[1] == "twin":
    import cudnnkit.torch.nn as nn

    nn.available = lambda name: True
    f = nn.AvgPool2d(**kw)
else:
    import cudnnkit.nn as cnn

    f = lambda x: cnn.avg_pool2d(x, **kw)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    y = torch.compile(f, fullgraph=True, backend="eager")(x)
torch.testing.assert_close(y, F.avg_pool2d(x, **kw))
"""


@pytest.mark.parametrize("form", ["twin", "functional"])
def test_avg_pool_ceil_include_pad_compiles_cold(form):
    """A process whose first cudnnkit call is compiled (fullgraph): the factor's arrays are made without loading an
    adapter in the traced frame (adapters.library_of; Dynamo does not trace importlib), for the twin and the
    functional form alike (the op stood in by torch's whole-window average)."""
    r = subprocess.run([sys.executable, "-c", _COLD_COMPILE, form], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_avg_pool_half_ceil_include_pad_rounds_once(monkeypatch):
    """float16 with the window/clipped factor: the factor applied in float32 to cuDNN's average, rounded once, as
    torch's float32-accumulated result (a factor in float16 was up to 1.4 eps off)."""
    import cudnnkit.torch as ckt
    from cudnnkit.runtime.shapes import pool_padding

    def pool(x, *, mode, window, stride, padding, ceil_mode):  # cuDNN: float accumulation, one rounding
        assert mode == "avg_include_padding"
        pre, post = pool_padding(tuple(x.shape[2:]), window, stride=stride, padding=padding, ceil_mode=ceil_mode)
        xp = F.pad(x.double(), [v for a, b in reversed(list(zip(pre, post))) for v in (a, b)])
        return getattr(F, f"avg_pool{x.dim() - 2}d")(xp, window, stride).to(x.dtype)

    monkeypatch.setattr(ckt, "op", lambda name: pool)
    x = torch.randn(4000, 1, 9, 9, generator=torch.Generator().manual_seed(0)).half()
    kw = dict(kernel_size=5, stride=3, ceil_mode=True, count_include_pad=True)  # last window 3 of 5: factor 5/3
    torch.testing.assert_close(nn.avg_pool2d(x, **kw), F.avg_pool2d(x.float(), **kw).half())
