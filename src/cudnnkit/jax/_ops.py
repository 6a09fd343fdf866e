"""Each differentiable op as a JAX function: two XLA FFI targets per declaration, ``jax.ffi.ffi_call`` to reach
them, ``jax.custom_vjp`` for the gradient. Generated from the declarations; no op is registered by hand.

For a :class:`~cudnnkit.ops._diff.Differentiable` ``d`` named ``n``, :class:`JaxOp` registers (on first use):

* ``cudnnkit_n`` (the forward): the present ``d.inputs``, then the present ``d.arrays``, as buffers; one string
  attribute ``kw`` (:func:`cudnnkit.autograd._kw.encode` of every other keyword, with which inputs and arrays
  are present). Its results are the outputs, the new values of the present ``d.mutated`` arrays (batch norm's
  running statistics: JAX has no in-place update, so the op returns them) and the residuals that are not an
  input or an output, with the shapes and dtypes ``d.meta`` gives at trace time.
* ``cudnnkit_n_backward``: the present residuals, then the cotangents of the outputs that carry one; ``kw`` adds
  the residual names (those the forward gave as None too: ``d.backward`` gets the forward's residual dict, an
  absent optional input's entry None), which cotangents are present and which inputs need a gradient. Its
  results are those gradients, each shaped like its input. A declaration with ``tracked_residuals`` is told
  (``residuals_copied=True``) that its residuals are XLA's copies, not the forward's arrays (the RNN's reserve).

The ``custom_vjp`` rule is defined with ``symbolic_zeros=True``: the forward rule learns which inputs the
differentiation perturbs (``CustomVJPPrimal.perturbed``), and the backward target is asked only for the gradients of
perturbed floating inputs (``__needs__``): ``jax.grad`` with respect to ``x`` of a convolution whose ``w`` is a
closed-over constant (or an argument ``grad`` does not take) runs no weight-gradient call. An output nothing
downstream depends on reaches the backward as a symbolic zero: no cotangent, as for an unused output.

:meth:`JaxOp.__call__` is the JAX-level function: ``op(*inputs, **kw)`` returns the outputs (one array, or a
tuple), then the new values of the mutated arrays when any were given, under ``jit``, ``grad`` and
``value_and_grad``. ``d.meta`` runs at trace time, in Python, so a bad argument raises its clear exception there,
before XLA compiles anything; a failure inside the handler comes back as XLA's error carrying the exception's type
and message (:mod:`cudnnkit.jax._ffi`).

``jax.vmap``: a declaration with ``batch`` names (the arrays it splits by sample: softmax's, pooling's,
convolution's ``x``, attention's ``q``/``k``/``v``, ...) folds the mapped axis into their leading axis, so one FFI
call serves the whole batch, forward and backward (:class:`_Fold`, a ``jax.custom_batching.custom_vmap`` around
each FFI call; nested vmaps fold again). ``vmap(grad)`` with respect to the mapped arrays folds too, shared inputs
closed over or not differentiated (a convolution's ``w``: only ``dx`` is asked for, per the symbolic zeros above).
Mapping over anything else (a convolution's ``w``), a per-sample gradient of a shared floating input that ``grad``
is taken with respect to (a per-example ``dw``), a call whose keywords mix the samples (softmax over axis 0) and
ops without ``batch`` raise ``NotImplementedError`` naming the op and the argument, at trace time.

``cudnnkit.settings`` in force when a function is traced travel with the call (the handlers run on XLA's
threads); a ``jax.jit`` function already compiled keeps the settings it was traced with (retrace to change them).
A residual that is neither an input nor an output is kept in its own layout (the XLA buffer holds its dims in
memory order), so the backward reads it with the strides the forward wrote (pooling's channels-last index).

How a handler turns buffers into arrays and writes its results is a :class:`Runner`: on CUDA the buffers are
device views and the declaration's L2 calls run on XLA's stream; the CPU tests run pure-NumPy stand-in
declarations through a NumPy runner on JAX's CPU platform, so that this machinery is checked without a GPU.

**XLA's command buffers (CUDA graphs).** A target is registered with the FFI's command-buffer trait (XLA may then
capture the call into a CUDA graph and replay it without calling the handler) only when both the declaration and the
runner are capture-safe: ``d.capture_safe`` (its warm calls queue device work only: no host synchronization, no host
read of device data, no upload from host memory, no host-side state a replay would skip) and
``runner.capture_safe``. The declarations that are not, and why: ``op_tensor`` and ``reduce_tensor`` (some
backwards divide on the host: ``host_values``/``from_host`` synchronize), ``ctc_loss`` (device labels and lengths
are read on the host, then uploaded), ``rnn`` (its sequence lengths are uploaded from host memory on first sight,
its reserve ledger and its dropout states are host-side state) and ``dropout`` (its ``DropoutState``: RNG states
made on first use, a position a replay would repeat). The CUDA runner is capture-safe only on request
(:func:`cudnnkit.jax.enable_command_buffers`): a captured call allocates from memory kept for its replays instead of
the stream-ordered pool (stream-ordered allocations would be graph memory nodes, which XLA cannot nest as it nests a
traced custom call: measured before, "Failed to create a child graph node and add it to a CUDA graph:
CUDA_ERROR_NOT_SUPPORTED"), and makes first-use work (a handle, a plan) with the capture mode relaxed; see
:mod:`cudnnkit.jax._cuda`.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ..autograd._kw import decode, encode
from ..ops._diff import Differentiable, Spec
from ..runtime.arrays import contiguous_strides
from ..runtime.cache import LRU, MISSING
from ..runtime.dtypes import canonical
from ..runtime.settings import as_items, current_settings, from_items, in_force
from . import _ffi

__all__ = ["JaxOp", "Runner", "spec"]

#: JAX's tracer type (skipped by the platform check: a traced value's platform is not known yet)
_TRACER: Any = getattr(getattr(jax, "core", None), "Tracer", ())
#: the ops whose FFI targets are registered, in order (their trait is fixed: :func:`cudnnkit.jax._cuda
#: .enable_command_buffers` checks them)
REGISTERED: list[JaxOp] = []


class Runner(Protocol):
    """How a handler sees its buffers (see the module docstring)."""

    #: the FFI platform the targets are registered for ("CUDA", or "cpu" in the tests)
    platform: str
    #: whether the handlers' memory handling is capturable into a CUDA graph (every byte from XLA, nothing allocated
    #: or freed outside it during a call): with the declaration's ``capture_safe``, the command-buffer trait. A runner
    #: without the attribute is taken as not capture-safe.
    capture_safe: bool

    def array(self, call: _ffi.Call, b: _ffi.Buffer, shape: tuple | None = None, strides: tuple | None = None) -> Any:
        """``b`` as an array the declaration's calls take (a device view; NumPy in the CPU tests): C order over
        ``b.shape``, or ``shape`` with element ``strides`` over b's memory (a residual kept in its own layout)."""
        ...

    def write(self, call: _ffi.Call, dst: _ffi.Buffer, value: Any, name: str, shape: tuple | None = None,
              strides: tuple | None = None) -> None:  # fmt: skip
        """``value`` (an array the declaration returned: any strides) into ``dst``, seen as :meth:`array` sees
        it with ``shape``/``strides``."""
        ...

    def zero(self, call: _ffi.Call, dst: _ffi.Buffer) -> None:
        """``dst`` set to zeros (a gradient the backward says is zero)."""
        ...

    def scope(self, call: _ffi.Call) -> Any:
        """A context the declaration's calls run in (the call's stream and device)."""
        ...

    # Optional: ``into(call, targets)`` (a context in which the declaration's new arrays may be made in the result
    # buffers ``targets``, yielding what it placed) and ``write_all(call, items, placed)`` (the writes, knowing
    # that): the CUDA runner's, which saves the copies; a runner without them writes each result with ``write``.


