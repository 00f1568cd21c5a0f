"""What krexd reads back from the gate, decoded: registrations, their records, findings.

``RegistrationInfo`` is one registration as ``krex_coord_slots`` returns it
(``krexd.gate.binding``), with its out-of-memory record (``OomRecord``) and
its first fatal CUDA error (``FaultSeen``); ``Finding`` is what
``krex_coord_audit`` reports.  The value tables mirror the C enums of
``libkrex_shim/include/krex_gate.h``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

REGISTRATION_STATES = {0: "free", 1: "claiming", 2: "active", 3: "dead", 4: "exiting"}
#: States of a slot whose process is registered and alive ("exiting": past its
#: exit synchronization, drained whenever nothing is in flight).
LIVE_REGISTRATION_STATES = ("active", "exiting")

#: enum krex_finding_kind: what krex_coord_audit found that the protocol cannot produce.
FINDINGS = {
    1: "its slot memory's header was rewritten",
    2: "a slot state that does not exist",
    3: "a registration claims another tenant",
    4: "an acknowledgement of an epoch krexd never requested",
    5: "an in-flight count no process can have",
}

#: enum krex_oom_reason, by value: the last out-of-memory error the shim handed back.
OOM_REASONS: dict[int, str | None] = {
    0: None,
    1: "timeout",  # co-tenants: waited oom_wait_s, not enough was freed
    2: "in_region",  # co-tenants: the tenant held the region (siblings frozen)
    3: "nested",  # co-tenants: inside another driver call, could not wait
    4: "no_wait",  # co-tenants: waiting is off ([memory] oom_wait_s = 0)
    5: "too_large",  # own: the tenant alone would exceed the card
    6: "alone",  # own: no co-tenant process on the GPU
    7: "mutual",  # co-tenants: all of them waited too; the latest admitted gave up
}
#: The reasons that blame co-tenants (``krex run`` exits 75 on them).
COTENANT_REASONS = frozenset({"timeout", "in_region", "nested", "no_wait", "mutual"})


@dataclass(frozen=True)
class OomRecord:
    """A slot's out-of-memory record (counts since the process registered; saturating)."""

    waited: int = 0  # co-tenant OOMs absorbed: waited, then the allocation succeeded
    failed: int = 0  # co-tenant OOMs returned to the program
    own: int = 0  # OOMs returned as the tenant's own
    last: str | None = None  # reason of the last one returned (OOM_REASONS)
    waiting: bool = False  # an allocation waits for co-tenants' memory now


#: krex_gate.h KREX_FAULT_*: a slot's record of the first fatal CUDA error its process saw.
_FAULT_CODE_MASK, _FAULT_LAUNCHED, _FAULT_AT_SYNC = 0xFFFF, 0x10000, 0x20000


@dataclass(frozen=True)
class FaultSeen:
    """The first fatal ("sticky") CUDA error a process saw (libkrex_shim/tenant/fault.c).

    ``code`` is the CUresult (700: illegal address); ``launched``: the
    process had launched kernels before it; ``at_sync``: the shim's own
    synchronization (a drain, the exit) found it, no call of the program.
    """

    code: int
    launched: bool
    at_sync: bool

    @classmethod
    def decode(cls, word: int) -> FaultSeen | None:
        """The record of slot word ``word`` (None when no fatal error was seen)."""
        if not word & _FAULT_CODE_MASK:
            return None
        return cls(
            word & _FAULT_CODE_MASK, bool(word & _FAULT_LAUNCHED), bool(word & _FAULT_AT_SYNC)
        )


class Registration(NamedTuple):
    """A live registration as region entry reads it: the fields of :class:`RegistrationInfo`
    that the memory fit and the fail-closed check ask for, nothing else.

    ``state`` is ``active`` or ``exiting`` (:data:`LIVE_REGISTRATION_STATES`); slots
    krexd judged gone (``ignored``) are left out.  Building a full
    :class:`RegistrationInfo` per slot cost about 7 µs on the development machine,
    paid twice per region entry for every sibling process; this costs a
    fraction of that (:meth:`krexd.gate.Gate.live_registrations`).
    """

    state: str
    pid: int
    tenant: int
    mem_mib: int
    start_ticks: int
    image: int
    pidns: int


@dataclass(frozen=True)
class RegistrationInfo:
    """One registration: a tenant process's slot in its tenant's slot memory.

    ``tenant`` is the tenant whose slot memory holds it (krexd's own table,
    not what the slot says: ``claimed_tenant``); ``index`` its place there.
    ``state`` is one of ``free``, ``claiming``, ``active``, ``dead``,
    ``exiting`` (alive, past its exit synchronization; an ``active`` or
    ``exiting`` slot krexd judged gone reads ``dead`` with ``ignored``);
    ``pid`` is in the owner's pid namespace (``pidns``, an inode number),
    ``start_ticks`` its start time and ``image`` the shim's mapping in it
    (krex_gate.h ``krex_slot.image``), which krexd verifies
    (``krexd.tenancy.registrations``).  ``inflight`` counts the driver calls between
    entry and return that the shim counts in the slot (calls admitted on a
    thread's mark are counted there instead, in the process's own memory:
    docs/design/shim.md "Thread marks"; its drainer waits for both);
    ``ack_epoch`` is the last epoch the process drained for; ``captures``
    its open stream captures; ``gated_calls`` / ``blocked_calls`` are counts
    since it registered; ``last_drain_ns`` is
    the duration of its last drain (ns).  ``mem_mib`` is the device memory
    it allocated through the driver API and has not freed (MiB, rounded up)
    and ``oom`` its out-of-memory record; both stay readable after the
    process ended, until the slot is reused.  ``generation`` counts the
    slot's ownership transitions (mod 2**24) and ``owner`` is the raw
    ownership word.  ``fault`` is the first fatal CUDA error the process
    saw (None: none), kept like the memory record; the tenant writes it, so
    it is a claim (only its defined bits are read), not a fact.
    """

    index: int
    state: str
    pid: int
    tenant: int
    inflight: int
    ack_epoch: int
    captures: int
    gated_calls: int
    blocked_calls: int
    last_drain_ns: int
    mem_mib: int = 0
    oom: OomRecord = OomRecord()
    generation: int = 0
    owner: int = 0
    start_ticks: int = 0
    image: int = 0
    pidns: int = 0
    claimed_tenant: int = 0
    ignored: bool = False
    fault: FaultSeen | None = None


@dataclass(frozen=True)
class Finding:
    """A state krexd's protocol cannot have produced, in ``tenant``'s slot memory."""

    tenant: int
    kind: int  # enum krex_finding_kind
    index: int  # slot index (0 for the header)
    value: int  # the offending value

    def describe(self) -> str:
        """In words, naming the slot and the value."""
        what = FINDINGS.get(self.kind, f"finding {self.kind}")
        return f"{what} (slot {self.index}, value {self.value})"


#: Judges one pending registration: True when its owner is verified live (keep waiting).
Judge = Callable[[RegistrationInfo], bool]
