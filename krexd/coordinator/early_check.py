"""Step 4's fail-closed check, begun during the drain for the siblings frozen early.

The siblings that ``DrainFreeze`` froze together during the drain (every
registration of them drained) get their part of the fail-closed check as
soon as the kernel reports them frozen, while the drain of the others goes
on: one worker thread per entry polls their ``cgroup.events``
(:class:`FrozenWatch`), and the check itself (``FailClosed``: the /proc
reads, then ending any unprotected GPU user and waiting until it left the
GPU) runs on the event loop as soon as a group is reported frozen.  The
loop never waits for the kernel's report itself, and no check begins once
the drain's end has reached the loop (:meth:`EarlyChecks.stop`), so
neither the drain's end nor step 4 is held up.  After step 4,
:meth:`EarlyChecks.finish` takes the result:

* a check begun is waited for (its siblings are not checked again);
* the siblings of a group not begun by the drain's end are checked with
  the siblings frozen in step 4, in one pass, as every sibling was before
  the early check existed: nothing on the critical path waits for an early
  check that could not start.

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
from dataclasses import dataclass, field
from typing import Any

from krexd.isolation import TenantControl
from krexd.tenants import Tenant

#: Poll period (s) of :class:`FrozenWatch` while its youngest group is under
#: 1 ms old (a freeze usually takes the kernel 0.1-0.3 ms; a sleep this
#: short lasts about 0.1 ms with the kernel's default timer slack), and
#: after that.  A group is first looked at one period after it was added.
POLL_S = 50e-6
POLL_SLOW_S = 500e-6


@dataclass(eq=False)
class _Group:
    """Siblings frozen together by the drain, until the kernel reported each frozen."""

    waiting: list[Tenant]
    since: float  # monotonic s
    frozen: list[Tenant] = field(default_factory=list)


class FrozenWatch:
    """One worker thread that waits for the kernel's report of frozen groups of siblings.

    Each group added (:meth:`add`, on the loop) is polled
    (``TenantControl.is_frozen``: one read of ``cgroup.events``) until every
    sibling of it reported frozen, or ``timeout_s`` passed; then
    ``ready(frozen)`` is called on the loop with those that did (a sibling
    whose cgroup cannot be read is left out).  The thread, taken from the
    loop's default executor at the first :meth:`add`, ends at
    :meth:`stop`; a group not reported by then is dropped.
    """

    def __init__(
        self, control: TenantControl, timeout_s: float, ready: Callable[[list[Tenant]], None]
    ) -> None:
        self._ctl = control
        self._timeout_s = timeout_s
        self._ready = ready
        self._lock = threading.Lock()
        self._groups: list[_Group] = []
        self._stopped = False
        self._wake = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, siblings: list[Tenant]) -> None:
        """Wait for ``siblings``' report (on the loop; nothing after :meth:`stop`)."""
        with self._lock:
            if self._stopped:
                return
            self._groups.append(_Group(list(siblings), time.monotonic()))
        self._wake.set()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.run_in_executor(None, self._run)

    def stop(self) -> None:
        """No report after this returns (from any thread); the thread ends soon after."""
        with self._lock:
            self._stopped = True
        self._wake.set()

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            self._wake.clear()  # before the look: an add after it sets it again
            with self._lock:
                if self._stopped:
                    return
                groups = list(self._groups)
            if not groups:
                self._wake.wait()
                continue
            now = time.monotonic()
            if all(now - g.since < POLL_S for g in groups):
                self._wake.wait(POLL_S)  # just frozen: the kernel is not done yet
                continue
            for g in groups:
                self._poll(g)
                if g.waiting and now - g.since < self._timeout_s:
                    continue
                with self._lock:
                    if self._stopped:
                        return
                    self._groups.remove(g)
                    try:  # under the lock: stop() returns only after every report left
                        loop.call_soon_threadsafe(self._ready, g.frozen)
                    except RuntimeError:
                        return  # the loop is closed
            young = any(now - g.since < 1e-3 for g in groups)
            self._wake.wait(POLL_S if young else POLL_SLOW_S)

    def _poll(self, g: _Group) -> None:
        for sib in list(g.waiting):
            try:
                if self._ctl.is_frozen(sib):
                    g.frozen.append(sib)
                    g.waiting.remove(sib)
            except OSError:
                g.waiting.remove(sib)  # left to the check after step 4


class EarlyChecks:
    """The early fail-closed checks of one region entry: one per group frozen together.

    Args:
        control: reads the kernel's report (``TenantControl.is_frozen``).
        timeout_s: the longest wait for a group's report (freeze_timeout_ms).
        check: ``check(siblings)``, on the loop, makes the check's reads of
            ``siblings`` (reported frozen) at once and returns what is left
            of it (ending unprotected GPU users, waiting until they left the
            GPU) to await.
        Without ``control`` and ``check`` (no ``GpuUseCheck``) nothing is started.
    """

    def __init__(
        self,
        control: TenantControl | None = None,
        timeout_s: float = 0.0,
        check: Callable[[list[Tenant]], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self._check = check
        self._control = control
        self._timeout_s = timeout_s
        self._watch: FrozenWatch | None = None  # made at the first start
        self._tasks: list[asyncio.Task[None]] = []  # the checks begun
        self._checked: set[int] = set()  # tenant ids
        self._closed = False

    def start(self, siblings: list[Tenant]) -> None:
        """Check ``siblings`` (frozen together, early) once reported frozen; on the loop.

        After :meth:`stop` nothing is started.
        """
        if self._control is None or self._check is None or self._closed or not siblings:
            return
        if self._watch is None:
            self._watch = FrozenWatch(self._control, self._timeout_s, self._begin)
        self._watch.add(siblings)

    def stop(self) -> None:
        """The drain is over: no check begins after this (on the loop).

        The groups not begun yet are left to the check after step 4: begun
        now, their reads would hold up step 4 on the event loop, and that
        check reads every remaining sibling in one pass anyway.
        """
        self._closed = True
        if self._watch is not None:
            self._watch.stop()

    def _begin(self, frozen: list[Tenant]) -> None:
        """``frozen`` were reported frozen: check them in a task (on the loop)."""
        if not self._closed and frozen:
            self._tasks.append(asyncio.get_running_loop().create_task(self._run(frozen)))

    async def _run(self, frozen: list[Tenant]) -> None:
        # One turn of the loop first: a drain's end already delivered to the
        # loop goes before these reads (and then they are left to step 4's end).
        await asyncio.sleep(0)
        if self._closed or self._check is None:
            return
        rest = self._check(frozen)  # the reads, now
        self._checked.update(t.id for t in frozen)
        await rest

    async def finish(self) -> set[int]:
        """After step 4: the ids of the siblings checked early, once their checks ended.

        The siblings of groups not begun (not reported frozen during the
        drain) are not among them: the caller checks them.  Raises what a
        check raised (the entry then fails and calls :meth:`cancel`).  With
        every check over already (or none begun) it costs no turn of the
        event loop.
        """
        self.stop()
        if all(t.done() for t in self._tasks):
            for t in self._tasks:
                t.result()  # raises what the check raised
        else:
            await asyncio.gather(*self._tasks)
        return set(self._checked)

    async def cancel(self) -> None:
        """Stop every check (the entry failed) and wait until they stopped; never raises."""
        self.stop()
        for task in self._tasks:
            task.cancel()
        # Their outcome (an error or a cancel) is the failed entry's business no more.
        await asyncio.gather(*self._tasks, return_exceptions=True)
