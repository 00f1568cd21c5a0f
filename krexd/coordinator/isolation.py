"""The interfaces the coordinator acts through, and the real ones the daemon injects.

The coordinator never touches cgroupfs, the scheduler, the gate library or
the driver directly: each Protocol here says what one step needs, and
:class:`CgroupControl` and :class:`AffinityPinner` are the cgroup and
``sched_setaffinity`` implementations (in-memory fakes stand in for tests).
An ``OSError`` whose errno says the tenant or thread is gone: :func:`gone`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from krexd.gate import RegistrationInfo
from krexd.hardware.driverlock import Result
from krexd.tenancy.registrations import Suspect, Unprotected
from krexd.tenancy.tenants import PidWatch, Tenant


def gone(exc: OSError) -> bool:
    """True when ``exc`` says the cgroup, process or thread no longer exists."""
    return exc.errno in (errno.ENOENT, errno.ESRCH, errno.ENODEV)


def freeze_unless_gone(control: TenantControl, tenant: Tenant) -> bool:
    """Write ``tenant``'s freeze (step 4); False when its cgroup is gone (it ended).

    Raises:
        OSError: any other failure of the write.
    """
    return _unless_gone(control.freeze, tenant)


def thaw_unless_gone(control: TenantControl, tenant: Tenant) -> bool:
    """Write ``tenant``'s thaw; False when its cgroup is gone (it ended).

    Raises:
        OSError: any other failure of the write.
    """
    return _unless_gone(control.thaw, tenant)


def _unless_gone(write: Callable[[Tenant], None], tenant: Tenant) -> bool:
    try:
        write(tenant)
    except OSError as exc:
        if gone(exc):
            return False
        raise
    return True


class EndCommand(Protocol):
    """Ends a tenant's command for what it did (``Lifecycle.kill_command``)."""

    def __call__(self, tenant: Tenant, reason: str, exit_code: int, cause: str = "other") -> None:
        """Kill ``tenant``'s command; its launcher reports ``exit_code`` and ``reason``;
        ``cause``: the label it is counted under (``region_stats.ENDED_CAUSES``)."""


class Watch(Protocol):
    """A watch on a process started by :meth:`TenantControl.watch_exit`."""

    def cancel(self) -> None:
        """Stop watching (no callback afterwards)."""
        ...


class TenantControl(Protocol):
    """Freezer and process control of tenants (raises ``OSError``; see :func:`gone`)."""

    def freeze(self, tenant: Tenant) -> None:
        """Ask the kernel to freeze the tenant's whole tree (asynchronous)."""
        ...

    def thaw(self, tenant: Tenant) -> None:
        """Thaw the tenant's whole tree."""
        ...

    def is_frozen(self, tenant: Tenant) -> bool:
        """True when every task of the tenant is frozen."""
        ...

    async def wait_frozen(self, tenant: Tenant, timeout_s: float) -> bool:
        """Wait until frozen (True) or ``timeout_s`` seconds pass (False)."""
        ...

    def kill(self, tenant: Tenant) -> None:
        """SIGKILL the tenant's whole tree."""
        ...

    def owns_process(self, tenant: Tenant, pid: int) -> bool:
        """True when process ``pid`` is in the tenant's cgroup."""
        ...

    def processes(self, tenant: Tenant) -> list[int]:
        """The processes in the tenant's cgroup now (empty once it is gone)."""
        ...

    def thread_exists(self, pid: int, tid: int) -> bool:
        """True when ``tid`` is a thread of process ``pid``."""
        ...

    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> Watch:
        """Call ``on_exit()`` once, from the event loop, when process ``pid`` ends."""
        ...


class Pinner(Protocol):
    """CPU placement of a region's holder (step 5 and its undo at step 7)."""

    def set_cpus(self, tenant: Tenant, cores: tuple[int, ...]) -> None:
        """Confine the tenant's tree to ``cores`` (its cpuset)."""
        ...

    def pin_thread(self, tid: int, cores: tuple[int, ...]) -> None:
        """Set thread ``tid``'s affinity to ``cores``; ``ProcessLookupError`` if it ended."""
        ...

    def thread_cpus(self, tid: int) -> tuple[int, ...]:
        """Thread ``tid``'s affinity (sorted core ids); ``ProcessLookupError`` if it ended."""
        ...


class RegionGate(Protocol):
    """The coordinator's side of one GPU's gate (``krexd.gate.Gate``).

    ``drain`` raises ``krexd.gate.GateTimeout`` (``pending``: the undrained
    registrations) or another ``GateError``; ``reopen`` raises ``GateError``
    when the gate no longer holds (holder, epoch).
    """

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: close the gate for (holder, epoch)."""
        ...

    def drain(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> None:
        """Step 3: block until every sibling registration acknowledged ``epoch``.

        ``settled(pending)``: called in the drain's thread at its first scan
        and after each change, with the tenants that still have pending
        registrations; the tenants it returns are not waited for from then on.
        """
        ...

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: reopen the gate if it still holds (holder, epoch)."""
        ...

    def registrations(self) -> list[RegistrationInfo]:
        """A snapshot of every registration of the gate (to name pending ones)."""
        ...


class ProcessLock(Protocol):
    """The driver's lock of other processes (``krexd.hardware.driverlock.DriverLock``)."""

    def lock_all(self, pids: Iterable[int], timeout_ms: int) -> dict[int, Result]:
        """Lock each of ``pids`` in parallel, each bounded by ``timeout_ms``; pid -> result."""
        ...

    def unlock_all(self, pids: Iterable[int]) -> dict[int, Result]:
        """Unlock each of ``pids`` in parallel; pid -> result."""
        ...


