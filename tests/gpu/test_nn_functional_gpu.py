"""``cudnnkit.nn`` on the GPU: every function against the ``torch.nn.functional`` function of the same name (the
recurrent forms against torch's ``_VF`` ones, ``torch.lstm`` ...) on the same CUDA tensors, float32 with TF32 off on
both sides, forward and backward (the input and weight gradients); the CuPy path (CuPy arrays in and out, forward);
the documented ``NotImplementedError`` combinations raised before any GPU work; scaled dot-product attention in
bfloat16 against torch's, causal and not, forward and backward.

TF32: ``torch.backends.cudnn.allow_tf32 = False`` for torch and ``cudnnkit.settings(allow_tf32=False)`` around our
calls. cudnnkit's settings are per thread, and autograd runs the backward of CUDA tensors on its device thread,
which starts from the defaults: the ``no_tf32`` fixture also makes ``allow_tf32=False`` every thread's default for
the test (a fresh per-thread stack), so our backward runs without TF32 too.
"""

from __future__ import annotations

import gc
import importlib
import threading

import pytest

import cudnnkit
import cudnnkit.nn as nn

# the module (cudnnkit.runtime.settings, the name, is the settings() function re-exported)
settings_mod = importlib.import_module("cudnnkit.runtime.settings")

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL, GTOL = 1e-4, 1e-3  # float32, forward and gradients (relative, in norm)
BF16_TOL = 2e-2


class _NoTF32Stack(threading.local):
    def __init__(self) -> None:
        self.current = settings_mod.Settings(allow_tf32=False)


@pytest.fixture(autouse=True)
def no_tf32(monkeypatch):
    monkeypatch.setattr(settings_mod, "_stack", _NoTF32Stack())
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def r(*shape, scale=1.0):
    return torch.randn(shape, device="cuda") * scale


def u(lo, hi, *shape):
    return torch.rand(shape, device="cuda") * (hi - lo) + lo


def cl(t):
    return t.contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)


class Const:
    """A tensor argument that is not differentiated (each side gets its own copy)."""

    def __init__(self, t):
        self.t = t


def _copy(a, grad):
    if isinstance(a, Const):
        return a.t.clone()
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(grad and a.is_floating_point())
    return a


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    n = b.norm()
    return float((a - b).norm() / (n if n > 0 else 1.0))


def _tuple(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def check(ours, ref, *args, grad=True, tol=TOL, gtol=GTOL, seed=0):
    """``ours(*args)`` (under ``allow_tf32=False``) against ``ref(*args)``, each on its own copies of ``args``:
    every output (shape, dtype, device, values), then the gradients of ``sum(out * c)`` (random ``c`` per
    floating output) for every floating tensor argument that is not a :class:`Const`. Returns both copies."""
    a_ours, a_ref = [_copy(a, grad) for a in args], [_copy(a, grad) for a in args]
    with cudnnkit.settings(allow_tf32=False):
        got = _tuple(ours(*a_ours))
    want = _tuple(ref(*a_ref))
    assert len(got) == len(want)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    loss_o = loss_r = None
    for j, (g, w) in enumerate(zip(got, want)):
        assert g.is_cuda and tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype, (j, g.shape, w.shape, g.dtype)
        assert rel(g, w) < tol, f"output {j}: rel {rel(g, w):.2e}"
        if grad and w.requires_grad:
            c = torch.randn(w.shape, generator=gen, device="cuda", dtype=w.dtype)
            loss_o = (g * c).sum() if loss_o is None else loss_o + (g * c).sum()
            loss_r = (w * c).sum() if loss_r is None else loss_r + (w * c).sum()
    if loss_o is not None:
        lo = [a for a in a_ours if isinstance(a, torch.Tensor) and a.requires_grad]
        lr = [a for a in a_ref if isinstance(a, torch.Tensor) and a.requires_grad]
        with cudnnkit.settings(allow_tf32=False):
            go = torch.autograd.grad(loss_o, lo, allow_unused=True)
        gr = torch.autograd.grad(loss_r, lr, allow_unused=True)
        checked = 0
        for k, (x, y) in enumerate(zip(go, gr)):
            if y is None:
                continue
            assert x is not None, f"no gradient for tensor argument {k}"
            assert x.shape == y.shape, (k, x.shape, y.shape)
            assert rel(x, y) < gtol, f"gradient of tensor argument {k}: rel {rel(x, y):.2e}"
            checked += 1
        assert checked, "the reference has no gradient for any tensor argument: nothing was compared"
    return a_ours, a_ref


# ----------------------------------------------------------------- the same call on both sides


def _theta(n):
    eye = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], device="cuda")
    return eye + 0.2 * r(n, 2, 3)


