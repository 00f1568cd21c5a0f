"""``krex replay report``: compare replay runs; markdown, JSON and PNG plots.

The reference is the earliest-started native run, a later native run a
*native repeat* (paper §6.4).  The outputs: docs/design/replay.md "Report
(REPORT_DIR)"; the plots are drawn in ``charts.py``, the run files' format
is ``results.py``'s.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krex_cli.replay import faults, hosts, metrics, regions, starts
from krex_cli.replay.cells import cell as _fmt
from krex_cli.replay.results import META, PHASES, RESULTS, load_results
from krex_cli.replay.trace import BAND_NAMES


class ReportError(ValueError):
    """A run directory is missing or unreadable."""


@dataclass
class Run:
    """One replay run: its directory, label, meta.json and results.jsonl records."""

    path: Path
    label: str
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    role: str = "run"  # "reference", "native repeat" or "run"

    @property
    def mode(self) -> str:
        return str(self.meta.get("mode", "?"))

    def throughput(self) -> float:
        """Completed commands per minute (window = --duration when it was set)."""
        started = self.meta.get("started")
        return metrics.throughput(
            self.records,
            self.meta.get("duration_s"),
            float(started) if started is not None else None,
        )


def load_run(path: Path) -> Run:
    """Read a run directory.

    Raises:
        ReportError: meta.json or results.jsonl is missing or not JSON.
    """
    meta_path, res_path = path / META, path / RESULTS
    if not meta_path.is_file() or not res_path.is_file():
        raise ReportError(f"{path}: not a replay run directory (needs {META} and {RESULTS})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{meta_path}: unreadable ({exc})") from None
    if not isinstance(meta, dict):
        raise ReportError(f"{meta_path}: not a JSON object")
    return Run(path, path.name, meta, load_results(res_path))


def find_runs(parent: Path) -> list[Path]:
    """Run directories directly under ``parent`` (those holding meta.json and results.jsonl)."""
    if not parent.is_dir():
        return []
    return sorted(
        p
        for p in parent.iterdir()
        if p.is_dir() and (p / META).is_file() and (p / RESULTS).is_file()
    )


def assign_roles(runs: list[Run]) -> Run | None:
    """Mark the earliest native run "reference" and later ones "native repeat"; return it."""
    natives = sorted(
        (r for r in runs if r.mode == "native"), key=lambda r: float(r.meta.get("started") or 0.0)
    )
    for i, r in enumerate(natives):
        r.role = "reference" if i == 0 else "native repeat"
    labels: dict[str, int] = {}
    for r in runs:
        n = labels.get(r.label, 0)
        labels[r.label] = n + 1
        if n:
            r.label = f"{r.label}#{n + 1}"
    return natives[0] if natives else None


def compute(runs: list[Run], ref: Run | None) -> dict[str, Any]:
    """All metrics of all runs against the reference (the content of metrics.json)."""
    out: dict[str, Any] = {"reference": ref.label if ref else None, "runs": {}}
    ref_times: dict[str, dict[metrics.Key, float]] = {}
    if ref is not None:
        for stat in metrics.STATS:
            ref_times[stat] = metrics.per_key(metrics.samples(ref.records, stat))
    for run in runs:
        done = sum(1 for r in run.records if metrics.completed(r))
        entry: dict[str, Any] = {
            "path": str(run.path),
            "mode": run.mode,
            "role": run.role,
            "concurrency": run.meta.get("concurrency"),
            "commands": len(run.records),
            "completed": done,
            "failed": len(run.records) - done,
            "throughput_cmds_per_min": run.throughput(),
            "phases_median_ms": phase_medians(run),
            "regions": regions.summarize(regions.load(run.path)),
            "gpu_faults": faults.count(run.records),
            "hosts": hosts.summarize(run.records, run.meta),
            "starts": starts.summarize(run.records),
            "stats": {},
        }
        if ref is not None and run is not ref:
            for stat in metrics.STATS:
                ss = metrics.samples(run.records, stat)
                rs = metrics.ratios(ss, ref_times[stat])
                measured = metrics.per_key(ss)
                flips = metrics.flip_rates(ref_times[stat], measured)
                taus = metrics.kendall_per_task(ref_times[stat], measured)
                entry["stats"][stat] = {
                    "fidelity": metrics.summarize(rs),
                    "ratios": [r.ratio for r in rs],
                    "ratio_ref_ms": [r.ref_ms for r in rs],
                    "flips": {
                        b.name: {"pairs": b.pairs, "flips": b.flips, "rate": b.rate} for b in flips
                    },
                    "kendall_tau_b": taus,
                    "kendall_median": statistics.median(taus.values()) if taus else math.nan,
                }
        out["runs"][run.label] = entry
    return out


def phase_medians(run: Run) -> dict[str, float]:
    """Median ms of each phase (``PHASES``) over the run's completed commands."""
    vals: dict[str, list[float]] = {p: [] for p in PHASES}
    for r in run.records:
        if not metrics.completed(r):
            continue
        ph = r["result"].get("phases") or {}
        for p in PHASES:
            v = ph.get(p)
            if isinstance(v, int | float) and math.isfinite(v):
                vals[p].append(float(v))
    return {p: statistics.median(v) if v else math.nan for p, v in vals.items()}


