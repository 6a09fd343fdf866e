"""L3 samples and torch references of the tensor primitives: op_tensor, reduce_tensor, transform_tensor (see
tests/l3/misc.py for the format: ``SAMPLES[name](rng, dtype)``, ``TORCH_REFERENCE[name](inputs, kw)``).

op_tensor's samples broadcast b over a (each of b's dims a's or 1) and scale with alpha1/alpha2; min/max draw
distinct values (the tie rule, half to each side, is torch's too). reduce_tensor's mul samples include exact zeros
(one and two in a slice: torch.prod's gradient there); sqrt's inputs are positive.
"""

from __future__ import annotations

import numpy as np


def _n(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _op_tensor(rng, dtype):
    n = lambda *s: _n(rng, s, dtype)  # noqa: E731
    return [
        ((n(2, 3, 4, 5), n(1, 3, 1, 1)), dict(op="mul", alpha1=1.5, alpha2=-0.5)),
        ((n(2, 3, 4, 5), n(1, 3, 1, 1)), dict(op="add")),
        ((n(3, 4), n(3, 4)), dict(op="add", alpha1=2.0, alpha2=-0.5)),
        ((n(2, 3, 4), n(1, 1, 4)), dict(op="mul")),
        ((n(2, 3, 4, 5), n(1, 3, 1, 5)), dict(op="max", alpha2=-1.0)),
        ((n(4, 5), n(4, 5)), dict(op="min", alpha1=0.5)),
        ((n(3, 1, 4), n(1, 1, 4)), dict(op="max")),
        ((n(2, 2, 3, 2, 2), n(1, 2, 1, 2, 1)), dict(op="add", alpha2=3.0)),  # 5-d, cuDNN's most
        ((n(6), n(1)), dict(op="min", alpha1=-1.0, alpha2=2.0)),  # 1-d
        ((rng.uniform(0.5, 2.0, (3, 4, 5)).astype(dtype), None), dict(op="sqrt", alpha1=2.0)),
        ((n(2, 3), None), dict(op="not", alpha1=1.5)),  # cuDNN's not: 1 - x
    ]


def _mul_sample(rng, dtype):
    a = (rng.uniform(0.5, 1.5, (4, 5)) * rng.choice([-1.0, 1.0], (4, 5))).astype(dtype)
    a[1, 2] = 0  # one zero in row 1
    a[2, 0] = a[2, 3] = 0  # two in row 2
    return a


def _reduce_tensor(rng, dtype):
    n = lambda *s: _n(rng, s, dtype)  # noqa: E731
    signed = (rng.uniform(0.6, 1.4, (2, 3, 4)) * rng.choice([-1.0, 1.0], (2, 3, 4))).astype(dtype)
    return [
        ((n(2, 3, 4, 5),), dict(op="add", axes=(1, 3))),
        ((n(3, 4),), dict(op="add")),  # all axes
        ((n(2, 3, 4),), dict(op="avg", axes=0)),
        ((signed,), dict(op="mul", axes=2)),
        ((_mul_sample(rng, dtype),), dict(op="mul", axes=1)),
        ((n(2, 3, 4, 5),), dict(op="max", axes=(0, 2))),
        ((n(3, 5),), dict(op="min", axes=-1)),
        ((n(4, 6),), dict(op="amax", axes=0)),
        ((n(2, 3, 4),), dict(op="norm1", axes=(1, 2))),
        ((n(2, 3, 4),), dict(op="norm2", axes=1)),
        ((_mul_sample(rng, dtype),), dict(op="mul_no_zeros", axes=1)),
        ((n(2, 1, 3),), dict(op="add", axes=1)),  # over a size-1 dim only (run around cuDNN's refusal)
        ((n(2, 1, 2, 3, 1, 2),), dict(op="add", axes=(0, 3))),  # 6-d: the backward broadcasts merged dims
        ((n(2, 3, 2, 2, 2, 2),), dict(op="avg", axes=(1, 4, 5))),
    ]


def _transform_tensor(rng, dtype):
    n = lambda *s: _n(rng, s, dtype)  # noqa: E731
    return [
        ((n(2, 3, 4, 5),), dict(layout="nhwc")),
        ((n(2, 3, 4),), dict(pad_before=1, pad_after=(0, 2, 1))),
        ((n(3, 4),), {}),
        ((n(1, 2, 3, 3),), dict(layout="nchw", pad_before=(0, 0, 1, 1), pad_after=(0, 0, 1, 2))),
        ((n(2, 2, 2, 3, 2),), dict(layout="nhwc", pad_after=(0, 1, 0, 0, 1))),  # 5-d channels last
    ]


SAMPLES = {"op_tensor": _op_tensor, "reduce_tensor": _reduce_tensor, "transform_tensor": _transform_tensor}


# ----------------------------------------------------------------- torch references


def _f64(a):
    import torch

    return (a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))).to(torch.float64)


