"""The recurrent functional forms torch's modules call (``torch._VF.lstm``/``gru``/``rnn_tanh``/``rnn_relu``): the
torch-ordered parameter list packed into cuDNN's flat weight buffer (differentiably: ``torch.cat``), then one
``cudnnRNNForward``."""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import replace
from typing import Any

from ..ops.rnn import RNN, rnn_forward, torch_param_names
from ..runtime.arrays import as_view
from ..runtime.dtypes import itemsize
from ._common import as_int, call, check_dtype, concat, dtype_of, full, library, process_seed, real

__all__ = ["lstm", "gru", "rnn_tanh", "rnn_relu", "rnn_config", "flat_layout", "pack_params"]

_GATES = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}
_layouts: dict[tuple, tuple[list[tuple[int, int, str, int, int]], int]] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=256)
def _config(cell: str, input_size: int, hidden: int, num_layers: int, bidirectional: bool, bias: bool,
            proj: int, dropout: float, dtype: str, seed: int = 0) -> RNN:  # fmt: skip
    # one object per config: the torch layer passes it by key
    return RNN(cell, input_size, hidden, num_layers, bidirectional, bias_mode="double" if bias else "none",
               proj_size=proj, dropout=dropout, dtype=dtype, dropout_seed=seed)  # fmt: skip


def rnn_config(cell: str, params: Any, has_biases: bool, num_layers: int, dropout: float, bidirectional: bool,
               dtype: str, seed: int = 0) -> RNN:  # fmt: skip
    """The :class:`~cudnnkit.ops.RNN` of torch's flat parameter list (``weight_ih, weight_hh[, bias_ih,
    bias_hh][, weight_hr]`` per layer and direction): sizes read from the shapes; ``seed`` the dropout RNG's."""
    num_layers, d = as_int(num_layers, "num_layers"), 2 if bidirectional else 1
    base = 4 if has_biases else 2
    per, rest = divmod(len(params), num_layers * d) if num_layers > 0 else (0, 1)
    if rest or per not in (base, base + (cell == "lstm")):
        raise ValueError(f"params: {len(params)} tensors do not make {num_layers} layer(s) x {d} direction(s) of "
                         f"{cell} parameters (has_biases={has_biases})")  # fmt: skip
    hidden = params[1].shape[0] // _GATES[cell]
    proj = params[per - 1].shape[0] if per == base + 1 else 0
    return _config(cell, int(params[0].shape[1]), int(hidden), num_layers, bool(bidirectional), bool(has_biases),
                   int(proj), real(dropout, "dropout"), dtype, int(seed))  # fmt: skip


def _pieces(cfg: RNN, p: Any) -> list[tuple[str, Any, int]]:
    """(torch name, view into the flat buffer, first row in the torch tensor) of one linear id (the stacking
    :func:`~cudnnkit.ops.load_torch_params` documents: gates in torch's order, which is cuDNN's)."""
    s = f"_l{p.layer}" + ("_reverse" if p.direction else "")
    if p.gate == "P":
        return [(f"weight_hr{s}", p.matrix, 0)]
    side = "ih" if p.gate.startswith("W") else "hh"
    row = cfg.hidden_size * (p.lin_id % _GATES[cfg.cell])
    out = [(f"weight_{side}{s}", p.matrix, row)]
    if p.bias is not None:
        out.append((f"bias_{side}{s}", p.bias, row))
    return out


