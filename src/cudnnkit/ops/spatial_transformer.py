"""Spatial transformer: affine grid generator and bilinear sampler, forward and backward.

Four legacy cuDNN calls, all 2-d (cuDNN has no other spatial transformer):

* :func:`affine_grid_forward` (``cudnnSpatialTfGridGeneratorForward``):
  ``theta`` ``(N, 2, 3)`` -> ``grid`` ``(N, H, W, 2)``;
* :func:`affine_grid_backward` (``cudnnSpatialTfGridGeneratorBackward``):
  ``dgrid`` ``(N, H, W, 2)`` -> ``dtheta`` ``(N, 2, 3)``;
* :func:`grid_sample_forward` (``cudnnSpatialTfSamplerForward``):
  ``x`` ``(N, C, H_in, W_in)`` sampled at ``grid`` ``(N, H_out, W_out, 2)`` -> ``y`` ``(N, C, H_out, W_out)``;
* :func:`grid_sample_backward` (``cudnnSpatialTfSamplerBackward``): ``dx`` and
  ``dgrid`` from one call.

Semantics (those of ``torch.nn.functional.affine_grid``/``grid_sample`` with
``align_corners=True``, ``mode="bilinear"``, ``padding_mode="zeros"``):

* ``grid[n, i, j] = (gx, gy)`` in normalized coordinates: ``gx`` runs along
  W (the last axis of ``x``), ``gy`` along H. ``-1`` and ``+1`` are the centres
  of the first and the last pixel: the sampled position in pixels is
  ``u = (gx + 1) * (W_in - 1) / 2``, ``v = (gy + 1) * (H_in - 1) / 2``.
* ``y[n, c, i, j]`` interpolates bilinearly between the four pixels around
  ``(v, u)`` (``floor(u)``, ``floor(u) + 1`` by ``floor(v)``, ``floor(v) + 1``); a
  pixel outside the image counts as zero, so a point less than one pixel
  outside still gets part of the border value and one further out gets 0.
* The affine grid is ``grid[n, i, j] = theta[n] @ (x_j, y_i, 1)`` with
  ``x_j = -1 + 2 j / (W - 1)`` and ``y_i = -1 + 2 i / (H - 1)`` (``linspace(-1, 1)``).
* ``dgrid`` is the gradient with respect to the normalized coordinates (it
  includes the ``(W_in - 1) / 2`` and ``(H_in - 1) / 2`` factors), and
  ``dtheta[n] = sum_ij dgrid[n, i, j]^T (x_j, y_i, 1)``.

Where this comes from, and what pins it. PyTorch sends exactly this
configuration (bilinear, zeros, ``align_corners=True``, 4-d) to
``cudnnSpatialTfSamplerForward``/``Backward``, and sets the descriptor to the
output dims ``(N, C, H_out, W_out)`` as done here. The GPU tests
(``tests/gpu/test_spatial_transformer_gpu.py``) compare every output with an
independent float64 NumPy implementation of the formulas above and with torch
on the CPU in float64, with grid points inside, in the one-pixel border band
and fully outside, for H and W of at least 2. A grid with H or W of 1 is
refused (cuDNN's values there differ from torch's, which puts the single row
or column at 0), and the sampler backward is refused above 1024 channels
(cuDNN 9.19 returns NOT_SUPPORTED for 1100); the forward takes any C. Bilinear sampling has no derivative where ``u`` or ``v`` is an
integer; which one-sided value cuDNN returns there is not pinned.

Dtypes: float32, float64 and float16, and nothing else:
``cudnnSetSpatialTransformerNdDescriptor`` refuses every other data type with
``CUDNN_STATUS_BAD_PARAM`` (bfloat16 included; cuDNN 9.19's last error reads
``(dataType != CUDNN_DATA_FLOAT) && (dataType != CUDNN_DATA_DOUBLE) &&
(dataType != CUDNN_DATA_HALF)``, checked by the CPU tests). ``theta``,
``grid`` and the gradients have the same dtype as ``x``. ``alpha``/``beta``
(float for float16/float32, double for float64) blend as
``out = alpha * result + beta * out``; ``beta != 0`` needs ``out``.

Layouts. ``theta``, ``grid`` and ``dgrid`` reach cuDNN as bare pointers, so
they must be C-contiguous: an input that is not is copied (logged at debug
level on the ``cudnnkit`` logger) and an ``out=`` that is not is refused.
``x`` and ``dy`` are described with their own strides (NCHW, NHWC, slices);
only an expanded, overlapping or reversed view is copied first (by
:func:`~cudnnkit.runtime.prepare`, logged). ``y`` and ``dx`` are allocated
C-contiguous (NCHW); an ``out=`` of another layout (channels-last, transposed,
a gapped slice) is described with its own strides: the sampler's input and
output differ in shape, so cuDNN addresses each through its own descriptor
(the GPU tests hold every combination to the float64 reference), and an
expanded, overlapping or reversed ``out`` is refused by
:meth:`~cudnnkit.runtime.Launch.output`.

Sizes: only ``N`` may be 0 (every output is then empty and cuDNN is not
called); ``C``, ``H`` and ``W`` must be positive, and no array may have more
than ``2**31 - 1`` elements (cuDNN's 32-bit indexing; PyTorch applies the same
limit before it calls this sampler).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from .. import lib
from ..runtime import DescriptorKind, check_dtype, cudnn_dtype, get_cached, tensor_descriptor
from ..runtime.arrays import ArrayView, contiguous_strides
from ..runtime.cache import lru
from ..runtime.descriptors import INT_MAX, int_array
from ..runtime.view import is_contiguous
from ._diff import Differentiable, Spec, differentiable
from ._primitive import Call, Operand, Output, Primitive, register, run, split_out

__all__ = ["affine_grid_forward", "affine_grid_backward", "grid_sample_forward", "grid_sample_backward"]

#: what cudnnSetSpatialTransformerNdDescriptor accepts (it refuses bfloat16 and the rest with BAD_PARAM)
_FLOATS = ("float16", "float32", "float64")


# ----------------------------------------------------------------- descriptor


def _set_spatial_transformer(ptr: int, dtype: str, dims: tuple[int, int, int, int]) -> None:
    lib.cudnnSetSpatialTransformerNdDescriptor(
        ptr, lib.CUDNN_SAMPLER_BILINEAR, cudnn_dtype(dtype), len(dims), int_array(dims, "size")
    )


_SPATIAL_TRANSFORMER = DescriptorKind(
    "spatial_transformer",
    "cudnnCreateSpatialTransformerDescriptor",
    "cudnnDestroySpatialTransformerDescriptor",
    _set_spatial_transformer,
)


def _st_descriptor(dtype: str, dims: tuple[int, int, int, int]) -> Any:
    """The cached bilinear spatial transformer descriptor for ``dtype`` and the output dims ``(N, C, H, W)``."""
    return get_cached(_SPATIAL_TRANSFORMER, (dtype, dims))


# ----------------------------------------------------------------- checks


def _same_dtype(v: ArrayView, name: str, dtype: str, ref: str) -> None:
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but {ref} has dtype {dtype}; they must match")


def _check_numel(shape: tuple[int, ...], name: str) -> None:
    n = math.prod(shape)
    if n > INT_MAX:
        raise ValueError(
            f"{name} has {n} elements; cuDNN's spatial transformer indexes with 32-bit ints (at most {INT_MAX})"
        )


def _size(size: Sequence[int]) -> tuple[int, int, int, int]:
    """``size`` as ``(N, C, H, W)`` ints: N >= 0, C, H, W > 0, each fitting cuDNN's int."""
    try:
        items = tuple(size)
    except TypeError:
        raise TypeError(f"size must be a sequence (N, C, H, W) of 4 ints, got {size!r}") from None
    if len(items) != 4:
        raise ValueError(f"size must be (N, C, H, W), 4 ints (cuDNN's spatial transformer is 2-d), got {size!r}")
    out = []
    for v in items:
        if isinstance(v, bool):
            raise TypeError(f"size must hold ints, got {v!r}")
        try:
            out.append(operator.index(v))
        except TypeError:
            raise TypeError(f"size must hold ints, got {v!r}") from None
    n, c, h, w = out
    if n < 0 or c < 1 or h < 1 or w < 1:
        raise ValueError(f"size (N, C, H, W) needs N >= 0 and positive C, H and W, got {tuple(out)}")
    if max(out) > INT_MAX:
        raise ValueError(f"size values must fit cuDNN's int (at most {INT_MAX}), got {tuple(out)}")
    if h < 2 or w < 2:
        # the grid spaces points as -1 + 2 i / (H - 1): undefined for one row or column, and cuDNN 9.19's
        # values there differ from torch's centre-at-0 convention (measured on an H200)
        raise ValueError(f"size needs H >= 2 and W >= 2 (the grid is -1 + 2 i / (H - 1)), got {tuple(out)}")
    return n, c, h, w


