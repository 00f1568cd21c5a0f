"""A tenant's slot memory, created by its launcher (docs/design/shim.md "Who writes what").

A memfd of the size and first bytes krexd's ``admit`` reply gives, its
space reserved and sealed against shrinking, growing and sealing before
anyone maps it (:func:`create`); inherited by the command (``KREX_SLOTS_FD``,
``KREX_SLOTS``: :func:`environ`).  Knows nothing of the layout.
"""

from __future__ import annotations

import fcntl
import os

#: The seals krexd requires (``krex_gate.h``).
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def create(size: int, header: bytes) -> int:
    """A sealed memfd of ``size`` bytes starting with ``header``; its fd (inheritable).

    Raises OSError (ENOSPC / ENOMEM when the space cannot be reserved) or
    ValueError for a header longer than ``size``.
    """
    if not 0 < len(header) <= size:
        raise ValueError(f"slot memory header of {len(header)} bytes for a size of {size}")
    fd = os.memfd_create("krex-slots", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, header, 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        os.set_inheritable(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def environ(fd: int, pid: int | None = None) -> dict[str, str]:
    """The command's variables naming the slot memory ``fd`` of launcher ``pid`` (default: us)."""
    return {
        "KREX_SLOTS_FD": str(fd),
        "KREX_SLOTS": f"/proc/{pid if pid is not None else os.getpid()}/fd/{fd}",
    }
