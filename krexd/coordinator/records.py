"""The records of the region protocol: a granted ``Region``, a ``RegionRequest``.

A request is recorded from its arrival to its region's end (its stage:
``QUEUED``, ``ENTERING``, ``HELD``); a ``Region`` is bound to one holder and
epoch, so that recovery ends that region and never a newer one.
``tenant_state`` moves a tenant along the lifecycle edges the protocol
drives (``krexd.tenancy.states``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from krexd.coordinator.isolation import Watch
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.undo import UndoStack
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant


@dataclass(eq=False)
class Region:
    """One granted critical region (identity matters: recovery is bound to it)."""

    tenant: Tenant
    epoch: int
    pid: int
    tid: int
    requested_at: float  # monotonic s, when region_enter arrived
    granted_at: float  # monotonic s (0 until granted)
    siblings: list[Tenant] = field(default_factory=list)  # frozen by this region
    ended: bool = False
    end_reason: str = ""
    holder_watch: Watch | None = None  # fires when the holder's process exits
    timer: asyncio.TimerHandle | None = None
    adopted: bool = False  # from a crashed krexd's state, its grant maybe never delivered
    pools_frozen: bool = False  # this region holds the warm pools' freeze (krexd.pools.freeze)
    locks: DriverLocks | None = None  # processes the driver locked for it (unlocked at its end)
    holder_pids: set[int] = field(default_factory=set)  # the holder's processes at the grant
    ended_at: float | None = None  # monotonic s, when its end began (exit or recovery)
    request_id: str | None = None  # the region_enter's request id (a re-sent copy is granted again)
    # Steps 2-5 undone last-first by a failed entry and by its end (7-8): one stack.
    undo: UndoStack = field(default_factory=UndoStack)
    # Its entry's and end's timings (the grant's and the exit's reply; ms or monotonic s).
    locked_at: float = 0.0  # monotonic s, when its entry got the region lock (step 1)
    drain_ms: float = 0.0  # step 3 of its entry (with the driver's locks)
    freeze_ms: float = 0.0  # step 4 of its entry, the fail-closed check included
    check_ms: float = 0.0  # the fail-closed check's share of freeze_ms
    thawed_at: float | None = None  # monotonic s, when its undo reached the gate (step 8)

    def granted_again(self, request_id: str | None) -> bool:
        """Is a region_enter with ``request_id`` a copy of the one this region was granted
        for?  With request ids: when the ids match.  Without (an older client, or a
        region an older krexd saved): the first region_enter after adoption."""
        if self.request_id is not None or request_id is not None:
            return self.request_id == request_id
        if self.adopted:
            self.adopted = False
            return True
        return False

    @property
    def wait_ms(self) -> float:
        """Time in the region lock's FIFO (step 1), ms."""
        return (self.locked_at - self.requested_at) * 1e3

    @property
    def establish_ms(self) -> float:
        """Time from the lock to the grant (steps 2-5), ms."""
        return (self.granted_at - self.locked_at) * 1e3


RequestStage = states.RequestStage
QUEUED = RequestStage.QUEUED
ENTERING = RequestStage.ENTERING
HELD = RequestStage.HELD


@dataclass(eq=False)
class RegionRequest:
    """One tenant's region request, recorded from its arrival until its region ends.

    ``region_cancel`` and recovery act on this record, so a request is never
    found nowhere (the window between the lock's hand-over and the waiter's
    resumption) nor twice (a second ``region_enter`` is refused while one is
    recorded).
    """

    tenant: int
    state: RequestStage = QUEUED  # states.REQUEST_EDGES
    cancelled: bool = False

    def __repr__(self) -> str:
        return f"region request of tenant {self.tenant}"

    @property
    def stage(self) -> RequestStage:
        """Its stage (``value``: the name in ``region_cancel``'s reply)."""
        return self.state

    def advance(self, new: RequestStage) -> None:
        """Move to ``new``, the next stage (raises ``states.StateError`` otherwise)."""
        states.change_state(self, new)


def tenant_state(
    tenant: Tenant,
    old: states.TenantState | tuple[states.TenantState, ...],
    new: states.TenantState,
) -> bool:
    """Move ``tenant`` from ``old`` to ``new`` if it is in ``old``; True when it moved.

    Tenants not yet running their command (ADMITTED) or already EXITED keep
    their lifecycle state: the coordinator freezes their cgroup all the same.
    """
    olds = old if isinstance(old, tuple) else (old,)
    if tenant.state not in olds:
        return False
    states.change_state(tenant, new)
    return True
