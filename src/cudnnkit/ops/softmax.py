"""Softmax and log-softmax, forward and backward (``cudnnSoftmaxForward``/``cudnnSoftmaxBackward``).

Any ``axis`` (negative included) or a tuple of adjacent axes is reduced over.
The array is described to cuDNN as a 4-d tensor ``(N, C, H, 1)`` where ``N``
merges the axes before the reduced ones, ``C`` the reduced axes and ``H`` the
axes after them, keeping the array's own strides (NCHW, NHWC and any other
dense layout whose groups of axes can be merged are passed without a copy):

* reduced axes trailing (``H == 1``): ``CUDNN_SOFTMAX_MODE_INSTANCE`` over ``(N, C, 1, 1)``;
* otherwise: ``CUDNN_SOFTMAX_MODE_CHANNEL`` over ``(N, C, H, 1)``.

Both modes are one cuDNN call. The choice was measured on an H200 (cuDNN
9.19, ``cudnnSoftmaxForward`` alone, same tensor described both ways): for a
trailing axis INSTANCE over ``(N, C, 1, 1)`` is far faster than CHANNEL on the
same shape for float32 4096x32000 (0.34 against 0.74 ms), within 3% of it for
524288x2048 and 65536x128, and equal in bfloat16; so trailing axes use
INSTANCE. A non-trailing axis has only the CHANNEL form without a copy.

One layout per call. cuDNN's softmax kernels assume that ``x`` and ``y``
(and, backward, ``y``, ``dy`` and ``dx``) have the same strides: given
two layouts, cuDNN 9.19 computes log-softmax of a gapped ``x`` into a dense
``y`` wrongly, softmax into an ``out`` transposed against ``x`` wrongly (both
silently), and refuses a backward whose ``y`` and ``dy`` differ with
``!isTensorSameStrides``. So every descriptor of a call is the same one
(:mod:`cudnnkit.ops._layout`):

* a dense ``x`` (any axis order) with the default ``out`` is passed as it is,
  and ``y`` is allocated in ``x``'s layout: no copy;
* an ``x`` with gaps (a strided slice), or whose axes do not merge around the
  reduced ones, is copied to C order first (``y`` is then C order): cuDNN's
  softmax is only ever given dense tensors;
* an ``out=`` in another layout than the inputs (transposed, channels-last
  against NCHW, a gapped slice of a bigger buffer) is computed into a new
  array in the inputs' layout (``out``'s contents copied into it first when
  ``beta != 0``) and then copied into ``out``, or, where that takes fewer
  copies (a dense ``out`` with ``beta != 0``), ``x`` is copied into ``out``'s
  layout instead; elements outside ``out``'s view are never touched;
* backward, ``dy`` is copied into ``y``'s layout when they differ (both to C
  order when ``y`` has gaps).

Every copy is logged on the ``cudnnkit`` logger at debug level, and so is
the mapping chosen.

``algo`` is ``"accurate"`` (max-subtracted, ``CUDNN_SOFTMAX_ACCURATE``) or
``"fast"`` (``CUDNN_SOFTMAX_FAST``, no max subtraction: can overflow);
``log=True`` selects ``CUDNN_SOFTMAX_LOG``. The backward pass takes the
forward output ``y`` and ``dy``, never ``x``: for softmax
``dx = y * (dy - sum(dy * y))``, for log-softmax ``dx = dy - exp(y) * sum(dy)``.

Dtypes: float16, bfloat16, float32, float64 (half types compute in float32).
``alpha``/``beta`` blend into ``out``: ``out = alpha * result + beta * out``;
``beta != 0`` needs ``out``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from .. import lib
from ..runtime import FLOATS, check_choice
from ..runtime.arrays import is_dense
from ..runtime.cache import lru
from ._diff import Differentiable, Spec, differentiable, new_like, spec_view
from ._layout import describable, merge
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["softmax_forward", "softmax_backward", "SOFTMAX_FORWARD", "SOFTMAX_BACKWARD"]

_log = logging.getLogger("cudnnkit")
_ALGOS = {"accurate": lib.CUDNN_SOFTMAX_ACCURATE, "fast": lib.CUDNN_SOFTMAX_FAST}


def _axes(axis: int | Sequence[int], ndim: int) -> tuple[int, int]:
    """First and last reduced axis (normalised), checking types, range and adjacency."""
    if isinstance(axis, int) and not isinstance(axis, bool):
        items = [axis]
    else:
        try:
            items = list(axis)  # type: ignore[arg-type]
        except TypeError:
            items = [axis]
    if any(isinstance(a, bool) or not isinstance(a, int) for a in items):
        raise TypeError(f"axis must be an int or a tuple of ints, got {axis!r}")
    if not items:
        raise ValueError("axis must name at least one axis")
    norm = []
    for a in items:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for an array with {ndim} dims")
        norm.append(a % ndim)
    norm.sort()
    if len(set(norm)) != len(norm) or norm[-1] - norm[0] != len(norm) - 1:
        raise ValueError(f"axis {axis!r} must name distinct adjacent axes")
    return norm[0], norm[-1]


def _as_4d(
    shape: tuple[int, ...], strides: tuple[int, ...], first: int, last: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ``(N, C, H, 1)`` shape and strides of an array reduced over axes ``first..last``, or None."""
    groups = (slice(0, first), slice(first, last + 1), slice(last + 1, len(shape)))
    merged = [merge(shape[g], strides[g]) for g in groups]
    if any(m is None for m in merged):
        return None
    (n, sn), (c, sc), (h, sh) = merged  # type: ignore[misc]
    # size-1 groups get a stride consistent with a dense layout (cuDNN checks them)
    if n == 1:
        sn = max(c * sc, h * sh, 1)
    return (n, c, h, 1), (sn, sc, sh, 1)


