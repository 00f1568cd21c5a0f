"""Compile work shared per user: persistent Inductor, Triton and CUDA JIT caches for ``krex run``.

Unless the user's environment names them, every command of one user gets
the same cache directories, created by the user's own process without
following symbolic links (:func:`ensure`, :class:`Refused`), and trimmed to
``[cache] max_bytes`` after it ends (:func:`trim`).  Whose, concurrent
writers, size: docs/design/warm.md "Compile caches: compile work shared per
user".
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: The variables set, and the subdirectory each names.
VARS = (
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("TRITON_CACHE_DIR", "triton"),
    ("CUDA_CACHE_PATH", "cuda"),
)
DEFAULT_MAX_BYTES = 10 << 30
#: The trim's stamp file (its mtime: the last trim) in the user's directory.
STAMP = ".krex-trim"
TRIM_EVERY_S = 60.0
TRIM_BOUND_S = 2.0
#: Entries written more recently than this are never trimmed (a command may be reading them).
TRIM_MIN_AGE_S = 300.0


class Refused(Exception):
    """The cache directory cannot be used safely; the message is one line."""


@dataclass(frozen=True)
class Settings:
    """krexd's ``[cache]``, as ``ping`` reports it: ``enabled``, ``root`` ("" = the user's
    XDG cache), ``max_bytes`` (0 = no trim)."""

    enabled: bool = True
    root: str = ""
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_ping(cls, about: Mapping[str, Any]) -> Settings:
        """The settings in a ``ping`` reply (the defaults when krexd does not say)."""
        cache = about.get("cache")
        if not isinstance(cache, dict):
            return cls()
        return cls(
            enabled=bool(cache.get("enabled", True)),
            root=str(cache.get("dir") or ""),
            max_bytes=int(cache.get("max_bytes") or 0),
        )


def location(settings: Settings, env: Mapping[str, str], uid: int) -> tuple[str, list[str]]:
    """``(base, parts)``: the user's cache directory is ``base`` joined with ``parts``.

    ``base`` is the root the user or the administrator named (trusted as is,
    symbolic links included); ``parts`` are the components krex creates.
    Raises :class:`Refused` when there is no home to put it in.
    """
    if settings.root:
        return settings.root, [str(uid)]
    xdg = env.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return xdg, ["krex", "compile"]
    home = env.get("HOME", "")
    if not os.path.isabs(home):
        raise Refused("no absolute HOME or XDG_CACHE_HOME")
    # Under the home, which must exist: krex never makes a user's home (nor /nonexistent).
    return home, [".cache", "krex", "compile"]


def _open_base(base: str, uid: int, create: bool) -> int:
    """An fd of the root ``base``; refused when others could rename entries in it.

    ``create``: make ``base`` itself (one level, 0700) when missing, as the XDG
    cache directory is; its parent must exist.
    """
    if create:
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st = os.fstat(fd)
    owners = (0, uid, os.geteuid())
    if st.st_uid not in owners or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        os.close(fd)
        raise Refused(
            f"{base}: owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}: "
            "other users could replace what krex creates there"
        )
    return fd


def _step(parent: int, name: str, shown: str, uid: int) -> int:
    """Create (0700) or open ``name`` under the fd ``parent`` without following a link."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
        )
    except OSError as exc:
        raise Refused(f"{shown}: not a directory krex may use ({exc.strerror})") from None
    st = os.fstat(fd)
    if st.st_uid != uid:
        os.close(fd)
        raise Refused(f"{shown}: owned by uid {st.st_uid}, not by this user ({uid})")
    return fd


