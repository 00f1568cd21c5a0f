"""Fixtures of the client tests: a fake control connection and a simulated timing device.

``fake_krex`` makes this process look like a command under ``krex run``
(``KREX_SOCKET``/``KREX_TENANT``/``KREX_TOKEN`` set) and gives
``region.region`` a :class:`FakeConnection` instead of a ZeroMQ one, so the
region requests a measurement makes can be counted and asserted.

``sim`` is a :class:`SimDevice`: a timing backend whose clock moves only when
the measured function or an L2 flush "runs", so loop counts and results are
exact.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from krex_client import implicit, warmup, warmup_matmul
from krex_client._timing import use_backend
from krex_client.region import region
from tests.client.warmfakes import StandInShim


class FakeConnection:
    """Answers ``region_enter``/``region_exit`` like krexd and logs every op."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.epoch = 0
        self.held = False

    def request(
        self,
        op: str,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        *,
        forever: bool = False,
    ) -> dict[str, Any]:
        self.ops.append(op)
        if op == "region_enter":
            assert not self.held, "region_enter while this tenant already holds the region"
            self.held = True
            self.epoch += 1
            return {"epoch": self.epoch, "l2_flush": True}
        if op == "region_exit":
            assert self.held, "region_exit without a region"
            assert body is not None and body["epoch"] == self.epoch
            self.held = False
            return {"region_ms": 1.0}
        return {}

    @property
    def regions(self) -> int:
        """Regions entered so far."""
        return self.ops.count("region_enter")


@pytest.fixture
def fake_krex(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeConnection]:
    """This process as a krex tenant whose krexd is a :class:`FakeConnection`."""
    conn = FakeConnection()
    monkeypatch.setenv("KREX_SOCKET", "/nonexistent/krexd.sock")
    monkeypatch.setenv("KREX_TENANT", "7")
    monkeypatch.setenv("KREX_TOKEN", "token")
    monkeypatch.setattr(region, "connect", lambda: conn)
    monkeypatch.setattr(region, "_conn", None)
    # The "not running under krex run" warning is once per process: each test sees its own.
    monkeypatch.setattr(region, "_warned", False)
    yield conn
    assert not conn.held, "a region was left open"


class SimDevice:
    """A timing backend over a simulated clock (ms); see the module docstring.

    ``kernel(ms)`` returns a function that advances the clock by ``ms`` per
    call, times ``1 + now / drift_ms``: with a finite ``drift_ms`` the device
    slows as it works, as an H200 does when its own matmuls pull the SM clock
    down to its power limit.  ``flush`` advances the clock by ``flush_ms``.
    ``log`` records every device call in order: "fn" (or the kernel's
    ``name``), "flush", "record", "sync", "capture", "replay".
    """

    name = "sim"

    def __init__(self, flush_ms: float = 0.0, drift_ms: float = math.inf) -> None:
        self.now = 0.0
        self.flush_ms = flush_ms
        self.drift_ms = drift_ms
        self.log: list[str] = []
        self.side_stream_depth = 0

    class _Event:
        def __init__(self, dev: SimDevice) -> None:
            self.dev = dev
            self.t: float | None = None

        def record(self) -> None:
            self.dev.log.append("record")
            self.t = self.dev.now

        def elapsed_time(self, end: Any) -> float:
            assert self.t is not None and end.t is not None, "event not recorded"
            return float(end.t - self.t)

    class _Graph:
        def __init__(self, dev: SimDevice, fn: Callable[[], Any]) -> None:
            self.dev = dev
            self.fn = fn

        def replay(self) -> None:
            self.dev.log.append("replay")
            self.fn()

    def kernel(self, ms: float, name: str = "fn") -> Callable[[], None]:
        def fn() -> None:
            self.log.append(name)
            self.now += ms * (1.0 + self.now / self.drift_ms)

        return fn

    def synchronize(self) -> None:
        self.log.append("sync")

    def event(self) -> Any:
        return SimDevice._Event(self)

    def flush_buffer(self) -> Any:
        return "l2-buffer"

    def flush(self, buffer: Any) -> None:
        assert buffer == "l2-buffer"
        self.log.append("flush")
        self.now += self.flush_ms

    def side_stream(self) -> contextlib.AbstractContextManager[Any]:
        @contextlib.contextmanager
        def cm() -> Iterator[None]:
            self.side_stream_depth += 1
            try:
                yield
            finally:
                self.side_stream_depth -= 1

        return cm()

    def capture(self, fn: Callable[[], Any]) -> Any:
        # Capture records the launches without running them on the clock.
        self.log.append("capture")
        saved = self.now
        fn()
        self.now = saved
        return SimDevice._Graph(self, fn)


@pytest.fixture
def sim() -> Iterator[SimDevice]:
    """A :class:`SimDevice` made the timing backend for the test."""
    dev = SimDevice()
    with use_backend(dev):
        yield dev


@pytest.fixture
def clean_autoregion() -> Iterator[None]:
    """Undo ``autoregion()``'s process-wide effects after the test."""
    saved = list(sys.meta_path)
    yield
    sys.meta_path[:] = saved
    implicit._enabled = False


@pytest.fixture
def standin(
    fake_krex: FakeConnection, monkeypatch: pytest.MonkeyPatch
) -> tuple[StandInShim, FakeConnection]:
    """A tenant under a :class:`FakeConnection` whose shim is a
    :class:`~tests.client.warmfakes.StandInShim`, with a fresh GPU view (NVML) and region-log
    state, the warm-up's variables unset and no torch in ``sys.modules``."""
    shim = StandInShim(fake_krex)
    monkeypatch.setattr(region, "_shim", shim)
    monkeypatch.setattr(region, "_device", None)
    monkeypatch.setattr(region, "_recorder", None)
    monkeypatch.setattr(warmup_matmul, "_cached", None)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for var in (warmup.PCT_VAR, warmup.MS_VAR, warmup.KIND_VAR):
        monkeypatch.delenv(var, raising=False)
    return shim, fake_krex
