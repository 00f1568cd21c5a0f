"""``region_enter``: make the calling tenant the holder of its GPU's critical region.

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext

_MAX_PID = 1 << 22  # Linux pid_max limit
MAX_REQUEST_ID = 64  # characters of a client's request id


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, check the fields, run the GPU coordinator's entry."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "region_enter")
    fields.only(req.body, "pid", "tid", "request_id")
    pid = fields.integer(req.body, "pid", 1, _MAX_PID)
    tid = fields.integer(req.body, "tid", 1, _MAX_PID)
    request_id = fields.string(req.body, "request_id", MAX_REQUEST_ID, default=None)
    reply: dict[str, Any] = await ctx.regions(tenant.gpu).enter(tenant, pid, tid, request_id)
    return reply
