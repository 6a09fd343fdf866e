"""Scaled dot-product attention, forward and backward: the fused-attention composite of matmul, pointwise,
reduction, reshape (and rng) nodes that cuDNN's engines match, or one ``OPERATION_SDPA_FWD``/``_BWD``
(``implementation="unified"``; cuDNN 9.19's operation graph refuses the backward one).

The composite follows cudnn-frontend's ``CompositeSDPANode``/``CompositeSDPABackwardNode`` node for node (its
pre-9.21 path, which is what cuDNN 9.19's engines match): on the scores ``scale * q @ k^T``, in this order,
the softcap (``DIV``, ``TANH_FWD``, ``MUL``), the additive bias (``ADD``), ALiBi (``GEN_INDEX`` row/col in int32,
``SUB``, ``MUL`` by the slopes, ``ADD``), the padding mask (``GEN_INDEX`` int32, two ``CMP_LT`` against the
sequence lengths, ``LOGICAL_AND``, ``BINARY_SELECT`` of ``-inf``), then (the backward subtracts the statistics
first) the diagonal band: a right-bound mask and a left-bound mask, each its own ``GEN_INDEX`` row and column
(int32, float32 math), the bound arithmetic, one comparison (``CMP_GE`` for the right bound, ``CMP_GT`` for the
left) and one ``BINARY_SELECT`` of its own ``-inf`` scalar. Sharing one pair of index nodes between the two masks
(what this module did before) is a pattern no cuDNN 9.19 engine matches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ...lib.backend import BackendDescriptor
from ..checks import as_ints, as_real, dense_like
from ..errors import GraphError
from ..tensor import Node, SdpaBackward, SdpaForward, Tensor

#: tensor roles -> attribute suffixes of ``OPERATION_SDPA_FWD``/``_BWD``
_SDPA_ATTR = {
    "q": "QDESC",
    "k": "KDESC",
    "v": "VDESC",
    "o": "ODESC",
    "stats": "STATSDESC",
    "scale": "SCALEDESC",
    "do": "DODDESC",
    "dq": "DQDESC",
    "dk": "DKDESC",
    "dv": "DVDESC",
}

#: the head dims cuDNN 9.19's fused attention takes on Hopper (cudnn-frontend's support surface): multiples of 8
#: up to this, for d_qk and d_v each
MAX_HEAD_DIM = 256
#: ``diagonal_alignment`` values (cudnn-frontend's ``DiagonalAlignment_t``)
ALIGNMENTS = ("top_left", "bottom_right")


class SdpaBackwardBias(NamedTuple):
    """Outputs of :meth:`Graph.sdpa_backward` with ``dbias=True`` or ``dsink=True``: the three gradients, the
    bias's and the sink's (each None unless asked)."""

    dq: Tensor
    dk: Tensor
    dv: Tensor
    dbias: Tensor | None
    dsink: Tensor | None = None


@dataclass
class _Variant:
    """One attention call's options, checked (what the forward and backward patterns read)."""

    b: int
    h: int
    sq: int
    d: int
    hk: int
    hv: int
    skv: int
    dv: int
    scale: Tensor
    left_bound: int | None
    right_bound: int | None
    bottom_right: bool
    seq_len_q: Tensor | None
    seq_len_kv: Tensor | None
    bias: Tensor | None
    alibi_slopes: Tensor | None
    softcap: float | None
    dropout: float
    sink: Tensor | None = None

    @property
    def padded(self) -> bool:
        return self.seq_len_q is not None


