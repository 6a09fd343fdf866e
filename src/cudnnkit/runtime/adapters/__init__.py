"""Array-library adapters: the only modules below the integrations that import CuPy or torch.

Each adapter module (``_cupy``, ``_torch``) defines a module-level ``ADAPTER`` object implementing
:class:`ArrayAdapter` (``_protocol.py``: every member the runtime and the ops call, with its shapes, dtypes and
stream semantics, and what a new adapter, such as the planned JAX one, must provide):

* ``name``, ``module``: the library's name and module;
* ``view(obj, name) -> ArrayView``: read an array of that library (rejects host arrays);
* ``empty(shape, dtype, device, strides=None, stream=None)``: allocate an output with the library's allocator;
* ``wrap(obj, device)``: a zero-copy array of this library over another library's CUDA array;
* ``contiguous(arr, stream=None)``, ``copy(dst, src, stream=None)``: device copies queued on ``stream``;
* ``from_numpy(a, device, stream=None)`` / ``to_numpy(arr)``: host-to-device and device-to-host copies;
* ``current_stream(device)``, ``current_device()``, ``device_guard(device)``, ``pointer_device(ptr)``;
* ``is_device_array(obj)``: whether one of the library's objects lives on a CUDA device;
* ``refuse_special_stream(stream, name)``: refuse a default-stream handle the library cannot use;
* ``version()``, ``device_count()``, ``device_info(i)``, ``synchronize(device)``.

Optional, for the ops' express path (:mod:`cudnnkit.ops._primitive`): ``types`` (the exact array types the
adapter reads) and ``key(obj) -> (key, ptr, adapter) | None``. ``key`` is a hashable tuple of everything
``view(obj)`` and the checks after it depend on (type, dtype, shape, strides, device), ``ptr`` the data pointer;
None when ``obj`` is not one the express path can take. :data:`KEYED` maps each such type to its ``key``, and
:data:`POINTER` to ``pointer(obj) -> int`` (optional: the data pointer alone, of an array whose key is known
already, for the replay path of :mod:`cudnnkit.ops._replay`; ``key(obj)[1]`` where the adapter has none).

:func:`is_device_array` answers "is this a CUDA array?" for any object (adapters first, then the generic
``__cuda_array_interface__``/DLPack rules), so no module outside this package tests for a library's types.

The library is imported only when one of its arrays is seen (or when asked
for explicitly), so importing cudnnkit never imports CuPy or torch.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ._protocol import MEMBERS, ArrayAdapter, missing_members

_MODULES = {
    "cupy": "cudnnkit.runtime.adapters._cupy",
    "torch": "cudnnkit.runtime.adapters._torch",
    "jax": "cudnnkit.runtime.adapters._jax",
}
#: a library whose array types live under another top-level module (JAX's ``ArrayImpl`` is ``jaxlib``'s)
_ROOTS = {"jaxlib": "jax"}
#: output type -> how a call's result becomes the library's array once the call is queued (JAX's outputs are
#: cudnnkit memory while the call runs: ``_jax.Pending``); filled as adapters load
FINISH: dict[type, Any] = {}
_loaded: dict[str, Any] = {}
#: exact array type -> the ``key`` function of its adapter (filled as adapters load; see the module docstring)
KEYED: dict[type, Any] = {}
#: exact array type -> the data pointer of such an array (the adapters' optional ``pointer``; see :func:`pointer`)
POINTER: dict[type, Any] = {}


def pointer(obj: Any, adapter: Any = None) -> int:
    """The data pointer of an array whose express key is known already (one an op just allocated, or the replay
    path's): :data:`POINTER`'s function for its type, else its key's pointer (``adapter.key``, or :data:`KEYED`'s
    for its type)."""
    f = POINTER.get(type(obj))
    if f is not None:
        return f(obj)
    return (adapter.key if adapter is not None else KEYED[type(obj)])(obj)[1]


__all__ = [
    "ArrayAdapter",
    "MEMBERS",
    "missing_members",
    "get",
    "for_object",
    "available",
    "first_available",
    "in_use",
    "names",
    "KEYED",
    "POINTER",
    "pointer",
    "FINISH",
    "is_device_array",
    "lasting",
    "is_lasting",
]


class _Lasting(threading.local):
    depth = 0


_lasting = _Lasting()


@contextlib.contextmanager
def lasting() -> Iterator[None]:
    """Within the block (this thread), what an adapter allocates outlives the call that makes it: state cached for
    the process, such as a :class:`~cudnnkit.ops.DropoutState`'s RNG states. An adapter that may lend a call memory
    scoped to it (cudnnkit's raw adapter inside an XLA handler, which places an op's new arrays in XLA's result
    buffers) gives such allocations memory of their own."""
    _lasting.depth += 1
    try:
        yield
    finally:
        _lasting.depth -= 1


def is_lasting() -> bool:
    """Whether this thread is inside :func:`lasting`."""
    return _lasting.depth > 0


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def get(name: str) -> Any:
    """The adapter for library ``name`` (imports the library)."""
    ad = _loaded.get(name)
    if ad is None:
        if name not in _MODULES:
            raise ValueError(f"no adapter for array library {name!r}; known: {sorted(_MODULES)}")
        mod = importlib.import_module(_MODULES[name])
        ad = _loaded[name] = mod.ADAPTER
        for t in getattr(ad, "types", ()):
            KEYED[t] = ad.key
            if getattr(ad, "pointer", None) is not None:
                POINTER[t] = ad.pointer
        FINISH.update(getattr(mod, "FINISH", {}))
    return ad


def _root(obj: Any) -> str:
    """The top-level module of ``obj``'s type, as the library it belongs to (``jaxlib``'s types are JAX's)."""
    root = type(obj).__module__.partition(".")[0]
    return _ROOTS.get(root, root)


