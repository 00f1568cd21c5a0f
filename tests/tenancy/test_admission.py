"""krexd.tenancy.admission: slots, least-loaded placement, FIFO parking, exclusive leases."""

from __future__ import annotations

import asyncio

import pytest

from krexd.system.errors import Code, KrexError
from krexd.tenancy.admission import Admission
from krexd.tenancy.quotas import UidCaps
from tests.support.fakes import slots_for


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_least_loaded_then_lowest_index() -> None:
    async def body() -> None:
        slots = slots_for([0, 1], 2)
        a = Admission(slots)
        got = []
        for _ in range(4):
            w = a.park(None, False, 1, ["x"])
            got.append(w.future.result())
        assert got == [0, 1, 0, 1]
        assert [s.used for s in slots] == [2, 2]

    run(body())


def test_parked_requests_are_granted_in_fifo_order() -> None:
    async def body() -> None:
        a = Admission(slots_for([0], 1))
        first = a.park(None, False, 1, ["a"])
        waiting = [a.park(None, False, 1, [str(i)]) for i in range(3)]
        assert first.future.done() and not any(w.future.done() for w in waiting)
        assert [w.argv for w in a.parked] == [["0"], ["1"], ["2"]]
        a.release(0, False)
        assert [w.future.done() for w in waiting] == [True, False, False]
        a.release(0, False)
        assert [w.future.done() for w in waiting] == [True, True, False]

    run(body())


def test_named_gpu_waits_for_that_gpu() -> None:
    async def body() -> None:
        a = Admission(slots_for([0, 1], 1))
        a.park(1, False, 1, ["a"])
        w = a.park(1, False, 1, ["b"])
        any_gpu = a.park(None, False, 1, ["c"])
        assert not w.future.done() and any_gpu.future.result() == 0
        a.release(1, False)
        assert w.future.result() == 1

    run(body())


def test_exclusive_waits_for_an_empty_gpu_and_blocks_later_requests() -> None:
    async def body() -> None:
        (gpu0,) = slots = slots_for([0], 2)
        a = Admission(slots)
        a.park(0, False, 1, ["a"])
        ex = a.park(0, True, 1, ["ex"])
        later = a.park(0, False, 1, ["later"])
        # A free slot exists, but the exclusive waiter ahead reserved the GPU.
        assert not ex.future.done() and not later.future.done()
        a.release(0, False)
        assert ex.future.result() == 0 and not later.future.done()
        assert gpu0.used == 2 and gpu0.exclusive
        a.release(0, True)
        assert later.future.result() == 0

    run(body())


def test_cancelled_waiter_is_skipped() -> None:
    async def body() -> None:
        a = Admission(slots_for([0], 1))
        a.park(0, False, 1, ["a"])
        gone = a.park(0, False, 1, ["gone"])
        nxt = a.park(0, False, 1, ["next"])
        a.cancel(gone)
        with pytest.raises(KrexError) as info:
            gone.future.result()
        assert info.value.code == Code.CANCELLED
        a.release(0, False)
        assert nxt.future.result() == 0

    run(body())


def test_unknown_gpu_and_queue_limit() -> None:
    async def body() -> None:
        a = Admission(slots_for([0], 1), max_parked=1)
        with pytest.raises(KrexError) as info:
            a.park(2, False, 1, ["x"])
        assert info.value.code == Code.NO_SUCH_GPU
        a.park(0, False, 1, ["a"])
        a.park(0, False, 1, ["b"])
        with pytest.raises(KrexError) as info:
            a.park(0, False, 1, ["c"])
        assert info.value.code == Code.CANCELLED

    run(body())


def test_per_uid_caps_keep_fifo_among_requests_within_their_caps() -> None:
    """[admission] max_admitted_per_uid / max_parked_per_uid; root is exempt."""

    async def body() -> None:
        a = Admission(slots_for([0], 4), caps=UidCaps(max_admitted=1, max_parked=1))
        first = a.park(None, False, 1, ["a1"], uid=1000)
        assert first.future.result() == 0
        second = a.park(None, False, 1, ["a2"], uid=1000)  # at its cap: parked
        with pytest.raises(KrexError) as info:
            a.park(None, False, 1, ["a3"], uid=1000)  # a second parked request
        assert info.value.code == Code.CANCELLED and "max_parked_per_uid" in info.value.message
        other = a.park(None, False, 1, ["b"], uid=1001)  # passes the capped request
        assert other.future.done() and not second.future.done()
        roots = [a.park(None, False, 1, ["r"], uid=0) for _ in range(2)]
        assert all(r.future.done() for r in roots)  # root: no cap
        a.release(0, False, uid=1000)
        assert second.future.result() == 0
        assert a.caps.admitted(1000) == 1

    run(body())
