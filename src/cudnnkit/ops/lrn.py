"""Local response normalization (cross-channel) and divisive normalization, forward and backward.

LRN (``cudnnLRNCrossChannelForward``/``Backward``, ``CUDNN_LRN_CROSS_CHANNEL_DIM1``)::

    y[n, c, ...] = x[n, c, ...] / (k + alpha / size * sum_{c'} x[n, c', ...]^2) ** beta

where ``c'`` runs over the ``size`` channels ``c - (size - 1) // 2 ... c + size // 2``
that exist (zero padding at the edges), as cuDNN documents for ``lrnN``. For an
odd ``size`` this is torch's ``LocalResponseNorm(size, alpha, beta, k)``; for
an even ``size`` the window is one channel off: cuDNN looks one channel further
ahead than behind, torch one further behind than ahead.

Divisive normalization (``cudnnDivisiveNormalizationForward``/``Backward``,
``CUDNN_DIVNORM_PRECOMPUTED_MEANS``) is cuDNN's spatial contrast
normalization with the same four parameters, over a ``size`` x ``size``
window in H and W of the same channel (offsets as LRN's, zero padding)::

    y[n, c, h, w] = x[n, c, h, w] / (k + alpha / size**2 * sum_{h', w'} x[n, c, h', w']^2) ** beta

and for a 5-d ``(N, C, D, H, W)`` array over a ``size**3`` window in D, H and W, divided by ``size**3``.
These formulas are not in cuDNN's documentation; they were identified on an H200
(cuDNN 9.19) and match to 1e-16, and the GPU tests hold cuDNN to them. With
``means`` given, cuDNN's use of them is not documented and does not match
``x - means`` in either place; cudnnkit passes them through, and the tests
check that ``dx`` and ``dmeans`` are the derivatives of the forward. For an
even ``size``, cuDNN 9.19's backward sums over the forward's window rather
than its mirror image, so its ``dx`` is not the exact gradient there (odd
sizes are exact); prefer odd sizes when training. The two
temporary buffers cuDNN needs are allocated here, with the input's library.

In the functions the formula's ``alpha`` and ``beta`` are the keywords
``lrn_alpha`` (default 1e-4) and ``lrn_beta`` (0.75), cuDNN's ``lrnAlpha``/
``lrnBeta``. Parameters are checked before any call: ``size`` an int in
``[1, 16]`` (``CUDNN_LRN_MIN_N``/``MAX_N``); ``lrn_alpha``, ``lrn_beta`` and
``k`` real and finite (``TypeError``/``ValueError`` naming them) and within
float32 for every dtype (cuDNN casts them to the data's type),
``k >= 1e-5`` and ``lrn_beta >= 0.01``. Dtypes: float16, float32, float64
(cuDNN refuses bfloat16 here). The output blend is
``out = y_alpha * result + y_beta * out`` (``dx_alpha``/``dx_beta`` in the
backwards).

Renaming, in two steps. Every other op blends its output with ``alpha``/``beta``;
here those names were the formula's (as in torch's ``LocalResponseNorm``). In
0.2 the formula moved to ``lrn_alpha``/``lrn_beta``; ``alpha=``/``beta=`` still
mean the formula, with a ``FutureWarning``. In 0.3 ``alpha``/``beta`` become the
output blend, and ``y_alpha``/``y_beta``/``dx_alpha``/``dx_beta`` their
deprecated names. ``divisive_normalization_backward`` takes its two outputs as
``out=(dx, dmeans)`` (``dx_out=``/``dmeans_out=`` are deprecated).

Dims and layouts. cuDNN's LRN takes 4-d tensors of any positive strides and
5-d ones only NCDHW DHW-packed; LRN here takes 3 to 8 dims ``(N, C,
spatial...)`` in any layout: a 5- to 8-d array that cuDNN would refuse is
described as the 4-d ``(N, C, S1, S2)`` its spatial dims merge into (the same
memory; LRN is across channels, so grouping spatial positions changes no
value), and one whose spatial dims do not merge is copied to C order first.
Divisive normalization takes 3 to 5 dims (cuDNN has no other; a 3-d array runs
as 4-d), and runs in packed NCHW or channels-last (other layouts are copied to
C order). Both give cuDNN one layout for every tensor of a call
(:mod:`cudnnkit.ops._layout`): ``y`` is allocated in ``x``'s layout when ``x``
is dense; an input in another layout is copied into the call's, and an ``out``
(``dx_out``, ``dmeans_out``) in another layout is computed into a temporary
(``out``'s contents copied into it first when the blend's beta is not 0) and
then copied into it. Every copy is logged on the ``cudnnkit`` logger at debug
level.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

from .. import lib
from ..runtime import DescriptorKind, check_dtype, get_cached
from ..runtime.arrays import ArrayView, contiguous_strides, is_dense
from ..runtime.cache import lru
from ..runtime.dtypes import check_scalar, scaling_ref
from ._diff import Differentiable, Spec, differentiable
from ._layout import canonical_strides, channels_last_strides, describable, merge
from ._primitive import Call, Operand, Output, Primitive, register, run, split_out

__all__ = ["lrn_forward", "lrn_backward", "divisive_normalization_forward", "divisive_normalization_backward"]

_FLOAT32_MAX = 3.4028234663852886e38

# cuDNN 9.19 returns NOT_SUPPORTED for bfloat16 LRN and divisive normalization (measured on an H200)
_DTYPES = ("float16", "float32", "float64")


def _set_lrn(ptr: int, n: int, alpha: float, beta: float, k: float) -> None:
    lib.cudnnSetLRNDescriptor(ptr, n, alpha, beta, k)


_LRN = DescriptorKind("lrn", "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor", _set_lrn)


def _lrn_desc(
    size: int, alpha: float, beta: float, k: float, dtype: str, names: tuple[str, str] = ("lrn_alpha", "lrn_beta")
) -> Any:
    """The cached LRN descriptor, every parameter checked first: ``size`` an int in cuDNN's range; ``alpha``,
    ``beta``, ``k`` real and finite (``TypeError``/``ValueError`` naming them) and within float32 (cuDNN casts them
    to the data's type: for all but float64 data they would overflow; for float64 such values are no sane LRN
    either, and one rule for every dtype keeps a config valid across dtypes), ``k >= 1e-5``, ``beta >= 0.01``."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {size!r}")
    if not lib.CUDNN_LRN_MIN_N <= size <= lib.CUDNN_LRN_MAX_N:
        raise ValueError(f"size must be in [{lib.CUDNN_LRN_MIN_N}, {lib.CUDNN_LRN_MAX_N}] (cuDNN's limit), got {size}")
    an, bn = names
    alpha, beta, k = (check_scalar(v, name, dtype=dtype) for v, name in ((alpha, an), (beta, bn), (k, "k")))
    for v, name in ((alpha, an), (beta, bn), (k, "k")):
        if abs(v) > _FLOAT32_MAX:
            raise ValueError(
                f"{name}={v!r} is out of range: LRN parameters must be within float32 (|{name}| <= "
                f"{_FLOAT32_MAX:.7g}) for every dtype"
            )
    if not k >= lib.CUDNN_LRN_MIN_K:
        raise ValueError(f"k must be >= {lib.CUDNN_LRN_MIN_K} (cuDNN's limit), got {k}")
    if not beta >= lib.CUDNN_LRN_MIN_BETA:
        raise ValueError(f"{bn} must be >= {lib.CUDNN_LRN_MIN_BETA} (cuDNN's limit), got {beta}")
    return get_cached(_LRN, (size, alpha, beta, k))


