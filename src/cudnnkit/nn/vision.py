"""The spatial transformer with torch.nn.functional's names and semantics: ``affine_grid`` and ``grid_sample``
(cuDNN's: 2-d, bilinear, zero padding, ``align_corners=True``)."""

from __future__ import annotations

from typing import Any

from ._common import as_int, call1, check_dtype

__all__ = ["affine_grid", "grid_sample"]

_DTYPES = ("float16", "float32", "float64")  # cudnnSetSpatialTransformerNdDescriptor's


def _align(align_corners: Any, fn: str) -> None:
    if align_corners is not True:  # torch's None is False
        raise NotImplementedError(f"{fn}: align_corners={align_corners!r}: cuDNN's spatial transformer puts -1 and +1 "
                                  "at the border pixels' centres, torch's align_corners=True only")  # fmt: skip


def affine_grid(theta: Any, size: Any, align_corners: bool | None = None) -> Any:
    """torch's ``affine_grid`` (2-d, aligned corners): L3 ``affine_grid``, cudnnSpatialTfGridGeneratorForward."""
    _align(align_corners, "affine_grid")
    size = tuple(as_int(v, "size") for v in size)
    if len(size) != 4:
        raise NotImplementedError(f"affine_grid: size={size}: cuDNN's spatial transformer is 2-d, size (N, C, H, W)")
    if size[2] < 2 or size[3] < 2:
        raise NotImplementedError(f"affine_grid: size={size}: cuDNN's grid needs H >= 2 and W >= 2 (torch puts a "
                                  "single row or column at 0, cuDNN does not)")  # fmt: skip
    if tuple(theta.shape) != (size[0], 2, 3):
        raise ValueError(f"affine_grid: theta must be (N, 2, 3) = {(size[0], 2, 3)} for size {size}, got "
                         f"{tuple(theta.shape)}")  # fmt: skip
    check_dtype(theta, _DTYPES, "theta", "cuDNN's spatial transformer")
    return call1("affine_grid", theta, size=size)


def grid_sample(input: Any, grid: Any, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: bool | None = None) -> Any:  # fmt: skip
    """torch's ``grid_sample`` (bilinear, zeros, aligned corners): L3 ``grid_sample``, cudnnSpatialTfSamplerForward."""
    if mode != "bilinear":
        raise NotImplementedError(f"grid_sample: mode={mode!r}: cuDNN's sampler is bilinear only")
    if padding_mode != "zeros":
        raise NotImplementedError(f"grid_sample: padding_mode={padding_mode!r}: cuDNN's sampler pads with zeros only")
    _align(align_corners, "grid_sample")
    if input.ndim != 4:
        raise NotImplementedError(f"grid_sample: input of shape {tuple(input.shape)}: cuDNN's sampler is 2-d "
                                  "(N, C, H, W) only")  # fmt: skip
    check_dtype(input, _DTYPES, "input", "cuDNN's spatial transformer")
    return call1("grid_sample", input, grid)
