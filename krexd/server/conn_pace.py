"""Each uid's new control connections paced, and the requests held for their start.

:class:`UidPace` charges a connection to its uid's pace at its first
request; :class:`HeldRequests` holds that connection's requests until its
start, or the request is refused with ``retry_s`` past :data:`PACE_MAX_S`.
docs/design/security.md "3. No squatting, no starvation: no user can stall
another".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from krexd.server.ratelimit import RateBuckets

_log = logging.getLogger("krexd.connections")

# The longest a paced connection's first request is held: well inside the shortest reply
# timeout of a krex client (2 s: krexctl top, krex run's queue notes, a pool's ping).
PACE_MAX_S = 1.0
HELD_MAX = 4  # requests held for one paced connection; more are refused TOO_MANY

#: A held request's continuation, called with what becomes of it: START it, STOP
#: (krexd stops: answer it so), DROP (its connection ended, or krexd restarts and its
#: client asks the successor: no reply).
Release = Callable[[str], None]
START, STOP, DROP = "start", "stop", "drop"

#: ``status``'s pace fields when connections are not paced.
UNPACED: dict[str, int | float] = {
    "per_s_per_uid": 0.0,
    "burst_per_uid": 0,
    "paced": 0,
    "refused_rate": 0,
}


@dataclass(frozen=True)
class Charge:
    """What a connection's first request pays: ``refusal`` (why, with ``retry_s``: the
    seconds after which asking again fits) or ``wait_s`` (0: served now)."""

    refusal: str = ""
    retry_s: float = 0.0
    wait_s: float = 0.0


class UidPace:
    """New connections of one uid served per second after a burst (token buckets per uid).

    ``per_s``: ``[daemon] connections_per_s_per_uid`` (> 0); ``burst``:
    ``connection_burst_per_uid`` (at least 1 is used).
    """

    def __init__(self, per_s: float, burst: int) -> None:
        self._buckets = RateBuckets(per_s, max(1, burst), PACE_MAX_S)

    def charge(self, uid: int, now: float, urgent: bool = False) -> Charge:
        """Charge one new connection of ``uid`` at ``now`` (monotonic s); ``urgent`` (a
        region operation) is never held, but refused past the bound like any other."""
        pace = self._buckets.take(uid, now, force=urgent)
        if pace.refused:
            retry = max(0.1, pace.retry_s)
            b = self._buckets
            return Charge(
                refusal=(
                    f"uid {uid} opens connections to krexd faster than "
                    f"[daemon] connections_per_s_per_uid ({b.rate:g}/s after a burst "
                    f"of {int(b.burst)}); asking again after {retry:.1f} s fits"
                ),
                retry_s=retry,
            )
        return Charge(wait_s=pace.wait_s)

    def tidy(self, now: float) -> None:
        """Forget uids whose buckets are full again, once there are many (more than 64)."""
        if len(self._buckets) > 64:
            self._buckets.forget_full(now)

    def status(self) -> dict[str, int | float]:
        """``{"per_s_per_uid", "burst_per_uid", "paced", "refused_rate"}``."""
        b = self._buckets
        return {
            "per_s_per_uid": b.rate,
            "burst_per_uid": int(b.burst),
            "paced": b.paced,
            "refused_rate": b.refused,
        }


@dataclass
class HeldRequests:
    """One connection's requests waiting for its start (``ready_at``, monotonic s), in order."""

    ready_at: float = 0.0
    waiting: list[Release] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None  # runs ``due`` at ``ready_at``

    @property
    def active(self) -> bool:
        """True while requests wait or their start is scheduled (later ones wait too)."""
        return self.timer is not None or bool(self.waiting)

    def add(self, release: Release, due: Callable[[], None]) -> bool:
        """Hold one more request; ``due`` is called at ``ready_at`` (on the running loop).
        False (not held) when :data:`HELD_MAX` already wait."""
        if len(self.waiting) >= HELD_MAX:
            return False
        self.waiting.append(release)
        if self.timer is None:
            delay = max(0.0, self.ready_at - time.monotonic())
            self.timer = asyncio.get_running_loop().call_later(delay, due)
        return True

    def release(self, how: str) -> None:
        """Call every held request's continuation with ``how`` (START, STOP or DROP), in
        order; the scheduled start is cancelled and nothing waits afterwards."""
        if self.timer is not None:
            self.timer.cancel()
        held, self.timer, self.waiting, self.ready_at = self.waiting, None, [], 0.0
        for release in held:
            try:
                release(how)
            except Exception:  # an op's bug must not leave the others held or krexd's loop dead
                _log.exception("a held request's %s failed", how)
