"""Scaled dot-product attention on cuDNN's fused flash-attention graph (``ops.sdpa_forward``/``sdpa_backward``),
with torch bfloat16 tensors: causal forward and backward, checked against a float64 reference computed by torch on
the CPU (the gradients through torch's autograd of the plain formula).

Run on a machine with a CUDA GPU (Hopper or Ampere and newer) and PyTorch: ``python examples/sdpa.py``.
"""

from __future__ import annotations

import math

import torch

from cudnnkit import ops


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """o = softmax(q k^T / sqrt(D) + causal mask) v, and its vector-Jacobian product with do, in float64 on the CPU."""
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    o = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do.cpu().double())
    return o.detach(), dq, dk, dv


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.detach().cpu().double()
    return float((a - ref).norm() / ref.norm())


def main() -> None:
    torch.manual_seed(0)
    B, H, S, D = 2, 4, 256, 64
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, stats = ops.sdpa_forward(q, k, v, causal=True)  # training=True: the softmax statistics for the backward
    do = torch.randn_like(o)
    dq, dk, dv = ops.sdpa_backward(q, k, v, o, do, stats, causal=True)
    ro, rdq, rdk, rdv = reference(q, k, v, do)
    errs = {"o": rel(o, ro), "dq": rel(dq, rdq), "dk": rel(dk, rdk), "dv": rel(dv, rdv)}
    assert all(e < 2e-2 for e in errs.values()), errs  # bfloat16 inputs and outputs
    print("causal SDPA, B2 H4 S256 D64 bf16; relative errors against float64: "
          + ", ".join(f"{k} {e:.1e}" for k, e in errs.items()))  # fmt: skip


if __name__ == "__main__":
    main()
