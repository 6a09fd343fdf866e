"""A two-layer bidirectional LSTM over a batch of sequences of different lengths (CuPy arrays): ``ops.RNN``, a
training forward with ``seq_lengths=``, and the one-call backward (data, then weights). Checks that the padded steps
of ``y`` hold ``padding_fill``, that each sample's output does not depend on the padding, and that a gradient step
on the weights lowers a loss.

Run on a machine with a CUDA GPU and CuPy: ``python examples/rnn_variable_lengths.py``.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from cudnnkit import ops


def main() -> None:
    rng = np.random.default_rng(0)
    T, N, F, H = 12, 4, 8, 16
    lengths = [12, 9, 5, 2]  # host ints, each in [1, T]
    rnn = ops.RNN("lstm", input_size=F, hidden_size=H, num_layers=2, bidirectional=True, dtype="float32")
    like = cp.zeros(1, cp.float32)
    w = cp.asarray(rng.uniform(-0.3, 0.3, rnn.weight_count(like)).astype(np.float32))  # flat weight space

    x = rng.standard_normal((T, N, F)).astype(np.float32)  # seq-major (T, N, F), padded past each length
    for n, t in enumerate(lengths):
        x[t:, n] = 0
    xd = cp.asarray(x)
    y, hy, cy, reserve = ops.rnn_forward(xd, w, rnn=rnn, training=True, seq_lengths=lengths, padding_fill=0.0)
    assert y.shape == (T, N, 2 * H) and hy.shape == (4, N, H) and cy.shape == (4, N, H)
    yh = cp.asnumpy(y)
    for n, t in enumerate(lengths):
        assert np.all(yh[t:, n] == 0.0), "padded steps hold padding_fill"

    # the padding never reaches a sample's output: garbage there changes nothing
    x2 = x.copy()
    for n, t in enumerate(lengths):
        x2[t:, n] = 1e3
    y2, _, _ = ops.rnn_forward(cp.asarray(x2), w, rnn=rnn, seq_lengths=lengths)  # inference
    assert float(cp.abs(y2 - y).max()) < 1e-4

    # one gradient step on loss = 0.5 * sum(y**2) over the valid steps lowers it
    def loss_of(yy: cp.ndarray) -> float:
        return 0.5 * float((yy**2).sum())

    before = loss_of(y)
    dx, dhx, dcx, dw = ops.rnn_backward(xd, y, y.copy(), w, reserve, rnn=rnn, seq_lengths=lengths)  # dy = y
    assert dx.shape == x.shape and dw.shape == w.shape
    w_new = w - 0.01 * dw / max(float(cp.abs(dw).max()), 1e-12)
    after = loss_of(ops.rnn_forward(xd, w_new, rnn=rnn, seq_lengths=lengths)[0])
    assert after < before, (before, after)
    print(f"LSTM 2x bidirectional, lengths {lengths}: loss {before:.4f} -> {after:.4f} after one step")


if __name__ == "__main__":
    main()
