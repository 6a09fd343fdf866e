"""One small call of every cudnnkit op family, forward and backward, for ``scripts/sanitize``.

Run as a program (not collected by pytest: no ``test_`` names)::

    python tests/gpu/sanitize_cases.py [--library cupy|torch] [--only NAME[,NAME...]] [--list] [--dry-run]

It runs every case once (or those named by ``--only``) for each library asked for (default: every one installed),
synchronizing after each case so that an error is reported against the case that caused it, prints one line per
case, and exits 0 when all passed, 3 when a case raised (compute-sanitizer's own ``--error-exitcode 1`` stays
distinguishable). Shapes are tiny: under compute-sanitizer kernels run 10-100 times slower.

``--allocator direct`` (the default) turns off the caching allocators (torch: ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``;
CuPy: ``cupy.cuda.set_allocator(None)``), so every array is its own ``cudaMalloc``: memcheck then sees a write
past an output's end (inside a pool the overflow lands in a neighbouring block and goes unseen), and initcheck
sees each new output as uninitialized until cuDNN writes it. ``--allocator pool`` keeps the pools.

``--dry-run`` needs no GPU: every array is a host-backed fake with ``__cuda_array_interface__``, every cudnnkit
call is checked against the real function's signature (``inspect.signature(...).bind``) instead of being made,
and graphs are built and validated on the host up to ``Graph.build``. It catches a case that would fail for a
reason other than the GPU (a renamed keyword, a wrong arity, a malformed graph).

The helpers :func:`find_compute_sanitizer` and :func:`error_summary` are shared with ``scripts/sanitize`` and
``tests/gpu/ctc_memcheck_probe.py``.
"""

from __future__ import annotations

import argparse
import glob
import inspect
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

#: exit status when a case raised (compute-sanitizer's --error-exitcode is 1)
CASE_FAILED = 3

# ----------------------------------------------------------------- compute-sanitizer helpers


def find_compute_sanitizer() -> tuple[str | None, list[str]]:
    """(path of compute-sanitizer or None, the places looked in).

    Order: ``$COMPUTE_SANITIZER``, ``PATH``, ``/usr/local/cuda*/bin`` (newest first), ``$CUDA_HOME/bin``,
    ``/opt/nvidia/**`` and the ``nvidia-cuda-sanitizer-api`` wheel of this interpreter.
    """
    looked: list[str] = []
    env = os.environ.get("COMPUTE_SANITIZER")
    if env:
        looked.append(f"$COMPUTE_SANITIZER={env}")
        if os.access(env, os.X_OK):
            return env, looked
    looked.append("PATH")
    found = shutil.which("compute-sanitizer")
    if found:
        return found, looked
    patterns = [
        *(f"{h}/bin/compute-sanitizer" for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if h),
        "/usr/local/cuda/bin/compute-sanitizer",
        "/usr/local/cuda*/bin/compute-sanitizer",
        "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
        "/opt/nvidia/**/compute-sanitizer",
        *(f"{p}/nvidia/*/compute-sanitizer/compute-sanitizer" for p in sys.path if p.endswith("site-packages")),
    ]
    for pat in patterns:
        looked.append(pat)
        hits = sorted(glob.glob(pat, recursive=True), reverse=True)  # cuda-13.1 before cuda-12.9
        for h in hits:
            if os.path.isfile(h) and os.access(h, os.X_OK):
                return h, looked
    return None, looked


