"""Running fuzz cases: in this process (the CPU tier) or in a long-lived worker subprocess (the GPU tier).

:func:`execute` runs one case: it makes the arguments (:class:`Ctx`), runs the op's setup, calls the op, syncs,
classifies what happened (:mod:`.outcome`) and, for a call that returned, checks the result against the op's
reference. The GPU tier runs :func:`execute` in a :class:`Worker`: a process started with ``spawn`` that runs one
case at a time, synchronizes the device after it and runs a sanity op (a tiny softmax checked against NumPy). If
the worker dies (a segfault, an abort) or hangs, or the sanity op fails (an illegal memory access leaves the CUDA
context unusable), the case is recorded as a CRASH and a fresh worker takes the next case.

``python -m tests.fuzz.runner --cases 10000 --json out.json`` (what ``scripts/fuzz`` runs) prints one summary line::

    fuzz: 10000 cases, 0 crashes, 0 wrong results, 0 unclear errors (N clear refusals, M correct results) in T s
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .materialize import FakeBackend, GpuBackend, ReachedDevice, logical
from .model import A, Case, Opaque, Rnn, Setup, State, Weights
from .outcome import CLEAR, CORRECT, CRASH, REACHED, UNCLEAR, WRONG, Outcome, classify, unclear_class

__all__ = ["Ctx", "execute", "Worker", "run_cases", "Summary", "make_backend", "main", "DIAGNOSTICS"]


#: float dtypes from least to most precise (the tolerance a case is checked at follows its least precise array)
_PRECISION = {"float8_e5m2": 0, "float8_e4m3fn": 1, "bfloat16": 2, "float16": 3, "float32": 4, "float64": 5}


class _Deferred:
    """A value built inside the call (its exception is the call's outcome): an ``RNN`` or a ``DropoutState``."""

    def __init__(self, build):
        self.build = build


# ----------------------------------------------------------------- one case


class Ctx:
    """A case's materialized arguments, and what a spec's ``check`` asks of them."""

    def __init__(self, case: Case, spec: Any, backend: Any):
        self.case, self.spec, self.backend = case, spec, backend
        self.gpu = backend.gpu
        self.objs: dict[str, Any] = {}
        self.hostv: dict[str, np.ndarray] = {}
        self.setup_values: dict[str, Any] = {}
        self.keep: list[Any] = []
        self.rnn: Any = None
        self._weights: dict[int, Any] = {}
        #: other names an argument goes by in messages (a graph binding's tensor label)
        self.aliases: dict[str, tuple[str, ...]] = {}

    # ------------------------------------------------------------- making arguments

    @property
    def dtype(self) -> str:
        """The case's compute dtype: the setup's, or the least precise float dtype of its arrays when a mutation
        gave one of them a lower precision (a float16 ``x`` in a float64 case is checked at float16's tolerance)."""
        base = self.case.setup.get("dtype", "float32")
        worst = base
        for v in self.case.kwargs.values():
            if isinstance(v, A) and _PRECISION.get(v.dtype, 99) < _PRECISION.get(worst, 99):
                worst = v.dtype
        return worst

    def _rng(self, a: A, name: str) -> np.random.Generator:
        return np.random.default_rng([a.seed & 0xFFFFFFFF, self.case.seed & 0xFFFFFFFF, sum(map(ord, name))])

    def make(self, a: A, name: str = "extra") -> Any:
        """A backend array for ``a`` (its logical values kept as ``hostv[name]``)."""
        v = None
        if a.size > 2**24 or any(d > 2**24 for d in a.shape):  # a huge dim (the CPU fakes only): no values
            return self.backend.array(a, None, self.case.lib, self.case.other)
        if a.fill.startswith("derived:"):
            v = self._derived(a)
        v = logical(a.with_(fill="normal") if a.fill.startswith("derived:") else a, self._rng(a, name), v)
        if name != "extra":
            self.hostv[name] = v
        return self.backend.array(a, v, self.case.lib, self.case.other)

    def _derived(self, a: A) -> np.ndarray | None:
        key = a.fill.partition(":")[2]
        try:
            with np.errstate(all="ignore"):  # a mutated parameter may make the reference NaN: it is not checked
                v = self.spec.derive(self, key, a) if self.spec.derive else None
        except Exception:  # e.g. no grid away from integer positions: random values instead
            v = None
        if v is not None and np.shape(v) != tuple(max(s, 0) for s in a.shape):
            return None
        return v

    def _value(self, v: Any, name: str, stage: int) -> Any:
        """Materialize ``v``; stage 0: plain arrays, 1: derived arrays, 2: weights/setup/opaque."""
        if isinstance(v, A):
            derived = v.fill.startswith("derived:")
            if (stage == 0 and not derived) or (stage == 1 and derived):
                return self.make(v, name)
            return v
        if isinstance(v, Weights):
            return self.weights_for(v, name) if stage == 2 else v
        if isinstance(v, Setup):
            return self.setup_values[v.key] if stage == 3 else v
        if isinstance(v, Opaque):
            return self.backend.opaque(v, self, name) if stage == 3 else v
        if isinstance(v, Rnn):
            if stage != 3:
                return v
            return _Deferred(lambda f=dict(v.fields): self._build_rnn(f))
        if isinstance(v, State):
            if stage != 3:
                return v
            return _Deferred(lambda s=v: self._build_state(s))
        if isinstance(v, dict):
            return {k: self._value(x, f"{name}[{k!r}]", stage) for k, x in v.items()}
        if isinstance(v, list):
            return [self._value(x, f"{name}[{i}]", stage) for i, x in enumerate(v)]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(self._value(x, f"{name}[{i}]", stage) for i, x in enumerate(v))
        return v

    def _build_rnn(self, fields: dict) -> Any:
        from cudnnkit import ops

        self.rnn = ops.RNN(**fields)
        return self.rnn

    def _build_state(self, s: State) -> Any:
        from cudnnkit import ops

        like = self.make(s.like)
        if self.gpu:
            return ops.DropoutState(like, s.seed)
        # the CPU fakes cannot run cudnnSetDropoutDescriptor: a state as it would be, whose first use is gated
        st = object.__new__(ops.DropoutState)
        st.device, st.adapter, st.nbytes, st.p, st.seed = 0, self.backend.adapters["fakeA"], 1024, 0.0, s.seed
        st.states, st._ptr, st.desc = like, self.backend.alloc(1024), None
        return st

    def prepare(self) -> None:
        kw = self.objs = dict(self.case.kwargs)  # filled in place: derived values see the arguments made before
        for k, v in kw.items():
            kw[k] = self._value(v, k, 0)
        # derived arrays whose inputs exist first (pooling's derived x before the y derived from it), then the rest
        for k, v in kw.items():
            if isinstance(v, A) and v.fill.startswith("derived:") and self._derived(v) is not None:
                kw[k] = self._value(v, k, 1)
        for k, v in kw.items():
            kw[k] = self._value(v, k, 1)
        for k, v in kw.items():
            kw[k] = self._value(v, k, 2)
        if self.spec.setup is not None:
            self.spec.setup(self)
        for k, v in kw.items():
            kw[k] = self._value(v, k, 3)

    def valid_arg(self, name: str) -> bool:
        """Whether argument ``name`` is as the valid call had it (no mutation targets it)."""
        return name in self.case.kwargs and all(m.target != name for m in self.case.mutations)

    def weights(self, rnn: Any, like: Any, w: Weights | None = None) -> Any:
        """The flat weight buffer for ``rnn``: ``weight_count`` elements (plus ``w.delta``) of random values."""
        w = w or Weights()
        key = id(w)
        if key in self._weights:
            return self._weights[key]
        dtype = w.dtype or rnn.dtype
        if self.gpu:
            n = rnn.weight_count(like)
        else:
            from .specs import torch_shapes

            f = self.case.setup["rnn"]
            n = sum(math.prod(s) for s in torch_shapes({**f, "bias_mode": "double"}).values())
        n = max(n + w.delta, 0)
        a = A((n, 1) if w.ndim2 else (n,), dtype, fill="normal:0.3", layout=w.layout, seed=w.seed)
        obj = self.make(a, "w")
        self._weights[key] = obj
        return obj

    def weights_for(self, w: Weights, name: str) -> Any:
        from cudnnkit import ops

        rnn = self.setup_values.get("rnn") or ops.RNN(**self.case.setup["rnn"])
        self.setup_values["rnn"] = rnn
        like = self._like()
        obj = self.weights(rnn, like, w)
        self.hostv[name] = self.hostv.get("w")
        return obj

    def _like(self) -> Any:
        like = self.backend.array(A((1,), self.case.setup["rnn"]["dtype"]), np.zeros(1), self.case.lib, None)
        self.keep.append(like)
        return like

    def finalize(self) -> tuple[list[Any], dict[str, Any]]:
        """(positional args, keyword args) of the call; deferred values are built here, inside the call. After a
        missing positional argument the later ones go by keyword (so Python names the missing one)."""
        for k, v in list(self.objs.items()):
            if isinstance(v, _Deferred):
                self.objs[k] = v.build()
        args = []
        for name in self.case.positional:
            if name not in self.objs:
                break
            args.append(self.objs[name])
        passed = set(self.case.positional[: len(args)])
        return args, {k: v for k, v in self.objs.items() if k not in passed}

    def call_args(self) -> list[Any]:
        return self._call[0]

    def call_kwargs(self) -> dict[str, Any]:
        return self._call[1]

    def call_kwargs_with_args(self) -> dict[str, Any]:
        return dict(self.objs)

    # ------------------------------------------------------------- what checks ask

    def arg(self, name: str, default: Any = None) -> Any:
        return self.objs.get(name, default)

    def param(self, name: str, default: Any = None) -> Any:
        return self.objs.get(name, default)

    def x(self, name: str) -> np.ndarray | None:
        return self.hostv.get(name)

    def rnn_used(self) -> Any:
        return self.rnn or self.setup_values.get("rnn")

    def got(self, obj: Any) -> np.ndarray | None:
        if obj is None:
            return None
        return self.backend.to_host(obj)

    def shape_of(self, obj: Any) -> tuple[int, ...] | None:
        return self.backend.shape_of(obj)

    def strides_of(self, obj: Any) -> tuple[int, ...] | None:
        from cudnnkit.runtime import as_view

        try:
            return as_view(obj, "out").strides
        except Exception:
            return None

    def blend(self, ref: np.ndarray, out: str, alpha: str, beta: str) -> np.ndarray:
        from .specs import fnum

        a, b = fnum(self.param(alpha, 1.0), 1.0), fnum(self.param(beta, 0.0), 0.0)
        res = a * ref
        if b != 0 and out in self.hostv:
            res = res + b * self.hostv[out]
        return res

    def compare_shape(self, obj: Any, shape: tuple[int, ...], what: str) -> list[str]:
        if obj is None:
            return [f"{what} is None"]
        got = self.shape_of(obj)
        if got is not None and tuple(got) != tuple(shape):
            return [f"{what} has shape {tuple(got)}, expected {tuple(shape)}"]
        return []

    def compare(self, obj: Any, ref: np.ndarray | None, dtype: str, what: str, tol: float | None, *,
                shape: tuple[int, ...] | None = None, mask: np.ndarray | None = None,
                inplace: str | None = None) -> list[str]:  # fmt: skip
        """Problems with output ``obj`` against the float64 reference ``ref`` (shape, then values)."""
        want = tuple(ref.shape) if ref is not None else shape
        problems = self.compare_shape(obj, want, what) if want is not None else []
        if problems:
            return problems
        got = self.got(obj)
        if got is None:
            return []
        return self.compare_values(got, ref, dtype, what, tol, mask)

    def compare_values(self, got: np.ndarray, ref: np.ndarray | None, dtype: str, what: str, tol: float | None,
                       mask: np.ndarray | None = None) -> list[str]:  # fmt: skip
        got = np.asarray(got, np.float64)
        if ref is None:
            return [f"{what} holds NaN"] if np.isnan(got).any() else []
        ref = np.asarray(ref, np.float64)
        if got.shape != ref.shape:
            return [f"{what} has shape {got.shape}, expected {ref.shape}"]
        if mask is not None:
            got = np.where(mask, got, 0.0)
        fin = np.isfinite(ref)
        bad = ~np.isfinite(got) & fin
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            return [f"{what}: {int(bad.sum())} non-finite values where the reference is finite (at {i}: {got[i]})"]
        if (~fin).any() and not np.array_equal(got[~fin], ref[~fin], equal_nan=True):
            return [f"{what}: non-finite reference values not matched"]
        if tol is None or not fin.any():
            return []
        diff = got[fin] - ref[fin]
        norm = float(np.linalg.norm(ref[fin]))
        err = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.abs(diff).max())
        if err > tol:
            i = int(np.argmax(np.abs(diff)))
            return [
                f"{what}: relative error {err:.3g} > {tol:g} ({dtype}; worst element {got[fin][i]!r} vs {ref[fin][i]!r})"
            ]
        return []


