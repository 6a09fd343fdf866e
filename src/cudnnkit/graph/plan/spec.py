"""What a plan binds, and the checks of bindings before any GPU work.

:class:`PlanSpec` holds a plan's non-virtual tensors, by-value constants, scratch tensors, outputs, pointer
alignment and device, in pure Python (it is what a serialized plan saves); :meth:`PlanSpec.resolve` checks
bindings (shape, strides, dtype, device, alignment; a raw pointer's device and allocation through the CUDA
driver) and packs by-value scalars into the bytes the GPU reads. :func:`checked_stream` checks ``stream=``.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ... import runtime
from ...runtime.arrays import as_view
from ...runtime.dtypes import itemsize as _itemsize
from ...runtime.view import is_contiguous
from ..errors import BindingError
from ..tensor import PlanGraph, Tensor

__all__ = ["PlanSpec", "Resolved", "check_pointer", "checked_stream"]


def _tensor_specs(tensors: Iterable[Tensor]) -> dict[int, Tensor]:
    return {t.uid: t for t in sorted(tensors, key=lambda t: t.uid) if not t.virtual}


_PACK = {
    "float32": "f",
    "float64": "d",
    "float16": "e",
    "int32": "i",
    "int64": "q",
    "int8": "b",
    "uint8": "B",
    "bool": "?",
}


def _scalar_bytes(value: Any, dtype: str, label: str) -> bytes:
    """A by-value tensor's host value in its data type (little-endian, as the GPU reads it).

    ``value``: a Python number or a NumPy scalar (arrays, device or host, are refused: a by-value tensor is
    passed by cuDNN as a host scalar). Integer dtypes take integers within their range, ``bool`` a bool or
    0/1; float dtypes any real number (infinities and NaN too: masks fill with ``-inf``) whose magnitude the
    dtype can hold. Anything else is a :class:`BindingError` naming the tensor."""
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()  # a NumPy scalar (np.float32(2), np.int64(3), np.bool_(True))
    if not isinstance(value, (int, float)):
        raise BindingError(
            f"{label} is a by-value scalar: bind a Python number, got {type(value).__module__}.{type(value).__name__}"
        )
    fmt = "bf16" if dtype == "bfloat16" else _PACK.get(dtype)
    if fmt is None:
        raise BindingError(f"{label}: by-value scalars of dtype {dtype} are not supported")
    if fmt == "?":
        if value not in (0, 1) or isinstance(value, float):
            raise BindingError(f"{label} is a bool by-value scalar: bind True/False (or 0/1), got {value!r}")
        return struct.pack("<?", bool(value))
    if isinstance(value, bool):
        raise BindingError(f"{label} is a {dtype} by-value scalar: bind a number, not the bool {value!r}")
    if fmt in "bBiq":
        if not isinstance(value, int):
            raise BindingError(f"{label} is a {dtype} by-value scalar: bind an int, got {value!r}")
        try:
            return struct.pack("<" + fmt, value)
        except struct.error:
            raise BindingError(f"{label}: {value} does not fit the {dtype} by-value scalar") from None
    try:
        return _bfloat16_bytes(float(value)) if fmt == "bf16" else struct.pack("<" + fmt, float(value))
    except OverflowError:
        raise BindingError(f"{label}: {value!r} is outside the range of the {dtype} by-value scalar") from None


def _bfloat16_bytes(value: float) -> bytes:
    """``value`` as a little-endian bfloat16, rounded to nearest even (what a float -> bfloat16 conversion on
    the GPU does); NaN stays a quiet NaN of its sign, overflow rounds to infinity."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    if value != value:  # NaN: keep the sign, force a quiet-NaN mantissa bit (truncation could make it inf)
        return struct.pack("<H", (bits >> 16) | 0x0040)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.pack("<H", (bits >> 16) & 0xFFFF)


def _extent_bytes(t: Tensor) -> int:
    """The bytes a non-virtual tensor's dims and strides address from its pointer. A boolean tensor is bit-packed:
    cuDNN reads element offset ``o`` (``sum(index * stride)``) at bit ``o % 8`` of byte ``o // 8`` (measured on an
    H100 with cuDNN 9.19: a batch-norm forward's ReLU mask, written as a channels-last BOOLEAN output, put channel
    ``c`` in bit ``c % 8`` of byte ``c // 8`` of its pixel, and a MUL reading it back in a batch-norm backward
    graph gave the float64 reference's gradients)."""
    n = 1 + sum((d - 1) * s for d, s in zip(t.dims, t.strides))
    return (n + 7) // 8 if t.dtype == "bool" else n * _itemsize(t.dtype)


