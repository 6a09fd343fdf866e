"""Scaled dot-product attention on cuDNN's graph API: :func:`sdpa_forward` and :func:`sdpa_backward`, and the L3
declaration ``sdpa`` (``cudnnkit.torch.op("sdpa")``, ``cudnnkit.nn.scaled_dot_product_attention``);
:func:`attention_forward` and :func:`attention_backward`, the same two primitives with every variant cuDNN 9.19
runs as keywords in torch's names (``attn_mask``, ``is_causal``, ``dropout_p``, ``scale``, ``enable_gqa``; masks
of either diagonal alignment and sliding windows, padding masks from per-sample lengths, ALiBi, softcap, dropout
replayed from seed/offset, grouped-query heads, the mask's gradient, deterministic backward: their docstrings).

``o = softmax(scale * q @ k^T + mask) @ v``, per batch and head; ``mask`` is nothing or, with ``causal=True``,
``-inf`` above the diagonal (``col > row``, top-left aligned: torch's ``is_causal``).

Shapes (``B`` batch, ``H`` query heads, ``H_kv`` key/value heads, ``S_q``/``S_kv`` lengths, ``D``/``D_v`` head dims)

=============  ========================  ==================================================================
array          shape                     notes
=============  ========================  ==================================================================
``q``          ``(B, H, S_q, D)``        float16 or bfloat16; any strides with the head dim contiguous (BHSD
                                         or BSHD memory); another last stride is copied to C order
``k``          ``(B, H_kv, S_kv, D)``    q's dtype; ``H_kv`` is ``H`` or 1 (one key/value head shared by all)
``v``          ``(B, H_kv, S_kv, D_v)``  q's dtype
``o``, ``do``  ``(B, H, S_q, D_v)``      q's dtype; a new ``o`` in q's dim order (C order when q is not dense)
``stats``      ``(B, H, S_q, 1)``        float32, C order: each row's log-sum-exp of the (masked, scaled)
                                         scores, what the backward reads
``dq/dk/dv``   q's, k's, v's             in their input's dim order (C order for a non-dense input)
=============  ========================  ==================================================================

``D`` and ``D_v`` are multiples of 8 from 8 to 256 (cuDNN's fused attention: 16-byte rows, ``d <= 256``; its
Ampere/Ada backward engines take ``d <= 128``, which cuDNN refuses when planning); ``S_q, S_kv >= 1``;
``scale`` defaults to ``1 / sqrt(D)``. :func:`sdpa_forward`/:func:`sdpa_backward` take one shared key/value head
(``H_kv = 1``) or ``H``; :func:`attention_forward`/:func:`attention_backward` any divisor of ``H`` with
``enable_gqa=True`` (cudnn-frontend's pattern: the heads summed by a reduction over each group of query heads).
All of it is checked before any GPU work, each error naming the argument.

**The graphs** (one per call signature, planned with the settings' heuristics, cached; graph-only: cuDNN has no
legacy attention). The forward is :meth:`cudnnkit.graph.Graph.sdpa_forward`'s fused-attention composite:
``OPERATION_MATMUL`` ``q @ k^T`` (k described as its transpose), ``POINTWISE`` ``MUL`` by the scale, the causal
mask (``GEN_INDEX`` row/col, ``CMP_GE``, ``BINARY_SELECT`` of ``-inf``), ``REDUCTION`` max, ``SUB``, ``EXP``,
``REDUCTION`` sum, ``LOG`` + ``ADD`` into ``stats``, ``DIV``, ``OPERATION_MATMUL`` ``P @ v``, float32 compute.
The backward is :meth:`~cudnnkit.graph.Graph.sdpa_backward`'s: ``rowsum(do * o)``, the probabilities again from
``stats``, ``dv = P^T @ do`` and ``dk = dS^T @ q`` through ``OPERATION_RESHAPE`` transposes, ``dq = dS @ k`` into
a float32 accumulator, the heads summed by ``OPERATION_REDUCTION`` for a shared key/value head. Its two float32
scratch tensors (the row sums, the ``dq`` accumulator: zeroed before every run) are allocated per call with the
arrays' library and bound, which the plan's checked ``execute`` takes (its pointer-only path takes none).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, NamedTuple

from ..graph.checks import as_bool, dense_like
from ..graph.nodes.sdpa import ALIGNMENTS, MAX_HEAD_DIM, paged_kv_length, resolve_variant
from ..runtime import adapters, validate_stream
from ..runtime.arrays import as_view, contiguous_strides, is_dense
from ..runtime.cache import LRU, MISSING
from ..runtime.dtypes import check_dtype, check_scalar
from ..runtime.settings import current_settings
from ..runtime.view import ArrayView
from ._diff import Differentiable, Spec, differentiable, spec_view
from ._graphform import Binder, graph_form, write_through
from ._layout import copy_in
from ._primitive import Operand, Output, Primitive, register, run, split_out

__all__ = ["sdpa_forward", "sdpa_backward", "attention_forward", "attention_backward"]

_HALF = ("float16", "bfloat16")
_FAMILY = "sdpa"
#: the head dims cuDNN's fused attention takes: multiples of 8 (16-byte rows of a half type) up to this
_MAX_D = MAX_HEAD_DIM
#: the optional operands of the attention variants (absent for sdpa_forward/sdpa_backward)
_VARIANT_ARRAYS = (
    "attn_mask",
    "seq_len_q",
    "seq_len_kv",
    "alibi_slopes",
    "seed",
    "offset",
    "sink",
    "page_table_k",
    "page_table_v",
    *(f"ragged_{n}" for n in ("q", "k", "v", "o", "do", "dq", "dk", "dv")),
)
#: the packed (THD) arrays of a ragged call and the side (q or kv) whose cu_seqlens place each one's samples
_RAGGED_SIDES = {"q": "q", "k": "kv", "v": "kv", "o": "q", "do": "q", "dq": "q", "dk": "kv", "dv": "kv"}
#: this module's keywords -> the names the L2 attention functions take (torch's where torch has one)
_TORCH_NAMES = {"causal": "is_causal", "dropout": "dropout_p", "bias": "attn_mask"}


class _Sdpa(NamedTuple):
    """A call, resolved (hashable: the op-level caches key on it)."""

    dtype: str
    q: tuple[int, ...]  #: q's shape (B, H, S_q, D)
    k: tuple[int, ...]
    v: tuple[int, ...]
    scale: float
    causal: bool
    o_strides: tuple[int, ...]  #: a new o's strides
    grad_strides: tuple[tuple[int, ...], ...] = ()  #: new dq, dk, dv's (the backward)
    left_bound: int | None = None
    right_bound: int | None = None  #: 0 with causal
    bottom_right: bool = False  #: diagonal_alignment="bottom_right"
    softcap: float | None = None
    dropout: float = 0.0
    mask_dims: tuple[int, ...] | None = None  #: attn_mask as the graph's bias: (1|B, 1|H, S_q, S_kv)
    mask_shape: tuple[int, ...] | None = None  #: attn_mask's own shape (its gradient's)
    mask_dtype: str | None = None
    dbias: bool = False  #: the backward also makes attn_mask's gradient
    deterministic: bool = False  #: the backward under settings(deterministic=True)
    sink_shape: tuple[int, ...] | None = None  #: the sink's own shape (its gradient's)
    dsink: bool = False  #: the backward also makes the sink's gradient
    #: a ragged (packed, THD) call: the token counts (T_q, T_kv) of the packed arrays; q, k, v above are then the
    #: logical (B, H, S_max, D) shapes the graph describes
    packed: tuple[int, int] | None = None

    @property
    def o_shape(self) -> tuple[int, ...]:
        if self.packed is not None:
            return (self.packed[0], self.q[1], self.v[3])
        return self.q[:3] + (self.v[3],)

    @property
    def array_shapes(self) -> tuple[tuple[int, ...], ...]:
        """q, k, v's array shapes: the logical ones, or packed ``(T, H, D)``."""
        if self.packed is None:
            return (self.q, self.k, self.v)
        tq, tkv = self.packed
        return ((tq, *self.q[1::2]), (tkv, *self.k[1::2]), (tkv, *self.v[1::2]))

    @property
    def stats_shape(self) -> tuple[int, ...]:
        return self.q[:3] + (1,)


def _strides_like(shape: tuple[int, ...], like: Any) -> tuple[int, ...]:
    """A new array's strides: dense in ``like``'s dim order when ``like`` is dense with a contiguous last dim
    (BHSD stays BHSD, BSHD stays BSHD), else C order."""
    if like.strides[-1] == 1 and is_dense(like.shape, like.strides):
        return dense_like(tuple(shape), like.strides)
    return contiguous_strides(tuple(shape))


