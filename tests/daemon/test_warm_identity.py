"""Warm pools and other users: nobody uses, hijacks or has krexd place another user's pool.

docs/design/security.md "Warm pools".  Real krexd, real pools (as root),
attackers as unprivileged uids without an account (``tests.daemon.asuser``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from krex_cli.warm import client, pooldir
from krex_client.connection import RemoteError
from tests.cli.warm_support import PY, Pools, warm_config
from tests.daemon.test_identity import OPEN, USER_A, USER_B, as_user, finish
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def _config(**warm: object) -> dict[str, dict[str, object]]:
    return {**OPEN, **warm_config(**warm)}


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory other uids may enter (pytest's tmp_path is under root's 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="krex-warm-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


_CONNECT = """
import socket
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
out = {}
try:
    s.connect(PATH)
    s.sendall(b"\\x00\\x00\\x00\\x0f" + b'{"op":"hello"}')
    out["reply"] = s.recv(100).decode(errors="replace")
except OSError as exc:
    out["error"] = type(exc).__name__
print(json.dumps(out))
"""


def test_another_uid_can_neither_reach_nor_use_a_pool(
    krexd_factory: Factory, open_tmp: Path
) -> None:
    pools = Pools(krexd_factory(config=_config()), open_tmp)
    pools.ready()
    sock = str(next(pools.dir.glob("*.sock")))
    code = f"PATH = {sock!r}\n" + _CONNECT
    rc, out, err = finish(as_user(pools.k, USER_B, "py", code))
    assert rc == 0, err
    assert json.loads(out) == {"error": "PermissionError"}  # the directory is 0700, root's
    # Opened up by mistake: the pool itself still serves only its own uid.
    os.chmod(pools.xdg, 0o755)
    os.chmod(pools.dir, 0o755)
    os.chmod(sock, 0o666)
    try:
        rc, out, err = finish(as_user(pools.k, USER_B, "py", code))
        assert rc == 0, err
        got = json.loads(out)  # closed without an answer (reset when our hello was unread,
        # a broken pipe when it was closed before the hello was sent)
        closed = ({"reply": ""}, {"error": "ConnectionResetError"}, {"error": "BrokenPipeError"})
        assert got in closed, got
        assert f"refused a connection of uid {USER_B[0]}" in pools.logs()
        # And krex run no longer trusts a directory others may enter: it starts cold.
        p = pools.warm([PY, "-c", "print(1)"], served=False)
        assert p.stdout == "1\n" and any("mode 755" in ln for ln in p.debug)  # type: ignore[attr-defined]
    finally:
        os.chmod(pools.dir, 0o700)


_LISTEN = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(PATH)
s.listen(1)
print(json.dumps({"listening": True}), flush=True)
s.settimeout(20)
try:
    c, _ = s.accept()
    print(json.dumps({"got": c.recv(100).decode(errors="replace")}), flush=True)
except OSError:
    pass
"""


def test_krex_run_never_talks_to_a_socket_of_another_uid(
    krexd_factory: Factory, open_tmp: Path
) -> None:
    k = krexd_factory(config=_config())
    shared = open_tmp / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    path = str(shared / "fake.sock")
    p = as_user(k, USER_B, "py", f"PATH = {path!r}\n" + _LISTEN)
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"listening": True}
    with pytest.raises(client.PoolUnavailable, match=f"runs as uid {USER_B[0]}"):
        client.PoolSession(path)
    _, out, _ = finish(p)
    assert json.loads(out) == {"got": ""}  # krex run connected, looked, sent nothing


def test_a_pool_directory_of_another_uid_is_refused(krexd_factory: Factory, tmp_path: Path) -> None:
    k = krexd_factory(config=_config())
    xdg = tmp_path / "xdg"
    (xdg / "krex").mkdir(parents=True)
    os.chown(xdg / "krex", *USER_B)  # created first by another user, to catch the requests
    os.chmod(xdg / "krex", 0o700)
    home = Path(tempfile.mkdtemp(prefix="krex-home-"))  # short: tmp_path is too long
    fallback = str(home / ".cache" / "krex-pool")  # the next candidate, the user's own
    notes: list[str] = []
    assert pooldir.directory({"XDG_RUNTIME_DIR": str(xdg), "HOME": str(home)}, notes.append) == (
        fallback
    )
    assert any(f"belongs to uid {USER_B[0]}" in n for n in notes), notes
    link = tmp_path / "xdg2"
    link.mkdir()
    (link / "krex").symlink_to(xdg / "krex")
    notes.clear()
    assert pooldir.directory({"XDG_RUNTIME_DIR": str(link), "HOME": str(home)}, notes.append) == (
        fallback
    )
    assert any("not a directory" in n for n in notes), notes
    env = dict(k.env, XDG_RUNTIME_DIR=str(xdg), HOME=str(home))
    pools = Pools(k, tmp_path)
    p = pools.run("--warm", [PY, "-c", "print(2)"], env=env)
    assert p.returncode == 0 and p.stdout == "2\n"
    assert f"belongs to uid {USER_B[0]}" in p.stderr
    assert not list((xdg / "krex").iterdir())  # nothing was started there
    shutil.rmtree(home, ignore_errors=True)


