"""CTC loss, costs and gradients from one call (``cudnnCTCLoss_v8``).

``costs, grads = ctc_loss(x, labels, label_lengths, input_lengths)``

Shapes and dtypes
    ``x``: ``(T, N, A)`` float32 (time, batch, alphabet incl. the blank), on
    the device. Any strides are accepted; a non-C-contiguous ``x`` is copied
    first (logged at debug level), since cuDNN's CTC is only relied on here for
    packed ``(T, N, A)`` data. ``costs``: ``(N,)`` float32, the negative log
    likelihood of each sample. ``grads``: ``(T, N, A)`` float32, C-contiguous.
    cuDNN's CTC loss is float32 only (``CUDNN_STATUS_NOT_SUPPORTED`` for any
    other compute or data type): other dtypes raise ``TypeError``.

Labels and lengths
    ``labels``: 1-d, the label sequences of all samples concatenated (packed),
    ``sum(label_lengths)`` values, each in ``[1, A)``; or 2-d ``(N, S)``, padded
    (torch's ``ctc_loss`` takes both forms): row ``n``'s first
    ``label_lengths[n] <= S`` values are its label, the rest are ignored (packed
    on the host, after the values are read; a fixed shape, so that a traced
    JAX call can give it). ``label_lengths`` and
    ``input_lengths``: 1-d, ``N`` values each. Each of the three may be a host
    sequence or NumPy array (any integer dtype; copied to the device, in one
    int32 buffer, by the library of ``x``), or a device array. A device array
    of int32, contiguous, is handed to cuDNN as is; a device array of another
    integer dtype is read back and converted like a host one. cuDNN takes all
    three as int32 device arrays, but cudnnkit also needs their values on the
    host to validate them, so a device array is
    copied to the host with its library's ``to_numpy``: that synchronizes with
    the device. Pass host arrays to avoid the synchronization.

Conventions (cuDNN 9, ``cudnn_adv.h`` and the cuDNN API reference)
    * The blank is label 0; cuDNN has no blank parameter. ``blank`` other than
      0 raises ``ValueError`` (move the blank class to index 0 of the alphabet axis).
    * ``normalization="softmax"`` (``CUDNN_LOSS_NORMALIZATION_SOFTMAX``,
      the default): ``x`` holds unnormalized activations (logits; log-softmax
      output works too, since softmax is invariant to a per-row shift); cuDNN
      applies the softmax over ``A`` itself and ``grads`` is the gradient of
      each ``costs[n]`` with respect to ``x``: ``softmax(x) - gamma`` for
      ``t < input_lengths[n]``, where ``gamma[t, n, k]`` is the posterior
      occupancy of class ``k`` at ``t`` (sum over the CTC states labelled
      ``k`` of ``alpha * beta / p(labels | x)``).
    * ``normalization="none"`` (``CUDNN_LOSS_NORMALIZATION_NONE``): ``x``
      holds probabilities (each ``x[t, n, :]`` already softmax-normalised).
      cuDNN's own documentation calls this mode's gradient inconsistent, and
      it is: measured on an H200 with cuDNN 9.19, ``grads[t, n, k]`` is
      ``-gamma / x`` (the gradient with respect to ``x``) where class ``k``
      has occupancy at step ``t``, and ``x`` itself where it has none (for
      example classes outside the sample's label). Use the softmax mode for
      training; this one is passed through as cuDNN computes it.
    * ``algo``: ``"deterministic"`` (``CUDNN_CTC_LOSS_ALGO_DETERMINISTIC``,
      bitwise-repeatable) or ``"non_deterministic"``
      (``CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC``). Under
      ``cudnnkit.settings(deterministic=True)`` only the deterministic one is allowed.
    * Limits checked before any GPU work, each with a ``ValueError`` naming the
      argument: label lengths at most 255 (cuDNN refuses 256 and more), labels
      in ``[1, A)``, ``1 <= input_lengths[n] <= T``, ``label_lengths[n] <=
      input_lengths[n]`` (cuDNN reads out of bounds otherwise), and
      ``sum(label_lengths) == len(labels)``.
    * Repeated consecutive labels need a blank between them, so sample ``n``
      needs ``label_lengths[n] + repeats[n]`` time steps, ``repeats[n]`` being
      the number of ``i`` with ``labels[i] == labels[i - 1]`` inside its label.
      A sample with ``label_lengths[n] <= input_lengths[n] < label_lengths[n] +
      repeats[n]`` is not an error: no alignment exists and its cost is
      ``+inf`` (cuDNN itself reports 0 there; cudnnkit writes ``inf``, as
      torch's ``ctc_loss`` gives). cuDNN calls such a sample out of bounds (OOB):
      ``oob_grads="zero"`` (``CUDNN_CTC_ZERO_OOB_GRADIENTS``, the default)
      sets its gradient to zero, ``oob_grads="skip"``
      (``CUDNN_CTC_SKIP_OOB_GRADIENTS``) leaves that sample's part of
      ``grads`` as it was (only meaningful with ``grads_out=``).
    * Time steps ``t >= input_lengths[n]`` do not enter ``costs[n]``; their
      gradient is zero (cuDNN does not write them: cudnnkit zeroes them).
    * Every sample needs at least one label: for an empty label cuDNN 9.19
      returns a cost of 0 rather than ``-log p(all blanks)``, so
      ``label_lengths[n] == 0`` is refused.
    * No reduction: ``costs`` is per sample. A sum or mean over the batch (and
      the matching scaling of ``grads``) belongs to the caller or the
      framework integrations.

cuDNN calls: ``cudnnSetCTCLossDescriptor_v9`` (float32, normMode, ctcGradMode,
maxLabelLength = 255, :data:`MAX_LABEL_LENGTH`; value-cached),
``cudnnGetCTCLossWorkspaceSize_v8``, ``cudnnCTCLoss_v8``. The workspace comes
from the library of ``x`` on the launch stream.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, NamedTuple

import numpy as np

from .. import lib
from ..runtime import (
    DescriptorKind,
    check_choice,
    current_settings,
    get_cached,
    scaling_ref,
    tensor_descriptor,
)
from ..runtime.arrays import ArrayView, contiguous_strides
from ._diff import Differentiable, Spec, differentiable
from ._layout import check_fits
from ._primitive import Call, Operand, Output, Primitive, register, run, split_out
from .arith import op_tensor

__all__ = ["ctc_loss", "MAX_LABEL_LENGTH"]

_log = logging.getLogger("cudnnkit")

#: Longest label cuDNN's CTC loss accepts.
MAX_LABEL_LENGTH = 255

_INT_P = ctypes.POINTER(ctypes.c_int)
_NORMS = {"softmax": lib.CUDNN_LOSS_NORMALIZATION_SOFTMAX, "none": lib.CUDNN_LOSS_NORMALIZATION_NONE}
_ALGOS = {
    "deterministic": lib.CUDNN_CTC_LOSS_ALGO_DETERMINISTIC,
    "non_deterministic": lib.CUDNN_CTC_LOSS_ALGO_NON_DETERMINISTIC,
}
_OOB = {"zero": lib.CUDNN_CTC_ZERO_OOB_GRADIENTS, "skip": lib.CUDNN_CTC_SKIP_OOB_GRADIENTS}


def _set_ctc(ptr: int, dtype: str, norm: int, grad_mode: int, max_label_length: int) -> None:
    lib.cudnnSetCTCLossDescriptor_v9(ptr, lib.CUDNN_DATA_FLOAT, norm, grad_mode, max_label_length)


#: ``cudnnCTCLossDescriptor_t`` keyed by ("float32", normMode, ctcGradMode, maxLabelLength).
CTC_LOSS = DescriptorKind("ctc_loss", "cudnnCreateCTCLossDescriptor", "cudnnDestroyCTCLossDescriptor", _set_ctc)


def ctc_descriptor(normalization: str = "softmax", oob_grads: str = "zero", max_label_length: int = 1) -> Any:
    """The cached CTC loss descriptor (``cudnnSetCTCLossDescriptor_v9``, float32 compute)."""
    return get_cached(CTC_LOSS, ("float32", int(_NORMS[normalization]), int(_OOB[oob_grads]), int(max_label_length)))


def _host_ints(obj: Any, name: str, ndims: tuple[int, ...] = (1,)) -> np.ndarray:
    """A host sequence/array as an int64 NumPy array of ``ndims`` dims (1-d; labels may be 2-d), checked."""
    try:
        a = np.asarray(obj)
    except Exception as e:
        raise TypeError(f"{name} must be a 1-d integer sequence or array, got {type(obj).__name__}") from e
    if a.dtype.kind == "f" and a.size == 0:
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim not in ndims:
        raise ValueError(f"{name} must be {' or '.join(f'{n}-d' for n in ndims)}, got shape {a.shape}")
    return a.astype(np.int64, copy=False)


class _Index:
    """One of labels / label_lengths / input_lengths: its host values and, if usable as is, its device pointer."""

    __slots__ = ("name", "values", "ptr", "owner")

    def __init__(self, name: str, values: np.ndarray, ptr: int | None = None, owner: Any = None):
        self.name, self.values, self.ptr, self.owner = name, values, ptr, owner


def _read_index(obj: Any, v: ArrayView | None, name: str) -> _Index:
    ndims = (1, 2) if name == "labels" else (1,)  # labels may be (N, S), padded
    if v is None:
        return _Index(name, _host_ints(obj, name, ndims))
    if v.dtype not in ("int32", "int64", "int8", "uint8"):
        raise TypeError(f"{name} is a device array of dtype {v.dtype}; it must hold integers (int32 is used as is)")
    if v.ndim not in ndims:
        raise ValueError(f"{name} must be {' or '.join(f'{n}-d' for n in ndims)}, got shape {v.shape}")
    if v.adapter is None:
        raise TypeError(
            f"{name} is a device array of a library without a cudnnkit adapter, so cudnnkit cannot read it to check "
            f"it; pass {name} as a host array (NumPy or a list) instead"
        )
    values = np.asarray(v.adapter.to_numpy(obj)).astype(np.int64, copy=False)  # synchronizes
    if v.ndim == 1 and v.dtype == "int32" and (v.shape[0] <= 1 or v.strides[0] == 1) and v.ptr:
        return _Index(name, values, v.ptr, obj)
    return _Index(name, values)  # uploaded as int32 with the host ones


def _unpad(labels: np.ndarray, label_lengths: np.ndarray, N: int) -> np.ndarray:
    """2-d padded labels ``(N, S)`` as the packed 1-d form: row ``n``'s first ``label_lengths[n]`` values, checked
    (``ValueError`` naming the row that is too short or the batch that does not match)."""
    if labels.shape[0] != N:
        raise ValueError(f"labels has {labels.shape[0]} rows (2-d: one padded label per sample) but x has a batch "
                         f"of N={N}")  # fmt: skip
    S = labels.shape[1]
    if label_lengths.shape[0] != N or N == 0:
        return labels.reshape(-1)[:0]  # an empty batch; or label_lengths of another batch, which _validate refuses
    bad = np.flatnonzero((label_lengths < 0) | (label_lengths > S))
    if bad.size:
        i = bad[0]
        raise ValueError(f"label_lengths[{i}] is {label_lengths[i]} but labels (2-d, padded) has rows of S={S}")
    keep = np.arange(S)[None, :] < label_lengths[:, None]
    return labels[keep]  # row-major: row n's first label_lengths[n] values, in order


def _repeats(labels: np.ndarray, label_lengths: np.ndarray) -> np.ndarray:
    """Per sample, the number of labels equal to the one before them (each needs an extra blank step)."""
    if labels.size < 2:
        return np.zeros(label_lengths.shape, np.int64)
    cum = np.concatenate(([0], np.cumsum(labels[1:] == labels[:-1])))  # cum[k]: equal pairs (i-1, i) with i <= k
    ends = np.cumsum(label_lengths)
    starts = ends - label_lengths
    last = np.clip(ends - 1, 0, labels.size - 1)
    return np.where(label_lengths > 1, cum[last] - cum[np.clip(starts, 0, labels.size - 1)], 0)


def _validate(labels: np.ndarray, label_lengths: np.ndarray, input_lengths: np.ndarray, T: int, N: int, A: int) -> None:
    for name, a in (("label_lengths", label_lengths), ("input_lengths", input_lengths)):
        if a.shape[0] != N:
            raise ValueError(f"{name} has {a.shape[0]} values but x has a batch of N={N}")
    if N == 0:
        if labels.size:
            raise ValueError(f"labels has {labels.size} values but the batch is empty")
        return
    bad = np.flatnonzero(label_lengths < 1)
    if bad.size:
        raise ValueError(
            f"label_lengths[{bad[0]}] is {label_lengths[bad[0]]}; cuDNN's CTC loss needs at least one "
            "label per sample (for an empty label it returns a cost of 0, not -log p(all blanks))"
        )
    bad = np.flatnonzero(label_lengths > MAX_LABEL_LENGTH)
    if bad.size:
        raise ValueError(
            f"label_lengths[{bad[0]}] is {label_lengths[bad[0]]}; cuDNN's CTC loss supports labels of at "
            f"most {MAX_LABEL_LENGTH}"
        )
    bad = np.flatnonzero((input_lengths < 1) | (input_lengths > T))
    if bad.size:
        raise ValueError(f"input_lengths[{bad[0]}] is {input_lengths[bad[0]]}; input lengths must be in [1, T={T}]")
    bad = np.flatnonzero(label_lengths > input_lengths)
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"label_lengths[{i}] is {label_lengths[i]} but input_lengths[{i}] is {input_lengths[i]}; a "
            "label cannot be longer than its input (cuDNN reads out of bounds)"
        )
    total = int(label_lengths.sum())
    if total != labels.shape[0]:
        raise ValueError(
            f"labels has {labels.shape[0]} values but sum(label_lengths) is {total}; labels must be the "
            "label sequences of all samples concatenated"
        )
    bad = np.flatnonzero((labels < 1) | (labels >= A))
    if bad.size:
        i = bad[0]
        what = "0, the blank" if labels[i] == 0 else str(labels[i])
        raise ValueError(f"labels[{i}] is {what}; labels must be in [1, A={A}) (label 0 is cuDNN's blank)")


class _Ctc(NamedTuple):
    T: int
    N: int
    A: int
    norm: str
    algo: str
    oob: str
    labels: _Index
    label_lengths: _Index
    input_lengths: _Index
    short: np.ndarray  # samples with no possible alignment
    grads_given: bool


def _check_x_and_options(shape: tuple[int, ...], dtype: str, kw: Any) -> tuple[int, int, int, str, str, str]:
    """``(T, N, A, normalization, algo, oob_grads)`` from ``x``'s shape and dtype and the keywords, checked: what
    needs no label or length (shared by the primitive and the L3 declaration's meta)."""
    if dtype != "float32":
        raise TypeError(f"x has dtype {dtype}; cuDNN's CTC loss supports float32 only")
    if len(shape) != 3:
        raise ValueError(f"x must have 3 dims (T, N, A), got shape {shape}")
    T, N, A = shape
    check_fits("x", shape, contiguous_strides(shape))  # cuDNN is given x C-contiguous (copied if not)
    blank = kw["blank"]
    if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)):
        raise TypeError(f"blank must be an int, got {blank!r}")
    if blank != 0:
        raise ValueError(
            f"blank={blank}: cuDNN's CTC loss always uses label 0 as the blank; move the blank class to "
            "index 0 of x's last axis and pass blank=0"
        )
    norm = check_choice(kw["normalization"], _NORMS, "normalization")
    algo = check_choice(kw["algo"], _ALGOS, "algo")
    oob = check_choice(kw["oob_grads"], _OOB, "oob_grads")
    if algo == "non_deterministic" and current_settings().deterministic:
        raise ValueError("algo='non_deterministic' is not allowed under cudnnkit.settings(deterministic=True)")
    if N and (T == 0 or A == 0):
        raise ValueError(f"x has shape {shape}; CTC needs at least one time step and one class")
    return T, N, A, norm, algo, oob


