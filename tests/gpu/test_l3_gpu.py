"""The L3 layer on the GPU, for every differentiable op (cudnnkit.autograd.functions()), from the samples in
tests/l3/*.py:

* the torch custom ops forward and backward against torch's own float64 CPU ops on the same inputs (fresh random
  inputs, random cotangents);
* ``torch.autograd.gradcheck`` in float64;
* ``torch.library.opcheck`` (schema, fake, autograd registration, AOT dispatch);
* ``meta`` against what the real forward returns (shapes, dtypes, residual names);
* the framework-neutral layer with CuPy arrays (forward and backward against the same torch reference);
* a model of conv, batch norm, ReLU, pooling and softmax under ``torch.compile(fullgraph=True)`` matching eager.
"""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import autograd
from cudnnkit.runtime import FLOATS

from .. import l3

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


SAMPLES, REFS = l3.tables()
NAMES = sorted(autograd.functions())
CASES = [(n, i) for n in NAMES for i in range(len(SAMPLES[n](np.random.default_rng(0), "float64")))] if SAMPLES else []


def test_every_differentiable_op_has_samples_and_a_reference():
    assert set(NAMES) <= set(SAMPLES), f"no samples for {sorted(set(NAMES) - set(SAMPLES))}"
    assert set(NAMES) <= set(REFS), f"no torch reference for {sorted(set(NAMES) - set(REFS))}"


def _case(name, i, dtype="float64", seed=None):
    rng = np.random.default_rng(seed if seed is not None else 1000 + i)
    inputs, kw = SAMPLES[name](rng, dtype)[i]
    return inputs, kw


def _host(a):
    """A NumPy array as a CPU tensor (a bfloat16 one, NumPy's ml_dtypes kind, through float32)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(np.copy(a.astype(np.float32), order="K")).to(torch.bfloat16)
    return torch.from_numpy(np.copy(a, order="K"))


def _torch(a, device, grad=False):
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        t = _host(a).to(device)
        return t.requires_grad_(grad and t.is_floating_point())
    return a


def _split(d, kw, device):
    return {k: _torch(v, device) if k in d.arrays else v for k, v in kw.items()}


def _tol(inputs) -> tuple[float, float]:
    """(forward, gradient) tolerances by the samples' float dtype: the graph-only ops (layer, RMS and instance norm)
    and CTC have float32 samples only (no float64 in cuDNN there)."""
    names = {a.dtype.name for a in inputs if isinstance(a, np.ndarray)} & {"float64", "float32", "bfloat16", "float16"}
    if names & {"bfloat16", "float16"}:  # attention: half types only (its reference in float32 on the same values)
        return (2e-2, 2e-2)
    return (1e-7, 1e-6) if names <= {"float64"} else (3e-4, 3e-3)


def _rel(a, b):
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    n = b.norm()
    return float((a - b).norm() / (n if n > 0 else 1.0))


@pytest.fixture(params=["eager", "dispatcher"])
def path(request, monkeypatch):
    """Both ways of calling a torch op: the eager fast path (the declaration called directly, autograd through
    ``torch.autograd.Function``) and the custom op through torch's dispatcher (what ``torch.compile`` runs)."""
    from cudnnkit.torch import _library

    if request.param == "dispatcher":
        monkeypatch.setattr(_library, "EAGER", False)
    return request.param


@pytest.mark.parametrize("name, i", CASES)
def test_forward_and_backward_match_torch(name, i, path):
    check_against_torch(name, i, "cuda")


#: value-preserving layouts a positional floating input may take (see :func:`_laid_out`)
LAYOUTS = ("as_is", "channels_last", "column_major", "padded", "offset")


