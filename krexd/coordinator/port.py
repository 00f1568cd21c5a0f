"""``RegionPort``: what a tenant's region requests go through, gated or not.

``Coordinator`` picks one port per tenant: ``GatedRegions`` (the region
protocol, ``krexd.coordinator.protocol``) or ``UngatedRegions`` (regions
that enforce nothing: ``[region] enforce = false``, ``--exclusive``), and
calls it the same way; no step of either asks which one it is.  Both build
their replies here, so the wire messages cannot drift apart.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from krexd.coordinator.records import Region
from krexd.system.errors import KrexError
from krexd.tenancy.tenants import Tenant


class RegionPort(Protocol):
    """One kind of region: its entry, exit, cancel and a tenant's end."""

    async def enter(
        self, tenant: Tenant, pid: int, tid: int, request_id: str | None
    ) -> dict[str, Any]:
        """Grant ``tenant`` a region; the region_enter reply body (:func:`grant_reply`)."""
        ...

    async def exit(
        self, tenant: Tenant, epoch: int, sync_ms: float, launches: int
    ) -> dict[str, Any]:
        """End ``tenant``'s region; the region_exit reply body (:func:`exit_reply`)."""
        ...

    async def cancel(self, tenant: Tenant) -> str:
        """``tenant`` gave up its region: the stage it was at ("queued", "entering",
        "held"), or "none"."""
        ...

    async def gone(self, tenant: Tenant) -> None:
        """``tenant`` ended: its region ends, its request is dropped."""
        ...


def grant_reply(
    gpu: int,
    l2_flush: bool,
    reserved: tuple[int, ...],
    region: Region | None,
    wait_ms: float,
    establish_ms: float,
) -> dict[str, Any]:
    """The region_enter reply body; ``entry_ms`` = ``wait_ms`` + ``establish_ms`` (steps 1-5).

    ``region``: the region granted (None: an ungated one, epoch 0, no
    reserved cores); its per-entry times (ms) come from the record.
    """
    return {
        "epoch": region.epoch if region else 0,
        "gpu": gpu,
        "reserved_cores": list(reserved) if region else [],
        "l2_flush": l2_flush,
        "wait_ms": wait_ms,
        "entry_ms": wait_ms + establish_ms,
        "drain_ms": region.drain_ms if region else 0.0,
        "freeze_ms": region.freeze_ms if region else 0.0,
        "check_ms": region.check_ms if region else 0.0,
        "driver_lock": region.locks.record() if region and region.locks else None,
    }


def exit_reply(
    sync_ms: float, launches: int, region_ms: float = 0.0, thaw_ms: float = 0.0
) -> dict[str, Any]:
    """The region_exit reply body (ms); zeros for a region that enforced nothing or one
    answered again after a restart."""
    return {"region_ms": region_ms, "thaw_ms": thaw_ms, "sync_ms": sync_ms, "launches": launches}


def refusal_code(exc: BaseException) -> str:
    """The error code a failed entry is counted under (``RegionStats.refused``)."""
    if isinstance(exc, KrexError):
        return exc.code.name
    return "CANCELLED" if isinstance(exc, asyncio.CancelledError) else "INTERNAL"
