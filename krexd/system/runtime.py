"""The daemon's run state and background tasks: what the parts need from the event loop.

``Daemon`` owns one :class:`Runtime` and hands it to the parts that must
refuse work once shutdown begins or run something in the background
(lifecycle, the memory refresh), so that none of them needs the daemon itself.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Coroutine
from typing import Any

from krexd.system.errors import Code, KrexError


class RunState(enum.Enum):
    """krexd's run state; ``value`` is what ``status`` shows.  Edges: :data:`RUN_EDGES`."""

    STARTING = "starting"
    SERVING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"  # leaving the tenants to the next krexd (krexd/restarts/restart.py)


#: The run state's edges: serving once built; stopping or leaving for a restart is final.
RUN_EDGES: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.SERVING, RunState.STOPPING, RunState.RESTARTING}),
    RunState.SERVING: frozenset({RunState.STOPPING, RunState.RESTARTING}),
    RunState.STOPPING: frozenset(),
    RunState.RESTARTING: frozenset(),
}


class Runtime:
    """Run state (``starting``, ``running``, ``stopping``), uptime, background tasks."""

    def __init__(self) -> None:
        self._state = RunState.STARTING
        self.started_at = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()

    def uptime_s(self) -> float:
        """Seconds since krexd started (ms resolution)."""
        return round(time.monotonic() - self.started_at, 3)

    @property
    def state(self) -> RunState:
        """The run state now (changed only by :meth:`change`)."""
        return self._state

    def change(self, to: RunState) -> None:
        """Move to run state ``to``; ``ValueError`` for an edge not in :data:`RUN_EDGES`."""
        if to not in RUN_EDGES[self._state]:
            raise ValueError(f"krexd run state {self._state.value} -> {to.value} is not an edge")
        self._state = to

    def check_serving(self) -> None:
        """Raise ``KrexError(SHUTTING_DOWN)`` once shutdown has begun."""
        if self._state in (RunState.STOPPING, RunState.RESTARTING):
            raise KrexError(Code.SHUTTING_DOWN, "krexd is stopping")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task kept alive until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
