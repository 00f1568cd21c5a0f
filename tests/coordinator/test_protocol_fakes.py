"""The region protocol with in-memory fakes: no root, no cgroups, no built shim.

The coordinator is driven in-process with ``tests/support/fakes.py`` standing in for
the freezer, the pinner and the gate, so each test checks the order of the
protocol's steps (paper §4.2, numbered 1-8 as there) and forces its races at
an exact point.  The same protocol runs against real cgroups and the real
gate in ``test_regions.py``, ``test_recovery_race.py`` and
``test_end_errors.py`` (root).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.gate import RegistrationInfo
from krexd.hardware.slices import CpuSlice
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.support.fakes import Events, FakeGate, FakePinner, FakeTenantControl, make_tenant, until

T = TypeVar("T")

SLICE = CpuSlice(0, cores=(0, 1, 2, 3), reserved=(3,), tenant_cores=(0, 1, 2))


@dataclass
class Rig:
    events: Events
    control: FakeTenantControl
    pinner: FakePinner
    gate: FakeGate
    registry: TenantRegistry
    coord: Coordinator
    tenants: list[Tenant]

    async def enter(self, t: Tenant) -> dict[str, Any]:
        pid = min(t.pids)
        return await self.coord.enter(t, pid, pid)

    async def exit(self, t: Tenant, grant: dict[str, Any]) -> dict[str, Any]:
        return await self.coord.exit(t, grant["epoch"], 0.0, 0)


def rig(n: int, **region: Any) -> Rig:
    events = Events()
    control, pinner, gate = FakeTenantControl(events), FakePinner(events), FakeGate(events)
    pinner.initial = SLICE.tenant_cores  # threads start on the off-region cores
    registry = TenantRegistry()
    tenants = [make_tenant(registry) for _ in range(n)]
    for t in tenants:
        registry.add(t)
    cfg = RegionConfig(**region)
    coord = Coordinator(0, gate, SLICE, registry, cfg, control, pinner)
    return Rig(events, control, pinner, gate, registry, coord, tenants)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 10))


def assert_idle(r: Rig) -> None:
    """Nothing left of a region: idle, gate open, lock free, nobody frozen, cores back."""
    assert r.coord.state == states.IDLE
    assert r.coord.status()["holder"] is None
    assert r.gate.word is None, "gate left closed"
    assert r.coord.gated.requests.owner is None, "region lock still held"
    assert not r.control.frozen, f"left frozen: {r.control.frozen}"
    for tid, cores in r.pinner.cpus.items():
        assert cores == SLICE.tenant_cores, f"tenant {tid} kept the slice {cores}"


# ------------------------------------------------------------------ order of steps


def test_entry_and_exit_run_the_steps_in_the_papers_order() -> None:
    r = rig(3)
    holder, s1, s2 = r.tenants
    tid = min(holder.pids)
    seen: dict[str, Any] = {}
    r.events.on("reopen", lambda: seen.update(owner_at_reopen=r.coord.gated.requests.owner))

    async def scenario() -> None:
        grant = await r.enter(holder)
        e = grant["epoch"]
        assert r.events.log == [
            ("close", holder.id, e),  # 2
            ("drain", holder.id, e),  # 3
            ("freeze", s1.id),  # 4
            ("freeze", s2.id),
            ("wait_frozen", s1.id),
            ("wait_frozen", s2.id),
            ("set_cpus", holder.id, SLICE.cores),  # 5: reserved cores added
            ("pin_thread", tid, SLICE.cores),  # [region] holder_cpus = "add"
        ]
        assert holder.state == states.HOLDING
        assert s1.state == s2.state == states.FROZEN
        assert grant["reserved_cores"] == list(SLICE.reserved)
        del r.events.log[:]
        await r.exit(holder, grant)
        assert r.events.log == [
            ("pin_thread", tid, SLICE.tenant_cores),  # 7: holder's cores back,
            ("set_cpus", holder.id, SLICE.tenant_cores),
            ("thaw", s1.id),  # siblings thawed,
            ("thaw", s2.id),
            ("reopen", holder.id, e),  # 8: then the gate reopened,
        ]
        assert seen["owner_at_reopen"] == holder.id, "lock released before the reopen"
        assert holder.state == s1.state == s2.state == states.RUNNING
        assert_idle(r)  # ... then the lock released

    run(scenario())


def test_each_sibling_is_frozen_as_soon_as_it_has_drained() -> None:
    r = rig(4)
    holder, s1, s2, s3 = r.tenants
    # First scan: s2 and s3 pending (s1 drained); then s3 still pending; then drained.
    r.gate.drain_steps = [{s2.id, s3.id}, {s3.id}]

    async def scenario() -> None:
        grant = await r.enter(holder)
        e = grant["epoch"]
        assert r.events.log == [
            ("close", holder.id, e),  # 2
            ("drain", holder.id, e),  # 3, and 4 for each sibling that drained
            ("freeze", s1.id),
            ("drain_step", (s2.id, s3.id)),
            ("freeze", s2.id),
            ("drain_step", (s3.id,)),
            ("freeze", s3.id),  # 4: the rest, then wait for all
            ("wait_frozen", s1.id),
            ("wait_frozen", s2.id),
            ("wait_frozen", s3.id),
            ("set_cpus", holder.id, SLICE.cores),  # 5
            ("pin_thread", min(holder.pids), SLICE.cores),
        ]
        assert s1.state == s2.state == s3.state == states.FROZEN
        assert r.coord.status()["holder"]["siblings_frozen"] == [s1.id, s2.id, s3.id]
        await r.exit(holder, grant)
        assert {e[1] for e in r.events.log if e[0] == "thaw"} == {s1.id, s2.id, s3.id}
        assert_idle(r)

    run(scenario())


def test_drain_error_after_early_freezes_thaws_them() -> None:
    r = rig(3)
    a, s1, s2 = r.tenants
    r.gate.drain_steps = [{s2.id}]
    r.gate.drain_pending = [7]  # a placeholder of tenant 0: s2 drains at the end

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(a)
        assert err.value.code == Code.DRAIN_TIMEOUT
        assert [e for e in r.events.log if e[0] in ("freeze", "thaw")] == [
            ("freeze", s1.id),
            ("freeze", s2.id),
            ("thaw", s1.id),
            ("thaw", s2.id),
        ]
        assert s1.state == s2.state == states.RUNNING
        assert_idle(r)

    run(scenario())


def test_grant_reports_entry_as_request_to_grant() -> None:
    r = rig(2)

    async def scenario() -> None:
        grant = await r.enter(r.tenants[0])
        assert grant["entry_ms"] >= grant["wait_ms"] >= 0.0
        st = r.coord.status()
        assert st["entry_ms"]["n"] == st["establish_ms"]["n"] == st["wait_ms"]["n"] == 1
        assert st["entry_ms"]["max"] >= st["establish_ms"]["max"]
        await r.exit(r.tenants[0], grant)

    run(scenario())


def test_status_times_each_step_of_the_entry() -> None:
    """``steps_ms`` says where entry time went: a freeze held 30 ms shows as the freeze step."""
    r = rig(2)

    async def scenario() -> None:
        held = r.control.hold_freeze = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Released 30 ms after the freeze wait begins (not after the entry began: the
        # steps before it take their own time on a busy host).
        r.events.on("wait_frozen", lambda: loop.call_later(0.03, held.set) and None)
        grant = await r.enter(r.tenants[0])
        await r.exit(r.tenants[0], grant)
        st = r.coord.status()
        steps = st["steps_ms"]
        assert list(steps) == ["memory", "close", "drain", "freeze", "pools", "check", "pin"]
        assert all(v["n"] == 1 for v in steps.values())
        assert steps["freeze"]["p50"] >= 25.0
        assert max(steps, key=lambda k: steps[k]["p50"]) == "freeze", steps
        assert sum(v["p50"] for v in steps.values()) <= st["establish_ms"]["max"] + 1e-6

    run(scenario())


def test_fifo_among_waiters() -> None:
    r = rig(5)
    a, *waiters = r.tenants
    granted: list[int] = []

    async def one(t: Tenant) -> None:
        grant = await r.enter(t)
        granted.append(t.id)
        await asyncio.sleep(0.01)
        await r.exit(t, grant)

    async def scenario() -> None:
        grant_a = await r.enter(a)
        tasks = []
        for t in reversed(waiters):  # arrival order: last tenant first
            tasks.append(asyncio.ensure_future(one(t)))
            await until(lambda t=t: t.id in r.coord.status()["queue"], "queued")
        assert r.coord.status()["queue"] == [t.id for t in reversed(waiters)]
        await r.exit(a, grant_a)
        await asyncio.gather(*tasks)
        assert granted == [t.id for t in reversed(waiters)]
        assert_idle(r)

    run(scenario())


def test_nested_enter_is_refused() -> None:
    r = rig(2)

    async def scenario() -> None:
        grant = await r.enter(r.tenants[0])
        with pytest.raises(KrexError) as err:
            await r.enter(r.tenants[0])
        assert err.value.code == Code.NESTED_REGION
        await r.exit(r.tenants[0], grant)

    run(scenario())


# ------------------------------------------------------------------ cancel


def test_cancel_queued_withdraws_the_request() -> None:
    r = rig(3)
    a, b, _ = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        waiting = asyncio.ensure_future(r.enter(b))
        await until(lambda: b.id in r.coord.status()["queue"], "b queued")
        assert await r.coord.cancel(b) == {"cancelled": "queued"}
        with pytest.raises(KrexError) as err:
            await waiting
        assert err.value.code == Code.CANCELLED
        assert r.coord.status()["queue"] == []
        await r.exit(a, grant)
        assert_idle(r)

    run(scenario())


def test_cancel_while_entering_ends_the_region_once_granted() -> None:
    r = rig(3)
    a, s1, s2 = r.tenants
    r.control.hold_freeze = asyncio.Event()

    async def scenario() -> None:
        entering = asyncio.ensure_future(r.enter(a))
        await until(lambda: r.coord.state == states.REGION_FREEZING, "freezing")
        assert await r.coord.cancel(a) == {"cancelled": "entering"}
        assert r.control.hold_freeze is not None
        r.control.hold_freeze.set()
        with pytest.raises(KrexError) as err:
            await entering
        assert err.value.code == Code.CANCELLED
        assert r.events.names()[-3:] == ["thaw", "thaw", "reopen"]
        assert_idle(r)
        assert a.state == s1.state == s2.state == states.RUNNING

    run(scenario())


def test_cancel_held_ends_the_region() -> None:
    r = rig(2)
    a, s = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        assert await r.coord.cancel(a) == {"cancelled": "held"}
        assert_idle(r)
        with pytest.raises(KrexError) as err:
            await r.exit(a, grant)
        assert err.value.code == Code.NOT_HOLDER
        assert await r.coord.cancel(a) == {"cancelled": "none"}
        assert s.state == states.RUNNING

    run(scenario())


# ------------------------------------------------------------------ recovery races


def test_holder_dying_during_exit_recovers_nothing_twice() -> None:
    """The holder's process ends while its exit runs: exit wins, recovery is a no-op."""
    r = rig(3)
    holder, s1, s2 = r.tenants
    pid = min(holder.pids)

    async def scenario() -> None:
        grant = await r.enter(holder)
        # The holder dies just as exit restores its cores (the first exit step).
        r.events.on("set_cpus", lambda: r.control.exit_process(pid))
        reply = await r.exit(holder, grant)
        await until(lambda: r.coord.idle(), "idle")  # a scheduled recovery ran (or none)
        await asyncio.sleep(0.02)
        assert reply["launches"] == 0
        assert r.events.names().count("reopen") == 1
        assert r.events.names().count("thaw") == 2
        st = r.coord.status()["regions"]
        assert st["completed"] == 1 and st["recovered"] == 0
        assert_idle(r)

    run(scenario())