def _resolve(name: str) -> Any:
    """The public callable an op description is named after: ``cudnnkit.ops.<name>``, ``Graph`` or a ``Graph``
    method (``"Graph.pointwise"``)."""
    import cudnnkit.ops as ops
    from cudnnkit.graph import Graph

    if name == "Graph":
        return Graph
    if name.startswith("Graph."):
        return getattr(Graph, name.partition(".")[2])
    return getattr(ops, name)


def call_names(case: Case) -> tuple[str, ...]:
    """Every argument name of the call (and of the function's signature), and the names they may go by."""
    import inspect

    names = list(case.kwargs)
    try:
        names += list(inspect.signature(_resolve(case.op)).parameters)
    except (AttributeError, TypeError, ValueError):
        pass
    names += [k.removesuffix("_dims").removesuffix("_strides").removesuffix("_dtype") for k in case.kwargs]
    if case.op.startswith("Graph"):
        names += ["tensor", "uid", "bindings", "graph", "device"]
    return tuple(dict.fromkeys(names))


@dataclass
class Record:
    """The result of one case (what a worker sends back)."""

    index: int
    op: str
    lib: str
    kind: str
    reason: str = ""
    detail: str = ""
    exc_type: str = ""
    where: str = ""
    repro: str = ""
    seconds: float = 0.0
    poisoned: str = ""
    expect: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.kind in (UNCLEAR, CRASH, WRONG)

    def klass(self) -> str:
        return unclear_class(self.op, Outcome(self.kind, self.reason, self.detail, self.exc_type, self.where))


