"""krexd.tenancy.identity and the status op's need-to-know, without krexd (fast lane)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from krexd.cgroups import TenantCgroup
from krexd.control.status import need_to_know
from krexd.system import procfs
from krexd.system.errors import KrexError
from krexd.tenancy import identity
from krexd.tenancy.tenants import Tenant


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


def _tenant_with_procs(tmp_path: Path, uid: int, pids: list[int]) -> Tenant:
    """A tenant of ``uid`` whose cgroup lists ``pids`` (a plain ``cgroup.procs`` file)."""
    (tmp_path / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    cgroup = TenantCgroup(str(tmp_path), None, "v2", (0,))
    return Tenant(1, "0" * 32, 0, ["bench"], 41, cgroup, uid=uid, gid=uid, launcher_start=5)


def test_a_caller_of_another_uid_is_refused_even_inside_the_tenant_cgroup(
    tmp_path: Path,
) -> None:
    tenant = _tenant_with_procs(tmp_path, 1000, [4242])
    identity.authorize_tenant_op(tenant, identity.Caller(4242, 1000, 1000, 9), "region_enter")
    identity.authorize_tenant_op(tenant, identity.Caller(41, 1000, 1000, 5), "release")
    identity.authorize_tenant_op(tenant, identity.Caller(4242, 0, 0, 9), "release")
    # The same pid (in the cgroup) and the launcher's pid and start time, another uid.
    for intruder in (identity.Caller(4242, 1001, 1001, 9), identity.Caller(41, 1001, 1001, 5)):
        with pytest.raises(KrexError) as exc:
            identity.authorize_tenant_op(tenant, intruder, "region_enter")
        assert exc.value.code.name == "AUTH" and "uid 1000" in exc.value.message
    with pytest.raises(KrexError):
        identity.authorize_tenant_op(tenant, identity.Caller(77, 1000, 1000, 9), "release")


def test_a_process_named_in_bytes_that_are_not_utf8_is_still_read() -> None:
    # A command may set its name (/proc/PID/stat field 2) to any bytes (prctl PR_SET_NAME).
    code = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b'\\xff\\xfe) Z 1'), 0, 0, 0)\n"
        "print('named', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"named\n"
        assert procfs.proc_stat(child.pid) == (os.getpid(), identity.pid_start_time(child.pid))
        assert procfs.pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not procfs.pid_alive(child.pid)
