"""Host-time rows: one tiny-shape call per public L2 op, side by side with the PyTorch call that does the same work.

The shapes are tiny, so the GPU work is shorter than the host work and ``host µs`` is the per-call CPU cost
(argument checks, the op-level plan cache or descriptor lookup, output allocation, the cuDNN launch). Our
outputs go to ``out=`` where the op takes one (the path a loop uses); torch allocates from its caching
allocator, as eager code does. Ops with no torch equivalent (divisive normalization) have no torch side.
"""

from __future__ import annotations

from .harness import Row, register

FAMILY = "host"


@register
def host_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit import ops

    dev = "cuda"
    rows: list[Row] = []

    def row(name: str, shape: str, dtype: str, ours, theirs) -> None:
        rows.append(Row(FAMILY, name, shape, dtype, ours=ours, torch=theirs, notes="tiny shape: host-bound"))

    f32 = torch.float32
    x = torch.randn(4, 16, device=dev)
    y = torch.softmax(x, -1)
    dy = torch.randn_like(x)
    o = torch.empty_like(x)
    row("softmax_forward", "4x16", "float32", lambda: ops.softmax_forward(x, out=o), lambda: torch.softmax(x, -1))
    row(
        "softmax_backward",
        "4x16",
        "float32",
        lambda: ops.softmax_backward(dy, y, out=o),
        lambda: torch._softmax_backward_data(dy, y, -1, f32),
    )

    state = ops.default_state(x)
    _, reserve = ops.dropout_forward(x, 0.1, state=state)
    mask = torch.rand_like(x) > 0.1
    row(
        "dropout_forward",
        "4x16",
        "float32",
        lambda: ops.dropout_forward(x, 0.1, state=state, out=o),
        lambda: torch.native_dropout(x, 0.1, True),
    )
    row(
        "dropout_backward",
        "4x16",
        "float32",
        lambda: ops.dropout_backward(dy, reserve, 0.1, state=state, out=o),
        lambda: torch.ops.aten.native_dropout_backward(dy, mask, 1 / 0.9),
    )

    x4 = torch.randn(1, 8, 4, 4, device=dev)
    o4 = torch.empty_like(x4)
    y4 = ops.lrn_forward(x4)
    row("lrn_forward", "1x8x4x4", "float32", lambda: ops.lrn_forward(x4, out=o4), lambda: F.local_response_norm(x4, 5))
    row("lrn_backward", "1x8x4x4", "float32", lambda: ops.lrn_backward(x4, y4, x4, out=o4), None)
    row(
        "divisive_normalization_forward",
        "1x8x4x4",
        "float32",
        lambda: ops.divisive_normalization_forward(x4, out=o4),
        None,
    )

    theta = torch.randn(1, 2, 3, device=dev)
    size = (1, 8, 4, 4)
    grid = torch.empty(1, 4, 4, 2, device=dev)
    row(
        "affine_grid_forward",
        "1x2x3 -> 1x4x4x2",
        "float32",
        lambda: ops.affine_grid_forward(theta, size=size, out=grid),
        lambda: F.affine_grid(theta, size, align_corners=True),
    )
    g = torch.rand(1, 4, 4, 2, device=dev) * 2 - 1
    row(
        "grid_sample_forward",
        "1x8x4x4",
        "float32",
        lambda: ops.grid_sample_forward(x4, g, out=o4),
        lambda: F.grid_sample(x4, g, align_corners=True),
    )
    dx4, dg = torch.empty_like(x4), torch.empty_like(g)
    row(
        "grid_sample_backward",
        "1x8x4x4",
        "float32",
        lambda: ops.grid_sample_backward(x4, g, x4, dx_out=dx4, dgrid_out=dg),
        lambda: torch.ops.aten.grid_sampler_2d_backward(x4, x4, g, 0, 0, True, [True, True]),
    )

    t = torch.randn(1, 1, 1, 8, device=dev)
    c = torch.randn(1, 1, 1, 8, device=dev)
    row("set_tensor", "1x1x1x8", "float32", lambda: ops.set_tensor(t, 1.5), lambda: t.fill_(1.5))
    row("scale_tensor", "1x1x1x8", "float32", lambda: ops.scale_tensor(t, 1.0), lambda: t.mul_(1.0))
    row("add_tensor", "1x1x1x8", "float32", lambda: ops.add_tensor(t, c), lambda: c.add_(t))
    nhwc = torch.empty(1, 8, 4, 4, device=dev).to(memory_format=torch.channels_last)
    row(
        "transform_tensor",
        "1x8x4x4 NCHW->NHWC",
        "float32",
        lambda: ops.transform_tensor(x4, out=nhwc),
        lambda: nhwc.copy_(x4),
    )

    rnn = ops.RNN("lstm", 16, 16, dtype="float32")
    mod = torch.nn.LSTM(16, 16).to(dev)
    w = ops.load_torch_params(rnn, {k: v.detach() for k, v in mod.named_parameters()})
    xs = torch.randn(2, 1, 16, device=dev)

    def torch_lstm():
        with torch.no_grad():
            mod(xs)

    mod.eval()
    row("rnn_forward (LSTM inference)", "T2 N1 I16 H16", "float32", lambda: ops.rnn_forward(xs, w, rnn=rnn), torch_lstm)
    return rows
