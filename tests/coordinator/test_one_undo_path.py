"""One undo path: a failed entry, an end and an adopted region's end unwind one stack.

Each step of an entry pushes its compensator on the region's undo stack as
it takes effect, the gate's reopen first; ``GatedRegions._teardown`` unwinds
it for every path (krexd.coordinator.protocol), so the paths cannot drift.
Over the fakes of ``tests/support/fakes.py``: no root.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.pools.freeze import PoolFreeze
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.coordinator.test_driver_locking import LockRig
from tests.coordinator.test_protocol_fakes import SLICE, Rig, assert_idle, rig, run
from tests.support.fakes import Events, FakeGate, FakePinner, FakeTenantControl, make_tenant

#: What an entry pushes, in push order (so unwound last-first: cores first, gate last).
STACK = ["gate", "pools' freeze", "driver locks", "siblings' freeze", "cores"]


def _pools(tmp_path: Any) -> PoolFreeze:
    (tmp_path / "cgroup.freeze").write_text("0\n")
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 1\n")  # frozen at once
    return PoolFreeze(str(tmp_path))


async def cancel_the_exit_during_its_thaw(r: Rig, holder: Tenant, after_s: float) -> None:
    """Enter as ``holder``, then cancel its exit ``after_s`` seconds in, while the
    siblings' thaw is still waited for (as a stop cancels the requests in flight)."""
    grant = await r.enter(holder)
    r.control.is_frozen = lambda t: True  # type: ignore[method-assign]  # slow thaw
    exiting = asyncio.ensure_future(r.exit(holder, grant))
    await asyncio.sleep(after_s)
    exiting.cancel()
    try:
        await exiting
    except asyncio.CancelledError:
        pass
    del r.control.is_frozen


def test_an_adopted_region_has_the_stack_an_entered_one_has(tmp_path: Any) -> None:
    # Before, adoption pushed its own list (the pools after the siblings, no gate): an
    # adopted region's end thawed in another order than an entered region's end.
    events = Events()
    registry = TenantRegistry()
    holder, sibling = make_tenant(registry), make_tenant(registry)
    registry.add(holder)
    registry.add(sibling)
    pools = _pools(tmp_path)

    def coordinator() -> Coordinator:
        control, pinner, gate = FakeTenantControl(events), FakePinner(events), FakeGate(events)
        cfg = RegionConfig()
        return Coordinator(0, gate, SLICE, registry, cfg, control, pinner, pool_freeze=pools)

    entered, adopted = coordinator(), coordinator()
    tid = min(holder.pids)

    async def scenario() -> None:
        grant = await entered.enter(holder, tid, tid)
        region = entered.gated.region
        assert region is not None and region.undo.names() == STACK
        adopted.adopt_region(holder, grant["epoch"], tid, tid, [sibling])
        again = adopted.gated.region
        assert again is not None and again.undo.names() == STACK
        assert pools.holders == 2
        await adopted.exit(holder, grant["epoch"], 0.0, 0)
        assert again.undo.names() == [] and pools.holders == 1

    run(scenario())


def test_a_cancel_during_the_ends_thaw_still_reopens_and_releases() -> None:
    # The exit's task is cancelled while a sibling thaws (a stop cancels the requests
    # in flight).  Before, the end stopped after the unwind: the gate stayed closed, the
    # state THAWING and the lock held, so no region could begin on the GPU again.
    r = rig(2)
    holder, sibling = r.tenants

    async def scenario() -> None:
        await cancel_the_exit_during_its_thaw(r, holder, 0.05)
        assert r.coord.state == states.IDLE
        assert r.gate.word is None, "gate left closed"
        assert r.coord.gated.requests.owner is None, "region lock still held"
        again = await r.enter(sibling)  # the GPU serves regions again
        await r.exit(sibling, again)
        assert_idle(r)

    run(scenario())