def test_holder_death_recovers_and_a_late_exit_is_refused() -> None:
    r = rig(2)
    holder, s = r.tenants

    async def scenario() -> None:
        grant = await r.enter(holder)
        r.control.exit_process(min(holder.pids))
        await until(lambda: r.coord.status()["regions"]["recovered"] == 1, "recovered")
        assert_idle(r)
        assert s.state == states.RUNNING
        assert r.coord.status()["regions"]["recovered"] == 1
        with pytest.raises(KrexError) as err:
            await r.exit(holder, grant)
        assert err.value.code == Code.NOT_HOLDER

    run(scenario())


def test_late_recovery_after_a_newer_region_is_a_no_op() -> None:
    r = rig(3)
    a, b, s = r.tenants

    async def scenario() -> None:
        grant_a = await r.enter(a)
        region_a = r.coord.gated.region
        assert region_a is not None
        await r.exit(a, grant_a)
        grant_b = await r.enter(b)
        before = list(r.events.log)
        assert await r.coord.gated._end(region_a, "late recovery of A") is None
        assert r.events.log == before, "late recovery acted on the newer region"
        assert r.gate.word == (b.id, grant_b["epoch"])
        assert r.control.frozen == {a.id, s.id}
        await r.exit(b, grant_b)
        assert_idle(r)

    run(scenario())


