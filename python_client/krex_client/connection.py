"""Client side of the krex control plane: one ZeroMQ DEALER, request/reply with timeouts.

``Connection.from_env()`` (``KREX_SOCKET``, ``KREX_TENANT``, ``KREX_TOKEN``)
then ``conn.request(op, body)``; replies are matched on the request ``id``.
krexd's errors raise :class:`RemoteError`, a missing daemon
:class:`KrexUnavailable`, a socket this user may not open
:class:`KrexPermissionDenied` (checked before connecting: ZeroMQ retries a
refused ``connect(2)`` silently).
"""

from __future__ import annotations

import errno
import grp
import itertools
import os
import random
import socket as pysocket
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import zmq

from krex_client.protocol import FrameError, Reply, Request, decode_reply, encode_request

DEFAULT_SOCKET = "/run/krex/krexd.sock"
"""krexd's control socket when neither ``--socket`` nor ``KREX_SOCKET`` says otherwise."""

DEFAULT_TIMEOUT_S = 5.0
"""Seconds a request waits for its reply unless told otherwise."""

# What a request asked again after a pace refusal may still need: krexd holds a paced
# request up to 1 s (krexd/server/conn_pace.py PACE_MAX_S).
_RETRY_ROOM_S = 1.0

_POLL_SLICE_S = 0.5


def default_socket() -> str:
    """krexd's socket path: env ``KREX_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return os.environ.get("KREX_SOCKET") or DEFAULT_SOCKET


class KrexUnavailable(Exception):
    """krexd cannot be reached at ``socket`` (missing socket file or no reply in time)."""

    def __init__(self, socket: str, reason: str) -> None:
        super().__init__(f"krexd is unreachable at {socket}: {reason}")
        self.socket = socket
        self.reason = reason


class KrexPermissionDenied(KrexUnavailable):
    """This user may not open krexd's socket: ``group`` is the group to join (or None)."""

    def __init__(self, socket: str, group: str | None) -> None:
        join = (
            f"join group '{group}' (the socket's group), then log in again"
            if group
            else "ask the administrator for access to the socket"
        )
        super().__init__(socket, f"permission denied: {join}")
        self.group = group


def _group_of(path: str) -> str | None:
    """Name of the group owning ``path`` or, when it cannot be read, its nearest parent."""
    while path and path != os.path.dirname(path):
        try:
            gid = os.stat(path).st_gid
        except OSError:
            path = os.path.dirname(path)
            continue
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return str(gid)
    return None


def check_access(path: str) -> None:
    """Raise :class:`KrexPermissionDenied` when this process may not connect to ``path``.

    Connecting to a Unix socket needs search permission on every directory of
    the path and write permission on the socket file (unix(7)).  A path that
    does not exist is left to the caller.
    """
    try:
        os.stat(path)
    except PermissionError:
        raise KrexPermissionDenied(path, _group_of(os.path.dirname(path))) from None
    except OSError:
        return
    if not os.access(path, os.W_OK, effective_ids=True):
        raise KrexPermissionDenied(path, _group_of(path))


class KrexNotListening(KrexUnavailable):
    """krexd's socket file exists but nothing listens on it (``connect(2)`` gave
    ECONNREFUSED): a krexd that crashed or was killed left it, or one restarting
    has not bound it again yet."""

    def __init__(self, socket: str) -> None:
        super().__init__(socket, "nothing listens on the socket (is krexd running?)")


