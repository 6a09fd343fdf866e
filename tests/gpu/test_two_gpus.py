"""The GPU tier with a second device present (issue 16): per-device state, mixed-device refusal, per-device plan
caches and one thread per device, on a machine with two CUDA devices.

* **Every op on the other device.** Each differentiable op's samples (tests/l3) run with their arrays on the
  *other* device while the *home* device (0) is current, through the torch ops (forward and backward, eager and
  through the dispatcher) and through the framework-neutral layer on CuPy arrays, against torch's float64 CPU ops
  (the checkers of tests/gpu/test_l3_gpu.py); every result lies on the other device and the home device is current
  afterwards.
  Dropout's mask (drawn from the other device's default state) is checked on its own.
* **Mixed devices** (arrays of one call on two devices; a ``DropoutState``, an RNN's weights or a graph plan of the
  other device) are refused with a ``ValueError`` naming the argument, before any GPU work: a poisoned ``out=``
  stays poisoned.
* **Per-device caches.** The same graph run on both devices takes one plan per device from each device's
  :func:`~cudnnkit.graph.plan_cache`; a plan serialized on one device loads (:func:`~cudnnkit.graph.load_plan`) and
  runs on the other, as a serialized cache does.
* **Concurrency.** One thread per device, each on its own streams, runs convolution, RNN and SDPA for a while;
  every result equals the serial run's.

With fewer than two devices every test here is skipped, saying so. ``CUDNNKIT_TWO_GPU_DRYRUN=1`` runs the tests
that can run with both roles on device 0 (the op, concurrency and serialized-plan tests: two threads then share
device 0, each on its own streams) to check this module's own logic on a one-GPU machine: such a run proves
nothing about a second device, and the tests that need two distinct devices still skip.

Run: ``scripts/gpu-tests tests/gpu/test_two_gpus.py`` on the two-GPU machine.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import cudnnkit
from cudnnkit import ops
from cudnnkit.graph import Graph, load_plan, plan_cache

from .test_l3_gpu import CASES, NAMES, _rel, check_against_torch, check_dropout_mask, check_neutral_layer_on_cupy

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

DRYRUN = os.environ.get("CUDNNKIT_TWO_GPU_DRYRUN") == "1"
HOME = 0


@pytest.fixture
def other() -> int:
    """The device the arrays go to (1; 0 in a dry run on one device)."""
    n = torch.cuda.device_count()
    if n >= 2:
        return 1
    if DRYRUN and n == 1:
        return 0
    pytest.skip(f"needs two CUDA devices, {n} visible (CUDNNKIT_TWO_GPU_DRYRUN=1 checks this module on one)")


@pytest.fixture
def distinct(other) -> int:
    """The other device, which must not be the home device (skips a dry run)."""
    if other == HOME:
        pytest.skip("needs two distinct CUDA devices: a dry run on one device cannot refuse mixed devices")
    return other


def _current() -> int:
    return torch.cuda.current_device()


# ----------------------------------------------------------------- every op on the other device


@pytest.mark.parametrize("dispatcher", [False, True], ids=["eager", "dispatcher"])
@pytest.mark.parametrize("name, i", CASES)
def test_torch_op_on_the_other_device(name, i, dispatcher, other, monkeypatch):
    """Both ways of calling a torch op (test_l3_gpu's ``path``): the eager fast path and the custom op through
    torch's dispatcher (what ``torch.compile`` runs)."""
    from cudnnkit.torch import _library

    if dispatcher:
        monkeypatch.setattr(_library, "EAGER", False)
    with torch.cuda.device(HOME):
        check_against_torch(name, i, f"cuda:{other}")
        assert _current() == HOME, f"{name} left cuda:{_current()} current"


@pytest.mark.parametrize("name", NAMES)
def test_neutral_layer_on_the_other_device(name, other):
    cp = pytest.importorskip("cupy")
    with cp.cuda.Device(HOME):
        check_neutral_layer_on_cupy(name, other)
        assert cp.cuda.runtime.getDevice() == HOME, f"{name} left device {cp.cuda.runtime.getDevice()} current"


def test_dropout_on_the_other_device(other):
    """Dropout draws its mask from the other device's default state (the samples' checks compare no dropout output
    against a reference)."""
    with torch.cuda.device(HOME):
        check_dropout_mask(f"cuda:{other}")
        assert _current() == HOME, f"dropout left cuda:{_current()} current"


# ----------------------------------------------------------------- mixed devices


def _on(device, *shape, dtype=torch.float32):
    return torch.randn(*shape, device=f"cuda:{device}", dtype=dtype)


def _poisoned(device, *shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), device=f"cuda:{device}", dtype=dtype)


