"""The adapter protocol: what the runtime and the ops ask of an array library.

This module imports no array library; :class:`ArrayAdapter` is what every adapter module (``_cupy``, ``_torch``,
and later ``_jax``) implements, and what tests check them against.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..view import ArrayView

__all__ = ["ArrayAdapter", "MEMBERS", "missing_members", "has_interface"]


@runtime_checkable
class ArrayAdapter(Protocol):
    """One array library, as the runtime and the ops see it.

    **Adding a library** (JAX is planned) means writing one module ``cudnnkit/runtime/adapters/_<lib>.py`` that
    imports the library, defines a class implementing every member below (subclass :class:`ArrayAdapter` so the
    contract is explicit) and a module-level ``ADAPTER`` instance of it, and registering the module in
    ``adapters._MODULES`` under the library's top-level module name (the root of ``type(arr).__module__``, which
    is how :func:`~cudnnkit.runtime.adapters.for_object` picks the adapter without importing anything). No other
    module may import the library.

    Conventions for every member:

    * ``device`` is a CUDA device ordinal (int >= 0); ``dtype`` a canonical cudnnkit dtype name
      (:func:`cudnnkit.runtime.dtypes.canonical`: ``"float32"``, ``"bfloat16"``, ``"int64"``, ``"uint8"``, ...);
      shapes and strides are tuples of ints, strides counted in **elements**, not bytes.
    * ``stream`` is a raw ``cudaStream_t`` as an int, already checked by
      :func:`~cudnnkit.runtime.validate_stream`: 0 and 1 mean the legacy default stream, 2 the per-thread
      default stream, anything else a live stream of ``device``. ``None`` means the library's current stream on
      ``device``. Work an adapter queues (allocation, copies, uploads) goes on that stream, so that the library's
      allocator orders reuse of the memory after the work cudnnkit queues there; nothing is synchronized with the
      host unless the member says so.
    * Arrays handed to an adapter are its own library's (``view``, ``contiguous``, ``copy``'s ``dst``, ``to_numpy``)
      unless the member says otherwise (``wrap``, ``copy``'s ``src`` after ``wrap``).
    * Optional: ``current_is_thread_device = False`` on an adapter whose :meth:`current_device` is not the CUDA
      device current on the calling thread (JAX's is its default device): a launch then always makes its device
      current around the cuDNN calls instead of trusting that it already is (CuPy's and torch's are the thread's).
    """

    #: the library's name, as the user knows it (``"cupy"``, ``"torch"``); used in messages and cache keys
    name: str
    #: the library's top-level module object (``cupy``, ``torch``); tests reach the library through it
    module: Any

    def view(self, obj: Any, name: str) -> ArrayView:
        """An :class:`~cudnnkit.runtime.ArrayView` of ``obj``, an array of this library on a CUDA device (shape,
        element strides, canonical dtype, device ordinal, data pointer, ``owner=obj``, ``adapter=self``).

        ``TypeError`` naming ``name`` (the argument's name) for an object of another type, a host array, a
        non-strided layout or a dtype cuDNN has no name for. Never synchronizes."""
        ...

    def empty(
        self, shape: tuple, dtype: str, device: int, strides: tuple | None = None, stream: int | None = None
    ) -> Any:
        """A new uninitialised array of ``shape`` and ``dtype`` on ``device``, from the library's own allocator
        (the CuPy memory pool, torch's caching allocator), for use on ``stream``.

        ``strides`` (elements, non-negative) gives its layout, C-contiguous when ``None``; the allocation covers
        the extent the strides reach. The library's out-of-memory error is raised as ``MemoryError``."""
        ...

    def wrap(self, obj: Any, device: int) -> Any:
        """A zero-copy array of this library over ``obj``, a CUDA array of another library (or a bare
        ``__cuda_array_interface__``/DLPack object) on ``device``; ``obj`` itself if it is already one.

        Used to copy between arrays of mixed libraries. The runtime strips a CAI producer ``stream`` before
        calling it (it orders that stream itself), so an adapter need not synchronize on one. Any exception
        means "cannot be viewed" (the runtime turns it into a ``TypeError`` naming the argument)."""
        ...

    def contiguous(self, arr: Any, stream: int | None = None) -> Any:
        """A C-contiguous copy of ``arr`` (same shape and dtype, on its device) made on ``stream``, or ``arr``
        itself if it already is C-contiguous."""
        ...

    def copy(self, dst: Any, src: Any, stream: int | None = None) -> None:
        """Copy ``src`` into ``dst`` (same shape and dtype, any strides, both arrays of this library on one device)
        device to device, queued on ``stream``; returns once queued."""
        ...

    def from_numpy(self, a: Any, device: int, stream: int | None = None) -> Any:
        """A new device array on ``device`` holding the values of host array ``a`` (a NumPy array or anything
        ``numpy.asarray`` takes; ``ml_dtypes`` bfloat16 included), the upload queued on ``stream``."""
        ...

    def to_numpy(self, arr: Any) -> Any:
        """The values of device array ``arr`` as a NumPy array (bfloat16 as float32 where the library has no NumPy
        bfloat16). Synchronizes: waits for the work queued on the library's current stream."""
        ...

    def key(self, obj: Any) -> tuple | None:
        """The express path's ``(key, data pointer, adapter)`` of one of the library's arrays (see
        :mod:`cudnnkit.runtime.adapters`): ``key`` is hashable and holds the dtype, shape, strides and device;
        None for an array the express path cannot take. Called on every express call: cheap, never raises."""
        ...

    def current_stream(self, device: int) -> int:
        """The library's current stream on ``device``, as a raw ``cudaStream_t`` int (0 for the legacy default
        stream). Called on every op, so it should be cheap (no stream object built where avoidable)."""
        ...

    def current_device(self) -> int:
        """The library's current CUDA device ordinal for this thread."""
        ...

    def device_guard(self, device: int) -> AbstractContextManager[Any]:
        """A context manager that makes ``device`` the current device (for the library and the CUDA runtime) and
        restores the previous one on exit."""
        ...

    def pointer_device(self, ptr: int) -> int | None:
        """The device ordinal that device pointer ``ptr`` belongs to, if the library can tell (without
        dereferencing it); ``None`` if it cannot or ``ptr`` is not device memory. Never raises."""
        ...

    def is_device_array(self, obj: Any) -> bool | None:
        """Whether ``obj``, an object of this library's module (asked only for those), lives on a CUDA device:
        ``True``/``False`` for the library's arrays (a torch CPU tensor is ``False``), ``None`` for an object the
        library does not consider an array (the generic ``__cuda_array_interface__``/DLPack rules then decide).
        Must not raise, copy or synchronize."""
        ...

    def refuse_special_stream(self, stream: int, name: str = "stream") -> None:
        """Raise ``ValueError`` naming ``name`` if the library cannot allocate or queue work on special stream
        handle ``stream`` (0, 1 or 2; torch has no stream object for 2, ``cudaStreamPerThread``); return
        ``None`` if it can (an adapter that takes all three does nothing)."""
        ...

    def version(self) -> str:
        """The library's version string (``cupy.__version__``, ``torch.__version__``)."""
        ...

    def device_count(self) -> int:
        """How many CUDA devices the library sees; 0 (not an exception) when it sees none or has no CUDA."""
        ...

    def device_info(self, i: int) -> tuple[str, tuple[int, int]]:
        """``(name, (major, minor))`` of device ``i``: its marketing name and compute capability."""
        ...

    def synchronize(self, device: int) -> None:
        """Wait on the host until all work queued on ``device`` (every stream of the library) has finished."""
        ...


#: the names every adapter must provide (the protocol's attributes and methods), for conformance checks
MEMBERS: tuple[str, ...] = tuple(
    sorted(
        {n for n in ArrayAdapter.__dict__ if not n.startswith("_") and callable(ArrayAdapter.__dict__[n])}
        | set(ArrayAdapter.__annotations__)
    )
)


def missing_members(cls: type) -> list[str]:
    """The members of :class:`ArrayAdapter` that class ``cls`` does not define itself (or through a base other
    than the protocol): a subclass of the protocol inherits its stubs, which ``isinstance`` cannot tell apart."""
    out = []
    for n in MEMBERS:
        owner = next((k for k in cls.__mro__ if n in k.__dict__), None)
        if owner is None or owner is ArrayAdapter or owner is Protocol or owner is object:
            out.append(n)
    return out


def has_interface(obj: Any) -> bool:
    """Whether ``obj`` offers a ``__cuda_array_interface__`` an adapter's ``wrap`` can try: False where reading it
    raises (a torch float8 tensor's raises ``KeyError``, which ``hasattr`` does not swallow), so ``wrap`` goes on
    to DLPack."""
    try:
        return hasattr(obj, "__cuda_array_interface__")
    except Exception:
        return False
