"""The AMD GPUs the kernel's KFD driver (amdgpu's compute side) reports, read from sysfs.

Nothing here imports a ROCm library: this is how krexd decides whether to
import ``hip-python`` and ``amdsmi`` at all (``krexd.hardware.inventory_amd``;
docs/design/amd.md "Inventory").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The KFD device node every ROCm process opens (shared by all GPUs).
KFD_DEVICE = "/dev/kfd"
#: The KFD topology: one directory per node (CPU or GPU).
TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


@dataclass(frozen=True)
class KfdGpu:
    """One GPU node of the KFD topology, from its ``properties`` file's ``key value`` lines.

    * ``gpu_id``: KFD's id of the GPU (``amdsmi_get_gpu_kfd_info``'s ``kfd_id``);
    * ``unique_id``: ROCr names the GPU ``GPU-<unique_id as 16 hex digits>``
      (``HSA_AMD_AGENT_INFO_UUID``, what ``ROCR_VISIBLE_DEVICES`` accepts;
      HIP's ``hipDeviceGetUuid`` returns those 16 characters);
    * ``drm_render_minor``: the GPU's render node ``/dev/dri/renderD<minor>``,
      which the device isolation of tenant cgroups allows;
    * ``domain`` and ``location_id`` (``bus << 8 | device << 3 | function``):
      its PCI address.
    """

    node: int
    gpu_id: int
    unique_id: int
    render_minor: int | None
    domain: int
    location_id: int

    @property
    def uuid(self) -> str:
        """ROCr's name of the GPU, ``GPU-<16 hex digits>`` ("" when the driver gives no id)."""
        return f"GPU-{self.unique_id:016x}" if self.unique_id else ""

    @property
    def bdf(self) -> str:
        """The PCI address ``dddd:bb:dd.f`` (lowercase hex)."""
        loc = self.location_id
        return f"{self.domain:04x}:{loc >> 8 & 0xFF:02x}:{loc >> 3 & 0x1F:02x}.{loc & 7:x}"


def _properties(path: str) -> dict[str, int]:
    """``key value`` lines of a node's ``properties`` file (non-integer values skipped)."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.strip().partition(" ")
                try:
                    out[key] = int(value.strip())
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def gpu_nodes(topology: str | None = None) -> list[KfdGpu]:
    """The GPU nodes of the KFD topology under ``topology`` (default :data:`TOPOLOGY`),
    by node number ([] when none).

    A GPU node has ``simd_count > 0`` (CPU nodes have none) and no CPU cores:
    an APU's integrated GPU has both and is not managed (it shares the host's
    memory and cores, and its tenants could not be held apart from the host's
    work).
    """
    topology = topology or TOPOLOGY
    try:
        names = os.listdir(topology)
    except OSError:
        return []
    out = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        props = _properties(os.path.join(topology, name, "properties"))
        if props.get("simd_count", 0) <= 0:
            continue  # a CPU node
        if props.get("cpu_cores_count", 0) > 0:
            continue  # an APU's integrated GPU (CPU cores on the node): not a GPU to share
        out.append(
            KfdGpu(
                node=int(name),
                gpu_id=props.get("gpu_id", 0),
                unique_id=props.get("unique_id", 0),
                render_minor=props.get("drm_render_minor"),
                domain=props.get("domain", 0),
                location_id=props.get("location_id", 0),
            )
        )
    return out


def amd_gpus_present(device: str | None = None, topology: str | None = None) -> list[KfdGpu]:
    """The host's AMD GPUs as KFD reports them: [] without ``/dev/kfd`` (``device``,
    default :data:`KFD_DEVICE`) or a GPU node in ``topology``."""
    if not os.path.exists(device or KFD_DEVICE):
        return []
    return gpu_nodes(topology)


def bus_device(bdf: str) -> str:
    """``dddd:bb:dd`` of a PCI address ``dddd:bb:dd.f``, lowercase (the function left out:
    HIP reports every GPU's as ``.0``)."""
    return bdf.strip().lower().rsplit(".", 1)[0]
