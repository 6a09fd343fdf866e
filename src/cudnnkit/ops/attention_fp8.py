"""fp8 scaled dot-product attention at the array level: :func:`attention_fp8_forward` and
:func:`attention_fp8_backward` (per-tensor scaling, as Transformer Engine's delayed and current scaling use it).

Each quantized array ``x`` (q, k, v, o, do) comes with ``descale_x``, the float32 factor that gives its real
values (``x_real = descale_x * x``); each quantized result with ``scale_x`` (``x = fp8(scale_x * x_real)``); the
functions also return each result's ``amax`` (its largest magnitude before the scale: what a recipe turns into
the next ``scale_x``). The factors are one-element float32 device arrays (shape ``(1,)`` or ``(1, 1, 1, 1)``),
passed by keyword: the plan does not depend on their values (one plan per shape class, as the other attention
ops), so a training loop updates them in place without planning again.

=============  ========================  ==================================================================
array          shape                     notes
=============  ========================  ==================================================================
``q``          ``(B, H, S_q, D)``        ``float8_e4m3fn`` or ``float8_e5m2``; head dim contiguous (BHSD or
                                         BSHD memory; another last stride is copied to C order)
``k``          ``(B, H_kv, S_kv, D)``    q's dtype; ``H_kv`` a divisor of ``H`` with ``enable_gqa=True``
``v``          ``(B, H_kv, S_kv, D_v)``  q's dtype
``o``          ``(B, H, S_q, D_v)``      fp8 (``o_dtype``, default q's), q's dim order
``stats``      ``(B, H, S_q, 1)``        float32 log-sum-exp of each row (what the backward reads)
``do``         ``(B, H, S_q, D_v)``      fp8, either type (recipes keep gradients in ``float8_e5m2``)
``dq/dk/dv``   q's, k's, v's             fp8 (``grad_dtype``, default do's), their input's dim order
amax values    ``(1,)``                  float32
=============  ========================  ==================================================================

What cuDNN 9.19 runs on Hopper, refused here otherwise (``ValueError``/``TypeError`` naming the argument, before
any GPU work): head dims multiples of 16 up to 256 (the backward: ``D = D_v = 128``); ``is_causal`` and
``left_bound``/``right_bound`` top-left aligned; padding masks (``seq_len_q``/``seq_len_kv``); dropout with
``seed``/``offset``; no ``attn_mask``, ALiBi, softcap, sinks or paged caches; fp8 outputs only. The graphs are
:meth:`cudnnkit.graph.Graph.sdpa_fp8_forward`/``sdpa_fp8_backward`` (cudnn-frontend's fp8 patterns: the node list
is in :mod:`cudnnkit.graph.nodes.sdpa_fp8`), planned once per call signature and cached.

These two declarations are not in the op registry (:data:`cudnnkit.ops.REGISTRY`): they have no L3
(differentiable) form, which would need a scaling recipe to pick ``scale_dp``/``scale_dq``/... from the forward.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ..graph.checks import as_bool
from ..graph.nodes.sdpa_fp8 import BACKWARD_FACTORS, FORWARD_FACTORS, FP8, check_fp8_shapes, check_fp8_variant
from ..runtime.dtypes import check_scalar
from ._graphform import Binder, graph_form
from ._primitive import Operand, Output, Primitive, run, split_out

__all__ = ["attention_fp8_forward", "attention_fp8_backward", "FP8_FORWARD", "FP8_BACKWARD"]

_FAMILY = "fp8 attention"
_NAMES = {"causal": "is_causal", "dropout": "dropout_p"}


class _Fp8(NamedTuple):
    """A call, resolved (hashable: the caches key on it)."""

    q: tuple[int, ...]
    k: tuple[int, ...]
    v: tuple[int, ...]
    scale: float
    causal: bool
    left_bound: int | None
    right_bound: int | None
    dropout: float
    padded: bool
    o_dtype: str
    o_strides: tuple[int, ...]
    grad_dtype: str | None = None
    grad_strides: tuple[tuple[int, ...], ...] = ()

    @property
    def o_shape(self) -> tuple[int, ...]:
        return self.q[:3] + (self.v[3],)

    @property
    def stats_shape(self) -> tuple[int, ...]:
        return self.q[:3] + (1,)


def _dtype_kw(v: Any, name: str, default: str) -> str:
    if v is None:
        return default
    if v not in FP8:
        raise ValueError(f"{name} must be one of {FP8} (cuDNN 9.19 on Hopper writes fp8 only), got {v!r}")
    return v


def _resolve(views: Any, kw: Any, backward: bool) -> _Fp8:
    from .attention import _strides_like  # one rule for a new output's layout (the attention ops')

    vq, vk, vv = views["q"], views["k"], views["v"]
    for n, x in (("k", vk), ("v", vv)):
        if x.dtype != vq.dtype:
            raise TypeError(f"{n} must have q's dtype {vq.dtype}, got {x.dtype}")
    for n, x in (("q", vq), ("k", vk), ("v", vv)):
        if x.ndim != 4:
            raise ValueError(f"{n} must be 4-d (B, H, S, D), got shape {tuple(x.shape)}")
        if min(x.shape) < 1:
            raise ValueError(f"{n} must not be empty, got shape {tuple(x.shape)}")
    gqa = as_bool(kw.get("enable_gqa", False), "enable_gqa")
    if vk.shape[1] != vq.shape[1] and not gqa:
        raise ValueError(f"k and v have {vk.shape[1]} heads for q's {vq.shape[1]}: pass enable_gqa=True for "
                         "grouped-query attention")  # fmt: skip
    if vv.shape[1] != vk.shape[1]:
        raise ValueError(f"v must have k's {vk.shape[1]} heads, got {vv.shape[1]}")
    try:
        check_fp8_shapes(tuple(vq.shape), tuple(vk.shape), tuple(vv.shape), backward=backward)
    except ValueError as e:  # GraphError is a ValueError: the same text at this level
        raise ValueError(str(e)) from None
    for name in FORWARD_FACTORS + BACKWARD_FACTORS:
        x = views.get(name)
        if x is not None and (x.dtype != "float32" or x.size != 1):
            raise ValueError(f"{name} must be a one-element float32 device array, got {x.dtype} {tuple(x.shape)}")
    b = vq.shape[0]
    lens = [views.get("seq_len_q"), views.get("seq_len_kv")]
    if (lens[0] is None) != (lens[1] is None):
        raise ValueError("a padding mask needs both seq_len_q= and seq_len_kv= (int32 device arrays of B elements)")
    for name, x in zip(("seq_len_q", "seq_len_kv"), lens):
        if x is not None and (x.dtype != "int32" or x.shape not in ((b,), (b, 1, 1, 1))):
            raise ValueError(f"{name} must be an int32 device array of shape ({b},) or ({b}, 1, 1, 1), got "
                             f"{x.dtype} {tuple(x.shape)}")  # fmt: skip
    causal = as_bool(kw.get("causal", False), "is_causal")
    try:
        lb, rb, p = check_fp8_variant(
            vq.shape[2], vk.shape[2], causal=causal, left_bound=kw.get("left_bound"),
            right_bound=kw.get("right_bound"), diagonal_alignment=kw.get("diagonal_alignment", "top_left"),
            dropout=kw.get("dropout", 0.0), padded=lens[0] is not None, names=_NAMES,
        )  # fmt: skip
    except ValueError as e:
        raise ValueError(str(e)) from None
    if p:
        from .attention import _check_dropout_seed

        _check_dropout_seed(views, "attention_fp8_backward")
    scale = kw.get("scale")
    scale = 1.0 / math.sqrt(vq.shape[3]) if scale is None else float(check_scalar(scale, "scale"))
    o_shape = tuple(vq.shape[:3]) + (vv.shape[3],)
    return _Fp8(tuple(vq.shape), tuple(vk.shape), tuple(vv.shape), scale, causal, lb, rb, p, lens[0] is not None,
                _dtype_kw(kw.get("o_dtype"), "o_dtype", vq.dtype), _strides_like(o_shape, vq))  # fmt: skip


def _fwd_resolve(views: Any, kw: Any) -> _Fp8:
    return _resolve(views, kw, backward=False)


def _bwd_resolve(views: Any, kw: Any) -> _Fp8:
    from .attention import _check_saved, _strides_like

    r = _resolve(views, kw, backward=True)
    _check_saved(views, r.o_shape, r.stats_shape)

    grads = tuple(_strides_like(views[n].shape, views[n]) for n in ("q", "k", "v"))
    gdt = _dtype_kw(kw.get("grad_dtype"), "grad_dtype", views["do"].dtype)
    return r._replace(grad_dtype=gdt, grad_strides=grads, o_dtype=views["o"].dtype)


# ----------------------------------------------------------------- the graphs

_ONE = ((1, 1, 1, 1), (1, 1, 1, 1))


def _common(bd: Any, c: Any, factors: tuple[str, ...]) -> dict[str, Any]:
    r = c.resolved
    kw: dict[str, Any] = {n: bd.tensor(n, *_ONE, "float32") for n in factors}
    # causal is right_bound=0, already resolved
    kw.update(scale=r.scale, left_bound=r.left_bound, right_bound=r.right_bound, dropout=r.dropout)
    b = r.q[0]
    if r.padded:
        for n in ("seq_len_q", "seq_len_kv"):
            kw[n] = bd.tensor(n, (b, 1, 1, 1), (1, 1, 1, 1), "int32")
    if r.dropout:
        for n in ("seed", "offset"):
            kw[n] = bd.tensor(n, *_ONE, "int64")
    return kw


def _fwd_build(c: Any) -> tuple[Any, dict]:
    r, views = c.resolved, c.views
    bd = Binder(c)
    q, k, v = (bd.tensor(n, views[n].shape, views[n].strides, views[n].dtype) for n in ("q", "k", "v"))
    kw = _common(bd, c, FORWARD_FACTORS)
    f = [kw.pop(n) for n in FORWARD_FACTORS]
    got = bd.g.sdpa_fp8_forward(q, k, v, *f, o_dtype=r.o_dtype, **kw)
    bd.output(got.o, "out", r.o_dtype, views["out"].strides)
    bd.output(got.stats, "stats", "float32", views["stats"].strides)
    bd.output(got.amax_s, "amax_s", "float32", (1, 1, 1, 1))
    bd.output(got.amax_o, "amax_o", "float32", (1, 1, 1, 1))
    return bd.done()


def _bwd_build(c: Any) -> tuple[Any, dict]:
    r, views = c.resolved, c.views
    bd = Binder(c)
    t = {n: bd.tensor(n, views[n].shape, views[n].strides, views[n].dtype)
         for n in ("q", "k", "v", "o", "do", "stats")}  # fmt: skip
    kw = _common(bd, c, BACKWARD_FACTORS)
    f = [kw.pop(n) for n in BACKWARD_FACTORS]
    got = bd.g.sdpa_fp8_backward(t["q"], t["k"], t["v"], t["o"], t["do"], t["stats"], *f,
                                 grad_dtype=r.grad_dtype, **kw)  # fmt: skip
    for name, g in zip(("dq", "dk", "dv"), got[:3]):
        bd.output(g, name, r.grad_dtype, views[name].strides)
    for name, g in zip(("amax_dq", "amax_dk", "amax_dv", "amax_dp"), got[3:]):
        bd.output(g, name, "float32", (1, 1, 1, 1))
    return bd.done()


def _head_rows(c: Any, names: tuple[str, ...], outputs: tuple[str, ...] = ()) -> None:
    from .attention import _head_rows as rows  # the attention ops' copy of a non-contiguous head dim

    rows(c, names, outputs)


# ----------------------------------------------------------------- the declarations

_F32 = ("float32",)


def _factor_operands(names: tuple[str, ...]) -> tuple[Operand, ...]:
    return tuple(Operand(n, _F32, packed=True) for n in names)


def _optional_operands() -> tuple[Operand, ...]:
    return (
        Operand("seq_len_q", ("int32",), optional=True, packed=True),
        Operand("seq_len_kv", ("int32",), optional=True, packed=True),
        Operand("seed", ("int64",), optional=True, packed=True),
        Operand("offset", ("int64",), optional=True, packed=True),
    )


def _amax_out(name: str) -> Output:
    return Output(name, shape=lambda r: (1,), dtype=lambda r: "float32")


def _grad(i: int) -> Output:
    name = ("dq", "dk", "dv")[i]
    return Output(name, shape=lambda r: (r.q, r.k, r.v)[i], strides=lambda r: r.grad_strides[i],
                  dtype=lambda r: r.grad_dtype)  # fmt: skip


#: the forward's declaration (not registered: see the module docstring)
FP8_FORWARD = Primitive(
    "attention_fp8_forward",
    inputs=(
        Operand("q", FP8),
        Operand("k", FP8),
        Operand("v", FP8),
        *_factor_operands(FORWARD_FACTORS),
        *_optional_operands(),
    ),  # fmt: skip
    outputs=(
        Output("out", shape=lambda r: r.o_shape, strides=lambda r: r.o_strides, dtype=lambda r: r.o_dtype),
        Output("stats", shape=lambda r: r.stats_shape, dtype=lambda r: "float32"),
        _amax_out("amax_s"),
        _amax_out("amax_o"),
    ),
    resolve=_fwd_resolve,
    graph=graph_form(_fwd_build, lambda c: _head_rows(c, ("q", "k", "v"), ("out",))),
    empty=lambda r: False,
    family=_FAMILY,
)
#: the backward's declaration (not registered)
FP8_BACKWARD = Primitive(
    "attention_fp8_backward",
    inputs=(
        Operand("q", FP8),
        Operand("k", FP8),
        Operand("v", FP8),
        Operand("o", FP8),
        Operand("do", FP8),
        Operand("stats", _F32),
        *_factor_operands(BACKWARD_FACTORS),
        *_optional_operands(),
    ),  # fmt: skip
    outputs=(_grad(0), _grad(1), _grad(2), *(_amax_out(n) for n in ("amax_dq", "amax_dk", "amax_dv", "amax_dp"))),
    resolve=_bwd_resolve,
    graph=graph_form(_bwd_build, lambda c: _head_rows(c, ("q", "k", "v", "o", "do"))),
    empty=lambda r: False,
    family=_FAMILY,
)


# ----------------------------------------------------------------- the public functions


def attention_fp8_forward(q: Any, k: Any, v: Any, *, descale_q: Any, descale_k: Any, descale_v: Any,
                          descale_s: Any, scale_s: Any, scale_o: Any, is_causal: bool = False,
                          scale: float | None = None, enable_gqa: bool = False, left_bound: int | None = None,
                          right_bound: int | None = None, seq_len_q: Any = None, seq_len_kv: Any = None,
                          dropout_p: float = 0.0, seed: Any = None, offset: Any = None, o_dtype: str | None = None,
                          out: Any = None, stream: Any = None) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """fp8 attention forward with per-tensor scaling: ``(o, stats, amax_s, amax_o)``.

    In real values ``o_real = softmax(scale * q_real @ k_real^T (+ masks)) @ v_real``, where ``x_real =
    descale_x * x``. The graph reads the fp8 ``q``, ``k``, ``v`` ``(B, H, S_q, D)``, ``(B, H_kv, S_kv, D)``,
    ``(B, H_kv, S_kv, D_v)`` (one of ``float8_e4m3fn`` and ``float8_e5m2``, head dim contiguous; ``D``, ``D_v``
    multiples of 16 up to 256), dequantizes them with ``descale_q/k/v``, quantizes the probabilities with
    ``scale_s`` before the second matmul (undone by ``descale_s``) and writes ``o = fp8(scale_o * o_real)``. Each
    factor is a one-element float32 device array read at run time: the plan does not depend on the values, so a
    training loop updates them in place without planning again. The masks are top-left aligned; cuDNN 9.19 on
    Hopper runs no ``attn_mask``, ALiBi, softcap, sinks, paged caches or packed batches in fp8 (none is a keyword
    here). Shapes, dtypes and what is refused: the module docstring.

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_fp8_forward`, cudnn-frontend's fp8 pattern: the node list is in
    :mod:`cudnnkit.graph.nodes.sdpa_fp8`), one graph per call signature, planned once with the settings'
    heuristics and cached (declaration :data:`FP8_FORWARD`, not in the op registry).

    Args:
        q: the fp8 queries ``(B, H, S_q, D)``, a CUDA array.
        k: the fp8 keys ``(B, H_kv, S_kv, D)``, ``q``'s dtype.
        v: the fp8 values ``(B, H_kv, S_kv, D_v)``, ``q``'s dtype.
        descale_q: ``q``'s dequantization factor (``q_real = descale_q * q``), a one-element float32 device
            array (shape ``(1,)`` or ``(1, 1, 1, 1)``), as are all the factors.
        descale_k: ``k``'s dequantization factor.
        descale_v: ``v``'s dequantization factor.
        descale_s: undoes ``scale_s`` after the second matmul, normally ``1 / scale_s``.
        scale_s: the probabilities' quantization factor, commonly the fp8 type's largest value (the
            probabilities are at most 1).
        scale_o: ``o``'s quantization factor (``o = fp8(scale_o * o_real)``).
        is_causal: mask the scores above the diagonal (keep ``col <= row``, top-left aligned).
        scale: the factor on the real scores, a finite number; None: ``1 / sqrt(D)``.
        enable_gqa: let ``k`` and ``v`` have ``H_kv`` heads, a divisor of ``H`` (grouped-query attention).
        left_bound: a sliding window: keep ``col > row - left_bound`` (an int >= 1), or None.
        right_bound: keep ``col <= row + right_bound`` (an int >= 0; ``is_causal`` is 0), or None.
        seq_len_q: per-sample query lengths, an int32 device array ``(B,)`` or ``(B, 1, 1, 1)`` (a padding mask,
            with ``seq_len_kv``).
        seq_len_kv: per-sample key/value lengths, as ``seq_len_q``.
        dropout_p: the probability of dropping an attention weight, in ``[0, 1)``; above 0 it needs ``seed``
            and ``offset``.
        seed: dropout's seed, a one-element int64 device array.
        offset: dropout's offset, a one-element int64 device array (the same pair replays the mask in
            :func:`attention_fp8_backward`).
        o_dtype: ``o``'s fp8 type, ``"float8_e4m3fn"`` or ``"float8_e5m2"``; None: ``q``'s (cuDNN 9.19 on
            Hopper writes fp8 only).
        out: a tuple ``(o, stats, amax_s, amax_o)``, each an array of its shape and dtype to write or None to
            allocate.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(o, stats, amax_s, amax_o)``: ``o`` ``(B, H, S_q, D_v)`` in ``o_dtype`` and ``q``'s dim order,
        ``stats`` the float32 log-sum-exp ``(B, H, S_q, 1)`` that :func:`attention_fp8_backward` reads,
        ``amax_s`` the largest probability and ``amax_o`` the largest ``|o_real|`` (before ``scale_o``), each
        float32 ``(1,)``: what a scaling recipe turns into the next ``scale_s``/``scale_o``.

    Raises:
        TypeError: a host array, ``q`` not fp8, ``k``/``v`` of another dtype than ``q``, a factor that is not
            float32, a flag that is not a bool, or an ``out`` that is not a tuple of four.
        ValueError: inputs that are not 4-d or are empty, shapes that do not match, ``H_kv`` other than ``H``
            without ``enable_gqa``, head dims that are not multiples of 16 up to 256, a factor of more than one
            element, one of ``seq_len_q``/``seq_len_kv`` or lengths of the wrong shape, ``dropout_p`` outside
            ``[0, 1)`` or without ``seed``/``offset``, a bad bound (a ``left_bound`` with ``S_q > S_kv`` and no
            lengths), or an ``o_dtype`` that is not fp8.
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU (the limits above are
            cuDNN 9.19's on Hopper).

    Example:
        >>> import torch
        >>> from cudnnkit.ops import attention_fp8
        >>> one = lambda x=1.0: torch.tensor([x], device="cuda")                 # a float32 (1,) factor
        >>> q, k, v = (torch.randn(2, 16, 1024, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
        >>> f = {n: one() for n in ("descale_q", "descale_k", "descale_v", "scale_o")}
        >>> f.update(scale_s=one(448.0), descale_s=one(1 / 448))               # 448: float8_e4m3fn's largest
        >>> o, stats, amax_s, amax_o = attention_fp8.attention_fp8_forward(q, k, v, **f, is_causal=True)
    """
    o, st, a_s, a_o = split_out("attention_fp8_forward", out, {"out": None, "stats": None, "amax_s": None,
                                                               "amax_o": None})  # fmt: skip
    arrays = {"q": q, "k": k, "v": v, "descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v,
              "descale_s": descale_s, "scale_s": scale_s, "scale_o": scale_o, "seq_len_q": seq_len_q,
              "seq_len_kv": seq_len_kv, "seed": seed, "offset": offset}  # fmt: skip
    return run(FP8_FORWARD, arrays, stream=stream, out=o, stats=st, amax_s=a_s, amax_o=a_o, scale=scale,
               causal=is_causal, enable_gqa=enable_gqa, left_bound=left_bound, right_bound=right_bound,
               dropout=dropout_p, o_dtype=o_dtype)  # fmt: skip


def attention_fp8_backward(q: Any, k: Any, v: Any, o: Any, do: Any, stats: Any, *, descale_q: Any, descale_k: Any,
                           descale_v: Any, descale_o: Any, descale_do: Any, descale_s: Any, descale_dp: Any,
                           scale_s: Any, scale_dq: Any, scale_dk: Any, scale_dv: Any, scale_dp: Any,
                           is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                           left_bound: int | None = None, right_bound: int | None = None, seq_len_q: Any = None,
                           seq_len_kv: Any = None, dropout_p: float = 0.0, seed: Any = None, offset: Any = None,
                           grad_dtype: str | None = None,
                           stream: Any = None) -> tuple[Any, Any, Any, Any, Any, Any, Any]:  # fmt: skip
    """fp8 attention backward with per-tensor scaling: ``(dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp)``.

    From the forward's fp8 ``q``, ``k``, ``v``, ``o`` and float32 ``stats``, and ``do`` (``o``'s gradient, fp8
    of either type: recipes keep gradients in ``float8_e5m2``), each fp8 input with its ``descale_*``. The graph
    recomputes the probabilities from ``stats``, quantizes them with ``scale_s`` (undone by ``descale_s``, as in
    the forward), quantizes ``dP`` (the probabilities' gradient, in ``do``'s dtype) with ``scale_dp`` between the
    matmuls (undone by ``descale_dp``) and writes ``dq = fp8(scale_dq * dq_real)``, likewise ``dk`` and ``dv``.
    ``dk``/``dv`` of grouped heads are summed over each group. cuDNN 9.19 on Hopper runs the fp8 backward for
    ``D = D_v = 128`` only. The forward's mask and dropout keywords must be passed again (the same
    ``seed``/``offset`` replay its dropout mask). Shapes and dtypes: the module docstring.

    The cuDNN call: ``cudnnBackendExecute`` of the graph's fused-attention backward nodes
    (:meth:`cudnnkit.graph.Graph.sdpa_fp8_backward`, cudnn-frontend's fp8 backward pattern), one graph per call
    signature, planned once with the settings' heuristics and cached (declaration :data:`FP8_BACKWARD`).

    Args:
        q: the forward's fp8 queries ``(B, H, S_q, 128)``.
        k: the forward's fp8 keys ``(B, H_kv, S_kv, 128)``, ``q``'s dtype.
        v: the forward's fp8 values ``(B, H_kv, S_kv, 128)``, ``q``'s dtype.
        o: the forward's fp8 output ``(B, H, S_q, 128)``.
        do: the gradient of ``o``, ``o``'s shape, either fp8 type.
        stats: the forward's float32 statistics ``(B, H, S_q, 1)``.
        descale_q: ``q``'s dequantization factor, a one-element float32 device array, as are all the factors.
        descale_k: ``k``'s dequantization factor.
        descale_v: ``v``'s dequantization factor.
        descale_o: ``o``'s dequantization factor (normally ``1 / scale_o`` of the forward).
        descale_do: ``do``'s dequantization factor.
        descale_s: the forward's ``descale_s``.
        descale_dp: undoes ``scale_dp``, normally ``1 / scale_dp``.
        scale_s: the forward's ``scale_s``.
        scale_dq: ``dq``'s quantization factor.
        scale_dk: ``dk``'s quantization factor.
        scale_dv: ``dv``'s quantization factor.
        scale_dp: ``dP``'s quantization factor (between the matmuls).
        is_causal: the forward's ``is_causal``.
        scale: the forward's scale; None: ``1 / sqrt(D)``.
        enable_gqa: the forward's ``enable_gqa``.
        left_bound: the forward's left bound, or None.
        right_bound: the forward's right bound, or None.
        seq_len_q: the forward's per-sample query lengths (int32), with ``seq_len_kv``.
        seq_len_kv: the forward's per-sample key/value lengths.
        dropout_p: the forward's dropout probability, with its ``seed`` and ``offset``.
        seed: the forward's dropout seed (one-element int64 device array).
        offset: the forward's dropout offset (one-element int64 device array).
        grad_dtype: the gradients' fp8 type, ``"float8_e4m3fn"`` or ``"float8_e5m2"``; None: ``do``'s.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp)``: new fp8 gradients (``grad_dtype``) of ``q``'s,
        ``k``'s and ``v``'s shapes, each in its input's dim order, then the float32 ``(1,)`` amax of each (and
        of ``dP``), taken before its scale.

    Raises:
        TypeError: the forward's type errors; ``o``/``do`` not fp8 or ``stats`` not float32.
        ValueError: the forward's checks, a head dim other than 128, ``o``/``do`` not ``(B, H, S_q, D_v)``,
            ``stats`` not ``(B, H, S_q, 1)``, or a ``grad_dtype`` that is not fp8.
        cudnnkit.graph.UnsupportedGraphError: no cuDNN engine runs the graph on this GPU.

    Example:
        >>> do = torch.randn(2, 16, 1024, 128, device="cuda").to(torch.float8_e5m2)
        >>> b = {n: one() for n in ("descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "scale_dq")}
        >>> b.update({n: one() for n in ("scale_dk", "scale_dv", "scale_dp", "descale_dp")})
        >>> b.update(scale_s=one(448.0), descale_s=one(1 / 448))
        >>> dq, dk, dv, *amax = attention_fp8.attention_fp8_backward(q, k, v, o, do, stats, **b, is_causal=True)
    """
    arrays = {"q": q, "k": k, "v": v, "o": o, "do": do, "stats": stats, "descale_q": descale_q,
              "descale_k": descale_k, "descale_v": descale_v, "descale_o": descale_o, "descale_do": descale_do,
              "descale_s": descale_s, "descale_dp": descale_dp, "scale_s": scale_s, "scale_dq": scale_dq,
              "scale_dk": scale_dk, "scale_dv": scale_dv, "scale_dp": scale_dp, "seq_len_q": seq_len_q,
              "seq_len_kv": seq_len_kv, "seed": seed, "offset": offset}  # fmt: skip
    return run(FP8_BACKWARD, arrays, stream=stream, scale=scale, causal=is_causal, enable_gqa=enable_gqa,
               left_bound=left_bound, right_bound=right_bound, dropout=dropout_p, grad_dtype=grad_dtype)  # fmt: skip
