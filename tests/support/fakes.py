"""In-memory fakes of the coordinator's interfaces (coordinator.isolation), for root-free tests.

Every fake appends what it was asked to do to one shared :class:`Events`
log, so a test can assert on the order of the protocol's steps across the
freezer, the pinner and the gate.  Nothing here touches cgroupfs, the
scheduler or ``libkrex_gate.so``: tests using these run without root and
without a built shim.

* :class:`FakeTenantControl` — freeze/thaw/kill as flags; ``wait_frozen``
  can be held open (``hold_freeze``) or made to time out (``stuck``);
  ``watch_exit`` keeps the callbacks so a test can kill a holder
  (:meth:`FakeTenantControl.exit_process`).
* :class:`FakePinner` — records cpusets and thread affinities.
* :class:`FakeGate` — the gate word with (holder, epoch) checks; ``drain``
  can time out (``drain_pending``).
* :class:`FakeRegionMemory` — the memory check during step 3: per-tenant
  bytes held and expected, set by the test.
* :func:`make_tenant` — a RUNNING tenant with a placeholder cgroup.
* :func:`slots_for` — admission slot counters for a list of GPUs.
* :func:`until` — await a condition the protocol reaches in its own time (a
  drain in a worker thread, a scheduled recovery), not a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from krexd.cgroups import TenantCgroup
from krexd.coordinator.isolation import RegionFit
from krexd.gate import GateError, GateStale, GateTimeout, RegistrationInfo
from krexd.hardware.driverlock import Outcome, Result
from krexd.tenancy import states
from krexd.tenancy.admission import GpuSlots
from krexd.tenancy.tenants import Tenant, TenantRegistry

_pids = itertools.count(100_000)


async def until(
    cond: Callable[[], object], what: str = "condition", timeout_s: float = 10.0
) -> None:
    """Yield to the loop until ``cond()`` is true (every ms); AssertionError naming ``what``
    after ``timeout_s``.  For states reached by worker threads or scheduled tasks: a fixed
    sleep is too short on a busy host."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.001)


@dataclass
class Events:
    """The ordered log of every fake's actions: tuples like ``("freeze", 3)``.

    ``hooks`` maps an action name to callbacks run right after the action is
    logged (to force a race at an exact point of the protocol).
    """

    log: list[tuple[Any, ...]] = field(default_factory=list)
    hooks: dict[str, list[Callable[[], None]]] = field(default_factory=dict)

    def add(self, *event: Any) -> None:
        """Log ``event`` and run the hooks of its name."""
        self.log.append(event)
        for hook in self.hooks.get(event[0], []):
            hook()

    def on(self, name: str, hook: Callable[[], None]) -> None:
        """Run ``hook()`` each time an action ``name`` is logged."""
        self.hooks.setdefault(name, []).append(hook)

    def names(self) -> list[str]:
        """Action names in order."""
        return [e[0] for e in self.log]


class _FakeWatch:
    def __init__(self, control: FakeTenantControl, pid: int, on_exit: Callable[[], None]) -> None:
        self.pid = pid
        self.on_exit = on_exit
        self.cancelled = False
        self._control = control

    def cancel(self) -> None:
        self.cancelled = True


