"""The memory view of krexd's GPUs, and the memory side of admission.

Every ``[memory] refresh_ms`` the monitor reads each GPU's memory from its
source (``krexd.memory.opening``: NVML, amdsmi, the fake driver's state, or none)
and the shim's registrations in the gate (``krexd.gate.Gate.slots``: the
daemon's own gate objects, so each gate file is mapped once), and works out
per GPU::

    tenants_used = sum of the tenants' usage (per-process figures of the
                   source for the tenant's cgroup pids, else the shim's count)
    other        = device used - tenants_used   (processes krex does not run)
    excess       = other + sum over tenants of max(0, used - need)
    available    = total - headroom - excess    (before reservations)

Admission (``krexd.admission``) reserves each admitted command's *need*
(max of ``krex run --mem``, the need learned from earlier runs of its label
(``krexd.memory.learned``) and ``[memory] default_need`` capped at one
slot's share of the card) and admits a command to a GPU only when its need
fits in ``available - reserved``; so a command is charged max(need, used),
and memory used by others is charged too.  Besides the periodic refresh,
every admission decision, region entry check and status re-reads the
shim's counts from the gates (:meth:`MemoryMonitor.refresh`): admission
sees memory as the shim counts it at that moment.  A GPU where an allocation waits for
co-tenants' memory (the shim's WAITING bit) admits nothing until the wait
ends.  docs/design/memory.md gives the reasoning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from krex_client.sizes import format_size
from krexd.admission import GpuSlots, MemoryPolicy, Waiter
from krexd.config import MemoryConfig
from krexd.errors import Code, KrexError
from krexd.gate import LIVE_SLOT_STATES, Gate, GateError, SlotInfo
from krexd.gpus import GpuInfo
from krexd.memory import accounting
from krexd.memory.learned import LearnedNeeds, label_for
from krexd.memory.opening import open_source
from krexd.memory.records import TenantMemory
from krexd.memory.sources import DeviceMemory, Source
from krexd.memory.view import GpuMemory, GpuView
from krexd.procfs import pid_alive
from krexd.runtime import Runtime
from krexd.tenants import Tenant, TenantRegistry

if TYPE_CHECKING:
    from krexd.slotflags import SlotFlags

_log = logging.getLogger("krexd.memory")


class MonitoredGpu(Protocol):
    """What the monitor uses of a GPU (``krexd.gpu.Gpu``)."""

    @property
    def info(self) -> GpuInfo: ...

    @property
    def gate(self) -> Gate | None: ...

    @property
    def memory(self) -> GpuMemory: ...

    @property
    def slots(self) -> GpuSlots: ...


class MemoryAdmission(Protocol):
    """What the monitor asks of admission (``krexd.admission.Admission``)."""

    def use_memory(self, policy: MemoryPolicy, max_bypass: int) -> None: ...

    @property
    def parked(self) -> list[Waiter]: ...

    def kick(self) -> None: ...


class MemoryMonitor:
    """Refreshes the memory view of ``gpus``; the admission memory policy.

    Args:
        cfg: the ``[memory]`` table.
        gpus: the managed GPUs; the monitor writes their ``memory``.
        tenants: the live tenants (read).
        admission: told to admit by memory through this monitor.
        runtime: to run the refresh loop and stop it at shutdown.
        learned: the learned needs (``krexd.memory.learned``; None: kept in
            memory only, not across restarts).
        on_gpu_users: told the pids each device read saw with GPU memory
            (the warm pools' watch; None: nobody).
        flags: which slot-memory waits are honoured (``krexd.slotflags``;
            None: every one).
    """

    def __init__(
        self,
        cfg: MemoryConfig,
        gpus: Sequence[MonitoredGpu],
        tenants: TenantRegistry,
        admission: MemoryAdmission,
        runtime: Runtime,
        learned: LearnedNeeds | None = None,
        on_gpu_users: Callable[[set[int]], None] | None = None,
        flags: SlotFlags | None = None,
    ) -> None:
        self.cfg = cfg
        self.learned = (
            learned
            if learned is not None
            else LearnedNeeds(None, cfg.learned_max, cfg.learned_per_uid)
        )
        self._device: dict[int, DeviceMemory] = {}  # the last read of each GPU's source
        self._gpus = {g.info.index: g for g in gpus}
        self._tenants = tenants
        self._admission = admission
        self._runtime = runtime
        self.source: Source | None = None
        self._task: asyncio.Task[None] | None = None
        self._started = False
        # Told the pids each device read saw with GPU memory (the warm pools' watch:
        # krexd.pools.PoolRegistry.check_gpu_users).
        self.on_gpu_users = on_gpu_users
        # Which memory waits are honoured (verified, bounded; None: every one).
        self.flags = flags

    # --- life cycle -------------------------------------------------------------

    def start(self) -> None:
        """Open the source and the gates, attach to admission, start refreshing (once)."""
        if self._started:
            return
        self._started = True
        self.source = open_source([g.info for g in self._gpus.values()])
        if self.cfg.learn:
            self.learned.load()
        self._admission.use_memory(self, self.cfg.max_bypass)
        try:
            self._apply(self.source.read())
        except Exception:
            _log.exception("first memory refresh failed")
        _log.info(
            "memory: source %s, admission %s, default need %s, headroom %s, oom wait %g s",
            self.source.name,
            "on" if self.cfg.admission else "off",
            format_size(self.cfg.default_need),
            format_size(self.cfg.headroom),
            self.cfg.oom_wait_s,
        )
        self._task = self._runtime.spawn(self._loop())

    async def _loop(self) -> None:
        period = self.cfg.refresh_ms / 1000
        failed = ""
        source = self.source
        assert source is not None
        try:
            while True:
                try:
                    self._runtime.check_serving()
                except KrexError:
                    return
                try:
                    self._apply(await asyncio.to_thread(source.read))
                    failed = ""
                except Exception as exc:
                    if repr(exc) != failed:  # once per distinct error, not every refresh
                        _log.exception("memory refresh failed")
                    failed = repr(exc)
                if self._admission.parked:
                    self._admission.kick()  # memory may have come back
                await asyncio.sleep(period)
        finally:
            self.close()

    def gpu_users(self, gpu: int) -> set[int] | None:
        """Pids with a context on GPU ``gpu`` now, read afresh; None when unknown."""
        source = self.source
        if source is None:
            return None
        try:
            return source.users(gpu)
        except Exception as exc:
            _log.warning("gpu%d: who has the GPU open: %s", gpu, exc)
            return None

    def close(self) -> None:
        """Release the source (the gates are the daemon's: it unmaps them)."""
        if self.source is not None:
            self.source.close()

    def _registrations(self, gpu: int) -> list[SlotInfo] | None:
        """The registrations in ``gpu``'s gate now; None without a gate or once it is unmapped."""
        g = self._gpus.get(gpu)
        if g is None or g.gate is None:
            return None
        try:
            return g.gate.slots()
        except GateError:
            return None  # unmapped: the daemon is stopping

    def shim_counts(self, gpu: int) -> dict[int, int]:
        """Tenant id -> bytes its live processes hold on ``gpu`` by the shim's count, now.

        One read of the gate's registrations (no device read, no record
        update): what a region entry asks before it freezes (``region_fit``).
        Empty without a gate.
        """
        counts: dict[int, int] = {}
        g = self._gpus.get(gpu)
        if g is None or g.gate is None:
            return counts
        try:
            live = g.gate.live_registrations()  # live states only, not ignored
        except GateError:
            return counts  # unmapped: the daemon is stopping
        for s in live:
            if s.mem_mib and s.tenant and pid_alive(s.pid):
                counts[s.tenant] = counts.get(s.tenant, 0) + (s.mem_mib << 20)
        return counts

    # --- refresh ------------------------------------------------------------------

    def _apply(self, dev: dict[int, DeviceMemory]) -> None:
        """A fresh read of every GPU's source: remember it, recompute each view; tell
        :attr:`on_gpu_users` (the warm pools' watch) which processes it saw."""
        if self.on_gpu_users is not None:
            seen = {pid for d in dev.values() for pid in (*d.listed, *(d.per_pid or {}))}
            try:
                if seen:
                    self.on_gpu_users(seen)
            except Exception:  # the watch must not cost the refresh
                _log.exception("warm pools' GPU watch failed")
        for index, g in self._gpus.items():
            self._device[index] = dev.get(index) or DeviceMemory(
                g.info.total_mem_bytes, None, None, "shim"
            )
            self._apply_gpu(index)

    def refresh(self, gpu: int | None = None) -> None:
        """Re-read the shim's counts now (one GPU, or all) over the last device read:
        admission, region entry and status see memory as the shim counts it now."""
        for index in [gpu] if gpu is not None else list(self._gpus):
            if index in self._device:
                self._apply_gpu(index)

    def _apply_gpu(self, index: int) -> None:
        g = self._gpus[index]
        tenants = self._tenants.on_gpu(index)
        slots = self._registrations(index)
        accounting.apply(g.memory, self._device[index], tenants, slots)

    def refresh_tenant(self, tenant: Tenant) -> None:
        """Credit what the tenant's processes (ended ones too) counted so far."""
        g = self._gpus.get(tenant.gpu)
        if g is not None and tenant.gpu in self._device:
            self._apply_gpu(tenant.gpu)  # live counts and peaks, and the ledger
        slots = self._registrations(tenant.gpu)
        if g is not None and slots is not None:
            records = {t.id: t.memory for t in self._tenants.on_gpu(tenant.gpu)}
            records[tenant.id] = tenant.memory
            g.memory.ledger.update(slots, records)

    def tenant_ended(self, tenant: Tenant) -> None:
        """Final read of the tenant's registrations (its processes are gone); its peak
        is learned under its label.  The caller frees the registrations afterwards."""
        self.refresh_tenant(tenant)
        rec = tenant.memory
        rec.waiting = False
        if self.cfg.learn and rec.label and not tenant.exclusive:
            self.learned.record(tenant.uid, rec.label, rec.learn_bytes)
        _log.info("t%d memory: %s", tenant.id, rec.describe())

    # --- admission policy -----------------------------------------------------------

    def need_for(
        self,
        mem_bytes: int | None,
        gpu: int | None,
        argv: list[str],
        label: str | None = None,
        *,
        uid: int,
    ) -> TenantMemory:
        """A new command's record: what admission charges it, and why.

        The need is max(declared ``mem_bytes``, learned, default): the learned
        need is the largest recent peak of the command's label (``label``, else
        :func:`krexd.memory.learned.label_for` of ``argv``) among the runs of
        ``uid`` (the verified launcher's; never another user's), capped at what the
        largest candidate GPU can give; the default is ``[memory] default_need``
        capped at the smallest candidate GPU's share per slot
        (``(total - headroom) / slots``), so that a full GPU of
        undeclared commands always fits.  A declared need no candidate GPU can
        ever hold (more than ``total - headroom``) is refused with
        ``BAD_FIELD`` while admission by memory is on.
        """
        candidates = [gpu] if gpu is not None else list(self._gpus)
        viewed = [g for g in candidates if self._view(g) is not None]
        caps = [self.capacity(g) for g in viewed]
        if mem_bytes is not None and self.cfg.admission and caps and mem_bytes > max(caps):
            raise KrexError(
                Code.BAD_FIELD,
                f"mem_bytes: {format_size(mem_bytes)} never fits: "
                f"{'GPU ' + str(gpu) if gpu is not None else 'the largest GPU'} holds "
                f"{format_size(max(0, max(caps)))} after the {format_size(self.cfg.headroom)} "
                "headroom",
            )
        default = self.cfg.default_need
        shares = [max(0, self.capacity(g)) // max(1, self._gpus[g].slots.total) for g in viewed]
        if shares:
            default = min(default, *shares)
        key = label if label else label_for(argv)
        learned = self.learned.need(uid, key) if self.cfg.learn else None
        if learned is not None and caps:
            learned = min(learned, max(0, max(caps)))
        need, source = default, "default"
        if learned is not None and learned > need:
            need, source = learned, "learned"
        if mem_bytes is not None and mem_bytes >= need:
            need, source = mem_bytes, "declared"
        rec = TenantMemory(need, source, label=key, declared_bytes=mem_bytes)
        rec.learned_bytes = learned
        return rec

    def capacity(self, gpu: int) -> int:
        """What GPU ``gpu`` can ever give commands: total - headroom (bytes)."""
        view = self._view(gpu)
        total = view.total if view is not None else 0
        return total - self.cfg.headroom

    def blocked(self, gpu: int) -> bool:
        """True while a verified allocation on ``gpu`` waits for co-tenants' memory, within
        its bound (fresh read; ``krexd.slotflags``)."""
        g = self._gpus.get(gpu)
        if g is None or g.gate is None:
            return False
        try:
            waiting = g.gate.waiting_for_memory()
            if self.flags is not None:
                return self.flags.waits_honoured(g.gate, waiting)
        except GateError:
            return False  # unmapped: the daemon is stopping
        return any(s.state in LIVE_SLOT_STATES and pid_alive(s.pid) for s in waiting)

    def available(self, gpu: int) -> int | None:
        """Bytes of ``gpu`` admission may still reserve (None: admission by memory off)."""
        view = self._view(gpu)
        if not self.cfg.admission or view is None:
            return None
        return view.total - self.cfg.headroom - view.excess

    def view(self, gpu: int) -> GpuView | None:
        """GPU ``gpu``'s memory view as of the last refresh (None before the first)."""
        return self._view(gpu)

    def _view(self, gpu: int) -> GpuView | None:
        g = self._gpus.get(gpu)
        return g.memory.view if g is not None else None

    # --- status -----------------------------------------------------------------------

    def gpu_status(self, gpu: int) -> dict[str, Any] | None:
        """JSON-ready memory of ``gpu`` for ``krexctl status`` (bytes)."""
        self.refresh(gpu)
        view = self._view(gpu)
        if view is None:
            return None
        reserved = self._gpus[gpu].slots.mem_reserved
        avail = self.available(gpu)
        return {
            "source": view.source,
            "total_bytes": view.total,
            "used_bytes": view.used,
            "free_bytes": max(0, view.total - view.used),
            "tenants_bytes": view.tenants_used,
            "other_bytes": view.other,
            "reserved_bytes": reserved,
            "headroom_bytes": self.cfg.headroom,
            "available_bytes": None if avail is None else max(0, avail - reserved),
            "waiting": sorted(view.waiting),
            "blocked": self.blocked(gpu),
        }

    def settings(self) -> dict[str, Any]:
        """The ``[memory]`` settings in force (status)."""
        return {
            "admission": self.cfg.admission,
            "default_need_bytes": self.cfg.default_need,
            "headroom_bytes": self.cfg.headroom,
            "max_bypass": self.cfg.max_bypass,
            "oom_wait_s": self.cfg.oom_wait_s,
            "refresh_ms": self.cfg.refresh_ms,
            "source": self.source.name if self.source is not None else None,
            "learn": self.cfg.learn,
            "learned": self.learned.status(),
            "region_wait_s": self.cfg.region_wait_s,
            "retry_tempfail": self.cfg.retry_tempfail,
        }
