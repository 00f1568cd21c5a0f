"""Admission (paper §4.3): slots per GPU, least-loaded placement, FIFO parking in krexd.

Requests park here, server-side, in arrival order; each release grants
every waiter that now fits.  Exclusive requests, memory needs with bounded
bypass, and the per-uid caps (``krexd.tenancy.quotas``):
docs/design/daemon.md "Admission", docs/design/memory.md "2. Admission by
memory".
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from krexd.system.errors import Code, KrexError
from krexd.tenancy.quotas import UidCaps, shown_command


class MemoryPolicy(Protocol):
    """What admission asks about a GPU's memory (``krexd.memory.policy.AdmissionPolicy``)."""

    def blocked(self, gpu: int) -> bool:
        """True while an allocation on ``gpu`` waits for co-tenants' memory."""
        ...

    def available(self, gpu: int) -> int | None:
        """Bytes admission may reserve on ``gpu`` before reservations (None: no limit)."""
        ...

    def refresh(self) -> None:
        """Re-read the memory counts now (called once per dispatch, before deciding)."""
        ...


@dataclass(eq=False)
class GpuSlots:
    """Admission's count for one GPU (it lives on ``orchestration.gpu.Gpu``; admission writes it).

    ``total`` slots (command concurrency), ``used`` by its tenants,
    ``exclusive`` while a whole-device lease holds them all, and the memory
    needs (bytes) reserved by its tenants.
    """

    index: int
    total: int
    used: int = 0
    exclusive: bool = False
    mem_reserved: int = 0


@dataclass(eq=False)
class Waiter:
    """A parked (or just granted) admission request."""

    gpu: int | None
    exclusive: bool
    launcher_pid: int
    argv: list[str]
    future: asyncio.Future[int]
    mem_bytes: int = 0  # memory need (bytes), reserved while admitted
    parked_at: float = field(default_factory=time.monotonic)
    waiting_for: str | None = None  # "slot" | "memory" after a dispatch found no GPU
    mem_gpu: int | None = None  # the GPU it waits for memory on
    bypassed: int = 0  # later requests granted its mem_gpu meanwhile
    uid: int = 0  # the verified caller's uid (krexd.tenancy.identity), for the per-uid caps

    def summary(self) -> dict[str, object]:
        """JSON-ready status row."""
        return {
            "gpu": self.gpu,
            "uid": self.uid,
            "exclusive": self.exclusive,
            "launcher_pid": self.launcher_pid,
            "command": shown_command(self.argv),
            "waiting_s": round(time.monotonic() - self.parked_at, 3),
            "mem_bytes": self.mem_bytes,
            "waiting_for": self.waiting_for,
            "mem_gpu": self.mem_gpu,
            "bypassed": self.bypassed,
        }


