"""Per-key token buckets that pace rather than refuse: the wait a new event must take.

Used by :mod:`krexd.server.connections` for ``[daemon] connections_per_s_per_uid``:
each uid may start ``burst`` connections at once and ``rate`` a second after
that.  An event over the rate is not refused at once: it is given a start
time in the future (the bucket goes into debt), so an honest burst a little
over the rate is served a little later; only an event that would wait more
than ``max_wait_s`` is refused, with the time after which asking again fits.
A client that waits for its reply before asking again (every krex client) is
thereby held to ``rate`` events a second.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float  # may be negative: the debt of events already given a later start
    at: float  # monotonic s of the last refill


@dataclass(frozen=True)
class Pace:
    """What one event gets: ``wait_s`` before it starts (0: now), or refused
    (``refused`` True) with ``retry_s``, the seconds after which asking again
    would be given a start within ``max_wait_s``."""

    wait_s: float = 0.0
    refused: bool = False
    retry_s: float = 0.0


class RateBuckets:
    """Token buckets, one per key, created full on a key's first event.

    Args:
        rate: events per second each key may start after its burst (> 0).
        burst: events a key may start at once (≥ 1).
        max_wait_s: the longest start delay given; an event that would wait
            longer is refused.
    """

    def __init__(self, rate: float, burst: int, max_wait_s: float) -> None:
        if rate <= 0 or burst < 1 or max_wait_s < 0:
            raise ValueError(f"bad pace: rate {rate}, burst {burst}, max_wait_s {max_wait_s}")
        self.rate = rate
        self.burst = float(burst)
        self.max_wait_s = max_wait_s
        self._buckets: dict[object, _Bucket] = {}
        self.paced = 0  # events given a later start
        self.refused = 0  # events refused

    def take(self, key: object, now: float, force: bool = False) -> Pace:
        """Charge one event of ``key`` at monotonic time ``now`` (s); its :class:`Pace`.

        ``force``: the event is not delayed (``wait_s`` 0) but pays exactly as
        any other: it takes its token, and past ``max_wait_s`` it is refused.
        """
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self.burst, now)
        self._refill(bucket, now)
        wait = max(0.0, (1.0 - bucket.tokens) / self.rate)
        if wait > self.max_wait_s:
            self.refused += 1
            return Pace(refused=True, retry_s=wait - self.max_wait_s)
        bucket.tokens -= 1.0
        if wait and not force:
            self.paced += 1
        return Pace(wait_s=0.0 if force else wait)

    def forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (a key's next event starts them anew)."""
        for key, bucket in list(self._buckets.items()):
            self._refill(bucket, now)
            if bucket.tokens >= self.burst:
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)

    def _refill(self, bucket: _Bucket, now: float) -> None:
        bucket.tokens = min(self.burst, bucket.tokens + max(0.0, now - bucket.at) * self.rate)
        bucket.at = max(bucket.at, now)
