"""Restart (``krexd/adopt.py``): what a restarted krexd needs of a GPU, and adoption.

``saved`` is written to the state file; ``resume`` continues the epochs of
the krexd before and answers its regions' re-sent exits; ``adopt_region``
holds the region it granted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from krexd import states
from krexd.coordinator.ending import Ending
from krexd.coordinator.locks import DriverLocks
from krexd.coordinator.records import HELD, Region, RegionRequest
from krexd.driverlock import DriverLock, DriverLockUnavailable
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class Adoption(Ending):
    """A GPU's region protocol across a krexd restart."""

    def saved(self) -> dict[str, Any]:
        """What a restarted krexd needs of this GPU: epoch, region in progress, last exits."""
        region = self._region
        saved_region = None
        if region is not None and not region.ended:
            saved_region = {
                "tenant": region.tenant.id,
                "epoch": region.epoch,
                "pid": region.pid,
                "tid": region.tid,
                "siblings": [t.id for t in region.siblings],
                # The holder thread's own cores ("add"), given back at exit.
                "thread_cpus": list(self._thread_cpus) if self._thread_cpus is not None else None,
                # Its region_enter's request id: a copy re-sent to the successor is granted again.
                "request": region.request_id,
            }
        ended = {}
        if region is not None and region.ended:
            # Its end is in progress (thawed, maybe not reopened): the successor reopens the
            # gate and thaws everyone, and answers the holder's re-sent region_exit.
            ended[region.tenant.id] = region.epoch
        exited = {str(k): v for k, v in {**self._resumed, **self._exited, **ended}.items()}
        return {"epoch": self._epoch, "region": saved_region, "exited": exited}

    def settle_locks(self) -> None:
        """At start: processes a krexd before left locked through the driver.

        They belong to the region adopted from it (unlocked at its end), or
        are unlocked now; the record names each by pid and start time, so a
        reused pid is never touched (``krexd.lock_ledger``).
        """
        if self._ledger is None:
            return
        pids = self._ledger.live()
        region = self._region
        if pids and region is not None and region.adopted and not region.ended:
            region.locks = DriverLocks(pids=pids)
            log.warning("GPU %d: adopted region keeps %d processes locked", self.gpu, len(pids))
            return
        if pids:
            unlocker = self._proc_lock or DriverLock()
            try:
                unlocker.unlock_all(pids)
                log.warning("GPU %d: unlocked %d processes left locked", self.gpu, len(pids))
            except DriverLockUnavailable as exc:
                log.error("GPU %d: cannot unlock processes %s: %s", self.gpu, pids, exc)
        self._ledger.clear()

    @property
    def epoch(self) -> int:
        """The last epoch this GPU's regions used (0 before the first)."""
        return self._epoch

    def resume(self, epoch: int, exited: dict[int, int]) -> None:
        """Continue the epochs of the krexd before; answer its regions' re-sent exits."""
        self._epoch = max(self._epoch, epoch)
        self._resumed.update(exited)

    def adopt_region(
        self,
        holder: Tenant,
        epoch: int,
        pid: int,
        tid: int,
        siblings: list[Tenant],
        thread_cpus: tuple[int, ...] | None = None,
        request_id: str | None = None,
    ) -> None:
        """Hold the region a crashed krexd granted (its siblings frozen, the gate closed).

        Bound to (holder, epoch) like any region: the holder's exit or its
        process's death ends it, and ``max_region_s`` counts from adoption.
        ``thread_cpus``: the holder thread's affinity before step 5
        (``[region] holder_cpus = "add"``), given back at exit.
        ``request_id``: its region_enter's (a re-sent copy is granted again).
        The warm pools are frozen for it, as for any region
        (``krexd.pool_freeze``).
        """
        self._thread_cpus = thread_cpus
        self._lock.take(holder.id)
        self._requests[holder.id] = RegionRequest(holder.id, stage=HELD)
        now = time.monotonic()
        region = Region(holder, epoch, pid, tid, now, now, list(siblings), adopted=True)
        region.request_id = request_id
        if self.pool_freeze is not None:
            region.pools_frozen = self.pool_freeze.hold_now()
        # Its end undoes what the entry before the restart did, as any region's end does:
        # the locks as settle_locks finds them, the siblings, the pools, the cores.
        region.undo.push("driver locks", lambda: self._unlock_gpu(region.locks))
        region.undo.push("siblings' freeze", lambda: self._thaw(region.siblings))
        if region.pools_frozen:
            region.undo.push("pools' freeze", lambda: self._thaw_pools(True))
        region.undo.push("cores", lambda: self._unpin_holder(holder, tid))
        self.stats.adopted += 1
        self._region, self._frozen = region, region.siblings
        self._epoch = max(self._epoch, epoch)
        # The region went through steps 2-4 in the krexd before: replay its edges.
        for step in (states.CLOSING, states.DRAINING, states.REGION_FREEZING, states.HELD):
            self._region_state(step)  # IDLE -> CLOSING -> DRAINING -> FREEZING -> HELD
        self._watch(region)
        log.warning(
            "GPU %d: adopted the region of tenant %d (epoch %d), %d sibling(s) frozen",
            self.gpu,
            holder.id,
            epoch,
            len(siblings),
        )