class ActivityWitness(Protocol):
    """Per-process GPU activity (``krexd.memory.activity``)."""

    #: True when ``busy`` is exact (ends offenders); False: sampled, flags only.
    exact: bool

    def busy(self, gpu_index: int, t0_ns: int, t1_ns: int) -> dict[int, int]:
        """pid -> ns of its GPU work overlapping the window (CLOCK_MONOTONIC ns)."""
        ...


class LockRecord(Protocol):
    """Whom a region locked, kept where a successor finds it (``krexd.hardware.lock_ledger``)."""

    def record(self, pids: Iterable[int]) -> list[tuple[int, int]]:
        """Record ``pids`` as locked (before locking them)."""
        ...

    def clear(self) -> None:
        """Nothing is locked any more."""
        ...

    def live(self) -> list[int]:
        """The recorded pids that still name the process recorded (not reused)."""
        ...


@dataclass(frozen=True)
class RegionFit:
    """A region entry's memory (bytes): the holder's expected need against its siblings'.

    ``need``: what the holder is expected to hold in its region (its peak so
    far in this command, or its learned need, whichever is larger);
    ``total``: the card; ``siblings``: what the other tenants of the GPU hold
    now (frozen, they keep it through the region); ``other``: what processes
    krex does not run hold.
    """

    need: int
    total: int
    siblings: int
    other: int

    @property
    def free(self) -> int:
        """What the card leaves the holder while its siblings keep their memory."""
        return self.total - self.other - self.siblings

    @property
    def fits(self) -> bool:
        """The need fits now."""
        return self.need <= self.free

    @property
    def never(self) -> bool:
        """The need cannot fit even with every sibling's memory freed."""
        return self.need > self.total - self.other


class RegionMemory(Protocol):
    """The coordinator's memory check, on the event loop while the drain's thread runs.

    ``check`` must be safe beside that thread (``Gate.drain``, its judge and
    ``DrainFreeze.settled``): the real one reads the gate's registrations
    (each thread its own buffer) and pidfds (``krexd.system.procfs.HANDLES``,
    locked), and writes only memory records no drain reads.
    """

    @property
    def wait_s(self) -> float:
        """Bound (s) of an entry's wait for siblings to free memory (``[memory] region_wait_s``)."""
        ...

    def check(self, holder: Tenant, siblings: list[Tenant]) -> RegionFit | None:
        """The holder's expected need against what ``siblings`` hold, read now (None: unknown)."""
        ...


class GpuUseCheck(Protocol):
    """Who has the GPU open, and which siblings do so unprotected (``RegionGuard``)."""

    def users(self) -> set[int] | None:
        """Pids (krexd's namespace) with a context on the GPU now; None when unknown."""
        ...

    def unverified(self, siblings: list[Tenant]) -> list[Suspect]:
        """Sibling processes without a verified registration (no driver call: cheap)."""
        ...

    def unprotected_among(self, suspects: list[Suspect], epoch: int) -> list[Unprotected]:
        """Those of ``suspects`` that have the GPU open (may ask the driver)."""
        ...


class CgroupControl:
    """:class:`TenantControl` over the tenant's cgroup (``krexd.cgroups.TenantCgroup``)."""

    def __init__(self, poll_s: float = 0.2) -> None:
        self._poll_s = poll_s  # liveness poll period where pidfds are unavailable

    def freeze(self, tenant: Tenant) -> None:
        """``cgroup.freeze`` = 1."""
        tenant.cgroup.freeze()

    def thaw(self, tenant: Tenant) -> None:
        """``cgroup.freeze`` = 0."""
        tenant.cgroup.thaw()

    def is_frozen(self, tenant: Tenant) -> bool:
        """``frozen 1`` in ``cgroup.events``."""
        return tenant.cgroup.is_frozen()

    async def wait_frozen(self, tenant: Tenant, timeout_s: float) -> bool:
        """Poll ``cgroup.events`` until frozen or ``timeout_s`` (s)."""
        return await tenant.cgroup.wait_frozen(timeout_s)

    def kill(self, tenant: Tenant) -> None:
        """``cgroup.kill`` (or SIGKILL one by one)."""
        tenant.cgroup.kill()

    def owns_process(self, tenant: Tenant, pid: int) -> bool:
        """``pid`` listed in the tenant's ``cgroup.procs``."""
        return pid in tenant.cgroup.pids()

    def processes(self, tenant: Tenant) -> list[int]:
        """The tenant's ``cgroup.procs`` (empty once the cgroup is gone)."""
        try:
            return tenant.cgroup.pids()
        except OSError:
            return []

    def thread_exists(self, pid: int, tid: int) -> bool:
        """``/proc/<pid>/task/<tid>`` exists."""
        return os.path.exists(f"/proc/{pid}/task/{tid}")

    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> Watch:
        """A pidfd watch (``krexd.tenancy.tenants.PidWatch``)."""
        return PidWatch(pid, on_exit, self._poll_s)


class AffinityPinner:
    """:class:`Pinner` through the tenant's cpuset and ``sched_setaffinity(2)``."""

    def set_cpus(self, tenant: Tenant, cores: tuple[int, ...]) -> None:
        """``cpuset.cpus`` of the tenant (or every thread's affinity without cpuset)."""
        tenant.cgroup.set_cpus(cores)

    def pin_thread(self, tid: int, cores: tuple[int, ...]) -> None:
        """``sched_setaffinity(tid, cores)``."""
        os.sched_setaffinity(tid, cores)

    def thread_cpus(self, tid: int) -> tuple[int, ...]:
        """``sched_getaffinity(tid)``."""
        return tuple(sorted(os.sched_getaffinity(tid)))
