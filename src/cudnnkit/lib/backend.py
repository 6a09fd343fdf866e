"""Generic access to cuDNN backend descriptors, driven by the reviewed attribute table.

``cudnnBackendSetAttribute``/``cudnnBackendGetAttribute`` take an attribute
name, its value type and an element count. :data:`ATTRIBUTES` (in
``_backend_table.py``, reviewed by hand against cuDNN's backend documentation)
records the type and count of every ``CUDNN_ATTR_*``, so one pair of functions
serves every attribute::

    with BackendDescriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR") as t:
        t.set("CUDNN_ATTR_TENSOR_DIMENSIONS", [8, 64, 56, 56])
        ...
        t.finalize()
        t.get("CUDNN_ATTR_TENSOR_DIMENSIONS")   # -> [8, 64, 56, 56]

Values: ints or IntEnums for integer and enum types, floats, bools, device
pointers (int) for ``CUDNN_TYPE_VOID_PTR``, :class:`BackendDescriptor` (or raw
pointers) for ``CUDNN_TYPE_BACKEND_DESCRIPTOR``, ``(numerator, denominator)``
for ``CUDNN_TYPE_FRACTION``, ``bytes``/``str`` for ``CUDNN_TYPE_CHAR``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from enum import IntEnum
from typing import Any

from . import _cudnn
from ._backend_table import ATTRIBUTES, DEPRECATED, VARIABLE
from ._cudnn import cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, cudnnBackendDescriptorType_t

__all__ = [
    "ATTRIBUTES",
    "DEPRECATED",
    "VARIABLE",
    "BackendDescriptor",
    "attribute_info",
    "element_ctype",
    "set_attribute",
    "get_attribute",
]

_T = cudnnBackendAttributeType_t
_ELEMENT = {
    _T.CUDNN_TYPE_HANDLE: ctypes.c_void_p,
    _T.CUDNN_TYPE_BOOLEAN: ctypes.c_bool,
    _T.CUDNN_TYPE_INT64: ctypes.c_int64,
    _T.CUDNN_TYPE_FLOAT: ctypes.c_float,
    _T.CUDNN_TYPE_DOUBLE: ctypes.c_double,
    _T.CUDNN_TYPE_VOID_PTR: ctypes.c_void_p,
    _T.CUDNN_TYPE_BACKEND_DESCRIPTOR: ctypes.c_void_p,
    _T.CUDNN_TYPE_INT32: ctypes.c_int32,
    _T.CUDNN_TYPE_CHAR: ctypes.c_char,
    _T.CUDNN_TYPE_FRACTION: _cudnn.cudnnFraction_t,
}


def element_ctype(attr_type: cudnnBackendAttributeType_t) -> type:
    """The C element type of a backend attribute type (every enum-valued type is a C ``int``)."""
    return _ELEMENT.get(cudnnBackendAttributeType_t(attr_type), ctypes.c_int)


def attribute_info(name: str | int) -> tuple[cudnnBackendDescriptorType_t, cudnnBackendAttributeType_t, int]:
    """(descriptor type, value type, element count or VARIABLE) for an attribute name.

    Raises :class:`~cudnnkit.lib.errors.FeatureVersionError` for an attribute newer than the loaded libcudnn.
    """
    key = name if isinstance(name, str) else cudnnBackendAttributeName_t(name).name
    _lib().require(key)
    try:
        desc, typ, count = ATTRIBUTES[key]
    except KeyError:
        raise ValueError(f"unknown backend attribute {name!r}") from None
    return cudnnBackendDescriptorType_t[desc], cudnnBackendAttributeType_t[typ], count


def _lib():
    from cudnnkit import lib

    return lib


def _as_pointer(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, BackendDescriptor):
        return v.ptr
    p = getattr(v, "_as_parameter_", v)
    return int(p) if p is not None else None


def _pack(attr: str, typ: cudnnBackendAttributeType_t, count: int, value: Any) -> tuple[ctypes.Array, int]:
    ct = element_ctype(typ)
    if typ == _T.CUDNN_TYPE_CHAR:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return (ctypes.c_char * max(len(data), 1)).from_buffer_copy(data or b"\0"), len(data)
    scalar = not isinstance(value, (list, tuple, Sequence)) or (
        typ == _T.CUDNN_TYPE_FRACTION and len(value) == 2 and isinstance(value[0], int) and count == 1
    )
    items = [value] if scalar else list(value)
    if count != VARIABLE and len(items) != count:
        raise ValueError(f"{attr} takes {count} element(s), got {len(items)}")
    arr = (ct * len(items))()
    for i, v in enumerate(items):
        if typ == _T.CUDNN_TYPE_FRACTION:
            num, den = (v.numerator, v.denominator) if hasattr(v, "numerator") else v
            arr[i] = _cudnn.cudnnFraction_t(int(num), int(den))
        elif ct is ctypes.c_void_p:
            arr[i] = _as_pointer(v)
        elif ct in (ctypes.c_float, ctypes.c_double):
            arr[i] = float(v)
        elif ct is ctypes.c_bool:
            arr[i] = bool(v)
        else:
            if isinstance(v, IntEnum):  # an enum value newer than the loaded libcudnn is refused, never passed on
                _lib().require(v.name, f"{attr} = {v.name}")
            arr[i] = int(v)
    return arr, len(items)


def set_attribute(desc: Any, name: str, value: Any) -> None:
    """``cudnnBackendSetAttribute`` with the type and count from the table."""
    _, typ, count = attribute_info(name)
    arr, n = _pack(name, typ, count, value)
    _lib().cudnnBackendSetAttribute(
        _as_pointer(desc), cudnnBackendAttributeName_t[name], typ, n, ctypes.cast(arr, ctypes.c_void_p)
    )


def get_attribute(desc: Any, name: str, count: int | None = None) -> Any:
    """``cudnnBackendGetAttribute``: a scalar for single-element attributes, else a list.

    For variable-length attributes the length is queried first unless ``count``
    is given. ``CUDNN_TYPE_BACKEND_DESCRIPTOR`` values must be read with
    :meth:`BackendDescriptor.get_descriptors`, which creates the descriptors
    cuDNN fills in.
    """
    lib = _lib()
    _, typ, table_count = attribute_info(name)
    if typ == _T.CUDNN_TYPE_BACKEND_DESCRIPTOR:
        raise TypeError(f"{name} holds backend descriptors: use BackendDescriptor.get_descriptors")
    ct = element_ctype(typ)
    n = ctypes.c_int64()
    attr = cudnnBackendAttributeName_t[name]
    if count is None:
        count = table_count
        if count == VARIABLE or typ == _T.CUDNN_TYPE_CHAR:
            lib.cudnnBackendGetAttribute(_as_pointer(desc), attr, typ, 0, ctypes.byref(n), None)
            count = n.value
    arr = (ct * max(count, 1))()
    lib.cudnnBackendGetAttribute(
        _as_pointer(desc), attr, typ, count, ctypes.byref(n), ctypes.cast(arr, ctypes.c_void_p)
    )
    got = n.value
    if typ == _T.CUDNN_TYPE_CHAR:
        return bytes(arr[:got]).rstrip(b"\0")
    if ct is _cudnn.cudnnFraction_t:
        vals = [(f.numerator, f.denominator) for f in arr[:got]]
    else:
        vals = list(arr[:got])
    if table_count == 1 and count == 1:
        return vals[0] if vals else None
    return vals


class BackendDescriptor:
    """An owned backend descriptor (``cudnnBackendCreateDescriptor``/``Destroy``).

    ``set``/``get`` use the attribute table; ``finalize`` calls
    ``cudnnBackendFinalize``. Usable as a context manager, and destroyed when
    collected. ``ptr`` is the raw ``cudnnBackendDescriptor_t``.
    """

    __slots__ = ("ptr", "type", "finalized", "_keep", "__weakref__")

    def __init__(self, descriptor_type: str | int):
        lib = _lib()
        if isinstance(descriptor_type, str):
            try:
                self.type = cudnnBackendDescriptorType_t[descriptor_type]
            except KeyError:
                raise ValueError(f"unknown backend descriptor type {descriptor_type!r}") from None
        else:
            self.type = cudnnBackendDescriptorType_t(descriptor_type)
        lib.require(self.type.name)
        p = ctypes.c_void_p()
        lib.cudnnBackendCreateDescriptor(self.type, ctypes.byref(p))
        self.ptr = p.value
        self.finalized = False
        self._keep: list[Any] = []  # descriptors referenced by this one stay alive with it

    @property
    def _as_parameter_(self) -> int:
        return self.ptr

    def set(self, name: str, value: Any) -> BackendDescriptor:
        desc_type, typ, _ = attribute_info(name)
        if desc_type != self.type:
            raise ValueError(f"{name} belongs to {desc_type.name}, not {self.type.name}")
        set_attribute(self, name, value)
        if typ == _T.CUDNN_TYPE_BACKEND_DESCRIPTOR:
            self._keep.append(value)
        return self

    def get(self, name: str, count: int | None = None) -> Any:
        return get_attribute(self, name, count)

    def get_descriptors(self, name: str, descriptor_type: str | int, count: int = 1) -> list[BackendDescriptor]:
        """Read a ``CUDNN_TYPE_BACKEND_DESCRIPTOR`` attribute into ``count`` new descriptors."""
        lib = _lib()
        out = [BackendDescriptor(descriptor_type) for _ in range(count)]
        arr = (ctypes.c_void_p * count)(*(d.ptr for d in out))
        n = ctypes.c_int64()
        lib.cudnnBackendGetAttribute(
            self.ptr,
            cudnnBackendAttributeName_t[name],
            _T.CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            ctypes.byref(n),
            ctypes.cast(arr, ctypes.c_void_p),
        )
        return out[: n.value]

    def finalize(self) -> BackendDescriptor:
        _lib().cudnnBackendFinalize(self.ptr)
        self.finalized = True
        return self

    def close(self) -> None:
        if self.ptr:
            try:
                _lib().cudnnBackendDestroyDescriptor(self.ptr)
            finally:
                self.ptr = None

    def __enter__(self) -> BackendDescriptor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "finalized" if self.finalized else "open"
        return f"<BackendDescriptor {self.type.name} {state} at {self.ptr or 0:#x}>"
