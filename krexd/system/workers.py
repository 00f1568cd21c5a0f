"""Daemon worker threads for calls that may never return (the driver's lock).

``concurrent.futures.ThreadPoolExecutor`` suits calls that end: its threads
are joined at interpreter exit and a full pool queues new work behind the
running calls.  A driver call on a process that cannot run (frozen,
stopped) may block for as long as that process does, so krexd's driver
lock (``krexd.hardware.driverlock``) runs its calls here instead: a call never waits
for a free thread (a new one is started when none is idle), and the threads
are daemons, so a call that never returns holds neither krexd's stop nor
the calls after it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

#: Idle threads kept for reuse; more than this many idle ones exit.
KEEP_IDLE = 16


class DaemonWorkers:
    """Run callables on daemon threads, never queued behind a busy one.

    ``name``: the threads' name prefix (shown by ``ps -L`` and py-spy).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._mu = threading.Lock()
        self._idle = 0  # threads waiting for a job
        self._started = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on an idle thread, or on a new one when none is idle."""
        fut: Future[T] = Future()
        with self._mu:
            if self._idle > 0:
                self._idle -= 1  # this job is that thread's
            else:
                self._started += 1
                threading.Thread(
                    target=self._work, name=f"{self._name}-{self._started}", daemon=True
                ).start()
        self._jobs.put((fn, args, fut))
        return fut

    def _work(self) -> None:
        while True:
            fn, args, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                result, error = None, None
            else:
                try:
                    result, error = fn(*args), None
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    result, error = None, exc
            # Idle before the caller hears back: its next call reuses this thread.
            with self._mu:
                stay = self._idle < KEEP_IDLE
                self._idle += stay
            if fut.running():
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result)
            if not stay:
                return
