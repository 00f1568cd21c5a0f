"""``place``: move a launcher's child into the tenant's cgroup(s) before it executes CMD.

Request: tenant + token; body ``{"pid": int}``.
Reply body: ``{"cgroups": [str, ...]}`` (the directories the pid is now in).

The pid must be a direct child of the tenant's verified launcher, running
with the launcher's uid (every uid of ``/proc/<pid>/status``) and started
after it; never the launcher itself (``krexd.identity.check_placeable``).
So nobody can have krexd freeze or kill a process that is not their own
command.  The caller must be the launcher (or root, or a process of the
tenant).  ``krex run``
forks, the child blocks on a pipe, the launcher sends ``place`` and only then
lets the child ``exec`` CMD, so CMD's first instruction already runs inside
the tenant cgroup (paper §4.2: freezing catches ``import torch``).
Errors: ``AUTH`` (wrong token or caller; not the launcher's child or uid),
``BAD_FIELD`` (gone, tenant ended),
``SHUTTING_DOWN``, ``INTERNAL`` (cgroupfs write failed).
Sent by: ``krex run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd import identity
from krexd.control import fields

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Authenticate, check the pid's parent, write it into the tenant's cgroup.procs."""
    tenant = ctx.tenants.authenticate(req.tenant, req.token)
    identity.authorize(tenant, "place")
    fields.only(req.body, "pid")
    pid = fields.integer(req.body, "pid", 1, 1 << 22)
    ctx.lifecycle.place(tenant, pid)
    return {"cgroups": tenant.cgroup.paths}