def flip_cell(bucket: dict[str, Any]) -> str:
    """One flip-rate cell: ``rate% (flips/pairs)``, or ``n=P: too few to judge`` below
    ``metrics.MIN_PAIRS`` pairs.

    ``bucket`` is a gap bucket of ``report.json`` (``pairs``, ``flips``,
    ``rate``: a fraction, NaN without pairs).
    """
    pairs = int(bucket["pairs"])
    if 0 < pairs < metrics.MIN_PAIRS:
        return f"n={pairs}: too few to judge"
    return f"{_fmt(bucket['rate'] * 100, '.1f', '%')} ({bucket['flips']}/{pairs})"


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


def markdown(runs: list[Run], data: dict[str, Any]) -> str:
    """The report text (markdown tables; plots referenced by file name)."""
    lines = _md_throughput(runs, data)
    lines += hosts.markdown({r.label: data["runs"][r.label]["hosts"] for r in runs})
    lines += faults.markdown({r.label: data["runs"][r.label]["gpu_faults"] for r in runs})
    for stat in metrics.STATS:
        compared = [r for r in runs if stat in data["runs"][r.label]["stats"]]
        if not compared:
            continue
        lines += _md_fidelity(compared, data, stat)
        lines += _md_bands(compared, data, stat)
        lines += _md_flips(compared, data, stat)
        lines += [
            "",
            f"![ratio CDF](ratio_cdf_{stat}.png) ![by band](ratio_by_band_{stat}.png)",
            f"![flips](flip_rate_{stat}.png) ![tau-b](kendall_cdf_{stat}.png)",
            "",
        ]
    lines += _md_phases(runs, data)
    lines += starts.markdown({r.label: data["runs"][r.label]["starts"] for r in runs})
    lines += regions.markdown({r.label: data["runs"][r.label]["regions"] for r in runs})
    return "\n".join(lines)


