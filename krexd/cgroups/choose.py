"""Which backend a krexd's cgroup tree uses, per ``[cgroup] backend`` and the host.

``v2`` with the v2 cpuset controller, ``v2`` with ``sched_setaffinity`` in
place of cpusets, or ``hybrid`` (the v1 cpuset hierarchy beside cgroup2);
krexd/cgroups/backend.py describes each.  The base directory is ``[cgroup]
root`` when set; under systemd the unit's own cgroup, krexd moved into its
``supervisor`` leaf first (no processes in inner nodes); else the cgroup2
mount.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from krexd.cgroups import detect, fs
from krexd.cgroups.tenant import CPUSET_AFFINITY, CPUSET_V1, CPUSET_V2
from krexd.config.config import CgroupConfig, ConfigError

_log = logging.getLogger("krexd.cgroups")

SUPERVISOR_LEAF = "supervisor"


class Choice(NamedTuple):
    """The chosen backend: ``kind`` (``v2``/``hybrid``), the cgroup2 ``base``, the cpuset
    kind (tenant.CPUSET_*) and the cpuset hierarchy's base (None: affinity), ``systemd``."""

    kind: str
    base: str
    cpuset_kind: str
    cpuset_base: str | None
    systemd: bool


def choose(cfg: CgroupConfig, mounts: detect.Mounts) -> Choice:
    """Choose the backend for ``cfg`` on a host with ``mounts``.

    Under systemd with no ``[cgroup] root``, moves this process into the
    ``supervisor`` leaf of its own cgroup.  Raises ConfigError when no usable
    cgroup2 directory (or, for ``backend = hybrid``, no v1 cpuset) is found.
    """
    if mounts.v2 is None:
        raise ConfigError("[cgroup] no cgroup2 mount found; krexd needs cgroup v2 (freezer)")
    systemd = detect.under_systemd() and not cfg.root
    if cfg.root:
        base = cfg.root
    elif systemd:
        own = os.path.join(mounts.v2, detect.own_v2_cgroup().lstrip("/"))
        leaf = os.path.join(own, SUPERVISOR_LEAF)
        fs.mkdir(leaf)
        fs.write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
        base = own
    else:
        base = mounts.v2
    if not os.path.isfile(os.path.join(base, "cgroup.procs")):
        raise ConfigError(f"[cgroup] root {base} is not a cgroup2 directory")
    controllers = fs.read(os.path.join(base, "cgroup.controllers")).split()
    want = cfg.backend
    if want == "hybrid" or (want == "auto" and "cpuset" not in controllers):
        cpuset_base = cfg.cpuset_root or mounts.v1_cpuset
        # A v1 cpuset tree mounted read-only (systemd-nspawn on a hybrid host
        # does that) cannot hold slices: in auto mode use affinity instead.
        read_only = (
            cpuset_base is not None
            and os.path.isdir(cpuset_base)
            and not os.access(cpuset_base, os.W_OK)
        )
        if cpuset_base is not None and (want == "hybrid" or not read_only):
            return Choice("hybrid", base, CPUSET_V1, cpuset_base, systemd)
        if want == "hybrid":
            raise ConfigError("[cgroup] backend = hybrid but no v1 cpuset hierarchy found")
        _log.warning("no cpuset controller: CPU slices use sched_setaffinity")
        return Choice("v2", base, CPUSET_AFFINITY, None, systemd)
    if "cpuset" not in controllers:
        _log.warning("cpuset not available in %s: CPU slices use sched_setaffinity", base)
        return Choice("v2", base, CPUSET_AFFINITY, None, systemd)
    return Choice("v2", base, CPUSET_V2, base, systemd)
