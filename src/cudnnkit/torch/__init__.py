"""L3: the PyTorch integration.

* :data:`ops`: every differentiable op (:mod:`cudnnkit.autograd`) as a ``torch.library`` custom op
  (``torch.ops.cudnnkit.<name>``, and ``<name>_backward``) with ``register_fake`` and an autograd kernel, made
  from its declaration (:mod:`cudnnkit.torch._library`): ``cudnnkit.torch.ops.convolution(x, w, padding=1)``
  takes torch tensors, returns torch tensors, and works under autograd, ``torch.compile(fullgraph=True)``,
  ``gradcheck`` and ``opcheck``.

Importing this module imports torch; nothing below it does (the L2 ops reach torch only through the adapter).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .. import autograd as _autograd
from ._library import TorchOp, decode, define, encode

__all__ = ["ops", "TorchOp", "define", "encode", "decode", "op"]

_defined: dict[str, TorchOp] = {}


def op(name: str) -> TorchOp:
    """The :class:`TorchOp` of differentiable op ``name`` (its custom ops defined on first use)."""
    got = _defined.get(name)
    if got is None:
        got = _defined[name] = define(_autograd.get(name))
    return got


#: every differentiable op by name: ``ops.softmax(x, axis=-1)``
ops: Any = SimpleNamespace(**{name: op(name) for name in _autograd.functions()})


# cudnnkit.torch.nn (the torch.nn twins) and cudnnkit.torch.convert(model) (swaps them in), imported on first use
def __getattr__(name: str) -> Any:
    if name in ("nn", "convert"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