_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_RACE = re.compile(r"=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
#: the first line of each report compute-sanitizer prints (memcheck, racecheck, initcheck, synccheck)
_REPORT = re.compile(
    r"=+\s+(Invalid |Misaligned |Uninitialized |Unused memory|Race reported|Error: Race|Warning: Race|"
    r"Error: Potential |Warning: Potential |"
    r"Program hit |Barrier error|Out-of-range|Malformed|Cuda API error|Leaked |Target application returned)"
)


def error_summary(log: str) -> dict[str, Any]:
    """What a compute-sanitizer log says: ``errors`` (the sum over its ``ERROR SUMMARY`` lines, one per target
    process, or over racecheck's ``RACECHECK SUMMARY`` error counts when it printed only those; None if there is
    none: the run was killed or the tool failed to start), ``processes`` (how many
    summaries), ``race_warnings`` (racecheck's warning count, not part of ``errors``) and ``first`` (up to 5
    distinct report lines, ``=`` prefix stripped)."""
    counts = [int(m.group(1)) for m in _SUMMARY.finditer(log)]
    races = list(_RACE.finditer(log))
    warnings = sum(int(m.group(3)) for m in races)
    if not counts and races:
        # with --racecheck-report hazard, racecheck ends with its own summary line and no ERROR SUMMARY
        counts = [int(m.group(2)) for m in races]
    first: list[str] = []
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if _REPORT.match(line):
            text = line.lstrip("= ").strip()
            # the kernel (or API call) is on one of the next lines: "=========     at kernel_name(...)+0x1f0"
            where = next((n.lstrip("= ").strip() for n in lines[i + 1 : i + 4] if n.lstrip("= ").startswith("at ")), "")
            if not where:  # racecheck: "Write Thread (0,0,0) at kernel+0x3f80"
                where = next(("at " + n.split(" at ", 1)[1] for n in lines[i + 1 : i + 3] if " Thread " in n), "")
            if where:
                text += " " + where.split("(")[0].split("+0x")[0]
            if text not in first:
                first.append(text)
            if len(first) == 5:
                break
    return {
        "errors": sum(counts) if counts else None,
        "processes": len(counts),
        "race_warnings": warnings,
        "first": first,
    }


# ----------------------------------------------------------------- arrays and calls, real or dry


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _dry_dtype(name: str) -> np.dtype:
    """``np_dtype``, or float32 for bfloat16 where ml_dtypes is missing (a fake's dtype is never read)."""
    try:
        return np_dtype(name)
    except ImportError:
        return np.dtype(np.float32)


class FakeArray:
    """A host-backed stand-in for a device array (``--dry-run``): shape, dtype, strides, slicing and a CAI."""

    def __init__(self, a: np.ndarray):
        self.a = a

    @property
    def shape(self) -> tuple[int, ...]:
        return self.a.shape

    @property
    def dtype(self) -> np.dtype:
        return self.a.dtype

    def __getitem__(self, key: Any) -> FakeArray:
        return FakeArray(self.a[key])

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.a.shape,
            "typestr": self.a.dtype.str,
            "strides": self.a.strides,
            "data": (max(self.a.ctypes.data, 1), False),
            "version": 3,
        }


class FakeAdapter:
    """The adapter calls the cases use, on fakes."""

    name = "dry"

    def from_numpy(self, a: np.ndarray, device: int, stream: Any = None) -> FakeArray:
        return FakeArray(np.ascontiguousarray(a))

    def empty(self, shape, dtype: str, device: int, strides=None, stream: Any = None) -> FakeArray:
        return FakeArray(np.zeros(tuple(shape), _dry_dtype(dtype)))

    def synchronize(self, device: int) -> None:
        pass


class Dry:
    """What a dry call returns where the real one returns an object (a plan, a dropout state): its methods are
    checked against ``cls``'s signatures when called through :meth:`Ctx.call`."""

    def __init__(self, cls: type, what: str = ""):
        self.cls, self.what = cls, what

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return DryMethod(getattr(self.cls, name), f"{self.cls.__name__}.{name}")


class DryMethod:
    def __init__(self, fn: Callable, name: str):
        self.fn, self.__name__ = fn, name


def _arity(name: str, bound: inspect.BoundArguments) -> int | None:
    """How many values a cudnnkit function returns, where it returns a tuple."""
    a = bound.arguments
    table: dict[str, Any] = {
        "dropout_forward": 2,
        "divisive_normalization_backward": 2,
        "grid_sample_backward": 2,
        "ctc_loss": 2,
        "rnn_backward": 4,
        "rnn_forward": 4 if a.get("training") else 3,
    }
    return table.get(name)


