"""``krex run --warm``: start the command in a process forked from a warm pool, or say why not.

:func:`attempt`, called by ``krex_cli.run`` once the command is admitted,
returns the command's wait status, or None: ``krex run`` then starts it
cold, after one debug line with the reason.  A pool never makes a command
fail.  The steps: docs/design/warm.md "A warm command, step by step".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from krex_cli import __version__
from krex_cli.reconnect import Reconnecting
from krex_cli.warm import client, plan, pooldir
from krex_client import cold_reasons
from krex_client.connection import KrexUnavailable, RemoteError

#: Signals ``krex run`` forwards to the command's process group.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


#: ``krex run -v`` sets it: the debug lines are shown (as with ``KREX_LOG=debug``).
verbose = False


def debug_enabled() -> bool:
    """True when ``krex run`` says what it does (``-v``, or ``KREX_LOG=debug``)."""
    return verbose or os.environ.get("KREX_LOG", "").lower() == "debug"


def debug(msg: str) -> None:
    """One ``krex: warm: ...`` line on stderr when debugging is on."""
    if debug_enabled():
        print(f"krex: warm: {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Ended:
    """How a warm command ended: its wait ``status`` (``os.waitpid``'s, or
    :data:`client.UNKNOWN_STATUS` when its pool died first) and whether
    ``--timeout`` killed it."""

    status: int
    timed_out: bool


def attempt(
    tenant: Reconnecting,
    argv: Sequence[str],
    path: str,
    env: dict[str, str],
    granted: dict[str, Any],
    place: dict[str, Any],
    timeout_s: float | None,
    settings: plan.Settings,
) -> Ended | None:
    """Run the command warm; how it ended (None: start it cold; see the module docstring).

    ``path``: the interpreter it execs; ``env``: its environment;
    ``granted``: krexd's ``admit`` reply; ``place``: the extra fields of
    ``place`` (the slot memory); ``timeout_s``: ``--timeout``;
    ``settings``: krexd's ``[warm]``.  Raises what ``place`` raises when
    krexd is unreachable (as a cold start does).
    """
    try:
        made = plan.make_plan(
            argv, path, env, list(granted.get("env") or {}), settings, tenant.socket
        )
        if isinstance(made, str):
            cold(place, settings, cold_reasons.COMMAND, made)
            return None
        files = pooldir.PoolFiles(pooldir.directory(note=debug), made.key)
        session = _session(files, made)
    except pooldir.PoolDirError as exc:
        cold(place, settings, cold_reasons.POOL_DIRECTORY, f"pool directory: {exc}")
        return None
    except Exception as exc:  # noqa: BLE001 - a pool never makes a command fail
        cold(place, settings, cold_reasons.ERROR, repr(exc))
        return None
    if isinstance(session, str):
        cold(place, settings, session, None)
        return None
    try:
        ended = _serve(session, tenant, made, env, place, timeout_s)
    finally:
        session.close()
    if ended is None:  # the pool could not start it (said already)
        cold(place, settings, cold_reasons.ERROR, None)
    return ended


def cold(place: dict[str, Any], settings: plan.Settings, category: str, why: str | None) -> None:
    """Start cold for ``category`` (``krex_client.cold_reasons``): one debug line with
    ``why`` (None: said already), and the category in ``place`` where krexd counts it
    (``settings.cold_reasons``)."""
    if why is not None:
        debug(f"cold start: {why}")
    if settings.cold_reasons:
        place["cold"] = category


def _session(files: pooldir.PoolFiles, made: plan.Plan) -> client.PoolSession | str:
    """A checked connection to the key's pool; otherwise why not, as a category of
    ``krex_client.cold_reasons`` (a new pool started where none is)."""
    try:
        session = client.PoolSession(files.socket)
    except client.PoolUnavailable as exc:
        debug(f"cold start: {exc}")
        return _start_pool(files, made)
    try:
        why = client.mismatch(session.hello(), __version__, made.key)
    except client.PoolUnavailable as exc:
        why = str(exc)
    if why is not None:
        debug(f"cold start: {why}")
        session.close()
        return cold_reasons.MISMATCH
    return session


def _start_pool(files: pooldir.PoolFiles, made: plan.Plan) -> str:
    """Start a keeper for this key unless one lives or the last pool refused recently;
    the cold reason of this command (``krex_client.cold_reasons``)."""
    if files.keeper_alive():
        debug("a pool for this command is starting")
        return cold_reasons.POOL_STARTING
    try:
        age = time.time() - os.stat(files.refused).st_mtime
        if age < made.settings.idle_s:
            with open(files.refused) as f:
                debug(f"the last pool for this key refused to serve: {f.read().strip()}")
            return cold_reasons.POOL_REFUSED
    except OSError:
        pass
    start = files.path(f".start-{os.getpid()}.json")
    cmd = made.command
    cfg = {
        "krexd_socket": made.krexd_socket,
        "directory": files.directory,
        "key": made.key,
        "version": __version__,
        "path": cmd.path,
        "argv0": cmd.argv[0],
        "flags": list(cmd.flags),
        "env": made.zygote_env,
        "modules": list(made.settings.modules),
        "idle_s": made.settings.idle_s,
    }
    fd = os.open(start, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    log = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        subprocess.Popen(
            [sys.executable, "-m", "krex_cli.warm.keeper", start],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd="/",
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("KREX_")},
        )
    except OSError as exc:
        debug(f"cannot start a pool: {exc}")
        return cold_reasons.ERROR
    finally:
        os.close(log)
    debug(f"starting a pool for this command (log {files.log})")
    return cold_reasons.NO_POOL


def _serve(
    session: client.PoolSession,
    tenant: Reconnecting,
    made: plan.Plan,
    env: dict[str, str],
    place: dict[str, Any],
    timeout_s: float | None,
) -> Ended | None:
    cmd = made.command
    fields = {"mode": cmd.mode, "target": cmd.target, "args": list(cmd.args), "argv": cmd.argv}
    try:
        pid = session.start(fields, env)
        pidfd = os.pidfd_open(pid)
    except (client.PoolUnavailable, OSError) as exc:
        session.abort()
        debug(f"cold start: {exc}")
        return None
    try:
        try:
            tenant.request("place", {"pid": pid, "pool": session.peer_pid, **place})
        except RemoteError as exc:
            session.abort()
            debug(f"cold start: krexd did not place the pool's process: {exc.message}")
            return None
        except KrexUnavailable:
            session.abort()
            raise
        debug(f"served by pool {session.path} (pid {pid})")
        return _run(session, pid, pidfd, timeout_s)
    finally:
        os.close(pidfd)


def _run(session: client.PoolSession, pid: int, pidfd: int, timeout_s: float | None) -> Ended:
    """``go``, forward signals, honour the timeout; how the command ended."""
    timed_out = False
    old = {sig: signal.signal(sig, _forwarder(pid)) for sig in FORWARDED}
    try:
        session.go()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        status = session.wait(pidfd, deadline)
        if status is None:
            timed_out = True
            _killpg(pid, signal.SIGKILL)
            status = session.wait(pidfd, None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    assert status is not None
    return Ended(status, timed_out)


def _forwarder(pgid: int) -> Callable[[int, Any], None]:
    def forward(signum: int, _frame: Any) -> None:
        _killpg(pgid, signum)

    return forward


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
