"""The krexd process: one asyncio loop holding every part (docs/design/interfaces.md).

Start order (each step logged; any failure stops the start with a message):

1. GPU inventory (``gpus``), CPU slices (``slices``; invalid ones refused).
2. cgroups: under systemd move into the ``supervisor`` leaf, thaw/kill/remove
   a stale tree, build ``<name>/gpu<N>`` with the slices.
3. Gates (one per GPU, ``<state_dir>/<cgroup name>-gpu<N>.gate``, when
   ``libkrex_gate.so`` is built) and one region coordinator per GPU.
4. Bind the control socket; only then READY=1 (krexd serves requests).

Shutdown (SIGTERM/SIGINT): STOPPING=1, parked requests answered
SHUTTING_DOWN, coordinators shut down (thaw, reopen), every tenant ended
(tree killed), cgroups removed, gate files and the socket removed.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import signal
import time
from collections.abc import Coroutine
from typing import Any

from krexd import __version__, gpus, paths
from krexd.admission import Admission
from krexd.cgroups import CgroupBackend
from krexd.config import Config
from krexd.coordinator import Coordinator
from krexd.errors import Code, KrexError
from krexd.gate import Gate
from krexd.isolation import AffinityPinner, CgroupControl
from krexd.lifecycle import Lifecycle
from krexd.mps import MpsManager
from krexd.notify import Notifier
from krexd.server import Server
from krexd.slices import CpuSlice, compute_slices
from krexd.tenants import TenantRegistry

_log = logging.getLogger("krexd")

STARTING = "starting"
SERVING = "running"
STOPPING = "stopping"


class Daemon:
    """Everything one krexd owns; op handlers receive it (see interfaces.md for attributes)."""

    def __init__(self, config: Config, notifier: Notifier | None = None) -> None:
        self.config = config
        self.version = __version__
        self.pid = os.getpid()
        self.started_at = time.monotonic()
        self.state = STARTING
        self.notifier = notifier or Notifier(None, None)
        self.gpus: list[gpus.GpuInfo] = []
        self.slices: dict[int, CpuSlice] = {}
        self.cgroups: CgroupBackend
        self.tenants = TenantRegistry()
        self.admission = Admission([], config.admission.slots_per_gpu)
        self.gates: dict[int, Gate] = {}
        self.gate_paths: dict[int, str] = {}
        self.coordinators: dict[int, Coordinator] = {}
        self.lifecycle = Lifecycle(self)
        self.mps = MpsManager(config.mps.control, config.daemon.gate_dir)
        self.server: Server | None = None
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- helpers used by ops -------------------------------------------------------

    def uptime_s(self) -> float:
        """Seconds since krexd started."""
        return round(time.monotonic() - self.started_at, 3)

    def check_serving(self) -> None:
        """Raise ``KrexError(SHUTTING_DOWN)`` once shutdown has begun."""
        if self.state == STOPPING:
            raise KrexError(Code.SHUTTING_DOWN, "krexd is stopping")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task kept alive until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def request_stop(self) -> None:
        """Begin shutdown (signal handler)."""
        self._stop.set()

    # --- start ----------------------------------------------------------------------

    def setup(self) -> None:
        """Steps 1-3 of the start order (synchronous; raises on invalid setup)."""
        cfg = self.config
        self.gpus = gpus.discover(cfg.daemon.fake_gpus)
        _log.info("GPUs: %s", ", ".join(g.name for g in self.gpus) or "none")
        self.slices = compute_slices(self.gpus, cfg.cpu)
        for s in self.slices.values():
            _log.info("gpu%d slice %s", s.gpu, s.as_dict())
        self.cgroups = CgroupBackend.open(cfg.cgroup)
        self.cgroups.prepare(self.slices)
        _log.info("cgroups: %s", self.cgroups.describe())
        self.admission = Admission(
            [g.index for g in self.gpus], cfg.admission.slots_per_gpu, cfg.admission.max_parked
        )
        self._setup_gates()
        if cfg.mps.enabled:
            # Paper §6.5: MPS lets off-region kernels of co-tenants share the GPU.
            self.mps.start([g.index for g in self.gpus])

    def _setup_gates(self) -> None:
        """One gate and one region coordinator per GPU.

        Without ``libkrex_gate.so`` (not built) coordinators get no gate: GPU
        submissions are then not gated; draining is skipped and CPU freezing
        and pinning still apply.  krexd says so at start.
        """
        if paths.gate_library() is None:
            _log.warning("no gate library (build libkrex_gate.so): GPU submissions are not gated")
        else:
            gate_dir = self.config.daemon.gate_dir
            os.makedirs(gate_dir, mode=0o755, exist_ok=True)
            for g in self.gpus:
                # Named after the cgroup tree too: krexds sharing a state directory
                # (different [cgroup] names, which the tree lock enforces) never share a gate.
                path = os.path.join(gate_dir, f"{self.config.cgroup.name}-gpu{g.index}.gate")
                # Who may map the gate is who may talk to krexd: the socket's mode and group.
                mode = self.config.daemon.socket_mode
                self.gates[g.index] = Gate.create(path, g.index, mode=mode)
                group = self.config.daemon.socket_group
                try:
                    if group:
                        os.chown(path, -1, grp.getgrnam(group).gr_gid)
                except KeyError:
                    pass  # binding the socket refuses the unknown group, with the key's name
                self.gate_paths[g.index] = path
        for g in self.gpus:
            self.coordinators[g.index] = Coordinator(
                g.index,
                self.gates.get(g.index),
                self.slices[g.index],
                self.tenants,
                self.config.region,
                CgroupControl(self.config.daemon.liveness_interval_ms / 1000),
                AffinityPinner(),
            )

    def summary_line(self) -> str:
        """One line for STATUS= and the log."""
        used = sum(self.admission.used.values())
        total = sum(self.admission.slots.values())
        return (
            f"{len(self.gpus)} GPU(s), {len(self.tenants)} tenant(s), slots {used}/{total}, "
            f"{len(self.admission.parked)} parked"
        )

    async def run(self) -> None:
        """Start, serve until asked to stop, shut down cleanly."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: _log.info("SIGHUP ignored"))
        server = Server(self)
        server.check_free()  # before any cgroup is touched
        try:
            self.setup()
            self.server = server
            self.server.bind()
            serve = self.spawn(self.server.serve())
            self.state = SERVING
            self.notifier.ready(f"serving {self.config.daemon.socket}: {self.summary_line()}")
            _log.info("krexd %s ready (pid %d)", self.version, self.pid)
            watchdog = self.spawn(self.notifier.watchdog_loop())
            status = self.spawn(self._status_loop())
            await self._stop.wait()
            await self.shutdown()
            for t in (serve, watchdog, status):
                t.cancel()
        finally:
            if self.server is not None:
                self.server.close()
            await self._cleanup_after_failure()

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.notifier.status(self.summary_line())

    # --- shutdown -------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop serving new work, recover regions, end every tenant, remove cgroups."""
        self.state = STOPPING
        self.notifier.stopping()
        _log.info("shutting down: %s", self.summary_line())
        self.admission.cancel_all(Code.SHUTTING_DOWN, "krexd is stopping")
        for gpu, coordinator in self.coordinators.items():
            try:
                await coordinator.shutdown()
            except Exception:
                _log.exception("gpu%d: coordinator shutdown failed", gpu)
        await asyncio.gather(
            *(self.lifecycle.end(t, "krexd shutdown") for t in self.tenants),
            return_exceptions=True,
        )
        if self.server is not None:
            await self.server.cancel_requests()
        self.mps.stop()  # after the tenants: no MPS client is left

    async def _cleanup_after_failure(self) -> None:
        """Remove cgroups and gate files (also after a failed start)."""
        self.mps.stop()
        if hasattr(self, "cgroups"):
            await self.cgroups.teardown()
        for gpu, gate in self.gates.items():
            try:
                gate.unmap()
            except Exception:
                _log.exception("gpu%d: unmapping the gate failed", gpu)
        for path in self.gate_paths.values():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        _log.info("krexd stopped")

    # --- status -------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ``status`` op's reply body (documented in krexd/control/status.py)."""
        gpus_out = []
        for g in self.gpus:
            coord = self.coordinators.get(g.index)
            region = coord.status() if coord is not None else None
            held = region.get("holder") if isinstance(region, dict) else None
            holder = held.get("tenant") if isinstance(held, dict) else held
            gpus_out.append(
                {
                    "index": g.index,
                    "name": g.name,
                    "fake": g.fake,
                    "total_mem_bytes": g.total_mem_bytes,
                    "slice": self.slices[g.index].as_dict() if g.index in self.slices else None,
                    "slots_used": self.admission.used.get(g.index, 0),
                    "slots_total": self.admission.slots.get(g.index, 0),
                    "exclusive": g.index in self.admission.exclusive_on,
                    "tenants": [t.id for t in self.tenants.on_gpu(g.index)],
                    "gate": self.gate_paths.get(g.index),
                    "holder": holder,
                    "region": region,
                }
            )
        return {
            "version": self.version,
            "pid": self.pid,
            "uptime_s": self.uptime_s(),
            "state": self.state,
            "socket": self.config.daemon.socket,
            "config": self.config.source,
            "cgroups": self.cgroups.describe() if hasattr(self, "cgroups") else None,
            "gpus": gpus_out,
            "tenants": [t.summary() for t in self.tenants],
            "queue": self.admission.status(),
        }