def _laid_out(t, layout):
    """``t`` (a tensor, None, or anything else, returned as it is) with the same values in another memory layout,
    through differentiable torch ops (a gradient reaches ``t``): ``as_is``; ``channels_last`` (4-d and 5-d, else as
    is); ``column_major`` (strides reversed); ``padded`` (a view into a buffer 3 elements wider in the last
    dimension: not contiguous); ``offset`` (a view one element into its buffer: a data pointer off cuDNN's 16-byte
    alignment)."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() == 0 or layout == "as_is":
        return t
    if layout == "channels_last":
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
        return t if fmt is None else t.contiguous(memory_format=fmt)
    if layout == "column_major":
        rev = tuple(reversed(range(t.dim())))
        return t.permute(rev).contiguous().permute(rev)
    if layout == "padded":
        return torch.cat([t, t.new_zeros(*t.shape[:-1], 3)], dim=-1)[..., : t.shape[-1]]
    if layout == "offset":
        return torch.cat([t.new_zeros(1), t.reshape(-1)])[1:].view(t.shape)
    raise ValueError(layout)


def check_against_torch(name, i, device, seed=None, dtype="float64", layout="as_is", grads=None):
    """Sample ``i`` of op ``name`` (its ``dtype`` form, drawn from ``seed``) through its torch op on ``device`` (a
    torch device string), forward and the gradients of a random projection of its outputs, against torch's own ops
    on the CPU in float64; every output and gradient must be on ``device``. Also run by the two-GPU tier
    (tests/gpu/test_two_gpus.py) on cuda:1. ``layout`` (one of :data:`LAYOUTS`) lays out every floating
    positional input so on ``device`` (:func:`_laid_out`; the gradients are taken at the leaves before it);
    ``grads`` (a bool per input, default all) says which floating inputs require a gradient."""
    import cudnnkit.torch as ct

    d = autograd.get(name)
    inputs, kw = _case(name, i, dtype, seed)
    flags = [True] * len(inputs) if grads is None else list(grads)
    leaves = [_torch(a, device, grad=g) for a, g in zip(inputs, flags)]
    ours_in = [_laid_out(t, layout) for t in leaves]
    ref_in = [_torch(a, "cpu", grad=g) for a, g in zip(inputs, flags)]
    outs = ct.op(name)(*ours_in, **_split(d, kw, device))
    outs = outs if isinstance(outs, tuple) else (outs,)
    want = REFS[name](ref_in, _split(d, kw, "cpu"))
    assert len(outs) == len(d.outputs) == len(want)
    rng = np.random.default_rng(7 + i)
    loss_ours, loss_ref = 0.0, 0.0
    tol, gtol = _tol(inputs)
    where = torch.device(device)
    for j, (o, w) in enumerate(zip(outs, want)):
        assert o.is_cuda and (where.index is None or o.device == where), f"{name} output {j} on {o.device}"
        if w is None:
            continue
        assert tuple(o.shape) == tuple(w.shape), f"{name} output {d.outputs[j]}: {tuple(o.shape)} vs {tuple(w.shape)}"
        if tol < 1e-6:  # a float64 sample: the output's dtype is torch's (float32 ones: CTC costs by cuDNN are float32)
            assert o.dtype == w.dtype, f"{name} output {d.outputs[j]}: {o.dtype} vs torch's {w.dtype}"
        assert _rel(o, w) < tol, f"{name} output {d.outputs[j]}: rel {_rel(o, w):.2e}"
        if d.carries_gradient(j) and o.is_floating_point():
            ct_ = torch.from_numpy(rng.standard_normal(tuple(o.shape))).to(o.dtype)
            loss_ours = loss_ours + (o * ct_.to(o.device)).sum()
            loss_ref = loss_ref + (w * ct_).sum()
    diff = [(a, b) for a, b in zip(leaves, ref_in) if a is not None and a.requires_grad]
    if not diff or isinstance(loss_ours, float):
        return
    g_ours = torch.autograd.grad(loss_ours, [a for a, _ in diff], allow_unused=True)
    g_ref = torch.autograd.grad(loss_ref, [b for _, b in diff], allow_unused=True)
    checked = 0
    for k, (go, gr) in enumerate(zip(g_ours, g_ref)):
        if gr is None:
            continue
        assert go is not None, f"{name}: no gradient for input {k}"
        assert where.index is None or go.device == where, f"{name} d input {k} on {go.device}"
        assert _rel(go, gr) < gtol, f"{name} d input {k}: rel {_rel(go, gr):.2e}"
        checked += 1
    if grads is None:  # (a chosen subset may hold only inputs the op has no gradient for)
        assert checked, f"{name}: the reference has no gradient for any input: nothing was compared"


REPLAYED = {"convolution", "batch_norm", "activation", "pooling"}  # the small CNN's ops: each must replay


@pytest.mark.parametrize("name", [n for n in NAMES if autograd.get(n).capture_safe])
def test_replayed_calls_match_torch(name, path):
    """Every sample of a ``capture_safe`` op, float32, called eight times with fresh inputs (new values and
    pointers, the same metadata and keywords), on the eager path and through the custom ops: from the third call on
    its forward and backward replay the express hits of an earlier call (cudnnkit.ops._replay) where the
    declaration allows, and each call still matches torch's float64 CPU ops (TF32 off). The small CNN's ops must
    have replayed; every op's count is printed."""
    import cudnnkit
    from cudnnkit.ops import _replay

    before = _replay.info()["replays"]
    n = len(SAMPLES[name](np.random.default_rng(0), "float32"))
    with cudnnkit.settings(allow_tf32=False):
        for i in range(n):
            for k in range(8):
                check_against_torch(name, i, "cuda", seed=5000 + 17 * i + k, dtype="float32")
    got = _replay.info()["replays"] - before
    print(f"replays {name} ({path}): {got} over {n} sample(s) x 8 calls")
    if name in REPLAYED:
        assert got > 0, f"{name}: no call replayed"


