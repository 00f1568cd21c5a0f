"""Warm and cold starts in a replay (``krex replay --warm on|alternate``).

With ``--warm on`` every command runs as ``krex run --warm -v``; with
``--warm alternate`` commands alternate between ``--warm -v`` and
``--cold`` (by the parity of pass + index, so a repeated trace runs each
command both ways), so one run compares the two.  The runner records each
command's start as ``warm``: ``{"asked": bool, "served": bool, "why": str|null}``
from ``krex run -v``'s debug lines (docs/design/warm.md): ``served`` when a
pool started it, else ``why`` it started cold.

:func:`summarize` and :func:`markdown` give the report's section: per run,
commands started warm and cold, their median wall time and median import
phase (``imports_ms`` of the command's result line), and why asked-for warm
starts were cold.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

WARM_CHOICES = ("off", "on", "alternate")
SERVED = "krex: warm: served by pool"
COLD = "krex: warm: cold start: "


def asks_warm(choice: str, pass_: int, index: int) -> bool:
    """Whether the command at (``pass_``, ``index``) asks for a warm start under ``choice``."""
    if choice == "on":
        return True
    return choice == "alternate" and (pass_ + index) % 2 == 1


def outcome(asked: bool, stderr: str) -> dict[str, Any]:
    """The record's ``warm`` field from what ``krex run -v`` wrote on stderr."""
    served = asked and any(line.startswith(SERVED) for line in stderr.splitlines())
    why = None
    if asked and not served:
        reasons = [ln[len(COLD) :] for ln in stderr.splitlines() if ln.startswith(COLD)]
        why = reasons[0] if reasons else "no debug line"
    return {"asked": asked, "served": served, "why": why}


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts and medians of warm and cold starts (completed commands), reasons of cold ones."""
    groups: dict[str, dict[str, list[float]]] = {
        k: {"wall_s": [], "imports_ms": []} for k in ("warm", "cold")
    }
    reasons: Counter[str] = Counter()
    asked = 0
    for r in records:
        w = r.get("warm")
        if not isinstance(w, Mapping):
            continue
        asked += bool(w.get("asked"))
        if w.get("asked") and not w.get("served"):
            reasons[str(w.get("why"))] += 1
        if r.get("exit_code") != 0 or not isinstance(r.get("wall_s"), int | float):
            continue
        g = groups["warm" if w.get("served") else "cold"]
        g["wall_s"].append(float(r["wall_s"]))
        phases = (r.get("result") or {}).get("phases") or {}
        if isinstance(phases.get("imports_ms"), int | float):
            g["imports_ms"].append(float(phases["imports_ms"]))
    out: dict[str, Any] = {"asked": asked, "cold_reasons": dict(reasons)}
    for name, g in groups.items():
        out[name] = {
            "commands": len(g["wall_s"]),
            "wall_s_median": _median(g["wall_s"]),
            "imports_ms_median": _median(g["imports_ms"]),
        }
    return out


def markdown(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's section (no lines when no run asked for warm starts); ``rows`` by run label."""
    if not any(row.get("asked") for row in rows.values()):
        return []
    lines = [
        "## Warm and cold starts",
        "",
        "Commands started from a warm pool (`krex run --warm`) and cold; medians over "
        "completed commands. Asked-for warm starts that ran cold, by reason, below.",
        "",
        "| run | warm | cold | wall s warm | wall s cold | imports ms warm | imports ms cold |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, row in rows.items():
        w, c = row["warm"], row["cold"]
        lines.append(
            f"| {label} | {w['commands']} | {c['commands']} | {w['wall_s_median']:.2f} "
            f"| {c['wall_s_median']:.2f} | {w['imports_ms_median']:.0f} "
            f"| {c['imports_ms_median']:.0f} |"
        )
    reasons = [
        (label, why, n) for label, row in rows.items() for why, n in row["cold_reasons"].items()
    ]
    if reasons:
        lines += ["", "| run | cold although asked warm | commands |", "|---|---|---|"]
        lines += [f"| {label} | {why} | {n} |" for label, why, n in reasons]
    return [*lines, ""]
