"""Execution plans for :class:`~cudnnkit.graph.Graph`: heuristics, engine filters, plan build, execution.

What :meth:`Graph.build` does, and the cuDNN backend calls it makes:

1. **Lowering** (:meth:`Graph.lower`): finalized tensor, operation and
   ``OPERATIONGRAPH`` descriptors.
2. **Heuristics**: a ``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR`` with the
   operation graph and ``CUDNN_ATTR_ENGINEHEUR_MODE`` from
   ``cudnnkit.settings(heuristic_mode=...)`` (``instant``/``a`` ->
   ``CUDNN_HEUR_MODE_A``, ``b``, ``fallback``); its
   ``CUDNN_ATTR_ENGINEHEUR_RESULTS`` are ``ENGINECFG`` descriptors, best first.
   When no engine of that mode builds, ``CUDNN_HEUR_MODE_FALLBACK`` is asked too.
3. **Engine filters** (:class:`EngineFilter`, a pure function of each engine's
   ``CUDNN_ATTR_ENGINE_NUMERICAL_NOTE``/``BEHAVIOR_NOTE`` and the config's
   ``CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE``):

   * ``settings(deterministic=True)`` rejects ``CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC``;
   * ``settings(allow_tf32=False)`` rejects, for graphs whose convolutions or
     matmuls read float32, ``CUDNN_NUMERICAL_NOTE_TENSOR_CORE`` and
     ``CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS`` (the filter PyTorch applies);
   * ``settings(workspace_limit=n)`` rejects configs (and then plans,
     ``CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE``) needing more than ``n`` bytes;
   * ``deny_numerical=``/``deny_behavior=`` reject any other note (e.g.
     ``deny_behavior={"RUNTIME_COMPILATION"}``), ``require_behavior=`` keeps
     only engines with a note (``{"SUPPORTS_CUDA_GRAPH_NATIVE_API"}``), and
     ``deny_engines=`` rejects engines by name (``"eng0"``) or name prefix.
4. **Support check and plan build**: a ``CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR``
   with ``CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG`` (and the handle), finalized;
   candidates are tried in heuristic order and the first that finalizes wins.
   When none does, :class:`UnsupportedGraphError` lists every engine tried with
   its reason (the filter that rejected it, or cuDNN's status and last error
   text) and names the likely cause (layout, arch, dtype, ...) where the status tells.

Plans are cached per device (:func:`plan_cache`), keyed by :meth:`Graph.key`
(every tensor and operation attribute, alignment, settings, cuDNN version), the
device and the filter options: a new :class:`Graph` with the same definition
hits. :meth:`PlanCache.serialize`/:meth:`PlanCache.deserialize` save and load
plans through ``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION``.

Execution (:meth:`ExecutionPlan.execute`) checks the bindings (every
non-virtual tensor bound; shape, strides, dtype, device and pointer alignment;
a raw pointer's device and allocation size through the CUDA driver) and
``stream=`` (a live CUDA stream of the plan's device) before any GPU work
(``unchecked=True`` trusts raw pointers and raw int streams), builds a ``CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR`` (``UNIQUE_IDS``,
``DATA_POINTERS``, ``WORKSPACE``) cached by its device pointers, workspace and
by-value scalar bytes (a finalized variant pack cannot take new pointers; a hit
reuses the pack and the host buffers of its scalars), clears the scratch
tensors whose :meth:`Graph.scratch_init` is ``"zero"`` (``cudnnSetTensor`` on
the launch stream) and calls ``cudnnBackendExecute``.
:meth:`ExecutionPlan.bind` returns a :class:`BoundPlan` whose call is only the
handle lookup (the scratch clearing, for graphs that need it) and
``cudnnBackendExecute``: its bindings were checked once, at bind time.

A descriptor cuDNN refuses while a graph is lowered, and a graph no engine
config builds, are :class:`UnsupportedGraphError` (a :class:`GraphError`)
naming the tensor, operation or engines, with cuDNN's status and last-error
text; only a missing CUDA driver (:class:`~cudnnkit.lib.DriverNotFoundError`)
and a feature newer than the loaded cuDNN
(:class:`~cudnnkit.lib.FeatureVersionError`) come out as they are.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import operator
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from threading import get_ident as _get_ident
from typing import Any

from .. import lib, runtime
from ..lib.backend import BackendDescriptor
from ..runtime import adapters
from ..runtime.arrays import as_view
from ..runtime.descriptors import register_cache, tensor_descriptor
from ..runtime.dtypes import itemsize as _itemsize
from ..runtime.dtypes import scaling_ref
from ..runtime.handle import get_handle, resolve_stream
from ..runtime.settings import Settings, current_settings
from .graph import Graph, GraphError, Tensor

__all__ = [
    "Attempt",
    "BindingError",
    "BoundPlan",
    "EngineFilter",
    "EngineInfo",
    "ExecutionPlan",
    "PlanCache",
    "PlanSpec",
    "UnsupportedGraphError",
    "autotune",
    "build",
    "execute",
    "load_plan",
    "plan_cache",
    "unsupported_message",
]

_log = logging.getLogger("cudnnkit")

_HEUR_MODES = {
    "instant": "CUDNN_HEUR_MODE_INSTANT",
    "a": "CUDNN_HEUR_MODE_A",
    "b": "CUDNN_HEUR_MODE_B",
    "fallback": "CUDNN_HEUR_MODE_FALLBACK",
}
_NUMERICAL = {
    m.name.removeprefix("CUDNN_NUMERICAL_NOTE_"): m
    for m in lib.cudnnBackendNumericalNote_t
    if not m.name.endswith("TYPE_COUNT")
}
_BEHAVIOR = {
    m.name.removeprefix("CUDNN_BEHAVIOR_NOTE_"): m
    for m in lib.cudnnBackendBehaviorNote_t
    if not m.name.endswith("TYPE_COUNT")
}


# ----------------------------------------------------------------- errors


class BindingError(GraphError):
    """Bindings that do not match the plan: a tensor left unbound, a wrong shape/dtype/device/alignment."""


@dataclass(frozen=True)
class Attempt:
    """One engine config tried for a graph: its name and why it was not used (or ``""`` if it was)."""

    name: str
    stage: str  # "lower", "heuristics", "filter", "build", "execute"
    reason: str
    status: str | None = None  # the CUDNN_STATUS_* name when cuDNN refused


_CAUSES = {
    "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH": "arch: no engine for this graph runs on this GPU's architecture",
    "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT": "layout: the tensors' strides (e.g. NCHW vs NHWC) are not supported "
    "for this graph; try channels-last (NHWC) for convolutions",
    "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE": "dtype: a tensor, intermediate or compute data type is not supported "
    "here (float64 has no graph engines; use the legacy ops)",
    "CUDNN_STATUS_NOT_SUPPORTED_SHAPE": "shape: a dimension or alignment is outside what the engines take",
    "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN": "graph pattern: no engine fuses these operations in this order",
    "CUDNN_STATUS_NOT_SUPPORTED_PADDING": "padding: the convolution/resample padding is not supported",
    "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT": "shared memory: the kernels need more than this GPU has",
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER": "driver: the CUDA driver is too old for this cuDNN",
    "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART": "CUDA runtime: incompatible libcudart",
    "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING": "runtime prerequisite missing (NVRTC for runtime-"
    "compiled engines?)",
    "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE": "a cuDNN sub-library (libcudnn_engines_*) is missing",
}


def unsupported_message(label: str, attempts: Iterable[Attempt]) -> str:
    """The text of :class:`UnsupportedGraphError`: every engine tried (or the descriptor cuDNN refused while
    lowering the graph), then the likely cause."""
    attempts = list(attempts)
    lowered = bool(attempts) and all(a.stage == "lower" for a in attempts)
    if lowered:
        release = ".".join(map(str, lib.version_tuple()))
        lines = [f"cuDNN {release} refused {label} while lowering it (before any engine was asked)"]
    else:
        tried = sum(a.stage not in ("heuristics", "lower") for a in attempts)
        lines = [f"no cuDNN engine supports {label}: {tried} engine config(s) tried"]
    for a in attempts:
        lines.append(f"  {a.name} [{a.stage}]: {a.reason}")
    statuses = [a.status for a in attempts if a.status]
    causes = []
    for s in dict.fromkeys(statuses):
        if s in _CAUSES:
            causes.append(_CAUSES[s])
    if lowered:
        if any(s and s.startswith("CUDNN_STATUS_BAD_PARAM") for s in statuses):
            causes.append("cuDNN rejected a value of the definition (a dim, stride, dtype or parameter)")
        if any(s and s.startswith("CUDNN_STATUS_NOT_SUPPORTED") for s in statuses):
            causes.append(
                "the loaded cuDNN does not offer this operation, mode, parameter or data type in its graph API"
            )
    elif not attempts or all(a.stage == "heuristics" for a in attempts):
        causes.append(
            "heuristics offered no engine for this graph: the pattern, layout (try channels-last "
            "strides) or dtypes are outside what this cuDNN supports on this GPU"
        )
    elif all(a.stage == "filter" for a in attempts):
        causes.append(
            "every engine was rejected by a filter: relax cudnnkit.settings(deterministic=, allow_tf32=, "
            "workspace_limit=) or the build's deny_*/require_* options"
        )
    if causes:
        lines.append("likely cause: " + "; ".join(causes))
    return "\n".join(lines)


class UnsupportedGraphError(GraphError):
    """No engine config passed the filters and built a plan; ``attempts`` lists each one and why."""

    def __init__(self, label: str, attempts: list[Attempt]):
        self.attempts = list(attempts)
        super().__init__(unsupported_message(label, self.attempts))


# ----------------------------------------------------------------- engines and filters


@dataclass(frozen=True)
class EngineInfo:
    """What cuDNN says about one engine config: engine index, knob choices, notes, workspace."""

    global_index: int
    knobs: tuple[tuple[int, int], ...] = ()
    numerical_notes: frozenset[str] = frozenset()
    behavior_notes: frozenset[str] = frozenset()
    workspace: int | None = None  # CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, when cuDNN answered

    @property
    def name(self) -> str:
        """``eng<global index>`` then ``_k<knob type>=<choice>`` per knob (cudnn-frontend's plan tag)."""
        return f"eng{self.global_index}" + "".join(f"_k{t}={v}" for t, v in self.knobs)


def _note_names(notes: Iterable[str], table: dict, what: str) -> frozenset[str]:
    upper = {k.upper(): k for k in table}
    out = set()
    for n in notes:
        key = str(getattr(n, "name", n)).upper()
        for prefix in ("CUDNN_NUMERICAL_NOTE_", "CUDNN_BEHAVIOR_NOTE_"):
            key = key.removeprefix(prefix)
        if key not in upper:
            raise ValueError(f"unknown {what} note {n!r}; one of {sorted(table)}")
        out.add(upper[key])
    return frozenset(out)


@dataclass(frozen=True)
class EngineFilter:
    """Which engines a plan may use. Built from the thread's settings plus the build's options.

    ``fp32_math`` says whether the graph's convolutions/matmuls read float32
    (then ``allow_tf32=False`` rejects tensor-core and down-converting engines).
    """

    deterministic: bool = False
    allow_tf32: bool = True
    workspace_limit: int | None = None
    fp32_math: bool = False
    deny_numerical: frozenset[str] = frozenset()
    deny_behavior: frozenset[str] = frozenset()
    require_behavior: frozenset[str] = frozenset()
    deny_engines: tuple[str, ...] = ()

    @classmethod
    def make(
        cls,
        settings: Settings | None = None,
        *,
        fp32_math: bool = False,
        deny_numerical: Iterable[str] = (),
        deny_behavior: Iterable[str] = (),
        require_behavior: Iterable[str] = (),
        deny_engines: Iterable[str] = (),
    ) -> EngineFilter:
        s = settings or current_settings()
        return cls(
            s.deterministic,
            s.allow_tf32,
            s.workspace_limit,
            bool(fp32_math),
            _note_names(deny_numerical, _NUMERICAL, "numerical"),
            _note_names(deny_behavior, _BEHAVIOR, "behavior"),
            _note_names(require_behavior, _BEHAVIOR, "behavior"),
            tuple(sorted(str(e) for e in deny_engines)),
        )

    def options_key(self) -> tuple:
        """The part of the plan-cache key the settings in :meth:`Graph.key` do not already hold."""
        return (
            tuple(sorted(self.deny_numerical)),
            tuple(sorted(self.deny_behavior)),
            tuple(sorted(self.require_behavior)),
            self.deny_engines,
        )

    def reject(self, info: EngineInfo, workspace: int | None = None) -> str | None:
        """Why ``info`` may not be used (``None``: it may). ``workspace`` overrides ``info.workspace``."""
        num, beh = info.numerical_notes, info.behavior_notes
        if self.deterministic and "NONDETERMINISTIC" in num:
            return "filtered: NONDETERMINISTIC numerical note (settings deterministic=True)"
        if self.fp32_math and not self.allow_tf32:
            for note in ("TENSOR_CORE", "DOWN_CONVERT_INPUTS"):
                if note in num:
                    return f"filtered: {note} numerical note on float32 data (settings allow_tf32=False)"
        for note in sorted(self.deny_numerical & num):
            return f"filtered: {note} numerical note (deny_numerical)"
        for note in sorted(self.deny_behavior & beh):
            return f"filtered: {note} behavior note (deny_behavior)"
        missing = self.require_behavior - beh
        if missing:
            return f"filtered: lacks behavior note {', '.join(sorted(missing))} (require_behavior)"
        name = info.name
        for e in self.deny_engines:
            if name == e or name.startswith(e + "_"):
                return f"filtered: engine {e} denied (deny_engines)"
        ws = info.workspace if workspace is None else workspace
        if self.workspace_limit is not None and ws is not None and ws > self.workspace_limit:
            return f"filtered: workspace {ws} bytes > workspace_limit {self.workspace_limit}"
        return None


def _fp32_math(graph: Graph) -> bool:
    for n in graph._nodes:
        if n.kind in ("matmul", "conv_fprop", "conv_dgrad", "conv_wgrad"):
            if any(graph._tensors[uid].dtype == "float32" for _, uid in n.inputs):
                return True
    return False


def _engine_info(cfg: BackendDescriptor) -> EngineInfo:
    """Read an ENGINECFG's engine (global index, notes) and knob choices."""
    eng = cfg.get_descriptors("CUDNN_ATTR_ENGINECFG_ENGINE", "CUDNN_BACKEND_ENGINE_DESCRIPTOR", 1)[0]
    index = int(eng.get("CUDNN_ATTR_ENGINE_GLOBAL_INDEX"))
    num = eng.get("CUDNN_ATTR_ENGINE_NUMERICAL_NOTE", count=int(lib.CUDNN_NUMERICAL_NOTE_TYPE_COUNT))
    beh = eng.get("CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE", count=int(lib.CUDNN_BEHAVIOR_NOTE_TYPE_COUNT))
    knobs = []
    for k in cfg.get_descriptors(
        "CUDNN_ATTR_ENGINECFG_KNOB_CHOICES", "CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR", int(lib.CUDNN_KNOB_TYPE_COUNTS)
    ):
        knobs.append((int(k.get("CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE")), int(k.get("CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE"))))
    try:
        ws = int(cfg.get("CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE"))
    except lib.CudnnError:
        ws = None

    def names(vals, enum):
        out = set()
        for v in vals:
            try:
                out.add(enum(int(v)).name.split("_NOTE_", 1)[1])
            except ValueError:
                out.add(f"UNKNOWN_{int(v)}")
        return frozenset(out)

    return EngineInfo(
        index, tuple(knobs), names(num, lib.cudnnBackendNumericalNote_t), names(beh, lib.cudnnBackendBehaviorNote_t), ws
    )


def _heuristics(op_graph: BackendDescriptor, mode: str) -> tuple[list[BackendDescriptor], int]:
    """``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR`` -> its ``CUDNN_ATTR_ENGINEHEUR_RESULTS`` engine configs, and
    the count cuDNN reported before handing them out (it hands out only the ones it can finalize)."""
    h = BackendDescriptor("CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR")
    h.set("CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH", op_graph)
    h.set("CUDNN_ATTR_ENGINEHEUR_MODE", getattr(lib, _HEUR_MODES[mode]))
    h.finalize()
    n = ctypes.c_int64()
    lib.cudnnBackendGetAttribute(
        h.ptr, lib.CUDNN_ATTR_ENGINEHEUR_RESULTS, lib.CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, ctypes.byref(n), None
    )
    if n.value <= 0:
        return [], 0
    return h.get_descriptors("CUDNN_ATTR_ENGINEHEUR_RESULTS", "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR", n.value), n.value


def _status_reason(e: lib.CudnnError) -> str:
    return f"{e.status_name}" + (f": {e.last_error}" if e.last_error else "")


def _refusal(e: lib.CudnnError) -> lib.CudnnError:
    """``e`` when it is cuDNN refusing this graph (recorded as an :class:`Attempt`); a missing CUDA driver
    (:class:`~cudnnkit.lib.DriverNotFoundError`) is the machine's state, not the graph's: it is raised as is."""
    if isinstance(e, lib.DriverNotFoundError):
        raise e
    return e


def _candidates(low, flt: EngineFilter, mode: str, attempts: list[Attempt]):
    """Yield (cfg, info) in heuristic order for ``mode``, then FALLBACK; filtered ones go to ``attempts``."""
    seen: set[str] = set()
    modes = [mode] if mode == "fallback" else [mode, "fallback"]
    for m in modes:
        try:
            cfgs, reported = _heuristics(low.op_graph, m)
        except lib.CudnnError as e:
            _refusal(e)
            attempts.append(Attempt(f"heuristics mode {m}", "heuristics", _status_reason(e), e.status_name))
            continue
        if not cfgs:
            why = (
                "returned no engine configs"
                if not reported
                else f"reported {reported} engine configs but handed out none (none supports this graph here)"
            )
            attempts.append(Attempt(f"heuristics mode {m}", "heuristics", why))
        for cfg in cfgs:
            try:
                info = _engine_info(cfg)
            except lib.CudnnError as e:
                _refusal(e)
                attempts.append(Attempt("engine ?", "heuristics", _status_reason(e), e.status_name))
                continue
            if info.name in seen:
                continue
            seen.add(info.name)
            why = flt.reject(info)
            if why:
                attempts.append(Attempt(info.name, "filter", why))
                continue
            yield cfg, info


# ----------------------------------------------------------------- the plan


def _tensor_specs(tensors: Iterable[Tensor]) -> dict[int, Tensor]:
    return {t.uid: t for t in sorted(tensors, key=lambda t: t.uid) if not t.virtual}


_PACK = {
    "float32": "f",
    "float64": "d",
    "float16": "e",
    "int32": "i",
    "int64": "q",
    "int8": "b",
    "uint8": "B",
    "bool": "?",
}


def _scalar_bytes(value: Any, dtype: str, label: str) -> bytes:
    """A by-value tensor's host value in its data type (little-endian, as the GPU reads it).

    ``value``: a Python number or a NumPy scalar (arrays, device or host, are refused: a by-value tensor is
    passed by cuDNN as a host scalar). Integer dtypes take integers within their range, ``bool`` a bool or
    0/1; float dtypes any real number (infinities and NaN too: masks fill with ``-inf``) whose magnitude the
    dtype can hold. Anything else is a :class:`BindingError` naming the tensor."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()  # a NumPy scalar (np.float32(2), np.int64(3), np.bool_(True))
    if not isinstance(value, (int, float)):
        raise BindingError(
            f"{label} is a by-value scalar: bind a Python number, got {type(value).__module__}.{type(value).__name__}"
        )
    fmt = "bf16" if dtype == "bfloat16" else _PACK.get(dtype)
    if fmt is None:
        raise BindingError(f"{label}: by-value scalars of dtype {dtype} are not supported")
    if fmt == "?":
        if value not in (0, 1) or isinstance(value, float):
            raise BindingError(f"{label} is a bool by-value scalar: bind True/False (or 0/1), got {value!r}")
        return struct.pack("<?", bool(value))
    if isinstance(value, bool):
        raise BindingError(f"{label} is a {dtype} by-value scalar: bind a number, not the bool {value!r}")
    if fmt in "bBiq":
        if not isinstance(value, int):
            raise BindingError(f"{label} is a {dtype} by-value scalar: bind an int, got {value!r}")
        try:
            return struct.pack("<" + fmt, value)
        except struct.error:
            raise BindingError(f"{label}: {value} does not fit the {dtype} by-value scalar") from None
    try:
        return _bfloat16_bytes(float(value)) if fmt == "bf16" else struct.pack("<" + fmt, float(value))
    except OverflowError:
        raise BindingError(f"{label}: {value!r} is outside the range of the {dtype} by-value scalar") from None


def _bfloat16_bytes(value: float) -> bytes:
    """``value`` as a little-endian bfloat16, rounded to nearest even (what a float -> bfloat16 conversion on
    the GPU does); NaN stays a quiet NaN of its sign, overflow rounds to infinity."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    if value != value:  # NaN: keep the sign, force a quiet-NaN mantissa bit (truncation could make it inf)
        return struct.pack("<H", (bits >> 16) | 0x0040)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def _extent_bytes(t: Tensor) -> int:
    return (1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))) * _itemsize(t.dtype)


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


