"""Drop-in twins of ``torch.nn`` modules whose forward runs on cuDNN through :mod:`cudnnkit.torch`'s ops.

Each class subclasses the torch module of the same name (``cudnnkit.torch.nn.Conv2d`` is a ``torch.nn.Conv2d``):
the same constructor arguments and defaults, the same parameters and buffers (so ``state_dict`` keys, the
initialisation and ``extra_repr`` are torch's), and a forward that calls ``cudnnkit.torch.op(name)``, looked up at
call time (a missing op raises ``NotImplementedError`` naming it), with autograd through the op's declaration.
:func:`cudnnkit.torch.convert` swaps them into an existing model. A configuration cuDNN cannot run raises
``NotImplementedError`` naming the argument, at construction (:meth:`_Twin.refuse` says why, per instance).

==========================================  =========================  ============================================
module                                      op                         notes
==========================================  =========================  ============================================
``Conv1d/2d/3d``                            ``convolution``            ``padding_mode`` other than "zeros": refused
``ConvTranspose1d/2d/3d``                   ``convolution_transpose``  ``forward(x, output_size=None)``; the bias
                                                                       added after it (the op takes none)
``MaxPool1d/2d/3d``                         ``pooling``                NaN propagates (torch's); ``return_indices``,
                                                                       ``dilation != 1``: refused (cuDNN: neither)
``AvgPool1d/2d/3d``                         ``pooling``                ``divisor_override``: a factor; ``ceil_mode``
                                                                       with ``count_include_pad``: torch's divisor
``BatchNorm1d/2d/3d``                       ``batch_norm``             ``momentum=None``: cumulative average
``LayerNorm``, ``RMSNorm``                  ``layer_norm``,            parameters cast to float32 for half inputs
                                            ``rms_norm``
``InstanceNorm1d/2d/3d``                    ``instance_norm``          ``track_running_stats``: through
                                                                       ``batch_norm``, as torch does it
``Dropout``                                 ``dropout``                ``seed=``: a state of its own (default: shared)
``LocalResponseNorm``                       ``lrn``                    odd ``size`` <= 16 (cuDNN's window, backward)
``CTCLoss``                                 ``ctc_loss``               ``blank`` must be 0 (cuDNN's)
``ReLU``, ``Sigmoid``, ``Tanh``, ``ELU``,   ``activation``             ``Hardtanh``: ``min_val == 0`` only (clipped
``SiLU``, ``Hardtanh``, ``ReLU6``                                      relu)
``Softmax``, ``LogSoftmax``                 ``softmax``
``LSTM``, ``GRU``, ``RNN``                  ``rnn``                    torch's parameters packed into cuDNN's flat
                                                                       buffer per call; ``PackedSequence``;
                                                                       ``LSTM(cell_clip=)``
==========================================  =========================  ============================================

``inplace=True`` (activations, ``Dropout``) is accepted and gives the same values, in a new tensor: the ops are
functional, and their backward reads the input.

**Average pooling with ceil_mode and count_include_pad.** A ceil-mode window hanging past the padding counts the
extra cells in cuDNN's divisor (the full window); torch divides by the window clipped to the input plus its padding.
Where the two differ, the output is multiplied by ``window / clipped`` (the functional form's
:func:`cudnnkit.nn.pooling.include_pad_factor`, which the twins call), which gives
torch's values and, through autograd, its gradient.

**RNN weights.** cuDNN reads one flat buffer. Its layout (:func:`_weight_layout`: ``RNN.weight_params`` on a scratch
buffer, once per config and device) maps each torch parameter's rows to an offset; each forward builds the buffer
with ``torch.cat`` of the parameters' views (zeros in cuDNN's gaps), so the gradient of the buffer flows back to
``weight_ih_l0``... by autograd.
"""

from __future__ import annotations

import copy
import inspect
import numbers
import threading
import warnings
from typing import Any, ClassVar

import torch
from torch.nn.utils.rnn import PackedSequence

from ..nn.normalization import empty_norm
from ..nn.pooling import avg_pool_nd, check_half_window
from ..ops import rnn as _rnn
from ..ops.dropout import DropoutState, default_state
from . import op  # the package is initialised first: this module is imported on first use

__all__ = [
    "TWINS",
    "available",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "LayerNorm",
    "RMSNorm",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "Dropout",
    "LocalResponseNorm",
    "CTCLoss",
    "ReLU",
    "ReLU6",
    "Sigmoid",
    "Tanh",
    "ELU",
    "SiLU",
    "Hardtanh",
    "Softmax",
    "LogSoftmax",
    "LSTM",
    "GRU",
    "RNN",
]

#: torch module type -> its cudnnkit twin (exact types; filled as the classes below are made)
TWINS: dict[type, type] = {}


# ----------------------------------------------------------------- calling the ops


def available(name: str) -> bool:
    """Whether differentiable op ``name`` is registered (its declaration imported)."""
    from .. import autograd

    return name in autograd.functions()


def _op(name: str) -> Any:
    try:
        return op(name)  # its own cache: one dict read per module call
    except KeyError:
        raise NotImplementedError(
            f"cudnnkit has no differentiable op {name!r} (no L3 declaration is registered under that name)"
        ) from None


def _call(name: str, arrays: dict[str, Any], **kw: Any) -> Any:
    """``cudnnkit.torch.op(name)`` on ``arrays`` by name: its declared inputs positionally (None where absent),
    its declared arrays by keyword, ``kw`` as given."""
    t = _op(name)
    inputs = [arrays.pop(n, None) for n in t.d.inputs]
    extra = [k for k, v in arrays.items() if v is not None and k not in t.d.arrays]
    if extra:
        raise NotImplementedError(f"cudnnkit's {name!r} op takes no {', '.join(extra)} (declared: {t.d.inputs})")
    return t(*inputs, **{k: v for k, v in arrays.items() if k in t.d.arrays}, **kw)


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, tuple | list) else out


