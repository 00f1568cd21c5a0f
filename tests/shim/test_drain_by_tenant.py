"""The drain tenant by tenant (``Gate.drain``'s ``settled``, ``krex_coord_wait_change``).

krexd freezes each sibling tenant as soon as it has drained: the drain
reports the tenants still pending after each change of the pending set,
and stops waiting for the tenants krexd took.  Tenant processes are
``tests/shim/c/gate_tenant.c`` (no driver), as in ``test_gate.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import pytest

from krexd.gate import Gate, GateTimeout
from krexd.gate.readback import RegistrationInfo

from .procs import Tenant, slot_of, wait_for

HOLDER = 1


class Reports:
    """A ``settled`` callback that records (seconds since start, pending set) and takes nothing."""

    def __init__(self, take: Callable[[set[int]], Iterable[int]] = lambda p: []) -> None:
        self.start = time.monotonic()
        self.seen: list[tuple[float, frozenset[int]]] = []
        self.threads: set[int] = set()
        self._take = take

    def __call__(self, pending: set[int]) -> Iterable[int]:
        self.seen.append((time.monotonic() - self.start, frozenset(pending)))
        self.threads.add(threading.get_ident())
        return self._take(pending)


def test_a_drained_tenant_is_reported_while_another_is_pending(
    gate: Gate, spawn: Callable[..., Tenant]
) -> None:
    stuck = spawn(2, "--stuck", "--calls", "1")  # a call that never returns: tenant 2 ...
    mate = spawn(2)  # ... never drains, though its other process does
    quick = [spawn(3), spawn(3)]
    for t in (stuck, mate, *quick):
        t.wait_ready()
    wait_for(lambda: slot_of(gate, 2, stuck.stats()["slot"]).inflight == 1, what="stuck call")
    gate.close(HOLDER, 1)
    reports = Reports()
    with pytest.raises(GateTimeout) as exc:
        gate.drain(HOLDER, 1, 2.0, reports)
    assert {s.tenant for s in exc.value.pending} == {2}
    assert [s.ack_epoch for s in gate.registrations() if s.pid == mate.pid] == [1]
    assert reports.seen, "settled never called"
    assert all(2 in p for _, p in reports.seen), reports.seen
    # Tenant 3 drained long before the timeout, and the drain said so at once.
    at = next(t for t, p in reports.seen if p == {2})
    assert at < 1.0, reports.seen  # long before the 2 s timeout
    assert reports.threads == {threading.get_ident()}  # called in the drain's own thread
    gate.reopen(HOLDER, 1)


def test_the_tenants_taken_are_not_waited_for(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    never = spawn(2, "--no-ack")
    other = spawn(3)
    for t in (never, other):
        t.wait_ready()
    gate.close(HOLDER, 4)
    reports = Reports(take=lambda pending: [2] if 2 in pending else [])
    t0 = time.monotonic()
    gate.drain(HOLDER, 4, 5.0, reports)  # tenant 2 taken: only tenant 3 is waited for
    assert time.monotonic() - t0 < 1.0
    assert reports.seen[0][1] >= {2}
    acks = {s.tenant: s.ack_epoch for s in gate.registrations()}
    assert acks == {2: 0, 3: 4}
    gate.reopen(HOLDER, 4)


def test_an_error_in_settled_ends_the_drain(gate: Gate, spawn: Callable[..., Tenant]) -> None:
    spawn(2, "--no-ack").wait_ready()
    gate.close(HOLDER, 2)

    def fail(pending: set[int]) -> Iterable[int]:
        raise PermissionError(13, "cgroup.freeze")

    with pytest.raises(PermissionError):
        gate.drain(HOLDER, 2, 5.0, fail)
    gate.reopen(HOLDER, 2)


@pytest.mark.parametrize("judged", [False, True], ids=["no-judge", "judged"])
def test_a_waiting_drain_sleeps(gate: Gate, spawn: Callable[..., Tenant], judged: bool) -> None:
    """Parked on every pending acknowledgement at once (futex_waitv), not polling.

    With a judge the drain wakes to judge the pending owners, backing off
    from 5 to 40 ms between judgements: about 30 wake-ups in the second.
    """
    for tenant in (2, 3, 4):
        spawn(tenant, "--no-ack").wait_ready()
    judgements = []

    def judge(slot: RegistrationInfo) -> bool:
        judgements.append(time.monotonic())
        return True

    gate.judge = judge if judged else None  # without: no /proc reads, the wait alone
    gate.close(HOLDER, 3)
    cpu0 = time.thread_time()
    with pytest.raises(GateTimeout) as exc:
        gate.drain(HOLDER, 3, 1.0, Reports())
    cpu = time.thread_time() - cpu0
    assert {s.tenant for s in exc.value.pending} == {2, 3, 4}
    assert cpu < 0.2  # a busy loop would take most of the 1 s
    # 3 owners judged at each wake-up: from 1 ms, then every 5, 10, 20, 40, 40, ... ms.
    assert len(judgements) <= (3 * 35 if judged else 0), len(judgements)
    gate.reopen(HOLDER, 3)
