"""Execution plans: a finalized ``CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR`` and how it runs.

:class:`ExecutionPlan` executes on bindings (checked by its :class:`~cudnnkit.graph.plan.spec.PlanSpec`) through a
``CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`` cached by its pointers (an :class:`~cudnnkit.runtime.cache.LRU`),
populates CUDA graphs and serializes itself; :meth:`ExecutionPlan.bind` returns a :class:`BoundPlan`, whose call
is only the handle lookup (and scratch clearing) and ``cudnnBackendExecute``.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import threading
from collections.abc import Mapping
from threading import get_ident as _get_ident
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime.arrays import as_view
from ...runtime.cache import LRU, MISSING
from ...runtime.descriptors import tensor_descriptor
from ...runtime.dtypes import scaling_ref
from ...runtime.handle import get_handle, resolve_stream
from ..errors import Attempt, BindingError, GraphError
from .engines import EngineInfo
from .spec import PlanSpec, Resolved, _scalar_bytes, check_pointer, checked_stream

__all__ = ["ExecutionPlan", "BoundPlan", "FORMAT", "key_digest"]

FORMAT = "cudnnkit.plan/1"


def key_digest(key: Any) -> str:
    """A digest of a plan-cache key without its device (graph key, filter options): saved plans load on
    any device of the same kind."""
    graph_key, _device, options = key
    return hashlib.sha256(repr((graph_key, options)).encode()).hexdigest()


def _graph_ptr(g: Any) -> int:
    """A ``cudaGraph_t`` as an int: an int, or anything ``int()`` turns into the handle (``cuda.bindings``)."""
    if isinstance(g, bool) or g is None:
        raise TypeError(f"graph must be a cudaGraph_t (an int or a cuda.bindings graph), got {g!r}")
    try:
        p = int(g)
    except (TypeError, ValueError):
        raise TypeError(
            f"graph must be a cudaGraph_t (an int or a cuda.bindings graph), got {type(g).__name__}"
        ) from None
    if not 0 < p < 2**64:
        raise ValueError(f"graph must be a cudaGraph_t handle, got {p}")
    return p


def _pack_key(ptrs: list[int], by_value: list[int], ws: int, scalars: bytes) -> tuple:
    """The variant-pack cache key: the device pointers (by-value positions masked: their host buffers are
    fresh per resolve) and workspace, plus the scalar values' bytes."""
    if by_value:
        ptrs = list(ptrs)
        for pos in by_value:
            ptrs[pos] = 0
    return (tuple(ptrs), ws, scalars)


