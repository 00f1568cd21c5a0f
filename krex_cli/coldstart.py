"""``krex run``'s cold start: fork, have krexd place the child, exec CMD, wait.

Steps 3-6 of ``krex_cli.run.run`` (its docstring): the child puts itself in its
own process group and blocks on a pipe; ``place`` moves it into the tenant
cgroup; only then the pipe is written and the child ``exec``s CMD, so CMD's
first instruction already runs in the cgroup.  Signals to ``krex run`` are
forwarded to CMD's group, which is the terminal's foreground group while it
runs when ``krex run`` owns the terminal; ``--timeout`` kills the group.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from krex_cli.reconnect import Reconnecting
from krex_client.connection import KrexUnavailable, RemoteError
from krex_client.errors import ExitCode

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def resolve(cmd: str, env: dict[str, str]) -> tuple[str | None, int, str]:
    """Path of ``cmd`` (PATH lookup as execvp does), or (None, exit code, why) as a shell says.

    127 ``command not found`` (no ``/``, not on PATH) or ``No such file or
    directory``; 126 ``Is a directory`` or ``Permission denied`` (bash's codes
    and words).
    """
    if "/" not in cmd:
        found = shutil.which(cmd, path=env.get("PATH", os.defpath))
        return (found, 0, "") if found else (None, ExitCode.NOT_FOUND, "command not found")
    if not os.path.exists(cmd):
        return None, ExitCode.NOT_FOUND, os.strerror(errno.ENOENT)
    if os.path.isdir(cmd):
        return None, ExitCode.CANNOT_EXEC, os.strerror(errno.EISDIR)
    if not os.access(cmd, os.X_OK):
        return None, ExitCode.CANNOT_EXEC, os.strerror(errno.EACCES)
    return cmd, 0, ""


def _child(read_fd: int, path: str, argv: list[str], env: dict[str, str]) -> None:
    """In the forked child: wait until placed, then exec CMD (never returns).

    When the exec itself fails (the file changed since :func:`_resolve`, or it
    is no program: ``Exec format error``), one line on stderr says why and the
    exit code is 127 for a missing file, 126 otherwise.
    """
    try:
        os.setpgid(0, 0)
        for sig in (*FORWARDED_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTTOU):
            signal.signal(sig, signal.SIG_DFL)
        go = os.read(read_fd, 1)
        os.close(read_fd)
        if go != b"1":
            os._exit(ExitCode.CANNOT_EXEC)
        os.execve(path, argv, env)
    except OSError as exc:
        code = ExitCode.NOT_FOUND if exc.errno == errno.ENOENT else ExitCode.CANNOT_EXEC
        with contextlib.suppress(OSError):
            os.write(2, f"krex: {argv[0]}: {exc.strerror}\n".encode(errors="replace"))
        os._exit(code)
    except BaseException:
        pass
    os._exit(ExitCode.CANNOT_EXEC)


@contextlib.contextmanager
def _terminal_foreground(pgid: int) -> Iterator[None]:
    """Make ``pgid`` the terminal's foreground group while CMD runs, when we own the terminal."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else -1
    ours = False
    if fd >= 0:
        try:
            ours = os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            ours = False
    if ours:
        _tcsetpgrp(fd, pgid)
    try:
        yield
    finally:
        if ours:
            _tcsetpgrp(fd, os.getpgrp())


def _tcsetpgrp(fd: int, pgid: int) -> None:
    # A background group calling tcsetpgrp gets SIGTTOU unless it is ignored.
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _wait(pid: int, timeout_s: float | None) -> int | None:
    """Wait for child ``pid``; its wait status, or None when ``timeout_s`` passed first."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while True:
            left_ms = None if deadline is None else max(0, (deadline - time.monotonic()) * 1000)
            if poller.poll(None if left_ms is None else int(left_ms) + 1):
                _, status = os.waitpid(pid, 0)
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
    finally:
        os.close(pidfd)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def run_cold(
    tenant: Reconnecting,
    path: str,
    argv: list[str],
    env: dict[str, str],
    place: dict[str, Any],
    timeout_s: float | None,
) -> int | None:
    """Fork, place, exec, wait (steps 3-6): CMD's wait status, None when ``--timeout`` killed it."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_fd)
        _child(read_fd, path, argv, env)
    os.close(read_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done by the child: whichever runs first wins the race
    try:
        tenant.request("place", {"pid": pid, **place})
    except (KrexUnavailable, RemoteError):
        os.close(write_fd)
        _killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise  # krex run releases the tenant
    forward = _forwarder(pid)
    old_handlers = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        with _terminal_foreground(pid):
            os.write(write_fd, b"1")
            os.close(write_fd)
            status = _wait(pid, timeout_s)
            if status is None:
                _killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
    return status


def _forwarder(pgid: int) -> Any:
    def forward(signum: int, _frame: FrameType | None) -> None:
        _killpg(pgid, signum)

    return forward
