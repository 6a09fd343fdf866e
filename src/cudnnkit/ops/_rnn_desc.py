"""The RNN's cuDNN objects, below :mod:`cudnnkit.ops.rnn`: the RNN descriptor of a config on a device (``_Built``:
one ``cudnnRNNDescriptor_t`` per padded-I/O flag and algorithm, the weight space's size and layout, the temp-space
sizes, and ``algo="auto"``'s decisions), the per-call RNN data descriptors and sequence lengths (host checks, the
cached device copy), ``algo="auto"``'s rule (:func:`_auto_algo`), the reserve ledger, and the messages a cuDNN
NOT_SUPPORTED gets. :mod:`cudnnkit.ops.rnn` holds the config (:class:`~cudnnkit.ops.rnn.RNN`), the calls and
their checks, the declarations and the torch parameter layout."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import threading
from typing import Any, NamedTuple

import numpy as np

from .. import lib
from ..lib.errors import NotSupportedError
from ..runtime import DescriptorKind, cudnn_dtype, driver, get_cached, owned_descriptor, tensor_descriptor
from ..runtime.arrays import ArrayView, contiguous_strides
from ..runtime.cache import LRU, MISSING
from ..runtime.descriptors import int_array
from ..runtime.dtypes import itemsize
from .dropout import DropoutState, _ledger

#: an RNN config, :class:`cudnnkit.ops.rnn.RNN` (not imported: this module sits below it)
RNN = Any

_log = logging.getLogger("cudnnkit")
_INT32_P = ctypes.POINTER(ctypes.c_int32)

_CELLS = {"relu": lib.CUDNN_RNN_RELU, "tanh": lib.CUDNN_RNN_TANH, "lstm": lib.CUDNN_LSTM, "gru": lib.CUDNN_GRU}
_INPUT_MODES = {"linear": lib.CUDNN_LINEAR_INPUT, "skip": lib.CUDNN_SKIP_INPUT}
_BIAS_MODES = {
    "double": lib.CUDNN_RNN_DOUBLE_BIAS,
    "single_input": lib.CUDNN_RNN_SINGLE_INP_BIAS,
    "single_recurrent": lib.CUDNN_RNN_SINGLE_REC_BIAS,
    "none": lib.CUDNN_RNN_NO_BIAS,
}
_ALGOS = {
    "standard": lib.CUDNN_RNN_ALGO_STANDARD,
    "persist_static": lib.CUDNN_RNN_ALGO_PERSIST_STATIC,
    "persist_dynamic": lib.CUDNN_RNN_ALGO_PERSIST_DYNAMIC,
    "persist_static_small_h": lib.CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H,
}
#: what ``RNN(algo=...)`` takes: "auto" (the default, see :func:`_auto_algo`) or one of cuDNN's algorithms
_ALGO_CHOICES = ("auto", *_ALGOS)
_MATH = {
    "default": lib.CUDNN_DEFAULT_MATH,
    "tensor_op": lib.CUDNN_TENSOR_OP_MATH,
    "tensor_op_allow_conversion": lib.CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
    "fma": lib.CUDNN_FMA_MATH,
}
_LAYOUTS = {
    "seq_major": lib.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED,
    "batch_major": lib.CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED,
    "packed": lib.CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED,
}
# the data type / math precision pairs cudnnSetRNNDescriptor_v8 accepts (cuDNN 9.19, probed)
_PRECISIONS = {"float16": ("float16", "float32"), "float32": ("float32",), "float64": ("float64",)}


_dropout_states: dict[tuple, DropoutState] = {}


def _dropout_state(rnn: RNN, launch: Any, like: Any) -> DropoutState:
    key = (rnn.dropout, rnn.dropout_seed, launch.device, threading.get_ident())
    with _lock:
        st = _dropout_states.get(key)
    if st is None:
        if launch.adapter is None:
            raise TypeError(
                "an RNN with dropout needs arrays of a library with a cudnnkit adapter (CuPy or torch) to "
                "hold its RNG states"
            )
        st = DropoutState(like, rnn.dropout_seed, stream=launch.stream)
        with launch.on_device():
            st._use(rnn.dropout, launch.handle)
        with _lock:
            st = _dropout_states.setdefault(key, st)
    return st


_MAX_BUILT = 64
_MAX_TEMP = 256
_built: LRU[tuple, _Built] = LRU("rnn.built", _MAX_BUILT)  # by (config, device, math mode, thread with dropout)
_lock = threading.Lock()  # guards _dropout_states


class _Built:
    """The RNN descriptors of one config on one device (one per padded-I/O flag and algorithm), with what cuDNN
    told about them: the weight space size and layout (the base algorithm's: the config's, "standard" for
    "auto"), the temp-space sizes, and for "auto" its decisions and which persistent algorithms may stand in."""

    def __init__(self, rnn: RNN, launch: Any, like: Any, math_mode: tuple[str, str]):
        self.rnn = rnn
        self.lock = threading.RLock()
        self.dropout = _dropout_state(rnn, launch, like) if rnn.dropout > 0 else None
        self.math_mode = math_mode
        self.base = "standard" if rnn.algo == "auto" else rnn.algo
        self._descs: dict[tuple[bool, str], Any] = {}
        self.dyn_batch: dict[bool, int] = {}
        self.temp: LRU[tuple, tuple[int, int]] = LRU("rnn.temp_sizes", _MAX_TEMP)
        #: algo="auto": shape class -> the algorithm chosen (see :func:`_auto_algo`)
        self.auto: LRU[tuple, str] = LRU("rnn.auto", _MAX_TEMP)
        #: algo="auto": whether cuDNN takes a persistent algorithm for this config with the same weight layout
        self._stand_in: dict[str, bool] = {}
        with launch.on_device(), _explained(rnn, math_mode, algo=self.base):
            desc = self.desc(rnn.padded_io is not False)
            self.weight_bytes = self._weight_bytes(launch, desc)
            self.layout = self._weight_layout(launch, desc)

    @staticmethod
    def _weight_bytes(launch: Any, desc: Any) -> int:
        size = ctypes.c_size_t()
        lib.cudnnGetRNNWeightSpaceSize(launch.handle, desc, ctypes.byref(size))
        return size.value

    def _weight_layout(self, launch: Any, desc: Any) -> list[list[tuple[Any, Any]]]:
        """Per pseudo-layer and linear id: ((offset, (rows, cols)) | None, (offset, rows) | None), in elements.

        cuDNN computes the addresses from a base pointer without touching
        memory, so an aligned stand-in base is used and offsets are taken from it."""
        rnn = self.rnn
        base = 1 << 20
        isz = itemsize(rnn.dtype)
        mdesc = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
        bdesc = owned_descriptor("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor")
        maddr, baddr = ctypes.c_void_p(), ctypes.c_void_p()
        layout = []
        for pl in range(rnn.num_layers * rnn.num_directions):
            ids = []
            for lin_id in range(len(rnn.gates)):
                lib.cudnnGetRNNWeightParams(
                    launch.handle,
                    desc,
                    pl,
                    self.weight_bytes,
                    base,
                    lin_id,
                    mdesc,
                    ctypes.byref(maddr),
                    bdesc,
                    ctypes.byref(baddr),
                )
                m = None if not maddr.value else ((maddr.value - base) // isz, _matrix_dims(mdesc, 2))
                b = None if not baddr.value else ((baddr.value - base) // isz, math.prod(_matrix_dims(bdesc, 3)))
                ids.append((m, b))
            layout.append(ids)
        return layout

    def desc(self, padded: bool, algo: str | None = None) -> Any:
        """The RNN descriptor with padded I/O enabled or not, for ``algo`` (default: the base algorithm); made on
        first use, they share the dropout state."""
        key = (padded, algo or self.base)
        d = self._descs.get(key)
        if d is None:
            with self.lock:
                d = self._descs.get(key)
                if d is None:
                    drop = None if self.dropout is None else self.dropout.desc
                    d = self._descs[key] = rnn_descriptor(self.rnn, self.math_mode, drop, padded, key[1])
        return d

    def stands_in(self, launch: Any, algo: str) -> bool:
        """algo="auto": whether cuDNN accepts ``algo`` for this config and gives it the base algorithm's weight
        space (size and every matrix and bias at the same offset), so that one ``w`` serves both. Asked once."""
        ok = self._stand_in.get(algo)
        if ok is None:
            try:
                with launch.on_device():
                    d = self.desc(self.rnn.padded_io is not False, algo)
                    ok = self._weight_bytes(launch, d) == self.weight_bytes and self._weight_layout(launch, d) == (
                        self.layout
                    )
            except NotSupportedError:
                ok = False
            self._stand_in[algo] = ok
        return ok

    def refused(self, algo: str) -> None:
        """algo="auto": cuDNN refused ``algo`` at a call; the standard algorithm runs this config from now on."""
        self._stand_in[algo] = False
        self.auto.clear()

    def call_lock(self, algo: str) -> Any:
        """Held around :meth:`prepare_call` and the cuDNN call after it: for the persistent-dynamic algorithm the
        descriptor is compiled for one batch size, so another thread must not rebuild it in between."""
        return self.lock if algo == "persist_dynamic" else contextlib.nullcontext()

    def prepare_call(self, launch: Any, padded: bool, batch: int, algo: str) -> Any:
        """The descriptor for the call (under :meth:`call_lock`); ``cudnnBuildRNNDynamic`` first for the
        persistent-dynamic algorithm when the batch size changed."""
        d = self.desc(padded, algo)
        if algo == "persist_dynamic" and batch != self.dyn_batch.get(padded):
            with self.lock:
                if batch != self.dyn_batch.get(padded):
                    with _explained(self.rnn, self.math_mode, f"; cudnnBuildRNNDynamic for a batch of {batch}"):
                        lib.cudnnBuildRNNDynamic(launch.handle, d, batch)
                    self.dyn_batch[padded] = batch
        return d

    def temp_sizes(self, launch: Any, padded: bool, training: bool, xdesc: Any, algo: str) -> tuple[int, int]:
        """(workspace, reserve) bytes from ``cudnnGetRNNTempSpaceSizes``, cached (LRU) per mode, x descriptor and
        algorithm."""
        key = (padded, training, xdesc.key, algo)
        got = self.temp.lookup(key)
        if got is not MISSING:
            return got
        ws, rs = ctypes.c_size_t(), ctypes.c_size_t()
        mode = lib.CUDNN_FWD_MODE_TRAINING if training else lib.CUDNN_FWD_MODE_INFERENCE
        with _explained(self.rnn, self.math_mode, f"; padded I/O {padded}, training={training}", algo):
            lib.cudnnGetRNNTempSpaceSizes(
                launch.handle, self.desc(padded, algo), mode, xdesc, ctypes.byref(ws), ctypes.byref(rs)
            )
        return self.temp.put(key, (ws.value, rs.value), count_miss=True)

    def choose(self, launch: Any, seq: _Seq, training: bool) -> str:
        """The algorithm a call runs: the config's, or for "auto" :func:`_auto_algo`'s choice for this shape class
        (batch, length class, training, full-length or not), decided once and kept."""
        if self.rnn.algo != "auto":
            return self.rnn.algo
        full = seq.full
        key = (seq.N, seq.T.bit_length(), training, full)
        got = self.auto.lookup(key)
        if got is MISSING:
            for algo in _auto_algo(self.rnn, seq.N, seq.T, training, full, self.math_mode):
                if algo == "standard" or self.stands_in(launch, algo):
                    break
            got = self.auto.put(key, algo, count_miss=True)
            _log.debug("rnn: algo='auto' chose %r for %s, batch %d, T %d, training=%s", got, self.rnn, seq.N,
                       seq.T, training)  # fmt: skip
        return got


def rnn_descriptor(
    rnn: RNN,
    math_mode: tuple[str, str] | None = None,
    dropout: Any = None,
    padded_io: bool | None = None,
    algo: str | None = None,
) -> Any:
    """A new ``cudnnRNNDescriptor_t`` for ``rnn`` (``cudnnSetRNNDescriptor_v8``, then ``cudnnRNNSetClip_v9``
    with ``cell_clip``). ``math_mode``: (precision, math type), default :meth:`RNN.resolved_math`; ``dropout``: a
    dropout descriptor or None; ``padded_io``: the aux flag (default: ``rnn.padded_io``, None meaning enabled);
    ``algo``: a cuDNN algorithm (default ``rnn.algo``, "standard" for "auto"). Host-side only (no handle): what
    ops use through their per-device cache."""
    if padded_io is None:
        padded_io = rnn.padded_io is not False
    if algo is None:
        algo = "standard" if rnn.algo == "auto" else rnn.algo
    prec, mt = math_mode or rnn.resolved_math()
    desc = owned_descriptor("cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor")
    try:
        lib.cudnnSetRNNDescriptor_v8(
            desc,
            _ALGOS[algo],
            _CELLS[rnn.cell],
            _BIAS_MODES[rnn.bias_mode],
            lib.CUDNN_BIDIRECTIONAL if rnn.bidirectional else lib.CUDNN_UNIDIRECTIONAL,
            _INPUT_MODES[rnn.input_mode],
            cudnn_dtype(rnn.dtype),
            cudnn_dtype(prec),
            _MATH[mt],
            rnn.input_size,
            rnn.hidden_size,
            rnn.output_size,
            rnn.num_layers,
            dropout,
            lib.CUDNN_RNN_PADDED_IO_ENABLED if padded_io else lib.CUDNN_RNN_PADDED_IO_DISABLED,
        )
    except NotSupportedError as e:
        raise _not_supported(rnn, e, (prec, mt), algo=algo) from None
    if rnn.cell_clip is not None:
        lib.cudnnRNNSetClip_v9(desc, lib.CUDNN_RNN_CLIP_MINMAX, *rnn.cell_clip)
    return desc


def _not_supported(
    rnn: RNN, e: NotSupportedError, math_mode: tuple[str, str] | None = None, call: str = "", algo: str | None = None
) -> NotSupportedError:
    """``e`` (a cuDNN NOT_SUPPORTED for an RNN) again, with a message naming every config field and, in ``call``,
    what the call that failed was given (layout, batch, lengths); ``algo``: the algorithm the call ran."""
    prec, mt = math_mode or rnn.resolved_math()
    algo = algo or rnn.algo
    hint = ""
    if algo == "persist_dynamic":
        hint = (
            " (algo='persist_dynamic' compiles its kernels at run time with NVRTC, which must be loadable, and has "
            "size limits that depend on the GPU; its descriptor is accepted before that, so such limits show only "
            "at the first call; algo='standard' supports every configuration)"
        )
    elif algo not in ("standard", "auto"):
        hint = (
            " (the persistent algorithms refuse, among others, bias_mode='single_recurrent' and float16 math "
            "precision in cuDNN 9.19, and have size limits that depend on the GPU; algo='standard' supports every "
            "cell, bias and input mode)"
        )
    return NotSupportedError(
        e.status,
        e.function,
        f"cuDNN does not support this RNN: algo={algo!r}"
        + (" (chosen by algo='auto')" if rnn.algo == "auto" and algo != "auto" else "")
        + f", dtype={rnn.dtype}, math precision {prec}, math type "
        f"{mt!r}, bias_mode={rnn.bias_mode!r}, cell={rnn.cell!r}, input_mode={rnn.input_mode!r}, "
        f"input_size={rnn.input_size}, hidden_size={rnn.hidden_size}, proj_size={rnn.proj_size}, "
        f"num_layers={rnn.num_layers}, bidirectional={rnn.bidirectional}, dropout={rnn.dropout}, "
        f"padded_io={rnn.padded_io}{call}{hint}" + (f"; cuDNN: {e.last_error}" if e.last_error else ""),
    )


@contextlib.contextmanager
def _explained(rnn: RNN, math_mode: tuple[str, str] | None = None, call: str = "", algo: str | None = None):
    """Turn a bare NOT_SUPPORTED from the RNN calls inside into :func:`_not_supported`'s message."""
    try:
        yield
    except NotSupportedError as e:
        if "cuDNN does not support this RNN" in str(e):
            raise
        raise _not_supported(rnn, e, math_mode, call, algo) from None


