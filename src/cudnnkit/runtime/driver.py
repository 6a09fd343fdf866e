"""A few CUDA driver queries (``libcuda.so.1`` through ctypes): is this int a live stream, where is this pointer.

cudnnkit checks raw handles that users pass (``stream=0x...``, raw data pointers in graph bindings) before they
reach cuDNN or an array library, because a bad one crashes the process there. The driver API is what
``cuda.bindings.driver`` wraps; calling it directly needs no extra package and is present wherever work can run.

* :func:`stream_device` -- ``cuStreamGetFlags`` (is it a stream?) then ``cuStreamGetDevice`` (CUDA 12.8+ drivers)
  or ``cuStreamGetCtx`` + ``cuCtxGetDevice`` (which device?). The driver dereferences a stream handle without
  validating it (a garbage handle segfaults inside ``cuStreamGetFlags``), so the handle's first bytes are first
  checked to be readable memory of this process (a ``write`` of them into a pipe: the kernel answers ``EFAULT``
  for an unmapped address instead of faulting). What remains unguarded is a readable address that is not a
  stream (a pointer to some other host object): the driver may misread it.
* :func:`memset_async` -- ``cuMemsetD8Async``: zero a device buffer on a stream (a workspace that cuDNN reads
  before writing, see :meth:`cudnnkit.runtime.Launch.workspace`).
* :func:`pointer_info` -- ``cuPointerGetAttributes`` (memory type, device, allocation range): it never
  dereferences the pointer and answers for any value.
* :class:`DeviceValues` -- ``cuMemAllocAsync`` + ``cuMemcpyHtoDAsync``: a few host values (RNN sequence lengths)
  on the device in memory that no array library owns, so no framework pool (torch's CUDA-graph pools) holds a
  cached buffer; :func:`stream_capturing` (``cuStreamIsCapturing``) tells when such an upload cannot be made.
* the default memory pool of a device cudnnkit allocates from keeps up to ``CUDNNKIT_POOL_KEEP_BYTES`` (1 GiB)
  for reuse instead of releasing everything at each synchronization (:func:`_keep_pool`).
* :class:`HeldMemory` and :func:`relaxed_capture` -- ``cuMemAlloc`` outside any pool, made while a stream of this
  thread may be capturing (``cuThreadExchangeStreamCaptureMode`` to relaxed around it): memory a captured CUDA graph
  keeps addressing on every replay (:class:`cudnnkit.runtime.adapters._raw.Arena`).
* :func:`order_after` -- ``cuEventRecord`` on one stream, ``cuStreamWaitEvent`` on another: work queued later on
  the consumer waits for what the producer had queued (a ``__cuda_array_interface__`` v3 producer ``stream``,
  :func:`cudnnkit.runtime.prepare`), without blocking the host.

Without a driver (``libcuda.so.1`` missing) :func:`available` is False and every function here except
:func:`readable` raises :class:`DriverUnavailable`; callers refuse what they cannot check.

Tests replace :func:`stream_device` / :func:`pointer_info` / :func:`order_after` (module attributes, looked up on
every call) to fake a driver, or ``_load`` to fake ``libcuda`` itself.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import NamedTuple

__all__ = [
    "DriverUnavailable",
    "PointerInfo",
    "available",
    "readable",
    "stream_device",
    "pointer_info",
    "memset_async",
    "order_after",
    "stream_capturing",
    "relaxed_capture",
    "DeviceMemory",
    "HeldMemory",
    "DeviceValues",
    "copy_async",
    "upload_async",
    "download",
    "synchronize",
    "device_count",
    "device_info",
    "pushed",
]


class DriverUnavailable(RuntimeError):
    """The CUDA driver library could not be loaded (or initialised), so a raw handle cannot be checked."""


class PointerInfo(NamedTuple):
    """What the driver knows of an address: ``kind`` is ``"device"``, ``"managed"``, ``"host"`` (page-locked
    host memory registered with CUDA) or ``"unknown"`` (not CUDA memory: pageable host memory or garbage);
    ``device`` the ordinal (-1 if unknown); ``base``/``size`` the allocation holding it (0, 0 if unknown)."""

    kind: str
    device: int
    base: int
    size: int


_CUDA_SUCCESS = 0
_CUDA_ERROR_INVALID_CONTEXT = 201
# CUpointer_attribute
_MEMORY_TYPE, _IS_MANAGED, _DEVICE_ORDINAL, _RANGE_START, _RANGE_SIZE = 2, 8, 9, 11, 12
# CUmemorytype
_HOST, _DEVICE, _ARRAY, _UNIFIED = 1, 2, 3, 4
_CU_EVENT_DISABLE_TIMING = 0x2
_CU_STREAM_NON_BLOCKING = 0x1
# the special stream handles: CU_STREAM_LEGACY (0, the NULL stream, is the legacy default stream too when called
# through the non-``_ptsz`` entry points, as here) and CU_STREAM_PER_THREAD
_LEGACY, _PER_THREAD = 1, 2

_lock = threading.Lock()
_cuda: ctypes.CDLL | None = None
_failed: str | None = None
_pipe: tuple[int, int, int] | None = None  # read end, write end, owning pid
_libc: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _cuda, _failed
    if _cuda is not None:
        return _cuda
    with _lock:
        if _cuda is None and _failed is None:
            try:
                cuda = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                _failed = f"libcuda.so.1 not found ({e})"
            else:
                cuda.cuInit.argtypes = [ctypes.c_uint]
                rc = cuda.cuInit(0)
                if rc != _CUDA_SUCCESS:
                    _failed = f"cuInit failed with CUresult {rc}"
                else:
                    _declare(cuda)
                    _cuda = cuda
    if _cuda is None:
        raise DriverUnavailable(f"the CUDA driver is not available: {_failed}")
    return _cuda


def _declare(cuda: ctypes.CDLL) -> None:
    vp, uint, intp = ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_int)
    cuda.cuStreamGetFlags.argtypes = [vp, ctypes.POINTER(ctypes.c_uint)]
    cuda.cuStreamGetCtx.argtypes = [vp, ctypes.POINTER(vp)]
    cuda.cuCtxPushCurrent_v2.argtypes = [vp]
    cuda.cuCtxPopCurrent_v2.argtypes = [ctypes.POINTER(vp)]
    cuda.cuCtxGetDevice.argtypes = [intp]
    if hasattr(cuda, "cuStreamGetDevice"):
        cuda.cuStreamGetDevice.argtypes = [vp, intp]
    cuda.cuPointerGetAttributes.argtypes = [uint, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(vp), ctypes.c_uint64]
    cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
    cuda.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
    cuda.cuMemsetD8Async.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t, vp]
    cuda.cuEventCreate.argtypes = [ctypes.POINTER(vp), uint]
    cuda.cuEventRecord.argtypes = [vp, vp]
    cuda.cuStreamWaitEvent.argtypes = [vp, vp, uint]
    cuda.cuEventDestroy_v2.argtypes = [vp]
    cuda.cuStreamIsCapturing.argtypes = [vp, intp]
    cuda.cuMemAllocAsync.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, vp]
    cuda.cuDeviceGetDefaultMemPool.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
    cuda.cuMemPoolGetAttribute.argtypes = [vp, ctypes.c_int, vp]
    cuda.cuMemPoolSetAttribute.argtypes = [vp, ctypes.c_int, vp]
    cuda.cuMemFreeAsync.argtypes = [ctypes.c_uint64, vp]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuThreadExchangeStreamCaptureMode.argtypes = [intp]
    cuda.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, vp, ctypes.c_size_t, vp]
    cuda.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, vp]
    cuda.cuMemcpyDtoH_v2.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t]
    cuda.cuStreamSynchronize.argtypes = [vp]
    cuda.cuEventQuery.argtypes = [vp]
    cuda.cuDeviceGetName.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    cuda.cuDeviceGetAttribute.argtypes = [intp, ctypes.c_int, ctypes.c_int]


def available() -> bool:
    """Whether the CUDA driver loads and initialises in this process (checked once)."""
    try:
        _load()
    except DriverUnavailable:
        return False
    return True


def readable(address: int, nbytes: int = 8) -> bool:
    """Whether ``nbytes`` at ``address`` are readable memory of this process, asked of the kernel (never read
    directly, so an unmapped address answers False instead of crashing). True where this cannot be asked
    (no ``libc``/pipes)."""
    global _pipe, _libc
    if not 0 < address < 2**64 - nbytes:
        return False
    with _lock:
        if _pipe is None or _pipe[2] != os.getpid():  # a forked child makes its own pipe
            try:
                _libc = ctypes.CDLL(None, use_errno=True)
                _libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
                _libc.write.restype = ctypes.c_ssize_t
                r, w = os.pipe()
                os.set_blocking(r, False)
                os.set_blocking(w, False)
                _pipe = (r, w, os.getpid())
            except (OSError, AttributeError):
                return True
        r, w, _ = _pipe
        n = _libc.write(w, address, nbytes)
        if n > 0:
            try:
                os.read(r, 4096)
            except BlockingIOError:
                pass
        return n == nbytes


def stream_device(handle: int) -> int | None:
    """The device ordinal of the live CUDA stream ``handle`` (a ``CUstream`` as int), or None if it is not one.

    ``handle`` must not be 0, 1 or 2 (the default-stream handles, which every device has). Raises
    :class:`DriverUnavailable` without a driver."""
    cuda = _load()
    if not readable(handle):
        return None
    flags = ctypes.c_uint()
    if cuda.cuStreamGetFlags(ctypes.c_void_p(handle), ctypes.byref(flags)) != _CUDA_SUCCESS:
        return None
    dev = ctypes.c_int(-1)
    if hasattr(cuda, "cuStreamGetDevice"):
        if cuda.cuStreamGetDevice(ctypes.c_void_p(handle), ctypes.byref(dev)) == _CUDA_SUCCESS:
            return dev.value
    ctx = ctypes.c_void_p()
    if cuda.cuStreamGetCtx(ctypes.c_void_p(handle), ctypes.byref(ctx)) != _CUDA_SUCCESS or not ctx.value:
        return None
    if cuda.cuCtxPushCurrent_v2(ctx) != _CUDA_SUCCESS:
        return None
    try:
        rc = cuda.cuCtxGetDevice(ctypes.byref(dev))
    finally:
        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    return dev.value if rc == _CUDA_SUCCESS else None


def pointer_info(ptr: int, device: int | None = None) -> PointerInfo:
    """What the driver knows of address ``ptr`` (``cuPointerGetAttributes``; never dereferences it).

    ``device``: the device the caller expects; its primary context is made current for the query if the driver
    asks for a context. Raises :class:`DriverUnavailable` without a driver."""
    cuda = _load()
    if not 0 < ptr < 2**64:
        return PointerInfo("unknown", -1, 0, 0)
    mtype, managed, dev = ctypes.c_uint(0), ctypes.c_int(0), ctypes.c_int(-1)
    start, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    attrs = (ctypes.c_int * 5)(_MEMORY_TYPE, _IS_MANAGED, _DEVICE_ORDINAL, _RANGE_START, _RANGE_SIZE)
    data = (ctypes.c_void_p * 5)(*(ctypes.addressof(x) for x in (mtype, managed, dev, start, size)))
    rc = cuda.cuPointerGetAttributes(5, attrs, data, ptr)
    if rc == _CUDA_ERROR_INVALID_CONTEXT and device is not None and device >= 0:
        ctx = ctypes.c_void_p()
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == _CUDA_SUCCESS:
            try:
                if cuda.cuCtxPushCurrent_v2(ctx) == _CUDA_SUCCESS:
                    try:
                        rc = cuda.cuPointerGetAttributes(5, attrs, data, ptr)
                    finally:
                        cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            finally:
                cuda.cuDevicePrimaryCtxRelease_v2(device)
    if rc != _CUDA_SUCCESS:
        return PointerInfo("unknown", -1, 0, 0)
    if managed.value:
        kind = "managed"
    elif mtype.value == _DEVICE:
        kind = "device"
    elif mtype.value == _HOST:
        kind = "host"
    else:
        return PointerInfo("unknown", -1, 0, 0)
    return PointerInfo(kind, dev.value, start.value, size.value)


def memset_async(ptr: int, nbytes: int, stream: int, value: int = 0) -> None:
    """Set ``nbytes`` of device memory at ``ptr`` to ``value`` (a byte), queued on ``stream`` (a ``CUstream`` as
    int; 0 is the legacy default stream). The caller's device must be current. Raises :class:`DriverUnavailable`
    without a driver and ``RuntimeError`` when the driver refuses."""
    cuda = _load()
    rc = cuda.cuMemsetD8Async(ptr, value, nbytes, ctypes.c_void_p(stream or None))
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"cuMemsetD8Async of {nbytes} bytes at {ptr:#x} failed with CUresult {rc}")


_contexts: dict[int, int] = {}  # device -> its primary context, retained once and kept for the process
_events: dict[int, list[int]] = {}  # device -> idle events (created with CU_EVENT_DISABLE_TIMING)
_EVENTS_KEPT = 32  # idle events kept per device; more (many threads at once) are destroyed after use


def _primary_context(cuda: ctypes.CDLL, device: int) -> int:
    ctx = _contexts.get(device)
    if ctx is None:
        h = ctypes.c_void_p()
        rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(h), device)
        if rc != _CUDA_SUCCESS or not h.value:
            raise RuntimeError(f"cuDevicePrimaryCtxRetain of cuda:{device} failed with CUresult {rc}")
        with _lock:
            ctx = _contexts.setdefault(device, h.value)
        if ctx != h.value:  # another thread retained it first: keep one reference
            cuda.cuDevicePrimaryCtxRelease_v2(device)
    return ctx


def _synchronizes_with_legacy(cuda: ctypes.CDLL, stream: int) -> bool:
    """Whether ``stream`` (not 0/1) is a blocking stream, which the legacy default stream synchronizes with
    implicitly (the per-thread default stream 2 is one; a stream created ``CU_STREAM_NON_BLOCKING`` is not)."""
    if stream == _PER_THREAD:
        return True
    flags = ctypes.c_uint()
    if cuda.cuStreamGetFlags(ctypes.c_void_p(stream), ctypes.byref(flags)) != _CUDA_SUCCESS:
        return False  # cannot tell: order it explicitly
    return not flags.value & _CU_STREAM_NON_BLOCKING


def order_after(producer: int, consumer: int, device: int) -> bool:
    """Make work queued on stream ``consumer`` from now on wait for the work already queued on stream
    ``producer`` (both ``CUstream`` handles as ints, of ``device``'s primary context, already checked by
    :func:`~cudnnkit.runtime.validate_stream`); the host does not wait. Returns whether a wait was queued.

    This is how a ``__cuda_array_interface__`` v3 consumer honours the producer's ``stream`` (as ``cuda.core``'s
    ``StridedMemoryView`` does): an event recorded on the producer, waited on by the consumer. Nothing is queued
    when the stream semantics already order the two:

    * ``producer == consumer`` (0 and 1 count as one stream: CAI v3 names the legacy default stream 1 and
      disallows 0, which is taken as the legacy default stream, what 0 means to the driver API);
    * one is the legacy default stream (0/1) and the other the per-thread default stream (2): they synchronize
      with each other;
    * one is the legacy default stream and the other a blocking stream (created without
      ``CU_STREAM_NON_BLOCKING``, asked of ``cuStreamGetFlags``): the legacy default stream waits for, and is
      waited for by, every blocking stream of its context.

    Otherwise (two distinct streams, or the legacy default stream and a non-blocking stream such as torch's
    side streams): ``cuEventRecord(event, producer)`` then ``cuStreamWaitEvent(consumer, event)`` with the device's
    primary context pushed around them (``cuCtxPushCurrent`` / ``cuCtxPopCurrent``; the context is retained once
    per device). Events (``CU_EVENT_DISABLE_TIMING``) come from a per-device pool: ``cuEventCreate`` only when
    the pool is empty, and an event is returned to it right after ``cuStreamWaitEvent``, which may then record
    again without affecting the wait already queued.

    Only producer-before-consumer order is made; work the producer queues later is not ordered after the
    consumer's (the CAI v3 contract: the producer's later use is its own business). Raises
    :class:`DriverUnavailable` without a driver and ``RuntimeError`` when the driver refuses (e.g. a stream of
    another context)."""
    p = _LEGACY if producer == 0 else producer
    c = _LEGACY if consumer == 0 else consumer
    if p == c:
        return False
    cuda = _load()
    if p == _LEGACY and _synchronizes_with_legacy(cuda, c):
        return False
    if c == _LEGACY and _synchronizes_with_legacy(cuda, p):
        return False
    with _pushed(cuda, device):
        pool = _events.setdefault(device, [])
        try:
            ev = pool.pop()
        except IndexError:
            h = ctypes.c_void_p()
            rc = cuda.cuEventCreate(ctypes.byref(h), _CU_EVENT_DISABLE_TIMING)
            if rc != _CUDA_SUCCESS:
                raise RuntimeError(f"cuEventCreate failed with CUresult {rc}") from None
            ev = h.value
        rc = cuda.cuEventRecord(ctypes.c_void_p(ev), ctypes.c_void_p(producer or None))
        what = f"cuEventRecord on stream {producer:#x}"
        if rc == _CUDA_SUCCESS:
            rc = cuda.cuStreamWaitEvent(ctypes.c_void_p(consumer or None), ctypes.c_void_p(ev), 0)
            what = f"cuStreamWaitEvent on stream {consumer:#x}"
        if rc == _CUDA_SUCCESS and len(pool) < _EVENTS_KEPT:
            pool.append(ev)
        else:
            cuda.cuEventDestroy_v2(ctypes.c_void_p(ev))
        if rc != _CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed with CUresult {rc}")
    return True


def stream_capturing(stream: int, device: int) -> bool:
    """Whether ``stream`` (a ``CUstream`` as int of ``device``'s primary context) is capturing a CUDA graph now
    (``cuStreamIsCapturing``; the legacy default stream 0 answers for itself)."""
    cuda = _load()
    status = ctypes.c_int()
    with _pushed(cuda, device):
        rc = cuda.cuStreamIsCapturing(ctypes.c_void_p(stream or None), ctypes.byref(status))
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamIsCapturing on stream {stream:#x} failed with CUresult {rc}")
    return status.value != 0  # CU_STREAM_CAPTURE_STATUS_NONE is 0; ACTIVE and INVALIDATED both mean "capturing"


_CU_STREAM_CAPTURE_MODE_RELAXED = 2


class relaxed_capture:
    """This thread's stream-capture interaction mode set to relaxed around a block
    (``cuThreadExchangeStreamCaptureMode``), then restored: calls the driver calls "potentially unsafe" during a
    capture (``cuMemAlloc``, a module load, a handle made on first use) are then allowed while a stream of this thread
    captures, instead of invalidating that capture. Work queued on the capturing stream is still captured."""

    __slots__ = ("cuda", "mode")

    def __init__(self) -> None:
        self.cuda, self.mode = _load(), ctypes.c_int(_CU_STREAM_CAPTURE_MODE_RELAXED)

    def __enter__(self) -> None:
        rc = self.cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(self.mode))
        if rc != _CUDA_SUCCESS:
            raise RuntimeError(f"cuThreadExchangeStreamCaptureMode failed with CUresult {rc}")

    def __exit__(self, *exc: object) -> None:
        self.cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(self.mode))  # the previous mode back


class _pushed:
    """``device``'s primary context made current around a block (``cuCtxPushCurrent`` / ``cuCtxPopCurrent``)."""

    __slots__ = ("cuda", "device")

    def __init__(self, cuda: ctypes.CDLL, device: int):
        self.cuda, self.device = cuda, device

    def __enter__(self) -> None:
        ctx = _primary_context(self.cuda, self.device)
        rc = self.cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(ctx))
        if rc != _CUDA_SUCCESS:
            raise RuntimeError(f"cuCtxPushCurrent of cuda:{self.device}'s primary context failed with CUresult {rc}")

    def __exit__(self, *exc: object) -> None:
        self.cuda.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
