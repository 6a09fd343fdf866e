"""Engines and engine filters: what cuDNN's heuristics offer a graph, and which of those configs a plan may use.

:class:`EngineInfo` is what cuDNN says of one engine config (``CUDNN_ATTR_ENGINE_GLOBAL_INDEX``, its knob
choices, ``CUDNN_ATTR_ENGINE_NUMERICAL_NOTE``/``BEHAVIOR_NOTE`` and ``CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE``);
:class:`EngineFilter` rejects configs by the thread's settings and a build's options (a pure function of those);
:data:`KNOWN_BAD_ENGINES` lists engines measured to compute a node wrong. :func:`candidates` asks the
``CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR`` of a heuristic mode (then FALLBACK) and yields the configs that pass.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from dataclasses import dataclass

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime.settings import Settings, current_settings
from ..errors import Attempt, refusal, status_reason
from ..tensor import PlanGraph

__all__ = ["EngineInfo", "EngineFilter", "KNOWN_BAD_ENGINES", "candidates", "engine_info", "fp32_math"]

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


#: Engines measured to compute a node wrong, denied at every build of a graph holding such a node:
#: (node kind, input dtype, mode) -> engine names. Measured on an H200 with cuDNN 9.19 (issue 10's fuzzer, then a
#: probe over window 2/3, stride 1/2, padding 0/1 and four shapes): bfloat16 max pooling from engine eng3 is wrong
#: nearly everywhere (max error 4.8 on unit normals), from eng2 exact; float16 and float32 are exact from both.
KNOWN_BAD_ENGINES: dict[tuple[str, str, str], tuple[str, ...]] = {("resample_fwd", "bfloat16", "max"): ("eng3",)}


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


def fp32_math(graph: PlanGraph) -> bool:
    """Whether ``graph``'s convolutions or matmuls read float32 data (then ``allow_tf32=False`` filters engines).

    Only non-virtual inputs count: a float32 *intermediate* (attention backward's ``dS @ K`` reads the float32
    ``dS`` of a bfloat16 graph) is the graph's compute type, not float32 data the user handed in, as torch's
    ``allow_tf32`` also concerns only float32 tensors."""
    fp32_data = {t.uid for t in graph.tensors() if t.dtype == "float32" and not t.virtual}
    for n in graph.nodes():
        if n.kind in ("matmul", "conv_fprop", "conv_dgrad", "conv_wgrad"):
            if any(uid in fp32_data for _, uid in n.inputs):
                return True
    return False


def engine_info(cfg: BackendDescriptor) -> EngineInfo:
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


def candidates(low, flt: EngineFilter, mode: str, attempts: list[Attempt]):
    """Yield (cfg, info) in heuristic order for ``mode``, then FALLBACK; filtered ones go to ``attempts``."""
    seen: set[str] = set()
    modes = [mode] if mode == "fallback" else [mode, "fallback"]
    for m in modes:
        try:
            cfgs, reported = _heuristics(low.op_graph, m)
        except lib.CudnnError as e:
            refusal(e)
            attempts.append(Attempt(f"heuristics mode {m}", "heuristics", status_reason(e), e.status_name))
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
                info = engine_info(cfg)
            except lib.CudnnError as e:
                refusal(e)
                attempts.append(Attempt("engine ?", "heuristics", status_reason(e), e.status_name))
                continue
            if info.name in seen:
                continue
            seen.add(info.name)
            why = flt.reject(info)
            if why:
                attempts.append(Attempt(info.name, "filter", why))
                continue
            yield cfg, info
