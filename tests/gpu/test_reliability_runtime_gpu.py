"""GPU regression tests for the runtime's part of issue 10: real streams, real memory, real expanded views.

C1: stream objects are checked with the CUDA driver before they reach cuDNN or the array library; a raw
``stream=`` int is accepted only as 0/1/2 (torch refuses 2), the library's current stream or the handle of a
stream object already used, and refused otherwise without asking the driver (a readable host address that is
no stream crashes its query). Every garbage case runs in a subprocess, so a crash fails the test instead of
killing pytest, and the subprocess syncs and runs a sanity op afterwards (a lost context shows). U1: expanded, overlapping and reversed inputs
are copied and give the float64 NumPy reference; such outputs are refused by name. C2/C3/U10/U12 as named.
Runs for CuPy and torch (the ``xp`` fixture).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cudnnkit import ops, runtime
from cudnnkit.runtime import check_device_pointer, prepare, validate_stream

from ..conv_reference import conv_forward as ref_conv
from ..numerics import dev, host, poisoned, rel, seen
from .test_norm_dropout_gpu import ref_lrn

pytestmark = pytest.mark.gpu

TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3}


def new_stream(xp):
    """A new non-blocking stream of the adapter's library and its raw handle."""
    if xp.name == "torch":
        s = xp.module.cuda.Stream()
        return s, s.cuda_stream
    s = xp.module.cuda.Stream(non_blocking=True)
    return s, s.ptr


def expand(xp, arr, shape):
    return arr.expand(*shape) if xp.name == "torch" else xp.module.broadcast_to(arr, shape)


def as_strided(xp, arr, shape, strides):
    """A view of ``arr`` with element ``strides`` (may overlap)."""
    if xp.name == "torch":
        return arr.as_strided(shape, strides)
    isz = arr.dtype.itemsize
    return xp.module.lib.stride_tricks.as_strided(arr, shape, tuple(s * isz for s in strides))


def ref_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------- C1: streams


def test_C1_library_streams_and_their_raw_handles_are_accepted(xp):
    s, h = new_stream(xp)
    runtime.clear_stream_cache()  # torch hands out pooled streams: forget the handles earlier tests made known
    x = dev(xp, np.random.default_rng().standard_normal((4, 9)), "float32")
    xp.synchronize(0)
    with pytest.raises(ValueError, match=r"stream=0x[0-9a-f]+ is a raw stream handle"):
        validate_stream(h, xp, 0)  # the raw int of a live stream whose object was not used yet
    with pytest.raises(ValueError, match="is a raw stream handle"):
        ops.softmax_forward(x, stream=h)
    assert validate_stream(s, xp, 0) == h  # the object: asked of the driver, then cached
    assert validate_stream(h, xp, 0) == h  # now its raw handle is known
    # torch's allocator has no stream object for cudaStreamPerThread (2); 1 is torch's default stream to it
    specials = (0, 1) if xp.name == "torch" else (0, 1, 2)
    for stream in (s, h, *specials):
        y = ops.softmax_forward(x, stream=stream)
        xp.synchronize(0)
        assert rel(host(xp, y), ref_softmax(host(xp, x))) < TOL["float32"], stream
    if xp.name == "torch":
        with pytest.raises(ValueError, match=r"stream=2 \(cudaStreamPerThread\) has no torch stream object"):
            ops.softmax_forward(x, stream=2)
        with pytest.raises(ValueError, match=r"stream=2 \(cudaStreamPerThread\)"):
            prepare(("x", x), stream=2)


def test_C1_current_stream_int_is_accepted(xp):
    h = xp.current_stream(0)
    launch, _ = prepare(("x", dev(xp, np.ones((2, 3)))), stream=h)
    assert launch.stream == h


