"""Samples and the torch reference of the attention L3 declaration (``sdpa``): see tests/l3/misc.py for the
format (``SAMPLES``, ``TORCH_REFERENCE``).

cuDNN's attention takes float16 and bfloat16 only (no float32, no float64): the samples are bfloat16 whatever
``dtype`` asks (:data:`ONLY_DTYPE`). NumPy has no bfloat16: with ``ml_dtypes`` importable the sample arrays are
``ml_dtypes.bfloat16``; without it they are float32 arrays holding bfloat16 values exactly (rounded to nearest
even), so a cast to bfloat16 loses nothing (:data:`AS_FLOAT32` says which form this process made).

How the GPU test (tests/gpu/test_l3_gpu.py, which today takes float64 and float32 samples) must treat them:

* inputs: ``torch_input(a, device)`` (here) makes the bfloat16 tensor from either form (``torch.from_numpy``
  takes neither an ``ml_dtypes`` array nor gives bfloat16 from float32); the cotangents likewise;
* the reference: ``TORCH_REFERENCE["sdpa"]`` computes in float32 on the upcast inputs (torch's CPU SDPA), its
  output float32, so the forward's dtype assertion (``o.dtype == w.dtype``) does not apply, and the gradients of
  the bfloat16 leaves come back bfloat16;
* tolerances: bfloat16's (the output is rounded to 8 bits of mantissa, and the pattern multiplies the
  probabilities in bfloat16): about 2e-2 relative in norm, forward and gradients (tests/gpu/test_nn_functional_gpu
  uses ``BF16_TOL = 2e-2``);
* gradcheck needs float64: it cannot run this op (as for the graph-only normalizations);
* CuPy: ``cupy.asarray`` of an ``ml_dtypes`` array gives a bfloat16 CuPy array (CuPy 14); from the float32 form
  the array needs ``.astype(ml_dtypes.bfloat16)``, so without ``ml_dtypes`` the CuPy check is skipped; results
  come back through ``cupy.asnumpy(...).astype(numpy.float32)`` before ``torch.from_numpy``.
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes
except ImportError:  # float32 samples holding bfloat16 values
    ml_dtypes = None

#: ops whose samples have one dtype only, whatever the ``dtype`` asked for
ONLY_DTYPE = {"sdpa": "bfloat16", "attention": "bfloat16"}
#: whether the bfloat16 samples are float32 arrays (no ml_dtypes here) the GPU test must cast
AS_FLOAT32 = ml_dtypes is None


def bf16_values(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (to nearest, ties to even), as float32."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def _bf16(a: np.ndarray) -> np.ndarray:
    """A sample array: bfloat16 (ml_dtypes) or its float32 values."""
    v = bf16_values(a)
    return v if ml_dtypes is None else v.astype(ml_dtypes.bfloat16)


def _bshd(a: np.ndarray) -> np.ndarray:
    """``a`` (B, H, S, D) with BSHD memory (the layout of a (B, S, H * D) projection), the same values."""
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def torch_input(a, device, dtype: str = "bfloat16", grad: bool = False):
    """A sample array (ml_dtypes bfloat16 or float32 values) as a torch tensor of ``dtype`` on ``device``, its
    strides kept, a leaf (``requires_grad`` as asked)."""
    import torch

    if a is None:
        return None
    f32 = np.asarray(a, dtype=np.float32) if a.dtype != np.float32 else a
    t = torch.from_numpy(np.copy(f32, order="K")).to(device=device, dtype=getattr(torch, dtype))
    return t.requires_grad_(grad)


def _sdpa_samples(rng, dtype):
    def x(b, h, s, d=64, layout=None):
        a = _bf16(rng.standard_normal((b, h, s, d)))
        return _bshd(a) if layout == "bshd" else a

    return [
        ((x(1, 2, 16), x(1, 2, 16), x(1, 2, 16)), {}),
        ((x(2, 2, 32), x(2, 2, 32), x(2, 2, 32)), {"causal": True}),
        ((x(2, 2, 16), x(2, 2, 64), x(2, 2, 64)), {"scale": 0.2}),  # cross attention, an explicit scale
        ((x(1, 2, 64), x(1, 1, 64), x(1, 1, 64)), {"causal": True}),  # one shared key/value head (GQA)
        ((x(2, 2, 32, layout="bshd"), x(2, 2, 32, layout="bshd"), x(2, 2, 32, layout="bshd")), {"causal": True}),
    ]


def _attention_samples(rng, dtype):
    """The L3 ``attention`` op's variants: inputs ``(q, k, v, attn_mask, sink)`` (the mask bfloat16, the sink
    float32, both differentiable), ``alibi_slopes`` a float32 array keyword. Padding lengths (undefined rows) and
    dropout (a random mask) are checked by the L2 GPU tests, not here."""

    def x(b, h, s, d=64, layout=None):
        a = _bf16(rng.standard_normal((b, h, s, d)))
        return _bshd(a) if layout == "bshd" else a

    slopes = np.array([2.0 ** (-8.0 * (i + 1) / 4) for i in range(4)], np.float32)
    return [
        (
            (x(1, 4, 32), x(1, 2, 32), x(1, 2, 32), None, None),
            {"is_causal": True, "left_bound": 8, "enable_gqa": True},
        ),  # a sliding window, grouped heads
        ((x(1, 2, 16), x(1, 2, 32), x(1, 2, 32), _bf16(rng.standard_normal((2, 16, 32))), None), {}),  # a bias
        (
            (x(1, 4, 32), x(1, 4, 32), x(1, 4, 32), None, rng.standard_normal(4).astype(np.float32) + 1.0),
            {"is_causal": True},
        ),  # sink logits
        ((x(2, 2, 16, 64), x(2, 2, 24, 64), x(2, 2, 24, 32), None, None), {"softcap": 5.0, "scale": 0.3}),  # MLA
        (
            (x(1, 4, 16), x(1, 4, 48), x(1, 4, 48), None, None),
            {"is_causal": True, "diagonal_alignment": "bottom_right"},
        ),
        (
            (x(1, 4, 32, layout="bshd"), x(1, 4, 32, layout="bshd"), x(1, 4, 32, layout="bshd"), None, None),
            {"is_causal": True, "alibi_slopes": slopes},
        ),  # ALiBi
    ]


SAMPLES = {"sdpa": _sdpa_samples, "attention": _attention_samples}


def _f32(a):
    """An input as a float32 torch tensor: a NumPy sample (either form) converted, a tensor upcast (differentiably:
    a bfloat16 leaf gets its gradient through the cast)."""
    import torch

    if isinstance(a, np.ndarray):
        return torch.from_numpy(np.asarray(a, dtype=np.float32).copy())
    return a.float()


def _sdpa_reference(inputs, kw):
    """torch's CPU ``F.scaled_dot_product_attention`` in float32 on the upcast inputs (a shared key/value head
    repeated over the query heads); ``is_causal`` is top-left aligned, as cuDNN's mask here."""
    import torch.nn.functional as F

    q, k, v = (_f32(a) for a in inputs)
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=kw.get("causal", False), scale=kw.get("scale"))
    return (o,)