def execute(case: Case, backend: Any) -> Record:
    """Run ``case`` on ``backend`` in this process and classify the outcome."""
    if case.op in DIAGNOSTICS:
        return DIAGNOSTICS[case.op](case, backend)
    from .specs import SPECS

    spec = SPECS[case.op]
    t0 = time.perf_counter()
    ctx = Ctx(case, spec, backend)
    rec = Record(case.index, case.op, case.lib, CORRECT, repro=case.repro(), expect=case.expect(backend.gpu))
    try:
        ctx.prepare()
    except Exception as e:
        rec.kind, rec.reason = UNCLEAR, f"fuzzer setup failed ({type(e).__name__})"
        rec.detail = "".join(traceback.format_exception_only(type(e), e)).strip()[:600]
        rec.where = _where(e)
        rec.seconds = time.perf_counter() - t0
        return rec
    exc = result = None
    try:
        ctx._call = ctx.finalize()
        if spec.call is not None:
            result = spec.call(ctx)
        else:
            args, kwargs = ctx._call
            result = _resolve(case.op)(*args, **kwargs)
        backend.sync()
    except BaseException as e:  # noqa: BLE001 - every outcome is classified
        if isinstance(e, KeyboardInterrupt):
            raise
        exc = e
    arrays = tuple(n for n, v in case.kwargs.items() if isinstance(v, (A, Weights, Setup)))
    out = classify(case, exc, gpu=backend.gpu, call_names=call_names(case), arrays=arrays, aliases=ctx.aliases)
    huge = any(isinstance(v, A) and any(d > 2**24 for d in v.shape) for v in case.kwargs.values())
    if out.kind == CORRECT and not huge:  # (a fake array with a huge dim has no values to check against)
        try:
            problems = spec.check(ctx, result) if spec.check is not None else []
        except Exception as e:
            problems = [f"the check failed: {type(e).__name__}: {e}"]
            out.where = _where(e)
        if problems:
            out = Outcome(WRONG, problems[0][:200], "; ".join(problems)[:1000], where=out.where)
    rec.kind, rec.reason, rec.detail, rec.exc_type, rec.where = (
        out.kind,
        out.reason,
        out.detail,
        out.exc_type,
        out.where,
    )
    rec.extra = out.extra
    rec.seconds = time.perf_counter() - t0
    return rec


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno} {tb[-1].name}" if tb else ""


