"""Steps 3 and 8 on the gate: drain the siblings, reopen bound to (holder, epoch).

Step 2 (close) is one call inside the entry (``krexd.coordinator.entry``).
Without ``libkrex_gate.so`` there is no gate: the coordinator holds a
:class:`krexd.coordinator.no_gate.NoGate`, whose steps do nothing (freezing
and pinning still apply).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from krexd.coordinator.base import CoordinatorBase
from krexd.errors import Code, KrexError
from krexd.gate import GateError, GateTimeout
from krexd.tenants import Tenant

#: One logger for the package: its lines read as they did from one module.
log = logging.getLogger("krexd.coordinator")


class GateSteps(CoordinatorBase):
    """Drain (step 3) and reopen (step 8) through the ``RegionGate``."""

    async def _drain(
        self,
        holder: Tenant,
        epoch: int,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> set[int]:
        """Step 3: wait for every sibling registration to acknowledge ``epoch`` (bounded).

        ``settled``: called from the drain's thread with the tenants still
        pending, after each change (``RegionGate.drain``); the tenants it
        returns are not waited for any more.

        Returns the overdue tenants: the sibling tenants whose registrations
        had not drained when ``drain_timeout_s`` ran out (empty when all
        drained).  The caller ends them (the offender pays, not its
        neighbours).

        Raises:
            KrexError: DRAIN_TIMEOUT when a pending registration belongs to
                no sibling tenant krexd can end; INTERNAL on a gate error.
        """
        timeout_s = self._cfg.drain_timeout_s
        try:
            # The drain blocks in C with the GIL released: run it off the loop.
            await asyncio.to_thread(self._gate.drain, holder.id, epoch, timeout_s, settled)
        except GateTimeout as exc:
            siblings = {t.id for t in self._siblings(holder)}
            overdue = {s.tenant for s in exc.pending}
            if overdue and overdue <= siblings:
                log.error(
                    "GPU %d: drain timed out after %g s; overdue: %s",
                    self.gpu,
                    timeout_s,
                    exc.describe(),
                )
                return overdue
            raise KrexError(
                Code.DRAIN_TIMEOUT,
                f"drain of GPU {self.gpu} timed out after {self._cfg.drain_timeout_s:g} s; "
                f"not drained: {exc.describe()}",
            ) from None
        except GateError as exc:
            raise KrexError(Code.INTERNAL, f"gate of GPU {self.gpu}: {exc}") from None
        return set()

    def _reopen_gate(self, holder: int, epoch: int) -> None:
        try:
            self._gate.reopen(holder, epoch)
        except GateError as exc:
            # Bound to (holder, epoch): a stale reopen must not open a newer region.
            log.error(
                "GPU %d: reopen for tenant %d epoch %d refused: %s", self.gpu, holder, epoch, exc
            )
