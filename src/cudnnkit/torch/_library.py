"""Each differentiable op as a ``torch.library`` custom op, generated from its declaration.

For a :class:`~cudnnkit.ops._diff.Differentiable` ``d`` named ``n``, :func:`define` makes two ops:

* ``cudnnkit::n(Tensor[] inputs, Tensor[] arrays, str kw) -> Tensor[]``: the forward, a functional op.
  ``inputs`` are the present ``d.inputs`` in order, ``arrays`` the present ``d.arrays`` (which ones: in ``kw``,
  so that autograd sees plain tensor lists), ``kw`` every other keyword, encoded by
  :func:`encode` (a Python literal; a value that is not one, such as a ``DropoutState``, goes by a key into a
  table that keeps it alive). It returns the outputs, the new values of the ``d.mutated`` arrays that are
  present (it updates copies: batch norm's running statistics), then the residuals that are not an input or an
  output (``d.meta``'s order). :class:`TorchOp` copies the new values into the caller's arrays, as torch's own
  functional batch norm is used.
* ``cudnnkit::n_backward(Tensor?[] residuals, Tensor?[] douts, str kw) -> Tensor[]``: one gradient per input
  (an empty tensor where none is needed), from ``d.backward``, under the ``cudnnkit.settings`` the forward ran
  with (autograd runs backward on a thread of its own, where the caller's settings are not in force).

``register_fake`` of both comes from ``d.meta`` (the forward) and the inputs' own metadata (the backward: each
gradient is laid out like its input, C order for an expanded one); the real calls give their results those strides too (a copy where cuDNN
wrote another layout, which the declarations avoid), so tracing and running agree. The forward's autograd kernel
(what ``torch.library.register_autograd`` registers, written out: :class:`_Dispatched`) saves the residuals and
calls the backward op, so eager mode, ``torch.autograd.gradcheck``, ``torch.library.opcheck`` and
``torch.compile(fullgraph=True)`` all see one opaque op each way.

**What is refused, never answered wrong.** The backward is cuDNN's, so autograd has no graph through it: a
gradient taken with ``create_graph=True`` comes back right, and differentiating it again raises naming the op
(:func:`_once_differentiable`; it would otherwise miss the backward's terms). Forward-mode AD
(``torch.autograd.forward_ad``, ``torch.func.jvp``/``linearize``) raises ``NotImplementedError`` (the tangent would
be dropped), and so do ``torch.func`` transforms other than ``functionalize`` (the op's autograd kernel runs
below their levels, where ``grad`` cannot see it; ``vmap`` finds no batching rule first).

Both ops are defined with ``torch.library.Library`` (``define``, ``impl`` under ``CompositeExplicitAutograd``,
``register_fake``, an autograd kernel), not ``torch.library.custom_op``, whose wrappers add a Python frame, an
output-aliasing check and a ``torch._dynamo`` disable context to every call a compiled graph makes (measured on
the CPU with a stand-in declaration: 8 ops forward and backward under ``torch.compile(backend="aot_eager")``,
922 -> 769 µs per step; through the dispatcher in eager mode 1875 -> 1554). As ``custom_op`` does, each op pair
has a library fragment of its own kept for the process (a graph recorded through an op may outlive its
:class:`TorchOp`), its ops are tagged ``pt2_compliant_tag``, and defining a name again replaces the earlier pair.

**The eager fast path.** Going through torch's dispatcher and its Python custom-op layers costs ~100 µs of host
time per call (~300 µs with autograd: measured on the H200 host), several times the cuDNN call itself. So
:meth:`TorchOp.__call__` runs a call that nothing traces -- plain CUDA tensors (no subclass: no fake, functional
or functorch tensors), no ``torch.compile``/``torch.export`` trace, no ``TorchDispatchMode``, no functorch
transform -- by calling the declaration directly: ``d.forward`` when no input needs a gradient, else one
``torch.autograd.Function`` (:class:`_Eager`) whose backward is ``d.backward`` under the forward's settings.
Every other call, and every call while :data:`EAGER` is False, goes through the custom op. Both paths run the
same declaration; the GPU tests run each op both ways against torch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import forward_ad as _fwad
from torch.utils import _python_dispatch

from ..autograd import _kw
from ..autograd._kw import _OBJECTS, decode, encode  # noqa: F401  (encode/decode are public here, as before)
from ..ops import _replay
from ..ops._diff import Differentiable, Spec, new_like
from ..runtime.adapters._torch import _FROM_TORCH, _TO_TORCH
from ..runtime.cache import LRU, MISSING
from ..runtime.settings import Settings, as_items, current_settings, from_items, in_force
from ..runtime.view import same_layout

__all__ = ["TorchOp", "define", "encode", "decode", "spec", "EAGER"]

#: whether untraced calls on plain CUDA tensors skip the dispatcher (the module docstring); False: every call
#: goes through the custom op (to compare the two paths, or to see each call in torch's profiler as one op)
EAGER = True
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_EAGER_CPU = False  # the CPU tests' switch: CPU tensors take the eager path too (their stand-in declarations run)

_META: LRU[tuple, Any] = LRU("torch.meta", 4096)
#: (op, the forward's keyword string, residual names, needs, input specs, settings) -> the backward op's keyword
#: string: every backward of a call site encodes the same one (encoding walks every value: measured on the CPU)
_BWD_KW: LRU[tuple, str] = LRU("torch.backward_kw", 4096)
_kw.SEQUENCES.add(torch.Size)


def spec(t: torch.Tensor) -> Spec:
    """The :class:`Spec` of a tensor (a fake one too)."""
    dt = _FROM_TORCH.get(t.dtype)
    if dt is None:
        raise TypeError(f"cudnnkit has no dtype for {t.dtype}")
    return Spec(tuple(t.shape), tuple(t.stride()), dt)


def _empty(s: Spec, device: Any) -> torch.Tensor:
    return torch.empty_strided(s.shape, s.strides, dtype=_TO_TORCH[s.dtype], device=device)


def _as(t: torch.Tensor, s: Spec) -> torch.Tensor:
    """``t`` with ``s``'s strides (a copy where they differ in a dim of size > 1)."""
    st = t.stride()
    if st == s.strides:  # the usual case: the declaration allocated it so
        return t
    if same_layout(s.shape, st, s.strides):
        return t.as_strided(s.shape, s.strides)
    out = _empty(s, t.device)
    out.copy_(t)
    return out


