"""Graph-API rows for pooling and batch norm: ``Graph.resample_forward`` and ``Graph.norm_forward``
(pre-bound plans) against ``torch.nn.functional.max_pool2d`` and ``batch_norm`` on channels-last fp16.

Bytes are the fewest that must move: pooling reads x and writes y; batch-norm training reads x
twice (statistics, then normalization) and writes y.
"""

from __future__ import annotations

from .harness import Row, register

FAMILY = "graph_nodes"
N, C, HW = 64, 256, 56


@register
def graph_node_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit.graph import Graph

    rows: list[Row] = []
    x = torch.randn(N, C, HW, HW, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    shape = f"{N}x{C}x{HW}x{HW} NHWC"

    g = Graph(name="max_pool 3x3/2")
    tx = g.tensor_like(x)
    ty = g.mark_output(g.resample_forward(tx, window=3, stride=2, pre_padding=1))
    y = torch.empty(ty.dims, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    pool = g.build().bind({tx: x, ty: y})
    rows.append(
        Row(
            FAMILY,
            "max_pool 3x3/2 pad1",
            shape,
            "float16",
            ours=pool,
            torch=lambda: F.max_pool2d(x, 3, 2, 1),
            bytes=2 * (x.numel() + y.numel()),
        )
    )

    scale, bias = torch.ones(1, C, 1, 1, device="cuda"), torch.zeros(1, C, 1, 1, device="cuda")
    rmean, rvar = torch.zeros(1, C, 1, 1, device="cuda"), torch.ones(1, C, 1, 1, device="cuda")
    g = Graph(name="batch norm train")
    tx = g.tensor_like(x)
    ts, tb, trm, trv = (g.tensor_like(t) for t in (scale, bias, rmean, rvar))
    r = g.norm_forward("batch", tx, ts, tb, epsilon=1e-5, momentum=0.1, running_mean=trm, running_var=trv)
    yb = torch.empty_like(x)
    stats = [torch.empty(1, C, 1, 1, device="cuda") for _ in range(4)]
    bind = {tx: x, ts: scale, tb: bias, trm: rmean, trv: rvar, g.mark_output(r.y): yb}
    bind.update({g.mark_output(t): a for t, a in zip(r[1:], stats)})
    bn = g.build().bind(bind)
    trm_t, trv_t = rmean.flatten().clone(), rvar.flatten().clone()
    rows.append(
        Row(
            FAMILY,
            "batch_norm train (running stats)",
            shape,
            "float16",
            ours=bn,
            torch=lambda: F.batch_norm(x, trm_t, trv_t, scale.flatten(), bias.flatten(), True, 0.1, 1e-5),
            bytes=3 * x.numel() * 2,
        )
    )
    return rows