def library_of(obj: Any) -> str | None:
    """The name of the array library (an adapter's) whose type ``obj`` has, or None: decided by the type's module
    alone, loading no adapter (so a traced frame, which may not import, can call it)."""
    root = _root(obj)
    return root if root in _MODULES else None


def for_object(obj: Any) -> Any | None:
    """The adapter for ``obj``'s library, or None. Decided by the type's module, without importing anything."""
    root = _root(obj)
    if root in _MODULES:
        return get(root)
    if root == "cudnnkit":  # cudnnkit's own device arrays (adapters._raw) name their adapter
        return getattr(type(obj), "__cudnnkit_adapter__", None) and obj.__cudnnkit_adapter__
    return None


def in_use() -> list[Any]:
    """The adapters of the libraries the program has imported already, else (none imported) every installed one
    (imported now). Building a plan, picking a device or counting devices asks these, so a torch program never
    pays CuPy's import (0.1-0.4 s) and the reverse."""
    out = []
    for name in _MODULES:
        if name in _loaded or name in sys.modules:
            try:
                out.append(get(name))
            except ImportError:
                pass
    return out or available()


def first_available() -> Any | None:
    """The adapter that builds and selects devices when no array says which: the first of :func:`in_use`."""
    got = in_use()
    return got[0] if got else None


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


_KDLCPU = 1  # DLPack's device type for host memory


def is_device_array(obj: Any) -> bool:
    """Whether ``obj`` is an array on a CUDA device (``False`` for host data: sequences, NumPy arrays, host
    tensors, CPU DLPack objects). Imports nothing that is not imported already; never raises.

    In order: a ``list``/``tuple``/``range`` or an object with ``__array_interface__`` is host data; an object with
    ``__cuda_array_interface__`` is a device array (also when reading it raises, e.g. a torch tensor that
    requires grad: reading it as an array then says why); an object of a library with an adapter is what that
    adapter's ``is_device_array`` answers (a torch tensor: ``is_cuda``), unless it answers ``None``; an object
    with ``__dlpack_device__`` is a device array unless that names the CPU (or fails); anything else is not."""
    if isinstance(obj, (list, tuple, range)) or hasattr(obj, "__array_interface__"):
        return False
    try:
        if hasattr(obj, "__cuda_array_interface__"):
            return True
    except Exception:  # e.g. a torch tensor that refuses CAI export: let as_view say why
        return True
    try:
        ad = for_object(obj)
    except ImportError:
        ad = None
    ask = getattr(ad, "is_device_array", None)
    if ask is not None:
        answer = ask(obj)
        if answer is not None:
            return bool(answer)
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) != _KDLCPU
        except Exception:
            return False
    return False
