"""``scaled_dot_product_attention`` with torch.nn.functional's name and semantics: the L3 op ``sdpa``
(:mod:`cudnnkit.ops.attention`: cuDNN's graph API, the fused-attention pattern), through
``cudnnkit.torch.op("sdpa")`` for torch tensors (a custom op: autograd, ``torch.compile(fullgraph=True)``) and the
declaration's forward for CuPy arrays."""

from __future__ import annotations

from typing import Any

from ._common import call1, check_dtype, real

__all__ = ["scaled_dot_product_attention"]


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
    """torch's SDPA (float16/bfloat16, causal or no mask, ``(B, H, S, D)`` or ``(B, S, D)``; ``enable_gqa`` with one
    shared key/value head): L3 ``sdpa`` (the graph's ``sdpa_forward``/``sdpa_backward``); a 3-d call runs as one
    head."""
    check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    scale = None if scale is None else real(scale, "scale")
    three = query.ndim == 3
    q, k, v = ((a[:, None] if three else a) for a in (query, key, value))
    o = call1("sdpa", q, k, v, scale=scale, causal=bool(is_causal))
    return o[:, 0] if three else o