def _check_nchw(v: ArrayView, name: str) -> tuple[int, int, int, int]:
    if v.ndim != 4:
        raise ValueError(f"{name} must be 4-d (N, C, H, W), got shape {v.shape}")
    n, c, h, w = v.shape
    if c < 1 or h < 1 or w < 1:
        raise ValueError(f"{name} must have positive C, H and W (only N may be 0), got shape {v.shape}")
    _check_numel(v.shape, name)
    return n, c, h, w


def _check_grid(v: ArrayView, name: str, n: int, n_from: str) -> tuple[int, int]:
    """(H, W) of a grid-shaped array ``(N, H, W, 2)`` whose N must be ``n``."""
    if v.ndim != 4 or v.shape[3] != 2:
        raise ValueError(f"{name} must have shape (N, H, W, 2), got {v.shape}")
    if v.shape[0] != n:
        raise ValueError(f"{name} has N = {v.shape[0]} but {n_from} has N = {n}")
    h, w = v.shape[1], v.shape[2]
    if h < 1 or w < 1:
        raise ValueError(f"{name} must have positive H and W (only N may be 0), got shape {v.shape}")
    _check_numel(v.shape, name)
    return h, w


# ----------------------------------------------------------------- layouts


def _strides(v: ArrayView) -> tuple[int, ...]:
    """``v``'s strides for a tensor descriptor: canonical when C-contiguous, size-1 dims made positive otherwise."""
    return _descriptor_strides(v.shape, v.strides)


