"""The report's plots: legends outside the bars, buckets only where the tables can judge.

The figures are caught before they are saved (``charts._save``) and read
back: which buckets got bars, where the legend sits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from krex_cli.replay import charts, metrics
from krex_cli.replay.trace import BAND_NAMES


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions make, drawn (so positions are known) and kept."""
    caught: list[Any] = []

    def save(fig: Any, path: Path) -> Path:
        fig.canvas.draw()
        caught.append(fig)
        return path

    monkeypatch.setattr(charts, "_save", save)
    return caught


def _flips(pairs: dict[str, int]) -> dict[str, Any]:
    return {
        n: {
            "pairs": pairs.get(n, 0),
            "flips": 1,
            "rate": 1 / pairs[n] if pairs.get(n) else math.nan,
        }
        for n, _, _ in metrics.GAP_BUCKETS
    }


def _bands(p: dict[str, float]) -> dict[str, Any]:
    return {"bands": {n: {"n": 3 if n in p else 0, "P": p.get(n, math.nan)} for n in BAND_NAMES}}


def _ticks(fig: Any) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_xticklabels()]


def _legend_outside(fig: Any) -> bool:
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    return bool(legend.x0 >= ax.get_window_extent().x1)


def test_flip_rate_plots_only_buckets_with_enough_pairs(figures: list[Any], tmp_path: Path) -> None:
    st = {
        "krex": {"flips": _flips({"0-1%": 2, "2-5%": 40, ">20%": 5})},
        "ungated": {"flips": _flips({"0-1%": 3, "2-5%": 4, "5-10%": 1})},
    }
    charts._flip_rate(st, "median", tmp_path)
    (fig,) = figures
    assert _ticks(fig) == ["2-5%", ">20%"]  # 0-1% and 5-10%: too few pairs in every run
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights[:2] == pytest.approx([2.5, 20.0])  # krex
    assert all(math.isnan(h) for h in heights[2:])  # ungated: no bar, not a bar of 0
    assert _legend_outside(fig)


def test_band_plot_skips_empty_bands_and_keeps_its_legend_off_the_bars(
    figures: list[Any], tmp_path: Path
) -> None:
    first, second = BAND_NAMES[0], BAND_NAMES[-1]
    st = {"a": {"fidelity": _bands({first: 1.5})}, "b": {"fidelity": _bands({second: 3.0})}}
    charts._ratio_by_band(st, "mean", tmp_path)
    (fig,) = figures
    assert _ticks(fig) == [first, second]
    assert _legend_outside(fig)


def test_a_plot_with_nothing_to_judge_says_so(figures: list[Any], tmp_path: Path) -> None:
    charts._flip_rate({"krex": {"flips": _flips({"0-1%": 2})}}, "median", tmp_path)
    (fig,) = figures
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["no gap bucket with enough data to judge"] and not fig.axes[0].patches