@dataclass
class _Resolved:
    ptrs: list[int]  # in uid order; 0 where a scratch buffer is still to be allocated
    scalars: bytes  # every by-value scalar's bytes, part of the variant-pack key
    views: list[Any]
    keep: list[Any]  # host buffers of by-value scalars
    scratch: list[tuple[int, int]]  # (position, uid) of unbound scratch tensors
    by_value: list[int]  # positions of by-value scalars (host buffer addresses, not part of the pack key)
    zero: list[tuple[int, int]]  # (position, uid) of scratch tensors to clear before every execution


def _pack_key(ptrs: list[int], by_value: list[int], ws: int, scalars: bytes) -> tuple:
    """The variant-pack cache key: the device pointers (by-value positions masked: their host buffers are
    fresh per resolve) and workspace, plus the scalar values' bytes."""
    if by_value:
        ptrs = list(ptrs)
        for pos in by_value:
            ptrs[pos] = 0
    return (tuple(ptrs), ws, scalars)


class PlanSpec:
    """What a plan binds, in pure Python: non-virtual tensors (uid -> :class:`Tensor`), by-value
    constants fixed by the graph, scratch tensors the executor may allocate (``scratch``: uids, or
    ``{uid: "zero" | None}`` with each one's init policy; ``zero_scratch`` those cleared before every
    execution), output uids, pointer alignment and device. :meth:`resolve` checks bindings against it
    before any GPU work."""

    def __init__(
        self,
        tensors: dict[int, Tensor],
        *,
        device: int,
        alignment: int,
        outputs: Iterable[int] = (),
        constants: Mapping[int, tuple[Any, str]] | None = None,
        scratch: Iterable[int] | Mapping[int, str | None] = (),
    ):
        self.tensors = dict(sorted(tensors.items()))
        self.device = int(device)
        self.alignment = int(alignment)
        self.outputs = frozenset(outputs)
        self.constants = dict(constants or {})
        init = {int(u): p for u, p in scratch.items()} if isinstance(scratch, Mapping) else dict.fromkeys(scratch)
        bad = {p for p in init.values() if p not in (None, "zero")}
        if bad:
            raise ValueError(f"scratch init policies must be None or 'zero', got {sorted(map(repr, bad))}")
        self.scratch = frozenset(init)
        self.zero_scratch = frozenset(u for u, p in init.items() if p == "zero")
        self.uids = tuple(self.tensors)
        self.labels = {u: f"tensor {t.name or '?'} (uid {u})" for u, t in self.tensors.items()}
        #: the bytes each tensor's dims and strides address from its pointer (what a raw pointer must hold)
        self.nbytes = {u: _extent_bytes(t) for u, t in self.tensors.items() if not t.by_value}

    @classmethod
    def of(cls, graph: Graph, device: int) -> PlanSpec:
        produced = {uid for n in graph._nodes for _, uid in n.outputs}
        tensors = _tensor_specs(graph.tensors())
        constants = graph.constants() if hasattr(graph, "constants") else {}
        scratch = graph.scratch_init()
        return cls(
            tensors,
            device=device,
            alignment=graph.alignment,
            outputs=[u for u in tensors if u in produced],
            constants=constants,
            scratch=scratch,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "alignment": self.alignment,
            "outputs": sorted(self.outputs),
            "scratch": sorted(self.scratch),
            "zero_scratch": sorted(self.zero_scratch),
            "constants": [[u, v, dt] for u, (v, dt) in sorted(self.constants.items())],
            "tensors": [
                [t.uid, list(t.dims), list(t.strides), t.dtype, t.by_value, t.name] for t in self.tensors.values()
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], device: int) -> PlanSpec:
        tensors = {
            int(u): Tensor(int(u), tuple(dm), tuple(st), dt, False, bool(bv), nm, 0)
            for u, dm, st, dt, bv, nm in d["tensors"]
        }
        zero = {int(u) for u in d.get("zero_scratch", ())}
        scratch = {int(u): ("zero" if int(u) in zero else None) for u in d.get("scratch", ())}
        return cls(
            tensors,
            device=device,
            alignment=int(d["alignment"]),
            outputs=d.get("outputs", ()),
            constants={int(u): (v, dt) for u, v, dt in d.get("constants", ())},
            scratch=scratch,
        )

    def _uid_of(self, k: Any) -> int:
        if isinstance(k, Tensor):
            spec = self.tensors.get(k.uid)
            if spec is not None and (spec.dims, spec.strides, spec.dtype) != (k.dims, k.strides, k.dtype):
                raise BindingError(
                    f"binding key uid {k.uid} is {k.dims}/{k.dtype} but the plan's "
                    f"{self.labels[k.uid]} is {spec.dims}/{spec.dtype}: a tensor of another graph?"
                )
            uid = k.uid
        elif isinstance(k, int) and not isinstance(k, bool):
            uid = k
        else:
            raise TypeError(f"binding keys must be Tensors or int uids, got {type(k).__name__}")
        if uid not in self.tensors:
            what = f"tensor {k.name or '?'} (uid {uid})" if isinstance(k, Tensor) else f"uid {uid}"
            if isinstance(k, Tensor) and k.virtual:
                raise BindingError(
                    f"{what} is virtual (an intermediate of the graph): it takes no binding; "
                    "mark_output() it to bind it"
                )
            raise BindingError(
                f"{what} is not a non-virtual tensor of this plan (bindable: "
                f"{[self.labels[u] for u in self.uids if u not in self.constants]})"
            )
        if uid in self.constants:
            raise BindingError(
                f"{self.labels[uid]} is a constant of the graph (value {self.constants[uid][0]}); "
                "it is bound by the plan, not by the caller"
            )
        return uid

    def resolve(self, bindings: Mapping[Any, Any], *, unchecked: bool = False) -> _Resolved:
        """Check ``bindings`` (shape, strides, dtype, device, alignment, nothing missing, unknown or bound
        twice) before any GPU work.

        A raw pointer (int) must be a device pointer of the plan's device whose allocation holds the bytes
        the tensor's dims and strides address from it (:func:`cudnnkit.runtime.check_device_pointer`, which
        asks the driver: ``cuPointerGetAttributes``, memory type, device and allocation range), asked after
        every host-side check; ``unchecked=True`` trusts raw pointers (only NULL, out-of-range and
        misaligned ones are refused). Arrays carry their own extent: their shape and strides must be the
        tensor's, so they cover what it addresses."""
        if not isinstance(bindings, Mapping):
            raise TypeError(f"bindings must be a mapping of Tensor (or uid) -> array, got {type(bindings).__name__}")
        by_uid = {self._uid_of(k): v for k, v in bindings.items()}
        if len(by_uid) != len(bindings):
            seen: set[int] = set()
            for k in bindings:
                uid = self._uid_of(k)
                if uid in seen:
                    raise BindingError(f"{self.labels[uid]} is bound twice (by its Tensor and by its uid)")
                seen.add(uid)
        missing = [
            self.labels[u] for u in self.uids if u not in by_uid and u not in self.constants and u not in self.scratch
        ]
        if missing:
            raise BindingError(f"unbound: {', '.join(missing)}; every non-virtual tensor needs an array or pointer")
        r = _Resolved([], b"", [], [], [], [], [])
        to_check: list[tuple[int, int, str]] = []  # (pointer, bytes addressed, label) of raw pointers
        for uid in self.uids:
            spec, label = self.tensors[uid], self.labels[uid]
            if uid in self.zero_scratch:
                r.zero.append((len(r.ptrs), uid))
            if spec.by_value:
                value = self.constants[uid][0] if uid in self.constants else by_uid[uid]
                raw = _scalar_bytes(value, spec.dtype, label)
                buf = ctypes.create_string_buffer(raw, max(len(raw), 8))
                r.keep.append(buf)
                r.by_value.append(len(r.ptrs))
                r.ptrs.append(ctypes.addressof(buf))
                r.scalars += raw
                continue
            if uid not in by_uid:  # scratch the executor allocates
                r.scratch.append((len(r.ptrs), uid))
                r.ptrs.append(0)
                continue
            v = by_uid[uid]
            if isinstance(v, int) and not isinstance(v, bool):
                if not 0 < v < 2**64:
                    raise BindingError(f"{label}: raw pointer {v} is not a device pointer")
                p = v
                if not unchecked:
                    to_check.append((p, self.nbytes[uid], label))
            else:
                view = as_view(v, label)
                if view.dtype != spec.dtype:
                    raise BindingError(f"{label}: dtype {view.dtype}, the plan expects {spec.dtype}")
                if view.shape != spec.dims:
                    raise BindingError(f"{label}: shape {view.shape}, the plan expects {spec.dims}")
                if view.strides != spec.strides and any(
                    a != b for d, a, b in zip(spec.dims, view.strides, spec.strides) if d != 1
                ):
                    raise BindingError(
                        f"{label}: strides {view.strides}, the plan expects {spec.strides} "
                        "(make the array match, e.g. channels-last, or define the graph from it)"
                    )
                if view.device != self.device:
                    raise BindingError(f"{label}: on cuda:{view.device}, the plan is for cuda:{self.device}")
                if view.readonly and uid in self.outputs:
                    raise BindingError(f"{label}: read-only array bound to an output")
                p = view.ptr
                r.views.append(view)
            if p % self.alignment:
                raise BindingError(
                    f"{label}: pointer {p:#x} is not aligned to {self.alignment} bytes (the graph's alignment=)"
                )
            r.ptrs.append(p)
        for p, nbytes, label in to_check:  # the driver's answers, after every host-side check
            _check_pointer(p, nbytes, self.device, label)
        return r


