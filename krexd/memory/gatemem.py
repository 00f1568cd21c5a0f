"""krexd's read-only view of the memory fields of a gate file.

libkrex_shim publishes, in each process's gate slot (``krex_gate.h``), the
device memory the process allocated through the driver API (``mem_mib``) and
what it did with out-of-memory errors (``oom``: three saturating counters,
the reason of the last error handed back, and a WAITING bit while an
allocation waits for co-tenants).  krexd maps the gate file a second time,
read-only, and reads those words with single aligned 32-bit loads
(``memoryview`` of ``uint32``), so a read never tears.  The offsets are
asserted in ``krex_gate.h``; ``tests/memory/test_gatemem.py`` checks them
against the compiled header.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

# Layout (krex_gate.h): header of 64 bytes, then KREX_GATE_MAX_SLOTS slots of 64.
MAGIC = 0x455441475845524B
HEADER_BYTES = 64
SLOT_BYTES = 64
MAX_SLOTS = 256
GATE_BYTES = HEADER_BYTES + SLOT_BYTES * MAX_SLOTS
NSLOTS_OFF = 12
MEM_SEQ_OFF = 40
# The ownership word (krex_slot.owner, layout 3): state in the low byte of
# its low half, generation above it, the owner pid in its high half.
SLOT_STATE_OFF = 0
SLOT_STATE_MASK = 0xFF
SLOT_PID_OFF = 4
SLOT_TENANT_OFF = 16
SLOT_MEM_MIB_OFF = 56
SLOT_OOM_OFF = 60

SLOT_FREE, SLOT_CLAIMING, SLOT_ACTIVE, SLOT_DEAD = 0, 1, 2, 3

# krex_slot.oom fields (krex_gate.h KREX_OOM_*).
OOM_WAITED_SHIFT, OOM_WAITED_MAX = 0, 0xFFF
OOM_FAILED_SHIFT, OOM_FAILED_MAX = 12, 0xFF
OOM_OWN_SHIFT, OOM_OWN_MAX = 20, 0xFF
OOM_LAST_SHIFT, OOM_LAST_MAX = 28, 0x7
OOM_WAITING = 0x8000_0000

#: enum krex_oom_reason, by value: the last out-of-memory error handed back.
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
COTENANT_REASONS = frozenset({"timeout", "in_region", "nested", "no_wait", "mutual"})


@dataclass(frozen=True)
class OomWord:
    """A decoded ``krex_slot.oom`` word (counts since the process registered)."""

    waited: int  # co-tenant OOMs absorbed: waited, then the allocation succeeded
    failed: int  # co-tenant OOMs returned to the program
    own: int  # OOMs returned as the tenant's own
    last: str | None  # reason of the last one returned (OOM_REASONS)
    waiting: bool  # an allocation waits for co-tenants' memory now

    @classmethod
    def decode(cls, word: int) -> OomWord:
        """Decode the 32-bit word ``word``."""
        return cls(
            waited=(word >> OOM_WAITED_SHIFT) & OOM_WAITED_MAX,
            failed=(word >> OOM_FAILED_SHIFT) & OOM_FAILED_MAX,
            own=(word >> OOM_OWN_SHIFT) & OOM_OWN_MAX,
            last=OOM_REASONS[(word >> OOM_LAST_SHIFT) & OOM_LAST_MAX],
            waiting=bool(word & OOM_WAITING),
        )


@dataclass(frozen=True)
class SlotMemory:
    """The memory fields of one slot: owner (``tenant``, ``pid``), ``mem_mib``, ``oom``."""

    index: int
    state: int  # SLOT_FREE .. SLOT_DEAD
    pid: int
    tenant: int
    mem_mib: int
    oom: OomWord


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class GateMemory:
    """A read-only mapping of the gate file at ``path`` (raises OSError/ValueError)."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_size < GATE_BYTES:
                raise ValueError(f"{path}: shorter than a gate ({GATE_BYTES} bytes)")
            self._map = mmap.mmap(fd, GATE_BYTES, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._u32 = memoryview(self._map).cast("I")
        if int.from_bytes(self._map[:8], "little") != MAGIC:
            self.close()
            raise ValueError(f"{path}: not a krex gate")

    def _word(self, offset: int) -> int:
        return int(self._u32[offset // 4])

    @property
    def nslots(self) -> int:
        """Slots in use by this gate."""
        return min(self._word(NSLOTS_OFF), MAX_SLOTS)

    @property
    def mem_seq(self) -> int:
        """The gate's free counter (bumped by every device-memory free)."""
        return self._word(MEM_SEQ_OFF)

    def slot(self, i: int) -> SlotMemory:
        """Slot ``i`` (0 <= i < nslots)."""
        base = HEADER_BYTES + SLOT_BYTES * i
        pid = self._word(base + SLOT_PID_OFF)
        return SlotMemory(
            index=i,
            state=self._word(base + SLOT_STATE_OFF) & SLOT_STATE_MASK,
            pid=pid - (1 << 32) if pid >= 1 << 31 else pid,
            tenant=self._word(base + SLOT_TENANT_OFF),
            mem_mib=self._word(base + SLOT_MEM_MIB_OFF),
            oom=OomWord.decode(self._word(base + SLOT_OOM_OFF)),
        )

    def slots(self) -> list[SlotMemory]:
        """Every slot below ``nslots``, free ones included (they keep their last record)."""
        return [self.slot(i) for i in range(self.nslots)]

    def waiting_tenants(self) -> set[int]:
        """Tenants with a live process whose allocation waits for co-tenants' memory."""
        first = (HEADER_BYTES + SLOT_OOM_OFF) // 4
        words = self._u32[first : first + (SLOT_BYTES // 4) * self.nslots : SLOT_BYTES // 4]
        out: set[int] = set()
        for i, word in enumerate(words):
            if word & OOM_WAITING:
                s = self.slot(i)
                if s.state == SLOT_ACTIVE and pid_alive(s.pid):
                    out.add(s.tenant)
        return out

    def close(self) -> None:
        """Drop the mapping."""
        self._u32.release()
        self._map.close()
