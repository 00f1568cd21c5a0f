"""The fail-closed check of a sibling frozen during the drain runs while the others drain.

In-memory fakes (``tests/fakes.py``), no root: the drain runs in a worker
thread as the real one does, and holds (``HeldDrain``) with one sibling
pending until the test lets it go, so a check made "early" is one the test
saw while that drain was still running.  The guard (``FakeGuard``) logs
every check with what the freezer reported for each sibling at that moment.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from krexd.config import RegionConfig
from krexd.coordinator import Coordinator
from krexd.errors import Code, KrexError
from krexd.gate import GateTimeout, SlotInfo
from krexd.registrations import Suspect, Unprotected
from krexd.tenants import Tenant, TenantRegistry
from tests.fakes import Events, FakeGate, FakePinner, FakeTenantControl, make_tenant

from .test_protocol_fakes import SLICE, assert_idle, run

HOLD_S = 5.0  # the longest a HeldDrain waits for its release


class HeldDrain(FakeGate):
    """A drain that reports ``pending`` to ``settled`` (the others drained), then holds.

    It goes on when ``release`` is set (logging ``drain_held_out`` if
    :data:`HOLD_S` passed first), then returns as the real drain does once
    the last pending tenant drained (``settled`` is not called then: step 4
    freezes that tenant), or raises GateTimeout when ``fail`` is set.
    """

    def __init__(self, events: Events, pending: set[int]) -> None:
        super().__init__(events)
        self.pending = pending
        self.release = threading.Event()
        self.fail = False

    def drain(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> None:
        self.events.add("drain", holder, epoch)
        assert settled is not None
        settled(set(self.pending))
        if not self.release.wait(HOLD_S):
            self.events.add("drain_held_out")
        if self.fail:
            self.events.add("drain_failed")
            raise GateTimeout("not drained", [SlotInfo(9, "active", 0, 0, 0, 0, 0, 0, 0, 0)])
        self.events.add("drained")


class FakeGuard:
    """``GpuUseCheck``: the pids in ``unshimmed`` are never verified; ``on_gpu`` have it open.

    Each ``unverified`` call is logged as ``("unverified", ids, frozen)``,
    ``frozen`` being what the freezer reported for each sibling then.
    """

    def __init__(self, events: Events, control: FakeTenantControl) -> None:
        self.events = events
        self.control = control
        self.unshimmed: set[int] = set()
        self.on_gpu: set[int] = set()
        self.users_calls = 0

    def users(self) -> set[int] | None:
        self.users_calls += 1
        return set(self.on_gpu)

    def unverified(self, siblings: list[Tenant]) -> list[Suspect]:
        ids = tuple(t.id for t in siblings)
        self.events.add("unverified", ids, tuple(self.control.is_frozen(t) for t in siblings))
        return [
            (t, pid, None, [])  # type: ignore[misc]
            for t in siblings
            for pid in sorted(t.pids)
            if pid in self.unshimmed
        ]

    def unprotected_among(self, suspects: list[Suspect], epoch: int) -> list[Unprotected]:
        return [Unprotected(t, pid, "no shim") for t, pid, _, _ in suspects if pid in self.on_gpu]


class Rig:
    def __init__(
        self,
        n: int,
        pending: int,
        control: type[FakeTenantControl] = FakeTenantControl,
        **region: Any,
    ) -> None:
        self.events = Events()
        self.control = control(self.events)
        self.pinner = FakePinner(self.events)
        self.pinner.initial = SLICE.tenant_cores
        registry = TenantRegistry()
        self.tenants = [make_tenant(registry) for _ in range(n)]
        for t in self.tenants:
            registry.add(t)
        self.gate = HeldDrain(self.events, {self.tenants[pending].id})
        self.guard = FakeGuard(self.events, self.control)
        self.ended: list[tuple[int, int]] = []
        self.leave_after_s: float | None = 0.1  # an ended command leaves the GPU after this
        self.coord = Coordinator(
            0,
            self.gate,
            SLICE,
            registry,
            RegionConfig(**region),
            self.control,
            self.pinner,
            guard=self.guard,
            end_command=self._end,
        )

    def _end(self, tenant: Tenant, reason: str, code: int) -> None:
        self.ended.append((tenant.id, code))
        self.events.add("end", tenant.id, code)
        if self.leave_after_s is not None:
            asyncio.get_running_loop().call_later(self.leave_after_s, self._leave, tenant)

    def _leave(self, tenant: Tenant) -> None:
        self.guard.on_gpu -= tenant.pids
        self.events.add("left_gpu", tenant.id)

    def unshim(self, t: Tenant) -> None:
        """``t``'s process has the GPU open without the shim."""
        self.guard.unshimmed |= t.pids
        self.guard.on_gpu |= t.pids

    async def enter(self, t: Tenant) -> dict[str, Any]:
        pid = min(t.pids)
        return await self.coord.enter(t, pid, pid)

    def at(self, *event: Any) -> int:
        """The index of the first event starting with ``event`` (ValueError: none)."""
        return next(i for i, e in enumerate(self.events.log) if e[: len(event)] == event)

    async def until(self, *event: Any) -> None:
        deadline = time.monotonic() + 5
        while not any(e[: len(event)] == event for e in self.events.log):
            assert time.monotonic() < deadline, f"never seen: {event}: {self.events.log}"
            await asyncio.sleep(0.005)


