"""CTC loss (``cudnnCTCLoss_v8``) against an independent float64 NumPy reference, and torch on the CPU.

The reference is the CTC forward-backward recursion in log space (Graves et
al. 2006) over the extended label ``l' = [blank, l1, blank, l2, ..., lL, blank]``
(blank = 0). For one sample with log-probabilities ``lp[t, k]`` over its first
``Tn`` frames:

* ``alpha[t, s] = lse(alpha[t-1, s], alpha[t-1, s-1], alpha[t-1, s-2] if l'[s] != blank and l'[s] != l'[s-2]) + lp[t, l'[s]]``;
* ``beta[t, s] = lse(beta[t+1, s], beta[t+1, s+1], beta[t+1, s+2] if l'[s] != blank and l'[s+2] != l'[s]) + lp[t, l'[s]]``
  (both include the emission at ``t``);
* ``cost = -log p``, ``log p = lse(alpha[Tn-1, S-1], alpha[Tn-1, S-2])``;
* occupancy ``gamma[t, k] = sum over s with l'[s] = k of exp(alpha[t, s] + beta[t, s] - lp[t, k] - log p)``;
* gradient of ``cost`` with respect to the logits ``x`` (``lp = log_softmax(x)``):
  ``softmax(x)[t, k] - gamma[t, k]`` for ``t < Tn``, 0 for ``t >= Tn``.

That formula is what cuDNN returns for ``CUDNN_LOSS_NORMALIZATION_SOFTMAX``
(gradient with respect to the activations it normalises itself), and what it
documents for ``CUDNN_LOSS_NORMALIZATION_NONE`` too (``probs - gamma``: the
gradient with respect to the unnormalised activations behind the given
probabilities). The reference is itself checked by central finite differences
and against ``torch.nn.functional.ctc_loss`` in float64 on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from cudnnkit.ops.ctc import MAX_LABEL_LENGTH, ctc_loss

from ..numerics import finite_difference, host, rel

pytestmark = pytest.mark.gpu

TOL = 1e-4  # float32, relative
ALGOS = ["deterministic", "non_deterministic"]


# ---------------------------------------------------------------- reference


def _lse(*xs):
    a = np.stack(np.broadcast_arrays(*xs))
    m = a.max(axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):  # log(0) where every term is -inf: that branch is not taken
        return np.where(np.isfinite(m), safe + np.log(np.exp(a - safe).sum(axis=0)), m)


def _shift(a, k):
    """``a`` moved ``k`` places (towards higher indices for k > 0), -inf filled in."""
    out = np.full_like(a, -np.inf)
    if k > 0:
        out[k:] = a[:-k] if k < len(a) else a[:0]
    else:
        out[:k] = a[-k:] if -k < len(a) else a[:0]
    return out


def log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def ctc_one(lp, label):
    """``lp``: ``(Tn, A)`` log-probabilities of one sample; ``label``: its labels. -> (cost, gamma ``(Tn, A)``)."""
    Tn, A = lp.shape
    ext = np.zeros(2 * len(label) + 1, dtype=np.int64)
    ext[1::2] = label
    S = len(ext)
    skip = np.zeros(S, dtype=bool)  # state s may be entered from s - 2
    skip[2:] = (ext[2:] != 0) & (ext[2:] != ext[:-2])
    skip_back = np.zeros(S, dtype=bool)  # state s may go on to s + 2
    skip_back[:-2] = skip[2:]
    la = np.full((Tn, S), -np.inf)
    la[0, 0] = lp[0, 0]
    if S > 1:
        la[0, 1] = lp[0, ext[1]]
    for t in range(1, Tn):
        prev = la[t - 1]
        la[t] = _lse(prev, _shift(prev, 1), np.where(skip, _shift(prev, 2), -np.inf)) + lp[t, ext]
    lb = np.full((Tn, S), -np.inf)
    lb[-1, -1] = lp[-1, 0]
    if S > 1:
        lb[-1, -2] = lp[-1, ext[-2]]
    for t in range(Tn - 2, -1, -1):
        nxt = lb[t + 1]
        lb[t] = _lse(nxt, _shift(nxt, -1), np.where(skip_back, _shift(nxt, -2), -np.inf)) + lp[t, ext]
    logp = _lse(la[-1, -1], la[-1, -2]) if S > 1 else la[-1, -1]
    if not np.isfinite(logp):
        return np.inf, np.zeros((Tn, A))
    post = np.exp(la + lb - lp[:, ext] - logp)
    gamma = np.zeros((Tn, A))
    for s in range(S):
        gamma[:, ext[s]] += post[:, s]
    return -logp, gamma


def ctc_ref(x, labels, label_lengths, input_lengths, normalization="softmax", *, with_gamma=False):
    """float64 ``(costs (N,), grads (T, N, A))`` (and ``gamma (T, N, A)``); infeasible samples: cost inf, gradient 0."""
    T, N, A = x.shape
    lp = log_softmax(x) if normalization == "softmax" else np.log(x)
    costs, grads, gammas = np.zeros(N), np.zeros((T, N, A)), np.zeros((T, N, A))
    off = 0
    for n in range(N):
        L, Tn = int(label_lengths[n]), int(input_lengths[n])
        costs[n], gamma = ctc_one(lp[:Tn, n], np.asarray(labels[off : off + L]))
        off += L
        gammas[:Tn, n] = gamma
        if np.isfinite(costs[n]):
            grads[:Tn, n] = np.exp(lp[:Tn, n]) - gamma
    return (costs, grads, gammas) if with_gamma else (costs, grads)


def torch_ref(x, labels, label_lengths, input_lengths):
    """The same through ``torch.nn.functional.ctc_loss`` in float64 on the CPU (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    c = torch.nn.functional.ctc_loss(
        torch.log_softmax(xt, 2),
        torch.tensor(np.asarray(labels), dtype=torch.long),
        torch.tensor(input_lengths),
        torch.tensor(label_lengths),
        blank=0,
        reduction="none",
        zero_infinity=False,
    )
    (g,) = torch.autograd.grad(c.sum(), xt)
    return c.detach().numpy(), g.numpy()


def repeats(lab):
    lab = np.asarray(lab)
    return int(np.count_nonzero(lab[1:] == lab[:-1])) if lab.size > 1 else 0


def make_batch(rng, T, N, A, max_label, *, full=False):
    """Packed labels with repeats in every other sample, label lengths in [1, max_label], and input lengths
    from the tightest feasible (label length + repeats) to T. ``full``: every input length is T."""
    assert 2 * max_label <= T
    labs, ll, il = [], [], []
    for n in range(N):
        L = int(rng.integers(1, max_label + 1)) if n else max_label
        lab = rng.integers(1, A, size=L)
        if L >= 2 and n % 2 == 0:
            i = int(rng.integers(1, L))
            lab[i] = lab[i - 1]
        need = L + repeats(lab)
        labs.append(lab)
        ll.append(L)
        il.append(T if full or n == 0 else need if n == 1 else int(rng.integers(need, T + 1)))
    return np.concatenate(labs).astype(np.int64), ll, il


def logits(rng, shape):
    """float32 logits and the float64 values the GPU actually sees."""
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    return x, x.astype(np.float64)


def valid_frames(il, shape):
    T, N, A = shape
    return (np.arange(T)[:, None] < np.asarray(il)[None, :])[:, :, None] & np.ones((1, 1, A), bool)


def as_index(xp, a, form):
    a = np.asarray(a)
    if form == "list":
        return [int(v) for v in a]
    if form == "numpy":
        return a.astype(np.int64)
    return xp.from_numpy(a.astype(np.int32 if form == "device_int32" else np.int64), 0)


def check_against_refs(c, g, xa, labels, ll, il, *, frames=None, tol=None):
    tol = TOL if tol is None else tol
    ref_c, ref_g = ctc_ref(xa, labels, ll, il)
    mask = valid_frames(il, xa.shape) if frames is None else frames
    assert np.isfinite(c).all(), f"non-finite costs {c}"
    assert np.abs(c - ref_c).max() / np.abs(ref_c).max() < tol, f"costs {c} vs reference {ref_c}"
    assert rel(np.where(mask, g, 0), np.where(mask, ref_g, 0)) < tol
    tr = torch_ref(xa, labels, ll, il)
    if tr is not None:
        assert np.abs(c - tr[0]).max() / np.abs(tr[0]).max() < tol, f"costs {c} vs torch {tr[0]}"
        assert rel(np.where(mask, g, 0), np.where(mask, tr[1], 0)) < tol


# ---------------------------------------------------------------- the reference itself (no GPU work)


def test_reference_matches_torch_float64():
    pytest.importorskip("torch")
    rng = np.random.default_rng()
    for _ in range(5):
        T, N, A = 24, 4, 7
        labels, ll, il = make_batch(rng, T, N, A, 8)
        x = rng.standard_normal((T, N, A)) * 2
        c, g = ctc_ref(x, labels, ll, il)
        tc, tg = torch_ref(x, labels, ll, il)
        assert np.abs(c - tc).max() / np.abs(tc).max() < 1e-12
        assert rel(g, tg) < 1e-10


def test_reference_gradient_by_finite_differences():
    rng = np.random.default_rng()
    T, N, A = 7, 3, 4
    labels, ll, il = make_batch(rng, T, N, A, 3)
    x = rng.standard_normal((T, N, A))
    w = rng.standard_normal(N)

    def loss(a):
        return float(ctc_ref(a, labels, ll, il)[0] @ w)

    g = ctc_ref(x, labels, ll, il)[1] * w[None, :, None]
    num = finite_difference(loss, x)
    assert rel(g, num) < 1e-7
    assert np.all(num[~valid_frames(il, x.shape)] == 0)  # frames past an input length do not matter


# ---------------------------------------------------------------- cuDNN


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("form", ["list", "numpy", "device_int32", "device_int64"])
def test_costs_and_grads_match_reference(xp, algo, form):
    rng = np.random.default_rng()
    T, N, A = 50, 6, 20
    labels, ll, il = make_batch(rng, T, N, A, 12)
    x, xa = logits(rng, (T, N, A))
    costs, grads = ctc_loss(
        xp.from_numpy(x, 0), as_index(xp, labels, form), as_index(xp, ll, form), as_index(xp, il, form), algo=algo
    )
    assert tuple(costs.shape) == (N,) and tuple(grads.shape) == (T, N, A)
    check_against_refs(host(xp, costs), host(xp, grads), xa, labels, ll, il)


@pytest.mark.parametrize("algo", ALGOS)
def test_poisoned_outputs_are_fully_written(xp, algo):
    rng = np.random.default_rng()
    T, N, A = 30, 5, 9
    labels, ll, il = make_batch(rng, T, N, A, 8, full=True)
    x, xa = logits(rng, (T, N, A))
    co = xp.from_numpy(np.full((N,), np.nan, np.float32), 0)
    go = xp.from_numpy(np.full((T, N, A), np.nan, np.float32), 0)
    costs, grads = ctc_loss(xp.from_numpy(x, 0), labels, ll, il, algo=algo, costs_out=co, grads_out=go)
    assert costs is co and grads is go
    c, g = host(xp, co), host(xp, go)
    assert np.isfinite(c).all() and np.isfinite(g).all(), "an output element was not written"
    check_against_refs(c, g, xa, labels, ll, il, frames=np.ones((T, N, A), bool))


@pytest.mark.parametrize("algo", ALGOS)
def test_frames_past_input_length_are_zero(xp, algo):
    """cuDNN's value for t >= input_lengths[n] (poisoned first, so an unwritten frame shows as NaN)."""
    rng = np.random.default_rng()
    T, N, A = 30, 5, 9
    labels, ll, il = make_batch(rng, T, N, A, 8)
    assert min(il) < T
    x, _ = logits(rng, (T, N, A))
    go = xp.from_numpy(np.full((T, N, A), np.nan, np.float32), 0)
    ctc_loss(xp.from_numpy(x, 0), labels, ll, il, algo=algo, grads_out=go)
    g = host(xp, go)
    pad = ~valid_frames(il, g.shape)
    bad = pad & (g != 0)
    assert not bad.any(), (
        f"{int(bad.sum())} of {int(pad.sum())} padded gradient elements are not 0 "
        f"(NaN: {int(np.isnan(g[pad]).sum())}, e.g. {g[bad][:5]})"
    )


def test_deterministic_algo_is_bitwise_repeatable(xp):
    rng = np.random.default_rng()
    T, N, A = 60, 8, 30
    labels, ll, il = make_batch(rng, T, N, A, 20)
    x = xp.from_numpy(logits(rng, (T, N, A))[0], 0)
    runs = [ctc_loss(x, labels, ll, il, algo="deterministic") for _ in range(3)]
    c0, g0 = xp.to_numpy(runs[0][0]), xp.to_numpy(runs[0][1])
    for c, g in runs[1:]:
        assert np.array_equal(xp.to_numpy(c), c0) and np.array_equal(xp.to_numpy(g), g0)


def test_normalization_none_takes_probabilities(xp):
    rng = np.random.default_rng()
    T, N, A = 40, 4, 10
    labels, ll, il = make_batch(rng, T, N, A, 10)
    z = rng.standard_normal((T, N, A)) * 2
    p = np.exp(log_softmax(z)).astype(np.float32)
    pa = p.astype(np.float64)
    costs, grads = ctc_loss(xp.from_numpy(p, 0), labels, ll, il, normalization="none")
    c, g = host(xp, costs), host(xp, grads)
    ref_c, ref_g, gamma = ctc_ref(pa, labels, ll, il, normalization="none", with_gamma=True)
    assert np.abs(c - ref_c).max() / np.abs(ref_c).max() < TOL, f"costs {c} vs reference {ref_c}"
    mask = valid_frames(il, p.shape)
    # cuDNN 9.19 (measured on an H200): -gamma / probs where the class has occupancy at that step,
    # probs itself where it has none (classes outside the sample's label, unreachable states).
    want = np.where(gamma > 1e-6, -gamma / pa, pa)
    err = rel(np.where(mask, g, 0), np.where(mask, want, 0))
    alt = rel(np.where(mask, g, 0), np.where(mask, ref_g, 0))
    # float32 division by small probabilities: up to 1.2e-3 measured over random draws
    assert err < 5e-3, f"grads differ from the measured NONE-mode rule by {err:.2e} (from probs - gamma by {alt:.2e})"


@pytest.mark.parametrize("algo", ALGOS)
def test_infeasible_sample_oob_gradient_modes(xp, algo):
    """Sample 1 is "2 2 3" (3 labels, 1 repeat: needs 4 steps) with 3 steps: no alignment exists."""
    rng = np.random.default_rng()
    T, N, A = 8, 3, 5
    labels, ll, il = np.array([1, 3, 4, 2, 2, 3, 4, 1]), [3, 3, 2], [8, 3, 5]
    x, xa = logits(rng, (T, N, A))
    ref_c, ref_g = ctc_ref(xa, labels, ll, il)
    assert np.isinf(ref_c[1])
    ok = np.array([True, False, True])
    mask = valid_frames(il, x.shape)
    for oob in ("zero", "skip"):
        go = xp.from_numpy(np.full((T, N, A), np.nan, np.float32), 0)
        costs, _ = ctc_loss(xp.from_numpy(x, 0), labels, ll, il, algo=algo, oob_grads=oob, grads_out=go)
        c, g = host(xp, costs), host(xp, go)
        assert np.abs(c[ok] - ref_c[ok]).max() / ref_c[ok].max() < TOL
        assert rel(np.where(mask, g, 0)[:, ok], ref_g[:, ok]) < TOL
        assert np.isposinf(c[1]) or c[1] > 1e30, f"oob_grads={oob}: infeasible sample's cost is {c[1]}, not inf"
        s = g[: il[1], 1]
        if oob == "zero":
            assert np.all(s == 0), f"oob_grads='zero': the infeasible sample's gradient is not 0: {s[s != 0][:5]}"
        else:
            assert np.isnan(s).all(), "oob_grads='skip': the infeasible sample's gradient was written"


@pytest.mark.parametrize("algo", ALGOS)
def test_longest_label(xp, algo):
    rng = np.random.default_rng()
    T, N, A = 300, 2, 400
    L = MAX_LABEL_LENGTH
    labels = np.concatenate([rng.permutation(np.arange(1, A))[:L], rng.integers(1, A, size=30)])
    ll, il = [L, 30], [T, 200]
    x, xa = logits(rng, (T, N, A))
    costs, grads = ctc_loss(xp.from_numpy(x, 0), labels, ll, il, algo=algo)
    # float32 alpha-beta over 300 steps and 511 states: about 1e-3 from the float64 reference (measured 7e-4)
    check_against_refs(host(xp, costs), host(xp, grads), xa, labels, ll, il, tol=2e-3)


def test_non_contiguous_x_is_copied(xp):
    rng = np.random.default_rng()
    T, N, A = 20, 4, 7
    labels, ll, il = make_batch(rng, T, N, A, 6)
    x, xa = logits(rng, (T, N, A))
    batch_major = xp.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2)), 0)
    xv = batch_major.permute(1, 0, 2) if xp.name == "torch" else batch_major.transpose(1, 0, 2)
    costs, grads = ctc_loss(xv, labels, ll, il)
    check_against_refs(host(xp, costs), host(xp, grads), xa, labels, ll, il)