def _batched(x: torch.Tensor, nsp: int) -> tuple[torch.Tensor, bool]:
    """``x`` with a batch dim (torch's modules take an unbatched ``(C, *spatial)``), and whether one was added."""
    if x.dim() == nsp + 1:
        return x.unsqueeze(0), True
    return x, False


def _pdt(x: torch.Tensor) -> torch.dtype:
    """The parameter dtype cuDNN's normalizations take for ``x``: float32 for the half types, else ``x``'s."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _param(p: torch.Tensor | None, x: torch.Tensor, shape: Any, fill: float | None) -> torch.Tensor | None:
    """A normalization parameter in :func:`_pdt` of ``x`` (a differentiable cast where it differs); an absent one
    is ``fill`` (ones or zeros of ``shape``), or None when ``fill`` is None."""
    dt = _pdt(x)
    if p is None:
        return None if fill is None else torch.full(tuple(shape), fill, dtype=dt, device=x.device)
    return p if p.dtype == dt else p.to(dt)


def _ntuple(v: Any, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, tuple | list) else (v,) * n


# ----------------------------------------------------------------- the twin protocol


class _Twin:
    """A cudnnkit twin of a torch module (the first ``torch.nn`` class in its MRO, :attr:`torch_type`):
    :meth:`refuse` says why an instance's configuration cannot run (None: it can), :meth:`leave` why
    :func:`~cudnnkit.torch.convert` should keep a torch instance as it is, :meth:`needs` the ops it calls."""

    torch_type: ClassVar[type]
    ops: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        base = next((b for b in cls.__bases__ if b.__module__.startswith("torch.nn.modules")), None)
        if base is None:  # a mixin
            return
        cls.torch_type = base
        TWINS[base] = cls
        if "__init__" not in cls.__dict__:  # torch's constructor: show its signature
            try:
                cls.__signature__ = inspect.signature(base)  # type: ignore[attr-defined]
            except (TypeError, ValueError):
                pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._setup()
        self._check()

    @classmethod
    def refuse(cls, m: torch.nn.Module) -> str | None:
        """Why module ``m`` (a torch one or a twin) has a configuration cuDNN cannot run; None if it can."""
        return None

    @classmethod
    def leave(cls, m: torch.nn.Module) -> str | None:
        """Why :func:`~cudnnkit.torch.convert` keeps ``m``: :meth:`refuse`'s reason, or one of its state (dtype)."""
        return cls.refuse(m)

    @classmethod
    def needs(cls, m: torch.nn.Module) -> tuple[str, ...]:
        """The ops ``m``'s forward calls."""
        return cls.ops

    @classmethod
    def from_torch(cls, m: torch.nn.Module) -> torch.nn.Module:
        """The twin of torch module ``m``, sharing its parameters, buffers, hooks and mode (no re-initialisation).
        The hook dicts are ``m``'s own (a handle from ``m.register_*_hook`` removes the hook from the twin too); the
        other containers are copies (the twin's new entries stay off ``m``)."""
        new = cls.__new__(cls)
        for k, v in m.__dict__.items():
            share = "hooks" in k
            new.__dict__[k] = copy.copy(v) if isinstance(v, dict | set | list) and not share else v
        new._setup()
        return new

    def _setup(self) -> None:
        """The twin's own state (caches), after torch's ``__init__`` or :meth:`from_torch`."""

    def _check(self) -> None:
        reason = self.refuse(self)  # type: ignore[arg-type]
        if reason is not None:
            raise NotImplementedError(f"cudnnkit.torch.nn.{type(self).__name__}: {reason}")

    def __getstate__(self) -> dict:
        return {k: v for k, v in super().__getstate__().items() if not k.startswith("_ck_")}  # type: ignore[misc]

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        self._setup()


# ----------------------------------------------------------------- convolution


class _Fusable:
    """A twin that can apply a ReLU after its op, fused into it (``fused_activation = "relu"``): what
    :func:`cudnnkit.torch.convert` sets with ``fuse=True`` where the module is followed by a ``ReLU`` in an
    ``nn.Sequential`` (which it replaces by ``nn.Identity``). The forward then returns ``relu(op(x))`` from one
    cuDNN call (the convolution's graph ``conv_fprop -> ADD -> RELU_FWD``, batch norm's ``NORM_FORWARD ->
    RELU_FWD``), and the backward takes the ReLU's gradient from the saved output. Parameters, buffers and
    ``state_dict`` keys are unchanged; ``extra_repr`` shows it."""

    fused_activation: str | None = None

    def _fused(self) -> dict[str, Any]:
        # torch's ReLU returns NaN for a NaN: the fused one is asked to as well (cuDNN's default returns 0)
        return {} if self.fused_activation is None else {"activation": self.fused_activation, "propagate_nan": True}

    def extra_repr(self) -> str:
        got = super().extra_repr()  # type: ignore[misc]
        return got if self.fused_activation is None else f"{got}, activation={self.fused_activation!r}"


