"""The CUDA driver's lock of another process: the drain a tenant cannot forge.

The one binding of ``cuCheckpointProcessLock`` / ``cuCheckpointProcessUnlock``
(driver API since CUDA 12.8): :class:`DriverLock` loads the driver
(``libcuda.so.1``, or the tests' fake through ``KREX_DRIVER_LIB``) with
ctypes, which releases the GIL during each call, and locks many processes in
parallel threads.  docs/design/driver-lock.md.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass

from krexd.config.config import ConfigError, RegionConfig
from krexd.system.procfs import pid_alive, read_stat
from krexd.system.workers import DaemonWorkers

log = logging.getLogger("krexd.driverlock")

#: cuda.h CUresult values the lock's callers tell apart.  What the driver returns
#: when was measured on 580.159.04 (docs/bench/driver-lock.md): a lock whose
#: timeout passes returns NOT_READY; a live process without CUDA NOT_INITIALIZED;
#: a pid that does not exist OPERATING_SYSTEM; an MPS client NOT_SUPPORTED.
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_OPERATING_SYSTEM = 304
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_TIMEOUT = 909

#: cuda.h CUprocessState.
_STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class _LockArgs(ctypes.Structure):
    """cuda.h ``CUcheckpointLockArgs``: timeoutMs (0: no limit), reserved words."""

    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


class _UnlockArgs(ctypes.Structure):
    """cuda.h ``CUcheckpointUnlockArgs``: reserved words only."""

    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class Outcome(enum.Enum):
    """What one lock or unlock of one process came to."""

    LOCKED = "locked"  # lock: the process is blocked and its submitted work is done
    UNLOCKED = "unlocked"  # unlock: it runs again
    NOT_CUDA = "not_cuda"  # no CUDA state to lock (never initialized, or gone)
    TIMEOUT = "timeout"  # its submitted work did not complete in time; left running
    UNSUPPORTED = "unsupported"  # the driver cannot lock it (an MPS client): not locked
    BUSY = "busy"  # in a state that cannot be locked (locked by another, checkpointed)
    STUCK = "stuck"  # the call did not return within its timeout + LOCK_GRACE_S
    ERROR = "error"  # anything else: ``code`` names it


#: How much longer than its own timeout krexd waits for one lock call.  The driver
#: does not honour the timeout for a process that cannot run (frozen: measured;
#: stopped by a signal or a tracer: the same by reading), so without this bound
#: one such process would hold region entry on its GPU, and every region after it.
LOCK_GRACE_S = 0.5

#: ``code`` of a STUCK result (no CUresult came back).
NO_RETURN = -1


@dataclass(frozen=True)
class Result:
    """One call's outcome for ``pid``: the CUresult ``code`` and how long it took (ms)."""

    pid: int
    outcome: Outcome
    code: int
    ms: float

    def describe(self) -> str:
        """One line: pid, outcome, CUresult (or the process's state when stuck) and time."""
        if self.outcome is Outcome.STUCK:
            waited = f"in {self.ms:.0f} ms" if self.ms else "(an earlier lock call of it)"
            return (
                f"pid {self.pid}: the driver's lock did not return {waited} "
                f"(process state {_run_state(self.pid)})"
            )
        return f"pid {self.pid}: {self.outcome.value} (CUresult {self.code}, {self.ms:.1f} ms)"


def _run_state(pid: int) -> str:
    """``/proc/<pid>/stat``'s state letter, with a word for the ones that cannot run."""
    try:
        stat = read_stat(pid)
        letter = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3].decode()
    except (OSError, ValueError):
        return "gone"
    words = {"T": "stopped", "t": "traced", "D": "in the kernel", "Z": "exiting"}
    return f"{letter} ({words[letter]})" if letter in words else letter


class DriverLockUnavailable(Exception):
    """The driver cannot lock processes here (no driver, too old, cuInit failed)."""


