"""GPU inventory: NVML (nvidia-ml-py) or cuda-python when a driver is present, else fake GPUs.

Imports of the vendor libraries are lazy: without them (or without a driver)
the inventory is empty unless ``--fake-gpus N`` / ``[daemon] fake_gpus``
declares simulated GPUs.  krexd never creates a CUDA context here (NVML
needs none; cuda-python's ``cuDeviceGet*`` calls need only ``cuInit``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger("krexd.gpus")

FAKE_MEM_BYTES = 80 << 30
FAKE_L2_BYTES = 50 << 20


@dataclass(frozen=True)
class GpuInfo:
    """One GPU: host ``index``, ``name``, memory and L2 sizes (bytes), NUMA node (or None)."""

    index: int
    name: str
    total_mem_bytes: int
    l2_bytes: int
    numa_node: int | None
    fake: bool
    pci_bus_id: str = ""


def _numa_node_of(pci_bus_id: str) -> int | None:
    """NUMA node of a PCI device from sysfs (``None`` when unknown or -1)."""
    bdf = pci_bus_id.lower()
    if bdf.count(":") == 2 and len(bdf.split(":")[0]) > 4:
        bdf = bdf[-12:]  # NVML pads the domain to 8 hex digits
    try:
        with open(f"/sys/bus/pci/devices/{bdf}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _from_nvml() -> list[GpuInfo] | None:
    try:
        import pynvml
    except ImportError:
        return None
    nv: Any = pynvml
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        _log.info("NVML unavailable: %s", exc)
        return None
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nv.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            bus = nv.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            out.append(GpuInfo(i, name, mem, 0, _numa_node_of(bus), False, bus))
        return out
    finally:
        nv.nvmlShutdown()


def _from_cuda_python() -> list[GpuInfo] | None:
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    drv: Any = driver
    (err,) = drv.cuInit(0)
    if int(err) != 0:
        _log.info("cuInit failed: %s", err)
        return None
    err, count = drv.cuDeviceGetCount()
    out = []
    for i in range(int(count)):
        _, dev = drv.cuDeviceGet(i)
        _, raw = drv.cuDeviceGetName(256, dev)
        name = raw.split(b"\0", 1)[0].decode()
        _, mem = drv.cuDeviceTotalMem(dev)
        _, l2 = drv.cuDeviceGetAttribute(
            drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev
        )
        _, bus = drv.cuDeviceGetPCIBusId(64, dev)
        bus_s = bus.split(b"\0", 1)[0].decode() if isinstance(bus, bytes) else str(bus)
        out.append(GpuInfo(i, name, int(mem), int(l2), _numa_node_of(bus_s), False, bus_s))
    return out


def fake_gpus(n: int, mem_bytes: int = FAKE_MEM_BYTES) -> list[GpuInfo]:
    """``n`` simulated GPUs (index 0..n-1) for hosts without one."""
    return [GpuInfo(i, f"fake GPU {i}", mem_bytes, FAKE_L2_BYTES, None, True) for i in range(n)]


def discover(fake: int) -> list[GpuInfo]:
    """The GPUs krexd manages: ``fake`` > 0 -> that many simulated GPUs, else the real ones."""
    if fake > 0:
        return fake_gpus(fake)
    for probe in (_from_nvml, _from_cuda_python):
        found = probe()
        if found is not None:
            return found
    return []
