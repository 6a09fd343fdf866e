"""One layout for every same-shape tensor of a legacy call, and the copies that bring them to it.

cuDNN's softmax, LRN, divisive normalization and dropout take a descriptor per tensor, but their kernels assume
that the tensors of one call have the same strides: cuDNN 9.19 computes log-softmax wrongly when ``x`` has gaps
and ``y`` is dense, and softmax wrongly when ``out`` is transposed against ``x`` (both silently; issue 10 W1 and
W2), refuses softmax backward with ``y`` and ``dy`` in different strides (``!isTensorSameStrides``), and
divisive normalization shares one descriptor between its input and its scratch buffers. So these ops never hand
cuDNN two layouts in one call: :func:`one_layout` picks the layout the call runs in and makes every copy it
needs, each logged at debug level on the ``cudnnkit`` logger.

* An op says how cuDNN sees an array with a ``describe(shape, strides)`` function: the (shape, strides) the
  descriptor is built from (a 4-d form for softmax and for LRN of more than 4 dims, the strides with size-1 dims
  made canonical for the others), or ``None`` where cuDNN cannot take those strides, or is not relied on to
  (softmax: arrays with gaps; divisive normalization: layouts other than NCHW and NHWC). Two arrays are in the
  same layout when their descriptions are equal.
* When every array of the call already describes the same way and every output is given, nothing is copied
  (the usual case: a dense ``x`` with the default ``out`` also costs no copy, since a new output is allocated in
  ``x``'s own layout).
* Otherwise the layout with the fewest copies is chosen among the dense layouts of the arrays (inputs first,
  then outputs) and C order (an input in another layout costs one copy, an ``out=`` one, two with a blend);
  dropout's backward is told its forward's layout instead. An input in another layout is copied into it, an
  ``out=`` in another layout
  (transposed, channels-last against an NCHW ``x``, a gapped slice of a bigger buffer) is computed into a new
  array in the chosen layout, into which ``out``'s contents are copied first when ``beta != 0``, and copied
  into ``out`` by :meth:`OneLayout.finish` after the cuDNN call. Elements of a buffer outside ``out``'s view
  are never touched.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..runtime.arrays import ArrayView, contiguous_strides, is_contiguous, is_dense, layout_problem
from ..runtime.cache import lru
from ..runtime.descriptors import INT_MAX, fits_int
from ..runtime.view import shape_memo

__all__ = [
    "one_layout",
    "plan_layout",
    "OneLayout",
    "canonical_strides",
    "channels_last_strides",
    "copy_in",
    "merge",
    "describable",
    "check_fits",
    "fits",
]

_log = logging.getLogger("cudnnkit")

Description = tuple[tuple[int, ...], tuple[int, ...]]


@shape_memo
def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides (elements) of a dense channels-last array of logical shape ``(N, C, *spatial)``: C order of
    ``(N, *spatial, C)``, as strides of ``shape`` (remembered per shape tuple)."""
    perm = (shape[0], *shape[2:], shape[1])
    cs = contiguous_strides(perm)
    return (cs[0], cs[-1], *cs[1:-1])


def is_channels_last(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether an array of ``shape`` with ``strides`` is dense channels-last (NHWC, NDHWC), size-1 dims aside."""
    return all(d == 1 or s == w for d, s, w in zip(shape, strides, channels_last_strides(shape)))


def channels_last_view(v: ArrayView) -> ArrayView | None:
    """``v`` described with dense channels-last strides when it is channels-last up to its size-1 dims (the same
    memory: a C = 1 or 1x1 array is both layouts, and libraries give it C-order strides), else None."""
    cl = channels_last_strides(v.shape)
    if v.strides == cl:
        return v
    if is_channels_last(v.shape, v.strides):
        return dataclasses.replace(v, strides=cl)
    return None


def c_order_view(v: ArrayView) -> ArrayView | None:
    """``v`` described with C-order strides when it is C-contiguous up to its size-1 dims (a C = 1 array given
    channels-last strides is the same memory), else None: :func:`channels_last_view`'s other half."""
    co = contiguous_strides(v.shape)
    if v.strides == co:
        return v
    if is_contiguous(v.shape, v.strides):
        return dataclasses.replace(v, strides=co)
    return None


def describable(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when cuDNN can address these strides at all: no zero, negative or self-overlapping strides."""
    return layout_problem(shape, strides) is None


def canonical_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """``strides`` as given to a descriptor: a size-1 dim's stride (which addresses nothing, and which libraries
    set to anything) becomes what C order would give it there, the next dim's stride times its size (1 for the
    last dim), so two arrays in one layout describe alike and a C-contiguous array gets C order's own strides."""
    out = list(strides)
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == 1:
            out[i] = out[i + 1] * shape[i + 1] if i + 1 < len(shape) else 1
    return tuple(out)


