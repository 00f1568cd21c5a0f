"""krexd.cgroups on this host's real cgroupfs: tenant cgroups, freeze/thaw, cpuset, cleanup."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from krexd.cgroups import CgroupBackend
from krexd.config.config import CgroupConfig, CpuConfig
from krexd.hardware.inventory import fake_gpus
from krexd.hardware.slices import compute_slices

pytestmark = pytest.mark.root


def proc_state(pid: int) -> tuple[str, int]:
    """(state letter, utime+stime ticks) of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[11]) + int(fields[12])


def cpus_allowed(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    return ""


@pytest.fixture
def backend() -> Iterator[CgroupBackend]:
    cores = sorted(os.sched_getaffinity(0))
    cpu = CpuConfig(reserved_cores=1, allow_shared=True)
    slices = compute_slices(fake_gpus(1), cpu, cores, {})
    b = CgroupBackend.open(CgroupConfig(name=f"krexcg{os.getpid()}"))
    b.prepare(slices)
    yield b
    asyncio.run(b.teardown())
    assert not os.path.exists(b.root)
    if b.cpuset_root:
        assert not os.path.exists(b.cpuset_root)
    if b.pids_root:
        assert not os.path.exists(b.pids_root)


def spin() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_backend_is_detected(backend: CgroupBackend) -> None:
    d = backend.describe()
    assert d["backend"] in ("v2", "hybrid")
    assert os.path.isfile(os.path.join(backend.root, "gpu0", "cgroup.procs"))
    if d["backend"] == "hybrid":
        assert d["cpuset"] == "v1" and os.path.isdir(os.path.join(str(d["cpuset_root"]), "gpu0"))


def test_freeze_stops_a_busy_process_and_thaw_resumes(backend: CgroupBackend) -> None:
    cg = backend.create_tenant(0, 1)
    p = spin()
    try:
        cg.add_pid(p.pid)
        assert cg.pids() == [p.pid]
        cg.freeze()
        assert asyncio.run(cg.wait_frozen(5.0))
        assert cg.is_frozen()
        _, before = proc_state(p.pid)
        time.sleep(0.3)
        _, after = proc_state(p.pid)
        assert after - before <= 1, "a frozen process kept using CPU"  # 1 tick: accounting
        cg.thaw()
        deadline = time.monotonic() + 2.0
        while cg.is_frozen():
            assert time.monotonic() < deadline, "still frozen 2 s after thaw"
            time.sleep(0.01)
        while proc_state(p.pid)[1] <= after + 1:  # on a loaded 2-core host, allow 2 s
            assert time.monotonic() < deadline, "a thawed process did not run again"
            time.sleep(0.05)
    finally:
        cg.kill()
        p.wait()
    assert asyncio.run(cg.wait_empty(5.0))
    cg.remove()
    assert not any(os.path.exists(d) for d in cg.paths)


def test_wait_frozen_times_out_on_a_cgroup_that_is_not_frozen(backend: CgroupBackend) -> None:
    cg = backend.create_tenant(0, 2)
    p = spin()
    try:
        cg.add_pid(p.pid)
        t0 = time.monotonic()
        assert not asyncio.run(cg.wait_frozen(0.05))
        assert time.monotonic() - t0 >= 0.05
    finally:
        cg.kill()
        p.wait()


def test_cpus_of_tenant_and_set_cpus(backend: CgroupBackend) -> None:
    cg = backend.create_tenant(0, 3)
    sl = backend._slices[0]
    p = subprocess.Popen(["sleep", "30"])
    try:
        cg.add_pid(p.pid)
        allowed = {int(x) for x in _expand(cpus_allowed(p.pid))}
        assert allowed == set(sl.tenant_cores)
        cg.set_cpus(sl.cores)
        assert {int(x) for x in _expand(cpus_allowed(p.pid))} == set(sl.cores)
    finally:
        cg.kill()
        p.wait()


def test_kill_reaches_the_whole_tree_even_frozen(backend: CgroupBackend) -> None:
    cg = backend.create_tenant(0, 4)
    p = subprocess.Popen(
        ["sh", "-c", "read go; setsid sleep 30 & sleep 30 & wait"], stdin=subprocess.PIPE
    )
    try:
        cg.add_pid(p.pid)
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.close()
        deadline = time.monotonic() + 5
        while len(cg.pids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(cg.pids()) == 3
        cg.freeze()
        assert asyncio.run(cg.wait_frozen(5.0))
        cg.kill()
        assert asyncio.run(cg.wait_empty(5.0))
    finally:
        p.wait()


def test_stale_tree_is_thawed_killed_and_removed(backend: CgroupBackend) -> None:
    cg = backend.create_tenant(0, 5)
    p = subprocess.Popen(["sleep", "30"])
    cg.add_pid(p.pid)
    cg.freeze()
    assert asyncio.run(cg.wait_frozen(5.0))
    # A new backend of the same name finds the tree of a "crashed" krexd,
    # whose claim on the tree died with it.
    backend.unlock()
    again = CgroupBackend.open(CgroupConfig(name=backend.name))
    killed = again.prepare(backend._slices)
    assert killed == 1
    assert p.wait(5) == -9
    assert not os.path.exists(cg.path)
    assert os.path.isdir(os.path.join(backend.root, "gpu0"))
    asyncio.run(again.teardown())


def _expand(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def test_v2_without_cpuset_controller_confines_by_affinity() -> None:
    # backend = "v2" on a host whose cgroup2 has no cpuset controller (this hybrid CI
    # host): slices are applied with sched_setaffinity, freezing still works.
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    slices = compute_slices(fake_gpus(1), CpuConfig(reserved_cores=1), cores, {})
    b = CgroupBackend.open(CgroupConfig(name=f"krexaff{os.getpid()}", backend="v2"))
    if b.cpuset_kind != "affinity":
        pytest.skip("this host's cgroup2 has a cpuset controller")
    b.prepare(slices)
    cg = b.create_tenant(0, 1)
    p = subprocess.Popen(["sleep", "30"])
    try:
        cg.add_pid(p.pid)
        assert _expand(cpus_allowed(p.pid)) == list(slices[0].tenant_cores)
        cg.set_cpus(slices[0].cores)
        assert _expand(cpus_allowed(p.pid)) == list(slices[0].cores)
        cg.freeze()
        assert asyncio.run(cg.wait_frozen(5.0))
    finally:
        cg.kill()
        p.wait()
        asyncio.run(b.teardown())
    assert not os.path.exists(b.root)
