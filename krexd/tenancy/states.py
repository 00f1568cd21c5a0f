"""Tenant, region and region-request states; every change goes through change_state().

Three enum types with distinct values and one edge table each
(:data:`TENANT_EDGES`, :data:`REGION_EDGES`, :data:`REQUEST_EDGES`; ``# A ->
B`` comments mark where edges are taken); docs/design/daemon.md "States".
Imports nothing but the standard library, so it is importable from anywhere.
"""

from __future__ import annotations

import enum
import logging
from typing import Any, Protocol, TypeVar

_log = logging.getLogger("krexd.states")


class TenantState(enum.Enum):
    """A tenant's lifecycle state; ``value`` is its name on the wire and in the state file."""

    # A request waiting for an admission slot is no tenant yet: it is a
    # ``krexd.tenancy.admission.Waiter``; a tenant begins ADMITTED.
    ADMITTED = "admitted"
    RUNNING = "running"
    FREEZING = "freezing"
    FROZEN = "frozen"
    THAWING = "thawing"
    HOLDING = "holding"
    EXITED = "exited"

    def __str__(self) -> str:
        return self.value


class RegionState(enum.Enum):
    """One GPU's region state; a type apart from :class:`TenantState`, with values of
    its own (``region:...``: none equals a tenant's or a request's); ``str()`` is the
    bare name the logs show ("freezing")."""

    IDLE = "region:idle"
    CLOSING = "region:closing"
    DRAINING = "region:draining"
    FREEZING = "region:freezing"
    HELD = "region:held"
    THAWING = "region:thawing"
    REOPENING = "region:reopening"
    RECOVERING = "region:recovering"

    def __str__(self) -> str:
        return self.name.lower()


class RequestStage(enum.Enum):
    """A region request's stage; ``value`` is its name in ``region_cancel``'s reply."""

    QUEUED = "queued"  # waiting for the region lock, or handed it and not yet resumed
    ENTERING = "entering"  # steps 2-5 in progress
    HELD = "held"  # granted: a Region exists

    def __str__(self) -> str:
        return self.value


# The names the protocol's code reads (``states.RUNNING``, ``states.REGION_FREEZING``).
ADMITTED = TenantState.ADMITTED
RUNNING = TenantState.RUNNING
FREEZING = TenantState.FREEZING
FROZEN = TenantState.FROZEN
THAWING = TenantState.THAWING
HOLDING = TenantState.HOLDING
EXITED = TenantState.EXITED

IDLE = RegionState.IDLE
CLOSING = RegionState.CLOSING
DRAINING = RegionState.DRAINING
REGION_FREEZING = RegionState.FREEZING
HELD = RegionState.HELD
REGION_THAWING = RegionState.THAWING
REOPENING = RegionState.REOPENING
RECOVERING = RegionState.RECOVERING

# ADMITTED -> RUNNING: its command placed (place).  RUNNING -> FREEZING: a
# sibling's region entry froze it (steps 3-4); FREEZING -> FROZEN: the kernel
# reports it frozen; FREEZING -> THAWING: the entry failed and rolls back;
# FROZEN -> THAWING: the region ended (step 7); THAWING -> RUNNING: thaw
# written.  RUNNING -> HOLDING: granted a region (step 5); HOLDING -> RUNNING:
# its region ended.  Any live state -> EXITED: released, or its launcher or
# process tree died.
TENANT_EDGES: dict[TenantState, frozenset[TenantState]] = {
    ADMITTED: frozenset({RUNNING, EXITED}),
    RUNNING: frozenset({FREEZING, HOLDING, EXITED}),
    FREEZING: frozenset({FROZEN, THAWING, EXITED}),
    FROZEN: frozenset({THAWING, EXITED}),
    THAWING: frozenset({RUNNING, EXITED}),
    HOLDING: frozenset({RUNNING, EXITED}),
    EXITED: frozenset(),
}

# One GPU's region, steps in the paper's numbers: IDLE -> CLOSING (2) -> DRAINING
# (3) -> FREEZING (4) -> HELD (5, 6) -> THAWING (7) -> REOPENING (8) -> IDLE;
# a failed entry or any end but the exit goes through RECOVERING to IDLE.
REGION_EDGES: dict[RegionState, frozenset[RegionState]] = {
    IDLE: frozenset({CLOSING}),
    CLOSING: frozenset({DRAINING, RECOVERING}),
    DRAINING: frozenset({REGION_FREEZING, RECOVERING}),
    REGION_FREEZING: frozenset({HELD, RECOVERING}),
    HELD: frozenset({REGION_THAWING, RECOVERING}),
    REGION_THAWING: frozenset({REOPENING, RECOVERING}),
    REOPENING: frozenset({IDLE, RECOVERING}),
    RECOVERING: frozenset({IDLE}),
}


REQUEST_EDGES: dict[RequestStage, frozenset[RequestStage]] = {
    RequestStage.QUEUED: frozenset({RequestStage.ENTERING}),
    RequestStage.ENTERING: frozenset({RequestStage.HELD}),
    RequestStage.HELD: frozenset(),
}

#: Each machine's edge table, by its states' type.
_MACHINES: dict[type[enum.Enum], dict[Any, frozenset[Any]]] = {
    TenantState: TENANT_EDGES,
    RegionState: REGION_EDGES,
    RequestStage: REQUEST_EDGES,
}


class StateError(RuntimeError):
    """A transition not in the edge table (a bug in the caller)."""


S = TypeVar("S", TenantState, RegionState, RequestStage)


class HasState(Protocol[S]):
    """Anything with a mutable ``state`` (a Tenant's, a GPU's region's, a request's)."""

    state: S


def change_state(obj: HasState[S], new: S) -> None:
    """Move ``obj`` to state ``new`` along its machine's edges; log the edge.

    The machine is the states' type: :data:`TENANT_EDGES` for a
    :class:`TenantState`, :data:`REGION_EDGES` for a :class:`RegionState`,
    :data:`REQUEST_EDGES` for a :class:`RequestStage`.

    Raises:
        StateError: ``new`` is not an edge out of ``obj.state`` (a bug in the caller),
            or a state of another machine.
    """
    old = obj.state
    ok = type(new) is type(old) and new in _MACHINES[type(old)][old]
    if not ok:
        raise StateError(f"{obj!r}: illegal state change {old} -> {new}")
    obj.state = new
    _log.debug("%r: %s -> %s", obj, old, new)
