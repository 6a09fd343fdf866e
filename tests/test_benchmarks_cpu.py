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
