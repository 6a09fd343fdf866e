"""XLA's FFI from Python (cudnnkit.jax._ffi) on JAX's CPU platform: a handler written in Python, registered and
called under ``jax.jit``, reading its buffers and every kind of attribute, writing its results, and reporting a
Python exception back through XLA as an error. The CUDA handlers of the ops are the same machinery with a
stream (the GPU tier)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from cudnnkit.jax import _ffi  # noqa: E402


@pytest.fixture(autouse=True)
def on_the_cpu():
    """These handlers are registered for JAX's CPU platform: the arrays go there (a GPU machine's default is CUDA)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


_CT = {"float32": ctypes.c_float, "float64": ctypes.c_double, "int32": ctypes.c_int32}


def _host(b: _ffi.Buffer) -> np.ndarray:
    """A CPU buffer as a NumPy array over its memory (no copy)."""
    n = int(np.prod(b.shape, dtype=np.int64))
    arr = (_CT[b.dtype] * max(n, 1)).from_address(b.ptr)
    return np.ctypeslib.as_array(arr)[:n].reshape(b.shape)


SEEN: list[_ffi.Call] = []


def _axpy(call: _ffi.Call) -> None:
    """rets[0] = scale * args[0] + args[1]; rets[1] = the row sums; attrs echoed into SEEN."""
    SEEN.append(call)
    x, y = (_host(b) for b in call.args)
    out, sums = (_host(b) for b in call.rets)
    if call.attrs.get("fail"):
        raise ValueError(f"asked to fail with mode={call.attrs['mode']!r}")
    out[...] = call.attrs["scale"] * x + y
    sums[...] = out.sum(axis=1)


HANDLER = _ffi.register("cudnnkit_test_axpy", _ffi.Handler(_axpy, platform="cpu"))


def _call(x, y, **attrs):
    f = jax.ffi.ffi_call(
        "cudnnkit_test_axpy",
        (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape[:1], x.dtype)),
    )
    return f(x, y, **attrs)


def test_a_python_handler_runs_under_jit_with_its_buffers_and_attributes():
    SEEN.clear()
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    y = jnp.ones((3, 4), jnp.float32)
    attrs = dict(scale=np.float32(2.5), n=np.int64(7), flag=True, mode="relu", dims=np.array([1, 2, 3], np.int64))
    out, sums = jax.jit(lambda a, b: _call(a, b, **attrs))(x, y)
    np.testing.assert_allclose(np.asarray(out), 2.5 * np.asarray(x) + 1)
    np.testing.assert_allclose(np.asarray(sums), (2.5 * np.asarray(x) + 1).sum(1))
    (call,) = SEEN
    assert call.stream == 0 and [b.shape for b in call.args] == [(3, 4), (3, 4)]
    assert [b.dtype for b in call.args + call.rets] == ["float32"] * 4 and call.rets[1].shape == (3,)
    a = call.attrs
    assert a["scale"] == 2.5 and a["n"] == 7 and a["flag"] is True and a["mode"] == "relu"
    assert a["dims"] == (1, 2, 3) and HANDLER.calls >= 1


def test_registering_twice_returns_the_first_handler():
    again = _ffi.register("cudnnkit_test_axpy", _ffi.Handler(_axpy, platform="cpu"))
    assert again is HANDLER and _ffi.registered()[("cudnnkit_test_axpy", "cpu")] is HANDLER


def test_a_python_exception_comes_back_as_an_xla_error_naming_it():
    x = jnp.zeros((2, 2), jnp.float32)
    with pytest.raises(Exception, match=r"cudnnkit: ValueError: asked to fail with mode='tanh'") as e:
        jax.block_until_ready(_call(x, x, scale=np.float32(1.0), fail=True, mode="tanh"))
    assert "Segmentation" not in str(e.value)
    out, _ = _call(x, x + 1, scale=np.float32(3.0))  # the process and the target still work
    np.testing.assert_allclose(np.asarray(out), 1.0)


def test_a_buffer_of_a_dtype_cudnn_cannot_name_is_refused_clearly():
    x = jnp.zeros((2, 2), jnp.complex64)
    f = jax.ffi.ffi_call("cudnnkit_test_axpy", (jax.ShapeDtypeStruct((2, 2), jnp.float32),
                                                 jax.ShapeDtypeStruct((2,), jnp.float32)))  # fmt: skip
    with pytest.raises(Exception, match=r"FfiAbiError: argument 0 has XLA dtype 15"):
        jax.block_until_ready(f(x, x, scale=np.float32(1.0)))


def test_the_struct_size_check_refuses_a_smaller_structure():
    small = (ctypes.c_size_t * 4)(8, 0, 0, 0)
    with pytest.raises(_ffi.FfiAbiError, match=r"struct_size 8 < 168 .*an FFI ABI this version of cudnnkit does"):
        _ffi._sized(ctypes.addressof(small), _ffi._CallFrame, "XLA_FFI_CallFrame")


