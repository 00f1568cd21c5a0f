"""The coordinator's step objects, each over its own state (krexd.coordinator.steps).

Over the fakes of ``tests/support/fakes.py``: no root, no cgroups, no gate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator.cores import HolderCores
from krexd.coordinator.freezing import Freezer
from krexd.coordinator.memory_wait import MemoryWait
from krexd.coordinator.once import EndedEpochs
from krexd.coordinator.records import ENTERING, HELD, QUEUED, RegionRequest
from krexd.coordinator.region_stats import RegionStats
from krexd.coordinator.request_queue import RequestQueue
from krexd.coordinator.scope import GpuScope
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.coordinator.test_protocol_fakes import SLICE, rig, run
from tests.support.fakes import (
    Events,
    FakePinner,
    FakeRegionMemory,
    FakeTenantControl,
    make_tenant,
    until,
)

G = 1 << 30


def scope_of(n: int, **region: Any) -> tuple[GpuScope, FakeTenantControl, list[Tenant]]:
    events = Events()
    registry = TenantRegistry()
    tenants = [make_tenant(registry) for _ in range(n)]
    for t in tenants:
        registry.add(t)
    control = FakeTenantControl(events)
    scope = GpuScope(0, RegionConfig(**region), control, registry, RegionStats())
    return scope, control, tenants


# ---------------------------------------------------------------- the scope


def test_the_scope_names_siblings_and_ends_a_command_with_exit_79() -> None:
    scope, control, (a, b, c) = scope_of(3)
    assert scope.siblings(a) == [b, c]
    scope.end_tenant(b, "it ran in a region", "unprotected")  # no ender: killed
    assert control.killed == {b.id} and b.kill_reason == "it ran in a region"
    assert scope.stats.ended["unprotected"] == 1
    ended: list[tuple[int, str, int, str]] = []
    routed = GpuScope(
        0,
        scope.cfg,
        control,
        scope.tenants,
        scope.stats,
        lambda t, reason, code, cause="other": ended.append((t.id, reason, code, cause)),
    )
    routed.end_tenant(c, "late", "drain_timeout")
    assert ended == [(c.id, "late", 79, "drain_timeout")] and c.id not in control.killed


# ------------------------------------------------------- steps 0-1: the queue


def test_the_queue_records_one_request_per_tenant_and_cancels_by_stage() -> None:
    queue = RequestQueue()
    registry = TenantRegistry()
    a, b = make_tenant(registry), make_tenant(registry)

    async def scenario() -> None:
        ra = queue.record(a)
        with pytest.raises(KrexError) as nested:
            queue.record(a)
        assert nested.value.code is Code.NESTED_REGION
        await queue.acquire(ra)
        assert ra.stage is ENTERING and queue.owner == a.id
        rb = queue.record(b)
        waiting = asyncio.ensure_future(queue.acquire(rb))
        await asyncio.sleep(0)
        assert queue.queued() == [b.id]
        assert queue.cancel(b) is QUEUED and rb.cancelled
        with pytest.raises(KrexError) as cancelled:
            await waiting
        assert cancelled.value.code is Code.CANCELLED
        queue.drop(rb)
        assert queue.cancel(b) is None
        ra.advance(HELD)
        queue.drop(ra)  # a HELD request stays until its region ends
        assert queue.cancel(a) is HELD
        queue.ended(a.id)
        assert queue.owner is None and queue.cancel(a) is None

    run(scenario())


def test_an_adopted_request_replays_its_stages_through_the_guard() -> None:
    queue = RequestQueue()
    queue.adopt(7)
    assert queue.owner == 7
    request = RegionRequest(7)
    with pytest.raises(states.StateError):
        request.advance(HELD)  # no stage is skipped, adopted or not
    queue.ended(7)
    assert queue.owner is None


# -------------------------------------------------------- step 3: memory wait


def test_memory_wait_counts_its_waits_and_says_who_waits() -> None:
    scope, _, (holder, sib) = scope_of(2)
    memory = FakeRegionMemory(Events(), total=80 * G, wait_s=5.0)
    memory.held = {holder.id: 1 * G, sib.id: 70 * G}
    memory.expected = {holder.id: 20 * G}
    wait = MemoryWait(scope, memory)
    seen: list[int | None] = []

    async def scenario() -> None:
        assert await wait.short(holder)
        waiting = asyncio.ensure_future(wait.wait(holder, RegionRequest(holder.id)))
        await until(lambda: wait.waiting is not None, "a wait for memory")
        seen.append(wait.waiting)
        memory.held[sib.id] = 10 * G  # the sibling frees memory
        await waiting

    run(scenario())
    assert seen == [holder.id] and wait.waiting is None and wait.waits == 1


def test_memory_that_can_never_fit_fails_at_once() -> None:
    scope, _, (holder, _) = scope_of(2)
    memory = FakeRegionMemory(Events(), total=8 * G)
    memory.expected = {holder.id: 20 * G}
    wait = MemoryWait(scope, memory)
    with pytest.raises(KrexError) as never:
        run(wait.wait(holder, RegionRequest(holder.id)))
    assert never.value.code is Code.REGION_NO_MEMORY and wait.waiting is None


# ---------------------------------------------- step 5: the holder's cores


def test_the_holders_cores_keep_its_threads_own_affinity_until_unpinned() -> None:
    scope, _, (holder,) = scope_of(1)
    pinner = FakePinner(Events())
    pinner.initial = (1,)
    cores = HolderCores(scope, pinner, SLICE)
    tid = min(holder.pids)
    cores.pin(holder, tid)
    assert cores.thread_cpus == (1,) and pinner.affinity[tid] == (1, 3)
    assert pinner.cpus[holder.id] == SLICE.cores
    cores.unpin(holder, tid)
    assert cores.thread_cpus is None and pinner.affinity[tid] == (1,)
    assert pinner.cpus[holder.id] == SLICE.tenant_cores
    cores.adopt((2,))  # a region adopted after a restart: its thread had core 2
    cores.unpin(holder, tid)
    assert pinner.affinity[tid] == (2,)


# -------------------------------------------------- steps 4 and 7: the freezer


def test_the_freezer_thaws_what_it_froze_and_holds_no_pools_when_off() -> None:
    scope, control, (a, b) = scope_of(2)
    freezer = Freezer(scope, None)
    frozen: list[Tenant] = []

    async def scenario() -> None:
        assert not freezer.begin_pools()
        await freezer.wait_pools(False)
        await freezer.freeze([a, b], frozen)
        assert frozen == [a, b] and a.state == b.state == states.FROZEN
        await freezer.thaw(frozen)

    run(scenario())
    assert not control.frozen and a.state == b.state == states.RUNNING
    freezer.thaw_pools()  # nothing held: nothing to release


def test_a_stuck_sibling_fails_the_freeze_and_stays_listed_for_the_thaw() -> None:
    scope, control, (a, b) = scope_of(2, freeze_timeout_s=0.05)
    control.stuck.add(b.id)
    freezer = Freezer(scope, None)
    frozen: list[Tenant] = []
    with pytest.raises(KrexError) as timeout:
        run(freezer.freeze([a, b], frozen))
    assert timeout.value.code is Code.FREEZE_TIMEOUT and frozen == [a, b]
    run(freezer.thaw(frozen))
    assert not control.frozen


# ------------------------------------------------ records: timings, ended epochs


def test_the_grant_reports_the_timings_its_region_record_holds() -> None:
    r = rig(2)
    holder, _ = r.tenants

    async def scenario() -> None:
        grant = await r.enter(holder)
        region = r.coord.gated.region
        assert region is not None
        assert grant["wait_ms"] == pytest.approx(region.wait_ms)
        assert grant["entry_ms"] == pytest.approx(region.wait_ms + region.establish_ms)
        assert (grant["drain_ms"], grant["freeze_ms"]) == (region.drain_ms, region.freeze_ms)
        out = await r.exit(holder, grant)
        assert region.thawed_at is not None and out["thaw_ms"] >= 0.0

    run(scenario())


def test_ended_epochs_answer_a_resent_exit_until_the_tenant_ends() -> None:
    ended = EndedEpochs()
    ended.resume({1: 4})
    ended.exited(2, 9)
    assert ended.answered(1, 4) and ended.answered(2, 9) and not ended.answered(2, 4)
    ended.exited(1, 5)  # a later exit wins in what is saved
    assert ended.saved() == {1: 5, 2: 9}
    ended.forget(1)
    assert not ended.answered(1, 4) and ended.saved() == {2: 9}