class Permuted:
    """A JAX array ``value`` that an op is to see as ``jnp.transpose(value, perm)`` without the transpose: the FFI
    operand is ``value`` itself (its dims in memory order), the op's view of it has the permuted shape and the
    matching strides (a channels-last ``(N, H, W, C)`` array with ``perm=(0, 3, 1, 2)`` is seen as ``(N, C, H, W)``
    with channels-last strides, which cuDNN takes as it is). Pass it where the op takes an array; the results come
    back as the op's logical arrays (see :meth:`JaxOp.__call__`)."""

    __slots__ = ("value", "perm")

    def __init__(self, value: Any, perm: Any):
        perm = tuple(int(i) for i in perm)
        if sorted(perm) != list(range(value.ndim)):
            raise ValueError(f"perm {perm} is not a permutation of the {value.ndim} dims of a {value.shape} array")
        self.value, self.perm = value, perm


def spec(x: Any) -> Spec:
    """The :class:`Spec` of a JAX array or abstract value: its shape, C-order strides (XLA hands custom calls
    dense row-major buffers) and cudnnkit dtype name; of a :class:`Permuted`, its permuted shape and strides."""
    if isinstance(x, Permuted):
        inner = spec(x.value)
        return Spec(tuple(inner.shape[i] for i in x.perm), tuple(inner.strides[i] for i in x.perm), inner.dtype)
    shape = tuple(int(d) for d in x.shape)
    return Spec(shape, contiguous_strides(shape), canonical(jnp.dtype(x.dtype).name, "array"))


def _memory_order(s: Spec) -> tuple[int, ...]:
    """The dims by decreasing stride; among equal strides a size-1 dim after the others (it has the stride of the
    dim inside it: a channels-last array's C = 1 comes after W, as in its buffer), then by index."""
    return tuple(sorted(range(len(s.shape)), key=lambda i: (-s.strides[i], s.shape[i] == 1, i)))


