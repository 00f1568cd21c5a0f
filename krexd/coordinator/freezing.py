"""Step 4 and its undo (step 7): freeze the siblings' cgroups, thaw them.

Siblings that drained early were frozen during the drain already
(``krexd.coordinator.drain_freeze``); step 4 freezes the rest.

Freezing waits until the kernel reports every sibling frozen (bounded by
``freeze_timeout_ms``); thawing never raises, so the gate is reopened all
the same.
"""

from __future__ import annotations

import asyncio
import logging
import time

from krexd import states
from krexd.coordinator.base import CoordinatorBase
from krexd.coordinator.records import tenant_state
from krexd.errors import Code, KrexError
from krexd.isolation import freeze_unless_gone, gone
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class Freezing(CoordinatorBase):
    """Freeze and thaw of sibling tenants through ``TenantControl``."""

    async def _freeze(self, siblings: list[Tenant], frozen: list[Tenant]) -> None:
        """Step 4: freeze each sibling's cgroup and wait until all report frozen.

        ``frozen`` collects every tenant whose cgroup was asked to freeze, so
        the caller can thaw exactly those on failure; it may hold some
        already (frozen during the drain, ``DrainFreeze``, or admitted
        during the entry): those are not asked again, but waited for too.
        A sibling whose cgroup disappears meanwhile (it ended) is skipped.
        """
        for sib in siblings:
            if any(sib is f for f in frozen):
                continue  # admitted during this entry and frozen then (tenant_added)
            if not freeze_unless_gone(self._ctl, sib):
                continue
            tenant_state(sib, states.RUNNING, states.FREEZING)  # RUNNING -> FREEZING
            frozen.append(sib)
        timeout_s = self._cfg.freeze_timeout_s
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
                f"siblings on GPU {self.gpu} not frozen after "
                f"{self._cfg.freeze_timeout_s:g} s: {names}",
            )

    def _begin_pools_freeze(self) -> bool:
        """Step 2, once the gate is closed: ask the kernel to freeze the warm pools
        (``krexd.pool_freeze``; a pool cannot open a GPU, so it need not drain first).

        True when this region holds the pools' freeze (release it with
        :meth:`_thaw_pools`).
        """
        if self.pool_freeze is None:
            return False
        self.pool_freeze.begin()
        return True

    async def _wait_pools_frozen(self, held: bool) -> None:
        """Step 4, beside the siblings' freeze: wait until the pools stand still;
        raises FREEZE_TIMEOUT when they do not freeze (the undo releases the hold)."""
        if not held or self.pool_freeze is None:
            return
        if not await self.pool_freeze.wait_frozen(self._cfg.freeze_timeout_s):
            raise KrexError(
                Code.FREEZE_TIMEOUT,
                f"warm pools not frozen after {self._cfg.freeze_timeout_s:g} s "
                f"({self.pool_freeze.path})",
            )

    def _thaw_pools(self, held: bool) -> None:
        """Step 7: release this region's hold of the pools' freeze (the last one thaws)."""
        if held and self.pool_freeze is not None:
            self.pool_freeze.release()

    async def _wait_frozen(self, sib: Tenant, timeout_s: float) -> bool:
        try:
            return await self._ctl.wait_frozen(sib, timeout_s)
        except OSError as exc:
            if gone(exc):
                return True  # the sibling ended: nothing left to run
            raise

    async def _thaw(self, tenants: list[Tenant]) -> None:
        """Thaw each tenant's cgroup and wait until none reports frozen.

        Never raises: a sibling that cannot be thawed is logged and skipped,
        so that the others are thawed and the gate reopened all the same.
        """
        thawed: list[Tenant] = []
        for t in tenants:
            try:
                self._ctl.thaw(t)
            except OSError as exc:
                if not gone(exc):
                    log.error("GPU %d: cannot thaw tenant %d: %s", self.gpu, t.id, exc)
                continue
            thawed.append(t)
            # FROZEN/FREEZING -> THAWING -> RUNNING
            if tenant_state(t, (states.FROZEN, states.FREEZING), states.THAWING):
                tenant_state(t, states.THAWING, states.RUNNING)
        deadline = time.monotonic() + max(1.0, self._cfg.freeze_timeout_s)
        for t in thawed:
            while time.monotonic() < deadline:
                try:
                    if not self._ctl.is_frozen(t):
                        break
                except OSError:
                    break  # gone
                await asyncio.sleep(0.0005)
