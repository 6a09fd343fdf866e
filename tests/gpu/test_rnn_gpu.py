"""RNN (``cudnnRNNForward``, ``cudnnRNNBackwardData_v8``, ``cudnnRNNBackwardWeights_v8``) against a per-step float64
reference (``tests/rnn_reference.py``: the cell equations in torch on the CPU, gradients by autograd).

Weights are random, written into the flat buffer; the reference reads them back
through ``RNN.weight_params`` (so the views are tested too: a wrong view gives a
wrong forward). Outputs are compared on the valid steps; padded steps of ``y``
must hold ``padding_fill``. ``dw`` is compared per matrix and bias.
"""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import settings
from cudnnkit.ops.rnn import RNN, load_torch_params, rnn_backward, rnn_forward, to_torch_params, torch_param_names

from ..numerics import host, np_dtype, rel
from ..rnn_reference import Reference, pack, unpack

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 5e-3}
CELLS = ["relu", "tanh", "lstm", "gru"]


def _dev(xp, a, dtype):
    return xp.from_numpy(np.ascontiguousarray(a).astype(np_dtype(dtype)), 0)


def _weights(xp, rnn, rng, scale=0.4):
    like = xp.from_numpy(np.zeros(1, np_dtype(rnn.dtype)), 0)
    n = rnn.weight_count(like)
    w = _dev(xp, rng.uniform(-scale, scale, n), rnn.dtype)
    params = [
        [(None if p.matrix is None else host(xp, p.matrix), None if p.bias is None else host(xp, p.bias)) for p in row]
        for row in rnn.weight_params(w)
    ]
    return w, params


def _to_layout(a, layout, lengths):
    if layout == "seq_major":
        return a
    if layout == "batch_major":
        return a.transpose(1, 0, 2)
    return pack(a, lengths)


def _from_layout(a, layout, lengths, T):
    if layout == "seq_major":
        return a
    if layout == "batch_major":
        return a.transpose(1, 0, 2)
    return unpack(a, lengths, T)


