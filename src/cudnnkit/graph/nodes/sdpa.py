"""Scaled dot-product attention, forward and backward: the fused-attention composite of matmul, pointwise,
reduction, reshape (and rng) nodes that cuDNN's engines match, or one ``OPERATION_SDPA_FWD``/``_BWD``
(``implementation="unified"``; cuDNN 9.19's operation graph refuses the backward one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
        if skv2 != skv:
            raise GraphError(f"k and v must share the key length; got {skv} and {skv2}")
        if h % hk or h % hv:
            raise GraphError(f"q's {h} heads must be a multiple of k's {hk} and v's {hv} (grouped-query attention)")
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise GraphError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
        return b, h, sq, d, hk, hv, skv, dv

    def _vt(self, dims, dtype, name) -> Tensor:
        return self.tensor(dims, None, dtype, virtual=True, name=name)

    def _mask(self, s: Tensor, left_bound: int | None, right_bound: int | None) -> Tensor:
        """Diagonal band mask on scores ``(B, H, Sq, Skv)`` (top-left aligned): keep
        ``row - left_bound < col <= row + right_bound``; the rest becomes -inf."""
        if left_bound is None and right_bound is None:
            return s
        row = self._pw("GEN_INDEX", s, dtype="int32", name="row_index", axis=2)
        col = self._pw("GEN_INDEX", s, dtype="int32", name="col_index", axis=3)
        ninf = self.scalar(-math.inf, "float32", 4, name="neg_inf")
        if right_bound is not None:
            r = row
            if right_bound:
                r = self._pw(
                    "ADD",
                    row,
                    self.scalar(right_bound, "int32", 4, name="right_bound"),
                    dtype="int32",
                    compute="int32",
                    name="row_plus_right_bound",
                )
            keep = self._pw("CMP_GE", r, col, dtype="bool", compute="bool", name="causal_keep")
            s = self._pw("BINARY_SELECT", s, ninf, keep, name="causal_masked")
        if left_bound is not None:
            c = self._pw(
                "ADD",
                col,
                self.scalar(float(left_bound), "float32", 4, name="left_bound"),
                dtype="float32",
                name="col_plus_left_bound",
            )
            keep = self._pw("CMP_GT", c, row, dtype="bool", compute="bool", name="window_keep")
            s = self._pw("BINARY_SELECT", s, ninf, keep, name="window_masked")
        return s

    def _sdpa_common(self, q, k, v, scale, causal, left_bound, right_bound, implementation, dropout):
        q, k, v = self._own(q, "q"), self._own(k, "k"), self._own(v, "v")
        shape = self._sdpa_check(q, k, v)
        if not isinstance(implementation, str) or implementation not in ("composite", "unified"):
            raise GraphError(f"implementation must be 'composite' or 'unified', got {implementation!r}")
        if causal:
            if right_bound not in (None, 0):
                raise GraphError("causal=True is right_bound=0; do not pass another right_bound")
            right_bound = 0
        for role, bnd in (("left_bound", left_bound), ("right_bound", right_bound)):
            if bnd is not None and (
                not isinstance(bnd, int) or isinstance(bnd, bool) or bnd < 0 or (role == "left_bound" and bnd < 1)
            ):
                raise GraphError(f"{role} must be a non-negative int (left_bound >= 1), got {bnd!r}")
        p = as_real(dropout, "dropout")
        if not 0.0 <= p < 1.0:
            raise GraphError(f"dropout must be within [0, 1), got {dropout}")
        if implementation == "unified" and (left_bound is not None or right_bound is not None or p):
            raise GraphError(
                "the unified SDPA operation of cuDNN 9.19 takes no mask or dropout "
                "(cuDNN 9.21 adds them); use implementation='composite'"
            )
        sc = self._scalar_or(1.0 / math.sqrt(shape[3]) if scale is None else scale, "scale", 4)
        return q, k, v, shape, sc, left_bound, right_bound, p

    def _dropout_mask(self, dims, p: float, seed: Tensor | None, offset: Tensor | None) -> Tensor:
        if seed is None or offset is None:
            raise GraphError("dropout needs seed= and offset= (one-element int64 device tensors)")
        return self.rng(dims, seed=seed, offset=offset, probability=1.0 - p, name="dropout_mask")

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
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        stats: bool = True,
        o_strides: Sequence[int] | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaForward:
        """Scaled dot-product attention forward: ``o = softmax(scale * q @ k^T + mask) @ v``.

        ``q`` ``(B, H, Sq, D)``, ``k`` ``(B, Hk, Skv, D)``, ``v`` ``(B, Hv, Skv, Dv)``
        (any strides with the head dim contiguous: BHSD or BSHD; ``H`` a
        multiple of ``Hk`` and ``Hv`` for grouped-query attention), float16 or
        bfloat16. ``scale`` defaults to ``1/sqrt(D)``. ``causal`` keeps
        ``col <= row``; ``right_bound``/``left_bound`` give a diagonal band
        ``row - left_bound < col <= row + right_bound`` (top-left aligned).
        ``dropout`` (probability of dropping) needs ``seed``/``offset``
        tensors. Returns ``o`` ``(B, H, Sq, Dv)`` (q's dtype, ``o_strides`` or
        q's layout) and, with ``stats``, the float32 softmax log-sum-exp
        ``(B, H, Sq, 1)`` that :meth:`sdpa_backward` needs; both virtual until
        marked. Without ``stats`` the statistics are still written, to a
        :meth:`scratch` tensor: cuDNN 9.19 on an H200 has no engine for the
        pattern without them.

        ``implementation="composite"`` (default) builds cuDNN's fused-attention
        pattern from primitive nodes: ``OPERATION_MATMUL`` (q @ k^T, with k
        described as its transpose), ``OPERATION_POINTWISE`` (scale, mask via
        GEN_INDEX/CMP/BINARY_SELECT, softmax SUB/EXP/DIV/LOG/ADD, dropout MUL),
        ``OPERATION_REDUCTION`` (row max, row sum), ``OPERATION_RNG`` (dropout)
        and ``OPERATION_MATMUL`` (P @ v). ``"unified"`` makes one
        ``CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR`` (cuDNN 9.19: no mask, no dropout).
        """
        if o_strides is not None:
            o_strides = as_ints(o_strides, "o_strides")
        q, k, v, shape, sc, lb, rb, p = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout
        )
        b, h, sq, d, hk, hv, skv, dv = shape
        odims = (b, h, sq, dv)
        o = self.tensor(
            odims,
            dense_like(odims, q.strides) if o_strides is None else o_strides,
            q.dtype,
            virtual=True,
            name=name or "o",
        )
        st = self._vt((b, h, sq, 1), "float32", (name + "_" if name else "") + "stats")
        if not stats:
            # cuDNN 9.19 on an H200 offers no engine for the pattern without statistics (measured): they go to
            # a scratch tensor the executor allocates
            st = Tensor(st.uid, st.dims, st.strides, st.dtype, False, False, st.name, self._id)
            self._tensors[st.uid] = st
            self._add_scratch(st, None)  # written by the pattern before anything reads it
        if implementation == "unified":
            self._add("sdpa_fwd", {}, {"q": q, "k": k, "v": v, "scale": sc}, {"o": o, "stats": st})
            return SdpaForward(o, st if stats else None)
        self._describe_as(k, (b, hk, d, skv), (k.strides[0], k.strides[1], k.strides[3], k.strides[2]), "k")
        s = self._mm(q, k, (b, h, sq, skv), name="qk")
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, sc, name="scaled")
        s = self._mask(s, lb, rb)
        mx = self._red(s, (b, h, sq, 1), mode="max", name="row_max")
        e = self._pw("EXP", self._pw("SUB", s, mx, name="minus_max"), name="exp")
        sm = self._red(e, (b, h, sq, 1), name="row_sum")
        self._pw("ADD", mx, self._pw("LOG", sm, name="log_sum"), out=st)
        pr = self._pw("DIV", e, sm, name="probs")
        if p:
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
        self._mm(pr, v, odims, out=o)
        return SdpaForward(o, st if stats else None)

    def _retype(self, t: Tensor, dtype: str) -> Tensor:
        """The last internal virtual tensor ``t`` with another dtype (the matmul after it reads that type)."""
        new = Tensor(t.uid, t.dims, t.strides, dtype, True, False, t.name, self._id)
        self._tensors[t.uid] = new
        return new

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
        dropout: float = 0.0,
        seed: Tensor | None = None,
        offset: Tensor | None = None,
        dq_strides: Sequence[int] | None = None,
        dk_strides: Sequence[int] | None = None,
        dv_strides: Sequence[int] | None = None,
        implementation: str = "composite",
        name: str = "",
    ) -> SdpaBackward:
        """Attention backward: ``dq``, ``dk``, ``dv`` from the forward's inputs, ``o``, ``do`` and ``stats``.

        Options as in :meth:`sdpa_forward` (they must match the forward's).
        ``o`` and ``do`` ``(B, H, Sq, Dv)``, ``stats`` the forward's float32
        log-sum-exp ``(B, H, Sq, 1)``. Gradients take their input's dtype and
        layout unless ``*_strides`` say otherwise; virtual until marked.

        The composite (default) follows cuDNN's fused attention backward
        pattern: ``rowsum(do * o)`` into a float32 scratch tensor, the scores
        recomputed (matmul, scale, mask, ``exp(s - stats)``), ``dv = P^T @ do``
        and ``dk = dS^T @ q`` through ``OPERATION_RESHAPE`` transposes,
        ``dq = dS @ k`` into a float32 scratch accumulator then
        ``IDENTITY`` into ``dq`` (see :meth:`scratch`); grouped-query heads are
        summed by ``OPERATION_REDUCTION``. ``"unified"`` makes one
        ``CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR`` (no mask, no dropout).
        """
        strides_of = {"dq": dq_strides, "dk": dk_strides, "dv": dv_strides}
        for role, st in strides_of.items():
            if st is not None:
                strides_of[role] = as_ints(st, f"{role}_strides")
        dq_strides, dk_strides, dv_strides = strides_of.values()
        q, k, v, shape, sc, lb, rb, p = self._sdpa_common(
            q, k, v, scale, causal, left_bound, right_bound, implementation, dropout
        )
        b, h, sq, d, hk, hv, skv, dv = shape
        o, do, stats = self._own(o, "o"), self._own(do, "do"), self._own(stats, "stats")
        for role, t in (("o", o), ("do", do)):
            if t.dims != (b, h, sq, dv):
                raise GraphError(f"{role} must have dims {(b, h, sq, dv)}, got {t.dims}")
        if stats.dims != (b, h, sq, 1) or stats.dtype != "float32":
            raise GraphError(f"stats must be float32 {(b, h, sq, 1)}, got {stats.dtype} {stats.dims}")
        base = name or "sdpa_bwd"

        def grad(t: Tensor, strides, role: str) -> Tensor:
            return self.tensor(
                t.dims, t.strides if strides is None else strides, t.dtype, virtual=True, name=f"{base}_{role}"
            )

        dq, dk, dvt = grad(q, dq_strides, "dq"), grad(k, dk_strides, "dk"), grad(v, dv_strides, "dv")
        if implementation == "unified":
            self._add(
                "sdpa_bwd",
                {},
                {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats, "scale": sc},
                {"dq": dq, "dk": dk, "dv": dvt},
            )
            return SdpaBackward(dq, dk, dvt)
        k_strides, v_strides = k.strides, v.strides
        self._describe_as(k, (b, hk, d, skv), (k_strides[0], k_strides[1], k_strides[3], k_strides[2]), "k")
        self._describe_as(v, (b, hv, dv, skv), (v_strides[0], v_strides[1], v_strides[3], v_strides[2]), "v")
        # rowsum(do * o), kept in a float32 scratch tensor
        dsum = self._red(self._pw("MUL", do, o, name="do_o"), (b, h, sq, 1), name="rowsum_do_o")
        rsum = self.tensor((b, h, sq, 1), None, "float32", name="softmax_sum")
        self._add_scratch(rsum, None)  # written (rowsum) before it is read
        keep = self.scalar(1.0 - p, "float32", 4, name="dropout_keep" if p else "one")
        self._pw("MUL", dsum, keep, out=rsum)
        # the probabilities again: exp(scale * q @ k^T + mask - stats)
        s = self._mm(q, k, (b, h, sq, skv), name="qk")
        self._view_nodes.add(len(self._nodes) - 1)
        s = self._pw("MUL", s, sc, name="scaled")
        s = self._pw("SUB", s, stats, name="minus_stats")
        s = self._mask(s, lb, rb)
        e = self._pw("EXP", s, name="probs")
        pr = e
        if p:
            mask = self._dropout_mask((b, h, sq, skv), p, seed, offset)
            dscale = self.scalar(1.0 / (1.0 - p), "float32", 4, name="dropout_scale")
            pr = self._pw("MUL", self._pw("MUL", e, mask, name="dropped"), dscale, name="probs_scaled")
        tr = (h * sq * skv, sq * skv, 1, skv)
        pt = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="probs_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": pr}, {"y": pt})
        self._grouped(self._mm, pt, do, (b, h, skv, dv), dvt, hv, "dv")
        # dS = P * (do @ v^T - rowsum) * scale
        dp = self._mm(do, v, (b, h, sq, skv), name="do_v")
        self._view_nodes.add(len(self._nodes) - 1)
        if p:
            dp = self._pw("MUL", dp, mask, name="dp_dropped")
        ds = self._pw("MUL", self._pw("SUB", dp, rsum, name="dp_minus_sum"), e, name="ds_raw")
        if p:
            ds = self._pw("MUL", ds, dscale, name="ds_dropout")
        ds = self._pw("MUL", ds, sc, name="ds")
        dst = self.tensor((b, h, skv, sq), tr, q.dtype, virtual=True, name="ds_t")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": ds}, {"y": dst})
        self._grouped(self._mm, dst, q, (b, h, skv, d), dk, hk, "dk")
        # dq = dS @ k through a float32 accumulator
        kv = self.tensor((b, hk, skv, d), k_strides, k.dtype, virtual=True, name="k_view")
        self._add("reshape", {"perm": (0, 1, 3, 2)}, {"x": k}, {"y": kv})
        self._view_nodes.add(len(self._nodes) - 1)
        acc = self.tensor((b, h, sq, d), None, "float32", name="dq_accum")
        self._add_scratch(acc, "zero")  # the matmul accumulates into it: zeroed before every run
        self._mm(ds, kv, (b, h, sq, d), out=acc)
        self._pw("IDENTITY", acc, out=dq)
        return SdpaBackward(dq, dk, dvt)

    def _grouped(self, mm, a: Tensor, b: Tensor, full_dims, out: Tensor, heads: int, role: str) -> None:
        """``out = a @ b``, summing groups of query heads down to ``heads`` for grouped-query attention."""
        if full_dims[1] == heads:
            mm(a, b, full_dims, out=out)
            return
        full = self._vt(full_dims, out.dtype, f"{role}_full_heads")
        mm(a, b, full_dims, out=full)
        self._red(full, out.dims, out=out)


def lower_sdpa(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``OPERATION_SDPA_FWD``/``_BWD`` (each tensor by role)."""
    p = "FWD" if n.kind == "sdpa_fwd" else "BWD"
    op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_SDPA_{p}_DESCRIPTOR")
    for role, uid in (*n.inputs, *n.outputs):
        op.set(f"CUDNN_ATTR_OPERATION_SDPA_{p}_{_SDPA_ATTR[role]}", tds[uid])
    return op.finalize(), None


#: node kind -> its lowering
LOWER = {"sdpa_fwd": lower_sdpa, "sdpa_bwd": lower_sdpa}
