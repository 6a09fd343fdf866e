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
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .. import lib
from ..runtime import check_dtype, owned_descriptor, prepare, tensor_descriptor, tensor_descriptor_of
from ..runtime.arrays import ArrayView, like_strides

__all__ = ["DropoutState", "default_state", "dropout_forward", "dropout_backward"]

# cuDNN 9.19's dropout returns NOT_SUPPORTED for bfloat16 (measured on an H200)
_DTYPES = ("float16", "float32", "float64")


def _check_seed(seed: int, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"{name} must be an int in [0, 2**64), got {seed!r}")
    return seed


class DropoutState:
    """cuDNN dropout RNG states on the device (and library) of ``like``.

    ``like``: any CUDA array; its device is used and its library allocates the
    states. ``seed``: 64-bit unsigned seed.
    """

    def __init__(self, like: Any, seed: int = 0, *, stream: Any = None):
        _check_seed(seed)
        launch, _ = prepare(("like", like), stream=stream)
        if launch.adapter is None:
            raise TypeError("DropoutState needs an array of a library with a cudnnkit adapter (CuPy or torch)")
        size = ctypes.c_size_t()
        lib.cudnnDropoutGetStatesSize(launch.handle, ctypes.byref(size))
        self.device = launch.device
        self.adapter = launch.adapter
        self.nbytes = size.value
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


def default_state(like: Any, *, stream: Any = None) -> DropoutState:
    """This thread's default state (seed 0) for ``like``'s device and library, created on ``stream``."""
    v = prepare(("x", like))[1][0]
    key = (v.device, v.library, threading.get_ident())
    with _defaults_lock:
        st = _defaults.get(key)
    if st is None:
        st = DropoutState(like, 0, stream=stream)
        with _defaults_lock:
            _defaults[key] = st
    return st


def _check_p(p: float, name: str = "p") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        raise TypeError(f"{name} must be a float in [0, 1), got {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def _check_state(state: DropoutState, v: ArrayView, name: str) -> None:
    if not isinstance(state, DropoutState):
        raise TypeError(f"state must be a DropoutState, got {type(state).__name__}")
    if state.device != v.device:
        raise ValueError(f"state is on cuda:{state.device} but {name} is on cuda:{v.device}")


def _reserve_size(v: ArrayView) -> int:
    n = ctypes.c_size_t()
    lib.cudnnDropoutGetReserveSpaceSize(tensor_descriptor(v.dtype, v.shape, v.strides), ctypes.byref(n))
    return n.value


def dropout_forward(
    x: Any, p: float, *, state: DropoutState | None = None, out: Any = None, stream: Any = None
) -> tuple[Any, Any]:
    """``(y, reserve)``: ``y = x * mask / (1 - p)`` with a fresh Bernoulli(1 - p) mask.

    ``x``: any shape (1-8 dims), float16/float32/float64, any strides.
    ``reserve``: a uint8 array holding the mask, for :func:`dropout_backward`.
    ``state`` defaults to :func:`default_state` for ``x``. ``cudnnDropoutForward``.
    """
    p = _check_p(p)
    launch, (vx,) = prepare(("x", x), stream=stream)
    check_dtype(vx, "x", _DTYPES, "dropout")
    if state is not None:
        _check_state(state, vx, "x")
    y, vy = launch.output(out, vx.shape, vx.dtype, strides=like_strides(vx))
    if vx.size == 0:
        return y, launch.empty((0,), "uint8", name="reserve")[0]
    state = default_state(x, stream=launch.stream) if state is None else state
    nres = _reserve_size(vx)
    reserve, vr = launch.empty((nres,), "uint8", name="reserve")
    with launch.on_device():
        state._use(p, launch.handle)
        lib.cudnnDropoutForward(
            launch.handle, state.desc, tensor_descriptor_of(vx), vx.ptr, tensor_descriptor_of(vy), vy.ptr, vr.ptr, nres
        )
    return y, reserve


def dropout_backward(
    dy: Any, reserve: Any, p: float, *, state: DropoutState | None = None, out: Any = None, stream: Any = None
) -> Any:
    """``dx = dy * mask / (1 - p)`` with the mask the forward stored in ``reserve``.

    ``p`` must be the forward's. ``cudnnDropoutBackward``.
    """
    p = _check_p(p)
    launch, (vdy, vr) = prepare(("dy", dy), ("reserve", reserve), stream=stream)
    check_dtype(vdy, "dy", _DTYPES, "dropout")
    if vr.dtype != "uint8" or vr.ndim != 1:
        raise TypeError(f"reserve must be the 1-d uint8 array dropout_forward returned, got {vr.dtype} {vr.shape}")
    if state is not None:
        _check_state(state, vdy, "dy")
    if vdy.size:
        nres = _reserve_size(vdy)
        if vr.shape[0] != nres:
            raise ValueError(f"reserve has {vr.shape[0]} bytes but dy's shape needs {nres}: not this dy's forward")
    dx, vdx = launch.output(out, vdy.shape, vdy.dtype, strides=like_strides(vdy))
    if vdy.size == 0:
        return dx
    state = default_state(dy, stream=launch.stream) if state is None else state
    with launch.on_device():
        state._use(p, launch.handle)
        lib.cudnnDropoutBackward(
            launch.handle,
            state.desc,
            tensor_descriptor_of(vdy),
            vdy.ptr,
            tensor_descriptor_of(vdx),
            vdx.ptr,
            vr.ptr,
            nres,
        )
    return dx
