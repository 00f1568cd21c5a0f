"""One user's connection churn is paced (``[daemon] connections_per_s_per_uid``): the
churner is held to the rate, another user is served at once, krex clients over the
rate are told when to ask again and do so by themselves (docs/design/security.md,
"Fair shares"; krexd/server/connections.py).

Real krexd, real uids (``tests.daemon.asuser``).  Without the pace the churner gets
every ping answered (hundreds in the test's seconds) and a client over it has nothing
to wait for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from tests.daemon.test_fair_shares import flood_beside_b
from tests.daemon.test_identity import USER_A, as_user, finish
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]

# New connections, 8 at a time, one ping each, each waited for (up to 3 s), then closed.
CHURN = """
import msgpack, zmq
ctx = zmq.Context()
frame = msgpack.packb({"v": 1, "id": 1, "op": "ping", "body": {}})
ok = refused = 0
end = time.monotonic() + 3.0
while time.monotonic() < end:
    socks = []
    for _ in range(8):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect("ipc://" + os.environ["KREX_SOCKET"])
        s.send(frame)
        socks.append(s)
    for s in socks:
        if s.poll(3000):
            r = msgpack.unpackb(s.recv())
            ok += r["ok"]
            refused += not r["ok"]
        s.close()
print(json.dumps({"ok": ok, "refused": refused}), flush=True)
"""


def _config(per_s: float, burst: int) -> dict[str, dict[str, object]]:
    return {
        "daemon": {
            "socket_mode": "0666",
            "connections_per_s_per_uid": per_s,
            "connection_burst_per_uid": burst,
        }
    }


@pytest.mark.parametrize("per_s", [10.0, 0.0])
def test_a_users_connection_churn_is_held_to_the_rate(krexd_factory: Factory, per_s: float) -> None:
    """A churns for 3 s: with 10/s after a burst of 10 it gets at most ~45 pings
    answered (without a pace, hundreds); B's status is answered at once meanwhile."""
    k = krexd_factory(config=_config(per_s, 10))
    served, b_s = flood_beside_b(k, CHURN, 1.0)
    conns = k.status()["connections"]
    if per_s:
        assert served <= 10 + per_s * 3.5, (served, conns)
        assert conns["paced"] > 0, conns
        assert b_s < 5.0, b_s  # a fresh krexctl process on a busy host; the flood is 3 s
    else:
        assert served > 80, served  # what the pace bounds (45 with it)
        assert conns["paced"] == 0, conns


# Eight krex clients at once, each on a connection of its own (ping, 5 s timeout).
BURST = """
import threading
done, errors = [], []
def one():
    try:
        with Connection(timeout_s=5) as c:
            c.request("ping")
        done.append(1)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=one) for _ in range(8)]
t = time.monotonic()
for th in threads:
    th.start()
for th in threads:
    th.join()
print(json.dumps({"done": len(done), "errors": errors, "s": time.monotonic() - t}), flush=True)
"""


def test_clients_over_the_rate_wait_or_ask_again_and_all_are_served(
    krexd_factory: Factory,
) -> None:
    """2/s after a burst of 1: five start within 2 s, the other three are refused with
    when to ask again, ask again by themselves, and every request is served."""
    k = krexd_factory(config=_config(2.0, 1))
    rc, out, err = finish(as_user(k, USER_A, "py", BURST), 60)
    assert rc == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["errors"] == [] and res["done"] == 8, res
    assert res["s"] >= 3.0, res  # 8 connections at 2/s after 1: the pace was kept
    conns = k.status()["connections"]
    assert conns["paced"] >= 4 and conns["refused_rate"] >= 1, conns


def test_root_is_not_paced(krexd_factory: Factory) -> None:
    k = krexd_factory(config=_config(2.0, 1))
    rc, out, err = finish(as_user(k, (0, 0), "py", BURST), 60)
    assert rc == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["done"] == 8 and res["s"] < 2.0, res
    assert k.status()["connections"]["paced"] == 0


# Connect, send one ping, close without waiting: as fast as possible, 300 times.
FIRE_AND_FORGET = """
import msgpack, zmq
ctx = zmq.Context()
frame = msgpack.packb({"v": 1, "id": 1, "op": "ping", "body": {}})
for _ in range(300):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)  # the ping is sent before the close
    s.connect("ipc://" + os.environ["KREX_SOCKET"])
    s.send(frame)
    s.close()
print("done", flush=True)
"""