def test_explicit_stream(xp):
    """``stream=`` other than the current one: the host labels' upload and the call are ordered."""
    rng = np.random.default_rng()
    T, N, A = 25, 4, 8
    labels, ll, il = make_batch(rng, T, N, A, 6)
    x, xa = logits(rng, (T, N, A))
    xd = xp.from_numpy(x, 0)
    xp.synchronize(0)
    s = xp.module.cuda.Stream()
    costs, grads = ctc_loss(xd, labels, ll, il, stream=s)
    s.synchronize()
    check_against_refs(host(xp, costs), host(xp, grads), xa, labels, ll, il)


def test_empty_batch(xp):
    x = xp.from_numpy(np.zeros((5, 0, 4), np.float32), 0)
    costs, grads = ctc_loss(x, [], [], [])
    assert tuple(costs.shape) == (0,) and tuple(grads.shape) == (5, 0, 4)


@pytest.mark.parametrize("algo", ALGOS)
def test_C_ctc_memcheck_case_short_labels(xp, algo, monkeypatch):
    """Issue 10: T=20, N=3, A=6, labels 3/2/1 wrote past cuDNN's shared memory with maxLabelLength = the batch's
    longest label (compute-sanitizer: Invalid __shared__ write in compute_alphas_and_betas_v8). The descriptor
    now always carries the 255 limit; the case is also in scripts/sanitize, under memcheck."""
    import cudnnkit.ops.ctc as ctc_mod

    seen = []
    real = ctc_mod.ctc_descriptor
    monkeypatch.setattr(ctc_mod, "ctc_descriptor", lambda *a: seen.append(a) or real(*a))
    rng = np.random.default_rng()
    T, N, A = 20, 3, 6
    labels = np.array([1, 2, 3, 4, 5, 1], dtype=np.int32)
    ll = np.array([3, 2, 1], dtype=np.int32)
    il = np.full(N, T, dtype=np.int32)
    x, xa = logits(rng, (T, N, A))
    costs, grads = ctc_loss(xp.from_numpy(x, 0), labels, ll, il, algo=algo)
    xp.synchronize(0)
    assert seen and all(a[-1] == MAX_LABEL_LENGTH for a in seen)
    check_against_refs(host(xp, costs), host(xp, grads), xa, labels, ll, il)
