"""The tenant's slot memory attached to its GPU's gate at its first ``place``.

The launcher's sealed memfd is opened through ``/proc/<launcher>/fd/<n>``
and handed to the gate (``krexd.gate``), which checks its seals, size and
header and maps it read-only before the command runs (docs/design/shim.md).
"""

from __future__ import annotations

import os

from krexd.gate import Gate, GateError
from krexd.system.errors import Code, KrexError
from krexd.tenancy import states
from krexd.tenancy.tenants import Tenant


def attach_registrations(gate: Gate | None, tenant: Tenant, slots_fd: int) -> None:
    """Attach the launcher's slot memory fd ``slots_fd`` to the tenant's gate (once).

    ``gate``: the tenant's GPU's gate (None: nothing to attach).  Raises
    ``KrexError(BAD_FIELD)`` for a running tenant, an fd that cannot be
    opened, or slot memory the gate does not accept.
    """
    if gate is None or tenant.exclusive or tenant.registrations_attached:
        return
    if tenant.state != states.ADMITTED:
        # Only the place that starts the command attaches: a region entry judges a
        # running tenant with nothing attached as having no registration to drain,
        # and may freeze it and stop waiting for it (coordinator/drain_freeze.py).
        raise KrexError(
            Code.BAD_FIELD,
            f"tenant {tenant.id} is running: its slot memory is attached by its first place only",
        )
    try:
        fd = os.open(f"/proc/{tenant.launcher_pid}/fd/{slots_fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise KrexError(
            Code.BAD_FIELD, f"slot memory fd {slots_fd} of launcher: {exc.strerror}"
        ) from None
    try:
        gate.attach(tenant.id, fd)
    except GateError as exc:
        raise KrexError(Code.BAD_FIELD, str(exc)) from None
    finally:
        os.close(fd)
    tenant.registrations_attached = True
    tenant.slots_fd = slots_fd