def test_the_metadata_query_is_answered_with_the_version_and_traits():
    """The registration probe: a call frame whose extension is the metadata one gets the API version and the
    command-buffer trait, and the function is not called."""
    calls = []
    for cb in (False, True):
        h = _ffi.Handler(lambda c: calls.append(c), platform="cpu", command_buffer=cb)
        md = _ffi._Metadata(ctypes.sizeof(_ffi._Metadata))
        ext = _ffi._MetadataExtension(_ffi._ExtensionBase(ctypes.sizeof(_ffi._MetadataExtension), 1, None),
                                      ctypes.pointer(md))  # fmt: skip
        frame = _ffi._CallFrame(ctypes.sizeof(_ffi._CallFrame),
                                ctypes.cast(ctypes.pointer(ext), ctypes.POINTER(_ffi._ExtensionBase)))  # fmt: skip
        assert h._entry(ctypes.pointer(frame)) is None
        assert (md.api_version.major_version, md.api_version.minor_version) == (_ffi._API_MAJOR, _ffi._API_MINOR)
        assert md.traits == (1 if cb else 0)
    assert calls == []


def test_a_stream_query_xla_refuses_is_reported_and_its_error_destroyed():
    """A handler that asks for a stream where XLA has none (the CPU platform): XLA's error object is destroyed
    (XLA_FFI_Error_Destroy with its args struct: a wrong call would crash here) and ours comes back instead."""
    calls = []
    h = _ffi.register("cudnnkit_test_stream", _ffi.Handler(calls.append, platform="cpu"))
    h.platform = "CUDA"  # as a CUDA handler would ask
    f = jax.ffi.ffi_call("cudnnkit_test_stream", jax.ShapeDtypeStruct((2,), jnp.float32))
    with pytest.raises(Exception, match=r"XLA_FFI_Stream_Get failed"):
        jax.block_until_ready(f(jnp.zeros(2, jnp.float32)))
    assert calls == []


def _checks(call: _ffi.Call) -> None:
    """A handler whose cudnnkit call refuses its argument (a bad alpha: a TypeError raised by cudnnkit's checks)."""
    from cudnnkit.runtime.dtypes import check_scalar

    check_scalar("two", "alpha")


_ffi.register("cudnnkit_test_checks", _ffi.Handler(_checks, platform="cpu"))


def test_the_error_says_where_it_was_raised_and_the_log_has_the_traceback(caplog):
    """The traceback cannot cross XLA: the message names the innermost cudnnkit frame (file:line in function) and
    the cudnnkit logger has the whole traceback at debug level, naming the target."""
    import logging
    import re
    from pathlib import Path

    from cudnnkit.runtime import dtypes

    f = jax.ffi.ffi_call("cudnnkit_test_checks", jax.ShapeDtypeStruct((2,), jnp.float32))
    with caplog.at_level(logging.DEBUG, logger="cudnnkit"), pytest.raises(Exception) as e:
        jax.block_until_ready(f(jnp.zeros(2, jnp.float32)))
    msg = str(e.value)
    assert "cudnnkit: TypeError: alpha must be a real number" in msg
    m = re.search(r"\(at cudnnkit/runtime/dtypes\.py:(\d+) in (\w+)\)", msg)
    assert m, msg
    line = Path(dtypes.__file__).read_text().splitlines()[int(m.group(1)) - 1]
    assert "raise TypeError" in line, line  # the line that raised
    logged = [r for r in caplog.records if r.name == "cudnnkit" and "cudnnkit_test_checks" in r.getMessage()]
    assert logged and logged[0].levelno == logging.DEBUG and logged[0].exc_info is not None
    text = caplog.text
    assert "Traceback" in text and "_checks" in text and "check_scalar" in text


def test_where_skips_the_bindings_status_checker():
    """A cuDNN status is raised by the bindings' checker (cudnnkit/lib/errors.py): the cudnnkit frame that made
    the call is named (a stride-0 dim of size 2: cuDNN's BAD_PARAM, on the CPU too)."""
    from cudnnkit.lib import CudnnError
    from cudnnkit.runtime.descriptors import tensor_descriptor

    with pytest.raises(CudnnError) as e:
        tensor_descriptor("float32", (2, 3), (0, 0))
    frames = [f.f_code.co_filename for f, _ in __import__("traceback").walk_tb(e.value.__traceback__)]
    assert any(p.endswith("lib/errors.py") for p in frames)  # raised in the bindings' checker
    assert _ffi.where(e.value).startswith("cudnnkit/runtime/descriptors.py:")
    try:
        raise ValueError("outside")
    except ValueError as err:
        assert _ffi.where(err) is None  # no cudnnkit frame at all
