"""A region request whose krexd went away is sent again to the next krexd; the
connections tried on the way, and the lost one, are closed (each holds a ZeroMQ
context and its I/O threads)."""

from __future__ import annotations

from typing import Any

import pytest

from krex_client.connection import KrexUnavailable
from krex_client.region import Region

from .conftest import FakeConnection


class Closable(FakeConnection):
    """A :class:`FakeConnection` that can be closed, or lost (every request raises)."""

    def __init__(self, lost: bool = False) -> None:
        super().__init__()
        self.lost, self.closed = lost, 0

    def request(self, op: str, body: Any = None, timeout_s: Any = None, **kw: Any) -> Any:
        if self.lost:
            raise KrexUnavailable("/nonexistent.sock", "krexd went away")
        return {"pid": 4242} if op == "ping" else super().request(op, body, timeout_s, **kw)

    def close(self) -> None:
        self.closed += 1


def test_connections_tried_while_krexd_was_away_are_closed(
    fake_krex: FakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = [Closable(lost=True), Closable(lost=True), Closable(lost=True), Closable()]
    made_iter = iter(made)
    r = Region(connect=lambda: next(made_iter))
    monkeypatch.setattr("krex_client.region.time.sleep", lambda s: None)
    with r.critical():
        pass
    first, tried_a, tried_b, good = made
    # The exit goes to the connection that reached the next krexd, not the lost one.
    assert good.ops == ["region_enter", "region_exit"] and good.held is False
    assert (first.closed, tried_a.closed, tried_b.closed, good.closed) == (1, 1, 1, 0)