#: (name, args maker, keywords): nn.<name>(*args, **kw) against F.<name>(*args, **kw)
SAME = [
    ("conv1d", lambda: (r(2, 3, 17), r(4, 3, 3), r(4)), dict(stride=2, padding=1)),
    ("conv1d", lambda: (r(2, 4, 16), r(6, 2, 3), None), dict(padding="same", dilation=2, groups=2)),
    ("conv1d", lambda: (r(3, 17), r(4, 3, 5)), {}),  # unbatched
    ("conv2d", lambda: (r(2, 4, 9, 9), r(6, 2, 3, 3), r(6)), dict(stride=2, padding=1, groups=2)),
    ("conv2d", lambda: (r(2, 3, 8, 8), r(5, 3, 4, 4), r(5)), dict(padding="same")),  # even kernel: one more after
    ("conv2d", lambda: (r(2, 3, 10, 10), r(4, 3, 3, 3)), dict(dilation=2, padding=(1, 2))),
    ("conv2d", lambda: (cl(r(2, 8, 9, 9)), cl(r(8, 8, 3, 3)), r(8)), dict(padding=1)),  # channels-last
    ("conv3d", lambda: (r(1, 2, 5, 6, 6), r(3, 2, 3, 3, 3), r(3)), dict(padding=1, stride=(1, 2, 2))),
    ("conv_transpose1d", lambda: (r(2, 4, 9), r(4, 3, 3), r(3)), dict(stride=2, padding=1, output_padding=1)),
    (
        "conv_transpose2d",
        lambda: (r(2, 4, 5, 5), r(4, 3, 3, 3), r(6)),
        dict(stride=2, padding=1, output_padding=1, groups=2),
    ),
    ("conv_transpose2d", lambda: (r(1, 3, 6, 6), r(3, 2, 4, 4)), dict(stride=2, padding=1)),
    ("conv_transpose3d", lambda: (r(1, 2, 3, 4, 4), r(2, 3, 3, 3, 3), r(3)), dict(stride=2, padding=1)),
    ("max_pool1d", lambda: (r(2, 3, 16),), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool1d", lambda: (r(3, 16),), dict(kernel_size=2)),  # unbatched
    ("max_pool2d", lambda: (r(2, 3, 10, 10),), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool2d", lambda: (r(2, 3, 9, 9),), dict(kernel_size=(2, 3), stride=(2, 1))),
    ("max_pool2d", lambda: (cl(r(2, 8, 8, 8)),), dict(kernel_size=2)),
    ("max_pool3d", lambda: (r(1, 2, 6, 6, 6),), dict(kernel_size=2)),
    ("max_pool3d", lambda: (r(1, 2, 7, 7, 7),), dict(kernel_size=3, stride=2, padding=1)),
    ("avg_pool1d", lambda: (r(2, 3, 16),), dict(kernel_size=3, stride=2, padding=1)),
    (
        "avg_pool1d",
        lambda: (r(2, 3, 15),),
        dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
    ),
    ("avg_pool2d", lambda: (r(2, 3, 10, 10),), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("avg_pool2d", lambda: (r(2, 3, 8, 8),), dict(kernel_size=2)),
    ("avg_pool2d", lambda: (r(2, 3, 10, 10),), dict(kernel_size=3, stride=2, ceil_mode=True, count_include_pad=False)),
    # divisor_override: the include-padding average times prod(window) / divisor
    ("avg_pool2d", lambda: (r(2, 3, 10, 10),), dict(kernel_size=3, stride=2, padding=1, divisor_override=5)),
    ("avg_pool3d", lambda: (r(1, 2, 7, 7, 7),), dict(kernel_size=3, stride=2, ceil_mode=True, divisor_override=7)),
    # ceil-mode windows past the padding with count_include_pad: torch's clipped divisor (a factor on cuDNN's)
    ("avg_pool2d", lambda: (r(2, 3, 8, 6),), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("avg_pool1d", lambda: (r(2, 3, 5),), dict(kernel_size=2, ceil_mode=True)),
    ("avg_pool1d", lambda: (r(2, 3, 3),), dict(kernel_size=4, stride=2, ceil_mode=True)),  # input < window: 1 output
    ("max_pool1d", lambda: (r(2, 3, 3),), dict(kernel_size=4, stride=2, ceil_mode=True)),
    (
        "avg_pool3d",
        lambda: (r(1, 2, 5, 6, 7),),
        dict(kernel_size=(2, 3, 3), stride=(2, 2, 3), padding=1, ceil_mode=True),
    ),
    ("avg_pool3d", lambda: (r(1, 2, 6, 6, 6),), dict(kernel_size=2, stride=2)),
    ("avg_pool3d", lambda: (r(1, 2, 7, 7, 7),), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("softmax", lambda: (r(4, 10, scale=3),), dict(dim=-1)),
    ("softmax", lambda: (r(2, 5, 3, 4),), dict(dim=1)),
    ("softmax", lambda: (r(3, 4, 5),), dict(dim=0)),
    ("log_softmax", lambda: (r(4, 10, scale=3),), dict(dim=-1)),
    ("log_softmax", lambda: (r(2, 5, 3, 4),), dict(dim=1)),
    ("relu", lambda: (r(3, 50),), {}),
    ("relu6", lambda: (r(3, 50, scale=5),), {}),
    ("sigmoid", lambda: (r(3, 50, scale=3),), {}),
    ("tanh", lambda: (r(3, 50, scale=2),), {}),
    ("elu", lambda: (r(3, 50),), dict(alpha=0.7)),
    ("elu", lambda: (r(2, 3, 4, 5),), {}),
    ("silu", lambda: (r(3, 50, scale=3),), {}),
    ("hardtanh", lambda: (r(3, 50, scale=2),), dict(min_val=0.0, max_val=1.5)),
    ("layer_norm", lambda: (r(4, 5, 8), (8,), r(8), r(8)), {}),
    ("layer_norm", lambda: (r(3, 4, 6), (4, 6)), dict(eps=1e-3)),
    ("layer_norm", lambda: (r(6, 16, scale=2), (16,), r(16)), {}),
    ("rms_norm", lambda: (r(4, 5, 8), (8,), r(8)), {}),
    ("rms_norm", lambda: (r(3, 4, 6), (4, 6)), dict(eps=1e-5)),
    ("instance_norm", lambda: (r(4, 6, 5, 5), None, None, r(6), r(6)), {}),
    ("instance_norm", lambda: (r(2, 3, 16),), {}),
    ("instance_norm", lambda: (r(2, 3, 4, 4, 4), None, None, r(3), r(3)), dict(eps=1e-3)),
    ("instance_norm", lambda: (r(4, 6, 5, 5), Const(r(6)), Const(u(0.5, 2, 6)), r(6), r(6), False), {}),  # running
    ("local_response_norm", lambda: (r(2, 7, 5, 5), 5), dict(alpha=1e-2, beta=0.75, k=2.0)),
    ("local_response_norm", lambda: (r(2, 6, 9), 3), dict(alpha=0.5, beta=0.6)),
    ("local_response_norm", lambda: (r(1, 5, 3, 4, 4), 3), dict(alpha=0.3)),
    ("grid_sample", lambda: (r(2, 3, 5, 4), u(-1.3, 1.3, 2, 3, 6, 2)), dict(align_corners=True)),  # some outside
    ("grid_sample", lambda: (r(1, 2, 6, 6), u(-0.9, 0.9, 1, 4, 4, 2)), dict(align_corners=True)),
    ("affine_grid", lambda: (_theta(2), (2, 3, 8, 10)), dict(align_corners=True)),
    ("affine_grid", lambda: (_theta(1), (1, 1, 5, 3)), dict(align_corners=True)),
]


@pytest.mark.parametrize("name, make, kw", SAME, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(SAME)])
def test_matches_torch_functional(name, make, kw):
    torch.manual_seed(sum(map(ord, name)))
    ours, ref = getattr(nn, name), getattr(F, name)
    check(lambda *a: ours(*a, **kw), lambda *a: ref(*a, **kw), *make())


@pytest.mark.parametrize("name", ["relu", "relu6", "elu", "silu", "hardtanh"])
def test_inplace_gives_torchs_values_in_the_input(name):
    x = r(4, 30, scale=4)
    kw = dict(min_val=0.0, max_val=2.0) if name == "hardtanh" else {}
    want = getattr(F, name)(x.clone(), **kw)
    y = x.clone()
    got = getattr(nn, name)(y, inplace=True, **kw)
    assert got is y and rel(y, want) < TOL


def test_relu_propagates_nan_as_torch():
    x = torch.tensor([-1.0, float("nan"), 2.0], device="cuda")
    assert torch.equal(nn.relu(x).isnan(), F.relu(x).isnan())


# ----------------------------------------------------------------- batch norm (running statistics updated)


@pytest.mark.parametrize(
    "shape, training, affine, momentum, channels_last",
    [
        ((8, 6, 5, 5), True, True, 0.1, False),
        ((16, 6), True, True, 0.3, False),
        ((4, 6, 10), True, False, 0.1, False),
        ((2, 4, 3, 4, 4), True, True, 0.1, False),
        ((8, 6, 5, 5), True, True, 0.1, True),
        ((8, 6, 5, 5), False, True, 0.1, False),
        ((16, 6), False, False, 0.1, False),
    ],
)
def test_batch_norm(shape, training, affine, momentum, channels_last):
    torch.manual_seed(1)
    c = shape[1]
    x = r(*shape, scale=2) + 0.5
    x = cl(x) if channels_last else x
    rm, rv = Const(r(c) * 0.1), Const(u(0.5, 1.5, c))
    w, b = (r(c), r(c)) if affine else (None, None)

    def call(fn):
        return lambda x, rm, rv, w, b: fn(x, rm, rv, w, b, training=training, momentum=momentum, eps=1e-5)

    a_ours, a_ref = check(call(nn.batch_norm), call(F.batch_norm), x, rm, rv, w, b)
    for i in (1, 2):  # the running statistics, updated in place (training) or left as they were
        assert rel(a_ours[i], a_ref[i]) < TOL, f"running statistic {i}"


# ----------------------------------------------------------------- recurrent: torch's _VF forms


@pytest.mark.parametrize(
    "cell, layers, bidirectional, batch_first, bias, proj, hx",
    [
        ("lstm", 2, False, False, True, 0, True),
        ("lstm", 1, True, True, True, 0, False),
        ("lstm", 2, True, False, True, 3, True),  # projections (weight_hr)
        ("gru", 2, True, False, True, 0, True),
        ("gru", 1, False, True, False, 0, False),
        ("rnn_tanh", 2, False, False, True, 0, True),
        ("rnn_relu", 1, True, True, True, 0, True),
    ],
)
def test_recurrent_matches_torch_vf(cell, layers, bidirectional, batch_first, bias, proj, hx):
    torch.manual_seed(2)
    t, n, i, h = 7, 3, 5, 6
    mod = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell)
    kw = dict(num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional)
    if mod is None:
        m = torch.nn.RNN(i, h, nonlinearity=cell.removeprefix("rnn_"), **kw)
    else:
        m = mod(i, h, proj_size=proj, **kw) if proj else mod(i, h, **kw)
    params = [p.detach().to("cuda") for p in m._flat_weights]
    d = 2 if bidirectional else 1
    x = r(n, t, i) if batch_first else r(t, n, i)
    h0 = r(layers * d, n, proj or h, scale=0.5)
    c0 = r(layers * d, n, h, scale=0.5)
    if not hx:  # ours: None; torch: zeros (its _VF forms take no None)
        h0, c0 = Const(torch.zeros_like(h0)), Const(torch.zeros_like(c0))
    args = (bias, layers, 0.0, True, bidirectional, batch_first)
    ours, ref = getattr(nn, cell), getattr(torch, cell)

    def pack(h0, c0):
        return (h0, c0) if cell == "lstm" else h0

    check(lambda x, h0, c0, *ps: ours(x, pack(h0, c0) if hx else None, list(ps), *args),
          lambda x, h0, c0, *ps: ref(x, pack(h0, c0), list(ps), *args), x, h0, c0, *params)  # fmt: skip


# ----------------------------------------------------------------- CTC loss


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss(reduction, concatenated):
    torch.manual_seed(3)
    t, n, c = 24, 3, 7
    log_probs = r(t, n, c, scale=2).log_softmax(2)
    il, tl = (24, 20, 16), (6, 3, 5)
    targets = torch.randint(1, c, (n, max(tl)), device="cuda")
    if concatenated:
        targets = torch.cat([targets[k, :m] for k, m in enumerate(tl)])

    def call(fn, zero_infinity=False):
        return lambda lp: fn(lp, targets, il, tl, blank=0, reduction=reduction, zero_infinity=zero_infinity)

    check(call(nn.ctc_loss), call(F.ctc_loss), log_probs)
    check(call(nn.ctc_loss, True), call(F.ctc_loss, True), log_probs)


def test_ctc_loss_cupy_empty_and_infeasible_targets():
    """CuPy log-probabilities with an empty target (cost -log p(all blanks), cuDNN's log_softmax), one of input
    length 0 (cost 0), one longer than its input (inf) and a plain one: torch's costs on the same values."""
    cp = pytest.importorskip("cupy")
    torch.manual_seed(4)
    t, c = 12, 6
    lp = r(t, 4, c, scale=2).log_softmax(2)
    il, tl = [12, 0, 3, 10], [0, 0, 5, 4]
    targets = torch.randint(1, c, (4, 5), device="cuda")
    got = nn.ctc_loss(cp.from_dlpack(lp.contiguous()), targets.cpu().numpy(), il, tl, reduction="none")
    assert isinstance(got, cp.ndarray)
    want = F.ctc_loss(lp.double(), targets, il, tl, reduction="none")
    assert torch.equal(torch.isinf(torch.from_dlpack(got)).cpu(), torch.isinf(want).cpu())
    fin = ~torch.isinf(want)
    assert rel(torch.from_dlpack(got).double()[fin], want[fin]) < TOL


# ----------------------------------------------------------------- dropout (cuDNN's RNG: statistics)


@pytest.mark.parametrize("p", [0.3, 0.75])
def test_dropout_statistics_and_gradient(p):
    x = u(0.5, 1.5, 256, 256).requires_grad_()
    y = nn.dropout(x, p)
    kept = y != 0
    frac = kept.double().mean().item()
    frac_torch = (F.dropout(x.detach(), p) != 0).double().mean().item()
    assert abs(frac - (1 - p)) < 0.01 and abs(frac_torch - (1 - p)) < 0.01, (frac, frac_torch)
    assert torch.allclose(y[kept], x.detach()[kept] / (1 - p), rtol=1e-6)
    dy = torch.randn_like(y)
    (g,) = torch.autograd.grad(y, x, dy)
    assert torch.allclose(g, torch.where(kept, dy / (1 - p), torch.zeros_like(dy)), rtol=1e-6)
    assert not torch.equal(nn.dropout(x.detach(), p) != 0, kept)  # a new mask per call
    z = x.detach()
    assert nn.dropout(z, p, training=False) is z
    assert torch.equal(nn.dropout(z, 0.0), z) and not nn.dropout(z, 1.0).any()
    w = z.clone()
    out = nn.dropout(w, p, inplace=True)
    assert out is w and abs((w != 0).double().mean().item() - (1 - p)) < 0.01


# ----------------------------------------------------------------- scaled dot-product attention (bfloat16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "q_shape, kv_shape, kw",
    [
        ((2, 4, 128, 64), (2, 4, 128, 64), {}),
        ((2, 4, 64, 64), (2, 4, 128, 64), dict(scale=0.2)),  # cross attention, explicit scale
        ((2, 4, 128, 64), (2, 4, 64, 64), {}),  # more queries than keys (causal: rows 64.. keep every key)
        ((2, 128, 64), (2, 128, 64), {}),  # 3-d (B, S, D)
        ((1, 4, 128, 64), (1, 1, 128, 64), dict(enable_gqa=True)),  # one shared key/value head
        ((1, 8, 128, 64), (1, 2, 128, 64), dict(enable_gqa=True)),  # grouped heads: the L3 op "attention"
    ],
)
def test_scaled_dot_product_attention_bf16(causal, q_shape, kv_shape, kw):
    # causal cross attention (T != S): torch's triangle is top-left aligned (torch.nn.attention.bias
    # .CausalBias), as is cuDNN's default
    torch.manual_seed(4)
    q, k, v = (r(*s).to(torch.bfloat16) for s in (q_shape, kv_shape, kv_shape))

    def call(fn):
        return lambda q, k, v: fn(q, k, v, is_causal=causal, **kw)

    check(call(nn.scaled_dot_product_attention), call(F.scaled_dot_product_attention), q, k, v, tol=BF16_TOL,
          gtol=BF16_TOL)  # fmt: skip


@pytest.mark.parametrize("mask_shape", [(128, 128), (4, 64, 128), (2, 1, 64, 128)])
def test_scaled_dot_product_attention_additive_mask_and_its_gradient(mask_shape):
    """An additive float attn_mask (broadcast over batch and heads) through the L3 op "attention": the output and
    the gradients of q, k, v and the mask (cuDNN's dbias) against torch's own SDPA."""
    torch.manual_seed(5)
    sq = 128 if mask_shape == (128, 128) else 64
    q = r(2, 4, sq, 64).to(torch.bfloat16)
    k, v = (r(2, 4, 128, 64).to(torch.bfloat16) for _ in range(2))
    mask = (r(*mask_shape) * 2).to(torch.bfloat16)
    if len(mask_shape) > 2:
        mask[..., :8] = float("-inf")  # masked columns too

    def call(fn):
        return lambda q, k, v, m: fn(q, k, v, attn_mask=m, scale=0.2)

    check(call(nn.scaled_dot_product_attention), call(F.scaled_dot_product_attention), q, k, v, mask, tol=BF16_TOL,
          gtol=BF16_TOL)  # fmt: skip


def test_the_attention_module_with_a_mask_and_grouped_heads():
    """cudnnkit.torch.nn.ScaledDotProductAttention(enable_gqa=True) with an additive mask (the op "attention")
    against torch's SDPA: output and gradients, the mask's included."""
    from cudnnkit.torch import nn as tnn

    torch.manual_seed(6)
    q = r(2, 8, 64, 64).to(torch.bfloat16)
    k, v = (r(2, 2, 128, 64).to(torch.bfloat16) for _ in range(2))
    mask = r(8, 64, 128).to(torch.bfloat16)
    m = tnn.ScaledDotProductAttention(scale=0.2, enable_gqa=True)
    check(lambda q, k, v, a: m(q, k, v, attn_mask=a),
          lambda q, k, v, a: F.scaled_dot_product_attention(q, k, v, attn_mask=a, scale=0.2, enable_gqa=True),
          q, k, v, mask, tol=BF16_TOL, gtol=BF16_TOL)  # fmt: skip


def _dropout_reference(q, k, v, do, p, seed, *, causal=False, bias=None):
    """o and the gradients (q, k, v, bias) in float64 with the keep-mask cuDNN's attention RNG draws for ``seed``
    (offset 0) at these shapes, read back through the pattern itself (test_attention_gpu.dropout_mask)."""
    from cudnnkit.runtime import adapters

    from . import test_attention_gpu as ta

    def host(t):
        return None if t is None else t.detach().double().cpu().numpy()

    sq, skv = q.shape[2], k.shape[2]
    assert (q.shape[0], q.shape[1]) == (ta.B, ta.H)  # the shapes dropout_mask reads the mask at
    mask = ta.dropout_mask(adapters.get("torch"), p, seed, 0, sq, skv, "bfloat16")
    keep = ta.keep_matrix(sq, skv, causal=True) if causal else None
    o, _, grads = ta.reference(host(q), host(k), host(v), host(do), scale=1 / q.shape[-1] ** 0.5, keep=keep,
                               bias=host(bias), drop=mask, p=p)  # fmt: skip
    return torch.from_numpy(o), [None if g is None else torch.from_numpy(g) for g in grads[:4]]


@pytest.mark.parametrize("causal, masked", [(False, False), (True, False), (False, True)])
def test_scaled_dot_product_attention_dropout_replays_its_mask(causal, masked):
    """dropout_p > 0 (the op "attention" with a seed drawn from torch's generator, offset 0): the output and the
    gradients of q, k, v (and of an additive mask) against a float64 reference with the keep-mask cuDNN draws for
    that seed (read back with the same torch.manual_seed); the same torch seed repeats the output bitwise,
    another seed drops other weights; the module in training mode is the function, in eval mode no dropout."""
    from cudnnkit.nn._common import dropout_seed
    from cudnnkit.torch import nn as tnn

    p, sq, skv, d = 0.2, 128, 64, 64
    torch.manual_seed(8)
    q = r(2, 4, sq, d).to(torch.bfloat16).requires_grad_()
    k, v = (r(2, 4, skv, d).to(torch.bfloat16).requires_grad_() for _ in range(2))
    bias = (r(sq, skv) * 2).to(torch.bfloat16).requires_grad_() if masked else None
    do = r(2, 4, sq, d).to(torch.bfloat16)
    leaves = [t for t in (q, k, v, bias) if t is not None]
    torch.manual_seed(21)
    o = nn.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=causal)
    grads = torch.autograd.grad(o, leaves, do)
    torch.manual_seed(21)
    seed = int(dropout_seed(q)[0].item())
    o_ref, g_ref = _dropout_reference(q, k, v, do, p, seed, causal=causal, bias=bias)
    assert rel(o.cpu(), o_ref) < BF16_TOL
    for name, g, ref in zip(("q", "k", "v", "attn_mask"), grads, g_ref):
        assert g.shape == ref.shape and rel(g.cpu(), ref) < BF16_TOL, name
    with torch.no_grad():
        torch.manual_seed(21)
        again = nn.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=causal)
        assert torch.equal(again, o)  # the same torch seed: the same mask, bitwise
        other = nn.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, is_causal=causal)
        assert not torch.equal(other, o)  # the next draw: another mask
        m = tnn.ScaledDotProductAttention(dropout_p=p, is_causal=causal)
        torch.manual_seed(21)
        assert torch.equal(m(q, k, v, attn_mask=bias), o)
        m.eval()
        plain = nn.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal)
        assert torch.equal(m(q, k, v, attn_mask=bias), plain)
        assert rel(plain.float(), F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal).float()) \
            < BF16_TOL  # fmt: skip