def _ctc_resolve(views: Any, kw: Any) -> _Ctc:
    vx = views["x"]
    T, N, A, norm, algo, oob = _check_x_and_options(vx.shape, vx.dtype, kw)
    idx = []
    for n in ("labels", "label_lengths", "input_lengths"):
        v = views[n]  # a view of a device array, or the caller's host data
        idx.append(_read_index(v.owner, v, n) if isinstance(v, ArrayView) else _read_index(v, None, n))
    lab, ll, il = idx
    if lab.values.ndim == 2:  # padded (N, S): packed here, uploaded with the host values
        lab = _Index("labels", _unpad(lab.values, ll.values, N))
    _validate(lab.values, ll.values, il.values, T, N, A)
    short = np.empty(0, np.int64)
    if N:
        short = np.flatnonzero(ll.values + _repeats(lab.values, ll.values) > il.values)
        if short.size:
            _log.debug(
                "ctc_loss: samples %s have fewer input steps than label length + repeats: infinite cost, "
                "gradient per oob_grads=%r",
                short.tolist(),
                oob,
            )
    return _Ctc(T, N, A, norm, algo, oob, lab, ll, il, short, kw.get("grads_out") is not None)


def _ctc_call(c: Call) -> None:
    r: _Ctc = c.resolved
    T, N, A = r.T, r.N, r.A
    vx, vc, vg, launch = c.views["x"], c.views["costs_out"], c.views["grads_out"], c.launch
    # host-side values go to the device in one int32 buffer: [label_lengths, input_lengths, labels]
    pending = [i for i in (r.label_lengths, r.input_lengths, r.labels) if i.ptr is None]
    keep = None
    if pending:
        if launch.adapter is None:
            raise TypeError(
                "x comes from a library without a cudnnkit adapter, so host labels and lengths cannot be "
                "copied to the device; pass them as int32 CuPy or torch device arrays, or pass x as a CuPy "
                "array or torch tensor"
            )
        parts = [i.values for i in pending]
        keep, base = launch.upload(np.concatenate(parts).astype(np.int32), "labels")
        off = 0
        for i, part in zip(pending, parts):
            i.ptr = base + 4 * off
            off += part.shape[0]

    # maxLabelLength is always the limit, never the batch's longest label: measured under compute-sanitizer on an
    # H200 (cuDNN 9.19, T=20, N=3, A=6, labels 3/2/1), compute_alphas_and_betas_v8 writes past its shared memory
    # with maxLabelLength=3 (70 errors, then the launch fails) and is clean with T or 255 (what torch passes).
    ctc = ctc_descriptor(r.norm, r.oob, MAX_LABEL_LENGTH)
    desc = tensor_descriptor("float32", (T, N, A), contiguous_strides((T, N, A)), min_dims=3)
    il = r.input_lengths.values
    handle = launch.handle
    size = ctypes.c_size_t()
    lib.cudnnGetCTCLossWorkspaceSize_v8(handle, _ALGOS[r.algo], ctc, desc, desc, ctypes.byref(size))
    ws, ws_ptr = launch.workspace(size.value)
    padded = np.flatnonzero(il < T)
    if not r.grads_given or (padded.size and r.oob == "zero"):
        # cuDNN leaves the frames t >= input_lengths[n] (and, with oob_grads="skip", an infeasible
        # sample's frames) unwritten: a new buffer is zeroed first, in one pass
        whole = tensor_descriptor("float32", (T, N, A), contiguous_strides((T, N, A)))
        lib.cudnnSetTensor(handle, whole, vg.ptr, scaling_ref("float32", 0.0))
    elif padded.size:
        # oob_grads="skip" into grads_out: zero only each short sample's padded frames, keeping the rest
        for n in padded.tolist():
            t0 = int(il[n])
            frames = tensor_descriptor("float32", (T - t0, A), (N * A, 1))
            lib.cudnnSetTensor(handle, frames, vg.ptr + 4 * (t0 * N * A + n * A), scaling_ref("float32", 0.0))
    lib.cudnnCTCLoss_v8(
        handle,
        _ALGOS[r.algo],
        ctc,
        desc,
        vx.ptr,
        ctypes.cast(r.labels.ptr, _INT_P),
        ctypes.cast(r.label_lengths.ptr, _INT_P),
        ctypes.cast(r.input_lengths.ptr, _INT_P),
        vc.ptr,
        desc,
        vg.ptr,
        size.value,
        ws_ptr,
    )
    if r.short.size:
        # cuDNN reports a cost of 0 for a sample with no possible alignment; its cost is +inf
        one = tensor_descriptor("float32", (1,), (1,))
        for n in r.short.tolist():
            lib.cudnnSetTensor(handle, one, vc.ptr + 4 * n, scaling_ref("float32", float("inf"), finite=False))
    del keep, ws


