"""``pool_register``: a keeper registers its warm pool's zygote (``krex run --warm``).

Request body::

    {"pid": int, "key": str, "version": str, "interpreter": str, "modules": [str, ...]}

Reply body: ``{"cgroup": str, "memory_max": int|null, "idle_s": float}``.

The caller is the pool's keeper (``krex_cli.warm.keeper``), verified by the
kernel; ``pid`` is the zygote: a direct child of the caller, started after
it, with its uid (``krexd.tenancy.identity.check_child_of``), not inside krexd's
cgroup tree (a tenant's or a pool's cgroup: registering would move a
command's process out of its tenant).  krexd moves it into
``<root>/pools/u<uid>-p<pid>`` (``[warm] memory_max``) and from then on
``place`` accepts the zygote's unplaced children for tenants of that uid
(docs/design/security.md).  The registration lasts until the zygote or the
keeper exits (krexd watches both) or krexd stops; krexd never runs anything
of the pool's.  ``version`` must be krexd's own; ``key`` (at most 64
characters), ``interpreter`` and ``modules`` are shown by ``krexctl
status``.
Errors: ``CANCELLED`` (``[warm] enabled = false``; the uid already has
``[warm] max_pools_per_uid`` pools; the zygote has more than ``[warm]
pids_max`` threads), ``BAD_FIELD`` (another version, a pid
that is gone, a malformed field), ``AUTH`` (not the caller's child or
uid, inside krexd's cgroup tree), ``INTERNAL`` (cgroupfs), ``SHUTTING_DOWN``.
Sent by: the pool's keeper, once, when it has started the zygote.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields
from krexd.system.errors import Code, KrexError
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Check the fields and the caller, register the pool (``pools.registry.PoolRegistry``)."""
    fields.only(req.body, "pid", "key", "version", "interpreter", "modules")
    body = {
        "pid": fields.integer(req.body, "pid", 1, 1 << 22),
        "key": fields.string(req.body, "key", 64),
        "version": fields.string(req.body, "version", 64),
        "interpreter": fields.string(req.body, "interpreter", 4096),
        "modules": fields.str_list(req.body, "modules", 256) if req.body.get("modules") else [],
    }
    if ctx.pools is None:
        raise KrexError(Code.CANCELLED, "this krexd has no warm pools")
    ctx.check_serving()
    pool = ctx.pools.register(identity.caller(), body)
    return {
        "cgroup": pool.cgroup.path,
        "memory_max": ctx.pools.config.memory_max or None,
        "idle_s": ctx.pools.config.idle_s,
    }