def check_fits(name: str, dims: Sequence[int], strides: Sequence[int], shape: Sequence[int] | None = None) -> None:
    """``ValueError`` naming the array (of ``shape``, default ``dims``) when a dim or stride of the descriptor it
    would get (``dims``, ``strides``) exceeds cuDNN's int (``2**31 - 1``), what ``cudnnSetTensorNdDescriptor``
    takes."""
    if not fits(tuple(dims), tuple(strides)):
        raise ValueError(
            f"{name} (shape {tuple(dims if shape is None else shape)}) is too large for cuDNN's tensor descriptors: "
            f"as cuDNN is given it, its dims {tuple(dims)} and strides {tuple(strides)} must each be at most "
            f"{INT_MAX} (2**31 - 1), and so must the number of elements they span"
        )


def merge(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, int] | None:
    """(size, stride) of a group of axes seen as one, or None if their strides do not allow it."""
    dims = [(d, s) for d, s in zip(shape, strides) if d != 1]
    if not dims:
        return 1, 1
    size, stride = dims[-1]
    for d, s in reversed(dims[:-1]):
        if s != stride * size:
            return None
        size *= d
    return size, stride


@dataclass
class OneLayout:
    """The layout :func:`plan_layout` chose for one call; :meth:`apply` makes the copies, :meth:`finish` the
    write-backs. Between :func:`plan_layout` and :meth:`apply` nothing has touched the device."""

    #: the (shape, strides) every descriptor of the call is built from
    description: Description
    #: (array, view) per input, in the call's layout (copies where needed); filled by :meth:`apply`
    inputs: list[tuple[Any, ArrayView | None]] = field(default_factory=list)
    #: (array, view) per output, in the call's layout: the given ``out``, a new array, or a temporary
    outputs: list[tuple[Any, ArrayView | None]] = field(default_factory=list)
    #: what the op returns per output: the given ``out`` or the new array
    results: list[Any] = field(default_factory=list)
    _plan: tuple = ()
    _writeback: list[tuple[Any, Any, str]] = field(default_factory=list)
    _launch: Any = None

    def apply(self) -> OneLayout:
        """Copy the inputs that need it and allocate the outputs and temporaries, all on the launch stream."""
        launch, inputs, outputs, d_in, d_out, alloc, shape, dtype, what = self._plan
        if any(v is not None and d != self.description for (_, _, v), d in zip(inputs, d_in)) or any(
            v is not None and d != self.description for (_, _, v, _), d in zip(outputs, d_out)
        ):
            layout = alloc if alloc is not None else contiguous_strides(shape)
            why = _why(layout, what)
        for (name, arr, v), d in zip(inputs, d_in):
            if v is None or d == self.description:
                self.inputs.append((arr, v))
            else:
                self.inputs.append(copy_in(launch, arr, v, alloc, name, why))
        for (name, out, v, beta), d in zip(outputs, d_out):
            if v is None:
                arr, nv = launch.empty(shape, dtype, alloc, name=name)
                self.outputs.append((arr, nv))
                self.results.append(arr)
                continue
            self.results.append(out)
            if d == self.description:
                self.outputs.append((out, v))
                continue
            _log.debug(
                "%s %s (shape %s, strides %s): computing into a temporary of strides %s, then copying it into %s",
                name,
                why,
                v.shape,
                v.strides,
                layout,
                name,
            )
            tmp, tv = launch.empty(shape, dtype, alloc, name=name)
            if beta != 0:
                launch.copy(tmp, out, name)  # beta blends into out's contents
            self.outputs.append((tmp, tv))
            self._writeback.append((out, tmp, name))
        return self

    def finish(self) -> None:
        """Copy each temporary into the ``out=`` it stands for (queued on the launch stream, after the call)."""
        for dst, src, name in self._writeback:
            self._launch.copy(dst, src, name)
        self._writeback = []


def _why(layout: tuple[int, ...], what: str) -> str:
    return f"must be laid out as {layout} for cuDNN ({what})"


@lru("ops._layout.dense", 4096)
def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    return is_dense(shape, strides)