# ----------------------------------------------------------------- diagnostics (the worker machinery's own tests)


def _diag_ok(case: Case, backend: Any) -> Record:
    return Record(case.index, case.op, case.lib, CORRECT, repro=case.repro())


def _diag_segfault(case: Case, backend: Any) -> Record:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError("unreachable")


def _diag_hang(case: Case, backend: Any) -> Record:
    time.sleep(3600)
    raise AssertionError("unreachable")


def _diag_poison(case: Case, backend: Any) -> Record:
    os.environ["CUDNNKIT_FUZZ_POISONED"] = "1"  # the sanity op then fails, as after an illegal memory access
    return Record(case.index, case.op, case.lib, CORRECT, repro=case.repro())


def _diag_pid(case: Case, backend: Any) -> Record:
    return Record(case.index, case.op, case.lib, CORRECT, repro=case.repro(), detail=str(os.getpid()))


DIAGNOSTICS = {
    "__ok__": _diag_ok,
    "__segfault__": _diag_segfault,
    "__hang__": _diag_hang,
    "__poison__": _diag_poison,
    "__pid__": _diag_pid,
}


# ----------------------------------------------------------------- backends and the sanity op


def make_backend(spec: dict[str, Any]) -> Any:
    if spec.get("backend", "gpu") == "fake":
        return FakeBackend()
    return GpuBackend(tuple(spec["libs"]))


