"""Per-GPU region coordinator: the region lock, region entry and exit, recovery.

One ``Coordinator`` per GPU runs krexd's half of the region protocol (paper
§4.2), told step by step, with the function that does each step, in
docs/design/architecture.md "The region protocol, step by step".
"""

from __future__ import annotations

from krexd.coordinator.coordinator import Coordinator
from krexd.coordinator.records import ENTERING, HELD, QUEUED, Region, RegionRequest

__all__ = ["ENTERING", "HELD", "QUEUED", "Coordinator", "Region", "RegionRequest"]
