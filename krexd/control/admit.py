"""``admit``: ask for a slot on a GPU; parked in krexd (FIFO) until one is free.

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
    """Park until a slot is granted, then create the tenant and its cgroup."""
    fields.only(req.body, "argv", "gpu", "exclusive", "launcher_pid", "mem_bytes", "label", "mps")
    argv = fields.str_list(req.body, "argv")
    gpu = fields.integer(req.body, "gpu", 0, 1 << 16, default=None)
    exclusive = fields.boolean(req.body, "exclusive")
    launcher_pid = fields.integer(req.body, "launcher_pid", 1, 1 << 22, default=None)
    mem_bytes = fields.integer(req.body, "mem_bytes", 0, (1 << 60) - 1, default=None)
    label = fields.string(req.body, "label", 512, default=None)
    mps = fields.boolean(req.body, "mps", default=True)
    launcher = identity.caller()
    identity.check_launcher_claim(launcher, launcher_pid)
    tenant = await ctx.lifecycle.admit(
        argv, gpu, exclusive, launcher, mem_bytes, label, without_mps=not mps
    )
    reply = {
        "tenant": tenant.id,
        "token": tenant.token,
        "gpu": tenant.gpu,
        "env": ctx.lifecycle.tenant_env(tenant),
    }
    slots = ctx.lifecycle.registration_memory(tenant)
    if slots is not None:
        reply["slots"] = slots
    return reply