CTC = register(
    Primitive(
        "ctc_loss",
        inputs=(
            Operand("x", packed="is not C-contiguous"),
            Operand("labels", host_ok=True),
            Operand("label_lengths", host_ok=True),
            Operand("input_lengths", host_ok=True),
        ),
        outputs=(
            Output("costs_out", shape=lambda r: (r.N,), packed="{name} must be contiguous, got strides {strides}"),
            Output(
                "grads_out",
                shape=lambda r: (r.T, r.N, r.A),
                packed="{name} must be C-contiguous (T, N, A), got strides {strides}",
            ),
        ),
        resolve=_ctc_resolve,
        legacy=_ctc_call,
        empty=lambda r: r.N == 0,
        differentiable=("x",),
        residuals=("grads_out",),
    )
)


def ctc_loss(
    x: Any,
    labels: Any,
    label_lengths: Any,
    input_lengths: Any,
    *,
    blank: int = 0,
    normalization: str = "softmax",
    algo: str = "deterministic",
    oob_grads: str = "zero",
    out: tuple[Any, Any] | None = None,
    stream: Any = None,
    costs_out: Any = None,
    grads_out: Any = None,
) -> tuple[Any, Any]:
    """CTC loss of each sample and its gradient with respect to ``x``; returns ``(costs, grads)``.

    ``x``: ``(T, N, A)`` float32 logits (``normalization="softmax"``) or
    probabilities (``"none"``). ``labels``: 1-d packed labels in ``[1, A)``, or 2-d ``(N, S)`` padded ones
    (row ``n``'s first ``label_lengths[n]`` values);
    ``label_lengths``, ``input_lengths``: ``N`` values each (host or device
    integers; see the module doc for the host copy of device ones).
    ``costs``: ``(N,)`` float32; ``grads``: ``(T, N, A)`` float32,
    C-contiguous; ``out=(costs_out, grads_out)`` gives either or both (None to allocate; the per-output
    keywords ``costs_out=``/``grads_out=`` are its deprecated form, and errors name an output by them).
    ``blank`` must be 0.
    Both come from one ``cudnnCTCLoss_v8`` call (primitive :data:`CTC`); which of ``labels`` and the lengths
    are device arrays, the adapters decide (:func:`cudnnkit.runtime.adapters.is_device_array`).

    Args:
        x: ``(T, N, A)`` float32 (time, batch, alphabet including the blank), on the device; any strides (a
            non-C-contiguous ``x`` is copied first).
        labels: the label sequences, packed 1-d (``sum(label_lengths)`` values) or padded 2-d ``(N, S)``; each value
            in ``[1, A)``; a host sequence, NumPy array or device array of any integer dtype.
        label_lengths: ``N`` ints, each in ``[1, 255]`` and at most ``input_lengths[n]``.
        input_lengths: ``N`` ints, each in ``[1, T]``.
        blank: the blank label; must be 0 (cuDNN has no blank parameter).
        normalization: ``"softmax"`` (``x`` holds logits; cuDNN applies the softmax) or ``"none"`` (``x`` holds
            probabilities; see the module docstring for its gradient).
        algo: ``"deterministic"`` or ``"non_deterministic"`` (refused under ``settings(deterministic=True)``).
        oob_grads: ``"zero"`` (the gradient of a sample without a feasible alignment is zero) or ``"skip"`` (left
            as it was in ``grads_out``).
        out: ``(costs_out, grads_out)``, each an array or None (allocate).
        stream: the stream to run on; None: the library's current stream.
        costs_out: deprecated form of ``out=(costs_out, None)``.
        grads_out: deprecated form of ``out=(None, grads_out)``.

    Returns:
        ``(costs, grads)``: ``costs`` ``(N,)`` float32, the negative log-likelihood per sample (``inf`` for a sample
        without a feasible alignment), and ``grads`` ``(T, N, A)`` float32, the gradient of each ``costs[n]`` with
        respect to ``x`` (zero past ``input_lengths[n]``). No reduction over the batch.

    Raises:
        TypeError: ``x`` not float32 or a host array.
        ValueError: ``blank`` other than 0, a label out of ``[1, A)``, an empty label, lengths out of range or
            inconsistent with ``labels`` (each named).

    Example:
        >>> x = cp.random.standard_normal((50, 4, 20), dtype=cp.float32)        # (T, N, A) logits
        >>> labels = [1, 2, 3, 4, 5, 6, 7, 8, 9]                               # packed: 3 + 2 + 1 + 3
        >>> costs, grads = ops.ctc_loss(x, labels, [3, 2, 1, 3], [50, 40, 30, 50])
    """
    costs_out, grads_out = split_out("ctc_loss", out, {"costs_out": costs_out, "grads_out": grads_out})
    arrays = {"x": x, "labels": labels, "label_lengths": label_lengths, "input_lengths": input_lengths}
    return run(
        CTC,
        arrays,
        blank=blank,
        normalization=normalization,
        algo=algo,
        oob_grads=oob_grads,
        costs_out=costs_out,
        grads_out=grads_out,
        stream=stream,
    )


