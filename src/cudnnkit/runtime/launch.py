"""Everything an op needs before its cuDNN call, in one place.

``launch, (vx, vw) = prepare(("x", x), ("w", w), stream=stream)`` reads each
array (rejecting host arrays, bad types and ``None`` for a required array with the argument's name), checks
they share one device, takes the first array's library as the one that
allocates outputs and workspace, resolves and checks the stream (the library's current
stream unless ``stream=`` is given), copies inputs whose layout cuDNN cannot take (expanded, overlapping or
reversed views) and gives, on first use of ``launch.handle``, this thread's handle for the
device with that stream set.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from . import adapters, driver
from .arrays import ArrayView, _is_int, as_view, contiguous_strides, is_dense, layout_problem, same_device
from .arrays import _layout_cache as _layouts
from .dtypes import check_scalar, itemsize
from .handle import Handle, get_handle, validate_stream

__all__ = ["Launch", "prepare", "OPTIONAL", "WRITTEN", "ELEMENTWISE"]

_log = logging.getLogger("cudnnkit")

#: :func:`prepare` flag: the array may be ``None`` (an optional argument); its view is then ``None``
OPTIONAL = 1
#: :func:`prepare` flag: the op writes the array in place, so it is never copied; a layout cuDNN cannot take
#: (expanded, overlapping, reversed) is refused naming it
WRITTEN = 2
#: :func:`prepare` flag, with ``WRITTEN``: the op writes each element as a function of that element alone
#: (``set_tensor``, ``scale_tensor``), so the expanded dims of a broadcast view are collapsed to size 1 (each
#: memory location is written once, and every element of the view reads the same result)
ELEMENTWISE = 4
#: :func:`prepare` flag: the op reads the array packed (C-contiguous), so a layout cuDNN cannot take is copied to C
#: order, not into a sibling's layout (which the op would copy again)
PACKED = 8

_INT64_MAX = 2**63 - 1
_CAI_STREAM = "__cuda_array_interface__ stream"


def _describe_bytes(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


@dataclass(slots=True)
class Launch:
    device: int
    adapter: Any  # allocates outputs; None for arrays of a library without an adapter
    stream: int
    #: the names of the arrays the call was given (for messages)
    inputs: tuple[str, ...] = field(default=(), compare=False)

    @property
    def handle(self) -> Handle:
        """This thread's handle for the device, with this launch's stream set on it.

        Created on first use (so an op validates everything before it touches
        cuDNN's device state), and the stream is re-checked on every access:
        another launch on this thread may have switched the shared handle."""
        return get_handle(self.device, self.stream, self.adapter)

    def on_device(self) -> Any:
        """A context making the launch's device current for the cuDNN calls (a no-op when it already is: an
        adapter whose current device is not the thread's, JAX's, always makes it current)."""
        ad = self.adapter
        if ad is None or (getattr(ad, "current_is_thread_device", True) and ad.current_device() == self.device):
            return contextlib.nullcontext()
        return ad.device_guard(self.device)

    def empty(self, shape, dtype: str, strides=None, name: str = "out") -> tuple[Any, ArrayView]:
        """Allocate an output with the inputs' library on the launch's device and stream.

        Refused before the allocator is asked, naming ``name``: a shape that is not a tuple of non-negative
        ints (``TypeError``/``ValueError``) or whose size in bytes does not fit an int64 (``ValueError``). An
        allocation the library cannot satisfy raises ``MemoryError`` naming ``name`` and the size."""
        if self.adapter is None:
            given = ", ".join(self.inputs) or "the inputs"
            hint = f", or pass {name}= yourself" if name.endswith("out") else ""
            raise TypeError(
                f"cannot allocate {name}: the arrays given ({given}) come from a library without a cudnnkit adapter "
                "(bare __cuda_array_interface__ or DLPack objects), and cudnnkit allocates with the inputs' own "
                f"library; pass {self.inputs[0] if self.inputs else 'them'} as a CuPy array or torch tensor{hint}"
            )
        shape = tuple(shape)
        nbytes = _nbytes(shape, dtype, strides, name)
        try:
            arr = self.adapter.empty(shape, dtype, self.device, strides, self.stream)
        except MemoryError as e:
            raise MemoryError(
                f"cannot allocate {name} ({dtype}, shape {shape}, {_describe_bytes(nbytes)}) on cuda:{self.device}"
                f" with {self.adapter.name}: out of memory ({e})"
            ) from e
        return arr, self.adapter.view(arr, name)

    def output(
        self,
        out: Any,
        shape,
        dtype: str,
        *,
        strides=None,
        name: str = "out",
        beta: float = 0.0,
        beta_name: str = "beta",
    ) -> tuple[Any, ArrayView]:
        """The array an op writes: ``out`` checked (shape, dtype, device, layout), or a new one.

        ``beta != 0`` blends into existing contents, so it needs ``out`` (``beta`` is checked by
        :func:`~cudnnkit.runtime.check_scalar` as ``beta_name``). A new array gets ``strides`` (elements) if
        given, else C-contiguous. ``out`` must address each element once: an expanded (stride-0), overlapping
        or reversed (negative-stride) ``out`` is refused with a ``ValueError`` naming ``name``; any other
        strides (gapped, transposed) are the op's to handle. A producer ``stream`` in ``out``'s
        ``__cuda_array_interface__`` is checked and waited for, as :func:`prepare` does for its arrays.
        """
        shape = tuple(shape)
        if out is None:
            if check_scalar(beta, beta_name, dtype=dtype) != 0:
                raise ValueError(f"{beta_name} != 0 blends into an existing output: pass {name}=")
            return self.empty(shape, dtype, strides, name=name)
        v = as_view(out, name)
        if v.readonly:
            raise ValueError(f"{name} is read-only")
        if v.shape != shape or v.dtype != dtype:
            raise ValueError(f"{name} must have shape {shape} and dtype {dtype}, got {v.shape} {v.dtype}")
        if v.device != self.device:
            raise ValueError(f"{name} is on cuda:{v.device} but the inputs are on cuda:{self.device}")
        problem = layout_problem(v.shape, v.strides)
        if problem is not None:
            raise ValueError(
                f"{name} {problem} (shape {v.shape}, strides {v.strides}); an output must address each element "
                "once: pass an array that does not overlap itself"
            )
        if v.stream is not None:  # a CAI v3 producer stream: the launch stream waits for it (after_producer)
            self.after_producer(v.stream, name)
        return out, v

    def after_producer(self, producer: int, name: str) -> None:
        """Order the launch stream after ``producer``, the ``stream`` that argument ``name``'s
        ``__cuda_array_interface__`` (v3) named: work cudnnkit queues from now on waits for what the producer had
        queued (:func:`cudnnkit.runtime.driver.order_after`: an event recorded on the producer and waited on by
        the launch stream; nothing when the two are one stream or the default-stream rules already order them).

        The producer's handle is first checked as :func:`~cudnnkit.runtime.validate_stream` checks it
        (``producer=True``: asked of the CUDA driver, so a garbage handle is refused, naming
        ``"<name>'s __cuda_array_interface__ stream"``, instead of crashing); the launch stream's own handle needs
        no check."""
        if producer == self.stream or (producer in (0, 1) and self.stream in (0, 1)):
            return
        what = f"{name}'s {_CAI_STREAM}"
        h = validate_stream(producer, None, self.device, what, producer=True)
        try:
            driver.order_after(h, self.stream, self.device)
        except driver.DriverUnavailable:
            raise
        except RuntimeError as e:
            raise RuntimeError(f"{what}={h:#x}: cannot order the launch stream {self.stream:#x} after it ({e})") from e

    def contiguous(self, arr: Any, v: ArrayView, name: str, why: str = "is not C-contiguous") -> tuple[Any, ArrayView]:
        """A C-contiguous copy of ``arr`` made on the launch stream, for a call that cannot take its strides.

        The copy is made by ``arr``'s own library (which may differ from the one that allocates the outputs);
        an array of a library without an adapter is handed zero-copy to the launch's library through
        ``__cuda_array_interface__`` first. ``why`` says what cuDNN needs (it goes into the debug log, logger
        ``cudnnkit``, and the error). ``ValueError`` naming the argument when no library can copy it."""
        ad = v.adapter
        if ad is None and self.adapter is not None:
            try:
                arr, ad = self._wrap(self.adapter, arr, name), self.adapter
            except TypeError as e:
                _log.debug("%s", e)
                ad = None
        if ad is None:
            raise ValueError(
                f"{name} {why} (shape {v.shape}, strides {v.strides}) and its library has no cudnnkit "
                "adapter to copy it; pass a C-contiguous array"
            )
        _log.debug("%s %s (shape %s, strides %s): copying", name, why, v.shape, v.strides)
        arr = ad.contiguous(arr, self.stream)
        return arr, ad.view(arr, name)

    def copy(self, dst: Any, src: Any, name: str = "out") -> None:
        """Copy ``src`` into ``dst`` (same shape and dtype, any strides) on the launch stream, by ``dst``'s library.

        ``src`` may come from another library (it is viewed zero-copy as one of ``dst``'s through
        ``__cuda_array_interface__``); ``name`` is ``dst``'s argument name for errors."""
        ad = adapters.for_object(dst)
        if ad is None:
            ad = self.adapter
            if ad is None:
                raise TypeError(f"cannot write {name}: neither it nor the inputs come from a library with an adapter")
            dst = self._wrap(ad, dst, name)
        if adapters.for_object(src) is not ad:
            src = self._wrap(ad, src, name)
        ad.copy(dst, src, self.stream)

    def _wrap(self, ad: Any, obj: Any, name: str) -> Any:
        try:
            return ad.wrap(_without_producer_stream(obj), self.device)
        except Exception as e:
            raise TypeError(
                f"{name}: a {type(obj).__module__}.{type(obj).__name__} cannot be viewed as a {ad.name} array "
                f"({type(e).__name__}: {e}); pass arrays of one library"
            ) from e

    def upload(self, values: Any, name: str = "values") -> tuple[Any, int]:
        """Host values (a NumPy array) copied to a new device array of the inputs' library, queued on the
        launch stream (so work on that stream sees them, and the allocator orders their reuse after it).
        Returns (array, pointer); keep the array alive until the call that reads it is queued."""
        if self.adapter is None:
            raise TypeError(
                f"cannot copy {name} to the device: the inputs come from a library without a cudnnkit "
                f"adapter; pass {name} as a device array of that library instead"
            )
        arr = self.adapter.from_numpy(values, self.device, self.stream)
        return arr, self.adapter.view(arr, name).ptr

    def workspace(self, nbytes: int, zeroed: bool = False) -> tuple[Any, int]:
        """A device buffer of ``nbytes`` from the inputs' allocator; (owner, pointer). (None, 0) for 0 bytes.

        ``zeroed``: set to zero on the launch stream first (``cuMemsetD8Async``), for calls that read parts of
        their workspace they never wrote (cuDNN's RNN cell kernels: compute-sanitizer initcheck, issue 10)."""
        if nbytes <= 0:
            return None, 0
        arr, v = self.empty((int(nbytes),), "uint8", contiguous_strides((int(nbytes),)), name="workspace")
        if zeroed:
            with self.on_device():
                driver.memset_async(v.ptr, int(nbytes), self.stream)
        return arr, v.ptr


