"""The ROUTER socket's monitor: which control connections opened and ended.

libzmq accepts every connection on the ROUTER socket and gives krexd no
accept hook; its monitor socket reports ``ZMQ_EVENT_ACCEPTED`` (the value is
the connection's descriptor) and ``ZMQ_EVENT_DISCONNECTED`` /
``ZMQ_EVENT_CLOSED`` (its end).  The descriptor of an ACCEPTED event may
have been closed and reused by the time the event is read, so an event
followed in the same batch by that descriptor's end is dropped
(:func:`changes`).  ``krexd.server.connections`` acts on what this reports.
"""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


class SocketEvents:
    """The monitor of ``sock`` (krexd's bound ROUTER socket), read in batches."""

    def __init__(self, sock: zmq.asyncio.Socket) -> None:
        self._monitor: zmq.asyncio.Socket = sock.get_monitor_socket(EVENTS)
        # The same socket, synchronous: a batch of queued events is read without awaiting.
        self._sync: zmq.Socket[bytes] = zmq.Socket.shadow(self._monitor.underlying)

    async def wait(self, timeout_s: float) -> bool:
        """True once an event is queued, False after ``timeout_s`` seconds without one."""
        try:
            return bool(await asyncio.wait_for(self._monitor.poll(), timeout_s))
        except TimeoutError:
            return False

    def read_batch(self) -> list[tuple[int, int]]:
        """Every monitor event queued now, as (event, fd), in order (none: empty)."""
        batch: list[tuple[int, int]] = []
        while True:
            try:
                frames = self._sync.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return batch
            msg = parse_monitor_message(frames)
            batch.append((int(msg["event"]), int(msg["value"])))

    def close(self) -> None:
        """Stop monitoring (the socket's events are no longer read)."""
        self._monitor.close(linger=0)


def changes(batch: list[tuple[int, int]]) -> list[tuple[bool, int]]:
    """``batch`` (:meth:`SocketEvents.read_batch`) as (opened, fd) in order: (False, fd)
    for each end, (True, fd) for each acceptance whose descriptor is not ended later in
    the same batch (it is already gone)."""
    out: list[tuple[bool, int]] = []
    for i, (event, fd) in enumerate(batch):
        if event != zmq.EVENT_ACCEPTED:
            out.append((False, fd))
        elif not any(e != zmq.EVENT_ACCEPTED and f == fd for e, f in batch[i + 1 :]):
            out.append((True, fd))
    return out
