"""The JAX op machinery (cudnnkit.jax._ops) on JAX's CPU platform, with pure-NumPy declarations standing in for
cuDNN's and a NumPy runner: the forward and backward FFI targets, the shapes from ``meta``, ``jax.custom_vjp``,
``jit``, ``grad``, optional inputs, arrays without a gradient, a mutated array returned as new state, integer
inputs, and a bad argument refused at trace time. The cuDNN-backed ops run the same machinery on CUDA (the GPU
tier)."""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
jax.config.update("jax_enable_x64", True)

from cudnnkit.jax import _ops  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402

_NP = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64, "uint8": np.uint8}


@pytest.fixture(autouse=True)
def on_the_cpu():
    """The stand-ins are registered for JAX's CPU platform: the arrays go there (a GPU machine's default is CUDA)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


class NumpyRunner:
    """CPU buffers as NumPy arrays over XLA's memory (no copy); results written with ``np.copyto``."""

    platform = "cpu"

    def array(self, call, b, shape=None, strides=None):
        n = int(np.prod(b.shape, dtype=np.int64))
        dt = np.dtype(_NP[b.dtype])
        raw = (ctypes.c_char * max(n * dt.itemsize, 1)).from_address(b.ptr)
        flat = np.frombuffer(raw, dtype=dt, count=n)
        if shape is None:
            return flat.reshape(b.shape)
        return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * dt.itemsize for s in strides))

    def write(self, call, dst, value, name, shape=None, strides=None):
        view = self.array(call, dst, shape, strides)
        assert view.shape == np.shape(value), (name, view.shape, np.shape(value))
        np.copyto(view, value)

    def zero(self, call, dst):
        self.array(call, dst)[...] = 0

    def scope(self, call):
        return contextlib.nullcontext()


CALLS: list[str] = []


def _fwd(x, w, bias=None, *, scale=1.0, stat=None, labels=None):
    CALLS.append("forward")
    prod = x * w  # a new residual (not an input or an output)
    y = prod * scale + (0 if bias is None else bias)
    if labels is not None:
        y = y + labels[:, None]
    if stat is not None:
        stat += y.sum()  # a mutated array: written in place
    return (y, prod.sum(axis=-1)), {"x": x, "w": w, "prod": prod}


DOUTS: list[tuple] = []  # which cotangents each backward of mul_scale was given (None: a zero one)


def _bwd(res, douts, needs, *, scale=1.0, **_):
    CALLS.append("backward")
    DOUTS.append(tuple(g is not None for g in douts))
    dy, ds = douts
    g = (0 if dy is None else dy * scale) + (0 if ds is None else ds[..., None])
    gb = np.broadcast_to(np.asarray(g, float), res["x"].shape)
    db = np.broadcast_to(np.asarray(0.0 if dy is None else dy, float), res["x"].shape)  # y's bias term only
    return (gb * res["w"] if needs[0] else None, gb * res["x"] if needs[1] else None,
            db.copy() if needs[2] else None)  # fmt: skip


def _meta(x: Spec, w: Spec, bias=None, *, scale=1.0, stat=None, labels=None):
    if x.shape != w.shape:
        raise ValueError(f"mul_scale: x {x.shape} and w {w.shape} must have one shape")
    return (new_like(x), new_like(x, shape=x.shape[:-1])), {"x": x, "w": w, "prod": new_like(x)}


OP = Differentiable("mul_scale", "softmax_forward", ("x", "w", "bias"), ("out", "sum"), _fwd, _bwd, _meta,
                    arrays=("stat", "labels"), mutated=("stat",))  # fmt: skip
J = _ops.JaxOp(OP, NumpyRunner(), namespace="cudnnkit_jaxtest")


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal((3, 4)))