@lru("softmax.describe", 4096)
def _describe(shape: tuple[int, ...], strides: tuple[int, ...], first: int, last: int):
    """How cuDNN sees an array reduced over ``first..last``: its ``(N, C, H, 1)`` shape and strides, or None
    when its strides do not merge around the axes, or have gaps, or cannot be described at all (expanded,
    reversed, overlapping). Only dense layouts (any axis order) are handed to cuDNN's softmax: with gaps its LOG
    mode computed wrong values (issue 10 W1), and what it does with equal gapped strides is not relied on.
    Cached: a training loop calls softmax on the same layouts over and over."""
    if not describable(shape, strides) or not is_dense(shape, strides):
        return None
    return _as_4d(shape, strides, first, last)


def _mode(h: int) -> int:
    return lib.CUDNN_SOFTMAX_MODE_INSTANCE if h == 1 else lib.CUDNN_SOFTMAX_MODE_CHANNEL


def _algo(algo: str, log: bool) -> int:
    check_choice(algo, _ALGOS, "algo")
    if log:
        if algo == "fast":
            raise ValueError("log=True uses CUDNN_SOFTMAX_LOG; it cannot be combined with algo='fast'")
        return lib.CUDNN_SOFTMAX_LOG
    return _ALGOS[algo]


def _resolve(views: Any, kw: Any) -> tuple[int, int, int]:
    """``(first axis, last axis, cudnnSoftmaxAlgorithm_t)`` of one call, checked against the array's dims."""
    v = next(iter(views.values()))
    name = next(iter(views))
    a = _algo(kw.get("algo", "accurate"), kw.get("log", False))
    if v.ndim == 0:
        raise ValueError(f"{name} must have at least one dim")
    first, last = _axes(kw.get("axis", -1), v.ndim)
    return first, last, a


def _describer(resolved: tuple[int, int, int]):
    first, last, _ = resolved
    return lambda shape, strides: _describe(shape, strides, first, last)


def _forward_call(c: Call) -> None:
    first, last, a = c.resolved
    shape = c.description[0]
    _log.debug(
        "softmax_forward: axes %d..%d as %s, mode %s", first, last, shape, "INSTANCE" if shape[2] == 1 else "CHANNEL"
    )
    vx, vy, desc = c.views["x"], c.views["out"], c.desc
    lib.cudnnSoftmaxForward(c.launch.handle, a, _mode(shape[2]), c.alpha, desc, vx.ptr, c.beta, desc, vy.ptr)


