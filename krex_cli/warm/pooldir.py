"""Where a user's pools live: a private directory, and the files of one pool key in it.

The rendezvous must be a directory no other user can create first, replace
or redirect: the first usable candidate (:func:`directory`), each refused
one reported in one line.  The candidates and a key's files:
docs/design/warm.md "Files of a user's pools"; why: docs/design/security.md
"8. Warm pools".
"""

from __future__ import annotations

import errno
import fcntl
import os
import pwd
import stat
from collections.abc import Callable, Mapping
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


def directory(
    environ: dict[str, str] | None = None, note: Callable[[str], None] | None = None
) -> str:
    """This user's pool directory, created if needed: the first usable :func:`candidates`.

    A candidate is usable when its parent is one only the user or root can
    change (:func:`_parent_problem`) and the directory itself, created mode
    0700 when missing, is a real directory (never a symbolic link), owned by
    the user, with no permission for group or others, short enough for a
    socket path in it.  ``note`` gets one line per candidate refused (why);
    PoolDirError when none is usable, naming each candidate's reason.
    """
    env = os.environ if environ is None else environ
    uid = os.getuid()
    reasons: list[str] = []
    for path in candidates(env, uid):
        why = _problem(path, uid)
        if why is None:
            return path
        reasons.append(why)
        if note is not None:
            note(f"pool directory refused: {why}")
    raise PoolDirError("; ".join(reasons) or "no candidate pool directory")


def candidates(env: Mapping[str, str], uid: int) -> list[str]:
    """The pool directories to try for ``uid``, in order (warm.md "Files of a user's pools")."""
    out: list[str] = []
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime):
        out.append(os.path.join(runtime, "krex"))
    if os.path.isdir(f"/run/user/{uid}"):
        out.append(f"/run/user/{uid}/krex")
    cache = env.get("XDG_CACHE_HOME", "")
    home = env.get("HOME", "") or _home(uid)
    if os.path.isabs(cache):
        out.append(os.path.join(cache, "krex-pool"))
    elif os.path.isabs(home):
        out.append(os.path.join(home, ".cache", "krex-pool"))
    tmp = env.get("TMPDIR", "")
    out.append(os.path.join(tmp if os.path.isabs(tmp) else "/tmp", f"krex-pool-{uid}"))
    return list(dict.fromkeys(os.path.normpath(p) for p in out))


def _home(uid: int) -> str:
    """``uid``'s home directory from the password database ("" when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return ""


def _problem(path: str, uid: int) -> str | None:
    """Why ``path`` cannot be ``uid``'s pool directory (None: it can, and now exists)."""
    parent = os.path.dirname(path)
    why = _parent_problem(parent, uid)
    if why is not None:
        return f"{path}: {why}"
    if parent.endswith("/.cache"):
        try:
            os.mkdir(parent, 0o700)  # a home without one yet
        except OSError:
            pass
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link, not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):o}, not 0700"
    if len(os.fsencode(path)) + len("/0123456789abcdef01234567.sock") > MAX_SOCKET_PATH:
        return f"{path} is too long for a Unix socket path in it"
    return None


def _parent_problem(parent: str, uid: int) -> str | None:
    """Why another user could replace ``parent`` or an entry of it (None: nobody can).

    Every directory from ``/`` down to ``parent``, both as written and with
    its symbolic links resolved, and every symbolic link on the way, must
    be owned by ``uid`` or root; a directory may be writable by group or
    others only when root's and sticky (``/tmp``: nobody else can rename or
    remove the user's entry there).  None also when ``parent`` does not
    exist yet but its own parent is sound (a home's ``.cache`` made on
    first use).
    """
    for chain, follow in ((os.path.normpath(parent), False), (os.path.realpath(parent), True)):
        path = "/"
        for part in [p for p in chain.split("/") if p]:
            path = os.path.join(path, part)
            try:
                st = os.stat(path) if follow else os.lstat(path)
            except FileNotFoundError:
                return None if path == chain else f"{path} does not exist"
            except OSError as exc:
                return f"{path}: {exc.strerror}"
            if st.st_uid not in (0, uid):
                return f"{path} belongs to uid {st.st_uid}"
            shared = st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode)
            if shared and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
                return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None
