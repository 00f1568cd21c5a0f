"""Per-GPU region coordinator: the region lock, region entry and exit, recovery.

One ``Coordinator`` per GPU implements krexd's half of region-granular
exclusivity (paper §4.2; DESIGN.md "Region entry and exit";
docs/design/architecture.md maps every step to its file).  Steps carry the
paper's numbers (its circled 1-8); the methods below read in that order:

    enter()     0  the request is recorded (RegionRequest) from its arrival to
                   its region's end: a second one is NESTED_REGION, a cancel
                   acts on it at any stage
                1  region lock, FIFO (no starvation: the paper has no fairness);
                   then, lock held, the holder's expected memory must fit in
                   what its siblings leave free (they keep their memory while
                   frozen): wait, bounded, for them to free some, or fail at
                   once when it can never fit (RegionMemory; docs/design/memory.md)
                2  close the gate: holder id + new epoch, one atomic word
                3  drain: every sibling's drainer acknowledges the epoch with
                   a zero in-flight counter (libkrex_shim does the work)
                4  freeze every sibling tenant's cgroup, wait until the kernel
                   reports it frozen (bounded by freeze_timeout_ms); then fail
                   closed: a sibling process with the GPU open and no drained
                   registration ends its command (exit 79) and the grant
                   waits until it has left the GPU
                5  give the holder (and its submitting thread) the reserved
                   cores, added to its own ([region] holder_cpus); grant.
                   The holder flushes L2 itself, through the shim.
    (client)    6  the holder runs its timed code
    exit()      7  the holder's own GPU work is done (its shim synchronized
                   before region_exit); its cores go back to the off-region
                   share and the siblings are thawed, *then*
                8  the gate is reopened, *then* the lock released
    recovery    the same end path, bound to the Region object (holder and
                epoch), when the holder's process dies, its tenant ends, or
                the region outlives max_region_s

Why exit thaws before it reopens and releases (paper §4.2): if the lock were
released first, the next holder could freeze the same siblings and the
previous holder's late thaw would undo that freeze in the middle of the next
measurement.  Normal exit and recovery are serialized by one asyncio lock and
bound to the Region they end, so a late recovery is a no-op for a newer
region, and the gate's reopen is itself bound to (holder, epoch).

Every failed entry undoes what it did (cores, thaw, gate) before it reports
the error: no tenant is ever left frozen.

The coordinator acts only through injected interfaces (``krexd.isolation``):
``TenantControl`` (freeze, thaw, wait frozen, kill, watch the holder),
``Pinner`` (cpuset and thread affinity), ``RegionGate`` (the gate, absent
when ``libkrex_gate.so`` is not built), ``RegionMemory`` (the memory
check before step 2, absent: no check) and ``GpuUseCheck`` (who has the GPU
open; absent where no source can tell), and ends a tenant's command through
the ``end_command`` callback it is given (the daemon's lifecycle).  The daemon injects the cgroup
implementations; any other implementation of these interfaces (in-memory
fakes, say) drives the same protocol without root.

The module is longer than most on purpose: entry, exit and recovery share
their undo steps and must be read together, in the paper's order.  Counters
and latency percentiles live in ``krexd.region_stats``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from krex_client.errors import ExitCode
from krexd import states, testhooks
from krexd.config import RegionConfig
from krexd.errors import Code, KrexError
from krexd.fifo import FifoLock
from krexd.gate import GateError, GateTimeout
from krexd.isolation import (
    GpuUseCheck,
    Pinner,
    RegionGate,
    RegionMemory,
    TenantControl,
    Watch,
    gone,
)
from krexd.region_stats import RegionStats
from krexd.slices import CpuSlice
from krexd.tenants import Tenant, TenantRegistry

log = logging.getLogger("krexd.coordinator")


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Sorted core ids in ``a`` or ``b``."""
    return tuple(sorted(set(a) | set(b)))


@dataclass(eq=False)
class Region:
    """One granted critical region (identity matters: recovery is bound to it)."""

    tenant: Tenant
    epoch: int
    pid: int
    tid: int
    requested_at: float  # monotonic s, when region_enter arrived
    granted_at: float  # monotonic s
    siblings: list[Tenant] = field(default_factory=list)  # frozen by this region
    ended: bool = False
    end_reason: str = ""
    holder_watch: Watch | None = None  # fires when the holder's process exits
    timer: asyncio.TimerHandle | None = None
    adopted: bool = False  # from a crashed krexd's state, its grant maybe never delivered