def _mixed_cases(d: int) -> list:
    """(label, call, the message's pattern, the out= it must leave poisoned or None), arrays of one call on HOME
    and ``d``."""
    x0 = _on(HOME, 2, 4, 8, 8)
    cases = [
        ("conv w", lambda: ops.convolution_forward(x0, _on(d, 4, 4, 3, 3)), rf"w is on cuda:{d} but x is on cuda:0",
         None),
        ("conv bias", lambda: ops.convolution_forward(x0, _on(HOME, 4, 4, 3, 3), _on(d, 4)), f"bias is on cuda:{d}",
         None),
    ]  # fmt: skip
    out = _poisoned(d, 2, 4, 8, 8)
    cases.append(("softmax out", lambda: ops.softmax_forward(x0, axis=1, out=out), f"out is on cuda:{d}", out))
    dy0, y1 = _on(HOME, 2, 4, 8, 8), _on(d, 2, 4, 8, 8)
    cases.append(("softmax_backward y", lambda: ops.softmax_backward(dy0, y1, axis=1), f"^y is on cuda:{d}", None))
    q0 = _on(HOME, 1, 2, 64, 64, dtype=torch.bfloat16)
    k1 = _on(d, 1, 2, 64, 64, dtype=torch.bfloat16)
    cases.append(("sdpa k", lambda: ops.sdpa_forward(q0, k1, q0, training=False), f"k is on cuda:{d}", None))
    state = ops.DropoutState(_on(d, 4), seed=1)
    dout = _poisoned(HOME, 64, 64)
    cases.append(("dropout state", lambda: ops.dropout_forward(_on(HOME, 64, 64), 0.5, state=state, out=dout),
                  f"state is on cuda:{d}", dout))  # fmt: skip
    rnn = ops.RNN("lstm", input_size=8, hidden_size=8, dtype="float32")
    w1 = _on(d, rnn.weight_count(x0))
    cases.append(("rnn weights", lambda: ops.rnn_forward(_on(HOME, 3, 2, 8), w1, rnn=rnn), f"w is on cuda:{d}", None))
    return cases


def test_mixed_devices_are_refused_naming_the_argument(distinct):
    for label, call, pattern, out in _mixed_cases(distinct):
        with pytest.raises(ValueError, match=pattern):
            call()
        if out is not None:
            torch.cuda.synchronize(out.device)
            assert bool(out.isnan().all()), f"{label}: out was written before the refusal"
        assert _current() == HOME, f"{label} left cuda:{_current()} current"


def _conv_graph(like_x, like_w):
    g = Graph(name="two-gpu conv")
    x, w = g.tensor_like(like_x, "x"), g.tensor_like(like_w, "w")
    y = g.mark_output(g.pointwise("RELU_FWD", g.conv_fprop(x, w, pre_padding=1)), "bfloat16")
    return g, x, w, y


def _nhwc(device, n, c, h, w, seed):
    gen = torch.Generator(device=f"cuda:{device}").manual_seed(seed)
    a = torch.randn(n, c, h, w, device=f"cuda:{device}", generator=gen).to(torch.bfloat16)
    return a.contiguous(memory_format=torch.channels_last)


def test_a_plan_of_one_device_refuses_arrays_of_the_other(distinct):
    x0, w0 = _nhwc(HOME, 2, 16, 8, 8, 0), _nhwc(HOME, 16, 16, 3, 3, 1)
    g, x, w, y = _conv_graph(x0, w0)
    plan = g.build(device=HOME)
    x1, w1 = x0.to(f"cuda:{distinct}"), w0.to(f"cuda:{distinct}")
    out = torch.full_like(x1, float("nan"))
    with pytest.raises(ValueError, match=rf"on cuda:{distinct}, but the plan was built for device=0"):
        plan.execute({x: x1, w: w1, y: out})
    torch.cuda.synchronize(distinct)
    assert bool(out.isnan().all())


# ----------------------------------------------------------------- per-device caches


def _reference(x, w):
    """conv (padding 1) + ReLU in float64 on the CPU, rounded to bfloat16."""
    xc, wc = x.double().cpu(), w.double().cpu()
    return torch.relu(torch.nn.functional.conv2d(xc, wc, padding=1)).to(torch.bfloat16).double()


def test_each_device_has_its_own_plans(distinct):
    x0, w0 = _nhwc(HOME, 2, 16, 8, 8, 0), _nhwc(HOME, 16, 16, 3, 3, 1)
    x1, w1 = x0.to(f"cuda:{distinct}"), w0.to(f"cuda:{distinct}")
    g, x, w, y = _conv_graph(x0, w0)
    y0, y1 = torch.full_like(x0, float("nan")), torch.full_like(x1, float("nan"))
    plan_cache(HOME).clear()
    plan_cache(distinct).clear()
    with torch.cuda.device(HOME):
        p0 = g.execute({x: x0, w: w0, y: y0})
        p1 = g.execute({x: x1, w: w1, y: y1})
        assert _current() == HOME
    assert (p0.device, p1.device) == (HOME, distinct) and p0 is not p1
    assert plan_cache(HOME).stats["size"] == plan_cache(distinct).stats["size"] == 1
    want = _reference(x0, w0)
    assert _rel(y0, want) < 1e-2 and _rel(y1, want) < 1e-2
    # the op level: the same convolution call on each device, each result on its device and right
    for xd, wd in ((x0, w0), (x1, w1)):
        got = ops.convolution_forward(xd, wd, padding=1, activation="relu")
        assert got.device == xd.device and _rel(got, want) < 1e-2


