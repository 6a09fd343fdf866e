"""L1 graph layer over cuDNN's backend API (in progress, issue 5).

What exists: :class:`Graph` definition (tensors, pointwise in every mode,
matmul, convolution forward/dgrad/wgrad, reduction), shape and dtype inference,
dangling-tensor checks, a plan key, and lowering to finalized backend
descriptors. Heuristics, plans, the plan cache and execution come next.
"""

from __future__ import annotations

from .graph import POINTWISE_ARITY, Graph, GraphError, Lowered, Tensor

__all__ = ["Graph", "GraphError", "Lowered", "Tensor", "POINTWISE_ARITY"]