def test_C1_stream_of_another_device_is_refused(xp):
    if xp.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with xp.device_guard(1):
        s, h = new_stream(xp)
    x = dev(xp, np.ones((2, 3)))
    runtime.clear_stream_cache()
    with pytest.raises(ValueError, match="is a stream of cuda:1 but the arrays are on cuda:0"):
        ops.softmax_forward(x, stream=s)  # the object: asked of the driver, which names its device
    with pytest.raises(ValueError, match="is a raw stream handle"):
        ops.softmax_forward(x, stream=h)  # its raw int: never found live on cuda:0, so refused as raw
    with xp.device_guard(1):
        assert validate_stream(s, xp, 1) == h  # on its own device it is a live stream
    with pytest.raises(ValueError, match="is a raw stream handle"):
        ops.softmax_forward(x, stream=h)  # known on cuda:1, still not a stream of cuda:0


_RAW = ("ValueError", "is a raw stream handle")
#: case -> (the value's expression, the exception expected, a fragment of its text, whether the driver is asked)
_GARBAGE = {
    "0xBAD000": ("0xBAD000", *_RAW, False),
    "2**63": ("2**63", *_RAW, False),
    "12345": ("12345", *_RAW, False),
    "-1": ("-1", "ValueError", "is not a CUDA stream handle", False),
    "2**64": ("2**64", "ValueError", "is not a CUDA stream handle", False),
    "float": ("1.5", "TypeError", "stream must be None", False),
    "str": ("'default'", "TypeError", "stream must be None", False),
    # readable host memory that is not a stream: as a raw int it is never asked about (it crashed the driver)
    "host_object": ("keep.append(object()) or id(keep[-1])", *_RAW, False),
    "host_buffer": ("keep.append(ctypes.create_string_buffer(4096)) or ctypes.addressof(keep[-1])", *_RAW, False),
    "device_pointer": ("x_ptr", *_RAW, False),  # device memory is not a stream either
    # a stream object over an unmapped address: asked of the driver, after the readable-memory probe refuses it
    "object_0xBAD000": ("Garbage(0xBAD000)", "ValueError", "is not a live CUDA stream", True),
}