def test_scaled_dot_product_attention_dropout_under_torch_compile():
    """Dropout under torch.compile(fullgraph=True): through AOTAutograd (backend aot_eager, torch's own generator
    draws the seed) the output and gradients equal eager's bitwise after one torch.manual_seed; with inductor in
    mode reduce-overhead (CUDA graphs; inductor's generator) each replay draws a new mask, and the mean of 96 calls
    is the output without dropout (the kept weights scaled by 1 / (1 - p): unscaled, the mean would be half)."""
    torch.manual_seed(12)
    q, k, v = (r(2, 4, 128, 64).to(torch.bfloat16).requires_grad_() for _ in range(3))
    do = r(2, 4, 128, 64).to(torch.bfloat16)

    def f(q, k, v):
        return nn.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True)

    got = []
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        torch.manual_seed(3)
        o = fn(q, k, v)
        got.append((o, *torch.autograd.grad(o, (q, k, v), do)))
    for a, b in zip(*got):
        assert torch.equal(a, b)
    with torch.no_grad():
        plain = nn.scaled_dot_product_attention(q, k, v, is_causal=True).float()
        g = torch.compile(f, fullgraph=True, mode="reduce-overhead")
        outs = [g(q, k, v).float().clone() for _ in range(96)]
    assert all(torch.isfinite(o).all() for o in outs) and not torch.equal(outs[-1], outs[-2])
    assert rel(torch.stack(outs).mean(0), plain) < 0.25


