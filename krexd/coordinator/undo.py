"""A region's undo stack: the compensators of the steps it took, run last-first, once.

Every region entry pushes one as each step takes effect, the gate's reopen
(step 8) first; a failed entry, the region's end and an adopted region's
end all unwind it (docs/design/architecture.md "The region protocol, step
by step").  A compensator must not raise: one that does is logged and the
unwind goes on, so a sibling that cannot be thawed never keeps the gate
closed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

Compensator = Callable[[], Awaitable[None] | None]

_log = logging.getLogger("krexd.coordinator")


class UndoStack:
    """Named compensators, unwound last-pushed first; each runs at most once."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Compensator]] = []

    def push(self, name: str, undo: Compensator) -> None:
        """Record ``undo`` (a function or coroutine function of no arguments) for step ``name``."""
        self._steps.append((name, undo))

    def names(self) -> list[str]:
        """The names pushed and not yet unwound, in push order."""
        return [name for name, _ in self._steps]

    async def unwind(self) -> list[str]:
        """Run every compensator, last-pushed first; returns their names in run order.

        A second call runs nothing (the stack is empty after the first).  A
        cancel that arrives during a step does not skip the steps after it (a
        sibling left frozen or locked would outlive the region): every step
        runs, then the cancel is raised.
        """
        ran = []
        cancelled: asyncio.CancelledError | None = None
        while self._steps:
            name, undo = self._steps.pop()
            try:
                result = undo()
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError as exc:
                cancelled = exc
            except Exception:
                # A compensator must not raise; one that does is logged, and the rest
                # still run (a hold left on the pools would freeze them for every region).
                _log.exception("undo of %s failed", name)
            ran.append(name)
        if cancelled is not None:
            raise cancelled
        return ran