REPLAY_FUZZ_CALLS = 320


def test_replay_fuzz_mixed_layouts_and_gradients(path):
    """Replayed calls (cudnnkit.ops._replay) must never bind a trace to a call it does not fit: 40 configurations
    (a ``capture_safe`` op's sample, one of :data:`LAYOUTS` for its floating inputs, which of them require a
    gradient: all, the first, none), drawn at random, then 320 calls drawn from them in random order, each with fresh
    values (new pointers, the same metadata), each checked against torch's float64 CPU ops, forward and gradients
    (TF32 off). Configurations that share an op's metadata but differ in layout, alignment or gradients interleave,
    so a key missing any of them would replay the wrong trace; the test fails with the draw that went wrong, and
    asserts that calls did replay."""
    import cudnnkit
    from cudnnkit.ops import _replay

    rng = np.random.default_rng(20261207)
    safe = [n for n in NAMES if autograd.get(n).capture_safe]
    configs = []
    for _ in range(40):
        name = safe[rng.integers(len(safe))]
        i = int(rng.integers(len(SAMPLES[name](np.random.default_rng(0), "float32"))))
        layout = LAYOUTS[rng.integers(len(LAYOUTS))]
        inputs, _ = _case(name, i, "float32", 0)
        floating = [isinstance(a, np.ndarray) and a.dtype.name in FLOATS for a in inputs]
        which = ("all", "first", "none")[rng.integers(3)]
        first = floating.index(True) if True in floating else -1
        grads = [f and (which == "all" or (which == "first" and k == first)) for k, f in enumerate(floating)]
        configs.append((name, i, layout, tuple(grads)))
    before = _replay.info()["replays"]
    with cudnnkit.settings(allow_tf32=False):
        for call in range(REPLAY_FUZZ_CALLS):
            name, i, layout, grads = configs[rng.integers(len(configs))]
            try:
                check_against_torch(name, i, "cuda", seed=90000 + call, dtype="float32", layout=layout, grads=grads)
            except Exception as e:
                raise AssertionError(f"call {call}: {name} sample {i}, layout {layout}, gradients {grads} ({path}): "
                                     f"{type(e).__name__}: {e}") from e  # fmt: skip
    got = _replay.info()["replays"] - before
    print(f"replay fuzz ({path}): {got} replays over {REPLAY_FUZZ_CALLS} calls of {len(set(configs))} configurations")
    assert got > 0, "no call replayed: the fuzz exercised nothing of the replay path"