@pytest.mark.parametrize("case", sorted(_GARBAGE))
def test_C1_garbage_stream_is_refused_without_a_crash(xp, case):
    """Each garbage value, in its own process, through prepare, softmax_forward and lrn_backward (the paths that
    crashed in cudnnSetStream and in torch's allocator under ExternalStream): a clean exception naming
    ``stream``, and a raw int never reaches the driver."""
    expr, exc, fragment, asks = _GARBAGE[case]
    code = textwrap.dedent(
        f"""
        import ctypes
        import numpy as np
        from cudnnkit import ops
        from cudnnkit.runtime import adapters, driver, prepare
        asked = []
        real = driver.stream_device
        driver.stream_device = lambda h: asked.append(h) or real(h)  # what reaches the driver

        class Garbage:
            def __init__(self, h):
                self.h = h

            def __cuda_stream__(self):
                return (0, self.h)

        xp = adapters.get({xp.name!r})
        x = xp.from_numpy(np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32), 0)
        y = ops.lrn_forward(x)
        x_ptr = prepare(("x", x))[1][0].ptr
        keep = []
        bad = {expr}
        calls = {{
            "prepare": lambda: prepare(("x", x), stream=bad),
            "softmax_forward": lambda: ops.softmax_forward(x, stream=bad),
            "lrn_backward": lambda: ops.lrn_backward(y, y, x, stream=bad),
        }}
        for name, call in calls.items():
            try:
                call()
            except (TypeError, ValueError) as e:
                assert "stream" in str(e), e
                print("REFUSED", name, type(e).__name__, e, flush=True)
            else:
                print("ACCEPTED", name, flush=True)
        print("ASKED", len(asked), flush=True)
        xp.synchronize(0)
        z = ops.softmax_forward(x)  # the context survived
        xp.synchronize(0)
        assert np.isfinite(xp.to_numpy(z)).all()
        print("SANE", flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"
    assert r.stdout.count("REFUSED") == 3 and "SANE" in r.stdout, r.stdout
    refusals = [ln for ln in r.stdout.splitlines() if ln.startswith("REFUSED")]
    assert all(ln.split()[2] == exc and fragment in ln for ln in refusals), r.stdout
    assert f"ASKED {3 if asks else 0}" in r.stdout, r.stdout  # each object asked once; raw ints never


# ----------------------------------------------------------------- U1: expanded, overlapping, reversed views


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_U1_softmax_of_an_expanded_view(xp, dtype):
    a = np.random.default_rng().standard_normal((1, 7))
    x = expand(xp, dev(xp, a, dtype), (5, 7))
    y = ops.softmax_forward(x, out=poisoned(xp, (5, 7), dtype))
    assert rel(host(xp, y), ref_softmax(np.broadcast_to(seen(a, dtype), (5, 7)))) < TOL[dtype]
    b = np.random.default_rng().standard_normal((5, 1))
    x = expand(xp, dev(xp, b, dtype), (5, 7))  # expanded along the softmax axis
    y = ops.softmax_forward(x)
    np.testing.assert_allclose(host(xp, y), np.full((5, 7), 1 / 7), rtol=TOL[dtype])


def test_U1_softmax_of_an_overlapping_view(xp):
    a = np.random.default_rng().standard_normal(32)
    x = as_strided(xp, dev(xp, a, "float64"), (6, 5), (2, 1))  # rows overlap
    want = ref_softmax(np.lib.stride_tricks.as_strided(a, (6, 5), (16, 8)))
    assert rel(host(xp, ops.softmax_forward(x)), want) < TOL["float64"]


def test_U1_softmax_of_a_reversed_view(xp):
    if xp.name == "torch":
        pytest.skip("torch has no negative strides")
    a = np.random.default_rng().standard_normal((4, 6))
    x = dev(xp, a, "float64")[:, ::-1]
    assert rel(host(xp, ops.softmax_forward(x)), ref_softmax(a[:, ::-1])) < TOL["float64"]


def test_U1_softmax_backward_with_an_expanded_dy(xp):
    rng = np.random.default_rng()
    a, g = rng.standard_normal((4, 6)), rng.standard_normal((1, 6))
    y = ops.softmax_forward(dev(xp, a, "float64"))
    dy = expand(xp, dev(xp, g, "float64"), (4, 6))
    dx = ops.softmax_backward(dy, y)
    yh, gh = host(xp, y), np.broadcast_to(g, (4, 6))
    want = yh * (gh - (gh * yh).sum(axis=-1, keepdims=True))
    assert rel(host(xp, dx), want) < TOL["float64"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_U1_lrn_of_an_expanded_view(xp, dtype):
    a = np.random.default_rng().standard_normal((2, 1, 4, 5))
    x = expand(xp, dev(xp, a, dtype), (2, 6, 4, 5))  # the same values in every channel
    p = dict(size=5, alpha=0.7, beta=0.6, k=1.3)
    y = ops.lrn_forward(x, **p, out=poisoned(xp, (2, 6, 4, 5), dtype))
    want, _ = ref_lrn(np.broadcast_to(seen(a, dtype), (2, 6, 4, 5)).copy(), **p)
    assert rel(host(xp, y), want) < TOL[dtype]


def test_U1_dropout_of_expanded_and_overlapping_views(xp):
    a = np.random.default_rng().uniform(0.5, 1.5, (1, 64))
    for x, xa in (
        (expand(xp, dev(xp, a, "float32"), (32, 64)), np.broadcast_to(a, (32, 64))),
        (
            as_strided(xp, dev(xp, a.ravel(), "float32"), (16, 32), (2, 1)),
            np.lib.stride_tricks.as_strided(a.ravel(), (16, 32), (16, 8)),
        ),
    ):
        y, reserve = ops.dropout_forward(x, 0.5, out=poisoned(xp, xa.shape, "float32"))
        yh = host(xp, y)
        kept = yh != 0
        assert 0.3 < kept.mean() < 0.7
        assert rel(yh[kept], seen(xa, "float32")[kept] * 2) < 1e-6


def test_U1_set_and_scale_tensor_on_an_expanded_view(xp):
    base = dev(xp, np.arange(5.0).reshape(1, 5), "float64")
    view = expand(xp, base, (4, 5))
    ops.scale_tensor(view, 3.0)  # each memory location scaled once
    np.testing.assert_array_equal(host(xp, base), 3 * np.arange(5.0).reshape(1, 5))
    ops.set_tensor(view, -2.5)
    np.testing.assert_array_equal(host(xp, view), np.full((4, 5), -2.5))


def test_U1_expanded_or_overlapping_out_is_refused(xp):
    x = dev(xp, np.ones((4, 5)), "float32")
    out = expand(xp, poisoned(xp, (1, 5), "float32"), (4, 5))
    with pytest.raises(ValueError, match="out is expanded .* an output must address each element once"):
        ops.softmax_forward(x, out=out)
    out = as_strided(xp, poisoned(xp, (8,), "float32"), (4, 5), (1, 1))
    with pytest.raises(ValueError, match="out overlaps itself"):
        ops.softmax_forward(x, out=out)
    with pytest.raises(ValueError, match="c is expanded .*written in place"):
        ops.add_tensor(x, expand(xp, poisoned(xp, (1, 5), "float32"), (4, 5)))


# ----------------------------------------------------------------- C3 / U7: NULL pointers


class NullCAI:
    """A CAI object over ``arr`` with its data pointer replaced by NULL."""

    def __init__(self, arr, xp):
        v = prepare(("a", arr))[1][0]
        self.__cuda_array_interface__ = {
            "shape": v.shape,
            "typestr": "<f4",
            "strides": None,
            "data": (0, False),
            "version": 3,
        }
        self.device = 0


def test_C3_null_cai_pointer_is_refused_and_the_context_survives(xp):
    x = dev(xp, np.ones((2, 3, 4)), "float32")
    with pytest.raises(ValueError, match="x: __cuda_array_interface__ data pointer is NULL"):
        ops.softmax_forward(NullCAI(x, xp), out=dev(xp, np.ones((2, 3, 4)), "float32"))
    with pytest.raises(ValueError, match="x: __cuda_array_interface__ data pointer is NULL"):
        ops.rnn_forward(NullCAI(x, xp), dev(xp, np.ones(100), "float32"), rnn=ops.RNN("lstm", 4, 8))
    xp.synchronize(0)
    assert rel(host(xp, ops.softmax_forward(x)), np.full((2, 3, 4), 0.25)) < 1e-6


# ----------------------------------------------------------------- U10: mixed libraries


def _other(xp):
    from cudnnkit.runtime import adapters

    from ..conftest import gpu_libraries

    name = "cupy" if xp.name == "torch" else "torch"
    if name not in gpu_libraries():
        pytest.skip(f"{name} is not installed or sees no CUDA device")
    return adapters.get(name)


def test_U10_softmax_backward_with_arrays_of_two_libraries(xp):
    other = _other(xp)
    rng = np.random.default_rng()
    a, g = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    y = ops.softmax_forward(dev(other, a, "float64"))
    dx = ops.softmax_backward(dev(xp, g, "float64"), y)  # dy of xp, y of the other library
    assert type(dx).__module__.partition(".")[0] == xp.name  # allocated by the first array's library
    yh = host(other, y)
    want = yh * (g - (g * yh).sum(axis=-1, keepdims=True))
    assert rel(host(xp, dx), want) < TOL["float64"]
    dy = expand(xp, dev(xp, g[:1], "float64"), (4, 6))  # needs a copy, made by its own library
    dx = ops.softmax_backward(dy, y)
    gb = np.broadcast_to(g[:1], (4, 6))
    assert rel(host(xp, dx), yh * (gb - (gb * yh).sum(axis=-1, keepdims=True))) < TOL["float64"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_U10_a_copy_into_a_layout_by_another_library_keeps_its_dtype(xp, dtype):
    """GPU fuzz seed 27 (case 219): a fused convolution whose z of one library needs a channels-last copy made by
    the other's (the first array's). A bfloat16 torch tensor came to CuPy through ``__cuda_array_interface__``
    as raw bytes ("|V2") and CuPy refused to copy them into a bfloat16 array (a TypeError from inside CuPy);
    DLPack names the dtype. The result matches the float64 reference either way round."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    other = _other(xp)
    rng = np.random.default_rng(27)
    x = seen(rng.standard_normal((2, 4, 6, 5)), dtype)
    w = seen(rng.standard_normal((6, 4, 3, 3)) / 6, dtype)
    conv = ref_conv(x, w, stride=(1, 1), pad=(1, 1), dilation=(1, 1))
    b, z = seen(rng.standard_normal(6), dtype), seen(rng.standard_normal(conv.shape), dtype)
    want = np.maximum(conv + b.reshape(1, -1, 1, 1) + z, 0)
    # x channels-last of xp (the launch's library); w, bias and a channels-first z of the other library
    got = ops.convolution_forward(dev(xp, x, dtype, "nhwc"), dev(other, w, dtype, "nhwc"), dev(other, b, dtype),
                                  z=dev(other, z, dtype), activation="relu", padding=1)  # fmt: skip
    assert rel(host(xp, got), want) < 2e-2


