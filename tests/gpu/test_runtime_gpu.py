"""GPU tier for the runtime: handles per thread, streams honoured, cudnnSetTensor on strided arrays.

Runs for CuPy and torch inputs (the ``xp`` fixture is the adapter of each).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from cudnnkit import lib
from cudnnkit.runtime import as_view, prepare, scaling, tensor_descriptor

from ..numerics import host, poisoned

pytestmark = pytest.mark.gpu

DTYPES = ["float32", "float64", "float16", "bfloat16"]


def set_tensor(arr, value, *, stream=None):
    launch, (v,) = prepare(("y", arr), stream=stream)
    lib.cudnnSetTensor(
        launch.handle, tensor_descriptor(v.dtype, v.shape, v.strides), v.ptr, ctypes.byref(scaling(v.dtype, value))
    )
    return launch


def new_stream(xp):
    """A non-blocking stream of the adapter's library and its cudaStream_t."""
    if xp.name == "torch":
        s = xp.module.cuda.Stream()
        return s, s.cuda_stream
    s = xp.module.cuda.Stream(non_blocking=True)
    return s, s.ptr


def gpu_sleep(stream_ptr: int, ms: float) -> None:
    """Enqueue a spin of about ``ms`` on a stream (through torch, whatever library owns the stream)."""
    torch = pytest.importorskip("torch")
    cycles = int(ms * 2e6)  # about 2 GHz SM clock; a slower clock only sleeps longer
    with torch.cuda.stream(torch.cuda.ExternalStream(stream_ptr)):
        torch.cuda._sleep(cycles)


# ----------------------------------------------------------------- cudnnSetTensor


@pytest.mark.parametrize("dtype", DTYPES)
def test_set_tensor_writes_only_the_strided_view(xp, dtype):
    base = poisoned(xp, (3, 8, 6, 9), dtype)
    view = base[:, ::2, 1:, ::3]
    set_tensor(view, -1.75)
    got = host(xp, base)
    want = np.full(got.shape, np.nan)
    want[:, ::2, 1:, ::3] = -1.75
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_set_tensor_channels_last(xp, dtype):
    launch, _ = prepare(("x", poisoned(xp, (1,), dtype)))
    shape = (4, 6, 5, 7)
    nhwc = (6 * 5 * 7, 1, 7 * 6, 6)
    arr, v = launch.empty(shape, dtype, strides=nhwc)
    assert v.strides == nhwc and v.adapter is xp
    set_tensor(arr, 3.25)
    np.testing.assert_array_equal(host(xp, arr), np.full(shape, 3.25))


# ----------------------------------------------------------------- handles


def test_handle_is_per_thread_and_reused(xp):
    x = poisoned(xp, (4,), "float32")
    a, _ = prepare(("x", x))
    b, _ = prepare(("x", x))
    assert a.handle is b.handle and a.handle.device == 0
    seen = {}

    def work():
        launch, _ = prepare(("x", x))
        seen["handle"] = launch.handle
        seen["again"] = prepare(("x", x))[0].handle

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["handle"] is seen["again"]
    assert seen["handle"].ptr != a.handle.ptr and seen["handle"].thread != a.handle.thread


def test_threads_with_their_own_handles_compute_correctly(xp):
    arrays = [poisoned(xp, (64, 32, 16, 16), "float32") for _ in range(6)]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                set_tensor(arrays[i], float(i))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    xp.synchronize(0)
    assert not errors
    for i, a in enumerate(arrays):
        assert np.all(host(xp, a) == i)


# ----------------------------------------------------------------- streams


def test_explicit_stream_is_honoured(xp):
    s, ptr = new_stream(xp)
    big = poisoned(xp, (64, 64, 64, 64), "float32")
    xp.synchronize(0)
    gpu_sleep(ptr, 300)  # the stream is busy for ~300 ms
    launch = set_tensor(big, 2.0, stream=s)
    assert launch.stream == ptr and launch.handle.stream == ptr
    got = ctypes.c_void_p()
    lib.cudnnGetStream(launch.handle, ctypes.byref(got))
    assert got.value == ptr
    # the default stream does not wait for a non-blocking stream: the write is not there yet
    early = host(xp, big[:1, :1])
    assert np.isnan(early).all(), "cuDNN did not run on the given stream"
    s.synchronize()  # only that stream
    assert np.all(host(xp, big) == 2.0)


def test_library_current_stream_is_used_by_default(xp):
    s, ptr = new_stream(xp)
    x = poisoned(xp, (8, 8, 8, 8), "float32")
    with xp.module.cuda.stream(s) if xp.name == "torch" else s:
        launch = set_tensor(x, 1.0)
    assert launch.stream == ptr
    s.synchronize()
    assert np.all(host(xp, x) == 1.0)
    launch = set_tensor(x, 5.0)  # back on the default stream: the handle's stream is switched back
    assert launch.handle.stream == xp.current_stream(0) != ptr
    assert np.all(host(xp, x) == 5.0)


# ----------------------------------------------------------------- views and allocation


class OnlyCAI:
    def __init__(self, a):
        self.__cuda_array_interface__ = a.__cuda_array_interface__
        self.keep = a


class OnlyDLPack:
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("wrap", [OnlyCAI, OnlyDLPack])
def test_generic_protocols_read_the_same_array(xp, wrap):
    base = poisoned(xp, (4, 6, 8, 10), "float32")
    a = base[:, 1::2, :, ::2]
    direct = xp.view(a, "x")
    generic = as_view(wrap(a), "x")
    for f in ("shape", "strides", "dtype", "device", "ptr"):
        assert getattr(generic, f) == getattr(direct, f), f
    assert generic.adapter is None
    launch = set_tensor(wrap(a), 4.0)  # runs on the legacy default stream
    xp.synchronize(0)
    got = host(xp, base)
    assert np.all(got[:, 1::2, :, ::2] == 4.0) and np.isnan(got[:, ::2]).all()
    with pytest.raises(TypeError, match="without a cudnnkit adapter.*or pass out= yourself"):
        launch.empty((2,), "float32")


def test_workspace_comes_from_the_input_library(xp):
    launch, _ = prepare(("x", poisoned(xp, (4,), "float32")))
    owner, ptr = launch.workspace(1 << 20)
    assert ptr and type(owner).__module__.partition(".")[0] == xp.name
    assert launch.workspace(0) == (None, 0)


def test_mixed_libraries_allocate_like_the_first(xp):
    from cudnnkit.runtime import adapters
    from tests.conftest import gpu_libraries

    if len(gpu_libraries()) < 2:
        pytest.skip("needs both CuPy and torch")
    other = adapters.get("torch" if xp.name == "cupy" else "cupy")
    launch, (a, b) = prepare(("x", poisoned(xp, (3,), "float32")), ("w", poisoned(other, (3,), "float32")))
    assert launch.adapter is xp
    out, v = launch.empty((3,), "float16")
    assert type(out).__module__.partition(".")[0] == xp.name and v.dtype == "float16"


def test_host_array_rejected_before_gpu_work(xp):
    with pytest.raises(TypeError, match="^w is a host array"):
        prepare(("x", poisoned(xp, (3,), "float32")), ("w", np.zeros(3, np.float32)))
