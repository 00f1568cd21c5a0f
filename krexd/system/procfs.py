"""Readers of ``/proc/<pid>``: state, parent, start time and uids of a process.

One place for the checks several parts make (identity's rules, the
tenants' liveness poll, the memory views' registrations): a zombie or dead
process with no thread left is gone everywhere (:func:`gone`).  The held
``stat`` descriptors and the pidfds: docs/design/daemon.md "Process model:
one asyncio loop".  Field numbers are proc(5)'s.
"""

from __future__ import annotations

import os
import resource
import select
import threading
from collections import OrderedDict

from krexd.system.heldfiles import HeldFile, read_fd


def read_file(path: str) -> bytes:
    """The whole of a small kernel file (procfs, cgroupfs): open, read, close.

    Three system calls (``krexd.system.heldfiles.read_fd``) where a Python file
    object makes more (fstat, ioctl, buffer set-up, reads).  Files read at
    every region entry are held open instead (:data:`STAT_FILES`,
    ``krexd.cgroups.tenant``).  Raises OSError.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_fd(fd)
    finally:
        os.close(fd)


class StatFiles:
    """Open ``/proc/<pid>/stat`` descriptors by pid, at most ``limit`` (least recently read closed).

    Thread-safe (the drain's judgements read from a worker thread): one lock
    covers a read and any eviction, so no descriptor is closed while read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._files: OrderedDict[int, HeldFile] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, pid: object) -> bool:
        return pid in self._files

    def read(self, pid: int) -> bytes:
        """``/proc/<pid>/stat`` now; OSError (ESRCH, ENOENT) when there is no such process.

        A failed read leaves no descriptor of ``pid`` held: a reaped process's
        descriptor fails with ESRCH even when the pid number is in use again, and
        the next read opens the file afresh (its start time tells the processes apart).
        """
        with self._lock:
            f = self._files.pop(pid, None) or HeldFile(f"/proc/{pid}/stat", one_record=True)
            data = f.read()  # on OSError f holds nothing and is dropped
            self._files[pid] = f  # the most recently read last
            while len(self._files) > self.limit:
                self._files.popitem(last=False)[1].close()
            return data

    def clear(self) -> None:
        """Close every descriptor."""
        with self._lock:
            while self._files:
                self._files.popitem()[1].close()


def stat_limit(soft_nofile: int) -> int:
    """How many stat descriptors to hold under a soft ``RLIMIT_NOFILE`` of ``soft_nofile``.

    512, or a quarter of the limit when that is less (at least 16).  krexd
    leaves its limit as it finds it: the shipped unit sets ``LimitNOFILE=65536``,
    but started from a shell or another unit its soft limit is often 1024,
    shared with the tenants' held cgroup files, slot memories, pidfds and
    connections.
    """
    if soft_nofile == resource.RLIM_INFINITY or soft_nofile < 0:
        return 512
    return max(16, min(512, soft_nofile // 4))


#: krexd's held ``/proc/<pid>/stat`` descriptors (:func:`proc_stat`, ``registrations.identity``).
STAT_FILES = StatFiles(stat_limit(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))


def read_stat(pid: int) -> bytes:
    """``/proc/<pid>/stat`` through :data:`STAT_FILES`; raises OSError when there is no process."""
    return STAT_FILES.read(pid)


def gone(state: bytes, pid: int) -> bool:
    """True when a process whose ``stat`` state (field 3) is ``state`` can run no more.

    Z or X of the thread-group leader alone is not enough: a leader that
    called ``exit`` (not ``exit_group``) shows Z while its other threads
    still run, with the whole address space and open files; only when
    ``/proc/<pid>/task`` lists no thread but the leader is the process gone.
    """
    if state not in (b"Z", b"X"):
        return False
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


def proc_stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, start_time)`` of process ``pid`` from ``/proc/<pid>/stat``; None when gone.

    ``start_time`` is field 22 (clock ticks since boot).  A zombie counts as gone
    (:func:`gone`: unless other threads of it still run).
    """
    if pid <= 0:
        return None
    try:
        # Bytes: the command name (field 2) is whatever the process set, not always UTF-8.
        fields = read_stat(pid).rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        if gone(fields[0], pid):
            return None
        # fields[0] is field 3 (state): ppid is field 4, starttime field 22.
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


class Handles:
    """pidfds of processes krexd has seen, by pid, with their start times: at most ``limit``.

    A pidfd names one process, never a later one given the same number, and
    polls readable once its whole thread group has exited (a zombie leader
    whose other threads still run is not readable: :func:`gone`'s rule).
    So once a process's start time was read with a pidfd of it open, later
    questions "is it alive, and which start time" are answered by one poll
    of that pidfd, without generating ``/proc/<pid>/stat`` (several µs of
    kernel work per read, for every sibling process at every region entry).
    Thread-safe; the least recently asked pidfd is closed first.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._fds: OrderedDict[int, tuple[int, int]] = OrderedDict()  # pid -> (pidfd, start)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    def start_of(self, pid: int) -> int | None:
        """Start time (field 22) of live process ``pid``, or None when it is gone."""
        if pid <= 0:
            return None
        with self._lock:
            held = self._fds.pop(pid, None)
            if held is not None:
                if not _exited(held[0]):
                    self._fds[pid] = held
                    return held[1]
                os.close(held[0])
        return self._open(pid)

    def _open(self, pid: int) -> int | None:
        first = proc_stat(pid)
        if first is None:
            return None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return first[1]  # gone meanwhile, or no pidfds here: answered, not held
        try:
            # The pidfd names whoever has the number now: the same process if its
            # start time is unchanged and it is still alive.
            again = proc_stat(pid)
            if again is None or again[1] != first[1] or _exited(fd):
                os.close(fd)
                return again[1] if again is not None else None
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            old = self._fds.pop(pid, None)
            if old is not None:
                os.close(old[0])
            self._fds[pid] = (fd, first[1])
            while len(self._fds) > self.limit:
                os.close(self._fds.popitem(last=False)[1][0])
        return first[1]

    def clear(self) -> None:
        """Close every pidfd."""
        with self._lock:
            while self._fds:
                os.close(self._fds.popitem()[1][0])


def _exited(pidfd: int) -> bool:
    """True when the process of ``pidfd`` has exited (its pidfd polls readable).

    ``poll``, not ``select``: a long-running krexd holds descriptors numbered
    above ``FD_SETSIZE`` (1024), which ``select`` refuses.
    """
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


#: pidfds of the processes krexd asked about (:func:`pid_alive`, ``registrations.identity``);
#: half the stat descriptors' budget.
HANDLES = Handles(max(8, STAT_FILES.limit // 2))


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie with no thread left.

    Through :data:`HANDLES`: a poll of a held pidfd once the process was seen.
    """
    return HANDLES.start_of(pid) is not None


def start_time(pid: int) -> int | None:
    """Start time (``stat`` field 22) of live process ``pid``; None when it is gone."""
    return HANDLES.start_of(pid)


def cmdline(pid: int, limit: int = 80) -> str:
    """Process ``pid``'s command line as one line of at most ``limit`` characters ("?": gone)."""
    try:
        raw = read_file(f"/proc/{pid}/cmdline")
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:limit] or "?"


def proc_uids(pid: int) -> tuple[int, ...] | None:
    """Real, effective, saved and filesystem uid of ``pid`` (``/proc/<pid>/status``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return tuple(int(x) for x in line.split()[1:5])
    except (OSError, ValueError):
        return None
    return None
