"""``Coordinator``: one GPU's regions, as the daemon and the ops use them.

Builds the GPU's step objects (``krexd.coordinator.steps``) and its two
region ports, ``GatedRegions`` (the protocol, ``krexd.coordinator.protocol``)
and ``UngatedRegions``, picks the port of each tenant, runs each region
request once (``krexd.coordinator.once``), and reports status and what a
restart needs.
"""

from __future__ import annotations

import time
from typing import Any

from krexd.config.config import RegionConfig
from krexd.coordinator.isolation import (
    ActivityWitness,
    EndCommand,
    GpuUseCheck,
    LockRecord,
    Pinner,
    ProcessLock,
    RegionGate,
    RegionMemory,
    TenantControl,
)
from krexd.coordinator.once import EndedEpochs, OnceLog
from krexd.coordinator.port import RegionPort
from krexd.coordinator.protocol import GatedRegions
from krexd.coordinator.region_stats import RegionStats
from krexd.coordinator.scope import GpuScope
from krexd.coordinator.steps import build_steps
from krexd.coordinator.ungated import UngatedRegions
from krexd.hardware.slices import CpuSlice
from krexd.pools.freeze import PoolFreeze
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry


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
        memory: the memory check during step 3 (None: none).
        guard: the fail-closed check after step 4 (None: skipped).
        end_command: ``end_command(tenant, reason, exit_code)`` ends a
            tenant's command for unprotectable GPU use (None: the tree is
            killed through ``control`` with the reason recorded).
        proc_lock: the driver's lock of other processes
            (``krexd.hardware.driverlock.DriverLock``; None: the shim's
            acknowledgements alone, ``[region] driver_lock = "off"``).
        ledger: where the locked processes are recorded before they are
            locked (``krexd.hardware.lock_ledger.LockLedger``; None: nowhere).
        activity: the witness's source of per-process GPU activity
            (``krexd.memory.activity``; None: regions are not witnessed).
        pool_freeze: the warm pools' freeze every region holds
            (``krexd.pools.freeze``; None: warm pools are off).
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
        end_command: EndCommand | None = None,
        proc_lock: ProcessLock | None = None,
        ledger: LockRecord | None = None,
        activity: ActivityWitness | None = None,
        pool_freeze: PoolFreeze | None = None,
    ) -> None:
        self.gpu = gpu
        self.stats = RegionStats()
        self._scope = GpuScope(gpu, region, control, tenants, self.stats, end_command)
        self.steps = build_steps(
            self._scope,
            gate,
            cpu_slice,
            pinner,
            memory,
            guard,
            proc_lock,
            ledger,
            activity,
            pool_freeze,
        )
        self._ended = EndedEpochs()  # regions ended by exit: a re-sent exit answered again
        self.gated = GatedRegions(self._scope, self.steps, self._ended)
        self._ungated = UngatedRegions(self._scope)
        # Region requests by key (region_enter's request id, region_exit's epoch): a
        # duplicate after a restart gets the first copy's answer.
        self._once = OnceLog()

    def __repr__(self) -> str:
        return repr(self.gated)

    def _port(self, tenant: Tenant) -> RegionPort:
        """The port of ``tenant``'s regions: ungated when they enforce nothing
        (``[region] enforce = false``, or an ``--exclusive`` tenant)."""
        if not self._scope.cfg.enforce or tenant.exclusive:
            return self._ungated
        return self.gated

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None = None
    ) -> dict[str, Any]:
        """Run region entry for ``tenant`` (steps 0-5) and return the region_enter reply body.

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
            drain_ms, freeze_ms, check_ms, driver_lock}``; times in ms:
            ``wait_ms`` in the FIFO (step 1), ``entry_ms`` from the request
            to the grant (steps 1-5), ``drain_ms`` step 3, ``freeze_ms`` step
            4 (with the fail-closed check after it, ``check_ms``).

        Raises:
            KrexError: NESTED_REGION (tenant already holds or waits),
                BAD_FIELD (pid/tid not the tenant's), DRAIN_TIMEOUT,
                FREEZE_TIMEOUT, CANCELLED (tenant ended while waiting),
                REGION_NO_MEMORY (its expected memory can never fit beside
                its siblings), SHUTTING_DOWN.
        """
        key = f"enter:{request_id}" if request_id else None

        async def first_copy() -> dict[str, Any]:
            self._check_caller(tenant, pid, tid)
            return await self._port(tenant).enter(tenant, pid, tid, request_id)

        return await self._once.run(tenant.id, key, first_copy)

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
            ``{region_ms, thaw_ms, sync_ms, launches}`` (ms), and for a gated
            region ``witness`` (``Witness.see``).

        Raises:
            KrexError: NOT_HOLDER (no region, another holder, or a stale epoch),
                REGION_ABORTED (recovery ended the region first).
        """
        key = f"exit:{epoch}" if epoch else (f"exit:{request_id}" if request_id else None)
        return await self._once.run(
            tenant.id, key, lambda: self._port(tenant).exit(tenant, epoch, sync_ms, launches)
        )

    async def cancel(self, tenant: Tenant) -> dict[str, Any]:
        """The tenant's client gave up on its region (interrupted while waiting).

        Withdraws a queued request (its region_enter is answered CANCELLED),
        ends a region being established as soon as it is granted, or ends the
        region it holds: krexd never keeps siblings frozen for a holder that
        stopped listening.  Returns ``{"cancelled": "queued" | "entering" |
        "held" | "none"}``.
        """
        return {"cancelled": await self._port(tenant).cancel(tenant)}

    async def tenant_added(self, tenant: Tenant) -> None:
        """A tenant was admitted to this GPU: freeze it if a region is active.

        Called after its cgroup exists and before its command is placed, so a
        command that starts during a region (an ``import torch`` that has not
        reached the shim yet) cannot take CPU from the holder; it is thawed
        with the other siblings at exit.
        """
        await self.gated.tenant_added(tenant)

    async def tenant_gone(self, tenant: Tenant) -> None:
        """Recovery when a tenant ends: end its region, or drop it from the queue.

        The daemon calls this before it removes the tenant's cgroup.
        """
        await self._ungated.gone(tenant)
        self._ended.forget(tenant.id)
        self._once.forget(tenant.id)
        await self.gated.gone(tenant)

    async def shutdown(self) -> None:
        """End any region (thaw, reopen) and cancel every waiter."""
        await self.gated.shutdown()

    @property
    def state(self) -> states.RegionState:
        """This GPU's region state (``states.REGION_EDGES``)."""
        return self.gated.state

    @property
    def epoch(self) -> int:
        """The last epoch this GPU's regions used (0 before the first)."""
        return self.gated.epoch

    @property
    def pool_freeze(self) -> PoolFreeze | None:
        """The warm pools' freeze this GPU's regions hold (None: warm pools are off)."""
        return self.steps.freezer.pool_freeze

    @property
    def memory_waits(self) -> int:
        """Entries that waited for their siblings' memory."""
        return self.steps.memory.waits

    def idle(self) -> bool:
        """True when no region is held or being established (the gate should be open)."""
        return self.gated.idle()

    def waiting(self) -> int:
        """Region entries waiting for the region lock now (safe from another thread)."""
        for _ in range(5):
            try:
                return len(self.gated.requests.queued())
            except RuntimeError:  # the loop changed the queue while it was read
                continue
        return 0

    def status(self) -> dict[str, Any]:
        """Holder, queue, counts and entry-latency percentiles (ms) for krexctl status."""
        region = self.gated.region
        holder = None
        if region is not None:
            holder = {
                "tenant": region.tenant.id,
                "epoch": region.epoch,
                "pid": region.pid,
                "age_s": time.monotonic() - region.granted_at,
                "siblings_frozen": [t.id for t in region.siblings],
            }
        queue = self.gated.requests.queued()
        return {
            "holder": holder,
            "queue": queue,
            "queue_length": len(queue),
            "enforce": self._scope.cfg.enforce,
            "epoch": self.gated.epoch,
            "memory_wait": self.steps.memory.waiting,
            "memory_waits": self.steps.memory.waits,
            **self.stats.as_dict(),
        }

    # ------------------------------------------------- restart (krexd/restarts/adopt.py)

    def saved(self) -> dict[str, Any]:
        """What a restarted krexd needs of this GPU: epoch, region in progress, last exits."""
        region = self.gated.region
        saved_region = None
        ended = {}
        if region is not None and not region.ended:
            cpus = self.steps.cores.thread_cpus
            saved_region = {
                "tenant": region.tenant.id,
                "epoch": region.epoch,
                "pid": region.pid,
                "tid": region.tid,
                "siblings": [t.id for t in region.siblings],
                # The holder thread's own cores ("add"), given back at exit.
                "thread_cpus": list(cpus) if cpus is not None else None,
                # Its region_enter's request id: a copy re-sent to the successor is granted again.
                "request": region.request_id,
            }
        elif region is not None:
            # Its end is in progress (thawed, maybe not reopened): the successor reopens the
            # gate and thaws everyone, and answers the holder's re-sent region_exit.
            ended[region.tenant.id] = region.epoch
        exited = {str(k): v for k, v in {**self._ended.saved(), **ended}.items()}
        return {"epoch": self.gated.epoch, "region": saved_region, "exited": exited}

    def settle_locks(self) -> None:
        """At start: processes a krexd before left locked through the driver belong to
        the region adopted from it, or are unlocked now (``DriverLocking.settle``)."""
        self.steps.locks.settle(self.gated.region)

    def resume(self, epoch: int, exited: dict[int, int]) -> None:
        """Continue the epochs of the krexd before; answer its regions' re-sent exits
        (``exited``: tenant id -> epoch)."""
        self.gated.epoch = max(self.gated.epoch, epoch)
        self._ended.resume(exited)

    def adopt_region(
        self,
        holder: Tenant,
        epoch: int,
        pid: int,
        tid: int,
        siblings: list[Tenant],
        thread_cpus: tuple[int, ...] | None = None,
        request_id: str | None = None,
    ) -> None:
        """Hold the region a crashed krexd granted (its siblings frozen, the gate closed).

        Bound to (holder, epoch) like any region: the holder's exit or its
        process's death ends it, and ``max_region_s`` counts from adoption.
        ``thread_cpus``: the holder thread's affinity before step 5
        (``[region] holder_cpus = "add"``), given back at exit.
        ``request_id``: its region_enter's (a re-sent copy is granted again).
        The warm pools are frozen for it, as for any region
        (``krexd.pools.freeze``).
        """
        self.gated.adopt(holder, epoch, pid, tid, siblings, thread_cpus, request_id)

    def _check_caller(self, tenant: Tenant, pid: int, tid: int) -> None:
        """A tenant acts only on itself: pid must be in its cgroup, tid a thread of pid."""
        control = self._scope.control
        if tenant.gpu != self.gpu:
            raise KrexError(Code.BAD_FIELD, f"tenant {tenant.id} is not on GPU {self.gpu}")
        if not control.owns_process(tenant, pid):
            raise KrexError(Code.BAD_FIELD, f"pid {pid} is not a process of tenant {tenant.id}")
        if not control.thread_exists(pid, tid):
            raise KrexError(Code.BAD_FIELD, f"tid {tid} is not a thread of pid {pid}")
