"""Counters, histograms and entry-latency percentiles of one GPU's critical regions.

Kept by the coordinator, shown by ``krexctl status`` (``gpus[].region``),
exported by the Prometheus endpoint (``krexd.server.metrics``) and summarized by
the region latency benchmark.  Latencies are ms; the percentiles cover the
last :data:`WINDOW` regions, ``recent`` the last :data:`RECENT_S` seconds.
Every update is O(1) (a bucket is found by bisection over a fixed list of
bounds); nothing here formats or exports anything on the entry path.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOW = 10_000
"""How many recent regions the latency percentiles cover."""

RECENT_S = 60.0
"""The sliding window (s) of ``recent`` entry latencies (``krexctl top``)."""

STEPS = ("memory", "close", "drain", "freeze", "pools", "check", "pin")
"""The timed steps of a region's establishment, in order (``krexd.coordinator.protocol``):
the memory wait (from the lock to the attempt that is granted: ~0 unless
an attempt was undone because the holder's memory did not fit; the check
itself runs during the drain), step 2 close, 3 drain, 4 freeze of the
siblings, 4 the rest of the warm pools' freeze (run at the same time as the
siblings'), the fail-closed check ending step 4, 5 the holder's cores."""

LATENCY_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 10_000)
"""Upper bounds (ms) of the entry and step latency histograms (+Inf implied)."""

HOLD_BUCKETS_S = (0.001, 0.01, 0.1, 0.5, 1, 5, 10, 60, 300, 600)
"""Upper bounds (s) of the region hold time histogram (+Inf implied)."""

ENDED_CAUSES = (
    "drain_timeout",
    "lock_failed",
    "unprotected",
    "contaminated",
    "tampered",
    "max_region",
    "place_timeout",
    "other",
)
"""Why krex ended a command (``krex_commands_ended_total{reason}``): the first five
are exit 79 (unprotectable GPU use: did not drain in time, the driver could not
lock it, GPU use without a verified registration, ran inside another's region,
tampered with its gate registrations), ``max_region`` the holder killed after
``max_region_s`` (137), ``place_timeout`` never placed in its cgroup."""


class Histogram:
    """Bucket counts of observations (cumulative only when read).

    ``bounds``: increasing upper bounds; an observation above the last one
    counts in the implied +Inf bucket.  :meth:`observe` is O(log len(bounds)).
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count one observation ``value`` (the unit of ``bounds``)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper bound, observations <= it), ..., (inf, count)]``, as Prometheus reads them.

        Read from another thread while the loop observes: each bucket is
        one int read, so a scrape may be one observation behind in places.
        """
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), list(self.counts), strict=True):
            total += n
            out.append((bound, total))
        return out

    def as_dict(self) -> dict[str, Any]:
        """``{"le": [bounds..., "+Inf"], "counts": [cumulative...], "sum", "count"}``."""
        pairs = self.cumulative()
        return {
            "le": [*self.bounds, "+Inf"],
            "counts": [n for _, n in pairs],
            "sum": self.sum,
            "count": self.count,
        }


def percentiles(samples: Iterable[float]) -> dict[str, float | int]:
    """``{n, p50, p99, max}`` of ``samples`` (nearest rank; zeros when empty)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(round(q * n + 0.5)) - 1))]

    return {"n": n, "p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


def _window() -> deque[float]:
    return deque(maxlen=WINDOW)


@dataclass
class RegionStats:
    """Regions granted, completed, failed at entry, ended by recovery; latencies (ms).

    ``refused``: failed entries by error code name; ``ended``: commands krex
    ended on this GPU by cause (:data:`ENDED_CAUSES`); ``drain_timeouts``:
    entries in which a sibling did not drain in time (it was ended, or the
    entry failed); ``freeze_timeouts``: entries failed because the kernel did
    not report a freeze in time.
    """

    granted: int = 0
    completed: int = 0
    failed: int = 0
    recovered: int = 0
    contaminated: int = 0  # regions the witness saw another process run in
    adopted: int = 0  # regions in progress taken over from the krexd before a restart
    drain_timeouts: int = 0
    freeze_timeouts: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDED_CAUSES, 0))
    wait_ms: deque[float] = field(default_factory=_window)
    establish_ms: deque[float] = field(default_factory=_window)
    # Each step of establish_ms by name (STEPS), for "where does entry go".
    step_ms: dict[str, deque[float]] = field(
        default_factory=lambda: {name: _window() for name in STEPS}
    )
    # (monotonic s of the grant, entry ms): the last RECENT_S seconds, for `krexctl top`.
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    entry_hist: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_MS))
    step_hist: dict[str, Histogram] = field(
        default_factory=lambda: {name: Histogram(LATENCY_BUCKETS_MS) for name in STEPS}
    )
    hold_hist: Histogram = field(default_factory=lambda: Histogram(HOLD_BUCKETS_S))

    def grant(self, wait_ms: float, establish_ms: float) -> None:
        """A region was granted after ``wait_ms`` in the FIFO (step 1) and
        ``establish_ms`` of steps 2-5; its entry (request to grant) took their sum."""
        self.granted += 1
        self.wait_ms.append(wait_ms)
        self.establish_ms.append(establish_ms)
        self.entry_hist.observe(wait_ms + establish_ms)
        self.recent.append((time.monotonic(), wait_ms + establish_ms))

    def steps(self, marks: list[tuple[str, float]]) -> None:
        """Record one granted entry's steps: ``marks`` = (step name, monotonic s at its end),
        in order, the first being the start (its name is ignored)."""
        for (_, start), (name, end) in zip(marks, marks[1:], strict=False):
            if name in self.step_ms:
                ms = (end - start) * 1e3
                self.step_ms[name].append(ms)
                self.step_hist[name].observe(ms)

    def refuse(self, code: str) -> None:
        """An entry failed with error ``code`` (a ``Code`` name, e.g. ``"DRAIN_TIMEOUT"``)."""
        self.failed += 1
        self.refused[code] = self.refused.get(code, 0) + 1
        if code == "DRAIN_TIMEOUT":
            self.drain_timeouts += 1
        elif code == "FREEZE_TIMEOUT":
            self.freeze_timeouts += 1

    def end(self, cause: str) -> None:
        """krex ended a command of this GPU for ``cause`` (:data:`ENDED_CAUSES`, else other)."""
        key = cause if cause in self.ended else "other"
        self.ended[key] += 1

    def held(self, seconds: float) -> None:
        """A region ended (exit or recovery) ``seconds`` after its grant."""
        self.hold_hist.observe(seconds)

    def recent_entry_ms(self, window_s: float = RECENT_S) -> dict[str, float | int]:
        """Percentiles of the entry latencies (ms) of regions granted in the last ``window_s``."""
        since = time.monotonic() - window_s
        return percentiles(ms for at, ms in list(self.recent) if at >= since)

    def as_dict(self) -> dict[str, Any]:
        """The ``regions`` counts and the ``entry_ms``, ``wait_ms`` and ``establish_ms``
        percentiles of the coordinator's status, plus ``recent_entry_ms`` (the last
        :data:`RECENT_S` s) and ``histograms`` (``entry_ms``, ``steps_ms``, ``hold_s``).

        ``entry_ms`` means what it means in the ``region_enter`` reply: from
        the request to the grant (= ``wait_ms`` + ``establish_ms``).
        """
        return {
            "regions": {
                "granted": self.granted,
                "completed": self.completed,
                "failed": self.failed,
                "recovered": self.recovered,
                "contaminated": self.contaminated,
                "adopted": self.adopted,
                "drain_timeouts": self.drain_timeouts,
                "freeze_timeouts": self.freeze_timeouts,
                "refused": dict(self.refused),
            },
            "commands_ended": dict(self.ended),
            "entry_ms": percentiles(map(sum, zip(self.wait_ms, self.establish_ms, strict=True))),
            "recent_entry_ms": self.recent_entry_ms(),
            "wait_ms": percentiles(self.wait_ms),
            "establish_ms": percentiles(self.establish_ms),
            "steps_ms": {name: percentiles(v) for name, v in self.step_ms.items()},
            "histograms": {
                "entry_ms": self.entry_hist.as_dict(),
                "steps_ms": {name: h.as_dict() for name, h in self.step_hist.items()},
                "hold_s": self.hold_hist.as_dict(),
            },
        }
