"""``RegionWatch``: what ends a region when its holder cannot (recovery); its log lines.

The holder's process exits, or the region outlives ``max_region_s``: the
region is ended through the one end path (``GatedRegions._end``), bound to
that ``Region``, so a late recovery is a no-op for a newer region.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from krexd.coordinator.isolation import gone
from krexd.coordinator.records import Region
from krexd.coordinator.scope import GpuScope, log
from krexd.system.journal import log_fields

#: ``end(region, reason)``: the one end path (None when the region had ended already).
EndRegion = Callable[[Region, str], Coroutine[Any, Any, float | None]]


class RegionWatch:
    """One GPU's recovery: watches each granted region, ends it in the background."""

    def __init__(self, scope: GpuScope, end: EndRegion) -> None:
        self._scope = scope
        self._end = end
        self._tasks: set[asyncio.Task[Any]] = set()  # recoveries in flight

    def watch(self, region: Region) -> None:
        """Recover when the holder's process exits or ``region`` outlives max_region_s."""
        region.holder_watch = self._scope.control.watch_exit(
            region.pid, lambda: self._spawn(self._end(region, "holder process exited"))
        )
        max_s = self._scope.cfg.max_region_s
        if max_s > 0:
            region.timer = asyncio.get_running_loop().call_later(max_s, self._expire, region)

    @staticmethod
    def unwatch(region: Region) -> None:
        """Stop watching ``region`` (its end began)."""
        if region.holder_watch is not None:
            region.holder_watch.cancel()
            region.holder_watch = None
        if region.timer is not None:
            region.timer.cancel()
            region.timer = None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a recovery in the background, keeping it referenced and its errors logged."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("GPU %d: recovery failed", self._scope.gpu, exc_info=t.exception())

        task.add_done_callback(done)

    def _expire(self, region: Region) -> None:
        """max_region_s passed: kill the holder's command, then end its region."""
        if region.ended:
            return
        scope = self._scope
        reason = f"critical region exceeded max_region_s = {scope.cfg.max_region_s:g} s"
        region.tenant.kill_reason = reason
        scope.stats.end("max_region")
        log.warning(
            "GPU %d: tenant %d: %s; killing its command",
            scope.gpu,
            region.tenant.id,
            reason,
            extra=log_fields(
                "command_ended", region.tenant.id, scope.gpu, region.epoch, "max_region"
            ),
        )
        try:
            scope.control.kill(region.tenant)
        except OSError as exc:
            if not gone(exc):
                log.error("GPU %d: cannot kill tenant %d: %s", scope.gpu, region.tenant.id, exc)
        self._spawn(self._end(region, reason))


def log_grant(scope: GpuScope, region: Region) -> None:
    """Log ``region``'s grant at debug, with its wait and entry time (ms)."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "GPU %d: tenant %d granted a region (epoch %d) after %.3f ms",
            scope.gpu,
            region.tenant.id,
            region.epoch,
            region.wait_ms + region.establish_ms,
            extra=log_fields("region_granted", region.tenant.id, scope.gpu, region.epoch),
        )


def log_end(scope: GpuScope, region: Region, reason: str) -> None:
    """Count and log a region's end: recovery at warning (``recovered``), an exit
    (``reason`` "exit", ``completed``) at debug."""
    if reason != "exit":
        scope.stats.recovered += 1
        log.warning(
            "GPU %d: region of tenant %d (epoch %d) ended by recovery: %s",
            scope.gpu,
            region.tenant.id,
            region.epoch,
            reason,
            extra=log_fields("region_recovered", region.tenant.id, scope.gpu, region.epoch),
        )
        return
    scope.stats.completed += 1
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "GPU %d: tenant %d exited its region (epoch %d) after %.3f ms",
            scope.gpu,
            region.tenant.id,
            region.epoch,
            ((region.ended_at or region.granted_at) - region.granted_at) * 1e3,
            extra=log_fields("region_exited", region.tenant.id, scope.gpu, region.epoch),
        )
