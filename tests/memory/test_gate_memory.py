"""The gate's memory fields reach krexd through the gate library; records survive slots.

A probe program built against ``krex_gate.h`` writes a slot's ``mem_mib``
and ``oom`` word with the header's own macros into a gate that krexd's
binding created; :meth:`krexd.gate.Gate.slots` must read them back decoded.
The ledger tests feed slot reads in the order a slot's life gives them
(owner counts, owner ends, slot reused).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from krexd.gate import ABI_VERSION, Gate, OomRecord, SlotInfo
from krexd.memory.records import RegistrationLedger, TenantMemory
from tests.support import REPO, ShimBuild

# Writes slot 5 of the gate file argv[1] as an owner would (state ACTIVE).
PROBE = r"""
#include <stdatomic.h>
#include <stdio.h>
#include "krex_gate.h"
int main(int argc, char **argv)
{
    struct krex_gate *g = argc > 1 ? krex_gate_open(argv[1], 0, 0, 0, 0) : NULL;
    if (!g)
        return 1;
    struct krex_slot *s = &g->slots[5];
    atomic_store(&s->tenant, 9);
    atomic_store(&s->mem_mib, 300);
    atomic_store(&s->oom, (7u << KREX_OOM_WAITED_SHIFT) | (3u << KREX_OOM_FAILED_SHIFT) |
                              (2u << KREX_OOM_OWN_SHIFT) |
                              ((unsigned)KREX_OOM_IN_REGION << KREX_OOM_LAST_SHIFT) |
                              KREX_OOM_WAITING);
    atomic_store(&s->owner, krex_owner_next(atomic_load(&s->owner), KREX_SLOT_ACTIVE, 4242));
    krex_gate_unmap(g);
    return 0;
}
"""


@pytest.fixture
def probe(shim_build: ShimBuild, tmp_path: Path) -> Path:
    """The probe program, linked against the built gate library."""
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    lib = shim_build.gate_lib.parent
    subprocess.run(
        [
            "gcc",
            "-std=gnu11",
            "-I",
            str(REPO / "libkrex_shim" / "include"),
            str(src),
            "-o",
            str(exe),
            f"-L{lib}",
            f"-Wl,-rpath,{lib}",
            "-lkrex_gate",
        ],
        check=True,
    )
    return exe


def test_slots_give_the_memory_fields_decoded(probe: Path, tmp_path: Path) -> None:
    path = str(tmp_path / "gpu0.gate")
    with Gate.create(path, 0, nslots=8) as gate:
        subprocess.run([str(probe), path], check=True)
        slots = gate.slots()
        waiting = gate.waiting_for_memory()
    assert len(slots) == 8
    s = slots[5]
    assert (s.state, s.pid, s.tenant, s.mem_mib) == ("active", 4242, 9, 300)
    assert s.oom == OomRecord(waited=7, failed=3, own=2, last="in_region", waiting=True)
    assert all(o.mem_mib == 0 and o.oom == OomRecord() for o in slots if o.index != 5)
    assert waiting == [s]


def test_a_gate_of_another_layout_version_is_refused_by_name(
    shim_build: ShimBuild, tmp_path: Path
) -> None:
    path = tmp_path / "gpu0.gate"
    Gate.create(str(path), 0).unmap()
    with open(path, "r+b") as f:  # the version field: bytes 8..11 of every version
        f.seek(8)
        f.write((2).to_bytes(4, "little"))
    with pytest.raises(Exception, match=f"gate layout version 2, this krexd expects {ABI_VERSION}"):
        Gate.open(str(path))
    path.write_bytes(b"\0" * os.path.getsize(path))
    with pytest.raises(Exception, match="not a krex gate"):
        Gate.open(str(path))


def slot(
    i: int,
    state: str,
    tenant: int,
    pid: int,
    waited: int = 0,
    failed: int = 0,
    own: int = 0,
    last: str | None = None,
) -> SlotInfo:
    return SlotInfo(
        i, state, pid, tenant, 0, 0, 0, 0, 0, 0, 0, OomRecord(waited, failed, own, last, False)
    )


def test_ledger_credits_each_count_once_and_keeps_it_after_the_slot_is_freed() -> None:
    a, b = TenantMemory(0, "default"), TenantMemory(0, "default")
    records = {1: a, 2: b}
    ledger = RegistrationLedger()
    ledger.update([slot(0, "active", 1, 100, waited=1)], records)
    ledger.update([slot(0, "active", 1, 100, waited=1)], records)  # no double count
    assert (a.oom_waited, a.oom_cotenant) == (1, 0)
    # The process failed for co-tenants, then ended; the slot was freed (fields kept).
    ledger.update([slot(0, "free", 0, 0, waited=1, failed=1, last="timeout")], records)
    assert (a.oom_waited, a.oom_cotenant, a.last_cotenant_oom, a.outcome) == (
        1,
        1,
        "timeout",
        "cotenant_oom",
    )
    # The slot is reused by tenant 2's process: counts start over, credited to b only.
    ledger.update([slot(0, "active", 2, 200, own=1, last="too_large")], records)
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
