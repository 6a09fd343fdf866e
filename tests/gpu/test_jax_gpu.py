"""cudnnkit.jax on the GPU: registry ops through XLA's FFI under jit and grad, against JAX's own (float32, TF32
off on both sides) and NumPy float64 references."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.gpu

if not any(d.platform == "gpu" for d in jax.devices()):  # pragma: no cover
    pytest.skip("no JAX GPU device", allow_module_level=True)

import cudnnkit  # noqa: E402
import cudnnkit.jax as cj  # noqa: E402


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_softmax_forward_and_grad_under_jit():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 33)), jnp.float32)
    ct = jnp.asarray(rng.standard_normal((8, 33)), jnp.float32)
    y = jax.jit(lambda a: cj.ops.softmax(a, axis=-1))(x)
    assert _rel(y, jax.nn.softmax(x, axis=-1)) < 1e-6
    g = jax.jit(jax.grad(lambda a: (cj.ops.softmax(a, axis=-1) * ct).sum()))(x)
    want = jax.grad(lambda a: (jax.nn.softmax(a, axis=-1) * ct).sum())(x)
    assert _rel(g, want) < 1e-5


def test_convolution_forward_and_grads_under_jit():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 4, 9, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((6, 4, 3, 3)) * 0.2, jnp.float32)
    b = jnp.asarray(rng.standard_normal((6,)), jnp.float32)

    def ref(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                         precision=jax.lax.Precision.HIGHEST)  # fmt: skip
        return y + b[None, :, None, None]

    with cudnnkit.settings(allow_tf32=False):
        y = jax.jit(lambda *a: cj.ops.convolution(*a, padding=1))(x, w, b)
        assert _rel(y, ref(x, w, b)) < 1e-5
        loss = lambda f: lambda *a: (f(*a) ** 2).sum()  # noqa: E731
        gs = jax.jit(jax.grad(loss(lambda *a: cj.ops.convolution(*a, padding=1)), argnums=(0, 1, 2)))(x, w, b)
    want = jax.grad(loss(ref), argnums=(0, 1, 2))(x, w, b)
    for got, exp in zip(gs, want):
        assert _rel(got, exp) < 1e-4


def test_batch_norm_returns_its_running_statistics_as_new_state():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 3, 5, 5)), jnp.float32)
    s, b = jnp.ones((3,), jnp.float32), jnp.zeros((3,), jnp.float32)
    rm, rv = jnp.zeros((3,), jnp.float32), jnp.ones((3,), jnp.float32)
    y, new_m, new_v = jax.jit(lambda *a: cj.ops.batch_norm(a[0], a[1], a[2], None, running_mean=a[3],
                                                            running_var=a[4], training=True, momentum=0.1))(
        x, s, b, rm, rv
    )  # fmt: skip
    xn = np.asarray(x, np.float64)
    mean, var = xn.mean(axis=(0, 2, 3)), xn.var(axis=(0, 2, 3))
    assert _rel(new_m, 0.1 * mean) < 1e-5 and float(rm.sum()) == 0.0
    unbiased = var * xn[:, 0].size / (xn[:, 0].size - 1)
    assert _rel(new_v, 0.9 + 0.1 * unbiased) < 1e-5
    want = (xn - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    assert _rel(y, want) < 1e-5


# ----------------------------------------------------------------- every registry op, from the L3 samples


def _l3_tables():
    from .test_l3_gpu import CASES, REFS, SAMPLES, _case, _split, _tol, _torch

    return CASES, REFS, SAMPLES, _case, _split, _tol, _torch


try:
    _CASES = _l3_tables()[0]
except Exception:  # torch missing: the references are torch's
    _CASES = []


def _sample(name, i):
    """``(declaration, inputs, keywords, (tol, gradient tol), static keywords, JAX arrays)`` of L3 sample ``i`` of
    op ``name`` (float64 samples stay float64: x64 on)."""
    from cudnnkit import autograd

    jax.config.update("jax_enable_x64", True)
    _, _, _, _case, _, _tol, _ = _l3_tables()
    d = autograd.get(name)
    inputs, kw = _case(name, i)
    if name == "dropout":  # JAX takes dropout with an explicit seed only (its default state is hidden state)
        kw = dict(kw, seed=np.array([7], np.int32))
    static = {k: v for k, v in kw.items() if k not in d.arrays}
    arrays = {k: (None if v is None else jnp.asarray(v)) for k, v in kw.items() if k in d.arrays}
    return d, inputs, kw, _tol(inputs), static, arrays


@pytest.mark.parametrize("name, i", _CASES)
def test_every_op_matches_torch_through_jax(name, i):
    """Each L3 sample through ``cudnnkit.jax.op(name)`` under jit: the outputs against torch's float64 CPU
    reference (tests/l3), and the gradients of a random linear loss through ``jax.vjp`` against torch's autograd."""
    torch = pytest.importorskip("torch")
    _, REFS, _, _, _split, _, _torch = _l3_tables()
    d, inputs, kw, (tol, gtol), static, arrays = _sample(name, i)
    present = [j for j, a in enumerate(inputs) if a is not None]
    diff = [j for j in present if np.issubdtype(np.asarray(inputs[j]).dtype, np.floating)
            or np.asarray(inputs[j]).dtype.name == "bfloat16"]  # fmt: skip

    def f(*xs):
        full = list(inputs)
        full = [None if a is None else jnp.asarray(a) for a in full]
        for j, x in zip(diff, xs):
            full[j] = x
        got = cj.op(name)(*full, **arrays, **static)
        got = got if isinstance(got, tuple) else (got,)
        return got[: len(d.outputs)]

    xs = [jnp.asarray(inputs[j]) for j in diff]
    outs, pullback = jax.vjp(jax.jit(f), *xs)
    ref_in = [_torch(a, "cpu", grad=j in diff) for j, a in enumerate(inputs)]
    want = REFS[name](ref_in, _split(d, kw, "cpu"))
    rng = np.random.default_rng(7 + i)
    cts, loss_ref = [], 0.0
    for j, (o, w) in enumerate(zip(outs, want)):
        if w is None:
            cts.append(jnp.zeros_like(o))
            continue
        assert tuple(o.shape) == tuple(w.shape), f"{name} output {j}: {o.shape} vs torch {tuple(w.shape)}"
        assert _rel(np.asarray(o, np.float64), w.detach().double().numpy()) < tol, f"{name} output {j}"
        if d.carries_gradient(j) and jnp.issubdtype(o.dtype, jnp.floating):
            c = rng.standard_normal(tuple(o.shape))
            cts.append(jnp.asarray(c, o.dtype))
            loss_ref = loss_ref + (w * torch.from_numpy(c).to(w.dtype)).sum()
        else:
            cts.append(jnp.zeros_like(o))
    if isinstance(loss_ref, float) or not diff:
        return
    grads = pullback(tuple(cts))
    refs = torch.autograd.grad(loss_ref, [ref_in[j] for j in diff], allow_unused=True)
    checked = 0
    for j, g, r in zip(diff, grads, refs):
        if r is None:
            continue
        assert _rel(np.asarray(g, np.float64), r.double().numpy()) < gtol, f"{name} d input {j}"
        checked += 1
    assert checked, f"{name}: the reference has no gradient for any input: nothing was compared"


