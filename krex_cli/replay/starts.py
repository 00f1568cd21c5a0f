"""Warm and cold starts in a replay (``krex replay --warm auto|off|on|alternate``).

Which start flag each command gets, the ``warm`` record parsed from ``krex
run -v``'s lines, and the report's section (:func:`summarize`,
:func:`markdown`): docs/design/warm.md "Comparing warm and cold: ``krex
replay --warm``", docs/design/replay.md "results.jsonl".
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from krex_cli.replay.cells import cell

WARM_CHOICES = ("auto", "off", "on", "alternate")
DEFAULT = "auto"
KREXD = "krexd"
"""``asked`` of a command that passed no start flag: krexd's ``[warm] start`` decided."""
SERVED = "krex: warm: served by pool"
COLD = "krex: warm: cold start: "
NO_POOL = "no pool listens on "
NO_POOL_BECAUSE = (
    ("krex: warm: a pool for this command is starting", "no pool yet: one is starting"),
    ("krex: warm: starting a pool for this command", "no pool yet: this command started one"),
    ("krex: warm: the last pool for this key refused to serve", "the last pool refused to serve"),
    ("krex: warm: cannot start a pool", "no pool, and none could start"),
)
"""The lines ``krex run -v`` (krex_cli/warm/launch.py) writes after "no pool listens on
PATH", and the reason each gives the report (no per-key path, so reasons group)."""


def asks_warm(choice: str, pass_: int, index: int) -> bool | None:
    """Whether the command at (``pass_``, ``index``) asks for a warm start under ``choice``.

    None under ``auto``: it asks for nothing, krexd's ``[warm] start`` decides.
    """
    if choice == "auto":
        return None
    if choice == "on":
        return True
    return choice == "alternate" and (pass_ + index) % 2 == 1


def run_flags(asked: bool | None) -> list[str]:
    """``krex run``'s start options for :func:`asks_warm`'s answer ``asked``.

    True: ``--warm -v``; False: ``--cold``; None: ``-v`` alone (krexd decides,
    ``krex run -v`` says how it started).
    """
    if asked is None:
        return ["-v"]
    return ["--warm", "-v"] if asked else ["--cold"]


def outcome(asked: bool | None, stderr: str) -> dict[str, Any]:
    """The record's ``warm`` field from what ``krex run -v`` wrote on stderr.

    ``asked``: :func:`asks_warm`'s answer (None is recorded as :data:`KREXD`).
    """
    lines = stderr.splitlines()
    tried = asked is not False  # asked for warm, or krexd's default may be warm
    served = tried and any(line.startswith(SERVED) for line in lines)
    why = None
    if tried and not served:
        reasons = [ln[len(COLD) :] for ln in lines if ln.startswith(COLD)]
        why = reasons[0] if reasons else "no debug line"
        if why.startswith(NO_POOL):  # the line after says why there was none
            why = _why_no_pool(lines) or why
    return {"asked": KREXD if asked is None else asked, "served": served, "why": why}


def _why_no_pool(lines: list[str]) -> str | None:
    """Why no pool listened, from the line ``krex run -v`` writes after saying so."""
    for line in lines:
        for prefix, why in NO_POOL_BECAUSE:
            if line.startswith(prefix):
                return why + line[len(prefix) :].split(" (log ")[0]
    return None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarize(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts and medians of warm and cold starts (completed commands), reasons of cold ones.

    ``started``: records with a ``warm`` field; ``asked``: those that asked for
    warm (``--warm``), ``krexd``: those that left it to krexd (``auto``).
    """
    groups: dict[str, dict[str, list[float]]] = {
        k: {"wall_s": [], "imports_ms": []} for k in ("warm", "cold")
    }
    reasons: Counter[str] = Counter()
    counts = {"started": 0, "asked": 0, KREXD: 0}
    for r in records:
        w = r.get("warm")
        if not isinstance(w, Mapping):
            continue
        counts["started"] += 1
        counts["asked"] += w.get("asked") is True
        counts[KREXD] += w.get("asked") == KREXD
        if w.get("why") is not None and not w.get("served"):
            reasons[str(w.get("why"))] += 1
        if r.get("exit_code") != 0 or not isinstance(r.get("wall_s"), int | float):
            continue
        g = groups["warm" if w.get("served") else "cold"]
        g["wall_s"].append(float(r["wall_s"]))
        phases = (r.get("result") or {}).get("phases") or {}
        if isinstance(phases.get("imports_ms"), int | float):
            g["imports_ms"].append(float(phases["imports_ms"]))
    out: dict[str, Any] = {**counts, "cold_reasons": dict(reasons)}
    for name, g in groups.items():
        out[name] = {
            "commands": len(g["wall_s"]),
            "wall_s_median": _median(g["wall_s"]),
            "imports_ms_median": _median(g["imports_ms"]),
        }
    return out


def markdown(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's section (no lines when no run recorded its starts); ``rows`` by run label.

    Runs under ``--warm off`` record nothing (all cold, by request).
    """
    if not any(row.get("started") for row in rows.values()):
        return []
    lines = [
        "## Warm and cold starts",
        "",
        "Commands started from a warm pool and cold: asked with `krex run --warm`/`--cold` "
        "(`krex replay --warm on|alternate`) or left to krexd's `[warm] start` "
        "(`--warm auto`, the default); medians over completed commands. Why commands that "
        "were to start warm (asked, or left to krexd) started cold, by reason, below.",
        "",
        "| run | warm | cold | wall s warm | wall s cold | imports ms warm | imports ms cold |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, row in rows.items():
        w, c = row["warm"], row["cold"]
        lines.append(
            f"| {label} | {w['commands']} | {c['commands']} | {cell(w['wall_s_median'])} "
            f"| {cell(c['wall_s_median'])} | {cell(w['imports_ms_median'], '.0f')} "
            f"| {cell(c['imports_ms_median'], '.0f')} |"
        )
    reasons = [
        (label, why, n) for label, row in rows.items() for why, n in row["cold_reasons"].items()
    ]
    if reasons:
        lines += ["", "| run | why cold | commands |", "|---|---|---|"]
        lines += [f"| {label} | {why} | {n} |" for label, why, n in reasons]
    return [*lines, ""]