def sanity(backend: Any, lib: str) -> str:
    """'' if a tiny softmax still computes right after the case, else what went wrong."""
    from cudnnkit import ops

    if os.environ.get("CUDNNKIT_FUZZ_POISONED"):
        return "the context is poisoned (diagnostic)"
    x = np.array([[0.5, -1.0, 2.0, 0.0, 1.0], [3.0, 1.0, -2.0, 0.5, 0.25]], np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    try:
        if not backend.gpu:
            from .materialize import FakeArray

            try:
                ops.softmax_forward(FakeArray((2, 5), "float32", (5, 1), backend.alloc(40), "fakeA"))
            except ReachedDevice:
                return ""
            return "the fake softmax did not reach the gate"
        backend.sync()
        ad = backend.adapters.get(lib) or next(iter(backend.adapters.values()))
        y = ops.softmax_forward(ad.from_numpy(x, 0))
        got = ad.to_numpy(y)
        backend.sync()
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            return f"sanity softmax gave {got.tolist()}"
    except Exception as e:  # noqa: BLE001
        return f"sanity softmax failed: {type(e).__name__}: {str(e)[:300]}"
    return ""


def _serve(conn: Any, backend_spec: dict[str, Any]) -> None:
    """The worker's loop: run each case it is sent, sync, run the sanity op, send the record back."""
    if backend_spec.get("sys_path"):
        sys.path[:0] = [p for p in backend_spec["sys_path"] if p not in sys.path]
    import cudnnkit  # noqa: F401

    backend = make_backend(backend_spec)
    backend.install()
    try:
        from . import specs  # noqa: F401  (import once, before the first case is timed)

        conn.send(("ready", os.getpid()))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "stop":
                return
            case = msg[1]
            rec = execute(case, backend)
            rec.poisoned = sanity(backend, case.lib if case.lib in getattr(backend, "adapters", {}) else "")
            conn.send(("done", rec))
    finally:
        backend.uninstall()


_SIGNALS = {getattr(signal, n): n for n in dir(signal) if n.startswith("SIG") and not n.startswith("SIG_")}


class Worker:
    """A long-lived worker subprocess (``spawn``) running cases one at a time."""

    def __init__(self, backend_spec: dict[str, Any], *, timeout: float = 120.0, start_timeout: float = 300.0):
        ctx = mp.get_context("spawn")
        self.timeout = timeout
        self.conn, child = ctx.Pipe()
        spec = dict(backend_spec, sys_path=list(sys.path))
        self.proc = ctx.Process(target=_serve, args=(child, spec), daemon=True, name="cudnnkit-fuzz-worker")
        self.proc.start()
        child.close()
        if not self.conn.poll(start_timeout):
            self.kill()
            raise RuntimeError("the fuzz worker did not start")
        try:
            _, self.pid = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            raise RuntimeError(f"the fuzz worker died while starting (exit code {self.proc.exitcode})") from None

    def run(self, case: Case) -> Record:
        """The record of ``case``; a crash or a hang kills this worker (start another)."""
        t0 = time.perf_counter()
        try:
            self.conn.send(("case", case))
            if not self.conn.poll(self.timeout):
                self.kill()
                return self._crash(case, f"hang: no answer in {self.timeout:g} s", t0)
            _, rec = self.conn.recv()
            return rec
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.proc.join(10)
            code = self.proc.exitcode
            how = f"signal {_SIGNALS.get(-code, -code)}" if code is not None and code < 0 else f"exit code {code}"
            return self._crash(case, f"the worker died ({how})", t0)

    def _crash(self, case: Case, reason: str, t0: float) -> Record:
        return Record(case.index, case.op, case.lib, CRASH, reason, reason, repro=case.repro(),
                      seconds=time.perf_counter() - t0)  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop",))
            except OSError:
                pass
            self.proc.join(10)
        self.kill()
        self.conn.close()


# ----------------------------------------------------------------- many cases


@dataclass
class Summary:
    backend: str
    records: list[Record]
    seconds: float
    restarts: int = 0

    def count(self, kind: str) -> int:
        return sum(1 for r in self.records if r.kind == kind)

    @property
    def failures(self) -> list[Record]:
        return [r for r in self.records if r.failed]

    def line(self) -> str:
        n = len(self.records)
        ok = self.count(CORRECT) + self.count(REACHED)
        s = (
            f"fuzz: {n} cases, {self.count(CRASH)} crashes, {self.count(WRONG)} wrong results, "
            f"{self.count(UNCLEAR)} unclear errors ({self.count(CLEAR)} clear refusals, {ok} correct results) "
            f"in {self.seconds:.0f} s"
        )
        if self.backend == "fake":
            s += f" [CPU fakes: {self.count(REACHED)} of the correct ones stopped at the device gate]"
        return s

    def classes(self) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = {}
        for r in self.failures:
            out.setdefault(r.klass(), []).append(r)
        return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))

    def report(self, limit: int = 40) -> str:
        """The failing classes, largest first, each with a count and one repro."""
        lines = [self.line()]
        for k, recs in list(self.classes().items())[:limit]:
            r = recs[0]
            lines.append(f"- [{len(recs)}] {k}\n    {r.repro}\n    -> {r.detail[:300]}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": {
                "line": self.line(),
                "cases": len(self.records),
                "crashes": self.count(CRASH),
                "wrong_results": self.count(WRONG),
                "unclear_errors": self.count(UNCLEAR),
                "clear_refusals": self.count(CLEAR),
                "correct_results": self.count(CORRECT) + self.count(REACHED),
                "seconds": round(self.seconds, 1),
                "backend": self.backend,
                "worker_restarts": self.restarts,
                "per_op": dict(Counter(r.op for r in self.records)),
            },
            "classes": {
                k: {"count": len(v), "repro": v[0].repro, "detail": v[0].detail} for k, v in self.classes().items()
            },
            "failures": [
                {
                    "index": r.index,
                    "op": r.op,
                    "lib": r.lib,
                    "kind": r.kind,
                    "reason": r.reason,
                    "detail": r.detail,
                    "exception": r.exc_type,
                    "where": r.where,
                    "repro": r.repro,
                }  # fmt: skip
                for r in self.failures
            ],
        }