def test_a_second_cancel_during_a_failed_entrys_undo_still_reopens() -> None:
    # The entry is cancelled while it waits for a freeze, then again while its undo
    # thaws.  Before, the reopen came after the unwind and was skipped: the gate stayed
    # closed and the state RECOVERING, and the next entry failed on its first edge.
    r = rig(3)
    holder, s1, _ = r.tenants
    r.control.hold_freeze = asyncio.Event()

    async def scenario() -> None:
        entering = asyncio.ensure_future(r.enter(holder))
        while ("wait_frozen", s1.id) not in r.events.log:
            await asyncio.sleep(0.005)
        r.control.is_frozen = lambda t: True  # type: ignore[method-assign]  # slow thaw
        entering.cancel()
        await asyncio.sleep(0.05)  # inside the undo's thaw now
        entering.cancel()
        try:
            await entering
        except asyncio.CancelledError:
            pass
        del r.control.is_frozen
        r.control.hold_freeze = None
        assert r.coord.state == states.IDLE
        assert r.gate.word is None, "gate left closed"
        grant = await r.enter(s1)
        await r.exit(s1, grant)
        assert_idle(r)

    run(scenario())


def test_a_cancel_while_the_unlock_waits_for_its_thread_still_unlocks() -> None:
    # The exit's task is cancelled as the driver unlock waits for a worker thread.
    # Before, the cancel reached the unlock's queued job, which never ran: the
    # siblings' processes stayed locked through the driver (no GPU work) and the
    # ledger kept them, although the region had ended and the gate reopened.
    r = LockRig(3)
    holder = r.tenants[0]
    busy = threading.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        grant = await r.enter(holder)
        assert r.plock.locked, "the siblings' processes are locked in the region"
        blocker = loop.run_in_executor(None, busy.wait)  # the one worker is busy
        exiting = asyncio.ensure_future(r.exit(holder, grant))
        while r.control.frozen and not exiting.done():
            await asyncio.sleep(0)  # until the siblings are thawed: the unlock is next
        exiting.cancel()
        for _ in range(10):
            await asyncio.sleep(0)  # the cancel reaches the unlock, queued behind the blocker
        busy.set()
        await blocker
        try:
            await exiting
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.05)
        assert not r.plock.locked, f"left locked through the driver: {r.plock.locked}"
        assert r.ledger.entries == [], "the ledger kept the unlocked processes"
        assert r.coord.state == states.IDLE and r.gate.word is None

    run(scenario())


def test_an_end_cancelled_during_its_unwind_is_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # region_cancel's task is cancelled while the siblings thaw (a stop cancels the
    # requests in flight).  The region ends all the same; before, its end was neither
    # counted (regions.recovered) nor logged, so status said it never ended.
    r = rig(2)
    holder, _ = r.tenants

    async def scenario() -> None:
        await r.enter(holder)
        r.control.is_frozen = lambda t: True  # type: ignore[method-assign]  # slow thaw
        cancelling = asyncio.ensure_future(r.coord.cancel(holder))
        await asyncio.sleep(0.02)
        cancelling.cancel()
        try:
            await cancelling
        except asyncio.CancelledError:
            pass
        del r.control.is_frozen
        assert_idle(r)

    with caplog.at_level(logging.WARNING, logger="krexd.coordinator"):
        run(scenario())
    regions = r.coord.status()["regions"]
    assert (regions["granted"], regions["recovered"]) == (1, 1), regions
    assert "ended by recovery: cancelled by its holder" in caplog.text


def test_an_exit_cancelled_during_its_unwind_is_counted_completed() -> None:
    r = rig(2)
    holder, _ = r.tenants

    async def scenario() -> None:
        await cancel_the_exit_during_its_thaw(r, holder, 0.02)
        assert_idle(r)

    run(scenario())
    regions = r.coord.status()["regions"]
    assert (regions["granted"], regions["completed"], regions["recovered"]) == (1, 1, 0)
