"""What a tenant's memory record gets: fresh counts on demand, a final read, a learned peak.

A record (``krexd.tenancy.memory_records.TenantMemory``) is created by the admission
policy (``krexd.memory.policy``) and kept current by each refresh of its
GPU's view (``krexd.memory.views``).  Two moments need more than that: the
``memory`` op (``krex run`` asks after a failure whether co-tenants caused
it) reads the gate first, ended processes included; and a tenant's end reads
its registrations once more before they are freed, then teaches its peak to
the learned needs (``krexd.memory.learned``) under its launcher's uid and
its label.
"""

from __future__ import annotations

import logging

from krexd.config.config import MemoryConfig
from krexd.memory.learned import LearnedNeeds
from krexd.memory.views import MemoryViews
from krexd.tenancy.tenants import Tenant

_log = logging.getLogger("krexd.memory")


class TenantRecords:
    """Tenants' memory records as the ``memory`` op and the lifecycle ask for them.

    Args:
        cfg: the ``[memory]`` table (``learn``).
        views: the GPUs' memory views (re-read through them).
        learned: the learned needs, taught each tenant's peak at its end.
    """

    def __init__(self, cfg: MemoryConfig, views: MemoryViews, learned: LearnedNeeds) -> None:
        self._learn = cfg.learn
        self._views = views
        self._learned = learned

    def refresh_tenant(self, tenant: Tenant) -> None:
        """Credit what the tenant's processes (ended ones too) counted so far to its record:
        its GPU's shim counts re-read, then its registrations credited."""
        self._views.refresh(tenant.gpu)  # live counts and peaks, and the ledger
        self._views.credit(tenant)

    def tenant_ended(self, tenant: Tenant) -> None:
        """Final read of the tenant's registrations (its processes are gone); its peak
        is learned under its uid and label (not an exclusive tenant's, nor with
        ``[memory] learn = false``).  The caller frees the registrations afterwards."""
        self.refresh_tenant(tenant)
        rec = tenant.memory
        rec.waiting = False
        if self._learn and rec.label and not tenant.exclusive:
            self._learned.record(tenant.uid, rec.label, rec.learn_bytes)
        _log.info("t%d memory: %s", tenant.id, rec.describe())
