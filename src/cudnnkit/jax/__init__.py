"""L3: the JAX integration (issue 14, under way).

* :mod:`cudnnkit.jax._ffi`: XLA's FFI from Python through ``ctypes`` (handlers, registration, the call frame's
  buffers, attributes and stream), tested on the CPU platform.

Importing this module imports jax; nothing below it does.
"""

from __future__ import annotations

from ._ffi import Buffer, Call, FfiAbiError, Handler, register, registered

__all__ = ["Buffer", "Call", "FfiAbiError", "Handler", "register", "registered"]
