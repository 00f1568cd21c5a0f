"""The gate slot's fault record (layout 5): the first fatal CUDA error a process saw.

Real shim over the fake driver: fakebench launches a faulting kernel
(``--fault-after``); the next call returns CUDA_ERROR_ILLEGAL_ADDRESS, and
the shim writes it, with "had launched kernels", in the process's slot.
Under the fake MPS server a new client of the faulted server (refused with
CUDA_ERROR_MPS_SERVER_NOT_READY at its first context) records it without
that flag.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from krexd.gate import FaultSeen, Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild


def _run(fc: FakeCuda, shim: ShimBuild, gate: Gate, tenant: str, *args: str, **env: str) -> int:
    e = fc.env(LD_PRELOAD=str(shim.shim), KREX_GATE=gate.path, KREX_TENANT=tenant, **env)
    return subprocess.run(
        [str(fc.build.fakebench), *args], env=e, capture_output=True, timeout=60
    ).returncode


def _faults(gate: Gate) -> dict[int, FaultSeen | None]:
    return {s.tenant: s.fault for s in gate.slots() if s.tenant}


def test_the_faulting_process_records_its_error(
    shim_build: ShimBuild, fc: FakeCuda, tmp_path: Path
) -> None:
    with Gate.create(str(tmp_path / "g.gate"), 0, nslots=8) as gate:
        assert _run(fc, shim_build, gate, "2", "--count", "3") == 0
        assert _run(fc, shim_build, gate, "3", "--count", "50", "--fault-after", "4") == 1
        faults = _faults(gate)
    assert faults[2] is None, "a healthy process recorded a fault"
    assert faults[3] == FaultSeen(code=700, launched=True, at_sync=False)


def test_a_client_of_a_faulted_mps_server_records_it_without_launches(
    shim_build: ShimBuild, fc: FakeCuda, tmp_path: Path
) -> None:
    mps = {"KREX_FAKE_MPS": "1", "KREX_FAKE_MPS_STATE": str(tmp_path / "server")}
    with Gate.create(str(tmp_path / "g.gate"), 0, nslots=8) as gate:
        assert _run(fc, shim_build, gate, "3", "--count", "50", "--fault-after", "4", **mps) == 1
        assert _run(fc, shim_build, gate, "4", "--count", "5", **mps) == 1
        faults = _faults(gate)
    assert faults[3] == FaultSeen(code=700, launched=True, at_sync=False)
    seen = faults[4]
    assert seen is not None and seen.code == 807 and not seen.launched  # refused by the server
