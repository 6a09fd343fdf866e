"""Rows for raw cuDNN tensor calls through cudnnkit's runtime: ``cudnnSetTensor`` and ``cudnnScaleTensor``.

Each ``ours`` callable does what a user pays per call: ``prepare`` (array
view, this thread's handle with torch's current stream set), the cached
tensor-descriptor lookup, the host scaling value and the cuDNN call. Inputs
are created once, outside the callables, from ``torch.randn``.

``cudnnScaleTensor`` and ``t.mul_(0.5)`` scale the same tensor in place on
every call, so its values shrink towards zero over a run; elementwise
throughput on NVIDIA GPUs does not depend on the values.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

from .harness import Row, register

FAMILY = "tensor"
LARGE = (64, 256, 56, 56)
TINY = (1, 1, 1, 8)


def _shape_str(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _set_tensor(t: Any, value: float) -> Callable[[], None]:
    """``cudnnSetTensor(t, value)`` with the per-call runtime work inside the callable."""
    from cudnnkit import lib
    from cudnnkit.runtime import prepare, scaling, tensor_descriptor

    def ours() -> None:
        launch, (v,) = prepare(("y", t))
        desc = tensor_descriptor(v.dtype, v.shape, v.strides)
        lib.cudnnSetTensor(launch.handle, desc, v.ptr, ctypes.byref(scaling(v.dtype, value)))

    return ours


def _scale_tensor(t: Any, alpha: float) -> Callable[[], None]:
    """``cudnnScaleTensor(t, alpha)`` with the per-call runtime work inside the callable."""
    from cudnnkit import lib
    from cudnnkit.runtime import prepare, scaling, tensor_descriptor

    def ours() -> None:
        launch, (v,) = prepare(("y", t))
        desc = tensor_descriptor(v.dtype, v.shape, v.strides)
        lib.cudnnScaleTensor(launch.handle, desc, v.ptr, ctypes.byref(scaling(v.dtype, alpha)))

    return ours


@register
def tensor_rows() -> list[Row]:
    """Set and scale a 64x256x56x56 tensor in float32 and float16, plus a tiny host-overhead row."""
    import torch

    rows: list[Row] = []
    for dtype in (torch.float32, torch.float16):
        dname = str(dtype).removeprefix("torch.")
        nbytes = math.prod(LARGE) * torch.tensor([], dtype=dtype).element_size()

        t_set = torch.randn(LARGE, device="cuda", dtype=dtype)
        rows.append(
            Row(
                FAMILY,
                "set tensor",
                _shape_str(LARGE),
                dname,
                ours=_set_tensor(t_set, 1.5),
                torch=lambda t=t_set: t.fill_(1.5),
                bytes=nbytes,  # written once
            )
        )

        t_scale = torch.randn(LARGE, device="cuda", dtype=dtype)
        rows.append(
            Row(
                FAMILY,
                "scale tensor",
                _shape_str(LARGE),
                dname,
                ours=_scale_tensor(t_scale, 0.5),
                torch=lambda t=t_scale: t.mul_(0.5),
                bytes=2 * nbytes,  # read and written
                notes="cudnnScaleTensor is deprecated in cuDNN 9 but still exported",
            )
        )

    t_tiny = torch.randn(TINY, device="cuda", dtype=torch.float32)
    rows.append(
        Row(
            FAMILY,
            "set tensor (host overhead)",
            _shape_str(TINY),
            "float32",
            ours=_set_tensor(t_tiny, 1.5),
            torch=lambda t=t_tiny: t.fill_(1.5),
            notes="tiny shape: launch-bound, so times and host µs show per-call overhead",
        )
    )
    return rows
