"""Independent CPU implementations (torch in float64, or NumPy) of the ops whose results the GPU tier checks.

The GPU tier compares what cuDNN computes with each description's reference (``specs.SPECS[op].check``). Those
references and the checking code cannot run on a machine without a GPU; this module lets the CPU tier check them
anyway: :class:`HostBackend` makes a case's arrays as plain NumPy arrays of their logical values, an emulator here
computes the op's result another way (``torch.nn.functional`` where torch has the op, its autograd for the
gradients), and the description's check must accept it (and reject it perturbed). So a reference that is wrong, or
a check that cannot fail, shows on the CPU instead of as a false "wrong result" on the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .materialize import host_object

__all__ = ["HostBackend", "EMULATORS", "Skip"]


class Skip(Exception):
    """This case has no independent emulation (an even LRN size, where torch's window differs from cuDNN's)."""


class HostBackend:
    """Arrays as NumPy arrays of their logical values; ``gpu`` so that checks compare values."""

    name = "host"
    gpu = True
    libs = ("host",)
    adapters: dict[str, Any] = {}

    def install(self) -> None:
        return None

    def uninstall(self) -> None:
        return None

    def array(self, a: Any, v: np.ndarray, lib: str, other: str | None) -> Any:
        if a.lib in ("host", "list", "torch_cpu"):
            return host_object(a, v)
        return np.array(v, dtype=np.float64)

    def opaque(self, o: Any, ctx: Any, name: str = "extra") -> Any:
        raise Skip("no opaque objects on the host")

    def to_host(self, obj: Any) -> np.ndarray | None:
        return None if obj is None else np.asarray(obj, np.float64)

    def shape_of(self, obj: Any) -> tuple[int, ...] | None:
        return tuple(np.shape(obj))

    def sync(self) -> None:
        return None


def _t(a: np.ndarray, grad: bool = False):
    import torch

    return torch.tensor(np.asarray(a, np.float64), requires_grad=grad)


def _np(t) -> np.ndarray:
    return t.detach().numpy()


def _round(ctx: Any, a: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """What the op's output dtype holds of ``a``."""
    from .materialize import seen

    return seen(a, dtype or ctx.dtype)


def _blend(ctx: Any, r: np.ndarray, out: str = "out", alpha: str = "alpha", beta: str = "beta") -> np.ndarray:
    from .specs import fnum

    a, b = fnum(ctx.param(alpha, 1.0), 1.0), fnum(ctx.param(beta, 0.0), 0.0)
    y = a * r
    if b and out in ctx.hostv:
        y = y + b * ctx.hostv[out]
    return _round(ctx, y)


def _merged(x: np.ndarray, axis: Any) -> tuple[np.ndarray, int]:
    """``x`` with its (adjacent) reduced axes merged into one, and that axis."""
    from .specs import axes_of

    nd = x.ndim
    ax = axes_of(axis, nd)
    first, last = ax[0], ax[-1]
    return x.reshape(x.shape[:first] + (-1,) + x.shape[last + 1 :]), first


def _softmax(ctx: Any) -> Any:
    import torch

    x = ctx.x("x")
    if x.size == 0:
        return _round(ctx, x)
    m, dim = _merged(x, ctx.param("axis", -1))
    f = torch.log_softmax if ctx.param("log", False) else torch.softmax
    return _blend(ctx, _np(f(_t(m), dim)).reshape(x.shape))


def _softmax_backward(ctx: Any) -> Any:
    import torch

    dy, y = ctx.x("dy"), ctx.x("y")
    if dy.size == 0:
        return _round(ctx, dy)
    md, dim = _merged(dy, ctx.param("axis", -1))
    my, _ = _merged(y, ctx.param("axis", -1))
    if ctx.param("log", False):
        r = torch._log_softmax_backward_data(_t(md), _t(my), dim, torch.float64)
    else:
        r = torch._softmax_backward_data(_t(md), _t(my), dim, torch.float64)
    return _blend(ctx, _np(r).reshape(dy.shape))


def _lrn_args(ctx: Any) -> tuple[int, float, float, float]:
    from .specs import _lrn_kw

    p = _lrn_kw(ctx)
    if p["size"] % 2 == 0:
        raise Skip("torch's LRN window differs from cuDNN's for even sizes")
    return p["size"], p["alpha"], p["beta"], p["k"]