def test_the_forward_matches_the_definition_under_jit():
    x, w = _args()
    b = jnp.ones((3, 4))
    y, s = jax.jit(lambda a, c, d: J(a, c, d, scale=0.5))(x, w, b)
    np.testing.assert_allclose(np.asarray(y), np.asarray(x * w * 0.5 + 1))
    np.testing.assert_allclose(np.asarray(s), np.asarray((x * w).sum(-1)))
    y2, _ = J(x, w, None, scale=2.0)  # an absent optional input
    np.testing.assert_allclose(np.asarray(y2), np.asarray(2 * x * w))


def test_grad_goes_through_the_backward_target():
    x, w = _args(1)
    b = jnp.zeros((3, 4))

    def loss(a, c, d):
        y, s = J(a, c, d, scale=0.25)
        return (y**2).sum() + 3 * s.sum()

    CALLS.clear()
    gx, gw, gb = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)
    assert CALLS.count("backward") == 1

    def ref(a, c, d):
        y = a * c * 0.25 + d
        return (y**2).sum() + 3 * (a * c).sum(-1).sum()

    for got, want in zip((gx, gw, gb), jax.grad(ref, argnums=(0, 1, 2))(x, w, b)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def test_value_and_grad_and_an_unused_output():
    x, w = _args(2)
    val, g = jax.value_and_grad(lambda a: J(a, w, None)[0].sum())(x)  # the second output's cotangent is zero
    np.testing.assert_allclose(float(val), float((x * w).sum()))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w))


def test_a_mutated_array_comes_back_as_new_state_and_the_operand_is_untouched():
    x, w = _args(3)
    stat = jnp.zeros(())
    y, s, new = jax.jit(lambda a, c, st: J(a, c, None, stat=st))(x, w, stat)
    assert float(stat) == 0.0  # XLA's operand was copied, never written
    np.testing.assert_allclose(float(new), float(np.asarray(y).sum()))


def test_an_integer_array_takes_no_gradient():
    x, w = _args(4)
    labels = jnp.arange(3, dtype=jnp.int64)
    g = jax.grad(lambda a: J(a, w, None, labels=labels)[0].sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w))


def test_a_bad_argument_is_refused_at_trace_time_before_any_handler_runs():
    x, _ = _args()
    CALLS.clear()
    with pytest.raises(ValueError, match=r"mul_scale: x \(3, 4\) and w \(4, 3\) must have one shape"):
        jax.jit(lambda a, c: J(a, c, None))(x, jnp.zeros((4, 3)))
    assert CALLS == []
    with pytest.raises(TypeError, match=r"mul_scale takes 3 array\(s\)"):
        J(x, x)


def test_a_failure_inside_the_handler_comes_back_as_an_error_naming_it():
    x, w = _args()

    def boom(*a, **k):
        raise RuntimeError("the cuDNN call refused these arrays")

    bad = Differentiable("mul_scale_bad", "softmax_forward", OP.inputs, OP.outputs, boom, _bwd, _meta,
                         arrays=OP.arrays, mutated=OP.mutated)  # fmt: skip
    jb = _ops.JaxOp(bad, NumpyRunner(), namespace="cudnnkit_jaxtest")
    with pytest.raises(Exception, match=r"cudnnkit: RuntimeError: the cuDNN call refused these arrays"):
        jax.block_until_ready(jb(x, w, None))


def test_vmap_without_a_batching_rule_names_the_op():
    x, w = _args()
    with pytest.raises(NotImplementedError, match=r"cudnnkit.jax.ops.mul_scale: jax.vmap has no batching rule"):
        jax.vmap(lambda a: J(a, a, None)[0])(jnp.stack([x, x]))


def _rows_fwd(x, w=None, *, scale=1.0, shared=None):
    CALLS.append("forward")
    name, w = ("shared", shared) if w is None else ("w", w)  # (F,), broadcast over the rows: every sample's
    prod = x * w
    return (prod * scale,), {"x": x, name: w, "prod": prod}


NEEDS: list[tuple] = []  # the ``needs`` each stand-in backward was given


