"""What the control ops may use: a small context object of narrow interfaces.

``Daemon`` builds one :class:`OpContext` and the server hands it to every
op's ``handle(ctx, req)``; no op sees the daemon.  Each interface below
lists only what the ops call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from krexd.config.config import WarmConfig
from krexd.pools.registry import Pool
from krexd.tenancy.identity import Caller
from krexd.tenancy.tenants import Tenant


class TenantAuth(Protocol):
    """Authentication of tenant requests (``krexd.tenancy.tenants.TenantRegistry``)."""

    def authenticate(self, tenant_id: int | None, token: str | None) -> Tenant:
        """The tenant if ``token`` is its token; else ``KrexError(AUTH)``."""
        ...


class TenantLifecycle(Protocol):
    """Admit, place and end tenants (``krexd.orchestration.lifecycle.Lifecycle``)."""

    async def admit(
        self,
        argv: list[str],
        gpu: int | None,
        exclusive: bool,
        launcher: Caller,
        mem_bytes: int | None = None,
        label: str | None = None,
        without_mps: bool = False,
    ) -> Tenant:
        """Park until a slot is granted, then create the tenant launched by ``launcher``."""
        ...

    def tenant_env(self, tenant: Tenant) -> dict[str, str]:
        """Environment of the tenant's command."""
        ...

    def registration_memory(self, tenant: Tenant) -> dict[str, Any] | None:
        """What the launcher needs to create the tenant's slot memory, or None."""
        ...

    def place(
        self,
        tenant: Tenant,
        pid: int,
        slots_fd: int | None = None,
        pool_pid: int | None = None,
        cold: str | None = None,
    ) -> None:
        """Move ``pid`` into the tenant's cgroup(s) (a child of pool ``pool_pid`` when given;
        ``cold``: why a cold start is one, ``krex_client.cold_reasons``)."""
        ...

    async def end(self, tenant: Tenant, reason: str) -> None:
        """End the tenant (recover, kill, free its slot)."""
        ...


class Regions(Protocol):
    """One GPU's region protocol as the ops drive it (``krexd.coordinator.Coordinator``)."""

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None = None
    ) -> dict[str, Any]:
        """Steps 1-5, once per ``request_id``; the ``region_enter`` reply body."""
        ...

    async def exit(
        self,
        tenant: Tenant,
        epoch: int,
        sync_ms: float,
        launches: int,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Steps 7-8, once per epoch; the ``region_exit`` reply body."""
        ...

    async def cancel(self, tenant: Tenant) -> dict[str, Any]:
        """Withdraw or end the tenant's region; the ``region_cancel`` reply body."""
        ...


class MemoryRecords(Protocol):
    """Tenants' memory records (``krexd.memory.tenant_records.TenantRecords``)."""

    def refresh_tenant(self, tenant: Tenant) -> None:
        """Credit what the tenant's processes counted so far."""
        ...


class Pools(Protocol):
    """Warm pools (``krexd.pools.registry.PoolRegistry``)."""

    @property
    def config(self) -> WarmConfig:
        """``[warm]``."""
        ...

    def register(self, keeper: Caller, body: dict[str, Any]) -> Pool:
        """Register the zygote ``body["pid"]`` of ``keeper``; the pool."""
        ...


class FaultVerdicts(Protocol):
    """GPU-wide faults under MPS (``krexd.orchestration.faults.FaultMonitor``)."""

    def verdict(self, tenant: Tenant) -> dict[str, Any] | None:
        """Whether the tenant's end was a GPU-wide fault's casualty, culprit or suspect."""
        ...


@dataclass(frozen=True)
class OpContext:
    """Everything an op may use.

    ``regions(gpu)`` is the region protocol of GPU ``gpu``; ``about()`` the
    ``ping`` body (version, pid, uptime_s); ``status()`` the ``status`` body;
    ``faults`` the GPU-wide fault verdicts (None without MPS); ``pools`` the
    warm pools; ``check_serving()`` raises ``SHUTTING_DOWN`` once krexd stops.
    """

    tenants: TenantAuth
    lifecycle: TenantLifecycle
    memory: MemoryRecords
    regions: Callable[[int], Regions]
    about: Callable[[], dict[str, Any]]
    status: Callable[[], dict[str, Any]]
    faults: FaultVerdicts | None = None
    pools: Pools | None = None
    check_serving: Callable[[], None] = lambda: None