class _Unset:
    """The default of the deprecated ``alpha``/``beta`` keywords: not given."""

    def __repr__(self) -> str:
        return "<not given>"


_UNSET: Any = _Unset()


def _formula(fn: str, lrn_alpha: Any, lrn_beta: Any, alpha: Any, beta: Any, blend: str) -> dict[str, Any]:
    """The formula's parameters of a call in the renaming's deprecation window (see the module docstring):
    ``lrn_alpha``/``lrn_beta``, or the deprecated ``alpha``/``beta`` when given (with a ``FutureWarning``; a
    non-default ``lrn_alpha`` beside ``alpha`` is a ``TypeError``); errors name what the user wrote."""
    for new, old, nn, on, default in (
        (lrn_alpha, alpha, "lrn_alpha", "alpha", 1e-4),
        (lrn_beta, beta, "lrn_beta", "beta", 0.75),
    ):
        if old is not _UNSET and not (type(new) is float and new == default):
            raise TypeError(f"{fn}: pass {nn}= or its deprecated name {on}=, not both")
    if alpha is not _UNSET or beta is not _UNSET:
        warnings.warn(
            f"{fn}: alpha=/beta= name the LRN formula's parameters here, where every other op's alpha/beta blend "
            f"the output; pass lrn_alpha=/lrn_beta= for the formula. From cudnnkit 0.3 alpha/beta will be this "
            f"op's output blend (today's {blend}), as everywhere else",
            FutureWarning,
            stacklevel=3,
        )
    return {
        "alpha": lrn_alpha if alpha is _UNSET else alpha,
        "beta": lrn_beta if beta is _UNSET else beta,
        "names": ("lrn_alpha" if alpha is _UNSET else "alpha", "lrn_beta" if beta is _UNSET else "beta"),
    }


