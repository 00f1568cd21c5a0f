"""Region exclusivity by behaviour: sibling commands stop counting during a region.

Real krexd, real cgroups (hybrid or v2), real ``krex run`` commands.  The
siblings here never touch the GPU or krexd after admission, so what stops
them is the cgroup freeze of their whole process tree (paper §4.2 step 4),
including a grandchild each forks and commands admitted during the region.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from typing import Any

import pytest

from tests.coordinator.helpers import (
    Counters,
    holder_argv,
    parse_cycles,
    start_counter,
    start_shell,
    stop_all,
)

pytestmark = [pytest.mark.root]


def _counters(k: Any, nslots: int) -> Counters:
    return Counters(os.path.join(k.workdir, "counters"), nslots)


def test_siblings_and_their_children_stop_during_region(krexd_factory: Any) -> None:
    k = krexd_factory(slots=4)
    c = _counters(k, 4)
    sibs = [start_counter(k, c, 0), start_counter(k, c, 2)]
    try:
        c.wait_running([0, 1, 2, 3])
        run = subprocess.run(
            holder_argv(k, c, "--cycles", "3", "--hold-s", "0.3"),
            env=k.env,
            capture_output=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr.decode()
        cycles = parse_cycles(run.stdout)
        assert len(cycles) == 3
        for cyc in cycles:
            assert cyc["in_region_advanced"] == [], cyc  # siblings + grandchildren frozen
            assert cyc["after_exit_advanced"] == [0, 1, 2, 3], cyc  # all thawed
            assert cyc["stats"]["freeze_ms"] >= 0
        assert c.advancing() == [0, 1, 2, 3]
    finally:
        stop_all(sibs)


def test_command_admitted_during_region_waits_for_exit(krexd_factory: Any) -> None:
    k = krexd_factory(slots=4)
    c = _counters(k, 4)
    sibs = [start_counter(k, c, 0, fork=False)]
    ready = os.path.join(k.workdir, "ready")
    try:
        c.wait_running([0])
        holder = subprocess.Popen(
            holder_argv(k, c, "--hold-s", "2.0", "--ready-file", ready),
            env=k.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _wait_file(ready)
        # Admitted while the region is held: its cgroup is frozen before CMD runs.
        sibs.append(start_counter(k, c, 2))
        out, err = holder.communicate(timeout=60)
        assert holder.returncode == 0, err.decode()
        (cyc,) = parse_cycles(out)
        assert cyc["in_region_advanced"] == []
        c.wait_running([0, 2, 3])  # it runs once the region is over
        late = c.read()
        assert late[2] > 0 and late[3] > 0
    finally:
        stop_all(sibs)


def test_holder_killed_mid_region_is_recovered(krexd_factory: Any) -> None:
    k = krexd_factory(slots=4)
    c = _counters(k, 4)
    sibs = [start_counter(k, c, 0)]
    ready = os.path.join(k.workdir, "ready")
    try:
        c.wait_running([0, 1])
        dying = subprocess.Popen(
            holder_argv(k, c, "--die-in-region", "--ready-file", ready),
            env=k.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _wait_file(ready)
        died_at = time.monotonic()
        dying.wait(30)
        assert dying.returncode == 128 + 9  # SIGKILL, relayed by krex run
        # Siblings resume within 1 s of the holder's death.
        while c.advancing(0.05) != [0, 1]:
            assert time.monotonic() - died_at < 1.0, (
                "siblings still frozen 1 s after the holder died"
            )
        # The region lock passed on: a new holder gets it and sees siblings frozen.
        run = subprocess.run(
            holder_argv(k, c, "--hold-s", "0.3"), env=k.env, capture_output=True, timeout=60
        )
        assert run.returncode == 0, run.stderr.decode()
        (cyc,) = parse_cycles(run.stdout)
        assert cyc["in_region_advanced"] == [] and cyc["after_exit_advanced"] == [0, 1]
        assert k.status()["gpus"][0]["region"]["regions"]["recovered"] == 1
    finally:
        stop_all(sibs)


def test_region_longer_than_max_region_s_is_ended(krexd_factory: Any) -> None:
    k = krexd_factory(slots=4, extra="[region]\nmax_region_s = 1.0\n")
    c = _counters(k, 2)
    sibs = [start_counter(k, c, 0)]
    try:
        c.wait_running([0, 1])
        t0 = time.monotonic()
        run = subprocess.run(
            holder_argv(k, c, "--hold-s", "20"), env=k.env, capture_output=True, timeout=60
        )
        assert time.monotonic() - t0 < 15
        assert run.returncode == 128 + 9, run.stderr.decode()
        assert b"max_region_s" in run.stderr  # krex run says why
        assert c.advancing() == [0, 1]
    finally:
        stop_all(sibs)


def test_regions_are_granted_in_arrival_order(krexd_factory: Any) -> None:
    """FIFO region lock: waiters are granted in the order their requests arrived.

    The test speaks the protocol for five tenant shells (it is not itself a
    tenant, so it is never frozen): A holds the region, B..E ask while A
    holds, and each grant is followed by that holder's exit.
    """
    k = krexd_factory(slots=6)
    shells = [start_shell(k) for _ in range(5)]
    creds = [c for _, c in shells]
    granted: queue.Queue[int] = queue.Queue()

    def enter(i: int) -> None:
        c = creds[i]
        reply = k.request(
            "region_enter",
            {"pid": c["pid"], "tid": c["tid"]},
            timeout_s=60,
            tenant=c["tenant"],
            token=c["token"],
        )
        granted.put(i)
        epochs[i] = reply["epoch"]

    epochs: dict[int, int] = {}
    try:
        first = threading.Thread(target=enter, args=(0,))
        first.start()
        assert granted.get(timeout=30) == 0
        waiters = []
        for i in range(1, 5):
            t = threading.Thread(target=enter, args=(i,))
            t.start()
            waiters.append(t)
            _wait_queue(k, i)
        order = [0]
        for _ in range(4):
            c = creds[order[-1]]
            k.request(
                "region_exit", {"epoch": epochs[order[-1]]}, tenant=c["tenant"], token=c["token"]
            )
            order.append(granted.get(timeout=30))
        c = creds[order[-1]]
        k.request("region_exit", {"epoch": epochs[order[-1]]}, tenant=c["tenant"], token=c["token"])
        assert order == [0, 1, 2, 3, 4]
        for t in [first, *waiters]:
            t.join(10)
    finally:
        stop_all([p for p, _ in shells])


def test_back_to_back_regions_never_let_siblings_run(krexd_factory: Any) -> None:
    """Two holders alternate; exit thaws before it releases, so no region sees siblings run."""
    k = krexd_factory(slots=4)
    c = _counters(k, 2)
    sibs = [start_counter(k, c, 0)]
    try:
        c.wait_running([0, 1])
        holders = [
            subprocess.Popen(
                holder_argv(k, c, "--cycles", "12", "--hold-s", "0.05"),
                env=k.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        for h in holders:
            out, err = h.communicate(timeout=120)
            assert h.returncode == 0, err.decode()
            for cyc in parse_cycles(out):
                assert cyc["in_region_advanced"] == [], cyc
    finally:
        stop_all(sibs)


def test_region_protocol_errors(krexd_factory: Any) -> None:
    k = krexd_factory(slots=4)
    a_proc, a = start_shell(k)
    b_proc, b = start_shell(k)
    try:
        grant = k.request(
            "region_enter", {"pid": a["pid"], "tid": a["tid"]}, tenant=a["tenant"], token=a["token"]
        )
        assert grant["epoch"] > 0
        assert _error(k, "region_enter", {"pid": a["pid"], "tid": a["tid"]}, a) == "NESTED_REGION"
        # exit by a tenant that does not hold the region, and with a stale epoch
        assert _error(k, "region_exit", {"epoch": grant["epoch"]}, b) == "NOT_HOLDER"
        assert _error(k, "region_exit", {"epoch": grant["epoch"] + 7}, a) == "NOT_HOLDER"
        # a tenant may act only on itself: b's token cannot name a's id, b cannot pass a's pid
        forged = {"tenant": a["tenant"], "token": b["token"]}
        assert _error(k, "region_exit", {"epoch": grant["epoch"]}, forged) == "AUTH"
        assert _error(k, "region_enter", {"pid": a["pid"], "tid": a["tid"]}, b) == "BAD_FIELD"
        assert _error(k, "region_enter", {"pid": "x", "tid": 1}, b) == "BAD_FIELD"
        unknown = {"tenant": 999, "token": "0" * 32}
        assert _error(k, "region_enter", {"pid": 1, "tid": 1}, unknown) == "AUTH"
        # b is frozen now (a holds the region); the proper exit thaws it
        done = k.request(
            "region_exit", {"epoch": grant["epoch"]}, tenant=a["tenant"], token=a["token"]
        )
        assert done["region_ms"] > 0
        st = k.status()["gpus"][0]["region"]
        assert st["holder"] is None and st["regions"]["completed"] == 1
    finally:
        stop_all([a_proc, b_proc])


def _error(k: Any, op: str, body: dict[str, Any], who: dict[str, Any]) -> str:
    from krex_client.connection import RemoteError

    try:
        k.request(op, body, tenant=who["tenant"], token=who["token"])
    except RemoteError as exc:
        return exc.name
    raise AssertionError(f"{op} {body} as {who['tenant']} succeeded")


def _wait_file(path: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) or os.path.getsize(path) == 0:
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)


def _wait_queue(k: Any, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while k.status()["gpus"][0]["region"]["queue_length"] < n:
        assert time.monotonic() < deadline, k.status()
        time.sleep(0.02)


def test_region_cancel_withdraws_a_queued_request_and_ends_a_held_region(
    krexd_factory: Any,
) -> None:
    """A client that stops waiting (interrupted) must not leave siblings frozen for nobody."""
    k = krexd_factory(slots=4)
    shells = [start_shell(k) for _ in range(3)]
    a, b, s = (c for _, c in shells)

    def as_(who: dict[str, Any], op: str, body: dict[str, Any], timeout_s: float = 5.0) -> Any:
        return k.request(op, body, timeout_s=timeout_s, tenant=who["tenant"], token=who["token"])

    def states() -> dict[int, str]:
        return {t["id"]: t["state"] for t in k.status()["tenants"]}

    try:
        grant_a = as_(a, "region_enter", {"pid": a["pid"], "tid": a["tid"]})
        outcome: queue.Queue[str] = queue.Queue()

        def b_waits() -> None:
            try:
                as_(b, "region_enter", {"pid": b["pid"], "tid": b["tid"]}, timeout_s=30)
                outcome.put("granted")
            except Exception as exc:  # noqa: BLE001 - the test reads the error's name
                outcome.put(getattr(exc, "name", repr(exc)))

        waiter = threading.Thread(target=b_waits)
        waiter.start()
        _wait_queue(k, 1)
        assert as_(b, "region_cancel", {}) == {"cancelled": "queued"}
        assert outcome.get(timeout=10) == "CANCELLED"
        waiter.join(10)
        as_(a, "region_exit", {"epoch": grant_a["epoch"]})
        # b holds a region, then cancels it: siblings thaw, the lock is free again
        grant_b = as_(b, "region_enter", {"pid": b["pid"], "tid": b["tid"]})
        assert states()[s["tenant"]] == "frozen"
        assert as_(b, "region_cancel", {}) == {"cancelled": "held"}
        assert states()[s["tenant"]] == "running"
        assert k.status()["gpus"][0]["region"]["holder"] is None
        assert _error(k, "region_exit", {"epoch": grant_b["epoch"]}, b) == "NOT_HOLDER"
        assert as_(b, "region_cancel", {}) == {"cancelled": "none"}
    finally:
        stop_all([p for p, _ in shells])


_TWO_THREADS = """
import json, threading, time
from krex_client import region
spans = []
def work():
    for _ in range(5):
        with region.critical():
            with region.critical():  # nested in the same thread: no second request
                t0 = time.monotonic()
                time.sleep(0.02)
                spans.append((t0, time.monotonic()))
ts = [threading.Thread(target=work) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps(sorted(spans)))
"""


def test_threads_of_one_command_take_turns_in_regions(krexd_factory: Any) -> None:
    import json
    import sys

    k = krexd_factory(slots=2)
    run = subprocess.run(
        [*k.krex, "run", "--", sys.executable, "-c", _TWO_THREADS],
        env=k.env,
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr.decode()
    spans = json.loads(run.stdout)
    assert len(spans) == 10
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), "regions overlapped"
    assert k.status()["gpus"][0]["region"]["regions"]["completed"] == 10