def _check_bits(view: Any, nbytes: int, label: str) -> None:
    """A binding of a bit-packed boolean tensor: a dense C-order byte array (uint8 or int8, any shape, e.g.
    ``(N, H, W, C // 8)`` for a channels-last mask) of at least ``nbytes`` bytes. A one-byte-per-element array
    (a NumPy, CuPy or torch ``bool`` array of the tensor's shape) would be read as bits: refused by name."""
    if view.dtype not in ("uint8", "int8"):
        raise BindingError(
            f"{label} is a bit-packed boolean tensor (cuDNN reads one bit per element: offset o at bit o % 8 of "
            f"byte o // 8): bind a uint8 array of at least {nbytes} byte(s), got {view.dtype} {view.shape}"
        )
    if not is_contiguous(view.shape, view.strides):
        raise BindingError(f"{label}: a bit-packed boolean tensor's array must be dense in C order, got strides "
                           f"{view.strides} for shape {view.shape}")  # fmt: skip
    if view.nbytes < nbytes:
        raise BindingError(f"{label}: {view.nbytes} byte(s), the bit-packed boolean tensor needs {nbytes}")


@dataclass
class Resolved:
    ptrs: list[int]  # in uid order; 0 where a scratch buffer is still to be allocated
    scalars: bytes  # every by-value scalar's bytes, part of the variant-pack key
    views: list[Any]
    keep: list[Any]  # host buffers of by-value scalars
    scratch: list[tuple[int, int]]  # (position, uid) of unbound scratch tensors
    by_value: list[int]  # positions of by-value scalars (host buffer addresses, not part of the pack key)
    zero: list[tuple[int, int]]  # (position, uid) of scratch tensors to clear before every execution


