"""Small cgroupfs helpers: read/write one control file, raising CgroupError with its path.

A control file is named by its path (opened and closed each time) or is a
``krexd.system.heldfiles.HeldFile`` kept open between uses (the files region entry
uses for every sibling: ``krexd.cgroups.tenant``); either way a failure
raises the same CgroupError, with the same message.
"""

from __future__ import annotations

import errno
import os

from krexd.system.heldfiles import HeldFile, OpenError
from krexd.system.procfs import read_file

#: A control file: its path, or the file held open.
Target = str | HeldFile


class CgroupError(OSError):
    """A cgroupfs operation failed; the message names the file and the errno."""


def write(target: Target, value: str) -> None:
    """Write ``value`` to the control file ``target`` (one ``write(2)``, as the kernel wants)."""
    f = HeldFile(target, write=True) if isinstance(target, str) else target
    try:
        f.write(value.encode())
    except OpenError as exc:
        raise CgroupError(exc.errno, f"cannot open {f.path}: {exc.strerror}") from None
    except OSError as exc:
        raise CgroupError(exc.errno, f"writing {value!r} to {f.path}: {exc.strerror}") from None
    finally:
        if f is not target:
            f.close()  # a path: opened for this write only


def read(target: Target) -> str:
    """Contents of the control file ``target``."""
    try:
        if isinstance(target, HeldFile):
            return target.read().decode()
        return read_file(target).decode()
    except OSError as exc:
        path = target.path if isinstance(target, HeldFile) else target
        raise CgroupError(exc.errno, f"cannot read {path}: {exc.strerror}") from None


def read_pids(target: Target) -> list[int]:
    """Pids listed in a ``cgroup.procs``/``tasks`` file (empty when the cgroup is gone)."""
    try:
        text = read(target)
    except CgroupError as exc:
        if exc.errno == errno.ENOENT:
            return []
        raise
    return [int(x) for x in text.split()]


def events(source: Target) -> dict[str, int]:
    """``cgroup.events`` of a v2 cgroup as a dict (``populated``, ``frozen``).

    ``source``: the cgroup's directory, or its ``cgroup.events`` held open.
    """
    f = os.path.join(source, "cgroup.events") if isinstance(source, str) else source
    out: dict[str, int] = {}
    for line in read(f).splitlines():
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
