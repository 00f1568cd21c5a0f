"""krexd acts only for the kernel-verified caller: one test per attack of docs/design/security.md.

Real krexd, real cgroups, real sockets.  Attackers and victims run as two
unprivileged uids that need no account (:data:`USER_A`, :data:`USER_B`),
through ``python -m tests.daemon.asuser`` (imports as root, then drops the
uid before it connects).  The socket is opened to them with ``socket_mode``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import JsonLineReader
from tests.support.krexd import REPO, Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]

USER_A = (65534, 65534)
USER_B = (65533, 65533)
OPEN = {"daemon": {"socket_mode": "0666"}}


def as_user(
    k: Krexd, user: tuple[int, int], *args: str, root_child: bool = False, **kw: Any
) -> subprocess.Popen[str]:
    """Start ``python -m tests.daemon.asuser UID GID ...`` with krexd's client environment."""
    extra = ["--root-child"] if root_child else []
    return subprocess.Popen(
        [sys.executable, "-m", "tests.daemon.asuser", str(user[0]), str(user[1]), *extra, *args],
        env=k.env,
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


def finish(p: subprocess.Popen[str], timeout_s: float = 30) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout_s)
    return p.returncode, out, err


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# An attacker in the socket group: admit naming init as launcher, then try to
# have krexd move (and on release, kill) a root-owned process.
_FOREIGN_PLACE = """
def name(op, body, conn):
    try:
        conn.request(op, body)
        return "ok"
    except RemoteError as exc:
        return exc.name
out = {"me": os.getpid(), "root_child": ROOT_CHILD}
with Connection(timeout_s=5) as c:
    out["admit_init"] = name("admit", {"argv": ["x"], "launcher_pid": 1}, c)
    g = c.request("admit", {"argv": ["x"], "launcher_pid": os.getpid()}, timeout_s=10)
with Connection(None, g["tenant"], g["token"], timeout_s=5) as t:
    out["place_root_child"] = name("place", {"pid": ROOT_CHILD}, t)
    out["place_init"] = name("place", {"pid": 1}, t)
    out["place_self"] = name("place", {"pid": os.getpid()}, t)
    t.request("release", {"exit_code": 0})
print(json.dumps(out))
"""


def test_no_user_can_have_krexd_move_or_kill_a_process_not_their_own(
    krexd_factory: Factory,
) -> None:
    """Attack: admit with launcher_pid=1, then place a root-owned sleep and release.

    Before: admit accepted any launcher_pid, place any child of it (or the
    launcher itself), and release killed the root-owned sleep.
    """
    k = krexd_factory(slots=4, config=OPEN)
    p = as_user(k, USER_A, "py", _FOREIGN_PLACE, root_child=True)
    rc, out, err = finish(p)
    assert rc == 0, err
    got = json.loads(out)
    assert got["admit_init"] == "AUTH"
    assert got["place_root_child"] == "AUTH"
    assert got["place_init"] == "AUTH"
    assert got["place_self"] == "AUTH"  # never the launcher itself
    # The root-owned child was neither moved nor killed by release.
    child = int(got["root_child"])
    assert _uid(child) == 0 and alive(child)
    os.kill(child, 9)
    log = k.log()
    assert f"refused pid {got['me']} uid {USER_A[0]}" in log
    assert k.status()["tenants"] == []


def _uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# The victim: a launcher of uid A whose command (a sleep with the tenant's
# credentials in its environment) holds the region.
_VICTIM = """
with Connection(timeout_s=5) as c:
    g = c.request("admit", {"argv": ["victim"], "launcher_pid": os.getpid()}, timeout_s=10)
env = dict(os.environ, KREX_TENANT=str(g["tenant"]), KREX_TOKEN=g["token"])
child = subprocess.Popen(["sleep", "120"], env=env)
t = Connection(None, g["tenant"], g["token"], timeout_s=10)
t.request("place", {"pid": child.pid})
grant = t.request("region_enter", {"pid": child.pid, "tid": child.pid})
print(json.dumps({"tenant": g["tenant"], "child": child.pid, "epoch": grant["epoch"]}), flush=True)
sys.stdin.readline()
done = t.request("region_exit", {"epoch": grant["epoch"]})
child.kill()
child.wait()
t.request("release", {"signal": 9})
print(json.dumps({"region_ms": done["region_ms"]}), flush=True)
"""

# The thief: another process of the same uid, outside the tenant, reads the
# credentials from the command's environment and acts with them.
_THIEF = """
victim = int(sys.argv_victim)
env = open(f"/proc/{victim}/environ", "rb").read().split(b"\\0")
creds = dict(e.decode().split("=", 1) for e in env if e.startswith(b"KREX_T"))
out = {"me": os.getpid(), "stole": sorted(creds)}
with Connection(None, int(creds["KREX_TENANT"]), creds["KREX_TOKEN"], timeout_s=5) as t:
    for op, body in [("region_exit", {"epoch": EPOCH}), ("region_cancel", {}),
                     ("memory", {}), ("release", {"exit_code": 0}),
                     ("region_enter", {"pid": victim, "tid": victim})]:
        try:
            t.request(op, body)
            out[op] = "ok"
        except RemoteError as exc:
            out[op] = exc.name
print(json.dumps(out))
"""


