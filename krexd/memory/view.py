"""One GPU's memory state in krexd: the gate's memory fields, the ledger, the last view.

A :class:`GpuMemory` lives on each ``krexd.orchestration.gpu.Gpu``; only the memory
views (``krexd.memory.views``) write it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from krexd.tenancy.memory_records import RegistrationLedger


@dataclass
class GpuView:
    """One GPU's memory at the last refresh (bytes)."""

    total: int
    used: int
    other: int
    tenants_used: int
    excess: int
    source: str
    waiting: set[int] = field(default_factory=set)


@dataclass(eq=False)
class GpuMemory:
    """The memory views' state of one GPU.

    ``ledger``: what each registration in the GPU's gate counted so far,
    credited to its tenant; ``view``: the last refresh (None before the first).
    """

    ledger: RegistrationLedger = field(default_factory=RegistrationLedger)
    view: GpuView | None = None
