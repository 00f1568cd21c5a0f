"""Regions that enforce nothing, behind the same port as gated ones.

``[region] enforce = false`` (timing without isolation, for comparison), or
an ``--exclusive`` tenant: the whole GPU is its own already, so its region
is a no-op and the same script runs with and without ``--exclusive``.  No
gate, freeze or core is touched; who is inside is recorded all the same, so
a second ``region_enter`` is ``NESTED_REGION`` and an exit without an entry
``NOT_HOLDER``, as for gated regions.  Grants carry epoch 0.
"""

from __future__ import annotations

from krexd.errors import Code, KrexError
from krexd.region_stats import RegionStats
from krexd.tenants import Tenant


class UngatedRegions:
    """The regions of one GPU's tenants that are not gated (module docstring).

    ``stats``: the GPU's region counters (grants and completions are counted
    there, as gated ones are).
    """

    def __init__(self, stats: RegionStats) -> None:
        self._inside: set[int] = set()
        self._stats = stats

    def enter(self, tenant: Tenant) -> None:
        """Record ``tenant`` inside a region; raises KrexError(NESTED_REGION) when it is."""
        if tenant.id in self._inside:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        self._inside.add(tenant.id)
        self._stats.granted += 1

    def exit(self, tenant: Tenant) -> None:
        """Record ``tenant``'s region ended; raises KrexError(NOT_HOLDER) when it had none."""
        if tenant.id not in self._inside:
            raise KrexError(Code.NOT_HOLDER, f"tenant {tenant.id} holds no region")
        self._inside.discard(tenant.id)
        self._stats.completed += 1

    def cancel(self, tenant: Tenant) -> str:
        """End ``tenant``'s region if it has one: ``"held"``, else ``"none"``."""
        held = tenant.id in self._inside
        self._inside.discard(tenant.id)
        return "held" if held else "none"

    def gone(self, tenant: Tenant) -> None:
        """``tenant`` ended: forget it."""
        self._inside.discard(tenant.id)
