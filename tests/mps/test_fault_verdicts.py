"""FaultMonitor's verdicts against stand-in GPUs and slots (root-free, no driver).

A tenant admitted without MPS is no member of an incident and its own fault record is
not the server's; but it could have joined the server itself (the pipe directory is
readable), so beside it a lone MPS client is not named culprit for being the only one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from krexd.gate import FaultSeen
from krexd.orchestration.faults import FaultMonitor


@dataclass
class _Slot:
    tenant: int
    fault: FaultSeen | None
    pid: int = 1


@dataclass
class _Gate:
    records: list[_Slot] = field(default_factory=list)

    def registrations(self) -> list[_Slot]:
        return list(self.records)


@dataclass
class _Mps:
    log_dir: str = "/nonexistent"


@dataclass
class _Gpu:
    gate: _Gate
    mps: _Mps = field(default_factory=_Mps)
    index: int = 0


@dataclass
class _Tenant:
    id: int
    without_mps: bool = False
    gpu: int = 0
    exit_code: int | None = 1
    signal: int | None = None
    pids: set[int] = field(default_factory=set)


class _Tenants:
    def __init__(self, *tenants: _Tenant) -> None:
        self.all = {t.id: t for t in tenants}

    def on_gpu(self, gpu: int) -> list[_Tenant]:
        return [t for t in self.all.values() if t.gpu == gpu]

    def get(self, tid: int) -> _Tenant | None:
        return self.all.get(tid)


class _Admission:
    def pause(self, gpu: int) -> None:
        pass


FAULT = FaultSeen(700, launched=True, at_sync=False)


def _monitor(gate: _Gate, *tenants: _Tenant) -> FaultMonitor:
    gpus: Any = {0: _Gpu(gate)}
    return FaultMonitor(gpus, _Tenants(*tenants), _Admission(), mps=None)  # type: ignore[arg-type]


def test_a_lone_mps_client_is_culprit() -> None:
    victim = _Tenant(1)
    m = _monitor(_Gate([_Slot(1, FAULT)]), victim)
    verdict = m.verdict(victim)  # type: ignore[arg-type]
    assert verdict is not None and verdict["role"] == "culprit"


def test_beside_a_tenant_without_mps_a_lone_client_is_only_a_suspect() -> None:
    victim, outsider = _Tenant(1), _Tenant(2, without_mps=True)
    # The outsider joined the server on its own and faulted it: its record is not counted.
    m = _monitor(_Gate([_Slot(1, FAULT), _Slot(2, FAULT)]), victim, outsider)
    verdict = m.verdict(victim)  # type: ignore[arg-type]
    assert verdict is not None and verdict["role"] == "suspect"
    assert m.verdict(outsider) is None  # type: ignore[arg-type]
    assert m.incidents[0].members == {1}


def test_a_fault_of_a_tenant_without_mps_alone_opens_no_incident() -> None:
    outsider = _Tenant(2, without_mps=True)
    m = _monitor(_Gate([_Slot(2, FAULT)]), outsider)
    assert m.check(0) is None and m.verdict(outsider) is None  # type: ignore[arg-type]


def test_a_member_that_failed_with_no_record_is_a_suspect() -> None:
    """Seen on the H200: a member refused by the faulted server with an error the shim did
    not record ended 1 with no verdict.  Whatever the error, failing during the incident
    with no record makes it uncertain: a suspect, run again without MPS."""
    faulty, unrecorded, fine = _Tenant(1), _Tenant(2), _Tenant(3, exit_code=0)
    m = _monitor(_Gate([_Slot(1, FAULT), _Slot(2, None), _Slot(3, None)]), faulty, unrecorded, fine)
    verdict = m.verdict(unrecorded)  # type: ignore[arg-type]
    assert verdict is not None and verdict["role"] == "suspect" and verdict["error"] is None
    assert m.verdict(fine) is None  # exited 0: its own exit code
    assert m.totals["suspects"] == 1
