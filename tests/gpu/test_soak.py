"""Soak tests (issue 10), on request only: ``CUDNNKIT_SOAK=1 scripts/gpu-tests -m soak``; skipped otherwise.

* ``test_soak_mixed_calls_do_not_grow_memory``: 100,000 mixed cudnnkit calls (softmax and log-softmax forward and
  backward, dropout forward and backward, LRN forward and backward, tensor ops, a graph conv plan's execute, a
  small LSTM forward) per library. Device memory in use (``cudaMemGetInfo``), the library's allocator reserve
  (torch ``memory_reserved``, CuPy's default pool ``total_bytes``) and the process RSS (``VmRSS``) are sampled
  after a warm-up and at the end; growth beyond :data:`DEVICE_BOUND`, :data:`RESERVED_BOUND` or
  :data:`RSS_BOUND` fails (a leak of a few hundred bytes a call would cross them). ``CUDNNKIT_SOAK_CALLS``
  changes the count. ``cudaMemGetInfo`` counts every process on the GPU, so run the soak alone on its GPU:
  next to other GPU jobs it measures theirs (measured: +1.98 GiB "growth" beside four fuzz workers).
* ``test_soak_threads_and_streams_match_serial``: 8 threads, each on its own stream, run the same ops on fixed
  random inputs over and over; every result is compared with a serial run's: bitwise for the ops cuDNN computes
  deterministically, within float32 tolerance for the rest (graph conv, LSTM). ``CUDNNKIT_SOAK_ITERS``
  (per thread, default 3000) and ``CUDNNKIT_SOAK_SECONDS`` (default 60, whichever comes first) bound it; at
  least :data:`MIN_ITERS` iterations per thread are required, so the test cannot pass by doing nothing.

Each prints one summary line (``-s`` shows it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from cudnnkit import ops
from cudnnkit.graph import Graph

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.soak,
    # tests/conftest.py skips the soak marker the same way; this keeps the module right on its own
    pytest.mark.skipif(
        os.environ.get("CUDNNKIT_SOAK") != "1",
        reason="soak test: runs on request (CUDNNKIT_SOAK=1 scripts/gpu-tests -m soak); about 3 minutes on an H200",
    ),
]

CALLS = int(os.environ.get("CUDNNKIT_SOAK_CALLS", "100000"))
THREADS = 8
ITERS = int(os.environ.get("CUDNNKIT_SOAK_ITERS", "3000"))
SECONDS = float(os.environ.get("CUDNNKIT_SOAK_SECONDS", "60"))
MIN_ITERS = 20

MiB = 1 << 20
#: growth allowed between the sample after warm-up and the one at the end
DEVICE_BOUND = 32 * MiB
RESERVED_BOUND = 8 * MiB
RSS_BOUND = 32 * MiB
WARMUP_ROUNDS = 50
TOL = 1e-5  # relative (‖a − b‖ / ‖b‖), float32, for the ops marked inexact


# ----------------------------------------------------------------- the ops, on fixed inputs


@dataclass
class Op:
    name: str
    calls: int  # cudnnkit calls one run makes
    exact: bool  # bitwise repeatable (else compared within TOL)
    run: Any  # run(stream) -> tuple of device arrays


def make_inputs(xp, seed: int = 10) -> dict[str, Any]:
    """Fixed random device inputs (read-only for every thread), a graph plan and an LSTM, built once."""
    rng = np.random.default_rng(seed)

    def dev(shape, scale=1.0):
        return xp.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32), 0)

    d: dict[str, Any] = {name: dev(shape) for name, shape in (("x", (4, 10, 6, 5)), ("dy", (4, 10, 6, 5)))}
    d["x2"], d["dy2"] = dev((2, 3, 5, 11)), dev((2, 3, 5, 11))
    d["bias"] = dev((1, 10, 1, 1))
    g = Graph(name="soak_conv")
    gx, gw = g.tensor((2, 8, 8, 8), name="x"), g.tensor((16, 8, 3, 3), name="w")
    gy = g.mark_output(g.conv_fprop(gx, gw, pre_padding=1, name="y"), "float32")
    d["graph"] = (g.build(), gx, gw, gy, dev(gx.dims), dev(gw.dims, 0.3))
    rnn = ops.RNN("lstm", input_size=8, hidden_size=16)
    xr = dev((6, 4, 8))
    n = rnn.weight_count(xr)
    d["rnn"] = (rnn, xr, dev((n,), 0.3), dev(rnn.hidden_shape(4), 0.5), dev(rnn.cell_shape(4), 0.5))
    xp.synchronize(0)
    return d


def make_ops(xp, d: dict[str, Any], stream: Any = None) -> list[Op]:
    """The op set on inputs ``d``, run on ``stream``. The dropout state is this caller's own (states are not
    thread-safe): seeded alike for every caller and put back before each run, so the masks are the same."""
    x, dy, x2, dy2 = d["x"], d["dy"], d["x2"], d["dy2"]
    state = ops.DropoutState(x2, seed=7, stream=stream)
    snapshot = state.snapshot(stream=stream)
    plan, gx, gw, gy, gxa, gwa = d["graph"]
    rnn, xr, w, hx, cx = d["rnn"]

    def softmax(s):
        y = ops.softmax_forward(x, axis=1, stream=s)
        return y, ops.softmax_backward(dy, y, axis=1, stream=s)

    def log_softmax(s):
        y = ops.softmax_forward(x, log=True, stream=s)
        return y, ops.softmax_backward(dy, y, log=True, stream=s)

    def dropout(s):
        state.restore(snapshot, stream=s)
        y, reserve = ops.dropout_forward(x2, 0.3, state=state, stream=s)
        return y, ops.dropout_backward(dy2, reserve, 0.3, state=state, stream=s)

    def lrn(s):
        y = ops.lrn_forward(x, size=5, stream=s)
        return y, ops.lrn_backward(dy, y, x, size=5, stream=s)

    def tensor_ops(s):
        nhwc = ops.transform_tensor(x, layout="nhwc", stream=s)
        padded = ops.transform_tensor(x, pad_before=(0, 0, 1, 2), pad_after=(0, 0, 2, 1), stream=s)
        ops.add_tensor(d["bias"], padded, alpha=0.5, beta=2.0, stream=s)
        ops.scale_tensor(padded, -1.5, stream=s)
        return nhwc, padded

    def graph_conv(s):
        y = xp.empty(gy.dims, "float32", 0, gy.strides, xp_stream(s))
        plan.execute({gx: gxa, gw: gwa, gy: y}, stream=s)
        return (y,)

    def lstm(s):
        y, hy, cy = ops.rnn_forward(xr, w, hx, cx, rnn=rnn, stream=s)
        return y, hy, cy

    return [
        Op("softmax", 2, True, softmax),
        Op("log_softmax", 2, True, log_softmax),
        Op("dropout", 3, True, dropout),
        Op("lrn", 2, True, lrn),
        Op("tensor_ops", 4, True, tensor_ops),
        Op("graph_conv", 1, False, graph_conv),
        Op("lstm", 1, False, lstm),
    ]


def xp_stream(s: Any) -> int | None:
    """A stream object's ``cudaStream_t`` (what the adapter's ``stream=`` takes), None for the current one."""
    if s is None:
        return None
    return int(getattr(s, "cuda_stream", None) or s.ptr)


def new_stream(xp):
    if xp.name == "torch":
        import torch

        return torch.cuda.Stream(0)
    import cupy

    with cupy.cuda.Device(0):
        return cupy.cuda.Stream(non_blocking=True)


def stream_context(xp, s):
    """Make ``s`` the library's current stream in this thread (so its own allocations and copies use it)."""
    if xp.name == "torch":
        import torch

        return torch.cuda.stream(s)
    return s if s is not None else contextlib.nullcontext()


