"""Convolution rows (issue 12): ``cudnnkit.ops.convolution_*`` (legacy path) against ``torch.nn.functional.conv*``
and autograd, with ``torch.backends.cudnn.benchmark = True`` on torch's side, on the issue's shapes.

* ResNet-50 3x3 conv 64->64 at 56x56, batch 64: float32 NCHW and bfloat16 NHWC, forward;
* the same conv's backward data and filter, bfloat16 NHWC;
* depthwise 3x3 (groups = C = 64), bfloat16 NHWC;
* a 3-d conv 32->32, 3x3x3, 16x32x32 volume, batch 4, float16 channels-last;
* a tiny conv 1x8x8x8 (host time per call).

Outputs are allocated per call on both sides (as eager code does). ``flops``: ``2 * N * K * C/g * prod(kernel) *
prod(out)`` per conv (3 convs' worth for data + filter).
"""

from __future__ import annotations

import math

from .harness import Row, register

FAMILY = "conv"


def _flops(n: int, k: int, cg: int, kernel: tuple, out: tuple) -> float:
    return 2.0 * n * k * cg * math.prod(kernel) * math.prod(out)


@register
def conv_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit import ops

    torch.backends.cudnn.benchmark = True
    rows: list[Row] = []

    def make(n, c, k, sp, ks, dtype, channels_last, groups=1):
        mf = {2: torch.channels_last, 3: torch.channels_last_3d}[len(sp)]
        x = torch.randn(n, c, *sp, device="cuda", dtype=dtype)
        w = torch.randn(k, c // groups, *ks, device="cuda", dtype=dtype) * 0.1
        if channels_last:
            x, w = x.contiguous(memory_format=mf), w.contiguous(memory_format=mf)
        return x, w

    conv = {2: F.conv2d, 3: F.conv3d}
    for dtype, cl in ((torch.float32, False), (torch.bfloat16, True)):
        x, w = make(64, 64, 64, (56, 56), (3, 3), dtype, cl)
        name = str(dtype).removeprefix("torch.")
        rows.append(
            Row(
                FAMILY,
                "conv3x3 64->64 fwd",
                f"64x64x56x56 {'NHWC' if cl else 'NCHW'}",
                name,
                ours=lambda x=x, w=w: ops.convolution_forward(x, w, padding=1),
                torch=lambda x=x, w=w: F.conv2d(x, w, padding=1),
                flops=_flops(64, 64, 64, (3, 3), (56, 56)),
            )
        )
    x, w = make(64, 64, 64, (56, 56), (3, 3), torch.bfloat16, True)
    dy = torch.randn(64, 64, 56, 56, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    xt, wt = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()

    def ours_bwd(x=x, w=w, dy=dy):  # bound now: x and w are rebound below
        ops.convolution_backward_data(dy, w, x_shape=tuple(x.shape), padding=1)
        ops.convolution_backward_filter(x, dy, w_shape=tuple(w.shape), padding=1)

    def torch_bwd(xt=xt, wt=wt, dy=dy):
        torch.autograd.grad(F.conv2d(xt, wt, padding=1), (xt, wt), dy)

    rows.append(Row(FAMILY, "conv3x3 64->64 bwd data+filter", "64x64x56x56 NHWC", "bfloat16", ours=ours_bwd,
                    torch=torch_bwd, flops=2 * _flops(64, 64, 64, (3, 3), (56, 56)),
                    notes="torch also runs the forward inside autograd"))  # fmt: skip
    x, w = make(64, 64, 64, (56, 56), (3, 3), torch.bfloat16, True, groups=64)
    rows.append(
        Row(
            FAMILY,
            "depthwise 3x3 fwd",
            "64x64x56x56 NHWC g64",
            "bfloat16",
            ours=lambda: ops.convolution_forward(x, w, padding=1, groups=64),
            torch=lambda: F.conv2d(x, w, padding=1, groups=64),
            flops=_flops(64, 64, 1, (3, 3), (56, 56)),
        )
    )
    x3, w3 = make(4, 32, 32, (16, 32, 32), (3, 3, 3), torch.float16, True)
    rows.append(
        Row(
            FAMILY,
            "conv3d 3x3x3 32->32 fwd",
            "4x32x16x32x32 NDHWC",
            "float16",
            ours=lambda: ops.convolution_forward(x3, w3, padding=1),
            torch=lambda: conv[3](x3, w3, padding=1),
            flops=_flops(4, 32, 32, (3, 3, 3), (16, 32, 32)),
        )
    )
    xs, ws = make(1, 8, 8, (8, 8), (3, 3), torch.float16, True)
    rows.append(
        Row(
            FAMILY,
            "tiny conv fwd (host)",
            "1x8x8x8 k8 NHWC",
            "float16",
            ours=lambda: ops.convolution_forward(xs, ws, padding=1),
            torch=lambda: F.conv2d(xs, ws, padding=1),
        )
    )
    return rows
