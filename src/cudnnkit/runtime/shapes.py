"""Host-side output-shape inference for convolution and pooling (N-d, groups, dilation).

These are pure Python and agree with cuDNN's own
``cudnnGetConvolutionNdForwardOutputDim`` and ``cudnnGetPoolingNdForwardOutputDim``
(the CPU test tier checks that over a generated range of parameters). Invalid
parameters raise ``ValueError`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import lib
from .arrays import contiguous_strides
from .descriptors import int_array, owned_descriptor

__all__ = ["expand", "conv_output_shape", "pool_output_shape", "conv_transpose_output_shape"]


def expand(
    value: int | Sequence[int], n: int, name: str, minimum: int = 0, maximum: int | None = None
) -> tuple[int, ...]:
    """An int or a length-``n`` sequence as an ``n``-tuple of ints >= ``minimum`` (and <= ``maximum``)."""
    if isinstance(value, (bool, str, bytes)):
        raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {value!r}")
    if isinstance(value, int):
        out = (value,) * n
    else:
        try:
            out = tuple(value)
        except TypeError:
            raise TypeError(f"{name} must be an int or a sequence of {n} ints, got {value!r}") from None
        if len(out) != n:
            raise ValueError(f"{name} must have {n} values (one per spatial dim), got {len(out)}: {value!r}")
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must hold ints, got {v!r}")
        if v < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
        if maximum is not None and v > maximum:
            raise ValueError(f"{name} must be at most {maximum}, got {value!r}")
    return out


_PADDING_WORDS = ("valid", "same")


def _padding(
    padding: int | Sequence[int] | str, nsp: int, s: tuple[int, ...], k: tuple[int, ...], what: str, note: str = ""
) -> tuple[int, ...]:
    """``padding`` per spatial dim: ints as :func:`expand` takes them, or torch's ``"valid"`` (no padding) or
    ``"same"`` (output size = input size: needs stride 1, and pads ``(k - 1) // 2`` on each side, where ``k`` is
    the dilated kernel/window size; cuDNN pads both sides alike, so an even ``k`` cannot be expressed)."""
    if not isinstance(padding, str):
        return expand(padding, nsp, "padding", 0)
    if padding == "valid":
        return (0,) * nsp
    if padding != "same":
        raise ValueError(f"padding must be an int, a sequence of {nsp} ints, 'valid' or 'same', got {padding!r}")
    if any(v != 1 for v in s):
        raise ValueError(f"padding='same' needs stride 1 (as in torch), got stride {s}{note}")
    for i, ki in enumerate(k):
        if (ki - 1) % 2:
            raise ValueError(
                f"padding='same' with {what} {ki} in spatial dim {i} needs {ki - 1} padding in all, which cuDNN's "
                "symmetric padding cannot split evenly: pad explicitly (or pre-pad the input)"
            )
    return tuple((ki - 1) // 2 for ki in k)


def _check_groups(groups: int) -> None:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")


def conv_output_shape(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> tuple[int, ...]:
    """Output shape ``(N, K, *spatial)`` of a cross-correlation/convolution.

    ``x_shape`` is ``(N, C, *spatial)`` and ``w_shape`` is ``(K, C // groups, *kernel)``,
    both in logical NCHW order whatever the memory layout. Per spatial dim:
    ``out = (in + 2*pad - dilation*(k - 1) - 1) // stride + 1``, which must be >= 1.
    ``padding`` is per-side and symmetric, or torch's ``"valid"`` (0) or ``"same"``
    (stride 1 only; ``dilation*(k - 1)`` must be even, as cuDNN pads both sides alike).
    """
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) < 3:
        raise ValueError(f"x must have at least 3 dims (N, C, spatial...), got shape {x_shape}")
    if len(w_shape) != len(x_shape):
        raise ValueError(f"w must have as many dims as x ({len(x_shape)}), got shape {w_shape}")
    nsp = len(x_shape) - 2
    _check_groups(groups)
    s = expand(stride, nsp, "stride", 1)
    d = expand(dilation, nsp, "dilation", 1)
    n, c = x_shape[:2]
    k, cg = w_shape[:2]
    if any(v <= 0 for v in x_shape):
        raise ValueError(f"x dims must be positive, got {x_shape}")
    if any(v <= 0 for v in w_shape):
        raise ValueError(f"w dims must be positive, got {w_shape}")
    p = _padding(padding, nsp, s, tuple(di * (ki - 1) + 1 for di, ki in zip(d, w_shape[2:])), "dilated kernel")
    if c != cg * groups:
        raise ValueError(f"x has {c} channels but w expects {cg} per group x {groups} groups = {cg * groups}")
    if k % groups:
        raise ValueError(f"w's output channels ({k}) must be divisible by groups ({groups})")
    out = [n, k]
    for i, (xi, ki) in enumerate(zip(x_shape[2:], w_shape[2:])):
        eff = d[i] * (ki - 1) + 1
        o = (xi + 2 * p[i] - eff) // s[i] + 1
        if o < 1:
            raise ValueError(
                f"spatial dim {i}: input {xi} with padding {p[i]} is smaller than the dilated kernel {eff}"
            )
        out.append(o)
    return tuple(out)


def conv_transpose_output_shape(
    dy_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    output_padding: int | Sequence[int] = 0,
    groups: int = 1,
) -> tuple[int, ...]:
    """Input shape ``(N, C, *spatial)`` recovered by backward-data from ``dy`` ``(N, K, *)``.

    ``in = (out - 1)*stride - 2*pad + dilation*(k - 1) + 1 + output_padding``, with
    ``0 <= output_padding < max(stride, dilation)``.
    """
    dy_shape, w_shape = tuple(dy_shape), tuple(w_shape)
    if len(dy_shape) < 3 or len(w_shape) != len(dy_shape):
        raise ValueError(f"dy {dy_shape} and w {w_shape} must have the same number (>= 3) of dims")
    nsp = len(dy_shape) - 2
    s = expand(stride, nsp, "stride", 1)
    p = expand(padding, nsp, "padding", 0)
    d = expand(dilation, nsp, "dilation", 1)
    op = expand(output_padding, nsp, "output_padding", 0)
    _check_groups(groups)
    if dy_shape[1] != w_shape[0]:
        raise ValueError(f"dy has {dy_shape[1]} channels but w has {w_shape[0]} output channels")
    out = [dy_shape[0], w_shape[1] * groups]
    for i in range(nsp):
        if op[i] >= max(s[i], d[i]):
            raise ValueError(f"output_padding {op[i]} must be smaller than stride or dilation in dim {i}")
        v = (dy_shape[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (w_shape[2 + i] - 1) + 1 + op[i]
        if v < 1:
            raise ValueError(f"spatial dim {i}: recovered input size {v} is not positive")
        out.append(v)
    return tuple(out)


def pool_output_shape(
    x_shape: Sequence[int],
    window: int | Sequence[int],
    *,
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | str = 0,
) -> tuple[int, ...]:
    """Output shape ``(N, C, *spatial)`` of pooling (cuDNN rounds down).

    ``stride`` defaults to ``window``. Per spatial dim:
    ``out = (in + 2*pad - window) // stride + 1``, which must be >= 1; padding
    must be smaller than the window. ``padding`` may also be ``"valid"`` (0) or
    ``"same"`` (stride 1, an odd window: ``(window - 1) // 2`` per side), as for
    :func:`conv_output_shape`.
    """
    x_shape = tuple(x_shape)
    if len(x_shape) < 3:
        raise ValueError(f"x must have at least 3 dims (N, C, spatial...), got shape {x_shape}")
    if any(v <= 0 for v in x_shape):
        raise ValueError(f"x dims must be positive, got {x_shape}")
    nsp = len(x_shape) - 2
    w = expand(window, nsp, "window", 1)
    s = expand(w if stride is None else stride, nsp, "stride", 1)
    p = _padding(padding, nsp, s, w, "window", " (the default: the window)" if stride is None else "")
    out = list(x_shape[:2])
    for i in range(nsp):
        if p[i] >= w[i]:
            raise ValueError(f"padding {p[i]} must be smaller than the window {w[i]} (dim {i})")
        o = (x_shape[2 + i] + 2 * p[i] - w[i]) // s[i] + 1
        if o < 1:
            raise ValueError(f"spatial dim {i}: input {x_shape[2 + i]} + 2*padding is smaller than the window {w[i]}")
        out.append(o)
    return tuple(out)


# ----------------------------------------------------------------- cuDNN's own answers
# These call cuDNN (host-side only, no GPU needed) and serve as the reference the
# pure-Python functions above are tested against. They raise cuDNN's error for
# parameters cuDNN rejects.


def cudnn_conv_output_shape(x_shape, w_shape, *, stride=1, padding=0, dilation=1, groups=1) -> tuple[int, ...]:
    """``cudnnGetConvolutionNdForwardOutputDim`` for float32 NCHW tensors (legacy, host-only)."""
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    nsp = len(x_shape) - 2
    s, p, d = (expand(v, nsp, n) for v, n in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    x = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
    lib.cudnnSetTensorNdDescriptor(
        x, lib.CUDNN_DATA_FLOAT, len(x_shape), int_array(x_shape), int_array(contiguous_strides(x_shape))
    )
    w = owned_descriptor("cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor")
    lib.cudnnSetFilterNdDescriptor(w, lib.CUDNN_DATA_FLOAT, lib.CUDNN_TENSOR_NCHW, len(w_shape), int_array(w_shape))
    c = owned_descriptor("cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor")
    lib.cudnnSetConvolutionNdDescriptor(
        c, nsp, int_array(p), int_array(s), int_array(d), lib.CUDNN_CROSS_CORRELATION, lib.CUDNN_DATA_FLOAT
    )
    lib.cudnnSetConvolutionGroupCount(c, groups)
    out = int_array([0] * len(x_shape))
    lib.cudnnGetConvolutionNdForwardOutputDim(c, x, w, len(x_shape), out)
    return tuple(out)


def cudnn_pool_output_shape(x_shape, window, *, stride=None, padding=0) -> tuple[int, ...]:
    """``cudnnGetPoolingNdForwardOutputDim`` (max pooling descriptor; legacy, host-only)."""
    x_shape = tuple(x_shape)
    nsp = len(x_shape) - 2
    w = expand(window, nsp, "window")
    s = expand(w if stride is None else stride, nsp, "stride")
    p = expand(padding, nsp, "padding")
    x = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
    lib.cudnnSetTensorNdDescriptor(
        x, lib.CUDNN_DATA_FLOAT, len(x_shape), int_array(x_shape), int_array(contiguous_strides(x_shape))
    )
    pd = owned_descriptor("cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor")
    lib.cudnnSetPoolingNdDescriptor(
        pd, lib.CUDNN_POOLING_MAX, lib.CUDNN_NOT_PROPAGATE_NAN, nsp, int_array(w), int_array(p), int_array(s)
    )
    out = int_array([0] * len(x_shape))
    lib.cudnnGetPoolingNdForwardOutputDim(pd, x, len(x_shape), out)
    return tuple(out)
