"""Normalization rows (issue 12): ``cudnnkit.ops.batch_norm_forward`` training on 64x256x56x56 float16
channels-last, plain and fused with the residual add and ReLU, under ``settings(prefer="graph")`` (NORM_FORWARD,
then ADD and RELU_FWD) and under ``settings(prefer="legacy")`` (``cudnnBatchNormalizationForwardTrainingEx``), against
torch's ``F.batch_norm`` (and ``relu(bn(x) + z)`` eager); memory-bound (``bytes``: x read twice, z once, y
written); ``ops.last_path()`` is checked after each call, so a row whose path did not run errs instead of timing
another. The small CNN's float32 batch norm on the graph (host-bound), and a layer norm row (graph)."""

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

    def on_path(fn, path, prefer="auto"):
        """``fn`` under ``settings(prefer=prefer)``, failing (the row's error) where ``path`` did not run."""

        def call():
            with cudnnkit.settings(prefer=prefer):
                got = fn()
            if ops.last_path() != ("batch_norm_forward", path):
                raise RuntimeError(f"batch norm's {path} form did not run: {ops.last_path()}")
            return got

        return call

    plain = lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv)  # noqa: E731
    fused = lambda: ops.batch_norm_forward(x, s, b, running_mean=rm, running_var=rv, z=z, activation="relu")  # noqa: E731
    xs = torch.randn(64, 32, 32, 32, device="cuda").contiguous(memory_format=cl)
    ss, bs = torch.ones(32, device="cuda"), torch.zeros(32, device="cuda")
    rms, rvs = torch.zeros(32, device="cuda"), torch.ones(32, device="cuda")
    trms, trvs = rms.clone(), rvs.clone()
    return [
        Row(
            FAMILY,
            "batch norm training fwd, graph form",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_path(plain, "graph", "graph"),
            torch=lambda: F.batch_norm(x, trm, trv, s, b, training=True),
            bytes=3 * n * isz,
            notes="settings(prefer='graph'): NORM_FORWARD (the row errs if it did not run)",
        ),
        Row(
            FAMILY,
            "batch norm + add + relu fwd, graph form",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_path(fused, "graph", "graph"),
            torch=lambda: F.relu(F.batch_norm(x, trm, trv, s, b, training=True) + z),
            bytes=4 * n * isz,
            notes="settings(prefer='graph'): NORM_FORWARD -> ADD -> RELU_FWD, one graph; torch: 3 kernels eager",
        ),
        Row(
            FAMILY,
            "batch norm training fwd, Ex call",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_path(plain, "legacy", "legacy"),
            torch=lambda: F.batch_norm(x, trm, trv, s, b, training=True),
            bytes=3 * n * isz,
            notes='settings(prefer="legacy"): cudnnBatchNormalizationForwardTrainingEx',
        ),
        Row(
            FAMILY,
            "batch norm + add + relu fwd, Ex call",
            "64x256x56x56 NHWC",
            "float16",
            ours=on_path(fused, "legacy", "legacy"),
            torch=lambda: F.relu(F.batch_norm(x, trm, trv, s, b, training=True) + z),
            bytes=4 * n * isz,
            notes='settings(prefer="legacy"): one cudnnBatchNormalizationForwardTrainingEx (BN_ADD_ACTIVATION)',
        ),
        Row(
            FAMILY,
            "batch norm training fwd, graph form (small CNN's)",
            "64x32x32x32 NHWC",
            "float32",
            ours=on_path(
                lambda: ops.batch_norm_forward(xs, ss, bs, running_mean=rms, running_var=rvs), "graph", "graph"
            ),
            torch=lambda: F.batch_norm(xs, trms, trvs, ss, bs, training=True),
            bytes=3 * xs.numel() * 4,
            notes="host-bound: the graph form's host time per call (prefer='graph') against torch's",
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
