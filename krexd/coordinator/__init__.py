"""Per-GPU region coordinator: the region lock, region entry and exit, recovery.

One ``Coordinator`` per GPU implements krexd's half of region-granular
exclusivity (paper §4.2; DESIGN.md "Region entry and exit";
docs/design/architecture.md maps every step to its file).  Steps carry the
paper's numbers (its circled 1-8); ``GatedRegions`` (protocol.py) reads in that order:

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
                   reports it frozen (bounded by freeze_timeout_ms); a tenant
                   is frozen as soon as it has drained, while the others
                   still drain (3 and 4 overlap: DrainFreeze); then fail
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

Each step pushes its compensator on the region's one undo stack as it
takes effect (``krexd.coordinator.undo``), the gate's reopen first; the
stack is unwound by a failed entry before it reports the error, by the
region's end (exit, recovery) and by the end of a region adopted after a
restart, so no tenant is ever left frozen and the paths cannot drift.

The coordinator acts only through injected interfaces (``krexd.coordinator.isolation``):
``TenantControl`` (freeze, thaw, wait frozen, kill, watch the holder),
``Pinner`` (cpuset and thread affinity), ``RegionGate`` (the gate; a
``NoGate`` when ``libkrex_gate.so`` is not built), ``RegionMemory`` (the
memory check during step 3, absent: no check) and ``GpuUseCheck`` (who has
the GPU open; absent where no source can tell), and ends a tenant's command
through the ``end_command`` callback it is given (the daemon's lifecycle).
The daemon injects the cgroup implementations; any other implementation of
these interfaces (in-memory fakes, say) drives the same protocol without
root.

The package is composed, not inherited: each step is an object that owns
its state, ``GatedRegions`` calls them in the paper's order, and
``Coordinator`` picks each tenant's port:

    coordinator.py   Coordinator: builds the steps and ports; requests run once;
                     tenants added and gone, cancel, shutdown, status, restart
    port.py          RegionPort (gated or ungated, one way to call them); the replies
    protocol.py      GatedRegions: steps 0-8 top to bottom, one undo path, adoption
    ungated.py       UngatedRegions: regions that enforce nothing
    request_queue.py RequestQueue: steps 0-1, the requests and the region lock
    records.py       Region (its per-entry timings), RegionRequest; tenant edges
    undo.py          UndoStack: each step's compensator, unwound by every end
    scope.py         GpuScope: what every step reads (GPU, config, control, ender)
    steps.py         Steps: the step objects, built in the paper's order
    gate_steps.py    GateSteps: close (2), drain (3), reopen (8); no_gate.py: NoGate
    memory_wait.py   MemoryWait: during 3, the holder's memory fits beside its siblings
    drain_freeze.py  3 and 4 overlapped: each sibling frozen as soon as it drained
    driver_locking.py DriverLocking: 3 enforced by the driver; offenders end (exit 79)
    freezing.py      Freezer: the siblings' and the warm pools' freeze (4), thaw (7)
    fail_closed.py   FailClosed: after 4, unprotected GPU users end (exit 79)
    cores.py         HolderCores: the holder's reserved cores (5) and their return (7)
    witness.py       Witness: after 7, who else ran on the GPU during the region
    recovery.py      RegionWatch: the holder died or ran past max_region_s
    once.py          requests run once; exits re-sent after a restart answered again

Counters and latency percentiles live in ``krexd.coordinator.region_stats``.
"""

from __future__ import annotations

from krexd.coordinator.coordinator import Coordinator
from krexd.coordinator.records import ENTERING, HELD, QUEUED, Region, RegionRequest

__all__ = ["ENTERING", "HELD", "QUEUED", "Coordinator", "Region", "RegionRequest"]
