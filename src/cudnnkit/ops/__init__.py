"""L2: array-level wrappers that mirror cuDNN's forward and backward calls.

Each function takes CUDA arrays (CuPy, torch, or any ``__cuda_array_interface__``
/ DLPack array) and keywords, allocates outputs with the input's library, runs
on that library's current stream (or ``stream=``), and rejects bad input with
a Python exception naming the argument before any GPU work.
"""

from __future__ import annotations

from .softmax import softmax_backward, softmax_forward

__all__ = ["softmax_forward", "softmax_backward"]
