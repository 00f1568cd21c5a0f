"""krexd's parts, built once, each from those before it, into one frozen record.

:func:`assemble` is the composition root's plan (``krexd.daemon`` runs it at
start, step 1-3 of its start order).  Every part is built after what it
needs and handed what it uses; nothing is attached afterwards:

1. the GPU inventory and their CPU slices;
2. the cgroup tree, after reading what a krexd before a restart saved;
3. warm pools: their cgroups, the freeze every region holds, the registry;
4. per GPU: its admission slots (how many, and why), its gate, its memory
   view and its MPS daemon;
5. admission over the slots, then the memory monitor over each GPU's
   inventory, gate, view and slots (it tells the pools which processes use
   a GPU, and honours slot-memory flags through ``flags``);
6. per GPU: its region coordinator (the memory check over the monitor, the
   fail-closed check, the pools' freeze, the :class:`TenantEnder`) and its
   ``Gpu`` record;
7. the tenant lifecycle, to which the ender is then bound.

The one cycle, coordinator -> lifecycle -> GPUs -> coordinator (a
coordinator ends a tenant's command for what it did; the lifecycle ends
commands on every GPU), is broken by the ender port: the coordinators get
the port, the port gets the lifecycle once it exists, before any tenant.

What a failed start must clean up (the cgroup tree, gates, MPS daemons) is
recorded in :class:`Built` as it is made, so the daemon can undo a
half-made start.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

from krexd import adopt, gpus, paths, state_files, vendors
from krexd.activity import activity_source
from krexd.admission import Admission, GpuSlots
from krexd.cgroups import CgroupBackend
from krexd.cgroups.devices import DeviceIsolation
from krexd.config import Config
from krexd.coordinator import Coordinator
from krexd.driverlock import driver_lock_for
from krexd.gate import Gate
from krexd.gpu import Gpu
from krexd.gpus import AMD, GpuInfo
from krexd.isolation import (
    ActivityWitness,
    AffinityPinner,
    CgroupControl,
    EndCommand,
    ProcessLock,
)
from krexd.lifecycle import Lifecycle
from krexd.lock_ledger import LockLedger, ledger_path
from krexd.memory.monitor import MemoryMonitor
from krexd.memory.region_fit import RegionMemoryCheck
from krexd.memory.view import GpuMemory
from krexd.mps import MpsDaemon, MpsManager
from krexd.pool_freeze import PoolFreeze
from krexd.pools import PoolRegistry
from krexd.quotas import UidCaps
from krexd.registrations import RegionGuard, Verifier
from krexd.runtime import Runtime
from krexd.slices import CpuSlice, compute_slices
from krexd.slot_count import SlotChoice, choose
from krexd.slotflags import SlotFlags
from krexd.tenants import Tenant, TenantRegistry

_log = logging.getLogger("krexd")


class TenantEnder:
    """The coordinators' "end this tenant's command" port (``krexd.isolation.EndCommand``).

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
    """What the memory monitor reads and writes of one GPU (the ``Gpu`` record shares them)."""

    info: GpuInfo
    gate: Gate | None
    memory: GpuMemory
    slots: GpuSlots


@dataclass
class Built:
    """What exists so far of a start, for the undo of a start that fails midway."""

    cgroups: CgroupBackend | None = None
    gates: list[Gate] = field(default_factory=list)
    mps: list[MpsDaemon] = field(default_factory=list)
    memory: MemoryMonitor | None = None  # started: its source open, its loop running


@dataclass(frozen=True)
class Parts:
    """krexd's parts after :func:`assemble` (module docstring for the order)."""

    cgroups: CgroupBackend
    saved: adopt.Saved | None  # what a krexd before a restart left to adopt (None: nothing)
    gpus: dict[int, Gpu]
    admission: Admission
    memory: MemoryMonitor
    pools: PoolRegistry
    lifecycle: Lifecycle


