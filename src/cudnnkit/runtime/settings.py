"""Scoped, thread-local settings: ``with cudnnkit.settings(deterministic=True): ...``.

Fields (``None`` in a ``settings(...)`` call means "leave as is"):

``deterministic`` (bool, default False)
    Only algorithms/engines with deterministic results.
``allow_tf32`` (bool, default True)
    Allow TF32 tensor-core math for float32 data (as torch does for cuDNN convolutions).
``workspace_limit`` (int bytes or None, default None = no limit)
    Largest workspace an algorithm or engine may ask for.
``autotune`` ("off" | "heuristics" | "exhaustive", default "heuristics")
    How algorithms/plans are chosen: first heuristic choice, or timed candidates.
``heuristic_mode`` ("instant" | "a" | "b" | "fallback", default "a")
    Backend heuristics mode (``CUDNN_HEUR_MODE_*``; "instant" is an alias of "a" in cuDNN 9).
``prefer`` ("auto" | "graph" | "legacy", default "auto")
    Which cuDNN API an op uses where it has both.

Settings nest; the innermost value wins and is restored on exit. They are
per thread: another thread starts from the defaults.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields, replace

from .cache import LRU, MISSING

__all__ = ["Settings", "settings", "current_settings"]

_AUTOTUNE = ("off", "heuristics", "exhaustive")
_HEUR = ("instant", "a", "b", "fallback")
_PREFER = ("auto", "graph", "legacy")


@dataclass(frozen=True)
class Settings:
    deterministic: bool = False
    allow_tf32: bool = True
    workspace_limit: int | None = None
    autotune: str = "heuristics"
    heuristic_mode: str = "a"
    prefer: str = "auto"

    def __post_init__(self) -> None:
        for name in ("deterministic", "allow_tf32"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"settings: {name} must be a bool, got {getattr(self, name)!r}")
        wl = self.workspace_limit
        if wl is not None and (isinstance(wl, bool) or not isinstance(wl, int) or wl < 0):
            raise ValueError(f"settings: workspace_limit must be a non-negative int (bytes) or None, got {wl!r}")
        for name, allowed in (("autotune", _AUTOTUNE), ("heuristic_mode", _HEUR), ("prefer", _PREFER)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"settings: {name} must be one of {allowed}, got {getattr(self, name)!r}")
        # every op call's cache key holds the settings: hash them once (the generated hash re-hashed all fields)
        object.__setattr__(self, "_hash", hash(self.key()))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple:  # a copy in another process hashes its own strings again
        return (type(self), self.key())

    def key(self) -> tuple:
        """A hashable key of every field, for plan and algorithm caches."""
        return tuple(getattr(self, f.name) for f in fields(self))


class _Stack(threading.local):
    def __init__(self) -> None:
        self.current = Settings()


_stack = _Stack()


def current_settings() -> Settings:
    """The settings in force on this thread."""
    return _stack.current


def settings(
    *,
    deterministic: bool | None = None,
    allow_tf32: bool | None = None,
    workspace_limit: int | None | type[...] = ...,
    autotune: str | None = None,
    heuristic_mode: str | None = None,
    prefer: str | None = None,
) -> AbstractContextManager[Settings]:
    """Context manager that changes the given fields for this thread and restores them on exit.

    ``workspace_limit=None`` removes a limit; leaving it out keeps the current one. The values are
    checked when ``settings(...)`` is called (``TypeError``/``ValueError`` naming the field), not
    only at ``with``; they apply on top of the settings in force where the ``with`` block starts.
    """
    changes = {
        k: v
        for k, v in dict(
            deterministic=deterministic,
            allow_tf32=allow_tf32,
            autotune=autotune,
            heuristic_mode=heuristic_mode,
            prefer=prefer,
        ).items()
        if v is not None
    }
    if workspace_limit is not ...:
        changes["workspace_limit"] = workspace_limit
    replace(Settings(), **changes)  # validates each field now (the checks are per field)
    return _scope(changes)


class in_force:  # noqa: N801  (a context manager used as a function, as contextlib's are)
    """Context manager that puts a :class:`Settings` taken earlier (:func:`current_settings`, on another thread)
    in force on this thread, and restores this thread's on exit: how a backward that autograd runs on a thread
    of its own uses the settings its forward ran with. A class, not a generator: every eager backward of
    ``cudnnkit.torch`` enters one (about a third of a generator context manager's host cost)."""

    __slots__ = ("_s", "_old")

    def __init__(self, s: Settings) -> None:
        self._s = s

    def __enter__(self) -> Settings:
        self._old = _stack.current
        _stack.current = self._s
        return self._s

    def __exit__(self, *exc: object) -> None:
        _stack.current = self._old


@contextmanager
def _scope(changes: dict) -> Iterator[Settings]:
    old = _stack.current
    new = replace(old, **changes)
    _stack.current = new
    try:
        yield new
    finally:
        _stack.current = old


#: items -> the Settings made of them (see :func:`as_items`)
_BY_ITEMS: LRU[tuple, Settings] = LRU("runtime.settings_items", 256)
#: Settings -> its items
_ITEMS: LRU[Settings, tuple] = LRU("runtime.settings_as_items", 256)


def as_items(s: Settings) -> tuple[tuple[str, object], ...]:
    """``s`` as ``((field, value), ...)``, a literal an integration can pass across a boundary where only plain
    values travel (a custom op's keyword string, an XLA attribute); :func:`from_items` makes it a Settings again.
    Cached per Settings (frozen, hashable): integrations call it on every op call."""
    got = _ITEMS.lookup(s)
    if got is MISSING:
        got = _ITEMS.put(s, tuple((f.name, getattr(s, f.name)) for f in fields(s)))
    return got


def from_items(items: tuple) -> Settings:
    """The :class:`Settings` of ``items`` (:func:`as_items`' form; fields left out take their defaults), checked as
    ``Settings(...)`` checks them, one object per items: an integration's backward puts it in force
    (:func:`in_force`) on every call without building and validating a new one."""
    try:
        got = _BY_ITEMS.lookup(items)
    except TypeError:  # an unhashable value: made (and checked) each time
        return Settings(**dict(items))
    if got is MISSING:
        got = _BY_ITEMS.put(items, Settings(**dict(items)))
    return got
