"""Find the cgroup hierarchies of this host: pure v2, or hybrid (v2 + v1 cpuset).

``/proc/self/mountinfo`` tells where cgroup2 and the v1 ``cpuset`` controller
are mounted.  Pure v2: cgroup2 holds ``cpuset`` in ``cgroup.controllers`` of
the chosen root.  Hybrid: cgroup2 is mounted (freezer: ``cgroup.freeze``) and
the v1 cpuset hierarchy is separate.  Only the ownership of the mount point
decides; no unit or slice names are guessed (systemd CGROUP_DELEGATION.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Mounts:
    """Mount points: ``v2`` (cgroup2), ``v1_cpuset``, ``v1_pids`` and ``v1_memory`` (v1),
    ``None`` when absent."""

    v2: str | None
    v1_cpuset: str | None
    v1_pids: str | None = None
    v1_memory: str | None = None


def find_mounts(mountinfo: str = "/proc/self/mountinfo") -> Mounts:
    """Parse ``mountinfo`` (see proc(5)) for the cgroup2 and v1 cpuset, pids and memory mounts."""
    v2: str | None = None
    cpuset: str | None = None
    pids: str | None = None
    memory: str | None = None
    with open(mountinfo) as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            rest = right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            mount_point = fields[4].replace("\\040", " ")
            fstype, options = rest[0], rest[2].split(",")
            if fstype == "cgroup2" and v2 is None:
                v2 = mount_point
            elif fstype == "cgroup" and "cpuset" in options and cpuset is None:
                cpuset = mount_point
            elif fstype == "cgroup" and "pids" in options and pids is None:
                pids = mount_point
            elif fstype == "cgroup" and "memory" in options and memory is None:
                memory = mount_point
    return Mounts(v2, cpuset, pids, memory)


def own_v2_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's cgroup2 path relative to the mount (the ``0::`` line), e.g. ``/x.service``."""
    with open(proc_cgroup) as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


def own_v1_cgroup(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str:
    """This process's cgroup in the v1 hierarchy of ``controller``, e.g. ``/user.slice``."""
    with open(proc_cgroup) as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3 and controller in parts[1].split(","):
                return parts[2] or "/"
    return "/"


def under_systemd() -> bool:
    """True when a systemd service manager started us (``INVOCATION_ID`` is set by systemd)."""
    return bool(os.environ.get("INVOCATION_ID"))
