"""``Freezer``: step 4 and its undo (step 7): the siblings' cgroups and the warm pools.

Siblings that drained early were frozen during the drain already
(``krexd.coordinator.drain_freeze``); step 4 freezes the rest.  The warm
pools (``krexd.pools.freeze``, a hold shared by every GPU's regions) are
asked to freeze once the gate is closed (step 2) and waited for beside the
siblings.

Freezing waits until the kernel reports every sibling frozen (bounded by
``freeze_timeout_s``); thawing never raises, so the gate is reopened all
the same.
"""

from __future__ import annotations

import asyncio
import time

from krexd.coordinator.isolation import freeze_unless_gone, gone
from krexd.coordinator.records import tenant_state
from krexd.coordinator.scope import GpuScope, log
from krexd.pools.freeze import PoolFreeze
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant


class Freezer:
    """Freeze and thaw of one GPU's sibling tenants, and its regions' hold of the pools.

    ``pool_freeze``: the warm pools' freeze every region holds (None:
    warm pools are off).
    """

    def __init__(self, scope: GpuScope, pool_freeze: PoolFreeze | None) -> None:
        self._scope = scope
        self.pool_freeze = pool_freeze

    async def freeze(self, siblings: list[Tenant], frozen: list[Tenant]) -> None:
        """Step 4: freeze each sibling's cgroup and wait until all report frozen.

        ``frozen`` collects every tenant whose cgroup was asked to freeze, so
        the caller can thaw exactly those on failure; it may hold some
        already (frozen during the drain, ``DrainFreeze``, or admitted
        during the entry): those are not asked again, but waited for too.
        A sibling whose cgroup disappears meanwhile (it ended) is skipped.

        Raises:
            KrexError: FREEZE_TIMEOUT when a sibling is not frozen after
                ``freeze_timeout_s``; OSError when a freeze cannot be written.
        """
        scope = self._scope
        for sib in siblings:
            if any(sib is f for f in frozen):
                continue  # admitted during this entry and frozen then (tenant_added)
            if not freeze_unless_gone(scope.control, sib):
                continue
            tenant_state(sib, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
            frozen.append(sib)
        timeout_s = scope.cfg.freeze_timeout_s
        # ``frozen`` may grow while we wait (tenant_added): wait for this snapshot.
        waiting = list(frozen)
        results = await asyncio.gather(*(self._wait_frozen(sib, timeout_s) for sib in waiting))
        stuck = [sib for sib, ok in zip(waiting, results, strict=True) if not ok]
        for sib, ok in zip(waiting, results, strict=True):
            if ok:
                tenant_state(sib, states.FREEZING, states.FROZEN)  # FREEZING -> FROZEN
        if stuck:
            # A task inside an uninterruptible call delays freezing; like container
            # runtimes, give up after the timeout, thaw back and fail the entry.
            names = ", ".join(f"tenant {s.id}" for s in stuck)
            raise KrexError(
                Code.FREEZE_TIMEOUT,
                f"siblings on GPU {scope.gpu} not frozen after {timeout_s:g} s: {names}",
            )

    def begin_pools(self) -> bool:
        """Step 2, once the gate is closed: ask the kernel to freeze the warm pools (a
        pool cannot open a GPU, so it need not drain first).  True when this region
        now holds the pools' freeze (release it with :meth:`thaw_pools`)."""
        if self.pool_freeze is None:
            return False
        self.pool_freeze.begin()
        return True

    async def wait_pools(self, held: bool) -> None:
        """Step 4, beside the siblings' freeze: wait until the pools stand still
        (``held``: :meth:`begin_pools` said so; False: nothing to wait for).

        Raises:
            KrexError: FREEZE_TIMEOUT when they are not frozen after
                ``freeze_timeout_s`` (the undo releases the hold).
        """
        if not held or self.pool_freeze is None:
            return
        timeout_s = self._scope.cfg.freeze_timeout_s
        if not await self.pool_freeze.wait_frozen(timeout_s):
            raise KrexError(
                Code.FREEZE_TIMEOUT,
                f"warm pools not frozen after {timeout_s:g} s ({self.pool_freeze.path})",
            )

    def thaw_pools(self) -> None:
        """Step 7: release one region's hold of the pools' freeze (the last hold thaws)."""
        if self.pool_freeze is not None:
            self.pool_freeze.release()

    async def _wait_frozen(self, sib: Tenant, timeout_s: float) -> bool:
        """Until ``sib`` reports frozen (True), or ``timeout_s`` s passed (False)."""
        try:
            return await self._scope.control.wait_frozen(sib, timeout_s)
        except OSError as exc:
            if gone(exc):
                return True  # the sibling ended: nothing left to run
            raise

    async def thaw(self, tenants: list[Tenant]) -> None:
        """Step 7: thaw each tenant's cgroup and wait until none reports frozen.

        Never raises: a sibling that cannot be thawed is logged and skipped,
        so that the others are thawed and the gate reopened all the same.
        Bounded by ``max(1, freeze_timeout_s)`` s in all.
        """
        scope = self._scope
        thawed: list[Tenant] = []
        for t in tenants:
            try:
                scope.control.thaw(t)
            except OSError as exc:
                if not gone(exc):
                    log.error("GPU %d: cannot thaw tenant %d: %s", scope.gpu, t.id, exc)
                continue
            thawed.append(t)
            # FROZEN/FREEZING -> THAWING -> RUNNING
            if tenant_state(t, (states.FROZEN, states.FREEZING), states.THAWING):
                tenant_state(t, states.THAWING, states.RUNNING)
        deadline = time.monotonic() + max(1.0, scope.cfg.freeze_timeout_s)
        for t in thawed:
            while time.monotonic() < deadline:
                try:
                    if not scope.control.is_frozen(t):
                        break
                except OSError:
                    break  # gone
                await asyncio.sleep(0.0005)
