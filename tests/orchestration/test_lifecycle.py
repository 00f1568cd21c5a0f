"""``Lifecycle`` over fakes: admit, place, end and their failures, with no root and no krexd.

The coordinator is the real one (over ``tests/support/fakes.py``); cgroups,
memory needs and records are ``tests/support/tenancy_fakes.py``.  Launchers
are real processes where ``Lifecycle`` watches them (a pidfd), so "the
launcher died" is a real death.  The same paths run inside a real krexd in
tests/daemon/test_daemon.py and tests/restarts/.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from krexd.cgroups import CgroupError
from krexd.orchestration import lifecycle as lifecycle_mod
from krexd.system import procfs
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.identity import Caller
from krexd.tenancy.tenants import Tenant
from tests.support.fakes import until
from tests.support.tenancy_fakes import LifecycleRig, lifecycle_rig

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


@pytest.fixture
def launcher() -> Iterator[subprocess.Popen[bytes]]:
    """A live process standing in for ``krex run`` (the launcher ``Lifecycle`` watches)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def caller(pid: int) -> Caller:
    return Caller(pid, os.getuid(), os.getgid(), procfs.start_time(pid) or 0)


def me() -> Caller:
    return caller(os.getpid())


async def admit(r: LifecycleRig, who: Caller, gpu: int | None = None, **kw: Any) -> Tenant:
    return await r.lifecycle.admit(["cmd"], gpu, False, who, **kw)


def used(r: LifecycleRig) -> list[int]:
    return [s.used for s in r.slots]


# ------------------------------------------------------------------ admit


def test_admit_creates_the_tenant_on_the_granted_gpu_and_the_next_one_parks() -> None:
    r = lifecycle_rig(ngpus=2)

    async def scenario() -> None:
        a, b = await admit(r, me()), await admit(r, me())
        assert (a.gpu, b.gpu) == (0, 1) and used(r) == [1, 1]
        assert r.registry.get(a.id) is a and a.state == states.ADMITTED
        assert [e for e in r.events.log if e[0] == "cgroup_create"] == [
            ("cgroup_create", 0, a.id),
            ("cgroup_create", 1, b.id),
        ]
        third = asyncio.ensure_future(admit(r, me()))
        await asyncio.sleep(0.05)
        assert not third.done(), "a third command must park: both GPUs' slots are held"
        await r.lifecycle.end(b, "released")
        c = await third
        assert c.gpu == 1 and used(r) == [1, 1]

    run(scenario())


def test_a_cgroup_that_cannot_be_made_gives_its_slot_back() -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        r.cgroups.fail_next = "cgroup.subtree_control: EBUSY"
        with pytest.raises(CgroupError):
            await admit(r, me())
        assert used(r) == [0] and len(r.registry) == 0
        t = await admit(r, me())  # the slot was not leaked
        assert t.gpu == 0 and used(r) == [1]

    run(scenario())


def test_a_command_admitted_during_a_region_starts_frozen() -> None:
    r = lifecycle_rig(slots_per_gpu=2)

    async def scenario() -> None:
        holder = await admit(r, me())
        holder.pids.add(os.getpid())
        states.change_state(holder, states.RUNNING)
        grant = await r.coordinator().enter(holder, os.getpid(), os.getpid())
        sibling = await admit(r, me())
        assert sibling.id in r.control.frozen, "a sibling admitted mid-region must be frozen"
        await r.coordinator().exit(holder, grant["epoch"], 0.0, 0)
        assert sibling.id not in r.control.frozen

    run(scenario())


def test_a_launcher_that_dies_while_parked_withdraws_its_request(
    launcher: subprocess.Popen[bytes],
) -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        await admit(r, me())
        parked = asyncio.ensure_future(admit(r, caller(launcher.pid)))
        await until(lambda: len(r.admission.parked) == 1, "the second admit parked")
        launcher.kill()
        with pytest.raises(KrexError) as exc:
            await parked
        assert exc.value.code == Code.CANCELLED
        assert len(r.admission.parked) == 0 and used(r) == [1]

    run(scenario())


# ------------------------------------------------------------------ end


def test_end_runs_once_for_concurrent_callers() -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        t = await admit(r, me())
        await asyncio.gather(*(r.lifecycle.end(t, f"caller {i}") for i in range(3)))
        names = r.events.names()
        assert names.count("cgroup_kill") == 1 and names.count("cgroup_remove") == 1
        assert names.count("memory_record") == 1
        assert used(r) == [0], "the slot must be freed exactly once"
        assert t.state == states.EXITED and len(r.registry) == 0
        await r.lifecycle.end(t, "late")  # an ended tenant: nothing more happens
        assert r.events.names().count("cgroup_kill") == 1 and used(r) == [0]

    run(scenario())


