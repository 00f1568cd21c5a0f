"""Per-uid caps on admission: admitted tenants and parked requests of one user.

``[admission] max_admitted_per_uid`` bounds the slots one uid holds at once:
a parked request of a uid at its cap stays parked and is passed over, so
requests of other users behind it are granted first (the queue stays FIFO
among the requests that are within their caps).  ``[admission]
max_parked_per_uid`` bounds the requests one uid may have parked; one more is
refused with ``CANCELLED``.  0 means no cap.  Root (uid 0) is exempt from
both: it is trusted (docs/design/security.md "Parties and trust") and is still bounded by
``max_parked``.  The uid is the kernel-verified caller's (``krexd.tenancy.identity``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from krexd.system.errors import Code, KrexError

EXEMPT_UID = 0
SHOWN_COMMAND_CHARS = 512  # characters of a command line status shows


def argv_bytes(argv: list[str]) -> int:
    """The size of ``argv`` as the kernel counts it: UTF-8 bytes plus one NUL per argument."""
    return sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in argv)


def check_argv(argv: list[str], limit: int) -> None:
    """Raise ``KrexError(BAD_FIELD)`` when ``argv`` is larger than ``limit`` bytes
    (``[admission] max_argv_bytes``; :func:`argv_bytes` counts)."""
    size = argv_bytes(argv)
    if size > limit:
        raise KrexError(
            Code.BAD_FIELD,
            f"argv: {size} bytes, more than krexd accepts ({limit}, "
            "[admission] max_argv_bytes): pass large inputs in a file",
        )


def shown_command(argv: list[str], limit: int = SHOWN_COMMAND_CHARS) -> list[str]:
    """``argv`` as status shows it: at most ``limit`` characters in all.

    Arguments past the budget are dropped and the last one kept is cut; a
    cut list ends with ``"…(N more characters)"``.
    """
    out: list[str] = []
    left = limit
    for a in argv:
        if len(a) > left:
            out.append(a[:left])
            break
        out.append(a)
        left -= len(a)
    else:
        return out
    hidden = sum(len(a) for a in argv) - sum(len(a) for a in out)
    return [*out, f"…({hidden} more characters)"]


class UidCaps:
    """Counts admitted tenants per uid; ``max_admitted`` / ``max_parked`` (0 = no cap)."""

    def __init__(self, max_admitted: int = 0, max_parked: int = 0) -> None:
        self.max_admitted = max_admitted
        self.max_parked = max_parked
        self._admitted: Counter[int] = Counter()

    def check_park(self, uid: int, parked_uids: Iterable[int]) -> None:
        """Raise ``KrexError(CANCELLED)`` when ``uid`` has ``max_parked`` requests parked."""
        if uid == EXEMPT_UID or not self.max_parked:
            return
        n = sum(1 for u in parked_uids if u == uid)
        if n >= self.max_parked:
            raise KrexError(
                Code.CANCELLED,
                f"uid {uid} already has {n} requests parked ([admission] max_parked_per_uid)",
            )

    def may_grant(self, uid: int) -> bool:
        """False while ``uid`` holds ``max_admitted`` slots."""
        if uid == EXEMPT_UID or not self.max_admitted:
            return True
        return self._admitted[uid] < self.max_admitted

    def granted(self, uid: int) -> None:
        """A request of ``uid`` was granted a slot."""
        self._admitted[uid] += 1

    def released(self, uid: int) -> None:
        """A tenant of ``uid`` freed its slot."""
        if self._admitted[uid] > 1:
            self._admitted[uid] -= 1
        else:
            self._admitted.pop(uid, None)

    def admitted(self, uid: int) -> int:
        """Slots ``uid`` holds now."""
        return self._admitted[uid]
