"""The adapter protocol and device-array detection, on the host (no GPU, no driver needed).

* Both adapter classes implement every member of :class:`cudnnkit.runtime.adapters.ArrayAdapter`, which lists
  every member the runtime and the ops call on an adapter. torch's adapter is imported for real; CuPy's module
  imports ``cupy`` at its top, so without CuPy it is imported over a stand-in ``cupy`` module (the class body
  reads only ``cupy`` and ``cupy.ndarray``), and the stand-in is removed afterwards.
* :func:`cudnnkit.runtime.adapters.is_device_array` answers as ``ops/ctc.py``'s own ``_on_device`` did before it
  moved into the adapters package (the old function is kept below as the reference).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from cudnnkit.runtime import adapters
from cudnnkit.runtime.adapters import MEMBERS, ArrayAdapter, is_device_array, missing_members

SRC = Path(__file__).resolve().parents[1] / "src" / "cudnnkit"


# ----------------------------------------------------------------- the protocol


def test_protocol_members_are_documented():
    assert {"view", "empty", "wrap", "from_numpy", "to_numpy", "contiguous", "copy", "current_stream"} <= set(MEMBERS)
    assert {"current_device", "device_guard", "pointer_device", "version", "device_count", "device_info"} <= set(
        MEMBERS
    )
    assert {"synchronize", "refuse_special_stream", "is_device_array", "name", "module"} <= set(MEMBERS)
    for n in MEMBERS:
        member = ArrayAdapter.__dict__.get(n)
        if member is not None:
            assert (member.__doc__ or "").strip(), f"ArrayAdapter.{n} has no docstring"
    assert "JAX" in ArrayAdapter.__doc__ and "ADAPTER" in ArrayAdapter.__doc__  # what a new adapter provides


def test_protocol_lists_every_member_the_runtime_and_ops_call():
    """Every ``adapter.X`` / ``ad.X`` / ``self.adapter.X`` / ``launch.adapter.X`` in src names a protocol member."""
    pattern = re.compile(r"\b(?:adapter|ad|gpus_from)\.([A-Za-z_]\w*)\b(?!\s*=[^=])")
    called = set()
    for p in SRC.rglob("*.py"):
        rel = p.relative_to(SRC).as_posix()
        if rel.startswith(("lib/", "runtime/adapters/")):
            continue
        for m in pattern.finditer(p.read_text()):
            called.add(m.group(1))
    assert called, "the pattern found no adapter calls"
    assert called <= set(MEMBERS), sorted(called - set(MEMBERS))


def test_torch_adapter_conforms():
    pytest.importorskip("torch")
    from cudnnkit.runtime.adapters import _torch

    assert ArrayAdapter in _torch.TorchAdapter.__mro__  # explicit: it subclasses the protocol
    assert missing_members(_torch.TorchAdapter) == []
    assert isinstance(_torch.ADAPTER, ArrayAdapter) and adapters.get("torch") is _torch.ADAPTER


def _cupy_adapter_class():
    """CuPy's adapter class: the real module when CuPy is installed, else imported over a stand-in ``cupy``."""
    name = "cudnnkit.runtime.adapters._cupy"
    if importlib.util.find_spec("cupy") is not None:
        return importlib.import_module(name).CupyAdapter
    saved = {k: sys.modules.pop(k) for k in ("cupy", name) if k in sys.modules}
    stand_in = sys.modules["cupy"] = types.ModuleType("cupy")
    stand_in.ndarray = type("ndarray", (), {})  # the class body names the array type (``types``)
    try:
        return importlib.import_module(name).CupyAdapter
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop("cupy", None)
        if hasattr(adapters, "_cupy"):
            delattr(adapters, "_cupy")
        sys.modules.update(saved)


def test_cupy_adapter_conforms():
    cls = _cupy_adapter_class()
    assert ArrayAdapter in cls.__mro__
    assert missing_members(cls) == []
    assert isinstance(cls(), ArrayAdapter)
    assert cls.name == "cupy"
    if importlib.util.find_spec("cupy") is None:
        assert "cupy" not in sys.modules  # the stand-in is gone
        assert "cupy" not in adapters._loaded


