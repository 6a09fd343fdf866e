"""The plumbing of :mod:`cudnnkit.nn`: which array library a call has (:mod:`cudnnkit.runtime.adapters`), the L3
call (``cudnnkit.torch.op(name)`` for torch tensors, with autograd; ``cudnnkit.autograd.get(name).forward`` for CuPy
arrays, forward only), argument normalization, and the few array helpers (ones, casts, copies) per library.

Nothing here imports torch or CuPy at import time: a library is imported only when one of its arrays is seen.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ..runtime import adapters
from ..runtime.dtypes import canonical

#: the libraries cudnnkit.nn takes (the adapters that have an L3 integration)
LIBRARIES = ("torch", "cupy")


def library(*arrays: Any) -> str:
    """``"torch"`` or ``"cupy"``: the library of the first array given (``TypeError`` for anything else)."""
    for a in arrays:
        if a is None:
            continue
        name = adapters.library_of(a)  # by the type's module, loading no adapter (torch.compile traces this)
        if name in LIBRARIES:
            return name
        raise TypeError(f"cudnnkit.nn takes torch tensors or CuPy arrays, got {type(a).__module__}.{type(a).__name__}")
    raise TypeError("cudnnkit.nn needs at least one array")


def l3(name: str) -> Any:
    """The L3 declaration ``name``, looked up now (``NotImplementedError`` when no family declares it)."""
    from .. import autograd

    try:
        return autograd.get(name)
    except KeyError:
        raise NotImplementedError(f"cudnnkit has no differentiable op {name!r} (no L3 declaration)") from None


def has_l3(name: str) -> bool:
    from .. import autograd

    return name in autograd.functions()


def call(name: str, *inputs: Any, **kw: Any) -> tuple:
    """The outputs of L3 op ``name`` on ``inputs`` (the declaration's, in order; missing trailing ones None) and
    ``kw`` (its keywords and arrays): through ``cudnnkit.torch.op(name)`` for torch tensors (autograd), through
    the declaration's forward for CuPy arrays."""
    d = l3(name)
    n = len(d.inputs)
    if any(v is not None for v in inputs[n:]):
        raise NotImplementedError(f"L3 op {name!r} takes the inputs {d.inputs} only")
    inputs = (tuple(inputs) + (None,) * n)[:n]
    if library(*inputs) == "torch":
        from .. import torch as ckt  # imports torch (already imported: the arrays are torch tensors)

        got = ckt.op(name)(*inputs, **kw)
        return (got,) if len(d.outputs) == 1 else tuple(got)
    return tuple(d.forward(*inputs, **kw)[0])


def call1(name: str, *inputs: Any, **kw: Any) -> Any:
    """The first output of :func:`call`."""
    return call(name, *inputs, **kw)[0]


def from_values(like: Any, values: Any, dtype: str) -> Any:
    """A new 1-d array of ``like``'s library and device holding ``values`` (a list of host numbers) in ``dtype``."""
    if library(like) == "torch":
        import torch

        return torch.tensor(values, dtype=getattr(torch, dtype), device=like.device)
    import cupy

    with like.device:
        return cupy.asarray(values, dtype=dtype)


# ----------------------------------------------------------------- arguments


def as_int(v: Any, name: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an int, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {v!r}") from None


def ntuple(v: Any, n: int, name: str) -> tuple[int, ...]:
    """An int or a sequence of 1 or ``n`` ints as an ``n``-tuple of Python ints (torch's ``_ntuple``)."""
    if isinstance(v, Sequence) and not isinstance(v, str):
        items = tuple(as_int(x, name) for x in v)
        if len(items) == 1:
            return items * n
        if len(items) != n:
            raise ValueError(f"{name} must be an int or {n} ints, got {v!r}")
        return items
    return (as_int(v, name),) * n


def real(v: Any, name: str) -> float:
    """``v`` as a float: a real number (a 0-d array too), not a bool or a string (``TypeError`` naming ``name``)."""
    if isinstance(v, (bool, str, bytes)):
        raise TypeError(f"{name} must be a real number, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {v!r}") from None


def batched(x: Any, nsp: int, fn: str) -> bool:
    """Whether ``x`` is ``(N, C, *nsp)`` (True) or unbatched ``(C, *nsp)`` (False; ``ValueError`` otherwise)."""
    if x.ndim == nsp + 2:
        return True
    if x.ndim == nsp + 1:
        return False
    raise ValueError(f"{fn}: input must be {nsp + 1}-d (unbatched) or {nsp + 2}-d (batched), got shape "
                     f"{tuple(x.shape)}")  # fmt: skip


def dtype_of(a: Any) -> str:
    """cudnnkit's dtype name of an array (torch's or CuPy's)."""
    return canonical(a.dtype, "array")


def check_dtype(a: Any, allowed: tuple[str, ...], name: str, what: str) -> str:
    """``a``'s dtype, ``NotImplementedError`` naming ``name`` where ``what`` (cuDNN's call) has no such dtype."""
    dt = dtype_of(a)
    if dt not in allowed:
        raise NotImplementedError(f"{name} has dtype {dt}: {what} takes {', '.join(allowed)} only")
    return dt


# ----------------------------------------------------------------- array helpers, per library


def _torch_dtype(dtype: str) -> Any:
    from ..runtime.adapters._torch import _TO_TORCH

    return _TO_TORCH[dtype]


def full(like: Any, shape: tuple[int, ...], value: float, dtype: str) -> Any:
    """A new array of ``like``'s library and device filled with ``value``."""
    if library(like) == "torch":
        import torch

        return torch.full(tuple(shape), value, dtype=_torch_dtype(dtype), device=like.device)
    import cupy

    with like.device:
        return cupy.full(tuple(shape), value, dtype=dtype)


#: dropout seeds are drawn from ``[0, 2**62)``
_SEED_HIGH = 1 << 62


def dropout_seed(like: Any) -> tuple[Any, Any]:
    """A fresh ``(seed, offset)`` for cuDNN's attention dropout (its Philox generator): two ``(1, 1, 1, 1)`` int64
    arrays on ``like``'s device, the seed drawn on the device from the library's own generator (``torch.randint``:
    ``torch.manual_seed`` reproduces it and a CUDA-graph replay draws a new one; ``cupy.random.randint``:
    ``cupy.random.seed``), the offset 0. No host synchronization."""
    shape = (1, 1, 1, 1)
    if library(like) == "torch":
        import torch

        seed = torch.randint(0, _SEED_HIGH, shape, dtype=torch.int64, device=like.device)
        return seed, torch.zeros(shape, dtype=torch.int64, device=like.device)
    import cupy

    with like.device:
        return cupy.random.randint(0, _SEED_HIGH, size=shape, dtype=cupy.int64), cupy.zeros(shape, cupy.int64)


def process_seed(like: Any) -> int:
    """A host seed for a cuDNN RNG state made once per config (the RNNs' dropout): ``torch.initial_seed()`` for torch
    arrays (``torch.manual_seed`` reproduces a run, as the modules seed theirs), 0 for the others."""
    if library(like) == "torch":
        import torch

        return int(torch.initial_seed()) % 2**64
    return 0


def cast(a: Any, dtype: str) -> Any:
    """``a`` in ``dtype`` (itself when it has it; differentiable for torch tensors)."""
    if a is None or dtype_of(a) == dtype:
        return a
    if library(a) == "torch":
        return a.to(_torch_dtype(dtype))
    return a.astype(dtype)


def copy_into(dst: Any, src: Any, grad: bool = True) -> Any:
    """Write ``src`` into ``dst`` and return ``dst`` (torch: ``copy_``, recorded by autograd unless ``grad`` is
    False)."""
    if library(dst) == "torch":
        if grad:
            return dst.copy_(src)
        import torch

        with torch.no_grad():
            return dst.copy_(src)
    dst[...] = src
    return dst


def inplace_source(x: Any, inplace: bool) -> Any:
    """What an op with ``inplace=True`` reads, as torch's in-place functions behave: ``x`` itself, except where
    autograd records ``x`` (grad mode on, ``x`` requires grad): a leaf is refused with torch's error, and a
    non-leaf is read through a clone, so that writing the result into ``x`` (``copy_``, recorded: the gradient
    flows back through the op) leaves the op's saved input unchanged."""
    if not (inplace and getattr(x, "requires_grad", False)):
        return x
    import torch

    if not torch.is_grad_enabled():
        return x
    if x.is_leaf:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    return x.clone()


def broadcast_to(a: Any, shape: tuple[int, ...]) -> Any:
    """A view of ``a`` broadcast to ``shape`` (``expand``, differentiable; ``cupy.broadcast_to``): zero strides
    in the broadcast dims, no copy."""
    if library(a) == "torch":
        return a.expand(*shape)
    import cupy

    return cupy.broadcast_to(a, shape)


def clone(a: Any) -> Any:
    return a.clone() if library(a) == "torch" else a.copy()


def concat(parts: list[Any]) -> Any:
    """The 1-d arrays ``parts`` joined (``torch.cat``, differentiable; ``cupy.concatenate``)."""
    if library(parts[0]) == "torch":
        import torch

        return torch.cat(parts)
    import cupy

    return cupy.concatenate(parts)


def contiguous(a: Any) -> Any:
    if library(a) == "torch":
        return a.contiguous()
    import cupy

    return cupy.ascontiguousarray(a)
