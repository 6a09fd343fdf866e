"""L3 samples and torch references of dropout, LRN, divisive normalization, grid sample, affine grid and CTC.

``SAMPLES[name](rng, dtype)``: a list of ``(inputs, kw)``: ``inputs`` the declaration's differentiable inputs as
NumPy arrays of ``dtype`` (None for an absent optional one: divisive normalization's ``means``), ``kw`` its
keywords, NumPy arrays for its ``arrays`` (CTC's labels and lengths, int32). CTC is float32 only in cuDNN: its
samples are float32 whatever ``dtype`` (:data:`ONLY_DTYPE`), so its GPU check is a float32 one.

``TORCH_REFERENCE[name](inputs, kw)``: the same forward with torch CPU ops in float64, a tuple with one entry per
output (None where torch has no counterpart: dropout's output for p > 0, random; divisive normalization with
``means``, whose use cuDNN does not document). Inputs may be NumPy arrays or torch tensors (kept, so a caller can
differentiate through them).
"""

from __future__ import annotations

import numpy as np

#: ops whose samples have one dtype only, whatever the ``dtype`` asked for
ONLY_DTYPE = {"ctc_loss": "float32"}

LRN_P = dict(lrn_alpha=0.7, lrn_beta=0.6, k=1.3)  # alpha large enough that the window matters


def _n(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _dropout(rng, dtype):
    return [
        ((rng.uniform(0.5, 1.5, (2, 3, 4, 5)).astype(dtype),), {"p": 0.5}),
        ((rng.uniform(0.5, 1.5, (64,)).astype(dtype),), {"p": 0.25}),
        ((_n(rng, (3, 4), dtype),), {"p": 0.0}),  # drops nothing: y == x
    ]


def _lrn(rng, dtype):
    return [
        ((_n(rng, (2, 5, 4, 3), dtype),), dict(size=3, **LRN_P)),
        ((_n(rng, (2, 6, 5), dtype),), dict(size=5, **LRN_P)),  # 3-d (N, C, L)
        ((_n(rng, (1, 4, 2, 3, 2), dtype),), dict(size=3, **LRN_P)),  # 5-d
        ((_n(rng, (2, 5, 3, 3), dtype),), dict(size=4, **LRN_P)),  # even size: cuDNN's window, torch's mirrored
        ((_n(rng, (2, 3, 3, 2), dtype),), {}),  # the defaults (size 5 > C: the window is clipped)
    ]


DN_P = dict(size=3, **LRN_P)


def _divnorm(rng, dtype):
    return [
        ((_n(rng, (2, 3, 5, 4), dtype), None), DN_P),
        ((_n(rng, (2, 2, 4, 3), dtype), _n(rng, (2, 2, 4, 3), dtype)), DN_P),  # precomputed means
        ((_n(rng, (1, 2, 3, 4, 3), dtype), None), DN_P),  # 5-d: a size**3 window in D, H, W
        ((_n(rng, (2, 3, 7), dtype), None), dict(DN_P, size=5)),  # 3-d runs as 4-d
    ]


def _grid_sample(rng, dtype):
    return [
        ((_n(rng, (2, 3, 5, 4), dtype), rng.uniform(-1.3, 1.3, (2, 3, 6, 2)).astype(dtype)), {}),  # some outside
        ((_n(rng, (1, 1, 4, 4), dtype), rng.uniform(-0.9, 0.9, (1, 4, 4, 2)).astype(dtype)), {}),
    ]


def _theta(rng, n, dtype):
    return (np.array([[1.0, 0, 0], [0, 1.0, 0]]) + 0.3 * rng.standard_normal((n, 2, 3))).astype(dtype)


def _affine_grid(rng, dtype):
    return [((_theta(rng, 2, dtype),), {"size": (2, 3, 4, 5)}), ((_theta(rng, 1, dtype),), {"size": (1, 1, 3, 2)})]


def _ctc(rng, dtype):
    i32 = lambda v: np.asarray(v, np.int32)  # noqa: E731
    return [
        ((_n(rng, (6, 2, 5), "float32"),), dict(labels=i32([1, 2, 3]), label_lengths=i32([2, 1]),
                                                 input_lengths=i32([6, 4]))),
        # repeated labels (each needs a blank between), shorter inputs
        ((_n(rng, (8, 3, 4), "float32"),), dict(labels=i32([1, 1, 2, 3, 2, 2]), label_lengths=i32([3, 1, 2]),
                                                 input_lengths=i32([8, 5, 6]))),
    ]  # fmt: skip


SAMPLES = {
    "dropout": _dropout,
    "lrn": _lrn,
    "divisive_normalization": _divnorm,
    "grid_sample": _grid_sample,
    "affine_grid": _affine_grid,
    "ctc_loss": _ctc,
}


# ----------------------------------------------------------------- torch references


def _t(a):
    """``a`` as a torch tensor (a tensor kept as it is)."""
    import torch

    return a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))


