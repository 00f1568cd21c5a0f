"""krexd's cgroup subtree: ``<root>/<name>/gpu<N>/t<tenant id>``.

Builds, cleans and tears down the tree in one of the backends (``v2``, v2
with ``affinity``, ``hybrid``); each tenant cgroup gets its ``pids.max``
and device program as it is made.  docs/design/daemon.md "cgroup backends".
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time

from krexd.cgroups import choose, detect, fs, pool, treelock
from krexd.cgroups.devices import DeviceIsolation
from krexd.cgroups.fs import CgroupError
from krexd.cgroups.tenant import CPUSET_AFFINITY, CPUSET_V1, CPUSET_V2, TenantCgroup
from krexd.config.config import CgroupConfig, format_cores
from krexd.hardware.slices import CpuSlice

_log = logging.getLogger("krexd.cgroups")

PIDS_V2 = "v2"  # pids.max in the tenant's v2 directory
PIDS_V1 = "v1"  # pids.max in a parallel v1 pids tree (hybrid hosts)
PIDS_NONE = "none"  # no pids controller, or [cgroup] pids_max = 0


class CgroupBackend:
    """The cgroup tree of one krexd; build it with :meth:`open`, then :meth:`prepare`."""

    def __init__(
        self,
        kind: str,
        base: str,
        name: str,
        cpuset_kind: str,
        cpuset_base: str | None,
        systemd: bool,
    ) -> None:
        self.kind = kind
        self.base = base
        self.name = name
        self.cpuset_kind = cpuset_kind
        self.cpuset_base = cpuset_base
        self.systemd = systemd
        self.root = os.path.join(base, name)
        self.cpuset_root = os.path.join(cpuset_base, name) if cpuset_base else None
        self._mems = "0"
        self._slices: dict[int, CpuSlice] = {}
        self._lock_fd: int | None = None
        # What is wrong now, by part ("gpu0": why); empty when healthy (krexctl status).
        self.problems: dict[str, str] = {}
        # [cgroup] pids_max and where pids.max lives: PIDS_V2, PIDS_V1 (pids_root) or
        # PIDS_NONE; set by open() and prepare().
        self.pids_max = 0
        self.pids_kind = PIDS_NONE
        self.pids_root: str | None = None
        # Hybrid hosts: (krexd's own v1 memory cgroup, <it>/<name>), where warm pools'
        # memory limits go when the v2 tree has no memory controller (krexd/cgroups/pool.py).
        self.memory_v1: tuple[str, str] | None = None
        # Device programs of tenant and pool cgroups; set before prepare(), which probes it.
        self.devices = DeviceIsolation()

    # --- detection ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        cfg: CgroupConfig,
        mounts: detect.Mounts | None = None,
        devices: DeviceIsolation | None = None,
    ) -> CgroupBackend:
        """Detect the hierarchies and choose the backend per ``[cgroup] backend``.

        Under systemd with no ``[cgroup] root``, moves krexd into its
        ``supervisor`` leaf first (no processes in inner nodes).  ``devices``:
        the tree's GPU device isolation (None: none).
        """
        mounts = mounts or detect.find_mounts()
        c = choose.choose(cfg, mounts)
        backend = cls(c.kind, c.base, cfg.name, c.cpuset_kind, c.cpuset_base, c.systemd)
        if devices is not None:
            backend.devices = devices
        backend.pids_max = cfg.pids_max
        if mounts.v1_pids is not None:  # known before prepare() so a stale tree is cleaned
            backend.pids_root = os.path.join(mounts.v1_pids, cfg.name)
        backend.memory_v1 = pool.v1_memory_root(mounts, cfg.name)
        return backend

    # --- building the tree --------------------------------------------------------

    def lock(self) -> None:
        """Claim this tree for this krexd, or raise CgroupError if a live krexd has it.

        Without this, a second krexd with the same ``[cgroup] name`` would take
        the first one's live tree for a stale one and kill its tenants.  The
        lock is an flock on a file named after the tree, held until this
        process exits (a crashed krexd leaves no lock behind, so its tree is
        cleaned as stale).
        """
        self._lock_fd = treelock.claim(self.root)

    def prepare(self, slices: dict[int, CpuSlice], adopt: bool = False) -> int:
        """Claim the tree (:meth:`lock`), clean a stale one, then build ``<name>/gpu<N>``.

        With ``adopt`` the tree of the krexd before is kept as it is (its
        tenants are adopted, krexd/restarts/adopt.py); only missing directories are made.
        Returns how many leftover processes of an earlier krexd were killed.
        Raises CgroupError when another live krexd uses the same tree.
        """
        self.lock()
        killed = 0 if adopt else self.cleanup_stale()
        self._slices = dict(slices)
        all_cores = sorted({c for s in slices.values() for c in s.cores})
        fs.mkdir(self.root)
        self.devices.probe(self.root)  # raises under [gpu] device_isolation = require
        if self.cpuset_kind == CPUSET_V2:
            if not self._enable_cpuset(self.base):
                self.cpuset_kind, self.cpuset_base, self.cpuset_root = CPUSET_AFFINITY, None, None
        if self.cpuset_kind == CPUSET_V1:
            assert self.cpuset_base is not None and self.cpuset_root is not None
            self._mems = fs.read(os.path.join(self.cpuset_base, "cpuset.mems")).strip() or "0"
            fs.mkdir(self.cpuset_root)
            self._set_cpuset(self.cpuset_root, all_cores)
        elif self.cpuset_kind == CPUSET_V2:
            self._set_cpuset(self.root, all_cores)
            self._enable_cpuset(self.root)
        for gpu in sorted(slices):
            self._build_gpu(gpu)
        self._prepare_pids()
        return killed

    def _build_gpu(self, gpu: int) -> None:
        """Create ``<name>/gpu<N>`` (and its cpuset directory) with the GPU's slice."""
        fs.mkdir(self._gpu_dir(gpu))
        cs_dir = self._gpu_cpuset_dir(gpu)
        if cs_dir is not None:
            if cs_dir != self._gpu_dir(gpu):
                fs.mkdir(cs_dir)
            self._set_cpuset(cs_dir, self._slices[gpu].cores)
            if self.cpuset_kind == CPUSET_V2:
                self._enable_cpuset(cs_dir)
        if self.pids_kind == PIDS_V2:  # a rebuilt directory needs the controller again
            _enable_controller(self._gpu_dir(gpu), "pids")
        elif self.pids_kind == PIDS_V1 and self.pids_root is not None:
            fs.mkdir(os.path.join(self.pids_root, f"gpu{gpu}"))

    def _enable_cpuset(self, directory: str) -> bool:
        try:
            _enable_controller(directory, "cpuset")
        except CgroupError as exc:
            _log.warning("cannot enable cpuset in %s (%s): using sched_setaffinity", directory, exc)
            return False
        return True

    def _prepare_pids(self) -> None:
        """Choose where tenants' ``pids.max`` goes and build that tree (v2, a v1 tree, or none)."""
        self.pids_kind = PIDS_NONE
        if self.pids_max == 0:
            return
        gpu_dirs = [self._gpu_dir(gpu) for gpu in sorted(self._slices)]
        if "pids" in fs.read(os.path.join(self.base, "cgroup.controllers")).split():
            try:
                for d in [self.base, self.root, *gpu_dirs]:
                    _enable_controller(d, "pids")
                self.pids_kind = PIDS_V2
                return
            except CgroupError as exc:
                _log.warning("cannot enable the v2 pids controller: %s", exc)
        root = self.pids_root
        if root is not None and os.access(os.path.dirname(root), os.W_OK):
            for d in [root, *(os.path.join(root, f"gpu{gpu}") for gpu in sorted(self._slices))]:
                fs.mkdir(d)
            self.pids_kind = PIDS_V1
            return
        _log.warning("no pids controller: [cgroup] pids_max = %d is not applied", self.pids_max)

    def _set_cpuset(self, directory: str, cores: tuple[int, ...] | list[int]) -> None:
        if self.cpuset_kind == CPUSET_V1:
            # v1 needs cpus and mems before a task or child may use the cgroup.
            fs.write(os.path.join(directory, "cpuset.mems"), self._mems)
        fs.write(os.path.join(directory, "cpuset.cpus"), format_cores(cores))

    def _gpu_dir(self, gpu: int) -> str:
        return os.path.join(self.root, f"gpu{gpu}")

    def _gpu_cpuset_dir(self, gpu: int) -> str | None:
        if self.cpuset_kind == CPUSET_V1:
            assert self.cpuset_root is not None
            return os.path.join(self.cpuset_root, f"gpu{gpu}")
        if self.cpuset_kind == CPUSET_V2:
            return self._gpu_dir(gpu)
        return None

    def create_tenant(self, gpu: int, tenant_id: int) -> TenantCgroup:
        """Create ``gpu<gpu>/t<tenant_id>`` confined to the slice's tenant cores.
        The v2 directory gets its GPU's device program first (devices.py);
        a failed attachment removes it and raises CgroupError.

        A ``gpu<N>`` directory removed from outside (an administrator, a
        cleanup script) is built again once; when that fails too, the GPU is
        recorded in :attr:`problems` (krexd reports itself unhealthy) and the
        CgroupError is raised.
        """
        try:
            cgroup = self._create_tenant(gpu, tenant_id)
        except CgroupError as exc:
            if exc.errno != errno.ENOENT:
                raise
            _log.warning("gpu%d: cgroup directory missing (%s); building it again", gpu, exc)
            try:
                self._build_gpu(gpu)
                cgroup = self._create_tenant(gpu, tenant_id)
            except CgroupError as again:
                self.problems[f"gpu{gpu}"] = f"cannot rebuild its cgroup directory: {again}"
                raise
        self.problems.pop(f"gpu{gpu}", None)
        return cgroup

    def _create_tenant(self, gpu: int, tenant_id: int) -> TenantCgroup:
        sl = self._slices[gpu]
        leaf = f"t{tenant_id}"
        freezer = os.path.join(self._gpu_dir(gpu), leaf)
        gpu_cs = self._gpu_cpuset_dir(gpu)
        cpuset_dir = os.path.join(gpu_cs, leaf) if gpu_cs is not None else None
        fs.mkdir(freezer)
        try:  # before any process is placed in it
            self.devices.confine_tenant(freezer, gpu)
        except CgroupError:
            fs.rmdir(freezer)
            raise
        if cpuset_dir is not None:
            if cpuset_dir != freezer:
                fs.mkdir(cpuset_dir)
            self._set_cpuset(cpuset_dir, sl.tenant_cores)
        pids_dir = None
        if self.pids_kind == PIDS_V1:
            assert self.pids_root is not None
            pids_dir = os.path.join(self.pids_root, f"gpu{gpu}", leaf)
            fs.mkdir(pids_dir)
        if self.pids_kind != PIDS_NONE:
            fs.write(os.path.join(pids_dir or freezer, "pids.max"), str(self.pids_max))
        return TenantCgroup(freezer, cpuset_dir, self.cpuset_kind, sl.tenant_cores, pids_dir)

    # --- cleanup ------------------------------------------------------------------

    def _trees(self) -> list[str]:
        trees = [self.root]
        if self.cpuset_root and self.cpuset_root != self.root:
            trees.append(self.cpuset_root)
        if self.pids_root and self.pids_root != self.root:
            trees.append(self.pids_root)
        if self.memory_v1 is not None:
            trees.append(self.memory_v1[1])
        return trees

    def _kill_tree(self) -> int:
        """Thaw every directory of the v2 tree and SIGKILL all its processes."""
        if not os.path.isdir(self.root):
            return 0
        dirs = fs.subdirs_bottom_up(self.root)
        pids = {p for d in dirs for p in fs.read_pids(os.path.join(d, "cgroup.procs"))}
        for d in reversed(dirs):  # top-down: a frozen ancestor keeps children frozen
            try:
                fs.write(os.path.join(d, "cgroup.freeze"), "0")
            except CgroupError:
                pass
        kill_file = os.path.join(self.root, "cgroup.kill")
        if os.path.exists(kill_file):
            fs.write(kill_file, "1")
        else:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return len(pids)

    def _remove_dirs(self) -> None:
        for tree in self._trees():
            for d in fs.subdirs_bottom_up(tree):
                fs.rmdir(d)

    def tenant_dirs(self) -> dict[int, str]:
        """The ``gpu<N>/t<id>`` directories in the tree now, by tenant id."""
        out: dict[int, str] = {}
        for gpu in self._slices:
            gdir = self._gpu_dir(gpu)
            try:
                names = os.listdir(gdir)
            except FileNotFoundError:
                continue
            for n in names:
                if n.startswith("t") and n[1:].isdigit():
                    out[int(n[1:])] = os.path.join(gdir, n)
        return out

    def thaw_inner(self) -> None:
        """Thaw the tree's root and ``gpu<N>`` directories (a frozen ancestor freezes all)."""
        for d in [self.root, *(self._gpu_dir(g) for g in self._slices)]:
            try:
                fs.write(os.path.join(d, "cgroup.freeze"), "0")
            except CgroupError:
                pass

    def _populated(self) -> bool:
        try:
            return fs.events(self.root).get("populated", 0) == 1
        except CgroupError:
            return False

    def cleanup_stale(self, timeout_s: float = 5.0) -> int:
        """Thaw, kill and remove a tree left by an earlier krexd (blocking; used at start)."""
        killed = self._kill_tree()
        deadline = time.monotonic() + timeout_s
        while self._populated():
            if time.monotonic() > deadline:
                raise CgroupError(0, f"stale cgroup tree {self.root} did not empty in {timeout_s}s")
            time.sleep(0.005)
        self._remove_dirs()
        if killed:
            _log.warning("killed %d process(es) left in %s by an earlier krexd", killed, self.root)
        return killed

    async def teardown(self, timeout_s: float = 5.0) -> None:
        """Thaw and kill whatever is still in the tree, remove every directory, unlock.

        Does nothing unless this krexd claimed the tree (:meth:`lock`): a krexd
        that failed to start because another one owns the tree leaves it alone.
        """
        if self._lock_fd is None:
            return
        self._kill_tree()
        deadline = time.monotonic() + timeout_s
        while self._populated() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        try:
            self._remove_dirs()
        except CgroupError as exc:
            _log.error("cgroup cleanup incomplete: %s", exc)
        self.unlock()

    def unlock(self) -> None:
        """Release the claim on the tree (:meth:`lock`); the tree itself is left as it is."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def pools(self, memory_max: int, pids_max: int = 0) -> pool.PoolCgroups:
        """Warm pools' cgroups under this tree, each limited to ``memory_max`` bytes and
        ``pids_max`` tasks (0: no limit).  Pools use the v1 pids tree wherever it is
        mounted, whatever ``[cgroup] pids_max`` says of the tenants."""
        pids_v1 = self.pids_root
        return pool.PoolCgroups(
            self.base, self.root, memory_max, self.memory_v1, self.devices, pids_max, pids_v1
        )

    def describe(self) -> dict[str, object]:
        """What ``krexctl status`` shows about cgroups."""
        return {
            "backend": self.kind,
            "cpuset": self.cpuset_kind,
            "root": self.root,
            "cpuset_root": self.cpuset_root,
            "systemd": self.systemd,
            "problems": dict(self.problems),
            "pids": self.pids_kind,
            "pids_root": self.pids_root if self.pids_kind == PIDS_V1 else None,
            "pids_max": self.pids_max if self.pids_kind != PIDS_NONE else None,
            "devices": self.devices.describe(),
        }


def _enable_controller(directory: str, controller: str) -> None:
    """Enable ``controller`` for the children of ``directory``; raises CgroupError."""
    path = os.path.join(directory, "cgroup.subtree_control")
    if controller not in fs.read(path).split():
        fs.write(path, f"+{controller}")
