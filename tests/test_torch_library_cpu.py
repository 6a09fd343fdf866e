"""The torch custom-op machinery (cudnnkit.torch._library) on the CPU, with pure-torch declarations standing in
for cuDNN's: the schema, the fake (from ``meta``), the autograd (from ``backward``), opcheck, gradcheck and
torch.compile(fullgraph=True). The cuDNN-backed ops run the same machinery on the GPU (tests/gpu/test_torch_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cudnnkit  # noqa: E402
from cudnnkit.ops._diff import Differentiable, Spec, new_like  # noqa: E402
from cudnnkit.runtime import current_settings  # noqa: E402
from cudnnkit.torch import _library as L  # noqa: E402


def _fwd(x, w, *, scale=1.0, bias=None, stat=None):
    prod = x * w  # a new residual (not an input or an output)
    y = prod * scale + (0 if bias is None else bias)
    if stat is not None:
        stat.add_(y.detach().sum())  # a mutated array
    return (y, prod.sum(dim=-1)), {"x": x, "w": w, "prod": prod}


def _bwd(res, douts, needs, *, scale=1.0):
    dy, ds = douts
    g = (0 if dy is None else dy * scale) + (0 if ds is None else ds[..., None])
    return (g * res["w"] if needs[0] else None, g * res["x"] if needs[1] else None)


def _meta(x: Spec, w: Spec, *, scale=1.0, bias=None, stat=None):
    prod = new_like(x)
    return (new_like(x), new_like(x, shape=x.shape[:-1])), {"x": x, "w": w, "prod": prod}


OP = Differentiable("mul_scale", "softmax_forward", ("x", "w"), ("out", "sum"), _fwd,
                    lambda res, douts, needs, **kw: _bwd(res, douts, needs, scale=kw.get("scale", 1.0)), _meta,
                    arrays=("bias", "stat"), mutated=("stat",))  # fmt: skip
T = L.define(OP, namespace="cudnnkit_test")


@pytest.fixture(autouse=True, params=["dispatcher", "eager"])
def path(request, monkeypatch):
    """Each test both ways: every call through the custom op, and untraced calls on the eager fast path (which on
    the GPU takes CUDA tensors only: ``_EAGER_CPU`` lets these CPU stand-ins take it)."""
    if request.param == "eager":
        monkeypatch.setattr(L, "_EAGER_CPU", True)
    else:
        monkeypatch.setattr(L, "EAGER", False)
    return request.param


def test_the_path_taken(path, monkeypatch):
    """An untraced call skips the dispatcher only on the eager path (the custom op is not called)."""
    called = []
    real = T.forward_op
    monkeypatch.setattr(T, "forward_op", lambda *a: called.append(1) or real(*a))
    x, w = _args()
    y, _ = T(x, w)
    with torch.no_grad():
        T(x, w)
    assert called == ([] if path == "eager" else [1, 1])
    assert (y.grad_fn is not None) and (type(y.grad_fn).__name__.startswith("_Eager") == (path == "eager"))


def _args(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, dtype=dtype, generator=g, requires_grad=True)
    w = torch.randn(3, 4, dtype=dtype, generator=g, requires_grad=True)
    return x, w


def test_the_op_matches_its_definition_forward_and_backward():
    x, w = _args()
    bias = torch.randn(3, 4, dtype=torch.float64)
    y, s = T(x, w, scale=0.5, bias=bias)
    assert torch.allclose(y, x * w * 0.5 + bias) and torch.allclose(s, (x * w).sum(-1))
    (y.sum() + 2 * s.sum()).backward()
    assert torch.allclose(x.grad, (0.5 + 2) * w) and torch.allclose(w.grad, (0.5 + 2) * x)


def test_gradcheck_in_float64():
    x, w = _args()
    assert torch.autograd.gradcheck(lambda a, b: T(a, b, scale=0.25), (x, w))


def test_opcheck_passes():
    x, w = _args(torch.float32)
    stat = torch.zeros(())
    torch.library.opcheck(T.forward_op, T.args(x, w, scale=2.0, stat=stat))
    torch.library.opcheck(T.forward_op, T.args(x, w, bias=torch.randn(3, 4)))


def test_the_mutated_array_is_written_in_place():
    x, w = _args()
    stat = torch.zeros((), dtype=torch.float64)
    y, _ = T(x, w, stat=stat)
    assert torch.allclose(stat, y.detach().sum())


def test_compile_fullgraph_has_no_graph_break():
    x, w = _args(torch.float32)

    def f(a, b):
        y, s = T(a, b, scale=3.0)
        return torch.relu(y).sum() + s.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = compiled(x, w)
    got.backward()
    gx = x.grad.clone()
    x.grad = None
    want = f(x, w)
    want.backward()
    assert torch.allclose(got, want) and torch.allclose(gx, x.grad)


def test_keywords_round_trip_and_objects_go_by_key():
    obj = object()
    s = L.encode({"b": (1, 2.5, None), "a": "x", "o": obj, "l": [1, 2]})
    got = L.decode(s)
    assert got == {"a": "x", "b": (1, 2.5, None), "l": (1, 2), "o": obj} and got["o"] is obj


def test_a_gradient_comes_back_in_its_inputs_layout():
    cl = torch.randn(2, 3, 4, 5, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    assert L._as(cl, Spec((2, 3, 4, 5), (60, 20, 5, 1), "float64")).stride() == (60, 20, 5, 1)
    t = torch.randn(2, 1, 4, dtype=torch.float64)
    assert L._as(t, Spec((2, 1, 4), (4, 1, 1), "float64")).data_ptr() == t.data_ptr()  # size-1 dims: no copy


def test_non_finite_and_numpy_numbers_round_trip():
    import math

    import numpy as np

    got = L.decode(L.encode({"fill": float("nan"), "clip": (-math.inf, 1.0), "eps": np.float64(0.5), "n": np.int64(3)}))
    assert math.isnan(got["fill"]) and got["clip"] == (-math.inf, 1.0) and got["eps"] == 0.5 and got["n"] == 3
    assert type(got["eps"]) is float and type(got["n"]) is int
    before = len(L._OBJECTS)
    for _ in range(3):
        L.encode({"v": [np.int64(1)], "f": np.float32(2.0)})
    assert len(L._OBJECTS) == before  # numbers are literals, not objects kept by key


def test_the_gradient_of_an_expanded_input_comes_back_dense():
    x = torch.randn(1, 4, dtype=torch.float64).expand(3, 4).requires_grad_()  # stride 0: an overlapping layout
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y, _ = T(x, w, scale=2.0)
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(gx, 2.0 * w.detach())


def test_an_expanded_cotangent_reaches_the_eager_backward_dense_in_its_outputs_layout(path):
    """``y.sum().backward()`` hands on a cotangent of strides 0, which cuDNN cannot take (every L2 call of the
    backward would copy it again): the eager path makes it one dense copy laid out like the output, first. A dense
    cotangent goes as it is (the same tensor)."""
    seen = []

    def fwd(x):
        return (x.clone(memory_format=torch.channels_last),), {}

    def bwd(res, douts, needs):
        seen.append(douts[0])
        return (douts[0].clone(),)

    op = Differentiable("copy_dout", "softmax_forward", ("x",), ("out",), fwd, bwd,
                        lambda x: ((new_like(x),), {}))  # fmt: skip
    t = L.define(op, namespace="cudnnkit_test_dout")
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64).requires_grad_()
    y = t(x)
    (gx,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(gx, torch.ones_like(x))
    if path == "eager":
        assert seen[-1].stride() == y.stride() and 0 not in seen[-1].stride()
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    torch.autograd.grad(t(x), x, g)
    assert torch.equal(seen[-1], g) and (path != "eager" or seen[-1] is g)


def test_the_backward_runs_under_its_forwards_settings_each_time(path):
    """The backward (autograd's thread) runs under the settings its forward ran with, call after call: the
    dispatcher path's backward keyword string is cached per call site, the settings part of that key, so two
    forwards of one call site under different settings each get their own."""
    import cudnnkit
    from cudnnkit.runtime.settings import current_settings

    seen = []

    def bwd(res, douts, needs, **kw):
        seen.append(current_settings().deterministic)
        return (douts[0] * res["w"] if needs[0] else None, douts[0] * res["x"] if needs[1] else None)

    op = Differentiable("mul_settings", "softmax_forward", ("x", "w"), ("out",),
                        lambda x, w: ((x * w,), {"x": x, "w": w}), bwd,
                        lambda x, w: ((new_like(x),), {"x": x, "w": w}))  # fmt: skip
    t = L.define(op, namespace="cudnnkit_test_settings")
    x, w = _args()
    for det in (True, False, True, False):
        with cudnnkit.settings(deterministic=det):
            y = t(x, w)
        y.sum().backward()
    assert seen == [True, False, True, False]


def _mul_op(name):
    def fwd(x, w):
        return (x * w,), {"x": x, "w": w}

    def bwd(res, douts, needs):
        (dy,) = douts
        return (dy * res["w"] if needs[0] else None, dy * res["x"] if needs[1] else None)

    return Differentiable(name, "softmax_forward", ("x", "w"), ("out",), fwd, bwd,
                          lambda x, w: ((new_like(x),), {"x": x, "w": w}))  # fmt: skip


def test_an_op_outlives_its_torchop_and_a_name_may_be_defined_again(path):
    """As torch.library.custom_op's ops: a graph recorded through an op runs its backward after the TorchOp is
    dropped (its library fragment is kept for the process; it was torn down, and the backward crashed the
    interpreter), and defining the name again replaces the earlier pair (it raised)."""
    import gc

    t = L.define(_mul_op("mul_kept"), namespace="cudnnkit_test_kept")
    x, w = _args()
    y = t(x, w)
    del t
    gc.collect()
    y.sum().backward()
    assert torch.allclose(x.grad, w)
    a = L.define(_mul_op("mul_again"), namespace="cudnnkit_test_kept")
    b = L.define(_mul_op("mul_again"), namespace="cudnnkit_test_kept")
    x, w = _args()
    assert a is not b and torch.allclose(b(x, w), x * w)


def test_ops_are_pt2_compliant():
    """Tagged ``pt2_compliant_tag`` as custom_op tags its ops: torch.compile with only_allow_pt2_compliant_ops
    takes them (it refused them untagged)."""
    x, w = _args()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(only_allow_pt2_compliant_ops=True):
        got, _ = torch.compile(lambda a, b: T(a, b), backend="eager", fullgraph=True)(x, w)
    assert torch.allclose(got, x * w * 1.0)
    assert torch.Tag.pt2_compliant_tag in T.forward_op.tags and torch.Tag.pt2_compliant_tag in T.backward_op.tags


def test_the_eager_backward_is_keyed_by_its_residuals_layout(path, monkeypatch):
    """A saved-tensor hook may hand a residual back in another layout than the forward made (``save_on_cpu``
    unpacks into a C-order tensor): the replayed backward's key holds every residual's metadata, so a backward
    recorded with channels-last residuals is never replayed over C-order ones (the custom-op path keys them too)."""
    from cudnnkit.ops import _replay
    from cudnnkit.runtime import adapters

    def key(t):
        return (str(t.dtype), tuple(t.shape), t.stride(), str(t.device)), t.data_ptr(), None

    monkeypatch.setitem(adapters.KEYED, torch.Tensor, key)
    op = Differentiable("mul_layout", "softmax_forward", ("x", "w"), ("out",),
                        lambda x, w: ((x * w,), {"x": x, "w": w}),
                        lambda res, douts, needs: (douts[0] * res["w"], douts[0] * res["x"]),
                        lambda x, w: ((new_like(x),), {"x": x, "w": w}), capture_safe=True)  # fmt: skip
    t = L.define(op, namespace="cudnnkit_test_layout")
    keys = []
    real = _replay.call
    monkeypatch.setattr(_replay, "call", lambda k, fn, flat: keys.append(k) or real(k, fn, flat))

    def backward_key(hooked):
        x, w = (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last).requires_grad_() for _ in range(2))
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(lambda a: a, lambda a: a.contiguous()):
                y = t(x, w)
        else:
            y = t(x, w)
        keys.clear()
        y.backward(torch.ones_like(y))
        return keys[-1]

    plain, hooked = backward_key(False), backward_key(True)
    assert plain is not None and hooked is not None and plain != hooked
    assert plain == backward_key(False)  # the same layouts: the same key, so a trace replays


def test_the_autograd_kernel_records_only_under_grad_and_refuses_torch_func(path):
    """The custom op's own autograd kernel: no graph without grad mode (the result matches), a graph with it, and
    ``torch.func.grad`` refused by name (not torch's message about ``setup_context``)."""
    x, w = _args()
    with torch.no_grad():
        y, _ = T(x, w, scale=2.0)
    assert y.grad_fn is None and not y.requires_grad and torch.allclose(y, x.detach() * w.detach() * 2.0)
    y, _ = T(x, w, scale=2.0)
    assert y.grad_fn is not None
    if path == "dispatcher":
        assert type(y.grad_fn).__name__ == "cudnnkit_test_mul_scaleBackward"  # the op's own node
    with pytest.raises(NotImplementedError, match="cudnnkit_test::mul_scale does not support torch.func"):
        torch.func.grad(lambda a: T(a, w.detach())[0].sum())(x.detach())


def test_a_second_derivative_through_the_backward_raises_not_a_silent_wrong_value(path):
    """``create_graph=True``: the first derivative comes back right, and differentiating it again raises naming
    the op. The backward is cuDNN's (here a stand-in run under no_grad, as cuDNN writes through pointers), so a
    second derivative would silently miss its terms."""
    opaque = Differentiable("mul_scale_opaque", "softmax_forward", ("x", "w"), ("out", "sum"), _fwd,
                            lambda res, douts, needs, **kw: _no_graph(_bwd, res, douts, needs, **kw), _meta,
                            arrays=("bias", "stat"), mutated=("stat",))  # fmt: skip
    t = L.define(opaque, namespace="cudnnkit_test")
    x, w = _args()
    y, s = t(x, w, scale=0.5)
    (gx,) = torch.autograd.grad((y * y).sum() + s.sum(), (x,), create_graph=True)
    want = (2 * (x * w * 0.5) * 0.5 + 1) * w
    assert torch.allclose(gx, want.detach())
    for second in (gx.sum(), gx.sum() + x.sum()):  # also where x reaches the loss another way too
        with pytest.raises(RuntimeError, match="mul_scale_opaque's backward is not differentiable"):
            torch.autograd.grad(second, (x,), retain_graph=True)
    wc = w.detach()  # an input that needs no gradient: its gradient stays None, x's still refuses
    (gx,) = torch.autograd.grad(t(x, wc)[0].square().sum(), (x,), create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        gx.sum().backward()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_first_derivative_under_create_graph_through_a_checkpoint(path, reentrant):
    """Activation checkpointing (a non-reentrant one frees each recomputed tensor on its first read: the backward
    reads its saved tensors once) with ``create_graph=True``: the first derivative is right."""
    import torch.utils.checkpoint as ckpt

    x, w = _args()
    y = ckpt.checkpoint(lambda a, b: T(a, b, scale=0.5)[0], x, w, use_reentrant=reentrant)
    loss = (y * y).sum()
    if reentrant:  # torch's own rule: a reentrant checkpoint takes .backward(), not autograd.grad
        loss.backward(create_graph=True)
        gx = x.grad
    else:
        (gx,) = torch.autograd.grad(loss, (x,), create_graph=True)
    assert torch.allclose(gx.detach(), (2 * (x * w * 0.5) * 0.5 * w).detach())


def _no_graph(fn, *a, **kw):
    with torch.no_grad():
        return fn(*a, **kw)


@pytest.mark.parametrize("how", ["forward_ad", "jvp", "linearize"])
def test_forward_mode_ad_is_refused_not_dropped(path, how):
    """A forward-mode tangent would be dropped (cuDNN's ops have none): refused by name, never a zero."""
    import torch.autograd.forward_ad as fwAD

    x, w = _args()
    xd, wd = x.detach(), w.detach()
    f = lambda a: T(a, wd)[0]  # noqa: E731
    with pytest.raises(NotImplementedError, match="mul_scale (has no forward-mode|does not support torch.func)"):
        if how == "forward_ad":
            with fwAD.dual_level():
                f(fwAD.make_dual(xd, torch.ones_like(xd)))
        elif how == "jvp":
            torch.func.jvp(f, (xd,), (torch.ones_like(xd),))
        else:
            torch.func.linearize(f, xd)[1](torch.ones_like(xd))


def test_the_layout_cache_holds_the_declaration_and_the_settings(path):
    """``_layout`` (the custom op's residual layout, cached per call site) is keyed by the declaration object and
    the thread's settings: batch norm's residuals depend on ``settings(prefer=...)`` (its ReLU mask, its fused
    reserve), and two declarations of one name are two ops. Keyed by the name alone, a layout cached under
    ``prefer="auto"`` named a residual the forward under ``prefer="legacy"`` did not make (a ``KeyError``)."""
    import cudnnkit
    from cudnnkit.runtime.settings import current_settings

    def meta(x):
        extra = {} if current_settings().prefer == "legacy" else {"mask": new_like(x)}
        return (new_like(x),), {"x": x, **extra}

    def fwd(x):
        return (x * 2,), {"x": x, **({} if current_settings().prefer == "legacy" else {"mask": x > 0})}

    d = Differentiable("layout_keyed", "softmax_forward", ("x",), ("out",), fwd,
                       lambda res, douts, needs: (douts[0] * 2,), meta)  # fmt: skip
    x = torch.randn(3, 4, dtype=torch.float64)
    assert list(L._layout(d, [x], {}, {}, "k")[1]) == ["x", "mask"]
    with cudnnkit.settings(prefer="legacy"):
        assert list(L._layout(d, [x], {}, {}, "k")[1]) == ["x"]
    assert list(L._layout(d, [x], {}, {}, "k")[1]) == ["x", "mask"]
    other = Differentiable("layout_keyed", "softmax_forward", ("x",), ("out",), fwd,
                           lambda res, douts, needs: (douts[0] * 2,), lambda x: ((new_like(x),), {"x": x}))  # fmt: skip
    assert list(L._layout(other, [x], {}, {}, "k")[1]) == ["x"]  # its own meta, not the first one's

    t = L.define(d, namespace="cudnnkit_test_layout_keyed")
    xg = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    for prefer in ("auto", "legacy", "auto"):
        with cudnnkit.settings(prefer=prefer):
            y = t(xg)
            (g,) = torch.autograd.grad(y.sum(), xg)
        assert torch.equal(y, xg * 2) and torch.equal(g, torch.full_like(xg, 2.0))


def test_a_lazily_negated_tensor_takes_the_dispatcher_which_materializes_it(path, monkeypatch):
    """A view with torch's negative bit (``conj().imag``) holds its values un-negated in memory: the eager path
    (which hands data pointers to cuDNN) leaves it to the dispatcher, whose fallback materializes it before the op
    sees it (a zero tensor is refused by name by the adapter: tests/test_adapters_cpu.py)."""
    called = []
    real = T.forward_op
    monkeypatch.setattr(T, "forward_op", lambda *a: called.append(1) or real(*a))
    z = torch.randn(3, 4, dtype=torch.complex128)
    x = z.conj().imag
    assert x.is_neg()
    _, w = _args()
    y, _ = T(x, w)
    assert called == [1]
    assert torch.equal(y, -z.imag * w)


def _sfwd(x, *, scale=1.0):
    res = {"x": x}
    if current_settings().prefer == "legacy":  # a residual one path keeps (batch norm's depend on prefer)
        res["twice"] = x * 2
    return (x * scale,), res


def _sbwd(res, douts, needs, *, scale=1.0):
    if "twice" in res:
        assert torch.equal(res["twice"], res["x"] * 2)
    return (douts[0] * scale,)


def _smeta(x: Spec, *, scale=1.0):
    res = {"x": x}
    if current_settings().prefer == "legacy":
        res["twice"] = new_like(x)
    return (new_like(x),), res


SOP = Differentiable("settings_dependent", "softmax_forward", ("x",), ("out",), _sfwd, _sbwd, _smeta)
S = L.define(SOP, namespace="cudnnkit_test")


def test_the_custom_op_runs_under_the_settings_its_call_was_made_under():
    """The keyword string carries the caller's settings: the real call and the fake agree on the residuals when
    the op runs under other settings (a compiled graph called under another ``prefer``)."""
    x = torch.randn(3, 4, dtype=torch.float64)
    made = S.args(x, scale=2.0)  # under the defaults: one output, no extra residual
    with cudnnkit.settings(prefer="legacy"):
        got = S.forward_op(*made)
        assert len(got) == 1 and torch.equal(got[0], x * 2)
        again = S.forward_op(*S.args(x, scale=2.0))  # made under legacy: the extra residual comes back
        assert len(again) == 2 and torch.equal(again[1], x * 2)


def test_compile_traces_again_under_other_settings():
    from torch._dynamo.testing import CompileCounter

    cnt = CompileCounter()
    f = torch.compile(lambda a: S(a, scale=3.0) * 1, backend=cnt, fullgraph=True)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    f(x).sum().backward()
    assert cnt.frame_count == 1
    x.grad = None
    with cudnnkit.settings(prefer="legacy"):
        y = f(x)
        y.sum().backward()  # the backward sees the legacy path's residuals (_sbwd checks them)
    assert cnt.frame_count == 2 and torch.equal(x.grad, torch.full_like(x, 3.0))
    f(x)
    assert cnt.frame_count == 2  # the first trace again
