"""Fidelity and throughput metrics of a replay (paper §6.3 and §6.4).

Every timing metric compares a run against the reference, the first native
run of the trace, on each command's ``median_ms`` and ``mean_ms``: timing
ratios, P (p95 inflation), pairwise flip rate by native gap, Kendall tau-b,
throughput.  Their definitions: docs/design/replay.md "Metrics (paper §6.3–6.4)".
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Literal

import numpy as np

from krex_cli.replay.trace import BANDS

Stat = Literal["median", "mean"]
STATS: tuple[Stat, ...] = ("median", "mean")
Key = tuple[str, str]

# P thresholds on reference kernel time (ms), paper §6.4 ("> 10, > 1, > 0.1 ms").
P_THRESHOLDS_MS: tuple[float, ...] = (10.0, 1.0, 0.1)
WITHIN = 0.05
# Fewer candidate pairs than this in a gap bucket: its flip rate says nothing (reports
# say "too few to judge" instead of a rate).
MIN_PAIRS = 5
# Native-gap buckets of the pairwise flip rate, [lo, hi) as fractions (Figure 10a).
GAP_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("0-1%", 0.0, 0.01),
    ("1-2%", 0.01, 0.02),
    ("2-5%", 0.02, 0.05),
    ("5-10%", 0.05, 0.10),
    ("10-20%", 0.10, 0.20),
    (">20%", 0.20, math.inf),
)


@dataclass(frozen=True)
class Sample:
    """One measurement: a command's key and its kernel time in ms."""

    task: str
    candidate: str
    ms: float

    @property
    def key(self) -> Key:
        return (self.task, self.candidate)


@dataclass(frozen=True)
class Ratio:
    """A measurement's timing ratio against the reference of its key."""

    key: Key
    ratio: float
    ref_ms: float


@dataclass(frozen=True)
class FlipBucket:
    """Flip counts of one native-gap bucket."""

    name: str
    pairs: int
    flips: int

    @property
    def rate(self) -> float:
        """Flipped share of the bucket's pairs (NaN when it has none)."""
        return self.flips / self.pairs if self.pairs else math.nan


def completed(record: Mapping[str, Any]) -> bool:
    """True when a results.jsonl record is a command that exited 0 with a result."""
    return record.get("exit_code") == 0 and isinstance(record.get("result"), dict)


def samples(records: Iterable[Mapping[str, Any]], stat: Stat) -> list[Sample]:
    """Measurements of the completed records (``result[stat + "_ms"]``, finite, > 0)."""
    out: list[Sample] = []
    for r in records:
        if not completed(r):
            continue
        res = r["result"]
        ms = res.get(f"{stat}_ms")
        if isinstance(ms, int | float) and math.isfinite(ms) and ms > 0:
            out.append(
                Sample(
                    str(res.get("task", r.get("task"))),
                    str(res.get("candidate", r.get("candidate"))),
                    float(ms),
                )
            )
    return out


def per_key(ss: Iterable[Sample]) -> dict[Key, float]:
    """Median measurement per (task, candidate) key, ms."""
    groups: dict[Key, list[float]] = defaultdict(list)
    for s in ss:
        groups[s.key].append(s.ms)
    return {k: statistics.median(v) for k, v in groups.items()}


def ratios(ss: Iterable[Sample], reference: Mapping[Key, float]) -> list[Ratio]:
    """Timing ratio of every measurement whose key has a reference time."""
    return [
        Ratio(s.key, s.ms / reference[s.key], reference[s.key]) for s in ss if s.key in reference
    ]


def p95_inflation(values: Sequence[float]) -> float:
    """P in %: (95th percentile of the ratios - 1) x 100 (linear interpolation); NaN if empty."""
    if not values:
        return math.nan
    return (float(np.percentile(np.asarray(values, dtype=float), 95.0)) - 1.0) * 100.0


def median_ratio(values: Sequence[float]) -> float:
    """Median of the ratios (NaN if empty)."""
    return float(statistics.median(values)) if values else math.nan


def within_share(values: Sequence[float], tol: float = WITHIN) -> float:
    """Share (0-1) of ratios with |ratio - 1| <= tol (NaN if empty)."""
    if not values:
        return math.nan
    return sum(1 for v in values if abs(v - 1.0) <= tol + 1e-12) / len(values)


