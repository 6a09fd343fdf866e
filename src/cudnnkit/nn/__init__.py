"""``cudnnkit.nn``: a functional API with ``torch.nn.functional``'s names, signatures and semantics, on cuDNN.

Torch tensors in, torch tensors out, with autograd (each op through ``cudnnkit.torch.op(name)``, the L3 custom
op); CuPy arrays in, CuPy arrays out, forward only (through ``cudnnkit.autograd.get(name).forward``). The array
library is read from the arguments (:mod:`cudnnkit.runtime.adapters`); importing this module imports neither
torch nor CuPy. The L3 ops are looked up at call time.

Every argument combination not computed here as torch defines it raises ``NotImplementedError`` naming
the argument, before any GPU work (``return_indices`` and ``dilation`` of pooling; an even
``size`` of ``local_response_norm``; ``grid_sample`` other than bilinear, zeros, ``align_corners=True``, 4-d; a
``blank`` other than 0 in ``ctc_loss``; in ``scaled_dot_product_attention`` a boolean ``attn_mask`` (additive
float masks are taken), ``dropout_p = 1``, inputs of other than 3 or 4 dims; ``hardtanh`` with
``min_val != 0``; float64 in the graph norms; the graph-only activations ``gelu``, ``leaky_relu``, ``softplus``).
``scaled_dot_product_attention``'s dropout is cuDNN's (seeded from the array library's generator: other masks than
torch's). The attention limits are this API's, not cuDNN's: the L3 op ``attention`` takes dropout with your own
seed/offset arrays, sliding windows, padding lengths, ALiBi, softcapping and sinks, and the L2 function
:func:`cudnnkit.ops.attention_forward` packed and paged batches too.

========================  ==================================================  ====================================
family                    functions                                           L3 op (cuDNN)
========================  ==================================================  ====================================
convolution               conv1d/2d/3d, conv_transpose1d/2d/3d                convolution, convolution_transpose
pooling                   max_pool1d/2d/3d, avg_pool1d/2d/3d                  pooling
normalization             batch_norm, layer_norm, rms_norm, instance_norm,    batch_norm, layer_norm, rms_norm,
                          local_response_norm                                 instance_norm, lrn
activations               softmax, log_softmax, relu, relu6, sigmoid,         softmax, activation
                          tanh, elu, silu, hardtanh
dropout                   dropout                                             dropout
spatial transformer       affine_grid, grid_sample                            affine_grid, grid_sample
loss                      ctc_loss                                            ctc_loss
attention                 scaled_dot_product_attention                        sdpa, attention (graph API)
recurrent                 lstm, gru, rnn_tanh, rnn_relu (torch's _VF)         rnn
========================  ==================================================  ====================================
"""

from __future__ import annotations

from .activation import (
    dropout,
    elu,
    gelu,
    hardtanh,
    leaky_relu,
    log_softmax,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)
from .attention import scaled_dot_product_attention
from .conv import conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d, conv_transpose3d
from .loss import ctc_loss
from .normalization import batch_norm, instance_norm, layer_norm, local_response_norm, rms_norm
from .pooling import avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d, max_pool2d, max_pool3d
from .rnn import gru, lstm, rnn_relu, rnn_tanh
from .vision import affine_grid, grid_sample

__all__ = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "softmax",
    "log_softmax",
    "batch_norm",
    "layer_norm",
    "rms_norm",
    "instance_norm",
    "local_response_norm",
    "dropout",
    "grid_sample",
    "affine_grid",
    "ctc_loss",
    "scaled_dot_product_attention",
    "relu",
    "relu6",
    "sigmoid",
    "tanh",
    "elu",
    "silu",
    "hardtanh",
    "gelu",
    "leaky_relu",
    "softplus",
    "lstm",
    "gru",
    "rnn_tanh",
    "rnn_relu",
]
