"""One declaration per op: :class:`Primitive`, the registry, the router and the op-level plan cache.

Every L2 op is a :class:`Primitive`: its operands by role (allowed dtypes, which operand's shape and dtype it must
share, whether it is written in place), its outputs (the ``out=`` keyword and the operand whose shape and dtype
they take), how its keyword arguments are checked (``resolve``), how cuDNN sees its arrays (``describe``, for the
ops that give cuDNN one layout for all of them), its legacy cuDNN call and/or its graph, and, for the L3 layers,
which operands are differentiable, the residuals its backward needs and the name of its backward primitive.
:func:`run` is the one checks-allocate-launch sequence they all share::

    prepare (arrays read, one device, the stream)  ->  dtypes and shape agreement  ->  resolve (the keywords)
    ->  alpha/beta  ->  empty arrays  ->  out=  ->  route (graph or legacy)  ->  layout (op-level cache)
    ->  the cuDNN call  ->  write-backs

The public functions (``softmax_forward``, ``set_tensor``, ...) stay plain Python functions with their own
signatures and docstrings, each one line over :func:`run`; :data:`REGISTRY` lists every primitive by name so
that the autograd, torch and JAX layers (and the fuzzer) loop over it instead of registering ops by hand.

**The router** (:func:`route`) is the only place that picks the graph API or the legacy call. It reads
``cudnnkit.settings(prefer=...)``; float64 always goes to legacy (the graph API has no float64); a graph key that
cuDNN refused (:class:`~cudnnkit.graph.UnsupportedGraphError`) is remembered and goes to legacy from then on,
unless ``prefer="graph"``, which raises instead. A primitive with one form runs it (a legacy-only op under
``prefer="graph"`` runs legacy, and says so in the log). Per call, a primitive's ``graph_refuses`` /
``legacy_refuses`` say why a form cannot take it (blending, asymmetric padding, a mode the legacy API lacks): the
other form runs, a forced form that cannot is a ``ValueError`` saying why, and a call neither takes is refused by
name right after ``resolve``, before any output is allocated; ``auto`` picks between two forms that both take it
(pooling keeps its faster legacy kernel). The path of this thread's last call is :func:`last_path`; every choice
is logged on the ``cudnnkit`` logger at debug level. The graph forms themselves live in
:mod:`cudnnkit.ops._graphform` (one plan per call signature, cached).

**The op-level plan cache** maps a cheap key -- the primitive, its resolved keywords, per operand (dtype, shape,
strides), the ``out=`` arrays' (shape, strides), whether beta is 0, the device -- to what the call needs: the
cuDNN tensor descriptor and the strides new outputs get, for calls whose arrays cuDNN can take as they are (the
common case: no copy, no temporary). A hit plans nothing and describes nothing; a call that needs copies is
planned afresh each time (:func:`cudnnkit.ops._layout.one_layout`), and its first sighting is cached as such.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..graph.plan.plans import _multi_device
from ..runtime import OPTIONAL, PACKED, WRITTEN, adapters, check_dtype, current_settings, prepare, tensor_descriptor
from ..runtime.adapters import FINISH, pointer
from ..runtime.arrays import layout_problem
from ..runtime.cache import LRU, MISSING
from ..runtime.descriptors import IntRangeError
from ..runtime.dtypes import scaling_ref
from ..runtime.handle import get_handle
from ..runtime.launch import Launch
from ..runtime.view import ArrayView
from . import _express, _replay
from ._graphform import GraphFallback
from ._layout import check_fits, fits, plan_layout

__all__ = [
    "Operand",
    "Output",
    "Primitive",
    "Call",
    "REGISTRY",
    "register",
    "run",
    "route",
    "last_path",
    "split_out",
]

_log = logging.getLogger("cudnnkit")


@dataclass(frozen=True)
class Operand:
    """One array argument: its ``name`` (the keyword and the name in errors), the ``dtypes`` it may have (None:
    any; checked with :func:`~cudnnkit.runtime.check_dtype`, operands in order), ``like``: the earlier
    operand whose shape and dtype it must share (``ValueError``/``TypeError`` naming both), ``optional`` (may be
    ``None``), ``flags`` for :func:`~cudnnkit.runtime.prepare` (``WRITTEN``, ``ELEMENTWISE``); a ``WRITTEN``
    operand that is read-only is refused by name."""

    name: str
    dtypes: tuple[str, ...] | None = None
    like: str | None = None
    optional: bool = False
    flags: int = 0
    #: cuDNN reads it through a bare pointer: copied to C order (logged) when it is not C-contiguous, after the
    #: outputs are checked (ops without ``describe``); a str says why, in the log and in errors
    packed: bool | str = False
    #: host data (a list, a NumPy array, a CPU tensor) is taken too: it reaches ``resolve`` as the caller's object
    #: in place of a view (CTC's labels and lengths); a device array goes through ``prepare`` as usual
    host_ok: bool = False


@dataclass(frozen=True)
class Output:
    """One output: ``name`` is the keyword that passes it (``out``), ``like`` the operand whose shape and dtype it
    has, or ``shape(resolved)`` its shape (its dtype the first operand's). For ops without ``describe``:
    ``packed`` (an ``out=`` must be C-contiguous: cuDNN writes it through a bare pointer) and ``blend`` (the
    ``(alpha, beta)`` keywords of this output, when an op's outputs blend separately)."""

    name: str = "out"
    like: str = ""
    #: whether the call has this output (divisive normalization's dmeans only with means); default: always
    present: Callable[[Mapping[str, Any]], bool] | None = None
    shape: Callable[[Any], tuple[int, ...]] | None = None
    #: the strides of a new output, from ``resolved`` (None: C order)
    strides: Callable[[Any], tuple[int, ...] | None] | None = None
    #: an ``out=`` must be C-contiguous; a str is the refusal's text (``{strides}`` and ``{shape}`` filled in)
    packed: bool | str = False
    blend: tuple[str, str] | None = None
    #: the dtype of the output, from ``resolved`` (ops without ``describe``; default: the first operand's): a
    #: convolution of int8 or fp8 data writes float32, float16 or bfloat16
    dtype: Callable[[Any], str] | None = None


@dataclass(slots=True)
class Call:
    """What a primitive's legacy call gets: ``launch`` (device, stream, handle), ``views`` (operand name ->
    :class:`~cudnnkit.runtime.ArrayView` in the call's layout; outputs under their ``Output.name``),
    ``resolved`` (what ``resolve`` returned), ``desc`` (the one tensor descriptor of a ``describe``-d call, else
    None), ``description`` (its (shape, strides)), ``alpha``/``beta`` (ctypes scaling references, None for ops
    without a blend)."""

    launch: Any
    views: dict[str, Any]
    resolved: Any
    desc: Any = None
    description: Any = None
    alpha: Any = None
    beta: Any = None
    #: per output with its own blend: its name -> (alpha ref, beta ref)
    blends: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: what ``check_plan`` and the legacy call hand on: the op's ``extras`` (dropout's reserve), its state
    extra: dict[str, Any] = field(default_factory=dict)
    #: the arrays as the caller passed them, by operand name
    arrays: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Primitive:
    """The declaration of one op (see the module docstring).

    * ``resolve(views, kwargs)`` checks the op's keyword arguments against its arrays and returns a hashable value
      (the op's config, normalised: ``(first_axis, last_axis, algo_enum)`` for softmax); it raises ``TypeError``
      / ``ValueError`` naming the argument.
    * ``describe(resolved)`` returns the function ``(shape, strides) -> description | None`` that tells how cuDNN
      sees one array of the call (:mod:`cudnnkit.ops._layout`); ``None`` for ops that take their arrays as
      given (the in-place tensor ops).
    * ``legacy(call)`` queues the cuDNN call(s); ``graph(call)`` the graph form, where there is one.
    * ``layout_order``: the operands in the order the layout planner weighs them (default: ``inputs``' order).
    * ``blend``: the op takes ``alpha``/``beta`` (``out = alpha * result + beta * out``), under the keyword names
      ``blend_names`` (LRN keeps ``y_alpha``/``y_beta``, since its ``alpha``/``beta`` are the formula's).
    * ``returns``: the operand returned when the op has no outputs (the in-place ops return their array).
    * ``family``: the name dtype errors use ("softmax" for both softmax primitives; default: ``name``).
    * ``forced_strides(resolved)``: the layout the call must run in (dropout's backward: its forward's), or None.
    * ``check_plan(call)``: the last checks, once the layout is chosen (``call.desc`` set, ``call.views`` still the
      given ones) and before any copy is made; it may leave values in ``call.extra`` for the legacy call.
    * ``extras``: names the legacy call leaves in ``call.extra`` and the function returns after its outputs
      (dropout's ``reserve``); ``empty_extras(launch)`` gives them for an empty call.
    * ``empty(resolved)``: the call has nothing to compute (its outputs are returned as allocated); default: the
      first output's ``like`` operand is empty.
    * ``differentiable``, ``residuals``, ``backward``: for the autograd layer.
    """

    name: str
    inputs: tuple[Operand, ...]
    outputs: tuple[Output, ...] = ()
    resolve: Callable[[Mapping[str, Any], Mapping[str, Any]], Any] = lambda views, kwargs: ()
    describe: Callable[[Any], Callable[..., Any]] | None = None
    legacy: Callable[[Call], None] | None = None
    graph: Callable[[Call], None] | None = None
    layout_what: str = ""
    layout_order: tuple[str, ...] | None = None
    blend: bool = False
    blend_names: tuple[str, str] = ("alpha", "beta")
    returns: str | None = None
    family: str = ""
    empty: Callable[[Any], bool] | None = None
    forced_strides: Callable[[Any], tuple[int, ...] | None] | None = None
    check_plan: Callable[[Call], None] | None = None
    extras: tuple[str, ...] = ()
    empty_extras: Callable[[Any], dict[str, Any]] | None = None
    differentiable: tuple[str, ...] = ()
    residuals: tuple[str, ...] = ()
    backward: str | None = None
    #: repeated calls may take the express path (:mod:`cudnnkit.ops._express`): False when a check reads more
    #: than the arrays' metadata and the keywords (a pointer, the settings)
    express: bool = True
    #: ``(resolved, kwargs) -> reason | None``: why the graph form cannot take a call (alpha/beta blending), which
    #: then goes to legacy; ``legacy_refuses(resolved)`` likewise (asymmetric padding), which then goes to the graph
    graph_refuses: Callable[[Any, Mapping[str, Any]], str | None] | None = None
    legacy_refuses: Callable[[Any], str | None] | None = None
    #: ``(resolved, kwargs) -> (path, why)``: the path under ``prefer="auto"`` when both forms take the call
    #: (default: the graph); pooling keeps its faster legacy kernel, a blending convolution its one-kernel blend
    auto: Callable[[Any, Mapping[str, Any]], tuple[str, str]] | None = None
    #: an op whose call does not fit the shared sequence runs this function instead (``runner(**arrays,
    #: stream=, **kwargs)``, the public function itself): the RNN, whose arrays are sequences described per call
    #: (lengths, layouts), whose algorithm is chosen per shape class and whose reserve is tracked by a ledger. Its
    #: declaration still gives the L3 layers and the fuzzer its operands, outputs, residuals and backward.
    runner: Callable[..., Any] | None = None
    doc: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.legacy is None and self.graph is None and self.runner is None:
            raise ValueError(f"primitive {self.name} declares neither a legacy call nor a graph")
        forms = tuple(f for f, fn in (("graph", self.graph), ("legacy", self.legacy or self.runner)) if fn is not None)
        object.__setattr__(self, "_forms", forms)  # fixed at declaration: the router reads it on every call
        object.__setattr__(self, "_names", tuple(op.name for op in self.inputs))
        object.__setattr__(self, "_outnames", frozenset(o.name for o in self.outputs))
        # what the call writes: its outputs and its WRITTEN operands (the graph form keeps them in place)
        written = {o.name for o in self.outputs} | {op.name for op in self.inputs if op.flags & WRITTEN}
        object.__setattr__(self, "_written", frozenset(written))
        # the signature holds the settings, so a call on either path may be express
        express = self.express and not any(op.host_ok for op in self.inputs)
        object.__setattr__(self, "_express", express)
        names = [op.name for op in self.inputs]
        for op in self.inputs:
            if op.like is not None and op.like not in names[: names.index(op.name)]:
                raise ValueError(f"primitive {self.name}: {op.name}.like={op.like!r} is not an earlier operand")

    @property
    def forms(self) -> tuple[str, ...]:
        """Which of "graph" and "legacy" this primitive has."""
        return self._forms  # type: ignore[attr-defined]

    def __call__(self, arrays: Mapping[str, Any], /, *, stream: Any = None, **kwargs: Any) -> Any:
        return run(self, arrays, stream=stream, **kwargs)


#: every primitive by name (the L3 layers and the fuzzer loop over it)
REGISTRY: dict[str, Primitive] = {}


def register(p: Primitive) -> Primitive:
    """Add ``p`` to :data:`REGISTRY` (its name must be new) and return it."""
    if p.name in REGISTRY:
        raise ValueError(f"a primitive named {p.name!r} is already registered")
    REGISTRY[p.name] = p
    return p


def split_out(fn: str, out: Any, named: dict[str, Any]) -> tuple[Any, ...]:
    """The given output arrays of a multi-output op, in the order it returns them: from ``out=`` (the keyword every
    op takes: here a tuple with one array or ``None`` per output) or from the per-output keywords ``named`` (their
    deprecated names, ``dx_out=``, ...: a ``DeprecationWarning``), never both. Errors about one output name it by
    its per-output name, which the public docstrings list."""
    given = [k for k, v in named.items() if v is not None]
    if out is None:
        if given:
            warnings.warn(
                f"{fn}: {', '.join(k + '=' for k in given)} is deprecated; pass out=({', '.join(named)}), with None "
                "for an output to allocate",
                DeprecationWarning,
                stacklevel=3,
            )
        return tuple(named.values())
    if given:
        raise TypeError(f"{fn}: pass out= or {given[0]}=, not both")
    if not isinstance(out, (tuple, list)) or len(out) != len(named):
        got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TypeError(
            f"{fn}: out must be a tuple of {len(named)} (({', '.join(named)}), each an array or None), got {got}"
        )
    return tuple(out)


# ----------------------------------------------------------------- the router


class _Last(threading.local):
    path: tuple[str, str] | None = None


_last = _Last()
#: graph keys cuDNN refused (UnsupportedGraphError): they go to legacy from then on
_refused: LRU[Any, str] = LRU("ops.refused_graph_keys", 4096)


def last_path() -> tuple[str, str] | None:
    """``(primitive name, "graph" | "legacy")`` of this thread's last op call, or None before any."""
    return _last.path


def route(p: Primitive, dtype: str, graph_key: Any = None, resolved: Any = None, kwargs: Mapping[str, Any] = {},
          refused: tuple[str | None, str | None] | None = None) -> str:  # fmt: skip
    """``"graph"`` or ``"legacy"`` for one call of ``p`` on arrays of ``dtype`` (see the module docstring).

    ``graph_key`` identifies the graph the call would build (for the negative cache); ``resolved`` and
    ``kwargs`` are the call's, which the primitive's ``graph_refuses``/``legacy_refuses`` read: a form that
    cannot take the call is not chosen, and forcing it with ``settings(prefer=...)`` raises ``ValueError``
    saying why. ``refused``: what :func:`refusals` already answered for this call (it is not asked twice)."""
    if p.graph is None or p.legacy is None:
        path = p._forms[0]  # type: ignore[attr-defined]
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("%s: %s path (%s has only a %s form)", p.name, path, p.name, path)
        return path
    prefer = current_settings().prefer
    no_graph, no_legacy = refused if refused is not None else refusals(p, dtype, resolved, kwargs, prefer)
    if no_legacy is not None:
        path, why = "graph", f"only the graph API takes it ({no_legacy} on the legacy call)"
    elif no_graph is not None:
        path, why = "legacy", no_graph
    elif prefer == "legacy":
        path, why = "legacy", "settings(prefer='legacy')"
    elif prefer != "graph" and graph_key is not None and _refused.lookup(graph_key) is not MISSING:
        path, why = "legacy", "cuDNN refused this graph before"
    elif prefer == "auto" and p.auto is not None:
        path, why = p.auto(resolved, kwargs)
    else:
        path, why = "graph", f"settings(prefer={prefer!r})"
    _log.debug("%s: %s path (%s)", p.name, path, why)
    return path


def refusals(p: Primitive, dtype: str, resolved: Any, kwargs: Mapping[str, Any], prefer: str | None = None
             ) -> tuple[str | None, str | None]:  # fmt: skip
    """Why the graph form and why the legacy form cannot take a call (None: it can), for a primitive with both;
    ``ValueError`` when neither can, or when ``settings(prefer=...)`` forces the one that cannot. :func:`run`
    asks right after ``resolve``, so these are refused before any output is allocated."""
    if prefer is None:
        prefer = current_settings().prefer
    no_graph = "float64 (the graph API has none)" if dtype == "float64" else None
    if no_graph is None and p.graph_refuses is not None:
        no_graph = p.graph_refuses(resolved, kwargs)
    no_legacy = _legacy_refusal(p, resolved)
    if no_graph is not None and no_legacy is not None:
        raise ValueError(f"{p.name}: neither cuDNN path takes this call: the graph API ({no_graph}) nor the legacy "
                         f"call ({no_legacy})")  # fmt: skip
    if no_legacy is not None and prefer == "legacy":
        raise ValueError(f"{p.name}: settings(prefer='legacy'), but the legacy call cannot take this: {no_legacy}")
    if no_graph is not None and prefer == "graph":
        raise ValueError(f"{p.name}: settings(prefer='graph'), but the graph API cannot take this: {no_graph}")
    return no_graph, no_legacy


def _legacy_refusal(p: Primitive, resolved: Any) -> str | None:
    """Why ``p``'s legacy form cannot take a resolved call (None: it can, or ``p`` declares no refusal)."""
    return p.legacy_refuses(resolved) if p.legacy_refuses is not None else None


class GraphOnlyError(ValueError):
    """A call that only a primitive's graph form can make (its legacy form refuses it: batch norm's ReLU mask),
    for which cuDNN has no engine. A ``ValueError`` naming both refusals; a caller that asked for the graph-only
    feature as an optimization (the L3 batch norm's mask) catches it and asks again without."""


def _restore(call: Call, views: dict) -> None:
    """The call's views as they were before the graph form ran (its copies and output temporaries dropped)."""
    call.views.clear()
    call.views.update(views)
    call.extra.pop("_graph_back", None)


def _launch_form(p: Primitive, call: Call, path: str, graph_key: Any) -> None:
    if path == "graph":
        from ..graph import UnsupportedGraphError

        call.extra["_written"] = p._written  # type: ignore[attr-defined]
        call.extra["_extras"] = p.extras
        views = dict(call.views)  # the graph form may swap in copies and temporaries: a legacy retry gets these
        try:
            with call.launch.on_device():
                p.graph(call)  # type: ignore[misc]
        except GraphFallback as e:
            if p.legacy is None:
                raise MemoryError(f"{p.name}: {e}") from None
            no_legacy = _legacy_refusal(p, call.resolved)
            if no_legacy is not None:  # the legacy call would not write what the graph was to (a ReLU mask)
                raise MemoryError(f"{p.name}: {e}; the legacy call cannot take this call: {no_legacy}") from None
            _restore(call, views)
            call.extra["_fell_back"] = True  # this one call: not remembered as a legacy call
            _log.debug("%s: legacy path for this call (%s)", p.name, e)
        except UnsupportedGraphError as e:
            if current_settings().prefer == "graph" or p.legacy is None:
                raise
            no_legacy = _legacy_refusal(p, call.resolved)
            if no_legacy is not None:  # the legacy call cannot take it either: say both, naming the argument
                raise GraphOnlyError(
                    f"{p.name}: cuDNN has no engine for this call's graph ({str(e).splitlines()[0]}), and the legacy "
                    f"call cannot take it: {no_legacy}"
                ) from e
            if graph_key is not None:
                _refused.put(graph_key, str(e).splitlines()[0])
            _log.debug("%s: graph refused (%s); legacy path", p.name, str(e).splitlines()[0])
            _restore(call, views)
            path = "legacy"
        except IntRangeError:  # a legacy descriptor the graph form makes (the split convolution's epilogue)
            _name_unfit(call)
            raise
        else:
            _last.path = (p.name, "graph")
            call.extra["_path"] = "graph"
            return
    try:
        with call.launch.on_device():  # every form runs with the arrays' device current
            p.legacy(call)  # type: ignore[misc]
    except IntRangeError:
        _name_unfit(call)
        raise
    _last.path = (p.name, "legacy")
    call.extra["_path"] = "legacy"


def _name_unfit(call: Call) -> None:
    """Re-raise a legacy call's :class:`~cudnnkit.runtime.descriptors.IntRangeError` (a descriptor's dim or
    stride past cuDNN's int: the legacy API's limit, where the graph API takes int64) as
    :func:`~cudnnkit.ops._layout.check_fits`'s ``ValueError`` naming the first of the call's arrays that does not
    fit; nothing when every array fits (a temporary's descriptor: the error stands). The descriptors are made before
    the cuDNN call that reads them, so nothing ran on the device for the array named. Caught, not checked per
    call: the check costs nothing on the calls that fit."""
    for name, v in call.views.items():
        if isinstance(v, ArrayView) and not fits(tuple(v.shape), tuple(v.strides)):
            check_fits(name, v.shape, v.strides)  # raises


# ----------------------------------------------------------------- the op-level plan cache

#: key -> ("direct", descriptor, description, output strides) or ("planned",): see the module docstring
_plans: LRU[tuple, tuple] = LRU("ops.plans", 4096)


def plan_cache_info() -> dict[str, int]:
    """Size, bound, hits and misses of the op-level plan cache."""
    return _plans.info()


# ----------------------------------------------------------------- the shared sequence


def run(p: Primitive, arrays: Mapping[str, Any], /, *, stream: Any = None, **kwargs: Any) -> Any:
    """One call of primitive ``p``: ``arrays`` maps operand names to arrays (``None`` for an absent optional one),
    ``kwargs`` holds the op's keywords, ``out=`` (each output's keyword) and ``alpha``/``beta`` for blending ops.
    Returns the output (``out`` if given), a tuple of outputs, or the ``returns`` operand; an output a library
    receives only once the call is queued (JAX's: ``adapters.FINISH``) is handed over here."""
    got = _run(p, arrays, stream, kwargs)
    if not FINISH:
        return got
    f = FINISH.get(type(got))
    if f is None and (type(got) is not tuple or not any(type(g) in FINISH for g in got)):
        return got
    if _replay._tls.rec is not None:  # the caller gets finished results, not the arrays a replay would give
        _replay._tls.rec.abandon()
    if f is not None:
        return f(got)
    return tuple(FINISH[type(g)](g) if type(g) in FINISH else g for g in got)


def _run(p: Primitive, arrays: Mapping[str, Any], stream: Any, kwargs: dict) -> Any:
    rec = _replay._tls.rec  # a declaration's call being recorded (:mod:`cudnnkit.ops._replay`), else None
    if p.runner is not None:
        if rec is not None:
            rec.abandon()
        return p.runner(**arrays, stream=stream, **kwargs)
    sig = None
    if stream is None and p._express:  # type: ignore[attr-defined]
        sig = _express.signature(p, arrays, kwargs)
        if sig is not None:
            try:  # one dict read, no lock (entries are forgotten oldest-first; a hit does not renew one)
                e = _express.entries.peek(sig[0], MISSING)
            except TypeError:  # an unhashable keyword value: the full sequence says what is wrong with it
                sig = None
            else:
                if e is not MISSING:
                    if rec is None:
                        return _fire(p, e, sig[1], arrays, kwargs)
                    _replay._tls.rec = None  # the L2 calls the hit makes itself (a split form's) are its own
                    try:
                        got = _fire(p, e, sig[1], arrays, kwargs)
                    finally:
                        _replay._tls.rec = rec
                    rec.hit(_fire, p, e, arrays, kwargs, got, _fire_graph if e.fast and not e.copies else None)
                    return got
    if rec is not None:
        rec.abandon()
    named = []
    for op in p.inputs:
        a = arrays.get(op.name)
        if op.host_ok and a is not None and not adapters.is_device_array(a):
            a = None  # host data: resolve reads it from ``arrays``
        flags = op.flags | (OPTIONAL if op.optional or op.host_ok else 0) | (PACKED if op.packed else 0)
        named.append((op.name, a, flags) if flags else (op.name, a))
    launch, vs = prepare(*named, stream=stream)
    views = {op.name: v for op, v in zip(p.inputs, vs)}
    for op in p.inputs:  # host data of a host_ok operand reaches resolve as the caller's object
        if op.host_ok and views[op.name] is None and arrays.get(op.name) is not None:
            views[op.name] = arrays[op.name]
    first = p.inputs[0]
    v0 = views[first.name]
    for op in p.inputs:
        if op.dtypes is not None and views[op.name] is not None:
            check_dtype(views[op.name], op.name, op.dtypes, p.family or p.name)
    for op in p.inputs:
        v = views[op.name]
        if v is None:
            continue
        if op.like is not None:
            ref = views[op.like]
            if v.shape != ref.shape:
                raise ValueError(f"{op.name} has shape {v.shape} but {op.like} has shape {ref.shape}")
            if v.dtype != ref.dtype:
                raise TypeError(f"{op.name} has dtype {v.dtype} but {op.like} has dtype {ref.dtype}")
        if op.flags & WRITTEN and v.readonly:
            raise ValueError(f"{op.name} is read-only: {p.name} writes it in place")
    resolved = p.resolve(views, kwargs)
    refused = None
    if p.graph is not None and p.legacy is not None:
        refused = refusals(p, v0.dtype, resolved, kwargs)  # a call neither form takes: refused before allocating

    alpha = beta = 0.0
    a_ref = b_ref = None
    if p.blend:
        an, bn = p.blend_names
        alpha, beta = kwargs.get(an, 1.0), kwargs.get(bn, 0.0)
        # the blend refs use the dtype of the layout's first array (softmax backward: y; they all share it)
        dt = views[(p.layout_order or (first.name,))[0]].dtype
        a_ref, b_ref = scaling_ref(dt, alpha, an), scaling_ref(dt, beta, bn)
    if not p.outputs:
        call = Call(launch, views, resolved, alpha=a_ref, beta=b_ref, arrays=arrays)
        path = route(p, v0.dtype)
        if views[p.returns or first.name].size:  # add_tensor: an empty c, whatever a's size
            _launch_form(p, call, path, None)
            if sig is not None and _as_given(views, arrays):
                _remember(sig, launch, views, [], [], call, False)
        return arrays[p.returns or first.name]

    if p.describe is None:
        return _run_shaped(p, launch, views, arrays, kwargs, resolved, sig, refused)
    # ops that give cuDNN one layout: every output has the shape and dtype of operand ``like``
    outs = [o for o in p.outputs if o.present is None or o.present(views)]
    like = views[outs[0].like]
    bname = p.blend_names[1]
    given = {o.name: kwargs.get(o.name) for o in outs}
    if like.size == 0:
        return _returned(p, {o.name: launch.output(given[o.name], like.shape, like.dtype, name=o.name, beta=beta,
                                                   beta_name=bname)[0] for o in outs},
                         p.empty_extras(launch) if p.empty_extras is not None else {})  # fmt: skip
    missing = [o.name for o in outs if given[o.name] is None]
    if beta != 0 and missing:
        raise ValueError(f"{bname} != 0 blends into an existing output: pass {missing[0]}=")
    vouts: dict[str, Any] = {}
    for o in outs:
        vouts[o.name] = None
        if given[o.name] is not None:
            given[o.name], vouts[o.name] = launch.output(
                given[o.name], like.shape, like.dtype, name=o.name, beta=beta, beta_name=bname
            )

    order = p.layout_order or p._names  # type: ignore[attr-defined]
    operands = tuple([None if views[n] is None else (views[n].dtype, views[n].shape, views[n].strides) for n in order])
    outkey = tuple([None if v is None else (v.shape, v.strides) for v in vouts.values()])
    graph_key = (p.name, resolved, operands, outkey, launch.device, current_settings()) if p.graph is not None else None
    path = route(p, like.dtype, graph_key, resolved, kwargs, refused)
    key = (p.name, resolved, operands, outkey, beta != 0, launch.device)
    hit = _plans.lookup(key)
    if hit is not MISSING and hit[0] == "direct":
        _, desc, description, alloc = hit
        call_views = dict(views)
        results = {}
        for o in outs:
            if given[o.name] is None:
                given[o.name], vouts[o.name] = launch.empty(like.shape, like.dtype, alloc, name=o.name)
            results[o.name], call_views[o.name] = given[o.name], vouts[o.name]
        call = Call(launch, dict(views), resolved, desc, description, a_ref, b_ref, arrays=arrays)
        call.extra["graph_key"] = graph_key
        if p.check_plan is not None:
            p.check_plan(call)
        call.views = call_views
        _launch_form(p, call, path, graph_key)
        if sig is not None and _as_given(views, arrays):
            _remember_outputs(p, sig, launch, views, kwargs, call)
        return _returned(p, results, call.extra)

    describe = p.describe(resolved)  # type: ignore[misc]
    lay = plan_layout(
        launch,
        [(n, arrays.get(n), views[n]) for n in order],
        [(o.name, given[o.name], vouts[o.name], beta) for o in outs],
        describe,
        shape=like.shape,
        dtype=like.dtype,
        what=p.layout_what,
        strides=p.forced_strides(resolved) if p.forced_strides is not None else None,
    )
    desc = tensor_descriptor(like.dtype, *lay.description)
    call = Call(launch, dict(views), resolved, desc, lay.description, a_ref, b_ref, arrays=arrays)
    call.extra["graph_key"] = graph_key
    if p.check_plan is not None:
        p.check_plan(call)  # before any copy
    lay.apply()
    call_views = dict(views)  # operands outside the layout (dropout's reserve) as given
    call_views.update((n, v) for n, (_, v) in zip(order, lay.inputs))
    for o, (_, vo) in zip(outs, lay.outputs):
        call_views[o.name] = vo
    direct = all(v is views[n] for n, v in call_views.items() if n in views) and all(
        vouts[o.name] is None or call_views[o.name] is vouts[o.name] for o in outs
    )
    if hit is MISSING:
        alloc = call_views[outs[0].name].strides
        same = all(call_views[o.name].strides == alloc for o in outs if vouts[o.name] is None)
        plan = ("direct", desc, lay.description, alloc) if direct and same else ("planned",)
        _plans.put(key, plan, count_miss=True)
    call.views = call_views
    _launch_form(p, call, path, graph_key)
    copied_in = not direct and not lay._writeback and p.check_plan is None
    lay.finish()
    if copied_in and sig is not None and _as_given(views, arrays):
        # only inputs were copied into the call's layout (a C-order gradient for a channels-last activation): a hit
        # makes the same copies from the caller's arrays (Entry.copies), then runs as a direct call
        inputs = {n: call_views[n] for n in views}
        if all(v is None or v.owner is arrays.get(n) or _copy_of(v, arrays.get(n)) for n, v in inputs.items()):
            _remember_outputs(p, sig, launch, inputs, kwargs, call)
    return _returned(p, dict(zip((o.name for o in outs), lay.results)), call.extra)


def _returned(p: Primitive, results: dict[str, Any], extra: Mapping[str, Any] | None = None) -> Any:
    """What the public function returns: its one output, or a tuple of all (None for an absent one), then the
    op's ``extras``."""
    got = [results.get(o.name) for o in p.outputs] + [(extra or {}).get(n) for n in p.extras]
    return got[0] if len(got) == 1 else tuple(got)


def _run_shaped(p: Primitive, launch: Any, views: dict[str, Any], arrays: Mapping[str, Any], kwargs: Mapping[str, Any],
                resolved: Any, sig: Any = None, refused: Any = None) -> Any:  # fmt: skip
    """The rest of :func:`run` for ops whose arrays cuDNN takes with their own strides (no ``describe``): outputs
    of declared shapes, packed inputs and outputs, a blend per output."""
    dt = views[p.inputs[0].name].dtype
    blends: dict[str, tuple[Any, Any]] = {}
    betas: dict[str, tuple[float, str]] = {}
    for o in p.outputs:
        if o.blend is not None:
            an, bn = o.blend
            alpha, beta = kwargs.get(an, 1.0), kwargs.get(bn, 0.0)
            blends[o.name] = (scaling_ref(dt, alpha, an), scaling_ref(dt, beta, bn))
            betas[o.name] = (beta, bn)
    shapes = {o.name: (tuple(o.shape(resolved)) if o.shape is not None else views[o.like].shape) for o in p.outputs}

    def output(o: Output) -> tuple[Any, Any]:
        beta, bn = betas.get(o.name, (0.0, "beta"))
        strides = o.strides(resolved) if o.strides is not None and kwargs.get(o.name) is None else None
        odt = o.dtype(resolved) if o.dtype is not None else dt
        return launch.output(
            kwargs.get(o.name), shapes[o.name], odt, strides=strides, name=o.name, beta=beta, beta_name=bn
        )

    empty = p.empty(resolved) if p.empty is not None else views[p.outputs[0].like].size == 0
    if empty:
        got = {o.name: output(o)[0] for o in sorted(p.outputs, key=lambda o: kwargs.get(o.name) is None)}
        results = [got[o.name] for o in p.outputs]
        extra = p.empty_extras(launch) if p.empty_extras is not None else {}
        results += [extra.get(n) for n in p.extras]
        return results[0] if len(results) == 1 else tuple(results)
    call_views = dict(views)
    made: dict[str, tuple[Any, Any]] = {}
    # given outputs are checked before anything is allocated
    for o in sorted(p.outputs, key=lambda o: kwargs.get(o.name) is None):
        made[o.name] = arr, v = output(o)
        if o.packed and not v.is_contiguous():
            text = o.packed if isinstance(o.packed, str) else (
                "{name} must be C-contiguous (cuDNN writes it as a packed array), got shape {shape} strides {strides}"
            )  # fmt: skip
            raise ValueError(text.format(name=o.name, shape=v.shape, strides=v.strides))
    results = [made[o.name][0] for o in p.outputs]
    call_views.update((o.name, made[o.name][1]) for o in p.outputs)
    # outputs checked: only now copy the inputs cuDNN cannot take as they are
    for op in p.inputs:
        v = views[op.name]
        if op.packed and v is not None and not v.is_contiguous():
            why = op.packed if isinstance(op.packed, str) else "must be C-contiguous (cuDNN reads it as a packed array)"
            _, call_views[op.name] = launch.contiguous(arrays[op.name], v, op.name, why)
    first = blends.get(p.outputs[0].name, (None, None))
    call = Call(launch, call_views, resolved, alpha=first[0], beta=first[1], blends=blends, arrays=arrays)
    graph_key = None
    if p.graph is not None:  # what the graph form would build: the call's arrays as cuDNN sees them, the settings
        metas = tuple([None if v is None else (n, v.dtype, v.shape, v.strides) for n, v in call_views.items()])
        graph_key = (p.name, resolved, metas, launch.device, current_settings())
        call.extra["graph_key"] = graph_key
    path = route(p, dt, graph_key, resolved, kwargs, refused)
    # no packed copy made above (what the form itself swaps into call.views, it swaps again on a hit; the graph
    # form keeps its pointer-only plan only when it swapped nothing it binds)
    uncopied = all(call_views[op.name] is views[op.name] for op in p.inputs)
    outs = {o.name: call_views[o.name] for o in p.outputs}  # as allocated: the form may write through temporaries
    _launch_form(p, call, path, graph_key)
    if sig is not None and uncopied and not call.extra.get("_fell_back") and _as_given(views, arrays):
        fresh = {f[0] for f in call.extra.get("graph_fresh", ())}
        if any(call.extra.get(n) is not None and n not in fresh for n in p.extras):
            # the call made extras the pointer-only graph path cannot make (a reserve, a legacy call's statistics,
            # an extra written through a temporary): a hit runs the whole form again, which makes them anew; the
            # graph form's own new extras (batch norm's saved statistics and dz, pooling's index) a hit allocates
            # like its outputs
            call.extra.pop("graph_form", None)
        _remember_outputs(p, sig, launch, views, kwargs, call, shaped=True, outs=outs)
    results += [call.extra.get(n) for n in p.extras]  # what the legacy call left (reduce_tensor's indices)
    return results[0] if len(results) == 1 else tuple(results)


# ----------------------------------------------------------------- the express path


def _as_given(views: Mapping[str, Any], arrays: Mapping[str, Any]) -> bool:
    """Whether every operand's view reads the caller's own array, or the copy :func:`~cudnnkit.runtime.prepare`
    made of an input cuDNN cannot take as it is (expanded, overlapping: a hit makes that copy again, see
    :attr:`~cudnnkit.ops._express.Entry.copies`), with no producer stream to wait for."""
    for n, v in views.items():
        if v is not None and (
            v.stream is not None or (v.owner is not arrays.get(n) and not _prepared(v, arrays.get(n)))
        ):
            return False
    return True


def _prepared(v: Any, a: Any) -> bool:
    """Whether view ``v`` is :func:`~cudnnkit.runtime.prepare`'s copy of the caller's array ``a``: :func:`_copy_of`
    it, and ``a`` in a layout cuDNN cannot take."""
    got = _copy_of(v, a)
    return got is not None and layout_problem(tuple(got[0][2]), tuple(got[0][3])) is not None


def _copy_of(v: Any, a: Any) -> Any:
    """The express key of the caller's array ``a`` when view ``v`` can be a copy of it that a hit makes again (``a``
    of a library with a key, the copy made by that library, the same shape), else None."""
    key = adapters.KEYED.get(type(a))
    got = key(a) if key is not None else None
    if got is None or v.adapter is not got[2] or tuple(got[0][2]) != tuple(v.shape):
        return None
    return got


def _copies(views: Mapping[str, Any], arrays: Mapping[str, Any]) -> tuple:
    """``(name, shape, dtype, strides, adapter)`` of each input :func:`_as_given` accepted as a copy."""
    return tuple(
        (n, v.shape, v.dtype, v.strides, v.adapter)
        for n, v in views.items()
        if v is not None and v.owner is not arrays.get(n)
    )


def _remember(sig: Any, launch: Any, views: dict[str, Any], given: list[str], new: list[tuple[str, Any]], call: Call,
              shaped: bool, outs: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    copies = _copies(views, call.arrays)
    if any(c[4] is not launch.adapter for c in copies):
        return  # a copy by another library than the launch's: a hit would make it on that library's stream
    e = _express.entry_from(launch, views, given, new, call, shaped, sig[2], outs, copies)
    e.last = (sig[0][0], "legacy")  # the signature starts with the primitive's name
    _express.entries.put(sig[0], e)


def _remember_outputs(p: Primitive, sig: Any, launch: Any, views: dict[str, Any], kwargs: Mapping[str, Any],
                      call: Call, shaped: bool = False, outs: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """Record a call whose outputs went straight to cuDNN: the ``out=`` arrays in keyword order (the order
    :func:`~cudnnkit.ops._express.signature` read their pointers in), the rest as allocated (``outs``: the output
    views before the form ran, which may have swapped in temporaries it writes through)."""
    cv = dict(call.views, **outs) if outs else call.views
    outnames = p._outnames  # type: ignore[attr-defined]
    given = [k for k, v in kwargs.items() if v is not None and k in outnames]
    if any(k not in cv or cv[k].owner is not kwargs[k] or cv[k].stream is not None for k in given):
        return  # an out= written through a temporary, or one the call does not have
    new = [(o.name, cv[o.name]) for o in p.outputs if kwargs.get(o.name) is None and o.name in cv]
    _remember(sig, launch, views, given, new, call, shaped, cv)


def _fire_graph(p: Primitive, e: Any, ptrs: list[int], kwargs: Mapping[str, Any]) -> Any:
    """An express hit on the graph path with nothing but pointers to bind: the entry's plan, this call's pointers
    in the plan's order, the new outputs and a workspace from the arrays' allocator, ``cudnnBackendExecute``.
    Returns MISSING (nothing done) when a pointer is not 16-byte aligned or an allocation fails: :func:`_fire`
    then takes the call (it copies, falls back and names what failed)."""
    plan = e.graph_form[0]
    dev, ad = e.device, e.adapter
    made: list[Any] = []
    made_ptrs: list[int] = []
    try:
        for _, shape, dtype, strides, vad in e.new:
            arr = vad.empty(shape, dtype, dev, strides)
            made.append(arr)
            made_ptrs.append(pointer(arr, vad))
        for _, shape, dtype, strides in e.fresh:  # extras the graph writes (saved statistics): made anew
            arr = ad.empty(shape, dtype, dev, strides)
            made.append(arr)
            made_ptrs.append(pointer(arr, ad))
        call_ptrs = [ptrs[i] if i >= 0 else made_ptrs[-1 - i] for i in e.order]
        low = 0
        for q in call_ptrs:
            low |= q
        if low & 15:
            return MISSING
        stream = ad.current_stream(dev)
        ws = None
        ws_ptr = 0
        if plan.workspace_size:
            ws = ad.empty((plan.workspace_size,), "uint8", dev)  # on the current stream, just read
            ws_ptr = pointer(ws, ad)
    except MemoryError:
        return MISSING
    e.hits += 1
    h = get_handle(dev, stream, ad)
    if _multi_device(ad) and ad.current_device() != dev:
        with ad.device_guard(dev):
            plan.execute_raw(h.ptr, call_ptrs, ws_ptr)
    else:
        plan.execute_raw(h.ptr, call_ptrs, ws_ptr)
    del ws  # the allocator's stream-ordered free follows the queued work
    _last.path = (p.name, "graph")
    ret = e.returns
    if ret is None:  # each output's and extra's place among the arrays made (None: a given output, or no extra)
        at = {n[0]: k for k, n in enumerate((*e.new, *e.fresh))}
        ret = e.returns = tuple((at.get(o.name), o.name) for o in p.outputs) + tuple(
            (at.get(n), None) for n in p.extras
        )
    res = [made[k] if k is not None else (kwargs.get(name) if name else None) for k, name in ret]
    return res[0] if len(res) == 1 else tuple(res)


def _copy_inputs(e: Any, ptrs: list[int], arrays: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """The copies entry ``e`` records (:func:`~cudnnkit.runtime.prepare`'s, of inputs cuDNN cannot take as they
    are: an expanded gradient; into the call's one layout), made again by the launch's library (the only copies
    recorded) on its current stream, the call's, in the strides the first call chose: this call's
    pointers with the copies' in place, and the copies by name (alive until the call is queued; the allocator's
    stream-ordered free follows the queued work)."""
    ptrs = list(ptrs)
    made = {}
    for name, shape, dtype, strides, ad in e.copies:
        arr = made[name] = ad.empty(shape, dtype, e.device, strides)
        ad.copy(arr, arrays[name])
        ptrs[e.index[name]] = pointer(arr, ad)
    return ptrs, made


def _fire(p: Primitive, e: Any, ptrs: list[int], arrays: Mapping[str, Any], kwargs: Mapping[str, Any],
          fast: bool = True) -> Any:  # fmt: skip
    """A call on the express path (:mod:`cudnnkit.ops._express`): entry ``e``'s templates with this call's
    pointers, its new outputs allocated, then ``check_plan`` and the form the first call took, as :func:`run`
    makes them (the legacy call directly: its router decision is the entry's)."""
    made = None
    if e.copies:
        ptrs, made = _copy_inputs(e, ptrs, arrays)
    if e.fast and fast:  # (fast False: the caller's own _fire_graph just returned MISSING)
        got = _fire_graph(p, e, ptrs, kwargs)
        if got is not MISSING:
            return got
    e.hits += 1
    dev, ad = e.device, e.adapter
    launch = Launch(dev, ad, ad.current_stream(dev), e.inputs)
    n_in = len(e.views) - e.given
    operands: dict[str, Any] = dict.fromkeys(e.absent) if e.absent else {}
    views = operands
    for i, (name, shape, strides, dtype, vad) in enumerate(e.views):
        if i == n_in:
            views = dict(operands)  # the given outputs join the call's views, not the operands check_plan sees
        owner = (made[name] if made and name in made else arrays[name]) if i < n_in else kwargs[name]
        views[name] = ArrayView(shape, strides, dtype, dev, ptrs[i], owner, vad)
    call = Call(launch, operands, e.resolved, e.desc, e.description, e.alpha, e.beta, e.blends, {}, arrays)
    if p.check_plan is not None and not e.shaped:
        p.check_plan(call)
    results = {}
    if e.new or e.given:
        views = dict(views) if views is operands else views
        for name, shape, dtype, strides, vad in e.new:
            try:
                arr = vad.empty(shape, dtype, dev, strides)
            except MemoryError:
                launch.empty(shape, dtype, strides, name=name)  # raises, naming the output and its size
                raise
            results[name] = arr
            views[name] = ArrayView(shape, strides, dtype, dev, pointer(arr, vad), arr, vad)
        for name, *_ in e.views[n_in:]:
            results[name] = kwargs[name]
    call.views = views
    if e.path == "graph":
        call.extra["graph_key"] = e.graph_key
        if e.graph_form is not None and not e.fresh:  # fresh extras: the whole form runs and makes them
            call.extra["graph_form"] = e.graph_form
        _launch_form(p, call, e.path, e.graph_key)
    else:
        if _multi_device(ad) and ad.current_device() != dev:
            with ad.device_guard(dev):
                p.legacy(call)  # type: ignore[misc]
        else:
            p.legacy(call)  # type: ignore[misc]
        _last.path = e.last
    if not p.outputs:
        return arrays[p.returns or p.inputs[0].name]
    if e.shaped:  # the extras, if any, are what the form made again (graph forms: see _run_shaped)
        got = [results.get(o.name) for o in p.outputs] + [call.extra.get(n) for n in p.extras]
        return got[0] if len(got) == 1 else tuple(got)
    if not p.extras and len(p.outputs) == 1:
        return results.get(p.outputs[0].name)
    return _returned(p, results, call.extra)
