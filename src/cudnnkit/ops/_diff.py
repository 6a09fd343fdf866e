"""The L3 declaration of a differentiable op: :class:`Differentiable`, and :data:`DIFFERENTIABLE`, its registry.

Each op family declares, next to its primitives, how its forward is differentiated, framework-neutral:

* ``forward(*inputs, **kw) -> (outputs, residuals)``: the differentiable arrays positionally (``inputs``), every
  other argument by keyword (the L2 function's keywords, and the arrays that carry no gradient: ``arrays``);
  ``outputs`` a tuple (``outputs``' order), ``residuals`` a dict of arrays (saved statistics, reserve space,
  the inputs the backward reads), nothing else;
* ``backward(residuals, douts, needs, **kw) -> grads``: ``douts`` one cotangent per output (None where the caller
  has none: a zero cotangent), ``needs`` one bool per input; one gradient per input (None where not needed),
  the cuDNN backward calls made in the order cuDNN requires, from one call;
* ``meta(*input specs, **kw) -> (output specs, residual specs)``: the same two results as :class:`Spec` s
  (shape, strides, dtype) without running anything on a GPU (host-side cuDNN queries only), in the same order and
  under the same names as ``forward``'s: what a tracer (``torch.library.register_fake``, JAX's abstract
  evaluation) needs. ``kw``'s arrays are specs there too.

:mod:`cudnnkit.autograd`, :mod:`cudnnkit.torch` (and the JAX layer) loop over :data:`DIFFERENTIABLE` and never
register an op by hand. A declaration names its forward primitive (``primitive``, in
:data:`~cudnnkit.ops._primitive.REGISTRY`); the registry checks that its ``inputs`` are among the primitive's
declared differentiable operands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..runtime.arrays import contiguous_strides, is_dense

__all__ = ["Spec", "Differentiable", "DIFFERENTIABLE", "differentiable", "spec_of", "new_like"]


class Spec(NamedTuple):
    """An array's metadata: ``shape``, element ``strides`` and ``dtype`` (cudnnkit's canonical dtype name)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str


def spec_of(v: Any) -> Spec:
    """The :class:`Spec` of an :class:`~cudnnkit.runtime.ArrayView` (or anything with shape, strides, dtype)."""
    return Spec(tuple(v.shape), tuple(v.strides), str(v.dtype))


def new_like(s: Spec, shape: tuple[int, ...] | None = None, dtype: str | None = None) -> Spec:
    """The spec of a new array laid out like ``s`` (its strides when it is dense, else C order), as the L2 ops
    allocate an output ``like`` an operand; ``shape``/``dtype`` replace ``s``'s (a new shape gets C order)."""
    if shape is not None and tuple(shape) != s.shape:
        return Spec(tuple(shape), contiguous_strides(tuple(shape)), dtype or s.dtype)
    strides = s.strides if is_dense(s.shape, s.strides) else contiguous_strides(s.shape)
    return Spec(s.shape, strides, dtype or s.dtype)


@dataclass(frozen=True)
class Differentiable:
    """One differentiable op (see the module docstring). ``name`` is its L3 name (``"convolution"``; the torch
    op ``cudnnkit::convolution``); ``differentiable_outputs`` says which outputs carry a gradient (default:
    all; pooling's index, CTC's costs-only ...); ``mutated`` the array keywords written in place (batch norm's
    running statistics)."""

    name: str
    primitive: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    forward: Callable[..., tuple[tuple, dict]]
    backward: Callable[..., tuple]
    meta: Callable[..., tuple[tuple, dict]]
    arrays: tuple[str, ...] = ()
    mutated: tuple[str, ...] = ()
    differentiable_outputs: tuple[bool, ...] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.differentiable_outputs is not None and len(self.differentiable_outputs) != len(self.outputs):
            raise ValueError(f"{self.name}: differentiable_outputs must have one flag per output")
        if not set(self.mutated) <= set(self.arrays):
            raise ValueError(f"{self.name}: mutated {self.mutated} must be among arrays {self.arrays}")

    def carries_gradient(self, i: int) -> bool:
        return self.differentiable_outputs is None or self.differentiable_outputs[i]


#: L3 name -> declaration
DIFFERENTIABLE: dict[str, Differentiable] = {}


def differentiable(d: Differentiable) -> Differentiable:
    """Register ``d`` (its name must be new, its primitive registered, its inputs among the primitive's declared
    differentiable operands) and return it."""
    from ._primitive import REGISTRY

    if d.name in DIFFERENTIABLE:
        raise ValueError(f"a differentiable op named {d.name!r} is already registered")
    p = REGISTRY.get(d.primitive)
    if p is None:
        raise ValueError(f"{d.name}: primitive {d.primitive!r} is not registered")
    if not set(d.inputs) <= set(p.differentiable):
        raise ValueError(f"{d.name}: inputs {d.inputs} are not among {p.name}'s differentiable {p.differentiable}")
    DIFFERENTIABLE[d.name] = d
    return d
