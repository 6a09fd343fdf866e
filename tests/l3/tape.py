"""A minimal tape-based reverse mode over :mod:`cudnnkit.autograd`, with no framework: the arrays are CuPy arrays
(or anything the L2 ops take), the tape records each op's residuals and keywords, and :meth:`Tape.grad` walks it
backwards calling each op's ``backward`` once. About forty lines: what any autograd system does to adopt the L3
layer."""

from __future__ import annotations

from typing import Any

from cudnnkit import autograd


class Tape:
    def __init__(self) -> None:
        self.records: list[tuple] = []

    def __call__(self, name: str, *inputs: Any, **kw: Any) -> Any:
        """Run op ``name`` forward and record it; returns its outputs (one array, or a tuple)."""
        d = autograd.get(name)
        outs, res = d.forward(*inputs, **kw)
        self.records.append((d, inputs, outs, res, {k: v for k, v in kw.items() if k not in d.arrays}))
        return outs[0] if len(outs) == 1 else outs

    def grad(self, out: Any, dout: Any, wrt: list[Any]) -> list[Any]:
        """d(out)/d(wrt) contracted with ``dout``: the gradient of each array in ``wrt`` (None if unreached)."""
        grads: dict[int, Any] = {id(out): dout}
        for d, inputs, outs, res, kw in reversed(self.records):
            douts = tuple(grads.pop(id(o), None) for o in outs)
            if all(g is None for g in douts):
                continue
            needs = tuple(x is not None for x in inputs)
            for x, g in zip(inputs, d.backward(res, douts, needs, **kw)):
                if x is not None and g is not None:
                    grads[id(x)] = g if id(x) not in grads else grads[id(x)] + g
        return [grads.get(id(w)) for w in wrt]
