"""``place``: move a launcher's child into the tenant's cgroup(s) before it executes CMD.

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
    """Authenticate, check the pid's parent, write it into the tenant's cgroup.procs."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "place")
    fields.only(req.body, "pid", "slots_fd", "pool", "cold")
    pid = fields.integer(req.body, "pid", 1, 1 << 22)
    slots_fd = fields.integer(req.body, "slots_fd", 0, 1 << 20, default=None)
    pool = fields.integer(req.body, "pool", 1, 1 << 22, default=None)
    cold = req.body.get("cold")  # a count only: anything unknown is counted as "other"
    cold = cold if isinstance(cold, str) and len(cold) <= 32 else None
    ctx.lifecycle.place(tenant, pid, slots_fd, pool, cold)
    return {"cgroups": tenant.cgroup.paths}