def test_U10_out_of_another_library(xp):
    other = _other(xp)
    a = np.random.default_rng().standard_normal((3, 5))
    out = poisoned(other, (5, 3), "float64").T  # another library, another layout
    y = ops.softmax_forward(dev(xp, a, "float64"), out=out)
    assert y is out and rel(host(other, out), ref_softmax(a)) < TOL["float64"]


# ----------------------------------------------------------------- U12: allocator internals


def test_U12_huge_output_is_a_value_error_naming_it(xp):
    """What torch called "Storage size calculation overflowed": refused before the allocator is asked."""
    launch, _ = prepare(("x", dev(xp, np.ones(4))))
    shape = (200001, 200001, 200002, 200002)  # transform_tensor(pad_before=100000, pad_after=100000) of (1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"^y would have shape \(200001, .* overflows int64"):
        launch.output(None, shape, "float32", name="y")
    xp.synchronize(0)


def test_U12_out_of_memory_is_a_memory_error_naming_it(xp):
    launch, _ = prepare(("x", dev(xp, np.ones(4))))
    with pytest.raises(MemoryError, match=r"cannot allocate scratch \(float32, shape \(17592186044416,\), 64 TiB\)"):
        launch.empty((2**44,), "float32", name="scratch")
    xp.synchronize(0)