def _matrix_dims(desc: Any, n: int) -> tuple[int, ...]:
    """The last ``n`` dims of a (packed) tensor descriptor cuDNN filled in."""
    dt, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    lib.cudnnGetTensorNdDescriptor(desc, 8, ctypes.byref(dt), ctypes.byref(nb), dims, strides)
    d = tuple(dims[: nb.value])
    if tuple(strides[: nb.value]) != contiguous_strides(d):
        raise RuntimeError(
            f"cuDNN reported an RNN weight of dims {d} with strides {tuple(strides[: nb.value])}, "
            "not the packed row-major layout cudnnkit expects"
        )
    return d[-n:]


# --------------------------------------------------------------------- data descriptors


def _set_rnn_data(
    ptr: int, dtype: str, layout: str, T: int, N: int, vec: int, lengths: tuple[int, ...], fill: bytes
) -> None:
    lib.cudnnSetRNNDataDescriptor(
        ptr,
        cudnn_dtype(dtype),
        _LAYOUTS[layout],
        T,
        N,
        vec,
        int_array(lengths, "seq_lengths"),
        ctypes.create_string_buffer(fill, len(fill)),
    )


def _fill_bytes(dtype: str, fill: float) -> bytes:
    """The padding fill as cuDNN reads it (a host value of the data type); bytes also make a NaN-stable cache key."""
    return np.array([fill], dtype=np.dtype(dtype)).tobytes()


