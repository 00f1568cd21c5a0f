"""Admission by memory (tenancy.admission with a memory policy): fit, blocking, bounded bypass.

The policy here is a hand-written stand-in for krexd.memory.policy.AdmissionPolicy
(side effects injected): per GPU the bytes admission may reserve
and whether an allocation there waits for co-tenants' memory.  The end-to-end
behaviour with the real policy is in test_krexd_memory.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from krexd.tenancy.admission import Admission, Waiter
from tests.support.fakes import slots_for

G = 1 << 30


class Policy:
    """Bytes each GPU may still give (before reservations), and GPUs blocked by OOM waits."""

    def __init__(self, available: dict[int, int | None]) -> None:
        self.avail = dict(available)
        self.blocked_gpus: set[int] = set()

    def blocked(self, gpu: int) -> bool:
        return gpu in self.blocked_gpus

    def available(self, gpu: int) -> int | None:
        return self.avail[gpu]

    def refresh(self) -> None:
        self.refreshes = getattr(self, "refreshes", 0) + 1


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def park(a: Admission, need: int, gpu: int | None = None, name: str = "x") -> Waiter:
    return a.park(gpu, False, 1, [name], need)


def granted(ws: list[Waiter]) -> list[bool]:
    return [w.future.done() for w in ws]


def test_a_command_is_admitted_only_where_its_need_fits() -> None:
    async def body() -> None:
        (gpu0,) = slots = slots_for([0], 8)
        a = Admission(slots, memory=Policy({0: 10 * G}))
        first, second = park(a, 6 * G), park(a, 6 * G)
        assert granted([first, second]) == [True, False]
        assert gpu0.mem_reserved == 6 * G
        assert second.waiting_for == "memory" and second.mem_gpu == 0
        small = park(a, 3 * G)  # fits beside the first: overtakes the waiter (bounded)
        assert small.future.done() and second.bypassed == 1
        a.release(0, False, 6 * G)  # 10 - 3 = 7 GiB >= 6 GiB
        assert second.future.done() and gpu0.mem_reserved == 9 * G

    run(body())


def test_memory_used_beyond_needs_counts_against_admission() -> None:
    async def body() -> None:
        policy = Policy({0: 10 * G})
        a = Admission(slots_for([0], 8), memory=policy)
        park(a, 2 * G)
        policy.avail[0] = 5 * G  # e.g. a tenant uses 5 GiB more than it declared
        w = park(a, 4 * G)
        assert not w.future.done()  # 5 - 2 = 3 GiB < 4 GiB
        policy.avail[0] = 10 * G  # it freed the memory
        a.kick()
        assert w.future.done()

    run(body())


def test_no_admission_while_an_allocation_waits_for_cotenants() -> None:
    async def body() -> None:
        policy = Policy({0: 80 * G, 1: 80 * G})
        a = Admission(slots_for([0, 1], 8), memory=policy)
        policy.blocked_gpus.add(0)
        elsewhere = park(a, G)
        pinned = park(a, G, gpu=0)
        assert elsewhere.future.result() == 1  # GPU 0 admits nothing meanwhile
        assert not pinned.future.done() and pinned.waiting_for == "memory"
        policy.blocked_gpus.clear()
        a.kick()
        assert pinned.future.result() == 0

    run(body())


def test_slots_still_bound_and_unlimited_memory_is_slots_only() -> None:
    async def body() -> None:
        a = Admission(slots_for([0], 2), memory=Policy({0: None}))
        ws = [park(a, 100 * G) for _ in range(3)]
        assert granted(ws) == [True, True, False]
        assert ws[2].waiting_for == "slot"

    run(body())


def test_bounded_bypass_then_the_large_command_goes_first() -> None:
    """A large command waiting for memory is overtaken at most max_bypass times."""

    async def body(max_bypass: int) -> tuple[list[bool], Waiter, list[Waiter], Admission]:
        a = Admission(slots_for([0], 16), memory=Policy({0: 10 * G}), max_bypass=max_bypass)
        holders = [park(a, 2 * G) for _ in range(4)]  # 8 GiB reserved
        big = park(a, 6 * G, name="big")
        smalls = [park(a, G, name=f"s{i}") for i in range(4)]
        return granted(holders + smalls), big, smalls, a

    async def check() -> None:
        flags, big, smalls, a = await body(2)
        # Two small commands may overtake the big one, the rest wait behind it.
        assert flags == [True] * 4 + [True, True, False, False]
        assert big.bypassed == 2 and not big.future.done()
        for _ in range(4):
            a.release(0, False, 2 * G)  # the four holders end
        assert big.future.done()
        assert granted(smalls) == [True, True, True, True]  # 10 - 2 - 6 = 2 GiB for two more

        flags, big, smalls, a = await body(0)  # strict head-of-line blocking
        assert flags == [True] * 4 + [False] * 4
        a.release(0, False, 2 * G)
        a.release(0, False, 2 * G)
        # 10 - 4 = 6 GiB: the big one first, nothing left for the small ones.
        assert big.future.done() and granted(smalls) == [False] * 4
        order = [w.argv[0] for w in a.parked]
        assert order == ["s0", "s1", "s2", "s3"]  # still FIFO behind it

    run(check())


def test_a_waiter_for_memory_targets_the_gpu_with_most_room() -> None:
    async def body() -> None:
        policy = Policy({0: 4 * G, 1: 6 * G})
        a = Admission(slots_for([0, 1], 4), memory=policy, max_bypass=0)
        big = park(a, 8 * G)
        assert not big.future.done() and big.mem_gpu == 1
        other = park(a, G)
        # GPU 1 is closed to later commands (no bypass left); GPU 0 is not.
        assert other.future.result() == 0
        policy.avail[1] = 9 * G
        a.kick()
        assert big.future.result() == 1

    run(body())


def test_status_rows_say_what_a_request_waits_for() -> None:
    async def body() -> None:
        a = Admission(slots_for([0], 4), memory=Policy({0: 4 * G}))
        park(a, 3 * G)
        w = park(a, 3 * G)
        row = a.status()["queue"][0]  # type: ignore[index]
        assert row["mem_bytes"] == 3 * G and row["waiting_for"] == "memory"
        assert row["mem_gpu"] == 0 and w in a.parked

    run(body())
