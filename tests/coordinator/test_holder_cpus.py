"""The holder's cores in a region (``[region] holder_cpus``, docs/design/daemon.md).

Inside a region the holder never has fewer cores than outside it: with
``"add"`` (the default) the reserved cores are added to its cgroup's cores
and to its submitting thread's own affinity; ``"reserved_only"`` keeps the
paper's pinning of the submitting thread to the reserved cores alone.  The
fakes check what the coordinator asks of the pinner (no root); the root test
checks a real multi-threaded holder's threads through real cgroups and
``sched_setaffinity``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from krexd.config.config import ConfigError, RegionConfig, load
from krexd.coordinator import Coordinator
from krexd.coordinator.isolation import AffinityPinner, CgroupControl
from krexd.hardware.slices import CpuSlice
from krexd.tenancy.tenants import TenantRegistry
from tests.support.fakes import Events, FakePinner, FakeTenantControl, make_tenant

SLICE = CpuSlice(0, cores=(0, 1, 2, 3), reserved=(3,), tenant_cores=(0, 1, 2))


def _fake_region(holder_cpus: str, thread_cpus: tuple[int, ...]) -> tuple[FakePinner, list[Any]]:
    """Enter and leave one region with fakes; (pinner, its log during the region)."""
    events = Events()
    pinner = FakePinner(events)
    pinner.initial = thread_cpus
    registry = TenantRegistry()
    holder, sibling = make_tenant(registry), make_tenant(registry)
    registry.add(holder)
    registry.add(sibling)
    cfg = RegionConfig(holder_cpus=holder_cpus)
    coord = Coordinator(0, None, SLICE, registry, cfg, FakeTenantControl(events), pinner)
    tid = min(holder.pids)
    inside: list[Any] = []

    async def scenario() -> None:
        grant = await coord.enter(holder, tid, tid)
        inside.extend(e for e in events.log if e[0] in ("set_cpus", "pin_thread"))
        await coord.exit(holder, grant["epoch"], 0.0, 0)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    return pinner, inside


def test_add_gives_the_thread_its_own_cores_plus_the_reserved_ones() -> None:
    # A thread the command narrowed to core 1 gets core 1 and the reserved core 3.
    pinner, inside = _fake_region("add", (1,))
    holder_id = next(iter(pinner.cpus))
    tid = next(iter(pinner.affinity))
    assert inside == [("set_cpus", holder_id, (0, 1, 2, 3)), ("pin_thread", tid, (1, 3))]
    # Step 7: the thread's own affinity back, then the off-region cpuset.
    assert pinner.affinity[tid] == (1,)
    assert pinner.cpus[holder_id] == SLICE.tenant_cores


def test_add_never_leaves_a_thread_with_fewer_cores_than_outside() -> None:
    for own in [(0,), (0, 1, 2), (2,)]:
        _, inside = _fake_region("add", own)
        pinned = [e[2] for e in inside if e[0] == "pin_thread"]
        assert pinned and set(own) <= set(pinned[0]) and set(SLICE.reserved) <= set(pinned[0])


def test_reserved_only_pins_the_thread_to_the_reserved_cores_alone() -> None:
    pinner, inside = _fake_region("reserved_only", (0, 1, 2))
    tid = next(iter(pinner.affinity))
    assert ("pin_thread", tid, SLICE.reserved) in inside
    assert pinner.affinity[tid] == SLICE.tenant_cores


def test_holder_cpus_is_a_checked_config_choice(tmp_path: Any) -> None:
    assert load(None).region.holder_cpus == "add"
    good = tmp_path / "good.toml"
    good.write_text('[region]\nholder_cpus = "reserved_only"\n')
    assert load(str(good)).region.holder_cpus == "reserved_only"
    bad = tmp_path / "bad.toml"
    bad.write_text('[region]\nholder_cpus = "some"\n')
    with pytest.raises(ConfigError, match="holder_cpus"):
        load(str(bad))


# ---------------------------------------------------------------- root, real cgroups

THREADS = """
import os, sys, threading, time
ids = []
def spin():
    ids.append(threading.get_native_id())
    time.sleep(120)
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
while len(ids) < 3:
    time.sleep(0.01)
