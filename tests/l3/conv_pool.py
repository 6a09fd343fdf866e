"""Samples and torch references of the convolution and pooling L3 ops ("convolution", "convolution_transpose",
"pooling"): see tests/l3/__init__ for the format (``SAMPLES``, ``TORCH_REFERENCE``).

float64 runs on cuDNN's legacy calls only (the graph API has none), which pad both sides alike: the cases with
padding after that differs from the padding before (asymmetric pairs, ``"same"`` with an even kernel, a
``ceil_mode`` that adds padding, which is also where the pooling keeps its argmax index) are given for the other
dtypes only. avg_include_padding with a ceil_mode that adds padding is left out (cuDNN counts that padding in the
divisor, torch does not: the pooling module documents it)."""

from __future__ import annotations

import warnings

from cudnnkit.ops import Convolution, Pooling


def _a(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _conv_samples(rng, dtype):
    f64 = dtype == "float64"
    cases = [
        ((_a(rng, (2, 4, 7, 6), dtype), _a(rng, (6, 2, 3, 3), dtype), _a(rng, (6,), dtype)),
         {"stride": 2, "padding": 1, "groups": 2}),
        ((_a(rng, (1, 3, 6, 6), dtype), _a(rng, (4, 3, 3, 2), dtype), None), {"dilation": 2, "padding": (2, 1)}),
        ((_a(rng, (2, 4, 9), dtype), _a(rng, (4, 1, 3), dtype), _a(rng, (4,), dtype)),
         {"stride": 2, "padding": 1, "groups": 4}),
        ((_a(rng, (1, 2, 5, 4, 4), dtype), _a(rng, (3, 2, 2, 3, 2), dtype), None),
         {"stride": (1, 2, 1), "padding": 1}),
        ((_a(rng, (1, 2, 5, 5), dtype), _a(rng, (3, 2, 3, 3), dtype), _a(rng, (3,), dtype)),
         {"conv": Convolution(padding="same", mode="convolution")}),
        ((_a(rng, (2, 3, 8), dtype), _a(rng, (2, 3, 3), dtype), None), {"padding": "valid", "dilation": 3}),
        # the fused ReLU (its gradient from the saved output), with and without a bias
        ((_a(rng, (2, 4, 6, 6), dtype), _a(rng, (8, 4, 3, 3), dtype), _a(rng, (8,), dtype)),
         {"padding": 1, "activation": "relu"}),
        ((_a(rng, (2, 3, 9), dtype), _a(rng, (4, 3, 3), dtype), None), {"stride": 2, "activation": "relu"}),
    ]  # fmt: skip
    if not f64:
        cases += [
            ((_a(rng, (2, 4, 7, 6), dtype), _a(rng, (4, 4, 3, 3), dtype), _a(rng, (4,), dtype)),
             {"stride": 2, "padding": ((1, 2), (0, 1))}),
            ((_a(rng, (2, 2, 7), dtype), _a(rng, (3, 2, 4), dtype), None), {"padding": "same"}),
        ]  # fmt: skip
    return cases


def _convt_samples(rng, dtype):
    return [
        ((_a(rng, (2, 4, 3, 3), dtype), _a(rng, (4, 3, 3, 3), dtype)),
         {"stride": 2, "padding": 1, "output_padding": 1}),
        ((_a(rng, (1, 4, 4, 4), dtype), _a(rng, (4, 1, 3, 3), dtype)), {"groups": 2, "dilation": 2}),
        ((_a(rng, (2, 3, 5), dtype), _a(rng, (3, 2, 3), dtype)), {"stride": 3, "x_shape": (2, 2, 16)}),
        ((_a(rng, (1, 2, 3, 3, 2), dtype), _a(rng, (2, 2, 2, 2, 2), dtype)), {"stride": 2, "mode": "convolution"}),
    ]  # fmt: skip


def _pool_samples(rng, dtype):
    f64 = dtype == "float64"
    cases = [
        ((_a(rng, (2, 3, 6, 6), dtype),), {"mode": "max", "window": 2}),
        ((_a(rng, (2, 2, 7, 7), dtype),), {"mode": "avg_include_padding", "window": 3, "stride": 2, "padding": 1}),
        ((_a(rng, (2, 2, 7, 7), dtype),), {"mode": "avg_exclude_padding", "window": 3, "stride": 2, "padding": 1}),
        ((_a(rng, (2, 3, 9), dtype),), {"mode": "max", "window": 3, "stride": 2, "padding": 1}),
        ((_a(rng, (1, 2, 4, 5, 6), dtype),), {"mode": "avg_include_padding", "window": 2, "stride": (1, 2, 2)}),
        ((_a(rng, (1, 2, 5, 5, 5), dtype),), {"mode": "max", "window": 3, "stride": 2, "padding": 1}),
        ((_a(rng, (2, 2, 6, 5), dtype),), {"mode": "max_deterministic", "window": (3, 2), "stride": 1}),
        # ceil_mode where the windows tile the input: no padding added (the legacy call)
        ((_a(rng, (2, 2, 9, 9), dtype),), {"mode": "avg_exclude_padding", "window": 3, "stride": 2,
                                           "ceil_mode": True}),
        ((_a(rng, (2, 2, 6, 6), dtype),), {"pool": Pooling("max", window=3, stride=1, padding=1)}),
    ]  # fmt: skip
    if not f64:
        cases += [
            ((_a(rng, (2, 3, 8, 8), dtype),), {"mode": "max", "window": 3, "stride": 2, "ceil_mode": True}),
            ((_a(rng, (2, 2, 6, 7), dtype),), {"mode": "max", "window": 3, "stride": 2, "padding": ((1, 0), (0, 1))}),
            ((_a(rng, (2, 3, 8), dtype),), {"mode": "avg_exclude_padding", "window": 3, "stride": 2,
                                            "ceil_mode": True}),
            ((_a(rng, (2, 2, 7), dtype),), {"mode": "avg_include_padding", "window": 3, "padding": ((2, 1),)}),
            ((_a(rng, (2, 2, 7), dtype),), {"mode": "avg_exclude_padding", "window": 3, "padding": ((0, 2),)}),
            ((_a(rng, (1, 2, 7, 7, 7), dtype),), {"mode": "max", "window": 2, "stride": 3, "ceil_mode": True}),
        ]  # fmt: skip
    return cases


SAMPLES = {"convolution": _conv_samples, "convolution_transpose": _convt_samples, "pooling": _pool_samples}


# ----------------------------------------------------------------- torch references (float64, CPU)


def _t(a):
    import torch

    return None if a is None else torch.as_tensor(a, dtype=torch.float64)


def _n(v, nsp):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nsp


def _conv_params(kw):
    c = kw.get("conv")
    if c is not None:
        return c.stride, c.padding, c.dilation, c.groups, c.mode
    return (kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1),
            kw.get("mode", "cross_correlation"))  # fmt: skip


