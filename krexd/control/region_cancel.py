"""``region_cancel``: the client stopped waiting for its region; withdraw or end it.

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
    """Authenticate, then let the GPU's coordinator withdraw or end the region."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "region_cancel")
    fields.only(req.body)
    return await ctx.regions(tenant.gpu).cancel(tenant)
