"""``scaled_dot_product_attention`` with torch.nn.functional's name and semantics: the L3 ops ``sdpa`` (plain or
causal, one query head group) and ``attention`` (an additive ``attn_mask``, any grouping of key/value heads)
(:mod:`cudnnkit.ops.attention`: cuDNN's graph API, the fused-attention pattern), through
``cudnnkit.torch.op(...)`` for torch tensors (a custom op: autograd, ``torch.compile(fullgraph=True)``) and the
declaration's forward for CuPy arrays."""

from __future__ import annotations

from typing import Any

from ._common import broadcast_to, call1, check_dtype, dropout_seed, dtype_of, real

__all__ = ["scaled_dot_product_attention"]


def dropout_probability(dropout_p: Any) -> float:
    """``dropout_p`` as a float in ``[0, 1)``: ``TypeError`` for a non-number, ``ValueError`` outside ``[0, 1]``
    (NaN too), ``NotImplementedError`` for 1 (cuDNN's attention dropout scales what it keeps by ``1 / (1 - p)``;
    torch's returns zeros)."""
    p = real(dropout_p, "dropout_p")
    if not 0.0 <= p <= 1.0:  # also NaN
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1], got {dropout_p}")
    if p == 1.0:
        raise NotImplementedError("scaled_dot_product_attention: dropout_p=1.0: cuDNN's attention dropout scales "
                                  "what it keeps by 1 / (1 - p) (torch's returns zeros)")  # fmt: skip
    return p


def check_sdpa(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: Any,
               enable_gqa: Any) -> float:  # fmt: skip
    """What this API does not pass to cuDNN's graph attention, each a ``NotImplementedError`` naming the argument;
    torch's own argument errors as ``ValueError``. Returns ``dropout_p`` as a float."""
    if attn_mask is not None:
        if dtype_of(attn_mask) == "bool":
            raise NotImplementedError("scaled_dot_product_attention: a boolean attn_mask: cuDNN's attention adds a "
                                      "bias; pass an additive float mask (0 where kept, -inf where masked)")  # fmt: skip
        check_dtype(attn_mask, ("float16", "bfloat16", "float32"), "attn_mask", "cuDNN's fused attention")
        if is_causal:
            raise ValueError("scaled_dot_product_attention: attn_mask and is_causal=True together (torch refuses "
                             "them; cudnnkit.ops.attention_forward takes both)")  # fmt: skip
    p = dropout_probability(dropout_p)
    for name, a in (("query", query), ("key", key), ("value", value)):
        check_dtype(a, ("float16", "bfloat16"), name, "cuDNN's fused attention")
        if a.ndim not in (3, 4):
            raise NotImplementedError(f"scaled_dot_product_attention: {name} of shape {tuple(a.shape)}: cuDNN's "
                                      "attention is (B, H, S, D) (or (B, S, D))")  # fmt: skip
    if not query.ndim == key.ndim == value.ndim:
        raise ValueError("scaled_dot_product_attention: query, key and value must have the same number of dims")
    if query.ndim == 4:
        h, hk, hv = query.shape[1], key.shape[1], value.shape[1]
        # one key/value head broadcasts over the query's as torch broadcasts it (no enable_gqa needed)
        if (hk != h or hv != h) and not enable_gqa and not hk == hv == 1:
            raise ValueError(f"scaled_dot_product_attention: query has {h} heads, key {hk}, value {hv}: pass "
                             "enable_gqa=True for grouped-query attention")  # fmt: skip
        if hk != hv or h % hk:
            raise ValueError(f"scaled_dot_product_attention: enable_gqa needs key and value with one head count "
                             f"dividing the query's {h}, got {hk} and {hv}")  # fmt: skip
    return p


def _expand_rows(mask: Any, sq_skv: tuple[int, int]) -> Any:
    """A mask broadcast in its last two dims (a key-padding ``(B, 1, 1, S_kv)``) as a view of ``(..., S_q,
    S_kv)`` (cuDNN's mask broadcasts over batch and heads only; the op copies the view to the packed layout it
    reads)."""
    last = (1,) * (2 - mask.ndim) + tuple(mask.shape)[-2:]  # a 1-d mask (S_kv,) is a row: (1, S_kv)
    if any(d not in (1, want) for d, want in zip(last, sq_skv)):
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {tuple(mask.shape)} does not broadcast "
                         f"to (..., S_q, S_kv) = (..., {sq_skv[0]}, {sq_skv[1]})")  # fmt: skip
    return broadcast_to(mask, (*mask.shape[:-2], *sq_skv))


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
    """torch's SDPA on cuDNN (float16/bfloat16, ``(B, H, S, D)`` or ``(B, S, D)``): L3 ``sdpa`` (the graph's
    ``sdpa_forward``/``sdpa_backward``) for no mask or the causal one with ``H_kv`` equal to ``H`` or 1, L3
    ``attention`` (``attention_forward``/``attention_backward``) for an additive float ``attn_mask``
    (broadcastable as torch's: ``(S_q, S_kv)``, ``(1|H, S_q, S_kv)``, ``(1|B, 1|H, S_q, S_kv)``, and a mask of
    size 1 in ``S_q`` or ``S_kv``, such as a key-padding ``(B, 1, 1, S_kv)``, broadcast (a view, either library); differentiable: cuDNN's
    dbias), for ``enable_gqa`` with any key/value head count dividing ``H``, and for ``dropout_p`` in ``(0, 1)``.
    A 3-d call runs as one head.

    Dropout, as torch's function, applies whenever ``dropout_p > 0`` (pass 0 in eval): cuDNN's Philox generator
    drops attention weights and scales the kept ones by ``1 / (1 - p)``; its seed is drawn on the device from the
    array library's generator (:func:`~cudnnkit.nn._common.dropout_seed`: ``torch.manual_seed`` reproduces a call,
    a CUDA-graph replay draws anew; under ``torch.compile`` with inductor, inductor's own generator draws it, so
    compiled and eager calls draw different seeds after one ``manual_seed``), offset 0, and the backward replays
    the same mask. The masks are cuDNN's, not torch's (other bits for the same seed).

    Refused by name: a boolean mask, ``dropout_p = 1`` (``NotImplementedError``); ``dropout_p`` outside ``[0, 1]``
    (``ValueError``)."""
    p = check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    scale = None if scale is None else real(scale, "scale")
    three = query.ndim == 3
    q, k, v = ((a[:, None] if three else a) for a in (query, key, value))
    if attn_mask is None and k.shape[1] in (1, q.shape[1]) and p == 0.0:
        o = call1("sdpa", q, k, v, scale=scale, causal=bool(is_causal))
    else:
        mask = attn_mask
        if mask is not None and three and mask.ndim == 3:  # (B, S_q, S_kv) of a one-head call
            mask = mask[:, None]
        if mask is not None and tuple(mask.shape[-2:]) != (q.shape[2], k.shape[2]):
            mask = _expand_rows(mask, (q.shape[2], k.shape[2]))
        drop = {}
        if p:
            seed, offset = dropout_seed(q)
            drop = {"dropout_p": p, "seed": seed, "offset": offset}
        o = call1("attention", q, k, v, mask, scale=scale, is_causal=bool(is_causal),
                  enable_gqa=k.shape[1] != q.shape[1], **drop)  # fmt: skip
    return o[:, 0] if three else o