def test_scaled_dot_product_attention_dropout_on_cupy_arrays():
    """CuPy arrays in and out: the seed drawn from cupy.random (cupy.random.seed reproduces the call), the output
    against the float64 reference with the mask cuDNN draws for it."""
    cp = pytest.importorskip("cupy")
    from cudnnkit.nn._common import dropout_seed

    p = 0.3
    torch.manual_seed(9)
    qt, kt, vt = (r(2, 4, 64, 64).to(torch.bfloat16) for _ in range(3))
    q, k, v = (cp.from_dlpack(t) for t in (qt, kt, vt))  # bfloat16: DLPack (the array interface has no such type)
    cp.random.seed(5)
    o = nn.scaled_dot_product_attention(q, k, v, dropout_p=p)
    assert isinstance(o, cp.ndarray) and o.shape == (2, 4, 64, 64)
    cp.random.seed(5)
    seed = int(dropout_seed(q)[0].get().item())
    o_ref, _ = _dropout_reference(qt, kt, vt, torch.zeros_like(qt), p, seed)
    assert rel(torch.from_dlpack(o).cpu(), o_ref) < BF16_TOL


def test_scaled_dot_product_attention_cupy_key_padding_mask():
    """A CuPy key-padding mask (B, 1, 1, S_kv), broadcast in its last two dims as torch broadcasts it
    (cupy.broadcast_to: a zero-stride view the op copies), against torch's float64 attention on the same values."""
    cp = pytest.importorskip("cupy")
    torch.manual_seed(10)
    qt, kt, vt = (r(2, 4, 48, 64).to(torch.bfloat16) for _ in range(3))
    mt = torch.zeros(2, 1, 1, 48, device="cuda", dtype=torch.bfloat16)
    mt[0, ..., 40:] = -1e4
    mt[1, ..., :5] = -1e4
    q, k, v, m = (cp.from_dlpack(t) for t in (qt, kt, vt, mt))
    o = nn.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert isinstance(o, cp.ndarray) and o.shape == (2, 4, 48, 64)
    want = F.scaled_dot_product_attention(*(t.double() for t in (qt, kt, vt, mt)))
    assert rel(torch.from_dlpack(o).double(), want) < BF16_TOL


