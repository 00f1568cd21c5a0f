"""``DriverLocks``: what one region's entry locked through the driver, and whom it found.

Kept apart from ``driver_locking`` so that ``records`` (the ``Region``) can
hold one without importing the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from krexd.driverlock import Result


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

    def record(self) -> dict[str, object]:
        """The grant's and the region log's view: locked, foreign, ended, lock_ms."""
        return {
            "locked": len(self.pids),
            "foreign": list(self.foreign),
            "offenders_ended": list(self.ended),
            "unsupported": list(self.unsupported),
            "lock_ms": round(self.lock_ms, 3),
        }
