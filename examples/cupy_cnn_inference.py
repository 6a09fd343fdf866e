"""CNN inference with CuPy arrays only (no torch): fused conv + bias + ReLU, batch norm, max pooling, a 1x1
classifier convolution, global average pooling and softmax, each one cudnnkit L2 call; the class probabilities are
checked against a float64 NumPy reference of the same network.

Run on a machine with a CUDA GPU and CuPy: ``python examples/cupy_cnn_inference.py``.
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from _reference import conv2d, max_pool2d, rel, softmax

from cudnnkit import ops


def main() -> None:
    rng = np.random.default_rng(0)
    n, c, h, w, k, classes = 8, 3, 32, 32, 16, 10
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    w1 = (rng.standard_normal((k, c, 3, 3)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(k) * 0.1).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, k).astype(np.float32), (rng.standard_normal(k) * 0.1).astype(np.float32)
    mean, var = (rng.standard_normal(k) * 0.1).astype(np.float32), rng.uniform(0.5, 2.0, k).astype(np.float32)
    w2 = (rng.standard_normal((classes, k, 1, 1)) * 0.3).astype(np.float32)

    d = {name: cp.asarray(a) for name, a in dict(x=x, w1=w1, b1=b1, g=gamma, b=beta, m=mean, v=var, w2=w2).items()}
    y = ops.convolution_forward(d["x"], d["w1"], d["b1"], padding=1, activation="relu")  # relu(conv(x) + b1)
    y = ops.batch_norm_forward(y, d["g"], d["b"], running_mean=d["m"], running_var=d["v"], training=False)
    y = ops.pooling_forward(y, mode="max", window=2, stride=2)  # (N, K, 16, 16)
    logits = ops.convolution_forward(y, d["w2"])  # (N, classes, 16, 16)
    logits = ops.reduce_tensor(logits, "avg", axes=(2, 3))  # (N, classes, 1, 1)
    probs = ops.softmax_forward(logits, axis=1)
    got = cp.asnumpy(probs).reshape(n, classes)

    # the float64 reference of the same network
    r = np.maximum(conv2d(x, w1, padding=1) + b1[None, :, None, None], 0)
    r = (r - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None]
    r = max_pool2d(r + beta[None, :, None, None], 2)
    r = conv2d(r, w2).mean(axis=(2, 3))
    ref = softmax(r, axis=1)
    err = rel(got, ref)
    assert err < 1e-3, f"relative error {err:.2e} against the float64 reference"
    print(f"predicted classes {got.argmax(axis=1).tolist()}; relative error against float64 NumPy: {err:.1e}")


if __name__ == "__main__":
    main()