def _check_pointer(ptr: int, nbytes: int, device: int, label: str) -> None:
    """:func:`cudnnkit.runtime.check_device_pointer`, its ``ValueError`` as a :class:`BindingError`."""
    try:
        runtime.check_device_pointer(ptr, nbytes, device, label)
    except BindingError:
        raise
    except ValueError as e:
        msg = str(e)
        if "cannot be checked" in msg:
            msg += "; unchecked=True trusts raw pointers as given"
        raise BindingError(msg) from e


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
        self._packs: OrderedDict[tuple, BackendDescriptor] = OrderedDict()
        self._max_packs = 64
        self._buffers: OrderedDict[tuple, dict[Any, tuple[Any, int]]] = OrderedDict()
        self._lock = threading.Lock()

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
        return _stream(stream, adapter, self.device, name, producer=name != "stream"), adapter

    def _buffer(self, what: Any, nbytes: int, adapter: Any, stream: int) -> tuple[Any, int]:
        """A device buffer kept with the plan per (library, stream): the default workspace and scratch."""
        key = (adapter.name, stream)
        with self._lock:
            bufs = self._buffers.get(key)
            if bufs is not None:
                self._buffers.move_to_end(key)
                hit = bufs.get(what)
                if hit is not None:
                    return hit
        arr = adapter.empty((nbytes,), "uint8", self.device, None, stream)
        entry = (arr, adapter.view(arr, str(what)).ptr)
        with self._lock:
            self._buffers.setdefault(key, {})[what] = entry
            while len(self._buffers) > 8:
                self._buffers.popitem(last=False)
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
                    _check_pointer(ws, max(need, 1), self.device, "workspace")
            else:
                v = as_view(workspace, "workspace")
                if v.nbytes < need:
                    raise BindingError(f"workspace has {v.nbytes} bytes, the plan needs {need}")
                if v.device != self.device:
                    raise BindingError(f"workspace is on cuda:{v.device}, the plan is for cuda:{self.device}")
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

    def _zero_list(self, r: _Resolved) -> tuple[tuple[Any, int, Any], ...]:
        """``(descriptor, device pointer, zero value)`` of each scratch tensor to clear before an execution."""
        out = []
        for pos, uid in r.zero:
            t = self.tensors[uid]
            out.append((tensor_descriptor(t.dtype, t.dims, t.strides), r.ptrs[pos], scaling_ref(t.dtype, 0.0)))
        return tuple(out)

    def _variant_pack(self, r: _Resolved, ws: int) -> BackendDescriptor:
        """The cached variant pack for these device pointers, workspace and scalar values (a miss builds one
        that keeps this resolve's scalar host buffers alive)."""
        ptrs, keep = r.ptrs, r.keep
        key = _pack_key(ptrs, r.by_value, ws, r.scalars)
        with self._lock:
            vp = self._packs.get(key)
            if vp is not None:
                self._packs.move_to_end(key)
                return vp
        vp = _new_variant_pack(self.spec.uids, ptrs, ws, keep)
        with self._lock:
            self._packs[key] = vp
            while len(self._packs) > self._max_packs:
                self._packs.popitem(last=False)
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
            "format": _FORMAT,
            "cudnn_version": lib.version(),
            "key": repr(self.key) if self.key is not None else None,
            "key_digest": _digest(self.key) if self.key is not None else None,
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
            _stream(stream, self._adapter, self._device)  # a stream other than the last checked: checked once
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


