"""Counters and entry-latency percentiles of one GPU's critical regions.

Kept by the coordinator, shown by ``krexctl status`` (``gpus[].region``) and
summarized by the region latency benchmark.  Latencies are ms; the window is
the last :data:`WINDOW` regions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

WINDOW = 10_000
"""How many recent regions the latency percentiles cover."""


STEPS = ("memory", "close", "drain", "freeze", "pools", "check", "pin")
"""The timed steps of a region's establishment, in order (``krexd.coordinator.entry``):
the memory wait (from the lock to the attempt that is granted: ~0 unless
an attempt was undone because the holder's memory did not fit; the check
itself runs during the drain), step 2 close, 3 drain, 4 freeze of the
siblings, 4 the rest of the warm pools' freeze (run at the same time as the
siblings'), the fail-closed check ending step 4, 5 the holder's cores."""


def percentiles(samples: Iterable[float]) -> dict[str, float | int]:
    """``{n, p50, p99, max}`` of ``samples`` (nearest rank; zeros when empty)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}

    def rank(q: float) -> float:
        return ordered[min(n - 1, max(0, int(round(q * n + 0.5)) - 1))]

    return {"n": n, "p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


@dataclass
class RegionStats:
    """Regions granted, completed, failed at entry, ended by recovery; latencies (ms)."""

    granted: int = 0
    completed: int = 0
    failed: int = 0
    recovered: int = 0
    contaminated: int = 0  # regions the witness saw another process run in
    wait_ms: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    establish_ms: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    # Each step of establish_ms by name (STEPS), for "where does entry go".
    step_ms: dict[str, deque[float]] = field(
        default_factory=lambda: {name: deque(maxlen=WINDOW) for name in STEPS}
    )

    def grant(self, wait_ms: float, establish_ms: float) -> None:
        """A region was granted after ``wait_ms`` in the FIFO (step 1) and
        ``establish_ms`` of steps 2-5; its entry (request to grant) took their sum."""
        self.granted += 1
        self.wait_ms.append(wait_ms)
        self.establish_ms.append(establish_ms)

    def steps(self, marks: list[tuple[str, float]]) -> None:
        """Record one granted entry's steps: ``marks`` = (step name, monotonic s at its end),
        in order, the first being the start (its name is ignored)."""
        for (_, start), (name, end) in zip(marks, marks[1:], strict=False):
            if name in self.step_ms:
                self.step_ms[name].append((end - start) * 1e3)

    def as_dict(self) -> dict[str, Any]:
        """The ``regions`` counts and the ``entry_ms``, ``wait_ms`` and ``establish_ms``
        percentiles of the coordinator's status.

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
            },
            "entry_ms": percentiles(map(sum, zip(self.wait_ms, self.establish_ms, strict=True))),
            "wait_ms": percentiles(self.wait_ms),
            "establish_ms": percentiles(self.establish_ms),
            "steps_ms": {name: percentiles(v) for name, v in self.step_ms.items()},
        }
