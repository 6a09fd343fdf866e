"""What the normalization modules share: the parameters' dtype rule, the checks of epsilon, parameters and
statistics, the layouts a call's arrays are taken and given in, the ``out=`` tuple, and the L3 helpers (specs,
the meta's first check, the gradients asked for). :mod:`cudnnkit.ops.normalization` (batch norm) and
:mod:`cudnnkit.ops.layer_norm` (layer, RMS and instance norm) import them; nothing here calls cuDNN."""

from __future__ import annotations

from typing import Any

from .. import lib
from ..runtime import check_scalar
from ..runtime.arrays import contiguous_strides
from ..runtime.dtypes import FLOATS
from ..runtime.shapes import INT32_MAX
from ._diff import Spec
from ._layout import channels_last_strides, copy_in
from ._nd import layout_of
from ._primitive import Call, Operand, split_out

_DTYPES = FLOATS
_PARAMS = ("float32", "float64")


def param_dtype(dtype: str) -> str:
    """The dtype of the parameters and statistics for data of ``dtype`` (``cudnnDeriveBNTensorDescriptor``'s
    rule): float32 for float16, bfloat16 and float32, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


# ----------------------------------------------------------------- shared checks and layouts


def _epsilon(v: Any, legacy: bool, dtype: str = "float32") -> float:
    """``epsilon``: a positive finite number (batch norm's at least ``CUDNN_BN_MIN_EPSILON``, a double that cuDNN
    computes with in float32 unless the data is float64; the graph norms' a float32 scalar)."""
    eps = check_scalar(v, "epsilon", dtype=dtype if legacy else None)
    if not eps > 0 or (legacy and eps < lib.CUDNN_BN_MIN_EPSILON):
        low = f" and >= CUDNN_BN_MIN_EPSILON ({lib.CUDNN_BN_MIN_EPSILON})" if legacy else ""
        raise ValueError(f"epsilon must be > 0{low}, got {eps}")
    return float(eps)


def _fits(v: Any, name: str) -> None:
    """cuDNN's dims, strides and (legacy) element offsets are ints."""
    if any(d > INT32_MAX for d in v.shape) or v.size > INT32_MAX:
        raise ValueError(f"{name} has shape {v.shape}: cuDNN takes at most 2**31 - 1 elements (its dims are ints)")


def _param(v: Any, name: str, shape: tuple[int, ...], dtype: str, ref: str, written: bool = False,
           graph: bool = False) -> None:  # fmt: skip
    """A parameter or statistic: ``shape``, ``dtype`` (the parameters' dtype of ``ref``'s data), packed when
    cuDNN writes it."""
    if v is None:
        return
    if v.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {v.shape}")
    if v.dtype != dtype and graph:
        raise TypeError(f"{name} has dtype {v.dtype} but must be float32 (the graph norms' parameters and "
                        "statistics)")  # fmt: skip
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but must be {dtype} for {ref} of that dtype (cuDNN's rule: "
                        "float32 parameters and statistics for float16, bfloat16 and float32 data, float64 for "
                        "float64)")  # fmt: skip
    if written and not v.is_contiguous():
        raise ValueError(f"{name} must be C-contiguous (cuDNN writes it as a packed array), got strides {v.strides}")


def _canon(shape: tuple[int, ...], lay: str, rank: int = 4) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` padded with trailing size-1 dims to ``rank`` (at least), and the strides of a dense array of that
    shape in layout ``lay`` (every stride set, size-1 dims included: cuDNN reads the layout from all of them)."""
    shape = tuple(shape) + (1,) * (rank - len(shape))
    return shape, channels_last_strides(shape) if lay == "nhwc" else contiguous_strides(shape)


def _new_strides(shape: tuple[int, ...], lay: str) -> tuple[int, ...] | None:
    return channels_last_strides(shape) if lay == "nhwc" and len(shape) >= 3 else None


def _in_layout(c: Call, name: str, lay: str) -> Any:
    """``c.views[name]`` in layout ``lay`` (the output's), copied where it is not (logged)."""
    v = c.views[name]
    if layout_of(v) == lay:
        return v
    want = channels_last_strides(v.shape) if lay == "nhwc" else None
    _, v = copy_in(c.launch, c.arrays[name], v, want, name, f"in the output's layout ({lay})")
    return v


def _out_layout(c: Call, name: str) -> str:
    lay = layout_of(c.views[name])
    if lay is None:
        v = c.views[name]
        raise ValueError(
            f"{name} must be dense channels-first (C order) or channels-last, got shape {v.shape} strides {v.strides}"
        )
    return lay


def _stat(c: Call, name: str, shape: tuple[int, ...], dtype: str) -> Any:
    """The view of statistic ``name``: the given ``out=`` array (an operand), or a new packed one; the array is
    kept in ``c.extra[name]`` (what the call returns)."""
    v = c.views.get(name)
    if v is None:
        arr, v = c.launch.empty(shape, dtype, name=name)
    else:
        arr = c.arrays[name]
    c.extra[name] = arr
    c.views[name] = v
    return v


def _outs(fn: str, out: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """``out=``: None, or a tuple of one array or None per output, in ``names``' order (the shared rule,
    :func:`~cudnnkit.ops._primitive.split_out`)."""
    return split_out(fn, out, dict.fromkeys(names))


def _packed_spec(shape: tuple[int, ...], dtype: str) -> Spec:
    return Spec(tuple(shape), contiguous_strides(tuple(shape)), dtype)


def _meta_x(x: Spec | None, scale: Spec | None, fn: str) -> None:
    if x is None or scale is None:
        raise ValueError(f"{fn}: x and scale are required")
    if x.dtype not in _DTYPES:
        raise TypeError(f"{fn}: x has dtype {x.dtype}, not one of {', '.join(_DTYPES)}")


def _needed(grads: tuple, needs: tuple) -> tuple:
    return tuple(g if n else None for g, n in zip(grads, needs))


def _p(name: str, dtypes: tuple[str, ...] = _PARAMS, **kw: Any) -> Operand:
    """A packed (C-contiguous) parameter or statistic operand, in the parameters' dtypes by default."""
    return Operand(name, dtypes, packed=True, **kw)
