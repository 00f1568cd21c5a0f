"""``GpuScope``: what every step object of one GPU's region protocol reads, and nothing it writes.

The step objects (``krexd.coordinator``'s ``GateSteps``, ``Freezer``,
``HolderCores``, ``MemoryWait``, ``FailClosed``, ``DriverLocking``,
``Witness``) each own their state; what they share is this read-only
scope: the GPU's index, its ``[region]`` table, the tenant control and
registry, the region counters, and how a tenant's command is ended for
what it did (exit 79).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from krex_client.errors import ExitCode
from krexd.config.config import RegionConfig
from krexd.coordinator.isolation import EndCommand, TenantControl, gone
from krexd.coordinator.region_stats import RegionStats
from krexd.tenancy.tenants import Tenant, TenantRegistry

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


@dataclass(frozen=True, eq=False)
class GpuScope:
    """One GPU's read-only context for its step objects.

    ``end_command``: ``end_command(tenant, reason, exit_code, cause)``, the
    daemon's way to end a command (None: the tenant's tree is killed
    through ``control``, the reason recorded).
    """

    gpu: int
    cfg: RegionConfig
    control: TenantControl
    tenants: TenantRegistry
    stats: RegionStats
    end_command: EndCommand | None = None

    def siblings(self, holder: Tenant) -> list[Tenant]:
        """This GPU's tenants other than ``holder``, registered with the shim or not
        (``--exclusive`` tenants are never siblings)."""
        return [t for t in self.tenants.on_gpu(self.gpu) if t.id != holder.id and not t.exclusive]

    def end_tenant(self, tenant: Tenant, reason: str, cause: str) -> None:
        """End ``tenant``'s command with exit 79 (``ExitCode.UNPROTECTABLE``) for ``reason``.

        ``cause``: the counter it is counted under (``RegionStats.end``:
        "unprotected", "drain_timeout", "lock_failed", "contaminated").
        Never raises: a kill that fails for another reason than the
        tenant being gone is logged.
        """
        if self.end_command is not None:
            self.end_command(tenant, reason, ExitCode.UNPROTECTABLE, cause)
            return
        self.stats.end(cause)
        tenant.kill_reason = reason
        try:
            self.control.kill(tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", self.gpu, tenant.id, exc)
