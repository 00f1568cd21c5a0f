"""``release``: the command ended; free its slot and remove its cgroup.

Request: tenant + token; body ``{"exit_code": int?, "signal": int?}``.
Reply body: ``{"kill_reason": str | null, "exit_code": int | null,
"gpu_fault"?: {...}}`` — why krexd killed the command (e.g. its critical
region exceeded ``max_region_s``), or null; the exit code ``krex run``
reports for that kill when it has one of its own (79: unprotectable GPU use
or tampered gate registrations), else null; and, only under MPS when the
command failed after a GPU-wide fault, ``gpu_fault``: ``{"role":
"culprit|casualty|suspect", "gpu": int, "error": int (CUresult) or null
(a suspect with no fault record), "why": str}`` (``krexd.orchestration.faults``):
``krex run`` runs a casualty again, and a suspect again without MPS
(``admit`` with ``mps: false``).

Whatever is left of the tenant's process tree is killed (``cgroup.kill``);
the coordinator's recovery runs first if the tenant held the region.
Errors: ``AUTH`` (wrong token, or a caller outside the tenant's cgroup
that is not its launcher: ``krexd.tenancy.identity``), ``BAD_FIELD``.
Sent by: ``krex run`` when CMD exits (or its ``--timeout`` expires).
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