@lru("lrn.lrn_describe", 4096)
def _lrn_describe(shape: tuple[int, ...], strides: tuple[int, ...]):
    """How LRN describes an array to cuDNN, or None when it must be copied first.

    cuDNN's LRN takes 4-d tensors of any positive strides (NCHW, NHWC, slices) and 5-d ones only when NCDHW
    DHW-packed (its documentation; other 5-d and all 6- to 8-d tensors get BAD_PARAM or NOT_SUPPORTED). A 3-d or
    4-d array, and a DHW-packed 5-d one, are described as they are (a 3-d one padded with a trailing size-1 dim).
    Any other array has its spatial dims merged into one or two, giving a 4-d ``(N, C, S1, S2)`` description with
    the same memory: LRN normalizes across channels only, so which spatial positions are grouped does not change
    a value. Where the spatial dims do not merge (a gap inside them), the array is copied to C order first."""
    if not describable(shape, strides):
        return None
    st = canonical_strides(shape, strides)
    nd = len(shape)
    if nd <= 4:
        return shape, st
    sp, ss = shape[2:], st[2:]
    whole = merge(sp, ss)
    if nd == 5 and whole is not None and whole[1] == 1:
        return shape, st  # NCDHW, DHW-packed
    if whole is not None:
        return (shape[0], shape[1], whole[0], 1), (st[0], st[1], whole[1], 1)
    for cut in range(1, len(sp)):
        a, b = merge(sp[:cut], ss[:cut]), merge(sp[cut:], ss[cut:])
        if a is not None and b is not None:
            return (shape[0], shape[1], a[0], b[0]), (st[0], st[1], a[1], b[1])
    return None


def _lrn_resolve(views: Any, kw: Any) -> Any:
    """The LRN descriptor of a call (its parameters checked), after the first array's dims (3 to 8)."""
    name0, v0 = next(iter(views.items()))
    if not 3 <= v0.ndim <= 8:
        raise ValueError(f"{name0} must have 3 to 8 dims (N, C, spatial...), got shape {v0.shape}")
    return _lrn_desc(kw["size"], kw["alpha"], kw["beta"], kw["k"], v0.dtype, kw["names"])


def _lrn_forward_call(c: Call) -> None:
    vx, vy, d = c.views["x"], c.views["out"], c.desc
    lib.cudnnLRNCrossChannelForward(
        c.launch.handle, c.resolved, lib.CUDNN_LRN_CROSS_CHANNEL_DIM1, c.alpha, d, vx.ptr, c.beta, d, vy.ptr
    )


def _lrn_backward_call(c: Call) -> None:
    vx, vy, vdy, vdx, d = c.views["x"], c.views["y"], c.views["dy"], c.views["out"], c.desc
    lib.cudnnLRNCrossChannelBackward(
        c.launch.handle,
        c.resolved,
        lib.CUDNN_LRN_CROSS_CHANNEL_DIM1,
        c.alpha,
        d,
        vy.ptr,
        d,
        vdy.ptr,
        d,
        vx.ptr,
        c.beta,
        d,
        vdx.ptr,
    )


LRN_FORWARD = register(
    Primitive(
        "lrn_forward",
        inputs=(Operand("x", _DTYPES),),
        outputs=(Output("out", like="x"),),
        resolve=_lrn_resolve,
        describe=lambda resolved: _lrn_describe,
        legacy=_lrn_forward_call,
        layout_what="cuDNN's LRN takes x and y in one layout",
        blend=True,
        blend_names=("y_alpha", "y_beta"),
        family="normalization",
        differentiable=("x",),
        residuals=("x", "out"),
        backward="lrn_backward",
    )
)

LRN_BACKWARD = register(
    Primitive(
        "lrn_backward",
        inputs=(Operand("dy", _DTYPES), Operand("y", like="dy"), Operand("x", like="dy")),
        outputs=(Output("out", like="x"),),
        resolve=_lrn_resolve,
        describe=lambda resolved: _lrn_describe,
        legacy=_lrn_backward_call,
        layout_what="cuDNN's LRN backward takes y, dy, x and dx in one layout",
        layout_order=("x", "y", "dy"),
        blend=True,
        blend_names=("dx_alpha", "dx_beta"),
        family="normalization",
    )
)


