"""The tenants' slot memories on a gate: attach, detach, ignore, snapshots, audit."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

from krexd.gate.binding import TENANT_SLOTS, FindingC, RegistrationInfoC, check_id
from krexd.gate.errors import GateError
from krexd.gate.mapping import GateMapping
from krexd.gate.readback import (
    LIVE_REGISTRATION_STATES,
    REGISTRATION_STATES,
    Finding,
    Registration,
    RegistrationInfo,
)


class GateRegistrationMemory(GateMapping):
    """Each attached tenant's slot memory (read-only) and what krexd reads of it."""

    def attach(self, tenant: int, fd: int) -> None:
        """Map tenant ``tenant``'s slot memory (read-only) from ``fd``, after checking it.

        ``fd`` is krexd's own open file of the launcher's memfd (the caller
        keeps and closes it).  Raises GateError: EPERM (not a memfd sealed
        against shrinking, growing and sealing), EPROTO (wrong size,
        layout or tenant), EEXIST, ENOSPC (``MAX_TENANTS`` attached).
        """
        check_id("tenant", tenant)
        with self._mapped() as h:
            rc = int(self._lib.krex_coord_attach(h, tenant, fd))
        if rc == 0:
            with self._mu:
                self._attached.add(tenant)
            return
        if rc != 0:
            why = {
                errno.EPERM: "not a memfd sealed against shrinking, growing and sealing",
                errno.EPROTO: "wrong size, layout or tenant",
            }.get(-rc, os.strerror(-rc))
            raise GateError(f"slot memory of tenant {tenant}: {why}", -rc)

    def detach(self, tenant: int) -> None:
        """Forget tenant ``tenant``'s slot memory (no error if it was not attached)."""
        with self._mapped() as h:
            self._lib.krex_coord_detach(h, tenant)
        with self._mu:
            self._attached.discard(tenant)

    def _capacity(self) -> int:
        """Slots of the attached tenants: the size of a snapshot or pending list."""
        with self._mu:
            return max(1, len(self._attached)) * TENANT_SLOTS

    def ignore(self, slot: RegistrationInfo) -> None:
        """Skip ``slot`` in drains and summaries while its owner stays ``slot.owner``."""
        with self._mapped() as h:
            self._lib.krex_coord_ignore(h, slot.tenant, slot.index, slot.owner)

    def audit(self) -> list[Finding]:
        """Validate every attached slot memory; publish the memory summary; relay frees.

        Returns the states krexd's protocol cannot have produced (the
        caller ends those tenants).  Cheap (no system call unless a tenant
        freed memory): krexd runs it every few ms.
        """
        out = (FindingC * 64)()
        with self._mapped() as h:
            n = int(self._lib.krex_coord_audit(h, out, len(out)))
        if n < 0:
            raise GateError(f"audit of gate {self.path}: {os.strerror(-n)}", -n)
        return [Finding(f.tenant, f.kind, f.index, f.value) for f in out[:n]]

    def registrations(self) -> list[RegistrationInfo]:
        """A snapshot of every used slot of every attached tenant.

        Fields are read without a lock (relaxed loads): counts may be
        mutually stale by a few calls.  Raises GateError once unmapped.
        """
        return [info.snapshot() for info in self._read_registrations()]

    def live_registrations(self) -> list[Registration]:
        """The live (active or exiting), not ignored, registrations of every attached tenant.

        What region entry reads twice (memory fit, fail-closed check): only
        the fields those ask for, read straight from the C snapshot.
        Raises GateError once unmapped.
        """
        return [
            Registration(
                REGISTRATION_STATES[c.state],
                c.pid,
                c.tenant,
                c.mem_mib,
                c.start_ticks,
                c.image,
                c.pidns,
            )
            for c in self._read_registrations()
            if c.state in _LIVE_CODES and not c.ignored
        ]

    def waiting_for_memory(self) -> list[RegistrationInfo]:
        """The slots whose allocation waits for co-tenants' memory now (``oom.waiting``).

        What admission asks before every decision: only those slots are
        converted.  Raises GateError once unmapped.
        """
        return [info.snapshot() for info in self._read_registrations() if info.oom_waiting]

    def _read_registrations(self) -> list[RegistrationInfoC]:
        """The used slots, as views into this thread's reusable buffer.

        Valid until this thread's next call: every caller converts them at
        once.  The buffer (attached tenants x ``TENANT_SLOTS`` entries, a few
        hundred KiB) is kept between calls: region entry reads the slots
        twice, and a fresh zeroed buffer each time cost page faults.
        """
        cap = self._capacity()
        infos = _buffer(cap)
        with self._mapped() as h:
            n = int(self._lib.krex_coord_slots(h, infos, cap))
        if n < 0:
            raise GateError(f"slots of gate {self.path}: {os.strerror(-n)}", -n)
        return list(infos[:n])


#: The C state codes of :data:`LIVE_REGISTRATION_STATES`.
_LIVE_CODES = frozenset(
    code for code, name in REGISTRATION_STATES.items() if name in LIVE_REGISTRATION_STATES
)

_BUFFERS = threading.local()


def _buffer(cap: int) -> Any:
    """This thread's ``RegistrationInfoC`` array of ``cap`` entries or more (grown, not shrunk)."""
    buf = getattr(_BUFFERS, "infos", None)
    if buf is None or len(buf) < cap:
        buf = _BUFFERS.infos = (RegistrationInfoC * cap)()
    return buf
