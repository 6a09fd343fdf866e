"""``python -m benchmarks.host_cpu``: the Python host cost of cudnnkit's per-call paths, on the CPU, no GPU needed.

The eager torch training step is host-bound (``benchmarks/NOTES.md``, fifteenth session: ~3,000 Python calls per
step of a small CNN), and GPU time is scarce: this measures the pure-Python parts of a repeated call with stand-ins
for what needs a device, so a change to them can be timed on any machine before it is timed on the GPU. Rows:

* ``express signature``: :func:`cudnnkit.ops._express.signature` of a ``convolution_forward`` call (two arrays,
  tuple keywords: the walk over non-plain values) and of an ``activation_forward`` call (plain keywords);
* ``_fire_graph``: :func:`cudnnkit.ops._primitive._fire_graph`, an express hit on the graph path, with an entry of
  two inputs and one new output, an adapter that allocates CPU tensors, a plan whose ``execute_raw`` does nothing
  and a stand-in handle (the allocation here is a CPU one: ``torch.empty_strided`` on the CPU is shown for scale);
* ``replayed L3 call``: :meth:`cudnnkit.ops._replay.Trace.replay` of a trace of that one graph hit (what a replay
  adds to the hit itself), and :func:`cudnnkit.ops._replay.key_of` of a call of two arrays with the convolution's
  keywords (what every replayable call computes first);
* ``eager op chain``: the whole per-op chain of an eager torch call, forward and ``torch.autograd.grad``, for a
  ``capture_safe`` stand-in op whose forward and backward each make one L2 call (``activation_forward``, seeded as
  a pointer-only graph hit over a plan that does nothing): TorchOp, its autograd function, the replay key and
  the replay, then the same with replay off (each L2 call its express hit). The stand-in's declaration is a
  lambda, where a real one handles its keywords and layouts, so this shows the chain's cost, not what replay saves
  a real op (``python -m benchmarks.replay_ab`` measures that on the GPU); the ``torch: ... torch.autograd.grad``
  row is its scale;
* ``torch glue``: :class:`cudnnkit.torch._library.TorchOp` of a stand-in differentiable op (``y = x * 1``) on the
  eager path, without and with autograd, forward and backward, beside torch's own ``x * 1.0`` forward and backward;
  the custom op called as a compiled graph calls it (no autograd: the dispatcher, the op's autograd kernel, its
  implementation) and forward + backward through the dispatcher (``EAGER = False``: the op's autograd kernel).

What a row's µs means on the GPU machine: the same Python ran about 4x slower on the H100 host of the fifteenth
session (the express signature of a convolution 4.0 µs here against 13 there), and a CUDA allocation and cuDNN's
own host time per call come on top. These are wall-clock means of ``timeit`` loops (the best of ``--repeat``), for
comparing two versions of the code on one machine, never absolute claims.
"""

from __future__ import annotations

import argparse
import timeit
import types
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any
from unittest import mock


def _best_us(fn: Callable[[], Any], iters: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=iters, repeat=repeat)) / iters * 1e6


class _CpuAdapter:
    """The adapter members the express graph path uses, over CPU tensors (a stand-in: no stream, device 0)."""

    name = "cpu-stand-in"

    def __init__(self, torch: Any):
        self.torch = torch

    def empty(self, shape, dtype, device, strides=None, stream=None):
        t = self.torch
        td = t.uint8 if dtype == "uint8" else t.float32
        if strides is None:
            return t.empty(tuple(shape), dtype=td)
        return t.empty_strided(tuple(shape), tuple(strides), dtype=td)

    def key(self, a):
        return (self, "float32", a.shape, a.stride(), 0), a.data_ptr(), self

    def current_stream(self, device):
        return 0

    def current_device(self):
        return 0


class _NoPlan:
    """A plan with a workspace whose execute does nothing (where ``cudnnBackendExecute`` would run)."""

    workspace_size = 4096

    def execute_raw(self, handle, ptrs, workspace):
        return None


