"""ctypes binding of ``libkrex_gate.so``: the coordinator's side of the gate.

The gate is one shared-memory file per GPU, written by krexd alone and
mapped read-only by the tenants; each tenant's processes register in the
tenant's own slot memory, a sealed memfd its launcher creates (layout:
``libkrex_shim/include/krex_gate.h``; docs/design/shim.md "Who writes
what").  krexd creates the gate, attaches each tenant's slot memory
(:meth:`Gate.attach`, read-only), and the coordinator drives the region
protocol on it (paper §4.2, DESIGN.md "Region entry and exit"):

* step 2 ``close(holder, epoch)``: one atomic compare-and-swap of the gate
  word; every sibling's next gated driver call parks;
* step 3 ``drain(holder, epoch, timeout_s)``: until every sibling slot has
  acknowledged ``epoch`` with nothing in flight; the owners of slots still
  pending are judged by ``judge`` (krexd's own verification of who the
  slot's process is, ``krexd.tenancy.registrations``) and those judged gone are
  skipped (:meth:`Gate.ignore`, kept in krexd, never written to the slot);
  its ``settled`` callback hears after each acknowledgement which tenants
  are still pending, and the tenants it takes (freezes) are not waited for;
* step 8 ``reopen(holder, epoch)``: only if the gate still holds that
  region, so a late recovery never reopens a newer one.

:meth:`Gate.audit` validates every attached slot memory (states krexd's
protocol cannot have produced) and publishes the per-tenant memory summary
the shims read; :meth:`Gate.relink` puts the gate file back if its path was
removed or replaced (krexd keeps its fd and a second link).

Opening an existing gate again (krexd after a restart) is not supported by
this layout: a new krexd creates a new gate and tenants must re-attach
(docs/design/shim.md "Restarts").

The protocol code itself is C (``libkrex_shim/gate/gate.c``, ``coord.c``,
``coord_protocol.c``),
shared with the shim; this package only binds it.  ``drain`` blocks in C:
ctypes releases the GIL for the call, so run it in a worker thread
(``asyncio.to_thread``) to keep an event loop responsive.  The layout is
defined once, in the C header; this binding never reads a mapping itself.
It is the only Python code that knows the gate's C API (``binding`` alone
declares its structures), and a test keeps it the only one.

Modules, one concern each (import the names from here):

* ``binding``: the C API: layout constants, the ctypes structures, loading
  the library and declaring its prototypes; ``registration_memory_spec``.
* ``readback``: what krexd reads back, decoded: ``RegistrationInfo`` (one
  registration), its out-of-memory and fault records, audit findings (``Finding``).
* ``errors``: ``GateError`` and its kinds (busy, stale, drain timeout).
* ``mapping``: the gate file and krexd's mapping of it: create, open again
  after a restart, unmap, unlink, relink (``keep_path``).
* ``registration_memory``: the tenants' slot memories: attach, detach, ignore,
  snapshots and the audit.
* ``protocol``: ``Gate``: the gate word and epoch, steps 2, 3 and 8.

Words: the C layout (krex_gate.h) calls a registration a *slot* and a
tenant's memory of registrations its *slot memory* (``krex_slot``,
``KREX_TENANT_SLOTS``, ``KREX_SLOTS_FD``, the wire's ``slots_fd``, admit's
``slots``); those names stay.  krexd's Python names say *registration*,
and *slot* means an admission slot (``[admission] slots_per_gpu``).

The library is found through ``krexd.system.paths.gate_library()``.
"""

from __future__ import annotations

from krexd.gate.binding import (
    ABI_VERSION,
    MAX_SLOTS,
    MAX_TENANTS,
    TENANT_SLOTS,
    registration_memory_spec,
)
from krexd.gate.errors import GateBusy, GateError, GateStale, GateTimeout
from krexd.gate.mapping import GATE_MODE, keep_path
from krexd.gate.protocol import Gate
from krexd.gate.readback import (
    COTENANT_REASONS,
    FINDINGS,
    LIVE_REGISTRATION_STATES,
    OOM_REASONS,
    REGISTRATION_STATES,
    FaultSeen,
    Finding,
    Judge,
    OomRecord,
    Registration,
    RegistrationInfo,
)

__all__ = [
    "ABI_VERSION",
    "COTENANT_REASONS",
    "FINDINGS",
    "GATE_MODE",
    "LIVE_REGISTRATION_STATES",
    "MAX_SLOTS",
    "MAX_TENANTS",
    "OOM_REASONS",
    "REGISTRATION_STATES",
    "TENANT_SLOTS",
    "FaultSeen",
    "Finding",
    "Gate",
    "GateBusy",
    "GateError",
    "GateStale",
    "GateTimeout",
    "Judge",
    "OomRecord",
    "Registration",
    "RegistrationInfo",
    "keep_path",
    "registration_memory_spec",
]
