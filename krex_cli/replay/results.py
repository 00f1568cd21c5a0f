"""A replay run's files and command records: ``meta.json``, ``results.jsonl``.

Moved out of ``runner.py`` so that the runner (which writes them) and the
report (which reads them) share one definition: the file names, the phases
a command's result reports, how a result line is found on a command's
stdout, how an ended command's record is completed, and how meta.json is
written and results.jsonl read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from krex_cli import casualty

RESULTS = "results.jsonl"
META = "meta.json"
STDERR_TAIL_CHARS = 4000

# Phases of a command, in order, as the workloads harness reports them (ms).
PHASES: tuple[str, ...] = (
    "admit_ms",
    "imports_ms",
    "context_ms",
    "build_ms",
    "correctness_ms",
    "region_wait_ms",
    "in_region_ms",
    "exit_ms",
)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The command's result: the last stdout line that is a JSON object with "median_ms"."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "median_ms" in obj:
            return obj
    return None


def load_results(path: Path) -> list[dict[str, Any]]:
    """Records of a results.jsonl (a truncated last line, from a killed replay, is skipped)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def record_outcome(
    rec: dict[str, Any], out: str, err: str, returncode: int, error: str | None
) -> None:
    """Add an ended command's result line, GPU-fault summary and any error to its record.

    ``rec`` needs ``end`` (wall clock s); ``error`` is an error already known
    (a timeout), else the exit code or a missing result line makes one.
    """
    result = parse_result(out)
    if result is not None:
        phases = result.get("phases")
        t_print = result.get("t_print")
        if isinstance(phases, dict) and isinstance(t_print, int | float):
            phases["exit_ms"] = max(0.0, (rec["end"] - t_print) * 1000.0)
    rec["result"] = result
    fault = casualty.summary(err, returncode)  # krex run's re-runs after GPU-wide faults
    if fault is not None:
        rec["gpu_fault"] = fault
    if error is None and returncode != 0:
        error = f"exit code {returncode}"
    if error is None and result is None:
        error = "no JSON result line on stdout"
    if error is not None:
        rec["error"] = error
        rec["stderr_tail"] = err[-STDERR_TAIL_CHARS:]


def write_meta(out: Path, meta: Mapping[str, Any]) -> None:
    """Write ``out/meta.json`` atomically (a temporary file, then a rename)."""
    path = out / META
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