# ----------------------------------------------------------------- the CuPy path (forward)


def _cupy_check(cp, fn, ref, *arrays, tol=TOL, **kw):
    """``fn(*arrays, **kw)`` on CuPy arrays gives a CuPy array equal to ``ref`` on torch views of the same memory."""
    with cudnnkit.settings(allow_tf32=False):
        got = fn(*arrays, **kw)
    assert isinstance(got, cp.ndarray)
    want = ref(*(torch.as_tensor(a, device="cuda") if isinstance(a, cp.ndarray) else a for a in arrays), **kw)
    assert tuple(got.shape) == tuple(want.shape)
    assert rel(torch.as_tensor(got, device="cuda"), want) < tol
    return got


def test_cupy_arrays_in_cupy_arrays_out():
    cp = pytest.importorskip("cupy")
    rs = cp.random.RandomState(5)

    def cr(*shape):
        return rs.standard_normal(shape, dtype=cp.float32)

    x, w, b = cr(2, 3, 10, 10), cr(4, 3, 3, 3), cr(4)
    _cupy_check(cp, nn.conv2d, F.conv2d, x, w, b, padding=1, stride=2)
    _cupy_check(cp, nn.conv2d, F.conv2d, x, w, None, padding="same")
    _cupy_check(cp, nn.max_pool2d, F.max_pool2d, x, 3, stride=2, padding=1)
    _cupy_check(cp, nn.avg_pool2d, F.avg_pool2d, x, 3, stride=2, padding=1, count_include_pad=False)
    _cupy_check(cp, nn.avg_pool2d, F.avg_pool2d, x, 2)
    _cupy_check(cp, nn.avg_pool2d, F.avg_pool2d, cr(2, 3, 8, 6), 3, stride=2, padding=1, ceil_mode=True)
    _cupy_check(cp, nn.avg_pool2d, F.avg_pool2d, x, 3, stride=2, padding=1, divisor_override=4)
    _cupy_check(cp, nn.softmax, F.softmax, x, dim=1)
    _cupy_check(cp, nn.softmax, F.softmax, cr(5, 9), dim=-1)
    _cupy_check(cp, nn.relu, F.relu, x)
    _cupy_check(cp, nn.layer_norm, F.layer_norm, cr(4, 5, 8), (8,), cr(8), cr(8))
    _cupy_check(cp, nn.layer_norm, F.layer_norm, cr(4, 5, 8), (5, 8))
    for training in (True, False):
        rm, rv = cr(3) * 0.1, rs.uniform(0.5, 1.5, 3, dtype=cp.float32)
        rm_t, rv_t = torch.as_tensor(rm, device="cuda").clone(), torch.as_tensor(rv, device="cuda").clone()
        bw, bb = cr(3), cr(3)
        with cudnnkit.settings(allow_tf32=False):
            got = nn.batch_norm(x, rm, rv, bw, bb, training=training, momentum=0.2)
        assert isinstance(got, cp.ndarray)
        want = F.batch_norm(torch.as_tensor(x, device="cuda"), rm_t, rv_t, torch.as_tensor(bw, device="cuda"),
                            torch.as_tensor(bb, device="cuda"), training=training, momentum=0.2)  # fmt: skip
        assert rel(torch.as_tensor(got, device="cuda"), want) < TOL
        assert rel(torch.as_tensor(rm, device="cuda"), rm_t) < TOL
        assert rel(torch.as_tensor(rv, device="cuda"), rv_t) < TOL
    xd = rs.uniform(0.5, 1.5, (256, 256), dtype=cp.float32)
    y = nn.dropout(xd, 0.4)
    assert isinstance(y, cp.ndarray)
    kept = y != 0
    assert abs(float(kept.mean()) - 0.6) < 0.01
    assert bool(cp.allclose(y[kept], xd[kept] / 0.6, rtol=1e-6))
    assert nn.dropout(xd, 0.4, training=False) is xd


