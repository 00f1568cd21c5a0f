"""Flags a tenant writes in its own slot memory that pause others: verified, and bounded.

The memory-wait bit and the fault word stop other tenants when krexd
honours them, so they are claims: honoured only in a slot whose owner
verifies as a live process of the tenant, and for a bounded time, past
which the tenant is ended (exit 79).  docs/design/memory.md "2. Admission
by memory", docs/design/faults.md "Signals (most reliable first)".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from krexd.gate import LIVE_REGISTRATION_STATES, GateError, RegistrationInfo
from krexd.system.procfs import start_time
from krexd.tenancy import states
from krexd.tenancy.registrations import Verifier
from krexd.tenancy.tenants import TenantRegistry

#: Added to ``[memory] oom_wait_s``: the shim re-judges a wait every 20 ms at
#: most, krexd observes the flag every 100 ms, and a loaded host delays both.
WAIT_GRACE_S = 2.0
#: The longest admission to a GPU stays paused for a fault while a tenant that
#: recorded it still runs (the MPS server's teardown and restart take a second or two).
FAULT_HOLD_S = 10.0

#: A tenant's states in which a region froze it: its waits do not advance then.
_FROZEN = frozenset({states.FREEZING, states.FROZEN, states.THAWING})

#: (tenant, slot index): where a flag is.
RegistrationKey = tuple[int, int]
#: What a verified registration said of its process: pid namespace, start time, image.
Described = tuple[int, int, int]


class GateLike(Protocol):
    """What :class:`RegistrationFlags` uses of a gate (``krexd.gate.Gate``)."""

    def ignore(self, slot: RegistrationInfo) -> None:
        """Skip ``slot`` in drains and summaries while its owner stays the same."""
        ...


@dataclass
class _Wait:
    """One continuous memory wait of one registration, as the sweeps saw it."""

    described: Described
    counts: tuple[int, int]  # (waited, failed) when it began: a new wait bumps one
    honoured_s: float = 0.0
    seen_at: float = 0.0


def _described(s: RegistrationInfo) -> Described:
    return (s.pidns, s.start_ticks, s.image)


class RegistrationFlags:
    """Decides whether a slot's memory-wait and fault flags are honoured (verified, bounded).

    Args:
        verifier: resolves registrations to processes of their tenant.
        tenants: the live tenants (frozen or not; ended ones are forgotten).
        wait_bound_s: how long one memory wait is honoured (``oom_wait_s`` +
            :data:`WAIT_GRACE_S`).
        fault_hold_s: how long a fault pauses admission while its recorder runs.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        verifier: Verifier,
        tenants: TenantRegistry,
        wait_bound_s: float,
        fault_hold_s: float = FAULT_HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._verifier = verifier
        self._tenants = tenants
        self.wait_bound_s = wait_bound_s
        self.fault_hold_s = fault_hold_s
        self._clock = clock
        self._verified: dict[RegistrationKey, Described] = {}
        self._waits: dict[RegistrationKey, _Wait] = {}

    # --- verification -----------------------------------------------------------------

    def verify(self, gate: GateLike, slots: Iterable[RegistrationInfo]) -> set[RegistrationKey]:
        """Verify the live, not ignored ``slots``; ignore those that do not resolve.

        One identity read per process of each tenant involved and one mapping
        check per slot (``Verifier.resolve_all``).  Returns the verified slots.
        """
        live = [s for s in slots if s.state in LIVE_REGISTRATION_STATES and not s.ignored]
        verdicts = self._verifier.resolve_all(live)
        ok: set[RegistrationKey] = set()
        for s in live:
            key = (s.tenant, s.index)
            if verdicts.get(key) is None:
                self._verified.pop(key, None)
                try:
                    gate.ignore(s)  # gone, exec'd, or not the tenant's process
                except GateError:
                    pass  # unmapped at shutdown
            else:
                self._verified[key] = _described(s)
                ok.add(key)
        return ok

    def _known(self, s: RegistrationInfo) -> bool:
        return self._verified.get((s.tenant, s.index)) == _described(s)

    def _verified_now(
        self, gate: GateLike, slots: list[RegistrationInfo]
    ) -> list[RegistrationInfo]:
        """Those of the live ``slots`` verified, verifying the ones not known yet."""
        live = [s for s in slots if s.state in LIVE_REGISTRATION_STATES and not s.ignored]
        unknown = [s for s in live if not self._known(s)]
        if unknown:
            self.verify(gate, unknown)
        return [s for s in live if self._known(s)]

    # --- the memory wait --------------------------------------------------------------

    def waits_honoured(self, gate: GateLike, waiting: list[RegistrationInfo]) -> bool:
        """True when some slot of ``waiting`` (WAITING set) is a verified wait within its bound."""
        for s in self._verified_now(gate, waiting):
            w = self._waits.get((s.tenant, s.index))
            if w is None or w.described != _described(s) or w.honoured_s <= self.wait_bound_s:
                return True
        return False

    def observe_waits(
        self, slots: list[RegistrationInfo], verified: set[RegistrationKey]
    ) -> list[tuple[int, str]]:
        """A sweep's view of one gate: advance each verified wait; the tenants past the bound.

        ``slots`` is every slot of the gate, ``verified`` what :meth:`verify`
        returned for them.  A wait ends when its flag is seen clear or its
        record counts a new wait (absorbed or returned).  Returns (tenant id,
        reason) for each tenant with a wait honoured longer than the bound.
        """
        now = self._clock()
        seen: set[RegistrationKey] = set()
        over: dict[int, str] = {}
        for s in slots:
            key = (s.tenant, s.index)
            if key not in verified or not s.oom.waiting:
                continue
            seen.add(key)
            counts = (s.oom.waited, s.oom.failed)
            w = self._waits.get(key)
            if w is None or w.described != _described(s) or w.counts != counts:
                self._waits[key] = _Wait(_described(s), counts, 0.0, now)
                continue
            t = self._tenants.get(s.tenant)
            if t is not None and t.state not in _FROZEN:
                w.honoured_s += now - w.seen_at
            w.seen_at = now
            if w.honoured_s > self.wait_bound_s:
                over[s.tenant] = (
                    f"its process {s.pid} (slot {s.index}) has claimed to wait for GPU memory "
                    f"for {w.honoured_s:.1f} s; an allocation waits at most "
                    f"{self.wait_bound_s:g} s ([memory] oom_wait_s and a grace): admission to "
                    "the GPU stays closed no longer"
                )
        here = {s.tenant for s in slots}
        for key in [k for k in self._waits if k not in seen and k[0] in here]:
            del self._waits[key]
        return sorted(over.items())

    # --- the fault word ---------------------------------------------------------------

    def fault_honoured(self, gate: GateLike, s: RegistrationInfo) -> bool:
        """True when ``s``'s fault record is of a verified owner (verified now if it is live)."""
        if s.fault is None:
            return False
        if s.state in LIVE_REGISTRATION_STATES and not s.ignored and self._verified_now(gate, [s]):
            return True
        # Its process ended (a slot still live whose process is gone fails the check
        # above): verified while it lived, or the very process krexd placed in the tenant
        # (a command that faulted and exited before the next sweep: seen on the H200 as
        # a member refused at its first context).
        return self._known(s) or self._placed(s)

    def _placed(self, s: RegistrationInfo) -> bool:
        """True when ``s`` names a process krexd placed in its tenant (``Tenant.pids``)
        that has ended (a live one must pass the verification instead)."""
        tenant = self._tenants.get(s.tenant)
        return tenant is not None and s.pid in tenant.pids and start_time(s.pid) is None

    def forget(self, live_tenants: set[int]) -> None:
        """Drop what is known of tenants that ended (the sweep calls it)."""
        for table in (self._verified, self._waits):
            for key in [k for k in table if k[0] not in live_tenants]:
                del table[key]