class _NoStream:
    """``obj`` seen through its ``__cuda_array_interface__`` less the producer ``stream`` (and its DLPack methods,
    if any, unchanged)."""

    def __init__(self, obj: Any, cai: dict):
        self._obj = obj
        self.__cuda_array_interface__ = cai
        if hasattr(obj, "__dlpack__"):
            self.__dlpack__ = obj.__dlpack__
            self.__dlpack_device__ = obj.__dlpack_device__


def _without_producer_stream(obj: Any) -> Any:
    """``obj`` for an array library to view zero-copy, without the ``stream`` of its ``__cuda_array_interface__``.

    CuPy and torch synchronize on a CAI v3 producer stream when they view such an object, calling the driver with
    the raw handle: a garbage one crashes the process there (issue 10's fuzzer, a CAI ``out`` with stream
    ``0xBAD000``). The producer's stream is not needed here: :func:`prepare` and :meth:`Launch.output` have
    checked it and ordered the launch stream after it (:meth:`Launch.after_producer`), and the copy this view
    is for runs on the launch stream."""
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception:
        return obj
    if not isinstance(cai, dict) or cai.get("stream") is None:
        return obj
    return _NoStream(obj, {k: v for k, v in cai.items() if k != "stream"})


def _nbytes(shape: tuple, dtype: str, strides, name: str) -> int:
    """Bytes an allocation of ``shape`` (and ``strides``, elements) needs; refuses what no allocator can give."""
    for d in shape:
        if not _is_int(d):
            raise TypeError(f"{name}: shape {shape} must hold ints, got {d!r}")
        if d < 0:
            raise ValueError(f"{name}: shape {shape} has a negative dim")
    if strides is None or 0 in shape:
        extent = math.prod(shape)
    else:
        extent = 1 + sum((d - 1) * abs(int(s)) for d, s in zip(shape, strides))
    nbytes = extent * itemsize(dtype)
    if nbytes > _INT64_MAX:
        raise ValueError(
            f"{name} would have shape {shape} ({extent} elements of {dtype}, {nbytes} bytes): larger than any "
            "allocation can be (the byte size overflows int64)"
        )
    return nbytes


