"""What differs between GPU vendors outside the inventory: one object per vendor.

Callers ask :func:`of` for a GPU's :class:`Vendor` instead of testing
``GpuInfo.vendor`` themselves (the memory sources per vendor are
``krexd.memory.opening``'s).  What each vendor's binding sets, and why:
docs/design/amd.md "Environment of a command on an AMD GPU".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from krexd.hardware import kfd
from krexd.hardware.inventory import AMD, NVIDIA, GpuInfo


class Vendor(Protocol):
    """One GPU vendor's part.

    * ``binding(info)``: the variables that bind a command to that GPU by
      identity (docs/design/interfaces.md, "Environment of a tenant command");
    * ``hidden()``: the variables that hide every GPU of this vendor from a
      command bound to another vendor's GPU (set only on a host where krexd
      manages GPUs of both);
    * ``node_table`` / ``node_minor(info)``: which device node the device
      isolation of tenant cgroups lets the GPU's tenants open
      (``krexd.cgroups.devices``): ``/dev/nvidia<minor>``, or the render node
      ``/dev/dri/renderD<minor>``;
    * ``mps``, ``driver_lock``: whether NVIDIA MPS and the CUDA driver's
      process lock (``krexd.hardware.driverlock``) apply to its GPUs.
    """

    name: str
    node_table: str  # "minors" or "render_minors": DeviceIsolation's argument
    mps: bool
    driver_lock: bool
    # Whether libkrex_shim gates the commands' GPU work (drain and acknowledgement).  Where
    # it does not, the fail-closed check is the only guard and "cannot tell" means "open"
    # (krexd.tenancy.registrations.RegionGuard).
    shim_gated: bool

    def binding(self, info: GpuInfo) -> dict[str, str]: ...

    def hidden(self) -> dict[str, str]: ...

    def node_minor(self, info: GpuInfo) -> int | None: ...


class Nvidia:
    """NVIDIA GPUs (CUDA)."""

    name = NVIDIA
    node_table = "minors"
    mps = True
    driver_lock = True
    shim_gated = True

    def binding(self, info: GpuInfo) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` by UUID (the index when the inventory could not read
        it), CUDA's numbering made NVML's; ``KREX_GPU_UUID`` for the shim's check."""
        env = {
            "CUDA_VISIBLE_DEVICES": info.uuid or str(info.index),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        if info.uuid:
            env["KREX_GPU_UUID"] = info.uuid
        return env

    def hidden(self) -> dict[str, str]:
        """CUDA sees no device."""
        return {"CUDA_VISIBLE_DEVICES": ""}

    def node_minor(self, info: GpuInfo) -> int | None:
        """``/dev/nvidia<minor>``."""
        return info.minor


class Amd:
    """AMD GPUs (ROCm: HIP, HSA, OpenCL)."""

    name = AMD
    node_table = "render_minors"
    mps = False
    driver_lock = False
    shim_gated = False  # no HIP gating yet (docs/design/amd.md)

    def binding(self, info: GpuInfo) -> dict[str, str]:
        """ROCr filtered to the GPU's UUID, HIP's device 0 (that GPU), CUDA none; for the
        client's AMD SMI view (``krex_client.devicestate``, which sees every GPU) the
        vendor and the GPU's PCI address."""
        env = {
            "ROCR_VISIBLE_DEVICES": info.uuid,
            "HIP_VISIBLE_DEVICES": "0",
            # HIP and OpenCL also filter by this one: a value inherited from the user's
            # shell could leave the command no device; 0 is the same GPU.
            "GPU_DEVICE_ORDINAL": "0",
            "CUDA_VISIBLE_DEVICES": "",
            "KREX_GPU_UUID": info.uuid,
            "KREX_GPU_VENDOR": AMD,
        }
        if info.pci_bus_id:
            env["KREX_GPU_PCI"] = info.pci_bus_id
        return env

    def hidden(self) -> dict[str, str]:
        """ROCr exposes no GPU."""
        return {"ROCR_VISIBLE_DEVICES": ""}

    def node_minor(self, info: GpuInfo) -> int | None:
        """``/dev/dri/renderD<minor>`` (``/dev/kfd`` is every AMD GPU's, always allowed)."""
        return info.render_minor


VENDORS: dict[str, Vendor] = {NVIDIA: Nvidia(), AMD: Amd()}


def of(info: GpuInfo) -> Vendor:
    """The vendor object of GPU ``info``."""
    return VENDORS[info.vendor]


def binding(info: GpuInfo, host_vendors: Iterable[str] = ()) -> dict[str, str]:
    """The variables binding a command to ``info``, hiding the GPUs of every other vendor of
    ``host_vendors`` (the vendors of the GPUs krexd manages)."""
    own = of(info)
    env: dict[str, str] = {}
    for name in sorted(set(host_vendors) - {own.name}):
        env.update(VENDORS[name].hidden())
    env.update(own.binding(info))
    return env


def unmanaged_render(
    infos: Iterable[GpuInfo], nodes: Iterable[kfd.KfdGpu] | None = None
) -> list[int]:
    """Render node minors of the host's AMD GPUs that ``infos`` does not manage.

    ``nodes``: the KFD topology's GPUs (default :func:`krexd.hardware.kfd.amd_gpus_present`:
    [] without ``/dev/kfd``).  An AMD GPU krexd found but does not manage (no
    ``hip-python``/``amdsmi``, not matched) is denied to every tenant and pool
    (krexd/cgroups/devices.py): issue 30's "never run ungated".
    """
    managed = {i.render_minor for i in infos if i.vendor == AMD}
    found = kfd.amd_gpus_present() if nodes is None else nodes
    return sorted({n.render_minor for n in found if n.render_minor is not None} - managed)


def device_minors(infos: Iterable[GpuInfo]) -> dict[str, dict[int, int | None]]:
    """``{"minors": {index: minor}, "render_minors": {index: minor}}`` for DeviceIsolation."""
    out: dict[str, dict[int, int | None]] = {"minors": {}, "render_minors": {}}
    for info in infos:
        vendor = of(info)
        out[vendor.node_table][info.index] = vendor.node_minor(info)
    return out
