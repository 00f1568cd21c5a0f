"""Step 4's fail-closed check, begun during the drain for the siblings frozen early.

A sibling that ``DrainFreeze`` froze during the drain (every registration
of it drained) gets its part of the fail-closed check
(``FailClosed._check_frozen``) as soon as its cgroup reports frozen, in a
task on the event loop, while the drain of the others goes on in its
worker thread.  The check after step 4 then waits for these tasks and
checks only the siblings none of them confirmed (frozen in step 4, or
admitted during the entry).

Why a check made early judges exactly what the check after step 4 would
have judged for that sibling:

* its drain is over: ``DrainFreeze`` freezes a tenant only once none of
  its registrations is pending, and the drain never waits for it again;
* it is frozen before its check starts (the task waits until the kernel
  reports ``frozen 1``), so none of its processes can open the GPU,
  register, exec or fork between its check and the grant;
* it stays frozen until the grant: nothing thaws a sibling during an
  entry except the entry's own failure, which cancels these tasks and
  thaws every sibling (no region is granted then).

A process moved into the sibling's cgroup by ``place`` after its check is
one that ran outside every tenant until then; the same move just after
the grant is not checked by any region either.

All calls are made on the event loop; the tasks are cancelled (and
awaited) by :meth:`EarlyChecks.cancel` when the entry fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from krexd.tenants import Tenant


class EarlyChecks:
    """The early fail-closed checks of one region entry: a task per sibling frozen early.

    Args:
        check: ``check(sibling)`` waits until the sibling reports frozen,
            then checks it (ends its unprotected GPU users and waits until
            they left the GPU); returns True when it did, False when it did
            not confirm the sibling frozen (the check after step 4 takes it
            then).  None: no check (no ``GpuUseCheck``); nothing is started.
    """

    def __init__(self, check: Callable[[Tenant], Coroutine[Any, Any, bool]] | None) -> None:
        self._check = check
        self._tasks: dict[int, asyncio.Task[bool]] = {}  # by tenant id
        self._closed = False

    def start(self, siblings: Iterable[Tenant]) -> None:
        """Start the check of each of ``siblings`` (frozen early; on the loop).

        A sibling already started is not started again; after
        :meth:`finish` or :meth:`cancel` nothing is started.
        """
        if self._check is None or self._closed:
            return
        loop = asyncio.get_running_loop()
        for sib in siblings:
            if sib.id not in self._tasks:
                self._tasks[sib.id] = loop.create_task(self._check(sib))

    async def finish(self) -> set[int]:
        """Wait for every check started; the ids of the siblings they checked.

        Raises what a check raised (the entry then fails and calls
        :meth:`cancel`, which stops the others).
        """
        self._closed = True
        ids = list(self._tasks)
        done = await asyncio.gather(*self._tasks.values())
        return {tid for tid, checked in zip(ids, done, strict=True) if checked}

    async def cancel(self) -> None:
        """Cancel the checks still running and wait until they stopped (never raises)."""
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        # Their outcome (an error or a cancel) is the failed entry's business no more.
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
