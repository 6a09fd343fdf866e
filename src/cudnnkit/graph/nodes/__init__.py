"""One module per operation kind: the :class:`~cudnnkit.graph.Graph` builder methods (a mixin class each) and
the ``lower()`` that turns a recorded node into its finalized backend descriptors.

:data:`LOWER` maps every node kind to its lowering, which returns ``(operation descriptor, parameter descriptor
or None)``. Operations and the backend descriptors they lower to:

==============================  ===================================================================
``pointwise(mode, ...)``        ``CUDNN_BACKEND_POINTWISE_DESCRIPTOR`` + ``OPERATION_POINTWISE``
``matmul(a, b)``                ``MATMUL_DESCRIPTOR`` + ``OPERATION_MATMUL``
``conv_fprop/dgrad/wgrad``      ``CONVOLUTION_DESCRIPTOR`` + ``OPERATION_CONVOLUTION_FORWARD`` /
                                ``_BACKWARD_DATA`` / ``_BACKWARD_FILTER``
``reduction(x, dims, mode)``    ``REDUCTION_DESCRIPTOR`` + ``OPERATION_REDUCTION``
``resample_forward/backward``   ``RESAMPLE_DESCRIPTOR`` + ``OPERATION_RESAMPLE_FWD`` / ``_BWD``
``norm_forward/backward``       ``OPERATION_NORM_FORWARD`` / ``_BACKWARD``
``genstats(x)``                 ``OPERATION_GEN_STATS``
``rng(dims, seed=...)``         ``RNG_DESCRIPTOR`` + ``OPERATION_RNG``
``reshape``, ``concat``         ``OPERATION_RESHAPE``, ``OPERATION_CONCATENATE``
``sdpa_forward/backward``       the fused-attention composite, or ``OPERATION_SDPA_FWD`` / ``_BWD``
``sdpa_fp8_forward/backward``   the fp8 attention composite (matmul, pointwise, reduction, reshape, rng)
==============================  ===================================================================
"""

from __future__ import annotations

from . import conv, matmul, norm, pointwise, reduction, resample, reshape, rng, sdpa, sdpa_fp8
from .conv import ConvNodes
from .matmul import MatmulNodes
from .norm import NormNodes
from .pointwise import PointwiseNodes
from .reduction import ReductionNodes
from .resample import ResampleNodes
from .reshape import ReshapeNodes
from .rng import RngNodes
from .sdpa import SdpaNodes
from .sdpa_fp8 import SdpaFp8Nodes

__all__ = [
    "LOWER",
    "ConvNodes",
    "MatmulNodes",
    "NormNodes",
    "PointwiseNodes",
    "ReductionNodes",
    "ResampleNodes",
    "ReshapeNodes",
    "RngNodes",
    "SdpaNodes",
    "SdpaFp8Nodes",
]

#: node kind -> its lowering ``(node, tensor descriptors by uid) -> (operation, parameter descriptor or None)``
LOWER = {
    **pointwise.LOWER,
    **matmul.LOWER,
    **conv.LOWER,
    **reduction.LOWER,
    **resample.LOWER,
    **norm.LOWER,
    **rng.LOWER,
    **reshape.LOWER,
    **sdpa.LOWER,
    **sdpa_fp8.LOWER,
}