def _order(s: Spec) -> tuple[int, ...] | None:
    """The dims of ``s`` in memory order (outermost first) when ``s`` is a dense permutation of C order other than
    C order itself, else None: the physical buffer of such a spec is ``transpose(logical, order)``."""
    order = _memory_order(s)
    if order == tuple(range(len(s.shape))):
        return None
    phys = tuple(s.shape[i] for i in order)
    return order if tuple(s.strides[i] for i in order) == contiguous_strides(phys) else None


def _view(s: Spec) -> tuple | None:
    """``(shape, strides)`` of an operand's view when it is not its buffer's C order (see :func:`_order`)."""
    return (s.shape, s.strides) if _order(s) is not None else None


def _to_physical(x: Any, s: Spec) -> Any:
    """A logical array (``s``'s shape) as the buffer a spec of ``s``'s layout is (its dims in memory order)."""
    order = _order(s)
    return x if order is None else jnp.transpose(x, order)


def _to_logical(x: Any, s: Spec) -> Any:
    """The inverse of :func:`_to_physical`: XLA cancels the pair where a caller transposes back."""
    order = _order(s)
    return x if order is None else jnp.transpose(x, tuple(int(i) for i in np.argsort(order)))


def _buffer_sds(s: Spec) -> jax.ShapeDtypeStruct:
    """The result buffer of a spec: its dims in memory order where :func:`_order` finds a layout, else C order."""
    order = _order(s)
    shape = s.shape if order is None else tuple(s.shape[i] for i in order)
    return jax.ShapeDtypeStruct(shape, jnp.dtype(s.dtype))


def _physical(s: Spec) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """``(physical shape, shape, strides)`` of a residual: a dense spec keeps its layout (the buffer XLA allocates
    is its dims in memory order, so the forward writes it with one plain copy and the backward reads it with the
    same strides: pooling's channels-last index); anything else is kept in C order."""
    order = _memory_order(s)
    phys = tuple(s.shape[i] for i in order)
    if tuple(s.strides[i] for i in order) == contiguous_strides(phys):
        return phys, s.shape, s.strides
    return s.shape, s.shape, contiguous_strides(s.shape)


def _sds(s: Spec) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype))


def _floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


#: whether this jax's ``custom_vjp.defvjp`` takes ``symbolic_zeros=`` (jax 0.4.14 and later: 0.10 and 0.11 do)
_SYMBOLIC_ZEROS = "symbolic_zeros" in inspect.signature(jax.custom_vjp.defvjp).parameters
_CustomVJPPrimal: Any = getattr(getattr(jax, "custom_derivatives", None), "CustomVJPPrimal", ())
_SymbolicZero: Any = getattr(getattr(jax, "custom_derivatives", None), "SymbolicZero", ())


def _primal(leaf: Any) -> tuple[Any, bool]:
    """``(value, perturbed)`` of an argument of a ``custom_vjp`` forward rule: with ``symbolic_zeros=True`` JAX passes
    each array as a ``CustomVJPPrimal`` whose ``perturbed`` says whether the differentiation reaches it (False for a
    closed-over constant, or an argument ``grad`` is not taken with respect to); anything else is a plain value,
    taken as perturbed (the conservative reading)."""
    if _CustomVJPPrimal and isinstance(leaf, _CustomVJPPrimal):
        return leaf.value, bool(leaf.perturbed)
    return leaf, True


class _Static:
    """A residual that is no array: a pytree node without leaves whose value (a tuple of flags) travels in the
    tree's structure from the forward rule to the backward rule, static under every transformation."""

    __slots__ = ("value",)

    def __init__(self, value: tuple):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


jax.tree_util.register_pytree_node(_Static, lambda s: ((), s.value), lambda value, _: _Static(value))


