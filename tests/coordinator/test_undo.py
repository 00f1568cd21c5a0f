"""The undo stack region entry and region end share (krexd.coordinator.undo)."""

from __future__ import annotations

import asyncio

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
