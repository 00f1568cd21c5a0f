"""The bulk lane at a stop: no status request goes unanswered (krexd.server.lanes).

Root-free: the lane alone, its jobs recording whether they ran.
"""

from __future__ import annotations

import asyncio

from krexd.server.lanes import Lanes


def test_a_job_taken_from_the_queue_but_not_started_is_handed_back_at_a_stop() -> None:
    async def scene() -> tuple[list[str], int, list[str]]:
        lanes = Lanes()
        ran: list[str] = []

        async def job() -> None:
            ran.append("served by the lane")

        lanes.region_busy = 1  # a region op in flight: the taken job waits for it to pass
        runner = asyncio.ensure_future(lanes.run())
        lanes.queue_bulk(1000, job)
        await asyncio.sleep(0.01)  # the lane took it and waits (BULK_DEFER_S)
        handed = lanes.cancel_bulk()  # the stop: every job not started, to be answered
        lanes.region_busy = 0
        await asyncio.sleep(0.1)  # past BULK_DEFER_S: the lane must not run it too
        for j in handed:
            await j()
        runner.cancel()
        return ran, len(handed), [str(lanes.status()["bulk_queued"])]

    ran, handed, queued = asyncio.run(scene())
    assert handed == 1 and ran == ["served by the lane"] and queued == ["0"], (handed, ran)


def test_a_job_being_served_finishes_when_the_lane_is_cancelled() -> None:
    async def scene() -> list[str]:
        lanes = Lanes()
        ran: list[str] = []

        async def slow() -> None:
            await asyncio.sleep(0.05)  # a status being built
            ran.append("replied")

        runner = asyncio.ensure_future(lanes.run())
        lanes.queue_bulk(1000, slow)
        await asyncio.sleep(0.01)
        assert lanes.running is not None
        assert lanes.cancel_bulk() == []  # nothing left to hand over: it answers itself
        runner.cancel()  # the stop cancels the lane, not the reply
        await asyncio.sleep(0.1)
        return ran

    assert asyncio.run(scene()) == ["replied"]
