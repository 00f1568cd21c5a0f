"""The control socket's connection caps: in all, per uid, and the refused ones waiting.

``[daemon] max_connections`` bounds the connections served at once and
``[daemon] max_connections_per_uid`` those of one uid (root is exempt from
the latter only).  A connection beyond a cap is refused; at most
:data:`REFUSING_MAX` refused connections wait for their reply at once,
:data:`REFUSING_PER_UID` of one uid, so that no user's refused connections
crowd out another's.  ``krexd.server.connections`` asks :class:`ConnectionCaps` at
each acceptance and tells it each end.
"""

from __future__ import annotations

import logging
from collections import Counter

_log = logging.getLogger("krexd.connections")

REFUSING_MAX = 64  # refused connections kept for their reply at once; more are cut silently
REFUSING_PER_UID = 4  # ... of one uid (so that no user's refused ones crowd out another's)
EXEMPT_UID = 0


class ConnectionCaps:
    """Counts served and refused connections per uid against the caps.

    ``max_connections``: served at once (``[daemon] max_connections``);
    ``per_uid``: of one uid (``[daemon] max_connections_per_uid``; 0: no cap;
    root is exempt).
    """

    def __init__(self, max_connections: int, per_uid: int = 0) -> None:
        self.max_connections = max_connections
        self.per_uid = per_uid
        self.refused = 0  # connections refused so far
        self._uids: Counter[int] = Counter()  # served (not refused) connections per uid
        self._refusing: Counter[int | None] = Counter()  # refused ones waiting, per uid

    def of_uid(self, uid: int) -> int:
        """Connections ``uid`` holds now (refused ones not counted)."""
        return self._uids[uid]

    def over_cap(self, uid: int | None, open_now: int) -> str:
        """Why a new connection of ``uid`` may not be served now, with ``open_now``
        connections open (refused ones waiting included); "" when it may."""
        served = open_now - sum(self._refusing.values())
        if served >= self.max_connections:
            return (
                f"krexd has {served} connections open, its cap ([daemon] max_connections); "
                "try again later"
            )
        if uid is None or uid == EXEMPT_UID or not self.per_uid:
            return ""
        mine = self._uids[uid]
        if mine >= self.per_uid:
            return (
                f"uid {uid} already has {mine} connections open to krexd "
                "([daemon] max_connections_per_uid); end some of its krex commands first"
            )
        return ""

    def refusing_full(self, uid: int | None) -> bool:
        """True when no more refused connections (of ``uid``, or in all) may wait."""
        return (
            sum(self._refusing.values()) >= REFUSING_MAX or self._refusing[uid] >= REFUSING_PER_UID
        )

    def refuse(self, why: str) -> None:
        """Count one refusal for ``why`` (logged at the 1st, 10th, 100th and every 1000th)."""
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            _log.warning("connection refused (%d so far): %s", self.refused, why)

    def opened(self, uid: int | None, refused: bool) -> None:
        """A connection of ``uid`` is kept open: served, or ``refused`` and waiting."""
        if refused:
            self._refusing[uid] += 1
        elif uid is not None:
            self._uids[uid] += 1

    def closed(self, uid: int | None, refused: bool) -> None:
        """A connection :meth:`opened` with the same arguments ended."""
        if refused:
            self._refusing[uid] -= 1
            if self._refusing[uid] <= 0:
                del self._refusing[uid]
        elif uid is not None:
            self._uids[uid] -= 1
            if self._uids[uid] <= 0:
                del self._uids[uid]
