"""What a restarted krexd adopts, saved: the tenants, the GPUs' regions and gates.

:class:`StateKeeper` writes ``krexd.state``'s file whenever what it holds
changed (after each op, before its reply, and every second); krexd/adopt.py
reads it back after a restart.  A full stop removes it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from krexd import state as saved_state
from krexd import states
from krexd.gpu import Gpu
from krexd.tenants import TenantRegistry

_log = logging.getLogger("krexd.adopt")


def _fields(record: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict (``dataclasses.asdict`` without its deep copy).

    Every region entry and exit saves the state before its reply: this runs then.
    """
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


class StateKeeper:
    """Saves what adoption needs whenever it changed (after each op, and every second).

    Args:
        path: the state file (``krexd.state.path_for``).
        cgroup_root: the tree the state describes.
        registry: the live tenants.
        gpus: the GPUs (coordinator epochs and regions, gate paths).
    """

    def __init__(
        self, path: str, cgroup_root: str, registry: TenantRegistry, gpus: Mapping[int, Gpu]
    ) -> None:
        self.path = path
        self._root = cgroup_root
        self._registry = registry
        self._gpus = gpus
        self._starts: dict[int, int] = {}  # launcher start time read here, by tenant id
        self._last: dict[str, Any] | None = None
        self._file = saved_state.StateFile(path)
        self.enabled = True
        self.writes = 0

    def snapshot(self) -> dict[str, Any]:
        """The state as it is now (without the write time)."""
        tenants = []
        live = set()
        for t in self._registry:
            if t.state == states.EXITED:
                continue
            live.add(t.id)
            start = t.launcher_start or self._starts.get(t.id)  # verified at admit
            if start is None:
                start = saved_state.process_start(t.launcher_pid) or 0
                self._starts[t.id] = start
            tenants.append(
                {
                    "id": t.id,
                    "token": t.token,
                    "gpu": t.gpu,
                    "argv": t.argv,
                    "launcher_pid": t.launcher_pid,
                    "launcher_start": start,
                    "uid": t.uid,
                    "gid": t.gid,
                    "exclusive": t.exclusive,
                    "without_mps": t.without_mps,
                    "pids": sorted(t.pids),
                    "state": t.state,
                    "kill_reason": t.kill_reason,
                    "slots_fd": t.slots_fd if t.slots_attached else None,
                    "cgroup": {
                        "freezer": t.cgroup.freezer_dir,
                        "cpuset": t.cgroup.cpuset_dir,
                        "kind": t.cgroup.cpuset_kind,
                        "cores": list(t.cgroup.cores),
                    },
                    "memory": _fields(t.memory),
                }
            )
        for tid in set(self._starts) - live:
            del self._starts[tid]
        return {
            "cgroup_root": self._root,
            "pid": os.getpid(),
            "next_tenant_id": self._registry.next_id,
            "gpus": {
                str(i): {**g.coordinator.saved(), "gate": g.gate_path}
                for i, g in self._gpus.items()
            },
            "tenants": tenants,
        }

    def save(self) -> None:
        """Write the state if it changed since the last write (never raises)."""
        if not self.enabled:
            return
        doc = self.snapshot()
        if doc == self._last:  # plain values only: a deep comparison, no encoding
            return
        try:
            self._file.write({**doc, "saved_at": time.time()})
        except (OSError, TypeError, ValueError) as exc:
            _log.error("cannot save state to %s: %s", self.path, exc)
            return
        self._last = doc
        self.writes += 1

    def remove(self) -> None:
        """Delete the state (a full stop: nothing is left to adopt) and stop saving."""
        self.enabled = False
        self._file.close()
        saved_state.remove(self.path)