def _stream(stream: Any, adapter: Any, device: int, name: str = "stream", producer: bool = False) -> int:
    """``stream=`` as a ``cudaStream_t``: ``None`` is the library's current stream (0 without a library);
    anything else (an int, a CuPy/torch/``__cuda_stream__`` stream) must be a live CUDA stream
    (:func:`cudnnkit.runtime.validate_stream`: ``TypeError``/``ValueError`` naming ``stream``) before
    ``cudnnSetStream`` sees it (an arbitrary int there crashes the process)."""
    return runtime.validate_stream(stream, adapter, device, name, producer=producer)


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


# ----------------------------------------------------------------- the plan cache

_FORMAT = "cudnnkit.plan/1"


def _digest(key: Any) -> str:
    """A digest of a plan-cache key without its device (graph key, filter options): saved plans load on
    any device of the same kind."""
    graph_key, _device, options = key
    return hashlib.sha256(repr((graph_key, options)).encode()).hexdigest()


class PlanCache:
    """Plans of one device: a bounded LRU keyed by (graph key, filter options), safe to share between threads.

    ``stats`` counts hits, misses, evictions and plans loaded from
    :meth:`deserialize`. Deserialized plans are kept as cuDNN JSON until a
    build asks for their key, then finalized on this device (no GPU is needed
    to load them).
    """

    def __init__(self, device: int, maxsize: int = 512):
        self.device = int(device)
        self.maxsize = int(maxsize)
        self._plans: OrderedDict[Any, Any] = OrderedDict()
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self.hits = self.misses = self.evictions = self.loaded = 0

    def get(self, key: Any) -> Any | None:
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return plan
            self.misses += 1
            return None

    def put(self, key: Any, plan: Any) -> Any:
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            while len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
                self.evictions += 1
        return plan

    def pop_pending(self, key: Any) -> dict[str, Any] | None:
        """The serialized plan loaded for ``key``, if any (removed from the pending set)."""
        if not self._pending:
            return None
        with self._lock:
            return self._pending.pop(_digest(key), None)

    def clear(self) -> None:
        """Drop every plan (and every loaded, not yet used, serialized plan); counters restart."""
        with self._lock:
            self._plans.clear()
            self._pending.clear()
            self.hits = self.misses = self.evictions = self.loaded = 0

    def resize(self, maxsize: int) -> None:
        with self._lock:
            self.maxsize = int(maxsize)
            while len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
                self.evictions += 1

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
            plans = list(self._plans.values())
            pending = list(self._pending.values())
        entries = [p.to_dict() for p in plans if isinstance(p, ExecutionPlan) and p.key is not None] + pending
        return json.dumps({"format": _FORMAT + "-cache", "cudnn_version": lib.version(), "plans": entries}).encode()

    def deserialize(self, data: bytes | str | Mapping[str, Any]) -> int:
        """Load plans saved by :meth:`serialize` (bytes, str or the parsed dict); returns how many.

        Plans from another cuDNN version are skipped. Each is finalized on
        first use (``cudnnBackendFinalize`` of an ``EXECUTION_PLAN`` with
        ``CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION`` and the handle); one
        that cuDNN refuses there (another GPU) is rebuilt from heuristics.
        """
        doc = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
        if not str(doc.get("format", "")).startswith(_FORMAT):
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


