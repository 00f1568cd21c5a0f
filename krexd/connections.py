"""Bounded control connections: caps (global and per uid), idle closing, memory trims.

libzmq accepts every connection on the ROUTER socket and gives krexd no
accept hook; this module watches the socket's monitor (``ZMQ_EVENT_ACCEPTED``
carries the connection's descriptor, ``ZMQ_EVENT_DISCONNECTED`` its end) and

* reads each connection's uid at accept (``SO_PEERCRED`` on a duplicate of
  its descriptor) and counts connections per uid;
* keeps at most ``[daemon] max_connections`` open in all and
  ``[daemon] max_connections_per_uid`` per uid (root is exempt from the
  latter only: it is still bounded by the former).  A connection beyond a
  cap is *refused*: it stays open for up to :data:`REFUSE_GRACE_S` so that
  its first request gets an error reply naming the cap (``TOO_MANY``; the
  server asks :meth:`ConnectionGuard.refusal` with the message's source
  descriptor), then it is shut down.  At most :data:`REFUSING_MAX` refused
  connections wait that way, :data:`REFUSING_PER_UID` of one uid; beyond
  them one is shut down at once, silently (a request it had sent is lost:
  only a user flooding krexd with connections meets this);
* paces each uid's new connections (``[daemon] connections_per_s_per_uid``,
  a burst of ``connection_burst_per_uid``; root is exempt): a connection is
  charged at its first request (a liveness probe that sends none costs its
  owner nothing).  The first request of a connection over the rate is held
  here until the connection's start (:mod:`krexd.ratelimit`; at most
  :data:`HELD_MAX` requests per connection, kept in order; more are
  refused); one that would wait over
  :data:`PACE_MAX_S` is refused with the seconds after which asking again
  fits (``retry_s``: the request is refused, not the connection, and krex
  clients ask again on it by themselves).  A region operation that is a
  connection's first request is not held but pays as any other (refused
  past the bound).  A user churning
  connections is so held to the rate, whether it waits for its replies or
  not (see the end of this docstring);
* shuts down a connection idle for ``[daemon] idle_timeout_s`` (no request
  received and none in progress: a parked ``admit`` is in progress).  A
  ZeroMQ client reconnects by itself at its next request, so closing an
  idle connection costs its owner nothing but a reconnection;
* returns freed memory to the kernel (``malloc_trim(0)``) once a burst of
  connections has ended, and once more :data:`TRIM_AGAIN_S` later (libzmq
  frees some of a burst's buffers after its disconnection events): every
  connection costs libzmq ~30 KB of buffers, allocated in its I/O thread's
  malloc arena, which glibc does not shrink by
  itself, so without the trim krexd's RSS grew by ~40 MB with each round of
  3,000 simultaneous connections (measured: 30 -> 113 -> 154 -> 184 -> 195 MB).

"Shut down" is ``shutdown(2)`` on a duplicate of the descriptor: libzmq sees
end-of-file and closes it itself, so its descriptor is never closed behind
libzmq's back.  The descriptor of an ACCEPTED event may have been closed and
reused by the time the event is read; an event followed in the same batch by
the connection's end is skipped, and only a Unix stream socket is shut down,
so the worst case is one other client disconnected (and reconnecting).  A
request of a connection krexd does not count as open (cut at accept, or gone
before its request was read: nobody could read a reply) is dropped
unanswered (:meth:`ConnectionGuard.verdict`), so neither a cut nor a client
that closes without waiting for its reply gets a request served uncharged.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from krexd.ratelimit import RateBuckets
from krexd.unixsock import peer_uid, shut_down

_log = logging.getLogger("krexd.connections")

_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
TRIM_AFTER = 64  # connections opened since the last trim before the next one is worth it
TRIM_QUIET_S = 0.5  # a trim waits until no connection has opened for this long
TRIM_AGAIN_S = 2.0  # ... and is made once more this long after: libzmq frees late
REFUSE_GRACE_S = 2.0  # a refused connection's time to send its request and read the reply
REFUSING_MAX = 64  # refused connections kept for their reply at once; more are cut silently
REFUSING_PER_UID = 4  # ... of one uid (so that no user's refused ones crowd out another's)
REPLY_FLUSH_S = 0.5  # after the refusal's reply, before the shutdown
# The longest a paced connection's first request is held: well inside the shortest reply
# timeout of a krex client (2 s: krexctl top, krex run's queue notes, a pool's ping).
PACE_MAX_S = 1.0
HELD_MAX = 4  # requests held for one paced connection; more are refused TOO_MANY
EXEMPT_UID = 0


def _malloc_trim() -> None:
    """``malloc_trim(0)`` where glibc has it; nothing elsewhere."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


