"""After step 7: an outside witness of the region — did anyone else run on the GPU?

The drain and the lock make a region exclusive; the witness checks that it
was, from a source the tenants cannot write: the driver's per-process
activity on the GPU (NVML's per-process utilization on a real GPU, the fake
driver's operation records on a simulated one; ``krexd.activity``).  Any
process other than the holder's with GPU work inside the region's window
(grant to exit request) makes the region *contaminated*: the exit reply
and so the region record name each such process, krexd logs it, and a krex
tenant that caused it is ended (exit 79) when the source is exact.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from krex_client.errors import ExitCode
from krexd.coordinator.driver_locking import DriverLocking
from krexd.coordinator.records import Region
from krexd.procfs import cmdline

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class Witness(DriverLocking):
    """The witness of a region that ended (``_witness``)."""

    async def _witness(self, region: Region) -> dict[str, Any] | None:
        """What the activity source saw during ``region``: None without a source.

        Returns ``{"source", "contaminated", "others": [{pid, busy_ms,
        tenant, command}]}``.  Ends the krex tenants among ``others``
        (exit 79) when the source is exact.
        """
        source = self._activity
        if region.ended_at is None:
            return None
        if source is None:
            return await self._coverage(region)
        t0, t1 = int(region.granted_at * 1e9), int(region.ended_at * 1e9)
        try:
            busy = await asyncio.to_thread(source.busy, self.gpu, t0, t1)
        except OSError as exc:
            log.error("GPU %d: region witness unavailable: %s", self.gpu, exc)
            return None
        holder = region.holder_pids | set(self._ctl.processes(region.tenant))
        others = {p: ns for p, ns in busy.items() if p not in holder and ns > 0}
        owner = {p: t for t in self._tenants for p in self._ctl.processes(t)}
        seen = []
        for pid, ns in sorted(others.items()):
            tenant = owner.get(pid)
            seen.append(
                {
                    "pid": pid,
                    "busy_ms": round(ns / 1e6, 3),
                    "tenant": tenant.id if tenant is not None else None,
                    "command": cmdline(pid),
                }
            )
        out = {"source": type(source).__name__, "contaminated": bool(seen), "others": seen}
        if seen:
            self.stats.contaminated += 1
            log.error(
                "GPU %d: region of tenant %d (epoch %d) contaminated: %s",
                self.gpu,
                region.tenant.id,
                region.epoch,
                "; ".join(f"pid {o['pid']} ({o['command']}) {o['busy_ms']} ms" for o in seen),
            )
            if source.exact:
                self._end_contaminators(region, [owner[p] for p in others if p in owner])
        return out

    async def _coverage(self, region: Region) -> dict[str, Any] | None:
        """Without an exact activity source (a real GPU): who was on the GPU unlocked.

        NVML's per-process utilization averages about a second per sample
        (docs/bench/driver-lock.md), too coarse to tell a millisecond region
        from the work around it, so on a real GPU the witness reports the
        processes on the GPU at exit that the driver had not locked for the
        region (other than the holder's and the frozen siblings'): each could
        have run inside it.  ``contaminated`` is then None (unknown).
        """
        if self._guard is None or self._proc_lock is None:
            return None
        users = await asyncio.to_thread(self._guard.users)
        if users is None:
            return None
        locks = region.locks
        covered = region.holder_pids | set(self._ctl.processes(region.tenant))
        covered |= set([*locks.pids, *locks.released] if locks else [])  # unlocked by now
        covered |= {p for t in region.siblings for p in self._ctl.processes(t)}
        unlocked = sorted(users - covered)
        return {
            "source": "driver lock coverage",
            "contaminated": None,
            "others": [
                {"pid": p, "busy_ms": None, "tenant": None, "command": cmdline(p)} for p in unlocked
            ],  # fmt: skip
        }

    def _end_contaminators(self, region: Region, tenants: list[Any]) -> None:
        for tenant in {t.id: t for t in tenants if t.id != region.tenant.id}.values():
            reason = (
                f"its GPU work ran inside tenant {region.tenant.id}'s critical region "
                f"(GPU {self.gpu}, epoch {region.epoch})"
            )
            log.error("GPU %d: tenant %d: %s; ending its command", self.gpu, tenant.id, reason)
            if self._end_command is not None:
                self._end_command(tenant, reason, ExitCode.UNPROTECTABLE, "contaminated")
            else:
                self._end_unprotected(tenant, reason, "contaminated")