# ----------------------------------------------------------------- memory


def memory(xp) -> dict[str, int]:
    """Device memory in use, the allocator's reserve and the process RSS, in bytes (after gc and a sync)."""
    gc.collect()
    xp.synchronize(0)
    if xp.name == "torch":
        import torch

        free, total = torch.cuda.mem_get_info(0)
        reserved = torch.cuda.memory_reserved(0)
    else:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        reserved = cupy.get_default_memory_pool().total_bytes()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return {"device": int(total - free), "reserved": int(reserved), "rss": rss}


def test_soak_mixed_calls_do_not_grow_memory(xp):
    d = make_inputs(xp)
    op_list = make_ops(xp, d)
    for _ in range(WARMUP_ROUNDS):
        for op in op_list:
            op.run(None)
    warm = memory(xp)
    calls, t0 = 0, time.perf_counter()
    while calls < CALLS:
        for op in op_list:
            op.run(None)
            calls += op.calls
    end = memory(xp)
    secs = time.perf_counter() - t0
    growth = {k: end[k] - warm[k] for k in warm}
    print(
        f"\nsoak {xp.name}: {calls} calls in {secs:.1f} s; growth after warm-up: device "
        f"{growth['device'] / MiB:+.1f} MiB, reserved {growth['reserved'] / MiB:+.1f} MiB, RSS "
        f"{growth['rss'] / MiB:+.1f} MiB (bounds {DEVICE_BOUND // MiB}, {RESERVED_BOUND // MiB}, "
        f"{RSS_BOUND // MiB} MiB)"
    )
    assert calls >= CALLS
    assert growth["device"] <= DEVICE_BOUND, f"device memory grew {growth['device']} bytes over {calls} calls"
    assert growth["reserved"] <= RESERVED_BOUND, f"{xp.name}'s allocator reserve grew {growth['reserved']} bytes"
    assert growth["rss"] <= RSS_BOUND, f"process RSS grew {growth['rss']} bytes over {calls} calls"


