"""Tenant life cycle: admit (slot + cgroup), place (pid into the cgroup), end (reclaim).

``end`` is the single way out for a tenant, whatever the reason: the
coordinator recovers a region it holds (``tenant_gone``) first.
``kill_command`` ends a command for what it did, with a reason and an exit
code ``release`` reports.  docs/design/architecture.md "A command's life";
the identity rules: docs/design/security.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from krexd.cgroups import CgroupError, TenantCgroup
from krexd.config.config import Config
from krexd.orchestration import command_env
from krexd.orchestration.gpu import Gpu
from krexd.pools.registry import PoolRegistry
from krexd.system import testhooks
from krexd.system.errors import Code, KrexError
from krexd.system.journal import log_fields
from krexd.system.runtime import RunState, Runtime
from krexd.tenancy import identity, states
from krexd.tenancy.admission import Admission
from krexd.tenancy.memory_records import TenantMemory
from krexd.tenancy.quotas import check_argv
from krexd.tenancy.registration_attach import attach_registrations
from krexd.tenancy.states import change_state
from krexd.tenancy.tenants import PidWatch, Tenant, TenantRegistry

_log = logging.getLogger("krexd.lifecycle")

EMPTY_TIMEOUT_S = 5.0
#: How long a command killed by kill_command waits for its launcher's release (s).
KILL_GRACE_S = 5.0


class TenantCgroups(Protocol):
    """Where tenant cgroups come from (``krexd.cgroups.CgroupBackend``)."""

    def create_tenant(self, gpu: int, tenant_id: int) -> TenantCgroup:
        """Create the cgroup(s) of tenant ``tenant_id`` under GPU ``gpu``."""
        ...


class MemoryNeeds(Protocol):
    """What admission charges a new command (``krexd.memory.policy.AdmissionPolicy``)."""

    def need_for(
        self,
        mem_bytes: int | None,
        gpu: int | None,
        argv: list[str],
        label: str | None = None,
        *,
        uid: int,
    ) -> TenantMemory:
        """The command's memory record: its need (bytes) and where it comes from."""
        ...


class EndedMemory(Protocol):
    """A tenant's final memory record (``krexd.memory.tenant_records.TenantRecords``)."""

    def tenant_ended(self, tenant: Tenant) -> None:
        """Read its registrations a last time; learn its peak."""
        ...