def _f64(a):
    import torch

    return _t(a).to(torch.float64)


def _ref_dropout(inputs, kw):
    # p > 0 draws a random mask: no deterministic reference (the GPU test checks its statistics)
    return (_f64(inputs[0]).clone(),) if kw["p"] == 0 else (None,)


def _ref_lrn(inputs, kw):
    """cuDNN's LRN, y = x / (k + lrn_alpha / size * sum_window x^2) ** lrn_beta over channels
    c - (size - 1) // 2 .. c + size // 2: torch's local_response_norm with size, alpha=lrn_alpha, beta=lrn_beta, k
    (torch's window is c - size // 2 .. c + (size - 1) // 2: the same for odd sizes; for even ones cuDNN's is its
    mirror image, so torch runs on x with its channels reversed)."""
    import torch.nn.functional as F

    x = _f64(inputs[0])
    size, a, b, k = kw.get("size", 5), kw.get("lrn_alpha", 1e-4), kw.get("lrn_beta", 0.75), kw.get("k", 2.0)
    if size % 2:
        return (F.local_response_norm(x, size, alpha=a, beta=b, k=k),)
    return (F.local_response_norm(x.flip(1), size, alpha=a, beta=b, k=k).flip(1),)


def _ref_divnorm(inputs, kw):
    """cuDNN's divisive normalization without means (see cudnnkit.ops.lrn), y = x / (k + lrn_alpha / size**nd *
    sum_window x^2) ** lrn_beta, the window i - (size - 1) // 2 .. i + size // 2 in each of H, W (nd = 2; D, H, W
    for 5-d: nd = 3; a 3-d x as (N, C, L, 1)), zero padded. With means: None (undocumented)."""
    import torch.nn.functional as F

    x, means = _f64(inputs[0]), inputs[1]
    if means is not None:
        return (None,)
    size, a, b, k = kw.get("size", 5), kw.get("lrn_alpha", 1e-4), kw.get("lrn_beta", 0.75), kw.get("k", 2.0)
    x4 = x[..., None] if x.dim() == 3 else x
    nd = 3 if x4.dim() == 5 else 2
    lo, hi = (size - 1) // 2, size // 2
    sq = F.pad(x4 * x4, (lo, hi) * nd)
    pool = F.avg_pool3d if nd == 3 else F.avg_pool2d
    s = pool(sq, size, stride=1) * size**nd  # the window sums
    y = x4 * (k + a / size**nd * s) ** -b
    return (y[..., 0] if x.dim() == 3 else y,)


def _ref_grid_sample(inputs, kw):
    import torch.nn.functional as F

    x, grid = (_f64(a) for a in inputs)
    return (F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True),)


def _ref_affine_grid(inputs, kw):
    import torch.nn.functional as F

    return (F.affine_grid(_f64(inputs[0]), list(kw["size"]), align_corners=True),)


def _ref_ctc(inputs, kw):
    """cuDNN's softmax mode takes logits (x, (T, N, A), blank 0): torch's ctc_loss of their log-softmax."""
    import torch
    import torch.nn.functional as F

    x = _f64(inputs[0])
    lab, ll, il = (_t(kw[n]).to(torch.int64) for n in ("labels", "label_lengths", "input_lengths"))
    return (F.ctc_loss(x.log_softmax(-1), lab, il, ll, blank=0, reduction="none", zero_infinity=False),)


TORCH_REFERENCE = {
    "dropout": _ref_dropout,
    "lrn": _ref_lrn,
    "divisive_normalization": _ref_divnorm,
    "grid_sample": _ref_grid_sample,
    "affine_grid": _ref_affine_grid,
    "ctc_loss": _ref_ctc,
}
