"""An adopted tenant keeps its verified launcher, its uid's cap and its memory record.

Real krexd, cgroups and ``krex run`` as an unprivileged uid (the launcher is
neither root nor in its tenant's cgroup, so only the saved launcher identity
authorizes its ops after the restart).  krexd is SIGKILLed while the command
runs and started again on the same config.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tests.daemon.test_identity import USER_A, as_user, finish
from tests.restarts.conftest import Restarter
from tests.support import wait_for
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]

MIB = 1 << 20
CONFIG = {"daemon": {"socket_mode": "0666"}, "admission": {"max_admitted_per_uid": 1}}


def _run(k: Krexd, code: int, sleep_s: float) -> subprocess.Popen[str]:
    cmd = ["sh", "-c", f"sleep {sleep_s}; exit {code}"]
    return as_user(k, USER_A, "krex", "run", "--label", "adopted", "--mem", "64M", "--", *cmd)


def test_adopted_tenant_keeps_launcher_uid_cap_and_memory(
    krexd_factory: Factory, restarter: Restarter
) -> None:
    k = krexd_factory(slots=4, config=CONFIG)
    first = _run(k, 3, 4.0)
    wait_for(lambda: any(t["state"] == "running" for t in k.status()["tenants"]), what="running")
    before = k.status()["tenants"][0]["memory"]
    restarter.kill(k)
    k2 = restarter.start_again(k)
    second = None
    try:
        [row] = k2.status()["tenants"]
        assert row["uid"] == USER_A[0]
        mem = row["memory"]
        assert (mem["label"], mem["declared_bytes"]) == ("adopted", 64 * MIB)
        keys = ("need_bytes", "need_source", "learned_bytes")
        assert {k: mem[k] for k in keys} == {k: before[k] for k in keys}
        # The adopted tenant counts against its uid's cap: a second command of that
        # uid parks until the first one ends.
        second = _run(k2, 0, 0.0)
        wait_for(lambda: k2.status()["queue"]["parked"] == 1, what="second command parked")
        assert [t["id"] for t in k2.status()["tenants"]] == [row["id"]]
        # Its launcher (not root, not in the cgroup) is still the launcher: release is
        # authorized, and krex run reports the command's own exit code.
        rc, _, err = finish(first, 60)
        assert rc == 3, err
        assert "AUTH" not in err and "did not confirm" not in err, err
        rc, _, err = finish(second, 60)
        assert rc == 0, err
        log = k2.log()
        assert f"refused pid {first.pid}" not in log
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    wait_for(lambda: k2.status()["tenants"] == [], what="tenants released")
