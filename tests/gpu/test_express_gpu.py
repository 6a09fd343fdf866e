"""The express path on the GPU, for the ops of issue 12: repeated calls with the same metadata and fresh values
(and fresh output allocations) give, call after call, the full sequence's result for those values, on both paths
(the graph's pointer-only hits, ``ops._primitive._fire_graph``, and the legacy replays). A hit that bound a stale
pointer, or a new output into the wrong slot, fails here."""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit import ops, settings
from cudnnkit.ops import _express

from ..numerics import dev, host, rel

pytestmark = pytest.mark.gpu


def _full(fn):
    """``fn()`` through the full sequence: the express path off for this call, its entries kept (``enabled(False)``
    would drop them, and then no later call could be a hit)."""
    was = _express._on[0]
    _express._on[0] = False
    try:
        return fn()
    finally:
        _express._on[0] = was


def _outputs(got):
    return got if isinstance(got, tuple) else (got,)


CASES = {
    "conv fwd": lambda xp, a, dt, lay: ops.convolution_forward(a[0], a[1], padding=1),
    # x in the case's layout, w always C order: the graph runs a channels-last copy of w for channels-last x
    "conv fwd w C-order": lambda xp, a, dt, lay: ops.convolution_forward(a[0], a[10], padding=1),
    "conv fwd fused": lambda xp, a, dt, lay: ops.convolution_forward(a[0], a[1], a[2], activation="relu", padding=1),
    "conv fwd asymmetric": lambda xp, a, dt, lay: ops.convolution_forward(a[0], a[1], padding=((0, 1), (1, 0))),
    "conv dgrad": lambda xp, a, dt, lay: ops.convolution_backward_data(a[3], a[1], x_shape=(2, 8, 9, 9), padding=1),
    "conv wgrad": lambda xp, a, dt, lay: ops.convolution_backward_filter(a[0], a[3], w_shape=(8, 8, 3, 3), padding=1),
    "conv bias grad": lambda xp, a, dt, lay: ops.convolution_backward_bias(a[3]),
    "max pool": lambda xp, a, dt, lay: ops.pooling_forward(a[0], window=3, stride=2, padding=1),
    "avg pool ceil (graph)": lambda xp, a, dt, lay: ops.pooling_forward(
        a[0], mode="avg_exclude_padding", window=3, stride=2, ceil_mode=True
    ),  # fmt: skip
    "relu": lambda xp, a, dt, lay: ops.activation_forward(a[0], "relu"),
    # normalization: a[4]/a[5] scale and bias (C,), a[6]/a[7] running statistics, a[8]/a[9] layer-norm params (W,)
    "bn train": lambda xp, a, dt, lay: ops.batch_norm_forward(a[0], a[4], a[5], running_mean=a[6], running_var=a[7]),
    "bn inference": lambda xp, a, dt, lay: ops.batch_norm_forward(
        a[0], a[4], a[5], running_mean=a[6], running_var=a[7], training=False
    ),  # fmt: skip
    # (y, saved statistics; the reserve's bytes are cuDNN's, not compared)
    "bn fused add relu": lambda xp, a, dt, lay: ops.batch_norm_forward(a[0], a[4], a[5], z=a[3], activation="relu")[:3],
    "bn backward": lambda xp, a, dt, lay: ops.batch_norm_backward(
        a[3], a[0], a[4], *ops.batch_norm_forward(a[0], a[4], a[5])[1:]
    ),  # fmt: skip
    "layer norm": lambda xp, a, dt, lay: ops.layer_norm_forward(a[0], a[8], a[9]),
    "layer norm backward": lambda xp, a, dt, lay: ops.layer_norm_backward(
        a[3], a[0], a[8], *ops.layer_norm_forward(a[0], a[8], a[9])[1:]
    ),  # fmt: skip
}


def _mean_grad(xp, g):
    """What a mean over space hands back as the gradient: ``g`` (C,) expanded to (2, C, 9, 9), stride 0."""
    return xp.module.broadcast_to(g.reshape(1, g.shape[0], 1, 1), (2, g.shape[0], 9, 9))


