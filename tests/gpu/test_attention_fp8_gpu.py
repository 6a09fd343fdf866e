"""fp8 attention on the GPU (issue 17), forward and backward, through the graph layer
(``Graph.sdpa_fp8_forward``/``sdpa_fp8_backward`` executed with torch tensors) and the L2 functions
(``cudnnkit.ops.attention_fp8``), against a float64 reference computed from the definition on the *dequantized*
inputs (``x_real = descale_x * x``, q/k/v/do quantized here from random float data with per-tensor scales).

Tolerances are fp8's own: the probabilities are quantized (``scale_s``) before ``P @ v``, ``dP`` before the
gradient matmuls, and every output is fp8, so errors of a few percent are expected (e4m3 keeps 3 mantissa bits,
e5m2 2); a wrong pattern (a missing or doubled factor, a wrong mask) gives errors near 1. The amax outputs are
compared with the reference's largest magnitudes. Needs Hopper or newer (cuDNN's fp8 attention); outputs are
NaN-poisoned before each run."""

from __future__ import annotations

import math

import pytest

from cudnnkit.graph import Graph
from cudnnkit.graph.nodes.sdpa_fp8 import BACKWARD_FACTORS, FORWARD_FACTORS

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

E4, E5 = "float8_e4m3fn", "float8_e5m2"
TORCH = {E4: torch.float8_e4m3fn, E5: torch.float8_e5m2}
FMAX = {E4: 448.0, E5: 57344.0}
B, H, S, D = 2, 4, 256, 128
#: ||got - ref|| / ||ref|| bounds by the data type the result passes through last (o: P and o quantized)
TOL_O = {E4: 0.08, E5: 0.16}
#: the gradients: P, dP and the gradient itself quantized (dP in do's dtype)
TOL_GRAD = {E4: 0.12, E5: 0.25}


@pytest.fixture(autouse=True)
def hopper():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuDNN's fp8 attention needs Hopper (sm_90) or newer")


def rel(got, ref):
    got, ref = got.double(), ref.double()
    assert not torch.isnan(got).any(), "NaN in the result (an unwritten element?)"
    return ((got - ref).norm() / ref.norm()).item()


def quantize(x, dtype, amax=None):
    """``(x8, descale)``: ``x`` scaled so that its largest magnitude is half the fp8 type's largest value."""
    amax = float(x.abs().max()) if amax is None else amax
    scale = FMAX[dtype] / amax / 2
    return (x * scale).to(TORCH[dtype]), 1.0 / scale


def factor(v):
    return torch.full((1, 1, 1, 1), float(v), dtype=torch.float32, device="cuda")


def real(x8, descale):
    return x8.to(torch.float32).double() * descale


def nan(shape, dtype):
    t = TORCH.get(dtype, getattr(torch, dtype, None))
    return torch.full(shape, float("nan"), device="cuda").to(t)


def keep(sq, skv, causal, left):
    row = torch.arange(sq, device="cuda")[:, None]
    col = torch.arange(skv, device="cuda")[None, :]
    k = torch.ones(sq, skv, dtype=torch.bool, device="cuda")
    if causal:
        k &= col <= row
    if left is not None:
        k &= col > row - left
    return k


def attention_ref(q, k, v, scale, causal=False, left=None):
    """float64 ``(o, stats, P)`` (grouped heads: query head i reads key/value head ``i // (H / H_kv)``)."""
    h = q.shape[1]
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    s = scale * q @ k.transpose(2, 3)
    s = s.masked_fill(~keep(q.shape[2], k.shape[2], causal, left), -math.inf)
    stats = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - stats)
    return p @ v, stats, p


def inputs(dtype, hk=H, seed=0, dv=D):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = [torch.randn(s, generator=g, device="cuda") for s in ((B, H, S, D), (B, hk, S, D), (B, hk, S, dv))]
    return [quantize(t, dtype) for t in x]


def run_forward(dtype, *, hk=H, causal=False, left=None, dv=D, o_dtype=None):
    (q8, dq), (k8, dk), (v8, dvs) = inputs(dtype, hk, dv=dv)
    scale = 1 / math.sqrt(D)
    o_ref, st_ref, p_ref = attention_ref(real(q8, dq), real(k8, dk), real(v8, dvs), scale, causal, left)
    o_dtype = o_dtype or dtype
    scale_o = FMAX[o_dtype] / float(o_ref.abs().max()) / 2
    f = {"descale_q": dq, "descale_k": dk, "descale_v": dvs, "descale_s": 1 / FMAX[dtype], "scale_s": FMAX[dtype],
         "scale_o": scale_o}  # fmt: skip
    g = Graph()
    q, k, v = g.tensor_like(q8, "q"), g.tensor_like(k8, "k"), g.tensor_like(v8, "v")
    ft = {n: g.tensor((1, 1, 1, 1), None, "float32", name=n) for n in FORWARD_FACTORS}
    r = g.sdpa_fp8_forward(q, k, v, *ft.values(), scale=scale, causal=causal, left_bound=left, o_dtype=o_dtype)
    o, st, a_s, a_o = (g.mark_output(t) for t in r)
    out = {o: nan((B, H, S, dv), o_dtype), st: nan((B, H, S, 1), "float32"), a_s: nan((1, 1, 1, 1), "float32"),
           a_o: nan((1, 1, 1, 1), "float32")}  # fmt: skip
    g.execute({q: q8, k: k8, v: v8, **{ft[n]: factor(f[n]) for n in FORWARD_FACTORS}, **out})
    torch.cuda.synchronize()
    got = {"o": real(out[o], 1 / scale_o), "stats": out[st], "amax_s": out[a_s], "amax_o": out[a_o]}
    ref = {"o": o_ref, "stats": st_ref, "amax_s": p_ref.max(), "amax_o": o_ref.abs().max()}
    return got, ref, (q8, k8, v8, out[o], out[st], f, scale)


