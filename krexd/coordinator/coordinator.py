"""``Coordinator``: one GPU's region protocol, as the daemon and the ops use it.

Combines the steps (``krexd.coordinator``) and adds what the rest of krexd
tells it: a tenant admitted or gone, a cancel, shutdown; and its status.
"""

from __future__ import annotations

import time
from typing import Any

from krexd import states
from krexd.coordinator.adoption import Adoption
from krexd.coordinator.entry import Entry
from krexd.coordinator.records import HELD, QUEUED, tenant_state
from krexd.tenants import Tenant


class Coordinator(Entry, Adoption):
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
            (``krexd.driverlock.DriverLock``; None: the shim's
            acknowledgements alone, ``[region] driver_lock = "off"``).
        ledger: where the locked processes are recorded before they are
            locked (``krexd.lock_ledger.LockLedger``; None: nowhere).
        activity: the witness's source of per-process GPU activity
            (``krexd.activity``; None: regions are not witnessed).
        pool_freeze: the warm pools' freeze every region holds
            (``krexd.pool_freeze``; None: warm pools are off).
    """

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
        tenant_state(tenant, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
        frozen.append(tenant)  # thawed with the others at exit (or if the entry fails)

    async def cancel(self, tenant: Tenant) -> dict[str, Any]:
        """The tenant's client gave up on its region (interrupted while waiting).

        Withdraws a queued request (its region_enter is answered CANCELLED),
        ends a region being established as soon as it is granted, or ends the
        region it holds: krexd never keeps siblings frozen for a holder that
        stopped listening.  Returns ``{"cancelled": "queued" | "entering" |
        "held" | "none"}``.
        """
        if self._is_ungated(tenant):
            return {"cancelled": self._ungated.cancel(tenant)}
        request = self._requests.get(tenant.id)
        if request is None:
            return {"cancelled": "none"}
        stage = request.stage
        request.cancelled = True  # enter() honours it at its next step
        if stage == QUEUED:
            self._lock.cancel(tenant.id)  # False in the hand-over window: enter() sees the flag
            return {"cancelled": QUEUED.value}
        region = self._region
        if stage == HELD and region is not None and region.tenant.id == tenant.id:
            await self._end(region, "cancelled by its holder")
        return {"cancelled": stage.value}

    async def tenant_gone(self, tenant: Tenant) -> None:
        """Recovery when a tenant ends: end its region, or drop it from the queue.

        The daemon calls this before it removes the tenant's cgroup.
        """
        self._ungated.gone(tenant)
        self._exited.pop(tenant.id, None)
        self._resumed.pop(tenant.id, None)
        self._once.forget(tenant.id)
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

    def waiting(self) -> int:
        """Region entries waiting for the region lock now (safe from another thread)."""
        for _ in range(5):
            try:
                return len(self._lock.queued())
            except RuntimeError:  # the loop changed the queue while it was read
                continue
        return 0

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
