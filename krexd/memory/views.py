"""Every GPU's memory view: what each GPU has used and free, per tenant and by others.

:meth:`MemoryViews.apply` takes each device read (every ``[memory]
refresh_ms``, ``krexd.memory.refresher``); between reads
:meth:`MemoryViews.refresh` re-reads only the shim's counts over it, so
every decision sees memory as the shim counts it at that moment.  The
formulas (``krexd.memory.accounting``): docs/design/memory.md "1. The memory view".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from krexd.gate import Gate, GateError, RegistrationInfo
from krexd.hardware.inventory import GpuInfo
from krexd.memory import accounting
from krexd.memory.sources import DeviceMemory
from krexd.memory.view import GpuMemory, GpuView
from krexd.system.procfs import pid_alive
from krexd.tenancy.tenants import Tenant, TenantRegistry


class ViewedGpu(Protocol):
    """What the views use of a GPU (``krexd.orchestration.gpu.Gpu`` shares them)."""

    @property
    def info(self) -> GpuInfo: ...

    @property
    def gate(self) -> Gate | None: ...

    @property
    def memory(self) -> GpuMemory: ...


class MemoryViews:
    """The memory views of ``gpus`` over the live ``tenants``; writes each GPU's ``memory``.

    Args:
        gpus: the managed GPUs: inventory (index, total bytes), gate (None: no
            shim counts) and the memory state this writes.
        tenants: the live tenants (read; their memory records are updated).
    """

    def __init__(self, gpus: Sequence[ViewedGpu], tenants: TenantRegistry) -> None:
        self._gpus = {g.info.index: g for g in gpus}
        self._tenants = tenants
        self._device: dict[int, DeviceMemory] = {}  # the last read of each GPU's source

    def indices(self) -> list[int]:
        """The managed GPUs' indices, in the order given."""
        return list(self._gpus)

    def apply(self, dev: dict[int, DeviceMemory]) -> None:
        """A fresh read of every GPU's source (GPU index -> its memory; a GPU missing
        from it is read as its inventory total with the shim's counts): remember it and
        recompute each view, updating the tenants' records."""
        for index, g in self._gpus.items():
            self._device[index] = dev.get(index) or DeviceMemory(
                g.info.total_mem_bytes, None, None, "shim"
            )
            self._apply_gpu(index)

    def refresh(self, gpu: int | None = None) -> None:
        """Re-read the shim's counts now (GPU ``gpu``, or all) over the last device read.

        Nothing before the first device read (:meth:`apply`) or for an unknown GPU.
        """
        for index in [gpu] if gpu is not None else list(self._gpus):
            if index in self._device:
                self._apply_gpu(index)

    def credit(self, tenant: Tenant) -> None:
        """Credit ``tenant``'s registrations, ended processes' included, to its record
        (the ledger of its GPU: each count once per slot owner), whether or not it is
        still among the GPU's live tenants.  Nothing without a gate or once it is unmapped."""
        g = self._gpus.get(tenant.gpu)
        slots = self._registrations(tenant.gpu)
        if g is not None and slots is not None:
            records = {t.id: t.memory for t in self._tenants.on_gpu(tenant.gpu)}
            records[tenant.id] = tenant.memory
            g.memory.ledger.update(slots, records)

    def view(self, gpu: int) -> GpuView | None:
        """GPU ``gpu``'s memory view as of the last refresh (None before the first, or for
        an unknown GPU)."""
        g = self._gpus.get(gpu)
        return g.memory.view if g is not None else None

    def shim_counts(self, gpu: int) -> dict[int, int]:
        """Tenant id -> bytes its live processes hold on ``gpu`` by the shim's count, now.

        One read of the gate's registrations (no device read, no record
        update): what a region entry asks before it freezes (``region_fit``).
        Empty without a gate, or once the gate is unmapped (krexd stops).
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

    def _registrations(self, gpu: int) -> list[RegistrationInfo] | None:
        """The registrations in ``gpu``'s gate now; None without a gate or once it is unmapped."""
        g = self._gpus.get(gpu)
        if g is None or g.gate is None:
            return None
        try:
            return g.gate.registrations()
        except GateError:
            return None  # unmapped: the daemon is stopping

    def _apply_gpu(self, index: int) -> None:
        g = self._gpus[index]
        tenants = self._tenants.on_gpu(index)
        slots = self._registrations(index)
        accounting.apply(g.memory, self._device[index], tenants, slots)