class RemoteError(Exception):
    """krexd answered with an error reply: ``code`` (int), ``name`` (e.g. ``"AUTH"``)."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.code = code
        self.name = name
        self.message = message


def _probe(path: str) -> None:
    """Fail fast when nothing listens on ``path`` (a socket file left by a dead krexd).

    ZeroMQ would retry the connection silently until the reply timeout.
    Raises :class:`KrexNotListening` (refused), :class:`KrexUnavailable` (no
    file) or :class:`KrexPermissionDenied`.
    """
    probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except ConnectionRefusedError:
        raise KrexNotListening(path) from None
    except FileNotFoundError:
        raise KrexUnavailable(path, "nothing listens on the socket (is krexd running?)") from None
    except PermissionError:
        raise KrexPermissionDenied(path, _group_of(path)) from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise KrexPermissionDenied(path, _group_of(path)) from None
        # busy or slow: let the request itself decide
    finally:
        probe.close()


class Connection:
    """A DEALER connection to krexd at ``socket`` (a filesystem path, not a URL).

    ``tenant``/``token`` are attached to every request when given (both or
    neither).  ``timeout_s`` is the default reply timeout in seconds.
    """

    def __init__(
        self,
        socket: str | None = None,
        tenant: int | None = None,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if (tenant is None) != (token is None):
            raise ValueError("tenant and token go together")
        self.socket = socket or default_socket()
        self.tenant = tenant
        self.token = token
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)
        self._probed = False
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(f"ipc://{self.socket}")

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> Connection:
        """Connect with ``KREX_SOCKET`` and, when set, ``KREX_TENANT``/``KREX_TOKEN``."""
        tenant_env = os.environ.get("KREX_TENANT")
        token = os.environ.get("KREX_TOKEN")
        tenant = int(tenant_env) if tenant_env and token else None
        return cls(default_socket(), tenant, token if tenant is not None else None, timeout_s)

    def request(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        forever: bool = False,
        check: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Send ``op`` with ``body`` and return the reply body.

        ``timeout_s``: seconds to wait (``None``: the connection's default);
        ``forever=True`` waits without a limit (used by ``admit``, which krexd
        parks until a slot frees).
        ``check`` is called about every 0.5 s while waiting and may raise to
        give up (e.g. when krexd's process is gone).  A refusal that says the
        request was not run and when to ask again (``retry_s``: a connection
        over its uid's pace, krexd/server/conn_pace.py) is retried after that long
        while the wait allows.  Raises :class:`KrexUnavailable` or
        :class:`RemoteError`.
        """
        check_access(self.socket)
        if not os.path.exists(self.socket):
            raise KrexUnavailable(self.socket, "no such socket (is krexd running?)")
        if not self._probed:
            _probe(self.socket)
            self._probed = True
        wait = None if forever else (self.timeout_s if timeout_s is None else timeout_s)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            reply = self._ask(op, body, wait, deadline, check)
            if reply.ok:
                return reply.body
            err = reply.error
            assert err is not None
            # Not run: ask again, a little later than told (clients refused together
            # do not all come back at once).
            pause = err.retry_s * random.uniform(1.0, 1.5)
            left = None if deadline is None else deadline - time.monotonic()
            if err.retry_s > 0 and (left is None or pause + _RETRY_ROOM_S < left):
                self._pause(pause, check)
                continue
            raise RemoteError(err.code, err.name, err.message)

    def _pause(self, seconds: float, check: Callable[[], None] | None) -> None:
        """Sleep ``seconds`` in slices, calling ``check`` and probing krexd between them."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _POLL_SLICE_S))
            if not os.path.exists(self.socket):
                raise KrexUnavailable(self.socket, "socket removed while waiting to ask again")
            if check is not None:
                check()

    def _ask(
        self,
        op: str,
        body: dict[str, Any] | None,
        wait: float | None,
        deadline: float | None,
        check: Callable[[], None] | None,
    ) -> Reply:
        """Send one request and wait for its reply until ``deadline`` (monotonic s)."""
        req_id = next(self._ids)
        req = Request(op=op, id=req_id, body=body or {}, tenant=self.tenant, token=self.token)
        try:
            self._sock.send(encode_request(req), zmq.NOBLOCK)
        except zmq.Again:
            raise KrexUnavailable(self.socket, "cannot queue the request") from None
        while True:
            left = _POLL_SLICE_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise KrexUnavailable(self.socket, f"no reply to '{op}' within {wait:g} s")
            if self._sock.poll(int(min(left, _POLL_SLICE_S) * 1000) + 1, zmq.POLLIN):
                frame = self._sock.recv()
                try:
                    reply = decode_reply(frame)
                except FrameError as exc:
                    raise KrexUnavailable(self.socket, f"garbled reply: {exc}") from None
                if reply.id != req_id:
                    continue  # late reply to an earlier request that timed out
                return reply
            # No reply yet: fail fast if krexd died meanwhile (its socket file stays).
            if not os.path.exists(self.socket):
                raise KrexUnavailable(self.socket, "socket removed while waiting for a reply")
            _probe(self.socket)
            if check is not None:
                check()

    def close(self) -> None:
        """Close the socket and its context (pending requests are dropped)."""
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
