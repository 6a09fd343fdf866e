"""runtime/cache.py: the one LRU every cache uses."""

from __future__ import annotations

import threading

import pytest

from cudnnkit.runtime import cache
from cudnnkit.runtime.cache import LRU, MISSING, lru


def test_lru_bounds_and_order():
    evicted = []
    c = LRU("t_bounds", maxsize=2, on_evict=lambda k, v: evicted.append(k))
    assert c.get("a", lambda: 1) == 1 and c.get("b", lambda: 2) == 2
    assert c.lookup("a") == 1  # a is now the most recent
    c.get("c", lambda: 3)
    assert evicted == ["b"] and c.keys() == ["a", "c"]
    assert c.lookup("b") is MISSING
    assert c.info() == {"size": 2, "maxsize": 2, "hits": 1, "misses": 3}


def test_lru_none_is_a_value():
    c = LRU("t_none", maxsize=4)
    calls = []
    assert c.get("k", lambda: calls.append(1)) is None
    assert c.get("k", lambda: calls.append(1)) is None
    assert calls == [1]


def test_lru_first_store_wins_across_threads():
    c = LRU("t_threads", maxsize=8)
    barrier = threading.Barrier(8)
    got = []

    def build():
        barrier.wait()
        return object()

    threads = [threading.Thread(target=lambda: got.append(c.get("k", build))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(g) for g in got}) == 1


def test_lru_decorator_and_registry():
    n = []

    @lru("t_memo", maxsize=4)
    def sq(x):
        n.append(x)
        return x * x

    assert sq(3) == 9 and sq(3) == 9 and n == [3]
    assert cache.stats()["t_memo"]["hits"] == 1
    cache.clear_all()
    assert sq(3) == 9 and n == [3, 3]


def test_lru_rejects_a_bad_bound():
    with pytest.raises(ValueError, match="maxsize"):
        LRU("t_bad", maxsize=0)
