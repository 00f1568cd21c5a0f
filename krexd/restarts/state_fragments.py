"""Each tenant's record of the saved state, kept encoded and encoded again only when it changed.

A record is a static part, encoded once at admission, and a dynamic part
encoded again only when it differs; a tenant is saved in its resting state
(:func:`resting_state`), so a region entry or exit encodes the holder's
record only.  docs/design/daemon.md "Restarts".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant

_SEPARATORS = (",", ":")

# Saved as ``running``: adoption (krexd/restarts/adopt.py ``_RESTORED_STATES``) restores only
# ``admitted`` and ``holding`` and takes every other state for running, and re-freezes
# the siblings its saved region names.
_RESTING = {
    states.FREEZING: states.RUNNING,
    states.FROZEN: states.RUNNING,
    states.THAWING: states.RUNNING,
}


def resting_state(state: states.TenantState) -> str:
    """The state saved for a tenant in ``state`` (its wire name): a sibling's region steps
    read ``running``."""
    return _RESTING.get(state, state).value


def static_record(t: Tenant, launcher_start: int) -> dict[str, Any]:
    """The part of ``t``'s saved record fixed at admission (``launcher_start``: verified)."""
    cg = t.cgroup
    return {
        "id": t.id,
        "token": t.token,
        "gpu": t.gpu,
        "argv": t.argv,
        "launcher_pid": t.launcher_pid,
        "launcher_start": launcher_start,
        "uid": t.uid,
        "gid": t.gid,
        "exclusive": t.exclusive,
        "without_mps": t.without_mps,
        "cgroup": {
            "freezer": cg.freezer_dir,
            "cpuset": cg.cpuset_dir,
            "kind": cg.cpuset_kind,
            "cores": list(cg.cores),
        },
    }


def dynamic_record(t: Tenant) -> dict[str, Any]:
    """The part of ``t``'s saved record that changes while it runs."""
    return {
        "pids": sorted(t.pids),
        "state": resting_state(t.state),
        "kill_reason": t.kill_reason,
        "slots_fd": t.slots_fd if t.registrations_attached else None,
        # A plain dataclass of scalars (no __slots__): its __dict__ holds exactly its
        # fields, in order (a test checks it).
        "memory": dict(vars(t.memory)),
    }


def _static_key(t: Tenant, launcher_start: int) -> tuple[Any, ...]:
    cg = t.cgroup
    return (
        t.token,
        t.gpu,
        t.argv,  # compared by identity first: the same list is never changed in place
        t.launcher_pid,
        launcher_start,
        t.uid,
        t.gid,
        t.exclusive,
        t.without_mps,
        cg.freezer_dir,
        cg.cpuset_dir,
        cg.cpuset_kind,
        cg.cores,
    )


@dataclass(slots=True)
class _Fragment:
    tenant: Tenant
    static_key: tuple[Any, ...]
    head: bytes  # the static part: '{"id":1,...,"cgroup":{...},'
    dynamic_key: tuple[Any, ...] | None = None
    memory: dict[str, Any] = field(default_factory=dict)
    data: bytes = b""  # the whole record's JSON text


class TenantFragments:
    """The tenants' records as JSON text, encoded again only when they changed.

    Not thread-safe (krexd saves from its event loop only).  ``encoded``
    counts the dynamic parts encoded (a test's measure of the work done).
    """

    def __init__(self) -> None:
        self._by_id: dict[int, _Fragment] = {}
        self.encoded = 0

    def get(self, t: Tenant, launcher_start: int) -> bytes:
        """``t``'s record as JSON text (what ``static_record | dynamic_record`` encodes to)."""
        frag = self._by_id.get(t.id)
        key = _static_key(t, launcher_start)
        if frag is None or frag.tenant is not t or frag.static_key != key:
            head = json.dumps(static_record(t, launcher_start), separators=_SEPARATORS)
            frag = self._by_id[t.id] = _Fragment(t, key, head.encode()[:-1] + b",")
        pids = sorted(t.pids)
        dynamic = (
            pids,
            resting_state(t.state),
            t.kill_reason,
            t.slots_fd if t.registrations_attached else None,
        )
        memory = vars(t.memory)
        if dynamic != frag.dynamic_key or memory != frag.memory:
            copy = dict(memory)
            record = {
                "pids": pids,
                "state": dynamic[1],
                "kill_reason": dynamic[2],
                "slots_fd": dynamic[3],
                "memory": copy,
            }
            data = frag.head + json.dumps(record, separators=_SEPARATORS).encode()[1:]
            # Remembered only once encoded: a record that failed to encode is tried
            # again next time, never answered with the bytes of an older one.
            frag.data, frag.dynamic_key, frag.memory = data, dynamic, copy
            self.encoded += 1
        return frag.data

    def keep(self, ids: set[int]) -> None:
        """Forget the records of tenants not in ``ids`` (ended: no longer saved)."""
        for tid in self._by_id.keys() - ids:
            del self._by_id[tid]
