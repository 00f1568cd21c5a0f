"""The processes a GPU's region has locked through the driver, as a file that outlives krexd.

Recorded before each lock, with start times, and cleared once unlocked,
so that a successor (``krexd.restarts.adopt``) or the watchdog
(``krexd.restarts.watchdog``) unlocks them if krexd dies holding a region
(docs/design/driver-lock.md).  The file's form: :class:`LockLedger`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from krexd.system.procfs import start_time

_log = logging.getLogger("krexd.lock_ledger")

#: Bytes reserved: room for about 500 processes per GPU.
SIZE = 16384


def ledger_path(gate_dir: str, cgroup_name: str, gpu: int) -> str:
    """GPU ``gpu``'s ledger file in ``gate_dir`` (named after the cgroup tree)."""
    return os.path.join(gate_dir, f"{cgroup_name}-gpu{gpu}.locks")


class LockLedger:
    """One GPU's record of driver-locked processes.

    The file, ``<gate_dir>/<cgroup name>-gpu<N>.locks``, has a fixed size
    reserved when it is made (a full file system cannot stop a later
    record): one JSON line ``{"gpu": N, "locked": [[pid, start_ticks], ...]}``
    written at offset 0 with one ``pwrite``, the rest NUL bytes.  krexd dies
    between whole writes, never inside one, so the reader sees the last
    record written; a pid reused by a new process (another start time) is
    never unlocked by mistake.

    ``path``: the file; made with its full size on first use.  A write that
    fails (the file cannot be made) is logged and the lock goes on: krexd's
    own memory still knows whom to unlock while it lives.
    """

    def __init__(self, path: str, gpu: int) -> None:
        self.path = path
        self.gpu = gpu

    def record(self, pids: Iterable[int]) -> list[tuple[int, int]]:
        """Record ``pids`` (with their start times) as locked; returns what was written.

        Pids that are gone are left out.  Call before locking them.
        """
        entries = []
        for pid in sorted(set(pids)):
            ticks = start_time(pid)
            if ticks is not None:
                entries.append((pid, ticks))
        self._write(entries)
        return entries

    def clear(self) -> None:
        """Nothing is locked any more (after the unlock)."""
        self._write([])

    def read(self) -> list[tuple[int, int]]:
        """The recorded (pid, start ticks) pairs; empty when there is no record."""
        return read_ledger(self.path)

    def live(self) -> list[int]:
        """The recorded pids that still name the process recorded (same start time)."""
        return still_same(self.read())

    def _write(self, entries: list[tuple[int, int]]) -> None:
        line = json.dumps({"gpu": self.gpu, "locked": [list(e) for e in entries]}) + "\n"
        data = line.encode()
        if len(data) > SIZE:
            _log.error("GPU %d: %d locked processes do not fit the ledger", self.gpu, len(entries))
            data = data[:0]
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            _log.error("GPU %d: cannot open lock ledger %s: %s", self.gpu, self.path, exc)
            return
        try:
            if os.fstat(fd).st_size < SIZE:
                os.posix_fallocate(fd, 0, SIZE)
            os.pwrite(fd, data + b"\0" * (SIZE - len(data)), 0)
        except OSError as exc:
            _log.error("GPU %d: cannot write lock ledger %s: %s", self.gpu, self.path, exc)
        finally:
            os.close(fd)


def read_ledger(path: str) -> list[tuple[int, int]]:
    """(pid, start ticks) pairs recorded in the ledger at ``path`` (empty if none or bad)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(SIZE).split(b"\0", 1)[0]
        locked = json.loads(raw)["locked"] if raw.strip() else []
        return [(int(p), int(t)) for p, t in locked]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def still_same(entries: Iterable[tuple[int, int]]) -> list[int]:
    """The pids of ``entries`` that still name the process recorded (same start time)."""
    return [pid for pid, ticks in entries if start_time(pid) == ticks]
