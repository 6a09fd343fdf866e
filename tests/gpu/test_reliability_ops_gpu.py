"""Issue 10 regression tests for the L2 ops on the GPU: every layout of every input and ``out=``, against float64.

Named after the classes of the issue (W1, W2: silently wrong results; U-numbers: unclear errors). The ``out=``
audit (W2) runs each op with its inputs and its outputs in each of these layouts:

* ``c``: C order;
* ``transposed``: every axis reversed in memory (an ``empty(shape[::-1]).T``-style view);
* ``channels_last``: ``(N, spatial..., C)`` memory seen as ``(N, C, spatial...)``;
* ``gapped``: a strided slice of a bigger buffer (``buf[1:, ..., ::2]``), whose other elements must stay untouched.

Inputs are fresh random values, outputs are poisoned (NaN) beforehand, every result is compared with an
independent float64 NumPy reference (the ones the per-op GPU tests use), and for a gapped ``out`` the buffer's
elements outside the view are checked to be still NaN.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from cudnnkit import ops

from ..numerics import dev, host, np_dtype, permute, poisoned, rel, seen
from .test_norm_dropout_gpu import DN, LRN_P, ref_divnorm, ref_divnorm_backward, ref_lrn, ref_lrn_backward
from .test_softmax_gpu import TOL, axes_tuple, ref_backward, ref_softmax
from .test_spatial_transformer_gpu import ref_grid_sample, ref_grid_sample_backward, sample_grid

pytestmark = pytest.mark.gpu

KINDS = ("c", "transposed", "channels_last", "gapped")


def _gap_index(nd: int) -> tuple[slice, ...]:
    """Where a ``gapped`` view sits in its buffer: from the second row on, every other element of the last dim."""
    return (slice(1, None),) + (slice(None),) * (nd - 2) + (slice(None, None, 2),)


def _gap_buffer_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0] + 1, *shape[1:-1], 2 * shape[-1])


class Placed:
    """A device array of ``shape`` in layout ``kind``; ``buffer`` is the allocation it views, ``mask`` (host,
    the buffer's shape) marks the view's elements (None when the view covers its buffer)."""

    def __init__(self, xp, shape, dtype, kind, values=None):
        shape = tuple(shape)
        nd = len(shape)
        self.kind, self.mask = kind, None
        fill = np.full(shape, np.nan) if values is None else np.asarray(values, np.float64)
        if kind == "c":
            self.buffer = dev(xp, fill, dtype)
            self.array = self.buffer
        elif kind == "transposed":
            rev = tuple(reversed(range(nd)))
            self.buffer = dev(xp, fill.transpose(rev), dtype)
            self.array = permute(xp, self.buffer, rev)
        elif kind == "channels_last":
            assert nd >= 3
            self.buffer = dev(xp, np.moveaxis(fill, 1, -1), dtype)
            self.array = permute(xp, self.buffer, (0, nd - 1, *range(1, nd - 1)))
        elif kind == "gapped":
            buf = np.full(_gap_buffer_shape(shape), np.nan)
            buf[_gap_index(nd)] = fill
            self.mask = np.zeros(buf.shape, bool)
            self.mask[_gap_index(nd)] = True
            self.buffer = dev(xp, buf, dtype)
            self.array = self.buffer[_gap_index(nd)]
        else:
            raise AssertionError(kind)
        v = xp.view(self.array, "placed")
        assert v.shape == shape
        if kind != "c":
            assert not v.is_contiguous()

    def outside_untouched(self, xp) -> bool:
        """For a gapped view: every buffer element outside it is still NaN (its poison)."""
        if self.mask is None:
            return True
        return bool(np.isnan(host(xp, self.buffer)[~self.mask]).all())


def placed(xp, a, dtype, kind):
    """``a`` (host values) on the device in layout ``kind``."""
    return Placed(xp, np.shape(a), dtype, kind, a).array


def out_in(xp, shape, dtype, kind, values=None):
    """A poisoned (or ``values``-filled) output in layout ``kind``."""
    return Placed(xp, shape, dtype, kind, values)


# ----------------------------------------------------------------- W1: log-softmax of a gapped input


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("log", [True, False])
def test_W1_log_softmax_gapped_strides(xp, dtype, log):
    """The issue's repro: x = randn(3, 9)[:, ::3] gave a max abs error of 2.17 against log_softmax."""
    rng = np.random.default_rng()
    full = rng.standard_normal((3, 9)) * 2
    x = dev(xp, full, dtype)[:, ::3]
    xa = seen(full[:, ::3], dtype)
    y = ops.softmax_forward(x, log=log)
    assert rel(host(xp, y), ref_softmax(xa, (1,), log)) < TOL[dtype]
    # and a 4-d slice with gaps in several dims, over a middle axis
    big = rng.standard_normal((4, 10, 6, 8))
    base = dev(xp, big, dtype)
    y4 = ops.softmax_forward(base[::2, 1::3, :, ::2], axis=1, log=log)
    assert rel(host(xp, y4), ref_softmax(seen(big[::2, 1::3, :, ::2], dtype), (1,), log)) < TOL[dtype]
    assert np.array_equal(host(xp, base), seen(big, dtype))  # the input's buffer is untouched


# ----------------------------------------------------------------- W2: softmax with any x and out layouts


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("x_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("axis", [1, -1])
def test_W2_softmax_out_layouts(xp, dtype, x_kind, out_kind, log, axis):
    rng = np.random.default_rng()
    shape = (3, 5, 4, 6)
    a = rng.standard_normal(shape) * 2
    ref = ref_softmax(seen(a, dtype), axes_tuple(axis, 4), log)
    out = out_in(xp, shape, dtype, out_kind)
    got = ops.softmax_forward(placed(xp, a, dtype, x_kind), axis=axis, log=log, out=out.array)
    assert got is out.array
    assert rel(host(xp, out.array), ref) < TOL[dtype]
    assert out.outside_untouched(xp)
    # blend into out's old contents: out = 2 * result + 0.5 * old
    old = rng.standard_normal(shape)
    out2 = out_in(xp, shape, dtype, out_kind, old)
    ops.softmax_forward(placed(xp, a, dtype, x_kind), axis=axis, log=log, out=out2.array, alpha=2.0, beta=0.5)
    tol = TOL[dtype] * (4 if dtype == "bfloat16" else 10)
    assert rel(host(xp, out2.array), 2 * ref + 0.5 * seen(old, dtype)) < tol
    assert out2.outside_untouched(xp)


def test_W2_softmax_issue_repro_transposed_out(xp):
    """x (3, 5) float64 into out = empty(5, 3).t(): max abs error 1.38 before."""
    a = np.random.default_rng().standard_normal((3, 5))
    out = permute(xp, poisoned(xp, (5, 3), "float64"), (1, 0))
    ops.softmax_forward(xp.from_numpy(a, 0), out=out)
    assert np.abs(host(xp, out) - ref_softmax(a, (1,), False)).max() < 1e-12


@pytest.mark.parametrize("y_kind", KINDS)
@pytest.mark.parametrize("dy_kind", ["c", "transposed", "gapped"])
@pytest.mark.parametrize("out_kind", ["c", "channels_last", "gapped"])
@pytest.mark.parametrize("log", [False, True])
def test_U2_W2_softmax_backward_mixed_strides(xp, y_kind, dy_kind, out_kind, log):
    """y and dy in different strides gave a bare !isTensorSameStrides; any out layout must be written right."""
    rng = np.random.default_rng()
    shape = (2, 6, 3, 4)
    y = ref_softmax(rng.standard_normal(shape), (1,), log)
    g = rng.standard_normal(shape)
    out = out_in(xp, shape, "float64", out_kind)
    dx = ops.softmax_backward(
        placed(xp, g, "float64", dy_kind), placed(xp, y, "float64", y_kind), axis=1, log=log, out=out.array
    )
    assert dx is out.array
    assert rel(host(xp, dx), ref_backward(y, g, (1,), log)) < 1e-11
    assert out.outside_untouched(xp)


# ----------------------------------------------------------------- LRN


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("x_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_lrn_out_layouts(xp, dtype, x_kind, out_kind):
    rng = np.random.default_rng()
    shape = (2, 7, 4, 5)
    a, g = rng.standard_normal(shape), rng.standard_normal(shape)
    xa = seen(a, dtype)
    y_ref, _ = ref_lrn(xa, 3, **LRN_P)
    out = out_in(xp, shape, dtype, out_kind)
    x = placed(xp, a, dtype, x_kind)
    assert ops.lrn_forward(x, size=3, **LRN_P, out=out.array) is out.array
    assert rel(host(xp, out.array), y_ref) < TOL[dtype]
    assert out.outside_untouched(xp)
    dxo = out_in(xp, shape, dtype, out_kind)
    kinds = [k for k in KINDS if k != x_kind]
    dx = ops.lrn_backward(
        placed(xp, g, dtype, kinds[0]), placed(xp, y_ref, dtype, kinds[1]), x, size=3, **LRN_P, out=dxo.array
    )
    ref = ref_lrn_backward(xa, seen(g, dtype), 3, **LRN_P)
    assert rel(host(xp, dx), ref) < TOL[dtype] * (1 if dtype == "float64" else 10)
    assert dxo.outside_untouched(xp)


@pytest.mark.parametrize(
    "shape, kind",
    [
        ((2, 5, 3, 4, 2), "channels_last"),  # 5-d, not DHW-packed
        ((2, 5, 3, 4, 2), "gapped"),
        ((2, 5, 3, 4, 2), "transposed"),
        ((2, 5, 2, 3, 2, 2), "c"),  # 6-d
        ((2, 5, 2, 3, 2, 2), "channels_last"),
        ((2, 5, 2, 3, 2, 2), "gapped"),
        ((2, 4, 2, 1, 2, 3, 2, 2), "transposed"),  # 8-d
    ],
)
def test_U4_lrn_more_than_4_dims_any_layout(xp, shape, kind):
    """Non-packed arrays of more than 4 dims got a bare BAD_PARAM or NOT_SUPPORTED."""
    rng = np.random.default_rng()
    a, g = rng.standard_normal(shape), rng.standard_normal(shape)
    y_ref, _ = ref_lrn(a, 3, **LRN_P)
    x = placed(xp, a, "float64", kind)
    out = out_in(xp, shape, "float64", kind)
    ops.lrn_forward(x, size=3, **LRN_P, out=out.array)
    assert rel(host(xp, out.array), y_ref) < 1e-12 and out.outside_untouched(xp)
    assert rel(host(xp, ops.lrn_forward(x, size=3, **LRN_P)), y_ref) < 1e-12
    dx = ops.lrn_backward(placed(xp, g, "float64", kind), placed(xp, y_ref, "float64", "c"), x, size=3, **LRN_P)
    assert rel(host(xp, dx), ref_lrn_backward(a, g, 3, **LRN_P)) < 1e-12


# ----------------------------------------------------------------- divisive normalization


@pytest.mark.parametrize("x_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_divisive_normalization_out_layouts(xp, x_kind, out_kind):
    rng = np.random.default_rng()
    shape = (2, 3, 7, 6)
    a, g = rng.standard_normal(shape), rng.standard_normal(shape)
    out = out_in(xp, shape, "float64", out_kind)
    x = placed(xp, a, "float64", x_kind)
    assert ops.divisive_normalization_forward(x, **DN, out=out.array) is out.array
    assert rel(host(xp, out.array), ref_divnorm(a, **DN)[0]) < 1e-12 and out.outside_untouched(xp)
    dxo = out_in(xp, shape, "float64", out_kind)
    dx, dm = ops.divisive_normalization_backward(placed(xp, g, "float64", "transposed"), x, **DN, dx_out=dxo.array)
    assert dx is dxo.array and dm is None
    assert rel(host(xp, dx), ref_divnorm_backward(a, g, **DN)) < 1e-12 and dxo.outside_untouched(xp)


@pytest.mark.parametrize("means_kind", ["transposed", "channels_last", "gapped"])
def test_W2_divisive_normalization_means_layouts(xp, means_kind):
    """How cuDNN uses means is not documented (so there is no float64 reference): means of any layout must give
    what C-order means give, forward and backward, dmeans in any layout too."""
    rng = np.random.default_rng()
    shape = (2, 3, 5, 6)
    a, m, g = (rng.standard_normal(shape) for _ in range(3))
    x = xp.from_numpy(a, 0)
    y0 = host(xp, ops.divisive_normalization_forward(x, xp.from_numpy(m, 0), **DN))
    y1 = ops.divisive_normalization_forward(x, placed(xp, m, "float64", means_kind), **DN)
    assert np.array_equal(host(xp, y1), y0)
    dx0, dm0 = (
        host(xp, t) for t in ops.divisive_normalization_backward(xp.from_numpy(g, 0), x, xp.from_numpy(m, 0), **DN)
    )
    dmo = out_in(xp, shape, "float64", means_kind)
    dx1, dm1 = ops.divisive_normalization_backward(
        xp.from_numpy(g, 0), x, placed(xp, m, "float64", means_kind), **DN, dmeans_out=dmo.array
    )
    assert dm1 is dmo.array and dmo.outside_untouched(xp)
    assert np.allclose(host(xp, dx1), dx0, rtol=1e-13, atol=0) and np.allclose(host(xp, dm1), dm0, rtol=1e-13, atol=0)


# ----------------------------------------------------------------- dropout


def _dropout_check(xa, y, p):
    """y is x * mask / (1 - p) with a 0/1 mask (x has no zeros): returns the mask."""
    kept = y != 0
    assert np.isfinite(y).all()
    assert np.allclose(y[kept], xa[kept] / (1 - p), rtol=1e-6, atol=0)
    frac = 1 - kept.mean()
    assert abs(frac - p) < 0.15, frac
    return kept


@pytest.mark.parametrize("x_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_dropout_out_layouts_and_backward_in_another_layout(xp, x_kind, out_kind):
    """Forward with x and out in any layouts; backward with dy in yet another layout: each element meets its own
    mask bit (dx is dy * mask / (1 - p) with the forward's mask)."""
    rng = np.random.default_rng()
    shape, p = (3, 4, 8, 8), 0.5
    a = rng.uniform(0.5, 1.5, shape)
    out = out_in(xp, shape, "float64", out_kind)
    y, reserve = ops.dropout_forward(placed(xp, a, "float64", x_kind), p, out=out.array)
    assert y is out.array and out.outside_untouched(xp)
    kept = _dropout_check(a, host(xp, y), p)
    g = rng.uniform(0.5, 1.5, shape)
    for dy_kind in KINDS:
        dxo = out_in(xp, shape, "float64", dy_kind if dy_kind != x_kind else "gapped")
        dx = ops.dropout_backward(placed(xp, g, "float64", dy_kind), reserve, p, out=dxo.array)
        assert dx is dxo.array and dxo.outside_untouched(xp)
        assert np.allclose(host(xp, dx), np.where(kept, g / (1 - p), 0.0), rtol=1e-6, atol=0), dy_kind
        dx2 = ops.dropout_backward(placed(xp, g, "float64", dy_kind), reserve, p)
        assert np.allclose(host(xp, dx2), np.where(kept, g / (1 - p), 0.0), rtol=1e-6, atol=0), dy_kind


def _as_strided(xp, base, shape, strides):
    """A view of ``base`` with element ``strides`` (overlapping ones allowed)."""
    if xp.name == "torch":
        return base.as_strided(shape, strides)
    import cupy

    isz = base.dtype.itemsize
    return cupy.lib.stride_tricks.as_strided(base, shape, tuple(s * isz for s in strides))


def test_U3_dropout_on_an_overlapping_view(xp):
    """An overlapping x (rows sharing memory) got a bare dropoutVerifyParams; y, the reserve and the backward
    must behave as for the same values laid out plainly."""
    rng = np.random.default_rng()
    base = rng.uniform(0.5, 1.5, 40)
    based = xp.from_numpy(base, 0)
    x = _as_strided(xp, based, (8, 33), (1, 1))  # x[i, j] = base[i + j]
    xa = np.lib.stride_tricks.as_strided(base, (8, 33), (8, 8)).copy()
    y, reserve = ops.dropout_forward(x, 0.5)
    kept = _dropout_check(xa, host(xp, y), 0.5)
    g = rng.uniform(0.5, 1.5, (8, 33))
    dx = ops.dropout_backward(xp.from_numpy(g, 0), reserve, 0.5)
    assert np.allclose(host(xp, dx), np.where(kept, 2 * g, 0.0), rtol=1e-6, atol=0)
    assert np.array_equal(host(xp, based), base)  # the input's memory is untouched


# ----------------------------------------------------------------- U4: set_tensor / scale_tensor of many dims


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "index",
    [
        (slice(None),) * 5 + (slice(None, None, 2),),  # 6-d, gapped in the last dim
        (slice(1, None), slice(None), slice(None, None, 2)) + (slice(None),) * 3,
        (slice(None, None, 2),) * 6,  # gaps in every dim: 6 dims after merging, the 2 smallest looped over
    ],
)
def test_U4_set_and_scale_6d_strided(xp, dtype, index):
    rng = np.random.default_rng()
    a = rng.standard_normal((3, 4, 4, 3, 4, 6))
    base = dev(xp, a, dtype)
    view = base[index]
    want = seen(a, dtype)
    assert ops.scale_tensor(view, -1.5) is view
    want[index] = seen(want[index] * -1.5, dtype)
    assert rel(host(xp, base), want) < TOL[dtype]
    assert ops.set_tensor(view, 0.25) is view
    want[index] = 0.25
    assert np.array_equal(host(xp, base), want)
    # a transposed 6-d view (dense): one dim to cuDNN
    t = permute(xp, base, (5, 4, 3, 2, 1, 0))
    ops.set_tensor(t, -2.0)
    assert np.all(host(xp, base) == -2.0)


def test_U4_set_tensor_on_an_expanded_view_and_nan_fill(xp):
    rng = np.random.default_rng()
    row = xp.from_numpy(rng.standard_normal((1, 5)), 0)
    wide = row.expand(4, 5) if xp.name == "torch" else xp.module.broadcast_to(row, (4, 5))
    ops.set_tensor(wide, float("nan"))
    assert np.isnan(host(xp, row)).all()


# ----------------------------------------------------------------- tensor ops: out= layouts


@pytest.mark.parametrize("x_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_transform_tensor_out_layouts(xp, x_kind, out_kind):
    rng = np.random.default_rng()
    shape = (2, 3, 4, 5)
    a = rng.standard_normal(shape)
    out = out_in(xp, shape, "float64", out_kind)
    assert ops.transform_tensor(placed(xp, a, "float64", x_kind), out=out.array) is out.array
    assert np.array_equal(host(xp, out.array), a) and out.outside_untouched(xp)
    old = rng.standard_normal(shape)
    out2 = out_in(xp, shape, "float64", out_kind, old)
    ops.transform_tensor(placed(xp, a, "float64", x_kind), out=out2.array, alpha=2.0, beta=0.5)
    assert rel(host(xp, out2.array), 2 * a + 0.5 * old) < 1e-15 and out2.outside_untouched(xp)


@pytest.mark.parametrize("x_kind", ["c", "channels_last", "gapped"])
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_transform_tensor_padded_out_layouts(xp, x_kind, out_kind):
    """Padding into any out layout, and blended (the fuzzer's float64 NCHW case, which cudnnTransformTensorEx
    refused with NOT_SUPPORTED_LAYOUT): padding is zero, the border is beta * old."""
    rng = np.random.default_rng()
    a = rng.standard_normal((2, 3, 4, 5))
    out = out_in(xp, (2, 3, 7, 8), "float64", out_kind)
    pads = ((0, 0), (0, 0), (1, 2), (2, 1))
    y = ops.transform_tensor(
        placed(xp, a, "float64", x_kind), pad_before=(0, 0, 1, 2), pad_after=(0, 0, 2, 1), out=out.array
    )
    assert y is out.array and out.outside_untouched(xp)
    assert np.array_equal(host(xp, y), np.pad(a, pads))
    old = rng.standard_normal((2, 3, 7, 8))
    out2 = out_in(xp, (2, 3, 7, 8), "float64", out_kind, old)
    ops.transform_tensor(
        placed(xp, a, "float64", x_kind),
        pad_before=(0, 0, 1, 2),
        pad_after=(0, 0, 2, 1),
        out=out2.array,
        alpha=2.0,
        beta=0.5,
    )
    assert rel(host(xp, out2.array), 2 * np.pad(a, pads) + 0.5 * old) < 1e-15 and out2.outside_untouched(xp)


def test_U_transform_tensor_empty_x_with_padding_is_all_padding(xp):
    """The fuzzer found an empty x with padding returning an unwritten output: it is padding alone (zeros)."""
    x = xp.from_numpy(np.zeros((0, 4, 5, 0, 5), dtype=np.float32), 0)
    out = xp.from_numpy(np.full((2, 6, 8, 3, 7), np.nan, dtype=np.float32), 0)  # poisoned
    y = ops.transform_tensor(x, pad_before=2, pad_after=(0, 0, 1, 1, 0), out=out)
    assert y is out and np.array_equal(host(xp, y), np.zeros((2, 6, 8, 3, 7)))


@pytest.mark.parametrize("a_kind", ["c", "channels_last", "gapped"])
@pytest.mark.parametrize("c_kind", KINDS)
def test_W2_add_tensor_layouts(xp, a_kind, c_kind):
    rng = np.random.default_rng()
    shape = (2, 3, 4, 5)
    for ashape in (shape, (1, 3, 1, 1)):
        if a_kind != "c" and ashape != shape:
            continue
        a, old = rng.standard_normal(ashape), rng.standard_normal(shape)
        c = out_in(xp, shape, "float64", c_kind, old)
        assert ops.add_tensor(placed(xp, a, "float64", a_kind), c.array, alpha=1.5, beta=-0.5) is c.array
        assert rel(host(xp, c.array), 1.5 * a - 0.5 * old) < 1e-15 and c.outside_untouched(xp)


# ----------------------------------------------------------------- spatial transformer: out= layouts


@pytest.mark.parametrize("x_kind", ["c", "channels_last", "gapped"])
@pytest.mark.parametrize("out_kind", KINDS)
def test_W2_grid_sample_out_layouts(xp, x_kind, out_kind):
    """The sampler describes x and y with their own strides (their shapes differ): any layout of either."""
    rng = np.random.default_rng()
    n, c, h, w, ho, wo = 2, 3, 5, 6, 4, 5
    a = rng.standard_normal((n, c, h, w))
    grid = sample_grid(rng, n, ho, wo, h, w)
    dy = rng.standard_normal((n, c, ho, wo))
    x = placed(xp, a, "float64", x_kind)
    gd = xp.from_numpy(grid, 0)
    out = out_in(xp, (n, c, ho, wo), "float64", out_kind)
    assert ops.grid_sample_forward(x, gd, out=out.array) is out.array
    assert rel(host(xp, out.array), ref_grid_sample(a, grid)) < 1e-10 and out.outside_untouched(xp)
    dxo = out_in(xp, (n, c, h, w), "float64", out_kind)
    dx, dgrid = ops.grid_sample_backward(x, gd, placed(xp, dy, "float64", out_kind), dx_out=dxo.array)
    dx_ref, dgrid_ref = ref_grid_sample_backward(a, grid, dy)
    assert dx is dxo.array and dxo.outside_untouched(xp)
    assert rel(host(xp, dx), dx_ref) < 1e-10 and rel(host(xp, dgrid), dgrid_ref) < 1e-10


# ----------------------------------------------------------------- CTC and RNN: packed outputs refused by name


def test_W2_ctc_and_rnn_refuse_outputs_of_other_layouts(xp):
    rng = np.random.default_rng()
    T, N, A = 6, 2, 5
    x = xp.from_numpy(rng.standard_normal((T, N, A)).astype(np.float32), 0)
    bad = permute(xp, poisoned(xp, (A, N, T), "float32"), (2, 1, 0))
    with pytest.raises(ValueError, match="grads_out must be C-contiguous"):
        ops.ctc_loss(x, [1, 2], [1, 1], [T, T], grads_out=bad)
    gapped = Placed(xp, (T, N, A), "float32", "gapped").array
    with pytest.raises(ValueError, match="grads_out must be C-contiguous"):
        ops.ctc_loss(x, [1, 2], [1, 1], [T, T], grads_out=gapped)
    # a gapped x is copied first and gives what the contiguous one gives
    xg = placed(xp, host(xp, x), "float32", "gapped")
    c0, g0 = ops.ctc_loss(x, [1, 2], [1, 1], [T, T])
    c1, g1 = ops.ctc_loss(xg, [1, 2], [1, 1], [T, T])
    assert np.array_equal(host(xp, c0), host(xp, c1)) and np.array_equal(host(xp, g0), host(xp, g1))

    rnn = ops.RNN("gru", 4, 5, dtype="float64")
    w = rnn.new_weights(xp.from_numpy(np.zeros(1), 0))
    ops.set_tensor(w, 0.1)
    xr = xp.from_numpy(rng.standard_normal((3, 2, 4)), 0)
    y_bad = permute(xp, poisoned(xp, (5, 2, 3), "float64"), (2, 1, 0))
    with pytest.raises(ValueError, match=r"^out must be C-contiguous \(cuDNN writes y packed\)"):
        ops.rnn_forward(xr, w, rnn=rnn, out=y_bad)


def test_U13_rnn_padding_fill_nan_marks_padded_steps(xp):
    """padding_fill=None used to become NaN silently (now a TypeError, CPU tier); an explicit NaN fill is allowed and
    lands exactly on the padded steps."""
    rng = np.random.default_rng()
    rnn = ops.RNN("gru", 4, 5, dtype="float64")
    w = rnn.new_weights(xp.from_numpy(np.zeros(1), 0))
    ops.set_tensor(w, 0.05)
    x = xp.from_numpy(rng.standard_normal((4, 3, 4)), 0)
    y, _, _ = ops.rnn_forward(x, w, rnn=rnn, seq_lengths=[4, 2, 1], padding_fill=float("nan"))
    yh = host(xp, y)
    valid = np.arange(4)[:, None] < np.array([4, 2, 1])[None, :]
    assert np.isfinite(yh[valid]).all() and np.isnan(yh[~valid]).all()
    with pytest.raises(TypeError, match="^padding_fill must be a real number"):
        ops.rnn_forward(x, w, rnn=rnn, padding_fill=None)


def test_U5_persist_dynamic_refuses_variable_lengths_before_any_work(xp):
    rnn = ops.RNN("lstm", 8, 8, algo="persist_dynamic", dtype="float16")
    x = xp.from_numpy(np.zeros((4, 2, 8), np_dtype("float16")), 0)
    w = rnn.new_weights(x)
    with pytest.raises(ValueError, match="algo='persist_dynamic' does not support sequences of different lengths"):
        ops.rnn_forward(x, w, rnn=rnn, seq_lengths=[4, 3])


@pytest.mark.parametrize("shape, dy_shape", [((5, 2), (5, 3)), ((6,), (1,)), ((4, 2, 6), (4, 2, 1, 6))])
def test_dropout_backward_refuses_the_reserve_of_another_shape(xp, shape, dy_shape):
    # issue 10's fuzzer: reserve sizes are rounded, so a (5, 2) forward's reserve passed the size check for a
    # (5, 3) dy; the forward's recorded shape is now compared, naming dy and reserve
    x = xp.from_numpy(np.random.default_rng().uniform(0.5, 1.5, shape), 0)
    _, reserve = ops.dropout_forward(x, 0.5)
    dy = xp.from_numpy(np.ones(dy_shape), 0)
    msg = rf"dy has shape {re.escape(str(dy_shape))}, but reserve was written by a dropout_forward of shape"
    with pytest.raises(ValueError, match=msg):
        ops.dropout_backward(dy, reserve, 0.5)
