"""Throughput per host of a replay over a Ray cluster (``krex replay --ray``).

Each record of such a run names the host its command ran on (``host``).  A
host's throughput is its commands completed with exit code 0 per minute of
the run's window: ``--duration`` when it was set (counting completions
within it), else the run's span from the first start to the last end.  The
same window for every host makes the hosts' figures add up to the
cluster's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from krex_cli.replay import metrics


def has_hosts(records: Sequence[Mapping[str, Any]]) -> bool:
    """True when the records come from a run over a cluster (they name hosts)."""
    return any(r.get("host") for r in records)


def summarize(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any]:
    """``{"hosts": {name: {commands, completed, cmds_per_min}}, "cluster": {...}}``.

    ``meta``: the run's meta.json (``started``, ``duration_s``).  Empty
    ``hosts`` when the records name none.
    """
    if not records:
        return {"hosts": {}, "cluster": _entry([], math.nan)}
    started = meta.get("started")
    t0 = float(started) if started is not None else min(float(r["start"]) for r in records)
    duration = meta.get("duration_s")
    window = float(duration) if duration else max(float(r["end"]) for r in records) - t0
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("host"):
            by_host.setdefault(str(r["host"]), []).append(r)
    return {
        "hosts": {h: _entry(rs, window, t0) for h, rs in sorted(by_host.items())},
        "cluster": _entry(records, window, t0),
    }


def _entry(
    records: Sequence[Mapping[str, Any]], window_s: float, t0: float = 0.0
) -> dict[str, Any]:
    """Commands, completed ones and completions per minute within ``window_s`` from ``t0``."""
    done = [r for r in records if metrics.completed(r) and float(r["end"]) <= t0 + window_s]
    rate = len(done) / (window_s / 60.0) if window_s > 0 else math.nan
    return {
        "commands": len(records),
        "completed": sum(1 for r in records if metrics.completed(r)),
        "cmds_per_min": rate,
    }


def lines(summary: Mapping[str, Any]) -> list[str]:
    """One line per host and one for the cluster: ``host: N cmds/min (completed/commands)``."""
    out = []
    rows = [*summary["hosts"].items(), ("cluster", summary["cluster"])]
    for name, e in rows:
        out.append(f"{name}: {_rate(e)} cmds/min ({e['completed']}/{e['commands']} completed)")
    return out


def _rate(entry: Mapping[str, Any]) -> str:
    rate = entry["cmds_per_min"]
    return f"{rate:.1f}" if isinstance(rate, float) and math.isfinite(rate) else "—"


def markdown(per_run: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's "Hosts" section: per run over a cluster, each host's and the cluster's rate."""
    runs = {label: s for label, s in per_run.items() if s.get("hosts")}
    if not runs:
        return []
    out = [
        "## Hosts",
        "",
        "Runs over a Ray cluster (`krex replay --ray`): completed commands per minute "
        "of the run's window, per host and for the whole cluster.",
        "",
        "| run | host | commands | completed | cmds/min |",
        "|---|---|---|---|---|",
    ]
    for label, s in runs.items():
        for name, e in [*s["hosts"].items(), ("**cluster**", s["cluster"])]:
            out.append(f"| {label} | {name} | {e['commands']} | {e['completed']} | {_rate(e)} |")
    return out + [""]
