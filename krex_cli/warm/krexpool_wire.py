"""The warm pool's request protocol: length-prefixed JSON messages over a Unix stream socket.

Standard library only: the pool's zygote runs this module under the
command's own interpreter; ``krex run`` imports it as
``krex_cli.warm.krexpool_wire``.  A message is a 4-byte big-endian length
and that many bytes of UTF-8 JSON, with descriptors as one ``SCM_RIGHTS``
message on its first byte, received close-on-exec.  The conversation:
docs/design/warm.md "The request protocol (``krexpool_wire.py``)".
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import Any

#: Largest message accepted (bytes of JSON): an environment and a ``-c`` program fit.
MAX_MESSAGE = 16 << 20
#: File descriptors one message may carry (the kernel's SCM_MAX_FD is 253).
MAX_FDS = 250
_HEADER = struct.Struct("!I")


class WireError(Exception):
    """A message that breaks the protocol (too large, not JSON, truncated control data)."""


def send(
    sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()
) -> None:
    """Send ``message`` (a JSON-able dict), with ``fds`` attached; OSError when the peer is gone."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise WireError(f"message of {len(data)} bytes is over {MAX_MESSAGE}")
    if len(fds) > MAX_FDS:
        raise WireError(f"{len(fds)} file descriptors is over {MAX_FDS}")
    frame = _HEADER.pack(len(data)) + data
    sent = 0
    if fds:
        rights = array.array("i", fds).tobytes()
        sent = sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    if sent < len(frame):  # sendall of nothing still writes: EPIPE once the peer answered
        sock.sendall(frame[sent:])


def recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """The next message and the descriptors that came with it (at most ``max_fds``).

    Raises EOFError when the peer closed the connection before a message
    began, WireError for a malformed one (descriptors received are closed),
    socket.timeout / OSError from the socket.
    """
    fds: list[int] = []
    try:
        head = _read(sock, _HEADER.size, fds, max_fds, allow_eof=True)
        (size,) = _HEADER.unpack(head)
        if size > MAX_MESSAGE:
            raise WireError(f"message of {size} bytes is over {MAX_MESSAGE}")
        body = _read(sock, size, fds, max_fds, allow_eof=False)
        message = json.loads(body.decode())
        if not isinstance(message, dict):
            raise WireError("a message must be a JSON object")
    except BaseException:
        for fd in fds:
            _close(fd)
        raise
    return message, fds


def _read(sock: socket.socket, n: int, fds: list[int], max_fds: int, allow_eof: bool) -> bytes:
    """Exactly ``n`` bytes, collecting passed descriptors into ``fds``."""
    space = socket.CMSG_SPACE(max(1, max_fds) * array.array("i").itemsize)
    chunks: list[bytes] = []
    got = 0
    while got < n:
        data, ancillary, flags, _ = sock.recvmsg(n - got, space, socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(payload) - len(payload) % array.array("i").itemsize
                fds.extend(array.array("i", payload[:whole]))
        if flags & socket.MSG_CTRUNC or len(fds) > max_fds:
            raise WireError("more file descriptors than the request may carry")
        if not data:
            if allow_eof and got == 0:
                raise EOFError("connection closed")
            raise WireError("connection closed inside a message")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of Unix socket ``sock`` (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of Unix socket ``sock`` (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)
