"""``scaled_dot_product_attention`` with torch.nn.functional's name and semantics, on cuDNN's graph API (the
fused-attention pattern of :meth:`cudnnkit.graph.Graph.sdpa_forward` / ``sdpa_backward``; there is no L2 op)."""

from __future__ import annotations

from typing import Any

from ..runtime import adapters
from ..runtime.arrays import as_view
from ._common import check_dtype, contiguous, library, real

__all__ = ["scaled_dot_product_attention"]

_torch_fn: Any = None


def _new(like: Any, t: Any) -> Any:
    """An array for graph tensor ``t`` (its dims, strides, dtype), of ``like``'s library and device."""
    return adapters.for_object(like).empty(tuple(t.dims), t.dtype, as_view(like, "query").device, tuple(t.strides))


def _head_dense(a: Any) -> Any:
    """``a`` with its last dim contiguous (what the graph takes; a copy otherwise)."""
    step = a.stride(-1) if library(a) == "torch" else a.strides[-1] // a.itemsize
    return a if a.shape[-1] == 1 or step == 1 else contiguous(a)


def sdpa_graph_forward(q: Any, k: Any, v: Any, scale: float | None, causal: bool) -> tuple[Any, Any]:
    """``(o, stats)``: one graph ``sdpa_forward`` (matmul, pointwise, reduction nodes) built (plan cached) and run."""
    from ..graph import Graph

    g = Graph(name="nn_sdpa_forward")
    tq, tk, tv = g.tensor_like(q, "q"), g.tensor_like(k, "k"), g.tensor_like(v, "v")
    r = g.sdpa_forward(tq, tk, tv, scale=scale, causal=causal)
    to, ts = g.mark_output(r.o), g.mark_output(r.stats)
    o, st = _new(q, to), _new(q, ts)
    g.execute({tq: q, tk: k, tv: v, to: o, ts: st})
    return o, st


def sdpa_graph_backward(q: Any, k: Any, v: Any, o: Any, do: Any, st: Any, scale: float | None,
                        causal: bool) -> tuple[Any, Any, Any]:  # fmt: skip
    """``(dq, dk, dv)``: one graph ``sdpa_backward`` built (plan cached) and run."""
    from ..graph import Graph

    g = Graph(name="nn_sdpa_backward")
    t = {n: g.tensor_like(a, n) for n, a in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do), ("stats", st))}
    r = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["do"], t["stats"], scale=scale, causal=causal)
    outs = [g.mark_output(x) for x in r]
    grads = [_new(q, x) for x in outs]
    g.execute({**{t[n]: a for n, a in (("q", q), ("k", k), ("v", v), ("o", o), ("do", do), ("stats", st))},
               **dict(zip(outs, grads))})  # fmt: skip
    return tuple(grads)


def _torch_function() -> Any:
    """The ``torch.autograd.Function`` over the two graphs (made on first use: torch is imported then)."""
    global _torch_fn
    if _torch_fn is None:
        import torch

        class SDPA(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, q: Any, k: Any, v: Any, scale: Any, causal: bool) -> Any:
                o, st = sdpa_graph_forward(q, k, v, scale, causal)
                ctx.save_for_backward(q, k, v, o, st)
                ctx.scale, ctx.causal = scale, causal
                return o

            @staticmethod
            def backward(ctx: Any, do: Any) -> Any:
                q, k, v, o, st = ctx.saved_tensors
                dq, dk, dv = sdpa_graph_backward(q, k, v, o, do.contiguous(), st, ctx.scale, ctx.causal)
                return dq, dk, dv, None, None

        _torch_fn = SDPA
    return _torch_fn


def check_sdpa(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: Any,
               enable_gqa: Any) -> None:  # fmt: skip
    """What cuDNN's graph attention cannot do, each a ``NotImplementedError`` naming the argument."""
    if attn_mask is not None:
        raise NotImplementedError("scaled_dot_product_attention: attn_mask: cuDNN's graph attention here takes the "
                                  "causal mask (is_causal=True) only")  # fmt: skip
    if real(dropout_p, "dropout_p") != 0.0:
        raise NotImplementedError(f"scaled_dot_product_attention: dropout_p={dropout_p}: the graph's attention "
                                  "dropout needs seed/offset device tensors, not wired to torch's RNG")  # fmt: skip
    for name, a in (("query", query), ("key", key), ("value", value)):
        check_dtype(a, ("float16", "bfloat16"), name, "cuDNN's fused attention")
        if a.ndim not in (3, 4):
            raise NotImplementedError(f"scaled_dot_product_attention: {name} of shape {tuple(a.shape)}: cuDNN's "
                                      "attention is (B, H, S, D) (or (B, S, D))")  # fmt: skip
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError("scaled_dot_product_attention: query, key and value must have the same number of dims")
    if query.ndim == 4:
        h, hk, hv = query.shape[1], key.shape[1], value.shape[1]
        if (hk != h or hv != h) and not enable_gqa:
            raise ValueError(f"scaled_dot_product_attention: query has {h} heads, key {hk}, value {hv}: pass "
                             "enable_gqa=True for grouped-query attention")  # fmt: skip
        if (hk, hv) not in ((h, h), (1, 1)):
            raise NotImplementedError(f"scaled_dot_product_attention: enable_gqa with {hk}/{hv} key/value heads for "
                                      f"{h} query heads: cuDNN's head grouping is pinned here for one shared head "
                                      "only")  # fmt: skip


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
    """torch's SDPA (fp16/bf16, causal or no mask): no L3 op; graph ``sdpa_forward``/``sdpa_backward`` executed."""
    check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    scale = None if scale is None else real(scale, "scale")
    three = query.ndim == 3
    q, k, v = (_head_dense(a[:, None] if three else a) for a in (query, key, value))
    if library(q) == "torch":
        o = _torch_function().apply(q, k, v, scale, bool(is_causal))
    else:
        o = sdpa_graph_forward(q, k, v, scale, bool(is_causal))[0]
    return o[:, 0] if three else o
