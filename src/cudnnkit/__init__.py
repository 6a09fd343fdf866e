"""cudnnkit: all of NVIDIA cuDNN 9 from Python, in layers.

* ``cudnnkit.lib`` (L0): generated ctypes bindings of every cuDNN 9 function,
  enum and struct, with checked statuses.
* ``cudnnkit.runtime`` (L1): array views over CuPy, torch, ``__cuda_array_interface__``
  and DLPack; per-thread handles; scoped settings; cached descriptors; shape inference.

``python -m cudnnkit doctor`` reports what is installed and runs a real call per op family.
"""

from __future__ import annotations

from . import lib
from .runtime.settings import Settings, current_settings, settings

__version__ = "0.1.0"
__all__ = ["lib", "settings", "current_settings", "Settings", "__version__"]
