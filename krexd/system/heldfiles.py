"""Small kernel files kept open between uses: one open, then one system call a use.

Why, and why a held descriptor that went stale (ESRCH, ENODEV) is opened
once more: docs/design/daemon.md "Process model: one asyncio loop".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Bytes asked for by each read.
READ_SIZE = 65536


class OpenError(OSError):
    """``open(2)`` of a held file failed (errno and path as the OSError it replaces)."""


class HeldFile:
    """The kernel file ``path`` kept open for reads (``write=False``) or for writes.

    ``one_record``: the kernel makes the file's text in one piece, so one
    ``pread`` reads it (:func:`read_fd`).  A read is ``pread`` from offset 0
    (procfs and cgroupfs seq files make their text afresh there), a write
    one ``pwrite`` at offset 0 (cgroupfs takes each write whole).  Opened at
    its first use; :meth:`close` closes it (a later use opens it again).  A
    use that fails on a held descriptor is made once more on a fresh one;
    every error is an OSError (:class:`OpenError` when ``open(2)`` failed),
    and a failed use holds nothing after it.  Usable from krexd's worker
    threads beside the loop: a lock keeps one thread from closing a
    descriptor another is about to read, whose number a third open could
    have reused.
    """

    __slots__ = ("path", "_flags", "_one_record", "_fd", "_lock")

    def __init__(self, path: str, write: bool = False, one_record: bool = False) -> None:
        self.path = path
        self._flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC
        self._one_record = one_record
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HeldFile({self.path!r}, fd={self._fd})"

    @property
    def held(self) -> bool:
        """True while a descriptor is open."""
        return self._fd is not None

    def read(self) -> bytes:
        """The whole file as the kernel makes it now (``pread`` from offset 0)."""
        return self._use(lambda fd: read_fd(fd, self._one_record))

    def write(self, data: bytes) -> None:
        """Write ``data`` in one ``pwrite`` at offset 0 (control files want one write)."""
        self._use(lambda fd: os.pwrite(fd, data, 0))

    def close(self) -> None:
        """Close the descriptor, if one is open."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _use(self, op: Callable[[int], T]) -> T:
        with self._lock:
            if self._fd is not None:
                try:
                    return op(self._fd)
                except OSError:
                    self._close()  # stale (a reaped process, a removed cgroup): once more
            try:
                fd = os.open(self.path, self._flags)
            except OSError as exc:
                raise OpenError(exc.errno, exc.strerror, self.path) from None
            try:
                result = op(fd)
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
            return result


def read_fd(fd: int, one_record: bool = False) -> bytes:
    """The whole kernel file open as ``fd``, read from offset 0 with ``pread`` (raises OSError).

    A seq file gives at most one buffer of whole records a read (about a
    page: ``cgroup.procs`` of a large tree, ``/proc/<pid>/maps``), so a short
    read is not the end: reads go on until one returns nothing.  With
    ``one_record``, for files the kernel makes in one piece (``single_open``:
    ``/proc/<pid>/stat``, ``cgroup.events``), a read shorter than asked is
    all of it, and one ``pread`` is enough.
    """
    chunks = []
    offset = 0
    while data := os.pread(fd, READ_SIZE, offset):
        chunks.append(data)
        offset += len(data)
        if one_record and len(data) < READ_SIZE:
            break
    return b"".join(chunks)
