"""L3 rows: the PyTorch integration (``cudnnkit.torch``: custom ops, the ``torch.nn`` twins, ``convert``) against
torch itself.

* custom op dispatch (host): a tiny softmax (8x64 float32) through ``cudnnkit.torch.op("softmax")`` and through the
  L2 call ``cudnnkit.ops.softmax_forward``, each beside ``torch.softmax``: the difference of the two rows' "ours
  host µs" is what the custom-op dispatcher adds (keyword encoding, ``torch.library`` dispatch, the meta/stride
  check); a third row with ``requires_grad`` adds the autograd node;
* CNN train step: conv3x3 3->32, BN, ReLU, max pool, conv3x3 32->64, BN, ReLU, adaptive avg pool, linear 10 on a
  batch of 64 3x32x32 channels-last images; forward, cross-entropy, backward and an SGD step. ours: a deep copy of
  the torch model through ``cudnnkit.torch.convert`` (convs, BNs, ReLUs, the max pool swapped; the adaptive pool and
  the linear stay torch's); eager, eager with ``convert(fuse=True)`` (each BN -> ReLU one fused op), and under
  ``torch.compile`` (mode default), float32 and bfloat16;
* LSTM train step: a 2-layer LSTM (input 64, hidden 256) over 64 steps of a batch of 32, float32; forward, MSE,
  backward and an Adam step; eager and compiled;
* fused conv+bias+ReLU through ``cudnnkit.torch.op("convolution")`` with ``activation="relu"`` where the declaration
  takes it (it refuses it now: the backward needs the pre-activation; the row is then skipped with a note on
  stderr, and the unfused pair convolution op -> activation op is timed instead), and BN+add+ReLU through
  ``cudnnkit.torch.op("batch_norm")`` with ``z`` and ``activation="relu"`` (training; float16 NHWC, what cuDNN fuses),
  forward and forward + backward, against torch eager.

Nothing synchronizes inside a callable (no ``.item()``, no host reads): the optimizers' steps, the running
statistics and the BN twin's ``num_batches_tracked`` stay on the device. TF32 as each library's default (on for
cuDNN's float32 convolutions on both sides); ``torch.backends.cudnn.benchmark = True`` on torch's side.
"""

from __future__ import annotations

import copy
import sys

from .harness import Row, register

FAMILY = "l3"


def _dname(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@register
def dispatch_rows() -> list[Row]:
    import torch

    import cudnnkit.torch as ckt
    from cudnnkit import ops

    x = torch.randn(8, 64, device="cuda")
    xg = x.clone().requires_grad_()
    from cudnnkit.torch import _library

    sm = ckt.op("softmax")
    note = ("the eager fast path (the declaration called directly); its added host cost is this row's ours host "
            "µs minus the L2 row's (softmax_forward); torch = torch.softmax")  # fmt: skip

    def via_dispatcher(t):
        _library.EAGER = False  # this call through the custom op, as torch.compile runs it
        try:
            return sm(t, axis=-1)
        finally:
            _library.EAGER = True

    return [
        Row(
            FAMILY,
            "torch op softmax (host)",
            "8x64",
            "float32",
            ours=lambda: sm(x, axis=-1),
            torch=lambda: torch.softmax(x, -1),
            notes=note,
        ),
        Row(
            FAMILY,
            "torch op softmax via the dispatcher (host)",
            "8x64",
            "float32",
            ours=lambda: via_dispatcher(x),
            torch=lambda: torch.softmax(x, -1),
            notes="the custom op cudnnkit::softmax through torch's dispatcher (what a compiled graph calls)",
        ),
        Row(
            FAMILY,
            "L2 softmax_forward (host)",
            "8x64",
            "float32",
            ours=lambda: ops.softmax_forward(x, axis=-1),
            torch=lambda: torch.softmax(x, -1),
            notes="the L2 call, no dispatcher: the baseline of the row above",
        ),
        Row(
            FAMILY,
            "torch op softmax, requires_grad (host)",
            "8x64",
            "float32",
            ours=lambda: sm(xg, axis=-1),
            torch=lambda: torch.softmax(xg, -1),
            notes="forward only; both record an autograd node (ours: one torch.autograd.Function)",
        ),
        Row(
            FAMILY,
            "torch op softmax, requires_grad, via the dispatcher (host)",
            "8x64",
            "float32",
            ours=lambda: via_dispatcher(xg),
            torch=lambda: torch.softmax(xg, -1),
            notes="the custom op's autograd kernel through the dispatcher",
        ),
    ]


def _small_cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )  # fmt: skip


