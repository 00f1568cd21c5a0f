"""The PNG plots of ``krex replay report`` (matplotlib, Agg backend).

Moved out of ``report.py``, which computes the metrics and writes the
markdown; file names are listed in that module's docstring.
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    ax.legend(fontsize=7, ncols=2)
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
    ax.legend(fontsize=7)
    return _save(fig, out / f"ratio_cdf_{stat}.png")


def _ratio_by_band(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.8 / len(st)
    for j, lb in enumerate(st):
        bands = st[lb]["fidelity"]["bands"]
        ax.bar(
            np.arange(len(BAND_NAMES)) + j * width,
            [np.nan_to_num(bands[n]["P"]) for n in BAND_NAMES],
            width,
            label=lb,
        )
    ax.set_xticks(np.arange(len(BAND_NAMES)) + 0.4 - width / 2, BAND_NAMES)
    ax.set_xlabel("reference kernel time")
    ax.set_ylabel(f"P, p95 inflation (%, {stat})")
    ax.legend(fontsize=7)
    return _save(fig, out / f"ratio_by_band_{stat}.png")


def _flip_rate(st: dict[str, Any], stat: str, out: Path) -> Path:
    names = [b[0] for b in metrics.GAP_BUCKETS]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.8 / len(st)
    for j, lb in enumerate(st):
        ax.bar(
            np.arange(len(names)) + j * width,
            [np.nan_to_num(st[lb]["flips"][n]["rate"]) * 100 for n in names],
            width,
            label=lb,
        )
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    ax.set_xlabel("native gap")
    ax.set_ylabel(f"pairs flipped (%, {stat})")
    ax.legend(fontsize=7)
    return _save(fig, out / f"flip_rate_{stat}.png")


def _kendall_cdf(st: dict[str, Any], stat: str, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for lb in st:
        v = np.sort(np.asarray(list(st[lb]["kendall_tau_b"].values()), dtype=float))
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=lb)
    ax.set_xlabel(f"Kendall tau-b per task ({stat})")
    ax.set_ylabel("CDF")
    ax.set_xlim(-1.05, 1.05)
    ax.legend(fontsize=7)
    return _save(fig, out / f"kendall_cdf_{stat}.png")