class DriverLock:
    """``cuCheckpointProcessLock``/``Unlock``/``GetState`` of other processes, in parallel.

    ``library``: the driver to load (default: ``KREX_DRIVER_LIB``, else
    ``libcuda.so.1``).  Loading and ``cuInit(0)`` happen on first use
    (:meth:`open`); ``cuInit`` creates no context.  Calls run in parallel
    on daemon threads (``krexd.system.workers``): a call that does not return
    keeps its thread without delaying any other, and at most one lock per
    process is ever in flight (:meth:`lock_all`).
    """

    def __init__(self, library: str | None = None) -> None:
        self.library = library or os.environ.get("KREX_DRIVER_LIB") or "libcuda.so.1"
        self._cu: ctypes.CDLL | None = None
        self._error: str | None = None
        self._open_lock = threading.Lock()
        self._workers = DaemonWorkers("krex-driverlock")
        self._in_flight: set[int] = set()  # pids with a lock call not returned yet
        self._abandoned: set[int] = set()  # of those, the ones lock_all gave up on
        self._in_flight_lock = threading.Lock()

    def open(self) -> None:
        """Load the driver and ``cuInit(0)`` once.

        Raises:
            DriverLockUnavailable: the library is missing, lacks the
                checkpoint calls, or ``cuInit`` failed (the reason is kept
                for :meth:`unavailable_reason`).
        """
        with self._open_lock:
            if self._cu is not None:
                return
            if self._error is not None:
                raise DriverLockUnavailable(self._error)
            try:
                cu = ctypes.CDLL(self.library)
                for name in ("cuCheckpointProcessLock", "cuCheckpointProcessUnlock"):
                    getattr(cu, name)
                rc = cu.cuInit(0)
            except (OSError, AttributeError) as exc:
                self._error = f"{self.library}: {exc}"
                raise DriverLockUnavailable(self._error) from None
            if rc != CUDA_SUCCESS:
                self._error = f"{self.library}: cuInit failed with CUresult {rc}"
                raise DriverLockUnavailable(self._error)
            self._cu = cu

    def unavailable_reason(self) -> str | None:
        """None when the driver can lock processes, else why not (after :meth:`open`)."""
        try:
            self.open()
        except DriverLockUnavailable as exc:
            return str(exc)
        return None

    def lock(self, pid: int, timeout_ms: int) -> Result:
        """Lock ``pid``: block its CUDA calls, wait for its submitted work (bounded).

        Args:
            pid: a process in krexd's pid namespace.
            timeout_ms: at most this long (ms, >= 1); on expiry the driver
                leaves the process running (``Outcome.TIMEOUT``).  Never
                call it for a frozen process: the driver does not return
                while the process is frozen, timeout or not (measured).

        Raises:
            DriverLockUnavailable: see :meth:`open`.
        """
        self.open()
        assert self._cu is not None
        args = _LockArgs(max(1, int(timeout_ms)))
        t = time.monotonic()
        rc = int(self._cu.cuCheckpointProcessLock(ctypes.c_int(pid), ctypes.byref(args)))
        ms = (time.monotonic() - t) * 1e3
        return Result(pid, _lock_outcome(rc, pid), rc, ms)

    def unlock(self, pid: int) -> Result:
        """Unlock ``pid`` (``Outcome.UNLOCKED``; ``NOT_CUDA`` when it is gone).

        Raises:
            DriverLockUnavailable: see :meth:`open`.
        """
        self.open()
        assert self._cu is not None
        args = _UnlockArgs()
        t = time.monotonic()
        rc = int(self._cu.cuCheckpointProcessUnlock(ctypes.c_int(pid), ctypes.byref(args)))
        ms = (time.monotonic() - t) * 1e3
        if rc == CUDA_SUCCESS:
            outcome = Outcome.UNLOCKED
        elif not pid_alive(pid) or rc in _NOT_CUDA:
            outcome = Outcome.NOT_CUDA
        elif rc == CUDA_ERROR_ILLEGAL_STATE:
            outcome = Outcome.BUSY  # not locked (any more)
        else:
            outcome = Outcome.ERROR
        return Result(pid, outcome, rc, ms)

    def state(self, pid: int) -> str | None:
        """``running``, ``locked``, ``checkpointed`` or ``failed``; None: no CUDA state."""
        self.open()
        assert self._cu is not None
        st = ctypes.c_int(-1)
        rc = self._cu.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(st))
        return _STATES.get(st.value) if rc == CUDA_SUCCESS else None

    def lock_all(self, pids: Iterable[int], timeout_ms: int) -> dict[int, Result]:
        """:meth:`lock` each of ``pids`` at once, in parallel threads; pid -> result.

        Returns within ``timeout_ms`` + :data:`LOCK_GRACE_S` whatever the
        driver does: a call still running then is reported ``STUCK`` and
        left to finish in its thread; should it lock the process after all,
        that thread unlocks it before the pid can be locked again (the
        caller has treated it as not locked).  A pid whose earlier call is
        still in flight is reported ``STUCK`` without a second call.
        """
        t0 = time.monotonic()
        out: dict[int, Result] = {}
        futures: dict[int, Future[Result]] = {}
        with self._in_flight_lock:
            for pid in set(pids):
                if pid in self._in_flight:
                    out[pid] = Result(pid, Outcome.STUCK, NO_RETURN, 0.0)
                    continue
                self._in_flight.add(pid)
                futures[pid] = self._workers.submit(self._lock_in_flight, pid, timeout_ms)
        wait(futures.values(), timeout=max(1, timeout_ms) / 1e3 + LOCK_GRACE_S)
        with self._in_flight_lock:
            # Still in flight (its thread has not finished the call): abandoned, and
            # that thread undoes a late lock.  Otherwise its result is (about to be) set.
            late = {pid for pid in futures if pid in self._in_flight}
            self._abandoned |= late
        for pid, f in futures.items():
            if pid not in late:
                out[pid] = f.result()
                log.debug("driver lock: %s", out[pid].describe())
                continue
            ms = (time.monotonic() - t0) * 1e3
            out[pid] = Result(pid, Outcome.STUCK, NO_RETURN, ms)
            log.error("driver lock: %s; left to finish", out[pid].describe())
        return out

    def _lock_in_flight(self, pid: int, timeout_ms: int) -> Result:
        """One lock of :meth:`lock_all`, in its own thread; undone here if abandoned."""
        r: Result | None = None
        try:
            r = self.lock(pid, timeout_ms)
            return r
        finally:
            with self._in_flight_lock:
                abandoned = pid in self._abandoned
                self._abandoned.discard(pid)
                if not abandoned:
                    self._in_flight.discard(pid)
            if abandoned:
                self._undo_late(pid, r)

    def _undo_late(self, pid: int, r: Result | None) -> None:
        """An abandoned lock returned: unlock what it locked, then let the pid be locked again."""
        try:
            if r is not None and r.outcome is Outcome.LOCKED:
                u = self.unlock(pid)
                log.warning(
                    "driver lock: pid %d was locked %.0f ms late, after its entry gave up; "
                    "unlock: %s", pid, r.ms, u.outcome.value,
                )  # fmt: skip
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(pid)

    def unlock_all(self, pids: Iterable[int]) -> dict[int, Result]:
        """:meth:`unlock` each of ``pids`` in parallel; pid -> result.  Logs failures."""
        futures = {pid: self._workers.submit(self.unlock, pid) for pid in set(pids)}
        out = {pid: f.result() for pid, f in futures.items()}
        for r in out.values():
            if r.outcome not in (Outcome.UNLOCKED, Outcome.NOT_CUDA):
                log.error("driver unlock failed: %s", r.describe())
            else:
                log.debug("driver unlock: %s", r.describe())
        return out

    def close(self) -> None:
        """Nothing to stop: the worker threads are daemons (a call that never
        returns does not hold krexd's exit)."""


