"""``HolderCores``: step 5 and its undo: the reserved cores for the holder and its thread.

``[region] holder_cpus`` chooses between adding the reserved cores to the
holder's own (``"add"``) and pinning its thread to them alone
(``"reserved_only"``); docs/design/daemon.md.
"""

from __future__ import annotations

from krexd.coordinator.isolation import Pinner, gone
from krexd.coordinator.scope import GpuScope, log
from krexd.hardware.slices import CpuSlice
from krexd.tenancy.tenants import Tenant


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Sorted core ids in ``a`` or ``b``."""
    return tuple(sorted(set(a) | set(b)))


class HolderCores:
    """The holder's cores on one GPU, through ``Pinner``; one holder at a time.

    Owns the holder thread's own affinity from before step 5
    (:attr:`thread_cpus`, ``"add"``), given back at its undo, and saved
    across a restart.
    """

    def __init__(self, scope: GpuScope, pinner: Pinner, cpu_slice: CpuSlice) -> None:
        self._scope = scope
        self._pinner = pinner
        self._slice = cpu_slice
        self.thread_cpus: tuple[int, ...] | None = None  # the holder thread's own ("add")

    @property
    def reserved(self) -> tuple[int, ...]:
        """The GPU's reserved cores (the grant names them)."""
        return self._slice.reserved

    def adopt(self, thread_cpus: tuple[int, ...] | None) -> None:
        """An adopted region's holder thread had ``thread_cpus`` before step 5 (the krexd
        before a restart pinned it); :meth:`unpin` gives them back."""
        self.thread_cpus = thread_cpus

    def pin(self, holder: Tenant, tid: int) -> None:
        """Step 5: the holder's cgroup gets the reserved cores, and so does thread ``tid``.

        ``[region] holder_cpus = "add"`` (default): the cpuset becomes the
        off-region cores plus the reserved ones, and ``tid`` keeps its own
        affinity plus the reserved cores, so no thread of the holder has fewer
        cores than outside a region (docs/design/daemon.md).  ``"reserved_only"``:
        ``tid`` runs on the reserved cores alone (the paper's pinning).

        Raises:
            OSError: the cpuset cannot be written (the entry fails and is undone).
        """
        self.thread_cpus = None
        reserved = self._slice.reserved
        if not reserved:
            return
        add = self._scope.cfg.holder_cpus == "add"
        try:
            # Read before the cpuset widens: older kernels reset affinities when it does.
            self.thread_cpus = self._pinner.thread_cpus(tid) if add else None
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery
        self._pinner.set_cpus(holder, _union(self._slice.tenant_cores, reserved))
        try:
            if not add:
                self._pinner.pin_thread(tid, reserved)
            elif self.thread_cpus is not None:
                self._pinner.pin_thread(tid, _union(self.thread_cpus, reserved))
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery

    def unpin(self, holder: Tenant, tid: int) -> None:
        """Undo step 5 (step 7); never raises, so that the thaw and the reopen after it run."""
        if not self._slice.reserved:
            return
        back, self.thread_cpus = self.thread_cpus, None
        off = self._slice.tenant_cores
        try:
            # "add": the thread's own affinity from before the region.
            self._pinner.pin_thread(tid, back if back is not None else off)
        except OSError:
            pass  # the thread ended, or its cgroup's cpuset is restored below
        try:
            self._pinner.set_cpus(holder, off)
        except OSError as exc:
            if not gone(exc):
                log.error(
                    "GPU %d: cannot restore tenant %d's cores: %s", self._scope.gpu, holder.id, exc
                )