def _rows_bwd(res, douts, needs, *, scale=1.0, **_):
    CALLS.append("backward")
    NEEDS.append(tuple(needs))
    (dy,) = douts
    w = res["w"] if "w" in res else res["shared"]
    gx = dy * scale * w if needs[0] else None
    return (gx,) if len(needs) == 1 else (gx, (dy * scale * res["x"]).sum(axis=0) if needs[1] else None)


def _rows_meta(x: Spec, w=None, *, scale=1.0, shared=None):
    return (new_like(x),), {"x": x, ("shared" if w is None else "w"): w or shared, "prod": new_like(x)}


_BATCH = dict(batch=("x", "out", "prod"), batch_refuses=lambda kw, specs: "scale 0" if kw.get("scale") == 0 else None)
# w as a keyword array (no gradient) and as a differentiable input
ROWS = Differentiable("scale_rows", "softmax_forward", ("x",), ("out",), lambda x, **k: _rows_fwd(x, **k),
                      _rows_bwd, lambda x, **k: _rows_meta(x, **k), arrays=("shared",), **_BATCH)  # fmt: skip
ROWS_W = Differentiable("scale_rows_w", "softmax_forward", ("x", "w"), ("out",), _rows_fwd, _rows_bwd, _rows_meta,
                        **_BATCH)  # fmt: skip
JR = _ops.JaxOp(ROWS, NumpyRunner(), namespace="cudnnkit_jaxtest")
JRW = _ops.JaxOp(ROWS_W, NumpyRunner(), namespace="cudnnkit_jaxtest")


def test_vmap_folds_the_mapped_axis_into_the_samples_one_call_each_way():
    """A declaration with ``batch`` names: ``jax.vmap`` (and a jitted vmap of its gradient) folds the mapped axis
    into the leading axis of x, so one forward and one backward call serve the whole batch; an unmapped array among
    them is broadcast; results equal the per-example calls."""
    rng = np.random.default_rng(7)
    xs, w = jnp.asarray(rng.standard_normal((5, 3, 4))), jnp.asarray(rng.standard_normal(4))
    CALLS.clear()
    ys = jax.vmap(lambda a: JR(a, shared=w, scale=0.5))(xs)
    assert CALLS == ["forward"] and ys.shape == (5, 3, 4)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(xs * w * 0.5))
    CALLS.clear()
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda a: JRW(a, w))(xs)), np.asarray(xs * w))
    assert CALLS == ["forward"]

    def loss(a):
        return (JR(a, shared=w, scale=0.5) ** 2).sum()

    CALLS.clear()
    gx = jax.jit(jax.vmap(jax.grad(loss)))(xs)
    assert CALLS.count("backward") == 1 and CALLS.count("forward") == 1
    np.testing.assert_allclose(np.asarray(gx), np.asarray(2 * (xs * w * 0.5) * 0.5 * w), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gx[2]), np.asarray(jax.grad(loss)(xs[2])), rtol=1e-12)  # one example
    # vmap of a vmap: both mapped axes fold
    y2 = jax.vmap(jax.vmap(lambda a: JR(a, shared=w)))(jnp.stack([xs, 2 * xs]))
    np.testing.assert_allclose(np.asarray(y2[1]), np.asarray(2 * xs * w))


def test_vmap_over_an_array_not_split_by_sample_is_refused_naming_it():
    rng = np.random.default_rng(8)
    x, ws = jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal((5, 4)))
    with pytest.raises(NotImplementedError, match=r"scale_rows: jax.vmap maps over shared, which is not split by"):
        jax.vmap(lambda b: JR(x, shared=b))(ws)
    xs, w = jnp.stack([x] * 5), ws[0]
    # a per-sample gradient of a shared w (grad taken with respect to it) cannot come from a folded call
    with pytest.raises(NotImplementedError, match=r"scale_rows_w: jax.vmap asks for a per-sample gradient of w"):
        jax.vmap(jax.grad(lambda a, b: JRW(a, b).sum(), argnums=(0, 1)), in_axes=(0, None))(xs, w)
    with pytest.raises(NotImplementedError, match=r"cannot fold this call: scale 0"):
        jax.vmap(lambda a: JR(a, shared=w, scale=0))(xs)