@lru("spatial_transformer.strides", 1024)
def _descriptor_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    if is_contiguous(shape, strides):
        return contiguous_strides(shape)
    return tuple(s if d > 1 or s > 0 else 1 for d, s in zip(shape, strides))


def _out_descriptor(v: ArrayView, name: str) -> Any:
    """An output's tensor descriptor, with its own strides (:meth:`Launch.output` refused the ones cuDNN cannot
    write)."""
    return tensor_descriptor(v.dtype, v.shape, _strides(v))


# ----------------------------------------------------------------- the primitives

_FAMILY = (
    "cuDNN's spatial transformer (cudnnSetSpatialTransformerNdDescriptor refuses every other type, bfloat16 included)"
)


def _grid_fwd_resolve(views: Any, kw: Any) -> tuple[int, int, int]:
    vt = views["theta"]
    n, _, h, w = _size(kw["size"])
    if vt.ndim != 3 or vt.shape[1:] != (2, 3):
        raise ValueError(f"theta must have shape (N, 2, 3), got {vt.shape}")
    if vt.shape[0] != n:
        raise ValueError(f"theta has N = {vt.shape[0]} but size has N = {n}")
    _check_numel((n, h, w, 2), "grid")
    return n, h, w


def _grid_bwd_resolve(views: Any, kw: Any) -> tuple[int, int, int]:
    vd = views["dgrid"]
    n, c, h, w = _size(kw["size"])
    if vd.ndim != 4 or vd.shape[3] != 2:
        raise ValueError(f"dgrid must have shape (N, H, W, 2), got {vd.shape}")
    if vd.shape[:3] != (n, h, w):
        raise ValueError(f"dgrid has shape {vd.shape} but size (N, C, H, W) = {(n, c, h, w)} needs {(n, h, w, 2)}")
    _check_numel(vd.shape, "dgrid")
    return n, h, w


def _grid_fwd_call(c: Call) -> None:
    n, h, w = c.resolved
    vt, vg = c.views["theta"], c.views["out"]
    # C does not enter the grid: describe it as 1 so every C shares one descriptor
    st = _st_descriptor(vt.dtype, (n, 1, h, w))
    lib.cudnnSpatialTfGridGeneratorForward(c.launch.handle, st, vt.ptr, vg.ptr)


