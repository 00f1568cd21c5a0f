"""Region requests run once: a duplicate gets the first one's answer.

After a restart a request can arrive twice (the client's re-send and the
lost connection's own copy); both carry one key (``region_enter``: its
``request_id``; ``region_exit``: its epoch).  Why and how:
docs/design/daemon.md "Restarts", "Exactly once".
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from krexd.system.errors import Code, KrexError

PER_TENANT = 8  # keys remembered per tenant (a region needs two: its enter and its exit)


@dataclass(eq=False)
class _Outcome:
    """One request's outcome: set once, awaited by its duplicates."""

    done: asyncio.Event = field(default_factory=asyncio.Event)
    reply: dict[str, Any] | None = None
    error: KrexError | None = None


class OnceLog:
    """Each tenant's recent region requests by key: in flight, or answered."""

    def __init__(self) -> None:
        self._seen: dict[int, OrderedDict[str, _Outcome]] = {}
        self.duplicates = 0  # requests answered from an earlier copy (status)

    async def run(
        self, tenant: int, key: str | None, work: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """``await work()`` once per (``tenant``, ``key``); a duplicate gets its outcome.

        ``key`` None (a client that sends no request id) runs ``work`` every
        time.  A duplicate returns the first copy's reply or raises its
        ``KrexError``; a first copy that ended otherwise (cancelled at a
        shutdown, an internal error) is forgotten, and its waiting
        duplicates raise ``KrexError(CANCELLED)``.
        """
        if key is None:
            return await work()
        seen = self._seen.setdefault(tenant, OrderedDict())
        outcome = seen.get(key)
        if outcome is not None:
            seen.move_to_end(key)
            self.duplicates += 1
            await outcome.done.wait()
            if outcome.error is not None:
                raise outcome.error
            if outcome.reply is None:
                raise KrexError(Code.CANCELLED, "the first copy of this request did not finish")
            return outcome.reply
        outcome = seen[key] = _Outcome()
        while len(seen) > PER_TENANT:
            seen.popitem(last=False)
        try:
            outcome.reply = await work()
        except KrexError as exc:
            outcome.error = exc
            raise
        except BaseException:
            if seen.get(key) is outcome:
                del seen[key]  # not an answer: a later copy runs anew
            raise
        finally:
            outcome.done.set()
        return outcome.reply

    def forget(self, tenant: int) -> None:
        """Drop ``tenant``'s keys (it ended)."""
        self._seen.pop(tenant, None)


class EndedEpochs:
    """Each tenant's last region ended by its exit, and the regions a restart ended.

    A ``region_exit`` re-sent after a restart for a region that ended
    meanwhile is answered again (with zero times) as often as it comes;
    both are saved across restarts (``Coordinator.saved``).
    """

    def __init__(self) -> None:
        self._exited: dict[int, int] = {}  # tenant id -> epoch of its last exit
        self._resumed: dict[int, int] = {}  # from the krexd before a restart

    def exited(self, tenant: int, epoch: int) -> None:
        """``tenant``'s region ``epoch`` ended by its exit."""
        self._exited[tenant] = epoch

    def resume(self, exited: dict[int, int]) -> None:
        """The krexd before a restart ended these (tenant id -> epoch)."""
        self._resumed.update(exited)

    def answered(self, tenant: int, epoch: int) -> bool:
        """Is ``epoch`` a region of ``tenant`` that ended already (its exit answered again)?"""
        return epoch in (self._resumed.get(tenant), self._exited.get(tenant))

    def forget(self, tenant: int) -> None:
        """Drop ``tenant``'s epochs (it ended)."""
        self._exited.pop(tenant, None)
        self._resumed.pop(tenant, None)

    def saved(self) -> dict[int, int]:
        """Tenant id -> epoch, the exits before a restart first (a later one wins)."""
        return {**self._resumed, **self._exited}