#: ``cudnnRNNDataDescriptor_t`` keyed by (dtype, layout, T, N, vector size, lengths, padding fill bytes)
RNN_DATA = DescriptorKind("rnn_data", "cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor", _set_rnn_data)


class _Seq(NamedTuple):
    T: int
    N: int
    lengths: tuple[int, ...]
    values: np.ndarray
    #: every sequence has the full length T
    full: bool


def _seq_lengths(layout: str, vx: ArrayView, seq_lengths: Any, input_size: int) -> _Seq:
    """T, N and the per-sample lengths, checked against x's shape and layout."""
    want = {
        "seq_major": "(T, N, input_size)",
        "batch_major": "(N, T, input_size)",
        "packed": "(sum(seq_lengths), input_size)",
    }[layout]
    if vx.ndim != (2 if layout == "packed" else 3):
        raise ValueError(f"x must be {want} for layout={layout!r}, got shape {vx.shape}")
    if vx.shape[-1] != input_size:
        raise ValueError(f"x has feature size {vx.shape[-1]} but the RNN's input_size is {input_size}")
    if seq_lengths is None:
        if layout == "packed":
            raise ValueError("layout='packed' needs seq_lengths (the batch's lengths, in decreasing order)")
        T, N = (vx.shape[0], vx.shape[1]) if layout == "seq_major" else (vx.shape[1], vx.shape[0])
        values = np.full(N, T, np.int32)
    else:
        try:
            a = np.asarray(seq_lengths)
        except Exception as e:
            raise TypeError(
                f"seq_lengths must be a host sequence or NumPy array of ints, got {type(seq_lengths).__name__}"
            ) from e
        if a.dtype.kind not in "iu" or a.ndim != 1:
            raise TypeError(
                f"seq_lengths must be a 1-d host array of ints, got {a.dtype} {a.shape} (cudnnkit makes the "
                f"device copy cuDNN needs itself, once per lengths)"
            )
        values = a.astype(np.int64)
        N = values.shape[0]
        if layout == "packed":
            T = int(values.max()) if N else 0
            if vx.shape[0] != int(values.sum()):
                raise ValueError(f"packed x has {vx.shape[0]} rows but sum(seq_lengths) is {int(values.sum())}")
            if N and np.any(np.diff(values) > 0):
                raise ValueError(
                    "layout='packed' needs seq_lengths in decreasing order (sort the batch by length, "
                    "as torch.nn.utils.rnn.pack_padded_sequence does)"
                )
        else:
            T, n = (vx.shape[0], vx.shape[1]) if layout == "seq_major" else (vx.shape[1], vx.shape[0])
            if n != N:
                raise ValueError(f"seq_lengths has {N} values but x has a batch of {n}")
        bad = np.flatnonzero((values < 1) | (values > T))
        if bad.size:
            raise ValueError(f"seq_lengths[{bad[0]}] is {values[bad[0]]}; each length must be in [1, T={T}]")
        values = values.astype(np.int32)
    if N == 0 or T == 0:
        raise ValueError(f"x has shape {vx.shape}: an RNN needs at least one sample and one time step")
    lengths = tuple(values.tolist())
    return _Seq(T, N, lengths, values, min(lengths) == T)


