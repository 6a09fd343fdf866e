"""op_tensor (``cudnnOpTensor``) and reduce_tensor (``cudnnReduceTensor``) against NumPy in float64: every op,
broadcasting, axes, indices, dtypes, blends into poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops

from ..numerics import dev, host, poisoned, rel, seen

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("op", ["add", "mul", "min", "max", "sqrt", "not"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_op_tensor(xp, op, dtype):
    rng = np.random.default_rng(0)
    a = seen(rng.uniform(0.1, 2.0, (2, 3, 4, 5)), dtype)
    b = seen(rng.standard_normal((1, 3, 1, 5)), dtype)
    unary = op in ("sqrt", "not")
    want = {"add": lambda: 2 * a - b, "mul": lambda: 2 * a * -b, "min": lambda: np.minimum(2 * a, -b),
            "max": lambda: np.maximum(2 * a, -b), "sqrt": lambda: np.sqrt(2 * a), "not": lambda: 1 - 2 * a}[op]()  # fmt: skip
    out = poisoned(xp, a.shape, dtype)
    got = ops.op_tensor(dev(xp, a, dtype), None if unary else dev(xp, b, dtype), op=op, alpha1=2.0, alpha2=-1.0,
                        out=out)  # fmt: skip
    assert got is out and rel(host(xp, out), want) < TOL[dtype] * 4


_F = {"add": np.sum, "mul": np.prod, "min": np.min, "max": np.max, "avg": np.mean,
      "amax": lambda v, **k: np.max(np.abs(v), **k), "norm1": lambda v, **k: np.sum(np.abs(v), **k),
      "norm2": lambda v, **k: np.sqrt(np.sum(v * v, **k)),
      "mul_no_zeros": lambda v, **k: np.prod(np.where(v == 0, 1.0, v), **k)}  # fmt: skip


@pytest.mark.parametrize("op", sorted(_F))
@pytest.mark.parametrize("axes", [None, 1, (0, 2), (-1,)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_reduce_tensor(xp, op, axes, dtype):
    rng = np.random.default_rng(1)
    a = seen(rng.uniform(0.5, 1.5, (3, 4, 5)) * rng.choice([-1, 1], (3, 4, 5)), dtype)
    if op == "mul_no_zeros":
        a[0, 0, 0] = 0.0
    ax = tuple(range(3)) if axes is None else tuple(i % 3 for i in np.atleast_1d(axes))
    f = _F[op]
    want = f(a, axis=ax, keepdims=True)
    got = ops.reduce_tensor(dev(xp, a, dtype), op, axes=axes)
    assert got.shape == want.shape and rel(host(xp, got), want) < TOL[dtype] * 8


@pytest.mark.parametrize("op", sorted(_F))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("shape, axes", [((3, 1, 5), 1), ((4,), ()), ((2, 1, 1, 1, 1, 1, 1, 3), (1, 2))])
def test_reduce_over_size_one_dims_only_and_bfloat16_blend(xp, op, dtype, shape, axes):
    """What cuDNN 9.19 refuses, run around it: a reduction over size-1 dims only (BAD_PARAM ``!dims_differ``) and
    bfloat16 (NOT_SUPPORTED); blended into a given out (alpha, beta), with min/max indices."""
    rng = np.random.default_rng(3)
    a = seen(rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape), dtype)
    a.flat[0] = 0.0 if op == "mul_no_zeros" else a.flat[0]
    ax = tuple(i % len(shape) for i in np.atleast_1d(axes)) if axes != () else ()
    want_c = _F[op](a, axis=ax, keepdims=True)
    c0 = seen(rng.standard_normal(want_c.shape), dtype)
    out = dev(xp, c0, dtype)
    got = ops.reduce_tensor(dev(xp, a, dtype), op, axes=axes, out=out, alpha=-2.0, beta=0.5,
                            indices=op in ("min", "max"))  # fmt: skip
    c, idx = got if op in ("min", "max") else (got, None)
    assert c is out and rel(host(xp, c), -2.0 * want_c + 0.5 * c0) < TOL[dtype] * 8
    if idx is not None:  # each slice holds one element
        assert (host(xp, idx) == 0).all()


@pytest.mark.parametrize("op, pick", [("max", np.argmax), ("min", np.argmin)])
def test_reduce_indices(xp, op, pick):
    rng = np.random.default_rng(2)
    a = rng.permutation(60).reshape(3, 4, 5).astype(np.float64)
    c, idx = ops.reduce_tensor(dev(xp, a), op, axes=2, indices=True)
    assert host(xp, idx).astype(int).reshape(3, 4).tolist() == pick(a, axis=2).tolist()
    assert np.array_equal(host(xp, c)[..., 0], (np.max if op == "max" else np.min)(a, axis=2))


@pytest.mark.parametrize("channels_last", [True, False])
def test_bfloat16_sum_as_a_graph_reduction_blended(xp, channels_last):
    """A bfloat16 sum over N and space (the convolution's bias gradient) of a channels-last array runs as a one-node
    graph reduction into a float32 temporary (cudnnReduceTensor refuses bfloat16), blended by cudnnTransformTensor;
    the plan is cached per shape. cuDNN 9.19 has no engine for the C-order form (measured on the H200: 0 engine
    configs), which takes the float32-copy route, as does a misaligned view; every route matches float64."""
    from cudnnkit.ops import arith

    if channels_last and xp.name != "torch":
        pytest.skip("a channels-last view is made with torch here")
    rng = np.random.default_rng(11)
    a = seen(rng.standard_normal((4, 8, 6, 5)), "bfloat16")
    want = a.sum(axis=(0, 2, 3), keepdims=True)
    da = dev(xp, a, "bfloat16")
    if channels_last:
        da = da.contiguous(memory_format=xp.module.channels_last)
    arith._graph_sums.clear()
    c0 = seen(rng.standard_normal(want.shape[1]), "bfloat16")
    out = dev(xp, c0, "bfloat16")
    db = ops.convolution_backward_bias(da, out=out, alpha=-2.0, beta=0.5)
    assert db is out and rel(host(xp, db), -2.0 * want.reshape(-1) + 0.5 * c0) < TOL["bfloat16"] * 8
    plans = [v for v in arith._graph_sums._d.values() if v is not None]
    assert len(plans) == (1 if channels_last else 0), "the graph route: channels-last only"
    got = ops.reduce_tensor(da, "add", axes=(0, 2, 3))
    assert rel(host(xp, got), want) < TOL["bfloat16"] * 8
    big = dev(xp, np.concatenate([np.zeros(1), a.reshape(-1)]), "bfloat16")  # a view 2 bytes past an allocation
    view = big[1:].reshape(a.shape)
    got = ops.reduce_tensor(view, "add", axes=(0, 2, 3))
    assert rel(host(xp, got), want) < TOL["bfloat16"] * 8


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_per_channel_sum_of_channels_last_as_a_graph_reduction(xp, dtype, layout):
    """The legacy form's sum (``settings(prefer="legacy")``: by default a float32 channels-last plain sum takes the
    primitive's own graph form) of a float32/float16 channels-last ``dy`` runs as the one-node graph reduction
    (float32 compute): straight into a float32 ``db`` for a plain sum, through a float32 temporary and
    cudnnTransformTensor for a blend or a float16 ``db``. A C-order ``dy`` keeps cudnnReduceTensor (no graph is
    tried). Every route matches float64, with a poisoned output each time."""
    from cudnnkit import settings
    from cudnnkit.ops import arith

    rng = np.random.default_rng(12)
    a = seen(rng.standard_normal((4, 8, 6, 5)), dtype)
    want = a.sum(axis=(0, 2, 3))
    da = dev(xp, a, dtype, layout)
    arith._graph_sums.clear()
    with settings(prefer="legacy"):
        db = ops.convolution_backward_bias(da, out=poisoned(xp, (8,), dtype))
    assert ops.last_path() == ("convolution_backward_bias", "legacy")
    assert rel(host(xp, db), want) < TOL[dtype] * 8
    c0 = seen(rng.standard_normal(8), dtype)
    out = dev(xp, c0, dtype)
    db = ops.convolution_backward_bias(da, out=out, alpha=-2.0, beta=0.5)
    assert db is out and rel(host(xp, db), -2.0 * want + 0.5 * c0) < TOL[dtype] * 8
    plans = [v for v in arith._graph_sums._d.values() if v is not None]
    # two keys for a channels-last dy: the plain sum under prefer="legacy" and the blend under "auto" differ in
    # their settings, which the graph-sum cache is keyed by
    assert len(plans) == (2 if layout == "nhwc" else 0), "the graph route: channels-last only"
    assert len(arith._graph_sums._d) == (2 if layout == "nhwc" else 0), "a C-order sum never tries the graph"
