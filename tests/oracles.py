"""Test oracles: cuDNN's own answers for output shapes, from its legacy descriptors (host-side only, no GPU).

:mod:`cudnnkit.runtime.shapes` is tested against these. They raise cuDNN's error for parameters cuDNN rejects.
"""

from __future__ import annotations

from cudnnkit import lib
from cudnnkit.runtime.arrays import contiguous_strides
from cudnnkit.runtime.descriptors import int_array, owned_descriptor
from cudnnkit.runtime.shapes import expand

__all__ = ["cudnn_conv_output_shape", "cudnn_pool_output_shape"]


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