def prepare(*named: tuple, stream: Any = None) -> tuple[Launch, list[ArrayView | None]]:
    """Views of the named arrays plus the :class:`Launch` they run with.

    Each argument is ``(name, array)`` for a required input, or ``(name, array, flags)`` with ``flags`` any of
    ``OPTIONAL | WRITTEN | ELEMENTWISE`` (module constants, exported by :mod:`cudnnkit.runtime`)::

        launch, (vx, vw, vhx) = prepare(("x", x), ("w", w), ("hx", hx, OPTIONAL), stream=stream)
        launch, (vy,) = prepare(("y", y, WRITTEN | ELEMENTWISE), stream=stream)  # set_tensor, scale_tensor
        launch, (va, vc) = prepare(("a", a), ("c", c, WRITTEN), stream=stream)  # add_tensor's in-place c

    * ``None`` for an array without ``OPTIONAL``: ``TypeError: x is required (a CUDA array), got None``; an
      optional ``None`` gives a ``None`` view;
    * every array is read by its own library's adapter (or ``__cuda_array_interface__``/DLPack), so arrays of
      different libraries may be mixed in one call; the first array with an adapter decides the library that
      allocates outputs and workspace (:attr:`Launch.adapter`) and whose current stream is used;
    * all arrays must be on one device (``ValueError`` naming both);
    * ``stream``: ``None`` (the allocating library's current stream), a stream object of any library (CuPy,
      torch, anything with ``__cuda_stream__``) or a raw ``cudaStream_t`` int, checked to be a live stream of
      the arrays' device by :func:`~cudnnkit.runtime.validate_stream` (``TypeError``/``ValueError`` naming
      ``stream`` otherwise). With neither ``stream=`` nor an array of a library with an adapter, the launch
      stream is the producer ``stream`` of the first array whose ``__cuda_array_interface__`` (v3) names one
      (1, the legacy default stream, becomes 0; checked as above, naming
      ``"x's __cuda_array_interface__ stream"``), else the legacy default stream 0;
    * every other array whose ``__cuda_array_interface__`` names a producer ``stream`` different from the launch
      stream (also with an adapter or ``stream=``): that handle is checked the same way, naming the array, then
      the launch stream is made to wait for it (:meth:`Launch.after_producer`: an event recorded on the producer
      stream and waited on by the launch stream, as ``cuda.core``'s ``StridedMemoryView`` does; none when the
      default-stream rules already order them). Arrays without one cost nothing;
    * layouts cuDNN cannot take (:func:`~cudnnkit.runtime.arrays.layout_problem`: an expanded stride-0 view, an
      overlapping or a reversed one): an input is copied on the launch stream (debug-logged, logger
      ``cudnnkit``; its view is the copy's) once every array has been read and checked, into the layout of the
      first other array of its shape that is dense and not C order (the call then sees one layout: the express
      path repeats the copy), else (and for a ``PACKED`` array) into C order; a ``WRITTEN`` array is
      refused with a ``ValueError`` naming it (or, ``ELEMENTWISE``, its expanded dims collapsed to size 1).
      Outputs passed as ``out=`` are checked the same way by :meth:`Launch.output`.
    """
    views: list[ArrayView | None] = []
    odd: list[int] | None = None  # arrays whose layout cuDNN cannot take (rare)
    produced: list[int] | None = None  # arrays whose __cuda_array_interface__ names a producer stream (rare)
    for item in named:
        a = item[1]
        if a is None:
            if len(item) == 2 or not item[2] & OPTIONAL:
                raise TypeError(f"{item[0]} is required (a CUDA array), got None")
            views.append(None)
        else:
            v = as_view(a, item[0])
            views.append(v)
            # the cache answers None for a layout known to be fine: no call on the fast path
            if _layouts.peek((v.shape, v.strides), True) is not None and layout_problem(v.shape, v.strides):
                odd = (odd or []) + [len(views) - 1]
            if v.stream is not None:
                produced = (produced or []) + [len(views) - 1]
    device = same_device(*((item[0], v) for item, v in zip(named, views)))
    adapter = next((v.adapter for v in views if v is not None and v.adapter is not None), None)
    stream_name = "stream"
    if stream is None and adapter is None and produced is not None:
        # arrays of a library without an adapter: work on the stream the first one's producer named
        # (``__cuda_array_interface__`` v3 ``stream``; 1 means the legacy default stream, which is 0 to cuDNN)
        stream, stream_name = views[produced[0]].stream, f"{named[produced[0]][0]}'s {_CAI_STREAM}"
        if stream == 1:
            stream = 0
    s = validate_stream(stream, adapter, device, stream_name, producer=stream_name != "stream")
    launch = Launch(device, adapter, s, tuple(item[0] for item, v in zip(named, views) if v is not None))
    if produced is not None:
        for i in produced:
            launch.after_producer(views[i].stream, named[i][0])
    if odd is None:
        return launch, views
    copies = []
    for i in odd:
        item, v = named[i], views[i]
        problem = layout_problem(v.shape, v.strides)
        flags = item[2] if len(item) > 2 else 0
        if not flags & WRITTEN:
            copies.append((i, problem))
            continue
        if flags & ELEMENTWISE:
            v = views[i] = _collapse_expanded(v)
            problem = layout_problem(v.shape, v.strides)
            if problem is None:
                continue
        raise ValueError(
            f"{item[0]} {problem} (shape {v.shape}, strides {v.strides}); it is written in place, so it must "
            "address each element once: pass an array that does not overlap itself"
        )
    for i, problem in copies:
        arr = named[i][1]
        if isinstance(arr, ArrayView):
            arr = arr.owner
        v = views[i]
        packed = len(named[i]) > 2 and named[i][2] & PACKED
        like = _sibling_layout(views, v) if v.adapter is not None and not packed else None
        if like is None:
            _, views[i] = launch.contiguous(arr, v, named[i][0], problem)
            continue
        _log.debug("%s %s (shape %s, strides %s): copying into strides %s", named[i][0], problem, v.shape,
                   v.strides, like)  # fmt: skip
        new = v.adapter.empty(v.shape, v.dtype, device, like, s)
        v.adapter.copy(new, arr, s)
        views[i] = v.adapter.view(new, named[i][0])
    return launch, views


def _sibling_layout(views: list[ArrayView | None], v: ArrayView) -> tuple[int, ...] | None:
    """The strides an input cuDNN cannot take as it is (``v``: expanded, overlapping) is copied into: those of the
    first other array of the call with its shape whose layout is dense and not C order (a ReLU's ``y`` in
    channels-last, for the expanded gradient a mean hands back), so that the call sees one layout and needs no
    second copy; None (C order) otherwise."""
    c_order = contiguous_strides(v.shape)
    for w in views:
        if w is None or w is v or w.shape != v.shape or w.strides == c_order:
            continue
        if layout_problem(w.shape, w.strides) is None and is_dense(w.shape, w.strides):
            return tuple(w.strides)
    return None


def _collapse_expanded(v: ArrayView) -> ArrayView:
    """``v`` with its stride-0 dims made size 1: the memory it addresses, once."""
    shape = tuple(1 if s == 0 else d for d, s in zip(v.shape, v.strides))
    return ArrayView(shape, v.strides, v.dtype, v.device, v.ptr, v.owner, v.adapter, v.readonly, v.stream)
