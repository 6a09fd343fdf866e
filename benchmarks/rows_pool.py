"""Pooling rows (issue 12): ``cudnnkit.ops.pooling_forward`` (legacy path) against ``torch.nn.functional`` pooling
on the issue's shapes, with the memory floor (bytes read and written / measured copy bandwidth) as ``bytes``:
max pool 3x3/2 and average pool 3x3/1 excluding padding, float16 channels-last, 64x256x56x56."""

from __future__ import annotations

from .harness import Row, register

FAMILY = "pool"


@register
def pool_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit import ops

    torch.backends.cudnn.benchmark = True
    x = torch.randn(64, 256, 56, 56, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    y_max = F.max_pool2d(x, 3, 2, 1)
    y_avg = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
    isz = x.element_size()
    return [
        Row(
            FAMILY,
            "max pool 3x3/2 fwd",
            "64x256x56x56 NHWC",
            "float16",
            ours=lambda: ops.pooling_forward(x, window=3, stride=2, padding=1),
            torch=lambda: F.max_pool2d(x, 3, 2, 1),
            bytes=(x.numel() + y_max.numel()) * isz,
        ),
        Row(
            FAMILY,
            "avg pool 3x3/1 exclude padding fwd",
            "64x256x56x56 NHWC",
            "float16",
            ours=lambda: ops.pooling_forward(x, mode="avg_exclude_padding", window=3, stride=1, padding=1),
            torch=lambda: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
            bytes=(x.numel() + y_avg.numel()) * isz,
        ),
    ]
