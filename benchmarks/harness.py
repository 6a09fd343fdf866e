"""Benchmark harness: cudnnkit callables timed side by side with PyTorch callables.

Each benchmark is a :class:`Row`: an ``ours`` callable (a cudnnkit call, with
everything a user pays per call inside it) and, where one exists, a ``torch``
callable doing the same work. For each row the harness measures

* GPU time per call with a pair of CUDA events around every call on the
  current stream (median, p10 and p90 of many calls after a warm-up);
* host time per call, from a loop of calls that does not synchronize;
* ``ratio = ours_ms / torch_ms`` (below 1: we are faster);
* for memory-bound rows (``bytes`` set): the achieved fraction of the measured
  device-to-device copy bandwidth; for compute-bound rows (``flops`` set): TFLOP/s.

Row families live in ``benchmarks/rows_<family>.py`` modules that register
row factories with :func:`register`; :func:`discover` imports all of them.
A factory builds its inputs on the GPU only when it is called.

Run with ``PYTHONPATH=src python -m benchmarks`` on a machine with a CUDA GPU.
This module imports neither torch nor cudnnkit at import time, so it can be
imported (and its table/JSON/plot code used) on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import pkgutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Row",
    "ROWS",
    "register",
    "or_error",
    "discover",
    "environment",
    "time_gpu",
    "time_gpu_pair",
    "host_overhead_us",
    "measure_copy_bandwidth",
    "run",
    "run_factories",
    "format_table",
    "print_table",
    "write_json",
    "plot",
    "main",
]

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
COPY_BUFFER_BYTES = 1 << 30  # 1 GiB


@dataclass
class Row:
    """One benchmark: our callable and, where there is one, the equivalent PyTorch callable.

    ``bytes`` is the fewest bytes the op must move (reads plus writes) and is
    set for memory-bound ops; ``flops`` is the op's floating-point operation
    count and is set for compute-bound ops. Both callables run on torch's
    current stream and must not synchronize.

    ``sync``, for callables whose work is queued where torch's events do not see it (JAX: XLA's own stream, and
    asynchronous dispatch), waits until the work behind a callable's return value is done (``jax.block_until_ready``);
    both sides are then timed by the host clock around ``fn()`` and ``sync(result)`` (see :func:`time_gpu`), and the
    host-overhead loop ends with ``sync`` of its last result instead of a device synchronize.
    """

    family: str
    name: str
    shape: str
    dtype: str
    ours: Callable[[], Any]
    torch: Callable[[], Any] | None
    bytes: int | None = None
    flops: float | None = None
    notes: str = ""
    sync: Callable[[Any], Any] | None = None

    @property
    def label(self) -> str:
        """``family/name/shape/dtype``, what ``--filter`` matches against."""
        return f"{self.family}/{self.name}/{self.shape}/{self.dtype}"


RowFactory = Callable[[], list[Row]]

#: Registered row factories, in registration order. Each builds its inputs when called.
ROWS: list[RowFactory] = []


def register(factory: RowFactory) -> RowFactory:
    """Decorator: add a row factory to :data:`ROWS` (once) and return it unchanged."""
    if factory not in ROWS:
        ROWS.append(factory)
    return factory


def or_error(make: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)`` (a plan's pre-bound call, say), or a callable that raises its error: a row factory
    builds every plan first, so one that cuDNN refuses fails only the rows that call it."""
    try:
        return make(*args, **kwargs)
    except Exception as exc:
        err = exc

        def fail() -> None:
            raise err

        return fail


def discover() -> list[RowFactory]:
    """Import every ``benchmarks/rows_*.py`` module (which registers its factories); return :data:`ROWS`."""
    package = __name__.rpartition(".")[0] or "benchmarks"
    for info in sorted(pkgutil.iter_modules([str(Path(__file__).resolve().parent)]), key=lambda m: m.name):
        if info.name.startswith("rows_"):
            importlib.import_module(f"{package}.{info.name}")
    return ROWS


