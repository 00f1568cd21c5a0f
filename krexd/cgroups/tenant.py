"""One tenant's cgroup(s): v2 freezer directory plus, on hybrid hosts, a v1 cpuset one.

The files region entry and exit use (``cgroup.procs``, ``cgroup.events``,
``cgroup.freeze``, the holder's ``cpuset.cpus``) stay open between uses
(``krexd.system.heldfiles``) until :meth:`TenantCgroup.close` or
:meth:`TenantCgroup.remove`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence

from krexd.cgroups import fs
from krexd.config.config import format_cores
from krexd.system.heldfiles import HeldFile

CPUSET_V2 = "v2"  # cpuset.cpus in the v2 directory
CPUSET_V1 = "v1"  # cpuset.cpus in a separate v1 cpuset directory (hybrid host)
CPUSET_AFFINITY = "affinity"  # no cpuset controller: sched_setaffinity on every thread


class TenantCgroup:
    """Cgroup(s) of one tenant.

    ``freezer_dir``: the v2 directory (``cgroup.procs``, ``cgroup.freeze``);
    ``cpuset_dir``: where ``cpuset.cpus`` lives (same as ``freezer_dir`` for
    pure v2, a v1 directory on hybrid hosts, ``None`` for the affinity fallback);
    ``cores``: the tenant's off-region cores; ``pids_dir``: a v1 ``pids``
    directory on hybrid hosts (``pids.max`` is in ``freezer_dir`` on pure v2).

    Holds descriptors of its control files once used: whoever drops a
    TenantCgroup calls :meth:`close` (or :meth:`remove`) first.
    """

    def __init__(
        self,
        freezer_dir: str,
        cpuset_dir: str | None,
        cpuset_kind: str,
        cores: Sequence[int],
        pids_dir: str | None = None,
    ) -> None:
        self.freezer_dir = freezer_dir
        self.cpuset_dir = cpuset_dir
        self.pids_dir = pids_dir
        self.cpuset_kind = cpuset_kind
        self.cores: tuple[int, ...] = tuple(cores)
        self._procs = HeldFile(os.path.join(freezer_dir, "cgroup.procs"))
        self._events = HeldFile(os.path.join(freezer_dir, "cgroup.events"), one_record=True)
        self._freeze = HeldFile(os.path.join(freezer_dir, "cgroup.freeze"), write=True)
        self._cpus = (
            HeldFile(os.path.join(cpuset_dir, "cpuset.cpus"), write=True) if cpuset_dir else None
        )

    def __repr__(self) -> str:
        return f"TenantCgroup({self.freezer_dir!r})"

    @property
    def path(self) -> str:
        """The v2 (freezer) directory."""
        return self.freezer_dir

    @property
    def paths(self) -> list[str]:
        """Every directory of this tenant (v2 first, then v1 cpuset and pids on hybrid hosts)."""
        out = [self.freezer_dir]
        if self.cpuset_dir and self.cpuset_dir != self.freezer_dir:
            out.append(self.cpuset_dir)
        if self.pids_dir and self.pids_dir != self.freezer_dir:
            out.append(self.pids_dir)
        return out

    # --- membership ----------------------------------------------------------------

    def add_pid(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this tenant's cgroup(s)."""
        for d in self.paths:
            fs.write(os.path.join(d, "cgroup.procs"), str(pid))
        if self.cpuset_kind == CPUSET_AFFINITY:
            _set_affinity_all_threads(pid, self.cores)

    def pids(self) -> list[int]:
        """Processes now in the tenant's (v2) cgroup."""
        return fs.read_pids(self._procs)

    def populated(self) -> bool:
        """True while any process is in the cgroup (``cgroup.events`` ``populated``)."""
        try:
            return fs.events(self._events).get("populated", 0) == 1
        except fs.CgroupError:
            return False

    # --- freezer (paper §4.2 step 4 and 7) ---------------------------------------------

    def freeze(self) -> None:
        """Ask the kernel to freeze the whole tree (asynchronous; see wait_frozen)."""
        fs.write(self._freeze, "1")

    def thaw(self) -> None:
        """Thaw the whole tree (takes effect at once)."""
        fs.write(self._freeze, "0")

    def is_frozen(self) -> bool:
        """True when the kernel reports every task frozen (``frozen 1``)."""
        return fs.events(self._events).get("frozen", 0) == 1

    async def wait_frozen(self, timeout_s: float) -> bool:
        """Wait until :meth:`is_frozen` (True) or ``timeout_s`` seconds pass (False).

        First up to :data:`SPIN_S` on the caller's thread, checking every few
        tens of µs (:func:`_spin`): asyncio cannot sleep less than a
        millisecond (its epoll timeout is in ms), and most freezes end well
        before that, so a freeze that missed the first check cost about 1 ms
        more (on the H200 host, one sibling: entry's freeze p50 0.2 or 1.3 ms
        by luck).  Then polls with asyncio sleeps doubling to 5 ms.

        Freezing is asynchronous (cgroup-v2.rst ``cgroup.freeze``): the kernel
        reports completion as ``frozen 1`` in ``cgroup.events``, and tasks in
        uninterruptible sleep freeze only when they return to user space, so the
        wait has a timeout and the caller rolls back with :meth:`thaw` (as runc
        does).  Frozen tasks still die from SIGKILL.
        """
        deadline = time.monotonic() + timeout_s
        if self.is_frozen() or _spin(self.is_frozen, min(SPIN_S, timeout_s)):
            return True
        delay = 1e-3
        while True:
            if self.is_frozen():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5e-3)

    # --- CPU placement ------------------------------------------------------------------

    def set_cpus(self, cores: Sequence[int]) -> None:
        """Confine the tenant to ``cores`` (core ids; cpuset.cpus or every thread's affinity)."""
        cores = tuple(sorted(set(cores)))
        if not cores:
            raise ValueError("set_cpus needs at least one core")
        if self.cpuset_kind == CPUSET_AFFINITY or self._cpus is None:
            for pid in self.pids():
                _set_affinity_all_threads(pid, cores)
        else:
            fs.write(self._cpus, format_cores(cores))

    # --- end of life --------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL every process of the tree (``cgroup.kill``, else one by one).

        Frozen tasks die too (fatal signals reach them); the cgroup is also
        thawed so that nothing stays stopped.
        """
        kill_file = os.path.join(self.freezer_dir, "cgroup.kill")
        if os.path.exists(kill_file):
            fs.write(kill_file, "1")
        else:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.thaw()
        except fs.CgroupError:
            pass

    async def wait_empty(self, timeout_s: float) -> bool:
        """Wait until no process is left (True) or ``timeout_s`` seconds pass (False)."""
        deadline = time.monotonic() + timeout_s
        delay = 200e-6
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 20e-3)
        return True

    def close(self) -> None:
        """Close the held control files (a later use opens them again)."""
        for f in (self._procs, self._events, self._freeze, self._cpus):
            if f is not None:
                f.close()

    def remove(self) -> None:
        """Remove the tenant's directories (they must be empty: kill() and wait_empty() first).

        Closes the held control files first.
        """
        self.close()
        for d in reversed(self.paths):
            fs.rmdir(d)


#: How long :meth:`TenantCgroup.wait_frozen` may wait on the caller's thread (s).
SPIN_S = 300e-6
#: No spin within this long (s) after a spin that ran out: a round of
#: siblings slow to freeze blocks the event loop once, not once per sibling.
_SPIN_QUIET_S = 0.01
_spin_ran_out = -1.0  # monotonic s of the last spin that ran out


def _spin(done: Callable[[], bool], budget_s: float) -> bool:
    """Check ``done`` every few tens of µs (``time.sleep``) for up to ``budget_s`` s.

    Blocks the calling thread (krexd's event loop): bounded by ``budget_s``
    and skipped for :data:`_SPIN_QUIET_S` after one ran out.
    """
    global _spin_ran_out
    now = time.monotonic()
    if now - _spin_ran_out < _SPIN_QUIET_S:
        return False
    end = now + budget_s
    while time.monotonic() < end:
        time.sleep(20e-6)
        if done():
            return True
    _spin_ran_out = time.monotonic()
    return False


def _set_affinity_all_threads(pid: int, cores: Sequence[int]) -> None:
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):
            pass
