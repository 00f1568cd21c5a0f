"""The daemon's run state and background tasks: what the parts need from the event loop.

``Daemon`` owns one :class:`Runtime` and hands it to the parts that must
refuse work once shutdown begins or run something in the background
(lifecycle, the memory refresh), so that none of them needs the daemon itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

from krexd.system.errors import Code, KrexError

STARTING = "starting"
SERVING = "running"
STOPPING = "stopping"
RESTARTING = "restarting"  # leaving the tenants to the next krexd (krexd/restarts/restart.py)


class Runtime:
    """Run state (``starting``, ``running``, ``stopping``), uptime, background tasks."""

    def __init__(self) -> None:
        self.state = STARTING
        self.started_at = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()

    def uptime_s(self) -> float:
        """Seconds since krexd started (ms resolution)."""
        return round(time.monotonic() - self.started_at, 3)

    def check_serving(self) -> None:
        """Raise ``KrexError(SHUTTING_DOWN)`` once shutdown has begun."""
        if self.state in (STOPPING, RESTARTING):
            raise KrexError(Code.SHUTTING_DOWN, "krexd is stopping")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task kept alive until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
