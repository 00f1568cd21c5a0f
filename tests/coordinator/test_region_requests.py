"""Region requests have a per-tenant record from their arrival (issue: region_cancel races).

Driven over the in-memory fakes of ``tests/support/fakes.py`` (no root): each test
forces one window in which the request was, before the record, found
nowhere or found twice.
"""

from __future__ import annotations

import asyncio

import pytest

from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from tests.coordinator.test_protocol_fakes import assert_idle, rig, run
from tests.support.fakes import make_tenant, until


def test_second_enter_while_the_first_is_being_set_up_is_refused() -> None:
    r = rig(2)
    a, _ = r.tenants
    r.control.hold_freeze = asyncio.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(r.enter(a))
        await until(lambda: r.coord.state == states.REGION_FREEZING, "freezing")
        with pytest.raises(KrexError) as err:
            await r.enter(a)
        assert err.value.code == Code.NESTED_REGION
        assert r.coord.status()["queue"] == [], "the second request was queued"
        assert r.control.hold_freeze is not None
        r.control.hold_freeze.set()
        grant = await first
        await r.exit(a, grant)
        assert_idle(r)

    run(scenario())


def test_second_enter_right_after_the_lock_hand_over_is_refused() -> None:
    r = rig(3)
    a, b, _ = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        waiting = asyncio.ensure_future(r.enter(b))
        await until(lambda: b.id in r.coord.status()["queue"], "b queued")
        await r.exit(a, grant)  # hands the lock to b; b's task has not resumed yet
        assert r.coord.gated.requests.owner == b.id
        with pytest.raises(KrexError) as err:
            await r.enter(b)
        assert err.value.code == Code.NESTED_REGION
        grant_b = await waiting
        await r.exit(b, grant_b)
        assert_idle(r)

    run(scenario())


def test_cancel_right_after_the_lock_hand_over_withdraws_the_request() -> None:
    """Before: cancel found the request nowhere ('none') and the region was granted to nobody."""
    r = rig(3)
    a, b, c = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        waiting = asyncio.ensure_future(r.enter(b))
        await until(lambda: b.id in r.coord.status()["queue"], "b queued")
        await r.exit(a, grant)  # lock handed to b, b not resumed
        reply = await r.coord.cancel(b)
        assert reply == {"cancelled": "queued"}
        with pytest.raises(KrexError) as err:
            await waiting
        assert err.value.code == Code.CANCELLED
        assert_idle(r)
        assert c.state == states.RUNNING
        # The lock is free for the next request.
        grant_c = await r.enter(c)
        await r.exit(c, grant_c)
        assert_idle(r)

    run(scenario())


def test_cancel_acts_on_the_one_request_it_names() -> None:
    """A refused second enter leaves the first untouched; cancel then withdraws the first."""
    r = rig(3)
    a, b, _ = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        first = asyncio.ensure_future(r.enter(b))
        await until(lambda: b.id in r.coord.status()["queue"], "b queued")
        with pytest.raises(KrexError):
            await r.enter(b)
        assert await r.coord.cancel(b) == {"cancelled": "queued"}
        with pytest.raises(KrexError) as err:
            await first
        assert err.value.code == Code.CANCELLED
        await r.exit(a, grant)
        assert_idle(r)
        assert await r.coord.cancel(b) == {"cancelled": "none"}

    run(scenario())


def test_exclusive_tenant_gets_a_no_op_grant() -> None:
    r = rig(1)
    ex = make_tenant(r.registry, exclusive=True)
    r.registry.add(ex)

    async def scenario() -> None:
        grant = await r.enter(ex)
        assert grant["epoch"] == 0 and grant["reserved_cores"] == []
        assert r.events.log == [], "an exclusive tenant's region touched gate or cgroups"
        with pytest.raises(KrexError) as err:
            await r.enter(ex)
        assert err.value.code == Code.NESTED_REGION
        reply = await r.exit(ex, grant)
        assert reply["region_ms"] == 0.0
        assert await r.coord.cancel(ex) == {"cancelled": "none"}
        assert_idle(r)

    run(scenario())
