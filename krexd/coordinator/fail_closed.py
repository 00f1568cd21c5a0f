"""After step 4: fail closed on GPU use the gate cannot protect.

A sibling process with the GPU open and no verified registration drained
for the epoch (``krexd.registrations``) ends its command (exit 79), and the
grant waits until it has left the GPU.
"""

from __future__ import annotations

import asyncio
import logging
import time

from krex_client.errors import ExitCode
from krexd.coordinator.base import CoordinatorBase
from krexd.errors import Code, KrexError
from krexd.isolation import gone
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class FailClosed(CoordinatorBase):
    """The fail-closed check of region entry (``GpuUseCheck``)."""

    async def _fail_closed(self, holder: Tenant, epoch: int) -> None:
        """After step 4: end siblings that use the GPU unprotected, wait until they left it.

        With the siblings frozen nothing new can open the GPU.  Each sibling
        process with a context and no verified registration drained for
        ``epoch`` (``krexd.registrations``) ends its command with exit code
        79; the grant waits (bounded by drain_timeout_s) until none of them
        is on the GPU any more, else the entry fails with DRAIN_TIMEOUT.
        """
        if self._guard is None:
            return
        guard = self._guard
        # The /proc reads on the loop (a thread hop cost more than they do with
        # every sibling verified); the driver's process list, if asked, in a thread.
        suspects = guard.unverified(self._siblings(holder))
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
            log.error("GPU %d: %s; ending tenant %d's command", self.gpu, reason, tid)
            self._end_unprotected(tenant, reason)
        pids = {u.pid for u in found}
        deadline = time.monotonic() + self._cfg.drain_timeout_s
        while True:
            users = await asyncio.to_thread(guard.users)
            if users is None or not pids & users:
                return
            if time.monotonic() >= deadline:
                raise KrexError(
                    Code.DRAIN_TIMEOUT,
                    f"GPU {self.gpu}: unprotected processes {sorted(pids & users)} still on the "
                    f"GPU {self._cfg.drain_timeout_s:g} s after their commands were ended",
                )
            await asyncio.sleep(0.002)

    def _end_unprotected(self, tenant: Tenant, reason: str, cause: str = "unprotected") -> None:
        if self._end_command is not None:
            self._end_command(tenant, reason, ExitCode.UNPROTECTABLE, cause)
            return
        self.stats.end(cause)
        tenant.kill_reason = reason
        try:
            self._ctl.kill(tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, tenant.id, exc)
