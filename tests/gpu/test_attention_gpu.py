"""Attention variants on the GPU (issue 17), forward and backward, against a float64 torch-CPU reference written
here from the definition (explicit keep-mask matrices, bias, ALiBi, softcap, dropout mask; gradients by torch's
autograd in float64): causal top-left and bottom-right, sliding windows, padding masks, bias and its gradient,
ALiBi, softcap, d_qk != d_v and head dim 256, grouped/multi-query heads, dropout replayed from seed/offset,
deterministic backward (bitwise repeats), through the graph layer (``Graph.execute``) and the L2 op
(``ops.attention_forward``/``attention_backward``). Fresh random inputs, NaN-poisoned outputs, errors
``||got - ref|| / ||ref||`` by dtype."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cudnnkit
from cudnnkit.graph import Graph

from ..numerics import rel
from .test_graph_nodes_gpu import got, nan_like, put, seen

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = {"float16": 5e-3, "bfloat16": 1.2e-2}
B, H = 2, 4


@pytest.fixture
def dev():
    """One array library's adapter (torch, else CuPy): the graph layer does not depend on which."""
    from cudnnkit.runtime import adapters

    from ..conftest import gpu_libraries

    libs = gpu_libraries()
    if not libs:
        pytest.skip("no CUDA device")
    return adapters.get("torch" if "torch" in libs else libs[0])


# ----------------------------------------------------------------- the reference (float64, torch on the CPU)


def keep_matrix(sq, skv, *, b=B, causal=False, left=None, right=None, align="top_left", lens_q=None, lens_kv=None):
    """The (b, 1, Sq, Skv) boolean keep-mask from the definition, element by element: row i keeps column j when
    ``i - left < j - shift <= i + right`` (``shift = Skv_b - Sq_b`` bottom-right, else 0; ``right = 0`` for
    causal) and ``i < Sq_b``, ``j < Skv_b``; rows past ``Sq_b`` are kept whole up to ``Skv_b`` (their output is
    not defined: the reference gives them finite values and a zero cotangent)."""
    if causal:
        right = 0
    batch = b
    keep = np.zeros((batch, 1, sq, skv), bool)
    for b in range(batch):
        lq = sq if lens_q is None else lens_q[b]
        lkv = skv if lens_kv is None else lens_kv[b]
        shift = lkv - lq if align == "bottom_right" else 0
        for i in range(sq):
            for j in range(lkv):
                if i >= lq:
                    keep[b, 0, i, j] = True
                    continue
                ok = True
                if right is not None and not j <= i + shift + right:
                    ok = False
                if left is not None and not j > i + shift - left:
                    ok = False
                keep[b, 0, i, j] = ok
    return keep