@dataclass
class TorchOp:
    """The custom ops of one differentiable op (see the module docstring) and :meth:`__call__`, the torch-level
    function: torch tensors in, the outputs out (a tuple when there are several), with autograd."""

    d: Differentiable
    qualname: str
    forward_op: Any
    backward_op: Any

    def __call__(self, *inputs: Any, **kw: Any) -> Any:
        d = self.d
        if len(inputs) != len(d.inputs):
            raise TypeError(f"{d.name} takes {len(d.inputs)} array(s) {d.inputs} positionally, got {len(inputs)}")
        if EAGER and not _tracing() and _plain(inputs) and (not d.arrays or _plain([kw.get(n) for n in d.arrays])):
            if _fwad._current_level >= 0:  # (the custom op's autograd kernel checks the calls that take it)
                _refuse_tangents(d.name, inputs)
            arrays = {n: kw.pop(n, None) for n in d.arrays} if d.arrays else {}
            if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
                outs = _Eager.apply(d, kw, arrays, *inputs)
            else:
                outs = _forward(d, inputs, arrays, kw)[0]
            return outs[0] if len(outs) == 1 else tuple(outs)
        given = {n: kw.get(n) for n in d.arrays}
        got = self.forward_op(*self.args(*inputs, **kw))
        n = len(d.outputs)
        if d.mutated:
            with torch.no_grad():
                for t, new in zip((given[m] for m in d.mutated if given[m] is not None), got[n:]):
                    t.copy_(new)
        return got[0] if n == 1 else tuple(got[:n])

    def args(self, *inputs: Any, **kw: Any) -> tuple[list, list, str]:
        """The forward op's arguments for this call (what :meth:`__call__` passes; ``opcheck`` takes them too)."""
        given = {n: kw.pop(n, None) for n in self.d.arrays}
        kw["__in__"] = tuple(i for i, t in enumerate(inputs) if t is not None)
        kw["__arr__"] = tuple(k for k, t in given.items() if t is not None)
        # the thread's cudnnkit.settings, by value: the custom op's fake, its real call and its backward all run
        # under them (a graph torch.compile traced under some settings runs with them; reading them here, in the
        # traced frame, also makes torch.compile guard on them and trace again under others)
        kw["__settings__"] = current_settings()
        return [t for t in inputs if t is not None], [t for t in given.values() if t is not None], encode(kw)


