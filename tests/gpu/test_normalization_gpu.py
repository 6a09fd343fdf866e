"""Normalization (``cudnnkit.ops.normalization``) against the float64 references of ``tests/norm_reference.py``
(held to torch on the CPU): batch norm (legacy: training with running statistics, inference, backward, every
mode, float16/bfloat16/float32/float64, NCHW and NHWC, 2-d to 5-d; gradients by finite differences in float64),
layer, RMS and instance norm (graph: forward and backward, the half types and float32, layouts), with poisoned
outputs."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops

from .. import norm_reference as ref
from ..numerics import dev, finite_difference, host, poisoned, rel, seen

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 3e-3, "bfloat16": 1.5e-2}


def pdt(dtype):
    return "float64" if dtype == "float64" else "float32"


def nan_out(xp, shape, dtype, layout="nchw"):
    """A poisoned output in ``layout``."""
    if layout == "nhwc" and len(shape) >= 3:
        return dev(xp, np.full(shape, np.nan), dtype, "nhwc")
    return poisoned(xp, shape, dtype)


def _pshape(shape, mode):
    return tuple(shape[1:]) if mode == "per_activation" else (shape[1],)


BN_SHAPES = [(6, 4), (5, 3, 7), (4, 3, 5, 6), (3, 2, 3, 4, 5)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("mode", ["spatial", "per_activation", "spatial_persistent"])
def test_batch_norm_training_matches_the_reference(xp, dtype, layout, shape, mode):
    if layout == "nhwc" and len(shape) < 3:
        pytest.skip("a 2-d array has one layout")
    rng = np.random.default_rng(0)
    ps, p = _pshape(shape, mode), pdt(dtype)
    x = seen(rng.standard_normal(shape) * 2 + 0.5, dtype)
    s, b = seen(rng.standard_normal(ps), p), seen(rng.standard_normal(ps), p)
    rm, rv = seen(rng.standard_normal(ps), p), seen(rng.uniform(0.5, 2, ps), p)
    rmd, rvd = dev(xp, rm, p), dev(xp, rv, p)
    outs = (nan_out(xp, shape, dtype, layout), poisoned(xp, ps, p), poisoned(xp, ps, p))
    got = ops.batch_norm_forward(dev(xp, x, dtype, layout), dev(xp, s, p), dev(xp, b, p), running_mean=rmd,
                                 running_var=rvd, momentum=0.2, epsilon=1e-4, mode=mode, out=outs)  # fmt: skip
    assert all(g is o for g, o in zip(got, outs))
    y, mean, inv, nrm, nrv = ref.bn_forward(x, s, b, 1e-4, mode, rm, rv, 0.2)
    assert rel(host(xp, got[0]), y) < TOL[dtype] * 4
    stol = 1e-10 if dtype == "float64" else 1e-4  # statistics: float32 (float64) from the inputs as stored
    assert rel(host(xp, got[1]), mean) < stol and rel(host(xp, got[2]), inv) < stol
    assert rel(host(xp, rmd), nrm) < 1e-5 and rel(host(xp, rvd), nrv) < 1e-5  # unbiased running variance
    # new outputs: y in x's layout, the statistics packed in the parameters' dtype
    y2, m2, i2 = ops.batch_norm_forward(dev(xp, x, dtype, layout), dev(xp, s, p), dev(xp, b, p), epsilon=1e-4,
                                        mode=mode)  # fmt: skip
    assert rel(host(xp, y2), y) < TOL[dtype] * 4 and rel(host(xp, m2), mean) < 1e-4
    assert xp.view(m2, "m").dtype == p and xp.view(y2, "y").dtype == dtype
    if layout == "nhwc":
        assert xp.view(y2, "y").strides[1] == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
def test_batch_norm_inference_matches_the_reference(xp, dtype, layout, mode):
    rng = np.random.default_rng(1)
    shape = (4, 3, 5, 6)
    ps, p = _pshape(shape, mode), pdt(dtype)
    x = seen(rng.standard_normal(shape), dtype)
    s, b, m = (seen(rng.standard_normal(ps), p) for _ in range(3))
    v = seen(rng.uniform(0.5, 2, ps), p)
    out = nan_out(xp, shape, dtype, layout)
    y = ops.batch_norm_forward(dev(xp, x, dtype, layout), dev(xp, s, p), dev(xp, b, p), running_mean=dev(xp, m, p),
                               running_var=dev(xp, v, p), training=False, mode=mode, out=out)  # fmt: skip
    assert y is out
    assert rel(host(xp, y), ref.bn_inference(x, s, b, m, v, 1e-5, mode)) < TOL[dtype] * 4
    # a lone batch-norm inference graph has no engine on cuDNN 9.19/H200 (tests/gpu/test_graph_nodes_gpu.py): the
    # graph form refuses inference (and float64), so the router takes the legacy call, and forcing the
    # graph says why
    assert ops.last_path() == ("batch_norm_forward", "legacy")
    from cudnnkit import settings

    why = "inference" if dtype != "float64" else dtype
    with settings(prefer="graph"), pytest.raises(ValueError, match=why):
        ops.batch_norm_forward(dev(xp, x, dtype, layout), dev(xp, s, p), dev(xp, b, p), running_mean=dev(xp, m, p),
                               running_var=dev(xp, v, p), training=False, mode=mode)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("mode", ["spatial", "per_activation", "spatial_persistent"])
def test_batch_norm_backward_matches_the_reference(xp, dtype, layout, shape, mode):
    if layout == "nhwc" and len(shape) < 3:
        pytest.skip("a 2-d array has one layout")
    rng = np.random.default_rng(2)
    ps, p = _pshape(shape, mode), pdt(dtype)
    x, dy = seen(rng.standard_normal(shape), dtype), seen(rng.standard_normal(shape), dtype)
    s, b = seen(rng.standard_normal(ps), p), seen(rng.standard_normal(ps), p)
    xd = dev(xp, x, dtype, layout)
    _, sm, si = ops.batch_norm_forward(xd, dev(xp, s, p), dev(xp, b, p), mode=mode)
    _, mean, inv, _, _ = ref.bn_forward(x, s, b, 1e-5, mode)
    outs = (nan_out(xp, shape, dtype, layout), poisoned(xp, ps, p), poisoned(xp, ps, p))
    got = ops.batch_norm_backward(dev(xp, dy, dtype, layout), xd, dev(xp, s, p), sm, si, mode=mode, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    dx, ds, db = ref.bn_backward(dy, x, s, mean, inv, mode)
    assert rel(host(xp, got[0]), dx) < TOL[dtype] * 8
    assert rel(host(xp, got[1]), ds) < max(TOL[dtype], 1e-5) * 4
    assert rel(host(xp, got[2]), db) < max(TOL[dtype], 1e-5) * 4


@pytest.mark.parametrize("mode", ["spatial", "per_activation"])
def test_batch_norm_gradients_by_finite_differences(xp, mode):
    """float64 (legacy): the backward's dx, dscale, dbias against central differences of the forward."""
    rng = np.random.default_rng(3)
    shape = (3, 2, 2, 3)
    ps = _pshape(shape, mode)
    x, s, b = rng.standard_normal(shape), rng.standard_normal(ps), rng.standard_normal(ps)
    w = rng.standard_normal(shape)  # loss = sum(w * y)

    def loss(xa, sa, ba):
        y, _, _ = ops.batch_norm_forward(dev(xp, xa), dev(xp, sa), dev(xp, ba), mode=mode)
        return float((host(xp, y) * w).sum())

    _, sm, si = ops.batch_norm_forward(dev(xp, x), dev(xp, s), dev(xp, b), mode=mode)
    dx, ds, db = ops.batch_norm_backward(dev(xp, w), dev(xp, x), dev(xp, s), sm, si, mode=mode)
    assert rel(host(xp, dx), finite_difference(lambda a: loss(a, s, b), x)) < 1e-6
    assert rel(host(xp, ds), finite_difference(lambda a: loss(x, a, b), s)) < 1e-6
    assert rel(host(xp, db), finite_difference(lambda a: loss(x, s, a), b)) < 1e-6