def reference(q, k, v, do, *, scale, keep=None, bias=None, slopes=None, softcap=None, drop=None, p=0.0, sink=None):
    """o, lse, (dq, dk, dv, dbias, dsink) in float64: ``s = scale q k^T``, ``c tanh(s/c)``, ``+ bias``,
    ``+ slope_h (j - i)``, masked to -inf where ``keep`` is False, softmax (with ``sink``: one more logit
    ``sink_h`` per row in the normalizer, with no value), ``* drop / (1 - p)``, ``@ v``; grouped heads: query head
    i reads key/value head ``i // (H / H_kv)``."""
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in (("q", q), ("k", k), ("v", v))}
    tb = None if bias is None else torch.tensor(bias, dtype=torch.float64, requires_grad=True)
    ts = None if sink is None else torch.tensor(sink, dtype=torch.float64, requires_grad=True)
    h, hk = q.shape[1], k.shape[1]
    kk = t["k"].repeat_interleave(h // hk, dim=1)
    vv = t["v"].repeat_interleave(h // hk, dim=1)
    s = t["q"] @ kk.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if tb is not None:
        s = s + tb
    sq, skv = s.shape[-2:]
    if slopes is not None:
        dist = torch.arange(skv, dtype=torch.float64)[None, :] - torch.arange(sq, dtype=torch.float64)[:, None]
        s = s + torch.tensor(slopes, dtype=torch.float64).view(1, h, 1, 1) * dist
    if keep is not None:
        s = s.masked_fill(~torch.tensor(keep), -math.inf)
    if ts is None:
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
    else:
        lse = torch.logsumexp(torch.cat([s, ts.expand(s.shape[0], h, sq, 1)], dim=-1), dim=-1, keepdim=True)
    pr = torch.exp(s - lse)
    if drop is not None:
        pr = pr * torch.tensor(drop, dtype=torch.float64) / (1 - p)
    o = pr @ vv
    o.backward(torch.tensor(do, dtype=torch.float64))
    grads = [t[n].grad.numpy() for n in ("q", "k", "v")] + [None if x is None else x.grad.numpy() for x in (tb, ts)]
    return o.detach().numpy(), lse.detach().numpy(), grads


def draw(rng, shape, dtype, scale=1.0):
    return seen(rng.standard_normal(shape) * scale, dtype)


def alibi_slopes(h):
    """The ALiBi paper's slopes for a power-of-two head count: 2^(-8 (i + 1) / h)."""
    return np.array([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])


# ----------------------------------------------------------------- the graph layer, forward and backward


def check(dev, dtype="bfloat16", *, sq=128, skv=128, hk=H, d=64, dv=64, lens=None, keep=None, bias_dims=None,
          dbias=False, slopes=False, softcap=None, sink=False, deterministic=False, seed=0, **kw):  # fmt: skip
    """Forward and backward graphs of one variant against :func:`reference`; ``kw`` go to both graphs. The
    backward reads the reference's o and lse (cast to the graph's types), so each direction is checked alone.
    Only the defined region is compared: rows ``i < Sq_b`` of o, stats and dq, rows ``j < Skv_b`` of dk, dv."""
    rng = np.random.default_rng(seed)
    q = draw(rng, (B, H, sq, d), dtype)
    k = draw(rng, (B, hk, skv, d), dtype)
    v = draw(rng, (B, hk, skv, dv), dtype)
    do = draw(rng, (B, H, sq, dv), dtype)
    lq, lkv = (None, None) if lens is None else lens
    if lq is not None:
        for b in range(B):
            do[b, :, lq[b] :] = 0.0
    bias = None if bias_dims is None else draw(rng, bias_dims, dtype)
    sl = None if not slopes else alibi_slopes(H)
    sk = None if not sink else rng.standard_normal((1, H, 1, 1)) + 2.0  # weighs like a few keys
    scale = 1 / math.sqrt(d)
    o_ref, lse_ref, grads_ref = reference(q, k, v, do, scale=scale, keep=keep, bias=bias, slopes=sl,
                                          softcap=softcap, sink=sk)  # fmt: skip
    tol = TOL[dtype]

    def graph_inputs(g):
        ts = {n: g.tensor(a.shape, dtype=dtype, name=n) for n, a in (("q", q), ("k", k), ("v", v))}
        vals = {ts["q"]: q, ts["k"]: k, ts["v"]: v}
        extra = dict(kw)
        if lq is not None:
            extra["seq_len_q"] = g.tensor((B, 1, 1, 1), dtype="int32", name="seq_len_q")
            extra["seq_len_kv"] = g.tensor((B, 1, 1, 1), dtype="int32", name="seq_len_kv")
            vals[extra["seq_len_q"]] = np.array(lq).reshape(B, 1, 1, 1)
            vals[extra["seq_len_kv"]] = np.array(lkv).reshape(B, 1, 1, 1)
        if bias is not None:
            extra["bias"] = g.tensor(bias.shape, dtype=dtype, name="bias")
            vals[extra["bias"]] = bias
        if sl is not None:
            extra["alibi_slopes"] = g.tensor((1, H, 1, 1), dtype="float32", name="slopes")
            vals[extra["alibi_slopes"]] = sl.reshape(1, H, 1, 1)
        if softcap is not None:
            extra["softcap"] = softcap
        if sk is not None:
            extra["sink"] = g.tensor((1, H, 1, 1), dtype="float32", name="sink")
            vals[extra["sink"]] = sk
        return ts, vals, extra

    def valid_q(a):
        return [a[b, :, : (sq if lq is None else lq[b])] for b in range(B)]

    def valid_kv(a):
        return [a[b, :, : (skv if lkv is None else lkv[b])] for b in range(B)]

    def close(got_parts, ref_parts, what):
        g_ = np.concatenate([x.ravel() for x in got_parts])
        r_ = np.concatenate([x.ravel() for x in ref_parts])
        err = rel(g_, r_)
        assert err < tol, f"{what}: relative error {err:.2e} >= {tol}"

    # forward
    g = Graph()
    ts, vals, extra = graph_inputs(g)
    r = g.sdpa_forward(ts["q"], ts["k"], ts["v"], **extra)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    outs = {o: nan_like(dev, o), st: nan_like(dev, st)}
    g.execute({**{t: put(dev, a, t) for t, a in vals.items()}, **outs})
    close(valid_q(got(dev, outs[o])), valid_q(o_ref), "o")
    close(valid_q(got(dev, outs[st])), valid_q(lse_ref), "stats")

    # backward
    g = Graph()
    ts, vals, extra = graph_inputs(g)
    ot = g.tensor((B, H, sq, dv), dtype=dtype, name="o")
    dot = g.tensor((B, H, sq, dv), dtype=dtype, name="do")
    stt = g.tensor((B, H, sq, 1), name="stats")
    o_in = o_ref.copy()
    lse_in = lse_ref.copy()
    if lq is not None:
        for b in range(B):
            o_in[b, :, lq[b] :] = 0.0
            lse_in[b, :, lq[b] :] = 0.0
    vals.update({ot: seen(o_in, dtype), dot: do, stt: lse_in})
    r = g.sdpa_backward(ts["q"], ts["k"], ts["v"], ot, dot, stt, dbias=dbias, dsink=sink, deterministic=deterministic,
                        **extra)  # fmt: skip
    outs_t = [g.mark_output(t) for t in r if t is not None]
    bind = {t: put(dev, a, t) for t, a in vals.items()}

    def once():
        outs = {t: nan_like(dev, t) for t in outs_t}
        g.execute({**bind, **outs})
        return [got(dev, outs[t]) for t in outs_t]

    with cudnnkit.settings(deterministic=deterministic):
        res = once()
        if deterministic:
            again = once()
            for a, b_ in zip(res, again):
                assert np.array_equal(a, b_), "deterministic backward: repeats differ"
    dq, dk, dvv = res[:3]
    close(valid_q(dq), valid_q(grads_ref[0]), "dq")
    close(valid_kv(dk), valid_kv(grads_ref[1]), "dk")
    close(valid_kv(dvv), valid_kv(grads_ref[2]), "dv")
    extra_grads = [(n, i) for n, i, on in (("dbias", 3, dbias), ("dsink", 4, sink)) if on]
    for (what, i), got_ in zip(extra_grads, res[3:]):
        close([got_], [grads_ref[i]], what)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_causal_top_left(dev, dtype):
    check(dev, dtype, sq=128, skv=192, causal=True, keep=keep_matrix(128, 192, causal=True))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_causal_bottom_right(dev, dtype):
    check(dev, dtype, sq=64, skv=192, causal=True, diagonal_alignment="bottom_right",
          keep=keep_matrix(64, 192, causal=True, align="bottom_right"))  # fmt: skip


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("hk", [H, 2, 1])
def test_sliding_window_causal(dev, dtype, hk):
    """The issue-17 failure: causal + left_bound=64 had no engine (every head count)."""
    check(dev, dtype, sq=256, skv=256, hk=hk, causal=True, left_bound=64,
          keep=keep_matrix(256, 256, causal=True, left=64))  # fmt: skip


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_band_both_bounds(dev, align):
    check(dev, sq=128, skv=256, left_bound=32, right_bound=16, diagonal_alignment=align,
          keep=keep_matrix(128, 256, left=32, right=16, align=align))  # fmt: skip


def test_sliding_window_without_causal(dev):
    check(dev, sq=128, skv=128, left_bound=48, keep=keep_matrix(128, 128, left=48))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_padding_mask_lengths_one_and_max(dev, dtype):
    lens = ([1, 128], [64, 128])
    check(dev, dtype, lens=lens, keep=keep_matrix(128, 128, lens_q=lens[0], lens_kv=lens[1]))


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_padding_with_causal_and_window(dev, align):
    lens = ([40, 128], [96, 128])
    check(dev, lens=lens, causal=True, left_bound=24, diagonal_alignment=align,
          keep=keep_matrix(128, 128, causal=True, left=24, align=align, lens_q=lens[0], lens_kv=lens[1]))  # fmt: skip


@pytest.mark.parametrize("bias_dims, dbias", [((1, H, 128, 128), True), ((B, 1, 128, 128), False)])
def test_bias(dev, bias_dims, dbias):
    check(dev, bias_dims=bias_dims, dbias=dbias)


def test_bias_with_causal_and_its_gradient(dev):
    check(dev, bias_dims=(1, H, 128, 128), dbias=True, causal=True, keep=keep_matrix(128, 128, causal=True))


def test_alibi(dev):
    check(dev, slopes=True, causal=True, keep=keep_matrix(128, 128, causal=True))


def test_softcap(dev):
    check(dev, softcap=5.0, seed=3)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_sink_and_its_gradient(dev, causal):
    """cudnn-frontend's sink pattern; dsink against autograd's sink gradient (-sum P_sink rowsum(do * o)), as
    the frontend's own test checks it."""
    check(dev, sink=True, causal=causal, keep=keep_matrix(128, 128, causal=True) if causal else None)


@pytest.mark.parametrize("d, dv, hk", [(192, 128, H), (128, 64, 2), (256, 256, H), (64, 128, 1)])
def test_head_dims_and_grouped_heads(dev, d, dv, hk):
    check(dev, d=d, dv=dv, hk=hk, causal=True, keep=keep_matrix(128, 128, causal=True))


@pytest.mark.parametrize("hk", [H, 1])
def test_deterministic_backward_repeats_bitwise(dev, hk):
    check(dev, hk=hk, causal=True, deterministic=True, keep=keep_matrix(128, 128, causal=True))


# ----------------------------------------------------------------- dropout, replayed from seed and offset


def put_int(dev, value):
    """A (1, 1, 1, 1) int64 device array holding ``value`` exactly (a seed up to 2**63)."""
    arr = dev.empty((1, 1, 1, 1), "int64", 0)
    dev.copy(arr, dev.from_numpy(np.full((1, 1, 1, 1), value, dtype=np.int64), 0))
    return arr


def dropout_mask(dev, p, seed, offset, sq, skv, dtype):
    """The keep-mask cuDNN's attention RNG draws for (seed, offset) at (B, H, Sq, Skv): read back through the
    pattern itself with q = 0 (every probability 1/Skv) and v = I (o = mask / ((1 - p) Skv))."""
    g = Graph()
    q = g.tensor((B, H, sq, skv), dtype=dtype)
    k = g.tensor((B, H, skv, skv), dtype=dtype)
    v = g.tensor((B, H, skv, skv), dtype=dtype)
    sd, of = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
    r = g.sdpa_forward(q, k, v, dropout=p, seed=sd, offset=of)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    ka = draw(np.random.default_rng(5), (B, H, skv, skv), dtype)
    vals = {q: np.zeros((B, H, sq, skv)), k: ka, v: np.broadcast_to(np.eye(skv), (B, H, skv, skv))}
    outs = {o: nan_like(dev, o), st: nan_like(dev, st)}
    ints = {sd: put_int(dev, seed), of: put_int(dev, offset)}  # exact: put() goes through float64
    g.execute({**{t: put(dev, a, t) for t, a in vals.items()}, **ints, **outs})
    m = got(dev, outs[o]) * (1 - p) * skv
    assert np.abs(m - np.round(m)).max() < 0.02 and set(np.unique(np.round(m))) <= {0.0, 1.0}
    return np.round(m)


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_and_backward_replay_the_mask(dev, causal):
    p, sq, skv, d, dtype = 0.25, 128, 64, 64, "bfloat16"
    mask = dropout_mask(dev, p, 2024, 7, sq, skv, dtype)
    assert abs(mask.mean() - (1 - p)) < 0.02
    rng = np.random.default_rng(9)
    q, k, v, do = (draw(rng, s, dtype) for s in [(B, H, sq, d), (B, H, skv, d), (B, H, skv, d), (B, H, sq, d)])
    keep = keep_matrix(sq, skv, causal=True) if causal else None
    o_ref, lse_ref, grads = reference(q, k, v, do, scale=1 / math.sqrt(d), keep=keep, drop=mask, p=p)
    for direction in ("forward", "backward"):
        g = Graph()
        qt, kt, vt = (g.tensor(a.shape, dtype=dtype) for a in (q, k, v))
        sd, of = g.tensor((1, 1, 1, 1), dtype="int64"), g.tensor((1, 1, 1, 1), dtype="int64")
        vals = {qt: q, kt: k, vt: v, sd: np.full((1, 1, 1, 1), 2024), of: np.full((1, 1, 1, 1), 7)}
        kw = {"dropout": p, "seed": sd, "offset": of, "causal": causal}
        if direction == "forward":
            r = g.sdpa_forward(qt, kt, vt, **kw)
            outs_t, refs = [g.mark_output(r.o), g.mark_output(r.stats)], [o_ref, lse_ref]
        else:
            ot, dot, st = g.tensor(o_ref.shape, dtype=dtype), g.tensor(do.shape, dtype=dtype), g.tensor(lse_ref.shape)
            vals.update({ot: seen(o_ref, dtype), dot: do, st: lse_ref})
            outs_t, refs = [g.mark_output(t) for t in g.sdpa_backward(qt, kt, vt, ot, dot, st, **kw)], grads[:3]
        outs = {t: nan_like(dev, t) for t in outs_t}
        g.execute({**{t: put(dev, a, t) for t, a in vals.items()}, **outs})
        for t, ref in zip(outs_t, refs):
            assert rel(got(dev, outs[t]), ref) < TOL[dtype], direction


# ----------------------------------------------------------------- the L2 op: ops.attention_forward/_backward


def device(dev, a, dtype):
    """A C-order device array of ``a``'s values in ``dtype``."""
    from types import SimpleNamespace

    from cudnnkit.runtime.arrays import contiguous_strides

    a = np.asarray(a)
    return put(dev, a, SimpleNamespace(dims=a.shape, strides=contiguous_strides(a.shape), dtype=dtype))


L2_CASES = {
    "window-gqa": dict(hk=2, kw=dict(is_causal=True, left_bound=48, enable_gqa=True), keep=dict(causal=True, left=48)),
    "bottom-right": dict(sq=64, kw=dict(is_causal=True, diagonal_alignment="bottom_right"),
                         keep=dict(causal=True, align="bottom_right")),
    "mask-dbias": dict(mask=(4, 64, 128), kw=dict(dbias=True)),
    "lengths": dict(sq=128, lens=([1, 128], [77, 128]), kw=dict(is_causal=True), keep=dict(causal=True)),
    "alibi-mqa": dict(hk=1, alibi=True, kw=dict(is_causal=True, enable_gqa=True), keep=dict(causal=True)),
    "softcap-mla": dict(d=192, dv=128, kw=dict(softcap=8.0)),
    "sink": dict(sink=True, kw=dict(is_causal=True, dsink=True), keep=dict(causal=True)),
    "sink-no-dsink": dict(sink=True, kw=dict(is_causal=True), keep=dict(causal=True)),  # the backward reads no sink
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(L2_CASES))
def test_l2_attention_forward_and_backward(dev, name):
    from cudnnkit import ops

    c = L2_CASES[name]
    dtype, sq, skv, d, dv, hk = "bfloat16", c.get("sq", 64), 128, c.get("d", 64), c.get("dv", 64), c.get("hk", H)
    lq, lkv = c.get("lens", (None, None))
    rng = np.random.default_rng(21)
    q, k, v = draw(rng, (B, H, sq, d), dtype), draw(rng, (B, hk, skv, d), dtype), draw(rng, (B, hk, skv, dv), dtype)
    do = draw(rng, (B, H, sq, dv), dtype)
    if lq is not None:
        for b in range(B):
            do[b, :, lq[b] :] = 0
    mask = None if "mask" not in c else draw(rng, c["mask"], dtype)
    slopes = alibi_slopes(H) if c.get("alibi") else None
    sink = rng.standard_normal(H) + 2.0 if c.get("sink") else None
    keep = keep_matrix(sq, skv, lens_q=lq, lens_kv=lkv, **c.get("keep", {})) if (c.get("keep") or lq) else None
    o_ref, lse_ref, grads = reference(q, k, v, do, scale=1 / math.sqrt(d), keep=keep, bias=mask, slopes=slopes,
                                      softcap=c["kw"].get("softcap"),
                                      sink=None if sink is None else sink.reshape(1, H, 1, 1))  # fmt: skip
    arrays = {}
    if mask is not None:
        arrays["attn_mask"] = device(dev, mask, dtype)
    if lq is not None:
        arrays["seq_len_q"], arrays["seq_len_kv"] = device(dev, lq, "int32"), device(dev, lkv, "int32")
    if slopes is not None:
        arrays["alibi_slopes"] = device(dev, slopes, "float32")
    if sink is not None:
        arrays["sink"] = device(dev, sink, "float32")
    kw = {n: x for n, x in c["kw"].items() if n not in ("dbias", "dsink")}
    qd, kd, vd = device(dev, q, dtype), device(dev, k, dtype), device(dev, v, dtype)
    o, st = ops.attention_forward(qd, kd, vd, **kw, **arrays)
    rows = [slice(None, sq if lq is None else lq[b]) for b in range(B)]
    cols = [slice(None, skv if lkv is None else lkv[b]) for b in range(B)]

    def part(a, sl):
        return np.concatenate([a[b, :, sl[b]].ravel() for b in range(B)])

    assert rel(part(got(dev, o), rows), part(o_ref, rows)) < TOL[dtype]
    assert rel(part(got(dev, st), rows), part(lse_ref, rows)) < TOL[dtype]
    o_in, lse_in = o_ref.copy(), lse_ref.copy()
    if lq is not None:
        for b in range(B):
            o_in[b, :, lq[b] :], lse_in[b, :, lq[b] :] = 0, 0
    res = ops.attention_backward(qd, kd, vd, device(dev, o_in, dtype), device(dev, do, dtype),
                                 device(dev, lse_in, "float32"), **c["kw"], **arrays)  # fmt: skip
    assert len(res) == 3 + bool(c["kw"].get("dbias")) + bool(c["kw"].get("dsink"))
    assert rel(part(got(dev, res[0]), rows), part(grads[0], rows)) < TOL[dtype]
    for i in (1, 2):
        assert rel(part(got(dev, res[i]), cols), part(grads[i], cols)) < TOL[dtype]
    if c["kw"].get("dbias"):
        assert res[3].shape == mask.shape and rel(got(dev, res[3]), grads[3]) < TOL[dtype]
    if c["kw"].get("dsink"):  # the sink's gradient, against autograd's
        assert res[-1].shape == (H,) and rel(got(dev, res[-1]), grads[4].reshape(H)) < TOL[dtype]


def test_l2_dropout_replays_and_deterministic_backward_repeats(dev):
    """attention_forward/backward with dropout_p and seed/offset arrays against the reference with the mask the
    same (seed, offset) draws; the backward under settings(deterministic=True) twice, bitwise equal."""
    from cudnnkit import ops

    p, sq, skv, d, dtype = 0.2, 128, 64, 64, "bfloat16"
    mask = dropout_mask(dev, p, 77, 3, sq, skv, dtype)
    rng = np.random.default_rng(4)
    q, k, v, do = (draw(rng, s, dtype) for s in [(B, H, sq, d), (B, H, skv, d), (B, H, skv, d), (B, H, sq, d)])
    o_ref, lse_ref, grads = reference(q, k, v, do, scale=1 / math.sqrt(d), drop=mask, p=p)
    seed, off = device(dev, [77], "int64"), device(dev, [3], "int64")
    qd, kd, vd = device(dev, q, dtype), device(dev, k, dtype), device(dev, v, dtype)
    o, st = ops.attention_forward(qd, kd, vd, dropout_p=p, seed=seed, offset=off)
    assert rel(got(dev, o), o_ref) < TOL[dtype] and rel(got(dev, st), lse_ref) < TOL[dtype]
    args = (qd, kd, vd, device(dev, o_ref, dtype), device(dev, do, dtype), device(dev, lse_ref, "float32"))
    with cudnnkit.settings(deterministic=True):
        first = [got(dev, x) for x in ops.attention_backward(*args, dropout_p=p, seed=seed, offset=off)]
        again = [got(dev, x) for x in ops.attention_backward(*args, dropout_p=p, seed=seed, offset=off)]
    for a, b_, ref in zip(first, again, grads):
        assert np.array_equal(a, b_) and rel(a, ref) < TOL[dtype]


# ----------------------------------------------------------------- paged key/value caches (the forward)


@pytest.mark.parametrize("sq, causal", [(1, False), (16, True)], ids=["decode", "chunked-prefill"])
def test_paged_caches_pages_out_of_order(dev, sq, causal):
    """k and v read through page tables (blocks in a shuffled order, distinct per sample) against the dense
    reference on the gathered caches; per-sample lengths (one short, one the maximum); chunked prefill is
    bottom-right causal (the new queries at the end of each sample's cache)."""
    dtype, hk, bs, blocks, nb, d = "bfloat16", 2, 64, 4, 16, 128
    skv = bs * blocks
    rng = np.random.default_rng(12)
    q = draw(rng, (B, H, sq, d), dtype)
    kc, vc = draw(rng, (nb, hk, bs, d), dtype), draw(rng, (nb, hk, bs, d), dtype)
    table = rng.permutation(nb)[: B * blocks].reshape(B, 1, blocks, 1)
    lens_q, lens_kv = [sq, max(1, sq // 2)], [skv, 100]
    kd = np.stack([np.concatenate([kc[table[b, 0, j, 0]] for j in range(blocks)], axis=1) for b in range(B)])
    vd = np.stack([np.concatenate([vc[table[b, 0, j, 0]] for j in range(blocks)], axis=1) for b in range(B)])
    kw = {"causal": True, "diagonal_alignment": "bottom_right"} if causal else {}
    keep = keep_matrix(sq, skv, causal=causal, align="bottom_right", lens_q=lens_q, lens_kv=lens_kv)
    o_ref, lse_ref, _ = reference(q, kd, vd, np.zeros((B, H, sq, d)), scale=1 / math.sqrt(d), keep=keep)
    g = Graph()
    qt = g.tensor(q.shape, dtype=dtype)
    kt, vt = g.tensor(kc.shape, dtype=dtype), g.tensor(vc.shape, dtype=dtype)
    ptk, ptv = (g.tensor((B, 1, blocks, 1), dtype="int32") for _ in range(2))
    lq, lkv = (g.tensor((B, 1, 1, 1), dtype="int32") for _ in range(2))
    r = g.sdpa_forward(qt, kt, vt, page_table_k=ptk, page_table_v=ptv, seq_len_q=lq, seq_len_kv=lkv, **kw)
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    vals = {qt: q, kt: kc, vt: vc, ptk: table, ptv: table, lq: np.array(lens_q).reshape(B, 1, 1, 1),
            lkv: np.array(lens_kv).reshape(B, 1, 1, 1)}  # fmt: skip
    outs = {o: nan_like(dev, o), st: nan_like(dev, st)}
    g.execute({**{t: put(dev, a, t) for t, a in vals.items()}, **outs})

    def rows(a):
        return np.concatenate([a[b, :, : lens_q[b]].ravel() for b in range(B)])

    assert rel(rows(got(dev, outs[o])), rows(o_ref)) < TOL[dtype]
    assert rel(rows(got(dev, outs[st])), rows(lse_ref)) < TOL[dtype]


def test_l2_paged_decode(dev):
    """ops.attention_forward on paged caches (grouped heads, pages shuffled, tables (B, blocks))."""
    from cudnnkit import ops

    dtype, hk, bs, blocks, nb, d, sq = "bfloat16", 2, 64, 4, 16, 128, 1
    rng = np.random.default_rng(13)
    q = draw(rng, (B, H, sq, d), dtype)
    kc, vc = draw(rng, (nb, hk, bs, d), dtype), draw(rng, (nb, hk, bs, d), dtype)
    table = rng.permutation(nb)[: B * blocks].reshape(B, blocks)
    lens_kv = [bs * blocks, 77]
    kd = np.stack([np.concatenate([kc[table[b, j]] for j in range(blocks)], axis=1) for b in range(B)])
    vd = np.stack([np.concatenate([vc[table[b, j]] for j in range(blocks)], axis=1) for b in range(B)])
    keep = keep_matrix(sq, bs * blocks, lens_q=[1, 1], lens_kv=lens_kv)
    o_ref, lse_ref, _ = reference(q, kd, vd, np.zeros((B, H, sq, d)), scale=1 / math.sqrt(d), keep=keep)
    tab = device(dev, table, "int32")
    o, st = ops.attention_forward(device(dev, q, dtype), device(dev, kc, dtype), device(dev, vc, dtype),
                                  page_table_k=tab, page_table_v=tab, seq_len_q=device(dev, [1, 1], "int32"),
                                  seq_len_kv=device(dev, lens_kv, "int32"), enable_gqa=True)  # fmt: skip
    assert rel(got(dev, o), o_ref) < TOL[dtype] and rel(got(dev, st), lse_ref) < TOL[dtype]


# ----------------------------------------------------------------- ragged (packed, THD) batches


def packed_reference(q, k, v, do, cu_q, cu_kv, s_max_q, *, scale, causal=False, align="top_left"):
    """The reference per sample on the unpacked sequences: q ``(T_q, H, D)``, k/v ``(T_kv, H_kv, .)``, do ``(T_q,
    H, D_v)`` packed at ``cu_q``/``cu_kv``; returns packed o, the padded lse ``(B, H, s_max_q, 1)`` (0 past each
    length) and packed dq, dk, dv."""
    b = len(cu_q) - 1
    o, dq, dk, dv = np.zeros(do.shape), np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    lse = np.zeros((b, q.shape[1], s_max_q, 1))
    for i in range(b):
        rq, rkv = slice(cu_q[i], cu_q[i + 1]), slice(cu_kv[i], cu_kv[i + 1])
        lq, lkv = rq.stop - rq.start, rkv.stop - rkv.start

        def unpack(a, r):
            return a[r].transpose(1, 0, 2)[None]  # (1, H, L, D)

        keep = keep_matrix(lq, lkv, b=1, causal=causal, align=align) if causal else None
        o_b, lse_b, (dq_b, dk_b, dv_b, _, _) = reference(unpack(q, rq), unpack(k, rkv), unpack(v, rkv),
                                                         unpack(do, rq), scale=scale, keep=keep)  # fmt: skip
        o[rq], dq[rq], dk[rkv], dv[rkv] = (x[0].transpose(1, 0, 2) for x in (o_b, dq_b, dk_b, dv_b))
        lse[i, :, :lq] = lse_b[0]
    return o, lse, (dq, dk, dv)


@pytest.mark.parametrize("hk, causal", [(H, False), (2, True)], ids=["mha", "gqa-causal"])
def test_ragged_graph_forward_and_backward(dev, hk, causal):
    """Graph.sdpa_forward/sdpa_backward on packed q, k, v, o, do (and dq, dk, dv) with ragged offsets (the
    cu_seqlens times the token stride H * D, in elements, int64) and the padding mask's lengths, lengths 1 and
    the maximum on each side; against the reference per sample on the unpacked sequences. Outputs NaN-poisoned;
    every packed row is compared (each token belongs to a sample), the stats rows below each length."""
    dtype, d, dv, s = "bfloat16", 64, 64, 64
    lens_q, lens_kv = [1, s, 37], [s, 1, 50]
    cu_q, cu_kv = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_kv)])
    tq, tkv, b = int(cu_q[-1]), int(cu_kv[-1]), len(lens_q)
    rng = np.random.default_rng(31)
    q, k, v = draw(rng, (tq, H, d), dtype), draw(rng, (tkv, hk, d), dtype), draw(rng, (tkv, hk, dv), dtype)
    do = draw(rng, (tq, H, dv), dtype)
    scale = 1 / math.sqrt(d)
    o_ref, lse_ref, grads = packed_reference(q, k, v, do, cu_q, cu_kv, s, scale=scale, causal=causal)

    def packed(g, h, dd, name):
        return g.tensor((b, h, s, dd), (s * h * dd, dd, h * dd, 1), dtype, name=name)

    def inputs(g, names):
        t, vals = {}, {}
        shapes = {"q": (H, d, "q"), "k": (hk, d, "kv"), "v": (hk, dv, "kv"), "o": (H, dv, "q"), "do": (H, dv, "q")}
        offs = {}
        for side, cu in (("q", cu_q), ("kv", cu_kv)):
            for h_, dd in {(hh, x) for hh, x, sd in shapes.values() if sd == side}:
                r = g.tensor((b + 1, 1, 1, 1), None, "int64", name=f"off_{side}_{h_}_{dd}")
                offs[side, h_, dd] = r
                vals[r] = (cu * h_ * dd).reshape(b + 1, 1, 1, 1)  # element offsets: tokens times H * D
        for n in names:
            h_, dd, side = shapes[n]
            t[n] = g.set_ragged_offset(packed(g, h_, dd, n), offs[side, h_, dd])
        lq, lkv = (g.tensor((b, 1, 1, 1), None, "int32", name=n) for n in ("seq_len_q", "seq_len_kv"))
        vals[lq], vals[lkv] = np.array(lens_q).reshape(b, 1, 1, 1), np.array(lens_kv).reshape(b, 1, 1, 1)
        bind = {x: put(dev, a, x) for x, a in vals.items()}
        return t, offs, bind, lq, lkv

    def packed_array(a, h_, dd):
        from types import SimpleNamespace

        return put(dev, a, SimpleNamespace(dims=a.shape, strides=(h_ * dd, dd, 1), dtype=dtype))

    def poisoned(rows, h_, dd):
        return packed_array(np.full((rows, h_, dd), np.nan), h_, dd)

    def close(got_, ref, what):
        err = rel(got_.ravel(), ref.ravel())
        assert err < TOL[dtype], f"{what}: relative error {err:.2e} >= {TOL[dtype]}"

    # forward
    g = Graph()
    t, offs, bind, lq, lkv = inputs(g, ("q", "k", "v"))
    r = g.sdpa_forward(t["q"], t["k"], t["v"], seq_len_q=lq, seq_len_kv=lkv, causal=causal, scale=scale,
                       o_strides=(s * H * dv, dv, H * dv, 1), o_ragged_offset=offs["q", H, dv])  # fmt: skip
    o, st = g.mark_output(r.o), g.mark_output(r.stats)
    out_o, out_st = poisoned(tq, H, dv), nan_like(dev, st)
    host = {"q": (q, H, d), "k": (k, hk, d), "v": (v, hk, dv)}
    g.execute({**bind, **{t[n]: packed_array(a, h_, dd) for n, (a, h_, dd) in host.items()}, o: out_o, st: out_st})
    close(got(dev, out_o), o_ref, "o")
    lse = got(dev, out_st)
    close(np.concatenate([lse[i, :, : lens_q[i]].ravel() for i in range(b)]),
          np.concatenate([lse_ref[i, :, : lens_q[i]].ravel() for i in range(b)]), "stats")  # fmt: skip

    # backward (from the reference's o and lse, so that it is checked alone)
    g = Graph()
    t, offs, bind, lq, lkv = inputs(g, ("q", "k", "v", "o", "do"))
    stt = g.tensor((b, H, s, 1), None, "float32", name="stats")
    dq, dk, dvt = g.sdpa_backward(t["q"], t["k"], t["v"], t["o"], t["do"], stt, seq_len_q=lq, seq_len_kv=lkv,
                                  causal=causal, scale=scale, dq_ragged_offset=offs["q", H, d],
                                  dk_ragged_offset=offs["kv", hk, d], dv_ragged_offset=offs["kv", hk, dv])  # fmt: skip
    dq, dk, dvt = (g.mark_output(x) for x in (dq, dk, dvt))
    host.update({"o": (seen(o_ref, dtype), H, dv), "do": (do, H, dv)})
    outs = {dq: poisoned(tq, H, d), dk: poisoned(tkv, hk, d), dvt: poisoned(tkv, hk, dv)}
    g.execute({**bind, **{t[n]: packed_array(a, h_, dd) for n, (a, h_, dd) in host.items()},
               stt: put(dev, lse_ref, stt), **outs})  # fmt: skip
    for x, ref, what in zip((dq, dk, dvt), grads, ("dq", "dk", "dv")):
        close(got(dev, outs[x]), ref, what)


@pytest.mark.parametrize("cu_on_device", [True, False], ids=["device-cu", "host-cu"])
def test_l2_ragged_forward_and_backward(dev, cu_on_device):
    """ops.attention_forward/attention_backward with cu_seqlens_q/cu_seqlens_kv (lengths 1 and the maximum, a
    max_seqlen_kv bucket above the longest), grouped heads, causal; packed results against the per-sample
    reference; the stats padded (B, H, max_seqlen_q, 1)."""
    from cudnnkit import ops

    dtype, d, dv, hk = "bfloat16", 64, 128, 2
    lens_q, lens_kv = [1, 48, 64, 17], [33, 1, 64, 70]
    cu_q, cu_kv = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_kv)])
    tq, tkv, b = int(cu_q[-1]), int(cu_kv[-1]), len(lens_q)
    rng = np.random.default_rng(32)
    q, k, v = draw(rng, (tq, H, d), dtype), draw(rng, (tkv, hk, d), dtype), draw(rng, (tkv, hk, dv), dtype)
    do = draw(rng, (tq, H, dv), dtype)
    scale = 1 / math.sqrt(d)
    o_ref, lse_ref, grads = packed_reference(q, k, v, do, cu_q, cu_kv, 64, scale=scale, causal=True)
    cuq = device(dev, cu_q, "int32") if cu_on_device else cu_q.tolist()
    cukv = device(dev, cu_kv, "int32") if cu_on_device else cu_kv.tolist()
    kw = dict(cu_seqlens_q=cuq, cu_seqlens_kv=cukv, max_seqlen_kv=96, is_causal=True, enable_gqa=True)
    qd, kd, vd = device(dev, q, dtype), device(dev, k, dtype), device(dev, v, dtype)
    poisoned = (
        device(dev, np.full((tq, H, dv), np.nan), dtype),
        device(dev, np.full((b, H, 64, 1), np.nan), "float32"),
    )
    o, st = ops.attention_forward(qd, kd, vd, out=poisoned, **kw)
    assert o is poisoned[0] and st is poisoned[1]
    assert tuple(o.shape) == (tq, H, dv) and tuple(st.shape) == (b, H, 64, 1)
    assert rel(got(dev, o), o_ref) < TOL[dtype]
    lse = got(dev, st)
    assert rel(np.concatenate([lse[i, :, : lens_q[i]].ravel() for i in range(b)]),
               np.concatenate([lse_ref[i, :, : lens_q[i]].ravel() for i in range(b)])) < TOL[dtype]  # fmt: skip
    dq, dk, dvv = ops.attention_backward(qd, kd, vd, device(dev, o_ref, dtype), device(dev, do, dtype),
                                         device(dev, lse_ref, "float32"), **kw)  # fmt: skip
    assert tuple(dq.shape) == (tq, H, d) and tuple(dk.shape) == (tkv, hk, d) and tuple(dvv.shape) == (tkv, hk, dv)
    for x, ref in zip((dq, dk, dvv), grads):
        assert rel(got(dev, x), ref) < TOL[dtype]