class PlanSpec:
    """What a plan binds, in pure Python: non-virtual tensors (uid -> :class:`Tensor`), by-value
    constants fixed by the graph, scratch tensors the executor may allocate (``scratch``: uids, or
    ``{uid: "zero" | None}`` with each one's init policy; ``zero_scratch`` those cleared before every
    execution), output uids, pointer alignment and device. :meth:`resolve` checks bindings against it
    before any GPU work."""

    def __init__(
        self,
        tensors: dict[int, Tensor],
        *,
        device: int,
        alignment: int,
        outputs: Iterable[int] = (),
        constants: Mapping[int, tuple[Any, str]] | None = None,
        scratch: Iterable[int] | Mapping[int, str | None] = (),
        ragged: Iterable[int] = (),
    ):
        self.tensors = dict(sorted(tensors.items()))
        #: ragged (packed) tensors: their extent is in device-side offsets, so a binding is checked for dtype and
        #: device only (an array of any shape; a raw pointer for one element)
        self.ragged = frozenset(int(u) for u in ragged)
        self.device = int(device)
        self.alignment = int(alignment)
        self.outputs = frozenset(outputs)
        self.constants = dict(constants or {})
        init = {int(u): p for u, p in scratch.items()} if isinstance(scratch, Mapping) else dict.fromkeys(scratch)
        bad = {p for p in init.values() if p not in (None, "zero")}
        if bad:
            raise ValueError(f"scratch init policies must be None or 'zero', got {sorted(map(repr, bad))}")
        self.scratch = frozenset(init)
        self.zero_scratch = frozenset(u for u, p in init.items() if p == "zero")
        self.uids = tuple(self.tensors)
        self.labels = {u: f"tensor {t.name or '?'} (uid {u})" for u, t in self.tensors.items()}
        #: the bytes each tensor's dims and strides address from its pointer (what a raw pointer must hold)
        self.nbytes = {
            u: _itemsize(t.dtype) if u in self.ragged else _extent_bytes(t)
            for u, t in self.tensors.items()
            if not t.by_value
        }

    @classmethod
    def of(cls, graph: PlanGraph, device: int) -> PlanSpec:
        produced = {uid for n in graph.nodes() for _, uid in n.outputs}
        tensors = _tensor_specs(graph.tensors())
        constants = graph.constants() if hasattr(graph, "constants") else {}
        scratch = graph.scratch_init()
        ragged = graph.ragged_offsets() if hasattr(graph, "ragged_offsets") else {}
        return cls(
            tensors,
            device=device,
            alignment=graph.alignment,
            outputs=[u for u in tensors if u in produced],
            constants=constants,
            scratch=scratch,
            ragged=[u for u in ragged if u in tensors],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "alignment": self.alignment,
            "outputs": sorted(self.outputs),
            "scratch": sorted(self.scratch),
            "zero_scratch": sorted(self.zero_scratch),
            "ragged": sorted(self.ragged),
            "constants": [[u, v, dt] for u, (v, dt) in sorted(self.constants.items())],
            "tensors": [
                [t.uid, list(t.dims), list(t.strides), t.dtype, t.by_value, t.name] for t in self.tensors.values()
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], device: int) -> PlanSpec:
        tensors = {
            int(u): Tensor(int(u), tuple(dm), tuple(st), dt, False, bool(bv), nm, 0)
            for u, dm, st, dt, bv, nm in d["tensors"]
        }
        zero = {int(u) for u in d.get("zero_scratch", ())}
        scratch = {int(u): ("zero" if int(u) in zero else None) for u in d.get("scratch", ())}
        return cls(
            tensors,
            device=device,
            alignment=int(d["alignment"]),
            outputs=d.get("outputs", ()),
            constants={int(u): (v, dt) for u, v, dt in d.get("constants", ())},
            scratch=scratch,
            ragged=d.get("ragged", ()),
        )

    def _uid_of(self, k: Any) -> int:
        if isinstance(k, Tensor):
            spec = self.tensors.get(k.uid)
            if spec is not None and (spec.dims, spec.strides, spec.dtype) != (k.dims, k.strides, k.dtype):
                raise BindingError(
                    f"binding key uid {k.uid} is {k.dims}/{k.dtype} but the plan's "
                    f"{self.labels[k.uid]} is {spec.dims}/{spec.dtype}: a tensor of another graph?"
                )
            uid = k.uid
        elif isinstance(k, int) and not isinstance(k, bool):
            uid = k
        else:
            raise TypeError(f"binding keys must be Tensors or int uids, got {type(k).__name__}")
        if uid not in self.tensors:
            what = f"tensor {k.name or '?'} (uid {uid})" if isinstance(k, Tensor) else f"uid {uid}"
            if isinstance(k, Tensor) and k.virtual:
                raise BindingError(
                    f"{what} is virtual (an intermediate of the graph): it takes no binding; "
                    "mark_output() it to bind it"
                )
            raise BindingError(
                f"{what} is not a non-virtual tensor of this plan (bindable: "
                f"{[self.labels[u] for u in self.uids if u not in self.constants]})"
            )
        if uid in self.constants:
            raise BindingError(
                f"{self.labels[uid]} is a constant of the graph (value {self.constants[uid][0]}); "
                "it is bound by the plan, not by the caller"
            )
        return uid

    def resolve(self, bindings: Mapping[Any, Any], *, unchecked: bool = False) -> Resolved:
        """Check ``bindings`` (shape, strides, dtype, device, alignment, nothing missing, unknown or bound
        twice) before any GPU work.

        A raw pointer (int) must be a device pointer of the plan's device whose allocation holds the bytes
        the tensor's dims and strides address from it (:func:`cudnnkit.runtime.check_device_pointer`, which
        asks the driver: ``cuPointerGetAttributes``, memory type, device and allocation range), asked after
        every host-side check; ``unchecked=True`` trusts raw pointers (only NULL, out-of-range and
        misaligned ones are refused). Arrays carry their own extent: their shape and strides must be the
        tensor's, so they cover what it addresses."""
        if not isinstance(bindings, Mapping):
            raise TypeError(f"bindings must be a mapping of Tensor (or uid) -> array, got {type(bindings).__name__}")
        by_uid = {self._uid_of(k): v for k, v in bindings.items()}
        if len(by_uid) != len(bindings):
            seen: set[int] = set()
            for k in bindings:
                uid = self._uid_of(k)
                if uid in seen:
                    raise BindingError(f"{self.labels[uid]} is bound twice (by its Tensor and by its uid)")
                seen.add(uid)
        missing = [
            self.labels[u] for u in self.uids if u not in by_uid and u not in self.constants and u not in self.scratch
        ]
        if missing:
            raise BindingError(f"unbound: {', '.join(missing)}; every non-virtual tensor needs an array or pointer")
        r = Resolved([], b"", [], [], [], [], [])
        to_check: list[tuple[int, int, str]] = []  # (pointer, bytes addressed, label) of raw pointers
        for uid in self.uids:
            spec, label = self.tensors[uid], self.labels[uid]
            if uid in self.zero_scratch:
                r.zero.append((len(r.ptrs), uid))
            if spec.by_value:
                value = self.constants[uid][0] if uid in self.constants else by_uid[uid]
                raw = _scalar_bytes(value, spec.dtype, label)
                buf = ctypes.create_string_buffer(raw, max(len(raw), 8))
                r.keep.append(buf)
                r.by_value.append(len(r.ptrs))
                r.ptrs.append(ctypes.addressof(buf))
                r.scalars += raw
                continue
            if uid not in by_uid:  # scratch the executor allocates
                r.scratch.append((len(r.ptrs), uid))
                r.ptrs.append(0)
                continue
            v = by_uid[uid]
            if isinstance(v, int) and not isinstance(v, bool):
                if not 0 < v < 2**64:
                    raise BindingError(f"{label}: raw pointer {v} is not a device pointer")
                p = v
                if not unchecked:
                    to_check.append((p, self.nbytes[uid], label))
            else:
                view = as_view(v, label)
                bits = spec.dtype == "bool"  # bit-packed: a byte array holding the bits (_check_bits)
                if bits:
                    _check_bits(view, self.nbytes[uid], label)
                elif view.dtype != spec.dtype:
                    raise BindingError(f"{label}: dtype {view.dtype}, the plan expects {spec.dtype}")
                # any shape: a ragged tensor's offsets (on the device) place each sample; a bit-packed one is bytes
                ragged = bits or uid in self.ragged
                if not ragged and view.shape != spec.dims:
                    raise BindingError(f"{label}: shape {view.shape}, the plan expects {spec.dims}")
                if (
                    not ragged
                    and view.strides != spec.strides
                    and any(a != b for d, a, b in zip(spec.dims, view.strides, spec.strides) if d != 1)
                ):
                    raise BindingError(
                        f"{label}: strides {view.strides}, the plan expects {spec.strides} "
                        "(make the array match, e.g. channels-last, or define the graph from it)"
                    )
                if view.device != self.device:
                    raise BindingError(
                        f"{label}: on cuda:{view.device}, but the plan was built for device={self.device}: bind "
                        f"arrays of cuda:{self.device}, or build the graph with device={view.device}"
                    )
                if view.readonly and uid in self.outputs:
                    raise BindingError(f"{label}: read-only array bound to an output")
                p = view.ptr
                r.views.append(view)
            if p % self.alignment:
                raise BindingError(
                    f"{label}: pointer {p:#x} is not aligned to {self.alignment} bytes (the graph's alignment=)"
                )
            r.ptrs.append(p)
        for p, nbytes, label in to_check:  # the driver's answers, after every host-side check
            check_pointer(p, nbytes, self.device, label)
        return r


def check_pointer(ptr: int, nbytes: int, device: int, label: str) -> None:
    """:func:`cudnnkit.runtime.check_device_pointer`, its ``ValueError`` as a :class:`BindingError`."""
    try:
        runtime.check_device_pointer(ptr, nbytes, device, label)
    except BindingError:
        raise
    except ValueError as e:
        msg = str(e)
        if "cannot be checked" in msg:
            msg += "; unchecked=True trusts raw pointers as given"
        raise BindingError(msg) from e


def checked_stream(stream: Any, adapter: Any, device: int, name: str = "stream", producer: bool = False) -> int:
    """``stream=`` as a ``cudaStream_t``: ``None`` is the library's current stream (0 without a library);
    anything else (an int, a CuPy/torch/``__cuda_stream__`` stream) must be a live CUDA stream
    (:func:`cudnnkit.runtime.validate_stream`: ``TypeError``/``ValueError`` naming ``stream``) before
    ``cudnnSetStream`` sees it (an arbitrary int there crashes the process)."""
    return runtime.validate_stream(stream, adapter, device, name, producer=producer)