# ----------------------------------------------------------------- layer and RMS norm (graph)

GRAPH_DTYPES = ["float16", "bfloat16", "float32"]


@pytest.mark.parametrize("dtype", GRAPH_DTYPES)
@pytest.mark.parametrize("shape, k", [((64, 256), 1), ((4, 16, 128), 1), ((8, 4, 32), 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_the_reference(xp, dtype, shape, k, bias):
    rng = np.random.default_rng(4)
    x, dy = seen(rng.standard_normal(shape) * 1.5 + 0.3, dtype), seen(rng.standard_normal(shape), dtype)
    s, b = rng.standard_normal(shape[-k:]), rng.standard_normal(shape[-k:])
    sd, bd = dev(xp, s, "float32"), dev(xp, b, "float32") if bias else None
    s, b = seen(s, "float32"), seen(b, "float32") if bias else None
    ss = shape[:-k] + (1,) * k
    outs = (poisoned(xp, shape, dtype), poisoned(xp, ss, "float32"), poisoned(xp, ss, "float32"))
    xd = dev(xp, x, dtype)
    got = ops.layer_norm_forward(xd, sd, bd, epsilon=1e-5, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    y, mean, inv = ref.ln_forward(x, s, b, 1e-5)
    assert rel(host(xp, got[0]), y) < TOL[dtype] * 4
    assert np.abs(host(xp, got[1]) - mean).max() < 1e-4 and rel(host(xp, got[2]), inv) < 1e-4
    douts = (poisoned(xp, shape, dtype), poisoned(xp, shape[-k:], "float32"), poisoned(xp, shape[-k:], "float32"))
    g = ops.layer_norm_backward(dev(xp, dy, dtype), xd, sd, got[1], got[2], out=douts)
    assert all(a is o for a, o in zip(g, douts))
    dx, ds, db = ref.ln_backward(dy, x, s, host(xp, got[1]), host(xp, got[2]))
    assert rel(host(xp, g[0]), dx) < TOL[dtype] * 8
    assert rel(host(xp, g[1]), ds) < 1e-3 and rel(host(xp, g[2]), db) < 1e-3
    yi = ops.layer_norm_forward(xd, sd, bd, training=False)
    assert rel(host(xp, yi), y) < TOL[dtype] * 4


@pytest.mark.parametrize("dtype", GRAPH_DTYPES)
@pytest.mark.parametrize("shape", [(64, 256), (4, 16, 128)])
def test_rms_norm_matches_the_reference(xp, dtype, shape):
    rng = np.random.default_rng(5)
    x, dy = seen(rng.standard_normal(shape) * 1.5 + 0.3, dtype), seen(rng.standard_normal(shape), dtype)
    s = seen(rng.standard_normal(shape[-1:]), "float32")
    sd, xd = dev(xp, s, "float32"), dev(xp, x, dtype)
    outs = (poisoned(xp, shape, dtype), poisoned(xp, shape[:-1] + (1,), "float32"))
    got = ops.rms_norm_forward(xd, sd, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    y, inv = ref.rms_forward(x, s)
    assert rel(host(xp, got[0]), y) < TOL[dtype] * 4 and rel(host(xp, got[1]), inv) < 1e-4
    dx, ds = ops.rms_norm_backward(dev(xp, dy, dtype), xd, sd, got[1])
    rdx, rds = ref.rms_backward(dy, x, s, host(xp, got[1]))
    assert rel(host(xp, dx), rdx) < TOL[dtype] * 8 and rel(host(xp, ds), rds) < 1e-3


def test_graph_norms_refuse_float64(xp):
    x, s = dev(xp, np.ones((4, 8))), dev(xp, np.ones(8), "float32")
    for call in (lambda: ops.layer_norm_forward(x, s), lambda: ops.rms_norm_forward(x, s)):
        with pytest.raises(ValueError, match="x has dtype float64"):
            call()


def test_layer_norm_copies_a_strided_x(xp):
    rng = np.random.default_rng(6)
    base = rng.standard_normal((8, 64))
    x = dev(xp, base, "float32")[:, ::2]  # gapped: copied to C order
    s = rng.standard_normal(32)
    y, _, _ = ops.layer_norm_forward(x, dev(xp, s, "float32"))
    assert rel(host(xp, y), ref.ln_forward(base[:, ::2], s)[0]) < 1e-5


# ----------------------------------------------------------------- instance norm (graph)


@pytest.mark.parametrize("dtype", GRAPH_DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape", [(4, 8, 16), (4, 8, 6, 7), (2, 4, 3, 4, 5)])
def test_instance_norm_matches_the_reference(xp, dtype, layout, shape):
    rng = np.random.default_rng(7)
    x, dy = seen(rng.standard_normal(shape) * 2 - 0.5, dtype), seen(rng.standard_normal(shape), dtype)
    c = shape[1]
    s, b = seen(rng.standard_normal(c), "float32"), seen(rng.standard_normal(c), "float32")
    xd, sd = dev(xp, x, dtype, layout), dev(xp, s, "float32")
    outs = (nan_out(xp, shape, dtype, layout), poisoned(xp, shape[:2], "float32"), poisoned(xp, shape[:2], "float32"))
    got = ops.instance_norm_forward(xd, sd, dev(xp, b, "float32"), out=outs)
    assert all(g is o for g, o in zip(got, outs))
    y, mean, inv = ref.in_forward(x, s, b)
    assert rel(host(xp, got[0]), y) < TOL[dtype] * 4
    assert np.abs(host(xp, got[1]) - mean).max() < 1e-3 and rel(host(xp, got[2]), inv) < 1e-3
    douts = (nan_out(xp, shape, dtype, layout), poisoned(xp, (c,), "float32"), poisoned(xp, (c,), "float32"))
    g = ops.instance_norm_backward(dev(xp, dy, dtype, layout), xd, sd, got[1], got[2], out=douts)
    assert all(a is o for a, o in zip(g, douts))
    dx, ds, db = ref.in_backward(dy, x, s, host(xp, got[1]), host(xp, got[2]))
    assert rel(host(xp, g[0]), dx) < TOL[dtype] * 8
    assert rel(host(xp, g[1]), ds) < 1e-3 and rel(host(xp, g[2]), db) < 1e-3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("prefer", ["auto", "graph", "legacy"])
def test_fused_batch_norm_add_relu(xp, dtype, layout, with_z, prefer):
    """``relu(bn(x) + z)``, forward and backward, against the reference: under ``prefer="legacy"`` the fused Ex
    calls where cuDNN fuses them (channels-last float16, C a multiple of 4: a reserve comes back), the unfused steps
    elsewhere; by default and under ``prefer="graph"`` one graph for channels-last arrays (NORM_FORWARD, ADD,
    RELU_FWD; the backward the ReLU's gradient from y, then NORM_BACKWARD); by default the legacy steps for
    channels-first ones, which ``prefer="graph"`` refuses clearly."""
    from cudnnkit import settings

    with settings(prefer=prefer):
        if prefer == "graph" and layout != "nhwc":
            with pytest.raises(ValueError, match="prefer='graph'"):
                _fused_batch_norm_add_relu(xp, dtype, layout, with_z, prefer)
            return
        _fused_batch_norm_add_relu(xp, dtype, layout, with_z, prefer)


def _fused_batch_norm_add_relu(xp, dtype, layout, with_z, prefer):
    rng = np.random.default_rng(21)
    shape = (4, 8, 5, 6)
    x = seen(rng.standard_normal(shape) * 2 + 0.5, dtype)
    z = seen(rng.standard_normal(shape), dtype)
    s, b = rng.standard_normal(8), rng.standard_normal(8)
    y_bn, mean, inv = ref.bn_forward(x, s, b)[:3]
    pre = y_bn + (z if with_z else 0)
    want = np.maximum(pre, 0)
    xd, zd = dev(xp, x, dtype, layout), dev(xp, z, dtype, layout) if with_z else None
    sd, bd = dev(xp, s, "float32"), dev(xp, b, "float32")
    y, sm, si, reserve = ops.batch_norm_forward(xd, sd, bd, z=zd, activation="relu")
    tol = TOL[dtype] * 4
    assert rel(host(xp, y), want) < tol
    assert rel(host(xp, sm), mean) < 1e-4 and rel(host(xp, si), inv) < 1e-3
    # the graph form takes channels-last training calls, and is the default for them (d71d1b9)
    graph = prefer == "graph" or (prefer == "auto" and layout == "nhwc")
    assert ops.last_path() == ("batch_norm_forward", "graph" if graph else "legacy")
    if graph:
        assert reserve is None  # the graph keeps none: the backward reads y
    elif layout == "nhwc" and dtype == "float16":
        assert reserve is not None, "cuDNN fuses channels-last float16 with C % 4 == 0"
    dy = seen(rng.standard_normal(shape), dtype)
    dyd = dev(xp, dy, dtype, layout)
    mask = (host(xp, y) > 0).astype(np.float64)  # where cuDNN's ReLU was active (pre near 0 may round either way)
    g = dy * mask
    dx_w, ds_w, db_w = ref.bn_backward(g, x, s, mean, inv)
    got = ops.batch_norm_backward(dyd, xd, sd, sm, si, activation="relu", y=y, bias=bd, reserve=reserve,
                                  z_grad=with_z)  # fmt: skip
    assert len(got) == (4 if with_z else 3)
    assert ops.last_path() == ("batch_norm_backward", "graph" if graph else "legacy")
    assert rel(host(xp, got[0]), dx_w) < tol * 4
    assert rel(host(xp, got[1]), ds_w) < tol * 4 and rel(host(xp, got[2]), db_w) < tol * 4
    if with_z:
        assert rel(host(xp, got[3]), g) < tol


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(4, 8, 5, 6), (16, 64, 9, 7), (64, 32, 8, 8)])
def test_batch_norm_graph_and_legacy_paths_agree(xp, dtype, shape):
    """Channels-last training batch norm runs its graph form by default (and under ``prefer="graph"``); the legacy
    calls (``prefer="legacy"``) give the same outputs, saved statistics, in-place running statistics and gradients, and both match the
    float64 reference. Outputs poisoned first. The call repeated (an express hit: the pointer-only graph path, which
    allocates the saved statistics anew) gives new statistics arrays with the same values."""
    from cudnnkit import settings

    rng = np.random.default_rng(23)
    c = shape[1]
    x = seen(rng.standard_normal(shape) * 2 + 0.5, dtype)
    dy = seen(rng.standard_normal(shape), dtype)
    s, b = rng.standard_normal(c), rng.standard_normal(c)
    rm0, rv0 = rng.standard_normal(c), rng.uniform(0.5, 2, c)
    y_ref, mean, inv = ref.bn_forward(x, s, b)[:3]
    m = x.size // c
    var = x.transpose(1, 0, 2, 3).reshape(c, -1).var(axis=1)
    got = {}
    for prefer in ("graph", "legacy"):
        with settings(prefer=prefer):
            rm, rv = dev(xp, rm0, "float32"), dev(xp, rv0, "float32")
            xd, sd, bd = dev(xp, x, dtype, "nhwc"), dev(xp, s, "float32"), dev(xp, b, "float32")
            out = nan_out(xp, shape, dtype, "nhwc")
            y, sm, si = ops.batch_norm_forward(xd, sd, bd, running_mean=rm, running_var=rv, momentum=0.2,
                                               out=(out, None, None))  # fmt: skip
            assert y is out
            path = prefer
            assert ops.last_path() == ("batch_norm_forward", path)
            dyd = dev(xp, dy, dtype, "nhwc")
            dx, ds, db = ops.batch_norm_backward(dyd, xd, sd, sm, si)
            assert ops.last_path() == ("batch_norm_backward", path)
            got[prefer] = [host(xp, a) for a in (y, sm, si, rm, rv, dx, ds, db)]
            from cudnnkit.ops import _express

            hits = _express.info()["hits"]
            for _ in range(2):  # express hits: new statistics and gradients each call, the same values
                rm2, rv2 = dev(xp, rm0, "float32"), dev(xp, rv0, "float32")
                y2, sm2, si2 = ops.batch_norm_forward(xd, sd, bd, running_mean=rm2, running_var=rv2, momentum=0.2)
                assert ops.last_path() == ("batch_norm_forward", path)
                assert sm2 is not sm and si2 is not si
                dx2, ds2, db2 = ops.batch_norm_backward(dyd, xd, sd, sm2, si2)
                assert ds2 is not ds
                again = [host(xp, a) for a in (y2, sm2, si2, rm2, rv2, dx2, ds2, db2)]
                for i, (a, w) in enumerate(zip(again, got[prefer])):
                    assert rel(a, w) < 1e-6, (prefer, i)
            assert _express.info()["hits"] >= hits + 3  # (the first forward without out= is a new signature)
    dx_w, ds_w, db_w = ref.bn_backward(dy, x, s, mean, inv)
    want = [y_ref, mean, inv, 0.8 * rm0 + 0.2 * mean, 0.8 * rv0 + 0.2 * var * m / (m - 1), dx_w, ds_w, db_w]
    tol = TOL[dtype] * 4
    with settings(prefer="auto"):  # the default: the graph
        ops.batch_norm_forward(dev(xp, x, dtype, "nhwc"), dev(xp, s, "float32"), dev(xp, b, "float32"))
        assert ops.last_path() == ("batch_norm_forward", "graph")
    for i, (a, g, w) in enumerate(zip(got["graph"], got["legacy"], want)):
        assert rel(a, w) < tol * 4, i
        assert rel(a, g) < tol * 4, i


def _relu_mask_case(xp, dtype, shape, seed):
    """Host arrays ``(x, dy, scale, bias)`` (x and dy rounded through ``dtype``; x shifted so that the ReLU passes
    about half) and their device copies, x and dy channels-last, the parameters float32."""
    rng = np.random.default_rng(seed)
    x = seen(rng.standard_normal(shape) * 2 + 0.5, dtype)
    dy = seen(rng.standard_normal(shape), dtype)
    s, b = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    return (x, dy, s, b), (dev(xp, x, dtype, "nhwc"), dev(xp, dy, dtype, "nhwc"), dev(xp, s, "float32"),
                           dev(xp, b, "float32"))  # fmt: skip


@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_relu_mask_forward_and_backward(xp, dtype, with_z):
    """``batch_norm_forward(activation="relu", return_mask=True)`` on channels-last arrays: the graph path, the
    mask bit-packed (channel c of a pixel in bit c % 8 of byte c // 8; set exactly where y > 0); the backward given
    ``relu_mask=`` runs one graph (MUL(dy, mask) -> NORM_BACKWARD) and matches the float64 reference of
    ``dy * (y > 0)`` through batch norm (y given as NaN: only the mask is read), also when repeated (express hits,
    counted); under ``prefer="legacy"`` the forward refuses the mask by name. With the residual z (BN_ADD_RELU /
    DRELU_DADD_DBN): ``y = relu(bn(x) + z)``, and the backward's ``dz`` is the written product ``dy * (y > 0)``,
    new, or given (poisoned) channels-last or channels-first (written through a temporary)."""
    from cudnnkit import settings

    (x, dy, s, b), (xd, dyd, sd, bd) = _relu_mask_case(xp, dtype, (8, 16, 5, 6), 31)
    zh = seen(np.random.default_rng(32).standard_normal(x.shape), dtype) if with_z else None
    zkw = {"z": dev(xp, zh, dtype, "nhwc")} if with_z else {}
    y, sm, si, reserve, mask = ops.batch_norm_forward(xd, sd, bd, activation="relu", return_mask=True, **zkw)
    assert ops.last_path() == ("batch_norm_forward", "graph") and reserve is None
    y_bn, mean, inv = ref.bn_forward(x, s, b)[:3]
    tol = TOL[dtype] * 4
    assert rel(host(xp, y), np.maximum(y_bn + (zh if with_z else 0), 0)) < tol
    bits = np.unpackbits(host(xp, mask).astype(np.uint8), axis=-1, bitorder="little").transpose(0, 3, 1, 2)
    active = host(xp, y) > 0
    assert tuple(mask.shape) == (8, 5, 6, 2) and np.array_equal(bits.astype(bool), active)
    dx_w, ds_w, db_w = ref.bn_backward(dy * active, x, s, mean, inv)
    from cudnnkit.ops import _express

    _express.entries.clear()
    y_nan = nan_out(xp, x.shape, dtype, "nhwc")  # the mask's graph never reads y: a path that did gives NaN
    for i in range(4):  # the second an express hit (with z: a new dz each call, the pointer-only plan's fresh extra)
        out = None
        if with_z and i >= 2:  # a given dz, poisoned, channels-last then channels-first: the graph writes it
            out = (None, None, None, nan_out(xp, x.shape, dtype, "nhwc" if i == 2 else "nchw"))
        got = ops.batch_norm_backward(dyd, xd, sd, sm, si, activation="relu", y=y_nan, relu_mask=mask,
                                      z_grad=with_z, out=out)  # fmt: skip
        assert ops.last_path() == ("batch_norm_backward", "graph") and len(got) == 3 + with_z
        assert rel(host(xp, got[0]), dx_w) < tol * 4
        assert rel(host(xp, got[1]), ds_w) < tol * 4 and rel(host(xp, got[2]), db_w) < tol * 4
        if with_z:
            assert out is None or got[3] is out[3]
            assert rel(host(xp, got[3]), dy * active) < tol
    hits = sum(e.hits for sig, e in list(_express.entries._d.items()) if sig[0] == "batch_norm_backward")
    assert hits >= (1 if with_z else 3), "the repeated backward never took the express path"
    with settings(prefer="legacy"), pytest.raises(ValueError, match="return_mask=True"):
        ops.batch_norm_forward(xd, sd, bd, activation="relu", return_mask=True, **zkw)


@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_differentiable_fused_relu_backward_reads_the_mask(xp, dtype, with_z, monkeypatch):
    """The differentiable batch norm with its ReLU fused, channels-last, C a multiple of 8: the forward keeps the
    graph's bit-packed ReLU mask, and the backward is one DRELU_DBN graph (no ``activation_backward`` call: made to
    fail here), matching the float64 reference of ``dy * (y > 0)`` through batch norm. The size floor (4M
    elements, where the mask starts to pay) is lowered to this small shape's."""
    from cudnnkit import autograd
    from cudnnkit.ops import normalization as N

    monkeypatch.setattr(N, "_MASK_MIN_ELEMENTS", 1)

    (x, dy, s, b), (xd, dyd, sd, bd) = _relu_mask_case(xp, dtype, (16, 32, 6, 5), 37)
    zh = seen(np.random.default_rng(38).standard_normal(x.shape), dtype) if with_z else None
    bn = autograd.get("batch_norm")
    (y,), res = bn.forward(xd, sd, bd, *((dev(xp, zh, dtype, "nhwc"),) if with_z else ()), activation="relu")
    assert res.get("reserve") is None and tuple(res["relu_mask"].shape) == (16, 6, 5, 4)
    y_bn, mean, inv = ref.bn_forward(x, s, b)[:3]
    assert rel(host(xp, y), np.maximum(y_bn + (zh if with_z else 0), 0)) < TOL[dtype] * 4
    active = host(xp, y) > 0
    dx_w, ds_w, db_w = ref.bn_backward(dy * active, x, s, mean, inv)

    def no_relu_backward(*a, **k):
        raise AssertionError("the backward made a separate activation_backward call")

    monkeypatch.setattr(N, "activation_backward", no_relu_backward)
    res = {**res, "y": nan_out(xp, x.shape, dtype, "nhwc")}  # the mask's graph never reads y: a path that did gives NaN
    got = bn.backward(res, (dyd,), (True, True, True, with_z), activation="relu")
    assert ops.last_path() == ("batch_norm_backward", "graph") and (got[3] is None) != with_z
    tol = TOL[dtype] * 8
    assert rel(host(xp, got[0]), dx_w) < tol
    assert rel(host(xp, got[1]), ds_w) < tol and rel(host(xp, got[2]), db_w) < tol
    if with_z:  # the residual's gradient: the graph's written product
        assert rel(host(xp, got[3]), dy * active) < tol