def _seq_shape(layout: str, seq: _Seq, vec: int) -> tuple[int, ...]:
    if layout == "packed":
        return (int(seq.values.sum()), vec)
    return (seq.T, seq.N, vec) if layout == "seq_major" else (seq.N, seq.T, vec)


#: ``algo="auto"``'s persistent-static rule: the largest gates x batch x hidden size (``G * N * H``, G = 4 LSTM,
#: 3 GRU, 1 RELU/TANH) at which it beat the standard algorithm, per (dtype, training), measured on an H200 with
#: cuDNN 9.19 at T=100 over every cell, H 128-1024, N 1-256, 1 layer and 2 bidirectional layers
#: (``benchmarks/NOTES.md``, "RNN algo='auto'")
_AUTO_WORK = {("float16", False): 1 << 18, ("float16", True): 1 << 18, ("float32", False): 1 << 14,
              ("float32", True): 3 << 12}  # fmt: skip
_GATES = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}


def _auto_algo(rnn: RNN, N: int, T: int, training: bool, full: bool, math_mode: tuple[str, str]) -> tuple[str, ...]:
    """What ``algo="auto"`` may run for a call, best first: the first one cuDNN accepts for the config is used
    ("standard", always last, takes everything).

    Persistent kernels keep the recurrent weights on chip for all T steps, where the standard algorithm launches
    kernels per step (so on small batches it is bound by launches: about 1.4 ms for 100 steps, whatever the size).
    cuDNN's persistent algorithms take only full-length batches, float16/float32 data, no projection, double bias
    and float32 math (cuDNN 9.19 refuses the rest, and more size limits show only at the call). Measured
    (``benchmarks/NOTES.md``, "RNN algo='auto'"): the small-hidden-size variant is the fastest wherever cuDNN
    takes it (hidden size 128 and below) for batches of 2 and more; the persistent-static one is faster than
    the standard one up to a work size per step, ``_AUTO_WORK``."""
    if not full or rnn.proj_size or rnn.bias_mode != "double" or math_mode[0] == "float16":
        return ("standard",)
    if rnn.dtype not in ("float16", "float32"):
        return ("standard",)
    got: list[str] = []
    if rnn.hidden_size <= 128 and N >= 2:
        got.append("persist_static_small_h")
    if _GATES[rnn.cell] * N * rnn.hidden_size <= _AUTO_WORK[(rnn.dtype, training)]:
        got.append("persist_static")
    return (*got, "standard")


