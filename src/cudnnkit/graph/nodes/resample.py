"""Pooling through cuDNN's resample: ``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` + ``OPERATION_RESAMPLE_FWD`` (max, with the
index tensor for training; average including or excluding padding) and ``OPERATION_RESAMPLE_BWD``; output sizes
from :func:`cudnnkit.runtime.shapes.pool_output_sizes` (per-dim pre/post padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime import canonical, cudnn_dtype
from ...runtime.shapes import expand, pool_output_sizes
from ..checks import INT32_MAX, as_ints, choice
from ..constants import PADDING_MODES, RESAMPLE_MODES
from ..errors import GraphError
from ..tensor import Node, Tensor

#: tensor roles -> attribute suffixes of ``OPERATION_RESAMPLE_FWD``/``_BWD``
_RESAMPLE_ATTR = {"x": "XDESC", "y": "YDESC", "index": "IDXDESC", "dy": "DYDESC", "dx": "DXDESC"}


def _check_resample_dtype(mode: str, dtype: str, role: str) -> None:
    """bfloat16 average pooling is refused: measured on an H200 with cuDNN 9.19, both engines that take it (eng2,
    eng3) write wrong values or NaN (issue 10's fuzzer, then a probe); float16 and float32 are exact."""
    if dtype == "bfloat16" and str(mode).startswith("avg"):
        raise GraphError(
            f"{role} is bfloat16: cuDNN 9.19 computes bfloat16 average pooling wrong on Hopper with every engine "
            f"(measured on an H200); use float16 or float32 for mode={mode!r}"
        )


class ResampleNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add resample (pooling) nodes."""

    def _resample_attrs(
        self,
        nsp: int,
        mode: str,
        window,
        stride,
        pre_padding,
        post_padding,
        padding_mode,
        nan_propagation: bool,
        compute_dtype: str | None,
    ) -> dict[str, Any]:
        choice(mode, RESAMPLE_MODES, "mode")
        if window is None:
            raise GraphError("window is required (one size per spatial dim, or one int for all)")
        window = expand(window, nsp, "window", 1, INT32_MAX)
        attrs = {
            "mode": mode,
            "window": window,
            "stride": expand(window if stride is None else stride, nsp, "stride", 1, INT32_MAX),
            "pre_padding": expand(pre_padding, nsp, "pre_padding", 0, INT32_MAX),
            "post_padding": expand(
                pre_padding if post_padding is None else post_padding,
                nsp,
                "pre_padding" if post_padding is None else "post_padding",
                0,
                INT32_MAX,
            ),
            "padding_mode": padding_mode or ("neg_inf" if mode == "max" else "zero"),
            "nan_propagation": bool(nan_propagation),
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
        }
        choice(attrs["padding_mode"], PADDING_MODES, "padding_mode")
        for i, (p, q, w) in enumerate(zip(attrs["pre_padding"], attrs["post_padding"], window)):
            if p >= w or q >= w:
                raise GraphError(f"spatial dim {i}: padding ({p}, {q}) must be smaller than the window {w}")
        return attrs

    @staticmethod
    def _resample_out(x_dims: tuple[int, ...], a: dict[str, Any]) -> tuple[int, ...]:
        """``(N, C, *out)`` of pooling ``x_dims`` with the attributes ``a``
        (:func:`~cudnnkit.runtime.shapes.pool_output_sizes`); :class:`GraphError` naming the first spatial dim
        whose padded input is smaller than the window."""
        sizes = pool_output_sizes(
            x_dims[2:], a["window"], stride=a["stride"], pre_padding=a["pre_padding"], post_padding=a["post_padding"]
        )
        for i, (xi, o) in enumerate(zip(x_dims[2:], sizes)):
            if o < 1:
                raise GraphError(
                    f"spatial dim {i}: x's size {xi} plus pre_padding {a['pre_padding'][i]} and post_padding "
                    f"{a['post_padding'][i]} is smaller than the window {a['window'][i]}"
                )
        return (*x_dims[:2], *sizes)

    def resample_forward(
        self,
        x: Tensor,
        *,
        mode: str = "max",
        window=None,
        stride=None,
        pre_padding=0,
        post_padding=None,
        padding_mode: str | None = None,
        nan_propagation: bool = False,
        index: bool = False,
        index_dtype: str = "int8",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Pooling: ``x`` ``(N, C, *spatial)`` -> ``y`` ``(N, C, *out)``, ``out = (in + pre + post - window) // stride + 1``.

        ``mode``: ``"max"``, ``"avg_include_padding"``, ``"avg_exclude_padding"``.
        ``window``, ``stride`` (default: the window), ``pre_padding`` and
        ``post_padding`` (default: ``pre_padding``) take one int or one per
        spatial dim; cuDNN's resample has no dilation. ``padding_mode``
        (``"neg_inf"`` for max, ``"zero"`` for average by default; also
        ``"edge"``). ``nan_propagation`` sets ``CUDNN_PROPAGATE_NAN``.
        ``index=True`` (max pooling for training) also returns the argmax
        index tensor (``index_dtype``, int8 by default) that
        :meth:`resample_backward` can take instead of ``x`` and ``y``.

        Makes ``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR``.
        """
        x = self._own(x, "x")
        if x.ndim < 3:
            raise GraphError(f"resample_forward needs x of rank >= 3 (N, C, *spatial), got {x.dims}")
        a = self._resample_attrs(
            x.ndim - 2, mode, window, stride, pre_padding, post_padding, padding_mode, nan_propagation, compute_dtype
        )
        _check_resample_dtype(a["mode"], x.dtype, "x")
        if index and mode != "max":
            raise GraphError(f"index=True applies to max pooling, not {mode!r}")
        dims = self._resample_out(x.dims, a)
        y = self._out(dims, x, dtype or x.dtype, name or f"pool_{mode}")
        outs = {"y": y}
        if index:
            outs["index"] = self._out(dims, x, index_dtype, (name or "pool") + "_index")
        self._add("resample_fwd", a, {"x": x}, outs)
        return (y, outs["index"]) if index else y

    def resample_backward(
        self,
        dy: Tensor,
        *,
        x_dims: Sequence[int],
        index: Tensor | None = None,
        mode: str = "max",
        window=None,
        stride=None,
        pre_padding=0,
        post_padding=None,
        padding_mode: str | None = None,
        nan_propagation: bool = False,
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Pooling backward: ``dx`` of dims ``x_dims`` from ``dy`` and the forward's options.

        Max pooling needs ``index``, the argmax tensor of
        ``resample_forward(index=True)``; average pooling needs only ``dy``.
        (The operation's X/Y inputs are not offered: with them in place of
        the index, libcudnn 9.19 crashes while answering the engine
        heuristics.) Makes ``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` and
        ``CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR``.
        """
        dy = self._own(dy, "dy")
        _check_resample_dtype(str(mode), dy.dtype, "dy")
        ins = {"dy": dy}
        x_dims = as_ints(x_dims, "x_dims")
        if len(x_dims) != dy.ndim or len(x_dims) < 3:
            raise GraphError(f"x_dims {x_dims} and dy {dy.dims} must have one rank >= 3")
        a = self._resample_attrs(
            len(x_dims) - 2,
            mode,
            window,
            stride,
            pre_padding,
            post_padding,
            padding_mode,
            nan_propagation,
            compute_dtype,
        )
        if self._resample_out(x_dims, a) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the pooled shape {self._resample_out(x_dims, a)} of x {x_dims}")
        if mode == "max":
            if index is None:
                raise GraphError("max-pooling backward needs index= (resample_forward(..., index=True))")
            ins["index"] = self._own(index, "index")
            if ins["index"].dims != dy.dims:
                raise GraphError(f"index {ins['index'].dims} must have dy's dims {dy.dims}")
        elif index is not None:
            raise GraphError(f"index= applies to max pooling, not {mode!r}")
        dx = self._out(x_dims, dy, dtype or dy.dtype, name or f"pool_{mode}_bwd")
        self._add("resample_bwd", a, ins, {"dx": dx})
        return dx


def lower_resample(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_RESAMPLE_DESCRIPTOR`` (mode, compute type, NaN propagation, padding mode, spatial
    dims, window, strides, pre/post paddings), then ``OPERATION_RESAMPLE_FWD``/``_BWD`` (its tensors by role)."""
    a = dict(n.attrs)
    rs = BackendDescriptor("CUDNN_BACKEND_RESAMPLE_DESCRIPTOR")
    rs.set("CUDNN_ATTR_RESAMPLE_MODE", RESAMPLE_MODES[a["mode"]])
    rs.set("CUDNN_ATTR_RESAMPLE_COMP_TYPE", cudnn_dtype(a["compute_dtype"]))
    rs.set(
        "CUDNN_ATTR_RESAMPLE_NAN_PROPAGATION",
        lib.CUDNN_PROPAGATE_NAN if a["nan_propagation"] else lib.CUDNN_NOT_PROPAGATE_NAN,
    )
    rs.set("CUDNN_ATTR_RESAMPLE_PADDING_MODE", PADDING_MODES[a["padding_mode"]])
    rs.set("CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS", len(a["window"]))
    rs.set("CUDNN_ATTR_RESAMPLE_WINDOW_DIMS", list(a["window"]))
    rs.set("CUDNN_ATTR_RESAMPLE_STRIDES", list(a["stride"]))
    rs.set("CUDNN_ATTR_RESAMPLE_PRE_PADDINGS", list(a["pre_padding"]))
    rs.set("CUDNN_ATTR_RESAMPLE_POST_PADDINGS", list(a["post_padding"]))
    rs.finalize()
    p = "FWD" if n.kind == "resample_fwd" else "BWD"
    op = BackendDescriptor(f"CUDNN_BACKEND_OPERATION_RESAMPLE_{p}_DESCRIPTOR")
    op.set(f"CUDNN_ATTR_OPERATION_RESAMPLE_{p}_DESC", rs)
    for role, uid in (*n.inputs, *n.outputs):
        op.set(f"CUDNN_ATTR_OPERATION_RESAMPLE_{p}_{_RESAMPLE_ATTR[role]}", tds[uid])
    return op.finalize(), rs


#: node kind -> its lowering
LOWER = {"resample_fwd": lower_resample, "resample_bwd": lower_resample}
