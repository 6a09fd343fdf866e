"""L1 runtime on the CPU: array views and their rejections, settings, descriptor cache, streams."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import cudnnkit
from cudnnkit import lib
from cudnnkit.runtime import (
    ArrayView,
    DescriptorCache,
    as_view,
    canonical,
    compute_dtype,
    cudnn_dtype,
    current_settings,
    resolve_stream,
    same_device,
    scaling,
    settings,
    tensor_descriptor,
)
from cudnnkit.runtime import descriptors as D

from .conftest import FakeCAI

# ----------------------------------------------------------------- views


def test_cai_view_contiguous_and_strided():
    v = as_view(FakeCAI((2, 3, 4)), "x")
    assert (v.shape, v.strides, v.dtype, v.device, v.ptr) == ((2, 3, 4), (12, 4, 1), "float32", 0, 0x7F0000000000)
    assert v.is_contiguous() and v.nbytes == 96 and v.library == "unknown"
    v = as_view(FakeCAI((2, 3), "<f2", strides=(2, 12)), "x")  # byte strides -> element strides
    assert v.strides == (1, 6) and v.dtype == "float16" and not v.is_contiguous()


def test_cai_bad_stride_and_dtype():
    with pytest.raises(ValueError, match="x: byte stride 3 is not a multiple of the item size 4"):
        as_view(FakeCAI((2, 3), strides=(12, 3)), "x")
    with pytest.raises(TypeError, match="w: .*typestr '<c8' is not a type cuDNN supports"):
        as_view(FakeCAI((2,), "<c8"), "w")


def test_host_arrays_are_rejected_with_the_argument_name():
    with pytest.raises(TypeError, match=r"^x is a host array \(numpy.ndarray\)"):
        as_view(np.zeros((2, 3), np.float32), "x")
    with pytest.raises(TypeError, match=r"^dy must be a CUDA array"):
        as_view([1.0, 2.0], "dy")
    with pytest.raises(TypeError, match=r"^w must be a CUDA array"):
        as_view(3.0, "w")


def test_cpu_dlpack_object_is_host():
    class CpuDL:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be consumed")

    with pytest.raises(TypeError, match="^x is a host array"):
        as_view(CpuDL(), "x")


def test_non_cuda_dlpack_device_is_rejected():
    class RocmDL:
        def __dlpack_device__(self):
            return (10, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("must not be consumed")

    with pytest.raises(TypeError, match="x: DLPack device type 10 is not CUDA"):
        as_view(RocmDL(), "x")


def test_torch_cpu_tensor_is_rejected():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"^x is a torch tensor on cpu; cudnnkit needs a CUDA tensor"):
        as_view(torch.zeros(3), "x")
    with pytest.raises(TypeError, match=r"^w is a torch tensor on cpu"):
        as_view(torch.nn.Parameter(torch.zeros(3)), "w")


def test_mixed_devices_name_both_arguments():
    a, b = as_view(FakeCAI((2,), device=0), "x"), as_view(FakeCAI((2,), device=1), "w")
    with pytest.raises(ValueError, match=r"w is on cuda:1 but x is on cuda:0"):
        same_device(("x", a), ("w", b))
    assert same_device(("x", a), ("bias", None), ("w", a)) == 0


# ----------------------------------------------------------------- dtypes


def test_dtype_names_and_scaling():
    assert canonical("float") == "float32" and canonical("torch.bfloat16") == "bfloat16"
    assert canonical(np.dtype(np.float16)) == "float16"
    assert cudnn_dtype("bfloat16") == lib.CUDNN_DATA_BFLOAT16
    assert compute_dtype("float16") == "float32" and compute_dtype("float64") == "float64"
    assert isinstance(scaling("float64", 1.0), ctypes.c_double)
    assert isinstance(scaling("bfloat16", 1.0), ctypes.c_float)
    with pytest.raises(TypeError, match="complex64"):
        canonical("complex64")


@pytest.mark.parametrize(
    "scalar_type, name",
    [
        (np.float16, "float16"),
        (np.float32, "float32"),
        (np.float64, "float64"),
        (np.int8, "int8"),
        (np.uint8, "uint8"),
        (np.int32, "int32"),
        (np.int64, "int64"),
        (np.bool_, "bool"),
    ],
)
def test_numpy_scalar_types_are_dtypes_wherever_dtypes_are_taken(scalar_type, name):
    from cudnnkit.graph import Graph

    assert canonical(scalar_type) == canonical(np.dtype(scalar_type)) == name
    g = Graph(compute_dtype=np.float32, intermediate_dtype=np.float32)
    t = g.tensor((2, 3), dtype=scalar_type)
    assert t.dtype == name and g.mark_output(g.pointwise("IDENTITY", t), dtype=scalar_type).dtype == name
    if name in ("float16", "float32", "float64"):  # legacy tensor descriptors and RNNs: floats
        from cudnnkit.ops.rnn import RNN

        shape, strides = (1, 2, 3, 4), (24, 12, 4, 1)
        assert D.tensor_descriptor(scalar_type, shape, strides) is D.tensor_descriptor(name, shape, strides)

        assert RNN("lstm", 4, 8, dtype=scalar_type) == RNN("lstm", 4, 8, dtype=name)


def test_ml_dtypes_scalar_types_are_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert canonical(ml_dtypes.bfloat16) == "bfloat16"
    assert canonical(ml_dtypes.float8_e4m3fn) == "float8_e4m3fn" and canonical(ml_dtypes.float8_e5m2) == "float8_e5m2"


@pytest.mark.parametrize("bad", [np.complex64, np.floating, float, int, object, None, 3])
def test_other_types_are_refused_naming_the_argument(bad):
    with pytest.raises(TypeError, match=r"^dtype .* is not a type cuDNN supports"):
        canonical(bad)
    with pytest.raises(TypeError, match=r"^compute_dtype .* is not a type cuDNN supports"):
        canonical(bad, "compute_dtype")


# ----------------------------------------------------------------- settings


def test_settings_nest_and_restore():
    base = current_settings()
    with cudnnkit.settings(deterministic=True, workspace_limit=1 << 20) as s1:
        assert s1.deterministic and s1.workspace_limit == 1 << 20
        with settings(autotune="exhaustive", workspace_limit=None) as s2:
            assert s2.deterministic and s2.autotune == "exhaustive" and s2.workspace_limit is None
        assert current_settings() == s1
    assert current_settings() == base


def test_settings_restore_after_exception():
    base = current_settings()
    with pytest.raises(RuntimeError):
        with settings(allow_tf32=False):
            raise RuntimeError
    assert current_settings() == base


def test_settings_are_thread_local():
    seen = {}
    with settings(deterministic=True):
        t = threading.Thread(target=lambda: seen.setdefault("d", current_settings().deterministic))
        t.start()
        t.join()
        assert current_settings().deterministic
    assert seen["d"] is False


@pytest.mark.parametrize(
    "kw, exc, msg",
    [
        (dict(autotune="fast"), ValueError, "autotune must be one of"),
        (dict(heuristic_mode="c"), ValueError, "heuristic_mode must be one of"),
        (dict(prefer="cuda"), ValueError, "prefer must be one of"),
        (dict(workspace_limit=-1), ValueError, "workspace_limit must be a non-negative int"),
        (dict(deterministic=1), TypeError, "deterministic must be a bool"),
    ],
)
def test_settings_validation(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        with settings(**kw):
            pass


@pytest.mark.parametrize(
    "kw, exc, field",
    [
        (dict(workspace_limit=-5), ValueError, "workspace_limit"),
        (dict(workspace_limit=1.5), ValueError, "workspace_limit"),
        (dict(deterministic="yes"), TypeError, "deterministic"),
        (dict(autotune="fast"), ValueError, "autotune"),
        (dict(heuristic_mode="z"), ValueError, "heuristic_mode"),
        (dict(prefer="x"), ValueError, "prefer"),
        (dict(allow_tf32=2), TypeError, "allow_tf32"),
    ],
)
def test_settings_arguments_are_checked_at_the_call_not_only_at_with(kw, exc, field):
    base = current_settings()
    with pytest.raises(exc, match=rf"^settings: {field} must be"):
        cudnnkit.settings(**kw)  # no `with`: the call itself must refuse
    assert current_settings() == base


def test_settings_call_changes_nothing_until_with_and_applies_over_the_settings_at_with():
    base = current_settings()
    scope = settings(workspace_limit=64)
    assert current_settings() == base
    with settings(deterministic=True):
        with scope as s:
            assert s.workspace_limit == 64 and s.deterministic and current_settings() == s
    assert current_settings() == base

    @settings(prefer="legacy")
    def prefer():
        return current_settings().prefer

    assert prefer() == prefer() == "legacy" and current_settings().prefer == base.prefer


def test_settings_hash_is_cached_and_a_pickled_copy_hashes_again():
    """Every op call's cache key holds the settings, so their hash is computed once; a copy made by pickling
    (another process) computes its own instead of carrying this process's string hashes."""
    import pickle

    s = cudnnkit.Settings(deterministic=True, autotune="exhaustive")
    assert hash(s) == hash(cudnnkit.Settings(deterministic=True, autotune="exhaustive"))
    assert s != cudnnkit.Settings() and hash(s) != hash(cudnnkit.Settings())
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == hash(s.key())


