"""A warm pool's server loop: accept ``krex run``'s requests, fork one child per command.

Standard library only (it runs in the zygote).  For each ``run`` it forks;
:meth:`Server.run` *returns* the child's ``krexpool_child.Command`` to the
zygote script, and the zygote reaps each child through a pidfd and sends
its wait status back.  Only the pool's own uid is served (``SO_PEERCRED``).
docs/design/warm.md "A warm command, step by step".
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krex_cli.warm import krexpool_child as child
    from krex_cli.warm import krexpool_wire as wire
else:
    try:  # the zygote: run by file path, it imports its siblings by these names
        import krexpool_child as child
        import krexpool_wire as wire
    except ImportError:  # imported as part of krex_cli (tests, tools)
        from krex_cli.warm import krexpool_child as child
        from krex_cli.warm import krexpool_wire as wire

#: Longest wait for one message of a request before the connection is dropped (s).
REQUEST_TIMEOUT_S = 5.0
_RLIMITS = [n for n in dir(resource) if n.startswith("RLIMIT_")]


def log(msg: str) -> None:
    """One line in the pool's log (the zygote's stderr, a file the keeper opened)."""
    try:
        os.write(2, f"{time.strftime('%H:%M:%S')} pool {os.getpid()}: {msg}\n".encode())
    except OSError:
        pass


def identity() -> dict[str, Any]:
    """What ``krex run`` compares with itself before it sends a command (the ``hello`` reply)."""
    limits = {}
    for name in _RLIMITS:
        limits[name] = list(resource.getrlimit(getattr(resource, name)))
    return {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
        "rlimits": limits,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }


class Server:
    """Serves ``run`` requests on ``config["socket"]`` (see the module docstring).

    ``config``: ``socket`` (path), ``key``, ``version``, ``idle_s``, ``placed_only``
    (the zygote is registered with krexd: its children run a command only once
    krexd moved them out of the pool's cgroup, :func:`krexpool_child.become`);
    ``boot``: the interpreter as it started (``krexpool_child.Boot``);
    ``hello``: extra keys of the ``hello`` reply (the modules imported).

    Stops accepting when the keeper closes the zygote's stdin (krexd gone or
    restarted, or the keeper ended), on SIGTERM, or after ``idle_s`` seconds
    without a request once its last child ended; exits when its children have
    ended.
    """

    def __init__(self, config: dict[str, Any], boot: child.Boot, hello: dict[str, Any]) -> None:
        self.path = str(config["socket"])
        self.key = str(config["key"])
        self.version = str(config["version"])
        self.idle_s = float(config["idle_s"])
        self.boot = boot
        # The pool's own cgroup (krexd moved the zygote there before sending the settings).
        self.pool_cgroup = child.own_cgroup() if config.get("placed_only") else None
        self.hello = {"ok": True, "key": self.key, "version": self.version, **hello}
        self.listener: socket.socket | None = None
        self._bound = 0
        self._wake: tuple[int, int] | None = None
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, conn)
        self.accepting = True
        self.last_activity = time.monotonic()
        self.served = 0

    def bind(self) -> None:
        """Listen on the socket path (a file left there is stale: the keeper's lock is ours)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        listener.listen(64)
        self.listener = listener
        self._bound = os.stat(self.path).st_ino  # the file is removed at the end only if ours
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(0, selectors.EVENT_READ, "keeper")
        # SIGTERM (krexd stopping, or the user): stop accepting at once, not at the next tick.
        self._wake = os.pipe()
        for fd in self._wake:
            os.set_blocking(fd, False)
        self.sel.register(self._wake[0], selectors.EVENT_READ, "wake")
        signal.set_wakeup_fd(self._wake[1])
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, _sig: int, _frame: object) -> None:
        self.accepting = False

    def run(self) -> child.Command | None:
        """Serve until stopped and idle; the command to run when this is a forked child."""
        while self.children or self.accepting:
            if self.accepting and not self.children:
                if time.monotonic() - self.last_activity > self.idle_s:
                    log(f"idle for {self.idle_s:g} s: exiting")
                    self.accepting = False
                    continue
            if not self.accepting:
                self._stop_listening()
            for skey, _ in self.sel.select(timeout=1.0):
                what = skey.data
                if what == "accept" and self.accepting:
                    command = self._accept()
                    if command is not None:
                        return command
                elif what == "wake":
                    os.read(skey.fd, 4096)
                elif what == "keeper":
                    if not os.read(0, 4096):
                        log("keeper closed the pool (krexd gone, restarted, or keeper ended)")
                        self.accepting = False
                        self.sel.unregister(0)
                elif isinstance(what, int):
                    self._reap(what)
        self._stop_listening()
        log(f"exiting after {self.served} command(s)")
        return None

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        self.sel.unregister(self.listener)
        try:
            if os.stat(self.path).st_ino == self._bound:
                os.unlink(self.path)
        except OSError:
            pass
        self.listener.close()
        self.listener = None

    def _accept(self) -> child.Command | None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        try:
            if wire.peer_uid(conn) != os.getuid():
                log(f"refused a connection of uid {wire.peer_uid(conn)}")
                conn.close()
                return None
            conn.settimeout(REQUEST_TIMEOUT_S)
            return self._converse(conn)
        except (OSError, EOFError, wire.WireError, ValueError, KeyError, TypeError) as exc:
            log(f"request dropped: {exc!r}")
            conn.close()
            return None

    def _converse(self, conn: socket.socket) -> child.Command | None:
        """``hello`` then ``run`` on one connection; forks for ``run``."""
        while True:
            req, fds = wire.recv(conn, wire.MAX_FDS)
            if req.get("op") == "hello":
                wire.send(conn, {**self.hello, **identity(), "children": len(self.children)})
                continue
            if req.get("op") != "run" or len(fds) != len(req["fds"]) + 1:
                for fd in fds:
                    os.close(fd)
                raise wire.WireError(f"unexpected request {str(req.get('op'))[:32]!r}")
            return self._fork(conn, req, fds)

    def _fork(
        self, conn: socket.socket, req: dict[str, Any], fds: list[int]
    ) -> child.Command | None:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # EAGAIN: the pool's cgroup holds [warm] pids_max tasks
            for fd in fds:
                os.close(fd)
            try:
                wire.send(conn, {"error": f"the pool cannot fork: {exc.strerror}"})
            except OSError:
                pass  # krex run is gone
            conn.close()
            return None
        if pid == 0:
            self._close_in_child(conn)
            return child.become(conn, req, fds, self.boot, self.pool_cgroup)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, pidfd)
        self.served += 1
        self.last_activity = time.monotonic()
        return None

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            conn.settimeout(REQUEST_TIMEOUT_S)
            wire.send(conn, {"status": status})
        except OSError:
            pass  # krex run is gone
        conn.close()
        self.last_activity = time.monotonic()

    def _close_in_child(self, conn: socket.socket) -> None:
        """In a fresh child: let go of the server's descriptors through their owners.

        Closing them through their objects (not by number) keeps a later
        garbage collection from closing a number the command reuses.
        """
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        for pidfd, (_, other) in self.children.items():
            other.close()
            os.close(pidfd)
        self.children.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self.sel.close()
        del conn