def _grid_bwd_call(c: Call) -> None:
    n, h, w = c.resolved
    vd, vt = c.views["dgrid"], c.views["out"]
    st = _st_descriptor(vd.dtype, (n, 1, h, w))
    lib.cudnnSpatialTfGridGeneratorBackward(c.launch.handle, st, vd.ptr, vt.ptr)


def _sample_fwd_resolve(views: Any, kw: Any) -> tuple[int, int, int, int]:
    vx, vg = views["x"], views["grid"]
    _same_dtype(vg, "grid", vx.dtype, "x")
    n, c, _, _ = _check_nchw(vx, "x")
    ho, wo = _check_grid(vg, "grid", n, "x")
    _check_numel((n, c, ho, wo), "y")
    return n, c, ho, wo


def _sample_bwd_resolve(views: Any, kw: Any) -> tuple[int, int, int, int]:
    vx, vg, vdy = views["x"], views["grid"], views["dy"]
    _same_dtype(vg, "grid", vx.dtype, "x")
    _same_dtype(vdy, "dy", vx.dtype, "x")
    n, c, _, _ = _check_nchw(vx, "x")
    ho, wo = _check_grid(vg, "grid", n, "x")
    if vdy.shape != (n, c, ho, wo):
        raise ValueError(f"dy must have shape (N, C, H_out, W_out) = {(n, c, ho, wo)}, got {vdy.shape}")
    if kw.get("beta_dgrid", 0.0) != 0 and kw.get("dgrid_out") is None:
        raise ValueError("beta_dgrid != 0 blends into an existing output: pass dgrid_out=")
    if c > MAX_BACKWARD_CHANNELS:
        raise ValueError(
            f"x has {c} channels; cuDNN's sampler backward supports at most {MAX_BACKWARD_CHANNELS} "
            "(cuDNN 9.19 returns NOT_SUPPORTED for 1100, measured on an H200; PyTorch avoids cuDNN "
            "above 1024 too)"
        )
    return n, c, ho, wo


def _sample_fwd_call(c: Call) -> None:
    vx, vg, vy = c.views["x"], c.views["grid"], c.views["out"]
    y_desc = _out_descriptor(vy, "out")
    x_desc = tensor_descriptor(vx.dtype, vx.shape, _strides(vx))
    st = _st_descriptor(vx.dtype, c.resolved)
    lib.cudnnSpatialTfSamplerForward(c.launch.handle, st, c.alpha, x_desc, vx.ptr, vg.ptr, c.beta, y_desc, vy.ptr)


def _sample_bwd_call(c: Call) -> None:
    vx, vg, vdy, vdx, vdg = (c.views[n] for n in ("x", "grid", "dy", "dx_out", "dgrid_out"))
    dx_desc = _out_descriptor(vdx, "dx_out")
    x_desc = tensor_descriptor(vx.dtype, vx.shape, _strides(vx))
    dy_desc = tensor_descriptor(vdy.dtype, vdy.shape, _strides(vdy))
    (a, b), (ag, bg) = c.blends["dx_out"], c.blends["dgrid_out"]
    st = _st_descriptor(vx.dtype, c.resolved)
    lib.cudnnSpatialTfSamplerBackward(
        c.launch.handle, st, a, x_desc, vx.ptr, b, dx_desc, vdx.ptr, ag, dy_desc, vdy.ptr, vg.ptr, bg, vdg.ptr
    )


#: Most channels ``cudnnSpatialTfSamplerBackward`` accepts (cuDNN 9.19 refuses 1100).
MAX_BACKWARD_CHANNELS = 1024

