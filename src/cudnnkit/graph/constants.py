"""cuDNN's modes by the names the graph builder takes: pointwise modes and their arity, reductions, resample
and padding modes, norm modes and RNG distributions (each mapped to its ``lib`` enum value)."""

from __future__ import annotations

from .. import lib

# ----------------------------------------------------------------- pointwise modes

POINTWISE_MODES = lib.cudnnPointwiseMode_t
#: the inputs each pointwise mode takes: "x", "x,b", "x,b,t" (select) or "dy,x" (activation backward)
POINTWISE_ARITY: dict[str, str] = {}
for _m in POINTWISE_MODES:
    _n = _m.name.removeprefix("CUDNN_POINTWISE_")
    if _n.endswith("_BWD"):
        POINTWISE_ARITY[_n] = "dy,x"
    elif _n == "BINARY_SELECT":
        POINTWISE_ARITY[_n] = "x,b,t"
    elif _n in (
        "ADD",
        "ADD_SQUARE",
        "DIV",
        "MAX",
        "MIN",
        "MOD",
        "MUL",
        "POW",
        "SUB",
        "ATAN2",
        "LOGICAL_AND",
        "LOGICAL_OR",
    ) or _n.startswith("CMP_"):
        POINTWISE_ARITY[_n] = "x,b"
    else:
        POINTWISE_ARITY[_n] = "x"
del _m, _n

# keyword -> (attribute, modes it applies to)
PW_PARAMS = {
    "relu_lower_clip": ("CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP", ("RELU_FWD", "RELU_BWD")),
    "relu_upper_clip": ("CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP", ("RELU_FWD", "RELU_BWD")),
    "relu_lower_clip_slope": ("CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE", ("RELU_FWD", "RELU_BWD")),
    "elu_alpha": ("CUDNN_ATTR_POINTWISE_ELU_ALPHA", ("ELU_FWD", "ELU_BWD")),
    "softplus_beta": ("CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA", ("SOFTPLUS_FWD", "SOFTPLUS_BWD")),
    "swish_beta": ("CUDNN_ATTR_POINTWISE_SWISH_BETA", ("SWISH_FWD", "SWISH_BWD")),
    "axis": ("CUDNN_ATTR_POINTWISE_AXIS", ("GEN_INDEX",)),
}

REDUCTIONS = {m.name.removeprefix("CUDNN_REDUCE_TENSOR_").lower(): m for m in lib.cudnnReduceTensorOp_t}

_RS = lib.cudnnResampleMode_t
RESAMPLE_MODES = {
    "max": _RS.CUDNN_RESAMPLE_MAXPOOL,
    "avg_include_padding": _RS.CUDNN_RESAMPLE_AVGPOOL_INCLUDE_PADDING,
    "avg_exclude_padding": _RS.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING,
}
PADDING_MODES = {
    "zero": lib.cudnnPaddingMode_t.CUDNN_ZERO_PAD,
    "neg_inf": lib.cudnnPaddingMode_t.CUDNN_NEG_INF_PAD,
    "edge": lib.cudnnPaddingMode_t.CUDNN_EDGE_VAL_PAD,
}
_NM = lib.cudnnBackendNormMode_t
NORM_MODES = {
    "batch": _NM.CUDNN_BATCH_NORM,
    "layer": _NM.CUDNN_LAYER_NORM,
    "instance": _NM.CUDNN_INSTANCE_NORM,
    "rms": _NM.CUDNN_RMS_NORM,
}
RNG_DISTRIBUTIONS = {m.name.removeprefix("CUDNN_RNG_DISTRIBUTION_").lower(): m for m in lib.cudnnRngDistribution_t}