# ----------------------------------------------------------------- refused before any GPU work


@pytest.fixture
def no_gpu_work(monkeypatch):
    """Any L3 op, graph attention or RNN weight layout fails the test: the NotImplementedError must come first."""
    from cudnnkit.nn import _common, rnn

    def reached(*a, **k):
        raise AssertionError("reached GPU work")

    monkeypatch.setattr(_common, "l3", reached)
    monkeypatch.setattr(rnn, "flat_layout", reached)


def z(*shape, dtype=torch.float32):
    return torch.zeros(shape, device="cuda", dtype=dtype)


def _qkv(dtype=torch.bfloat16):
    return (z(1, 2, 8, 16, dtype=dtype),) * 3


#: (what the message names, inputs maker, the call)
REFUSED = [
    ("return_indices", lambda: (z(1, 1, 4, 4),), lambda x: nn.max_pool2d(x, 2, return_indices=True)),
    ("dilation", lambda: (z(1, 1, 8, 8),), lambda x: nn.max_pool2d(x, 2, dilation=2)),
    ("size=4", lambda: (z(1, 4, 3, 3),), lambda x: nn.local_response_norm(x, 4)),
    (
        "mode='nearest'",
        lambda: (z(1, 1, 3, 3), z(1, 2, 2, 2)),
        lambda x, g: nn.grid_sample(x, g, mode="nearest", align_corners=True),
    ),
    ("align_corners=False", lambda: (z(1, 2, 3),), lambda t: nn.affine_grid(t, (1, 1, 3, 3), align_corners=False)),
    (
        "blank=2",
        lambda: (z(4, 1, 3), torch.ones(1, 1, dtype=torch.long)),
        lambda lp, tg: nn.ctc_loss(lp, tg, (4,), (1,), blank=2),
    ),
    (
        "attn_mask",
        lambda: (*_qkv(), z(8, 8, dtype=torch.bool)),
        lambda q, k, v, m: nn.scaled_dot_product_attention(q, k, v, attn_mask=m),
    ),
    ("dropout_p", _qkv, lambda q, k, v: nn.scaled_dot_product_attention(q, k, v, dropout_p=1.0)),
    ("query has dtype float32", lambda: _qkv(torch.float32), nn.scaled_dot_product_attention),
    ("min_val=-1", lambda: (z(3),), nn.hardtanh),
    ("gelu", lambda: (z(3),), nn.gelu),
    ("leaky_relu", lambda: (z(3),), nn.leaky_relu),
    ("softplus", lambda: (z(3),), nn.softplus),
    ("input has dtype float64", lambda: (z(2, 4, dtype=torch.float64),), lambda x: nn.layer_norm(x, (4,))),
    (
        "momentum=None",
        lambda: (z(2, 3), z(3), z(3)),
        lambda x, m, v: nn.batch_norm(x, m, v, training=True, momentum=None),
    ),
    (
        "PackedSequence",
        lambda: (torch.nn.utils.rnn.pack_sequence([z(3, 2)]),),
        lambda x: nn.lstm(x, None, [], True, 1, 0.0, False, False, False),
    ),
]


