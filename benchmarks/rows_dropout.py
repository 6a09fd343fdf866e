"""Dropout rows: ``cudnnkit.ops.dropout_forward``/``dropout_backward`` against torch's dropout.

64x256x56x56 in float32 and float16, p = 0.5. Forward reads x and writes y
(cuDNN also writes a reserve of about one byte per 8 elements... counted as
its real size); backward reads dy and the mask and writes dx. torch's
``F.dropout`` in training mode is the comparison for the forward, and
``torch.ops.aten.native_dropout_backward`` (what autograd calls) for the backward.
"""

from __future__ import annotations

import math

from .harness import Row, register

FAMILY = "dropout"
SHAPE = (64, 256, 56, 56)


@register
def dropout_rows() -> list[Row]:
    import torch

    from cudnnkit.ops import DropoutState, dropout_backward, dropout_forward

    rows: list[Row] = []
    p = 0.5
    for dtype in (torch.float32, torch.float16):
        dname = str(dtype).removeprefix("torch.")
        x = torch.randn(SHAPE, device="cuda", dtype=dtype)
        dy = torch.randn(SHAPE, device="cuda", dtype=dtype)
        out = torch.empty_like(x)
        st = DropoutState(x, seed=1)
        _, reserve = dropout_forward(x, p, state=st)
        n = math.prod(SHAPE) * x.element_size()
        r = reserve.numel()
        _, tmask = torch.ops.aten.native_dropout(x, p, True)
        s = "x".join(map(str, SHAPE))
        rows.append(
            Row(
                FAMILY,
                "dropout fwd",
                s,
                dname,
                ours=lambda x=x, o=out, st=st: dropout_forward(x, p, state=st, out=o),
                torch=lambda x=x: torch.nn.functional.dropout(x, p, training=True),
                bytes=2 * n + r,
            )
        )
        rows.append(
            Row(
                FAMILY,
                "dropout bwd",
                s,
                dname,
                ours=lambda dy=dy, r=reserve, o=out, st=st: dropout_backward(dy, r, p, state=st, out=o),
                torch=lambda dy=dy, m=tmask: torch.ops.aten.native_dropout_backward(dy, m, 1 / (1 - p)),
                bytes=2 * n + r,
            )
        )
    return rows
