"""Recurrent networks for JAX: ``lstm``, ``gru`` and ``rnn`` as functions of a params pytree, by cuDNN's RNN (the
L3 ``rnn`` op, :func:`cudnnkit.jax.op` ``("rnn")``: one ``cudnnRNNForward`` over the whole sequence, every layer and
direction; the gradient by ``cudnnRNNBackwardData_v8`` and ``cudnnRNNBackwardWeights_v8``). Exported from
:mod:`cudnnkit.jax.nn`.

**The params pytree.** ``params[layer][direction]`` (a list of layers, each a list of one direction, or two for a
bidirectional network: forward then reverse) is a dict of arrays, torch's names and shapes (``G`` gates: 4 for an
LSTM, gates ``i, f, g, o``; 3 for a GRU, ``r, z, n``; 1 for ``rnn``; ``H`` the hidden size, ``P`` the output size
(``H``, or ``proj_size`` for an LSTM with ``w_hr``), ``I_l`` the layer's input size: the input's features in layer
0, ``D * P`` after it):

==========  ================  =====================================================================
key         shape             what
==========  ================  =====================================================================
``w_ih``    ``(G * H, I_l)``  the input-side matrices of the gates, stacked in gate order
``w_hh``    ``(G * H, P)``    the recurrent-side matrices
``b_ih``    ``(G * H,)``      input-side biases (optional)
``b_hh``    ``(G * H,)``      recurrent-side biases (optional)
``w_hr``    ``(P, H)``        LSTM only, optional: the recurrent projection (``proj_size = P < H``)
==========  ================  =====================================================================

The architecture comes from the pytree: ``num_layers`` is its length, ``bidirectional`` two entries per layer,
the sizes its shapes, the bias mode which biases are present (both: cuDNN's ``double``, torch's ``bias=True``;
``b_hh`` alone: ``single_recurrent``, what flax's cells have; ``b_ih`` alone: ``single_input``; neither:
``none``), the same in every layer. :func:`init_params` makes one (torch's initialisation), :func:`config` gives
the :class:`cudnnkit.ops.RNN` it describes. Gate order and matrix orientation are torch's
(``cudnnkit.ops.load_torch_params``), which are cuDNN's: ``{k: jnp.asarray(v.detach().cpu()) for ...}`` of a
``torch.nn.LSTM``'s ``weight_ih_l0`` ... is layer 0's dict.

**The flat weight buffer.** cuDNN reads the weights from one 1-d buffer; :func:`pack_params` makes it from the
pytree (``jnp.concatenate`` of the pieces at cuDNN's offsets, zeros in any gap: differentiable, so the gradient
of the buffer flows back to the pytree), :func:`unpack_params` takes it apart again. The offsets are cuDNN's
(``cudnnGetRNNWeightParams``, asked once per config on the current CUDA device); on a machine without a CUDA
device (tracing, the CPU tests) they follow the layout cuDNN 9 was measured to use (:func:`weight_layout`). The
functions below pack inside the traced function, so ``jax.grad`` with respect to the pytree works.

**Calls.** ``lstm(params, x, h0=None, c0=None) -> (y, (h_n, c_n))``, ``gru(params, x, h0=None) -> (y, h_n)``,
``rnn(params, x, h0=None, nonlinearity="tanh") -> (y, h_n)``: ``x`` ``(N, T, I)`` batch-major (flax's
``nn.RNN`` default), or ``(T, N, I)`` with ``time_major=True`` (torch's default); ``y`` in the same layout with
``D * P`` features (the forward direction's first); ``h0``/``h_n`` ``(L * D, N, P)``, ``c0``/``c_n``
``(L * D, N, H)`` (index ``l * D + d``: layer ``l``, direction ``d``), zeros when None. ``seq_lengths``: one length
per sample, host ints (a tuple, or a concrete array): cuDNN's RNN data descriptor takes them on the host, so a
traced array is refused naming the argument; steps past a sample's length give zeros in ``y`` and leave its state
alone, the reverse direction starting from its last valid step. float16, float32 (TF32 as
``cudnnkit.settings(allow_tf32=...)`` says when the function is traced) or float64; cuDNN has no bfloat16 RNN.
Dropout between layers is not offered: cuDNN's RNN dropout keeps RNG state inside the descriptor, which a JAX
function cannot carry; run single-layer calls with :func:`cudnnkit.jax.nn.dropout` between them.

**flax.** :func:`from_flax_lstm` and :func:`to_flax_lstm` convert ``flax.linen.OptimizedLSTMCell`` (and
``LSTMCell``: the same parameters) params, ``{"ii": {"kernel": (I, H)}, "if", "ig", "io", "hi": {"kernel": (H,
H), "bias": (H,)}, "hf", "hg", "ho"}``, to and from a one-layer pytree: the kernels transposed and stacked in gate
order ``i, f, g, o``, the hidden biases as ``b_hh`` (flax's cell has no input bias: cuDNN's ``single_recurrent``
bias mode), exactly. ``nn.RNN(nn.OptimizedLSTMCell(H))`` on ``x`` ``(N, T, I)`` equals ``lstm(from_flax_lstm(
variables["params"]), x)[0]``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..ops.rnn import RNN

__all__ = [
    "lstm",
    "gru",
    "rnn",
    "init_params",
    "config",
    "pack_params",
    "unpack_params",
    "weight_layout",
    "from_flax_lstm",
    "to_flax_lstm",
    "Piece",
]

#: gates per cell
GATES = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}
_KEYS = ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr")
_BIAS_MODES = {(True, True): "double", (False, True): "single_recurrent", (True, False): "single_input",
               (False, False): "none"}  # fmt: skip
#: flax's gate names, in cuDNN's (and torch's) gate order
_FLAX_GATES = ("i", "f", "g", "o")

_TRACER: Any = getattr(getattr(jax, "core", None), "Tracer", ())


class Piece(NamedTuple):
    """One matrix or bias in the flat weight buffer: ``size`` elements at ``offset`` hold rows
    ``row:row + rows`` of ``params[layer][direction][key]`` (C order)."""

    offset: int
    size: int
    layer: int
    direction: int
    key: str
    row: int
    rows: int


# ----------------------------------------------------------------- the config a pytree describes


def _name(layer: int, direction: int, key: str) -> str:
    return f"params[{layer}][{direction}][{key!r}]"


def _cell(cell: str) -> str:
    if cell not in GATES:
        raise ValueError(f"cell must be one of {sorted(GATES)}, got {cell!r}")
    return cell


def _dtype_name(a: Any, what: str) -> str:
    try:
        return jnp.dtype(a.dtype).name
    except AttributeError:
        raise TypeError(f"{what} must be an array, got {type(a).__name__}") from None


def _layers(params: Any) -> list[list[Mapping[str, Any]]]:
    if isinstance(params, Mapping) or not isinstance(params, Sequence) or not len(params):
        raise TypeError("params must be a non-empty list of layers, each a list of one (or, bidirectional, two) "
                        "dicts of arrays (w_ih, w_hh, b_ih, b_hh, w_hr): params[layer][direction]")  # fmt: skip
    out = []
    for i, layer in enumerate(params):
        if isinstance(layer, Mapping) or not isinstance(layer, Sequence) or len(layer) not in (1, 2):
            raise TypeError(f"params[{i}] must be a list of one or two dicts (the directions of layer {i}), got "
                            f"{type(layer).__name__}{'' if not isinstance(layer, Sequence) else f' of {len(layer)}'}")  # fmt: skip
        for d, p in enumerate(layer):
            if not isinstance(p, Mapping):
                raise TypeError(f"params[{i}][{d}] must be a dict of arrays, got {type(p).__name__}")
            extra = sorted(set(p) - set(_KEYS))
            if extra:
                raise ValueError(f"params[{i}][{d}] has keys {extra}; the keys are {list(_KEYS)}")
            for k in ("w_ih", "w_hh"):
                if k not in p:
                    raise ValueError(f"{_name(i, d, k)} is missing (every layer and direction has w_ih and w_hh)")
        out.append(list(layer))
    return out


def config(params: Any, cell: str, *, cell_clip: Any = None, dtype: Any = None) -> RNN:
    """The :class:`cudnnkit.ops.RNN` that ``params`` describes for ``cell`` ("lstm", "gru", "tanh", "relu"),
    every shape and dtype checked (``ValueError``/``TypeError`` naming ``params[layer][direction][key]``).
    ``dtype``: the data's, when it must match (default: ``w_ih``'s of layer 0)."""
    cell = _cell(cell)
    layers = _layers(params)
    G, L, D = GATES[cell], len(layers), len(layers[0])
    for i, layer in enumerate(layers):
        if len(layer) != D:
            raise ValueError(f"params[{i}] has {len(layer)} direction(s) but params[0] has {D}: every layer has the "
                             f"same directions")  # fmt: skip
    first = layers[0][0]
    dt = jnp.dtype(dtype).name if dtype is not None else _dtype_name(first["w_ih"], _name(0, 0, "w_ih"))
    whh = first["w_hh"]
    if len(whh.shape) != 2 or whh.shape[0] % G:
        raise ValueError(f"{_name(0, 0, 'w_hh')} has shape {tuple(whh.shape)}; a {cell} needs ({G} * H, P)")
    H, P = whh.shape[0] // G, int(whh.shape[1])
    proj = P if "w_hr" in first else 0
    if proj and cell != "lstm":
        raise ValueError(f"{_name(0, 0, 'w_hr')}: a projection is for an LSTM only, got cell={cell!r}")
    if not proj and P != H:
        raise ValueError(f"{_name(0, 0, 'w_hh')} has shape {tuple(whh.shape)}: without w_hr it is ({G} * H, H)")
    I0 = first["w_ih"].shape[1] if len(first["w_ih"].shape) == 2 else -1
    bias = ("b_ih" in first, "b_hh" in first)
    for i, layer in enumerate(layers):
        for d, p in enumerate(layer):
            if ("b_ih" in p, "b_hh" in p) != bias or ("w_hr" in p) != bool(proj):
                raise ValueError(f"params[{i}][{d}] has keys {sorted(p)} but params[0][0] has {sorted(first)}: "
                                 "every layer and direction has the same biases and projection")  # fmt: skip
            want = {"w_ih": (G * H, I0 if i == 0 else D * P), "w_hh": (G * H, P), "b_ih": (G * H,),
                    "b_hh": (G * H,), "w_hr": (P, H)}  # fmt: skip
            for k, a in p.items():
                got = tuple(int(s) for s in a.shape)
                if got != want[k]:
                    raise ValueError(f"{_name(i, d, k)} has shape {got}; this {cell} (H={H}, P={P}, layer {i}'s input "
                                     f"{want['w_ih'][1]}) needs {want[k]}")  # fmt: skip
                if _dtype_name(a, _name(i, d, k)) != dt:
                    raise TypeError(f"{_name(i, d, k)} has dtype {_dtype_name(a, '')} but the RNN's is {dt}")
    if I0 < 1:
        raise ValueError(f"{_name(0, 0, 'w_ih')} has shape {tuple(first['w_ih'].shape)}; it is ({G} * H, I)")
    if cell_clip is not None and cell != "lstm":
        raise ValueError(f"cell_clip clips the LSTM cell state; a {cell} has none")
    return RNN(cell, int(I0), int(H), num_layers=L, bidirectional=D == 2, bias_mode=_BIAS_MODES[bias],
               proj_size=int(proj), dtype=dt, cell_clip=cell_clip)  # fmt: skip


# ----------------------------------------------------------------- the flat weight buffer

_layouts: dict[tuple[RNN, str], tuple[int, tuple[Piece, ...]]] = {}
_lock = threading.Lock()


def _key_of(cfg: RNN, lin_id: int, bias: bool) -> tuple[str, int]:
    """(pytree key, first row) of linear id ``lin_id``'s matrix or bias (torch's stacking, cuDNN's gate order)."""
    G = GATES[cfg.cell]
    if lin_id == 2 * G:  # the LSTM projection
        return "w_hr", 0
    side = "ih" if lin_id < G else "hh"
    return f"{'b' if bias else 'w'}_{side}", cfg.hidden_size * (lin_id % G)


