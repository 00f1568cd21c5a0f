"""Region entry: the request recorded (step 0), then steps 1-5, undone on failure.

The steps read in the paper's order in ``_enter_recorded`` (1: the region
lock) and ``_establish`` (2: close, 3: drain, 4: freeze and fail closed,
5: the holder's cores); steps 3 and 4 overlap: a sibling tenant is frozen
as soon as it has drained (``krexd.coordinator.drain_freeze``).  The memory
check (``MemoryWait``) runs while the drain waits; when the holder's memory
does not fit, the entry is undone, waits and runs again
(``_establish_fitting``).  Every
failed entry undoes what it did (cores, thaw, gate) before it reports the
error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from krexd import states, testhooks
from krexd.coordinator.drain_freeze import DrainFreeze
from krexd.coordinator.ending import Ending, log
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.memory_wait import MemoryWait
from krexd.coordinator.records import ENTERING, HELD, Region, RegionRequest, tenant_state
from krexd.errors import Code, KrexError
from krexd.journal import log_fields
from krexd.tenants import Tenant


def _code_name(exc: BaseException) -> str:
    """The error code a failed entry is counted under (``RegionStats.refused``)."""
    if isinstance(exc, KrexError):
        return exc.code.name
    return "CANCELLED" if isinstance(exc, asyncio.CancelledError) else "INTERNAL"


class _MemoryShort(Exception):
    """The memory check during the drain: the holder's need does not fit (entry undone)."""


