"""DLPack export (cudnnkit.runtime.dlpack) on the CPU: host memory exported as a DLManagedTensor capsule is imported
by JAX and by torch without a copy, with its shape, strides and dtype; the consumer's deleter (or the capsule's
destructor, unconsumed) releases what the export kept alive."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from cudnnkit.runtime import dlpack


def _export(a: np.ndarray) -> dlpack.Exported:
    strides = tuple(s // a.itemsize for s in a.strides)
    return dlpack.Exported(a.ctypes.data, a.shape, strides, a.dtype.name, 0, a, device_type=dlpack.DL_CPU)


@pytest.mark.parametrize("lib", ["jax", "torch"])
def test_an_export_is_imported_without_a_copy_and_released(lib):
    mod = pytest.importorskip(lib)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = dlpack.alive()
    if lib == "jax":
        got = mod.dlpack.from_dlpack(_export(a))
    else:
        got = mod.from_dlpack(_export(a))
    # torch aliases the memory (held until the tensor goes); JAX's CPU client may copy (XLA's alignment) and let go
    assert dlpack.alive() == before + 1 if lib == "torch" else dlpack.alive() in (before, before + 1)
    np.testing.assert_array_equal(np.asarray(got), a)
    if lib == "torch":  # torch shares the memory: a write through numpy shows
        a[0, 0] = 99.0
        assert float(got[0, 0]) == 99.0
    del got
    gc.collect()
    assert dlpack.alive() == before


def test_a_transposed_export_keeps_its_strides_in_torch():
    torch = pytest.importorskip("torch")
    a = np.arange(12, dtype=np.float64).reshape(3, 4).T  # strides (1, 4) elements
    t = torch.from_dlpack(_export(a))
    assert t.shape == (4, 3) and t.stride() == (1, 4)
    np.testing.assert_array_equal(t.numpy(), a)


def test_an_unconsumed_capsule_releases_on_its_own():
    a = np.zeros(3, np.int32)
    before = dlpack.alive()
    cap = _export(a).__dlpack__()
    assert dlpack.alive() == before + 1
    del cap
    gc.collect()
    assert dlpack.alive() == before


def test_a_dtype_without_a_dlpack_code_is_refused():
    with pytest.raises(TypeError, match="no DLPack code"):
        dlpack.Exported(0, (1,), (1,), "float8_e4m3fn", 0, None)