@pytest.mark.parametrize("name, i", CASES)
def test_meta_matches_the_real_forward(name, i):
    from cudnnkit.torch._library import spec

    d = autograd.get(name)
    inputs, kw = _case(name, i)
    ins = [_torch(a, "cuda") for a in inputs]
    kwd = _split(d, kw, "cuda")
    outs, res = d.forward(*ins, **kwd)
    specs = [None if t is None else spec(t) for t in ins]
    kspecs = {k: (spec(v) if k in d.arrays and v is not None else v) for k, v in kwd.items()}
    m_outs, m_res = d.meta(*specs, **kspecs)
    assert list(m_res) == list(res), f"{name}: residuals {list(res)} but meta says {list(m_res)}"
    for o, s in list(zip(outs, m_outs)) + [(res[k], m_res[k]) for k in res]:
        if o is None:  # an absent optional input saved by name (divisive normalization's means)
            assert s is None, f"{name}: meta has {s} for an absent residual"
            continue
        assert tuple(o.shape) == s.shape and spec(o).dtype == s.dtype, f"{name}: {spec(o)} vs meta {s}"


@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name, path):
    import cudnnkit.torch as ct

    d = autograd.get(name)
    inputs, kw = _case(name, 0, seed=5)
    ins = [_torch(a, "cuda", grad=True) for a in inputs]
    kwd = _split(d, kw, "cuda")
    if not any(t is not None and t.requires_grad for t in ins):
        pytest.skip(f"{name}'s sample has no floating input")
    if _tol(inputs)[0] > 1e-7:
        pytest.skip(f"{name} has no float64 in cuDNN: its float32 gradients are checked against torch's instead")

    def f(*xs):
        got = ct.op(name)(*xs, **{k: (v.clone() if k in d.mutated and v is not None else v) for k, v in kwd.items()})
        got = got if isinstance(got, tuple) else (got,)
        return tuple(g for j, g in enumerate(got) if d.carries_gradient(j) and g.is_floating_point())

    # cuDNN's RNN and CTC reduce in a varying order, and its grid generator's backward (affine_grid) accumulates
    # with atomics, as does its sampler backward (grid_sample): the same inputs give gradients equal to ~1e-15,
    # not bit for bit
    nondet = name in ("rnn", "ctc_loss", "affine_grid", "grid_sample")
    if name == "dropout":
        pytest.skip("dropout draws a new mask per call: checked against its own mask in test_dropout_mask_gradient")
    assert torch.autograd.gradcheck(f, tuple(ins), fast_mode=True, nondet_tol=1e-10 if nondet else 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(name):
    import cudnnkit.torch as ct

    d = autograd.get(name)
    inputs, kw = _case(name, 0, seed=3)
    ins = [_torch(a, "cuda", grad=True) for a in inputs]
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")
    if name in ("dropout", "rnn"):  # opcheck's AOT comparison is bit for bit over every output: dropout draws a new
        # mask per call; the RNN's uint8 reserve holds bytes cuDNN leaves unwritten (60 of 2656 differed between two
        # calls on the H100), so the RNN's AOT run is compared below without it
        utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    op = ct.op(name)
    args = op.args(*ins, **_split(d, kw, "cuda"))
    torch.library.opcheck(op.forward_op, args, test_utils=utils)
    if name == "rnn":
        _aot_matches_eager(op.forward_op, args, [t for t in ins if t is not None and t.requires_grad])


def _aot_matches_eager(fn, args, leaves):
    """``fn`` traced by AOTAutograd (``torch.compile(backend="aot_eager")``) against eager: the floating outputs
    bit for bit, and the gradients of their sum to 1e-10 (the RNN's float64 backward is not bit for bit)."""

    def floating(*a):
        return [o for o in fn(*a) if o.is_floating_point()]

    got = []
    for f in (floating, torch.compile(floating, backend="aot_eager", fullgraph=True)):
        outs = f(*args)
        grads = torch.autograd.grad(sum(o.sum() for o in outs), leaves, allow_unused=True)
        got.append(([o.detach() for o in outs], grads))
    (eo, eg), (co, cg) = got
    assert len(eo) == len(co) >= 1
    for e, c in zip(eo, co):
        torch.testing.assert_close(c, e, rtol=0, atol=0)
    assert len(leaves) >= 1 and any(e is not None for e in eg)
    for e, c in zip(eg, cg):
        assert (e is None) == (c is None)
        if e is not None:
            torch.testing.assert_close(c, e, rtol=0, atol=1e-10)


def test_dropout_mask_gradient(path):
    check_dropout_mask("cuda")


def check_dropout_mask(device):
    """The torch dropout op on ``device``: about 1 - p of the elements kept, each scaled by 1 / (1 - p), and the
    gradient the mask's; the output and gradient on ``device``. Also run by the two-GPU tier on cuda:1."""
    import cudnnkit.torch as ct

    x = torch.randn(64, 64, device=device, dtype=torch.float64, requires_grad=True)
    y = ct.op("dropout")(x, p=0.25)
    assert y.device == x.device
    kept = y != 0
    assert 0.70 < kept.double().mean().item() < 0.80
    assert torch.allclose(y[kept], x[kept] / 0.75)
    dy = torch.randn_like(y)
    (g,) = torch.autograd.grad(y, x, dy)
    assert g.device == x.device
    assert torch.allclose(g, torch.where(kept, dy / 0.75, torch.zeros_like(dy)))


@pytest.mark.parametrize("name", NAMES)
def test_the_neutral_layer_on_cupy_arrays(name):
    check_neutral_layer_on_cupy(name)


def check_neutral_layer_on_cupy(name, device=None):
    """Sample 0 of op ``name`` through the framework-neutral layer (``d.forward``, then ``d.backward`` of random
    cotangents) on CuPy arrays made on ``device`` (None: the current one), against torch's float64 CPU ops; every
    output and gradient must be on that device. Also run by the two-GPU tier on device 1."""
    cp = pytest.importorskip("cupy")
    if name in ("dropout",):
        pytest.skip("dropout is random: test_dropout_mask_gradient")
    d = autograd.get(name)
    inputs, kw = _case(name, 0, seed=11)
    if any(isinstance(a, np.ndarray) and a.dtype.name == "float32" for a in inputs) and name == "sdpa":
        from ..l3 import attention as att

        if att.AS_FLOAT32:
            pytest.skip("no ml_dtypes here: CuPy has no bfloat16 without it")
    on = cp.cuda.Device(device if device is not None else cp.cuda.runtime.getDevice())
    with on:
        ins = [None if a is None else cp.asarray(a) for a in inputs]
        kwd = {k: (cp.asarray(v) if k in d.arrays and isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    outs, res = d.forward(*ins, **kwd)
    leaves = [_torch(a, "cpu", grad=True) for a in inputs]
    want = REFS[name](leaves, _split(d, kw, "cpu"))
    rng = np.random.default_rng(2)
    tol, gtol = _tol(inputs)
    douts, loss = [], 0.0
    for j, (o, w) in enumerate(zip(outs, want)):
        assert o is None or o.device.id == on.id, f"{name} output {j} on device {o.device.id}, not {on.id}"
        if w is not None:
            assert _rel(_host(cp.asnumpy(o)), w) < tol
        if d.carries_gradient(j) and w is not None and o.dtype.name in ("float16", "bfloat16", "float32", "float64"):
            c = rng.standard_normal(o.shape).astype(o.dtype)
            with on:
                douts.append(cp.asarray(c))
            loss = loss + (w * _host(c)).sum()
        else:
            douts.append(None)
    if isinstance(loss, float):
        return
    options = {k: v for k, v in kwd.items() if k not in d.arrays}
    grads = d.backward(res, tuple(douts), tuple(a is not None for a in ins), **options)
    diff = [(g, t) for g, t in zip(grads, leaves) if t is not None and t.requires_grad]
    g_ref = torch.autograd.grad(loss, [t for _, t in diff], allow_unused=True)
    for (g, _), r in zip(diff, g_ref):
        if r is not None:
            assert g is not None and g.device.id == on.id and _rel(_host(cp.asnumpy(g)), r) < gtol


def test_the_framework_free_tape_trains_a_tiny_model():
    """Digits (scikit-learn's 8x8), conv -> ReLU -> max pool -> conv (the classifier) -> log-softmax, with CuPy
    arrays and the tape in tests/l3/tape.py: no autograd framework at all."""
    cp = pytest.importorskip("cupy")
    datasets = pytest.importorskip("sklearn.datasets")
    from ..l3.tape import Tape

    data = datasets.load_digits()
    x_all = cp.asarray(data.images[:, None].astype(np.float32) / 16.0)
    y_all = cp.asarray(data.target)
    rng = np.random.default_rng(0)
    w1 = cp.asarray(rng.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.3)
    w2 = cp.asarray(rng.standard_normal((10, 16, 4, 4)).astype(np.float32) * 0.1)
    losses = []
    for _ in range(150):
        idx = cp.asarray(rng.integers(0, len(data.target), 128))
        x, y = x_all[idx], y_all[idx]
        tape = Tape()
        h = tape("convolution", x, w1, None, padding=1)
        h = tape("activation", h, mode="relu")
        h = tape("pooling", h, window=2, stride=2)
        logits = tape("convolution", h, w2, None)  # (N, 10, 1, 1)
        logp = tape("softmax", logits, axis=1, log=True)
        onehot = cp.zeros_like(logp)
        onehot[cp.arange(len(y)), y, 0, 0] = 1
        losses.append(float(-(logp * onehot).sum() / len(y)))
        g1, g2 = tape.grad(logp, -onehot / len(y), [w1, w2])
        w1 -= 0.5 * g1
        w2 -= 0.5 * g2
    assert np.mean(losses[-10:]) < 0.35 * np.mean(losses[:10]), losses[::15]
    h = autograd.get("pooling").forward(
        autograd.get("activation").forward(autograd.get("convolution").forward(x_all, w1, None, padding=1)[0][0])[0][0],
        window=2, stride=2)[0][0]  # fmt: skip
    pred = autograd.get("convolution").forward(h, w2, None)[0][0].reshape(len(y_all), 10).argmax(axis=1)
    assert float((pred == y_all).mean()) > 0.85


def test_a_small_model_under_torch_compile_matches_eager():
    import cudnnkit.torch as ct

    torch.manual_seed(0)
    x = torch.randn(4, 3, 16, 16, device="cuda")
    w = (torch.randn(8, 3, 3, 3, device="cuda") * 0.2).requires_grad_()
    scale = torch.ones(8, device="cuda", requires_grad=True)
    bias = torch.zeros(8, device="cuda", requires_grad=True)

    def model(x):
        h = ct.op("convolution")(x, w, None, padding=1)
        h = ct.op("batch_norm")(h, scale, bias, None, running_mean=torch.zeros(8, device="cuda"),
                                running_var=torch.ones(8, device="cuda"))  # fmt: skip
        h = h[0] if isinstance(h, tuple) else h
        h = ct.op("activation")(h, mode="relu")
        h = ct.op("pooling")(h, window=2, stride=2)
        return ct.op("softmax")(h.flatten(1), axis=-1)

    eager = model(x)
    (ge,) = torch.autograd.grad(eager.square().sum(), [w])
    for mode in ("default", "reduce-overhead"):
        compiled = torch.compile(model, fullgraph=True, mode=mode)
        got = compiled(x)
        (gc,) = torch.autograd.grad(got.square().sum(), [w])
        assert _rel(got, eager) < 1e-5 and _rel(gc, ge) < 1e-4, mode