def ensure(settings: Settings, env: Mapping[str, str], uid: int | None = None) -> str:
    """Create (or check) the user's cache directory and its subdirectories; its path.

    ``uid``: the user (default: this process's).  The last directory is made
    mode 0700 when it is the user's.  Raises :class:`Refused` (one line) on a
    symbolic link, another owner, an unsafe root or an error of the system.
    """
    uid = os.getuid() if uid is None else uid
    base, parts = location(settings, env, uid)
    try:
        fd = _open_base(base, uid, create=not settings.root and parts[0] != ".cache")
    except OSError as exc:
        raise Refused(f"{base}: {exc.strerror}") from None
    path = base
    try:
        for name in parts:
            path = os.path.join(path, name)
            child = _step(fd, name, path, uid)
            os.close(fd)
            fd = child
        os.fchmod(fd, 0o700)  # the user's own: private, whatever it was
        for _, sub in VARS:
            os.close(_step(fd, sub, os.path.join(path, sub), uid))
    except OSError as exc:
        raise Refused(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return path


def environ(settings: Settings, env: Mapping[str, str], uid: int | None = None) -> dict[str, str]:
    """The variables to add to a command's environment ``env`` (those it does not set).

    Empty when disabled or when every variable is set already.  Raises
    :class:`Refused` when the directory cannot be used.
    """
    missing = [(var, sub) for var, sub in VARS if var not in env]
    if not settings.enabled or not missing:
        return {}
    path = ensure(settings, env, uid)
    return {var: os.path.join(path, sub) for var, sub in missing}


@dataclass
class Trimmed:
    """What :func:`trim` did: bytes found and freed, directories emptied, whether it finished."""

    total: int = 0
    freed: int = 0
    removed: int = 0
    complete: bool = True


def _entries(root: str, deadline: float) -> list[tuple[float, str, list[str], int]] | None:
    """``(mtime, dir, files, bytes)`` of every directory under ``root`` holding files
    (links not followed); None when the deadline passed first."""
    out: list[tuple[float, str, list[str], int]] = []
    stack = [root]
    while stack:
        if time.monotonic() > deadline:
            return None
        here = stack.pop()
        files: list[str] = []
        size = 0
        try:
            mtime = os.lstat(here).st_mtime
            with os.scandir(here) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif here != root or e.name != STAMP:
                        files.append(e.path)
                        size += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # removed meanwhile (another trim, the tools' own clean-up)
        if files:
            out.append((mtime, here, files, size))
    return out


def trim(
    root: str, max_bytes: int, bound_s: float = TRIM_BOUND_S, min_age_s: float = TRIM_MIN_AGE_S
) -> Trimmed:
    """Trim the cache directory ``root`` to ``max_bytes`` (bytes), oldest directories first.

    Each directory holding files is one entry, aged by its mtime (a new file
    renamed in refreshes it); an entry's files are removed together, then the
    directory when empty.  Entries newer than ``min_age_s`` seconds stay.
    Gives up (``complete`` False) after ``bound_s`` seconds.
    """
    deadline = time.monotonic() + bound_s
    found = _entries(root, deadline)
    if found is None:
        return Trimmed(complete=False)
    done = Trimmed(total=sum(e[3] for e in found))
    newest_allowed = time.time() - min_age_s
    for mtime, here, files, size in sorted(found):
        if done.total - done.freed <= max_bytes or mtime > newest_allowed:
            break
        if time.monotonic() > deadline:
            done.complete = False
            break
        for f in files:
            try:
                os.unlink(f)
            except OSError:
                pass
        done.freed += size
        done.removed += 1
        try:
            os.rmdir(here)
        except OSError:
            pass  # not empty (a file renamed in meanwhile), or the root
    return done


def trim_if_due(path: str, max_bytes: int, every_s: float = TRIM_EVERY_S) -> Trimmed | None:
    """:func:`trim` ``path`` when its last trim (the stamp's mtime) is ``every_s`` old.

    None when not due, disabled (``max_bytes`` 0) or the stamp cannot be written.
    """
    if max_bytes <= 0:
        return None
    stamp = os.path.join(path, STAMP)
    try:
        if time.time() - os.lstat(stamp).st_mtime < every_s:
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.utime(fd)
        os.close(fd)
    except OSError:
        return None
    return trim(path, max_bytes)


@dataclass(frozen=True)
class Prepared:
    """What ``krex run`` gives its commands: ``env`` to add, the directory it manages
    (None: none), and its trim bound (bytes)."""

    env: dict[str, str]
    path: str | None = None
    max_bytes: int = 0

    def trim(self) -> Trimmed | None:
        """:func:`trim_if_due` the managed directory (None when none or not due)."""
        return trim_if_due(self.path, self.max_bytes) if self.path else None


def prepare(
    about: Mapping[str, Any], env: Mapping[str, str], say: Callable[[str], None]
) -> Prepared:
    """``krex run``'s compile caches for krexd's ``ping`` reply ``about`` and its ``env``.

    A refused directory is reported through ``say`` (one line) and gives no
    variables: the command runs with the tools' own caches.
    """
    settings = Settings.from_ping(about)
    try:
        added = environ(settings, env)
    except Refused as exc:
        say(f"compile cache: {exc}; the command runs without krex's shared cache")
        return Prepared({})
    if not added:
        return Prepared({})
    path = os.path.dirname(next(iter(added.values())))
    return Prepared(added, path, settings.max_bytes)