class _Conv(_Fusable, _Twin):
    nsp: ClassVar[int]

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if m.padding_mode != "zeros":
            return f"padding_mode={m.padding_mode!r} is not supported (cuDNN's convolution pads with zeros only)"
        return None

    def _conv_forward(self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        self._check()
        x, added = _batched(input, self.nsp)
        y = _first(_call("convolution", {"x": x, "w": weight, "bias": bias}, stride=self.stride, padding=self.padding,
                         dilation=self.dilation, groups=self.groups, **self._fused()))  # fmt: skip
        return y.squeeze(0) if added else y


class Conv1d(_Conv, torch.nn.Conv1d):
    nsp, ops = 1, ("convolution",)


class Conv2d(_Conv, torch.nn.Conv2d):
    nsp, ops = 2, ("convolution",)


class Conv3d(_Conv, torch.nn.Conv3d):
    nsp, ops = 3, ("convolution",)


class _ConvTranspose(_Conv):
    """The transposed convolution: op ``convolution_transpose`` (cuDNN's backward data) on its first input (``x``
    here, ``dy`` in the op's terms) and ``w`` ``(C_in, C_out // groups, *k)``, torch's weight as it is; a ``bias``
    the op does not take is added after it (broadcast over the channels)."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        self._check()
        if not available("convolution_transpose"):
            raise NotImplementedError(
                f"cudnnkit.torch.nn.{type(self).__name__}: cudnnkit has no differentiable op 'convolution_transpose' "
                "(the transposed convolution's L3 declaration is not registered)"
            )
        op_pad = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size, self.nsp,
                                      self.dilation)  # fmt: skip
        x, added = _batched(input, self.nsp)
        names = _op("convolution_transpose").d.inputs
        fused = "bias" in names
        arrays = {names[0]: x, "w": self.weight, "bias": self.bias if fused else None}
        y = _first(_call("convolution_transpose", arrays, stride=self.stride, padding=self.padding,
                         output_padding=tuple(op_pad), dilation=self.dilation, groups=self.groups))  # fmt: skip
        if self.bias is not None and not fused:
            y = y + self.bias.view(1, -1, *(1,) * self.nsp)
        return y.squeeze(0) if added else y


class ConvTranspose1d(_ConvTranspose, torch.nn.ConvTranspose1d):
    nsp, ops = 1, ("convolution_transpose",)


class ConvTranspose2d(_ConvTranspose, torch.nn.ConvTranspose2d):
    nsp, ops = 2, ("convolution_transpose",)


class ConvTranspose3d(_ConvTranspose, torch.nn.ConvTranspose3d):
    nsp, ops = 3, ("convolution_transpose",)


# ----------------------------------------------------------------- pooling


def _pool_args(m: Any, nsp: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _ntuple(m.kernel_size, nsp)
    s = _ntuple(m.stride, nsp) if m.stride is not None and m.stride != () and m.stride != [] else k
    p = _ntuple(m.padding, nsp)
    check_half_window(k, p)
    return k, s, p


class _MaxPool(_Twin):
    nsp: ClassVar[int]

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if m.return_indices:
            return ("return_indices=True is not supported (torch's flat argmax indices; cuDNN's pooling index is a "
                    "position within the window)")  # fmt: skip
        if any(d != 1 for d in _ntuple(m.dilation, cls.nsp)):
            return f"dilation={m.dilation!r} is not supported (cuDNN's pooling has no dilation)"
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check()
        k, s, p = _pool_args(self, self.nsp)
        x, added = _batched(input, self.nsp)
        mode = "max_deterministic" if torch.are_deterministic_algorithms_enabled() else "max"
        y = _first(_call("pooling", {"x": x}, mode=mode, window=k, stride=s, padding=p, ceil_mode=bool(self.ceil_mode),
                         propagate_nan=True))  # fmt: skip
        return y.squeeze(0) if added else y


class MaxPool1d(_MaxPool, torch.nn.MaxPool1d):
    nsp, ops = 1, ("pooling",)


class MaxPool2d(_MaxPool, torch.nn.MaxPool2d):
    nsp, ops = 2, ("pooling",)


class MaxPool3d(_MaxPool, torch.nn.MaxPool3d):
    nsp, ops = 3, ("pooling",)


class _AvgPool(_Twin):
    nsp: ClassVar[int]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The functional form's (:func:`cudnnkit.nn.avg_pool2d`...): ``divisor_override`` and a ceil-mode window
        past the padding with ``count_include_pad`` as factors on cuDNN's include-padding average."""
        self._check()
        return avg_pool_nd(self.nsp, input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                         self.count_include_pad, getattr(self, "divisor_override", None))  # fmt: skip


class AvgPool1d(_AvgPool, torch.nn.AvgPool1d):
    nsp, ops = 1, ("pooling",)


class AvgPool2d(_AvgPool, torch.nn.AvgPool2d):
    nsp, ops = 2, ("pooling",)


class AvgPool3d(_AvgPool, torch.nn.AvgPool3d):
    nsp, ops = 3, ("pooling",)


# ----------------------------------------------------------------- normalization


def _float64_params(m: Any) -> str | None:
    if any(p.dtype == torch.float64 for p in m.parameters(recurse=False)):
        return "float64 parameters (cuDNN's graph normalizations have no float64)"
    return None


def _batch_norm(x: torch.Tensor, w: Any, b: Any, rm: Any, rv: Any, training: bool, momentum: float,
                eps: float, count: Any = None, **fused: Any) -> torch.Tensor:  # fmt: skip
    """``batch_norm`` with torch's parameters and running statistics, cast to :func:`_pdt` of ``x`` where they
    differ (the statistics through copies written back).

    ``count`` (``momentum=None``'s ``num_batches_tracked``, already counting this batch): the running statistics
    become their cumulative average, ``old + (batch - old) / count``. cuDNN runs with momentum 1 on copies (they
    become the batch's statistics, the variance unbiased) and ``lerp_`` moves the module's buffers toward them by
    ``1 / count``, a device tensor: the op's keywords stay the same every step (a factor ``1 / count`` would be a
    new plan-cache and replay key each call, and reading ``count`` to the host a stream sync). An empty ``x``
    (a zero batch): torch's empty result, the statistics untouched."""
    if x.numel() == 0:
        return empty_norm(x, w, b)
    C = x.shape[1]
    scale, bias = _param(w, x, (C,), 1.0), _param(b, x, (C,), 0.0)
    dt = _pdt(x)
    cumulative = training and count is not None and rm is not None
    stats = [None if t is None else (t.to(dt, copy=cumulative)) for t in (rm, rv)]
    y = _first(_call("batch_norm", {"x": x, "scale": scale, "bias": bias, "running_mean": stats[0],
                                    "running_var": stats[1]}, training=training,
                     momentum=1.0 if cumulative else momentum, epsilon=eps, **fused))  # fmt: skip
    if training:
        with torch.no_grad():
            if cumulative:  # in float32 (float64 buffers: float64), as torch's kernels accumulate
                acc = torch.float64 if rm.dtype == torch.float64 else torch.float32
                w = 1.0 / count.to(acc)
            for t, c in zip((rm, rv), stats):
                if t is None or c is t:
                    continue
                if not cumulative:
                    t.copy_(c)
                elif t.dtype == acc:
                    t.lerp_(c.to(acc), w)
                else:
                    t.copy_(t.to(acc).lerp_(c.to(acc), w))
    return y


def _norm_refuse(m: Any) -> str | None:
    """A normalization's eps and momentum cuDNN cannot take (its epsilon must be > 0; its running-average factor
    in [0, 1])."""
    eps = getattr(m, "eps", None)
    if eps is not None and not eps > 0:
        return f"eps={eps!r} is not supported (cuDNN's normalizations take eps > 0)"
    momentum = getattr(m, "momentum", None)
    if momentum is not None and getattr(m, "track_running_stats", False) and not 0.0 <= momentum <= 1.0:
        return f"momentum={momentum!r} is not supported (cuDNN's running-average factor is in [0, 1])"
    return None


class _BatchNorm(_Fusable, _Twin):
    @classmethod
    def refuse(cls, m: Any) -> str | None:
        return _norm_refuse(m)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        count = None  # momentum=None: the cumulative average over the batches seen (_batch_norm)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            count = self.num_batches_tracked if self.momentum is None else None
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        if bn_training:
            n = input.numel() // input.shape[1]
            if n == 1:
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        return _batch_norm(input, self.weight, self.bias, self.running_mean if keep else None,
                           self.running_var if keep else None, bn_training, float(factor), self.eps, count,
                           **self._fused())  # fmt: skip


class BatchNorm1d(_BatchNorm, torch.nn.BatchNorm1d):
    ops = ("batch_norm",)


class BatchNorm2d(_BatchNorm, torch.nn.BatchNorm2d):
    ops = ("batch_norm",)


class BatchNorm3d(_BatchNorm, torch.nn.BatchNorm3d):
    ops = ("batch_norm",)


def _check_trailing(x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(x.shape[x.dim() - len(shape) :]) != tuple(shape) or x.dim() < len(shape):
        raise RuntimeError(
            f"Given normalized_shape={list(shape)}, expected input with shape [*, {', '.join(map(str, shape))}], "
            f"but got input of size {list(x.shape)}"
        )


class LayerNorm(_Twin, torch.nn.LayerNorm):
    ops = ("layer_norm",)

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        return _norm_refuse(m)

    @classmethod
    def leave(cls, m: Any) -> str | None:
        return cls.refuse(m) or _float64_params(m)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        shape = tuple(self.normalized_shape)
        _check_trailing(input, shape)
        if input.dim() == len(shape):  # every dim normalized: the op wants a leading one
            return self.forward(input[None])[0]
        if input.numel() == 0:
            return empty_norm(input, self.weight, self.bias)
        w, b = _param(self.weight, input, shape, 1.0), _param(self.bias, input, shape, None)
        return _first(_call("layer_norm", {"x": input, "scale": w, "bias": b}, normalized_shape_ndim=len(shape),
                            epsilon=self.eps))  # fmt: skip


if hasattr(torch.nn, "RMSNorm"):

    class RMSNorm(_Twin, torch.nn.RMSNorm):
        ops = ("rms_norm",)

        @classmethod
        def refuse(cls, m: Any) -> str | None:
            return _norm_refuse(m)

        @classmethod
        def leave(cls, m: Any) -> str | None:
            return cls.refuse(m) or _float64_params(m)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = tuple(self.normalized_shape)
            _check_trailing(x, shape)
            if x.dim() == len(shape):  # every dim normalized: the op wants a leading one
                return self.forward(x[None])[0]
            if x.numel() == 0:
                return empty_norm(x, self.weight)
            # torch's default: the epsilon of its math type (float32's for the half types), not finfo(x.dtype).eps
            eps = torch.finfo(_pdt(x)).eps if self.eps is None else self.eps
            w = _param(self.weight, x, shape, 1.0)
            return _first(_call("rms_norm", {"x": x, "scale": w}, normalized_shape_ndim=len(shape), epsilon=eps))


class _InstanceNorm(_Twin):
    @classmethod
    def refuse(cls, m: Any) -> str | None:
        return _norm_refuse(m)

    @classmethod
    def leave(cls, m: Any) -> str | None:
        return cls.refuse(m) or (None if m.track_running_stats else _float64_params(m))

    @classmethod
    def needs(cls, m: Any) -> tuple[str, ...]:
        return ("batch_norm",) if m.track_running_stats else ("instance_norm",)

    def _apply_instance_norm(self, input: torch.Tensor) -> torch.Tensor:
        C = input.shape[1]
        if not (self.training or not self.track_running_stats):  # eval with running statistics
            return _batch_norm(input, self.weight, self.bias, self.running_mean, self.running_var, False, 0.0,
                               self.eps)  # fmt: skip
        if self.running_mean is None:
            w, b = _param(self.weight, input, (C,), 1.0), _param(self.bias, input, (C,), None)
            return _first(_call("instance_norm", {"x": input, "scale": w, "bias": b}, epsilon=self.eps))
        if input.numel() == 0:  # torch's empty result, the running statistics untouched (not a mean of nothing)
            return empty_norm(input, self.weight, self.bias)
        # training with running statistics: torch's way, a batch norm of (1, N * C, *spatial)
        N = input.shape[0]
        x = input.reshape(1, N * C, *input.shape[2:])
        w = None if self.weight is None else self.weight.repeat(N)
        b = None if self.bias is None else self.bias.repeat(N)
        rm, rv = self.running_mean.repeat(N), self.running_var.repeat(N)
        momentum = self.momentum if self.momentum is not None else 0.0
        y = _batch_norm(x, w, b, rm, rv, True, float(momentum), self.eps)
        with torch.no_grad():
            self.running_mean.copy_(rm.view(N, C).mean(0))
            self.running_var.copy_(rv.view(N, C).mean(0))
        return y.view_as(input)


class InstanceNorm1d(_InstanceNorm, torch.nn.InstanceNorm1d):
    ops = ("instance_norm",)


class InstanceNorm2d(_InstanceNorm, torch.nn.InstanceNorm2d):
    ops = ("instance_norm",)


class InstanceNorm3d(_InstanceNorm, torch.nn.InstanceNorm3d):
    ops = ("instance_norm",)


class LocalResponseNorm(_Twin, torch.nn.LocalResponseNorm):
    """torch's ``b_c = a_c / (k + alpha / size * sum_{c'} a_{c'}^2) ** beta`` is cuDNN's LRN formula with
    ``lrn_alpha=alpha``, ``lrn_beta=beta``, ``k=k`` and ``size=size`` (both divide alpha by size); the windows agree
    for an odd size. An even one is refused: cuDNN's window is one channel off torch's, and its backward for even
    sizes is not the gradient (:mod:`cudnnkit.ops.lrn`)."""

    ops = ("lrn",)

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if not isinstance(m.size, int) or not 1 <= m.size <= 16:
            return f"size={m.size!r} is not supported (cuDNN's LRN takes 1 to 16)"
        if m.size % 2 == 0:
            return (f"size={m.size} (even) is not supported: cuDNN's window is one channel off torch's, and its "
                    "backward is not the gradient for even sizes")  # fmt: skip
        if not m.k >= 1e-5:
            return f"k={m.k!r} is not supported (cuDNN's LRN needs k >= 1e-5)"
        if not m.beta >= 0.01:
            return f"beta={m.beta!r} is not supported (cuDNN's LRN needs beta >= 0.01)"
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() < 3:
            raise ValueError(f"Expected 3D or higher dimensionality input (got {input.dim()} dimensions)")
        self._check()
        return _first(_call("lrn", {"x": input}, size=self.size, lrn_alpha=float(self.alpha),
                            lrn_beta=float(self.beta), k=float(self.k)))  # fmt: skip


# ----------------------------------------------------------------- dropout

_states_lock = threading.Lock()


class Dropout(_Twin, torch.nn.Dropout):
    """torch's ``Dropout(p, inplace)`` on cuDNN's RNG; ``seed`` (an extra keyword): ``None`` (the default) draws
    from :func:`cudnnkit.ops.default_state` (one per device and thread, shared), an int from a
    :class:`~cudnnkit.ops.DropoutState` of this module's own per device, seeded with it. Eval mode, and ``p == 0``,
    return the input; ``p == 1`` zeros."""

    ops = ("dropout",)

    def __init__(self, p: float = 0.5, inplace: bool = False, *, seed: int | None = None) -> None:
        self.__dict__["seed"] = seed
        super().__init__(p, inplace)

    def _setup(self) -> None:
        self.__dict__.setdefault("seed", None)
        self._ck_states: dict[Any, DropoutState] = {}

    def extra_repr(self) -> str:
        r = super().extra_repr()
        return r if self.seed is None else f"{r}, seed={self.seed}"

    def _state(self, x: torch.Tensor) -> DropoutState:
        if self.seed is None:
            return default_state(x, name="x")
        with _states_lock:
            st = self._ck_states.get(x.device)
            if st is None:
                st = self._ck_states[x.device] = DropoutState(x, self.seed, _name="x")
        return st

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return input
        if self.p == 1:
            return input * 0.0
        return _first(_call("dropout", {"x": input}, p=float(self.p), state=self._state(input)))


# ----------------------------------------------------------------- CTC loss


class CTCLoss(_Twin, torch.nn.CTCLoss):
    """torch's ``CTCLoss`` on ``cudnnCTCLoss_v8`` (:func:`cudnnkit.nn.ctc_loss`): ``log_probs`` ``(T, N, C)`` or
    ``(T, C)`` float32 (cuDNN's softmax mode: its softmax of log-probabilities is the identity, and its gradient
    is torch's; log-probabilities that are not normalized are normalized first, where torch takes them as they
    are), ``targets`` padded ``(N, S)`` or concatenated; lengths go to the host as int32. ``reduction`` and
    ``zero_infinity`` as torch's; empty targets and targets longer than their input get torch's values."""

    ops = ("ctc_loss",)

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if m.blank != 0:
            return f"blank={m.blank} is not supported (cuDNN's CTC loss takes the blank as class 0)"
        return None

    def forward(self, log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any,
                target_lengths: Any) -> torch.Tensor:  # fmt: skip
        self._check()
        from ..nn.loss import ctc_loss

        # the functional form: empty targets and targets longer than their input get torch's values there
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=self.reduction,
                        zero_infinity=bool(self.zero_infinity))  # fmt: skip


# ----------------------------------------------------------------- activations and softmax


class _Act(_Twin):
    mode: ClassVar[str]

    def _coef(self) -> float | None:
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dim() == 0:  # cuDNN's tensors have 1 to 8 dims: a scalar as (1,)
            return self.forward(input.reshape(1)).reshape(())
        nan = {"propagate_nan": True} if self.mode in ("relu", "clipped_relu") else {}
        return _call("activation", {"x": input}, mode=self.mode, coef=self._coef(), **nan)


class ReLU(_Act, torch.nn.ReLU):
    mode, ops = "relu", ("activation",)


class Sigmoid(_Act, torch.nn.Sigmoid):
    mode, ops = "sigmoid", ("activation",)


class Tanh(_Act, torch.nn.Tanh):
    mode, ops = "tanh", ("activation",)


class ELU(_Act, torch.nn.ELU):
    mode, ops = "elu", ("activation",)

    def _coef(self) -> float:
        return float(self.alpha)


class SiLU(_Act, torch.nn.SiLU):
    mode, ops = "swish", ("activation",)

    def _coef(self) -> float:
        return 1.0


class Hardtanh(_Act, torch.nn.Hardtanh):
    """``Hardtanh(0, max_val)``: cuDNN's clipped relu (``min(max(x, 0), max_val)``); another ``min_val`` is
    refused (cuDNN has no lower clip)."""

    mode, ops = "clipped_relu", ("activation",)

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if m.min_val != 0:
            return f"min_val={m.min_val!r} is not supported (cuDNN's clipped relu clips below at 0 only)"
        if not (isinstance(m.max_val, numbers.Real) and m.max_val > 0):
            return f"max_val={m.max_val!r} is not supported (cuDNN's clipped relu needs a ceiling > 0)"
        return None

    def _coef(self) -> float:
        return float(self.max_val)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check()
        return super().forward(input)


class ReLU6(Hardtanh, torch.nn.ReLU6):
    ops = ("activation",)


def _softmax_dim(ndim: int, name: str) -> int:
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        stacklevel=3,
    )
    return 0 if ndim in (0, 1, 3) else 1


