"""L1 runtime: array views, adapters, handles, settings, descriptor cache, shape inference."""

from __future__ import annotations

from . import adapters, dtypes, shapes
from .arrays import ArrayView, as_view, contiguous_strides, is_contiguous, same_device
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
from .dtypes import FLOATS, canonical, check_choice, check_dtype, compute_dtype, cudnn_dtype, scaling, scaling_ref
from .handle import Handle, get_handle, resolve_stream
from .launch import Launch, prepare
from .settings import Settings, current_settings, settings

__all__ = [
    "adapters",
    "dtypes",
    "shapes",
    "ArrayView",
    "as_view",
    "contiguous_strides",
    "is_contiguous",
    "same_device",
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
    "Handle",
    "get_handle",
    "resolve_stream",
    "Launch",
    "prepare",
    "Settings",
    "current_settings",
    "settings",
]