def test_the_backward_computes_only_the_gradients_of_perturbed_inputs():
    """``custom_vjp`` with symbolic zeros: the forward rule learns which inputs the differentiation perturbs, so the
    backward target is asked only for their gradients (a closed-over w, or one ``grad`` is not taken with respect
    to, gets none: no cuDNN call for it), and an output nothing depends on reaches it as no cotangent at all."""
    rng = np.random.default_rng(11)
    x, w = jnp.asarray(rng.standard_normal((3, 4))), jnp.asarray(rng.standard_normal(4))
    NEEDS.clear()
    gx = jax.jit(jax.grad(lambda a: (JRW(a, w) ** 2).sum()))(x)  # w closed over: a constant
    np.testing.assert_allclose(np.asarray(gx), np.asarray(2 * x * w * w), rtol=1e-12)
    gw = jax.grad(lambda b: (JRW(x, b) ** 2).sum())(w)  # x a constant now
    np.testing.assert_allclose(np.asarray(gw), np.asarray((2 * x * w * x).sum(0)), rtol=1e-12)
    both = jax.grad(lambda a, b: (JRW(a, b) ** 2).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(np.asarray(both[0]), np.asarray(gx), rtol=1e-12)
    assert NEEDS == [(True, False), (False, True), (True, True)]
    DOUTS.clear()
    x2, w2 = _args(12)
    g = jax.grad(lambda a: J(a, w2, None)[0].sum())(x2)  # the row sums (second output) are unused
    np.testing.assert_allclose(np.asarray(g), np.asarray(w2))
    assert DOUTS == [(True, False)]


def test_vmap_of_grad_with_a_closed_over_shared_input_folds():
    """vmap(grad wrt x) of an op whose shared w is closed over (a convolution's weights): w is not perturbed, so
    the folded backward is asked for dx only, one forward and one backward call for the whole batch, each example's
    gradient equal to its own grad; under jit, and with w a jitted argument that grad does not differentiate."""
    rng = np.random.default_rng(13)
    xs, w = jnp.asarray(rng.standard_normal((5, 3, 4))), jnp.asarray(rng.standard_normal(4))

    def loss(a, b):
        return (JRW(a, b, scale=0.5) ** 2).sum()

    CALLS.clear()
    NEEDS.clear()
    g = jax.jit(jax.vmap(jax.grad(lambda a: loss(a, w))))(xs)
    assert CALLS == ["forward", "backward"] and NEEDS == [(True, False)]
    for b in range(5):
        np.testing.assert_allclose(np.asarray(g[b]), np.asarray(jax.grad(loss)(xs[b], w)), rtol=1e-12)
    g2 = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None)))(xs, w)  # w traced by jit, not differentiated
    np.testing.assert_allclose(np.asarray(g2), np.asarray(g), rtol=1e-12)
    # the value and the gradient together, and a vmap of a vmap of the gradient
    v, g3 = jax.vmap(jax.value_and_grad(lambda a: loss(a, w)))(xs)
    np.testing.assert_allclose(np.asarray(g3), np.asarray(g), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(v), np.asarray(((xs * w * 0.5) ** 2).sum(axis=(1, 2))), rtol=1e-12)
    g4 = jax.vmap(jax.vmap(jax.grad(lambda a: loss(a, w))))(jnp.stack([xs, 2 * xs]))
    np.testing.assert_allclose(np.asarray(g4[1]), np.asarray(2 * g), rtol=1e-12)


def test_an_array_on_another_platform_is_refused_naming_it():
    class GpuOnly(NumpyRunner):
        platform = "CUDA"

    jg = _ops.JaxOp(OP, GpuOnly(), namespace="cudnnkit_jaxtest_gpu")
    x, w = _args()
    with pytest.raises(TypeError, match=r"mul_scale: x is an array on cpu; cudnnkit's CUDA targets need it on gpu"):
        jg(x, w, None)