def test_settings_key_changes_with_each_field():
    keys = {current_settings().key()}
    for kw in (
        dict(deterministic=True),
        dict(allow_tf32=False),
        dict(workspace_limit=0),
        dict(autotune="off"),
        dict(heuristic_mode="b"),
        dict(prefer="legacy"),
    ):
        with settings(**kw):
            keys.add(current_settings().key())
    assert len(keys) == 7


# ----------------------------------------------------------------- descriptors


def _read_tensor_descriptor(d):
    dt, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    lib.cudnnGetTensorNdDescriptor(d, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
    return dt.value, tuple(dims[: nb.value]), tuple(strides[: nb.value])


def test_tensor_descriptor_is_set_from_value_and_cached():
    a = tensor_descriptor("bfloat16", (8, 16, 32, 32), (16384, 1, 512, 16))
    b = tensor_descriptor("bfloat16", [8, 16, 32, 32], [16384, 1, 512, 16])
    assert a is b
    assert _read_tensor_descriptor(a) == (lib.CUDNN_DATA_BFLOAT16, (8, 16, 32, 32), (16384, 1, 512, 16))
    c = tensor_descriptor("bfloat16", (8, 16, 32, 32), (16384, 1024, 32, 1))
    assert c is not a
    assert tensor_descriptor("float16", (8, 16, 32, 32), (16384, 1, 512, 16)) is not a


def test_tensor_descriptor_pads_to_4d():
    d = tensor_descriptor("float32", (5, 7), (7, 1))
    assert _read_tensor_descriptor(d)[1:] == ((5, 7, 1, 1), (7, 1, 1, 1))


@pytest.mark.parametrize(
    "shape, strides, msg",
    [
        ((2, 0, 3), (3, 3, 1), "dims must be positive"),
        ((1,) * 9, (1,) * 9, "at most 8 dims"),
        ((2, 3), (3,), "differ in length"),
        ((2**31, 1, 1, 1), (1, 1, 1, 1), "does not fit cuDNN's int"),
    ],
)
def test_tensor_descriptor_rejects(shape, strides, msg):
    with pytest.raises(ValueError, match=msg):
        tensor_descriptor("float32", shape, strides)


def test_cache_is_bounded_lru_and_eviction_keeps_held_descriptors_alive():
    cache = DescriptorCache(maxsize=3)
    held = cache.get(D.TENSOR, ("float32", (1, 1, 1, 1), (1, 1, 1, 1)))
    for i in range(2, 6):
        cache.get(D.TENSOR, ("float32", (i, 1, 1, 1), (1, 1, 1, 1)))
    assert len(cache) == 3 and cache.misses == 5
    assert _read_tensor_descriptor(held)[1] == (1, 1, 1, 1)  # evicted but still valid
    again = cache.get(D.TENSOR, ("float32", (1, 1, 1, 1), (1, 1, 1, 1)))
    assert again is not held and cache.misses == 6
    cache.get(D.TENSOR, ("float32", (5, 1, 1, 1), (1, 1, 1, 1)))
    assert cache.hits == 1


def test_cache_is_thread_safe():
    cache = DescriptorCache(maxsize=64)
    out, barrier = [], threading.Barrier(8)

    def work():
        barrier.wait()
        for i in range(50):
            out.append(cache.get(D.TENSOR, ("float32", (i % 10 + 1, 2, 3, 4), (24, 12, 4, 1))))

    ts = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    by_key = {}
    for d in out:
        by_key.setdefault(d.key, set()).add(id(d))
    assert len(by_key) == 10 and all(len(ids) == 1 for ids in by_key.values())


# ----------------------------------------------------------------- streams


def test_resolve_stream_forms():
    class CupyLike:
        ptr = 0x1234

    class TorchLike:
        cuda_stream = 0x5678

    class CoreLike:
        def __cuda_stream__(self):
            return (0, 0x9ABC)

    assert resolve_stream(0x42, None, 0) == 0x42
    assert resolve_stream(CupyLike(), None, 0) == 0x1234
    assert resolve_stream(TorchLike(), None, 0) == 0x5678
    assert resolve_stream(CoreLike(), None, 0) == 0x9ABC
    assert resolve_stream(None, None, 0) == 0
    with pytest.raises(TypeError, match="stream must be"):
        resolve_stream("default", None, 0)


def test_cai_producer_stream_is_used_for_arrays_without_an_adapter(monkeypatch, request):
    from cudnnkit.runtime import clear_stream_cache, driver, prepare

    request.addfinalizer(clear_stream_cache)  # the fake's streams must not stay known to later tests
    # a fake driver that knows two live streams of cuda:0: the producer's stream is asked of it before use
    asked = []
    monkeypatch.setattr(driver, "stream_device", lambda h: asked.append(h) or (0 if h in (0x5000, 0x6000) else None))
    clear_stream_cache()
    a = FakeCAI((2, 3))
    a.__cuda_array_interface__["stream"] = 0x5000
    launch, (v,) = prepare(("x", a))
    assert v.stream == 0x5000 and launch.stream == 0x5000 and asked == [0x5000]
    a.__cuda_array_interface__["stream"] = 0xBAD000  # a producer's garbage stream: asked, and refused
    with pytest.raises(ValueError, match="x's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        prepare(("x", a))
    assert asked == [0x5000, 0xBAD000]
    stream = type("CupyLikeStream", (), {"ptr": 0x6000})()
    with pytest.raises(ValueError, match="x's __cuda_array_interface__ stream=0xbad000 is not a live CUDA stream"):
        prepare(("x", a), stream=stream)  # with stream= the producer's stream is still checked, then waited for
    assert asked == [0x5000, 0xBAD000, 0x6000, 0xBAD000]
    a.__cuda_array_interface__["stream"] = 0x5000
    waits = []
    monkeypatch.setattr(driver, "order_after", lambda p, c, d: waits.append((p, c, d)))
    assert prepare(("x", a), stream=stream)[0].stream == 0x6000  # an explicit stream= wins: the producer's waited for
    assert waits == [(0x5000, 0x6000, 0)]
    assert prepare(("x", FakeCAI((2, 3))))[0].stream == 0  # no stream named: the legacy default stream
    a.__cuda_array_interface__["stream"] = 1  # CAI's name for the legacy default stream
    assert prepare(("x", a))[0].stream == 0


def test_view_is_slotted_and_complete():
    v = ArrayView((2, 3), (3, 1), "float16", 0, 0x1000, None)
    assert not hasattr(v, "__dict__")
    assert (v.ndim, v.size, v.itemsize, v.nbytes, v.library, v.is_contiguous()) == (2, 6, 2, 12, "unknown", True)


# ----------------------------------------------------------------- the package


def test_subpackages_are_lazy_attributes_of_the_package():
    import subprocess
    import sys

    # a fresh interpreter: `import cudnnkit` does not import graph/ops; attribute access alone does
    code = """
import sys, cudnnkit
assert 'cudnnkit.ops' not in sys.modules and 'cudnnkit.graph' not in sys.modules
assert {'lib', 'runtime', 'graph', 'ops'} <= set(dir(cudnnkit))
from cudnnkit.ops.rnn import RNN
from cudnnkit.graph.graph import Graph
assert cudnnkit.ops.rnn.RNN is RNN and cudnnkit.graph.Graph is Graph
assert cudnnkit.runtime.shapes.conv_output_shape and cudnnkit.lib.version() > 0
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="module 'cudnnkit' has no attribute 'nope'"):
        cudnnkit.nope  # noqa: B018


def test_tensor_descriptor_of_a_scalar_is_one_element():
    # a 0-d array (issue 10's fuzzer: dropout and transform_tensor of a scalar) is described as one element
    d = tensor_descriptor("float32", (), ())
    assert _read_tensor_descriptor(d)[1:] == ((1, 1, 1, 1), (1, 1, 1, 1))


def test_tensor_span_beyond_int_is_refused_by_name():
    # cudnnSetTensorNdDescriptor refuses a span of more than 2**31 - 1 elements with NOT_SUPPORTED (measured with
    # cuDNN 9.19 and 9.28); check_fits says so first, naming the array
    from cudnnkit.ops._layout import check_fits, fits

    assert fits((2, 2**30), (2**30 - 1, 1))
    assert not fits((2, 2**30), (2**30, 1))
    with pytest.raises(ValueError, match=r"^x \(shape \(2, 1073741824\)\) is too large.*number of elements they span"):
        check_fits("x", (2, 2**30), (2**30, 1))


def test_settings_items_round_trip_one_object_per_items():
    """as_items/from_items: the literal form integrations pass across a custom op or an XLA attribute, one Settings
    per items (put in force on every backward without building a new one), checked as Settings(...) checks."""
    import pytest

    from cudnnkit.runtime.settings import Settings, as_items, from_items

    s = Settings(deterministic=True, workspace_limit=1 << 20, prefer="graph")
    items = as_items(s)
    assert dict(items) == {"deterministic": True, "allow_tf32": True, "workspace_limit": 1 << 20,
                           "autotune": "heuristics", "heuristic_mode": "a", "prefer": "graph"}  # fmt: skip
    assert as_items(s) is items and from_items(items) == s
    assert from_items(items) is from_items(tuple(items)) and from_items(()) == Settings()
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        from_items((("deterministic", 1),))


def test_prepare_copies_an_expanded_input_into_a_sibling_layout():
    """An input cuDNN cannot take as it is (a mean's expanded gradient) is copied into the layout of the first other
    array of its shape that is dense and not C order (a channels-last ``y``), so that a one-layout op needs no second
    copy; with no such sibling (C-order or gapped siblings, other shapes), into C order (None)."""
    from cudnnkit.runtime.launch import _sibling_layout

    shape = (2, 8, 3, 3)
    expanded = ArrayView(shape, (8, 1, 0, 0), "float32", 0, 0x1000, None)
    nhwc = ArrayView(shape, (72, 1, 24, 8), "float32", 0, 0x2000, None)
    nchw = ArrayView(shape, (72, 9, 3, 1), "float32", 0, 0x3000, None)
    gapped = ArrayView(shape, (144, 1, 48, 16), "float32", 0, 0x4000, None)
    other = ArrayView((2, 8, 3, 4), (96, 1, 32, 8), "float32", 0, 0x5000, None)
    assert _sibling_layout([expanded, nhwc], expanded) == (72, 1, 24, 8)
    assert _sibling_layout([None, nchw, expanded, nhwc], expanded) == (72, 1, 24, 8)
    assert _sibling_layout([expanded, nchw], expanded) is None
    assert _sibling_layout([expanded, gapped, other], expanded) is None
    assert _sibling_layout([expanded], expanded) is None
