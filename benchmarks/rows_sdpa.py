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

from types import SimpleNamespace
from typing import Any

from .harness import Row, or_error, register

FAMILY = "sdpa"
B, H, S, D = 4, 16, 4096, 128


@register
def sdpa_rows() -> list[Row]:
    return _rows(False) + _rows(True)


def bf16_case(b: int, h: int, s: int, d: int, *, name: str, causal: bool, **mask: Any) -> SimpleNamespace:
    """One bf16 BHSD attention shape (random q, k, v, do from seed 0) and its timed calls, shared by the attention
    row modules: ``plan(with_stats, implementation)`` (a pre-bound forward graph), ``infer`` (the forward without
    statistics), ``ours_train`` (forward with statistics, then the pre-bound backward graph), and torch's
    ``torch_fwd(backend)`` / ``torch_train(backend)`` (``F.scaled_dot_product_attention`` under ``sdpa_kernel``,
    ``is_causal=causal``: torch runs no other mask), and the arrays those plans read and write (``q``, ``k``, ``v``,
    ``do``, ``o``, ``stats``, ``dq``, ``dk``, ``dv``; ``stats`` float32 ``(b, h, s, 1)``), for another library's calls
    on the same buffers. ``mask`` goes to ``sdpa_forward``/``sdpa_backward`` (``left_bound=``, ...). A plan cuDNN
    refuses fails only the calls that use it (:func:`or_error`)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from cudnnkit.graph import Graph

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    o = torch.empty_like(q)
    stats = torch.empty(b, h, s, 1, device="cuda", dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def plan(with_stats: bool, implementation: str = "composite"):
        g = Graph(name=f"{name} fwd")
        tq, tk, tv = g.tensor_like(q), g.tensor_like(k), g.tensor_like(v)
        r = g.sdpa_forward(tq, tk, tv, causal=causal, stats=with_stats, implementation=implementation, **mask)
        bind = {tq: q, tk: k, tv: v, g.mark_output(r.o): o}
        if with_stats:
            bind[g.mark_output(r.stats)] = stats
        return g.build().bind(bind)

    def backward_plan():
        g = Graph(name=f"{name} bwd")
        tq, tk, tv, to, tdo = (g.tensor_like(t) for t in (q, k, v, o, do))
        tst = g.tensor_like(stats)
        r = g.sdpa_backward(tq, tk, tv, to, tdo, tst, causal=causal, **mask)
        outs = {g.mark_output(r.dq): dq, g.mark_output(r.dk): dk, g.mark_output(r.dv): dv}  # before the build
        return g.build().bind({tq: q, tk: k, tv: v, to: o, tdo: do, tst: stats, **outs})

    infer, train, bwd = or_error(plan, False), or_error(plan, True), or_error(backward_plan)
    try:
        train()  # o and stats for the backward
    except Exception:  # recorded on the row that uses it
        pass

    def ours_train():
        train()
        bwd()

    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

    def torch_fwd(backend):
        with torch.no_grad(), sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def torch_train(backend):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(out, (qg, kg, vg), do)

    return SimpleNamespace(plan=plan, infer=infer, ours_train=ours_train, torch_fwd=torch_fwd, torch_train=torch_train,
                           q=q, k=k, v=v, do=do, o=o, stats=stats, dq=dq, dk=dk, dv=dv)  # fmt: skip


def _rows(causal: bool) -> list[Row]:
    from torch.nn.attention import SDPBackend

    shape = f"B{B} H{H} S{S} D{D}"
    c = bf16_case(B, H, S, D, name=f"sdpa causal={causal}", causal=causal)
    infer, ours_train, torch_fwd, torch_train = c.infer, c.ours_train, c.torch_fwd, c.torch_train
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
        unified = or_error(c.plan, False, "unified")
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