# ----------------------------------------------------------------- threads and streams


def _same(a: np.ndarray, ref: np.ndarray, exact: bool) -> tuple[bool, bool]:
    """(within tolerance, bitwise equal)."""
    if a.shape != ref.shape:
        return False, False
    if np.array_equal(a, ref):
        return True, True
    if exact or not np.isfinite(a).all():
        return False, False
    a64, r64 = a.astype(np.float64), ref.astype(np.float64)
    return bool(np.linalg.norm(a64 - r64) <= TOL * max(np.linalg.norm(r64), 1e-30)), False


def test_soak_threads_and_streams_match_serial(xp):
    d = make_inputs(xp, seed=11)
    serial = make_ops(xp, d)
    ref = {op.name: [xp.to_numpy(a) for a in op.run(None)] for op in serial}
    again = {op.name: [xp.to_numpy(a) for a in op.run(None)] for op in serial}
    for op in serial:  # the serial run itself must repeat as the comparison assumes
        for a, r in zip(again[op.name], ref[op.name]):
            assert _same(a, r, op.exact)[0], f"{op.name} does not repeat serially; the comparison would be unfair"

    streams = [new_stream(xp) for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    stats = [{"iters": 0, "compared": 0, "inexact": 0, "mismatches": [], "error": None} for _ in range(THREADS)]

    def worker(i: int) -> None:
        s, st = streams[i], stats[i]
        try:
            with stream_context(xp, s):
                mine = make_ops(xp, d, stream=s)
                s.synchronize()
                barrier.wait()
                deadline = time.monotonic() + SECONDS
                while st["iters"] < ITERS and time.monotonic() < deadline:
                    outs = [(op, op.run(s)) for op in mine]
                    s.synchronize()
                    for op, arrays in outs:
                        for k, arr in enumerate(arrays):
                            ok, bitwise = _same(xp.to_numpy(arr), ref[op.name][k], op.exact)
                            st["compared"] += 1
                            st["inexact"] += ok and not bitwise
                            if not ok and len(st["mismatches"]) < 5:
                                st["mismatches"].append(f"{op.name}[{k}] at iteration {st['iters']}")
                            elif not ok:
                                st["mismatches"].append(None)
                    st["iters"] += 1
        except BaseException as e:  # reported below; a thread's exception must fail the test
            st["error"] = f"{type(e).__name__}: {e}"
            barrier.abort()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,), name=f"soak-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    iters = sum(st["iters"] for st in stats)
    compared = sum(st["compared"] for st in stats)
    inexact = sum(st["inexact"] for st in stats)
    mismatches = [m for st in stats for m in st["mismatches"]]
    print(
        f"\nsoak threads {xp.name}: {THREADS} threads x {THREADS} streams, {iters} iterations, {compared} "
        f"results compared, {len(mismatches)} mismatches ({inexact} within tolerance, not bitwise), {secs:.1f} s"
    )
    errors = [f"thread {i}: {st['error']}" for i, st in enumerate(stats) if st["error"]]
    assert not errors, errors
    assert not mismatches, [m for m in mismatches if m][:10]
    assert min(st["iters"] for st in stats) >= MIN_ITERS, [st["iters"] for st in stats]
