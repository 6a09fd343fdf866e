"""Fused convolution + bias + ReLU through the graph API (``cudnnkit.graph``), with CuPy arrays in channels-last
float16: one graph (``conv_fprop`` -> ``ADD`` -> ``RELU_FWD``), one plan, executed through the checked dict path and
the pre-bound fast path; a second ``Graph`` with the same definition gets its plan from the cache. The output is
checked against a float64 NumPy reference.

Run on a machine with a CUDA GPU and CuPy: ``python examples/fused_conv_graph.py``.
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from _reference import conv2d, rel

from cudnnkit.graph import Graph, plan_cache


def channels_last(a: np.ndarray) -> cp.ndarray:
    """A (N, C, H, W) device copy of ``a`` whose memory is NHWC (channels-last strides)."""
    return cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)


def build(x: cp.ndarray, w: cp.ndarray, b: cp.ndarray) -> tuple[Graph, tuple]:
    g = Graph()  # compute and intermediate tensors in float32
    tx, tw, tb = g.tensor_like(x, "x"), g.tensor_like(w, "w"), g.tensor_like(b, "b")
    ty = g.mark_output(g.pointwise("RELU_FWD", g.pointwise("ADD", g.conv_fprop(tx, tw, padding=1), tb)), "float16")
    return g, (tx, tw, tb, ty)


def main() -> None:
    rng = np.random.default_rng(0)
    n, c, h, wd, k = 8, 32, 28, 28, 64
    xh = rng.standard_normal((n, c, h, wd)).astype(np.float16)
    wh = (rng.standard_normal((k, c, 3, 3)) * 0.1).astype(np.float16)
    bh = (rng.standard_normal((1, k, 1, 1)) * 0.5).astype(np.float16)
    x, w = channels_last(xh), channels_last(wh)
    b = cp.asarray(bh)
    y = cp.empty((n, h, wd, k), cp.float16).transpose(0, 3, 1, 2)  # NHWC memory, like x

    g, (tx, tw, tb, ty) = build(x, w, b)
    assert ty.dims == (n, k, h, wd), ty.dims
    plan = g.build()  # heuristics, engine filters, the first plan that finalizes; cached per device
    plan.execute({tx: x, tw: w, tb: b, ty: y})  # every binding checked
    run = plan.bind({tx: x, tw: w, tb: b, ty: y})  # checked once: the fast path for loops
    for _ in range(3):
        run()
    cp.cuda.get_current_stream().synchronize()

    g2, _ = build(x, w, b)  # the same definition: the plan cache answers
    assert g2.build().name == plan.name

    ref = np.maximum(conv2d(xh, wh, padding=1) + bh.astype(np.float64), 0)
    err = rel(cp.asnumpy(y), ref)
    assert err < 1e-2, f"relative error {err:.2e} against the float64 reference"
    print(
        f"plan {plan.name} (workspace {plan.workspace_size} bytes), cache {plan_cache().stats}; rel. error {err:.1e}"
    )


if __name__ == "__main__":
    main()
