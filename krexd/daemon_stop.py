"""How krexd leaves: a stop (every tenant ended, the tree removed) or a restart (kept).

``Stopping`` is the part of ``krexd.daemon.Daemon`` that runs at the end:
``shutdown`` for a stop (SIGTERM, SIGINT), ``_leave_for_restart`` when
``krexd --prepare-restart`` marked the signal as a restart, and the cleanup
after a stop or a failed start.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from krexd.assembly import Built, Parts
from krexd.hardware.mps import MpsManager
from krexd.orchestration.faults import FaultMonitor
from krexd.restarts import restart
from krexd.server.server import Server
from krexd.system import procfs
from krexd.system.errors import Code
from krexd.system.notify import Notifier
from krexd.system.runtime import RunState, Runtime
from krexd.tenancy.tenants import TenantRegistry

_log = logging.getLogger("krexd")


class Stopping:
    """Shutdown, restart exit and cleanup over the daemon's parts (set by ``Daemon``).

    ``parts``: what ``krexd.assembly.assemble`` built (None: the start failed
    before); ``built``: what the start made so far, undone after a failed one.
    """

    runtime: Runtime
    notifier: Notifier
    server: Server | None
    continuity: restart.Continuity | None
    faults: FaultMonitor | None
    tenants: TenantRegistry
    mps: MpsManager
    parts: Parts | None
    built: Built

    def summary_line(self) -> str:
        """One line for STATUS= and the log (``Daemon`` defines it)."""
        raise NotImplementedError

    def _leave_for_restart(self) -> None:
        """Exit for a restart: save, close the socket unanswered, leave cgroups and gates."""
        self.runtime.change(RunState.RESTARTING)
        self.notifier.stopping()
        if self.server is not None:
            # Parked requests are not answered (clients re-send them); the socket file stays.
            self.server.close(unlink=False)
            self.server = None
        if self.continuity is not None:
            self.continuity.leave_for_restart()
        if self.faults is not None:
            self.faults.close()  # no MPS restart on the way out; open incidents are dropped
        if self.parts is not None:
            self.parts.memory.refresh.close()
        self._close_held_files()

    def _close_held_files(self) -> None:
        """Close the tenants' and the pools' held cgroup files and /proc stat descriptors."""
        for t in self.tenants:
            t.cgroup.close()
        for gpu in self.parts.gpus.values() if self.parts is not None else ():
            if gpu.coordinator.pool_freeze is not None:
                gpu.coordinator.pool_freeze.close()
        procfs.STAT_FILES.clear()
        procfs.HANDLES.clear()

    # --- shutdown -------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop serving new work, recover regions, end every tenant, remove cgroups."""
        parts = self.parts
        if parts is None:
            raise RuntimeError("shutdown before krexd's parts were built")
        self.runtime.change(RunState.STOPPING)
        self.notifier.stopping()
        _log.info("shutting down: %s", self.summary_line())
        parts.admission.cancel_all(Code.SHUTTING_DOWN, "krexd is stopping")
        for t in self.tenants:
            t.kill_reason = t.kill_reason or restart.STOPPED_REASON  # release answers it
        if self.faults is not None:
            self.faults.close()  # no MPS restart while the daemons are being stopped
        for gpu in parts.gpus.values():
            try:
                await gpu.coordinator.shutdown()
            except Exception:
                _log.exception("gpu%d: coordinator shutdown failed", gpu.index)
        ended = list(self.tenants)
        await asyncio.gather(
            *(parts.lifecycle.end(t, "krexd shutdown") for t in self.tenants),
            return_exceptions=True,
        )
        # Each krex run sees its command end and sends release: answer it with the reason.
        await self._await_releases(ended, 5.0)
        await parts.pools.close()
        if self.server is not None:
            await self.server.cancel_requests()
        self._stop_mps()  # after the tenants: no MPS client is left

    async def _await_releases(self, ended: list[Any], timeout_s: float) -> None:
        """Keep the ended tenants answerable until their launchers released them (bounded)."""
        for t in ended:
            if self.tenants.get(t.id) is None:
                self.tenants.add(t)  # EXITED: release only reads its kill_reason
        deadline = asyncio.get_running_loop().time() + timeout_s
        while ended and asyncio.get_running_loop().time() < deadline:
            # A tenant that never ran a command has no krex run waiting for its end.
            ended = [t for t in ended if t.pids and not t.told_end and _alive(t.launcher_pid)]
            await asyncio.sleep(0.05)

    def _stop_mps(self) -> None:
        """Stop every MPS daemon the start made (once)."""
        for daemon in self.built.mps:
            self.mps.stop(daemon)
        self.built.mps.clear()
        for gpu in self.parts.gpus.values() if self.parts is not None else ():
            gpu.mps = None

    async def _cleanup_after_failure(self) -> None:
        """Remove cgroups and gate files (also after a failed start)."""
        if self.parts is None and self.built.memory_source is not None:
            self.built.memory_source.close()  # a start that failed after the source opened
        self._stop_mps()
        self._close_held_files()
        if self.built.cgroups is not None:
            await self.built.cgroups.teardown()
        for gate in self.built.gates:
            try:
                gate.unmap()
            except Exception:
                _log.exception("unmapping the gate %s failed", gate.path)
            gate.unlink()
        _log.info("krexd stopped")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
