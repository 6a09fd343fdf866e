"""Convolutions: ``CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR`` + ``OPERATION_CONVOLUTION_FORWARD`` (``conv_fprop``),
``_BACKWARD_DATA`` (``conv_dgrad``) and ``_BACKWARD_FILTER`` (``conv_wgrad``); output sizes from
:func:`cudnnkit.runtime.shapes.conv_output_sizes` (per-dim pre/post padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import lib
from ...lib.backend import BackendDescriptor
from ...runtime import canonical, cudnn_dtype
from ...runtime.shapes import conv_output_sizes, expand, resolve_padding
from ..checks import INT32_MAX, as_ints
from ..errors import GraphError
from ..tensor import Node, Tensor


class ConvNodes:
    """The :class:`~cudnnkit.graph.Graph` methods that add convolution nodes."""

    def _conv_attrs(
        self,
        nsp: int,
        stride,
        pre_padding,
        post_padding,
        dilation,
        mode: str,
        compute_dtype: str | None,
        padding=None,
        kernel: Sequence[int] | None = None,
        groups: int = 1,
    ) -> dict[str, Any]:
        """The convolution descriptor's attributes, checked. ``padding`` (symmetric ints as in cudnn-frontend, or
        any form :func:`~cudnnkit.runtime.shapes.resolve_padding` takes: ``(before, after)`` pairs, ``"valid"``,
        ``"same"``) replaces ``pre_padding``/``post_padding``, which must then be left at their defaults."""
        if not isinstance(mode, str) or mode not in ("cross_correlation", "convolution"):
            raise GraphError(f"mode must be 'cross_correlation' or 'convolution', got {mode!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= INT32_MAX:
            raise GraphError(f"groups must be a positive int, got {groups!r}")
        s = expand(stride, nsp, "stride", 1, INT32_MAX)
        d = expand(dilation, nsp, "dilation", 1, INT32_MAX)
        if padding is not None:
            if not (isinstance(pre_padding, int) and pre_padding == 0 and post_padding is None):
                raise GraphError("pass padding= or pre_padding=/post_padding=, not both")
            ext = tuple(di * (ki - 1) + 1 for di, ki in zip(d, kernel)) if kernel is not None else (1,) * nsp
            pre, post = resolve_padding(padding, nsp, s, ext)
        else:
            post = pre_padding if post_padding is None else post_padding
            pre = expand(pre_padding, nsp, "pre_padding", 0, INT32_MAX)
            post = expand(post, nsp, "post_padding" if post_padding is not None else "pre_padding", 0, INT32_MAX)
        return {
            "stride": s,
            "pre_padding": pre,
            "post_padding": post,
            "dilation": d,
            "groups": groups,
            "mode": mode,
            "compute_dtype": canonical(compute_dtype or self.compute_dtype, "compute_dtype"),
        }

    @staticmethod
    def _conv_out(x_dims, w_dims, attrs) -> tuple[int, ...]:
        """``(N, K, *out)`` of ``x_dims`` ``(N, C, *)`` convolved with ``w_dims`` ``(K, C/groups, *kernel)``
        (:func:`~cudnnkit.runtime.shapes.conv_output_sizes`); :class:`GraphError` naming the first spatial dim
        whose padded input is smaller than the dilated kernel."""
        n, c = x_dims[:2]
        k, cg = w_dims[:2]
        g = attrs["groups"]
        if c != cg * g:
            hint = f" (groups={c // cg}?)" if g == 1 and c % cg == 0 and c != cg else ""
            raise GraphError(
                f"x has {c} channels but w expects {cg} per group x groups={g} = {cg * g}{hint}: w is "
                "(K, C / groups, *kernel)"
            )
        if k % g:
            raise GraphError(f"w's {k} output channels are not divisible by groups={g}")
        sizes = conv_output_sizes(
            x_dims[2:],
            w_dims[2:],
            stride=attrs["stride"],
            pre_padding=attrs["pre_padding"],
            post_padding=attrs["post_padding"],
            dilation=attrs["dilation"],
        )
        for i, (xi, ki, o) in enumerate(zip(x_dims[2:], w_dims[2:], sizes)):
            if o < 1:
                eff = attrs["dilation"][i] * (ki - 1) + 1
                raise GraphError(
                    f"spatial dim {i}: x's size {xi} plus pre_padding {attrs['pre_padding'][i]} and post_padding "
                    f"{attrs['post_padding'][i]} is smaller than w's kernel {ki} at dilation {attrs['dilation'][i]} "
                    f"({eff})"
                )
        return (n, k, *sizes)

    def conv_fprop(
        self,
        x: Tensor,
        w: Tensor,
        *,
        stride=1,
        padding=None,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        groups: int = 1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Convolution forward: ``x`` ``(N, C, *spatial)``, ``w`` ``(K, C/groups, *kernel)`` -> ``y`` ``(N, K, *)``.

        ``padding``: symmetric per dim, as in cudnn-frontend (or ``(before, after)`` pairs, ``"valid"``,
        ``"same"``); or per spatial dim before and after with ``pre_padding``/``post_padding`` (``post_padding``
        defaults to ``pre_padding``). ``groups`` must be given for a grouped convolution and is checked:
        ``C == groups * w.dims[1]``, ``K`` divisible by it (cuDNN's graph API infers groups from the channels,
        so the check is what catches a wrong ``w``).
        """
        x, w = self._own(x, "x"), self._own(w, "w")
        if x.ndim < 3 or w.ndim != x.ndim:
            raise GraphError(f"conv_fprop needs x and w of one rank >= 3, got {x.dims} and {w.dims}")
        attrs = self._conv_attrs(
            x.ndim - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype, padding, w.dims[2:], groups
        )
        y = self._out(self._conv_out(x.dims, w.dims, attrs), x, dtype, name or "conv_fprop")
        self._add("conv_fprop", attrs, {"x": x, "w": w}, {"y": y})
        return y

    def conv_dgrad(
        self,
        dy: Tensor,
        w: Tensor,
        x_dims: Sequence[int],
        *,
        stride=1,
        padding=None,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        groups: int = 1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Convolution backward data: ``dx`` of dims ``x_dims`` from ``dy`` and ``w`` (padding and groups as in
        :meth:`conv_fprop`)."""
        dy, w = self._own(dy, "dy"), self._own(w, "w")
        x_dims = as_ints(x_dims, "x_dims")
        if len(x_dims) < 3 or not len(x_dims) == w.ndim == dy.ndim:
            raise GraphError(f"conv_dgrad needs x_dims, w and dy of one rank >= 3, got {x_dims}, {w.dims}, {dy.dims}")
        attrs = self._conv_attrs(
            len(x_dims) - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype, padding, w.dims[2:],
            groups,
        )  # fmt: skip
        if self._conv_out(x_dims, w.dims, attrs) != dy.dims:
            raise GraphError(
                f"dy {dy.dims} is not the forward output of x {x_dims} and w {w.dims} "
                f"({self._conv_out(x_dims, w.dims, attrs)})"
            )
        dx = self._out(x_dims, dy, dtype, name or "conv_dgrad")
        self._add("conv_dgrad", attrs, {"dy": dy, "w": w}, {"dx": dx})
        return dx

    def conv_wgrad(
        self,
        x: Tensor,
        dy: Tensor,
        w_dims: Sequence[int],
        *,
        stride=1,
        padding=None,
        pre_padding=0,
        post_padding=None,
        dilation=1,
        groups: int = 1,
        mode: str = "cross_correlation",
        compute_dtype: str | None = None,
        dtype: str | None = None,
        name: str = "",
    ) -> Tensor:
        """Convolution backward filter: ``dw`` of dims ``w_dims`` from ``x`` and ``dy`` (padding and groups as in
        :meth:`conv_fprop`)."""
        x, dy = self._own(x, "x"), self._own(dy, "dy")
        w_dims = as_ints(w_dims, "w_dims")
        if len(w_dims) < 3 or not len(w_dims) == x.ndim == dy.ndim:
            raise GraphError(f"conv_wgrad needs x, dy and w_dims of one rank >= 3, got {x.dims}, {dy.dims}, {w_dims}")
        attrs = self._conv_attrs(
            x.ndim - 2, stride, pre_padding, post_padding, dilation, mode, compute_dtype, padding, w_dims[2:], groups
        )
        if self._conv_out(x.dims, w_dims, attrs) != dy.dims:
            raise GraphError(f"dy {dy.dims} is not the forward output of x {x.dims} and w {w_dims}")
        dw = self._out(w_dims, x, dtype, name or "conv_wgrad")
        self._add("conv_wgrad", attrs, {"x": x, "dy": dy}, {"dw": dw})
        return dw


def lower_conv(n: Node, tds: dict[int, BackendDescriptor]) -> tuple[BackendDescriptor, BackendDescriptor | None]:
    """``CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR`` (compute type, mode, spatial dims, dilations, strides,
    pre/post paddings), then the forward, backward-data or backward-filter node (its tensors by role, ALPHA 1,
    BETA 0)."""
    a = dict(n.attrs)
    cv = BackendDescriptor("CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR")
    cv.set("CUDNN_ATTR_CONVOLUTION_COMP_TYPE", cudnn_dtype(a["compute_dtype"]))
    cv.set(
        "CUDNN_ATTR_CONVOLUTION_CONV_MODE",
        lib.CUDNN_CROSS_CORRELATION if a["mode"] == "cross_correlation" else lib.CUDNN_CONVOLUTION,
    )
    cv.set("CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS", len(a["stride"]))
    cv.set("CUDNN_ATTR_CONVOLUTION_DILATIONS", list(a["dilation"]))
    cv.set("CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES", list(a["stride"]))
    cv.set("CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS", list(a["pre_padding"]))
    cv.set("CUDNN_ATTR_CONVOLUTION_POST_PADDINGS", list(a["post_padding"]))
    cv.finalize()
    kind, p = {
        "conv_fprop": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR", "FORWARD"),
        "conv_dgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR", "BWD_DATA"),
        "conv_wgrad": ("CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR", "BWD_FILTER"),
    }[n.kind]
    op = BackendDescriptor(kind)
    op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_CONV_DESC", cv)
    for role, uid in (*n.inputs, *n.outputs):
        op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_{role.upper()}", tds[uid])
    op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_ALPHA", 1.0)
    op.set(f"CUDNN_ATTR_OPERATION_CONVOLUTION_{p}_BETA", 0.0)
    return op.finalize(), cv


#: node kind -> its lowering
LOWER = {"conv_fprop": lower_conv, "conv_dgrad": lower_conv, "conv_wgrad": lower_conv}