def run_case(
    xp,
    rnn,
    *,
    T=5,
    N=3,
    lengths=None,
    layout="seq_major",
    with_h=True,
    backward=True,
    seed=0,
    fill=0.0,
    dhy=True,
    tol=None,
):
    rng = np.random.default_rng(seed)
    dt = rnn.dtype
    w, params = _weights(xp, rnn, rng)
    L = rnn.num_layers * rnn.num_directions
    x = rng.standard_normal((T, N, rnn.input_size))
    hx = rng.standard_normal((L, N, rnn.output_size)) * 0.5 if with_h else None
    cx = rng.standard_normal((L, N, rnn.hidden_size)) * 0.5 if with_h and rnn.cell == "lstm" else None
    # the reference sees the values the device holds
    q = lambda a: None if a is None else a.astype(np_dtype(dt)).astype(np.float64)  # noqa: E731
    x, hx, cx = q(x), q(hx), q(cx)
    ref = Reference(rnn, x, params, hx, cx, lengths, fill)
    ry, rhy, rcy = ref.outputs()
    valid = ref.valid

    kw = dict(rnn=rnn, layout=layout, seq_lengths=lengths)
    xd = _dev(xp, _to_layout(x, layout, lengths if lengths is not None else [T] * N), dt)
    hxd = None if hx is None else _dev(xp, hx, dt)
    cxd = None if cx is None else _dev(xp, cx, dt)
    y, hy, cy, reserve = rnn_forward(xd, w, hxd, cxd, training=True, padding_fill=fill, **kw)
    lens = lengths if lengths is not None else [T] * N
    gy = _from_layout(host(xp, y), layout, lens, T)
    tol = tol or TOL[dt]
    assert rel(gy[valid], ry[valid]) < tol
    if layout != "packed":
        assert np.all(gy[~valid] == fill)
    assert rel(host(xp, hy), rhy) < tol
    if rnn.cell == "lstm":
        assert rel(host(xp, cy), rcy) < tol
    else:
        assert cy is None
    # inference gives the same outputs
    y2, hy2, _ = rnn_forward(xd, w, hxd, cxd, padding_fill=fill, **kw)
    assert rel(_from_layout(host(xp, y2), layout, lens, T)[valid], ry[valid]) < tol
    assert rel(host(xp, hy2), rhy) < tol
    if not backward:
        return
    dy = q(rng.standard_normal(ry.shape)) * valid[:, :, None]
    dh = q(rng.standard_normal(rhy.shape)) if dhy else None
    dc = q(rng.standard_normal(rcy.shape)) if dhy and rnn.cell == "lstm" else None
    rdx, rdhx, rdcx, rdp = ref.grads(dy, dh, dc)
    dyd = _dev(xp, _to_layout(dy, layout, lens), dt)
    dx, dhx, dcx, dw = rnn_backward(
        xd,
        y,
        dyd,
        w,
        reserve,
        hxd,
        cxd,
        None if dh is None else _dev(xp, dh, dt),
        None if dc is None else _dev(xp, dc, dt),
        **kw,
    )
    gtol = min(tol * 10, 1e-2)  # gradients: float64 1e-9, float32 2e-4, float16 1e-2 (DESIGN's upper bound)
    gdx = _from_layout(host(xp, dx), layout, lens, T)
    assert rel(gdx[valid], rdx[valid]) < gtol
    if with_h:
        assert rel(host(xp, dhx), rdhx) < gtol
        if rnn.cell == "lstm":
            assert rel(host(xp, dcx), rdcx) < gtol
    else:
        assert dhx is None and dcx is None
    got = rnn.weight_params(dw)
    for pl, row in enumerate(rdp):
        for lin_id, (dm, db) in enumerate(row):
            p = got[pl][lin_id]
            for what, r, g in (("matrix", dm, p.matrix), ("bias", db, p.bias)):
                assert (r is None) == (g is None), (pl, lin_id, what)
                if r is None:
                    continue
                got_g = host(xp, g)
                if np.linalg.norm(r) > 0:
                    assert rel(got_g, r) < gtol, (pl, lin_id, p.gate, what)
                else:  # e.g. a bias whose gradient vanishes: the result must vanish too
                    assert np.abs(got_g).max() <= gtol * max(1.0, np.abs(host(xp, dw)).max()), (pl, lin_id, what)
    return dict(y=y, w=w, dw=dw, x=xd, reserve=reserve)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cells_layers_directions(xp, cell, layers, bidirectional):
    rnn = RNN(cell, input_size=4, hidden_size=6, num_layers=layers, bidirectional=bidirectional, dtype="float64")
    run_case(xp, rnn, seed=layers * 2 + bidirectional)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_reduced_precision(xp, dtype, cell):
    rnn = RNN(cell, input_size=8, hidden_size=16, num_layers=2, bidirectional=True, dtype=dtype)
    with settings(allow_tf32=False):
        run_case(xp, rnn, T=6, N=4)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_projection(xp, bidirectional):
    rnn = RNN(
        "lstm", input_size=5, hidden_size=8, proj_size=3, num_layers=2, bidirectional=bidirectional, dtype="float64"
    )
    assert rnn.gates[-1] == "P"
    run_case(xp, rnn)


@pytest.mark.parametrize("cell", CELLS)
def test_skip_input(xp, cell):
    rnn = RNN(cell, input_size=6, hidden_size=6, num_layers=2, input_mode="skip", dtype="float64")
    params = rnn.weight_params(_weights(xp, rnn, np.random.default_rng(0))[0])
    g = len(rnn.gates) // 2
    assert all(p.matrix is None for p in params[0][:g])  # no input matrices in the first layer
    assert all(p.matrix is not None for p in params[1][:g])
    run_case(xp, rnn)


@pytest.mark.parametrize("bias_mode", ["double", "single_input", "single_recurrent", "none"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "tanh"])
def test_bias_modes(xp, cell, bias_mode):
    rnn = RNN(cell, input_size=4, hidden_size=5, num_layers=2, bidirectional=True, bias_mode=bias_mode, dtype="float64")
    params = rnn.weight_params(_weights(xp, rnn, np.random.default_rng(0))[0])
    g = len(GATES_NO_P(rnn)) // 2
    has_in = [p.bias is not None for p in params[0][:g]]
    has_rec = [p.bias is not None for p in params[0][g : 2 * g]]
    assert all(has_in) == (bias_mode in ("double", "single_input")) and any(has_in) == all(has_in)
    assert all(has_rec) == (bias_mode in ("double", "single_recurrent")) and any(has_rec) == all(has_rec)
    run_case(xp, rnn)