def _check_device(device: Any, name: str = "device") -> int | None:
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


def _default_device() -> int:
    """The current device of the first installed array library (0 when none is installed: building then
    says it needs one); ``RuntimeError`` when that library has no CUDA device (e.g. a CPU build of torch)."""
    avail = adapters.available()
    if not avail:
        return 0
    ad = avail[0]
    try:
        return int(ad.current_device())
    except Exception as e:
        raise RuntimeError(
            f"no current CUDA device: {ad.name} could not name one ({type(e).__name__}: {e}); "
            "cudnnkit needs a CUDA build of CuPy or torch and a GPU"
        ) from e


def _check_device_count(adapter: Any, device: int) -> None:
    """``device`` must be one ``adapter``'s library sees (asked on a plan-cache miss only, before a handle)."""
    n = adapter.device_count()
    if n == 0:
        raise RuntimeError(f"{adapter.name} sees no CUDA device (a CPU-only build, or no GPU/driver); device={device}")
    if device >= n:
        raise ValueError(f"device={device}, but {adapter.name} sees {n} CUDA device(s): 0 to {n - 1}")


def plan_cache(device: int | None = None) -> PlanCache:
    """The plan cache of ``device`` (default: the current device of the first installed array library)."""
    d = _check_device(device)
    d = _default_device() if d is None else d
    c = _caches.get(d)
    if c is None:
        with _caches_lock:
            c = _caches.setdefault(d, PlanCache(d))
    return c