class Ctx:
    """What a case gets: ``xp`` (the adapter), ``rng``, ``dev``/``empty`` for arrays, ``call`` for cudnnkit calls."""

    def __init__(self, xp: Any, dry: bool = False, seed: int = 0):
        self.xp, self.dry = xp, dry
        self.rng = np.random.default_rng(seed)
        self.calls = 0

    def dev(self, a: Any, dtype: str = "float32") -> Any:
        """``a`` (host values) on device 0 as ``dtype``."""
        dt = _dry_dtype(dtype) if self.dry else np_dtype(dtype)
        return self.xp.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=np.float64).astype(dt)), 0)

    def ints(self, a: Any, dtype: str = "int32") -> Any:
        return self.xp.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=dtype)), 0)

    def randn(self, shape, dtype: str = "float32", scale: float = 1.0) -> Any:
        return self.dev(self.rng.standard_normal(shape) * scale, dtype)

    def uniform(self, shape, lo: float, hi: float, dtype: str = "float32") -> Any:
        return self.dev(self.rng.uniform(lo, hi, shape), dtype)

    def empty(self, shape, dtype: str = "float32", strides=None) -> Any:
        return self.xp.empty(tuple(shape), dtype, 0, strides)

    def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; dry: the arguments bound to ``fn``'s signature and fakes returned."""
        self.calls += 1
        if not self.dry:
            return fn(*args, **kwargs)
        target = fn.fn if isinstance(fn, DryMethod) else fn
        sig = inspect.signature(target)
        if isinstance(fn, DryMethod):
            bound = sig.bind(None, *args, **kwargs)  # an unbound method: ``self`` is the Dry object
        else:
            bound = sig.bind(*args, **kwargs)
        name = getattr(fn, "__name__", "")
        if isinstance(target, type):
            return Dry(target)
        if name.endswith("weight_count"):
            return 96
        if name.endswith("build"):
            from cudnnkit.graph import ExecutionPlan

            fn.__self__.validate()  # the graph is well-formed (dangling tensors, dtypes): host-side
            return Dry(ExecutionPlan)
        n = _arity(name, bound)
        fake = FakeArray(np.zeros((1,), np.float32))
        return fake if n is None else tuple(fake for _ in range(n))

    def sync(self) -> None:
        self.xp.synchronize(0)


CASES: dict[str, Callable[[Ctx], None]] = {}


