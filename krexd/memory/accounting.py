"""One GPU's memory accounting: a device read and the shim's registrations into a view.

Computes ``tenants_used``, ``other`` and ``excess`` (docs/design/memory.md
"1. The memory view") and updates each tenant's record on the way: usage
and peaks, a wait for co-tenants' memory, the registration ledger.
"""

from __future__ import annotations

import logging

from krex_client.sizes import format_size
from krexd.gate import LIVE_REGISTRATION_STATES, RegistrationInfo
from krexd.memory.sources import DeviceMemory
from krexd.memory.view import GpuMemory, GpuView
from krexd.system.procfs import pid_alive
from krexd.tenancy.tenants import Tenant

_log = logging.getLogger("krexd.memory")


def apply(
    memory: GpuMemory,
    dm: DeviceMemory,
    tenants: list[Tenant],
    slots: list[RegistrationInfo] | None,
) -> None:
    """Recompute ``memory.view`` of one GPU from its device read ``dm``, its live
    ``tenants`` and the registrations ``slots`` in its gate (None: no gate, or
    unmapped); updates the tenants' memory records and ``memory.ledger``.

    A tenant using more than its need is allowed and logged (a warning).
    """
    records = {t.id: t.memory for t in tenants}
    shim_used: dict[int, int] = {}
    waiting: set[int] = set()
    if slots is not None:
        memory.ledger.update(slots, records)
        for s in slots:
            if s.state in LIVE_REGISTRATION_STATES and s.tenant and pid_alive(s.pid):
                shim_used[s.tenant] = shim_used.get(s.tenant, 0) + (s.mem_mib << 20)
                if s.oom.waiting:
                    waiting.add(s.tenant)
    tenants_used = over = 0
    for t in tenants:
        used, src = tenant_used(t, dm, shim_used)
        rec = t.memory
        rec.waiting = t.id in waiting
        rec.waits_seen += rec.waiting
        if rec.observe(used, src, shim_used.get(t.id, 0)):
            _log.warning(
                "t%d uses %s, more than the %s it %s (allowed; noted in its record)",
                t.id,
                format_size(used),
                format_size(rec.need_bytes),
                "declared" if rec.need_source == "declared" else "was assumed to need",
            )
        tenants_used += used
        over += max(0, used - rec.need_bytes)
    other = max(0, dm.used - tenants_used) if dm.used is not None else 0
    memory.view = GpuView(
        total=dm.total,
        used=dm.used if dm.used is not None else tenants_used,
        other=other,
        tenants_used=tenants_used,
        excess=other + over,
        source=dm.source,
        waiting=waiting,
    )


def tenant_used(t: Tenant, dm: DeviceMemory, shim_used: dict[int, int]) -> tuple[int, str]:
    """The tenant's usage: the source's per-process figures for its pids, or the
    shim's count when that is larger (the source is sampled, the count is live)."""
    shim = shim_used.get(t.id, 0)
    if dm.per_pid:
        try:
            pids = t.cgroup.pids()
        except Exception:
            pids = sorted(t.pids)
        matched = [dm.per_pid[p] for p in pids if p in dm.per_pid]
        if matched and sum(matched) >= shim:
            return sum(matched), dm.source
    return shim, "shim"
