"""Step 4's end: fail closed on GPU use the gate cannot protect.

A sibling process with the GPU open and no verified registration drained
for the epoch (``krexd.registrations``) ends its command (exit 79), and the
grant waits until it has left the GPU.  Each sibling frozen during the
drain is checked as soon as it reports frozen, while the others still
drain (``krexd.coordinator.early_check``); the rest after step 4, in one
pass.
"""

from __future__ import annotations

import asyncio
import logging
import time

from krex_client.errors import ExitCode
from krexd.coordinator.base import CoordinatorBase
from krexd.coordinator.early_check import EarlyChecks
from krexd.errors import Code, KrexError
from krexd.isolation import gone
from krexd.registrations import Suspect
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class FailClosed(CoordinatorBase):
    """The fail-closed check of region entry (``GpuUseCheck``)."""

    def _early_checks(self, epoch: int) -> EarlyChecks:
        """The checks of the siblings frozen during the drain of ``epoch``.

        None without a guard, or with ``[region] early_check = false``: every
        sibling is then checked after step 4.
        """
        guard = self._guard
        if guard is None or not self._cfg.early_check:
            return EarlyChecks()
        return EarlyChecks(
            self._ctl,
            self._cfg.freeze_timeout_s,
            lambda frozen: self._end_unprotected(guard.unverified(frozen), epoch),
        )

    async def _fail_closed(self, holder: Tenant, epoch: int, early: EarlyChecks) -> None:
        """After step 4: end siblings that use the GPU unprotected, wait until they left it.

        With the siblings frozen nothing new can open the GPU.  Each sibling
        process with a context and no verified registration drained for
        ``epoch`` (``krexd.registrations``) ends its command with exit code
        79; the grant waits (bounded by drain_timeout_s) until none of them
        is on the GPU any more, else the entry fails with DRAIN_TIMEOUT.
        The siblings ``early`` checked during the drain are waited for, not
        checked again; the others are checked here, in one pass.
        """
        checked = await early.finish()
        if self._guard is None:
            return
        # The /proc reads on the loop (a thread hop cost more than they do with
        # every sibling verified); the driver's process list, if asked, in a thread.
        rest = [t for t in self._siblings(holder) if t.id not in checked]
        await self._end_unprotected(self._guard.unverified(rest) if rest else [], epoch)

    async def _end_unprotected(self, suspects: list[Suspect], epoch: int) -> None:
        """End the commands of ``suspects`` that have the GPU open; wait until they left it.

        ``suspects``: sibling processes without a verified registration
        (``GpuUseCheck.unverified``), of frozen siblings.  Asks the driver's
        process list (in a thread) only when there is one.  Raises
        DRAIN_TIMEOUT when one is still on the GPU drain_timeout_s after.
        """
        if not suspects:
            return
        assert self._guard is not None
        guard = self._guard
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
            self._end_command_of(tenant, reason)
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

    def _end_command_of(self, tenant: Tenant, reason: str) -> None:
        if self._end_command is not None:
            self._end_command(tenant, reason, ExitCode.UNPROTECTABLE)
            return
        tenant.kill_reason = reason
        try:
            self._ctl.kill(tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, tenant.id, exc)