def case(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
    CASES[fn.__name__.removeprefix("case_")] = fn
    return fn


# ----------------------------------------------------------------- the cases (tiny shapes)


@case
def case_softmax(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((2, 5, 3, 4))
    for axis in (-1, 1):
        y = c.call(ops.softmax_forward, x, axis=axis)
        c.call(ops.softmax_backward, c.randn((2, 5, 3, 4)), y, axis=axis)
    y16 = c.call(ops.softmax_forward, c.randn((3, 7), "float16"))
    c.call(ops.softmax_backward, c.randn((3, 7), "float16"), y16)


@case
def case_log_softmax(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((3, 9))[:, ::3]  # gapped strides (the W1 class of the issue)
    y = c.call(ops.softmax_forward, x, log=True)
    c.call(ops.softmax_backward, c.randn((3, 3)), y, log=True)
    y = c.call(ops.softmax_forward, c.randn((2, 4, 3), "float64"), axis=1, log=True)
    c.call(ops.softmax_backward, c.randn((2, 4, 3), "float64"), y, axis=1, log=True)


@case
def case_dropout(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((2, 3, 4, 11))
    st = c.call(ops.DropoutState, x, 1234)
    y, reserve = c.call(ops.dropout_forward, x, 0.25, state=st)
    c.call(ops.dropout_backward, c.randn((2, 3, 4, 11)), reserve, 0.25, state=st)


@case
def case_lrn(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((2, 6, 4, 5))
    y = c.call(ops.lrn_forward, x, size=3)
    c.call(ops.lrn_backward, c.randn((2, 6, 4, 5)), y, x, size=3)


@case
def case_divisive_normalization(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((2, 3, 5, 6))
    c.call(ops.divisive_normalization_forward, x, size=3)
    c.call(ops.divisive_normalization_backward, c.randn((2, 3, 5, 6)), x, size=3)
    means = c.randn((2, 3, 5, 6), scale=0.1)
    c.call(ops.divisive_normalization_forward, x, means, size=3)
    c.call(ops.divisive_normalization_backward, c.randn((2, 3, 5, 6)), x, means, size=3)


@case
def case_affine_grid(c: Ctx) -> None:
    from cudnnkit import ops

    size = (2, 3, 5, 6)
    theta = c.dev(np.eye(2, 3)[None].repeat(2, 0) + c.rng.uniform(-0.2, 0.2, (2, 2, 3)))
    c.call(ops.affine_grid_forward, theta, size=size)
    c.call(ops.affine_grid_backward, c.randn((2, 5, 6, 2)), size=size)


@case
def case_grid_sample(c: Ctx) -> None:
    from cudnnkit import ops

    x = c.randn((2, 3, 5, 6))
    grid = c.uniform((2, 4, 7, 2), -1.1, 1.1)  # some points outside: the zero-padding path
    c.call(ops.grid_sample_forward, x, grid)
    c.call(ops.grid_sample_backward, x, grid, c.randn((2, 3, 4, 7)))


def _lstm(c: Ctx) -> tuple[Any, ...]:
    """A 2-layer bidirectional LSTM, T=4, N=3, variable lengths; weights random."""
    from cudnnkit.ops import RNN

    rnn = RNN("lstm", input_size=4, hidden_size=5, num_layers=2, bidirectional=True)
    T, N, lengths = 4, 3, [4, 2, 3]
    x = c.randn((T, N, 4))
    n = c.call(rnn.weight_count, x)
    w = c.randn((int(n),), scale=0.3)
    hx = c.randn(rnn.hidden_shape(N), scale=0.5)
    cx = c.randn(rnn.cell_shape(N), scale=0.5)
    return rnn, x, w, hx, cx, lengths


@case
def case_rnn_inference(c: Ctx) -> None:
    from cudnnkit import ops

    rnn, x, w, hx, cx, lengths = _lstm(c)
    c.call(ops.rnn_forward, x, w, hx, cx, rnn=rnn, seq_lengths=lengths)
    c.call(ops.rnn_forward, x, w, rnn=rnn)  # full lengths: the packed fast path, zero initial state


@case
def case_rnn_training(c: Ctx) -> None:
    from cudnnkit import ops

    rnn, x, w, hx, cx, lengths = _lstm(c)
    y, hy, cy, reserve = c.call(ops.rnn_forward, x, w, hx, cx, rnn=rnn, training=True, seq_lengths=lengths)
    dy = c.randn((4, 3, 10))
    dhy, dcy = c.randn(rnn.hidden_shape(3)), c.randn(rnn.cell_shape(3))
    c.call(ops.rnn_backward, x, y, dy, w, reserve, hx, cx, dhy, dcy, rnn=rnn, seq_lengths=lengths)


@case
def case_tensor_ops(c: Ctx) -> None:
    from cudnnkit import ops

    y = c.randn((2, 3, 4, 5))
    c.call(ops.set_tensor, y, 0.5)
    c.call(ops.scale_tensor, y, -2.0)
    c.call(ops.set_tensor, c.randn((4, 6))[:, ::2], 1.5)  # a strided view: the gaps stay untouched
    c.call(ops.add_tensor, c.randn((1, 3, 1, 1)), y, alpha=1.5, beta=0.5)  # broadcast bias
    x = c.randn((2, 3, 4, 5))
    c.call(ops.transform_tensor, x, layout="nhwc")
    c.call(ops.transform_tensor, x, pad_before=(0, 0, 1, 2), pad_after=(0, 0, 2, 1))


@case
def case_graph_conv(c: Ctx) -> None:
    from cudnnkit.graph import Graph

    n, ch, k, hw = 2, 4, 8, 6
    g = Graph(name="sanitize_conv")
    x = g.tensor((n, ch, hw, hw), name="x")
    w = g.tensor((k, ch, 3, 3), name="w")
    y = g.mark_output(g.conv_fprop(x, w, pre_padding=1, name="y"), "float32")
    plan = c.call(g.build)
    c.call(plan.execute, {x: c.randn(x.dims), w: c.randn(w.dims, scale=0.3), y: c.empty(y.dims)})
    # backward data and backward weights (one graph each: engines take one convolution per graph)
    gd = Graph(name="sanitize_conv_dgrad")
    dy, wd = gd.tensor((n, k, hw, hw), name="dy"), gd.tensor((k, ch, 3, 3), name="w")
    dx = gd.mark_output(gd.conv_dgrad(dy, wd, (n, ch, hw, hw), pre_padding=1, name="dx"), "float32")
    plan = c.call(gd.build)
    c.call(plan.execute, {dy: c.randn(dy.dims), wd: c.randn(wd.dims, scale=0.3), dx: c.empty(dx.dims)})
    gw = Graph(name="sanitize_conv_wgrad")
    xw, dyw = gw.tensor((n, ch, hw, hw), name="x"), gw.tensor((n, k, hw, hw), name="dy")
    dw = gw.mark_output(gw.conv_wgrad(xw, dyw, (k, ch, 3, 3), pre_padding=1, name="dw"), "float32")
    plan = c.call(gw.build)
    c.call(plan.execute, {xw: c.randn(xw.dims), dyw: c.randn(dyw.dims), dw: c.empty(dw.dims)})


@case
def case_sdpa(c: Ctx) -> None:
    from cudnnkit.graph import Graph

    shape = (1, 2, 128, 64)  # (B, H, S, D), bfloat16
    b, h, s, _ = shape
    g = Graph(name="sanitize_sdpa_forward")
    q, k, v = (g.tensor(shape, None, "bfloat16", name=nm) for nm in "qkv")
    r = g.sdpa_forward(q, k, v, causal=True)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    arrays = {t: c.randn(shape, "bfloat16") for t in (q, k, v)}
    out = {o: c.empty(o.dims, o.dtype, o.strides), st: c.empty(st.dims, st.dtype, st.strides)}
    plan = c.call(g.build)
    c.call(plan.execute, {**arrays, **out})

    gb = Graph(name="sanitize_sdpa_backward")
    qb, kb, vb, ob, dob = (gb.tensor(shape, None, "bfloat16", name=nm) for nm in ("q", "k", "v", "o", "do"))
    stb = gb.tensor((b, h, s, 1), name="stats")
    grads = [gb.mark_output(t) for t in gb.sdpa_backward(qb, kb, vb, ob, dob, stb, causal=True)]
    bind = {qb: arrays[q], kb: arrays[k], vb: arrays[v], ob: out[o], dob: c.randn(shape, "bfloat16"), stb: out[st]}
    bind.update({t: c.empty(t.dims, t.dtype, t.strides) for t in grads})
    planb = c.call(gb.build)
    c.call(planb.execute, bind)


# CTC last: the invalid shared write is followed by a failed kernel, and a sticky CUDA error would
# fail every case after it


def _ctc(c: Ctx, algo: str) -> None:
    from cudnnkit import ops

    # the case: T=20, N=3, A=6, label lengths 3/2/1; every input length T, then shorter ones
    T, N, A = 20, 3, 6
    ll = np.array([3, 2, 1])
    labels = c.rng.integers(1, A, int(ll.sum()))
    x = c.randn((T, N, A))
    for il in ([T, T, T], [T, 14, 9]):
        c.call(ops.ctc_loss, x, labels, ll, il, algo=algo)
    # device int32 labels and lengths, handed to cuDNN as they are
    c.call(ops.ctc_loss, x, c.ints(labels), c.ints(ll), c.ints([T, T, T]), algo=algo)


@case
def case_ctc_deterministic(c: Ctx) -> None:
    _ctc(c, "deterministic")


@case
def case_ctc_non_deterministic(c: Ctx) -> None:
    _ctc(c, "non_deterministic")


# ----------------------------------------------------------------- the program


def _libraries(asked: str | None) -> list[str]:
    import importlib.util

    if asked:
        return [asked]
    return [n for n in ("cupy", "torch") if importlib.util.find_spec(n) is not None]


def _select(only: list[str] | None) -> list[str]:
    if not only:
        return list(CASES)
    names = [n.strip() for part in only for n in part.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"sanitize_cases: unknown case(s) {unknown}; known: {', '.join(CASES)}")
    return names


def _direct_allocator(library: str) -> None:
    """Every array its own cudaMalloc (see the module docstring)."""
    if library == "cupy":
        import cupy

        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)
    # torch: PYTORCH_NO_CUDA_MEMORY_CACHING=1, set in main() before torch is imported


def run(library: str, names: list[str], dry: bool) -> int:
    """Run the cases for one library; returns the number that failed."""
    if dry:
        xp: Any = FakeAdapter()
    else:
        from cudnnkit.runtime import adapters

        xp = adapters.get(library)
    failed = 0
    for name in names:
        c = Ctx(xp, dry=dry, seed=sum(map(ord, name)))
        t0 = time.perf_counter()
        try:
            CASES[name](c)
            c.sync()
        except Exception:
            failed += 1
            print(f"case {name} ({library}): FAILED after {c.calls} calls", flush=True)
            traceback.print_exc()
            continue
        print(f"case {name} ({library}): ok, {c.calls} calls, {time.perf_counter() - t0:.2f} s", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", choices=("cupy", "torch"), help="default: every one installed")
    p.add_argument("--only", action="append", metavar="NAME[,NAME...]", help="run only these cases")
    p.add_argument("--list", action="store_true", help="print the case names and exit")
    p.add_argument("--dry-run", action="store_true", help="no GPU: fake arrays, signatures checked")
    p.add_argument("--allocator", choices=("direct", "pool"), default="direct")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    names = _select(args.only)
    if args.allocator == "direct":
        os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"  # read when torch initializes CUDA
    try:
        import cudnnkit  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "src"))
    libraries = ["dry"] if args.dry_run else _libraries(args.library)
    if not libraries:
        print("sanitize_cases: neither CuPy nor torch is installed", file=sys.stderr)
        return CASE_FAILED
    failed = 0
    for library in libraries:
        if library != "dry" and args.allocator == "direct":
            _direct_allocator(library)
        failed += run(library, names, args.dry_run)
    total = len(names) * len(libraries)
    print(f"sanitize_cases: {total - failed} of {total} cases ok ({', '.join(libraries)})", flush=True)
    return CASE_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