AFFINE_GRID_FORWARD = register(
    Primitive(
        "affine_grid_forward",
        inputs=(Operand("theta", _FLOATS, packed=True),),
        outputs=(Output("out", shape=lambda r: (r[0], r[1], r[2], 2), packed=True),),
        resolve=_grid_fwd_resolve,
        legacy=_grid_fwd_call,
        empty=lambda r: r[0] == 0,
        family=_FAMILY,
        differentiable=("theta",),
        backward="affine_grid_backward",
    )
)
AFFINE_GRID_BACKWARD = register(
    Primitive(
        "affine_grid_backward",
        inputs=(Operand("dgrid", _FLOATS, packed=True),),
        outputs=(Output("out", shape=lambda r: (r[0], 2, 3), packed=True),),
        resolve=_grid_bwd_resolve,
        legacy=_grid_bwd_call,
        empty=lambda r: r[0] == 0,
        family=_FAMILY,
    )
)
GRID_SAMPLE_FORWARD = register(
    Primitive(
        "grid_sample_forward",
        inputs=(Operand("x", _FLOATS), Operand("grid", packed=True)),
        outputs=(Output("out", shape=lambda r: r, blend=("alpha", "beta")),),
        resolve=_sample_fwd_resolve,
        legacy=_sample_fwd_call,
        empty=lambda r: r[0] == 0,
        family=_FAMILY,
        differentiable=("x", "grid"),
        residuals=("x", "grid"),
        backward="grid_sample_backward",
    )
)
GRID_SAMPLE_BACKWARD = register(
    Primitive(
        "grid_sample_backward",
        inputs=(Operand("x", _FLOATS), Operand("grid", packed=True), Operand("dy")),
        outputs=(
            Output("dx_out", like="x", blend=("alpha", "beta")),
            Output("dgrid_out", like="grid", packed=True, blend=("alpha_dgrid", "beta_dgrid")),
        ),
        resolve=_sample_bwd_resolve,
        legacy=_sample_bwd_call,
        empty=lambda r: r[0] == 0,
        family=_FAMILY,
    )
)


# ----------------------------------------------------------------- the public functions


def affine_grid_forward(theta: Any, *, size: Sequence[int], out: Any = None, stream: Any = None) -> Any:
    """The sampling grid of a batch of 2-d affine transforms; returns ``grid`` (``out`` if given).

    ``theta``: ``(N, 2, 3)``, float16/float32/float64. ``size``: the output
    size ``(N, C, H, W)`` as for ``torch.nn.functional.affine_grid`` (``C`` is
    not used). ``grid``: ``(N, H, W, 2)``, ``theta``'s dtype, C-contiguous, with
    ``grid[n, i, j] = theta[n] @ (-1 + 2 j / (W - 1), -1 + 2 i / (H - 1), 1)``:
    ``torch.nn.functional.affine_grid(theta, size, align_corners=True)``.

    Calls ``cudnnSpatialTfGridGeneratorForward`` once (none when N is 0; primitive :data:`AFFINE_GRID_FORWARD`).

    Args:
        theta: ``(N, 2, 3)`` affine matrices, float16, float32 or float64 (cuDNN's spatial transformer refuses
            every other dtype, bfloat16 included).
        size: ``(N, C, H, W)``, the sampled output's size; ``H`` and ``W`` at least 2.
        out: an ``(N, H, W, 2)`` array of ``theta``'s dtype to write; None allocates ``grid``.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``grid`` ``(N, H, W, 2)``, ``theta``'s dtype.

    Example:
        >>> theta = cp.asarray([[[1, 0, 0], [0, 1, 0]]] * 8, dtype=cp.float32)   # identity transforms
        >>> grid = ops.affine_grid_forward(theta, size=(8, 3, 32, 32))
    """
    return run(AFFINE_GRID_FORWARD, {"theta": theta}, size=size, out=out, stream=stream)


def affine_grid_backward(dgrid: Any, *, size: Sequence[int], out: Any = None, stream: Any = None) -> Any:
    """Gradient of :func:`affine_grid_forward` with respect to ``theta``; returns ``dtheta``.

    ``dgrid``: ``(N, H, W, 2)`` matching ``size`` ``(N, C, H, W)``, the
    forward's. ``dtheta``: ``(N, 2, 3)``, ``dgrid``'s dtype,
    ``dtheta[n] = sum_ij dgrid[n, i, j]^T (x_j, y_i, 1)``. ``out`` is
    overwritten (cuDNN has no blend factors for this call).

    Calls ``cudnnSpatialTfGridGeneratorBackward`` once (none when N is 0; primitive
    :data:`AFFINE_GRID_BACKWARD`).

    Args:
        dgrid: the gradient of ``grid``, ``(N, H, W, 2)``; float16, float32 or float64.
        size: the forward's ``size``.
        out: an ``(N, 2, 3)`` array of ``dgrid``'s dtype to write; None allocates ``dtheta``.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dtheta`` ``(N, 2, 3)``, ``dgrid``'s dtype.

    Example:
        >>> dtheta = ops.affine_grid_backward(cp.ones_like(grid), size=(8, 3, 32, 32))
    """
    return run(AFFINE_GRID_BACKWARD, {"dgrid": dgrid}, size=size, out=out, stream=stream)


