"""A region's undo stack: the compensators of the steps it took, run last-first, once.

Region entry pushes one compensator as each step takes effect (the driver
locks, the siblings' freeze, the pools' freeze, the holder's cores); a
failed entry unwinds the stack, and so does the region's end (exit,
recovery, the end of an adopted region), so both undo through the same
code in the same order (paper §4.2 steps 7-8 mirror steps 3-5).  The gate's
reopen (step 8) is not on the stack: it comes after the unwind in both
paths, and only when the gate was closed.

Every compensator must not raise (each logs its own failure), so that
those after it still run: a sibling that cannot be thawed must not keep
the gate closed.  One that raises all the same is logged and the unwind
goes on (a hold left on the warm pools would freeze them for every region).
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
