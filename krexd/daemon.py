"""The krexd process: runs the assembly, adoption, the loop and the stop order.

The parts never see the daemon: each gets the narrow interfaces it uses.
The start order and the shutdown: docs/design/daemon.md "Parts and wiring".
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

from krexd import __version__, assembly
from krexd.assembly import Built, Parts
from krexd.cgroups import CgroupBackend
from krexd.config.config import Config
from krexd.control.context import OpContext
from krexd.daemon_stop import Stopping
from krexd.hardware.mps import MpsManager
from krexd.memory.status import MemoryStatus
from krexd.orchestration.faults import FaultMonitor
from krexd.orchestration.gatewatch import GateWatch
from krexd.orchestration.gpu import Gpu
from krexd.orchestration.lifecycle import Lifecycle
from krexd.pools.registry import PoolRegistry
from krexd.restarts import adopt, restart
from krexd.restarts.counters import DaemonCounters
from krexd.server import status_report
from krexd.server.metrics import MetricsServer
from krexd.server.server import Server, check_free
from krexd.system.notify import Notifier
from krexd.system.runtime import RunState, Runtime
from krexd.tenancy.admission import Admission
from krexd.tenancy.registration_flags import WAIT_GRACE_S, RegistrationFlags
from krexd.tenancy.registrations import Verifier
from krexd.tenancy.tenants import TenantRegistry

_log = logging.getLogger("krexd")


class Daemon(Stopping):
    """Builds krexd's parts (``krexd.assembly``), runs the event loop until asked to stop."""

    def __init__(self, config: Config, notifier: Notifier | None = None) -> None:
        self.config = config
        self.version = __version__
        self.pid = os.getpid()
        self.runtime = Runtime()
        self.notifier = notifier or Notifier(None, None)
        self.tenants = TenantRegistry()
        self.mps = MpsManager(config.mps.control, config.daemon.gate_dir)
        self.verifier = Verifier(self._cgroup_pids)
        # Which flags of the slot memories are honoured (verified, bounded).
        self.flags = RegistrationFlags(
            self.verifier, self.tenants, config.memory.oom_wait_s + WAIT_GRACE_S
        )
        self.counters = DaemonCounters()  # restarts and adoptions (krexd.restarts.counters)
        self.built = Built()  # what a start made so far: undone when it fails
        self.parts: Parts | None = None  # krexd.assembly's record, once setup() made it
        self.continuity: restart.Continuity | None = None  # state, heartbeat, watchdog
        self.faults: FaultMonitor | None = None  # [mps] enabled: the MPS servers' faults
        self.server: Server | None = None
        self.metrics: MetricsServer | None = None  # [metrics] enabled: the endpoint
        self._stop = asyncio.Event()

    def request_stop(self) -> None:
        """Begin shutdown (signal handler)."""
        self._stop.set()

    # --- the parts, as the reports and the stop read them ---------------------------

    @property
    def gpus(self) -> dict[int, Gpu]:
        """One record per managed GPU (empty before :meth:`setup`)."""
        return self.parts.gpus if self.parts is not None else {}

    @property
    def cgroups(self) -> CgroupBackend | None:
        """The cgroup tree (None before a start opened it)."""
        return self.built.cgroups

    @property
    def admission(self) -> Admission:
        """Admission over every GPU's slots (raises before :meth:`setup`)."""
        return self._parts().admission

    @property
    def memory(self) -> MemoryStatus | None:
        """GPU memory as status reports it (None before :meth:`setup`)."""
        return self.parts.memory.status if self.parts is not None else None

    @property
    def pools(self) -> PoolRegistry | None:
        """The warm pools' registry (None before :meth:`setup`)."""
        return self.parts.pools if self.parts is not None else None

    @property
    def lifecycle(self) -> Lifecycle | None:
        """The tenant lifecycle (None before :meth:`setup`)."""
        return self.parts.lifecycle if self.parts is not None else None

    def _parts(self) -> Parts:
        if self.parts is None:
            raise RuntimeError("krexd's parts are not built yet")
        return self.parts

    # --- start ----------------------------------------------------------------------

    def setup(self) -> OpContext:
        """Steps 1-3 of the start order; returns what the ops get (raises on invalid setup)."""
        parts = self.parts = assembly.assemble(
            self.config,
            self.runtime,
            self.tenants,
            self.verifier,
            self.flags,
            self.mps,
            self.version,
            self.built,
        )
        if parts.saved is not None:
            adopted = adopt.adopt(
                parts.saved,
                self.tenants,
                parts.gpus,
                parts.admission,
                parts.lifecycle,
                parts.cgroups,
                self.runtime,
            )
            self.counters.adopted(parts.saved.doc, adopted)
        for gpu in parts.gpus.values():
            # Processes a crashed krexd left locked: the adopted region's, or unlocked now.
            gpu.coordinator.settle_locks()
        self._start_continuity(parts)
        return OpContext(
            tenants=self.tenants,
            lifecycle=parts.lifecycle,
            memory=parts.memory.records,
            regions=parts.regions,
            about=self.about,
            status=self.status,
            faults=self.faults,
            pools=parts.pools,
            check_serving=self.runtime.check_serving,
        )

    def _start_continuity(self, parts: Parts) -> None:
        """Restart continuity (state, heartbeat, watchdog); under MPS, the fault monitor."""
        cfg = self.config
        self.continuity = restart.Continuity(
            cfg, parts.cgroups.root, self.tenants, parts.gpus, restarts=self.counters.restarts
        )
        if cfg.mps.enabled:  # GPU-wide faults of the MPS servers (docs/design/faults.md)
            # After a restart, fault records in the reopened gates' slots reopen an incident.
            self.faults = FaultMonitor(
                parts.gpus, self.tenants, parts.admission, self.mps, self.flags
            )
            self.faults.start(self.runtime.spawn)

    def _cgroup_pids(self, tenant_id: int) -> list[int] | None:
        """The pids of tenant ``tenant_id``'s cgroup (None for an unknown tenant)."""
        tenant = self.tenants.get(tenant_id)
        return tenant.cgroup.pids() if tenant is not None else None

    def summary_line(self) -> str:
        """One line for STATUS= and the log (krexd/server/status_report.py)."""
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
            ctx = self.setup()
            assert self.continuity is not None
            # The state a restart adopts is saved after each op, before its reply.
            self.server = Server(self.config.daemon, ctx, after_op=self.continuity.keeper.save)
            self.server.bind()
            if self.config.metrics.enabled:  # read in its own thread, at scrape time
                self.metrics = MetricsServer(self.config.metrics, self)
                self.metrics.start()
            spawn = self.runtime.spawn
            self.continuity.start()
            keep = spawn(self.continuity.loop())
            serve = spawn(self.server.serve())
            self.runtime.change(RunState.SERVING)
            self.notifier.ready(f"serving {self.config.daemon.socket}: {self.summary_line()}")
            _log.info("krexd %s ready (pid %d)", self.version, self.pid)
            watchdog = spawn(self.notifier.watchdog_loop())
            status = spawn(self._status_loop())
            claims = self.faults.held_too_long if self.faults is not None else None
            watch = GateWatch(
                self.gpus,
                self.tenants,
                self.verifier,
                self._parts().lifecycle.kill_command,
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
            if self.runtime.state != RunState.RESTARTING:
                if self.continuity is not None:
                    self.continuity.full_stop()
                await self._cleanup_after_failure()

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.notifier.status(self.summary_line())

    # --- status -------------------------------------------------------------------

    def about(self) -> dict[str, Any]:
        """The ``ping`` op's reply body (krexd/server/status_report.py)."""
        return status_report.about(self)

    def status(self) -> dict[str, Any]:
        """The ``status`` op's reply body (docs/design/interfaces.md "Control plane")."""
        return status_report.status(self)
