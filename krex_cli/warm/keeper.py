"""A warm pool's keeper: starts the zygote, registers it with krexd, watches both.

    python -m krex_cli.warm.keeper START_FILE

Started detached by the first ``krex run --warm`` of a key that finds no
pool; runs as the user under krex's interpreter (it speaks krexd's
protocol).  Its steps: :func:`main`; docs/design/warm.md "Processes".
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import sys
import time
from typing import Any

from krex_client.connection import Connection, KrexUnavailable, RemoteError

KEEPALIVE_S = 2.0
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "krexpool_zygote.py")


def log(msg: str) -> None:
    """One line in the pool's log (our stderr)."""
    print(f"{time.strftime('%H:%M:%S')} keeper {os.getpid()}: {msg}", file=sys.stderr, flush=True)


def _lock(path: str) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


# The zygote's first program: krex's own interpreter, isolated (-I: no user
# site-packages, no PYTHON* variables; -S: no site), which waits for one byte
# on the descriptor argv[1] and only then execs the command's interpreter.
# The keeper registers it in between, so the interpreter's start-up (.pth
# files, sitecustomize: files the user's commands can write) already runs in
# the pool's cgroup (docs/design/security.md §8).
_EXEC_WHEN_REGISTERED = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "go = os.read(fd, 1)\n"
    "os.close(fd)\n"
    "if go != b'1':\n"
    "    os._exit(70)\n"
    "os.execve(sys.argv[2], sys.argv[3:], os.environ)\n"
)


def _start_zygote(cfg: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int]:
    """The zygote's process, stopped before its interpreter starts, and the descriptor
    whose one byte ``b"1"`` lets it start (closing it ends the process, exit 70)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        zygote = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _EXEC_WHEN_REGISTERED, str(r), str(cfg["path"])]
            + [str(cfg["argv0"]), *cfg["flags"], ZYGOTE],
            env={str(k): str(v) for k, v in cfg["env"].items()},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stderr.fileno(),
            cwd="/",
            close_fds=True,
            pass_fds=(r,),
        )
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return zygote, w


def _let_start(go: int, start: bool) -> int:
    """Let the registered zygote's interpreter start (``start``), or end it; returns -1.

    ``go`` -1: already done, nothing to do.
    """
    if go < 0:
        return -1
    try:
        if start:
            os.write(go, b"1")
    finally:
        os.close(go)
    return -1


def _register(conn: Connection, zygote: subprocess.Popen[bytes], cfg: dict[str, Any]) -> int:
    """Register the zygote; krexd's pid (raises KrexUnavailable / RemoteError)."""
    about = conn.request("ping")
    reply = conn.request(
        "pool_register",
        {
            "pid": zygote.pid,
            "key": cfg["key"],
            "version": cfg["version"],
            "interpreter": cfg["path"],
            "modules": list(cfg["modules"]),
        },
    )
    log(f"zygote {zygote.pid} registered with krexd {about['pid']}: cgroup {reply.get('cgroup')}")
    return int(about["pid"])


def _first_word(zygote: subprocess.Popen[bytes], cfg: dict[str, Any]) -> dict[str, Any]:
    """Send the settings; the zygote's ``ready`` or ``refused`` line ({} when it died)."""
    assert zygote.stdin is not None and zygote.stdout is not None
    settings = {
        "socket": os.path.join(cfg["directory"], cfg["key"] + ".sock"),
        "key": cfg["key"],
        "version": cfg["version"],
        "idle_s": cfg["idle_s"],
        "modules": cfg["modules"],
        # Registered: the zygote is in its pool cgroup; a child krexd did not move out of it
        # (not placed) must never run a command (krexpool_child.become).
        "placed_only": True,
    }
    try:
        zygote.stdin.write((json.dumps(settings) + "\n").encode())
        zygote.stdin.flush()
        line = zygote.stdout.readline()
        return dict(json.loads(line)) if line.strip() else {}
    except (OSError, ValueError):
        return {}  # it died (its log says why)


