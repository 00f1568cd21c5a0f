"""``region_exit``: the holder's timed code is done; thaw siblings, reopen, release.

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.control.region_enter import MAX_REQUEST_ID
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, check the fields, run the GPU coordinator's exit."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "region_exit")
    fields.only(req.body, "epoch", "sync_ms", "launches", "request_id")
    epoch = fields.integer(req.body, "epoch", 0, 0xFFFF_FFFF)
    sync_ms = fields.number(req.body, "sync_ms", default=0.0)
    launches = fields.integer(req.body, "launches", 0, default=0)
    request_id = fields.string(req.body, "request_id", MAX_REQUEST_ID, default=None)
    reply: dict[str, Any] = await ctx.regions(tenant.gpu).exit(
        tenant, epoch, sync_ms, launches, request_id
    )
    return reply