def _lrn(ctx: Any) -> Any:
    import torch

    size, alpha, beta, k = _lrn_args(ctx)
    x = ctx.x("x")
    if x.size == 0:
        return _round(ctx, x)
    y = torch.nn.functional.local_response_norm(_t(x), size, alpha, beta, k)
    return _blend(ctx, _np(y), alpha="y_alpha", beta="y_beta")


def _lrn_backward(ctx: Any) -> Any:
    import torch

    size, alpha, beta, k = _lrn_args(ctx)
    x = ctx.x("x")
    if x.size == 0:
        return _round(ctx, x)
    xt = _t(x, True)
    y = torch.nn.functional.local_response_norm(xt, size, alpha, beta, k)
    (dx,) = torch.autograd.grad(y, xt, _t(ctx.x("dy")))
    return _blend(ctx, _np(dx), alpha="dx_alpha", beta="dx_beta")


def _affine(ctx: Any) -> Any:
    import torch

    theta, size = ctx.x("theta"), tuple(ctx.param("size"))
    if size[0] == 0:
        return np.zeros((0, size[2], size[3], 2))
    return _round(ctx, _np(torch.nn.functional.affine_grid(_t(theta), list(size), align_corners=True)))


def _affine_backward(ctx: Any) -> Any:
    import torch

    dgrid, size = ctx.x("dgrid"), tuple(ctx.param("size"))
    if size[0] == 0:
        return np.zeros((0, 2, 3))
    theta = _t(np.zeros((size[0], 2, 3)), True)
    g = torch.nn.functional.affine_grid(theta, list(size), align_corners=True)
    (dt,) = torch.autograd.grad(g, theta, _t(dgrid))
    return _round(ctx, _np(dt))


def _sample(ctx: Any, backward: bool = False) -> Any:
    import torch

    x, grid = ctx.x("x"), ctx.x("grid")
    if x.shape[0] == 0:
        y0 = np.zeros((0, x.shape[1], grid.shape[1], grid.shape[2]))
        return (np.zeros(x.shape), np.zeros(grid.shape)) if backward else y0
    xt, gt = _t(x, True), _t(grid, True)
    y = torch.nn.functional.grid_sample(xt, gt, mode="bilinear", padding_mode="zeros", align_corners=True)
    if not backward:
        return _blend(ctx, _np(y))
    dx, dg = torch.autograd.grad(y, (xt, gt), _t(ctx.x("dy")))
    return _blend(ctx, _np(dx), out="dx_out"), _blend(ctx, _np(dg), "dgrid_out", "alpha_dgrid", "beta_dgrid")