def test_a_client_that_does_not_wait_for_replies_gets_no_more_served(
    krexd_factory: Factory,
) -> None:
    """A request whose connection is gone before krexd reads it is dropped, not served
    uncharged: 300 fire-and-forget pings at 1/s after a burst of 1 get a handful served."""
    k = krexd_factory(config=_config(1.0, 1))
    before = k.status()["server"]
    t = time.monotonic()
    rc, _, err = finish(as_user(k, USER_A, "py", FIRE_AND_FORGET), 60)
    assert rc == 0, err
    time.sleep(1.5)  # whatever was held is released or abandoned
    after = k.status()["server"]
    served = (after["requests"] - before["requests"] - 1) - (after["errors"] - before["errors"])
    assert served <= 2 + 1.0 * (time.monotonic() - t), (served, after["refused"])


# A paced connection's pipelined requests: held, then answered in the order sent.
PIPELINED = """
import msgpack, zmq
ctx = zmq.Context()
first = ctx.socket(zmq.DEALER)
first.connect("ipc://" + os.environ["KREX_SOCKET"])
first.send(msgpack.packb({"v": 1, "id": 0, "op": "ping", "body": {}}))
assert first.poll(5000)
first.recv()  # the burst of 1 is spent
d = ctx.socket(zmq.DEALER)
d.connect("ipc://" + os.environ["KREX_SOCKET"])
t = time.monotonic()
for i in range(1, 7):
    d.send(msgpack.packb({"v": 1, "id": i, "op": "ping", "body": {}}))
got = []
while len(got) < 6 and d.poll(5000):
    r = msgpack.unpackb(d.recv())
    got.append([r["id"], r["ok"] or r["error"]["name"], round(time.monotonic() - t, 2)])
c = ctx.socket(zmq.DEALER)
c.connect("ipc://" + os.environ["KREX_SOCKET"])
t = time.monotonic()
c.send(msgpack.packb({"v": 1, "id": 9, "op": "region_cancel", "body": {}}))
r = msgpack.unpackb(c.recv()) if c.poll(5000) else None
urgent = [r and r["error"]["name"], round(time.monotonic() - t, 2)]
print(json.dumps({"got": got, "urgent": urgent}), flush=True)
"""


def test_held_requests_keep_their_order_are_bounded_and_region_ops_are_not_held(
    krexd_factory: Factory,
) -> None:
    """1/s after a burst of 1: a new connection's six pipelined pings are held about a
    second; the first four are answered in order, the last two refused at once
    (HELD_MAX); a region operation on a new connection is answered at once."""
    k = krexd_factory(config=_config(1.0, 1))
    rc, out, err = finish(as_user(k, USER_A, "py", PIPELINED), 60)
    assert rc == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    got = res["got"]
    refused = [g for g in got if g[1] == "TOO_MANY"]
    served = [g for g in got if g[1] is True]
    assert [g[0] for g in refused] == [5, 6] and all(g[2] < 0.5 for g in refused), got
    assert [g[0] for g in served] == [1, 2, 3, 4], got
    assert all(g[2] >= 0.5 for g in served), got  # held until the connection's start
    name, urgent_s = res["urgent"]
    assert name == "AUTH" and urgent_s < 0.5, res  # dispatched (no tenant): not held


# Ten new connections at once, each sending a region operation first, then a ping.
URGENT_FIRST = """
import msgpack, zmq
ctx = zmq.Context()
socks = []
for i in range(10):
    s = ctx.socket(zmq.DEALER)
    s.connect("ipc://" + os.environ["KREX_SOCKET"])
    s.send(msgpack.packb({"v": 1, "id": 1, "op": "region_cancel", "body": {}}))
    s.send(msgpack.packb({"v": 1, "id": 2, "op": "ping", "body": {}}))
    socks.append(s)
pings = 0
end = time.monotonic() + 1.5
for s in socks:
    while s.poll(max(1, int((end - time.monotonic()) * 1000))):
        r = msgpack.unpackb(s.recv())
        pings += r["id"] == 2 and r["ok"]
print(json.dumps({"pings": pings}), flush=True)
"""


def test_a_region_operation_first_does_not_buy_a_connection_out_of_the_pace(
    krexd_factory: Factory,
) -> None:
    """1/s after a burst of 1: a region operation as a connection's first request is not
    held but pays as any other, so the pings behind it are paced: at most a few of ten
    are answered within 1.5 s (all ten were, when a region operation was free)."""
    k = krexd_factory(config=_config(1.0, 1))
    rc, out, err = finish(as_user(k, USER_A, "py", URGENT_FIRST), 60)
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["pings"] <= 3, out
