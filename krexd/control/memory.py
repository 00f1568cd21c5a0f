"""``memory``: the calling tenant's memory record, read fresh.

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, re-read the tenant's registrations, return its record."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "memory")
    fields.only(req.body)
    ctx.memory.refresh_tenant(tenant)
    return tenant.memory.as_dict()