def GATES_NO_P(rnn):
    return [g for g in rnn.gates if g != "P"]


@pytest.mark.parametrize("layout", ["seq_major", "batch_major", "packed"])
@pytest.mark.parametrize("cell", ["lstm", "gru", "relu"])
def test_variable_lengths(xp, cell, layout):
    rnn = RNN(cell, input_size=4, hidden_size=5, num_layers=2, bidirectional=True, dtype="float64")
    lengths = np.array([7, 5, 5, 2, 1], np.int32)
    if layout != "packed":
        lengths = np.random.default_rng(1).permutation(lengths)
    run_case(xp, rnn, T=7, N=5, lengths=lengths, layout=layout, fill=-3.0)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_absent_states(xp, cell):
    rnn = RNN(cell, input_size=4, hidden_size=5, num_layers=2, bidirectional=True, dtype="float64")
    run_case(xp, rnn, with_h=False)
    run_case(xp, rnn, with_h=True, dhy=False, seed=3)


def test_cell_clip(xp):
    rnn = RNN("lstm", input_size=4, hidden_size=5, num_layers=2, bidirectional=True, cell_clip=0.3, dtype="float64")
    run_case(xp, rnn, tol=1e-7)  # the bounds are float32 values
    rnn = RNN("lstm", input_size=4, hidden_size=5, cell_clip=(-0.2, 0.5), dtype="float64")
    run_case(xp, rnn, tol=1e-7)


@pytest.mark.parametrize("padded_io", [None, True])
@pytest.mark.parametrize("layout", ["seq_major", "packed"])
def test_padded_io_choices(xp, padded_io, layout):
    """Full-length seq-major data runs packed without padded I/O by default; forcing it on gives the same results."""
    rnn = RNN(
        "lstm", input_size=4, hidden_size=5, num_layers=2, bidirectional=True, padded_io=padded_io, dtype="float64"
    )
    run_case(xp, rnn, layout=layout, lengths=np.array([5, 5, 5], np.int32) if layout == "packed" else None)
    if layout == "packed":
        run_case(
            xp, RNN("gru", 4, 5, padded_io=False, dtype="float64"), layout=layout, lengths=np.array([5, 3, 1], np.int32)
        )


@pytest.mark.parametrize("algo", ["persist_static", "persist_dynamic", "persist_static_small_h"])
def test_persistent_algos(xp, algo):
    rnn = RNN("lstm", input_size=32, hidden_size=32, num_layers=2, algo=algo, dtype="float16")
    run_case(xp, rnn, T=6, N=4)
    run_case(xp, rnn, T=6, N=2, seed=5)  # persist_dynamic rebuilds for a new batch size


def test_accumulate_and_reserve_reuse(xp):
    rnn = RNN("gru", input_size=4, hidden_size=5, dtype="float64")
    r = run_case(xp, rnn)
    with pytest.raises(ValueError, match="reserve has been used by an rnn_backward already"):
        rnn_backward(r["x"], r["y"], r["y"], r["w"], r["reserve"], rnn=rnn)
    rng = np.random.default_rng(0)
    dy = _dev(xp, rng.standard_normal((5, 3, 5)), "float64")

    def fresh():
        return rnn_forward(r["x"], r["w"], rnn=rnn, training=True)

    y, _, _, res = fresh()
    # keep_reserve: the backward works on a copy, so the same reserve gives the same gradients again
    dx1, _, _, dw1 = rnn_backward(r["x"], y, dy, r["w"], res, rnn=rnn, keep_reserve=True)
    dx2, _, _, dw = rnn_backward(r["x"], y, dy, r["w"], res, rnn=rnn)
    a = host(xp, dw)
    assert np.array_equal(host(xp, dx1), host(xp, dx2)) and np.array_equal(host(xp, dw1), a)
    assert rel(a, host(xp, r["dw"])) > 1e-3  # another dy, another gradient
    y, _, _, res = fresh()
    rnn_backward(r["x"], y, dy, r["w"], res, rnn=rnn, dw=dw, accumulate=True)  # adds: 2a
    assert rel(host(xp, dw), 2 * a) < 1e-12
    y, _, _, res = fresh()
    rnn_backward(r["x"], y, dy, r["w"], res, rnn=rnn, dw=dw)  # a given dw is zeroed first
    assert rel(host(xp, dw), a) < 1e-12