def test_cupy_wrap_takes_dlpack_where_the_interface_gives_raw_bytes(monkeypatch):
    """GPU fuzz seed 27 (case 219): a bfloat16 torch tensor came to CuPy through ``__cuda_array_interface__`` as
    raw bytes (dtype ``|V2``), which CuPy then refused to copy into a bfloat16 array. The adapter's ``wrap`` takes
    DLPack instead where the interface view has a void dtype and the object has ``__dlpack__`` (and refuses by
    name one without it); a named dtype keeps the interface view (zero-copy, no DLPack round trip). An interface
    that raises on reading (a torch float8 tensor's ``KeyError``) goes to DLPack too."""
    import contextlib

    import numpy as np

    cls = _cupy_adapter_class()
    seen_dtype = [np.dtype("V2")]
    fake = types.SimpleNamespace(
        ndarray=type("ndarray", (), {}),
        asarray=lambda o: types.SimpleNamespace(dtype=seen_dtype[0], via="interface"),
        from_dlpack=lambda o: types.SimpleNamespace(dtype=np.dtype("float16"), via="dlpack"),
        cuda=types.SimpleNamespace(Device=lambda d: contextlib.nullcontext()),
    )
    monkeypatch.setitem(cls.wrap.__globals__, "cupy", fake)

    class Both:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "|V2", "data": (0, False), "version": 3}

        def __dlpack__(self, stream=None):
            raise AssertionError("the fake from_dlpack does not call it")

    class InterfaceOnly:
        __cuda_array_interface__ = Both.__cuda_array_interface__

    class RaisingInterface:  # a torch float8 tensor's __cuda_array_interface__ raises KeyError
        @property
        def __cuda_array_interface__(self):
            raise KeyError("torch.float8_e4m3fn")

        def __dlpack__(self, stream=None):
            raise AssertionError("the fake from_dlpack does not call it")

    a = cls()
    assert a.wrap(Both(), 0).via == "dlpack"
    with pytest.raises(TypeError, match=r"raw bytes \(dtype \|V2\) and it has no __dlpack__"):
        a.wrap(InterfaceOnly(), 0)  # by name, not a TypeError from inside CuPy later
    assert a.wrap(RaisingInterface(), 0).via == "dlpack"
    seen_dtype[0] = np.dtype("float16")
    assert a.wrap(Both(), 0).via == "interface"
    assert adapters._protocol.has_interface(Both()) and not adapters._protocol.has_interface(RaisingInterface())


def test_missing_members_finds_what_an_adapter_lacks():
    class Partial(ArrayAdapter):
        name = "partial"

        def view(self, obj, name):
            return None

    missing = missing_members(Partial)
    assert "view" not in missing and "name" not in missing
    assert {"empty", "module", "is_device_array"} <= set(missing)

    class Duck:  # no subclassing: isinstance looks at the members present
        name, module = "duck", None

    assert not isinstance(Duck(), ArrayAdapter)
    for n in MEMBERS:
        if n not in ("name", "module"):
            setattr(Duck, n, lambda self, *a, **k: None)
    assert isinstance(Duck(), ArrayAdapter) and missing_members(Duck) == []


def test_importing_the_adapters_imports_no_library():
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from cudnnkit.runtime import adapters\n"
        "from cudnnkit.ops import ctc\n"
        "assert not adapters.is_device_array([1, 2]) and not adapters.is_device_array(np.zeros(3))\n"
        "assert not adapters.is_device_array(object())\n"
        "print(sorted(m for m in ('torch', 'cupy', 'jax') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ----------------------------------------------------------------- is_device_array


def _old_on_device(obj):
    """ops/ctc.py's ``_on_device`` before it moved into the adapters package (the reference)."""
    if isinstance(obj, (list, tuple, range)) or hasattr(obj, "__array_interface__"):
        return False
    try:
        if hasattr(obj, "__cuda_array_interface__"):
            return True
    except Exception:
        return True
    if getattr(obj, "is_cuda", False) is True:
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) != 1
        except Exception:
            return False
    return False


class CAI:
    __cuda_array_interface__ = {"shape": (3,), "typestr": "<i4", "data": (0x7F0000000000, False), "version": 3}


class RefusingCAI:
    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")