def test_region_outliving_max_region_s_is_killed_and_recovered() -> None:
    r = rig(2, max_region_s=0.05)
    holder, _ = r.tenants

    async def scenario() -> None:
        await r.enter(holder)
        await until(lambda: holder.id in r.control.killed, "the holder killed")
        await until(lambda: r.coord.idle(), "idle")
        assert "max_region_s" in (holder.kill_reason or "")
        assert_idle(r)

    run(scenario())


def test_tenant_gone_ends_its_region() -> None:
    r = rig(2)
    holder, s = r.tenants

    async def scenario() -> None:
        await r.enter(holder)
        await r.coord.tenant_gone(holder)
        assert_idle(r)
        assert r.coord.status()["regions"]["recovered"] == 1

    run(scenario())


# ------------------------------------------------------------------ failed entries


def test_drain_timeout_ends_the_overdue_sibling_and_grants() -> None:
    # The offender pays, not its neighbours: a sibling tenant whose registration did
    # not drain in time has its command ended, and the holder's entry goes on.
    r = rig(3)
    a, b, c = r.tenants
    r.gate.drain_pending = [4]
    r.gate.records = [RegistrationInfo(4, "active", min(b.pids), b.id, 1, 0, 0, 0, 0, 0)]

    async def scenario() -> None:
        grant = await r.enter(a)
        assert ("kill", b.id) in r.events.log
        assert "did not drain its GPU work within drain_timeout_s" in (b.kill_reason or "")
        assert ("kill", c.id) not in r.events.log
        assert grant["driver_lock"]["offenders_ended"] == [b.id]
        # c drained and was frozen during the drain; b with the rest at step 4.
        assert r.events.log[:3] == [("close", a.id, 1), ("drain", a.id, 1), ("freeze", c.id)]
        assert ("freeze", b.id) in r.events.log
        assert r.coord.status()["regions"]["failed"] == 0
        await r.exit(a, grant)
        r.gate.records = []
        assert_idle(r)

    run(scenario())


