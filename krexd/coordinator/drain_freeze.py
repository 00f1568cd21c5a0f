"""Steps 3 and 4 overlapped: each sibling tenant is frozen as soon as it has drained.

:func:`drain_freezing` runs one entry's drain with the memory check beside
it; :class:`DrainFreeze` writes the freezes from the drain's thread
(docs/design/architecture.md "The region protocol, step by step").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable

from krexd.coordinator.isolation import TenantControl, freeze_unless_gone
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.records import Region, tenant_state
from krexd.coordinator.scope import GpuScope
from krexd.coordinator.steps import Steps
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant


class MemoryShort(Exception):
    """The memory check during the drain: the holder's need does not fit (entry undone)."""


async def drain_freezing(
    scope: GpuScope, steps: Steps, region: Region, locks: DriverLocks, check_memory: bool
) -> tuple[list[Tenant], set[int]]:
    """Step 3 of ``region``'s entry, each sibling frozen (step 4) as soon as it drained.

    The drain (``GateSteps.drain``) waits in a thread; each drained
    sibling's processes are locked through the driver first when
    ``steps.locks`` is enabled (``DriverLocking.lock_drained``), then
    frozen into ``region.siblings``.  With ``check_memory`` the memory check
    runs on the loop meanwhile.  Sets ``region.drain_ms`` (ms).

    Returns (the siblings not frozen during the drain, the overdue tenant
    ids: ``GateSteps.drain``'s result).

    Raises:
        MemoryShort: after the drain ended, when the check said the
            holder's need does not fit (the caller undoes the entry).
        KrexError: the drain's (DRAIN_TIMEOUT, INTERNAL).
    """
    tenant, epoch = region.tenant, region.epoch
    early = DrainFreeze(
        scope.control,
        scope.siblings(tenant),
        region.siblings,
        asyncio.get_running_loop(),
        (lambda drained: steps.locks.lock_drained(drained, locks)) if steps.locks.enabled else None,
    )
    t = time.monotonic()
    drain = asyncio.ensure_future(steps.gate.drain(tenant, epoch, early.settled))
    try:
        short = check_memory and await steps.memory.short(tenant)
        if short:
            early.stop()  # an entry to be undone freezes no more siblings
    finally:
        try:
            # Also after a failed check: no undo under a running drain.  A cancel
            # cancels the drain's task with this one (its thread runs on, as it did
            # before the check overlapped it); early.stop() then bars its freezes,
            # and the reopen makes it stale.
            await drain
        finally:
            rest = early.stop()  # no freeze from the drain's thread after this
    region.drain_ms = (time.monotonic() - t) * 1e3
    if short:
        raise MemoryShort
    return rest, drain.result()


class DrainFreeze:
    """The freezes written during one entry's drain.

    A sibling taken here is not waited for by the rest of the drain: every
    later gated call of it reads the closed gate and parks
    (docs/design/shim.md "The per-call protocol and its memory orders"),
    and a frozen drainer could not acknowledge anyway.  Threads:
    :meth:`settled` runs in the drain's thread; :meth:`stop` and the
    tenant-state edges (RUNNING -> FREEZING) run on the event loop.  A lock
    orders the two, so after ``stop`` no freeze is written, and every
    freeze written before it is in ``frozen`` (the list the failure path
    thaws) with its tenant marked FREEZING.

    Args:
        control: writes the freezes (``TenantControl.freeze``: one write
            to a held ``cgroup.freeze``, safe from any thread).
        siblings: the entry's siblings when the drain starts (never the
            holder); a tenant admitted later is frozen by ``tenant_added``.
        frozen: the entry's list of tenants whose freeze was written; each
            freeze written here is appended to it at once.
        loop: the event loop the entry runs on.
        before_freeze: called in the drain's thread with the tenants that
            drained since the last call, just before their freezes are
            written (the driver lock of their processes, all at once: a
            process is locked before it is frozen, never while frozen
            inside a driver call); None: nothing.
    """

    def __init__(
        self,
        control: TenantControl,
        siblings: list[Tenant],
        frozen: list[Tenant],
        loop: asyncio.AbstractEventLoop,
        before_freeze: Callable[[list[Tenant]], None] | None = None,
    ) -> None:
        self._ctl = control
        self._before_freeze = before_freeze
        self._waiting = list(siblings)  # not frozen yet
        self._frozen = frozen
        self._loop = loop
        self._lock = threading.Lock()
        self._stopped = False
        self._unmarked: list[Tenant] = []  # frozen here, not yet marked FREEZING
        self._skipped: set[int] = set()  # ids the drain was told to stop waiting for

    def settled(self, pending: set[int]) -> Iterable[int]:
        """Freeze every sibling with no registration in ``pending`` (tenant ids); its id list.

        Called from the drain's thread (``Gate.drain``).  A sibling whose
        cgroup is gone (it ended) is dropped; another ``OSError`` is raised,
        which ends the drain (the entry fails and thaws what was frozen).
        """
        taken: list[Tenant] = []
        skip: list[int] = []
        if self._before_freeze is not None:
            with self._lock:
                drained = [t for t in self._waiting if t.id not in pending and not self._stopped]
            if drained:  # outside the lock: stop() on the loop never waits for it
                self._before_freeze(drained)
        try:
            with self._lock:
                if self._stopped:
                    return []
                # Admitted during this entry and frozen at once (tenant_added): its
                # processes never ran since; its launcher, outside the cgroup, could
                # still flip forged slots and wake the drain for nothing.
                skip = [f.id for f in self._frozen if f.id not in self._skipped]
                for sib in [t for t in self._waiting if t.id not in pending]:
                    self._waiting.remove(sib)
                    if any(sib is f for f in self._frozen):
                        continue  # admitted during this entry and frozen then (tenant_added)
                    if not freeze_unless_gone(self._ctl, sib):
                        continue
                    self._frozen.append(sib)
                    self._unmarked.append(sib)
                    taken.append(sib)
        finally:
            if taken:
                self._loop.call_soon_threadsafe(self._mark)
        ids = skip + [t.id for t in taken if t.id not in skip]
        self._skipped.update(ids)
        return ids

    def stop(self) -> list[Tenant]:
        """No freeze from the drain after this (call on the loop); the siblings not frozen.

        Marks the tenants frozen so far FREEZING, so that a failed entry's
        thaw finds them in that state.
        """
        with self._lock:
            self._stopped = True
            rest = list(self._waiting)
        self._mark()
        return rest

    def _mark(self) -> None:
        """RUNNING -> FREEZING for the tenants frozen since the last call (on the loop)."""
        with self._lock:
            marked, self._unmarked = self._unmarked, []
        for sib in marked:
            tenant_state(sib, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
