"""Array-library adapters: the only modules below the integrations that import CuPy or torch.

Each adapter module (``_cupy``, ``_torch``) defines a module-level ``ADAPTER``
object with this interface:

* ``name``: the library name;
* ``view(obj, name) -> ArrayView``: read an array of that library (rejects host arrays);
* ``empty(shape, dtype, device, strides=None, stream=None)``: allocate an
  output with the library's allocator (CuPy memory pool, torch caching allocator)
  for use on ``stream`` (a ``cudaStream_t`` as int, default: the current stream);
  the library's out-of-memory error is raised as ``MemoryError``;
* ``wrap(obj, device)``: a zero-copy array of this library over another library's CUDA array
  (through ``__cuda_array_interface__``), for copies between arrays of mixed libraries;
* ``contiguous(arr, stream=None)``: a C-contiguous copy made on ``stream`` (or ``arr`` itself if it already is);
* ``copy(dst, src, stream=None)``: device-to-device copy on ``stream`` (default: the current stream);
* ``current_stream(device) -> int``: the library's current stream on ``device``;
* ``current_device()``: the library's current device;
* ``device_guard(device)``: a context manager making ``device`` current;
* ``pointer_device(ptr) -> int | None``: the device of a device pointer, if the library can tell;
* ``from_numpy(a, device, stream=None)`` / ``to_numpy(arr)``: host-to-device (queued on ``stream``, default
  the current one) and device-to-host copies;
* ``version()``, ``device_count()``, ``device_info(i) -> (name, (major, minor))``, ``synchronize(device)``.

The library is imported only when one of its arrays is seen (or when asked
for explicitly), so importing cudnnkit never imports CuPy or torch.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

_MODULES = {"cupy": "cudnnkit.runtime.adapters._cupy", "torch": "cudnnkit.runtime.adapters._torch"}
_loaded: dict[str, Any] = {}

__all__ = ["get", "for_object", "available", "names"]


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get(name: str) -> Any:
    """The adapter for library ``name`` (imports the library)."""
    ad = _loaded.get(name)
    if ad is None:
        if name not in _MODULES:
            raise ValueError(f"no adapter for array library {name!r}; known: {sorted(_MODULES)}")
        ad = _loaded[name] = importlib.import_module(_MODULES[name]).ADAPTER
    return ad


def for_object(obj: Any) -> Any | None:
    """The adapter for ``obj``'s library, or None. Decided by the type's module, without importing anything."""
    root = type(obj).__module__.partition(".")[0]
    if root in _MODULES:
        return get(root)
    return None


def available() -> list[Any]:
    """Adapters whose library is installed (imports them)."""
    out = []
    for name in _MODULES:
        if name in _loaded or importlib.util.find_spec(name) is not None:
            try:
                out.append(get(name))
            except ImportError:
                pass
    return out
