"""Recurrent networks on cuDNN's v8 RNN API: every cell, layers, directions, projection, variable lengths.

An :class:`RNN` is a frozen, hashable config that fully describes one
``cudnnRNNDescriptor_t``; the descriptor (and, with ``dropout > 0``, its
dropout RNG states) is built once per (device, math type) and kept in a
module-level cache.

Shapes (``L`` = ``num_layers``, ``D`` = 2 if ``bidirectional`` else 1,
``H`` = ``hidden_size``, ``P`` = ``proj_size or H`` (the recurrent output
size), ``I`` = ``input_size``, ``N`` the batch, ``T`` the longest sequence)

==================  =================================  ======================================================
array               shape                              notes
==================  =================================  ======================================================
``x``               ``layout="seq_major"``: (T, N, I)  ``CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED``
                    ``"batch_major"``: (N, T, I)       ``..._BATCH_MAJOR_UNPACKED``
                    ``"packed"``: (sum(lengths), I)    ``..._SEQ_MAJOR_PACKED``: time-major, the batch sorted
                                                       by decreasing length (torch's ``PackedSequence.data``)
``y``               as ``x``, last dim ``D * P``       padded steps (unpacked layouts) hold ``padding_fill``
``hx``, ``hy``      (L * D, N, P)                      the initial / final hidden state; ``None`` = zeros
``cx``, ``cy``      (L * D, N, H)                      LSTM only
``w``, ``dw``       (weight_count,) 1-d, ``dtype``     the flat weight space (:meth:`RNN.weight_count`)
==================  =================================  ======================================================

Index ``l * D + d`` of ``hx``'s first axis is layer ``l``, direction ``d``
(0 forward, 1 reverse), as in torch. Dtypes: float16 (math in float16 or
float32), float32, float64; cuDNN 9.19 refuses bfloat16 RNNs.

Weights. :meth:`RNN.weight_params` returns, for each pseudo-layer (layer
``l`` direction ``d`` is pseudo-layer ``l * D + d``) and each linear id,
views into the flat buffer (``cudnnGetRNNWeightParams``): the matrix and the
bias, ``None`` where the bias mode or the skip input mode leaves one out.
The linear ids (``RNN.gates``) are

* LSTM: 0-3 the input-side matrices of the input, forget, cell and output
  gates (``W_i, W_f, W_c, W_o``), 4-7 the recurrent-side ones
  (``R_i, R_f, R_c, R_o``), 8 the projection ``P`` (``proj_size`` only);
* GRU: 0-2 input-side reset, update and candidate (``W_r, W_z, W_h``),
  3-5 recurrent-side (``R_r, R_z, R_h``);
* RELU/TANH: 0 input-side ``W``, 1 recurrent-side ``R``.

Input-side matrices are ``(H, I)`` in the first layer and ``(H, D * P)``
after it; recurrent ones ``(H, P)``; the projection ``(P, H)``; biases
``(H,)``. :func:`load_torch_params` / :func:`to_torch_params` convert from
and to the parameter layout of ``torch.nn.LSTM``, ``GRU`` and ``RNN``
(``weight_ih_l{k}[_reverse]``, ...; the gates are stacked in the same order).

Calls. :func:`rnn_forward` makes ``cudnnRNNForward``;
:func:`rnn_backward` makes ``cudnnRNNBackwardData_v8`` and then
``cudnnRNNBackwardWeights_v8`` (weight gradients only accumulate in cuDNN,
so a new ``dw`` is zeroed first). Workspace and reserve sizes come from
``cudnnGetRNNTempSpaceSizes`` for the forward mode used; the workspace is
allocated from the inputs' library per call, the reserve space is returned
by a training forward and handed to the backward. The persistent-dynamic
algorithm is compiled for the batch size with ``cudnnBuildRNNDynamic``
(again whenever the batch size changes).
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from .. import lib
from ..lib.errors import NotSupportedError
from ..runtime import (
    adapters,
    as_view,
    check_choice,
    current_settings,
    driver,
    prepare,
)
from ..runtime.arrays import ArrayView, contiguous_strides, is_contiguous
from ..runtime.cache import LRU, MISSING
from ..runtime.dtypes import canonical, check_scalar, itemsize
from ..runtime.launch import OPTIONAL, WRITTEN, Launch
from . import _express
from ._diff import Differentiable, Spec, differentiable
from ._primitive import Operand, Output, Primitive, register
from ._rnn_desc import (
    _ALGO_CHOICES,
    _BIAS_MODES,
    _CELLS,
    _INPUT_MODES,
    _LAYOUTS,
    _MATH,
    _PRECISIONS,
    RNN_DATA,  # noqa: F401  (the RNN data descriptor kind, cudnnkit.ops.rnn.RNN_DATA as before)
    _Built,
    _built,
    _call_info,
    _dev_lengths,
    _dropout_state,
    _dual,
    _explained,
    _hc_descs,
    _not_supported,
    _reserves,
    _Seq,
    _seq_lengths,
    _seq_shape,
    rnn_descriptor,  # noqa: F401  (public: cudnnkit.ops.rnn.rnn_descriptor)
)
from .dropout import DropoutState, _check_p, _check_seed

__all__ = [
    "RNN",
    "LinearParams",
    "rnn_forward",
    "rnn_backward",
    "load_torch_params",
    "to_torch_params",
    "torch_param_names",
]

_log = logging.getLogger("cudnnkit")
#: the gate each linear id stands for, per cell (see the module docstring)
GATES: dict[str, tuple[str, ...]] = {
    "lstm": ("W_i", "W_f", "W_c", "W_o", "R_i", "R_f", "R_c", "R_o", "P"),
    "gru": ("W_r", "W_z", "W_h", "R_r", "R_z", "R_h"),
    "relu": ("W", "R"),
    "tanh": ("W", "R"),
}


_INT32_MAX = 2**31 - 1


def _positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int in ``[minimum, 2**31 - 1]`` (cuDNN takes an ``int32_t``), else ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not minimum <= value <= _INT32_MAX:
        raise ValueError(f"{name} must be an int in [{minimum}, 2**31 - 1], got {value!r}")
    return int(value)


class LinearParams(NamedTuple):
    """One linear id of one pseudo-layer: views into a flat weight buffer (``None`` where absent), as
    :meth:`RNN.weight_params` returns them from ``cudnnGetRNNWeightParams``.

    Args:
        layer: the layer, from 0.
        direction: 0 forward, 1 reverse (pseudo-layer ``layer * D + direction``).
        lin_id: cuDNN's linear id (the module docstring lists them per cell).
        gate: its name, e.g. ``"W_f"`` (input-side forget gate), ``"R_h"`` (GRU recurrent candidate), ``"P"``
            (the LSTM projection).
        matrix: a view of the matrix in the flat buffer (``(H, I)``, ``(H, D * P)``, ``(H, P)`` or ``(P, H)``),
            or None.
        bias: a view of the bias ``(H,)``, or None where the bias mode leaves it out.

    Example:
        >>> p = rnn.weight_params(w)[0][1]       # pseudo-layer 0, linear id 1 (LSTM: W_f)
        >>> p.gate, p.matrix.shape, p.bias.shape
    """

    layer: int
    direction: int  # 0 forward, 1 reverse
    lin_id: int
    gate: str  # e.g. "W_f" (input-side forget gate), "R_h" (GRU recurrent candidate), "P" (projection)
    matrix: Any
    bias: Any


@dataclass(frozen=True)
class RNN:
    """Everything ``cudnnSetRNNDescriptor_v8`` (and ``cudnnRNNSetClip_v9``) take, as a hashable config.

    The descriptor (and, with ``dropout > 0``, its dropout RNG states through ``cudnnSetDropoutDescriptor``) is
    built once per (device, math type) and cached; :meth:`weight_count`, :meth:`new_weights`,
    :meth:`weight_params`, :meth:`dropout_state` and :meth:`chosen_algo` read it.

    Args:
        cell: ``"relu"``, ``"tanh"``, ``"lstm"`` or ``"gru"``.
        input_size: ``I``, the features of ``x``, >= 1.
        hidden_size: ``H``, >= 1.
        num_layers: ``L``, >= 1.
        bidirectional: a bool; ``D = 2`` when True.
        input_mode: ``"linear"`` (a matrix on the first layer's input) or ``"skip"`` (the input is added as is:
            needs ``input_size == hidden_size``).
        bias_mode: ``"double"`` (input and recurrent biases, torch's ``bias=True``), ``"single_input"``,
            ``"single_recurrent"`` or ``"none"``.
        proj_size: LSTM recurrent projection to ``proj_size < hidden_size`` outputs (0: none; ``algo`` standard
            or auto).
        dropout: probability of dropping the output of each layer but the last, in training.
        dropout_seed: seeds its RNG states (one :class:`DropoutState` per device, see :meth:`dropout_state`).
        algo: ``"auto"`` (the default), ``"standard"``, ``"persist_static"``, ``"persist_dynamic"`` or
            ``"persist_static_small_h"``. ``"auto"`` runs cuDNN's persistent-static algorithm where it supports
            the config and the call and was measured faster than the standard one (float16 and float32 data, one
            direction, full-length sequences, shapes of the kind in :func:`cudnnkit.ops._rnn_desc._auto_algo`), and
            the standard algorithm otherwise; it decides once per (config, batch, length class, training),
            :meth:`chosen_algo` says what it picked, and a training forward's reserve remembers the algorithm its
            backward must use. Name an algorithm to override it (the persistent ones take full-length batches
            only).
        dtype: the data type of x, y, h, c and w: float16, float32 or float64 (cuDNN 9.19 refuses bfloat16).
        math_precision: the compute type (default float32 for float16 and float32, float64 for float64; float16
            may compute in float16).
        math_type: ``"default"``, ``"tensor_op"``, ``"tensor_op_allow_conversion"`` or ``"fma"``; None picks
            ``"tensor_op"`` for float16 and, for float32, ``"default"`` (TF32 allowed) or ``"fma"`` as
            ``cudnnkit.settings(allow_tf32=...)`` says.
        cell_clip: LSTM cell-state clipping, ``c`` (meaning ``(-c, c)``) or ``(lo, hi)``; None for none. cuDNN
            clips the cell state where it is read, with float32 bounds: ``c_t = f * clip(c_{t-1}) + i * g``,
            ``h_t = o * tanh(clip(c_t))``, and ``cy`` is the unclipped ``c_T`` (measured on cuDNN 9.19).
        padded_io: the ``CUDNN_RNN_PADDED_IO_ENABLED`` aux flag, which the unpacked layouts need. None (the
            default) decides per call: a call whose data is packed in memory (``layout="packed"``, or
            ``"seq_major"`` with every sequence of full length ``T``) runs as ``SEQ_MAJOR_PACKED`` with padded I/O
            disabled (measured 20% faster for a float32 LSTM forward than padded I/O), others with it enabled;
            True always enables it, False allows ``layout="packed"`` only.

    Raises:
        ValueError: a choice outside its list, a size below its minimum, ``proj_size`` on another cell or not
            below ``hidden_size``, ``"skip"`` with ``input_size != hidden_size``, a ``math_precision`` the dtype
            does not take, a bad ``dropout``, ``dropout_seed`` or ``cell_clip``, or an ``algo`` cuDNN documents
            not to take the config.
        TypeError: a non-bool ``bidirectional``/``padded_io``, a dtype other than the three, or a ``dropout`` or
            ``cell_clip`` of another type.

    Example:
        >>> rnn = ops.RNN("lstm", input_size=32, hidden_size=64, num_layers=2, bidirectional=True)
        >>> w = rnn.new_weights(x)                      # (rnn.weight_count(x),), like x
        >>> y, hy, cy = ops.rnn_forward(x, w, rnn=rnn)   # x (T, N, 32) -> y (T, N, 128)
    """

    cell: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    input_mode: str = "linear"
    bias_mode: str = "double"
    proj_size: int = 0
    dropout: float = 0.0
    dropout_seed: int = 0
    algo: str = "auto"
    dtype: str = "float32"
    math_precision: str | None = None
    math_type: str | None = None
    cell_clip: float | tuple[float, float] | None = None
    padded_io: bool | None = None

    def __post_init__(self) -> None:
        check_choice(self.cell, _CELLS, "cell")
        for field, minimum in (("input_size", 1), ("hidden_size", 1), ("num_layers", 1), ("proj_size", 0)):
            object.__setattr__(self, field, _positive_int(getattr(self, field), field, minimum))
        if not isinstance(self.bidirectional, bool):
            raise TypeError(f"bidirectional must be a bool, got {self.bidirectional!r}")
        check_choice(self.input_mode, _INPUT_MODES, "input_mode")
        check_choice(self.bias_mode, _BIAS_MODES, "bias_mode")
        if self.proj_size:
            if self.cell != "lstm":
                raise ValueError(f"proj_size is for LSTM only (cuDNN), got cell={self.cell!r}")
            if self.proj_size >= self.hidden_size:
                raise ValueError(
                    f"proj_size must be smaller than hidden_size={self.hidden_size}, got "
                    f"{self.proj_size} (0 means no projection)"
                )
        if self.input_mode == "skip" and self.input_size != self.hidden_size:
            raise ValueError(
                f"input_mode='skip' adds the input to the first layer as is, so input_size "
                f"({self.input_size}) must equal hidden_size ({self.hidden_size})"
            )
        object.__setattr__(self, "dropout", _check_p(self.dropout, "dropout"))
        _check_seed(self.dropout_seed, "dropout_seed")
        check_choice(self.algo, _ALGO_CHOICES, "algo")
        object.__setattr__(self, "dtype", canonical(self.dtype, "dtype"))
        if self.dtype not in _PRECISIONS:
            raise TypeError(
                f"dtype must be one of {sorted(_PRECISIONS)} (cuDNN 9 RNNs have no {self.dtype}), got {self.dtype}"
            )
        # what cuDNN documents the persistent algorithms not to support ("Features of RNN Functions"); a
        # descriptor with these is accepted, and the first call fails with a bare NOT_SUPPORTED
        if self.proj_size and self.algo not in ("standard", "auto"):
            raise ValueError(
                f"proj_size (LSTM recurrent projection) needs algo='standard': cuDNN's persistent algorithms do "
                f"not support it, got algo={self.algo!r}"
            )
        if self.algo == "persist_static_small_h" and self.dtype == "float64":
            raise ValueError("algo='persist_static_small_h' does not support float64 (cuDNN); use another algo")
        if self.math_precision is not None:
            object.__setattr__(self, "math_precision", canonical(self.math_precision, "math_precision"))
            if self.math_precision not in _PRECISIONS[self.dtype]:
                raise ValueError(
                    f"math_precision {self.math_precision} is not supported for dtype {self.dtype}; "
                    f"cuDNN takes {_PRECISIONS[self.dtype]}"
                )
        if self.math_type is not None:
            check_choice(self.math_type, _MATH, "math_type")
        clip = self.cell_clip
        if clip is not None:
            if self.cell != "lstm":
                raise ValueError(f"cell_clip clips the LSTM cell state; cell={self.cell!r} has none")
            if isinstance(clip, numbers.Real) and not isinstance(clip, bool):
                if not clip > 0:
                    raise ValueError(f"cell_clip must be > 0 (meaning (-c, c)) or a (lo, hi) pair, got {clip!r}")
                clip = (-float(clip), float(clip))
            elif isinstance(clip, (tuple, list)) and len(clip) == 2:
                if not all(isinstance(c, numbers.Real) and not isinstance(c, bool) for c in clip):
                    raise TypeError(f"cell_clip (lo, hi) must be two floats, got {clip!r}")
                clip = (float(clip[0]), float(clip[1]))
                if not clip[0] <= clip[1]:
                    raise ValueError(f"cell_clip (lo, hi) needs lo <= hi, got {clip}")
            else:
                raise TypeError(f"cell_clip must be a positive float or a (lo, hi) pair, got {clip!r}")
            object.__setattr__(self, "cell_clip", clip)
        if self.padded_io is not None and not isinstance(self.padded_io, bool):
            raise TypeError(f"padded_io must be a bool or None, got {self.padded_io!r}")

    # ------------------------------------------------------------------ sizes

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """The size of one direction's output and hidden state: ``proj_size`` if set, else ``hidden_size``."""
        return self.proj_size or self.hidden_size

    @property
    def gates(self) -> tuple[str, ...]:
        """The gate name of each linear id (see the module docstring)."""
        g = GATES[self.cell]
        return g if self.proj_size else g[: len(g) - (self.cell == "lstm")]

    def hidden_shape(self, batch: int) -> tuple[int, int, int]:
        """Shape of ``hx``/``hy``: ``(num_layers * D, batch, output_size)``."""
        return (self.num_layers * self.num_directions, batch, self.output_size)

    def cell_shape(self, batch: int) -> tuple[int, int, int]:
        """Shape of ``cx``/``cy`` (LSTM): ``(num_layers * D, batch, hidden_size)``."""
        return (self.num_layers * self.num_directions, batch, self.hidden_size)

    def resolved_math(self) -> tuple[str, str]:
        """(math precision, math type) this thread's settings give (see the class docstring)."""
        prec = self.math_precision or ("float64" if self.dtype == "float64" else "float32")
        mt = self.math_type
        if mt is None:
            if self.dtype == "float16":
                mt = "tensor_op"
            elif self.dtype == "float32":
                mt = "default" if current_settings().allow_tf32 else "fma"
            else:
                mt = "default"
        return prec, mt

    # --------------------------------------------------------------- per device

    def _built(self, launch: Any, like: Any) -> _Built:
        # with dropout the descriptor points at this thread's RNG states, so it is per thread too
        key = (self, launch.device, self.resolved_math(), threading.get_ident() if self.dropout > 0 else None)
        b = _built.lookup(key)
        if b is MISSING:  # built outside the cache's lock (cuDNN calls); the first one stored is kept
            b = _built.put(key, _Built(self, launch, like, key[2]), count_miss=True)
        return b

    def weight_space_size(self, like: Any, *, stream: Any = None) -> int:
        """Bytes of the flat weight space (``cudnnGetRNNWeightSpaceSize``), on ``like``'s device."""
        launch, _ = prepare(("like", like), stream=stream)
        return self._built(launch, like).weight_bytes

    def weight_count(self, like: Any, *, stream: Any = None) -> int:
        """Elements (of ``dtype``) of the flat weight space: the length of ``w``."""
        return self.weight_space_size(like, stream=stream) // itemsize(self.dtype)

    def new_weights(self, like: Any, *, stream: Any = None) -> Any:
        """An uninitialised flat weight buffer (1-d, ``dtype``) from ``like``'s library and device."""
        launch, _ = prepare(("like", like), stream=stream)
        n = self._built(launch, like).weight_bytes // itemsize(self.dtype)
        return launch.empty((n,), self.dtype, name="w")[0]

    def weight_params(self, w: Any, *, stream: Any = None) -> list[list[LinearParams]]:
        """Views of every matrix and bias in ``w``: ``params[pseudo_layer][lin_id]``.

        Pseudo-layer ``l * D + d`` is layer ``l``, direction ``d``. ``matrix``
        is ``(rows, cols)`` and ``bias`` ``(rows,)``, both views of ``w``
        (``w[offset:offset + n].reshape(...)``, so writing them writes ``w``);
        ``None`` where absent. ``cudnnGetRNNWeightParams`` (the layout is asked
        once per device and reused).
        """
        launch, (vw,) = prepare(("w", w), stream=stream)
        b = self._built(launch, w)
        _check_weights(vw, b, "w")
        out: list[list[LinearParams]] = []
        D = self.num_directions
        for pl, ids in enumerate(b.layout):
            row = []
            for lin_id, (m, bias) in enumerate(ids):
                mv = None if m is None else w[m[0] : m[0] + m[1][0] * m[1][1]].reshape(m[1])
                bv = None if bias is None else w[bias[0] : bias[0] + bias[1]]
                row.append(LinearParams(pl // D, pl % D, lin_id, self.gates[lin_id], mv, bv))
            out.append(row)
        return out

    def dropout_state(self, like: Any, *, stream: Any = None) -> DropoutState | None:
        """The :class:`DropoutState` the RNN uses between layers on ``like``'s device, for this thread (``None``
        without dropout): :meth:`DropoutState.snapshot`/``restore`` replay the masks, ``reseed`` re-seeds.

        One state per (config, device, thread), seeded with ``dropout_seed`` when first used and kept for the
        life of the process (settings, descriptor-cache eviction and ``clear_caches`` do not restart it)."""
        if self.dropout == 0:
            return None
        launch, _ = prepare(("like", like), stream=stream)
        return _dropout_state(self, launch, like)

    def chosen_algo(self, like: Any, batch: int, seq_len: int, *, training: bool = False, full: bool = True,
                    stream: Any = None) -> str:  # fmt: skip
        """The cuDNN algorithm a call on ``like``'s device runs: ``algo`` itself, or what "auto" picks for a batch
        of ``batch`` sequences of longest length ``seq_len`` (``full``: all of that length), in training or
        inference. The same decision the calls make (and keep), so reading it changes nothing."""
        batch = _positive_int(batch, "batch")
        seq_len = _positive_int(seq_len, "seq_len")
        launch, _ = prepare(("like", like), stream=stream)
        lengths = (seq_len,) * batch if full else (seq_len,) + (1,) * (batch - 1)
        seq = _Seq(seq_len, batch, lengths, np.asarray(lengths, np.int32), full or batch == 1)
        return self._built(launch, like).choose(launch, seq, bool(training))


def _check_weights(vw: ArrayView, b: _Built, name: str) -> None:
    rnn = b.rnn
    if vw.dtype != rnn.dtype:
        raise TypeError(f"{name} has dtype {vw.dtype} but the RNN's dtype is {rnn.dtype}")
    if vw.ndim != 1 or not vw.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous 1-d array (the flat weight space), got shape {vw.shape} strides {vw.strides}"
        )
    if vw.shape[0] * itemsize(vw.dtype) < b.weight_bytes:
        raise ValueError(
            f"{name} has {vw.shape[0]} elements but this RNN's weight space needs "
            f"{b.weight_bytes // itemsize(rnn.dtype)} (RNN.weight_count)"
        )


def _check_state(v: ArrayView | None, shape: tuple[int, ...], dtype: str, name: str) -> None:
    """A given hx/cx/dhy/dcy must have the RNN's dtype and ``shape`` (None: absent, fine)."""
    if v is None:
        return
    if v.dtype != dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but the RNN's dtype is {dtype}")
    if v.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {v.shape}")


def _check_data(v: ArrayView, rnn: RNN, name: str) -> None:
    if v.dtype != rnn.dtype:
        raise TypeError(f"{name} has dtype {v.dtype} but the RNN's dtype is {rnn.dtype}")


def _check_fill(fill: Any, dtype: str) -> float:
    """``padding_fill`` as a float: a real number (``TypeError`` naming it for None, str, bool, ...); NaN and inf
    are allowed (a fill that shows), a finite value must stay finite in ``dtype`` (``ValueError``)."""
    value = check_scalar(fill, "padding_fill", finite=False, dtype=dtype)
    if math.isfinite(value):
        with np.errstate(over="ignore"):
            stored = np.array([value], dtype=np.dtype(dtype))[0]
        if not np.isfinite(stored):
            raise ValueError(f"padding_fill={value!r} overflows {dtype} (the RNN's dtype, in which cuDNN writes it)")
    return value


#: the algorithms whose kernels run every sample for all T steps (cuDNN documents variable sequence lengths in a
#: batch as not supported by them: "Features of RNN Functions")
_PERSISTENT = ("persist_static", "persist_dynamic", "persist_static_small_h")


def _check_algo_lengths(rnn: RNN, seq: _Seq, layout: str) -> None:
    """The persistent algorithms take only batches whose sequences all have the full length T."""
    if rnn.algo in _PERSISTENT and not seq.full:
        raise ValueError(
            f"algo={rnn.algo!r} does not support sequences of different lengths in one batch (cuDNN's persistent "
            f"RNN algorithms run every sample for all T={seq.T} steps); seq_lengths has lengths from "
            f"{int(seq.values.min())} to {seq.T}: use algo='standard' for variable lengths"
        )


def _required(**arrays: Any) -> None:
    for name, a in arrays.items():
        if a is None:
            raise TypeError(f"{name} is required (a CUDA array), got None")


def _packed(launch: Any, arr: Any, v: ArrayView | None, name: str) -> tuple[Any, int | None]:
    """(array, pointer) of an input cuDNN reads packed: copied on the launch stream if not C-contiguous; (None, None)
    for an absent optional input. Called only once every check has passed."""
    if v is None:
        return None, None
    if not v.is_contiguous():
        arr, v = launch.contiguous(arr, v, name)
    return arr, v.ptr


def _resolve(rnn: Any, layout: str) -> None:
    if not isinstance(rnn, RNN):
        raise TypeError(f"rnn must be a cudnnkit.ops.RNN config, got {type(rnn).__name__}")
    check_choice(layout, _LAYOUTS, "layout")
    if layout != "packed" and rnn.padded_io is False:
        raise ValueError(
            f"layout={layout!r} (unpacked) needs padded I/O (CUDNN_RNN_PADDED_IO_ENABLED): an RNN with "
            "padded_io=None or True; padded_io=False allows layout='packed' only"
        )


def rnn_forward(
    x: Any,
    w: Any,
    hx: Any = None,
    cx: Any = None,
    *,
    rnn: RNN,
    training: bool = False,
    layout: str = "seq_major",
    seq_lengths: Any = None,
    padding_fill: float = 0.0,
    out: Any = None,
    stream: Any = None,
    y_out: Any = None,
) -> tuple[Any, ...]:
    """Run the RNN over ``x``: ``(y, hy, cy)``, and with ``training=True`` ``(y, hy, cy, reserve)``.

    Shapes as in the module docstring (``x`` ``(T, N, I)``, ``(N, T, I)`` or packed ``(sum(lengths), I)``; ``y``
    the same with ``D * P`` features; ``hx``/``hy`` ``(L * D, N, P)``; ``cx``/``cy`` ``(L * D, N, H)``), all in
    ``rnn.dtype``. ``hy``/``cy`` hold each sample's state after its own last step; padded steps of ``y``
    (unpacked layouts) get ``padding_fill``. Training applies ``rnn.dropout`` between layers and returns the
    reserve space :func:`rnn_backward` needs. Non-contiguous inputs are copied. cuDNN reads ``seq_lengths`` on
    the device too, from a copy cudnnkit makes on the launch stream once per lengths (cached). Calls
    ``cudnnRNNForward`` (``CUDNN_FWD_MODE_TRAINING`` or ``_INFERENCE``), with the sizes from
    ``cudnnGetRNNTempSpaceSizes``, after ``cudnnBuildRNNDynamic`` for ``algo="persist_dynamic"``.

    Args:
        x: the input sequences in ``layout``, a CuPy or torch CUDA array of ``rnn.dtype``; feature size
            ``rnn.input_size``, at least one sample and one step.
        w: the flat weight space, 1-d, contiguous, ``rnn.dtype``, at least :meth:`RNN.weight_count` elements.
        hx: the initial hidden state ``(L * D, N, P)``; None: zeros.
        cx: the initial LSTM cell state ``(L * D, N, H)`` (LSTM only); None: zeros.
        rnn: the :class:`RNN` config.
        training: also return the reserve space for the backward (``CUDNN_FWD_MODE_TRAINING``), with dropout.
        layout: ``"seq_major"`` (T, N, I), ``"batch_major"`` (N, T, I) or ``"packed"`` (torch's
            ``PackedSequence.data``: time-major, sorted by decreasing length).
        seq_lengths: host ints ``(N,)``, each in ``[1, T]``; None: all ``T``. Required, and decreasing, for
            ``layout="packed"``.
        padding_fill: the value of ``y``'s padded steps (unpacked layouts), a real number (NaN and inf allowed)
            that ``rnn.dtype`` can hold.
        out: a C-contiguous array of ``y``'s shape and ``rnn.dtype`` to write; None allocates ``y``.
        stream: the stream to run on; None: the library's current stream.
        y_out: the deprecated name of ``out`` (a ``DeprecationWarning``).

    Returns:
        ``(y, hy, cy)`` (``cy`` None for cells other than LSTM), and with ``training=True`` ``(y, hy, cy,
        reserve)``, ``reserve`` a 1-d uint8 array; new arrays of ``x``'s library.

    Raises:
        TypeError: ``rnn`` not an :class:`RNN`, a non-bool ``training``, ``x``/``w`` missing, arrays of another
            dtype, arrays of a library without a cudnnkit adapter, or both ``out`` and ``y_out``.
        ValueError: a bad ``layout``, ``x``'s shape for the layout, bad ``seq_lengths``, variable lengths with a
            persistent ``algo``, ``cx`` for a non-LSTM cell, states or ``w`` of the wrong size, a non-contiguous
            ``out``, an unpacked layout with ``padded_io=False``, or a ``padding_fill`` that overflows.
        cudnnkit.lib.errors.NotSupportedError: cuDNN refuses the config for this call (the message names the
            algorithm and the call).

    Example:
        >>> import cupy as cp
        >>> from cudnnkit import ops
        >>> rnn = ops.RNN("gru", input_size=16, hidden_size=32)
        >>> x = cp.random.standard_normal((20, 4, 16), dtype=cp.float32)      # (T, N, I)
        >>> w = rnn.new_weights(x)
        >>> y, hy, _ = ops.rnn_forward(x, w, rnn=rnn, seq_lengths=[20, 15, 9, 3])
        >>> y, hy, _, reserve = ops.rnn_forward(x, w, rnn=rnn, training=True)
    """
    if y_out is not None:
        if out is not None:
            raise TypeError("rnn_forward: pass out= or its deprecated name y_out=, not both")
        warnings.warn("rnn_forward: y_out= is deprecated; pass out=", DeprecationWarning, stacklevel=2)
        out = y_out
    sig = None
    if stream is None and seq_lengths is None and out is None and _express.enabled():
        sig = _forward_signature(rnn, training, layout, padding_fill, (x, w, hx, cx))
        if sig is not None:
            e = _fwd_express.peek(sig[0], MISSING)
            if e is not MISSING:
                return _forward_express(e, sig[1], hx, cx, training)
    _resolve(rnn, layout)
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {training!r}")
    _required(x=x, w=w)
    fill = _check_fill(padding_fill, rnn.dtype)
    launch, (vx, vw, vhx, vcx) = prepare(("x", x), ("w", w), ("hx", hx, OPTIONAL), ("cx", cx, OPTIONAL), stream=stream)
    # every check first
    _check_data(vx, rnn, "x")
    seq = _seq_lengths(layout, vx, seq_lengths, rnn.input_size)
    _check_algo_lengths(rnn, seq, layout)
    if cx is not None and rnn.cell != "lstm":
        raise ValueError(f"cx is the LSTM cell state; a {rnn.cell} RNN has none")
    _check_state(vhx, rnn.hidden_shape(seq.N), rnn.dtype, "hx")
    _check_state(vcx, rnn.cell_shape(seq.N), rnn.dtype, "cx")
    if launch.adapter is None:
        raise TypeError(
            "rnn_forward allocates y, hy, cy and its workspace with the inputs' library: pass CuPy arrays "
            "or torch tensors (these arrays come from a library without a cudnnkit adapter)"
        )
    b = rnn._built(launch, x)
    _check_weights(vw, b, "w")
    yshape = _seq_shape(layout, seq, rnn.num_directions * rnn.output_size)
    if out is not None:
        y, vy = launch.output(out, yshape, rnn.dtype, name="out")
        if not vy.is_contiguous():
            raise ValueError(f"out must be C-contiguous (cuDNN writes y packed), got strides {vy.strides}")
    padded, xd, yd = _dual(rnn, layout, seq, fill)
    hd, cd = _hc_descs(rnn, seq.N)
    # then copies and allocations, all on the launch stream
    given = (x, hx, cx)
    x, x_ptr = _packed(launch, x, vx, "x")
    hx, hx_ptr = _packed(launch, hx, vhx, "hx")
    cx, cx_ptr = _packed(launch, cx, vcx, "cx")
    if out is None:
        y, vy = launch.output(None, yshape, rnn.dtype, name="y")
    hy, vhy = launch.empty(rnn.hidden_shape(seq.N), rnn.dtype, name="hy")
    cy, vcy = (None, None) if rnn.cell != "lstm" else launch.empty(rnn.cell_shape(seq.N), rnn.dtype, name="cy")
    ptrs = (x_ptr, vy.ptr, hx_ptr, vhy.ptr, cx_ptr, None if vcy is None else vcy.ptr, vw.ptr)
    out = _forward_rest(launch, b, layout, seq, padded, training, (xd, yd, hd, cd), ptrs, (y, hy, cy))
    if sig is not None and all(
        v is None or (v.owner is a and v.stream is None and v.adapter is launch.adapter and v.is_contiguous())
        for v, a in ((vx, given[0]), (vhx, given[1]), (vcx, given[2]), (vw, w))
    ):
        _fwd_express.put(sig[0], _FwdEntry(launch.device, launch.adapter, launch.inputs, b, layout, seq, yshape,
                                           padded, (xd, yd, hd, cd)))  # fmt: skip
    return out


def _forward_rest(
    launch: Any, b: _Built, layout: str, seq: _Seq, padded: bool, training: bool, descs: tuple, ptrs: tuple,
    outs: tuple,
) -> tuple:  # fmt: skip
    """The forward once everything is checked and allocated: the algorithm, the cuDNN call (again with the
    standard algorithm if cuDNN refuses the persistent one "auto" chose), the reserve recorded."""
    rnn = b.rnn
    lengths, lengths_ptr = _dev_lengths(launch, seq)
    algo = b.choose(launch, seq, training)
    while True:
        try:
            reserve, rs_ptr, rs_bytes = _forward_call(launch, b, algo, layout, seq, padded, training, descs,
                                                      lengths_ptr, ptrs)  # fmt: skip
            break
        except NotSupportedError:
            if rnn.algo != "auto" or algo == "standard":
                raise
            # cuDNN refused at the call the persistent algorithm "auto" chose (a size limit only the call shows):
            # this config runs the next choice from now on, this call included (nothing was written)
            _log.debug("rnn: cuDNN refused algo=%r for %s at the call; choosing again", algo, rnn)
            b.refused(algo)
            algo = b.choose(launch, seq, training)
    if training:
        _reserves.add(launch.device, rs_ptr, rs_bytes, algo, rnn)
    del lengths
    return (*outs, reserve) if training else outs


# --------------------------------------------------------------------- the forward's express path

#: signature -> _FwdEntry (see :func:`_forward_signature`)
_fwd_express: LRU[tuple, _FwdEntry] = LRU("rnn.express", 1024)


class _FwdEntry(NamedTuple):
    """What a repeated :func:`rnn_forward` needs: everything its checks and descriptors gave the first time."""

    device: int
    adapter: Any
    inputs: tuple[str, ...]
    built: _Built
    layout: str
    seq: _Seq
    yshape: tuple[int, ...]
    padded: bool
    descs: tuple[Any, Any, Any, Any]  #: the x, y, h and c descriptors


def _forward_signature(rnn: Any, training: Any, layout: Any, fill: Any, arrays: tuple) -> tuple | None:
    """(key, pointers) of an :func:`rnn_forward` call that may take the express path, or None. The key holds
    everything the forward's checks and descriptors are a function of: the config, the keywords (by type and
    value), each array's adapter key (type, dtype, shape, strides, device), the thread's settings (the math
    mode) and, with dropout, the thread (its RNG states)."""
    keyed = adapters.KEYED
    parts: list[Any] = [rnn, type(training), training, type(layout), layout, type(fill), fill]
    ptrs: list[int] = []
    for a in arrays:
        if a is None:
            parts.append(None)
            continue
        key = keyed.get(type(a))
        got = key(a) if key is not None else None
        if got is None:
            return None
        parts.append(got[0])
        ptrs.append(got[1])
    parts.append(current_settings())
    if getattr(rnn, "dropout", 0):
        parts.append(threading.get_ident())
    try:
        key = tuple(parts)
        hash(key)
    except TypeError:
        return None
    return key, ptrs


def _forward_express(e: _FwdEntry, ptrs: list[int], hx: Any, cx: Any, training: bool) -> tuple:
    """:func:`rnn_forward` for a call whose signature an earlier call (with its arrays as given) recorded: the
    current stream, new outputs, the algorithm and the cuDNN call; nothing checked or described again."""
    dev, ad, b = e.device, e.adapter, e.built
    rnn = b.rnn
    launch = Launch(dev, ad, ad.current_stream(dev), e.inputs)
    x_ptr, w_ptr = ptrs[0], ptrs[1]
    hx_ptr = None if hx is None else ptrs[2]
    cx_ptr = None if cx is None else ptrs[2 + (hx is not None)]
    N = e.seq.N
    y, vy = launch.empty(e.yshape, rnn.dtype, name="y")
    hy, vhy = launch.empty(rnn.hidden_shape(N), rnn.dtype, name="hy")
    cy, vcy = (None, None) if rnn.cell != "lstm" else launch.empty(rnn.cell_shape(N), rnn.dtype, name="cy")
    ptrs = (x_ptr, vy.ptr, hx_ptr, vhy.ptr, cx_ptr, None if vcy is None else vcy.ptr, w_ptr)
    return _forward_rest(launch, b, e.layout, e.seq, e.padded, training, e.descs, ptrs, (y, hy, cy))


def _forward_call(
    launch: Any, b: _Built, algo: str, layout: str, seq: _Seq, padded: bool, training: bool, descs: tuple,
    lengths_ptr: Any, ptrs: tuple[Any, ...],
) -> tuple[Any, int, int]:  # fmt: skip
    """``cudnnRNNForward`` with ``algo``'s descriptor, its workspace and (training) a new reserve: (reserve, its
    pointer, its bytes). ``descs``: the x, y, h and c descriptors; ``ptrs``: x, y, hx, hy, cx, cy, w."""
    xd, yd, hd, cd = descs
    x_ptr, y_ptr, hx_ptr, hy_ptr, cx_ptr, cy_ptr, w_ptr = ptrs
    try:
        with launch.on_device(), b.call_lock(algo):
            handle = launch.handle
            desc = b.prepare_call(launch, padded, seq.N, algo)
            ws_bytes, rs_bytes = b.temp_sizes(launch, padded, training, xd, algo)
            # zeroed: cuDNN 9.19's elemWiseRNNcell reads workspace bytes it has not written (compute-sanitizer
            # initcheck on an H200, 720 reads for a 2-layer bidirectional LSTM; torch's own cuDNN LSTM shows the
            # same reads, and zeroing the workspace removes them); the memset is a few microseconds next to the call
            ws, ws_ptr = launch.workspace(ws_bytes, zeroed=True)
            reserve, rs_ptr = None, 0
            if training:
                reserve, vr = launch.empty((rs_bytes,), "uint8", name="reserve")
                rs_ptr = vr.ptr
            lib.cudnnRNNForward(
                handle,
                desc,
                lib.CUDNN_FWD_MODE_TRAINING if training else lib.CUDNN_FWD_MODE_INFERENCE,
                lengths_ptr,
                xd,
                x_ptr,
                yd,
                y_ptr,
                hd,
                hx_ptr,
                hy_ptr,
                cd,
                cx_ptr,
                cy_ptr,
                b.weight_bytes,
                w_ptr,
                ws_bytes,
                ws_ptr,
                rs_bytes,
                rs_ptr,
            )
    except NotSupportedError as e:  # what the call was given is formatted only here, not on every call
        if "cuDNN does not support this RNN" in str(e):
            raise
        raise _not_supported(b.rnn, e, b.math_mode, _call_info(layout, seq, padded, training), algo) from None
    del ws
    return reserve, rs_ptr, rs_bytes


def _reserve_entry(device: int, vr: Any, rnn: RNN, trusted: bool) -> tuple[int, str] | None:
    """The ledger's record (bytes, algorithm) of the reserve viewed by ``vr``, None when it has none. A trusted
    reserve (``rnn_backward(trusted_reserve=True)``) is not looked up: its address may be a freed tracked
    reserve's, whose record says nothing of it."""
    return None if trusted else _reserves.entry(device, vr.ptr, rnn)


def _check_reserve(vr: Any, rs_bytes: int, entry: tuple[int, str] | None, trusted: bool) -> None:
    """``ValueError`` unless ``vr`` is a reserve a backward of ``rs_bytes`` may use: a packed uint8 array of that
    size, and (unless ``trusted``) one the ledger records as a training forward's, unused, of that size."""
    if vr.dtype != "uint8" or vr.shape != (rs_bytes,) or not vr.is_contiguous():
        raise ValueError(
            f"reserve must be the uint8 array of {rs_bytes} bytes a training rnn_forward returned for "
            f"these shapes, got {vr.dtype} {vr.shape}"
        )
    if not trusted and (entry is None or entry[0] != rs_bytes):
        raise ValueError(
            "reserve has been used by an rnn_backward already (cuDNN's backward overwrites the reserve "
            "space) or does not come from a training rnn_forward: run the training forward again, or "
            "pass keep_reserve=True to every backward but the last (a framework that copies the reserve "
            "into memory of its own passes trusted_reserve=True)"
        )


def rnn_backward(
    x: Any,
    y: Any,
    dy: Any,
    w: Any,
    reserve: Any,
    hx: Any = None,
    cx: Any = None,
    dhy: Any = None,
    dcy: Any = None,
    *,
    rnn: RNN,
    layout: str = "seq_major",
    seq_lengths: Any = None,
    dw: Any = None,
    accumulate: bool = False,
    keep_reserve: bool = False,
    trusted_reserve: bool = False,
    stream: Any = None,
) -> tuple[Any, Any, Any, Any]:
    """Gradients of a training :func:`rnn_forward`: ``(dx, dhx, dcx, dw)``.

    Makes ``cudnnRNNBackwardData_v8`` and then ``cudnnRNNBackwardWeights_v8`` (``CUDNN_WGRAD_MODE_ADD``), in that
    order, with one workspace; the reserve space is updated by the first and read by the second. Since cuDNN
    overwrites it, a reserve allows one backward: a second raises ``ValueError``, unless the first passed
    ``keep_reserve=True`` (the backward then works on a copy of the reserve). That protection tracks each
    training forward's reserve by its device address. A framework that keeps the reserve in memory of its own
    (JAX: XLA copies residuals into its buffers) hands the backward an array at an address no forward returned:
    ``trusted_reserve=True`` says, explicitly, that ``reserve`` holds the bytes a training forward with these
    arguments wrote and that no backward has overwritten them (the caller's guarantee: it is not tracked); its
    size is still checked, and for ``algo="auto"`` the algorithm is the one a forward of these shapes runs.
    Pass ``keep_reserve=True`` with it where the reserve must stay unchanged (an XLA operand is never written).

    Args:
        x: the forward's ``x``.
        y: the forward's output ``y``.
        dy: the gradient of ``y``, ``y``'s shape and dtype.
        w: the forward's weights.
        reserve: the reserve space the training forward returned (1-d uint8, of the size cuDNN asks for).
        hx: the forward's ``hx`` (None if it had none).
        cx: the forward's ``cx`` (LSTM; None if it had none).
        dhy: the gradient of ``hy``, ``(L * D, N, P)``; None: zero.
        dcy: the gradient of ``cy`` (LSTM), ``(L * D, N, H)``; None: zero.
        rnn: the forward's :class:`RNN`.
        layout: the forward's.
        seq_lengths: the forward's.
        dw: a flat array like ``w`` to receive the weight gradient (zeroed first unless ``accumulate``); None: a
            new zeroed buffer.
        accumulate: add the weight gradient to ``dw`` (needs ``dw``).
        keep_reserve: leave ``reserve`` usable for another backward (this one works on a copy).
        trusted_reserve: accept a reserve no tracked forward returned (see above).
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(dx, dhx, dcx, dw)``: ``dx`` ``x``'s shape; ``dhx``/``dcx`` the states' shapes, None where
        ``hx``/``cx`` were not given (``dcx`` None for other cells); ``dw`` flat like ``w`` (``dw`` itself when
        given).

    Raises:
        TypeError: ``rnn`` not an :class:`RNN`, a non-bool flag, a required array missing, arrays of another
            dtype or of a library without a cudnnkit adapter.
        ValueError: shapes that do not match the forward's, ``cx``/``dcy`` for a non-LSTM cell, ``accumulate``
            without ``dw``, a read-only ``dw``, or a reserve of the wrong size, already used or not a training
            forward's.
        cudnnkit.lib.errors.NotSupportedError: cuDNN refuses the config for this call.

    Example:
        >>> y, hy, cy, reserve = ops.rnn_forward(x, w, rnn=rnn, training=True)
        >>> dx, dhx, dcx, dw = ops.rnn_backward(x, y, dy, w, reserve, rnn=rnn)
    """
    _resolve(rnn, layout)
    for name, flag in (("accumulate", accumulate), ("keep_reserve", keep_reserve),
                       ("trusted_reserve", trusted_reserve)):  # fmt: skip
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    if accumulate and dw is None:
        raise ValueError("accumulate=True adds into an existing weight gradient: pass dw=")
    _required(x=x, y=y, dy=dy, w=w, reserve=reserve)
    launch, (vx, vy, vdy, vw, vr, vhx, vcx, vdhy, vdcy, vdw) = prepare(
        ("x", x),
        ("y", y),
        ("dy", dy),
        ("w", w),
        ("reserve", reserve),
        ("hx", hx, OPTIONAL),
        ("cx", cx, OPTIONAL),
        ("dhy", dhy, OPTIONAL),
        ("dcy", dcy, OPTIONAL),
        ("dw", dw, OPTIONAL | WRITTEN),
        stream=stream,
    )
    # every check first
    _check_data(vx, rnn, "x")
    seq = _seq_lengths(layout, vx, seq_lengths, rnn.input_size)
    _check_algo_lengths(rnn, seq, layout)
    yshape = _seq_shape(layout, seq, rnn.num_directions * rnn.output_size)
    for name, v in (("y", vy), ("dy", vdy)):
        _check_data(v, rnn, name)
        if v.shape != yshape:
            raise ValueError(f"{name} must have the forward output's shape {yshape}, got {v.shape}")
    if rnn.cell != "lstm" and (cx is not None or dcy is not None):
        raise ValueError(f"cx/dcy are the LSTM cell state's; a {rnn.cell} RNN has none")
    _check_state(vhx, rnn.hidden_shape(seq.N), rnn.dtype, "hx")
    _check_state(vcx, rnn.cell_shape(seq.N), rnn.dtype, "cx")
    _check_state(vdhy, rnn.hidden_shape(seq.N), rnn.dtype, "dhy")
    _check_state(vdcy, rnn.cell_shape(seq.N), rnn.dtype, "dcy")
    if launch.adapter is None:
        raise TypeError(
            "rnn_backward allocates dx, dhx, dcx, dw and its workspace with the inputs' library: pass CuPy "
            "arrays or torch tensors (these arrays come from a library without a cudnnkit adapter)"
        )
    b = rnn._built(launch, x)
    _check_weights(vw, b, "w")
    if vdw is not None:
        _check_weights(vdw, b, "dw")
        if vdw.readonly:
            raise ValueError("dw is read-only")
    padded, xd, yd = _dual(rnn, layout, seq, 0.0)
    entry = _reserve_entry(launch.device, vr, rnn, trusted_reserve)
    # the forward's algorithm ("auto" may have chosen either); for a reserve the ledger does not know, the one a
    # forward of these shapes would run, for the sizes in the error below
    algo = entry[1] if rnn.algo == "auto" and entry is not None else b.choose(launch, seq, True)
    with launch.on_device():
        ws_bytes, rs_bytes = b.temp_sizes(launch, padded, True, xd, algo)
    _check_reserve(vr, rs_bytes, entry, trusted_reserve)
    hd, cd = _hc_descs(rnn, seq.N)
    # then copies and allocations, all on the launch stream
    x, x_ptr = _packed(launch, x, vx, "x")
    y, y_ptr = _packed(launch, y, vy, "y")
    dy, dy_ptr = _packed(launch, dy, vdy, "dy")
    hx, hx_ptr = _packed(launch, hx, vhx, "hx")
    cx, cx_ptr = _packed(launch, cx, vcx, "cx")
    dhy, dhy_ptr = _packed(launch, dhy, vdhy, "dhy")
    dcy, dcy_ptr = _packed(launch, dcy, vdcy, "dcy")
    if dw is None:
        dw, vdw = launch.empty((vw.shape[0],), rnn.dtype, name="dw")
    dx, vdx = launch.empty(vx.shape, rnn.dtype, name="dx")
    dhx, vdhx = (None, None) if hx is None else launch.empty(rnn.hidden_shape(seq.N), rnn.dtype, name="dhx")
    dcx, vdcx = (None, None) if cx is None else launch.empty(rnn.cell_shape(seq.N), rnn.dtype, name="dcx")
    lengths, lengths_ptr = _dev_lengths(launch, seq)
    rs_ptr, kept = vr.ptr, None
    if keep_reserve:
        kept, vk = launch.empty((rs_bytes,), "uint8", name="reserve")
        launch.adapter.copy(kept, reserve, launch.stream)
        rs_ptr = vk.ptr
    call = _call_info(layout, seq, padded, True)
    with launch.on_device(), b.call_lock(algo), _explained(rnn, b.math_mode, call, algo):
        handle = launch.handle
        desc = b.prepare_call(launch, padded, seq.N, algo)
        ws, ws_ptr = launch.workspace(ws_bytes, zeroed=True)  # as in rnn_forward
        if not accumulate:
            # all-zero bytes are 0.0 in every float type: one cuMemsetD8Async, not a cuDNN kernel
            driver.memset_async(vdw.ptr, vdw.shape[0] * itemsize(rnn.dtype), launch.stream)
        if not keep_reserve:  # overwritten from here on (a trusted reserve at a tracked address too)
            _reserves.take(launch.device, vr.ptr)
        lib.cudnnRNNBackwardData_v8(
            handle,
            desc,
            lengths_ptr,
            yd,
            y_ptr,
            dy_ptr,
            xd,
            vdx.ptr,
            hd,
            hx_ptr,
            dhy_ptr,
            None if vdhx is None else vdhx.ptr,
            cd,
            cx_ptr,
            dcy_ptr,
            None if vdcx is None else vdcx.ptr,
            b.weight_bytes,
            vw.ptr,
            ws_bytes,
            ws_ptr,
            rs_bytes,
            rs_ptr,
        )
        lib.cudnnRNNBackwardWeights_v8(
            handle,
            desc,
            lib.CUDNN_WGRAD_MODE_ADD,
            lengths_ptr,
            xd,
            x_ptr,
            hd,
            hx_ptr,
            yd,
            y_ptr,
            b.weight_bytes,
            vdw.ptr,
            ws_bytes,
            ws_ptr,
            rs_bytes,
            rs_ptr,
        )
    del ws, lengths, kept
    return dx, dhx, dcx, dw


# --------------------------------------------------------------------- the declarations

_RNN_DT = tuple(_PRECISIONS)

#: ``rnn_forward`` in the registry (its own sequence: ``Primitive.runner``)
RNN_FORWARD = register(
    Primitive(
        "rnn_forward",
        inputs=(
            Operand("x", _RNN_DT),
            Operand("w", _RNN_DT),
            Operand("hx", _RNN_DT, optional=True),
            Operand("cx", _RNN_DT, optional=True),
        ),
        outputs=(Output("out", like="x"),),  # y (out= passes it), then hy, cy and, training, the reserve
        extras=("hy", "cy", "reserve"),
        runner=rnn_forward,
        family="rnn",
        differentiable=("x", "w", "hx", "cx"),
        residuals=("x", "w", "hx", "cx", "out", "reserve"),
        backward="rnn_backward",
        express=False,  # its own express path (_forward_express)
    )
)

#: ``rnn_backward`` in the registry (its own sequence: ``Primitive.runner``)
RNN_BACKWARD = register(
    Primitive(
        "rnn_backward",
        inputs=(
            Operand("x", _RNN_DT),
            Operand("y", _RNN_DT),
            Operand("dy", _RNN_DT),
            Operand("w", _RNN_DT),
            Operand("reserve", ("uint8",)),
            Operand("hx", _RNN_DT, optional=True),
            Operand("cx", _RNN_DT, optional=True),
            Operand("dhy", _RNN_DT, optional=True),
            Operand("dcy", _RNN_DT, optional=True),
        ),
        extras=("dx", "dhx", "dcx", "dw"),  # what it returns; dw= passes a weight-gradient buffer (accumulate=)
        runner=rnn_backward,
        family="rnn",
        express=False,
    )
)


# --------------------------------------------------------------------- torch parameter layout


def torch_param_names(rnn: RNN) -> list[str]:
    """The parameter names ``torch.nn.LSTM``/``GRU``/``RNN`` give this config, in torch's order.

    Host-side; no cuDNN call (the names map onto ``cudnnGetRNNWeightParams``'s linear ids in
    :func:`load_torch_params`): ``weight_ih_l{k}[_reverse]``, ``weight_hh_l{k}...``, then ``bias_ih``/``bias_hh``
    (``bias_mode="double"``) and ``weight_hr`` (``proj_size``), per layer and direction.

    Args:
        rnn: an :class:`RNN` with ``input_mode="linear"`` and ``bias_mode`` ``"double"`` or ``"none"`` (torch's
            modules have no other).

    Returns:
        A list of str.

    Raises:
        TypeError: ``rnn`` is not an :class:`RNN`.
        ValueError: a config torch's modules cannot express.

    Example:
        >>> ops.torch_param_names(ops.RNN("gru", 8, 16))
        ['weight_ih_l0', 'weight_hh_l0', 'bias_ih_l0', 'bias_hh_l0']
    """
    _torch_compatible(rnn)
    names = []
    for layer in range(rnn.num_layers):
        for d in range(rnn.num_directions):
            s = f"_l{layer}" + ("_reverse" if d else "")
            names += [f"weight_ih{s}", f"weight_hh{s}"]
            if rnn.bias_mode == "double":
                names += [f"bias_ih{s}", f"bias_hh{s}"]
            if rnn.proj_size:
                names.append(f"weight_hr{s}")
    return names


def _torch_compatible(rnn: RNN) -> None:
    if not isinstance(rnn, RNN):
        raise TypeError(f"rnn must be a cudnnkit.ops.RNN config, got {type(rnn).__name__}")
    if rnn.input_mode != "linear":
        raise ValueError("torch's RNN modules have no skip-input mode: input_mode must be 'linear'")
    if rnn.bias_mode not in ("double", "none"):
        raise ValueError(
            f"torch's RNN modules have bias_ih and bias_hh together (bias=True, bias_mode='double') or "
            f"neither (bias_mode='none'); bias_mode={rnn.bias_mode!r} has no torch equivalent"
        )


def _torch_pieces(rnn: RNN, p: LinearParams, ngates: int) -> list[tuple[str, Any, int]]:
    """(torch name, this piece's view, row offset in the torch tensor) for one linear id."""
    s = f"_l{p.layer}" + ("_reverse" if p.direction else "")
    if p.gate == "P":
        return [(f"weight_hr{s}", p.matrix, 0)]
    side = "ih" if p.gate.startswith("W") else "hh"
    g = p.lin_id % ngates
    rows = rnn.hidden_size * g
    out = [(f"weight_{side}{s}", p.matrix, rows)]
    if p.bias is not None:
        out.append((f"bias_{side}{s}", p.bias, rows))
    return out


def _torch_layout(rnn: RNN, w: Any, stream: Any) -> list[tuple[str, Any, int]]:
    _torch_compatible(rnn)
    ngates = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}[rnn.cell]
    return [
        piece for row in rnn.weight_params(w, stream=stream) for p in row for piece in _torch_pieces(rnn, p, ngates)
    ]


def load_torch_params(
    rnn: RNN, params: Mapping[str, Any], w: Any = None, *, like: Any = None, stream: Any = None
) -> Any:
    """Copy torch-layout parameters into a flat cuDNN weight buffer; returns ``w``.

    Each parameter is split into the pieces ``cudnnGetRNNWeightParams`` locates in ``w`` (one per gate and side;
    gates stacked in torch's order, LSTM i, f, g, o and GRU r, z, n, which is cuDNN's), and copied with the
    array library's copy on ``stream``. Every parameter is checked before the first copy.

    Args:
        rnn: the :class:`RNN` (``input_mode="linear"``, ``bias_mode`` ``"double"`` or ``"none"``).
        params: name -> CUDA array of ``rnn.dtype`` (e.g. ``dict(lstm.named_parameters())`` of a
            ``torch.nn.LSTM`` on the GPU, or CuPy arrays with those names and shapes): ``weight_ih_l{k}[_reverse]``
            ``(G*H, in)``, ``weight_hh_l{k}...`` ``(G*H, P)``, ``bias_ih``/``bias_hh`` ``(G*H,)``,
            ``weight_hr_l{k}...`` ``(P, H)``; exactly :func:`torch_param_names`.
        w: the flat buffer to write (1-d, ``rnn.dtype``, CuPy or torch); None: a new one like the first parameter
            (or ``like``).
        like: an array whose library and device a new ``w`` takes.
        stream: the stream of the copies; None: the library's current stream.

    Returns:
        ``w``.

    Raises:
        TypeError: ``rnn`` not an :class:`RNN`, a parameter of another dtype, or a ``w`` of a library without a
            cudnnkit adapter.
        ValueError: names missing or unexpected, a shape that does not match, parameters of another library or
            device than ``w``, or a config torch's modules cannot express.

    Example:
        >>> lstm = torch.nn.LSTM(32, 64, num_layers=2).cuda()
        >>> rnn = ops.RNN("lstm", 32, 64, num_layers=2)
        >>> w = ops.load_torch_params(rnn, dict(lstm.named_parameters()))
    """
    names = torch_param_names(rnn)
    missing = [n for n in names if n not in params]
    extra = [n for n in params if n not in names]
    if missing or extra:
        raise ValueError(f"params do not match this RNN's torch layout: missing {missing}, unexpected {extra}")
    # every parameter is read (CUDA arrays, dtype) before anything is made from the first one or copied
    labels = {name: f"params[{name!r}]" for name in names}
    views = {name: as_view(params[name], labels[name]) for name in names}
    for name in names:
        if views[name].dtype != rnn.dtype:
            raise TypeError(f"{labels[name]} has dtype {views[name].dtype} but the RNN's dtype is {rnn.dtype}")
    if w is None:
        w = rnn.new_weights(like if like is not None else params[names[0]], stream=stream)
    launch, (vw,) = prepare(("w", w), stream=stream)
    if launch.adapter is None:
        raise TypeError("w must be an array of a library with a cudnnkit adapter (CuPy or torch)")
    pieces = _torch_layout(rnn, w, stream)
    shapes = _torch_shapes(pieces)
    for name in names:  # every parameter checked before the first copy
        vs = views[name]
        if vs.shape != shapes[name]:
            raise ValueError(f"{labels[name]} has shape {vs.shape}; this RNN's torch layout needs {shapes[name]}")
        if vs.device != launch.device or vs.adapter is not launch.adapter:
            raise ValueError(
                f"{labels[name]} is a {vs.library} array on cuda:{vs.device}; w is a {vw.library} array on "
                f"cuda:{launch.device}: pass parameters of w's library and device"
            )
    for name, view, row in pieces:
        launch.adapter.copy(view, params[name][row : row + view.shape[0]], launch.stream)
    return w


def _torch_shapes(pieces: list[tuple[str, Any, int]]) -> dict[str, tuple[int, ...]]:
    """Each torch parameter's shape: the pieces' rows stacked (gates), their columns."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, view, row in pieces:
        vs = tuple(view.shape)
        prev = shapes.get(name, (0,) + vs[1:])
        shapes[name] = (max(prev[0], row + vs[0]),) + vs[1:]
    return shapes


def to_torch_params(rnn: RNN, w: Any, *, stream: Any = None) -> dict[str, Any]:
    """The parameters in torch's layout (see :func:`load_torch_params`): name -> new array of ``w``'s library.

    The pieces ``cudnnGetRNNWeightParams`` locates in ``w`` are copied (the array library's copy, on ``stream``)
    into new arrays of torch's shapes. With torch tensors, ``module.load_state_dict(to_torch_params(rnn, w),
    strict=False)`` (or copying into each parameter) loads them into a matching ``torch.nn.LSTM``/``GRU``/``RNN``.

    Args:
        rnn: the :class:`RNN` (``input_mode="linear"``, ``bias_mode`` ``"double"`` or ``"none"``).
        w: the flat weight space, a CuPy or torch array of ``rnn.dtype``.
        stream: the stream of the copies; None: the library's current stream.

    Returns:
        A dict of :func:`torch_param_names` -> new arrays of ``w``'s library and ``rnn.dtype``.

    Raises:
        TypeError: ``rnn`` not an :class:`RNN`, or ``w`` of a library without a cudnnkit adapter.
        ValueError: a config torch's modules cannot express.

    Example:
        >>> lstm.load_state_dict(ops.to_torch_params(rnn, w), strict=False)
    """
    launch, (vw,) = prepare(("w", w), stream=stream)
    if launch.adapter is None:
        raise TypeError("w must be an array of a library with a cudnnkit adapter (CuPy or torch)")
    pieces = _torch_layout(rnn, w, stream)
    shapes = _torch_shapes(pieces)
    out = {n: launch.empty(shapes[n], rnn.dtype, name=n)[0] for n in torch_param_names(rnn)}
    for name, view, row in pieces:
        launch.adapter.copy(out[name][row : row + view.shape[0]], view, launch.stream)
    return out


# ----------------------------------------------------------------- the L3 declaration
#
# "rnn": inputs (x, w, hx, cx), outputs (out, hy, cy), no arrays. The outputs are static: cy is the LSTM's cell
# state, and for the other cells (which have none) a new empty (0,) array of rnn.dtype. The forward always runs
# cuDNN's training mode, whose reserve space the backward needs; ``training`` keeps rnn_forward's meaning (the
# config's dropout between layers applies in training only: training=False runs the config with dropout=0, the
# same weights and descriptor otherwise). Residuals, in order: x, w, hx (if given), cx (if given), out, reserve.


def _l3_config(rnn: Any, training: Any) -> RNN:
    """The config the L3 forward (and its backward) runs: ``rnn``, with its dropout off unless ``training``."""
    if not isinstance(rnn, RNN):
        raise TypeError(f"rnn must be a cudnnkit.ops.RNN config, got {type(rnn).__name__}")
    if not isinstance(training, bool):
        raise TypeError(f"training must be a bool, got {training!r}")
    return rnn if training or rnn.dropout == 0 else replace(rnn, dropout=0.0)


def _l3_impure(kw: dict, arrays: dict) -> str | None:
    rnn = kw.get("rnn")
    if kw.get("training") is True and isinstance(rnn, RNN) and rnn.dropout > 0:
        return (f"training with dropout={rnn.dropout} draws its masks from the RNN's dropout state, which each "
                "call advances; run single-layer calls with cudnnkit.jax.nn.dropout (an explicit key) between them")  # fmt: skip
    return None


def _l3_residuals(x: Any, w: Any, hx: Any, cx: Any, y: Any, reserve: Any) -> dict[str, Any]:
    res = {"x": x, "w": w}
    if hx is not None:
        res["hx"] = hx
    if cx is not None:
        res["cx"] = cx
    res["out"], res["reserve"] = y, reserve
    return res


def _l3_forward(x: Any, w: Any, hx: Any = None, cx: Any = None, *, rnn: RNN, training: bool = False,
                layout: str = "seq_major", seq_lengths: Any = None, padding_fill: float = 0.0) -> Any:  # fmt: skip
    cfg = _l3_config(rnn, training)
    y, hy, cy, reserve = rnn_forward(x, w, hx, cx, rnn=cfg, training=True, layout=layout, seq_lengths=seq_lengths,
                                     padding_fill=padding_fill)  # fmt: skip
    if cy is None:  # no cell state: an empty array, so that every config has the same three outputs
        launch, _ = prepare(("hy", hy))
        cy = launch.empty((0,), cfg.dtype, name="cy")[0]
    return (y, hy, cy), _l3_residuals(x, w, hx, cx, y, reserve)


def _l3_zeros_like(a: Any, name: str) -> Any:
    """A zero cotangent shaped like ``a`` (a new array of its library, cuMemsetD8Async)."""
    launch, (v,) = prepare((name, a))
    z, vz = launch.empty(v.shape, v.dtype, name=name)
    with launch.on_device():
        driver.memset_async(vz.ptr, math.prod(v.shape) * itemsize(v.dtype), launch.stream)
    return z


def _l3_backward(res: Any, douts: Any, needs: Any, *, rnn: RNN, training: bool = False, layout: str = "seq_major",
                 seq_lengths: Any = None, padding_fill: float = 0.0, residuals_copied: bool = False) -> tuple:  # fmt: skip
    """One :func:`rnn_backward` (see RNN_OP's doc); ``residuals_copied``: the reserve is the integration's copy of
    the forward's (JAX), so the reserve ledger, keyed by the forward's address, cannot know it: it is passed as
    ``trusted_reserve``."""
    if not isinstance(residuals_copied, bool):
        raise TypeError(f"residuals_copied must be a bool, got {residuals_copied!r}")
    cfg = _l3_config(rnn, training)
    dy, dhy, dcy = douts
    if cfg.cell != "lstm":
        dcy = None  # the empty stand-in output carries nothing
    if not any(needs) or (dy is None and dhy is None and dcy is None):
        return (None,) * 4
    if dy is None:
        dy = _l3_zeros_like(res["out"], "dy")
    hx, cx = res.get("hx"), res.get("cx")
    # keep_reserve: cuDNN's backward overwrites the reserve, and a retained graph (gradcheck) differentiates again
    # (an XLA operand is never written); trusted_reserve: an integration that copied the residuals says so
    dx, dhx, dcx, dw = rnn_backward(res["x"], res["out"], dy, res["w"], res["reserve"], hx, cx, dhy, dcy, rnn=cfg,
                                    layout=layout, seq_lengths=seq_lengths, keep_reserve=True,
                                    trusted_reserve=residuals_copied)  # fmt: skip
    return tuple(g if need else None for g, need in zip((dx, dw, dhx, dcx), needs))


class _Shaped(NamedTuple):
    """What :func:`_seq_lengths` reads of x (a :class:`~cudnnkit.ops._diff.Spec` has no ``ndim``)."""

    shape: tuple[int, ...]
    ndim: int


def _l3_device_sizes(cfg: RNN, layout: str, seq: _Seq, fill: float) -> tuple[int, int]:
    """(weight count, training reserve bytes) of ``cfg`` for these sequences on the current device of the first
    array library in use: ``cudnnGetRNNWeightSpaceSize`` and ``cudnnGetRNNTempSpaceSizes`` (host-side queries
    with the thread's handle), for the algorithm the forward runs; the same cached :class:`_Built` the calls use.
    A config with dropout builds its descriptor with the device's dropout RNG states (made there once, as the
    first forward would)."""
    ad = adapters.first_available()
    if ad is None:
        raise RuntimeError("the RNN's reserve size is a cuDNN query on a device: it needs CuPy or torch")
    dev = ad.current_device()
    launch = Launch(dev, ad, ad.current_stream(dev), ("x", "w"))
    like = launch.empty((1,), "uint8", name="like")[0] if cfg.dropout > 0 else None
    b = cfg._built(launch, like)
    algo = b.choose(launch, seq, True)
    padded, xd, _ = _dual(cfg, layout, seq, fill)
    with launch.on_device():
        return b.weight_bytes // itemsize(cfg.dtype), b.temp_sizes(launch, padded, True, xd, algo)[1]


def _l3_meta(x: Spec, w: Spec, hx: Spec | None = None, cx: Spec | None = None, *, rnn: RNN, training: bool = False,
             layout: str = "seq_major", seq_lengths: Any = None, padding_fill: float = 0.0) -> Any:  # fmt: skip
    cfg = _l3_config(rnn, training)
    _resolve(cfg, layout)
    fill = _check_fill(padding_fill, cfg.dtype)
    _check_data(x, cfg, "x")
    seq = _seq_lengths(layout, _Shaped(tuple(x.shape), len(x.shape)), seq_lengths, cfg.input_size)
    _check_algo_lengths(cfg, seq, layout)
    if cx is not None and cfg.cell != "lstm":
        raise ValueError(f"cx is the LSTM cell state; a {cfg.cell} RNN has none")
    _check_state(hx, cfg.hidden_shape(seq.N), cfg.dtype, "hx")
    _check_state(cx, cfg.cell_shape(seq.N), cfg.dtype, "cx")
    if w.dtype != cfg.dtype:
        raise TypeError(f"w has dtype {w.dtype} but the RNN's dtype is {cfg.dtype}")
    if len(w.shape) != 1 or not is_contiguous(w.shape, w.strides):
        raise ValueError(f"w must be a contiguous 1-d array (the flat weight space), got shape {w.shape} strides "
                         f"{w.strides}")  # fmt: skip
    count, rs_bytes = _l3_device_sizes(cfg, layout, seq, fill)
    if w.shape[0] < count:
        raise ValueError(f"w has {w.shape[0]} elements but this RNN's weight space needs {count} (RNN.weight_count)")

    def new(shape: tuple[int, ...], dtype: str = cfg.dtype) -> Spec:
        return Spec(shape, contiguous_strides(shape), dtype)

    y = new(_seq_shape(layout, seq, cfg.num_directions * cfg.output_size))
    cy = new(cfg.cell_shape(seq.N) if cfg.cell == "lstm" else (0,))
    return (y, new(cfg.hidden_shape(seq.N)), cy), _l3_residuals(x, w, hx, cx, y, new((rs_bytes,), "uint8"))


RNN_OP = differentiable(
    Differentiable("rnn", "rnn_forward", ("x", "w", "hx", "cx"), ("out", "hy", "cy"), _l3_forward, _l3_backward,
                   _l3_meta, impure=_l3_impure, doc="""The RNN of an RNN config over x (cudnnRNNForward, training mode): outputs
out (y: x's layout with last dim D * P), hy (L * D, N, P) and cy (L * D, N, H) for an LSTM, an empty (0,) array
for the other cells (so every config has three outputs). Inputs x (T, N, I) / (N, T, I) / (sum(lengths), I) per
layout, w the flat weight buffer (RNN.weight_count elements; load_torch_params fills it from torch's layout), hx
and cx (LSTM) optional (None: zeros), all of rnn.dtype. Keywords rnn (the config, passed by key through the torch
layer), training (dropout between layers; False runs the config with dropout=0), layout, seq_lengths (host ints:
pass a tuple), padding_fill. Residuals x, w, hx, cx (those given), out and reserve (uint8,
cudnnGetRNNTempSpaceSizes' training reserve bytes: meta asks cuDNN on the current device). Backward: one
rnn_backward call, cudnnRNNBackwardData_v8 then cudnnRNNBackwardWeights_v8, on a copy of the reserve
(keep_reserve: a retained graph can be differentiated again); dy None is zeros, dhy/dcy None are zero. The reserve
is a tracked residual: an integration that copies residuals (JAX) passes residuals_copied=True, and the backward
takes the copy as the forward's reserve (trusted_reserve).""", tracked_residuals=("reserve",))
)  # fmt: skip