def _fwd_idx(x):
    return (x * 2, np.argmax(x, axis=-1).astype(np.int32)), {}


def _meta_idx(x: Spec):
    return (new_like(x), Spec(x.shape[:-1], (1,) if len(x.shape) == 2 else (), "int32")), {}


IDX = Differentiable("double_argmax", "softmax_forward", ("x",), ("out", "index"), _fwd_idx,
                     lambda res, douts, needs: (douts[0] * 2,), _meta_idx,
                     differentiable_outputs=(True, False))  # fmt: skip
JI = _ops.JaxOp(IDX, NumpyRunner(), namespace="cudnnkit_jaxtest")


def test_an_integer_output_takes_a_float0_cotangent():
    """jax.grad through an op with an integer output: its cotangent is float0, which carries no gradient."""
    x = jnp.asarray(np.random.default_rng(5).standard_normal((3, 4)))
    y, idx = JI(x)
    assert idx.dtype == jnp.int32 and np.array_equal(np.asarray(idx), np.argmax(np.asarray(x), -1))
    g = jax.grad(lambda a: JI(a)[0].sum())(x)
    np.testing.assert_allclose(np.asarray(g), 2.0)


def _fwd_cl(x):
    keep = np.ascontiguousarray(np.moveaxis(x * 3, 1, -1))  # a residual laid out channels-last
    keep = np.moveaxis(keep, -1, 1)
    return (x * 3,), {"keep": keep, "x": x}


def _meta_cl(x: Spec):
    n, c, h, w = x.shape
    return (new_like(x),), {"keep": Spec(x.shape, (h * w * c, 1, w * c, c), x.dtype), "x": x}


def _bwd_cl(res, douts, needs):
    k = res["keep"]
    assert k.strides == tuple(s * k.itemsize for s in (k.shape[2] * k.shape[3] * k.shape[1], 1,
                                                         k.shape[3] * k.shape[1], k.shape[1]))  # fmt: skip
    return (douts[0] * k / res["x"],)  # = 3 * dy, through the channels-last residual


CL = Differentiable("chlast", "softmax_forward", ("x",), ("out",), _fwd_cl, _bwd_cl, _meta_cl)
JC = _ops.JaxOp(CL, NumpyRunner(), namespace="cudnnkit_jaxtest")


def test_a_residual_keeps_its_layout_between_forward_and_backward():
    """A channels-last residual is stored in a buffer of its memory order ((N, H, W, C)) and the backward sees it
    with the forward's strides: no transpose either way."""
    x = jnp.asarray(np.random.default_rng(6).uniform(1, 2, (2, 3, 4, 5)))
    g = jax.grad(lambda a: JC(a).sum())(x)
    np.testing.assert_allclose(np.asarray(g), 3.0)


def test_a_forward_that_makes_other_residuals_than_its_meta_is_refused():
    bad = Differentiable("chlast_bad", "softmax_forward", ("x",), ("out",),
                         lambda x: ((x * 3,), {"other": x * 1, "x": x}), _bwd_cl, _meta_cl)  # fmt: skip
    with pytest.raises(Exception, match=r"made residuals \['other'\] where its meta said \['keep'\]"):
        jax.block_until_ready(
            jax.grad(lambda a: _ops.JaxOp(bad, NumpyRunner(), "cudnnkit_jaxtest")(a).sum())(jnp.ones((1, 2, 2, 2)))
        )


