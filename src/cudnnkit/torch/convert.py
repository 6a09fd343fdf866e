"""``convert(model)``: swap the ``torch.nn`` modules of a model that have a cudnnkit twin
(:data:`cudnnkit.torch.nn.TWINS`, by exact type) for the twin, keeping their parameters and buffers.

    report = cudnnkit.torch.convert(model)      # in place; convert(model, inplace=False) converts a deep copy
    print(report)                               # what was replaced, and what was left and why
    model = report.model                        # the converted model (a new object only if model itself was swapped)
    cudnnkit.torch.convert(model, fuse=True)    # also fuse each Conv/BatchNorm -> ReLU pair of an nn.Sequential

Each twin shares the torch module's ``Parameter`` and buffer objects, hooks and train/eval mode (nothing is
re-initialised or copied); a module whose configuration cuDNN cannot run (``MaxPool2d(dilation=2)``,
``Conv2d(padding_mode="reflect")``), whose dtype cuDNN's op lacks (float64 layer norm), or whose op is not
registered, is left as it is, with the reason. A module shared at several places is swapped once (the same twin
everywhere). This module is callable: ``cudnnkit.torch.convert(model)`` is :func:`convert`.

``fuse=True`` also fuses, inside every ``nn.Sequential``, a converted ``Conv1d/2d/3d`` or ``BatchNorm1d/2d/3d``
directly followed by a ``ReLU`` (torch's or the twin): the twin's ``fused_activation`` becomes ``"relu"`` (one
cuDNN call computes ``relu(op(x))``, its backward the ReLU's gradient from the saved output) and the ``ReLU`` is
replaced by ``nn.Identity`` (no parameters: the ``state_dict`` keys are unchanged). Only where the result is the
same model: the pair sits in one ``nn.Sequential`` (whose forward feeds one into the next), neither module appears
anywhere else in the model, and neither has hooks. The report's ``fused`` lists the pairs. The op's module then
returns the ReLU's output: code that runs part of the ``nn.Sequential`` (a slice, or a loop over it reading the
output before the ReLU, as a perceptual loss's feature taps do) sees the ReLU already applied, so convert such
models without ``fuse=True``. The fused ReLU is asked
to return NaN for a NaN, as torch's ``ReLU`` does (``propagate_nan=True``): the legacy calls set the activation
descriptor's ``CUDNN_PROPAGATE_NAN``, the fused graphs the pointwise node's ``CUDNN_ATTR_POINTWISE_NAN_PROPAGATION``
(deprecated in cuDNN 9's header). Measured on an H100 with cuDNN 9.19: the legacy calls returned 0 for a NaN
without the flag (the cause of the difference an earlier version had), and the graphs' ``RELU_FWD`` keeps NaN with
or without the attribute; ``tests/gpu/test_torch_fuse_gpu.py`` checks both paths against torch.
"""

from __future__ import annotations

import copy
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from . import nn as _nn

__all__ = ["convert", "ConvertReport"]


@dataclass
class ConvertReport:
    """What :func:`convert` did: ``model`` the converted model; ``replaced`` ``(qualified name, torch type,
    cudnnkit type)`` per swapped module; ``left`` ``(qualified name, type, reason)`` per module kept that has a
    twin type (or a subclass of one), and per leaf module without one (``"no cudnnkit twin"``)."""

    model: torch.nn.Module
    replaced: list[tuple[str, type, type]] = field(default_factory=list)
    left: list[tuple[str, type, str]] = field(default_factory=list)
    #: ``(qualified name of the op module, qualified name of the ReLU replaced by nn.Identity)`` per fused pair
    fused: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"cudnnkit.torch.convert: {len(self.replaced)} replaced, {len(self.left)} left"
                 + (f", {len(self.fused)} ReLU(s) fused" if self.fused else "")]  # fmt: skip
        lines += [f"  replaced {n or '(model)'}: {t.__name__} -> cudnnkit.torch.nn.{c.__name__}"
                  for n, t, c in self.replaced]  # fmt: skip
        lines += [f"  left     {n or '(model)'}: {t.__name__} ({why})" for n, t, why in self.left]
        lines += [f"  fused    {a} + {b} (ReLU -> Identity)" for a, b in self.fused]
        return "\n".join(lines)


