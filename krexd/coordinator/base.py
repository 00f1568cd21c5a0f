"""The state one GPU's region protocol shares, and the small helpers every step uses.

``CoordinatorBase`` holds it: the region lock, the region held or being
established, the recorded requests, the epoch and the region state.  Each
step of the protocol is a mixin over it (``krexd.coordinator``'s modules);
``krexd.coordinator.Coordinator`` combines them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from krexd import states
from krexd.config import RegionConfig
from krexd.coordinator.no_gate import NoGate
from krexd.coordinator.once import OnceLog
from krexd.coordinator.records import Region, RegionRequest
from krexd.coordinator.ungated import UngatedRegions
from krexd.fifo import FifoLock
from krexd.isolation import (
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
from krexd.pool_freeze import PoolFreeze
from krexd.region_stats import RegionStats
from krexd.slices import CpuSlice
from krexd.tenants import Tenant, TenantRegistry


class CoordinatorBase:
    """What every step of one GPU's region protocol reads and writes.

    Built through ``Coordinator`` (its docstring lists the arguments).
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
        self._activity = activity
        self._proc_lock = proc_lock
        self._ledger = ledger
        self._memory = memory
        self._mem_waiting: int | None = None  # tenant whose entry waits for memory
        self.memory_waits = 0  # entries that waited for siblings' memory
        self._guard = guard
        self._end_command = end_command
        self._gate: RegionGate = gate if gate is not None else NoGate()
        self._ctl = control
        self._pinner = pinner
        self._slice = cpu_slice
        self._tenants = tenants
        self._cfg = region
        self._lock: FifoLock[int] = FifoLock()
        self._end_lock = asyncio.Lock()
        self._region: Region | None = None
        self._epoch = 0
        # Warm pools frozen with the siblings (krexd.pool_freeze; None: warm pools are off).
        self.pool_freeze = pool_freeze
        self._thread_cpus: tuple[int, ...] | None = None  # holder thread's own cores ("add")
        self.state: states.RegionState = states.IDLE  # this GPU's (states.REGION_EDGES)
        self.stats = RegionStats()
        # Tenants whose regions enforce nothing ([region] enforce = false, --exclusive).
        self._ungated = UngatedRegions(self.stats)
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
        # Region requests by key (region_enter's request id, region_exit's epoch): a
        # duplicate after a restart gets the first copy's answer (krexd.coordinator.once).
        self._once = OnceLog()

    def __repr__(self) -> str:
        return f"Coordinator(gpu{self.gpu}, {self.state})"

    def _region_state(self, new: states.RegionState) -> None:
        states.change_state(self, new)

    def _next_epoch(self) -> int:
        # Epochs are 32-bit and never 0 (krex_gate.h).
        self._epoch = self._epoch % 0xFFFF_FFFF + 1
        return self._epoch

    def _is_ungated(self, tenant: Tenant) -> bool:
        """Does ``tenant``'s region enforce nothing (``krexd.coordinator.ungated``)?"""
        return not self._cfg.enforce or tenant.exclusive

    def _siblings(self, holder: Tenant) -> list[Tenant]:
        """This GPU's tenants other than the holder, registered with the shim or not."""
        return [t for t in self._tenants.on_gpu(self.gpu) if t.id != holder.id and not t.exclusive]

    def idle(self) -> bool:
        """True when no region is held or being established (the gate should be open)."""
        return self.state == states.IDLE and self._region is None and self._entering is None
