"""krexd.tenancy.states: guarded transitions."""

from __future__ import annotations

import pytest

from krexd.system.errors import KrexError
from krexd.tenancy import states


class Thing:
    def __init__(
        self, state: states.TenantState | states.RegionState | states.RequestStage
    ) -> None:
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


def test_the_machines_share_no_state_and_no_value() -> None:
    """Tenant, region and request states: no value in common (before, tenant and region
    states were both "freezing" and "thawing", region and request states both "held")."""
    machines = (states.TenantState, states.RegionState, states.RequestStage)
    values = [s.value for m in machines for s in m]
    assert len(values) == len(set(values))
    assert str(states.REGION_FREEZING) == "freezing"  # the logs' name is kept
    assert states.REGION_FREEZING != states.FREEZING
    assert not set(states.TENANT_EDGES) & set(states.REGION_EDGES)
    t = Thing(states.RUNNING)
    with pytest.raises(states.StateError):
        states.change_state(t, states.REGION_FREEZING)
    r = Thing(states.DRAINING)
    with pytest.raises(states.StateError):
        states.change_state(r, states.FREEZING)
    assert t.state is states.RUNNING and r.state is states.DRAINING


def test_a_request_stage_is_guarded_like_any_state() -> None:
    q = Thing(states.RequestStage.QUEUED)
    with pytest.raises(states.StateError, match="queued -> held"):
        states.change_state(q, states.RequestStage.HELD)
    states.change_state(q, states.RequestStage.ENTERING)
    with pytest.raises(states.StateError):
        states.change_state(q, states.HELD)  # the region's HELD, another machine
    states.change_state(q, states.RequestStage.HELD)
    assert q.state is states.RequestStage.HELD


def test_krexds_run_state_moves_only_along_its_edges() -> None:
    from krexd.system.runtime import RunState, Runtime

    r = Runtime()
    with pytest.raises(ValueError, match="starting -> starting"):
        r.change(RunState.STARTING)
    r.change(RunState.SERVING)
    r.check_serving()
    r.change(RunState.RESTARTING)
    with pytest.raises(KrexError):
        r.check_serving()
    for to in RunState:  # leaving for a restart is final, stopping too
        with pytest.raises(ValueError):
            r.change(to)
    assert r.state is RunState.RESTARTING and r.state != "restarting"
