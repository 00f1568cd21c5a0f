"""Tenant and region states as constants; every change goes through change_state().

This module imports nothing but the standard library (it must stay importable
from anywhere, like supervisor's ``states.py``).

Tenant edges (``# A -> B`` comments mark them where they are taken)::

    ADMITTED -> RUNNING   CMD placed in its cgroup (place)  -> EXITED
    RUNNING  -> FREEZING  a sibling entered a region (coordinator step 4)
    FREEZING -> FROZEN    the kernel reports the cgroup frozen
    FREEZING -> THAWING   freeze timed out, rolled back
    FROZEN   -> THAWING   the region ended (coordinator step 7)
    THAWING  -> RUNNING   thaw written
    RUNNING  -> HOLDING   the tenant was granted the region (step 5)
    HOLDING  -> RUNNING   the tenant left the region (step 8)
    any live -> EXITED    released, or its launcher / process tree died

Region edges (per GPU, coordinator)::

    IDLE -> CLOSING -> DRAINING -> FREEZING -> HELD -> THAWING -> REOPENING -> IDLE
      steps:  2           3           4       5, 6        7           8
    CLOSING/DRAINING/FREEZING/HELD -> RECOVERING -> IDLE   (failure or holder death)

Steps are the paper's §4.2 numbers (krexd/coordinator/).
"""

from __future__ import annotations

import logging
from typing import Protocol

_log = logging.getLogger("krexd.states")

# --- tenant states ---------------------------------------------------------
# A request waiting for an admission slot is no tenant yet: it is a
# ``krexd.admission.Waiter``; a tenant begins ADMITTED.
ADMITTED = "admitted"
RUNNING = "running"
FREEZING = "freezing"
FROZEN = "frozen"
THAWING = "thawing"
HOLDING = "holding"
EXITED = "exited"

TENANT_EDGES: dict[str, frozenset[str]] = {
    ADMITTED: frozenset({RUNNING, EXITED}),
    RUNNING: frozenset({FREEZING, HOLDING, EXITED}),
    FREEZING: frozenset({FROZEN, THAWING, EXITED}),
    FROZEN: frozenset({THAWING, EXITED}),
    THAWING: frozenset({RUNNING, EXITED}),
    HOLDING: frozenset({RUNNING, EXITED}),
    EXITED: frozenset(),
}

# --- region states (per GPU) -------------------------------------------------
IDLE = "idle"
CLOSING = "closing"
DRAINING = "draining"
REGION_FREEZING = "freezing"
HELD = "held"
REGION_THAWING = "thawing"
REOPENING = "reopening"
RECOVERING = "recovering"

REGION_EDGES: dict[str, frozenset[str]] = {
    IDLE: frozenset({CLOSING}),
    CLOSING: frozenset({DRAINING, RECOVERING}),
    DRAINING: frozenset({REGION_FREEZING, RECOVERING}),
    REGION_FREEZING: frozenset({HELD, RECOVERING}),
    HELD: frozenset({REGION_THAWING, RECOVERING}),
    REGION_THAWING: frozenset({REOPENING, RECOVERING}),
    REOPENING: frozenset({IDLE, RECOVERING}),
    RECOVERING: frozenset({IDLE}),
}


class StateError(RuntimeError):
    """A transition not in the edge table (a bug in the caller)."""


class HasState(Protocol):
    """Anything with a mutable ``state`` string (Tenant, a coordinator's region)."""

    state: str


def change_state(obj: HasState, new: str, edges: dict[str, frozenset[str]] = TENANT_EDGES) -> None:
    """Move ``obj`` to state ``new`` along ``edges``; log the edge; raise on an illegal one.

    ``edges``: :data:`TENANT_EDGES` (default) or :data:`REGION_EDGES`.
    """
    old = obj.state
    if new not in edges.get(old, frozenset()):
        raise StateError(f"{obj!r}: illegal state change {old} -> {new}")
    obj.state = new
    _log.debug("%r: %s -> %s", obj, old, new)
