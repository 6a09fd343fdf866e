"""Data movement: ``OPERATION_RESHAPE`` (new dims, or a transpose through strides) and ``OPERATION_CONCATENATE``
(``CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ...lib.backend import BackendDescriptor
from ..checks import as_int, as_ints
from ..errors import GraphError
from ..tensor import Node, Tensor


class ReshapeNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add reshape and concat nodes."""

    def reshape(
        self,
        x: Tensor,
        dims: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        *,
        perm: Sequence[int] | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """``y``: ``x``'s elements under new ``dims`` (and ``strides``; default C order).

        ``perm`` gives a transpose instead: ``y.dims[i] = x.dims[perm[i]]`` and
        ``y.strides[i] = x.strides[perm[i]]``, the same memory read in another
        order (how attention's backward turns ``P`` into ``P^T``). cuDNN 9.19
        on Hopper runs reshapes inside the attention backward pattern; a lone
        reshape needs cuDNN 9.22 on Blackwell. Makes
        ``CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR``.
        """
        x = self._own(x, "x")
        if perm is not None:
            if dims is not None or strides is not None:
                raise GraphError("reshape takes dims/strides or perm, not both")
            perm = as_ints(perm, "perm")
            if sorted(perm) != list(range(x.ndim)):
                raise GraphError(f"perm {perm} is not a permutation of {x.ndim} axes")
            dims = tuple(x.dims[p] for p in perm)
            strides = tuple(x.strides[p] for p in perm)
        elif dims is None:
            raise GraphError("reshape needs dims= or perm=")
        dims = as_ints(dims, "dims")
        if math.prod(dims) != math.prod(x.dims):
            raise GraphError(
                f"reshape of {x.dims} ({math.prod(x.dims)} elements) to {dims} ({math.prod(dims)} elements)"
            )
        y = self.tensor(dims, strides, dtype or x.dtype, virtual=True, name=name or "reshape")
        self._add("reshape", {"perm": perm}, {"x": x}, {"y": y})
        return y

    def concat(
        self,
        inputs: Sequence[Tensor],
        axis: int,
        *,
        inplace_index: int | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Join ``inputs`` (one rank, dims equal but along ``axis``) along ``axis``.

        ``inplace_index``: the input that already lies inside the output's
        memory (cuDNN then skips copying it). cuDNN 9.19 fuses it after a
        convolution (``conv_fprop`` -> ``concat``); a lone concat needs cuDNN
        9.22 on Blackwell. Makes ``CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR``.
        """
        if isinstance(inputs, (Tensor, str, bytes)) or not hasattr(inputs, "__iter__"):
            raise TypeError(f"inputs must be a sequence of Tensors, got {type(inputs).__name__}")
        ts = [self._own(t, f"inputs[{i}]") for i, t in enumerate(inputs)]
        if not ts:
            raise GraphError("concat needs at least one input")
        nd = ts[0].ndim
        axis = as_int(axis, "axis")
        if not -nd <= axis < nd:
            raise GraphError(f"axis {axis} is out of range for rank {nd}")
        axis %= nd
        for i, t in enumerate(ts[1:], 1):
            if t.ndim != nd or any(a != b for j, (a, b) in enumerate(zip(t.dims, ts[0].dims)) if j != axis):
                raise GraphError(f"inputs[{i}] {t.dims} does not match inputs[0] {ts[0].dims} outside axis {axis}")
        if inplace_index is not None:
            inplace_index = as_int(inplace_index, "inplace_index")
        if inplace_index is not None and not 0 <= inplace_index < len(ts):
            raise GraphError(f"inplace_index {inplace_index} is out of range for {len(ts)} inputs")
        dims = list(ts[0].dims)
        dims[axis] = sum(t.dims[axis] for t in ts)
        y = self._out(tuple(dims), ts[0], dtype or ts[0].dtype, name or "concat")
        self._add(
            "concat", {"axis": axis, "inplace_index": inplace_index}, {f"x{i}": t for i, t in enumerate(ts)}, {"y": y}
        )
        return y


def lower_reshape(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``OPERATION_RESHAPE`` (X, Y)."""
    ins, outs = dict(n.inputs), dict(n.outputs)
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_RESHAPE_XDESC", tds[ins["x"]]).set(
        "CUDNN_ATTR_OPERATION_RESHAPE_YDESC", tds[outs["y"]]
    )
    return op.finalize(), None


def lower_concat(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``OPERATION_CONCAT`` (axis, inputs, in-place index, output)."""
    outs, a = dict(n.outputs), dict(n.attrs)
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_CONCAT_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_CONCAT_AXIS", a["axis"])
    op.set("CUDNN_ATTR_OPERATION_CONCAT_INPUT_DESCS", [tds[uid] for _, uid in n.inputs])
    if a["inplace_index"] is not None:
        op.set("CUDNN_ATTR_OPERATION_CONCAT_INPLACE_INDEX", a["inplace_index"])
    op.set("CUDNN_ATTR_OPERATION_CONCAT_OUTPUT_DESC", tds[outs["y"]])
    return op.finalize(), None


#: node kind -> its lowering
LOWER = {"reshape": lower_reshape, "concat": lower_concat}