def lrn_forward(
    x: Any,
    *,
    size: int = 5,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    y_alpha: float = 1.0,
    y_beta: float = 0.0,
    stream: Any = None,
    alpha: float = _UNSET,
    beta: float = _UNSET,
) -> Any:
    """Cross-channel LRN of ``x`` ``(N, C, ...)`` (3 to 8 dims, any strides); returns ``y`` of the same shape and
    dtype (``out`` if given, any layout: see the module docstring for the copies a layout unlike ``x``'s costs).

    ``lrn_alpha`` (default 1e-4), ``lrn_beta`` (0.75), ``size`` and ``k`` are the formula's (``alpha``/``beta``:
    their deprecated names, see the module docstring); ``out = y_alpha * result + y_beta * out``.
    ``cudnnLRNCrossChannelForward`` (primitive :data:`LRN_FORWARD`). The backward needs ``x`` and this ``y``.

    Args:
        x: a CUDA array ``(N, C, ...)`` of 3 to 8 dims; float16, float32 or float64 (cuDNN refuses bfloat16).
        size: the window, an int in ``[1, 16]`` (``CUDNN_LRN_MIN_N``/``MAX_N``); odd sizes have an exact backward.
        lrn_alpha: the formula's alpha (cuDNN's ``lrnAlpha``), real, finite, within float32.
        lrn_beta: the formula's beta (cuDNN's ``lrnBeta``), at least 0.01.
        k: the formula's k (cuDNN's ``lrnK``), at least 1e-5.
        out: an array of ``x``'s shape and dtype to write ``y`` into, any layout; None allocates ``y``.
        y_alpha: scale of the result.
        y_beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.
        alpha: deprecated name of ``lrn_alpha`` (a ``FutureWarning``; becomes the output blend in 0.3).
        beta: deprecated name of ``lrn_beta`` (likewise).

    Returns:
        ``y``, ``x``'s shape and dtype (``out`` itself when given).

    Raises:
        TypeError: a host array, an unsupported dtype, or a non-real parameter (each named).
        ValueError: a parameter out of its range, or ``x`` of fewer than 3 dims.

    Example:
        >>> y = ops.lrn_forward(x, size=5, lrn_alpha=1e-4, lrn_beta=0.75, k=2.0)
        >>> dx = ops.lrn_backward(dy, y, x, size=5, lrn_alpha=1e-4, lrn_beta=0.75, k=2.0)
    """
    f = _formula("lrn_forward", lrn_alpha, lrn_beta, alpha, beta, "y_alpha/y_beta")
    kw = dict(size=size, k=k, out=out, y_alpha=y_alpha, y_beta=y_beta, **f)
    return run(LRN_FORWARD, {"x": x}, stream=stream, **kw)


def lrn_backward(
    dy: Any,
    y: Any,
    x: Any,
    *,
    size: int = 5,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    dx_alpha: float = 1.0,
    dx_beta: float = 0.0,
    stream: Any = None,
    alpha: float = _UNSET,
    beta: float = _UNSET,
) -> Any:
    """Gradient of :func:`lrn_forward`: ``dx`` from ``dy``, the forward's ``y`` and its input ``x``.

    ``cudnnLRNCrossChannelBackward`` (primitive :data:`LRN_BACKWARD`), with ``y``, ``dy``, ``x`` and ``dx`` in
    one layout (copies where they differ); the LRN parameters must be the forward's;
    ``out = dx_alpha * dx + dx_beta * out``.

    Args:
        dy: the gradient of ``y``, ``x``'s shape and dtype.
        y: the forward's output.
        x: the forward's input.
        size: the window, an int in ``[1, 16]`` (``CUDNN_LRN_MIN_N``/``MAX_N``); odd sizes have an exact backward.
        lrn_alpha: the formula's alpha (cuDNN's ``lrnAlpha``), real, finite, within float32.
        lrn_beta: the formula's beta (cuDNN's ``lrnBeta``), at least 0.01.
        k: the formula's k (cuDNN's ``lrnK``), at least 1e-5.
        out: an array of ``x``'s shape and dtype to write ``dx`` into; None allocates it.
        dx_alpha: scale of the gradient.
        dx_beta: blend factor of ``out``'s previous contents.
        stream: the stream to run on; None: the library's current stream.
        alpha: deprecated name of ``lrn_alpha`` (a ``FutureWarning``; becomes the output blend in 0.3).
        beta: deprecated name of ``lrn_beta`` (likewise).

    Returns:
        ``dx``, ``x``'s shape and dtype.

    Example:
        >>> y = ops.lrn_forward(x, size=3)
        >>> dx = ops.lrn_backward(dy, y, x, size=3)
    """
    f = _formula("lrn_backward", lrn_alpha, lrn_beta, alpha, beta, "dx_alpha/dx_beta")
    kw = dict(size=size, k=k, out=out, dx_alpha=dx_alpha, dx_beta=dx_beta, **f)
    return run(LRN_BACKWARD, {"dy": dy, "y": y, "x": x}, stream=stream, **kw)


