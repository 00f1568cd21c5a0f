"""``DriverLocks``: what one region's entry locked through the driver, and whom it found.

Kept apart from ``driver_locking`` so that ``records`` (the ``Region``) can
hold one without importing the steps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from krexd.hardware.driverlock import Result


@dataclass
class DriverLocks:
    """What one region's entry locked, and whom it found (for the region record)."""

    pids: list[int] = field(default_factory=list)  # locked; unlocked at the region's end
    foreign: list[int] = field(default_factory=list)  # processes outside krex on the GPU
    ended: list[int] = field(default_factory=list)  # tenants ended as offenders
    unsupported: list[int] = field(default_factory=list)  # the driver cannot lock (MPS)
    lock_ms: float = 0.0
    failed: list[Result] = field(default_factory=list)  # locks that did not settle, to judge
    users: set[int] | None = None  # the GPU's users when the drain began (None: unknown)
    # Set by the unlock at the region's end (or its entry's undo): a lock call that
    # returns later unlocks what it locked instead of adding it here.  The lock
    # orders the drain thread's appends against that unlock's take of ``pids``.
    closed: bool = False
    released: list[int] = field(default_factory=list)  # what the region's end unlocked
    mu: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_locked(self, pids: list[int]) -> list[int]:
        """Record ``pids`` as locked; those not recorded because the region has ended."""
        with self.mu:
            if self.closed:
                return pids
            self.pids.extend(pids)
            return []

    def close(self) -> list[int]:
        """The region ends: no pid is added after this; the pids locked, to unlock."""
        with self.mu:
            self.closed = True
            pids, self.pids = list(self.pids), []
            self.released = pids
            return pids

    def record(self) -> dict[str, object]:
        """The grant's and the region log's view: locked, foreign, ended, lock_ms."""
        return {
            "locked": len(self.pids),
            "foreign": list(self.foreign),
            "offenders_ended": list(self.ended),
            "unsupported": list(self.unsupported),
            "lock_ms": round(self.lock_ms, 3),
        }
