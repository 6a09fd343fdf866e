"""The benchmark harness's plot (benchmarks/harness.py), on the CPU: one panel of horizontal bars per op family on a
shared log ratio axis, green at or under parity, the rows without a ratio left out."""

from __future__ import annotations

import pytest

matplotlib = pytest.importorskip("matplotlib")


def _rows():
    return [
        {"family": "conv", "name": "fwd", "shape": "64x64x56x56", "dtype": "bfloat16", "ratio": 0.5},
        {"family": "conv", "name": "depthwise", "shape": "64x64x56x56", "dtype": "bfloat16", "ratio": 7.0},
        {"family": "pool", "name": "max", "shape": "64x256x56x56", "dtype": "float16", "ratio": 0.33},
        {"family": "pool", "name": "failed", "shape": "1", "dtype": "float16", "ratio": None},
        {"family": "host", "name": "softmax", "shape": "4x16", "dtype": "float32", "ratio": 2.0},
    ]


def test_plot_draws_one_panel_per_family_with_every_row_that_has_a_ratio(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from benchmarks.harness import plot

    figs = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig) or real_close(fig))
    out = plot(_rows(), tmp_path / "b" / "bench.png", title="t")
    assert out == tmp_path / "b" / "bench.png" and out.stat().st_size > 10_000
    (fig,) = figs
    axes = fig.axes
    assert [a.get_title(loc="left") for a in axes] == ["conv", "pool", "host"]
    # each panel's rows top-down in the results' order
    labels = [[t.get_text() for t in sorted(a.get_yticklabels(), key=lambda t: -t.get_position()[1])] for a in axes]
    assert labels[0] == ["fwd  (64x64x56x56, bfloat16)", "depthwise  (64x64x56x56, bfloat16)"]
    assert len(labels[1]) == 1 and "failed" not in labels[1][0]  # no ratio: not drawn
    bars = [p for p in axes[0].patches]
    widths = sorted(round(b.get_width() + 1.0, 6) for b in bars)  # bars start at 1.0
    assert widths == [0.5, 7.0]
    green, red = matplotlib.colors.to_rgba("tab:green"), matplotlib.colors.to_rgba("tab:red")
    assert {b.get_facecolor() for b in bars} == {green, red}
    assert axes[-1].get_xscale() == "log"
    lo, hi = axes[-1].get_xlim()
    assert lo < 0.33 and hi > 7.0


def test_plot_of_no_rows_still_writes_a_picture(tmp_path):
    from benchmarks.harness import plot

    assert plot([{"family": "x", "name": "y", "shape": "", "dtype": "", "ratio": None}], tmp_path / "e.png").exists()


def test_the_two_sides_are_timed_interleaved(monkeypatch):
    """``time_gpu_pair``: each side warms up, then rounds of a block of a's calls and a block of b's (7 calls in 3
    blocks: 3, 2, 2), each side's times summarized apart; ``run`` times a row's sides that way, and a side that
    fails is then timed alone, which records its error."""
    torch = pytest.importorskip("torch")
    from benchmarks import harness as H

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))

    def event_times(fn, n, rotate=None, first=0):
        out = []
        for _ in range(n):
            out.append(fn())
        return out

    monkeypatch.setattr(H, "_event_times", event_times)

    def a():
        calls.append("a")
        return 1.0

    def b():
        calls.append("b")
        return 3.0

    ta, tb = H.time_gpu_pair(a, b, warmup=2, iters=7, blocks=3)
    assert (
        calls
        == ["a"] * 2 + ["b"] * 2 + ["sync"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 2 + ["b"] * 2 + ["a"] * 2 + ["b"] * 2
    )
    assert ta["median_ms"] == 1.0 and tb["median_ms"] == 3.0

    monkeypatch.setattr(H, "host_overhead_us", lambda *a, **k: 0.0)
    monkeypatch.setattr(H, "time_gpu", lambda fn, **k: fn() and {"median_ms": 9.0, "p10_ms": 9.0, "p90_ms": 9.0})
    row = H.Row("f", "n", "s", "float32", ours=a, torch=b)
    (res,) = H.run([row], warmup=1, iters=4, progress=False)
    assert res["ours_ms"] == 1.0 and res["torch_ms"] == 3.0 and res["ratio"] == 1.0 / 3.0

    def broken():
        raise RuntimeError("no engine")

    (res,) = H.run([H.Row("f", "n", "s", "float32", ours=broken, torch=b)], warmup=1, iters=4, progress=False)
    assert res["ours_ms"] is None and "no engine" in res["error"] and res["torch_ms"] == 9.0
    assert "one side after the other" in res["notes"]


def test_the_cpu_host_cost_rows_run():
    """``python -m benchmarks.host_cpu``: every row runs the real express and torch-glue code with its CPU
    stand-ins (no GPU) and gives a positive time; it leaves the adapters' key table as it found it."""
    pytest.importorskip("torch")
    from benchmarks import host_cpu
    from cudnnkit.runtime import adapters

    before, pointers = dict(adapters.KEYED), dict(adapters.POINTER)
    got = host_cpu.rows(iters=50, repeat=1)
    names = [n for n, _ in got]
    assert names[0] == "express signature, convolution_forward" and any(n.startswith("_fire_graph") for n in names)
    assert sum(n.startswith("torch glue") for n in names) == 5
    assert sum(n.startswith("replay") for n in names) == 2
    assert sum(n.startswith("eager op chain") for n in names) == 2  # (the replayed one raises if nothing replayed)
    assert all(us > 0 for _, us in got)
    assert adapters.KEYED == before and adapters.POINTER == pointers
    from cudnnkit.ops import _express, _replay

    assert _replay.enabled() and _express.enabled()  # turned back on after the replay-off row
    assert host_cpu.main(["--iters", "20", "--repeat", "1"]) == 0
