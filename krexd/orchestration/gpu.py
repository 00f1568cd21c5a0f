"""One object per GPU krexd manages: everything that belongs to that GPU, in one place.

``krexd.hardware.inventory`` finds the GPUs; the assembly builds one
:class:`Gpu` for each, and the parts look it up by index instead of keeping
tables of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from krexd.config.slot_count import SlotChoice
from krexd.coordinator import Coordinator
from krexd.gate import Gate, GateError
from krexd.hardware.inventory import GpuInfo
from krexd.hardware.mps import MpsDaemon
from krexd.hardware.slices import CpuSlice
from krexd.memory.view import GpuMemory
from krexd.tenancy.admission import GpuSlots


@dataclass(eq=False)
class Gpu:
    """One managed GPU and its parts.

    ``info``: inventory (name, vendor, memory, NUMA node); ``cpu_slice``: its
    CPU slice and reserved cores; ``slots``: its admission slots (counted by
    ``krexd.tenancy.admission``), ``slot_choice`` how many and why;
    ``coordinator``: its region lock and protocol; ``gate`` / ``gate_path``:
    its gate (None without ``libkrex_gate.so``); ``memory``: its memory
    state (written by ``krexd.memory.views``); ``mps``: its MPS control
    daemon (None unless ``[mps] enabled``).
    """

    info: GpuInfo
    cpu_slice: CpuSlice
    slots: GpuSlots
    coordinator: Coordinator
    gate: Gate | None = None
    gate_path: str | None = None
    memory: GpuMemory = field(default_factory=GpuMemory)
    mps: MpsDaemon | None = None
    slot_choice: SlotChoice | None = None

    def __repr__(self) -> str:
        return f"Gpu({self.index}, {self.info.name!r})"

    @property
    def index(self) -> int:
        """Host index of the GPU: NVIDIA GPUs first (``CUDA_VISIBLE_DEVICES`` numbering), then
        AMD GPUs (krexd/hardware/inventory.py, "Numbering")."""
        return self.info.index

    @property
    def total_mem_bytes(self) -> int:
        """Device memory from the inventory (bytes)."""
        return self.info.total_mem_bytes

    def status(self, tenants: list[int]) -> dict[str, Any]:
        """The GPU's row of the ``status`` reply, without ``memory``.

        ``tenants``: ids of its live tenants, in admission order.  Keys are
        documented in docs/design/interfaces.md "Control plane".
        """
        region = self.coordinator.status()
        held = region.get("holder")
        return {
            "index": self.index,
            "name": self.info.name,
            "vendor": self.info.vendor,
            "fake": self.info.fake,
            "total_mem_bytes": self.info.total_mem_bytes,
            "slice": self.cpu_slice.as_dict(),
            "slots_used": self.slots.used,
            "slots_total": self.slots.total,
            "slots": self.slot_choice.as_dict() if self.slot_choice is not None else None,
            "exclusive": self.slots.exclusive,
            "tenants": tenants,
            "gate": self.gate_path,
            "gate_word": self._gate_word(),
            "holder": held.get("tenant") if isinstance(held, dict) else None,
            "region": region,
        }

    def _gate_word(self) -> dict[str, int] | None:
        """The gate word as it is now: ``{"holder", "epoch"}`` while closed, else None."""
        if self.gate is None:
            return None
        try:
            word = self.gate.word
        except GateError:
            return None
        return None if word is None else {"holder": word[0], "epoch": word[1]}
