"""Unix stream sockets by descriptor, for descriptors libzmq owns: the peer's uid, a shutdown.

Each call works on a duplicate of the descriptor (closing only the
duplicate), so libzmq's own descriptor is never closed behind its back;
anything that is not a Unix stream socket (a descriptor closed and reused
meanwhile) is left alone.
"""

from __future__ import annotations

import os
import socket
import stat
import struct


def _unix_stream(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of ``fd`` when it is a Unix stream socket, else None.

    The caller closes it (closing the duplicate only).
    """
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        if not stat.S_ISSOCK(os.fstat(dup).st_mode):
            os.close(dup)
            return None
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock


def shut_down(fd: int) -> bool:
    """Shut the Unix stream socket ``fd`` down (libzmq then closes it); True when done."""
    sock = _unix_stream(fd)
    if sock is None:
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def peer_uid(fd: int) -> int | None:
    """The uid of the peer of Unix socket ``fd`` (``SO_PEERCRED``), None when unknown."""
    sock = _unix_stream(fd)
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", raw)[1])
    except OSError:
        return None
    finally:
        sock.close()
