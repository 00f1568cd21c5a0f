"""Warm pools krexd knows: registration, limits, placement of their children, status.

krexd executes nothing of the user's: it checks a pool's registration
(:meth:`PoolRegistry.register`), confines it, places its children
(:meth:`PoolRegistry.child_of_pool`) and forgets it when its zygote or
keeper exits.  docs/design/warm.md; the checks: docs/design/security.md
"8. Warm pools".
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from krex_client import cold_reasons
from krexd.cgroups.fs import CgroupError
from krexd.cgroups.pool import PoolCgroup, PoolCgroups
from krexd.config.config import WarmConfig
from krexd.system import testhooks
from krexd.system.errors import Code, KrexError
from krexd.tenancy import identity
from krexd.tenancy.tenants import PidWatch

_log = logging.getLogger("krexd.pools")


@dataclass
class Pool:
    """One registered pool: its zygote (``pid``, ``start_time``), keeper, owner and key."""

    pid: int
    start_time: int
    uid: int
    gid: int
    keeper_pid: int
    key: str
    version: str
    interpreter: str
    modules: list[str]
    cgroup: PoolCgroup
    created: float = field(default_factory=time.time)
    placed: int = 0
    watches: list[PidWatch] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """One row of ``status``'s ``pools``."""
        return {
            "pid": self.pid,
            "uid": self.uid,
            "keeper_pid": self.keeper_pid,
            "key": self.key,
            "version": self.version,
            "interpreter": self.interpreter,
            "modules": list(self.modules),
            "age_s": round(time.time() - self.created, 3),
            "commands": self.placed,
            "memory_bytes": self.cgroup.memory_bytes(),
            "cgroup": self.cgroup.path,
        }


