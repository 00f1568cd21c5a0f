"""The region entry's memory check (``isolation.RegionMemory``) over the memory views.

Frozen siblings keep their memory for the whole region, and the shim
returns an out-of-memory error inside a region at once (waiting on frozen
siblings would deadlock it).  So while the drain waits, the coordinator
asks whether the holder's expected in-region memory fits in what they leave
free; this module answers from the shim's counts read at that moment
(``MemoryViews.shim_counts``, and a full ``MemoryViews.refresh`` when
that does not fit: ``krexd.memory.views``).  The holder's expectation is the largest of
what it holds now, its peak so far in this command and its learned need
(docs/design/memory.md "Region entry").
"""

from __future__ import annotations

from typing import Protocol

from krexd.coordinator.isolation import RegionFit
from krexd.memory.view import GpuView
from krexd.tenancy.tenants import Tenant


class FitViews(Protocol):
    """What the check reads of the GPUs' memory (``krexd.memory.views.MemoryViews``)."""

    def shim_counts(self, gpu: int) -> dict[int, int]:
        """Tenant id -> bytes by the shim's count on ``gpu``, read now."""
        ...

    def refresh(self, gpu: int | None = None) -> None:
        """Re-read ``gpu``'s counts in full, records updated."""
        ...

    def view(self, gpu: int) -> GpuView | None:
        """``gpu``'s view as of the last refresh (None before the first)."""
        ...


class RegionMemoryCheck:
    """:class:`krexd.coordinator.isolation.RegionMemory` for every GPU's coordinator.

    ``wait_s``: ``[memory] region_wait_s``; ``views``: the GPUs' memory views.
    A GPU without a view yet (before the first device read) gets no check (None).
    """

    def __init__(self, wait_s: float, views: FitViews) -> None:
        self._wait_s = wait_s
        self._views = views

    @property
    def wait_s(self) -> float:
        """Bound (s) of an entry's wait for siblings to free memory."""
        return self._wait_s

    def check(self, holder: Tenant, siblings: list[Tenant]) -> RegionFit | None:
        """Fresh counts of the holder's GPU: its expected need against ``siblings``' memory.

        First from the shim's counts read now over each tenant's record of
        the last full refresh (the larger of the two): one read of the
        registrations, which every region entry pays.  Only when that does
        not fit, a full refresh (``MemoryViews.refresh``: device read per
        process, records updated) decides, so a sibling that freed memory
        since is seen at once.  None when the GPU has no view yet.
        """
        views = self._views
        fit = self._fit(views, holder, siblings, views.shim_counts(holder.gpu))
        if fit is None or fit.fits:
            return fit
        views.refresh(holder.gpu)
        return self._fit(views, holder, siblings, {})

    @staticmethod
    def _fit(
        views: FitViews, holder: Tenant, siblings: list[Tenant], now: dict[int, int]
    ) -> RegionFit | None:
        view = views.view(holder.gpu)
        if view is None:
            return None
        rec = holder.memory
        need = max(
            rec.used_bytes,
            rec.peak_bytes,
            rec.shim_peak_bytes,
            rec.learned_bytes or 0,
            now.get(holder.id, 0),
        )
        held = sum(max(t.memory.used_bytes, now.get(t.id, 0)) for t in siblings)
        return RegionFit(need=need, total=view.total, siblings=held, other=view.other)
