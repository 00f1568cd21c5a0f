"""``place``: move a launcher's child into the tenant's cgroup(s) before it executes CMD.

Request: tenant + token; body ``{"pid": int}``.
Reply body: ``{"cgroups": [str, ...]}`` (the directories the pid is now in).

The pid must be a child of the tenant's launcher (``/proc/<pid>/stat`` ppid),
so a tenant cannot pull another user's process into its cgroup.  ``krex run``
forks, the child blocks on a pipe, the launcher sends ``place`` and only then
lets the child ``exec`` CMD, so CMD's first instruction already runs inside
the tenant cgroup (paper §4.2: freezing catches ``import torch``).
Errors: ``AUTH``, ``BAD_FIELD`` (not the launcher's child, gone),
``SHUTTING_DOWN``, ``INTERNAL`` (cgroupfs write failed).
Sent by: ``krex run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, check the pid's parent, write it into the tenant's cgroup.procs."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    fields.only(req.body, "pid")
    pid = fields.integer(req.body, "pid", 1, 1 << 22)
    ctx.lifecycle.place(tenant, pid)
    return {"cgroups": tenant.cgroup.paths}