def _backward_call(c: Call) -> None:
    a = c.resolved[2]
    vy, vdy, vdx, desc = c.views["y"], c.views["dy"], c.views["out"], c.desc
    lib.cudnnSoftmaxBackward(
        c.launch.handle, a, _mode(c.description[0][2]), c.alpha, desc, vy.ptr, desc, vdy.ptr, c.beta, desc, vdx.ptr
    )


SOFTMAX_FORWARD = register(
    Primitive(
        "softmax_forward",
        inputs=(Operand("x", FLOATS),),
        outputs=(Output("out", like="x"),),
        resolve=_resolve,
        describe=_describer,
        legacy=_forward_call,
        layout_what="cuDNN's softmax needs x and y in one layout",
        blend=True,
        family="softmax",
        differentiable=("x",),
        residuals=("out",),
        backward="softmax_backward",
    )
)

SOFTMAX_BACKWARD = register(
    Primitive(
        "softmax_backward",
        inputs=(Operand("dy", FLOATS), Operand("y", like="dy")),
        outputs=(Output("out", like="dy"),),
        resolve=_resolve,
        describe=_describer,
        legacy=_backward_call,
        layout_what="cuDNN's softmax backward needs y, dy and dx in one layout",
        layout_order=("y", "dy"),
        blend=True,
        family="softmax",
    )
)


