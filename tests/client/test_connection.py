"""The client's connection against a stand-in krexd: a ZeroMQ ROUTER on a real ipc socket.

What a restart does to a request in flight: the krexd that took it exits
without replying and another binds the same path.  ZeroMQ reconnects to the
new one silently and the request is lost; the connection must say so at once
(so ``krex run`` re-sends it, krex_cli.reconnect), not at its timeout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from krex_client.connection import Connection, KrexUnavailable
from krex_client.protocol import decode_request, encode_ok


class StandIn:
    """A ROUTER bound at ``path`` in a thread: answers ``ping`` unless ``mute``;
    ``exit_after_receiving`` makes it receive one request and close, unanswered."""

    def __init__(self, path: str, mute: bool = False) -> None:
        self.path, self.mute = path, mute
        self.received = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _serve(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if os.path.exists(self.path):
            os.unlink(self.path)  # as krexd does when it binds again
        sock.bind(f"ipc://{self.path}")
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(20):
                    continue
                peer, frame = sock.recv_multipart()
                req = decode_request(frame)
                self.received.set()
                if not self.mute:
                    sock.send_multipart([peer, encode_ok(req.id, {"pid": os.getpid()})])
        finally:
            sock.close(linger=0)
            ctx.term()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def path(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "krexd.sock")


def test_request_to_a_krexd_that_went_away_fails_at_once_not_at_its_timeout(path: str) -> None:
    old = StandIn(path, mute=True)
    conn = Connection(path, timeout_s=30.0)
    failed: list[BaseException] = []

    def ask() -> None:
        try:
            conn.request("ping")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    asker = threading.Thread(target=ask)
    asker.start()
    assert old.received.wait(5)
    old.close()  # exits with the request unanswered
    new = StandIn(path)  # the next krexd, on the same path
    t0 = time.monotonic()
    asker.join(10)
    try:
        assert not asker.is_alive() and len(failed) == 1, failed
        assert isinstance(failed[0], KrexUnavailable) and "went away" in str(failed[0])
        assert time.monotonic() - t0 < 5.0  # the timeout was 30 s
        assert conn.request("ping")["pid"] == os.getpid()  # the next request reaches it
    finally:
        conn.close()
        new.close()


def test_a_restart_between_requests_loses_nothing(path: str) -> None:
    first = StandIn(path)
    conn = Connection(path, timeout_s=5.0)
    try:
        assert conn.request("ping")["pid"] == os.getpid()
        first.close()
        second = StandIn(path)
        time.sleep(0.3)  # ZeroMQ reconnects in the background (its disconnection is seen)
        assert conn.request("ping")["pid"] == os.getpid()
        second.close()
    finally:
        conn.close()
