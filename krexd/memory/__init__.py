"""GPU memory in krexd: the memory view, admission by memory, tenants' memory records.

* :mod:`krexd.memory.sources` — NVML / fake-driver / no device view;
* :mod:`krexd.memory.amd_source` — amdsmi's view of AMD GPUs;
* :mod:`krexd.memory.opening` — which source each GPU is read from (by vendor);
* :mod:`krexd.memory.records` — per-tenant records and registration bookkeeping (the
  shim's per-process memory fields come through :meth:`krexd.gate.Gate.slots`);
* :mod:`krexd.memory.view` — one GPU's memory state (lives on ``krexd.gpu.Gpu``);
* :mod:`krexd.memory.monitor` — the refresh loop and the admission policy;
* :mod:`krexd.memory.accounting` — one GPU's view from a device read and the registrations;
* :mod:`krexd.memory.learned` — learned needs per command label (state directory);
* :mod:`krexd.memory.region_fit` — the region entry's memory check (``RegionMemory``).

The package itself imports nothing: ``krexd.config`` and ``krexd.tenants``
import ``sizes`` and ``records`` without pulling in the monitor.

docs/design/memory.md explains the decisions (fairness, OOM attribution,
what NVML gives).
"""
