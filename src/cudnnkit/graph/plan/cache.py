"""The plan cache: plans of one device keyed by (graph key, filter options), their serialization, and
:func:`load_plan`.

:class:`PlanCache` is a bounded :class:`~cudnnkit.runtime.cache.LRU` of plans with counters, and holds plans
loaded by :meth:`PlanCache.deserialize` as cuDNN JSON until a build asks for their key.
:func:`plan_cache` gives each device's; ``cudnnkit.runtime.clear_caches()`` empties them all.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Mapping
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime import adapters
from ...runtime.cache import LRU, MISSING
from ...runtime.descriptors import register_cache
from ...runtime.handle import get_handle
from ..errors import Attempt, UnsupportedGraphError, refusal, status_reason
from .engines import EngineInfo, engine_info
from .plans import FORMAT, ExecutionPlan, key_digest
from .spec import PlanSpec

__all__ = ["PlanCache", "plan_cache", "load_plan", "check_device", "default_device", "check_device_count"]


class PlanCache:
    """Plans of one device: a bounded LRU keyed by (graph key, filter options), safe to share between threads.

    ``stats`` counts hits, misses, evictions and plans loaded from
    :meth:`deserialize`. Deserialized plans are kept as cuDNN JSON until a
    build asks for their key, then finalized on this device (no GPU is needed
    to load them).
    """

    def __init__(self, device: int, maxsize: int = 512):
        self.device = int(device)
        self._plans: LRU[Any, Any] = LRU(f"graph.plans.cuda:{self.device}", int(maxsize), on_evict=self._evicted)
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self.misses = self.evictions = self.loaded = 0

    @property
    def maxsize(self) -> int:
        return self._plans.maxsize

    @property
    def hits(self) -> int:
        return self._plans.hits

    def _evicted(self, key: Any, plan: Any) -> None:
        self.evictions += 1  # called by the LRU, inside this cache's lock

    def get(self, key: Any) -> Any | None:
        with self._lock:
            plan = self._plans.lookup(key)
            if plan is not MISSING:
                return plan
            self.misses += 1
            return None

    def put(self, key: Any, plan: Any) -> Any:
        """Cache ``plan`` for ``key``, replacing the one cached (autotuning stores the fastest over the built one)."""
        with self._lock:
            self._plans.pop(key)
            self._plans.put(key, plan)
        return plan

    def pop_pending(self, key: Any) -> dict[str, Any] | None:
        """The serialized plan loaded for ``key``, if any (removed from the pending set)."""
        if not self._pending:
            return None
        with self._lock:
            return self._pending.pop(key_digest(key), None)

    def clear(self) -> None:
        """Drop every plan (and every loaded, not yet used, serialized plan); counters restart."""
        with self._lock:
            self._plans.clear()  # its hits too
            self._pending.clear()
            self.misses = self.evictions = self.loaded = 0

    def resize(self, maxsize: int) -> None:
        """Bound the cache to ``maxsize`` plans (at least 1), dropping the least recently used beyond it."""
        maxsize = int(maxsize)
        if maxsize < 1:
            raise ValueError(f"maxsize must be a positive int, got {maxsize!r}")
        with self._lock:
            self._plans.maxsize = maxsize
            for key in self._plans.keys()[: max(len(self._plans) - maxsize, 0)]:
                self._plans.pop(key)
                self.evictions += 1

    def _cached(self) -> list[Any]:
        """Every cached plan, least recently used first, not counted as hits (call with the lock held)."""
        hits = self._plans.hits
        plans = [self._plans.lookup(k) for k in self._plans.keys()]  # in order: the order is kept
        self._plans.hits = hits
        return plans

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "size": len(self._plans),
                "maxsize": self.maxsize,
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "loaded": self.loaded,
                "pending": len(self._pending),
            }

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: Any) -> bool:
        return key in self._plans

    def serialize(self) -> bytes:
        """Every cached plan (and loaded, unused ones) as one UTF-8 JSON document for :meth:`deserialize`."""
        with self._lock:
            plans = self._cached()
            pending = list(self._pending.values())
        entries = [p.to_dict() for p in plans if isinstance(p, ExecutionPlan) and p.key is not None] + pending
        return json.dumps({"format": FORMAT + "-cache", "cudnn_version": lib.version(), "plans": entries}).encode()

    def deserialize(self, data: bytes | str | Mapping[str, Any]) -> int:
        """Load plans saved by :meth:`serialize` (bytes, str or the parsed dict); returns how many.

        Plans from another cuDNN version are skipped. Each is finalized on
        first use (``cudnnBackendFinalize`` of an ``EXECUTION_PLAN`` with
        ``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION`` and the handle); one
        that cuDNN refuses there (another GPU) is rebuilt from heuristics.
        """
        doc = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
        if not str(doc.get("format", "")).startswith(FORMAT):
            raise ValueError(f"not a cudnnkit plan cache (format {doc.get('format')!r})")
        n = 0
        with self._lock:
            for e in doc.get("plans", []):
                if e.get("cudnn_version") != lib.version() or not e.get("key_digest"):
                    continue
                self._pending[e["key_digest"]] = e
                n += 1
            self.loaded += n
        return n


_caches: dict[int, PlanCache] = {}
_caches_lock = threading.Lock()


def check_device(device: Any, name: str = "device") -> int | None:
    """``device`` as a CUDA device ordinal (an int >= 0; NumPy integers too), ``None`` left as is; else a
    ``TypeError``/``ValueError`` naming it. Nothing is asked of a GPU."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"{name} must be a CUDA device ordinal (an int >= 0) or None, got {device!r}")
    try:
        d = operator.index(device)
    except TypeError:
        raise TypeError(
            f"{name} must be a CUDA device ordinal (an int >= 0) or None, got {type(device).__name__} {device!r}"
        ) from None
    if d < 0:
        raise ValueError(f"{name} must be a CUDA device ordinal (an int >= 0) or None, got {d}")
    return d