def test_dropout_between_layers(xp):
    rnn = RNN("lstm", input_size=4, hidden_size=16, num_layers=3, dropout=0.5, dropout_seed=7, dtype="float32")
    rng = np.random.default_rng(0)
    w, _ = _weights(xp, rnn, rng)
    x = _dev(xp, rng.standard_normal((6, 4, 4)), "float32")
    base = RNN("lstm", input_size=4, hidden_size=16, num_layers=3, dtype="float32")
    y_inf = host(xp, rnn_forward(x, w, rnn=rnn)[0])
    assert rel(y_inf, host(xp, rnn_forward(x, w, rnn=base)[0])) < 1e-6  # inference: no dropout
    state = rnn.dropout_state(x)
    snap = state.snapshot()
    y1 = host(xp, rnn_forward(x, w, rnn=rnn, training=True)[0])
    y2 = host(xp, rnn_forward(x, w, rnn=rnn, training=True)[0])
    assert rel(y1, y_inf) > 1e-2 and rel(y1, y2) > 1e-3  # masks differ per call
    state.restore(snap)
    assert np.array_equal(host(xp, rnn_forward(x, w, rnn=rnn, training=True)[0]), y1)


def test_poisoned_out_and_hx_strides(xp):
    rnn = RNN("lstm", input_size=4, hidden_size=5, num_layers=2, dtype="float64")
    rng = np.random.default_rng(0)
    w, params = _weights(xp, rnn, rng)
    x = rng.standard_normal((4, 3, 4))
    hx = rng.standard_normal((3, 2, 5))  # (N, L, H) in memory: a transposed hx view
    hxd = _dev(xp, hx, "float64")
    hxd = hxd.permute(1, 0, 2) if xp.name == "torch" else hxd.transpose(1, 0, 2)
    out = _dev(xp, np.full((4, 3, 5), np.nan), "float64")
    y, hy, cy = rnn_forward(_dev(xp, x, "float64"), w, hxd, rnn=rnn, out=out)
    assert y is out
    ref = Reference(rnn, x, params, hx.transpose(1, 0, 2), None)
    assert rel(host(xp, y), ref.outputs()[0]) < 1e-10
    assert rel(host(xp, hy), ref.outputs()[1]) < 1e-10


@pytest.mark.parametrize("cell", CELLS)
def test_finite_differences(xp, cell):
    """Our backward against central differences of our own forward (float64), 2 layers, bidirectional."""
    rnn = RNN(cell, input_size=3, hidden_size=4, num_layers=2, bidirectional=True, dtype="float64")
    rng = np.random.default_rng(2)
    w, _ = _weights(xp, rnn, rng)
    T, N = 4, 2
    x = rng.standard_normal((T, N, 3))
    hx = rng.standard_normal(rnn.hidden_shape(N)) * 0.5
    cx = rng.standard_normal(rnn.cell_shape(N)) * 0.5 if cell == "lstm" else None
    gy = rng.standard_normal((T, N, 8))
    gh = rng.standard_normal(rnn.hidden_shape(N))
    wn = host(xp, w)

    def loss(x_, w_, hx_, cx_):
        y, hy, cy = rnn_forward(
            _dev(xp, x_, "float64"),
            _dev(xp, w_, "float64"),
            _dev(xp, hx_, "float64"),
            None if cx_ is None else _dev(xp, cx_, "float64"),
            rnn=rnn,
        )
        return float((host(xp, y) * gy).sum() + (host(xp, hy) * gh).sum())

    xd, hxd = _dev(xp, x, "float64"), _dev(xp, hx, "float64")
    cxd = None if cx is None else _dev(xp, cx, "float64")
    y, hy, cy, res = rnn_forward(xd, w, hxd, cxd, rnn=rnn, training=True)
    dx, dhx, dcx, dw = rnn_backward(
        xd, y, _dev(xp, gy, "float64"), w, res, hxd, cxd, _dev(xp, gh, "float64"), None, rnn=rnn
    )
    eps = 1e-6
    checks = [("x", x, host(xp, dx)), ("hx", hx, host(xp, dhx)), ("w", wn, host(xp, dw))]
    if cx is not None:
        checks.append(("cx", cx, host(xp, dcx)))
    for name, a, g in checks:
        flat = a.reshape(-1)
        for i in rng.choice(flat.size, size=min(12, flat.size), replace=False):
            p, m = flat.copy(), flat.copy()
            p[i] += eps
            m[i] -= eps
            args = {"x": x, "w": wn, "hx": hx, "cx": cx}
            args[name] = p.reshape(a.shape)
            fp = loss(args["x"], args["w"], args["hx"], args["cx"])
            args[name] = m.reshape(a.shape)
            fm = loss(args["x"], args["w"], args["hx"], args["cx"])
            fd = (fp - fm) / (2 * eps)
            assert abs(fd - g.reshape(-1)[i]) < 1e-6 * max(1.0, abs(fd)), (name, i, fd, g.reshape(-1)[i])


