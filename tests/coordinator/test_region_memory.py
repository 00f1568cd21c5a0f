"""Memory-aware region entry over in-memory fakes (no root): tests/support/fakes.py.

Frozen siblings keep their memory for the whole region, so the coordinator
checks that the holder's expected memory fits in what they leave free
(``RegionMemory``), while the drain (step 3) waits:

* it fits: the entry goes on, the check off its critical path;
* it does not fit yet: the entry is undone (siblings thawed, gate
  reopened), waits with its siblings running, lock held (later requests
  stay queued behind it, FIFO), and runs again as soon as siblings free
  memory;
* it never fits: REGION_NO_MEMORY at once, naming the sizes, the entry undone;
* the wait is bounded; the holder's cancel ends it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.hardware.slices import CpuSlice
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.support.fakes import (
    Events,
    FakeGate,
    FakePinner,
    FakeRegionMemory,
    FakeTenantControl,
    make_tenant,
    until,
)

T = TypeVar("T")
G = 1 << 30
SLICE = CpuSlice(0, cores=(0, 1), reserved=(), tenant_cores=(0, 1))


def rig(n: int, wait_s: float = 5.0) -> tuple[Coordinator, FakeRegionMemory, Events, list[Tenant]]:
    events = Events()
    registry = TenantRegistry()
    tenants = [make_tenant(registry) for _ in range(n)]
    for t in tenants:
        registry.add(t)
    mem = FakeRegionMemory(events, total=80 * G, wait_s=wait_s)
    coord = Coordinator(
        0,
        FakeGate(events),
        SLICE,
        registry,
        RegionConfig(),
        FakeTenantControl(events),
        FakePinner(events),
        mem,
    )
    return coord, mem, events, tenants


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def enter(c: Coordinator, t: Tenant) -> dict[str, Any]:
    pid = min(t.pids)
    return await c.enter(t, pid, pid)


def test_a_fitting_entry_goes_on_at_once() -> None:
    c, mem, events, (holder, sib) = rig(2)
    mem.held = {holder.id: 10 * G, sib.id: 30 * G}

    async def scenario() -> None:
        grant = await enter(c, holder)
        await c.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())
    names = events.names()
    # One check, while the drain waited: after the gate closed, before step 4 ended.
    assert names.count("memory_check") == 1
    assert names.index("close") < names.index("memory_check") < names.index("wait_frozen")
    assert names.count("close") == 1 and c.memory_waits == 0


def test_the_memory_check_runs_while_the_drain_waits() -> None:
    c, mem, events, (holder, sib) = rig(2)
    mem.held = {holder.id: 10 * G, sib.id: 30 * G}
    checked = threading.Event()
    drain_saw_check: list[bool] = []
    check_saw_drain: list[bool] = []
    # The drain (in its thread) holds until the check ran, for 5 s at most.
    events.on("drain", lambda: drain_saw_check.append(checked.wait(5)))

    def on_check() -> None:
        check_saw_drain.append("drain" in events.names())
        checked.set()

    events.on("memory_check", on_check)

    async def scenario() -> None:
        grant = await enter(c, holder)
        await c.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())
    assert check_saw_drain == [True] and drain_saw_check == [True]


def test_an_entry_found_short_freezes_no_more_siblings() -> None:
    c, mem, events, (holder, sib, other) = rig(3, wait_s=0.2)
    mem.held = {holder.id: 1 * G, sib.id: 70 * G, other.id: 1 * G}
    mem.expected = {holder.id: 20 * G}
    gate = c.steps.gate.gate
    assert isinstance(gate, FakeGate)
    checked = threading.Event()
    # The drain settles its siblings only after the check said "short".
    events.on("drain", lambda: checked.wait(5))
    events.on("memory_check", checked.set)
    gate.drain_steps = [{other.id}, set()]  # sib drained first, then other

    async def scenario() -> None:
        grant = await enter(c, holder)  # the bounded wait ends: proceeds with a warning
        await c.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())
    first_reopen = events.names().index("reopen")
    early = [e for e in events.log[:first_reopen] if e[0] == "freeze"]
    assert early == [], events.log[:first_reopen]


def _undone_before_waiting(events: Events, sib: Tenant) -> None:
    """The first attempt closed the gate, then reopened it and thawed what it froze."""
    names = events.names()
    assert names.index("close") < names.index("reopen")
    frozen = [e for e in events.log if e[0] == "freeze" and e[1] == sib.id]
    thawed = [e for e in events.log if e[0] == "thaw" and e[1] == sib.id]
    assert len(frozen) == len(thawed), events.log


def test_entry_waits_for_siblings_to_free_before_freezing_them_fifo_kept() -> None:
    c, mem, events, (holder, sib, later) = rig(3)
    mem.held = {holder.id: 5 * G, sib.id: 50 * G, later.id: 1 * G}
    mem.expected = {holder.id: 40 * G}  # 80 - 50 - 1 = 29 GiB free: does not fit

    async def scenario() -> None:
        first = asyncio.ensure_future(enter(c, holder))
        await until(lambda: c.status()["memory_wait"] == holder.id, "the holder's memory wait")
        second = asyncio.ensure_future(enter(c, later))
        await until(lambda: c.status()["queue"] == [later.id], "the later request queued")
        assert not first.done() and not second.done()
        _undone_before_waiting(events, sib)  # waits with the gate open, siblings running
        assert events.names().count("close") == 1
        assert c.status()["memory_wait"] == holder.id
        assert c.status()["queue"] == [later.id], "later requests wait behind, in order"
        mem.held[sib.id] = 20 * G  # the sibling frees memory: 80 - 20 - 1 = 59 GiB free
        grant = await first
        assert not second.done()
        await c.exit(holder, grant["epoch"], 0.0, 0)
        g2 = await second
        await c.exit(later, g2["epoch"], 0.0, 0)

    run(scenario())
    reopened = events.names().index("reopen")
    second_close = events.names().index("close", reopened)
    checks = [e for e in events.log[:second_close] if e[0] == "memory_check"]
    assert [e[2] for e in checks][0] is False and checks[-1] == ("memory_check", holder.id, True)
    assert c.memory_waits == 1


def test_an_entry_that_can_never_fit_fails_at_once_naming_the_sizes() -> None:
    c, mem, events, (holder, sib) = rig(2)
    mem.other = 30 * G  # held by processes krex does not run
    mem.held = {holder.id: 1 * G, sib.id: 10 * G}
    mem.expected = {holder.id: 60 * G}
    t0 = time.monotonic()
    with pytest.raises(KrexError) as err:
        run(enter(c, holder))
    assert err.value.code == Code.REGION_NO_MEMORY
    assert "60.00 GiB" in err.value.message and "50.00 GiB" in err.value.message
    assert time.monotonic() - t0 < 1.0
    _undone_before_waiting(events, sib)
    assert events.names().count("close") == 1 and c.status()["holder"] is None
    assert c.gated.requests.owner is None, "the lock is released"


def test_the_wait_is_bounded_then_the_entry_proceeds() -> None:
    c, mem, events, (holder, sib) = rig(2, wait_s=0.3)
    mem.held = {holder.id: 1 * G, sib.id: 70 * G}
    mem.expected = {holder.id: 20 * G}

    async def scenario() -> float:
        t0 = time.monotonic()
        grant = await enter(c, holder)
        waited = time.monotonic() - t0
        await c.exit(holder, grant["epoch"], 0.0, 0)
        return waited

    waited = run(scenario())
    assert 0.3 <= waited < 2.0
    assert "freeze" in events.names()


def test_cancel_ends_a_wait_for_memory() -> None:
    c, mem, events, (holder, sib) = rig(2, wait_s=30)
    mem.held = {holder.id: 1 * G, sib.id: 70 * G}
    mem.expected = {holder.id: 20 * G}

    async def scenario() -> None:
        entry = asyncio.ensure_future(enter(c, holder))
        await until(lambda: c.status()["memory_wait"] == holder.id, "the holder's memory wait")
        assert (await c.cancel(holder))["cancelled"] == "entering"
        with pytest.raises(KrexError) as err:
            await entry
        assert err.value.code == Code.CANCELLED
        assert c.gated.requests.owner is None

    run(scenario())
    _undone_before_waiting(events, sib)
    assert events.names().count("close") == 1


@pytest.mark.parametrize("how", ["cancel", "holder_gone"])
def test_a_holder_that_gives_up_during_an_undone_attempt_is_not_entered_again(how: str) -> None:
    # The holder cancels (or its command ends) while the first attempt drains; by the
    # time the attempt is undone its siblings have freed memory, so the wait's first
    # check fits: the entry must end CANCELLED there, not close and freeze again.
    c, mem, events, (holder, sib) = rig(2, wait_s=30)
    mem.held = {holder.id: 1 * G, sib.id: 70 * G}
    mem.expected = {holder.id: 20 * G}
    gave_up = threading.Event()

    def hold_drain() -> None:  # in the drain's thread, until the holder gave up
        gave_up.wait(5)

    events.on("drain", hold_drain)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        async def give_up() -> None:
            if how == "cancel":
                assert (await c.cancel(holder))["cancelled"] == "entering"
            else:
                await c.tenant_gone(holder)
            mem.held[sib.id] = 10 * G  # the sibling frees memory meanwhile
            gave_up.set()

        tasks: list[asyncio.Task[None]] = []

        def on_check() -> None:  # the first check, during the drain
            if not tasks:
                tasks.append(loop.create_task(give_up()))

        events.on("memory_check", on_check)
        with pytest.raises(KrexError) as err:
            await enter(c, holder)
        await tasks[0]
        assert err.value.code == Code.CANCELLED
        assert c.gated.requests.owner is None and c.status()["holder"] is None

    run(scenario())
    _undone_before_waiting(events, sib)
    assert events.names().count("close") == 1, events.log
    assert events.names().count("freeze") == events.names().count("thaw")