_BATCHED = [(n, i) for n, i in _CASES if cudnnkit.autograd.get(n).batch]


@pytest.mark.parametrize("name, i", _BATCHED)
def test_vmap_folds_into_one_call_with_the_per_example_results(name, i):
    """``jax.vmap`` of each op with a batching rule (the declaration's ``batch``: the arrays split by sample), under
    jit, over three different perturbations of the sample's mapped arrays: the results equal the same op called on
    each example alone (the fold is exact: one cuDNN call over the folded samples), and so do the gradients with
    respect to the mapped arrays where no shared floating input needs one."""
    d, inputs, _, (tol, gtol), static, arrays = _sample(name, i)
    mapped = [j for j, n in enumerate(d.inputs) if n in d.batch and inputs[j] is not None]
    specs = {n: _spec(a) for n, a in zip(d.inputs, inputs) if a is not None}
    if d.batch_refuses is not None and d.batch_refuses(static, specs) is not None:
        pytest.skip(f"this sample does not fold ({d.batch_refuses(static, specs)}): refused by name (CPU test)")
    rng = np.random.default_rng(40 + i)
    stacks = [jnp.asarray(np.stack([np.asarray(inputs[j], np.float64) * (1 + 0.1 * b)
                                    + 0.01 * rng.standard_normal(np.shape(inputs[j])) for b in range(3)]),
                          jnp.asarray(inputs[j]).dtype) for j in mapped]  # fmt: skip

    def f(*xs):
        full = [None if a is None else jnp.asarray(a) for a in inputs]
        for j, x in zip(mapped, xs):
            full[j] = x
        got = cj.op(name)(*full, **arrays, **static)
        return (got if isinstance(got, tuple) else (got,))[: len(d.outputs)]

    many = jax.jit(jax.vmap(f))(*stacks)
    for b in range(3):
        one = jax.jit(f)(*(s[b] for s in stacks))
        for j, (m, o) in enumerate(zip(many, one)):
            assert _rel(m[b], o) < tol, f"{name} output {j}, example {b}"
    others = [j for j, a in enumerate(inputs) if j not in mapped and a is not None
              and np.issubdtype(np.asarray(a).dtype, np.floating)]  # fmt: skip
    if others or not all(jnp.issubdtype(s.dtype, jnp.floating) for s in stacks):
        return

    def loss(*xs):
        return sum(o.astype(jnp.float64).sum() ** 2 for k, o in enumerate(f(*xs)) if d.carries_gradient(k))

    argnums = tuple(range(len(mapped)))
    gmany = jax.jit(jax.vmap(jax.grad(loss, argnums=argnums)))(*stacks)
    for b in range(3):
        gone = jax.jit(jax.grad(loss, argnums=argnums))(*(s[b] for s in stacks))
        for j, (m, o) in enumerate(zip(gmany, gone)):
            assert _rel(m[b], o) < gtol, f"{name} gradient {j}, example {b}"