# ------------------------------------------------------------------ torch round trip


def _torch_module(cell, **kw):
    import torch

    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "relu": torch.nn.RNN, "tanh": torch.nn.RNN}[cell]
    if cell in ("relu", "tanh"):
        kw["nonlinearity"] = cell
    return cls(**kw).double()


@pytest.mark.parametrize("cell,proj", [("lstm", 0), ("lstm", 3), ("gru", 0), ("relu", 0), ("tanh", 0)])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_round_trip(xp, cell, proj, bias):
    torch = pytest.importorskip("torch", reason="the round trip compares with torch.nn modules")

    torch.manual_seed(0)
    kw = dict(input_size=4, hidden_size=6, num_layers=2, bidirectional=True, bias=bias)
    if proj:
        kw["proj_size"] = proj
    mod = _torch_module(cell, **kw)
    rnn = RNN(
        cell,
        input_size=4,
        hidden_size=6,
        num_layers=2,
        bidirectional=True,
        proj_size=proj,
        bias_mode="double" if bias else "none",
        dtype="float64",
    )
    assert torch_param_names(rnn) == [n for n, _ in mod.named_parameters()]
    params = {n: _dev(xp, p.detach().numpy(), "float64") for n, p in mod.named_parameters()}
    w = load_torch_params(rnn, params)
    back = to_torch_params(rnn, w)
    for n, p in mod.named_parameters():
        assert np.array_equal(host(xp, back[n]), p.detach().numpy()), n
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    h0 = torch.randn(4, 3, proj or 6, dtype=torch.float64)
    args = (h0, torch.randn(4, 3, 6, dtype=torch.float64)) if cell == "lstm" else h0
    with torch.no_grad():
        ty, th = mod(x, args)
    y, hy, cy = rnn_forward(
        _dev(xp, x.numpy(), "float64"),
        w,
        _dev(xp, h0.numpy(), "float64"),
        _dev(xp, args[1].numpy(), "float64") if cell == "lstm" else None,
        rnn=rnn,
    )
    assert rel(host(xp, y), ty.numpy()) < 1e-12
    if cell == "lstm":
        assert rel(host(xp, hy), th[0].numpy()) < 1e-12 and rel(host(xp, cy), th[1].numpy()) < 1e-12
    else:
        assert rel(host(xp, hy), th.numpy()) < 1e-12


# ------------------------------------------------------------------ bad input on the GPU side


