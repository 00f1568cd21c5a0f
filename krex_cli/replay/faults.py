"""GPU-wide faults in a replay: culprits, casualties and re-runs, counted apart.

Under MPS one command's faulting kernel fails every co-tenant; ``krex run``
runs those casualties again (``krex_cli.casualty``) and the runner records
what its stderr said as ``gpu_fault`` (``{role, reruns}``).  The report
counts them so that a run can show it lost no healthy command.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def count(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Counts over a run's records.

    ``culprits``: commands whose own kernel faulted; ``casualties``: commands
    run again because of a co-tenant's fault; ``reruns``: runs added by
    that; ``casualties_lost``: casualties that still did not end with exit 0.
    """
    out = {"culprits": 0, "casualties": 0, "reruns": 0, "casualties_lost": 0}
    for r in records:
        f = r.get("gpu_fault")
        if not isinstance(f, Mapping):
            continue
        out["reruns"] += int(f.get("reruns") or 0)
        if f.get("role") == "culprit":
            out["culprits"] += 1
        else:
            out["casualties"] += 1
            out["casualties_lost"] += r.get("exit_code") != 0
    return out


def markdown(rows: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The report's section (no lines when no run met a GPU-wide fault); ``rows`` by run label."""
    if not any(any(v.values()) for v in rows.values()):
        return []
    lines = [
        "## GPU-wide faults (MPS)",
        "",
        "Culprit: its own kernel faulted; casualty: failed by a co-tenant's fault and run "
        "again by `krex run`; lost: casualties whose final exit code is not 0.",
        "",
        "| run | culprits | casualties | re-runs | casualties lost |",
        "|---|---|---|---|---|",
    ]
    for label, c in rows.items():
        lines.append(
            f"| {label} | {c['culprits']} | {c['casualties']} | {c['reruns']} "
            f"| {c['casualties_lost']} |"
        )
    return [*lines, ""]
