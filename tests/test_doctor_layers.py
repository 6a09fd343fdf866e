"""The main job (doctor) on this machine, and the layer rules of the package."""

from __future__ import annotations

import ast
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudnnkit import doctor, lib
from cudnnkit.graph import ExecutionPlan
from cudnnkit.lib import backend

from .conftest import gpu_libraries

SRC = Path(__file__).resolve().parent.parent / "src" / "cudnnkit"
FRAMEWORKS = {"torch", "cupy", "jax", "jaxlib"}
# Modules allowed to import a framework: one adapter per array library, and the L3 integrations (cudnnkit.torch
# imports torch, cudnnkit.jax imports jax; cudnnkit.nn imports the caller's library inside its functions, never
# at import).
ALLOWED = {"runtime/adapters/_torch.py", "runtime/adapters/_cupy.py", "runtime/adapters/_jax.py"}
L3_INTEGRATIONS = ("torch/", "nn/", "jax/")


def test_doctor_exits_zero_and_reports():
    r = subprocess.run([sys.executable, "-m", "cudnnkit", "doctor"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "cuDNN 9." in out and "path:" in out and "sub-libraries" in out
    assert "conv shape inference" in out and "FAILED" not in out
    if not gpu_libraries():
        assert "Execution needs a CUDA GPU" in out
        assert ("CUDA driver: libcuda.so.1 loads" if lib.driver_available() else "CUDA driver: NOT INSTALLED") in out
    else:
        assert "compute capability" in out and "softmax" in out
        for name in gpu_libraries():
            for check in ("graph: conv plan", "graph: sdpa plan"):
                assert _status(out, f"{check} [{name}]") == "ok", out


def _status(out: str, name: str) -> str:
    """The status column of the report row for check ``name``."""
    rows = [ln for ln in out.splitlines() if ln.startswith(f"  {name}  ")]
    assert len(rows) == 1, (name, out)
    return rows[0][len(name) + 2 :].split()[0]


NOISE_ERR = "Unable to load any of {libcudnn_fake_stderr.so.9}."
NOISE_OUT = "Unable to load any of {libcudnn_fake_stdout.so.9}."


_libc = ctypes.CDLL(None)
_libc.fdopen.restype = ctypes.c_void_p
_libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
_libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
_c_stdout: list[int] = []


def _buffered_c_stdout() -> int:
    """A fully buffered C stream on fd 1 (what C++'s std::cout is when stdout is no terminal), whatever
    PYTHONUNBUFFERED did to libc's own ``stdout``; never closed (closing would close fd 1)."""
    if not _c_stdout:
        f = _libc.fdopen(1, b"w")
        assert f, "fdopen(1) failed"
        assert _libc.setvbuf(ctypes.c_void_p(f), None, 0, 8192) == 0  # _IOFBF
        _c_stdout.append(f)
    return _c_stdout[0]


def _noisy(error: Exception):
    """A stand-in for BackendDescriptor.finalize that prints from C (fd 2 unbuffered, a buffered C stream on
    fd 1) and then raises ``error``, as cuDNN 9.28 does on a machine without libcuda.so.1."""

    def finalize(self):
        os.write(2, (NOISE_ERR + "\n").encode())
        _libc.fputs((NOISE_OUT + "\n").encode(), ctypes.c_void_p(_buffered_c_stdout()))
        raise error

    return finalize


def _host_only_doctor(monkeypatch, capfd, finalize) -> tuple[int, str, str]:
    """Run the doctor in-process with no array library seen (the GPU section is the no-GPU one on every
    machine), no CUDA driver, and ``finalize`` in place of the backend finalization."""
    monkeypatch.setattr(doctor.adapters, "names", lambda: ())
    monkeypatch.setattr(lib, "driver_available", lambda: False)
    monkeypatch.setattr(backend.BackendDescriptor, "finalize", finalize)
    rc = doctor.doctor()
    out, err = capfd.readouterr()
    return rc, out, err


def test_doctor_without_driver_skips_finalization_and_exits_zero(monkeypatch, capfd):
    driver_error = lib.DriverNotFoundError(lib.CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, "cudnnBackendFinalize")
    rc, out, err = _host_only_doctor(monkeypatch, capfd, _noisy(driver_error))
    assert rc == 0, out + err
    assert _status(out, "backend descriptor") == "skipped"
    assert doctor.NO_DRIVER in out and "FAILED" not in out
    assert "CUDA driver: NOT INSTALLED (libcuda.so.1 not found)" in out
    assert "healthy (host side; 1 check(s) skipped)" in out
    for check in ("tensor descriptor", "conv shape inference", "pool shape inference", "error reporting"):
        assert _status(out, check) == "ok", check


def test_doctor_shows_what_cudnn_printed_as_notes_under_the_row(monkeypatch, capfd):
    driver_error = lib.DriverNotFoundError(lib.CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, "cudnnBackendFinalize")
    rc, out, err = _host_only_doctor(monkeypatch, capfd, _noisy(driver_error))
    assert rc == 0, out + err
    assert "Unable to load" not in err
    lines = out.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("  backend descriptor  "))
    notes = lines[row + 1 : row + 3]
    assert all(ln.split()[0] == "note:" for ln in notes), lines[row : row + 4]
    assert sorted(NOISE_ERR in ln or NOISE_OUT in ln for ln in notes) == [True, True], notes
    assert [ln for ln in lines if "Unable to load" in ln] == notes  # nowhere else: not printed raw


@pytest.mark.parametrize(
    "error",
    [
        lib.BadParamError(lib.CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize"),
        lib.errors.SublibraryLoadingError(lib.CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED, "cudnnBackendFinalize"),
        AssertionError("read back the wrong dimensions"),
    ],
    ids=["bad-param", "sublibrary-missing-with-driver", "wrong-result"],
)
def test_doctor_real_failure_exits_one_without_driver_too(monkeypatch, capfd, error):
    rc, out, err = _host_only_doctor(monkeypatch, capfd, _noisy(error))
    assert rc == 1, out + err
    assert _status(out, "backend descriptor") == "FAILED"
    assert f"{type(error).__name__}: {error}" in out
    assert "PROBLEMS found" in out and "healthy" not in out


def test_doctor_report_is_not_interleaved_with_cudnn_output():
    """The real doctor, stdout and stderr in one unbuffered pipe (the order a terminal shows): under cuDNN 9.28
    without a driver, cuDNN's 'Unable to load any of ...' appears only as a note row."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "cudnnkit", "doctor"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    assert all(ln.split()[0] == "note:" for ln in lines if "Unable to load" in ln), r.stdout
    if not lib.driver_available() and lib.version() >= 92800:
        assert _status(r.stdout, "backend descriptor") == "skipped", r.stdout
        assert "CUDA driver: NOT INSTALLED" in r.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("check", ["graph: conv plan", "graph: sdpa plan"])
def test_doctor_graph_checks_run_and_catch_unwritten_outputs(xp, monkeypatch, check):
    fn = dict(doctor._gpu_checks(xp, 0))[check]
    detail = fn()
    assert "plan eng" in detail and "rel err" in detail, detail
    monkeypatch.setattr(ExecutionPlan, "execute", lambda self, bindings, **kw: None)
    with pytest.raises(AssertionError, match="unwritten"):
        fn()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.partition(".")[0])
    return out


def test_no_framework_imports_outside_adapters():
    offenders = []
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC).as_posix()
        if rel in ALLOWED or rel.startswith(L3_INTEGRATIONS):
            continue
        bad = _imports(p) & FRAMEWORKS
        if bad:
            offenders.append(f"{rel}: {sorted(bad)}")
    assert not offenders, offenders


def _cudnnkit_imports(path: Path) -> set[str]:
    """Absolute names of the cudnnkit modules a file imports (relative imports resolved)."""
    package = ["cudnnkit", *path.relative_to(SRC).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if not mod.startswith("cudnnkit"):
                continue
            if node.module is None or mod in ("cudnnkit",):
                out |= {f"{mod}.{a.name}" for a in node.names}
            else:
                out.add(mod)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("cudnnkit")}
    return out


@pytest.mark.parametrize(
    "layer, allowed",
    [
        ("lib", ("cudnnkit.lib",)),
        ("runtime", ("cudnnkit.lib", "cudnnkit.runtime")),
        ("graph", ("cudnnkit.lib", "cudnnkit.runtime", "cudnnkit.graph")),
        ("ops", ("cudnnkit.lib", "cudnnkit.runtime", "cudnnkit.graph", "cudnnkit.ops")),
        ("autograd", ("cudnnkit.lib", "cudnnkit.runtime", "cudnnkit.graph", "cudnnkit.ops", "cudnnkit.autograd")),
    ],
)
def test_imports_point_downward_only(layer, allowed):
    for p in (SRC / layer).rglob("*.py"):
        for mod in _cudnnkit_imports(p):
            assert mod.startswith(allowed), f"{p.relative_to(SRC)} imports {mod}, above its layer"


def test_importing_cudnnkit_imports_no_framework():
    code = (
        "import sys, cudnnkit, cudnnkit.runtime, cudnnkit.ops, cudnnkit.autograd, cudnnkit.nn; "
        "print(sorted(m for m in ('torch','cupy','jax') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_generated_module_header():
    first = (SRC / "lib" / "_cudnn.py").read_text().splitlines()[0]
    assert first.startswith("# Generated by tools/gen_bindings.py") and "DO NOT MODIFY" in first
