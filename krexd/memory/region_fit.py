"""The region entry's memory check (``krexd.isolation.RegionMemory``) over the memory monitor.

Frozen siblings keep their memory for the whole region, and the shim
returns an out-of-memory error inside a region at once (waiting on frozen
siblings would deadlock it).  So while the drain waits, the coordinator
asks whether the holder's expected in-region memory fits in what they leave
free; this module answers from the shim's counts read at that moment
(``MemoryMonitor.shim_counts``, and a full ``MemoryMonitor.refresh`` when
that does not fit).  The holder's expectation is the largest of
what it holds now, its peak so far in this command and its learned need
(docs/design/memory.md "Region entry").
"""

from __future__ import annotations

from krexd.isolation import RegionFit
from krexd.memory.monitor import MemoryMonitor
from krexd.tenants import Tenant


class RegionMemoryCheck:
    """:class:`krexd.isolation.RegionMemory` for every GPU's coordinator.

    ``wait_s``: ``[memory] region_wait_s``.  ``monitor`` is attached once the
    memory monitor exists (it is built after the coordinators); until then
    :meth:`check` answers None (no check).
    """

    def __init__(self, wait_s: float, monitor: MemoryMonitor | None = None) -> None:
        self._wait_s = wait_s
        self.monitor = monitor

    @property
    def wait_s(self) -> float:
        """Bound (s) of an entry's wait for siblings to free memory."""
        return self._wait_s

    def check(self, holder: Tenant, siblings: list[Tenant]) -> RegionFit | None:
        """Fresh counts of the holder's GPU: its expected need against ``siblings``' memory.

        First from the shim's counts read now over each tenant's record of
        the last full refresh (the larger of the two): one read of the
        registrations, which every region entry pays.  Only when that does
        not fit, a full refresh (``MemoryMonitor.refresh``: device read per
        process, records updated) decides, so a sibling that freed memory
        since is seen at once.
        """
        m = self.monitor
        if m is None:
            return None
        fit = self._fit(m, holder, siblings, m.shim_counts(holder.gpu))
        if fit is None or fit.fits:
            return fit
        m.refresh(holder.gpu)
        return self._fit(m, holder, siblings, {})

    @staticmethod
    def _fit(
        m: MemoryMonitor, holder: Tenant, siblings: list[Tenant], now: dict[int, int]
    ) -> RegionFit | None:
        view = m.view(holder.gpu)
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