def test_a_stolen_token_is_useless_outside_the_tenant(krexd_factory: Factory) -> None:
    """Attack: a same-uid process reads KREX_TOKEN from /proc/PID/environ and acts with it.

    Before: region_exit ended the holder's region and release killed its command.
    """
    k = krexd_factory(slots=4, config=OPEN)
    victim = as_user(k, USER_A, "py", _VICTIM, stdin=subprocess.PIPE)
    assert victim.stdout is not None and victim.stdin is not None
    lines = JsonLineReader(victim.stdout, "victim", lambda: str(victim.poll()))
    try:
        v = lines.next(30)
        code = _THIEF.replace("int(sys.argv_victim)", str(v["child"])).replace(
            "EPOCH", str(v["epoch"])
        )
        rc, out, err = finish(as_user(k, USER_A, "py", code))
        assert rc == 0, err
        got = json.loads(out)
        assert got["stole"] == ["KREX_TENANT", "KREX_TOKEN"]
        for op in ("region_exit", "region_cancel", "memory", "release", "region_enter"):
            assert got[op] == "AUTH", got
        # The victim still holds its region and its command lives.
        st = k.status()
        assert st["gpus"][0]["region"]["holder"]["tenant"] == v["tenant"]
        assert [t["state"] for t in st["tenants"]] == ["holding"]
        assert alive(v["child"])
        assert f"refused pid {got['me']} uid {USER_A[0]}" in k.log()
        # The launcher itself may act on its tenant.
        victim.stdin.write("\n")
        victim.stdin.flush()
        assert lines.next(30)["region_ms"] > 0
        assert victim.wait(30) == 0
    finally:
        victim.kill()
        victim.wait()


_SQUAT = """
conns = [Connection(timeout_s=10) for _ in range(4)]
got = [c.request("admit", {"argv": ["squat"], "launcher_pid": os.getpid()}) for c in conns]
print(json.dumps([g["tenant"] for g in got]), flush=True)
time.sleep(60)
"""


def test_admitted_but_never_placed_tenants_lose_their_slots(krexd_factory: Factory) -> None:
    """Attack: four admits never placed hold all four slots.

    Before: the slots were held for as long as the squatter lived, and
    ``krex run -- true`` waited.
    """
    # No per-uid cap: the squatter may hold every slot (what the timeout must undo).
    admission = {"place_timeout_s": 1.0, "max_admitted_per_uid": 0}
    k = krexd_factory(slots=4, config={**OPEN, "admission": admission})
    squatter = as_user(k, USER_A, "py", _SQUAT)
    assert squatter.stdout is not None
    try:
        assert len(json.loads(squatter.stdout.readline())) == 4
        t0 = time.monotonic()
        run = subprocess.run(
            [*k.krex, "run", "--", "true"], env=k.env, capture_output=True, text=True, timeout=30
        )
        assert run.returncode == 0, run.stderr
        assert time.monotonic() - t0 < 10
        assert squatter.poll() is None  # freed by the timeout, not by the squatter's exit
        assert "not placed within 1 s" in k.log()
        assert k.status()["gpus"][0]["slots_used"] == 0
    finally:
        squatter.kill()
        squatter.wait()


def test_status_shows_other_users_no_command_line_or_pids(krexd_factory: Factory) -> None:
    """Attack: ``krexctl status`` as another uid read every command line (secrets) and pid.

    Also: the command runs as the uid that ran ``krex run`` (never as root).
    """
    k = krexd_factory(slots=4, config=OPEN)
    secret = "api-key-5f3e1d"
    cmd = ["sh", "-c", "id -u; sleep 60", secret]
    run = as_user(k, USER_A, "krex", "run", "--", *cmd)
    assert run.stdout is not None
    try:
        assert run.stdout.readline().strip() == str(USER_A[0])  # CMD runs as the user
        rc, other, err = finish(as_user(k, USER_B, "krexctl", "status", "--json"))
        assert rc == 0, err
        row = json.loads(other)["tenants"][0]
        assert row["redacted"] is True and row["state"] == "running" and row["gpu"] == 0
        assert "command" not in row and "pid" not in row and "launcher_pid" not in row
        assert secret not in other
        rc, text, err = finish(as_user(k, USER_B, "krexctl", "status"))
        assert rc == 0 and secret not in text, err
        rc, own, err = finish(as_user(k, USER_A, "krexctl", "status", "--json"))
        as_root = subprocess.run(
            [*k.krexctl, "status", "--json"], env=k.env, capture_output=True, text=True
        )
        for body in (own, as_root.stdout):  # the owner and root see everything
            mine = json.loads(body)["tenants"][0]
            assert mine["command"] == cmd and mine["pid"] and mine["uid"] == USER_A[0]
    finally:
        run.kill()
        run.wait()


def test_permission_denied_names_the_group_to_join(krexd_factory: Factory) -> None:
    """Before: a user outside the socket's group was told krexd is not running."""
    k = krexd_factory(slots=4, config={"daemon": {"socket_mode": "0660", "socket_group": "daemon"}})
    rc, _, err = finish(as_user(k, USER_A, "krexctl", "status"))
    assert rc == 4 and "permission denied" in err and "'daemon'" in err, err
    assert "not running" not in err
    rc, _, err = finish(as_user(k, USER_A, "krex", "run", "--", "true"))
    assert rc == 77 and "permission denied" in err and "'daemon'" in err, err
