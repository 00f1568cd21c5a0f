"""``pool_register``: a keeper registers its warm pool's zygote (``krex run --warm``).

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
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
