"""Step 4's fail-closed check, begun during the drain for the siblings frozen early.

A sibling that ``DrainFreeze`` froze during the drain (every registration
of it drained) gets its part of the fail-closed check
(``FailClosed._check_frozen``) as soon as its cgroup reports frozen, in a
task on the event loop (one per group of siblings the drain froze at the
same time), while the drain of the others goes on in its worker thread.
The check after step 4 then waits for these tasks and checks only the
siblings none of them confirmed (frozen in step 4, or admitted during the
entry).

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
from collections.abc import Callable, Coroutine
from typing import Any

from krexd.tenants import Tenant


class EarlyChecks:
    """The early fail-closed checks of one region entry: a task per group frozen together.

    Args:
        check: ``check(siblings)`` waits until each of ``siblings`` reports
            frozen, then checks those that did, in one pass (ends their
            unprotected GPU users and waits until they left the GPU), and
            returns their ids; a sibling it could not confirm frozen is left
            to the check after step 4.  None: no check (no ``GpuUseCheck``);
            nothing is started.
    """

    def __init__(
        self, check: Callable[[list[Tenant]], Coroutine[Any, Any, set[int]]] | None
    ) -> None:
        self._check = check
        self._tasks: list[asyncio.Task[set[int]]] = []
        self._closed = False

    def start(self, siblings: list[Tenant]) -> None:
        """Start the check of ``siblings`` (frozen together, early), on the loop.

        One task for them all: one read of the registrations, not one per
        sibling.  After :meth:`finish` or :meth:`cancel` nothing is started.
        """
        if self._check is None or self._closed or not siblings:
            return
        self._tasks.append(asyncio.get_running_loop().create_task(self._check(list(siblings))))

    async def finish(self) -> set[int]:
        """Wait for every check started; the ids of the siblings they checked.

        Raises what a check raised (the entry then fails and calls
        :meth:`cancel`, which stops the others).  Checks all done already
        (the usual case once step 4 waited for the freezes) cost no turn of
        the event loop.
        """
        self._closed = True
        if all(t.done() for t in self._tasks):
            done = [t.result() for t in self._tasks]
        else:
            done = await asyncio.gather(*self._tasks)
        return set().union(*done)

    async def cancel(self) -> None:
        """Cancel the checks still running and wait until they stopped (never raises)."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        # Their outcome (an error or a cancel) is the failed entry's business no more.
        await asyncio.gather(*self._tasks, return_exceptions=True)