@lru("ops._layout.fits", 4096)
def fits(dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """:func:`~cudnnkit.runtime.descriptors.fits_int` of hashable ``dims``/``strides``, cached."""
    return fits_int(dims, strides)


def copy_in(launch: Any, arr: Any, v: ArrayView, strides: tuple[int, ...] | None, name: str, why: str):
    """``arr`` (viewed as ``v``) copied into a new array of the given strides (None: C order), on the launch
    stream (logged). ``v``'s own array is the source when it has one: :func:`~cudnnkit.runtime.prepare` may
    already have replaced an expanded or overlapping input by a copy."""
    if v.adapter is not None:
        arr = v.owner
    if strides is None or is_contiguous(v.shape, strides):
        return launch.contiguous(arr, v, name, why)
    _log.debug("%s %s (shape %s, strides %s): copying", name, why, v.shape, v.strides)
    new, nv = launch.empty(v.shape, v.dtype, strides, name=name)
    launch.copy(new, arr, name)
    return new, nv


def plan_layout(
    launch: Any,
    inputs: Sequence[tuple[str, Any, ArrayView | None]],
    outputs: Sequence[tuple[str, Any, ArrayView | None, float]],
    describe: Callable[[tuple[int, ...], tuple[int, ...]], Description | None],
    *,
    shape: tuple[int, ...],
    dtype: str,
    what: str,
    strides: tuple[int, ...] | None = None,
) -> OneLayout:
    """Choose the one layout for the ``inputs`` (``(name, array, view)``, view None for an absent optional input)
    and the ``outputs`` (``(name, out, view, beta)``, out and view None for "allocate it") of one call, all of
    ``shape`` and ``dtype`` (see the module docstring), and check that every copy it needs can be made
    (``ValueError`` naming the array otherwise), without touching the device. ``what`` says why, in the log and in
    errors ("cuDNN's softmax needs x and y in one layout"). ``strides`` forces the layout (dropout's backward runs
    in its forward's)."""
    views_in = [v for _, _, v in inputs]
    views_out = [v for _, _, v, _ in outputs]
    d_in = [None if v is None else describe(v.shape, v.strides) for v in views_in]
    d_out = [None if v is None else describe(v.shape, v.strides) for v in views_out]
    present = [d for d, v in zip(d_in + d_out, views_in + views_out) if v is not None]

    target: Description | None = None
    alloc: tuple[int, ...] | None = None
    if strides is not None:
        alloc, target = strides, describe(shape, strides)
        if target is None:
            raise AssertionError(f"forced strides {strides} cannot be described")
    elif present and present[0] is not None and all(d == present[0] for d in present):
        # one layout already; a new output is allocated in it when it is dense (or every output is given)
        first = next(v for v in views_in + views_out if v is not None)
        if all(v is not None for v in views_out) or _dense(first.shape, first.strides):
            target, alloc = present[0], first.strides
    if target is None:
        candidates: list[tuple[tuple[int, ...] | None, Description]] = []
        for v, d in zip(views_in + views_out, d_in + d_out):
            if v is not None and d is not None and _dense(v.shape, v.strides):
                candidates.append((v.strides, d))
        c_desc = describe(shape, contiguous_strides(shape))
        if c_desc is None:
            raise AssertionError(f"C order of {shape} cannot be described")
        candidates.append((None, c_desc))
        best = None
        for s, d in candidates:
            cost = sum(1 for dv, v in zip(d_in, views_in) if v is not None and dv != d)
            cost += sum(
                (2 if b != 0 else 1)
                for dv, v, (_, _, _, b) in zip(d_out, views_out, outputs)
                if v is not None and dv != d
            )
            if best is None or cost < best[0]:
                best = (cost, s, d)
        _, alloc, target = best  # type: ignore[misc]

    if not fits(*target):
        check_fits(next((n for (n, _, v) in inputs if v is not None), outputs[0][0]), *target, shape=shape)
    # every array that needs a copy or a temporary is checked before anything is copied: copies need a library
    # with an adapter among the call's arrays (it allocates them; arrays of other libraries are viewed as its own)
    if launch.adapter is None:
        layout = alloc if alloc is not None else contiguous_strides(shape)
        why = _why(layout, what)
        for (name, _, v), d in zip(inputs, d_in):
            if v is not None and d != target:
                raise ValueError(
                    f"{name} {why} (shape {v.shape}, strides {v.strides}) and cudnnkit cannot copy it: the call's "
                    f"arrays come from a library with no cudnnkit adapter; pass {name} laid out like the others"
                )
        for (name, _, v, _), d in zip(outputs, d_out):
            if v is not None and d != target:
                raise ValueError(
                    f"{name} must be laid out like the inputs as cuDNN sees them (strides {layout}), got strides "
                    f"{v.strides}, and cudnnkit cannot compute into a temporary: the call's arrays come from a "
                    f"library with no cudnnkit adapter ({what})"
                )
    return OneLayout(
        target,
        _plan=(launch, inputs, outputs, d_in, d_out, alloc, shape, dtype, what),
        _launch=launch,
    )


def one_layout(*args: Any, **kwargs: Any) -> OneLayout:
    """:func:`plan_layout` and :meth:`OneLayout.apply` in one: the layout chosen, its copies made."""
    return plan_layout(*args, **kwargs).apply()