# ------------------------------------------------------------------ timing


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0..1) of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def time_gpu(
    fn: Callable[[], Any],
    *,
    warmup: int = 10,
    iters: int = 100,
    rotate: Callable[[int], Any] | None = None,
    sync: Callable[[Any], Any] | None = None,
) -> dict[str, float]:
    """GPU time of ``fn()`` in milliseconds: ``{"median_ms", "p10_ms", "p90_ms"}`` over ``iters`` calls.

    Runs ``warmup`` untimed calls, then times every call separately with a pair
    of ``torch.cuda.Event(enable_timing=True)`` recorded on torch's current
    stream just before and just after it, and synchronizes once at the end.
    ``rotate``, if given, is called with the iteration index before each call
    (warm-up included), outside the timed region: use it to switch the
    callable to the next of several input buffers or to flush L2.

    For a call whose host work takes longer than its GPU work (tiny shapes),
    the GPU waits for the launch, so the event time includes that host time.

    With ``sync`` (a row's JAX hook: ``jax.block_until_ready``), each call is timed instead by the host clock from
    just before ``fn()`` to the return of ``sync(fn())``: the call's dispatch, its device work and the wait, as
    ``timeit`` of a JAX function that blocks on its result measures it (torch's events see neither XLA's stream nor
    JAX's asynchronous dispatch). Nothing else is queued meanwhile, so for device-bound calls this is the device
    time plus one dispatch and one wake-up (microseconds).
    """
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    if sync is not None:
        return _time_synced(fn, sync, warmup=warmup, iters=iters, rotate=rotate)
    import torch

    for i in range(warmup):
        if rotate is not None:
            rotate(i)
        fn()
    torch.cuda.synchronize()
    return _summary(_event_times(fn, iters, rotate, warmup))


def _event_times(fn: Callable[[], Any], n: int, rotate: Callable[[int], Any] | None = None,
                 first: int = 0) -> list[float]:  # fmt: skip
    """Milliseconds of ``n`` calls of ``fn``, each between its own pair of events on torch's current stream
    (``rotate(first + i)`` before call ``i``, outside the pair); synchronizes once at the end."""
    import torch

    stream = torch.cuda.current_stream()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if rotate is not None:
            rotate(first + i)
        starts[i].record(stream)
        fn()
        ends[i].record(stream)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _summary(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "median_ms": statistics.median(times),
        "p10_ms": _percentile(times, 0.10),
        "p90_ms": _percentile(times, 0.90),
    }


