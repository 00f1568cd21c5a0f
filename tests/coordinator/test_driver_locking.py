"""Region entry's driver lock over in-memory fakes: who is locked, when, and every unlock.

The driver's lock (``krexd.hardware.driverlock``) is the authority of step 3: after
the siblings are drained and frozen, every process on the GPU but the
holder's is locked; each end path unlocks.  These tests drive the
coordinator with ``tests/support/fakes.py`` (no root, no driver) and check the
order and the outcomes: offenders ended, foreign processes by policy, the
ledger written before any lock and cleared after the unlock.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from krexd.config.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.hardware.driverlock import Outcome
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.coordinator.test_protocol_fakes import SLICE, assert_idle, run
from tests.support.fakes import (
    Events,
    FakeGate,
    FakeGuard,
    FakeLedger,
    FakePinner,
    FakeProcessLock,
    FakeTenantControl,
    make_tenant,
)

FOREIGN = 4_000_001  # a process outside krex on the GPU


class LockRig:
    def __init__(self, n: int, users_extra: set[int] | None = None, **region: Any) -> None:
        self.events = Events()
        self.control = FakeTenantControl(self.events)
        self.gate = FakeGate(self.events)
        self.plock = FakeProcessLock(self.events)
        self.ledger = FakeLedger(self.events)
        self.registry = TenantRegistry()
        self.tenants = [make_tenant(self.registry) for _ in range(n)]
        for t in self.tenants:
            self.registry.add(t)
        users = {p for t in self.tenants for p in t.pids} | (users_extra or set())
        self.guard = FakeGuard(users)
        self.plock.frozen = lambda pid: any(
            pid in t.pids and t.id in self.control.frozen for t in self.tenants
        )
        pinner = self.pinner = FakePinner(self.events)
        pinner.initial = SLICE.tenant_cores
        self.coord = Coordinator(
            0,
            self.gate,
            SLICE,
            self.registry,
            RegionConfig(**region),
            self.control,
            pinner,
            guard=self.guard,
            proc_lock=self.plock,
            ledger=self.ledger,
        )

    async def enter(self, t: Tenant) -> dict[str, Any]:
        pid = min(t.pids)
        return await self.coord.enter(t, pid, pid)

    async def exit(self, t: Tenant, grant: dict[str, Any]) -> dict[str, Any]:
        return await self.coord.exit(t, grant["epoch"], 0.0, 0)


def _pid(t: Tenant) -> int:
    return min(t.pids)


def test_every_other_process_is_locked_before_its_freeze_and_unlocked_after_the_thaw() -> None:
    r = LockRig(3, users_extra={FOREIGN})
    a, b, c = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        log = r.events.log
        # Each process is locked before its tenant's freeze (a lock waits for calls
        # in progress: a process frozen inside one could never be locked), the
        # ledger recorded before each lock, all before the grant's pinning.
        for t in (b, c):
            assert log.index(("lock", _pid(t))) < log.index(("freeze", t.id))
        assert log.index(("lock", FOREIGN)) < r.events.names().index("pin_thread")
        first_ledger = r.events.names().index("ledger")
        assert first_ledger < r.events.names().index("lock")
        assert r.plock.locked == {_pid(b), _pid(c), FOREIGN}
        assert _pid(a) not in {e[1] for e in r.events.log if e[0] == "lock"}
        assert grant["driver_lock"]["locked"] == 3
        assert grant["driver_lock"]["foreign"] == [FOREIGN]
        assert r.ledger.entries and {p for p, _ in r.ledger.entries} == r.plock.locked
        await r.exit(a, grant)
        names = r.events.names()
        # Unlocked after the thaw, before the gate reopens; the ledger cleared.
        assert max(i for i, n in enumerate(names) if n == "thaw") < names.index("unlock")
        assert names.index("unlock") < names.index("reopen")
        assert not r.plock.locked and not r.ledger.entries
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_a_sibling_whose_work_does_not_complete_is_ended_and_the_entry_goes_on() -> None:
    r = LockRig(3)
    a, b, c = r.tenants
    r.plock.outcomes[_pid(b)] = Outcome.TIMEOUT

    async def scenario() -> None:
        grant = await r.enter(a)
        assert ("kill", b.id) in r.events.log and ("kill", c.id) not in r.events.log
        assert "did not complete within drain_timeout_s" in (b.kill_reason or "")
        assert grant["driver_lock"]["offenders_ended"] == [b.id]
        assert r.plock.locked == {_pid(c)}
        await r.exit(a, grant)
        assert not r.plock.locked

    # b's process leaves the GPU once its command is ended.
    r.guard.leave = lambda: {_pid(t) for t in r.tenants if t.id in r.control.killed}
    run(scenario())


def test_a_sibling_frozen_after_its_failed_lock_is_judged_not_locked_again() -> None:
    # The drain locks each sibling as it drains, then freezes it whatever the lock
    # came to.  A forger (its shim says "drained" over queued work) whose lock
    # timed out is frozen unlocked: locking it again would never return (the
    # driver's rule for a frozen process) and hold every entry on the GPU.
    r = LockRig(3)
    a, b, c = r.tenants
    r.plock.outcomes[_pid(b)] = Outcome.TIMEOUT
    r.gate.drain_steps = [{c.id}, set()]  # b drains (a forged word) first, then c
    r.guard.leave = lambda: {_pid(t) for t in r.tenants if t.id in r.control.killed}

    async def scenario() -> None:
        grant = await r.enter(a)
        log = r.events.log
        assert ("lock", _pid(b)) in log and log.index(("lock", _pid(b))) < log.index(
            ("freeze", b.id)
        ), "locked as it drained, before its freeze"
        assert "lock_frozen" not in r.events.names()
        assert [e for e in log if e == ("lock", _pid(b))] == [("lock", _pid(b))]
        assert grant["driver_lock"]["offenders_ended"] == [b.id]
        await r.exit(a, grant)
        assert not r.plock.locked
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_a_sibling_that_reached_the_gpu_during_the_drain_is_locked_thawed() -> None:
    # The drain's locks use one list of the GPU's users, read at the first sibling
    # that drained.  b creates its context after that read (a command just
    # started), drains, and is frozen with nothing locked; the lock after the
    # drain must thaw it for its lock (the driver never returns from the lock of
    # a frozen process).
    r = LockRig(3)
    a, b, c = r.tenants
    r.guard.users_now = {_pid(a), _pid(c)}
    r.gate.drain_steps = [{b.id}, set()]  # c drains first, then b
    freeze = r.control.freeze

    def freeze_then_b_starts(t: Tenant) -> None:
        freeze(t)
        if t.id == c.id:
            r.guard.users_now = {_pid(a), _pid(b), _pid(c)}

    r.control.freeze = freeze_then_b_starts  # type: ignore[method-assign]

    async def scenario() -> None:
        grant = await r.enter(a)
        log = r.events.log
        assert "lock_frozen" not in r.events.names()
        i_lock = log.index(("lock", _pid(b)))
        assert ("thaw", b.id) in log[:i_lock] and ("freeze", b.id) in log[i_lock:]
        assert r.plock.locked == {_pid(b), _pid(c)} and b.state == states.FROZEN
        await r.exit(a, grant)
        assert not r.plock.locked
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_a_process_started_while_its_tenant_was_thawed_for_a_lock_is_locked_too() -> None:
    # Thawed for the lock of its straggler, b starts yet another process with a
    # context; the list is read again after each thaw, so that one is locked too
    # (with b thawed once more), and b ends frozen.
    r = LockRig(2)
    a, b = r.tenants
    late, later = 4_200_000, 4_200_001
    real_wait, real_thaw = r.control.wait_frozen, r.control.thaw
    thaws = 0

    async def wait_frozen(t: Tenant, timeout_s: float) -> bool:
        ok = await real_wait(t, timeout_s)
        if t.id == b.id and late not in b.pids:
            b.pids.add(late)  # after b froze: locked with b thawed
            r.guard.users_now = (r.guard.users_now or set()) | {late}
        return ok

    def thaw(t: Tenant) -> None:
        nonlocal thaws
        real_thaw(t)
        if t.id == b.id and region_entering():
            thaws += 1
            if thaws == 1:
                b.pids.add(later)  # started during the thaw for late's lock
                r.guard.users_now = (r.guard.users_now or set()) | {later}

    def region_entering() -> bool:
        return r.coord.gated.entering is not None

    r.control.wait_frozen = wait_frozen  # type: ignore[method-assign]
    r.control.thaw = thaw  # type: ignore[method-assign]

    async def scenario() -> None:
        grant = await r.enter(a)
        log = r.events.log
        assert {late, later} <= r.plock.locked
        i_later = log.index(("lock", later))
        assert log[:i_later].count(("thaw", b.id)) == 2, "thawed again for the second lock"
        assert ("freeze", b.id) in log[i_later:] and b.state == states.FROZEN
        await r.exit(a, grant)
        assert not r.plock.locked

    run(scenario())


def test_the_coverage_witness_counts_what_the_region_locked() -> None:
    # On a real GPU the witness names the processes on the GPU at exit that the
    # region had not locked.  The exit unlocks before the witness runs: a foreign
    # process locked for the whole region must not be named (it was, before the
    # region's end kept its list of what it unlocked).
    r = LockRig(2, users_extra={FOREIGN})
    a, _ = r.tenants

    async def scenario() -> None:
        grant = await r.enter(a)
        assert FOREIGN in r.plock.locked
        out = await r.exit(a, grant)
        assert out["witness"]["source"] == "driver lock coverage"
        assert out["witness"]["others"] == []

    run(scenario())


def test_a_lock_returning_after_the_region_ended_is_undone() -> None:
    # The drain's thread is inside a lock call when the entry is undone (a cancel):
    # what that call locks afterwards is unlocked at once, never left locked.
    r = LockRig(2)
    a, b = r.tenants
    r.gate.drain_steps = [set()]

    async def scenario() -> None:
        grant = await r.enter(a)
        region = r.coord.gated.region
        assert region is not None and region.locks is not None
        await r.exit(a, grant)
        assert region.locks.closed and not r.plock.locked
        # A call of the drain's thread that returns only now:
        failed = await asyncio.to_thread(r.coord.steps.locks.lock_pids, {_pid(b)}, region.locks)
        assert failed == [] and _pid(b) not in r.plock.locked
        assert r.events.log[-1] == ("unlock", _pid(b))

    run(scenario())


def test_a_lock_that_does_not_return_ends_its_tenant() -> None:
    # A process that cannot run (stopped by a signal, say) is not locked in time,
    # whatever the driver's own timeout: DriverLock reports it STUCK; its tenant
    # pays as for a timeout, and the entry goes on.
    r = LockRig(2)
    a, b = r.tenants
    r.plock.outcomes[_pid(b)] = Outcome.STUCK
    r.guard.leave = lambda: {_pid(t) for t in r.tenants if t.id in r.control.killed}

    async def scenario() -> None:
        grant = await r.enter(a)
        assert ("kill", b.id) in r.events.log
        assert grant["driver_lock"]["offenders_ended"] == [b.id]
        await r.exit(a, grant)

    run(scenario())


def test_a_foreign_process_that_cannot_be_locked_undoes_the_entry_and_unlocks() -> None:
    r = LockRig(2, users_extra={FOREIGN})
    a, b = r.tenants
    r.plock.outcomes[FOREIGN] = Outcome.TIMEOUT

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(a)
        assert err.value.code == Code.DRAIN_TIMEOUT
        assert f"pid {FOREIGN}" in err.value.message
        assert not r.plock.locked  # b's lock undone
        assert ("unlock", _pid(b)) in r.events.log
        assert not r.control.killed
        assert b.state == states.RUNNING
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


@pytest.mark.parametrize("policy", ["refuse", "allow"])
def test_foreign_policy(policy: str) -> None:
    r = LockRig(2, users_extra={FOREIGN}, foreign=policy)
    a, b = r.tenants

    async def scenario() -> None:
        if policy == "refuse":
            with pytest.raises(KrexError) as err:
                await r.enter(a)
            assert err.value.code == Code.FOREIGN_GPU_USER
            assert f"pid {FOREIGN}" in err.value.message
            assert not r.plock.locked
            assert_idle(r)  # type: ignore[arg-type]
            return
        grant = await r.enter(a)
        assert r.plock.locked == {_pid(b)}  # allowed: flagged, not locked
        assert grant["driver_lock"]["foreign"] == [FOREIGN]
        await r.exit(a, grant)

    run(scenario())


def test_recovery_unlocks_when_the_holder_dies() -> None:
    r = LockRig(2)
    a, b = r.tenants

    async def scenario() -> None:
        await r.enter(a)
        assert r.plock.locked == {_pid(b)}
        await r.coord.tenant_gone(a)
        assert not r.plock.locked and not r.ledger.entries
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_a_restart_keeps_the_adopted_regions_locks_or_unlocks_them() -> None:
    r = LockRig(2)
    a, b = r.tenants
    r.ledger.entries = [(_pid(b), 1)]
    r.coord.settle_locks()  # no adopted region: a stale lock is undone at start
    assert ("unlock", _pid(b)) in r.events.log and not r.ledger.entries


def test_an_mps_client_the_driver_cannot_lock_is_recorded_not_punished() -> None:
    r = LockRig(2)
    a, b = r.tenants
    r.plock.outcomes[_pid(b)] = Outcome.UNSUPPORTED

    async def scenario() -> None:
        grant = await r.enter(a)
        assert grant["driver_lock"]["unsupported"] == [_pid(b)]
        assert not r.control.killed and not r.plock.locked
        await r.exit(a, grant)
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_a_process_that_reached_the_gpu_after_the_freeze_is_locked_thawed_then_refrozen() -> None:
    # The driver cannot lock a frozen process (measured: the call does not return),
    # so a straggler of a frozen tenant is locked with its tenant thawed.
    r = LockRig(2)
    a, b = r.tenants
    late = 4_100_000
    real_wait = r.control.wait_frozen

    async def wait_frozen(t: Tenant, timeout_s: float) -> bool:
        ok = await real_wait(t, timeout_s)
        if t.id == b.id and late not in b.pids:
            b.pids.add(late)  # a new process of b with a context, after b froze
            r.guard.users_now = (r.guard.users_now or set()) | {late}
        return ok

    r.control.wait_frozen = wait_frozen  # type: ignore[method-assign]

    async def scenario() -> None:
        grant = await r.enter(a)
        log = r.events.log
        i_lock = log.index(("lock", late))
        assert ("thaw", b.id) in log[:i_lock], "thawed before its straggler's lock"
        assert ("freeze", b.id) in log[i_lock:], "frozen again after it"
        assert late in r.plock.locked and b.state == states.FROZEN
        await r.exit(a, grant)
        assert not r.plock.locked

    run(scenario())


def test_outcomes_of_the_driver_codes_measured() -> None:
    from krexd.hardware.driverlock import _lock_outcome

    me = os.getpid()
    assert _lock_outcome(0, me) is Outcome.LOCKED
    assert _lock_outcome(600, me) is Outcome.TIMEOUT  # NOT_READY: what 580 returns
    assert _lock_outcome(801, me) is Outcome.UNSUPPORTED  # an MPS client
    assert _lock_outcome(3, me) is Outcome.NOT_CUDA  # a live process without CUDA
    assert _lock_outcome(304, 2**22 + 12345) is Outcome.NOT_CUDA  # no such pid
    assert _lock_outcome(304, me) is Outcome.NOT_CUDA  # gone by the time it is judged
    assert _lock_outcome(999, me) is Outcome.ERROR