#: CUresults that mean "no CUDA state in that process to lock".
_NOT_CUDA = (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_FOUND)


def _lock_outcome(rc: int, pid: int) -> Outcome:
    if rc == CUDA_SUCCESS:
        return Outcome.LOCKED
    if rc == CUDA_ERROR_OPERATING_SYSTEM:
        return Outcome.NOT_CUDA  # measured: the driver's answer for a pid that is gone
    if rc in (CUDA_ERROR_NOT_READY, CUDA_ERROR_TIMEOUT):
        return Outcome.TIMEOUT
    if rc == CUDA_ERROR_NOT_SUPPORTED:
        return Outcome.UNSUPPORTED
    if rc == CUDA_ERROR_ILLEGAL_STATE:
        return Outcome.BUSY
    if rc in _NOT_CUDA or not pid_alive(pid):
        return Outcome.NOT_CUDA
    return Outcome.ERROR


def driver_lock_for(
    region: RegionConfig, fake_gpus: int = 0, mps: bool = False
) -> DriverLock | None:
    """The daemon's :class:`DriverLock` for ``[region] driver_lock``, or None.

    "off": None.  "auto": the driver's lock where it works, else None with
    a warning (regions then rest on the shim's acknowledgements).
    "require": raises ``ConfigError`` where it does not work.  With
    simulated GPUs (``fake_gpus``) only ``KREX_DRIVER_LIB`` (the fake
    driver) is used, never the host's driver.  Under MPS (``mps``) the
    driver cannot lock its clients (``CUDA_ERROR_NOT_SUPPORTED``, measured
    on 580): "require" is refused, "auto" warns (regions then rest on the
    shim's acknowledgements, and each grant lists the processes not locked).
    """
    if region.driver_lock == "off":
        return None
    if mps and not fake_gpus:
        if region.driver_lock == "require":
            raise ConfigError(
                '[region] driver_lock = "require" with [mps] enabled: the driver cannot lock '
                "MPS clients (CUDA_ERROR_NOT_SUPPORTED)"
            )
        log.warning("under MPS the driver cannot lock its clients: drains rest on the shim")
    if fake_gpus and not os.environ.get("KREX_DRIVER_LIB"):
        reason: str | None = "simulated GPUs and no KREX_DRIVER_LIB (the fake driver)"
        lock = None
    else:
        # Real GPUs are locked through the host's driver, whatever KREX_DRIVER_LIB says
        # (a test environment may name the fake driver for its simulated GPUs).
        lock = DriverLock(None if fake_gpus else "libcuda.so.1")
        reason = lock.unavailable_reason()
    if lock is not None and reason is None:
        log.info("region entry locks other processes through %s", lock.library)
        return lock
    if region.driver_lock == "require":
        raise ConfigError(f'[region] driver_lock = "require", but the driver cannot: {reason}')
    log.warning(
        "the driver cannot lock processes (%s): region drains rest on the shim's acknowledgements",
        reason,
    )
    return None
