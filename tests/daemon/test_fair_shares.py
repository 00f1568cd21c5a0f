"""No user can stall another: per-uid caps on connections, admitted commands and requests,
idle connections closed, refusals that say why (docs/design/security.md, "Fair shares").

Real krexd, real uids (``tests.daemon.asuser``), default caps unless a test names one.
Each of these fails on a krexd without the caps: there, one user's connections, slots or
status requests stall the other's commands.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable

import pytest

from tests.daemon.test_identity import USER_A, USER_B, as_user, finish
from tests.support import wait_for
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]
OPEN = {"daemon": {"socket_mode": "0666"}}

# Held connections of user A: raw Unix sockets (libzmq accepts them and reads SO_PEERCRED).
HOLD = """
import resource, socket
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range({n}):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["KREX_SOCKET"])
    held.append(s)
print("held", len(held), flush=True)
time.sleep({hold_s})
"""


def test_one_users_connections_leave_room_for_another(krexd_factory: Factory) -> None:
    """A holds 1,100 idle connections: B's status and run still work; A's own run is told why."""
    k = krexd_factory(config=OPEN)
    holder = as_user(k, USER_A, "py", HOLD.format(n=1100, hold_s=30))
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("held")
        time.sleep(0.5)
        t = time.monotonic()
        rc, out, err = finish(as_user(k, USER_B, "krexctl", "status"), 20)
        assert rc == 0, err
        rc, out, err = finish(as_user(k, USER_B, "krex", "run", "--", "true"), 20)
        assert rc == 0, err
        assert time.monotonic() - t < 10
        time.sleep(2.5)  # A's own refused connections have had their time to read why
        rc, out, err = finish(as_user(k, USER_A, "krex", "run", "--", "true"), 20)
        assert rc == 69, (rc, err)
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "TOO_MANY" in lines[0], err
        assert "max_connections_per_uid" in lines[0], err
        conns = k.status()["connections"]
        assert conns["max_per_uid"] == 128 and conns["refused"] >= 900, conns
    finally:
        holder.kill()
        holder.wait()


def test_idle_connections_are_closed_and_clients_reconnect(krexd_factory: Factory) -> None:
    k = krexd_factory(config={"daemon": {"idle_timeout_s": 1.0}})
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(k.socket)
    from krex_client.connection import Connection

    with Connection(k.socket, timeout_s=5.0) as conn:
        conn.request("ping")
        time.sleep(2.5)
        raw.settimeout(0.5)
        data = b"x"
        try:
            while data:
                data = raw.recv(4096)
        except TimeoutError:
            pytest.fail("an idle connection was not closed")
        conn.request("ping")  # the closed connection's client reconnected by itself
    raw.close()
    assert k.status()["connections"]["idle_closed"] >= 2


def test_one_user_cannot_take_every_slot(krexd_factory: Factory) -> None:
    """Default cap: half the slots. A's five commands hold 2 of 4; B starts at once."""
    k = krexd_factory(config=OPEN)
    hogs = [as_user(k, USER_A, "krex", "run", "--", "sleep", "30") for _ in range(5)]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = k.status()
            if len(st["tenants"]) >= 2 and st["queue"]["parked"] >= 3:
                break
            time.sleep(0.2)
        assert k.status()["queue"]["parked"] >= 3
        t = time.monotonic()
        rc, _, err = finish(as_user(k, USER_B, "krex", "run", "--", "true"), 30)
        assert rc == 0, err
        assert time.monotonic() - t < 8
        assert sum(1 for x in k.status()["tenants"] if x.get("uid") == USER_A[0]) == 2
    finally:
        for p in hogs:
            p.kill()
        for p in hogs:
            p.wait()


FLOOD = """
import msgpack, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
s.send(msgpack.packb({"v": 1, "id": 1, "op": "ping", "body": {}}))
assert s.poll(10_000)
s.recv()
frames = [msgpack.packb({"v": 1, "id": i, "op": "status", "body": {}}) for i in range(40)]
for f in frames:
    s.send(f)
names = []
for _ in frames:
    assert s.poll(10_000)
    r = msgpack.unpackb(s.recv())
    names.append("ok" if r["ok"] else r["error"]["name"] + " " + r["error"]["message"])
print(json.dumps(names))
"""


