"""Keeps every GPU's gate sound between and during regions (docs/design/shim.md "Who writes what").

Every 10 ms :class:`GateWatch` audits each gate (a forged state ends its
tenant, exit 79); every few ticks it verifies the live registrations,
times the memory waits and fault holds it honours, restores the gate
file's path and reopens a gate word left closed with no region.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from krex_client.errors import ExitCode
from krexd.coordinator.isolation import EndCommand
from krexd.gate import GateError
from krexd.orchestration.gpu import Gpu
from krexd.tenancy.registration_flags import RegistrationFlags
from krexd.tenancy.registrations import Verifier
from krexd.tenancy.tenants import TenantRegistry

_log = logging.getLogger("krexd.gatewatch")

#: kill(tenant, reason, exit_code): end a tenant's command for what it did.
KillTenant = EndCommand


class GateWatch:
    """Audits, verifies and restores the gates of ``gpus``.

    Every ``period_s``, for each gate, ``Gate.audit()`` validates every
    attached slot memory (a slot state that does not exist, a registration
    claiming another tenant, an acknowledgement of an epoch krexd never
    requested, an impossible in-flight count, a rewritten header): each such
    tenant is named in one error line and its command ended (exit 79).  The
    audit also publishes the per-tenant memory summary the shims read and
    relays device-memory frees to waiting co-tenants.  Every ``sweep_every``
    ticks each live registration not ignored yet is verified
    (``RegistrationFlags.verify``: O(processes + slots) per tenant), those
    whose process is gone or exec'd are ignored from then on, each verified
    memory wait is timed, and a tenant honoured past its bound (a memory
    wait, or a process alive ``FAULT_HOLD_S`` after its fault under MPS) is
    ended (exit 79); the gate file's path is checked and restored, and a
    gate word left closed with no region (krexd's own fault) is logged and
    reopened.  One audit reads at most 64 x 128 slots; the detection delay
    is one period."""

    def __init__(
        self,
        gpus: Mapping[int, Gpu],
        tenants: TenantRegistry,
        verifier: Verifier,
        kill: KillTenant,
        period_s: float = 0.01,
        sweep_every: int = 10,
        flags: RegistrationFlags | None = None,
        fault_claims: Callable[[int], list[tuple[int, str]]] | None = None,
    ) -> None:
        self._gpus = gpus
        self._tenants = tenants
        self._verifier = verifier
        self._kill = kill
        # Without flags of the daemon's: verify only, never bound a wait.
        self.flags = flags or RegistrationFlags(verifier, tenants, wait_bound_s=float("inf"))
        # fault_claims(gpu): (tenant, reason) for recorders of a fault held too long.
        self._fault_claims = fault_claims
        self._period_s = period_s
        self._sweep_every = sweep_every
        self._ticks = 0

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            try:
                self.tick()
            except Exception:
                _log.exception("gate watch")
            await asyncio.sleep(self._period_s)

    def tick(self) -> None:
        """One audit of every gate (and, every ``sweep_every`` ticks, a sweep)."""
        self._ticks += 1
        sweep = self._ticks % self._sweep_every == 0
        for gpu in self._gpus.values():
            if gpu.gate is None:
                continue
            try:
                self._audit(gpu)
                if sweep:
                    self._sweep(gpu)
            except GateError as exc:
                _log.debug("gpu%d: %s", gpu.index, exc)  # unmapped at shutdown

    def _audit(self, gpu: Gpu) -> None:
        assert gpu.gate is not None
        for finding in gpu.gate.audit():
            tenant = self._tenants.get(finding.tenant)
            if tenant is None or tenant.kill_reason is not None:
                continue
            reason = (
                f"tampered with its gate registrations on GPU {gpu.index}: {finding.describe()}"
            )
            _log.error("t%d %s; ending its command", tenant.id, reason)
            self._kill(tenant, reason, ExitCode.UNPROTECTABLE, "tampered")

    def _end(self, tenant_id: int, reason: str) -> None:
        """End tenant ``tenant_id``'s command (exit 79) for a flag held past its bound."""
        tenant = self._tenants.get(tenant_id)
        if tenant is None or tenant.kill_reason is not None:
            return
        _log.error("t%d %s; ending its command", tenant.id, reason)
        self._kill(tenant, reason, ExitCode.UNPROTECTABLE, "tampered")

    def _sweep(self, gpu: Gpu) -> None:
        gate = gpu.gate
        assert gate is not None
        slots = gate.registrations()
        self.flags.forget({t.id for t in self._tenants})
        verified = self.flags.verify(gate, slots)  # the others are ignored from now on
        ended = self.flags.observe_waits(slots, verified)
        if self._fault_claims is not None:
            ended += self._fault_claims(gpu.index)
        for tenant_id, reason in ended:
            self._end(tenant_id, f"on GPU {gpu.index}: {reason}")
        try:
            if gate.relink():
                _log.error(
                    "gpu%d: gate file %s was removed or replaced; restored", gpu.index, gate.path
                )
        except GateError as exc:
            _log.error("gpu%d: %s", gpu.index, exc)
        word = gate.word
        if word is not None and gpu.coordinator.idle():
            holder, epoch = word
            _log.error(
                "gpu%d: gate closed for tenant %d epoch %d with no region; reopening",
                gpu.index,
                holder,
                epoch,
            )
            gate.reopen(holder, epoch)