def _plain(tensors: Any) -> bool:
    """Whether these tensors (None skipped) may take the eager fast path: plain CUDA tensors (no subclass) holding
    their values in memory as they are. A lazily negated view (torch's negative bit) goes through the dispatcher,
    whose fallback materializes it before the custom op sees it. (A zero tensor, which has no memory, is refused by
    name by the torch adapter's view: one check fewer per tensor on this path for a tensor no user makes.)"""
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or not (t.is_cuda or _EAGER_CPU) or t.is_neg()):
            return False
    return True


def _tracing() -> bool:
    """Whether anything traces this call (torch.compile, a dispatch mode such as FakeTensorMode, functorch): then
    the custom op is called, never the declaration directly."""
    return (
        torch.compiler.is_compiling()
        or _python_dispatch._get_current_dispatch_mode() is not None
        or torch._C._are_functorch_transforms_active()
    )


class _Eager(torch.autograd.Function):
    """One eager call of a declaration under autograd: ``apply(d, kw, arrays, *inputs)``, the outputs as a tuple.
    The residuals are saved tensors; the backward is ``d.backward`` under the :class:`Settings` the forward ran
    with (autograd's backward thread has its own), with the cotangents of outputs that carry none left out."""

    @staticmethod
    def forward(ctx: Any, d: Differentiable, kw: dict, arrays: dict, *inputs: Any) -> tuple:  # type: ignore[override]
        outs, res, ctx.rkey = _forward(d, inputs, arrays, kw)
        ctx.d, ctx.kw, ctx.names, ctx.settings = d, kw, tuple(res), current_settings()
        ctx.strides = tuple(None if o is None else o.stride() for o in outs)
        ctx.save_for_backward(*res.values())
        flags = d.differentiable_outputs  # None: every output carries a gradient
        dead = [
            o
            for j, o in enumerate(outs)
            if o is not None and not ((flags is None or flags[j]) and o.is_floating_point())
        ]
        if dead:
            ctx.mark_non_differentiable(*dead)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:  # type: ignore[override]
        d = ctx.d
        flags = d.differentiable_outputs
        douts = grads if flags is None else tuple(g if f else None for g, f in zip(grads, flags))
        douts = tuple(map(_unexpanded, douts, ctx.strides))
        needs = ctx.needs_input_grad[3:]
        saved = ctx.saved_tensors  # read once: a non-reentrant checkpoint frees what it recomputed on the first read
        with in_force(ctx.settings):
            got = _backward(d, ctx.rkey, ctx.names, saved, douts, needs, ctx.kw)
        got = [g if n else None for g, n in zip(got, needs)]
        if torch.is_grad_enabled():  # create_graph=True: a second derivative would be wrong, so it raises
            got = _once_differentiable(d.name, got, (*grads, *saved))
        return (None, None, None, *got)


def _refuse_transforms(qual: str) -> None:
    """``NotImplementedError`` naming op ``qual`` under any ``torch.func`` transform but ``functionalize`` (the op
    is functional): it has no batching rule, no forward-mode formula, and its autograd kernel runs inside the
    dispatcher, below the transform's levels, where ``grad``/``vjp`` cannot see it (its gradient would be lost)."""
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

    T = torch._C._functorch.TransformType
    kinds = [i.key() for i in retrieve_all_functorch_interpreters()]
    if any(k != T.Functionalize for k in kinds):
        names = ", ".join(k.name.lower() for k in kinds)
        raise NotImplementedError(
            f"{qual} does not support torch.func transforms ({names}): differentiate it with torch.autograd "
            "(loss.backward(), torch.autograd.grad)"
        )


