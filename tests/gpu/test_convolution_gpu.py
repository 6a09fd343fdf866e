"""Convolution, both paths (the graph: ``conv_fprop``/``conv_dgrad``/``conv_wgrad``, fused bias/residual/activation;
the legacy calls) against the float64 references of ``tests/conv_reference.py`` (themselves held to torch on the
CPU): dtypes, layouts, groups and depthwise, dilation, 1-d to 3-d, both modes, asymmetric padding, blends into
poisoned outputs, the transposed convolution, the algorithm settings and the workspace fallback."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops, settings
from cudnnkit.ops import _conv_algos as ca
from cudnnkit.ops.convolution import _QUANT_OUT

from .. import act_reference as aref
from .. import conv_reference as ref
from ..numerics import dev, host, poisoned, rel, seen

pytestmark = pytest.mark.gpu

#: relative error per dtype (float32 with TF32 allowed is TF32's; the half types accumulate in float32)
TOL = {"float64": 1e-12, "float32": 1e-5, "tf32": 3e-3, "float16": 3e-3, "bfloat16": 2e-2}


def _tol(dtype, tf32):
    return TOL["tf32"] if dtype == "float32" and tf32 else TOL[dtype]


CASES = [
    # nsp, N, C, K, spatial, kernel, stride, pad, dilation, groups, mode
    (2, 2, 8, 16, (9, 8), (3, 3), (1, 1), (1, 1), (1, 1), 1, "cross_correlation"),
    (2, 2, 8, 8, (9, 8), (3, 3), (2, 1), (1, 0), (2, 2), 2, "convolution"),
    (2, 3, 8, 8, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), 8, "cross_correlation"),  # depthwise
    (1, 2, 4, 6, (17,), (5,), (2,), (2,), (1,), 1, "cross_correlation"),
    (3, 1, 4, 4, (6, 5, 7), (3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 2, "cross_correlation"),
]


def _case(rng, c, dtype):
    nsp, n, ch, k, sp, ks, st, pd, dl, g, mode = c
    x = seen(rng.standard_normal((n, ch, *sp)), dtype)
    w = seen(rng.standard_normal((k, ch // g, *ks)) / np.sqrt(ch // g * np.prod(ks)), dtype)
    kw = dict(stride=st, padding=pd, dilation=dl, groups=g, mode=mode)
    rkw = dict(stride=st, pad=pd, dilation=dl, groups=g, mode=mode)
    return x, w, kw, rkw


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}d-g{c[9]}-{c[10][:5]}")
@pytest.mark.parametrize("dtype, tf32", [("float16", True), ("bfloat16", True), ("float32", True),
                                         ("float32", False), ("float64", True)])  # fmt: skip
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("prefer", ["auto", "legacy"])
def test_forward_and_backwards_match_the_reference(xp, case, dtype, tf32, layout, prefer):
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    if prefer == "legacy" and dtype == "float64":
        pytest.skip("float64 runs the legacy calls under prefer='auto' already")
    rng = np.random.default_rng(hash((case[0], case[9], dtype)) % 2**32)
    x, w, kw, rkw = _case(rng, case, dtype)
    tol = _tol(dtype, tf32)
    with settings(allow_tf32=tf32, prefer=prefer):
        xd, wd = dev(xp, x, dtype, layout), dev(xp, w, dtype, layout)
        y = ops.convolution_forward(xd, wd, **kw)
        want = ref.conv_forward(x, w, **rkw)
        assert y.shape == want.shape and rel(host(xp, y), want) < tol
        path = ops.last_path()[1]
        if prefer == "legacy" or dtype == "float64":
            assert path == "legacy"
        elif layout == "nhwc" and dtype in ("float16", "bfloat16"):
            assert path == "graph"  # the layout the graph engines are for (elsewhere cuDNN may refuse: legacy)
        dy = seen(rng.standard_normal(want.shape), dtype)
        dyd = dev(xp, dy, dtype, layout)
        dx = ops.convolution_backward_data(dyd, wd, x_shape=x.shape, **kw)
        assert rel(host(xp, dx), ref.conv_backward_data(dy, w, x.shape, **rkw)) < tol * 4
        dw = ops.convolution_backward_filter(xd, dyd, w_shape=w.shape, **kw)
        assert rel(host(xp, dw), ref.conv_backward_filter(x, dy, w.shape, **rkw)) < tol * 4
        db = ops.convolution_backward_bias(dyd)
        assert db.shape == (w.shape[0],) and rel(host(xp, db), ref.conv_backward_bias(dy)) < tol * 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(64, 32, 32, 32), (3, 24, 5, 7), (2, 16, 3, 4, 5)])
def test_bias_gradient_graph(xp, dtype, shape):
    """A float32 channels-last dy's bias gradient runs the one-node reduction graph (the path is asserted), into a
    poisoned out=, and again from the express path on fresh arrays; the half types (no engine writes them), an
    alpha/beta blend and a C-order dy take the legacy call. Each against the float64 sum."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(len(shape) * 7 + shape[1])
    tol = TOL[dtype] * 4
    for _ in range(3):  # the first call builds the plan, the later ones are express hits
        dy = seen(rng.standard_normal(shape), dtype)
        want = ref.conv_backward_bias(dy)
        dyd = dev(xp, dy, dtype, "nhwc")
        db = ops.convolution_backward_bias(dyd)
        assert ops.last_path() == ("convolution_backward_bias", "graph" if dtype == "float32" else "legacy")
        assert db.shape == (shape[1],) and rel(host(xp, db), want) < tol
        out = poisoned(xp, (shape[1],), dtype)
        assert ops.convolution_backward_bias(dyd, out=out) is out and rel(host(xp, out), want) < tol
    prev = rng.standard_normal(shape[1])
    out = dev(xp, seen(prev, dtype), dtype)
    ops.convolution_backward_bias(dyd, out=out, alpha=0.5, beta=-2.0)
    assert ops.last_path() == ("convolution_backward_bias", "legacy")
    assert rel(host(xp, out), 0.5 * want - 2.0 * seen(prev, dtype)) < tol
    db = ops.convolution_backward_bias(dev(xp, dy, dtype, "nchw"))
    assert ops.last_path() == ("convolution_backward_bias", "legacy")  # cuDNN 9.19 has no engine for C order
    assert rel(host(xp, db), want) < tol


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blends_into_poisoned_and_given_outputs(xp, dtype):
    """``out=`` with beta 0 overwrites NaN; beta != 0 blends; the output's own layout (channels-last) is kept."""
    rng = np.random.default_rng(1)
    x, w, kw, rkw = _case(rng, CASES[0], dtype)
    want = ref.conv_forward(x, w, **rkw)
    with settings(allow_tf32=False):
        xd, wd = dev(xp, x, dtype), dev(xp, w, dtype)
        out = poisoned(xp, want.shape, dtype)
        assert ops.convolution_forward(xd, wd, out=out, **kw) is out
        assert rel(host(xp, out), want) < TOL[dtype]
        prev = rng.standard_normal(want.shape)
        out2 = dev(xp, prev, dtype, "nhwc")
        ops.convolution_forward(xd, wd, out=out2, alpha=0.5, beta=-2.0, **kw)
        assert rel(host(xp, out2), 0.5 * want - 2.0 * prev) < TOL[dtype] * 4
        dw0 = rng.standard_normal(w.shape)
        dyd = dev(xp, seen(rng.standard_normal(want.shape), dtype), dtype)
        dwd = dev(xp, dw0, dtype)
        ops.convolution_backward_filter(xd, dyd, w_shape=w.shape, out=dwd, beta=1.0, **kw)  # accumulates
        want_dw = ref.conv_backward_filter(x, host(xp, dyd), w.shape, **rkw) + dw0
        assert rel(host(xp, dwd), want_dw) < TOL[dtype] * 4