def test_an_unprotected_sibling_is_ended_while_another_still_drains() -> None:
    r = Rig(3, pending=2)
    holder, bad, slow = r.tenants
    r.unshim(bad)
    r.events.on("end", r.gate.release.set)  # the drain goes on only once bad was ended

    async def scenario() -> None:
        grant = await r.enter(holder)
        names = r.events.names()
        assert "drain_held_out" not in names, "the check waited for the whole drain"
        # bad: frozen, confirmed frozen, checked, ended (79) -- all before the drain ended.
        assert r.at("freeze", bad.id) < r.at("unverified", (bad.id,))
        assert r.events.log[r.at("unverified", (bad.id,))][2] == (True,)
        assert r.at("unverified", (bad.id,)) < r.at("end", bad.id) < r.at("drained")
        assert r.ended == [(bad.id, 79)]
        # The grant waited until bad left the GPU (after the drain ended).
        assert r.at("drained") < r.at("left_gpu", bad.id) < r.at("set_cpus", holder.id)
        # slow (frozen in step 4) is checked after step 4, once; bad not again.
        checks = [e[1] for e in r.events.log if e[0] == "unverified"]
        assert checks == [(bad.id,), (slow.id,)]
        assert r.at("wait_frozen", slow.id) < r.at("unverified", (slow.id,))
        await r.coord.exit(holder, grant["epoch"], 0.0, 0)
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_an_early_check_waits_until_the_sibling_reports_frozen() -> None:
    r = Rig(3, pending=2)
    holder, early, slow = r.tenants
    r.unshim(early)

    async def scenario() -> None:
        r.control.stuck.add(early.id)  # its freeze is written, the kernel not done yet
        entry = asyncio.create_task(r.enter(holder))
        await r.until("freeze", early.id)
        await asyncio.sleep(0.1)
        assert "unverified" not in r.events.names(), "checked before it reported frozen"
        assert r.ended == []
        r.control.stuck.discard(early.id)
        await r.until("end", early.id)  # checked now, with the drain still held
        assert "drained" not in r.events.names()
        assert r.events.log[r.at("unverified", (early.id,))][2] == (True,)
        r.gate.release.set()
        grant = await entry
        await r.coord.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())


class LateReport(FakeTenantControl):
    """The kernel's report of ``late``'s freeze reaches only the event loop's thread.

    The early check polls from a worker thread: it never sees ``late``
    frozen, while step 4 (on the loop) does.
    """

    late: int = 0

    def is_frozen(self, tenant: Tenant) -> bool:
        if tenant.id == self.late and threading.current_thread() is not threading.main_thread():
            return False
        return super().is_frozen(tenant)


def test_a_sibling_not_reported_frozen_by_step_4s_end_is_checked_with_the_rest() -> None:
    r = Rig(3, pending=2, control=LateReport)
    holder, late, slow = r.tenants
    r.control.late = late.id  # type: ignore[attr-defined]
    r.unshim(late)

    async def scenario() -> None:
        entry = asyncio.create_task(r.enter(holder))
        await r.until("freeze", late.id)
        await asyncio.sleep(0.1)
        assert "unverified" not in r.events.names()
        r.gate.release.set()
        grant = await entry
        checks = [e[1:] for e in r.events.log if e[0] == "unverified"]
        assert checks == [((late.id, slow.id), (True, True))], checks
        assert r.at("drained") < r.at("wait_frozen", slow.id) < r.at("unverified")
        assert r.at("unverified") < r.at("end", late.id) < r.at("set_cpus", holder.id)
        await r.coord.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())


def test_a_failed_drain_cancels_the_early_check_and_thaws() -> None:
    r = Rig(3, pending=2)
    holder, bad, slow = r.tenants
    r.unshim(bad)
    r.leave_after_s = None  # ended, it never leaves the GPU: its check waits on
    r.gate.fail = True
    r.events.on("end", r.gate.release.set)

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(holder)
        assert err.value.code == Code.DRAIN_TIMEOUT
        assert "not drained" in err.value.message
        calls = r.guard.users_calls
        await asyncio.sleep(0.1)
        assert r.guard.users_calls == calls, "the early check kept polling after the failure"
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_an_early_check_that_times_out_fails_the_entry() -> None:
    r = Rig(3, pending=2, drain_timeout_s=0.2)
    holder, bad, slow = r.tenants
    r.unshim(bad)
    r.leave_after_s = None
    r.events.on("end", r.gate.release.set)

    async def scenario() -> None:
        with pytest.raises(KrexError) as err:
            await r.enter(holder)
        assert err.value.code == Code.DRAIN_TIMEOUT
        assert "unprotected processes" in err.value.message
        assert [e[1] for e in r.events.log if e[0] == "unverified"] == [(bad.id,)]
        assert_idle(r)  # type: ignore[arg-type]

    run(scenario())


def test_with_early_check_off_every_sibling_is_checked_after_step_4() -> None:
    r = Rig(3, pending=2, early_check=False)
    holder, bad, slow = r.tenants
    r.unshim(bad)
    r.gate.release.set()

    async def scenario() -> None:
        grant = await r.enter(holder)
        checks = [e[1:] for e in r.events.log if e[0] == "unverified"]
        assert checks == [((bad.id, slow.id), (True, True))], checks
        assert r.at("drained") < r.at("unverified") < r.at("end", bad.id)
        await r.coord.exit(holder, grant["epoch"], 0.0, 0)

    run(scenario())