def _refuse_tangents(qual: str, tensors: Any) -> None:
    """``NotImplementedError`` naming op ``qual`` when a tensor carries a forward-mode tangent
    (``torch.autograd.forward_ad``, ``torch.func.linearize``): cuDNN's ops have no forward-mode formula, and the
    tangent would be dropped (a zero where the derivative is)."""
    for t in tensors:
        if t is not None and _fwad.unpack_dual(t).tangent is not None:
            raise NotImplementedError(
                f"{qual} has no forward-mode derivative (torch.autograd.forward_ad, torch.func.jvp/linearize): "
                "differentiate it in reverse mode (loss.backward(), torch.autograd.grad)"
            )


def _once_differentiable(name: str, grads: list, inputs: tuple) -> list:
    """The gradients of a backward that ran under grad mode (``create_graph=True``), made to raise when
    differentiated again where any of ``inputs`` (the cotangents and saved tensors) needs a gradient: cuDNN computed
    them, so autograd has no graph through them, and a second derivative would silently miss their terms
    (what ``torch.autograd.function.once_differentiable`` does, with the saved tensors counted too)."""
    links = [t for t in inputs if t is not None and t.requires_grad]
    if not links:
        return grads
    # each output of the error node hangs on every one of its inputs: through ``links`` a second derivative
    # reaches the node (and raises) whichever inputs it is taken for, not only through the gradients themselves
    err = torch._C._functions.DelayedError(
        f"{name}'s backward is not differentiable (cuDNN computes it): no second derivative through it".encode(),
        len(grads) + len(links),
    )
    got = err(*[None if g is None else g.detach() for g in grads], *links)
    return list(got[: len(grads)])


def _unexpanded(g: Any, strides: Any) -> Any:
    """Cotangent ``g``, or a dense copy of it in ``strides`` (its output's) when it is expanded (a stride 0 over more
    than one element: what the backward of ``sum()``/``mean()`` hands on). cuDNN takes no such array, so every L2
    call of the backward would copy it again, each on its full path (measured on the H100: a convolution's
    forward + backward under ``y.sum().backward()`` took 853 us of host time against 278 with a dense ``dy``)."""
    if g is None or 0 not in (st := g.stride()):
        return g
    if all(s or n == 1 for s, n in zip(st, g.shape)):
        return g
    out = torch.empty_strided(g.shape, strides, dtype=g.dtype, device=g.device)
    out.copy_(g)
    return out


def _forward(d: Differentiable, inputs: Any, arrays: dict, kw: dict) -> tuple[tuple, dict, Any]:
    """``d.forward`` of an eager call, replayed from the express hits of an earlier call of the same metadata and
    keywords where the op is ``capture_safe`` (:mod:`cudnnkit.ops._replay`): ``(outputs, residuals, key)``, the key
    what :func:`_backward` keys the backward by (None: not replayable)."""
    return _replayed_forward(d, inputs, arrays, kw, lambda flat: _replay.key_of(d, arrays=flat, kw=kw))


def _backward(d: Differentiable, fkey: Any, names: tuple, saved: tuple, douts: tuple, needs: tuple, kw: dict) -> Any:
    """``d.backward`` of an eager call (its residuals ``saved``, by ``names``), replayed as :func:`_forward`'s
    forward was, keyed by the forward's key, the names, ``needs`` and every residual's and cotangent's metadata (a
    saved-tensor hook may hand a residual back in another layout than the forward made: ``save_on_cpu``)."""
    key = None if fkey is None else _replay.key_of(fkey, names, needs, arrays=(*saved, *douts))
    return _replayed_backward(d, key, names, saved, douts, needs, kw)


def _dispatched_forward(d: Differentiable, inputs: list, arr: dict, kwd: dict, kw: str) -> tuple[tuple, dict]:
    """``d.forward`` inside the custom op (what ``torch.compile``'s graphs and ``EAGER = False`` call), replayed as
    :func:`_forward` replays the eager path's, keyed by the encoded keyword string ``kw`` (the exact keywords)."""
    return _replayed_forward(d, inputs, arr, kwd, lambda flat: _replay.key_of(d, "op", kw, arrays=flat))[:2]


def _dispatched_backward(d: Differentiable, names: Any, residuals: list, douts: list, needs: tuple, kwd: dict,
                         kw: str) -> Any:  # fmt: skip
    """``d.backward`` inside the backward custom op, replayed as :func:`_backward` replays the eager path's, keyed by
    the backward op's keyword string ``kw`` (which holds the residual names, ``needs``, the inputs' specs and the
    settings) and every residual's and cotangent's metadata."""
    key = _replay.key_of(d, "op_backward", kw, arrays=(*residuals, *douts)) if d.capture_safe else None
    return _replayed_backward(d, key, names, residuals, douts, needs, kwd)