#: A held request's continuation, called with what becomes of it: START it, STOP
#: (krexd stops: answer it so), DROP (its connection ended, or krexd restarts and its
#: client asks the successor: no reply).
Release = Callable[[str], None]
START, STOP, DROP = "start", "stop", "drop"


@dataclass
class _Conn:
    """One open connection: its uid, last activity (monotonic s), requests in progress."""

    uid: int | None
    last: float
    busy: int = 0
    refusal: str = ""  # why it was refused ("" when it was not)
    close_at: float = 0.0  # when a refused connection is shut down (monotonic s)
    charged: bool = False  # its first request has been charged to its uid's pace
    ready_at: float = 0.0  # paced: its requests wait until then (monotonic s)
    held: list[Release] = field(default_factory=list)  # requests waiting, in order
    timer: asyncio.TimerHandle | None = None  # releases ``held`` at ``ready_at``


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
        self.max_connections = max_connections
        self.per_uid = per_uid
        self.idle_s = idle_s
        self._pace = (
            RateBuckets(per_s_per_uid, max(1, burst_per_uid), PACE_MAX_S)
            if per_s_per_uid > 0
            else None
        )
        self._monitor: zmq.asyncio.Socket = sock.get_monitor_socket(_EVENTS)
        # The same socket, synchronous: a batch of queued events is read without awaiting.
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(self._monitor.underlying)
        self._conns: dict[int, _Conn] = {}
        self._uids: Counter[int] = Counter()  # served (not refused) connections per uid
        self._refusing: Counter[int | None] = Counter()  # refused ones waiting, per uid
        self.refused = 0
        self.idle_closed = 0
        self.peak = 0
        self._since_trim = 0
        self._last_open = 0.0
        self._trim_again_at = 0.0  # monotonic s of the second trim after a burst (0: none)

    @property
    def open(self) -> int:
        """Connections open now (refused ones waiting for their reply included)."""
        return len(self._conns)

    def status(self) -> dict[str, int | float]:
        """``{"open", "peak", "max", "max_per_uid", "refused", "idle_s", "idle_closed",
        "per_s_per_uid", "burst_per_uid", "paced", "refused_rate"}``."""
        pace = self._pace
        return {
            "open": self.open,
            "peak": self.peak,
            "max": self.max_connections,
            "max_per_uid": self.per_uid,
            "refused": self.refused,
            "idle_s": self.idle_s,
            "idle_closed": self.idle_closed,
            "per_s_per_uid": pace.rate if pace is not None else 0.0,
            "burst_per_uid": int(pace.burst) if pace is not None else 0,
            "paced": pace.paced if pace is not None else 0,
            "refused_rate": pace.refused if pace is not None else 0,
        }

    def of_uid(self, uid: int) -> int:
        """Connections ``uid`` holds now (refused ones not counted)."""
        return self._uids[uid]

    # --- what the server reports ---------------------------------------------------

    def verdict(self, fd: int | None, urgent: bool = False) -> Verdict:
        """What to do with a request that came in on connection ``fd``.

        Called by the server for each request.  A refused connection is shut
        down :data:`REPLY_FLUSH_S` after (its reply is sent first).  The
        connection's first request is charged to its uid's pace: over the
        rate it is held (the server calls :meth:`hold`), or, past
        :data:`PACE_MAX_S`, refused with ``retry_s`` (the connection stays
        open and uncharged: asking again on it is charged again).  Requests
        behind a held one are held too (order is kept).  ``urgent`` (a region
        operation) is never held for the pace but pays as any other.
        """
        if fd is None:
            return Verdict()
        # The connection's ACCEPTED event may still wait in the monitor's queue.
        self._handle(self._read_batch())
        conn = self._conns.get(fd)
        if conn is None:
            return Verdict(drop=True)
        now = conn.last = time.monotonic()  # a held request keeps it from idling
        if conn.refusal:
            conn.close_at = min(conn.close_at, now + REPLY_FLUSH_S)
            return Verdict(refusal=conn.refusal)
        if conn.timer is not None or conn.held:
            return Verdict(hold=True)
        if conn.charged or self._pace is None or conn.uid is None or conn.uid == EXEMPT_UID:
            conn.charged = True
            return Verdict()
        pace = self._pace.take(conn.uid, now, force=urgent)
        if pace.refused:
            retry = max(0.1, pace.retry_s)
            return Verdict(
                refusal=(
                    f"uid {conn.uid} opens connections to krexd faster than "
                    f"[daemon] connections_per_s_per_uid ({self._pace.rate:g}/s after a burst "
                    f"of {int(self._pace.burst)}); asking again after {retry:.1f} s fits"
                ),
                retry_s=retry,
            )
        conn.charged = True
        if not pace.wait_s:
            return Verdict()
        conn.ready_at = now + pace.wait_s
        return Verdict(hold=True)

    def hold(self, fd: int, release: Release) -> bool:
        """Hold a request of connection ``fd`` until the connection's start; False
        (not held) when :data:`HELD_MAX` already wait.

        ``release(START)`` starts it at the connection's start, in the order the
        requests came; ``release(DROP)`` abandons it when the connection ends
        first or krexd restarts, ``release(STOP)`` when krexd stops.
        """
        conn = self._conns[fd]
        if len(conn.held) >= HELD_MAX:
            return False
        conn.held.append(release)
        if conn.timer is None:
            delay = max(0.0, conn.ready_at - time.monotonic())
            conn.timer = asyncio.get_running_loop().call_later(delay, self._release, fd, conn)
        return True

    def _release(self, fd: int, conn: _Conn) -> None:
        conn.timer, conn.ready_at = None, 0.0
        held, conn.held = conn.held, []
        _run_releases(held, START if self._conns.get(fd) is conn else DROP)

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
        """Read monitor events until cancelled; close refused and idle connections."""
        while True:
            try:
                ready = bool(await asyncio.wait_for(self._monitor.poll(), TRIM_QUIET_S / 2))
            except TimeoutError:
                ready = False
            if ready:
                self._handle(self._read_batch())
            self._close_due()
            now = time.monotonic()
            quiet = now - self._last_open > TRIM_QUIET_S
            if self._since_trim >= TRIM_AFTER and quiet:
                self._since_trim = 0
                self._trim_again_at = now + TRIM_AGAIN_S
                _malloc_trim()
            elif self._trim_again_at and now >= self._trim_again_at and quiet:
                # The first trim can come while libzmq's I/O thread still holds the
                # burst's buffers (it frees them after the DISCONNECTED events): once
                # more, so that they do not wait for the next burst.
                self._trim_again_at = 0.0
                _malloc_trim()

    def _read_batch(self) -> list[tuple[int, int]]:
        """Every monitor event queued now, as (event, fd)."""
        batch: list[tuple[int, int]] = []
        while True:
            try:
                frames = self._sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return batch
            msg = parse_monitor_message(frames)
            batch.append((int(msg["event"]), int(msg["value"])))

    def _handle(self, batch: list[tuple[int, int]]) -> None:
        for i, (event, fd) in enumerate(batch):
            if event != zmq.EVENT_ACCEPTED:
                self._forget(fd)
                continue
            if any(e != zmq.EVENT_ACCEPTED and f == fd for e, f in batch[i + 1 :]):
                continue  # already gone
            self._since_trim += 1
            self._last_open = time.monotonic()
            self._accepted(fd)

    def _accepted(self, fd: int) -> None:
        """Count a new connection; refuse it when it is beyond a cap."""
        self._forget(fd)  # a reused descriptor whose end we missed
        uid = peer_uid(fd)
        why = self._over_cap(uid)
        now = time.monotonic()
        conn = _Conn(uid, now)
        if why and (
            sum(self._refusing.values()) >= REFUSING_MAX or self._refusing[uid] >= REFUSING_PER_UID
        ):
            self._refused(why)
            if shut_down(fd):
                return  # a request it already sent is dropped (verdict), not served
            # No descriptor to spare for the shutdown (a flood): kept as refused, retried.
            conn.refusal, conn.close_at = why, now
            self._refusing[uid] += 1
        elif why:
            self._refused(why)
            conn.refusal, conn.close_at = why, now + REFUSE_GRACE_S
            self._refusing[uid] += 1
        elif uid is not None:
            self._uids[uid] += 1
        self._conns[fd] = conn
        self.peak = max(self.peak, len(self._conns))

    def _over_cap(self, uid: int | None) -> str:
        """Why a connection of ``uid`` may not be served now ("" when it may)."""
        served = len(self._conns) - sum(self._refusing.values())
        if served >= self.max_connections:
            return (
                f"krexd has {served} connections open, its cap ([daemon] max_connections); "
                "try again later"
            )
        if uid is None or uid == EXEMPT_UID or not self.per_uid:
            return ""
        mine = self._uids[uid]
        if mine >= self.per_uid:
            return (
                f"uid {uid} already has {mine} connections open to krexd "
                "([daemon] max_connections_per_uid); end some of its krex commands first"
            )
        return ""

    def _refused(self, why: str) -> None:
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            _log.warning("connection refused (%d so far): %s", self.refused, why)

    def _forget(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is not None and (conn.timer is not None or conn.held):
            self._abandon(conn)
        if conn is not None and conn.refusal:
            self._refusing[conn.uid] -= 1
            if self._refusing[conn.uid] <= 0:
                del self._refusing[conn.uid]
        elif conn is not None and conn.uid is not None:
            self._uids[conn.uid] -= 1
            if self._uids[conn.uid] <= 0:
                del self._uids[conn.uid]

    def _close_due(self) -> None:
        """Shut down refused connections past their grace and idle ones."""
        now = time.monotonic()
        if self._pace is not None and len(self._pace) > 64:
            self._pace.forget_full(now)
        for fd, conn in list(self._conns.items()):
            if conn.refusal:
                due = now >= conn.close_at
            else:
                idle = conn.busy == 0 and not conn.held and conn.timer is None
                due = bool(self.idle_s) and idle and now - conn.last >= self.idle_s
            # A shutdown that failed (no descriptor to spare) is tried again at the next
            # pass; the connection stays counted (and served) until it succeeds.
            if due and shut_down(fd):
                if not conn.refusal:
                    self.idle_closed += 1
                self._forget(fd)  # libzmq's DISCONNECTED follows; forgetting twice is harmless

    @staticmethod
    def _abandon(conn: _Conn, how: str = DROP) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        held, conn.timer, conn.held = conn.held, None, []
        _run_releases(held, how)

    def stop_held(self) -> None:
        """krexd stops: every held request is answered so (``STOP``)."""
        for conn in self._conns.values():
            self._abandon(conn, STOP)

    def close(self) -> None:
        """Drop the held requests unanswered (a restart: clients ask the successor);
        stop monitoring."""
        for conn in self._conns.values():
            self._abandon(conn)
        self._monitor.close(linger=0)


def _run_releases(held: list[Release], how: str) -> None:
    """Call each held request's continuation; one that raises does not stop the rest."""
    for release in held:
        try:
            release(how)
        except Exception:  # an op's bug must not leave the others held or krexd's loop dead
            _log.exception("a held request's %s failed", how)
