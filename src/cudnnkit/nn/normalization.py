"""Normalizations with torch.nn.functional's names and semantics: ``batch_norm``, ``layer_norm``, ``rms_norm``,
``instance_norm`` and ``local_response_norm``."""

from __future__ import annotations

import math
from typing import Any

from .. import lib
from ..ops.normalization import param_dtype
from ._common import as_int, call1, cast, check_dtype, contiguous, copy_into, full, real

__all__ = ["batch_norm", "layer_norm", "rms_norm", "instance_norm", "local_response_norm", "lrn_params"]

_GRAPH_DTYPES = ("float16", "bfloat16", "float32")  # the graph norms' (no float64)
_FLOATS = ("float16", "bfloat16", "float32", "float64")
#: rms_norm's default eps: torch's is the epsilon of its math type (``opmath_type``), float32's for the half types
#: (torch's docs say ``finfo(x.dtype).eps``; its kernels use float32's, measured on torch 2.13's CPU rms_norm)
_DEFAULT_EPS = {"float16": 2.0**-23, "bfloat16": 2.0**-23, "float32": 2.0**-23, "float64": 2.0**-52}


def _eps(eps: Any, fn: str) -> float:
    eps = real(eps, "eps")
    if not eps > 0:
        raise NotImplementedError(f"{fn}: eps={eps}: cuDNN's normalizations take eps > 0 only")
    return eps


def _param(p: Any, like: Any, shape: tuple[int, ...], dtype: str, value: float | None) -> Any:
    """A parameter in the dtype cuDNN takes (cast: differentiable), or ``value`` filled where it is None."""
    if p is None:
        return None if value is None else full(like, shape, value, dtype)
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"a parameter of shape {tuple(shape)} is needed, got {tuple(p.shape)}")
    return cast(p, dtype)


def batch_norm(input: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Any:  # fmt: skip
    """torch's ``batch_norm``: L3 ``batch_norm``, ``cudnnBatchNormalizationForwardTraining`` (or ``...Inference``)."""
    if input.ndim < 2:
        raise ValueError(f"batch_norm: input must be (N, C, *spatial), got {tuple(input.shape)}")
    if input.ndim > 5:  # torch takes any number of spatial dims
        raise NotImplementedError(f"batch_norm: input of shape {tuple(input.shape)}: cuDNN's batch norm takes 0 to 3 "
                                  "spatial dims (fold the others into one)")  # fmt: skip
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: training=False needs running_mean and running_var")
    if training and input.shape[1] and math.prod(input.shape) // input.shape[1] == 1:  # torch's check
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, got input size "
                         f"{tuple(input.shape)}")  # fmt: skip
    if momentum is None:
        raise NotImplementedError("batch_norm: momentum=None (a cumulative average) needs the batch count; cuDNN "
                                  "updates running statistics with an exponential factor")  # fmt: skip
    dt = check_dtype(input, _FLOATS, "input", "cuDNN's batch norm")
    eps = _eps(eps, "batch_norm")
    if eps < lib.CUDNN_BN_MIN_EPSILON:
        raise NotImplementedError(f"batch_norm: eps={eps} is below CUDNN_BN_MIN_EPSILON ({lib.CUDNN_BN_MIN_EPSILON})")
    if 0 in input.shape:
        return empty_norm(input, weight, bias)
    pdt, c = param_dtype(dt), input.shape[1]
    scale = _param(weight, input, (c,), pdt, 1.0)
    shift = _param(bias, input, (c,), pdt, 0.0)
    stats = {}  # cuDNN writes packed statistics of the parameter dtype: others go through a copy, written back
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        stats[name] = None if a is None else contiguous(cast(a, pdt))
    y = call1("batch_norm", input, scale, shift, None, **stats, training=bool(training),
              momentum=real(momentum, "momentum"), epsilon=eps)  # fmt: skip
    for a, tmp in ((running_mean, stats["running_mean"]), (running_var, stats["running_var"])):
        if training and a is not None and tmp is not a:
            copy_into(a, tmp, grad=False)
    return y


def empty_norm(input: Any, *params: Any) -> Any:
    """A normalization of an empty ``input`` (a zero batch) as torch's: an empty result still on the autograd
    chain of ``input`` and the parameters (their gradients zeros), the running statistics untouched; cuDNN's
    normalizations take no empty array."""
    out = input * 1
    for p in params:
        if p is not None:
            out = out + p.reshape(-1)[:1].sum() * 0
    return out


def _normalized(input: Any, normalized_shape: Any, fn: str) -> tuple[int, ...]:
    if hasattr(normalized_shape, "__len__"):
        shape = tuple(as_int(v, "normalized_shape") for v in normalized_shape)
    else:
        shape = (as_int(normalized_shape, "normalized_shape"),)
    if not shape or tuple(input.shape[-len(shape) :]) != shape or input.ndim < len(shape):
        raise ValueError(f"{fn}: normalized_shape {shape} must be the trailing dims of input {tuple(input.shape)}")
    return shape


