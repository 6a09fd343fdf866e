"""Convolutions with torch.nn.functional's names and semantics: ``conv1d/2d/3d`` and ``conv_transpose1d/2d/3d``."""

from __future__ import annotations

from typing import Any

from ._common import batched, call1, dtype_of, has_l3, ntuple

__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"]


def conv_padding(padding: Any, n: int, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...], dtype: str) -> Any:  # fmt: skip
    """torch's ``padding`` as cudnnkit's: "valid"/"same" (stride 1, as torch) or ``n`` ints. "same" with an even
    dilated kernel pads one more after (torch's split), which only cuDNN's graph path takes: float64 (legacy only)
    raises ``NotImplementedError`` naming ``padding``."""
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ValueError(f"padding must be 'valid', 'same', an int or {n} ints, got {padding!r}")
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' is not supported for strided convolutions (stride {stride})")
            if dtype == "float64" and any(d * (k - 1) % 2 for d, k in zip(dilation, kernel)):
                raise NotImplementedError(
                    "padding='same' with an even dilated kernel pads one more after than before: cuDNN's legacy "
                    "convolution (the only one with float64) pads both sides alike"
                )
        return padding
    return ntuple(padding, n, "padding")


def _conv(n: int, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
    b = batched(input, n, f"conv{n}d")
    if weight.ndim != n + 2:
        raise ValueError(f"conv{n}d: weight must be {n + 2}-d (out, in // groups, *k), got shape {tuple(weight.shape)}")
    s, d = ntuple(stride, n, "stride"), ntuple(dilation, n, "dilation")
    p = conv_padding(padding, n, tuple(weight.shape[2:]), s, d, dtype_of(input))
    x = input if b else input[None]
    y = call1("convolution", x, weight, bias, stride=s, padding=p, dilation=d, groups=int(groups))
    return y if b else y[0]


def conv1d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:  # fmt: skip
    """torch's ``conv1d`` (run as 2-d): L3 ``convolution``, ``cudnnConvolutionForward`` or the graph's conv_fprop."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:  # fmt: skip
    """torch's ``conv2d``: L3 ``convolution``, ``cudnnConvolutionForward`` or the graph's conv_fprop."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
           groups: int = 1) -> Any:  # fmt: skip
    """torch's ``conv3d``: L3 ``convolution``, ``cudnnConvolutionForward`` or the graph's conv_fprop."""
    return _conv(3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(n: int, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, output_padding: Any,
                    groups: Any, dilation: Any) -> Any:  # fmt: skip
    fn = f"conv_transpose{n}d"
    b = batched(input, n, fn)
    if weight.ndim != n + 2:
        raise ValueError(f"{fn}: weight must be {n + 2}-d (in, out // groups, *k), got shape {tuple(weight.shape)}")
    if isinstance(padding, str):
        raise ValueError(f"{fn}: padding must be an int or {n} ints (torch takes no string here), got {padding!r}")
    if bias is not None:  # added after the op by a broadcast: checked here, as torch checks it
        k = weight.shape[1] * int(groups)
        if tuple(bias.shape) != (k,):
            raise RuntimeError(f"{fn}: bias must have shape ({k},) (out_channels), got {tuple(bias.shape)}")
        if bias.dtype != input.dtype:
            raise TypeError(f"{fn}: bias has dtype {bias.dtype} but input has dtype {input.dtype}")
    kw = dict(stride=ntuple(stride, n, "stride"), padding=ntuple(padding, n, "padding"),
              output_padding=ntuple(output_padding, n, "output_padding"), dilation=ntuple(dilation, n, "dilation"),
              groups=int(groups))  # fmt: skip
    if not has_l3("convolution_transpose"):
        raise NotImplementedError(
            f"{fn}: cudnnkit has no differentiable op 'convolution_transpose' (no L3 declaration)"
        )
    x = input if b else input[None]
    y = call1("convolution_transpose", x, weight, **kw)
    if bias is not None:  # the declaration has no bias: added after (the library's broadcast add, differentiable)
        y = y + bias.reshape((1, -1) + (1,) * n)
    return y if b else y[0]


def conv_transpose1d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Any:  # fmt: skip
    """torch's ``conv_transpose1d``: L3 ``convolution_transpose``, ``cudnnConvolutionBackwardData`` (or conv_dgrad)."""
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose2d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Any:  # fmt: skip
    """torch's ``conv_transpose2d``: L3 ``convolution_transpose``, ``cudnnConvolutionBackwardData`` (or conv_dgrad)."""
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups, dilation)


def conv_transpose3d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Any:  # fmt: skip
    """torch's ``conv_transpose3d``: L3 ``convolution_transpose``, ``cudnnConvolutionBackwardData`` (or conv_dgrad)."""
    return _conv_transpose(3, input, weight, bias, stride, padding, output_padding, groups, dilation)
