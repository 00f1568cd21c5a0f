"""Admission (paper §4.3): slots per GPU, least-loaded placement, FIFO parking in krexd.

Each GPU has ``slots_per_gpu`` slots (command concurrency).  A request names
a GPU or takes the least-loaded one (fewest used slots, then lowest index).
When nothing fits, the request is *parked* here, server-side, in arrival
order; clients do not poll.  Whenever a slot frees, the queue is scanned front
to back and every waiter that now fits is granted, so earlier requests always
win the slots they can use.

Exclusive requests (``krex run --exclusive``, paper §7 "whole-device lease")
take a GPU with no tenants and hold all its slots.  A parked exclusive waiter
reserves its GPU (the named one, else the least-loaded) so that later
requests cannot keep it busy for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from krexd.errors import Code, KrexError


@dataclass(eq=False)
class Waiter:
    """A parked (or just granted) admission request."""

    gpu: int | None
    exclusive: bool
    launcher_pid: int
    argv: list[str]
    future: asyncio.Future[int]
    parked_at: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, object]:
        """JSON-ready status row."""
        return {
            "gpu": self.gpu,
            "exclusive": self.exclusive,
            "launcher_pid": self.launcher_pid,
            "command": self.argv,
            "waiting_s": round(time.monotonic() - self.parked_at, 3),
        }


class Admission:
    """Slot accounting and the FIFO parking queue for GPUs ``gpus`` (host indices)."""

    def __init__(self, gpus: list[int], slots_per_gpu: int, max_parked: int = 4096) -> None:
        self.slots = {g: slots_per_gpu for g in gpus}
        self.used = {g: 0 for g in gpus}
        self.exclusive_on: set[int] = set()
        self.max_parked = max_parked
        self._queue: deque[Waiter] = deque()
        self.granted_total = 0
        self.parked_total = 0

    # --- placement ----------------------------------------------------------------

    def _fits(self, g: int, exclusive: bool, blocked: set[int]) -> bool:
        if g in blocked or g in self.exclusive_on:
            return False
        return self.used[g] == 0 if exclusive else self.used[g] < self.slots[g]

    def _least_loaded(self, candidates: list[int]) -> int | None:
        return min(candidates, key=lambda g: (self.used[g], g)) if candidates else None

    def _choose(self, w: Waiter, blocked: set[int]) -> int | None:
        gpus = [w.gpu] if w.gpu is not None else sorted(self.slots)
        fitting = [g for g in gpus if self._fits(g, w.exclusive, blocked)]
        choice = self._least_loaded(fitting)
        if choice is None and w.exclusive:
            # Reserve a GPU for this waiter: later requests must not take its slots.
            target = self._least_loaded([g for g in gpus if g not in blocked])
            if target is not None:
                blocked.add(target)
        return choice

    def _grant(self, w: Waiter, g: int) -> None:
        if w.exclusive:
            self.exclusive_on.add(g)
            self.used[g] = self.slots[g]
        else:
            self.used[g] += 1
        self.granted_total += 1
        w.future.set_result(g)

    def _dispatch(self) -> None:
        """Grant, in FIFO order, every parked waiter that fits now."""
        blocked: set[int] = set()
        kept: deque[Waiter] = deque()
        while self._queue:
            w = self._queue.popleft()
            if w.future.done():
                continue  # cancelled while parked
            g = self._choose(w, blocked)
            if g is None:
                kept.append(w)
            else:
                self._grant(w, g)
        self._queue = kept

    # --- API used by the admit/release ops -----------------------------------------

    def park(self, gpu: int | None, exclusive: bool, launcher_pid: int, argv: list[str]) -> Waiter:
        """Queue a request and grant it at once if it fits; await ``waiter.future`` for the GPU.

        Raises ``KrexError(NO_SUCH_GPU)`` for an unknown ``gpu`` and
        ``KrexError(CANCELLED)`` when ``max_parked`` requests already wait.
        """
        if gpu is not None and gpu not in self.slots:
            raise KrexError(Code.NO_SUCH_GPU, f"no GPU {gpu} (GPUs: {sorted(self.slots)})")
        if not self.slots:
            raise KrexError(Code.NO_SUCH_GPU, "krexd manages no GPU (see --fake-gpus)")
        if len(self._queue) >= self.max_parked:
            raise KrexError(Code.CANCELLED, f"{len(self._queue)} requests already parked")
        w = Waiter(gpu, exclusive, launcher_pid, argv, asyncio.get_running_loop().create_future())
        self._queue.append(w)
        self._dispatch()
        if not w.future.done():
            self.parked_total += 1
        return w

    def cancel(self, w: Waiter, code: Code = Code.CANCELLED, why: str = "cancelled") -> None:
        """Withdraw a parked waiter (its future fails with ``KrexError(code, why)``)."""
        if not w.future.done():
            w.future.set_exception(KrexError(code, why))
            # Mark the exception retrieved: the waiter's owner may be gone already.
            w.future.exception()
        self._dispatch()

    def release(self, gpu: int, exclusive: bool) -> None:
        """Free the slot(s) of a tenant of ``gpu`` and grant parked waiters that now fit."""
        if exclusive:
            self.exclusive_on.discard(gpu)
            self.used[gpu] = 0
        elif self.used[gpu] > 0:
            self.used[gpu] -= 1
        self._dispatch()

    def cancel_all(self, code: Code, why: str) -> None:
        """Fail every parked waiter (shutdown)."""
        for w in list(self._queue):
            if not w.future.done():
                w.future.set_exception(KrexError(code, why))
                w.future.exception()
        self._queue.clear()

    @property
    def parked(self) -> list[Waiter]:
        """Waiters still parked, in FIFO order."""
        return [w for w in self._queue if not w.future.done()]

    def status(self) -> dict[str, object]:
        """JSON-ready admission state for ``krexctl status``."""
        return {
            "parked": len(self.parked),
            "queue": [w.summary() for w in self.parked],
            "granted_total": self.granted_total,
            "parked_total": self.parked_total,
        }
