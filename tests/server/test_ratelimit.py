"""krexd.server.ratelimit: a burst at once, then the rate as later starts, then refusals."""

from __future__ import annotations

import pytest

from krexd.server.ratelimit import RateBuckets


def test_a_burst_starts_at_once_then_events_wait_their_turn() -> None:
    b = RateBuckets(rate=10.0, burst=3, max_wait_s=1.0)
    assert [b.take("u", 0.0).wait_s for _ in range(3)] == [0.0, 0.0, 0.0]
    waits = [b.take("u", 0.0).wait_s for _ in range(10)]
    assert waits == pytest.approx([0.1 * i for i in range(1, 11)])
    assert b.paced == 10 and b.refused == 0


def test_an_event_that_would_wait_too_long_is_refused_with_when_to_ask_again() -> None:
    b = RateBuckets(rate=10.0, burst=1, max_wait_s=0.5)
    for _ in range(6):  # 0, 0.1, ..., 0.5 s
        assert not b.take("u", 0.0).refused
    pace = b.take("u", 0.0)
    assert pace.refused and pace.retry_s == pytest.approx(0.1)
    assert b.refused == 1
    # A refusal costs no token: asking again after retry_s fits.
    assert not b.take("u", pace.retry_s).refused


def test_a_forced_event_starts_now_but_pays_as_any_other() -> None:
    b = RateBuckets(rate=10.0, burst=1, max_wait_s=0.5)
    starts = [b.take("u", 0.0, force=True) for _ in range(8)]
    assert [p.wait_s for p in starts[:7]] == [0.0] * 7  # not delayed ...
    assert starts[7].refused  # ... but past the bound refused like any other
    assert b.take("u", 0.0).refused  # and the others pay for what it took
    assert b.paced == 0


def test_keys_are_paced_apart_and_refill_at_the_rate() -> None:
    b = RateBuckets(rate=2.0, burst=2, max_wait_s=10.0)
    for _ in range(2):
        b.take("a", 0.0)
    assert b.take("a", 0.0).wait_s == pytest.approx(0.5)
    assert b.take("b", 0.0).wait_s == 0.0  # another key has its own burst
    assert b.take("a", 10.0).wait_s == 0.0  # refilled (to the burst, not beyond)
    assert b.take("a", 10.0).wait_s == 0.0
    assert b.take("a", 10.0).wait_s == pytest.approx(0.5)


def test_full_buckets_are_forgotten_and_a_clock_going_back_takes_nothing() -> None:
    b = RateBuckets(rate=1.0, burst=2, max_wait_s=10.0)
    b.take("a", 5.0)
    b.take("b", 5.0)
    b.take("b", 5.0)
    b.forget_full(6.0)  # a is full again, b is not
    assert len(b) == 1
    assert b.take("b", 4.0).wait_s == pytest.approx(0.0)  # the one token b earned by 6.0


def test_bad_parameters_are_refused() -> None:
    for rate, burst, wait in ((0.0, 1, 1.0), (1.0, 0, 1.0), (1.0, 1, -1.0)):
        with pytest.raises(ValueError):
            RateBuckets(rate, burst, wait)
