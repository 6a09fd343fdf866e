"""L1 runtime: array views, adapters, handles, settings, caches (one LRU), descriptors, shape inference, and cuDNN's
own log routed into :mod:`logging` (:func:`enable_cudnn_logging`)."""

from __future__ import annotations

from . import adapters, cache, driver, dtypes, shapes
from .arrays import (
    ArrayView,
    as_view,
    check_device_pointer,
    contiguous_strides,
    is_contiguous,
    layout_problem,
    same_device,
)
from .cudnn_log import cudnn_logging_enabled, disable_cudnn_logging, enable_cudnn_logging
from .descriptors import (
    Descriptor,
    DescriptorCache,
    DescriptorKind,
    cache_info,
    clear_caches,
    get_cached,
    owned_descriptor,
    register_cache,
    tensor_descriptor,
    tensor_descriptor_of,
)
from .dtypes import (
    FLOATS,
    canonical,
    check_choice,
    check_dtype,
    check_scalar,
    compute_dtype,
    cudnn_dtype,
    scaling,
    scaling_ref,
)
from .handle import Handle, check_device, clear_stream_cache, get_handle, resolve_stream, validate_stream
from .launch import ELEMENTWISE, OPTIONAL, PACKED, WRITTEN, Launch, prepare
from .settings import Settings, current_settings, settings

__all__ = [
    "adapters",
    "cache",
    "driver",
    "dtypes",
    "shapes",
    "ArrayView",
    "as_view",
    "contiguous_strides",
    "is_contiguous",
    "same_device",
    "check_device_pointer",
    "layout_problem",
    "Descriptor",
    "DescriptorCache",
    "DescriptorKind",
    "cache_info",
    "clear_caches",
    "get_cached",
    "owned_descriptor",
    "register_cache",
    "tensor_descriptor_of",
    "FLOATS",
    "check_dtype",
    "check_choice",
    "tensor_descriptor",
    "canonical",
    "compute_dtype",
    "cudnn_dtype",
    "scaling",
    "scaling_ref",
    "check_scalar",
    "Handle",
    "get_handle",
    "resolve_stream",
    "validate_stream",
    "check_device",
    "clear_stream_cache",
    "Launch",
    "prepare",
    "OPTIONAL",
    "WRITTEN",
    "ELEMENTWISE",
    "PACKED",
    "Settings",
    "current_settings",
    "settings",
    "enable_cudnn_logging",
    "disable_cudnn_logging",
    "cudnn_logging_enabled",
]
