"""RNN rows: ``cudnnkit.ops.rnn`` against ``torch.nn.LSTM``, ``GRU`` and ``RNN`` (tanh) on the same shapes.

Both sides call cuDNN's RNN API, so the goal is parity: seq 100, batch 64,
input and hidden 512, 2 layers, bidirectional, float32 (TF32 allowed on both
sides, torch's default for cuDNN) and float16.

* ``fwd (inference)``: ours ``rnn_forward(x, w, rnn=...)`` (``CUDNN_FWD_MODE_INFERENCE``);
  torch the module under ``torch.no_grad()`` in eval mode (which torch also runs in inference mode).
* ``fwd+bwd``: ours a training forward, then ``rnn_backward`` (backward data, then
  weights into a zeroed ``dw``); torch the module's forward, then
  ``torch.autograd.grad`` of ``y`` (given ``dy``) with respect to the input and
  every parameter. Initial states are zeros on both sides.
* every row runs ``algo="auto"`` (the default: cuDNN's persistent kernels where
  they were measured faster, see ``cudnnkit.ops._rnn_desc._auto_algo``), and the small-batch
  rows (batch 8, float16, LSTM, hidden 256, 1 layer) also run the standard and
  persistent-static algorithms by name; torch picks its own algorithm (it uses the
  persistent one itself for some float16 small-batch shapes).

``flops``: the gate matrix products only, ``2 * G * H * (in + H) * N * T`` per
layer and direction (G = 4 LSTM, 3 GRU, 1 RNN), three times that for fwd+bwd.
"""

from __future__ import annotations

from .harness import Row, register

FAMILY = "rnn"
T, N, IN, H, LAYERS = 100, 64, 512, 512, 2


def _flops(cell: str, t: int, n: int, i: int, h: int, layers: int, dirs: int) -> float:
    g = {"lstm": 4, "gru": 3, "tanh": 1}[cell]
    total = 0.0
    for layer in range(layers):
        inp = i if layer == 0 else dirs * h
        total += dirs * 2 * g * h * (inp + h) * n * t
    return total


def _case(cell: str, dtype: str, t: int, n: int, i: int, h: int, layers: int, bidir: bool, algo: str = "auto"):
    import torch

    from cudnnkit.ops.rnn import RNN, load_torch_params, rnn_backward, rnn_forward

    td = getattr(torch, dtype)
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "tanh": torch.nn.RNN}[cell]
    mod = cls(i, h, num_layers=layers, bidirectional=bidir).to(device="cuda", dtype=td)
    rnn = RNN(cell, i, h, num_layers=layers, bidirectional=bidir, dtype=dtype, algo=algo)
    params = dict(mod.named_parameters())
    w = load_torch_params(rnn, {k: v.detach() for k, v in params.items()})
    x = torch.randn(t, n, i, device="cuda", dtype=td)
    dirs = 2 if bidir else 1
    gy = torch.randn(t, n, dirs * h, device="cuda", dtype=td)
    xt = x.detach().clone().requires_grad_()
    plist = list(params.values())

    def ours_fwd():
        rnn_forward(x, w, rnn=rnn)

    def ours_fb():
        y, _, _, res = rnn_forward(x, w, rnn=rnn, training=True)
        rnn_backward(x, y, gy, w, res, rnn=rnn)

    def torch_fwd():
        with torch.no_grad():
            mod.eval()(x)

    def torch_fb():
        y, _ = mod.train()(xt)
        torch.autograd.grad(y, [xt, *plist], gy)

    return ours_fwd, ours_fb, torch_fwd, torch_fb


@register
def rnn_rows() -> list[Row]:
    rows: list[Row] = []
    shape = f"T{T} N{N} I{IN} H{H} L{LAYERS} bidir"
    for cell in ("lstm", "gru", "tanh"):
        for dtype in ("float32", "float16"):
            of, ofb, tf, tfb = _case(cell, dtype, T, N, IN, H, LAYERS, True)
            fl = _flops(cell, T, N, IN, H, LAYERS, 2)
            name = {"lstm": "LSTM", "gru": "GRU", "tanh": "RNN tanh"}[cell]
            rows.append(Row(FAMILY, f"{name} fwd (inference)", shape, dtype, ours=of, torch=tf, flops=fl))
            rows.append(Row(FAMILY, f"{name} fwd+bwd", shape, dtype, ours=ofb, torch=tfb, flops=3 * fl))
    for algo in ("auto", "persist_static", "standard"):
        of, ofb, tf, tfb = _case("lstm", "float16", T, 8, 256, 256, 1, False, algo)
        fl = _flops("lstm", T, 8, 256, 256, 1, 1)
        rows.append(
            Row(
                FAMILY,
                f"LSTM fwd (inference), algo={algo}",
                f"T{T} N8 I256 H256 L1",
                "float16",
                ours=of,
                torch=tf,
                flops=fl,
            )
        )
        rows.append(
            Row(
                FAMILY,
                f"LSTM fwd+bwd, algo={algo}",
                f"T{T} N8 I256 H256 L1",
                "float16",
                ours=ofb,
                torch=tfb,
                flops=3 * fl,
            )
        )
    return rows