class ExecutionPlan:
    """A finalized ``CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR`` for one graph signature on one device.

    ``name`` is the engine config's tag (``eng<index>_k<knob>=<value>...``),
    ``workspace_size`` the bytes of device workspace it needs (the plan's
    ``CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE``), ``engine`` its
    :class:`EngineInfo`, ``tensors`` the non-virtual tensors (uid -> spec) it
    binds, ``attempts`` the candidates rejected before it, ``timings`` (after
    autotuning) each candidate's name and mean time in ms.
    """

    def __init__(
        self,
        desc: BackendDescriptor,
        spec: PlanSpec,
        *,
        key: tuple | None,
        engine: EngineInfo | None,
        keep: Any = None,
        attempts: list[Attempt] | None = None,
    ):
        self._desc = desc
        self.ptr: int = desc.ptr
        self.spec = spec
        self.device = spec.device
        self.tensors = spec.tensors
        self.key = key
        self.engine = engine
        self.workspace_size = int(desc.get("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE"))
        self.attempts = list(attempts or [])
        self.timings: list[tuple[str, float | str]] = []
        self._keep = keep  # the lowered graph and engine config stay alive with the plan
        #: variant packs by (device pointers, workspace, scalar bytes): a finalized pack takes no new pointers
        self._packs: LRU[tuple, BackendDescriptor] = LRU("graph.variant_packs", 64)
        #: the default workspace and allocated scratch per (array library, stream): {what: (array, pointer)}
        self._buffers: LRU[tuple, dict[Any, tuple[Any, int]]] = LRU("graph.plan_buffers", 8)
        self._lock = threading.Lock()
        self._raw: tuple | None = None  # execute_raw's template (bindable uids, positions, pointers, buffers)

    # ------------------------------------------------------------- properties

    @property
    def name(self) -> str:
        return self.engine.name if self.engine is not None else "eng?"

    @property
    def numerical_notes(self) -> frozenset[str]:
        return self.engine.numerical_notes if self.engine else frozenset()

    @property
    def behavior_notes(self) -> frozenset[str]:
        return self.engine.behavior_notes if self.engine else frozenset()

    @property
    def supports_cuda_graph(self) -> bool:
        """The engine carries ``CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API`` and the loaded cuDNN
        exports ``cudnnBackendPopulateCudaGraph``."""
        if "SUPPORTS_CUDA_GRAPH_NATIVE_API" not in self.behavior_notes:
            return False
        try:
            lib.function("cudnnBackendPopulateCudaGraph")
        except (lib.SymbolNotFoundError, AttributeError):
            return False
        return True

    def __repr__(self) -> str:
        return f"<ExecutionPlan {self.name} cuda:{self.device} workspace={self.workspace_size}>"

    # ------------------------------------------------------------- bindings

    def _stream_and_adapter(self, views: list[Any], stream: Any, unchecked: bool = False) -> tuple[int, Any]:
        """The stream to run on and the bindings' adapter. ``stream=None``: the arrays' library's current
        stream, else (arrays of a library without an adapter) the producer's CAI v3 stream, else the legacy
        default stream 0. A given or producer-named stream is checked (:func:`_stream`) unless ``unchecked``
        and it is a raw int."""
        adapter = next((v.adapter for v in views if v.adapter is not None), None)
        name = "stream"
        if stream is None and adapter is None:
            s = next((v.stream for v in views if v.stream is not None), None)
            if s in (None, 0, 1):  # none named, or the legacy default stream (1 in CAI v3, 0 to cuDNN)
                return 0, None
            stream, name = s, "the bindings' __cuda_array_interface__ stream"
        if unchecked and type(stream) is int:
            return stream, adapter
        return checked_stream(stream, adapter, self.device, name, producer=name != "stream"), adapter

    def _buffer(self, what: Any, nbytes: int, adapter: Any, stream: int) -> tuple[Any, int]:
        """A device buffer kept with the plan per (library, stream): the default workspace and scratch."""
        key = (adapter.name, stream)
        bufs = self._buffers.lookup(key)
        if bufs is not MISSING:
            hit = bufs.get(what)
            if hit is not None:
                return hit
        arr = adapter.empty((nbytes,), "uint8", self.device, None, stream)
        entry = (arr, adapter.view(arr, str(what)).ptr)
        with self._lock:
            self._buffers.put(key, {})[what] = entry  # into the dict stored for key, new or not
        return entry

    def _prepare(self, bindings: Mapping[Any, Any], stream: Any, workspace: Any, unchecked: bool = False):
        """Resolved bindings, stream, adapter, workspace pointer and the owners to keep alive."""
        r = self.spec.resolve(bindings, unchecked=unchecked)
        s, adapter = self._stream_and_adapter(r.views, stream, unchecked)
        owners: list[Any] = []
        for pos, uid in r.scratch:
            if adapter is None:
                raise BindingError(
                    f"{self.spec.labels[uid]} is scratch memory the plan allocates with the bindings' "
                    "library, and they come from none with a cudnnkit adapter: bind it"
                )
            arr, ptr = self._buffer(("scratch", uid), self.spec.nbytes[uid], adapter, s)
            r.ptrs[pos] = ptr
            owners.append(arr)
        need = self.workspace_size
        if workspace is not None:
            if isinstance(workspace, int) and not isinstance(workspace, bool):
                ws = workspace
                # checked even when this plan needs none (NULL is then fine): a bad pointer is refused whichever
                # plan the heuristics pick
                if (need or ws) and not 0 < ws < 2**64:
                    raise BindingError(
                        f"workspace: raw pointer {ws} is not a device pointer (the plan needs {need} bytes)"
                    )
                if ws and not unchecked:
                    check_pointer(ws, max(need, 1), self.device, "workspace")
            else:
                v = as_view(workspace, "workspace")
                if v.nbytes < need:
                    raise BindingError(f"workspace has {v.nbytes} bytes, the plan needs {need}")
                if v.device != self.device:
                    raise BindingError(
                        f"workspace is on cuda:{v.device}, but the plan was built for device={self.device}"
                    )
                ws = v.ptr
            owners.append(workspace)
        elif need == 0:
            ws = 0
        elif adapter is None:
            raise BindingError(
                f"the plan needs {need} bytes of workspace and the bindings come from no library "
                "with a cudnnkit adapter: pass workspace= (an array or a device pointer)"
            )
        else:
            arr, ws = self._buffer("workspace", need, adapter, s)
            owners.append(arr)
        return r, s, adapter, ws, owners

    def _zero_list(self, r: Resolved) -> tuple[tuple[Any, int, Any], ...]:
        """``(descriptor, device pointer, zero value)`` of each scratch tensor to clear before an execution."""
        out = []
        for pos, uid in r.zero:
            t = self.tensors[uid]
            out.append((tensor_descriptor(t.dtype, t.dims, t.strides), r.ptrs[pos], scaling_ref(t.dtype, 0.0)))
        return tuple(out)

    def _variant_pack(self, r: Resolved, ws: int) -> BackendDescriptor:
        """The cached variant pack for these device pointers, workspace and scalar values (a miss builds one
        that keeps this resolve's scalar host buffers alive)."""
        ptrs, keep = r.ptrs, r.keep
        key = _pack_key(ptrs, r.by_value, ws, r.scalars)
        vp = self._packs.lookup(key)
        if vp is MISSING:
            vp = self._packs.put(key, _new_variant_pack(self.spec.uids, ptrs, ws, keep), count_miss=True)
        return vp

    # ------------------------------------------------------------- execution

    def execute(
        self, bindings: Mapping[Any, Any], *, stream: Any = None, workspace: Any = None, unchecked: bool = False
    ) -> None:
        """Run the plan: ``cudnnBackendExecute(handle, plan, variant_pack)``.

        ``bindings`` maps each non-virtual :class:`Tensor` (or its uid) to a
        CUDA array (CuPy, torch, anything with ``__cuda_array_interface__`` or
        ``__dlpack__``) whose shape, strides and dtype match, or to a raw
        device pointer (int); by-value tensors take a Python number (the
        graph's own constants and scratch tensors are bound by the plan).
        Work is queued on ``stream`` (default: the arrays' library's current
        stream). ``workspace`` (array or pointer) defaults to a buffer of the
        arrays' library kept with the plan per stream. Outputs are written
        into their bound arrays. Scratch tensors whose init policy is
        ``"zero"`` (SDPA backward's ``dq`` accumulator), allocated or bound,
        are cleared with ``cudnnSetTensor`` on that stream first.

        Checked before any GPU work: every binding (:meth:`PlanSpec.resolve`), a raw pointer's device and
        allocation size through the driver (each call: for a loop, :meth:`bind` checks once), ``stream=``
        (a live stream, :func:`cudnnkit.runtime.validate_stream`) and a raw ``workspace=`` pointer.
        ``unchecked=True`` trusts raw pointers, raw workspace pointers and raw int streams as given (the
        fast path for callers who manage their own memory; a wrong one is then an illegal memory access
        or a crash, not an exception). Shapes, dtypes and strides of arrays are checked either way.
        """
        r, s, adapter, ws, _owners = self._prepare(bindings, stream, workspace, unchecked)
        vp = self._variant_pack(r, ws)
        zero = self._zero_list(r) if r.zero else ()
        handle = get_handle(self.device, s, adapter)
        if _multi_device(adapter) and adapter.current_device() != self.device:
            with adapter.device_guard(self.device):
                _clear(handle.ptr, zero)
                status = _raw_execute()(handle.ptr, self.ptr, vp.ptr)
        else:
            _clear(handle.ptr, zero)
            status = _raw_execute()(handle.ptr, self.ptr, vp.ptr)
        if status:
            raise lib.errors.error_for(status, "cudnnBackendExecute")

    @property
    def bindable_uids(self) -> tuple[int, ...]:
        """The uids :meth:`execute_raw` takes pointers for, in its order: every non-virtual tensor but the graph's
        own constants and scratch."""
        got = self._raw
        if got is None:
            got = self._raw_template()
        return got[0]

    def _raw_template(self) -> tuple[tuple[int, ...], tuple[int, ...], list[int], list[Any], bytes]:
        """(bindable uids, their positions among ``spec.uids``, the pointer list with the constants' host
        buffers in place, those buffers, the constants' bytes) for :meth:`execute_raw`."""
        with self._lock:
            if self._raw is None:
                if self.spec.scratch:
                    raise GraphError(
                        f"plan {self.name} has scratch tensors: execute_raw takes none (use execute or bind)"
                    )
                uids, pos, ptrs, keep, scalars = [], [], [], [], b""
                for i, uid in enumerate(self.spec.uids):
                    if uid in self.spec.constants:
                        t = self.tensors[uid]
                        raw = _scalar_bytes(self.spec.constants[uid][0], t.dtype, self.spec.labels[uid])
                        buf = ctypes.create_string_buffer(raw, max(len(raw), 8))
                        keep.append(buf)
                        ptrs.append(ctypes.addressof(buf))
                        scalars += raw
                    else:
                        uids.append(uid)
                        pos.append(i)
                        ptrs.append(0)
                self._raw = (tuple(uids), tuple(pos), ptrs, keep, scalars)
            return self._raw

    def execute_raw(self, handle: int, ptrs: list[int], workspace: int) -> None:
        """The trusted fast path the array-level ops run their graph forms with: ``cudnnBackendExecute(handle,
        plan, pack)`` with device pointers ``ptrs`` for :attr:`bindable_uids` (in that order), ``workspace``
        a device pointer to at least :attr:`workspace_size` bytes (0 when it needs none) and ``handle`` a raw
        ``cudnnHandle_t`` already on the stream and device to run on. Nothing is checked: the caller has
        checked its arrays (shape, strides, dtype, device) against the plan's tensors. The variant pack is
        cached per pointer tuple, as :meth:`execute` caches it."""
        uids, pos, base, keep, scalars = self._raw if self._raw is not None else self._raw_template()
        key = (tuple(ptrs), workspace)
        vp = self._packs.lookup(key)
        if vp is MISSING:
            full = list(base)
            for i, p in zip(pos, ptrs):
                full[i] = p
            vp = self._packs.put(key, _new_variant_pack(self.spec.uids, full, workspace, keep), count_miss=True)
        status = _raw_execute()(handle, self.ptr, vp.ptr)
        if status:
            raise lib.errors.error_for(status, "cudnnBackendExecute")

    def bind(
        self, bindings: Mapping[Any, Any], *, workspace: Any = None, stream: Any = None, unchecked: bool = False
    ) -> BoundPlan:
        """Check ``bindings`` once and build their variant pack: the returned :class:`BoundPlan` executes
        with only a handle lookup (scratch clearing where the graph needs it) and ``cudnnBackendExecute``.
        It keeps the arrays (and workspace) alive. Every check of :meth:`execute` (raw pointers through the
        driver, ``stream=``, ``workspace=``) happens here, once; ``unchecked=True`` trusts raw pointers
        and raw int streams, here and for the streams the :class:`BoundPlan` is later called with.

        The default workspace and allocated scratch are the plan's buffers for the bind-time stream
        (``stream``, else the arrays' library's current stream): a :class:`BoundPlan` using any of them
        runs only on that stream (calling it on another raises ``ValueError``); pass ``workspace=`` and
        bind the scratch tensors to run it on any stream."""
        r, s, adapter, ws, owners = self._prepare(bindings, stream, workspace, unchecked)
        own = bool(r.scratch) or (workspace is None and self.workspace_size > 0)
        vp = _new_variant_pack(self.spec.uids, r.ptrs, ws, r.keep)
        owners += [v.owner for v in r.views]
        _raw_execute()
        return BoundPlan(
            self,
            vp,
            owners,
            adapter,
            None if stream is None else s,
            _multi_device(adapter),
            home=s if own else None,
            zero=self._zero_list(r) if r.zero else (),
            checked=s,
            unchecked=unchecked,
        )

    # ------------------------------------------------------------- CUDA graphs

    def _check_cuda_graph(self) -> None:
        try:
            lib.function("cudnnBackendPopulateCudaGraph")
        except (lib.SymbolNotFoundError, AttributeError) as e:
            raise GraphError(f"the loaded cuDNN has no native CUDA-graph API: {e}") from None
        if "SUPPORTS_CUDA_GRAPH_NATIVE_API" not in self.behavior_notes:
            raise GraphError(
                f"engine {self.name} lacks CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API; build "
                "with require_behavior={'SUPPORTS_CUDA_GRAPH_NATIVE_API'} (or capture execute() with "
                "the array library's stream capture instead)"
            )
        if self.spec.zero_scratch:
            names = ", ".join(self.spec.labels[u] for u in sorted(self.spec.zero_scratch))
            raise GraphError(
                f"the graph's scratch {names} must be zeroed before every run, which a graph "
                "populated by cuDNN would not do: capture execute() with the array library's "
                "stream capture instead (it records the clearing)"
            )

    def _graph_call(self, fn_name: str, bindings, graph, workspace) -> BackendDescriptor:
        self._check_cuda_graph()
        gp = _graph_ptr(graph)
        r, s, adapter, ws, owners = self._prepare(bindings, None, workspace)
        vp = _new_variant_pack(self.spec.uids, r.ptrs, ws, r.keep + owners)
        handle = get_handle(self.device, s, adapter)
        lib.function(fn_name)(handle.ptr, self.ptr, vp.ptr, gp)
        return vp

    def populate_cuda_graph(self, bindings: Mapping[Any, Any], graph: Any, *, workspace: Any = None) -> None:
        """``cudnnBackendPopulateCudaGraph``: fill an empty ``cudaGraph_t`` (an int, or a ``cuda.bindings``
        graph) with this plan's work on ``bindings``. The graph holds raw pointers: keep the arrays (and a
        given workspace) alive while it may run; the default workspace lives with the plan."""
        self._graph_vp = self._graph_call("cudnnBackendPopulateCudaGraph", bindings, graph, workspace)

    def update_cuda_graph(self, bindings: Mapping[Any, Any], graph: Any, *, workspace: Any = None) -> None:
        """``cudnnBackendUpdateCudaGraph``: point a graph made by :meth:`populate_cuda_graph` at new arrays."""
        self._graph_vp = self._graph_call("cudnnBackendUpdateCudaGraph", bindings, graph, workspace)

    # ------------------------------------------------------------- serialization

    def json(self) -> str:
        """cuDNN's serialized plan: ``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``."""
        return self._desc.get("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION").decode()

    def to_dict(self) -> dict[str, Any]:
        """The plan and everything needed to execute it again: cuDNN's JSON, the tensors, the key digest."""
        return {
            "format": FORMAT,
            "cudnn_version": lib.version(),
            "key": repr(self.key) if self.key is not None else None,
            "key_digest": key_digest(self.key) if self.key is not None else None,
            "name": self.name,
            "spec": self.spec.to_dict(),
            "plan": self.json(),
        }

    def serialize(self) -> bytes:
        """:meth:`to_dict` as UTF-8 JSON; :func:`load_plan` turns it back into a plan."""
        return json.dumps(self.to_dict()).encode()


