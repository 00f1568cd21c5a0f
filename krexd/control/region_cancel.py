"""``region_cancel``: the client stopped waiting for its region; withdraw or end it.

Request: tenant + token; body ``{}``.
Reply body: ``{"cancelled": "queued" | "entering" | "held" | "none"}`` — what
was withdrawn: a request still in the FIFO (its ``region_enter`` is answered
``CANCELLED``), a region being established (ended as soon as it is granted),
the region the tenant holds (ended: siblings thawed, gate reopened), or
nothing.

Why: a benchmark interrupted while its ``region_enter`` is parked (Ctrl-C, a
harness's alarm) would otherwise be granted a region nobody uses, and its
siblings would stay frozen until the command exits or ``max_region_s``.
Errors: ``AUTH`` (wrong token, or a caller outside the tenant's cgroup
that is not its launcher: ``krexd.tenancy.identity``), ``BAD_FIELD``.
Sent by: ``krex_client.region.critical()`` when its wait for the grant is
interrupted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, then let the GPU's coordinator withdraw or end the region."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "region_cancel")
    fields.only(req.body)
    return await ctx.regions(tenant.gpu).cancel(tenant)
