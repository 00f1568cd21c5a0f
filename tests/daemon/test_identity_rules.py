"""krexd.identity and the status op's need-to-know, without krexd (fast lane)."""

from __future__ import annotations

import os
from typing import Any

from krexd import identity
from krexd.control.status import need_to_know
from krexd.errors import KrexError


def test_peer_address_is_parsed_and_bound_to_the_start_time() -> None:
    me = os.getpid()
    c = identity.caller_from_peer(f"localhost:1000:1001:{me}")
    assert c is not None and (c.pid, c.uid, c.gid) == (me, 1000, 1001)
    assert c.start_time == identity.pid_start_time(me) > 0
    for bad in (None, "", "localhost", "localhost:a:b:c", "localhost:1:1:0", "x:-1:1:5"):
        assert identity.caller_from_peer(bad) is None, bad


def test_a_connection_whose_pid_changed_start_time_gets_no_caller() -> None:
    table = identity.PeerTable(limit=2)
    me = os.getpid()
    assert table.resolve(b"conn1", f"localhost:0:0:{me}") is not None
    assert table.resolve(b"conn1", f"localhost:0:0:{me}") is not None
    # The same connection now reporting another process: pid reused (or forged).
    assert table.resolve(b"conn1", f"localhost:0:0:{os.getppid()}") is None
    assert table.resolve(b"conn1", None) is None


def test_launcher_claim_must_be_the_caller() -> None:
    who = identity.Caller(1234, 1000, 1000, 5)
    identity.check_launcher_claim(who, None)
    identity.check_launcher_claim(who, 1234)
    try:
        identity.check_launcher_claim(who, 1)
    except KrexError as exc:
        assert exc.code.name == "AUTH" and "pid 1234 uid 1000" in exc.message
    else:
        raise AssertionError("launcher_pid 1 accepted")


def _status() -> dict[str, Any]:
    tenant = {
        "id": 1,
        "gpu": 0,
        "uid": 1000,
        "pid": 42,
        "launcher_pid": 41,
        "command": ["bench", "--key", "secret"],
        "state": "holding",
        "age_s": 1.0,
        "exclusive": False,
        "cgroup": "/sys/fs/cgroup/krex/gpu0/t1",
    }
    parked = {
        "gpu": None,
        "uid": 1000,
        "exclusive": False,
        "launcher_pid": 50,
        "command": ["secret"],
        "waiting_s": 0.5,
        "waiting_for": "slot",
    }
    region = {"holder": {"tenant": 1, "epoch": 3, "pid": 42}, "queue": []}
    return {
        "tenants": [tenant],
        "queue": {"parked": 1, "queue": [parked]},
        "gpus": [{"index": 0, "region": region}],
    }


def test_status_is_need_to_know() -> None:
    body = _status()
    owner = identity.Caller(7, 1000, 1000, 1)
    root = identity.Caller(8, 0, 0, 1)
    assert need_to_know(body, owner) == body and need_to_know(body, root) == body
    for other in (identity.Caller(9, 1001, 1001, 1), None):
        seen = need_to_know(body, other)
        assert "secret" not in repr(seen) and "42" not in repr(seen["tenants"])
        assert seen["tenants"] == [
            {
                "id": 1,
                "gpu": 0,
                "state": "holding",
                "age_s": 1.0,
                "exclusive": False,
                "redacted": True,
            }
        ]
        assert seen["queue"]["queue"][0]["redacted"] is True
        assert seen["gpus"][0]["region"]["holder"] == {"tenant": 1, "epoch": 3}
