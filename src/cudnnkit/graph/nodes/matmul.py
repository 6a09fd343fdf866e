"""Matrix multiplication: ``CUDNN_BACKEND_MATMUL_DESCRIPTOR`` + ``OPERATION_MATMUL``, ``(..., M, K) @ (..., K, N)``."""

from __future__ import annotations

from ...lib.backend import BackendDescriptor
from ...runtime import canonical, cudnn_dtype
from ..checks import broadcast
from ..errors import GraphError
from ..tensor import Node, Tensor


class MatmulNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add matmul nodes."""

    def matmul(
        self, a: Tensor, b: Tensor, *, compute_dtype: str | None = None, dtype: str | None = None, name: str = ""
    ) -> Tensor:
        """``c = a @ b`` over the last two dims, batch dims broadcast: ``(..., M, K) @ (..., K, N)``."""
        a, b = self._own(a, "a"), self._own(b, "b")
        if a.ndim < 2 or a.ndim != b.ndim:
            raise GraphError(f"matmul needs a and b of one rank >= 2, got {a.dims} and {b.dims}")
        if a.dims[-1] != b.dims[-2]:
            raise GraphError(
                f"matmul: a is (..., {a.dims[-2]}, {a.dims[-1]}) but b is (..., {b.dims[-2]}, "
                f"{b.dims[-1]}); K must agree"
            )
        batch = broadcast([a.dims[:-2], b.dims[:-2]], ["a", "b"]) if a.ndim > 2 else ()
        attrs = {"compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype")}
        out = self._out((*batch, a.dims[-2], b.dims[-1]), None, dtype, name or "matmul")
        self._add("matmul", attrs, {"a": a, "b": b}, {"c": out})
        return out

    def _mm(
        self,
        a: Tensor,
        b: Tensor,
        dims,
        *,
        dtype=None,
        out: Tensor | None = None,
        name: str = "",
        m: Tensor | None = None,
        n: Tensor | None = None,
        k: Tensor | None = None,
    ) -> Tensor:
        """An internal matmul; ``m``/``n``/``k``: per-batch GEMM size overrides (int32 ``(B, 1, 1, 1)`` device
        tensors, ``CUDNN_ATTR_OPERATION_MATMUL_GEMM_{M,N,K}_OVERRIDE_DESC``: attention's padding masks)."""
        if out is None:
            out = self._vt(dims, dtype or self.intermediate_dtype, name)
        ins = {"a": a, "b": b}
        for role, t in (("m_override", m), ("n_override", n), ("k_override", k)):
            if t is not None:
                ins[role] = t
        self._add("matmul", {"compute_dtype": "float32"}, ins, {"c": out})
        return out


def lower_matmul(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_MATMUL_DESCRIPTOR`` (compute type), then ``OPERATION_MATMUL`` (A, B, C and the GEMM
    M/N/K override tensors when given)."""
    ins, outs, a = dict(n.inputs), dict(n.outputs), dict(n.attrs)
    mm = BackendDescriptor("CUDNN_BACKEND_MATMUL_DESCRIPTOR")
    mm.set("CUDNN_ATTR_MATMUL_COMP_TYPE", cudnn_dtype(a["compute_dtype"])).finalize()
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_MATMUL_ADESC", tds[ins["a"]]).set("CUDNN_ATTR_OPERATION_MATMUL_BDESC", tds[ins["b"]])
    op.set("CUDNN_ATTR_OPERATION_MATMUL_CDESC", tds[outs["c"]]).set("CUDNN_ATTR_OPERATION_MATMUL_DESC", mm)
    for role in ("m", "n", "k"):
        if f"{role}_override" in ins:
            op.set(f"CUDNN_ATTR_OPERATION_MATMUL_GEMM_{role.upper()}_OVERRIDE_DESC", tds[ins[f"{role}_override"]])
    return op.finalize(), mm


#: node kind -> its lowering
LOWER = {"matmul": lower_matmul}
