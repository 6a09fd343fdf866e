"""Graph node kinds executed on the GPU against independent float64 NumPy references: pooling (max,
average excluding padding), batch norm (training with running statistics, inference, backward), layer
and RMS norm (forward and backward), genstats, RNG Bernoulli, reshape, concat, SDPA forward and
backward (bf16, causal and not), the batch norm's bit-packed ReLU mask (BN_RELU, DRELU_DBN). Execution goes through
``Graph.execute`` (cudnnkit.graph.plan)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudnnkit.graph import Graph, UnsupportedGraphError

from ..numerics import np_dtype, rel

pytestmark = pytest.mark.gpu

HALF_TOL = 1e-2


# ----------------------------------------------------------------- helpers


def put(xp, a, t):
    """A device array holding ``a`` (float64 host values) with tensor ``t``'s dims, strides and dtype."""
    arr = xp.empty(t.dims, t.dtype, 0, t.strides)
    xp.copy(arr, xp.from_numpy(np.asarray(a, dtype=np.float64).astype(np_dtype(t.dtype)), 0))
    return arr


def nan_like(xp, t):
    """A device array for output ``t`` filled with NaN (or -1 for integer types), so unwritten elements show."""
    fill = np.nan if t.dtype in ("float16", "bfloat16", "float32", "float64") else -1
    return put(xp, np.full(t.dims, fill), t)


def seen(a, dtype):
    return np.asarray(a, dtype=np.float64).astype(np_dtype(dtype)).astype(np.float64)


def got(xp, arr):
    return xp.to_numpy(arr).astype(np.float64)


def run(xp, g, inputs: dict, outputs: list):
    """Bind host inputs (tensor -> float64 array) and NaN-poisoned outputs, execute, return host outputs."""
    bind = {t: put(xp, a, t) for t, a in inputs.items()}
    outs = {t: nan_like(xp, t) for t in outputs}
    g.execute({**bind, **outs})
    return [got(xp, outs[t]) for t in outputs]


NHWC = lambda n, c, h, w: (c * h * w, 1, w * c, c)  # noqa: E731


# ----------------------------------------------------------------- pooling


def ref_pool(x, k, s, p, mode):
    n, c, h, w = x.shape
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            r0, c0 = i * s - p, j * s - p
            r1, c1 = max(r0, 0), max(c0, 0)
            win = x[:, :, r1 : min(r0 + k, h), c1 : min(c0 + k, w)]
            if mode == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            elif mode == "avg_exclude_padding":
                y[:, :, i, j] = win.mean(axis=(2, 3))
            else:
                y[:, :, i, j] = win.sum(axis=(2, 3)) / (k * k)
    return y


def ref_pool_backward(x, dy, k, s, p, mode):
    n, c, h, w = x.shape
    dx = np.zeros_like(x)
    for i in range(dy.shape[2]):
        for j in range(dy.shape[3]):
            r0, c0 = i * s - p, j * s - p
            r1, c1, r2, c2 = max(r0, 0), max(c0, 0), min(r0 + k, h), min(c0 + k, w)
            win = x[:, :, r1:r2, c1:c2]
            g = dy[:, :, i, j]
            if mode == "max":
                flat = win.reshape(n, c, -1).argmax(axis=2)
                rr, cc = np.unravel_index(flat, win.shape[2:])
                for a in range(n):
                    for b in range(c):
                        dx[a, b, r1 + rr[a, b], c1 + cc[a, b]] += g[a, b]
            else:
                cnt = (r2 - r1) * (c2 - c1) if mode == "avg_exclude_padding" else k * k
                dx[:, :, r1:r2, c1:c2] += (g / cnt)[:, :, None, None]
    return dx


