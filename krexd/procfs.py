"""Readers of ``/proc/<pid>``: state, parent, start time and uids of a process.

One place for the checks several parts make (identity's rules, the tenants'
liveness poll, the memory monitor's registrations): a zombie (``Z``) or dead
(``X``) process with no thread left counts as gone everywhere, since it can
neither run nor be placed nor send requests (:func:`gone`).  Field numbers are proc(5)'s.
"""

from __future__ import annotations

import os


def read_file(path: str) -> bytes:
    """The whole of a small kernel file (procfs, cgroupfs): open, read, close.

    Four system calls (the last read sees the end) where a Python file
    object makes more (fstat, ioctl, buffer set-up, reads): region entry reads one or two
    such files per sibling process, and on the H200's host each call costs
    microseconds.  Raises OSError.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):  # a kernel file may return less than it has
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


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
        fields = read_file(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        if gone(fields[0], pid):
            return None
        # fields[0] is field 3 (state): ppid is field 4, starttime field 22.
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
    return proc_stat(pid) is not None


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
