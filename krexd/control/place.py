"""``place``: move a launcher's child into the tenant's cgroup(s) before it executes CMD.

Request: tenant + token; body ``{"pid": int, "slots_fd": int?, "pool": int?, "cold": str?}``.
Reply body: ``{"cgroups": [str, ...]}`` (the directories the pid is now in).

The pid must be a direct child of the tenant's verified launcher, running
with the launcher's uid (every uid of ``/proc/<pid>/status``) and started
after it; never the launcher itself (``krexd.tenancy.identity.check_placeable``).
So nobody can have krexd freeze or kill a process that is not their own
command.  The caller must be the launcher (or root, or a process of the
tenant).  ``krex run``
forks, the child blocks on a pipe, the launcher sends ``place`` and only then
lets the child ``exec`` CMD, so CMD's first instruction already runs inside
the tenant cgroup (paper §4.2: freezing catches ``import torch``).
``slots_fd`` is the launcher's fd of the tenant's slot memory (the memfd
the ``admit`` reply described): krexd opens it as
``/proc/<launcher>/fd/<slots_fd>``, checks its seals, size and header, and
maps it read-only before the command runs (docs/design/shim.md); only the
place that starts the command may carry it (a running tenant with nothing
attached has no registration a drain waits for).
``pool`` (``krex run --warm``): the pid of the warm pool ``krex run`` talked
to (the kernel's ``SO_PEERCRED`` of its connection); the pid must then be a
child of that registered pool, never of another process (a relay on the
pool's socket path cannot have another process placed).
``cold``: why ``krex run`` starts the command cold, one of
``krex_client.cold_reasons.REASONS`` (counted in ``status``'s ``warm`` and the
metrics; any other value counts as "other", never refused: it is only a
count), sent only to a krexd whose ``ping`` announces ``warm.cold_reasons``.
Errors: ``AUTH`` (wrong token or caller; not the launcher's child or uid),
``BAD_FIELD`` (gone, tenant ended, slot memory not acceptable),
``SHUTTING_DOWN``, ``INTERNAL`` (cgroupfs write failed).
Sent by: ``krex run``.
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
