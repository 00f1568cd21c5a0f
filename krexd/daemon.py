"""The krexd process: the composition root that builds and wires the parts and runs the loop.

Start order (each step logged; any failure stops the start with a message):

1. GPU inventory (``gpus``), CPU slices (``slices``; invalid ones refused).
2. cgroups: under systemd move into the ``supervisor`` leaf, thaw/kill/remove
   a stale tree, build ``<name>/gpu<N>`` with the slices; probe device
   isolation (``[gpu] device_isolation``, krexd/cgroups/devices.py).
3. One ``krexd.gpu.Gpu`` per GPU: its gate (``<state_dir>/<cgroup
   name>-gpu<N>.gate``, root's, mode 0644, its space reserved — a full
   file system stops the start with one line naming the directory — and a
   second link under ``<state_dir>/.krex-keep/``, when ``libkrex_gate.so``
   is built), its region coordinator with the fail-closed check
   (``krexd.registrations``), its admission slots, its MPS daemon
   (``[mps] enabled``); then admission, the memory monitor and the tenant
   lifecycle over them, and the gate watch (``krexd.gatewatch``).
4. Bind the control socket; only then READY=1 (krexd serves requests).

The parts never see the daemon: each gets the narrow interfaces it uses
(``krexd.isolation`` for the coordinators, ``krexd.runtime.Runtime``,
``krexd.control.context.OpContext`` for the ops).

Shutdown (SIGTERM/SIGINT): STOPPING=1, parked requests answered
SHUTTING_DOWN, coordinators shut down (thaw, reopen), every tenant ended
(tree killed), cgroups removed, gate files and the socket removed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from krexd import __version__, adopt, gpus, paths, restart, state_files, status_report, vendors
from krexd.activity import activity_source
from krexd.admission import Admission, GpuSlots
from krexd.cgroups import CgroupBackend
from krexd.cgroups.devices import DeviceIsolation
from krexd.config import Config
from krexd.control.context import OpContext
from krexd.coordinator import Coordinator
from krexd.counters import DaemonCounters
from krexd.daemon_stop import Stopping
from krexd.driverlock import driver_lock_for
from krexd.faults import FaultMonitor
from krexd.gate import Gate
from krexd.gatewatch import GateWatch
from krexd.gpu import Gpu
from krexd.gpus import GpuInfo
from krexd.isolation import AffinityPinner, CgroupControl
from krexd.lifecycle import Lifecycle
from krexd.lock_ledger import LockLedger, ledger_path
from krexd.memory.monitor import MemoryMonitor
from krexd.memory.region_fit import RegionMemoryCheck
from krexd.metrics import MetricsServer
from krexd.mps import MpsManager
from krexd.notify import Notifier
from krexd.pool_freeze import PoolFreeze
from krexd.pools import PoolRegistry
from krexd.quotas import UidCaps
from krexd.registrations import RegionGuard, Verifier
from krexd.runtime import RESTARTING, SERVING, Runtime
from krexd.server import Server, check_free
from krexd.slices import CpuSlice, compute_slices
from krexd.slot_count import SlotChoice, choose
from krexd.slotflags import WAIT_GRACE_S, SlotFlags
from krexd.tenants import TenantRegistry

_log = logging.getLogger("krexd")


class Daemon(Stopping):
    """Builds krexd's parts, wires them, runs the event loop until asked to stop."""

    def __init__(self, config: Config, notifier: Notifier | None = None) -> None:
        self.config = config
        self.version = __version__
        self.pid = os.getpid()
        self.runtime = Runtime()
        self.notifier = notifier or Notifier(None, None)
        self.gpus: dict[int, Gpu] = {}
        self.cgroups: CgroupBackend | None = None
        self.tenants = TenantRegistry()
        self.admission = Admission([])
        self.mps = MpsManager(config.mps.control, config.daemon.gate_dir)
        self.memory: MemoryMonitor | None = None
        self.faults: FaultMonitor | None = None
        self.lifecycle: Lifecycle | None = None
        self.pools: PoolRegistry | None = None
        self.server: Server | None = None
        self.continuity: restart.Continuity | None = None  # state, heartbeat, watchdog
        self.verifier = Verifier(self._cgroup_pids)
        # Which flags of the slot memories are honoured (verified, bounded).
        self.flags = SlotFlags(self.verifier, self.tenants, config.memory.oom_wait_s + WAIT_GRACE_S)
        self.counters = DaemonCounters()  # restarts and adoptions (krexd.counters)
        self.metrics: MetricsServer | None = None  # [metrics] enabled: the endpoint
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        """Begin shutdown (signal handler)."""
        self._stop.set()

    # --- start ----------------------------------------------------------------------

    def setup(self) -> OpContext:
        """Steps 1-3 of the start order; returns what the ops get (raises on invalid setup)."""
        infos, slices = self._discover()
        cgroups, saved = self._open_cgroups(infos, slices)
        region_memory = self._build_gpus(infos, slices, saved)
        memory, lifecycle = self._build_tenant_parts(cgroups, region_memory)
        if saved is not None:
            adopted = adopt.adopt(
                saved, self.tenants, self.gpus, self.admission, lifecycle, cgroups, self.runtime
            )
            self.counters.adopted(saved.doc, adopted)
        for gpu in self.gpus.values():
            # Processes a crashed krexd left locked: the adopted region's, or unlocked now.
            gpu.coordinator.settle_locks()
        self._start_continuity(cgroups)
        by_index = self.gpus
        return OpContext(
            tenants=self.tenants,
            lifecycle=lifecycle,
            memory=memory,
            regions=lambda index: by_index[index].coordinator,
            about=self.about,
            status=self.status,
            faults=self.faults,
            pools=self.pools,
            check_serving=self.runtime.check_serving,
        )

    def _discover(self) -> tuple[list[gpus.GpuInfo], dict[int, CpuSlice]]:
        """Step 1: the GPU inventory and the CPU slices (invalid ones refused)."""
        cfg = self.config
        infos = gpus.discover(cfg.daemon.fake_gpus, cfg.daemon.fake_vendor)
        _log.info("GPUs: %s", ", ".join(f"{g.name} ({g.vendor})" for g in infos) or "none")
        slices = compute_slices(infos, cfg.cpu)
        for s in slices.values():
            _log.info("gpu%d slice %s", s.gpu, s.as_dict())
        return infos, slices

    def _open_cgroups(
        self, infos: list[gpus.GpuInfo], slices: dict[int, CpuSlice]
    ) -> tuple[CgroupBackend, adopt.Saved | None]:
        """Step 2: the cgroup tree, and what a krexd before a restart left to adopt."""
        cfg = self.config
        cgroups = self.cgroups = CgroupBackend.open(cfg.cgroup)
        # Adopt the tenants of the krexd before a restart, or clean its tree (krexd/adopt.py).
        saved = adopt.load(cfg, cgroups, {i.index: i.uuid for i in infos})
        cgroups.devices = DeviceIsolation(cfg.gpu.device_isolation, **vendors.device_minors(infos))
        cgroups.prepare(slices, adopt=saved is not None)
        _log.info("cgroups: %s", cgroups.describe())
        return cgroups, saved

    def _build_gpus(
        self,
        infos: list[gpus.GpuInfo],
        slices: dict[int, CpuSlice],
        saved: adopt.Saved | None,
    ) -> RegionMemoryCheck:
        """Step 3, per GPU: its gate, region coordinator, admission slots and MPS daemon.

        Returns the coordinators' memory check; its monitor is attached once
        the memory monitor exists (:meth:`_build_tenant_parts`).
        """
        cfg = self.config
        if paths.gate_library() is None:
            # Without a gate, submissions are not gated: draining is skipped, CPU
            # freezing and pinning still apply.
            _log.warning("no gate library (build libkrex_gate.so): GPU submissions are not gated")
        control = CgroupControl(cfg.daemon.liveness_interval_ms / 1000)
        pinner = AffinityPinner()
        region_memory = RegionMemoryCheck(cfg.memory.region_wait_s)  # monitor attached below
        verifier = self.verifier = Verifier(self._cgroup_pids)
        proc_lock = self.driver_lock = driver_lock_for(
            cfg.region, cfg.daemon.fake_gpus, cfg.mps.enabled
        )
        activity = activity_source(infos, cfg.daemon.fake_gpus)
        for info in infos:
            reopened = saved.gates.get(info.index) if saved is not None else None
            gate, gate_path = (
                (reopened, reopened.path) if reopened else state_files.create_gate(cfg, info.index)
            )
            guard = None
            if gate is not None:
                gate.judge = verifier.judge
                guard = self._guard(info, gate)
            coordinator = Coordinator(
                info.index,
                gate,
                slices[info.index],
                self.tenants,
                cfg.region,
                control,
                pinner,
                region_memory,
                guard=guard,
                end_command=self._kill_command,
                proc_lock=proc_lock if vendors.of(info).driver_lock else None,
                ledger=LockLedger(
                    ledger_path(cfg.daemon.gate_dir, cfg.cgroup.name, info.index), info.index
                ),
                activity=activity,
            )
            chosen = _slot_choice(cfg, info, slices[info.index])  # how many slots, and why
            gpu = Gpu(info, slices[info.index], GpuSlots(info.index, chosen.total), coordinator)
            gpu.gate, gpu.gate_path, gpu.slot_choice = gate, gate_path, chosen
            self.gpus[info.index] = gpu
        if cfg.mps.enabled:
            # Paper §6.5: MPS lets off-region kernels of co-tenants share the GPU.
            for gpu in self.gpus.values():
                if not vendors.of(gpu.info).mps:
                    _log.info("gpu%d (%s): MPS is NVIDIA's; none here", gpu.index, gpu.info.vendor)
                    continue
                gpu.mps = self.mps.start(gpu.index, gpu.info.uuid)
        return region_memory

    def _build_tenant_parts(
        self, cgroups: CgroupBackend, region_memory: RegionMemoryCheck
    ) -> tuple[MemoryMonitor, Lifecycle]:
        """Step 3, over the GPUs: admission, the memory monitor (started), the lifecycle."""
        cfg = self.config
        self.admission = Admission(
            [g.slots for g in self.gpus.values()],
            cfg.admission.max_parked,
            caps=UidCaps(
                cfg.admission.admitted_cap(sum(g.slots.total for g in self.gpus.values())),
                cfg.admission.max_parked_per_uid,
            ),
        )
        memory = self.memory = MemoryMonitor(
            cfg.memory,
            list(self.gpus.values()),
            self.tenants,
            self.admission,
            self.runtime,
            state_files.learned_needs(cfg),
        )
        memory.start()
        region_memory.monitor = memory
        self.pools = self._pools(cgroups)
        memory.on_gpu_users = self.pools.check_gpu_users  # a pool on the GPU is ended
        memory.flags = self.flags  # memory waits honoured: verified, bounded
        lifecycle = self.lifecycle = Lifecycle(
            cfg, self.runtime, self.gpus, self.tenants, self.admission, cgroups, memory, self.pools
        )
        return memory, lifecycle

    def _start_continuity(self, cgroups: CgroupBackend) -> None:
        """Restart continuity (state, heartbeat, watchdog); under MPS, the fault monitor."""
        cfg = self.config
        self.continuity = restart.Continuity(cfg, cgroups.root, self.tenants, self.gpus)
        self.continuity.keeper.restarts = self.counters.restarts
        if cfg.mps.enabled:  # GPU-wide faults of the MPS servers (docs/design/faults.md)
            # After a restart, fault records in the reopened gates' slots reopen an incident.
            self.faults = FaultMonitor(
                self.gpus, self.tenants, self.admission, self.mps, self.flags
            )
            self.faults.start(self.runtime.spawn)

    def _pools(self, cgroups: CgroupBackend) -> PoolRegistry:
        """Warm pools (``[warm]``): their cgroup directory, emptied of pools of an earlier krexd."""
        cfg = self.config
        pool_cgroups = cgroups.pools(cfg.warm.memory_max, cfg.warm.pool_tasks())
        if cfg.warm.enabled:
            pool_cgroups.prepare()
            pool_cgroups.sweep(set())
            freeze = PoolFreeze(pool_cgroups.dir)  # every region freezes the pools too
            freeze.reset()
            for gpu in self.gpus.values():
                gpu.coordinator.pool_freeze = freeze
        poll_s = cfg.daemon.liveness_interval_ms / 1000
        return PoolRegistry(cfg.warm, pool_cgroups, self.version, poll_s)

    def _cgroup_pids(self, tenant_id: int) -> list[int] | None:
        """The pids of tenant ``tenant_id``'s cgroup (None for an unknown tenant)."""
        tenant = self.tenants.get(tenant_id)
        return tenant.cgroup.pids() if tenant is not None else None

    def _guard(self, info: GpuInfo, gate: Gate) -> RegionGuard:
        """The fail-closed check of ``info``'s region entry: who has the GPU open from the
        memory source; "cannot tell" counts as "open" where the shim does not gate the
        vendor's commands (``krexd.vendors``)."""
        return RegionGuard(
            self._users_of(info.index),
            gate.live_registrations,
            unknown_is_open=not vendors.of(info).shim_gated,
        )

    def _users_of(self, gpu: int) -> Any:
        """Who has GPU ``gpu`` open, read afresh from the memory source."""

        def users() -> set[int] | None:
            return self.memory.gpu_users(gpu) if self.memory is not None else None

        return users

    def _kill_command(self, tenant: Any, reason: str, exit_code: int, cause: str = "other") -> None:
        if self.lifecycle is not None:
            self.lifecycle.kill_command(tenant, reason, exit_code, cause)

    def summary_line(self) -> str:
        """One line for STATUS= and the log (krexd/status_report.py)."""
        return status_report.summary_line(self)

    def problems(self) -> dict[str, str]:
        """What is wrong now, by part (empty: healthy); shown by status and STATUS=."""
        return status_report.problems(self)

    async def run(self) -> None:
        """Start, serve until asked to stop, shut down cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: _log.info("SIGHUP ignored"))
        check_free(self.config.daemon.socket)  # before any cgroup is touched
        try:
            self.server = Server(self.config.daemon, self.setup())
            self.server.bind()
            if self.config.metrics.enabled:  # read in its own thread, at scrape time
                self.metrics = MetricsServer(self.config.metrics, self)
                self.metrics.start()
            spawn = self.runtime.spawn
            assert self.continuity is not None
            self.continuity.start()
            self.server.after_op = self.continuity.keeper.save  # saved before each reply
            keep = spawn(self.continuity.loop())
            serve = spawn(self.server.serve())
            self.runtime.state = SERVING
            self.notifier.ready(f"serving {self.config.daemon.socket}: {self.summary_line()}")
            _log.info("krexd %s ready (pid %d)", self.version, self.pid)
            watchdog = spawn(self.notifier.watchdog_loop())
            status = spawn(self._status_loop())
            claims = self.faults.held_too_long if self.faults is not None else None
            watch = GateWatch(
                self.gpus,
                self.tenants,
                self.verifier,
                self._kill_command,
                flags=self.flags,
                fault_claims=claims,
            )
            gates = spawn(watch.run())
            await self._stop.wait()
            gates.cancel()
            if restart.take_restart_intent(self.config):
                self._leave_for_restart()  # tenants keep running; the successor adopts them
                return
            await self.shutdown()
            for t in (serve, watchdog, status, keep):
                t.cancel()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
            if self.server is not None:
                self.server.close()
            if self.runtime.state != RESTARTING:
                if self.continuity is not None:
                    self.continuity.full_stop()
                await self._cleanup_after_failure()

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.notifier.status(self.summary_line())

    # --- status -------------------------------------------------------------------

    def about(self) -> dict[str, Any]:
        """The ``ping`` op's reply body (krexd/status_report.py)."""
        return status_report.about(self)

    def status(self) -> dict[str, Any]:
        """The ``status`` op's reply body (documented in krexd/control/status.py)."""
        return status_report.status(self)


def _slot_choice(cfg: Config, info: gpus.GpuInfo, cpu_slice: CpuSlice) -> SlotChoice:
    """GPU ``info``'s slots from ``[admission] slots_per_gpu`` (``krexd.slot_count``), logged."""
    chosen = choose(
        cfg.admission.slots_per_gpu,
        len(cpu_slice.tenant_cores),
        info.total_mem_bytes,
        cfg.memory.default_need,
        cfg.memory.headroom,
    )
    _log.info("gpu%d: slots %s", info.index, chosen.rule)
    return chosen