#: the bytes a device's default memory pool keeps for reuse once cudnnkit allocates from it (see :func:`_keep_pool`)
POOL_KEEP_BYTES = int(os.environ.get("CUDNNKIT_POOL_KEEP_BYTES", str(1 << 30)))
_pools_kept: set[int] = set()


def _keep_pool(cuda: ctypes.CDLL, device: int) -> None:
    """Once per device (its primary context current): raise the default memory pool's release threshold from the
    driver's default, 0, to :data:`POOL_KEEP_BYTES` (``CUDNNKIT_POOL_KEEP_BYTES``; 0 leaves the pool alone).

    At threshold 0 the pool gives its memory back to the system at every synchronization, so the next
    ``cuMemAllocAsync`` maps it anew: 167 us per allocation under cProfile on the H200 for a jitted JAX softmax's
    output (XLA synchronizes its stream between calls), where a kept pool answers from its free list in a few
    microseconds. A threshold someone already set (not 0) is left as it is; a driver that refuses the query leaves
    the pool alone."""
    if device in _pools_kept:
        return
    _pools_kept.add(device)
    if POOL_KEEP_BYTES <= 0:
        return
    pool = ctypes.c_void_p()
    if cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) != _CUDA_SUCCESS or not pool.value:
        return
    now = ctypes.c_uint64()
    if cuda.cuMemPoolGetAttribute(pool, _CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, ctypes.byref(now)) != _CUDA_SUCCESS:
        return
    if now.value == 0:
        keep = ctypes.c_uint64(POOL_KEEP_BYTES)
        cuda.cuMemPoolSetAttribute(pool, _CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, ctypes.byref(keep))


