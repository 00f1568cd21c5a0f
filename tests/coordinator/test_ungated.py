"""Regions that enforce nothing keep the port's answers: nested, not holder, cancel."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from krexd.coordinator.ungated import UngatedRegions
from krexd.errors import KrexError
from krexd.region_stats import RegionStats


def tenant(tid: int) -> Any:
    return SimpleNamespace(id=tid)


def test_an_ungated_region_is_entered_once_and_left_by_its_holder_only() -> None:
    stats = RegionStats()
    regions = UngatedRegions(stats)
    regions.enter(tenant(1))
    with pytest.raises(KrexError) as nested:
        regions.enter(tenant(1))
    assert nested.value.code.name == "NESTED_REGION"
    with pytest.raises(KrexError) as other:
        regions.exit(tenant(2))
    assert other.value.code.name == "NOT_HOLDER"
    regions.exit(tenant(1))
    with pytest.raises(KrexError):
        regions.exit(tenant(1))  # once
    assert (stats.granted, stats.completed) == (1, 1)


def test_cancel_and_a_tenants_end_forget_its_region() -> None:
    regions = UngatedRegions(RegionStats())
    regions.enter(tenant(3))
    assert regions.cancel(tenant(3)) == "held"
    assert regions.cancel(tenant(3)) == "none"
    regions.enter(tenant(3))  # may enter again
    regions.gone(tenant(3))
    regions.enter(tenant(3))
