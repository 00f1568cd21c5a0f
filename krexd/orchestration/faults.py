"""GPU-wide faults under MPS: detect them, pause the GPU, attribute them, restart the server.

Under MPS one client's fatal fault hits every client of the GPU's server;
:class:`FaultMonitor` opens an :class:`Incident` at the first signal (the
shim's record, the server's log), pauses admission to the GPU until its
members have ended and the MPS daemon restarted, and gives ``release`` each
member's verdict.  docs/design/faults.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from krexd.gate import FaultSeen, GateError
from krexd.hardware.mps import MpsDaemon
from krexd.orchestration.gpu import Gpu
from krexd.tenancy.registration_flags import RegistrationFlags
from krexd.tenancy.tenants import Tenant, TenantRegistry

_log = logging.getLogger("krexd.faults")

#: A server-log line saying a client met a fatal GPU error, as the H200's server
#: (driver 580) writes it: ``[2026-12-01 18:31:21.298 Server   817] Client {PID: 721,
#: Context: 1} encountered a fatal GPU error.`` followed by ``Server is handling a
#: fatal GPU error.``  The pid it names is *not* used: it was a healthy client's.
FATAL_LINE = re.compile(r"\bfatal GPU error\b", re.IGNORECASE)

POLL_S = 0.2


class Pausable(Protocol):
    """What faults need from admission (``krexd.tenancy.admission.Admission``)."""

    def pause(self, gpu: int) -> None:
        """Admit nothing more to ``gpu`` until :meth:`resume`."""
        ...

    def resume(self, gpu: int) -> None:
        """Admit to ``gpu`` again."""
        ...


class MpsControl(Protocol):
    """Restart of a GPU's MPS control daemon (``krexd.hardware.mps.MpsManager``)."""

    def start(self, gpu: int, uuid: str = "") -> MpsDaemon:
        """Start the control daemon of ``gpu``."""
        ...

    def stop(self, d: MpsDaemon) -> None:
        """Quit the control daemon ``d``."""
        ...


