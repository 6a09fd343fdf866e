"""Digests (sha256) of every L2 op's outputs on fixed inputs, to compare two source trees bitwise on a GPU.

    PYTHONPATH=<tree>/src python3 tests/gpu/bitwise_digest.py OUT.json

torch tensors, float16/32/64 where the op takes them
each call is made three times (so the express path runs on
a tree that has one) and the last outputs are hashed. Run it under each tree (and twice under one, to see which
ops are nondeterministic: cuDNN's spatial-transformer backwards accumulate with atomics) and compare the JSON.
Not a test module: it needs no pytest, and the trees it compares need not have this file."""

import hashlib
import json
import sys

import numpy as np
import torch

from cudnnkit import ops

g = np.random.default_rng(7)


def T(*shape, dtype=torch.float32):
    return torch.from_numpy(g.standard_normal(shape)).to("cuda", dtype)


res = {}


def h(name, out):
    outs = out if isinstance(out, tuple) else (out,)
    res[name] = [
        hashlib.sha256(o.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
        if isinstance(o, torch.Tensor)
        else repr(o)
        for o in outs
    ]


cases = []
for dt in (torch.float32, torch.float16, torch.float64):
    x = T(8, 33, 17, dtype=dt)
    y = torch.softmax(x.float(), -1).to(dt)
    dy = T(8, 33, 17, dtype=dt)
    xt = x.transpose(0, 2)
    cases += [
        (f"softmax_fwd {dt}", lambda x=x: ops.softmax_forward(x)),
        (f"softmax_fwd axis1 log {dt}", lambda x=x: ops.softmax_forward(x, axis=1, log=True)),
        (f"softmax_fwd strided {dt}", lambda x=xt: ops.softmax_forward(x, axis=0)),
        (f"softmax_bwd {dt}", lambda dy=dy, y=y: ops.softmax_backward(dy, y)),
        (f"lrn_fwd {dt}", lambda x=x: ops.lrn_forward(x.reshape(8, 33, 17, 1))),
        (f"set {dt}", lambda dt=dt: ops.set_tensor(torch.zeros(4, 5, 6, device="cuda", dtype=dt), 2.5)),
        (f"scale {dt}", lambda x=x: ops.scale_tensor(x.clone(), 0.5)),
        (f"add {dt}", lambda x=x, dt=dt: ops.add_tensor(T(1, 33, 1, dtype=dt), x.clone(), alpha=2.0, beta=0.5)),
        (f"transform nhwc {dt}", lambda dt=dt: ops.transform_tensor(T(2, 3, 4, 5, dtype=dt), layout="nhwc")),
    ]
    if dt != torch.float16:
        x4 = T(2, 8, 6, 7, dtype=dt)
        y4 = ops.lrn_forward(x4)
        dy4 = T(2, 8, 6, 7, dtype=dt)
        cases += [
            (f"lrn_bwd {dt}", lambda a=dy4, b=y4, c=x4: ops.lrn_backward(a, b, c)),
            (f"divnorm_fwd {dt}", lambda x4=x4: ops.divisive_normalization_forward(x4)),
            (f"divnorm_bwd {dt}", lambda a=dy4, c=x4: ops.divisive_normalization_backward(a, c)),
        ]
    th = T(2, 2, 3, dtype=dt) * 0.3
    grid = ops.affine_grid_forward(th, size=(2, 4, 5, 6))
    xs = T(2, 4, 7, 8, dtype=dt)
    dys = T(2, 4, 5, 6, dtype=dt)
    cases += [
        (f"affine_fwd {dt}", lambda th=th: ops.affine_grid_forward(th, size=(2, 4, 5, 6))),
        (f"affine_bwd {dt}", lambda gr=grid: ops.affine_grid_backward(gr, size=(2, 4, 5, 6))),
        (f"sample_fwd {dt}", lambda a=xs, gr=grid: ops.grid_sample_forward(a, gr)),
        (f"sample_bwd {dt}", lambda a=xs, gr=grid, d=dys: ops.grid_sample_backward(a, gr, d)),
    ]
for dt in (torch.float32, torch.float16):
    xd = T(64, 100, dtype=dt)

    def drop(xd=xd):
        st = ops.DropoutState(xd, 1234)
        y, r = ops.dropout_forward(xd, 0.3, state=st)
        dx = ops.dropout_backward(xd, r, 0.3, state=st)
        return y, dx

    cases.append((f"dropout {dt}", drop))
for name, fn in cases:
    for _ in range(3):
        out = fn()
    torch.cuda.synchronize()
    h(name, out)
json.dump(res, open(sys.argv[1], "w"), indent=0, sort_keys=True)
print(len(res), "cases")
