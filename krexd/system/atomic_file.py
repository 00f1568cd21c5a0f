"""Replace a file in the state directory atomically, so that a crash leaves the old or the new one.

Used by every part that keeps state across krexd restarts (each under its
own file name in ``[daemon] state_dir``).  The sequence is the usual one
for durable replacement on POSIX file systems: write a temporary file in the
same directory, ``fsync`` it, ``rename`` it over the target (atomic within a
file system), then ``fsync`` the directory so that the rename itself
survives a power loss.
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (bytes) atomically and durably.

    ``mode``: permission bits of the new file.  Raises ``OSError`` when the
    directory is not writable or the disk is full; ``path`` is then left as
    it was and no temporary file remains.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