def distinct(shape, rng):
    """Distinct values (no ties for max pooling), exact in float16: a shuffled ladder of eighths around 0."""
    m = math.prod(shape)
    assert m <= 4096  # |v| <= 256 keeps a step of 1/8 exact in float16
    return rng.permutation((np.arange(m) - m // 2) / 8.0).reshape(shape)


@pytest.mark.parametrize("mode", ["max", "avg_exclude_padding", "avg_include_padding"])
def test_pooling_forward(xp, mode):
    rng = np.random.default_rng(1)
    n, c, h, w, k, s, p = 2, 16, 11, 11, 3, 2, 1
    a = distinct((n, c, h, w), rng)
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16", name="x")
    y = g.mark_output(g.resample_forward(x, mode=mode, window=k, stride=s, pre_padding=p))
    (out,) = run(xp, g, {x: a}, [y])
    assert rel(out, ref_pool(a, k, s, p, mode)) < 1e-3


@pytest.mark.parametrize("k, s, p, hw", [(2, 1, 1, (9, 9)), (2, 2, 0, (5, 8)), (3, 2, 1, (11, 11)), (3, 1, 0, (7, 8))])
def test_W_bfloat16_max_pooling_denies_the_engine_measured_wrong(xp, k, s, p, hw):
    """Issue 10's fuzzer: bfloat16 max pooling from eng3 was wrong nearly everywhere (cuDNN 9.19, H200); the
    graph denies that engine, and what runs instead matches the float64 reference exactly (max of bf16 values)."""
    rng = np.random.default_rng()
    n, c, (h, w) = 2, 16, hw
    a = distinct((n, c, h, w), rng)
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "bfloat16", name="x")
    y = g.mark_output(g.resample_forward(x, mode="max", window=k, stride=s, pre_padding=p))
    assert g.known_bad_engines() == ("eng3",)
    (out,) = run(xp, g, {x: a}, [y])
    assert g.build().name.split("_")[0] != "eng3"
    assert rel(out, ref_pool(a, k, s, p, "max")) < 1e-2


def test_max_pooling_backward_from_the_index(xp):
    rng = np.random.default_rng(2)
    n, c, h, w, k, s, p = 2, 16, 11, 11, 3, 2, 1
    a = distinct((n, c, h, w), rng)
    ho = (h + 2 * p - k) // s + 1
    dya = rng.standard_normal((n, c, ho, ho))
    kw = {"window": k, "stride": s, "pre_padding": p}
    gf = Graph()
    xf = gf.tensor((n, c, h, w), NHWC(n, c, h, w), "float16")
    yf, idxf = gf.resample_forward(xf, index=True, **kw)
    gf.mark_output(yf)
    gf.mark_output(idxf)
    ya, ia = nan_like(xp, yf), nan_like(xp, idxf)
    gf.execute({xf: put(xp, a, xf), yf: ya, idxf: ia})
    assert rel(got(xp, ya), ref_pool(a, k, s, p, "max")) < 1e-3
    g = Graph()
    dy = g.tensor((n, c, ho, ho), NHWC(n, c, ho, ho), "float16", name="dy")
    idx = g.tensor(idxf.dims, idxf.strides, idxf.dtype, name="index")
    dx = g.mark_output(g.resample_backward(dy, x_dims=(n, c, h, w), index=idx, **kw))
    dxa = nan_like(xp, dx)
    g.execute({dy: put(xp, dya, dy), idx: ia, dx: dxa})
    assert rel(got(xp, dxa), ref_pool_backward(a, seen(dya, "float16"), k, s, p, "max")) < 1e-3


@pytest.mark.parametrize("mode", ["avg_exclude_padding", "avg_include_padding"])
def test_average_pooling_backward(xp, mode):
    rng = np.random.default_rng(3)
    n, c, h, w, k, s, p = 2, 16, 11, 11, 3, 2, 1
    ho = (h + 2 * p - k) // s + 1
    dya = rng.standard_normal((n, c, ho, ho))
    g = Graph()
    dy = g.tensor((n, c, ho, ho), NHWC(n, c, ho, ho), "float16")
    dx = g.mark_output(g.resample_backward(dy, x_dims=(n, c, h, w), mode=mode, window=k, stride=s, pre_padding=p))
    (out,) = run(xp, g, {dy: dya}, [dx])
    ref = ref_pool_backward(np.zeros((n, c, h, w)), seen(dya, "float16"), k, s, p, mode)
    assert rel(out, ref) < 2e-3


# ----------------------------------------------------------------- normalization


def bn_ref(x, scale, bias, eps):
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    inv = 1 / np.sqrt(var + eps)
    return (x - mean) * inv * scale + bias, mean, inv, var


def test_batch_norm_training_with_running_statistics(xp):
    rng = np.random.default_rng(4)
    n, c, h, w, eps, mom = 8, 32, 6, 6, 1e-5, 0.1
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16", name="x")
    s, b, rm, rv = (g.tensor((1, c, 1, 1), name=nm) for nm in ("scale", "bias", "rmean", "rvar"))
    r = g.norm_forward("batch", x, s, b, epsilon=eps, momentum=mom, running_mean=rm, running_var=rv)
    outs = [g.mark_output(t) for t in r]
    a = seen(rng.standard_normal((n, c, h, w)) * 2 + 0.5, "float16")
    sa, ba = rng.standard_normal((1, c, 1, 1)), rng.standard_normal((1, c, 1, 1))
    rma, rva = rng.standard_normal((1, c, 1, 1)), rng.uniform(0.5, 2, (1, c, 1, 1))
    y, mean, inv, nrm, nrv = run(xp, g, {x: a, s: sa, b: ba, rm: rma, rv: rva}, outs)
    yr, mr, ir, var = bn_ref(a, sa, ba, eps)
    m = n * h * w
    assert rel(y, yr) < HALF_TOL
    assert rel(mean, mr) < 1e-4 and rel(inv, ir) < 1e-4
    assert rel(nrm, (1 - mom) * rma + mom * mr) < 1e-4
    assert rel(nrv, (1 - mom) * rva + mom * var * m / (m - 1)) < 1e-4  # unbiased variance, as cuDNN documents


@pytest.mark.xfail(
    raises=UnsupportedGraphError,
    strict=True,
    reason="measured on an H200 with cuDNN 9.19: no engine for a lone batch-norm inference "
    "NORM_FORWARD (heuristics: matcher_casted == nullptr)",
)
def test_batch_norm_inference(xp):
    rng = np.random.default_rng(5)
    n, c, h, w = 8, 32, 6, 6
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16")
    s, b, m, iv = (g.tensor((1, c, 1, 1)) for _ in range(4))
    y = g.mark_output(g.norm_forward("batch", x, s, b, phase="inference", mean=m, inv_variance=iv).y)
    a = seen(rng.standard_normal((n, c, h, w)), "float16")
    sa, ba, ma = (rng.standard_normal((1, c, 1, 1)) for _ in range(3))
    ia = rng.uniform(0.5, 2, (1, c, 1, 1))
    (out,) = run(xp, g, {x: a, s: sa, b: ba, m: ma, iv: ia}, [y])
    assert rel(out, (a - ma) * ia * sa + ba) < HALF_TOL


def test_batch_norm_backward(xp):
    rng = np.random.default_rng(6)
    n, c, h, w = 8, 32, 6, 6
    a = seen(rng.standard_normal((n, c, h, w)), "float16")
    dya = seen(rng.standard_normal((n, c, h, w)), "float16")
    sa = rng.standard_normal((1, c, 1, 1))
    _, mr, ir, _ = bn_ref(a, sa, 0, 1e-5)
    g = Graph()
    x, dy = (g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16") for _ in range(2))
    s, m, iv = (g.tensor((1, c, 1, 1)) for _ in range(3))
    r = g.norm_backward("batch", x, dy, s, mean=m, inv_variance=iv)
    outs = [g.mark_output(t) for t in r]
    dx, ds, db = run(xp, g, {x: a, dy: dya, s: sa, m: mr, iv: ir}, outs)
    xh = (a - mr) * ir
    dbr = dya.sum(axis=(0, 2, 3), keepdims=True)
    dsr = (dya * xh).sum(axis=(0, 2, 3), keepdims=True)
    dxr = sa * ir * (dya - dbr / (n * h * w) - xh * dsr / (n * h * w))
    assert rel(db, dbr) < 1e-3 and rel(ds, dsr) < 1e-3 and rel(dx, dxr) < HALF_TOL


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_norm_relu_mask_is_bit_packed_and_feeds_the_backward(xp, dtype):
    """cudnn-frontend's BN_RELU / DRELU_DBN patterns: the training forward writes ``relu(bn(x))`` and the ReLU's
    mask ``CMP_GT(relu_out, 0)`` as a channels-last boolean output, bit-packed (channel c of a pixel in bit c % 8 of
    byte c // 8: bound as a uint8 ``(N, H, W, C // 8)`` array, poisoned first); the backward graph ``MUL(dy, mask)
    -> NORM_BACKWARD`` gives the ReLU's and the norm's gradients in one graph, against the float64 reference of
    ``dy * (y > 0)`` through batch norm. y and the product are in x's dtype, as cudnn-frontend's patterns have them
    (float32 ones beside a bfloat16 x have no engine in cuDNN 9.19). float32 measured on the H100 with cuDNN 9.19
    (y 6.7e-8, dx 6.1e-8)."""
    rng = np.random.default_rng(16)
    n, c, h, w, eps = 8, 32, 6, 5, 1e-5
    tol = 1e-5 if dtype == "float32" else HALF_TOL
    a = seen(rng.standard_normal((n, c, h, w)) * 2 + 0.5, dtype)
    dya = seen(rng.standard_normal((n, c, h, w)), dtype)
    sa, ba = rng.standard_normal((1, c, 1, 1)), rng.standard_normal((1, c, 1, 1))
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), dtype, name="x")
    s, b = (g.tensor((1, c, 1, 1), name=nm) for nm in ("scale", "bias"))
    r = g.norm_forward("batch", x, s, b, epsilon=eps)
    relu = g.pointwise("RELU_FWD", r.y)
    y = g.mark_output(relu, dtype)  # in x's dtype: a float32 y beside a bfloat16 x has no engine
    mask = g.mark_output(g.pointwise("CMP_GT", relu, g.scalar(0.0), dtype="bool", name="mask"), "bool",
                         strides=NHWC(n, c, h, w))  # fmt: skip
    mean, inv = g.mark_output(r.mean), g.mark_output(r.inv_variance)
    outs = {t: nan_like(xp, t) for t in (y, mean, inv)}
    bits = xp.empty((n, h, w, c // 8), "uint8", 0, None)
    xp.copy(bits, xp.from_numpy(np.full((n, h, w, c // 8), 0xA5, np.uint8), 0))
    g.execute({x: put(xp, a, x), s: put(xp, sa, s), b: put(xp, ba, b), mask: bits, **outs})
    yg, mg, ig = (got(xp, outs[t]) for t in (y, mean, inv))
    yr, mr, ir, _ = bn_ref(a, sa, ba, eps)
    assert rel(yg, np.maximum(yr, 0)) < tol
    assert rel(mg, mr) < 1e-4 and rel(ig, ir) < 1e-4
    unpacked = np.unpackbits(xp.to_numpy(bits), axis=-1, bitorder="little").transpose(0, 3, 1, 2)
    active = yg > 0  # where this call's ReLU passed (a pre-activation near 0 may round either way)
    assert np.array_equal(unpacked.astype(bool), active)

    g2 = Graph()
    x2, dy = (g2.tensor((n, c, h, w), NHWC(n, c, h, w), dtype, name=nm) for nm in ("x", "dy"))
    m2 = g2.tensor((n, c, h, w), NHWC(n, c, h, w), "bool", name="mask")
    s2, mu, iv = (g2.tensor((1, c, 1, 1), name=nm) for nm in ("scale", "mean", "inv"))
    rb = g2.norm_backward("batch", x2, g2.pointwise("MUL", dy, m2, dtype=dtype), s2, mean=mu, inv_variance=iv)
    dxt, dst, dbt = marked = [g2.mark_output(t) for t in rb]
    outs2 = {t: nan_like(xp, t) for t in marked}
    g2.execute({x2: put(xp, a, x2), dy: put(xp, dya, dy), m2: bits, s2: put(xp, sa, s2), mu: outs[mean],
                iv: outs[inv], **outs2})  # fmt: skip
    gm = dya * active
    xh = (a - mr) * ir
    dbr = gm.sum(axis=(0, 2, 3), keepdims=True)
    dsr = (gm * xh).sum(axis=(0, 2, 3), keepdims=True)
    dxr = sa * ir * (gm - dbr / (n * h * w) - xh * dsr / (n * h * w))
    assert rel(got(xp, outs2[dst]), dsr) < 1e-3 and rel(got(xp, outs2[dbt]), dbr) < 1e-3
    assert rel(got(xp, outs2[dxt]), dxr) < max(tol, 1e-4)


def ln_ref(x, scale, bias, eps, rms=False):
    axes = tuple(range(1, x.ndim))
    if rms:
        inv = 1 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
        mean = np.zeros_like(inv)
    else:
        mean = x.mean(axis=axes, keepdims=True)
        inv = 1 / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return (x - mean) * inv * scale + bias, mean, inv


def ln_backward_ref(x, dy, scale, mean, inv, rms=False):
    axes = tuple(range(1, x.ndim))
    xh = (x - mean) * inv
    dxh = dy * scale
    dx = dxh - xh * (dxh * xh).mean(axis=axes, keepdims=True)
    if not rms:
        dx -= dxh.mean(axis=axes, keepdims=True)
    return inv * dx, (dy * xh).sum(axis=0, keepdims=True), dy.sum(axis=0, keepdims=True)


@pytest.mark.parametrize("mode", ["layer", "rms"])
def test_layer_and_rms_norm_forward_and_backward(xp, mode):
    rng = np.random.default_rng(7)
    n, c, eps, dt = 64, 256, 1e-5, "bfloat16"
    rms = mode == "rms"
    a = seen(rng.standard_normal((n, c, 1, 1)) * 1.5 + 0.3, dt)
    sa, ba = rng.standard_normal((1, c, 1, 1)), rng.standard_normal((1, c, 1, 1))
    g = Graph()
    x = g.tensor((n, c, 1, 1), NHWC(n, c, 1, 1), dt, name="x")  # (tokens, hidden, 1, 1) as cuDNN's samples
    s = g.tensor((1, c, 1, 1), NHWC(1, c, 1, 1), name="scale")
    b = None if rms else g.tensor((1, c, 1, 1), NHWC(1, c, 1, 1), name="bias")
    r = g.norm_forward(mode, x, s, b, epsilon=eps)
    outs = [g.mark_output(t) for t in r if t is not None]
    res = run(xp, g, {x: a, s: sa, **({} if rms else {b: ba})}, outs)
    yr, mr, ir = ln_ref(a, sa, 0 if rms else ba, eps, rms)
    assert rel(res[0], yr) < HALF_TOL
    assert rel(res[-1], ir) < 1e-3
    if not rms:
        assert np.abs(res[1] - mr).max() < 1e-3
    # backward from the reference statistics
    dya = seen(rng.standard_normal((n, c, 1, 1)), dt)
    g = Graph()
    x, dy = g.tensor((n, c, 1, 1), NHWC(n, c, 1, 1), dt), g.tensor((n, c, 1, 1), NHWC(n, c, 1, 1), dt)
    s, iv = g.tensor((1, c, 1, 1), NHWC(1, c, 1, 1)), g.tensor((n, 1, 1, 1))
    m = None if rms else g.tensor((n, 1, 1, 1))
    r = g.norm_backward(mode, x, dy, s, mean=m, inv_variance=iv)
    outs = [g.mark_output(t) for t in r if t is not None]
    res = run(xp, g, {x: a, dy: dya, s: sa, iv: ir, **({} if rms else {m: mr})}, outs)
    dxr, dsr, dbr = ln_backward_ref(a, dya, sa, mr, ir, rms)
    assert rel(res[0], dxr) < HALF_TOL
    assert rel(res[1], dsr) < 1e-3
    if not rms:
        assert rel(res[2], dbr) < 1e-3


# ----------------------------------------------------------------- genstats, rng, reshape, concat


def test_genstats_after_convolution(xp):
    """The pattern cuDNN 9.19 runs (a lone genstats has no engine on Hopper): conv -> y and its statistics."""
    rng = np.random.default_rng(8)
    n, c, h, w = 4, 32, 8, 8
    a = seen(rng.standard_normal((n, c, h, w)), "float16")
    wa = seen(rng.standard_normal((c, c, 1, 1)) / math.sqrt(c), "float16")
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16")
    wt = g.tensor((c, c, 1, 1), (c, 1, c, c), "float16")
    y = g.mark_output(g.conv_fprop(x, wt), "float16")
    ssum, sq = g.genstats(y)
    yo, so, sqo = run(xp, g, {x: a, wt: wa}, [y, g.mark_output(ssum), g.mark_output(sq)])
    ref = np.einsum("nchw,kc->nkhw", a, wa[:, :, 0, 0])
    assert rel(yo, ref) < 2e-3
    assert rel(so, ref.sum(axis=(0, 2, 3), keepdims=True)) < 2e-3
    assert rel(sqo, (ref * ref).sum(axis=(0, 2, 3), keepdims=True)) < 2e-3


def test_rng_bernoulli_through_attention_dropout(xp):
    """cuDNN 9.19 runs RNG inside the attention pattern. With q = 0 every probability is 1/Skv, and with
    v = I the output shows the Bernoulli keep-mask: o = mask / ((1 - p) * Skv)."""
    p, (b, h, sq, skv) = 0.3, (4, 8, 256, 64)
    g = Graph()
    q = g.tensor((b, h, sq, skv), None, "bfloat16", name="q")
    k = g.tensor((b, h, skv, skv), None, "bfloat16", name="k")
    v = g.tensor((b, h, skv, skv), None, "bfloat16", name="v")
    seed, off = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_forward(q, k, v, dropout=p, seed=seed, offset=off)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    ka = seen(np.random.default_rng(15).standard_normal((b, h, skv, skv)), "bfloat16")
    eye = np.broadcast_to(np.eye(skv), (b, h, skv, skv))

    def draw(sd, of):
        oo, so = run(
            xp,
            g,
            {
                q: np.zeros((b, h, sq, skv)),
                k: ka,
                v: eye,
                seed: np.full((1, 1, 1, 1), sd),
                off: np.full((1, 1, 1, 1), of),
            },
            [o, st],
        )
        assert rel(so, np.full(so.shape, math.log(skv))) < 1e-3
        mask = oo * (1 - p) * skv
        assert np.abs(mask - np.round(mask)).max() < 0.02 and set(np.unique(np.round(mask))) <= {0.0, 1.0}
        return np.round(mask)

    first, again, other_seed, other_offset = draw(1234, 0), draw(1234, 0), draw(99, 0), draw(1234, 4096)
    m = first.size
    assert abs(first.mean() - (1 - p)) < 5 * math.sqrt(p * (1 - p) / m)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other_seed) and not np.array_equal(first, other_offset)


# Reshape runs on Hopper with cuDNN 9.19 only inside the attention backward pattern (a lone reshape, or
# reshape -> matmul, has no engine there): test_sdpa_backward exercises its three transposes.


def test_concat_after_convolution(xp):
    """conv(x) and y0 joined along channels, y0 declared in place (input 1): the fusion cuDNN 9.19 runs.

    In place means y0's data already lies in its region of the output, so cuDNN leaves that region
    alone: the output is pre-filled there (with y0's values, then with a sentinel) and checked exactly."""
    rng = np.random.default_rng(11)
    n, c, h, w, k = 2, 32, 8, 8, 16
    a = seen(rng.standard_normal((n, c, h, w)), "float16")
    wa = seen(rng.standard_normal((k, c, 1, 1)) / math.sqrt(c), "float16")
    y0a = seen(rng.standard_normal((n, k, h, w)), "float16")
    g = Graph()
    x = g.tensor((n, c, h, w), NHWC(n, c, h, w), "float16")
    wt = g.tensor((k, c, 1, 1), (c, 1, c, c), "float16")
    y0 = g.tensor((n, k, h, w), NHWC(n, k, h, w), "float16")
    y1 = g.mark_output(g.concat([g.conv_fprop(x, wt, dtype="float16"), y0], 1, inplace_index=1))
    assert y1.dims == (n, 2 * k, h, w)
    conv = np.einsum("nchw,kc->nkhw", a, wa[:, :, 0, 0])
    bind = {x: put(xp, a, x), wt: put(xp, wa, wt), y0: put(xp, y0a, y0)}
    # the caller has placed y0 in the output (the in-place contract); the conv's region is NaN
    out = put(xp, np.concatenate([np.full((n, k, h, w), np.nan), y0a], axis=1), y1)
    g.execute({**bind, y1: out})
    res = got(xp, out)
    assert rel(res[:, :k], conv) < HALF_TOL
    np.testing.assert_array_equal(res[:, k:], y0a)  # exactly y0, whether cuDNN copies it or not
    # a sentinel there instead: cuDNN writes only the conv's region, the in-place input's stays untouched
    out = put(xp, np.concatenate([np.full((n, k, h, w), np.nan), np.full((n, k, h, w), 0.75)], axis=1), y1)
    g.execute({**bind, y1: out})
    res = got(xp, out)
    assert rel(res[:, :k], conv) < HALF_TOL
    np.testing.assert_array_equal(res[:, k:], 0.75)


# ----------------------------------------------------------------- SDPA


def sdpa_ref(q, k, v, scale, causal):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    e = np.exp(s - mx)
    sm = e.sum(axis=-1, keepdims=True)
    p = e / sm
    return p @ v, mx + np.log(sm), p


def sdpa_backward_ref(q, k, v, do, scale, causal):
    o, _, p = sdpa_ref(q, k, v, scale, causal)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, v)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * scale
    return ds @ k, np.einsum("bhqk,bhqd->bhkd", ds, q), dv


SHAPE = (2, 4, 256, 64)
BSHD = lambda b, h, s, d: (s * h * d, d, h * d, 1)  # noqa: E731


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_sdpa_forward(xp, causal, layout):
    rng = np.random.default_rng(12)
    b, h, s, d = SHAPE
    strides = BSHD(b, h, s, d) if layout == "bshd" else None
    qa, ka, va = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(3))
    g = Graph()
    q, k, v = (g.tensor(SHAPE, strides, "bfloat16", name=nm) for nm in "qkv")
    r = g.sdpa_forward(q, k, v, causal=causal)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    assert o.strides == q.strides
    oo, so = run(xp, g, {q: qa, k: ka, v: va}, [o, st])
    oref, sref, _ = sdpa_ref(qa, ka, va, 1 / math.sqrt(d), causal)
    assert rel(oo, oref) < HALF_TOL
    assert rel(so, sref) < 1e-3


def test_sdpa_forward_without_statistics_output(xp):
    rng = np.random.default_rng(16)
    qa, ka, va = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(3))
    g = Graph()
    q, k, v = (g.tensor(SHAPE, None, "bfloat16") for _ in range(3))
    r = g.sdpa_forward(q, k, v, causal=True, stats=False)
    assert r.stats is None and len(g.scratch()) == 1
    (oo,) = run(xp, g, {q: qa, k: ka, v: va}, [g.mark_output(r.o)])
    assert rel(oo, sdpa_ref(qa, ka, va, 1 / math.sqrt(SHAPE[3]), True)[0]) < HALF_TOL


def test_sdpa_forward_unified_operation(xp):
    rng = np.random.default_rng(13)
    qa, ka, va = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(3))
    g = Graph()
    q, k, v = (g.tensor(SHAPE, None, "bfloat16") for _ in range(3))
    r = g.sdpa_forward(q, k, v, implementation="unified", scale=0.1)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    oo, so = run(xp, g, {q: qa, k: ka, v: va}, [o, st])
    oref, sref, _ = sdpa_ref(qa, ka, va, 0.1, False)
    assert rel(oo, oref) < HALF_TOL and rel(so, sref) < 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward(xp, causal):
    rng = np.random.default_rng(14)
    b, h, s, d = SHAPE
    scale = 1 / math.sqrt(d)
    qa, ka, va, doa = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(4))
    oref, sref, _ = sdpa_ref(qa, ka, va, scale, causal)
    g = Graph()
    q, k, v, o, do = (g.tensor(SHAPE, None, "bfloat16", name=nm) for nm in ("q", "k", "v", "o", "do"))
    st = g.tensor((b, h, s, 1), name="stats")
    r = g.sdpa_backward(q, k, v, o, do, st, causal=causal)
    outs = [g.mark_output(t) for t in r]
    res = run(xp, g, {q: qa, k: ka, v: va, o: seen(oref, "bfloat16"), do: doa, st: sref}, outs)
    refs = sdpa_backward_ref(qa, ka, va, doa, scale, causal)
    for name, out, ref in zip(("dq", "dk", "dv"), res, refs):
        assert rel(out, ref) < 2e-2, name


