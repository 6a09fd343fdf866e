"""Local response normalization (cross-channel) and divisive normalization, forward and backward.

LRN (``cudnnLRNCrossChannelForward``/``Backward``, ``CUDNN_LRN_CROSS_CHANNEL_DIM1``)::

    y[n, c, ...] = x[n, c, ...] / (k + alpha / size * sum_{c'} x[n, c', ...]^2) ** beta

where ``c'`` runs over the ``size`` channels ``c - (size - 1) // 2 ... c + size // 2``
that exist (zero padding at the edges), as cuDNN documents for ``lrnN``. For an
odd ``size`` this is torch's ``LocalResponseNorm(size, alpha, beta, k)``; for
an even ``size`` the window is one channel off: cuDNN looks one channel further
ahead than behind, torch one further behind than ahead.

Divisive normalization (``cudnnDivisiveNormalizationForward``/``Backward``,
``CUDNN_DIVNORM_PRECOMPUTED_MEANS``) is cuDNN's spatial contrast
normalization with the same four parameters, over a ``size`` x ``size``
window in H and W of the same channel (offsets as LRN's, zero padding)::

    y[n, c, h, w] = x[n, c, h, w] / (k + alpha / size**2 * sum_{h', w'} x[n, c, h', w']^2) ** beta

This formula is not in cuDNN's documentation; it was identified on an H200
(cuDNN 9.19) and matches to 1e-16, and the GPU tests hold cuDNN to it. With
``means`` given, cuDNN's use of them is not documented and does not match
``x - means`` in either place; cudnnkit passes them through, and the tests
check that ``dx`` and ``dmeans`` are the derivatives of the forward. For an
even ``size``, cuDNN 9.19's backward sums over the forward's window rather
than its mirror image, so its ``dx`` is not the exact gradient there (odd
sizes are exact); prefer odd sizes when training. The two
temporary buffers cuDNN needs are allocated here, with the input's library.

Parameters are checked against cuDNN's limits before any call:
``1 <= size <= 16`` (``CUDNN_LRN_MIN_N``/``MAX_N``), ``k >= 1e-5``,
``beta >= 0.01``. Tensors are 3-d to 8-d (N, C, spatial...), any strides;
float16, float32, float64 (cuDNN refuses bfloat16 here). The output
blend is ``out = y_alpha * result + y_beta * out``.
"""

from __future__ import annotations

from typing import Any

from .. import lib
from ..runtime import DescriptorKind, check_dtype, get_cached, prepare, scaling_ref, tensor_descriptor_of
from ..runtime.arrays import ArrayView, contiguous_strides, is_dense, like_strides

__all__ = ["lrn_forward", "lrn_backward", "divisive_normalization_forward", "divisive_normalization_backward"]

# cuDNN 9.19 returns NOT_SUPPORTED for bfloat16 LRN and divisive normalization (measured on an H200)
_DTYPES = ("float16", "float32", "float64")


def _set_lrn(ptr: int, n: int, alpha: float, beta: float, k: float) -> None:
    lib.cudnnSetLRNDescriptor(ptr, n, alpha, beta, k)


_LRN = DescriptorKind("lrn", "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor", _set_lrn)


def _lrn_desc(size: int, alpha: float, beta: float, k: float) -> Any:
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {size!r}")
    if not lib.CUDNN_LRN_MIN_N <= size <= lib.CUDNN_LRN_MAX_N:
        raise ValueError(f"size must be in [{lib.CUDNN_LRN_MIN_N}, {lib.CUDNN_LRN_MAX_N}] (cuDNN's limit), got {size}")
    if not k >= lib.CUDNN_LRN_MIN_K:
        raise ValueError(f"k must be >= {lib.CUDNN_LRN_MIN_K} (cuDNN's limit), got {k}")
    if not beta >= lib.CUDNN_LRN_MIN_BETA:
        raise ValueError(f"beta must be >= {lib.CUDNN_LRN_MIN_BETA} (cuDNN's limit), got {beta}")
    return get_cached(_LRN, (size, float(alpha), float(beta), float(k)))


def _check(views: list[tuple[str, ArrayView]]) -> ArrayView:
    name0, v0 = views[0]
    check_dtype(v0, name0, _DTYPES, "normalization")
    if not 3 <= v0.ndim <= 8:
        raise ValueError(f"{name0} must have 3 to 8 dims (N, C, spatial...), got shape {v0.shape}")
    for name, v in views[1:]:
        if v.shape != v0.shape:
            raise ValueError(f"{name} has shape {v.shape} but {name0} has shape {v0.shape}")
        if v.dtype != v0.dtype:
            raise TypeError(f"{name} has dtype {v.dtype} but {name0} has dtype {v0.dtype}")
    return v0