def check_forward(got, ref, dtype, o_dtype=None):
    err = rel(got["o"], ref["o"])
    assert err < TOL_O[o_dtype or dtype], f"o: {err}"
    assert rel(got["stats"], ref["stats"]) < 1e-3
    assert got["amax_s"].item() == pytest.approx(ref["amax_s"].item(), rel=1e-2)
    assert got["amax_o"].item() == pytest.approx(ref["amax_o"].item(), rel=0.1)


@pytest.mark.parametrize("causal, left", [(False, None), (True, None), (True, 64)])
@pytest.mark.parametrize("hk", [H, 2])
def test_forward_e4m3(causal, left, hk):
    got, ref, _ = run_forward(E4, hk=hk, causal=causal, left=left)
    check_forward(got, ref, E4)


def test_forward_e4m3_head_dims_and_e5m2_output():
    got, ref, _ = run_forward(E4, dv=64, o_dtype=E5)
    check_forward(got, ref, E4, E5)


def test_forward_e5m2_inputs():
    """q, k, v in e5m2 (cudnn-frontend's io type may be either; whether Hopper's engines take e5m2 q/k/v is
    what this checks)."""
    got, ref, _ = run_forward(E5, causal=True)
    check_forward(got, ref, E5)


def test_forward_fails_on_a_wrong_scale():
    """The check can fail: o read back with a wrong descale is far off."""
    got, ref, _ = run_forward(E4)
    assert rel(got["o"] * 1.5, ref["o"]) > TOL_O[E4]


# ----------------------------------------------------------------- backward


