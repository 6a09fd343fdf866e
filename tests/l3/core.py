"""Samples and torch references of the ops declared with the L3 core (softmax, activation): see tests/l3/__init__
for the format (``SAMPLES``, ``TORCH_REFERENCE``)."""

from __future__ import annotations

SAMPLES = {
    "softmax": lambda rng, dtype: [
        ((rng.standard_normal((3, 5)).astype(dtype),), {"axis": -1}),
        ((rng.standard_normal((2, 4, 3, 3)).astype(dtype),), {"axis": 1, "log": True}),
    ],
    "activation": lambda rng, dtype: (
        [((rng.standard_normal((4, 6)).astype(dtype),), {"mode": m}) for m in ("sigmoid", "tanh", "elu", "swish")]
        + [((rng.standard_normal((2, 3, 4)).astype(dtype) + 0.05,), {"mode": "relu"})]
    ),
}


def _softmax(inputs, kw):
    import torch

    (x,) = inputs
    f = torch.log_softmax if kw.get("log") else torch.softmax
    return (f(x, dim=kw.get("axis", -1)),)


def _activation(inputs, kw):
    import torch.nn.functional as F

    (x,) = inputs
    fn = {"sigmoid": F.sigmoid, "tanh": F.tanh, "elu": F.elu, "swish": F.silu, "relu": F.relu}[kw.get("mode", "relu")]
    return (fn(x),)


TORCH_REFERENCE = {"softmax": _softmax, "activation": _activation}