def rows(iters: int = 20000, repeat: int = 5) -> list[tuple[str, float]]:
    """``(name, µs per call)`` of every row (see the module docstring)."""
    import torch

    from cudnnkit.ops import _express, _primitive, _replay
    from cudnnkit.ops._diff import Differentiable, new_like
    from cudnnkit.runtime import adapters
    from cudnnkit.torch import _library

    out: list[tuple[str, float]] = []
    ad = _CpuAdapter(torch)
    x = torch.empty_strided((64, 32, 32, 32), (32768, 1, 1024, 32))
    w = torch.empty_strided((64, 32, 3, 3), (288, 1, 96, 32))
    conv = _primitive.REGISTRY["convolution_forward"]
    act = _primitive.REGISTRY["activation_forward"]
    conv_kw = dict(z_alpha=1.0, activation=None, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1,
                   mode="cross_correlation", conv=None, out_dtype=None, scale=1.0)  # fmt: skip
    act_kw = dict(mode="relu", coef=None, propagate_nan=False, alpha=1.0, beta=0.0, out=None)
    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(adapters.KEYED, {torch.Tensor: ad.key}))
        stack.enter_context(mock.patch.object(_primitive, "get_handle", lambda d, s, a: types.SimpleNamespace(ptr=1)))
        stack.enter_context(mock.patch.object(_primitive, "_multi_device", lambda a: False))
        arrays = {"x": x, "w": w, "bias": None, "z": None}
        if _express.signature(conv, arrays, conv_kw) is None:
            raise RuntimeError("the express path is off (CUDNNKIT_EXPRESS=0?): nothing to measure")
        out.append(("express signature, convolution_forward", _best_us(
            lambda: _express.signature(conv, arrays, conv_kw), iters, repeat)))  # fmt: skip
        out.append(("express signature, activation_forward", _best_us(
            lambda: _express.signature(act, {"x": x}, act_kw), iters, repeat)))  # fmt: skip
        views = (("x", tuple(x.shape), x.stride(), "float32", ad), ("w", tuple(w.shape), w.stride(), "float32", ad))
        e = _express.Entry(0, ad, ("x", "w"), views, 0, (("out", (64, 64, 32, 32), "float32", (65536, 1, 2048, 64),
                           ad),), None, None, None, None, None, {}, True, path="graph",
                           graph_form=(_NoPlan(), ("x", "w", "out")))  # fmt: skip
        ptrs = [x.data_ptr(), w.data_ptr()]
        out.append(("_fire_graph (2 CPU allocations, no execute)", _best_us(
            lambda: _primitive._fire_graph(conv, e, ptrs, {}), iters, repeat)))  # fmt: skip
        # the replay of a recorded L3 call of that one hit: what it adds to the hit (pointers by slot, the step's
        # arrays and keywords rebuilt), and the key a call computes first (two arrays, the convolution's keywords)
        kw_items = tuple((k, v, None) for k, v in conv_kw.items())
        step = (_primitive._fire, _primitive._fire_graph, conv, e, (("x", 0), ("w", 1)), kw_items, (0, 1), None)
        trace = _replay.Trace([step], (2,), None, 2)
        stack.enter_context(mock.patch.dict(adapters.POINTER, {torch.Tensor: torch.Tensor.data_ptr}))
        out.append(("replayed L3 call of that one hit (Trace.replay)", _best_us(
            lambda: trace.replay([x, w]), iters, repeat)))  # fmt: skip
        out.append(("replay key of a call (two arrays, conv keywords)", _best_us(
            lambda: _replay.key_of("convolution", arrays=(x, w), kw=conv_kw), iters, repeat)))  # fmt: skip
        out += _eager_chain(torch, ad, act, act_kw, max(iters // 10, 1), repeat)
    out.append(("torch.empty_strided on the CPU (scale)", _best_us(
        lambda: torch.empty_strided((64, 64, 32, 32), (65536, 1, 2048, 64)), iters, repeat)))  # fmt: skip

    op = Differentiable("host_cpu_identity", "softmax_forward", ("x",), ("out",),
                        lambda x, **kw: ((x * 1.0,), {}), lambda res, douts, needs, **kw: (douts[0],),
                        lambda x, **kw: ((new_like(x),), {}))  # fmt: skip
    t_op = _library.define(op, namespace="cudnnkit_host_cpu")
    xs = torch.randn(4, 4)
    xg = xs.clone().requires_grad_(True)
    g = torch.ones(4, 4)
    n = max(iters // 10, 1)
    with mock.patch.object(_library, "_EAGER_CPU", True):
        with torch.no_grad():
            out.append(("torch glue: TorchOp forward, no autograd", _best_us(lambda: t_op(xs), n, repeat)))
        out.append(("torch glue: TorchOp forward with autograd", _best_us(lambda: t_op(xg), n, repeat)))
        out.append(("torch glue: TorchOp forward + backward", _best_us(
            lambda: torch.autograd.backward(t_op(xg), g), n, repeat)))  # fmt: skip
    fargs = t_op.args(xs)
    out.append(("torch glue: the custom op's call, no autograd", _best_us(lambda: t_op.forward_op(*fargs), n, repeat)))
    with mock.patch.object(_library, "EAGER", False):
        out.append(("torch glue: through the dispatcher, forward + backward", _best_us(
            lambda: torch.autograd.backward(t_op(xg), g), n, repeat)))  # fmt: skip
    out.append(("torch: x * 1.0 forward + backward (scale)", _best_us(
        lambda: torch.autograd.backward(xg * 1.0, g), n, repeat)))  # fmt: skip
    out.append(("torch: x * 1.0 forward + torch.autograd.grad (scale)", _best_us(
        lambda: torch.autograd.grad(xg * 1.0, xg, g), n, repeat)))  # fmt: skip
    return out


def _eager_chain(torch: Any, ad: _CpuAdapter, act: Any, act_kw: dict, n: int, repeat: int) -> list[tuple[str, float]]:
    """The whole per-op chain of an eager torch call (TorchOp, its autograd function, the replay key, the replay
    and the pointer-only graph hit) for a ``capture_safe`` stand-in op whose forward and backward each make one L2
    call of ``activation_forward``, seeded as an express hit on the graph path over a plan that does nothing; with
    replay on and off (then each L2 call takes its express hit: the declaration's Python, the L2 call, the
    signature). Runs inside :func:`rows`' stand-ins (``KEYED``, ``POINTER``, the handle)."""
    from cudnnkit.ops import _express, _replay
    from cudnnkit.ops._diff import Differentiable, new_like
    from cudnnkit.torch import _library

    shape, strides = (2, 8, 2, 2), (32, 1, 16, 8)  # channels-last; tiny: the rows time Python, not CPU arithmetic
    x = torch.empty_strided(shape, strides).requires_grad_(True)
    g = torch.empty_strided(shape, strides)
    views = (("x", shape, strides, "float32", ad),)
    sig = _express.signature(act, {"x": x.detach()}, act_kw)
    _express.entries.put(sig[0], _express.Entry(0, ad, ("x",), views, 0, (("out", shape, "float32", strides, ad),),
                                                None, None, None, None, None, {}, True, path="graph",
                                                graph_form=(_NoPlan(), ("x", "out"))))  # fmt: skip
    op = Differentiable("host_cpu_chain", "activation_forward", ("x",), ("out",),
                        lambda x, **kw: ((act({"x": x}, **act_kw),), {}),
                        lambda res, douts, needs, **kw: (act({"x": douts[0]}, **act_kw),),
                        lambda x, **kw: ((new_like(x),), {}), capture_safe=True)  # fmt: skip
    t_op = _library.define(op, namespace="cudnnkit_host_cpu")
    step = lambda: torch.autograd.grad(t_op(x), x, g)  # noqa: E731  (no accumulation into x.grad)
    out = []
    was = _replay.enabled()
    try:
        with mock.patch.object(_library, "_EAGER_CPU", True):
            for on in (True, False):
                _replay.enabled(on)
                for _ in range(20):  # warm: the trace recorded
                    step()
                label = "replayed" if on else "replay off"
                out.append((f"eager op chain, forward + backward ({label})", _best_us(step, n, repeat)))
                if on and _replay.info()["replays"] < n:  # (turning replay off drops the traces)
                    raise RuntimeError("the eager chain row did not replay: it would measure something else")
    finally:
        _replay.enabled(was)
        _express.entries.pop(sig[0], None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20000, help="calls per timed loop (the glue rows take a tenth)")
    ap.add_argument("--repeat", type=int, default=5, help="loops per row; the fastest is shown")
    a = ap.parse_args(argv)
    got = rows(a.iters, a.repeat)
    width = max(len(n) for n, _ in got)
    print(f"{'row':<{width}}  µs per call")
    for name, us in got:
        print(f"{name:<{width}}  {us:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
