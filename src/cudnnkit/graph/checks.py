"""Argument checks of the graph builder (ints, int sequences, reals, constants, choices) and stride helpers.

Each check names the argument it refuses: a ``TypeError`` for a value of the wrong kind (a bool or a float where
an int goes), a :class:`~cudnnkit.graph.GraphError` for one out of range.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from .. import runtime as _runtime
from ..runtime.arrays import contiguous_strides
from .errors import GraphError

# ----------------------------------------------------------------- argument checks

INT64_MAX = 2**63 - 1
#: the largest stride, padding, dilation or window a graph takes: larger ones give output dims or strides beyond
#: what cuDNN's tensors hold
INT32_MAX = 2**31 - 1
_FLOAT32_MAX = 3.4028234663852886e38


def is_bool(v: Any) -> bool:
    t = type(v)
    return isinstance(v, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def as_bool(value: Any, name: str) -> bool:
    """``value`` as a bool: a Python or NumPy bool; anything else (an int too) a ``TypeError`` naming ``name``."""
    if not is_bool(value):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


def as_int(value: Any, name: str, *, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """``value`` as an int: a Python or NumPy integer. A bool, a float (even an integral one: torch refuses
    floats for sizes too), a string... is a ``TypeError`` naming ``name``; outside ``[minimum, maximum]`` a
    :class:`GraphError`."""
    if not is_bool(value):
        try:
            v = operator.index(value)
        except TypeError:
            pass
        else:
            if minimum is not None and v < minimum:
                raise GraphError(f"{name} must be >= {minimum}, got {v}")
            if v > maximum:
                raise GraphError(f"{name} must be <= {maximum}, got {v}")
            return v
    raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")


def as_ints(value: Any, name: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints (each as :func:`_int` takes it, within int64); ``TypeError`` naming
    ``name`` for a lone number, a string or anything not a sequence of integers."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(value).__name__} {value!r}")
    items = tuple(value)
    out = []
    for i, v in enumerate(items):
        if is_bool(v):
            ok = False
        else:
            try:
                v = operator.index(v)
                ok = True
            except TypeError:
                ok = False
        if not ok:
            raise TypeError(f"{name} must be a sequence of ints, got {items!r} ({name}[{i}] is {type(v).__name__})")
        if not -INT64_MAX - 1 <= v <= INT64_MAX:
            raise GraphError(f"{name} must hold int64 values, got {items!r}")
        out.append(v)
    return tuple(out)


def as_real(value: Any, name: str, *, finite: bool = True, dtype: str = "float64") -> float:
    """``value`` as a float, by :func:`cudnnkit.runtime.check_scalar`: a real number (bools, strings, None...
    are a ``TypeError`` naming ``name``), finite unless ``finite=False``, within the range of ``dtype`` (the
    type of the attribute cuDNN stores it in: ``"float32"`` for the pointwise alphas, double for the rest)."""
    return _runtime.check_scalar(value, name, finite=finite, dtype=dtype)


_FLOAT_MAX = {"float32": _FLOAT32_MAX, "bfloat16": 3.3895313892515355e38, "float16": 65504.0}
_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "bool": (0, 1),
}


def constant_value(value: Any, dtype: str, name: str) -> float | int:
    """A by-value constant's value for ``dtype``: an integer within the type's range for the integer types (and
    0/1 or a bool for ``"bool"``), else a real number, infinities allowed, NaN refused."""
    bounds = _INT_RANGES.get(dtype)
    if bounds is None:
        v = as_real(value, name, finite=False, dtype=dtype)
        if v != v:
            raise ValueError(f"{name} must not be NaN")
        top = _FLOAT_MAX.get(dtype)
        if top is not None and abs(v) != math.inf and abs(v) > top:
            raise ValueError(f"{name}={v!r} is outside {dtype}'s range (largest finite value {top!r})")
        return v
    v = int(value) if dtype == "bool" and is_bool(value) else as_int(value, name)
    if not bounds[0] <= v <= bounds[1]:
        raise ValueError(f"{name}={v} does not fit {dtype} ({bounds[0]} to {bounds[1]})")
    return v


def choice(value: Any, table: Any, name: str, what: str | None = None) -> str:
    """``value`` if it is one of ``table``'s string keys, else a :class:`GraphError` listing them."""
    if not isinstance(value, str) or value not in table:
        raise GraphError(f"{what or name} must be one of {sorted(table)}, got {value!r}")
    return value


def dense_like(dims: tuple[int, ...], like: tuple[int, ...] | None) -> tuple[int, ...]:
    """Packed strides for ``dims`` in the axis order of ``like``'s strides (C order without one)."""
    if like is None or len(like) != len(dims):
        return contiguous_strides(dims)
    order = sorted(range(len(dims)), key=lambda i: (-like[i], i))
    strides = [0] * len(dims)
    acc = 1
    for i in reversed(order):
        strides[i] = acc
        acc *= max(dims[i], 1)
    return tuple(strides)


def broadcast(dims: list[tuple[int, ...]], names: list[str]) -> tuple[int, ...]:
    nd = len(dims[0])
    for d, n in zip(dims[1:], names[1:]):
        if len(d) != nd:
            raise GraphError(f"{n} has {len(d)} dims but {names[0]} has {nd}; pointwise inputs have one rank")
    out = []
    for i in range(nd):
        sizes = {d[i] for d in dims} - {1}
        if len(sizes) > 1:
            raise GraphError(f"dim {i} cannot broadcast: {dict(zip(names, (d[i] for d in dims)))}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)
