"""In-memory fakes of what ``krexd.orchestration.lifecycle.Lifecycle`` uses, for root-free tests.

``Lifecycle`` talks to its parts through small ports (``TenantCgroups``,
``MemoryNeeds``, ``EndedMemory``) and to each GPU's coordinator.  Here the
ports are fakes that log to the same :class:`tests.support.fakes.Events` as
the coordinator's fakes, and the coordinator is the real one over those
fakes, so a test sees admission, the coordinator's steps and the end of a
tenant in one ordered log, with no cgroupfs, no socket and no krexd.

* :class:`FakeCgroup` — a tenant cgroup whose membership, kill and removal are flags.
* :class:`FakeCgroups` — creates them; ``fail_next`` makes the next creation fail.
* :class:`FakeNeeds` / :class:`FakeRecords` — the memory need charged, the final record.
* :func:`lifecycle_rig` — a ``Lifecycle`` over all of these for ``n`` GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from krexd.cgroups import CgroupError, TenantCgroup
from krexd.config.config import Config
from krexd.coordinator import Coordinator
from krexd.hardware.inventory import GpuInfo
from krexd.hardware.slices import CpuSlice
from krexd.orchestration.gpu import Gpu
from krexd.orchestration.lifecycle import Lifecycle
from krexd.system.runtime import RunState, Runtime
from krexd.tenancy.admission import Admission, GpuSlots
from krexd.tenancy.memory_records import TenantMemory
from krexd.tenancy.tenants import Tenant, TenantRegistry
from tests.support.fakes import Events, FakeGate, FakePinner, FakeTenantControl

SLICE_CORES = (0, 1, 2, 3)


class FakeCgroup(TenantCgroup):
    """A tenant cgroup in memory: ``members`` are the pids added, ``killed``/``removed`` flags.

    Processes added are not really moved; ``kill`` empties it at once unless
    ``stay_populated`` (a tree that does not die).
    """

    def __init__(self, events: Events, gpu: int, tenant_id: int) -> None:
        super().__init__(f"/nonexistent/krex-fake/gpu{gpu}/t{tenant_id}", None, "v2", (0,))
        self.events = events
        self.tenant_id = tenant_id
        self.members: list[int] = []
        self.killed = 0
        self.removed = False
        self.closed = False
        self.stay_populated = False

    def add_pid(self, pid: int) -> None:
        self.events.add("cgroup_add", self.tenant_id, pid)
        self.members.append(pid)

    def pids(self) -> list[int]:
        return list(self.members)

    def populated(self) -> bool:
        return bool(self.members)

    def kill(self) -> None:
        self.events.add("cgroup_kill", self.tenant_id)
        self.killed += 1
        if not self.stay_populated:
            self.members.clear()

    async def wait_empty(self, timeout_s: float) -> bool:
        return not self.members

    def close(self) -> None:
        self.closed = True

    def remove(self) -> None:
        if self.members:
            raise CgroupError(f"{self.path}: still populated")
        self.events.add("cgroup_remove", self.tenant_id)
        self.removed = True
        self.closed = True


class FakeCgroups:
    """``Lifecycle.TenantCgroups``: ``made`` maps tenant id -> its :class:`FakeCgroup`."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.made: dict[int, FakeCgroup] = {}
        self.fail_next: str | None = None  # the CgroupError message of the next creation

    def create_tenant(self, gpu: int, tenant_id: int) -> TenantCgroup:
        if self.fail_next is not None:
            why, self.fail_next = self.fail_next, None
            raise CgroupError(why)
        self.events.add("cgroup_create", gpu, tenant_id)
        cg = self.made[tenant_id] = FakeCgroup(self.events, gpu, tenant_id)
        return cg


class FakeNeeds:
    """``Lifecycle.MemoryNeeds``: charges the declared bytes, else ``default_bytes``."""

    def __init__(self, default_bytes: int = 1 << 30) -> None:
        self.default_bytes = default_bytes

    def need_for(
        self,
        mem_bytes: int | None,
        gpu: int | None,
        argv: list[str],
        label: str | None = None,
        *,
        uid: int,
    ) -> TenantMemory:
        if mem_bytes is not None:
            return TenantMemory(mem_bytes, "declared", declared_bytes=mem_bytes)
        return TenantMemory(self.default_bytes, "default")


class FakeRecords:
    """``Lifecycle.EndedMemory``: logs each final record (``raises``: the next one fails)."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.raises = False

    def tenant_ended(self, tenant: Tenant) -> None:
        self.events.add("memory_record", tenant.id)
        if self.raises:
            raise RuntimeError("memory record failed")


@dataclass
class LifecycleRig:
    """A ``Lifecycle`` over fakes: every part a test may look at or make fail."""

    events: Events
    control: FakeTenantControl
    pinner: FakePinner
    gates: list[FakeGate]
    registry: TenantRegistry
    slots: list[GpuSlots]
    admission: Admission
    cgroups: FakeCgroups
    records: FakeRecords
    runtime: Runtime
    gpus: dict[int, Gpu]
    lifecycle: Lifecycle

    def coordinator(self, gpu: int = 0) -> Coordinator:
        """The real coordinator of GPU ``gpu`` (over the fakes)."""
        return self.gpus[gpu].coordinator


def lifecycle_rig(
    ngpus: int = 1, slots_per_gpu: int = 1, place_timeout_s: float = 60.0
) -> LifecycleRig:
    """``ngpus`` GPUs of ``slots_per_gpu`` slots each, a real coordinator each, fakes below.

    ``place_timeout_s``: ``[admission] place_timeout_s`` (s).  Build it inside a running
    event loop only if the test needs the loop at construction (it does not).
    """
    events = Events()
    control, pinner = FakeTenantControl(events), FakePinner(events)
    registry = TenantRegistry()
    slots = [GpuSlots(i, slots_per_gpu) for i in range(ngpus)]
    admission = Admission(slots)
    config = Config()
    config = dataclasses.replace(
        config, admission=dataclasses.replace(config.admission, place_timeout_s=place_timeout_s)
    )
    gates = [FakeGate(events) for _ in range(ngpus)]
    gpus = {
        i: Gpu(
            info=GpuInfo(i, "Fake GPU", 80 << 30, 50 << 20, None, True),
            cpu_slice=_slice(i, SLICE_CORES),
            slots=slots[i],
            coordinator=Coordinator(
                i, gates[i], _slice(i, SLICE_CORES), registry, config.region, control, pinner
            ),
        )
        for i in range(ngpus)
    }
    cgroups, records, runtime = FakeCgroups(events), FakeRecords(events), Runtime()
    runtime.change(RunState.SERVING)
    lifecycle = Lifecycle(config, runtime, gpus, registry, admission, cgroups, FakeNeeds(), records)
    return LifecycleRig(
        events, control, pinner, gates, registry, slots, admission, cgroups, records, runtime,
        gpus, lifecycle,
    )  # fmt: skip


def _slice(gpu: int, cores: Sequence[int]) -> CpuSlice:
    return CpuSlice(gpu, cores=tuple(cores), reserved=(cores[-1],), tenant_cores=tuple(cores[:-1]))
