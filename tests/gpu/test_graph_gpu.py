"""GPU tier for cudnnkit.graph plans: each op kind built, executed and compared with a float64 NumPy
reference; fused graphs; the plan cache; serialization; the deterministic filter; bindings; the fast
path; autotuning; CUDA-graph population. Runs for CuPy and torch arrays (the ``xp`` fixture)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cudnnkit
from cudnnkit.graph import BindingError, Graph, UnsupportedGraphError, load_plan, plan_cache

from ..numerics import dev, host, rel, seen

pytestmark = pytest.mark.gpu

TOL = {"float32": 3e-3, "float16": 3e-3, "bfloat16": 1.5e-2}  # float32 may run as TF32 (allow_tf32 default)


# ----------------------------------------------------------------- helpers


def nan_out(xp, t):
    """A device array laid out like graph tensor ``t``, filled with NaN (poisoned)."""
    arr = xp.empty(t.dims, t.dtype, 0, t.strides)
    if xp.name == "torch":
        arr.fill_(float("nan"))
    else:
        arr.fill(np.nan)
    return arr


def randn(shape, scale=1.0):
    return np.random.default_rng().standard_normal(shape) * scale


def conv_ref(x, w, stride, pad):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp_ = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, k, ho, wo))
    for i in range(r):
        for j in range(s):
            patch = xp_[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    return out


def dgrad_ref(dy, w, x_shape, stride, pad):
    n, c, h, wd = x_shape
    _, _, r, s = w.shape
    ho, wo = dy.shape[2:]
    dxp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    for i in range(r):
        for j in range(s):
            dxp[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride] += np.einsum(
                "nkhw,kc->nchw", dy, w[:, :, i, j]
            )
    return dxp[:, :, pad : pad + h, pad : pad + wd]


def wgrad_ref(x, dy, w_shape, stride, pad):
    k, c, r, s = w_shape
    xp_ = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = dy.shape[2:]
    dw = np.zeros(w_shape)
    for i in range(r):
        for j in range(s):
            dw[:, :, i, j] = np.einsum(
                "nkhw,nchw->kc", dy, xp_[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride]
            )
    return dw


_erf = np.vectorize(math.erf)


def gelu(v):
    return 0.5 * v * (1 + _erf(v / math.sqrt(2)))


def conv_graph(xa, wa, dtype, layout, stride=1, pad=1, xp=None):
    """A conv_fprop graph defined from device arrays; returns (graph, x, w, y, arrays)."""
    xd, wd = dev(xp, xa, dtype, layout), dev(xp, wa, dtype, layout)
    g = Graph(name="conv")
    x, w = g.tensor_like(xd, "x"), g.tensor_like(wd, "w")
    y = g.mark_output(g.conv_fprop(x, w, stride=stride, pre_padding=pad, name="y"), dtype)
    return g, x, w, y, xd, wd


# ----------------------------------------------------------------- convolution


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_fprop_matches_reference(xp, dtype, layout, stride):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, x, w, y, xd, wd = conv_graph(xa, wa, dtype, layout, stride, 1, xp)
    yd = nan_out(xp, y)
    plan = g.build()
    plan.execute({x: xd, w: wd, y: yd})
    ref = conv_ref(seen(xa, dtype), seen(wa, dtype), stride, 1)
    assert rel(host(xp, yd), ref) < TOL[dtype], plan.name


def test_float32_without_tf32_is_exact_and_filters_tensor_cores(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    with cudnnkit.settings(allow_tf32=False):
        g, x, w, y, xd, wd = conv_graph(xa, wa, "float32", "nhwc", 1, 1, xp)
        plan = g.build()
    assert not plan.numerical_notes & {"TENSOR_CORE", "DOWN_CONVERT_INPUTS"}, plan.numerical_notes
    yd = nan_out(xp, y)
    plan.execute({x: xd, w: wd, y: yd})
    assert rel(host(xp, yd), conv_ref(xa, wa, 1, 1)) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv_dgrad_and_wgrad_match_reference(xp, dtype):
    stride, pad = 2, 1
    xs, ws = (2, 8, 9, 9), (16, 8, 3, 3)
    xa, wa = randn(xs), randn(ws, 0.3)
    ref_y = conv_ref(xa, wa, stride, pad)
    dya = randn(ref_y.shape)
    # dgrad
    g = Graph(name="dgrad")
    dyd, wd = dev(xp, dya, dtype, "nhwc"), dev(xp, wa, dtype, "nhwc")
    dy, w = g.tensor_like(dyd, "dy"), g.tensor_like(wd, "w")
    dx = g.mark_output(g.conv_dgrad(dy, w, xs, stride=stride, pre_padding=pad), dtype)
    dxd = nan_out(xp, dx)
    g.execute({dy: dyd, w: wd, dx: dxd})
    assert rel(host(xp, dxd), dgrad_ref(seen(dya, dtype), seen(wa, dtype), xs, stride, pad)) < TOL[dtype]
    # wgrad
    g = Graph(name="wgrad")
    xd, dyd = dev(xp, xa, dtype, "nhwc"), dev(xp, dya, dtype, "nhwc")
    x, dy = g.tensor_like(xd, "x"), g.tensor_like(dyd, "dy")
    dw = g.mark_output(
        g.conv_wgrad(x, dy, ws, stride=stride, pre_padding=pad), "float32" if dtype == "float32" else dtype
    )
    dwd = nan_out(xp, dw)
    g.execute({x: xd, dy: dyd, dw: dwd})
    assert rel(host(xp, dwd), wgrad_ref(seen(xa, dtype), seen(dya, dtype), ws, stride, pad)) < TOL[dtype]


def test_fused_conv_bias_relu(xp):
    dtype = "bfloat16"
    xa, wa, ba = randn((4, 16, 12, 12)), randn((32, 16, 3, 3), 0.2), randn((1, 32, 1, 1))
    xd, wd, bd = dev(xp, xa, dtype, "nhwc"), dev(xp, wa, dtype, "nhwc"), dev(xp, ba, dtype)
    g = Graph(name="conv_bias_relu")
    x, w, b = g.tensor_like(xd, "x"), g.tensor_like(wd, "w"), g.tensor_like(bd, "b")
    y = g.mark_output(g.pointwise("RELU_FWD", g.pointwise("ADD", g.conv_fprop(x, w, pre_padding=1), b)), dtype)
    yd = nan_out(xp, y)
    plan = g.build()
    plan.execute({x: xd, w: wd, b: bd, y: yd})
    ref = np.maximum(conv_ref(seen(xa, dtype), seen(wa, dtype), 1, 1) + seen(ba, dtype), 0)
    assert rel(host(xp, yd), ref) < TOL[dtype], plan.name


# ----------------------------------------------------------------- matmul, pointwise, reduction


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_matmul_matches_reference(xp, dtype):
    aa, ba = randn((3, 64, 48)), randn((3, 48, 80))
    ad, bd = dev(xp, aa, dtype), dev(xp, ba, dtype)
    g = Graph(name="matmul")
    a, b = g.tensor_like(ad, "a"), g.tensor_like(bd, "b")
    c = g.mark_output(g.matmul(a, b), dtype)
    cd = nan_out(xp, c)
    g.execute({a: ad, b: bd, c: cd})
    assert rel(host(xp, cd), seen(aa, dtype) @ seen(ba, dtype)) < TOL[dtype]


def test_fused_matmul_bias_gelu(xp):
    dtype = "bfloat16"
    aa, ba, bias = randn((1, 128, 64)), randn((1, 64, 96), 0.2), randn((1, 1, 96))
    ad, bd, biasd = dev(xp, aa, dtype), dev(xp, ba, dtype), dev(xp, bias, dtype)
    g = Graph(name="matmul_bias_gelu")
    a, b, bi = g.tensor_like(ad, "a"), g.tensor_like(bd, "b"), g.tensor_like(biasd, "bias")
    y = g.mark_output(g.pointwise("GELU_FWD", g.pointwise("ADD", g.matmul(a, b), bi)), dtype)
    yd = nan_out(xp, y)
    plan = g.build()
    plan.execute({a: ad, b: bd, bi: biasd, y: yd})
    ref = gelu(seen(aa, dtype) @ seen(ba, dtype) + seen(bias, dtype))
    assert rel(host(xp, yd), ref) < TOL[dtype], plan.name


UNARY = {
    "RELU_FWD": lambda x: np.maximum(x, 0),
    "TANH_FWD": np.tanh,
    "SIGMOID_FWD": lambda x: 1 / (1 + np.exp(-x)),
    "GELU_FWD": gelu,
    "EXP": np.exp,
    "ABS": np.abs,
}
BINARY = {"ADD": np.add, "MUL": np.multiply, "SUB": np.subtract, "MAX": np.maximum}


@pytest.mark.parametrize("mode", sorted(UNARY) + sorted(BINARY) + ["RELU_BWD"])
def test_pointwise_modes_match_reference(xp, mode):
    dtype = "float32"
    xa, ba = randn((2, 8, 4, 6)), randn((1, 8, 1, 1))
    xd, bd = dev(xp, xa, dtype, "nhwc"), dev(xp, ba, dtype)
    g = Graph(name=mode)
    x = g.tensor_like(xd, "x")
    if mode in UNARY:
        y = g.pointwise(mode, x)
        ref, binds = UNARY[mode](xa), {}
    elif mode in BINARY:
        b = g.tensor_like(bd, "b")
        y = g.pointwise(mode, x, b)
        ref, binds = BINARY[mode](xa, ba), {b: bd}
    else:
        dya = randn(xa.shape)
        dyd = dev(xp, dya, dtype, "nhwc")
        dy = g.tensor_like(dyd, "dy")
        y = g.pointwise(mode, x, dy=dy)
        ref, binds = dya * (xa > 0), {dy: dyd}
    y = g.mark_output(y, dtype)
    yd = nan_out(xp, y)
    g.execute({x: xd, y: yd, **binds})
    assert rel(host(xp, yd), ref) < 1e-5


def test_pointwise_bfloat16_and_by_value_scalar(xp):
    dtype = "bfloat16"
    xa = randn((4, 8, 16))
    xd = dev(xp, xa, dtype)
    g = Graph(name="scale")
    x = g.tensor_like(xd, "x")
    s = g.tensor((1, 1, 1), dtype="float32", by_value=True, name="s")
    y = g.mark_output(g.pointwise("MUL", x, s), dtype)
    for value in (0.5, -3.0):
        yd = nan_out(xp, y)
        g.execute({x: xd, s: value, y: yd})
        assert rel(host(xp, yd), seen(xa, dtype) * value) < TOL[dtype]


@pytest.mark.parametrize("mode,fn", [("add", np.sum), ("max", np.max)])
@pytest.mark.parametrize("out_dims,axes", [((1, 1, 1, 1), (0, 1, 2, 3)), ((4, 1, 8, 8), (1,))])
def test_reduction_matches_reference(xp, mode, fn, out_dims, axes):
    xa = randn((4, 16, 8, 8))
    xd = dev(xp, xa, "float32", "nhwc")
    g = Graph(name=f"reduce_{mode}")
    x = g.tensor_like(xd, "x")
    y = g.mark_output(g.reduction(x, out_dims, mode=mode), "float32")
    yd = nan_out(xp, y)
    g.execute({x: xd, y: yd})
    assert rel(host(xp, yd), fn(xa, axis=axes, keepdims=True)) < 1e-5


# ----------------------------------------------------------------- cache, serialization, determinism


def test_cache_hit_for_a_new_graph_with_the_same_definition(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g1, *_ = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    p1 = g1.build()
    k1 = g1.key()
    before = plan_cache(0).stats
    g2, x, w, y, xd, wd = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    assert g2.key() == g1.key() and g2 is not g1
    assert g2.build() is p1
    after = plan_cache(0).stats
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"]
    with cudnnkit.settings(deterministic=not cudnnkit.runtime.current_settings().deterministic):
        assert g2.key() != k1  # settings are part of the key


def test_serialize_round_trip_gives_identical_results(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "bfloat16", "nhwc", 1, 1, xp)
    plan = g.build()
    y1, y2, y3 = nan_out(xp, y), nan_out(xp, y), nan_out(xp, y)
    plan.execute({x: xd, w: wd, y: y1})
    loaded = load_plan(plan.serialize())
    assert loaded.name == plan.name and loaded.workspace_size == plan.workspace_size
    loaded.execute({x.uid: xd, w.uid: wd, y.uid: y2})
    np.testing.assert_array_equal(xp.to_numpy(y1), xp.to_numpy(y2))
    # whole cache: save, clear, load; the next build finalizes the saved plan instead of running heuristics
    cache = plan_cache(0)
    data = cache.serialize()
    cache.clear()
    assert cache.deserialize(data) >= 1 and cache.stats["pending"] >= 1
    again = g.build()
    assert again is not plan and again.name == plan.name and again.attempts == []
    again.execute({x: xd, w: wd, y: y3})
    np.testing.assert_array_equal(xp.to_numpy(y1), xp.to_numpy(y3))


def test_deterministic_filter_gives_bitwise_equal_repeats(xp):
    xs, ws = (8, 32, 16, 16), (32, 32, 3, 3)
    xa, dya = randn(xs), randn((8, 32, 16, 16))
    with cudnnkit.settings(deterministic=True):
        g = Graph(name="wgrad_det")
        xd, dyd = dev(xp, xa, "float16", "nhwc"), dev(xp, dya, "float16", "nhwc")
        x, dy = g.tensor_like(xd, "x"), g.tensor_like(dyd, "dy")
        dw = g.mark_output(g.conv_wgrad(x, dy, ws, pre_padding=1), "float16")
        plan = g.build()
        assert "NONDETERMINISTIC" not in plan.numerical_notes
        outs = []
        for _ in range(3):
            o = nan_out(xp, dw)
            plan.execute({x: xd, dy: dyd, dw: o})
            outs.append(xp.to_numpy(o))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    assert rel(outs[0], wgrad_ref(seen(xa, "float16"), seen(dya, "float16"), ws, 1, 1)) < 3e-3


# ----------------------------------------------------------------- bindings, fast path, autotuning


def test_bad_bindings_raise_before_any_gpu_work(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    plan = g.build()
    yd = nan_out(xp, y)
    with pytest.raises(BindingError, match=r"unbound: tensor w \(uid 2\)"):
        plan.execute({x: xd, y: yd})
    with pytest.raises(BindingError, match=r"tensor x \(uid 1\): dtype float32, the plan expects float16"):
        plan.execute({x: dev(xp, xa, "float32", "nhwc"), w: wd, y: yd})
    with pytest.raises(BindingError, match=r"tensor x \(uid 1\): strides .* the plan expects"):
        plan.execute({x: dev(xp, xa, "float16", "nchw"), w: wd, y: yd})
    with pytest.raises(BindingError, match=r"tensor w \(uid 2\): shape \(16, 8, 3, 2\)"):
        plan.execute({x: xd, w: dev(xp, wa[..., :2], "float16", "nhwc"), y: yd})
    with pytest.raises(BindingError, match="not aligned to 16 bytes"):
        plan.execute({x: xd, w: wd, y: xp.view(yd, "y").ptr + 2})
    with pytest.raises(TypeError, match="host array"):
        plan.execute({x: xa, w: wd, y: yd})
    assert np.isnan(xp.to_numpy(yd)).all()  # nothing ran


def test_bound_fast_path_and_raw_pointers(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    plan = g.build()
    y1, y2, y3 = nan_out(xp, y), nan_out(xp, y), nan_out(xp, y)
    plan.execute({x: xd, w: wd, y: y1})
    run = plan.bind({x: xd, w: wd, y: y2})
    run()
    run()
    ws = xp.empty((max(plan.workspace_size, 1),), "uint8", 0)
    ptr = lambda a: xp.view(a, "a").ptr  # noqa: E731
    plan.execute({x: ptr(xd), w: ptr(wd), y: ptr(y3)}, workspace=ws, stream=xp.current_stream(0))
    xp.synchronize(0)
    np.testing.assert_array_equal(xp.to_numpy(y1), xp.to_numpy(y2))
    np.testing.assert_array_equal(xp.to_numpy(y1), xp.to_numpy(y3))
    assert rel(host(xp, y1), conv_ref(seen(xa, "float16"), seen(wa, "float16"), 1, 1)) < TOL["float16"]


def test_autotune_times_candidates_and_caches_the_fastest(xp):
    xa, wa = randn((8, 32, 28, 28)), randn((32, 32, 3, 3), 0.2)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "bfloat16", "nhwc", 1, 1, xp)
    yd = nan_out(xp, y)
    with cudnnkit.settings(heuristic_mode="b"):
        plan = g.autotune({x: xd, w: wd, y: yd}, max_candidates=4)
        assert g.build() is plan
    times = [t for _, t in plan.timings if isinstance(t, float)]
    assert plan.timings and times and all(n.startswith("eng") for n, _ in plan.timings)
    assert (plan.name, min(times)) in plan.timings
    plan.execute({x: xd, w: wd, y: yd})
    assert rel(host(xp, yd), conv_ref(seen(xa, "bfloat16"), seen(wa, "bfloat16"), 1, 1)) < TOL["bfloat16"]


def test_exhaustive_setting_autotunes_on_the_first_execute(xp):
    xa, wa = randn((4, 16, 20, 20)), randn((16, 16, 3, 3), 0.2)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    yd = nan_out(xp, y)
    with cudnnkit.settings(autotune="exhaustive"):
        plan = g.execute({x: xd, w: wd, y: yd})
        assert plan.timings and g.execute({x: xd, w: wd, y: yd}) is plan  # timed once, then cached
    assert rel(host(xp, yd), conv_ref(seen(xa, "float16"), seen(wa, "float16"), 1, 1)) < TOL["float16"]


def test_unsupported_error_lists_engines_and_reasons(xp):
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, *_ = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    with pytest.raises(UnsupportedGraphError) as e:
        g.build(require_behavior={"REQUIRES_FILTER_INT8x32_REORDER"})
    msg = str(e.value)
    assert "no cuDNN engine supports graph conv" in msg and "rejected by a filter" in msg
    assert e.value.attempts and all(a.name.startswith("eng") for a in e.value.attempts if a.stage == "filter")


def test_cuda_graph_population(xp):
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="cuda.bindings is not installed")
    xa, wa = randn((2, 8, 10, 10)), randn((16, 8, 3, 3), 0.3)
    g, x, w, y, xd, wd = conv_graph(xa, wa, "float16", "nhwc", 1, 1, xp)
    try:
        plan = g.build(require_behavior={"SUPPORTS_CUDA_GRAPH_NATIVE_API"})
    except UnsupportedGraphError as e:
        pytest.skip(f"no engine with the native CUDA-graph API for this conv: {e}")
    y1, y2 = nan_out(xp, y), nan_out(xp, y)
    err, cg = runtime.cudaGraphCreate(0)
    assert int(err) == 0
    plan.populate_cuda_graph({x: xd, w: wd, y: y1}, cg)
    err, exe = runtime.cudaGraphInstantiate(cg, 0)
    assert int(err) == 0
    assert int(runtime.cudaGraphLaunch(exe, xp.current_stream(0))[0]) == 0
    xp.synchronize(0)
    ref = conv_ref(seen(xa, "float16"), seen(wa, "float16"), 1, 1)
    assert rel(host(xp, y1), ref) < TOL["float16"]
    plan.update_cuda_graph({x: xd, w: wd, y: y2}, cg)
    err, exe2 = runtime.cudaGraphInstantiate(cg, 0)
    assert int(runtime.cudaGraphLaunch(exe2, xp.current_stream(0))[0]) == 0
    xp.synchronize(0)
    assert rel(host(xp, y2), ref) < TOL["float16"]
    runtime.cudaGraphExecDestroy(exe)
    runtime.cudaGraphExecDestroy(exe2)
    runtime.cudaGraphDestroy(cg)


def test_graph_constants_are_bound_by_the_plan(xp):
    # scratch tensors (allocated, bound, zeroed) are covered by the SDPA tests of test_graph_nodes_gpu.py
    dtype = "float32"
    xa = randn((4, 8, 16))
    xd = dev(xp, xa, dtype)
    g = Graph(name="const")
    x = g.tensor_like(xd, "x")
    y = g.mark_output(g.pointwise("MUL", x, g.scalar(2.5, "float32", 3)), dtype)
    yd = nan_out(xp, y)
    g.execute({x: xd, y: yd})
    assert rel(host(xp, yd), xa * 2.5) < 1e-6


def test_bfloat16_by_value_scalar_is_rounded_to_nearest(xp):
    """1/3 as a bfloat16 constant is 0x3EAB (0.333984375) rounded to nearest, 0x3EAA (0.33203125) truncated:
    the product tells them apart (0.6% apart; a float32 multiply is exact to ~1e-7)."""
    xa = randn((4, 8, 16))
    xd = dev(xp, xa, "float32")
    g = Graph(name="bf16 const")
    x = g.tensor_like(xd, "x")
    y = g.mark_output(g.pointwise("MUL", x, g.scalar(1 / 3, "bfloat16", 3)), "float32")
    yd = nan_out(xp, y)
    try:
        g.execute({x: xd, y: yd})
    except UnsupportedGraphError as e:
        pytest.skip(f"no engine multiplies float32 by a bfloat16 by-value scalar here: {e}")
    assert rel(host(xp, yd), xa * 0.333984375) < 1e-6
