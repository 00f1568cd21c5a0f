"""GPU inventory: NVIDIA GPUs through NVML (nvidia-ml-py) or cuda-python, AMD GPUs through
hip-python (``krexd.hardware.inventory_amd``), else fake GPUs.

Vendor libraries are imported lazily, and krexd never creates a CUDA
context here (NVML needs none; cuda-python's ``cuDeviceGet*`` only
``cuInit``) nor starts the HIP runtime in its own process.  NVIDIA GPUs
come first, in NVML's (PCI bus) order, then AMD GPUs in HIP's; each carries
its UUID (tenants are bound by UUID, never by index) and its device node's
minor (docs/design/amd.md "Inventory", docs/design/security.md "6. GPU
binding").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from krexd.hardware import inventory_amd

_log = logging.getLogger("krexd.gpus")

FAKE_MEM_BYTES = 80 << 30
FAKE_L2_BYTES = 50 << 20

#: ``GpuInfo.vendor`` values.
NVIDIA = "nvidia"
AMD = "amd"
VENDORS = (NVIDIA, AMD)
#: The first render node minor (``/dev/dri/renderD128``): simulated AMD GPU N has 128 + N.
RENDER_MINOR_BASE = 128


@dataclass(frozen=True)
class GpuInfo:
    """One GPU: host ``index``, ``name``, memory and L2 sizes (bytes), NUMA node (or None);
    ``vendor`` ``"nvidia"`` or ``"amd"``.

    ``uuid``: an NVIDIA GPU's ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (the
    form ``nvidia-smi -L``, NVML and ``CUDA_VISIBLE_DEVICES`` use), an AMD
    GPU's ROCr ``GPU-<16 hex digits>`` (what ``ROCR_VISIBLE_DEVICES``
    accepts); a simulated one's is :func:`fake_uuid` / :func:`fake_amd_uuid`
    (what the fake driver reports).  ``minor``: the minor of
    ``/dev/nvidia<minor>`` (NVML's ``nvmlDeviceGetMinorNumber``, else the
    driver's ``/proc/driver/nvidia/gpus/<bus>/information``; simulated GPU
    N: N); ``render_minor``: an AMD GPU's ``/dev/dri/renderD<minor>`` (from
    the KFD topology; simulated AMD GPU N: 128 + N).
    """

    index: int
    name: str
    total_mem_bytes: int
    l2_bytes: int
    numa_node: int | None
    fake: bool
    pci_bus_id: str = ""
    uuid: str = ""  # "GPU-..." (empty when the inventory could not read it)
    minor: int | None = None  # /dev/nvidia<minor> (None when unknown, or an AMD GPU)
    vendor: str = NVIDIA
    render_minor: int | None = None  # AMD: /dev/dri/renderD<render_minor> (None when unknown)


def format_uuid(raw: bytes) -> str:
    """The text form of a 16-byte CUDA/NVML GPU UUID: ``GPU-8-4-4-4-12`` lowercase hex."""
    h = raw[:16].hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# The fake driver's UUID bytes: this 12-byte stem, three zero bytes, the GPU index.
_FAKE_UUID_STEM = b"krex-fake-gp"


def fake_uuid(index: int) -> str:
    """UUID of simulated GPU ``index`` as the fake driver's ``cuDeviceGetUuid`` reports it."""
    return format_uuid(_FAKE_UUID_STEM + bytes(3) + bytes([index & 0xFF]))


def fake_amd_uuid(index: int) -> str:
    """UUID of simulated AMD GPU ``index``: ROCr's form, ``GPU-`` and 16 hex digits
    (``krexfak`` in ASCII, then the index byte)."""
    return f"GPU-{b'krexfak'.hex()}{index & 0xFF:02x}"


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


