"""Host-side output-shape inference for convolution and pooling (N-d, groups, dilation): the only one in cudnnkit.

:func:`conv_output_sizes` and :func:`pool_output_sizes` hold the arithmetic, per spatial dim with separate
pre- and post-padding (the graph API's asymmetric padding); :func:`conv_output_shape`,
:func:`pool_output_shape` and :func:`conv_transpose_output_shape` check whole shapes with torch-style symmetric
padding for the legacy ops, and the graph builder checks its own arguments before calling the sizes functions.

These are pure Python and agree with cuDNN's own
``cudnnGetConvolutionNdForwardOutputDim`` and ``cudnnGetPoolingNdForwardOutputDim``
(the CPU test tier checks that over a generated range of parameters, against the oracles in
``tests/oracles.py``). Invalid parameters raise ``ValueError`` naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "expand",
    "conv_output_sizes",
    "pool_output_sizes",
    "conv_output_shape",
    "pool_output_shape",
    "conv_transpose_output_shape",
]


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


def conv_output_sizes(
    sizes: Sequence[int],
    kernel: Sequence[int],
    *,
    stride: Sequence[int],
    pre_padding: Sequence[int],
    post_padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[int, ...]:
    """Spatial output sizes of a convolution, one per spatial dim of ``sizes`` (the input's):
    ``out = (in + pre_padding + post_padding - dilation*(k - 1) - 1) // stride + 1``.

    The arguments are sequences of ints, one per spatial dim, already checked (see :func:`expand`). A size
    below 1 (a padded input smaller than the dilated kernel) is returned as is: the caller says which dim
    and argument are wrong, in its own terms."""
    return tuple(
        (i + pre + post - (d * (k - 1) + 1)) // s + 1
        for i, k, s, pre, post, d in zip(sizes, kernel, stride, pre_padding, post_padding, dilation)
    )


def pool_output_sizes(
    sizes: Sequence[int],
    window: Sequence[int],
    *,
    stride: Sequence[int],
    pre_padding: Sequence[int],
    post_padding: Sequence[int],
) -> tuple[int, ...]:
    """Spatial output sizes of pooling (cuDNN rounds down): :func:`conv_output_sizes` with the window as the
    kernel and no dilation, ``out = (in + pre_padding + post_padding - window) // stride + 1`` (below 1 returned
    as is)."""
    return conv_output_sizes(
        sizes, window, stride=stride, pre_padding=pre_padding, post_padding=post_padding, dilation=(1,) * len(sizes)
    )


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
    sizes = conv_output_sizes(x_shape[2:], w_shape[2:], stride=s, pre_padding=p, post_padding=p, dilation=d)
    for i, (xi, ki, o) in enumerate(zip(x_shape[2:], w_shape[2:], sizes)):
        if o < 1:
            eff = d[i] * (ki - 1) + 1
            raise ValueError(
                f"spatial dim {i}: input {xi} with padding {p[i]} is smaller than the dilated kernel {eff}"
            )
    return (n, k, *sizes)


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
    sizes = pool_output_sizes(x_shape[2:], w, stride=s, pre_padding=p, post_padding=p)
    for i in range(nsp):
        if p[i] >= w[i]:
            raise ValueError(f"padding {p[i]} must be smaller than the window {w[i]} (dim {i})")
        if sizes[i] < 1:
            raise ValueError(f"spatial dim {i}: input {x_shape[2 + i]} + 2*padding is smaller than the window {w[i]}")
    return (*x_shape[:2], *sizes)
