"""Control-plane ops: one module per op (requests and replies: docs/design/interfaces.md).

``OPS`` maps the ``op`` string of a request to ``handle(ctx, req) -> body``; ``ctx``
is the :class:`krexd.control.context.OpContext` the daemon builds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from krex_client.protocol import Request
from krexd.control import (
    admit,
    memory,
    ping,
    place,
    pool_register,
    region_cancel,
    region_enter,
    region_exit,
    release,
    status,
)

if TYPE_CHECKING:
    from krexd.control.context import OpContext

Handler = Callable[["OpContext", Request], Awaitable[dict[str, Any]]]

OPS: dict[str, Handler] = {
    "ping": ping.handle,
    "status": status.handle,
    "admit": admit.handle,
    "place": place.handle,
    "release": release.handle,
    "memory": memory.handle,
    "pool_register": pool_register.handle,
    "region_enter": region_enter.handle,
    "region_exit": region_exit.handle,
    "region_cancel": region_cancel.handle,
}
