"""The framework-free autograd tape: a tape-based reverse mode over ``cudnnkit.autograd`` in about forty lines,
with CuPy arrays and no autograd framework at all, training a small convolutional classifier (conv -> ReLU -> max
pool -> conv -> log-softmax) on a synthetic task. Each op's ``forward`` returns its outputs and the residuals its
``backward`` needs; the tape replays the backwards in reverse order, once each.

Run on a machine with a CUDA GPU and CuPy: ``python examples/autograd_tape.py``.
"""

from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from cudnnkit import autograd


class Tape:
    """Records each op's residuals and keywords; :meth:`grad` walks them backwards."""

    def __init__(self) -> None:
        self.records: list[tuple] = []

    def __call__(self, name: str, *inputs: Any, **kw: Any) -> Any:
        op = autograd.get(name)
        outs, res = op.forward(*inputs, **kw)
        self.records.append((op, inputs, outs, res, {k: v for k, v in kw.items() if k not in op.arrays}))
        return outs[0] if len(outs) == 1 else outs

    def grad(self, out: Any, dout: Any, wrt: list[Any]) -> list[Any]:
        grads: dict[int, Any] = {id(out): dout}
        for op, inputs, outs, res, kw in reversed(self.records):
            douts = tuple(grads.pop(id(o), None) for o in outs)
            if all(g is None for g in douts):
                continue
            needs = tuple(x is not None for x in inputs)
            for x, g in zip(inputs, op.backward(res, douts, needs, **kw)):
                if x is not None and g is not None:
                    grads[id(x)] = g if id(x) not in grads else grads[id(x)] + g
        return [grads.get(id(w)) for w in wrt]


def main() -> None:
    rng = np.random.default_rng(0)

    # synthetic 8x8 images: class c has a bright 2x2 patch at one of four positions
    def batch(n: int) -> tuple[cp.ndarray, cp.ndarray]:
        y = rng.integers(0, 4, n)
        x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32) * 0.3
        for i, c in enumerate(y):
            r, s = divmod(int(c), 2)
            x[i, 0, r * 4 + 1 : r * 4 + 3, s * 4 + 1 : s * 4 + 3] += 2.0
        return cp.asarray(x), cp.asarray(y)

    w1 = cp.asarray((rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32))
    w2 = cp.asarray((rng.standard_normal((4, 8, 4, 4)) * 0.1).astype(np.float32))
    losses = []
    for _ in range(100):
        x, y = batch(64)
        tape = Tape()
        h = tape("convolution", x, w1, None, padding=1)
        h = tape("activation", h, mode="relu")
        h = tape("pooling", h, window=2, stride=2)  # (N, 8, 4, 4)
        logits = tape("convolution", h, w2, None)  # (N, 4, 1, 1)
        logp = tape("softmax", logits, axis=1, log=True)
        onehot = cp.zeros_like(logp)
        onehot[cp.arange(len(y)), y, 0, 0] = 1
        losses.append(float(-(logp * onehot).sum() / len(y)))
        g1, g2 = tape.grad(logp, -onehot / len(y), [w1, w2])  # d(mean NLL)/d(w1, w2)
        w1 -= 0.5 * g1
        w2 -= 0.5 * g2
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    assert last < 0.35 * first, losses[::10]
    print(f"tape-trained CNN: mean NLL {first:.3f} -> {last:.3f} over {len(losses)} steps, no framework")


if __name__ == "__main__":
    main()