def time_gpu_pair(a: Callable[[], Any], b: Callable[[], Any], *, warmup: int = 10, iters: int = 100,
                  blocks: int = 5) -> tuple[dict[str, float], dict[str, float]]:  # fmt: skip
    """:func:`time_gpu` of ``a`` and of ``b``, interleaved: each warms up, then ``blocks`` rounds run a block of
    ``a``'s calls, then a block of ``b``'s (``iters`` calls each in all, every call between its own pair of events).
    A GPU's clocks drift under sustained load (measured on an H100: the same cuDNN attention kernel 0.475 ms after
    10 warm-up calls, 0.538 ms after 100), so two sides timed one after the other differ by where each fell on
    that drift; interleaved, both see the same conditions and the ratio compares the work."""
    if iters < 1 or blocks < 1:
        raise ValueError(f"iters and blocks must be at least 1, got iters={iters}, blocks={blocks}")
    import torch

    for _ in range(warmup):
        a()
    for _ in range(warmup):
        b()
    torch.cuda.synchronize()
    blocks = min(blocks, iters)
    sizes = [iters // blocks + (1 if i < iters % blocks else 0) for i in range(blocks)]
    ta: list[float] = []
    tb: list[float] = []
    for n in sizes:
        ta += _event_times(a, n)
        tb += _event_times(b, n)
    return _summary(ta), _summary(tb)


def _time_synced(fn: Callable[[], Any], sync: Callable[[Any], Any], *, warmup: int, iters: int,
                 rotate: Callable[[int], Any] | None) -> dict[str, float]:  # fmt: skip
    """:func:`time_gpu` by the host clock around ``sync(fn())`` (see there)."""
    for i in range(warmup):
        if rotate is not None:
            rotate(i)
        sync(fn())
    times = []
    for i in range(iters):
        if rotate is not None:
            rotate(warmup + i)
        t0 = time.perf_counter()
        sync(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "p10_ms": _percentile(times, 0.10),
        "p90_ms": _percentile(times, 0.90),
    }


def host_overhead_us(fn: Callable[[], Any], *, iters: int = 200, warmup: int = 10, repeats: int = 5,
                     sync: Callable[[Any], Any] | None = None) -> float:  # fmt: skip
    """Host (CPU) time per call of ``fn()`` in microseconds: the fastest of ``repeats`` loops.

    After ``warmup`` calls and a device synchronize, each loop runs ``iters`` calls back to back without any
    synchronization; its wall time (``time.perf_counter``) divided by ``iters`` is one sample, and a
    synchronize after each loop (not counted; with ``sync``, ``sync`` of the loop's last result: a JAX function's
    work completes in order) lets the next start with an empty queue. The minimum is
    reported, as ``timeit`` does: a shared host's noise (other processes, frequency changes) only ever adds
    time, and one loop of 200 calls moved by 30-60 % between runs on the H200 machine.

    This is what a caller's thread pays per call only while the GPU keeps up.
    For GPU-bound calls the number is bounded below by the GPU time once the
    launch queue fills, or whenever the call waits on the device (an
    allocation that synchronizes, a host read): the loop then runs at GPU
    speed. It is the pure host overhead only for shapes small enough that the
    GPU work is shorter than the host work, which is why each family also has
    a tiny-shape row.
    """
    if iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if sync is None:
        import torch

        def wait(last: Any) -> None:
            torch.cuda.synchronize()
    else:

        def wait(last: Any) -> None:
            sync(last)

    last = None
    for _ in range(warmup):
        last = fn()
    wait(last)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            last = fn()
        best = min(best, time.perf_counter() - t0)
        wait(last)
        last = None
    return best / iters * 1e6


def measure_copy_bandwidth(nbytes: int = COPY_BUFFER_BYTES, *, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s: ``dst.copy_(src)`` of an ``nbytes`` buffer.

    Counts the bytes read plus the bytes written (``2 * nbytes``) over the
    median copy time. Memory-bound rows report their fraction of this number.
    """
    import torch

    n = nbytes // 4

    def timed() -> float:
        src = torch.randn(n, device="cuda", dtype=torch.float32)
        dst = torch.empty_like(src)
        return time_gpu(lambda: dst.copy_(src), warmup=3, iters=iters)["median_ms"]

    try:
        median_ms = timed()
    finally:
        torch.cuda.empty_cache()  # give the 2 GiB back before the rows allocate
    return 2 * n * 4 / (median_ms * 1e-3)


# ------------------------------------------------------------------ running


def _matches(row: Row, pattern: str | None) -> bool:
    return pattern is None or pattern.lower() in row.label.lower()


def _short_error(side: str, exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{side}: {type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def _base_result(row: Row) -> dict[str, Any]:
    return {
        "family": row.family,
        "name": row.name,
        "shape": row.shape,
        "dtype": row.dtype,
        "notes": row.notes,
        "bytes": row.bytes,
        "flops": row.flops,
        "ours_ms": None,
        "ours_p10_ms": None,
        "ours_p90_ms": None,
        "torch_ms": None,
        "torch_p10_ms": None,
        "torch_p90_ms": None,
        "ratio": None,
        "ours_host_us": None,
        "torch_host_us": None,
        "ours_copy_bw_frac": None,
        "torch_copy_bw_frac": None,
        "ours_tflops": None,
        "torch_tflops": None,
        "error": None,
    }


def _measure_side(
    result: dict[str, Any],
    side: str,
    fn: Callable[[], Any],
    row: Row,
    *,
    warmup: int,
    iters: int,
    host_iters: int,
    copy_bw: float | None,
    tracebacks: bool,
    timed: dict[str, float] | None = None,
) -> str | None:
    """Fill ``result``'s columns for one side (``ours`` or ``torch``); return an error string or None. ``timed``:
    its GPU times already measured (:func:`time_gpu_pair`), else they are measured here."""
    try:
        t = timed if timed is not None else time_gpu(fn, warmup=warmup, iters=iters, sync=row.sync)
        result[f"{side}_ms"] = t["median_ms"]
        result[f"{side}_p10_ms"] = t["p10_ms"]
        result[f"{side}_p90_ms"] = t["p90_ms"]
        seconds = t["median_ms"] * 1e-3
        if row.bytes is not None and copy_bw and seconds > 0:
            result[f"{side}_copy_bw_frac"] = row.bytes / seconds / copy_bw
        if row.flops is not None and seconds > 0:
            result[f"{side}_tflops"] = row.flops / seconds / 1e12
        result[f"{side}_host_us"] = host_overhead_us(fn, iters=host_iters, warmup=min(warmup, 3), sync=row.sync)
    except Exception as exc:  # one failing row must never end the run
        if tracebacks:
            traceback.print_exc()
        return _short_error(side, exc)
    return None


def run(
    rows: Iterable[Row],
    *,
    filter: str | None = None,
    warmup: int = 10,
    iters: int = 100,
    host_iters: int = 200,
    copy_bw: float | None = None,
    progress: bool = True,
    tracebacks: bool = False,
) -> list[dict[str, Any]]:
    """Time every row whose ``family/name/shape/dtype`` contains ``filter`` (case-insensitive).

    Returns one dict per row with the columns described in the module
    docstring (``None`` where a value does not apply or could not be
    measured). Exceptions are caught per side and recorded in ``error``.
    ``copy_bw`` (bytes/s) is measured here, once, if a row needs it and it
    is not given. ``progress`` prints each row's label to stderr before it
    runs; ``tracebacks`` prints the traceback of each failure there too.
    """
    results: list[dict[str, Any]] = []
    for row in rows:
        if not _matches(row, filter):
            continue
        if progress:
            print(f"  timing {row.label}", file=sys.stderr, flush=True)
        result = _base_result(row)
        if row.bytes is not None and copy_bw is None:
            try:
                copy_bw = measure_copy_bandwidth()
            except Exception as exc:
                copy_bw = 0.0  # measured once per run: do not retry for every row
                print(f"  copy bandwidth not measured: {_short_error('copy', exc)}", file=sys.stderr)
        errors = []
        kw: dict[str, Any] = {
            "warmup": warmup,
            "iters": iters,
            "host_iters": host_iters,
            "copy_bw": copy_bw,
            "tracebacks": tracebacks,
        }
        timed: dict[str, Any] = {}
        if row.torch is not None and row.sync is None:  # both sides on torch's stream: timed interleaved
            try:
                timed["ours"], timed["torch"] = time_gpu_pair(row.ours, row.torch, warmup=warmup, iters=iters)
            except Exception:  # a failing side: each is timed alone below, which records its error
                if tracebacks:
                    traceback.print_exc()
                timed = {}
                result["notes"] = (result["notes"] + "; " if result["notes"] else "") + "timed one side after the other"
        err = _measure_side(result, "ours", row.ours, row, timed=timed.get("ours"), **kw)
        if err:
            errors.append(err)
        if row.torch is not None:
            err = _measure_side(result, "torch", row.torch, row, timed=timed.get("torch"), **kw)
            if err:
                errors.append(err)
        if result["ours_ms"] is not None and result["torch_ms"]:
            result["ratio"] = result["ours_ms"] / result["torch_ms"]
        result["error"] = "; ".join(errors) or None
        results.append(result)
    return results


def run_factories(
    factories: Iterable[RowFactory],
    *,
    filter: str | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """Call each factory, run its rows, then free its inputs before the next one.

    A factory that raises is recorded as one error row named after it.
    ``kwargs`` are passed to :func:`run`.
    """
    results: list[dict[str, Any]] = []
    for factory in factories:
        try:
            rows = factory()
        except Exception as exc:
            if kwargs.get("tracebacks"):
                traceback.print_exc()
            family = getattr(factory, "__module__", "?").rpartition(".")[2].removeprefix("rows_")
            name = getattr(factory, "__name__", "?")
            if filter is None or filter.lower() in f"{family}/{name}".lower():
                res = _base_result(Row(family, name, "-", "-", lambda: None, None))
                res["error"] = _short_error("factory", exc)
                results.append(res)
            continue
        results.extend(run(rows, filter=filter, **kwargs))
        del rows
        _free_gpu_memory()
    return results


def _free_gpu_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


# ------------------------------------------------------------------ reporting


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _throughput(r: dict[str, Any]) -> str:
    """``ours/torch`` percent of copy bandwidth or TFLOP/s, whichever the row reports."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    if r.get("bytes") is not None:
        o, t = r.get("ours_copy_bw_frac"), r.get("torch_copy_bw_frac")
        return "-" if o is None and t is None else f"{pct(o)}/{pct(t)}"
    if r.get("flops") is not None:
        o, t = r.get("ours_tflops"), r.get("torch_tflops")
        return "-" if o is None and t is None else f"{_fmt(o, '.1f')}/{_fmt(t, '.1f')} TF"
    return "-"


_COLUMNS: list[tuple[str, int, str]] = [  # header, minimum width, alignment
    ("family", 8, "<"),
    ("name", 12, "<"),
    ("shape", 10, "<"),
    ("dtype", 8, "<"),
    ("ours ms", 9, ">"),
    ("torch ms", 9, ">"),
    ("ratio", 6, ">"),
    ("%copy-bw|TFLOP/s", 16, ">"),
    ("ours host µs", 12, ">"),
    ("torch host µs", 13, ">"),
]


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """The fixed-width table :func:`print_table` prints, as a string.

    Each column is as wide as its widest cell (at least its minimum width).
    """
    body: list[list[str]] = []
    for r in results:
        cells = [
            str(r.get("family", "")),
            str(r.get("name", "")),
            str(r.get("shape", "")),
            str(r.get("dtype", "")),
            _fmt(r.get("ours_ms"), ".4f"),
            _fmt(r.get("torch_ms"), ".4f"),
            "ERR" if r.get("error") else _fmt(r.get("ratio"), ".2f"),
            _throughput(r),
            _fmt(r.get("ours_host_us"), ".1f"),
            _fmt(r.get("torch_host_us"), ".1f"),
        ]
        body.append(cells)
    widths = [max([w, len(h)] + [len(c[i]) for c in body]) for i, (h, w, _) in enumerate(_COLUMNS)]
    aligns = [a for _, _, a in _COLUMNS]
    lines = [" ".join(f"{h:{a}{w}}" for (h, _, a), w in zip(_COLUMNS, widths, strict=True))]
    lines.append(" ".join("-" * w for w in widths))
    for cells in body:
        lines.append(" ".join(f"{c:{a}{w}}" for c, a, w in zip(cells, aligns, widths, strict=True)).rstrip())
    errors = [r for r in results if r.get("error")]
    if errors:
        lines.append("")
        lines.append("errors:")
        for r in errors:
            lines.append(f"  {r.get('family')}/{r.get('name')}/{r.get('shape')}/{r.get('dtype')}: {r['error']}")
    compared = [r for r in results if r.get("ratio") is not None]
    at_or_under = sum(1 for r in compared if r["ratio"] <= 1.0)
    lines.append("")
    lines.append(
        f"{len(results)} rows, {at_or_under} of {len(compared)} compared at or under torch "
        f"(ratio <= 1.00), {len(errors)} with errors"
    )
    return "\n".join(lines)


def print_table(results: Sequence[dict[str, Any]]) -> None:
    """Print a fixed-width table of ``results``; the last line is a summary.

    Columns: family, name, shape, dtype, median GPU ms (ours, torch),
    ratio = ours/torch (below 1 is faster), ``ours%/torch%`` of the measured
    copy bandwidth for memory-bound rows or ``ours/torch TF`` (TFLOP/s) for
    compute-bound rows, and host µs per call (ours, torch). Rows with errors
    show ``ERR`` as ratio and are listed with their messages below the table.
    """
    print(format_table(results))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(results: Sequence[dict[str, Any]], path: str | Path, *, meta: dict[str, Any] | None = None) -> Path:
    """Write ``{"meta": meta, "results": results}`` to ``path`` (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta or {}, "results": list(results)}
    path.write_text(json.dumps(_json_safe(doc), indent=2, default=str) + "\n")
    return path


def plot(results: Sequence[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path | None:
    """Write a PNG of ``ratio`` (ours ms / torch ms) per row to ``path``: one panel of horizontal bars per op
    family, on a shared log axis with a line at 1.0, each bar labelled with its row and its value.

    Bars at or under 1.0 (as fast as torch or faster) are green, others red; they start at 1.0, so a bar's length
    is how far a row is from parity either way. Rows without a ratio (one side failed or absent) are left out.
    Returns the path, or None with a printed note if matplotlib is missing
    (``pip install matplotlib``, or the ``bench`` extra).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(f"note: matplotlib is not installed; skipped the plot {path}")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in results if r.get("ratio") is not None and r["ratio"] > 0]
    families: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        families.setdefault(r["family"], []).append(r)
    heights = [len(v) + 1.2 for v in families.values()] or [1.0]
    fig, axes = plt.subplots(
        len(heights), 1, figsize=(11.0, 0.9 + 0.3 * sum(heights)), sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )  # fmt: skip
    try:
        if not rows:
            axes[0][0].text(0.5, 0.5, "no rows with a ratio", ha="center", va="center", transform=axes[0][0].transAxes)
            axes[0][0].set_yticks([])
        ratios = [r["ratio"] for r in rows] + [1.0]
        lo, hi = min(ratios) / 1.6, max(ratios) * 1.6
        for ax, (family, frows) in zip((a[0] for a in axes), families.items()):
            ys = range(len(frows))[::-1]  # the first row on top
            vals = [r["ratio"] for r in frows]
            colors = ["tab:green" if v <= 1.0 else "tab:red" for v in vals]
            ax.barh(list(ys), [v - 1.0 for v in vals], left=1.0, color=colors, height=0.7)
            for y, v in zip(ys, vals):
                ax.text(v * (1.04 if v > 1 else 1 / 1.04), y, f"{v:.2f}x", va="center", ha="left" if v > 1 else "right",
                        fontsize=8)  # fmt: skip
            ax.set_yticks(list(ys))
            ax.set_yticklabels([f"{r['name']}  ({r['shape']}, {r['dtype']})" for r in frows], fontsize=8.5)
            ax.set_ylim(-0.8, len(frows) - 0.2)
            ax.axvline(1.0, color="black", linewidth=1, linestyle="--")
            ax.set_title(family, loc="left", fontsize=10, fontweight="bold")
            ax.grid(axis="x", which="both", alpha=0.25)
        bottom = axes[-1][0]
        bottom.set_xscale("log")
        bottom.set_xlim(lo, hi)
        ticks = [2.0**k for k in range(-10, 11) if lo <= 2.0**k <= hi]
        bottom.set_xticks(ticks, [f"{t:g}x" for t in ticks])
        bottom.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        bottom.set_xlabel("ours ms / torch ms (log scale; under 1 is faster than torch)")
        fig.suptitle(title or "cudnnkit vs PyTorch: GPU time ratio", fontsize=11)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


# ------------------------------------------------------------------ CLI


def environment() -> dict[str, Any]:
    """Device name, torch and CUDA versions, and the cuDNN version cudnnkit loaded."""
    import torch

    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_cudnn": torch.backends.cudnn.version(),
    }
    try:
        from cudnnkit import lib

        info["cudnn"] = lib.version()
        info["cudnn_path"] = lib.path()
    except Exception as exc:
        info["cudnn"] = None
        info["cudnn_error"] = _short_error("cudnnkit", exc)
    return info


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks [--filter SUBSTR] [--out DIR] [--iters N]``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description="Time cudnnkit against PyTorch.")
    p.add_argument("--filter", default=None, help="only rows whose family/name/shape/dtype contains SUBSTR")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--iters", type=int, default=100, help="timed calls per measurement (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (default 10)")
    p.add_argument("--host-iters", type=int, default=200, help="calls in the host-overhead loop (default 200)")
    p.add_argument("--traceback", action="store_true", help="print the traceback of each failing row")
    args = p.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("the benchmarks need PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("the benchmarks need a CUDA GPU; torch.cuda.is_available() is False", file=sys.stderr)
        return 2

    env = environment()
    print(f"device: {env['device']}")
    print(f"torch:  {env['torch']} (CUDA {env['cuda']}, torch's cuDNN {env['torch_cudnn']})")
    print(f"cuDNN:  {env['cudnn'] if env['cudnn'] is not None else env.get('cudnn_error')} (cudnnkit)")
    try:
        copy_bw = measure_copy_bandwidth()
        print(f"device-to-device copy bandwidth: {copy_bw / 1e9:.1f} GB/s (1 GiB buffer, read + write)")
    except Exception as exc:  # rows still run; they just report no %copy-bw
        copy_bw = 0.0
        print(f"device-to-device copy bandwidth: not measured ({_short_error('copy', exc)})")
    sys.stdout.flush()

    factories = discover()
    results = run_factories(
        factories,
        filter=args.filter,
        warmup=args.warmup,
        iters=args.iters,
        host_iters=args.host_iters,
        copy_bw=copy_bw,
        tracebacks=args.traceback,
    )
    meta = {
        **env,
        "copy_bandwidth_bytes_per_s": copy_bw,
        "iters": args.iters,
        "warmup": args.warmup,
        "host_iters": args.host_iters,
        "filter": args.filter,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    json_path = write_json(results, args.out / "bench.json", meta=meta)
    png_path = plot(results, args.out / "bench.png", title=f"cudnnkit vs PyTorch on {env['device']}")
    print(f"wrote {json_path}" + (f" and {png_path}" if png_path else ""))
    print()
    print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
