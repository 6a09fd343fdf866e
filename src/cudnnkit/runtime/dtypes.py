"""Data types: canonical names, sizes, cuDNN data types, compute types and scaling factors.

cudnnkit names dtypes by string (``"float32"``, ``"bfloat16"``, ...), so that no
array library or ``ml_dtypes`` is needed below the adapters. Adapters translate
their own dtype objects to these names.
"""

from __future__ import annotations

import ctypes
import math
import numbers

from ..lib import cudnnDataType_t, cudnnNanPropagation_t

_PROPAGATE = cudnnNanPropagation_t.CUDNN_PROPAGATE_NAN
_NOT_PROPAGATE = cudnnNanPropagation_t.CUDNN_NOT_PROPAGATE_NAN

__all__ = [
    "DTYPES",
    "FLOATS",
    "itemsize",
    "cudnn_dtype",
    "compute_dtype",
    "scaling",
    "scaling_ref",
    "check_scalar",
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
    if type(dtype) is str and dtype in DTYPES:  # already canonical (the per-call case)
        return dtype
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


_FLOAT32_MAX = 3.4028234663852886e38


def nan_propagation(value: object, name: str = "propagate_nan") -> int:
    """``CUDNN_PROPAGATE_NAN`` or ``CUDNN_NOT_PROPAGATE_NAN`` for a bool option (``TypeError`` naming it else)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return _PROPAGATE if value else _NOT_PROPAGATE


def check_scalar(value: object, name: str, *, finite: bool = True, dtype: str | None = None) -> float:
    """``value`` as a float, for a host scalar parameter (alpha, beta, a fill value, an op's float parameter).

    Accepts Python ints and floats and NumPy real scalars (``numpy.float32(2)``, ``numpy.int64(3)``, 0-d
    NumPy arrays). Refuses, naming ``name``:

    * ``TypeError``: anything else -- str, None, complex, a device array; also ``True``/``False`` (and NumPy
      bools): a bool where a number is expected is almost always a mistake;
    * ``ValueError``: NaN or +-inf unless ``finite=False``; a finite value that overflows the type the value is
      passed to cuDNN in (``dtype``'s compute type: float32 unless ``dtype`` is float64), e.g. ``1e300`` with
      float32 or float16 data, which would become inf; an int too large for a float.
    """
    t = type(value)
    if t is float:
        v = value
    elif t is int:
        try:
            v = float(value)
        except OverflowError:
            raise ValueError(f"{name} is too large for a float (an int of {int(value).bit_length()} bits)") from None
    else:
        v = _real(value, name)
    if not math.isfinite(v):
        if finite:
            raise ValueError(f"{name} must be finite, got {v}")
        return v
    if (dtype is None or compute_dtype(dtype) != "float64") and abs(v) > _FLOAT32_MAX:
        raise ValueError(f"{name}={v!r} overflows float32 (|{name}| <= {_FLOAT32_MAX:.7g}), the type cuDNN takes it in")
    return v


def _real(value: object, name: str) -> float:
    """Slow path of :func:`check_scalar`: bools, NumPy scalars and 0-d arrays, other real numbers."""
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):
        raise TypeError(f"{name} must be a real number, got the bool {value!r}")
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{name} is too large for a float (an int of {int(value).bit_length()} bits)") from None
    # a 0-d host array (NumPy) of a real type
    ai = getattr(value, "__array_interface__", None)
    if isinstance(ai, dict) and ai.get("shape") == () and str(ai.get("typestr", ""))[1:2] in ("f", "i", "u"):
        return _real(value[()], name)  # type: ignore[index]
    raise TypeError(f"{name} must be a real number (int or float), got {type(value).__name__} {value!r}")


def scaling(
    dtype: str, value: float, name: str = "alpha/beta", *, finite: bool = True
) -> ctypes.c_double | ctypes.c_float:
    """A host alpha/beta for cuDNN's legacy API: ``double`` for float64 data, ``float`` otherwise.

    ``value`` is checked by :func:`check_scalar` (``name`` is the argument named in its errors; ``finite=False``
    lets NaN and inf through, for fill values). Pass it with ``ctypes.byref``; cuDNN reads it before the call
    returns.
    """
    if canonical(dtype) == "float64":
        return ctypes.c_double(check_scalar(value, name, finite=finite, dtype="float64"))
    return ctypes.c_float(check_scalar(value, name, finite=finite, dtype="float32"))


#: (double?, value) -> a shared reference to the constant 0 or 1 (cuDNN only reads it, during the call)
_CONSTANTS: dict[tuple[bool, float], object] = {}


def scaling_ref(dtype: str, value: float, name: str = "alpha/beta", *, finite: bool = True) -> object:
    """``ctypes.byref(scaling(dtype, value, name, finite=finite))``: what cuDNN's ``alpha``/``beta`` take (the
    constants 0 and 1 are made once per C type: every call passes them)."""
    if type(value) in (int, float) and (value == 1 or value == 0):
        key = (canonical(dtype) == "float64", float(value))
        ref = _CONSTANTS.get(key)
        if ref is None:
            ref = _CONSTANTS.setdefault(key, ctypes.byref(scaling(dtype, value, name, finite=finite)))
        return ref
    return ctypes.byref(scaling(dtype, value, name, finite=finite))


def check_choice(value: object, table: object, name: str) -> str:
    """``value`` if it is one of ``table``'s string keys, else ``ValueError`` naming the argument and the choices."""
    if not isinstance(value, str):  # also keeps unhashable values (a list) away from the table lookup
        raise TypeError(f"{name} must be one of {sorted(table)} (a str), got {value!r}")  # type: ignore[call-overload]
    if value not in table:  # type: ignore[operator]
        raise ValueError(f"{name} must be one of {sorted(table)}, got {value!r}")  # type: ignore[call-overload]
    return value


def check_dtype(v: object, name: str, allowed: tuple[str, ...] = FLOATS, what: str = "this op") -> str:
    """``v.dtype`` if it is in ``allowed``, else ``TypeError`` naming the argument and the allowed types."""
    dtype = v.dtype  # type: ignore[attr-defined]
    if dtype not in allowed:
        raise TypeError(f"{name} has dtype {dtype}; {what} needs one of {allowed}")
    return dtype