def default_device() -> int:
    """The current device of the first installed array library (0 when none is installed: building then
    says it needs one); ``RuntimeError`` when that library has no CUDA device (e.g. a CPU build of torch)."""
    ad = adapters.first_available()
    if ad is None:
        return 0
    try:
        return int(ad.current_device())
    except Exception as e:
        raise RuntimeError(
            f"no current CUDA device: {ad.name} could not name one ({type(e).__name__}: {e}); "
            "cudnnkit needs a CUDA build of CuPy or torch and a GPU"
        ) from e


def check_device_count(adapter: Any, device: int) -> None:
    """``device`` must be one ``adapter``'s library sees (asked on a plan-cache miss only, before a handle)."""
    n = adapter.device_count()
    if n == 0:
        raise RuntimeError(f"{adapter.name} sees no CUDA device (a CPU-only build, or no GPU/driver); device={device}")
    if device >= n:
        raise ValueError(f"device={device}, but {adapter.name} sees {n} CUDA device(s): 0 to {n - 1}")


def plan_cache(device: int | None = None) -> PlanCache:
    """The plan cache of ``device`` (default: the current device of the first installed array library)."""
    d = check_device(device)
    d = default_device() if d is None else d
    c = _caches.get(d)
    if c is None:
        with _caches_lock:
            c = _caches.setdefault(d, PlanCache(d))
    return c


def _clear_all() -> None:
    for c in list(_caches.values()):
        c.clear()


register_cache(_clear_all)


def plan_from_json(text: str, handle: Any) -> BackendDescriptor:
    p = BackendDescriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
    p.set("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION", text)
    p.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", handle.ptr)
    return p.finalize()


def plan_engine(desc: BackendDescriptor) -> EngineInfo | None:
    try:
        cfg = desc.get_descriptors("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR", 1)
        return engine_info(cfg[0]) if cfg else None
    except lib.CudnnError:
        return None


def load_plan(data: bytes | str | Mapping[str, Any], device: int | None = None) -> ExecutionPlan:
    """An :class:`ExecutionPlan` from :meth:`ExecutionPlan.serialize` output, finalized on ``device`` now.

    Bind it by uid (or by the Tensors of a graph with the same definition).
    """
    doc = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
    if doc.get("format") != FORMAT:
        raise ValueError(f"not a serialized cudnnkit plan (format {doc.get('format')!r})")
    if doc.get("cudnn_version") != lib.version():
        raise ValueError(f"plan saved with cuDNN {doc.get('cudnn_version')}, loaded cuDNN is {lib.version()}")
    d = check_device(device)
    missing = [k for k in ("plan", "spec") if k not in doc]
    if missing:
        raise ValueError(f"not a complete serialized cudnnkit plan: no {', '.join(missing)}")
    d = default_device() if d is None else d
    ad = adapters.first_available()
    if ad is None:
        raise RuntimeError("loading a plan needs a cuDNN handle, which needs CuPy or torch to select the device")
    check_device_count(ad, d)
    with ad.device_guard(d):
        handle = get_handle(d, ad.current_stream(d), ad)
        try:
            desc = plan_from_json(doc["plan"], handle)
        except lib.CudnnError as e:
            refusal(e)
            raise UnsupportedGraphError(
                f"the serialized plan {doc.get('name', '?')!r} on cuda:{d}",
                [Attempt(str(doc.get("name", "?")), "build", status_reason(e), e.status_name)],
            ) from e
    return ExecutionPlan(desc, PlanSpec.from_dict(doc["spec"], d), key=None, engine=plan_engine(desc), keep=handle)