def _spec(a):
    from cudnnkit.ops._diff import Spec
    from cudnnkit.runtime.arrays import contiguous_strides

    return Spec(tuple(np.shape(a)), contiguous_strides(tuple(np.shape(a))), str(np.asarray(a).dtype))


def test_the_functional_api_against_jax_and_flax_semantics():
    """cudnnkit.jax.nn on the real ops: flax-layout conv with a bias, pools, layer norm and attention against
    JAX's own (float32 HIGHEST / float32 attention reference)."""
    from cudnnkit.jax import nn

    rng = np.random.default_rng(9)
    r = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)  # noqa: E731
    x, w, b = r(2, 9, 8, 4), r(3, 3, 4, 6) * 0.3, r(6)
    with cudnnkit.settings(allow_tf32=False):
        got = jax.jit(lambda *a: nn.conv(*a, strides=2))(x, w, b)
    want = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision=jax.lax.Precision.HIGHEST) + b  # fmt: skip
    assert _rel(got, want) < 1e-5
    pooled = nn.max_pool(x, (3, 3), (2, 2), "SAME")
    want = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    assert _rel(pooled, want) < 1e-7
    h = r(8, 64)
    ln = nn.layer_norm(h, epsilon=1e-5)
    ref = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    assert _rel(ln, ref) < 1e-5
    q, k, v = (r(2, 128, 4, 64).astype(jnp.bfloat16) for _ in range(3))
    o = jax.jit(lambda *a: nn.dot_product_attention(*a, is_causal=True))(q, k, v)
    ref = jax.nn.dot_product_attention(*(t.astype(jnp.float32) for t in (q, k, v)), is_causal=True)
    assert _rel(o, ref) < 2e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_z", [False, True])