class Admission:
    """Slot accounting and the FIFO parking queue over the GPUs' slot counters ``gpus``.

    ``memory``: the memory policy asked at every decision (None: slots
    only); ``max_bypass``: its fairness bound (``[memory] max_bypass``);
    ``caps``: the per-uid caps (``krexd.tenancy.quotas``).
    """

    def __init__(
        self,
        gpus: Iterable[GpuSlots],
        max_parked: int = 4096,
        memory: MemoryPolicy | None = None,
        max_bypass: int = 4,
        caps: UidCaps | None = None,
    ) -> None:
        self._gpus = {g.index: g for g in gpus}
        self.caps = caps or UidCaps()
        self.max_parked = max_parked
        self.memory = memory
        self.max_bypass = max_bypass
        self._queue: deque[Waiter] = deque()
        self.granted_total = 0
        self.parked_total = 0
        self.paused: set[int] = set()  # GPUs admitting nothing for now (krexd.orchestration.faults)

    # --- placement ----------------------------------------------------------------

    def _fits(self, g: int, exclusive: bool, blocked: set[int]) -> bool:
        s = self._gpus[g]
        if g in blocked or g in self.paused or s.exclusive:
            return False
        return s.used == 0 if exclusive else s.used < s.total

    def _least_loaded(self, candidates: list[int]) -> int | None:
        return min(candidates, key=lambda g: (self._gpus[g].used, g)) if candidates else None

    def _mem_room(self, g: int) -> int | None:
        """Bytes still reservable on ``g`` (None: no memory limit)."""
        avail = self.memory.available(g) if self.memory is not None else None
        return None if avail is None else avail - self._gpus[g].mem_reserved

    def _mem_fits(self, g: int, need: int) -> bool:
        if self.memory is None:
            return True
        if self.memory.blocked(g):
            return False  # an allocation there waits for co-tenants' memory
        room = self._mem_room(g)
        return room is None or need <= room

    def _choose(self, w: Waiter, blocked: set[int], heads: list[Waiter]) -> int | None:
        gpus = [w.gpu] if w.gpu is not None else sorted(self._gpus)
        slot_ok = [g for g in gpus if self._fits(g, w.exclusive, blocked)]
        choice = self._least_loaded([g for g in slot_ok if self._mem_fits(g, w.mem_bytes)])
        w.waiting_for = w.mem_gpu = None
        if choice is None and w.exclusive:
            # Reserve a GPU for this waiter: later requests must not take its slots.
            w.waiting_for = "slot"
            target = self._least_loaded([g for g in gpus if g not in blocked])
            if target is not None:
                blocked.add(target)
        elif choice is None and slot_ok:
            # A slot is free but not the memory: wait for the GPU with the most room.
            w.waiting_for = "memory"
            w.mem_gpu = max(slot_ok, key=lambda g: (self._mem_room(g) or 0, -g))
            if w.bypassed >= self.max_bypass:
                blocked.add(w.mem_gpu)  # bypass used up: nobody later takes this GPU
            else:
                heads.append(w)
        elif choice is None:
            w.waiting_for = "slot"
        return choice

    def _grant(self, w: Waiter, g: int) -> None:
        s = self._gpus[g]
        if w.exclusive:
            s.exclusive = True
            s.used = s.total
        else:
            s.used += 1
        s.mem_reserved += w.mem_bytes
        self.caps.granted(w.uid)
        self.granted_total += 1
        w.future.set_result(g)

    def _dispatch(self) -> None:
        """Grant, in FIFO order, every parked waiter that fits now."""
        blocked: set[int] = set()
        heads: list[Waiter] = []  # earlier waiters waiting for memory, bypass left
        kept: deque[Waiter] = deque()
        if self.memory is not None and self._queue:
            self.memory.refresh()  # decide on the shim's counts as they are now
        while self._queue:
            w = self._queue.popleft()
            if w.future.done():
                continue  # cancelled while parked
            if not self.caps.may_grant(w.uid):
                kept.append(w)  # its uid holds its cap: later users' requests pass it
                continue
            g = self._choose(w, blocked, heads)
            if g is None:
                kept.append(w)
                continue
            self._grant(w, g)
            for h in heads:
                if h.mem_gpu == g:  # w overtook h on the GPU h waits for
                    h.bypassed += 1
                    if h.bypassed >= self.max_bypass:
                        blocked.add(g)
        self._queue = kept

    # --- pause (krexd.orchestration.faults: a GPU-wide fault under MPS) ---------------------

    def pause(self, gpu: int) -> None:
        """Admit nothing more to ``gpu`` until :meth:`resume` (parked requests wait)."""
        self.paused.add(gpu)

    def resume(self, gpu: int) -> None:
        """Admit to ``gpu`` again; grant parked waiters that fit."""
        self.paused.discard(gpu)
        self._dispatch()

    def kick(self) -> None:
        """Re-run dispatch (memory freed without a slot being released)."""
        self._dispatch()

    # --- API used by the admit/release ops -----------------------------------------

    def park(
        self,
        gpu: int | None,
        exclusive: bool,
        launcher_pid: int,
        argv: list[str],
        mem_bytes: int = 0,
        uid: int = 0,
    ) -> Waiter:
        """Queue a request and grant it at once if it fits; await ``waiter.future`` for the GPU.

        ``mem_bytes`` is the request's memory need (bytes), reserved on the
        granted GPU until :meth:`release`; ``uid`` is the verified caller's,
        counted against the per-uid caps.

        Raises ``KrexError(NO_SUCH_GPU)`` for an unknown ``gpu`` and
        ``KrexError(CANCELLED)`` when ``max_parked`` requests already wait,
        or ``max_parked_per_uid`` of ``uid``.
        """
        if gpu is not None and gpu not in self._gpus:
            raise KrexError(Code.NO_SUCH_GPU, f"no GPU {gpu} (GPUs: {sorted(self._gpus)})")
        if not self._gpus:
            raise KrexError(Code.NO_SUCH_GPU, "krexd manages no GPU (see --fake-gpus)")
        if len(self._queue) >= self.max_parked:
            raise KrexError(Code.CANCELLED, f"{len(self._queue)} requests already parked")
        self.caps.check_park(uid, (p.uid for p in self.parked))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        w = Waiter(gpu, exclusive, launcher_pid, argv, future, mem_bytes, uid=uid)
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

    def adopt(self, gpu: int, exclusive: bool, mem_bytes: int = 0, uid: int = 0) -> None:
        """Count a tenant of ``uid`` adopted after a restart as holding its slot(s) and
        memory need (bytes), against the per-uid caps too."""
        s = self._gpus[gpu]
        if exclusive:
            s.exclusive = True
            s.used = s.total
        else:
            s.used += 1
        s.mem_reserved += mem_bytes
        self.caps.granted(uid)

    def release(self, gpu: int, exclusive: bool, mem_bytes: int = 0, uid: int = 0) -> None:
        """Free the slot(s) and the memory reservation (bytes) of a tenant of ``gpu``
        owned by ``uid``; grant parked waiters that now fit."""
        self.caps.released(uid)
        s = self._gpus[gpu]
        if exclusive:
            s.exclusive = False
            s.used = 0
        elif s.used > 0:
            s.used -= 1
        s.mem_reserved = max(0, s.mem_reserved - mem_bytes)
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
            "max_bypass": self.max_bypass,
            "paused_gpus": sorted(self.paused),
        }
