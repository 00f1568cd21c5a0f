"""``Steps``: the step objects of one GPU's region protocol, built once, in the paper's order.

Each owns its state; ``GatedRegions`` (``krexd.coordinator.protocol``)
calls them in order and pushes their compensators on each region's undo
stack.
"""

from __future__ import annotations

from dataclasses import dataclass

from krexd.coordinator.cores import HolderCores
from krexd.coordinator.driver_locking import DriverLocking
from krexd.coordinator.fail_closed import FailClosed
from krexd.coordinator.freezing import Freezer
from krexd.coordinator.gate_steps import GateSteps
from krexd.coordinator.isolation import (
    ActivityWitness,
    GpuUseCheck,
    LockRecord,
    Pinner,
    ProcessLock,
    RegionGate,
    RegionMemory,
)
from krexd.coordinator.memory_wait import MemoryWait
from krexd.coordinator.no_gate import NoGate
from krexd.coordinator.scope import GpuScope
from krexd.coordinator.witness import Witness
from krexd.hardware.slices import CpuSlice
from krexd.pools.freeze import PoolFreeze


@dataclass(frozen=True, eq=False)
class Steps:
    """One GPU's step objects (steps 2-8 and the checks between them)."""

    gate: GateSteps  # 2 close, 3 drain, 8 reopen
    memory: MemoryWait  # during 3: the holder's memory fits beside its siblings'
    locks: DriverLocking  # 3: the driver's lock of every other process on the GPU
    freezer: Freezer  # 4 freeze siblings and pools, 7 thaw
    fail_closed: FailClosed  # after 4: unprotected GPU users end (exit 79)
    cores: HolderCores  # 5 pin the holder, 7 unpin
    witness: Witness  # after 7: who else ran on the GPU


def build_steps(
    scope: GpuScope,
    gate: RegionGate | None,
    cpu_slice: CpuSlice,
    pinner: Pinner,
    memory: RegionMemory | None = None,
    guard: GpuUseCheck | None = None,
    proc_lock: ProcessLock | None = None,
    ledger: LockRecord | None = None,
    activity: ActivityWitness | None = None,
    pool_freeze: PoolFreeze | None = None,
) -> Steps:
    """The step objects over the GPU's ports (``Coordinator``'s docstring has each;
    ``gate`` None: a :class:`NoGate`)."""
    return Steps(
        gate=GateSteps(scope, gate if gate is not None else NoGate()),
        memory=MemoryWait(scope, memory),
        locks=DriverLocking(scope, proc_lock, ledger, guard),
        freezer=Freezer(scope, pool_freeze),
        fail_closed=FailClosed(scope, guard),
        cores=HolderCores(scope, pinner, cpu_slice),
        witness=Witness(scope, activity, guard, locking=proc_lock is not None),
    )
