"""Warm pools' cgroups: ``<root>/<name>/pools/u<uid>-p<pid>``, with a memory limit.

A registered zygote is moved here; its children are born here and leave
at ``place``.  ``[warm] memory_max`` (v2 ``memory.max``, a v1 ``memory``
directory on hybrid hosts, or none) and ``pids_max`` bound the pool:
docs/design/warm.md "Limits, lifetime, restarts".
"""

from __future__ import annotations

import logging
import os
import signal
import time

from krexd.cgroups import detect, fs
from krexd.cgroups.devices import DeviceIsolation
from krexd.cgroups.fs import CgroupError

_log = logging.getLogger("krexd.cgroups")

MEMORY_V2 = "v2"
MEMORY_V1 = "v1"
MEMORY_NONE = "none"
POOLS_DIR = "pools"


def v1_memory_root(mounts: detect.Mounts, name: str) -> tuple[str, str] | None:
    """(krexd's own v1 memory cgroup, ``<it>/<name>``) on a host with a v1 memory hierarchy."""
    if mounts.v1_memory is None:
        return None
    home = os.path.join(mounts.v1_memory, detect.own_v1_cgroup("memory").lstrip("/"))
    return home, os.path.join(home, name)


class PoolCgroup:
    """One pool's directories: ``path`` (v2), ``memory_dir`` (v1 memory, or None) and
    ``pids_dir`` (v1 pids, or None)."""

    def __init__(
        self,
        path: str,
        memory_dir: str | None,
        memory_home: str | None,
        pids_dir: str | None = None,
    ) -> None:
        self.path = path
        self.memory_dir = memory_dir
        self.pids_dir = pids_dir
        self._home = memory_home

    def add_pid(self, pid: int) -> None:
        """Move ``pid`` into the pool (raises CgroupError): its v1 pids and memory
        directories first, so their limits hold before the v2 leaf regions freeze."""
        for d in (self.pids_dir, self.memory_dir, self.path):
            if d is not None:
                fs.write(os.path.join(d, "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        """The processes in the pool's v2 directory (empty once it is gone)."""
        try:
            return fs.read_pids(os.path.join(self.path, "cgroup.procs"))
        except CgroupError:
            return []

    def contains(self, pid: int) -> bool:
        """True while ``pid`` is in the pool's v2 directory (born there, not placed yet)."""
        try:
            return pid in fs.read_pids(os.path.join(self.path, "cgroup.procs"))
        except CgroupError:
            return False

    def released(self, pid: int) -> None:
        """``pid`` was placed in a tenant cgroup: take it out of the pool's v1 memory cgroup."""
        if self.memory_dir is not None and self._home is not None:
            try:
                fs.write(os.path.join(self._home, "cgroup.procs"), str(pid))
            except CgroupError as exc:
                _log.warning("pid %d stays in its pool's memory cgroup: %s", pid, exc)

    def tasks(self) -> int:
        """Tasks (processes and threads) in the pool now: ``pids.current``, or counted
        from ``/proc/<pid>/task`` where no pids controller counts them."""
        for d in (self.pids_dir, self.path):
            if d is None:
                continue
            try:
                return int(fs.read(os.path.join(d, "pids.current")).strip())
            except (CgroupError, ValueError):
                continue
        count = 0
        for pid in self.pids():
            try:
                count += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
        return count

    def memory_bytes(self) -> int | None:
        """Memory charged to the pool now (bytes), None when no controller says."""
        for d, name in ((self.path, "memory.current"), (self.memory_dir, "memory.usage_in_bytes")):
            if d is None:
                continue
            try:
                return int(fs.read(os.path.join(d, name)).strip())
            except (CgroupError, ValueError):
                continue
        return None

    def kill(self) -> None:
        """SIGKILL every process in the pool (its zygote and unplaced children).

        ``cgroup.kill`` where the kernel has it (5.14); else the pool is frozen
        first, so nothing forks between the read of its processes and their
        kill, and killed until empty (bounded, 1 s).
        """
        kill_file = os.path.join(self.path, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                fs.write(kill_file, "1")
                return
            except CgroupError:
                pass
        try:
            fs.write(os.path.join(self.path, "cgroup.freeze"), "1")
        except CgroupError:
            pass  # gone, or no freezer: kill as we can
        deadline = time.monotonic() + 1.0
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)

    def remove(self) -> bool:
        """Remove the directories once empty; False while a process is left."""
        try:
            for d in (self.memory_dir, self.pids_dir, self.path):
                if d is not None:
                    fs.rmdir(d)
        except CgroupError:
            return False
        return True


class PoolCgroups:
    """Makes pool cgroups under a krexd's tree ``root`` (v2) with ``memory_max`` bytes each.

    ``base``: the v2 directory above ``root``; ``memory``: (krexd's own v1
    memory cgroup, the v1 root of the tree) from :func:`v1_memory_root`;
    ``devices``: the tree's device isolation (a pool may open no GPU node);
    ``pids_max``: tasks a pool may hold (0: no limit); ``pids_v1``: the v1
    ``pids`` tree of krexd's tenants on a hybrid host (None: none).
    """

    def __init__(
        self,
        base: str,
        root: str,
        memory_max: int,
        memory: tuple[str, str] | None,
        devices: DeviceIsolation | None = None,
        pids_max: int = 0,
        pids_v1: str | None = None,
    ) -> None:
        self.memory_max = memory_max
        self.pids_max = pids_max
        self._pids_v1 = os.path.join(pids_v1, POOLS_DIR) if pids_v1 is not None else None
        self.pids_kind = MEMORY_NONE  # where pids.max goes: "v2", "v1" or "none"
        self.devices = devices or DeviceIsolation()
        self.dir = os.path.join(root, POOLS_DIR)
        self._chain = [base, root, self.dir]
        self._v1 = memory
        self.kind = MEMORY_NONE

    def prepare(self) -> None:
        """Build ``pools`` and choose where its memory and task limits go (v2, v1, or none)."""
        fs.mkdir(self.dir)
        self._prepare_pids()
        if self.memory_max == 0:
            return
        if "memory" in fs.read(os.path.join(self._chain[0], "cgroup.controllers")).split():
            try:
                for d in self._chain:
                    path = os.path.join(d, "cgroup.subtree_control")
                    if "memory" not in fs.read(path).split():
                        fs.write(path, "+memory")
                self.kind = MEMORY_V2
                return
            except CgroupError as exc:
                _log.warning("cannot enable the v2 memory controller: %s", exc)
        if self._v1 is not None:
            try:
                fs.mkdir(self._v1[1])
                fs.mkdir(os.path.join(self._v1[1], POOLS_DIR))
                self.kind = MEMORY_V1
                return
            except CgroupError as exc:
                _log.warning("cannot use the v1 memory hierarchy: %s", exc)
        _log.warning("no memory controller: [warm] memory_max is not applied to pools")

    def _prepare_pids(self) -> None:
        """Choose where ``pids.max`` goes (``[warm] pids_max``): the v2 ``pids``
        controller down to ``pools``, else the tenants' v1 ``pids`` tree."""
        if self.pids_max == 0:
            return
        if "pids" in fs.read(os.path.join(self._chain[0], "cgroup.controllers")).split():
            try:
                for d in self._chain:
                    path = os.path.join(d, "cgroup.subtree_control")
                    if "pids" not in fs.read(path).split():
                        fs.write(path, "+pids")
                self.pids_kind = MEMORY_V2
                return
            except CgroupError as exc:
                _log.warning("cannot enable the v2 pids controller for pools: %s", exc)
        if self._pids_v1 is not None:
            try:
                fs.mkdir(os.path.dirname(self._pids_v1))  # krexd's own, when tenants use none
                fs.mkdir(self._pids_v1)
                self.pids_kind = MEMORY_V1
                return
            except CgroupError as exc:
                _log.warning("cannot use the v1 pids hierarchy for pools: %s", exc)
        _log.warning("no pids controller: [warm] pids_max is checked at registration only")

    def create(self, uid: int, pid: int) -> PoolCgroup:
        """Create ``pools/u<uid>-p<pid>`` with the memory limit and, when device isolation
        is active, a device program denying every GPU node (raises CgroupError)."""
        leaf = f"u{uid}-p{pid}"
        path = os.path.join(self.dir, leaf)
        fs.mkdir(path)
        memory_dir = pids_dir = None
        try:
            self.devices.confine_pool(path)
            if self.pids_kind == MEMORY_V2:
                fs.write(os.path.join(path, "pids.max"), str(self.pids_max))
            elif self.pids_kind == MEMORY_V1 and self._pids_v1 is not None:
                pids_dir = os.path.join(self._pids_v1, leaf)
                fs.mkdir(pids_dir)
                fs.write(os.path.join(pids_dir, "pids.max"), str(self.pids_max))
            if self.kind == MEMORY_V2:
                fs.write(os.path.join(path, "memory.max"), str(self.memory_max))
            elif self.kind == MEMORY_V1:
                assert self._v1 is not None
                memory_dir = os.path.join(self._v1[1], POOLS_DIR, leaf)
                fs.mkdir(memory_dir)
                fs.write(os.path.join(memory_dir, "memory.limit_in_bytes"), str(self.memory_max))
        except CgroupError:
            PoolCgroup(path, memory_dir, None, pids_dir).remove()
            raise
        home = self._v1[0] if self._v1 is not None else None
        return PoolCgroup(path, memory_dir, home, pids_dir)

    def holding(self, pid: int) -> str | None:
        """The directory of krexd's tree (a tenant's, a pool's) that holds ``pid``, or None.

        Walks the tree's v2 directories (one per tenant, slice and pool: a
        few hundred reads at most, once per registration).  Reading
        ``cgroup.procs`` rather than ``/proc/<pid>/cgroup`` needs no mapping
        from the process's (namespaced) path to the mount.
        """
        for top, _dirs, files in os.walk(self._chain[1]):
            if "cgroup.procs" not in files:
                continue
            try:
                if pid in fs.read_pids(os.path.join(top, "cgroup.procs")):
                    return top
            except CgroupError:
                continue
        return None

    def sweep(self, keep: set[str]) -> None:
        """Remove empty pool directories other than ``keep`` (pools of a krexd before a restart)."""
        try:
            leaves = os.listdir(self.dir)
        except OSError:
            return
        for leaf in leaves:
            path = os.path.join(self.dir, leaf)
            if path in keep or not leaf.startswith("u") or not os.path.isdir(path):
                continue
            memory_dir = pids_dir = None
            if self._v1 is not None:
                memory_dir = os.path.join(self._v1[1], POOLS_DIR, leaf)
                if not os.path.isdir(memory_dir):
                    memory_dir = None
            if self._pids_v1 is not None:
                pids_dir = os.path.join(self._pids_v1, leaf)
                if not os.path.isdir(pids_dir):
                    pids_dir = None
            PoolCgroup(path, memory_dir, None, pids_dir).remove()

    def describe(self) -> dict[str, object]:
        """For ``krexctl status``: where pools live and which memory controller limits them."""
        return {
            "dir": self.dir,
            "memory": self.kind,
            "memory_root": self._v1[1] if self.kind == MEMORY_V1 and self._v1 else None,
            "memory_max": self.memory_max or None,
            "pids_max": self.pids_max or None,
            "pids": self.pids_kind,
        }