def softmax_forward(
    x: Any,
    *,
    axis: int | Sequence[int] = -1,
    algo: str = "accurate",
    log: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Softmax (or log-softmax) of ``x`` over ``axis``; returns ``y`` (``out`` if given).

    ``x``: any shape, float16/bfloat16/float32/float64, any strides. ``y`` has
    ``x``'s shape and dtype (and its strides when ``x`` is dense). ``out`` may
    have any layout; cuDNN is given one layout for ``x`` and ``y`` (see the module
    docstring for the copies that takes). Calls ``cudnnSoftmaxForward`` once
    (primitive :data:`SOFTMAX_FORWARD`), in ``CUDNN_SOFTMAX_MODE_INSTANCE`` when the reduced axes are trailing and
    ``CUDNN_SOFTMAX_MODE_CHANNEL`` otherwise.

    Args:
        x: the input, a CUDA array (CuPy, torch, or any ``__cuda_array_interface__``/DLPack array) of at least one
            dim; float16, bfloat16, float32 or float64 (the half types compute in float32).
        axis: the axis to reduce over, negative allowed, or a tuple of adjacent axes (reduced together, as one).
        algo: ``"accurate"`` (``CUDNN_SOFTMAX_ACCURATE``: the maximum is subtracted first) or ``"fast"``
            (``CUDNN_SOFTMAX_FAST``: no subtraction, can overflow). With ``log=True`` only ``"accurate"``.
        log: compute log-softmax (``CUDNN_SOFTMAX_LOG``); cannot be combined with ``algo="fast"``.
        out: an array of ``x``'s shape and dtype to write, any layout; None allocates ``y`` with ``x``'s library.
        alpha: scale of the result, in the compute type.
        beta: blend factor of ``out``'s previous contents: ``out = alpha * softmax(x) + beta * out``
            (``beta != 0`` needs ``out``).
        stream: the stream to run on (a stream object of ``x``'s library, or anything with ``__cuda_stream__``);
            None: the library's current stream.

    Returns:
        ``y``, ``x``'s shape and dtype, in ``x``'s library (``out`` itself when given).

    Raises:
        TypeError: ``x`` is a host array or of another dtype, or ``axis`` is not an int or a tuple of ints.
        ValueError: ``axis`` is out of range or names axes that are not adjacent, or ``log=True`` with
            ``algo="fast"``.

    Example:
        >>> import cupy as cp
        >>> from cudnnkit import ops
        >>> x = cp.random.standard_normal((8, 1000), dtype=cp.float32)
        >>> y = ops.softmax_forward(x, axis=1)              # each row sums to 1
        >>> logp = ops.softmax_forward(x, axis=-1, log=True)
    """
    return run(SOFTMAX_FORWARD, {"x": x}, axis=axis, algo=algo, log=log, out=out, alpha=alpha, beta=beta, stream=stream)


def softmax_backward(
    dy: Any,
    y: Any,
    *,
    axis: int | Sequence[int] = -1,
    algo: str = "accurate",
    log: bool = False,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    stream: Any = None,
) -> Any:
    """Gradient of softmax (or log-softmax) from its output ``y`` and ``dy``; returns ``dx``.

    ``dy`` and ``y`` have the same shape and dtype, any strides; ``algo``/``log``/``axis``
    must be the forward's. cuDNN is given one layout for ``y``, ``dy`` and ``dx``
    (it refuses two with ``!isTensorSameStrides``), so an input or ``out`` in
    another layout is copied (logged). Calls ``cudnnSoftmaxBackward`` once; ``x`` is never needed
    (primitive :data:`SOFTMAX_BACKWARD`). For softmax ``dx = y * (dy - sum(dy * y))``, for log-softmax
    ``dx = dy - exp(y) * sum(dy)``, the sums over ``axis``.

    Args:
        dy: the gradient of ``y``, ``y``'s shape and dtype (float16, bfloat16, float32 or float64), any strides.
        y: the output of :func:`softmax_forward` (log-softmax's output with ``log=True``).
        axis: the forward's ``axis``.
        algo: the forward's ``algo``.
        log: the forward's ``log``.
        out: an array of ``y``'s shape and dtype to write ``dx`` into, any layout; None allocates it.
        alpha: scale of the gradient, in the compute type.
        beta: blend factor of ``out``'s previous contents: ``out = alpha * dx + beta * out``.
        stream: the stream to run on; None: the arrays' library's current stream.

    Returns:
        ``dx``, ``y``'s shape and dtype (``out`` itself when given).

    Raises:
        TypeError: a host array, or ``dy`` and ``y`` of different dtypes.
        ValueError: ``dy`` and ``y`` of different shapes, or a bad ``axis`` (as in :func:`softmax_forward`).

    Example:
        >>> y = ops.softmax_forward(x, axis=1, log=True)
        >>> dx = ops.softmax_backward(cp.ones_like(y), y, axis=1, log=True)
    """
    return run(
        SOFTMAX_BACKWARD,
        {"dy": dy, "y": y},
        axis=axis,
        algo=algo,
        log=log,
        out=out,
        alpha=alpha,
        beta=beta,
        stream=stream,
    )


# ----------------------------------------------------------------- the L3 declaration


def _l3_forward(x: Any, *, axis: int | Sequence[int] = -1, algo: str = "accurate", log: bool = False) -> Any:
    y = softmax_forward(x, axis=axis, algo=algo, log=log)
    return (y,), {"out": y}


def _l3_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    return (softmax_backward(dy, res["out"], **kw),)


def _l3_meta(x: Spec, *, axis: int | Sequence[int] = -1, algo: str = "accurate", log: bool = False) -> Any:
    # the forward's own checks (axis range and adjacency, algo, log), before any device work: a traced call
    # (torch.compile, jax.jit) refuses what the forward would
    _resolve({"x": spec_view(x)}, {"axis": axis, "algo": algo, "log": log})
    y = new_like(x)
    return (y,), {"out": y}


def _l3_batch_refuses(kw: Any, specs: Any) -> str | None:
    """A batch folds into axis 0 unless softmax reduces over it (the samples would mix)."""
    first, _ = _axes(kw.get("axis", -1), len(specs["x"].shape))
    return "the softmax reduces over axis 0" if first == 0 else None


SOFTMAX_L3 = differentiable(
    Differentiable("softmax", "softmax_forward", ("x",), ("out",), _l3_forward, _l3_backward, _l3_meta,
                   batch=("x", "out"), batch_refuses=_l3_batch_refuses,
                   capture_safe=True,  # one cudnnSoftmaxForward / cudnnSoftmaxBackward each way: device work only
                   doc="softmax (log=True: log-softmax) over axis; the backward reads y (softmax_backward)")
)  # fmt: skip
