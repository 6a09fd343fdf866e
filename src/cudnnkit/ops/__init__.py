"""L2: array-level wrappers that mirror cuDNN's forward and backward calls.

Each function takes CUDA arrays (CuPy, torch, or any ``__cuda_array_interface__``
/ DLPack array) and keywords, runs on the array library's current stream (or
``stream=``; the legacy default stream for arrays without an adapter), and
rejects bad input with a Python exception naming the argument before any GPU
work. Outputs are allocated with the input's library; arrays of a library
without a cudnnkit adapter need ``out=`` (and ``DropoutState`` and host CTC
labels need CuPy or torch).

The ops are declared as :class:`Primitive` s (:mod:`cudnnkit.ops._primitive`) in :data:`REGISTRY`, by name, as
they move onto the shared machinery; :func:`last_path` says whether this thread's last call ran the graph API or
the legacy call.
"""

from __future__ import annotations

from ._primitive import REGISTRY, Primitive, last_path
from .activation import activation_backward, activation_forward
from .arith import op_tensor, reduce_tensor
from .attention import attention_backward, attention_forward, sdpa_backward, sdpa_forward
from .convolution import (
    Convolution,
    convolution_backward_bias,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
)
from .ctc import ctc_loss
from .dropout import DropoutState, default_state, dropout_backward, dropout_forward
from .layer_norm import (
    instance_norm_backward,
    instance_norm_forward,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)
from .lrn import divisive_normalization_backward, divisive_normalization_forward, lrn_backward, lrn_forward
from .normalization import batch_norm_backward, batch_norm_forward
from .pooling import Pooling, pooling_backward, pooling_forward
from .rnn import RNN, LinearParams, load_torch_params, rnn_backward, rnn_forward, to_torch_params, torch_param_names
from .softmax import softmax_backward, softmax_forward
from .spatial_transformer import (
    affine_grid_backward,
    affine_grid_forward,
    grid_sample_backward,
    grid_sample_forward,
)
from .tensor import add_tensor, scale_tensor, set_tensor, transform_tensor

__all__ = [
    "REGISTRY",
    "Primitive",
    "last_path",
    "softmax_forward",
    "softmax_backward",
    "activation_forward",
    "activation_backward",
    "Convolution",
    "convolution_forward",
    "convolution_backward_data",
    "convolution_backward_filter",
    "convolution_backward_bias",
    "Pooling",
    "pooling_forward",
    "pooling_backward",
    "ctc_loss",
    "RNN",
    "LinearParams",
    "rnn_forward",
    "rnn_backward",
    "load_torch_params",
    "to_torch_params",
    "torch_param_names",
    "DropoutState",
    "default_state",
    "dropout_forward",
    "dropout_backward",
    "lrn_forward",
    "lrn_backward",
    "divisive_normalization_forward",
    "divisive_normalization_backward",
    "batch_norm_forward",
    "batch_norm_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "rms_norm_forward",
    "rms_norm_backward",
    "instance_norm_forward",
    "instance_norm_backward",
    "affine_grid_forward",
    "affine_grid_backward",
    "grid_sample_forward",
    "grid_sample_backward",
    "op_tensor",
    "reduce_tensor",
    "set_tensor",
    "scale_tensor",
    "add_tensor",
    "transform_tensor",
    "sdpa_forward",
    "sdpa_backward",
    "attention_forward",
    "attention_backward",
]
