"""``region_exit``: the holder's timed code is done; thaw siblings, reopen, release.

Request: tenant + token; body ``{"epoch": int, "sync_ms": float, "launches": int,
"request_id": str?}`` — the epoch ``region_enter`` returned, how long the
holder's shim waited for its own GPU work at exit, the launches it made
inside the region and, optionally, the client's id of this request (as
``region_enter``'s).  Idempotent per (tenant, epoch): a second copy gets the
first one's reply, and a copy re-sent after a restart for a region that
ended meanwhile is answered again.
Reply body: ``{"region_ms": float, "thaw_ms": float, "sync_ms": float, "launches": int}``.

Paper §4.2 steps 7-8, in that order: siblings thawed, *then* the gate
reopened, *then* the region lock released to the next waiter.
Errors: ``AUTH`` (wrong token, or a caller outside the tenant's cgroup
that is not its launcher: ``krexd.tenancy.identity``), ``BAD_FIELD``, ``NOT_HOLDER``
(no region, another holder, a stale epoch), ``REGION_ABORTED`` (recovery ended the region first).
Sent by: ``krex_client.region.critical()`` on exit.
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