print(" ".join(map(str, ids)), flush=True)
time.sleep(120)
"""


def _affinities(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.root
@pytest.mark.parametrize("policy", ["add", "reserved_only"])
def test_multithreaded_holder_keeps_its_cores_in_a_region(
    one_gpu: Callable[[int], Any], policy: str
) -> None:
    g = one_gpu(1)
    if len(g.cpu_slice.cores) < 2:
        pytest.skip("needs at least 2 cores in the slice")
    cores = g.cpu_slice.cores
    # One reserved core, the others for tenants off-region.
    g.cpu_slice = CpuSlice(0, cores=cores, reserved=cores[-1:], tenant_cores=cores[:-1])
    g.admit(*g.tenants)
    holder = g.tenants[0]
    proc = subprocess.Popen([sys.executable, "-c", THREADS], stdout=subprocess.PIPE)
    g.procs.append(proc)
    holder.cgroup.add_pid(proc.pid)
    holder.cgroup.set_cpus(g.cpu_slice.tenant_cores)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(0.05)
    outside = _affinities(proc.pid)
    assert all(a == set(g.cpu_slice.tenant_cores) for a in outside.values()), outside
    cfg = RegionConfig(holder_cpus=policy)
    coord = Coordinator(0, g.gate, g.cpu_slice, g.registry, cfg, CgroupControl(), AffinityPinner())

    async def scenario() -> dict[int, set[int]]:
        grant = await coord.enter(holder, proc.pid, proc.pid)
        try:
            return _affinities(proc.pid)
        finally:
            await coord.exit(holder, grant["epoch"], 0.0, 0)

    inside = asyncio.run(asyncio.wait_for(scenario(), 10))
    fewer = {t: (outside[t], inside[t]) for t in outside if not outside[t] <= inside[t]}
    if policy == "add":
        assert not fewer, f"threads lost cores in the region: {fewer}"
        assert set(g.cpu_slice.reserved) <= inside[proc.pid]
    else:
        # The paper's pinning: the submitting thread runs on the reserved core alone.
        assert inside[proc.pid] == set(g.cpu_slice.reserved)
        assert proc.pid in fewer
    after = _affinities(proc.pid)
    assert all(a == set(g.cpu_slice.tenant_cores) for a in after.values()), after


def test_an_adopted_region_gives_the_thread_its_own_cores_back() -> None:
    # A region granted by a krexd that then crashed: its successor adopts it from the
    # saved state and, at exit, gives the holder thread its own affinity (core 1) back.
    events = Events()
    pinner = FakePinner(events)
    pinner.initial = (1,)
    registry = TenantRegistry()
    holder, sibling = make_tenant(registry), make_tenant(registry)
    registry.add(holder)
    registry.add(sibling)
    cfg = RegionConfig(holder_cpus="add")
    before = Coordinator(0, None, SLICE, registry, cfg, FakeTenantControl(events), pinner)
    after = Coordinator(0, None, SLICE, registry, cfg, FakeTenantControl(events), pinner)
    tid = min(holder.pids)

    async def scenario() -> None:
        await before.enter(holder, tid, tid)
        r = before.saved()["region"]
        assert r["thread_cpus"] == [1]
        siblings = [registry.get(i) for i in r["siblings"]]
        after.adopt_region(
            holder,
            r["epoch"],
            r["pid"],
            r["tid"],
            [s for s in siblings if s is not None],
            tuple(r["thread_cpus"]),
        )
        await after.exit(holder, r["epoch"], 0.0, 0)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert pinner.affinity[tid] == (1,)
    assert pinner.cpus[holder.id] == SLICE.tenant_cores
