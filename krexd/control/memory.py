"""``memory``: the calling tenant's memory record, read fresh.

Request: tenant + token; body ``{}``.
Reply body (``krexd.tenancy.memory_records.TenantMemory``; bytes)::

    {"need_bytes": int, "need_source": "declared|default", "used_bytes": int,
     "peak_bytes": int, "used_source": "nvml|fake|shim|none", "exceeded": bool,
     "oom_waited": int, "oom_cotenant": int, "oom_own": int,
     "last_oom": str|null, "last_cotenant_oom": str|null, "waiting": bool,
     "outcome": "ok|waited|own_oom|cotenant_oom"}

Before answering, krexd reads the gate registrations of the tenant's GPU again, so
every out-of-memory error its processes met so far is counted, those of
processes that already ended included.  ``oom_cotenant`` counts errors
returned to the command that its co-tenants caused (``last_cotenant_oom``
says why: ``timeout``, ``in_region``, ``nested``, ``no_wait``, ``mutual``);
``oom_own`` those that were its own (``too_large``, ``alone``).
Errors: ``AUTH`` (wrong token, or a caller outside the tenant's cgroup
that is not its launcher: ``krexd.tenancy.identity``), ``BAD_FIELD``.
Sent by: ``krex run`` when CMD failed, to exit 75 (EX_TEMPFAIL) instead of
CMD's code when co-tenants' memory caused the failure (docs/design/memory.md).
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
