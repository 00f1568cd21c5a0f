"""The slot's fault record (layout 8): the first fatal CUDA error a process saw.

Real shim over the fake driver: fakebench launches a faulting kernel
(``--fault-after``); the next call returns CUDA_ERROR_ILLEGAL_ADDRESS, and
the shim writes it, with "had launched kernels", in the process's slot of
its tenant's slot memory.  Under the fake MPS server a new client of the
faulted server (refused with CUDA_ERROR_DEVICE_UNAVAILABLE at its first
context) records it without that flag.  krexd reads the word as a tenant's
claim: bits outside the record's fields are dropped.
"""

from __future__ import annotations

import mmap
import struct
import subprocess
from pathlib import Path

from krexd.gate import FaultSeen, Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, tenant_env

#: struct krex_tenant_mem: 64-byte header, then 128-byte slots; krex_slot.fault at 80.
_SLOT0, _SLOT_SIZE, _FAULT_AT = 64, 128, 80


def _run(fc: FakeCuda, shim: ShimBuild, gate: Gate, tenant: int, *args: str, **env: str) -> int:
    e = fc.env(LD_PRELOAD=str(shim.shim), **tenant_env(gate, tenant), **env)
    return subprocess.run(
        [str(fc.build.fakebench), *args], env=e, capture_output=True, timeout=60
    ).returncode


def _faults(gate: Gate) -> dict[int, FaultSeen | None]:
    return {s.tenant: s.fault for s in gate.registrations() if s.tenant}


def test_the_faulting_process_records_its_error(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    assert _run(fc, shim_build, gate, 2, "--count", "3") == 0
    assert _run(fc, shim_build, gate, 3, "--count", "50", "--fault-after", "4") == 1
    faults = _faults(gate)
    assert faults[2] is None, "a healthy process recorded a fault"
    assert faults[3] == FaultSeen(code=700, launched=True, at_sync=False)


def test_a_client_of_a_faulted_mps_server_records_it_without_launches(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate, tmp_path: Path
) -> None:
    mps = {"KREX_FAKE_MPS": "1", "KREX_FAKE_MPS_STATE": str(tmp_path / "server")}
    assert _run(fc, shim_build, gate, 3, "--count", "50", "--fault-after", "4", **mps) == 1
    assert _run(fc, shim_build, gate, 4, "--count", "5", **mps) == 1
    faults = _faults(gate)
    assert faults[3] == FaultSeen(code=700, launched=True, at_sync=False)
    seen = faults[4]
    # Refused by the faulted server: CUDA_ERROR_DEVICE_UNAVAILABLE.
    assert seen is not None and seen.code == 46 and not seen.launched


def test_a_forged_record_is_read_only_within_its_fields(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    """The tenant writes the word: krexd keeps only code, launched and at_sync."""
    assert _run(fc, shim_build, gate, 5, "--count", "50", "--fault-after", "4") == 1
    (slot,) = [s for s in gate.registrations() if s.tenant == 5]
    fd = gate.__dict__["_test_slot_fds"][5]
    with mmap.mmap(fd, 0) as m:  # the tenant's own (read-write) view of its slot memory
        at = _SLOT0 + _SLOT_SIZE * slot.index + _FAULT_AT
        assert struct.unpack_from("<I", m, at)[0] == 700 | 0x10000
        struct.pack_into("<I", m, at, 0xFFFC0000)  # only undefined bits: no record
        assert _faults(gate)[5] is None
        struct.pack_into("<I", m, at, 0xFFFFFFFF)
        assert _faults(gate)[5] == FaultSeen(code=0xFFFF, launched=True, at_sync=True)