def _pool_sizes(sizes, window, stride, pre, post, ceil: bool) -> list[int]:
    """Output sizes: torch's own pooling's (its ``ceil_mode``) where it takes the padding (both sides alike, at most
    half the window), else torch's rule written out with the padding before and after apart."""
    import torch

    out = []
    for i, k, s, a, b in zip(sizes, window, stride, pre, post):
        if a == b and 2 * a <= k:
            out.append(int(torch.nn.functional.max_pool1d(torch.zeros(1, 1, i), k, s, a, ceil_mode=ceil).shape[-1]))
            continue
        span = i + a + b - k
        n = (-(-span // s) if ceil else span // s) + 1
        if ceil and n > 1 and (n - 1) * s >= i + a:
            n -= 1
        out.append(n)
    return out


def _pooling(ctx: Any, backward: bool = False) -> Any:
    """``pooling_forward``/``_backward`` by torch's pooling over the input padded explicitly (``F.pad``: -inf for
    max, zeros for averages, whose exclude-padding form divides by the pooled ones-mask), cropped to the output
    size torch gives (with ``ceil_mode``): a window past the declared padding counts its padding as cuDNN, given
    that padding, does (an average including padding divides by the whole window). With ``return_index`` the index
    is torch's argmax, made relative to its window (row-major, padded cells counted)."""
    import torch

    fn = torch.nn.functional
    x = ctx.x("x")
    mode = ctx.param("mode", "max")
    window = tuple(int(v) for v in ctx.param("window"))
    stride = ctx.param("stride")
    stride = window if stride is None else tuple(int(v) for v in stride)
    pad = tuple(ctx.param("padding"))
    pre = [int(p[0] if isinstance(p, (tuple, list)) else p) for p in pad]
    post = [int(p[1] if isinstance(p, (tuple, list)) else p) for p in pad]
    nsp = x.ndim - 2
    out = _pool_sizes(x.shape[2:], window, stride, pre, post, bool(ctx.param("ceil_mode", False)))
    wide = [max(b, (o - 1) * s + k - i - a) for i, k, s, a, b, o in zip(x.shape[2:], window, stride, pre, post, out)]
    flat = [v for a, b in reversed(list(zip(pre, wide))) for v in (a, b)]
    crop = (slice(None), slice(None), *(slice(0, o) for o in out))
    index = mode.startswith("max") and not backward and ctx.param("return_index", False) is True
    if x.shape[0] == 0:
        if backward:
            return _round(ctx, np.zeros(x.shape))
        y0 = np.zeros((*x.shape[:2], *out))
        return (y0, None) if index else y0
    maxp, avgp = getattr(fn, f"max_pool{nsp}d"), getattr(fn, f"avg_pool{nsp}d")

    def fwd(xt):
        if mode.startswith("max"):
            return maxp(fn.pad(xt, flat, value=-math.inf), window, stride)[crop]
        y = avgp(fn.pad(xt, flat), window, stride)
        if mode == "avg_exclude_padding":
            y = y / avgp(fn.pad(torch.ones_like(xt), flat), window, stride)
        return y[crop]

    if backward:
        xt = _t(x, True)
        (dx,) = torch.autograd.grad(fwd(xt), xt, _t(ctx.x("dy")))
        return _blend(ctx, _np(dx))
    y = _blend(ctx, _np(fwd(_t(x))))
    if not index:
        return y
    padded = fn.pad(_t(x), flat, value=-math.inf)
    _, flat_idx = maxp(padded, window, stride, return_indices=True)
    coords = np.unravel_index(flat_idx[crop].numpy(), padded.shape[2:])
    rel = [c - (np.arange(o) * s).reshape([-1 if j == d else 1 for j in range(nsp)])
           for d, (c, o, s) in enumerate(zip(coords, out, stride))]  # fmt: skip
    return y, np.ravel_multi_index(rel, window).astype(np.float64)


def _batch_norm(ctx: Any, backward: bool = False) -> Any:
    """``batch_norm_forward``/``_backward`` by torch's ``batch_norm`` (per activation: over ``(N, C * spatial)``
    features), its running-statistics update written into the arrays given, its autograd for the backward; the
    fused ReLU as ``relu(bn(x) + z)`` forward, and backward the gradient passed where the given ``y`` is positive
    (``dz`` that gradient)."""
    import torch

    from .specs import _dx_ref, _true, fnum

    fn = torch.nn.functional
    mode = ctx.param("mode", "spatial")
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    relu = ctx.param("activation") == "relu"
    x = ctx.x("x")
    ps = ctx.x("scale").shape

    def flat(t):
        return t.reshape(t.shape[0], -1) if mode == "per_activation" else t

    if backward:
        dy = ctx.x("dy")
        if relu:
            dy = np.where(ctx.x("y") > 0, dy, 0.0)
        xt, st, bt = _t(x, True), _t(ctx.x("scale").reshape(-1), True), _t(np.zeros(math.prod(ps)), True)
        y = fn.batch_norm(flat(xt), None, None, st, bt, training=True, eps=eps)
        dx, ds, db = torch.autograd.grad(y, (xt, st, bt), flat(_t(dy)))
        if _dx_ref(_np(dx), dy, ctx.x("scale") * ctx.x("saved_inv_std")) is None:
            raise Skip("dx cancels to rounding noise (two values per statistic): the check compares no values")
        out = (_round(ctx, _np(dx)), _np(ds).reshape(ps), _np(db).reshape(ps))
        return out + ((_round(ctx, dy),) if relu and _true(ctx.param("z_grad", False)) else ())
    xt, st, bt = _t(x), _t(ctx.x("scale").reshape(-1)), _t(ctx.x("bias").reshape(-1))
    rm, rv = ctx.x("running_mean"), ctx.x("running_var")
    training = bool(ctx.param("training", True))
    stats = [None if v is None else _t(v).reshape(-1).clone() for v in (rm, rv)]
    y = fn.batch_norm(flat(xt), stats[0], stats[1], st, bt, training=training,
                      momentum=fnum(ctx.param("momentum", 0.1), 0.1), eps=eps).reshape(x.shape)  # fmt: skip
    if relu:
        y = torch.relu(y + (_t(ctx.x("z")) if ctx.x("z") is not None else 0.0))
    if not training:
        return _round(ctx, _np(y))
    for name, t in zip(("running_mean", "running_var"), stats):
        if t is not None:
            ctx.arg(name)[...] = _np(t).reshape(ps)
    dims = (0,) if mode == "per_activation" else (0, *range(2, x.ndim))
    var, mean = torch.var_mean(xt, dims, unbiased=False)
    out = (_round(ctx, _np(y)), _np(mean).reshape(ps), _np(torch.rsqrt(var + eps)).reshape(ps))
    return out + ((None,) if relu else ())


def _ctc(ctx: Any) -> Any:
    import torch

    from .specs import _index_values

    x = ctx.x("x")
    T, N, A_ = x.shape
    if N == 0:
        return np.zeros(0), np.zeros(x.shape)
    labels = _index_values(ctx.case.kwargs["labels"], ctx, "labels")
    ll = _index_values(ctx.case.kwargs["label_lengths"], ctx, "label_lengths")
    il = _index_values(ctx.case.kwargs["input_lengths"], ctx, "input_lengths")
    xt = _t(x, True)
    norm = ctx.param("normalization", "softmax")
    lp = torch.log_softmax(xt, 2) if norm == "softmax" else torch.log(xt)
    c = torch.nn.functional.ctc_loss(lp, torch.tensor(labels), torch.tensor(il), torch.tensor(ll), blank=0,
                                     reduction="none", zero_infinity=False)  # fmt: skip
    if norm != "softmax":
        return _np(c).astype(np.float32).astype(np.float64), np.zeros(x.shape)
    (g,) = torch.autograd.grad(c.sum(), xt)
    return _np(c), _np(g)


def _set(ctx: Any, scale: bool = False) -> Any:
    """In place, as the op: writes the arrays ``y`` and returns it."""
    from .specs import fnum

    y = ctx.x("y")
    v = fnum(ctx.param("alpha" if scale else "value"))
    out = ctx.arg("y")
    out[...] = _round(ctx, y * _round(ctx, np.array(v))) if scale else float(_round(ctx, np.array(v)))
    return out


def _add(ctx: Any) -> Any:
    from .specs import fnum

    a, c = ctx.x("a"), ctx.x("c")
    alpha, beta = fnum(ctx.param("alpha", 1.0), 1.0), fnum(ctx.param("beta", 1.0), 1.0)
    out = ctx.arg("c")
    out[...] = _round(ctx, alpha * np.broadcast_to(a, c.shape) + beta * c)
    return out


def _transform(ctx: Any) -> Any:
    x = ctx.x("x")
    nd = x.ndim
    pb, pa = ctx.param("pad_before", 0), ctx.param("pad_after", 0)
    pb = tuple(pb) if isinstance(pb, (tuple, list)) else (int(pb),) * nd
    pa = tuple(pa) if isinstance(pa, (tuple, list)) else (int(pa),) * nd
    out = np.zeros(tuple(s + b + a for s, b, a in zip(x.shape, pb, pa)))
    out[tuple(slice(b, b + s) for b, s in zip(pb, x.shape))] = x
    return _blend(ctx, out)


# ----------------------------------------------------------------- graph ops (results as the programs return them)


def _pointwise(ctx: Any) -> Any:
    import torch

    mode = ctx.param("mode")
    x = _t(ctx.x("x"))
    f = {
        "RELU_FWD": torch.relu,
        "TANH_FWD": torch.tanh,
        "SIGMOID_FWD": torch.sigmoid,
        "EXP": torch.exp,
        "ABS": torch.abs,
        "NEG": torch.neg,
        "SQRT": lambda v: torch.sqrt(torch.abs(v)),
        "IDENTITY": lambda v: v,
    }
    binary = {"ADD": torch.add, "MUL": torch.mul, "SUB": torch.sub, "MAX": torch.maximum, "MIN": torch.minimum}
    if mode in f:
        y = f[mode](x)
    elif mode in binary:
        y = binary[mode](x, _t(ctx.x("b")))
    else:
        xt = _t(ctx.x("x"), True)
        (y,) = torch.autograd.grad(torch.relu(xt), xt, _t(ctx.x("dy")))
    return {"y": _round(ctx, _np(y))}


def _matmul(ctx: Any) -> Any:
    import torch

    return {"c": _round(ctx, _np(torch.matmul(_t(ctx.x("a")), _t(ctx.x("b")))))}


def _conv(ctx: Any) -> Any:
    import torch

    s, p, dl = (int(ctx.param(k, d)) for k, d in (("stride", 1), ("pre_padding", 0), ("dilation", 1)))
    y = torch.nn.functional.conv2d(_t(ctx.x("x")), _t(ctx.x("w")), stride=s, padding=p, dilation=dl)
    return {"y": _round(ctx, _np(y))}


def _reduction(ctx: Any) -> Any:
    import torch

    x = _t(ctx.x("x"))
    od = tuple(ctx.param("out_dims"))
    axes = [i for i, (a, b) in enumerate(zip(x.shape, od)) if b == 1 and a != 1]
    mode = ctx.param("mode")
    if not axes:
        return {"y": _np(x)}
    fns: dict[str, Callable] = {
        "add": lambda v: v.sum(axes, keepdim=True),
        "mul": lambda v: v.prod(axes[0], keepdim=True) if len(axes) == 1 else _prod(v, axes),
        "max": lambda v: v.amax(axes, keepdim=True),
        "min": lambda v: v.amin(axes, keepdim=True),
        "amax": lambda v: v.abs().amax(axes, keepdim=True),
        "avg": lambda v: v.mean(axes, keepdim=True),
        "norm1": lambda v: v.abs().sum(axes, keepdim=True),
        "norm2": lambda v: torch.sqrt((v * v).sum(axes, keepdim=True)),
    }
    return {"y": _np(fns[mode](x)).astype(np.float32).astype(np.float64)}


def _prod(v, axes):
    for a in sorted(axes, reverse=True):
        v = v.prod(a, keepdim=True)
    return v


def _pool(ctx: Any, backward: bool = False) -> Any:
    import torch

    k, s, p, mode = (ctx.param(n) for n in ("window", "stride", "pre_padding", "mode"))
    k, s, p = int(k), int(s), int(p)

    def fwd(x):
        if mode == "max":
            return torch.nn.functional.max_pool2d(x, k, s, p)
        return torch.nn.functional.avg_pool2d(x, k, s, p, count_include_pad=mode == "avg_include_padding")

    if not backward:
        return {"y": _round(ctx, _np(fwd(_t(ctx.x("x")))))}
    xt = _t(np.zeros(ctx.case.setup["x_shape"]), True)
    (dx,) = torch.autograd.grad(fwd(xt), xt, _t(ctx.x("dy")))
    return {"dx": _round(ctx, _np(dx))}


def _norm(ctx: Any, backward: bool = False) -> Any:
    import torch

    from .specs import fnum

    rms = ctx.param("mode") == "rms"
    eps = fnum(ctx.param("epsilon", 1e-5), 1e-5)
    x = _t(ctx.x("x"), True)
    n, c = x.shape[:2]
    scale = _t(ctx.x("scale").reshape(c), True)
    bias = None if rms else _t(ctx.x("bias").reshape(c), True) if not backward else _t(np.zeros(c), True)
    flat = x.reshape(n, c)
    if rms:
        inv = torch.rsqrt((flat * flat).mean(1, keepdim=True) + eps)
        y = flat * inv * scale
        mean = None
    else:
        y = torch.nn.functional.layer_norm(flat, (c,), scale, bias, eps)
        mean = flat.mean(1, keepdim=True)
        inv = torch.rsqrt(flat.var(1, unbiased=False, keepdim=True) + eps)
    if not backward:
        out = {"y": _round(ctx, _np(y).reshape(n, c, 1, 1)), "inv_variance": _np(inv).reshape(n, 1, 1, 1)}
        if mean is not None:
            out["mean"] = _np(mean).reshape(n, 1, 1, 1)
        return out
    dy = _t(ctx.x("dy").reshape(n, c))
    grads = torch.autograd.grad(y, [x, scale] + ([] if rms else [bias]), dy)
    out = {"dx": _round(ctx, _np(grads[0])), "dscale": _np(grads[1]).reshape(1, c, 1, 1)}
    if not rms:
        out["dbias"] = _np(grads[2]).reshape(1, c, 1, 1)
    return out


def _sdpa(ctx: Any) -> Any:
    import torch

    from .specs import fnum

    q, k, v = (_t(ctx.x(n)) for n in ("q", "k", "v"))
    scale = fnum(ctx.param("scale", None), 1 / math.sqrt(q.shape[-1]))
    causal = bool(ctx.param("causal", False))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return {"o": _round(ctx, _np(o)), "stats": _np(torch.logsumexp(s, -1, keepdim=True))}


def _attention(ctx: Any, backward: bool = False) -> Any:
    """attention_forward/backward with the drawn variant, vectorized from the docstring's definition (index grids
    for the band, lengths as column/row limits, torch's autograd for the gradients): not specs' loop-built
    keep-matrix reference."""
    import torch

    from .specs import fnum

    q, k, v = (_t(ctx.x(n), True) for n in ("q", "k", "v"))
    b, h, sq, d = q.shape
    skv, rep = k.shape[2], h // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ kk.transpose(-1, -2)) * fnum(ctx.param("scale", None), 1 / math.sqrt(d))
    cap = ctx.param("softcap", None)
    if cap is not None:
        s = torch.tanh(s / fnum(cap)) * fnum(cap)
    leaves = {}
    if ctx.x("attn_mask") is not None:
        leaves["dbias"] = _t(ctx.x("attn_mask"), True)
        s = s + leaves["dbias"]
    row = torch.arange(sq, dtype=torch.float64).view(1, 1, sq, 1)
    col = torch.arange(skv, dtype=torch.float64).view(1, 1, 1, skv)
    if ctx.x("alibi_slopes") is not None:
        s = s + _t(ctx.x("alibi_slopes")).reshape(1, h, 1, 1) * (col - row)
    if ctx.x("seq_len_q") is not None:
        lq, lkv = (_t(ctx.x(n)).reshape(b, 1, 1, 1) for n in ("seq_len_q", "seq_len_kv"))
    else:
        lq, lkv = torch.full((b, 1, 1, 1), float(sq)), torch.full((b, 1, 1, 1), float(skv))
    shifted = row + (lkv - lq if ctx.param("diagonal_alignment", "top_left") == "bottom_right" else 0.0)
    keep = (col < lkv).expand(b, 1, sq, skv)
    right = 0 if bool(ctx.param("is_causal", False)) else ctx.param("right_bound", None)
    if right is not None:
        keep = keep & (col <= shifted + right)
    if ctx.param("left_bound", None) is not None:
        keep = keep & (col > shifted - ctx.param("left_bound"))
    keep = keep | ((row >= lq) & (col < lkv))  # rows past S_q_b: not defined (every key of the sample kept)
    s = s.masked_fill(~keep, float("-inf"))
    if ctx.x("sink") is not None:
        leaves["dsink"] = _t(ctx.x("sink"), True)
        s = torch.cat([s, leaves["dsink"].reshape(1, h, 1, 1).expand(b, h, sq, 1)], -1)
    lse = torch.logsumexp(s, -1, keepdim=True)
    o = torch.exp(s - lse)[..., :skv] @ vv
    if not backward:
        return _round(ctx, _np(o)), _np(lse)
    names = ["dq", "dk", "dv"] + [n for n in ("dbias", "dsink") if ctx.param(n, False) is True]
    grads = torch.autograd.grad(o, [q, k, v] + [leaves[n] for n in names[3:]], _t(ctx.x("do")))
    return tuple(_np(g) if n == "dsink" else _round(ctx, _np(g)) for g, n in zip(grads, names))


EMULATORS: dict[str, Callable[[Any], Any]] = {
    "softmax_forward": _softmax,
    "softmax_backward": _softmax_backward,
    "lrn_forward": _lrn,
    "lrn_backward": _lrn_backward,
    "affine_grid_forward": _affine,
    "affine_grid_backward": _affine_backward,
    "grid_sample_forward": _sample,
    "grid_sample_backward": lambda ctx: _sample(ctx, True),
    "ctc_loss": _ctc,
    "pooling_forward": _pooling,
    "pooling_backward": lambda ctx: _pooling(ctx, True),
    "batch_norm_forward": _batch_norm,
    "batch_norm_backward": lambda ctx: _batch_norm(ctx, True),
    "set_tensor": _set,
    "scale_tensor": lambda ctx: _set(ctx, True),
    "add_tensor": _add,
    "transform_tensor": _transform,
    "Graph.pointwise": _pointwise,
    "Graph.matmul": _matmul,
    "Graph.conv_fprop": _conv,
    "Graph.reduction": _reduction,
    "Graph.resample_forward": _pool,
    "Graph.resample_backward": lambda ctx: _pool(ctx, True),
    "Graph.norm_forward": _norm,
    "Graph.norm_backward": lambda ctx: _norm(ctx, True),
    "Graph.sdpa_forward": _sdpa,
    "attention_forward": _attention,
    "attention_backward": lambda ctx: _attention(ctx, True),
}
