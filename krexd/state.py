"""krexd's saved state: what a restarted krexd needs to adopt the tenants of the one before.

One file per cgroup tree, ``<state_dir>/<cgroup name>.state`` (JSON), written
atomically (write a temporary file beside it, ``fsync``, ``rename`` over the
old one, ``fsync`` the directory), so a krexd killed at any instruction leaves
either the previous state or the new one, never a mix.  Layout::

    {"format": "krexd-state", "version": 1,
     "cgroup_root": str,            # the tree it describes (a foreign state is refused)
     "pid": int, "saved_at": float, # the krexd that wrote it; wall-clock s
     "next_tenant_id": int,
     "gpus": {"<index>": {"epoch": int, "gate": str|null,
                          "region": {"tenant", "epoch", "pid", "tid", "siblings": [int],
                                     "thread_cpus": [int] | null} | null,
                          "exited": {"<tenant>": epoch}}},
     "tenants": [{"id", "token", "gpu", "argv", "launcher_pid", "launcher_start",
                  "uid", "gid", "exclusive", "pids": [int], "state", "kill_reason",
                  "slots_fd": int | null,
                  "cgroup": {"freezer", "cpuset", "kind", "cores": [int]},
                  "memory": {TenantMemory fields}}]}

``launcher_start`` is the launcher's start time (``/proc/<pid>/stat`` field
22, clock ticks since boot): with the pid it names the process, so a pid
reused by another process is never adopted as a launcher; with ``uid`` and
``gid`` it is the verified launcher of ``krexd.identity``, so an adopted
tenant's ``place`` and tenant ops are checked as before the restart.
``slots_fd`` is the launcher's fd of the tenant's slot memory (the sealed
memfd krexd attached to the gate at ``place``; null before that or without a
gate): a restarted krexd opens it again as ``/proc/<launcher>/fd/<slots_fd>``
and attaches it to the gate it re-opens, and continues the GPU's ``epoch``
so that no epoch repeats (krexd audits acknowledgements against it).
``memory`` carries the label and the declared and learned needs, so an
adopted tenant is charged and teaches its label as before.

:func:`load` refuses (:class:`StateRefused`, with the reason) a file that is
not JSON or not this format (corrupt), describes another cgroup tree
(foreign) or has a newer ``version``; krexd then falls back to the safe
cleanup of an unknown tree (thaw, kill, start empty).
"""

from __future__ import annotations

import json
import os
from typing import Any

FORMAT = "krexd-state"
VERSION = 1
MAX_BYTES = 16 << 20  # a state larger than this is not one krexd wrote


class StateRefused(Exception):
    """The saved state cannot be adopted; the message says why (corrupt, foreign, newer)."""


def path_for(state_dir: str, cgroup_name: str) -> str:
    """The state file of the cgroup tree named ``cgroup_name`` under ``state_dir``."""
    return os.path.join(state_dir, f"{cgroup_name}.state")


def write(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` (format and version added) atomically to ``path``, mode 0600.

    Raises OSError when the directory is not writable or the disk is full;
    the previous file is then left as it was.
    """
    doc = {"format": FORMAT, "version": VERSION, **doc}
    data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load(path: str, cgroup_root: str) -> dict[str, Any] | None:
    """The state saved at ``path`` for the tree ``cgroup_root``; None when there is none.

    Raises:
        StateRefused: corrupt (unreadable, not JSON, wrong shape), foreign
            (another tree or format) or newer (``version`` > :data:`VERSION`).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateRefused(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise StateRefused(f"{path}: corrupt: larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateRefused(f"{path}: corrupt: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StateRefused(f"{path}: foreign: not a krexd state file")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise StateRefused(f"{path}: corrupt: bad version {version!r}")
    if version > VERSION:
        raise StateRefused(
            f"{path}: newer: state version {version}, this krexd reads up to {VERSION}"
        )
    if doc.get("cgroup_root") != cgroup_root:
        raise StateRefused(
            f"{path}: foreign: it describes cgroup tree {doc.get('cgroup_root')!r}, "
            f"not {cgroup_root!r}"
        )
    _check_shape(path, doc)
    return doc


def _check_shape(path: str, doc: dict[str, Any]) -> None:
    """Raise StateRefused unless every field adoption reads has the right type."""
    try:
        if not isinstance(doc["next_tenant_id"], int):
            raise TypeError("next_tenant_id")
        for key, g in doc["gpus"].items():
            int(key)
            if not isinstance(g["epoch"], int):
                raise TypeError("epoch")
            r = g.get("region")
            if r is not None and not all(
                isinstance(r[k], int) for k in ("tenant", "epoch", "pid", "tid")
            ):
                raise TypeError("region")
        for t in doc["tenants"]:
            for k in ("id", "gpu", "launcher_pid", "launcher_start", "uid", "gid"):
                if not isinstance(t[k], int):
                    raise TypeError(k)
            if not isinstance(t.get("slots_fd"), (int, type(None))):
                raise TypeError("slots_fd")
            if not isinstance(t["token"], str) or not isinstance(t["cgroup"]["freezer"], str):
                raise TypeError("token/cgroup")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateRefused(f"{path}: corrupt: missing or bad field ({exc})") from None


def remove(path: str) -> None:
    """Delete the state file (after a full stop: nothing is left to adopt)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks since boot), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])
