"""A GPU probe (not a test; run as ``PYTHONPATH=src python tests/gpu/nan_relu_probe.py``): which ReLU epilogue of
the graph API returns NaN for NaN, as torch's ReLU does, and what it costs. cuDNN's ``RELU_FWD`` returns 0
(``tests/gpu/test_torch_fuse_gpu.py``'s xfail); the candidates after conv + bias and after batch norm (training,
bf16 NHWC, conv3x3 64->64 56^2 b64): ``RELU_FWD`` and ``MAX`` with ``nan_propagation=True``, ``MAX(y, 0)`` and ``MAX(0, y)`` (one node, if its NaN rule is the right
one), and ``BINARY_SELECT`` of ``y`` and ``RELU_FWD(y)`` by ``CMP_NEQ(y, y)`` in both argument orders. Prints,
per candidate: the plan, whether it builds, whether the NaN pattern equals torch's float32 reference, the relative
error elsewhere and the time per execute."""

import time

import torch

from cudnnkit.graph import Graph

N, C, H = 64, 64, 56
CL = (C * H * H, 1, H * C, C)


def relu_chain(g, y, chain):
    if chain == "plain":
        return g.pointwise("RELU_FWD", y)
    if chain == "relu_nan":
        return g.pointwise("RELU_FWD", y, nan_propagation=True)
    if chain == "max_nan":
        return g.pointwise("MAX", y, g.scalar(0.0, ndim=y.ndim), nan_propagation=True)
    if chain == "max_y0":
        return g.pointwise("MAX", y, g.scalar(0.0, ndim=y.ndim))
    if chain == "max_0y":
        return g.pointwise("MAX", g.scalar(0.0, ndim=y.ndim), y)
    nan = g.pointwise("CMP_NEQ", y, y, dtype="bool")
    r = g.pointwise("RELU_FWD", y)
    if chain == "select_xr":
        return g.pointwise("BINARY_SELECT", y, r, nan)
    return g.pointwise("BINARY_SELECT", r, y, nan)


def conv_graph(chain):
    g = Graph(compute_dtype="float32", intermediate_dtype="float32")
    x = g.tensor((N, C, H, H), CL, "bfloat16", name="x")
    w = g.tensor((C, C, 3, 3), (C * 9, 1, 3 * C, C), "bfloat16", name="w")
    b = g.tensor((1, C, 1, 1), (C, 1, 1, 1), "bfloat16", name="b")
    y = g.conv_fprop(x, w, padding=1, compute_dtype="float32")
    y = g.pointwise("ADD", y, b)
    o = g.mark_output(relu_chain(g, y, chain), "bfloat16", strides=CL)
    return g, (x, w, b, o)


def bn_graph(chain):
    g = Graph(compute_dtype="float32", intermediate_dtype="float32")
    x = g.tensor((N, C, H, H), CL, "bfloat16", name="x")
    s = g.tensor((1, C, 1, 1), (C, 1, 1, 1), "float32", name="s")
    b = g.tensor((1, C, 1, 1), (C, 1, 1, 1), "float32", name="b")
    res = g.norm_forward("batch", x, s, b, epsilon=1e-5)
    o = g.mark_output(relu_chain(g, res.y, chain), "bfloat16", strides=CL)
    m = g.mark_output(res.mean, "float32", strides=(C, 1, 1, 1))
    iv = g.mark_output(res.inv_variance, "float32", strides=(C, 1, 1, 1))
    return g, (x, s, b, o, m, iv)


def timed(fn, iters=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters


torch.manual_seed(0)
xt = torch.randn(N, C, H, H, device="cuda").bfloat16().contiguous(memory_format=torch.channels_last)
xt[0, :, 10, 10] = float("nan")
xt[1, 3, 20, 20] = float("inf")
wt = (torch.randn(C, C, 3, 3, device="cuda") * 0.05).bfloat16().contiguous(memory_format=torch.channels_last)
bt = torch.randn(C, device="cuda").bfloat16()
ref_conv = torch.relu(torch.nn.functional.conv2d(xt.float(), wt.float(), bt.float(), padding=1))
st, bbt = torch.rand(C, device="cuda") + 0.5, torch.randn(C, device="cuda")
xb = torch.randn(N, C, H, H, device="cuda").bfloat16().contiguous(memory_format=torch.channels_last)
xb[0, 5, 3, 3] = float("nan")
xbf = xb.float()
ref_bn = torch.relu(torch.nn.functional.batch_norm(xbf, None, None, st, bbt, True, 0.0, 1e-5))

for kind in ("conv", "bn"):
    for chain in ("plain", "relu_nan", "max_nan", "max_y0", "max_0y", "select_xr", "select_rx"):
        try:
            t0 = time.perf_counter()
            if kind == "conv":
                g, (x, w, b, o) = conv_graph(chain)
                plan = g.build()
                out = torch.full_like(xt, 7.0)
                binds = {x: xt, w: wt, b: bt.view(1, C, 1, 1), o: out}
                ref = ref_conv
            else:
                g, (x, s, b, o, m, iv) = bn_graph(chain)
                plan = g.build()
                out = torch.full_like(xb, 7.0)
                mo, ivo = torch.empty(C, device="cuda"), torch.empty(C, device="cuda")
                binds = {
                    x: xb,
                    s: st.view(1, C, 1, 1),
                    b: bbt.view(1, C, 1, 1),
                    o: out,
                    m: mo.view(1, C, 1, 1),
                    iv: ivo.view(1, C, 1, 1),
                }
                ref = ref_bn
            build_ms = (time.perf_counter() - t0) * 1e3
            plan.execute(binds)
            torch.cuda.synchronize()
            nan_ok = torch.equal(out.float().isnan(), ref.isnan())
            fin = ~ref.isnan() & ~out.float().isnan()
            err = ((out.float() - ref)[fin].abs().max() / ref[fin].abs().max()).item()
            ms = timed(lambda p=plan, b=binds: p.execute(b))
            print(
                f"{kind:4s} {chain:9s} plan={plan.name} build={build_ms:.0f}ms nan_pattern_equal={nan_ok} "
                f"ref_nans={int(ref.isnan().sum())} out_nans={int(out.float().isnan().sum())} relerr={err:.2e} "
                f"time={ms * 1e3:.1f}us",
                flush=True,
            )
        except Exception as e:
            print(f"{kind:4s} {chain:9s} FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