def run_cases(cases: Iterable[Case], backend_spec: dict[str, Any], *, timeout: float = 120.0,
              progress: Any = None, in_process: bool = False) -> Summary:  # fmt: skip
    """Run every case in a worker subprocess (restarted after a crash or a poisoned context)."""
    t0 = time.perf_counter()
    records: list[Record] = []
    restarts = 0
    if in_process:
        backend = make_backend(backend_spec)
        with backend.installed():
            for case in cases:
                records.append(execute(case, backend))
        return Summary(backend_spec.get("backend", "gpu"), records, time.perf_counter() - t0)
    worker = Worker(backend_spec, timeout=timeout)
    try:
        for i, case in enumerate(cases):
            if worker is None:
                worker = Worker(backend_spec, timeout=timeout)
                restarts += 1
            rec = worker.run(case)
            if rec.kind != CRASH and rec.poisoned:
                rec = Record(rec.index, rec.op, rec.lib, CRASH, f"context poisoned after the call: {rec.poisoned}",
                             f"{rec.kind} {rec.reason} {rec.detail}"[:600], rec.exc_type, rec.where, rec.repro,
                             rec.seconds)  # fmt: skip
            if rec.kind == CRASH:
                worker.kill()
                worker = None
            records.append(rec)
            if progress is not None:
                progress(i, rec)
    finally:
        if worker is not None:
            worker.close()
    return Summary(backend_spec.get("backend", "gpu"), records, time.perf_counter() - t0, restarts)


