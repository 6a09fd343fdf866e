"""Samples and torch references of the normalizations' L3 declarations (batch_norm, layer_norm, rms_norm,
instance_norm): see tests/l3/__init__ for the format (``SAMPLES``, ``TORCH_REFERENCE``).

Batch norm runs in float64 (cuDNN's legacy batch norm has it; its parameters and statistics then are float64).
Layer, RMS and instance norm exist only on cuDNN's graph API, which has no float64: their samples are float32
whatever ``dtype`` asks (``FLOAT32_ONLY``; a GPU test compares them with float32 tolerances, and gradcheck, which
needs float64, cannot run them)."""

from __future__ import annotations

import numpy as np

#: ops whose samples are float32 even when float64 is asked for (cuDNN's graph API has no float64)
FLOAT32_ONLY = ("layer_norm", "rms_norm", "instance_norm")


def _channels_last(a):
    """``a`` (N, C, *sp) with channels-last memory (NumPy strides), the same values."""
    perm = (0, *range(2, a.ndim), 1)
    inv = np.argsort(perm)
    return np.ascontiguousarray(a.transpose(perm)).transpose(inv)


def _batch_norm_samples(rng, dtype):
    def x(*shape, shift=0.0):
        return (rng.standard_normal(shape) + shift).astype(dtype)

    def p(*shape):
        return rng.standard_normal(shape).astype(dtype)

    def stats(*shape):
        return {"running_mean": p(*shape), "running_var": rng.uniform(0.5, 1.5, shape).astype(dtype)}

    return [
        ((x(2, 3, 3, 3), p(3), p(3), None), {"momentum": 0.2, **stats(3)}),
        ((_channels_last(x(2, 4, 3, 3)), p(4), p(4), None), {**stats(4)}),
        ((x(5, 3), p(3), p(3), None), {"epsilon": 1e-3}),
        ((x(3, 2, 2, 2), p(2, 2, 2), p(2, 2, 2), None), {"mode": "per_activation", **stats(2, 2, 2)}),
        ((x(2, 3, 4), p(3), p(3), None), {"training": False, **stats(3)}),
        ((x(2, 3, 2, 2), p(3), p(3), x(2, 3, 2, 2)), {"activation": "relu", **stats(3)}),
        ((x(2, 3, 2, 2), p(3), p(3), x(2, 3, 2, 2)), {"activation": "relu", "training": False, **stats(3)}),
        ((x(2, 3, 2), p(3, 2), p(3, 2), None), {"mode": "per_activation", "training": False, **stats(3, 2)}),
    ]


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


SAMPLES = {
    "batch_norm": _batch_norm_samples,
    "layer_norm": lambda rng, dtype: [
        ((_f32(rng, 3, 5), _f32(rng, 5), _f32(rng, 5)), {}),
        ((_f32(rng, 2, 3, 4), _f32(rng, 3, 4), None), {"epsilon": 1e-3}),
        ((_f32(rng, 2, 2, 6), _f32(rng, 6), _f32(rng, 6)), {"training": False}),
    ],
    "rms_norm": lambda rng, dtype: [
        ((_f32(rng, 3, 5), _f32(rng, 5)), {}),
        ((_f32(rng, 2, 3, 4), _f32(rng, 3, 4)), {"epsilon": 1e-3}),
        ((_f32(rng, 4, 6), _f32(rng, 6)), {"training": False}),
    ],
    "instance_norm": lambda rng, dtype: [
        ((_f32(rng, 2, 3, 4, 4), _f32(rng, 3), _f32(rng, 3)), {}),
        ((_channels_last(_f32(rng, 2, 4, 3, 3)), _f32(rng, 4), _f32(rng, 4)), {"epsilon": 1e-3}),
        ((_f32(rng, 2, 3, 5), _f32(rng, 3), None), {}),
        ((_f32(rng, 2, 3, 2, 3), _f32(rng, 3), _f32(rng, 3)), {"training": False}),
    ],
}


def _batch_norm(inputs, kw):
    import torch.nn.functional as F

    x, scale, bias, z = inputs
    flat = kw.get("mode", "spatial") == "per_activation"  # statistics per element of (C, *sp): over N alone

    def f(t):
        return t.reshape(-1) if flat and t is not None else t

    xs = x.reshape(x.shape[0], -1) if flat else x
    y = F.batch_norm(xs, f(kw.get("running_mean")), f(kw.get("running_var")), f(scale), f(bias),
                     training=kw.get("training", True), momentum=kw.get("momentum", 0.1),
                     eps=kw.get("epsilon", 1e-5)).reshape(x.shape)  # fmt: skip
    if z is not None:
        y = y + z
    return (F.relu(y) if kw.get("activation") == "relu" else y,)


def _layer_norm(inputs, kw):
    import torch.nn.functional as F

    x, scale, bias = inputs
    return (F.layer_norm(x, tuple(scale.shape), scale, bias, eps=kw.get("epsilon", 1e-5)),)


def _rms_norm(inputs, kw):
    import torch.nn.functional as F

    x, scale = inputs
    return (F.rms_norm(x, tuple(scale.shape), scale, eps=kw.get("epsilon", 1e-5)),)


def _instance_norm(inputs, kw):
    import torch.nn.functional as F

    x, scale, bias = inputs
    return (F.instance_norm(x, weight=scale, bias=bias, eps=kw.get("epsilon", 1e-5)),)


TORCH_REFERENCE = {
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "rms_norm": _rms_norm,
    "instance_norm": _instance_norm,
}