_LENGTHS_MAX = 256
#: (device, stream, lengths) -> the upload. An evicted one is only dropped: it is freed (``cuMemFree``) when the
#: last call holding it lets go, so no call that looked it up can see its memory reused
_lengths: LRU[tuple, Any] = LRU("rnn.lengths", _LENGTHS_MAX)
#: uploads a CUDA graph captured (its replays read them): kept for the process, never evicted or cleared
_captured: dict[tuple, Any] = {}
_captured_lock = threading.Lock()


def _dev_lengths(launch: Any, seq: _Seq) -> tuple[Any, Any]:
    """cuDNN's device copy of the lengths, as (owner, ``int32_t *``): a cached upload, made once per lengths,
    device and stream (a host-to-device copy from pageable memory waits for the stream) and never written again.
    The lengths cuDNN reads on the device are therefore always the host ``seq_lengths`` that the call was checked
    with: there is no separate device argument that could disagree with them.

    The upload is :class:`cudnnkit.runtime.driver.DeviceValues` memory, owned by no array library: a cached
    torch tensor would sit in torch's CUDA-graph pool under ``torch.compile(mode="reduce-overhead")``, which
    refuses it. Under a CUDA-graph capture (``cuStreamIsCapturing``) a cached upload is used and kept for the
    process (the graph's replays read it after the call): this stream's, or one made on another stream whose
    upload has completed (``cuEventQuery``: ``torch.cuda.make_graphed_callables`` warms up on a side stream and
    captures on another). Lengths with no completed upload cannot be uploaded in a capture (the copy is not
    capturable), so the call is refused: run it once before capturing, as CUDA-graph warm-ups do."""
    key = (launch.device, launch.stream, seq.lengths)
    hit = _captured.get(key) or _lengths.lookup(key)
    capturing = driver.stream_capturing(launch.stream, launch.device)
    if hit is MISSING and capturing:
        hit = next((v for k, v in list(_captured.items()) + [(k, _lengths.peek(k)) for k in _lengths.keys()]
                    if k[0] == launch.device and k[2] == seq.lengths and v is not None and v.ready()), MISSING)  # fmt: skip
        if hit is MISSING:
            raise RuntimeError(
                f"rnn: seq_lengths {list(seq.lengths)} were first seen while stream {launch.stream:#x} captures a "
                "CUDA graph; their device copy cannot be made in a capture. Run this call once before capturing "
                "(a warm-up, as torch.cuda.graphs and torch.compile(mode='reduce-overhead') do)"
            )
    if hit is MISSING:
        hit = _lengths.put(key, driver.DeviceValues(seq.values, launch.device, launch.stream), count_miss=True)
    if capturing and key not in _captured:
        with _captured_lock:
            hit = _captured.setdefault(key, hit)
    return hit, ctypes.cast(hit.ptr, _INT32_P)