class _Softmax(_Twin):
    log: ClassVar[bool]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = _softmax_dim(input.dim(), type(self).__name__.lower()) if self.dim is None else self.dim
        if input.dim() == 0:  # cuDNN's tensors have 1 to 8 dims: a scalar as (1,) (torch takes dim 0 or -1 there)
            return _call("softmax", {"x": input.reshape(1)}, axis=dim, log=self.log).reshape(())
        return _call("softmax", {"x": input}, axis=dim, log=self.log)


class Softmax(_Softmax, torch.nn.Softmax):
    ops, log = ("softmax",), False


class LogSoftmax(_Softmax, torch.nn.LogSoftmax):
    ops, log = ("softmax",), True


# ----------------------------------------------------------------- recurrent networks

_CELLS = {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "tanh", "RNN_RELU": "relu"}
_NGATES = {"lstm": 4, "gru": 3, "tanh": 1, "relu": 1}
_CONFIGS: dict[tuple, _rnn.RNN] = {}
_LAYOUTS: dict[tuple, tuple[int, tuple]] = {}


def _seed_of(m: Any) -> int:
    """The RNN dropout seed of module ``m``: ``torch.initial_seed()`` when it was first asked (at construction or
    conversion, outside any ``torch.compile`` trace, which cannot call it), kept on the module."""
    seed = m.__dict__.get("_ck_dropout_seed")
    if seed is None:
        seed = m.__dict__["_ck_dropout_seed"] = torch.initial_seed() % 2**64
    return seed


