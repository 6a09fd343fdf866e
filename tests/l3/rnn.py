"""Samples and torch references of the L3 RNN (``cudnnkit.ops.rnn``'s "rnn"): see tests/l3/__init__ for the format
(``SAMPLES``, ``TORCH_REFERENCE``).

A sample's inputs are ``(x, w, hx, cx)`` (``None`` where not given) and its keywords the config (``rnn``) and
``rnn_forward``'s options. ``w`` is cuDNN's flat weight buffer: its length is ``RNN.weight_count`` on the GPU
(without CUDA, the torch parameter count, enough for the shapes). The reference maps ``w`` onto the parameters of
``torch.nn.LSTM``/``GRU``/``RNN`` differentiably: ``to_torch_params`` of the buffer ``arange(len(w))`` on the GPU
says which element of ``w`` each torch parameter element is (cuDNN's layout, asked once per config), and the CPU
parameters are ``w[index]``; the module then runs on the CPU in float64 (``torch.func.functional_call``), so the
gradients of ``w`` compare element for element with cuDNN's.
"""

from __future__ import annotations

import functools

from cudnnkit.ops.rnn import RNN, to_torch_params, torch_param_names

T, N, IN, H = 3, 2, 4, 5
_GATES = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}


def torch_param_shapes(rnn: RNN) -> dict[str, tuple[int, ...]]:
    """The shape of each parameter torch gives this config (``torch_param_names``' order)."""
    G, P, D = _GATES[rnn.cell] * rnn.hidden_size, rnn.output_size, rnn.num_directions
    out = {}
    for name in torch_param_names(rnn):
        layer = int(name.split("_l")[1].split("_")[0])
        if name.startswith("weight_ih"):
            out[name] = (G, rnn.input_size if layer == 0 else D * P)
        elif name.startswith("weight_hh"):
            out[name] = (G, P)
        elif name.startswith("weight_hr"):
            out[name] = (P, rnn.hidden_size)
        else:
            out[name] = (G,)
    return out


@functools.cache
def weight_count(rnn: RNN) -> int:
    """The flat weight buffer's length: ``RNN.weight_count`` with CUDA, else the torch parameter count."""
    import math

    import torch

    if torch.cuda.is_available():
        return rnn.weight_count(torch.empty(1, dtype=getattr(torch, rnn.dtype), device="cuda"))
    return sum(math.prod(s) for s in torch_param_shapes(rnn).values())


def _sample(rng, dtype, cell, layers=1, bidirectional=False, *, hx=False, cx=False, layout="seq_major",
            lengths=None, **kw):  # fmt: skip
    rnn = RNN(cell, IN, H, layers, bidirectional, dtype=dtype, algo="standard", **kw.pop("config", {}))
    if layout == "packed":
        xshape = (sum(lengths), IN)
    else:
        xshape = (T, N, IN) if layout == "seq_major" else (N, T, IN)
    x = rng.standard_normal(xshape).astype(dtype)
    w = rng.uniform(-0.5, 0.5, weight_count(rnn)).astype(dtype)
    h0 = (0.5 * rng.standard_normal(rnn.hidden_shape(N))).astype(dtype) if hx else None
    c0 = (0.5 * rng.standard_normal(rnn.cell_shape(N))).astype(dtype) if cx else None
    opts = {"rnn": rnn, "layout": layout, **kw}
    if lengths is not None:
        opts["seq_lengths"] = tuple(lengths)  # host ints, a literal the torch layer passes as is
    return (x, w, h0, c0), opts


def _samples(rng, dtype):
    return [
        _sample(rng, dtype, "lstm", 1, True, hx=True, cx=True),  # the first: gradcheck and opcheck run it
        _sample(rng, dtype, "lstm", 1, False),
        _sample(rng, dtype, "lstm", 2, True, hx=True),
        _sample(rng, dtype, "lstm", 1, True, cx=True, lengths=(2, 3), padding_fill=0.25),
        _sample(rng, dtype, "lstm", 1, True, hx=True, cx=True, training=True, config={"proj_size": 3}),
        _sample(rng, dtype, "lstm", 2, False, hx=True, config={"dropout": 0.3}),  # training=False: no dropout
        _sample(rng, dtype, "gru", 1, True, hx=True, layout="batch_major"),
        _sample(rng, dtype, "gru", 2, False),
        _sample(rng, dtype, "gru", 1, False, hx=True, layout="packed", lengths=(3, 1)),
        _sample(rng, dtype, "tanh", 1, False, hx=True),
        _sample(rng, dtype, "tanh", 2, True),
        _sample(rng, dtype, "relu", 1, True, hx=True, layout="batch_major", lengths=(3, 1)),
    ]


