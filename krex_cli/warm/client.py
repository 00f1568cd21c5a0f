"""``krex run``'s side of the pool protocol (``krexpool_wire``): check a pool, hand it a command.

:class:`PoolSession` is one command's connection to a pool.  Nothing is
sent before the pool's peer uid (``SO_PEERCRED``) is ``krex run``'s own;
:meth:`PoolSession.hello` gets what the pool is, and :func:`mismatch` says
why it cannot start this command as a cold start would (another krex
version or key, other credentials, resource limits or a nice value it
cannot reproduce).  Every failure is a :class:`PoolUnavailable` whose
message ``krex run -v`` shows before it starts the command cold.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import time
from typing import Any

from krex_cli.warm import krexpool_wire as wire

#: How long ``krex run`` waits for a pool's answers before it starts cold (s).
ANSWER_TIMEOUT_S = 2.0
#: Status of a command whose pool died while it ran: its wait status is lost.
UNKNOWN_STATUS = -1


class PoolUnavailable(Exception):
    """The pool cannot serve this command (the message says why)."""


def _rlimits() -> dict[str, list[int]]:
    return {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in dir(resource)
        if name.startswith("RLIMIT_")
    }


def _umask() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


def _inheritable_fds() -> list[int]:
    """``krex run``'s inheritable descriptors: what a cold command would inherit."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if os.get_inheritable(fd):
                out.append(fd)
        except OSError:
            pass  # the directory listing's own descriptor
    return sorted(out)


def _ignored_signals() -> list[int]:
    ignored = []
    for sig in signal.valid_signals():
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                ignored.append(int(sig))
        except (OSError, ValueError):
            pass
    return ignored


def mismatch(hello: dict[str, Any], version: str, key: str) -> str | None:
    """Why the pool that said ``hello`` cannot start this command as ``krex run`` would."""
    if hello.get("version") != version:
        return f"the pool runs krex {hello.get('version')}, this is {version}"
    if hello.get("key") != key:
        return "the pool serves another key"
    mine = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
    }
    for name, value in mine.items():
        if hello.get(name) != value:
            return f"the pool's {name} is {hello.get(name)}, krex run's {value}"
    privileged = os.geteuid() == 0
    theirs = hello.get("rlimits") or {}
    for name, (_soft, hard) in _rlimits().items():
        pool_hard = (theirs.get(name) or [None, None])[1]
        if pool_hard is None:
            return f"the pool did not report {name}"
        if not privileged and _above(hard, pool_hard):
            return f"{name} hard limit {hard} is above the pool's {pool_hard}"
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if not privileged and nice < int(hello.get("nice", 0)):
        return f"nice {nice} is below the pool's {hello.get('nice')}"
    return None


def _above(limit: int, other: int) -> bool:
    inf = resource.RLIM_INFINITY
    if limit == other:
        return False
    return limit == inf or (other != inf and limit > other)


class PoolSession:
    """One command's connection to the pool listening on ``path`` (PoolUnavailable if none)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(ANSWER_TIMEOUT_S)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise PoolUnavailable(f"no pool listens on {path} ({exc.strerror})") from None
        uid = wire.peer_uid(self.sock)
        if uid != os.getuid():
            self.sock.close()
            raise PoolUnavailable(f"the process on {path} runs as uid {uid}, not {os.getuid()}")
        # The process that listens there, as the kernel says: krexd's ``place`` is told it
        # (``pool``), so that only a child of that process, a registered pool, is placed.
        self.peer_pid = wire.peer_pid(self.sock)

    def _ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        try:
            wire.send(self.sock, message, fds or [])
            reply, extra = wire.recv(self.sock)
        except (OSError, EOFError, wire.WireError) as exc:
            raise PoolUnavailable(f"the pool did not answer: {exc!r}") from None
        for fd in extra:
            os.close(fd)
        return reply

    def hello(self) -> dict[str, Any]:
        """What the pool is (version, key, pid, credentials, limits, modules)."""
        return self._ask({"op": "hello"})

    def start(self, fields: dict[str, Any], env: dict[str, str]) -> int:
        """Have the pool fork the command's process; its pid (not yet running the command).

        ``fields``: ``mode``, ``target``, ``args``, ``argv``.  The process
        gets ``krex run``'s inheritable descriptors at their numbers, its
        working directory, umask, resource limits, nice value, ignored
        signals and signal mask, and ``env``.
        """
        fds = _inheritable_fds()
        if len(fds) + 1 > wire.MAX_FDS:
            raise PoolUnavailable(f"{len(fds)} inheritable file descriptors")
        try:  # O_PATH: a working directory krex run may enter but not read is fine too
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise PoolUnavailable(f"cannot pass the working directory: {exc.strerror}") from None
        try:
            request = {
                "op": "run",
                **fields,
                "env": env,
                "umask": _umask(),
                "rlimits": _rlimits(),
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "fds": fds,
                "ignored": _ignored_signals(),
                "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            }
            reply = self._ask(request, [*fds, cwd])
        finally:
            os.close(cwd)
        if "pid" not in reply:
            raise PoolUnavailable(str(reply.get("error") or "the pool started nothing"))
        return int(reply["pid"])

    def go(self) -> None:
        """Let the command run (after krexd placed its process)."""
        wire.send(self.sock, {"op": "go"})

    def abort(self) -> None:
        """Have the process exit without running the command."""
        try:
            wire.send(self.sock, {"op": "abort"})
        except OSError:
            pass

    def wait(self, pidfd: int, deadline: float | None) -> int | None:
        """The command's wait status; None at ``deadline`` (monotonic s); UNKNOWN_STATUS when
        the pool died first (then this waits for the process itself to end)."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if poller.poll(None if left is None else int(left * 1000) + 1):
                break
            if deadline is not None and time.monotonic() >= deadline:
                return None
        try:
            self.sock.settimeout(ANSWER_TIMEOUT_S)
            reply, _ = wire.recv(self.sock)
            return int(reply["status"])
        except (OSError, EOFError, wire.WireError, KeyError, ValueError):
            pass
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not poller.poll(None if left is None else int(left * 1000) + 1):
            return None
        return UNKNOWN_STATUS

    def close(self) -> None:
        """Close the connection."""
        self.sock.close()