def flat_layout(cfg: RNN, like: Any) -> tuple[list[tuple[int, int, str, int, int]], int]:
    """``(pieces, count)``: each piece ``(offset, size, torch name, first row, rows)`` of the flat weight buffer
    (``cudnnGetRNNWeightParams``, asked once per config, library and device), and its length."""
    cfg = replace(cfg, dropout=0.0)  # the layout does not depend on dropout (whose states need no building here)
    key = (cfg, library(like), as_view(like, "input").device)
    with _lock:
        got = _layouts.get(key)
    if got is None:
        w = cfg.new_weights(like)
        base, size = as_view(w, "w").ptr, itemsize(cfg.dtype)
        pieces = []
        for row in cfg.weight_params(w):
            for p in row:
                for name, view, r0 in _pieces(cfg, p):
                    v = as_view(view, name)
                    pieces.append(((v.ptr - base) // size, math.prod(v.shape), name, r0, v.shape[0]))
        got = (sorted(pieces), int(w.shape[0]))
        with _lock:
            _layouts[key] = got
    return got


def pack_params(pieces: list[tuple[int, int, str, int, int]], count: int, params: dict[str, Any], like: Any) -> Any:
    """The flat weight buffer (``count`` elements) from torch-layout ``params`` (name -> array): the pieces in
    offset order with zeros in the gaps, joined by ``torch.cat`` (differentiable) or ``cupy.concatenate``."""
    parts, pos = [], 0
    for off, n, name, r0, rows in pieces:
        if off < pos:
            raise ValueError(f"the RNN weight pieces overlap at {name} (offset {off} < {pos})")
        if off > pos:
            parts.append(full(like, (off - pos,), 0.0, dtype_of(like)))
        piece = params[name][r0 : r0 + rows].reshape(-1)
        if piece.shape[0] != n:
            raise ValueError(f"params[{name!r}] rows {r0}:{r0 + rows} hold {piece.shape[0]} values, cuDNN needs {n}")
        parts.append(piece)
        pos = off + n
    if pos < count:
        parts.append(full(like, (count - pos,), 0.0, dtype_of(like)))
    return concat(parts)


_PADDED = "pass the padded tensor (batch_sizes are not mapped to cuDNN's sequence lengths here)"


def _refuse_packed(fn: str, input: Any, hx: Any) -> None:
    """A ``PackedSequence`` input, or torch's packed overload (``_VF.lstm(data, batch_sizes, hx, params, ...)``, as
    many positional arguments: ``batch_sizes``, a 1-d integer tensor, where ``hx`` goes): refused by name, not
    misread."""
    if hasattr(input, "batch_sizes"):
        raise NotImplementedError(f"{fn}: a PackedSequence input: {_PADDED}")
    if hx is not None and not isinstance(hx, (list, tuple)) and getattr(hx, "ndim", None) == 1:
        if "int" in dtype_of(hx):
            raise NotImplementedError(f"{fn}: the packed form (data, batch_sizes, ...): {_PADDED}")


def _run(cell: str, input: Any, hx: Any, cx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float,
         train: bool, bidirectional: bool, batch_first: bool) -> tuple:  # fmt: skip
    fn = {"lstm": "lstm", "gru": "gru", "tanh": "rnn_tanh", "relu": "rnn_relu"}[cell]
    if cell != "lstm":  # lstm() checked before unpacking hx
        _refuse_packed(fn, input, hx)
    if input.ndim != 3:
        raise ValueError(
            f"{fn}: input must be 3-d ((T, N, I), or (N, T, I) with batch_first), got {tuple(input.shape)}"
        )
    dt = check_dtype(input, ("float16", "float32", "float64"), "input", "cuDNN's RNN")
    params = list(params)
    # dropout acts between layers: a seed only where it draws masks (one config otherwise)
    seed = process_seed(input) if num_layers != 1 and real(dropout, "dropout") else 0
    cfg = rnn_config(cell, params, has_biases, num_layers, dropout, bidirectional, dt, seed)
    for name, p in zip(torch_param_names(cfg), params):
        if dtype_of(p) != dt:
            raise TypeError(f"{fn}: parameter {name} has dtype {dtype_of(p)}, input {dt}: they must match")
    pieces, count = flat_layout(cfg, input)
    w = pack_params(pieces, count, dict(zip(torch_param_names(cfg), params)), input)
    layout = "batch_major" if batch_first else "seq_major"
    if library(input) == "torch":
        return call("rnn", input, w, hx, cx, rnn=cfg, training=bool(train), layout=layout)
    return rnn_forward(input, w, hx, cx, rnn=cfg, training=bool(train), layout=layout)[:3]


def lstm(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float, train: bool,
         bidirectional: bool, batch_first: bool) -> tuple[Any, Any, Any]:  # fmt: skip
    """torch's ``_VF.lstm`` ``(output, h_n, c_n)``: L3 ``rnn`` (LSTM), ``cudnnRNNForward``."""
    _refuse_packed("lstm", input, hx)
    h0, c0 = (None, None) if hx is None else hx
    y, hy, cy = _run("lstm", input, h0, c0, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return y, hy, cy


def gru(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float, train: bool,
        bidirectional: bool, batch_first: bool) -> tuple[Any, Any]:  # fmt: skip
    """torch's ``_VF.gru`` ``(output, h_n)``: L3 ``rnn`` (GRU), ``cudnnRNNForward``."""
    got = _run("gru", input, hx, None, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return got[0], got[1]


def rnn_tanh(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool) -> tuple[Any, Any]:  # fmt: skip
    """torch's ``_VF.rnn_tanh`` ``(output, h_n)``: L3 ``rnn`` (tanh cell), ``cudnnRNNForward``."""
    got = _run("tanh", input, hx, None, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return got[0], got[1]


def rnn_relu(input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float, train: bool,
             bidirectional: bool, batch_first: bool) -> tuple[Any, Any]:  # fmt: skip
    """torch's ``_VF.rnn_relu`` ``(output, h_n)``: L3 ``rnn`` (ReLU cell), ``cudnnRNNForward``."""
    got = _run("relu", input, hx, None, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return got[0], got[1]
