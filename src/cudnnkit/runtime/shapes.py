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
    "INT32_MAX",
    "expand",
    "resolve_padding",
    "pool_padding",
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


#: the largest value cuDNN's int32 descriptor fields take
INT32_MAX = 2**31 - 1

_PADDING_WORDS = ("valid", "same")
_PADDING_FORMS = "an int, a sequence of {n} ints, a sequence of {n} (before, after) pairs, 'valid' or 'same'"


def resolve_padding(
    padding: int | Sequence[int] | Sequence[Sequence[int]] | str,
    nsp: int,
    stride: tuple[int, ...],
    extent: tuple[int, ...],
    what: str = "dilated kernel",
    note: str = "",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(pre, post)``: the padding before and after each of ``nsp`` spatial dims.

    ``padding`` is an int (every side), a sequence of ``nsp`` ints (both sides of each dim), a sequence of ``nsp``
    ``(before, after)`` pairs (asymmetric), torch's ``"valid"`` (none) or ``"same"`` (the output keeps the input's
    size: stride 1 only, and a total of ``extent - 1`` per dim, where ``extent`` is the dilated kernel or window,
    split as torch splits it: ``before = total // 2``, ``after = total - before``, so an even extent pads one more
    after). Every value must be a non-negative int; errors name ``padding``."""
    if isinstance(padding, str):
        if padding == "valid":
            zero = (0,) * nsp
            return zero, zero
        if padding != "same":
            raise ValueError(f"padding must be {_PADDING_FORMS.format(n=nsp)}, got {padding!r}")
        if any(v != 1 for v in stride):
            raise ValueError(f"padding='same' needs stride 1 (as in torch), got stride {stride}{note}")
        pre = tuple((e - 1) // 2 for e in extent)
        return pre, tuple(e - 1 - p for e, p in zip(extent, pre))
    if not isinstance(padding, (int, bool)) and not isinstance(padding, (bytes,)):
        try:
            items = tuple(padding)
        except TypeError:
            items = None
        if items is not None and items and all(isinstance(v, (tuple, list)) for v in items):
            if len(items) != nsp:
                raise ValueError(
                    f"padding must have {nsp} (before, after) pairs (one per spatial dim), got {len(items)}: "
                    f"{padding!r}"
                )
            for v in items:
                if len(v) != 2:
                    raise ValueError(f"padding pairs must be (before, after), got {v!r} in {padding!r}")
            pre = expand(tuple(v[0] for v in items), nsp, "padding", 0, INT32_MAX)
            post = expand(tuple(v[1] for v in items), nsp, "padding", 0, INT32_MAX)
            return pre, post
    try:
        sym = expand(padding, nsp, "padding", 0, INT32_MAX)
    except TypeError:
        raise TypeError(f"padding must be {_PADDING_FORMS.format(n=nsp)}, got {padding!r}") from None
    return sym, sym


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


def _pad_text(pre: int, post: int) -> str:
    return str(pre) if pre == post else f"({pre}, {post})"


def conv_output_shape(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | Sequence[Sequence[int]] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
) -> tuple[int, ...]:
    """Output shape ``(N, K, *spatial)`` of a cross-correlation/convolution.

    ``x_shape`` is ``(N, C, *spatial)`` and ``w_shape`` is ``(K, C // groups, *kernel)``,
    both in logical NCHW order whatever the memory layout. Per spatial dim:
    ``out = (in + before + after - dilation*(k - 1) - 1) // stride + 1``, which must be >= 1.
    ``padding``: see :func:`resolve_padding` (ints, per-dim ``(before, after)`` pairs, torch's ``"valid"`` and
    ``"same"``; an even dilated kernel under ``"same"`` pads one more after, as torch does). ``C`` must be
    ``groups`` times ``w``'s input channels and ``K`` divisible by ``groups``.
    """
    x_shape, w_shape = tuple(x_shape), tuple(w_shape)
    if len(x_shape) < 3:
        raise ValueError(f"x must have at least 3 dims (N, C, spatial...), got shape {x_shape}")
    if len(w_shape) != len(x_shape):
        raise ValueError(f"w must have as many dims as x ({len(x_shape)}), got shape {w_shape}")
    nsp = len(x_shape) - 2
    _check_groups(groups)
    s = expand(stride, nsp, "stride", 1, INT32_MAX)
    d = expand(dilation, nsp, "dilation", 1, INT32_MAX)
    n, c = x_shape[:2]
    k, cg = w_shape[:2]
    # w first: the transposed convolution's x_shape is derived from w's (a zero dim of w would be reported as x's)
    if any(v <= 0 for v in w_shape):
        raise ValueError(f"w dims must be positive, got {w_shape}")
    if any(v <= 0 for v in x_shape):
        raise ValueError(f"x dims must be positive, got {x_shape}")
    pre, post = resolve_padding(padding, nsp, s, tuple(di * (ki - 1) + 1 for di, ki in zip(d, w_shape[2:])))
    if c != cg * groups:
        raise ValueError(f"x has {c} channels but w expects {cg} per group x {groups} groups = {cg * groups}")
    if k % groups:
        raise ValueError(f"w's output channels ({k}) must be divisible by groups ({groups})")
    sizes = conv_output_sizes(x_shape[2:], w_shape[2:], stride=s, pre_padding=pre, post_padding=post, dilation=d)
    for i, (xi, ki, o) in enumerate(zip(x_shape[2:], w_shape[2:], sizes)):
        if o < 1:
            eff = d[i] * (ki - 1) + 1
            raise ValueError(
                f"spatial dim {i}: input {xi} with padding {_pad_text(pre[i], post[i])} is smaller than the "
                f"dilated kernel {eff}"
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
    if w_shape[0] % groups:
        raise ValueError(f"w's output channels ({w_shape[0]}) must be divisible by groups ({groups})")
    out = [dy_shape[0], w_shape[1] * groups]
    for i in range(nsp):
        if op[i] >= max(s[i], d[i]):
            raise ValueError(f"output_padding {op[i]} must be smaller than stride or dilation in dim {i}")
        v = (dy_shape[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (w_shape[2 + i] - 1) + 1 + op[i]
        if v < 1:
            raise ValueError(
                f"spatial dim {i}: the input size recovered from dy's size {dy_shape[2 + i]}, w's {w_shape[2 + i]}, "
                f"stride {s[i]}, padding {p[i]} and dilation {d[i]} is {v}, not positive (pass x_shape= for the "
                "data gradient)"
            )
        out.append(v)
    return tuple(out)


def pool_padding(
    sizes: Sequence[int],
    window: Sequence[int],
    *,
    stride: Sequence[int],
    padding: int | Sequence[int] | Sequence[Sequence[int]] | str = 0,
    ceil_mode: bool = False,
    note: str = "",
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(pre, post)`` padding per spatial dim of a pooling of input ``sizes`` (checked ``window`` and ``stride``).

    ``padding`` as :func:`resolve_padding` takes it, each side smaller than the window (cuDNN's rule). With
    ``ceil_mode`` (torch's), the output size rounds up, ``out = ceil((in + before + after - window) / stride) + 1``,
    less one when the last window would start past the input and its padding before (``(out - 1) * stride >=
    in + before``); that is expressed as extra padding after, which is what cuDNN (which rounds down) is given.
    A ceil-mode window hanging past the declared padding covers only padding there: max pooling ignores it, and
    for averages including padding torch divides by the window clipped to input plus declared padding, which the
    pooling op states."""
    nsp = len(sizes)
    pre, post = resolve_padding(padding, nsp, tuple(stride), tuple(window), "window", note)
    for i in range(nsp):
        if pre[i] >= window[i] or post[i] >= window[i]:
            raise ValueError(
                f"padding {_pad_text(pre[i], post[i])} must be smaller than the window {window[i]} (dim {i})"
            )
    if not isinstance(ceil_mode, bool):
        raise TypeError(f"ceil_mode must be a bool, got {ceil_mode!r}")
    if not ceil_mode:
        return pre, post
    extra = []
    for i in range(nsp):
        span = sizes[i] + pre[i] + post[i] - window[i]
        out = -(-span // stride[i]) + 1  # torch's: rounded up, also for an input shorter than the window
        if out > 1 and (out - 1) * stride[i] >= sizes[i] + pre[i]:
            out -= 1
        extra.append(max(0, (out - 1) * stride[i] + window[i] - (sizes[i] + pre[i] + post[i])))
    return pre, tuple(p + e for p, e in zip(post, extra))


def pool_output_shape(
    x_shape: Sequence[int],
    window: int | Sequence[int],
    *,
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] | Sequence[Sequence[int]] | str = 0,
    ceil_mode: bool = False,
) -> tuple[int, ...]:
    """Output shape ``(N, C, *spatial)`` of pooling.

    ``stride`` defaults to ``window``. Per spatial dim:
    ``out = (in + before + after - window) // stride + 1``, which must be >= 1, each padding smaller than the
    window; ``ceil_mode=True`` rounds up as torch does (:func:`pool_padding`). ``padding`` as
    :func:`resolve_padding` takes it (``"same"``: stride 1, as for :func:`conv_output_shape`).
    """
    x_shape = tuple(x_shape)
    if len(x_shape) < 3:
        raise ValueError(f"x must have at least 3 dims (N, C, spatial...), got shape {x_shape}")
    if any(v <= 0 for v in x_shape):
        raise ValueError(f"x dims must be positive, got {x_shape}")
    nsp = len(x_shape) - 2
    w = expand(window, nsp, "window", 1, INT32_MAX)
    s = expand(w if stride is None else stride, nsp, "stride", 1, INT32_MAX)
    note = " (the default: the window)" if stride is None else ""
    pre, post = pool_padding(x_shape[2:], w, stride=s, padding=padding, ceil_mode=ceil_mode, note=note)
    sizes = pool_output_sizes(x_shape[2:], w, stride=s, pre_padding=pre, post_padding=post)
    for i in range(nsp):
        if sizes[i] < 1:
            raise ValueError(
                f"spatial dim {i}: input {x_shape[2 + i]} with padding {_pad_text(pre[i], post[i])} is smaller "
                f"than the window {w[i]}"
            )
    return (*x_shape[:2], *sizes)