_PLACE_FOREIGN = """
def name(op, body, conn):
    try:
        conn.request(op, body)
        return "ok"
    except RemoteError as exc:
        return exc.name
out = {}
with Connection(timeout_s=5) as c:
    g = c.request("admit", {"argv": ["x"], "launcher_pid": os.getpid()}, timeout_s=10)
    out["register_foreign"] = name("pool_register", dict(BODY, pid=ZYGOTE), c)
with Connection(None, g["tenant"], g["token"], timeout_s=5) as t:
    out["place_pool_child"] = name("place", {"pid": CHILD}, t)
    out["place_zygote"] = name("place", {"pid": ZYGOTE}, t)
    t.request("release", {"exit_code": 0})
print(json.dumps(out))
"""


def test_krexd_places_no_pool_child_for_another_uid(krexd_factory: Factory, tmp_path: Path) -> None:
    pools = Pools(krexd_factory(config=_config()), tmp_path)
    pools.ready()
    row = pools.pools()[0]
    session = client.PoolSession(str(next(pools.dir.glob("*.sock"))))
    fields = {"mode": "code", "target": "pass", "args": [], "argv": [PY, "-c", "pass"]}
    child = session.start(fields, {})  # forked by root's pool, waiting for "go"
    try:
        body = {"key": row["key"], "version": row["version"], "interpreter": PY, "modules": []}
        code = f"ZYGOTE = {row['pid']}\nCHILD = {child}\nBODY = {body!r}\n" + _PLACE_FOREIGN
        rc, out, err = finish(as_user(pools.k, USER_B, "py", code))
        assert rc == 0, err
        assert json.loads(out) == {
            "register_foreign": "AUTH",
            "place_pool_child": "AUTH",
            "place_zygote": "AUTH",
        }
        assert f"refused pid {pools.k.pid}" not in pools.k.log()
        assert f"uid {USER_B[0]}" in pools.k.log()
        assert pools.pools()[0]["commands"] == row["commands"]  # nothing placed
    finally:
        session.abort()
        session.close()


_REGISTER_OWN = """
import subprocess
def name(op, body, conn):
    try:
        conn.request(op, body)
        return "ok"
    except RemoteError as exc:
        return exc.name
kids = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
out = {}
with Connection(timeout_s=5) as c:
    for i, kid in enumerate(kids):
        out[str(i)] = name("pool_register", dict(BODY, pid=kid.pid), c)
    out["status_pools"] = [p["uid"] for p in c.request("status")["warm"]["pools"]]
print(json.dumps(out), flush=True)
for kid in kids:
    kid.kill()
"""