class FakeTenantControl:
    """:class:`krexd.coordinator.isolation.TenantControl` over flags: nothing is really frozen."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.frozen: set[int] = set()
        self.killed: set[int] = set()
        self.stuck: set[int] = set()  # tenants whose freeze never completes
        self.hold_freeze: asyncio.Event | None = None  # wait_frozen waits for it when set
        self.watches: list[_FakeWatch] = []

    def freeze(self, tenant: Tenant) -> None:
        self.events.add("freeze", tenant.id)
        self.frozen.add(tenant.id)

    def thaw(self, tenant: Tenant) -> None:
        self.events.add("thaw", tenant.id)
        self.frozen.discard(tenant.id)

    def is_frozen(self, tenant: Tenant) -> bool:
        return tenant.id in self.frozen and tenant.id not in self.stuck

    async def wait_frozen(self, tenant: Tenant, timeout_s: float) -> bool:
        self.events.add("wait_frozen", tenant.id)
        if self.hold_freeze is not None:
            await self.hold_freeze.wait()
        return self.is_frozen(tenant)

    def kill(self, tenant: Tenant) -> None:
        self.events.add("kill", tenant.id)
        self.killed.add(tenant.id)

    def owns_process(self, tenant: Tenant, pid: int) -> bool:
        return pid in tenant.pids

    def processes(self, tenant: Tenant) -> list[int]:
        return [] if tenant.id in self.killed else sorted(tenant.pids)

    def thread_exists(self, pid: int, tid: int) -> bool:
        return tid == pid or tid > 0

    def watch_exit(self, pid: int, on_exit: Callable[[], None]) -> _FakeWatch:
        w = _FakeWatch(self, pid, on_exit)
        self.watches.append(w)
        return w

    def exit_process(self, pid: int) -> None:
        """Process ``pid`` ends: fire every live watch on it (as a pidfd would)."""
        for w in self.watches:
            if w.pid == pid and not w.cancelled:
                w.cancelled = True
                w.on_exit()


class FakePinner:
    """:class:`krexd.coordinator.isolation.Pinner` that records cpusets and thread affinities."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.cpus: dict[int, tuple[int, ...]] = {}
        self.affinity: dict[int, tuple[int, ...]] = {}
        self.initial: tuple[int, ...] = ()  # affinity of a thread never pinned

    def set_cpus(self, tenant: Tenant, cores: tuple[int, ...]) -> None:
        self.events.add("set_cpus", tenant.id, tuple(cores))
        self.cpus[tenant.id] = tuple(cores)

    def pin_thread(self, tid: int, cores: tuple[int, ...]) -> None:
        self.events.add("pin_thread", tid, tuple(cores))
        self.affinity[tid] = tuple(cores)

    def thread_cpus(self, tid: int) -> tuple[int, ...]:
        # A read, not an action: not logged.  Threads never pinned have ``initial``.
        return self.affinity.get(tid, self.initial)