def other_stream(xp):
    """A new stream of the array library (not its current one)."""
    if xp.name == "torch":
        import torch

        return torch.cuda.Stream(0)
    import cupy

    with cupy.cuda.Device(0):
        return cupy.cuda.Stream(non_blocking=True)


def test_sdpa_backward_clears_the_dq_accumulator_before_every_run(xp):
    """The float32 dq accumulator is accumulated into: without clearing, a second run on the same plan
    (same per-stream scratch buffer) adds to the first's dq, and a NaN left in a bound one poisons dq."""
    rng = np.random.default_rng(15)
    b, h, s, d = SHAPE
    scale = 1 / math.sqrt(d)
    qa, ka, va, doa = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(4))
    oref, sref, _ = sdpa_ref(qa, ka, va, scale, False)
    g = Graph()
    q, k, v, o, do = (g.tensor(SHAPE, None, "bfloat16", name=nm) for nm in ("q", "k", "v", "o", "do"))
    st = g.tensor((b, h, s, 1), name="stats")
    outs = [g.mark_output(t) for t in g.sdpa_backward(q, k, v, o, do, st)]
    init = g.scratch_init()
    (acc,) = [t for t in g.scratch() if init[t.uid] == "zero"]
    assert acc.dims == SHAPE and acc.dtype == "float32"
    plan = g.build()
    inputs = {
        t: put(xp, a, t) for t, a in ((q, qa), (k, ka), (v, va), (o, seen(oref, "bfloat16")), (do, doa), (st, sref))
    }
    refs = sdpa_backward_ref(qa, ka, va, doa, scale, False)

    def check(res, what):
        for name, t, ref in zip(("dq", "dk", "dv"), outs, refs):
            assert rel(got(xp, res[t]), ref) < 2e-2, f"{what}: {name}"

    def poison(res):
        for t in outs:
            xp.copy(res[t], nan_like(xp, t))

    # execute twice on one stream with the plan's own scratch
    res = {t: nan_like(xp, t) for t in outs}
    for i in range(2):
        poison(res)
        plan.execute({**inputs, **res})
        check(res, f"execute #{i + 1}")
    # the pre-bound path, twice
    bound = plan.bind({**inputs, **res})
    for i in range(2):
        poison(res)
        bound()
        check(res, f"bound #{i + 1}")
    # the accumulator bound by the caller, full of NaN before each run
    accd = nan_like(xp, acc)
    plan.execute({**inputs, **res, acc: accd})
    check(res, "bound NaN accumulator")
    assert np.isfinite(got(xp, accd)).all()  # cleared (then accumulated into) by the run
    bound = plan.bind({**inputs, **res, acc: accd})
    for i in range(2):
        xp.copy(accd, nan_like(xp, acc))
        poison(res)
        bound()
        check(res, f"bound with NaN accumulator #{i + 1}")


