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


# ----------------------------------------------------------------- the library's caches, each an LRU


def test_every_cache_is_an_lru_with_its_bound():
    from cudnnkit.ops import _layout
    from cudnnkit.ops import _rnn_desc as rnn
    from cudnnkit.runtime import arrays, descriptors, handle

    for c, bound in [
        (descriptors._cache.lru, 1024),
        (arrays._layout_cache, 4096),
        (handle._checked, 256),
        (rnn._built, 64),
        (rnn._lengths, 256),
        (_layout._dense.cache, 4096),
        (_layout.fits.cache, 4096),
    ]:
        assert isinstance(c, LRU) and c.maxsize == bound and c.name in cache.stats(), c
    # the reserve ledgers record state, not cached values: not listed, and never cleared with the caches
    assert "rnn.reserves" not in cache.stats() and "dropout.reserve_layouts" not in cache.stats()


def test_descriptor_cache_info_and_clear_caches_empty_every_lru():
    from cudnnkit import runtime
    from cudnnkit.ops import _layout
    from cudnnkit.runtime import arrays, descriptors

    runtime.clear_caches()
    assert descriptors.cache_info() == {"size": 0, "maxsize": 1024, "hits": 0, "misses": 0}
    d = descriptors.tensor_descriptor("float32", (2, 3, 4, 5), (60, 20, 5, 1))
    assert descriptors.tensor_descriptor("float32", (2, 3, 4, 5), (60, 20, 5, 1)) is d  # the fast path's hit
    assert descriptors.tensor_descriptor("float32", [2, 3, 4, 5], [60, 20, 5, 1]) is d  # normalised, then a hit
    assert descriptors.cache_info() == {"size": 1, "maxsize": 1024, "hits": 2, "misses": 1}
    assert arrays.layout_problem((2, 3), (0, 1)) == "is expanded (stride 0 on a dim of size > 1)"
    assert arrays.layout_problem([2, 3], [3, 1]) is None  # unhashable: answered, not cached
    assert arrays._layout_cache.keys() == [((2, 3), (0, 1))]
    assert _layout.fits((2, 3), (3, 1)) and len(_layout.fits.cache) == 1
    runtime.clear_caches()
    assert descriptors.cache_info()["size"] == 0 and len(arrays._layout_cache) == 0 and len(_layout.fits.cache) == 0
    assert d.ptr  # eviction and clearing only drop the cache's reference


def test_reserve_ledgers_survive_clear_caches_and_a_new_forward_replaces_a_record():
    from cudnnkit import runtime
    from cudnnkit.ops import _rnn_desc as rnn
    from cudnnkit.ops import dropout

    led = rnn._Reserves(maxsize=2)
    led.add(0, 0x1000, 64, "standard")
    runtime.clear_caches()
    assert led.entry(0, 0x1000) == (64, "standard") and led.entry(1, 0x1000) is None
    led.add(0, 0x1000, 32, "persist_static")  # a later forward's reserve at the same address, another algorithm
    assert led.entry(0, 0x1000) == (32, "persist_static")
    led.take(0, 0x1000)
    led.take(0, 0x1000)  # taking twice is harmless
    assert led.entry(0, 0x1000) is None
    for p in (1, 2, 3):
        led.add(0, p, 8, "standard")
    assert led.entry(0, 1) is None and led.entry(0, 3) == (8, "standard")  # bounded: the oldest is forgotten
    # a record is a forward's of one config: another config's call at that address (a freed reserve's, reused by
    # an unrelated array) does not read its algorithm (the fuzzer's float64 backward got a float32 one)
    from cudnnkit.ops import RNN

    f32, f64 = RNN("relu", 6, 3, dtype="float32"), RNN("relu", 6, 3, dtype="float64")
    led.add(0, 0x3000, 7, "persist_static_small_h", f32)
    assert led.entry(0, 0x3000, f64) is None and led.entry(0, 0x3000, f32) == (7, "persist_static_small_h")

    lay = dropout._ReserveLayouts(maxsize=2)
    lay.add(0, 0x2000, 16, ((2, 3), (3, 1)))
    runtime.clear_caches()
    assert lay.get(0, 0x2000, 16) == ((2, 3), (3, 1)) and lay.get(0, 0x2000, 8) is None
    lay.add(0, 0x2000, 16, ((3, 2), (1, 3)))
    assert lay.get(0, 0x2000, 16) == ((3, 2), (1, 3))
    assert lay.get(1, 0x2000, 16) is None


def test_register_cache_still_clears_a_cache_that_is_not_an_lru():
    from cudnnkit import runtime
    from cudnnkit.runtime import descriptors

    cleared = []
    descriptors.register_cache(lambda: cleared.append(1))
    try:
        runtime.clear_caches()
        assert cleared == [1]
    finally:
        descriptors._other_caches.pop()
