"""Bounded control connections: caps (global and per uid), pace, idle closing, memory trims.

:class:`ConnectionGuard` watches the ROUTER socket's connections
(``krexd.server.conn_events``: libzmq gives no accept hook), refuses those
beyond a cap after answering their first request ``TOO_MANY``, paces each
uid's new ones (``krexd.server.conn_pace``), shuts down idle ones and trims
memory after a burst.  The caps: docs/design/security.md "3. No squatting,
no starvation: no user can stall another".
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

import zmq.asyncio

from krexd.server.conn_caps import EXEMPT_UID, ConnectionCaps
from krexd.server.conn_events import SocketEvents, changes
from krexd.server.conn_pace import DROP, START, STOP, UNPACED, HeldRequests, Release, UidPace
from krexd.server.conn_trim import TRIM_QUIET_S, BurstTrim
from krexd.server.unixsock import peer_uid, shut_down

_log = logging.getLogger("krexd.connections")

REFUSE_GRACE_S = 2.0  # a refused connection's time to send its request and read the reply
REPLY_FLUSH_S = 0.5  # after the refusal's reply, before the shutdown


@dataclass
class _Conn:
    """One open connection: its uid, last activity (monotonic s), requests in progress."""

    uid: int | None
    last: float
    busy: int = 0
    refusal: str = ""  # why it was refused ("" when it was not)
    close_at: float = 0.0  # when a refused connection is shut down (monotonic s)
    charged: bool = False  # its first request has been charged to its uid's pace
    held: HeldRequests = field(default_factory=HeldRequests)  # paced: waiting for its start


@dataclass(frozen=True)
class Verdict:
    """What the server does with one request of a connection (:meth:`ConnectionGuard.verdict`):
    serve it (the default), answer ``refusal`` (``TOO_MANY``, with ``retry_s``
    when asking again later fits), ``hold`` it (:meth:`ConnectionGuard.hold`),
    or ``drop`` it unanswered (krexd does not count its connection as open)."""

    refusal: str = ""
    retry_s: float = 0.0
    hold: bool = False
    drop: bool = False


class ConnectionGuard:
    """Counts the ROUTER socket's connections, enforces the caps, closes idle ones, trims memory.

    "Shut down" is ``shutdown(2)`` on a duplicate of the descriptor: libzmq
    sees end-of-file and closes it itself, so its descriptor is never closed
    behind libzmq's back.  An accepted descriptor may have been reused by the
    time its event is read, and only a Unix stream socket is shut down, so the
    worst case is one other client disconnected (and reconnecting).  A refused
    connection waits at most :data:`REFUSE_GRACE_S` for its request, and at
    most ``REFUSING_MAX`` of them (``REFUSING_PER_UID`` of one uid,
    ``krexd.server.conn_caps``) wait at once; beyond, one is shut down at once,
    silently.  A request of a connection krexd does not count as open (cut at
    accept, or gone before its request was read) is dropped unanswered
    (:meth:`verdict`), so no request is served uncharged.

    Args:
        sock: krexd's bound ROUTER socket.
        max_connections: connections open at once (``[daemon] max_connections``).
        per_uid: connections one uid may hold (``[daemon] max_connections_per_uid``,
            0: no cap; root is exempt).
        idle_s: a connection with no request for this long is closed (seconds,
            ``[daemon] idle_timeout_s``; 0: never).
        per_s_per_uid: new connections of one uid served per second after its burst
            (``[daemon] connections_per_s_per_uid``; 0: no pace; root is exempt).
        burst_per_uid: new connections of one uid served at once before the pace
            (``[daemon] connection_burst_per_uid``).
    """

    def __init__(
        self,
        sock: zmq.asyncio.Socket,
        max_connections: int,
        per_uid: int = 0,
        idle_s: float = 0.0,
        per_s_per_uid: float = 0.0,
        burst_per_uid: int = 1,
    ) -> None:
        self.caps = ConnectionCaps(max_connections, per_uid)
        self.idle_s = idle_s
        self._pace = UidPace(per_s_per_uid, burst_per_uid) if per_s_per_uid > 0 else None
        self._events = SocketEvents(sock)
        self._conns: dict[int, _Conn] = {}
        self.idle_closed = 0
        self.peak = 0
        self._trim = BurstTrim()

    @property
    def open(self) -> int:
        """Connections open now (refused ones waiting for their reply included)."""
        return len(self._conns)

    def status(self) -> dict[str, int | float]:
        """``{"open", "peak", "max", "max_per_uid", "refused", "idle_s", "idle_closed",
        "per_s_per_uid", "burst_per_uid", "paced", "refused_rate"}``."""
        return {
            "open": self.open,
            "peak": self.peak,
            "max": self.caps.max_connections,
            "max_per_uid": self.caps.per_uid,
            "refused": self.caps.refused,
            "idle_s": self.idle_s,
            "idle_closed": self.idle_closed,
            **(self._pace.status() if self._pace is not None else UNPACED),
        }

    def of_uid(self, uid: int) -> int:
        """Connections ``uid`` holds now (refused ones not counted)."""
        return self.caps.of_uid(uid)

    # --- what the server reports ---------------------------------------------------

    def verdict(self, fd: int | None, urgent: bool = False) -> Verdict:
        """What to do with a request that came in on connection ``fd``.

        Called by the server for each request.  A refused connection is shut
        down :data:`REPLY_FLUSH_S` after (its reply is sent first).  The
        connection's first request is charged to its uid's pace: over the
        rate it is held (the server calls :meth:`hold`), or, past
        ``krexd.server.conn_pace.PACE_MAX_S``, refused with ``retry_s`` (the connection stays
        open and uncharged: asking again on it is charged again).  Requests
        behind a held one are held too (order is kept).  ``urgent`` (a region
        operation) is never held for the pace but pays as any other.
        """
        if fd is None:
            return Verdict()
        # The connection's ACCEPTED event may still wait in the monitor's queue.
        self._handle(self._events.read_batch())
        conn = self._conns.get(fd)
        if conn is None:
            return Verdict(drop=True)
        now = conn.last = time.monotonic()  # a held request keeps it from idling
        if conn.refusal:
            conn.close_at = min(conn.close_at, now + REPLY_FLUSH_S)
            return Verdict(refusal=conn.refusal)
        if conn.held.active:
            return Verdict(hold=True)
        if conn.charged or self._pace is None or conn.uid is None or conn.uid == EXEMPT_UID:
            conn.charged = True
            return Verdict()
        charge = self._pace.charge(conn.uid, now, urgent)
        if charge.refusal:
            return Verdict(refusal=charge.refusal, retry_s=charge.retry_s)
        conn.charged = True
        if not charge.wait_s:
            return Verdict()
        conn.held.ready_at = now + charge.wait_s
        return Verdict(hold=True)

    def hold(self, fd: int, release: Release) -> bool:
        """Hold a request of connection ``fd`` until the connection's start; False
        (not held) when ``krexd.server.conn_pace.HELD_MAX`` already wait.

        ``release(START)`` starts it at the connection's start, in the order the
        requests came; ``release(DROP)`` abandons it when the connection ends
        first or krexd restarts, ``release(STOP)`` when krexd stops.
        """
        conn = self._conns[fd]
        return conn.held.add(release, functools.partial(self._start_held, fd, conn))

    def _start_held(self, fd: int, conn: _Conn) -> None:
        """``conn``'s start came: its held requests start, or are dropped if it ended."""
        conn.held.release(START if self._conns.get(fd) is conn else DROP)

    def started(self, fd: int | None) -> None:
        """A request of connection ``fd`` began (it is not idle until it ends)."""
        conn = self._conns.get(fd) if fd is not None else None
        if conn is not None:
            conn.busy += 1
            conn.last = time.monotonic()

    def ended(self, fd: int | None) -> None:
        """A request of connection ``fd`` ended."""
        conn = self._conns.get(fd) if fd is not None else None
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            conn.last = time.monotonic()

    # --- the monitor ------------------------------------------------------------------

    async def run(self) -> None:
        """Read monitor events until cancelled; close refused and idle connections; trim
        memory after a burst (``krexd.server.conn_trim``)."""
        while True:
            if await self._events.wait(TRIM_QUIET_S / 2):
                self._handle(self._events.read_batch())
            self._close_due()
            self._trim.tick(time.monotonic())

    def _handle(self, batch: list[tuple[int, int]]) -> None:
        """Count the connections ``batch`` opened, forget those it ended (in order)."""
        for opened, fd in changes(batch):
            if not opened:
                self._forget(fd)
                continue
            self._trim.opened(time.monotonic())
            self._accepted(fd)

    def _accepted(self, fd: int) -> None:
        """Count a new connection; refuse it when it is beyond a cap."""
        self._forget(fd)  # a reused descriptor whose end we missed
        uid = peer_uid(fd)
        why = self.caps.over_cap(uid, len(self._conns))
        now = time.monotonic()
        conn = _Conn(uid, now)
        if why and self.caps.refusing_full(uid):
            self.caps.refuse(why)
            if shut_down(fd):
                return  # a request it already sent is dropped (verdict), not served
            # No descriptor to spare for the shutdown (a flood): kept as refused, retried.
            conn.refusal, conn.close_at = why, now
        elif why:
            self.caps.refuse(why)
            conn.refusal, conn.close_at = why, now + REFUSE_GRACE_S
        self.caps.opened(uid, bool(conn.refusal))
        self._conns[fd] = conn
        self.peak = max(self.peak, len(self._conns))

    def _forget(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is None:
            return
        if conn.held.active:
            conn.held.release(DROP)
        self.caps.closed(conn.uid, bool(conn.refusal))

    def _close_due(self) -> None:
        """Shut down refused connections past their grace and idle ones."""
        now = time.monotonic()
        if self._pace is not None:
            self._pace.tidy(now)
        for fd, conn in list(self._conns.items()):
            if conn.refusal:
                due = now >= conn.close_at
            else:
                idle = conn.busy == 0 and not conn.held.active
                due = bool(self.idle_s) and idle and now - conn.last >= self.idle_s
            # A shutdown that failed (no descriptor to spare) is tried again at the next
            # pass; the connection stays counted (and served) until it succeeds.
            if due and shut_down(fd):
                if not conn.refusal:
                    self.idle_closed += 1
                self._forget(fd)  # libzmq's DISCONNECTED follows; forgetting twice is harmless

    def stop_held(self) -> None:
        """krexd stops: every held request is answered so (``STOP``)."""
        for conn in self._conns.values():
            conn.held.release(STOP)

    def close(self) -> None:
        """Drop the held requests unanswered (a restart: clients ask the successor);
        stop monitoring."""
        for conn in self._conns.values():
            conn.held.release(DROP)
        self._events.close()