def test_inside_lax_scan_and_jax_checkpoint():
    """The op as a scan body and under jax.checkpoint (rematerialized in the backward): values and gradients
    equal to the plain calls'."""
    x, w = _args(7)
    xs = jnp.stack([x, 2 * x, 3 * x])

    def body(c, xi):
        y, s = J(xi, w, None, scale=0.5)
        return c + s.sum(), y

    total, ys = jax.lax.scan(body, 0.0, xs)
    np.testing.assert_allclose(np.asarray(ys), np.asarray(xs * w * 0.5))
    np.testing.assert_allclose(float(total), float((xs * w).sum()))
    plain = jax.grad(lambda a: (J(a, w, None)[0] ** 2).sum())(x)
    remat = jax.grad(lambda a: (jax.checkpoint(lambda b: J(b, w, None)[0])(a) ** 2).sum())(x)
    np.testing.assert_allclose(np.asarray(remat), np.asarray(plain), rtol=1e-12)
    g_scan = jax.grad(lambda a: jax.lax.scan(body, 0.0, jnp.stack([a, a]))[0])(x)
    np.testing.assert_allclose(np.asarray(g_scan), 2 * np.asarray(w), rtol=1e-12)


# ----------------------------------------------------------------- residuals: None ones, tracked ones

LEDGER: set[int] = set()  # the addresses of the "reserves" the stand-in forward made (as the RNN's ledger)


def _fwd_opt(x, m=None):
    token = np.full(4, 7, np.uint8)  # a fresh residual the backward recognises by its address (the RNN's reserve)
    LEDGER.add(token.__array_interface__["data"][0])
    return (x * 2 if m is None else x * 2 + m,), {"x": x, "m": m, "token": token}


def _meta_opt(x: Spec, m: Spec | None = None):
    return (new_like(x),), {"x": x, "m": m, "token": Spec((4,), (1,), "uint8")}


def _bwd_opt(res, douts, needs, *, residuals_copied=False):
    assert list(res) == ["x", "m", "token"], list(res)  # the forward's names and order, an absent input's too
    assert res["token"].tolist() == [7] * 4
    if not residuals_copied and res["token"].__array_interface__["data"][0] not in LEDGER:
        raise ValueError("token has been used already or does not come from the forward")  # the RNN's refusal
    (dy,) = douts
    return (dy * 2 if needs[0] else None, (dy if res["m"] is not None else None) if needs[1] else None)


def _opt(name, **kw):
    d = Differentiable(name, "softmax_forward", ("x", "m"), ("out",), _fwd_opt, _bwd_opt, _meta_opt, **kw)
    return _ops.JaxOp(d, NumpyRunner(), namespace="cudnnkit_jaxtest")


def test_an_absent_optional_inputs_residual_reaches_the_backward_as_none():
    """Divisive normalization without means: its residual ``means`` is None, has no buffer, and the backward still
    finds it under its name (it read ``res["means"]``: a KeyError on the GPU)."""
    op = _opt("opt_tracked", tracked_residuals=("token",))
    x = jnp.asarray(np.random.default_rng(8).standard_normal((3, 4)))
    g = jax.jit(jax.grad(lambda a: op(a, None).sum()))(x)
    np.testing.assert_allclose(np.asarray(g), 2.0)
    gx, gm = jax.grad(lambda a, b: op(a, b).sum(), argnums=(0, 1))(x, x)  # with the optional input present
    np.testing.assert_allclose(np.asarray(gx), 2.0)
    np.testing.assert_allclose(np.asarray(gm), 1.0)


def test_a_tracked_residual_is_a_copy_in_xla_and_the_backward_is_told():
    """XLA keeps residuals in buffers of its own: a residual recognised by its address (the RNN's reserve) reaches
    the backward at another one. A declaration with ``tracked_residuals`` gets ``residuals_copied=True``; one
    without is refused by its own check, as the RNN was on the GPU."""
    x = jnp.asarray(np.random.default_rng(9).standard_normal((3, 4)))
    told = _opt("opt_told", tracked_residuals=("token",))
    np.testing.assert_allclose(np.asarray(jax.grad(lambda a: told(a, None).sum())(x)), 2.0)
    untold = _opt("opt_untold")
    with pytest.raises(Exception, match="token has been used already or does not come from the forward"):
        jax.block_until_ready(jax.grad(lambda a: untold(a, None).sum())(x))


# ----------------------------------------------------------------- what a JAX call refuses at trace time