def test_drain_timeout_of_a_registration_of_no_sibling_fails_the_entry() -> None:
    # Pending registrations that name no sibling tenant cannot be made to pay: the
    # entry is undone with DRAIN_TIMEOUT as before.
    r = rig(3)
    a, b, c = r.tenants
    r.gate.drain_pending = [4]
    r.gate.records = [RegistrationInfo(4, "active", 4242, 99, 1, 0, 0, 0, 0, 0)]

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(a)
        assert err.value.code == Code.DRAIN_TIMEOUT
        assert "slot 4" in err.value.message
        assert "reopen" in r.events.names()
        assert not r.control.killed
        assert b.state == c.state == states.RUNNING
        r.gate.records = []
        assert_idle(r)
        assert r.coord.status()["regions"]["failed"] == 1
        r.gate.drain_pending = []
        grant = await r.enter(b)
        await r.exit(b, grant)
        assert_idle(r)

    run(scenario())


def test_freeze_timeout_thaws_every_sibling_and_reopens() -> None:
    r = rig(3, freeze_timeout_s=0.01)
    a, s1, s2 = r.tenants
    r.control.stuck.add(s2.id)

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(a)
        assert err.value.code == Code.FREEZE_TIMEOUT
        assert f"tenant {s2.id}" in err.value.message
        names = r.events.names()
        assert names.index("reopen") > max(i for i, n in enumerate(names) if n == "thaw")
        assert {e[1] for e in r.events.log if e[0] == "thaw"} == {s1.id, s2.id}
        assert_idle(r)
        assert s1.state == s2.state == a.state == states.RUNNING

    run(scenario())