def _model_layout(cfg: RNN) -> list[list[tuple[Any, Any]]]:
    """cuDNN 9's flat layout without asking it (no CUDA device), as measured on cuDNN 9.19 (every cell, layers,
    directions, projection, bias mode, dtype: tests/gpu/test_jax_nn_gpu.py): first every matrix, pseudo-layer by
    pseudo-layer (``l * D + d``), each pseudo-layer's linear ids in order (input-side gates, recurrent-side gates,
    the projection); then every bias, in the same order; nothing between them. ``_Built.layout``'s form: per
    pseudo-layer and linear id, ``((offset, (rows, cols)) | None, (offset, rows) | None)``."""
    G, H, P, D = GATES[cfg.cell], cfg.hidden_size, cfg.output_size, cfg.num_directions
    has_b = {"double": (True, True), "single_input": (True, False), "single_recurrent": (False, True),
             "none": (False, False)}[cfg.bias_mode]  # fmt: skip
    n_ids, n_pl = 2 * G + (1 if cfg.proj_size else 0), cfg.num_layers * D
    mats: list[list[Any]] = []
    pos = 0
    for pl in range(n_pl):
        cols_in = cfg.input_size if pl < D else D * P
        row = []
        for lin in range(n_ids):
            shape = (P, H) if lin == 2 * G else (H, cols_in if lin < G else P)
            row.append((pos, shape))
            pos += shape[0] * shape[1]
        mats.append(row)
    out = []
    for pl in range(n_pl):
        biases: list[Any] = []
        for lin in range(n_ids):
            if lin < 2 * G and has_b[lin >= G]:
                biases.append((pos, H))
                pos += H
            else:
                biases.append(None)
        out.append(list(zip(mats[pl], biases)))
    return out