def test_an_op_with_hidden_random_state_is_refused_without_its_seed():
    """A JAX function must be a function of its arrays (jit merges two equal calls, jax.checkpoint recomputes one):
    dropout without ``seed=`` draws from a state each call advances, and an RNN trained with dropout from its
    descriptor's; both are refused by name at trace time. With a seed, dropout traces."""
    import cudnnkit.jax as cj
    from cudnnkit.ops import RNN

    x = jax.ShapeDtypeStruct((4, 6), jnp.float32)
    with pytest.raises(ValueError, match=r"^dropout: without seed= .*function of its arrays"):
        jax.eval_shape(lambda a: cj.op("dropout")(a, p=0.5), x)
    seed = jax.ShapeDtypeStruct((1,), jnp.int32)
    out = jax.eval_shape(lambda a, s: cj.op("dropout")(a, p=0.5, seed=s), x, seed)
    assert out.shape == (4, 6)
    rnn = RNN("lstm", 3, 4, 2, dropout=0.25, dtype="float32")
    d = cj.op("rnn").d
    assert "dropout" in d.impure({"rnn": rnn, "training": True}, {})
    assert d.impure({"rnn": rnn, "training": False}, {}) is None


def test_keywords_are_constants_a_traced_one_is_refused_by_name():
    """A keyword travels as a constant of the call: a concrete 0-d JAX array is taken as its number, a traced one
    (or a JAX array of any other shape) refused at trace time naming the keyword (it was stored as an object per
    value, and a traced one failed only when XLA ran the call)."""
    import cudnnkit.jax as cj

    x = jax.ShapeDtypeStruct((3, 5), jnp.float32)
    last = jnp.int32(-1)  # made outside the trace: concrete
    assert jax.eval_shape(lambda a: cj.op("softmax")(a, axis=last), x).shape == (3, 5)
    with pytest.raises(TypeError, match=r"^softmax: keyword axis= is a traced value"):
        jax.eval_shape(lambda a, k: cj.op("softmax")(a, axis=k), x, jax.ShapeDtypeStruct((), jnp.int32))
    both = jnp.array([0, 1])
    with pytest.raises(TypeError, match=r"^softmax: keyword axis= is a JAX array of shape \(2,\)"):
        jax.eval_shape(lambda a: cj.op("softmax")(a, axis=both), x)


@pytest.mark.parametrize("kw, match", [
    (dict(axis=5), "axis 5 is out of range"),
    (dict(axis=(0, 2)), "adjacent"),
    (dict(algo="bogus"), "algo must be one of"),
    (dict(dim=1), "dim"),
])  # fmt: skip
def test_softmax_refuses_bad_keywords_at_trace_time(kw, match):
    import cudnnkit.jax as cj

    with pytest.raises((TypeError, ValueError), match=match):
        jax.eval_shape(lambda a: cj.op("softmax")(a, **kw), jax.ShapeDtypeStruct((2, 3, 4), jnp.float32))


def test_activation_refuses_bad_keywords_at_trace_time():
    import cudnnkit.jax as cj

    x = jax.ShapeDtypeStruct((3, 5), jnp.float32)
    for kw, match in (({"mode": "bogus"}, "mode must be one of"), ({"mode": "clipped_relu"}, "needs coef"),
                      ({"mode": "relu", "coef": 2.0}, "coef is for")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            jax.eval_shape(lambda a: cj.op("activation")(a, **kw), x)  # noqa: B023


def test_attention_with_dropout_does_not_fold_a_vmapped_batch():
    """cuDNN draws each position's dropout mask by its place in the batch: a folded ``vmap`` would give example i
    another mask than its own call with the same seed and offset, so it is refused (no dropout: it folds)."""
    from cudnnkit import autograd

    refuses = autograd.get("attention").batch_refuses
    assert "dropout_p > 0" in refuses({"dropout_p": 0.1}, {})
    assert refuses({"dropout_p": 0.0}, {}) is None
