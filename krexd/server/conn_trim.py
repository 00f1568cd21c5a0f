"""Memory a burst of control connections leaves behind, returned to the kernel.

Every connection costs libzmq ~30 KB of buffers, allocated in its I/O
thread's malloc arena, which glibc does not shrink by itself, so without a
trim krexd's RSS grew by ~40 MB with each round of 3,000 simultaneous
connections (measured: 30 -> 113 -> 154 -> 184 -> 195 MB).  Once a burst of
at least :data:`TRIM_AFTER` connections has been quiet for
:data:`TRIM_QUIET_S`, ``malloc_trim(0)`` returns the freed memory; and once
more :data:`TRIM_AGAIN_S` later, because libzmq frees some of a burst's
buffers only after its disconnection events.  ``krexd.server.connections`` counts
the openings and calls :meth:`BurstTrim.tick` from its monitor loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_AFTER = 64  # connections opened since the last trim before the next one is worth it
TRIM_QUIET_S = 0.5  # a trim waits until no connection has opened for this long
TRIM_AGAIN_S = 2.0  # ... and is made once more this long after: libzmq frees late


def malloc_trim() -> None:
    """``malloc_trim(0)`` where glibc has it; nothing elsewhere."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


class BurstTrim:
    """When to trim: after a quiet burst of openings, and once more a little later."""

    def __init__(self) -> None:
        self._since_trim = 0  # connections opened since the last trim
        self._last_open = 0.0  # monotonic s of the latest opening
        self._again_at = 0.0  # monotonic s of the second trim after a burst (0: none)

    def opened(self, now: float) -> None:
        """A connection opened at ``now`` (monotonic s)."""
        self._since_trim += 1
        self._last_open = now

    def tick(self, now: float) -> None:
        """Trim now (``now``: monotonic s) if a burst has been quiet long enough, or the
        second trim after one is due."""
        quiet = now - self._last_open > TRIM_QUIET_S
        if self._since_trim >= TRIM_AFTER and quiet:
            self._since_trim = 0
            self._again_at = now + TRIM_AGAIN_S
            malloc_trim()
        elif self._again_at and now >= self._again_at and quiet:
            # The first trim can come while libzmq's I/O thread still holds the
            # burst's buffers (it frees them after the DISCONNECTED events): once
            # more, so that they do not wait for the next burst.
            self._again_at = 0.0
            malloc_trim()
