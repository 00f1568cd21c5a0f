"""``DrainFreeze.settled``: which tenants the drain is told to stop waiting for."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from krexd.coordinator.drain_freeze import DrainFreeze


@dataclass
class _Tenant:
    id: int
    state: str = "running"


@dataclass
class _Control:
    frozen: list[int] = field(default_factory=list)

    def freeze(self, t: Any) -> None:
        self.frozen.append(t.id)


def test_a_tenant_frozen_when_admitted_during_the_entry_is_skipped_at_once() -> None:
    loop = asyncio.new_event_loop()
    try:
        a, b = _Tenant(1), _Tenant(2)
        ctl = _Control()
        frozen: list[Any] = [b]  # admitted during the entry: frozen by tenant_added
        df = DrainFreeze(ctl, [a], frozen, loop)  # type: ignore[arg-type]
        # a still pending: only b (never waited for, its processes never ran) is skipped.
        assert list(df.settled({1})) == [2]
        assert ctl.frozen == []
        # a drained: frozen here and skipped; b is not reported twice.
        assert list(df.settled(set())) == [1]
        assert ctl.frozen == [1] and frozen == [b, a]
        assert list(df.settled(set())) == []
    finally:
        loop.close()