def _check_qkv(vq: Any, vk: Any, vv: Any, gqa: bool | None = None) -> None:
    """q, k, v's shapes. ``gqa``: None (sdpa_forward/sdpa_backward: ``H_kv`` of ``H`` or 1), or attention_forward's
    ``enable_gqa`` (torch's rule: ``H_kv`` other than ``H`` only when it is True, then any divisor of ``H``)."""
    for name, x in (("q", vq), ("k", vk), ("v", vv)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be 4-d (B, H, S, D), got shape {tuple(x.shape)}")
    if vk.dtype != vq.dtype or vv.dtype != vq.dtype:
        raise TypeError(f"k and v must have q's dtype {vq.dtype}, got {vk.dtype} and {vv.dtype}")
    b, h, sq, d = vq.shape
    bk, hk, skv, dk = vk.shape
    bv, hv, sv, dv = vv.shape
    if bk != b or bv != b:
        raise ValueError(f"k and v must have q's batch size {b}, got {bk} and {bv}")
    if h < 1 or hk < 1:
        raise ValueError(f"q and k must have at least one head, got {h} and {hk}")
    if hv != hk:
        raise ValueError(f"v must have k's {hk} heads, got {hv}")
    if h % hk:
        raise ValueError(f"q's {h} heads must be a multiple of k's {hk} (grouped-query attention)")
    if gqa is not None:
        if hk != h and not gqa:
            raise ValueError(f"k and v have {hk} heads for q's {h}: pass enable_gqa=True for grouped-query attention")
    elif hk not in (1, h):
        raise NotImplementedError(
            f"k and v have {hk} heads for q's {h}: grouped-query attention runs with one shared key/value head "
            "(H_kv = 1) or none (H_kv = H): the graph's pattern broadcasts and sums a head dim of 1 only"
        )
    if sv != skv:
        raise ValueError(f"v must have k's length {skv} (dim 2), got {sv}")
    if sq < 1 or skv < 1:
        raise ValueError(f"q and k must have at least one position, got S_q = {sq} and S_kv = {skv}")
    if dk != d:
        raise ValueError(f"k's head dim {dk} must equal q's {d}")
    for name, x in (("q", d), ("v", dv)):
        if x % 8 or not 8 <= x <= _MAX_D:
            raise ValueError(f"{name}'s head dim must be a multiple of 8 from 8 to {_MAX_D} (cuDNN's fused "
                             f"attention), got {x}")  # fmt: skip


def _options(kw: Any, d: int) -> tuple[float, bool]:
    """``(scale, causal)``: ``scale`` a finite number (None: ``1 / sqrt(D)``), ``causal`` a bool."""
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else check_scalar(scale, "scale")
    causal = kw.get("causal", False)
    if not isinstance(causal, bool):
        if type(causal).__name__ != "bool_":  # a NumPy bool is taken
            raise TypeError(f"causal must be a bool, got {causal!r}")
        causal = bool(causal)
    return float(scale), causal


def _paged(views: Any, kw: Any) -> tuple[Any, Any]:
    """k and v as the shape checks see them: themselves, or with page tables the caches the tables address,
    ``(B, H_kv, S_kv, D)`` (``S_kv`` by :func:`~cudnnkit.graph.nodes.sdpa.paged_kv_length`)."""
    vq, vk, vv = views["q"], views["k"], views["v"]
    tables = [views.get("page_table_k"), views.get("page_table_v")]
    if tables == [None, None]:
        if kw.get("max_seq_len_kv") is not None:
            raise ValueError("max_seq_len_kv is for paged caches (page_table_k=, page_table_v=)")
        return vk, vv
    if vq.ndim != 4 or vk.ndim != 4 or vv.ndim != 4:
        raise ValueError(f"q must be 4-d and k, v paged caches (num_blocks, H_kv, block_size, D), got shapes "
                         f"{tuple(vq.shape)}, {tuple(vk.shape)}, {tuple(vv.shape)}")  # fmt: skip
    b = vq.shape[0]
    dims = []
    for name, t in zip(("page_table_k", "page_table_v"), tables):
        if t is not None and (t.dtype != "int32" or t.ndim not in (2, 4) or t.shape[0] != b):
            raise ValueError(f"{name} must be an int32 device array of shape (B, blocks) or (B, 1, blocks, 1) with "
                             f"B = {b}, got {t.dtype} {tuple(t.shape)}")  # fmt: skip
        dims.append(None if t is None else (b, 1, t.shape[1], 1) if t.ndim == 2 else tuple(t.shape))
    lengths = views.get("seq_len_q") is not None and views.get("seq_len_kv") is not None
    skv = paged_kv_length(b, tuple(vk.shape), tuple(vv.shape), *dims, kw.get("max_seq_len_kv"), lengths)
    return (SimpleNamespace(ndim=4, shape=(b, vk.shape[1], skv, vk.shape[3]), dtype=vk.dtype),
            SimpleNamespace(ndim=4, shape=(b, vv.shape[1], skv, vv.shape[3]), dtype=vv.dtype))  # fmt: skip


def _fwd_resolve(views: Any, kw: Any) -> _Sdpa:
    ragged = kw.get("ragged")
    if ragged is not None:
        return _variant(views, kw, _ragged_resolve(views, kw, ragged))
    for n in _RAGGED_SIDES:
        if views.get(f"ragged_{n}") is not None:
            raise ValueError(f"ragged_{n} is for ragged (packed) calls: pass cu_seqlens_q= and cu_seqlens_kv=")
    vq = views["q"]
    vk, vv = _paged(views, kw)
    _check_qkv(vq, vk, vv, kw.get("enable_gqa"))
    scale, causal = _options(kw, vq.shape[3])
    o_shape = tuple(vq.shape[:3]) + (vv.shape[3],)
    r = _Sdpa(vq.dtype, tuple(vq.shape), tuple(vk.shape), tuple(vv.shape), scale, causal,
              _strides_like(o_shape, vq))  # fmt: skip
    return _variant(views, kw, r)


def _ragged_resolve(views: Any, kw: Any, ragged: Any) -> _Sdpa:
    """A ragged call's shapes: packed q ``(T_q, H, D)``, k ``(T_kv, H_kv, D)``, v ``(T_kv, H_kv, D_v)`` checked as
    the logical ``(B, H, S_max, D)`` arrays the graph describes (``ragged = (B, S_max_q, S_max_kv)``, made by
    :func:`attention_forward` from the cu_seqlens), and each present array's offsets (int64, ``B + 1``)."""
    b, sq, skv = ragged
    vq, vk, vv = views["q"], views["k"], views["v"]
    for name, x in (("q", vq), ("k", vk), ("v", vv)):
        if x.ndim != 3:
            raise ValueError(f"{name} must be 3-d (T, H, D) (packed) with cu_seqlens_q/cu_seqlens_kv, got shape "
                             f"{tuple(x.shape)}")  # fmt: skip
    for name in (*_RAGGED_SIDES, "out"):  # read in place: the ragged offsets come from the token strides given
        x = views.get(name)
        if x is not None and x.ndim == 3 and _rows_off(x):
            raise ValueError(f"{name} (packed) must have a contiguous head dim and token and head strides that are "
                             f"multiples of 16 bytes (cuDNN's attention reads rows of D), got strides "
                             f"{tuple(x.strides)}")  # fmt: skip
    if views.get("page_table_k") is not None or views.get("page_table_v") is not None:
        raise ValueError("cu_seqlens_q/cu_seqlens_kv (packed batches) do not take page tables: pass seq_len_q= and "
                         "seq_len_kv= with paged caches")  # fmt: skip
    logical = [SimpleNamespace(ndim=4, shape=(b, x.shape[1], s, x.shape[2]), dtype=x.dtype)
               for x, s in ((vq, sq), (vk, skv), (vv, skv))]  # fmt: skip
    _check_qkv(*logical, kw.get("enable_gqa"))
    for name in _RAGGED_SIDES:
        x = views.get(f"ragged_{name}")
        if x is not None and (x.dtype != "int64" or x.shape != (b + 1,)):
            raise ValueError(f"ragged_{name} must be an int64 device array of shape ({b + 1},), got {x.dtype} "
                             f"{tuple(x.shape)}")  # fmt: skip
    for name in ("q", "k", "v"):
        if views.get(f"ragged_{name}") is None:
            raise ValueError(f"a ragged call needs ragged_{name}= (made by attention_forward from cu_seqlens)")
    scale, causal = _options(kw, vq.shape[2])
    o_shape = (vq.shape[0], vq.shape[1], vv.shape[2])
    return _Sdpa(vq.dtype, logical[0].shape, logical[1].shape, logical[2].shape, scale, causal,
                 _strides_like(o_shape, vq), packed=(vq.shape[0], vk.shape[0]))  # fmt: skip


def _variant(views: Any, kw: Any, r: _Sdpa) -> _Sdpa:
    """The attention variant's keywords and optional arrays checked (errors name the attention functions'
    arguments), before any GPU work: the rules of :func:`cudnnkit.graph.nodes.sdpa.resolve_variant` (cuDNN
    9.19's refusals) and each array's dtype and size."""
    b, h, sq, _ = r.q
    skv = r.k[2]
    m = views.get("attn_mask")
    mask_dims = None
    if m is not None:
        if m.dtype == "bool":
            raise TypeError("attn_mask: a boolean mask is not taken (cuDNN's attention adds a bias; it cannot be "
                            "boolean): pass an additive float mask, 0 where kept and -inf where masked")  # fmt: skip
        if m.dtype not in (r.dtype, "float32"):
            raise TypeError(f"attn_mask must have q's dtype {r.dtype} or float32, got {m.dtype}")
        if not 2 <= m.ndim <= 4 or tuple(m.shape[-2:]) != (sq, skv):
            raise ValueError(f"attn_mask must end in (S_q, S_kv) = {(sq, skv)} with 2 to 4 dims, got shape "
                             f"{tuple(m.shape)}")  # fmt: skip
        mask_dims = (1,) * (4 - m.ndim) + tuple(m.shape)
        if mask_dims[0] not in (1, b) or mask_dims[1] not in (1, h):
            raise ValueError(f"attn_mask's leading dims must be 1 or B = {b}, 1 or H = {h} (it broadcasts over "
                             f"batch and heads), got shape {tuple(m.shape)}")  # fmt: skip
    lens = [views.get("seq_len_q"), views.get("seq_len_kv")]
    if (lens[0] is None) != (lens[1] is None):
        raise ValueError("a padding mask needs both seq_len_q= and seq_len_kv= (int32 device arrays of B elements)")
    for name, x in zip(("seq_len_q", "seq_len_kv"), lens):
        if x is not None and (x.dtype != "int32" or x.size != b or x.shape not in ((b,), (b, 1, 1, 1))):
            raise ValueError(f"{name} must be an int32 device array of shape ({b},) or ({b}, 1, 1, 1), got "
                             f"{x.dtype} {tuple(x.shape)}")  # fmt: skip
    sl = views.get("alibi_slopes")
    if sl is not None and (sl.dtype != "float32" or sl.shape not in ((h,), (1, h, 1, 1))):
        raise ValueError(f"alibi_slopes must be a float32 device array of shape ({h},) or (1, {h}, 1, 1), got "
                         f"{sl.dtype} {tuple(sl.shape)}")  # fmt: skip
    lb, rb, bottom_right, p, softcap = resolve_variant(
        sq, skv, causal=r.causal, left_bound=kw.get("left_bound"), right_bound=kw.get("right_bound"),
        diagonal_alignment=kw.get("diagonal_alignment", "top_left"), dropout=kw.get("dropout", 0.0),
        padded=lens[0] is not None, bias=m is not None, alibi=sl is not None, softcap=kw.get("softcap"),
        names=_TORCH_NAMES,
    )  # fmt: skip
    if p:
        _check_dropout_seed(views, "attention_backward")
    dbias, dsink = kw.get("dbias", False), kw.get("want_dsink", False)  # (the output is named dsink)
    for name, flag in (("dbias", dbias), ("dsink", dsink)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if dbias and m is None:
        raise ValueError("dbias=True needs attn_mask= (its gradient is what dbias returns)")
    sk = views.get("sink")
    if sk is not None:
        if sk.dtype != "float32" or sk.shape not in ((h,), (1, h, 1, 1)):
            raise ValueError(f"sink must be a float32 device array of shape ({h},) or (1, {h}, 1, 1), got "
                             f"{sk.dtype} {tuple(sk.shape)}")  # fmt: skip
        if sq == 1:
            raise ValueError("sink takes S_q > 1 (cuDNN has no decode-only attention with a sink)")
    if dsink and sk is None:
        raise ValueError("dsink=True needs sink= (its gradient is what dsink returns)")
    return r._replace(left_bound=lb, right_bound=rb, bottom_right=bottom_right, softcap=softcap, dropout=p,
                      mask_dims=mask_dims, mask_shape=None if m is None else tuple(m.shape),
                      mask_dtype=None if m is None else m.dtype, dbias=dbias,
                      sink_shape=None if sk is None else tuple(sk.shape), dsink=dsink)  # fmt: skip


def _bwd_resolve(views: Any, kw: Any) -> _Sdpa:
    if views.get("page_table_k") is not None or views.get("page_table_v") is not None:
        raise ValueError("page_table_k/page_table_v are for attention_forward: cuDNN's paged attention has no "
                         "backward (inference: decode and chunked prefill)")  # fmt: skip
    r = _fwd_resolve(views, kw)
    _check_saved(views, r.o_shape, r.stats_shape)
    for name in ("o", "do"):
        if views[name].dtype != r.dtype:
            raise TypeError(f"{name} must have q's dtype {r.dtype}, got {views[name].dtype}")
    grads = tuple(_strides_like(views[n].shape, views[n]) for n in ("q", "k", "v"))
    if r.packed is not None:
        for n in ("o", "do", "dq", "dk", "dv"):
            if views.get(f"ragged_{n}") is None:
                raise ValueError(f"a ragged backward needs ragged_{n}= (made by attention_backward from cu_seqlens)")
    return r._replace(grad_strides=grads, deterministic=current_settings().deterministic)


# ----------------------------------------------------------------- the graph forms


def _rows_off(v: Any) -> bool:
    """Whether cuDNN's attention cannot read ``v`` as it is laid out: its head dim not contiguous, or a stride of a
    dim longer than 1 not a multiple of 16 bytes (measured, H100, cuDNN 9.19: q/k/v views into rows 3 elements wider
    than D planned and ran and gave wrong outputs, relative error 1.4; the engines' tiled loads take 16-byte
    strides)."""
    st = v.strides
    if st[-1] != 1:
        return True
    size = v.itemsize
    return any(d > 1 and (s * size) % 16 for d, s in zip(v.shape[:-1], st[:-1]))


def _head_rows(c: Any, names: tuple[str, ...], outputs: tuple[str, ...] = ()) -> None:
    """Inputs cuDNN's attention cannot read as they are laid out (:func:`_rows_off`) copied to C order; such an
    ``out=`` written through a C-order temporary (the graph reads and writes rows of D)."""
    why = "with a contiguous head dim and 16-byte strides (cuDNN's attention reads rows of D)"
    for n in names:
        v = c.views[n]
        if _rows_off(v):
            _, c.views[n] = copy_in(c.launch, c.arrays[n], v, None, n, why)
    for n in outputs:
        v = c.views[n]
        if _rows_off(v):
            write_through(c, n, contiguous_strides(v.shape))


def _variant_inputs(bd: Any, c: Any, sink: bool = True) -> dict[str, Any]:
    """The graph keywords of the call's variant: its optional arrays as graph tensors (1-d ones described 4-d:
    ``(B, 1, 1, 1)`` lengths, ``(1, H, 1, 1)`` slopes, ``(1, 1, 1, 1)`` seed and offset, attn_mask with leading
    1s), the bounds, alignment, softcap and dropout. ``sink=False`` leaves the sink out (a backward without its
    gradient reads none: the stats hold it)."""
    r, views = c.resolved, c.views
    b, h = r.q[:2]
    kw: dict[str, Any] = {"left_bound": r.left_bound, "right_bound": r.right_bound, "softcap": r.softcap,
                          "diagonal_alignment": ALIGNMENTS[r.bottom_right], "dropout": r.dropout}  # fmt: skip
    m = views.get("attn_mask")
    if m is not None:
        lead = (max(1, m.size),) * (4 - m.ndim)
        kw["bias"] = bd.tensor("attn_mask", r.mask_dims, lead + tuple(m.strides), m.dtype)
    if views.get("seq_len_q") is not None:
        for n in ("seq_len_q", "seq_len_kv"):
            kw[n] = bd.tensor(n, (b, 1, 1, 1), (1, 1, 1, 1), "int32")
    if views.get("alibi_slopes") is not None:
        kw["alibi_slopes"] = bd.tensor("alibi_slopes", (1, h, 1, 1), (h, 1, 1, 1), "float32")
    if r.dropout:
        for n in ("seed", "offset"):
            kw[n] = bd.tensor(n, (1, 1, 1, 1), (1, 1, 1, 1), "int64")
    if sink and views.get("sink") is not None:
        kw["sink"] = bd.tensor("sink", (1, h, 1, 1), (h, 1, 1, 1), "float32")
    if views.get("page_table_k") is not None:
        for n in ("page_table_k", "page_table_v"):
            blocks = views[n].shape[1] if views[n].ndim == 2 else views[n].shape[2]
            kw[n] = bd.tensor(n, (b, 1, blocks, 1), (blocks, blocks, 1, 1), "int32")
        kw["max_seq_len_kv"] = r.k[2]
    return kw


def _logical(r: _Sdpa, shape: tuple[int, ...], strides: tuple[int, ...], side: str) -> tuple[tuple, tuple]:
    """A packed ``(T, H, D)`` array's dims and strides as the graph describes it, ``(B, H, S_max, D)`` with the
    token stride on S and ``S_max`` times it on B (cuDNN reads each sample from its ragged offset: cudnn-frontend's
    THD layout)."""
    b, s = r.q[0], (r.q if side == "q" else r.k)[2]
    t, hs, _ = strides
    return (b, shape[1], s, shape[2]), (s * t, hs, t, 1)


def _graph_array(bd: Any, c: Any, name: str, dtype: str) -> Any:
    """Operand or output ``name`` as a graph tensor: as the call holds it, or packed (ragged, its offsets set)."""
    r, v = c.resolved, c.views[name]
    if r.packed is None or name not in _RAGGED_SIDES:
        return bd.tensor(name, v.shape, v.strides, dtype)
    dims, strides = _logical(r, v.shape, v.strides, _RAGGED_SIDES[name])
    t = bd.tensor(name, dims, strides, dtype)
    return bd.g.set_ragged_offset(t, _ragged_offsets(bd, c, name))


def _ragged_offsets(bd: Any, c: Any, name: str) -> Any:
    return bd.tensor(f"ragged_{name}", (c.resolved.q[0] + 1, 1, 1, 1), (1, 1, 1, 1), "int64")


def _ragged_outputs(bd: Any, c: Any, names: tuple[str, ...], strides_kw: str) -> dict[str, Any]:
    """The graph keywords that make outputs ``names`` packed (their logical strides and offsets), or nothing."""
    r, kw = c.resolved, {}
    if r.packed is None:
        return kw
    for n in names:
        v = c.views["out" if n == "o" else n]
        kw[strides_kw.format(n)] = _logical(r, v.shape, v.strides, _RAGGED_SIDES[n])[1]
        kw[f"{n}_ragged_offset"] = _ragged_offsets(bd, c, n)
    return kw


def _output(bd: Any, c: Any, t: Any, name: str, dtype: str) -> None:
    v = c.views[name]
    strides = v.strides
    if c.resolved.packed is not None and name in ("out", "dq", "dk", "dv"):
        strides = _logical(c.resolved, v.shape, v.strides, _RAGGED_SIDES["o" if name == "out" else name])[1]
    bd.output(t, name, dtype, strides)


def _fwd_build(c: Any) -> tuple[Any, dict]:
    r = c.resolved
    bd = Binder(c)
    q, k, v = (_graph_array(bd, c, n, r.dtype) for n in ("q", "k", "v"))
    got = bd.g.sdpa_forward(q, k, v, scale=r.scale, **_variant_inputs(bd, c),
                            **_ragged_outputs(bd, c, ("o",), "{}_strides"))  # fmt: skip
    _output(bd, c, got.o, "out", r.dtype)
    bd.output(got.stats, "stats", "float32", c.views["stats"].strides)
    return bd.done()


def _bwd_build(c: Any) -> tuple[Any, dict]:
    r = c.resolved
    bd = Binder(c)
    t = {n: _graph_array(bd, c, n, c.views[n].dtype) for n in ("q", "k", "v", "o", "do", "stats")}
    got = bd.g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["do"], t["stats"], scale=r.scale, dbias=r.dbias,
                             dsink=r.dsink, deterministic=r.deterministic, **_variant_inputs(bd, c, r.dsink),
                             **_ragged_outputs(bd, c, ("dq", "dk", "dv"), "{}_strides"))  # fmt: skip
    for name, g in zip(("dq", "dk", "dv"), got):
        _output(bd, c, g, name, r.dtype)
    if r.dbias:
        dm = c.views["dattn_mask"]
        bd.output(got.dbias, "dattn_mask", r.mask_dtype, (max(1, dm.size),) * (4 - dm.ndim) + tuple(dm.strides))
    if r.dsink:
        bd.output(got.dsink, "dsink", "float32", (r.q[1], 1, 1, 1))
    return bd.done()


#: graph key -> (plan, {uid: call.views name}, the scratch tensors as (uid, dims, strides, dtype))
_bwd_forms: LRU[Any, tuple[Any, dict[int, str], tuple]] = LRU("ops.sdpa_backward_forms", 256)


def _bwd_graph(c: Any) -> None:
    """The backward's graph form: :func:`graph_form`'s sequence (layout copies, 16-byte alignment, the plan
    cached per graph key), run with the plan's checked ``execute`` so that its scratch tensors can be bound."""
    _head_rows(c, ("q", "k", "v", "o", "do"))
    for name, v in list(c.views.items()):  # misaligned inputs copied (the outputs are new: aligned)
        if v is not None and v.ptr % 16 and name not in ("dq", "dk", "dv", "dattn_mask", "dsink"):
            new, c.views[name] = c.launch.empty(v.shape, v.dtype, v.strides, name=name)
            c.launch.copy(new, v.owner if v.adapter is not None else c.arrays[name], name)
    c.extra["graph_alignment"] = 16
    key = c.extra.get("graph_key")
    form = _bwd_forms.lookup(key) if key is not None else MISSING
    if form is MISSING:
        g, names = _bwd_build(c)
        plan = g.build(device=c.launch.device)
        scratch = tuple((t.uid, t.dims, t.strides, t.dtype) for t in g.scratch())
        form = (plan, {t.uid: n for t, n in names.items()}, scratch)
        if key is not None:
            _bwd_forms.put(key, form, count_miss=True)
    plan, names, scratch = form
    bindings: dict[int, int] = {uid: c.views[n].ptr for uid, n in names.items()}
    keep = []
    for uid, dims, strides, dtype in scratch:
        arr, sv = c.launch.empty(dims, dtype, strides, name="scratch")
        keep.append(arr)
        bindings[uid] = sv.ptr
    ws, ws_ptr = c.launch.workspace(plan.workspace_size)
    c.launch.handle  # noqa: B018  (this thread's handle for the device, made and set to the launch stream)
    plan.execute(bindings, stream=c.launch.stream, workspace=ws_ptr if plan.workspace_size else None,
                 unchecked=True)  # fmt: skip
    del keep, ws  # the allocator's stream-ordered free follows the queued work


# ----------------------------------------------------------------- the primitives


def _o_strides(r: _Sdpa) -> tuple[int, ...]:
    return r.o_strides


def _grad(i: int) -> Output:
    name = ("dq", "dk", "dv")[i]
    return Output(name, shape=lambda r: r.array_shapes[i], strides=lambda r: r.grad_strides[i])


def _variant_operands() -> tuple[Operand, ...]:
    """The attention variants' optional arrays (cuDNN reads the small ones packed)."""
    return (
        Operand("attn_mask", optional=True, packed=True),
        Operand("seq_len_q", ("int32",), optional=True, packed=True),
        Operand("seq_len_kv", ("int32",), optional=True, packed=True),
        Operand("alibi_slopes", ("float32",), optional=True, packed=True),
        Operand("seed", ("int64",), optional=True, packed=True),
        Operand("offset", ("int64",), optional=True, packed=True),
        Operand("sink", ("float32",), optional=True, packed=True),
        Operand("page_table_k", ("int32",), optional=True, packed=True),
        Operand("page_table_v", ("int32",), optional=True, packed=True),
        *(Operand(f"ragged_{n}", ("int64",), optional=True, packed=True) for n in _RAGGED_SIDES),
    )


SDPA_FORWARD = register(
    Primitive(
        "sdpa_forward",
        inputs=(Operand("q", _HALF), Operand("k", _HALF), Operand("v", _HALF), *_variant_operands()),
        outputs=(
            Output("out", shape=lambda r: r.o_shape, strides=_o_strides),
            Output("stats", shape=lambda r: r.stats_shape, dtype=lambda r: "float32"),
        ),
        resolve=_fwd_resolve,
        graph=graph_form(_fwd_build, lambda c: _head_rows(c, ("q", "k", "v"), ("out",))),
        empty=lambda r: r.q[0] == 0,
        family=_FAMILY,
        # attn_mask and sink: the L3 op ``attention`` (their gradients are the backward's dattn_mask and dsink)
        differentiable=("q", "k", "v", "attn_mask", "sink"),
        residuals=("q", "k", "v", "out", "stats"),
        backward="sdpa_backward",
    )
)
SDPA_BACKWARD = register(
    Primitive(
        "sdpa_backward",
        inputs=(
            Operand("q", _HALF),
            Operand("k", _HALF),
            Operand("v", _HALF),
            Operand("o", _HALF),
            Operand("do", _HALF),
            Operand("stats", ("float32",)),
            *_variant_operands(),
        ),
        outputs=(
            _grad(0),
            _grad(1),
            _grad(2),
            # attn_mask's gradient with dbias=True; otherwise an empty array the public functions drop
            Output(
                "dattn_mask",
                shape=lambda r: r.mask_shape if r.dbias else (0,),
                dtype=lambda r: r.mask_dtype if r.dbias else r.dtype,
            ),
            # the sink's gradient with dsink=True (float32, the sink's shape); otherwise empty
            Output("dsink", shape=lambda r: r.sink_shape if r.dsink else (0,), dtype=lambda r: "float32"),
        ),
        resolve=_bwd_resolve,
        graph=_bwd_graph,
        empty=lambda r: r.q[0] == 0,
        family=_FAMILY,
    )
)


# ----------------------------------------------------------------- the public functions


def sdpa_forward(q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False, training: bool = True,
                 out: Any = None, stream: Any = None) -> Any:  # fmt: skip
    """Attention forward, plain: ``o = softmax(scale * q @ k^T (+ the causal mask)) @ v``, with its statistics.

    ``q`` ``(B, H, S_q, D)``, ``k`` ``(B, H_kv, S_kv, D)`` and ``v`` ``(B, H_kv, S_kv, D_v)`` share one of float16
    and bfloat16; ``H_kv`` is ``H`` or 1 (one key/value head shared by every query head); ``D`` and ``D_v`` are
    multiples of 8 from 8 to 256 and may differ. Any strides with a contiguous head dim (BHSD or BSHD memory) are
    read as they are; another last stride is copied to C order first. The scores, softmax and accumulation are
    float32 inside the graph. A batch of ``B = 0`` returns empty arrays with no cuDNN call. Masks other than the
    causal one, dropout, padding lengths, packed or paged batches and other head groupings are
    :func:`attention_forward`'s keywords (the same primitive).

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_forward`'s composite, listed in the module docstring: ``q @ k^T``, the
    scale, the causal mask, the softmax with its log-sum-exp into ``stats``, ``P @ v``), one graph per call
    signature, planned once with the settings' heuristics and cached (primitive :data:`SDPA_FORWARD`). cuDNN has
    no legacy attention, so there is no other path.

    Args:
        q: the queries ``(B, H, S_q, D)``, float16 or bfloat16, a CUDA array.
        k: the keys ``(B, H_kv, S_kv, D)``, ``q``'s dtype; ``H_kv`` is ``H`` or 1.
        v: the values ``(B, H_kv, S_kv, D_v)``, ``q``'s dtype.
        scale: the factor on the scores, a finite number; None: ``1 / sqrt(D)``.
        causal: mask the scores above the diagonal (keep ``col <= row``, top-left aligned: torch's
            ``is_causal``).
        training: return the statistics that :func:`sdpa_backward` reads too; with False ``o`` alone (the
            statistics are still made, to a temporary: cuDNN 9.19 has no engine for the pattern without them).
        out: with ``training``, a tuple ``(o, stats)``, each an array of its shape to write or None to allocate;
            without, ``o``'s array or None. A given ``o`` may be BHSD or BSHD with a contiguous head dim (another
            is written through a C-order temporary).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(o, stats)``: ``o`` ``(B, H, S_q, D_v)`` in ``q``'s dtype and dim order (C order when ``q`` is not dense
        with a contiguous head dim), ``stats`` float32 ``(B, H, S_q, 1)`` C order, each row's log-sum-exp of the
        scaled (masked) scores; with ``training=False`` ``o`` alone. The given ``out`` arrays when passed.

    Raises:
        TypeError: a host array, a dtype other than float16/bfloat16, ``k`` or ``v`` of another dtype than
            ``q``, ``causal`` or ``training`` not a bool, a ``scale`` that is not a number, or an ``out`` that is
            not a pair when training.
        ValueError: inputs that are not 4-d, batch sizes, lengths or head dims that do not match, ``H`` not a
            multiple of ``H_kv``, a head dim outside the multiples of 8 up to 256, an empty length, a non-finite
            ``scale``, or an ``out`` of the wrong shape or dtype.
        NotImplementedError: ``H_kv`` other than ``H`` or 1 (:func:`attention_forward` with
            ``enable_gqa=True`` takes any divisor of ``H``).
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU (fused attention needs
            Ampere or newer).

    Example:
        >>> import torch
        >>> from cudnnkit import ops
        >>> q, k, v = (torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        >>> o, stats = ops.sdpa_forward(q, k, v, causal=True)                # o (2, 8, 1024, 64), stats float32
        >>> o = ops.sdpa_forward(q, k, v, causal=True, training=False)      # inference: o alone
    """
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {training!r}")
    o, st = split_out("sdpa_forward", out, {"out": None, "stats": None}) if training else (out, None)
    res = run(SDPA_FORWARD, {"q": q, "k": k, "v": v}, stream=stream, out=o, stats=st, scale=scale, causal=causal)
    return res if training else res[0]


def sdpa_backward(q: Any, k: Any, v: Any, o: Any, do: Any, stats: Any, *, scale: float | None = None,
                  causal: bool = False, stream: Any = None) -> tuple[Any, Any, Any]:  # fmt: skip
    """Attention backward, plain: ``(dq, dk, dv)`` of :func:`sdpa_forward`, from its inputs, ``o``, ``stats`` and
    ``do``.

    ``do`` is ``o``'s cotangent ``(B, H, S_q, D_v)`` in ``q``'s dtype; ``scale`` and ``causal`` must be the
    forward's. The graph recomputes the probabilities from ``stats`` (no ``S_q x S_kv`` matrix is kept between
    the calls), takes ``rowsum(do * o)``, and makes ``dv = P^T @ do``, ``dk = dS^T @ q`` and ``dq = dS @ k``
    (through a float32 accumulator, zeroed before each run); a shared key/value head (``H_kv = 1``) gets the sum
    over the query heads. Inputs with a non-contiguous head dim, or not 16-byte aligned, are copied first. cuDNN
    9.19's Ampere/Ada backward engines take head dims up to 128 (larger ones are refused when planning); Hopper
    takes 256. Under ``cudnnkit.settings(deterministic=True)`` the graph writes ``dq`` without the atomic
    accumulator and planning skips engines with cuDNN's NONDETERMINISTIC note.

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention backward nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_backward`'s composite: the module docstring), one graph per call signature,
    planned once with the settings' heuristics and cached (primitive :data:`SDPA_BACKWARD`), its two float32
    scratch tensors allocated per call with the arrays' library.

    Args:
        q: the forward's queries ``(B, H, S_q, D)``, float16 or bfloat16.
        k: the forward's keys ``(B, H_kv, S_kv, D)``, ``q``'s dtype.
        v: the forward's values ``(B, H_kv, S_kv, D_v)``, ``q``'s dtype.
        o: the forward's output ``(B, H, S_q, D_v)``, ``q``'s dtype.
        do: the gradient of ``o``, ``o``'s shape and dtype.
        stats: the forward's float32 statistics ``(B, H, S_q, 1)``.
        scale: the forward's scale; None: ``1 / sqrt(D)``.
        causal: the forward's ``causal``.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dq, dk, dv)``: new arrays of ``q``'s, ``k``'s and ``v``'s shapes in ``q``'s dtype, each in its input's
        dim order (C order for an input that is not dense).

    Raises:
        TypeError: a host array, a dtype other than float16/bfloat16 (float32 for ``stats``), ``o`` or ``do``
            of another dtype than ``q``, ``causal`` not a bool, or a ``scale`` that is not a number.
        ValueError: the forward's shape errors, ``o``/``do`` not ``(B, H, S_q, D_v)``, ``stats`` not
            ``(B, H, S_q, 1)``, or a non-finite ``scale``.
        NotImplementedError: ``H_kv`` other than ``H`` or 1 (:func:`attention_backward` with ``enable_gqa=True``).
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU (for example a head
            dim over 128 on Ampere or Ada).

    Example:
        >>> o, stats = ops.sdpa_forward(q, k, v, causal=True)
        >>> do = torch.randn_like(o)
        >>> dq, dk, dv = ops.sdpa_backward(q, k, v, o, do, stats, causal=True)
    """
    arrays = {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats}
    return run(SDPA_BACKWARD, arrays, stream=stream, scale=scale, causal=causal)[:3]


def _attention_arrays(attn_mask, seq_len_q, seq_len_kv, alibi_slopes, seed, offset, sink, page_table_k=None,
                      page_table_v=None) -> dict[str, Any]:  # fmt: skip
    return {"attn_mask": attn_mask, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "alibi_slopes": alibi_slopes,
            "seed": seed, "offset": offset, "sink": sink, "page_table_k": page_table_k,
            "page_table_v": page_table_v}  # fmt: skip


def _cu_values(obj: Any, name: str) -> Any:
    """``cu_seqlens_*`` as host int64 values: a host sequence or array as is, a device int32/int64 array read back
    through its library's adapter (``to_numpy``: a stream synchronization)."""
    import numpy as np

    if adapters.is_device_array(obj):
        v = as_view(obj, name)
        if v.dtype not in ("int32", "int64") or v.ndim != 1:
            raise ValueError(f"{name} must be a 1-d int32 or int64 array of B + 1 cumulative lengths, got {v.dtype} "
                             f"{tuple(v.shape)}")  # fmt: skip
        if v.adapter is None:
            raise TypeError(f"{name} is a device array of a library without a cudnnkit adapter, so its values cannot "
                            "be read; pass it as a host sequence (a list or a NumPy array)")  # fmt: skip
        values = np.asarray(v.adapter.to_numpy(obj))  # synchronizes
    else:
        try:
            values = np.asarray(obj)
        except Exception as e:
            raise TypeError(f"{name} must be a 1-d integer sequence or array, got {type(obj).__name__}") from e
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise ValueError(f"{name} must be a 1-d integer sequence or array of B + 1 cumulative lengths, got "
                             f"{values.dtype} of shape {values.shape}")  # fmt: skip
    return values.astype(np.int64)


def _max_len(given: Any, lengths: Any, name: str, cu_name: str) -> int:
    longest = int(lengths.max())
    if given is None:
        return longest
    if not isinstance(given, int) or isinstance(given, bool) or given < longest:
        raise ValueError(f"{name} must be an int >= the longest sequence of {cu_name} ({longest}), got {given!r}")
    return given


def _ragged_arrays(arrays: dict, cu_q: Any, cu_kv: Any, max_q: Any, max_kv: Any, stream: Any,
                   out_strides: dict[str, tuple[int, ...]]) -> tuple[int, int, int]:  # fmt: skip
    """A ragged (packed, THD) call's extra arrays, into ``arrays``: the padding mask's ``seq_len_q``/``seq_len_kv``
    (int32, B) and each packed array's ragged offsets (``ragged_<name>``, int64, ``B + 1``: ``cu_seqlens`` times
    the array's token stride, in elements: cuDNN 9.19's composite attention has no offset multiplier), from
    ``cu_seqlens_q``/``cu_seqlens_kv`` (flash-attn's and torch's varlen convention: int, ``B + 1`` cumulative
    token counts from 0), read on the host, checked and uploaded with q's library on the call's stream.
    ``out_strides``: the strides of the arrays the call makes (their offsets are computed before they exist).
    Returns ``(B, S_max_q, S_max_kv)``. Every check before any upload, each error naming the argument."""
    import numpy as np

    if cu_q is None or cu_kv is None:
        raise ValueError("a ragged (packed) batch needs both cu_seqlens_q= and cu_seqlens_kv=")
    for name in ("seq_len_q", "seq_len_kv"):
        if arrays.get(name) is not None:
            raise ValueError(f"{name}: cu_seqlens_q/cu_seqlens_kv give the lengths of a packed batch; do not pass "
                             f"{name} too")  # fmt: skip
    views = {}
    for name in ("q", "k", "v", "o", "do"):
        if arrays.get(name) is None:
            continue
        v = views[name] = as_view(arrays[name], name)
        if v.ndim != 3:
            raise ValueError(f"{name} must be 3-d (T, H, D) (packed) with cu_seqlens_q/cu_seqlens_kv, got shape "
                             f"{tuple(v.shape)}")  # fmt: skip
        if v.strides[-1] != 1 and v.shape[-1] > 1:
            raise ValueError(f"{name} (packed) must have a contiguous head dim (last stride 1), got strides "
                             f"{tuple(v.strides)}")  # fmt: skip
    for name, st in out_strides.items():
        if st[-1] != 1:
            raise ValueError(f"{name} (packed) must have a contiguous head dim (last stride 1), got strides {st}")
    values = {}
    for side, cu, cu_name in (("q", cu_q, "cu_seqlens_q"), ("kv", cu_kv, "cu_seqlens_kv")):
        c = _cu_values(cu, cu_name)
        if c.shape[0] < 2:
            raise ValueError(f"{cu_name} must have B + 1 >= 2 values (0, then each sample's end), got {c.tolist()}")
        lengths = np.diff(c)
        if c[0] != 0 or (lengths < 1).any():
            raise ValueError(f"{cu_name} must start at 0 and grow by at least 1 per sample (every sequence has a "
                             f"token), got {c.tolist()}")  # fmt: skip
        t = views["q" if side == "q" else "k"].shape[0]
        if c[-1] > t:
            raise ValueError(f"{cu_name} ends at {int(c[-1])} tokens but {'q' if side == 'q' else 'k'} has T = {t}")
        values[side] = (c, lengths)
    b = values["q"][0].shape[0] - 1
    if values["kv"][0].shape[0] - 1 != b:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_kv must have the same B + 1 values, got {b + 1} and "
                         f"{values['kv'][0].shape[0]}")  # fmt: skip
    sq = _max_len(max_q, values["q"][1], "max_seqlen_q", "cu_seqlens_q")
    skv = _max_len(max_kv, values["kv"][1], "max_seqlen_kv", "cu_seqlens_kv")
    vq = views["q"]
    if vq.adapter is None:
        raise TypeError("q comes from a library without a cudnnkit adapter, so the ragged offsets made from "
                        "cu_seqlens cannot be uploaded; pass CuPy arrays or torch tensors")  # fmt: skip
    st = None if stream is None else validate_stream(stream, vq.adapter, vq.device)
    token_strides = {n: v.strides[0] for n, v in views.items()}
    token_strides.update({n: s[0] for n, s in out_strides.items()})
    made: dict[tuple[str, int], Any] = {}
    for name, ts in token_strides.items():
        side = _RAGGED_SIDES[name]
        if (side, ts) not in made:
            made[side, ts] = vq.adapter.from_numpy(values[side][0] * ts, vq.device, st)
        arrays[f"ragged_{name}"] = made[side, ts]
    arrays["seq_len_q"] = vq.adapter.from_numpy(values["q"][1].astype(np.int32), vq.device, st)
    arrays["seq_len_kv"] = vq.adapter.from_numpy(values["kv"][1].astype(np.int32), vq.device, st)
    return b, sq, skv


