"""A connection to krexd that survives krexd's restart: reconnect, then re-send.

A request whose krexd went away is sent again, on a fresh connection, to
the krexd that answers ``ping`` next, within ``KREX_RECONNECT_S`` seconds
(default 120); before the command starts (:meth:`Reconnecting.first_ping`)
nothing is waited for.  docs/design/daemon.md "Restarts", "Re-sent requests".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from krex_client.connection import (
    Connection,
    KrexNotListening,
    KrexPermissionDenied,
    KrexUnavailable,
)

DEFAULT_RECONNECT_S = 120.0
SOCKET_GONE_S = 3.0  # a socket file missing this long means krexd was stopped, not restarted
RETRY_MAX_S = 0.25  # the longest pause between two attempts to reach krexd again
STALE_WAIT_S = 10.0  # a socket nobody listens on this long is stale (a restart rebinds sooner)
STALE_REASON = (
    "nothing listens on the socket: krexd is not running (a stale socket file left by a "
    "krexd that crashed or was killed); start krexd, or run again once its restart is done"
)


def reconnect_s() -> float:
    """Seconds a request waits for krexd to come back (``KREX_RECONNECT_S``)."""
    try:
        return max(0.0, float(os.environ.get("KREX_RECONNECT_S", DEFAULT_RECONNECT_S)))
    except ValueError:
        return DEFAULT_RECONNECT_S


class Reconnecting:
    """Like :class:`krex_client.connection.Connection` (``request``, ``close``,
    ``socket``), re-sending a request to the next krexd when the one it went to is gone.

    ``on_reconnect(op)`` is called once per re-send (to say so on stderr).

    Gone means: the socket refuses connections, its file vanished, no reply
    came, or the krexd that took a parked request is no longer the one
    serving.  Attempts back off from 50 ms to 250 ms (a restarted krexd
    answers within a quarter second of listening again; each attempt is one
    ``connect``).  A krexd leaving for a restart, or killed, leaves its socket
    file behind; a stopped one removes it, so a file missing for
    ``SOCKET_GONE_S`` ends the wait early.  A parked ``admit`` re-sent joins
    the new krexd's queue; an error reply is not retried.
    """

    def __init__(
        self,
        socket: str,
        tenant: int | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        on_reconnect: Callable[[str], None] | None = None,
    ) -> None:
        self.socket = socket
        self._tenant = tenant
        self._token = token
        self._timeout_s = timeout_s
        self._on_reconnect = on_reconnect
        self._conn = Connection(socket, tenant, token, timeout_s)
        self.daemon_pid: int | None = None
        self.about: dict[str, Any] = {}  # the last ping reply (krexd.daemon.Daemon.about)

    def _fresh(self) -> None:
        self._conn.close()
        self._conn = Connection(self.socket, self._tenant, self._token, self._timeout_s)

    def _daemon_alive(self) -> None:
        pid = self.daemon_pid
        if pid is None:
            return
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise KrexUnavailable(self.socket, "krexd exited while the command waited") from None
        except PermissionError:
            pass  # alive, owned by root

    def ping(self) -> dict[str, Any]:
        """``ping`` krexd (raises KrexUnavailable at once); remembers its pid."""
        reply = self._conn.request("ping")
        self.daemon_pid = int(reply["pid"])
        self.about = reply
        return reply

    def first_ping(self) -> dict[str, Any]:
        """``ping`` before the command starts; returns krexd's ``ping`` reply.

        Raises at once KrexUnavailable for a missing socket file, after
        :data:`STALE_WAIT_S` for a stale one (nothing listens: :data:`STALE_REASON`;
        a krexd restarting listens again well within it), and KrexPermissionDenied for a
        socket this user may not open.  A krexd that accepts the connection
        but does not answer in time is waited for like a lost krexd.
        """
        try:
            return self.ping()
        except KrexPermissionDenied:
            raise
        except KrexNotListening:
            # A restarting krexd binds its socket again within seconds: wait that
            # long (not the full reconnect time), quietly, before calling it stale.
            if not self._wait_for_krexd(time.monotonic() + STALE_WAIT_S):
                raise KrexUnavailable(self.socket, STALE_REASON) from None
            return self.about
        except KrexUnavailable as exc:
            if not os.path.exists(self.socket):
                raise
            if self._on_reconnect is not None:
                self._on_reconnect("ping")
            if not self._wait_for_krexd(time.monotonic() + reconnect_s()):
                raise exc from None
            return self.about

    def _wait_for_krexd(self, deadline: float) -> bool:
        delay = 0.05
        missing_since: float | None = None
        while time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)
            if os.path.exists(self.socket):
                missing_since = None
            elif missing_since is None:
                missing_since = time.monotonic()
            elif time.monotonic() - missing_since > SOCKET_GONE_S:
                return False  # a stopped krexd removes its socket; a restarting one keeps it
            self._fresh()
            try:
                self.ping()
                return True
            except KrexUnavailable:
                continue
        return False

    def request(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        forever: bool = False,
        while_waiting: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Send ``op``; on a lost krexd, wait for the next one and send it again.

        ``while_waiting`` is called about every 0.5 s while no reply has come
        (``krex run``'s parked ``admit`` says where it is in the queue).
        Raises KrexUnavailable when no krexd answers within :func:`reconnect_s`,
        KrexPermissionDenied at once when this user may not open the socket,
        RemoteError for an error reply.
        """

        def check() -> None:
            self._daemon_alive()
            if while_waiting is not None:
                while_waiting()

        deadline: float | None = None  # set when krexd is first found gone
        while True:
            try:
                return self._conn.request(op, body, timeout_s, forever=forever, check=check)
            except KrexPermissionDenied:
                raise  # not krexd gone: this user may not open its socket
            except KrexUnavailable:
                if deadline is None:
                    deadline = time.monotonic() + reconnect_s()
                if not self._wait_for_krexd(deadline):
                    raise
                if self._on_reconnect is not None:
                    self._on_reconnect(op)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