class _Reserves:
    """Reserve spaces that a training forward made and no backward has used yet, by (device, pointer), with their
    size and the algorithm the forward ran (the backward must run the same one: "auto" may pick either).

    ``cudnnRNNBackwardData_v8`` overwrites the reserve space (measured: a second backward from the same reserve gives
    different, wrong gradients), so each training forward allows one backward unless it keeps the reserve."""

    def __init__(self, maxsize: int = 4096):
        self._d: LRU[tuple[int, int], tuple[int, str, Any]] = _ledger(
            "rnn.reserves", maxsize
        )  # not emptied by clear_caches

    def add(self, device: int, ptr: int, nbytes: int, algo: str, rnn: Any = None) -> None:
        # a new forward's reserve at a freed one's address replaces its record (put keeps an existing value);
        # no other thread can add the same (device, pointer) in between: the memory is this forward's
        self._d.pop((device, ptr))
        self._d.put((device, ptr), (nbytes, algo, rnn))

    def entry(self, device: int, ptr: int, rnn: Any = None) -> tuple[int, str] | None:
        """(bytes, algorithm) of an unused reserve that a forward of ``rnn`` made, else None. A record of another
        config is a freed reserve whose address an unrelated array now has (the fuzzer found one: its
        algorithm, a float32 one, then failed for a float64 config as a bare NOT_SUPPORTED)."""
        got = self._d.lookup((device, ptr))
        if got is MISSING or (rnn is not None and got[2] is not None and got[2] != rnn):
            return None
        return got[0], got[1]

    def take(self, device: int, ptr: int) -> None:
        self._d.pop((device, ptr))


