"""``convert(model)``: swap the ``torch.nn`` modules of a model that have a cudnnkit twin
(:data:`cudnnkit.torch.nn.TWINS`, by exact type) for the twin, keeping their parameters and buffers.

    report = cudnnkit.torch.convert(model)      # in place; convert(model, inplace=False) converts a deep copy
    print(report)                               # what was replaced, and what was left and why
    model = report.model                        # the converted model (a new object only if model itself was swapped)

Each twin shares the torch module's ``Parameter`` and buffer objects, hooks and train/eval mode (nothing is
re-initialised or copied); a module whose configuration cuDNN cannot run (``MaxPool2d(dilation=2)``,
``Conv2d(padding_mode="reflect")``), whose dtype cuDNN's op lacks (float64 layer norm), or whose op is not
registered, is left as it is, with the reason. A module shared at several places is swapped once (the same twin
everywhere). This module is callable: ``cudnnkit.torch.convert(model)`` is :func:`convert`.
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

    def __str__(self) -> str:
        lines = [f"cudnnkit.torch.convert: {len(self.replaced)} replaced, {len(self.left)} left"]
        lines += [f"  replaced {n or '(model)'}: {t.__name__} -> cudnnkit.torch.nn.{c.__name__}"
                  for n, t, c in self.replaced]  # fmt: skip
        lines += [f"  left     {n or '(model)'}: {t.__name__} ({why})" for n, t, why in self.left]
        return "\n".join(lines)


def _reason(m: torch.nn.Module, twin: Any) -> str | None:
    why = twin.leave(m) or twin.refuse(m)
    if why is not None:
        return why
    missing = [op for op in twin.needs(m) if not _nn.available(op)]
    if missing:
        return f"cudnnkit has no differentiable op {', '.join(map(repr, missing))} (not registered)"
    return None


def convert(model: torch.nn.Module, *, inplace: bool = True) -> ConvertReport:
    """Replace every submodule of ``model`` (``model`` itself included) whose exact type has a cudnnkit twin
    with the twin, sharing its parameters and buffers; in place, or on a deep copy with ``inplace=False``.
    Returns a :class:`ConvertReport` (its ``model`` is the result)."""
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
    return report


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`convert` (so ``cudnnkit.torch.convert(model)`` works however it was
    imported)."""

    def __call__(self, model: torch.nn.Module, *, inplace: bool = True) -> ConvertReport:
        return convert(model, inplace=inplace)


sys.modules[__name__].__class__ = _CallableModule