class DeviceMemory:
    """``nbytes`` of new device memory of ``device`` for work on ``stream``, from the device's default CUDA memory
    pool (``cuMemAllocAsync`` on ``stream``), owned by no array library. ``ptr`` is the address.

    :meth:`free` returns it: ``cuMemFreeAsync`` on ``stream`` when the caller names that same stream (ordered after
    the work queued on it, no host wait), else ``cuMemFree`` (which waits for the device: the original stream may
    be gone). Collected unfreed, it is freed stream-ordered on its own stream when ``ordered`` (temporaries of a
    call on a stream that outlives them: XLA's), else with ``cuMemFree`` (a cache entry whose stream may be gone);
    a refusal then (a driver shut down, a capture that forbids it) leaks it quietly."""

    __slots__ = ("ptr", "nbytes", "device", "stream", "ordered", "__weakref__")

    def __init__(self, nbytes: int, device: int, stream: int, *, ordered: bool = True):
        self.ptr, self.nbytes, self.device, self.stream = 0, int(nbytes), int(device), int(stream)
        self.ordered = bool(ordered)
        cuda = _load()
        got = ctypes.c_uint64()
        with _pushed(cuda, self.device):
            if self.device not in _pools_kept:
                _keep_pool(cuda, self.device)
            rc = cuda.cuMemAllocAsync(ctypes.byref(got), max(self.nbytes, 1), ctypes.c_void_p(stream or None))
        if rc != _CUDA_SUCCESS:
            raise MemoryError(f"cuMemAllocAsync of {self.nbytes} bytes on cuda:{device} failed with CUresult {rc}")
        self.ptr = got.value

    def free(self, stream: int | None = None) -> None:
        """Return the memory (once): stream-ordered when ``stream`` is the one it was made on, else waiting."""
        ptr, self.ptr = self.ptr, 0
        if not ptr:
            return
        cuda = _load()
        with _pushed(cuda, self.device):
            if stream is not None and int(stream) == self.stream:
                rc = cuda.cuMemFreeAsync(ptr, ctypes.c_void_p(self.stream or None))
            else:
                rc = cuda.cuMemFree_v2(ptr)
        if rc != _CUDA_SUCCESS:
            raise RuntimeError(f"freeing {self.nbytes} device bytes at {ptr:#x} failed with CUresult {rc}")

    def __del__(self) -> None:
        try:
            self.free(self.stream if self.ordered else None)
        except Exception:  # interpreter shutdown, or a capture that forbids cuMemFree: leak these bytes
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.nbytes} bytes at {self.ptr:#x} on cuda:{self.device})"


class HeldMemory:
    """``nbytes`` of device memory of ``device`` from ``cuMemAlloc`` (no pool, no stream), allocated in relaxed
    capture mode (:class:`relaxed_capture`) so that it can be made while this thread's stream captures a CUDA graph:
    the graph then addresses it on every replay, so its owner keeps it as long as such a graph may run. ``free()``
    (or collection) returns it with ``cuMemFree``, which waits for the device."""

    __slots__ = ("ptr", "nbytes", "device", "__weakref__")

    def __init__(self, nbytes: int, device: int):
        self.ptr, self.nbytes, self.device = 0, int(nbytes), int(device)
        cuda = _load()
        got = ctypes.c_uint64()
        with _pushed(cuda, self.device), relaxed_capture():
            rc = cuda.cuMemAlloc_v2(ctypes.byref(got), max(self.nbytes, 1))
        if rc != _CUDA_SUCCESS:
            raise MemoryError(f"cuMemAlloc of {self.nbytes} bytes on cuda:{device} failed with CUresult {rc}")
        self.ptr = got.value

    def free(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr:
            cuda = _load()
            with _pushed(cuda, self.device):
                cuda.cuMemFree_v2(ptr)

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # interpreter shutdown: the process's memory goes with it
            pass

    def __repr__(self) -> str:
        return f"HeldMemory({self.nbytes} bytes at {self.ptr:#x} on cuda:{self.device})"


class DeviceValues(DeviceMemory):
    """Host bytes (a C-contiguous NumPy array) copied to new :class:`DeviceMemory` of ``device``, queued on
    ``stream`` (``cuMemcpyHtoDAsync``): work queued on that stream afterwards reads the values. A cache may keep it
    across calls that a framework captures into a CUDA graph (torch's ``reduce-overhead`` pools refuse cached
    tensors they did not hand out as outputs); collected, it is freed with ``cuMemFree`` (its stream may be gone).
    Must not be made while ``stream`` captures (the copy reads pageable host memory): check
    :func:`stream_capturing` first."""

    __slots__ = ("event",)

    def __init__(self, values, device: int, stream: int):
        import numpy as np

        host = np.ascontiguousarray(values)
        self.event = 0
        super().__init__(host.nbytes, device, stream, ordered=False)
        cuda = _load()
        ev = ctypes.c_void_p()
        with _pushed(cuda, self.device):
            rc = cuda.cuMemcpyHtoDAsync_v2(
                self.ptr, host.ctypes.data_as(ctypes.c_void_p), self.nbytes, ctypes.c_void_p(stream or None)
            )
            if rc == _CUDA_SUCCESS:  # marks the upload's completion, for readers on other streams (ready())
                rc = cuda.cuEventCreate(ctypes.byref(ev), _CU_EVENT_DISABLE_TIMING)
                if rc == _CUDA_SUCCESS:
                    self.event = ev.value or 0
                    rc = cuda.cuEventRecord(ctypes.c_void_p(self.event), ctypes.c_void_p(stream or None))
        if rc != _CUDA_SUCCESS:
            self.free()
            raise RuntimeError(f"uploading {self.nbytes} bytes to cuda:{device} failed with CUresult {rc}")

    def ready(self) -> bool:
        """Whether the upload has completed on the device (``cuEventQuery``): then any stream may read it."""
        if not self.event:
            return False
        cuda = _load()
        with _pushed(cuda, self.device):
            return cuda.cuEventQuery(ctypes.c_void_p(self.event)) == _CUDA_SUCCESS

    def free(self, stream: int | None = None) -> None:
        ev, self.event = getattr(self, "event", 0), 0
        if ev:
            cuda = _load()
            with _pushed(cuda, self.device):
                cuda.cuEventDestroy_v2(ctypes.c_void_p(ev))
        super().free(stream)


def copy_async(dst: int, src: int, nbytes: int, stream: int, device: int) -> None:
    """``nbytes`` from device address ``src`` to ``dst``, queued on ``stream`` (``cuMemcpyDtoDAsync``)."""
    cuda = _load()
    with _pushed(cuda, device):
        rc = cuda.cuMemcpyDtoDAsync_v2(dst, src, nbytes, ctypes.c_void_p(stream or None))
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"cuMemcpyDtoDAsync of {nbytes} bytes failed with CUresult {rc}")


def upload_async(dst: int, host: int, nbytes: int, stream: int, device: int) -> None:
    """``nbytes`` from host address ``host`` to device address ``dst``, queued on ``stream``."""
    cuda = _load()
    with _pushed(cuda, device):
        rc = cuda.cuMemcpyHtoDAsync_v2(dst, ctypes.c_void_p(host), nbytes, ctypes.c_void_p(stream or None))
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"cuMemcpyHtoDAsync of {nbytes} bytes failed with CUresult {rc}")


