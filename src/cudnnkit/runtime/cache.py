"""One bounded, thread-safe LRU for every cache in cudnnkit.

Descriptors by value, graph plans by signature, RNN descriptor sets, layout decisions, op-level plans: each is
an :class:`LRU` (or a function memoized with :func:`lru`). A hit moves the entry to the end and touches nothing
else; a miss builds the value *outside* the lock (builders call cuDNN, which may be slow or re-enter a cache),
and when two threads build the same key at once the first one stored wins, so every caller sees one value.

Every LRU registers itself (weakly) so that :func:`clear_all` empties them together
(``cudnnkit.runtime.clear_caches``), and :func:`stats` reports each one's size, bound, hits and misses.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["LRU", "lru", "clear_all", "stats", "MISSING"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


#: what :meth:`LRU.lookup` answers for a key it does not hold (``None`` may be a cached value)
MISSING: Any = _Missing()

_registry: weakref.WeakSet[LRU] = weakref.WeakSet()
_registry_lock = threading.Lock()


class LRU(Generic[K, V]):
    """A bounded mapping that forgets its least recently used entry first.

    ``name`` names it in :func:`stats`; ``maxsize`` bounds it (``None``: unbounded); ``on_evict(key, value)`` is
    called, outside the lock, for each entry dropped to respect the bound (not for :meth:`clear`); ``register``:
    whether :func:`clear_all` and :func:`stats` see it (False for records of state rather than rebuildable
    values)."""

    __slots__ = ("name", "maxsize", "hits", "misses", "_d", "_lock", "_on_evict", "__weakref__")

    def __init__(
        self,
        name: str,
        maxsize: int | None = 1024,
        on_evict: Callable[[K, V], None] | None = None,
        *,
        register: bool = True,
    ):
        if maxsize is not None and maxsize < 1:
            raise ValueError(f"maxsize must be a positive int or None, got {maxsize!r}")
        self.name, self.maxsize = name, maxsize
        self.hits = self.misses = 0
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._on_evict = on_evict
        if register:  # register=False: a record of state (which reserve came from which call), never cleared
            with _registry_lock:
                _registry.add(self)

    def lookup(self, key: K) -> V:
        """The value for ``key`` (counted as a hit), or :data:`MISSING` (not counted). Never builds."""
        with self._lock:
            try:
                v = self._d[key]
            except KeyError:
                return MISSING
            self._d.move_to_end(key)
            self.hits += 1
            return v

    def peek(self, key: K, default: Any = None) -> Any:
        """The value for ``key`` or ``default``: no lock, no reordering, no counting (one dict read, atomic in
        CPython). For hot paths that only need to know whether an answer is cached (``prepare``'s layout check)."""
        return self._d.get(key, default)

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The value for ``key``, built by ``build()`` on a miss (outside the lock) and stored."""
        v = self.lookup(key)
        if v is not MISSING:
            return v
        value = build()
        return self.put(key, value, count_miss=True)

    def put(self, key: K, value: V, *, count_miss: bool = False) -> V:
        """Store ``value`` unless another thread stored one for ``key`` first; returns the stored one."""
        evicted: list[tuple[K, V]] = []
        with self._lock:
            if count_miss:
                self.misses += 1
            existing = self._d.get(key, MISSING)
            if existing is not MISSING:
                self._d.move_to_end(key)
                return existing
            self._d[key] = value
            if self.maxsize is not None:
                while len(self._d) > self.maxsize:
                    evicted.append(self._d.popitem(last=False))
        if self._on_evict is not None:
            for k, v in evicted:
                self._on_evict(k, v)
        return value

    def pop(self, key: K, default: Any = None) -> Any:
        with self._lock:
            return self._d.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.hits = self.misses = 0

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._d)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())

    def info(self) -> dict[str, Any]:
        return {"size": len(self._d), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses}

    def __repr__(self) -> str:
        return f"<LRU {self.name} {len(self._d)}/{self.maxsize} hits={self.hits} misses={self.misses}>"


def lru(name: str, maxsize: int | None = 1024) -> Callable[[Callable[..., V]], Callable[..., V]]:
    """Memoize a function of hashable positional arguments in an :class:`LRU` (``fn.cache`` is the LRU, and
    ``fn.cache_clear()`` empties it, as with :func:`functools.lru_cache`)."""

    def wrap(fn: Callable[..., V]) -> Callable[..., V]:
        cache: LRU[tuple, V] = LRU(name, maxsize)

        @functools.wraps(fn)
        def memo(*args: Any) -> V:
            v = cache.lookup(args)
            if v is not MISSING:
                return v
            return cache.put(args, fn(*args), count_miss=True)

        memo.cache = cache  # type: ignore[attr-defined]
        memo.cache_clear = cache.clear  # type: ignore[attr-defined]
        return memo

    return wrap


def clear_all() -> None:
    """Empty every live :class:`LRU`."""
    with _registry_lock:
        caches = list(_registry)
    for c in caches:
        c.clear()


def stats() -> dict[str, dict[str, Any]]:
    """``{name: {"size", "maxsize", "hits", "misses"}}`` of every live :class:`LRU` (names made unique)."""
    with _registry_lock:
        caches = sorted(_registry, key=lambda c: c.name)
    out: dict[str, dict[str, Any]] = {}
    for c in caches:
        name, i = c.name, 2
        while name in out:
            name, i = f"{c.name}#{i}", i + 1
        out[name] = c.info()
    return out