def _replayed_forward(d: Differentiable, inputs: Any, arrays: dict, kw: dict, key_of: Any) -> tuple[tuple, dict, Any]:
    """``d.forward(*inputs, **arrays, **kw)`` through :func:`cudnnkit.ops._replay.call`, keyed by ``key_of(flat)``
    (the call's arrays: ``inputs`` then ``d.arrays``' in order) for a ``capture_safe`` op, else run as it is:
    ``(outputs, residuals, key)``."""
    if not d.capture_safe:
        outs, res = d.forward(*inputs, **arrays, **kw)
        return outs, res, None
    names = d.arrays
    flat = [*inputs, *(arrays.get(n) for n in names)]
    key = key_of(flat)
    n_in = len(inputs)

    def run(flat: list) -> tuple[list, Any]:
        outs, res = d.forward(*flat[:n_in], **dict(zip(names, flat[n_in:])), **kw)
        return [*outs, *res.values()], (len(outs), tuple(res))

    got, (n_out, res_names) = _replay.call(key, run, flat)
    return tuple(got[:n_out]), dict(zip(res_names, got[n_out:])), key


def _replayed_backward(d: Differentiable, key: Any, names: Any, saved: Any, douts: Any, needs: tuple, kw: dict) -> Any:
    """``d.backward`` of residuals ``saved`` (by ``names``) and ``douts`` through :func:`cudnnkit.ops._replay.call`
    under ``key`` (None: run as it is)."""
    if key is None:
        return d.backward(dict(zip(names, saved)), tuple(douts), needs, **kw)
    n = len(saved)

    def run(flat: list) -> tuple[list, Any]:
        return list(d.backward(dict(zip(names, flat[:n])), tuple(flat[n:]), needs, **kw)), None

    return _replay.call(key, run, [*saved, *douts])[0]


def _meta_device(inputs: list, arrays: dict) -> int | None:
    """The CUDA device index of the first tensor given (fake ones too), None when it is not a CUDA tensor."""
    for t in (*inputs, *arrays.values()):
        if t is not None:
            dev = t.device
            return (dev.index or 0) if dev.type == "cuda" else None
    return None


def _on_device(dev: int | None) -> Any:
    """A context making CUDA device ``dev`` current (a no-op for None, without CUDA, or when it already is)."""
    if dev is None or not torch.cuda.is_available() or torch.cuda.current_device() == dev:
        return contextlib.nullcontext()
    return torch.cuda.device(dev)


def _layout(d: Differentiable, inputs: list, arrays: dict, kw: dict, kwkey: str) -> tuple[tuple, dict]:
    """``d.meta`` of these tensors (cached by the declaration, their metadata, their device, ``kwkey``, the op's
    encoded keywords, and the thread's settings: batch norm's residuals depend on ``prefer``), asked with the
    tensors' device current: a meta may ask cuDNN a size on the current device (batch norm's fused reserve, the
    RNN's weight space and reserve), which must be the device the call runs on, not whichever the caller has
    current."""
    key: list[Any] = [d, kwkey, current_settings()]
    first = None
    for t in (*inputs, *arrays.values()):  # keyed by each tensor's own metadata: specs are made on a miss only
        if t is None:
            key.append(None)
        else:
            key.append((t.shape, t.stride(), t.dtype))
            if first is None:
                first = t
    if first is not None:
        key.append(first.device)
    try:
        got = _META.lookup(tuple(key))
    except TypeError:  # symbolic sizes (a dynamic-shape trace): asked each time
        got = None
    if got is None or got is MISSING:
        in_specs = [None if t is None else spec(t) for t in inputs]
        a_specs = {k: None if t is None else spec(t) for k, t in arrays.items()}
        with _on_device(_meta_device(inputs, arrays)):
            meta = d.meta(*in_specs, **a_specs, **kw)
        if got is None:
            return meta
        got = _META.put(tuple(key), meta)
    return got