@dataclass(eq=False)
class Incident:
    """One GPU-wide fault of a GPU's MPS server, from detection to the restart."""

    gpu: int
    source: str  # "shim" | "mps-log": what detected it
    members: set[int]  # tenants on the GPU when it opened
    # Tenants admitted without MPS on the GPU then: not members, but they could have
    # joined the server themselves (its pipe is readable), so no "only client" verdict.
    outsiders: set[int] = field(default_factory=set)
    opened_at: float = field(default_factory=time.monotonic)
    verdicts: dict[int, str] = field(default_factory=dict)  # tenant id -> role
    # Tenants whose verified processes recorded the fault (krexd.tenancy.registration_flags).
    claimers: set[int] = field(default_factory=set)
    held_over: bool = False  # paused past FAULT_HOLD_S: admission resumed

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``krexctl status``."""
        return {
            "gpu": self.gpu,
            "source": self.source,
            "members": sorted(self.members),
            "age_s": round(time.monotonic() - self.opened_at, 3),
            "verdicts": {str(k): v for k, v in sorted(self.verdicts.items())},
        }


class FaultMonitor:
    """Watches the MPS GPUs for GPU-wide faults (docs/design/faults.md).

    Args:
        gpus: the managed GPUs by index; only those with ``mps`` are watched.
        tenants: the live tenants (members, their pids).
        admission: paused per GPU during an incident.
        mps: restarts a GPU's MPS control daemon after an incident.
    """

    def __init__(
        self,
        gpus: Mapping[int, Gpu],
        tenants: TenantRegistry,
        admission: Pausable,
        mps: MpsControl,
        flags: RegistrationFlags | None = None,
    ) -> None:
        self._gpus = gpus
        self._flags = flags
        self._tenants = tenants
        self._admission = admission
        self._mps = mps
        self.incidents: dict[int, Incident] = {}
        self.seen: dict[int, FaultSeen] = {}  # tenant id -> first fatal error of its processes
        self._log_pos: dict[int, int] = {g: _log_size(gpu) for g, gpu in gpus.items()}
        self._recovering: set[int] = set()
        self.totals = {"incidents": 0, "culprits": 0, "casualties": 0, "suspects": 0}
        self._task: asyncio.Task[None] | None = None

    def start(self, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        """Run :meth:`run` as a background task through ``spawn`` (``Runtime.spawn``)."""
        self._task = spawn(self.run())

    def close(self) -> None:
        """Stop polling (shutdown: the MPS daemons are stopped, never restarted, from now on)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # --- detection ------------------------------------------------------------------

    def check(self, gpu: int) -> Incident | None:
        """Read GPU ``gpu``'s fault signals now; its incident (opened now or earlier) or None."""
        g = self._gpus.get(gpu)
        if g is None or g.mps is None:
            return None
        pids = self._shim_records(g)
        log_fatal = self._read_log(g)
        inc = self.incidents.get(gpu)
        if inc is None and (pids or log_fatal):
            # Tenants run without MPS (suspects' re-runs) are not the server's clients.
            on_gpu = self._tenants.on_gpu(gpu)
            clients = {t.id for t in on_gpu if not t.without_mps}
            members = clients | pids
            outsiders = {t.id for t in on_gpu if t.without_mps}
            inc = Incident(gpu, "shim" if pids else "mps-log", members, outsiders=outsiders)
            self.incidents[gpu] = inc
            inc.claimers |= pids
            self.totals["incidents"] += 1
            self._admission.pause(gpu)
            _log.error(
                "gpu%d: fatal GPU error under MPS (%s): every client of its server is hit; "
                "admission paused, tenants %s",
                gpu,
                inc.source,
                sorted(members),
            )
        elif inc is not None:
            inc.claimers |= pids
        return inc

    def held_too_long(self, gpu: int) -> list[tuple[int, str]]:
        """(tenant, reason) for each live recorder of ``gpu``'s fault past the hold bound.

        Admission pauses for a fault at most ``RegistrationFlags.fault_hold_s``: a
        faulted MPS client cannot use the GPU again and its server tears it
        down, so a tenant whose process recorded the fault and still runs
        that long holds the GPU's recovery back (or forged its record).
        Admission resumes then; the gate watch ends those tenants (exit 79).
        """
        inc = self.incidents.get(gpu)
        if inc is None or self._flags is None:
            return []
        held = time.monotonic() - inc.opened_at
        if held <= self._flags.fault_hold_s:
            return []
        if not inc.held_over:
            inc.held_over = True
            self._admission.resume(gpu)
            _log.error("gpu%d: fault incident open for %.1f s; admission resumed", gpu, held)
        return [
            (
                t,
                f"its processes recorded a fatal GPU error under MPS {held:.1f} s ago and it "
                f"still runs: admission paused at most {self._flags.fault_hold_s:g} s",
            )
            for t in sorted(inc.claimers)
            if self._tenants.get(t) is not None
        ]

    def _shim_records(self, g: Gpu) -> set[int]:
        """Tenants of ``g`` whose processes recorded a fatal error (remembered in ``seen``)."""
        if g.gate is None:
            return set()
        try:
            slots = g.gate.registrations()
        except GateError:
            return set()
        hit: set[int] = set()
        for s in slots:
            if s.fault is None or s.tenant == 0:
                continue
            t = self._tenants.get(s.tenant)
            if t is None or t.gpu != g.index or t.without_mps:
                continue  # an ended tenant's record, another GPU's, or its own fault only
            # Only a verified owner's record pauses others; any record of the
            # tenant's own slots still counts in its own verdict (``seen``).
            if self._flags is None or self._flags.fault_honoured(g.gate, s):
                hit.add(s.tenant)
            prev = self.seen.get(s.tenant)
            # Keep the strongest evidence: a process that had launched kernels.
            if prev is None or (s.fault.launched and not prev.launched):
                self.seen[s.tenant] = s.fault
        return hit

    def _read_log(self, g: Gpu) -> bool:
        """True when ``g``'s server log has a new fatal-error line (detection only)."""
        if g.mps is None:
            return False
        path = os.path.join(g.mps.log_dir, "server.log")
        try:
            with open(path, "rb") as f:
                f.seek(self._log_pos.get(g.index, 0))
                data = f.read(1 << 20)
                self._log_pos[g.index] = f.tell()
        except OSError:
            return False
        return any(FATAL_LINE.search(ln) for ln in data.decode(errors="replace").splitlines())

    # --- attribution ------------------------------------------------------------------

    def verdict(self, tenant: Tenant) -> dict[str, Any] | None:
        """What the ``release`` reply says about ``tenant``'s end (None: no GPU-wide fault).

        Call before the tenant is ended (its gate records are read).  A
        tenant that exited 0 gets None: its exit code is its own, as without
        MPS.  A member that failed with no fault record is a ``suspect``
        (``error`` None): run again without MPS, its own failure fails again.
        """
        inc = self.check(tenant.gpu)
        if inc is None or tenant.id not in inc.members:
            return None
        failed = bool(tenant.signal) or bool(tenant.exit_code)
        if not failed:
            return None
        seen = self.seen.get(tenant.id)
        if seen is None:
            # Failed while its server handled the fault, with no record: the error it met
            # may be one the shim does not record (on the H200 the faulted server refused
            # a new client with 46, unrecorded then), or its own.  Uncertain: a suspect,
            # run again without MPS, where its own failure fails again and stands.
            role, why = "suspect", "it failed during the fault with no fault record"
            return self._judged(tenant, inc, role, why, None)
        if not seen.launched:
            role, why = "casualty", "its processes had launched no kernel before the error"
        elif len(inc.members) == 1 and not inc.outsiders:
            role, why = "culprit", "it was the MPS server's only client"
        else:
            role, why = "suspect", "the fault record does not say whose kernel faulted"
        return self._judged(tenant, inc, role, why, seen.code)

    def _judged(
        self, tenant: Tenant, inc: Incident, role: str, why: str, code: int | None
    ) -> dict[str, Any]:
        """Record ``tenant``'s verdict in ``inc`` and the totals; the ``release`` reply's part."""
        inc.verdicts[tenant.id] = role
        self.totals[{"culprit": "culprits", "casualty": "casualties"}.get(role, "suspects")] += 1
        _log.warning("t%d: GPU-wide fault on gpu%d: %s (%s)", tenant.id, tenant.gpu, role, why)
        return {"role": role, "gpu": tenant.gpu, "error": code, "why": why}

    # --- recovery ---------------------------------------------------------------------

    async def run(self) -> None:
        """Poll every MPS GPU; recover each incident once all its members have ended."""
        while True:
            for gpu in list(self._gpus):
                try:
                    self.check(gpu)
                    await self._maybe_recover(gpu)
                except Exception:
                    _log.exception("gpu%d: fault monitor", gpu)
            await asyncio.sleep(POLL_S)

    async def _maybe_recover(self, gpu: int) -> None:
        inc = self.incidents.get(gpu)
        if inc is None or gpu in self._recovering:
            return
        if any(self._tenants.get(t) is not None for t in inc.members):
            return  # the server refuses new clients until every old one is gone
        self._recovering.add(gpu)
        try:
            await self._restart_mps(self._gpus[gpu])
        finally:
            self._recovering.discard(gpu)
        for t in inc.members:
            self.seen.pop(t, None)
        del self.incidents[gpu]
        self._admission.resume(gpu)
        _log.warning("gpu%d: MPS server restarted; admission resumed", gpu)

    async def _restart_mps(self, g: Gpu) -> None:
        """Quit the faulted control daemon (and its server), start a fresh one."""
        old = g.mps
        if old is None:
            return
        await asyncio.to_thread(self._mps.stop, old)
        g.mps = await asyncio.to_thread(self._mps.start, g.index, g.info.uuid)
        self._log_pos[g.index] = _log_size(g)

    def status(self) -> dict[str, Any]:
        """JSON-ready: open incidents and totals since start."""
        return {
            "incidents": [i.as_dict() for i in self.incidents.values()],
            "totals": dict(self.totals),
        }


def _slots(g: Gpu) -> list[Any]:
    try:
        return g.gate.registrations() if g.gate is not None else []
    except GateError:
        return []


def _log_size(g: Gpu) -> int:
    """Size of ``g``'s server log now: only lines written later are read."""
    if g.mps is None:
        return 0
    try:
        return os.path.getsize(os.path.join(g.mps.log_dir, "server.log"))
    except OSError:
        return 0