def summarize(rs: Sequence[Ratio]) -> dict[str, Any]:
    """Fidelity summary of a run's ratios.

    Returns: {"n", "P" (%), "P_gt" {">10ms": %, ...}, "median_ratio",
    "within5" (0-1), "bands" {band: {"n", "P", "median_ratio", "within5"}}};
    bands are the disjoint duration bands of ``trace.BANDS`` by reference time.
    """
    values = [r.ratio for r in rs]
    out: dict[str, Any] = {
        "n": len(values),
        "P": p95_inflation(values),
        "median_ratio": median_ratio(values),
        "within5": within_share(values),
        "P_gt": {},
        "bands": {},
    }
    for t in P_THRESHOLDS_MS:
        out["P_gt"][f">{t:g}ms"] = p95_inflation([r.ratio for r in rs if r.ref_ms > t])
    for name, lo, hi in BANDS:
        vs = [r.ratio for r in rs if lo <= r.ref_ms < hi]
        out["bands"][name] = {
            "n": len(vs),
            "P": p95_inflation(vs),
            "median_ratio": median_ratio(vs),
            "within5": within_share(vs),
        }
    return out


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def flip_rates(reference: Mapping[Key, float], measured: Mapping[Key, float]) -> list[FlipBucket]:
    """Pairwise flip counts per native-gap bucket (``GAP_BUCKETS``).

    Args:
        reference, measured: time per (task, candidate) in ms; only keys in
            both count, and only pairs of candidates of the same task.
    """
    by_task: dict[str, list[str]] = defaultdict(list)
    for task, cand in sorted(reference):
        if (task, cand) in measured:
            by_task[task].append(cand)
    pairs = [0] * len(GAP_BUCKETS)
    flips = [0] * len(GAP_BUCKETS)
    for task, cands in by_task.items():
        for a, b in combinations(cands, 2):
            ra, rb = reference[(task, a)], reference[(task, b)]
            ref_order = _sign(ra - rb)
            if ref_order == 0:
                continue  # tied in the reference: no order to preserve
            gap = abs(ra - rb) / min(ra, rb)
            i = next(i for i, (_, lo, hi) in enumerate(GAP_BUCKETS) if lo <= gap < hi)
            pairs[i] += 1
            if _sign(measured[(task, a)] - measured[(task, b)]) != ref_order:
                flips[i] += 1
    return [
        FlipBucket(name, p, f) for (name, _, _), p, f in zip(GAP_BUCKETS, pairs, flips, strict=True)
    ]


def kendall_per_task(
    reference: Mapping[Key, float], measured: Mapping[Key, float]
) -> dict[str, float]:
    """Kendall tau-b per task over the candidates both runs measured.

    Tasks with fewer than two such candidates, or where tau-b is undefined
    (all times equal in one run), are left out.
    """
    by_task: dict[str, list[Key]] = defaultdict(list)
    for key in sorted(reference):
        if key in measured:
            by_task[key[0]].append(key)
    out: dict[str, float] = {}
    for task, keys in by_task.items():
        if len(keys) < 2:
            continue
        x = [reference[k] for k in keys]
        y = [measured[k] for k in keys]
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        tau = float(_kendall_tau_b(x, y))
        if math.isfinite(tau):
            out[task] = tau
    return out


def throughput(
    records: Sequence[Mapping[str, Any]], window_s: float | None = None, t0: float | None = None
) -> float:
    """Completed commands per minute.

    Args:
        records: results.jsonl records with "start"/"end" wall times (s).
        window_s: when given, count completions with end <= t0 + window_s and
            divide by the window; else divide by the span first start .. last end.
        t0: start of the window (s, wall clock); default the first start.
    Returns: cmds/min, NaN when nothing ran.
    """
    if not records:
        return math.nan
    start = t0 if t0 is not None else min(float(r["start"]) for r in records)
    done = [r for r in records if completed(r)]
    if window_s is not None:
        n = sum(1 for r in done if float(r["end"]) <= start + window_s)
        return n / (window_s / 60.0) if window_s > 0 else math.nan
    span = max(float(r["end"]) for r in records) - start
    return len(done) / (span / 60.0) if span > 0 else math.nan


def _kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """scipy.stats.kendalltau(x, y, variant="b").statistic; scipy is imported here, at
    the first report, not with this module (it takes seconds: ``krex replay --help``)."""
    from scipy import stats as sps  # type: ignore[import-untyped, unused-ignore]  # noqa: PLC0415

    return float(sps.kendalltau(x, y, variant="b").statistic)
