"""Activation, op_tensor and reduce_tensor rows (issue 12): ``cudnnkit.ops`` against the torch call doing the same
work, on a 64x256x56x56 bfloat16 tensor (memory-bound: ``bytes`` are the fewest that must move), plus a tiny
shape for host time."""

from __future__ import annotations

from .harness import Row, register

FAMILY = "elementwise"


@register
def elementwise_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit import ops

    x = torch.randn(64, 256, 56, 56, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 256, 1, 1, device="cuda", dtype=torch.bfloat16)
    y, dy = F.silu(x), torch.randn_like(x)
    n = x.numel() * x.element_size()
    tiny = torch.randn(1, 8, 4, 4, device="cuda", dtype=torch.float16)
    shape = "64x256x56x56"
    return [
        Row(FAMILY, "relu fwd", shape, "bfloat16", ours=lambda: ops.activation_forward(x, "relu"),
            torch=lambda: F.relu(x), bytes=2 * n),
        Row(FAMILY, "swish (silu) fwd", shape, "bfloat16", ours=lambda: ops.activation_forward(x, "swish"),
            torch=lambda: F.silu(x), bytes=2 * n),
        Row(FAMILY, "swish (silu) bwd", shape, "bfloat16",
            ours=lambda: ops.activation_backward(dy, y, x, "swish"),
            torch=lambda: torch.ops.aten.silu_backward(dy, x), bytes=3 * n),
        Row(FAMILY, "op_tensor add, broadcast b", shape, "bfloat16", ours=lambda: ops.op_tensor(x, b, op="add"),
            torch=lambda: x + b, bytes=2 * n),
        Row(FAMILY, "reduce_tensor add over H, W", shape, "bfloat16",
            ours=lambda: ops.reduce_tensor(x, "add", axes=(2, 3)), torch=lambda: x.sum((2, 3), keepdim=True),
            bytes=n),
        Row(FAMILY, "relu fwd (host)", "1x8x4x4", "float16", ours=lambda: ops.activation_forward(tiny, "relu"),
            torch=lambda: F.relu(tiny)),
    ]  # fmt: skip
