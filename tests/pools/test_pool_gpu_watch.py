"""A warm pool found on the GPU, or over its task cap, is ended (krexd.pools.registry.PoolRegistry).

A pool never initialises CUDA; one of its processes with GPU memory is code
that got past the zygote's checks, running GPU work outside every gate.
Root-free: the registry with a stand-in pool cgroup that records a kill.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from krexd.config.config import WarmConfig
from krexd.pools.registry import Pool, PoolRegistry


@dataclass
class _Cgroup:
    procs: list[int]
    path: str = "/sys/fs/cgroup/krex/pools/u1000-p42"
    killed: bool = False
    calls: list[str] = field(default_factory=list)

    def pids(self) -> list[int]:
        return [] if self.killed else list(self.procs)

    def kill(self) -> None:
        self.killed = True

    def remove(self) -> bool:
        return self.killed

    def memory_bytes(self) -> int | None:
        return None

    def tasks(self) -> int:
        return 0 if self.killed else self.threads

    threads: int = 1


def _registry(*pools: tuple[int, list[int]]) -> tuple[PoolRegistry, dict[int, _Cgroup]]:
    reg = PoolRegistry(WarmConfig(), cgroups=None, version="test")  # type: ignore[arg-type]
    groups = {}
    for zygote, procs in pools:
        cg = groups[zygote] = _Cgroup([zygote, *procs])
        pool = Pool(zygote, 1, 1000, 1000, zygote + 1, "k", "test", "/usr/bin/python3", [], cg)  # type: ignore[arg-type]
        reg._pools[zygote] = pool
    return reg, groups


def test_a_pool_with_a_process_on_the_gpu_is_ended_and_the_others_kept() -> None:
    reg, groups = _registry((42, [43]), (50, [51]))
    reg.check_gpu_users({43, 7, 8})  # 43: an unplaced child of pool 42; 7, 8: tenants
    assert groups[42].killed and not groups[50].killed
    assert len(reg) == 1 and reg.of_uid(1000)[0].pid == 50


def test_no_pool_process_on_the_gpu_changes_nothing() -> None:
    reg, groups = _registry((42, [43]))
    reg.check_gpu_users({7})
    assert not groups[42].killed and len(reg) == 1


def test_a_pool_grown_past_its_task_cap_is_ended_at_the_next_device_read() -> None:
    # Where no pids controller refuses its threads, a pool may grow after the count of
    # its registration: every device read counts again.
    reg, groups = _registry((42, []), (50, []))
    groups[42].threads = 300
    groups[50].threads = 3
    limit = WarmConfig(pids_max=32).pool_tasks()
    reg.config = WarmConfig(pids_max=limit)
    reg.after_device_read(set())
    assert groups[42].killed and not groups[50].killed
    assert [p.pid for p in reg.of_uid(1000)] == [50]
