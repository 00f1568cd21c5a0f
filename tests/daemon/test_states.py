"""krexd.states: guarded transitions."""

from __future__ import annotations

import pytest

from krexd import states


class Thing:
    def __init__(self, state: states.TenantState | states.RegionState) -> None:
        self.state = state


def test_legal_edges() -> None:
    t = Thing(states.ADMITTED)
    for new in (
        states.RUNNING,
        states.FREEZING,
        states.FROZEN,
        states.THAWING,
        states.RUNNING,
        states.HOLDING,
        states.RUNNING,
        states.EXITED,
    ):
        states.change_state(t, new)
        assert t.state == new


def test_illegal_edge_raises_and_keeps_state() -> None:
    t = Thing(states.EXITED)
    with pytest.raises(states.StateError, match="exited -> running"):
        states.change_state(t, states.RUNNING)
    assert t.state == states.EXITED


def test_region_edges() -> None:
    r = Thing(states.IDLE)
    for new in (
        states.CLOSING,
        states.DRAINING,
        states.REGION_FREEZING,
        states.HELD,
        states.RECOVERING,
        states.IDLE,
    ):
        states.change_state(r, new)
    with pytest.raises(states.StateError):
        states.change_state(r, states.HELD)


def test_the_two_machines_share_no_state() -> None:
    """Spelled alike on the wire ("freezing", "thawing"), never equal, never crossed."""
    assert states.REGION_FREEZING.value == states.FREEZING.value
    assert states.REGION_FREEZING != states.FREEZING
    assert not set(states.TENANT_EDGES) & set(states.REGION_EDGES)
    t = Thing(states.RUNNING)
    with pytest.raises(states.StateError):
        states.change_state(t, states.REGION_FREEZING)
    r = Thing(states.DRAINING)
    with pytest.raises(states.StateError):
        states.change_state(r, states.FREEZING)
    assert t.state is states.RUNNING and r.state is states.DRAINING
