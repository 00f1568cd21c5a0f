"""``FailClosed``: after step 4, fail closed on GPU use the gate cannot protect.

A sibling process with the GPU open and no verified registration drained
for the epoch (``krexd.tenancy.registrations``) ends its command (exit 79), and the
grant waits until it has left the GPU.
"""

from __future__ import annotations

import asyncio
import time

from krexd.coordinator.isolation import GpuUseCheck
from krexd.coordinator.scope import GpuScope, log
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant


class FailClosed:
    """One GPU's fail-closed check of region entry (``GpuUseCheck``; None: skipped)."""

    def __init__(self, scope: GpuScope, guard: GpuUseCheck | None) -> None:
        self._scope = scope
        self._guard = guard

    async def check(self, holder: Tenant, epoch: int) -> None:
        """After step 4: end siblings that use the GPU unprotected, wait until they left it.

        With the siblings frozen nothing new can open the GPU.  Each sibling
        process with a context and no verified registration drained for
        ``epoch`` (``krexd.tenancy.registrations``) ends its command with exit code
        79; the grant waits (bounded by drain_timeout_s, polling every 2 ms)
        until none of them is on the GPU any more.

        Raises:
            KrexError: DRAIN_TIMEOUT when one is still on the GPU after that.
        """
        guard, scope = self._guard, self._scope
        if guard is None:
            return
        # The /proc reads on the loop (a thread hop cost more than they do with
        # every sibling verified); the driver's process list, if asked, in a thread.
        suspects = guard.unverified(scope.siblings(holder))
        if not suspects:
            return
        found = await asyncio.to_thread(guard.unprotected_among, suspects, epoch)
        if not found:
            return
        ended: dict[int, list[str]] = {}
        for u in found:
            ended.setdefault(u.tenant.id, []).append(u.describe())
        for tid, lines in ended.items():
            tenant = next(u.tenant for u in found if u.tenant.id == tid)
            reason = "; ".join(lines)
            log.error("GPU %d: %s; ending tenant %d's command", scope.gpu, reason, tid)
            scope.end_tenant(tenant, reason, "unprotected")
        pids = {u.pid for u in found}
        timeout_s = scope.cfg.drain_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            users = await asyncio.to_thread(guard.users)
            if users is None or not pids & users:
                return
            if time.monotonic() >= deadline:
                raise KrexError(
                    Code.DRAIN_TIMEOUT,
                    f"GPU {scope.gpu}: unprotected processes {sorted(pids & users)} still on the "
                    f"GPU {timeout_s:g} s after their commands were ended",
                )
            await asyncio.sleep(0.002)