def test_a_serialized_plan_runs_on_the_other_device(other):
    x0, w0 = _nhwc(HOME, 2, 16, 8, 8, 0), _nhwc(HOME, 16, 16, 3, 3, 1)
    g, x, w, y = _conv_graph(x0, w0)
    plan_cache(HOME).clear()  # the home cache holds this graph's plan alone (a dry run's held the whole session's)
    data = g.build(device=HOME).serialize()
    loaded = load_plan(data, device=other)
    assert loaded.device == other
    x1, w1 = x0.to(f"cuda:{other}"), w0.to(f"cuda:{other}")
    out = torch.full_like(x1, float("nan"))
    with torch.cuda.device(HOME):
        loaded.execute({x.uid: x1, w.uid: w1, y.uid: out})
        assert _current() == HOME
    assert _rel(out, _reference(x0, w0)) < 1e-2
    # a whole cache: serialized from the home device's, loaded into the other's and used there
    blob = plan_cache(HOME).serialize()
    cache = plan_cache(other)
    cache.clear()
    assert cache.deserialize(blob) >= 1
    pending = cache.stats["pending"]
    out.fill_(float("nan"))
    used = g.execute({x: x1, w: w1, y: out})
    # the build found the loaded plan by its key digest (which holds no device): a miss would leave it pending
    assert cache.stats["pending"] == pending - 1
    assert used.device == other and _rel(out, _reference(x0, w0)) < 1e-2


# ----------------------------------------------------------------- one thread per device


def _work(device: int, seed: int):
    """Fixed inputs on ``device`` and a function running convolution (graph path), an LSTM and SDPA on them on the
    current stream, returning the outputs, under ``settings(deterministic=True)``: every run gives the same bits."""
    dev = f"cuda:{device}"
    gen = torch.Generator(device=dev).manual_seed(seed)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=dev, generator=gen).to(dtype)

    x = r(8, 32, 28, 28, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    wc = (r(32, 32, 3, 3) * 0.1).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    rnn = ops.RNN("lstm", input_size=32, hidden_size=64, num_layers=2, dtype="float32")
    xs = r(20, 4, 32)
    wr = r(rnn.weight_count(xs)) * 0.1
    q, k, v = (r(2, 4, 256, 64, dtype=torch.bfloat16) for _ in range(3))

    def step():
        with cudnnkit.settings(deterministic=True):  # this thread's settings: engines that give the same bits
            return (
                ops.convolution_forward(x, wc, padding=1, activation="relu"),
                ops.rnn_forward(xs, wr, rnn=rnn)[0],
                ops.sdpa_forward(q, k, v, causal=True, training=False),
            )

    return step


def test_one_thread_per_device_matches_serial_runs(other):
    devices = sorted({HOME, other}) if other != HOME else [HOME, HOME]
    steps = [_work(d, seed) for seed, d in enumerate(devices)]
    serial = []
    for d, step in zip(devices, steps):
        with torch.cuda.device(d):
            serial.append([t.clone() for t in step()])
            torch.cuda.synchronize(d)
    errors: list[BaseException] = []
    mismatches: list[str] = []
    start = threading.Barrier(len(devices))

    def worker(t: int):
        d, step, want = devices[t], steps[t], serial[t]
        try:
            torch.cuda.set_device(d)
            streams = [torch.cuda.Stream(device=d) for _ in range(2)]
            start.wait()
            for it in range(40):
                s = streams[it % 2]
                with torch.cuda.stream(s):
                    got = step()
                s.synchronize()
                for j, (a, b) in enumerate(zip(got, want)):
                    if not torch.equal(a, b):
                        mismatches.append(f"thread {t} (cuda:{d}) iteration {it} output {j}")
        except BaseException as e:  # reported below, with the thread
            errors.append(e)
            start.abort()  # a thread still waiting at the barrier raises instead of hanging the process

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(devices))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a worker thread hung"
    assert not errors, f"{len(errors)} thread(s) raised: {errors[0]!r}"
    assert not mismatches, f"{len(mismatches)} result(s) differ from the serial run: {mismatches[:5]}"
    assert all(np.isfinite(t.float().cpu().numpy()).all() for ts in serial for t in ts)