def test_registration_is_counted_per_uid_and_shown_to_its_owner_only(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    pools = Pools(krexd_factory(config=_config(max_pools_per_uid=1)), tmp_path)
    pools.ready()  # root's pool
    version = pools.pools()[0]["version"]
    body = {"key": "k" * 24, "version": version, "interpreter": "/bin/sleep", "modules": []}
    rc, out, err = finish(as_user(pools.k, USER_B, "py", f"BODY = {body!r}\n" + _REGISTER_OWN))
    assert rc == 0, err
    got = json.loads(out)
    # One pool for uid B (its own child), the second refused; root's pool is not B's to see.
    assert got == {"0": "ok", "1": "CANCELLED", "status_pools": [USER_B[0]]}
    code = "print(json.dumps([p['uid'] for p in Connection().request('status')['warm']['pools']]))"
    rc, out, err = finish(as_user(pools.k, USER_A, "py", code))
    assert rc == 0 and json.loads(out) == [], err
    # B's pool ended with its process: krexd forgot it; root sees its own.
    assert [p["uid"] for p in pools.pools()] == [0]


def test_a_pool_of_another_krex_version_is_refused(krexd_factory: Factory) -> None:
    k = krexd_factory(config=_config())
    body = {"key": "k", "version": "0.0.0-old", "interpreter": "/bin/sleep", "modules": []}
    with pytest.raises(RemoteError) as info:
        k.request("pool_register", {**body, "pid": os.getpid()})
    assert info.value.name == "BAD_FIELD" and "0.0.0-old" in info.value.message


# A zygote with THREADS threads, then (after DELAY s) MORE threads, as many as the
# kernel lets it start; it reports both counts and sleeps.
_THREADED = """
import sys, threading, time
stop = threading.Event()
def start(n):
    made = 0
    for _ in range(n):
        try:
            threading.Thread(target=stop.wait, daemon=True).start()
        except RuntimeError:  # pids.max reached: clone fails with EAGAIN
            break
        made += 1
    return made
first = start(THREADS)
print("ready", flush=True)
time.sleep(DELAY)
print(first, start(MORE), flush=True)
time.sleep(30)
"""

_REGISTER_THREADED = """
import signal
r, w = os.pipe()
kid = os.fork()  # the zygote: a direct child (the venv's interpreter is not B's to exec)
if kid == 0:
    os.close(r)
    os.dup2(w, 1)
    exec(ZYGOTE, {"__name__": "zygote"})
    os._exit(0)
os.close(w)
lines = os.fdopen(r)
assert lines.readline().strip() == "ready"
out = {}
with Connection(timeout_s=10) as c:
    try:
        c.request("pool_register", dict(BODY, pid=kid))
        out["register"] = "ok"
    except RemoteError as exc:
        out["register"], out["message"] = exc.name, exc.message
    line = lines.readline().split()
    out["made"] = [int(v) for v in line] if line else None
    out["pools"] = c.request("status")["warm"]["pools"]
    end = time.monotonic() + (5.0 if EXPECT_DEAD else 0.0)  # a SIGKILL takes a moment
    while (alive := os.waitpid(kid, os.WNOHANG) == (0, 0)) and time.monotonic() < end:
        time.sleep(0.05)
    out["alive"] = alive
if out["alive"]:
    os.kill(kid, signal.SIGKILL)
    os.waitpid(kid, 0)
print(json.dumps(out), flush=True)
"""


def _host_has_pids() -> bool:
    """Does this host offer a pids controller (the v1 tree, or v2's at the root)?"""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    return Path("/sys/fs/cgroup/pids").is_dir() or (v2.is_file() and "pids" in v2.read_text())


def _register_threaded(
    k: Krexd, version: str, threads: int, more: int, delay_s: float, expect_dead: bool = False
) -> dict[str, object]:
    """As uid B: start a zygote of ``threads`` threads, register it, then let it start
    ``more`` threads after ``delay_s``; what krexd answered and what the zygote made
    (``alive``: after up to 5 s for it to die, with ``expect_dead``)."""
    zygote = _THREADED.replace("THREADS", str(threads)).replace("MORE", str(more))
    zygote = zygote.replace("DELAY", str(delay_s))
    body = {"key": "t" * 16, "version": version, "interpreter": "/bin/sleep", "modules": []}
    code = f"ZYGOTE = {zygote!r}\nBODY = {body!r}\nEXPECT_DEAD = {expect_dead}\n"
    code += _REGISTER_THREADED
    rc, out, err = finish(as_user(k, USER_B, "py", code), timeout_s=60)
    assert rc == 0, err
    got: dict[str, object] = json.loads(out)
    return got


@pytest.mark.parametrize("tenant_pids_max", [None, 0])
def test_a_pool_of_many_threads_is_refused_and_one_cannot_grow_past_its_cap(
    krexd_factory: Factory, tmp_path: Path, tenant_pids_max: int | None
) -> None:
    # Every region freezes the pools, and a freeze's cost grows with their threads:
    # one user's pool of thousands of threads would slow every user's region entry.
    # The pools' cap holds whatever the tenants' ([cgroup] pids_max = 0: none for them).
    config: dict[str, dict[str, object]] = _config(pids_max=32)
    if tenant_pids_max is not None:
        config["cgroup"] = {"pids_max": tenant_pids_max}
    k = krexd_factory(config=config)
    version = k.request("ping")["version"]
    got = _register_threaded(k, version, threads=40, more=0, delay_s=0.1)
    assert got["register"] == "CANCELLED" and "pids_max = 32" in str(got["message"]), got
    assert got["alive"] is True and got["pools"] == []  # refused before the move: not killed
    got = _register_threaded(k, version, threads=4, more=60, delay_s=0.5)
    assert got["register"] == "ok", got
    pools = got["pools"]
    assert isinstance(pools, list) and len(pools) == 1, got
    made = got["made"]
    assert isinstance(made, list) and made[0] == 4, got
    kind = k.request("status")["warm"]["cgroups"]["pids"]
    assert kind != "none" or not _host_has_pids(), "a pids controller, unused by the pools"
    if kind != "none":
        assert made[1] < 32, got  # the kernel refused the threads past pids.max
    else:  # counted at each device read instead: test_pool_gpu_watch.py
        pytest.skip("no pids controller for pools here: growth is refused by no kernel")


def test_threads_made_while_a_registration_counts_them_get_the_pool_killed(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    # The move into the pool's cgroup is not bounded by pids.max: threads started
    # between the count and the move are counted again where the pool lives.
    k = krexd_factory(
        config=_config(pids_max=32),
        env={"KREX_TEST_PAUSE_AT": "pool_counted", "KREX_TEST_PAUSE_S": "1.5"},
    )
    version = k.request("ping")["version"]
    got = _register_threaded(k, version, threads=1, more=60, delay_s=0.2, expect_dead=True)
    assert got["register"] == "CANCELLED" and "pids_max = 32" in str(got["message"]), got
    assert got["alive"] is False and got["pools"] == [], got  # killed with its cgroup
    assert "pids_max" in k.log()