def _ref_op_tensor(inputs, kw):
    """cuDNN's c = op(alpha1 * a, alpha2 * b); sqrt(alpha1 * a); not: 1 - alpha1 * a."""
    import torch

    op = kw.get("op", "add")
    x = _f64(inputs[0]) * kw.get("alpha1", 1.0)
    if op == "sqrt":
        return (torch.sqrt(x),)
    if op == "not":
        return (1 - x,)
    y = _f64(inputs[1]) * kw.get("alpha2", 1.0)
    return ({"add": torch.add, "mul": torch.mul, "min": torch.minimum, "max": torch.maximum}[op](x, y),)


def _dims(kw, nd):
    axes = kw.get("axes")
    if axes is None:
        return tuple(range(nd))
    return tuple(sorted(a % nd for a in ((axes,) if isinstance(axes, int) else axes)))


def _prod(x, dims):
    for d in dims:  # torch.prod takes one dim: one after the other (its gradient handles zeros)
        x = x.prod(d, keepdim=True)
    return x


def _ref_reduce_tensor(inputs, kw):
    """torch's reductions keeping the dims: sum, mean, prod, amin, amax, amax of |a|, |a| sum, vector_norm;
    mul_no_zeros as the prod of a with its zeros as 1."""
    import torch

    a = _f64(inputs[0])
    op, dims = kw.get("op", "add"), _dims(kw, a.dim())
    f = {
        "add": lambda: a.sum(dims, keepdim=True),
        "avg": lambda: a.mean(dims, keepdim=True),
        "mul": lambda: _prod(a, dims),
        "mul_no_zeros": lambda: _prod(torch.where(a == 0, torch.ones_like(a), a), dims),
        "min": lambda: torch.amin(a, dims, keepdim=True),
        "max": lambda: torch.amax(a, dims, keepdim=True),
        "amax": lambda: torch.amax(a.abs(), dims, keepdim=True),
        "norm1": lambda: a.abs().sum(dims, keepdim=True),
        "norm2": lambda: torch.linalg.vector_norm(a, 2, dims, keepdim=True),
    }[op]
    return (f(),)


def _ref_transform_tensor(inputs, kw):
    """A copy (the layout changes no value) zero-padded by F.pad (its pairs from the last dim)."""
    import torch.nn.functional as F

    x = _f64(inputs[0])
    nd = x.dim()
    pb, pa = (kw.get(k, 0) for k in ("pad_before", "pad_after"))
    pb, pa = ((p,) * nd if isinstance(p, int) else tuple(p) for p in (pb, pa))
    return (F.pad(x, [p for i in reversed(range(nd)) for p in (pb[i], pa[i])]) if nd else x.clone(),)


TORCH_REFERENCE = {
    "op_tensor": _ref_op_tensor,
    "reduce_tensor": _ref_reduce_tensor,
    "transform_tensor": _ref_transform_tensor,
}
