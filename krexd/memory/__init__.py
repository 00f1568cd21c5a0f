"""GPU memory in krexd: one part per role, each handed only to the callers that use it.

* :mod:`krexd.memory.views` — the view: what each GPU has used and free, per tenant
  and by others (read by the policy, the region entry's check and status);
* :mod:`krexd.memory.policy` — the admission policy: new commands' needs, what fits,
  when a GPU admits nothing (admission, the lifecycle);
* :mod:`krexd.memory.tenant_records` — the records: tenants' records on demand (the
  ``memory`` op) and at their end, their peaks learned (the lifecycle);
* :mod:`krexd.memory.gpu_users` — who has a GPU open (the fail-closed check);
* :mod:`krexd.memory.refresher` — the periodic device read into the views;
* :mod:`krexd.memory.status` — the memory parts of ``status``;
* :mod:`krexd.memory.sources` — NVML / fake-driver / no device view;
* :mod:`krexd.memory.amd_source` — amdsmi's view of AMD GPUs;
* :mod:`krexd.memory.opening` — which source each GPU is read from (by vendor);
* per-tenant records and registration bookkeeping live in the tenancy room
  (:mod:`krexd.tenancy.memory_records`: a ``Tenant`` holds its record; the shim's
  per-process memory fields come through :meth:`krexd.gate.Gate.registrations`);
* :mod:`krexd.memory.view` — one GPU's memory state (lives on ``krexd.orchestration.gpu.Gpu``);
* :mod:`krexd.memory.accounting` — one GPU's view from a device read and the registrations;
* :mod:`krexd.memory.learned` — learned needs per command label (state directory);
* :mod:`krexd.memory.region_fit` — the region entry's memory check (``RegionMemory``).

``krexd.assembly`` builds them in that dependency order (source, views,
policy, records, users, status, then the refresh once admission exists).

The package itself imports nothing, so importing one part pulls in no other.

docs/design/memory.md explains the decisions (fairness, OOM attribution,
what NVML gives).
"""