def run_backward(do_dtype, *, hk=H, causal=False, left=None, seed=1):
    fwd, _, (q8, k8, v8, o8, st, f, scale) = run_forward(E4, hk=hk, causal=causal, left=left)
    descale_o = 1 / f["scale_o"]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    do8, descale_do = quantize(torch.randn((B, H, S, D), generator=gen, device="cuda"), do_dtype)
    # the float64 reference on the dequantized inputs (autograd)
    qd, kd, vd = (real(x, f[n]).requires_grad_() for x, n in ((q8, "descale_q"), (k8, "descale_k"),
                                                                 (v8, "descale_v")))  # fmt: skip
    o_ref, _, p_ref = attention_ref(qd, kd, vd, scale, causal, left)
    dod = real(do8, descale_do)
    o_ref.backward(dod)
    dq_ref, dk_ref, dv_ref = qd.grad, kd.grad, vd.grad
    with torch.no_grad():
        kh = kd.repeat_interleave(H // hk, dim=1)
        vh = vd.repeat_interleave(H // hk, dim=1)
        ds_ref = p_ref * (dod @ vh.transpose(2, 3) - (dod * o_ref).sum(-1, keepdim=True)) * scale
        assert rel(ds_ref @ kh, dq_ref) < 1e-9  # the dP the pattern quantizes, from the definition
    gd = do_dtype  # the gradients in do's dtype
    sc = {n: FMAX[gd] / float(t.abs().max()) / 2 for n, t in (("dq", dq_ref), ("dk", dk_ref), ("dv", dv_ref),
                                                             ("dp", ds_ref))}  # fmt: skip
    fb = {"descale_q": f["descale_q"], "descale_k": f["descale_k"], "descale_v": f["descale_v"],
          "descale_o": descale_o, "descale_do": descale_do, "descale_s": f["descale_s"], "descale_dp": 1 / sc["dp"],
          "scale_s": f["scale_s"], "scale_dq": sc["dq"], "scale_dk": sc["dk"], "scale_dv": sc["dv"],
          "scale_dp": sc["dp"]}  # fmt: skip
    g = Graph()
    t = {n: g.tensor_like(x, n) for n, x in (("q", q8), ("k", k8), ("v", v8), ("o", o8), ("do", do8),
                                             ("stats", st))}  # fmt: skip
    ft = {n: g.tensor((1, 1, 1, 1), None, "float32", name=n) for n in BACKWARD_FACTORS}
    r = g.sdpa_fp8_backward(*t.values(), *ft.values(), scale=scale, causal=causal, left_bound=left)
    marked = [g.mark_output(x) for x in r]
    shapes = [q8.shape, k8.shape, v8.shape] + [(1, 1, 1, 1)] * 4
    out = {m: nan(s, gd if i < 3 else "float32") for i, (m, s) in enumerate(zip(marked, shapes))}
    arrays = {"q": q8, "k": k8, "v": v8, "o": o8, "do": do8, "stats": st}
    g.execute({**{t[n]: a for n, a in arrays.items()}, **{ft[n]: factor(fb[n]) for n in BACKWARD_FACTORS}, **out})
    torch.cuda.synchronize()
    res = [out[m] for m in marked]
    got = {"dq": real(res[0], 1 / sc["dq"]), "dk": real(res[1], 1 / sc["dk"]), "dv": real(res[2], 1 / sc["dv"]),
           "amax": [x.item() for x in res[3:]]}  # fmt: skip
    ref = {"dq": dq_ref, "dk": dk_ref, "dv": dv_ref,
           "amax": [x.abs().max().item() for x in (dq_ref, dk_ref, dv_ref, ds_ref)]}  # fmt: skip
    return got, ref


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("do_dtype", [E5, E4])
def test_backward(do_dtype, causal):
    """e4m3 q, k, v, o; do (and so dP and the gradients) in e5m2 as delayed-scaling recipes keep gradients, or
    e4m3."""
    got, ref = run_backward(do_dtype, causal=causal)
    for n in ("dq", "dk", "dv"):
        err = rel(got[n], ref[n])
        assert err < TOL_GRAD[do_dtype], f"{n}: {err}"
    for n, g, r in zip(("amax_dq", "amax_dk", "amax_dv", "amax_dp"), got["amax"], ref["amax"]):
        assert g == pytest.approx(r, rel=0.15), n


def test_backward_grouped_heads_and_window():
    got, ref = run_backward(E5, hk=2, causal=True, left=64)
    for n in ("dq", "dk", "dv"):
        err = rel(got[n], ref[n])
        assert err < TOL_GRAD[E5], f"{n}: {err}"


# ----------------------------------------------------------------- the L2 functions


def test_l2_forward_and_backward():
    from cudnnkit.ops import attention_fp8 as F

    (q8, dq), (k8, dk), (v8, dvs) = inputs(E4, hk=2, seed=3)
    scale = 1 / math.sqrt(D)
    qd, kd, vd = (real(x, s).requires_grad_() for x, s in ((q8, dq), (k8, dk), (v8, dvs)))
    o_ref, st_ref, p_ref = attention_ref(qd, kd, vd, scale, causal=True)
    scale_o = FMAX[E4] / float(o_ref.abs().max()) / 2

    def one(v):
        return torch.tensor([float(v)], dtype=torch.float32, device="cuda")

    fs = {"descale_q": one(dq), "descale_k": one(dk), "descale_v": one(dvs), "descale_s": one(1 / FMAX[E4]),
          "scale_s": one(FMAX[E4]), "scale_o": one(scale_o)}  # fmt: skip
    o8, st, amax_s, amax_o = F.attention_fp8_forward(q8, k8, v8, is_causal=True, enable_gqa=True, **fs)
    torch.cuda.synchronize()
    assert o8.dtype == torch.float8_e4m3fn and st.dtype == torch.float32 and amax_s.shape == (1,)
    check_forward({"o": real(o8, 1 / scale_o), "stats": st, "amax_s": amax_s, "amax_o": amax_o},
                  {"o": o_ref.detach(), "stats": st_ref.detach(), "amax_s": p_ref.max().detach(),
                   "amax_o": o_ref.abs().max().detach()}, E4)  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(4)
    do8, descale_do = quantize(torch.randn((B, H, S, D), generator=gen, device="cuda"), E5)
    dod = real(do8, descale_do)
    o_ref.backward(dod)
    with torch.no_grad():
        vh = vd.repeat_interleave(2, dim=1)
        ds_ref = p_ref * (dod @ vh.transpose(2, 3) - (dod * o_ref).sum(-1, keepdim=True)) * scale
    sc = {n: FMAX[E5] / float(t.abs().max()) / 2 for n, t in (("dq", qd.grad), ("dk", kd.grad), ("dv", vd.grad),
                                                             ("dp", ds_ref))}  # fmt: skip
    got = F.attention_fp8_backward(
        q8, k8, v8, o8, do8, st, descale_q=fs["descale_q"], descale_k=fs["descale_k"], descale_v=fs["descale_v"],
        descale_o=one(1 / scale_o), descale_do=one(descale_do), descale_s=fs["descale_s"],
        descale_dp=one(1 / sc["dp"]), scale_s=fs["scale_s"], scale_dq=one(sc["dq"]), scale_dk=one(sc["dk"]),
        scale_dv=one(sc["dv"]), scale_dp=one(sc["dp"]), is_causal=True, enable_gqa=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    for x, n, ref in zip(got[:3], ("dq", "dk", "dv"), (qd.grad, kd.grad, vd.grad)):
        assert x.dtype == torch.float8_e5m2
        err = rel(real(x, 1 / sc[n]), ref)
        assert err < TOL_GRAD[E5], f"{n}: {err}"
    for a, ref in zip(got[3:], (qd.grad, kd.grad, vd.grad, ds_ref)):
        assert a.item() == pytest.approx(ref.abs().max().item(), rel=0.15)