def _conv(inputs, kw):
    """torch.nn.functional.conv{1,2,3}d; per-side padding by F.pad, mode "convolution" by a flipped kernel."""
    import torch
    import torch.nn.functional as F

    x, w, b = (_t(a) for a in inputs)
    nsp = x.ndim - 2
    stride, padding, dilation, groups, mode = _conv_params(kw)
    if mode == "convolution":
        w = torch.flip(w, dims=tuple(range(2, w.ndim)))
    if isinstance(padding, (tuple, list)) and all(isinstance(p, (tuple, list)) for p in padding):
        x = F.pad(x, [v for p in reversed(padding) for v in p])
        padding = 0
    elif not isinstance(padding, str):
        padding = _n(padding, nsp)
    fn = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1]
    with warnings.catch_warnings():  # "same" with an even kernel: torch notes that it pads a copy
        warnings.simplefilter("ignore", UserWarning)
        y = fn(x, w, b, stride=_n(stride, nsp), padding=padding, dilation=_n(dilation, nsp), groups=groups)
    return (torch.relu(y) if kw.get("activation") == "relu" else y,)


def _convt(inputs, kw):
    """torch.nn.functional.conv_transpose{1,2,3}d (x_shape as the output_padding it implies)."""
    import torch
    import torch.nn.functional as F

    x, w = (_t(a) for a in inputs)
    nsp = x.ndim - 2
    stride, padding, dilation, groups, mode = (_n(v, nsp) if i < 3 else v for i, v in enumerate(_conv_params(kw)))
    if mode == "convolution":
        w = torch.flip(w, dims=tuple(range(2, w.ndim)))
    op = _n(kw.get("output_padding", 0), nsp)
    if kw.get("x_shape") is not None:
        natural = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w.shape[2 + i] - 1) + 1
                   for i in range(nsp)]  # fmt: skip
        op = tuple(s - n for s, n in zip(kw["x_shape"][2:], natural))
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nsp - 1]
    return (fn(x, w, None, stride=stride, padding=padding, output_padding=op, groups=groups, dilation=dilation),)


def _pool(inputs, kw):
    """torch's max_pool / avg_pool{1,2,3}d (count_include_pad from the mode); per-side padding (and "same") by
    F.pad: -inf for max, zeros for the averages, whose exclude-padding divisor is the pooled count of ones."""
    import torch
    import torch.nn.functional as F

    (x,) = (_t(a) for a in inputs)
    nsp = x.ndim - 2
    p = kw.get("pool") or Pooling(**{k: v for k, v in kw.items() if k != "pool"})
    window = _n(p.window, nsp)
    stride = window if p.stride is None else _n(p.stride, nsp)
    padding = p.padding
    if padding == "valid":
        padding = 0
    elif padding == "same":
        padding = tuple(((w - 1) // 2, w - 1 - (w - 1) // 2) for w in window)
    pairs = isinstance(padding, tuple) and all(isinstance(v, tuple) for v in padding)
    pads = [v for q in reversed(padding) for v in q] if pairs else None
    padding = 0 if pairs else _n(padding, nsp)
    if p.mode.startswith("max"):
        if pads is not None:
            x = F.pad(x, pads, value=-torch.inf)
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nsp - 1]
        return (fn(x, window, stride, padding, ceil_mode=p.ceil_mode),)
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nsp - 1]
    include = p.mode == "avg_include_padding"
    if pads is None:
        return (fn(x, window, stride, padding, ceil_mode=p.ceil_mode, count_include_pad=include),)
    s = fn(F.pad(x, pads), window, stride, 0, ceil_mode=p.ceil_mode)
    if include:
        return (s,)
    return (s / fn(F.pad(torch.ones_like(x), pads), window, stride, 0, ceil_mode=p.ceil_mode),)


TORCH_REFERENCE = {"convolution": _conv, "convolution_transpose": _convt, "pooling": _pool}