def test_transposed_convolution_with_output_padding(xp):
    """backward data without ``x_shape`` is torch's ``conv_transpose`` size rule, ``output_padding`` included."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    dy = rng.standard_normal((2, 6, 5, 4))
    w = rng.standard_normal((6, 3, 3, 3))
    want = torch.nn.functional.conv_transpose2d(torch.tensor(dy), torch.tensor(w), stride=2, padding=1,
                                                output_padding=1).numpy()  # fmt: skip
    got = ops.convolution_backward_data(dev(xp, dy), dev(xp, w), stride=2, padding=1, output_padding=1)
    assert got.shape == want.shape and rel(host(xp, got), want) < 1e-12


def test_empty_batch(xp):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 2, 3, 3))
    x = np.zeros((0, 2, 6, 6))
    y = ops.convolution_forward(dev(xp, x), dev(xp, w))
    assert y.shape == (0, 4, 4, 4)
    dw = poisoned(xp, w.shape, "float64")
    ops.convolution_backward_filter(dev(xp, x), dev(xp, np.zeros((0, 4, 4, 4))), w_shape=w.shape, out=dw)
    assert np.all(host(xp, dw) == 0)  # a sum over nothing, NaN overwritten
    db = ops.convolution_backward_bias(dev(xp, np.zeros((0, 4, 4, 4))))
    assert np.all(host(xp, db) == 0)


@pytest.mark.parametrize("autotune", ["heuristics", "exhaustive", "off"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_algorithm_settings(xp, autotune, deterministic):
    rng = np.random.default_rng(4)
    x, w, kw, rkw = _case(rng, CASES[1], "float32")
    want = ref.conv_forward(x, w, **rkw)
    with settings(autotune=autotune, deterministic=deterministic, allow_tf32=False):
        a = host(xp, ops.convolution_forward(dev(xp, x, "float32"), dev(xp, w, "float32"), **kw))
        b = host(xp, ops.convolution_forward(dev(xp, x, "float32"), dev(xp, w, "float32"), **kw))
        dy = dev(xp, seen(rng.standard_normal(want.shape), "float32"), "float32")
        dw1 = host(xp, ops.convolution_backward_filter(dev(xp, x, "float32"), dy, w_shape=w.shape, **kw))
        dw2 = host(xp, ops.convolution_backward_filter(dev(xp, x, "float32"), dy, w_shape=w.shape, **kw))
    assert rel(a, want) < 1e-5 and np.array_equal(a, b)
    if deterministic:
        assert np.array_equal(dw1, dw2)


def test_workspace_limit_and_fallback(xp, monkeypatch, caplog):
    """A workspace that cannot be allocated falls back to an algorithm with a smaller one (logged), never raising
    out-of-memory; ``workspace_limit=0`` runs an algorithm without workspace."""
    from cudnnkit.runtime.launch import Launch

    rng = np.random.default_rng(5)
    x, w, kw, rkw = _case(rng, CASES[0], "float32")
    want = ref.conv_forward(x, w, **rkw)
    real = Launch.workspace

    def capped(self, nbytes, zeroed=False):
        if nbytes > 0:
            raise MemoryError(f"capped: {nbytes} bytes")
        return real(self, nbytes, zeroed)

    ca._algos.clear()
    monkeypatch.setattr(Launch, "workspace", capped)
    for prefer in ("auto", "legacy"):  # the graph plan's workspace falls back to the legacy call's fallback
        with settings(allow_tf32=False, prefer=prefer), caplog.at_level("INFO", logger="cudnnkit"):
            got = ops.convolution_forward(dev(xp, x, "float32"), dev(xp, w, "float32"), **kw)
        assert rel(host(xp, got), want) < 1e-5
    monkeypatch.setattr(Launch, "workspace", real)
    with settings(allow_tf32=False, workspace_limit=0):
        got = ops.convolution_forward(dev(xp, x, "float32"), dev(xp, w, "float32"), **kw)
    assert rel(host(xp, got), want) < 1e-5
    with settings(allow_tf32=False, workspace_limit=0, prefer="legacy"):
        got = ops.convolution_forward(dev(xp, x, "float32"), dev(xp, w, "float32"), **kw)
    assert rel(host(xp, got), want) < 1e-5
    assert all(ws == 0 for key, algos in [(k, ca._algos.peek(k)) for k in ca._algos.keys()] if key[3] == 0
               for _, ws, _m in algos)  # fmt: skip


def test_finite_differences_float64(xp):
    """Gradients by central differences in float64, through the ops themselves (not the reference)."""
    rng = np.random.default_rng(6)
    x, w, kw, _ = _case(rng, (2, 1, 2, 2, (5, 4), (3, 2), (1, 1), (1, 0), (1, 1), 1, "cross_correlation"), "float64")
    dy = rng.standard_normal(ops.convolution_forward(dev(xp, x), dev(xp, w), **kw).shape)

    def loss(xa, wa):
        return float(np.sum(host(xp, ops.convolution_forward(dev(xp, xa), dev(xp, wa), **kw)) * dy))

    dx = host(xp, ops.convolution_backward_data(dev(xp, dy), dev(xp, w), x_shape=x.shape, **kw))
    dw = host(xp, ops.convolution_backward_filter(dev(xp, x), dev(xp, dy), w_shape=w.shape, **kw))
    eps = 1e-6
    for arr, grad, which in ((x, dx, "x"), (w, dw, "w")):
        for idx in list(np.ndindex(arr.shape))[:: max(1, arr.size // 12)]:
            a, b = arr.copy(), arr.copy()
            a[idx] += eps
            b[idx] -= eps
            fd = (loss(a, w) - loss(b, w)) / (2 * eps) if which == "x" else (loss(x, a) - loss(x, b)) / (2 * eps)
            assert abs(fd - grad[idx]) < 1e-6 * max(1.0, abs(fd)), (which, idx, fd, grad[idx])


ACTS = [None, "relu", "sigmoid", "tanh", "elu", "swish", "gelu", "gelu_tanh", "leaky_relu", "softplus"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("act", ACTS)
def test_fused_forward_matches_the_reference(xp, dtype, layout, act):
    """``act(conv(x, w) + bias + z_alpha * z)``, one graph (or the legacy calls for float64), into a poisoned out."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    legacy_modes = (None, "relu", "sigmoid", "tanh", "elu", "swish")
    rng = np.random.default_rng(7)
    # a plain 3x3 (cuDNN 9.19 refuses fused graphs of the grouped, dilated CASES[1]: they run legacy)
    x, w, kw, rkw = _case(rng, CASES[0], dtype)
    conv = ref.conv_forward(x, w, **rkw)
    b = seen(rng.standard_normal(conv.shape[1]), dtype)
    z = seen(rng.standard_normal(conv.shape), dtype)
    args = (dev(xp, x, dtype, layout), dev(xp, w, dtype, layout), dev(xp, b, dtype))
    fused = dict(z=dev(xp, z, dtype, layout), z_alpha=-0.5, activation=act, **kw)
    if dtype == "float64" and act not in legacy_modes:
        with pytest.raises(ValueError, match="neither cuDNN path"):
            ops.convolution_forward(*args, **fused)
        return
    pre = conv + b.reshape(1, -1, 1, 1) - 0.5 * z
    want = pre if act is None else aref.act_forward(pre, act)
    out = dev(xp, np.full(want.shape, np.nan), dtype, layout)  # poisoned, in x's layout
    from cudnnkit.graph import UnsupportedGraphError

    with settings(allow_tf32=False):
        try:
            got = ops.convolution_forward(*args, out=out, **fused)
        except (UnsupportedGraphError, ValueError):
            # measured on 9.19: the fused engines take channels-last arrays (a channels-first call runs on
            # channels-last copies); a graph cuDNN refuses, or float32's with z_alpha != 1 (NaN, measured), runs the
            # legacy steps, which have no graph-only activation
            assert (layout == "nchw" or dtype == "float32") and act not in legacy_modes
            return
    assert got is out and rel(host(xp, out), want) < _tol(dtype, False) * 4
    if dtype == "float64":
        assert ops.last_path()[1] == "legacy"
    elif layout == "nhwc" and dtype != "float32":
        assert ops.last_path()[1] == "graph"  # one fused graph (float32's, with this z_alpha, runs the legacy steps)
    if dtype != "float64" and act in legacy_modes:  # the legacy composite agrees
        with settings(allow_tf32=False, prefer="legacy"):
            got = ops.convolution_forward(*args, **fused)
        assert ops.last_path()[1] == "legacy" and rel(host(xp, got), want) < _tol(dtype, False) * 4


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("act", [None, "relu", "leaky_relu"])
@pytest.mark.parametrize("case", [
    (3, 2, 8, 8, (6, 5, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1, "cross_correlation"),
    (2, 2, 8, 8, (9, 8), (3, 3), (2, 2), (1, 1), (1, 1), 2, "cross_correlation"),
], ids=["3d", "2d-grouped"])  # fmt: skip
def test_fused_forward_with_z_alpha_matches_the_reference(xp, dtype, act, case):
    """``act(conv(x, w) + bias + z_alpha * z)``, channels-last, into a poisoned out: two of the fuzzer's finds. A
    3-d graph scaled z by a 4-d constant (the graph layer refused the valid 5-d call with a GraphError); a grouped
    fused graph with ``z_alpha != 1`` wrote NaN on an H100 (cuDNN 9.19), so it runs the legacy calls. Whatever path
    runs (cuDNN may have no fused engine: then the legacy calls, or a refusal by name for a graph-only
    activation), a result must match the float64 reference."""
    from cudnnkit.graph import UnsupportedGraphError

    rng = np.random.default_rng(11)
    x, w, kw, rkw = _case(rng, case, dtype)
    conv = ref.conv_forward(x, w, **rkw)
    b = seen(rng.standard_normal(conv.shape[1]), dtype)
    z = seen(rng.standard_normal(conv.shape), dtype)
    pre = conv + b.reshape((1, -1) + (1,) * (conv.ndim - 2)) - 0.5 * z
    want = pre if act is None else aref.act_forward(pre, act)
    out = dev(xp, np.full(want.shape, np.nan), dtype, "nhwc")
    args = (dev(xp, x, dtype, "nhwc"), dev(xp, w, dtype, "nhwc"), dev(xp, b, dtype))
    with settings(allow_tf32=False):
        try:
            got = ops.convolution_forward(*args, z=dev(xp, z, dtype, "nhwc"), z_alpha=-0.5, activation=act,
                                          out=out, **kw)  # fmt: skip
        except (UnsupportedGraphError, ValueError) as e:
            # a graph-only activation whose graph cuDNN refuses (no engine, or the grouped z_alpha graph): by name
            assert act == "leaky_relu" and ("neither cuDNN path" in str(e) or "legacy call cannot take" in str(e)), e
            return
    assert got is out and rel(host(xp, out), want) < _tol(dtype, False) * 4, ops.last_path()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_fused_graph_scaling_z_never_plans_on_eng8(xp, dtype):
    """``conv -> + bias -> + MUL(z, z_alpha) -> ReLU``: eng8 computed it wrong on an H100 (cuDNN 9.19; NaN in
    float32, wrong values in float16; benchmarks/NOTES.md, twenty-third session), so the graph denies eng8. Every engine the build offers in
    turn (each denied once it has run) is another, and each matches the float64 reference in a poisoned out; the
    op's own call takes the graph and matches too."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    from cudnnkit.graph import UnsupportedGraphError
    from cudnnkit.ops import convolution as cv
    from cudnnkit.ops._primitive import Call
    from cudnnkit.ops.activation import resolve_activation
    from cudnnkit.runtime import as_view

    rng = np.random.default_rng(29)
    x, w, kw, rkw = _case(rng, CASES[0], dtype)
    conv = ref.conv_forward(x, w, **rkw)
    b = seen(rng.standard_normal(conv.shape[1]), dtype)
    z = seen(rng.standard_normal(conv.shape), dtype)
    want = np.maximum(conv + b.reshape(1, -1, 1, 1) - 0.5 * z, 0)
    arrays = dict(x=dev(xp, x, dtype, "nhwc"), w=dev(xp, w, dtype, "nhwc"), bias=dev(xp, b, dtype),
                  z=dev(xp, z, dtype, "nhwc"))  # fmt: skip
    with settings(allow_tf32=False):
        out = dev(xp, np.full(want.shape, np.nan), dtype, "nhwc")
        got = ops.convolution_forward(arrays["x"], arrays["w"], arrays["bias"], z=arrays["z"], z_alpha=-0.5,
                                      activation="relu", out=out, **kw)  # fmt: skip
        assert ops.last_path() == ("convolution_forward", "graph")
        assert got is out and rel(host(xp, out), want) < _tol(dtype, False) * 4
        r = cv._resolve(ops.Convolution(**kw), dtype, x.shape, w.shape, True, want.shape)._replace(
            bias=True, z=True, z_alpha=-0.5, act=resolve_activation("relu"))  # fmt: skip
        out = dev(xp, np.full(want.shape, np.nan), dtype, "nhwc")
        views = {n: as_view(a, n) for n, a in {**arrays, "out": out}.items()}
        g, names = cv.graph_builder("forward")(Call(None, views, r, extra={"graph_alignment": 16}))
        assert "eng8" in g.known_bad_engines()
        binds = {t: views[n].ptr for t, n in names.items()}  # pointers: the graph's bias is (1, K, 1, 1)
        seen_engines: list[str] = []
        for _ in range(12):
            try:
                plan = g.build(deny_engines=tuple(seen_engines))
            except UnsupportedGraphError:
                break
            eng = plan.name.split("_")[0]
            assert eng != "eng8" and eng not in seen_engines
            plan.execute(binds)
            assert rel(host(xp, out), want) < _tol(dtype, False) * 4, plan.name
            seen_engines.append(eng)
        assert seen_engines  # at least one engine took it


@pytest.mark.parametrize("dtype, groups, z_alpha", [("float32", 1, -0.5), ("float32", 2, -0.5), ("float16", 2, -0.5),
                                                    ("bfloat16", 2, 2.0)])  # fmt: skip
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_split_fused_forward_takes_asymmetric_padding(xp, dtype, groups, z_alpha, layout, alpha):
    """``relu(alpha * conv(x, w) + bias + z_alpha * z)`` with ``padding="same"`` and an even kernel (asymmetric),
    where cuDNN 9.19's fused graph is wrong (grouped or float32, with ``z_alpha != 1``) and the legacy convolution
    cannot pad: the graph's convolution alone, then the legacy epilogue, into a poisoned ``out``, against the
    float64 reference on explicitly padded x; a second call (an express hit) gives the same."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(17)
    x = seen(rng.standard_normal((2, 4, 9, 8)), dtype)
    w = seen(rng.standard_normal((6, 4 // groups, 3, 4)) / 3, dtype)
    xpad = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 2)])
    conv = ref.conv_forward(xpad, w, stride=(1, 1), pad=(0, 0), dilation=(1, 1), groups=groups)
    b = seen(rng.standard_normal(6), dtype)
    z = seen(rng.standard_normal(conv.shape), dtype)
    want = np.maximum(alpha * conv + b.reshape(1, -1, 1, 1) + z_alpha * z, 0)
    args = (dev(xp, x, dtype, layout), dev(xp, w, dtype, layout), dev(xp, b, dtype))
    zd = dev(xp, z, dtype, layout)
    with settings(allow_tf32=False):
        for _ in range(2):
            out = dev(xp, np.full(want.shape, np.nan), dtype, layout)
            got = ops.convolution_forward(*args, z=zd, z_alpha=z_alpha, activation="relu", padding="same",
                                          groups=groups, alpha=alpha, out=out)  # fmt: skip
            assert ops.last_path() == ("convolution_forward", "graph")
            assert got is out and rel(host(xp, out), want) < _tol(dtype, False) * 4


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("padding", [1, "same"])
@pytest.mark.parametrize("z_alpha", [1.0, -0.5])
def test_float32_fused_forward_is_one_graph(xp, tf32, layout, act, padding, z_alpha):
    """``act(conv(x, w) + bias + z)`` in float32 (symmetric, and asymmetric ``"same"`` with an even kernel): one
    fused graph (it ran the legacy steps until the twenty-second session: non-finite outputs measured once, not
    reproduced with any engine since), into a poisoned ``out``, twice (the second an express hit), against the
    float64 reference; ``alpha != 1`` with asymmetric padding has no form (the graph blends after its last node,
    the legacy convolution pads both sides alike): refused by name."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((3, 8, 9, 10))
    w = rng.standard_normal((16, 8, 3, 4 if padding == "same" else 3)) / 6
    pads = [(0, 0), (0, 0), (1, 1), (1, 2) if padding == "same" else (1, 1)]
    conv = ref.conv_forward(np.pad(x, pads), w, stride=(1, 1), pad=(0, 0), dilation=(1, 1))
    b, z = rng.standard_normal(16), rng.standard_normal(conv.shape)
    want = conv + b.reshape(1, -1, 1, 1) + z_alpha * z
    want = np.maximum(want, 0) if act else want
    args = (dev(xp, x, "float32", layout), dev(xp, w, "float32", layout), dev(xp, b, "float32"))
    zd = dev(xp, z, "float32", layout)
    with settings(allow_tf32=tf32):
        for _ in range(2):
            out = dev(xp, np.full(want.shape, np.nan), "float32", layout)
            got = ops.convolution_forward(*args, z=zd, z_alpha=z_alpha, activation=act, padding=padding, out=out)
            if z_alpha == 1.0:
                assert ops.last_path() == ("convolution_forward", "graph")
            else:  # MUL(z, z_alpha) in a float32 fused graph wrote NaN (an H100): the legacy steps, or the split
                assert ops.last_path() == ("convolution_forward", "legacy" if padding == 1 else "graph")
            assert got is out and rel(host(xp, out), want) < (5e-3 if tf32 else 1e-5)
        if padding == "same" and z_alpha == 1.0:
            with pytest.raises(ValueError, match="neither cuDNN path.*alpha with a fused forward"):
                ops.convolution_forward(*args, z=zd, activation=act, padding=padding, alpha=0.5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_asymmetric_padding_runs_on_the_graph(xp, dtype, layout):
    """``(before, after)`` pairs and ``"same"`` with an even kernel: forward, backward data and filter against the
    reference on explicitly padded x; the legacy path refuses them by name."""
    if dtype == "bfloat16" and xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    x = seen(rng.standard_normal((2, 4, 9, 8)), dtype)
    w = seen(rng.standard_normal((6, 2, 3, 4)) / 5, dtype)
    for padding, pre, post, stride in ((((0, 2), (1, 2)), (0, 1), (2, 2), (2, 1)), ("same", (1, 1), (1, 2), (1, 1))):
        kw = dict(padding=padding, stride=stride, groups=2)
        xpad = np.pad(x, [(0, 0), (0, 0), (pre[0], post[0]), (pre[1], post[1])])
        want = ref.conv_forward(xpad, w, stride=stride, pad=(0, 0), dilation=(1, 1), groups=2)
        with settings(allow_tf32=False):
            y = ops.convolution_forward(dev(xp, x, dtype, layout), dev(xp, w, dtype, layout), **kw)
            assert ops.last_path() == ("convolution_forward", "graph")
            assert rel(host(xp, y), want) < _tol(dtype, False) * 2
            dy = seen(rng.standard_normal(want.shape), dtype)
            dyd = dev(xp, dy, dtype, layout)
            dx = ops.convolution_backward_data(dyd, dev(xp, w, dtype, layout), x_shape=x.shape, **kw)
            dxp = ref.conv_backward_data(dy, w, xpad.shape, stride=stride, pad=(0, 0), dilation=(1, 1), groups=2)
            assert rel(host(xp, dx), dxp[:, :, pre[0] : pre[0] + 9, pre[1] : pre[1] + 8]) < _tol(dtype, False) * 4
            dw = ops.convolution_backward_filter(dev(xp, x, dtype, layout), dyd, w_shape=w.shape, **kw)
            want_dw = ref.conv_backward_filter(xpad, dy, w.shape, stride=stride, pad=(0, 0), dilation=(1, 1), groups=2)
            assert rel(host(xp, dw), want_dw) < _tol(dtype, False) * 4
            prev = seen(rng.standard_normal(want.shape), dtype)
            out = dev(xp, prev, dtype, layout)  # the graph blends through a temporary (cudnnAddTensor)
            ops.convolution_forward(dev(xp, x, dtype, layout), dev(xp, w, dtype, layout), out=out, alpha=0.5,
                                    beta=-1.0, **kw)  # fmt: skip
            assert ops.last_path() == ("convolution_forward", "graph")
            assert rel(host(xp, out), 0.5 * want - prev) < _tol(dtype, False) * 4
        with settings(prefer="legacy"), pytest.raises(ValueError, match="legacy call cannot take this.*before"):
            ops.convolution_forward(dev(xp, x, dtype, layout), dev(xp, w, dtype, layout), **kw)


def test_graph_and_legacy_agree_and_the_plan_is_cached(xp):
    """Both paths on one bf16 NHWC call agree; repeated graph calls hit the op-level graph cache."""
    from cudnnkit.ops import _graphform

    rng = np.random.default_rng(9)
    x, w, kw, _ = _case(rng, CASES[0], "bfloat16")
    if xp.name == "cupy":
        pytest.importorskip("ml_dtypes")
    xd, wd = dev(xp, x, "bfloat16", "nhwc"), dev(xp, w, "bfloat16", "nhwc")
    a = host(xp, ops.convolution_forward(xd, wd, **kw))
    before = _graphform.graph_cache_info()
    for _ in range(3):  # planned once: no new graph-cache entry (repeated calls are express hits on the plan)
        ops.convolution_forward(xd, wd, **kw)
        assert ops.last_path() == ("convolution_forward", "graph")
    after = _graphform.graph_cache_info()
    assert (after["misses"], after["size"]) == (before["misses"], before["size"])
    with settings(prefer="legacy"):
        b = host(xp, ops.convolution_forward(xd, wd, **kw))
    assert rel(a, b) < 2e-2


#: (x dtype, out_dtype) pairs cuDNN 9.19 refuses on the H200 (no engine): filled from probe/quant_probe.py's run;
#: each is tested as refused by name, the rest against the reference
QUANT_REFUSED: set[tuple[str, str]] = set()
_QUANT = [(i, o) for i in ("int8", "float8_e4m3fn", "float8_e5m2") for o in _QUANT_OUT[i]]


@pytest.mark.parametrize("dtype, out_dtype", _QUANT)
def test_quantized_forward_matches_the_reference(xp, dtype, out_dtype):
    """int8/fp8 x and w (channels-last), y = scale * conv(x, w) in out_dtype, against the float64 reference of the
    same values (small integers times powers of two: exact in every 8-bit type; int32/float32 accumulation)."""
    if xp.name != "torch":
        pytest.skip("fp8/int8 arrays are made with torch here (CuPy has no fp8 dtype)")
    import torch

    rng = np.random.default_rng(7)
    x = rng.integers(-4, 5, (2, 16, 6, 6)).astype(np.float64)
    w = rng.integers(-2, 3, (32, 16, 3, 3)).astype(np.float64)
    if dtype != "int8":
        x, w = x / 4, w / 2
    scale = 0.125

    def td(a, dt):
        return torch.from_numpy(a).to(torch.float32).to(getattr(torch, dt)).cuda().contiguous(
            memory_format=torch.channels_last)  # fmt: skip

    xd, wd = td(x, dtype), td(w, dtype)
    if (dtype, out_dtype) in QUANT_REFUSED:
        with pytest.raises(ValueError, match="no engine"):
            ops.convolution_forward(xd, wd, padding=1, out_dtype=out_dtype, scale=scale)
        return
    y = ops.convolution_forward(xd, wd, padding=1, out_dtype=out_dtype, scale=scale)
    assert ops.last_path() == ("convolution_forward", "graph") and str(y.dtype) == f"torch.{out_dtype}"
    want = scale * ref.conv_forward(x, w, stride=(1, 1), pad=(1, 1), dilation=(1, 1))
    if out_dtype == "int8":  # rounded to nearest, saturated
        want = np.clip(np.round(want), -128, 127)
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3, "int8": 1e-2, "float8_e4m3fn": 7e-2,
           "float8_e5m2": 0.15}[out_dtype]  # fmt: skip
    assert rel(y.to(torch.float64).cpu().numpy(), want) < tol