# ----------------------------------------------------------------- the L3 declaration

_ARRAYS = ("labels", "label_lengths", "input_lengths")


def _l3_check(normalization: str, arrays: dict[str, Any]) -> None:
    """What the differentiable op refuses beyond :func:`ctc_loss`: a missing label array, and
    ``normalization="none"``, whose grads cuDNN does not make the derivative of the costs."""
    for n, a in arrays.items():
        if a is None:
            raise TypeError(f"ctc_loss needs {n}= (1-d integers: a host array, a CPU tensor or a device array)")
    if normalization == "none":
        raise ValueError(
            "normalization='none': cuDNN's grads in this mode are not the gradient of the costs (where a class has "
            "no occupancy it returns x itself; see the module docstring), so the differentiable ctc_loss does not "
            "offer it: pass log(probabilities) (or logits) with normalization='softmax', which gives the same costs"
        )


def _l3_forward(x: Any, *, labels: Any = None, label_lengths: Any = None, input_lengths: Any = None, blank: int = 0,
                normalization: str = "softmax", algo: str = "deterministic", oob_grads: str = "zero") -> Any:  # fmt: skip
    _l3_check(normalization, dict(labels=labels, label_lengths=label_lengths, input_lengths=input_lengths))
    costs, grads = ctc_loss(x, labels, label_lengths, input_lengths, blank=blank, normalization=normalization,
                            algo=algo, oob_grads=oob_grads)  # fmt: skip
    return (costs,), {"grads": grads}