def _torch_dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _weight_layout(cfg: _rnn.RNN, like: torch.Tensor) -> tuple[int, tuple[tuple[int, str, int, int, int], ...]]:
    """``(count, pieces)`` of ``cfg``'s flat weight buffer on ``like``'s device: its length, and per piece (in
    offset order) ``(offset, torch name, first row, rows, elements)``: rows ``first:first + rows`` of torch parameter
    ``name`` lie at ``offset`` (``RNN.weight_params`` on a scratch buffer, asked once per config and device)."""
    key = (cfg, like.device)
    got = _LAYOUTS.get(key)
    if got is not None:
        return got
    w = cfg.new_weights(like)
    base, ngates, pieces = w.storage_offset(), _NGATES[cfg.cell], []
    for row in cfg.weight_params(w):
        for p in row:
            s = f"_l{p.layer}" + ("_reverse" if p.direction else "")
            for view, kind in ((p.matrix, "weight"), (p.bias, "bias")):
                if view is None:
                    continue
                if p.gate == "P":
                    name, first = f"weight_hr{s}", 0
                else:
                    side = "ih" if p.gate.startswith("W") else "hh"
                    name, first = f"{kind}_{side}{s}", cfg.hidden_size * (p.lin_id % ngates)
                pieces.append((view.storage_offset() - base, name, first, int(view.shape[0]), int(view.numel())))
    got = _check_layout(w.numel(), tuple(sorted(pieces)), set(_rnn.torch_param_names(cfg)))
    return _LAYOUTS.setdefault(key, got)