@lru("lrn.divnorm_describe", 4096)
def _divnorm_describe(shape: tuple[int, ...], strides: tuple[int, ...]):
    """How divisive normalization describes an array: as it is when packed NCHW (C order) or channels-last,
    else None (copied to C order). cuDNN describes ``x``, ``means`` and its two scratch buffers with one
    descriptor, and the scratch buffers are allocated here, so the layout must be one an allocation can have;
    of those, only the two the GPU tests hold to the reference are handed to cuDNN (it refuses some layouts
    with NOT_SUPPORTED)."""
    if not describable(shape, strides):
        return None
    st = canonical_strides(shape, strides)
    if st == contiguous_strides(shape) or st == canonical_strides(shape, channels_last_strides(shape)):
        return shape, st
    return None


def _temps(launch, shape, dtype, strides) -> tuple[Any, ArrayView, Any, ArrayView]:
    """The two scratch buffers divisive normalization needs, laid out as the call's descriptor says."""
    t1, v1 = launch.empty(shape, dtype, strides, name="temp")
    t2, v2 = launch.empty(shape, dtype, strides, name="temp2")
    return t1, v1, t2, v2


_DIVNORM_DIMS = " (cuDNN's divisive normalization takes 4-d and 5-d tensors; a 3-d array is run as 4-d)"


def _divnorm_dims(views: Any) -> ArrayView:
    """The call's first array, checked to have 3 to 5 dims."""
    name0, v0 = next(iter(views.items()))
    if not 3 <= v0.ndim <= 5:
        raise ValueError(f"{name0} must have 3 to 5 dims (N, C, spatial...){_DIVNORM_DIMS}, got shape {v0.shape}")
    return v0


def _divnorm_resolve(views: Any, kw: Any) -> Any:
    """The LRN descriptor of a divisive normalization call, after the first array's dims (3 to 5)."""
    v0 = _divnorm_dims(views)
    return _lrn_desc(kw["size"], kw["alpha"], kw["beta"], kw["k"], v0.dtype, kw["names"])


def _divnorm_backward_resolve(views: Any, kw: Any) -> Any:
    """:func:`_divnorm_resolve`, and the outputs' consistency with ``means`` (checked first: dims, dmeans_out,
    the parameters, then the blend's outputs, as before the declaration)."""
    v0 = _divnorm_dims(views)
    if views["means"] is None and kw.get("dmeans_out") is not None:
        raise ValueError("dmeans_out needs means: without means there is no dmeans")
    desc = _lrn_desc(kw["size"], kw["alpha"], kw["beta"], kw["k"], v0.dtype, kw["names"])
    b = kw["dx_beta"]
    # a non-number is left to the blend's own check (a TypeError naming dx_beta)
    if isinstance(b, numbers.Real) and b != 0:
        if kw.get("dx_out") is None or (views["means"] is not None and kw.get("dmeans_out") is None):
            raise ValueError("dx_beta != 0 blends into existing outputs: pass dx_out= (and dmeans_out= with means)")
    return desc


def _divnorm_forward_call(c: Call) -> None:
    vx, vm, vy = c.views["x"], c.views["means"], c.views["out"]
    d = c.desc
    t1, v1, t2, v2 = _temps(c.launch, vx.shape, vx.dtype, c.description[1])
    b_ref = c.beta
    if b_ref._obj.value < 0:
        # cuDNN 9.19 ignores a negative beta here (y_beta=-1 gives y_alpha * result, measured on an H200;
        # positive betas blend as documented): scale out by y_beta first, then blend it in with beta 1
        lib.cudnnScaleTensor(c.launch.handle, d, vy.ptr, b_ref)
        b_ref = scaling_ref(vx.dtype, 1.0)
    lib.cudnnDivisiveNormalizationForward(
        c.launch.handle,
        c.resolved,
        lib.CUDNN_DIVNORM_PRECOMPUTED_MEANS,
        c.alpha,
        d,
        vx.ptr,
        vm.ptr if vm is not None else None,
        v1.ptr,
        v2.ptr,
        b_ref,
        d,
        vy.ptr,
    )


def _divnorm_backward_call(c: Call) -> None:
    vx, vdy, vm, vdx = c.views["x"], c.views["dy"], c.views["means"], c.views["dx_out"]
    vdm = c.views.get("dmeans_out")
    d = c.desc
    t1, v1, t2, v2 = _temps(c.launch, vx.shape, vx.dtype, c.description[1])
    lib.cudnnDivisiveNormalizationBackward(
        c.launch.handle,
        c.resolved,
        lib.CUDNN_DIVNORM_PRECOMPUTED_MEANS,
        c.alpha,
        d,
        vx.ptr,
        vm.ptr if vm is not None else None,
        vdy.ptr,
        v1.ptr,
        v2.ptr,
        c.beta,
        d,
        vdx.ptr,
        vdm.ptr if vdm is not None else None,
    )