def _clear_all() -> None:
    for c in list(_caches.values()):
        c.clear()


register_cache(_clear_all)


# ----------------------------------------------------------------- build


@dataclass
class _Context:
    graph: Graph
    device: int
    flt: EngineFilter
    key: tuple
    settings: Settings
    label: str
    spec: PlanSpec
    adapter: Any = None
    handle: Any = None


_OPTIONS = ("deny_numerical", "deny_behavior", "require_behavior", "deny_engines")
_NO_OPTIONS_KEY = EngineFilter().options_key()


def _key(graph: Graph, device: int | None, options: dict[str, Any]) -> tuple:
    """The plan-cache key: (graph key, device, filter options), without validating the graph (a hit skips that)."""
    if not isinstance(graph, Graph):
        raise TypeError(f"expected a Graph, got {type(graph).__name__}")
    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise TypeError(f"unknown build option(s) {sorted(unknown)}; known: {', '.join(_OPTIONS)}")
    opts = EngineFilter.make(Settings(), **options).options_key() if options else _NO_OPTIONS_KEY
    d = _check_device(device)
    gkey = graph.key()
    if d is None:
        try:
            d = _default_device()
        except RuntimeError:
            graph.validate()  # a graph's own errors come before the machine's (no plan of it can be cached)
            raise
    return (gkey, d, opts)