def _attention_reference(inputs, kw):
    """The variants from their definition in float32 on the CPU (torch autograd through the upcast leaves):
    ``s = scale q k^T``, ``c tanh(s / c)``, ``+ attn_mask``, ``+ slope_h (j - i)``, the diagonal band (row ``i``
    keeps ``i - left < j - shift <= i + right``, ``shift = S_kv - S_q`` bottom-right), the softmax with the sink's
    extra logit, ``@ v``; grouped key/value heads repeated over the query heads."""
    import torch

    q, k, v, mask, sink = (None if a is None else _f32(a) for a in inputs)
    b, h, sq, d = q.shape
    skv = k.shape[2]
    if k.shape[1] != h:
        k, v = k.repeat_interleave(h // k.shape[1], dim=1), v.repeat_interleave(h // v.shape[1], dim=1)
    scale = kw.get("scale")
    s = q @ k.transpose(-1, -2) * (1 / np.sqrt(d) if scale is None else scale)
    if kw.get("softcap") is not None:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    if mask is not None:
        s = s + mask
    row = torch.arange(sq)[:, None] + (skv - sq if kw.get("diagonal_alignment") == "bottom_right" else 0)
    col = torch.arange(skv)[None, :]
    slopes = kw.get("alibi_slopes")
    if slopes is not None:
        s = s + _f32(slopes).reshape(1, h, 1, 1) * (col - torch.arange(sq)[:, None]).float()
    keep = torch.ones(sq, skv, dtype=torch.bool)
    right = 0 if kw.get("is_causal") else kw.get("right_bound")
    if right is not None:
        keep &= col <= row + right
    if kw.get("left_bound") is not None:
        keep &= col > row - kw["left_bound"]
    s = s.masked_fill(~keep, -float("inf"))
    if sink is not None:
        s = torch.cat([s, sink.reshape(1, h, 1, 1).expand(b, h, sq, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :skv]
    return (p @ v,)


TORCH_REFERENCE = {"sdpa": _sdpa_reference, "attention": _attention_reference}
