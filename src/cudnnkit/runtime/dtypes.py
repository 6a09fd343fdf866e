"""Data types: canonical names, sizes, cuDNN data types, compute types and scaling factors.

cudnnkit names dtypes by string (``"float32"``, ``"bfloat16"``, ...), so that no
array library or ``ml_dtypes`` is needed below the adapters. Adapters translate
their own dtype objects to these names.
"""

from __future__ import annotations

import ctypes

from ..lib import cudnnDataType_t

__all__ = [
    "DTYPES",
    "FLOATS",
    "itemsize",
    "cudnn_dtype",
    "compute_dtype",
    "scaling",
    "scaling_ref",
    "canonical",
    "check_dtype",
    "check_choice",
]

#: the floating types cuDNN computes with (half types compute in float32)
FLOATS = ("float16", "bfloat16", "float32", "float64")

#: name -> (itemsize in bytes, cudnnDataType_t)
DTYPES: dict[str, tuple[int, cudnnDataType_t]] = {
    "float32": (4, cudnnDataType_t.CUDNN_DATA_FLOAT),
    "float64": (8, cudnnDataType_t.CUDNN_DATA_DOUBLE),
    "float16": (2, cudnnDataType_t.CUDNN_DATA_HALF),
    "bfloat16": (2, cudnnDataType_t.CUDNN_DATA_BFLOAT16),
    "int8": (1, cudnnDataType_t.CUDNN_DATA_INT8),
    "uint8": (1, cudnnDataType_t.CUDNN_DATA_UINT8),
    "int32": (4, cudnnDataType_t.CUDNN_DATA_INT32),
    "int64": (8, cudnnDataType_t.CUDNN_DATA_INT64),
    "bool": (1, cudnnDataType_t.CUDNN_DATA_BOOLEAN),
    "float8_e4m3fn": (1, cudnnDataType_t.CUDNN_DATA_FP8_E4M3),
    "float8_e5m2": (1, cudnnDataType_t.CUDNN_DATA_FP8_E5M2),
}

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "f4": "float32",
    "f8": "float64",
    "f2": "float16",
    "bf16": "bfloat16",
    "bool_": "bool",
    "float8_e4m3": "float8_e4m3fn",
}


def _scalar_type_name(dtype: type) -> str | None:
    """The dtype name of a NumPy scalar type (``np.float16``, ``ml_dtypes.bfloat16``), else ``None``.

    NumPy is imported only when a type is given (it is then already imported by whoever made the type)."""
    import numpy

    if not issubclass(dtype, numpy.generic):
        return None
    try:
        return numpy.dtype(dtype).name
    except TypeError:  # an abstract type such as np.floating
        return None


def canonical(dtype: object, name: str = "dtype") -> str:
    """Canonical dtype name for a string, a NumPy/CuPy dtype, a NumPy scalar type (``np.float16``, also
    ``ml_dtypes.bfloat16``) or a torch dtype (``torch.float16`` -> ``"float16"``).

    ``name`` is the argument named in the ``TypeError`` for anything else.
    """
    if isinstance(dtype, str):
        key: str | None = dtype
    elif isinstance(dtype, type):
        key = _scalar_type_name(dtype)
    else:
        key = getattr(dtype, "name", None)
        if key is None:
            key = str(dtype)
    if isinstance(key, str):
        key = key.removeprefix("torch.")
        key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise TypeError(f"{name} {dtype!r} is not a type cuDNN supports; expected one of {sorted(DTYPES)}")
    return key


def itemsize(dtype: str) -> int:
    return DTYPES[canonical(dtype)][0]


def cudnn_dtype(dtype: str) -> cudnnDataType_t:
    """``cudnnDataType_t`` for a dtype name."""
    return DTYPES[canonical(dtype)][1]


def compute_dtype(dtype: str) -> str:
    """The type cuDNN computes in for ``dtype``: float64 stays, every other float computes in float32."""
    return "float64" if canonical(dtype) == "float64" else "float32"


def scaling(dtype: str, value: float) -> ctypes.c_double | ctypes.c_float:
    """A host alpha/beta for cuDNN's legacy API: ``double`` for float64 data, ``float`` otherwise.

    Pass it with ``ctypes.byref``; cuDNN reads it before the call returns.
    """
    return ctypes.c_double(value) if canonical(dtype) == "float64" else ctypes.c_float(value)


def scaling_ref(dtype: str, value: float) -> object:
    """``ctypes.byref(scaling(dtype, value))``: what cuDNN's ``alpha``/``beta`` parameters take."""
    return ctypes.byref(scaling(dtype, value))


def check_choice(value: object, table: object, name: str) -> str:
    """``value`` if it is one of ``table``'s string keys, else ``ValueError`` naming the argument and the choices."""
    if not isinstance(value, str) or value not in table:  # type: ignore[operator]
        raise ValueError(f"{name} must be one of {sorted(table)}, got {value!r}")  # type: ignore[call-overload]
    return value


def check_dtype(v: object, name: str, allowed: tuple[str, ...] = FLOATS, what: str = "this op") -> str:
    """``v.dtype`` if it is in ``allowed``, else ``TypeError`` naming the argument and the allowed types."""
    dtype = v.dtype  # type: ignore[attr-defined]
    if dtype not in allowed:
        raise TypeError(f"{name} has dtype {dtype}; {what} needs one of {allowed}")
    return dtype
