"""Tenant life cycle: admit (slot + cgroup), place (pid into the cgroup), end (reclaim).

``end`` is the single way out for a tenant, whatever the reason (release, its
launcher died, shutdown): the coordinator recovers a region it may hold
(``tenant_gone``), the tree is killed, the cgroup removed, the memory record
completed, the slot and the memory reservation freed and parked requests
granted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from krexd import paths, states
from krexd.cgroups import CgroupError
from krexd.errors import Code, KrexError
from krexd.memory import MemoryMonitor
from krexd.states import change_state
from krexd.tenants import PidWatch, Tenant

if TYPE_CHECKING:
    from krexd.daemon import Daemon

_log = logging.getLogger("krexd.lifecycle")

EMPTY_TIMEOUT_S = 5.0


class Lifecycle:
    """Creates and ends the tenants of ``daemon``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._watches: dict[int, PidWatch] = {}
        self._ending: dict[int, asyncio.Task[None]] = {}
        # Liveness poll period where pidfds are unavailable ([daemon] liveness_interval_ms).
        self.poll_s = daemon.config.daemon.liveness_interval_ms / 1000
        self._memory: MemoryMonitor | None = None

    @property
    def memory(self) -> MemoryMonitor:
        """The memory monitor, started on first use (after the daemon's setup)."""
        if self._memory is None:
            self._memory = MemoryMonitor(self.daemon)
            self._memory.start()
        return self._memory

    async def admit(
        self,
        argv: list[str],
        gpu: int | None,
        exclusive: bool,
        launcher_pid: int,
        mem_bytes: int | None = None,
    ) -> Tenant:
        """Park until admission grants a GPU, then create the tenant and its cgroup.

        ``mem_bytes`` is the memory need declared with ``krex run --mem``
        (bytes; None: the configured default need).
        """
        d = self.daemon
        d.check_serving()
        record = self.memory.need_for(mem_bytes, gpu)
        need = record.need_bytes
        waiter = d.admission.park(gpu, exclusive, launcher_pid, argv, need)
        watch = PidWatch(
            launcher_pid,
            lambda: d.admission.cancel(waiter, Code.CANCELLED, "launcher exited while parked"),
            self.poll_s,
        )
        try:
            granted = await asyncio.shield(waiter.future)
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.exception():
                d.admission.release(waiter.future.result(), exclusive, need)
            else:
                d.admission.cancel(waiter, Code.CANCELLED, "request cancelled")
            raise
        finally:
            watch.cancel()
        try:
            d.check_serving()
            tid = d.tenants.new_id()
            cgroup = d.cgroups.create_tenant(granted, tid)
        except BaseException:
            d.admission.release(granted, exclusive, need)
            raise
        tenant = Tenant(
            id=tid,
            token=d.tenants.new_token(),
            gpu=granted,
            argv=argv,
            launcher_pid=launcher_pid,
            cgroup=cgroup,
            exclusive=exclusive,
            memory=record,
        )
        d.tenants.add(tenant)
        self._watches[tid] = PidWatch(
            launcher_pid, lambda: self._launcher_gone(tenant), self.poll_s
        )
        coordinator = d.coordinators.get(granted)
        if coordinator is not None:
            # A command admitted during a region starts frozen (it is a sibling).
            await coordinator.tenant_added(tenant)
        _log.info("t%d admitted on gpu%d: %s", tid, granted, " ".join(argv)[:200])
        return tenant

    def _launcher_gone(self, tenant: Tenant) -> None:
        if tenant.state != states.EXITED and tenant.id not in self._ending:
            _log.warning(
                "t%d: launcher %d died; reclaiming its slot", tenant.id, tenant.launcher_pid
            )
            self.daemon.spawn(self.end(tenant, "launcher died"))

    def place(self, tenant: Tenant, pid: int) -> None:
        """Move ``pid`` (a child of the tenant's launcher) into the tenant's cgroup(s)."""
        self.daemon.check_serving()
        if tenant.state not in (states.ADMITTED, states.RUNNING):
            raise KrexError(Code.BAD_FIELD, f"tenant {tenant.id} is {tenant.state}; cannot place")
        ppid = _parent_of(pid)
        if ppid is None:
            raise KrexError(Code.BAD_FIELD, f"pid {pid} does not exist")
        if ppid != tenant.launcher_pid and pid != tenant.launcher_pid:
            raise KrexError(
                Code.BAD_FIELD, f"pid {pid} is not a child of launcher {tenant.launcher_pid}"
            )
        try:
            tenant.cgroup.add_pid(pid)
        except CgroupError as exc:
            raise KrexError(Code.INTERNAL, f"cannot place pid {pid}: {exc}") from None
        tenant.pids.add(pid)
        if tenant.state == states.ADMITTED:
            change_state(tenant, states.RUNNING)  # ADMITTED -> RUNNING
        _log.info("t%d: placed pid %d in %s", tenant.id, pid, tenant.cgroup.path)

    async def end(self, tenant: Tenant, reason: str) -> None:
        """End ``tenant`` once (later calls wait for the first): recover, kill, free the slot."""
        running = self._ending.get(tenant.id)
        if running is None:
            running = asyncio.ensure_future(self._end(tenant, reason))
            self._ending[tenant.id] = running
        await asyncio.shield(running)

    async def _end(self, tenant: Tenant, reason: str) -> None:
        d = self.daemon
        watch = self._watches.pop(tenant.id, None)
        if watch is not None:
            watch.cancel()
        try:
            coordinator = d.coordinators.get(tenant.gpu)
            if coordinator is not None:
                try:
                    await coordinator.tenant_gone(tenant)
                except Exception:
                    _log.exception("t%d: coordinator recovery failed", tenant.id)
            try:
                tenant.cgroup.kill()
                if not await tenant.cgroup.wait_empty(EMPTY_TIMEOUT_S):
                    _log.error(
                        "t%d: processes left after kill: %s", tenant.id, tenant.cgroup.pids()
                    )
                tenant.cgroup.remove()
            except CgroupError as exc:
                _log.error("t%d: cgroup cleanup: %s", tenant.id, exc)
        finally:
            try:
                self.memory.tenant_ended(tenant)  # its processes are gone: final record
            except Exception:
                _log.exception("t%d: memory record", tenant.id)
            gate = d.gates.get(tenant.gpu)
            if gate is not None:
                # After the final read (a freed slot no longer names its tenant): free
                # the slots now rather than at the next drain (krex_gate_reclaim_dead).
                try:
                    gate.reclaim_dead()
                except Exception:
                    _log.exception("t%d: freeing its gate slots", tenant.id)
            d.tenants.remove(tenant)
            if tenant.state != states.EXITED:
                change_state(tenant, states.EXITED)  # any live -> EXITED
            d.admission.release(tenant.gpu, tenant.exclusive, tenant.memory.need_bytes)
            self._ending.pop(tenant.id, None)
            _log.info(
                "t%d ended (%s, exit_code=%s, signal=%s)",
                tenant.id,
                reason,
                tenant.exit_code,
                tenant.signal,
            )

    def tenant_env(self, tenant: Tenant) -> dict[str, str]:
        """Environment for the tenant's command (docs/design/interfaces.md)."""
        d = self.daemon
        env = {
            "KREX_SOCKET": d.config.daemon.socket,
            "KREX_TENANT": str(tenant.id),
            "KREX_TOKEN": tenant.token,
            "KREX_GPU": str(tenant.gpu),
            "CUDA_VISIBLE_DEVICES": str(tenant.gpu),
            "NCCL_NVLS_ENABLE": "0",
            # Bound of the shim's wait for co-tenants' memory (libkrex_shim/memory.c).
            "KREX_OOM_WAIT_S": f"{d.config.memory.oom_wait_s:g}",
        }
        if not tenant.exclusive:  # a whole-device lease runs natively, unshimmed
            gate = d.gate_paths.get(tenant.gpu)
            if gate is not None:
                env["KREX_GATE"] = gate
            shim = paths.shim_library(d.config.shim.path or None)
            if shim is not None:
                env["LD_PRELOAD"] = shim
            env.update(d.mps.tenant_env(tenant.gpu))
        return env


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
