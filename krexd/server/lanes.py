"""Fair shares of the control plane: per-uid request caps, region ops ahead of bulk ones.

Every request counts against its caller's uid while it is served; bulk
requests (``status``) wait in one FIFO lane served one at a time, only
while no region operation is in progress, and paced per uid, so a status
flood delays the flooding user's replies, never another user's regions.
docs/design/security.md "3. No squatting, no starvation: no user can stall
another".
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any

from krexd.system.errors import Code, KrexError

REGION_OPS = frozenset({"region_enter", "region_exit", "region_cancel"})
BULK_OPS = frozenset({"status"})
BULK_DEFER_S = 0.05  # longest a bulk request waits for region ops to go quiet
_POLL_S = 0.001
EXEMPT_UID = 0
NO_CALLER = -1
Job = Callable[[], Coroutine[Any, Any, None]]


class Lanes:
    """Per-uid counts of requests in progress and the bulk lane.

    Args:
        max_requests_per_uid: requests one uid may have in progress (0: no cap).
        max_bulk_per_uid: bulk requests one uid may have queued or running (0: no cap).
        bulk_per_s_per_uid: bulk requests of one uid served per second at most (0: no
            pace); root's are never paced.
    """

    def __init__(
        self,
        max_requests_per_uid: int = 0,
        max_bulk_per_uid: int = 0,
        bulk_per_s_per_uid: float = 0.0,
    ) -> None:
        self.max_requests = max_requests_per_uid
        self.max_bulk = max_bulk_per_uid
        self.bulk_interval_s = 1.0 / bulk_per_s_per_uid if bulk_per_s_per_uid > 0 else 0.0
        self._last_bulk: dict[int, float] = {}  # uid key -> monotonic s of its last bulk job
        self._requests: Counter[int] = Counter()
        self._bulk_of: Counter[int] = Counter()
        self._bulk: deque[tuple[int, Job]] = deque()
        self._ready = asyncio.Event()
        self.region_busy = 0  # region ops being dispatched now
        self.refused = 0
        self.bulk_served = 0
        self._taken: Job | None = None  # out of the queue, waiting for region ops to pass
        self.running: asyncio.Future[None] | None = None  # the bulk job being served

    def admit(self, uid: int | None, op: str) -> int:
        """Count a request of ``uid`` for ``op``; its uid key for :meth:`done`.

        Raises ``KrexError(TOO_MANY)`` when the uid is at a cap (nothing counted).
        """
        key = NO_CALLER if uid is None else uid
        if key != EXEMPT_UID:
            if self.max_requests and self._requests[key] >= self.max_requests:
                self.refused += 1
                raise KrexError(
                    Code.TOO_MANY,
                    f"uid {key} already has {self._requests[key]} requests in progress "
                    "([daemon] max_requests_per_uid)",
                )
            if op in BULK_OPS and self.max_bulk and self._bulk_of[key] >= self.max_bulk:
                self.refused += 1
                raise KrexError(
                    Code.TOO_MANY,
                    f"uid {key} already has {self._bulk_of[key]} {op} requests waiting "
                    "([daemon] max_status_per_uid)",
                )
        self._requests[key] += 1
        if op in BULK_OPS:
            self._bulk_of[key] += 1
        if op in REGION_OPS:
            self.region_busy += 1
        return key

    def done(self, key: int, op: str) -> None:
        """The request counted by :meth:`admit` (``key``, ``op``) ended."""
        _drop(self._requests, key)
        if op in BULK_OPS:
            _drop(self._bulk_of, key)
        if op in REGION_OPS:
            self.region_busy = max(0, self.region_busy - 1)

    def queue_bulk(self, key: int, job: Job) -> None:
        """Queue the bulk request ``job`` (a coroutine function) of uid key ``key``."""
        self._bulk.append((key, job))
        self._ready.set()

    def status(self) -> dict[str, float]:
        """``{"in_progress", "bulk_queued", "refused", "bulk_served", ...caps}``."""
        return {
            "in_progress": sum(self._requests.values()),
            "bulk_queued": len(self._bulk),
            "refused": self.refused,
            "bulk_served": self.bulk_served,
            "max_requests_per_uid": self.max_requests,
            "max_status_per_uid": self.max_bulk,
            "status_per_s_per_uid": round(1.0 / self.bulk_interval_s, 3)
            if self.bulk_interval_s
            else 0,
        }

    async def run(self) -> None:
        """Serve the bulk lane until cancelled: one job at a time, after region ops,
        each uid's paced."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._bulk:
                job = await self._next_bulk()
                if job is None:
                    continue  # the queue changed (or a uid became due): look again
                self._taken = job
                await self._after_region_ops()
                if self._taken is not job:
                    continue  # taken by cancel_bulk (a stop), which answers it
                self._taken = None
                self.bulk_served += 1
                # Its own task: a stop cancels this runner, not a reply half made.
                self.running = asyncio.ensure_future(job())
                try:
                    await asyncio.shield(self.running)
                finally:
                    if self.running.done():
                        self.running = None

    async def _next_bulk(self) -> Job | None:
        """The first queued job whose uid may be served now (taken out of the queue);
        otherwise None, after waiting until one's uid is due or a job is queued."""
        now = time.monotonic()
        soonest = math.inf
        for i, (key, job) in enumerate(self._bulk):
            due = now
            if key != EXEMPT_UID and self.bulk_interval_s:
                due = self._last_bulk.get(key, -math.inf) + self.bulk_interval_s
            if due <= now:
                del self._bulk[i]
                if self.bulk_interval_s and key != EXEMPT_UID:
                    self._remember(key, now)
                return job
            soonest = min(soonest, due)
        self._ready.clear()
        try:
            await asyncio.wait_for(self._ready.wait(), soonest - now)
        except TimeoutError:
            pass
        return None

    def _remember(self, key: int, now: float) -> None:
        """When ``key``'s last bulk job was served; entries no longer pacing anyone are
        dropped once there are many (bounded by the uids served in one interval)."""
        self._last_bulk[key] = now
        if len(self._last_bulk) > 1024:
            horizon = now - self.bulk_interval_s
            self._last_bulk = {k: t for k, t in self._last_bulk.items() if t > horizon}

    def cancel_bulk(self) -> list[Job]:
        """Take every bulk job not started out (shutdown): the queued ones and one taken
        out of the queue that waits for region ops to pass; the caller answers them (the
        one being served, :attr:`running`, answers itself)."""
        jobs = [job for _, job in self._bulk]
        if self._taken is not None:
            jobs.insert(0, self._taken)
            self._taken = None
        self._bulk.clear()
        return jobs

    async def _after_region_ops(self) -> None:
        """Yield to the loop; wait while region ops are dispatched, at most BULK_DEFER_S."""
        await asyncio.sleep(0)
        deadline = time.monotonic() + BULK_DEFER_S
        while self.region_busy and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)


def _drop(counter: Counter[int], key: int) -> None:
    if counter[key] > 1:
        counter[key] -= 1
    else:
        counter.pop(key, None)