def _converted(model, fuse: bool = False):
    """A deep copy of ``model`` through ``cudnnkit.torch.convert`` (``fuse=``), and how many modules it swapped."""
    import cudnnkit.torch as ckt

    report = ckt.convert(copy.deepcopy(model), fuse=fuse)
    return report.model, len(report.replaced)


def _train_step(model, opt, loss_fn, x, target):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        opt.step()

    return step


@register
def cnn_train_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    rows: list[Row] = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = _small_cnn(torch).to("cuda", dtype).to(memory_format=torch.channels_last)
        x = torch.randn(64, 3, 32, 32, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (64,), device="cuda")
        modes = (None, "fused", "default", "reduce-overhead") if dtype == torch.float32 else (None, "fused", "default")
        for mode in modes:
            base = copy.deepcopy(model)  # each pair trains its own copies
            ours, n = _converted(base, fuse=mode == "fused")
            if mode == "fused":
                steps = [_train_step(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), F.cross_entropy, x, y)
                         for m in (ours, base)]  # fmt: skip
                rows.append(Row(FAMILY, "CNN train step, convert(fuse=True)", "64x3x32x32 NHWC", _dname(dtype),
                                ours=steps[0], torch=steps[1],
                                notes=f"convert swapped {n} modules and fused each BN -> ReLU (one cuDNN graph each "
                                      "way); fwd + cross-entropy + bwd + SGD"))  # fmt: skip
                continue
            steps = [_train_step(torch.compile(m, mode=mode) if mode else m, torch.optim.SGD(m.parameters(), lr=0.01,
                                 momentum=0.9), F.cross_entropy, x, y) for m in (ours, base)]  # fmt: skip
            label = {None: "", "default": " (compiled)", "reduce-overhead": " (compiled, reduce-overhead)"}[mode]
            rows.append(Row(FAMILY, "CNN train step" + label, "64x3x32x32 NHWC", _dname(dtype), ours=steps[0],
                            torch=steps[1], notes=f"convert swapped {n} modules; fwd + cross-entropy + bwd + SGD"
                            + (f"; torch.compile mode {mode}, compiled in the warm-up" if mode else "")
                            + ("; the model's fwd and bwd replayed as CUDA graphs: no per-op host cost"
                               if mode == "reduce-overhead" else "")))  # fmt: skip
    return rows


@register
def lstm_train_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.LSTM(64, 256, num_layers=2).to("cuda")
    x = torch.randn(64, 32, 64, device="cuda")
    target = torch.randn(64, 32, 256, device="cuda")
    rows: list[Row] = []
    for compiled in (False, True):
        base = copy.deepcopy(model)
        ours, n = _converted(base)
        steps = []
        for m in (ours, base):
            f = torch.compile(m) if compiled else m
            opt = torch.optim.Adam(m.parameters(), lr=1e-3)
            steps.append(_train_step(lambda x, f=f: f(x)[0], opt, F.mse_loss, x, target))
        rows.append(Row(FAMILY, "LSTM train step" + (" (compiled)" if compiled else ""), "T64 N32 I64 H256 L2",
                        "float32", ours=steps[0], torch=steps[1],
                        notes=f"convert swapped {n} module(s); fwd + MSE + bwd + Adam"
                              + ("; torch.compile mode default (dynamo may leave RNN modules eager)"
                                 if compiled else "")))  # fmt: skip
    return rows


def _conv_activation_refused() -> str | None:
    """Why the L3 convolution declaration does not take ``activation="relu"`` (its meta, host-side), or None."""
    from cudnnkit import autograd
    from cudnnkit.ops._diff import Spec

    x = Spec((1, 8, 4, 4), (128, 16, 4, 1), "float32")
    w = Spec((8, 8, 3, 3), (72, 9, 3, 1), "float32")
    try:
        autograd.get("convolution").meta(x, w, None, activation="relu", padding=1)
    except NotImplementedError as e:
        return str(e)
    return None


