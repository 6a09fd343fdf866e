"""L3: the differentiable primitives, framework-neutral.

Every op declared :class:`~cudnnkit.ops._diff.Differentiable` (by its family, next to its primitives) is here by
its L3 name, with one calling convention that any autograd system can adopt::

    outputs, residuals = cudnnkit.autograd.convolution.forward(x, w, stride=2, padding=1)
    dx, dw = cudnnkit.autograd.convolution.backward(residuals, (dy,), (True, True), stride=2, padding=1)

* ``forward(*inputs, **kw)``: the differentiable arrays positionally (``.inputs`` names them), everything else by
  keyword (the L2 function's keywords; arrays without a gradient, such as batch norm's running statistics or
  CTC's labels, too). Returns ``(outputs, residuals)``: a tuple (``.outputs``), and a dict of the arrays the
  backward reads (a name that is an input's or an output's is that array itself).
* ``backward(residuals, douts, needs, **kw)``: one cotangent per output (None: zero), one bool per input; returns
  one gradient per input (None where ``needs`` is False), cuDNN's backward calls made in their required order
  (the RNN's data, then weights). ``kw`` must be the forward's.
* ``meta(*specs, **kw)``: the two results as :class:`Spec` s (shape, strides, dtype), from host-side shape
  inference only: what a tracer needs.

Arrays are whatever the L2 ops take (CuPy arrays, torch tensors, ...); no framework is imported here.
:func:`functions` lists every op; :func:`vjp` is the one-call convenience.
"""

from __future__ import annotations

from typing import Any

from ..ops import _diff
from ..ops._diff import DIFFERENTIABLE, Differentiable, Spec, spec_of

__all__ = ["Differentiable", "Spec", "functions", "get", "vjp", "spec_of"]


def functions() -> dict[str, Differentiable]:
    """Every differentiable op, by L3 name (a copy of :data:`~cudnnkit.ops._diff.DIFFERENTIABLE`)."""
    _load()
    return dict(DIFFERENTIABLE)


def get(name: str) -> Differentiable:
    """The differentiable op ``name`` (``KeyError`` listing the names when there is none)."""
    _load()
    try:
        return DIFFERENTIABLE[name]
    except KeyError:
        raise KeyError(f"no differentiable op {name!r}; there are {sorted(DIFFERENTIABLE)}") from None


def vjp(name: str, *inputs: Any, **kw: Any) -> tuple[tuple, Any]:
    """``(outputs, pullback)``: the forward of op ``name``, and ``pullback(*douts) -> grads`` (every input's)."""
    d = get(name)
    outs, res = d.forward(*inputs, **kw)
    options = {k: v for k, v in kw.items() if k not in d.arrays}

    def pullback(*douts: Any) -> tuple:
        if len(douts) != len(d.outputs):
            raise ValueError(f"{name}: pullback takes {len(d.outputs)} cotangent(s) ({d.outputs}), got {len(douts)}")
        return d.backward(res, douts, tuple(x is not None for x in inputs), **options)

    return outs, pullback


def _load() -> None:
    from .. import ops  # noqa: F401  (the families declare their ops on import)


def __getattr__(name: str) -> Differentiable:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return get(name)
    except KeyError as e:
        raise AttributeError(str(e)) from None


def __dir__() -> list[str]:
    _load()
    return sorted(set(__all__) | set(DIFFERENTIABLE))


del _diff
