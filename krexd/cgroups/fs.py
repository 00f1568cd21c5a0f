"""Small cgroupfs helpers: read/write one control file, raising CgroupError with its path."""

from __future__ import annotations

import errno
import os

from krexd.procfs import read_file


class CgroupError(OSError):
    """A cgroupfs operation failed; the message names the file and the errno."""


def write(path: str, value: str) -> None:
    """Write ``value`` to the control file ``path`` (one ``write(2)``, as the kernel wants)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot open {path}: {exc.strerror}") from None
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise CgroupError(exc.errno, f"writing {value!r} to {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def read(path: str) -> str:
    """Contents of the control file ``path``."""
    try:
        return read_file(path).decode()
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot read {path}: {exc.strerror}") from None


def read_pids(path: str) -> list[int]:
    """Pids listed in a ``cgroup.procs``/``tasks`` file (empty when the cgroup is gone)."""
    try:
        text = read(path)
    except CgroupError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return [int(x) for x in text.split()]


def events(directory: str) -> dict[str, int]:
    """``cgroup.events`` of a v2 cgroup as a dict (``populated``, ``frozen``)."""
    out: dict[str, int] = {}
    for line in read(os.path.join(directory, "cgroup.events")).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def mkdir(path: str) -> bool:
    """Create the cgroup directory ``path``; False if it already existed."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot create cgroup {path}: {exc.strerror}") from None
    return True


def rmdir(path: str) -> None:
    """Remove the (empty) cgroup directory ``path``; a missing one is fine."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot remove cgroup {path}: {exc.strerror}") from None


def subdirs_bottom_up(root: str) -> list[str]:
    """All directories under ``root`` (inclusive), deepest first."""
    if not os.path.isdir(root):
        return []
    found = [dirpath for dirpath, _dirs, _files in os.walk(root)]
    return sorted(found, key=lambda p: p.count(os.sep), reverse=True)
