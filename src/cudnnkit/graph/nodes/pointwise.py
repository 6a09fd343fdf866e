"""Pointwise operations: every ``cudnnPointwiseMode_t`` (``CUDNN_BACKEND_POINTWISE_DESCRIPTOR`` +
``CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR``): unary ``y = f(x)``, binary ``y = f(x, b)``,
``BINARY_SELECT`` ``y = t ? x : b``, and the activation backward modes ``dx = f'(x) * dy``.
"""

from __future__ import annotations

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime import canonical, cudnn_dtype
from ..checks import as_bool, as_int, as_real, broadcast
from ..constants import POINTWISE_ARITY, POINTWISE_MODES, PW_PARAMS
from ..errors import GraphError
from ..tensor import Node, Tensor


class PointwiseNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add pointwise nodes."""

    def pointwise(
        self,
        mode: str,
        x: Tensor,
        b: Tensor | None = None,
        t: Tensor | None = None,
        *,
        dy: Tensor | None = None,
        compute_dtype: str | None = None,
        dtype: str | None = None,
        alpha1: float = 1.0,
        alpha2: float = 1.0,
        nan_propagation: bool | None = None,
        name: str = "",
        **params: float,
    ) -> Tensor:
        """One ``cudnnPointwiseMode_t`` (by name, e.g. ``"ADD"``, ``"RELU_FWD"``, ``"GELU_BWD"``).

        Unary modes take ``x``; binary ones ``x`` and ``b``; ``BINARY_SELECT``
        ``x``, ``b`` and the condition ``t``; the ``*_BWD`` modes ``x`` and
        ``dy`` and return ``dx``. Inputs broadcast (same rank, dims equal or 1).
        Mode parameters as keywords: ``relu_lower_clip``, ``relu_upper_clip``,
        ``relu_lower_clip_slope``, ``elu_alpha``, ``softplus_beta``,
        ``swish_beta``, ``axis`` (``GEN_INDEX``). ``alpha1``/``alpha2`` (float32 in cuDNN) and the float
        parameters must be finite real numbers, ``axis`` an int naming one of ``x``'s dims (negative: from
        the end). ``nan_propagation`` (``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION``): True asks for
        ``CUDNN_PROPAGATE_NAN``, False for ``CUDNN_NOT_PROPAGATE_NAN``; None (the default) leaves the attribute
        unset, cuDNN's default. cuDNN 9's header marks the attribute deprecated. Measured on an H100 with cuDNN 9.19
        (``tests/gpu/nan_relu_probe.py``): the fused ``RELU_FWD`` after a convolution or a batch norm returns NaN
        for a NaN with the attribute or without it (same plan, same time), and ``MAX(y, 0)`` drops the NaN either
        way.
        """
        key = mode.upper().removeprefix("CUDNN_POINTWISE_") if isinstance(mode, str) else None
        if key not in POINTWISE_ARITY:
            raise GraphError(f"unknown pointwise mode {mode!r}; one of {sorted(POINTWISE_ARITY)}")
        lib.require(f"CUDNN_POINTWISE_{key}", f"pointwise mode {key!r}")  # newer than the loaded cuDNN: refused here
        arity = POINTWISE_ARITY[key]
        given = {"x": x, "b": b, "t": t, "dy": dy}
        needed = arity.split(",")
        for role, tensor in given.items():
            if role in needed and tensor is None:
                raise GraphError(f"pointwise {key} needs {', '.join(needed)}; {role} is missing")
            if role not in needed and tensor is not None:
                raise GraphError(f"pointwise {key} takes {', '.join(needed)}, not {role}")
        ins = {r: self._own(given[r], r) for r in needed}
        for p in params:
            if p not in PW_PARAMS:
                raise TypeError(f"unknown pointwise parameter {p!r}; one of {sorted(PW_PARAMS)}")
            if key not in PW_PARAMS[p][1]:
                raise GraphError(f"{p} applies to {PW_PARAMS[p][1]}, not {key}")
        if key == "GEN_INDEX" and "axis" not in params:
            raise GraphError("pointwise GEN_INDEX needs axis= (the dim whose index it generates)")
        values = {}
        for p, v in params.items():
            if p == "axis":
                nd = ins["x"].ndim
                a = as_int(v, "axis")
                if not -nd <= a < nd:
                    raise GraphError(f"axis {a} is out of range for x of rank {nd}")
                values[p] = a % nd
            else:
                values[p] = as_real(v, p)
        order = ["dy", "x"] if arity == "dy,x" else needed
        dims = broadcast([ins[r].dims for r in order], order)
        attrs = {
            "mode": key,
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
            "alpha1": as_real(alpha1, "alpha1", dtype="float32"),
            "alpha2": as_real(alpha2, "alpha2", dtype="float32"),
            **values,
        }
        if nan_propagation is not None:
            attrs["nan_propagation"] = as_bool(nan_propagation, "nan_propagation")
        out = self._out(dims, ins["x"], dtype, name or key.lower())
        self._add("pointwise", attrs, ins, {"dx" if arity == "dy,x" else "y": out})
        return out

    def _pw(
        self,
        mode: str,
        x: Tensor,
        b: Tensor | None = None,
        t: Tensor | None = None,
        *,
        dtype=None,
        compute=None,
        out: Tensor | None = None,
        name: str = "",
        **params,
    ) -> Tensor:
        """A pointwise node on internal tensors (no public-argument checks; dims follow x)."""
        if out is None:
            out = self._vt(x.dims, dtype or self.intermediate_dtype, name or mode.lower())
        ins = {"x": x}
        if b is not None:
            ins["b"] = b
        if t is not None:
            ins["t"] = t
        attrs = {
            "mode": mode,
            "compute_dtype": canonical(compute or self.compute_dtype, "compute_dtype"),
            "alpha1": 1.0,
            "alpha2": 1.0,
            **params,
        }
        self._add("pointwise", attrs, ins, {"y": out})
        return out


def lower_pointwise(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_POINTWISE_DESCRIPTOR`` (mode, math precision, mode parameters, NaN propagation), then the
    ``OPERATION_POINTWISE`` node (X, B, T, DY/DX or Y, ALPHA1, ALPHA2)."""
    ins, outs, a = dict(n.inputs), dict(n.outputs), dict(n.attrs)
    pw = BackendDescriptor("CUDNN_BACKEND_POINTWISE_DESCRIPTOR")
    pw.set("CUDNN_ATTR_POINTWISE_MODE", POINTWISE_MODES["CUDNN_POINTWISE_" + a["mode"]])
    pw.set("CUDNN_ATTR_POINTWISE_MATH_PREC", cudnn_dtype(a["compute_dtype"]))
    for p, (attr, _) in PW_PARAMS.items():
        if p in a:
            pw.set(attr, a[p])
    if "nan_propagation" in a:
        pw.set(
            "CUDNN_ATTR_POINTWISE_NAN_PROPAGATION",
            lib.CUDNN_PROPAGATE_NAN if a["nan_propagation"] else lib.CUDNN_NOT_PROPAGATE_NAN,
        )
    pw.finalize()
    op = BackendDescriptor("CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")
    op.set("CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR", pw)
    op.set("CUDNN_ATTR_OPERATION_POINTWISE_XDESC", tds[ins["x"]])
    if "b" in ins:
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_BDESC", tds[ins["b"]])
    if "t" in ins:
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_TDESC", tds[ins["t"]])
    if "dy" in ins:
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_DYDESC", tds[ins["dy"]])
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_DXDESC", tds[outs["dx"]])
    else:
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_YDESC", tds[outs["y"]])
    op.set("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1", a["alpha1"])
    if "b" in ins:
        op.set("CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2", a["alpha2"])
    return op.finalize(), pw


#: node kind -> its lowering
LOWER = {"pointwise": lower_pointwise}
