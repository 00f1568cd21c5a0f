"""The slots' memory fields reach krexd through the gate library; records survive slots.

A probe program built against ``krex_gate.h`` writes a slot's ``mem_mib``
and ``oom`` word with the header's own macros into a tenant's slot memory
attached to a gate that krexd's binding created; :meth:`krexd.gate.Gate.registrations`
must read them back decoded, under the tenant krexd attached it for.
The ledger tests feed slot reads in the order a slot's life gives them
(owner counts, owner ends, slot reused).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from krexd.gate import Gate, OomRecord, RegistrationInfo
from krexd.tenancy.memory_records import RegistrationLedger, TenantMemory
from tests.support import REPO, ShimBuild, forget_gate, tenant_env

# Writes slot 5 of tenant argv[2]'s slot memory argv[1] as an owner would (state ACTIVE).
PROBE = r"""
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include "krex_gate.h"
int main(int argc, char **argv)
{
    int fd = argc > 2 ? open(argv[1], O_RDWR) : -1;
    struct krex_tenant_mem *m = fd >= 0 ? krex_tenant_mem_map(fd, atoi(argv[2])) : NULL;
    if (!m)
        return 1;
    struct krex_slot *s = &m->slots[5];
    atomic_store(&s->tenant, 9);
    atomic_store(&s->mem_mib, 300);
    atomic_store(&s->oom, (7u << KREX_OOM_WAITED_SHIFT) | (3u << KREX_OOM_FAILED_SHIFT) |
                              (2u << KREX_OOM_OWN_SHIFT) |
                              ((unsigned)KREX_OOM_IN_REGION << KREX_OOM_LAST_SHIFT) |
                              KREX_OOM_WAITING);
    atomic_store(&s->owner, krex_owner_next(atomic_load(&s->owner), KREX_SLOT_ACTIVE, 4242));
    krex_tenant_mem_unmap(m);
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
    with Gate.create(path, 0) as gate:
        slots_path = tenant_env(gate, 9)["KREX_SLOTS"]
        subprocess.run([str(probe), slots_path, "9"], check=True)
        slots = gate.registrations()
        waiting = gate.waiting_for_memory()
        forget_gate(gate)
    (s,) = slots
    assert (s.index, s.state, s.pid, s.tenant, s.mem_mib) == (5, "active", 4242, 9, 300)
    assert s.oom == OomRecord(waited=7, failed=3, own=2, last="in_region", waiting=True)
    assert waiting == [s]


def test_a_slot_memory_of_another_tenant_is_refused(probe: Path, tmp_path: Path) -> None:
    with Gate.create(str(tmp_path / "gpu0.gate"), 0) as gate:
        slots_path = tenant_env(gate, 9)["KREX_SLOTS"]
        assert subprocess.run([str(probe), slots_path, "8"]).returncode == 1
        forget_gate(gate)


def slot(
    i: int,
    state: str,
    tenant: int,
    pid: int,
    waited: int = 0,
    failed: int = 0,
    own: int = 0,
    last: str | None = None,
) -> RegistrationInfo:
    return RegistrationInfo(
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
    ledger.update([slot(0, "free", 1, 0, waited=1, failed=1, last="timeout")], records)
    assert (a.oom_waited, a.oom_cotenant, a.last_cotenant_oom, a.outcome) == (
        1,
        1,
        "timeout",
        "cotenant_oom",
    )
    # Slot 0 of tenant 2's slot memory: its own counts, credited to b only.
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
