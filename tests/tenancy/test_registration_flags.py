"""Flags of the slot memories that pause others: verified owners, bounded time (root-free).

``krexd.tenancy.registration_flags`` and the gate watch's sweep over fake gates and a fake
``/proc``: the sweep's cost is counted in identity reads (one per process,
not one per (slot, process)), ignored slots are not read again, a memory
wait is honoured only for a verified process and only for its bound (time
while the tenant is frozen not counted), and past it the tenant is named.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from krexd.gate import OomRecord, RegistrationInfo
from krexd.orchestration.gatewatch import GateWatch
from krexd.tenancy import registrations, states
from krexd.tenancy.registration_flags import RegistrationFlags
from krexd.tenancy.registrations import Identity, Verifier

TENANT = 5
PIDS = list(range(1000, 1000 + 4096))


def slot(index: int, pid: int, *, waiting: bool = False, ignored: bool = False) -> RegistrationInfo:
    """A registration of tenant ``TENANT`` naming ``pid`` (pid namespace 1, start 7)."""
    return RegistrationInfo(
        index=index,
        state="dead" if ignored else "active",
        pid=pid,
        tenant=TENANT,
        inflight=0,
        ack_epoch=0,
        captures=0,
        gated_calls=0,
        blocked_calls=0,
        last_drain_ns=0,
        mem_mib=100,
        oom=OomRecord(waiting=waiting),
        owner=pid << 32 | 2,
        start_ticks=7,
        image=0x7000_0000 | 1,
        pidns=1,
        ignored=ignored,
    )


class FakeGate:
    """The gate the watch sweeps: fixed slots, ignores recorded."""

    path = "gpu0.gate"
    word = None

    def __init__(self, slots: list[RegistrationInfo]) -> None:
        self._slots = slots
        self.ignored: list[RegistrationInfo] = []

    def registrations(self) -> list[RegistrationInfo]:
        return list(self._slots)

    def ignore(self, s: RegistrationInfo) -> None:
        self.ignored.append(s)

    def relink(self) -> bool:
        return True

    def audit(self) -> list[Any]:
        return []


class Tenants:
    """The registry as the watch and the flags use it: get and iterate."""

    def __init__(self, *tenants: Any) -> None:
        self._t = {t.id: t for t in tenants}

    def get(self, tid: int) -> Any:
        return self._t.get(tid)

    def __iter__(self) -> Any:
        return iter(self._t.values())


@pytest.fixture
def proc(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A fake /proc: every pid of ``PIDS`` lives in pid namespace 1, started at 7, shim
    mapped; ``identity`` reads are counted in the returned list."""
    calls: list[int] = []

    def identity(pid: int) -> Identity | None:
        calls.append(pid)
        return Identity(pid, pid, 1, 7) if pid in range(1000, 1000 + 4096) else None

    monkeypatch.setattr(registrations, "identity", identity)
    monkeypatch.setattr(registrations, "image_mapped", lambda pid, image: True)
    return calls


def watch_over(gate: FakeGate, tenant: Any, flags: RegistrationFlags | None = None) -> GateWatch:
    gpu = SimpleNamespace(index=0, gate=gate, coordinator=SimpleNamespace(idle=lambda: True))
    verifier = flags._verifier if flags is not None else Verifier(lambda t: PIDS)
    killed.clear()
    return GateWatch(
        {0: gpu},  # type: ignore[dict-item]
        Tenants(tenant),  # type: ignore[arg-type]
        verifier,
        lambda t, reason, code, cause="other": killed.append((t.id, reason, code)),
        flags=flags,
    )


killed: list[tuple[int, str, int]] = []


def test_the_sweep_reads_each_process_once_and_skips_ignored_slots(proc: list[int]) -> None:
    """128 forged slots over 4,096 processes: one read per process, not 524,288."""
    tenant = SimpleNamespace(id=TENANT, state=states.RUNNING, kill_reason=None)
    forged = [slot(i, 90_000 + i) for i in range(128)]  # no such process in the cgroup
    gate = FakeGate(forged)
    watch = watch_over(gate, tenant)
    watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
    assert len(proc) <= len(PIDS) + len(forged), len(proc)
    assert len(gate.ignored) == 128
    proc.clear()
    gate._slots = [slot(i, 90_000 + i, ignored=True) for i in range(128)]
    watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
    assert proc == [], "ignored slots are not verified again"


def test_a_memory_wait_is_honoured_for_a_verified_process_within_its_bound(
    proc: list[int],
) -> None:
    now = [100.0]
    tenant = SimpleNamespace(id=TENANT, state=states.RUNNING, kill_reason=None)
    flags = RegistrationFlags(Verifier(lambda t: PIDS), Tenants(tenant), 3.0, clock=lambda: now[0])  # type: ignore[arg-type]
    honest, forged = slot(0, 1000, waiting=True), slot(1, 90_000, waiting=True)
    gate = FakeGate([honest, forged])
    assert not flags.waits_honoured(gate, [forged]), "a slot of no process is not honoured"
    assert gate.ignored == [forged]
    assert flags.waits_honoured(gate, [honest])
    watch = watch_over(gate, tenant, flags)
    gate._slots = [honest]
    for _ in range(20):  # 2 s running
        watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
        now[0] += 0.1
    tenant.state = states.FROZEN
    for _ in range(50):  # 5 s frozen by a region: not counted
        watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
        now[0] += 0.1
    assert flags.waits_honoured(gate, [honest]) and killed == []
    tenant.state = states.RUNNING
    for _ in range(12):  # 1.2 s more: past 3 s honoured
        watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
        now[0] += 0.1
    assert not flags.waits_honoured(gate, [honest]), "not honoured past its bound"
    assert [(t, code) for t, _, code in killed][:1] == [(TENANT, 79)]
    assert "claimed to wait for GPU memory" in killed[0][1]


def test_a_new_wait_starts_a_new_bound(proc: list[int]) -> None:
    """An absorbed wait bumps the record's count: the next wait is honoured afresh."""
    now = [0.0]
    tenant = SimpleNamespace(id=TENANT, state=states.RUNNING, kill_reason=None)
    flags = RegistrationFlags(Verifier(lambda t: PIDS), Tenants(tenant), 3.0, clock=lambda: now[0])  # type: ignore[arg-type]
    gate = FakeGate([slot(0, 1000, waiting=True)])
    watch = watch_over(gate, tenant, flags)
    for n in range(60):  # 6 s of back-to-back waits, each absorbed after 2 s
        s = slot(0, 1000, waiting=True)
        gate._slots = [
            RegistrationInfo(**{**s.__dict__, "oom": OomRecord(waited=n // 20, waiting=True)})
        ]
        watch._sweep(watch._gpus[0])  # type: ignore[arg-type]
        now[0] += 0.1
    assert killed == [] and flags.waits_honoured(gate, gate._slots)
