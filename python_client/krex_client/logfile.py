"""Appending one line to a log file another user may have prepared: links, FIFOs, locks.

The region log and ``krex run --grant-log`` are paths a user names, often
in ``/tmp``, and ``krex run`` may run as root: :func:`append_line` follows
no symbolic link, opens no FIFO nor device, creates the file mode 0600 and
takes the shared file's ``flock`` without blocking for long.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

LOCK_TRIES = 20
LOCK_WAIT_S = 0.005  # between tries: at most ~0.1 s in all
MODE = 0o600


class LogFileError(OSError):
    """The log cannot be written; the message names the path and the reason."""


def append_line(path: str, data: bytes) -> bool:
    """Append ``data`` (one line, bytes) to ``path`` in one ``write(2)``.

    Returns True when the write held the file's lock, False when another
    process held it for the whole bounded wait (written anyway).
    Raises LogFileError for a symbolic link, a FIFO or another non-regular
    file, or any error opening or writing.

    Opened with ``O_NOFOLLOW`` (root never appends to a file another user
    pointed it at) and ``O_NONBLOCK`` (a FIFO never waits for a reader), then
    checked to be a regular file; created mode 0600 (the records are the
    user's own).  The exclusive ``flock`` several processes of one command
    share is tried :data:`LOCK_TRIES` times :data:`LOCK_WAIT_S` apart, then
    the line is written anyway (one ``write(2)`` to a file opened
    ``O_APPEND`` is atomic on a local file system), so another user holding
    the lock cannot hang the command.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LogFileError(exc.errno, f"{path} is a symbolic link: not followed") from None
        if exc.errno == errno.ENXIO:
            raise LogFileError(exc.errno, f"{path} is not a regular file") from None
        raise LogFileError(exc.errno, f"{path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogFileError(errno.EINVAL, f"{path} is not a regular file")
        locked = _try_lock(fd)
        try:
            os.write(fd, data)
        except OSError as exc:
            raise LogFileError(exc.errno, f"{path}: {exc.strerror}") from None
        return locked
    finally:
        os.close(fd)  # releases the lock


def _try_lock(fd: int) -> bool:
    """Take ``fd``'s exclusive flock within LOCK_TRIES non-blocking tries; False if not."""
    for i in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < LOCK_TRIES:
                time.sleep(LOCK_WAIT_S)
        except OSError:
            return False  # a file system without flock: the append alone
    return False
