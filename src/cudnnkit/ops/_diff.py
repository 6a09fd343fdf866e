"""The L3 declaration of a differentiable op: :class:`Differentiable`, and :data:`DIFFERENTIABLE`, its registry.

Each op family declares, next to its primitives, how its forward is differentiated, framework-neutral:

* ``forward(*inputs, **kw) -> (outputs, residuals)``: the differentiable arrays positionally (``inputs``), every
  other argument by keyword (the L2 function's keywords, and the arrays that carry no gradient: ``arrays``);
  ``outputs`` a tuple (``outputs``' order), ``residuals`` a dict of arrays (saved statistics, reserve space,
  the inputs the backward reads), nothing else;
* ``backward(residuals, douts, needs, **kw) -> grads``: ``douts`` one cotangent per output (None where the caller
  has none: a zero cotangent), ``needs`` one bool per input; one gradient per input (None where not needed),
  the cuDNN backward calls made in the order cuDNN requires, from one call. ``residuals`` has the forward's
  names (None where the forward gave None). An op with ``tracked_residuals`` (residuals its L2 backward
  recognises by identity: the RNN's reserve, in a ledger keyed by its data pointer) also takes
  ``residuals_copied=True``: the integration hands it copies of the forward's arrays (JAX: XLA keeps residuals
  in buffers of its own), which the op then vouches for explicitly; an integration that hands back the
  forward's own arrays (torch, a tape) passes nothing;
* ``meta(*input specs, **kw) -> (output specs, residual specs)``: the same two results as :class:`Spec` s
  (shape, strides, dtype) without running anything on a GPU (host-side cuDNN queries only), in the same order and
  under the same names as ``forward``'s: what a tracer (``torch.library.register_fake``, JAX's abstract
  evaluation) needs. ``kw``'s arrays are specs there too.

**What a declaration may do with its arrays.** They are whatever the L2 ops take: CuPy arrays, torch tensors, JAX
arrays, and inside an XLA handler cudnnkit's own :class:`~cudnnkit.runtime.adapters._raw.DeviceArray`, which has no
arithmetic, comparison or indexing. So a forward or backward computes with L2 calls only, and besides them uses
no more than: ``.shape``, ``.reshape(shape)`` of a C-contiguous array, :func:`~cudnnkit.runtime.arrays.as_view`,
:func:`window` (a sub-array as a view the L2 ops take), and, where cuDNN has no call at all (an elementwise
division), :func:`host_values` and :func:`from_host` (the adapter protocol's ``to_numpy``/``from_numpy``: they
synchronize). Never an array library's operators (``a * b``, ``a > 0``, ``a[i]``): tests/test_l3_strict_cpu.py
runs the declarations on such arrays.

:mod:`cudnnkit.autograd`, :mod:`cudnnkit.torch` (and the JAX layer) loop over :data:`DIFFERENTIABLE` and never
register an op by hand. A declaration names its forward primitive (``primitive``, in
:data:`~cudnnkit.ops._primitive.REGISTRY`); the registry checks that its ``inputs`` are among the primitive's
declared differentiable operands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..runtime.arrays import as_view, contiguous_strides, is_dense
from ..runtime.view import ArrayView

__all__ = ["Spec", "Differentiable", "DIFFERENTIABLE", "differentiable", "spec_of", "spec_view", "new_like",
           "window", "host_values", "from_host"]  # fmt: skip


class Spec(NamedTuple):
    """An array's metadata: ``shape``, element ``strides`` and ``dtype`` (cudnnkit's canonical dtype name)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str


def spec_of(v: Any) -> Spec:
    """The :class:`Spec` of an :class:`~cudnnkit.runtime.ArrayView` (or anything with shape, strides, dtype)."""
    return Spec(tuple(v.shape), tuple(v.strides), str(v.dtype))


def spec_view(s: Spec | None) -> ArrayView | None:
    """A spec as the resolve functions read a view, without data (device 0, pointer 0): what each ``meta`` hands
    the checks the call makes (None stays None)."""
    return None if s is None else ArrayView(tuple(s.shape), tuple(s.strides), s.dtype, 0, 0, None)


def new_like(s: Spec, shape: tuple[int, ...] | None = None, dtype: str | None = None) -> Spec:
    """The spec of a new array laid out like ``s`` (its strides when it is dense, else C order), as the L2 ops
    allocate an output ``like`` an operand; ``shape``/``dtype`` replace ``s``'s (a new shape gets C order)."""
    if shape is not None and tuple(shape) != s.shape:
        return Spec(tuple(shape), contiguous_strides(tuple(shape)), dtype or s.dtype)
    strides = s.strides if is_dense(s.shape, s.strides) else contiguous_strides(s.shape)
    return Spec(s.shape, strides, dtype or s.dtype)


def window(a: Any, start: tuple[int, ...], shape: tuple[int, ...], name: str = "array") -> ArrayView:
    """The elements ``start[i] : start[i] + shape[i]`` of every dim of ``a`` (a CUDA array of any library, or a
    view), as an :class:`~cudnnkit.runtime.ArrayView` over the same memory with ``a``'s strides: what ``a[...]`` of
    slices gives, for any array the L2 ops take (the ops accept a view, and allocate with ``a``'s library).
    ``ValueError`` naming ``name`` for a window outside ``a``."""
    v = as_view(a, name)
    start, shape = tuple(int(i) for i in start), tuple(int(d) for d in shape)
    if len(start) != v.ndim or len(shape) != v.ndim:
        raise ValueError(f"{name}: a window of a {v.ndim}-dim array needs {v.ndim} starts and sizes")
    if any(b < 0 or n < 0 or b + n > d for b, n, d in zip(start, shape, v.shape)):
        raise ValueError(f"{name}: the window {shape} at {start} is not inside its shape {v.shape}")
    offset = sum(b * st for b, st in zip(start, v.strides)) if 0 not in shape else 0
    return ArrayView(shape, v.strides, v.dtype, v.device, v.ptr + offset * v.itemsize, v.owner, v.adapter,
                     v.readonly, v.stream)  # fmt: skip


