"""The control-plane server: one ZeroMQ ROUTER on ``ipc://<socket>``, ops from control.OPS.

Each valid request runs in its own task with its kernel-verified caller
(``krexd.tenancy.identity``); malformed input gets the error it earns and
never stops the loop (docs/design/daemon.md "Malformed input").  The socket
file gets ``[daemon] socket_mode`` and ``socket_group``; a stale one (it
answers no ping) is replaced, one that answers is another krexd's.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq
import zmq.asyncio

from krex_client.protocol import FrameError, Request, decode_request, encode_error, encode_ok
from krexd.config.config import DaemonConfig
from krexd.control import OPS
from krexd.coordinator.region_stats import percentiles
from krexd.server.conn_pace import DROP, HELD_MAX, START
from krexd.server.connections import ConnectionGuard
from krexd.server.lanes import BULK_OPS, REGION_OPS, Lanes
from krexd.system.errors import Code, KrexError
from krexd.tenancy import identity

if TYPE_CHECKING:
    from krexd.control.context import OpContext

_log = logging.getLogger("krexd.server")

HARD_MAX_MSG_BYTES = 16 << 20
READ_BURST = 16  # requests read before the loop runs the tasks they started
REFUSAL_DELAY_S = 0.1  # a request refused for a cap (TOO_MANY) is answered this much later
# An op refused at once for a cap (an admit past max_parked_per_uid: CANCELLED; TOO_MANY;
# region operations excepted) is answered this much later to a non-root caller, its
# request still counted in progress meanwhile: a client resending at each reply (a flood
# of admits) then costs krexd a few refusals a second per request it keeps outstanding,
# not a busy loop.
OP_REFUSAL_DELAY_S = 1.0
OP_REFUSAL_WITHIN_S = 0.05  # "at once": a parked admit cancelled later is answered at once
_READ_ONLY_OPS = frozenset({"ping", "status", "memory"})


class ServerError(RuntimeError):
    """The control socket cannot be set up (message names the path)."""


def _socket_in_use(path: str) -> bool:
    """True when a live krexd answers on ``path`` (used before replacing a socket file)."""
    from krex_client.connection import Connection, KrexUnavailable, RemoteError

    conn = Connection(path, timeout_s=0.5)
    try:
        conn.request("ping")
        return True
    except (KrexUnavailable, RemoteError):
        return False
    finally:
        conn.close()


def check_free(path: str) -> None:
    """Raise ServerError when a live krexd already serves socket ``path``.

    Called before krexd touches any cgroup, so a second krexd started by
    mistake cannot disturb the first one's tenants.
    """
    if os.path.exists(path) and _socket_in_use(path):
        raise ServerError(f"another krexd is serving {path}")


class Server:
    """ROUTER socket bound at ``cfg.socket``; each request runs its op with ``ctx``.

    ``after_op`` (None: nothing) is called after each op that may change
    state, before its reply (``krexd.restarts.state_keeper.StateKeeper.save``).
    """

    def __init__(
        self, cfg: DaemonConfig, ctx: OpContext, after_op: Callable[[], None] | None = None
    ) -> None:
        self.ctx = ctx
        self.path = cfg.socket
        self.mode = cfg.socket_mode
        self.group = cfg.socket_group
        self.cfg = cfg
        self.guard: ConnectionGuard | None = None  # connection caps (krexd/server/connections.py)
        # Per-uid request caps and the bulk lane (krexd/server/lanes.py).
        self.lanes = Lanes(
            cfg.max_requests_per_uid, cfg.max_status_per_uid, cfg.status_per_s_per_uid
        )
        # Called after each op, before its reply: the state a restart adopts is saved
        # before the client can act on the reply (krexd/restarts/state_keeper.py StateKeeper.save).
        self.after_op = after_op
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._peers = identity.PeerTable()
        self.requests = 0
        self.errors = 0
        self.refused: dict[str, int] = {}  # requests answered with an error, by code name
        self.after_op_ms: deque[float] = deque(maxlen=10_000)  # each after_op call (ms)

    def bind(self) -> None:
        """Create the socket file with the configured mode and group; raise ServerError."""
        gid = -1
        if self.group:
            try:
                gid = grp.getgrnam(self.group).gr_gid
            except KeyError:
                raise ServerError(f"[daemon] socket_group: no group {self.group!r}") from None
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        check_free(self.path)
        if os.path.exists(self.path):
            os.unlink(self.path)
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_MSG_BYTES)
        # libzmq creates the file with bind(2) in this thread, under the process umask.
        old = os.umask(0o777 & ~self.mode)
        try:
            sock.bind(f"ipc://{self.path}")
        except zmq.ZMQError as exc:
            sock.close()
            raise ServerError(f"cannot bind {self.path}: {exc}") from None
        finally:
            os.umask(old)
        os.chmod(self.path, self.mode)
        if gid != -1:
            os.chown(self.path, -1, gid)
        self._sock = sock
        cfg = self.cfg
        self.guard = ConnectionGuard(
            sock,
            cfg.max_connections,
            cfg.max_connections_per_uid,
            cfg.idle_timeout_s,
            cfg.connections_per_s_per_uid,
            cfg.connection_burst_per_uid,
        )
        _log.info("listening on ipc://%s (mode %o)", self.path, self.mode)

    async def serve(self) -> None:
        """Receive and dispatch requests until cancelled."""
        assert self._sock is not None and self.guard is not None
        loop = asyncio.get_running_loop()
        helpers = [loop.create_task(self.guard.run()), loop.create_task(self.lanes.run())]
        try:
            await self._serve()
        finally:
            for task in helpers:
                task.cancel()

    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            parts = await self._sock.recv_multipart(copy=False)
            self.requests += 1
            if len(parts) < 2:
                self._refuse("BAD_FRAME")
                continue  # no identity: nothing to reply to
            ident, frames = parts[0].bytes, [p.bytes for p in parts[1:]]
            if len(frames) != 1:
                self._refuse("BAD_FRAME")
                await self._send(
                    ident,
                    encode_error(
                        0,
                        Code.BAD_FRAME,
                        "BAD_FRAME",
                        f"expected one frame per request, got {len(frames)}",
                    ),
                )
                continue
            try:
                req = decode_request(frames[0])
            except FrameError as exc:
                self._refuse(exc.name)
                code = Code[exc.name]
                await self._send(ident, encode_error(exc.request_id, code, exc.name, exc.message))
                continue
            who = self._peers.resolve(ident, _peer_address(parts[-1]))
            self._route(ident, req, who, _source_fd(parts[-1]))
            # Messages already queued are read in a burst (a flood's excess is refused
            # cheaply); a region op's task starts before the next one is read.
            if req.op in REGION_OPS or self.requests % READ_BURST == 0:
                await asyncio.sleep(0)

    def _route(
        self, ident: bytes, req: Request, who: identity.Caller | None, fd: int | None
    ) -> None:
        """Refuse a request beyond a cap, hold one of a paced connection, drop one of a
        connection that is gone; else start it (:meth:`_start`)."""
        assert self.guard is not None
        verdict = self.guard.verdict(fd, urgent=req.op in REGION_OPS)
        if verdict.drop:
            self._refuse("GONE")
            return
        try:
            if verdict.refusal:
                raise KrexError(Code.TOO_MANY, verdict.refusal)
            key = self.lanes.admit(who.uid if who is not None else None, req.op)
        except KrexError as exc:
            self._refuse_later(ident, req.id, exc, verdict.retry_s)
            return
        if verdict.hold and fd is not None:
            if self.guard.hold(fd, lambda how: self._held(how, ident, req, who, fd, key)):
                return
            self.lanes.done(key, req.op)
            msg = f"{HELD_MAX} requests already wait for this connection's start (its pace)"
            self._refuse_later(ident, req.id, KrexError(Code.TOO_MANY, msg), 0.0)
            return
        self._start(ident, req, who, fd, key)

    def _refuse_later(self, ident: bytes, req_id: int, exc: KrexError, retry_s: float) -> None:
        """Answer ``exc`` after :data:`REFUSAL_DELAY_S`: a client that resends at each
        reply (a flood) then costs krexd a few refusals per second, not a busy loop."""
        self.errors += 1
        self.refused[exc.code.name] = self.refused.get(exc.code.name, 0) + 1
        frame = encode_error(req_id, exc.code, exc.code.name, exc.message, retry_s=retry_s)
        loop = asyncio.get_running_loop()
        loop.call_later(REFUSAL_DELAY_S, self._send_soon, ident, frame)

    def _held(
        self,
        how: str,
        ident: bytes,
        req: Request,
        who: identity.Caller | None,
        fd: int,
        key: int,
    ) -> None:
        """A held request's end of the hold (krexd/server/conn_pace.py ``START``/``STOP``/``DROP``):
        start it, or give its lane back and answer ``SHUTTING_DOWN`` (a stop) or nothing
        (its connection ended; a restart, whose successor the client asks)."""
        if how == START:
            try:
                self._start(ident, req, who, fd, key)
            except Exception:
                self.lanes.done(key, req.op)
                raise
            return
        self.lanes.done(key, req.op)
        if how == DROP:
            self._refuse("GONE")
            return
        self._refuse("SHUTTING_DOWN")
        self._send_soon(
            ident, encode_error(req.id, Code.SHUTTING_DOWN, "SHUTTING_DOWN", "krexd is stopping")
        )

    def _start(
        self, ident: bytes, req: Request, who: identity.Caller | None, fd: int | None, key: int
    ) -> None:
        """Run an admitted request in a task of its own, or queue it in the bulk lane."""
        assert self.guard is not None
        self.guard.started(fd)

        async def job() -> None:
            try:
                await self._dispatch(ident, req, who)
            finally:
                self.lanes.done(key, req.op)
                if self.guard is not None:
                    self.guard.ended(fd)

        if req.op in BULK_OPS:
            self.lanes.queue_bulk(key, job)
        else:
            task = asyncio.get_running_loop().create_task(job())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, ident: bytes, req: Request, who: identity.Caller | None) -> None:
        identity.CALLER.set(who)  # seen by this request's op only (a task's own context)
        handler = OPS.get(req.op)
        started = time.monotonic()
        try:
            if handler is None:
                raise KrexError(Code.UNKNOWN_OP, f"unknown op {req.op[:64]!r}")
            body: dict[str, Any] = await handler(self.ctx, req)
            if self.after_op is not None and req.op not in _READ_ONLY_OPS:
                t = time.monotonic()
                self.after_op()
                self.after_op_ms.append((time.monotonic() - t) * 1e3)
            frame = encode_ok(req.id, body)
        except KrexError as exc:
            self._refuse(exc.code.name)
            frame = encode_error(req.id, exc.code, exc.code.name, exc.message)
            if (
                exc.code in (Code.CANCELLED, Code.TOO_MANY)
                and req.op not in REGION_OPS  # never slowed: a region's timing waits on them
                and who is not None
                and who.uid != 0
                and time.monotonic() - started < OP_REFUSAL_WITHIN_S
            ):
                await asyncio.sleep(OP_REFUSAL_DELAY_S)
        except asyncio.CancelledError:
            frame = encode_error(req.id, Code.SHUTTING_DOWN, "SHUTTING_DOWN", "krexd is stopping")
            await self._send(ident, frame)
            raise
        except Exception as exc:  # an op's bug, or a reply msgpack cannot encode
            _log.exception("op %s failed", req.op)
            self.refused["INTERNAL"] = self.refused.get("INTERNAL", 0) + 1
            frame = encode_error(req.id, Code.INTERNAL, "INTERNAL", f"{type(exc).__name__}: {exc}")
        await self._send(ident, frame)

    def _send_soon(self, ident: bytes, frame: bytes) -> None:
        """Send ``frame`` to ``ident`` without waiting (a delayed refusal)."""
        if self._sock is None or self._sock.closed:
            return
        try:  # the same socket, synchronous: nothing to await from a timer callback
            zmq.Socket.shadow(self._sock.underlying).send_multipart([ident, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the peer is gone or its queue is full: it was refused anyway

    def _refuse(self, code: str) -> None:
        """Count one request answered with error ``code`` (a ``Code`` name), or dropped
        unanswered (``GONE``: its connection is not open)."""
        self.errors += 1
        self.refused[code] = self.refused.get(code, 0) + 1

    async def _send(self, ident: bytes, frame: bytes) -> None:
        if self._sock is None or self._sock.closed:
            return
        try:
            await self._sock.send_multipart([ident, frame], zmq.NOBLOCK)
        except zmq.Again:
            _log.warning("reply dropped: peer's queue is full")
        except zmq.ZMQError as exc:
            if exc.errno != errno.EHOSTUNREACH:
                _log.warning("reply dropped: %s", exc)

    def status(self) -> dict[str, Any]:
        """Requests and errors since start; the state save before each changing op's reply (ms);
        ``lanes``: requests in progress, bulk queue and refusals (krexd/server/lanes.py)."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "refused": dict(self.refused),
            "state_save_ms": percentiles(self.after_op_ms),
            "lanes": self.lanes.status(),
        }

    async def cancel_requests(self) -> None:
        """Cancel requests in progress (parked admits answer SHUTTING_DOWN); answer the
        status requests still queued in the bulk lane (each gets its reply)."""
        if self.guard is not None:
            self.guard.stop_held()  # answered now, while the socket is open
        tasks: list[asyncio.Future[Any]] = list(self._tasks)
        for t in tasks:
            t.cancel()
        if self.lanes.running is not None:
            tasks.append(self.lanes.running)  # a status being built: its reply is awaited
        for job in self.lanes.cancel_bulk():
            # Not cancelled: a task cancelled before it starts never runs its body, so
            # the request would get no reply at all.
            task = asyncio.get_running_loop().create_task(job())
            self._tasks.add(task)
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    def close(self, unlink: bool = True) -> None:
        """Close the socket and remove its file (kept with ``unlink=False``: a restart,
        so that clients wait for the successor rather than take krexd for stopped)."""
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
            try:
                if unlink:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._ctx.term()


def _source_fd(frame: zmq.Frame) -> int | None:
    """The descriptor of the connection ``frame`` came in on (libzmq's ``ZMQ_SRCFD``)."""
    try:
        fd = frame.get(zmq.SRCFD)
    except (zmq.ZMQError, KeyError, TypeError, AttributeError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _peer_address(frame: zmq.Frame) -> str | None:
    """libzmq's ``Peer-Address`` of the message ``frame`` belongs to (None when absent)."""
    try:
        value = frame.get("Peer-Address")
    except (zmq.ZMQError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None
