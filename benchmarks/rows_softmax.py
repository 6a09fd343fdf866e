"""Softmax and log-softmax rows: ``cudnnkit.ops.softmax_*`` against ``torch.softmax``/``log_softmax``.

Shapes from the issue: 4096x32000 over the last axis, and 16x16x2048x2048 over
the last axis, in float32 and bfloat16. Bytes are the fewest that must move:
forward reads x and writes y; backward reads y and dy and writes dx. Outputs
are preallocated on both sides (``out=``), so the rows time the kernels and
the per-call host path, not the allocator.
"""

from __future__ import annotations

import math

from .harness import Row, register

FAMILY = "softmax"
SHAPES = ((4096, 32000), (16, 16, 2048, 2048))


@register
def softmax_rows() -> list[Row]:
    import torch

    from cudnnkit.ops import softmax_backward, softmax_forward

    rows: list[Row] = []
    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            dname = str(dtype).removeprefix("torch.")
            n = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(shape, device="cuda", dtype=dtype)
            dy = torch.randn(shape, device="cuda", dtype=dtype)
            out, tout = torch.empty_like(x), torch.empty_like(x)
            s = "x".join(map(str, shape))
            for log in (False, True):
                name = "log_softmax" if log else "softmax"
                tf = torch.log_softmax if log else torch.softmax
                y = tf(x.float(), -1).to(dtype)
                rows.append(
                    Row(
                        FAMILY,
                        f"{name} fwd",
                        s,
                        dname,
                        ours=lambda x=x, o=out, lg=log: softmax_forward(x, axis=-1, log=lg, out=o),
                        torch=lambda x=x, o=tout, f=tf: (
                            torch.ops.aten._softmax.out(x, -1, False, out=o)
                            if f is torch.softmax
                            else torch.ops.aten._log_softmax.out(x, -1, False, out=o)
                        ),
                        bytes=2 * n,
                    )
                )
                if shape == SHAPES[0]:
                    bw = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
                    kw = "out" if log else "grad_input"  # aten names the out argument differently
                    rows.append(
                        Row(
                            FAMILY,
                            f"{name} bwd",
                            s,
                            dname,
                            ours=lambda dy=dy, y=y, o=out, lg=log: softmax_backward(dy, y, axis=-1, log=lg, out=o),
                            torch=lambda dy=dy, y=y, o=tout, b=bw, k=kw: b.out(dy, y, -1, dy.dtype, **{k: o}),
                            bytes=3 * n,
                        )
                    )
    return rows
