"""Spatial transformer (affine grid + bilinear sampler), forward and backward, against independent float64 references.

Two references, both on the host in float64: a NumPy implementation written
here from the definition (align_corners=True mapping, zero padding), and torch
on the CPU (``F.affine_grid(..., align_corners=True)`` and ``F.grid_sample(...,
mode="bilinear", padding_mode="zeros", align_corners=True)`` with autograd).
Every comparison checks cuDNN against both, so a failure shows which
convention cuDNN follows. The inputs of the references are the values the GPU
sees (rounded to the tested dtype). Each test prints its random seed.
"""

from __future__ import annotations

import secrets
import warnings

import numpy as np
import pytest

from cudnnkit.ops.spatial_transformer import (
    MAX_BACKWARD_CHANNELS,
    affine_grid_backward,
    affine_grid_forward,
    grid_sample_backward,
    grid_sample_forward,
)

from ..numerics import dev, finite_difference, host, np_dtype, permute, poisoned, rel

pytestmark = pytest.mark.gpu

DTYPES = ["float64", "float32", "float16"]
TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 5e-3}


# ----------------------------------------------------------------- NumPy references (float64)


def base_coords(n: int) -> np.ndarray:
    """Normalized pixel-centre coordinates of an axis of ``n`` pixels: linspace(-1, 1) (0 for one pixel, as torch)."""
    return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)


def _base(h: int, w: int) -> np.ndarray:
    """(H, W, 3) homogeneous target coordinates (x_j, y_i, 1)."""
    xs, ys = base_coords(w), base_coords(h)
    return np.stack([np.broadcast_to(xs[None, :], (h, w)), np.broadcast_to(ys[:, None], (h, w)), np.ones((h, w))], -1)


def ref_affine_grid(theta: np.ndarray, size) -> np.ndarray:
    """grid[n, i, j, :] = theta[n] @ (x_j, y_i, 1)."""
    _, _, h, w = size
    return np.einsum("hwk,njk->nhwj", _base(h, w), theta)


def ref_affine_grid_backward(dgrid: np.ndarray, size) -> np.ndarray:
    """dtheta[n, j, k] = sum_hw dgrid[n, h, w, j] * base[h, w, k]."""
    _, _, h, w = size
    return np.einsum("nhwj,hwk->njk", dgrid, _base(h, w))


