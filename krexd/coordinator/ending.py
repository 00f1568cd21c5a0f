"""Region exit (steps 7-8) and recovery: the one end path, bound to its ``Region``.

``exit`` ends the holder's region; recovery ends it the same way when the
holder's process exits or the region outlives ``max_region_s``.  Why the
thaw comes before the reopen and the release: ``krexd.coordinator``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from krexd import states, testhooks
from krexd.coordinator.cores import HolderCores
from krexd.coordinator.freezing import Freezing
from krexd.coordinator.gate_steps import GateSteps
from krexd.coordinator.records import Region, tenant_state
from krexd.coordinator.witness import Witness
from krexd.errors import Code, KrexError
from krexd.isolation import gone
from krexd.journal import log_fields
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class Ending(Freezing, HolderCores, GateSteps, Witness):
    """Steps 7-8, and what starts them when the holder cannot."""

    async def exit(
        self,
        tenant: Tenant,
        epoch: int,
        sync_ms: float,
        launches: int,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Run region exit (steps 7-8) for the holder and return the region_exit body.

        Idempotent per (tenant, epoch): a second copy, in flight or after the
        first was answered, gets the first one's reply
        (``krexd.coordinator.once``); an exit re-sent after a restart for a
        region that ended meanwhile is answered (with zero times) as often
        as it comes.

        Args:
            tenant: the authenticated tenant; must be the holder.
            epoch: the epoch its region_enter returned.
            sync_ms: how long the holder's shim waited for its own contexts
                (reported back, for the record).
            launches: launches the holder made inside the region.
            request_id: the client's id of this request (None: none sent);
                the key of an ungated region's exit (epoch 0).

        Returns:
            ``{region_ms, thaw_ms, sync_ms, launches}``.

        Raises:
            KrexError: NOT_HOLDER (no region, another holder, or a stale epoch),
                REGION_ABORTED (recovery ended the region first).
        """
        key = f"exit:{epoch}" if epoch else (f"exit:{request_id}" if request_id else None)
        return await self._once.run(
            tenant.id, key, lambda: self._exit(tenant, epoch, sync_ms, launches)
        )

    async def _exit(
        self, tenant: Tenant, epoch: int, sync_ms: float, launches: int
    ) -> dict[str, Any]:
        """:meth:`exit` for the first copy of a request."""
        if self._is_ungated(tenant):
            self._ungated.exit(tenant)
            return {"region_ms": 0.0, "thaw_ms": 0.0, "sync_ms": sync_ms, "launches": launches}
        region = self._region
        holds = region is not None and region.tenant.id == tenant.id
        if not (holds and region is not None and region.epoch == epoch) and epoch in (
            self._resumed.get(tenant.id),
            self._exited.get(tenant.id),
        ):
            # Re-sent after a restart, for a region that ended meanwhile: answer it again.
            return {"region_ms": 0.0, "thaw_ms": 0.0, "sync_ms": sync_ms, "launches": launches}
        if region is None or not holds:
            raise KrexError(
                Code.NOT_HOLDER, f"tenant {tenant.id} holds no region on GPU {self.gpu}"
            )
        if region.epoch != epoch:
            raise KrexError(
                Code.NOT_HOLDER,
                f"epoch {epoch} is not the current region's ({region.epoch})",
            )
        thaw_ms = await self._end(region, "exit")
        if thaw_ms is None:  # recovery ended it first
            raise KrexError(Code.REGION_ABORTED, f"region ended: {region.end_reason}")
        self.stats.completed += 1
        region_ms = (time.monotonic() - region.granted_at) * 1e3
        return {
            "region_ms": region_ms,
            "thaw_ms": thaw_ms,
            "sync_ms": sync_ms,
            "launches": launches,
            "witness": await self._witness(region),
        }

    async def _end(self, region: Region, reason: str) -> float | None:
        """Steps 7-8 for ``region``, once; None when it had already ended.

        Serialized with every other end path (paper §4.2: "serializes the two
        paths ... so they cannot modify the gate and freeze state
        concurrently"), and bound to ``region``: ending a region that is no
        longer current does nothing.
        """
        async with self._end_lock:
            if region.ended or self._region is not region:
                return None
            region.ended = True
            region.end_reason = reason
            region.ended_at = time.monotonic()
            self.stats.held(region.ended_at - region.granted_at)
            self._unwatch(region)
            recovering = reason != "exit"
            # Step 7: the holder's cores back to its off-region share; siblings thawed.
            # HELD -> THAWING (exit) or HELD -> RECOVERING (holder died, timed out, ...)
            self._region_state(states.RECOVERING if recovering else states.REGION_THAWING)
            # The entry's undo stack, unwound: cores, the pools' and siblings' thaw, unlock.
            t = time.monotonic()
            await region.undo.unwind()
            thaw_ms = (time.monotonic() - t) * 1e3
            testhooks.pause("thawed")
            # Step 8: only after the thaw, reopen the gate, then release the lock.
            if not recovering:
                self._region_state(states.REOPENING)  # THAWING -> REOPENING
            self._reopen_gate(region.tenant.id, region.epoch)
            tenant_state(region.tenant, states.HOLDING, states.RUNNING)  # HOLDING -> RUNNING
            self._region = None
            self._frozen = None
            if self._requests.get(region.tenant.id) is not None:
                del self._requests[region.tenant.id]
            if not recovering:
                self._exited[region.tenant.id] = region.epoch
            self._region_state(states.IDLE)  # REOPENING/RECOVERING -> IDLE
            self._lock.release(region.tenant.id)
            self._log_end(region, reason)
            return thaw_ms

    def _log_end(self, region: Region, reason: str) -> None:
        """Count and log a region's end: recovery at warning, an exit at debug."""
        if reason != "exit":
            self.stats.recovered += 1
            log.warning(
                "GPU %d: region of tenant %d (epoch %d) ended by recovery: %s",
                self.gpu,
                region.tenant.id,
                region.epoch,
                reason,
                extra=log_fields("region_recovered", region.tenant.id, self.gpu, region.epoch),
            )
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(
                "GPU %d: tenant %d exited its region (epoch %d) after %.3f ms",
                self.gpu,
                region.tenant.id,
                region.epoch,
                ((region.ended_at or region.granted_at) - region.granted_at) * 1e3,
                extra=log_fields("region_exited", region.tenant.id, self.gpu, region.epoch),
            )

    # --------------------------------------------------------------- recovery

    def _watch(self, region: Region) -> None:
        """Recover when the holder's process exits or the region outlives max_region_s."""
        loop = asyncio.get_running_loop()
        region.holder_watch = self._ctl.watch_exit(
            region.pid, lambda: self._schedule_end(region, "holder process exited")
        )
        if self._cfg.max_region_s > 0:
            region.timer = loop.call_later(self._cfg.max_region_s, self._expire, region)

    def _unwatch(self, region: Region) -> None:
        if region.holder_watch is not None:
            region.holder_watch.cancel()
            region.holder_watch = None
        if region.timer is not None:
            region.timer.cancel()
            region.timer = None

    def _schedule_end(self, region: Region, reason: str) -> None:
        self._spawn(self._end(region, reason))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a recovery in the background, keeping it referenced and its errors logged."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("GPU %d: recovery failed", self.gpu, exc_info=t.exception())

        task.add_done_callback(done)

    def _expire(self, region: Region) -> None:
        """max_region_s passed: kill the holder's command, then end its region."""
        if region.ended or self._region is not region:
            return
        reason = f"critical region exceeded max_region_s = {self._cfg.max_region_s:g} s"
        region.tenant.kill_reason = reason
        self.stats.end("max_region")
        log.warning(
            "GPU %d: tenant %d: %s; killing its command",
            self.gpu,
            region.tenant.id,
            reason,
            extra=log_fields(
                "command_ended", region.tenant.id, self.gpu, region.epoch, "max_region"
            ),
        )
        try:
            self._ctl.kill(region.tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, region.tenant.id, exc)
        self._spawn(self._end(region, reason))
