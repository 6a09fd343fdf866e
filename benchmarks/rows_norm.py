"""Normalization rows (issue 12): ``cudnnkit.ops.batch_norm_forward`` (legacy) training on 64x256x56x56 float16
channels-last, plain and fused with the residual add and ReLU (``cudnnBatchNormalizationForwardTrainingEx``),
against torch's ``F.batch_norm`` (and ``relu(bn(x) + z)`` eager); memory-bound (``bytes``: x read twice, z once,
y written), the same two under ``settings(prefer="graph")`` (batch norm's graph form: NORM_FORWARD, then ADD and
RELU_FWD; ``ops.last_path()`` is checked after each call, so a row that fell back to the legacy calls errs instead
of timing them), and a layer norm row (graph)."""

from __future__ import annotations

from .harness import Row, register

FAMILY = "norm"


@register
def norm_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit import ops

    torch.backends.cudnn.benchmark = True
    cl = torch.channels_last
    x = torch.randn(64, 256, 56, 56, device="cuda", dtype=torch.float16).contiguous(memory_format=cl)
    z = torch.randn_like(x)
    s = torch.ones(256, device="cuda")
    b = torch.zeros(256, device="cuda")
    rm, rv = torch.zeros(256, device="cuda"), torch.ones(256, device="cuda")
    trm, trv = rm.clone(), rv.clone()
    isz = x.element_size()
    n = x.numel()
    h = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    hs, hb = torch.ones(1024, device="cuda"), torch.zeros(1024, device="cuda")
    import cudnnkit

    def on_graph(fn):
        """``fn`` under ``settings(prefer="graph")``, failing (the row's error) where the graph form did not run."""

        def call():
            with cudnnkit.settings(prefer="graph"):
                got = fn()
            if ops.last_path() != ("batch_norm_forward", "graph"):
                raise RuntimeError(f"batch norm's graph form did not run: {ops.last_path()}")
            return got

        return call

    graph_rows = [
        Row(
            FAMILY,
            "batch norm training fwd, graph form",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_graph(lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv)),
            torch=lambda: F.batch_norm(x, trm, trv, s, b, training=True),
            bytes=3 * n * isz,
            notes='settings(prefer="graph"): NORM_FORWARD (the context manager adds ~2 us of host time)',
        ),
        Row(
            FAMILY,
            "batch norm + add + relu fwd, graph form",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_graph(
                lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv, z=z, activation="relu")
            ),
            torch=lambda: F.relu(F.batch_norm(x, trm, trv, s, b, training=True) + z),
            bytes=4 * n * isz,
            notes='settings(prefer="graph"): NORM_FORWARD -> ADD -> RELU_FWD, one graph',
        ),
    ]
    return graph_rows + [
        Row(
            FAMILY,
            "batch norm training fwd",
            "64x256x56x56 NHWC",
            "float16",
            ours=lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv),
            torch=lambda: F.batch_norm(x, trm, trv, s, b, training=True),
            bytes=3 * n * isz,
        ),
        Row(
            FAMILY,
            "batch norm + add + relu fwd",
            "64x256x56x56 NHWC",
            "float16",
            ours=lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv, z=z, activation="relu"),
            torch=lambda: F.relu(F.batch_norm(x, trm, trv, s, b, training=True) + z),
            bytes=4 * n * isz,
            notes="ours: one cudnnBatchNormalizationForwardTrainingEx (BN_ADD_ACTIVATION); torch: 3 kernels eager",
        ),
        Row(
            FAMILY,
            "layer norm training fwd",
            "8192x1024",
            "bfloat16",
            ours=lambda: ops.layer_norm_forward(h, hs.to(torch.float32), hb),
            torch=lambda: F.layer_norm(h, (1024,), hs.to(torch.bfloat16), hb.to(torch.bfloat16)),
            bytes=2 * h.numel() * h.element_size(),
        ),
    ]