class BoundPlan:
    """A plan with its bindings checked and its variant pack built: ``bound()`` runs it.

    ``bound(stream=None)`` calls ``cudnnBackendExecute`` with this thread's
    handle for the plan's device, on ``stream`` (default: the stream given to
    :meth:`ExecutionPlan.bind`, else the arrays' library's current stream),
    after clearing the scratch tensors the graph needs zeroed.

    When it uses the plan's default workspace or allocated scratch (kept per
    stream, for the bind-time stream), it runs only on the stream it was bound
    for: another stream (given, or current when none is given) raises
    ``ValueError`` naming both, since that stream would share those buffers
    with the bind-time stream's work without ordering. Binding with
    ``workspace=`` and every scratch tensor bound lifts the restriction.

    A ``stream`` other than the last one checked is checked once
    (:func:`cudnnkit.runtime.validate_stream`) before it reaches
    ``cudnnSetStream``, unless the plan was bound with ``unchecked=True``;
    the bindings were checked at bind time, so a call does no other check.
    """

    __slots__ = (
        "plan",
        "_vp",
        "_vp_ptr",
        "_plan_ptr",
        "_keep",
        "_adapter",
        "_stream",
        "_multi",
        "_device",
        "_current_stream",
        "_handle",
        "_home",
        "_zero",
        "_checked",
        "_unchecked",
    )

    def __init__(
        self,
        plan: ExecutionPlan,
        vp: BackendDescriptor,
        keep: list[Any],
        adapter: Any,
        stream: int | None,
        multi_device: bool,
        *,
        home: int | None = None,
        zero: tuple[tuple[Any, int, Any], ...] = (),
        checked: int | None = None,
        unchecked: bool = False,
    ):
        self.plan = plan
        self._vp = vp
        self._vp_ptr = ctypes.c_void_p(vp.ptr)
        self._plan_ptr = ctypes.c_void_p(plan.ptr)
        self._keep = keep
        self._adapter = adapter
        self._stream = stream
        self._multi = multi_device
        self._device = plan.device
        self._current_stream = adapter.current_stream if adapter is not None else None
        self._handle = None  # the last thread's handle (handles are per thread)
        self._home = home  # the only stream it may run on (it uses the plan's buffers of that stream), or None
        self._zero = zero  # (descriptor, pointer, zero) of scratch cleared before every run
        self._checked = stream if checked is None else checked  # the last raw stream validated
        self._unchecked = unchecked  # raw int streams are trusted

    def _stream_for(self, stream: Any) -> int:
        if stream is None:
            s = self._stream
            if s is None:
                s = self._current_stream(self._device) if self._current_stream is not None else 0
        elif type(stream) is int:
            s = stream
        else:
            s = resolve_stream(stream, self._adapter, self._device)
        if self._home is not None and s != self._home:
            raise ValueError(
                f"this BoundPlan was bound for stream {self._home:#x} and uses the plan's workspace/"
                f"scratch buffers of that stream; it cannot run on stream {s:#x} (bind again for "
                "that stream, or bind with workspace= and every scratch tensor bound)"
            )
        if stream is not None and s != self._checked and not self._unchecked:
            checked_stream(stream, self._adapter, self._device)  # a stream other than the last checked: checked once
            self._checked = s
        return s

    def __call__(self, stream: Any = None) -> None:
        s = self._stream_for(stream)
        h = self._handle
        if h is None or h.thread != _get_ident():
            h = self._handle = get_handle(self._device, s, self._adapter)
        elif h.stream != s:
            h.set_stream(s)
        if self._multi and self._adapter.current_device() != self._device:
            with self._adapter.device_guard(self._device):
                if self._zero:
                    _clear(h.ptr, self._zero)
                status = _RAW_EXECUTE[0](h.ptr, self._plan_ptr, self._vp_ptr)
        else:
            if self._zero:
                _clear(h.ptr, self._zero)
            status = _RAW_EXECUTE[0](h.ptr, self._plan_ptr, self._vp_ptr)  # made by bind()
        if status:
            raise lib.errors.error_for(status, "cudnnBackendExecute")

    execute = __call__

    def populate_cuda_graph(self, graph: Any) -> None:
        """``cudnnBackendPopulateCudaGraph`` with this binding's variant pack."""
        self.plan._check_cuda_graph()
        h = get_handle(self._device, self._stream or 0, self._adapter)
        lib.function("cudnnBackendPopulateCudaGraph")(h.ptr, self.plan.ptr, self._vp.ptr, _graph_ptr(graph))

    def update_cuda_graph(self, graph: Any) -> None:
        """``cudnnBackendUpdateCudaGraph`` with this binding's variant pack."""
        self.plan._check_cuda_graph()
        h = get_handle(self._device, self._stream or 0, self._adapter)
        lib.function("cudnnBackendUpdateCudaGraph")(h.ptr, self.plan.ptr, self._vp.ptr, _graph_ptr(graph))


