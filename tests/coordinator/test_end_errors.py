"""A sibling that cannot be thawed does not wedge its GPU.

The coordinator is driven in-process with real cgroups and processes; one
sibling's thaw is made to fail.  The region must still end: the other
siblings thawed, the gate reopened, the lock free for the next region.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from typing import Any

import pytest

from krexd import gpus, paths, states
from krexd.cgroups import CgroupBackend, CgroupError
from krexd.config import CgroupConfig, CpuConfig, RegionConfig
from krexd.coordinator import Coordinator
from krexd.slices import compute_slices
from krexd.tenants import Tenant, TenantRegistry

pytestmark = [pytest.mark.root]


def test_failed_thaw_of_one_sibling_still_ends_the_region(tmp_path: Any) -> None:
    backend = CgroupBackend.open(CgroupConfig(name=f"krexthaw{os.getpid()}"))
    slices = compute_slices(gpus.discover(1), CpuConfig(allow_shared=True))
    backend.prepare(slices)
    registry = TenantRegistry()
    procs: list[subprocess.Popen[bytes]] = []
    tenants: list[Tenant] = []
    gate = None
    if paths.gate_library() is not None:
        from krexd.gate import Gate

        gate = Gate.create(os.path.join(str(tmp_path), "gpu0.gate"), 0)
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
        holder, stuck, other = tenants
        coord = Coordinator(0, gate, slices[0], registry, RegionConfig())

        def refuse() -> None:
            raise CgroupError(errno.EIO, "thaw refused")

        async def scenario() -> None:
            grant = await coord.enter(holder, procs[0].pid, procs[0].pid)
            assert stuck.cgroup.is_frozen() and other.cgroup.is_frozen()
            real_thaw = stuck.cgroup.thaw
            stuck.cgroup.thaw = refuse  # type: ignore[method-assign]
            try:
                await coord.exit(holder, grant["epoch"], 0.0, 0)
            finally:
                stuck.cgroup.thaw = real_thaw  # type: ignore[method-assign]
            assert not other.cgroup.is_frozen()
            assert coord.state == states.IDLE and coord.status()["holder"] is None
            if gate is not None:
                assert gate.word is None, "gate left closed"
            # The lock is free: the next region is granted and ends normally.
            stuck.cgroup.thaw()
            grant = await asyncio.wait_for(coord.enter(other, procs[2].pid, procs[2].pid), 10)
            await coord.exit(other, grant["epoch"], 0.0, 0)
            assert not stuck.cgroup.is_frozen() and not holder.cgroup.is_frozen()

        asyncio.run(scenario())
    finally:
        for p in procs:
            p.kill()
            p.wait()
        asyncio.run(backend.teardown())
        if gate is not None:
            gate.unlink()