def _proc_minor(pci_bus_id: str) -> int | None:
    """``Device Minor`` of a GPU from ``/proc/driver/nvidia/gpus/<bus>/information``
    (the NVIDIA driver's own file; None when absent or unreadable)."""
    bdf = pci_bus_id.lower()
    if bdf.count(":") == 2 and len(bdf.split(":")[0]) > 4:
        bdf = bdf[-12:]  # NVML pads the domain to 8 hex digits
    try:
        with open(f"/proc/driver/nvidia/gpus/{bdf}/information") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "Device Minor":
                    return int(value.strip())
    except (OSError, ValueError):
        pass
    return None


def _nvml_minor(nv: Any, handle: Any, pci_bus_id: str) -> int | None:
    """The device minor of an NVML device (``nvmlDeviceGetMinorNumber``, else procfs)."""
    try:
        return int(nv.nvmlDeviceGetMinorNumber(handle))
    except Exception as exc:  # NVMLError_NotSupported on some platforms
        _log.info("nvmlDeviceGetMinorNumber failed: %s", exc)
        return _proc_minor(pci_bus_id)


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
            uuid = nv.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            minor = _nvml_minor(nv, h, bus)
            out.append(GpuInfo(i, name, mem, 0, _numa_node_of(bus), False, bus, uuid, minor))
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
        uuid = _cuda_uuid(drv, dev)
        minor = _proc_minor(bus_s)
        node = _numa_node_of(bus_s)
        out.append(GpuInfo(i, name, int(mem), int(l2), node, False, bus_s, uuid, minor))
    return out


def _cuda_uuid(drv: Any, dev: Any) -> str:
    """``GPU-...`` of a cuda-python device; "" when the driver cannot say."""
    try:
        err, raw = drv.cuDeviceGetUuid(dev)
        if int(err) != 0:
            return ""
        data = raw.bytes
        return format_uuid(data if isinstance(data, bytes) else bytes(c & 0xFF for c in data))
    except Exception as exc:  # an older cuda-python without the call, or a driver error
        _log.info("cuDeviceGetUuid failed: %s", exc)
        return ""


def fake_gpus(n: int, mem_bytes: int = FAKE_MEM_BYTES, vendor: str = NVIDIA) -> list[GpuInfo]:
    """``n`` simulated GPUs (index 0..n-1) for hosts without one.

    NVIDIA ones (the default) have device minors 0..n-1; AMD ones (``vendor``
    ``"amd"``) render minors 128..128+n-1 and ROCr-form UUIDs.
    """
    if vendor == AMD:
        return [
            GpuInfo(i, f"fake AMD GPU {i}", mem_bytes, FAKE_L2_BYTES, None, True,
                    uuid=fake_amd_uuid(i), vendor=AMD, render_minor=RENDER_MINOR_BASE + i)
            for i in range(n)
        ]  # fmt: skip
    return [
        GpuInfo(
            i, f"fake GPU {i}", mem_bytes, FAKE_L2_BYTES, None, True, uuid=fake_uuid(i), minor=i
        )
        for i in range(n)
    ]


def _nvidia() -> list[GpuInfo]:
    """The NVIDIA GPUs (NVML, else cuda-python), indices from 0."""
    for probe in (_from_nvml, _from_cuda_python):
        found = probe()
        if found is not None:
            return found
    return []


def _amd(first: int) -> list[GpuInfo]:
    """The AMD GPUs krexd manages (krexd/hardware/inventory_amd.py), indices from ``first``."""
    return [
        GpuInfo(
            first + i, d.name, d.total_mem_bytes, d.l2_bytes, _numa_node_of(d.pci_bus_id),
            False, d.pci_bus_id, d.uuid, None, vendor=AMD, render_minor=d.render_minor,
        )
        for i, d in enumerate(inventory_amd.discover())
    ]  # fmt: skip


def discover(fake: int, fake_vendor: str = NVIDIA) -> list[GpuInfo]:
    """The GPUs krexd manages: ``fake`` > 0 -> that many simulated GPUs of ``fake_vendor``,
    else the real ones: NVIDIA's first in NVML's order, then AMD's in HIP's."""
    if fake > 0:
        return fake_gpus(fake, vendor=fake_vendor)
    nvidia = _nvidia()
    return nvidia + _amd(len(nvidia))