def test_bad_weights(xp):
    rnn = RNN("lstm", input_size=4, hidden_size=5, dtype="float32")
    x = _dev(xp, np.zeros((3, 2, 4)), "float32")
    n = rnn.weight_count(x)
    with pytest.raises(ValueError, match="w has .* elements but this RNN's weight space needs"):
        rnn_forward(x, _dev(xp, np.zeros(n - 1), "float32"), rnn=rnn)
    with pytest.raises(TypeError, match="w has dtype float64 but the RNN's dtype is float32"):
        rnn_forward(x, _dev(xp, np.zeros(n), "float64"), rnn=rnn)
    with pytest.raises(TypeError, match="x has dtype float64"):
        rnn_forward(_dev(xp, np.zeros((3, 2, 4)), "float64"), _dev(xp, np.zeros(n), "float32"), rnn=rnn)
    with pytest.raises(ValueError, match="feature size 3 but the RNN's input_size is 4"):
        rnn_forward(_dev(xp, np.zeros((3, 2, 3)), "float32"), _dev(xp, np.zeros(n), "float32"), rnn=rnn)
    with pytest.raises(ValueError, match=r"seq_lengths\[1\] is 4; each length must be in \[1, T=3\]"):
        rnn_forward(x, _dev(xp, np.zeros(n), "float32"), rnn=rnn, seq_lengths=[3, 4])
    with pytest.raises(ValueError, match="hx must have shape"):
        rnn_forward(x, _dev(xp, np.zeros(n), "float32"), _dev(xp, np.zeros((1, 3, 5)), "float32"), rnn=rnn)
    with pytest.raises(ValueError, match="reserve must be"):
        y, _, _, r = rnn_forward(x, _dev(xp, np.zeros(n), "float32"), rnn=rnn, training=True)
        rnn_backward(x, y, y, _dev(xp, np.zeros(n), "float32"), r[:-1], rnn=rnn)


# ----------------------------------------------------------------------------- algo="auto"


def _inputs(xp, rnn, T, N, seed=0):
    rng = np.random.default_rng(seed)
    w, _ = _weights(xp, rnn, rng, scale=0.1)
    x = _dev(xp, rng.standard_normal((T, N, rnn.input_size)), rnn.dtype)
    dy = _dev(xp, rng.standard_normal((T, N, rnn.num_directions * rnn.output_size)), rnn.dtype)
    return x, w, dy


def _fb(x, w, dy, rnn):
    y, hy, cy, res = rnn_forward(x, w, rnn=rnn, training=True)
    dx, _, _, dw = rnn_backward(x, y, dy, w, res, rnn=rnn)
    return y, hy, cy, dx, dw


def _same(xp, a, b):
    return all((p is None and q is None) or np.array_equal(host(xp, p), host(xp, q)) for p, q in zip(a, b))


@pytest.mark.parametrize(
    "cell, h, n, dtype, want",
    [
        ("lstm", 256, 8, "float16", "persist_static"),  # the N8 H256 benchmark row
        ("gru", 64, 16, "float32", "persist_static_small_h"),
        ("tanh", 512, 256, "float32", "standard"),  # 512*256 is far past float32's persistent work size
    ],
)
def test_auto_choice_runs_the_named_algorithm_bitwise(xp, cell, h, n, dtype, want):
    """algo="auto" (the default) runs what chosen_algo names, and gives bitwise what naming that algorithm gives,
    forward and backward (one flat weight buffer serves both: the layouts are the same)."""
    import dataclasses

    rnn = RNN(cell, 48, h, dtype=dtype)
    assert rnn.algo == "auto"
    x, w, dy = _inputs(xp, rnn, 7, n)
    assert rnn.chosen_algo(x, n, 7) == want
    assert rnn.chosen_algo(x, n, 7, full=False) == "standard"  # persistent kernels take full-length batches only
    named = dataclasses.replace(rnn, algo=want)
    assert named.weight_count(x) == rnn.weight_count(x)
    assert _same(xp, rnn_forward(x, w, rnn=rnn), rnn_forward(x, w, rnn=named))
    assert _same(xp, _fb(x, w, dy, rnn), _fb(x, w, dy, named))


@pytest.mark.parametrize("cell", ["lstm", "gru", "tanh"])
@pytest.mark.parametrize("dtype, tf32", [("float16", True), ("float32", True), ("float32", False)])
def test_auto_against_the_reference(xp, cell, dtype, tf32):
    """Shapes where auto picks a persistent algorithm, against the float64 reference, forward and backward.
    cuDNN's persistent kernels compute float32 in TF32 when ``allow_tf32`` (the default, as in torch) lets them
    (measured: 2.7e-4 for a float32 LSTM, where the standard algorithm stays within 2e-5), so float32 is held to
    TF32's tolerance there and to float32's with ``allow_tf32=False``."""
    rnn = RNN(cell, 16, 64, num_layers=2, dtype=dtype)
    like = xp.from_numpy(np.zeros(1, np_dtype(dtype)), 0)
    with settings(allow_tf32=tf32):
        chosen = rnn.chosen_algo(like, 8, 6, training=True)
        tol = 2e-3 if dtype == "float32" and tf32 else TOL[dtype]
        run_case(xp, rnn, T=6, N=8, tol=tol)
    if tf32:
        assert chosen != "standard"


