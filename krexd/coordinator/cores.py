"""Step 5 and its undo: the reserved cores for the holder and its submitting thread.

``[region] holder_cpus`` chooses between adding the reserved cores to the
holder's own (``"add"``) and pinning its thread to them alone
(``"reserved_only"``); docs/design/daemon.md.
"""

from __future__ import annotations

import logging

from krexd.coordinator.base import CoordinatorBase
from krexd.isolation import gone
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


def _union(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Sorted core ids in ``a`` or ``b``."""
    return tuple(sorted(set(a) | set(b)))


class HolderCores(CoordinatorBase):
    """Pinning of the holder through ``Pinner``."""

    def _pin_holder(self, holder: Tenant, tid: int) -> None:
        """Step 5: the holder's cgroup gets the reserved cores, and so does thread ``tid``.

        ``[region] holder_cpus = "add"`` (default): the cpuset becomes the
        off-region cores plus the reserved ones, and ``tid`` keeps its own
        affinity plus the reserved cores, so no thread of the holder has fewer
        cores than outside a region (docs/design/daemon.md).  ``"reserved_only"``:
        ``tid`` runs on the reserved cores alone (the paper's pinning).
        """
        self._thread_cpus = None
        if not self._slice.reserved:
            return
        add = self._cfg.holder_cpus == "add"
        try:
            # Read before the cpuset widens: older kernels reset affinities when it does.
            self._thread_cpus = self._pinner.thread_cpus(tid) if add else None
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery
        self._pinner.set_cpus(holder, _union(self._slice.tenant_cores, self._slice.reserved))
        try:
            if not add:
                self._pinner.pin_thread(tid, self._slice.reserved)
            elif self._thread_cpus is not None:
                self._pinner.pin_thread(tid, _union(self._thread_cpus, self._slice.reserved))
        except ProcessLookupError:
            pass  # the thread ended: the region will end through recovery

    def _unpin_holder(self, holder: Tenant, tid: int) -> None:
        """Undo step 5; never raises, so that the thaw and the reopen after it always run."""
        if not self._slice.reserved:
            return
        back, self._thread_cpus = self._thread_cpus, None
        try:
            # "add": the thread's own affinity from before the region.
            self._pinner.pin_thread(tid, back if back is not None else self._slice.tenant_cores)
        except OSError:
            pass  # the thread ended, or its cgroup's cpuset is restored below
        try:
            self._pinner.set_cpus(holder, self._slice.tenant_cores)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot restore tenant %d's cores: %s", self.gpu, holder.id, exc)