def grid_sample_forward(
    x: Any,
    grid: Any,
    *,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Bilinear sampling of ``x`` at ``grid``; returns ``y`` (``out`` if given).

    ``x``: ``(N, C, H_in, W_in)``, float16/float32/float64, any strides.
    ``grid``: ``(N, H_out, W_out, 2)``, ``x``'s dtype, normalized ``(gx, gy)``
    with -1 and +1 at the centres of the border pixels and zeros outside:
    ``torch.nn.functional.grid_sample(x, grid, mode="bilinear",
    padding_mode="zeros", align_corners=True)``. ``y``: ``(N, C, H_out, W_out)``,
    ``x``'s dtype; ``y = alpha * sample + beta * y``.

    Calls ``cudnnSpatialTfSamplerForward`` once (none when N is 0; primitive :data:`GRID_SAMPLE_FORWARD`).

    Args:
        x: ``(N, C, H_in, W_in)``; float16, float32 or float64.
        grid: ``(N, H_out, W_out, 2)`` of ``x``'s dtype, ``H_out`` and ``W_out`` at least 2.
        out: an ``(N, C, H_out, W_out)`` array to write; None allocates ``y``.
        alpha: scale of the samples.
        beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``y`` ``(N, C, H_out, W_out)``, ``x``'s dtype.

    Example:
        >>> grid = ops.affine_grid_forward(theta, size=x.shape)
        >>> y = ops.grid_sample_forward(x, grid)      # F.grid_sample(x, grid, align_corners=True)
    """
    return run(GRID_SAMPLE_FORWARD, {"x": x, "grid": grid}, out=out, alpha=alpha, beta=beta, stream=stream)


def grid_sample_backward(
    x: Any,
    grid: Any,
    dy: Any,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    alpha_dgrid: float = 1.0,
    beta_dgrid: float = 0.0,
    out: tuple[Any, Any] | None = None,
    stream: Any = None,
    dx_out: Any = None,
    dgrid_out: Any = None,
) -> tuple[Any, Any]:
    """Gradients of :func:`grid_sample_forward`: ``(dx, dgrid)`` from one call.

    ``x`` and ``grid`` are the forward's inputs; ``dy``: ``(N, C, H_out, W_out)``,
    any strides. ``out=(dx_out, dgrid_out)``: given outputs (either may be None; the
    per-output keywords ``dx_out=``/``dgrid_out=`` are its deprecated form, and
    errors name an output by them). ``dx``: ``x``'s shape, C-contiguous unless ``dx_out`` is given,
    ``dx = alpha * dL/dx + beta * dx``. ``dgrid``: ``grid``'s shape,
    C-contiguous, the gradient with respect to the normalized coordinates,
    ``dgrid = alpha_dgrid * dL/dgrid + beta_dgrid * dgrid``. All of ``x``'s dtype.

    Calls ``cudnnSpatialTfSamplerBackward`` once (none when N is 0; primitive :data:`GRID_SAMPLE_BACKWARD`). cuDNN
    9.19 refuses it above 1024 channels (NOT_SUPPORTED for 1100, measured on an H200): such ``x`` are refused by
    name. Its results differ bitwise between runs (cuDNN accumulates with atomics).

    Args:
        x: the forward's ``x``.
        grid: the forward's ``grid``.
        dy: the gradient of ``y``, ``(N, C, H_out, W_out)``.
        alpha: scale of ``dx``.
        beta: blend factor of ``dx_out``'s previous contents.
        alpha_dgrid: scale of ``dgrid``.
        beta_dgrid: blend factor of ``dgrid_out``'s previous contents.
        out: ``(dx_out, dgrid_out)``, each an array or None (allocate).
        stream: the stream to run on; None: the library's current stream.
        dx_out: deprecated form of ``out=(dx_out, None)``.
        dgrid_out: deprecated form of ``out=(None, dgrid_out)``.

    Returns:
        ``(dx, dgrid)``: ``x``'s and ``grid``'s shapes, ``x``'s dtype.

    Example:
        >>> dx, dgrid = ops.grid_sample_backward(x, grid, dy)
    """
    dx_out, dgrid_out = split_out("grid_sample_backward", out, {"dx_out": dx_out, "dgrid_out": dgrid_out})
    return run(
        GRID_SAMPLE_BACKWARD,
        {"x": x, "grid": grid, "dy": dy},
        alpha=alpha,
        beta=beta,
        alpha_dgrid=alpha_dgrid,
        beta_dgrid=beta_dgrid,
        dx_out=dx_out,
        dgrid_out=dgrid_out,
        stream=stream,
    )


# ----------------------------------------------------------------- the L3 declarations


def _meta_view(s: Spec, name: str, check: bool = True) -> SimpleNamespace:
    """A spec as the primitives' resolve functions read a view (shape, ndim, dtype), its dtype checked as the
    primitive's operand declares (``check``)."""
    if check:
        check_dtype(s, name, _FLOATS, _FAMILY)
    return SimpleNamespace(shape=tuple(s.shape), ndim=len(s.shape), dtype=s.dtype)


def _l3_sample_forward(x: Any, grid: Any) -> Any:
    y = grid_sample_forward(x, grid)
    return (y,), {"x": x, "grid": grid}


def _l3_sample_backward(res: Any, douts: Any, needs: Any) -> tuple:
    (dy,) = douts
    if dy is None or not any(needs):
        return (None, None)
    dx, dgrid = grid_sample_backward(res["x"], res["grid"], dy)
    return (dx if needs[0] else None, dgrid if needs[1] else None)


def _l3_sample_meta(x: Spec, grid: Spec) -> Any:
    shape = _sample_fwd_resolve({"x": _meta_view(x, "x"), "grid": _meta_view(grid, "grid", False)}, {})
    return (Spec(shape, contiguous_strides(shape), x.dtype),), {"x": x, "grid": grid}


GRID_SAMPLE = differentiable(
    Differentiable("grid_sample", "grid_sample_forward", ("x", "grid"), ("out",), _l3_sample_forward,
                   _l3_sample_backward, _l3_sample_meta, batch=("x", "grid", "out"),
                   capture_safe=True,  # one cudnnSpatialTfSamplerForward / Backward: device work only
                   doc="""bilinear sampling of x (N, C, H_in, W_in) at grid (N, H_out, W_out, 2) (x's dtype:
float16/float32/float64): torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
align_corners=True), the only configuration cuDNN has (no other keyword). y: (N, C, H_out, W_out), C-contiguous.
cudnnSpatialTfSamplerForward (grid_sample_forward); residuals x, grid; the backward is one
cudnnSpatialTfSamplerBackward (grid_sample_backward) giving dx (C-contiguous) and dgrid (at most 1024 channels).""")
)  # fmt: skip


# the backward is linear and reads no residual; theta is kept (a reference, no copy) so that the backward call has
# an array on the device: the torch layer finds the device of its gradients among the residuals
def _l3_grid_forward(theta: Any, *, size: Sequence[int]) -> Any:
    return (affine_grid_forward(theta, size=size),), {"theta": theta}


def _l3_grid_backward(res: Any, douts: Any, needs: Any, *, size: Sequence[int]) -> tuple:
    (dgrid,) = douts
    if dgrid is None or not needs[0]:
        return (None,)
    return (affine_grid_backward(dgrid, size=size),)


def _l3_grid_meta(theta: Spec, *, size: Sequence[int]) -> Any:
    n, h, w = _grid_fwd_resolve({"theta": _meta_view(theta, "theta")}, {"size": size})
    return (Spec((n, h, w, 2), contiguous_strides((n, h, w, 2)), theta.dtype),), {"theta": theta}


AFFINE_GRID = differentiable(
    Differentiable("affine_grid", "affine_grid_forward", ("theta",), ("out",), _l3_grid_forward, _l3_grid_backward,
                   _l3_grid_meta,
                   capture_safe=True,  # one cudnnSpatialTfGridGeneratorForward / Backward: device work only
                   doc="""the sampling grid (N, H, W, 2) (C-contiguous, theta's dtype) of theta (N, 2, 3)
(float16/float32/float64) for size (N, C, H, W) (C unused; H, W >= 2): torch.nn.functional.affine_grid(theta, size,
align_corners=True). cudnnSpatialTfGridGeneratorForward (affine_grid_forward); the backward is linear (residual theta
only for its device): dtheta from one cudnnSpatialTfGridGeneratorBackward (affine_grid_backward).""")
)  # fmt: skip
