"""``GateSteps``: steps 2, 3 and 8 on the gate: close, drain the siblings, reopen.

The gate is a :class:`krexd.coordinator.isolation.RegionGate` (``krexd.gate.Gate``), or,
without ``libkrex_gate.so``, a :class:`krexd.coordinator.no_gate.NoGate`,
whose steps do nothing (freezing and pinning still apply): the protocol
reads the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from krexd.coordinator.isolation import RegionGate
from krexd.coordinator.scope import GpuScope, log
from krexd.gate import GateError, GateTimeout
from krexd.system.errors import Code, KrexError
from krexd.tenancy.tenants import Tenant


class GateSteps:
    """Close (step 2), drain (step 3) and reopen (step 8) through one GPU's gate."""

    def __init__(self, scope: GpuScope, gate: RegionGate) -> None:
        self._scope = scope
        self.gate = gate

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: close the gate for (``holder`` tenant id, ``epoch``), one atomic word.

        Raises:
            GateError: the gate refused (the entry fails and is undone).
        """
        self.gate.close(holder, epoch)

    async def drain(
        self,
        holder: Tenant,
        epoch: int,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> set[int]:
        """Step 3: wait for every sibling registration to acknowledge ``epoch`` (bounded).

        ``settled``: called from the drain's thread with the tenants still
        pending, after each change (``RegionGate.drain``); the tenants it
        returns are not waited for any more.

        Returns the overdue tenants: the sibling tenant ids whose
        registrations had not drained when ``drain_timeout_s`` ran out
        (empty when all drained).  The caller ends them (the offender pays,
        not its neighbours).

        Raises:
            KrexError: DRAIN_TIMEOUT when a pending registration belongs to
                no sibling tenant krexd can end; INTERNAL on a gate error.
        """
        scope = self._scope
        timeout_s = scope.cfg.drain_timeout_s
        try:
            # The drain blocks in C with the GIL released: run it off the loop.
            await asyncio.to_thread(self.gate.drain, holder.id, epoch, timeout_s, settled)
        except GateTimeout as exc:
            siblings = {t.id for t in scope.siblings(holder)}
            overdue = {s.tenant for s in exc.pending}
            if overdue and overdue <= siblings:
                log.error(
                    "GPU %d: drain timed out after %g s; overdue: %s",
                    scope.gpu,
                    timeout_s,
                    exc.describe(),
                )
                return overdue
            raise KrexError(
                Code.DRAIN_TIMEOUT,
                f"drain of GPU {scope.gpu} timed out after {timeout_s:g} s; "
                f"not drained: {exc.describe()}",
            ) from None
        except GateError as exc:
            raise KrexError(Code.INTERNAL, f"gate of GPU {scope.gpu}: {exc}") from None
        return set()

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: reopen the gate, bound to (``holder``, ``epoch``); never raises
        (a stale reopen, refused, must not open a newer region: it is logged)."""
        try:
            self.gate.reopen(holder, epoch)
        except GateError as exc:
            log.error(
                "GPU %d: reopen for tenant %d epoch %d refused: %s",
                self._scope.gpu,
                holder,
                epoch,
                exc,
            )
