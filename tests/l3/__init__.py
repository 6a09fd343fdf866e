"""The L3 samples and torch references, one module per op family: each defines ``SAMPLES`` (op name ->
``f(rng, dtype) -> [(inputs, kw), ...]``) and ``TORCH_REFERENCE`` (op name -> ``f(inputs, kw) -> outputs``, torch
on the CPU). :func:`tables` gathers them."""

from __future__ import annotations

import importlib
import pkgutil


def tables() -> tuple[dict, dict]:
    """(every op's samples, every op's torch reference), from the modules of this package."""
    samples, refs = {}, {}
    for m in pkgutil.iter_modules(__path__):
        mod = importlib.import_module(f"{__name__}.{m.name}")
        samples.update(getattr(mod, "SAMPLES", {}))
        refs.update(getattr(mod, "TORCH_REFERENCE", {}))
    return samples, refs