# inputs cuDNN cannot take as they are (expanded): prepare's copy, which a hit makes again (Entry.copies)
CASES |= {
    "relu backward expanded dy": lambda xp, a, dt, lay: ops.activation_backward(
        _mean_grad(xp, a[2]), ops.activation_forward(a[0], "relu"), a[0], "relu"
    ),  # fmt: skip
    "conv dgrad expanded dy": lambda xp, a, dt, lay: ops.convolution_backward_data(
        _mean_grad(xp, a[2]), a[1], x_shape=(2, 8, 9, 9), padding=1
    ),  # fmt: skip
    "conv bias grad expanded dy": lambda xp, a, dt, lay: ops.convolution_backward_bias(_mean_grad(xp, a[2])),
    # a C-order dy for a channels-last y (the "nhwc" cases): copied into y's layout, which a hit repeats
    "relu backward C-order dy": lambda xp, a, dt, lay: ops.activation_backward(
        xp.contiguous(a[3], None), ops.activation_forward(a[0], "relu"), a[0], "relu"
    ),  # fmt: skip
}
_GRAPH_ONLY = ("conv fwd asymmetric", "avg pool ceil (graph)", "layer norm", "layer norm backward")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype, layout", [("float16", "nhwc"), ("float32", "nchw"), ("float64", "nchw")])
@pytest.mark.parametrize("prefer", ["auto", "legacy"])
def test_repeated_calls_match_the_full_sequence(xp, case, dtype, layout, prefer):
    if dtype == "float64" and case in _GRAPH_ONLY:
        pytest.skip("graph-only calls: float64 has no graph form (refusal tested on the CPU)")
    if prefer == "legacy" and case in _GRAPH_ONLY:
        pytest.skip("graph-only calls")
    fn = CASES[case]
    rng = np.random.default_rng(0)
    _express.entries.clear()
    with settings(prefer=prefer, allow_tf32=False, deterministic=True):
        for i in range(4):  # 1: full sequence, 2: records the entry, 3-4: express hits (fresh values each time)
            a = [dev(xp, rng.standard_normal((2, 8, 9, 9)), dtype, layout),
                 dev(xp, rng.standard_normal((8, 8, 3, 3)) / 8, dtype, layout),
                 dev(xp, rng.standard_normal(8), dtype),
                 dev(xp, rng.standard_normal((2, 8, 9, 9)), dtype, layout)]  # fmt: skip
            pdt = "float64" if dtype == "float64" else "float32"  # the normalization parameters' dtype
            a += [dev(xp, rng.standard_normal(8), pdt), dev(xp, rng.standard_normal(8), pdt),
                  dev(xp, rng.standard_normal(8), pdt), dev(xp, rng.uniform(0.5, 2, 8), pdt),
                  dev(xp, rng.standard_normal(9), pdt), dev(xp, rng.standard_normal(9), pdt),
                  dev(xp, rng.standard_normal((8, 8, 3, 3)) / 8, dtype)]  # fmt: skip
            got = [host(xp, o) for o in _outputs(fn(xp, a, dtype, layout)) if o is not None]
            path = ops.last_path()
            want = [host(xp, o) for o in _outputs(_full(lambda a=a: fn(xp, a, dtype, layout))) if o is not None]
            assert ops.last_path() == path
            for g, w in zip(got, want, strict=True):
                assert rel(g, w) < (1e-3 if dtype == "float16" else 1e-6), (case, i, path)  # the same algorithm
    if case.startswith("layer norm") and layout == "nhwc":
        return  # x is copied C-order (its normalized dims must be dense): a call with a copy is never express
    assert _express.info()["hits"] >= 2, "the repeated calls never took the express path"


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["expanded", "C order"])
def test_gradient_in_another_layout_takes_the_express_path(xp, layout, dtype, kind):
    """The eager CNN step's second ReLU backward: the gradient a global mean hands back is expanded (stride 0 over
    space), or dense in C order (torch's adaptive average pooling's backward) while the activation is channels-last.
    It is copied once, into the activation's own layout (an expanded one not into C order and then again into
    y's), the repeated call takes the express path and makes that copy again, and every call matches float64 with
    the activation's layout kept."""
    rng = np.random.default_rng(1)
    _express.entries.clear()
    for _ in range(4):
        xh, gh = rng.standard_normal((2, 8, 9, 9)), rng.standard_normal(8)
        x = dev(xp, xh, dtype, layout)
        y = ops.activation_forward(x, "relu")
        dy = _mean_grad(xp, dev(xp, gh, dtype))
        if kind == "C order":
            dy = xp.contiguous(dy, None)
        dx = ops.activation_backward(dy, y, x, "relu")
        want = (xh > 0) * gh.reshape(1, 8, 1, 1)  # float64
        assert rel(host(xp, dx), want) < (1e-3 if dtype == "float16" else 1e-6)
        assert xp.view(dx, "dx").strides == xp.view(x, "x").strides
    hits = sum(e.hits for sig, e in list(_express.entries._d.items()) if sig[0] == "activation_backward")
    assert hits >= 2, "the backward with an expanded gradient never took the express path"


def test_copies_by_another_library_are_not_repeated_on_its_stream():
    """A torch tensor first (the launch's library) and an expanded CuPy array (copied by prepare, by CuPy, on the
    launch stream): such a call is not remembered with its copy, since a hit would make it on CuPy's current stream.
    That stream is held back here by a spin kernel while torch's runs at once: every call, repeated, matches."""
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    spin = cupy.RawKernel(
        'extern "C" __global__ void spin(long long n) { long long t = clock64(); while (clock64() - t < n) {} }',
        "spin",
    )
    n, c, h, w = 4, 8, 16, 16
    ts, cs = torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)
    a = torch.randn(n, c, h, w, device="cuda")
    torch.cuda.synchronize()
    _express.entries.clear()
    with torch.cuda.stream(ts), cs:
        for i in range(5):
            g = cupy.asarray(np.random.default_rng(i).standard_normal(c).astype(np.float32))
            b = cupy.broadcast_to(g.reshape(1, c, 1, 1), (n, c, h, w))
            cs.synchronize()
            spin((1,), (1,), (np.int64(50_000_000),))  # work queued on CuPy's current stream
            got = ops.op_tensor(a, b, op="add")
            torch.cuda.synchronize()
            cupy.cuda.runtime.deviceSynchronize()
            want = a.cpu().numpy().astype(np.float64) + cupy.asnumpy(b)
            assert np.abs(got.cpu().numpy() - want).max() < 1e-5, i
