"""krexd.system.workers: calls that never return hold neither other calls nor krexd's exit."""

from __future__ import annotations

import threading

import pytest

from krexd.system.workers import KEEP_IDLE, DaemonWorkers


def test_a_call_never_waits_behind_a_stuck_one() -> None:
    workers = DaemonWorkers("test-workers")
    release = threading.Event()
    stuck = [workers.submit(release.wait) for _ in range(KEEP_IDLE + 4)]
    try:
        # Every thread is busy: a new call still runs at once, on a new thread.
        assert workers.submit(lambda: 42).result(timeout=5) == 42
        assert not any(f.done() for f in stuck)
        names = {t.name: t.daemon for t in threading.enumerate() if t.name.startswith("test-w")}
        assert len(names) >= KEEP_IDLE + 5 and all(names.values()), "daemon threads"
    finally:
        release.set()
    assert all(f.result(timeout=5) is True for f in stuck)


def test_an_error_reaches_the_caller_and_the_thread_is_reused() -> None:
    workers = DaemonWorkers("test-reuse")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        workers.submit(fail).result(timeout=5)
    before = sum(t.name.startswith("test-reuse") for t in threading.enumerate())
    for _ in range(20):
        assert workers.submit(lambda: 1).result(timeout=5) == 1
    after = sum(t.name.startswith("test-reuse") for t in threading.enumerate())
    assert after == before, "sequential calls reuse the idle thread"