#: the forward op's keyword string -> (where the given inputs go, the given arrays' names, the other keywords):
#: what every call of a call site decodes alike
_FWD_SITES: LRU[str, tuple] = LRU("torch.forward_sites", 4096)
#: the backward op's keyword string -> (residual names, ``needs``, the forward's settings, the other keywords, each
#: gradient's spec): the same per call site
_BWD_SITES: LRU[str, tuple] = LRU("torch.backward_sites", 4096)


def _grad_specs(needs: Any, specs: Any) -> tuple:
    """The spec of each gradient the backward op returns (laid out like its input: :func:`new_like`), None where
    none is needed."""
    return tuple(new_like(Spec(*s)) if n and s is not None else None for n, s in zip(needs, specs))


def _backward_site(kw: str) -> tuple:
    """What the backward op's keyword string ``kw`` says, decoded once per string (a real call's, never a trace's):
    ``(residual names, needs, the forward's Settings, the other keywords, each gradient's spec)``; the keywords
    are shared by every call of ``kw`` (read, never written)."""
    got = _BWD_SITES.lookup(kw)
    if got is MISSING:
        kwd = decode(kw)
        names, needs, specs = kwd.pop("__res__"), tuple(kwd.pop("__needs__")), kwd.pop("__specs__")
        settings = from_items(kwd.pop("__settings__"))
        got = _BWD_SITES.put(kw, (names, needs, settings, kwd, _grad_specs(needs, specs)))
    return got


#: qualified name -> the ``torch.library.Library`` fragment its op pair is defined in, for the process (an autograd
#: or compiled graph recorded through an op may outlive every Python reference to its TorchOp)
_FRAGMENTS: dict[str, torch.library.Library] = {}
#: what ``torch.library.custom_op`` tags its ops with: ``torch.compile`` with ``only_allow_pt2_compliant_ops`` takes them
_TAGS = (torch.Tag.pt2_compliant_tag,)


def _fragment(qual: str) -> torch.library.Library:
    """A new fragment for op pair ``qual``; defining a name again replaces the earlier pair, as ``custom_op`` does."""
    old = _FRAGMENTS.pop(qual, None)
    if old is not None:
        old._destroy()
    lib = _FRAGMENTS[qual] = torch.library.Library(qual.split("::")[0], "FRAGMENT")
    return lib


def _device(*lists: list) -> Any:
    return next(t.device for ts in lists for t in ts if t is not None)


def _new_residuals(d: Differentiable, res_specs: dict) -> list[str]:
    names = set(d.inputs) | set(d.arrays) | set(d.outputs)
    return [k for k in res_specs if k not in names]