# ----------------------------------------------------------------- C2: raw pointers (runtime helper)


def test_C2_check_device_pointer_on_real_memory(xp):
    arr = dev(xp, np.ones(1024), "float32")
    v = prepare(("a", arr))[1][0]
    check_device_pointer(v.ptr, 4096, 0, "a")
    check_device_pointer(v.ptr + 1024, 3072, 0, "a")
    with pytest.raises(ValueError, match="a=0x[0-9a-f]+: its allocation holds"):
        check_device_pointer(v.ptr, 2**40, 0, "a")  # far past any pool block
    host_buf = np.ones(1024, np.float32)
    with pytest.raises(ValueError, match="is not CUDA device memory"):
        check_device_pointer(host_buf.ctypes.data, 4096, 0, "h")
    for bad in (0xBAD000, 2**63, 12345):
        with pytest.raises(ValueError, match="is not CUDA device memory"):
            check_device_pointer(bad, 16, 0, "g")
    if xp.device_count() > 1:
        with pytest.raises(ValueError, match="is memory of cuda:0 but the call runs on cuda:1"):
            check_device_pointer(v.ptr, 16, 1, "a")


def test_C2_pinned_host_memory_is_refused(xp):
    if xp.name != "torch":
        pytest.skip("pinned allocation through torch")
    t = xp.module.ones(256, pin_memory=True)
    with pytest.raises(ValueError, match="page-locked host memory"):
        check_device_pointer(t.data_ptr(), 1024, 0, "t")


