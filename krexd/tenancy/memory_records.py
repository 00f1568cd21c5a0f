"""Per-tenant memory records, and the bookkeeping that fills them from gate registrations.

A record (:class:`TenantMemory`) says what a tenant needed, used and did
with its out-of-memory errors (docs/design/memory.md "4. Records and exit
code 75"); :class:`RegistrationLedger` credits a registration's counts to
its owner, so a record survives a registration freed after its process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from krex_client.sizes import format_size
from krexd.gate import COTENANT_REASONS, LIVE_REGISTRATION_STATES, RegistrationInfo


@dataclass
class TenantMemory:
    """One command's memory record (bytes; counts since it was admitted)."""

    need_bytes: int  # what admission charges: max(declared, learned, default)
    need_source: str  # "declared" (krex run --mem) | "learned" | "default" ([memory] default_need)
    used_bytes: int = 0  # current usage (the latest read)
    peak_bytes: int = 0
    used_source: str = "none"  # "nvml" | "amdsmi" | "fake" | "shim" | "none"
    label: str = ""  # what learned needs are keyed by (krexd.memory.learned)
    declared_bytes: int | None = None  # krex run --mem
    learned_bytes: int | None = None  # learned from earlier runs of the label
    shim_peak_bytes: int = 0  # peak of the shim's own count (live driver allocations)
    exceeded: bool = False  # peak_bytes went over need_bytes
    oom_waited: int = 0  # co-tenant OOMs absorbed: waited, then allocated
    oom_cotenant: int = 0  # co-tenant OOMs returned to the program
    oom_own: int = 0  # OOMs returned as its own (too large alone, no co-tenant)
    last_oom: str | None = None  # reason of the last OOM returned (krexd.gate.OOM_REASONS)
    last_cotenant_oom: str | None = None  # reason of the last co-tenant OOM returned
    waiting: bool = False  # an allocation waits for co-tenants' memory now
    waits_seen: int = 0  # reads of the gate (periodic and on demand) that found it waiting

    def observe(self, used_bytes: int, source: str, shim_bytes: int = 0) -> bool:
        """Record usage now (bytes; ``shim_bytes``: the shim's count).

        True the first time the peak exceeds the need.
        """
        self.shim_peak_bytes = max(self.shim_peak_bytes, shim_bytes)
        self.used_bytes = used_bytes
        self.used_source = source
        self.peak_bytes = max(self.peak_bytes, used_bytes)
        if self.peak_bytes > self.need_bytes and not self.exceeded:
            self.exceeded = True
            return True
        return False

    @property
    def learn_bytes(self) -> int:
        """What this run teaches about its label: the larger of the two peaks (bytes)."""
        return max(self.peak_bytes, self.shim_peak_bytes)

    @property
    def outcome(self) -> str:
        """``cotenant_oom``, ``own_oom``, ``waited`` or ``ok``: the worst that happened."""
        if self.oom_cotenant:
            return "cotenant_oom"
        if self.oom_own:
            return "own_oom"
        return "waited" if self.oom_waited else "ok"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready record (status, ``release`` reply)."""
        return {
            "need_bytes": self.need_bytes,
            "need_source": self.need_source,
            "used_bytes": self.used_bytes,
            "peak_bytes": self.peak_bytes,
            "used_source": self.used_source,
            "label": self.label,
            "declared_bytes": self.declared_bytes,
            "learned_bytes": self.learned_bytes,
            "shim_peak_bytes": self.shim_peak_bytes,
            "exceeded": self.exceeded,
            "oom_waited": self.oom_waited,
            "oom_cotenant": self.oom_cotenant,
            "oom_own": self.oom_own,
            "last_oom": self.last_oom,
            "last_cotenant_oom": self.last_cotenant_oom,
            "waiting": self.waiting,
            "outcome": self.outcome,
        }

    def describe(self) -> str:
        """One line for logs: need, peak, OOM outcome."""
        return (
            f"need {format_size(self.need_bytes)} ({self.need_source}), "
            f"peak {format_size(self.peak_bytes)} ({self.used_source}), {self.outcome}"
        )


@dataclass
class _Owner:
    tenant: int
    pid: int
    waited: int = 0
    failed: int = 0
    own: int = 0
    last: str | None = None


@dataclass
class RegistrationLedger:
    """Credits the shim's per-registration OOM counters to tenant records, once each.

    A process's registration may be freed (and later reused) after it exits:
    the ledger remembers who owned each registration and what it had counted,
    and credits only increases to the owning tenant.
    """

    # By (tenant, slot index): each tenant's registrations live in its own slot memory.
    _owners: dict[tuple[int, int], _Owner] = field(default_factory=dict)

    def update(self, slots: list[RegistrationInfo], records: dict[int, TenantMemory]) -> None:
        """Apply a fresh read of a gate's registrations (``Gate.registrations()``) to ``records``.

        ``records`` maps tenant id -> record; registrations of other tenants are
        tracked but credit nothing.
        """
        for s in slots:
            key = (s.tenant, s.index)
            known = self._owners.get(key)
            if (s.state in LIVE_REGISTRATION_STATES or s.state == "dead") and s.tenant:
                if known is None or known.pid != s.pid:
                    known = self._owners[key] = _Owner(s.tenant, s.pid)
                self._credit(known, s, records)
            elif s.state == "free" and known is not None:
                # Freed since the last read: its fields are the owner's final counts.
                self._credit(known, s, records)
                del self._owners[key]
            elif s.state == "claiming":
                self._owners.pop(key, None)  # being reset by a new owner

    @staticmethod
    def _credit(o: _Owner, s: RegistrationInfo, records: dict[int, TenantMemory]) -> None:
        w = s.oom
        rec = records.get(o.tenant)
        if rec is not None:
            rec.oom_waited += max(0, w.waited - o.waited)
            rec.oom_own += max(0, w.own - o.own)
            new_failed = max(0, w.failed - o.failed)
            rec.oom_cotenant += new_failed
            if w.last is not None and (w.failed, w.own) != (o.failed, o.own):
                rec.last_oom = w.last
                if new_failed and w.last in COTENANT_REASONS:
                    rec.last_cotenant_oom = w.last
        o.waited, o.failed, o.own, o.last = (
            max(o.waited, w.waited),
            max(o.failed, w.failed),
            max(o.own, w.own),
            w.last,
        )
