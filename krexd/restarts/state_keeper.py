"""What a restarted krexd adopts, saved: the tenants, the GPUs' regions and gates.

:class:`StateKeeper` writes ``krexd.restarts.saved_state``'s file whenever what it holds
changed (after each op, before its reply, and every second); krexd/restarts/adopt.py
reads it back after a restart.  A full stop removes it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from krexd.orchestration.gpu import Gpu
from krexd.restarts import saved_state
from krexd.restarts.state_fragments import TenantFragments, dynamic_record, static_record
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant, TenantRegistry

_log = logging.getLogger("krexd.adopt")


class StateKeeper:
    """Saves what adoption needs whenever it changed (after each op, and every second).

    Args:
        path: the state file (``krexd.restarts.saved_state.path_for``).
        cgroup_root: the tree the state describes.
        registry: the live tenants.
        gpus: the GPUs (coordinator epochs and regions, gate paths).
        restarts: restarts this krexd continues from (``krexd.restarts.counters``): saved, so the
            next krexd counts on from it.
    """

    def __init__(
        self,
        path: str,
        cgroup_root: str,
        registry: TenantRegistry,
        gpus: Mapping[int, Gpu],
        restarts: int = 0,
    ) -> None:
        self.path = path
        self._root = cgroup_root
        self._registry = registry
        self._gpus = gpus
        self._starts: dict[int, int] = {}  # launcher start time read here, by tenant id
        self._fragments = TenantFragments()
        self._last: bytes | None = None  # the members last written (without saved_at)
        self._file = saved_state.StateFile(path)
        self.enabled = True
        self.writes = 0
        self.failing = False  # the last save failed (logged once until one succeeds)
        self.restarts = (
            restarts  # saved: the next krexd counts on from it (krexd.restarts.counters)
        )

    def _live(self) -> list[tuple[Tenant, int]]:
        """The tenants to save, each with its verified launcher start time."""
        live = []
        for t in self._registry:
            if t.state == states.EXITED:
                continue
            start = t.launcher_start or self._starts.get(t.id)  # verified at admit
            if start is None:
                start = saved_state.process_start(t.launcher_pid) or 0
                self._starts[t.id] = start
            live.append((t, start))
        if self._starts:
            for tid in self._starts.keys() - {t.id for t, _ in live}:
                del self._starts[tid]
        return live

    def _header(self) -> dict[str, Any]:
        return {
            "cgroup_root": self._root,
            "pid": os.getpid(),
            "next_tenant_id": self._registry.next_id,
            "restarts": self.restarts,
            "gpus": {
                str(i): {**g.coordinator.saved(), "gate": g.gate_path, "uuid": g.info.uuid}
                for i, g in self._gpus.items()
            },
        }

    def snapshot(self) -> dict[str, Any]:
        """The state as it is now, as :meth:`save` writes it (without the write time)."""
        tenants = [{**static_record(t, start), **dynamic_record(t)} for t, start in self._live()]
        return {**self._header(), "tenants": tenants}

    def _members(self) -> bytes:
        """The document's members as JSON text (``StateFile.write_members``), saved_at aside.

        Each tenant's record comes from :class:`TenantFragments`, encoded again
        only when it changed: a tenant a region entry or exit leaves unchanged
        costs a comparison (~1 µs) and the copy of its bytes, not an encoding.
        """
        live = self._live()
        records = [self._fragments.get(t, start) for t, start in live]
        self._fragments.keep({t.id for t, _ in live})
        header = json.dumps(self._header(), separators=(",", ":")).encode()
        return b'%s,"tenants":[%s]' % (header[1:-1], b",".join(records))

    def save(self) -> None:
        """Write the state if it changed since the last write (never raises).

        A failure (a full disk) is logged once until a save succeeds again;
        only adoption after a restart is affected.
        """
        if not self.enabled:
            return
        try:
            members = self._members()
            if members == self._last:
                return
            self._file.write_members(members + b',"saved_at":' + repr(time.time()).encode())
        except (OSError, TypeError, ValueError) as exc:
            if not self.failing:  # once per failing stretch (a full disk fails every op)
                _log.error(
                    "cannot save state to %s: %s; until it can, a restarted krexd adopts "
                    "the state saved before",
                    self.path,
                    exc,
                )
            self.failing = True
            return
        if self.failing:
            _log.warning("state saved to %s again", self.path)
        self.failing = False
        self._last = members
        self.writes += 1

    def remove(self) -> None:
        """Delete the state (a full stop: nothing is left to adopt) and stop saving."""
        self.enabled = False
        self._file.close()
        saved_state.remove(self.path)