def test_a_users_status_requests_are_capped(krexd_factory: Factory) -> None:
    k = krexd_factory(config=OPEN)
    rc, out, err = finish(as_user(k, USER_A, "py", FLOOD), 30)
    assert rc == 0, err
    assert "TOO_MANY" in out and "max_status_per_uid" in out, out
    assert '"ok"' in out
    p = subprocess.run([*k.krexctl, "status"], env=k.env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


PACED = """
import msgpack, time, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
ok = sent = 0
end = time.monotonic() + 2.0
for _ in range(4):  # max_status_per_uid outstanding, resent at each reply
    s.send(msgpack.packb({"v": 1, "id": sent, "op": "status", "body": {}}))
    sent += 1
while time.monotonic() < end:
    if not s.poll(100):
        continue
    ok += msgpack.unpackb(s.recv())["ok"]
    s.send(msgpack.packb({"v": 1, "id": sent, "op": "status", "body": {}}))
    sent += 1
print(json.dumps({"ok": ok}), flush=True)
"""


def flood_beside_b(k: Krexd, flood_code: str, settle_s: float) -> tuple[int, float]:
    """Run ``flood_code`` as user A; ``settle_s`` into it, time user B's ``krexctl status``.

    Returns (A's ``ok`` count, printed last by the flood as JSON; B's seconds).
    """
    flood = as_user(k, USER_A, "py", flood_code)
    time.sleep(settle_s)
    started = time.monotonic()
    rc, _, err = finish(as_user(k, USER_B, "krexctl", "status"), 20)
    b_s = time.monotonic() - started
    assert rc == 0, err
    rc, out, err = finish(flood, 30)
    assert rc == 0, err
    return int(json.loads(out.strip().splitlines()[-1])["ok"]), b_s


@pytest.mark.parametrize("per_s", [5.0, 0.0])
def test_a_users_status_loop_is_paced_and_others_are_served(
    krexd_factory: Factory, per_s: float
) -> None:
    """User A resends status at each reply for 2 s: with a pace of 5 per second A gets
    about 10 answered (without one, hundreds), and user B's status is answered at once."""
    k = krexd_factory(config={"daemon": {"socket_mode": "0666", "status_per_s_per_uid": per_s}})
    served, b_s = flood_beside_b(k, PACED, 0.5)
    if per_s:
        assert served <= 2.0 * per_s + 2, served
        assert b_s < 5.0, b_s  # B's own first status is due at once (a fresh process)
    else:
        assert served > 4 * 2.0 * 5.0, served  # the pace is what bounds it


QUEUED = """
import msgpack, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
for i in range(3):  # one served at once, two waiting in the lane (one per second)
    s.send(msgpack.packb({"v": 1, "id": i, "op": "status", "body": {}}))
print("sent", flush=True)
names = []
while len(names) < 3 and s.poll(20_000):
    r = msgpack.unpackb(s.recv())
    names.append("ok" if r["ok"] else r["error"]["name"])
print(json.dumps(names), flush=True)
"""


def test_status_requests_waiting_in_the_lane_are_answered_when_krexd_stops(
    krexd_factory: Factory,
) -> None:
    k = krexd_factory(config={"daemon": {"socket_mode": "0666", "status_per_s_per_uid": 0.2}})
    p = as_user(k, USER_A, "py", QUEUED)
    assert p.stdout is not None and p.stdout.readline().strip() == "sent"
    wait_for(lambda: k.status()["server"]["lanes"]["bulk_queued"] == 2, what="2 queued")
    k.proc.terminate()  # a stop
    rc, out, err = finish(p, 30)
    assert rc == 0, err
    assert len(json.loads(out.strip().splitlines()[-1])) == 3, out


ADMIT_LOOP = """
import msgpack, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect("ipc://" + os.environ["KREX_SOCKET"])
def send(i):  # never placed: the granted ones squat until place_timeout_s
    s.send(msgpack.packb({"v": 1, "id": i, "op": "admit",
                          "body": {"argv": ["sleep", "60"], "exclusive": False}}))
for i in range(20):
    send(i)
replies, i = 0, 20
end = time.monotonic() + 2.0
while time.monotonic() < end:
    if s.poll(100):
        s.recv()
        replies += 1
        send(i)
        i += 1
print(json.dumps({"replies": replies}), flush=True)
"""


def test_a_users_refused_admits_resent_at_each_reply_are_not_a_busy_loop(
    krexd_factory: Factory,
) -> None:
    """A keeps 20 admits outstanding (2 may park), resending at each reply for 2 s: the
    refusals come a second apart per request (about 40 in all; thousands without the
    pause, which raised another user's entry p50 from 2 to 29 ms, docs/bench)."""
    k = krexd_factory(
        config={"daemon": {"socket_mode": "0666"}, "admission": {"max_parked_per_uid": 2}}
    )
    rc, out, err = finish(as_user(k, USER_A, "py", ADMIT_LOOP), 30)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["replies"] <= 80, out
