"""The PNG plots of ``krex replay report`` (matplotlib, Agg backend).

Moved out of ``report.py``, which computes the metrics and writes the
markdown; the files: docs/design/replay.md "Report (REPORT_DIR)".

Legends sit outside the axes, right of them, so they never cover a bar or
a curve.  The per-bucket bar charts (P by band, flip rate by gap) show only
the buckets the report's tables can judge: a band with a P (some ratio in
it), a gap bucket with at least ``metrics.MIN_PAIRS`` pairs; a run's bar is
left out (not drawn as 0) where its own bucket cannot be judged.  A chart
with no such bucket says so instead of showing bars.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FormatStrFormatter  # noqa: E402

from krex_cli.replay import metrics  # noqa: E402
from krex_cli.replay.results import PHASES  # noqa: E402
from krex_cli.replay.trace import BAND_NAMES  # noqa: E402

if TYPE_CHECKING:
    from krex_cli.replay.report import Run


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the outside legend included
    plt.close(fig)
    return path


def _legend(ax: Any, **kw: Any) -> None:
    """The legend of ``ax`` outside it, on its right (covers no bar or curve)."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _nothing_to_judge(ax: Any, what: str) -> None:
    """Say on ``ax`` that no bucket has enough data (instead of bars of 0)."""
    ax.text(0.5, 0.5, f"no {what} with enough data to judge", ha="center", va="center")
    ax.set_xticks([])


def plots(runs: list[Run], data: dict[str, Any], out: Path) -> list[Path]:
    """Write the PNG plots into ``out``; returns their paths.

    ``data`` is the report's metrics (``report.compute``), keyed by run label.
    """
    labels = [r.label for r in runs]
    written = [_throughput(data, labels, out), _phases(data, labels, out)]
    for stat in metrics.STATS:
        compared = [lb for lb in labels if stat in data["runs"][lb]["stats"]]
        if not compared:
            continue
        st = {lb: data["runs"][lb]["stats"][stat] for lb in compared}
        written += [
            _ratio_cdf(st, stat, out),
            _ratio_by_band(st, stat, out),
            _flip_rate(st, stat, out),
            _kendall_cdf(st, stat, out),
        ]
    return written


def _throughput(data: dict[str, Any], labels: list[str], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels)), 3.5))
    ax.bar(labels, np.nan_to_num([data["runs"][lb]["throughput_cmds_per_min"] for lb in labels]))
    ax.set_ylabel("completed commands / min")
    ax.set_title("Throughput")
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, out / "throughput.png")


def _phases(data: dict[str, Any], labels: list[str], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels)), 3.8))
    bottom = np.zeros(len(labels))
    for p in PHASES:
        vals = np.array([data["runs"][lb]["phases_median_ms"][p] for lb in labels], dtype=float)
        vals = np.nan_to_num(vals)
        ax.bar(labels, vals, bottom=bottom, label=p.removesuffix("_ms"))
        bottom += vals
    ax.set_ylabel("median ms per command")
    ax.set_title("Where the time goes")
    _legend(ax)
    ax.tick_params(axis="x", rotation=30)
    return _save(fig, out / "phases.png")


def _ratio_cdf(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for lb in st:
        v = np.sort(np.asarray(st[lb]["ratios"], dtype=float))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=lb)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"timing ratio ({stat}) vs reference")
    ax.set_ylabel("CDF")
    _legend(ax)
    return _save(fig, out / f"ratio_cdf_{stat}.png")


def _ratio_by_band(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bands = {lb: st[lb]["fidelity"]["bands"] for lb in st}
    names = [n for n in BAND_NAMES if any(_judged(bands[lb][n]["P"]) for lb in st)]
    heights = {lb: [_or_nan(bands[lb][n]["P"]) for n in names] for lb in st}
    _grouped_bars(ax, names, heights, "band")
    ax.set_xlabel("reference kernel time")
    ax.set_ylabel(f"P, p95 inflation (%, {stat})")
    return _save(fig, out / f"ratio_by_band_{stat}.png")


def _flip_rate(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))

    def rate(bucket: dict[str, Any]) -> float:
        judged = int(bucket["pairs"]) >= metrics.MIN_PAIRS
        return _or_nan(bucket["rate"]) * 100 if judged else float("nan")

    flips = {lb: st[lb]["flips"] for lb in st}
    every = [b[0] for b in metrics.GAP_BUCKETS]
    names = [n for n in every if any(_judged(rate(flips[lb][n])) for lb in st)]
    _grouped_bars(ax, names, {lb: [rate(flips[lb][n]) for n in names] for lb in st}, "gap bucket")
    ax.set_xlabel("native gap")
    ax.set_ylabel(f"pairs flipped (%, {stat})")
    return _save(fig, out / f"flip_rate_{stat}.png")


def _judged(v: Any) -> bool:
    return isinstance(v, int | float) and bool(np.isfinite(v))


def _or_nan(v: Any) -> float:
    return float(v) if _judged(v) else float("nan")


def _grouped_bars(ax: Any, names: list[str], heights: dict[str, list[float]], what: str) -> None:
    """One group of bars per bucket of ``names``, one bar per run (NaN: no bar)."""
    if not names:
        _nothing_to_judge(ax, what)
        return
    width = 0.8 / max(1, len(heights))
    for j, (lb, hs) in enumerate(heights.items()):
        ax.bar(np.arange(len(names)) + j * width, hs, width, label=lb)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    _legend(ax)


def _kendall_cdf(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for lb in st:
        v = np.sort(np.asarray(list(st[lb]["kendall_tau_b"].values()), dtype=float))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=lb)
    ax.set_xlabel(f"Kendall tau-b per task ({stat})")
    ax.set_ylabel("CDF")
    ax.set_xlim(-1.05, 1.05)
    _legend(ax)
    return _save(fig, out / f"kendall_cdf_{stat}.png")
