"""krexd's memory parts, each alone over fakes (root-free).

* the view (``krexd.memory.views``): a device read and the shim's counts
  become each GPU's used, other and excess; counts re-read between reads;
* the policy (``krexd.memory.policy``): what a GPU may still give, when a
  GPU admits nothing (a live process's WAITING bit), the default need's cap;
* the records (``krexd.memory.tenant_records``): a tenant's end credits its
  ended processes' counts and teaches its peak, never an exclusive one's;
* the GPU users (``krexd.memory.gpu_users``): read afresh, a failing read
  is "unknown", one GPU's question asks that GPU;
* the refresh (``krexd.memory.refresher``): the pools' watch told first,
  its failure costs nothing, admission kicked while requests are parked,
  the source closed when krexd stops serving;
* the status (``krexd.memory.status``): the fields ``status`` shows.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krexd.config.config import MemoryConfig
from krexd.gate import OomRecord, RegistrationInfo
from krexd.hardware.inventory import GpuInfo
from krexd.memory.gpu_users import GpuUsers
from krexd.memory.learned import LearnedNeeds
from krexd.memory.policy import AdmissionPolicy
from krexd.memory.refresher import MemoryRefresh
from krexd.memory.sources import DeviceMemory
from krexd.memory.status import MemoryStatus
from krexd.memory.tenant_records import TenantRecords
from krexd.memory.view import GpuMemory
from krexd.memory.views import MemoryViews
from krexd.system.runtime import RunState, Runtime
from krexd.tenancy.admission import GpuSlots
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.support.fakes import make_tenant

G = 1 << 30
M = 1 << 20


def _slot(
    tenant: int, index: int, mib: int, *, state: str = "active", **oom: Any
) -> RegistrationInfo:
    """A registration of ``tenant`` by this (live) process holding ``mib`` MiB."""
    pid = os.getpid()
    return RegistrationInfo(
        index=index,
        state=state,
        pid=pid,
        tenant=tenant,
        inflight=0,
        ack_epoch=0,
        captures=0,
        gated_calls=0,
        blocked_calls=0,
        last_drain_ns=0,
        mem_mib=mib,
        oom=OomRecord(**oom),
        owner=pid << 32 | 2,
        start_ticks=7,
        image=0,
        pidns=1,
    )


class _Gate:
    """The gate reads the memory parts make: registrations and the WAITING bits."""

    def __init__(self) -> None:
        self.records: list[RegistrationInfo] = []

    def registrations(self) -> list[RegistrationInfo]:
        return list(self.records)

    def live_registrations(self) -> list[RegistrationInfo]:
        return [s for s in self.records if s.state in ("active", "exiting")]

    def waiting_for_memory(self) -> list[RegistrationInfo]:
        return [s for s in self.records if s.oom.waiting]


@dataclass
class _Gpu:
    info: GpuInfo
    gate: Any
    memory: GpuMemory = field(default_factory=GpuMemory)
    slots: GpuSlots = field(default_factory=lambda: GpuSlots(0, 4))


class _Source:
    name = "fake"

    def __init__(self, dev: dict[int, DeviceMemory]) -> None:
        self.dev = dev
        self.reads = 0
        self.closed = 0
        self.users_of: dict[int, set[int] | None] = {}
        self.fail: Exception | None = None

    def read(self) -> dict[int, DeviceMemory]:
        self.reads += 1
        return dict(self.dev)

    def users(self, gpu: int) -> set[int] | None:
        if self.fail is not None:
            raise self.fail
        return self.users_of.get(gpu)

    def close(self) -> None:
        self.closed += 1


@dataclass
class _Rig:
    gpu: _Gpu
    gate: _Gate
    registry: TenantRegistry
    views: MemoryViews
    learned: LearnedNeeds
    cfg: MemoryConfig

    def tenant(self, need: int = 1 * G, exclusive: bool = False) -> Tenant:
        t = make_tenant(self.registry, exclusive=exclusive)
        t.memory.need_bytes = need
        self.registry.add(t)
        return t

    def policy(self, flags: Any = None) -> AdmissionPolicy:
        return AdmissionPolicy(self.cfg, self.views, [self.gpu], self.learned, flags=flags)


def _rig(tmp_path: Path, total: int = 80 * G, **cfg: Any) -> _Rig:
    gate = _Gate()
    gpu = _Gpu(GpuInfo(0, "fake", total, 0, None, True), gate)
    registry = TenantRegistry()
    config = MemoryConfig(**{"headroom": 2 * G, "default_need": 4 * G, **cfg})
    learned = LearnedNeeds(str(tmp_path / "learned.json"), 100)
    return _Rig(gpu, gate, registry, MemoryViews([gpu], registry), learned, config)


# --- the view ---------------------------------------------------------------------------


def test_a_device_read_and_the_shim_counts_make_the_view(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    a, b = rig.tenant(need=1 * G), rig.tenant(need=10 * G)
    rig.gate.records = [_slot(a.id, 0, 3 * 1024), _slot(b.id, 0, 2 * 1024)]
    assert rig.views.view(0) is None
    rig.views.refresh()  # before the first device read: nothing to read over
    assert rig.views.view(0) is None
    rig.views.apply({0: DeviceMemory(80 * G, 20 * G, None, "fake")})
    view = rig.views.view(0)
    assert view is not None
    assert (view.total, view.used, view.tenants_used) == (80 * G, 20 * G, 5 * G)
    assert view.other == 15 * G and view.excess == 15 * G + 2 * G  # a is 2 GiB over its need
    assert a.memory.used_bytes == 3 * G and a.memory.exceeded and not b.memory.exceeded
    assert rig.views.shim_counts(0) == {a.id: 3 * G, b.id: 2 * G}
    rig.gate.records = [_slot(a.id, 0, 1024)]  # b freed, a freed 2 GiB
    rig.views.refresh(0)
    view = rig.views.view(0)
    assert view is not None and view.tenants_used == 1 * G and a.memory.peak_bytes == 3 * G


def test_a_gpu_missing_from_a_read_is_its_total_with_the_shim_counts(tmp_path: Path) -> None:
    rig = _rig(tmp_path, total=16 * G)
    rig.views.apply({})
    view = rig.views.view(0)
    assert view is not None and (view.total, view.source) == (16 * G, "shim")
    assert rig.views.view(7) is None and rig.views.shim_counts(7) == {}
    assert rig.views.indices() == [0]


# --- the policy ---------------------------------------------------------------------------


def test_the_policy_gives_total_less_headroom_and_excess(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    policy = rig.policy()
    assert policy.available(0) is None, "no view yet"
    rig.views.apply({0: DeviceMemory(80 * G, 10 * G, None, "fake")})
    assert policy.capacity(0) == 78 * G
    assert policy.available(0) == 80 * G - 2 * G - 10 * G
    off = AdmissionPolicy(MemoryConfig(admission=False), rig.views, [rig.gpu], rig.learned)
    assert off.available(0) is None, "admission by memory off"


def test_a_live_waiting_allocation_blocks_its_gpu(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    t = rig.tenant()
    policy = rig.policy()
    assert not policy.blocked(0)
    rig.gate.records = [_slot(t.id, 0, 10, waiting=True)]
    assert policy.blocked(0)

    class _Flags:
        def waits_honoured(self, gate: Any, waiting: list[RegistrationInfo]) -> bool:
            return False  # past its bound, or not verified

    assert not rig.policy(flags=_Flags()).blocked(0)
    assert not policy.blocked(3), "unknown GPU"


def test_the_default_need_is_capped_at_one_slots_share(tmp_path: Path) -> None:
    rig = _rig(tmp_path, total=10 * G, default_need=8 * G)
    rig.views.apply({0: DeviceMemory(10 * G, 0, None, "fake")})
    rec = rig.policy().need_for(None, None, ["bench"], uid=1000)
    assert (rec.need_bytes, rec.need_source) == ((10 * G - 2 * G) // 4, "default")


# --- the records ------------------------------------------------------------------------


def test_a_tenants_end_credits_its_counts_and_teaches_its_peak(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    records = TenantRecords(rig.cfg, rig.views, rig.learned)
    t = rig.tenant()
    t.memory.label = "bench.py"
    rig.views.apply({0: DeviceMemory(80 * G, None, None, "shim")})
    rig.gate.records = [_slot(t.id, 0, 6 * 1024, waited=2, failed=1, last="timeout")]
    records.refresh_tenant(t)
    assert (t.memory.oom_waited, t.memory.oom_cotenant) == (2, 1)
    # Its process ended and its slot was freed with its final counts.
    rig.gate.records = [_slot(t.id, 0, 6 * 1024, state="free", waited=3, failed=1, last="timeout")]
    t.memory.waiting = True
    records.tenant_ended(t)
    assert t.memory.oom_waited == 3 and not t.memory.waiting
    assert rig.learned.need(t.uid, "bench.py") == 6 * G


def test_an_exclusive_tenant_or_learning_off_teaches_nothing(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    t = rig.tenant(exclusive=True)
    t.memory.label, t.memory.peak_bytes = "big", 9 * G
    TenantRecords(rig.cfg, rig.views, rig.learned).tenant_ended(t)
    u = rig.tenant()
    u.memory.label, u.memory.peak_bytes = "small", 1 * G
    TenantRecords(MemoryConfig(learn=False), rig.views, rig.learned).tenant_ended(u)
    assert len(rig.learned) == 0


# --- the GPU users ------------------------------------------------------------------------


def test_gpu_users_are_read_afresh_and_a_failure_is_unknown() -> None:
    source = _Source({})
    users = GpuUsers(source)
    source.users_of = {0: {11, 12}, 1: None}
    assert users.users(0) == {11, 12} and users.users(1) is None
    one = users.of(0)
    source.users_of[0] = {13}
    assert one() == {13} and users.of(1)() is None
    source.fail = RuntimeError("NVML gone")
    assert one() is None


# --- the refresh ------------------------------------------------------------------------


class _Admission:
    def __init__(self, parked: int) -> None:
        self.parked: list[Any] = [object()] * parked
        self.kicks = 0

    def kick(self) -> None:
        self.kicks += 1


def test_the_refresh_reads_tells_the_pools_kicks_admission_and_closes(tmp_path: Path) -> None:
    rig = _rig(tmp_path, refresh_ms=10)
    source = _Source({0: DeviceMemory(80 * G, 1 * G, {41: 1 * G}, "fake", frozenset({42}))})
    seen: list[set[int]] = []
    runtime = Runtime()
    admission = _Admission(parked=1)

    def watch(pids: set[int]) -> None:
        seen.append(pids)
        raise RuntimeError("the watch failed")  # logged: the read goes on

    refresh = MemoryRefresh(rig.cfg, source, rig.views, admission, runtime, on_gpu_users=watch)

    async def run() -> None:
        refresh.start()
        refresh.start()  # once
        assert rig.views.view(0) is not None, "read once at start"
        while source.reads < 3:
            await asyncio.sleep(0.01)
        runtime.change(RunState.STOPPING)
        while not source.closed:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert seen[0] == {41, 42} and admission.kicks >= 2
    assert source.closed == 1


# --- the status ---------------------------------------------------------------------------


def test_the_status_shows_each_gpus_memory_and_the_settings(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    t = rig.tenant()
    rig.gpu.slots.mem_reserved = 8 * G
    policy = rig.policy()
    status = MemoryStatus(rig.cfg, rig.views, policy, {0: rig.gpu.slots}, _Source({}), rig.learned)
    assert status.gpu_status(0) is None, "before the first read"
    rig.views.apply({0: DeviceMemory(80 * G, 10 * G, None, "fake")})
    rig.gate.records = [_slot(t.id, 0, 1024, waiting=True)]
    row = status.gpu_status(0)
    assert row is not None
    assert row["available_bytes"] == 80 * G - 2 * G - 9 * G - 8 * G  # re-read: 1 GiB is t's
    assert row["waiting"] == [t.id] and row["blocked"] is True
    assert row["free_bytes"] == 70 * G and row["tenants_bytes"] == 1 * G
    settings = status.settings()
    assert settings["source"] == "fake" and settings["headroom_bytes"] == 2 * G
    rig.learned.record(1000, "x", G)
    assert status.learned_labels() == 1


def test_status_of_an_unknown_gpu_is_none(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    status = MemoryStatus(rig.cfg, rig.views, rig.policy(), {}, _Source({}), rig.learned)
    assert status.gpu_status(5) is None