DIVISIVE_NORMALIZATION_FORWARD = register(
    Primitive(
        "divisive_normalization_forward",
        inputs=(Operand("x", _DTYPES), Operand("means", like="x", optional=True)),
        outputs=(Output("out", like="x"),),
        resolve=_divnorm_resolve,
        describe=lambda resolved: _divnorm_describe,
        legacy=_divnorm_forward_call,
        layout_what="cuDNN's divisive normalization takes one layout for all its tensors",
        blend=True,
        blend_names=("y_alpha", "y_beta"),
        family="normalization",
        differentiable=("x", "means"),
        residuals=("x", "means"),
        backward="divisive_normalization_backward",
    )
)

DIVISIVE_NORMALIZATION_BACKWARD = register(
    Primitive(
        "divisive_normalization_backward",
        inputs=(Operand("dy", _DTYPES), Operand("x", like="dy"), Operand("means", like="dy", optional=True)),
        outputs=(
            Output("dx_out", like="x"),
            Output("dmeans_out", like="x", present=lambda views: views["means"] is not None),
        ),
        resolve=_divnorm_backward_resolve,
        describe=lambda resolved: _divnorm_describe,
        legacy=_divnorm_backward_call,
        layout_what="cuDNN's divisive normalization takes one layout for all its tensors",
        layout_order=("x", "dy", "means"),
        blend=True,
        blend_names=("dx_alpha", "dx_beta"),
        family="normalization",
    )
)


def divisive_normalization_forward(
    x: Any,
    means: Any = None,
    *,
    size: int = 5,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    k: float = 2.0,
    out: Any = None,
    y_alpha: float = 1.0,
    y_beta: float = 0.0,
    stream: Any = None,
    alpha: float = _UNSET,
    beta: float = _UNSET,
) -> Any:
    """Spatial divisive normalization of ``x`` ``(N, C, H, W)`` (3 to 5 dims; with precomputed ``means``, same
    shape, if given).

    ``cudnnDivisiveNormalizationForward`` with ``CUDNN_DIVNORM_PRECOMPUTED_MEANS`` (primitive
    :data:`DIVISIVE_NORMALIZATION_FORWARD`); ``means=None`` passes NULL. ``out = y_alpha * result + y_beta *
    out``; cuDNN 9.19 ignores a negative beta in this call (measured on an H200), so for ``y_beta < 0`` ``out``
    is first scaled by ``y_beta`` (``cudnnScaleTensor``) and then blended with beta 1. cuDNN describes ``x``,
    ``means``, its two scratch buffers and ``y`` with one layout (9.19 returns NOT_SUPPORTED otherwise), packed
    NCHW or NHWC here: ``x`` and ``means`` are copied when they have gaps, another layout or differ in layout,
    and an ``out`` of another layout is computed into a temporary and copied into (see the module docstring).
    The formula (identified on an H200, not in cuDNN's documentation) is in the module docstring.

    Args:
        x: a CUDA array ``(N, C, H, W)`` (3 to 5 dims); float16, float32 or float64.
        means: optional precomputed means, ``x``'s shape and dtype; None passes NULL.
        size: the window, an int in ``[1, 16]`` (``CUDNN_LRN_MIN_N``/``MAX_N``); odd sizes have an exact backward.
        lrn_alpha: the formula's alpha (cuDNN's ``lrnAlpha``), real, finite, within float32.
        lrn_beta: the formula's beta (cuDNN's ``lrnBeta``), at least 0.01.
        k: the formula's k (cuDNN's ``lrnK``), at least 1e-5.
        out: an array of ``x``'s shape and dtype to write ``y`` into; None allocates ``y``.
        y_alpha: scale of the result.
        y_beta: blend factor of ``out``'s previous contents (negative values handled as above).
        stream: the stream to run on; None: the library's current stream.
        alpha: deprecated name of ``lrn_alpha`` (a ``FutureWarning``; becomes the output blend in 0.3).
        beta: deprecated name of ``lrn_beta`` (likewise).

    Returns:
        ``y``, ``x``'s shape and dtype. cuDNN allocates nothing itself: its two temporary buffers come from ``x``'s
        library.

    Example:
        >>> y = ops.divisive_normalization_forward(x, size=5)
    """
    f = _formula("divisive_normalization_forward", lrn_alpha, lrn_beta, alpha, beta, "y_alpha/y_beta")
    kw = dict(size=size, k=k, out=out, y_alpha=y_alpha, y_beta=y_beta, **f)
    return run(DIVISIVE_NORMALIZATION_FORWARD, {"x": x, "means": means}, stream=stream, **kw)


