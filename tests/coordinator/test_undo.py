"""The undo stack region entry and region end share (krexd.coordinator.undo)."""

from __future__ import annotations

import asyncio
from typing import Any

from krexd.coordinator.undo import UndoStack


def test_unwinds_last_pushed_first_awaiting_coroutines_and_runs_each_once() -> None:
    ran: list[str] = []
    stack = UndoStack()

    async def thaw() -> None:
        await asyncio.sleep(0)
        ran.append("thaw")

    stack.push("unlock", lambda: ran.append("unlock"))
    stack.push("thaw", thaw)
    stack.push("cores", lambda: ran.append("cores"))
    assert stack.names() == ["unlock", "thaw", "cores"]
    assert asyncio.run(stack.unwind()) == ["cores", "thaw", "unlock"]
    assert ran == ["cores", "thaw", "unlock"]
    assert asyncio.run(stack.unwind()) == [] and ran == ["cores", "thaw", "unlock"]


def test_a_cancel_during_a_step_runs_the_steps_after_it_then_is_raised() -> None:
    """Cancelling a region's end while a sibling thaws must not skip the unlock after it."""
    ran: list[str] = []
    stack = UndoStack()
    started = asyncio.Event()

    async def slow_thaw() -> None:
        started.set()
        await asyncio.sleep(10)

    stack.push("driver locks", lambda: ran.append("driver locks"))
    stack.push("siblings' freeze", slow_thaw)
    stack.push("cores", lambda: ran.append("cores"))

    async def scenario() -> None:
        task = asyncio.ensure_future(stack.unwind())
        await started.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the cancel was swallowed")

    asyncio.run(scenario())
    assert ran == ["cores", "driver locks"]
    assert stack.names() == []


def test_a_cancelled_pool_hold_is_released(tmp_path: Any) -> None:
    """An entry cancelled while the pools freeze leaves no hold behind (pools thaw): the
    hold begun at step 2 is on the region's undo stack, which the failed entry unwinds."""
    from krexd.pools.freeze import PoolFreeze

    (tmp_path / "cgroup.freeze").write_text("0\n")
    (tmp_path / "cgroup.events").write_text("populated 1\nfrozen 0\n")  # never reports frozen
    freeze = PoolFreeze(str(tmp_path))

    async def scenario() -> None:
        stack = UndoStack()
        freeze.begin()  # as GatedRegions._hold_pools does once the gate is closed
        stack.push("pools' freeze", freeze.release)
        assert (tmp_path / "cgroup.freeze").read_text().strip() == "1"
        task = asyncio.ensure_future(freeze.wait_frozen(10.0))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            await stack.unwind()

    asyncio.run(scenario())
    assert freeze.holders == 0
    assert (tmp_path / "cgroup.freeze").read_text().strip() == "0"  # thawed again


def test_a_raising_compensator_is_logged_and_the_steps_after_it_still_run(
    caplog: Any,
) -> None:
    ran: list[str] = []
    stack = UndoStack()
    stack.push("pools", lambda: ran.append("pools"))  # pushed first: undone last

    def broken() -> None:
        raise OSError("a worker's unlock failed")

    stack.push("driver locks", broken)
    stack.push("thaw", lambda: ran.append("thaw"))
    names = asyncio.run(stack.unwind())
    assert names == ["thaw", "driver locks", "pools"] and ran == ["thaw", "pools"]
    assert "undo of driver locks failed" in caplog.text