def _check_saved(views: dict, o_shape: tuple, stats_shape: tuple) -> None:
    """A backward's ``o`` and ``do`` of the forward's output shape and its ``stats`` of the forward's; ``ValueError``
    naming the array otherwise (the half-precision and fp8 backwards)."""
    for name in ("o", "do"):
        got = tuple(views[name].shape)
        if got != o_shape:
            raise ValueError(f"{name} must have shape {o_shape} (B, H, S_q, D_v), got {got}")
    got = tuple(views["stats"].shape)
    if got != stats_shape:
        raise ValueError(f"stats must have shape {stats_shape} (B, H, S_q, 1): the forward's, got {got}")


def _check_dropout_seed(views: dict, backward: str) -> None:
    """A dropout call's ``seed`` and ``offset`` views: present, each a one-element int64 device array (the same pair
    replays the mask in ``backward``); ``ValueError`` naming the argument otherwise."""
    for name in ("seed", "offset"):
        x = views.get(name)
        if x is None:
            raise ValueError(f"dropout_p > 0 needs seed= and offset= (one-element int64 device arrays; the same "
                             f"pair replays the mask in {backward})")  # fmt: skip
        if x.dtype != "int64" or x.size != 1:
            raise ValueError(f"{name} must be a one-element int64 device array, got {x.dtype} {tuple(x.shape)}")