def divisive_normalization_backward(
    dy: Any,
    x: Any,
    means: Any = None,
    *,
    size: int = 5,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    k: float = 2.0,
    out: tuple[Any, Any] | None = None,
    dx_alpha: float = 1.0,
    dx_beta: float = 0.0,
    stream: Any = None,
    alpha: float = _UNSET,
    beta: float = _UNSET,
    dx_out: Any = None,
    dmeans_out: Any = None,
) -> tuple[Any, Any]:
    """Gradients of :func:`divisive_normalization_forward`: ``(dx, dmeans)`` from one call.

    ``cudnnDivisiveNormalizationBackward`` (primitive :data:`DIVISIVE_NORMALIZATION_BACKWARD`). ``dmeans`` is
    ``None`` when ``means`` was not given (cuDNN is passed NULL and computes only ``dx``). ``x``, ``means``,
    ``dy``, ``dx`` and ``dmeans`` share one layout in cuDNN (copies and temporaries where they differ, as in the
    forward). For an even ``size`` cuDNN 9.19's backward sums over the forward's window rather than its mirror
    image, so ``dx`` is not the exact gradient there (measured on an H200; odd sizes are exact).

    Args:
        dy: the gradient of ``y``, ``x``'s shape and dtype.
        x: the forward's input.
        means: the forward's ``means`` (None if it had none).
        size: the window, an int in ``[1, 16]`` (``CUDNN_LRN_MIN_N``/``MAX_N``); odd sizes have an exact backward.
        lrn_alpha: the formula's alpha (cuDNN's ``lrnAlpha``), real, finite, within float32.
        lrn_beta: the formula's beta (cuDNN's ``lrnBeta``), at least 0.01.
        k: the formula's k (cuDNN's ``lrnK``), at least 1e-5.
        out: ``(dx_out, dmeans_out)``, each an array or None (allocate).
        dx_alpha: scale of the gradients.
        dx_beta: blend factor of the outputs' previous contents.
        stream: the stream to run on; None: the library's current stream.
        alpha: deprecated name of ``lrn_alpha`` (a ``FutureWarning``; becomes the output blend in 0.3).
        beta: deprecated name of ``lrn_beta`` (likewise).
        dx_out: deprecated form of ``out=(dx_out, None)``.
        dmeans_out: deprecated form of ``out=(None, dmeans_out)``.

    Returns:
        ``(dx, dmeans)``, each ``x``'s shape and dtype; ``dmeans`` is None without ``means``.

    Example:
        >>> dx, dmeans = ops.divisive_normalization_backward(dy, x, size=5)   # dmeans is None
    """
    dx_out, dmeans_out = split_out("divisive_normalization_backward", out, {"dx_out": dx_out, "dmeans_out": dmeans_out})
    f = _formula("divisive_normalization_backward", lrn_alpha, lrn_beta, alpha, beta, "dx_alpha/dx_beta")
    kw = dict(size=size, k=k, dx_out=dx_out, dmeans_out=dmeans_out, **f)
    return run(
        DIVISIVE_NORMALIZATION_BACKWARD,
        {"dy": dy, "x": x, "means": means},
        stream=stream,
        dx_alpha=dx_alpha,
        dx_beta=dx_beta,
        **kw,
    )


# ----------------------------------------------------------------- the L3 declarations


def _new_output(describe: Any, *specs: Spec | None) -> Spec:
    """The spec of the output a one-layout call (:func:`~cudnnkit.ops._layout.plan_layout`) allocates when no
    ``out=`` is given, from its inputs' specs (None: an absent optional input): the first input's layout when
    every input describes alike and it is dense, else the dense layout (an input's, in order, then C order) that
    needs the fewest input copies. An input cuDNN cannot address (expanded, overlapping) counts as the C-order
    copy :func:`~cudnnkit.runtime.prepare` makes of it."""
    first = specs[0]
    c_order = contiguous_strides(first.shape)
    if 0 in first.shape:
        return Spec(first.shape, c_order, first.dtype)
    present = [(s.shape, s.strides if describable(s.shape, s.strides) else c_order) for s in specs if s is not None]
    ds = [describe(*s) for s in present]
    if ds[0] is not None and all(d == ds[0] for d in ds) and is_dense(*present[0]):
        return Spec(first.shape, present[0][1], first.dtype)
    cands = [(st, d) for (sh, st), d in zip(present, ds) if d is not None and is_dense(sh, st)]
    cands.append((c_order, describe(first.shape, c_order)))
    best = min(cands, key=lambda c: sum(d != c[1] for d in ds))  # the first of the cheapest, as plan_layout
    return Spec(first.shape, best[0], first.dtype)


def _l3_lrn_forward(x: Any, *, size: int = 5, lrn_alpha: float = 1e-4, lrn_beta: float = 0.75, k: float = 2.0) -> Any:
    y = lrn_forward(x, size=size, lrn_alpha=lrn_alpha, lrn_beta=lrn_beta, k=k)
    return (y,), {"x": x, "out": y}


def _l3_lrn_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    return (lrn_backward(dy, res["out"], res["x"], **kw),)


