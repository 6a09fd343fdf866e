"""DLPack export: memory cudnnkit owns (or any pointer with an owner) handed to an array library as a
``DLManagedTensor`` capsule, so that ``jax.dlpack.from_dlpack`` (or ``torch.from_dlpack``) makes an array over it
without a copy.

:class:`Exported` is the object a consumer imports: ``__dlpack_device__()`` and ``__dlpack__(stream=...)``
(the legacy, unversioned capsule named ``"dltensor"``). The capsule owns one ``DLManagedTensor`` (built here with
``ctypes``: the tensor, its shape and strides arrays) and a reference to the memory's ``owner``; the consumer
calls the tensor's ``deleter`` when it drops the array, which releases both. A capsule never consumed is released
by its own destructor. ``stream`` (the consumer's) is recorded in :attr:`Exported.streams`, so a producer can
order its work for that stream; nothing is queued here.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .arrays import _DL_CODES, _DLDataType, _DLDevice, _DLTensor

__all__ = ["Exported", "DL_CPU", "DL_CUDA", "alive"]

DL_CPU, DL_CUDA = 1, 2
_CODES = {v: k for k, v in _DL_CODES.items()}


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# private prototypes over the C API (``ctypes.pythonapi``'s function objects are shared by every module in the
# process: setting their argtypes would change them for other libraries, and theirs for us)
_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

#: manager_ctx -> what one exported tensor keeps alive (its ctypes structures and the memory's owner)
_alive: dict[int, tuple] = {}
_lock = threading.Lock()
_next = [1]


@_DELETER
def _deleter(managed: Any) -> None:
    ctx = managed.contents.manager_ctx
    with _lock:
        _alive.pop(ctx, None)


@_CAPSULE_DESTRUCTOR
def _destructor(capsule: int) -> None:
    if _valid(capsule, b"dltensor"):  # never consumed (a consumer renames it "used_dltensor"): release it here
        m = ctypes.cast(_pointer(capsule, b"dltensor"), ctypes.POINTER(_DLManagedTensor))
        _deleter(m)


def alive() -> int:
    """How many exported tensors are still held by a consumer (or an unconsumed capsule)."""
    with _lock:
        return len(_alive)


class Exported:
    """``shape``/``strides`` (elements)/``dtype`` at ``ptr`` on ``device`` (``device_type`` :data:`DL_CUDA` or
    :data:`DL_CPU`), kept alive through ``owner`` until the consumer lets go (see the module docstring)."""

    def __init__(self, ptr: int, shape: tuple, strides: tuple, dtype: str, device: int, owner: Any,
                 device_type: int = DL_CUDA):  # fmt: skip
        code = _CODES.get(dtype)
        if code is None:
            raise TypeError(f"DLPack export of dtype {dtype!r}: no DLPack code for it here")
        self.ptr, self.shape, self.strides, self.dtype = int(ptr), tuple(shape), tuple(strides), dtype
        self.device, self.owner, self.device_type = int(device), owner, int(device_type)
        self.streams: list[Any] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, self.device)

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        self.streams.append(stream)
        nd = len(self.shape)
        shape = (ctypes.c_int64 * max(nd, 1))(*self.shape)
        strides = (ctypes.c_int64 * max(nd, 1))(*self.strides)
        m = _DLManagedTensor()
        code, bits = _CODES[self.dtype]
        m.dl_tensor = _DLTensor(self.ptr, _DLDevice(self.device_type, self.device), nd, _DLDataType(code, bits, 1),
                                ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                                ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)), 0)  # fmt: skip
        with _lock:
            ctx = _next[0]
            _next[0] += 1
            _alive[ctx] = (m, shape, strides, self.owner)
        m.manager_ctx = ctx
        m.deleter = _deleter
        return _new(ctypes.addressof(m), b"dltensor", _destructor)