class DLPack:
    def __init__(self, dev_type):
        self.dev_type = dev_type

    def __dlpack_device__(self):
        return (self.dev_type, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("never consumed")


class BrokenDLPack:
    def __dlpack_device__(self):
        raise RuntimeError("no device")


class HostArray:
    __array_interface__ = {"shape": (3,), "typestr": "<i4", "data": (0, False), "version": 3}
    __cuda_array_interface__ = CAI.__cuda_array_interface__  # both: host wins, as before


def _objects():
    objs = {
        "list": [1, 2],
        "tuple": (1,),
        "range": range(3),
        "numpy": np.arange(3),
        "numpy scalar": np.int32(3),
        "int": 3,
        "None": None,
        "object": object(),
        "cai": CAI(),
        "refusing cai": RefusingCAI(),
        "dlpack cuda": DLPack(2),
        "dlpack cuda host": DLPack(3),
        "dlpack cpu": DLPack(1),
        "broken dlpack": BrokenDLPack(),
        "host and cai": HostArray(),
    }
    try:
        import torch
    except ImportError:
        return objs
    objs.update(
        {
            "torch cpu": torch.tensor([1, 2]),
            "torch cpu requires_grad": torch.zeros(3, requires_grad=True),
            "torch cpu storage": torch.zeros(3).untyped_storage(),
            "torch meta": torch.empty(3, device="meta"),
            "torch size": torch.Size([3]),
            "torch device": torch.device("cpu"),
        }
    )
    return objs


@pytest.mark.parametrize("name", sorted(_objects()))
def test_is_device_array_answers_as_ctc_did(name):
    obj = _objects()[name]
    assert is_device_array(obj) is _old_on_device(obj)


def test_is_device_array_answers():
    assert is_device_array(CAI()) and is_device_array(RefusingCAI()) and is_device_array(DLPack(2))
    assert not is_device_array(DLPack(1)) and not is_device_array(BrokenDLPack()) and not is_device_array([1])


def test_is_device_array_asks_the_objects_adapter(monkeypatch):
    class Ours:
        """An object of an adapter's library with neither CAI nor DLPack."""

    class Answering:
        def __init__(self, answer):
            self.answer, self.asked = answer, []

        def is_device_array(self, obj):
            self.asked.append(obj)
            return self.answer

    obj = Ours()
    for answer, want in ((True, True), (False, False), (None, False)):
        ad = Answering(answer)
        monkeypatch.setattr(adapters, "for_object", lambda o, ad=ad: ad if o is obj else None)
        assert is_device_array(obj) is want and ad.asked == [obj]
    # an adapter that answers None leaves it to DLPack
    ad = Answering(None)
    gpu = DLPack(2)
    monkeypatch.setattr(adapters, "for_object", lambda o: ad)
    assert is_device_array(gpu) and ad.asked == [gpu]
    # an adapter without the method (an older fake) is skipped
    monkeypatch.setattr(adapters, "for_object", lambda o: object())
    assert is_device_array(gpu) and not is_device_array(Ours())


def test_torch_adapter_is_device_array():
    torch = pytest.importorskip("torch")
    ad = adapters.get("torch")
    assert ad.is_device_array(torch.zeros(2)) is None  # a CPU tensor: DLPack says where it is
    assert is_device_array(torch.zeros(2)) is False
    fake_cuda = types.SimpleNamespace(is_cuda=True)
    assert ad.is_device_array(fake_cuda) is True


def test_torch_adapter_refuses_what_cuda_would_read_wrong():
    """A tensor whose memory does not hold its values as they are: a lazily negated view (torch's negative bit,
    ``conj().imag``: the memory holds them un-negated) or a zero tensor (no memory, a null pointer). The express
    key is None (such a call never matches an entry made for a plain tensor of the same metadata: it would get
    the plain tensor's reading) and the full path's view refuses it by name (a CPU tensor dressed as a CUDA one:
    the checks before it are the device's)."""
    torch = pytest.importorskip("torch")

    class Cuda(torch.Tensor):
        is_cuda = property(lambda self: True)

        def get_device(self):
            return 0

    ad = adapters.get("torch")
    plain = torch.randn(3, 4).as_subclass(Cuda)
    assert ad.key(plain) is not None and ad.view(plain, "x").ptr == plain.data_ptr()
    negated = torch.randn(3, 4, dtype=torch.complex64).conj().imag.as_subclass(Cuda)
    assert negated.is_neg() and negated.dtype == torch.float32
    zero = torch._efficientzerotensor((3, 4)).as_subclass(Cuda)
    assert zero._is_zerotensor() and zero.data_ptr() == 0
    for t, what in ((negated, "negative bit"), (zero, "zero tensors")):
        assert ad.key(t) is None
        with pytest.raises(TypeError, match=f"^dy .*{what}"):
            ad.view(t, "dy")
