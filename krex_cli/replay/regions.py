"""Region records of a replay run: one log per command, and their summary.

Under krexd (serial, krex, ungated) the runner gives every command attempt
its own region log, ``DIR/regions/<pass>-<index>-<attempt>.jsonl``, through
``KREX_REGION_LOG`` (the record: docs/design/region-log.md), and names it in
the command's result line (``region_log``, relative to DIR).  The report
summarizes every log of a run: region count, drain, freeze and in-region
time percentiles (p50, p99, ms) and warnings by kind.  Native runs have no
regions (their commands do not run under krex).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from krex_cli.replay.cells import NONE, cell

DIR = "regions"
FIGURES = ("drain_ms", "freeze_ms", "region_ms")


def log_name(p: int, i: int, attempt: int) -> str:
    """The log of attempt ``attempt`` of trace line ``i`` in pass ``p``, relative to the run."""
    return f"{DIR}/{p}-{i}-{attempt}.jsonl"


def load(run_dir: Path) -> list[dict[str, Any]]:
    """Every region record under ``run_dir/regions`` (unreadable lines are skipped)."""
    out: list[dict[str, Any]] = []
    for path in sorted((run_dir / DIR).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a command killed mid-write leaves at most one partial line
            if isinstance(rec, dict):
                out.append(rec)
    return out


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``{regions, <figure>: {p50, p99} (ms, None without data), warnings: {kind: n}}``."""
    import numpy as np  # the report's dependency; the runner does not need it

    out: dict[str, Any] = {"regions": len(records)}
    for key in FIGURES:
        xs = [float(r[key]) for r in records if isinstance(r.get(key), int | float)]
        out[key] = {
            "p50": float(np.percentile(xs, 50)) if xs else None,
            "p99": float(np.percentile(xs, 99)) if xs else None,
        }
    kinds: Counter[str] = Counter()
    for r in records:
        for w in r.get("warnings") or []:
            if isinstance(w, dict):
                kinds[str(w.get("kind", "?"))] += 1
    out["warnings"] = dict(sorted(kinds.items()))
    return out


def markdown(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The report's "Regions" section: one table row per run that has regions."""
    rows = {label: s for label, s in summaries.items() if s["regions"]}
    if not rows:
        return []

    def ms(s: dict[str, Any], key: str) -> str:
        p50, p99 = s[key]["p50"], s[key]["p99"]
        return NONE if p50 is None else f"{cell(p50)} / {cell(p99)}"

    lines = [
        "## Regions",
        "",
        "From the commands' region records (docs/design/region-log.md); times p50 / p99 in ms.",
        "",
        "| run | regions | drain | freeze | in region | warnings |",
        "|---|---|---|---|---|---|",
    ]
    for label, s in rows.items():
        warn = ", ".join(f"{k} {n}" for k, n in s["warnings"].items()) or "none"
        lines.append(
            f"| {label} | {s['regions']} | {ms(s, 'drain_ms')} | {ms(s, 'freeze_ms')} "
            f"| {ms(s, 'region_ms')} | {warn} |"
        )
    lines += [
        "",
        "Warnings: cold_clock = region entered with the SM clock below 80% of its maximum; "
        "timing_outside_region = CUDA events timed outside any region; "
        "work_on_other_stream = device work left on a stream other than the timed one at exit.",
        "",
    ]
    return lines
