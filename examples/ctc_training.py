"""CTC training with CuPy arrays: a linear layer maps input features to per-frame logits over an alphabet (blank
is class 0), ``ops.ctc_loss`` returns the per-sample costs and their gradients with respect to the logits in one
cuDNN call (``cudnnCTCLoss_v8``), and plain gradient descent on the layer lowers the mean cost; the trained model's
best path then decodes to the target labels.

Run on a machine with a CUDA GPU and CuPy: ``python examples/ctc_training.py``.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from cudnnkit import ops


def greedy_decode(best: np.ndarray) -> list[int]:
    """Collapse repeats, then drop blanks (class 0)."""
    out, prev = [], 0
    for k in best:
        if k != prev and k != 0:
            out.append(int(k))
        prev = k
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    T, N, A, F = 20, 4, 6, 64  # frames, batch, alphabet incl. blank, features
    labels = [[1, 2, 3], [4, 4], [5], [2, 3, 1, 5]]
    input_lengths = [20, 16, 12, 20]
    label_lengths = [len(s) for s in labels]
    flat = [k for s in labels for k in s]  # packed labels (host ints): cudnnkit checks them on the host
    feats = cp.asarray(rng.standard_normal((T, N, F)).astype(np.float32))
    weight = cp.asarray((rng.standard_normal((F, A)) * 0.1).astype(np.float32))

    costs0 = None
    for _ in range(300):
        logits = cp.ascontiguousarray(feats @ weight)  # (T, N, A) float32
        costs, grads = ops.ctc_loss(logits, flat, label_lengths, input_lengths)  # grads: d cost_n / d logits
        if costs0 is None:
            costs0 = cp.asnumpy(costs)
        # d(mean cost)/d weight = sum over frames and samples of feats^T @ grads, / N
        dweight = cp.einsum("tnf,tna->fa", feats, grads) / N
        weight -= 0.5 * dweight
    costs1 = cp.asnumpy(ops.ctc_loss(cp.ascontiguousarray(feats @ weight), flat, label_lengths, input_lengths)[0])
    assert np.all(np.isfinite(costs1)) and costs1.mean() < 0.2 * costs0.mean(), (costs0, costs1)
    best = cp.asnumpy((feats @ weight).argmax(axis=2))  # (T, N)
    decoded = [greedy_decode(best[: input_lengths[n], n]) for n in range(N)]
    assert decoded == labels, decoded
    print(f"mean CTC cost {costs0.mean():.3f} -> {costs1.mean():.3f}; decoded {decoded}")


if __name__ == "__main__":
    main()
