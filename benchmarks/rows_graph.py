"""Graph-API rows: cudnnkit.graph execution plans against PyTorch eager.

* host overhead per execute of a cached plan on a tiny conv (1x8x8x8 fp16 NHWC),
  through the pre-bound fast path (``plan.bind(...)()``) and the dict-binding
  path (``plan.execute({...})``), against torch ``F.conv2d`` on the same tensors;
* build time of a plan (the row's notes): the first build in the process, a
  new shape once engines are loaded, and a cache hit;
* conv3x3 64->64, 56x56, batch 64, bf16 NHWC, plain and fused with bias + ReLU,
  against ``F.conv2d`` (and ``F.relu(F.conv2d(x, w, b))``);
* matmul + bias + GELU, 4096x4096x4096 bf16, against ``F.gelu(a @ b + bias)``.

Outputs are preallocated on our side (bound into the plan); torch allocates
its outputs from its caching allocator, as eager code does.
"""

from __future__ import annotations

import time

from .harness import Row, register

FAMILY = "graph"


def _conv_graph(torch, n, c, k, h, dtype, *, bias_relu=False):
    from cudnnkit.graph import Graph

    x = torch.randn(n, c, h, h, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    w = (torch.randn(k, c, 3, 3, device="cuda", dtype=dtype) * 0.1).to(memory_format=torch.channels_last)
    b = torch.randn(1, k, 1, 1, device="cuda", dtype=dtype)
    g = Graph(name=f"conv{n}x{c}x{h}")
    tx, tw = g.tensor_like(x, "x"), g.tensor_like(w, "w")
    y = g.conv_fprop(tx, tw, pre_padding=1)
    binds = {tx: x, tw: w}
    if bias_relu:
        tb = g.tensor_like(b, "b")
        y = g.pointwise("RELU_FWD", g.pointwise("ADD", y, tb))
        binds[tb] = b
    ty = g.mark_output(y, str(dtype).removeprefix("torch."))
    out = torch.empty_strided(ty.dims, ty.strides, dtype=dtype, device="cuda")
    binds[ty] = out
    return g, binds, x, w, b


@register
def graph_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit.graph import Graph

    rows: list[Row] = []

    # build times: first build in the process, a new shape afterwards, a cache hit
    t0 = time.perf_counter()
    g, binds, x, w, b = _conv_graph(torch, 64, 64, 64, 56, torch.bfloat16)
    plan = g.build()
    cold = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    g2, _, *_ = _conv_graph(torch, 32, 64, 128, 28, torch.bfloat16)
    g2.build()
    warm = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    g3, *_ = _conv_graph(torch, 64, 64, 64, 56, torch.bfloat16)
    g3.build()
    hit = (time.perf_counter() - t0) * 1e6
    build_note = f"build: first {cold:.0f} ms, new shape {warm:.0f} ms, cache hit {hit:.0f} us (incl. tensor setup)"
    print(f"  {build_note}", flush=True)

    # host overhead on a tiny conv
    tg, tbinds, tx, tw, _ = _conv_graph(torch, 1, 8, 8, 8, torch.float16)
    tplan = tg.build()
    bound = tplan.bind(tbinds)
    rows.append(
        Row(
            FAMILY,
            "conv execute, prebound",
            "1x8x8x8 k8",
            "float16",
            ours=bound,
            torch=lambda: F.conv2d(tx, tw, padding=1),
            notes=f"plan {tplan.name}; {build_note}",
        )
    )
    rows.append(
        Row(
            FAMILY,
            "conv execute, dict bindings",
            "1x8x8x8 k8",
            "float16",
            ours=lambda: tplan.execute(tbinds),
            torch=lambda: F.conv2d(tx, tw, padding=1),
        )
    )
    rows.append(
        Row(
            FAMILY,
            "conv graph.execute (key + cache)",
            "1x8x8x8 k8",
            "float16",
            ours=lambda: tg.execute(tbinds),
            torch=lambda: F.conv2d(tx, tw, padding=1),
        )
    )

    # conv3x3 64->64 56x56 batch 64 bf16 NHWC, plain and fused
    flops = 2.0 * 64 * 64 * 64 * 9 * 56 * 56
    rows.append(
        Row(
            FAMILY,
            "conv3x3 fprop",
            "64x64x56x56 k64",
            "bfloat16",
            ours=plan.bind(binds),
            torch=lambda: F.conv2d(x, w, padding=1),
            flops=flops,
            notes=f"plan {plan.name}",
        )
    )
    fg, fbinds, fx, fw, fb = _conv_graph(torch, 64, 64, 64, 56, torch.bfloat16, bias_relu=True)
    fplan = fg.build()
    fb4 = fb.reshape(64)
    rows.append(
        Row(
            FAMILY,
            "conv3x3+bias+relu fused",
            "64x64x56x56 k64",
            "bfloat16",
            ours=fplan.bind(fbinds),
            torch=lambda: F.relu(F.conv2d(fx, fw, fb4, padding=1)),
            flops=flops,
            notes=f"plan {fplan.name}",
        )
    )

    # matmul + bias + GELU, bf16
    m = k = n = 4096
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    bm = torch.randn(1, k, n, device="cuda", dtype=torch.bfloat16) * 0.02
    bias = torch.randn(1, 1, n, device="cuda", dtype=torch.bfloat16)
    mg = Graph(name="matmul_bias_gelu")
    ta, tb, tbias = mg.tensor_like(a, "a"), mg.tensor_like(bm, "b"), mg.tensor_like(bias, "bias")
    ty = mg.mark_output(mg.pointwise("GELU_FWD", mg.pointwise("ADD", mg.matmul(ta, tb), tbias)), "bfloat16")
    mout = torch.empty(ty.dims, dtype=torch.bfloat16, device="cuda")
    mplan = mg.build()
    rows.append(
        Row(
            FAMILY,
            "matmul+bias+gelu fused",
            f"{m}x{k}x{n}",
            "bfloat16",
            ours=mplan.bind({ta: a, tb: bm, tbias: bias, ty: mout}),
            torch=lambda: F.gelu(torch.matmul(a, bm) + bias),
            flops=2.0 * m * k * n,
            notes=f"plan {mplan.name}",
        )
    )
    return rows