def test_batch_norm_fused_relu_forward_and_grads_against_jax(dtype, with_z):
    """nn.batch_norm(activation='relu', z=) (cuDNN's BN_ACTIVATION / BN_ADD_ACTIVATION on channels-last data)
    under jit: y, the new state and the gradients of x, scale, bias (and z) against JAX's own batch norm + ReLU in
    float32."""
    from cudnnkit.jax import nn

    rng = np.random.default_rng(11)
    dt = jnp.dtype(dtype)
    x = jnp.asarray(rng.standard_normal((8, 6, 6, 16)), dt)
    z = jnp.asarray(rng.standard_normal((8, 6, 6, 16)), dt) if with_z else None
    s, b = jnp.asarray(rng.uniform(0.5, 1.5, 16), jnp.float32), jnp.asarray(rng.standard_normal(16), jnp.float32)
    m, v = jnp.zeros(16, jnp.float32), jnp.ones(16, jnp.float32)
    ct = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)

    def ours(x, s, b, z):
        y, nm, nv = nn.batch_norm(x, s, b, m, v, training=True, momentum=0.9, activation="relu", z=z)
        return (y.astype(jnp.float32) * ct).sum(), (y, nm, nv)

    def ref(x, s, b, z):
        xf = x.astype(jnp.float32)
        mu, var = xf.mean((0, 1, 2)), xf.var((0, 1, 2))
        y = (xf - mu) / jnp.sqrt(var + 1e-5) * s + b + (0 if z is None else z.astype(jnp.float32))
        y = jnp.maximum(y, 0)
        n = x.size // x.shape[-1]
        return (y * ct).sum(), (y, 0.1 * mu, 0.9 + 0.1 * var * n / (n - 1))

    argnums = (0, 1, 2, 3) if with_z else (0, 1, 2)
    (_, got), g_got = jax.jit(jax.value_and_grad(ours, argnums=argnums, has_aux=True))(x, s, b, z)
    (_, want), g_want = jax.value_and_grad(ref, argnums=argnums, has_aux=True)(x, s, b, z)
    tol = 1e-5 if dtype == "float32" else 2e-2
    for a, w_ in zip(got, want):
        assert _rel(a, w_) < tol
    for a, w_ in zip(g_got, g_want):
        assert _rel(a, w_) < (1e-4 if dtype == "float32" else 3e-2)


@pytest.mark.parametrize("case", ["bias", "mask", "window", "causal-window", "gqa", "lengths", "lengths-causal-gqa",
                                  "lengths-bias", "lengths-window", "lengths-mask", "causal-short-q",
                                  "causal-long-q", "causal-long-q-lengths", "causal-window-long-q"])  # fmt: skip