def test_failed_entry_passes_the_lock_to_the_next_waiter() -> None:
    r = rig(3)
    a, b, c = r.tenants

    async def scenario() -> None:
        grant_a = await r.enter(a)
        r.gate.drain_pending, r.gate.drain_fails_for = [1], {b.id}
        failing = asyncio.ensure_future(r.enter(b))
        waiting = asyncio.ensure_future(r.enter(c))
        await asyncio.sleep(0.01)
        await r.exit(a, grant_a)
        with pytest.raises(KrexError):
            await failing
        grant_c = await waiting
        await r.exit(c, grant_c)
        assert_idle(r)

    run(scenario())


def test_without_a_gate_freezing_and_pinning_still_apply() -> None:
    r = rig(2)
    coord = Coordinator(0, None, SLICE, r.registry, RegionConfig(), r.control, r.pinner)
    a, s = r.tenants

    async def scenario() -> None:
        pid = min(a.pids)
        grant = await coord.enter(a, pid, pid)
        assert r.control.frozen == {s.id}
        await coord.exit(a, grant["epoch"], 0.0, 0)
        assert r.events.names() == [
            "freeze",
            "wait_frozen",
            "set_cpus",
            "pin_thread",
            "pin_thread",
            "set_cpus",
            "thaw",
        ]

    run(scenario())


def test_a_failed_entry_and_an_exit_undo_the_same_steps_in_the_same_order() -> None:
    """One undo path: an entry failing at its last step undoes exactly what an exit undoes.

    Step 5 fails after the cpuset widened (the thread's pin raises); the
    undo must give the cores back, thaw both siblings and reopen, in the
    order an exit of a granted region does.
    """
    r = rig(3)
    holder, s1, s2 = r.tenants
    tid = min(holder.pids)
    pin = r.pinner.pin_thread

    def failing_pin(t: int, cores: tuple[int, ...]) -> None:
        if cores == SLICE.cores:
            raise OSError(5, "injected: the pin failed")
        pin(t, cores)

    def undo_of(log: list[Any]) -> list[Any]:
        """The events after step 5 widened the cpuset, step 5's own pin left out."""
        after = log[log.index(("set_cpus", holder.id, SLICE.cores)) + 1 :]
        return [e for e in after if e != ("pin_thread", tid, SLICE.cores)]

    async def scenario() -> None:
        grant = await r.enter(holder)
        await r.exit(holder, grant)
        exit_undo = undo_of(r.events.log)
        assert_idle(r)
        del r.events.log[:]
        r.pinner.pin_thread = failing_pin  # type: ignore[method-assign]
        with pytest.raises(OSError):
            await r.enter(holder)
        failed_undo = undo_of(r.events.log)
        assert_idle(r)
        strip = [e if e[0] != "reopen" else ("reopen", e[1]) for e in exit_undo]
        assert [e if e[0] != "reopen" else ("reopen", e[1]) for e in failed_undo] == strip
        assert [e[0] for e in strip] == ["pin_thread", "set_cpus", "thaw", "thaw", "reopen"]
        assert strip[0] == ("pin_thread", tid, SLICE.tenant_cores)

    run(scenario())