def _cudnn_layout(cfg: RNN) -> tuple[int, list[list[tuple[Any, Any]]]]:
    """(weight count, ``_Built.layout``) from cuDNN on the current device of the first array library in use (the
    host-side queries the L3 op's meta makes too)."""
    from ..runtime import adapters
    from ..runtime.dtypes import itemsize
    from ..runtime.launch import Launch

    ad = adapters.first_available()
    if ad is None:
        raise RuntimeError("the RNN weight layout is a cuDNN query on a device: it needs an array library")
    dev = ad.current_device()
    launch = Launch(dev, ad, ad.current_stream(dev), ("x", "w"))
    b = cfg._built(launch, None)
    return b.weight_bytes // itemsize(cfg.dtype), b.layout


def _has_cuda() -> bool:
    from ..runtime import driver

    try:
        return driver.device_count() > 0
    except Exception:  # no driver at all
        return False


def weight_layout(cfg: RNN, *, source: str = "auto") -> tuple[int, tuple[Piece, ...]]:
    """``(count, pieces)``: the flat weight buffer's length and every matrix and bias in it, in offset order.

    ``source``: ``"cudnn"`` asks cuDNN (``cudnnGetRNNWeightParams`` on the current CUDA device, once per config),
    ``"model"`` computes cuDNN 9's layout without a device (every pseudo-layer's matrices in order, then every
    pseudo-layer's biases in order), ``"auto"`` (the default) asks cuDNN when a CUDA device is present and
    uses the model otherwise (tracing on a machine without one)."""
    if source not in ("auto", "cudnn", "model"):
        raise ValueError(f"source must be 'auto', 'cudnn' or 'model', got {source!r}")
    cfg = replace(cfg, dropout=0.0, dropout_seed=0, algo="auto", cell_clip=None, padded_io=None)
    use = ("cudnn" if _has_cuda() else "model") if source == "auto" else source
    key = (cfg, use)
    with _lock:
        got = _layouts.get(key)
    if got is not None:
        return got
    if use == "cudnn":
        count, lay = _cudnn_layout(cfg)
    else:
        lay = _model_layout(cfg)
        count = 0
        for ids in lay:
            for m, b in ids:
                if m is not None:
                    count = max(count, m[0] + m[1][0] * m[1][1])
                if b is not None:
                    count = max(count, b[0] + b[1])
    D = cfg.num_directions
    pieces = []
    for pl, ids in enumerate(lay):
        for lin, (m, b) in enumerate(ids):
            if m is not None:
                key_, row = _key_of(cfg, lin, False)
                pieces.append(Piece(m[0], m[1][0] * m[1][1], pl // D, pl % D, key_, row, m[1][0]))
            if b is not None:
                key_, row = _key_of(cfg, lin, True)
                pieces.append(Piece(b[0], b[1], pl // D, pl % D, key_, row, b[1]))
    pieces.sort()
    pos = 0
    for p in pieces:
        if p.offset < pos or p.offset + p.size > count:
            raise RuntimeError(f"the RNN weight layout has overlapping or out-of-range pieces ({p})")
        pos = p.offset + p.size
    got = (int(count), tuple(pieces))
    with _lock:
        _layouts.setdefault(key, got)
    return got


def _pack(layers: list, cfg: RNN) -> Any:
    count, pieces = weight_layout(cfg)
    dt = jnp.dtype(cfg.dtype)
    segs, pos = [], 0
    for p in pieces:
        if p.offset > pos:
            segs.append(jnp.zeros((p.offset - pos,), dt))
        segs.append(jnp.reshape(layers[p.layer][p.direction][p.key][p.row : p.row + p.rows], (-1,)))
        pos = p.offset + p.size
    if pos < count:
        segs.append(jnp.zeros((count - pos,), dt))
    return jnp.concatenate(segs)


def pack_params(params: Any, cell: str) -> Any:
    """cuDNN's flat weight buffer (1-d, the params' dtype, :func:`weight_layout` ``(config(params, cell))[0]``
    elements) holding ``params``: differentiable (``jnp.concatenate`` of the pieces, zeros in the gaps)."""
    cfg = config(params, cell)
    return _pack(_layers(params), cfg)


def unpack_params(w: Any, cfg: RNN) -> list[list[dict[str, Any]]]:
    """The params pytree in the flat buffer ``w`` of config ``cfg`` (:func:`config`'s; an
    :class:`cudnnkit.ops.RNN` with ``input_mode="linear"``): :func:`pack_params`'s inverse."""
    if not isinstance(cfg, RNN):
        raise TypeError(f"cfg must be a cudnnkit.ops.RNN (config(params, cell) gives it), got {type(cfg).__name__}")
    if cfg.input_mode != "linear":
        raise ValueError("input_mode='skip' has no w_ih in layer 0: the params pytree has no form for it")
    count, pieces = weight_layout(cfg)
    if tuple(w.shape) != (count,):
        raise ValueError(f"w has shape {tuple(w.shape)}; this RNN's flat weight buffer has ({count},)")
    parts: dict[tuple[int, int, str], list[tuple[int, Any]]] = {}
    for p in pieces:
        parts.setdefault((p.layer, p.direction, p.key), []).append((p.row, w[p.offset : p.offset + p.size], p.rows))
    out: list[list[dict[str, Any]]] = [[{} for _ in range(cfg.num_directions)] for _ in range(cfg.num_layers)]
    for (layer, d, key), got in sorted(parts.items(), key=lambda kv: (kv[0][0], kv[0][1], _KEYS.index(kv[0][2]))):
        got.sort(key=lambda t: t[0])
        rows = [seg.reshape((n, -1)) if key.startswith("w") else seg for _, seg, n in got]
        out[layer][d][key] = jnp.concatenate(rows, axis=0)
    return out


def init_params(key: Any, cell: str, input_size: int, hidden_size: int, *, num_layers: int = 1,
                bidirectional: bool = False, bias: bool = True, proj_size: int = 0,
                dtype: Any = jnp.float32) -> list[list[dict[str, Any]]]:  # fmt: skip
    """A params pytree for ``cell`` with torch's initialisation: every array uniform in ``[-k, k]``, ``k = 1 /
    sqrt(hidden_size)``; ``bias``: both biases (cuDNN's ``double`` mode) or none; ``proj_size``: an LSTM
    projection ``w_hr``."""
    cell = _cell(cell)
    G, D, H = GATES[cell], 2 if bidirectional else 1, int(hidden_size)
    P = int(proj_size) or H
    k = 1.0 / math.sqrt(H)
    shapes = {"w_hh": (G * H, P)}
    if bias:
        shapes |= {"b_ih": (G * H,), "b_hh": (G * H,)}
    if proj_size:
        shapes["w_hr"] = (P, H)
    out = []
    for layer in range(int(num_layers)):
        dirs = []
        for _ in range(D):
            s = dict(shapes, w_ih=(G * H, int(input_size) if layer == 0 else D * P))
            key, *subs = jax.random.split(key, 1 + len(s))
            dirs.append({n: jax.random.uniform(sk, sh, dtype, -k, k) for sk, (n, sh) in zip(subs, sorted(s.items()))})
        out.append(dirs)
    return out


# ----------------------------------------------------------------- the calls


def _lengths(seq_lengths: Any, N: int) -> tuple[int, ...] | None:
    if seq_lengths is None:
        return None
    if isinstance(seq_lengths, _TRACER):
        raise TypeError("seq_lengths is a traced array: cuDNN's RNN data descriptor takes the sequence lengths as "
                        "host ints when the call is built, so under jit they must be static (a tuple of ints, "
                        "or a concrete array closed over / passed as a static argument)")  # fmt: skip
    got = np.asarray(seq_lengths)
    if got.dtype.kind not in "iu" or got.ndim != 1:
        raise TypeError(f"seq_lengths must be 1-d integers (one length per sample), got {got.dtype} {got.shape}")
    if got.shape[0] != N:
        raise ValueError(f"seq_lengths has {got.shape[0]} values but x has a batch of {N}")
    return tuple(int(v) for v in got)


def _state(a: Any, shape: tuple[int, ...], dtype: str, name: str) -> Any:
    if a is None:
        return None
    if tuple(a.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(a.shape)}; this network needs {shape} (layers * directions, "
                         f"batch, features)")  # fmt: skip
    if _dtype_name(a, name) != dtype:
        raise TypeError(f"{name} has dtype {_dtype_name(a, name)} but the RNN's is {dtype}")
    return a


def _run(cell: str, params: Any, x: Any, h0: Any, c0: Any, *, time_major: bool, seq_lengths: Any,
         cell_clip: Any = None, fn: str) -> tuple[Any, Any, Any]:  # fmt: skip
    if getattr(x, "ndim", None) != 3:
        shape = tuple(getattr(x, "shape", ()))
        raise ValueError(f"{fn}: x must be 3-d, (N, T, I) (or (T, N, I) with time_major=True), got shape {shape}")
    dt = _dtype_name(x, "x")
    if dt not in ("float16", "float32", "float64"):
        raise TypeError(f"{fn}: x has dtype {dt}; cuDNN's RNN takes float16, float32 or float64")
    layers = _layers(params)
    cfg = config(layers, cell, cell_clip=cell_clip, dtype=dt)
    if x.shape[-1] != cfg.input_size:
        raise ValueError(f"{fn}: x has {x.shape[-1]} features but params[0][0]['w_ih'] takes {cfg.input_size}")
    N = int(x.shape[1] if time_major else x.shape[0])
    h0 = _state(h0, cfg.hidden_shape(N), dt, "h0")
    c0 = _state(c0, cfg.cell_shape(N), dt, "c0")
    lengths = _lengths(seq_lengths, N)
    w = _pack(layers, cfg)
    from . import op

    y, hy, cy = op("rnn")(x, w, h0, c0, rnn=cfg, training=False, layout="seq_major" if time_major else "batch_major",
                          seq_lengths=lengths)  # fmt: skip
    return y, hy, cy


def lstm(params: Any, x: Any, h0: Any = None, c0: Any = None, *, time_major: bool = False, seq_lengths: Any = None,
         cell_clip: Any = None) -> tuple[Any, tuple[Any, Any]]:  # fmt: skip
    """A (multi-layer, optionally bidirectional, optionally projected) LSTM over ``x``: ``(y, (h_n, c_n))`` (see
    the module docstring for the shapes). ``cell_clip``: cuDNN's cell-state clipping, ``c`` or ``(lo, hi)``
    (``cudnnkit.ops.RNN``'s)."""
    if c0 is not None and h0 is None:
        raise ValueError("lstm: c0 without h0; pass both (zeros for the one you do not need) or neither")
    y, hy, cy = _run("lstm", params, x, h0, c0, time_major=time_major, seq_lengths=seq_lengths, cell_clip=cell_clip,
                     fn="lstm")  # fmt: skip
    return y, (hy, cy)


def gru(params: Any, x: Any, h0: Any = None, *, time_major: bool = False, seq_lengths: Any = None) -> tuple[Any, Any]:
    """A GRU over ``x`` (cuDNN's, which is torch's: ``n = tanh(W_n x + b_in + r * (W_hn h + b_hn))``):
    ``(y, h_n)``."""
    y, hy, _ = _run("gru", params, x, h0, None, time_major=time_major, seq_lengths=seq_lengths, fn="gru")
    return y, hy


def rnn(params: Any, x: Any, h0: Any = None, *, nonlinearity: str = "tanh", time_major: bool = False,
        seq_lengths: Any = None) -> tuple[Any, Any]:  # fmt: skip
    """An Elman RNN over ``x``, ``h' = nonlinearity(W_ih x + b_ih + W_hh h + b_hh)`` with ``nonlinearity``
    ``"tanh"`` or ``"relu"``: ``(y, h_n)``."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"rnn: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    y, hy, _ = _run(nonlinearity, params, x, h0, None, time_major=time_major, seq_lengths=seq_lengths, fn="rnn")
    return y, hy


# ----------------------------------------------------------------- flax


def _flax_cell(params: Any) -> Mapping[str, Any]:
    """The cell's own dict in what flax hands out: ``{"ii": ..., "hi": ...}``, or it under ``"params"`` and/or
    ``"cell"`` (``nn.RNN(cell).init(...)``'s variables)."""
    p = params
    for wrapper in ("params", "cell"):
        if isinstance(p, Mapping) and wrapper in p and "ii" not in p:
            p = p[wrapper]
    if not isinstance(p, Mapping) or not all(f"{s}{g}" in p for s in "ih" for g in _FLAX_GATES):
        keys = sorted(p) if isinstance(p, Mapping) else type(p).__name__
        raise ValueError(f"not an OptimizedLSTMCell's params: they have ii, if, ig, io (input kernels) and hi, hf, "
                         f"hg, ho (hidden kernels and biases); got {keys}")  # fmt: skip
    return p


def from_flax_lstm(params: Any) -> list[list[dict[str, Any]]]:
    """A one-layer LSTM pytree from ``flax.linen.OptimizedLSTMCell`` (or ``LSTMCell``) params (the cell's dict,
    or ``nn.RNN``'s variables holding it under ``"params"``/``"cell"``); a list of such cells makes a stack of
    layers (each layer's input the previous one's output). Exact: ``w_ih`` stacks the ``i*`` kernels transposed,
    ``w_hh`` the ``h*`` kernels, ``b_hh`` the ``h*`` biases; no ``b_ih`` (cuDNN's ``single_recurrent``)."""
    cells = list(params) if isinstance(params, Sequence) and not isinstance(params, Mapping) else [params]
    out = []
    for c in cells:
        p = _flax_cell(c)
        for g in _FLAX_GATES:
            if "bias" in p[f"i{g}"]:
                raise ValueError(f"flax params i{g} has a bias: OptimizedLSTMCell's input kernels have none")
            if "bias" not in p[f"h{g}"]:
                raise ValueError(f"flax params h{g} has no bias: OptimizedLSTMCell's hidden kernels have one")
        out.append([{
            "w_ih": jnp.concatenate([jnp.asarray(p[f"i{g}"]["kernel"]).T for g in _FLAX_GATES], axis=0),
            "w_hh": jnp.concatenate([jnp.asarray(p[f"h{g}"]["kernel"]).T for g in _FLAX_GATES], axis=0),
            "b_hh": jnp.concatenate([jnp.asarray(p[f"h{g}"]["bias"]) for g in _FLAX_GATES], axis=0),
        }])  # fmt: skip
    config(out, "lstm")  # shapes checked
    return out


def to_flax_lstm(params: Any) -> dict[str, dict[str, Any]]:
    """The ``flax.linen.OptimizedLSTMCell`` params of a one-layer, one-direction LSTM pytree without projection
    (``nn.RNN(nn.OptimizedLSTMCell(H))`` takes ``{"params": {"cell": to_flax_lstm(p)}}``). flax's cell has one
    bias per gate: ``b_ih + b_hh`` (whichever are present; zeros for none), exact when ``b_ih`` is absent
    (:func:`from_flax_lstm`'s pytrees) and the same function otherwise."""
    cfg = config(params, "lstm")
    if cfg.num_layers != 1 or cfg.bidirectional or cfg.proj_size:
        raise ValueError(f"to_flax_lstm: an OptimizedLSTMCell is one layer, one direction, no projection; these "
                         f"params have {cfg.num_layers} layer(s), {cfg.num_directions} direction(s), proj_size="
                         f"{cfg.proj_size} (convert each layer's params[l] alone)")  # fmt: skip
    p, H = params[0][0], cfg.hidden_size
    present = [p[k] for k in ("b_ih", "b_hh") if k in p]
    bias = jnp.zeros((4 * H,), p["w_ih"].dtype) if not present else present[0]
    if len(present) == 2:
        bias = bias + present[1]
    out: dict[str, dict[str, Any]] = {}
    for j, g in enumerate(_FLAX_GATES):
        rows = slice(j * H, (j + 1) * H)
        out[f"i{g}"] = {"kernel": p["w_ih"][rows].T}
        out[f"h{g}"] = {"kernel": p["w_hh"][rows].T, "bias": bias[rows]}
    return out
