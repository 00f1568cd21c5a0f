"""krexd's own counters: restarts it continued from and what it adopted.

The per-GPU counters live in each coordinator's ``RegionStats``; the
request and connection counters in the server and its connection guard.
Shown by ``status`` (``daemon``) and the Prometheus endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DaemonCounters:
    """``restarts``: krexd processes before this one whose saved state it adopted, counted
    across restarts (kept in the saved state); ``adopted_tenants``: tenants this krexd
    adopted at its start; ``started_at``: its start (Unix time, s)."""

    restarts: int = 0
    adopted_tenants: int = 0
    started_at: float = field(default_factory=time.time)

    def adopted(self, saved_doc: dict[str, Any], tenants: Sized) -> None:
        """This krexd adopted ``tenants`` from ``saved_doc`` (the saved state's document)."""
        before = saved_doc.get("restarts", 0)
        self.restarts = (before if isinstance(before, int) and before >= 0 else 0) + 1
        self.adopted_tenants = len(tenants)

    def as_dict(self) -> dict[str, Any]:
        """``{"restarts", "adopted_tenants", "started_at"}`` for ``status``."""
        return {
            "restarts": self.restarts,
            "adopted_tenants": self.adopted_tenants,
            "started_at": self.started_at,
        }
