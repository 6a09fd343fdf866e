"""Random numbers: ``CUDNN_BACKEND_RNG_DESCRIPTOR`` + ``OPERATION_RNG`` (Bernoulli, uniform, normal), seeded by an
int fixed in the graph or by seed/offset device tensors.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ..checks import INT64_MAX, as_int, as_real, choice
from ..constants import RNG_DISTRIBUTIONS
from ..errors import GraphError
from ..tensor import Node, Tensor


def _set_descriptor(op: BackendDescriptor, name: str, value: BackendDescriptor) -> None:
    """Set an attribute that also takes a descriptor where the table lists another type (RNG seed tensor)."""
    arr = (ctypes.c_void_p * 1)(value.ptr)
    lib.cudnnBackendSetAttribute(
        op.ptr,
        lib.cudnnBackendAttributeName_t[name],
        lib.cudnnBackendAttributeType_t.CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1,
        ctypes.cast(arr, ctypes.c_void_p),
    )
    op._keep.append(value)


class RngNodes:
    """The :class:`~cudnnkit.graph.Graph` method that adds RNG nodes."""

    def rng(
        self,
        dims: Sequence[int],
        *,
        seed: Tensor | int,
        offset: Tensor | None = None,
        distribution: str = "bernoulli",
        probability: float = 0.5,
        mean: float = 0.0,
        std: float = 1.0,
        minimum: float = 0.0,
        maximum: float = 1.0,
        strides: Sequence[int] | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Random numbers of ``dims``: ``"bernoulli"`` (1 with ``probability``, else 0), ``"uniform"``
        (``minimum``..``maximum``) or ``"normal"`` (``mean``, ``std``).

        ``seed`` is an int (fixed in the graph) or a one-element int64 device
        tensor; ``offset`` (one-element int64 device tensor) goes with a seed
        tensor. The same seed and offset give the same numbers. cuDNN 9.19
        runs RNG inside the attention pattern (``sdpa_forward(dropout=...)``),
        not alone. Makes ``CUDNN_BACKEND_RNG_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR``.
        """
        choice(distribution, RNG_DISTRIBUTIONS, "distribution")
        attrs: dict[str, Any] = {"distribution": distribution}
        if distribution == "bernoulli":
            probability = as_real(probability, "probability")
            if not 0.0 <= probability <= 1.0:
                raise GraphError(f"probability must be within [0, 1], got {probability}")
            attrs["probability"] = probability
        elif distribution == "uniform":
            minimum, maximum = as_real(minimum, "minimum"), as_real(maximum, "maximum")
            if not minimum < maximum:
                raise GraphError(f"uniform needs minimum < maximum, got {minimum}, {maximum}")
            attrs.update(minimum=minimum, maximum=maximum)
        else:
            mean, std = as_real(mean, "mean"), as_real(std, "std")
            if not std > 0:
                raise GraphError(f"normal needs std > 0, got {std}")
            attrs.update(mean=mean, std=std)
        ins: dict[str, Tensor] = {}
        if isinstance(seed, Tensor):
            ins["seed"] = self._own(seed, "seed")
        elif isinstance(seed, int) and not isinstance(seed, bool):
            attrs["seed"] = as_int(seed, "seed", minimum=-INT64_MAX - 1)
        else:
            raise TypeError(f"seed must be an int or a Tensor, got {type(seed).__name__}")
        if offset is not None:
            if "seed" not in ins:
                raise GraphError("offset= goes with a seed tensor (cuDNN takes both from device memory)")
            ins["offset"] = self._own(offset, "offset")
        elif "seed" in ins:
            raise GraphError("a seed tensor needs an offset= tensor")
        for role, t in ins.items():
            if math.prod(t.dims) != 1 or t.dtype != "int64":
                raise GraphError(f"{role} must be a one-element int64 tensor, got {t.dims} {t.dtype}")
        y = self.tensor(dims, strides, dtype or self.intermediate_dtype, virtual=True, name=name or "rng")
        self._add("rng", attrs, ins, {"y": y})
        return y


def lower_rng(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_RNG_DESCRIPTOR`` (distribution and its parameters), then ``OPERATION_RNG`` (Y, and
    the seed: a value, or the seed and offset tensors)."""
    ins, outs, a = dict(n.inputs), dict(n.outputs), dict(n.attrs)
    rg = BackendDescriptor("CUDNN_BACKEND_RNG_DESCRIPTOR")
    rg.set("CUDNN_ATTR_RNG_DISTRIBUTION", RNG_DISTRIBUTIONS[a["distribution"]])
    for key, attr in (
        ("probability", "BERNOULLI_DIST_PROBABILITY"),
        ("minimum", "UNIFORM_DIST_MINIMUM"),
        ("maximum", "UNIFORM_DIST_MAXIMUM"),
        ("mean", "NORMAL_DIST_MEAN"),
        ("std", "NORMAL_DIST_STANDARD_DEVIATION"),
    ):
        if key in a:
            rg.set(f"CUDNN_ATTR_RNG_{attr}", a[key])
    rg.finalize()
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_RNG_DESC", rg).set("CUDNN_ATTR_OPERATION_RNG_YDESC", tds[outs["y"]])
    if "seed" in ins:
        _set_descriptor(op, "CUDNN_ATTR_OPERATION_RNG_SEED", tds[ins["seed"]])
        op.set("CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC", tds[ins["offset"]])
    else:
        op.set("CUDNN_ATTR_OPERATION_RNG_SEED", a["seed"])
    return op.finalize(), rg


#: node kind -> its lowering
LOWER = {"rng": lower_rng}