def layer_norm(input: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """torch's ``layer_norm``: L3 ``layer_norm``, a graph ``NORM_FORWARD`` (``CUDNN_LAYER_NORM``)."""
    shape = _normalized(input, normalized_shape, "layer_norm")
    check_dtype(input, _GRAPH_DTYPES, "input", "cuDNN's graph layer norm")
    if input.ndim == len(shape):  # every dim normalized: the op wants a leading one
        return layer_norm(input[None], shape, weight, bias, eps)[0]
    if 0 in input.shape:
        return empty_norm(input, weight, bias)
    scale = _param(weight, input, shape, "float32", 1.0)
    return call1("layer_norm", input, scale, _param(bias, input, shape, "float32", None),
                 normalized_shape_ndim=len(shape), epsilon=_eps(eps, "layer_norm"))  # fmt: skip


def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    """torch's ``rms_norm``: L3 ``rms_norm``, a graph ``NORM_FORWARD`` (``CUDNN_RMS_NORM``)."""
    shape = _normalized(input, normalized_shape, "rms_norm")
    dt = check_dtype(input, _GRAPH_DTYPES, "input", "cuDNN's graph RMS norm")
    if input.ndim == len(shape):  # every dim normalized: the op wants a leading one
        return rms_norm(input[None], shape, weight, eps)[0]
    if 0 in input.shape:
        return empty_norm(input, weight)
    eps = _DEFAULT_EPS[dt] if eps is None else eps
    return call1("rms_norm", input, _param(weight, input, shape, "float32", 1.0), normalized_shape_ndim=len(shape),
                 epsilon=_eps(eps, "rms_norm"))  # fmt: skip


def instance_norm(input: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None, bias: Any = None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Any:  # fmt: skip
    """torch's ``instance_norm``: L3 ``instance_norm``, graph ``NORM_FORWARD`` (else L3 ``batch_norm`` inference)."""
    if input.ndim < 3 or input.ndim > 5:
        raise ValueError(f"instance_norm: input must be (N, C, *spatial) with 1 to 3 spatial dims, got "
                         f"{tuple(input.shape)}")  # fmt: skip
    if not use_input_stats:  # normalized by the running statistics, per channel: batch norm's inference
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    if running_mean is not None or running_var is not None:
        raise NotImplementedError("instance_norm: running_mean/running_var with use_input_stats=True: cuDNN's "
                                  "instance norm does not update running statistics")  # fmt: skip
    check_dtype(input, _GRAPH_DTYPES, "input", "cuDNN's graph instance norm")
    if 0 in input.shape:
        return empty_norm(input, weight, bias)
    c = input.shape[1]
    return call1("instance_norm", input, _param(weight, input, (c,), "float32", 1.0),
                 _param(bias, input, (c,), "float32", None), epsilon=_eps(eps, "instance_norm"))  # fmt: skip


def lrn_params(size: Any, alpha: Any, beta: Any, k: Any) -> dict[str, Any]:
    """cuDNN's LRN keywords for torch's ``local_response_norm(size, alpha, beta, k)``. Both divide ``alpha`` by
    ``size`` and sum the squares over a window of ``size`` channels with zero padding; torch's window is
    ``c - size // 2 .. c + (size - 1) // 2``, cuDNN's ``c - (size - 1) // 2 .. c + size // 2``: the same for odd
    sizes only, so an even ``size`` raises ``NotImplementedError``, as do values outside cuDNN's limits."""
    size = as_int(size, "size")
    alpha, beta, k = real(alpha, "alpha"), real(beta, "beta"), real(k, "k")
    if size % 2 == 0:
        raise NotImplementedError(f"local_response_norm: size={size}: for an even size cuDNN's channel window is one "
                                  "channel ahead of torch's")  # fmt: skip
    if not lib.CUDNN_LRN_MIN_N <= size <= lib.CUDNN_LRN_MAX_N:
        raise NotImplementedError(f"local_response_norm: size={size}: cuDNN takes {lib.CUDNN_LRN_MIN_N} to "
                                  f"{lib.CUDNN_LRN_MAX_N}")  # fmt: skip
    if not k >= lib.CUDNN_LRN_MIN_K:
        raise NotImplementedError(f"local_response_norm: k={k}: cuDNN takes k >= {lib.CUDNN_LRN_MIN_K}")
    if not beta >= lib.CUDNN_LRN_MIN_BETA:
        raise NotImplementedError(f"local_response_norm: beta={beta}: cuDNN takes beta >= {lib.CUDNN_LRN_MIN_BETA}")
    return dict(size=size, lrn_alpha=alpha, lrn_beta=beta, k=k)


def local_response_norm(input: Any, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0) -> Any:
    """torch's ``local_response_norm`` (odd ``size``): L3 ``lrn``, ``cudnnLRNCrossChannelForward``."""
    if input.ndim < 3:
        raise ValueError(f"local_response_norm: input must have 3 or more dims, got shape {tuple(input.shape)}")
    kw = lrn_params(size, alpha, beta, k)
    check_dtype(input, ("float16", "float32", "float64"), "input", "cuDNN's LRN")
    return call1("lrn", input, **kw)