def _reason(m: torch.nn.Module, twin: Any) -> str | None:
    why = twin.leave(m) or twin.refuse(m)
    if why is not None:
        return why
    missing = [op for op in twin.needs(m) if not _nn.available(op)]
    if missing:
        return f"cudnnkit has no differentiable op {', '.join(map(repr, missing))} (not registered)"
    return None


def convert(model: torch.nn.Module, *, inplace: bool = True, fuse: bool = False) -> ConvertReport:
    """Replace every submodule of ``model`` (``model`` itself included) whose exact type has a cudnnkit twin
    with the twin, sharing its parameters and buffers; in place, or on a deep copy with ``inplace=False``.
    ``fuse=True`` also fuses each convolution or batch norm followed by a ReLU in an ``nn.Sequential`` (see the
    module docstring). Returns a :class:`ConvertReport` (its ``model`` is the result)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    report = ConvertReport(model)
    done: dict[int, torch.nn.Module] = {}

    def swap(m: torch.nn.Module, name: str) -> torch.nn.Module:
        if id(m) in done:
            return done[id(m)]
        if isinstance(m, _nn._Twin):
            return m
        twin = _nn.TWINS.get(type(m))
        if twin is None:
            base = next((t for t in type(m).__mro__ if t in _nn.TWINS), None)
            if base is not None:
                report.left.append((name, type(m), f"a subclass of torch.nn.{base.__name__} (only exact types are "
                                                   "replaced: its forward may differ)"))  # fmt: skip
            elif not m._modules:
                report.left.append((name, type(m), "no cudnnkit twin"))
            return m
        why = _reason(m, twin)
        if why is not None:
            report.left.append((name, type(m), why))
            return m
        new = done[id(m)] = twin.from_torch(m)
        report.replaced.append((name, type(m), twin))
        return new

    def visit(parent: torch.nn.Module, prefix: str) -> None:
        for key, child in list(parent._modules.items()):
            if child is None:
                continue
            name = prefix + key
            new = swap(child, name)
            if new is not child:
                parent._modules[key] = new
            elif not isinstance(child, _nn._Twin) and id(child) not in done:
                done[id(child)] = child
                visit(child, name + ".")

    root = swap(model, "")
    if root is model:
        visit(model, "")
    report.model = root
    if fuse:
        _fuse_relus(root, report)
    return report


def _uses(model: torch.nn.Module) -> dict[int, int]:
    """How many places (parent slots) hold each module of ``model``."""
    seen: set[int] = set()
    count: dict[int, int] = {}

    def walk(m: torch.nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        for child in m._modules.values():
            if child is not None:
                count[id(child)] = count.get(id(child), 0) + 1
                walk(child)

    walk(model)
    return count


def _hooked(m: torch.nn.Module) -> bool:
    return any(getattr(m, k, None) for k in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                              "_backward_pre_hooks"))  # fmt: skip


def _fuse_relus(model: torch.nn.Module, report: ConvertReport) -> None:
    """Fuse each (Conv or BatchNorm twin, ReLU) pair of an ``nn.Sequential`` of ``model`` (see the module
    docstring), recording it in ``report.fused``."""
    uses = _uses(model)
    relus = (torch.nn.ReLU, _nn.ReLU)
    for prefix, seq in model.named_modules():
        if not isinstance(seq, torch.nn.Sequential):
            continue
        keys = [k for k, m in seq._modules.items() if m is not None]
        for a, b in zip(keys, keys[1:]):
            op, relu = seq._modules[a], seq._modules[b]
            fusable = isinstance(op, (_nn._Conv, _nn._BatchNorm)) and not isinstance(op, _nn._ConvTranspose)
            if not fusable or type(relu) not in relus or op.fused_activation is not None:
                continue
            if uses.get(id(op), 0) != 1 or uses.get(id(relu), 0) != 1 or _hooked(op) or _hooked(relu):
                continue
            op.fused_activation = "relu"
            seq._modules[b] = torch.nn.Identity()
            name = f"{prefix}." if prefix else ""
            report.fused.append((name + a, name + b))


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`convert` (so ``cudnnkit.torch.convert(model)`` works however it was
    imported)."""

    def __call__(self, model: torch.nn.Module, *, inplace: bool = True, fuse: bool = False) -> ConvertReport:
        return convert(model, inplace=inplace, fuse=fuse)


sys.modules[__name__].__class__ = _CallableModule
