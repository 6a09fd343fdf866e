"""JAX's names over the cudnnkit ops: ``jax.lax``/``jax.nn``/flax-style functions whose work is cuDNN's.

Every function here translates its arguments (dimension numbers, ``"SAME"``/``"VALID"`` padding, channel-last
layouts, flax's momentum) and calls one :mod:`cudnnkit.jax` op, so it works under ``jit`` and ``grad`` like the
ops do. cuDNN's ops see channels-first arrays (``(N, C, *spatial)``): a channels-last JAX array reaches them as
it is, seen through a permuted view (:class:`~cudnnkit.jax._ops.Permuted`: channels-last strides, which cuDNN
takes, no transpose in XLA), and the result, written in that layout, comes back through a transpose that XLA
cancels with the one that restores the caller's layout. Weights are transposed to ``(O, I, *k)`` (small).

* :func:`conv_general_dilated` -- ``jax.lax.conv_general_dilated``'s signature (any ``dimension_numbers``,
  ``feature_group_count``, ``rhs_dilation``); :func:`conv` -- flax's layout (``x`` ``(N, *spatial, C)``, ``w``
  ``(*k, C // groups, O)``), ``padding="SAME"`` by default, an optional bias.
* :func:`max_pool`, :func:`avg_pool` -- flax's ``nn.max_pool``/``nn.avg_pool`` (``(N, *spatial, C)``,
  ``window_shape``, ``strides``, ``padding``, ``count_include_pad``).
* :func:`softmax`, :func:`log_softmax` -- ``jax.nn``'s (``axis=``).
* :func:`layer_norm`, :func:`rms_norm` -- over the trailing ``axes`` (flax's ``LayerNorm``/``RMSNorm``).
* :func:`dot_product_attention` -- ``jax.nn.dot_product_attention``'s signature (``(B, T, N, H)`` arrays,
  grouped-query key/value heads, ``scale``, ``is_causal``), by cuDNN's fused attention.
* :func:`batch_norm` -- explicit state in and out (flax's convention: feature axis last, ``momentum`` the weight
  of the old running value).
* :func:`dropout` -- ``dropout(key, rate, x, *, deterministic=False)`` (haiku's ``hk.dropout`` order), an explicit
  ``jax.random`` key and no hidden state: the key's bits are cuDNN's seed, reaching the handler as a device array.
* :func:`lstm`, :func:`gru`, :func:`rnn` -- cuDNN's whole-sequence RNN (layers, directions, LSTM projection,
  sequence lengths) over a params pytree (``params[layer][direction]`` dicts of ``w_ih``, ``w_hh``, ``b_ih``,
  ``b_hh``, ``w_hr``); :func:`init_params`, :func:`pack_params`/:func:`unpack_params` (cuDNN's flat weight buffer),
  :func:`from_flax_lstm`/:func:`to_flax_lstm` (flax's ``OptimizedLSTMCell`` params). In
  :mod:`cudnnkit.jax.rnn`, whose docstring has the shapes.
* :func:`ctc_loss` -- ``optax.ctc_loss``'s signature and per-sequence result (``logits`` ``(B, T, K)``,
  ``logit_paddings``, ``labels``, ``label_paddings``, ``blank_id=0``) by ``cudnnCTCLoss_v8``.

What cuDNN cannot do raises ``NotImplementedError`` naming the argument (``lhs_dilation``, ``batch_group_count``,
a ``where=`` mask, normalization axes that are not trailing, a ``blank_id`` other than 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..graph.checks import as_int
from ..runtime.settings import settings
from ._ops import Permuted, spec
from .rnn import from_flax_lstm, gru, init_params, lstm, pack_params, rnn, to_flax_lstm, unpack_params

__all__ = [
    "conv_general_dilated",
    "conv",
    "max_pool",
    "avg_pool",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "dot_product_attention",
    "dropout",
    "ctc_loss",
    "lstm",
    "gru",
    "rnn",
    "init_params",
    "pack_params",
    "unpack_params",
    "from_flax_lstm",
    "to_flax_lstm",
]

#: JAX's tracer type (a traced ``rate``, or lengths under jit)
_TRACER: Any = getattr(getattr(jax, "core", None), "Tracer", ())


def _op(name: str) -> Any:
    from . import op

    return op(name)


def _tuple(v: Any, n: int, what: str) -> tuple[int, ...]:
    if v is None:
        return (1,) * n
    if isinstance(v, int):
        return (v,) * n
    t = tuple(int(x) for x in v)
    if len(t) != n:
        raise ValueError(f"{what} must have {n} entries (one per spatial dim), got {t}")
    return t


def _pads(spatial: Sequence[int], window: Sequence[int], strides: Sequence[int], dilation: Sequence[int],
          padding: Any, what: str = "padding") -> tuple[tuple[int, int], ...]:  # fmt: skip
    """``padding`` ("SAME", "VALID", "SAME_LOWER" or (lo, hi) pairs) as explicit per-side pairs, as JAX computes
    them (``jax.lax.padtype_to_pads`` on the dilated window)."""
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID", "SAME_LOWER"):
            raise ValueError(f"{what} must be 'SAME', 'VALID', 'SAME_LOWER' or (low, high) pairs, got {padding!r}")
        eff = [(k - 1) * d + 1 for k, d in zip(window, dilation)]
        return tuple((int(lo), int(hi)) for lo, hi in jax.lax.padtype_to_pads(spatial, eff, strides, padding))
    pairs = tuple(tuple(int(v) for v in p) for p in padding)
    if len(pairs) != len(spatial) or any(len(p) != 2 for p in pairs):
        raise ValueError(f"{what} must be 'SAME', 'VALID' or one (low, high) pair per spatial dim, got {padding!r}")
    return pairs  # type: ignore[return-value]


def conv_general_dilated(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: Any,
                         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1, batch_group_count: int = 1,
                         precision: Any = None, preferred_element_type: Any = None) -> Any:  # fmt: skip
    """``jax.lax.conv_general_dilated`` by cuDNN's convolution (``cudnnkit.jax.ops.convolution``: the graph's
    ``conv_fprop`` or ``cudnnConvolutionForward``). ``lhs`` is seen as ``(N, C, *spatial)`` in its own layout (no
    transpose), ``rhs`` transposed to ``(O, I, *k)`` per ``dimension_numbers``, the result laid out per its
    ``out_spec``. ``precision``: ``HIGHEST`` (or ``"highest"``/``"float32"``, alone or in a pair) runs float32 without
    TF32 (``cudnnkit.settings(allow_tf32=False)`` for this call); otherwise TF32 for float32 follows
    ``cudnnkit.settings(allow_tf32=...)`` (on by default, as JAX's default precision on the GPU)."""
    nsp = lhs.ndim - 2
    if lhs_dilation is not None and any(int(v) != 1 for v in lhs_dilation):
        raise NotImplementedError("lhs_dilation != 1 (a transposed convolution): use "
                                  "cudnnkit.jax.ops.convolution_transpose")  # fmt: skip
    if batch_group_count != 1:
        raise NotImplementedError(f"batch_group_count={batch_group_count}: cuDNN's convolution has no batch groups")
    if preferred_element_type is not None and jnp.dtype(preferred_element_type) != jnp.dtype(lhs.dtype):
        raise NotImplementedError(f"preferred_element_type={jnp.dtype(preferred_element_type).name} with "
                                  f"{jnp.dtype(lhs.dtype).name} inputs: cuDNN writes the inputs' dtype")  # fmt: skip
    dn = jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    x = Permuted(lhs, dn.lhs_spec)
    w = jnp.transpose(rhs, dn.rhs_spec)
    strides = _tuple(window_strides, nsp, "window_strides")
    dil = _tuple(rhs_dilation, nsp, "rhs_dilation")
    pads = _pads(spec(x).shape[2:], w.shape[2:], strides, dil, padding)
    with _precision(precision):
        y = _op("convolution")(x, w, None, stride=strides, padding=pads, dilation=dil,
                               groups=int(feature_group_count))  # fmt: skip
    return jnp.transpose(y, tuple(int(i) for i in np.argsort(dn.out_spec)))


def _precision(precision: Any) -> Any:
    """A context for ``precision``: ``settings(allow_tf32=False)`` when it asks for full float32 (``HIGHEST``,
    ``"highest"``, ``"float32"``, or a pair holding one; None reads ``jax.default_matmul_precision``), else
    nothing."""

    def full(p: Any) -> bool:
        if isinstance(p, str):
            q = p.lower()
            if q == "float32":
                return True
            try:
                return jax.lax.Precision(q) == jax.lax.Precision.HIGHEST
            except ValueError:
                return False
        return p == jax.lax.Precision.HIGHEST

    if precision is None:  # JAX's default, which jax.default_matmul_precision(...) sets for convolutions too
        precision = getattr(jax.config, "jax_default_matmul_precision", None)
    parts = precision if isinstance(precision, (tuple, list)) else (precision,)
    return settings(allow_tf32=False) if any(full(p) for p in parts) else contextlib.nullcontext()


def _channels_last(nsp: int) -> tuple[str, str, str]:
    sp = "DHW"[3 - nsp :] if nsp <= 3 else None
    if sp is None:
        raise NotImplementedError(f"a {nsp}-d convolution: cuDNN takes 1-d to 3-d here")
    return f"N{sp}C", f"{sp}IO", f"N{sp}C"


def conv(x: Any, w: Any, bias: Any = None, *, strides: int | Sequence[int] = 1, padding: Any = "SAME",
         dilation: int | Sequence[int] = 1, groups: int = 1) -> Any:  # fmt: skip
    """flax's ``nn.Conv`` as a function: ``x`` ``(N, *spatial, C)``, ``w`` ``(*k, C // groups, O)``, ``bias``
    ``(O,)`` or None -> ``(N, *out, O)``. The bias is added by the convolution op itself (fused where cuDNN
    fuses it)."""
    nsp = x.ndim - 2
    lhs, rhs, out = _channels_last(nsp)
    padding = _flax_padding(padding, nsp, w.shape[:nsp], _tuple(dilation, nsp, "dilation"))
    if bias is None:
        return conv_general_dilated(x, w, _tuple(strides, nsp, "strides"), padding,
                                    rhs_dilation=_tuple(dilation, nsp, "dilation"), dimension_numbers=(lhs, rhs, out),
                                    feature_group_count=groups)  # fmt: skip
    dn = jax.lax.conv_dimension_numbers(x.shape, w.shape, (lhs, rhs, out))
    xc, wc = Permuted(x, dn.lhs_spec), jnp.transpose(w, dn.rhs_spec)
    st, dil = _tuple(strides, nsp, "strides"), _tuple(dilation, nsp, "dilation")
    pads = _pads(spec(xc).shape[2:], wc.shape[2:], st, dil, padding)
    y = _op("convolution")(xc, wc, bias, stride=st, padding=pads, dilation=dil, groups=int(groups))
    return jnp.transpose(y, tuple(int(i) for i in np.argsort(dn.out_spec)))


def _flax_padding(padding: Any, nsp: int, window: Sequence[int], dilation: Sequence[int]) -> Any:
    """flax's ``Conv`` padding forms as :func:`_pads` takes them: an int (both sides of every dim), one int per dim
    (both sides), ``(low, high)`` pairs, "SAME"/"VALID"/"SAME_LOWER", and "CAUSAL" (1-d: ``(k - 1) * d`` before);
    "CIRCULAR"/"REFLECT" are refused by name (cuDNN pads with zeros)."""
    if isinstance(padding, str):
        p = padding.upper()
        if p == "CAUSAL":
            if nsp != 1:
                raise ValueError(f"conv: padding='CAUSAL' is for 1-d convolutions (flax's rule), not {nsp}-d")
            return (((int(window[0]) - 1) * dilation[0], 0),)
        if p in ("CIRCULAR", "REFLECT", "WRAP"):
            raise NotImplementedError(f"conv: padding={padding!r}: cuDNN's convolution pads with zeros only")
        return padding
    if isinstance(padding, (int, np.integer)):
        return ((int(padding), int(padding)),) * nsp
    return tuple((int(p), int(p)) if isinstance(p, (int, np.integer)) else tuple(p) for p in padding)


def _pool(x: Any, mode: str, window_shape: Sequence[int], strides: Any, padding: Any) -> Any:
    nsp = len(window_shape)
    batched = x.ndim == nsp + 2
    if not batched and x.ndim != nsp + 1:
        raise ValueError(f"inputs of rank {x.ndim} for a {nsp}-d window: (N, *spatial, C) or (*spatial, C)")
    xb = x if batched else x[None]
    window = tuple(int(k) for k in window_shape)
    st = (1,) * nsp if strides is None else _tuple(strides, nsp, "strides")  # flax's default: stride 1
    pads = _pads(xb.shape[1:-1], window, st, (1,) * nsp, padding)
    perm = (0, nsp + 1, *range(1, nsp + 1))
    y = _op("pooling")(Permuted(xb, perm), mode=mode, window=window, stride=st, padding=pads)
    y = jnp.transpose(y, tuple(int(i) for i in np.argsort(perm)))
    return y if batched else y[0]


def max_pool(inputs: Any, window_shape: Sequence[int], strides: Any = None, padding: Any = "VALID") -> Any:
    """flax's ``nn.max_pool``: ``inputs`` ``(N, *spatial, C)`` (or unbatched ``(*spatial, C)``), ``strides``
    defaulting to 1 as flax's (not to the window, as torch's), by cuDNN's max pooling (``cudnnkit.jax.ops.pooling``, mode ``"max"``; padding never wins a max, as flax's ``-inf``)."""
    return _pool(inputs, "max", window_shape, strides, padding)


def avg_pool(inputs: Any, window_shape: Sequence[int], strides: Any = None, padding: Any = "VALID",
             count_include_pad: bool = True) -> Any:  # fmt: skip
    """flax's ``nn.avg_pool``: the window's mean, dividing by the whole window (``count_include_pad=True``:
    cuDNN's ``avg_include_padding``) or by its elements inside the input (``avg_exclude_padding``)."""
    mode = "avg_include_padding" if count_include_pad else "avg_exclude_padding"
    return _pool(inputs, mode, window_shape, strides, padding)


def _softmax(x: Any, axis: Any, where: Any, log: bool) -> Any:
    if where is not None:
        raise NotImplementedError("where=: cuDNN's softmax takes no mask (mask the logits with -inf instead)")
    return _op("softmax")(x, axis=axis, log=log)


def softmax(x: Any, axis: int | Sequence[int] = -1, where: Any = None) -> Any:
    """``jax.nn.softmax`` by ``cudnnSoftmaxForward`` (``CUDNN_SOFTMAX_ACCURATE``) over ``axis``."""
    return _softmax(x, axis, where, False)


def log_softmax(x: Any, axis: int | Sequence[int] = -1, where: Any = None) -> Any:
    """``jax.nn.log_softmax`` by ``cudnnSoftmaxForward`` (``CUDNN_SOFTMAX_LOG``) over ``axis``."""
    return _softmax(x, axis, where, True)


def _trailing(x: Any, axes: Any, what: str) -> int:
    """How many trailing dims ``axes`` names (``NotImplementedError`` for axes that are not the trailing ones)."""
    ax = (axes,) if isinstance(axes, int) else tuple(axes)
    for a in ax:
        _axis(a, x.ndim, what, "axes")
    norm = sorted(a % x.ndim for a in ax)
    if norm != list(range(x.ndim - len(norm), x.ndim)):
        raise NotImplementedError(f"{what}: axes={axes!r} are not the trailing ones; cuDNN normalizes trailing dims")
    return len(norm)


def _axis(a: Any, ndim: int, what: str, name: str) -> int:
    """Axis ``a`` of an ``ndim``-d array, in ``[0, ndim)``: out of range a ``ValueError`` naming ``name``, as flax's
    modules raise, rather than wrapping around (:func:`~cudnnkit.graph.checks.as_int`'s checks)."""
    return as_int(a, f"{what}: {name}", minimum=-ndim, maximum=ndim - 1) % ndim


def _norm_param(p: Any, shape: tuple, x: Any, fill: float) -> Any:
    """A layer/RMS norm's scale or bias as cuDNN takes it: float32 for half-precision data (flax's
    ``param_dtype=bfloat16`` parameters cast, their gradient cast back), ``fill`` where None."""
    dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    if p is None:
        return jnp.full(shape, fill, dt)
    p = jnp.asarray(p)
    return p if p.dtype == dt or not jnp.issubdtype(p.dtype, jnp.floating) else p.astype(dt)


def layer_norm(x: Any, scale: Any = None, bias: Any = None, *, epsilon: float = 1e-6, axes: Any = -1) -> Any:
    """flax's ``LayerNorm`` as a function: ``(x - mean) / sqrt(var + epsilon) * scale + bias`` over the trailing
    ``axes``; ``scale``/``bias`` shaped like those dims (ones and zeros when None; float32 for float16/bfloat16
    ``x``, a half-precision one cast). The graph's layer norm."""
    k = _trailing(x, axes, "layer_norm")
    shape = x.shape[x.ndim - k :]
    scale, bias = _norm_param(scale, shape, x, 1.0), _norm_param(bias, shape, x, 0.0)
    return _op("layer_norm")(x, scale, bias, normalized_shape_ndim=k, epsilon=epsilon)


def rms_norm(x: Any, scale: Any = None, *, epsilon: float = 1e-6, axes: Any = -1) -> Any:
    """flax's ``RMSNorm`` as a function: ``x / sqrt(mean(x**2) + epsilon) * scale`` over the trailing ``axes``
    (``scale`` as :func:`layer_norm`'s)."""
    k = _trailing(x, axes, "rms_norm")
    scale = _norm_param(scale, x.shape[x.ndim - k :], x, 1.0)
    return _op("rms_norm")(x, scale, normalized_shape_ndim=k, epsilon=epsilon)


def batch_norm(x: Any, scale: Any, bias: Any, mean: Any, var: Any, *, training: bool, momentum: float = 0.99,
               epsilon: float = 1e-5, axis: int = -1, activation: str | None = None,
               z: Any = None) -> tuple[Any, Any, Any]:  # fmt: skip
    """Batch norm with explicit state: ``(y, new_mean, new_var)``. ``axis`` is the feature axis (flax's default:
    the last); ``momentum`` flax's (``new = momentum * old + (1 - momentum) * batch``). Training normalizes by the
    batch statistics and updates the state (cuDNN's running variance is the *unbiased* batch variance, torch's
    convention, where flax's uses the biased one); inference normalizes by ``mean``/``var`` and returns them
    unchanged. ``cudnnBatchNormalizationForwardTraining``/``...Inference`` (``cudnnkit.jax.ops.batch_norm``).

    ``activation="relu"`` applies a ReLU to the result inside the batch norm's cuDNN call where cuDNN fuses it
    (training on channels-last float16/bfloat16/float32 data: the batch-norm graph with a ReLU node; under
    ``settings(prefer="legacy")`` ``CUDNN_BATCHNORM_OPS_BN_ACTIVATION`` of ``cudnnBatchNormalizationForwardTrainingEx``
    for float16), else as a second call; the backward takes the ReLU's gradient from ``y``. ``z``, an array of
    ``x``'s shape and dtype (a residual branch), is added before that ReLU (``relu(bn(x) + z)``,
    ``CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION``) and gets its gradient too; it needs ``activation="relu"``. The fused
    ReLU is asked to return NaN for a NaN, as ``jax.nn.relu`` (``propagate_nan=True``: on the batch-norm graph
    ``RELU_FWD``'s ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION``, deprecated in cuDNN 9's header; that ``RELU_FWD`` kept
    NaN with or without it on an H100, cuDNN 9.19)."""
    ax = _axis(axis, x.ndim, "batch_norm", "axis")
    perm = (0, ax, *(i for i in range(1, x.ndim) if i != ax)) if ax != 0 else None
    if ax == 0:
        raise NotImplementedError("axis=0: the feature axis cannot be the batch axis")
    # activation, z without it and z's dtype are checked by the op's meta at trace time, naming them; z's shape here,
    # in the caller's layout (meta would see it permuted)
    if z is not None and tuple(z.shape) != tuple(x.shape):
        raise ValueError(f"batch_norm: z must have x's shape {tuple(x.shape)}, got {tuple(z.shape)}")
    xc = Permuted(x, perm)
    zc = None if z is None else Permuted(z, perm)
    # jax.nn.relu returns NaN for a NaN: the fused ReLU is asked to as well (cuDNN's default returns 0)
    kw = {} if activation is None else {"activation": activation, "propagate_nan": True}
    got = _op("batch_norm")(xc, scale, bias, zc, running_mean=mean, running_var=var, training=bool(training),
                            momentum=1.0 - float(momentum), epsilon=epsilon, **kw)  # fmt: skip
    y, new_mean, new_var = got if isinstance(got, tuple) and len(got) == 3 else (got, mean, var)
    return jnp.transpose(y, tuple(int(i) for i in np.argsort(perm))), new_mean, new_var


def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, *,
                          scale: float | None = None, is_causal: bool = False, query_seq_lengths: Any = None,
                          key_value_seq_lengths: Any = None, local_window_size: Any = None,
                          implementation: str | None = None) -> Any:  # fmt: skip
    """``jax.nn.dot_product_attention`` by cuDNN's fused attention: ``query`` ``(B, T, N, H)`` (or ``(T, N, H)``),
    ``key``/``value`` ``(B, S, K, H)`` with ``N % K == 0``, float16 or bfloat16 -> ``(B, T, N, H)``.

    * ``bias``: added to the scores, broadcastable to ``(B, N, T, S)`` (fewer dims get leading ones, as JAX's),
      differentiable (cuDNN's dbias; its gradient summed back over the broadcast dims by JAX);
    * ``mask``: boolean, broadcastable to ``(B, N, T, S)``, True where kept: made an additive bias of ``0`` and
      JAX's masked logit ``-0.7 * finfo(dtype).max`` (a fully masked row gives the mean of ``v``, as JAX's), added
      to ``bias`` when both are given;
    * ``local_window_size``: ``w`` or ``(left, right)``: query ``t`` attends to keys ``t - left .. t + right``
      (cuDNN's ``left_bound = left + 1``, ``right_bound = right``; with ``is_causal`` the right side is 0);
    * ``is_causal`` keeps ``s <= t``, also for ``T != S`` (JAX's triangle and cuDNN's default alignment are both
      top-left: query ``t`` attends keys ``0 .. t``);
    * grouped key/value heads (``K`` dividing ``N``) are read as they are (cuDNN's grouped-query attention).

    * ``query_seq_lengths``/``key_value_seq_lengths``: int32 ``(B,)`` valid lengths (cuDNN's padding mask,
      ``seq_len_q``/``seq_len_kv``), with JAX's definition of what cuDNN leaves undefined: rows past a query
      length are 0 and get no gradient, keys past a key/value length get no gradient, and a row with no key
      (a zero key/value length, say) attends uniformly to all ``S`` keys (the mean of ``v``, as JAX's large
      negative logits give).

    ``cudnnkit.jax.ops.sdpa`` runs the plain and causal calls with ``K`` equal to ``N`` or 1, ``cudnnkit.jax.ops
    .attention`` (``attention_forward``/``attention_backward``) the others.

    A valid query row with no key to attend (every key past its sample's length, outside the window or masked) is
    JAX's uniform average of ``v`` over all ``S`` keys; cuDNN computes only the others. Lengths are clipped to
    ``[0, T]`` and ``[0, S]`` as JAX's mask reads them.

    ``jax.vmap`` over a call with lengths raises ``NotImplementedError`` (they are per sample)."""
    if implementation not in (None, "cudnn"):
        raise ValueError(f"dot_product_attention: implementation={implementation!r}; cudnnkit's is cuDNN's")
    unbatched = query.ndim == 3
    q, k, v = (x[None] if unbatched else x for x in (query, key, value))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"dot_product_attention: query/key/value must be (B, T, N, H), got {query.shape}, "
                         f"{key.shape}, {value.shape}")  # fmt: skip
    dt = jnp.dtype(q.dtype).name
    if dt not in ("float16", "bfloat16"):
        raise NotImplementedError(f"dot_product_attention: query has dtype {dt}; cuDNN's fused attention takes "
                                  "float16 or bfloat16")  # fmt: skip
    b, t, n, _ = q.shape
    s_len, kh = k.shape[1], k.shape[2]
    if n % kh:
        raise ValueError(f"dot_product_attention: {n} query heads are not a multiple of {kh} key/value heads")
    add = _attention_bias(bias, mask, (b, n, t, s_len), q.dtype)
    window = {} if local_window_size is None else _window(local_window_size, bool(is_causal))
    left = None if local_window_size is None else window["left_bound"] - 1
    lengths = query_seq_lengths is not None or key_value_seq_lengths is not None
    # rows with no key to attend (a window past the keys): JAX's uniform weights, cuDNN's undefined
    empty_rows = left is not None and t > s_len + left
    # a boolean mask may leave a row no key (alone, or with the causal triangle or the window): JAX's uniform
    # weights there, which cuDNN's additive mask does not give (a float16 mask value cannot swamp the scores, and
    # the band's keys are -inf), so the rows are replaced as the lengths' are
    # cuDNN's window (left_bound) with more queries than keys needs its padding mask: full lengths turn it on
    padded = lengths or empty_rows or (left is not None and t > s_len)
    fix = padded or mask is not None
    if fix:
        q_len = _seq_lengths(query_seq_lengths, "query_seq_lengths", b, t)
        kv_len = _seq_lengths(key_value_seq_lengths, "key_value_seq_lengths", b, s_len)
        # the rows with a key: t < reach (a window's band passes the last key at row kv_len + left)
        reach = jnp.where(kv_len > 0, t if left is None else kv_len + left, 0)
        rows = jnp.arange(t)[None, :]
        q_ok, has_key = (rows < q_len[:, None]), (rows < reach[:, None])  # (B, T)
        kv_ok = (jnp.arange(s_len)[None, :] < kv_len[:, None])[:, :, None, None]  # (B, S, 1, 1)
        use = (q_ok & has_key)[:, :, None, None]  # (B, T, 1, 1): the rows cuDNN computes as JAX does
        if mask is not None:  # rows whose allowed keys the mask covers whole: JAX's uniform weights over all S
            use = use & jnp.transpose(_any_kept(mask, kv_len, left, window.get("right_bound"), bool(is_causal),
                                                (b, n, t, s_len)), (0, 2, 1))[..., None]  # fmt: skip
        # gradients only through those rows (cuDNN's padded rows of dq, dk, dv are undefined; JAX's are 0)
        v_all = v
        q, k, v = _valid_rows(q, use), _valid_rows(k, kv_ok), _valid_rows(v, kv_ok)
        if padded:
            # cuDNN sees no zero length and no row without a key: the rows past its lengths are replaced below
            window["seq_len_q"] = jnp.clip(jnp.minimum(q_len, reach), 1, t).reshape(b, 1, 1, 1)
            window["seq_len_kv"] = jnp.maximum(kv_len, 1).reshape(b, 1, 1, 1)
    perm = (0, 2, 1, 3)
    qkv = tuple(Permuted(x, perm) for x in (q, k, v))
    if add is None and not window and kh in (1, n):
        o = _op("sdpa")(*qkv, scale=scale, causal=bool(is_causal))
    else:
        o = _op("attention")(*qkv, add, None, scale=scale, is_causal=bool(is_causal), enable_gqa=kh != n, **window)
    o = jnp.transpose(o, perm)
    if fix:
        # a valid row with no key: JAX's uniform weights over all S keys; past the query length: 0
        mean_v = jnp.repeat(v_all.astype(jnp.float32).mean(axis=1), n // kh, axis=1).astype(o.dtype)  # (B, N, H)
        o = jnp.where(use, o, mean_v[:, None])
        o = jnp.where(q_ok[:, :, None, None], o, jnp.zeros((), o.dtype))
    return o[0] if unbatched else o


def _seq_lengths(lengths: Any, name: str, b: int, most: int) -> Any:
    """``query_seq_lengths``/``key_value_seq_lengths`` as JAX takes them: int32 ``(B,)`` (None: every row valid,
    ``most``), clipped to ``[0, most]`` (what JAX's ``index < length`` mask makes of any other value)."""
    if lengths is None:
        return jnp.full((b,), most, jnp.int32)
    lengths = jnp.asarray(lengths)
    if lengths.shape != (b,) or lengths.dtype != jnp.int32:
        raise ValueError(f"dot_product_attention: {name} must be int32 of shape ({b},), got {lengths.dtype} "
                         f"{lengths.shape}")  # fmt: skip
    return jnp.clip(lengths, 0, most)


def _any_kept(mask: Any, kv_len: Any, left: int | None, right: int | None, causal: bool, full: tuple) -> Any:
    """``(B, N|1, T)``: whether JAX's combined mask keeps any key of the row: the boolean ``mask`` (broadcast to
    ``(B|1, N|1, T, S)`` as :func:`_attention_bias` takes it), the keys before ``kv_len``, the window's band and
    the causal triangle."""
    _, _, t, s_len = full
    m = _as_4d(mask, "mask", full)
    row, col = jnp.arange(t)[:, None], jnp.arange(s_len)[None, :]
    band = jnp.ones((t, s_len), bool)
    if left is not None:
        band &= col >= row - left
    if causal:
        band &= col <= row
    elif right is not None:
        band &= col <= row + right
    keys = (jnp.arange(s_len)[None, :] < kv_len[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return jnp.any(m & band & keys, axis=-1)


def _valid_rows(x: Any, ok: Any) -> Any:
    """``x`` itself, its gradient kept only where ``ok`` (the select of the cotangent; XLA folds the forward
    ``where(ok, x, x)`` away)."""
    return jnp.where(ok, x, jax.lax.stop_gradient(x))


def _attention_bias(bias: Any, mask: Any, full: tuple, dtype: Any) -> Any:
    """``bias`` plus ``mask`` made additive, in ``dtype``, with its last two dims broadcast to ``(T, S)`` (cuDNN's
    mask broadcasts over batch and heads only); None for neither. In float32 (JAX adds them so), kept within
    ``dtype``'s finite range so that no entry is -inf (a row of them NaN) and the mask still acts on any bias: the
    bias clipped to ``[-max / 4, max]``, a masked entry ``min(bias, 0) - 0.7 * max`` (JAX's masked logit, and at
    least ``0.7 * max`` below any kept entry of its row)."""
    hi = float(jnp.finfo(dtype).max)
    total = None
    if bias is not None:
        b = _as_4d(bias, "bias", full).astype(jnp.float32)
        total = jnp.broadcast_to(jnp.clip(b, -0.25 * hi, hi), b.shape[:2] + full[2:])
    if mask is not None:
        m = _as_4d(mask, "mask", full)
        if m.dtype != jnp.bool_:
            raise TypeError(f"dot_product_attention: mask must be boolean (True where kept), got {m.dtype}")
        kept = jnp.zeros((), jnp.float32) if total is None else total
        masked = jnp.minimum(kept, 0.0) - 0.7 * hi
        lead = tuple(max(x, y) for x, y in zip(m.shape[:2], (1, 1) if total is None else total.shape[:2]))
        total = jnp.broadcast_to(jnp.where(m, kept, masked), lead + full[2:])
    return None if total is None else total.astype(dtype)


def _as_4d(x: Any, name: str, full: tuple) -> Any:
    """A bias or mask with leading dims of 1 up to 4-d, as JAX's own (``_ensure_4d``), checked to broadcast to
    ``full`` = ``(B, N, T, S)`` (``ValueError`` naming ``name``)."""
    x = jnp.asarray(x)
    if x.ndim > 4 or x.ndim < 2:
        raise ValueError(f"dot_product_attention: {name} must have 2 to 4 dims, broadcastable to (B, N, T, S) = "
                         f"{full}, got shape {x.shape}")  # fmt: skip
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    if any(d not in (1, f) for d, f in zip(x.shape, full)):
        raise ValueError(f"dot_product_attention: {name} of shape {x.shape} does not broadcast to (B, N, T, S) "
                         f"= {full}")  # fmt: skip
    return x


def _window(size: Any, causal: bool) -> dict:
    """``local_window_size`` (``w`` or ``(left, right)``, ints >= 0) as cuDNN's bounds."""
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2 or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) and w >= 0 for w in pair):
        raise ValueError(f"dot_product_attention: local_window_size must be an int or (left, right) ints >= 0, got "
                         f"{size!r}")  # fmt: skip
    left, right = (int(w) for w in pair)
    return {"left_bound": left + 1} if causal else {"left_bound": left + 1, "right_bound": right}


def dropout(key: Any, rate: float, x: Any, *, deterministic: bool = False) -> Any:
    """Dropout with an explicit key: ``x * mask / (1 - rate)``, each element kept with probability ``1 - rate``
    (haiku's ``hk.dropout(rng, rate, x)`` argument order; flax's ``nn.Dropout`` semantics: ``deterministic=True``,
    or ``rate == 0``, returns ``x``, ``rate == 1`` zeros). cuDNN's dropout (``cudnnkit.jax.ops.dropout``,
    ``cudnnDropoutForward``), its gradient ``cudnnDropoutBackward`` with the mask the forward kept.

    ``key``: a ``jax.random`` key (``jax.random.key`` or ``PRNGKey``), traced or not: its 64 bits
    (``jax.random.bits``) are cuDNN's seed, handed to the FFI call as an int32 device array (``seed=``); the handler
    reads them (a synchronization of XLA's stream, since ``cudnnSetDropoutDescriptor`` takes its seed on the host)
    and draws the mask from RNG states re-initialised from that seed. So the same key and shape give the same mask,
    different keys different ones, and nothing is carried between calls; the mask is cuDNN's random stream, not
    ``jax.random.bernoulli``'s. ``rate``: a Python float in ``[0, 1]`` (static: a traced rate is refused). ``x``:
    float16, float32 or float64; bfloat16 runs in float32 (cuDNN's dropout has no bfloat16)."""
    if isinstance(rate, _TRACER):
        raise TypeError("dropout: rate is a traced value; it must be a Python float (cuDNN's dropout descriptor "
                        "takes the probability on the host): mark it static or close over it")  # fmt: skip
    try:
        p = float(rate)
    except (TypeError, ValueError):
        raise TypeError(f"dropout: rate must be a float in [0, 1], got {rate!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: rate must be in [0, 1], got {p}")
    if deterministic or p == 0.0:
        return x
    if p == 1.0:
        return jnp.zeros_like(x)
    seed = jax.lax.bitcast_convert_type(jax.random.bits(key, (2,), jnp.uint32), jnp.int32)
    if jnp.dtype(x.dtype) == jnp.bfloat16:
        return _op("dropout")(x.astype(jnp.float32), p=p, seed=seed).astype(x.dtype)
    return _op("dropout")(x, p=p, seed=seed)


def _lengths(paddings: Any, size: int, name: str, shape: tuple[int, int]) -> Any:
    if tuple(paddings.shape) != shape:
        raise ValueError(f"ctc_loss: {name} has shape {tuple(paddings.shape)}; it must be {shape}")
    return jnp.round(size - jnp.sum(paddings.astype(jnp.float32), axis=1)).astype(jnp.int32)


def ctc_loss(logits: Any, logit_paddings: Any, labels: Any, label_paddings: Any, blank_id: int = 0,
             log_epsilon: float = -1e5) -> Any:  # fmt: skip
    """``optax.ctc_loss``'s signature and result: the negative log-likelihood of each sequence, ``(B,)``, by
    cuDNN's CTC loss (``cudnnkit.jax.ops.ctc_loss``: one ``cudnnCTCLoss_v8`` makes the costs and the gradient, which
    the backward scales by the cotangent).

    ``logits`` ``(B, T, K)``: unnormalized (cuDNN applies the softmax over ``K`` itself), any float dtype (computed
    in float32, cuDNN's only CTC dtype; the loss comes back in ``logits``' dtype). ``logit_paddings`` ``(B, T)``
    and ``label_paddings`` ``(B, N)``: 1.0 for padding, 0.0 for data (rounded); padded frames are skipped wherever
    they are, as optax's (the valid frames are gathered to the front for cuDNN, whose input is each sample's first
    ``input_length`` frames), labels are right-padded (optax's convention); the lengths are the counts of 0.0 entries.
    ``labels`` ``(B, N)`` integers in ``[1, K)`` (the padded positions are ignored), the blank being class 0.

    The lengths and labels reach the handler as device arrays (traced under jit); cuDNN's CTC checks them on the
    host, so the handler reads them back (a synchronization of XLA's stream). Where cuDNN differs from optax: a
    label longer than its input, or an empty one (``label_paddings`` all 1.0), is an error (raised when the call
    runs, as XLA's error carrying cudnnkit's message); a sequence with no alignment (too few frames for its
    repeated labels) costs ``+inf`` where optax gives a large finite value; ``log_epsilon`` (optax's stand-in for
    ``log(0)``) is accepted for the signature and has no effect; labels longer than 255 are refused (cuDNN).
    ``blank_id`` other than 0 raises ``NotImplementedError`` (cuDNN's blank is class 0: roll the class axis)."""
    if isinstance(blank_id, _TRACER) or int(blank_id) != 0:
        raise NotImplementedError(f"ctc_loss: blank_id={blank_id}; cuDNN's CTC loss always uses class 0 as the "
                                  "blank (move the blank class to index 0 of the logits' last axis, e.g. "
                                  "jnp.roll, and shift the labels to match)")  # fmt: skip
    del log_epsilon  # optax's stand-in for log(0): cuDNN's CTC needs none
    if getattr(logits, "ndim", None) != 3:
        raise ValueError(f"ctc_loss: logits must be (B, T, K), got shape {tuple(getattr(logits, 'shape', ()))}")
    B, T, _ = logits.shape
    if getattr(labels, "ndim", None) != 2 or labels.shape[0] != B:
        raise ValueError(f"ctc_loss: labels must be (B, N) with B={B}, got shape {tuple(getattr(labels, 'shape', ()))}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"ctc_loss: labels must be integers, got {jnp.dtype(labels.dtype).name}")
    input_lengths = _lengths(logit_paddings, T, "logit_paddings", (B, T))
    label_lengths = _lengths(label_paddings, labels.shape[1], "label_paddings", tuple(labels.shape))
    # optax skips a padded frame wherever it is; cuDNN reads each sample's first input_length frames: the valid
    # frames moved to the front in their order (a stable sort of the 0/1 paddings; the identity for right padding),
    # so the padded frames' gradient is 0 as optax's
    order = jnp.argsort(jnp.round(logit_paddings.astype(jnp.float32)), axis=1, stable=True)
    logits = jnp.take_along_axis(logits, order[:, :, None], axis=1)
    x = jnp.transpose(logits, (1, 0, 2)).astype(jnp.float32)  # cuDNN's (T, B, K)
    costs = _op("ctc_loss")(x, labels=labels.astype(jnp.int32), label_lengths=label_lengths,
                            input_lengths=input_lengths)  # fmt: skip
    return costs.astype(logits.dtype)
