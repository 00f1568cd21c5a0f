"""Warm pools against the code a command runs: it must not use its user's pool to leave its tenant.

docs/design/security.md §8.  The attacker is the command itself (untrusted
code of a trusted user, same uid as the pool): it can reach the pool's
socket and krexd's, fork, and replace files in the pool directory.  Real
krexd, real cgroups, real pools (modules: json).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from krex_cli import __version__
from krex_cli.warm import client
from krex_cli.warm import krexpool_wire as wire
from krex_client.connection import Connection, RemoteError
from tests.cli.warm_support import PY, Pools, warm_config
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]

# A command that asks its user's pool for a process and lets it run without krexd placing it.
_GO_UNPLACED = """
import json, os, sys
from krex_cli.warm import client
session = client.PoolSession(SOCK)
payload = "open(MARK, 'w').write(open('/proc/self/cgroup').read())"
fields = {"mode": "code", "target": f"MARK = {MARK!r}\\n" + payload, "args": [],
          "argv": [sys.executable, "-c", "x"]}
pid = session.start(fields, {})
fd = os.pidfd_open(pid)  # before go: the refused child exits at once after it
session.go()
print(json.dumps({"status": session.wait(fd, None)}), flush=True)
"""


def test_a_command_cannot_run_code_in_an_unplaced_pool_process(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """``go`` without ``place``: the pool's child would run outside every tenant (not frozen
    during a sibling's region, not ended with the tenant).  It refuses to run instead."""
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    sock = str(next(pools.dir.glob("*.sock")))
    mark = tmp_path / "escaped"
    code = f"SOCK = {sock!r}\nMARK = {str(mark)!r}\n" + _GO_UNPLACED
    p = pools.cold([PY, "-c", code])
    assert p.returncode == 0, p.stderr
    assert not mark.exists(), f"ran outside its tenant, in {mark.read_text()}"
    assert json.loads(p.stdout)["status"] >> 8 == 70
    assert "was not placed by krexd" in p.stderr
    # The pool itself still serves real commands.
    assert pools.warm([PY, "-c", "print(3)"]).stdout == "3\n"


# A command that starts its own "pool" (a child) and registers it with krexd.
_REGISTER_FROM_TENANT = """
import json, subprocess
from krex_client.connection import Connection, RemoteError
kid = subprocess.Popen(["sleep", "30"])
body = {"pid": kid.pid, "key": "k" * 16, "version": VERSION, "interpreter": "x", "modules": []}
try:
    with Connection(timeout_s=5) as c:
        c.request("pool_register", body)
    out = "ok"
except RemoteError as exc:
    out = exc.name
cgroup = open(f"/proc/{kid.pid}/cgroup").read()
kid.kill()
print(json.dumps({"register": out, "cgroup": cgroup}))
"""


def test_a_command_cannot_register_a_pool_to_leave_its_tenant(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """A registered zygote moves into a pool cgroup: from inside a tenant, that is an escape."""
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    p = pools.cold([PY, "-c", f"VERSION = {__version__!r}\n" + _REGISTER_FROM_TENANT])
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["register"] == "AUTH", got
    assert "/pools/" not in got["cgroup"]
    assert "is inside krexd's cgroup tree" in pools.k.log()
    assert pools.pools() == []


def _relay(real: str, listener: socket.socket, target: str, seen: list[str]) -> None:
    """A man in the middle on the pool's socket path: forwards to the real pool, but with the
    command replaced by ``target``."""
    conn, _ = listener.accept()
    up = socket.socket(socket.AF_UNIX)
    up.connect(real)
    with conn, up:
        while True:
            try:
                msg, fds = wire.recv(conn, wire.MAX_FDS)
            except (EOFError, OSError, wire.WireError):
                return
            seen.append(str(msg.get("op")))
            if msg.get("op") == "run":
                msg["target"] = target
            wire.send(up, msg, fds)
            for fd in fds:
                os.close(fd)
            if msg.get("op") in ("hello", "run"):
                reply, _ = wire.recv(up)
                wire.send(conn, reply)
            if msg.get("op") in ("go", "abort"):
                try:
                    wire.send(conn, wire.recv(up)[0])
                except (EOFError, OSError, wire.WireError):
                    pass
                return


def test_a_fake_pool_on_the_socket_path_cannot_get_its_process_placed(
    krexd_factory: Factory, tmp_path: Path
) -> None:
    """A command (same uid) moves the pool's socket aside and relays to it, swapping the next
    command's code: krex run has krexd check the placed process's parent is the process it
    talked to, so the swapped process is refused and the command starts cold, unswapped."""
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    sock = next(pools.dir.glob("*.sock"))
    real = str(sock) + ".real"
    os.rename(sock, real)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(1)
    seen: list[str] = []
    relay = threading.Thread(
        target=_relay, args=(real, listener, "print('swapped')", seen), daemon=True
    )
    relay.start()
    try:
        p = pools.warm([PY, "-c", "print('own')"], served=False)
    finally:
        relay.join(10)
        listener.close()
        os.rename(real, sock)
    assert "run" in seen  # the relay did swap a command
    assert p.returncode == 0 and p.stdout == "own\n", (p.stdout, p.stderr)
    assert any("did not place" in ln for ln in p.debug)  # type: ignore[attr-defined]


def test_place_checks_the_pool_krex_run_talked_to(krexd_factory: Factory, tmp_path: Path) -> None:
    """``place``'s ``pool``: the pid's parent must be that registered pool (else AUTH)."""
    pools = Pools(krexd_factory(config=warm_config()), tmp_path)
    pools.ready()
    zygote = pools.pools()[0]["pid"]
    session = client.PoolSession(str(next(pools.dir.glob("*.sock"))))
    assert session.peer_pid == zygote
    fields = {"mode": "code", "target": "pass", "args": [], "argv": [PY, "-c", "pass"]}
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with Connection(pools.k.socket, timeout_s=5) as c:
            g = c.request("admit", {"argv": ["x"], "launcher_pid": os.getpid()}, timeout_s=10)
        with Connection(pools.k.socket, g["tenant"], g["token"], timeout_s=5) as t:
            child = session.start(fields, {})
            for wrong in (sleeper.pid, os.getpid(), child):
                with pytest.raises(RemoteError) as err:
                    t.request("place", {"pid": child, "pool": wrong})
                assert err.value.name == "AUTH"
            with pytest.raises(RemoteError) as err:  # a launcher's own child is no pool's
                t.request("place", {"pid": sleeper.pid, "pool": zygote})
            assert err.value.name == "AUTH"
            t.request("place", {"pid": child, "pool": zygote})
            session.go()
            t.request("release", {"exit_code": 0})
    finally:
        session.close()
        sleeper.kill()
        sleeper.wait()
