"""``GatedRegions``: one GPU's region protocol, steps 0-8 read top to bottom (paper §4.2).

Each step pushes its compensator on the region's undo stack as it acts;
:meth:`GatedRegions._teardown` unwinds it for a failed entry, an end and an
adopted region's end alike.  The steps' own state lives in their step
objects (``krexd.coordinator.steps``); docs/design/architecture.md "The
region protocol, step by step".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from krexd.coordinator.drain_freeze import MemoryShort, drain_freezing
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.once import EndedEpochs
from krexd.coordinator.port import exit_reply, grant_reply, refusal_code
from krexd.coordinator.records import HELD, QUEUED, Region, RegionRequest, tenant_state
from krexd.coordinator.recovery import RegionWatch, log_end, log_grant
from krexd.coordinator.request_queue import RequestQueue
from krexd.coordinator.scope import GpuScope, log
from krexd.coordinator.steps import Steps
from krexd.system import testhooks
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant


class GatedRegions:
    """One GPU's gated regions (a ``RegionPort``); ``Coordinator`` documents the calls.

    Args:
        scope: the GPU's read-only scope.
        steps: its step objects.
        ended: the epochs of regions ended by exit (shared with the
            coordinator, which saves them).
    """

    def __init__(self, scope: GpuScope, steps: Steps, ended: EndedEpochs) -> None:
        self._scope = scope
        self.steps = steps
        self._ended = ended
        self.requests = RequestQueue()  # steps 0-1: requests and the region lock
        self._end_lock = asyncio.Lock()  # serializes every end path
        self.epoch = 0  # the last epoch used (32-bit, never 0: krex_gate.h)
        self.region: Region | None = None  # granted, until its end completes
        self.entering: Region | None = None  # being established (steps 2-5)
        self.state: states.RegionState = states.IDLE  # states.REGION_EDGES
        self._watch = RegionWatch(scope, self._end)

    def __repr__(self) -> str:
        return f"Coordinator(gpu{self._scope.gpu}, {self.state})"

    def _region_state(self, new: states.RegionState) -> None:
        states.change_state(self, new)

    # ------------------------------------------------------------- entry (0-5)

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None
    ) -> dict[str, Any]:
        """Step 0: record the request, run steps 1-5, return the grant (``Coordinator.enter``)."""
        requested_at = time.monotonic()
        region = self.region
        if region is not None and region.tenant.id == tenant.id and not region.ended:
            if region.granted_again(request_id):
                return self._reply(region, 0.0, 0.0)
        request = self.requests.record(tenant)
        try:
            region, marks = await self._enter_locked(request, tenant, pid, tid, requested_at)
            region.request_id = request_id
            request.advance(HELD)
        finally:
            self.requests.drop(request)
        testhooks.pause("granted")
        if request.cancelled:
            await self._end(region, "cancelled by its holder")
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        self._scope.stats.grant(region.wait_ms, region.establish_ms)
        self._scope.stats.steps(marks)
        log_grant(self._scope, region)
        return self._reply(region, region.wait_ms, region.establish_ms)

    async def _enter_locked(
        self, request: RegionRequest, tenant: Tenant, pid: int, tid: int, requested_at: float
    ) -> tuple[Region, list[tuple[str, float]]]:
        """Step 1, the region lock (FIFO), then steps 2-5; a cancel at any step is honoured.

        Returns the region and its steps' marks (``RegionStats.steps``).  The
        lock is released when the entry fails, kept with the region granted.
        """
        locked_at = await self.requests.acquire(request)  # 1
        marks = [("locked", locked_at)]
        try:
            region = await self._establish_fitting(request, tenant, pid, tid, requested_at, marks)
        except BaseException as exc:
            self._scope.stats.refuse(refusal_code(exc))
            self.requests.release(tenant.id)
            raise
        return region, marks

    async def _establish_fitting(
        self,
        request: RegionRequest,
        tenant: Tenant,
        pid: int,
        tid: int,
        requested_at: float,
        marks: list[tuple[str, float]],
    ) -> Region:
        """Steps 2-5, the memory check overlapping the drain (``MemoryWait``).

        When the holder's expected memory does not fit beside its siblings',
        the attempt is undone (thawed, reopened), waits with its siblings
        running for them to free memory, bounded, and runs again without
        the check, unless the holder gave up meanwhile (CANCELLED).
        ``marks`` gets "memory" at the start of the attempt that is granted.
        """
        locked_at = marks[0][1]
        marks.append(("memory", time.monotonic()))
        try:
            return await self._establish(tenant, pid, tid, requested_at, locked_at, marks, True)
        except MemoryShort:
            del marks[1:]
        await self.steps.memory.wait(tenant, request)
        if request.cancelled:  # given up during the undone attempt or the wait: not again
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        marks.append(("memory", time.monotonic()))
        return await self._establish(tenant, pid, tid, requested_at, locked_at, marks, False)

    async def _establish(
        self,
        tenant: Tenant,
        pid: int,
        tid: int,
        requested_at: float,
        locked_at: float,
        marks: list[tuple[str, float]],
        check_memory: bool,
    ) -> Region:
        """Steps 2-5 for a tenant that owns the region lock; undone on failure.

        Appends (step, monotonic s at its end) to ``marks``
        (``RegionStats.steps``).  With ``check_memory``, raises
        :class:`MemoryShort` (after the undo) when the memory check run
        during the drain says the holder's need does not fit.
        """
        epoch = self.epoch = self.epoch % 0xFFFF_FFFF + 1
        region = Region(tenant, epoch, pid, tid, requested_at, 0.0, locked_at=locked_at)
        locks = region.locks = DriverLocks()
        self.entering = region  # a tenant admitted now is frozen into region.siblings
        try:
            self._region_state(states.CLOSING)  # IDLE -> CLOSING
            self._close_gate(region)  # 2
            self._hold_pools(region)  # 2: the pools' threads stop while the siblings drain
            testhooks.pause("closed")
            marks.append(("close", time.monotonic()))
            self._hold_siblings(region)
            rest = await self._drain_step(region, locks, check_memory)  # 3 (and 4 as drained)
            marks.append(("drain", time.monotonic()))
            await self._freeze_step(region, locks, rest, marks)  # 4, fail closed
            marks.append(("check", time.monotonic()))
            self._pin_holder(region)  # 5
            marks.append(("pin", time.monotonic()))
        except BaseException:
            self.entering = None  # no late arrival joins a failed entry
            await self._teardown(region, states.RECOVERING)  # CLOSING..FREEZING -> RECOVERING
            raise
        self.entering = None
        self._region_state(states.HELD)  # FREEZING -> HELD
        tenant_state(tenant, states.RUNNING, states.HOLDING)  # RUNNING -> HOLDING
        region.granted_at = time.monotonic()
        region.holder_pids = set(self._scope.control.processes(tenant))
        self.region = region
        self._watch.watch(region)
        return region

    async def _drain_step(
        self, region: Region, locks: DriverLocks, check_memory: bool
    ) -> list[Tenant]:
        """Step 3: drain every sibling (counter zero, contexts synchronized, epoch acked),
        enforced by the driver's locks; returns the siblings not frozen during it.

        Step 4 begins during DRAINING: each sibling tenant is frozen as soon as all
        its registrations have drained, while the others still drain
        (``drain_freezing``, with the memory check beside it).
        """
        steps = self.steps
        self._region_state(states.DRAINING)  # CLOSING -> DRAINING
        rest, overdue = await drain_freezing(self._scope, steps, region, locks, check_memory)
        # The offenders pay: a sibling tenant that did not drain in time is ended
        # (exit 79), and the entry goes on once it has left the GPU.
        await steps.locks.end_overdue(overdue, region.epoch, locks)
        # Enforced by the driver: every other process on the GPU not locked yet is
        # locked now, before its freeze (a frozen tenant's is locked with it thawed).
        await steps.locks.lock_gpu(region.tenant, locks, region.siblings)
        testhooks.pause("drained")
        return rest

    async def _freeze_step(
        self, region: Region, locks: DriverLocks, rest: list[Tenant], marks: list[tuple[str, float]]
    ) -> None:
        """Step 4: freeze the siblings not frozen during the drain (``rest``), wait for
        them and for the warm pools (asked to freeze at step 2); then fail closed."""
        steps = self.steps
        self._region_state(states.REGION_FREEZING)  # DRAINING -> FREEZING
        t = time.monotonic()

        async def siblings() -> None:
            await steps.freezer.freeze(rest, region.siblings)
            marks.append(("freeze", time.monotonic()))  # the pools' may end later: "pools"

        results = await asyncio.gather(
            steps.freezer.wait_pools(region.pools_frozen), siblings(), return_exceptions=True
        )
        for failed in reversed(results):  # the siblings' error first
            if isinstance(failed, BaseException):
                raise failed
        t_check = time.monotonic()
        marks.append(("pools", t_check))
        await steps.fail_closed.check(region.tenant, region.epoch)
        # Any process that reached the GPU since is locked too.
        await steps.locks.lock_gpu(region.tenant, locks, region.siblings)
        region.check_ms = (time.monotonic() - t_check) * 1e3
        region.freeze_ms = (time.monotonic() - t) * 1e3
        testhooks.pause("frozen")

    # -------------------------------------- each step's compensator, pushed as it acts

    def _close_gate(self, region: Region, closed: bool = False) -> None:
        """Step 2: close the gate (``closed``: it is already, an adopted region); its
        reopen (step 8) is the first compensator pushed, so the stack's last undone."""
        if not closed:
            self.steps.gate.close(region.tenant.id, region.epoch)
        region.undo.push("gate", lambda: self._reopen(region))

    def _hold_pools(self, region: Region) -> None:
        """Step 2, gate closed: the warm pools begin to freeze (their hold released at 7)."""
        freezer = self.steps.freezer
        if freezer.begin_pools():
            region.pools_frozen = True
            region.undo.push("pools' freeze", freezer.thaw_pools)

    def _hold_siblings(self, region: Region) -> None:
        """Steps 3-4's undo, pushed before they act: the siblings thawed before they are
        unlocked (the driver does not return from an unlock of a frozen process)."""
        steps = self.steps
        region.undo.push("driver locks", lambda: steps.locks.unlock(region.locks))
        region.undo.push("siblings' freeze", lambda: steps.freezer.thaw(region.siblings))

    def _pin_holder(self, region: Region, pinned: bool = False) -> None:
        """Step 5: the holder's cores (``pinned``: they are already, an adopted region)."""
        cores = self.steps.cores
        region.undo.push("cores", lambda: cores.unpin(region.tenant, region.tid))
        if not pinned:
            cores.pin(region.tenant, region.tid)

    def _reopen(self, region: Region) -> None:
        """Step 8, the last compensator of every region: only after the thaw, reopen
        the gate (bound to its holder and epoch)."""
        region.thawed_at = time.monotonic()
        if self.state == states.REGION_THAWING:
            self._region_state(states.REOPENING)  # THAWING -> REOPENING
        if region.granted_at:
            testhooks.pause("thawed")
        self.steps.gate.reopen(region.tenant.id, region.epoch)

    async def _teardown(self, region: Region, first: states.RegionState) -> float:
        """Unwind ``region``'s undo stack (cores, siblings thawed, unlocked, pools thawed,
        gate reopened), moving the region state to ``first`` and then IDLE; the ms
        until the reopen (``thaw_ms``).

        The one undo of a failed entry, an end and an adopted region's end.  A
        cancel during it does not stop it half-way: every compensator runs, the
        state reaches IDLE, then the cancel is raised.
        """
        self._region_state(first)  # -> RECOVERING, or HELD -> THAWING (exit)
        t = time.monotonic()
        try:
            await region.undo.unwind()
        finally:
            self._region_state(states.IDLE)  # REOPENING/RECOVERING -> IDLE
        return ((region.thawed_at or time.monotonic()) - t) * 1e3

    # -------------------------------------------------------------- exit (7-8)

    async def exit(
        self, tenant: Tenant, epoch: int, sync_ms: float, launches: int
    ) -> dict[str, Any]:
        """Steps 7-8 for the holder's ``epoch``, then the witness (``Coordinator.exit``)."""
        region = self.region
        holds = region is not None and region.tenant.id == tenant.id
        if not (holds and region is not None and region.epoch == epoch) and self._ended.answered(
            tenant.id, epoch
        ):
            return exit_reply(sync_ms, launches)  # re-sent after a restart: answered again
        if region is None or not holds:
            raise KrexError(
                Code.NOT_HOLDER, f"tenant {tenant.id} holds no region on GPU {self._scope.gpu}"
            )
        if region.epoch != epoch:
            raise KrexError(
                Code.NOT_HOLDER, f"epoch {epoch} is not the current region's ({region.epoch})"
            )
        thaw_ms = await self._end(region, "exit")  # counted completed there (log_end)
        if thaw_ms is None:  # recovery ended it first
            raise KrexError(Code.REGION_ABORTED, f"region ended: {region.end_reason}")
        region_ms = (time.monotonic() - region.granted_at) * 1e3
        reply = exit_reply(sync_ms, launches, region_ms, thaw_ms)
        return {**reply, "witness": await self.steps.witness.see(region)}

    async def _end(self, region: Region, reason: str) -> float | None:
        """Steps 7-8 for ``region``, once; its ``thaw_ms``, None when it had ended already.

        Serialized with every other end path (paper §4.2: "serializes the two
        paths ... so they cannot modify the gate and freeze state
        concurrently"), and bound to ``region``: ending a region that is no
        longer current does nothing.  The lock is released last.
        """
        async with self._end_lock:
            if region.ended or self.region is not region:
                return None
            region.ended, region.end_reason = True, reason
            region.ended_at = time.monotonic()
            self._scope.stats.held(region.ended_at - region.granted_at)
            self._watch.unwatch(region)
            exiting = reason == "exit"  # else: holder died, timed out, cancelled, ...
            try:
                thaw_ms = await self._teardown(
                    region, states.REGION_THAWING if exiting else states.RECOVERING
                )
            finally:
                tenant_state(region.tenant, states.HOLDING, states.RUNNING)  # HOLDING -> RUNNING
                self.region = None
                if exiting:
                    self._ended.exited(region.tenant.id, region.epoch)
                self.requests.ended(region.tenant.id)  # the lock released last
                log_end(self._scope, region, reason)  # counted also when a cancel goes up
            return thaw_ms

    # ------------------------------------------------- what else acts on a region

    async def tenant_added(self, tenant: Tenant) -> None:
        """A tenant was admitted to this GPU: frozen at once if a region is being
        established or held (``Coordinator.tenant_added``); thawed with the others."""
        region = self.entering or self.region
        if region is None or region.ended or tenant.exclusive or tenant.id == region.tenant.id:
            return
        self._scope.control.freeze(tenant)
        tenant_state(tenant, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
        region.siblings.append(tenant)  # thawed with the others at its end (or undo)

    async def cancel(self, tenant: Tenant) -> str:
        """``tenant`` gave up its region: the stage its request was at, or "none"
        (``Coordinator.cancel``)."""
        stage = self.requests.cancel(tenant)
        if stage is None or stage == QUEUED:
            return stage.value if stage else "none"
        region = self.region
        if stage == HELD and region is not None and region.tenant.id == tenant.id:
            await self._end(region, "cancelled by its holder")
        return stage.value

    async def gone(self, tenant: Tenant) -> None:
        """Recovery when ``tenant`` ends: end its region, or drop its request."""
        self.requests.gone(tenant)
        region = self.region
        if region is not None and region.tenant.id == tenant.id:
            await self._end(region, "holder's command ended")

    async def shutdown(self) -> None:
        """End any region (thaw, reopen) and cancel every waiter."""
        self.requests.cancel_all(self.steps.memory.waiting)
        region = self.region
        if region is not None:
            await self._end(region, "krexd is shutting down")

    def idle(self) -> bool:
        """True when no region is held or being established (the gate should be open)."""
        return self.state == states.IDLE and self.region is None and self.entering is None

    def adopt(
        self,
        holder: Tenant,
        epoch: int,
        pid: int,
        tid: int,
        siblings: list[Tenant],
        thread_cpus: tuple[int, ...] | None,
        request_id: str | None,
    ) -> None:
        """Hold the region a krexd before a restart granted (``Coordinator.adopt_region``).

        Its request and region states replay their edges (through their
        guards), and its undo stack is the one an entry pushes, so its end
        is any region's end.
        """
        self.requests.adopt(holder.id)
        now = time.monotonic()
        region = Region(holder, epoch, pid, tid, now, now, list(siblings), adopted=True)
        region.locked_at, region.request_id = now, request_id
        self.epoch = max(self.epoch, epoch)
        self.steps.cores.adopt(thread_cpus)
        # Steps 2-5 ran in the krexd before: replay the edges, push the same undo.
        self._region_state(states.CLOSING)  # IDLE -> CLOSING
        self._close_gate(region, closed=True)
        self._hold_pools(region)
        self._region_state(states.DRAINING)  # CLOSING -> DRAINING
        self._region_state(states.REGION_FREEZING)  # DRAINING -> FREEZING
        self._hold_siblings(region)
        self._pin_holder(region, pinned=True)
        self._region_state(states.HELD)  # FREEZING -> HELD
        self._scope.stats.adopted += 1
        self.region = region
        self._watch.watch(region)
        log.warning(
            "GPU %d: adopted the region of tenant %d (epoch %d), %d sibling(s) frozen",
            self._scope.gpu,
            holder.id,
            epoch,
            len(siblings),
        )

    def _reply(self, region: Region, wait_ms: float, establish_ms: float) -> dict[str, Any]:
        """The region_enter reply for ``region`` (ms)."""
        s = self._scope
        return grant_reply(
            s.gpu, s.cfg.l2_flush, self.steps.cores.reserved, region, wait_ms, establish_ms
        )