def gpu_libs() -> tuple[str, ...]:
    """The array libraries installed here that see a CUDA device."""
    out = []
    for name in ("cupy", "torch"):
        if importlib.util.find_spec(name) is None:
            continue
        try:
            from cudnnkit.runtime import adapters

            if adapters.get(name).device_count() > 0:
                out.append(name)
        except Exception:
            pass
    return tuple(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=2000, help="number of cases (default 2000)")
    p.add_argument("--seed", type=int, default=10, help="seed of the case generator (default 10)")
    p.add_argument("--json", help="write the summary and every failing case to this JSON file")
    p.add_argument("--backend", choices=("gpu", "fake"), default="gpu", help="gpu (default) or fake (CPU fakes)")
    p.add_argument("--libs", help="array libraries to alternate, e.g. cupy,torch (default: those with a GPU)")
    p.add_argument("--ops", help="only these ops (comma-separated names of tests/fuzz/specs.py)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one case may take before it is a hang")
    p.add_argument("--quiet", action="store_true", help="no progress and failure lines")
    a = p.parse_args(argv)
    from .strategies import generate

    if a.backend == "fake":
        libs: tuple[str, ...] = ("fakeA",)
        spec = {"backend": "fake"}
        gpu = False
    else:
        libs = tuple(a.libs.split(",")) if a.libs else gpu_libs()
        if not libs:
            print("fuzz: no array library sees a CUDA device (use --backend fake on a machine without one)")
            return 2
        spec = {"backend": "gpu", "libs": list(libs)}
        gpu = True
    ops = a.ops.split(",") if a.ops else None
    cases = generate(a.cases, a.seed, libs, gpu, ops)
    if not gpu:
        for c in cases:
            c.other = "fakeB"

    def progress(i: int, rec: Record) -> None:
        if a.quiet:
            return
        if rec.failed:
            print(f"  {rec.kind}: {rec.reason}: {rec.repro}\n    -> {rec.detail[:240]}", flush=True)
        if (i + 1) % 500 == 0:
            print(f"  ... {i + 1} cases", flush=True)

    summary = run_cases(cases, spec, timeout=a.timeout, progress=progress)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary.to_json(), f, indent=1)
    if not a.quiet and summary.failures:
        print(summary.report())
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
