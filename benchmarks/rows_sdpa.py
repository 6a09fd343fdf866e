"""Attention rows: ``Graph.sdpa_forward``/``sdpa_backward`` (cuDNN's fused attention through the graph
API, executed through a pre-bound plan) against ``torch.nn.functional.scaled_dot_product_attention``
with torch's cuDNN backend and with its flash backend.

bf16, B4 H16 S4096 D128 (BHSD), causal and not. FLOPs: forward ``4*B*H*S^2*D`` (halved when causal),
backward 2.5x the forward. ``fwd`` rows are inference (no statistics written; torch without grad);
``fwd+bwd`` rows run the training forward (writing the log-sum-exp statistics) and the backward.
Ours is the fused-attention composite; one more row times the single ``SDPA_FWD`` operation
(``implementation="unified"``, no mask in cuDNN 9.19).
"""

from __future__ import annotations

from .harness import Row, or_error, register

FAMILY = "sdpa"
B, H, S, D = 4, 16, 4096, 128


@register
def sdpa_rows() -> list[Row]:
    return _rows(False) + _rows(True)


def _rows(causal: bool) -> list[Row]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cudnnkit.graph import Graph

    shape = f"B{B} H{H} S{S} D{D}"
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    o = torch.empty_like(q)
    stats = torch.empty(B, H, S, 1, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def forward_plan(with_stats: bool, implementation: str = "composite"):
        g = Graph(name=f"sdpa fwd causal={causal}")
        tq, tk, tv = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        r = g.sdpa_forward(tq, tk, tv, causal=causal, stats=with_stats, implementation=implementation)
        bind = {tq: q, tk: k, tv: v, g.mark_output(r.o): o}
        if with_stats:
            bind[g.mark_output(r.stats)] = stats
        return g.build().bind(bind)

    def backward_plan():
        gb = Graph(name=f"sdpa bwd causal={causal}")
        tq, tk, tv, to, tdo = (gb.tensor_like(t) for t in (q, k, v, o, do))
        tst = gb.tensor_like(stats)
        r = gb.sdpa_backward(tq, tk, tv, to, tdo, tst, causal=causal)
        bind = {
            tq: q,
            tk: k,
            tv: v,
            to: o,
            tdo: do,
            tst: stats,
            gb.mark_output(r.dq): dq,
            gb.mark_output(r.dk): dk,
            gb.mark_output(r.dv): dv,
        }  # outputs marked before the build
        return gb.build().bind(bind)

    infer, train, bwd = or_error(forward_plan, False), or_error(forward_plan, True), or_error(backward_plan)
    try:
        train()  # o and stats for the backward
    except Exception:  # recorded on the row that uses it
        pass

    def ours_train():
        train()
        bwd()

    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def torch_fwd(be):
        with torch.no_grad(), sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def torch_train(be):
        with sdpa_kernel(be):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(out, (qg, kg, vg), do)

    fwd_flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
    tag = " causal" if causal else ""
    rows: list[Row] = []
    for backend, bname in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        rows.append(
            Row(
                FAMILY,
                f"sdpa fwd{tag} vs torch-{bname}",
                shape,
                "bfloat16",
                ours=infer,
                torch=lambda be=backend: torch_fwd(be),
                flops=fwd_flops,
            )
        )
        rows.append(
            Row(
                FAMILY,
                f"sdpa fwd+bwd{tag} vs torch-{bname}",
                shape,
                "bfloat16",
                ours=ours_train,
                torch=lambda be=backend: torch_train(be),
                flops=3.5 * fwd_flops,
            )
        )
    if not causal:  # cuDNN 9.19's single SDPA_FWD operation takes no mask
        unified = or_error(forward_plan, False, "unified")
        rows.append(
            Row(
                FAMILY,
                "sdpa fwd (SDPA_FWD op) vs torch-cudnn",
                shape,
                "bfloat16",
                ours=unified,
                torch=lambda: torch_fwd(SDPBackend.CUDNN_ATTENTION),
                flops=fwd_flops,
            )
        )
    return rows
