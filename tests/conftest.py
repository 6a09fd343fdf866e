"""Test tiers: the CPU tier always runs; tests marked ``gpu`` need a CUDA device.

Without one, every GPU test is skipped with the same stated reason.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import types

import pytest

#: Set by scripts/gpu-tests: on a GPU machine, a library that fails to import or to see the GPU is an
#: error, not a reason to skip the GPU tier.
REQUIRE_GPU = os.environ.get("CUDNNKIT_REQUIRE_GPU") == "1"
_problems: list[str] = []


@functools.cache
def gpu_libraries() -> tuple[str, ...]:
    """Array libraries that are installed and see a CUDA device."""
    from cudnnkit.runtime import adapters

    found = []
    for name in adapters.names():
        if importlib.util.find_spec(name) is None:
            _problems.append(f"{name} is not installed")
            continue
        try:
            n = adapters.get(name).device_count()
        except Exception as exc:
            _problems.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if n > 0:
            found.append(name)
        else:
            _problems.append(f"{name} sees no CUDA device")
    return tuple(found)


def gpu_skip_reason() -> str | None:
    if gpu_libraries():
        return None
    return "no CUDA device visible to CuPy or torch (GPU tier runs on a GPU machine: scripts/gpu-tests)"


def pytest_collection_modifyitems(config, items):
    libs = gpu_libraries()
    if REQUIRE_GPU and len(libs) < 2:
        raise pytest.UsageError(
            "CUDNNKIT_REQUIRE_GPU=1 but the GPU tier cannot run for both CuPy and torch: " + "; ".join(_problems)
        )
    if os.environ.get("CUDNNKIT_SOAK") != "1":
        soak = pytest.mark.skip(reason="soak test: runs on request (CUDNNKIT_SOAK=1 scripts/gpu-tests -m soak)")
        for item in items:
            if "soak" in item.keywords:
                item.add_marker(soak)
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["cupy", "torch"])
def xp(request):
    """The adapter of each array library with a CUDA device (skips the ones missing)."""
    if request.param not in gpu_libraries():
        pytest.skip(f"{request.param} is not installed or sees no CUDA device")
    from cudnnkit.runtime import adapters

    return adapters.get(request.param)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test stopped by the missing CUDA driver is skipped with that reason, never failed or passed.

    Since cuDNN 9.28 backend finalization loads a sub-library that links ``libcuda.so.1``; on a machine without
    the driver ``cudnnkit.lib`` raises :class:`~cudnnkit.lib.DriverNotFoundError` (only when the driver really
    is absent). On a machine with a driver that class is never raised, so nothing is skipped there.
    """
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.passed:
        return
    from cudnnkit.lib import DriverNotFoundError

    exc = call.excinfo.value
    while exc is not None and not isinstance(exc, DriverNotFoundError):
        exc = exc.__cause__ or exc.__context__
    if exc is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: " + DriverNotFoundError.HINT)


# ----------------------------------------------------------------- shared fakes (import them: from .conftest import FakeCAI)


class FakeCAI:
    """A device array as seen through __cuda_array_interface__ only (never dereferenced here); ``extra`` adds
    keys to the interface (a producer ``stream``, a ``mask``)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000000000, device=0, **extra):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "strides": strides,
            "data": (ptr, False),
            "version": 3,
            **extra,
        }
        self.device = device


class FakeBF16(FakeCAI):
    """A bfloat16 device array as ml_dtypes-based libraries show it (typestr '<V2', dtype name 'bfloat16')."""

    dtype = types.SimpleNamespace(name="bfloat16")

    def __init__(self, shape, strides=None, device=0):
        super().__init__(shape, "<V2", strides=strides, device=device)