class _Fold:
    """The ``jax.vmap`` rule of a declaration with ``batch`` names: the mapped axis folds into the leading (sample)
    axis of those arrays, ``(B, N, ...) -> (B * N, ...)``, the op runs once on the folded arrays, and its results
    unfold. An unmapped array among ``batch`` is broadcast over the batch first; a mapped array outside it (a
    convolution's ``w``), or a gradient asked for one (a per-example weight gradient: only when ``w`` is perturbed,
    the backward asking for perturbed inputs' gradients alone), has no such rule: ``NotImplementedError`` naming it,
    at trace time."""

    def __init__(self, d: Differentiable, kwd: dict, in_names: tuple, arr_names: tuple):
        self.d, self.kwd, self.names = d, kwd, in_names + tuple(arr_names)

    def _refuse(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"cudnnkit.jax.ops.{self.d.name}: jax.vmap {what}; the batching rule folds the mapped axis into the "
            f"leading (sample) axis of {', '.join(self.d.batch)} only (map over the batch yourself with jax.lax.map)"
        )

    def _folded(self, name: str, v: Any, batched: bool, size: int) -> Any:
        if name not in self.d.batch:
            if batched:
                raise self._refuse(f"maps over {name}, which is not split by sample")
            return v
        if v.ndim < 1:
            raise self._refuse(f"maps over {name}, which has no sample axis (a scalar)")
        if not batched:
            v = jnp.broadcast_to(v, (size, *v.shape))
        return v.reshape((size * v.shape[1], *v.shape[2:]))

    def _specs(self, specs: tuple, size: int) -> tuple:
        """The call's input and array specs with the batch folded into the leading axis of the batch names."""
        got = []
        for n, s in zip(self.names, specs):
            if n in self.d.batch:
                shape = (size * s.shape[0], *s.shape[1:])
                order = _order(s)
                if order is not None and order[0] != 0:
                    raise self._refuse(f"maps over {n}, whose leading (sample) axis is not outermost in memory")
                # the sample axis outermost: folding it keeps every stride (a channels-last array stays so)
                s = Spec(shape, contiguous_strides(shape) if order is None else s.strides, s.dtype)
            got.append(s)
        return tuple(got)

    def _unfold(self, name: str, v: Any, size: int) -> Any:
        if v is None:
            return None
        if name not in self.d.batch:
            raise RuntimeError(f"{self.d.name}: {name} is a result of a folded call but not among its batch names "
                               f"{self.d.batch} (a cudnnkit bug: the declaration's batch is incomplete)")  # fmt: skip
        return v.reshape((size, v.shape[0] // size, *v.shape[1:]))

    def forward(self, run: Callable, specs: tuple, size: int, batched: Any, ins: tuple, arrs: tuple) -> tuple:
        d = self.d
        flags = tuple(batched[0]) + tuple(batched[1])
        if d.batch_refuses is not None:
            why = d.batch_refuses(self.kwd, dict(zip(self.names, specs)))
            if why is not None:
                raise self._refuse(f"cannot fold this call: {why}")
        vals = ins + arrs
        folded = tuple(self._folded(n, v, b, size) for n, v, b in zip(self.names, vals, flags))
        outs, mutated, res = run(self._specs(specs, size), folded[: len(ins)], folded[len(ins) :])
        if mutated:
            raise self._refuse("cannot return per-sample new values of mutated arrays")
        given = dict(zip(self.names, zip(vals, flags)))  # residuals that are the call's own arrays: as given
        outs = tuple(self._unfold(n, o, size) for n, o in zip(d.outputs, outs))
        res_out: dict[str, Any] = {}
        res_flags: dict[str, Any] = {}
        for k, v in res.items():
            if v is None:  # an absent optional input: no array, and no flag (the pytrees match)
                res_out[k], res_flags[k] = None, None
            elif k in given:  # one of the call's own arrays, mapped or not: the backward's rule folds it again
                res_out[k], res_flags[k] = given[k]
            else:
                res_out[k], res_flags[k] = self._unfold(k, v, size), True
        return (outs, mutated, res_out), (tuple(True for _ in outs), (), res_flags)

    def backward(self, run: Callable, specs: tuple, size: int, batched: Any, res_names: tuple, vals: tuple,
                 out_names: tuple, douts: tuple, grad_names: tuple) -> tuple:  # fmt: skip
        d = self.d
        for n in grad_names:
            if n not in d.batch:
                raise self._refuse(f"asks for a per-sample gradient of {n}, which is not split by sample")
        fvals = tuple(self._folded(n, v, b, size) for n, v, b in zip(res_names, vals, batched[0]))
        fdouts = tuple(self._folded(n, g, b, size) for n, g, b in zip(out_names, douts, batched[1]))
        grads = run(self._specs(specs, size), fvals, fdouts)
        return [self._unfold(n, g, size) for n, g in zip(grad_names, grads)], [True] * len(grads)


try:  # jax.core's public names move between releases: the class every traced value is
    from jax.core import Tracer as _TRACER
except ImportError:  # pragma: no cover
    from jax._src.core import Tracer as _TRACER


def _constant_keywords(name: str, kw: dict) -> None:
    """The keywords as the constants the targets take (in place): a concrete 0-d JAX array becomes its Python number;
    a traced value (inside ``jit``/``grad``/``vmap``) or any other JAX array is refused naming the keyword, at trace
    time (it would otherwise travel as an object: a new target signature, and a retrace, for each one, and a traced
    one fails only when XLA runs the call)."""
    for k, v in kw.items():
        if not isinstance(v, jax.Array):
            continue
        if isinstance(v, _TRACER):
            raise TypeError(
                f"{name}: keyword {k}= is a traced value (inside jit, grad or vmap); cuDNN takes keywords as constants "
                "when the call is traced: pass a Python number, or make the argument static "
                "(jax.jit(..., static_argnames=...))"
            )
        if v.ndim != 0:
            raise TypeError(
                f"{name}: keyword {k}= is a JAX array of shape {tuple(v.shape)}; keywords are constants (Python "
                "numbers, strings, tuples): pass arrays positionally or as the op's array keywords"
            )
        kw[k] = v.item()


class JaxOp:
    """The JAX function and FFI targets of one declaration (see the module docstring). ``namespace`` prefixes
    the target names (tests use their own); ``runner`` is the handlers' :class:`Runner`."""

    def __init__(self, d: Differentiable, runner: Runner, namespace: str = "cudnnkit"):
        self.d, self.runner = d, runner
        self.forward_name = f"{namespace}_{d.name}"
        self.backward_name = f"{namespace}_{d.name}_backward"
        self._fns: dict[str, Callable] = {}
        self._lock = threading.Lock()
        self._registered = False
        #: the command-buffer trait its targets were registered with (None until registered)
        self.traits: bool | None = None

    # ------------------------------------------------------------- the JAX side

    def __call__(self, *inputs: Any, **kw: Any) -> Any:
        d = self.d
        if len(inputs) != len(d.inputs):
            raise TypeError(f"{d.name} takes {len(d.inputs)} array(s) {d.inputs} positionally, got {len(inputs)}")
        arrays = {n: kw.pop(n, None) for n in d.arrays}
        self._check_devices(zip(d.inputs, inputs), arrays.items())
        _constant_keywords(d.name, kw)
        if d.impure is not None and (why := d.impure(kw, arrays)) is not None:
            raise ValueError(f"{d.name}: {why} (a JAX function must be a function of its arrays: jit may merge two "
                             "equal calls into one, jax.checkpoint recomputes a call)")  # fmt: skip
        kw["__in__"] = tuple(i for i, t in enumerate(inputs) if t is not None)
        kw["__arr__"] = tuple(n for n, t in arrays.items() if t is not None)
        cur = current_settings()  # the handlers run on XLA's threads: the caller's settings travel with the call
        kw["__settings__"] = as_items(cur)
        key = encode(kw)
        self._register()
        f = self._fns.get(key)
        if f is None:
            with self._lock:
                f = self._fns.setdefault(key, self._make(key))
        ins = tuple(t for t in inputs if t is not None)
        arrs = tuple(t for t in arrays.values() if t is not None)
        statics = tuple(spec(t) for t in ins) + tuple(spec(t) for t in arrs)
        ins = tuple(t.value if isinstance(t, Permuted) else t for t in ins)  # the buffers: their memory order
        arrs = tuple(t.value if isinstance(t, Permuted) else t for t in arrs)
        try:
            outs, mutated = f(statics, ins, arrs)
        except NotImplementedError as e:
            if "vmap_method" not in str(e):
                raise
            raise NotImplementedError(
                f"cudnnkit.jax.ops.{d.name}: jax.vmap has no batching rule for this op (its samples are not "
                f"independent along a leading axis); map over the batch yourself (jax.lax.map) or fold the batch into "
                f"the arrays' leading dimension (N)"
            ) from None
        if len(outs) == 1 and not mutated:
            return outs[0]
        return (*outs, *mutated)

    def _check_devices(self, *named: Any) -> None:
        """A concrete array on another platform than the targets' (a CPU or TPU array for the CUDA ones) is refused
        naming its argument (XLA would otherwise say that no handler is registered there)."""
        want = "gpu" if self.runner.platform.lower() in ("cuda", "gpu") else self.runner.platform.lower()
        for name, t in (p for group in named for p in group):
            t = t.value if isinstance(t, Permuted) else t
            if t is None or isinstance(t, _TRACER) or not hasattr(t, "devices"):
                continue
            try:
                got = {dev.platform for dev in t.devices()}
            except Exception:  # an abstract value: its platform is decided when XLA compiles
                continue
            if got != {want}:
                raise TypeError(f"{self.d.name}: {name} is an array on {', '.join(sorted(got))}; cudnnkit's "
                                f"{self.runner.platform} targets need it on {want} (jax.device_put it there)")  # fmt: skip

    def _make(self, key: str) -> Callable:
        """The ``custom_vjp`` function of one keyword encoding: ``f(specs, ins, arrs) -> (outs, mutated)`` with
        ``specs`` (the present inputs' and arrays' :class:`Spec` s) static."""
        d = self.d
        kwd = decode(key)
        in_idx, arr_names = kwd.pop("__in__"), kwd.pop("__arr__")
        settings_items = kwd.pop("__settings__")
        changed = tuple(m for m in d.mutated if m in arr_names)

        def layout(specs: tuple) -> tuple[tuple, dict, list[str]]:
            full: list[Any] = [None] * len(d.inputs)
            for i, s in zip(in_idx, specs):
                full[i] = s
            a = dict.fromkeys(d.arrays) | dict(zip(arr_names, specs[len(in_idx) :]))
            out_specs, res_specs = d.meta(*full, **a, **kwd)
            names = set(d.inputs) | set(d.arrays) | set(d.outputs)
            return out_specs, res_specs, [k for k in res_specs if k not in names]

        in_names = tuple(d.inputs[i] for i in in_idx)
        operand_names = in_names + tuple(arr_names)
        fold = _Fold(d, kwd, in_names, arr_names)

        def run(specs: tuple, ins: tuple, arrs: tuple) -> tuple[tuple, tuple, dict]:
            if not d.batch:
                return run_ffi(specs, ins, arrs)

            @jax.custom_batching.custom_vmap
            def call(ins: tuple, arrs: tuple) -> tuple[tuple, tuple, dict]:
                return run_ffi(specs, ins, arrs)

            @call.def_vmap
            def rule(size: int, batched: Any, ins: tuple, arrs: tuple) -> tuple:
                return fold.forward(run, specs, size, batched, ins, arrs)  # run again: an outer vmap folds too

            return call(ins, arrs)

        def run_ffi(specs: tuple, ins: tuple, arrs: tuple) -> tuple[tuple, tuple, dict]:
            out_specs, res_specs, new = layout(specs)
            mut_specs = [specs[len(in_idx) + arr_names.index(m)] for m in changed]
            shapes = [_buffer_sds(s) for s in (*out_specs, *mut_specs)]
            lays = tuple((k, *_physical(res_specs[k])) for k in new)
            shapes += [jax.ShapeDtypeStruct(phys, jnp.dtype(res_specs[k].dtype)) for k, phys, _, _ in lays]
            # operands and results whose layout is not their buffer's C order (Permuted operands, outputs in their
            # layout): the handler views them with these (shape, strides)
            views = repr((tuple(_view(s) for s in specs), tuple(_view(s) for s in (*out_specs, *mut_specs))))
            got = jax.ffi.ffi_call(self.forward_name, shapes)(*ins, *arrs, kw=key, fresh=repr(lays), views=views)
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            n, c = len(out_specs), len(changed)
            outs, mutated, fresh = tuple(got[:n]), tuple(got[n : n + c]), got[n + c :]
            outs = tuple(_to_logical(o, s) for o, s in zip(outs, out_specs))
            # residuals: operands and mutated arrays as their buffers, outputs logical (the backward lays them out
            # from its own, possibly folded, specs), fresh ones as the handler wrote them
            by_name = dict(zip((d.inputs[i] for i in in_idx), ins)) | dict(zip(arr_names, arrs))
            by_name |= dict(zip(changed, mutated)) | dict(zip(d.outputs, outs)) | dict(zip(new, fresh))
            res = {k: by_name.get(k) for k in res_specs}
            mutated = tuple(_to_logical(m, s) for m, s in zip(mutated, mut_specs))
            return outs, mutated, res

        def f(specs: tuple, ins: tuple, arrs: tuple) -> tuple:
            outs, mutated, _ = run(specs, ins, arrs)
            return outs, mutated

        def f_fwd(specs: tuple, ins: tuple, arrs: tuple) -> tuple:
            got = tuple(_primal(t) for t in ins)  # (value, perturbed) per input (symbolic zeros: see _primal)
            ins = tuple(v for v, _ in got)
            arrs = tuple(_primal(t)[0] for t in arrs)
            outs, mutated, res = run(specs, ins, arrs)
            return (outs, mutated), (res, _Static(tuple(p for _, p in got)))

        def f_bwd(specs: tuple, packed: tuple, cts: tuple) -> tuple:
            res, perturbed = packed[0], packed[1].value
            out_cts, _ = cts  # the mutated arrays' new values are state: no cotangent flows into them
            douts, present = [], []
            for j, g in enumerate(out_cts):
                # an integer output's cotangent is float0 (no dtype cuDNN names): it carries nothing; an output
                # nothing downstream depends on comes as a symbolic zero: it carries nothing either
                use = (d.carries_gradient(j) and g is not None and not isinstance(g, _SymbolicZero)
                       and g.dtype != jax.dtypes.float0 and jnp.issubdtype(g.dtype, jnp.inexact))  # fmt: skip
                present.append(use)
                if use:  # logical here: bwd_ffi lays it out as the (possibly folded) output's buffer is
                    douts.append(g)
            in_specs = specs[: len(in_idx)]
            needs_full = [False] * len(d.inputs)
            for i, s, p in zip(in_idx, in_specs, perturbed):
                # only the inputs the differentiation perturbs: a closed-over (constant) w takes no gradient, so
                # the backward skips its cuDNN call and a vmap of grad(x) does not ask for a per-sample dw
                needs_full[i] = _floating(s.dtype) and p
            order = tuple(layout(specs)[1])  # meta's order (a pytree's dict comes back with its keys sorted)
            names = tuple(k for k in order if res.get(k) is not None)
            # a residual the forward gave as None (an absent optional input: divisive normalization's means) has no
            # buffer; the backward still gets it, as None, so that it sees the forward's residual names
            absent = tuple(k for k in order if res.get(k) is None)
            bkw = dict(kwd, __res__=order, __absent__=absent, __douts__=tuple(present),
                       __needs__=tuple(needs_full), __in__=in_idx, __arr__=arr_names,
                       __settings__=settings_items)  # fmt: skip
            wanted = any(needs_full)

            def bwd_ffi(specs_: tuple, vals: tuple, douts_: tuple) -> list:
                """The backward target for arrays of ``specs_``: the fresh residuals' layouts (as the forward kept
                them) and the gradients' shapes follow from them (a folded call's are the folded ones)."""
                out_specs_, res_specs_, new_ = layout(specs_)
                # each residual's layout is the buffer it is: an operand's spec, an output's (laid out here, from
                # its logical value: XLA cancels the transposes), a fresh one's as the forward wrote it
                lay = dict(zip(operand_names, specs_)) | dict(zip(d.outputs, out_specs_))
                lay |= {k: res_specs_[k] for k in new_}
                vals = tuple(_to_physical(v, lay[k]) if k in d.outputs else v for k, v in zip(names, vals))
                views_ = tuple((k, *_physical(lay[k])[1:]) for k in names)
                outj = [j for j, p in enumerate(present) if p]
                douts_ = tuple(_to_physical(g, out_specs_[j]) for g, j in zip(douts_, outj))
                dviews_ = tuple(_view(out_specs_[j]) for j in outj)
                wanted_ = [s for i, s in zip(in_idx, specs_[: len(in_idx)]) if needs_full[i]]
                got = jax.ffi.ffi_call(self.backward_name, [_buffer_sds(s) for s in wanted_])(
                    *vals, *douts_,
                    kw=encode(dict(bkw, __views__=views_, __dviews__=dviews_,
                                   __gviews__=tuple(_view(s) for s in wanted_))),
                )  # fmt: skip
                return list(got) if isinstance(got, (list, tuple)) else [got]

            out_names = tuple(d.outputs[j] for j, p in enumerate(present) if p)
            grad_names = tuple(d.inputs[i] for i in in_idx if needs_full[i])

            def bwd_call(specs_: tuple, vals: tuple, douts_: tuple) -> list:
                if not d.batch:
                    return bwd_ffi(specs_, vals, douts_)

                @jax.custom_batching.custom_vmap
                def bcall(vals: tuple, douts_: tuple) -> list:
                    return bwd_ffi(specs_, vals, douts_)

                @bcall.def_vmap
                def brule(size: int, batched: Any, vals: tuple, douts_: tuple) -> tuple:
                    return fold.backward(bwd_call, specs_, size, batched, names, vals, out_names, douts_,
                                         grad_names)  # fmt: skip

                return bcall(vals, douts_)

            grads: list[Any] = []
            if wanted and douts:
                grads = bwd_call(specs, tuple(res[k] for k in names), tuple(douts))
            it = iter(grads)
            out = tuple(next(it, None) if needs_full[i] and douts else None for i in in_idx)
            return out, tuple(None for _ in arr_names)

        fn = jax.custom_vjp(f, nondiff_argnums=(0,))
        if _SYMBOLIC_ZEROS:
            fn.defvjp(f_fwd, f_bwd, symbolic_zeros=True)
        else:  # pragma: no cover  (a jax without symbolic zeros: every floating input is taken as perturbed)
            fn.defvjp(f_fwd, f_bwd)
        return fn

    # ------------------------------------------------------------- the handlers

    @property
    def command_buffer(self) -> bool:
        """Whether the targets declare XLA's command-buffer trait: the declaration's ``capture_safe`` and the
        runner's (see the module docstring)."""
        return bool(self.d.capture_safe) and bool(getattr(self.runner, "capture_safe", False))

    def _register(self) -> None:
        if self._registered:
            return
        with self._lock:
            if not self._registered:
                p, cb = self.runner.platform, self.command_buffer
                _ffi.register(self.forward_name, _ffi.Handler(self._forward, platform=p, command_buffer=cb))
                _ffi.register(self.backward_name, _ffi.Handler(self._backward, platform=p, command_buffer=cb))
                self.traits, self._registered = cb, True
                REGISTERED.append(self)

    def _forward(self, call: _ffi.Call) -> None:
        d, r = self.d, self.runner
        kwd = decode(call.attrs["kw"])
        in_idx, arr_names = kwd.pop("__in__"), kwd.pop("__arr__")
        changed = [m for m in d.mutated if m in arr_names]
        n_in, n = len(in_idx), len(d.outputs)
        rets = call.rets
        in_views, out_views = _literal(call.attrs.get("views", "((), ())"))
        in_views = in_views or (None,) * len(call.args)
        out_views = out_views or (None,) * (n + len(changed))
        with r.scope(call), in_force(from_items(kwd.pop("__settings__", ()))):
            inputs: list[Any] = [None] * len(d.inputs)
            for i, b, v in zip(in_idx, call.args[:n_in], in_views):
                inputs[i] = r.array(call, b, *(v or ()))
            arrays: dict[str, Any] = dict.fromkeys(d.arrays)
            for name, b, v in zip(arr_names, call.args[n_in:], in_views[n_in:]):
                arrays[name] = r.array(call, b, *(v or ()))
            for k, m in enumerate(changed):  # updated in its result buffer: XLA's operands are never written
                dst, v = rets[n + k], out_views[n + k] or ()
                r.write(call, dst, arrays[m], m, *v)
                arrays[m] = r.array(call, dst, *v)
            lays = _literal(call.attrs["fresh"])  # (name, physical shape, shape, strides), meta's order
            fresh = rets[n + len(changed) :]
            targets = [(dst, out_views[j]) for j, dst in enumerate(rets[:n])]
            targets += [(dst, (shape, strides)) for (_, _, shape, strides), dst in zip(lays, fresh)]
            with _into(r, call, targets) as placed:
                outs, res = d.forward(*inputs, **arrays, **kwd)
            names = set(d.inputs) | set(d.arrays) | set(d.outputs)
            made = {k for k in res if k not in names}
            if made != {k for k, *_ in lays}:
                raise RuntimeError(f"{d.name}: the forward made residuals {sorted(made)} where its meta said "
                                   f"{sorted(k for k, *_ in lays)} (a cudnnkit bug: meta and forward disagree)")  # fmt: skip
            items = [(dst, o, d.outputs[j], *(out_views[j] or (None, None))) for j, (o, dst) in
                     enumerate(zip(outs, rets[:n]))]  # fmt: skip
            items += [(dst, res[k], k, shape, strides) for (k, _, shape, strides), dst in zip(lays, fresh)]
            _write_all(r, call, items, placed)

    def _backward(self, call: _ffi.Call) -> None:
        d, r = self.d, self.runner
        kwd = decode(call.attrs["kw"])
        order, absent = kwd.pop("__res__"), set(kwd.pop("__absent__", ()))
        present, needs = kwd.pop("__douts__"), kwd.pop("__needs__")
        views = {k: (shape, strides) for k, shape, strides in kwd.pop("__views__")}
        dviews, gviews = iter(kwd.pop("__dviews__", ())), iter(kwd.pop("__gviews__", ()))
        kwd.pop("__in__"), kwd.pop("__arr__")
        names = [k for k in order if k not in absent]  # the residuals with a buffer, in the arguments' order
        with r.scope(call), in_force(from_items(kwd.pop("__settings__", ()))):
            got = {k: r.array(call, b, *views.get(k, ())) for k, b in zip(names, call.args[: len(names)])}
            res: dict[str, Any] = {k: got.get(k) for k in order}  # the forward's names and order, None kept
            given = iter(call.args[len(names) :])
            douts = tuple(r.array(call, next(given), *(next(dviews, None) or ())) if p else None for p in present)
            # XLA keeps residuals in buffers of its own (a copy, at an address the forward never saw): an op whose
            # backward recognises a residual by identity is told so explicitly
            copied = {"residuals_copied": True} if d.tracked_residuals else {}
            gv = [next(gviews, None) for _ in call.rets]
            with _into(r, call, list(zip(call.rets, gv))) as placed:
                grads = d.backward(res, douts, tuple(needs), **kwd, **copied)
            dsts, items, zeros = iter(zip(call.rets, gv)), [], []
            for g, need in zip(grads, needs):
                if not need:
                    continue
                dst, v = next(dsts)
                if g is None:
                    zeros.append(dst)
                else:
                    items.append((dst, g, "gradient", *(v or (None, None))))
            _write_all(r, call, items, placed)
            for dst in zeros:  # after the writes: a zero gradient's buffer may hold another gradient made there
                r.zero(call, dst)


def _into(r: Runner, call: _ffi.Call, targets: list) -> Any:
    """The runner's :meth:`~cudnnkit.jax._cuda.CudaRunner.into` (the declaration's new arrays made in the result
    buffers ``targets``: ``(buffer, (shape, strides) or None)``), or nothing for a runner without it."""
    into = getattr(r, "into", None)
    return into(call, targets) if into is not None else contextlib.nullcontext(None)


def _write_all(r: Runner, call: _ffi.Call, items: list, placed: Any) -> None:
    """Each ``(dst, value, name, shape, strides)`` written: at once (:meth:`~cudnnkit.jax._cuda.CudaRunner
    .write_all`, which knows what :func:`_into` placed), or one by one for a runner without it."""
    write_all = getattr(r, "write_all", None)
    if write_all is not None:
        write_all(call, items, placed)
        return
    for dst, value, name, shape, strides in items:
        r.write(call, dst, value, name, shape, strides)


#: per-call parsing the handlers repeat with the same strings: the lowering's literal attributes (a jitted
#: function's every call hands the handler the same ones)
_LITERALS: LRU[str, Any] = LRU("jax.literals", 1024)


def _literal(s: str) -> Any:
    """``ast.literal_eval(s)``, cached per string (a handler's attribute: the same on every call of a call site)."""
    got = _LITERALS.lookup(s)
    if got is MISSING:
        got = _LITERALS.put(s, ast.literal_eval(s))
    return got
