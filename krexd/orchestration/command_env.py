"""What an admitted command is given to run under krex: its environment, its slot memory.

The ``admit`` reply carries both (docs/design/interfaces.md "Control plane"): the environment
binds the command to its GPU by identity, names the control socket, its
credentials, the gate and the shim (docs/design/interfaces.md); the slot
memory's size and header are what ``krex run`` makes the sealed memfd from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from krexd.config.config import Config
from krexd.gate import registration_memory_spec
from krexd.hardware import vendors
from krexd.orchestration.gpu import Gpu
from krexd.system import paths
from krexd.tenancy.tenants import Tenant

_log = logging.getLogger("krexd.lifecycle")


def registration_memory(gpu: Gpu, tenant: Tenant) -> dict[str, Any] | None:
    """``{"size", "header"}`` of the tenant's slot memory, or None (no gate, exclusive)."""
    if tenant.exclusive or gpu.gate is None:
        return None
    size, header = registration_memory_spec(tenant.id)
    return {"size": size, "header": header}


def tenant_env(
    cfg: Config, gpu: Gpu, tenant: Tenant, host_vendors: Iterable[str] = ()
) -> dict[str, str]:
    """Environment for ``tenant``'s command on ``gpu`` (docs/design/interfaces.md).

    ``host_vendors``: the vendors of the GPUs krexd manages (the other
    vendors' GPUs are hidden from the command, :func:`gpu_binding`).
    A gate file found removed or replaced is restored here first (logged),
    so that new tenants still find it.
    """
    env = {
        "KREX_SOCKET": cfg.daemon.socket,
        "KREX_TENANT": str(tenant.id),
        "KREX_TOKEN": tenant.token,
        "KREX_GPU": str(tenant.gpu),
        **gpu_binding(gpu, host_vendors),
        "NCCL_NVLS_ENABLE": "0",
        # Bound of the shim's wait for co-tenants' memory (libkrex_shim/tenant/memory.c).
        "KREX_OOM_WAIT_S": f"{cfg.memory.oom_wait_s:g}",
    }
    if not tenant.exclusive:  # a whole-device lease runs natively, unshimmed
        if gpu.gate is not None and gpu.gate_path is not None:
            try:
                if gpu.gate.relink():  # removed or replaced: new tenants still find it
                    _log.error("gpu%d: gate file %s restored", gpu.index, gpu.gate_path)
            except Exception as exc:
                _log.error("gpu%d: %s", gpu.index, exc)
            env["KREX_GATE"] = gpu.gate_path
        shim = paths.shim_library(cfg.shim.path or None)
        if shim is not None:
            env["LD_PRELOAD"] = shim
        if gpu.mps is not None and not tenant.without_mps:
            env.update(gpu.mps.tenant_env())
    return env


def gpu_binding(gpu: Gpu, host_vendors: Iterable[str] = ()) -> dict[str, str]:
    """The variables that bind a command to ``gpu`` by identity (docs/design/security.md).

    NVIDIA: ``CUDA_VISIBLE_DEVICES`` names the GPU by UUID, so no index order
    (CUDA's default fastest-first, or a script's own numbering) can pick
    another device; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA's numbering
    NVML's.  Without a UUID (inventory could not read it) the index is used,
    as before.  AMD: ``ROCR_VISIBLE_DEVICES`` by UUID, ``HIP_VISIBLE_DEVICES=0``,
    ``CUDA_VISIBLE_DEVICES`` empty (krexd/hardware/vendors.py says why).
    ``KREX_GPU_UUID`` is what the shim compares every new context's device
    with (libkrex_shim/tenant/bind.c).  Where krexd manages GPUs of another vendor
    too (``host_vendors``), theirs are hidden (``ROCR_VISIBLE_DEVICES=""``
    for an NVIDIA GPU's command, ``CUDA_VISIBLE_DEVICES=""`` for an AMD one's).
    """
    return vendors.binding(gpu.info, host_vendors)