_reserves = _Reserves()


def _dual(rnn: RNN, layout: str, seq: _Seq, fill: float) -> tuple[bool, Any, Any]:
    """(padded I/O or not, the x and y RNN data descriptors) for a call; see ``RNN.padded_io``."""
    packed_in_memory = layout == "packed" or (layout == "seq_major" and seq.full)
    padded = rnn.padded_io is True or (rnn.padded_io is None and not packed_in_memory)
    data = layout if padded or layout == "packed" else "packed"
    fb = _fill_bytes(rnn.dtype, fill)
    xd = get_cached(RNN_DATA, (rnn.dtype, data, seq.T, seq.N, rnn.input_size, seq.lengths, fb))
    yd = get_cached(RNN_DATA, (rnn.dtype, data, seq.T, seq.N, rnn.num_directions * rnn.output_size, seq.lengths, fb))
    return padded, xd, yd


def _call_info(layout: str, seq: _Seq, padded: bool, training: bool) -> str:
    """What a call gave cuDNN, for :func:`_not_supported`."""
    lengths = "all T" if seq.full else f"{min(seq.lengths)} to {seq.T}"
    return (
        f"; the call: layout={layout!r}, batch N={seq.N}, T={seq.T}, sequence lengths {lengths}, padded I/O "
        f"{padded}, training={training}"
    )


def _hc_descs(rnn: RNN, N: int):
    hs, cs = rnn.hidden_shape(N), rnn.cell_shape(N)
    return (
        tensor_descriptor(rnn.dtype, hs, contiguous_strides(hs), min_dims=3),
        tensor_descriptor(rnn.dtype, cs, contiguous_strides(cs), min_dims=3),
    )