def attention_forward(q: Any, k: Any, v: Any, *, attn_mask: Any = None, dropout_p: float = 0.0,
                      is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                      diagonal_alignment: str = "top_left", left_bound: int | None = None,
                      right_bound: int | None = None, seq_len_q: Any = None, seq_len_kv: Any = None,
                      alibi_slopes: Any = None, softcap: float | None = None, seed: Any = None, offset: Any = None,
                      sink: Any = None, page_table_k: Any = None, page_table_v: Any = None,
                      max_seq_len_kv: int | None = None, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                      max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None, out: Any = None,
                      stream: Any = None) -> tuple[Any, Any]:  # fmt: skip
    """Attention forward with every variant cuDNN 9.19 runs, in torch's keyword names: ``(o, stats)``.

    ``o = softmax(mask(modify(scale * q @ k^T))) @ v``: the scores scaled, then (in this order) the softcap, the
    additive ``attn_mask``, ALiBi, the padding mask of ``seq_len_q``/``seq_len_kv``, the causal or banded
    diagonal mask, the softmax (with ``sink`` logits), dropout, and the product with ``v``. ``q``
    ``(B, H, S_q, D)``, ``k`` ``(B, H_kv, S_kv, D)``, ``v`` ``(B, H_kv, S_kv, D_v)`` share one of float16 and
    bfloat16, with a contiguous head dim (BHSD or BSHD memory; another last stride is copied to C order); ``D``
    and ``D_v`` are multiples of 8 from 8 to 256 and may differ; ``H_kv`` is ``H`` unless ``enable_gqa=True``.
    Two more layouts: a **packed (ragged, THD) batch** of variable-length sequences without padding
    (``cu_seqlens_q``/``cu_seqlens_kv``: ``q`` ``(T_q, H, D)``, ``k`` ``(T_kv, H_kv, D)``, ``v`` ``(T_kv, H_kv,
    D_v)``) and **paged key/value caches** for decode and chunked prefill (``page_table_k``/``page_table_v``:
    ``k``/``v`` are caches of ``(num_blocks, H_kv, block_size, D)`` blocks). Every argument is checked before any
    GPU work, each error naming it, including the combinations cuDNN 9.19 refuses on Hopper (under Raises).

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_forward`'s composite of matmul, pointwise, reduction and, with dropout, RNG
    nodes; the node list is :mod:`cudnnkit.graph.nodes.sdpa`'s), one graph per call signature (the variant's
    options are part of it), planned once with the settings' heuristics and cached: the primitive of
    :func:`sdpa_forward` (:data:`SDPA_FORWARD`). A packed batch's ``cu_seqlens`` become ragged offsets and a
    padding mask, uploaded with ``q``'s library on the call's stream before the execute.

    Args:
        q: the queries ``(B, H, S_q, D)`` (packed: ``(T_q, H, D)``), float16 or bfloat16, a CUDA array.
        k: the keys ``(B, H_kv, S_kv, D)`` in ``q``'s dtype (packed: ``(T_kv, H_kv, D)``; paged: the key cache
            ``(num_blocks, H_kv, block_size, D)``).
        v: the values ``(B, H_kv, S_kv, D_v)`` in ``q``'s dtype (packed: ``(T_kv, H_kv, D_v)``; paged: the value
            cache ``(num_blocks, H_kv, block_size, D_v)``).
        attn_mask: an additive mask or bias in ``q``'s dtype or float32, ``(S_q, S_kv)``, ``(1|H, S_q, S_kv)``
            or ``(1|B, 1|H, S_q, S_kv)`` (broadcast over batch and heads): 0 where kept, ``-inf`` where masked,
            or any bias. A boolean mask is refused (cuDNN adds a bias). None: none.
        dropout_p: the probability of dropping an attention weight, in ``[0, 1)``; above 0 it needs ``seed``
            and ``offset``.
        is_causal: mask the scores above the diagonal (``right_bound=0``: keep ``col <= row``, aligned as
            ``diagonal_alignment`` says).
        scale: the factor on the scores, a finite number; None: ``1 / sqrt(D)``.
        enable_gqa: let ``k`` and ``v`` have ``H_kv`` heads, a divisor of ``H`` (grouped-query attention: query
            head ``i`` reads key/value head ``i // (H / H_kv)``); False needs ``H_kv = H``.
        diagonal_alignment: ``"top_left"`` (torch's ``is_causal``: row 0 against key 0) or ``"bottom_right"``
            (the last query row against the last key: rows shifted by ``S_kv - S_q``, per sample with lengths).
        left_bound: a sliding window: keep ``col > row - left_bound`` (an int >= 1; with ``is_causal=True`` a
            window of ``left_bound`` keys). None: no left bound.
        right_bound: keep ``col <= row + right_bound`` (an int >= 0; ``is_causal=True`` is ``right_bound=0``
            and takes no other). None: no right bound.
        seq_len_q: per-sample query lengths, an int32 device array ``(B,)`` or ``(B, 1, 1, 1)``: a padding mask
            with ``seq_len_kv`` (both or neither); rows of ``o`` past a sample's length are not defined. Needed
            with page tables; not with ``cu_seqlens_q``, which makes it.
        seq_len_kv: per-sample key/value lengths, an int32 device array ``(B,)`` or ``(B, 1, 1, 1)``; columns
            past a sample's length are masked.
        alibi_slopes: ALiBi, a float32 device array ``(H,)`` or ``(1, H, 1, 1)``: ``slope_h * (col - row)``
            added to the scores; needs ``is_causal=True``.
        softcap: a positive number ``c``: the scaled scores become ``c * tanh(s / c)``; takes no causal mask,
            bounds, ALiBi or padding lengths (so no packed or paged batch).
        seed: dropout's seed, a one-element int64 device array (with ``dropout_p > 0``).
        offset: dropout's offset, a one-element int64 device array; the same ``seed``/``offset`` pair gives
            the same mask (:func:`attention_backward` replays it).
        sink: attention sinks, a float32 device array ``(H,)`` or ``(1, H, 1, 1)``: one more logit per row in
            the softmax, with no value; needs ``S_q > 1``.
        page_table_k: the key cache's page table, an int32 device array ``(B, blocks)`` or ``(B, 1, blocks, 1)``
            of block indices into ``k``, ``blocks = ceil(S_kv / block_size)``; needs ``page_table_v`` and
            ``seq_len_q``/``seq_len_kv``; not with ``cu_seqlens_*``. None: ``k`` is not paged.
        page_table_v: the value cache's page table, as ``page_table_k``.
        max_seq_len_kv: the paged caches' ``S_kv``; None: the smaller of the two tables' blocks times the block
            size. Only with page tables.
        cu_seqlens_q: a packed batch's query offsets: ``B + 1`` cumulative token counts from 0 (flash-attn's and
            torch's varlen convention), each sequence at least one token, the last at most ``T_q``; a host
            sequence or NumPy array, or an int32/int64 device array (read back: a stream synchronization).
            Needs ``cu_seqlens_kv``; the padding mask is made from both, so ``seq_len_q``/``seq_len_kv`` are not
            passed.
        cu_seqlens_kv: the key/value offsets, as ``cu_seqlens_q`` (the same ``B``), the last at most ``T_kv``.
        max_seqlen_q: the graph's ``S_max`` for queries, an int >= the longest query sequence; None: the
            longest. A larger bucket keeps one plan for many batches. Only with ``cu_seqlens_q``.
        max_seqlen_kv: the same for keys and values.
        out: a tuple ``(o, stats)``, each an array of its shape and dtype to write or None to allocate. A given
            ``o`` needs a contiguous head dim to be written in place (another is written through a C-order
            temporary; packed: it must have one).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(o, stats)``: ``o`` ``(B, H, S_q, D_v)`` in ``q``'s dtype and dim order (packed: ``(T_q, H, D_v)``),
        ``stats`` float32 ``(B, H, S_q, 1)`` (packed: ``(B, H, max_seqlen_q, 1)``, rows past each length not
        defined), each row's log-sum-exp, which :func:`attention_backward` reads. The given ``out`` arrays when
        passed.

    Raises:
        TypeError: a host array, a dtype other than float16/bfloat16, ``k``/``v`` of another dtype than ``q``,
            a boolean ``attn_mask`` or one of another dtype, a flag that is not a bool, a ``scale``/``softcap``/
            ``dropout_p`` that is not a number, a device ``cu_seqlens`` (or a packed ``q``) of a library without a
            cudnnkit adapter, or an ``out`` that is not a pair.
        ValueError: shapes that do not match (the packed and paged forms included), head dims outside the
            multiples of 8 up to 256, ``H_kv`` other than ``H`` without ``enable_gqa``, an optional array of the
            wrong dtype or shape, one of ``seq_len_q``/``seq_len_kv``, ``dropout_p`` outside ``[0, 1)`` or
            without ``seed``/``offset``, a bad bound or alignment, ``sink`` with ``S_q = 1``, bad ``cu_seqlens``
            (not starting at 0, an empty sequence, past ``T``, different ``B``), ``max_seqlen_*`` or
            ``max_seq_len_kv`` without their layout, page tables with ``cu_seqlens`` or without the lengths, and
            what cuDNN 9.19 does not run on Hopper: a bottom-right aligned ``is_causal``/``right_bound`` with
            ``S_q > S_kv`` and no lengths, or with ``attn_mask``, ALiBi or dropout; a ``left_bound`` with
            ``S_q > S_kv`` and no lengths; ALiBi without ``is_causal``; a softcap with a causal mask, bounds,
            ALiBi or lengths.
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU.

    Example:
        >>> import torch
        >>> from cudnnkit import ops
        >>> q = torch.randn(2, 16, 2048, 128, device="cuda", dtype=torch.bfloat16)
        >>> k, v = (torch.randn(2, 4, 2048, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        >>> o, stats = ops.attention_forward(q, k, v, is_causal=True, left_bound=512, enable_gqa=True)  # window
        >>> seed, offset = torch.tensor([1234], device="cuda"), torch.tensor([0], device="cuda")      # int64
        >>> o, stats = ops.attention_forward(q, k, v, dropout_p=0.1, seed=seed, offset=offset, enable_gqa=True)
        >>> cu = [0, 300, 1024, 1500]                                  # a packed batch: 3 sequences, 1500 tokens
        >>> qp, kp, vp = (torch.randn(1500, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        >>> o, stats = ops.attention_forward(qp, kp, vp, is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    """
    o, st = split_out("attention_forward", out, {"out": None, "stats": None})
    arrays = {"q": q, "k": k, "v": v, **_attention_arrays(attn_mask, seq_len_q, seq_len_kv, alibi_slopes, seed,
                                                            offset, sink, page_table_k, page_table_v)}  # fmt: skip
    extra = {}
    if cu_seqlens_q is not None or cu_seqlens_kv is not None:
        vq, vv = as_view(q, "q"), as_view(v, "v")
        o_strides = as_view(o, "out").strides if o is not None else None
        if o_strides is None and vq.ndim == 3 and vv.ndim == 3:
            o_strides = _strides_like((vq.shape[0], vq.shape[1], vv.shape[2]), vq)
        outs = {} if o_strides is None else {"o": tuple(o_strides)}
        extra["ragged"] = _ragged_arrays(arrays, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, stream,
                                         outs)  # fmt: skip
    elif max_seqlen_q is not None or max_seqlen_kv is not None:
        raise ValueError("max_seqlen_q/max_seqlen_kv are for packed batches (cu_seqlens_q=, cu_seqlens_kv=)")
    return run(SDPA_FORWARD, arrays, stream=stream, out=o, stats=st, scale=scale,
               causal=as_bool(is_causal, "is_causal"), enable_gqa=as_bool(enable_gqa, "enable_gqa"),
               dropout=dropout_p, diagonal_alignment=diagonal_alignment, left_bound=left_bound,
               right_bound=right_bound, softcap=softcap, max_seq_len_kv=max_seq_len_kv, **extra)  # fmt: skip