def lrn_forward(
    x: Any,
    *,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    y_alpha: float = 1.0,
    y_beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Cross-channel LRN of ``x`` ``(N, C, ...)``; returns ``y`` of the same shape and dtype.

    ``cudnnLRNCrossChannelForward``. The backward needs ``x`` and this ``y``.
    """
    desc = _lrn_desc(size, alpha, beta, k)
    launch, (vx,) = prepare(("x", x), stream=stream)
    _check([("x", vx)])
    y, vy = launch.output(out, vx.shape, vx.dtype, strides=like_strides(vx), beta=y_beta)
    if vx.size:
        with launch.on_device():
            lib.cudnnLRNCrossChannelForward(
                launch.handle,
                desc,
                lib.CUDNN_LRN_CROSS_CHANNEL_DIM1,
                scaling_ref(vx.dtype, y_alpha),
                tensor_descriptor_of(vx),
                vx.ptr,
                scaling_ref(vx.dtype, y_beta),
                tensor_descriptor_of(vy),
                vy.ptr,
            )
    return y


def lrn_backward(
    dy: Any,
    y: Any,
    x: Any,
    *,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    dx_alpha: float = 1.0,
    dx_beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Gradient of :func:`lrn_forward`: ``dx`` from ``dy``, the forward's ``y`` and its input ``x``.

    ``cudnnLRNCrossChannelBackward``; the LRN parameters must be the forward's.
    """
    desc = _lrn_desc(size, alpha, beta, k)
    launch, (vdy, vy, vx) = prepare(("dy", dy), ("y", y), ("x", x), stream=stream)
    _check([("dy", vdy), ("y", vy), ("x", vx)])
    dx, vdx = launch.output(out, vx.shape, vx.dtype, strides=like_strides(vx), beta=dx_beta)
    if vx.size:
        with launch.on_device():
            lib.cudnnLRNCrossChannelBackward(
                launch.handle,
                desc,
                lib.CUDNN_LRN_CROSS_CHANNEL_DIM1,
                scaling_ref(vx.dtype, dx_alpha),
                tensor_descriptor_of(vy),
                vy.ptr,
                tensor_descriptor_of(vdy),
                vdy.ptr,
                tensor_descriptor_of(vx),
                vx.ptr,
                scaling_ref(vx.dtype, dx_beta),
                tensor_descriptor_of(vdx),
                vdx.ptr,
            )
    return dx


def _temps(launch, v: ArrayView) -> tuple[Any, ArrayView, Any, ArrayView]:
    """The two scratch buffers divisive normalization needs, laid out exactly like ``v`` (which is dense)."""
    t1, v1 = launch.empty(v.shape, v.dtype, v.strides, name="temp")
    t2, v2 = launch.empty(v.shape, v.dtype, v.strides, name="temp2")
    return t1, v1, t2, v2


def _target_strides(views: list[ArrayView | None]) -> tuple[int, ...]:
    """The one layout cuDNN's divisive normalization will see: the first view's if it is dense and the
    others share it, else C order (the inputs are then copied)."""
    first = views[0]
    assert first is not None
    if is_dense(first.shape, first.strides) and all(v is None or v.strides == first.strides for v in views):
        return first.strides
    return contiguous_strides(first.shape)


def _in_layout(launch, arrays: list[tuple[str, Any, ArrayView | None]], strides: tuple[int, ...]):
    """Each array as is when it already has ``strides``, else a C-order copy (logged)."""
    out = []
    for name, a, v in arrays:
        if v is None or v.strides == strides:
            out.append((a, v))
            continue
        out.append(launch.contiguous(a, v, name, f"must be laid out as {strides} for cuDNN"))
    return out


def _check_out_layout(v: ArrayView | None, name: str, strides: tuple[int, ...]) -> None:
    if v is not None and v.strides != strides:
        raise ValueError(
            f"{name} must be laid out like the inputs as cuDNN sees them (strides {strides}), "
            f"got {v.strides}: cuDNN's divisive normalization takes one layout for all its tensors"
        )


def divisive_normalization_forward(
    x: Any,
    means: Any = None,
    *,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    y_alpha: float = 1.0,
    y_beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Spatial divisive normalization of ``x`` ``(N, C, H, W)`` (with precomputed ``means``, same shape, if given).

    ``cudnnDivisiveNormalizationForward`` with ``CUDNN_DIVNORM_PRECOMPUTED_MEANS``;
    ``means=None`` passes NULL. cuDNN describes ``x``, ``means`` and its two
    scratch buffers with one descriptor, so ``x`` and ``means`` are copied to C
    order when ``x`` has gaps or the two differ in layout; ``y`` must have that
    same layout too (cuDNN 9.19 returns NOT_SUPPORTED otherwise), so a given
    ``out`` is checked against it.
    """
    desc = _lrn_desc(size, alpha, beta, k)
    launch, (vx, vm) = prepare(("x", x), ("means", means), stream=stream)
    _check([("x", vx)] + ([("means", vm)] if vm is not None else []))
    strides = _target_strides([vx, vm])
    y, vy = launch.output(out, vx.shape, vx.dtype, strides=strides, beta=y_beta)
    _check_out_layout(vy, "out", strides)
    if vx.size:
        (x, vx), (means, vm) = _in_layout(launch, [("x", x, vx), ("means", means, vm)], strides)
        t1, v1, t2, v2 = _temps(launch, vx)
        with launch.on_device():
            lib.cudnnDivisiveNormalizationForward(
                launch.handle,
                desc,
                lib.CUDNN_DIVNORM_PRECOMPUTED_MEANS,
                scaling_ref(vx.dtype, y_alpha),
                tensor_descriptor_of(vx),
                vx.ptr,
                vm.ptr if vm is not None else None,
                v1.ptr,
                v2.ptr,
                scaling_ref(vx.dtype, y_beta),
                tensor_descriptor_of(vy),
                vy.ptr,
            )
    return y


def divisive_normalization_backward(
    dy: Any,
    x: Any,
    means: Any = None,
    *,
    size: int = 5,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 2.0,
    dx_out: Any = None,
    dmeans_out: Any = None,
    dx_alpha: float = 1.0,
    dx_beta: float = 0.0,
    stream: Any = None,
) -> tuple[Any, Any]:
    """Gradients of :func:`divisive_normalization_forward`: ``(dx, dmeans)`` from one call.

    ``cudnnDivisiveNormalizationBackward``. ``dmeans`` is ``None`` when ``means``
    was not given (cuDNN is passed NULL and computes only ``dx``). ``x``,
    ``means`` and ``dy`` share one descriptor in cuDNN (copied to C order when
    they differ or have gaps), and ``dx``/``dmeans`` must have that layout too.
    """
    desc = _lrn_desc(size, alpha, beta, k)
    launch, (vdy, vx, vm) = prepare(("dy", dy), ("x", x), ("means", means), stream=stream)
    _check([("dy", vdy), ("x", vx)] + ([("means", vm)] if vm is not None else []))
    if vm is None and dmeans_out is not None:
        raise ValueError("dmeans_out needs means: without means there is no dmeans")
    strides = _target_strides([vx, vdy, vm])
    dx, vdx = launch.output(dx_out, vx.shape, vx.dtype, strides=strides, name="dx_out", beta=dx_beta)
    _check_out_layout(vdx, "dx_out", strides)
    dm, vdm = (None, None)
    if vm is not None:
        dm, vdm = launch.output(dmeans_out, vx.shape, vx.dtype, strides=strides, name="dmeans_out", beta=dx_beta)
        _check_out_layout(vdm, "dmeans_out", strides)
    if vx.size:
        (x, vx), (dy, vdy), (means, vm) = _in_layout(
            launch, [("x", x, vx), ("dy", dy, vdy), ("means", means, vm)], strides
        )
        t1, v1, t2, v2 = _temps(launch, vx)
        with launch.on_device():
            lib.cudnnDivisiveNormalizationBackward(
                launch.handle,
                desc,
                lib.CUDNN_DIVNORM_PRECOMPUTED_MEANS,
                scaling_ref(vx.dtype, dx_alpha),
                tensor_descriptor_of(vx),
                vx.ptr,
                vm.ptr if vm is not None else None,
                vdy.ptr,
                v1.ptr,
                v2.ptr,
                scaling_ref(vx.dtype, dx_beta),
                tensor_descriptor_of(vdx),
                vdx.ptr,
                vdm.ptr if vdm is not None else None,
            )
    return dx, dm
