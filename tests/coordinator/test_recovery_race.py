"""Forced races around the region protocol, with the coordinator driven in-process.

Real cgroups, real processes, the real gate when libkrex_gate.so is built
(tests/coordinator/conftest.py ``one_gpu``).  Each race is forced in its
dangerous order rather than hoped for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from krexd.tenancy.tenants import Tenant
from tests.coordinator.conftest import OneGpu

pytestmark = [pytest.mark.root]


def test_late_recovery_is_a_no_op_for_a_newer_region(one_gpu: Callable[[int], OneGpu]) -> None:
    """Region A ends, region B begins, and only then does A's recovery run."""
    g = one_gpu(3)
    a, b, s = g.tenants
    g.admit(a, b, s)
    coord = g.coordinator()

    async def scenario() -> None:
        grant_a = await coord.enter(a, g.pid(a), g.pid(a))
        region_a = coord.gated.region
        assert b.cgroup.is_frozen() and s.cgroup.is_frozen()
        await coord.exit(a, grant_a["epoch"], 0.0, 0)
        assert not s.cgroup.is_frozen()
        grant_b = await coord.enter(b, g.pid(b), g.pid(b))
        assert grant_b["epoch"] != grant_a["epoch"]
        # A's recovery arrives late, after B's region began.
        assert region_a is not None
        assert await coord.gated._end(region_a, "late recovery of A") is None
        assert a.cgroup.is_frozen() and s.cgroup.is_frozen(), "late recovery thawed B's siblings"
        if g.gate is not None:
            assert g.gate.word == (b.id, grant_b["epoch"]), "late recovery reopened the gate"
        st = coord.status()
        assert st["holder"]["tenant"] == b.id and st["regions"]["recovered"] == 0
        await coord.exit(b, grant_b["epoch"], 0.0, 0)
        assert not a.cgroup.is_frozen() and not s.cgroup.is_frozen()
        if g.gate is not None:
            assert g.gate.word is None

    asyncio.run(scenario())


def test_tenant_admitted_while_a_region_is_being_established_is_frozen(
    one_gpu: Callable[[int], OneGpu],
) -> None:
    """A command admitted while siblings are being frozen is frozen too."""
    g = one_gpu(3)
    holder, sibling, late = g.tenants
    g.admit(holder, sibling)  # ``late`` is admitted during the entry, below
    coord = g.coordinator()
    real_wait = coord.steps.freezer._wait_frozen

    async def slow_wait_frozen(sib: Tenant, timeout_s: float) -> bool:
        await asyncio.sleep(0.3)  # the window a slow freeze leaves open
        return await real_wait(sib, timeout_s)

    coord.steps.freezer._wait_frozen = slow_wait_frozen  # type: ignore[method-assign]

    async def scenario() -> None:
        entering = asyncio.ensure_future(coord.enter(holder, g.pid(holder), g.pid(holder)))
        await asyncio.sleep(0.1)
        assert coord.status()["holder"] is None  # still establishing
        g.admit(late)  # what the daemon's admission does, then:
        await coord.tenant_added(late)
        grant = await entering
        assert late.cgroup.is_frozen(), "a tenant admitted during entry ran in the region"
        assert sorted(coord.status()["holder"]["siblings_frozen"]) == [sibling.id, late.id]
        await coord.exit(holder, grant["epoch"], 0.0, 0)
        assert not late.cgroup.is_frozen() and not sibling.cgroup.is_frozen()

    asyncio.run(scenario())