@pytest.mark.parametrize("what, make, call", REFUSED, ids=[f"{i}-{w}" for i, (w, _, _) in enumerate(REFUSED)])
def test_refused_before_gpu_work(no_gpu_work, what, make, call):
    args = make()
    gc.collect()  # an earlier test's garbage freed now, not during the call (a drop is no allocation either)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(NotImplementedError) as e:
        call(*args)
    assert what in str(e.value)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before, "the refused call allocated CUDA memory"


def test_cupy_refused_before_gpu_work(no_gpu_work):
    cp = pytest.importorskip("cupy")
    x = cp.zeros((1, 1, 8, 8), dtype=cp.float32)
    with pytest.raises(NotImplementedError, match="dilation"):
        nn.max_pool2d(x, 2, dilation=2)
    with pytest.raises(NotImplementedError, match="gelu"):
        nn.gelu(x)


# ----------------------------------------------------------------- every function is covered


def test_every_function_is_covered():
    covered = {n for n, _, _ in SAME} | {"batch_norm", "lstm", "gru", "rnn_tanh", "rnn_relu", "ctc_loss", "dropout",
                                        "scaled_dot_product_attention"}  # fmt: skip
    covered |= {w for w, _, _ in REFUSED if w in ("gelu", "leaky_relu", "softplus")}  # raise: nothing to compare
    assert covered == set(nn.__all__), sorted(set(nn.__all__) ^ covered)