def host_values(a: Any, name: str = "array") -> Any:
    """``a``'s values as a float64 NumPy array, read by its library's adapter (``to_numpy``, which waits for the
    work queued on the library's current stream): for the arithmetic cuDNN has no call for. ``TypeError`` naming
    ``name`` for an array of a library without a cudnnkit adapter."""
    import numpy as np

    v = as_view(a, name)
    if v.adapter is None:
        raise TypeError(f"{name}: its values are read on the host through its library's adapter, and this "
                        f"{type(a).__name__} has none; pass a CuPy array or a torch tensor")  # fmt: skip
    owner = a if not isinstance(a, ArrayView) else v.owner
    return np.asarray(v.adapter.to_numpy(owner), dtype=np.float64)


def from_host(values: Any, like: Any, name: str = "array") -> Any:
    """A new C-contiguous array of ``like``'s library, dtype and device holding ``values`` (host numbers, rounded
    to that dtype), uploaded by the adapter (``from_numpy``, queued on the library's current stream). A bfloat16
    ``like`` needs ``ml_dtypes`` (which JAX and CuPy bring)."""
    import numpy as np

    v = as_view(like, name)
    if v.adapter is None:
        raise TypeError(f"{name}: a result is made on the host and uploaded through its library's adapter, and "
                        f"this {type(like).__name__} has none; pass a CuPy array or a torch tensor")  # fmt: skip
    if v.dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"{name}: a bfloat16 result computed on the host needs ml_dtypes (pip install "
                              "ml_dtypes) for NumPy to hold it") from None  # fmt: skip
        dt: Any = ml_dtypes.bfloat16
    else:
        dt = np.dtype(v.dtype)
    host = np.ascontiguousarray(np.asarray(values, dtype=np.float64).astype(dt))
    return v.adapter.from_numpy(host, v.device)


@dataclass(frozen=True, eq=False)
class Differentiable:
    """One differentiable op (see the module docstring). ``name`` is its L3 name (``"convolution"``; the torch
    op ``cudnnkit::convolution``); ``differentiable_outputs`` says which outputs carry a gradient (default:
    all; pooling's index, CTC's costs-only ...); ``mutated`` the array keywords written in place (batch norm's
    running statistics).

    A declaration is its object: it compares and hashes by identity, and the caches that hold what one
    declaration did (its replayed calls, its torch layouts) key by the object, never by ``name`` alone (two
    declarations of one name, a redefinition or one name in two namespaces, are two ops)."""

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
    #: residuals the L2 backward recognises by identity (see the module docstring: ``residuals_copied``)
    tracked_residuals: tuple[str, ...] = ()
    #: the names (inputs, arrays, outputs, residuals) whose leading axis is the op's samples, along which it computes
    #: each sample apart from the others: a batch mapped over them (``jax.vmap``) folds into that axis. Empty: no
    #: batching rule. Every output and fresh residual must be named when any input is.
    batch: tuple[str, ...] = ()
    #: ``(kw, specs) -> reason | None``: why a call with these keywords cannot fold (softmax over axis 0);
    #: ``specs`` the present inputs' and arrays' :class:`Spec` s by name
    batch_refuses: Callable[[dict, dict], str | None] | None = None
    #: whether a warm call of the op (its forward and its backward, once the first call of these shapes and settings
    #: has built its descriptors, plans and algorithm choice and made its handle) queues device work only on the
    #: caller's stream: no host synchronization, no host read of device data, no upload from pageable host memory, no
    #: host-side state (an RNG position, a ledger) that a replay of captured work would skip. What a CUDA-graph
    #: capture of the call needs of the op itself; an integration also needs its own memory handling to be capturable
    #: (:mod:`cudnnkit.jax._ops`: XLA's command-buffer trait). Default False; each True carries its one-line reason.
    capture_safe: bool = False
    #: ``(kw, arrays) -> reason | None``: why a call with these keywords and arrays (by name, None where absent) is
    #: not a function of its arrays: it draws from hidden state that each call advances (an RNG state). A functional
    #: integration refuses such a call naming the reason (JAX may merge two equal calls into one, or recompute a
    #: call under ``jax.checkpoint``, and either would silently give another mask than the one the value used).
    impure: Callable[[dict, dict], str | None] | None = None

    def __post_init__(self) -> None:
        if self.differentiable_outputs is not None and len(self.differentiable_outputs) != len(self.outputs):
            raise ValueError(f"{self.name}: differentiable_outputs must have one flag per output")
        if not set(self.mutated) <= set(self.arrays):
            raise ValueError(f"{self.name}: mutated {self.mutated} must be among arrays {self.arrays}")
        if not isinstance(self.tracked_residuals, tuple):
            raise TypeError(f"{self.name}: tracked_residuals must be a tuple of residual names")

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