def download(host: int, src: int, nbytes: int, stream: int, device: int) -> None:
    """``nbytes`` from device address ``src`` to host address ``host`` after the work queued on ``stream``
    (``cuStreamSynchronize`` then ``cuMemcpyDtoH``): returns when the bytes are on the host."""
    cuda = _load()
    with _pushed(cuda, device):
        rc = cuda.cuStreamSynchronize(ctypes.c_void_p(stream or None))
        if rc == _CUDA_SUCCESS:
            rc = cuda.cuMemcpyDtoH_v2(ctypes.c_void_p(host), src, nbytes)
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"copying {nbytes} bytes to the host failed with CUresult {rc}")


def synchronize(device: int) -> None:
    """Wait until every stream of ``device``'s primary context is idle (``cuCtxSynchronize``)."""
    cuda = _load()
    with _pushed(cuda, device):
        rc = cuda.cuCtxSynchronize()
    if rc != _CUDA_SUCCESS:
        raise RuntimeError(f"cuCtxSynchronize on cuda:{device} failed with CUresult {rc}")


def device_count() -> int:
    """How many CUDA devices the driver sees (0 without a driver)."""
    try:
        cuda = _load()
    except DriverUnavailable:
        return 0
    n = ctypes.c_int()
    return n.value if cuda.cuDeviceGetCount(ctypes.byref(n)) == _CUDA_SUCCESS else 0