def test_bound_plan_runs_only_on_the_stream_of_its_buffers(xp):
    """A BoundPlan using the plan's per-stream scratch refuses another stream; with the workspace given and
    the scratch bound it runs there (and clears the accumulator on that stream)."""
    rng = np.random.default_rng(17)
    b, h, s, d = SHAPE
    scale = 1 / math.sqrt(d)
    qa, ka, va, doa = (seen(rng.standard_normal(SHAPE), "bfloat16") for _ in range(4))
    oref, sref, _ = sdpa_ref(qa, ka, va, scale, True)
    g = Graph()
    q, k, v, o, do = (g.tensor(SHAPE, None, "bfloat16", name=nm) for nm in ("q", "k", "v", "o", "do"))
    st = g.tensor((b, h, s, 1), name="stats")
    outs = [g.mark_output(t) for t in g.sdpa_backward(q, k, v, o, do, st, causal=True)]
    plan = g.build()
    inputs = {
        t: put(xp, a, t) for t, a in ((q, qa), (k, ka), (v, va), (o, seen(oref, "bfloat16")), (do, doa), (st, sref))
    }
    res = {t: nan_like(xp, t) for t in outs}
    other = other_stream(xp)
    bound = plan.bind({**inputs, **res})  # the plan's scratch of the current stream
    with pytest.raises(ValueError, match="bound for stream .* cannot run on stream"):
        bound(stream=other)
    assert np.isnan(got(xp, res[outs[0]])).all()  # nothing ran
    scratch = {t: nan_like(xp, t) for t in g.scratch()}
    ws = xp.empty((max(plan.workspace_size, 1),), "uint8", 0)
    free = plan.bind({**inputs, **res, **scratch}, workspace=ws)
    xp.synchronize(0)  # the inputs, written on the current stream, are ready for the other one
    free(stream=other)
    free(stream=other)  # twice: the accumulator is cleared on that stream too
    xp.synchronize(0)
    refs = sdpa_backward_ref(qa, ka, va, doa, scale, True)
    for name, t, ref in zip(("dq", "dk", "dv"), outs, refs):
        assert rel(got(xp, res[t]), ref) < 2e-2, name
