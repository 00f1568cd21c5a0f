"""One user's connection churn is paced (``[daemon] connections_per_s_per_uid``): the
churner is held to the rate, another user is served at once, krex clients over the
rate are told when to ask again and do so by themselves (docs/design/security.md,
"Fair shares"; krexd/connections.py).

Real krexd, real uids (``tests.daemon.asuser``).  Without the pace the churner gets
every ping answered (hundreds in the test's seconds) and a client over it has nothing
to wait for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from tests.conftest import Krexd
from tests.daemon.test_identity import USER_A, USER_B, as_user, finish

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
    churn = as_user(k, USER_A, "py", CHURN)
    time.sleep(1.0)
    started = time.monotonic()
    rc, _, err = finish(as_user(k, USER_B, "krexctl", "status"), 20)
    b_s = time.monotonic() - started
    assert rc == 0, err
    rc, out, err = finish(churn, 30)
    assert rc == 0, err
    served = json.loads(out.strip().splitlines()[-1])["ok"]
    conns = k.status()["connections"]
    if per_s:
        assert served <= 10 + per_s * 3.5, (served, conns)
        assert conns["paced"] > 0, conns
        assert b_s < 2.0, b_s
    else:
        assert served > 150, served  # what the pace bounds
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


# One connection held (the cap), four refused ones waiting for their reply, then a
# ZeroMQ client over the cap: cut at accept, silently, as often as it reconnects.
OVER_CAP = """
import socket, msgpack, zmq
held = []
for _ in range(5):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["KREX_SOCKET"])
    held.append(s)
    time.sleep(0.05)
time.sleep(0.3)
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.setsockopt(zmq.RECONNECT_IVL, 20)
d.connect("ipc://" + os.environ["KREX_SOCKET"])
d.send(msgpack.packb({"v": 1, "id": 1, "op": "ping", "body": {}}))
reply = msgpack.unpackb(d.recv()) if d.poll(1500) else None
print(json.dumps({"reply": reply}), flush=True)
"""


def test_a_request_on_a_connection_cut_over_the_cap_is_not_served(
    krexd_factory: Factory,
) -> None:
    """Beyond the cap and the refused connections kept for their reply, a connection is
    cut at accept; a request it sent before the cut reached krexd is dropped, never served
    (the order that would serve it, the request read before the accept, was not
    reproduced here: this keeps the property, krexd/connections.py keeps the guard)."""
    k = krexd_factory(config={"daemon": {"socket_mode": "0666", "max_connections_per_uid": 1}})
    rc, out, err = finish(as_user(k, USER_A, "py", OVER_CAP), 30)
    assert rc == 0, err
    reply = json.loads(out.strip().splitlines()[-1])["reply"]
    assert reply is None or not reply["ok"], reply