def _context(graph: Graph, device: int | None, options: dict[str, Any]) -> _Context:
    key = _key(graph, device, options)
    bad = graph.known_bad_engines()  # engines measured to compute this graph wrong (part of the graph's key)
    if bad:
        options = {**options, "deny_engines": (*options.get("deny_engines", ()), *bad)}
    graph.validate()
    s = current_settings()
    flt = EngineFilter.make(s, fp32_math=_fp32_math(graph), **options)
    d = key[1]
    return _Context(graph, d, flt, key, s, graph._label(), PlanSpec.of(graph, d))


def _device_env(ctx: _Context):
    avail = adapters.available()
    if not avail:
        raise RuntimeError("building a plan needs a cuDNN handle, which needs CuPy or torch to select the device")
    ctx.adapter = avail[0]
    _check_device_count(ctx.adapter, ctx.device)
    ctx.handle = get_handle(ctx.device, ctx.adapter.current_stream(ctx.device), ctx.adapter)
    return ctx.adapter.device_guard(ctx.device)


def _finalize_plan(cfg: BackendDescriptor, handle: Any) -> BackendDescriptor:
    p = BackendDescriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
    p.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", handle.ptr)
    p.set("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", cfg)
    return p.finalize()


def _plan_from(
    ctx: _Context, desc: BackendDescriptor, info: EngineInfo | None, keep: Any, attempts: list[Attempt]
) -> ExecutionPlan:
    # the plan keeps the handle it was finalized with (the building thread's): a thread's handles are destroyed
    # when it ends, and a cached plan may outlive that thread
    return ExecutionPlan(desc, ctx.spec, key=ctx.key, engine=info, keep=(keep, ctx.handle), attempts=attempts)


def _iter_plans(ctx: _Context, attempts: list[Attempt]):
    """Lower the graph and yield each candidate that finalizes into a plan (filtered in order).

    A descriptor cuDNN refuses while lowering raises :class:`UnsupportedGraphError` (:meth:`Graph.lower`);
    an engine config it refuses is an :class:`Attempt`."""
    low = ctx.graph.lower(ctx.handle.ptr)
    for cfg, info in _candidates(low, ctx.flt, ctx.settings.heuristic_mode, attempts):
        try:
            desc = _finalize_plan(cfg, ctx.handle)
            plan = _plan_from(ctx, desc, info, (low, cfg), attempts)
        except lib.CudnnError as e:
            _refusal(e)
            attempts.append(Attempt(info.name, "build", _status_reason(e), e.status_name))
            continue
        why = ctx.flt.reject(info, plan.workspace_size)
        if why:
            attempts.append(Attempt(info.name, "filter", why))
            continue
        yield plan


def _load_pending(ctx: _Context, cache: PlanCache) -> ExecutionPlan | None:
    entry = cache.pop_pending(ctx.key)
    if entry is None:
        return None
    try:
        desc = _plan_from_json(entry["plan"], ctx.handle)
    except lib.CudnnError as e:
        _log.debug("serialized plan for %s refused (%s); building from heuristics", ctx.label, e)
        return None
    return _plan_from(ctx, desc, _plan_engine(desc), None, [])


def build(graph: Graph, device: int | None = None, **options: Any) -> ExecutionPlan:
    """The plan for ``graph`` on ``device`` (default: the current device), from the cache when it holds one.

    On a miss: loaded serialized plan if one matches, else lowering,
    heuristics (``settings.heuristic_mode``, then FALLBACK), filters and the
    first candidate that finalizes. ``options``: ``deny_numerical``,
    ``deny_behavior``, ``require_behavior`` (note names such as
    ``"RUNTIME_COMPILATION"``), ``deny_engines`` (names such as ``"eng0"``).
    Raises :class:`UnsupportedGraphError` when no engine works.
    """
    key = _key(graph, device, options)
    cache = plan_cache(key[1])
    plan = cache.get(key)
    if plan is not None:
        return plan
    return _build_miss(graph, key, cache, options)


def _build_miss(graph: Graph, key: tuple, cache: PlanCache, options: dict[str, Any]) -> ExecutionPlan:
    """:func:`build` after a plan-cache miss for ``key``."""
    ctx = _context(graph, key[1], options)
    with _device_env(ctx):
        plan = _load_pending(ctx, cache)
        if plan is None:
            attempts: list[Attempt] = []
            plan = next(_iter_plans(ctx, attempts), None)
            if plan is None:
                raise UnsupportedGraphError(ctx.label, attempts)
    _log.debug("built plan %s for %s (workspace %d)", plan.name, ctx.label, plan.workspace_size)
    return cache.put(ctx.key, plan)


def _plan_from_json(text: str, handle: Any) -> BackendDescriptor:
    p = BackendDescriptor("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR")
    p.set("CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION", text)
    p.set("CUDNN_ATTR_EXECUTION_PLAN_HANDLE", handle.ptr)
    return p.finalize()


def _plan_engine(desc: BackendDescriptor) -> EngineInfo | None:
    try:
        cfg = desc.get_descriptors("CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG", "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR", 1)
        return _engine_info(cfg[0]) if cfg else None
    except lib.CudnnError:
        return None


def load_plan(data: bytes | str | Mapping[str, Any], device: int | None = None) -> ExecutionPlan:
    """An :class:`ExecutionPlan` from :meth:`ExecutionPlan.serialize` output, finalized on ``device`` now.

    Bind it by uid (or by the Tensors of a graph with the same definition).
    """
    doc = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
    if doc.get("format") != _FORMAT:
        raise ValueError(f"not a serialized cudnnkit plan (format {doc.get('format')!r})")
    if doc.get("cudnn_version") != lib.version():
        raise ValueError(f"plan saved with cuDNN {doc.get('cudnn_version')}, loaded cuDNN is {lib.version()}")
    d = _check_device(device)
    missing = [k for k in ("plan", "spec") if k not in doc]
    if missing:
        raise ValueError(f"not a complete serialized cudnnkit plan: no {', '.join(missing)}")
    d = _default_device() if d is None else d
    avail = adapters.available()
    if not avail:
        raise RuntimeError("loading a plan needs a cuDNN handle, which needs CuPy or torch to select the device")
    ad = avail[0]
    _check_device_count(ad, d)
    with ad.device_guard(d):
        handle = get_handle(d, ad.current_stream(d), ad)
        try:
            desc = _plan_from_json(doc["plan"], handle)
        except lib.CudnnError as e:
            _refusal(e)
            raise UnsupportedGraphError(
                f"the serialized plan {doc.get('name', '?')!r} on cuda:{d}",
                [Attempt(str(doc.get("name", "?")), "build", _status_reason(e), e.status_name)],
            ) from e
    return ExecutionPlan(desc, PlanSpec.from_dict(doc["spec"], d), key=None, engine=_plan_engine(desc), keep=handle)