def _l3_backward(res: Any, douts: Any, needs: Any, **kw: Any) -> tuple:
    (dcosts,) = douts
    if dcosts is None or not needs[0]:
        return (None,)
    # dx[t, n, :] = grads[t, n, :] * dcosts[n]: cudnnOpTensor's MUL broadcasts dcosts seen as (1, N, 1) (the
    # array's own reshape, a view: CuPy and torch alike)
    return (op_tensor(res["grads"], dcosts.reshape((1, -1, 1)), op="mul"),)


def _l3_meta(x: Spec, *, labels: Any = None, label_lengths: Any = None, input_lengths: Any = None, blank: int = 0,
             normalization: str = "softmax", algo: str = "deterministic", oob_grads: str = "zero") -> Any:  # fmt: skip
    arrays = dict(labels=labels, label_lengths=label_lengths, input_lengths=input_lengths)
    _l3_check(normalization, arrays)  # first, as in the forward
    T, N, A, _, _, _ = _check_x_and_options(tuple(x.shape), x.dtype, dict(blank=blank, normalization=normalization,
                                                                        algo=algo, oob_grads=oob_grads))  # fmt: skip
    for n, a in arrays.items():
        if isinstance(a, Spec):  # what the values need (ranges, sums) is checked by the forward, on the host
            ndims = (1, 2) if n == "labels" else (1,)
            if len(a.shape) not in ndims or not a.dtype.startswith(("int", "uint")):
                what = "a 1-d (packed) or 2-d (N, S) (padded)" if n == "labels" else "a 1-d"
                raise ValueError(f"{n} must be {what} integer array, got {a.dtype} of shape {a.shape}")
            if (n != "labels" or len(a.shape) == 2) and a.shape[0] != N:
                raise ValueError(f"{n} has {a.shape[0]} {'rows' if n == 'labels' else 'values'} but x has a batch "
                                 f"of N={N}")  # fmt: skip
    costs, grads = Spec((N,), (1,), "float32"), Spec((T, N, A), contiguous_strides((T, N, A)), "float32")
    return (costs,), {"grads": grads}