def test_stream_cache_is_cleared_with_the_caches(xp):
    s, h = new_stream(xp)
    assert validate_stream(s, xp, 0) == h
    assert validate_stream(h, xp, 0) == h  # known through its object
    runtime.clear_caches()
    with pytest.raises(ValueError, match="is a raw stream handle"):
        validate_stream(h, xp, 0)  # forgotten
    assert validate_stream(s, xp, 0) == h and validate_stream(h, xp, 0) == h


class _CaiWithStream:
    """A bare ``__cuda_array_interface__`` over ``arr``'s memory naming producer stream ``stream``."""

    def __init__(self, arr, stream):
        cai = dict(arr.__cuda_array_interface__)
        cai["stream"] = stream
        self.__cuda_array_interface__ = cai
        self._keep = arr


def test_a_cai_out_with_a_garbage_producer_stream_is_refused_without_a_crash(xp):
    # issue 10's fuzzer (a SIGSEGV): an out= CAI in another layout than x, naming producer stream 0xBAD000, was
    # written through a temporary and a copy that handed the CAI object to CuPy/torch, which synchronized on
    # that garbage handle. Since issue 11 a producer stream is checked and waited for (an event), so a handle
    # that is not a live stream is refused by name, before any GPU work, and out is left as it was
    a = np.random.default_rng().standard_normal((2, 6))
    x = xp.from_numpy(a, 0).T  # (6, 2), transposed
    target = xp.from_numpy(np.full((6, 2), np.nan), 0)
    with pytest.raises(ValueError, match=r"out's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        ops.softmax_forward(x, axis=0, out=_CaiWithStream(target, 0xBAD000))
    assert np.isnan(host(xp, target)).all()


# ----------------------------------------------------------------- CAI v3 producer streams are waited for

_SPIN_CYCLES = 2**30  # about half a second of GPU clock: the op is queued long before the producer is done


def _busy_then(xp, stream, write):
    """Queue on library stream object ``stream``: a single-thread kernel spinning ``_SPIN_CYCLES``, then
    ``write()`` (a library call, so it lands on ``stream`` too). Returns at once: the host does not wait."""
    if xp.name == "torch":
        torch = xp.module
        with torch.cuda.stream(stream):
            torch.cuda._sleep(_SPIN_CYCLES)
            write()
        return
    cupy = xp.module
    spin = cupy.RawKernel(
        r"""extern "C" __global__ void spin(long long cycles) {
            long long t0 = clock64();
            while (clock64() - t0 < cycles) { }
        }""",
        "spin",
    )
    with stream:
        spin((1,), (1,), (cupy.int64(_SPIN_CYCLES),))
        write()


class _CaiV3:
    """A bare ``__cuda_array_interface__`` v3 over ``arr``'s memory naming producer stream ``stream`` (none
    when ``None``: the array library's own ``stream`` entry, if any, is dropped)."""

    def __init__(self, arr, stream):
        cai = {k: v for k, v in arr.__cuda_array_interface__.items() if k != "stream"}
        cai["version"] = 3
        if stream is not None:
            cai["stream"] = stream
        self.__cuda_array_interface__ = cai
        self._keep = arr


def _fill(xp, arr, src):
    """``arr[...] = src`` by the library (queued on its current stream)."""
    if xp.name == "torch":
        return lambda: arr.copy_(src)
    return lambda: xp.module.copyto(arr, src)


@pytest.mark.parametrize("case", ["input without adapter", "input with adapter", "out"])
def test_cai_producer_stream_is_waited_for(xp, case):
    """A CAI object naming a new non-blocking producer stream P, whose queued kernel writes the array after half
    a second of spinning; the op runs on another stream (``stream=`` C, or the library's current stream) and
    must see (input) or come after (out) that write. The control, the same CAI without its ``stream``, shows the
    race is real: the op then ran before the write."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 1024))
    want = ref_softmax(a)
    src = dev(xp, a, "float32")
    p, hp = new_stream(xp)
    c, _ = new_stream(xp)
    xp.synchronize(0)

    def run(with_stream: bool):
        cai_stream = hp if with_stream else None
        if case == "out":  # P fills out with NaN late; the op's result must land after that
            x = dev(xp, a, "float32")
            out = poisoned(xp, a.shape, "float32")
            nan = poisoned(xp, a.shape, "float32")
            xp.synchronize(0)
            _busy_then(xp, p, _fill(xp, out, nan))
            ops.softmax_forward(x, out=_CaiV3(out, cai_stream), stream=c)
            got, expect = out, want
        else:  # P writes x late; the op must read the written values
            x = dev(xp, np.zeros_like(a), "float32")
            got = dev(xp, np.zeros_like(a), "float32")
            xp.synchronize(0)  # device-wide: only before P's spin is queued, or it would wait for P
            _busy_then(xp, p, _fill(xp, x, src))
            if case == "input without adapter":
                ops.softmax_forward(_CaiV3(x, cai_stream), out=got, stream=c)
            else:  # c of the library: its current stream is the launch stream
                ops.add_tensor(_CaiV3(x, cai_stream), got)  # got = x + got
            expect = ref_softmax(a) if case == "input without adapter" else a
        xp.synchronize(0)  # every stream: P's write and the op are both done
        return host(xp, got), expect

    got, expect = run(with_stream=True)
    assert np.isfinite(got).all() and rel(got, expect) < 1e-5, case
    got, expect = run(with_stream=False)  # the control: nothing orders the op after P
    assert not (np.isfinite(got).all() and rel(got, expect) < 1e-5), f"{case}: the op did not race ahead of P"


# ----------------------------------------------------------------- device values owned by no library


def test_device_values_upload_read_back_and_free_on_its_stream(xp):
    """``driver.DeviceValues``: host int32 values on the device (read back through the library), on a side
    stream; freed stream-ordered (its own stream) or with a wait (another one); capture status of a plain stream."""
    from cudnnkit.runtime import driver

    s, h = new_stream(xp)
    vals = np.arange(1, 1001, dtype=np.int32)
    buf = driver.DeviceValues(vals, 0, h)
    assert buf.ptr and buf.nbytes == vals.nbytes and not driver.stream_capturing(h, 0)
    s.synchronize()

    class Raw:  # the raw pointer seen by the library through the CUDA array interface (no copy, no ownership)
        __cuda_array_interface__ = {"shape": (1000,), "typestr": "<i4", "data": (buf.ptr, False), "version": 3,
                                    "strides": None, "stream": None}  # fmt: skip

    dev_arr = xp.module.asarray(Raw()) if xp.name == "cupy" else xp.module.as_tensor(Raw(), device="cuda")
    back = host(xp, dev_arr).astype(np.int32)
    np.testing.assert_array_equal(back, vals)
    buf.free(h)
    assert buf.ptr == 0
    buf.free(h)  # once only
    other = driver.DeviceValues(vals[:3], 0, h)
    other.free(0)  # another stream: cuMemFree, waiting
    assert other.ptr == 0


def test_device_values_stream_capturing_sees_a_torch_graph_capture():
    torch = pytest.importorskip("torch")
    from cudnnkit.runtime import driver

    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(4, device="cuda")
    with torch.cuda.stream(s):
        x.add_(1)  # warm-up
    torch.cuda.synchronize()
    seen = []
    with torch.cuda.graph(g, stream=s):
        seen.append(driver.stream_capturing(s.cuda_stream, 0))
        x.add_(1)
    assert seen == [True] and not driver.stream_capturing(s.cuda_stream, 0)
