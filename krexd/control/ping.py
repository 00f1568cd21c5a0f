"""``ping``: is krexd there, and which one.

Request body: ``{}``.
Reply body: ``{"version": "0.1.0", "pid": <int>, "uptime_s": <float>,
"retry_tempfail": <int>, "warm": {...}, "cache": {...}}`` (``retry_tempfail``: ``[memory]
retry_tempfail``, the default of ``krex run --retry-tempfail``; ``warm``:
the ``[warm]`` settings ``krex run --warm`` keys and starts pools with:
``enabled``, ``modules``, ``idle_s``, ``key_prefixes``, ``key_names``,
``max_pools_per_uid``, ``memory_max``; ``cache``: the ``[cache]`` settings
``krex run`` gives commands their per-user compile caches with: ``enabled``,
``dir``, ``max_bytes``, krex_cli/compile_cache.py).
Errors: ``BAD_FIELD`` (unexpected body fields).
Sent by: ``krex run`` (before admission), ``krexctl status``, a warm pool's
keeper (to notice a krexd restart), tests.
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
