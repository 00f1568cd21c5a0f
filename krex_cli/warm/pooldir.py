"""Where a user's pools live: a private directory, and the files of one pool key in it.

``$XDG_RUNTIME_DIR/krex`` when ``XDG_RUNTIME_DIR`` is an absolute path,
else ``/tmp/krex-pool-<uid>``.  The directory must be a real directory
(not a symbolic link) owned by this uid with no permission for group or
others; ``krex run`` creates it so (mode 0700) and refuses a pool there
otherwise (another user could have created ``/tmp/krex-pool-<uid>`` first
to catch the requests; docs/design/warm.md).

Files of pool key ``K``: ``K.sock`` (the zygote's socket), ``K.lock``
(held by the pool's keeper while it lives), ``K.log`` (the keeper's and
the zygote's log), ``K.refused`` (why the last pool for this key refused to
serve; no new pool is started for it while it is younger than the idle
lifetime), ``K.start-<pid>.json`` (the settings ``krex run`` hands a new
keeper; removed by the keeper).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from dataclasses import dataclass

#: Longest Unix socket path (bytes; sockaddr_un's 108 with the terminating NUL).
MAX_SOCKET_PATH = 107


class PoolDirError(Exception):
    """The pool directory cannot be used (the message says why)."""


@dataclass(frozen=True)
class PoolFiles:
    """The files of pool key ``key`` in directory ``directory``."""

    directory: str
    key: str

    def path(self, suffix: str) -> str:
        """``<directory>/<key><suffix>``."""
        return os.path.join(self.directory, self.key + suffix)

    @property
    def socket(self) -> str:
        """The zygote's socket."""
        return self.path(".sock")

    @property
    def lock(self) -> str:
        """The keeper's lock file."""
        return self.path(".lock")

    @property
    def log(self) -> str:
        """The pool's log."""
        return self.path(".log")

    @property
    def refused(self) -> str:
        """Why the last pool of this key refused to serve."""
        return self.path(".refused")

    def keeper_alive(self) -> bool:
        """True while a keeper holds the lock (the pool is starting or serving)."""
        try:
            fd = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        finally:
            os.close(fd)  # also drops a lock taken just now
        return False


def directory(environ: dict[str, str] | None = None) -> str:
    """This user's pool directory, created if needed; PoolDirError when it is not private."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_RUNTIME_DIR", "")
    uid = os.getuid()
    path = os.path.join(base, "krex") if os.path.isabs(base) else f"/tmp/krex-pool-{uid}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PoolDirError(f"cannot create {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise PoolDirError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PoolDirError(f"{path} is not a directory")
    if st.st_uid != uid:
        raise PoolDirError(f"{path} belongs to uid {st.st_uid}, not {uid}")
    if st.st_mode & 0o077:
        raise PoolDirError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, not 0700")
    if len(os.fsencode(path)) + len("/0123456789abcdef01234567.sock") > MAX_SOCKET_PATH:
        raise PoolDirError(f"{path} is too long for a Unix socket path in it")
    return path
