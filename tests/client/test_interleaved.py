"""Interleaved timing: every callable's repetitions spread over the whole loop.

The loops run over :class:`~tests.client.conftest.SimDevice`; with a finite
``drift_ms`` it slows as it works, the clock behaviour interleaving is for.
"""

from __future__ import annotations

import statistics

import pytest

from krex_client import interleaved, testing
from krex_client.interleaved import Timed

from .conftest import SimDevice


@pytest.mark.parametrize("counts", [[1], [3, 1], [4, 4, 4], [7, 2, 0, 5], [430, 512, 301]])
def test_schedule_spreads_each_callable_over_the_whole_loop(counts: list[int]) -> None:
    order = interleaved.schedule(counts)
    assert [order.count(i) for i in range(len(counts))] == counts
    total = len(order)
    for i, n in enumerate(counts):
        if n == 0:
            continue
        positions = [p for p, j in enumerate(order) if j == i]
        # Mean position of each callable's calls is the loop's middle, within one slot per
        # callable; its first and last calls lie within one period of the loop's ends.
        assert abs(statistics.fmean(positions) - (total - 1) / 2) <= len(counts)
        assert positions[0] <= total / n + len(counts)
        assert positions[-1] >= total - total / n - len(counts)


def test_same_budgets_and_statistics_as_do_bench_in_turn() -> None:
    """Without drift, interleaved and in-turn timing give each callable the same counts
    and times (Triton's rule: warmup/estimate calls, rep/estimate repetitions)."""
    dev = SimDevice()
    fns = [dev.kernel(0.5, "a"), dev.kernel(2.0, "b")]
    times = interleaved.time_interleaved(dev, [Timed(f, warmup_ms=5, rep_ms=20) for f in fns])
    assert [len(t) for t in times] == [40, 10]
    assert times[0] == pytest.approx([0.5] * 40) and times[1] == pytest.approx([2.0] * 10)
    # 5 estimate calls + 10 (a) or 2 (b) warm-up calls + the repetitions.
    assert dev.log.count("a") == 5 + 10 + 40 and dev.log.count("b") == 5 + 2 + 10
    # After the two estimates (each ending in a synchronization): the 12 warm-up calls,
    # interleaved, then each repetition as flush, record, call, record, and one
    # synchronization after the last.
    syncs = [i for i, op in enumerate(dev.log) if op == "sync"]
    after = dev.log[syncs[1] + 1 :]
    assert sorted(after[:12]) == ["a"] * 10 + ["b"] * 2 and after[:3] == ["a", "a", "a"]
    reps = after[12:]
    assert reps[-1] == "sync" and reps.count("sync") == 1
    assert reps[:-1] == [
        op for i in interleaved.schedule([40, 10]) for op in ("flush", "record", "ab"[i], "record")
    ]
    in_turn = [testing.bench_loop(dev, f, 5, 20, None) for f in fns]
    assert [len(t) for t in in_turn] == [40, 10]


def test_drifting_clock_ranks_callables_by_their_own_speed() -> None:
    """On a device that slows as it works, timing in turn lets the first callable
    win by its clock; interleaved timing ranks by speed."""
    base = {"first": 1.05, "second": 1.0, "third": 1.1}

    def ranking(timings: list[list[float]]) -> list[str]:
        medians = {n: statistics.median(t) for n, t in zip(base, timings, strict=True)}
        return sorted(medians, key=medians.__getitem__)

    dev = SimDevice(drift_ms=200.0)
    in_turn = [testing.bench_loop(dev, dev.kernel(ms), 25, 100, None) for ms in base.values()]
    assert ranking(in_turn)[0] == "first"
    dev = SimDevice(drift_ms=200.0)
    calls = [Timed(dev.kernel(ms)) for ms in base.values()]
    assert ranking(interleaved.time_interleaved(dev, calls)) == ["second", "first", "third"]


def test_grads_reset_before_every_repetition() -> None:
    dev = SimDevice()

    class Tensor:
        grad: object = None

    x = Tensor()
    seen: list[object] = []
    run = dev.kernel(1.0)

    def fn() -> None:
        seen.append(x.grad)
        x.grad = "stale"
        run()

    interleaved.time_interleaved(dev, [Timed(fn, warmup_ms=1, rep_ms=3, grad_to_none=[x])])
    # 5 estimate calls and 1 warm-up call see what the call before left; the 3
    # repetitions see a reset gradient.
    assert seen == [None] + ["stale"] * 5 + [None] * 3


def test_events_are_reused_across_blocks_of_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large step holds at most EVENT_PAIRS pairs: each block is synchronized and read
    before its events time the next; the times are those of one block."""
    dev = SimDevice()
    made: list[object] = []
    event = dev.event
    monkeypatch.setattr(dev, "event", lambda: made.append(1) or event())
    monkeypatch.setattr(interleaved, "EVENT_PAIRS", 7)
    fns = [dev.kernel(0.5, "a"), dev.kernel(2.0, "b")]
    times = interleaved.time_interleaved(dev, [Timed(f, warmup_ms=5, rep_ms=20) for f in fns])
    assert times[0] == pytest.approx([0.5] * 40) and times[1] == pytest.approx([2.0] * 10)
    assert len(made) == 2 * 2 + 2 * 7  # two estimates' pairs, then one pool of 7 pairs
    assert dev.log.count("sync") == 2 + 8  # two estimates, then ceil(50 / 7) blocks
