"""Dropout with cuDNN's RNG (``cudnnDropoutForward``/``cudnnDropoutBackward``).

A :class:`DropoutState` holds cuDNN's random-number-generator states for one
device: a buffer of ``cudnnDropoutGetStatesSize`` bytes, initialised from a
seed by ``cudnnSetDropoutDescriptor`` (a GPU kernel, run once), and the
dropout descriptor that points at it. Each forward call advances the states.
The same seed on the same shapes gives the same masks; :meth:`DropoutState.snapshot`
and :meth:`DropoutState.restore` save and put back the RNG position to replay masks.

``dropout_forward(x, p, state=...)`` returns ``(y, reserve)``: ``y = x * mask / (1 - p)``,
and ``reserve`` holds the mask (``cudnnDropoutGetReserveSpaceSize`` bytes).
``dropout_backward(dy, reserve, p, state=...)`` applies the same mask and scale.
``p`` is in ``[0, 1)``; changing it between calls re-points the descriptor with
``cudnnRestoreDropoutDescriptor`` (no re-initialisation of the states).
Dtypes: float16, float32, float64 (cuDNN refuses bfloat16). The descriptor
keeps ``p`` as a C float, so the scale ``1 / (1 - p)`` is a float32 value even
for float64 data (about 1e-9 relative from the exact scale for ``p = 0.1``).

A state is not thread-safe: use one per thread (or lock around it).

The L3 declaration (``cudnnkit.autograd.dropout``) also takes ``seed=``, a device (or host) array of 32-bit words
instead of a state: the forward then reads the seed on the host (a synchronization), re-initialises a state of its
own from it (:func:`seeded_state`, one per device, library and stream) and draws the mask from it, so that the
mask depends on the seed and the shape alone. That is how a traced JAX key reaches cuDNN
(``cudnnkit.jax.nn.dropout``): ``cudnnSetDropoutDescriptor`` takes its seed as a host integer, never from device
memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import numbers
import threading
from collections.abc import Iterator
from typing import Any

from .. import lib
from ..runtime import adapters, check_dtype, owned_descriptor, prepare, tensor_descriptor
from ..runtime.arrays import ArrayView
from ..runtime.cache import LRU, MISSING, lru
from ._diff import Differentiable, Spec, differentiable, new_like
from ._layout import canonical_strides, describable
from ._primitive import Call, Operand, Output, Primitive, register, run

__all__ = ["DropoutState", "default_state", "seeded_state", "seed_from_words", "dropout_forward", "dropout_backward"]

# cuDNN 9.19's dropout returns NOT_SUPPORTED for bfloat16 (measured on an H200)
_DTYPES = ("float16", "float32", "float64")


def _check_seed(seed: int, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2**64), got {seed!r}")
    return seed


class DropoutState:
    """cuDNN dropout RNG states on the device (and library) of ``like``.

    ``like``: any CUDA array; its device is used and its library allocates the
    states. ``seed``: 64-bit unsigned seed. Creating one allocates ``cudnnDropoutGetStatesSize`` bytes and runs
    ``cudnnSetDropoutDescriptor`` once (a GPU kernel that initialises the states); each
    :func:`dropout_forward` with it advances them. Not thread-safe: use one per thread.

    Args:
        like: a CUDA array whose device and library the states get.
        seed: the seed, an int in ``[0, 2**64)``.
        stream: the stream the initialisation runs on; None: the library's current stream.

    Example:
        >>> state = ops.DropoutState(x, seed=0)
        >>> y, reserve = ops.dropout_forward(x, 0.1, state=state)
    """

    def __init__(self, like: Any, seed: int = 0, *, stream: Any = None, _name: str = "like"):
        _check_seed(seed)
        launch, _ = prepare((_name, like), stream=stream)
        if launch.adapter is None:
            raise TypeError(
                f"{_name} must be an array of a library with a cudnnkit adapter (CuPy or torch) when no state= is "
                "given: the default DropoutState allocates its RNG states with that library (or pass state=)"
            )
        size = ctypes.c_size_t()
        lib.cudnnDropoutGetStatesSize(launch.handle, ctypes.byref(size))
        self.device = launch.device
        self.adapter = launch.adapter
        self.nbytes = size.value
        with adapters.lasting():  # kept for the state's life, never memory lent to one call
            self.states, vs = launch.empty((self.nbytes,), "uint8", name="states")
        self._ptr = vs.ptr
        self.desc = owned_descriptor("cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor")
        self.p = 0.0
        self.seed = seed
        with launch.on_device():
            lib.cudnnSetDropoutDescriptor(self.desc, launch.handle, 0.0, self._ptr, self.nbytes, seed)

    def reseed(self, seed: int, *, stream: Any = None) -> None:
        """Re-initialise the RNG states from ``seed`` (``cudnnSetDropoutDescriptor``; a GPU kernel on ``stream``)."""
        _check_seed(seed)
        launch, _ = prepare(("states", self.states), stream=stream)
        with launch.on_device():
            lib.cudnnSetDropoutDescriptor(self.desc, launch.handle, self.p, self._ptr, self.nbytes, seed)
        self.seed = seed

    def snapshot(self, *, stream: Any = None) -> Any:
        """A device copy of the RNG states (the current position in the random sequence), made on ``stream``."""
        launch, _ = prepare(("states", self.states), stream=stream)
        with adapters.lasting():
            copy, _ = launch.empty((self.nbytes,), "uint8", name="snapshot")
        self.adapter.copy(copy, self.states, launch.stream)
        return copy

    def restore(self, snapshot: Any, *, stream: Any = None) -> None:
        """Put back states saved by :meth:`snapshot` (on ``stream``): the next calls repeat the same masks."""
        v = self.adapter.view(snapshot, "snapshot")
        if v.shape != (self.nbytes,) or v.dtype != "uint8":
            raise ValueError(f"snapshot must be a uint8 array of {self.nbytes} bytes from DropoutState.snapshot()")
        launch, _ = prepare(("states", self.states), stream=stream)
        self.adapter.copy(self.states, snapshot, launch.stream)

    def _use(self, p: float, handle: Any) -> None:
        if p != self.p:
            lib.cudnnRestoreDropoutDescriptor(self.desc, handle, p, self._ptr, self.nbytes, self.seed)
            self.p = p

    def __repr__(self) -> str:
        return f"<DropoutState cuda:{self.device} {self.adapter.name} seed={self.seed} {self.nbytes} bytes>"


_defaults: dict[tuple[int, str, int], DropoutState] = {}
_defaults_lock = threading.Lock()


def default_state(like: Any, *, stream: Any = None, name: str = "like") -> DropoutState:
    """This thread's default state (seed 0) for ``like``'s device and library, created on ``stream`` (checked on
    every call, also when the state exists). ``name``: the argument errors name (the op's ``x`` or ``dy``). The
    first call per thread, device and library creates it (``cudnnDropoutGetStatesSize`` bytes initialised by
    ``cudnnSetDropoutDescriptor``); later calls return it.

    Args:
        like: a CUDA array; the state is for its device and library.
        stream: the stream its creation runs on; None: the library's current stream.
        name: the argument name used in error messages.

    Returns:
        A :class:`DropoutState`, the same object for every call from this thread with the same device and library.

    Example:
        >>> state = ops.default_state(x)
        >>> y, reserve = ops.dropout_forward(x, 0.2, state=state)   # what state=None does
    """
    launch, (v,) = prepare((name, like), stream=stream)
    key = (v.device, v.library, threading.get_ident())
    with _defaults_lock:
        st = _defaults.get(key)
    if st is None:
        st = DropoutState(like, 0, stream=launch.stream, _name=name)
        with _defaults_lock:
            _defaults[key] = st
    return st


_seeded: dict[tuple[int, str, int], tuple[DropoutState, threading.Lock]] = {}


@contextlib.contextmanager
def seeded_state(like: Any, seed: int, *, stream: Any = None, name: str = "x") -> Iterator[DropoutState]:
    """Within the block, a :class:`DropoutState` freshly initialised from ``seed`` on ``stream`` (``like``'s
    library's current one by default): the next :func:`dropout_forward` with it draws the mask that ``seed`` and the
    shape give, whatever ran before. One state per (device, library, stream), made on first use and kept for the
    process; the block holds its lock, so two threads on one stream do not re-seed it under each other (the GPU
    work is ordered by the stream). ``cudnnSetDropoutDescriptor`` (an initialisation kernel) on every entry."""
    _check_seed(seed)
    launch, (v,) = prepare((name, like), stream=stream)
    key = (v.device, v.library, int(launch.stream or 0))
    with _defaults_lock:
        got = _seeded.get(key)
    if got is None:
        got = (DropoutState(v.owner if v.adapter is not None else like, seed, stream=launch.stream, _name=name),
               threading.Lock())  # fmt: skip
        with _defaults_lock:
            got = _seeded.setdefault(key, got)
    state, lock = got
    with lock:
        state.reseed(seed, stream=launch.stream)
        yield state


def seed_from_words(words: Any, name: str = "seed") -> int:
    """The 64-bit seed that one or two 32-bit words (low word first; any integers, each taken modulo 2**32: an
    int32 word's two's complement) spell."""
    import numpy as np

    w = np.asarray(words).reshape(-1)
    if w.size not in (1, 2):
        raise ValueError(f"{name} must hold one or two 32-bit words, got {w.size} values")
    out = 0
    for i, v in enumerate(w.tolist()):
        out |= (int(v) & 0xFFFFFFFF) << (32 * i)
    return out


def _seed_words(seed: Any, name: str = "seed") -> int:
    """The 64-bit seed in ``seed``, an int32 array of one or two 32-bit words (what ``jax.random.bits`` gives
    bit-cast to int32), read on the host (its library's ``to_numpy``: a synchronization)."""
    from ._diff import host_values

    return seed_from_words(host_values(seed, name), name)


def _check_p(p: float, name: str = "p") -> float:
    """``p`` as a float in ``[0, 1)``: any real number (NumPy scalars too) but a bool, else ``TypeError``; NaN and
    values outside the range ``ValueError``, both naming ``name``."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{name} must be a float in [0, 1), got {p!r}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return p


def _check_state(state: DropoutState, v: ArrayView, name: str) -> None:
    if not isinstance(state, DropoutState):
        raise TypeError(f"state must be a DropoutState, got {type(state).__name__}")
    if state.device != v.device:
        raise ValueError(f"state is on cuda:{state.device} but {name} is on cuda:{v.device}")


@lru("dropout.describe", 4096)
def _describe(shape: tuple[int, ...], strides: tuple[int, ...]):
    """How dropout describes an array (its shape and strides, size-1 strides made canonical), or None when
    cuDNN cannot take its strides (expanded, reversed, overlapping: copied first)."""
    if not describable(shape, strides):
        return None
    return shape, canonical_strides(shape, strides)


def _reserve_size(desc: Any) -> int:
    n = ctypes.c_size_t()
    lib.cudnnDropoutGetReserveSpaceSize(desc, ctypes.byref(n))
    return n.value


def _ledger(name: str, maxsize: int) -> LRU:
    """An :class:`~cudnnkit.runtime.cache.LRU` that records state rather than caching values (which reserve a
    forward wrote, and how): left out of ``cache.clear_all`` (so ``runtime.clear_caches()`` between a forward and
    its backward changes nothing) and ``cache.stats``."""
    return LRU(name, maxsize, register=False)


class _ReserveLayouts:
    """The layout (shape, strides) each forward ran in, by (device, reserve pointer), so that the backward applies
    the mask in the same layout: whether cuDNN indexes the mask by element or by memory position is not
    documented, so the backward never gives it another layout than the forward's. Bounded (LRU); a reserve not
    found (evicted, or made elsewhere) runs in ``dy``'s layout."""

    def __init__(self, maxsize: int = 4096):
        self._d: LRU[tuple[int, int], tuple[int, tuple]] = _ledger("dropout.reserve_layouts", maxsize)

    def add(self, device: int, ptr: int, nbytes: int, description: tuple) -> None:
        # a new forward's reserve at a freed one's address replaces its record (put keeps an existing value);
        # no other thread can add the same (device, pointer) in between: the memory is this forward's
        self._d.pop((device, ptr))
        self._d.put((device, ptr), (nbytes, description))

    def get(self, device: int, ptr: int, nbytes: int) -> tuple | None:
        got = self._d.lookup((device, ptr))
        return got[1] if got is not MISSING and got[0] == nbytes else None


_reserve_layouts = _ReserveLayouts()


def _forward_resolve(views: Any, kw: Any) -> tuple[float, DropoutState | None]:
    state = kw.get("state")
    if state is not None:
        _check_state(state, views["x"], "x")
    return kw["p"], state


def _forward_plan(c: Call) -> None:
    """The state (the default one, made now, when none was given) and the reserve's size, before any copy."""
    _, state = c.resolved
    if state is None:  # x's view may be prepare's copy of an overlapping x: ask with it, never copy x again
        vx = c.views["x"]
        state = default_state(vx.owner if vx.adapter is not None else c.arrays["x"], stream=c.launch.stream, name="x")
    c.extra["state"], c.extra["nres"] = state, _reserve_size(c.desc)


def _forward_call(c: Call) -> None:
    p, _ = c.resolved
    state, nres = c.extra["state"], c.extra["nres"]
    vx, vy, desc, launch = c.views["x"], c.views["out"], c.desc, c.launch
    # its address keys the layout ledger past this call: never memory lent to the call alone (an XLA result
    # buffer, which XLA reuses where the ledger cannot see it)
    with adapters.lasting():
        reserve, vr = launch.empty((nres,), "uint8", name="reserve")
    state._use(p, launch.handle)
    lib.cudnnDropoutForward(launch.handle, state.desc, desc, vx.ptr, desc, vy.ptr, vr.ptr, nres)
    _reserve_layouts.add(launch.device, vr.ptr, nres, c.description)
    c.extra["reserve"] = reserve


def _backward_resolve(views: Any, kw: Any) -> tuple[float, DropoutState | None, Any]:
    vdy, vr = views["dy"], views["reserve"]
    if vr.dtype != "uint8" or vr.ndim != 1:
        raise TypeError(f"reserve must be the 1-d uint8 array dropout_forward returned, got {vr.dtype} {vr.shape}")
    state = kw.get("state")
    if state is not None:
        _check_state(state, vdy, "dy")
    recorded = _reserve_layouts.get(vdy.device, vr.ptr, vr.shape[0]) if vdy.size and vr.is_contiguous() else None
    if recorded is not None and tuple(recorded[0]) != tuple(vdy.shape):
        # reserve sizes are rounded, so the size check cannot tell a (5, 2) forward from a (5, 3) dy
        raise ValueError(
            f"dy has shape {vdy.shape}, but reserve was written by a dropout_forward of shape "
            f"{tuple(recorded[0])}: pass the reserve of this dy's forward"
        )
    return kw["p"], state, recorded


def _backward_forced(resolved: Any) -> tuple[int, ...] | None:
    recorded = resolved[2]
    return recorded[1] if recorded is not None else None


def _backward_plan(c: Call) -> None:
    """The reserve's checks (contiguous, this dy's forward, its size) and the state, before any copy."""
    _, state, recorded = c.resolved
    vdy, vr = c.views["dy"], c.views["reserve"]
    if not vr.is_contiguous():
        raise ValueError(f"reserve must be contiguous (the array dropout_forward returned), got strides {vr.strides}")
    nres = _reserve_size(c.desc)
    if vr.shape[0] != nres:
        raise ValueError(f"reserve has {vr.shape[0]} bytes but dy's shape needs {nres}: not this dy's forward")
    if state is None:
        state = default_state(
            vdy.owner if vdy.adapter is not None else c.arrays["dy"], stream=c.launch.stream, name="dy"
        )
    c.extra["state"], c.extra["nres"] = state, nres


def _backward_call(c: Call) -> None:
    p = c.resolved[0]
    state, nres = c.extra["state"], c.extra["nres"]
    vdy, vdx, vr, desc, launch = c.views["dy"], c.views["out"], c.views["reserve"], c.desc, c.launch
    state._use(p, launch.handle)
    lib.cudnnDropoutBackward(launch.handle, state.desc, desc, vdy.ptr, desc, vdx.ptr, vr.ptr, nres)


DROPOUT_FORWARD = register(
    Primitive(
        "dropout_forward",
        inputs=(Operand("x", _DTYPES),),
        outputs=(Output("out", like="x"),),
        resolve=_forward_resolve,
        describe=lambda resolved: _describe,
        check_plan=_forward_plan,
        legacy=_forward_call,
        layout_what="cuDNN's dropout is given x and y in one layout",
        family="dropout",
        extras=("reserve",),
        empty_extras=lambda launch: {"reserve": launch.empty((0,), "uint8", name="reserve")[0]},
        differentiable=("x",),
        residuals=("reserve",),
        backward="dropout_backward",
    )
)


DROPOUT_BACKWARD = register(
    Primitive(
        "dropout_backward",
        inputs=(Operand("dy", _DTYPES), Operand("reserve")),
        outputs=(Output("out", like="dy"),),
        resolve=_backward_resolve,
        describe=lambda resolved: _describe,
        forced_strides=_backward_forced,
        check_plan=_backward_plan,
        legacy=_backward_call,
        layout_what="the layout its forward ran in, so each element meets its own mask bit",
        layout_order=("dy",),
        family="dropout",
        express=False,  # resolve reads the reserve's pointer (which forward wrote it, in which layout)
    )
)


def dropout_forward(
    x: Any, p: float, *, state: DropoutState | None = None, out: Any = None, stream: Any = None
) -> tuple[Any, Any]:
    """``(y, reserve)``: ``y = x * mask / (1 - p)`` with a fresh Bernoulli(1 - p) mask.

    ``x``: any shape (1-8 dims), float16/float32/float64, any strides (cuDNN refuses bfloat16).
    ``reserve``: a uint8 array holding the mask, for :func:`dropout_backward`.
    ``state`` defaults to :func:`default_state` for ``x``. ``cudnnDropoutForward``
    with ``x`` and ``y`` in one layout: ``y`` is allocated in ``x``'s when ``x`` is
    dense; an ``x`` with gaps is copied to C order first, and an ``out`` in
    another layout is written through a temporary (both logged). Primitive :data:`DROPOUT_FORWARD`.
    The scale ``1 / (1 - p)`` is a float32 value (cuDNN keeps ``p`` as a C float), also for float64 data.

    Args:
        x: the input, a CUDA array of 1 to 8 dims; float16, float32 or float64.
        p: the probability of zeroing an element, a float in ``[0, 1)``.
        state: the :class:`DropoutState` to draw the mask from (advanced by the call); None: this thread's
            default state (seed 0) for ``x``'s device and library.
        out: an array of ``x``'s shape and dtype to write ``y`` into, any layout; None allocates ``y``.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``(y, reserve)``: ``y`` of ``x``'s shape and dtype, and ``reserve``, the 1-d uint8 array of
        ``cudnnDropoutGetReserveSpaceSize`` bytes that :func:`dropout_backward` needs.

    Raises:
        TypeError: a host array or an unsupported dtype (bfloat16 included), ``p`` not a float, ``state`` not a
            :class:`DropoutState`.
        ValueError: ``p`` outside ``[0, 1)``, or ``state`` on another device than ``x``.

    Example:
        >>> state = ops.DropoutState(x, seed=0)
        >>> y, reserve = ops.dropout_forward(x, 0.1, state=state)
        >>> dx = ops.dropout_backward(dy, reserve, 0.1, state=state)   # the same mask
    """
    p = _check_p(p)
    return run(DROPOUT_FORWARD, {"x": x}, p=p, state=state, out=out, stream=stream)


def dropout_backward(
    dy: Any, reserve: Any, p: float, *, state: DropoutState | None = None, out: Any = None, stream: Any = None
) -> Any:
    """``dx = dy * mask / (1 - p)`` with the mask the forward stored in ``reserve``.

    ``p`` must be the forward's. ``cudnnDropoutBackward``, in the layout the forward ran in (``dy`` is copied
    into it, and an ``out`` of another layout written through a temporary, where they differ; logged), so each
    element meets its own mask bit whatever the layouts. Primitive :data:`DROPOUT_BACKWARD`.

    Args:
        dy: the gradient of ``y``, the forward's ``x`` shape and dtype (float16, float32 or float64).
        reserve: the uint8 array :func:`dropout_forward` returned for this ``dy``'s forward.
        p: the forward's ``p``.
        state: the forward's :class:`DropoutState` (None: the default state, as in the forward).
        out: an array of ``dy``'s shape and dtype to write ``dx`` into; None allocates it.
        stream: the stream to run on; None: the library's current stream.

    Returns:
        ``dx``, ``dy``'s shape and dtype.

    Raises:
        TypeError: ``reserve`` is not a 1-d uint8 array, or a host array or unsupported dtype is given.
        ValueError: ``reserve`` is not contiguous or has the wrong size for ``dy``'s shape (not this ``dy``'s
            forward).

    Example:
        >>> y, reserve = ops.dropout_forward(x, 0.5, state=state)
        >>> dx = ops.dropout_backward(dy, reserve, 0.5, state=state)
    """
    p = _check_p(p)
    return run(DROPOUT_BACKWARD, {"dy": dy, "reserve": reserve}, p=p, state=state, out=out, stream=stream)


# ----------------------------------------------------------------- the L3 declaration


def _l3_seed_check(seed: Any, state: Any) -> None:
    if seed is not None and state is not None:
        raise ValueError("dropout: pass state= (a DropoutState, which each call advances) or seed= (an int32 array: "
                         "a fresh state per call), not both")  # fmt: skip


def _l3_forward(x: Any, *, p: float, state: DropoutState | None = None, seed: Any = None) -> Any:
    _l3_seed_check(seed, state)
    if seed is None:
        y, reserve = dropout_forward(x, p, state=state)
    else:
        p = _check_p(p)  # before the seed is read (a synchronization)
        with seeded_state(x, _seed_words(seed)) as st:
            y, reserve = dropout_forward(x, p, state=st)
    return (y,), {"reserve": reserve}


def _l3_backward(res: Any, douts: Any, needs: Any, *, p: float, state: DropoutState | None = None) -> tuple:
    (dy,) = douts
    if dy is None or not needs[0]:
        return (None,)
    return (dropout_backward(dy, res["reserve"], p, state=state),)


def _l3_impure(kw: dict, arrays: dict) -> str | None:
    if arrays.get("seed") is not None:
        return None
    how = "state=" if kw.get("state") is not None else "the thread's default state"
    return (f"without seed= it draws its mask from a DropoutState that each call advances ({how}); pass seed= (an "
            "int32 array of the seed's words), as cudnnkit.jax.nn.dropout does from its key")  # fmt: skip


def _l3_meta(x: Spec, *, p: float, state: DropoutState | None = None, seed: Spec | None = None) -> Any:
    _check_p(p)
    _l3_seed_check(seed, state)
    check_dtype(x, "x", _DTYPES, "dropout")
    if seed is not None and (seed.dtype != "int32" or len(seed.shape) != 1 or seed.shape[0] not in (1, 2)):
        raise TypeError(f"seed must be an int32 array of shape (1,) or (2,) (the seed's 32-bit words, low first), "
                        f"got {seed.dtype} of shape {seed.shape}")  # fmt: skip
    y = new_like(x)  # dense x: its layout; else C order (what dropout_forward allocates: a gapped x is copied)
    nres = 0
    if 0 not in x.shape:  # cudnnDropoutGetReserveSpaceSize on the descriptor the forward builds (host-side)
        nres = _reserve_size(tensor_descriptor(x.dtype, *_describe(y.shape, y.strides)))
    return (y,), {"reserve": Spec((nres,), (1,), "uint8")}


DROPOUT = differentiable(
    Differentiable("dropout", "dropout_forward", ("x",), ("out",), _l3_forward, _l3_backward, _l3_meta,
                   arrays=("seed",), impure=_l3_impure, doc="""y = x * mask / (1 - p) (p in [0, 1), checked as dropout_forward does: p=0 drops
nothing, p=1 is refused). x: 1 to 8 dims, float16/float32/float64. Keywords p and state (a DropoutState, default:
the thread's default_state of x's device; the torch layer passes it by key), or the array seed (no gradient): an
int32 array of one or two 32-bit words (low first) of a 64-bit seed, read on the host by the forward (a
synchronization), which then draws the mask from a state re-initialised from it (seeded_state): the same seed and
shape give the same mask, with no state carried between calls (the JAX layer's explicit key); state and seed
together are refused. Residual reserve: the uint8 mask, cudnnDropoutGetReserveSpaceSize bytes for x's descriptor
(host-side: meta computes it the same way). cudnnDropoutForward, then cudnnDropoutBackward(dy, reserve) with the
same p and state (dropout_backward); the backward reads only the mask, so a default state of another thread
(torch's autograd thread) gives the same gradient.""")
)  # fmt: skip
