"""Every registry op through cudnnkit.jax on a CPU-only JAX install: registration, tracing and shape inference.

For each L3 sample (tests/l3) in float64, ``jax.eval_shape`` of ``cudnnkit.jax.op(name)`` gives the shapes of
torch's own float64 reference outputs (and the declaration's dtypes), and ``jax.make_jaxpr`` of a gradient
traces the op's backward FFI target: nothing here runs on a GPU (``meta`` is host-side), so this is the CPU
tier's check that every op is reachable from JAX with the right shapes. Running them is the GPU tier's
(tests/gpu/test_jax_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy

import cudnnkit.jax as cj  # noqa: E402
from cudnnkit import autograd  # noqa: E402

from . import l3  # noqa: E402

jax.config.update("jax_enable_x64", True)


SAMPLES, REFS = l3.tables()
NAMES = sorted(autograd.functions())
CASES = [(n, i) for n in NAMES for i in range(len(SAMPLES[n](np.random.default_rng(0), "float64")))]


def _sds(a):
    return None if a is None else jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype)


def _torch(a):
    if a is None or not isinstance(a, np.ndarray):
        return a
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.copy(a))


def test_every_op_has_a_jax_function():
    assert set(vars(cj.ops)) == set(NAMES)
    assert all(cj.op(n).forward_name == f"cudnnkit_{n}" for n in NAMES)


@pytest.mark.parametrize("name, i", CASES)
def test_eval_shape_gives_torchs_shapes_and_the_grad_traces_the_backward(name, i):
    if name == "rnn" and not torch.cuda.is_available():
        pytest.skip("the RNN's meta asks cuDNN on a device for its weight and reserve sizes (a handle): GPU tier")
    d = autograd.get(name)
    inputs, kw = SAMPLES[name](np.random.default_rng(100 + i), "float64")[i]
    if name == "dropout":  # JAX takes dropout with an explicit seed only (its default state is hidden state)
        kw = dict(kw, seed=np.array([7], np.int32))
    arrays = {k: v for k, v in kw.items() if k in d.arrays}
    static = {k: v for k, v in kw.items() if k not in d.arrays}
    op = cj.op(name)

    def f(ins, arrs):
        got = op(*ins, **arrs, **static)
        return got if isinstance(got, tuple) else (got,)

    ins_s = tuple(_sds(a) for a in inputs)
    arr_s = {k: _sds(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
    outs = jax.eval_shape(f, ins_s, arr_s)
    want = REFS[name]([_torch(a) for a in inputs], {k: _torch(v) for k, v in kw.items()})
    specs = d.meta(*[None if a is None else _spec(a) for a in inputs],
                   **{k: _spec(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()})[0]  # fmt: skip
    for j, (o, w, s) in enumerate(zip(outs, want, specs)):
        assert o.dtype == jnp.dtype(s.dtype), f"{name} output {j}: {o.dtype} vs meta's {s.dtype}"
        if w is not None:
            assert tuple(o.shape) == tuple(w.shape), f"{name} output {j}: {o.shape} vs torch's {tuple(w.shape)}"
    diff = [j for j, a in enumerate(inputs) if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)]
    carry = [j for j, o in enumerate(outs[: len(d.outputs)]) if d.carries_gradient(j)
             and jnp.issubdtype(o.dtype, jnp.floating)]  # fmt: skip
    if not diff or not carry:
        return

    def loss(*xs):
        ins = list(inputs)
        ins = [None if a is None else jnp.asarray(a) for a in ins]
        for j, x in zip(diff, xs):
            ins[j] = x
        arrs = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
        got = f(tuple(ins), arrs)
        return sum(got[j].astype(jnp.float64).sum() for j in carry)

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(len(diff)))))(
        *[jax.ShapeDtypeStruct(inputs[j].shape, inputs[j].dtype) for j in diff]))  # fmt: skip
    assert f"cudnnkit_{name}_backward" in jaxpr and f"cudnnkit_{name}" in jaxpr


def _spec(a):
    from cudnnkit.ops._diff import Spec
    from cudnnkit.runtime.arrays import contiguous_strides

    return Spec(tuple(a.shape), contiguous_strides(tuple(a.shape)), str(a.dtype))


def test_a_bad_argument_is_refused_at_trace_time():
    x = jax.ShapeDtypeStruct((1, 2, 5, 5), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 4, 3, 3), jnp.float32)
    with pytest.raises(ValueError, match="x has 2 channels"):
        jax.eval_shape(lambda a, b: cj.ops.convolution(a, b, None), x, w)


BATCHED = [(n, i) for n, i in CASES if autograd.get(n).batch]


@pytest.mark.parametrize("name, i", BATCHED)
def test_vmap_of_every_op_with_a_batching_rule_gives_the_stacked_shapes(name, i):
    """``jax.vmap`` over the arrays an op splits by sample (its declaration's ``batch``), traced with
    ``jax.eval_shape``: each output is the per-example output with the mapped axis in front (the fold and unfold
    agree with meta, and every result the folded call makes is declared), and the gradient with respect to those
    arrays traces under vmap too (its backward target folds) where no other floating input needs one."""
    d = autograd.get(name)
    inputs, kw = SAMPLES[name](np.random.default_rng(200 + i), "float64")[i]
    arrays = {k: v for k, v in kw.items() if k in d.arrays}
    static = {k: v for k, v in kw.items() if k not in d.arrays}
    op = cj.op(name)
    mapped = [j for j, n in enumerate(d.inputs) if n in d.batch and inputs[j] is not None]
    specs = {n: _spec(a) for n, a in zip(d.inputs, inputs) if a is not None}
    if d.batch_refuses is not None and d.batch_refuses(static, specs) is not None:
        pytest.skip(f"{name}: this sample's keywords do not fold ({d.batch_refuses(static, specs)}); refused by name")
    B = 3

    def f(*xs):
        ins = [None if a is None else jnp.asarray(a) for a in inputs]
        for j, x in zip(mapped, xs):
            ins[j] = x
        got = op(*ins, **{k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()},
                 **static)  # fmt: skip
        return got if isinstance(got, tuple) else (got,)

    one = jax.eval_shape(f, *[_sds(inputs[j]) for j in mapped])
    many = jax.eval_shape(jax.vmap(f), *[jax.ShapeDtypeStruct((B, *inputs[j].shape), inputs[j].dtype) for j in mapped])
    assert [tuple(m.shape) for m in many] == [(B, *o.shape) for o in one]
    others = [j for j, a in enumerate(inputs) if j not in mapped and isinstance(a, np.ndarray)
              and np.issubdtype(a.dtype, np.floating)]  # fmt: skip
    carry = [j for j in range(len(d.outputs)) if d.carries_gradient(j)]
    if others or not carry or not all(np.issubdtype(inputs[j].dtype, np.floating) for j in mapped):
        return  # a per-sample gradient of a shared input (w, scale) has no folded form: refused by name (CPU test)

    def loss(*xs):
        got = f(*xs)
        return sum(got[j].astype(jnp.float64).sum() for j in carry)

    grads = jax.eval_shape(jax.vmap(jax.grad(loss, argnums=tuple(range(len(mapped))))),
                           *[jax.ShapeDtypeStruct((B, *inputs[j].shape), inputs[j].dtype) for j in mapped])  # fmt: skip
    assert [tuple(g.shape) for g in grads] == [(B, *inputs[j].shape) for j in mapped]


SHARED = [(n, i) for n, i in BATCHED
          if any(j is not None and n_ not in autograd.get(n).batch and isinstance(a, np.ndarray)
                 and np.issubdtype(a.dtype, np.floating)
                 for j, (n_, a) in enumerate(zip(autograd.get(n).inputs,
                                                 SAMPLES[n](np.random.default_rng(200 + i), "float64")[i][0])))]  # fmt: skip


@pytest.mark.parametrize("name, i", SHARED)
def test_vmap_of_grad_with_the_shared_inputs_closed_over_traces(name, i):
    """The samples whose op has a shared floating input (a convolution's ``w``, a norm's ``scale``): ``vmap(grad)``
    with respect to the mapped arrays, the shared ones closed over, traces (``jax.eval_shape``) to per-example
    gradients: the symbolic zeros tell the backward those are not perturbed, so it asks only for the mapped
    arrays' gradients and folds."""
    d = autograd.get(name)
    inputs, kw = SAMPLES[name](np.random.default_rng(200 + i), "float64")[i]
    arrays = {k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items() if k in d.arrays}
    static = {k: v for k, v in kw.items() if k not in d.arrays}
    specs = {n: _spec(a) for n, a in zip(d.inputs, inputs) if a is not None}
    if d.batch_refuses is not None and d.batch_refuses(static, specs) is not None:
        pytest.skip(f"{name}: this sample's keywords do not fold ({d.batch_refuses(static, specs)}); refused by name")
    mapped = [j for j, n in enumerate(d.inputs) if n in d.batch and inputs[j] is not None]
    carry = [j for j in range(len(d.outputs)) if d.carries_gradient(j)]
    op, B = cj.op(name), 3

    def loss(*xs):
        ins = [None if a is None else jnp.asarray(a) for a in inputs]  # the shared ones: constants
        for j, x in zip(mapped, xs):
            ins[j] = x
        got = op(*ins, **arrays, **static)
        got = got if isinstance(got, tuple) else (got,)
        return sum(got[j].astype(jnp.float64).sum() for j in carry)

    grads = jax.eval_shape(jax.vmap(jax.grad(loss, argnums=tuple(range(len(mapped))))),
                           *[jax.ShapeDtypeStruct((B, *inputs[j].shape), inputs[j].dtype) for j in mapped])  # fmt: skip
    assert [tuple(g.shape) for g in grads] == [(B, *inputs[j].shape) for j in mapped]
