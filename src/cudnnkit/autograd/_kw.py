"""An op's keyword arguments as one string, and back: how an integration hands them through an opaque boundary
(a ``torch.library`` custom op's ``str`` argument, an XLA FFI string attribute) with no framework types.

:func:`encode` writes a Python literal ``((name, value), ...)`` in name order: bools, numbers, strings, None and
tuples as they are (a non-finite float as ``("__f__", "nan")``), a frozen dataclass of such fields (the ops'
config objects: ``Convolution``, ``Pooling``, ``RNN``) by value, and any other object (a ``DropoutState``) by a
key into a table that keeps it alive for the process. :func:`decode` is its inverse, cached per string. An
integration that has its own sequence types (``torch.Size``) adds them to :data:`SEQUENCES`.
"""

from __future__ import annotations

import ast
import math
import numbers
from typing import Any

from ..runtime.cache import LRU, MISSING

__all__ = ["encode", "decode", "SEQUENCES"]

#: the types written as plain tuples (an integration adds its own: ``torch.Size``)
SEQUENCES: set[type] = {tuple, list}
_SIMPLE = (bool, int, float, str, type(None))
#: key -> an object passed by key (kept alive for the process: configs, dropout states)
_OBJECTS: dict[int, Any] = {}
_DECODED: LRU[str, dict] = LRU("autograd.kw", 4096)


def _plain(v: Any) -> Any:
    """Tuples, lists and ``torch.Size`` s as plain tuples, recursively; NumPy and other number subclasses as plain
    ``int``/``float`` (a non-finite float as ``("__f__", "nan")``, which a literal cannot spell); anything else (a
    NamedTuple config too) as it is."""
    if type(v) in SEQUENCES:
        return tuple(_plain(x) for x in v)
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        f = float(v)
        return f if math.isfinite(f) else ("__f__", repr(f))
    return v


def _literal(v: Any) -> bool:
    if isinstance(v, _SIMPLE):
        return True
    return isinstance(v, tuple) and all(_literal(x) for x in v)


def _config(v: Any) -> tuple | None:
    """A frozen dataclass of literal fields (the ops' config objects: ``Convolution``, ``Pooling``, ``RNN``) as
    ``("__dc__", "module:qualname", ((field, value), ...))``, rebuilt by value on the other side; else None."""
    params = getattr(type(v), "__dataclass_params__", None)
    if params is None or not params.frozen:
        return None
    items = tuple((f, _plain(getattr(v, f))) for f, fd in type(v).__dataclass_fields__.items() if fd.init)
    if not all(_literal(x) for _, x in items):
        return None
    return ("__dc__", f"{type(v).__module__}:{type(v).__qualname__}", items)


def encode(kw: dict[str, Any]) -> str:
    """``kw`` as a string a custom op takes: a literal ``((name, value), ...)`` in name order; a config object by
    value (:func:`_config`); any other value that is not a literal (of bools, numbers, strings, None, tuples) is
    passed as ``("__obj__", key)`` (a dropout state: kept alive in a table)."""
    parts = []
    for k in sorted(kw):
        v = _plain(kw[k])
        if not _literal(v):
            cfg = _config(v)
            if cfg is not None:
                v = cfg
            else:
                _OBJECTS.setdefault(id(v), v)  # one dict call: atomic, and traceable (no lock)
                v = ("__obj__", id(v))
        parts.append((k, v))
    return repr(tuple(parts))


def _rebuild(path: str, items: tuple) -> Any:
    import importlib

    mod, _, qual = path.partition(":")
    cls: Any = importlib.import_module(mod)
    for part in qual.split("."):
        cls = getattr(cls, part)
    return cls(**dict(items))


def _unplain(v: Any) -> Any:
    if isinstance(v, tuple):
        if len(v) == 2 and v[0] == "__f__":
            return float(v[1])
        if len(v) == 2 and v[0] == "__obj__":
            return _OBJECTS[v[1]]
        if len(v) == 3 and v[0] == "__dc__":
            return _rebuild(v[1], tuple((f, _unplain(x)) for f, x in v[2]))
        return tuple(_unplain(x) for x in v)
    return v


def decode(s: str) -> dict[str, Any]:
    """:func:`encode`'s inverse (cached per string)."""
    got = _DECODED.lookup(s)
    if got is MISSING:
        got = {k: _unplain(v) for k, v in ast.literal_eval(s)}
        _DECODED.put(s, got)
    return dict(got)