class Lifecycle:
    """Creates and ends tenants.

    ``end`` kills the tree, removes the cgroup, completes the memory record,
    detaches the tenant's slot memory from its gate, frees the admission slot
    and the memory reservation and grants parked requests.  ``place`` moves
    only a direct child of the verified launcher with its uid (or a fresh
    child of the launcher's warm pool), and attaches the tenant's slot memory
    (the launcher's sealed memfd, opened through ``/proc/<launcher>/fd/<n>``)
    to its GPU's gate before the command runs; a tenant not placed within
    ``[admission] place_timeout_s`` is ended.  A launcher that does not
    ``release`` within ``KILL_GRACE_S`` of a ``kill_command`` has its tenant
    ended all the same.

    Args:
        config: krexd's configuration (socket, shim, memory and liveness settings).
        runtime: refuses work once shutdown begins; runs background ends.
        gpus: the managed GPUs by index (coordinator, gate, MPS daemon).
        tenants: the live tenants (written: add and remove).
        admission: slots and parking (park, cancel, release).
        cgroups: creates tenant cgroups.
        needs: what admission charges each new command (its memory need).
        records: tenants' final memory records, read at their end.
        pools: the registered warm pools (``place`` accepts their children), or None.
        unmanaged_vendors: vendors of GPUs the host has but krexd does not manage
            (AMD GPUs without ``hip-python``/``amdsmi``): hidden from every command.
    """

    def __init__(
        self,
        config: Config,
        runtime: Runtime,
        gpus: Mapping[int, Gpu],
        tenants: TenantRegistry,
        admission: Admission,
        cgroups: TenantCgroups,
        needs: MemoryNeeds,
        records: EndedMemory,
        pools: PoolRegistry | None = None,
        unmanaged_vendors: frozenset[str] = frozenset(),
    ) -> None:
        self._config = config
        self._unmanaged_vendors = unmanaged_vendors
        self.pools = pools
        self._runtime = runtime
        self._gpus = gpus
        self._tenants = tenants
        self._admission = admission
        self._cgroups = cgroups
        self._needs = needs
        self._records = records
        self._watches: dict[int, PidWatch] = {}
        self._ending: dict[int, asyncio.Task[None]] = {}
        self._place_timers: dict[int, asyncio.TimerHandle] = {}
        # Liveness poll period where pidfds are unavailable ([daemon] liveness_interval_ms).
        self.poll_s = config.daemon.liveness_interval_ms / 1000

    async def admit(
        self,
        argv: list[str],
        gpu: int | None,
        exclusive: bool,
        launcher: identity.Caller,
        mem_bytes: int | None = None,
        label: str | None = None,
        without_mps: bool = False,
    ) -> Tenant:
        """Park until admission grants a GPU, then create the tenant and its cgroup.

        ``launcher`` is the verified caller of ``admit`` (``krex run``); its
        uid counts against the per-uid caps.  ``mem_bytes`` is the memory need
        declared with ``krex run --mem`` (bytes; None: none declared);
        ``label`` names the command for learned needs (None: derived from
        ``argv``).  The need charged is max(declared, learned, default)
        (``AdmissionPolicy.need_for``).  ``without_mps``: a shared tenant that is
        not a client of its GPU's MPS server (``krex run``'s re-run of a fault
        suspect, docs/design/faults.md).
        """
        launcher_pid, uid = launcher.pid, launcher.uid
        self._runtime.check_serving()
        check_argv(argv, self._config.admission.max_argv_bytes)
        record = self._needs.need_for(mem_bytes, gpu, argv, label, uid=uid)
        need = record.need_bytes
        granted = await self._park(gpu, exclusive, launcher_pid, argv, need, uid)
        try:
            self._runtime.check_serving()
            tid = self._tenants.new_id()
            cgroup = self._cgroups.create_tenant(granted, tid)
        except BaseException:
            self._admission.release(granted, exclusive, need, uid=uid)
            raise
        tenant = Tenant(
            id=tid,
            token=self._tenants.new_token(),
            gpu=granted,
            argv=argv,
            launcher_pid=launcher_pid,
            cgroup=cgroup,
            exclusive=exclusive,
            without_mps=without_mps and not exclusive,
            memory=record,
            uid=uid,
            gid=launcher.gid,
            launcher_start=launcher.start_time,
        )
        await self._register(tenant)
        return tenant

    async def _park(
        self,
        gpu: int | None,
        exclusive: bool,
        launcher_pid: int,
        argv: list[str],
        need: int,
        uid: int,
    ) -> int:
        """Wait in admission for a slot; the GPU granted.

        A launcher that exits while parked withdraws its request; a
        cancelled ``admit`` gives back a slot granted meanwhile.
        """
        admission = self._admission
        waiter = admission.park(gpu, exclusive, launcher_pid, argv, need, uid=uid)
        watch = PidWatch(
            launcher_pid,
            lambda: admission.cancel(waiter, Code.CANCELLED, "launcher exited while parked"),
            self.poll_s,
        )
        try:
            granted = await asyncio.shield(waiter.future)
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.exception():
                admission.release(waiter.future.result(), exclusive, need, uid=uid)
            else:
                admission.cancel(waiter, Code.CANCELLED, "request cancelled")
            raise
        finally:
            watch.cancel()
        return granted

    async def _register(self, tenant: Tenant) -> None:
        """Record a new tenant: watch its launcher, arm its place timeout, tell the coordinator."""
        tid, granted = tenant.id, tenant.gpu
        self._tenants.add(tenant)
        self._watches[tid] = PidWatch(
            tenant.launcher_pid, lambda: self._launcher_gone(tenant), self.poll_s
        )
        self._arm_place_timeout(tenant)
        # A command admitted during a region starts frozen (it is a sibling).
        await self._gpus[granted].coordinator.tenant_added(tenant)
        _log.info(
            "t%d admitted on gpu%d: %s",
            tid,
            granted,
            " ".join(tenant.argv)[:200],
            extra=log_fields("admitted", tid, granted),
        )
        testhooks.pause("admitted")

    def adopt(self, tenant: Tenant) -> None:
        """Take over a tenant of the krexd before a restart (krexd/restarts/adopt.py): register it
        and watch its launcher again."""
        self._tenants.add(tenant)
        self._watches[tenant.id] = PidWatch(
            tenant.launcher_pid, lambda: self._launcher_gone(tenant), self.poll_s
        )

    def _launcher_gone(self, tenant: Tenant) -> None:
        if tenant.state != states.EXITED and tenant.id not in self._ending:
            _log.warning(
                "t%d: launcher %d died; reclaiming its slot", tenant.id, tenant.launcher_pid
            )
            self._runtime.spawn(self.end(tenant, "launcher died"))

    def _arm_place_timeout(self, tenant: Tenant) -> None:
        """End ``tenant`` if it is still not placed ``[admission] place_timeout_s`` from now.

        An admitted command holds a slot; one whose launcher never places a
        process (a squatter, or a launcher stuck before ``exec``) would hold it
        for ever.  The timer is cancelled by the first ``place`` and by ``end``.
        """
        limit = self._config.admission.place_timeout_s

        def expired() -> None:
            self._place_timers.pop(tenant.id, None)
            if tenant.state == states.ADMITTED and tenant.id not in self._ending:
                _log.warning(
                    "t%d (uid %d): not placed within %g s; ending it", tenant.id, tenant.uid, limit
                )
                tenant.kill_reason = f"not placed within [admission] place_timeout_s = {limit:g} s"
                self._gpus[tenant.gpu].coordinator.stats.end("place_timeout")
                self._runtime.spawn(self.end(tenant, "not placed in time"))

        loop = asyncio.get_running_loop()
        self._place_timers[tenant.id] = loop.call_later(limit, expired)

    def _disarm_place_timeout(self, tenant: Tenant) -> None:
        timer = self._place_timers.pop(tenant.id, None)
        if timer is not None:
            timer.cancel()

    def registration_memory(self, tenant: Tenant) -> dict[str, Any] | None:
        """``{"size", "header"}`` of the tenant's slot memory, or None (no gate, exclusive)."""
        return command_env.registration_memory(self._gpus[tenant.gpu], tenant)

    def place(
        self,
        tenant: Tenant,
        pid: int,
        slots_fd: int | None = None,
        pool_pid: int | None = None,
        cold: str | None = None,
    ) -> None:
        """Move ``pid`` into the tenant's cgroup(s).

        ``pid`` must be a direct child of the tenant's verified launcher, with
        its uid, or an unplaced child of a warm pool of that uid
        (``krexd.tenancy.identity.check_placeable``): ``KrexError(AUTH)``
        otherwise, ``KrexError(BAD_FIELD)`` when it is gone or the tenant ended.
        ``slots_fd``: the launcher's fd of the tenant's slot memory, attached
        to the GPU's gate here (once, by the place that starts the command),
        before the command runs (``KrexError(BAD_FIELD)`` when it is not
        acceptable, or offered once the command runs without one).  ``pool_pid``:
        the pool the launcher talked to; ``pid`` must then be a child of that
        registered pool (``KrexError(AUTH)`` otherwise).  ``cold``: why
        ``krex run`` starts the command cold (``krex_client.cold_reasons``),
        counted by the warm pools' registry.
        """
        self._runtime.check_serving()
        if tenant.state not in (states.ADMITTED, states.RUNNING):
            raise KrexError(Code.BAD_FIELD, f"tenant {tenant.id} is {tenant.state}; cannot place")
        pool = identity.check_placeable(tenant, pid, self.pools)
        if pool_pid is not None and (pool is None or pool.pid != pool_pid):
            raise identity.refuse(
                identity.Caller(tenant.launcher_pid, tenant.uid, tenant.gid, tenant.launcher_start),
                f"place: pid {pid} is not a child of pool {pool_pid}, the one krex run talked to",
            )
        if slots_fd is not None:
            attach_registrations(self._gpus[tenant.gpu].gate, tenant, slots_fd)
        try:
            tenant.cgroup.add_pid(pid)
        except CgroupError as exc:
            raise KrexError(Code.INTERNAL, f"cannot place pid {pid}: {exc}") from None
        if pool is not None and self.pools is not None:
            self.pools.placed(pool, pid)
        elif self.pools is not None and self.pools.config.enabled and not tenant.pids:
            self.pools.started_cold(cold)
        tenant.pids.add(pid)
        self._disarm_place_timeout(tenant)
        if tenant.state == states.ADMITTED:
            change_state(tenant, states.RUNNING)  # ADMITTED -> RUNNING
        _log.info(
            "t%d: placed pid %d in %s",
            tenant.id,
            pid,
            tenant.cgroup.path,
            extra=log_fields("placed", tenant.id, tenant.gpu),
        )
        testhooks.pause("placed")

    def kill_command(
        self, tenant: Tenant, reason: str, exit_code: int, cause: str = "other"
    ) -> None:
        """End ``tenant``'s command for what it did; the launcher reports ``exit_code``.

        Kills the tree now (``reason`` and ``exit_code`` go back in the
        ``release`` reply); the tenant itself is ended by that release, or
        after ``KILL_GRACE_S`` if its launcher never sends it.  ``cause``:
        the label it is counted and logged under (``krexd.coordinator.region_stats.ENDED_CAUSES``).
        """
        if tenant.state == states.EXITED or tenant.kill_reason is not None:
            return
        tenant.kill_reason = reason
        tenant.kill_code = exit_code
        self._gpus[tenant.gpu].coordinator.stats.end(cause)
        _log.warning(
            "t%d: command ended by krex (exit %d, %s): %s",
            tenant.id,
            exit_code,
            cause,
            reason,
            extra=log_fields("command_ended", tenant.id, tenant.gpu, reason=cause),
        )
        try:
            tenant.cgroup.kill()
        except CgroupError as exc:
            _log.error("t%d: cannot kill its command: %s", tenant.id, exc)
        self._runtime.spawn(self._end_unreleased(tenant, reason))

    async def _end_unreleased(self, tenant: Tenant, reason: str) -> None:
        await asyncio.sleep(KILL_GRACE_S)
        if self._tenants.get(tenant.id) is tenant and tenant.state != states.EXITED:
            await self.end(tenant, reason)

    async def end(self, tenant: Tenant, reason: str) -> None:
        """End ``tenant`` once (later calls wait for the first): recover, kill, free the slot."""
        if tenant.state == states.EXITED and tenant.id not in self._ending:
            tenant.told_end = True  # ended already (krexd's stop): release reads kill_reason
            return
        running = self._ending.get(tenant.id)
        if running is None:
            running = asyncio.ensure_future(self._end(tenant, reason))
            self._ending[tenant.id] = running
        await asyncio.shield(running)

    async def _end(self, tenant: Tenant, reason: str) -> None:
        gpu = self._gpus[tenant.gpu]
        self._disarm_place_timeout(tenant)
        watch = self._watches.pop(tenant.id, None)
        if watch is not None:
            watch.cancel()
        try:
            try:
                await gpu.coordinator.tenant_gone(tenant)
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
            tenant.cgroup.close()  # its held control files (remove() closed them, unless it failed)
            try:
                self._records.tenant_ended(tenant)  # its processes are gone: final record
            except Exception:
                _log.exception("t%d: memory record", tenant.id)
            if gpu.gate is not None and tenant.registrations_attached:
                # After the final read of its registrations' memory records.
                try:
                    gpu.gate.detach(tenant.id)
                except Exception:
                    _log.exception("t%d: detaching its slot memory", tenant.id)
                tenant.registrations_attached = False
            if self._runtime.state != RunState.STOPPING:
                # While krexd stops, an ended tenant stays registered (EXITED) so that
                # its launcher's release, however late, reads its kill_reason.
                self._tenants.remove(tenant)
            if tenant.state != states.EXITED:
                change_state(tenant, states.EXITED)  # any live -> EXITED
            self._admission.release(
                tenant.gpu, tenant.exclusive, tenant.memory.need_bytes, uid=tenant.uid
            )
            self._ending.pop(tenant.id, None)
            _log.info(
                "t%d ended (%s, exit_code=%s, signal=%s)",
                tenant.id,
                reason,
                tenant.exit_code,
                tenant.signal,
                extra=log_fields("ended", tenant.id, tenant.gpu),
            )

    def tenant_env(self, tenant: Tenant) -> dict[str, str]:
        """Environment for the tenant's command (krexd/orchestration/command_env.py)."""
        host_vendors = {g.info.vendor for g in self._gpus.values()} | self._unmanaged_vendors
        return command_env.tenant_env(self._config, self._gpus[tenant.gpu], tenant, host_vendors)