def device_info(i: int) -> tuple[str, tuple[int, int]]:
    """``(name, (major, minor))`` of device ``i`` (``cuDeviceGetName``, ``cuDeviceGetAttribute``)."""
    cuda = _load()
    buf = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(buf, 256, i)
    cc = []
    for attr in (75, 76):  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
        v = ctypes.c_int()
        cuda.cuDeviceGetAttribute(ctypes.byref(v), attr, i)
        cc.append(v.value)
    return buf.value.decode(), (cc[0], cc[1])


def pushed_if_ready(device: int) -> _pushed | None:
    """:func:`pushed` when the driver is loaded and ``device``'s primary context retained already, else None;
    takes no lock (for finalizers: the garbage collector may run one on a thread that holds ``_lock``)."""
    if _cuda is None or device not in _contexts:
        return None
    return _pushed(_cuda, device)


def retain(device: int) -> None:
    """Retain ``device``'s primary context for the process (what :func:`pushed_if_ready` needs), when the driver
    loads; nothing otherwise."""
    try:
        _primary_context(_load(), device)
    except (DriverUnavailable, RuntimeError):
        pass


def pushed(device: int) -> _pushed:
    """``device``'s primary context made current around a ``with`` block (the driver's device guard)."""
    return _pushed(_load(), device)
