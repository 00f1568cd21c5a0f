"""krexd's parts, built once, each from those before it, into one frozen record.

:func:`assemble` is the composition root's plan (its docstring gives the
order); the :class:`TenantEnder` port breaks the one cycle, and
:class:`Built` records what a failed start must clean up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from krexd.cgroups import CgroupBackend
from krexd.cgroups.devices import DeviceIsolation
from krexd.config.config import Config
from krexd.config.slot_count import SlotChoice, choose
from krexd.coordinator import Coordinator
from krexd.coordinator.isolation import (
    ActivityWitness,
    AffinityPinner,
    CgroupControl,
    EndCommand,
    ProcessLock,
)
from krexd.gate import Gate
from krexd.hardware import inventory, vendors
from krexd.hardware.driverlock import driver_lock_for
from krexd.hardware.inventory import AMD, GpuInfo
from krexd.hardware.lock_ledger import LockLedger, ledger_path
from krexd.hardware.mps import MpsDaemon, MpsManager
from krexd.hardware.slices import CpuSlice, compute_slices
from krexd.memory.activity import activity_source
from krexd.memory.gpu_users import GpuUsers
from krexd.memory.opening import open_source
from krexd.memory.policy import AdmissionPolicy
from krexd.memory.refresher import MemoryRefresh
from krexd.memory.region_fit import RegionMemoryCheck
from krexd.memory.sources import Source
from krexd.memory.status import MemoryStatus
from krexd.memory.tenant_records import TenantRecords
from krexd.memory.view import GpuMemory
from krexd.memory.views import MemoryViews
from krexd.orchestration.gpu import Gpu
from krexd.orchestration.lifecycle import Lifecycle
from krexd.pools.freeze import PoolFreeze
from krexd.pools.registry import PoolRegistry
from krexd.restarts import adopt, state_files
from krexd.system import paths
from krexd.system.runtime import Runtime
from krexd.tenancy.admission import Admission, GpuSlots
from krexd.tenancy.quotas import UidCaps
from krexd.tenancy.registration_flags import RegistrationFlags
from krexd.tenancy.registrations import RegionGuard, Verifier
from krexd.tenancy.tenants import Tenant, TenantRegistry

_log = logging.getLogger("krexd")


class TenantEnder:
    """The coordinators' "end this tenant's command" port (``coordinator.isolation.EndCommand``).

    Bound once to ``Lifecycle.kill_command`` (:meth:`bind`); the
    coordinators hold the port, built before the lifecycle that needs them.
    """

    def __init__(self) -> None:
        self._end: EndCommand | None = None

    def bind(self, end: EndCommand) -> None:
        """Route every end to ``end`` (raises RuntimeError when bound already)."""
        if self._end is not None:
            raise RuntimeError("the tenant ender is bound already")
        self._end = end

    def __call__(self, tenant: Tenant, reason: str, exit_code: int, cause: str = "other") -> None:
        """End ``tenant``'s command (raises RuntimeError before :meth:`bind`: no tenant
        exists before the lifecycle does)."""
        if self._end is None:
            raise RuntimeError("no lifecycle to end a tenant's command yet")
        self._end(tenant, reason, exit_code, cause)


@dataclass(frozen=True)
class MonitoredGpu:
    """What the memory parts read and write of one GPU (the ``Gpu`` record shares them)."""

    info: GpuInfo
    gate: Gate | None
    memory: GpuMemory
    slots: GpuSlots


@dataclass(frozen=True)
class MemoryParts:
    """GPU memory, one part per role (``krexd.memory``); each caller gets the one it uses.

    ``views``: each GPU's used and free memory (region entry's check);
    ``policy``: admission by memory and new commands' needs (admission, the
    lifecycle); ``records``: tenants' records on demand and at their end (the
    ``memory`` op, the lifecycle); ``users``: who has a GPU open (the
    fail-closed check); ``status``: what ``status`` and the metrics read;
    ``refresh``: the periodic device read (closed at a restart's exit).
    """

    views: MemoryViews
    policy: AdmissionPolicy
    records: TenantRecords
    users: GpuUsers
    status: MemoryStatus
    refresh: MemoryRefresh


@dataclass
class Built:
    """What exists so far of a start, for the undo of a start that fails midway."""

    cgroups: CgroupBackend | None = None
    gates: list[Gate] = field(default_factory=list)
    mps: list[MpsDaemon] = field(default_factory=list)
    memory_source: Source | None = None  # opened: closed by a failed start's undo


@dataclass(frozen=True)
class Parts:
    """krexd's parts after :func:`assemble` (its docstring gives the order)."""

    cgroups: CgroupBackend
    saved: adopt.Saved | None  # what a krexd before a restart left to adopt (None: nothing)
    gpus: dict[int, Gpu]
    admission: Admission
    memory: MemoryParts
    pools: PoolRegistry
    lifecycle: Lifecycle

    def regions(self, gpu: int) -> Coordinator:
        """GPU ``gpu``'s region protocol, as the ops drive it (raises KeyError for a GPU
        krexd does not manage)."""
        return self.gpus[gpu].coordinator


def assemble(
    config: Config,
    runtime: Runtime,
    tenants: TenantRegistry,
    verifier: Verifier,
    flags: RegistrationFlags,
    mps: MpsManager,
    version: str,
    built: Built,
) -> Parts:
    """Build krexd's parts in dependency order; ``built`` records what a failed start
    must undo.  Raises whatever a part's construction raises (CgroupError, GateError,
    ConfigError, OSError), after recording in ``built`` what exists.

    Every part is built after what it needs and handed what it uses, as
    constructor arguments; nothing is attached afterwards:

    1. the GPU inventory and their CPU slices;
    2. the cgroup tree, after reading what a krexd before a restart saved (the
       gates it reopens get the drains' judge, ``Verifier.judge``);
    3. warm pools: their cgroups, the freeze every region holds, the registry;
    4. per GPU: its admission slots (how many, and why), its gate (with the
       drains' judge) and its memory state;
    5. GPU memory, one part per role (``krexd.memory``): the device source,
       the views, the admission policy (honouring slot-memory flags through
       ``flags``), the tenants' records, who has each GPU open, the status;
       then admission over the slots, asking the policy; then the periodic
       memory read, which kicks admission and tells the pools which
       processes use a GPU;
    6. per GPU: its region coordinator (the memory check over the views, the
       fail-closed check over who has the GPU open, the pools' freeze, the
       :class:`TenantEnder`) and its ``Gpu`` record, with its MPS daemon;
    7. the tenant lifecycle, to which the ender is then bound: the one
       cycle, coordinator -> lifecycle -> GPUs -> coordinator, is broken by
       that port, bound before any tenant exists.
    """
    infos, slices, cgroups, saved = _hardware(config, verifier, built)
    pools, pool_freeze = _pools(config, cgroups, version)
    slots = {i.index: _slots(config, i, slices[i.index]) for i in infos}
    if paths.gate_library() is None:
        # Draining is skipped; CPU freezing and pinning still apply.
        _log.warning("no gate library (build libkrex_gate.so): GPU submissions are not gated")
    gates = {i.index: _gate(config, i.index, saved, verifier, built) for i in infos}
    states = {i.index: GpuMemory() for i in infos}
    watched = [
        MonitoredGpu(i, gates[i.index][0], states[i.index], slots[i.index][0]) for i in infos
    ]
    memory, admission = _memory(config, runtime, tenants, watched, flags, pools, built)
    ender = TenantEnder()
    coordinating = _Coordinating(
        config,
        tenants,
        memory.views,
        memory.users,
        pool_freeze,
        ender,
        driver_lock_for(config.region, config.daemon.fake_gpus, config.mps.enabled),
        activity_source(infos, config.daemon.fake_gpus),
    )
    by_index = {
        i.index: _gpu_record(config, mps, built, coordinating, i, slices, slots, gates, states)
        for i in infos
    }
    # AMD GPUs found but not managed are hidden from every command (docs/design/amd.md).
    unmanaged = frozenset({AMD}) if cgroups.devices.unmanaged_render else frozenset()
    lifecycle = Lifecycle(
        config,
        runtime,
        by_index,
        tenants,
        admission,
        cgroups,
        memory.policy,
        memory.records,
        pools,
        unmanaged,
    )
    ender.bind(lifecycle.kill_command)
    return Parts(cgroups, saved, by_index, admission, memory, pools, lifecycle)


def _memory(
    config: Config,
    runtime: Runtime,
    tenants: TenantRegistry,
    watched: list[MonitoredGpu],
    flags: RegistrationFlags,
    pools: PoolRegistry,
    built: Built,
) -> tuple[MemoryParts, Admission]:
    """Step 5 of :func:`assemble`: GPU memory, one part per role, then admission over the
    slots asking the policy, then the periodic read (started) that kicks admission and
    tells the pools which processes use a GPU."""
    source = built.memory_source = open_source([g.info for g in watched])
    learned = state_files.learned_needs(config)
    if config.memory.learn:
        learned.load()
    views = MemoryViews(watched, tenants)
    policy = AdmissionPolicy(config.memory, views, watched, learned, flags=flags)
    admission = _admission(config, [g.slots for g in watched], policy)
    memory = MemoryParts(
        views,
        policy,
        TenantRecords(config.memory, views, learned),
        GpuUsers(source),
        MemoryStatus(
            config.memory, views, policy, {g.info.index: g.slots for g in watched}, source, learned
        ),
        MemoryRefresh(
            config.memory,
            source,
            views,
            admission,
            runtime,
            on_gpu_users=pools.after_device_read,  # a pool on the GPU or over its tasks ends
        ),
    )
    memory.refresh.start()
    return memory, admission


def _gpu_record(
    config: Config,
    mps: MpsManager,
    built: Built,
    coordinating: _Coordinating,
    info: GpuInfo,
    slices: dict[int, CpuSlice],
    slots: dict[int, tuple[GpuSlots, SlotChoice]],
    gates: dict[int, tuple[Gate | None, str | None]],
    states: dict[int, GpuMemory],
) -> Gpu:
    """Step 6 of :func:`assemble` for one GPU: its coordinator and its ``Gpu`` record,
    with its MPS daemon."""
    i = info.index
    return Gpu(
        info,
        slices[i],
        slots[i][0],
        coordinating.coordinator(info, gates[i][0], slices[i]),
        gate=gates[i][0],
        gate_path=gates[i][1],
        memory=states[i],
        mps=_mps(config, mps, info, built),
        slot_choice=slots[i][1],
    )


def _admission(config: Config, slots: list[GpuSlots], memory: AdmissionPolicy) -> Admission:
    """Admission over every GPU's ``slots``, asking the ``memory`` policy (bounded bypass:
    ``[memory] max_bypass``), with the per-uid caps (``[admission]``)."""
    return Admission(
        slots,
        config.admission.max_parked,
        memory=memory,
        max_bypass=config.memory.max_bypass,
        caps=UidCaps(
            config.admission.admitted_cap(sum(s.total for s in slots)),
            config.admission.max_parked_per_uid,
        ),
    )


def _hardware(
    config: Config, verifier: Verifier, built: Built
) -> tuple[list[GpuInfo], dict[int, CpuSlice], CgroupBackend, adopt.Saved | None]:
    """Steps 1-2: the GPU inventory, their CPU slices (invalid ones refused), the cgroup
    tree with its device isolation, and what a krexd before a restart saved to adopt
    (its gates reopened with ``verifier``'s judge)."""
    infos = inventory.discover(config.daemon.fake_gpus, config.daemon.fake_vendor)
    _log.info("GPUs: %s", ", ".join(f"{g.name} ({g.vendor})" for g in infos) or "none")
    slices = compute_slices(infos, config.cpu)
    for s in slices.values():
        _log.info("gpu%d slice %s", s.gpu, s.as_dict())
    devices = DeviceIsolation(
        config.gpu.device_isolation,
        **vendors.device_minors(infos),
        unmanaged_render=vendors.unmanaged_render(infos),
    )
    cgroups = built.cgroups = CgroupBackend.open(config.cgroup, devices=devices)
    # Adopt the tenants of the krexd before a restart, or clean its tree (krexd/restarts/adopt.py).
    saved = adopt.load(config, cgroups, {i.index: i.uuid for i in infos}, verifier.judge)
    cgroups.prepare(slices, adopt=saved is not None)
    _log.info("cgroups: %s", cgroups.describe())
    return infos, slices, cgroups, saved


class _Coordinating:
    """What every GPU's coordinator shares: the cgroup control, the pinner, the memory
    check, who has a GPU open, the pools' freeze, the ender, the driver's lock and the
    activity source."""

    def __init__(
        self,
        config: Config,
        tenants: TenantRegistry,
        views: MemoryViews,
        users: GpuUsers,
        pool_freeze: PoolFreeze | None,
        ender: TenantEnder,
        driver_lock: ProcessLock | None,
        activity: ActivityWitness | None,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.users = users
        self.pool_freeze = pool_freeze
        self.ender = ender
        self.driver_lock = driver_lock
        self.control = CgroupControl(config.daemon.liveness_interval_ms / 1000)
        self.pinner = AffinityPinner()
        self.region_memory = RegionMemoryCheck(config.memory.region_wait_s, views)
        self.activity = activity

    def coordinator(self, info: GpuInfo, gate: Gate | None, cpu_slice: CpuSlice) -> Coordinator:
        """GPU ``info``'s region coordinator over its gate (None: submissions not gated)."""
        cfg = self.config
        guard = None
        if gate is not None:
            # Who has the GPU open, from the device source; "cannot tell" counts as "open"
            # where the shim does not gate the vendor's commands (krexd.hardware.vendors).
            guard = RegionGuard(
                self.users.of(info.index),
                gate.live_registrations,
                unknown_is_open=not vendors.of(info).shim_gated,
            )
        return Coordinator(
            info.index,
            gate,
            cpu_slice,
            self.tenants,
            cfg.region,
            self.control,
            self.pinner,
            self.region_memory,
            guard=guard,
            end_command=self.ender,
            proc_lock=self.driver_lock if vendors.of(info).driver_lock else None,
            ledger=LockLedger(
                ledger_path(cfg.daemon.gate_dir, cfg.cgroup.name, info.index), info.index
            ),
            activity=self.activity,
            pool_freeze=self.pool_freeze,
        )


def _pools(
    config: Config, cgroups: CgroupBackend, version: str
) -> tuple[PoolRegistry, PoolFreeze | None]:
    """Warm pools (``[warm]``): their cgroup directory, emptied of pools of an earlier krexd,
    and the freeze every region holds (None: warm pools are off)."""
    pool_cgroups = cgroups.pools(config.warm.memory_max, config.warm.pool_tasks())
    freeze = None
    if config.warm.enabled:
        pool_cgroups.prepare()
        pool_cgroups.sweep(set())
        freeze = PoolFreeze(pool_cgroups.dir)  # every region freezes the pools too
        freeze.reset()
    poll_s = config.daemon.liveness_interval_ms / 1000
    return PoolRegistry(config.warm, pool_cgroups, version, poll_s), freeze


def _slots(config: Config, info: GpuInfo, cpu_slice: CpuSlice) -> tuple[GpuSlots, SlotChoice]:
    """GPU ``info``'s admission slots from ``[admission] slots_per_gpu``
    (``krexd.config.slot_count``), and how many were chosen and why (logged)."""
    chosen = choose(
        config.admission.slots_per_gpu,
        len(cpu_slice.tenant_cores),
        info.total_mem_bytes,
        config.memory.default_need,
        config.memory.headroom,
    )
    _log.info("gpu%d: slots %s", info.index, chosen.rule)
    return GpuSlots(info.index, chosen.total), chosen


def _gate(
    config: Config, gpu: int, saved: adopt.Saved | None, verifier: Verifier, built: Built
) -> tuple[Gate | None, str | None]:
    """GPU ``gpu``'s gate: the one a restart reopened, else a new one judged by ``verifier``
    (``(None, None)`` without ``libkrex_gate.so``: submissions are then not gated)."""
    reopened = saved.gates.get(gpu) if saved is not None else None
    gate: Gate | None
    path: str | None
    if reopened is not None:
        gate, path = reopened, reopened.path
    else:
        gate, path = state_files.create_gate(config, gpu, verifier.judge)
    if gate is not None:
        built.gates.append(gate)
    return gate, path


def _mps(config: Config, mps: MpsManager, info: GpuInfo, built: Built) -> MpsDaemon | None:
    """GPU ``info``'s MPS control daemon when ``[mps] enabled`` (paper §6.5: MPS lets
    off-region kernels of co-tenants share the GPU) and the vendor has MPS."""
    if not config.mps.enabled:
        return None
    if not vendors.of(info).mps:
        _log.info("gpu%d (%s): MPS is NVIDIA's; none here", info.index, info.vendor)
        return None
    daemon = mps.start(info.index, info.uuid)
    built.mps.append(daemon)
    return daemon