# Stages of a region request (``RegionRequest.stage``).
QUEUED = "queued"  # waiting for the region lock, or handed it and not yet resumed
ENTERING = "entering"  # steps 2-5 in progress
HELD = "held"  # granted: a Region exists


@dataclass(eq=False)
class RegionRequest:
    """One tenant's region request, recorded from its arrival until its region ends.

    ``region_cancel`` and recovery act on this record, so a request is never
    found nowhere (the window between the lock's hand-over and the waiter's
    resumption) nor twice (a second ``region_enter`` is refused while one is
    recorded).
    """

    tenant: int
    stage: str = QUEUED
    cancelled: bool = False


class Coordinator:
    """Region lock and region protocol for one GPU (paper §4.2).

    Args:
        gpu: GPU index on the host.
        gate: the GPU's gate (``krexd.gate.Gate``), or None without
            ``libkrex_gate.so``: submissions are then not gated and step 3
            is skipped; freezing and pinning still apply.
        cpu_slice: the GPU's CPU slice: ``cores`` (all), ``reserved`` (for the
            holder's submitting thread during a region) and ``tenant_cores``
            (cores minus reserved, for everyone off-region).
        tenants: the daemon's tenant registry; siblings are this GPU's
            other tenants.
        region: the ``[region]`` config table (timeouts, enforce, l2_flush).
        control: freezes, thaws and watches tenants (steps 4 and 7, recovery).
        pinner: moves the holder to the reserved cores and back (steps 5, 7).
        memory: the memory check before step 2 (None: none).
        guard: the fail-closed check after step 4 (None: skipped).
        end_command: ``end_command(tenant, reason, exit_code)`` ends a
            tenant's command for unprotectable GPU use (None: the tree is
            killed through ``control`` with the reason recorded).
    """

    def __init__(
        self,
        gpu: int,
        gate: RegionGate | None,
        cpu_slice: CpuSlice,
        tenants: TenantRegistry,
        region: RegionConfig,
        control: TenantControl,
        pinner: Pinner,
        memory: RegionMemory | None = None,
        guard: GpuUseCheck | None = None,
        end_command: Callable[[Tenant, str, int], None] | None = None,
    ) -> None:
        self.gpu = gpu
        self._memory = memory
        self._mem_waiting: int | None = None  # tenant whose entry waits for memory
        self.memory_waits = 0  # entries that waited for siblings' memory
        self._guard = guard
        self._end_command = end_command
        self._gate = gate
        self._ctl = control
        self._pinner = pinner
        self._slice = cpu_slice
        self._tenants = tenants
        self._cfg = region
        self._lock: FifoLock[int] = FifoLock()
        self._end_lock = asyncio.Lock()
        self._region: Region | None = None
        self._ungated: set[int] = set()  # tenants inside a region when enforce = false
        self._epoch = 0
        self._last_drain_ms = 0.0
        self._last_freeze_ms = 0.0
        self._thread_cpus: tuple[int, ...] | None = None  # holder thread's own cores ("add")
        self.state = states.IDLE  # region state of this GPU (states.REGION_EDGES)
        self.stats = RegionStats()
        # Tenants frozen by the region being established or held (None: no region),
        # and the tenant establishing one: late arrivals are frozen into this list.
        self._frozen: list[Tenant] | None = None
        self._entering: int | None = None
        self._requests: dict[int, RegionRequest] = {}  # by tenant id, arrival to region end
        self._tasks: set[asyncio.Task[Any]] = set()  # recovery tasks in flight
        # Epoch of each tenant's last region ended by exit (saved: a region_exit
        # re-sent after a restart is answered again), and regions a restart ended.
        self._exited: dict[int, int] = {}
        self._resumed: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"Coordinator(gpu{self.gpu}, {self.state})"

    # ------------------------------------------------------------------ entry

    async def enter(self, tenant: Tenant, pid: int, tid: int) -> dict[str, Any]:
        """Run region entry for ``tenant`` and return the grant (region_enter reply body).

        Args:
            tenant: the authenticated requesting tenant (must be on this GPU).
            pid: the requesting process; must be in the tenant's cgroup.
            tid: the submitting thread (Linux thread id) to pin to the
                reserved cores.

        Returns:
            ``{epoch, gpu, reserved_cores, l2_flush, wait_ms, entry_ms,
            drain_ms, freeze_ms}``; times in ms: ``wait_ms`` in the FIFO
            (step 1), ``entry_ms`` from the request to the grant (steps
            1-5), ``drain_ms`` step 3, ``freeze_ms`` step 4.

        Raises:
            KrexError: NESTED_REGION (tenant already holds or waits),
                BAD_FIELD (pid/tid not the tenant's), DRAIN_TIMEOUT,
                FREEZE_TIMEOUT, CANCELLED (tenant ended while waiting),
                REGION_NO_MEMORY (its expected memory can never fit beside
                its siblings), SHUTTING_DOWN.
        """
        requested_at = time.monotonic()
        self._check_caller(tenant, pid, tid)
        if not self._cfg.enforce or tenant.exclusive:
            # An --exclusive tenant has the whole GPU already: its region is a no-op,
            # so the same script runs with and without --exclusive.
            return self._enter_ungated(tenant)
        region = self._region
        if region is not None and region.adopted and region.tenant.id == tenant.id:
            region.adopted = False  # a region_enter re-sent after a restart: grant it again
            return self._grant_reply(region.epoch, list(self._slice.reserved), 0.0, 0.0)
        if tenant.id in self._requests:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        request = self._requests[tenant.id] = RegionRequest(tenant.id)
        try:
            return await self._enter_recorded(request, tenant, pid, tid, requested_at)
        finally:
            if request.stage != HELD and self._requests.get(tenant.id) is request:
                del self._requests[tenant.id]

    async def _enter_recorded(
        self, request: RegionRequest, tenant: Tenant, pid: int, tid: int, requested_at: float
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
        request.stage = ENTERING
        try:
            await self._wait_for_memory(tenant, request)
            region = await self._establish(tenant, pid, tid, requested_at)
        except BaseException:
            self.stats.failed += 1
            self._lock.release(tenant.id)
            raise
        request.stage = HELD
        testhooks.pause("granted")
        if request.cancelled:
            await self._end(region, "cancelled by its holder")
            raise KrexError(Code.CANCELLED, f"tenant {tenant.id} cancelled its region")
        wait_ms = (locked_at - requested_at) * 1e3
        establish_ms = (region.granted_at - locked_at) * 1e3
        self.stats.grant(wait_ms, establish_ms)
        return self._grant_reply(region.epoch, list(self._slice.reserved), wait_ms, establish_ms)

    def _grant_reply(
        self, epoch: int, reserved: list[int], wait_ms: float, establish_ms: float
    ) -> dict[str, Any]:
        """The region_enter reply body (ms); ``entry_ms`` = wait + steps 2-5."""
        return {
            "epoch": epoch,
            "gpu": self.gpu,
            "reserved_cores": reserved,
            "l2_flush": self._cfg.l2_flush,
            "wait_ms": wait_ms,
            "entry_ms": wait_ms + establish_ms,
            "drain_ms": self._last_drain_ms if epoch else 0.0,
            "freeze_ms": self._last_freeze_ms if epoch else 0.0,
        }

    async def _wait_for_memory(self, holder: Tenant, request: RegionRequest) -> None:
        """Before step 2, with the lock held (FIFO kept): the holder's expected memory
        must fit in what its siblings leave free, or the region would begin into an
        out-of-memory error its frozen siblings cause.

        Waits up to ``RegionMemory.wait_s`` for the siblings (still running) to free
        memory, then proceeds: the expectation is an estimate, and an error inside
        the region is attributed to the co-tenants anyway (exit 75).  Raises
        ``KrexError(REGION_NO_MEMORY)`` at once when the need exceeds what the card
        can ever give it, ``KrexError(CANCELLED)`` when the tenant gives up or ends.
        """
        if self._memory is None:
            return
        fit = self._memory.check(holder, self._siblings(holder))
        if fit is None or fit.fits:
            return
        deadline = time.monotonic() + self._memory.wait_s
        self._mem_waiting = holder.id
        self.memory_waits += 1
        try:
            while fit is not None and not fit.fits:
                if fit.never:
                    raise KrexError(
                        Code.REGION_NO_MEMORY,
                        f"GPU {self.gpu}: tenant {holder.id} expects {_gib(fit.need)} in its "
                        f"region, more than the {_gib(fit.total - fit.other)} the card can give "
                        f"it ({_gib(fit.total)} total, {_gib(fit.other)} held by processes krex "
                        "does not run)",
                    )
                if request.cancelled:
                    raise KrexError(Code.CANCELLED, f"tenant {holder.id} cancelled its region")
                if time.monotonic() >= deadline:
                    log.warning(
                        "GPU %d: tenant %d enters its region expecting %s while its siblings "
                        "leave %s free (waited %g s)",
                        self.gpu,
                        holder.id,
                        _gib(fit.need),
                        _gib(fit.free),
                        self._memory.wait_s,
                    )
                    return
                await asyncio.sleep(0.02)
                fit = self._memory.check(holder, self._siblings(holder))
        finally:
            self._mem_waiting = None

    async def _establish(self, tenant: Tenant, pid: int, tid: int, requested_at: float) -> Region:
        """Steps 2-5 for a tenant that owns the region lock; undo on failure."""
        epoch = self._next_epoch()
        frozen: list[Tenant] = []
        self._frozen, self._entering = frozen, tenant.id
        gate_closed = False
        try:
            # Step 2: close the gate for (holder, epoch).
            self._region_state(states.CLOSING)  # IDLE -> CLOSING
            if self._gate is not None:
                self._gate.close(tenant.id, epoch)
                gate_closed = True
            testhooks.pause("closed")
            # Step 3: drain every sibling (counter zero, contexts synchronized, epoch acked).
            self._region_state(states.DRAINING)  # CLOSING -> DRAINING
            t = time.monotonic()
            await self._drain(tenant, epoch)
            self._last_drain_ms = (time.monotonic() - t) * 1e3
            testhooks.pause("drained")
            # Step 4: freeze sibling process trees once their GPU work has drained.
            self._region_state(states.REGION_FREEZING)  # DRAINING -> FREEZING
            t = time.monotonic()
            await self._freeze(self._siblings(tenant), frozen)
            await self._fail_closed(tenant, epoch)
            self._last_freeze_ms = (time.monotonic() - t) * 1e3
            testhooks.pause("frozen")
            # Step 5: the holder's submitting thread gets the reserved cores.
            self._pin_holder(tenant, tid)
        except BaseException:
            # Any failure: undo in exit order (cores, thaw, reopen) -> IDLE.
            self._region_state(states.RECOVERING)  # CLOSING/DRAINING/FREEZING -> RECOVERING
            self._unpin_holder(tenant, tid)
            self._frozen, self._entering = None, None  # no late arrival joins a failed entry
            await self._thaw(frozen)
            if gate_closed:
                self._reopen_gate(tenant.id, epoch)
            self._region_state(states.IDLE)  # RECOVERING -> IDLE
            raise
        self._entering = None
        self._region_state(states.HELD)  # FREEZING -> HELD
        _tenant_state(tenant, states.RUNNING, states.HOLDING)  # RUNNING -> HOLDING
        region = Region(
            tenant=tenant,
            epoch=epoch,
            pid=pid,
            tid=tid,
            requested_at=requested_at,
            granted_at=time.monotonic(),
            siblings=frozen,
        )
        self._region = region
        self._watch(region)
        return region

    def _next_epoch(self) -> int:
        # Epochs are 32-bit and never 0 (krex_gate.h).
        self._epoch = self._epoch % 0xFFFF_FFFF + 1
        return self._epoch

    async def _drain(self, holder: Tenant, epoch: int) -> None:
        """Step 3: wait for every sibling registration to acknowledge ``epoch`` (bounded)."""
        if self._gate is None:
            return
        timeout_s = self._cfg.drain_timeout_s
        try:
            # wait_drained blocks in C with the GIL released: run it off the loop.
            await asyncio.to_thread(self._gate.drain, holder.id, epoch, timeout_s)
        except GateTimeout as exc:
            raise KrexError(
                Code.DRAIN_TIMEOUT,
                f"drain of GPU {self.gpu} timed out after {self._cfg.drain_timeout_s:g} s; "
                f"not drained: {exc.describe()}",
            ) from None
        except GateError as exc:
            raise KrexError(Code.INTERNAL, f"gate of GPU {self.gpu}: {exc}") from None

    def _siblings(self, holder: Tenant) -> list[Tenant]:
        """This GPU's tenants other than the holder, registered with the shim or not."""
        return [t for t in self._tenants.on_gpu(self.gpu) if t.id != holder.id and not t.exclusive]

    async def _freeze(self, siblings: list[Tenant], frozen: list[Tenant]) -> None:
        """Step 4: freeze each sibling's cgroup and wait until all report frozen.

        ``frozen`` collects every tenant whose cgroup was asked to freeze, so
        the caller can thaw exactly those on failure.  A sibling whose cgroup
        disappears meanwhile (it ended) is skipped.
        """
        for sib in siblings:
            if any(sib is f for f in frozen):
                continue  # admitted during this entry and frozen then (tenant_added)
            try:
                self._ctl.freeze(sib)
            except OSError as exc:
                if gone(exc):
                    continue
                raise
            _tenant_state(sib, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
            frozen.append(sib)
        timeout_s = self._cfg.freeze_timeout_s
        # ``frozen`` may grow while we wait (tenant_added): wait for this snapshot.
        waiting = list(frozen)
        results = await asyncio.gather(*(self._wait_frozen(sib, timeout_s) for sib in waiting))
        stuck = [sib for sib, ok in zip(waiting, results, strict=True) if not ok]
        for sib, ok in zip(waiting, results, strict=True):
            if ok:
                _tenant_state(sib, states.FREEZING, states.FROZEN)  # FREEZING -> FROZEN
        if stuck:
            # A task inside an uninterruptible call delays freezing; like container
            # runtimes, give up after the timeout, thaw back and fail the entry.
            names = ", ".join(f"tenant {s.id}" for s in stuck)
            raise KrexError(
                Code.FREEZE_TIMEOUT,
                f"siblings on GPU {self.gpu} not frozen after "
                f"{self._cfg.freeze_timeout_s:g} s: {names}",
            )

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
        found = await asyncio.to_thread(guard.unprotected, self._siblings(holder), epoch)
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

    def _end_unprotected(self, tenant: Tenant, reason: str) -> None:
        if self._end_command is not None:
            self._end_command(tenant, reason, ExitCode.UNPROTECTABLE)
            return
        tenant.kill_reason = reason
        try:
            self._ctl.kill(tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, tenant.id, exc)

    def idle(self) -> bool:
        """True when no region is held or being established (the gate should be open)."""
        return self.state == states.IDLE and self._region is None and self._entering is None

    async def _wait_frozen(self, sib: Tenant, timeout_s: float) -> bool:
        try:
            return await self._ctl.wait_frozen(sib, timeout_s)
        except OSError as exc:
            if gone(exc):
                return True  # the sibling ended: nothing left to run
            raise

    def _pin_holder(self, holder: Tenant, tid: int) -> None:
        """Step 5: the holder's cgroup gets the reserved cores, and so does thread ``tid``.

        ``[region] holder_cpus = "add"`` (default): the cpuset becomes the
        off-region cores plus the reserved ones, and ``tid`` keeps its own
        affinity plus the reserved cores, so no thread of the holder has fewer
        cores than outside a region (docs/design/daemon.md).  ``"reserved_only"``:
        ``tid`` runs on the reserved cores alone (the paper's pinning).
        """
        self._thread_cpus = None
        if not self._slice.reserved:
            return
        add = self._cfg.holder_cpus == "add"
        try:
            # Read before the cpuset widens: older kernels reset affinities when it does.
            self._thread_cpus = self._pinner.thread_cpus(tid) if add else None
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery
        self._pinner.set_cpus(holder, _union(self._slice.tenant_cores, self._slice.reserved))
        try:
            if not add:
                self._pinner.pin_thread(tid, self._slice.reserved)
            elif self._thread_cpus is not None:
                self._pinner.pin_thread(tid, _union(self._thread_cpus, self._slice.reserved))
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery

    def _unpin_holder(self, holder: Tenant, tid: int) -> None:
        """Undo step 5; never raises, so that the thaw and the reopen after it always run."""
        if not self._slice.reserved:
            return
        back, self._thread_cpus = self._thread_cpus, None
        try:
            # "add": the thread's own affinity from before the region.
            self._pinner.pin_thread(tid, back if back is not None else self._slice.tenant_cores)
        except OSError:
            pass  # the thread ended, or its cgroup's cpuset is restored below
        try:
            self._pinner.set_cpus(holder, self._slice.tenant_cores)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot restore tenant %d's cores: %s", self.gpu, holder.id, exc)

    def _check_caller(self, tenant: Tenant, pid: int, tid: int) -> None:
        """A tenant acts only on itself: pid must be in its cgroup, tid a thread of pid."""
        if tenant.gpu != self.gpu:
            raise KrexError(Code.BAD_FIELD, f"tenant {tenant.id} is not on GPU {self.gpu}")
        if not self._ctl.owns_process(tenant, pid):
            raise KrexError(Code.BAD_FIELD, f"pid {pid} is not a process of tenant {tenant.id}")
        if not self._ctl.thread_exists(pid, tid):
            raise KrexError(Code.BAD_FIELD, f"tid {tid} is not a thread of pid {pid}")

    def _enter_ungated(self, tenant: Tenant) -> dict[str, Any]:
        """``[region] enforce = false``: record the region, enforce nothing."""
        if tenant.id in self._ungated:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        self._ungated.add(tenant.id)
        self.stats.granted += 1
        return self._grant_reply(0, [], 0.0, 0.0)

    def _region_state(self, new: str) -> None:
        states.change_state(self, new, states.REGION_EDGES)

    # ------------------------------------------------------------------- exit

    async def exit(
        self, tenant: Tenant, epoch: int, sync_ms: float, launches: int
    ) -> dict[str, Any]:
        """Run region exit (steps 7-8) for the holder and return the region_exit body.

        Args:
            tenant: the authenticated tenant; must be the holder.
            epoch: the epoch its region_enter returned.
            sync_ms: how long the holder's shim waited for its own contexts
                (reported back, for the record).
            launches: launches the holder made inside the region.

        Returns:
            ``{region_ms, thaw_ms, sync_ms, launches}``.

        Raises:
            KrexError: NOT_HOLDER (no region, another holder, or a stale epoch).
        """
        if not self._cfg.enforce or tenant.exclusive:
            if tenant.id not in self._ungated:
                raise KrexError(Code.NOT_HOLDER, f"tenant {tenant.id} holds no region")
            self._ungated.discard(tenant.id)
            self.stats.completed += 1
            return {"region_ms": 0.0, "thaw_ms": 0.0, "sync_ms": sync_ms, "launches": launches}
        region = self._region
        if (region is None or region.tenant.id != tenant.id) and self._resumed.get(
            tenant.id
        ) == epoch:
            # Re-sent after a restart, for a region that ended meanwhile: answer it again.
            del self._resumed[tenant.id]
            return {"region_ms": 0.0, "thaw_ms": 0.0, "sync_ms": sync_ms, "launches": launches}
        if region is None or region.tenant.id != tenant.id:
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
        return {
            "region_ms": (time.monotonic() - region.granted_at) * 1e3,
            "thaw_ms": thaw_ms,
            "sync_ms": sync_ms,
            "launches": launches,
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
            self._unwatch(region)
            recovering = reason != "exit"
            # Step 7: the holder's cores back to its off-region share; siblings thawed.
            # HELD -> THAWING (exit) or HELD -> RECOVERING (holder died, timed out, ...)
            self._region_state(states.RECOVERING if recovering else states.REGION_THAWING)
            self._unpin_holder(region.tenant, region.tid)
            t = time.monotonic()
            await self._thaw(region.siblings)
            thaw_ms = (time.monotonic() - t) * 1e3
            testhooks.pause("thawed")
            # Step 8: only after the thaw, reopen the gate, then release the lock.
            if not recovering:
                self._region_state(states.REOPENING)  # THAWING -> REOPENING
            self._reopen_gate(region.tenant.id, region.epoch)
            _tenant_state(region.tenant, states.HOLDING, states.RUNNING)  # HOLDING -> RUNNING
            self._region = None
            self._frozen = None
            if self._requests.get(region.tenant.id) is not None:
                del self._requests[region.tenant.id]
            if not recovering:
                self._exited[region.tenant.id] = region.epoch
            self._region_state(states.IDLE)  # REOPENING/RECOVERING -> IDLE
            self._lock.release(region.tenant.id)
            if reason != "exit":
                self.stats.recovered += 1
                log.warning(
                    "GPU %d: region of tenant %d (epoch %d) ended by recovery: %s",
                    self.gpu,
                    region.tenant.id,
                    region.epoch,
                    reason,
                )
            return thaw_ms

    async def _thaw(self, tenants: list[Tenant]) -> None:
        """Thaw each tenant's cgroup and wait until none reports frozen.

        Never raises: a sibling that cannot be thawed is logged and skipped,
        so that the others are thawed and the gate reopened all the same.
        """
        thawed: list[Tenant] = []
        for t in tenants:
            try:
                self._ctl.thaw(t)
            except OSError as exc:
                if not gone(exc):
                    log.error("GPU %d: cannot thaw tenant %d: %s", self.gpu, t.id, exc)
                continue
            thawed.append(t)
            # FROZEN/FREEZING -> THAWING -> RUNNING
            if _tenant_state(t, (states.FROZEN, states.FREEZING), states.THAWING):
                _tenant_state(t, states.THAWING, states.RUNNING)
        deadline = time.monotonic() + max(1.0, self._cfg.freeze_timeout_s)
        for t in thawed:
            while time.monotonic() < deadline:
                try:
                    if not self._ctl.is_frozen(t):
                        break
                except OSError:
                    break  # gone
                await asyncio.sleep(0.0005)

    def _reopen_gate(self, holder: int, epoch: int) -> None:
        if self._gate is None:
            return
        try:
            self._gate.reopen(holder, epoch)
        except GateError as exc:
            # Bound to (holder, epoch): a stale reopen must not open a newer region.
            log.error(
                "GPU %d: reopen for tenant %d epoch %d refused: %s", self.gpu, holder, epoch, exc
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
        log.warning(
            "GPU %d: tenant %d: %s; killing its command", self.gpu, region.tenant.id, reason
        )
        try:
            self._ctl.kill(region.tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, region.tenant.id, exc)
        self._spawn(self._end(region, reason))

    async def tenant_added(self, tenant: Tenant) -> None:
        """A tenant was admitted to this GPU: freeze it if a region is active.

        Called after its cgroup exists and before its command is placed, so a
        command that starts during a region (an ``import torch`` that has not
        reached the shim yet) cannot take CPU from the holder; it is thawed
        with the other siblings at exit.
        """
        frozen = self._frozen
        region = self._region
        holder = region.tenant.id if region is not None else self._entering
        if frozen is None or tenant.exclusive or tenant.id == holder:
            return
        if region is not None and region.ended:
            return
        self._ctl.freeze(tenant)
        _tenant_state(tenant, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
        frozen.append(tenant)  # thawed with the others at exit (or if the entry fails)

    async def cancel(self, tenant: Tenant) -> dict[str, Any]:
        """The tenant's client gave up on its region (interrupted while waiting).

        Withdraws a queued request (its region_enter is answered CANCELLED),
        ends a region being established as soon as it is granted, or ends the
        region it holds: krexd never keeps siblings frozen for a holder that
        stopped listening.  Returns ``{"cancelled": "queued" | "entering" |
        "held" | "none"}``.
        """
        if not self._cfg.enforce or tenant.exclusive:
            held = tenant.id in self._ungated
            self._ungated.discard(tenant.id)
            return {"cancelled": "held" if held else "none"}
        request = self._requests.get(tenant.id)
        if request is None:
            return {"cancelled": "none"}
        stage = request.stage
        request.cancelled = True  # enter() honours it at its next step
        if stage == QUEUED:
            self._lock.cancel(tenant.id)  # False in the hand-over window: enter() sees the flag
            return {"cancelled": QUEUED}
        region = self._region
        if stage == HELD and region is not None and region.tenant.id == tenant.id:
            await self._end(region, "cancelled by its holder")
        return {"cancelled": stage}

    async def tenant_gone(self, tenant: Tenant) -> None:
        """Recovery when a tenant ends: end its region, or drop it from the queue.

        The daemon calls this before it removes the tenant's cgroup.
        """
        self._ungated.discard(tenant.id)
        self._exited.pop(tenant.id, None)
        self._resumed.pop(tenant.id, None)
        request = self._requests.get(tenant.id)
        if request is not None:
            request.cancelled = True  # also in the lock's hand-over window
        self._lock.cancel(tenant.id)  # an entry waiting for memory sees the flag
        region = self._region
        if region is not None and region.tenant.id == tenant.id:
            await self._end(region, "holder's command ended")

    async def shutdown(self) -> None:
        """End any region (thaw, reopen) and cancel every waiter."""
        for key in self._lock.queued():
            self._lock.cancel(key)
        waiting = self._requests.get(self._mem_waiting) if self._mem_waiting is not None else None
        if waiting is not None:
            waiting.cancelled = True  # its entry stops waiting for memory
        region = self._region
        if region is not None:
            await self._end(region, "krexd is shutting down")

    # ------------------------------------------------------- restart (krexd/adopt.py)

    def saved(self) -> dict[str, Any]:
        """What a restarted krexd needs of this GPU: epoch, region in progress, last exits."""
        region = self._region
        saved_region = None
        if region is not None and not region.ended:
            saved_region = {
                "tenant": region.tenant.id,
                "epoch": region.epoch,
                "pid": region.pid,
                "tid": region.tid,
                "siblings": [t.id for t in region.siblings],
                # The holder thread's own cores ("add"), given back at exit.
                "thread_cpus": list(self._thread_cpus) if self._thread_cpus is not None else None,
            }
        exited = {str(k): v for k, v in {**self._resumed, **self._exited}.items()}
        return {"epoch": self._epoch, "region": saved_region, "exited": exited}

    @property
    def epoch(self) -> int:
        """The last epoch this GPU's regions used (0 before the first)."""
        return self._epoch

    def resume(self, epoch: int, exited: dict[int, int]) -> None:
        """Continue the epochs of the krexd before; answer its regions' re-sent exits."""
        self._epoch = max(self._epoch, epoch)
        self._resumed.update(exited)

    def adopt_region(
        self,
        holder: Tenant,
        epoch: int,
        pid: int,
        tid: int,
        siblings: list[Tenant],
        thread_cpus: tuple[int, ...] | None = None,
    ) -> None:
        """Hold the region a crashed krexd granted (its siblings frozen, the gate closed).

        Bound to (holder, epoch) like any region: the holder's exit or its
        process's death ends it, and ``max_region_s`` counts from adoption.
        ``thread_cpus``: the holder thread's affinity before step 5
        (``[region] holder_cpus = "add"``), given back at exit.
        """
        self._thread_cpus = thread_cpus
        self._lock.take(holder.id)
        self._requests[holder.id] = RegionRequest(holder.id, stage=HELD)
        now = time.monotonic()
        region = Region(holder, epoch, pid, tid, now, now, list(siblings), adopted=True)
        self._region, self._frozen = region, region.siblings
        self._epoch = max(self._epoch, epoch)
        # The region went through steps 2-4 in the krexd before: replay its edges.
        for step in (states.CLOSING, states.DRAINING, states.REGION_FREEZING, states.HELD):
            self._region_state(step)  # IDLE -> CLOSING -> DRAINING -> FREEZING -> HELD
        self._watch(region)
        log.warning(
            "GPU %d: adopted the region of tenant %d (epoch %d), %d sibling(s) frozen",
            self.gpu,
            holder.id,
            epoch,
            len(siblings),
        )

    # ----------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        """Holder, queue, counts and entry-latency percentiles (ms) for krexctl status."""
        region = self._region
        holder = None
        if region is not None:
            holder = {
                "tenant": region.tenant.id,
                "epoch": region.epoch,
                "pid": region.pid,
                "age_s": time.monotonic() - region.granted_at,
                "siblings_frozen": [t.id for t in region.siblings],
            }
        return {
            "holder": holder,
            "queue": self._lock.queued(),
            "queue_length": len(self._lock.queued()),
            "enforce": self._cfg.enforce,
            "epoch": self._epoch,
            "memory_wait": self._mem_waiting,
            "memory_waits": self.memory_waits,
            **self.stats.as_dict(),
        }


def _tenant_state(tenant: Tenant, old: str | tuple[str, ...], new: str) -> bool:
    """Move ``tenant`` from ``old`` to ``new`` if it is in ``old``; True when it moved.

    Tenants not yet running their command (ADMITTED) or already EXITED keep
    their lifecycle state: the coordinator freezes their cgroup all the same.
    """
    olds = (old,) if isinstance(old, str) else old
    if tenant.state not in olds:
        return False
    states.change_state(tenant, new)
    return True


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.2f} GiB"