def define(d: Differentiable, namespace: str = "cudnnkit") -> TorchOp:
    """The custom ops ``namespace::name`` and ``namespace::name_backward`` of ``d`` (see the module docstring)."""
    qual = f"{namespace}::{d.name}"

    def unpack(inputs: list, arrays: list, kw: str) -> tuple[list, dict, dict, Settings]:
        """The full inputs (None where absent), the arrays by name (every declared one), the keywords (a dict
        shared by every call of ``kw``: read, never written) and the settings the call was made under."""
        site = _FWD_SITES.lookup(kw)
        if site is MISSING:
            kwd = decode(kw)
            got = kwd.pop("__settings__", None)  # absent from a hand-encoded string: the thread's, as before
            site = _FWD_SITES.put(kw, (kwd.pop("__in__"), kwd.pop("__arr__"), kwd, got))
        where, names, kwd, settings = site
        full: list[Any] = [None] * len(d.inputs)
        for i, t in zip(where, inputs):
            full[i] = t
        arr = dict.fromkeys(d.arrays) | dict(zip(names, arrays))
        return full, arr, kwd, current_settings() if settings is None else settings

    def mutated(arr: dict) -> list[str]:
        return [m for m in d.mutated if arr[m] is not None] if d.mutated else []

    def forward(inputs: list, arrays: list, kw: str) -> list[torch.Tensor]:
        inputs, arr, kwd, settings = unpack(inputs, arrays, kw)
        with in_force(settings):
            out_specs, res_specs = _layout(d, inputs, arr, kwd, kw)
            changed = mutated(arr)
            for m in changed:  # a functional op: the caller's arrays are updated by TorchOp, from the copies
                arr[m] = arr[m].clone()
            outs, res = _dispatched_forward(d, inputs, arr, kwd, kw)
        result = [_as(o, s) for o, s in zip(outs, out_specs)] + [arr[m] for m in changed]
        result += [_as(res[k], res_specs[k]) for k in _new_residuals(d, res_specs)]
        return result

    def fake(inputs: list, arrays: list, kw: str) -> list[torch.Tensor]:
        inputs, arr, kwd, settings = unpack(inputs, arrays, kw)
        with in_force(settings):
            out_specs, res_specs = _layout(d, inputs, arr, kwd, kw)
        dev = next(t.device for t in list(inputs) + list(arr.values()) if t is not None)
        got = [_empty(s, dev) for s in out_specs] + [torch.empty_like(arr[m]) for m in mutated(arr)]
        return got + [_empty(res_specs[k], dev) for k in _new_residuals(d, res_specs)]

    lib = _fragment(qual)
    lib.define(f"{d.name}(Tensor[] inputs, Tensor[] arrays, str kw) -> Tensor[]", tags=_TAGS)
    lib.impl(d.name, forward, "CompositeExplicitAutograd")
    torch.library.register_fake(qual, fake, lib=lib)

    def backward_impl(residuals: list, douts: list, kw: str) -> list[torch.Tensor]:
        names, needs, settings, kwd, wants = _backward_site(kw)
        # the forward's cudnnkit.settings: autograd runs the backward on a thread of its own
        with in_force(settings):
            grads = _dispatched_backward(d, names, residuals, douts, needs, kwd, kw)
        dev = _device(residuals, douts)
        out = []
        for g, want in zip(grads, wants):
            if want is None:
                out.append(torch.empty(0, device=dev))
            else:  # laid out like its input (C order for an expanded one); a zero gradient where none came
                out.append(_empty(want, dev).zero_() if g is None else _as(g, want))
        return out

    def backward_fake(residuals: list, douts: list, kw: str) -> list[torch.Tensor]:
        kwd = decode(kw)
        needs, specs = kwd["__needs__"], kwd["__specs__"]
        dev = _device(residuals, douts)
        return [torch.empty(0, device=dev) if w is None else _empty(w, dev) for w in _grad_specs(needs, specs)]

    lib.define(f"{d.name}_backward(Tensor?[] residuals, Tensor?[] douts, str kw) -> Tensor[]", tags=_TAGS)
    lib.impl(f"{d.name}_backward", backward_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{qual}_backward", backward_fake, lib=lib)
    bwd = getattr(getattr(torch.ops, namespace), f"{d.name}_backward").default

    def setup_context(ctx: Any, inputs: tuple, output: list) -> None:
        given, arrays, kw = inputs
        ins, arr, kwd, settings = unpack(given, arrays, kw)
        with in_force(settings):
            _, res_specs = _layout(d, ins, arr, kwd, kw)
        n = len(d.outputs)
        changed = mutated(arr)
        new = iter(output[n + len(changed) :])
        # a mutated array is saved as the op's new value (the caller's tensor is written after the op)
        updated = dict(zip(changed, output[n : n + len(changed)]))
        by_name = dict(zip(d.inputs, ins)) | arr | updated | dict(zip(d.outputs, output[:n]))
        ctx.save_for_backward(*(by_name[k] if k in by_name else next(new) for k in res_specs))
        ctx.names = tuple(res_specs)
        ctx.kw, ctx.kwstr = kwd, kw
        ctx.settings = as_items(settings)
        ctx.specs = tuple(None if t is None else tuple(spec(t)) for t in ins)
        ctx.needs = tuple(t is not None and t.requires_grad for t in ins)
        ctx.n_given, ctx.n_arrays = len(given), len(arrays)

    def backward(ctx: Any, grads: list, saved: tuple) -> tuple:
        douts = [g if d.carries_gradient(i) else None for i, g in enumerate(list(grads)[: len(d.outputs)])]
        key = (d.name, ctx.kwstr, ctx.names, ctx.needs, ctx.specs, ctx.settings)
        try:
            kw = _BWD_KW.lookup(key)
        except TypeError:  # symbolic sizes in the specs (a dynamic-shape trace): encoded each time
            kw = MISSING
            key = None
        if kw is MISSING:
            kw = encode(dict(ctx.kw, __res__=ctx.names, __needs__=ctx.needs, __specs__=ctx.specs,
                             __settings__=ctx.settings))  # fmt: skip
            if key is not None:
                _BWD_KW.put(key, kw)
        got = bwd(list(saved), douts, kw)
        grads = [g for g, t in zip(got, ctx.specs) if t is not None]  # the given inputs' (a plain list)
        needs = [n for n, t in zip(ctx.needs, ctx.specs) if t is not None]
        return [g if need else None for g, need in zip(grads, needs)], [None] * ctx.n_arrays, None

    fwd = getattr(getattr(torch.ops, namespace), d.name).default
    pair = _Pair(fwd._handle.redispatch_boxed, setup_context, backward, qual)
    # one class per op: its backward node is named for the op (``cudnnkit_convolutionBackward`` in anomaly traces,
    # profiles and graph dumps) and compiled autograd keys it apart from the other ops'
    function = type(
        f"{namespace}_{d.name}", (_Dispatched,), {"__module__": __name__, "__qualname__": f"{namespace}_{d.name}"}
    )

    def autograd_kernel(keyset: Any, given: list, arrays: list, kw: str) -> Any:
        if torch._C._are_functorch_transforms_active():
            _refuse_transforms(qual)
        if _fwad._current_level >= 0:
            _refuse_tangents(qual, given)
        if torch.is_grad_enabled() and _any_requires_grad(given, arrays):
            return list(function.apply(pair, keyset, len(given), kw, *given, *arrays))
        with _BELOW_AUTOGRAD():
            return pair.redispatch(keyset & _AFTER_AUTOGRAD, given, arrays, kw)

    # what ``torch.library.register_autograd`` registers, without its generated wrappers (see _Dispatched)
    lib.impl(d.name, autograd_kernel, "Autograd", with_keyset=True)
    return TorchOp(d, qual, fwd, bwd)


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
_any_requires_grad = torch._C._any_requires_grad


@dataclass(frozen=True)
class _Pair:
    """What :class:`_Dispatched` needs of one op pair: the forward op's ``redispatch_boxed``, its
    ``setup_context(ctx, (given, arrays, kw), outputs)`` and ``backward(ctx, grads, saved tensors) -> (given's
    gradients, arrays' (None each), None)``."""

    redispatch: Any
    setup_context: Any
    backward: Any
    qual: str


class _Dispatched(torch.autograd.Function):
    """The custom op's autograd kernel (``Autograd``, with its dispatch keys), where the op's tensors need a gradient
    (each op has a subclass of its own, named ``<namespace>_<name>``):
    ``apply(pair, keyset, n_given, kw, *given, *arrays)`` redispatches below autograd to the op's implementation
    and saves what the backward op needs. It is what ``torch.library.register_autograd`` makes of a ``backward``
    and ``setup_context``, flattened by hand: that one flattens the op's tensor lists through ``torch.utils._pytree``
    and wraps each call in a dataclass and two more Python frames (on the CPU, with a stand-in declaration: 139
    -> 79 µs per forward and backward through the dispatcher, and the op's call without autograd, which a compiled
    graph makes, 17.7 -> 13.8 µs: ``python -m benchmarks.host_cpu`` before and after)."""

    @staticmethod
    def forward(ctx: Any, pair: _Pair, keyset: Any, n: int, kw: str, *tensors: Any) -> tuple:  # type: ignore[override]
        given, arrays = list(tensors[:n]), list(tensors[n:])
        with _BELOW_AUTOGRAD():
            out = pair.redispatch(keyset & _AFTER_AUTOGRAD, given, arrays, kw)
        pair.setup_context(ctx, (given, arrays, kw), out)
        ctx.pair = pair
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:  # type: ignore[override]
        saved = ctx.saved_tensors  # read once: a non-reentrant checkpoint frees what it recomputed on the first read
        g_given, g_arrays, _ = ctx.pair.backward(ctx, grads, saved)
        if torch.is_grad_enabled():  # create_graph=True: a second derivative would be wrong, so it raises
            g_given = _once_differentiable(ctx.pair.qual, g_given, (*grads, *saved))
        return (None, None, None, None, *g_given, *g_arrays)