def test_ending_the_holder_ends_its_region_and_thaws_its_siblings() -> None:
    r = lifecycle_rig(slots_per_gpu=3)

    async def scenario() -> None:
        holder, s1, s2 = [await admit(r, me()) for _ in range(3)]
        for t in (holder, s1, s2):
            t.pids.add(os.getpid() if t is holder else 1_000_000 + t.id)
            states.change_state(t, states.RUNNING)
        await r.coordinator().enter(holder, os.getpid(), os.getpid())
        assert r.control.frozen == {s1.id, s2.id} and r.gates[0].word is not None
        await r.lifecycle.end(holder, "launcher died")
        assert r.coordinator().state == states.IDLE
        assert not r.control.frozen and r.gates[0].word is None, "the region outlived its holder"
        assert used(r) == [2]

    run(scenario())


def test_a_failing_recovery_or_record_still_kills_and_frees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = lifecycle_rig()

    async def broken(tenant: Tenant) -> None:
        raise RuntimeError("recovery failed")

    async def scenario() -> None:
        t = await admit(r, me())
        monkeypatch.setattr(r.coordinator(), "tenant_gone", broken)
        r.records.raises = True
        await r.lifecycle.end(t, "released")
        cg = r.cgroups.made[t.id]
        assert cg.killed == 1 and cg.removed
        assert t.state == states.EXITED and used(r) == [0]

    run(scenario())


def test_a_tree_that_will_not_die_keeps_no_slot_and_closes_its_files() -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        t = await admit(r, me())
        cg = r.cgroups.made[t.id]
        cg.members.append(1_000_000)
        cg.stay_populated = True
        await r.lifecycle.end(t, "released")
        assert not cg.removed and cg.closed, "an unremovable cgroup still closes its files"
        assert used(r) == [0] and t.state == states.EXITED

    run(scenario())


def test_a_launcher_that_dies_ends_its_tenant(launcher: subprocess.Popen[bytes]) -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        t = await admit(r, caller(launcher.pid))
        launcher.kill()
        await until(lambda: t.state == states.EXITED, "the tenant ended")
        assert r.cgroups.made[t.id].removed and used(r) == [0]

    run(scenario())


# ------------------------------------------------------------------ place and its timeout


def test_an_unplaced_tenant_is_ended_after_the_place_timeout() -> None:
    r = lifecycle_rig(place_timeout_s=0.05)

    async def scenario() -> None:
        t = await admit(r, me())
        await until(lambda: t.state == states.EXITED, "the squatter ended")
        assert t.kill_reason is not None and "place_timeout_s" in t.kill_reason
        assert r.coordinator().stats.as_dict()["commands_ended"]["place_timeout"] == 1
        assert used(r) == [0]

    run(scenario())


def test_place_takes_the_launchers_child_and_disarms_the_timeout() -> None:
    r = lifecycle_rig(place_timeout_s=30.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:

        async def scenario() -> None:
            t = await admit(r, me())
            timer = r.lifecycle._place_timers[t.id]  # armed by admit
            assert not timer.cancelled()
            r.lifecycle.place(t, child.pid)
            assert t.state == states.RUNNING and r.cgroups.made[t.id].members == [child.pid]
            assert timer.cancelled(), "the first place must cancel the place timeout"

        run(scenario())
    finally:
        child.kill()
        child.wait()


def test_place_refuses_what_is_not_the_launchers_child_and_an_ended_tenant(
    launcher: subprocess.Popen[bytes],
) -> None:
    r = lifecycle_rig()

    async def scenario() -> None:
        t = await admit(r, caller(launcher.pid))
        for pid in (os.getpid(), launcher.pid):  # not its child; the launcher itself
            with pytest.raises(KrexError) as exc:
                r.lifecycle.place(t, pid)
            assert exc.value.code == Code.AUTH
        assert r.cgroups.made[t.id].members == [] and t.state == states.ADMITTED
        await r.lifecycle.end(t, "released")
        with pytest.raises(KrexError) as exc:
            r.lifecycle.place(t, os.getpid())
        assert exc.value.code == Code.BAD_FIELD

    run(scenario())


def test_kill_command_kills_now_and_ends_an_unreleased_tenant_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle_mod, "KILL_GRACE_S", 0.3)
    r = lifecycle_rig()

    async def scenario() -> None:
        t = await admit(r, me())
        r.lifecycle.kill_command(t, "unprotected GPU use", 81, cause="unprotected")
        assert r.cgroups.made[t.id].killed == 1 and t.kill_code == 81
        for _ in range(20):  # the loop runs what is ready; the grace is not over
            await asyncio.sleep(0)
        assert t.state != states.EXITED, "the tenant waits for its launcher's release"
        r.lifecycle.kill_command(t, "again", 82)  # a second verdict changes nothing
        assert t.kill_code == 81 and r.cgroups.made[t.id].killed == 1
        await until(lambda: t.state == states.EXITED, "ended after the grace")
        assert used(r) == [0]

    run(scenario())
