"""A region request moves queued -> entering -> held, through its guard only."""

from __future__ import annotations

import pytest

from krexd.coordinator.records import ENTERING, HELD, QUEUED, RegionRequest
from krexd.tenancy.states import StateError


def test_a_request_moves_forward_one_stage_at_a_time() -> None:
    request = RegionRequest(7)
    assert request.stage is QUEUED
    with pytest.raises(StateError, match="queued -> held"):
        request.advance(HELD)
    request.advance(ENTERING)
    request.advance(HELD)
    with pytest.raises(StateError):
        request.advance(ENTERING)
    assert request.stage is HELD and type(HELD.value) is str  # the wire name is a plain str
