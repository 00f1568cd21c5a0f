"""``release``: the command ended; free its slot and remove its cgroup.

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
    """Authenticate, record the exit status, end the tenant."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "release")
    fields.only(req.body, "exit_code", "signal")
    tenant.exit_code = fields.integer(req.body, "exit_code", 0, 255, default=None)
    tenant.signal = fields.integer(req.body, "signal", 1, 128, default=None)
    # Before the end: the verdict reads the gate records of its processes.
    fault = ctx.faults.verdict(tenant) if ctx.faults is not None else None
    await ctx.lifecycle.end(tenant, "released")
    reply: dict[str, Any] = {"kill_reason": tenant.kill_reason, "exit_code": tenant.kill_code}
    if fault is not None:
        reply["gpu_fault"] = fault
    return reply