@register
def fused_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    import cudnnkit.torch as ckt

    torch.backends.cudnn.benchmark = True
    rows: list[Row] = []
    cl = torch.channels_last
    shape = "64x64x56x56 NHWC"
    x = torch.randn(64, 64, 56, 56, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = (torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.bfloat16) * 0.05).contiguous(memory_format=cl)
    b = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    conv, act = ckt.op("convolution"), ckt.op("activation")
    why = _conv_activation_refused()
    if why is None:
        rows.append(Row(FAMILY, "fused conv+bias+ReLU fwd", shape, "bfloat16",
                        ours=lambda: conv(x, w, b, padding=1, activation="relu"),
                        torch=lambda: F.relu(F.conv2d(x, w, b, padding=1)),
                        notes="one L3 op (the graph's conv_fprop -> ADD -> RELU_FWD)"))  # fmt: skip
        cx, cw, cb = (t.detach().clone().requires_grad_() for t in (x, w, b))
        tx, tw, tb = (t.detach().clone().requires_grad_() for t in (x, w, b))
        g = torch.randn(64, 64, 56, 56, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
        rows.append(Row(FAMILY, "fused conv+bias+ReLU fwd+bwd", shape, "bfloat16",
                        ours=lambda: torch.autograd.grad(conv(cx, cw, cb, padding=1, activation="relu"),
                                                         (cx, cw, cb), g),
                        torch=lambda: torch.autograd.grad(F.relu(F.conv2d(tx, tw, tb, padding=1)), (tx, tw, tb), g),
                        notes="dx, dw, db; ours: the ReLU's gradient from the saved output, then dgrad, wgrad, "
                              "bias reduction"))  # fmt: skip
    else:
        print(f"  note: skipped {FAMILY}/fused conv+bias+ReLU fwd: the L3 convolution refuses activation=: {why}",
              file=sys.stderr)  # fmt: skip
        rows.append(Row(FAMILY, "conv+bias -> ReLU fwd (2 L3 ops)", shape, "bfloat16",
                        ours=lambda: act(conv(x, w, b, padding=1), mode="relu"),
                        torch=lambda: F.relu(F.conv2d(x, w, b, padding=1)),
                        notes="unfused: the L3 convolution takes no activation (the fused row is skipped)"))  # fmt: skip

    bn = ckt.op("batch_norm")
    if "z" not in bn.d.inputs:
        print(f"  note: skipped {FAMILY}/BN+add+ReLU: the L3 batch_norm declaration has no residual input z",
              file=sys.stderr)  # fmt: skip
        return rows
    h = torch.float16
    xh = torch.randn(64, 64, 56, 56, device="cuda", dtype=h).contiguous(memory_format=cl)
    zh = torch.randn_like(xh)
    dy = torch.randn_like(xh)
    scale, bias = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda")
    rm, rv = torch.zeros(64, device="cuda"), torch.ones(64, device="cuda")
    trm, trv = rm.clone(), rv.clone()

    def ours_fwd(x=xh, s=scale, b=bias, z=zh):
        return bn(x, s, b, z, running_mean=rm, running_var=rv, training=True, activation="relu")

    def torch_fwd(x=xh, s=scale, b=bias, z=zh):
        return F.relu(F.batch_norm(x, trm, trv, s, b, training=True) + z)

    leaves = [t.detach().clone().requires_grad_() for t in (xh, scale, bias, zh)]
    tleaves = [t.detach().clone().requires_grad_() for t in (xh, scale, bias, zh)]
    rows.append(Row(FAMILY, "BN+add+ReLU fwd", shape, "float16", ours=ours_fwd, torch=torch_fwd,
                    notes="training; ours: one L3 batch_norm (z, activation='relu'); torch: batch_norm, add, relu"))  # fmt: skip
    rows.append(Row(FAMILY, "BN+add+ReLU fwd+bwd", shape, "float16",
                    ours=lambda: torch.autograd.grad(ours_fwd(*leaves), leaves, dy),
                    torch=lambda: torch.autograd.grad(torch_fwd(*tleaves), tleaves, dy),
                    notes="dx, dscale, dbias, dz; ours: one batch_norm_backward"))  # fmt: skip
    return rows