def attention_backward(q: Any, k: Any, v: Any, o: Any, do: Any, stats: Any, *, attn_mask: Any = None,
                       dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                       enable_gqa: bool = False, diagonal_alignment: str = "top_left", left_bound: int | None = None,
                       right_bound: int | None = None, seq_len_q: Any = None, seq_len_kv: Any = None,
                       alibi_slopes: Any = None, softcap: float | None = None, seed: Any = None, offset: Any = None,
                       sink: Any = None, dbias: bool = False, dsink: bool = False, cu_seqlens_q: Any = None,
                       cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                       stream: Any = None) -> tuple[Any, ...]:  # fmt: skip
    """Attention backward with every variant of :func:`attention_forward`: ``(dq, dk, dv[, dmask][, dsink])``.

    From the forward's ``q``, ``k``, ``v``, its ``o`` and ``stats`` and ``do`` (``o``'s cotangent), with the
    forward's keywords passed again: the graph recomputes the masked probabilities from ``stats`` (the same
    ``seed``/``offset`` replay the dropout mask), takes ``rowsum(do * o)`` and makes ``dv = P^T @ do``,
    ``dk = dS^T @ q`` and ``dq = dS @ k``. ``dk``/``dv`` of grouped heads (``enable_gqa``) are summed over the
    query heads of each key/value head; a packed batch's gradients are packed like their inputs. cuDNN's paged
    attention has no backward (no page-table keywords here). Under ``cudnnkit.settings(deterministic=True)`` the
    graph writes ``dq`` without the atomic float32 accumulator (cudnn-frontend's deterministic form) and planning
    rejects engines with cuDNN's NONDETERMINISTIC note: repeats are bitwise equal. cuDNN 9.19's Ampere/Ada
    backward engines take head dims up to 128.

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention backward nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_backward`'s composite), one graph per call signature, planned once with the
    settings' heuristics and cached: the primitive of :func:`sdpa_backward` (:data:`SDPA_BACKWARD`), its float32
    scratch tensors allocated per call with the arrays' library. A packed batch's ``cu_seqlens`` become ragged
    offsets and a padding mask, uploaded with ``q``'s library on the call's stream.

    Args:
        q: the forward's queries ``(B, H, S_q, D)`` (packed: ``(T_q, H, D)``), float16 or bfloat16.
        k: the forward's keys ``(B, H_kv, S_kv, D)`` (packed: ``(T_kv, H_kv, D)``), ``q``'s dtype.
        v: the forward's values ``(B, H_kv, S_kv, D_v)`` (packed: ``(T_kv, H_kv, D_v)``), ``q``'s dtype.
        o: the forward's output ``(B, H, S_q, D_v)`` (packed: ``(T_q, H, D_v)``), ``q``'s dtype.
        do: the gradient of ``o``, ``o``'s shape and dtype.
        stats: the forward's float32 statistics ``(B, H, S_q, 1)`` (packed: ``(B, H, max_seqlen_q, 1)``).
        attn_mask: the forward's additive mask or bias (``q``'s dtype or float32, broadcast over batch and
            heads); None: none.
        dropout_p: the forward's dropout probability, with its ``seed`` and ``offset``.
        is_causal: the forward's ``is_causal``.
        scale: the forward's scale; None: ``1 / sqrt(D)``.
        enable_gqa: the forward's ``enable_gqa`` (``H_kv`` a divisor of ``H``).
        diagonal_alignment: the forward's ``"top_left"`` or ``"bottom_right"``.
        left_bound: the forward's left bound (sliding window), or None.
        right_bound: the forward's right bound, or None.
        seq_len_q: the forward's per-sample query lengths (int32 ``(B,)`` or ``(B, 1, 1, 1)``), with
            ``seq_len_kv``; not with ``cu_seqlens_q``.
        seq_len_kv: the forward's per-sample key/value lengths.
        alibi_slopes: the forward's float32 ALiBi slopes ``(H,)`` or ``(1, H, 1, 1)`` (with ``is_causal``).
        softcap: the forward's softcap, or None.
        seed: the forward's dropout seed (one-element int64 device array).
        offset: the forward's dropout offset (one-element int64 device array).
        sink: the forward's float32 sink logits ``(H,)`` or ``(1, H, 1, 1)``, or None.
        dbias: also return ``attn_mask``'s gradient (needs ``attn_mask``), in its shape and dtype.
        dsink: also return the sink's gradient (needs ``sink``): float32, in its shape.
        cu_seqlens_q: the forward's packed query offsets (``B + 1`` cumulative token counts from 0; a host
            sequence or an int32/int64 device array, read back).
        cu_seqlens_kv: the forward's packed key/value offsets.
        max_seqlen_q: the forward's ``max_seqlen_q`` (``stats`` has it as its length); None: the longest.
        max_seqlen_kv: the forward's ``max_seqlen_kv``; None: the longest.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dq, dk, dv)``, new arrays of ``q``'s, ``k``'s and ``v``'s shapes in ``q``'s dtype, each in its input's
        dim order (C order for an input that is not dense; packed for packed inputs); then, with
        ``dbias=True``, ``attn_mask``'s gradient, and with ``dsink=True`` the sink's.

    Raises:
        TypeError: the forward's type errors; ``o``/``do`` of another dtype than ``q``, ``stats`` not float32,
            or ``dbias``/``dsink`` not a bool.
        ValueError: the forward's checks (shapes, optional arrays, the variant's rules, the packed layout);
            ``o``/``do`` not ``o``'s shape, ``stats`` not the forward's shape, ``dbias`` without ``attn_mask``,
            ``dsink`` without ``sink``.
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU (for example a head
            dim over 128 on Ampere or Ada).

    Example:
        >>> bias = torch.zeros(1, 16, 2048, 2048, device="cuda", dtype=torch.bfloat16)  # a learned bias, per head
        >>> kw = dict(attn_mask=bias, is_causal=True, enable_gqa=True)          # the same keywords both ways
        >>> o, stats = ops.attention_forward(q, k, v, **kw)
        >>> do = torch.randn_like(o)
        >>> dq, dk, dv, dbias = ops.attention_backward(q, k, v, o, do, stats, **kw, dbias=True)  # dbias: bias's shape
    """
    arrays = {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats,
              **_attention_arrays(attn_mask, seq_len_q, seq_len_kv, alibi_slopes, seed, offset, sink)}  # fmt: skip
    extra = {}
    if cu_seqlens_q is not None or cu_seqlens_kv is not None:
        grads = {}
        for g, n in (("dq", "q"), ("dk", "k"), ("dv", "v")):
            x = as_view(arrays[n], n)
            if x.ndim == 3:
                grads[g] = tuple(_strides_like(x.shape, x))
        extra["ragged"] = _ragged_arrays(arrays, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, stream,
                                         grads)  # fmt: skip
    elif max_seqlen_q is not None or max_seqlen_kv is not None:
        raise ValueError("max_seqlen_q/max_seqlen_kv are for packed batches (cu_seqlens_q=, cu_seqlens_kv=)")
    res = run(SDPA_BACKWARD, arrays, stream=stream, scale=scale, causal=as_bool(is_causal, "is_causal"),
              enable_gqa=as_bool(enable_gqa, "enable_gqa"), dropout=dropout_p, diagonal_alignment=diagonal_alignment,
              left_bound=left_bound, right_bound=right_bound, softcap=softcap, dbias=dbias, want_dsink=dsink,
              **extra)  # fmt: skip
    return res[:3] + tuple(g for g, on in zip(res[3:], (dbias, dsink)) if on)