_RAW_EXECUTE: list[Any] = []
_DEVICE_COUNTS: dict[str, int] = {}


def _clear(handle: int, zero: tuple[tuple[Any, int, Any], ...]) -> None:
    """``cudnnSetTensor(handle, desc, ptr, 0)`` for each scratch tensor to zero (on the handle's stream)."""
    for desc, ptr, value in zero:
        lib.cudnnSetTensor(handle, desc, ptr, value)


def _multi_device(adapter: Any) -> bool:
    """Whether ``adapter``'s library sees more than one device (asked once): only then can the current
    device differ from a plan's, and only then does execution check it."""
    if adapter is None:
        return False
    n = _DEVICE_COUNTS.get(adapter.name)
    if n is None:
        n = _DEVICE_COUNTS[adapter.name] = adapter.device_count()
    return n > 1


def _raw_execute() -> Any:
    """``cudnnBackendExecute`` as a private ctypes function without the errcheck hook (the fast path checks
    the status itself)."""
    if not _RAW_EXECUTE:
        cdll = lib.load().cdll
        fn = cdll._FuncPtr(("cudnnBackendExecute", cdll))
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        _RAW_EXECUTE.append(fn)
    return _RAW_EXECUTE[0]


def _new_variant_pack(uids: tuple[int, ...], ptrs: list[int], ws: int, keep: list[Any]) -> BackendDescriptor:
    """A finalized ``CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`` (UNIQUE_IDS, DATA_POINTERS, WORKSPACE)."""
    vp = BackendDescriptor("CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR")
    vp.set("CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", list(uids))
    vp.set("CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", list(ptrs))
    vp.set("CUDNN_ATTR_VARIANT_PACK_WORKSPACE", ws or None)
    vp.finalize()
    vp._keep.extend(keep)  # host buffers of by-value scalars
    return vp
