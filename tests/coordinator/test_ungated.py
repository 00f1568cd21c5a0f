"""Regions that enforce nothing keep the port's answers: nested, not holder, cancel."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator.region_stats import RegionStats
from krexd.coordinator.scope import GpuScope
from krexd.coordinator.ungated import UngatedRegions
from krexd.system.errors import KrexError
from krexd.tenancy.tenants import TenantRegistry
from tests.support.fakes import Events, FakeTenantControl


def tenant(tid: int) -> Any:
    return SimpleNamespace(id=tid)


def ungated(stats: RegionStats | None = None) -> UngatedRegions:
    control = FakeTenantControl(Events())
    scope = GpuScope(0, RegionConfig(), control, TenantRegistry(), stats or RegionStats())
    return UngatedRegions(scope)


def test_an_ungated_region_is_entered_once_and_left_by_its_holder_only() -> None:
    stats = RegionStats()
    regions = ungated(stats)

    async def scenario() -> None:
        grant = await regions.enter(tenant(1), 1, 1, None)
        assert grant["epoch"] == 0 and grant["reserved_cores"] == [] and grant["gpu"] == 0
        with pytest.raises(KrexError) as nested:
            await regions.enter(tenant(1), 1, 1, None)
        assert nested.value.code.name == "NESTED_REGION"
        with pytest.raises(KrexError) as other:
            await regions.exit(tenant(2), 0, 0.0, 0)
        assert other.value.code.name == "NOT_HOLDER"
        out = await regions.exit(tenant(1), 0, 1.5, 7)
        assert out == {"region_ms": 0.0, "thaw_ms": 0.0, "sync_ms": 1.5, "launches": 7}
        with pytest.raises(KrexError):
            await regions.exit(tenant(1), 0, 0.0, 0)  # once

    asyncio.run(scenario())
    assert (stats.granted, stats.completed) == (1, 1)


def test_cancel_and_a_tenants_end_forget_its_region() -> None:
    regions = ungated()

    async def scenario() -> None:
        await regions.enter(tenant(3), 1, 1, None)
        assert await regions.cancel(tenant(3)) == "held"
        assert await regions.cancel(tenant(3)) == "none"
        await regions.enter(tenant(3), 1, 1, None)  # may enter again
        await regions.gone(tenant(3))
        await regions.enter(tenant(3), 1, 1, None)

    asyncio.run(scenario())