def _check_layout(count: int, pieces: tuple, names: set[str]) -> tuple[int, tuple]:
    pos = 0
    for off, name, _, _, n in pieces:
        if off < pos or off + n > count:
            raise RuntimeError(f"cuDNN's RNN weight layout has overlapping or out-of-range pieces ({name} at {off})")
        pos = off + n
    if {p[1] for p in pieces} != names:
        raise RuntimeError(f"cuDNN's RNN weight layout names {sorted({p[1] for p in pieces})}, torch {sorted(names)}")
    return count, pieces


def _flat_weights(params: dict[str, torch.Tensor], count: int, pieces: tuple) -> torch.Tensor:
    """cuDNN's flat weight buffer from torch's parameters (:func:`_weight_layout`'s pieces), by ``torch.cat`` of
    their row slices and zeros in the gaps: autograd maps the buffer's gradient back to each parameter."""
    segs, pos = [], 0
    like = next(iter(params.values()))
    for off, name, first, rows, n in pieces:
        if off > pos:
            segs.append(like.new_zeros(off - pos))
        segs.append(params[name][first : first + rows].reshape(-1))
        pos = off + n
    if pos < count:
        segs.append(like.new_zeros(count - pos))
    return torch.cat(segs)


def _seq_lengths(batch_sizes: torch.Tensor) -> tuple[int, ...]:
    """Each sequence's length from a ``PackedSequence``'s ``batch_sizes`` (decreasing, as cuDNN's packed layout)."""
    n = int(batch_sizes[0])
    return tuple((batch_sizes.unsqueeze(0) > torch.arange(n).unsqueeze(1)).sum(1).tolist())


