"""ctypes binding of ``libkrex_gate.so``: krexd's side of the gate, its only Python view.

The gate (one file per GPU, written by krexd alone) and the tenants' slot
memories are laid out in ``libkrex_shim/include/krex_gate.h``; the C code
does the protocol's steps 2, 3 and 8 (docs/design/architecture.md "The
region protocol, step by step"; docs/design/shim.md "Who writes what").
``binding`` alone declares the C structures, and a test keeps it so.
Words: the C layout's *slot* is a *registration* here; *slot* means an
admission slot.  Import the names from here; the library is found by
``krexd.system.paths.gate_library()``.
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
