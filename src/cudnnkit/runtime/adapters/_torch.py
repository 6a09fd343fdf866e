"""torch adapter: views of CUDA tensors, allocation through the caching allocator, current stream."""

from __future__ import annotations

from typing import Any

import torch

from ..arrays import ArrayView
from ..dtypes import canonical
from ._protocol import ArrayAdapter, has_interface, missing_members

_TO_TORCH = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _n):
        _TO_TORCH[_n] = getattr(torch, _n)


_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
_DEVICES: dict[int, torch.device] = {}

# torch's raw current-stream query (what Triton uses): an int, without building a Stream object
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _torch_stream(stream: int, dev: torch.device) -> Any:
    """The torch stream object for a raw handle: 0 and 1 (``cudaStreamLegacy``) are the legacy default stream,
    torch's default stream; 2 (``cudaStreamPerThread``) has no torch object, so torch's allocator could not order
    memory reuse on it: refused, naming ``stream``."""
    if stream in (0, 1):
        return torch.cuda.default_stream(dev)
    if stream == 2:
        TorchAdapter.refuse_special_stream(2)
    return torch.cuda.ExternalStream(stream, device=dev)


class TorchAdapter(ArrayAdapter):
    """The :class:`~cudnnkit.runtime.adapters.ArrayAdapter` of torch (CUDA tensors, the caching allocator,
    torch's current stream)."""

    name = "torch"
    module = torch
    types = (torch.Tensor, torch.nn.Parameter)

    def key(self, obj: Any) -> tuple | None:
        """The express path's key of a tensor (see :mod:`cudnnkit.runtime.adapters`): a CUDA, strided tensor of
        a dtype cuDNN has, with memory (a null pointer: empty, or one of torch's zero tensors) holding its values
        as they are (no negative bit), else None: such a tensor takes the full path, where :meth:`view` names it."""
        d = obj.get_device()
        if d < 0 or obj.layout is not torch.strided:
            return None
        dt = _FROM_TORCH.get(obj.dtype)
        if dt is None:
            return None
        p = obj.data_ptr()
        if not p or obj.is_neg():
            return None
        return (self, dt, obj.shape, obj.stride(), d), p, self

    #: the data pointer of a tensor whose :meth:`key` is known (the replay path)
    pointer = staticmethod(torch.Tensor.data_ptr)

    def view(self, obj: Any, name: str) -> ArrayView:
        if not isinstance(obj, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(obj).__name__}")
        if not obj.is_cuda:
            raise TypeError(
                f"{name} is a torch tensor on {obj.device}; cudnnkit needs a CUDA tensor (move it with .cuda())"
            )
        if obj.layout is not torch.strided:
            raise TypeError(f"{name} must be a dense strided tensor, got layout {obj.layout}")
        dtype = _FROM_TORCH.get(obj.dtype)
        if dtype is None:
            raise TypeError(f"{name} has dtype {obj.dtype}, which cuDNN does not support")
        # what cuDNN would read wrong: a lazily negated view holds the values un-negated (``conj().imag``), and a
        # zero tensor has no memory (a null data pointer)
        if obj.is_neg():
            raise TypeError(
                f"{name} has torch's negative bit set (a lazily negated view, such as the imaginary part of a "
                "conjugate): its memory holds the values un-negated; pass .resolve_neg() of it"
            )
        if obj._is_zerotensor():
            raise TypeError(f"{name} is one of torch's zero tensors, which have no memory; pass torch.zeros_like of it")
        return ArrayView(tuple(obj.shape), obj.stride(), dtype, obj.get_device(), obj.data_ptr(), obj, self, False)

    def is_device_array(self, obj: Any) -> bool | None:
        """True for a CUDA tensor (or storage: anything of torch's whose ``is_cuda`` is True); None otherwise, so
        a CPU tensor is judged by its DLPack device (the CPU)."""
        return True if getattr(obj, "is_cuda", False) is True else None

    @staticmethod
    def refuse_special_stream(stream: int, name: str = "stream") -> None:
        """``cudaStreamPerThread`` (2) has no torch stream object: torch's allocator cannot order reuse on it."""
        if stream == 2:
            raise ValueError(
                f"{name}=2 (cudaStreamPerThread) has no torch stream object, so torch's caching allocator cannot "
                "order memory on it; pass torch.cuda.current_stream() or a torch.cuda.Stream"
            )

    def torch_dtype(self, dtype: str) -> torch.dtype:
        return _TO_TORCH[canonical(dtype)]

    def empty(self, shape, dtype: str, device: int, strides=None, stream: int | None = None) -> torch.Tensor:
        # every op call allocates its outputs here: the device object is made once per ordinal
        dev = _DEVICES.get(device)
        if dev is None:
            dev = _DEVICES[device] = torch.device("cuda", device)
        td = _TO_TORCH.get(dtype)
        if td is None:
            td = self.torch_dtype(dtype)
        try:
            if stream is not None and stream != self.current_stream(device):
                with torch.cuda.stream(_torch_stream(stream, dev)):
                    return self._empty(shape, td, dev, strides)
            return self._empty(shape, td, dev, strides)
        except torch.cuda.OutOfMemoryError as e:
            raise MemoryError(str(e).split("\n")[0]) from e

    def wrap(self, obj: Any, device: int) -> torch.Tensor:
        if isinstance(obj, torch.Tensor):
            return obj
        if has_interface(obj):
            try:
                return torch.as_tensor(obj, device=torch.device("cuda", device))
            except (TypeError, ValueError, RuntimeError):
                if not hasattr(obj, "__dlpack__"):
                    raise
        return torch.from_dlpack(obj)  # e.g. bfloat16, which __cuda_array_interface__ cannot name

    @staticmethod
    def _empty(shape, td, dev, strides):
        if strides is None:
            return torch.empty(tuple(shape), dtype=td, device=dev)
        return torch.empty_strided(tuple(shape), tuple(strides), dtype=td, device=dev)

    def from_numpy(self, a, device: int, stream: int | None = None) -> torch.Tensor:
        import numpy

        a = numpy.asarray(a)
        if stream is not None and stream != self.current_stream(device):
            with torch.cuda.stream(_torch_stream(stream, torch.device("cuda", device))):
                return self.from_numpy(a, device)
        if a.dtype.name == "bfloat16":  # ml_dtypes: go through float32
            return torch.from_numpy(a.astype(numpy.float32)).to(f"cuda:{device}", torch.bfloat16)
        return torch.from_numpy(numpy.ascontiguousarray(a)).to(f"cuda:{device}")

    def to_numpy(self, t: torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()

    def contiguous(self, arr: torch.Tensor, stream: int | None = None) -> torch.Tensor:
        if stream is not None and stream != self.current_stream(arr.get_device()):
            with torch.cuda.stream(_torch_stream(stream, arr.device)):
                return arr.contiguous()
        return arr.contiguous()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: int | None = None) -> None:
        if stream is not None and stream != self.current_stream(dst.get_device()):
            with torch.cuda.stream(_torch_stream(stream, dst.device)):
                dst.copy_(src)
            return
        dst.copy_(src)

    def current_stream(self, device: int) -> int:
        if _raw_stream is not None:
            return _raw_stream(device)
        return torch.cuda.current_stream(device).cuda_stream

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def device_guard(self, device: int):
        return torch.cuda.device(device)

    def pointer_device(self, ptr: int) -> int | None:
        return None  # torch has no public pointer-attribute query

    def version(self) -> str:
        return torch.__version__

    def device_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def device_info(self, i: int) -> tuple[str, tuple[int, int]]:
        return torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i))

    def synchronize(self, device: int) -> None:
        torch.cuda.synchronize(device)


ADAPTER = TorchAdapter()
assert not missing_members(TorchAdapter), missing_members(TorchAdapter)