CTC_LOSS_L3 = differentiable(
    Differentiable("ctc_loss", "ctc_loss", ("x",), ("costs",), _l3_forward, _l3_backward, _l3_meta, arrays=_ARRAYS,
                   doc="""per-sample CTC costs (N,) float32 of x (T, N, A) float32 (time, batch, alphabet with the
blank at 0; any strides, copied to C order): x holds logits (or log-probabilities: cuDNN applies the softmax over A
itself, normalization="softmax", the only mode offered here), so the reference is torch.nn.functional.ctc_loss(
x.log_softmax(-1), labels, input_lengths, label_lengths, blank=0, reduction="none"). Arrays labels (1-d, packed,
sum(label_lengths) values in [1, A); or 2-d (N, S), padded: row n's first label_lengths[n] values, packed on the
host), label_lengths, input_lengths (N values each): host data (NumPy, lists, CPU
tensors of any integer dtype: uploaded as one int32 buffer) or device integer arrays (int32 contiguous ones used as
they are; all are read to the host to be checked, a synchronisation); no gradient. One cudnnCTCLoss_v8 (ctc_loss)
makes the costs and the gradient, kept as the residual grads (T, N, A) float32; the backward is
dx = grads * dcosts[None, :, None], one cudnnOpTensor MUL (op_tensor). A sample with no alignment costs +inf and has
zero gradient (oob_grads="zero").""")
)  # fmt: skip
