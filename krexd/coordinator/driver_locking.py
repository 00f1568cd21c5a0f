"""Step 3 made unforgeable: the driver locks every other process on the GPU.

Drained siblings are locked before their freeze, then every other process
on the GPU but the holder's; a tenant whose work does not complete in time
ends (exit 79), a process outside krex that cannot be locked fails the
entry, and every end unlocks.  docs/design/driver-lock.md.
"""

from __future__ import annotations

import asyncio
import os
import time

from krexd.coordinator.isolation import (
    GpuUseCheck,
    LockRecord,
    ProcessLock,
    freeze_unless_gone,
    thaw_unless_gone,
)
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.records import Region
from krexd.coordinator.scope import GpuScope, log
from krexd.hardware.driverlock import DriverLock, DriverLockUnavailable, Outcome, Result
from krexd.system.errors import Code, KrexError
from krexd.system.procfs import cmdline, pid_alive
from krexd.tenancy.tenants import Tenant


class DriverLocking:
    """One GPU's driver lock of region entry and its release.

    Args:
        scope: the GPU's scope.
        proc_lock: the driver's lock of other processes
            (``krexd.hardware.driverlock.DriverLock``; None: the shim's
            acknowledgements alone, ``[region] driver_lock = "off"``).
        ledger: where the locked processes are recorded before they are
            locked (``krexd.hardware.lock_ledger.LockLedger``; None: nowhere).
        guard: who has the GPU open (None: no source; the siblings'
            processes are taken for the GPU's users).
    """

    def __init__(
        self,
        scope: GpuScope,
        proc_lock: ProcessLock | None,
        ledger: LockRecord | None,
        guard: GpuUseCheck | None,
    ) -> None:
        self._scope = scope
        self._proc_lock = proc_lock
        self._ledger = ledger
        self._guard = guard

    @property
    def enabled(self) -> bool:
        """Does this GPU's entry lock processes through the driver?"""
        return self._proc_lock is not None

    def lock_drained(self, tenants: list[Tenant], locks: DriverLocks) -> None:
        """In the drain's thread: lock drained siblings' GPU processes before their freeze.

        ``tenants``: the siblings that drained since the last call; their
        processes are locked in parallel (one ``lock_all``).  A process is
        locked while it runs, never while frozen inside a driver call (a
        lock waits for calls in progress).  Failures are kept in
        ``locks.failed`` and judged after the drain (``lock_gpu``).
        """
        if self._proc_lock is None:
            return
        if locks.users is None:
            locks.users = self._guard.users() if self._guard is not None else None
        users = locks.users
        pids = {
            p
            for t in tenants
            for p in self._scope.control.processes(t)
            if users is None or p in users
        }
        self.lock_pids(pids - set(locks.pids), locks)

    def lock_pids(self, pids: set[int], locks: DriverLocks) -> list[Result]:
        """Record, then lock ``pids`` in parallel (bounded); the results that did not settle."""
        if not pids or self._proc_lock is None:
            return []
        if self._ledger is not None:
            self._ledger.record(set(locks.pids) | pids)
        timeout_ms = int(self._scope.cfg.drain_timeout_s * 1e3)
        results = self._proc_lock.lock_all(pids, timeout_ms)
        late = locks.add_locked([p for p, r in results.items() if r.outcome is Outcome.LOCKED])
        if late:  # the region ended (its entry undone, say by a cancel) during the calls
            log.warning(
                "GPU %d: unlocking %s, locked after the region ended", self._scope.gpu, late
            )
            self._proc_lock.unlock_all(late)
        locks.unsupported.extend(p for p, r in results.items() if r.outcome is Outcome.UNSUPPORTED)
        failed = [r for r in results.values() if r.outcome not in _SETTLED]
        locks.failed.extend(failed)
        return failed

    async def lock_gpu(
        self, holder: Tenant, locks: DriverLocks, frozen: list[Tenant] | None = None
    ) -> None:
        """Lock every process on this GPU but the holder's not locked yet; the offenders pay.

        Runs after the drain (the siblings that drained are locked already,
        ``lock_drained``), before the freeze of the rest, and once more
        after the freeze, for any process that reached the GPU meanwhile.
        ``frozen``: the tenants this entry has frozen so far (the region's
        siblings list: those frozen as they drained, and any admitted during
        the entry).  The driver cannot lock a frozen process (the call does
        not return while it is frozen), so a frozen tenant with such a
        process is thawed, the process locked, and the tenant frozen again;
        since a thawed tenant may start another process meanwhile, the list
        is read again after each such pass (at most :data:`THAW_PASSES`).

        Raises:
            KrexError: FOREIGN_GPU_USER (a process outside krex, with
                ``[region] foreign = "refuse"``), DRAIN_TIMEOUT (a process
                outside krex, or an ended offender, still busy on the GPU
                after ``drain_timeout_s``).  What was locked is in
                ``locks.pids`` either way: the caller's undo unlocks it.
        """
        if self._proc_lock is None:
            return
        t0 = time.monotonic()
        owner: dict[int, Tenant] = {}
        for _ in range(THAW_PASSES):
            users = await asyncio.to_thread(self._gpu_users, holder)
            # Settled already this entry: locked, unlockable MPS clients, foreign
            # ones allowed, and those whose lock failed (judged below, never locked
            # again: the drain freezes a sibling right after its lock whatever came
            # of it, and the driver does not return from the lock of a frozen one).
            settled = {os.getpid(), *locks.pids, *locks.unsupported}
            settled |= {r.pid for r in locks.failed}
            if self._scope.cfg.foreign == "allow":
                settled |= set(locks.foreign)
            targets = users - settled
            if targets:
                targets -= set(self._scope.control.processes(holder))
            if targets or locks.failed:  # the usual entry has neither: no cgroup reads
                others = (t for t in self._scope.tenants if t.id != holder.id)
                owner = {p: t for t in others for p in self._scope.control.processes(t)}
            if not targets or not await self._lock_targets(targets, owner, locks, frozen or []):
                break  # nothing thawed: nothing can have started since the read
        failed, locks.failed = locks.failed, []
        if failed:
            await self._make_offenders_pay(failed, owner, locks)
        locks.lock_ms += (time.monotonic() - t0) * 1e3

    async def _lock_targets(
        self, targets: set[int], owner: dict[int, Tenant], locks: DriverLocks, frozen: list[Tenant]
    ) -> bool:
        """Lock ``targets`` (pids on the GPU not settled yet) after the foreign policy;
        a frozen tenant among their owners is thawed for its lock and frozen again.
        True when a tenant was thawed for it."""
        foreign = sorted(p for p in targets if p not in owner and p not in locks.foreign)
        if foreign:
            self._foreign_policy(foreign)
            locks.foreign.extend(foreign)
        if self._scope.cfg.foreign == "allow":
            targets = targets - set(locks.foreign)
        thawed = [t for t in frozen if targets & set(self._scope.control.processes(t))]
        try:
            for t in thawed:
                thaw_unless_gone(self._scope.control, t)
            await asyncio.to_thread(self.lock_pids, targets, locks)
        finally:
            # Every one is frozen again before any error goes up (an ended one is gone).
            refrozen = [t for t in thawed if freeze_unless_gone(self._scope.control, t)]
            for t in refrozen:
                if not await self._scope.control.wait_frozen(t, self._scope.cfg.freeze_timeout_s):
                    raise KrexError(
                        Code.FREEZE_TIMEOUT, f"tenant {t.id} did not freeze again after its lock"
                    )
        return bool(thawed)

    def _gpu_users(self, holder: Tenant) -> set[int]:
        """Pids with a context on this GPU; without a source, the siblings' processes."""
        users = self._guard.users() if self._guard is not None else None
        if users is None:
            users = {
                p for t in self._scope.siblings(holder) for p in self._scope.control.processes(t)
            }
        return users

    def _foreign_policy(self, foreign: list[int]) -> None:
        """``[region] foreign``: "refuse" fails the entry; "lock" and "allow" log it."""
        names = ", ".join(f"pid {p} ({cmdline(p)})" for p in foreign)
        if self._scope.cfg.foreign == "refuse":
            raise KrexError(
                Code.FOREIGN_GPU_USER,
                f"GPU {self._scope.gpu}: processes outside krex use the GPU: {names} "
                '([region] foreign = "refuse")',
            )
        log.warning("GPU %d: processes outside krex on the GPU (%s): %s",
                    self._scope.gpu, self._scope.cfg.foreign, names)  # fmt: skip

    async def _make_offenders_pay(
        self, failed: list[Result], owner: dict[int, Tenant], locks: DriverLocks
    ) -> None:
        """End the tenants whose processes could not be locked; wait until they left.

        A process outside krex that could not be locked fails the entry.
        """
        outside = [r for r in failed if r.pid not in owner]
        if outside:
            raise KrexError(
                Code.DRAIN_TIMEOUT,
                f"GPU {self._scope.gpu}: processes outside krex could not be locked: "
                + "; ".join(r.describe() for r in outside),
            )
        by_tenant: dict[int, list[Result]] = {}
        for r in failed:
            by_tenant.setdefault(owner[r.pid].id, []).append(r)
        for tid, results in by_tenant.items():
            tenant = next(owner[r.pid] for r in results)
            reason = (
                f"its GPU work did not complete within drain_timeout_s = "
                f"{self._scope.cfg.drain_timeout_s:g} s of region entry on GPU {self._scope.gpu} "
                f"(driver lock: {'; '.join(r.describe() for r in results)})"
            )
            log.error("GPU %d: tenant %d: %s; ending its command", self._scope.gpu, tid, reason)
            self._scope.end_tenant(tenant, reason, "lock_failed")
            locks.ended.append(tid)
        await self._wait_left_gpu({r.pid for r in failed})

    async def end_overdue(self, overdue: set[int], epoch: int, locks: DriverLocks) -> None:
        """End the sibling tenants that did not drain in time; wait until they left the GPU.

        ``overdue``: tenant ids (``GateSteps.drain``'s result).  Each command is ended
        with exit 79 and the reason; the entry goes on once none of their
        processes has a context on this GPU (bounded by drain_timeout_s).
        """
        if not overdue:
            return
        pids: set[int] = set()
        for tid in sorted(overdue):
            tenant = self._scope.tenants.get(tid)
            if tenant is None:
                continue
            pids.update(self._scope.control.processes(tenant))
            reason = (
                f"it did not drain its GPU work within drain_timeout_s = "
                f"{self._scope.cfg.drain_timeout_s:g} s of region entry on GPU "
                f"{self._scope.gpu} (epoch {epoch})"
            )
            log.error("GPU %d: tenant %d: %s; ending its command", self._scope.gpu, tid, reason)
            self._scope.end_tenant(tenant, reason, "drain_timeout")
            locks.ended.append(tid)
        self._scope.stats.drain_timeouts += 1
        await self._wait_left_gpu(pids)

    async def _wait_left_gpu(self, pids: set[int]) -> None:
        """Until none of ``pids`` has a context on this GPU (bounded by drain_timeout_s)."""
        deadline = time.monotonic() + self._scope.cfg.drain_timeout_s
        while True:
            users = await asyncio.to_thread(self._guard.users) if self._guard else None
            alive = {p for p in pids if pid_alive(p)}
            left = (users & pids) if users is not None else alive
            if not left:
                return
            if time.monotonic() >= deadline:
                raise KrexError(
                    Code.DRAIN_TIMEOUT,
                    f"GPU {self._scope.gpu}: processes {sorted(left)} still on the GPU "
                    f"{self._scope.cfg.drain_timeout_s:g} s after their commands were ended",
                )
            await asyncio.sleep(0.005)

    async def unlock(self, locks: DriverLocks | None) -> None:
        """Unlock what a region locked (every end path and every undo); then clear the ledger.

        Called after the thaw: the driver does not return from an unlock of a
        frozen process.  Bounded by ``freeze_timeout_s``: an unlock that does
        not return is logged, and the ledger kept for the watchdog and a
        successor.  Neither that bound nor a cancel (a stop cancels the
        requests in flight) cuts the unlock short: its job, once handed to a
        worker thread, runs (a job dropped unrun would leave the processes
        locked after the region); a cancel is raised once it has returned.
        """
        if self._proc_lock is None or locks is None:
            return
        pids = locks.close()
        if not pids:
            return
        job = asyncio.ensure_future(asyncio.to_thread(self._proc_lock.unlock_all, pids))
        deadline = time.monotonic() + self._scope.cfg.freeze_timeout_s
        cancelled: asyncio.CancelledError | None = None
        while not job.done() and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait((job,), timeout=left)
            except asyncio.CancelledError as exc:
                cancelled = exc
        failed = job.done() and (job.cancelled() or job.exception() is not None)
        if not job.done():
            log.error("GPU %d: unlock of %s did not return", self._scope.gpu, sorted(pids))
            job.add_done_callback(_late_unlock)
        elif not failed and self._ledger is not None:
            self._ledger.clear()
        if cancelled is not None:
            raise cancelled
        if failed:
            job.result()

    def settle(self, adopted: Region | None) -> None:
        """At start: the processes a krexd before left locked through the driver.

        They belong to ``adopted`` (the region adopted from it, if any:
        unlocked at its end), or are unlocked now; the record names each by
        pid and start time, so a reused pid is never touched
        (``krexd.hardware.lock_ledger``).  Never raises (an unlock the driver cannot
        do is logged).
        """
        if self._ledger is None:
            return
        gpu, pids = self._scope.gpu, self._ledger.live()
        if pids and adopted is not None and adopted.adopted and not adopted.ended:
            adopted.locks = DriverLocks(pids=pids)
            log.warning("GPU %d: adopted region keeps %d processes locked", gpu, len(pids))
            return
        if pids:
            unlocker = self._proc_lock or DriverLock()
            try:
                unlocker.unlock_all(pids)
                log.warning("GPU %d: unlocked %d processes left locked", gpu, len(pids))
            except DriverLockUnavailable as exc:
                log.error("GPU %d: cannot unlock processes %s: %s", gpu, pids, exc)
        self._ledger.clear()


def _late_unlock(job: asyncio.Future[dict[int, Result]]) -> None:
    """An unlock that returned after its bound: its error logged (the ledger is kept)."""
    if not job.cancelled() and job.exception() is not None:
        log.error("late unlock failed: %s", job.exception())


#: Reads of the GPU's users in one lock step when each finds a process of a frozen
#: tenant (thawed for its lock, during which it could start another one).
THAW_PASSES = 3

#: Lock outcomes that leave nothing to wait for: locked, or no CUDA state at all.
#: UNSUPPORTED (an MPS client) is not locked: its drain rests on its shim (recorded).
_SETTLED = (Outcome.LOCKED, Outcome.NOT_CUDA, Outcome.UNSUPPORTED)