class FakeGate:
    """:class:`krexd.coordinator.isolation.RegionGate`: the gate word, its (holder, epoch) checks.

    ``drain_pending``: registration indices ``drain`` reports as not drained
    (it then raises ``GateTimeout`` with those of ``registrations``, or
    placeholders of tenant 0), for the holders in ``drain_fails_for`` (None:
    every holder); ``drain_error`` another error to raise.  ``drain_steps``:
    the sets of tenants still pending that the drain reports to its
    ``settled`` callback first, in order (each logged as ``drain_step``).
    """

    def __init__(self, events: Events) -> None:
        self.events = events
        self.word: tuple[int, int] | None = None
        self.drain_pending: list[int] = []
        self.drain_fails_for: set[int] | None = None
        self.drain_error: GateError | None = None
        self.drain_steps: list[set[int]] = []
        self.records: list[RegistrationInfo] = []

    def close(self, holder: int, epoch: int) -> None:
        self.events.add("close", holder, epoch)
        if self.word is not None:
            raise GateError(f"gate held by {self.word}")
        self.word = (holder, epoch)

    def drain(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> None:
        # Called from a worker thread (asyncio.to_thread), like the real one.
        self.events.add("drain", holder, epoch)
        if self.drain_error is not None:
            raise self.drain_error
        for step in self.drain_steps:
            if settled is not None:
                settled(set(step))
            self.events.add("drain_step", tuple(sorted(step)))
        fails = self.drain_fails_for is None or holder in self.drain_fails_for
        if self.drain_pending and fails:
            known = {s.index: s for s in self.records}
            pending = [
                known.get(i) or RegistrationInfo(i, "active", 0, 0, 0, 0, 0, 0, 0, 0)
                for i in self.drain_pending
            ]
            if settled is not None:
                settled({s.tenant for s in pending})
            raise GateTimeout("not drained", pending)

    def reopen(self, holder: int, epoch: int) -> None:
        self.events.add("reopen", holder, epoch)
        if self.word != (holder, epoch):
            raise GateStale(f"gate holds {self.word}, not {(holder, epoch)}")
        self.word = None

    def registrations(self) -> list[RegistrationInfo]:
        return list(self.records)


class FakeRegionMemory:
    """:class:`krexd.coordinator.isolation.RegionMemory` over numbers the test sets (bytes).

    ``held[tenant id]``: what a tenant holds now; ``expected[tenant id]``: its
    expected need in a region; ``total`` and ``other`` describe the card.
    Each check is logged as ``("memory_check", holder id, fits)``.
    """

    def __init__(self, events: Events, total: int, wait_s: float = 5.0) -> None:
        self.events = events
        self.total = total
        self.other = 0
        self.held: dict[int, int] = {}
        self.expected: dict[int, int] = {}
        self._wait_s = wait_s

    @property
    def wait_s(self) -> float:
        return self._wait_s

    def check(self, holder: Tenant, siblings: list[Tenant]) -> RegionFit | None:
        fit = RegionFit(
            need=self.expected.get(holder.id, self.held.get(holder.id, 0)),
            total=self.total,
            siblings=sum(self.held.get(t.id, 0) for t in siblings),
            other=self.other,
        )
        self.events.add("memory_check", holder.id, fit.fits)
        return fit


def slots_for(indices: list[int], slots_per_gpu: int) -> list[GpuSlots]:
    """Fresh admission counters for GPUs ``indices``, ``slots_per_gpu`` slots each."""
    return [GpuSlots(i, slots_per_gpu) for i in indices]


def make_tenant(registry: TenantRegistry, gpu: int = 0, exclusive: bool = False) -> Tenant:
    """A RUNNING tenant of ``gpu`` with one fake pid; its cgroup is a placeholder path."""
    tid = registry.new_id()
    cgroup = TenantCgroup(f"/nonexistent/krex-fake/t{tid}", None, "v2", (0,))
    t = Tenant(tid, registry.new_token(), gpu, ["fake"], 1, cgroup, exclusive=exclusive)
    t.pids.add(next(_pids))
    states.change_state(t, states.RUNNING)
    return t


class FakeProcessLock:
    """The driver's lock of other processes (``isolation.ProcessLock``), in memory.

    ``outcomes``: pid -> the ``Outcome`` its lock gets (default LOCKED);
    ``locked``: pids locked now.  Each call is logged in ``events``.
    ``frozen``: whether a pid is frozen now; the driver does not return
    from the lock of a frozen process, so such a lock is logged as
    ``lock_frozen`` and comes back STUCK (``DriverLock.lock_all``'s bound).
    """

    def __init__(self, events: Events) -> None:
        self.events = events
        self.outcomes: dict[int, Outcome] = {}
        self.locked: set[int] = set()
        self.frozen: Callable[[int], bool] = lambda pid: False

    def lock_all(self, pids: Iterable[int], timeout_ms: int) -> dict[int, Result]:
        out = {}
        for pid in sorted(set(pids)):
            if self.frozen(pid):
                self.events.add("lock_frozen", pid)
                out[pid] = Result(pid, Outcome.STUCK, -1, timeout_ms + 500.0)
                continue
            outcome = self.outcomes.get(pid, Outcome.LOCKED)
            self.events.add("lock", pid)
            if outcome is Outcome.LOCKED:
                self.locked.add(pid)
            out[pid] = Result(pid, outcome, 0 if outcome is Outcome.LOCKED else 909, 0.1)
        return out

    def unlock_all(self, pids: Iterable[int]) -> dict[int, Result]:
        out = {}
        for pid in sorted(set(pids)):
            self.events.add("unlock", pid)
            self.locked.discard(pid)
            out[pid] = Result(pid, Outcome.UNLOCKED, 0, 0.1)
        return out


class FakeLedger:
    """``krexd.coordinator.isolation.LockRecord`` in memory; ``history`` of what was recorded."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.entries: list[tuple[int, int]] = []

    def record(self, pids: Iterable[int]) -> list[tuple[int, int]]:
        self.entries = [(p, 1) for p in sorted(set(pids))]
        self.events.add("ledger", tuple(p for p, _ in self.entries))
        return self.entries

    def clear(self) -> None:
        self.entries = []
        self.events.add("ledger", ())

    def live(self) -> list[int]:
        return [p for p, _ in self.entries]


class FakeGuard:
    """``krexd.coordinator.isolation.GpuUseCheck``: ``users`` is the set of pids on the GPU."""

    def __init__(self, users: set[int] | None = None) -> None:
        self.users_now: set[int] | None = users
        self.leave: Callable[[], set[int]] = set  # pids that have left the GPU

    def users(self) -> set[int] | None:
        return None if self.users_now is None else set(self.users_now) - self.leave()

    def unverified(self, siblings: list[Tenant]) -> list[Any]:
        return []

    def unprotected_among(self, suspects: list[Any], epoch: int) -> list[Any]:
        return []
