"""A late recovery never thaws or reopens a newer region (forced race).

The coordinator is driven in-process so the race can be forced in the
dangerous order: region A ends, region B begins, and only then does A's
recovery run (as it would when A's pidfd wakeup is delayed).  Real cgroups,
real processes, the real gate when libkrex_gate.so is built.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from typing import Any

import pytest

from krexd import gpus, paths, states
from krexd.cgroups import CgroupBackend
from krexd.config import CgroupConfig, CpuConfig, RegionConfig
from krexd.coordinator import Coordinator
from krexd.slices import compute_slices
from krexd.tenants import Tenant, TenantRegistry

pytestmark = [pytest.mark.root]


def _gate(tmp: str) -> Any:
    if paths.gate_library() is None:
        return None
    from krexd.gate import Gate

    return Gate.create(os.path.join(tmp, "gpu0.gate"), 0)


def test_late_recovery_is_a_no_op_for_a_newer_region(tmp_path: Any) -> None:
    backend = CgroupBackend.open(CgroupConfig(name=f"krexrace{os.getpid()}"))
    fake = gpus.discover(1)
    slices = compute_slices(fake, CpuConfig(allow_shared=True))
    backend.prepare(slices)
    registry = TenantRegistry()
    procs = []
    tenants: list[Tenant] = []
    gate = _gate(str(tmp_path))
    try:
        for _ in range(3):
            tid = registry.new_id()
            cg = backend.create_tenant(0, tid)
            proc = subprocess.Popen(["sleep", "60"])
            cg.add_pid(proc.pid)
            procs.append(proc)
            t = Tenant(tid, registry.new_token(), 0, ["sleep"], os.getpid(), cg)
            t.pids.add(proc.pid)
            states.change_state(t, states.RUNNING)
            registry.add(t)
            tenants.append(t)
        a, b, s = tenants
        coord = Coordinator(0, gate, slices[0], registry, RegionConfig())

        async def scenario() -> None:
            grant_a = await coord.enter(a, procs[0].pid, procs[0].pid)
            region_a = coord._region
            assert b.cgroup.is_frozen() and s.cgroup.is_frozen()
            await coord.exit(a, grant_a["epoch"], 0.0, 0)
            assert not s.cgroup.is_frozen()
            grant_b = await coord.enter(b, procs[1].pid, procs[1].pid)
            assert grant_b["epoch"] != grant_a["epoch"]
            # A's recovery arrives late, after B's region began.
            assert region_a is not None
            assert await coord._end(region_a, "late recovery of A") is None
            assert a.cgroup.is_frozen() and s.cgroup.is_frozen(), (
                "late recovery thawed B's siblings"
            )
            if gate is not None:
                assert gate.word == (b.id, grant_b["epoch"]), "late recovery reopened the gate"
            st = coord.status()
            assert st["holder"]["tenant"] == b.id and st["regions"]["recovered"] == 0
            await coord.exit(b, grant_b["epoch"], 0.0, 0)
            assert not a.cgroup.is_frozen() and not s.cgroup.is_frozen()
            if gate is not None:
                assert gate.word is None

        asyncio.run(scenario())
    finally:
        for p in procs:
            p.kill()
            p.wait()
        asyncio.run(backend.teardown())
        if gate is not None:
            gate.unlink()


def test_tenant_admitted_while_a_region_is_being_established_is_frozen(tmp_path: Any) -> None:
    """Forced race: a command admitted while siblings are being frozen is frozen too."""
    backend = CgroupBackend.open(CgroupConfig(name=f"krexlate{os.getpid()}"))
    fake = gpus.discover(1)
    slices = compute_slices(fake, CpuConfig(allow_shared=True))
    backend.prepare(slices)
    registry = TenantRegistry()
    procs = []
    tenants: list[Tenant] = []
    try:
        for _ in range(3):
            tid = registry.new_id()
            cg = backend.create_tenant(0, tid)
            proc = subprocess.Popen(["sleep", "60"])
            cg.add_pid(proc.pid)
            procs.append(proc)
            t = Tenant(tid, registry.new_token(), 0, ["sleep"], os.getpid(), cg)
            t.pids.add(proc.pid)
            states.change_state(t, states.RUNNING)
            tenants.append(t)
        holder, sibling, late = tenants
        registry.add(holder)
        registry.add(sibling)  # ``late`` is admitted during the entry, below
        coord = Coordinator(0, None, slices[0], registry, RegionConfig())
        real_wait = coord._wait_frozen

        async def slow_wait_frozen(sib: Tenant, timeout_s: float) -> bool:
            await asyncio.sleep(0.3)  # the window a slow freeze leaves open
            return await real_wait(sib, timeout_s)

        coord._wait_frozen = slow_wait_frozen  # type: ignore[method-assign]

        async def scenario() -> None:
            entering = asyncio.ensure_future(coord.enter(holder, procs[0].pid, procs[0].pid))
            await asyncio.sleep(0.1)
            assert coord.status()["holder"] is None  # still establishing
            registry.add(late)  # what the daemon's admission does, then:
            await coord.tenant_added(late)
            grant = await entering
            assert late.cgroup.is_frozen(), "a tenant admitted during entry ran in the region"
            assert sorted(coord.status()["holder"]["siblings_frozen"]) == [sibling.id, late.id]
            await coord.exit(holder, grant["epoch"], 0.0, 0)
            assert not late.cgroup.is_frozen() and not sibling.cgroup.is_frozen()

        asyncio.run(scenario())
    finally:
        for p in procs:
            p.kill()
            p.wait()
        asyncio.run(backend.teardown())