class Entry(Ending, MemoryWait):
    """``region_enter``: steps 0-5."""

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None = None
    ) -> dict[str, Any]:
        """Run region entry for ``tenant`` and return the grant (region_enter reply body).

        Args:
            tenant: the authenticated requesting tenant (must be on this GPU).
            pid: the requesting process; must be in the tenant's cgroup.
            tid: the submitting thread (Linux thread id) to pin to the
                reserved cores.
            request_id: the client's id of this request (None from a client
                that sends none): a second copy of it, in flight or answered,
                gets the first one's reply (``krexd.coordinator.once``), and
                a copy re-sent for the region a restarted krexd adopted is
                granted again.

        Returns:
            ``{epoch, gpu, reserved_cores, l2_flush, wait_ms, entry_ms,
            drain_ms, freeze_ms}``; times in ms: ``wait_ms`` in the FIFO
            (step 1), ``entry_ms`` from the request to the grant (steps
            1-5), ``drain_ms`` step 3, ``freeze_ms`` step 4 (with the
            fail-closed check after it, ``check_ms``).

        Raises:
            KrexError: NESTED_REGION (tenant already holds or waits),
                BAD_FIELD (pid/tid not the tenant's), DRAIN_TIMEOUT,
                FREEZE_TIMEOUT, CANCELLED (tenant ended while waiting),
                REGION_NO_MEMORY (its expected memory can never fit beside
                its siblings), SHUTTING_DOWN.
        """
        key = f"enter:{request_id}" if request_id else None
        return await self._once.run(
            tenant.id, key, lambda: self._enter(tenant, pid, tid, request_id)
        )

    async def _enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None
    ) -> dict[str, Any]:
        """:meth:`enter` for the first copy of a request."""
        requested_at = time.monotonic()
        self._check_caller(tenant, pid, tid)
        if self._is_ungated(tenant):
            self._ungated.enter(tenant)
            return self._grant_reply(None, 0.0, 0.0)
        region = self._region
        if region is not None and region.tenant.id == tenant.id and not region.ended:
            if self._granted_again(region, request_id):
                return self._grant_reply(region, 0.0, 0.0)
        if tenant.id in self._requests:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        request = self._requests[tenant.id] = RegionRequest(tenant.id)
        try:
            return await self._enter_recorded(request, tenant, pid, tid, requested_at, request_id)
        finally:
            if request.stage != HELD and self._requests.get(tenant.id) is request:
                del self._requests[tenant.id]

    @staticmethod
    def _granted_again(region: Region, request_id: str | None) -> bool:
        """Is this region_enter a copy of the one ``region`` (its tenant's) was granted for?

        With request ids: when the ids match.  Without (an older client, or a
        region an older krexd saved): the first region_enter after adoption.
        """
        if region.request_id is not None or request_id is not None:
            return region.request_id == request_id
        if region.adopted:
            region.adopted = False
            return True
        return False

    async def _enter_recorded(
        self,
        request: RegionRequest,
        tenant: Tenant,
        pid: int,
        tid: int,
        requested_at: float,
        request_id: str | None,
    ) -> dict[str, Any]:
        """Steps 1-5 for a recorded request; a cancel at any step is honoured."""
        # Step 1: the region lock, one holder at a time, FIFO.
        try:
            await self._lock.acquire(tenant.id)
        except asyncio.CancelledError:
            raise KrexError(
                Code.CANCELLED, f"tenant {tenant.id} ended while waiting for the region"
            ) from None
        if request.cancelled:  # cancelled after the hand-over, before this task resumed
            self._lock.release(tenant.id)
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        locked_at = time.monotonic()
        request.advance(ENTERING)
        marks = [("locked", locked_at)]
        try:
            region = await self._establish_fitting(tenant, request, pid, tid, requested_at, marks)
        except BaseException as exc:
            self.stats.refuse(_code_name(exc))
            self._lock.release(tenant.id)
            raise
        region.request_id = request_id
        request.advance(HELD)
        testhooks.pause("granted")
        if request.cancelled:
            await self._end(region, "cancelled by its holder")
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        wait_ms = (locked_at - requested_at) * 1e3
        establish_ms = (region.granted_at - locked_at) * 1e3
        self.stats.grant(wait_ms, establish_ms)
        self.stats.steps(marks)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "GPU %d: tenant %d granted a region (epoch %d) after %.3f ms",
                self.gpu,
                tenant.id,
                region.epoch,
                wait_ms + establish_ms,
                extra=log_fields("region_granted", tenant.id, self.gpu, region.epoch),
            )
        return self._grant_reply(region, wait_ms, establish_ms)

    def _grant_reply(
        self, region: Region | None, wait_ms: float, establish_ms: float
    ) -> dict[str, Any]:
        """The region_enter reply body (ms); ``entry_ms`` = wait + steps 2-5.

        ``region``: the region granted (None: an ungated one, epoch 0).
        """
        return {
            "epoch": region.epoch if region else 0,
            "gpu": self.gpu,
            "reserved_cores": list(self._slice.reserved) if region else [],
            "l2_flush": self._cfg.l2_flush,
            "wait_ms": wait_ms,
            "entry_ms": wait_ms + establish_ms,
            "drain_ms": region.drain_ms if region else 0.0,
            "freeze_ms": region.freeze_ms if region else 0.0,
            "check_ms": region.check_ms if region else 0.0,
            "driver_lock": region.locks.record() if region and region.locks else None,
        }

    async def _establish_fitting(
        self,
        tenant: Tenant,
        request: RegionRequest,
        pid: int,
        tid: int,
        requested_at: float,
        marks: list[tuple[str, float]],
    ) -> Region:
        """Steps 2-5, the memory check overlapping the drain (``MemoryWait``).

        The check runs on the event loop while the drain waits in its thread,
        off the entry's critical path.  When the holder's expected memory does
        not fit beside its siblings', the entry is undone (thawed, reopened),
        waits with its siblings running for them to free memory, bounded, and
        runs again without the check, unless the holder gave up meanwhile
        (``KrexError(CANCELLED)``).  ``marks`` gets "memory" at the start of
        the attempt that is granted (the wait, when there was one).
        """
        marks.append(("memory", time.monotonic()))
        try:
            return await self._establish(tenant, pid, tid, requested_at, marks, check_memory=True)
        except _MemoryShort:
            del marks[1:]
        await self._wait_for_memory(tenant, request)
        if request.cancelled:  # given up during the undone attempt or the wait: not again
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        marks.append(("memory", time.monotonic()))
        return await self._establish(tenant, pid, tid, requested_at, marks, check_memory=False)

    async def _establish(
        self,
        tenant: Tenant,
        pid: int,
        tid: int,
        requested_at: float,
        marks: list[tuple[str, float]],
        check_memory: bool,
    ) -> Region:
        """Steps 2-5 for a tenant that owns the region lock; undone on failure.

        Each step pushes its compensator on the region's undo stack as it
        takes effect; a failure unwinds the stack (cores, thaw, unlock) and
        reopens the gate, the same undo the region's end runs (``_end``).
        Appends (step, monotonic s at its end) to ``marks``
        (``RegionStats.steps``).  With ``check_memory``, raises
        :class:`_MemoryShort` (after the undo) when the memory check run
        during the drain says the holder's need does not fit.
        """
        frozen: list[Tenant] = []
        region = Region(tenant, self._next_epoch(), pid, tid, requested_at, 0.0, frozen)
        locks = region.locks = DriverLocks()
        self._frozen, self._entering = frozen, tenant.id
        gate_closed = False
        try:
            # Step 2: close the gate for (holder, epoch).
            self._region_state(states.CLOSING)  # IDLE -> CLOSING
            self._gate.close(tenant.id, region.epoch)
            gate_closed = True
            if self._begin_pools_freeze():  # the pools' threads stop while the siblings drain
                region.pools_frozen = True
                region.undo.push("pools' freeze", lambda: self._thaw_pools(True))
            testhooks.pause("closed")
            marks.append(("close", time.monotonic()))
            await self._drain_and_freeze(region, locks, marks, check_memory)
            # Step 5: the holder's submitting thread gets the reserved cores.
            region.undo.push("cores", lambda: self._unpin_holder(tenant, tid))
            self._pin_holder(tenant, tid)
            marks.append(("pin", time.monotonic()))
        except BaseException:
            # Any failure: undo in exit order (cores, thaw, unlock, reopen) -> IDLE.
            self._region_state(states.RECOVERING)  # CLOSING/DRAINING/FREEZING -> RECOVERING
            self._frozen, self._entering = None, None  # no late arrival joins a failed entry
            await region.undo.unwind()
            if gate_closed:
                self._reopen_gate(tenant.id, region.epoch)
            self._region_state(states.IDLE)  # RECOVERING -> IDLE
            raise
        self._entering = None
        self._region_state(states.HELD)  # FREEZING -> HELD
        tenant_state(tenant, states.RUNNING, states.HOLDING)  # RUNNING -> HOLDING
        region.granted_at = time.monotonic()
        region.holder_pids = set(self._ctl.processes(tenant))
        self._region = region
        self._watch(region)
        return region

    async def _drain_and_freeze(
        self,
        region: Region,
        locks: DriverLocks,
        marks: list[tuple[str, float]],
        check_memory: bool,
    ) -> None:
        """Steps 3 and 4 of ``region``'s entry (the gate closed); their undo on its stack.

        ``locks``: the region's driver locks (``region.locks``), filled here.
        """
        # Undone last-first: the thaw before the unlock (the driver does not return
        # from an unlock of a frozen process).
        region.undo.push("driver locks", lambda: self._unlock_gpu(locks))
        region.undo.push("siblings' freeze", lambda: self._thaw(region.siblings))
        rest = await self._drain_step(region, locks, check_memory)
        marks.append(("drain", time.monotonic()))
        await self._freeze_step(region, locks, rest, marks)
        marks.append(("check", time.monotonic()))

    async def _drain_step(
        self, region: Region, locks: DriverLocks, check_memory: bool
    ) -> list[Tenant]:
        """Step 3: drain every sibling (counter zero, contexts synchronized, epoch acked),
        enforced by the driver's locks; returns the siblings not frozen during it.

        Step 4 begins during DRAINING: each sibling tenant is frozen as soon as all
        its registrations have drained, while the others still drain (DrainFreeze).
        """
        tenant, epoch = region.tenant, region.epoch
        self._region_state(states.DRAINING)  # CLOSING -> DRAINING
        early = DrainFreeze(
            self._ctl,
            self._siblings(tenant),
            region.siblings,
            asyncio.get_running_loop(),
            (lambda drained: self._lock_drained(drained, locks)) if self._proc_lock else None,
        )
        t = time.monotonic()
        drain = asyncio.ensure_future(self._drain(tenant, epoch, early.settled))
        try:
            short = check_memory and await self._memory_short(tenant)
            if short:
                early.stop()  # an entry to be undone freezes no more siblings
        finally:
            try:
                # Also after a failed check: no undo under a running drain.  A cancel
                # cancels the drain's task with this one (its thread runs on, as it
                # did before the check overlapped it); early.stop() then bars its
                # freezes, and the reopen makes it stale.
                await drain
            finally:
                rest = early.stop()  # no freeze from the drain's thread after this
        region.drain_ms = (time.monotonic() - t) * 1e3
        if short:
            raise _MemoryShort
        # The offenders pay: a sibling tenant that did not drain in time is ended
        # (exit 79), and the entry goes on once it has left the GPU.
        await self._end_overdue(drain.result(), epoch, locks)
        # Enforced by the driver: every other process on the GPU not locked yet (as
        # its tenant drained) is locked now, before its freeze; a process of a tenant
        # frozen during the drain is locked with that tenant thawed.
        await self._lock_gpu(tenant, locks, region.siblings)
        testhooks.pause("drained")
        return rest

    async def _freeze_step(
        self,
        region: Region,
        locks: DriverLocks,
        rest: list[Tenant],
        marks: list[tuple[str, float]],
    ) -> None:
        """Step 4: freeze the sibling process trees not frozen during the drain (``rest``),
        wait for them and for the warm pools (asked to freeze at step 2); then fail closed."""
        self._region_state(states.REGION_FREEZING)  # DRAINING -> FREEZING
        t = time.monotonic()
        pools, siblings = await asyncio.gather(
            self._wait_pools_frozen(region.pools_frozen),
            self._freeze_marked(rest, region.siblings, marks),
            return_exceptions=True,
        )
        for failed in (siblings, pools):
            if isinstance(failed, BaseException):
                raise failed
        t_check = time.monotonic()
        marks.append(("pools", t_check))
        await self._fail_closed(region.tenant, region.epoch)
        # Any process that reached the GPU since is locked too (its frozen tenant
        # thawed for the lock and frozen again).
        await self._lock_gpu(region.tenant, locks, region.siblings)
        region.check_ms = (time.monotonic() - t_check) * 1e3
        region.freeze_ms = (time.monotonic() - t) * 1e3
        testhooks.pause("frozen")

    async def _freeze_marked(
        self, siblings: list[Tenant], frozen: list[Tenant], marks: list[tuple[str, float]]
    ) -> None:
        """:meth:`_freeze`, then the "freeze" mark (the pools' may end later: "pools")."""
        await self._freeze(siblings, frozen)
        marks.append(("freeze", time.monotonic()))

    def _check_caller(self, tenant: Tenant, pid: int, tid: int) -> None:
        """A tenant acts only on itself: pid must be in its cgroup, tid a thread of pid."""
        if tenant.gpu != self.gpu:
            raise KrexError(Code.BAD_FIELD, f"tenant {tenant.id} is not on GPU {self.gpu}")
        if not self._ctl.owns_process(tenant, pid):
            raise KrexError(Code.BAD_FIELD, f"pid {pid} is not a process of tenant {tenant.id}")
        if not self._ctl.thread_exists(pid, tid):
            raise KrexError(Code.BAD_FIELD, f"tid {tid} is not a thread of pid {pid}")
