"""Find and load libcudnn, once per process.

Order (first that succeeds wins):

1. ``CUDNNKIT_LIBRARY``: an explicit path to ``libcudnn.so.9`` (or its folder);
2. a libcudnn already mapped into this process (for example by torch), so two
   copies never mix;
3. the ``nvidia-cudnn-cu13`` wheel, then ``nvidia-cudnn-cu12``;
4. the system loader (``libcudnn.so.9``, then ``libcudnn.so``).

cuDNN below 9.0 is refused. The version formula in 9.x is
``major*10000 + minor*100 + patch`` (8.x used ``major*1000 + minor*100 + patch``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from .errors import LibraryNotFoundError, UnsupportedVersionError

SONAMES = ("libcudnn.so.9", "libcudnn.so")
WHEELS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
SUBLIBRARIES = ("graph", "ops", "cnn", "adv", "heuristic", "engines_precompiled", "engines_runtime_compiled")


@dataclass(frozen=True)
class Loaded:
    cdll: ctypes.CDLL
    path: str  # resolved path of libcudnn.so.N
    source: str  # "CUDNNKIT_LIBRARY", "process", "wheel:<name>", "system"
    version: int  # cudnnGetVersion()


_lock = threading.Lock()
_loaded: Loaded | None = None
_failures: list[str] = []


def decode_version(v: int) -> tuple[int, int, int]:
    """(major, minor, patch) from ``cudnnGetVersion()`` for both 8.x and 9.x formulas."""
    if v >= 90000:
        return v // 10000, v // 100 % 100, v % 100
    return v // 1000, v // 100 % 10, v % 100


def mapped_libraries() -> list[str]:
    """Paths of libcudnn*.so* files mapped into this process (Linux /proc/self/maps)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    p = parts[5].strip()
                    if re.search(r"/libcudnn[^/]*\.so[.\d]*$", p) and p not in found:
                        found.append(p)
    except OSError:
        pass
    return found


def _candidates_process() -> list[str]:
    mapped = mapped_libraries()
    shims = [p for p in mapped if re.search(r"/libcudnn\.so(\.\d+)*$", p)]
    if shims:
        return shims
    # only sub-libraries mapped: the shim lives beside them
    out = []
    for p in mapped:
        for soname in SONAMES:
            c = str(Path(p).with_name(soname))
            if os.path.exists(c) and c not in out:
                out.append(c)
    return out


def _candidates_wheel(dist: str) -> list[str]:
    """The ``libcudnn.so*`` files wheel ``dist`` installed: found beside its ``.dist-info`` in the
    ``nvidia/cudnn/lib`` directory of a ``nvidia.cudnn`` package location (no ``importlib.metadata``, whose import
    costs about 40 ms of every ``import cudnnkit``), else from the wheel's file list."""
    info = dist.replace("-", "_") + "-*.dist-info"
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        base = Path(loc)
        if not any(base.parent.parent.glob(info)):
            continue
        found = [str(base / "lib" / s) for s in SONAMES if (base / "lib" / s).exists()]
        if found:
            return found
    return _candidates_wheel_metadata(dist)


def _candidates_wheel_metadata(dist: str) -> list[str]:
    from importlib import metadata

    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for f in files:
        if f.name in SONAMES:
            out.append(str(f.locate()))
    out.sort(key=lambda p: SONAMES.index(Path(p).name))
    return out


def _open(path: str) -> ctypes.CDLL:
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _resolve_path(cdll: ctypes.CDLL, hint: str) -> str:
    if os.path.sep in hint and os.path.exists(hint):
        return os.path.realpath(hint)
    for p in mapped_libraries():
        if re.search(r"/libcudnn\.so(\.\d+)*$", p):
            return os.path.realpath(p)
    return hint


def _try(path: str, source: str) -> Loaded | None:
    try:
        cdll = _open(path)
    except OSError as exc:
        _failures.append(f"{source}: {path}: {exc}")
        return None
    get_version = cdll.cudnnGetVersion
    get_version.restype = ctypes.c_size_t
    get_version.argtypes = []
    version = int(get_version())
    if version < 90000:
        major, minor, patch = decode_version(version)
        raise UnsupportedVersionError(
            f"cudnnkit needs cuDNN 9.0 or newer, but {path} ({source}) is cuDNN "
            f"{major}.{minor}.{patch}. Install nvidia-cudnn-cu13 or point CUDNNKIT_LIBRARY "
            "at a cuDNN 9 libcudnn.so.9."
        )
    return Loaded(cdll, _resolve_path(cdll, path), source, version)


def load() -> Loaded:
    """Load libcudnn (once) and return what was loaded."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        _failures.clear()
        env = os.environ.get("CUDNNKIT_LIBRARY")
        if env:
            path = env
            if os.path.isdir(env):
                path = next((os.path.join(env, s) for s in SONAMES if os.path.exists(os.path.join(env, s))), env)
            got = _try(path, "CUDNNKIT_LIBRARY")
            if got is None:
                raise LibraryNotFoundError(f"CUDNNKIT_LIBRARY={env!r} could not be loaded: {_failures[-1]}")
            _loaded = got
            return got
        attempts: list[tuple[str, str]] = [(p, "process") for p in _candidates_process()]
        for dist in WHEELS:
            attempts += [(p, f"wheel:{dist}") for p in _candidates_wheel(dist)]
        attempts += [(s, "system") for s in SONAMES]
        for path, source in attempts:
            got = _try(path, source)
            if got is not None:
                _loaded = got
                return got
        raise LibraryNotFoundError(
            "no cuDNN 9 library found. Install the wheel (pip install nvidia-cudnn-cu13), or set "
            "CUDNNKIT_LIBRARY to the path of libcudnn.so.9. Tried:\n  " + "\n  ".join(_failures)
        )


def loaded_sublibraries() -> dict[str, str | None]:
    """Which libcudnn_<name>.so sub-libraries are mapped now (name -> path or None)."""
    mapped = mapped_libraries()
    out: dict[str, str | None] = {}
    for name in SUBLIBRARIES:
        hit = [p for p in mapped if re.search(rf"/libcudnn_{name}\.so", p)]
        out[name] = hit[0] if hit else None
    return out
