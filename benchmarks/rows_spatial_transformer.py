"""Spatial transformer rows: ``cudnnkit.ops.spatial_transformer`` against ``torch.nn.functional``.

x is 32x64x128x128 float32, sampled at an affine grid of the same spatial
size (random transforms near the identity: rotations up to about 0.3 rad,
scales 0.8-1.2, shifts up to 0.2, so most points fall inside the image).

* ``grid_sample fwd``: ``grid_sample_forward`` vs ``F.grid_sample(...,
  align_corners=True)``. PyTorch dispatches exactly this configuration
  (bilinear, zeros, align_corners=True, 4-d, C <= 1024) to cuDNN's
  ``cudnnSpatialTfSamplerForward`` itself, so the row compares per-call
  overhead around the same kernel; the ``(torch native)`` row runs torch with
  cuDNN disabled, i.e. torch's own CUDA kernel.
* ``grid_sample fwd+bwd``: forward then ``grid_sample_backward`` (dx and dgrid)
  vs forward plus ``torch.autograd.grad`` for x and grid.
* ``affine_grid fwd``/``bwd``: ``affine_grid_forward``/``backward`` vs
  ``F.affine_grid(..., align_corners=True)`` and its autograd backward (torch
  builds the grid from a base grid and a batched matmul; no cuDNN).

Bytes are the fewest that must move: the sampler reads x and the grid and
writes y (backward also reads dy and writes dx and dgrid); the grid generator
writes the grid (reads it, for the backward). Our outputs are preallocated
(``out=``); torch's functional API allocates its own. ``DEVICE`` is only
changed to dry-run the rows' torch side on a machine without a GPU.
"""

from __future__ import annotations

from .harness import Row, register

FAMILY = "spatial_transformer"
N, C, H, W = 32, 64, 128, 128
DEVICE = "cuda"


def _theta(torch, n: int, device: str):
    g = torch.Generator(device="cpu").manual_seed(0)
    ang = (torch.rand(n, generator=g) - 0.5) * 0.6
    s = 0.8 + 0.4 * torch.rand(n, 2, generator=g)
    t = torch.zeros(n, 2, 3)
    t[:, 0, 0], t[:, 0, 1] = s[:, 0] * ang.cos(), -s[:, 0] * ang.sin()
    t[:, 1, 0], t[:, 1, 1] = s[:, 1] * ang.sin(), s[:, 1] * ang.cos()
    t[:, :, 2] = (torch.rand(n, 2, generator=g) - 0.5) * 0.4
    return t.to(device)


@register
def spatial_transformer_rows() -> list[Row]:
    import torch
    import torch.nn.functional as F

    from cudnnkit.ops.spatial_transformer import (
        affine_grid_backward,
        affine_grid_forward,
        grid_sample_backward,
        grid_sample_forward,
    )

    rows: list[Row] = []
    dtype, dname, isz = torch.float32, "float32", 4
    size = (N, C, H, W)
    s = "x".join(map(str, size))
    theta = _theta(torch, N, DEVICE)
    x = torch.randn(size, device=DEVICE, dtype=dtype)
    grid = F.affine_grid(theta, list(size), align_corners=True).contiguous()
    dy = torch.randn(size, device=DEVICE, dtype=dtype)
    y, dx, dgrid = torch.empty_like(x), torch.empty_like(x), torch.empty_like(grid)
    nx, ng = x.numel() * isz, grid.numel() * isz

    def ours_fwd():
        grid_sample_forward(x, grid, out=y)

    def torch_fwd():
        F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)

    def torch_native_fwd():
        with torch.backends.cudnn.flags(enabled=False):
            F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)

    xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()

    def ours_fwd_bwd():
        grid_sample_forward(x, grid, out=y)
        grid_sample_backward(x, grid, dy, dx_out=dx, dgrid_out=dgrid)

    def torch_fwd_bwd():
        out = F.grid_sample(xr, gr, mode="bilinear", padding_mode="zeros", align_corners=True)
        torch.autograd.grad(out, (xr, gr), dy)

    def torch_native_fwd_bwd():
        with torch.backends.cudnn.flags(enabled=False):
            torch_fwd_bwd()

    fwd_bytes = 2 * nx + ng
    bwd_bytes = 3 * nx + 2 * ng  # reads x, dy, grid; writes dx, dgrid
    rows.append(Row(FAMILY, "grid_sample fwd", s, dname, ours=ours_fwd, torch=torch_fwd, bytes=fwd_bytes))
    rows.append(
        Row(
            FAMILY,
            "grid_sample fwd (torch native)",
            s,
            dname,
            ours=ours_fwd,
            torch=torch_native_fwd,
            bytes=fwd_bytes,
            notes="torch with cuDNN disabled: its own CUDA kernel",
        )
    )
    rows.append(
        Row(
            FAMILY, "grid_sample fwd+bwd", s, dname, ours=ours_fwd_bwd, torch=torch_fwd_bwd, bytes=fwd_bytes + bwd_bytes
        )
    )
    rows.append(
        Row(
            FAMILY,
            "grid_sample fwd+bwd (torch native)",
            s,
            dname,
            ours=ours_fwd_bwd,
            torch=torch_native_fwd_bwd,
            bytes=fwd_bytes + bwd_bytes,
            notes="torch with cuDNN disabled: its own CUDA kernels",
        )
    )

    g_out, dtheta = torch.empty_like(grid), torch.empty_like(theta)
    tr = theta.detach().requires_grad_()
    g_graph = F.affine_grid(tr, list(size), align_corners=True)  # forward once; the row times the backward
    dg = torch.randn_like(grid)

    def torch_affine_bwd():
        torch.autograd.grad(g_graph, tr, dg, retain_graph=True)

    rows.append(
        Row(
            FAMILY,
            "affine_grid fwd",
            s,
            dname,
            ours=lambda: affine_grid_forward(theta, size=size, out=g_out),
            torch=lambda: F.affine_grid(theta, list(size), align_corners=True),
            bytes=ng,
        )
    )
    rows.append(
        Row(
            FAMILY,
            "affine_grid bwd",
            s,
            dname,
            ours=lambda: affine_grid_backward(dg, size=size, out=dtheta),
            torch=torch_affine_bwd,
            bytes=ng,
        )
    )
    return rows