SAMPLES = {"rnn": _samples}


@functools.cache
def _index_maps(rnn: RNN, n: int) -> dict:
    """torch parameter name -> the index into the flat ``w`` (length ``n``) of each of its elements, CPU int64:
    ``to_torch_params`` of ``arange(n)`` (exact in float32 and float64 at these sizes) on the GPU."""
    import torch

    idx = torch.arange(n, dtype=getattr(torch, rnn.dtype), device="cuda")
    return {k: v.cpu().round().long() for k, v in to_torch_params(rnn, idx).items()}


def torch_module(rnn: RNN, layout: str = "seq_major"):
    """The CPU ``torch.nn.LSTM``/``GRU``/``RNN`` (float64, no dropout) with this config's shape."""
    import torch

    kw = dict(num_layers=rnn.num_layers, bias=rnn.bias_mode == "double", batch_first=layout == "batch_major",
              bidirectional=rnn.bidirectional, dtype=torch.float64)  # fmt: skip
    if rnn.cell == "lstm":
        return torch.nn.LSTM(rnn.input_size, rnn.hidden_size, proj_size=rnn.proj_size, **kw)
    if rnn.cell == "gru":
        return torch.nn.GRU(rnn.input_size, rnn.hidden_size, **kw)
    return torch.nn.RNN(rnn.input_size, rnn.hidden_size, nonlinearity=rnn.cell, **kw)


def run_torch(rnn: RNN, params: dict, x, hx=None, cx=None, *, layout="seq_major", seq_lengths=None, fill=0.0):
    """(out, hy, cy | None) of the torch module with ``params`` (name -> tensor), for x in cudnnkit's layout."""
    import torch
    from torch.nn.utils import rnn as tr

    mod = torch_module(rnn, layout)
    Nb = len(seq_lengths) if layout == "packed" else x.shape[1 if layout == "seq_major" else 0]
    if rnn.cell == "lstm":
        state = None
        if hx is not None or cx is not None:
            z = functools.partial(torch.zeros, dtype=x.dtype)
            state = (z(rnn.hidden_shape(Nb)) if hx is None else hx, z(rnn.cell_shape(Nb)) if cx is None else cx)
    else:
        state = hx
    batch_first = layout == "batch_major"
    if layout == "packed":
        lengths = torch.tensor(seq_lengths)
        sizes = torch.tensor([int((lengths > t).sum()) for t in range(int(lengths.max()))])
        inp = tr.PackedSequence(x, sizes)
    elif seq_lengths is not None:
        inp = tr.pack_padded_sequence(x, torch.tensor(seq_lengths), batch_first=batch_first, enforce_sorted=False)
    else:
        inp = x
    out, st = torch.func.functional_call(mod, params, (inp, state))
    if layout == "packed":
        out = out.data
    elif seq_lengths is not None:
        steps = x.shape[1 if batch_first else 0]
        out = tr.pad_packed_sequence(out, batch_first=batch_first, padding_value=fill, total_length=steps)[0]
    return (out, *st) if rnn.cell == "lstm" else (out, st, None)


def _rnn_reference(inputs, kw):
    import torch

    x, w, hx, cx = (None if a is None else torch.as_tensor(a) for a in inputs)
    rnn = kw["rnn"]
    if kw.get("training", False) and rnn.dropout > 0:
        raise NotImplementedError("the reference has no cuDNN dropout masks: use training=False or dropout=0")
    params = {k: w[idx] for k, idx in _index_maps(rnn, w.shape[0]).items()}
    return run_torch(rnn, params, x, hx, cx, layout=kw.get("layout", "seq_major"), seq_lengths=kw.get("seq_lengths"),
                     fill=kw.get("padding_fill", 0.0))  # fmt: skip


TORCH_REFERENCE = {"rnn": _rnn_reference}