class PoolRegistry:
    """The registered pools, by zygote pid.

    Args:
        config: ``[warm]``.
        cgroups: makes pool cgroups (``krexd.cgroups.pool.PoolCgroups``, prepared).
        version: krexd's version; a keeper of another version is refused.
        poll_s: liveness poll period where pidfds are unavailable.
    """

    def __init__(
        self, config: WarmConfig, cgroups: PoolCgroups, version: str, poll_s: float = 0.2
    ) -> None:
        self.config = config
        self.cgroups = cgroups
        self.version = version
        self.poll_s = poll_s
        self._pools: dict[int, Pool] = {}
        self.refused = 0
        self.warm_starts = 0  # commands placed from a pool (since start)
        self.cold_starts = 0  # commands started cold while warm pools are on (since start)
        # ... by the reason krex run gave (krex_client.cold_reasons; "other": none or unknown)
        self.cold_reasons: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._pools)

    def of_uid(self, uid: int) -> list[Pool]:
        """The pools of ``uid``."""
        return [p for p in self._pools.values() if p.uid == uid]

    def register(self, keeper: identity.Caller, body: dict[str, Any]) -> Pool:
        """Register the zygote ``body["pid"]`` for ``keeper`` (rules: docs/design/security.md §8).

        ``body``: ``pid``, ``key``, ``version``, ``interpreter``, ``modules``
        (checked by the op).  Raises ``KrexError``: ``CANCELLED`` (warm
        pools disabled, the uid's limit, more than ``pids_max`` threads),
        ``BAD_FIELD`` (another version, the pid is gone), ``AUTH`` (not the
        keeper's child or uid, or in a tenant's or pool's cgroup),
        ``INTERNAL`` (cgroupfs).
        """
        pid = int(body["pid"])
        testhooks.pause("pool_register")
        if not self.config.enabled:
            raise self._refuse(keeper, "warm pools are off ([warm] enabled = false)")
        if body["version"] != self.version:
            raise KrexError(
                Code.BAD_FIELD, f"pool of krex {body['version']}, krexd is {self.version}"
            )
        start = identity.check_child_of(keeper, pid, "pool_register")
        inside = self.cgroups.holding(pid)
        if inside is not None:
            raise identity.refuse(
                keeper, f"pool_register: pid {pid} is inside krexd's cgroup tree ({inside})"
            )
        limit = self.config.max_pools_per_uid
        if len(self.of_uid(keeper.uid)) >= limit:
            raise self._refuse(
                keeper, f"uid {keeper.uid} has {limit} pool(s): [warm] max_pools_per_uid"
            )
        cgroup = self._confine(keeper, pid)
        pool = Pool(
            pid,
            start,
            keeper.uid,
            keeper.gid,
            keeper.pid,
            str(body["key"]),
            str(body["version"]),
            str(body["interpreter"]),
            [str(m) for m in body["modules"]],
            cgroup,
        )
        self._pools[pid] = pool
        gone = self._gone_callback(pool)
        pool.watches = [PidWatch(pid, gone, self.poll_s), PidWatch(keeper.pid, gone, self.poll_s)]
        _log.info(
            "pool %d of uid %d registered by keeper %d: %s (%s)",
            pid,
            keeper.uid,
            keeper.pid,
            pool.interpreter,
            ", ".join(pool.modules) or "no modules",
        )
        return pool

    def _confine(self, keeper: identity.Caller, pid: int) -> PoolCgroup:
        """Move the zygote ``pid`` into a new pool cgroup, its tasks counted before and
        after the move (raises KrexError: ``CANCELLED`` over ``pids_max``, ``INTERNAL``)."""
        self._check_tasks(keeper, pid, _threads(pid))
        testhooks.pause("pool_counted")
        self.cgroups.sweep({p.cgroup.path for p in self._pools.values()})
        try:
            cgroup = self.cgroups.create(keeper.uid, pid)
        except CgroupError as exc:
            raise KrexError(Code.INTERNAL, f"cannot create the pool's cgroup: {exc}") from None
        try:
            cgroup.add_pid(pid)
        except CgroupError as exc:
            cgroup.kill()  # half moved: in none of the pool's limits, or in some only
            cgroup.remove()
            raise KrexError(Code.INTERNAL, f"cannot move pid {pid} into its pool: {exc}") from None
        try:
            # Threads made between the count and the move: the move is not bounded by
            # pids.max, so the pool is counted again where it now lives.
            self._check_tasks(keeper, pid, cgroup.tasks())
        except KrexError:
            cgroup.kill()
            raise
        return cgroup

    def _check_tasks(self, keeper: identity.Caller, pid: int, tasks: int) -> None:
        """Refuse a pool of more than ``[warm] pids_max`` tasks (``CANCELLED``): every
        region on the host freezes the pools, and a freeze's cost grows with their threads."""
        limit = self.config.pool_tasks()
        if limit and tasks > limit:
            raise self._refuse(
                keeper, f"pool {pid} has {tasks} tasks, over [warm] pids_max = {limit}"
            )

    def _refuse(self, who: identity.Caller, why: str) -> KrexError:
        self.refused += 1
        _log.info("pool_register of %s refused: %s", who.describe(), why)
        return KrexError(Code.CANCELLED, why)

    def _gone_callback(self, pool: Pool) -> Callable[[], None]:
        return lambda: self.forget(pool, "its zygote or keeper exited")

    def forget(self, pool: Pool, why: str) -> None:
        """Drop ``pool``: stop watching it, kill what is left in its cgroup, remove it."""
        if self._pools.get(pool.pid) is not pool:
            return
        del self._pools[pool.pid]
        for w in pool.watches:
            w.cancel()
        pool.cgroup.kill()
        if not pool.cgroup.remove():
            _log.debug("pool %d: cgroup not empty yet; removed by a later sweep", pool.pid)
        _log.info("pool %d of uid %d forgotten: %s", pool.pid, pool.uid, why)

    async def close(self, grace_s: float = 2.0) -> None:
        """At shutdown: ask every zygote to end (SIGTERM: it stops accepting, removes its
        socket and exits), wait up to ``grace_s`` seconds, then forget what is left."""
        for pool in list(self._pools.values()):
            try:
                os.kill(pool.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while self._pools and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for pool in list(self._pools.values()):
            self.forget(pool, "krexd is stopping")

    def after_device_read(self, users: set[int]) -> None:
        """Every ``[memory] refresh_ms``, after the memory refresh's device read: pools
        with a process on the GPU (:meth:`check_gpu_users`) or over ``[warm] pids_max``
        (:meth:`check_tasks`) end."""
        self.check_gpu_users(users)
        self.check_tasks()

    def check_tasks(self) -> None:
        """End every pool over ``[warm] pids_max`` tasks (where no pids controller
        refuses them: a pool may grow after its registration's count)."""
        limit = self.config.pool_tasks()
        if not limit:
            return
        for pool in list(self._pools.values()):
            tasks = pool.cgroup.tasks()
            if tasks > limit:
                _log.error(
                    "pool %d of uid %d has %d tasks, over [warm] pids_max = %d; ending it",
                    pool.pid,
                    pool.uid,
                    tasks,
                    limit,
                )
                self.forget(pool, f"{tasks} tasks, over [warm] pids_max = {limit}")

    def check_gpu_users(self, users: set[int]) -> None:
        """End every pool with a process among ``users`` (pids with GPU memory, per the
        memory refresh's device read (``krexd.memory.refresher``), every ``[memory] refresh_ms``).

        A pool never initialises CUDA (its zygote refuses to serve if its imports did,
        ``krexpool_zygote``), and its unplaced children run no command code yet: a
        pool process on the GPU is code that got past those checks (a renamed driver
        library, device files closed but still mapped) and would run GPU work outside
        every tenant's gate.  Such a pool is forgotten (its cgroup killed).
        """
        for pool in list(self._pools.values()):
            on_gpu = sorted(users & set(pool.cgroup.pids()))
            if on_gpu:
                _log.error(
                    "pool %d of uid %d: process(es) %s have the GPU open; ending the pool",
                    pool.pid,
                    pool.uid,
                    on_gpu,
                )
                self.forget(pool, f"process(es) {on_gpu} had the GPU open")

    def child_of_pool(self, uid: int, pid: int, ppid: int, start: int) -> Pool | None:
        """The pool of ``uid`` whose child ``pid`` is (parent ``ppid``, start time ``start``),
        unplaced; None when it is not such a process."""
        pool = self._pools.get(ppid)
        if pool is None or pool.uid != uid or start < pool.start_time:
            return None
        return pool if pool.cgroup.contains(pid) else None

    def started_cold(self, reason: str | None) -> None:
        """A command started cold while warm pools are on; ``reason``: ``place``'s ``cold``
        (a category of ``krex_client.cold_reasons``; anything else counts as "other")."""
        self.cold_starts += 1
        key = reason if reason in cold_reasons.REASONS else cold_reasons.OTHER
        self.cold_reasons[key] = self.cold_reasons.get(key, 0) + 1

    def placed(self, pool: Pool, pid: int) -> None:
        """``pid``, a child of ``pool``, is now in its tenant cgroup."""
        pool.placed += 1
        self.warm_starts += 1
        pool.cgroup.released(pid)

    def status(self) -> dict[str, Any]:
        """``status``'s ``warm``: settings, the pools' cgroups, and one row per pool."""
        return {
            **self.config.announce(),
            "cgroups": self.cgroups.describe(),
            "refused": self.refused,
            "warm_starts": self.warm_starts,
            "cold_starts": self.cold_starts,
            "cold_reasons": dict(sorted(self.cold_reasons.items())),
            "pools": [p.summary() for p in self._pools.values()],
        }


def _threads(pid: int) -> int:
    """Threads of process ``pid`` now (0 once it is gone)."""
    try:
        return int(psutil.Process(pid).num_threads())
    except psutil.Error:
        return 0