def test_what_cannot_be_differentiated_is_refused_by_name():
    """Real cuDNN ops: a gradient taken with ``create_graph=True`` matches torch's, and differentiating it again
    raises naming the op (cuDNN's backward is outside autograd's graph); a forward-mode tangent and
    ``torch.func.grad`` raise ``NotImplementedError`` before any GPU work, never a zero."""
    import torch.autograd.forward_ad as fwAD

    x, w = cl(r(2, 4, 8, 8)).requires_grad_(True), r(6, 4, 3, 3, scale=0.3).requires_grad_(True)
    (gx,) = torch.autograd.grad(nn.conv2d(x, w, padding=1).square().sum(), (x,), create_graph=True)
    xa, wa = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    (want,) = torch.autograd.grad(F.conv2d(xa, wa, padding=1).square().sum(), (xa,))
    assert rel(gx, want) < GTOL
    with pytest.raises(RuntimeError, match="convolution's backward is not differentiable"):
        torch.autograd.grad(gx.sum() + x.sum(), (x,))
    xd, wd = x.detach(), w.detach()
    with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
        with fwAD.dual_level():
            nn.conv2d(fwAD.make_dual(xd, torch.ones_like(xd)), wd, padding=1)
    with pytest.raises(NotImplementedError, match="does not support torch.func"):
        torch.func.grad(lambda a: nn.conv2d(a, wd, padding=1).sum())(xd)
