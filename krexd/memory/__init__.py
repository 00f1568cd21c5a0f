"""GPU memory in krexd: the memory view, admission by memory, tenants' memory records.

* :mod:`krexd.memory.sources` — NVML / fake-driver / no device view;
* :mod:`krexd.memory.records` — per-tenant records and slot bookkeeping (the
  shim's per-process memory fields come through :meth:`krexd.gate.Gate.slots`);
* :mod:`krexd.memory.monitor` — the refresh loop and the admission policy.

docs/design/memory.md explains the decisions (fairness, OOM attribution,
what NVML gives).
"""

from krexd.memory.monitor import MemoryMonitor
from krexd.memory.records import TenantMemory

__all__ = ["MemoryMonitor", "TenantMemory"]