def test_dot_product_attention_variants_against_jax(case):
    """cudnnkit.jax.nn.dot_product_attention's variants (the L3 op "attention" under jit): a learned bias (its
    gradient cuDNN's dbias), a boolean key-padding mask, local windows, grouped heads, query/key-value sequence
    lengths (cuDNN's padding mask; padded rows, a zero key/value length and their gradients as JAX defines them),
    the causal triangle with T != S (JAX's and cuDNN's default both top-left aligned: row t keeps keys 0..t);
    output and gradients against jax.nn.dot_product_attention in float32 on the same bfloat16 values."""
    from cudnnkit.jax import nn

    rng = np.random.default_rng(12)
    b, t, n, h = 2, 128, 4, 64
    kvh = 2 if "gqa" in case else n
    s_len = {"causal-short-q": 192, "causal-long-q": 64, "causal-long-q-lengths": 64, "causal-window-long-q": 64}.get(
        case, t
    )
    q = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((b, s_len, kvh, h)), jnp.bfloat16) for _ in range(2))
    bias = jnp.asarray(rng.standard_normal((1, n, t, t)), jnp.bfloat16) if "bias" in case else None
    mask = None
    if "mask" in case:
        mask = jnp.asarray(rng.random((b, 1, 1, t)) > 0.2).at[..., 0].set(True)
    if case == "lengths-mask":  # sample 1: every key its length leaves masked, so every row has none
        mask = mask.at[1, :, :, :90].set(False)
    kw = {"window": dict(local_window_size=(16, 8)), "causal-window": dict(local_window_size=32, is_causal=True),
          "lengths": dict(query_seq_lengths=jnp.array([97, 128], jnp.int32),
                          key_value_seq_lengths=jnp.array([128, 0], jnp.int32)),
          "lengths-causal-gqa": dict(query_seq_lengths=jnp.array([128, 50], jnp.int32),
                                     key_value_seq_lengths=jnp.array([64, 128], jnp.int32), is_causal=True),
          "lengths-bias": dict(query_seq_lengths=jnp.array([100, 128], jnp.int32),
                               key_value_seq_lengths=jnp.array([128, 77], jnp.int32)),
          "lengths-window": dict(query_seq_lengths=jnp.array([128, 90], jnp.int32),
                                 key_value_seq_lengths=jnp.array([40, 128], jnp.int32), local_window_size=(16, 8)),
          "lengths-mask": dict(query_seq_lengths=jnp.array([128, 128], jnp.int32),
                               key_value_seq_lengths=jnp.array([128, 90], jnp.int32)),
          "causal-short-q": dict(is_causal=True), "causal-long-q": dict(is_causal=True),
          "causal-window-long-q": dict(is_causal=True, local_window_size=32),
          "causal-long-q-lengths": dict(is_causal=True, query_seq_lengths=jnp.array([100, 128], jnp.int32),
                                        key_value_seq_lengths=jnp.array([64, 30], jnp.int32))}  # fmt: skip
    kw = kw.get(case, {})
    ct = jnp.asarray(rng.standard_normal((b, t, n, h)), jnp.float32)

    def loss(fn, cast):
        def f(q, k, v, bias):
            o = fn(*(cast(x) for x in (q, k, v)), None if bias is None else cast(bias), mask, scale=0.125, **kw)
            return (o.astype(jnp.float32) * ct).sum(), o

        return f

    argnums = (0, 1, 2, 3) if bias is not None else (0, 1, 2)
    (_, got), g_got = jax.jit(jax.value_and_grad(loss(nn.dot_product_attention, lambda x: x), argnums=argnums,
                                                 has_aux=True))(q, k, v, bias)  # fmt: skip
    (_, want), g_want = jax.value_and_grad(loss(jax.nn.dot_product_attention, lambda x: x.astype(jnp.float32)),
                                           argnums=argnums, has_aux=True)(q, k, v, bias)  # fmt: skip
    assert got.dtype == jnp.bfloat16 and _rel(got, want) < 2e-2
    for j, (a, w_) in enumerate(zip(g_got, g_want)):
        assert _rel(a, w_) < 3e-2, (case, j)


def test_eager_l2_calls_on_jax_arrays_return_jax_arrays():
    """The JAX adapter: L2 ops on JAX GPU arrays outside jit (DLPack in on JAX's stream, outputs handed to JAX
    once queued); a JAX array as out= is refused (immutable)."""
    from cudnnkit import ops

    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((4, 50)), jnp.float32)
    y = ops.softmax_forward(x)
    assert isinstance(y, jax.Array) and _rel(y, jax.nn.softmax(x, axis=-1)) < 1e-6
    z = jnp.exp(y) * 2  # JAX work after ours sees our result
    assert _rel(z, 2 * np.exp(np.asarray(jax.nn.softmax(x, axis=-1)))) < 1e-6
    xi = jnp.asarray(rng.standard_normal((2, 3, 8, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((5, 3, 3, 3)), jnp.float32)
    with cudnnkit.settings(allow_tf32=False):
        yc = ops.convolution_forward(xi, w, padding=1)
    ref = jax.lax.conv_general_dilated(xi, w, (1, 1), ((1, 1), (1, 1)), precision=jax.lax.Precision.HIGHEST)
    assert isinstance(yc, jax.Array) and _rel(yc, ref) < 1e-5
    with pytest.raises((TypeError, ValueError), match="out is read-only|JAX arrays are immutable"):
        ops.softmax_forward(x, out=jnp.zeros_like(x))