def _l3_lrn_meta(x: Spec, *, size: int = 5, lrn_alpha: float = 1e-4, lrn_beta: float = 0.75, k: float = 2.0) -> Any:
    check_dtype(x, "x", _DTYPES, "normalization")
    if not 3 <= len(x.shape) <= 8:
        raise ValueError(f"x must have 3 to 8 dims (N, C, spatial...), got shape {x.shape}")
    _lrn_desc(size, lrn_alpha, lrn_beta, k, x.dtype)
    y = _new_output(_lrn_describe, x)
    return (y,), {"x": x, "out": y}


LRN = differentiable(
    Differentiable("lrn", "lrn_forward", ("x",), ("out",), _l3_lrn_forward, _l3_lrn_backward, _l3_lrn_meta,
                   batch=("x", "out"),
                   capture_safe=True,  # one cudnnLRNCrossChannelForward / Backward each way: device work only
                   doc="""cross-channel LRN of x (N, C, spatial...), 3 to 8 dims, float16/float32/float64, with the
module docstring's formula: y = x / (k + lrn_alpha / size * sum over a window of size channels of x^2) ** lrn_beta,
cuDNN's lrnN/lrnAlpha/lrnBeta/lrnK. That is torch.nn.functional.local_response_norm(x, size, alpha=lrn_alpha,
beta=lrn_beta, k=k) for an odd size (for an even one cuDNN's window is torch's mirrored: one channel more ahead than
behind). cudnnLRNCrossChannelForward (lrn_forward); the backward reads x and y (residuals x, out):
cudnnLRNCrossChannelBackward (lrn_backward).""")
)  # fmt: skip


def _check_odd(size: Any) -> None:
    if isinstance(size, int) and not isinstance(size, bool) and size % 2 == 0:
        raise ValueError(
            f"size={size}: the differentiable divisive normalization takes odd sizes only: for an even size cuDNN "
            "9.19's backward sums over the forward's window rather than its mirror image, so its dx is not the "
            "gradient (measured on an H200; divisive_normalization_backward still runs it)"
        )


def _l3_divnorm_forward(x: Any, means: Any = None, *, size: int = 5, lrn_alpha: float = 1e-4,
                        lrn_beta: float = 0.75, k: float = 2.0) -> Any:  # fmt: skip
    _check_odd(size)
    y = divisive_normalization_forward(x, means, size=size, lrn_alpha=lrn_alpha, lrn_beta=lrn_beta, k=k)
    return (y,), {"x": x, "means": means}


def _l3_divnorm_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    (dy,) = douts
    if dy is None or not any(needs):
        return (None, None)
    dx, dmeans = divisive_normalization_backward(dy, res["x"], res["means"], **kw)
    return (dx if needs[0] else None, dmeans if needs[1] else None)


def _l3_divnorm_meta(x: Spec, means: Spec | None = None, *, size: int = 5, lrn_alpha: float = 1e-4,
                     lrn_beta: float = 0.75, k: float = 2.0) -> Any:  # fmt: skip
    _check_odd(size)
    check_dtype(x, "x", _DTYPES, "normalization")
    if means is not None:
        if means.shape != x.shape:
            raise ValueError(f"means has shape {means.shape} but x has shape {x.shape}")
        if means.dtype != x.dtype:
            raise TypeError(f"means has dtype {means.dtype} but x has dtype {x.dtype}")
    if not 3 <= len(x.shape) <= 5:
        raise ValueError(f"x must have 3 to 5 dims (N, C, spatial...){_DIVNORM_DIMS}, got shape {x.shape}")
    _lrn_desc(size, lrn_alpha, lrn_beta, k, x.dtype)
    y = _new_output(_divnorm_describe, x, means)
    return (y,), {"x": x, "means": means}


DIVISIVE_NORMALIZATION = differentiable(
    Differentiable("divisive_normalization", "divisive_normalization_forward", ("x", "means"), ("out",),
                   _l3_divnorm_forward, _l3_divnorm_backward, _l3_divnorm_meta,
                   capture_safe=True,  # one cudnnDivisiveNormalizationForward / Backward: device work (temporaries)
                   doc="""cuDNN's spatial divisive normalization of x (N, C, H, W) (3 to 5 dims, float16/float32/
float64; the module docstring's formula) with optional precomputed means (x's shape and dtype, or None: NULL; how
cuDNN uses them is not documented, its dx and dmeans are their derivatives). size must be odd here (for an even one
cuDNN's backward is not the gradient). cudnnDivisiveNormalizationForward (PRECOMPUTED_MEANS;
divisive_normalization_forward); residuals x, means; the backward is one cudnnDivisiveNormalizationBackward
(divisive_normalization_backward) giving dx and, with means, dmeans.""")
)  # fmt: skip
