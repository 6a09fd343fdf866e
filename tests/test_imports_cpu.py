"""Every ``from ... import ...`` of a cudnnkit module inside the package resolves, the ones inside function bodies
included: those run only on their code path (a GPU-only one, often), so importing the package does not check them.
A wrong relative import there (``from .. import lib`` in ``runtime/adapters/_raw.py``, which named
``cudnnkit.runtime.lib``) surfaced as an ``ImportError`` inside an XLA handler on the GPU."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import cudnnkit

ROOT = Path(cudnnkit.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
    """(file:line, absolute module, name) of every from-import of a cudnnkit module, anywhere in a file."""
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module_name(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cudnnkit":
                continue
            for alias in node.names:
                yield f"{path.relative_to(ROOT.parent)}:{node.lineno}", target, alias.name


IMPORTS = list(_imports())


def _optional_library_missing(e: ImportError) -> bool:
    """An import that fails for want of an optional array library (CuPy here), not for a cudnnkit name."""
    name = getattr(e, "name", None) or ""
    return bool(name) and name.split(".")[0] in ("cupy", "cupyx", "jax", "jaxlib", "torch", "ml_dtypes", "cuda")


def test_the_scan_sees_function_level_imports():
    where = [w for w, t, n in IMPORTS if w.startswith("cudnnkit/runtime/adapters/_raw.py") and n == "lib"]
    assert where, "the scan must include imports inside function bodies"
    assert len(IMPORTS) > 200


def _unresolved(imports) -> list[str]:
    bad = []
    for where, target, name in imports:
        try:
            mod = importlib.import_module(target)
        except ImportError as e:
            if not _optional_library_missing(e):
                bad.append(f"{where}: from {target} import {name}: {e}")
            continue
        if name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{target}.{name}")
        except ImportError as e:
            if not _optional_library_missing(e):
                bad.append(f"{where}: cannot import name {name!r} from {target!r}")
    return bad


def test_every_from_import_of_a_cudnnkit_module_resolves():
    bad = _unresolved(IMPORTS)
    assert not bad, "\n".join(bad)


def test_a_wrong_relative_import_is_found():
    """The check itself: the import that was wrong (``cudnnkit.runtime`` has no ``lib``) and a missing module fail
    it; the right one passes."""
    assert _unresolved([("a.py:1", "cudnnkit.runtime", "lib"), ("b.py:2", "cudnnkit.nowhere", "x")]) == [
        "a.py:1: cannot import name 'lib' from 'cudnnkit.runtime'",
        "b.py:2: from cudnnkit.nowhere import x: No module named 'cudnnkit.nowhere'",
    ]
    assert _unresolved([("c.py:3", "cudnnkit", "lib")]) == []