# ----------------------------------------------------------------- execution and autotuning


def _bindings_device(bindings: Mapping[Any, Any]) -> int | None:
    if not isinstance(bindings, Mapping):
        return None  # PlanSpec.resolve says what bindings must be
    for k, v in bindings.items():
        if isinstance(v, (int, float, bool)):
            continue
        t = k if isinstance(k, Tensor) else None
        if t is not None and t.by_value:
            continue
        try:
            return as_view(v, "binding").device
        except (TypeError, ValueError):
            return None
    return None


def execute(
    graph: Graph,
    bindings: Mapping[Any, Any],
    *,
    stream: Any = None,
    workspace: Any = None,
    unchecked: bool = False,
    **options: Any,
) -> ExecutionPlan:
    """Build (cached) and run ``graph`` on ``bindings``; returns the plan used.

    On a plan-cache miss the bindings are checked against the graph (as
    :meth:`ExecutionPlan.execute` checks them) before anything is built.
    Under ``settings(autotune="exhaustive")`` a miss autotunes on these
    bindings first (outputs are overwritten several times, so inputs must not
    alias outputs). ``unchecked``: see :meth:`ExecutionPlan.execute`. For a
    loop, keep the plan, or better ``plan.bind(...)``: this path recomputes
    the graph key every call.
    """
    device = _bindings_device(bindings)
    key = _key(graph, device, options)
    cache = plan_cache(key[1])
    plan = cache.get(key)
    if plan is None:
        graph.validate()
        PlanSpec.of(graph, key[1]).resolve(bindings, unchecked=unchecked)  # bad bindings before any build
        if current_settings().autotune == "exhaustive":
            plan = autotune(
                graph, bindings, device=key[1], stream=stream, workspace=workspace, unchecked=unchecked, **options
            )
        else:
            plan = _build_miss(graph, key, cache, options)
    plan.execute(bindings, stream=stream, workspace=workspace, unchecked=unchecked)
    return plan


def _sync(adapter: Any, device: int) -> None:
    if adapter is not None:
        adapter.synchronize(device)


def _workspace_bytes(workspace: Any) -> int | None:
    """The size of a ``workspace=`` array (None for no workspace or a raw pointer, whose size is unknown)."""
    if workspace is None or (isinstance(workspace, int) and not isinstance(workspace, bool)):
        return None
    return as_view(workspace, "workspace").nbytes


def autotune(
    graph: Graph,
    bindings: Mapping[Any, Any],
    *,
    max_candidates: int = 8,
    warmup: int = 2,
    repeat: int = 10,
    device: int | None = None,
    stream: Any = None,
    workspace: Any = None,
    unchecked: bool = False,
    **options: Any,
) -> ExecutionPlan:
    """Time up to ``max_candidates`` plans (heuristic order, filtered) on ``bindings``; cache the fastest.

    Each candidate runs ``warmup`` times, then ``repeat`` times between two
    device synchronizations (``adapter.synchronize``); its time is the mean
    wall time per run, which is its GPU time whenever the GPU work outlasts
    the ~6 µs host cost of an execute. The returned plan's ``timings`` lists
    ``(name, ms)`` for each candidate, or ``(name, error)`` for one that failed
    to run, or ``(name, reason)`` for one whose workspace need exceeds a
    given ``workspace=`` array (skipped, not run; when no candidate runs,
    :class:`UnsupportedGraphError` lists these reasons). Outputs are
    overwritten many times: inputs must not alias outputs.

    The bindings (raw pointers through the driver unless ``unchecked``),
    ``stream=`` and ``workspace=`` are checked before the graph is lowered.
    """
    for name, v in (("max_candidates", max_candidates), ("warmup", warmup), ("repeat", repeat)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be at least 1, got {max_candidates}")
    if warmup < 0 or repeat < 1:
        raise ValueError(f"warmup must be >= 0 and repeat >= 1, got warmup={warmup}, repeat={repeat}")
    if device is None:
        device = _bindings_device(bindings)
    ctx = _context(graph, device, options)
    r = ctx.spec.resolve(bindings, unchecked=unchecked)  # bad bindings before any GPU work
    attempts: list[Attempt] = []
    timings: list[tuple[str, float | str]] = []
    best: tuple[float, ExecutionPlan] | None = None
    given = _workspace_bytes(workspace)
    with _device_env(ctx):
        if stream is not None and not (unchecked and type(stream) is int):
            adapter = next((v.adapter for v in r.views if v.adapter is not None), ctx.adapter)
            stream = _stream(stream, adapter, ctx.device)  # a bad stream= before anything is built
        tried = 0
        for plan in _iter_plans(ctx, attempts):
            tried += 1
            if given is not None and plan.workspace_size > given:
                why = f"needs {plan.workspace_size} bytes of workspace, workspace= has {given}"
                timings.append((plan.name, why))
                attempts.append(Attempt(plan.name, "filter", why))
                if tried >= max_candidates:
                    break
                continue
            try:
                bound = plan.bind(bindings, workspace=workspace, stream=stream, unchecked=unchecked)
                # device-wide synchronization through the context's adapter (the bindings may be raw pointers,
                # with no adapter): the timing must cover the GPU work, not only the host enqueue
                for _ in range(warmup):
                    bound()
                _sync(ctx.adapter, ctx.device)
                t0 = time.perf_counter()
                for _ in range(repeat):
                    bound()
                _sync(ctx.adapter, ctx.device)
                ms = (time.perf_counter() - t0) * 1e3 / repeat
            except (lib.CudnnError, BindingError) as e:
                if isinstance(e, BindingError):
                    raise
                timings.append((plan.name, f"{e.status_name}"))
                attempts.append(Attempt(plan.name, "execute", _status_reason(e), e.status_name))
            else:
                timings.append((plan.name, ms))
                if best is None or ms < best[0]:
                    best = (ms, plan)
            if tried >= max_candidates:
                break
    if best is None:
        raise UnsupportedGraphError(ctx.label, attempts)
    plan = best[1]
    plan.timings = timings
    _log.debug("autotuned %s: %s", ctx.label, timings)
    return plan_cache(ctx.device).put(ctx.key, plan)