class _RNNBase(_Twin):
    """torch's ``LSTM``/``GRU``/``RNN`` on cuDNN's RNN (``cudnnkit.ops.RNN``): ``num_layers``, ``bidirectional``,
    ``batch_first``, ``dropout`` (between layers, in training), ``proj_size`` (LSTM), ``bias``, unbatched input and
    ``PackedSequence`` (layout "packed" with its lengths); the dropout RNG is seeded with ``torch.initial_seed()``."""

    @classmethod
    def refuse(cls, m: Any) -> str | None:
        if not 0 <= m.dropout <= 1 or (m.dropout == 1 and m.num_layers > 1):
            return f"dropout={m.dropout!r} is not supported (cuDNN's RNN dropout is in [0, 1))"
        if any(p is not None and p.dtype == torch.bfloat16 for p in m._flat_weights):
            return "bfloat16 parameters are not supported (cuDNN 9's RNNs have no bfloat16)"
        try:
            cls._config_of(m, "float32")
        except (ValueError, TypeError) as e:
            return str(e)
        return None

    @staticmethod
    def _config_of(m: Any, dtype: str) -> _rnn.RNN:
        clip = getattr(m, "cell_clip", None)
        clip = tuple(clip) if isinstance(clip, list) else clip
        # torch's dropout acts between layers: none with one layer (torch takes dropout=1 there, with a warning)
        dropout = float(m.dropout) if m.num_layers > 1 else 0.0
        key = (m.mode, m.input_size, m.hidden_size, m.num_layers, bool(m.bidirectional), bool(m.bias), m.proj_size,
               dropout, clip, dtype, _seed_of(m))  # fmt: skip
        got = _CONFIGS.get(key)
        if got is None:
            got = _rnn.RNN(_CELLS[m.mode], m.input_size, m.hidden_size, num_layers=m.num_layers,
                           bidirectional=bool(m.bidirectional), bias_mode="double" if m.bias else "none",
                           proj_size=m.proj_size, dropout=dropout, dropout_seed=key[-1], dtype=dtype,
                           cell_clip=clip)  # fmt: skip
            got = _CONFIGS.setdefault(key, got)  # one dict call: atomic, and traceable by torch.compile
        return got

    def forward(self, input: Any, hx: Any = None) -> Any:
        self._check()
        lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        batched, batch_dim = True, 0 if self.batch_first else 1
        if packed:
            x, batch_sizes, sorted_idx, unsorted_idx = input
            layout, lengths = "packed", _seq_lengths(batch_sizes)
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {input.dim()}D instead")
            batched = input.dim() == 3
            x = input if batched else input.unsqueeze(batch_dim)
            layout, lengths, batch_sizes, sorted_idx, unsorted_idx = (
                "batch_major" if self.batch_first else "seq_major", None, None, None, None)  # fmt: skip
        if hx is not None:
            hs = tuple(hx) if lstm else (hx,)
            if any(h.dim() != (3 if batched else 2) for h in hs):
                raise RuntimeError(
                    f"For {'batched 3-D' if batched else 'unbatched 2-D'} input, hx should also be "
                    f"{3 if batched else 2}-D but got {', '.join(f'{h.dim()}-D' for h in hs)} tensors"
                )
            if not batched:
                hs = tuple(h.unsqueeze(1) for h in hs)
            hx = hs if lstm else hs[0]
            self.check_forward_args(x, hx, batch_sizes)
            hx = self.permute_hidden(hx, sorted_idx)
        else:
            self.check_input(x, batch_sizes)  # torch's checks (and errors) with or without hx
        h0, c0 = (None, None) if hx is None else (hx if lstm else (hx, None))
        dev, cast = x.device.type, False
        if torch.is_autocast_enabled(dev) and x.is_floating_point():
            # torch's autocast runs its RNNs in the lower-precision dtype (weights, input and state cast)
            dt = torch.get_autocast_dtype(dev)
            if dt == torch.bfloat16:
                raise NotImplementedError(
                    f"cudnnkit.torch.nn.{type(self).__name__}: autocast to bfloat16 is not supported (cuDNN 9's "
                    "RNNs have no bfloat16)"
                )
            x, cast = x.to(dt), True
            h0, c0 = (None if h is None else h.to(dt) for h in (h0, c0))
        if x.dtype == torch.bfloat16:
            raise NotImplementedError(
                f"cudnnkit.torch.nn.{type(self).__name__}: input has dtype bfloat16, which is not supported (cuDNN 9's "
                "RNNs have no bfloat16)"
            )
        if not packed and x.shape[batch_dim] == 0:
            return self._empty_batch(x, h0, c0)
        cfg = self._config_of(self, _torch_dtype_name(x.dtype))
        count, pieces = _weight_layout(cfg, x)
        params = {n: getattr(self, n) for n in self._flat_weights_names}
        if cast:  # autocast: the weights in the input's dtype too (torch.cat of differing dtypes would promote)
            params = {n: p.to(x.dtype) for n, p in params.items()}
        w = _flat_weights(params, count, pieces)
        out = _call("rnn", {"x": x, "w": w, "hx": h0, "cx": c0}, rnn=cfg, training=self.training, layout=layout,
                    seq_lengths=lengths)  # fmt: skip
        y, hidden = out[0], ((out[1], out[2]) if lstm else out[1])
        if packed:
            return PackedSequence(y, batch_sizes, sorted_idx, unsorted_idx), self.permute_hidden(hidden, unsorted_idx)
        if not batched:
            y = y.squeeze(batch_dim)
            hidden = (hidden[0].squeeze(1), hidden[1].squeeze(1)) if lstm else hidden.squeeze(1)
        return y, hidden

    def _empty_batch(self, x: torch.Tensor, h0: Any, c0: Any) -> Any:
        """torch's result for a batch of 0 sequences: empty outputs in ``x``'s dtype (cuDNN takes no empty batch),
        tied to the input, the initial state and every parameter so that a backward gives them their (empty or
        zero) gradients."""
        d = 2 if self.bidirectional else 1
        out = self.proj_size if self.proj_size > 0 else self.hidden_size
        given = [p for p in (*self._flat_weights, h0, c0) if p is not None]
        tie = sum((p.sum().to(x.dtype) * 0 for p in given), x.sum() * 0)
        y = x.new_zeros(*x.shape[:-1], d * out) + tie
        h = x.new_zeros(self.num_layers * d, 0, out) + tie
        if self.mode != "LSTM":
            return y, h
        return y, (h, x.new_zeros(self.num_layers * d, 0, self.hidden_size) + tie)


