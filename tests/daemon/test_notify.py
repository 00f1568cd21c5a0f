"""sd_notify on a real datagram socket: READY once serving, WATCHDOG cadence, STOPPING."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def notify_socket(tmp_path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify"))
    s.settimeout(20)
    return s


def recv_until(s: socket.socket, prefix: str) -> tuple[list[tuple[float, str]], str]:
    seen: list[tuple[float, str]] = []
    while True:
        msg = s.recv(4096).decode()
        seen.append((time.monotonic(), msg))
        if msg.startswith(prefix):
            return seen, msg


def test_ready_watchdog_stopping(krexd_factory: Factory, tmp_path: Path) -> None:
    s = notify_socket(tmp_path)
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"}
    k = krexd_factory(env=env, wait=False)
    _, ready = recv_until(s, "READY=1")
    # READY=1 comes only once krexd serves requests: a ping right now must succeed.
    assert k.request("ping", timeout_s=2)["pid"] == k.pid
    assert "STATUS=" in ready
    t0 = time.monotonic()
    pings = []
    while time.monotonic() - t0 < 1.0:
        msg = s.recv(4096).decode()
        if msg == "WATCHDOG=1":
            pings.append(time.monotonic())
    # Half of WATCHDOG_USEC: one ping per 0.1 s.
    assert 4 <= len(pings) <= 14, len(pings)  # loose below: a busy host delays some
    gaps = [b - a for a, b in zip(pings, pings[1:], strict=False)]
    assert max(gaps) < 0.5
    k.proc.terminate()
    recv_until(s, "STOPPING=1")
    assert k.proc.wait(20) == 0


def test_no_watchdog_for_another_pid(krexd_factory: Factory, tmp_path: Path) -> None:
    s = notify_socket(tmp_path)
    env = {
        "NOTIFY_SOCKET": str(tmp_path / "notify"),
        "WATCHDOG_USEC": "100000",
        "WATCHDOG_PID": str(os.getpid()),
    }
    krexd_factory(env=env, wait=False)
    recv_until(s, "READY=1")
    s.settimeout(0.5)
    with pytest.raises(TimeoutError):
        while True:
            assert s.recv(4096).decode() != "WATCHDOG=1"
