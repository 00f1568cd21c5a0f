"""krexd's read of the gate's memory fields matches the C layout; records survive slots.

The offsets krexd.memory.gatemem uses are compared with ``offsetof`` from
the compiled ``krex_gate.h``; the OOM word is decoded from values built with
the header's own macros.  The ledger tests feed slot reads in the order a
slot's life gives them (owner counts, owner ends, slot reused).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from krexd.memory import gatemem
from krexd.memory.gatemem import OomWord, SlotMemory
from krexd.memory.records import SlotLedger, TenantMemory

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "krex_gate.h"
int main(void)
{
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct krex_gate),
           offsetof(struct krex_gate, nslots), offsetof(struct krex_gate, mem_seq),
           offsetof(struct krex_gate, slots), sizeof(struct krex_slot),
           offsetof(struct krex_slot, owner), offsetof(struct krex_slot, owner) + 4,
           offsetof(struct krex_slot, tenant), offsetof(struct krex_slot, mem_mib),
           offsetof(struct krex_slot, oom));
    unsigned w = (7u << KREX_OOM_WAITED_SHIFT) | (3u << KREX_OOM_FAILED_SHIFT) |
                 (2u << KREX_OOM_OWN_SHIFT) |
                 ((unsigned)KREX_OOM_IN_REGION << KREX_OOM_LAST_SHIFT) | KREX_OOM_WAITING;
    printf("%u %u %u\n", w, (unsigned)KREX_OOM_MUTUAL, (unsigned)KREX_GATE_MAX_SLOTS);
    return 0;
}
"""


def test_offsets_and_oom_word_match_the_header(tmp_path: Path) -> None:
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-I",
            str(REPO / "libkrex_shim" / "include"),
            str(src),
            "-o",
            str(exe),
        ],
        check=True,
    )
    first, second = subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert [int(x) for x in first.split()] == [
        gatemem.GATE_BYTES,
        gatemem.NSLOTS_OFF,
        gatemem.MEM_SEQ_OFF,
        gatemem.HEADER_BYTES,
        gatemem.SLOT_BYTES,
        gatemem.SLOT_STATE_OFF,
        gatemem.SLOT_PID_OFF,
        gatemem.SLOT_TENANT_OFF,
        gatemem.SLOT_MEM_MIB_OFF,
        gatemem.SLOT_OOM_OFF,
    ]
    word, mutual, max_slots = (int(x) for x in second.split())
    assert OomWord.decode(word) == OomWord(
        waited=7, failed=3, own=2, last="in_region", waiting=True
    )
    assert gatemem.OOM_REASONS[mutual] == "mutual" and max_slots == gatemem.MAX_SLOTS


def test_gate_memory_refuses_a_file_that_is_not_a_gate(tmp_path: Path) -> None:
    bad = tmp_path / "gpu0.gate"
    bad.write_bytes(b"\0" * gatemem.GATE_BYTES)
    with pytest.raises(ValueError, match="not a krex gate"):
        gatemem.GateMemory(str(bad))
    bad.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="shorter"):
        gatemem.GateMemory(str(bad))


def slot(
    i: int,
    state: int,
    tenant: int,
    pid: int,
    waited: int = 0,
    failed: int = 0,
    own: int = 0,
    last: str | None = None,
) -> SlotMemory:
    return SlotMemory(i, state, pid, tenant, 0, OomWord(waited, failed, own, last, False))


def test_ledger_credits_each_count_once_and_keeps_it_after_the_slot_is_freed() -> None:
    a, b = TenantMemory(0, "default"), TenantMemory(0, "default")
    records = {1: a, 2: b}
    ledger = SlotLedger()
    ledger.update([slot(0, gatemem.SLOT_ACTIVE, 1, 100, waited=1)], records)
    ledger.update([slot(0, gatemem.SLOT_ACTIVE, 1, 100, waited=1)], records)  # no double count
    assert (a.oom_waited, a.oom_cotenant) == (1, 0)
    # The process failed for co-tenants, then ended; the slot was freed (fields kept).
    ledger.update([slot(0, gatemem.SLOT_FREE, 0, 0, waited=1, failed=1, last="timeout")], records)
    assert (a.oom_waited, a.oom_cotenant, a.last_cotenant_oom, a.outcome) == (
        1,
        1,
        "timeout",
        "cotenant_oom",
    )
    # The slot is reused by tenant 2's process: counts start over, credited to b only.
    ledger.update([slot(0, gatemem.SLOT_ACTIVE, 2, 200, own=1, last="too_large")], records)
    assert (a.oom_cotenant, a.oom_own) == (1, 0)
    assert (b.oom_own, b.last_oom, b.last_cotenant_oom, b.outcome) == (
        1,
        "too_large",
        None,
        "own_oom",
    )


def test_exceeding_the_need_is_noted_once() -> None:
    rec = TenantMemory(100, "declared")
    assert not rec.observe(80, "fake")
    assert rec.observe(150, "fake") and rec.exceeded
    assert not rec.observe(160, "fake")
    assert (rec.peak_bytes, rec.used_bytes) == (160, 160)
