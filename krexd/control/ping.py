"""``ping``: is krexd there, and which one.

Request, reply, errors and who sends it: docs/design/interfaces.md "Control plane".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import fields

if TYPE_CHECKING:
    from krexd.control.context import OpContext


async def handle(ctx: OpContext, req: Request) -> dict[str, Any]:
    """Answer with version, pid and uptime (s)."""
    fields.only(req.body)
    return ctx.about()
