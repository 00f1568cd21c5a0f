"""``RequestQueue``: steps 0 and 1: the region requests recorded, and the region lock.

A request is recorded from its arrival to its region's end
(``RegionRequest``, its stage QUEUED, ENTERING, HELD), so that a cancel or
a tenant's end finds it at any stage, including the window between the
lock's hand-over and the waiter's resumption, and a second one is
NESTED_REGION.  The lock is FIFO (``krexd.coordinator.fifo``: no starvation).
"""

from __future__ import annotations

import asyncio
import time

from krexd.coordinator.fifo import FifoLock
from krexd.coordinator.records import ENTERING, HELD, QUEUED, RegionRequest, RequestStage
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant


class RequestQueue:
    """One GPU's region requests by tenant id, and its region lock."""

    def __init__(self) -> None:
        self._lock: FifoLock[int] = FifoLock()
        self._requests: dict[int, RegionRequest] = {}

    @property
    def owner(self) -> int | None:
        """The tenant id holding the region lock (None: free)."""
        return self._lock.owner

    def record(self, tenant: Tenant) -> RegionRequest:
        """Step 0: record ``tenant``'s request (QUEUED).

        Raises:
            KrexError: NESTED_REGION when it has one recorded already.
        """
        if tenant.id in self._requests:
            raise KrexError(Code.NESTED_REGION, f"tenant {tenant.id} is already in a region")
        request = self._requests[tenant.id] = RegionRequest(tenant.id)
        return request

    def drop(self, request: RegionRequest) -> None:
        """Forget ``request`` unless it is HELD (its region's end forgets it: :meth:`ended`)."""
        if request.stage != HELD and self._requests.get(request.tenant) is request:
            del self._requests[request.tenant]

    async def acquire(self, request: RegionRequest) -> float:
        """Step 1: wait for the region lock, FIFO; the monotonic s it was taken (ENTERING).

        Raises:
            KrexError: CANCELLED when the request was cancelled while it
                waited (the lock is not held then).
        """
        tenant = request.tenant
        try:
            await self._lock.acquire(tenant)
        except asyncio.CancelledError:
            raise KrexError(
                Code.CANCELLED, f"tenant {tenant} ended while waiting for the region"
            ) from None
        if request.cancelled:  # cancelled after the hand-over, before this task resumed
            self._lock.release(tenant)
            raise KrexError(Code.CANCELLED, f"tenant {tenant} cancelled its region")
        request.advance(ENTERING)
        return time.monotonic()

    def release(self, tenant: int) -> None:
        """Release the region lock ``tenant`` holds (after the gate reopened)."""
        self._lock.release(tenant)

    def ended(self, tenant: int) -> None:
        """``tenant``'s region ended: forget its request, release the lock."""
        self._requests.pop(tenant, None)
        self._lock.release(tenant)

    def cancel(self, tenant: Tenant) -> RequestStage | None:
        """Mark ``tenant``'s request cancelled (its entry honours it at its next step);
        withdraw it from the lock's queue if QUEUED.  Its stage, None without one."""
        request = self._requests.get(tenant.id)
        if request is None:
            return None
        request.cancelled = True
        if request.stage == QUEUED:
            self._lock.cancel(tenant.id)  # False in the hand-over window: the entry sees the flag
        return request.stage

    def gone(self, tenant: Tenant) -> None:
        """``tenant`` ended: its request is cancelled, also in the lock's hand-over window
        and while its entry waits for memory."""
        request = self._requests.get(tenant.id)
        if request is not None:
            request.cancelled = True
        self._lock.cancel(tenant.id)

    def cancel_all(self, memory_waiter: int | None) -> None:
        """At shutdown: withdraw every queued request and the one waiting for memory."""
        for key in self._lock.queued():
            self._lock.cancel(key)
        request = self._requests.get(memory_waiter) if memory_waiter is not None else None
        if request is not None:
            request.cancelled = True  # its entry stops waiting for memory

    def adopt(self, tenant: int) -> None:
        """A region adopted after a restart: its holder's request replays QUEUED ->
        ENTERING -> HELD through its guard, and it holds the lock."""
        self._lock.take(tenant)
        request = self._requests[tenant] = RegionRequest(tenant)
        request.advance(ENTERING)
        request.advance(HELD)

    def queued(self) -> list[int]:
        """Tenant ids waiting for the region lock, in order."""
        return self._lock.queued()