# ----------------------------------------------------------------- the L3 declaration


def _spec_view(s: Spec, name: str) -> ArrayView:
    """A pointer-less view of a spec (what the resolve functions read), its dtype checked as :func:`run` does."""
    v = spec_view(s)
    check_dtype(v, name, _HALF, _FAMILY)
    return v


def _l3_forward(q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False) -> Any:
    """``o`` by one :func:`sdpa_forward` (training: its statistics are a residual); residuals ``q``, ``k``, ``v``,
    ``out`` (o) and ``stats``. ``training`` is not a keyword here: the differentiable op keeps the statistics
    (the forward makes them either way)."""
    o, stats = sdpa_forward(q, k, v, scale=scale, causal=causal)
    return (o,), {"q": q, "k": k, "v": v, "out": o, "stats": stats}


def _l3_backward(res: Any, douts: Any, needs: Any, *, scale: float | None = None, causal: bool = False) -> tuple:
    """``(dq, dk, dv)`` by one :func:`sdpa_backward` (the graph makes all three), None where not needed; all None
    for a zero cotangent."""
    (do,) = douts
    if do is None or not any(needs):
        return (None, None, None)
    grads = sdpa_backward(res["q"], res["k"], res["v"], res["out"], do, res["stats"], scale=scale, causal=causal)
    return tuple(g if n else None for g, n in zip(grads, needs))