def assemble(
    config: Config,
    runtime: Runtime,
    tenants: TenantRegistry,
    verifier: Verifier,
    flags: SlotFlags,
    mps: MpsManager,
    version: str,
    built: Built,
) -> Parts:
    """Build krexd's parts in dependency order (module docstring); ``built`` records what
    a failed start must undo.  Raises whatever a part's construction raises (CgroupError,
    GateError, ConfigError, OSError), after recording in ``built`` what exists."""
    infos, slices, cgroups, saved = _hardware(config, built)
    pools, pool_freeze = _pools(config, cgroups, version)
    slots = {i.index: _slots(config, i, slices[i.index]) for i in infos}
    admission = _admission(config, [s for s, _ in slots.values()])
    if paths.gate_library() is None:
        # Draining is skipped; CPU freezing and pinning still apply.
        _log.warning("no gate library (build libkrex_gate.so): GPU submissions are not gated")
    gates = {i.index: _gate(config, i.index, saved, built) for i in infos}
    views = {i.index: GpuMemory() for i in infos}
    memory = built.memory = MemoryMonitor(
        config.memory,
        [MonitoredGpu(i, gates[i.index][0], views[i.index], slots[i.index][0]) for i in infos],
        tenants,
        admission,
        runtime,
        state_files.learned_needs(config),
        on_gpu_users=pools.after_device_read,  # a pool on the GPU or over its tasks ends
        flags=flags,  # memory waits honoured: verified, bounded
    )
    memory.start()
    ender = TenantEnder()
    parts = _Coordinating(
        config,
        tenants,
        verifier,
        memory,
        pool_freeze,
        ender,
        driver_lock_for(config.region, config.daemon.fake_gpus, config.mps.enabled),
        activity_source(infos, config.daemon.fake_gpus),
    )
    by_index = {
        i.index: Gpu(
            i,
            slices[i.index],
            slots[i.index][0],
            parts.coordinator(i, gates[i.index][0], slices[i.index]),
            gate=gates[i.index][0],
            gate_path=gates[i.index][1],
            memory=views[i.index],
            mps=_mps(config, mps, i, built),
            slot_choice=slots[i.index][1],
        )
        for i in infos
    }
    # AMD GPUs found but not managed are hidden from every command (docs/design/amd.md).
    unmanaged = frozenset({AMD}) if cgroups.devices.unmanaged_render else frozenset()
    lifecycle = Lifecycle(
        config, runtime, by_index, tenants, admission, cgroups, memory, pools, unmanaged
    )
    ender.bind(lifecycle.kill_command)
    return Parts(cgroups, saved, by_index, admission, memory, pools, lifecycle)


def _admission(config: Config, slots: list[GpuSlots]) -> Admission:
    """Admission over every GPU's ``slots``, with the per-uid caps (``[admission]``)."""
    return Admission(
        slots,
        config.admission.max_parked,
        caps=UidCaps(
            config.admission.admitted_cap(sum(s.total for s in slots)),
            config.admission.max_parked_per_uid,
        ),
    )


def _hardware(
    config: Config, built: Built
) -> tuple[list[GpuInfo], dict[int, CpuSlice], CgroupBackend, adopt.Saved | None]:
    """Steps 1-2: the GPU inventory, their CPU slices (invalid ones refused), the cgroup
    tree with its device isolation, and what a krexd before a restart saved to adopt."""
    infos = gpus.discover(config.daemon.fake_gpus, config.daemon.fake_vendor)
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
    # Adopt the tenants of the krexd before a restart, or clean its tree (krexd/adopt.py).
    saved = adopt.load(config, cgroups, {i.index: i.uuid for i in infos})
    cgroups.prepare(slices, adopt=saved is not None)
    _log.info("cgroups: %s", cgroups.describe())
    return infos, slices, cgroups, saved


class _Coordinating:
    """What every GPU's coordinator shares: the cgroup control, the pinner, the memory
    check, the pools' freeze, the ender, the driver's lock and the activity source."""

    def __init__(
        self,
        config: Config,
        tenants: TenantRegistry,
        verifier: Verifier,
        memory: MemoryMonitor,
        pool_freeze: PoolFreeze | None,
        ender: TenantEnder,
        driver_lock: ProcessLock | None,
        activity: ActivityWitness | None,
    ) -> None:
        self.config = config
        self.tenants = tenants
        self.verifier = verifier
        self.memory = memory
        self.pool_freeze = pool_freeze
        self.ender = ender
        self.driver_lock = driver_lock
        self.control = CgroupControl(config.daemon.liveness_interval_ms / 1000)
        self.pinner = AffinityPinner()
        self.region_memory = RegionMemoryCheck(config.memory.region_wait_s, memory)
        self.activity = activity

    def coordinator(self, info: GpuInfo, gate: Gate | None, cpu_slice: CpuSlice) -> Coordinator:
        """GPU ``info``'s region coordinator over its gate (None: submissions not gated)."""
        cfg = self.config
        guard = None
        if gate is not None:
            gate.judge = self.verifier.judge
            # Who has the GPU open, from the memory source; "cannot tell" counts as "open"
            # where the shim does not gate the vendor's commands (krexd.vendors).
            guard = RegionGuard(
                functools.partial(self.memory.gpu_users, info.index),
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
    (``krexd.slot_count``), and how many were chosen and why (logged)."""
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
    config: Config, gpu: int, saved: adopt.Saved | None, built: Built
) -> tuple[Gate | None, str | None]:
    """GPU ``gpu``'s gate: the one a restart reopened, else a new one (``(None, None)``
    without ``libkrex_gate.so``: submissions are then not gated)."""
    reopened = saved.gates.get(gpu) if saved is not None else None
    gate: Gate | None
    path: str | None
    if reopened is not None:
        gate, path = reopened, reopened.path
    else:
        gate, path = state_files.create_gate(config, gpu)
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
