"""``UngatedRegions``: regions that enforce nothing, behind the same port as gated ones.

``[region] enforce = false`` (timing without isolation, for comparison), or
an ``--exclusive`` tenant: the whole GPU is its own already, so its region
is a no-op and the same script runs with and without ``--exclusive``.  No
gate, freeze or core is touched; who is inside is recorded all the same, so
a second ``region_enter`` is ``NESTED_REGION`` and an exit without an entry
``NOT_HOLDER``, as for gated regions.  Grants carry epoch 0.
"""

from __future__ import annotations

from typing import Any

from krexd.coordinator.port import exit_reply, grant_reply
from krexd.coordinator.records import HELD
from krexd.coordinator.scope import GpuScope
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant


class UngatedRegions:
    """The regions of one GPU's tenants that are not gated (a ``RegionPort``).

    ``scope``: the GPU's; grants and completions are counted in its
    ``stats``, as gated ones are.
    """

    def __init__(self, scope: GpuScope) -> None:
        self._inside: set[int] = set()
        self._scope = scope

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None
    ) -> dict[str, Any]:
        """Record ``tenant`` inside a region; its grant (epoch 0, times 0).

        Raises:
            KrexError: NESTED_REGION when it is inside one already.
        """
        if tenant.id in self._inside:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        self._inside.add(tenant.id)
        self._scope.stats.granted += 1
        return grant_reply(self._scope.gpu, self._scope.cfg.l2_flush, (), None, 0.0, 0.0)

    async def exit(
        self, tenant: Tenant, epoch: int, sync_ms: float, launches: int
    ) -> dict[str, Any]:
        """Record ``tenant``'s region ended; its exit reply (times 0).

        Raises:
            KrexError: NOT_HOLDER when it had none.
        """
        if tenant.id not in self._inside:
            raise KrexError(Code.NOT_HOLDER, f"tenant {tenant.id} holds no region")
        self._inside.discard(tenant.id)
        self._scope.stats.completed += 1
        return exit_reply(sync_ms, launches)

    async def cancel(self, tenant: Tenant) -> str:
        """End ``tenant``'s region if it has one: ``"held"``, else ``"none"``."""
        held = tenant.id in self._inside
        self._inside.discard(tenant.id)
        return HELD.value if held else "none"

    async def gone(self, tenant: Tenant) -> None:
        """``tenant`` ended: forget it."""
        self._inside.discard(tenant.id)
