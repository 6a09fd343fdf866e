"""Regression tests for the runtime's part of issue 10 (host side: no GPU, no driver needed).

Each test is named after the class of defect the fuzzer found: C1 (garbage ``stream=`` crashed the process),
C3/U7 (a NULL ``__cuda_array_interface__`` pointer reached cuDNN), U9 (malformed CAI dicts), U10 (one library's
adapter used on another's array), U11 (``None`` for a required array), U1 (stride-0, overlapping and reversed
views), U8/U13 (non-numeric and non-finite scalars), U12 (allocator internals leaking). Arrays are faked with
``__cuda_array_interface__`` objects or :class:`ArrayView` objects carrying a fake adapter; the CUDA driver is
faked by replacing ``cudnnkit.runtime.driver.stream_device`` / ``pointer_info``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import subprocess
import sys

import numpy as np
import pytest

from cudnnkit import runtime
from cudnnkit.runtime import (
    ELEMENTWISE,
    OPTIONAL,
    WRITTEN,
    ArrayView,
    Launch,
    as_view,
    check_device_pointer,
    check_scalar,
    driver,
    layout_problem,
    prepare,
    scaling,
    scaling_ref,
    validate_stream,
)
from cudnnkit.runtime.arrays import contiguous_strides

from .conftest import FakeCAI

PTR = 0x7F0000000000


class FakeArray:
    """An array of a fake library: what a FakeAdapter allocates and copies."""

    def __init__(self, shape, strides=None, ptr=PTR, dtype="float32"):
        self.shape, self.dtype, self.ptr = tuple(shape), dtype, ptr
        self.strides = tuple(strides) if strides is not None else contiguous_strides(self.shape)


class FakeAdapter:
    """Records what the runtime asks of an array library; never touches a device."""

    def __init__(self, name="fake", stream=0x1111, fail_alloc=False):
        self.name, self._stream, self.fail_alloc = name, stream, fail_alloc
        self.calls: list[tuple] = []

    def view(self, arr, name):
        return ArrayView(arr.shape, arr.strides, arr.dtype, 0, arr.ptr, arr, self, False)

    def empty(self, shape, dtype, device, strides=None, stream=None):
        self.calls.append(("empty", shape, dtype, stream))
        if self.fail_alloc:
            raise MemoryError("fake pool exhausted")
        return FakeArray(shape, strides, dtype=dtype)

    def contiguous(self, arr, stream=None):
        self.calls.append(("contiguous", arr, stream))
        return FakeArray(arr.shape, ptr=PTR + 0x100000, dtype=arr.dtype)

    def copy(self, dst, src, stream=None):
        self.calls.append(("copy", dst, src, stream))

    def wrap(self, obj, device):
        self.calls.append(("wrap", obj))
        v = as_view(obj, "wrapped")
        return FakeArray(v.shape, v.strides, v.ptr, v.dtype)

    def current_stream(self, device):
        return self._stream

    def current_device(self):
        return 0


def fview(adapter, shape, strides=None, ptr=PTR, dtype="float32"):
    """(array, view) of a fake-library array."""
    arr = FakeArray(shape, strides, ptr, dtype)
    return arr, adapter.view(arr, "x")


@pytest.fixture
def fake_driver(monkeypatch):
    """A CUDA driver that knows two live streams of cuda:0 (0x5000, 0x6000) and one of cuda:1 (0x7000)."""
    streams = {0x5000: 0, 0x6000: 0, 0x7000: 1}
    asked: list[int] = []

    def stream_device(h):
        asked.append(h)
        return streams.get(h)

    monkeypatch.setattr(driver, "stream_device", stream_device)
    runtime.clear_stream_cache()
    yield asked
    runtime.clear_stream_cache()


@pytest.fixture
def no_driver(monkeypatch):
    def unavailable(*a, **k):
        raise driver.DriverUnavailable("the CUDA driver is not available: libcuda.so.1 not found")

    monkeypatch.setattr(driver, "stream_device", unavailable)
    monkeypatch.setattr(driver, "pointer_info", unavailable)
    runtime.clear_stream_cache()
    yield
    runtime.clear_stream_cache()


# ----------------------------------------------------------------- C1: stream handles
#
# The policy: a stream OBJECT (torch ``.cuda_stream``, CuPy ``.ptr``, ``__cuda_stream__``) and the int a
# ``__cuda_array_interface__`` producer named are asked of the driver (readable-memory probe, then
# ``cuStreamGetFlags``); a RAW INT from the user is never asked about (a readable host address that is no stream
# crashes the driver's query): it is accepted only as 0/1/2, the library's current stream, or a handle already
# found live through its object on that device.


class TorchLikeStream:
    cuda_stream = 0x5000


class CupyLikeStream:
    ptr = 0x6000


class CoreLikeStream:
    def __cuda_stream__(self):
        return (0, 0x5000)


class CoreStream:
    """A ``__cuda_stream__`` stream object over any handle (a live one, garbage, another device's)."""

    def __init__(self, handle):
        self.handle_ = handle

    def __cuda_stream__(self):
        return (0, self.handle_)


class PerThreadRefusingAdapter(FakeAdapter):
    """An adapter that, like torch's, cannot allocate on ``cudaStreamPerThread``."""

    @staticmethod
    def refuse_special_stream(stream, name="stream"):
        if stream == 2:
            raise ValueError(f"{name}=2 (cudaStreamPerThread) has no fake stream object")


RAW = "is a raw stream handle, which cannot be checked without risking a crash"


@pytest.mark.parametrize("bad", [0xBAD000, 2**63, 12345])
def test_C1_garbage_stream_ints_are_refused_without_asking_the_driver(fake_driver, bad):
    with pytest.raises(ValueError, match=f"stream={bad:#x} {RAW} .*pass the stream object instead"):
        validate_stream(bad, None, 0)
    with pytest.raises(ValueError, match=f"stream={bad:#x} {RAW}"):
        prepare(("x", FakeCAI((2, 3))), stream=bad)
    with pytest.raises(ValueError, match=f"stream={bad:#x} {RAW}"):
        validate_stream(np.uint64(bad), None, 0)  # any Integral is a raw int
    assert fake_driver == []  # a raw int never reaches the driver


@pytest.mark.parametrize("bad", [0xBAD000, 2**63, 12345])
def test_C1_garbage_stream_objects_are_asked_of_the_driver_and_refused(fake_driver, bad):
    with pytest.raises(ValueError, match=f"stream={bad:#x} is not a live CUDA stream"):
        validate_stream(CoreStream(bad), None, 0)
    with pytest.raises(ValueError, match="is not a live CUDA stream"):
        prepare(("x", FakeCAI((2, 3))), stream=CoreStream(bad))
    assert fake_driver == [bad, bad]  # asked (and, refused, never cached)


@pytest.mark.parametrize("bad", [-1, -(2**63), 2**64, 2**70])
def test_C1_out_of_range_stream_ints_are_refused_before_any_query(fake_driver, bad):
    with pytest.raises(ValueError, match="not a CUDA stream handle"):
        validate_stream(bad, None, 0)
    with pytest.raises(ValueError, match="not a CUDA stream handle"):
        validate_stream(CoreStream(bad), None, 0)
    assert fake_driver == []  # the driver was never asked


@pytest.mark.parametrize("bad", [1.5, 0.0, "default", b"s", True, False, 1 + 0j, [0x5000], object()])
def test_C1_non_stream_types_are_refused_with_a_type_error(fake_driver, bad):
    with pytest.raises(TypeError, match="stream must be"):
        validate_stream(bad, None, 0)
    with pytest.raises(TypeError, match="stream must be"):
        prepare(("x", FakeCAI((2, 3))), stream=bad)
    assert fake_driver == []


def test_C1_live_raw_stream_ints_are_refused_until_their_object_was_seen(fake_driver):
    """0x5000 and 0x6000 are live streams of cuda:0, but as raw ints nothing vouches for them."""
    for raw in (0x5000, np.uint64(0x6000)):
        with pytest.raises(ValueError, match=RAW):
            validate_stream(raw, None, 0)
    with pytest.raises(ValueError, match=f"stream=0x5000 {RAW}"):
        prepare(("x", FakeCAI((2, 3))), stream=0x5000)
    assert fake_driver == []
    assert validate_stream(TorchLikeStream(), None, 0) == 0x5000  # the object: asked, then cached
    assert validate_stream(0x5000, None, 0) == 0x5000  # now its raw int is known
    assert prepare(("x", FakeCAI((2, 3))), stream=0x5000)[0].stream == 0x5000
    with pytest.raises(ValueError, match=RAW):
        validate_stream(0x6000, None, 0)  # still unseen
    assert fake_driver == [0x5000]


def test_C1_stream_objects_are_validated_through_the_driver(fake_driver):
    for obj, h in ((TorchLikeStream(), 0x5000), (CupyLikeStream(), 0x6000), (CoreLikeStream(), 0x5000)):
        assert validate_stream(obj, None, 0) == h
    assert fake_driver == [0x5000, 0x6000]  # CoreLikeStream's 0x5000 was already known
    assert prepare(("x", FakeCAI((2, 3))), stream=CupyLikeStream())[0].stream == 0x6000
    assert validate_stream(0x5000, None, 0) == 0x5000 and validate_stream(np.uint64(0x6000), None, 0) == 0x6000
    assert fake_driver == [0x5000, 0x6000]  # the raw ints came from the cache


def test_C1_default_stream_handles_need_no_query(fake_driver, no_driver):
    for h in (0, 1, 2):
        assert validate_stream(h, None, 0) == h
        assert validate_stream(CoreStream(h), None, 0) == h
        assert validate_stream(h, FakeAdapter(), 0) == h


def test_C1_an_adapter_may_refuse_a_special_stream_by_name(fake_driver):
    ad = PerThreadRefusingAdapter()
    assert validate_stream(0, ad, 0) == 0 and validate_stream(1, ad, 0) == 1
    with pytest.raises(ValueError, match="my_stream=2 .cudaStreamPerThread."):
        validate_stream(2, ad, 0, "my_stream")
    with pytest.raises(ValueError, match=r"stream=2 \(cudaStreamPerThread\)"):
        validate_stream(CoreStream(2), ad, 0)  # an object of handle 2 too
    _, v = fview(ad, (2, 3))
    with pytest.raises(ValueError, match=r"stream=2 \(cudaStreamPerThread\)"):
        prepare(("x", v), stream=2)
    assert ad.calls == [] and fake_driver == []


def test_C1_torch_refuses_the_per_thread_stream():
    pytest.importorskip("torch")
    from cudnnkit.runtime import adapters

    torch_ad = adapters.get("torch")
    assert validate_stream(0, torch_ad, 0) == 0 and validate_stream(1, torch_ad, 0) == 1
    with pytest.raises(ValueError, match=r"stream=2 \(cudaStreamPerThread\) has no torch stream object"):
        validate_stream(2, torch_ad, 0)


def test_C1_stream_of_another_device_is_refused(fake_driver):
    with pytest.raises(ValueError, match=r"stream=0x7000 is a stream of cuda:1 but the arrays are on cuda:0"):
        validate_stream(CoreStream(0x7000), None, 0)
    with pytest.raises(ValueError, match="a stream of cuda:1"):
        prepare(("x", FakeCAI((2, 3))), stream=CoreStream(0x7000))
    assert fake_driver == [0x7000, 0x7000]
    assert validate_stream(CoreStream(0x7000), None, 1) == 0x7000  # on its own device: accepted, cached there
    assert validate_stream(0x7000, None, 1) == 0x7000
    with pytest.raises(ValueError, match=RAW):  # the cache is per device: not a stream of cuda:0
        validate_stream(0x7000, None, 0)
    assert fake_driver == [0x7000, 0x7000, 0x7000]


def test_C1_live_streams_are_cached_per_device(fake_driver):
    for _ in range(5):
        validate_stream(TorchLikeStream(), None, 0)
        validate_stream(0x5000, None, 0)
    assert fake_driver == [0x5000]  # asked once
    with pytest.raises(ValueError):  # garbage is never cached: asked every time
        validate_stream(CoreStream(0xBAD000), None, 0)
    with pytest.raises(ValueError):
        validate_stream(CoreStream(0xBAD000), None, 0)
    assert fake_driver == [0x5000, 0xBAD000, 0xBAD000]
    runtime.clear_caches()  # clear_caches forgets them too: the raw int is unknown again
    with pytest.raises(ValueError, match=RAW):
        validate_stream(0x5000, None, 0)
    validate_stream(TorchLikeStream(), None, 0)
    assert fake_driver[-1] == 0x5000 and len(fake_driver) == 4


def test_C1_without_a_driver_stream_objects_are_accepted_and_raw_ints_refused(no_driver):
    assert validate_stream(CupyLikeStream(), None, 0) == 0x6000
    assert validate_stream(CoreStream(0x5000), None, 0) == 0x5000
    with pytest.raises(ValueError, match=f"stream=0x5000 {RAW}"):
        validate_stream(0x5000, None, 0)
    with pytest.raises(ValueError, match=f"stream=0x6000 {RAW}"):  # an unchecked object vouches for no raw int
        validate_stream(0x6000, None, 0)
    # a producer's int must be asked of the driver: without one it cannot be checked
    with pytest.raises(ValueError, match=r"x's CAI stream=0x5000: a raw stream handle cannot be checked .*object"):
        validate_stream(0x5000, None, 0, "x's CAI stream", producer=True)


def test_C1_the_library_current_stream_int_needs_no_query(fake_driver):
    ad = FakeAdapter(stream=0x4242)
    assert validate_stream(0x4242, ad, 0) == 0x4242
    with pytest.raises(ValueError, match=f"stream=0x4243 {RAW}"):
        validate_stream(0x4243, ad, 0)
    with pytest.raises(ValueError, match=RAW):
        validate_stream(0x4242, None, 0)  # it is the adapter's current stream that vouches for it
    assert fake_driver == []


def test_C1_none_is_the_library_current_stream(fake_driver):
    ad = FakeAdapter(stream=0x4242)
    assert validate_stream(None, ad, 0) == 0x4242 and validate_stream(None, None, 0) == 0
    _, v = fview(ad, (2, 3))
    assert prepare(("x", v))[0].stream == 0x4242
    assert fake_driver == []  # the library's own current stream is taken as it is


def test_C1_cai_producer_stream_is_checked_through_the_driver(fake_driver):
    a = FakeCAI((2, 3), stream=0xBAD000)
    with pytest.raises(ValueError, match=r"x's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        prepare(("x", a))
    assert fake_driver == [0xBAD000]  # a producer's int is asked about, not refused as raw
    assert prepare(("x", FakeCAI((2, 3), stream=0x5000)))[0].stream == 0x5000
    b = FakeCAI((2, 3), stream=0x7000)
    with pytest.raises(ValueError, match=r"x's __cuda_array_interface__ stream=0x7000 is a stream of cuda:1"):
        prepare(("x", b))
    assert fake_driver == [0xBAD000, 0x5000, 0x7000]
    with pytest.raises(TypeError, match="'stream' must be None or an int"):
        as_view(FakeCAI((2, 3), stream="s"), "x")


def test_C1_readable_probe_never_faults():
    """The probe run before the driver is asked answers for unmapped addresses instead of crashing."""
    buf = ctypes.create_string_buffer(64)
    assert driver.readable(ctypes.addressof(buf))
    for bad in (0, 12345, 0xBAD000, 2**63, 2**64 - 1, -1):
        assert not driver.readable(bad)


def test_C1_garbage_stream_in_a_subprocess_does_not_crash():
    """With the real driver module (whatever the machine has), garbage ints, readable host addresses among them,
    are refused with a Python exception, and none reaches the driver."""
    code = (
        "import ctypes\n"
        "from cudnnkit.runtime import driver, validate_stream\n"
        "asked = []\n"
        "real = driver.stream_device\n"
        "driver.stream_device = lambda h: asked.append(h) or real(h)\n"
        "buf = ctypes.create_string_buffer(4096)\n"
        "obj = object()\n"
        "for h in (0xBAD000, 2**63, 12345, id(obj), ctypes.addressof(buf)):\n"
        "    try:\n"
        "        validate_stream(h, None, 0)\n"
        "    except ValueError as e:\n"
        "        print('refused', e)\n"
        "print('asked', asked)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("refused") == 5 and r.stdout.count("raw stream handle") == 5, r.stdout
    assert "asked []" in r.stdout, r.stdout


def test_C1_stream_driver_path_probes_before_asking(monkeypatch):
    """stream_device refuses an unreadable handle without calling into the driver."""

    class NoCalls:
        def __getattr__(self, name):
            raise AssertionError(f"driver function {name} called for an unmapped handle")

    monkeypatch.setattr(driver, "_load", lambda: NoCalls())
    assert driver.stream_device(0xBAD000) is None
    assert driver.stream_device(2**63) is None


# ----------------------------------------------------------------- C3 / U7: NULL data pointers


def test_C3_null_cai_pointer_with_elements_is_refused():
    for ptr in (0, None):
        with pytest.raises(ValueError, match=r"rnn_x: __cuda_array_interface__ data pointer is NULL .* 6 elements"):
            as_view(FakeCAI((2, 3), ptr=ptr), "rnn_x")
    with pytest.raises(ValueError, match="x: __cuda_array_interface__ data pointer is NULL"):
        prepare(("w", FakeCAI((4,))), ("x", FakeCAI((2, 3), ptr=0)))


def test_C3_null_cai_pointer_of_an_empty_array_is_fine():
    v = as_view(FakeCAI((0, 3), ptr=0), "x")
    assert v.size == 0 and v.ptr == 0


def test_C3_pointer_out_of_range_is_refused():
    with pytest.raises(ValueError, match="not an unsigned 64-bit address"):
        as_view(FakeCAI((2,), ptr=-8), "x")
    with pytest.raises(ValueError, match="not an unsigned 64-bit address"):
        as_view(FakeCAI((2,), ptr=2**64), "x")


# ----------------------------------------------------------------- U9: malformed __cuda_array_interface__


@pytest.mark.parametrize("key", ["shape", "typestr", "data", "version"])
def test_U9_cai_missing_key_names_argument_and_key(key):
    a = FakeCAI((2, 3))
    del a.__cuda_array_interface__[key]
    with pytest.raises(TypeError, match=f"dy: __cuda_array_interface__ lacks the required key '{key}'"):
        as_view(a, "dy")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("shape", (2, -3), "'shape' must be a tuple of non-negative ints"),
        ("shape", (2.0, 3), "'shape' must be a tuple of non-negative ints"),
        ("shape", (True, 3), "'shape' must be a tuple of non-negative ints"),
        ("shape", "23", "'shape' must be a tuple of non-negative ints"),
        ("shape", None, "'shape' must be a tuple of non-negative ints"),
        ("strides", (12,), r"'strides' \(12,\) has 1 entries for 2 dims"),
        ("strides", (12.0, 4), "'strides' must be None or a tuple of ints"),
        ("strides", 12, "'strides' must be None or a tuple of ints"),
        ("data", PTR, r"'data' must be a \(pointer, read_only\) tuple"),
        ("data", (PTR,), r"'data' must be a \(pointer, read_only\) tuple"),
        ("data", ("0x10", False), "data pointer must be an int"),
        ("data", (1.5, False), "data pointer must be an int"),
        ("typestr", 4, "'typestr' must be a str"),
        ("typestr", "<c8", "typestr '<c8' is not a type cuDNN supports"),
        ("typestr", "float32", "typestr 'float32' is not a type cuDNN supports"),
        ("version", "3", "'version' must be an int"),
        ("mask", object(), "masked arrays"),
    ],
)
def test_U9_cai_malformed_values_are_type_errors(field, value, match):
    a = FakeCAI((2, 3))
    a.__cuda_array_interface__[field] = value
    with pytest.raises(TypeError, match="x: .*" + match):
        as_view(a, "x")


def test_U9_cai_that_is_not_a_dict():
    class Odd:
        __cuda_array_interface__ = [("shape", (2,))]

    with pytest.raises(TypeError, match="x: __cuda_array_interface__ must be a dict, got list"):
        as_view(Odd(), "x")


def test_U9_numpy_ints_in_cai_are_accepted():
    a = FakeCAI((np.int64(2), np.int32(3)), strides=(np.int64(12), np.int64(4)))
    v = as_view(a, "x")
    assert v.shape == (2, 3) and v.strides == (3, 1) and all(type(d) is int for d in v.shape + v.strides)


# ----------------------------------------------------------------- U10: mixed libraries


def test_U10_each_array_is_copied_by_its_own_library(fake_driver):
    """A torch dy with a CuPy y: the copy of y must be made by y's library, not by the allocating one."""
    first, second = FakeAdapter("first"), FakeAdapter("second")
    _, vdy = fview(first, (2, 3))
    y, vy = fview(second, (2, 3), strides=(0, 1))  # expanded: needs a copy
    launch, (wdy, wy) = prepare(("dy", vdy), ("y", vy))
    assert launch.adapter is first  # outputs are allocated by the first array's library
    assert [c[0] for c in second.calls] == ["contiguous"] and first.calls == []
    assert wy.adapter is second and wy.strides == (3, 1) and wdy is vdy


def test_U10_copy_between_libraries_wraps_the_source(fake_driver):
    first = FakeAdapter("first")
    _, vx = fview(first, (2, 3))
    launch, _ = prepare(("x", vx))
    src = FakeCAI((2, 3))  # an array of another library
    dst = FakeCAI((2, 3), ptr=PTR + 4096)
    launch.copy(dst, src, "out")
    assert [c[0] for c in first.calls] == ["wrap", "wrap", "copy"]


def test_U10_unwrappable_source_is_refused_by_name(fake_driver):
    first = FakeAdapter("first")

    def wrap(obj, device):
        raise ValueError("dtype not expressible")

    first.wrap = wrap
    _, vx = fview(first, (2, 3))
    launch, _ = prepare(("x", vx))
    with pytest.raises(TypeError, match=r"out: a .*FakeCAI cannot be viewed as a first array .*one library"):
        launch.copy(FakeCAI((2, 3)), FakeCAI((2, 3)), "out")


def test_U10_cai_input_with_adapter_inputs_is_copied_through_the_allocating_library(fake_driver):
    first = FakeAdapter("first")
    _, vx = fview(first, (2, 3))
    launch, (_, vg) = prepare(("x", vx), ("g", FakeCAI((2, 3), strides=(0, 4))))
    assert [c[0] for c in first.calls] == ["wrap", "contiguous"] and vg.strides == (3, 1)


# ----------------------------------------------------------------- U11: None for arrays


def test_U11_required_array_given_as_none():
    with pytest.raises(TypeError, match=r"^x is required \(a CUDA array\), got None$"):
        prepare(("x", None))
    with pytest.raises(TypeError, match="dy is required"):
        prepare(("y", FakeCAI((2, 3))), ("dy", None))
    with pytest.raises(TypeError, match="w is required"):  # a flag without OPTIONAL is still required
        prepare(("x", FakeCAI((2, 3))), ("w", None, WRITTEN))


def test_U11_optional_array_given_as_none():
    launch, (vx, vh) = prepare(("x", FakeCAI((2, 3))), ("hx", None, OPTIONAL))
    assert vx.shape == (2, 3) and vh is None and launch.device == 0
    with pytest.raises(ValueError, match="no arrays given"):
        prepare(("hx", None, OPTIONAL), ("cx", None, OPTIONAL))


# ----------------------------------------------------------------- U1: stride-0, overlapping, reversed views


@pytest.mark.parametrize(
    ("shape", "strides", "problem"),
    [
        ((2, 3), (3, 1), None),
        ((2, 3), (1, 2), None),  # transposed
        ((3, 3), (9, 3), None),  # gapped
        ((1, 3), (0, 1), None),  # stride 0 on a size-1 dim addresses nothing twice
        ((0, 3), (0, 0), None),  # empty
        ((4,), (0,), "expanded"),
        ((2, 3), (0, 1), "expanded"),
        ((2, 3), (3, -1), "negative"),
        ((2, 2), (1, 1), "overlaps"),
        ((3, 2, 4), (1, 12, 2), "overlaps"),
        ((6, 2, 5), (10, 1, 20), "overlaps"),
    ],
)
def test_U1_layout_problem(shape, strides, problem):
    got = layout_problem(shape, strides)
    assert (got is None) if problem is None else (problem in got)


def test_U1_expanded_input_is_copied_and_logged(fake_driver, caplog):
    ad = FakeAdapter()
    _, v = fview(ad, (4, 5), strides=(0, 1))
    with caplog.at_level(logging.DEBUG, logger="cudnnkit"):
        launch, (w,) = prepare(("x", v))
    assert ad.calls == [("contiguous", v.owner, 0x1111)]  # on the launch stream
    assert w.strides == (5, 1) and w.ptr != v.ptr
    assert "x is expanded (stride 0 on a dim of size > 1) (shape (4, 5), strides (0, 1)): copying" in caplog.text


@pytest.mark.parametrize("strides", [(5, -1), (1, 1)])
def test_U1_overlapping_and_reversed_inputs_are_copied(fake_driver, strides):
    ad = FakeAdapter()
    _, v = fview(ad, (4, 5), strides=strides)
    _, (w,) = prepare(("x", v))
    assert [c[0] for c in ad.calls] == ["contiguous"] and w.strides == (5, 1)


def test_U1_copies_wait_for_every_check(fake_driver):
    """An expanded input is not copied when a later array is refused (no GPU work before every check)."""
    ad = FakeAdapter()
    _, v = fview(ad, (4, 5), strides=(0, 1))
    with pytest.raises(TypeError, match="dy is required"):
        prepare(("x", v), ("dy", None))
    _, out = fview(ad, (4, 5), strides=(0, 1))
    with pytest.raises(ValueError, match="y is expanded"):
        prepare(("x", v), ("y", out, WRITTEN))
    assert ad.calls == []


def test_U1_expanded_cai_input_without_adapter_is_refused_by_name(fake_driver):
    with pytest.raises(ValueError, match=r"x is expanded .* no cudnnkit adapter to copy it"):
        prepare(("x", FakeCAI((4, 5), strides=(0, 4))))


def test_U1_written_array_is_refused_or_collapsed(fake_driver):
    ad = FakeAdapter()
    _, v = fview(ad, (4, 5), strides=(0, 1))
    with pytest.raises(ValueError, match=r"c is expanded .*written in place"):
        prepare(("c", v, WRITTEN))
    _, (w,) = prepare(("y", v, WRITTEN | ELEMENTWISE))  # set_tensor: each memory location written once
    assert w.shape == (1, 5) and w.strides == (0, 1) and w.ptr == v.ptr and ad.calls == []
    _, ov = fview(ad, (2, 2), strides=(1, 1))
    with pytest.raises(ValueError, match="y overlaps itself"):
        prepare(("y", ov, WRITTEN | ELEMENTWISE))


@pytest.mark.parametrize(("strides", "what"), [((0, 1), "expanded"), ((1, 1), "overlaps"), ((5, -1), "negative")])
def test_U1_out_that_overlaps_is_refused(fake_driver, strides, what):
    ad = FakeAdapter()
    _, vx = fview(ad, (4, 5))
    launch, _ = prepare(("x", vx))
    with pytest.raises(ValueError, match=f"dx_out .*{what}.*an output must address each element once"):
        launch.output(FakeCAI((4, 5), strides=tuple(4 * s for s in strides)), (4, 5), "float32", name="dx_out")
    out = FakeCAI((4, 5), strides=(4, 16))  # transposed is fine
    assert launch.output(out, (4, 5), "float32")[0] is out


# ----------------------------------------------------------------- U8 / U13: scalars


@pytest.mark.parametrize("good", [1, -2, 0.5, np.float32(0.25), np.float64(3), np.int64(4), np.array(2.0), 3.4e38])
def test_U8_real_numbers_are_accepted(good):
    assert check_scalar(good, "alpha") == float(good)


@pytest.mark.parametrize("bad", ["1.0", None, 1 + 2j, [1.0], np.array([1.0]), b"1", object()])
def test_U8_non_numeric_scalars_are_type_errors(bad):
    with pytest.raises(TypeError, match="^alpha must be a real number"):
        check_scalar(bad, "alpha")
    with pytest.raises(TypeError, match="^y_beta must be a real number"):
        scaling_ref("float32", bad, "y_beta")


@pytest.mark.parametrize("b", [True, False, np.True_])
def test_U8_bools_are_refused(b):
    with pytest.raises(TypeError, match="must be a real number, got the bool"):
        check_scalar(b, "beta")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")])
def test_U13_non_finite_scalars_are_refused(bad):
    with pytest.raises(ValueError, match="^alpha must be finite"):
        check_scalar(bad, "alpha")
    with pytest.raises(ValueError, match="^alpha must be finite"):
        scaling("float64", bad, "alpha")
    v = check_scalar(bad, "value", finite=False)  # fill values may ask for inf and NaN
    assert v == bad or (math.isnan(v) and math.isnan(bad))


@pytest.mark.parametrize("big", [1e300, -1e300, 3.5e38, 10**39])
def test_U13_values_that_overflow_float32_are_refused(big):
    for dtype in ("float32", "float16", "bfloat16"):
        with pytest.raises(ValueError, match="overflows float32"):
            scaling(dtype, big, "alpha")
    with pytest.raises(ValueError, match="overflows float32"):  # finite=False still refuses finite overflow
        scaling("float32", big, "value", finite=False)
    assert scaling("float64", big, "alpha").value == float(big)  # a double holds it
    with pytest.raises(ValueError, match="too large for a float"):
        check_scalar(10**400, "alpha", dtype="float64")


def test_U8_scaling_keeps_its_old_signature():
    assert isinstance(scaling("float32", 2), ctypes.c_float) and scaling("float64", 2).value == 2.0
    scaling_ref("float32", 1.0)  # no name: errors say alpha/beta
    with pytest.raises(TypeError, match="^alpha/beta must be a real number"):
        scaling_ref("float32", "x")


def test_U8_output_checks_beta_by_name(fake_driver):
    ad = FakeAdapter()
    _, vx = fview(ad, (2, 3))
    launch, _ = prepare(("x", vx))
    with pytest.raises(TypeError, match="^dx_beta must be a real number"):
        launch.output(None, (2, 3), "float32", beta="1", beta_name="dx_beta")
    with pytest.raises(ValueError, match="beta != 0 blends into an existing output: pass out="):
        launch.output(None, (2, 3), "float32", beta=0.5)


# ----------------------------------------------------------------- U12: allocator internals


def test_U12_huge_output_is_refused_before_the_allocator(fake_driver):
    ad = FakeAdapter()
    _, vx = fview(ad, (2, 3))
    launch, _ = prepare(("x", vx))
    shape = (100001, 100001, 100001, 100001)  # transform_tensor(pad_before=100000)
    with pytest.raises(ValueError, match=r"^out would have shape \(100001, .* overflows int64"):
        launch.output(None, shape, "float32")
    with pytest.raises(ValueError, match="y: shape .* has a negative dim"):
        launch.empty((2, -1), "float32", name="y")
    with pytest.raises(TypeError, match="y: shape .* must hold ints"):
        launch.empty((2, 1.5), "float32", name="y")
    assert ad.calls == []


def test_U12_out_of_memory_is_a_memory_error_naming_the_output(fake_driver):
    ad = FakeAdapter(fail_alloc=True)
    _, vx = fview(ad, (2, 3))
    launch, _ = prepare(("x", vx))
    with pytest.raises(MemoryError, match=r"cannot allocate workspace \(uint8, shape \(3221225472,\), 3 GiB\)"):
        launch.workspace(3 * 2**30)


def test_U12_torch_out_of_memory_becomes_memory_error(monkeypatch):
    torch = pytest.importorskip("torch")
    from cudnnkit.runtime import adapters

    ad = adapters.get("torch")

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB\nmore text")

    monkeypatch.setattr(torch, "empty", oom)
    with pytest.raises(MemoryError, match="^CUDA out of memory. Tried to allocate 4.00 GiB$"):
        ad.empty((2**30,), "float32", 0)


def test_U12_device_ordinal_check():
    with pytest.raises(ValueError, match="device must be >= 0, got -1"):
        runtime.check_device(-1)
    for bad in (True, 1.0, "0", None):
        with pytest.raises(TypeError, match="device must be a CUDA device ordinal"):
            runtime.check_device(bad)


# ----------------------------------------------------------------- C2 (helper for graph bindings): raw pointers


@pytest.fixture
def fake_memory(monkeypatch):
    """cuda:0 holds a 4 KiB allocation at PTR; cuda:1 one at PTR2; 0x5000 is registered host memory."""
    ptr2 = PTR + 2**30

    def pointer_info(ptr, device=None):
        if PTR <= ptr < PTR + 4096:
            return driver.PointerInfo("device", 0, PTR, 4096)
        if ptr2 <= ptr < ptr2 + 4096:
            return driver.PointerInfo("device", 1, ptr2, 4096)
        if 0x5000 <= ptr < 0x6000:
            return driver.PointerInfo("host", -1, 0x5000, 4096)
        return driver.PointerInfo("unknown", -1, 0, 0)

    monkeypatch.setattr(driver, "pointer_info", pointer_info)
    return ptr2


def test_C2_device_pointer_checks(fake_memory):
    check_device_pointer(PTR, 4096, 0, "x")
    check_device_pointer(PTR + 1024, 3072, 0, "x")
    check_device_pointer(0, 0, 0, "x")
    with pytest.raises(ValueError, match="^x is a NULL pointer but 16 bytes are needed"):
        check_device_pointer(0, 16, 0, "x")
    with pytest.raises(ValueError, match="tensor w .* is not CUDA device memory"):
        check_device_pointer(0xBAD000, 16, 0, "tensor w (uid 2)")
    with pytest.raises(ValueError, match="is page-locked host memory"):
        check_device_pointer(0x5000, 16, 0, "x")
    with pytest.raises(ValueError, match="is memory of cuda:1 but the call runs on cuda:0"):
        check_device_pointer(fake_memory, 16, 0, "x")
    with pytest.raises(ValueError, match="its allocation holds 1024 bytes from there on, but 2048 bytes are needed"):
        check_device_pointer(PTR + 3072, 2048, 0, "x")
    with pytest.raises(ValueError, match="pointers are unsigned 64-bit"):
        check_device_pointer(-16, 16, 0, "x")
    with pytest.raises(TypeError, match="x must be a device pointer"):
        check_device_pointer(1.5, 16, 0, "x")


def test_C2_pointer_without_a_driver_is_refused(no_driver):
    with pytest.raises(ValueError, match="x=0x7f0000000000: a raw pointer cannot be checked"):
        check_device_pointer(PTR, 16, 0, "x")


# ----------------------------------------------------------------- the fast path stays cheap


def test_prepare_fast_path_asks_nothing(fake_driver):
    """Contiguous inputs on the library's current stream: no copy, no driver query, the views as read."""
    ad = FakeAdapter()
    _, vx = fview(ad, (8, 16, 32))
    launch, (w,) = prepare(("x", vx))
    assert w is vx and ad.calls == [] and fake_driver == [] and launch == Launch(0, ad, 0x1111)


# ----------------------------------------------------------------- CAI v3 producer streams: ordered, not adopted
#
# An array whose ``__cuda_array_interface__`` names a producer ``stream`` other than the launch stream: the handle
# is checked (as validate_stream checks a producer's int), then the launch stream waits for it through an event
# (driver.order_after). Without an adapter and without ``stream=`` the first producer stream is still the launch
# stream (so it needs no wait); every other one is waited for.


@pytest.fixture
def ordered(fake_driver, monkeypatch):
    """fake_driver's streams, plus driver.order_after recorded as (producer, consumer, device)."""
    waits: list[tuple[int, int, int]] = []

    def order_after(producer, consumer, device):
        waits.append((producer, consumer, device))
        return True

    monkeypatch.setattr(driver, "order_after", order_after)
    return waits


def test_cai_stream_without_adapter_first_is_the_launch_stream_others_are_waited_for(ordered, fake_driver):
    launch, _ = prepare(("x", FakeCAI((2, 3), stream=0x5000)), ("w", FakeCAI((2, 3), stream=0x6000)))
    assert launch.stream == 0x5000  # today's choice: the first producer's stream
    assert fake_driver == [0x5000, 0x6000] and ordered == [(0x6000, 0x5000, 0)]
    # an array without a stream in between changes nothing; one on the launch stream needs no wait
    ordered.clear()
    prepare(("a", FakeCAI((2, 3))), ("x", FakeCAI((2, 3), stream=0x5000)), ("w", FakeCAI((2, 3), stream=0x5000)))
    assert ordered == []


def test_cai_stream_with_an_adapter_is_waited_for_on_the_library_stream(ordered, fake_driver):
    ad = FakeAdapter(stream=0x1111)
    _, vx = fview(ad, (2, 3))
    launch, _ = prepare(("x", vx), ("w", FakeCAI((2, 3), stream=0x5000)))
    assert launch.stream == 0x1111  # the library's current stream, as before
    assert fake_driver == [0x5000] and ordered == [(0x5000, 0x1111, 0)]


def test_cai_stream_with_stream_given_is_waited_for_on_it(ordered, fake_driver):
    launch, _ = prepare(("x", FakeCAI((2, 3), stream=0x5000)), stream=CoreStream(0x6000))
    assert launch.stream == 0x6000 and ordered == [(0x5000, 0x6000, 0)]


def test_cai_stream_equal_to_the_launch_stream_is_neither_asked_nor_waited_for(ordered, fake_driver):
    ad = FakeAdapter(stream=0x5000)
    _, vx = fview(ad, (2, 3))
    prepare(("x", vx), ("w", FakeCAI((2, 3), stream=0x5000)))
    assert fake_driver == [] and ordered == []


def test_cai_default_stream_handles_need_no_query(ordered, fake_driver):
    """1 (legacy default, CAI v3) and 0 (disallowed by CAI v3, taken as legacy) are one stream: no wait between
    them; 2 (per-thread default) against another stream goes to order_after, which knows the default-stream
    rules (tested below with a fake libcuda)."""
    ad0 = FakeAdapter(stream=0)
    _, v0 = fview(ad0, (2, 3))
    for h in (0, 1):
        prepare(("x", v0), ("w", FakeCAI((2, 3), stream=h)))
    assert prepare(("x", FakeCAI((2, 3), stream=1)), ("w", FakeCAI((2, 3), stream=0)))[0].stream == 0
    assert ordered == []
    prepare(("x", v0), ("w", FakeCAI((2, 3), stream=2)))
    assert ordered == [(2, 0, 0)] and fake_driver == []


def test_cai_stream_per_thread_is_not_refused_for_a_library_that_cannot_allocate_on_it(ordered):
    """torch refuses stream=2 for its allocator; a producer's 2 is only waited for, so it is taken."""
    ad = FakeAdapter(stream=0x1111)
    ad.refuse_special_stream = TorchLikeAdapter.refuse_special_stream
    _, vx = fview(ad, (2, 3))
    prepare(("x", vx), ("w", FakeCAI((2, 3), stream=2)))
    assert ordered == [(2, 0x1111, 0)]


@pytest.mark.parametrize("with_adapter", [False, True])
def test_cai_stream_garbage_is_refused_naming_the_array_before_any_wait(ordered, fake_driver, with_adapter):
    first = fview(FakeAdapter(), (2, 3))[1] if with_adapter else FakeCAI((2, 3), stream=0x5000)
    with pytest.raises(ValueError, match=r"^w's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        prepare(("x", first), ("w", FakeCAI((2, 3), stream=0xBAD000)))
    with pytest.raises(ValueError, match=r"^w's __cuda_array_interface__ stream=0x7000 is a stream of cuda:1"):
        prepare(("x", first), ("w", FakeCAI((2, 3), stream=0x7000)))
    with pytest.raises(ValueError, match="not a CUDA stream handle"):
        prepare(("x", first), ("w", FakeCAI((2, 3), stream=2**64)))
    assert ordered == []


def test_cai_stream_of_out_is_checked_and_waited_for(ordered, fake_driver):
    ad = FakeAdapter(stream=0x1111)
    _, vx = fview(ad, (2, 3))
    launch, _ = prepare(("x", vx))
    with pytest.raises(ValueError, match=r"^out's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        launch.output(FakeCAI((2, 3), stream=0xBAD000), (2, 3), "float32")
    with pytest.raises(ValueError, match=r"^out must have shape"):  # the array's own checks come first
        launch.output(FakeCAI((3, 3), stream=0xBAD000), (2, 3), "float32")
    assert ordered == []
    out = FakeCAI((2, 3), stream=0x6000)
    assert launch.output(out, (2, 3), "float32")[0] is out
    assert ordered == [(0x6000, 0x1111, 0)]


def test_cai_stream_without_a_driver_is_refused_as_uncheckable(no_driver, monkeypatch):
    monkeypatch.setattr(driver, "order_after", lambda *a: pytest.fail("ordered without a check"))
    _, vx = fview(FakeAdapter(), (2, 3))
    with pytest.raises(ValueError, match=r"^w's __cuda_array_interface__ stream=0x5000: a raw stream handle cannot"):
        prepare(("x", vx), ("w", FakeCAI((2, 3), stream=0x5000)))


def test_cai_stream_a_driver_failure_names_the_array(fake_driver, monkeypatch):
    def refuse(producer, consumer, device):
        raise RuntimeError("cuEventRecord on stream 0x5000 failed with CUresult 400")

    monkeypatch.setattr(driver, "order_after", refuse)
    _, vx = fview(FakeAdapter(), (2, 3))
    with pytest.raises(RuntimeError, match=r"^w's __cuda_array_interface__ stream=0x5000: cannot order the launch"):
        prepare(("x", vx), ("w", FakeCAI((2, 3), stream=0x5000)))


def test_cai_stream_absent_costs_nothing(ordered, fake_driver):
    """The fast path: arrays without a producer stream (adapter arrays, CAI without 'stream') ask nothing."""
    ad = FakeAdapter()
    _, vx = fview(ad, (2, 3))
    prepare(("x", vx), ("w", FakeCAI((2, 3))), ("b", FakeCAI((2, 3), stream=None)))
    prepare(("x", FakeCAI((2, 3))))
    assert ordered == [] and fake_driver == [] and ad.calls == []


class TorchLikeAdapter:
    @staticmethod
    def refuse_special_stream(stream, name="stream"):
        if stream == 2:
            raise ValueError(f"{name}=2 (cudaStreamPerThread) has no fake stream object")


class FakeCuda:
    """libcuda's entry points order_after uses, recorded in order; streams 0x5000 (blocking) and 0x6000
    (non-blocking) exist."""

    FLAGS = {0x5000: 0, 0x6000: 1}

    def __init__(self, fail=None):
        self.calls: list[tuple] = []
        self.fail = fail or {}
        self._next = 0xE000

    @staticmethod
    def _h(p):
        return p.value or 0 if isinstance(p, ctypes.c_void_p) else p

    def _rc(self, name):
        return self.fail.get(name, 0)

    def cuStreamGetFlags(self, stream, pflags):
        self.calls.append(("cuStreamGetFlags", self._h(stream)))
        pflags._obj.value = self.FLAGS[self._h(stream)]
        return self._rc("cuStreamGetFlags")

    def cuDevicePrimaryCtxRetain(self, pctx, device):
        self.calls.append(("cuDevicePrimaryCtxRetain", device))
        pctx._obj.value = 0xC000 + device
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, device):
        self.calls.append(("cuDevicePrimaryCtxRelease", device))
        return 0

    def cuCtxPushCurrent_v2(self, ctx):
        self.calls.append(("cuCtxPushCurrent", self._h(ctx)))
        return 0

    def cuCtxPopCurrent_v2(self, pctx):
        self.calls.append(("cuCtxPopCurrent",))
        return 0

    def cuEventCreate(self, pev, flags):
        self._next += 1
        self.calls.append(("cuEventCreate", flags))
        pev._obj.value = self._next
        return self._rc("cuEventCreate")

    def cuEventRecord(self, ev, stream):
        self.calls.append(("cuEventRecord", self._h(ev), self._h(stream)))
        return self._rc("cuEventRecord")

    def cuStreamWaitEvent(self, stream, ev, flags):
        self.calls.append(("cuStreamWaitEvent", self._h(stream), self._h(ev), flags))
        return self._rc("cuStreamWaitEvent")

    def cuEventDestroy_v2(self, ev):
        self.calls.append(("cuEventDestroy", self._h(ev)))
        return 0


@pytest.fixture
def fake_cuda(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(driver, "_load", lambda: cuda)
    monkeypatch.setattr(driver, "_contexts", {})
    monkeypatch.setattr(driver, "_events", {})
    return cuda


def test_order_after_skips_what_the_default_stream_rules_already_order(fake_cuda):
    for producer, consumer in [(0x5000, 0x5000), (0, 1), (1, 0), (1, 1), (1, 2), (2, 1), (0, 2), (2, 0)]:
        assert driver.order_after(producer, consumer, 0) is False, (producer, consumer)
    assert fake_cuda.calls == []  # no driver call at all
    # the legacy default stream and a blocking stream synchronize implicitly: one flags query
    assert driver.order_after(1, 0x5000, 0) is False and driver.order_after(0x5000, 0, 0) is False
    assert fake_cuda.calls == [("cuStreamGetFlags", 0x5000)] * 2


def test_order_after_records_on_the_producer_and_waits_on_the_consumer(fake_cuda):
    assert driver.order_after(0x5000, 0x6000, 0) is True
    assert fake_cuda.calls == [
        ("cuDevicePrimaryCtxRetain", 0),
        ("cuCtxPushCurrent", 0xC000),
        ("cuEventCreate", 2),  # CU_EVENT_DISABLE_TIMING
        ("cuEventRecord", 0xE001, 0x5000),
        ("cuStreamWaitEvent", 0x6000, 0xE001, 0),
        ("cuCtxPopCurrent",),
    ]
    fake_cuda.calls.clear()
    # the second time: the context is kept and the event comes back from the pool
    assert driver.order_after(2, 0x5000, 0) is True
    assert fake_cuda.calls == [
        ("cuCtxPushCurrent", 0xC000),
        ("cuEventRecord", 0xE001, 2),
        ("cuStreamWaitEvent", 0x5000, 0xE001, 0),
        ("cuCtxPopCurrent",),
    ]


def test_order_after_legacy_and_a_non_blocking_stream_need_the_event(fake_cuda):
    assert driver.order_after(0, 0x6000, 1) is True  # producer 0 (CAI: legacy) is recorded as the NULL stream
    assert fake_cuda.calls[0] == ("cuStreamGetFlags", 0x6000)
    assert ("cuEventRecord", 0xE001, 0) in fake_cuda.calls and ("cuDevicePrimaryCtxRetain", 1) in fake_cuda.calls
    fake_cuda.calls.clear()
    assert driver.order_after(0x6000, 1, 1) is True
    assert fake_cuda.calls[0] == ("cuStreamGetFlags", 0x6000)
    assert fake_cuda.calls[-2] == ("cuStreamWaitEvent", 1, 0xE001, 0)


@pytest.mark.parametrize("step", ["cuEventRecord", "cuStreamWaitEvent"])
def test_order_after_driver_failure_raises_and_cleans_up(fake_cuda, step):
    fake_cuda.fail = {step: 400}
    with pytest.raises(RuntimeError, match=rf"^{step} on stream 0x[56]000 failed with CUresult 400"):
        driver.order_after(0x5000, 0x6000, 0)
    assert fake_cuda.calls[-2:] == [("cuEventDestroy", 0xE001), ("cuCtxPopCurrent",)]  # not kept, context popped
    assert driver._events[0] == []


def test_order_after_without_a_driver(monkeypatch):
    def unavailable():
        raise driver.DriverUnavailable("the CUDA driver is not available: libcuda.so.1 not found")

    monkeypatch.setattr(driver, "_load", unavailable)
    assert driver.order_after(0x5000, 0x5000, 0) is False  # nothing to do needs no driver
    with pytest.raises(driver.DriverUnavailable):
        driver.order_after(0x5000, 0x6000, 0)


class FakePoolCuda(FakeCuda):
    """FakeCuda with a default memory pool (release threshold ``threshold``) and cuMemAllocAsync/cuMemFreeAsync."""

    def __init__(self, threshold=0):
        super().__init__()
        self.threshold = threshold

    def cuDeviceGetDefaultMemPool(self, ppool, device):
        self.calls.append(("cuDeviceGetDefaultMemPool", device))
        ppool._obj.value = 0xB000 + device
        return 0

    def cuMemPoolGetAttribute(self, pool, attr, pvalue):
        self.calls.append(("cuMemPoolGetAttribute", self._h(pool), attr))
        pvalue._obj.value = self.threshold
        return 0

    def cuMemPoolSetAttribute(self, pool, attr, pvalue):
        self.calls.append(("cuMemPoolSetAttribute", self._h(pool), attr, pvalue._obj.value))
        self.threshold = pvalue._obj.value
        return 0

    def cuMemAllocAsync(self, pptr, nbytes, stream):
        self.calls.append(("cuMemAllocAsync", nbytes))
        pptr._obj.value = 0xD0000
        return 0

    def cuMemFreeAsync(self, ptr, stream):
        self.calls.append(("cuMemFreeAsync", ptr))
        return 0


@pytest.mark.parametrize("before, after", [(0, driver.POOL_KEEP_BYTES), (123, 123)])
def test_the_default_pool_keeps_memory_once_cudnnkit_allocates(monkeypatch, before, after):
    """The first DeviceMemory on a device raises the default pool's release threshold from the driver's 0 (memory
    given back at each synchronization, mapped anew by the next allocation) to POOL_KEEP_BYTES; a threshold set by
    someone else stays; later allocations ask no more."""
    cuda = FakePoolCuda(before)
    monkeypatch.setattr(driver, "_load", lambda: cuda)
    monkeypatch.setattr(driver, "_contexts", {})
    monkeypatch.setattr(driver, "_pools_kept", set())
    m = driver.DeviceMemory(64, 0, 0x5000)
    m.free(0x5000)
    driver.DeviceMemory(64, 0, 0x5000).free(0x5000)
    assert cuda.threshold == after
    names = [c[0] for c in cuda.calls]
    assert names.count("cuDeviceGetDefaultMemPool") == 1 and names.count("cuMemAllocAsync") == 2
    assert names.count("cuMemPoolSetAttribute") == (1 if before == 0 else 0)
    assert names.index("cuMemPoolGetAttribute") < names.index("cuMemAllocAsync")


def test_tensor_descriptors_refuse_a_span_past_cudnns_int_and_take_one_row_slices():
    """``cudnnSetTensorNdDescriptor`` answers NOT_SUPPORTED for more than 2**31 - 1 elements spanned, with every dim
    and stride in range: refused before the call (``IntRangeError``, a ValueError the ops name the array by); a
    size-1 dim's stride past cuDNN's int (a one-row slice of a large array: it never addresses memory) is given
    the other dims' span, as C order would."""
    from cudnnkit.runtime.descriptors import INT_MAX, IntRangeError, tensor_descriptor

    with pytest.raises(IntRangeError, match=r"spans more than 2\*\*31 - 1 elements"):
        tensor_descriptor("float32", (3, 1, 32768, 32768), (2**30, 2**30, 32768, 1))
    d = tensor_descriptor("float32", (1, 4), (2**31, 1))
    assert d.key[2][:2] == (1, 4) and d.key[3][:2] == (4, 1)
    d = tensor_descriptor("float32", (1, 3, 1, 5), (0, 5, 2**40, 1))  # a broadcast N keeps 1, a huge H the span
    assert d.key[3] == (1, 5, 15, 1) and max(d.key[3]) <= INT_MAX


def test_a_handle_is_destroyed_with_its_device_current(monkeypatch):
    """A thread that drops its handles (at its end) may have another device current; cudnnDestroy synchronizes the
    current device, so the handle's own device is pushed around it; where it cannot be pushed without a lock (no
    driver loaded, or the context never retained) it is destroyed as it is, once. The finalizer takes no lock: the
    garbage collector may run it on a thread that holds the driver's."""
    import contextlib
    import threading

    from cudnnkit import lib
    from cudnnkit.runtime import driver, handle

    events = []

    @contextlib.contextmanager
    def pushed(device):
        events.append(("push", device))
        yield
        events.append(("pop", device))

    monkeypatch.setattr(lib, "cudnnDestroy", lambda ptr: events.append(("destroy", ptr)))
    monkeypatch.setattr(driver, "pushed_if_ready", lambda device: pushed(device))
    h = object.__new__(handle.Handle)
    h.ptr, h.device = 0x1234, 1
    h.__del__()
    assert events == [("push", 1), ("destroy", 0x1234), ("pop", 1)] and h.ptr is None

    events.clear()
    monkeypatch.undo()
    monkeypatch.setattr(lib, "cudnnDestroy", lambda ptr: events.append(("destroy", ptr)))
    monkeypatch.setattr(driver, "_contexts", {})  # nothing retained: no push, and no lock taken to retain one
    h.ptr = 0x5678
    done = threading.Event()
    with driver._lock:  # the collector running the finalizer on a thread inside the driver's lock
        t = threading.Thread(target=lambda: (h.__del__(), done.set()), daemon=True)
        t.start()
        t.join(5)
    assert done.is_set(), "Handle.__del__ waited for the driver's lock"
    assert events == [("destroy", 0x5678)] and h.ptr is None
