"""CPU fakes for the ops' graph forms: plans that record what they were run with, without cuDNN (no driver here).

``recording_plans(monkeypatch)`` makes :meth:`cudnnkit.graph.Graph.build` return a :class:`RecordingPlan` (and the
ops' handle a fake): each ``execute_raw`` appends ``{tensor name: (strides, pointer)}`` for the plan's bindable
tensors (the graph's non-virtual, non-constant ones: inputs by their names, outputs as ``"out"``, ``"out1"``, ...
in uid order) to the list it returns.
``recording_copies(monkeypatch)`` records the names ``Launch.copy`` is called with (the copies in, the
temporaries copied back)."""

from __future__ import annotations

from typing import Any


class RecordingPlan:
    workspace_size = 0
    name = "fake"

    def __init__(self, g: Any, runs: list):
        self.graph = g
        self._runs = runs
        tensors = [t for t in g.tensors() if not t.virtual and not t.by_value]
        made = sorted({uid for n in g.nodes() for _, uid in n.outputs} & {t.uid for t in tensors})
        outs = {uid: "out" if i == 0 else f"out{i}" for i, uid in enumerate(made)}
        self.bindable_uids = tuple(t.uid for t in tensors)
        self._meta = [(outs.get(t.uid, t.name), t.strides) for t in tensors]

    def execute_raw(self, handle: int, ptrs: list[int], workspace: int) -> None:
        self._runs.append({name: (strides, p) for (name, strides), p in zip(self._meta, ptrs)})


def recording_plans(monkeypatch: Any) -> list[dict[str, tuple[tuple[int, ...], int]]]:
    from cudnnkit.graph import Graph

    runs: list = []
    monkeypatch.setattr(Graph, "build", lambda self, device=None, **kw: RecordingPlan(self, runs))
    monkeypatch.setattr("cudnnkit.ops._primitive.get_handle", lambda *a: type("H", (), {"ptr": 1})())
    return runs


def recording_copies(monkeypatch: Any) -> list[str]:
    from cudnnkit.runtime.launch import Launch

    copies: list[str] = []
    real = Launch.copy

    def copy(self: Any, dst: Any, src: Any, name: str = "out") -> Any:
        copies.append(name)
        return real(self, dst, src, name)

    monkeypatch.setattr(Launch, "copy", copy)
    return copies
