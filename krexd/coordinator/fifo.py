"""A first-in, first-out asyncio lock with hand-off, for the per-GPU region lock.

Paper §4.2 step 1 admits one holder at a time but says nothing about order;
krex grants the region lock strictly in arrival order so that no tenant
starves (docs/design/architecture.md, step 1).  ``asyncio.Lock`` wakes
waiters in order too, but a task that arrives between a release and the
woken waiter's resumption can barge in; here ``release()`` hands ownership
directly to the oldest waiter, so arrival order is the grant order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FifoLock(Generic[T]):
    """A lock owned by one key at a time (a tenant), granted in arrival order.

    ``acquire(key)`` returns once ``key`` owns the lock.  Cancelling a
    waiting ``acquire`` removes the key from the queue; cancelling it after
    ownership was handed over but before the waiter resumed passes the lock
    on, so a cancelled waiter never keeps the lock.
    """

    def __init__(self) -> None:
        self._owner: T | None = None
        self._waiters: deque[tuple[T, asyncio.Future[None]]] = deque()

    @property
    def owner(self) -> T | None:
        """The key that owns the lock, or None when it is free."""
        return self._owner

    def queued(self) -> list[T]:
        """Keys waiting for the lock, oldest first."""
        return [key for key, fut in self._waiters if not fut.done()]

    def is_queued(self, key: T) -> bool:
        """True when ``key`` waits for the lock."""
        return any(k == key and not fut.done() for k, fut in self._waiters)

    async def acquire(self, key: T) -> None:
        """Wait until ``key`` owns the lock (FIFO among waiters).

        Raises:
            asyncio.CancelledError: the wait was cancelled; the lock is not
                held by ``key`` afterwards.
        """
        if self._owner is None and not self._waiters:
            self._owner = key
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, fut)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and self._owner == key:
                # Ownership was handed to us as we were cancelled: pass it on.
                self.release(key)
            else:
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
            raise

    def take(self, key: T) -> None:
        """Own the free lock at once (a region adopted after a restart).

        Raises:
            RuntimeError: the lock is owned or waited for.
        """
        if self._owner is not None or self._waiters:
            raise RuntimeError(f"take by {key!r}, but the lock is busy")
        self._owner = key

    def cancel(self, key: T) -> bool:
        """Drop a waiting ``key`` from the queue (its acquire raises CancelledError).

        Returns True when a waiter was cancelled.
        """
        for entry in list(self._waiters):
            k, fut = entry
            if k == key and not fut.done():
                fut.cancel()
                return True
        return False

    def release(self, key: T) -> None:
        """Release the lock held by ``key`` and hand it to the oldest waiter.

        Raises:
            RuntimeError: ``key`` does not own the lock.
        """
        if self._owner != key:
            raise RuntimeError(f"release by {key!r}, but the owner is {self._owner!r}")
        self._owner = None
        while self._waiters:
            next_key, fut = self._waiters.popleft()
            if fut.done():  # cancelled while waiting
                continue
            self._owner = next_key
            fut.set_result(None)
            return
