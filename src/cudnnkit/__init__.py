"""cudnnkit: all of NVIDIA cuDNN 9 from Python, in layers.

* ``cudnnkit.lib`` (L0): generated ctypes bindings of every cuDNN 9 function,
  enum and struct, with checked statuses.
* ``cudnnkit.runtime`` (L1): array views over CuPy, torch, ``__cuda_array_interface__``
  and DLPack; per-thread handles; scoped settings; cached descriptors; shape inference.
* ``cudnnkit.graph`` (L1): the backend graph API: build, plan, execute.
* ``cudnnkit.ops`` (L2): array-level ops (softmax, dropout, LRN, spatial transformer, CTC, RNN, tensor ops).

``lib`` and ``runtime`` are imported with the package; ``graph`` and ``ops`` on first access
(``cudnnkit.ops`` works without ``import cudnnkit.ops``).

``python -m cudnnkit doctor`` reports what is installed and runs a real call per op family.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import lib, runtime
from .runtime.settings import Settings, current_settings, settings

__version__ = "0.1.0"
__all__ = ["lib", "runtime", "graph", "ops", "settings", "current_settings", "Settings", "__version__"]

_LAZY = ("graph", "ops")


def __getattr__(name: str) -> Any:
    """``cudnnkit.graph`` / ``cudnnkit.ops``: the subpackage, imported on first access."""
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")  # the import also sets it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
