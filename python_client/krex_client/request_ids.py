"""Ids of region requests, so that krexd runs each once (docs/design/daemon.md "Restarts").

A ``region_enter`` or ``region_exit`` re-sent after a krexd restart may reach
the new krexd twice (the re-sent copy and the lost connection's queued one).
Each logical request carries ``request_id`` = ``<pid>-<start time>-<n>``:
the process's pid and start time (``/proc/self/stat`` field 22, clock ticks
since boot) name the process across pid reuse, and ``n`` counts its
requests; every re-send of one request carries the same id, so krexd
answers a duplicate with the first copy's reply.  A krexd older than this
field refuses it (``BAD_FIELD`` naming ``request_id``): :meth:`unsupported`
then stops sending it for the rest of the process.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

FIELD = "request_id"


def _start_time() -> int:
    """This process's start time (clock ticks since boot); 0 when /proc cannot tell."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


class RequestIds:
    """Fresh request ids for this process (a forked child starts its own sequence)."""

    def __init__(self) -> None:
        self._pid = 0
        self._prefix = ""
        self._count = itertools.count(1)
        self._off = False

    def fields(self) -> dict[str, Any]:
        """``{"request_id": <new id>}`` for a new request's body; ``{}`` once unsupported."""
        if self._off:
            return {}
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._prefix = f"{self._pid}-{_start_time()}-"
            self._count = itertools.count(1)
        return {FIELD: f"{self._prefix}{next(self._count)}"}

    def refused(self, name: str, message: str, body: dict[str, Any]) -> bool:
        """True when an error reply (``name``, ``message``) refused ``body``'s request id.

        Then the id is dropped from ``body`` and no later request sends one
        (a krexd older than the field); the caller sends ``body`` again.
        """
        if name != "BAD_FIELD" or FIELD not in body or FIELD not in message:
            return False
        del body[FIELD]
        self._off = True
        return True
