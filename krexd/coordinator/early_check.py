"""Step 4's fail-closed check, begun during the drain for the siblings frozen early.

The siblings that ``DrainFreeze`` froze together during the drain (every
registration of them drained) get their part of the fail-closed check as
soon as the kernel reports them frozen, while the drain of the others goes
on: a worker thread polls their ``cgroup.events``
(:func:`wait_reported_frozen`), and the check itself (``FailClosed``: the
/proc reads, then ending any unprotected GPU user and waiting until it left
the GPU) runs on the event loop as soon as they all are.  The loop is never
blocked by that wait, so the end of the drain and step 4 are not delayed
by it.  After step 4, :meth:`EarlyChecks.finish` takes the result:

* a check begun is waited for (its siblings are not checked again);
* a wait not over yet is stopped, and its siblings are checked with the
  siblings frozen in step 4, in one pass, as they were before the early
  check existed: nothing on the critical path waits for an early check
  that could not start.

Why an early check judges exactly what the check after step 4 would have
judged for its siblings:

* their drain is over: ``DrainFreeze`` freezes a tenant only once none of
  its registrations is pending, and the drain never waits for it again;
* they are frozen before the check's first read (the kernel reported
  ``frozen 1`` for each), so none of their processes can open the GPU,
  register, exec or fork between the check and the grant;
* they stay frozen until the grant: nothing thaws a sibling during an
  entry except the entry's own failure, which stops these checks
  (:meth:`EarlyChecks.cancel`) and thaws every sibling (no region is
  granted then).

A process moved into a sibling's cgroup by ``place`` after its check is one
that ran outside every tenant until then; the same move just after the
grant is not checked by any region either.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from krexd.isolation import TenantControl
from krexd.tenants import Tenant

#: First poll period (s) of :func:`wait_reported_frozen` (a freeze usually
#: takes the kernel 0.1-0.3 ms), and the longest once it has waited 1 ms.
POLL_S = 20e-6
POLL_SLOW_S = 500e-6


def wait_reported_frozen(
    control: TenantControl, siblings: list[Tenant], timeout_s: float, stop: threading.Event
) -> list[Tenant]:
    """Block until the kernel reports each of ``siblings`` frozen; those it did.

    Polls ``control.is_frozen`` (``cgroup.events``) every few tens of µs,
    every :data:`POLL_SLOW_S` after the first millisecond; returns when all
    are frozen, after ``timeout_s`` or once ``stop`` is set.  A sibling whose
    cgroup cannot be read (it ended) is not among those returned.  Runs in a
    worker thread: it never blocks the event loop.
    """
    start = time.monotonic()
    waiting, frozen = list(siblings), []
    while True:
        for sib in list(waiting):
            try:
                if control.is_frozen(sib):
                    frozen.append(sib)
                    waiting.remove(sib)
            except OSError:
                waiting.remove(sib)  # left to the check after step 4
        waited = time.monotonic() - start
        if not waiting or stop.is_set() or waited >= timeout_s:
            return frozen
        time.sleep(POLL_S if waited < 1e-3 else POLL_SLOW_S)


class EarlyChecks:
    """The early fail-closed checks of one region entry: one per group frozen together.

    Args:
        confirm: ``confirm(siblings, stop)`` blocks (in a worker thread)
            until the kernel reports the siblings frozen, or ``stop`` is
            set; returns those it reported frozen (:func:`wait_reported_frozen`).
        check: ``check(siblings)``, on the loop, makes the check's reads at
            once and returns what is left of it (ending unprotected GPU
            users, waiting until they left the GPU) to await.
        None for both: no check (no ``GpuUseCheck``); nothing is started.
    """

    def __init__(
        self,
        confirm: Callable[[list[Tenant], threading.Event], list[Tenant]] | None = None,
        check: Callable[[list[Tenant]], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._confirm = confirm
        self._check = check
        self._tasks: list[asyncio.Task[None]] = []
        self._checking: set[asyncio.Task[None]] = set()  # their check begun
        self._checked: set[int] = set()  # tenant ids
        self._stop = threading.Event()
        self._closed = False

    def start(self, siblings: list[Tenant]) -> None:
        """Check ``siblings`` (frozen together, early) once reported frozen; on the loop.

        After :meth:`finish` or :meth:`cancel` nothing is started.
        """
        if self._confirm is None or self._closed or not siblings:
            return
        self._tasks.append(asyncio.get_running_loop().create_task(self._run(list(siblings))))

    async def _run(self, siblings: list[Tenant]) -> None:
        assert self._confirm is not None and self._check is not None
        frozen = await asyncio.to_thread(self._confirm, siblings, self._stop)
        if self._closed or not frozen:
            return  # left to the check after step 4
        rest = self._check(frozen)  # the reads, now: frozen, they are checked
        self._checked.update(t.id for t in frozen)
        task = asyncio.current_task()
        assert task is not None
        self._checking.add(task)
        await rest

    async def finish(self) -> set[int]:
        """After step 4: the ids of the siblings checked early, once their checks ended.

        Stops the waits not over yet (their siblings were not checked: the
        caller checks them).  Raises what a check raised (the entry then
        fails and calls :meth:`cancel`).  With every check already over (or
        none begun) it costs no turn of the event loop.
        """
        self._closed = True
        self._stop.set()
        begun: list[asyncio.Task[None]] = []
        for task in self._tasks:
            if task.done():
                task.result()  # raises what the check raised
            elif task in self._checking:
                begun.append(task)
            else:
                task.cancel()  # still waiting for the kernel: not checked
        if begun:
            await asyncio.gather(*begun)
        return set(self._checked)

    async def cancel(self) -> None:
        """Stop every check (the entry failed) and wait until they stopped; never raises."""
        self._closed = True
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        # Their outcome (an error or a cancel) is the failed entry's business no more.
        await asyncio.gather(*self._tasks, return_exceptions=True)
