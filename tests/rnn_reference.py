"""An independent per-time-step RNN reference in torch on the CPU, float64, with autograd for the gradients.

It follows the cell equations of the cuDNN API reference (``cudnnRNNMode_t``)
step by step, with no cuDNN and no ``torch.nn.LSTM`` inside:

* RELU/TANH: ``h' = f(W x + bW + R h + bR)``
* LSTM: ``i, f, o = sigmoid(W_* x + bW_* + R_* h + bR_*)``, ``g = tanh(W_c x + ... )``,
  ``c' = f * clip(c) + i * g``, ``h' = o * tanh(clip(c'))``, with a projection ``h' = P h'``; ``clip`` (cell
  clipping) is applied where the state is read, with float32 bounds, and the carried state is unclipped: that is
  what cuDNN 9.19 computes (measured; its documentation does not say where the clip applies)
* GRU: ``r, z = sigmoid(...)``, ``n = tanh(W_h x + bW_h + r * (R_h h + bR_h))``, ``h' = (1 - z) * n + z * h``

An absent input matrix (skip input) means the input itself (plus a bias if
present); an absent bias means none. A sample's steps at and after its length
leave its state alone and produce ``fill``. Direction 1 runs each sample from
its last step back to step 0. Layer ``l > 0`` reads the concatenated outputs of
layer ``l - 1``'s directions.
"""

from __future__ import annotations

import numpy as np
import pytest

NGATES = {"lstm": 4, "gru": 3, "relu": 1, "tanh": 1}


def _torch():
    """torch, imported when the reference first computes, so that the tests collect without it; a test that needs
    the reference is skipped without it (the RNN tests that do not, run on CuPy alone)."""
    return pytest.importorskip(
        "torch", reason="the RNN reference (tests/rnn_reference.py) computes in torch on the CPU"
    )


def _t(a):
    torch = _torch()
    return None if a is None else torch.tensor(np.asarray(a, np.float64), requires_grad=True)


class Reference:
    """Forward in float64 on the CPU; ``grads(dy, dhy, dcy)`` gives every gradient by autograd.

    ``x``: (T, N, I) seq-major (padded steps ignored), ``params[pl][lin_id] = (M | None, b | None)``,
    ``hx`` (L*D, N, P) | None, ``cx`` (L*D, N, H) | None, ``lengths`` (N,).
    """

    def __init__(self, rnn, x, params, hx=None, cx=None, lengths=None, fill=0.0):
        torch = _torch()
        self.rnn = rnn
        T, N, _ = x.shape
        lengths = np.full(N, T) if lengths is None else np.asarray(lengths)
        self.x = _t(x)
        self.params = [[(_t(m), _t(b)) for m, b in row] for row in params]
        L, D, H, P = rnn.num_layers, rnn.num_directions, rnn.hidden_size, rnn.output_size
        self.hx = _t(hx) if hx is not None else None
        self.cx = _t(cx) if cx is not None else None
        h0 = self.hx if self.hx is not None else torch.zeros(L * D, N, P, dtype=torch.float64)
        c0 = self.cx if self.cx is not None else torch.zeros(L * D, N, H, dtype=torch.float64)
        valid = torch.tensor(np.arange(T)[:, None] < lengths[None, :])  # (T, N)
        inp = self.x
        hys, cys = [], []
        for layer in range(L):
            outs = []
            for d in range(D):
                pl = layer * D + d
                h, c = h0[pl], c0[pl]
                ys = [None] * T
                for t in range(T) if d == 0 else range(T - 1, -1, -1):
                    hn, cn = self._cell(self.params[pl], inp[t], h, c)
                    m = valid[t][:, None]
                    h = torch.where(m, hn, h)
                    if cn is not None:
                        c = torch.where(m, cn, c)
                    ys[t] = torch.where(m, hn, torch.zeros_like(hn))
                outs.append(torch.stack(ys))
                hys.append(h)
                cys.append(c)
            inp = torch.cat(outs, dim=2)
        self.y = torch.where(valid[:, :, None], inp, torch.full_like(inp, fill))
        self.hy = torch.stack(hys)
        self.cy = torch.stack(cys) if rnn.cell == "lstm" else None
        self.valid = valid.numpy()

    def _clip(self, c):
        """cuDNN's cell clip: applied where the cell state is read, with float32 bounds; the state itself is kept."""
        if self.rnn.cell_clip is None:
            return c
        lo, hi = (float(np.float32(b)) for b in self.rnn.cell_clip)
        return _torch().clamp(c, lo, hi)

    def _lin(self, p, v, g):
        m, b = p[g]
        out = v if m is None else v @ m.T
        return out if b is None else out + b

    def _cell(self, p, x, h, c):
        torch = _torch()
        cell, G = self.rnn.cell, NGATES[self.rnn.cell]

        def pre(g):
            return self._lin(p, x, g) + self._lin(p, h, G + g)

        if cell in ("relu", "tanh"):
            a = pre(0)
            return (torch.relu(a) if cell == "relu" else torch.tanh(a)), None
        if cell == "gru":
            r = torch.sigmoid(pre(0))
            z = torch.sigmoid(pre(1))
            n = torch.tanh(self._lin(p, x, 2) + r * self._lin(p, h, 5))
            return (1 - z) * n + z * h, None
        i, f = torch.sigmoid(pre(0)), torch.sigmoid(pre(1))
        g, o = torch.tanh(pre(2)), torch.sigmoid(pre(3))
        clip = self._clip
        c2 = f * clip(c) + i * g
        h2 = o * torch.tanh(clip(c2))
        if self.rnn.proj_size:
            h2 = h2 @ p[8][0].T
        return h2, c2

    def outputs(self):
        cy = None if self.cy is None else self.cy.detach().numpy()
        return self.y.detach().numpy(), self.hy.detach().numpy(), cy

    def grads(self, dy, dhy=None, dcy=None):
        """(dx, dhx | None, dcx | None, dparams[pl][lin_id] = (dM | None, db | None))."""
        torch = _torch()
        loss = (self.y * torch.tensor(dy)).sum()
        if dhy is not None:
            loss = loss + (self.hy * torch.tensor(dhy)).sum()
        if dcy is not None:
            loss = loss + (self.cy * torch.tensor(dcy)).sum()
        leaves = [self.x] + [v for v in (self.hx, self.cx) if v is not None]
        leaves += [t for row in self.params for mb in row for t in mb if t is not None]
        got = torch.autograd.grad(loss, leaves, allow_unused=True)
        got = [np.zeros(v.shape) if g is None else g.numpy() for v, g in zip(leaves, got)]
        it = iter(got)
        dx = next(it)
        dhx = next(it) if self.hx is not None else None
        dcx = next(it) if self.cx is not None else None
        dparams = [[tuple(None if t is None else next(it) for t in mb) for mb in row] for row in self.params]
        return dx, dhx, dcx, dparams


def pack(a: np.ndarray, lengths) -> np.ndarray:
    """(T, N, F) seq-major -> (sum(lengths), F) time-major packed (lengths decreasing), as cuDNN packs."""
    T = a.shape[0]
    return np.concatenate([a[t, : int(np.sum(np.asarray(lengths) > t))] for t in range(T)], axis=0)


def unpack(p: np.ndarray, lengths, T: int, fill=np.nan) -> np.ndarray:
    lengths = np.asarray(lengths)
    out = np.full((T, lengths.shape[0], p.shape[1]), fill, p.dtype)
    off = 0
    for t in range(T):
        n = int(np.sum(lengths > t))
        out[t, :n] = p[off : off + n]
        off += n
    return out
