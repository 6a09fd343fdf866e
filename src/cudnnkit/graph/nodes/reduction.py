"""Reductions: ``CUDNN_BACKEND_REDUCTION_DESCRIPTOR`` + ``OPERATION_REDUCTION`` (add, mul, min, max, amax, avg, norm1,
norm2, mul_no_zeros) of a tensor to dims that are each the input's or 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...lib.backend import BackendDescriptor
from ...runtime import canonical, cudnn_dtype
from ..checks import as_ints, choice
from ..constants import REDUCTIONS
from ..errors import GraphError
from ..tensor import Node, Tensor


class ReductionNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add reduction nodes."""

    def reduction(
        self,
        x: Tensor,
        out_dims: Sequence[int],
        *,
        mode: str = "add",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Reduce ``x`` to ``out_dims`` (same rank; each dim equal to x's or 1) with ``mode``:
        add, mul, min, max, amax, avg, norm1, norm2, mul_no_zeros."""
        x = self._own(x, "x")
        choice(mode, REDUCTIONS, "mode", "reduction mode")
        out_dims = as_ints(out_dims, "out_dims")
        if len(out_dims) != x.ndim or any(o not in (1, d) for o, d in zip(out_dims, x.dims)):
            raise GraphError(f"out_dims={out_dims} for a reduction of x {x.dims}: each output dim is x's or 1")
        attrs = {"mode": mode, "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype")}
        y = self._out(out_dims, x, dtype, name or f"reduce_{mode}")
        self._add("reduction", attrs, {"x": x}, {"y": y})
        return y

    def _red(
        self, x: Tensor, dims, *, mode: str = "add", dtype=None, out: Tensor | None = None, name: str = ""
    ) -> Tensor:
        if out is None:
            out = self._vt(dims, dtype or self.intermediate_dtype, name)
        self._add("reduction", {"mode": mode, "compute_dtype": "float32"}, {"x": x}, {"y": out})
        return out


def lower_reduction(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_REDUCTION_DESCRIPTOR`` (operator, compute type), then ``OPERATION_REDUCTION``
    (X, Y)."""
    ins, outs, a = dict(n.inputs), dict(n.outputs), dict(n.attrs)
    rd = BackendDescriptor("CUDNN_BACKEND_REDUCTION_DESCRIPTOR")
    rd.set("CUDNN_ATTR_REDUCTION_OPERATOR", REDUCTIONS[a["mode"]])
    rd.set("CUDNN_ATTR_REDUCTION_COMP_TYPE", cudnn_dtype(a["compute_dtype"])).finalize()
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_REDUCTION_XDESC", tds[ins["x"]])
    op.set("CUDNN_ATTR_OPERATION_REDUCTION_YDESC", tds[outs["y"]]).set("CUDNN_ATTR_OPERATION_REDUCTION_DESC", rd)
    return op.finalize(), rd


#: node kind -> its lowering
LOWER = {"reduction": lower_reduction}
