"""L0: status checking with real bad calls, and the library loading order."""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from cudnnkit import lib
from cudnnkit.lib import _loader, errors

from .conftest import gpu_libraries


def test_rnn_descriptor_hidden_size_zero_is_bad_param():
    p = ctypes.c_void_p()
    lib.cudnnCreateRNNDescriptor(ctypes.byref(p))
    try:
        with pytest.raises(lib.BadParamError) as ei:
            lib.cudnnSetRNNDescriptor_v8(
                p,
                lib.CUDNN_RNN_ALGO_STANDARD,
                lib.CUDNN_LSTM,
                lib.CUDNN_RNN_DOUBLE_BIAS,
                lib.CUDNN_UNIDIRECTIONAL,
                lib.CUDNN_LINEAR_INPUT,
                lib.CUDNN_DATA_FLOAT,
                lib.CUDNN_DATA_FLOAT,
                lib.CUDNN_DEFAULT_MATH,
                16,
                0,
                0,
                1,
                None,
                0,
            )
    finally:
        lib.cudnnDestroyRNNDescriptor(p)
    e = ei.value
    assert e.function == "cudnnSetRNNDescriptor_v8"
    assert e.status == 2000 and e.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert "cudnnSetRNNDescriptor_v8" in str(e) and "CUDNN_STATUS_BAD_PARAM" in str(e)
    assert e.last_error and e.last_error in str(e)
    assert isinstance(e, ValueError)  # BadParam is also a ValueError


def test_negative_tensor_dim_is_bad_param_with_text():
    d = ctypes.c_void_p()
    lib.cudnnCreateTensorDescriptor(ctypes.byref(d))
    try:
        dims, strides = (ctypes.c_int * 4)(2, -3, 4, 5), (ctypes.c_int * 4)(60, 20, 5, 1)
        with pytest.raises(lib.BadParamError, match=r"cudnnSetTensorNdDescriptor.*CUDNN_STATUS_BAD_PARAM.*dimA"):
            lib.cudnnSetTensorNdDescriptor(d, lib.CUDNN_DATA_FLOAT, 4, dims, strides)
    finally:
        lib.cudnnDestroyTensorDescriptor(d)


def test_not_supported_category_from_a_real_call():
    # nbDims above CUDNN_DIM_MAX
    d = ctypes.c_void_p()
    lib.cudnnCreateTensorDescriptor(ctypes.byref(d))
    try:
        n = lib.CUDNN_DIM_MAX + 1
        dims, strides = (ctypes.c_int * n)(*([2] * n)), (ctypes.c_int * n)(*[2 ** (n - 1 - i) for i in range(n)])
        with pytest.raises(lib.NotSupportedError) as ei:  # cuDNN 9.19 answers NOT_SUPPORTED here
            lib.cudnnSetTensorNdDescriptor(d, lib.CUDNN_DATA_FLOAT, n, dims, strides)
        assert ei.value.status == 3000 and ei.value.status_name == "CUDNN_STATUS_NOT_SUPPORTED"
    finally:
        lib.cudnnDestroyTensorDescriptor(d)


@pytest.mark.skipif(bool(gpu_libraries()), reason="this machine has a GPU, so cudnnCreate succeeds")
def test_cudnn_create_without_gpu_is_not_initialized():
    h = ctypes.c_void_p()
    with pytest.raises(lib.NotInitializedError) as ei:
        lib.cudnnCreate(ctypes.byref(h))
    assert ei.value.status == 1001 and ei.value.last_error


def test_every_status_maps_to_its_category():
    for st in lib.cudnnStatus_t:
        if st == 0:
            continue
        cls = errors.error_class(st)
        cat = int(st) // 1000 * 1000
        expect = {
            2000: errors.BadParamError,
            3000: errors.NotSupportedError,
            4000: errors.InternalError,
            5000: errors.ExecutionFailedError,
        }.get(cat, errors.UncategorizedError)
        assert issubclass(cls, expect), (st, cls)
    assert errors.error_class(1001) is errors.NotInitializedError
    assert errors.error_class(9999) is errors.UncategorizedError
    errors.check(0, "x")
    with pytest.raises(errors.NotSupportedError, match="myfunc failed with CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"):
        errors.check(3004, "myfunc")


def test_errors_pickle():
    e = errors.error_for(3002, "cudnnBackendFinalize")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e) and e2.status == 3002 and e2.function == "cudnnBackendFinalize"


def test_version_formula():
    assert _loader.decode_version(91900) == (9, 19, 0)
    assert _loader.decode_version(90100) == (9, 1, 0)
    assert _loader.decode_version(8907) == (8, 9, 7)
    major, minor, patch = lib.version_tuple()
    assert major == 9 and lib.version() == major * 10000 + minor * 100 + patch


def test_below_9_is_refused(monkeypatch):
    class FakeFn:
        restype = argtypes = None

        def __call__(self):
            return 8907

    class FakeCDLL:
        cudnnGetVersion = FakeFn()

    monkeypatch.setattr(_loader, "_open", lambda path: FakeCDLL())
    with pytest.raises(lib.UnsupportedVersionError, match=r"needs cuDNN 9.0 or newer.*cuDNN 8\.9\.7"):
        _loader._try("/fake/libcudnn.so.8", "system")


def _run(code: str, env: dict | None = None) -> str:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_wheel_is_found_without_hints():
    out = _run("from cudnnkit import lib; print(lib.source(), lib.path())", {"CUDNNKIT_LIBRARY": ""})
    assert out.startswith(("wheel:nvidia-cudnn-cu13", "wheel:nvidia-cudnn-cu12", "process")), out


def test_explicit_library_path_wins():
    out = _run("from cudnnkit import lib; print(lib.source())", {"CUDNNKIT_LIBRARY": lib.path()})
    assert out == "CUDNNKIT_LIBRARY"
    folder = os.path.dirname(lib.path())
    assert _run("from cudnnkit import lib; print(lib.path())", {"CUDNNKIT_LIBRARY": folder}) == lib.path()


def test_bad_explicit_path_is_a_clear_error():
    r = subprocess.run(
        [sys.executable, "-c", "from cudnnkit import lib; lib.version()"],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDNNKIT_LIBRARY": "/nonexistent/libcudnn.so.9"},
    )
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "CUDNNKIT_LIBRARY" in r.stderr


def test_library_already_in_process_is_reused():
    code = f"""
        import ctypes
        ctypes.CDLL({lib.path()!r}, mode=ctypes.RTLD_GLOBAL)   # as torch would have done
        from cudnnkit import lib
        print(lib.source(), lib.path())
    """
    src, path = _run(code, {"CUDNNKIT_LIBRARY": ""}).split()
    assert src == "process" and path == lib.path()


def test_sublibraries_reported():
    lib.cudnnOpsVersionCheck()
    subs = lib.loaded_sublibraries()
    assert subs["ops"] and subs["graph"]