def test_auto_backward_runs_the_forwards_algorithm(xp, monkeypatch):
    """The reserve remembers the algorithm of its training forward: a backward whose shape class auto would now
    decide otherwise (decisions forgotten, the rule changed) still runs the forward's."""
    import dataclasses

    from cudnnkit.ops import _rnn_desc
    from cudnnkit.ops import rnn as rnn_mod

    rnn = RNN("lstm", 40, 256, dtype="float16")
    x, w, dy = _inputs(xp, rnn, 9, 8, seed=3)
    assert rnn.chosen_algo(x, 8, 9, training=True) == "persist_static"
    y, _, _, res = rnn_forward(x, w, rnn=rnn, training=True)
    monkeypatch.setattr(_rnn_desc, "_auto_algo", lambda *a: ("standard",))
    b = rnn._built(rnn_mod.prepare(("x", x))[0], x)  # shared by CuPy and torch arrays on one device
    b.auto.clear()
    try:
        assert rnn.chosen_algo(x, 8, 9, training=True) == "standard"
        dx, _, _, dw = rnn_backward(x, y, dy, w, res, rnn=rnn)
    finally:
        b.auto.clear()  # the decision the patched rule made is not the measured rule's
    named = dataclasses.replace(rnn, algo="persist_static")
    y2, _, _, res2 = rnn_forward(x, w, rnn=named, training=True)
    dx2, _, _, dw2 = rnn_backward(x, y2, dy, w, res2, rnn=named)
    assert _same(xp, (y, dx, dw), (y2, dx2, dw2))


def test_auto_takes_the_next_algorithm_when_cudnn_refuses_at_the_call(xp, monkeypatch):
    """cuDNN 9.19 accepts the small-h descriptor of an H256 LSTM and refuses it only at the call (measured on an
    H200): auto then runs the next choice, in that same call, and keeps it."""
    import dataclasses

    from cudnnkit.ops import _rnn_desc

    monkeypatch.setattr(_rnn_desc, "_auto_algo", lambda *a: ("persist_static_small_h", "persist_static", "standard"))
    rnn = RNN("lstm", 24, 256, dtype="float16")
    x, w, _ = _inputs(xp, rnn, 5, 8, seed=4)
    got = rnn_forward(x, w, rnn=rnn)
    assert rnn.chosen_algo(x, 8, 5) == "persist_static"
    assert _same(xp, got, rnn_forward(x, w, rnn=dataclasses.replace(rnn, algo="persist_static")))


def test_forward_express_path(xp):
    """A repeated rnn_forward (same arrays' metadata and keywords) takes the express path, with bitwise the
    results of the full sequence; a new keyword or shape misses."""
    from cudnnkit.ops import _express
    from cudnnkit.ops import rnn as rnn_mod

    rnn = RNN("gru", 20, 32, dtype="float32")
    x, w, _ = _inputs(xp, rnn, 6, 4, seed=5)
    rnn_mod._fwd_express.clear()
    first = rnn_forward(x, w, rnn=rnn)
    assert len(rnn_mod._fwd_express) == 1
    calls = []
    real = rnn_mod._forward_express
    try:
        rnn_mod._forward_express = lambda *a: calls.append(1) or real(*a)
        again = rnn_forward(x, w, rnn=rnn)
        rnn_forward(x, w, rnn=rnn, padding_fill=1.0)  # another keyword: the full sequence (then recorded)
    finally:
        rnn_mod._forward_express = real
    assert calls == [1] and len(rnn_mod._fwd_express) == 2
    assert _same(xp, first, again)
    _express.enabled(False)
    try:
        assert _same(xp, first, rnn_forward(x, w, rnn=rnn))
    finally:
        _express.enabled(True)
