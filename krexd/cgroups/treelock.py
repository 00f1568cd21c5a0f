"""The claim of one krexd on its cgroup tree: an flock on a file named after the tree.

Without it, a second krexd with the same ``[cgroup] name`` would take the
first one's live tree for a stale one and kill its tenants.  The lock file
is ``/run/lock/krex-cgroup<root, "/" as "_">.lock`` (the temporary
directory without ``/run/lock``) and holds the claiming krexd's pid; the
flock lasts until the descriptor is closed or the process exits, so a
crashed krexd leaves no claim behind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile

from krexd.cgroups.fs import CgroupError


def claim(root: str) -> int:
    """Claim the tree at ``root``; returns the lock's descriptor (close it to release).

    Raises CgroupError (EBUSY) naming the holder's pid when a live krexd has it.
    """
    lock_dir = "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    path = os.path.join(lock_dir, "krex-cgroup" + root.replace("/", "_") + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise CgroupError(
            errno.EBUSY,
            f"cgroup tree {root} is in use by another krexd (pid {holder}); "
            "give this one another [cgroup] name",
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