def _pixels(grid: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel positions (u along W, v along H) of normalized grid points, align_corners=True."""
    return (grid[..., 0] + 1) * (w - 1) / 2, (grid[..., 1] + 1) * (h - 1) / 2


def _corners(grid: np.ndarray, h: int, w: int):
    """For each of the 4 bilinear neighbours: (row, col) indices clipped in range, validity, weights and signs."""
    u, v = _pixels(grid, h, w)
    u0, v0 = np.floor(u), np.floor(v)
    fu, fv = u - u0, v - v0
    for di in (0, 1):
        for dj in (0, 1):
            r, c = v0 + di, u0 + dj
            valid = (r >= 0) & (r < h) & (c >= 0) & (c < w)
            wu = fu if dj else 1 - fu
            wv = fv if di else 1 - fv
            yield (
                np.clip(r, 0, h - 1).astype(np.int64),
                np.clip(c, 0, w - 1).astype(np.int64),
                valid,
                wu,
                wv,
                1.0 if dj else -1.0,
                1.0 if di else -1.0,
            )


def ref_grid_sample(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """y[n, c, i, j] = sum over the 4 neighbours inside the image of weight * x[n, c, row, col]."""
    n, _, h, w = x.shape
    xt = x.transpose(0, 2, 3, 1)  # (N, H, W, C)
    b = np.broadcast_to(np.arange(n)[:, None, None], grid.shape[:3])
    y = np.zeros(grid.shape[:3] + (x.shape[1],))
    for r, c, valid, wu, wv, _, _ in _corners(grid, h, w):
        y += (valid * wu * wv)[..., None] * xt[b, r, c]
    return y.transpose(0, 3, 1, 2)


def ref_grid_sample_backward(x: np.ndarray, grid: np.ndarray, dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dgrid) of sum(dy * ref_grid_sample(x, grid)); dgrid is with respect to the normalized coordinates."""
    n, _, h, w = x.shape
    xt = x.transpose(0, 2, 3, 1)
    dyt = dy.transpose(0, 2, 3, 1)  # (N, Ho, Wo, C)
    b = np.broadcast_to(np.arange(n)[:, None, None], grid.shape[:3])
    dxt = np.zeros_like(xt)
    du = np.zeros(grid.shape[:3])
    dv = np.zeros(grid.shape[:3])
    for r, c, valid, wu, wv, su, sv in _corners(grid, h, w):
        np.add.at(dxt, (b, r, c), (valid * wu * wv)[..., None] * dyt)
        g = valid * (dyt * xt[b, r, c]).sum(-1)
        du += su * wv * g
        dv += sv * wu * g
    dgrid = np.stack([du * (w - 1) / 2, dv * (h - 1) / 2], -1)
    return dxt.transpose(0, 3, 1, 2), dgrid


# ----------------------------------------------------------------- torch (CPU, float64) references


def torch_affine_grid(theta: np.ndarray, size, dgrid: np.ndarray | None = None):
    """(grid, dtheta) from torch on the CPU; dtheta is None without dgrid."""
    torch = pytest.importorskip("torch")
    t = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():  # torch warns that unit-size grids changed in 1.3 (the probe below wants them)
        warnings.filterwarnings("ignore", "Since version 1.3.0, affine_grid", UserWarning)
        g = torch.nn.functional.affine_grid(t, list(size), align_corners=True)
    if dgrid is None:
        return g.detach().numpy(), None
    g.backward(torch.tensor(dgrid, dtype=torch.float64))
    return g.detach().numpy(), t.grad.numpy()


def torch_grid_sample(x: np.ndarray, grid: np.ndarray, dy: np.ndarray | None = None):
    """(y, dx, dgrid) from torch on the CPU; dx and dgrid are None without dy."""
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    gt = torch.tensor(grid, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.grid_sample(xt, gt, mode="bilinear", padding_mode="zeros", align_corners=True)
    if dy is None:
        return y.detach().numpy(), None, None
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return y.detach().numpy(), xt.grad.numpy(), gt.grad.numpy()


# ----------------------------------------------------------------- inputs


@pytest.fixture
def rng():
    seed = secrets.randbits(32)
    print(f"random seed: {seed}")  # pytest shows it when the test fails
    return np.random.default_rng(seed)


def sample_grid(rng, n: int, ho: int, wo: int, h: int, w: int, *, dtype: str = "float64", margin: float = 0.1):
    """Random normalized grid points away from integer pixel positions (by ``margin`` pixels, after
    rounding to ``dtype``): mostly inside, some on the border band (1-3 neighbours outside) and some
    entirely outside. Returns the grid already rounded to ``dtype``, as float64."""
    npd = np_dtype(dtype)
    for _ in range(100):
        cu, cv = _cells(rng, (n, ho, wo), w), _cells(rng, (n, ho, wo), h)
        u = cu + rng.uniform(margin + 0.05, 1 - margin - 0.05, size=cu.shape)
        v = cv + rng.uniform(margin + 0.05, 1 - margin - 0.05, size=cv.shape)
        grid = np.stack([2 * u / (w - 1) - 1, 2 * v / (h - 1) - 1], -1).astype(npd).astype(np.float64)
        pu, pv = _pixels(grid, h, w)
        if min(_dist_to_int(pu).min(), _dist_to_int(pv).min()) > margin:
            return grid
    raise AssertionError("could not draw a grid away from integer pixel positions")


def _cells(rng, shape, size: int) -> np.ndarray:
    """Pixel cells [k, k + 1): 80% inside the image (0 .. size - 2), the rest on the border band
    (-1, size - 1: one neighbour outside) or fully outside (-2, size)."""
    inside = rng.integers(0, size - 1, size=shape)
    edge = rng.choice(np.array([-2, -1, size - 1, size]), size=shape)
    return np.where(rng.random(shape) < 0.8, inside, edge)


def _dist_to_int(a: np.ndarray) -> np.ndarray:
    return np.abs(a - np.round(a))


def rounded(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Standard normal values rounded to ``dtype`` (the values the GPU will see), as float64."""
    return (rng.standard_normal(shape) * scale).astype(np_dtype(dtype)).astype(np.float64)


def random_theta(rng, n: int, dtype: str = "float64") -> np.ndarray:
    """Affine transforms near a random rotation + scale + shift, so grids cover the image and some border."""
    ang = rng.uniform(-0.6, 0.6, n)
    s = rng.uniform(0.7, 1.3, (n, 2))
    t = np.zeros((n, 2, 3))
    t[:, 0, 0], t[:, 0, 1] = s[:, 0] * np.cos(ang), -s[:, 0] * np.sin(ang)
    t[:, 1, 0], t[:, 1, 1] = s[:, 1] * np.sin(ang), s[:, 1] * np.cos(ang)
    t[:, :, 2] = rng.uniform(-0.3, 0.3, (n, 2))
    t += rng.normal(0, 0.05, t.shape)
    return t.astype(np_dtype(dtype)).astype(np.float64)


def theta_away_from_integers(rng, size, h: int, w: int, margin: float, dtype: str = "float64") -> np.ndarray:
    """random_theta whose affine grid for ``size`` samples an (h, w) image >= ``margin`` pixels from integer
    positions (where bilinear sampling has no derivative)."""
    for _ in range(1000):
        theta = random_theta(rng, size[0], dtype)
        pu, pv = _pixels(ref_affine_grid(theta, size), h, w)
        if min(_dist_to_int(pu).min(), _dist_to_int(pv).min()) > margin:
            return theta
    raise AssertionError("could not draw theta away from integer pixel positions")


# ----------------------------------------------------------------- device helpers


def nchw_from_nhwc(xp, a: np.ndarray, dtype: str):
    """``a`` (N, C, H, W) as a channels-last (NHWC memory) view with the same logical shape."""
    return permute(xp, dev(xp, a.transpose(0, 2, 3, 1), dtype), (0, 3, 1, 2))


def check(got: np.ndarray, np_ref: np.ndarray, torch_ref: np.ndarray | None, tol: float, what: str) -> None:
    """Compare against both references; the message says which one disagrees."""
    e_np = rel(got, np_ref)
    e_t = None if torch_ref is None else rel(got, torch_ref)
    assert e_np < tol and (e_t is None or e_t < tol), (
        f"{what}: rel error {e_np:.3g} vs NumPy, {e_t if e_t is None else f'{e_t:.3g}'} vs torch CPU (tol {tol})"
    )


# ----------------------------------------------------------------- affine grid


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [(2, 3, 5, 7), (3, 1, 8, 4)])
def test_affine_grid_forward_and_backward(xp, rng, dtype, size):
    n = size[0]
    theta = random_theta(rng, n, dtype)
    grid = affine_grid_forward(dev(xp, theta, dtype), size=size)
    assert tuple(grid.shape) == (n, size[2], size[3], 2)
    g_t, _ = torch_affine_grid(theta, size)
    check(host(xp, grid), ref_affine_grid(theta, size), g_t, TOL[dtype], "grid")

    dg = rounded(rng, (n, size[2], size[3], 2), dtype)
    dtheta = affine_grid_backward(dev(xp, dg, dtype), size=size)
    assert tuple(dtheta.shape) == (n, 2, 3)
    _, dth_t = torch_affine_grid(theta, size, dg)
    check(host(xp, dtheta), ref_affine_grid_backward(dg, size), dth_t, TOL[dtype], "dtheta")


def test_affine_grid_out_is_fully_written(xp, rng):
    size = (3, 2, 6, 9)
    theta = random_theta(rng, 3)
    out = poisoned(xp, (3, 6, 9, 2), "float64")
    assert affine_grid_forward(dev(xp, theta, "float64"), size=size, out=out) is out
    check(host(xp, out), ref_affine_grid(theta, size), torch_affine_grid(theta, size)[0], 1e-10, "grid")
    dg = rng.standard_normal((3, 6, 9, 2))
    dout = poisoned(xp, (3, 2, 3), "float64")
    assert affine_grid_backward(dev(xp, dg, "float64"), size=size, out=dout) is dout
    check(host(xp, dout), ref_affine_grid_backward(dg, size), None, 1e-10, "dtheta")


def test_affine_grid_non_contiguous_inputs_are_copied(xp, rng):
    size = (2, 1, 4, 5)
    theta = random_theta(rng, 2)
    t_view = permute(xp, dev(xp, theta.transpose(0, 2, 1), "float64"), (0, 2, 1))  # (N, 2, 3), not contiguous
    check(host(xp, affine_grid_forward(t_view, size=size)), ref_affine_grid(theta, size), None, 1e-10, "grid")
    dg = rng.standard_normal((2, 4, 5, 2))
    dg_view = permute(xp, dev(xp, dg.transpose(0, 3, 1, 2), "float64"), (0, 2, 3, 1))
    check(host(xp, affine_grid_backward(dg_view, size=size)), ref_affine_grid_backward(dg, size), None, 1e-10, "dtheta")


# ----------------------------------------------------------------- sampler


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", [((2, 3, 6, 5), (4, 7)), ((1, 4, 9, 11), (9, 11)), ((3, 2, 4, 4), (8, 2))])
def test_grid_sample_forward_and_backward(xp, rng, dtype, shapes):
    (n, c, h, w), (ho, wo) = shapes
    x = rounded(rng, (n, c, h, w), dtype)
    grid = sample_grid(rng, n, ho, wo, h, w, dtype=dtype)
    dy = rounded(rng, (n, c, ho, wo), dtype)
    y_t, dx_t, dgrid_t = torch_grid_sample(x, grid, dy)

    y = grid_sample_forward(dev(xp, x, dtype), dev(xp, grid, dtype))
    assert tuple(y.shape) == (n, c, ho, wo)
    check(host(xp, y), ref_grid_sample(x, grid), y_t, TOL[dtype], "y")

    dx, dgrid = grid_sample_backward(dev(xp, x, dtype), dev(xp, grid, dtype), dev(xp, dy, dtype))
    assert tuple(dx.shape) == x.shape and tuple(dgrid.shape) == grid.shape
    dx_ref, dgrid_ref = ref_grid_sample_backward(x, grid, dy)
    check(host(xp, dx), dx_ref, dx_t, TOL[dtype], "dx")
    check(host(xp, dgrid), dgrid_ref, dgrid_t, TOL[dtype], "dgrid")


def test_grid_sample_points_outside_and_on_the_border(xp, rng):
    """Hand-placed points: corners (exact), half a pixel outside (half the border value), far outside (0)."""
    x = rng.standard_normal((1, 2, 3, 4))
    h, w = 3, 4
    pts = np.array(
        [
            [-1, -1],
            [1, 1],
            [-1, 1],
            [1, -1],  # the corner pixel centres
            [-1 - 1 / (w - 1), 0],
            [1 + 1 / (w - 1), 0],  # half a pixel beyond the left/right border
            [0, -1 - 1 / (h - 1)],
            [3.0, 0.5],
            [-0.3, -5.0],
        ]
    )  # half a pixel above; far outside
    grid = pts.reshape(1, 1, -1, 2)
    y = host(xp, grid_sample_forward(dev(xp, x, "float64"), dev(xp, grid, "float64")))[0, :, 0]
    mid_row = (x[0, :, 1, :] + x[0, :, 1, :]) / 2  # v = 1 exactly (gy = 0 with H = 3)
    expect = np.stack(
        [
            x[0, :, 0, 0],
            x[0, :, 2, 3],
            x[0, :, 2, 0],
            x[0, :, 0, 3],
            0.5 * mid_row[:, 0],
            0.5 * mid_row[:, 3],
            0.5 * (x[0, :, 0, 1] + x[0, :, 0, 2]) / 2,
            np.zeros(2),
            np.zeros(2),
        ],
        -1,
    )
    assert rel(y, expect) < 1e-12, (y, expect)
    assert rel(y, torch_grid_sample(x, grid)[0][0, :, 0]) < 1e-12


@pytest.mark.parametrize("layout", ["nhwc", "sliced", "broadcast"])
def test_grid_sample_strided_inputs(xp, rng, layout):
    """x and dy with their own strides (NHWC, a slice) or copied (a broadcast view); grid not contiguous."""
    n, c, h, w, ho, wo = 2, 3, 5, 6, 4, 5
    grid = sample_grid(rng, n, ho, wo, h, w)
    dy = rng.standard_normal((n, c, ho, wo))
    if layout == "nhwc":
        x = rng.standard_normal((n, c, h, w))
        xd, dyd = nchw_from_nhwc(xp, x, "float64"), nchw_from_nhwc(xp, dy, "float64")
    elif layout == "sliced":
        full = rng.standard_normal((n, c + 1, 2 * h, w + 2))
        x = full[:, 1:, ::2, 1:-1]
        xd = dev(xp, full, "float64")[:, 1:, ::2, 1:-1]
        full_dy = rng.standard_normal((n, c, ho, 2 * wo))
        dy = full_dy[:, :, :, ::2]
        dyd = dev(xp, full_dy, "float64")[:, :, :, ::2]
    else:
        one = rng.standard_normal((1, c, h, w))
        x = np.broadcast_to(one, (n, c, h, w))
        d1 = dev(xp, one, "float64")
        xd = d1.expand(n, c, h, w) if xp.name == "torch" else xp.module.broadcast_to(d1, (n, c, h, w))
        dyd = dev(xp, dy, "float64")
    gd = permute(xp, dev(xp, grid.transpose(0, 3, 1, 2), "float64"), (0, 2, 3, 1))  # (N, Ho, Wo, 2) view
    check(host(xp, grid_sample_forward(xd, gd)), ref_grid_sample(x, grid), None, 1e-10, "y")
    dx, dgrid = grid_sample_backward(xd, gd, dyd)
    dx_ref, dgrid_ref = ref_grid_sample_backward(np.ascontiguousarray(x), grid, dy)
    check(host(xp, dx), dx_ref, None, 1e-10, "dx")
    check(host(xp, dgrid), dgrid_ref, None, 1e-10, "dgrid")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("out_layout", ["nchw", "nhwc"])
def test_grid_sample_outputs_poisoned(xp, rng, dtype, out_layout):
    """NaN-filled outputs with beta = 0 are fully overwritten; y and dx outputs may also be channels-last."""
    n, c, h, w, ho, wo = 2, 4, 5, 7, 6, 3
    x = rounded(rng, (n, c, h, w), dtype)
    grid = sample_grid(rng, n, ho, wo, h, w, dtype=dtype)
    dy = rounded(rng, (n, c, ho, wo), dtype)
    dx_ref, dgrid_ref = ref_grid_sample_backward(x, grid, dy)
    xd, gd, dyd = dev(xp, x, dtype), dev(xp, grid, dtype), dev(xp, dy, dtype)
    if out_layout == "nhwc":
        y_out = permute(xp, poisoned(xp, (n, ho, wo, c), dtype), (0, 3, 1, 2))
        dx_out = permute(xp, poisoned(xp, (n, h, w, c), dtype), (0, 3, 1, 2))
    else:
        y_out, dx_out = poisoned(xp, (n, c, ho, wo), dtype), poisoned(xp, (n, c, h, w), dtype)
    dgrid_out = poisoned(xp, (n, ho, wo, 2), dtype)
    assert grid_sample_forward(xd, gd, out=y_out) is y_out
    check(host(xp, y_out), ref_grid_sample(x, grid), None, TOL[dtype], "y")
    dx, dgrid = grid_sample_backward(xd, gd, dyd, dx_out=dx_out, dgrid_out=dgrid_out)
    assert dx is dx_out and dgrid is dgrid_out
    check(host(xp, dx_out), dx_ref, None, TOL[dtype], "dx")
    check(host(xp, dgrid_out), dgrid_ref, None, TOL[dtype], "dgrid")


@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_beta_blend(xp, rng, dtype):
    """y = alpha * sample + beta * y; dx = alpha * dx_ref + beta * dx; dgrid = alpha_dgrid * dgrid_ref + beta_dgrid * dgrid."""
    n, c, h, w, ho, wo = 2, 3, 4, 6, 5, 4
    x = rounded(rng, (n, c, h, w), dtype)
    grid = sample_grid(rng, n, ho, wo, h, w, dtype=dtype)
    dy = rounded(rng, (n, c, ho, wo), dtype)
    old_y, old_dx, old_dg = (rounded(rng, s, dtype) for s in ((n, c, ho, wo), (n, c, h, w), (n, ho, wo, 2)))
    xd, gd, dyd = dev(xp, x, dtype), dev(xp, grid, dtype), dev(xp, dy, dtype)

    y = dev(xp, old_y, dtype)
    grid_sample_forward(xd, gd, out=y, alpha=2.0, beta=0.5)
    check(host(xp, y), 2.0 * ref_grid_sample(x, grid) + 0.5 * old_y, None, TOL[dtype], "blended y")

    dx, dg = dev(xp, old_dx, dtype), dev(xp, old_dg, dtype)
    grid_sample_backward(xd, gd, dyd, alpha=2.0, beta=0.5, alpha_dgrid=-1.5, beta_dgrid=0.25, dx_out=dx, dgrid_out=dg)
    dx_ref, dgrid_ref = ref_grid_sample_backward(x, grid, dy)
    check(host(xp, dx), 2.0 * dx_ref + 0.5 * old_dx, None, TOL[dtype], "blended dx")
    check(host(xp, dg), -1.5 * dgrid_ref + 0.25 * old_dg, None, TOL[dtype], "blended dgrid")


def test_spatial_transformer_network(xp, rng):
    """theta -> affine grid -> sampler and back, the way a spatial transformer layer uses them (float32)."""
    n, c, h, w, ho, wo = 4, 3, 12, 10, 9, 11
    dtype = "float32"
    theta = theta_away_from_integers(rng, (n, c, ho, wo), h, w, 1e-3, dtype)
    x = rounded(rng, (n, c, h, w), dtype)
    dy = rounded(rng, (n, c, ho, wo), dtype)
    grid = affine_grid_forward(dev(xp, theta, dtype), size=(n, c, ho, wo))
    y = grid_sample_forward(dev(xp, x, dtype), grid)
    dx, dgrid = grid_sample_backward(dev(xp, x, dtype), grid, dev(xp, dy, dtype))
    dtheta = affine_grid_backward(dgrid, size=(n, c, ho, wo))
    # torch end to end from the same inputs, in float64 (cuDNN's grid is float32: compare at float32 level)
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    t = torch.tensor(theta, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    yt = F.grid_sample(xt, F.affine_grid(t, [n, c, ho, wo], align_corners=True), align_corners=True)
    yt.backward(torch.tensor(dy))
    assert rel(host(xp, y), yt.detach().numpy()) < 1e-5
    assert rel(host(xp, dx), xt.grad.numpy()) < 1e-5
    assert rel(host(xp, dtheta), t.grad.numpy()) < 1e-5


def test_empty_batch_returns_empty_outputs(xp):
    x = dev(xp, np.zeros((0, 3, 4, 5)), "float32")
    grid = dev(xp, np.zeros((0, 6, 7, 2)), "float32")
    assert tuple(grid_sample_forward(x, grid).shape) == (0, 3, 6, 7)
    dx, dgrid = grid_sample_backward(x, grid, dev(xp, np.zeros((0, 3, 6, 7)), "float32"))
    assert tuple(dx.shape) == (0, 3, 4, 5) and tuple(dgrid.shape) == (0, 6, 7, 2)
    theta = dev(xp, np.zeros((0, 2, 3)), "float32")
    assert tuple(affine_grid_forward(theta, size=(0, 3, 6, 7)).shape) == (0, 6, 7, 2)
    assert tuple(affine_grid_backward(grid, size=(0, 3, 6, 7)).shape) == (0, 2, 3)


def test_many_channels(xp, rng):
    """The forward takes any C; the backward is checked at the largest C it accepts (1024), and above
    that it is refused before cuDNN (which returns NOT_SUPPORTED for 1100 on cuDNN 9.19)."""
    for c in (1100, MAX_BACKWARD_CHANNELS):
        n, h, w = 1, 3, 4
        x = rng.standard_normal((n, c, h, w))
        grid = sample_grid(rng, n, 2, 3, h, w)
        dy = rng.standard_normal((n, c, 2, 3))
        xd, gd = dev(xp, x, "float32"), dev(xp, grid, "float32")
        xa, ga, dya = (a.astype(np.float32).astype(np.float64) for a in (x, grid, dy))
        check(host(xp, grid_sample_forward(xd, gd)), ref_grid_sample(xa, ga), None, 1e-5, "y")
        if c > MAX_BACKWARD_CHANNELS:
            with pytest.raises(ValueError, match="at most 1024"):
                grid_sample_backward(xd, gd, dev(xp, dy, "float32"))
            continue
        dx, dgrid = grid_sample_backward(xd, gd, dev(xp, dy, "float32"))
        dx_ref, dgrid_ref = ref_grid_sample_backward(xa, ga, dya)
        check(host(xp, dx), dx_ref, None, 1e-5, "dx")
        check(host(xp, dgrid), dgrid_ref, None, 1e-5, "dgrid")


# ----------------------------------------------------------------- finite differences (float64)


def test_gradients_by_finite_differences_float64(xp, rng):
    """dx and dgrid of loss = sum(wt * grid_sample(x, grid)), and dtheta of loss(theta) through the affine grid,
    against central differences of the cuDNN forward. Grid points stay >= 0.1 pixel from integer positions."""
    n, c, h, w, ho, wo = 2, 2, 4, 5, 3, 2
    x = rng.standard_normal((n, c, h, w))
    grid = sample_grid(rng, n, ho, wo, h, w)
    wt = rng.standard_normal((n, c, ho, wo))

    def loss(xa, ga):
        return float((host(xp, grid_sample_forward(dev(xp, xa, "float64"), dev(xp, ga, "float64"))) * wt).sum())

    dx, dgrid = grid_sample_backward(dev(xp, x, "float64"), dev(xp, grid, "float64"), dev(xp, wt, "float64"))
    assert rel(host(xp, dx), finite_difference(lambda a: loss(a, grid), x)) < 1e-7
    assert rel(host(xp, dgrid), finite_difference(lambda g: loss(x, g), grid)) < 1e-7

    # dtheta through the grid: draw theta whose grid points stay away from integer pixel positions
    size = (n, c, ho, wo)
    theta = theta_away_from_integers(rng, size, h, w, 1e-3)

    def loss_theta(t):
        g = affine_grid_forward(dev(xp, t, "float64"), size=size)
        return float((host(xp, grid_sample_forward(dev(xp, x, "float64"), g)) * wt).sum())

    g = affine_grid_forward(dev(xp, theta, "float64"), size=size)
    _, dg = grid_sample_backward(dev(xp, x, "float64"), g, dev(xp, wt, "float64"))
    dtheta = host(xp, affine_grid_backward(dg, size=size))
    assert rel(dtheta, finite_difference(loss_theta, theta)) < 1e-7