def _l3_meta(q: Spec, k: Spec, v: Spec, *, scale: float | None = None, causal: bool = False) -> Any:
    """o as :func:`sdpa_forward` allocates it (q's dim order when q is dense with a contiguous head dim, else C
    order; q's dtype), stats float32 C order; the same checks as the call."""
    views = {"q": _spec_view(q, "q"), "k": _spec_view(k, "k"), "v": _spec_view(v, "v")}
    r = _fwd_resolve(views, {"scale": scale, "causal": causal})
    o = Spec(r.o_shape, r.o_strides, r.dtype)
    stats = Spec(r.stats_shape, contiguous_strides(r.stats_shape), "float32")
    return (o,), {"q": q, "k": k, "v": v, "out": o, "stats": stats}


SDPA = differentiable(
    Differentiable("sdpa", "sdpa_forward", ("q", "k", "v"), ("out",), _l3_forward, _l3_backward, _l3_meta,
                   batch=("q", "k", "v", "out", "stats"),
                   capture_safe=True,  # one sdpa graph execute each way (no dropout: no seed/offset on the host)
                   doc="scaled dot-product attention (scale=, causal=), float16/bfloat16; the backward reads q, k, "
                       "v, o and the softmax statistics: one sdpa_backward graph")
)  # fmt: skip