class LSTM(_RNNBase, torch.nn.LSTM):
    """torch's ``LSTM``, and ``cell_clip`` (an extra keyword): cuDNN's cell-state clipping, ``c`` (meaning
    ``(-c, c)``) or ``(lo, hi)``; None (the default) for none (see ``cudnnkit.ops.RNN``)."""

    ops = ("rnn",)

    def __init__(self, *args: Any, cell_clip: float | tuple[float, float] | None = None, **kwargs: Any) -> None:
        self.__dict__["cell_clip"] = cell_clip
        super().__init__(*args, **kwargs)

    def _setup(self) -> None:
        self.__dict__.setdefault("cell_clip", None)

    def extra_repr(self) -> str:
        r = super().extra_repr()
        return r if self.cell_clip is None else f"{r}, cell_clip={self.cell_clip!r}"


class GRU(_RNNBase, torch.nn.GRU):
    ops = ("rnn",)


class RNN(_RNNBase, torch.nn.RNN):
    ops = ("rnn",)


# ----------------------------------------------------------------- attention


class ScaledDotProductAttention(torch.nn.Module):
    """``forward(query, key, value, attn_mask=None)``: cuDNN's fused attention on the graph API, as
    :func:`cudnnkit.nn.scaled_dot_product_attention` computes it (float16/bfloat16, ``(B, H, S, D)`` or
    ``(B, S, D)``), with ``dropout_p`` (applied in training mode only, as ``torch.nn.Dropout``), ``is_causal``,
    ``scale`` (None: ``1 / sqrt(D)``) and ``enable_gqa`` (key/value heads dividing the query's) fixed at
    construction; no parameters, no buffers. The op ``sdpa`` runs calls without a mask or dropout whose key/value
    heads are the query's or 1, the op ``attention`` the others: an additive float ``attn_mask`` (broadcast over
    batch and heads, differentiable), dropout (cuDNN's Philox mask, its seed drawn from torch's generator), grouped
    heads. What cuDNN cannot run raises ``NotImplementedError`` naming it, at the call (a boolean mask: pass an
    additive one).

    Not a twin: torch has no SDPA module (its models call ``F.scaled_dot_product_attention``), so
    :func:`~cudnnkit.torch.convert` makes none, and it leaves ``torch.nn.MultiheadAttention`` as it is: its forward
    is torch's fused in-projection / attention / out-projection path (``torch._native_multi_head_attention`` or
    ``F.multi_head_attention_forward``), not a cuDNN op. A model written with ``Linear`` projections and this
    module runs its attention on cuDNN."""

    def __init__(self, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                 dropout_p: float = 0.0) -> None:  # fmt: skip
        from ..nn.attention import dropout_probability

        super().__init__()
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
            raise TypeError(f"scale must be a real number or None, got {scale!r}")
        self.dropout_p = dropout_probability(dropout_p)  # the function's check, at construction
        self.is_causal, self.scale, self.enable_gqa = bool(is_causal), scale, bool(enable_gqa)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        from ..nn.attention import scaled_dot_product_attention

        return scaled_dot_product_attention(query, key, value, attn_mask, self.dropout_p if self.training else 0.0,
                                            self.is_causal, self.scale, self.enable_gqa)  # fmt: skip

    def extra_repr(self) -> str:
        return (f"is_causal={self.is_causal}, scale={self.scale}, enable_gqa={self.enable_gqa}, "
                f"dropout_p={self.dropout_p}")  # fmt: skip