def _md_throughput(runs: list[Run], data: dict[str, Any]) -> list[str]:
    """Title, reference line and the throughput table."""
    ref = data["reference"]
    lines = ["# krex replay report", ""]
    lines.append(
        f"Reference: **{ref}** (first native run)."
        if ref
        else "No native run found: timing fidelity needs one (run `--mode native`)."
    )
    lines += [
        "",
        "## Throughput",
        "",
        "| run | mode | concurrency | role | commands | completed "
        "| failed | cmds/min | x reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ref_tp = data["runs"][ref]["throughput_cmds_per_min"] if ref else math.nan
    for run in runs:
        d = data["runs"][run.label]
        tp = d["throughput_cmds_per_min"]
        lines.append(
            f"| {run.label} | {d['mode']} | {d['concurrency']} | {d['role']} | "
            f"{d['commands']} | {d['completed']} | {d['failed']} | {_fmt(tp, '.1f')} | "
            f"{_fmt(tp / ref_tp if ref_tp else math.nan, '.2f', 'x')} |"
        )
    lines += ["", "![throughput](throughput.png)", ""]
    return lines


def _md_fidelity(compared: list[Run], data: dict[str, Any], stat: str) -> list[str]:
    """The timing-fidelity table of one statistic."""
    lines = [
        f"## Timing fidelity ({stat} per command)",
        "",
        "P = p95 timing inflation against the reference; bands by reference time.",
        "",
        "| run | n | P | P >10ms | P >1ms | P >0.1ms | median ratio | within 5% | median tau-b |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in compared:
        s = data["runs"][run.label]["stats"][stat]
        f = s["fidelity"]
        lines.append(
            f"| {run.label} | {f['n']} | {_fmt(f['P'], '.2f', '%')} | "
            + " | ".join(_fmt(f["P_gt"][k], ".2f", "%") for k in (">10ms", ">1ms", ">0.1ms"))
            + f" | {_fmt(f['median_ratio'], '.4f')} | {_fmt(f['within5'] * 100, '.1f', '%')}"
            f" | {_fmt(s['kendall_median'], '.3f')} |"
        )
    return lines


def _md_bands(compared: list[Run], data: dict[str, Any], stat: str) -> list[str]:
    """P by kernel-duration band, one statistic."""
    lines = [
        "",
        "P by kernel-duration band (n):",
        "",
        "| run | " + " | ".join(BAND_NAMES) + " |",
        "|---|" + "---|" * len(BAND_NAMES),
    ]
    for run in compared:
        b = data["runs"][run.label]["stats"][stat]["fidelity"]["bands"]
        lines.append(
            f"| {run.label} | "
            + " | ".join(f"{_fmt(b[n]['P'], '.2f', '%')} ({b[n]['n']})" for n in BAND_NAMES)
            + " |"
        )
    return lines


def _md_flips(compared: list[Run], data: dict[str, Any], stat: str) -> list[str]:
    """Pairwise flip rate by native gap, one statistic."""
    names = [b[0] for b in metrics.GAP_BUCKETS]
    lines = [
        "",
        "Pairwise flip rate by native gap (flips/pairs):",
        "",
        "| run | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for run in compared:
        fl = data["runs"][run.label]["stats"][stat]["flips"]
        lines.append(f"| {run.label} | " + " | ".join(flip_cell(fl[n]) for n in names) + " |")
    return lines


def _md_phases(runs: list[Run], data: dict[str, Any]) -> list[str]:
    """Median ms per phase and run."""
    lines = [
        "## Where the time goes (median ms per command)",
        "",
        "| run | " + " | ".join(p.removesuffix("_ms") for p in PHASES) + " |",
        "|---|" + "---|" * len(PHASES),
    ]
    for run in runs:
        ph = data["runs"][run.label]["phases_median_ms"]
        lines.append(f"| {run.label} | " + " | ".join(_fmt(ph[p], ".0f") for p in PHASES) + " |")
    lines += ["", "![phases](phases.png)", ""]
    return lines


def generate(dirs: Sequence[Path], out: Path) -> Path:
    """Write the report of the runs in ``dirs`` into ``out``; returns report.md's path.

    Raises:
        ReportError: no run directory given, or one is unreadable.
    """
    if not dirs:
        raise ReportError("no run directory to report on")
    runs = [load_run(Path(d)) for d in dirs]
    runs.sort(key=lambda r: float(r.meta.get("started") or 0.0))
    ref = assign_roles(runs)
    data = compute(runs, ref)
    out.mkdir(parents=True, exist_ok=True)
    # matplotlib is imported with the charts, when a report is written: not at start.
    from krex_cli.replay.charts import plots  # noqa: PLC0415

    plots(runs, data, out)
    (out / "metrics.json").write_text(
        json.dumps(_jsonable(data), indent=1) + "\n", encoding="utf-8"
    )
    md = out / "report.md"
    md.write_text(markdown(runs, data), encoding="utf-8")
    return md