#: the L3 ``attention`` op's array keywords without a gradient (device arrays the backward reads again)
_ATT_ARRAYS = ("seq_len_q", "seq_len_kv", "alibi_slopes", "seed", "offset")
#: its other keywords, with attention_forward's defaults
_ATT_OPTIONS = {"dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
                "diagonal_alignment": "top_left", "left_bound": None, "right_bound": None, "softcap": None}  # fmt: skip


def _att_options(kw: dict) -> dict:
    """The L3 ``attention`` op's keywords as attention_forward takes them; the packed and paged forms, which this
    op does not have, refused by name."""
    for name in ("cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv"):
        if name in kw:
            raise NotImplementedError(f"attention: {name}: a packed (ragged) batch is cudnnkit.ops.attention_forward/"
                                      "attention_backward's (its offsets are host values), not the differentiable "
                                      "op's")  # fmt: skip
    for name in ("page_table_k", "page_table_v", "max_seq_len_kv"):
        if name in kw:
            raise NotImplementedError(f"attention: {name}: cuDNN's paged attention has no backward; call "
                                      "cudnnkit.ops.attention_forward for decode and chunked prefill")  # fmt: skip
    unknown = sorted(set(kw) - set(_ATT_OPTIONS))
    if unknown:
        raise TypeError(f"attention: unexpected keyword {unknown[0]!r}; it takes {sorted(_ATT_OPTIONS)} and the "
                        f"arrays {list(_ATT_ARRAYS)}")  # fmt: skip
    return {**_ATT_OPTIONS, **kw}


def _att_l3_forward(q: Any, k: Any, v: Any, attn_mask: Any = None, sink: Any = None, *, seq_len_q: Any = None,
                    seq_len_kv: Any = None, alibi_slopes: Any = None, seed: Any = None, offset: Any = None,
                    **kw: Any) -> Any:  # fmt: skip
    """``o`` by one :func:`attention_forward` with the variant's keywords; residuals ``q``, ``k``, ``v``,
    ``attn_mask``, ``sink``, the arrays (what the backward passes again), ``out`` (o) and ``stats``."""
    arrays = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "alibi_slopes": alibi_slopes, "seed": seed,
              "offset": offset}  # fmt: skip
    o, stats = attention_forward(q, k, v, attn_mask=attn_mask, sink=sink, **arrays, **_att_options(kw))
    return (o,), {"q": q, "k": k, "v": v, "attn_mask": attn_mask, "sink": sink, **arrays, "out": o, "stats": stats}


def _att_l3_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    """``(dq, dk, dv, dattn_mask, dsink)`` by one :func:`attention_backward` (the mask's and the sink's gradients
    asked for only where needed), None where not needed; all None for a zero cotangent."""
    (do,) = douts
    if do is None or not any(needs):
        return (None,) * 5
    want_mask, want_sink = bool(needs[3]) and res["attn_mask"] is not None, bool(needs[4]) and res["sink"] is not None
    got = attention_backward(res["q"], res["k"], res["v"], res["out"], do, res["stats"], attn_mask=res["attn_mask"],
                             sink=res["sink"], **{n: res[n] for n in _ATT_ARRAYS}, dbias=want_mask, dsink=want_sink,
                             **_att_options(kw))  # fmt: skip
    rest = iter(got[3:])
    dmask = next(rest) if want_mask else None
    dsink = next(rest) if want_sink else None
    return tuple(g if n else None for g, n in zip((*got[:3], dmask, dsink), needs))


def _att_l3_meta(q: Spec, k: Spec, v: Spec, attn_mask: Spec | None = None, sink: Spec | None = None, *,
                 seq_len_q: Spec | None = None, seq_len_kv: Spec | None = None, alibi_slopes: Spec | None = None,
                 seed: Spec | None = None, offset: Spec | None = None, **kw: Any) -> Any:  # fmt: skip
    """o as :func:`attention_forward` allocates it, stats float32 C order; the same checks as the call."""
    o_ = _att_options(kw)
    arrays = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "alibi_slopes": alibi_slopes, "seed": seed,
              "offset": offset}  # fmt: skip
    views = {"q": _spec_view(q, "q"), "k": _spec_view(k, "k"), "v": _spec_view(v, "v"),
             "attn_mask": spec_view(attn_mask), "sink": spec_view(sink),
             **{n: spec_view(a) for n, a in arrays.items()}}  # fmt: skip
    r = _fwd_resolve(views, {"scale": o_["scale"], "causal": as_bool(o_["is_causal"], "is_causal"),
                             "enable_gqa": as_bool(o_["enable_gqa"], "enable_gqa"), "dropout": o_["dropout_p"],
                             "diagonal_alignment": o_["diagonal_alignment"], "left_bound": o_["left_bound"],
                             "right_bound": o_["right_bound"], "softcap": o_["softcap"]})  # fmt: skip
    o = Spec(r.o_shape, r.o_strides, r.dtype)
    stats = Spec(r.stats_shape, contiguous_strides(r.stats_shape), "float32")
    return (o,), {"q": q, "k": k, "v": v, "attn_mask": attn_mask, "sink": sink, **arrays, "out": o, "stats": stats}


def _att_batch_refuses(kw: Any, specs: Any) -> str | None:
    """A batch folds into q/k/v's B unless an array of the call is per sample: a mask with a batch dim, padding
    lengths (a head's sink or ALiBi slope, and a mask shared by the batch, fold); nor with dropout (its mask hangs on
    the batch index)."""
    m = specs.get("attn_mask")
    if m is not None and len(m.shape) == 4 and m.shape[0] != 1:
        return f"attn_mask has a batch dim of {m.shape[0]} (one mask per sample)"
    if specs.get("seq_len_q") is not None or specs.get("seq_len_kv") is not None:
        return "seq_len_q/seq_len_kv are per sample"
    if kw.get("dropout_p", 0.0):
        return ("dropout_p > 0: cuDNN draws each position's mask by its place in the batch, so a folded batch would "
                "not give each example the mask of its own call")  # fmt: skip
    return None


ATTENTION = differentiable(
    Differentiable("attention", "sdpa_forward", ("q", "k", "v", "attn_mask", "sink"), ("out",), _att_l3_forward,
                   _att_l3_backward, _att_l3_meta, arrays=_ATT_ARRAYS, batch=("q", "k", "v", "out", "stats"),
                   batch_refuses=_att_batch_refuses,
                   capture_safe=True,  # one attention graph execute each way: every array it takes is a device
                   # array (dropout's seed/offset too); the packed and paged forms, which read or upload host
                   # values, are not this op's
                   doc="""attention with attention_forward's variants (torch's keyword names): an additive attn_mask
(or bias, differentiable: its gradient by cuDNN's dbias), sink logits (differentiable), dropout_p with seed/offset
int64 device arrays, is_causal, scale, enable_gqa (H_kv a divisor of H), diagonal_alignment, left_bound/right_bound
(a sliding window), seq_len_q/seq_len_kv (int32 padding lengths), alibi_slopes, softcap; q (B, H, S_q, D), k
(B, H_kv, S_kv, D), v (B, H_kv, S_kv, D_v), float16/bfloat16. One attention_forward graph, one attention_backward
graph. Packed (cu_seqlens) and paged batches are the L2 functions'.""")
)  # fmt: skip
