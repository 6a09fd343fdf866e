"""fp8 scaled dot-product attention (per-tensor scaling), forward and backward: the composite that cuDNN's fp8
attention engines match, built from matmul, pointwise, reduction, reshape (and rng) nodes.

The patterns follow cudnn-frontend's fp8 forward (``sdpa_fp8``: its ``CompositeSDPANode`` with an fp8 MMA core
and ``MatmulFP8Node`` for ``P @ V``) and its ``SDPAFP8BackwardNode`` (per-tensor scales, not MXFP8), node for node
(read from the frontend's headers, nothing copied). Every quantized tensor ``x`` comes with the float32 factor
that turns it back into real values (``descale_x``, ``x_real = descale_x * x``) and every quantized result with
the factor that maps it onto the fp8 range (``scale_x``, ``x = fp8(scale_x * x_real)``); each ``amax_x`` is the
largest magnitude of ``x_real`` before its scale (what a delayed-scaling recipe turns into the next step's
``scale_x``).

Forward (``o = softmax(scale * q @ k^T) @ v`` in real values)::

    S  = matmul(q, k^T) * scale * descale_q * descale_k           (float32; k described as its transpose)
    S  = padding mask, diagonal band (right bound, left bound)     (the bf16 composite's masks)
    P  = softmax(S)  (row max, SUB, EXP, row sum, LOG + ADD -> stats, DIV)  [* dropout mask * 1/(1-p)]
    amax_s = AMAX(P);  P8 = fp8(P * scale_s)                       (P8 in q's dtype)
    O' = matmul(P8, v) * descale_s * descale_v;  o = fp8(O' * scale_o);  amax_o = AMAX(O')

Backward (``dq``, ``dk``, ``dv`` in real values, each quantized with its own scale)::

    [dropout mask: the RNG node first]
    D  = rowsum(do * o) * descale_do * descale_o  [* (1-p)]         (virtual: no scratch tensor)
    S  = matmul(q, k^T) * scale * descale_q * descale_k; padding mask; band; SUB stats; EXP  -> E
    P8 = fp8(E [* mask * 1/(1-p)] * scale_s); P8^T (reshape)
    dv = fp8(sum_heads(matmul(P8^T, do)) * descale_s * descale_do * scale_dv); amax_dv before scale_dv
    dP = (matmul(do, v^T) * descale_do * descale_v - D) * E [* 1/(1-p)] * scale   (v described as its transpose)
    amax_dp = AMAX(dP); dP8 = fp8(dP * scale_dp) (do's dtype); dP8^T (reshape)
    dq = fp8(matmul(dP8, k) * descale_dp * descale_k * scale_dq)             (k through a reshape back)
    dk = fp8(sum_heads(matmul(dP8^T, q)) * descale_dp * descale_q * scale_dk)

(the frontend's backward applies the masks before ``- stats``, unlike its half-precision backward, and leaves
the dropout mask out of ``dP``: the engine matches the pattern and implements the semantics.) ``sum_heads`` is a
reduction over the query heads of each key/value head (grouped-query attention).

What cuDNN 9.19 runs on Hopper (cudnn-frontend's support surface for fp8, raised here as :class:`GraphError`):
q, k, v (and o, do, the gradients) ``float8_e4m3fn`` or ``float8_e5m2`` (q, k, v one dtype); head dims multiples
of 16 up to 256 in the forward, exactly 128 (``D = D_v = 128``) in the backward; causal / sliding-window masks
top-left aligned only (bottom-right fp8 masks are Blackwell's); padding masks from per-sample lengths; dropout;
grouped-query heads. Refused (not offered here): an additive bias (the frontend refuses it for fp8), ALiBi,
softcap, sinks, paged caches, float16/bfloat16 outputs (Blackwell with cuDNN 9.13+), ragged (THD) backward,
MXFP8 block scaling (cuDNN 9.21, Blackwell).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ..checks import as_ints, dense_like, is_bool
from ..errors import GraphError
from ..tensor import Tensor
from .sdpa import _Variant, resolve_variant

#: the fp8 data types of q, k, v, o, do and the gradients
FP8 = ("float8_e4m3fn", "float8_e5m2")
#: cuDNN 9.19's fp8 forward on Hopper: head dims multiples of this up to :data:`FP8_MAX_HEAD_DIM`
FP8_HEAD_DIM_MULTIPLE = 16
FP8_MAX_HEAD_DIM = 256
#: cuDNN 9.19's fp8 backward on Hopper takes this head dim only (``D = D_v``)
FP8_BACKWARD_HEAD_DIM = 128

#: the scale-factor arguments of each direction, in their positional order
FORWARD_FACTORS = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
BACKWARD_FACTORS = (
    "descale_q",
    "descale_k",
    "descale_v",
    "descale_o",
    "descale_do",
    "descale_s",
    "descale_dp",
    "scale_s",
    "scale_dq",
    "scale_dk",
    "scale_dv",
    "scale_dp",
)


class SdpaFp8Forward(NamedTuple):
    """Outputs of :meth:`Graph.sdpa_fp8_forward`: ``o`` (fp8), the float32 log-sum-exp ``stats`` (None with
    ``stats=False``) and the float32 ``(1, 1, 1, 1)`` ``amax_s``/``amax_o``."""

    o: Tensor
    stats: Tensor | None
    amax_s: Tensor
    amax_o: Tensor


class SdpaFp8Backward(NamedTuple):
    """Outputs of :meth:`Graph.sdpa_fp8_backward`: the fp8 gradients and the float32 ``(1, 1, 1, 1)`` amax of
    each (and of ``dP``, the softmax's input gradient)."""

    dq: Tensor
    dk: Tensor
    dv: Tensor
    amax_dq: Tensor
    amax_dk: Tensor
    amax_dv: Tensor
    amax_dp: Tensor


def check_fp8_shapes(q_dims, k_dims, v_dims, backward: bool = False) -> tuple[int, ...]:
    """``(B, H, S_q, D, H_k, H_v, S_kv, D_v)`` of fp8 attention's q, k, v dims, checked (shared with the L2 op):
    4-d, one batch, k's head dim q's, one key length, ``H`` a multiple of ``H_k`` and ``H_v``, head dims as
    cuDNN 9.19 on Hopper takes them (module docstring). :class:`GraphError` naming the argument otherwise."""
    for role, t in (("q", q_dims), ("k", k_dims), ("v", v_dims)):
        if len(t) != 4:
            raise GraphError(f"{role} must be 4-d (B, H, S, D), got {tuple(t)}")
    b, h, sq, d = q_dims
    bk, hk, skv, dk = k_dims
    bv, hv, skv2, dv = v_dims
    if bk != b or bv != b:
        raise GraphError(f"q, k, v must share the batch size; got {b}, {bk}, {bv}")
    if dk != d:
        raise GraphError(f"k's head dim {dk} must equal q's {d}")
    if skv2 != skv:
        raise GraphError(f"k and v must share the key length; got {skv} and {skv2}")
    if h % hk or h % hv:
        raise GraphError(f"q's {h} heads must be a multiple of k's {hk} and v's {hv} (grouped-query attention)")
    for role, x in (("q", d), ("v", dv)):
        if backward and x != FP8_BACKWARD_HEAD_DIM:
            raise GraphError(f"{role}'s head dim must be {FP8_BACKWARD_HEAD_DIM} for the fp8 backward (cuDNN 9.19 on "
                             f"Hopper: D = D_v = 128), got {x}")  # fmt: skip
        if x % FP8_HEAD_DIM_MULTIPLE or x > FP8_MAX_HEAD_DIM:
            raise GraphError(f"{role}'s head dim must be a multiple of {FP8_HEAD_DIM_MULTIPLE} up to "
                             f"{FP8_MAX_HEAD_DIM} (cuDNN 9.19's fp8 attention on Hopper), got {x}")  # fmt: skip
    return b, h, sq, d, hk, hv, skv, dv


def check_fp8_variant(sq, skv, *, causal, left_bound, right_bound, diagonal_alignment, dropout, padded,
                      names: dict[str, str] | None = None):  # fmt: skip
    """The mask and dropout options of fp8 attention checked: :func:`~cudnnkit.graph.nodes.sdpa.resolve_variant`'s
    rules, and bottom-right aligned masks refused (cuDNN 9.19 runs them in fp8 on Blackwell only).
    ``(left_bound, right_bound, dropout)``."""
    lb, rb, bottom_right, p, _ = resolve_variant(
        sq, skv, causal=causal, left_bound=left_bound, right_bound=right_bound,
        diagonal_alignment=diagonal_alignment, dropout=dropout, padded=padded, names=names,
    )  # fmt: skip
    if bottom_right and (lb is not None or rb is not None):
        nm = (names or {}).get("diagonal_alignment", "diagonal_alignment")
        raise GraphError(f"{nm}='bottom_right' is refused for fp8 attention: cuDNN 9.19 runs bottom-right aligned "
                         "fp8 masks on Blackwell only (cudnn-frontend's support surface); use 'top_left'")  # fmt: skip
    return lb, rb, p


def _fp8_dtype(v, role: str) -> str:
    if v not in FP8:
        raise GraphError(f"{role} must be one of {FP8}, got {v!r}")
    return v


class SdpaFp8Nodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add fp8 attention."""

    # ------------------------------------------------------------- arguments

    def _fp8_inputs(self, roles: Sequence[str], tensors: Sequence) -> list[Tensor]:
        out = []
        for role, t in zip(roles, tensors):
            t = self._own(t, role)
            if t.ndim != 4:
                raise GraphError(f"{role} must be 4-d, got {t.dims}")
            if t.strides[3] != 1:
                raise GraphError(f"{role}'s last dim (the head dim) must have stride 1, got strides {t.strides}")
            if t.dtype not in FP8:
                raise GraphError(f"{role} must be fp8 ({' or '.join(FP8)}) for fp8 attention, got {t.dtype}")
            out.append(t)
        return out

    def _fp8_factor(self, v, role: str) -> Tensor:
        """A scale or descale factor: a float32 one-element ``(1, 1, 1, 1)`` tensor (device memory) or a number
        (a by-value constant)."""
        if v is None:
            raise TypeError(f"{role} must be a float32 (1, 1, 1, 1) Tensor or a number, got None")
        t = self._scalar_or(v, role, 4)
        if t.dtype != "float32":
            raise GraphError(f"{role} must be a float32 tensor, got {t.dtype}")
        return t

    def _fp8_variant(self, shape, scale, causal, left_bound, right_bound, diagonal_alignment, seq_len_q,
                     seq_len_kv, dropout) -> _Variant:  # fmt: skip
        b, h, sq, d, hk, hv, skv, dv = shape
        if (seq_len_q is None) != (seq_len_kv is None):
            raise GraphError("a padding mask needs both seq_len_q= and seq_len_kv= (int32 (B, 1, 1, 1) tensors)")
        sql, sqkv = self._seq_len(seq_len_q, "seq_len_q", b), self._seq_len(seq_len_kv, "seq_len_kv", b)
        lb, rb, p = check_fp8_variant(sq, skv, causal=causal, left_bound=left_bound, right_bound=right_bound,
                                      diagonal_alignment=diagonal_alignment, dropout=dropout,
                                      padded=sql is not None)  # fmt: skip
        sc = self._scalar_or(1.0 / math.sqrt(d) if scale is None else scale, "scale", 4)
        return _Variant(b, h, sq, d, hk, hv, skv, dv, sc, lb, rb, False, sql, sqkv, None, None, None, p)

    def _amax(self, x: Tensor, role: str) -> Tensor:
        """``AMAX`` of ``x`` over every dim into a float32 ``(1, 1, 1, 1)`` tensor (virtual until marked)."""
        out = self._vt((1,) * x.ndim, "float32", role)
        self._red(x, out.dims, mode="amax", out=out)
        return out

    def _fp8_matmul(self, a, b, full_dims, out: Tensor, descale_a, descale_b, scale_c, amax_role, *, m=None,
                    k=None) -> Tensor:  # fmt: skip
        """cudnn-frontend's ``matmul_fp8``: ``c = a @ b`` (float32), summed over groups of query heads when
        ``out`` has fewer, ``* descale_a * descale_b``; ``out = c * scale_c``; the amax of ``c`` (returned)."""
        c = self._mm(a, b, full_dims, name=f"{out.name}_mm", m=m, k=k)
        if out.dims[1] != full_dims[1]:
            c = self._red(c, out.dims, name=f"{out.name}_head_sum")
        c = self._pw("MUL", c, descale_a, name=f"{out.name}_descale_a")
        c = self._pw("MUL", c, descale_b, name=f"{out.name}_descale_b")
        self._pw("MUL", c, scale_c, out=out)
        return self._amax(c, amax_role)

    def _fp8_qkv(self, roles: Sequence[str], tensors: Sequence) -> list[Tensor]:
        """:meth:`_fp8_inputs`, q, k and v (the first three) of one fp8 dtype."""
        got = self._fp8_inputs(roles, tensors)
        q, k, v = got[:3]
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise GraphError(f"q, k, v must share one fp8 dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
        return got

    def _fp8_scores(self, q: Tensor, k: Tensor, ov: _Variant, f: dict) -> Tensor:
        """The masked scores both passes compute: ``band(pad(q @ k^T * scale * descale_q * descale_k))`` (k read
        as its transpose), ``(B, H, Sq, Skv)`` float32."""
        b, h, sq, d, hk, skv = ov.b, ov.h, ov.sq, ov.d, ov.hk, ov.skv
        self._describe_as(k, (b, hk, d, skv), (k.strides[0], k.strides[1], k.strides[3], k.strides[2]), "k")
        s = self._mm(q, k, (b, h, sq, skv), name="qk", m=ov.seq_len_q, n=ov.seq_len_kv)
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, ov.scale, name="scaled")
        s = self._pw("MUL", s, f["descale_q"], name="descale_q")
        s = self._pw("MUL", s, f["descale_k"], name="descale_k")
        return self._band(self._modify(s, ov, {}), ov)

    # ------------------------------------------------------------- forward

    def sdpa_fp8_forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        descale_q: Tensor | float,
        descale_k: Tensor | float,
        descale_v: Tensor | float,
        descale_s: Tensor | float,
        scale_s: Tensor | float,
        scale_o: Tensor | float,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        diagonal_alignment: str = "top_left",
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        stats: bool = True,
        o_dtype: str | None = None,
        o_strides: Sequence[int] | None = None,
        name: str = "",
    ) -> SdpaFp8Forward:
        """fp8 attention forward: ``o = fp8(scale_o * softmax(scale * q @ k^T) @ v)`` in dequantized values.

        ``q`` ``(B, H, Sq, D)``, ``k`` ``(B, Hk, Skv, D)``, ``v`` ``(B, Hv, Skv, Dv)``: one fp8 dtype
        (``float8_e4m3fn`` or ``float8_e5m2``), head dim contiguous, ``H`` a multiple of ``Hk`` and ``Hv``,
        ``D``/``Dv`` multiples of 16 up to 256. The six factors (float32 ``(1, 1, 1, 1)`` tensors, or numbers
        as by-value constants): ``descale_q/k/v`` dequantize the inputs, ``scale_s`` quantizes the
        probabilities for the second matmul and ``descale_s`` undoes it (usually ``1 / scale_s``), ``scale_o``
        quantizes the output. ``scale`` (default ``1/sqrt(D)``), ``causal``, ``left_bound``/``right_bound``
        (top-left aligned), ``seq_len_q``/``seq_len_kv``, ``dropout``/``seed``/``offset``: as
        :meth:`sdpa_forward`.

        Returns :class:`SdpaFp8Forward`: ``o`` ``(B, H, Sq, Dv)`` (``o_dtype``, an fp8 type, default q's;
        ``o_strides`` or q's layout), ``stats`` the float32 log-sum-exp ``(B, H, Sq, 1)`` (without ``stats``
        written to a :meth:`scratch` tensor, as the half-precision forward), ``amax_s`` (the largest
        probability, after dropout) and ``amax_o`` (the largest ``|o|`` before ``scale_o``): float32
        ``(1, 1, 1, 1)``; all virtual until marked (every one must be marked: the pattern writes them all).
        The node pattern and cuDNN 9.19's refusals on Hopper: the module docstring.
        """
        if o_strides is not None:
            o_strides = as_ints(o_strides, "o_strides")
        if not is_bool(stats):
            raise TypeError(f"stats must be a bool, got {stats!r}")
        q, k, v = self._fp8_qkv(("q", "k", "v"), (q, k, v))
        o_dtype = q.dtype if o_dtype is None else _fp8_dtype(o_dtype, "o_dtype")
        shape = check_fp8_shapes(q.dims, k.dims, v.dims)
        f = {r: self._fp8_factor(x, r) for r, x in zip(FORWARD_FACTORS, (descale_q, descale_k, descale_v,
                                                                          descale_s, scale_s, scale_o))}  # fmt: skip
        ov = self._fp8_variant(shape, scale, causal, left_bound, right_bound, diagonal_alignment, seq_len_q,
                               seq_len_kv, dropout)  # fmt: skip
        b, h, sq, d, hk, hv, skv, dv = shape
        p = ov.dropout
        if p and (seed is None or offset is None):  # checked before any node; the RNG node follows the softmax
            self._dropout_mask((b, h, sq, skv), p, seed, offset)
        base = (name + "_") if name else ""
        odims = (b, h, sq, dv)
        o = self.tensor(odims, dense_like(odims, q.strides) if o_strides is None else o_strides, o_dtype,
                        virtual=True, name=name or "o")  # fmt: skip
        st = self._vt((b, h, sq, 1), "float32", base + "stats")
        if not stats:  # as sdpa_forward: the statistics to a scratch tensor the executor allocates
            st = Tensor(st.uid, st.dims, st.strides, st.dtype, False, False, st.name, self._id)
            self._tensors[st.uid] = st
            self._add_scratch(st, None)
        s = self._fp8_scores(q, k, ov, f)
        # softmax (cudnn-frontend's CompositeSoftmaxNode with stats)
        row = (b, h, sq, 1)
        mx = self._red(s, row, mode="max", name="row_max")
        e = self._pw("EXP", self._pw("SUB", s, mx, name="minus_max"), name="exp")
        sm = self._red(e, row, name="row_sum")
        self._pw("ADD", mx, self._pw("LOG", sm, name="log_sum"), out=st)
        pr = self._pw("DIV", e, sm, name="probs")
        if p:
            pr = self._pw("MUL", pr, self._dropout_mask((b, h, sq, skv), p, seed, offset), name="dropped")
            pr = self._pw("MUL", pr, self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale"),
                          name="probs_scaled")  # fmt: skip
        amax_s = self._amax(pr, base + "amax_s")
        p8 = self._pw("MUL", pr, f["scale_s"], dtype=q.dtype, name="probs_fp8")
        amax_o = self._fp8_matmul(p8, v, odims, o, f["descale_s"], f["descale_v"], f["scale_o"], base + "amax_o",
                                  m=ov.seq_len_q, k=ov.seq_len_kv)  # fmt: skip
        return SdpaFp8Forward(o, st if stats else None, amax_s, amax_o)

    # ------------------------------------------------------------- backward

    def sdpa_fp8_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        do: Tensor,
        stats: Tensor,
        descale_q: Tensor | float,
        descale_k: Tensor | float,
        descale_v: Tensor | float,
        descale_o: Tensor | float,
        descale_do: Tensor | float,
        descale_s: Tensor | float,
        descale_dp: Tensor | float,
        scale_s: Tensor | float,
        scale_dq: Tensor | float,
        scale_dk: Tensor | float,
        scale_dv: Tensor | float,
        scale_dp: Tensor | float,
        *,
        scale: float | Tensor | None = None,
        causal: bool = False,
        left_bound: int | None = None,
        right_bound: int | None = None,
        diagonal_alignment: str = "top_left",
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        grad_dtype: str | None = None,
        dq_strides: Sequence[int] | None = None,
        dk_strides: Sequence[int] | None = None,
        dv_strides: Sequence[int] | None = None,
        name: str = "",
    ) -> SdpaFp8Backward:
        """fp8 attention backward: ``dq``, ``dk``, ``dv`` (fp8) and their amax values.

        ``q``, ``k``, ``v`` as :meth:`sdpa_fp8_forward` took them (cuDNN 9.19 on Hopper: ``D = Dv = 128``), its
        ``o`` (fp8, ``(B, H, Sq, Dv)``) and float32 ``stats`` ``(B, H, Sq, 1)``, and ``do`` (o's gradient, fp8:
        ``float8_e5m2`` as delayed-scaling recipes keep gradients, or ``float8_e4m3fn``). The twelve factors
        (float32 ``(1, 1, 1, 1)`` tensors or numbers): ``descale_q/k/v/o/do`` dequantize the inputs,
        ``scale_s``/``descale_s`` the forward's (the probabilities are quantized again the same way),
        ``scale_dp``/``descale_dp`` quantize and dequantize ``dP`` (the scores' gradient, in do's dtype, between
        the matmuls), ``scale_dq/dk/dv`` the gradients. The options must match the forward's.

        Returns :class:`SdpaFp8Backward`: ``dq``, ``dk``, ``dv`` in ``grad_dtype`` (an fp8 type; default
        do's), their input's layout unless ``*_strides`` say otherwise (``dk``/``dv`` of grouped heads summed
        over each group's query heads), and float32 ``(1, 1, 1, 1)`` ``amax_dq/dk/dv`` (before their scales)
        and ``amax_dp``; all virtual until marked (every one must be marked). The node pattern (no scratch
        tensors, unlike the half-precision backward) and the refusals: the module docstring.
        """
        strides_of = {"dq": dq_strides, "dk": dk_strides, "dv": dv_strides}
        for role, st in strides_of.items():
            if st is not None:
                strides_of[role] = as_ints(st, f"{role}_strides")
        q, k, v, o, do = self._fp8_qkv(("q", "k", "v", "o", "do"), (q, k, v, o, do))
        gdt = do.dtype if grad_dtype is None else _fp8_dtype(grad_dtype, "grad_dtype")
        shape = check_fp8_shapes(q.dims, k.dims, v.dims, backward=True)
        b, h, sq, d, hk, hv, skv, dv = shape
        for role, t in (("o", o), ("do", do)):
            if t.dims != (b, h, sq, dv):
                raise GraphError(f"{role} must have dims {(b, h, sq, dv)}, got {t.dims}")
        stats = self._own(stats, "stats")
        if stats.dims != (b, h, sq, 1) or stats.dtype != "float32":
            raise GraphError(f"stats must be float32 {(b, h, sq, 1)}, got {stats.dtype} {stats.dims}")
        values = (descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp, scale_s, scale_dq,
                  scale_dk, scale_dv, scale_dp)  # fmt: skip
        f = {r: self._fp8_factor(x, r) for r, x in zip(BACKWARD_FACTORS, values)}
        ov = self._fp8_variant(shape, scale, causal, left_bound, right_bound, diagonal_alignment, seq_len_q,
                               seq_len_kv, dropout)  # fmt: skip
        p = ov.dropout
        sl_q, sl_kv = ov.seq_len_q, ov.seq_len_kv
        base = name or "sdpa_fp8_bwd"
        mask = self._dropout_mask((b, h, sq, skv), p, seed, offset) if p else None  # the frontend's: first

        def grad(t: Tensor, role: str) -> Tensor:
            st = strides_of[role]
            return self.tensor(t.dims, t.strides if st is None else st, gdt, virtual=True, name=f"{base}_{role}")

        dq, dk, dvt = grad(q, "dq"), grad(k, "dk"), grad(v, "dv")
        self._describe_as(v, (b, hv, dv, skv), (v.strides[0], v.strides[1], v.strides[3], v.strides[2]), "v")
        # D = rowsum(do * o) * descale_do * descale_o (* keep probability)
        dsum = self._red(self._pw("MUL", do, o, name="do_o"), (b, h, sq, 1), name="rowsum_do_o")
        dsum = self._pw("MUL", dsum, f["descale_do"], name="rowsum_descale_do")
        dsum = self._pw("MUL", dsum, f["descale_o"], name="rowsum_descale_o")
        if p:
            dsum = self._pw("MUL", dsum, self.scalar(1.0 - p, "float32", 4, name="dropout_keep"), name="softmax_sum")
        # the probabilities again: exp(band(pad(scale * q @ k^T * descales)) - stats)
        s = self._fp8_scores(q, k, ov, f)
        e = self._pw("EXP", self._pw("SUB", s, stats, name="minus_stats"), name="probs")
        pr = e
        dscale = None
        if p:
            dscale = self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale")
            pr = self._pw("MUL", self._pw("MUL", e, mask, name="dropped"), dscale, name="probs_scaled")
        p8 = self._pw("MUL", pr, f["scale_s"], dtype=q.dtype, name="probs_fp8")
        tr = (h * sq * skv, sq * skv, 1, skv)
        pt = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="probs_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": p8}, {"y": pt})
        amax_dv = self._fp8_matmul(pt, do, (b, h, skv, dv), dvt, f["descale_s"], f["descale_do"], f["scale_dv"],
                                   f"{base}_amax_dv", m=sl_kv, k=sl_q)  # fmt: skip
        # dP = (do @ v^T * descale_do * descale_v - D) * E (* 1/(1-p)) * scale
        dp = self._mm(do, v, (b, h, sq, skv), name="do_v", m=sl_q, n=sl_kv)
        self._view_nodes.add(len(self._nodes) - 1)
        dp = self._pw("MUL", dp, f["descale_do"], name="do_v_descale_do")
        dp = self._pw("MUL", dp, f["descale_v"], name="do_v_descale_v")
        dp = self._pw("MUL", self._pw("SUB", dp, dsum, name="dp_minus_sum"), e, name="dp_times_probs")
        if p:
            dp = self._pw("MUL", dp, dscale, name="dp_dropout")
        dp = self._pw("MUL", dp, ov.scale, name="dp_scaled")
        amax_dp = self._amax(dp, f"{base}_amax_dp")
        dp8 = self._pw("MUL", dp, f["scale_dp"], dtype=do.dtype, name="dp_fp8")
        # dq = dP8 @ k (k read back through a reshape of its transposed description)
        kv = self.tensor((b, hk, skv, d), k.strides, k.dtype, virtual=True, name="k_view")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": k}, {"y": kv})
        self._view_nodes.add(len(self._nodes) - 1)
        amax_dq = self._fp8_matmul(dp8, kv, (b, h, sq, d), dq, f["descale_dp"], f["descale_k"], f["scale_dq"],
                                   f"{base}_amax_dq", m=sl_q, k=sl_kv)  # fmt: skip
        # dk = dP8^T @ q
        dpt = self.tensor((b, h, skv, sq), tr, do.dtype, virtual=True, name="dp_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": dp8}, {"y": dpt})
        amax_dk = self._fp8_matmul(dpt, q, (b, h, skv, d), dk, f["descale_dp"], f["descale_q"], f["scale_dk"],
                                   f"{base}_amax_dk", m=sl_kv, k=sl_q)  # fmt: skip
        return SdpaFp8Backward(dq, dk, dvt, amax_dq, amax_dk, amax_dv, amax_dp)


#: node kind -> its lowering (the fp8 patterns are made of the other modules' nodes: none of their own)
LOWER: dict = {}