def _watch(zygote: subprocess.Popen[bytes], conn: Connection, krexd_pid: int) -> None:
    """Until the zygote exits: ping krexd; close the zygote's stdin once krexd is lost."""
    assert zygote.stdin is not None and zygote.stdout is not None
    out = zygote.stdout.fileno()
    lost = False
    while True:
        ready, _, _ = select.select([out], [], [], KEEPALIVE_S)
        if ready and not os.read(out, 4096):
            break  # the zygote exited
        if lost:
            continue
        try:
            pid = int(conn.request("ping", timeout_s=KEEPALIVE_S)["pid"])
        except (KrexUnavailable, RemoteError) as exc:
            why = f"krexd is gone ({exc})"
        else:
            if pid == krexd_pid:
                continue
            why = f"krexd restarted (pid {pid}, registered with {krexd_pid})"
        log(f"{why}: the pool stops accepting")
        zygote.stdin.close()
        lost = True


def _refused(cfg: dict[str, Any], why: str) -> None:
    """Log why this key's pool does not serve and keep it in ``<key>.refused`` (krex run reads
    it and starts no pool of this key for the idle lifetime)."""
    log(f"the pool refused to serve: {why}")
    with open(os.path.join(cfg["directory"], cfg["key"] + ".refused"), "w") as f:
        f.write(why + "\n")


def main(argv: list[str]) -> int:
    """Keep one pool; always 0 (the pool is a cache: krex run never depends on it).

    ``START_FILE`` (JSON, removed once read): ``krexd_socket``,
    ``directory``, ``key``, ``version``, ``path`` (the interpreter),
    ``argv0``, ``flags``, ``env`` (the zygote's), ``modules``, ``idle_s``.

    1. Take the key's lock (``<key>.lock``); another keeper holding it means
       a pool is starting or serving: exit.
    2. Start the zygote's process, stopped before its interpreter starts
       (krex's own interpreter, isolated, waits on a pipe), its stdin and
       stdout pipes to us, its stderr to the pool's log.
    3. ``pool_register`` it with krexd (our child, our uid, counted, moved
       into a pool cgroup); only then it execs the command's interpreter
       with ``krexpool_zygote.py``, so even the interpreter's start-up runs
       in the pool.  Refused: it exits unstarted, and so do we.
    4. Send it its settings; it imports the modules and says ``ready`` or
       ``refused`` (then ``<key>.refused`` keeps the reason, so ``krex run``
       does not start the same failing pool for every command).
    5. Every ``KEEPALIVE_S`` ping krexd: when it is gone or another krexd
       answers, close the zygote's stdin (it stops accepting, lets its
       commands finish and exits).  When the zygote exits, so does the
       keeper; krexd forgets the pool when either process ends.
    """
    with open(argv[0]) as f:
        cfg = json.load(f)
    os.unlink(argv[0])
    lock = _lock(os.path.join(cfg["directory"], cfg["key"] + ".lock"))
    if lock is None:
        return 0
    try:
        zygote, go = _start_zygote(cfg)
    except OSError as exc:
        _refused(cfg, f"cannot start {cfg['path']}: {exc.strerror}")
        os.close(lock)
        return 0
    assert zygote.stdin is not None
    conn = Connection(str(cfg["krexd_socket"]), timeout_s=10.0)
    try:
        try:
            krexd_pid = _register(conn, zygote, cfg)
        except (KrexUnavailable, RemoteError) as exc:
            log(f"krexd did not register the pool: {exc}")
            go = _let_start(go, False)
            zygote.stdin.close()
            return 0
        go = _let_start(go, True)
        word = _first_word(zygote, cfg)
        if not word.get("ready"):
            _refused(cfg, str(word.get("refused") or "the zygote ended before it was ready"))
            zygote.stdin.close()
            return 0
        log(f"pool {zygote.pid} ready: imported {', '.join(word.get('modules') or []) or '-'}")
        _watch(zygote, conn, krexd_pid)
        return 0
    finally:
        _let_start(go, False)  # an unexpected error before registration: end it
        zygote.wait()
        log(f"zygote {zygote.pid} ended ({zygote.returncode})")
        conn.close()
        os.close(lock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
