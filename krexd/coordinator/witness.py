"""After step 7: an outside witness of the region — did anyone else run on the GPU?

The drain and the lock make a region exclusive; the witness checks that it
was, from a source the tenants cannot write: the driver's per-process
activity on the GPU (NVML's per-process utilization on a real GPU, the fake
driver's operation records on a simulated one; ``krexd.memory.activity``).  Any
process other than the holder's with GPU work inside the region's window
(grant to exit request) makes the region *contaminated*: the exit reply
and so the region record name each such process, krexd logs it, and a krex
tenant that caused it is ended (exit 79) when the source is exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

from krexd.coordinator.isolation import ActivityWitness, GpuUseCheck
from krexd.coordinator.records import Region
from krexd.coordinator.scope import GpuScope, log
from krexd.system.procfs import cmdline
from krexd.tenancy.tenants import Tenant


class Witness:
    """The witness of one GPU's regions, after their end.

    Args:
        scope: the GPU's scope.
        activity: per-process GPU activity (``krexd.memory.activity``; None: the
            driver lock's coverage, when ``locking`` and ``guard`` allow).
        guard: who has the GPU open (None: no coverage either).
        locking: do regions lock processes through the driver (coverage
            is reported only then)?
    """

    def __init__(
        self,
        scope: GpuScope,
        activity: ActivityWitness | None,
        guard: GpuUseCheck | None,
        locking: bool,
    ) -> None:
        self._scope = scope
        self._activity = activity
        self._guard = guard
        self._locking = locking

    async def see(self, region: Region) -> dict[str, Any] | None:
        """After step 7: what the activity source saw during ``region`` (grant to the
        start of its end); None without a source, or before the region ended.

        Returns ``{"source", "contaminated", "others": [{pid, busy_ms,
        tenant, command}]}`` (busy_ms in ms).  Ends the krex tenants among
        ``others`` (exit 79) when the source is exact.  Never raises on a
        source's OSError (logged, None).
        """
        source, scope = self._activity, self._scope
        if region.ended_at is None:
            return None
        if source is None:
            return await self._coverage(region)
        t0, t1 = int(region.granted_at * 1e9), int(region.ended_at * 1e9)
        try:
            busy = await asyncio.to_thread(source.busy, scope.gpu, t0, t1)
        except OSError as exc:
            log.error("GPU %d: region witness unavailable: %s", scope.gpu, exc)
            return None
        holder = region.holder_pids | set(scope.control.processes(region.tenant))
        others = {p: ns for p, ns in busy.items() if p not in holder and ns > 0}
        owner = {p: t for t in scope.tenants for p in scope.control.processes(t)}
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
            scope.stats.contaminated += 1
            log.error(
                "GPU %d: region of tenant %d (epoch %d) contaminated: %s",
                scope.gpu,
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
        if self._guard is None or not self._locking:
            return None
        users = await asyncio.to_thread(self._guard.users)
        if users is None:
            return None
        scope, locks = self._scope, region.locks
        covered = region.holder_pids | set(scope.control.processes(region.tenant))
        covered |= set([*locks.pids, *locks.released] if locks else [])  # unlocked by now
        covered |= {p for t in region.siblings for p in scope.control.processes(t)}
        unlocked = sorted(users - covered)
        return {
            "source": "driver lock coverage",
            "contaminated": None,
            "others": [
                {"pid": p, "busy_ms": None, "tenant": None, "command": cmdline(p)} for p in unlocked
            ],  # fmt: skip
        }

    def _end_contaminators(self, region: Region, tenants: list[Tenant]) -> None:
        scope = self._scope
        for tenant in {t.id: t for t in tenants if t.id != region.tenant.id}.values():
            reason = (
                f"its GPU work ran inside tenant {region.tenant.id}'s critical region "
                f"(GPU {scope.gpu}, epoch {region.epoch})"
            )
            log.error("GPU %d: tenant %d: %s; ending its command", scope.gpu, tenant.id, reason)
            scope.end_tenant(tenant, reason, "contaminated")
