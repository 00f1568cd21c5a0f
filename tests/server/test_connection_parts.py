"""The connection guard's parts, each alone (root-free).

* ``krexd.server.conn_caps``: the caps in all and per uid (root exempt from the
  latter), the bound on refused connections waiting;
* ``krexd.server.conn_pace``: a uid's pace (burst, wait, refusal with ``retry_s``,
  root's region op not held), requests held in order and bounded;
* ``krexd.server.conn_events``: an acceptance ended in the same batch is dropped;
* ``krexd.server.conn_trim``: a trim after a quiet burst, once more later.
"""

from __future__ import annotations

import asyncio

import pytest
import zmq

from krexd.server import conn_trim
from krexd.server.conn_caps import REFUSING_MAX, REFUSING_PER_UID, ConnectionCaps
from krexd.server.conn_events import changes
from krexd.server.conn_pace import DROP, HELD_MAX, START, HeldRequests, UidPace


def test_caps_in_all_and_per_uid() -> None:
    caps = ConnectionCaps(max_connections=3, per_uid=2)
    assert caps.over_cap(1000, 0) == ""
    caps.opened(1000, refused=False)
    caps.opened(1000, refused=False)
    assert "max_connections_per_uid" in caps.over_cap(1000, 2)
    assert caps.over_cap(0, 2) == "", "root is exempt from the per-uid cap"
    assert "max_connections" in caps.over_cap(0, 3), "... not from the cap in all"
    caps.opened(1001, refused=True)  # refused ones waiting are not served
    assert caps.over_cap(1001, 3) == "" and caps.of_uid(1000) == 2 and caps.of_uid(1001) == 0
    caps.closed(1000, refused=False)
    assert caps.of_uid(1000) == 1


def test_refused_connections_waiting_are_bounded_per_uid_and_in_all() -> None:
    caps = ConnectionCaps(max_connections=1)
    for _ in range(REFUSING_PER_UID):
        assert not caps.refusing_full(7)
        caps.opened(7, refused=True)
    assert caps.refusing_full(7) and not caps.refusing_full(8)
    for uid in range(100, 100 + REFUSING_MAX):
        caps.opened(uid, refused=True)
    assert caps.refusing_full(8)
    caps.refuse("full")
    assert caps.refused == 1


def test_a_uids_pace_serves_its_burst_then_holds_then_refuses() -> None:
    pace = UidPace(per_s=10.0, burst=2)
    now = 100.0
    assert pace.charge(1000, now).wait_s == 0 and pace.charge(1000, now).wait_s == 0
    held = pace.charge(1000, now)
    assert not held.refusal and 0 < held.wait_s <= 1.0
    for _ in range(20):
        last = pace.charge(1000, now)
    assert "connections_per_s_per_uid" in last.refusal and last.retry_s >= 0.1
    assert pace.charge(1001, now).wait_s == 0, "another uid has its own burst"
    status = pace.status()
    assert status["per_s_per_uid"] == 10.0 and status["burst_per_uid"] == 2
    assert status["paced"] >= 1 and status["refused_rate"] >= 1


def test_held_requests_start_in_order_and_are_bounded() -> None:
    async def run() -> tuple[list[str], bool]:
        held = HeldRequests(ready_at=0.0)
        got: list[str] = []
        due = asyncio.Event()
        added = [
            held.add(lambda how, i=i: got.append(f"{i}:{how}"), due.set) for i in range(HELD_MAX)
        ]
        over = held.add(lambda how: got.append("over"), due.set)
        assert all(added) and held.active
        await due.wait()
        held.release(START)
        return got, over

    got, over = asyncio.run(run())
    assert not over
    assert got == [f"{i}:{START}" for i in range(HELD_MAX)]


def test_a_failing_continuation_does_not_stop_the_others() -> None:
    async def run() -> list[str]:
        held = HeldRequests(ready_at=1e12)  # never due
        got: list[str] = []

        def boom(how: str) -> None:
            raise RuntimeError(how)

        held.add(boom, lambda: None)
        held.add(got.append, lambda: None)
        held.release(DROP)
        assert not held.active
        return got

    assert asyncio.run(run()) == [DROP]


def test_an_acceptance_ended_in_the_same_batch_is_dropped() -> None:
    acc, gone = zmq.EVENT_ACCEPTED, zmq.EVENT_DISCONNECTED
    batch = [(acc, 5), (acc, 6), (gone, 5), (gone, 9), (acc, 5)]
    assert changes(batch) == [(True, 6), (False, 5), (False, 9), (True, 5)]


def test_a_quiet_burst_is_trimmed_then_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[float] = []
    monkeypatch.setattr(conn_trim, "malloc_trim", lambda: trims.append(1))
    trim = conn_trim.BurstTrim()
    for _ in range(conn_trim.TRIM_AFTER):
        trim.opened(10.0)
    trim.tick(10.1)
    assert trims == [], "not quiet yet"
    trim.tick(10.0 + conn_trim.TRIM_QUIET_S + 0.01)
    assert len(trims) == 1
    trim.tick(11.0)
    assert len(trims) == 1
    trim.tick(10.6 + conn_trim.TRIM_AGAIN_S)
    assert len(trims) == 2
    trim.tick(100.0)
    assert len(trims) == 2, "nothing more until the next burst"