class _Cache(NamedTuple):
    """A paged cache's logical ``(B, H, S_kv, D)`` (what the shape checks read in place of k or v)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.dims)


def _bound(v, role: str, minimum: int) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise GraphError(f"{role} must be an int >= {minimum} or None, got {v!r}")
    return v


def resolve_variant(
    sq: int,
    skv: int,
    *,
    causal: bool = False,
    left_bound: int | None = None,
    right_bound: int | None = None,
    diagonal_alignment: str = "top_left",
    dropout: float = 0.0,
    padded: bool = False,
    bias: bool = False,
    alibi: bool = False,
    softcap: float | None = None,
    names: dict[str, str] | None = None,
) -> tuple[int | None, int | None, bool, float, float | None]:
    """The attention variant's options checked and normalized: ``(left_bound, right_bound, bottom_right, dropout,
    softcap)`` (``causal`` is ``right_bound=0``). Raises :class:`GraphError` (a ``ValueError``) naming the
    argument (``names`` maps these keywords to the caller's: the L2 op's torch names) for a bad value and for the
    combinations cuDNN 9.19 refuses on Hopper (cudnn-frontend's support surface): bottom-right causal masking
    with ``S_q > S_kv`` without a padding mask, or with a bias, ALiBi or dropout; a left bound with ``S_q > S_kv``
    without a padding mask; ALiBi without causal masking; a softcap with any mask or ALiBi."""
    nm = {n: n for n in ("causal", "left_bound", "right_bound", "diagonal_alignment", "dropout", "bias",
                         "alibi_slopes", "softcap", "padding")}  # fmt: skip
    nm.update(names or {})
    if not isinstance(causal, bool):
        if type(causal).__name__ != "bool_":  # a NumPy bool is taken
            raise GraphError(f"{nm['causal']} must be a bool, got {causal!r}")
        causal = bool(causal)
    if causal:
        if right_bound not in (None, 0):
            raise GraphError(f"{nm['causal']}=True is right_bound=0; do not pass another right_bound")
        right_bound = 0
    left_bound = _bound(left_bound, nm["left_bound"], 1)
    right_bound = _bound(right_bound, nm["right_bound"], 0)
    if diagonal_alignment not in ALIGNMENTS:
        raise GraphError(f"{nm['diagonal_alignment']} must be one of {ALIGNMENTS}, got {diagonal_alignment!r}")
    bottom_right = diagonal_alignment == "bottom_right"
    p = as_real(dropout, nm["dropout"])
    if not 0.0 <= p < 1.0:
        raise GraphError(f"{nm['dropout']} must be within [0, 1), got {dropout}")
    if alibi and right_bound != 0:
        raise GraphError(f"{nm['alibi_slopes']} needs {nm['causal']}=True (cuDNN's ALiBi pattern is causal: "
                         "right_bound=0)")  # fmt: skip
    if softcap is not None:
        softcap = as_real(softcap, nm["softcap"])
        if not softcap > 0:
            raise GraphError(f"{nm['softcap']} must be a positive number, got {softcap}")
        if right_bound is not None or left_bound is not None or alibi or padded:
            raise GraphError(f"{nm['softcap']} takes no causal mask, bounds, {nm['alibi_slopes']} or padding mask "
                             "(cuDNN's score modifier pattern runs alone)")  # fmt: skip
    if bottom_right and right_bound is not None:
        if not padded and sq > skv:
            raise GraphError(f"{nm['diagonal_alignment']}='bottom_right' needs S_q <= S_kv without a padding mask, "
                             f"got S_q = {sq} and S_kv = {skv}")  # fmt: skip
        if bias or alibi or p:
            raise GraphError(f"bottom-right causal masking takes no {nm['bias']}, {nm['alibi_slopes']} or "
                             f"{nm['dropout']} (cuDNN 9.19)")  # fmt: skip
    if left_bound is not None and not padded and sq > skv:
        raise GraphError(f"{nm['left_bound']} (sliding window) needs S_q <= S_kv without a padding mask, got S_q = "
                         f"{sq} and S_kv = {skv}")  # fmt: skip
    return left_bound, right_bound, bottom_right, p, softcap


def paged_kv_length(b, k_dims, v_dims, table_k, table_v, max_seq_len_kv, lengths: bool) -> int:
    """``S_kv`` of paged caches, checked (cudnn-frontend's rules): ``k``/``v`` containers ``(num_blocks, H_kv,
    block_size, D)``, page tables ``(B, 1, blocks, 1)`` (dims given here; int32 checked by the caller) with
    ``blocks = ceil(S_kv / block_size)``; ``S_kv`` is ``max_seq_len_kv`` or the smaller of the tables' blocks
    times their block size; the sequence lengths (a padding mask) are required. :class:`GraphError` otherwise."""
    if table_k is None or table_v is None:
        raise GraphError("paged attention needs both page_table_k= and page_table_v=")
    if not lengths:
        raise GraphError("paged caches need seq_len_q= and seq_len_kv= (cuDNN reads them through a padding mask)")
    for role, c in (("k", k_dims), ("v", v_dims)):
        if len(c) != 4:
            raise GraphError(f"{role} (a paged cache) must be 4-d (num_blocks, H_kv, block_size, D), got {c}")
    sizes = []
    for role, t, c in (("page_table_k", table_k, k_dims), ("page_table_v", table_v, v_dims)):
        if len(t) != 4 or t[0] != b or t[1] != 1 or t[3] != 1:
            raise GraphError(f"{role} must be (B, 1, blocks, 1) with B = {b}, got {tuple(t)}")
        sizes.append(t[2] * c[2])
    skv = min(sizes) if max_seq_len_kv is None else max_seq_len_kv
    if not isinstance(skv, int) or isinstance(skv, bool) or skv < 1:
        raise GraphError(f"max_seq_len_kv must be a positive int, got {max_seq_len_kv!r}")
    for role, t, c in (("page_table_k", table_k, k_dims), ("page_table_v", table_v, v_dims)):
        if -(-skv // c[2]) != t[2]:
            raise GraphError(f"{role} has {t[2]} blocks for S_kv = {skv} with blocks of {c[2]}: it needs "
                             f"ceil(S_kv / block_size) = {-(-skv // c[2])}")  # fmt: skip
    return skv


class SdpaNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add attention (and its helpers)."""

    def _sdpa_check(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
        for role, t in (("q", q), ("k", k), ("v", v)):
            if t.ndim != 4:
                raise GraphError(f"{role} must be 4-d (B, H, S, D), got {t.dims}")
            if t.strides[3] != 1:
                raise GraphError(f"{role}'s last dim (the head dim) must have stride 1, got strides {t.strides}")
            if t.dtype not in ("float16", "bfloat16"):
                raise GraphError(f"{role} must be float16 or bfloat16, got {t.dtype}")
        b, h, sq, d = q.dims
        bk, hk, skv, dk = k.dims
        bv, hv, skv2, dv = v.dims
        if bk != b or bv != b:
            raise GraphError(f"q, k, v must share the batch size; got {b}, {bk}, {bv}")
        if dk != d:
            raise GraphError(f"k's head dim {dk} must equal q's {d}")
        for role, x in (("q", d), ("v", dv)):
            if x % 8 or x > MAX_HEAD_DIM:
                raise GraphError(
                    f"{role}'s head dim must be a multiple of 8 up to {MAX_HEAD_DIM} (cuDNN 9.19's fused attention "
                    f"on Hopper), got {x}"
                )
        if skv2 != skv:
            raise GraphError(f"k and v must share the key length; got {skv} and {skv2}")
        if h % hk or h % hv:
            raise GraphError(f"q's {h} heads must be a multiple of k's {hk} and v's {hv} (grouped-query attention)")
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise GraphError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
        return b, h, sq, d, hk, hv, skv, dv

    def _vt(self, dims, dtype, name) -> Tensor:
        return self.tensor(dims, None, dtype, virtual=True, name=name)

    # ------------------------------------------------------------- score modifiers and masks

    def _index(self, s: Tensor, axis: int, tag: str, compute: str | None = None) -> Tensor:
        """``GEN_INDEX`` of the scores' row (axis 2) or column (axis 3), int32."""
        what = "row" if axis == 2 else "col"
        return self._pw("GEN_INDEX", s, dtype="int32", compute=compute, name=f"{what}_index_{tag}", axis=axis)

    def _int_pw(self, mode: str, x: Tensor, b: Tensor, name: str) -> Tensor:
        return self._pw(mode, x, b, dtype="int32", compute="int32", name=name)

    def _select(self, s: Tensor, keep: Tensor, name: str) -> Tensor:
        """``keep ? s : -inf`` (``BINARY_SELECT`` with a -inf scalar of its own)."""
        ninf = self.scalar(-math.inf, "float32", 4, name=f"neg_inf_{name}")
        return self._pw("BINARY_SELECT", s, ninf, keep, name=name)

    def _modify(self, s: Tensor, o: _Variant, keep: dict) -> Tensor:
        """The score modifiers that precede the softmax statistics, in cudnn-frontend's order: softcap, bias,
        ALiBi, padding mask. ``keep`` receives what the backward's gradient of the softcap reads."""
        if o.softcap is not None:
            cap = self.scalar(o.softcap, "float32", 4, name="softcap")
            pre = self._pw("DIV", s, cap, name="div_by_softcap")
            keep["softcap"], keep["pre_tanh"] = cap, pre
            s = self._pw("MUL", self._pw("TANH_FWD", pre, name="softcap_tanh"), cap, name="mul_by_softcap")
        if o.bias is not None:
            s = self._pw("ADD", s, o.bias, name="bias_add")
        if o.alibi_slopes is not None:
            row, col = self._index(s, 2, "alibi", "int32"), self._index(s, 3, "alibi", "int32")
            dist = self._int_pw("SUB", col, row, "col_minus_row_alibi")
            s = self._pw("ADD", s, self._pw("MUL", dist, o.alibi_slopes, name="alibi"), name="add_alibi")
        if o.padded:
            row, col = self._index(s, 2, "padding", "int32"), self._index(s, 3, "padding", "int32")
            rk = self._pw("CMP_LT", row, o.seq_len_q, dtype="bool", compute="bool", name="row_lt_seq_len_q")
            ck = self._pw("CMP_LT", col, o.seq_len_kv, dtype="bool", compute="bool", name="col_lt_seq_len_kv")
            both = self._pw("LOGICAL_AND", rk, ck, dtype="bool", compute="bool", name="padding_keep")
            s = self._select(s, both, "padding_masked")
        return s

    def _band(self, s: Tensor, o: _Variant) -> Tensor:
        """The diagonal band ``row - left_bound < col <= row + right_bound`` (bottom-right aligned: ``row``
        shifted by ``S_kv - S_q``, per sample with padding), as cudnn-frontend's two composite diagonal-band
        masks: the right bound (causal), then the left bound (sliding window), each with its own index nodes."""
        if o.right_bound is not None:
            row, col = self._index(s, 2, "right"), self._index(s, 3, "right")
            r = row
            if o.bottom_right:
                skv = o.seq_len_kv if o.padded else self.scalar(o.skv, "int32", 4, name="s_kv")
                sq = o.seq_len_q if o.padded else self.scalar(o.sq, "int32", 4, name="s_q")
                r = self._int_pw("SUB", self._int_pw("ADD", r, skv, "row_plus_s_kv"), sq, "row_shifted")
            if o.right_bound:
                shift = self.scalar(o.right_bound, "int32", 4, name="right_bound")
                r = self._int_pw("ADD", r, shift, "row_plus_right_bound")
            keep = self._pw("CMP_GE", r, col, dtype="bool", compute="bool", name="right_bound_keep")
            s = self._select(s, keep, "right_bound_masked")
        if o.left_bound is not None:
            row, col = self._index(s, 2, "left"), self._index(s, 3, "left")
            if not o.bottom_right:
                lb = self.scalar(float(o.left_bound), "float32", 4, name="left_bound")
            elif not o.padded:
                lb = self.scalar(float(o.left_bound - o.skv + o.sq), "float32", 4, name="left_bound_shifted")
            else:
                lb = self.scalar(o.left_bound, "int32", 4, name="left_bound")
            c = self._pw("ADD", col, lb, dtype=lb.dtype, compute=lb.dtype, name="col_plus_left_bound")
            if o.bottom_right and o.padded:
                c = self._int_pw("ADD", self._int_pw("SUB", c, o.seq_len_kv, "col_minus_s_kv"), o.seq_len_q,
                                 "col_shifted")  # fmt: skip
            keep = self._pw("CMP_GT", c, row, dtype="bool", compute="bool", name="left_bound_keep")
            s = self._select(s, keep, "left_bound_masked")
        return s

    # ------------------------------------------------------------- argument checks

    def _seq_len(self, t, role: str, b: int) -> Tensor | None:
        if t is None:
            return None
        t = self._own(t, role)
        if t.dims != (b, 1, 1, 1) or t.dtype != "int32" or t.virtual:
            raise GraphError(f"{role} must be an int32 (B, 1, 1, 1) = {(b, 1, 1, 1)} tensor, got {t.dtype} {t.dims}")
        return t

    def _sdpa_common(
        self, q, k, v, scale, causal, left_bound, right_bound, implementation, dropout, *, diagonal_alignment,
        seq_len_q, seq_len_kv, bias, alibi_slopes, softcap, sink=None, paged=None,
    ):  # fmt: skip
        q, k, v = self._own(q, "q"), self._own(k, "k"), self._own(v, "v")
        shape = self._sdpa_check(q, *(paged or (k, v)))
        b, h, sq, d, hk, hv, skv, dv = shape
        if not isinstance(implementation, str) or implementation not in ("composite", "unified"):
            raise GraphError(f"implementation must be 'composite' or 'unified', got {implementation!r}")
        if (seq_len_q is None) != (seq_len_kv is None):
            raise GraphError("a padding mask needs both seq_len_q= and seq_len_kv= (int32 (B, 1, 1, 1) tensors)")
        sql, sqkv = self._seq_len(seq_len_q, "seq_len_q", b), self._seq_len(seq_len_kv, "seq_len_kv", b)
        self._ragged_needs_lengths((("q", q), ("k", k), ("v", v)), sql)
        if bias is not None:
            bias = self._own(bias, "bias")
            if bias.ndim != 4 or bias.dims[0] not in (1, b) or bias.dims[1] not in (1, h) or bias.dims[2:] != (sq, skv):
                raise GraphError(f"bias must be (1 or B, 1 or H, S_q, S_kv) = (1|{b}, 1|{h}, {sq}, {skv}), got "
                                 f"{bias.dims}")  # fmt: skip
            if bias.dtype not in (q.dtype, "float32"):
                raise GraphError(f"bias must be q's dtype {q.dtype} or float32, got {bias.dtype}")
        if alibi_slopes is not None:
            alibi_slopes = self._own(alibi_slopes, "alibi_slopes")
            if alibi_slopes.dims != (1, h, 1, 1) or alibi_slopes.dtype != "float32":
                raise GraphError(f"alibi_slopes must be a float32 (1, H, 1, 1) = {(1, h, 1, 1)} tensor, got "
                                 f"{alibi_slopes.dtype} {alibi_slopes.dims}")  # fmt: skip
        if sink is not None:
            sink = self._own(sink, "sink")
            if sink.dims != (1, h, 1, 1) or sink.dtype != "float32":
                raise GraphError(f"sink must be a float32 (1, H, 1, 1) = {(1, h, 1, 1)} tensor, got {sink.dtype} "
                                 f"{sink.dims}")  # fmt: skip
            if sq == 1:
                raise GraphError("sink takes S_q > 1 (cuDNN has no decode-only attention with a sink)")
        lb, rb, bottom_right, p, softcap = resolve_variant(
            sq, skv, causal=causal, left_bound=left_bound, right_bound=right_bound,
            diagonal_alignment=diagonal_alignment, dropout=dropout, padded=sql is not None, bias=bias is not None,
            alibi=alibi_slopes is not None, softcap=softcap,
        )  # fmt: skip
        if implementation == "unified" and (lb is not None or rb is not None or sql is not None or p or bias is not None
                                            or alibi_slopes is not None or softcap is not None
                                            or sink is not None or paged is not None):  # fmt: skip
            raise GraphError(
                "the unified SDPA operation of cuDNN 9.19 takes no mask or dropout (nor bias or a score modifier) "
                "(cuDNN 9.21 adds them); use implementation='composite'"
            )
        sc = self._scalar_or(1.0 / math.sqrt(d) if scale is None else scale, "scale", 4)
        o = _Variant(b, h, sq, d, hk, hv, skv, dv, sc, lb, rb, bottom_right, sql, sqkv, bias, alibi_slopes, softcap,
                     p, sink)  # fmt: skip
        return q, k, v, o

    def _ragged_needs_lengths(self, tensors, seq_len_q) -> None:
        """Ragged (packed) tensors need the padding mask's lengths, as cuDNN's engines do (cudnn-frontend: "Ragged
        offsets are only supported with padding mask")."""
        ragged = [role for role, t in tensors if t is not None and self._own(t, role).uid in self._ragged]
        if ragged and seq_len_q is None:
            raise GraphError(f"ragged (packed) {', '.join(ragged)} need seq_len_q= and seq_len_kv= (cuDNN runs ragged "
                             "offsets only with a padding mask)")  # fmt: skip

    def _ragged_out(self, t: Tensor, offsets: Tensor | None, role: str, padded: bool) -> None:
        """Output ``t`` ragged with ``offsets`` (None: not ragged)."""
        if offsets is None:
            return
        if not padded:
            raise GraphError(f"{role}_ragged_offset (a packed {role}) needs seq_len_q= and seq_len_kv= (cuDNN runs "
                             "ragged offsets only with a padding mask)")  # fmt: skip
        self.set_ragged_offset(t, offsets)

    def _dropout_mask(self, dims, p: float, seed: Tensor | None, offset: Tensor | None) -> Tensor:
        if seed is None or offset is None:
            raise GraphError("dropout needs seed= and offset= (one-element int64 device tensors)")
        return self.rng(dims, seed=seed, offset=offset, probability=1.0 - p, name="dropout_mask")

    def _paged_check(self, q, k, v, pt_k, pt_v, max_seq_len_kv, seq_len_q, seq_len_kv) -> tuple | None:
        """Paged k/v caches (cudnn-frontend's ``paged_cache_load``): the caches' logical shapes for the checks,
        or None (not paged); the rules of :func:`paged_kv_length`."""
        if pt_k is None and pt_v is None:
            if max_seq_len_kv is not None:
                raise GraphError("max_seq_len_kv is for paged caches (page_table_k=, page_table_v=)")
            return None
        q, k, v = self._own(q, "q"), self._own(k, "k"), self._own(v, "v")
        for role, t in (("k", k), ("v", v)):
            if t.uid in self._ragged:
                raise GraphError(f"{role} is a paged cache (page_table_{role}=): it cannot also be ragged")
        tables = [None if t is None else self._own(t, n) for t, n in ((pt_k, "page_table_k"), (pt_v, "page_table_v"))]
        for t, n in zip(tables, ("page_table_k", "page_table_v")):
            if t is not None and t.dtype != "int32":
                raise GraphError(f"{n} must be int32, got {t.dtype}")
        skv = paged_kv_length(q.dims[0], k.dims, v.dims, *(None if t is None else t.dims for t in tables),
                              max_seq_len_kv, seq_len_q is not None and seq_len_kv is not None)  # fmt: skip
        return (
            _Cache((q.dims[0], k.dims[1], skv, k.dims[3]), (0, 0, k.dims[3], 1), k.dtype),
            _Cache((q.dims[0], v.dims[1], skv, v.dims[3]), (0, 0, v.dims[3], 1), v.dtype),
        )

    # ------------------------------------------------------------- forward

    def sdpa_forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        diagonal_alignment: str = "top_left",
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        bias: Tensor | None = None,
        alibi_slopes: Tensor | None = None,
        softcap: float | None = None,
        sink: Tensor | None = None,
        page_table_k: Tensor | None = None,
        page_table_v: Tensor | None = None,
        max_seq_len_kv: int | None = None,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        stats: bool = True,
        o_strides: Sequence[int] | None = None,
        o_ragged_offset: Tensor | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaForward:
        """Scaled dot-product attention forward: ``o = softmax(mask(modify(scale * q @ k^T))) @ v``.

        ``q`` ``(B, H, Sq, D)``, ``k`` ``(B, Hk, Skv, D)``, ``v`` ``(B, Hv, Skv, Dv)`` (any strides with the
        head dim contiguous: BHSD or BSHD; ``H`` a multiple of ``Hk`` and ``Hv`` for grouped/multi-query
        attention; ``D`` and ``Dv`` multiples of 8 up to 256, and may differ), float16 or bfloat16.
        ``scale`` defaults to ``1/sqrt(D)``.

        Masks: ``causal`` keeps ``col <= row``; ``right_bound``/``left_bound`` give a diagonal band
        ``row - left_bound < col <= row + right_bound``; ``diagonal_alignment="top_left"`` (default: row 0
        against column 0, torch's ``is_causal``) or ``"bottom_right"`` (the last query row against the last key:
        ``row`` shifted by ``Skv - Sq``, per sample with a padding mask). ``seq_len_q``/``seq_len_kv`` (int32
        ``(B, 1, 1, 1)`` device tensors, both) mask rows and columns past each sample's lengths (and override the
        matmuls' M/N/K per sample); the output rows past ``seq_len_q`` are not defined.

        Score modifiers: ``bias`` ``(1|B, 1|H, Sq, Skv)`` (q's dtype or float32) added; ``alibi_slopes`` a
        float32 ``(1, H, 1, 1)`` tensor, ``slope[h] * (col - row)`` added (needs ``causal``); ``softcap`` a
        number ``c``: ``c * tanh(s / c)`` (alone: no mask, ALiBi or padding). ``sink`` (attention sinks) a
        float32 ``(1, H, 1, 1)`` tensor: one more logit per row and head in the softmax's max and sum, with no
        value (``S_q > 1``). Paged key/value caches (decode, chunked prefill; the forward only):
        ``page_table_k``/``page_table_v`` int32 ``(B, 1, blocks, 1)`` tensors of block indices into ``k`` and
        ``v``, then the containers ``(num_blocks, Hk, block_size, D)`` and ``(num_blocks, Hv, block_size, Dv)``;
        ``Skv`` is ``max_seq_len_kv`` or blocks times block size; they need ``seq_len_q``/``seq_len_kv``
        (``OPERATION_PAGED_CACHE_LOAD`` into K^T and V, as cudnn-frontend). ``dropout`` (probability of
        dropping) needs ``seed``/``offset`` (one-element int64 device tensors; the same pair replays the same
        mask). cuDNN 9.19's refusals are raised here as :class:`GraphError`: bottom-right causal with ``Sq >
        Skv`` (no padding) or with bias, ALiBi or dropout; a left bound with ``Sq > Skv`` (no padding).

        Ragged (packed, THD) batches: ``q``, ``k``, ``v`` made ragged with :meth:`Graph.set_ragged_offset`
        before this call (each ``(B, H, S_max, D)`` with strides ``(S_max * t, h, t, 1)`` over a packed ``(T, H,
        D)`` array of token stride ``t`` and head stride ``h``; offsets ``cu_seqlens * t`` in elements) need
        ``seq_len_q``/``seq_len_kv`` (cuDNN's padding mask: the lengths are read from there, the offsets only
        place each sample); ``o_ragged_offset`` makes ``o`` ragged too (give ``o_strides`` of its packed layout),
        else ``o`` is padded ``(B, H, S_max, Dv)``. ``stats`` stays padded ``(B, H, S_max, 1)`` (its rows past
        each sample's length are not defined). Each tensor may be ragged or not, as in cudnn-frontend.

        Returns ``o`` ``(B, H, Sq, Dv)`` (q's dtype, ``o_strides`` or q's layout) and, with ``stats``, the
        float32 softmax log-sum-exp ``(B, H, Sq, 1)`` that :meth:`sdpa_backward` needs; both virtual until
        marked. Without ``stats`` the statistics are still written, to a :meth:`scratch` tensor: cuDNN 9.19 on
        an H200 has no engine for the pattern without them.

        ``implementation="composite"`` (default) builds cudnn-frontend's fused-attention pattern from
        primitive nodes: ``OPERATION_MATMUL`` (q @ k^T, k described as its transpose), ``OPERATION_POINTWISE``
        (scale, the modifiers and masks of the module docstring, softmax SUB/EXP/DIV/LOG/ADD, dropout MUL),
        ``OPERATION_REDUCTION`` (row max, row sum), ``OPERATION_RNG`` (dropout) and ``OPERATION_MATMUL`` (P @ v).
        ``"unified"`` makes one ``CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR`` (cuDNN 9.19: scale only).
        """
        if o_strides is not None:
            o_strides = as_ints(o_strides, "o_strides")
        paged = self._paged_check(q, k, v, page_table_k, page_table_v, max_seq_len_kv, seq_len_q, seq_len_kv)
        q, k, v, ov = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout,
            diagonal_alignment=diagonal_alignment, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, bias=bias,
            alibi_slopes=alibi_slopes, softcap=softcap, sink=sink, paged=paged,
        )  # fmt: skip
        b, h, sq, skv, d, dv, hk = ov.b, ov.h, ov.sq, ov.skv, ov.d, ov.dv, ov.hk
        odims = (b, h, sq, dv)
        o = self.tensor(
            odims,
            dense_like(odims, q.strides) if o_strides is None else o_strides,
            q.dtype,
            virtual=True,
            name=name or "o",
        )
        if o_ragged_offset is not None and implementation == "unified":
            raise GraphError("o_ragged_offset: the unified SDPA operation of cuDNN 9.19 takes no ragged tensors; use "
                             "implementation='composite'")  # fmt: skip
        self._ragged_out(o, o_ragged_offset, "o", ov.padded)
        st = self._vt((b, h, sq, 1), "float32", (name + "_" if name else "") + "stats")
        if not stats:
            # cuDNN 9.19 on an H200 offers no engine for the pattern without statistics (measured): they go to
            # a scratch tensor the executor allocates
            st = Tensor(st.uid, st.dims, st.strides, st.dtype, False, False, st.name, self._id)
            self._tensors[st.uid] = st
            self._add_scratch(st, None)  # written by the pattern before anything reads it
        if implementation == "unified":
            self._add("sdpa_fwd", {}, {"q": q, "k": k, "v": v, "scale": ov.scale}, {"o": o, "stats": st})
            return SdpaForward(o, st if stats else None)
        p = ov.dropout
        if p and (seed is None or offset is None):  # checked before any node; the RNG node follows the softmax
            self._dropout_mask((b, h, sq, skv), p, seed, offset)
        if paged is not None:  # cudnn-frontend's paged caches: K^T (BHDS) and V (BHSD) loaded through the tables
            kt = self.tensor((b, hk, d, skv), (d * skv * hk, d * skv, 1, d), k.dtype, virtual=True, name="k_cache")
            self._add("paged_cache_load", {}, {"container": k, "page_table": self._own(page_table_k, "page_table_k"),
                                               "seq_len": ov.seq_len_kv}, {"y": kt})  # fmt: skip
            s = self._mm(q, kt, (b, h, sq, skv), name="qk", m=ov.seq_len_q, n=ov.seq_len_kv)
        else:
            self._describe_as(k, (b, hk, d, skv), (k.strides[0], k.strides[1], k.strides[3], k.strides[2]), "k")
            s = self._mm(q, k, (b, h, sq, skv), name="qk", m=ov.seq_len_q, n=ov.seq_len_kv)
            self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, ov.scale, name="scaled")
        s = self._band(self._modify(s, ov, {}), ov)
        row = (b, h, sq, 1)
        mx = self._red(s, row, mode="max", name="row_max")
        if ov.sink is not None:  # cudnn-frontend's softmax with a sink: one more logit per row, no value
            mx = self._pw("MAX", mx, ov.sink, name="max_with_sink")
        e = self._pw("EXP", self._pw("SUB", s, mx, name="minus_max"), name="exp")
        if ov.sink is not None:
            es = self._pw(
                "EXP",
                self._pw("SUB", ov.sink, mx, out=self._vt(row, self.intermediate_dtype, "sink_minus_max")),
                name="exp_sink",
            )
            sm = self._pw("ADD", self._red(e, row, name="row_sum"), es, name="row_sum_with_sink")
        else:
            sm = self._red(e, row, name="row_sum")
        self._pw("ADD", mx, self._pw("LOG", sm, name="log_sum"), out=st)
        pr = self._pw("DIV", e, sm, name="probs")
        if p:  # cudnn-frontend's order: the RNG node after the softmax, then MUL by the mask and the scale
            pr = self._pw("MUL", pr, self._dropout_mask((b, h, sq, skv), p, seed, offset), name="dropped")
            pr = self._pw(
                "MUL",
                pr,
                self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale"),
                dtype=q.dtype,
                name="probs_scaled",
            )
        else:
            pr = self._retype(pr, q.dtype)
        if paged is not None:
            hv = ov.hv
            vc = self.tensor((b, hv, skv, dv), (dv * skv * hv, dv * skv, dv, 1), v.dtype, virtual=True, name="v_cache")
            self._add("paged_cache_load", {}, {"container": v, "page_table": self._own(page_table_v, "page_table_v"),
                                               "seq_len": ov.seq_len_kv}, {"y": vc})  # fmt: skip
            v = vc
        self._mm(pr, v, odims, out=o, m=ov.seq_len_q, k=ov.seq_len_kv)
        return SdpaForward(o, st if stats else None)

    def _retype(self, t: Tensor, dtype: str) -> Tensor:
        """The last internal virtual tensor ``t`` with another dtype (the matmul after it reads that type)."""
        new = Tensor(t.uid, t.dims, t.strides, dtype, True, False, t.name, self._id)
        self._tensors[t.uid] = new
        return new

    # ------------------------------------------------------------- backward

    def sdpa_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        do: Tensor,
        stats: Tensor,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        diagonal_alignment: str = "top_left",
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        bias: Tensor | None = None,
        dbias: bool = False,
        alibi_slopes: Tensor | None = None,
        softcap: float | None = None,
        sink: Tensor | None = None,
        dsink: bool = False,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        deterministic: bool = False,
        dq_strides: Sequence[int] | None = None,
        dk_strides: Sequence[int] | None = None,
        dv_strides: Sequence[int] | None = None,
        dq_ragged_offset: Tensor | None = None,
        dk_ragged_offset: Tensor | None = None,
        dv_ragged_offset: Tensor | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaBackward | SdpaBackwardBias:
        """Attention backward: ``dq``, ``dk``, ``dv`` from the forward's inputs, ``o``, ``do`` and ``stats``.

        Options as in :meth:`sdpa_forward` (they must match the forward's; ``seed``/``offset`` the same values
        replay its dropout mask). ``o`` and ``do`` ``(B, H, Sq, Dv)``, ``stats`` the forward's float32
        log-sum-exp ``(B, H, Sq, 1)``. Gradients take their input's dtype and layout unless ``*_strides`` say
        otherwise; virtual until marked. ``dk``/``dv`` of grouped-query heads are summed over the query heads
        of each key/value head (``OPERATION_REDUCTION``). ``dbias=True`` (needs ``bias``) also returns the
        bias's gradient (the bias's dims and dtype: ``dS`` summed over the broadcast dims) as
        :class:`SdpaBackwardBias`; ``dsink=True`` (needs ``sink``) the sink's float32 ``(1, H, 1, 1)``
        gradient (its field ``dsink``; cudnn-frontend's pattern: ``exp(sink - stats) * rowsum(do * o)``
        summed, which cuDNN's engine matches to the sink's gradient); a ``sink`` without ``dsink=True`` is
        refused (no node would read it: the stats hold it). ``deterministic=True`` (cudnn-frontend's
        ``use_deterministic_algorithm``, its Hopper form) writes ``dq`` straight from the ``dS @ k`` matmul,
        without the float32 accumulator that the atomic-add engines take; so does ``dbias``.

        The composite (default) follows cudnn-frontend's backward pattern: ``rowsum(do * o)`` (times the
        keep probability) into a float32 scratch tensor, the scores recomputed (matmul, scale, the modifiers,
        ``- stats``, the band, ``exp``), ``dv = P^T @ do`` and ``dk = dS^T @ q`` through ``OPERATION_RESHAPE``
        transposes, ``dq = dS @ k`` into a float32 scratch accumulator (zeroed) then ``IDENTITY`` into ``dq``
        (see :meth:`scratch`). ``"unified"`` makes one ``CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR``
        (scale only).

        Ragged (packed) batches as in :meth:`sdpa_forward`: ``q``, ``k``, ``v``, ``o``, ``do`` each ragged or
        not (:meth:`Graph.set_ragged_offset`), ``stats`` padded; ``dq_ragged_offset``/``dk_ragged_offset``/
        ``dv_ragged_offset`` make the gradients ragged (with ``*_strides`` of their packed layout, or their
        input's). The scratch tensors stay padded (B, H, S_max, ...), as cudnn-frontend's without
        ``max_total_seq_len``.
        """
        strides_of = {"dq": dq_strides, "dk": dk_strides, "dv": dv_strides}
        for role, st in strides_of.items():
            if st is not None:
                strides_of[role] = as_ints(st, f"{role}_strides")
        dq_strides, dk_strides, dv_strides = strides_of.values()
        q, k, v, ov = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout,
            diagonal_alignment=diagonal_alignment, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, bias=bias,
            alibi_slopes=alibi_slopes, softcap=softcap, sink=sink,
        )  # fmt: skip
        b, h, sq, d, hk, hv, skv, dv = ov.b, ov.h, ov.sq, ov.d, ov.hk, ov.hv, ov.skv, ov.dv
        if not isinstance(dbias, bool) or not isinstance(deterministic, bool):
            raise GraphError(f"dbias and deterministic must be bools, got {dbias!r} and {deterministic!r}")
        if dbias and ov.bias is None:
            raise GraphError("dbias=True needs bias= (the gradient of the bias the forward added)")
        if not isinstance(dsink, bool):
            raise GraphError(f"dsink must be a bool, got {dsink!r}")
        if dsink and ov.sink is None:
            raise GraphError("dsink=True needs sink= (the gradient of the sink the forward used)")
        if ov.sink is not None and not dsink:  # it would dangle: no node of the backward reads it
            raise GraphError("sink= without dsink=True: the backward reads the sink only for its gradient (the stats "
                             "already hold it); pass dsink=True, or leave sink out")  # fmt: skip
        o, do, stats = self._own(o, "o"), self._own(do, "do"), self._own(stats, "stats")
        self._ragged_needs_lengths((("o", o), ("do", do), ("stats", stats)), ov.seq_len_q)
        for role, t in (("o", o), ("do", do)):
            if t.dims != (b, h, sq, dv):
                raise GraphError(f"{role} must have dims {(b, h, sq, dv)}, got {t.dims}")
        if stats.dims != (b, h, sq, 1) or stats.dtype != "float32":
            raise GraphError(f"stats must be float32 {(b, h, sq, 1)}, got {stats.dtype} {stats.dims}")
        base = name or "sdpa_bwd"
        p = ov.dropout
        # cudnn-frontend's backward makes the RNG node first (one mask for P and dP)
        mask = self._dropout_mask((b, h, sq, skv), p, seed, offset) if p else None

        def grad(t: Tensor, strides, role: str) -> Tensor:
            return self.tensor(
                t.dims, t.strides if strides is None else strides, t.dtype, virtual=True, name=f"{base}_{role}"
            )

        dq, dk, dvt = grad(q, dq_strides, "dq"), grad(k, dk_strides, "dk"), grad(v, dv_strides, "dv")
        for role, t, off in (("dq", dq, dq_ragged_offset), ("dk", dk, dk_ragged_offset), ("dv", dvt, dv_ragged_offset)):
            self._ragged_out(t, off, role, ov.padded)
        if implementation == "unified":
            self._add(
                "sdpa_bwd",
                {},
                {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats, "scale": ov.scale},
                {"dq": dq, "dk": dk, "dv": dvt},
            )
            return SdpaBackward(dq, dk, dvt)
        sl_q, sl_kv = ov.seq_len_q, ov.seq_len_kv
        k_strides, v_strides = k.strides, v.strides
        self._describe_as(k, (b, hk, d, skv), (k_strides[0], k_strides[1], k_strides[3], k_strides[2]), "k")
        self._describe_as(v, (b, hv, dv, skv), (v_strides[0], v_strides[1], v_strides[3], v_strides[2]), "v")
        # rowsum(do * o), kept in a float32 scratch tensor
        dsum = self._red(self._pw("MUL", do, o, name="do_o"), (b, h, sq, 1), name="rowsum_do_o")
        dsk = None
        if dsink:  # cudnn-frontend's dSink: exp(sink - stats) * rowsum(do * o), summed to (1, H, 1, 1)
            ps = self._pw(
                "EXP",
                self._pw(
                    "SUB", ov.sink, stats, out=self._vt((b, h, sq, 1), self.intermediate_dtype, "sink_minus_stats")
                ),
                name="exp_sink",
            )
            dsk = self.tensor((1, h, 1, 1), None, "float32", virtual=True, name=f"{base}_dsink")
            self._red(self._pw("MUL", ps, dsum, name="sink_grad_rows"), (1, h, 1, 1), out=dsk)
        rsum = self.tensor((b, h, sq, 1), None, "float32", name="softmax_sum")
        self._add_scratch(rsum, None)  # written (rowsum) before it is read
        keep = self.scalar(1.0 - p, "float32", 4, name="dropout_keep" if p else "one")
        self._pw("MUL", dsum, keep, out=rsum)
        # the probabilities again: exp(band(modify(scale * q @ k^T) - stats))
        s = self._mm(q, k, (b, h, sq, skv), name="qk", m=sl_q, n=sl_kv)
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, ov.scale, name="scaled")
        saved: dict = {}
        s = self._modify(s, ov, saved)
        s = self._pw("SUB", s, stats, name="minus_stats")
        s = self._band(s, ov)
        e = self._pw("EXP", s, name="probs")
        pr = e
        if p:
            dscale = self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale")
            pr = self._pw("MUL", self._pw("MUL", e, mask, name="dropped"), dscale, name="probs_scaled")
        tr = (h * sq * skv, sq * skv, 1, skv)
        pt = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="probs_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": pr}, {"y": pt})
        self._grouped(pt, do, (b, h, skv, dv), dvt, hv, "dv", m=sl_kv, k=sl_q)
        # dS = P * (do @ v^T - rowsum) * scale
        dp = self._mm(do, v, (b, h, sq, skv), name="do_v", m=sl_q, n=sl_kv)
        self._view_nodes.add(len(self._nodes) - 1)
        if p:
            dp = self._pw("MUL", dp, mask, name="dp_dropped")
        ds = self._pw("MUL", self._pw("SUB", dp, rsum, name="dp_minus_sum"), e, name="ds_raw")
        if p:
            ds = self._pw("MUL", ds, dscale, name="ds_dropout")
        db = None
        if dbias:
            bt = ov.bias
            db = self.tensor(bt.dims, dense_like(bt.dims, None), bt.dtype, virtual=True, name=f"{base}_dbias")
            self._red(ds, bt.dims, out=db)
        if ov.softcap is not None:  # d/ds of c * tanh(s / c): cudnn-frontend's Softcap.backward
            cap = saved["softcap"]
            t = self._pw("MUL", ds, cap, name="mul_by_softcap_bwd")
            dt = self._vt(t.dims, self.intermediate_dtype, "dtanh")
            attrs = {"mode": "TANH_BWD", "compute_dtype": self.compute_dtype, "alpha1": 1.0, "alpha2": 1.0}
            self._add("pointwise", attrs, {"dy": t, "x": saved["pre_tanh"]}, {"dx": dt})
            ds = self._pw("DIV", dt, cap, name="div_by_softcap_bwd")
        ds = self._pw("MUL", ds, ov.scale, name="ds")
        dst = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="ds_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": ds}, {"y": dst})
        self._grouped(dst, q, (b, h, skv, d), dk, hk, "dk", m=sl_kv, k=sl_q)
        # dq = dS @ k (through a float32 accumulator unless deterministic or dbias: cudnn-frontend's dP workspace)
        kv = self.tensor((b, hk, skv, d), k_strides, k.dtype, virtual=True, name="k_view")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": k}, {"y": kv})
        self._view_nodes.add(len(self._nodes) - 1)
        if k.uid in self._ragged:  # the view of a packed k is packed alike (cudnn-frontend's reshape_k)
            self._ragged[kv.uid] = self._ragged[k.uid]
        if deterministic or dbias:
            self._mm(ds, kv, (b, h, sq, d), out=dq, m=sl_q, k=sl_kv)
        else:
            acc = self.tensor((b, h, sq, d), None, "float32", name="dq_accum")
            self._add_scratch(acc, "zero")  # the matmul accumulates into it: zeroed before every run
            self._mm(ds, kv, (b, h, sq, d), out=acc, m=sl_q, k=sl_kv)
            self._pw("IDENTITY", acc, out=dq)
        if dbias or dsink:
            return SdpaBackwardBias(dq, dk, dvt, db, dsk)
        return SdpaBackward(dq, dk, dvt)

    def _grouped(self, a: Tensor, b: Tensor, full_dims, out: Tensor, heads: int, role: str, *, m=None, k=None):
        """``out = a @ b``, summing groups of query heads down to ``heads`` for grouped-query attention (the
        full-heads product in q's dtype, C order, as cudnn-frontend's ``dK_fullhead``/``dV_fullhead``)."""
        if full_dims[1] == heads:
            self._mm(a, b, full_dims, out=out, m=m, k=k)
            return
        full = self._vt(full_dims, out.dtype, f"{role}_full_heads")
        self._mm(a, b, full_dims, out=full, m=m, k=k)
        self._red(full, out.dims, out=out)


def lower_sdpa(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``OPERATION_SDPA_FWD``/``_BWD`` (each tensor by role)."""
    p = "FWD" if n.kind == "sdpa_fwd" else "BWD"
    op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_SDPA_{p}_DESCRIPTOR")
    for role, uid in (*n.inputs, *n.outputs):
        op.set(f"CUDNN_ATTR_OPERATION_SDPA_{p}_{_SDPA_ATTR[role]}", tds[uid])
    return op.finalize(), None


def lower_paged_cache_load(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, None]:
    """``OPERATION_PAGED_CACHE_LOAD`` (container, page table, sequence lengths, Y), as cudnn-frontend's
    ``PagedCacheLoadNode``."""
    ins, outs = dict(n.inputs), dict(n.outputs)
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC", tds[ins["container"]])
    op.set("CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC", tds[ins["page_table"]])
    op.set("CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC", tds[ins["seq_len"]])
    op.set("CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC", tds[outs["y"]])
    return op.finalize(), None


#: node kind -> its lowering
LOWER = {"sdpa_fwd": lower_sdpa, "sdpa_bwd": lower_sdpa, "paged_cache_load": lower_paged_cache_load}
